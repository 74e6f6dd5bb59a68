"""``python -m fedlab reproduce``: run a chapter at several seeds and store every glued number.

A chapter notebook states its numbers with myst-nb ``glue``. This module executes a notebook headless
(nbclient) once per seed with ``FEDLAB_SEED`` and ``FEDLAB_SCALE`` set, collects every glued value of
each run, and writes **one record** per chapter and scale::

    <out>/<stem>.<scale>.json
    {"chapter": stem, "title": ..., "scale": "quick" | "paper", "seeds": [0, 1, 2],
     "values":  {name: [value at seed 0, value at seed 1, ...]},      # null where a seed never glued it
     "summary": {name: {"mean", "std", "ci95": [low, high], "n"}},    # numeric values, clean seeds only
     "seconds": [wall seconds of each seed], "failures": [{"seed", "cell", "line", "error"}],
     "machine", "python", "torch", "commit", "date", "command"}

``ci95`` is the two-sided 95 % Student-t interval of the mean over the seeds that produced the value
(``mean ± t_{0.975, n-1} · std / sqrt(n)``, ``std`` with ``ddof=1``); with one seed ``std`` and
``ci95`` are ``null``. A value glued as a string that reads as a number (``"4.6e-19"``) is summarised
as that number. Records are only ever written by this command; :mod:`fedlab.records` reads them.

A failing seed keeps the values it glued before the failing cell (later ones are ``null``) but is left
out of ``summary``. The command exits with status 0 only if every seed ran clean; otherwise it names,
on stderr, each failing seed, the failing cell (its index among the notebook's code cells and the
cell line that raised) and the error, still writes the record (a failing seed is a result; it goes to
``<stem>.<scale>.failed.json`` rather than replace a stored clean record, unless ``--force``), and
exits with status 1. A seed whose cell runs past the time limit (300 s a cell at quick scale, 1200 s
at paper scale) or whose kernel dies is run once more before it counts as failed (``retries`` in the
record lists the first failures). Glued names ending in ``_paper`` or ``_note`` quote a stored record
and are not collected.

``python -m fedlab reproduce matrix`` is the one name that is not a notebook: it runs the attack x defense
matrix (:func:`fedlab.experiments.matrix.run_matrix`, every cell at every seed, one seed after the other
in this process) and writes ``<out>/matrix.<scale>.json`` in the same format (``values`` named
``"<attack>|<defense>"``, ``summary`` by :func:`summarize`), plus ``matrix`` (the layout: rows, columns,
n/a reasons) and ``row_seconds`` (wall seconds of each attack row at each seed); see
:func:`reproduce_matrix`.

Usage::

    python -m fedlab reproduce --list
    python -m fedlab reproduce matrix --seeds 0-2
    python -m fedlab reproduce 02 --scale quick --seeds 1,2 --out /tmp/rec
    python -m fedlab reproduce all --scale paper --seeds 0,1,2 --jobs 2
"""
from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import progress_enabled
from .metrics import t_interval

__all__ = ["Chapter", "list_chapters", "resolve_chapters", "collect_glued", "summarize", "t_interval",
           "run_notebook", "reproduce", "reproduce_matrix", "main"]

#: glued names with these endings quote a stored record (``run.paper(...)``, ``run.describe()``) and
#: are not collected into a new one
DERIVED_SUFFIXES = ("_paper", "_note")

#: seconds a cell may run, by scale, before its seed counts as failed (the book build allows 300 s a
#: cell at quick scale; a paper-scale chapter must fit in 30 min per seed)
CELL_TIMEOUT = {"quick": 300, "paper": 1200}
DEFAULT_CELL_TIMEOUT = None   # None: take CELL_TIMEOUT[scale]

#: errors after which a seed is run once more: a kernel that stops answering is not a result (seen here
#: 5 times in about 250 headless runs, with ipykernel 7.4 and 6.31 alike: the kernel idle, nbclient
#: waiting for a reply that never comes; cause not found); a second failure is reported
RETRY_ERRORS = ("CellTimeoutError", "DeadKernelError")

RECORD_FIELDS = ("chapter", "title", "scale", "seeds", "values", "summary", "seconds", "failures", "machine",
                 "python", "torch", "commit", "date", "command")


