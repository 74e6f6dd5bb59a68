"""``python -m fedlab reproduce`` on a tiny book made here: records, failures, the t interval."""
import json
import math
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from scipy import stats

from fedlab import reproduce as rp

# no torch here (importing it costs about 3 s of CPU in each of this notebook's kernels): the draw comes from
# fedlab's shared NumPy stream, which a kernel seeds from FEDLAB_SEED on first use (no seed_everything call): two
# commands at one seed must give the same draw, two seeds different ones
GOOD = """import os
from myst_nb import glue
import fedlab
SEED = fedlab.default_seed()
glue("seed_value", SEED * 1.5, display=False)
glue("const", 7, display=False)
glue("label", "p = 4.5e-03" if SEED else "p = 1.0e-02", display=False)
glue("as_text", f"{0.25 + SEED:.2f}", display=False)
glue("scale", fedlab.scale(), display=False)
from fedlab.config import global_rng
glue("draw", round(float(global_rng().random()) + float(global_rng().standard_normal()), 12), display=False)"""

BAD = """import fedlab
SEED = fedlab.default_seed()
from myst_nb import glue
glue("before", SEED, display=False)"""

BAD_ASSERT = """# the claim
auc = 0.9 - 0.2 * SEED
assert auc > 0.8, auc"""


def _book(tmp_path: Path) -> Path:
    (tmp_path / "chapters").mkdir()
    good = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A good chapter"),
                                           nbformat.v4.new_code_cell(GOOD)])
    bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter that fails at seed 1"),
                                          nbformat.v4.new_code_cell(BAD), nbformat.v4.new_code_cell(BAD_ASSERT),
                                          nbformat.v4.new_code_cell("glue('after', 1, display=False)")])
    nbformat.write(good, tmp_path / "chapters" / "01_good.ipynb")
    nbformat.write(bad, tmp_path / "chapters" / "02_bad.ipynb")
    (tmp_path / "index.md").write_text("# Book\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\nparts:\n  - caption: C\n    chapters:\n"
                                       "      - file: chapters/01_good\n        title: Good one\n"
                                       "      - file: chapters/02_bad\n")
    return tmp_path


def _alive_after(pids, seconds: float) -> list:
    """Those of ``pids`` (other than zombies) still running ``seconds`` s from now; returns as soon as none is
    (the same check as sleeping ``seconds`` s and then looking, without the wait when they are already gone)."""
    import os
    import time

    def alive():
        out = []
        for p in pids:
            try:
                with open(f"/proc/{p}/status") as f:
                    if "zombie" not in f.read().lower():
                        out.append(p)
            except OSError:
                pass
        return out

    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive()


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedlab", "reproduce", *args, "--root", str(root), "--no-progress"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_list_and_resolve(tmp_path):
    root = _book(tmp_path)
    chapters = rp.list_chapters(root)
    assert [c.stem for c in chapters] == ["01_good", "02_bad"]
    assert chapters[0].title == "Good one" and chapters[1].title == "A chapter that fails at seed 1"
    assert [c.stem for c in rp.resolve_chapters("02", chapters)] == ["02_bad"]
    assert len(rp.resolve_chapters("all", chapters)) == 2
    with pytest.raises(ValueError, match="ambiguous"):
        rp.resolve_chapters("0", chapters)
    with pytest.raises(ValueError, match="matches no notebook"):
        rp.resolve_chapters("07", chapters)
    res = _cli(root, "--list")
    assert res.returncode == 0 and "01_good" in res.stdout and "Good one" in res.stdout and "02_bad" in res.stdout


