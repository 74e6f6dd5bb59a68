"""fedlab.records: reading the records that `python -m fedlab reproduce` writes."""
import json

import pytest

from fedlab import records
from fedlab.reproduce import summarize


def _record(tmp_path, values, seeds=(0, 1, 2), failures=()):
    rec = {"chapter": "02_x", "title": "X", "scale": "paper", "seeds": list(seeds), "values": values,
           "summary": summarize(values), "seconds": [10.0] * len(seeds), "failures": list(failures),
           "machine": "x86_64, 2 CPUs", "python": "3.11", "torch": "2.13.0", "commit": "abc", "date": "2026-11-23",
           "command": "python -m fedlab reproduce 02"}
    path = tmp_path / "02_x.paper.json"
    path.write_text(json.dumps(rec))
    return path


def test_format_and_run(tmp_path):
    _record(tmp_path, {"auc": [0.5, 0.6, 0.7], "p": ["1.0e-03", "2.0e-03", "3.0e-03"], "src": ["syn", "syn", "syn"],
                       "one": [0.25, None, None]})
    run = records.Run("02_x", folder=tmp_path)
    # 0.6 ± t(0.975, 2) * 0.1 / sqrt(3) = 0.6 ± 0.248
    assert run.stored("auc") == "0.600 ± 0.248 (n = 3)"
    assert run.stored("auc", 1, scale_factor=100) == "60.0 ± 24.8 (n = 3)"
    assert run.stored("p") == "2.00e-03 ± 2.48e-03 (n = 3)"
    assert run.stored("src") == "syn" and run.stored("one") == "0.250 (n = 1)" and run.stored("zzz") == "not in record"
    assert "seeds 0, 1, 2 (n = 3)" in run.describe() and "10 s per seed" in run.describe()
    assert run.describe().endswith("Made by `python -m fedlab reproduce 02`.")   # the record's own command
    del run.record["command"]
    assert "Made by" not in run.describe()                   # a record without its command says nothing of it
    assert records.Run("03_none", folder=tmp_path).stored("auc") == "no record yet"
    assert "reproduce 03_none --scale paper" in records.Run("03_none", folder=tmp_path).describe()
    rows = records.compare_rows({"auc": 0.55}, run.record, {"auc": "AUC", "c": "C"})
    assert rows == [["AUC", 0.55, "0.600 ± 0.248 (n = 3)"], ["C", "n/a", "not in record"]]
    labels = {"auc": "AUC", "p": "K-S p", "src": "data"}       # a rate's interval in [0, 1]; a p-value never a t interval
    rows = records.compare_rows({}, run.record, labels, kinds={"auc": "rate", "p": "p"})
    assert rows[0][2] == "0.600 [0.352, 0.848] (n = 3)" and rows[1][2] == "median 2.0e-03 (range 1.0e-03–3.0e-03, n = 3)"
    _record(tmp_path, {"auc": [0.9, 0.99, 0.999]})
    top = records.compare_rows({}, records.load("02_x", "paper", tmp_path), {"auc": "AUC"}, kinds={"auc": "rate"})
    assert top[0][2].endswith(", 1.000] (n = 3)")           # cut at 1 (the t interval passes it)
    _record(tmp_path, {"auc": [0.0, 0.0, 0.0012]})          # a small rate keeps two significant digits, not "0.000"
    small = records.Run("02_x", folder=tmp_path).stored("auc", value_range=(0, 1))
    assert small.startswith("0.00040 [0.00000, 0.00") and small.endswith("] (n = 3)"), small
    for bad in ({"auc": "share"}, {"zzz": "rate"}):
        with pytest.raises(ValueError, match="kinds"):
            records.compare_rows({}, run.record, labels, kinds=bad)


def test_per_seed_and_count_below_skip_failed_seeds(tmp_path):
    _record(tmp_path, {"d": [-0.1, 0.2, -0.3], "a": [1.0, 2.0, 3.0], "b": [2.0, 1.0, 5.0], "short": [1.0, None, None]},
            failures=[{"seed": 1, "cell": 3, "error": "x"}])
    run = records.Run("02_x", folder=tmp_path)
    assert run.per_seed("d") == [-0.1, -0.3]            # seed 1 failed: its value is not counted
    assert run.count_below("d") == 2 and run.count_below("d", -0.2) == 1 and run.count_below("a", "b") == 2
    with pytest.raises(ValueError, match="other='short'"):
        run.count_below("a", "short")
    assert records.Run("03_none", folder=tmp_path).count_below("d") == 0