# --------------------------------------------------------------------------------------------------
# chapters of the book
@dataclass(frozen=True)
class Chapter:
    """A notebook of the book: ``stem`` (``"02_pac_identifiability"``), its ``path`` and ``title``."""

    stem: str
    path: Path
    title: str


def find_root(start: str | Path | None = None) -> Path:
    """The book's root: the first folder, from ``start`` (default: the working directory) upwards, that
    holds ``_toc.yml``. Raises ``ValueError`` if there is none."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    raise ValueError(f"no _toc.yml in {here} or any parent: run from the book's folder or pass --root")


def _toc_entries(node) -> list[dict]:
    """Every ``{file, title?}`` entry of a parsed ``_toc.yml``, in reading order."""
    out: list[dict] = []
    if isinstance(node, dict):
        if "file" in node:
            out.append(node)
        for key in ("parts", "chapters", "sections"):
            for child in node.get(key, []) or []:
                out.extend(_toc_entries(child))
    elif isinstance(node, list):
        for child in node:
            out.extend(_toc_entries(child))
    return out


def _notebook_title(path: Path) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def list_chapters(root: str | Path | None = None) -> list[Chapter]:
    """The notebooks listed in ``_toc.yml`` (markdown pages are not chapters to run), in book order.
    The title is the ``_toc.yml`` title when it has one, else the notebook's first level-1 heading."""
    import yaml

    root = find_root(root) if root is None else Path(root)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    chapters = []
    for entry in [{"file": toc.get("root")}] + _toc_entries(toc):
        file = entry.get("file")
        if not file:
            continue
        path = root / (file if file.endswith(".ipynb") else file + ".ipynb")
        if path.is_file():
            chapters.append(Chapter(path.stem, path, entry.get("title") or _notebook_title(path)))
    return chapters


def resolve_chapters(name: str, chapters: list[Chapter]) -> list[Chapter]:
    """``all``, a notebook stem (``02_pac_identifiability``) or a unique prefix of one (``02``,
    ``03a``). Raises ``ValueError`` naming the choices when ``name`` matches none or several."""
    if name == "all":
        return list(chapters)
    exact = [c for c in chapters if c.stem == name]
    if exact:
        return exact
    hits = [c for c in chapters if c.stem.startswith(name)]
    if len(hits) == 1:
        return hits
    stems = ", ".join(c.stem for c in chapters)
    if not hits:
        raise ValueError(f"chapter {name!r} matches no notebook of _toc.yml; choose one of: {stems} (or 'all')")
    raise ValueError(f"chapter {name!r} is ambiguous ({', '.join(c.stem for c in hits)}); give more of the name")


# --------------------------------------------------------------------------------------------------
# glued values and their summary
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NP_SCALAR = re.compile(r"^(-?)np\.(?:float|int|uint|bool|str)_?\w*\((.*)\)$", re.S)
_NP_BOOL = {"np.True_": True, "np.False_": False}


def _parse_plain(text: str):
    text = text.strip()
    if text in _NP_BOOL:
        return _NP_BOOL[text]
    m = _NP_SCALAR.match(text)
    if m:
        text = m.group(2) if not m.group(1) else f"-({m.group(2)})"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(value, (bool, int, float, str)) or value is None:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # JSON has no inf/nan: keep them as text
        return value
    return text


def collect_glued(nb) -> dict:
    """``name -> value`` for every myst-nb ``glue`` output of an executed notebook (nbformat node or
    dict). Numbers and strings come back as Python values (``np.float64(0.5)`` -> ``0.5``); glued
    figures and other non-text outputs are skipped, and so are names ending in
    :data:`DERIVED_SUFFIXES` (they quote a stored record). A later glue of the same name wins."""
    values: dict = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            meta = (out.get("metadata") or {}).get("scrapbook") or {}
            name = meta.get("name")
            prefix = meta.get("mime_prefix") or ""   # display=False glues use "application/papermill.record/"
            data = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v
                    for k, v in (out.get("data") or {}).items()}
            if not name or "text/plain" not in data or any(k.startswith("image/") for k in data):
                continue
            if name.endswith(DERIVED_SUFFIXES):   # text quoting a stored record: not a result of this run
                continue
            text = data["text/plain"]
            values[name] = _parse_plain("".join(text) if isinstance(text, list) else text)
    return values