def test_the_command_line_imports_no_torch(tmp_path):
    """`python -m fedlab reproduce`, its spawned workers and the record it writes need no torch: importing it
    costs about 3 s of CPU in each of those processes (a dozen or more per run of this file)."""
    code = ("import sys; from pathlib import Path; import fedlab.__main__, fedlab.reproduce as rp\n"
            "runs = [rp.SeedRun(seed=0, values={'a': 1.0}), rp.SeedRun(seed=1, values={'a': 2.0})]\n"
            f"rec = rp.build_record(rp.Chapter('x', Path('x.ipynb'), 'X'), 'quick', runs, root=Path({str(tmp_path)!r}), "
            "command='c')\n"
            f"rp.write_record(rec, {str(tmp_path / 'rec')!r})\n"
            "assert rec['torch'] and rec['summary']['a']['n'] == 2\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
    assert (tmp_path / "rec" / "x.quick.json").is_file()


def test_book_toc_lists_every_notebook():
    root = Path(__file__).resolve().parents[1]
    stems = {c.stem for c in rp.list_chapters(root)}
    on_disk = {p.stem for p in (root / "chapters").glob("*.ipynb")}
    assert stems == on_disk - set(rp.RECORD_PAGES)
    toc = (root / "_toc.yml").read_text()       # the record pages are in the book, just not chapters to run
    assert all(f"chapters/{stem}\n" in toc and (root / "chapters" / f"{stem}.ipynb").is_file() for stem in rp.RECORD_PAGES)


@pytest.mark.slow
def test_record_of_a_clean_chapter(tmp_path):
    root = _book(tmp_path)
    out = tmp_path / "rec"
    res = _cli(root, "01", "--seeds", "1,2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rec = json.loads((out / "01_good.quick.json").read_text())
    assert set(rp.RECORD_FIELDS) <= set(rec)
    assert rec["chapter"] == "01_good" and rec["scale"] == "quick" and rec["seeds"] == [1, 2]
    assert rec["values"]["seed_value"] == [1.5, 3.0]          # the seed reached the kernel
    assert rec["values"]["scale"] == ["quick", "quick"]
    assert rec["values"]["as_text"] == ["1.25", "2.25"]
    assert len(rec["seconds"]) == 2 and all(s > 0 for s in rec["seconds"]) and rec["failures"] == []
    s = rec["summary"]["seed_value"]
    half = stats.t.ppf(0.975, 1) * math.sqrt(((1.5 - 2.25) ** 2 + (3 - 2.25) ** 2) / 1) / math.sqrt(2)
    assert s["n"] == 2 and s["mean"] == pytest.approx(2.25) and s["ci95"] == pytest.approx([2.25 - half, 2.25 + half])
    assert rec["summary"]["const"]["std"] == 0 and rec["summary"]["as_text"]["mean"] == pytest.approx(1.75)
    assert "label" not in rec["summary"] and "scale" not in rec["summary"]   # text that is not a number
    assert rec["values"]["draw"][0] != rec["values"]["draw"][1]               # two seeds differ
    again = _cli(root, "01_good", "--seeds", "2", "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    rec2 = json.loads((tmp_path / "again" / "01_good.quick.json").read_text())
    assert rec2["values"]["draw"] == [rec["values"]["draw"][1]]               # one seed, identical numbers


@pytest.mark.slow
def test_failing_seed_is_named_and_exit_nonzero(tmp_path):
    root = _book(tmp_path)
    out = tmp_path / "rec"
    res = _cli(root, "02_bad", "--seeds", "0,1", "--out", str(out), "--jobs", "2")
    assert res.returncode == 1
    assert "seed 1" in res.stderr and "code cell 1" in res.stderr and "assert auc > 0.8, auc" in res.stderr
    assert "AssertionError" in res.stderr and "seed 0" not in res.stderr.split("FAILED")[1].split("\n")[0]
    rec = json.loads((out / "02_bad.quick.json").read_text())
    assert rec["failures"] == [{"seed": 1, "cell": 1, "line": "line 3: assert auc > 0.8, auc",
                                "error": "AssertionError: 0.7"}]
    assert rec["values"]["before"] == [0, 1] and rec["values"]["after"] == [1, None]
    # the failed seed keeps its values but is left out of the summary
    assert rec["summary"]["after"]["n"] == 1 and rec["summary"]["before"] == {"mean": 0.0, "std": None,
                                                                             "ci95": None, "n": 1}
    # a clean run of seed 0 alone would drop the stored failure of seed 1: refused before it runs, unless --force
    res = _cli(root, "02_bad", "--seeds", "0", "--out", str(out))
    assert res.returncode == 2 and "lose seed 1" in res.stderr and "--force" in res.stderr, res.stderr
    assert json.loads((out / "02_bad.quick.json").read_text())["seeds"] == [0, 1]
    res = _cli(root, "02_bad", "--seeds", "0", "--out", str(out), "--force")
    assert res.returncode == 0 and json.loads((out / "02_bad.quick.json").read_text())["failures"] == []
    # a failing run never replaces a stored clean record
    res = _cli(root, "02_bad", "--seeds", "0,1", "--out", str(out))
    assert res.returncode == 1 and (out / "02_bad.quick.failed.json").is_file()
    assert json.loads((out / "02_bad.quick.json").read_text())["failures"] == []


@pytest.mark.slow
def test_failure_names_the_cell_line(tmp_path):
    long_cell = "\n".join(f"x{i} = {i}" for i in range(11)) + "\nassert x10 < 3"
    cells = [long_cell, "import json\njson.loads('{')", "assert False"]
    for src, line, error in [(long_cell, "line 12: assert x10 < 3", "AssertionError"),
                             (cells[1], "line 2: json.loads('{')", "JSONDecodeError"),
                             (cells[2], "line 1: assert False", "AssertionError")]:
        path = tmp_path / "f.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src)]), path)
        fail = rp.run_notebook(path, seed=0, scale="quick").failure
        assert fail["line"] == line and fail["error"].startswith(error), fail
    assert fail["error"] == "AssertionError"


def test_t_interval_and_glue_parsing():
    xs = [0.2, 0.4, 0.9, 0.5]
    mean, std, (lo, hi) = rp.t_interval(xs)
    ref = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 4, scale=stats.sem(xs))
    assert (lo, hi) == pytest.approx(ref) and std == pytest.approx(stats.tstd(xs))
    # a 10x wrong t quantile (or z instead of t at n = 4) would not match
    assert hi - mean > 1.2 * 1.96 * std / 2
    for bad in ([], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="xs"):
            rp.t_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        rp.t_interval([1, 2], confidence=1.5)
    assert rp._parse_plain("np.float64(0.25)") == 0.25 and rp._parse_plain("'a'") == "a"
    assert rp._parse_plain("inf") == "inf" and rp._parse_plain("<Figure size 1x1>") == "<Figure size 1x1>"
    assert rp._parse_plain("np.str_('a')") == "a" and rp._parse_plain("np.True_") is True
    assert rp._parse_plain("-np.float64(1.5)") == -1.5 and rp._parse_plain("np.int64(3)") == 3
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"metadata": {"scrapbook": {"name": n, "mime_prefix": ""}}, "data": {"text/plain": v}}
        for n, v in [("a", "1"), ("a_paper", "'0.5 ± 0.1 (n = 3)'"), ("b_note", "'x'")]]}]}
    assert rp.collect_glued(nb) == {"a": 1}