def test_per_seed_pairs_pair_values_of_the_same_seed(tmp_path):
    """Zipping two per_seed lists pairs different seeds once a value is missing at one seed (a planted record:
    central_acc missing at seed 0, fedavg_iid 0.031 under it at seed 4, and the zipped gaps hid it)."""
    _record(tmp_path, {"c": [None, 0.965, 0.963, 0.974, 0.967], "f": [0.98, 0.963, 0.959, 0.974, 0.936]},
            seeds=(0, 1, 2, 3, 4), failures=[{"seed": 2, "cell": 3, "error": "x"}])
    run = records.Run("02_x", folder=tmp_path)
    zipped = [c - f for c, f in zip(run.per_seed("c"), run.per_seed("f"))]
    assert max(zipped) < 0.03                                   # the misaligned pairing misses seed 4
    pairs = run.per_seed_pairs("c", "f")
    assert pairs == [(0.965, 0.963), (0.974, 0.974), (0.967, 0.936)]   # seeds 1, 3, 4 (2 failed, 0 lacks c)
    assert max(c - f for c, f in pairs) > 0.03
    assert records.paired_values(None, "c", "f") == [] and records.Run("03_none", folder=tmp_path).per_seed_pairs("c", "f") == []
    with pytest.raises(ValueError, match="in common"):
        run.count_below("c", "f")


def test_a_small_mean_with_a_wide_interval_reads_in_decimals(tmp_path):
    _record(tmp_path, {"d": [-0.024, 0.031, 0.024, -0.008, 0.023], "tiny": [1e-4, 2e-4, 3e-4, 1e-4, 2e-4]},
            seeds=range(5))
    run = records.Run("02_x", folder=tmp_path)
    assert run.stored("d") == "0.009 ± 0.030 (n = 5)"       # not 9.20e-03 ± 2.97e-02
    assert run.stored("tiny").startswith("1.80e-04 ± ")


def test_record_errors(tmp_path):
    assert records.load_record(tmp_path / "missing.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"values": 1}))
    with pytest.raises(ValueError, match="not a fedlab record"):
        records.load_record(bad)
    path = _record(tmp_path, {"a": [1, 2, 3]})
    data = json.loads(path.read_text())
    data["values"]["a"] = [1, 2]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="one entry per seed"):
        records.load_record(path)
    with pytest.raises(ValueError, match="scale"):
        records.load("02_x", "huge", tmp_path)


def test_stored_records_are_well_formed():
    """Every record committed under chapters/records/ was written by the command and reads back."""
    from pathlib import Path
    from fedlab.reproduce import RECORD_FIELDS

    folder = Path(__file__).resolve().parents[1] / "chapters" / "records"
    for path in folder.glob("*.json"):
        rec = records.load_record(path)
        assert set(RECORD_FIELDS) <= set(rec), path
        assert path.name == f"{rec['chapter']}.{rec['scale']}.json"
        failed = {f["seed"] for f in rec["failures"]}
        clean = [s not in failed for s in rec["seeds"]]
        assert rec["summary"] == json.loads(json.dumps(summarize(rec["values"], clean))), path
        # what the book shows must be a clean multi-seed run
        assert rec["failures"] == [] and len(rec["seeds"]) >= 3, (path, rec["failures"])
    assert not list(folder.glob("*.failed.json")), "a failed run's record is lying in chapters/records/"