def _as_number(value):
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def summarize(values: dict[str, list], clean: list[bool] | None = None) -> dict[str, dict]:
    """For each name whose entries are all numbers (or number-like strings): ``{"mean", "std",
    "ci95": [low, high], "n"}`` (see :func:`t_interval`). Only the seeds marked ``True`` in ``clean``
    (default: all) count: a seed whose run failed is kept in ``values`` but left out of the summary."""
    out = {}
    for name, entries in values.items():
        keep = entries if clean is None else [v for v, ok in zip(entries, clean) if ok]
        nums = [_as_number(v) for v in keep if v is not None]
        if not nums or any(x is None for x in nums):
            continue
        mean, std, ci = t_interval(nums)
        out[name] = {"mean": mean, "std": std, "ci95": list(ci) if ci else None, "n": len(nums)}
    return out


# --------------------------------------------------------------------------------------------------
# running a notebook
@dataclass
class SeedRun:
    """What one seed of one notebook gave: glued ``values``, wall ``seconds`` and, if a cell raised,
    ``failure = {"seed", "cell", "line", "error"}``."""

    seed: int
    values: dict = field(default_factory=dict)
    seconds: float = 0.0
    failure: dict | None = None
    retried: dict | None = None   # the failure of a first attempt that was run again


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    return source.strip().splitlines()[0] if source.strip() else ""


def run_notebook(path: str | Path, *, seed: int, scale: str, timeout: int | None = DEFAULT_CELL_TIMEOUT, progress=None,
                 kernel_name: str | None = None) -> SeedRun:
    """Execute the notebook at ``path`` once, headless, with ``FEDLAB_SEED=seed`` and
    ``FEDLAB_SCALE=scale`` in the kernel's environment (the working directory is the notebook's
    folder). ``progress`` (optional) is called with no argument after each code cell. Never raises for
    a failing cell: the failure is returned in :attr:`SeedRun.failure`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from .config import SCALES

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    code_index = {id(c): i for i, c in enumerate(c for c in nb.cells if c.cell_type == "code")}
    current: dict = {}

    def on_start(cell, cell_index, **_):
        current["cell"] = cell

    def on_done(cell, cell_index, **_):
        if progress is not None and cell.cell_type == "code":
            progress()

    env = dict(os.environ, FEDLAB_SEED=str(int(seed)), FEDLAB_SCALE=scale, FEDLAB_PROGRESS="0",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    run = SeedRun(seed=int(seed))
    t0 = time.perf_counter()
    timeout = CELL_TIMEOUT[scale] if timeout is None else timeout
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name or "python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_execute=on_start, on_cell_executed=on_done)
    try:
        client.execute(env=env, stderr=subprocess.DEVNULL)   # the kernel's own start-up chatter
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        _record_failure(run, exc, current.get("cell"), code_index)
    except Exception as exc:  # the kernel did not start, lost its connection, ...: still a failed seed
        run.failure = {"seed": run.seed, "cell": None, "line": "", "error": f"{type(exc).__name__}: {exc}"}
    run.seconds = time.perf_counter() - t0
    run.values = collect_glued(nb)
    return run


_CELL_LINE = re.compile(r"Cell In\[\d*\], line (\d+)")


def _record_failure(run: SeedRun, exc: Exception, cell, code_index: dict) -> None:
    """Fill ``run.failure`` from an nbclient error: the code-cell index, the cell line that raised (from
    the traceback's ``Cell In[..], line N`` header; the cell's first line when there is none) and the
    error."""
    ename = getattr(exc, "ename", type(exc).__name__)
    text = _ANSI.sub("", str(exc))
    lines = [ln for ln in text.strip().splitlines() if ln.strip(" -")]
    if ename == "CellTimeoutError":
        evalue = lines[0] if lines else ""
    else:
        evalue = getattr(exc, "evalue", None)
        evalue = (lines[-1] if lines else "") if evalue is None else evalue
    error = f"{ename}: {evalue}".strip().rstrip(":") if evalue and evalue != ename else ename
    source = cell.source.splitlines() if cell is not None else []
    hits = _CELL_LINE.findall(text)
    line = _first_line(cell.source) if cell is not None else ""
    if hits and 0 < int(hits[-1]) <= len(source):
        line = f"line {hits[-1]}: {source[int(hits[-1]) - 1].strip()}"
    run.failure = {"seed": run.seed, "cell": code_index.get(id(cell)) if cell is not None else None,
                   "line": line, "error": error}


def _count_code_cells(path: Path) -> int:
    import nbformat

    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


def _exit_with_parent(parent: int) -> None:
    """In a worker process: end this process (and so its kernel, which watches us) once the command
    that started it is gone, instead of running on as an orphan (seen here after a kill)."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(2.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