@pytest.mark.slow
def test_bad_arguments(tmp_path):
    root = _book(tmp_path)
    assert _cli(root, "01", "--jobs", "0").returncode == 2
    assert _cli(root, "01", "--seeds", "1,1").returncode == 2
    assert _cli(root, "nope").returncode == 2
    assert _cli(root, "01", "--seeds", "3-1").returncode == 2
    res = subprocess.run([sys.executable, "-m", "fedlab", "reproduce", "--list", "--root", str(tmp_path / "chapters")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "_toc.yml" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(ValueError, match="scale"):
        rp.run_notebook(root / "chapters" / "01_good.ipynb", seed=0, scale="huge")
    with pytest.raises(ValueError, match="seed"):
        rp.run_notebook(root / "chapters" / "01_good.ipynb", seed=-1, scale="quick")


@pytest.mark.slow
def test_a_cell_past_the_timeout_fails_its_seed(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(30)")])
    path = tmp_path / "slow.ipynb"
    nbformat.write(nb, path)
    run = rp.run_notebook(path, seed=0, scale="quick", timeout=1)
    assert run.failure is not None and run.failure["cell"] == 0 and run.failure["line"] == "import time"
    assert run.failure["error"].startswith("CellTimeoutError: ") and "timed out" in run.failure["error"], run.failure
    assert run.seconds < 25


@pytest.mark.slow
def test_a_timed_out_seed_is_run_once_more(tmp_path):
    root = _book(tmp_path)
    slow = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(20)")])
    nbformat.write(slow, root / "chapters" / "01_good.ipynb")
    res = _cli(root, "01", "--seeds", "0", "--timeout", "1", "--out", str(tmp_path / "r"))
    assert res.returncode == 1 and "run a second time" in res.stderr
    rec = json.loads((tmp_path / "r" / "01_good.quick.json").read_text())
    assert len(rec["retries"]) == 1 and rec["failures"][0]["error"].startswith("CellTimeoutError")


@pytest.mark.slow
def test_workers_do_not_outlive_a_killed_command(tmp_path):
    import os
    import signal
    import time

    root = _book(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    slow = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import os, time\nopen(os.path.join({str(marks)!r}, str(os.getpid())), 'w').close()\ntime.sleep(120)")])
    nbformat.write(slow, root / "chapters" / "01_good.ipynb")
    proc = subprocess.Popen([sys.executable, "-m", "fedlab", "reproduce", "01", "--seeds", "0,1", "--jobs", "2",
                             "--root", str(root), "--no-progress", "--out", str(tmp_path / "r")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180                # workers and kernels are up (slow on a loaded machine)
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the command started no worker"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    alive = _alive_after(children, 8)             # each worker looks for its parent every 2 s
    assert alive == [], alive


# ------------------------------------------------------------------------------------------------
# arguments checked before anything runs
def test_seeds_timeout_and_out_are_checked_before_any_seed_runs(tmp_path, capsys, monkeypatch):
    import argparse

    root = _book(tmp_path)
    assert rp._parse_seeds("0-999") == list(range(1000)) and rp._parse_seeds("0-2,7") == [0, 1, 2, 7]
    for bad in ("0-1000", "0-1000000000", "4294967296", "-1", "0-499,500-1000", "1,1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--seeds"):
            rp._parse_seeds(bad)
    monkeypatch.setattr(rp, "run_notebook", lambda *a, **k: pytest.fail("a seed ran"))

    def cli(*args):
        try:
            code = rp.main(["reproduce", *args, "--root", str(root), "--no-progress"])
        except SystemExit as exc:     # argparse
            code = exc.code
        return code, capsys.readouterr().err

    code, err = cli("01", "--seeds", "0-1000000000")              # was a MemoryError
    assert code == 2 and "more than 1000 seeds" in err
    for bad in ("0", "-5"):                                        # were "no limit"
        code, err = cli("01", "--timeout", bad)
        assert code == 2 and "--timeout must be a positive" in err, err
    (tmp_path / "a_file").write_text("x")
    code, err = cli("01", "--out", str(tmp_path / "a_file" / "rec"))   # was found out after every seed ran
    assert code == 2 and "--out" in err and "cannot create" in err, err
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "01_good.quick.json").symlink_to(tmp_path / "a_file")
    code, err = cli("01", "--out", str(tmp_path / "rec"))
    assert code == 2 and "symbolic link" in err and (tmp_path / "a_file").read_text() == "x"
    code, err = cli("matrix", "--out", str(tmp_path / "a_file"))
    assert code == 2 and "--out" in err
    res = _cli(root, "01", "--seeds", "0-99999999999")           # the command line, as a user runs it
    assert res.returncode == 2 and "more than 1000 seeds" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(ValueError, match="timeout"):
        rp.reproduce([], scale="quick", seeds=[0], out=tmp_path / "r", root=root, timeout=-1)
    with pytest.raises(ValueError, match="Console.show_progress"):
        rp.Console(show_progress="no")
    with pytest.raises(ValueError, match="console must be"):
        rp.reproduce([], scale="quick", seeds=[0], out=tmp_path / "r", root=root, console=False)


def test_a_glued_nan_or_inf_is_found():
    def nb(*glues):
        return {"cells": [{"cell_type": "markdown"}, {"cell_type": "code", "outputs": []},
                          {"cell_type": "code", "outputs": [
                              {"metadata": {"scrapbook": {"name": n, "mime_prefix": ""}}, "data": {"text/plain": v}}
                              for n, v in glues]}]}
    bad = [("a", "nan"), ("b", "-inf"), ("c", "np.float64(nan)"), ("d", "-np.float64(inf)"), ("e", "'nan'"),
           ("f", "np.float32(inf)"), ("g", "'-inf'")]
    good = [("h", "0.5"), ("i", "'infinite loop'"), ("j", "'p = nan'"), ("k_paper", "nan"), ("l", "'∞'"), ("m", "1e308")]
    assert rp.non_finite_glues(nb(*bad, *good)) == [(n, 1) for n, _ in bad]


@pytest.mark.slow
def test_a_seed_that_glues_nan_is_not_clean(tmp_path):
    path = tmp_path / "nan.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from myst_nb import glue\nglue('fine', 0.5, display=False)"),
        nbformat.v4.new_code_cell("import numpy as np\nglue('ratio', np.float64(0.0) / np.float64(0.0), display=False)"),
    ]), path)
    run = rp.run_notebook(path, seed=0, scale="quick")
    assert run.values == {"fine": 0.5, "ratio": "nan"}
    assert run.failure is not None and run.failure["cell"] == 1 and run.failure["error"].startswith("NonFiniteValue")
    assert "'ratio'" in run.failure["error"]


# ------------------------------------------------------------------------------------------------
# no hangs: a kernel that is idle while the client waits is found within seconds, not at the time limit
LOSE_REPLY = """k = get_ipython().kernel
send = k.session.send
def lose_reply(stream, msg_or_type, *args, **kwargs):   # this cell's reply never leaves the kernel
    if msg_or_type == "execute_reply":
        k.session.send = send
        return {"content": {"status": "ok"}, "header": {}}
    return send(stream, msg_or_type, *args, **kwargs)
k.session.send = lose_reply"""


@pytest.mark.slow
def test_a_reply_lost_in_the_kernel_fails_the_seed_within_seconds(tmp_path, monkeypatch):
    import time

    path = tmp_path / "lost.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                                   nbformat.v4.new_code_cell(LOSE_REPLY),
                                                   nbformat.v4.new_code_cell("from myst_nb import glue\nglue('y', 2)")]),
                   path)
    monkeypatch.setattr(rp._client_class(), "stall_grace", 2.0)
    t0 = time.monotonic()
    run = rp.run_notebook(path, seed=0, scale="quick", timeout=90)
    assert time.monotonic() - t0 < 60, "waited for the cell time limit"
    assert run.failure is not None and run.failure["cell"] == 1, run.failure
    assert run.failure["error"].startswith("KernelStallError") and "went idle" in run.failure["error"]
    assert "KernelStallError" in rp.RETRY_ERRORS and run.values == {}