def test_record_errorbars_draws_the_interval(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from fedlab import plots

    _record(tmp_path, {"auc": [0.5, 0.6, 0.7], "b": [1.0, 1.0, 1.0]})
    rec = records.load("02_x", folder=tmp_path)
    ax = plots.record_errorbars(rec, {"auc": "AUC", "b": "B"}, current={"auc": 0.55})
    bars = [c for c in ax.containers if hasattr(c, "lines")]
    seg = bars[0].lines[2][0].get_segments()[0]                # the x error segment of "AUC"
    assert seg[0][0] == pytest.approx(0.6 - 0.2484, abs=1e-3) and seg[1][0] == pytest.approx(0.6 + 0.2484, abs=1e-3)
    ax2 = plots.record_errorbars(None, {"auc": "AUC"})
    assert any("no stored record" in t.get_text() for t in ax2.texts)
    with pytest.raises(ValueError, match="names"):
        plots.record_errorbars(rec, {})


def test_readme_quotes_the_stored_records():
    """The README's table of stored records is what `python -m fedlab reproduce --list` prints."""
    import re
    from pathlib import Path
    from fedlab.reproduce import _stored_times, list_chapters

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    block = re.search(r"<!-- reproduce --list -->\n```text\n(.*?)```", text, re.S)
    assert block, "README lacks the block of `reproduce --list` output"
    want = "".join(f"{c.stem:32s} {c.title}{_stored_times(c.stem, root / 'chapters' / 'records')}\n"
                   for c in list_chapters(root))
    assert block.group(1) == want


def test_bar_plot_draws_the_reference_line():
    import matplotlib
    matplotlib.use("Agg")
    from fedlab import plots
    ax = plots.bar_plot({"accuracy": 0.9, "AUC": 0.6}, hline=(0.55, "chance floor"))
    lines = [ln for ln in ax.get_lines() if ln.get_label() == "chance floor"]
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [0.55, 0.55]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["chance floor"]
    assert plots.bar_plot({"a": 1.0}).get_legend() is None


# ------------------------------------------------------------------------------------------------
# writing records: atomic, never through a link, never half a file (fedlab.reproduce.write_record)
import os          # noqa: E402
import signal      # noqa: E402
import time        # noqa: E402
from pathlib import Path  # noqa: E402

from fedlab import reproduce as rp  # noqa: E402


def _full_record(chapter="02_x", n_values=3, fill=0.5, failures=()):
    values = {f"v{i}": [fill, fill + 1] for i in range(n_values)}
    return {"chapter": chapter, "title": "X", "scale": "paper", "seeds": [0, 1], "values": values,
            "summary": summarize(values) if n_values < 10 else {}, "seconds": [1.0, 1.0], "failures": list(failures), "retries": [],
            "machine": "m", "python": "3", "torch": "2", "commit": "c", "date": "2026-11-27", "command": "x"}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_record_is_atomic_readable_and_leaves_no_temp_file(tmp_path):
    path = rp.write_record(_full_record(), tmp_path)
    assert path == tmp_path / "02_x.paper.json" and records.load("02_x", "paper", tmp_path)["values"]["v0"] == [0.5, 1.5]
    old_umask = os.umask(0o022)
    try:
        rp.write_record(_full_record(fill=2.0), tmp_path)
    finally:
        os.umask(old_umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)          # not mkstemp's 0600
    assert records.load("02_x", "paper", tmp_path)["values"]["v0"] == [2.0, 3.0] and _leftovers(tmp_path) == []
    bad = _full_record()
    bad["values"]["v0"] = [float("nan"), 1.0]
    with pytest.raises(ValueError):                                   # JSON has no NaN: nothing is written
        rp.write_record(bad, tmp_path)
    assert records.load("02_x", "paper", tmp_path)["values"]["v0"] == [2.0, 3.0] and _leftovers(tmp_path) == []


def test_a_symlinked_record_path_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    out = tmp_path / "rec"
    out.mkdir()
    (out / "02_x.paper.json").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        rp.write_record(_full_record(), out)
    with pytest.raises(ValueError, match="symbolic link"):
        rp.check_out(out, ["02_x"], "paper")
    (out / "02_x.paper.json").unlink()
    (out / "02_x.paper.failed.json").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        rp.check_out(out, ["02_x"], "paper")
    assert target.read_text() == "precious\n" and _leftovers(out) == []


def test_check_out_and_seeds_and_timeout(tmp_path):
    assert rp.check_out(tmp_path / "new" / "deeper", ["a"], "quick").is_dir()      # created
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--out"):
        rp.check_out(tmp_path / "file", ["a"], "quick")
    with pytest.raises(ValueError, match="--out"):
        rp.check_out(tmp_path / "file" / "sub", ["a"], "quick")
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "a.quick.json").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        rp.check_out(tmp_path / "rec", ["a"], "quick")
    if os.geteuid() != 0:   # root writes into a read-only folder anyway
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not writable"):
            rp.check_out(ro, ["a"], "quick")
    assert rp.check_seeds(range(1000)) == list(range(1000)) and rp.check_seeds([2**32 - 1]) == [2**32 - 1]
    for bad in ([], range(1001), [2**32], [-1], [True], [1.0], [3, 3]):
        with pytest.raises(ValueError, match="seeds"):
            rp.check_seeds(bad)
    assert rp.check_timeout(None) is None and rp.check_timeout(5) == 5
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="timeout"):
            rp.check_timeout(bad)