_PROGRESS_QUEUE = None   # set in each worker process by _init_worker


def _init_worker(queue, parent: int) -> None:
    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = queue
    _exit_with_parent(parent)


def _worker(args):  # top level so that a process pool can pickle it
    path, seed, scale, timeout, slot, progress = args
    if progress is None and _PROGRESS_QUEUE is not None:
        progress = lambda: _PROGRESS_QUEUE.put(1)  # noqa: E731
    time.sleep(2.0 * slot)   # stagger the kernels' start when several jobs begin together
    run = run_notebook(path, seed=seed, scale=scale, timeout=timeout, progress=progress)
    if run.failure and run.failure["error"].split(":")[0] in RETRY_ERRORS:
        first = run
        run = run_notebook(path, seed=seed, scale=scale, timeout=timeout, progress=None)
        run.retried = first.failure
    return run


# --------------------------------------------------------------------------------------------------
# the record
def _commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=root, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return (sha + ("-dirty" if dirty else "")) if sha else None


def _machine() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"{platform.machine()}, {cpus} CPUs"


def build_record(chapter: Chapter, scale: str, runs: list[SeedRun], *, root: Path, command: str) -> dict:
    """The record of ``runs`` (one per seed, in seed order) in the format of the module docstring."""
    import torch

    names: list[str] = []
    for r in runs:
        names += [n for n in r.values if n not in names]
    values = {n: [r.values.get(n) for r in runs] for n in names}
    clean = [r.failure is None for r in runs]
    return {"chapter": chapter.stem, "title": chapter.title, "scale": scale, "seeds": [r.seed for r in runs],
            "values": values, "summary": summarize(values, clean), "seconds": [round(r.seconds, 1) for r in runs],
            "failures": [r.failure for r in runs if r.failure],
            "retries": [r.retried for r in runs if r.retried], "machine": _machine(),
            "python": platform.python_version(), "torch": torch.__version__, "commit": _commit(root),
            "date": _dt.date.today().isoformat(), "command": command}