@pytest.mark.slow
def test_a_silent_long_cell_is_not_a_stall_but_a_lost_reply_and_status_are(tmp_path, monkeypatch):
    """A fake client loses both the reply and the idle status of the cell marked LOSE: only the probe (a
    silent execute request, answered after the cell) can tell that the kernel is done. The first cell
    runs 4 s without a message: the probe sent meanwhile is answered after it, so that is no stall."""
    import time

    Guarded = rp._client_class()

    class Losing(Guarded):
        probe_after, stall_grace = 1.0, 1.0

        def __init__(self, nb, *a, **kw):
            super().__init__(nb, *a, **kw)
            self.lost = set()

        def _guard_channels(self, kc):
            super()._guard_channels(kc)
            guarded = kc.shell_channel.send

            def send(msg):
                if "# LOSE" in msg["content"].get("code", ""):
                    self.lost.add(msg["header"]["msg_id"])
                return guarded(msg)
            kc.shell_channel.send = send

        async def _receive(self, channel, get_msg, timeout):
            msg = await get_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") in self.lost and (
                    channel == "shell" or msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"):
                from queue import Empty
                raise Empty
            return msg

    monkeypatch.setattr(rp, "_client_class", lambda: Losing)
    path = tmp_path / "lost.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(4)"),
                                                   nbformat.v4.new_code_cell("x = 1  # LOSE"),
                                                   nbformat.v4.new_code_cell("y = 2")]), path)
    t0 = time.monotonic()
    run = rp.run_notebook(path, seed=0, scale="quick", timeout=90)
    assert time.monotonic() - t0 < 60, "waited for the cell time limit"
    assert run.failure is not None and run.failure["cell"] == 1, run.failure      # cell 0 ran clean
    assert run.failure["error"].startswith("KernelStallError"), run.failure