def _fork(target, *args):
    """Run ``target(*args)`` in a forked child (no new interpreter: fedlab is already imported)."""
    import multiprocessing as mp

    proc = mp.get_context("fork").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _write_under_fsize_limit(out, mode, conn):
    import resource

    # CPython ignores SIGXFSZ: the write then fails with EFBIG; with the default action the signal kills
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN if mode == "fsize-ignore" else signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    try:
        rp.write_record(_full_record(n_values=5000), out)
    except OSError as exc:
        conn.send(str(exc))
        os._exit(3)
    os._exit(0)


def _write_for_ever(out, n_values, counter, slow_fsync=False):
    if slow_fsync:   # widen the window between the temporary file's creation and its rename
        fsync = os.fsync
        os.fsync = lambda fd: (time.sleep(0.2), fsync(fd))
    both = [_full_record(n_values=n_values, fill=float(i)) for i in (0, 1)]
    i = 0
    while True:
        rp.write_record(both[i % 2], out)
        i += 1
        counter.value = i


@pytest.mark.parametrize("mode", ["fsize-ignore", "fsize-signal"])
def test_a_write_failing_under_rlimit_fsize_keeps_the_old_record(tmp_path, mode):
    import multiprocessing as mp

    out = tmp_path / "rec"
    old = rp.write_record(_full_record(), out).read_bytes()           # about 1 kB: under the limit
    here, there = mp.get_context("fork").Pipe()
    proc = _fork(_write_under_fsize_limit, out, mode, there)
    proc.join(30)
    if mode == "fsize-ignore":
        message = here.recv()
        assert proc.exitcode == 3 and "left as it was" in message and "02_x.paper.json" in message, message
        assert _leftovers(out) == []
    else:
        assert proc.exitcode == -signal.SIGXFSZ, proc.exitcode
    assert (out / "02_x.paper.json").read_bytes() == old                # byte for byte


@pytest.mark.slow
def test_sigkill_during_a_write_leaves_the_old_or_the_new_record(tmp_path):
    import multiprocessing as mp

    out = tmp_path / "rec"
    rp.write_record(_full_record(n_values=2000, fill=1.0), out)
    mid_write = 0
    for delay in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35):
        counter = mp.get_context("fork").Value("i", 0)
        proc = _fork(_write_for_ever, out, 2000, counter, True)
        while counter.value < 1 and proc.is_alive():   # one whole write done: the loop runs
            time.sleep(0.005)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        mid_write += len(_leftovers(out)) > 0          # a temporary file left: killed while writing
        for tmp in out.glob("*.tmp"):
            tmp.unlink()
        rec = records.load("02_x", "paper", out)       # never a partial file
        assert rec is not None and rec["values"]["v0"][0] in (0.0, 1.0)
    assert mid_write >= 3 and [p.name for p in out.glob("*.json")] == ["02_x.paper.json"]


def test_a_reader_beside_two_writers_always_loads_a_whole_record(tmp_path):
    import multiprocessing as mp

    out = tmp_path / "rec"
    rp.write_record(_full_record(n_values=400), out)
    counters = [mp.get_context("fork").Value("i", 0) for _ in range(2)]
    writers = [_fork(_write_for_ever, out, n, c) for n, c in zip((400, 40), counters)]   # two sizes
    try:
        loads, failures, t0 = 0, [], time.monotonic()
        while (loads < 2000 or min(c.value for c in counters) < 50) and time.monotonic() - t0 < 30:
            try:
                rec = records.load("02_x", "paper", out)
                assert rec is not None and len(rec["values"]) in (400, 40)
            except (ValueError, AssertionError) as exc:
                failures.append(repr(exc)[:100])
            loads += 1
    finally:
        for w in writers:
            os.kill(w.pid, signal.SIGKILL)
            w.join()
    assert min(c.value for c in counters) >= 50, "the writers did not run while the reader read"
    assert failures == [] and loads >= 2000, (loads, failures[:3])