def write_record(record: dict, out: str | Path, *, force: bool = False) -> Path:
    """Write ``record`` to ``out/<chapter>.<scale>.json`` and return the path. A record with failing
    seeds never replaces a stored record without failures (unless ``force``): it goes to
    ``<chapter>.<scale>.failed.json`` beside it instead."""
    missing = [k for k in RECORD_FIELDS if k not in record]
    if missing:
        raise ValueError(f"record lacks the fields {missing}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['chapter']}.{record['scale']}.json"
    if record["failures"] and path.is_file() and not force:
        try:
            stored_clean = not json.loads(path.read_text()).get("failures")
        except (json.JSONDecodeError, AttributeError):
            stored_clean = False
        if stored_clean:
            path = out / f"{record['chapter']}.{record['scale']}.failed.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    return path


def reproduce(chapters: list[Chapter], *, scale: str, seeds: list[int], jobs: int = 1, out: str | Path,
              root: Path, timeout: int | None = DEFAULT_CELL_TIMEOUT, show_progress: bool = True, command: str = "",
              stderr=None, force: bool = False) -> tuple[list[Path], list[dict]]:
    """Run every chapter at every seed (``jobs`` seeds at a time, each in its own process) and write
    one record per chapter. Returns the written paths and the failures (empty when all ran clean)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    import threading

    from tqdm.auto import tqdm

    stderr = stderr or sys.stderr
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
    paths, failures = [], []
    for chapter in chapters:
        total = len(seeds) * _count_code_cells(chapter.path)
        bar = tqdm(total=total, desc=f"{chapter.stem} [{scale}, seeds {','.join(map(str, seeds))}]",
                   unit="cell", disable=not show_progress, file=stderr)
        ctx = mp.get_context("spawn")
        if jobs == 1:
            runs = [_worker((chapter.path, s, scale, timeout, 0, lambda: bar.update(1))) for s in seeds]
        else:
            # a plain queue handed to the workers at start-up (no manager process that could outlive us)
            queue = ctx.Queue()
            pump = threading.Thread(target=lambda: [bar.update(n) for n in iter(queue.get, None)], daemon=True)
            pump.start()
            args = [(chapter.path, s, scale, timeout, i if i < jobs else 0, None) for i, s in enumerate(seeds)]
            with ProcessPoolExecutor(max_workers=min(jobs, len(seeds)), mp_context=ctx, initializer=_init_worker,
                                     initargs=(queue, os.getpid())) as pool:
                futures = [pool.submit(_worker, a) for a in args]
                runs = []
                for seed, fut in zip(seeds, futures):
                    try:
                        runs.append(fut.result())
                    except Exception as exc:  # a worker process died: a failed seed, not a crash
                        runs.append(SeedRun(seed=seed, failure={"seed": seed, "cell": None, "line": "",
                                                                "error": f"{type(exc).__name__}: {exc}"}))
            queue.put(None)
            pump.join()
        bar.close()
        record = build_record(chapter, scale, runs, root=root, command=command)
        paths.append(write_record(record, out, force=force))
        for f in record["retries"]:
            print(f"note: {chapter.stem} seed {f['seed']} was run a second time after {f['error']}", file=stderr)
        for f in record["failures"]:
            failures.append(dict(f, chapter=chapter.stem))
            print(f"FAILED {chapter.stem} seed {f['seed']}, code cell {f['cell']} ({f['line']}): {f['error']}",
                  file=stderr)
        secs = ", ".join(f"{s:.0f}" for s in record["seconds"])
        print(f"{chapter.stem}: {len(seeds) - len(record['failures'])}/{len(seeds)} seeds clean, seconds per seed "
              f"[{secs}] -> {paths[-1]}", file=stderr)
    return paths, failures


# --------------------------------------------------------------------------------------------------
# the attack x defense matrix (not a notebook: fedlab.experiments.matrix computes its cells)
MATRIX = "matrix"


def reproduce_matrix(*, scale: str, seeds: list[int], out: str | Path, root: Path, command: str = "",
                     stderr=None, force: bool = False) -> tuple[Path, list[dict]]:
    """Run :func:`fedlab.experiments.matrix.run_matrix` at every seed of ``seeds`` (``FEDLAB_SCALE`` set
    to ``scale``, every RNG seeded with the seed, one torch thread) and write the record
    ``<out>/matrix.<scale>.json`` with :func:`write_record`. A seed whose run raises is a failure
    (``{"seed", "cell": the attack row, "line": "", "error"}``), kept out of the summary. Returns the
    written path and the failures. Raises ``ValueError`` for bad ``seeds`` or ``scale``."""
    import torch

    from .config import SCALES, seed_everything
    from .experiments import matrix as mx

    stderr = stderr or sys.stderr
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
    old_scale, old_threads = os.environ.get("FEDLAB_SCALE"), torch.get_num_threads()
    os.environ["FEDLAB_SCALE"] = scale
    torch.set_num_threads(1)
    runs, row_seconds = [], {}
    try:
        for seed in seeds:
            seed_everything(seed)
            t0 = time.perf_counter()
            run = SeedRun(seed=seed)
            done = []

            def progress(row, secs, seed=seed, done=done):
                done.append(row)
                print(f"matrix seed {seed}: {row} in {secs:.1f} s", file=stderr, flush=True)

            try:
                run.values, secs = mx.run_matrix(seed, progress=progress)
                for row, s in secs.items():
                    row_seconds.setdefault(row, {})[seed] = round(s, 2)
            except Exception as exc:   # a failing seed is a result: record it and go on
                rows = [a.key for a in mx.ATTACKS]
                failed = rows[len(done)] if len(done) < len(rows) else None
                run.failure = {"seed": seed, "cell": failed, "line": "", "error": f"{type(exc).__name__}: {exc}"}
            run.seconds = time.perf_counter() - t0
            runs.append(run)
    finally:
        if old_scale is None:
            os.environ.pop("FEDLAB_SCALE", None)
        else:
            os.environ["FEDLAB_SCALE"] = old_scale
        torch.set_num_threads(old_threads)
    chapter = Chapter(MATRIX, root / "chapters" / "07_matrix.ipynb", "Attack x defense matrix")
    record = build_record(chapter, scale, runs, root=root, command=command)
    record["matrix"] = mx.describe_matrix()
    record["row_seconds"] = {row: [by_seed.get(s) for s in seeds] for row, by_seed in row_seconds.items()}
    path = write_record(record, out, force=force)
    failures = [dict(f, chapter=MATRIX) for f in record["failures"]]
    for f in failures:
        print(f"FAILED matrix seed {f['seed']}, row {f['cell']}: {f['error']}", file=stderr)
    secs = ", ".join(f"{s:.0f}" for s in record["seconds"])
    print(f"matrix: {len(seeds) - len(failures)}/{len(seeds)} seeds clean, seconds per seed [{secs}] -> {path}",
          file=stderr)
    return path, failures


# --------------------------------------------------------------------------------------------------
# command line
def _parse_seeds(text: str) -> list[int]:
    seeds = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise argparse.ArgumentTypeError(f"--seeds range {part!r} runs backwards")
                seeds += list(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must look like 0,1,2 or 0-4, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed, e.g. 0,1,2 or 0-4")
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fedlab", description="fedlab command line")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="run a chapter at several seeds and store its glued numbers",
                       description=__doc__.split("\n\n")[0])
    r.add_argument("chapter", nargs="?", help="notebook stem, its prefix (02, 03a), 'all', or 'matrix' "
                                              "(the attack x defense matrix)")
    r.add_argument("--list", action="store_true", help="list the chapters of _toc.yml and exit")
    r.add_argument("--scale", choices=("quick", "paper"), default="quick")
    r.add_argument("--seeds", type=_parse_seeds, default=[0, 1, 2], help="e.g. 0,1,2 or 0-4 (default 0,1,2)")
    r.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (default 1)")
    r.add_argument("--out", default=None, help="folder for the records (default chapters/records/)")
    r.add_argument("--root", default=None, help="the book's folder (default: found from the working directory)")
    r.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT,
                   help="seconds one cell may run before the seed counts as failed (default: 300 quick, 1200 paper); "
                        "a seed whose cell times out or whose kernel dies is run once more")
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    r.add_argument("--force", action="store_true",
                   help="let a record with failing seeds replace a stored clean one (default: write <stem>.<scale>.failed.json)")
    return p


def _stored_times(stem: str, folder: Path) -> str:
    """'  [paper: 3 seeds, 120 s/seed]' for the records stored in ``folder`` (empty when none)."""
    parts = []
    for scale in ("quick", "paper"):
        path = folder / f"{stem}.{scale}.json"
        if path.is_file():
            rec = json.loads(path.read_text())
            failed = {f["seed"] for f in rec.get("failures") or []}
            secs = [t for s, t in zip(rec.get("seeds", []), rec.get("seconds", [])) if s not in failed] or [0]
            parts.append(f"{scale}: {len(secs)} seeds, {sum(secs) / len(secs):.0f} s/seed")
    return f"  [{'; '.join(parts)}]" if parts else ""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fedlab`` and of the ``fedlab-course`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        root = find_root(args.root) if args.root is None else Path(args.root).resolve()
        if not (root / "_toc.yml").is_file():
            raise ValueError(f"{root} holds no _toc.yml: --root must be the book's folder")
        chapters = list_chapters(root)
        if args.list:
            out_dir = Path(args.out) if args.out else root / "chapters" / "records"
            for c in chapters:
                print(f"{c.stem:32s} {c.title}{_stored_times(c.stem, out_dir)}")
            return 0
        if not args.chapter:
            print("error: give a CHAPTER (a stem, its prefix or 'all') or --list", file=sys.stderr)
            return 2
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        if args.chapter == MATRIX:
            out = Path(args.out) if args.out else root / "chapters" / "records"
            _, failures = reproduce_matrix(scale=args.scale, seeds=args.seeds, out=out, root=root,
                                           command="python -m fedlab " + " ".join(argv), force=args.force)
            return 1 if failures else 0
        selected = resolve_chapters(args.chapter, chapters)
        show = not args.no_progress and progress_enabled()       # validates FEDLAB_PROGRESS
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else root / "chapters" / "records"
    _, failures = reproduce(selected, scale=args.scale, seeds=args.seeds, jobs=args.jobs, out=out, root=root,
                            timeout=args.timeout, show_progress=show,
                            command="python -m fedlab " + " ".join(argv), force=args.force)
    return 1 if failures else 0
