"""``python -m fedlab reproduce``'s command line: a run with fewer seeds never replaces a stored record with more,
chapter aliases and "did you mean", a plain-text ``--help``. No notebook runs here (each test takes well under a
second but the one that starts ``python -m fedlab`` and the matrix one, which imports torch): ``run_notebook``,
``_run_seeds`` and ``run_matrix`` are replaced by functions that fail the test if a seed ever starts where the
command must refuse before."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from fedlab import reproduce as rp

ROOT = Path(__file__).resolve().parents[1]


def _book(tmp_path: Path) -> Path:
    """A book whose stems are shaped like the real one's (numbers with and without letters, one without a
    number); its notebooks are never run here."""
    (tmp_path / "chapters").mkdir()
    stems = ["00_intro", "01a_alpha_leakage", "01c_beta", "03c_gamma_oltr", "04_delta", "appendix"]
    for stem in stems:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {stem}"),
                                             nbformat.v4.new_code_cell("x = 1")])
        nbformat.write(nb, tmp_path / "chapters" / f"{stem}.ipynb")
    (tmp_path / "index.md").write_text("# Book\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\nchapters:\n"
                                       + "".join(f"  - file: chapters/{s}\n" for s in stems))
    return tmp_path


def _record(chapter="01a_alpha_leakage", seeds=(0, 1, 2, 3, 4), scale="quick", commit="abc1234", failures=()):
    seeds = list(seeds)
    values = {"auc": [0.5 + 0.01 * s for s in seeds]}
    return {"chapter": chapter, "title": "T", "scale": scale, "seeds": seeds, "values": values,
            "summary": rp.summarize(values), "seconds": [1.0] * len(seeds), "failures": list(failures),
            "retries": [], "machine": "m", "python": "3", "torch": "2", "commit": commit, "date": "2026-11-20",
            "command": "c"}


def _no_run(*args, **kwargs):
    pytest.fail("a seed ran: the command had to refuse before any seed")


def _main(capsys, *args):
    try:
        code = rp.main(["reproduce", *args, "--no-progress"])
    except SystemExit as exc:    # argparse
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------------
# a run with fewer seeds never replaces a stored record with more
def test_format_seeds_is_what_seeds_takes_back():
    assert rp.format_seeds([7, 0, 1, 2]) == "0-2,7" and rp.format_seeds([3]) == "3"
    assert rp.format_seeds([0, 1]) == "0,1" and rp.format_seeds([9, 0, 1, 3, 4, 5]) == "0,1,3-5,9"
    for seeds in ([0, 1, 2, 7], [5], [0, 2, 4, 5, 6, 100], list(range(1000))):
        assert rp._parse_seeds(rp.format_seeds(seeds)) == sorted(seeds)


def test_seeds_lost_names_the_stored_and_the_lost_seeds(tmp_path):
    path = rp.write_record(_record(), tmp_path)
    assert rp.seeds_lost(path, [0, 1, 2, 3, 4]) is None                 # the same seeds again
    assert rp.seeds_lost(path, [4, 3, 2, 1, 0, 5, 6]) is None           # more seeds, any order
    reason = rp.seeds_lost(path, [1])
    assert "holds seeds 0-4 (commit abc1234, 2026-11-20)" in reason and "lose seeds 0,2-4" in reason, reason
    assert "lose seed 4" in rp.seeds_lost(path, [0, 1, 2, 3, 7])
    assert rp.seeds_lost(tmp_path / "none.quick.json", [1]) is None     # nothing stored: nothing to lose
    (tmp_path / "junk.quick.json").write_text("{not json")              # not a record: no seed to lose
    assert rp.seeds_lost(tmp_path / "junk.quick.json", [1]) is None
    (tmp_path / "old.quick.json").write_text('{"an": "old record"}')
    assert rp.seeds_lost(tmp_path / "old.quick.json", [1]) is None


def test_check_stored_seeds_refuses_before_a_run_and_says_how_to_go_on(tmp_path):
    rp.write_record(_record("01a_alpha_leakage", seeds=range(5)), tmp_path)
    rp.write_record(_record("04_delta", seeds=[0, 1, 2, 8]), tmp_path)
    with pytest.raises(ValueError) as info:
        rp.check_stored_seeds(tmp_path, ["01a_alpha_leakage", "04_delta", "00_intro"], "quick", [1, 5])
    msg = str(info.value)
    assert "01a_alpha_leakage.quick.json holds seeds 0-4" in msg and "lose seeds 0,2-4" in msg, msg
    assert "04_delta.quick.json holds seeds 0-2,8" in msg and "lose seeds 0,2,8" in msg, msg
    assert "--seeds 0-5,8" in msg and "--force" in msg and "--out" in msg and "Nothing was run" in msg, msg
    assert "00_intro" not in msg                                        # nothing stored for it
    rp.check_stored_seeds(tmp_path, ["01a_alpha_leakage", "04_delta"], "quick", [0, 1, 2, 3, 4, 8])   # superset
    rp.check_stored_seeds(tmp_path, ["01a_alpha_leakage"], "quick", [1], force=True)
    rp.check_stored_seeds(tmp_path, ["01a_alpha_leakage"], "paper", [1])   # another scale is another record
    rp.check_stored_seeds(tmp_path / "elsewhere", ["01a_alpha_leakage"], "quick", [1])


def test_write_record_never_replaces_more_seeds_with_fewer(tmp_path):
    path = rp.write_record(_record(seeds=range(5)), tmp_path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"holds seeds 0-4 .*lose seeds 0,2-4.*nothing was written"):
        rp.write_record(_record(seeds=[1], commit="def5678"), tmp_path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    # a failing run with fewer seeds still goes beside a clean stored record (the behaviour kept from before)
    failed = rp.write_record(_record(seeds=[1], failures=[{"seed": 1, "cell": 0, "line": "", "error": "E"}]),
                             tmp_path)
    assert failed.name == "01a_alpha_leakage.quick.failed.json" and path.read_bytes() == before
    # the same seeds or more replace it; force replaces it whatever it holds
    assert json.loads(rp.write_record(_record(seeds=range(6)), tmp_path).read_text())["seeds"] == list(range(6))
    rp.write_record(_record(seeds=[3], commit="def5678"), tmp_path, force=True)
    assert json.loads(path.read_text())["seeds"] == [3] and json.loads(path.read_text())["commit"] == "def5678"


def test_a_stored_failing_seed_is_not_dropped_by_a_clean_run_of_the_others(tmp_path):
    """A stored record whose seed 1 failed: a clean run of seed 0 alone would hide that failure."""
    fail = {"seed": 1, "cell": 3, "line": "assert auc > 0.8", "error": "AssertionError"}
    rp.write_record(_record(seeds=[0, 1], failures=[fail]), tmp_path)
    with pytest.raises(ValueError, match="lose seed 1"):
        rp.write_record(_record(seeds=[0]), tmp_path)
    with pytest.raises(ValueError, match="lose seed 1"):
        rp.check_stored_seeds(tmp_path, ["01a_alpha_leakage"], "quick", [0])


def test_the_command_refuses_fewer_seeds_before_any_seed_runs(tmp_path, capsys, monkeypatch):
    root = _book(tmp_path)
    out = tmp_path / "rec"
    stored = rp.write_record(_record(seeds=range(5)), out)
    before = stored.read_bytes()
    monkeypatch.setattr(rp, "run_notebook", _no_run)
    monkeypatch.setattr(rp, "_run_seeds", _no_run)
    code, _, err = _main(capsys, "1a", "--seeds", "1", "--root", str(root), "--out", str(out))
    assert code == 2 and "holds seeds 0-4" in err and "lose seeds 0,2-4" in err and "--seeds 0-4" in err, err
    assert "--force" in err and stored.read_bytes() == before
    code, _, err = _main(capsys, "all", "--seeds", "0-3", "--root", str(root), "--out", str(out))
    assert code == 2 and "lose seed 4" in err and stored.read_bytes() == before, err
    # the library call refuses as well, before a seed runs
    chapters = rp.resolve_chapters("01a", rp.list_chapters(root))
    with pytest.raises(ValueError, match="lose seeds 0,2-4"):
        rp.reproduce(chapters, scale="quick", seeds=[1], out=out, root=root, console=rp.Console(show_progress=False))
    assert stored.read_bytes() == before
    # with --force, or with every stored seed, the run goes on (here to the stub, which writes the record)
    ran = []

    def fake_run_seeds(chapter, scale, seeds, jobs, timeout, bar):
        ran.append(list(seeds))
        return [rp.SeedRun(seed=s, values={"auc": 0.5 + s}, seconds=0.1) for s in seeds]

    monkeypatch.setattr(rp, "_run_seeds", fake_run_seeds)
    code, _, err = _main(capsys, "01a", "--seeds", "0-5", "--root", str(root), "--out", str(out))
    assert code == 0 and json.loads(stored.read_text())["seeds"] == list(range(6)), err
    code, _, err = _main(capsys, "ch1a", "--seeds", "2", "--force", "--root", str(root), "--out", str(out))
    assert code == 0 and json.loads(stored.read_text())["seeds"] == [2] and ran == [list(range(6)), [2]], err


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_the_matrix_refuses_fewer_seeds_before_any_seed_runs(tmp_path, capsys, monkeypatch):
    from fedlab.experiments import matrix as mx

    stored = rp.write_record(_record(rp.MATRIX, seeds=range(5)), tmp_path)
    before = stored.read_bytes()
    monkeypatch.setattr(mx, "run_matrix", _no_run)
    with pytest.raises(ValueError, match="lose seeds 0,2-4"):
        rp.reproduce_matrix(scale="quick", seeds=[1], out=tmp_path, root=ROOT)
    code, _, err = _main(capsys, "matrix", "--seeds", "1", "--root", str(ROOT), "--out", str(tmp_path))
    assert code == 2 and "matrix.quick.json holds seeds 0-4" in err and "--seeds 0-4" in err, err
    assert stored.read_bytes() == before

    def fake(seed, progress=None):
        progress("dlg", 0.1)
        return {"dlg|none": 1.0 + seed}, {"dlg": 0.1}

    monkeypatch.setattr(mx, "run_matrix", fake)
    path, failures = rp.reproduce_matrix(scale="quick", seeds=[1], out=tmp_path, root=ROOT, force=True)
    assert failures == [] and json.loads(path.read_text())["values"]["dlg|none"] == [2.0]


def test_the_refusal_from_the_command_line_as_a_user_runs_it(tmp_path):
    out = tmp_path / "rec"
    stored = rp.write_record(_record("02_pac_identifiability", seeds=range(5), scale="paper"), out)
    res = subprocess.run([sys.executable, "-m", "fedlab", "reproduce", "02", "--scale", "paper", "--seeds", "1",
                          "--root", str(ROOT), "--out", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "02_pac_identifiability.paper.json holds seeds 0-4" in res.stderr and "--force" in res.stderr
    assert json.loads(stored.read_text())["seeds"] == list(range(5))


# ------------------------------------------------------------------------------------------------
# chapter aliases and "did you mean"
def test_chapter_aliases():
    assert rp.chapter_aliases("03c_raifle_oltr") == ["03c", "3c", "ch3c", "ch03c"]
    assert rp.chapter_aliases("04_model_reconstruction") == ["04", "4", "ch4", "ch04"]
    assert rp.chapter_aliases("appendix") == []


def test_short_names_resolve_to_the_notebook(tmp_path):
    chapters = rp.list_chapters(_book(tmp_path))

    def stem(name):
        return [c.stem for c in rp.resolve_chapters(name, chapters)]

    for name in ("1a", "01a", "ch1a", "ch01a", "CH1A", "Ch-1a", "chapter 1a", "chap.1a", "01a_alpha_leakage",
                 "01a_alpha_leakage.ipynb", "chapters/01a_alpha_leakage.ipynb", "01a_al", " 1a "):
        assert stem(name) == ["01a_alpha_leakage"], name
    for name in ("4", "04", "004", "ch4", "ch04"):
        assert stem(name) == ["04_delta"], name
    assert stem("0") == ["00_intro"] and stem("3c") == ["03c_gamma_oltr"] and stem("app") == ["appendix"]
    assert len(stem("all")) == 6 and len(stem("ALL")) == 6
    with pytest.raises(ValueError, match=r"'1' is ambiguous \(01a_alpha_leakage, 01c_beta\).*1a, 1c"):
        stem("1")


def test_a_number_without_its_letter_names_the_chapter_without_a_letter():
    """06_flower beside 06b_flower_secagg: "6" is 06_flower and "6b" the other; where every chapter of a number has
    a letter (01a, 01c) the bare number stays ambiguous."""
    chapters = [rp.Chapter(s, Path(f"{s}.ipynb"), s) for s in
                ("01a_alpha", "01c_beta", "06_flower", "06b_flower_secagg", "07_matrix")]

    def stem(name):
        return [c.stem for c in rp.resolve_chapters(name, chapters)]

    for name in ("6", "06", "ch6", "chapter 6"):
        assert stem(name) == ["06_flower"], name
    for name in ("6b", "06b", "ch6b", "ch06b"):
        assert stem(name) == ["06b_flower_secagg"], name
    with pytest.raises(ValueError, match=r"'1' is ambiguous \(01a_alpha, 01c_beta\)"):
        stem("1")
    with pytest.raises(ValueError, match="matches no notebook"):
        stem("6c")
    real = rp.list_chapters(ROOT)                   # the book itself: chapter 6 and its secure-aggregation half
    for name, want in {"6": "06_flower", "06": "06_flower", "ch6": "06_flower", "6b": "06b_flower_secagg",
                       "06b": "06b_flower_secagg", "ch6b": "06b_flower_secagg"}.items():
        assert [c.stem for c in rp.resolve_chapters(name, real)] == [want], name
    for name, want in {"4": "04_model_reconstruction", "04": "04_model_reconstruction", "ch4": "04_model_reconstruction",
                       "4b": "04b_reconstruction_heuristic", "04b": "04b_reconstruction_heuristic",
                       "ch4b": "04b_reconstruction_heuristic"}.items():   # chapter 4 and its Algorithm 3 half
        assert [c.stem for c in rp.resolve_chapters(name, real)] == [want], name
    for name, want in {"2": "02_pac_identifiability", "02": "02_pac_identifiability", "ch2": "02_pac_identifiability",
                       "2b": "02b_pac_defenses", "02b": "02b_pac_defenses",
                       "ch2b": "02b_pac_defenses"}.items():   # chapter 2 and its defenses half
        assert [c.stem for c in rp.resolve_chapters(name, real)] == [want], name



def test_the_real_book_names_chapter_3c_and_its_defenses_half():
    real = rp.list_chapters(ROOT)
    for name, want in {"3c": "03c_raifle_oltr", "03c": "03c_raifle_oltr", "ch3c": "03c_raifle_oltr",
                       "3d": "03d_raifle_oltr_defenses", "03d": "03d_raifle_oltr_defenses",
                       "ch3d": "03d_raifle_oltr_defenses"}.items():   # RAIFLE on OLTR and its defenses
        assert [c.stem for c in rp.resolve_chapters(name, real)] == [want], name


def test_the_real_book_takes_the_short_names():
    chapters = rp.list_chapters(ROOT)
    expect = {"1a": "01a_gradient_leakage", "01c": "01c_membership_inference", "2": "02_pac_identifiability",
              "3a": "03a_raifle_recsys", "ch3c": "03c_raifle_oltr", "4": "04_model_reconstruction",
              "4b": "04b_reconstruction_heuristic",
              "2b": "02b_pac_defenses",
              "03a": "03a_raifle_recsys", "ch3a": "03a_raifle_recsys", "3b": "03b_raifle_recsys_defenses",
              "03b": "03b_raifle_recsys_defenses", "ch3b": "03b_raifle_recsys_defenses",   # 3a's defenses half
              "05": "05_dprivacy_ifca", "6": "06_flower", "0": "00_fl_primer",
              "1d": "01d_membership_defenses", "01d": "01d_membership_defenses", "ch1d": "01d_membership_defenses",
              "1b": "01b_gradient_defenses", "01b": "01b_gradient_defenses", "ch1b": "01b_gradient_defenses",
              "1c": "01c_membership_inference", "ch1c": "01c_membership_inference",
              "5": "05_dprivacy_ifca", "ch5": "05_dprivacy_ifca", "5b": "05b_dprivacy_experiments",
              "05b": "05b_dprivacy_experiments", "ch5b": "05b_dprivacy_experiments"}
    for name, stem in expect.items():
        assert [c.stem for c in rp.resolve_chapters(name, chapters)] == [stem], name
    with pytest.raises(ValueError, match=r"'1' is ambiguous \(01a_gradient_leakage, 01b_gradient_defenses, "
                                         r"01c_membership_inference, 01d_membership_defenses\)"):
        rp.resolve_chapters("1", chapters)


def test_an_unknown_name_gets_did_you_mean_and_the_valid_names(tmp_path):
    chapters = rp.list_chapters(_book(tmp_path))

    def error(name):
        with pytest.raises(ValueError) as info:
            rp.resolve_chapters(name, chapters)
        return str(info.value)

    msg = error("gamma_otlr")
    assert "matches no notebook" in msg and "did you mean 03c_gamma_oltr?" in msg, msg
    assert "Valid names: 00_intro (0), 01a_alpha_leakage (1a)" in msg and "04_delta (4), appendix" in msg, msg
    assert "'all'" in msg and "'matrix'" in msg
    assert "did you mean 01a_alpha_leakage?" in error("alpah")          # a word of a stem
    assert "did you mean 01a_alpha_leakage or 01c_beta?" in error("1d")  # a number without that letter
    assert "did you mean 03c_gamma_oltr?" in error("ch3a")
    assert "did you mean matrix" in error("matirx")
    msg = error("9")                                                    # nothing close: no guess, the names
    assert "did you mean" not in msg and "Valid names" in msg, msg
    with pytest.raises(ValueError, match="non-empty"):
        rp.resolve_chapters("  ", chapters)


def test_the_command_line_says_did_you_mean(tmp_path, capsys, monkeypatch):
    root = _book(tmp_path)
    monkeypatch.setattr(rp, "_run_seeds", _no_run)
    code, _, err = _main(capsys, "deltaa", "--root", str(root), "--out", str(tmp_path / "r"))
    assert code == 2 and "did you mean 04_delta" in err and "Valid names" in err and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------------
# --help
def test_help_is_plain_text_with_examples(capsys):
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    for raw in ("``", ":func:", ":mod:", "glue"):          # reStructuredText and the book's internal words
        assert raw not in out, raw
    assert "chapters/records/<chapter>.<scale>.json" in out and "--out" in out and "--list" in out
    assert "python -m fedlab reproduce 03c --scale paper --seeds 0-4 --jobs 2" in out
    assert "--force" in out and "fewer seeds" in out and "3c" in out
    # the examples keep their lines (a reflowing formatter would run them together)
    assert "\n  python -m fedlab reproduce --list\n" in out


def test_rows_is_for_the_matrix_only(capsys):
    """``--rows`` re-runs rows of the stored matrix record; with a notebook it is an error that says so, before
    anything runs."""
    from fedlab import reproduce as rp

    assert rp.main(["reproduce", "02", "--rows", "rs", "--root", str(ROOT)]) == 2
    assert "--rows re-runs rows of the matrix, not of" in capsys.readouterr().err