def test_constants_have_no_interval_and_p_values_read_as_median_and_range(tmp_path):
    _record(tmp_path, {"c": [100.0, 100.0, 100.0], "tenth": [0.1, 0.1, 0.1], "auc": [0.5, 0.6, 0.7],
                       "p": ["1.5e-46", "2.0e-03", "0.41"], "p_same": [1e-3, 1e-3, 1e-3], "bad": [0.2, 1.5, 0.1],
                       "p_one": [0.03, None, None]})
    run = records.Run("02_x", folder=tmp_path)
    assert run.stored("c") == "100.000 (all n = 3 seeds)"      # not "100.000 ± 0.000 (n = 3)"
    assert run.stored("tenth") == "0.100 (all n = 3 seeds)"     # std 1e-17 from rounding is still a constant
    assert run.stored("auc") == "0.600 ± 0.248 (n = 3)"
    assert run.stored_p("p") == "median 2.0e-03 (range 1.5e-46–0.41, n = 3)"   # not a t interval below 0
    assert run.stored_p("p_same") == "1.0e-03 (all n = 3 seeds)"
    assert run.stored_p("p_one") == "0.03 (n = 1)"
    assert run.stored_p("zzz") == "not in record"
    assert records.Run("03_none", folder=tmp_path).stored_p("p") == "no record yet"
    with pytest.raises(ValueError, match="name='bad'"):
        run.stored_p("bad")
    _record(tmp_path, {"p": [0.5, 0.01, 0.2, 0.3]}, seeds=range(4), failures=[{"seed": 0, "cell": 1, "error": "x"}])
    assert records.Run("02_x", folder=tmp_path).stored_p("p") == "median 0.20 (range 0.01–0.30, n = 3)"


def test_a_heavy_tailed_value_reads_as_median_and_range(tmp_path):
    """Chapter 3a's FNCF embedding error (43, 36, 18598 over three seeds): a t interval would be 6225 ± 26616,
    below 0; the median and range say what the seeds gave."""
    _record(tmp_path, {"err": [43.42, 35.97, 18597.8], "same": [2.0, 2.0, 2.0], "one": [0.5, None, None],
                       "inf": [1.0, "inf", 2.0]},
            seeds=range(3))
    run = records.Run("02_x", folder=tmp_path)
    assert run.stored_median("err") == "median 43 (range 36–1.9e+04, n = 3)"
    assert run.stored_median("same") == "2 (all n = 3 seeds)" and run.stored_median("one") == "0.5 (n = 1)"
    assert run.stored_median("zzz") == "not in record"
    assert records.Run("03_none", folder=tmp_path).stored_median("err") == "no record yet"
    with pytest.raises(ValueError, match="name='inf'"):
        run.stored_median("inf")


def test_a_rate_is_shown_with_its_interval_cut_to_the_unit_range():
    """``value_range=(0, 1)``: a small rate's t interval (which runs below 0) is cut to [0, 1] and printed in fixed
    notation as ``mean [lo, hi]``, not as ``5.00e-02 ± 6.74e-02``; constants keep no interval; a bad range is
    named."""
    from fedlab.records import format_summary

    rec = {"seeds": [0, 1, 2, 3, 4], "values": {"r": [0.0, 0.0, 0.0, 0.25, 0.0], "c": [1.0] * 5},
           "summary": {"r": {"mean": 0.05, "std": 0.1118, "ci95": [0.05 - 0.1388, 0.05 + 0.1388], "n": 5},
                       "c": {"mean": 1.0, "std": 0.0, "ci95": [1.0, 1.0], "n": 5}}}
    assert format_summary(rec, "r", 2) == "0.05 ± 0.14 (n = 5)"              # the interval runs below 0
    assert format_summary(rec, "r", 2, value_range=(0, 1)) == "0.05 [0.00, 0.19] (n = 5)"
    assert format_summary(rec, "c", 2, value_range=(0, 1)) == "1.00 (all n = 5 seeds)"
    for bad in ((1, 0), (0,), (0.5, 0.5), 1, ("a", "b")):     # 1 and ("a", "b") once raised TypeError / float's error
        with pytest.raises(ValueError, match="value_range"):
            format_summary(rec, "r", 2, value_range=bad)
    # a range that does not hold the mean (here given before scale_factor) once printed '5.00 [0.00, 1.00]': refused
    assert format_summary(rec, "r", 1, scale_factor=100, value_range=(0, 100)) == "5.0 [0.0, 18.9] (n = 5)"
    with pytest.raises(ValueError, match="value_range"):
        format_summary(rec, "r", 2, scale_factor=100, value_range=(0, 1))