@pytest.mark.slow
def test_output_widget_cells_never_wait_for_their_time_limit(tmp_path):
    """The hang's cause: nbclient answers each output captured by an Output widget with a message on the
    shell socket, sent through a blocking shadow of the asyncio socket; a reply that arrives just before
    such a send was left unread until the cell's time limit (about 5 % of these cells with nbclient
    alone: 5 of 101 took the full 5 s limit)."""
    cells = ["import ipywidgets as widgets\nfrom IPython.display import display\nout = widgets.Output()\ndisplay(out)"]
    cells += ["with out:\n    print(1)"] * 100
    path = tmp_path / "widgets.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    run = rp.run_notebook(path, seed=0, scale="quick", timeout=60)
    assert run.failure is None, run.failure
    assert run.seconds < 50, run.seconds        # one lost wake-up would cost the 60 s limit


# ------------------------------------------------------------------------------------------------
# SIGINT / SIGTERM stop the whole run and keep the stored record
@pytest.mark.slow
@pytest.mark.parametrize("sig,jobs", [("SIGTERM", 1), ("SIGTERM", 2), ("SIGINT", 1)])
def test_a_signal_stops_the_run_and_keeps_the_stored_record(tmp_path, sig, jobs):
    import os
    import signal
    import time

    root = _book(tmp_path)
    started = tmp_path / "started"
    slow = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import time\nopen({str(started)!r}, 'a').write('x')\ntime.sleep(120)")])
    nbformat.write(slow, root / "chapters" / "01_good.ipynb")
    out = tmp_path / "rec"
    out.mkdir()
    stored = out / "01_good.quick.json"
    stored.write_text('{"an": "old record"}\n')
    old = stored.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "fedlab", "reproduce", "01", "--seeds", "0,1", "--jobs", str(jobs),
                             "--root", str(root), "--no-progress", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    def running():                              # kernels that have reached the sleeping cell
        return len(started.read_text()) if started.exists() else 0

    while running() < jobs and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)                         # a loaded machine starts the second kernel later
    assert running() == jobs, proc.communicate()[1]
    family = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()  # workers
    kernels = [k for k in subprocess.run(["pgrep", "-f", "ipykernel_launcher"], capture_output=True,
                                         text=True).stdout.split()
               if os.path.realpath(f"/proc/{k}/cwd").startswith(str(tmp_path))]     # the run's kernels
    assert len(kernels) == jobs, kernels
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30, "the run did not stop promptly"
    assert proc.returncode == 128 + getattr(signal, sig), (proc.returncode, err)
    assert f"interrupted by {sig}" in err and "left as it was" in err and "FAILED" not in err, err
    assert stored.read_bytes() == old and sorted(p.name for p in out.iterdir()) == ["01_good.quick.json"]
    ours = [p for p in set(family) | set(kernels) if p != str(proc.pid)]
    alive = _alive_after(ours, 2)
    assert alive == [], alive


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_the_matrix_with_a_nan_cell_is_not_clean_and_still_written(tmp_path, monkeypatch):
    from fedlab.experiments import matrix as mx

    def fake(seed, progress=None):
        progress("dlg", 0.1)
        return {"dlg|none": float("nan") if seed == 1 else 0.5, "dlg|baseline": 0.25}, {"dlg": 0.1}

    monkeypatch.setattr(mx, "run_matrix", fake)
    root = Path(__file__).resolve().parents[1]
    path, failures = rp.reproduce_matrix(scale="quick", seeds=[0, 1], out=tmp_path, root=root)
    rec = json.loads(path.read_text())                       # valid JSON (it has no NaN)
    assert [f["seed"] for f in failures] == [1] and failures[0]["error"].startswith("NonFiniteValue")
    assert rec["values"]["dlg|none"] == [0.5, "nan"] and rec["summary"]["dlg|none"]["n"] == 1
    with pytest.raises(ValueError, match="--out"):
        rp.reproduce_matrix(scale="quick", seeds=[0], out=path, root=root)    # a file, not a folder


def test_the_kernel_imports_the_fedlab_of_the_book_it_runs(tmp_path, monkeypatch):
    """A record names its checkout's commit, so its kernel must import that checkout's ``fedlab``, not the one
    an editable install (of another checkout) points at: the book's root goes first on the kernel's
    PYTHONPATH. Here the book carries a ``fedlab`` of its own that the installed one is not."""
    root = _book(tmp_path)
    pkg = root / "fedlab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WHERE = 'the book'\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import fedlab\nfrom myst_nb import glue\nglue('where', getattr(fedlab, 'WHERE', 'installed'), display=False)")])
    path = root / "chapters" / "03_where.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-before")
    env = rp.kernel_pythonpath(path)
    assert env["PYTHONPATH"].split(":") == [str(root.resolve()), "/nonexistent-before"]
    run = rp.run_notebook(path, seed=0, scale="quick")
    assert run.failure is None, run.failure
    assert run.values["where"] == "the book"
    # a notebook outside any book, or a book without fedlab/, leaves the environment alone
    (pkg / "__init__.py").unlink()
    pkg.rmdir()
    assert rp.kernel_pythonpath(path) == {}
    assert rp.kernel_pythonpath(tmp_path.parent / "nowhere.ipynb") == {}
