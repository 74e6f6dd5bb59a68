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

A run never replaces a stored record with fewer seeds: if ``<stem>.<scale>.json`` holds a seed that
``--seeds`` leaves out, nothing runs and the command exits 2 naming the stored seeds, their commit and the
seeds that would be lost (:func:`check_stored_seeds`); ``--seeds`` with every stored seed, another
``--out`` or ``--force`` go on. Seeds of two runs are never merged into one record (a record holds one
commit's values at every seed); the matrix's rows can be (``reproduce matrix --rows``, :func:`merge_matrix_rows`:
a row is re-run at every stored seed, and the record's ``reruns`` names its commit). A chapter is named by its stem, its number (``1a``, ``01a``, ``ch3c``, ``4``) or a unique
prefix of its stem (:func:`resolve_chapters`); an unknown name gets a "did you mean".

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
    python -m fedlab reproduce 3c --scale paper --seeds 0-4 --jobs 2
    python -m fedlab reproduce all --scale paper --seeds 0,1,2 --jobs 2
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import datetime as _dt
import difflib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._io import atomic_write_bytes
from ._stats import t_interval
from .config import progress_enabled

# nothing here imports torch at module level (about 3 s of CPU): the command line, its worker processes and a
# run that stops on a bad argument start in a fraction of a second

__all__ = ["Chapter", "list_chapters", "resolve_chapters", "collect_glued", "non_finite_glues", "summarize",
           "t_interval", "run_notebook", "Console", "reproduce", "reproduce_matrix", "merge_matrix_rows", "main", "atomic_write_text", "write_record",
           "check_out", "check_seeds", "check_timeout", "check_stored_seeds", "seeds_lost", "format_seeds",
           "chapter_aliases", "MATRIX", "MATRIX_NOTEBOOK", "RECORD_PAGES", "RunInterrupted"]

#: glued names with these endings quote a stored record (``run.stored(...)``, ``run.describe()``) and
#: are not collected into a new one
DERIVED_SUFFIXES = ("_paper", "_note")

#: seconds a cell may run, by scale, before its seed counts as failed (the book build allows 300 s a
#: cell at quick scale; a paper-scale chapter must fit in 30 min per seed)
CELL_TIMEOUT = {"quick": 300, "paper": 1200}
DEFAULT_CELL_TIMEOUT = None   # None: take CELL_TIMEOUT[scale]

#: errors after which a seed is run once more: a kernel that dies or stops answering is not a result; a
#: second failure is reported
RETRY_ERRORS = ("CellTimeoutError", "DeadKernelError", "KernelStallError")

#: at most this many seeds in one command; a seed is an integer in [0, 2**32) (what numpy and torch accept)
MAX_SEEDS = 1000
SEED_LIMIT = 2 ** 32

#: the stall guard of :class:`GuardedClient` (seconds): no channel is polled for longer than
#: ``POLL_SLICE`` at a time; after ``PROBE_AFTER`` s without any message during a cell the kernel is sent
#: a probe (a silent empty execute request, which it can only answer once the cell is done); once the
#: kernel is seen done with the cell (its ``idle`` status, or an answer to the probe) and the cell's reply
#: has not come within ``STALL_GRACE`` s, the seed fails with ``KernelStallError`` (and is run once more)
POLL_SLICE = 1.0
PROBE_AFTER = 20.0
STALL_GRACE = 10.0
#: seconds to wait, after a cell's reply, for the rest of its output (nbclient's default is 4 s and then
#: it goes on without the output: a missing glued value; here a missing output fails the seed)
IOPUB_TIMEOUT = 30

#: notebooks of ``_toc.yml`` that only read the stored records (the "What reproduced" page): the book
#: executes and nbval tests them, but they are not chapters to run at several seeds
RECORD_PAGES = ("reproduced",)

#: the one chapter name that is not a notebook: the attack x defense matrix (:func:`reproduce_matrix`)
MATRIX = "matrix"

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
    """The notebooks listed in ``_toc.yml`` (markdown pages and the pages of :data:`RECORD_PAGES` are not
    chapters to run), in book order. The title is the ``_toc.yml`` title when it has one, else the notebook's first level-1 heading."""
    import yaml

    root = find_root(root) if root is None else Path(root)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    chapters = []
    for entry in [{"file": toc.get("root")}] + _toc_entries(toc):
        file = entry.get("file")
        if not file:
            continue
        path = root / (file if file.endswith(".ipynb") else file + ".ipynb")
        if path.is_file() and path.stem not in RECORD_PAGES:
            chapters.append(Chapter(path.stem, path, entry.get("title") or _notebook_title(path)))
    return chapters


_ALIAS = re.compile(r"^(?:ch(?:apter|ap)?[\s._-]*)?0*(\d+)([a-z]?)$")
_STEM_NUMBER = re.compile(r"^0*(\d+)([a-z]?)(?:_|$)")


def _stem_number(stem: str) -> tuple[int, str] | None:
    """``(1, "a")`` for ``01a_gradient_leakage``, ``(4, "")`` for ``04_model_reconstruction``, ``None`` for
    a stem that does not start with a chapter number."""
    m = _STEM_NUMBER.match(stem.lower())
    return (int(m.group(1)), m.group(2)) if m else None


def chapter_aliases(stem: str) -> list[str]:
    """The short names that :func:`resolve_chapters` takes for the notebook ``stem``: for
    ``03c_raifle_oltr`` ``["03c", "3c", "ch3c", "ch03c"]``, for ``04_model_reconstruction`` ``["04", "4",
    "ch4", "ch04"]`` (matching ignores case, and ``chapter``/``chap`` may stand for ``ch``, with an
    optional ``-``, ``_``, ``.`` or space after it). Empty for a stem without a chapter number."""
    number = _stem_number(stem)
    if number is None:
        return []
    n, letter = number
    padded, short = f"{n:02d}{letter}", f"{n}{letter}"
    return list(dict.fromkeys([padded, short, f"ch{short}", f"ch{padded}"]))


def _alias_key(name: str) -> tuple[int, str] | None:
    m = _ALIAS.match(name.strip().lower())
    return (int(m.group(1)), m.group(2)) if m else None


def resolve_chapters(name: str, chapters: list[Chapter]) -> list[Chapter]:
    """The chapters that ``name`` names: ``all``; a notebook stem (``02_pac_identifiability``, also as a
    path: ``chapters/02_pac_identifiability.ipynb``); a chapter number with its letter, padded or not, with
    or without ``ch`` (``1a``, ``01a``, ``ch3c``, ``4``, ``04``: see :func:`chapter_aliases`); or a
    unique prefix of a stem (``03a_rai``). A number without its letter where the chapter has several
    (``1`` for 01a, 01b, 01c and 01d) is ambiguous.

    Except: where one chapter of that number has no letter, the bare number names it (``6`` is 06_flower,
    beside 06b_flower_secagg).

    Raises ``ValueError`` when ``name`` matches no chapter or several. The first message proposes what
    was probably meant (for a chapter number the book lacks, ``3c``, the chapters of that number; else the
    ``difflib.get_close_matches`` of ``name`` among the stems, their aliases and their words, ``raifle``)
    and lists every valid name; the second names the chapters that match."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"chapter must be a non-empty name, got {name!r}")
    text = name.strip()
    if text.lower() == "all":
        return list(chapters)
    if text.endswith(".ipynb") or "/" in text:
        text = Path(text).name.removesuffix(".ipynb")
    exact = [c for c in chapters if c.stem == text or c.stem.lower() == text.lower()]
    if exact:
        return exact[:1]
    key = _alias_key(text)
    if key is not None:
        n, letter = key
        hits = [c for c in chapters if (num := _stem_number(c.stem)) is not None and num[0] == n
                and (num[1] == letter or not letter)]
        if len(hits) > 1 and not letter:   # "6" is 06_flower beside 06b_flower_secagg: the chapter without a letter
            hits = [c for c in hits if _stem_number(c.stem)[1] == ""] or hits
        if len(hits) == 1:
            return hits
        if len(hits) > 1:
            raise ValueError(f"chapter {name!r} is ambiguous ({', '.join(c.stem for c in hits)}): add the "
                             f"letter, e.g. {', '.join(chapter_aliases(c.stem)[1] for c in hits)}")
    hits = [c for c in chapters if c.stem.lower().startswith(text.lower())]
    if len(hits) == 1:
        return hits
    if hits:
        raise ValueError(f"chapter {name!r} is ambiguous ({', '.join(c.stem for c in hits)}); give more of the name")
    if key is not None:     # a chapter number the book does not have (3c, ch9): the chapters of that number
        targets = [c.stem for c in chapters if (num := _stem_number(c.stem)) is not None and num[0] == key[0]]
    else:                   # a misspelt stem or word of one (raifel, flwoer, matirx)
        names: dict[str, list[str]] = {"all": ["all"], MATRIX: [MATRIX]}   # a name -> the stems it stands for
        for c in chapters:
            words = c.stem.lower().split("_")
            rest = words[1:] if _stem_number(c.stem) else words
            for n in [c.stem.lower(), *chapter_aliases(c.stem), "_".join(rest), *(w for w in rest if len(w) > 3)]:
                names.setdefault(n, []).append(c.stem)
        close = difflib.get_close_matches(text.lower(), list(names), n=4, cutoff=0.6)
        targets = list(dict.fromkeys(s for c in close for s in names[c]))
    guess = f"; did you mean {' or '.join(targets)}?" if targets else "."
    valid = ", ".join(f"{c.stem} ({chapter_aliases(c.stem)[1]})" if chapter_aliases(c.stem) else c.stem
                      for c in chapters)
    raise ValueError(f"chapter {name!r} matches no notebook of _toc.yml{guess} Valid names: {valid}, 'all' "
                     f"(every chapter) or '{MATRIX}' (the attack x defense matrix)")


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


_NON_FINITE = re.compile(r"^[-+]?\(?\s*[-+]?(nan|inf|infinity)\s*\)?$", re.I)


def _is_non_finite(text: str) -> bool:
    """Whether a glued ``text/plain`` is a NaN or an infinity: a float (``nan``, ``-inf``), a numpy
    scalar (``np.float64(nan)``) or a string that reads as one (``'nan'``, what ``f"{x:.3f}"`` gives for
    a NaN)."""
    text = text.strip()
    m = _NP_SCALAR.match(text)
    if m:
        text = m.group(1) + m.group(2)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].strip()
    return bool(_NON_FINITE.match(text))


def non_finite_glues(nb) -> list[tuple[str, int]]:
    """``[(name, code-cell index)]`` of every value glued (as in :func:`collect_glued`) as a NaN or an
    infinity, in the order glued. A seed that glues one is not clean: a NaN is not a result."""
    hits: list[tuple[str, int]] = []
    code_cells = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    for index, cell in enumerate(code_cells):
        for out in cell.get("outputs", []):
            meta = (out.get("metadata") or {}).get("scrapbook") or {}
            name = meta.get("name")
            prefix = meta.get("mime_prefix") or ""
            data = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v
                    for k, v in (out.get("data") or {}).items()}
            if not name or name.endswith(DERIVED_SUFFIXES) or "text/plain" not in data:
                continue
            text = data["text/plain"]
            if _is_non_finite("".join(text) if isinstance(text, list) else text):
                hits.append((name, index))
    return hits


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


class _StallGuard:
    """What :class:`GuardedClient` knows of the cell in flight: the execute request whose reply has not
    come (``pending``), when the last message of any kind came, the probe sent to the kernel, and when the
    kernel was seen done with the cell (``done_at``)."""

    def __init__(self, probe_after: float, grace: float):
        self.probe_after, self.grace = probe_after, grace
        self.pending: str | None = None
        self.last_seen = time.monotonic()
        self.done_at: float | None = None
        self.probe: tuple[str, str] | None = None        # (probe msg_id, the pending request it was sent after)
        self.sending_probe = False
        self.stall: str | None = None

    def sent(self, msg: dict) -> None:
        if msg["header"]["msg_type"] == "execute_request" and not self.sending_probe:
            self.pending = msg["header"]["msg_id"]
            self.done_at, self.last_seen = None, time.monotonic()

    def seen(self, channel: str, msg: dict) -> None:
        self.last_seen = time.monotonic()
        parent = (msg.get("parent_header") or {}).get("msg_id")
        if self.pending is None or parent is None:
            return
        is_probe = self.probe is not None and parent == self.probe[0] and self.probe[1] == self.pending
        if channel == "shell":
            if parent == self.pending:
                self.pending = self.done_at = None
            elif is_probe:       # the kernel answered a request sent after the cell's: it is done with the cell
                self.done_at = self.done_at or time.monotonic()
        elif (msg.get("msg_type") == "status" and msg["content"].get("execution_state") == "idle"
              and (parent == self.pending or is_probe)):
            self.done_at = self.done_at or time.monotonic()

    def stalled(self, send_probe) -> bool:
        """Called while no reply comes: ``True`` once the kernel is known to be done with the cell for
        longer than ``grace`` s without its reply; sends a probe after ``probe_after`` s of silence."""
        if self.stall is not None:
            return True
        if self.pending is None:
            return False
        now = time.monotonic()
        if self.done_at is not None and now - self.done_at > self.grace:
            self.stall = (f"the kernel finished the cell and went idle, but the cell's reply had not come "
                          f"{self.grace:.0f} s later (the seed was stopped instead of waiting for the cell's time limit)")
            return True
        if (self.probe is None or self.probe[1] != self.pending) and now - self.last_seen > self.probe_after:
            self.sending_probe = True
            try:
                self.probe = (send_probe(), self.pending)
            finally:
                self.sending_probe = False
        return False


def _client_class():
    """:class:`GuardedClient`, built on first use (nbclient is imported only when a notebook runs)."""
    global _GUARDED
    if _GUARDED is not None:
        return _GUARDED
    from queue import Empty

    import zmq.asyncio
    from nbclient import NotebookClient

    class _GuardedClient(NotebookClient):
        """nbclient's :class:`NotebookClient` that cannot wait for ever on a kernel that is idle.

        The cause of the hang seen in ``reproduce`` (kernel idle, nbclient in ``run_notebook``, and the
        cell taking exactly its time limit to "finish": 1200 s a cell at paper scale) is a lost wake-up of
        the shell socket. nbclient mimics an Output widget by sending a ``comm_msg`` on the shell channel
        for every output the widget captures (chapters 1c and 5 have one); jupyter_client sends it through
        a *blocking shadow* of the asyncio socket, which bypasses pyzmq's bookkeeping of the socket's
        edge-triggered file descriptor. When the cell's reply arrives just before such a send, the send
        consumes the descriptor's wake-up and the asyncio poll waiting for the reply sleeps until its
        timeout; the reply sits unread in the socket. Measured on a notebook whose cells each print into
        an Output widget: 5 % of the cells took their full time limit with nbclient alone, none here.

        Three guards: (1) messages to the shell channel are sent through the asyncio socket itself, so
        pyzmq re-checks the socket after each send (the fix); (2) no channel is polled for more than
        :data:`POLL_SLICE` s at a time, so any other lost wake-up costs at most that; (3) a stall guard
        (:class:`_StallGuard`): after :data:`PROBE_AFTER` s without a message during a cell it sends the
        kernel a silent empty execute request, which the kernel answers only after the cell; once the
        kernel is seen done with the cell (that answer, or its ``idle`` status) and the cell's reply has not
        come within :data:`STALL_GRACE` s, the cell fails (``stall`` says why; :func:`run_notebook`
        reports ``KernelStallError`` and the seed is run once more)."""

        poll_slice = POLL_SLICE
        probe_after = PROBE_AFTER
        stall_grace = STALL_GRACE

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.guard = _StallGuard(self.probe_after, self.stall_grace)

        @property
        def stall(self) -> str | None:
            return self.guard.stall

        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            self._guard_channels(kc)
            return kc

        async def _receive(self, channel: str, get_msg, timeout: float) -> dict:
            """One poll of ``channel`` (``"shell"`` or ``"iopub"``) for at most ``timeout`` s (raises
            ``Empty``); a test overrides it to lose a message."""
            return await get_msg(timeout=timeout)

        def _guard_channels(self, kc) -> None:
            guard = self.guard
            shell = kc.shell_channel
            plain_send = shell.send

            def send(msg):
                guard.sent(msg)
                sock = shell.socket
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    sock = None
                if not isinstance(sock, zmq.asyncio.Socket):
                    return plain_send(msg)
                frames = kc.session.serialize(msg)
                frames.extend(msg.get("buffers") or [])
                # through the asyncio socket, not a blocking shadow of it: pyzmq then re-checks the
                # socket's events after the send and wakes a poll waiting for a reply that came meanwhile
                sent = sock.send_multipart(frames)
                sent.add_done_callback(lambda f: f.cancelled() or f.exception() is None
                                       or self.log.error("sending to the kernel failed: %s", f.exception()))
                return None

            shell.send = send

            def sliced(name, channel):
                get_msg = channel.get_msg

                async def get(timeout=None):
                    deadline = None if timeout is None else time.monotonic() + timeout
                    while True:
                        left = None if deadline is None else max(0.0, deadline - time.monotonic())
                        try:
                            msg = await self._receive(name, get_msg, self.poll_slice if left is None
                                                      else min(self.poll_slice, left))
                        except Empty:
                            if name == "shell" and guard.stalled(
                                    lambda: kc.execute("", silent=True, store_history=False)):
                                raise   # nbclient takes it for its time limit: the cell fails
                            if left is not None and left <= self.poll_slice:
                                raise
                            continue
                        guard.seen(name, msg)
                        return msg

                channel.get_msg = get

            sliced("shell", shell)
            sliced("iopub", kc.iopub_channel)

    _GuardedClient.__name__ = _GuardedClient.__qualname__ = "GuardedClient"
    _GUARDED = _GuardedClient
    return _GUARDED


_GUARDED = None   # GuardedClient, once _client_class built it


def __getattr__(name: str):
    """``fedlab.reproduce.GuardedClient`` builds the class on first access (it needs nbclient)."""
    if name == "GuardedClient":
        return _client_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_KERNEL_PIDS: set[int] = set()   # kernels this process runs now (a signal in a worker stops them)


def kernel_pythonpath(notebook: str | Path, environ: dict | None = None) -> dict:
    """``{"PYTHONPATH": ...}`` for the kernel that runs ``notebook``: the book's root first when it holds a
    ``fedlab`` package, so that the kernel imports the ``fedlab`` of the checkout whose commit the record
    names. Without it a kernel (its working directory is ``chapters/``) imports whatever ``fedlab`` the
    environment has installed: with an editable install of another checkout, a record would name one commit
    and hold another tree's numbers. ``{}`` when the notebook is in no book or the book has no ``fedlab``."""
    try:
        root = find_root(Path(notebook).resolve().parent)
    except ValueError:
        return {}
    if not (root / "fedlab" / "__init__.py").is_file():
        return {}
    old = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    parts = [str(root)] + [p for p in old.split(os.pathsep) if p and Path(p).resolve() != root]
    return {"PYTHONPATH": os.pathsep.join(parts)}


def run_notebook(path: str | Path, *, seed: int, scale: str, timeout: int | None = DEFAULT_CELL_TIMEOUT, progress=None,
                 kernel_name: str | None = None) -> SeedRun:
    """Execute the notebook at ``path`` once, headless, with ``FEDLAB_SEED=seed`` and
    ``FEDLAB_SCALE=scale`` in the kernel's environment (the working directory is the notebook's
    folder), through :class:`GuardedClient` (no wait for ever on an idle kernel). ``progress``
    (optional) is called with no argument after each code cell. Never raises for a failing cell: the
    failure is returned in :attr:`SeedRun.failure`; a seed that glues a NaN or an infinity fails too
    (``NonFiniteValue``). The notebook runs in a helper thread, so that a signal reaching this thread
    (:class:`RunInterrupted`, :class:`KeyboardInterrupt`) stops the kernel and is raised here. Raises
    ``ValueError`` for a bad ``scale``, ``seed`` or ``timeout``."""
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from .config import SCALES

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    timeout = check_timeout(timeout)
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
    env.update(kernel_pythonpath(path))
    run = SeedRun(seed=int(seed))
    t0 = time.perf_counter()
    timeout = CELL_TIMEOUT[scale] if timeout is None else timeout
    client = _client_class()(nb, timeout=timeout, kernel_name=kernel_name or "python3",
                             resources={"metadata": {"path": str(path.parent)}}, iopub_timeout=IOPUB_TIMEOUT,
                             raise_on_iopub_timeout=True, on_cell_execute=on_start, on_cell_executed=on_done)
    outcome: dict = {}

    def execute():   # in its own thread and event loop: nbclient then leaves this process's signals alone
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(client.async_execute(env=env, stderr=subprocess.DEVNULL))
        except BaseException as exc:  # noqa: BLE001  (handed to the calling thread)
            outcome["error"] = exc
        finally:
            _close_loop(loop)

    thread = threading.Thread(target=execute, name=f"notebook {path.stem} seed {seed}", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
            pid = _kernel_pid(client)
            if pid:
                _KERNEL_PIDS.add(pid)
    except BaseException:       # RunInterrupted or KeyboardInterrupt: stop the kernel, then pass it on
        _kill_kernel(client)
        thread.join(15)
        raise
    finally:
        _KERNEL_PIDS.discard(_kernel_pid(client) or -1)
    exc = outcome.get("error")
    if isinstance(exc, (CellExecutionError, CellTimeoutError, DeadKernelError)):
        _record_failure(run, exc, current.get("cell"), code_index)
    elif exc is not None:  # the kernel did not start, lost its connection, ...: still a failed seed
        run.failure = {"seed": run.seed, "cell": None, "line": "", "error": f"{type(exc).__name__}: {exc}"}
    if exc is not None and client.stall is not None:
        run.failure["error"] = f"KernelStallError: {client.stall}"
    run.seconds = time.perf_counter() - t0
    run.values = collect_glued(nb)
    bad = non_finite_glues(nb)
    if run.failure is None and bad:
        names = ", ".join(repr(n) for n, _ in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        first = bad[0][0]
        run.failure = {"seed": run.seed, "cell": bad[0][1], "line": f"glue of {first!r}",
                       "error": f"NonFiniteValue: glued a NaN or an infinity for {names} ({run.values.get(first)!r})"}
    return run


def _kernel_pid(client) -> int | None:
    provisioner = getattr(getattr(client, "km", None), "provisioner", None)
    return getattr(provisioner, "pid", None)


def _kill_kernel(client) -> None:
    """Kill the kernel of ``client`` (nbclient then sees it dead within a second and cleans up)."""
    pid = _kernel_pid(client)
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _close_loop(loop) -> None:
    """Cancel what is left on ``loop`` (nbclient's pollers of a failed cell) and close it."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=10))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # noqa: BLE001  (closing after a failure: nothing left to save)
        pass
    finally:
        asyncio.set_event_loop(None)
        loop.close()


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


_WORKER_BUSY = False   # in a worker process: a notebook runs now


def _worker_signal(signum, frame):
    """In a worker process: SIGTERM (from the command, when interrupted) or SIGINT stops the notebook
    that runs (its kernel is stopped and the interrupt goes back to the command); between notebooks the
    worker just exits."""
    if _WORKER_BUSY:
        raise RunInterrupted(signum)
    for pid in list(_KERNEL_PIDS):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(128 + signum)


def _init_worker(queue, parent: int) -> None:
    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = queue
    _exit_with_parent(parent)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _worker_signal)


def _worker(args):  # top level so that a process pool can pickle it
    path, seed, scale, timeout, slot, progress = args
    if progress is None and _PROGRESS_QUEUE is not None:
        progress = lambda: _PROGRESS_QUEUE.put(1)  # noqa: E731
    global _WORKER_BUSY
    _WORKER_BUSY = True
    try:
        time.sleep(2.0 * slot)   # stagger the kernels' start when several jobs begin together
        run = run_notebook(path, seed=seed, scale=scale, timeout=timeout, progress=progress)
        if run.failure and run.failure["error"].split(":")[0] in RETRY_ERRORS:
            first = run
            run = run_notebook(path, seed=seed, scale=scale, timeout=timeout, progress=None)
            run.retried = first.failure
        return run
    except RunInterrupted as exc:
        if _PROGRESS_QUEUE is not None:   # a worker process: hand the interrupt back to the command, then end
            threading.Timer(2.0, os._exit, (128 + exc.signum,)).start()
        raise
    finally:
        _WORKER_BUSY = False


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


def _torch_version() -> str:
    """torch's version from its installed metadata (the same string as ``torch.__version__``), without
    importing torch (about 3 s of CPU in the command line); importing it where the metadata is missing."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        import torch

        return torch.__version__


def build_record(chapter: Chapter, scale: str, runs: list[SeedRun], *, root: Path, command: str) -> dict:
    """The record of ``runs`` (one per seed, in seed order) in the format of the module docstring."""
    names: list[str] = []
    for r in runs:
        names += [n for n in r.values if n not in names]
    values = {n: [r.values.get(n) for r in runs] for n in names}
    clean = [r.failure is None for r in runs]
    return {"chapter": chapter.stem, "title": chapter.title, "scale": scale, "seeds": [r.seed for r in runs],
            "values": values, "summary": summarize(values, clean), "seconds": [round(r.seconds, 1) for r in runs],
            "failures": [r.failure for r in runs if r.failure],
            "retries": [r.retried for r in runs if r.retried], "machine": _machine(),
            "python": platform.python_version(), "torch": _torch_version(), "commit": _commit(root),
            "date": _dt.date.today().isoformat(), "command": command}


def _refuse_link(path: Path, what: str = "record") -> None:
    if path.is_symlink():
        raise ValueError(f"the {what} path {path} is a symbolic link (to {os.readlink(path)}): records are never "
                         f"written through a link (that would overwrite its target); remove the link or choose "
                         f"another --out")
    if path.exists() and not path.is_file():
        raise ValueError(f"the {what} path {path} exists and is not a regular file")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that no reader ever sees part of it: into a temporary file in the same
    folder, flushed and ``fsync``-ed, then renamed over ``path`` with :func:`os.replace` (atomic on POSIX),
    and the folder ``fsync``-ed. If anything fails (a full disk, a file-size limit, a signal) the temporary
    file is removed and the file at ``path`` is left exactly as it was. Two writers at once: the last
    rename wins, each file whole.

    A symbolic link at ``path`` is refused (``ValueError``) rather than replaced: a link in the records
    folder was put there on purpose, and neither writing through it (which overwrote its target) nor
    silently turning it into a regular file is what its owner asked for. Raises ``OSError`` naming
    ``path`` when the write fails."""
    path = Path(path)
    _refuse_link(path)
    try:
        return atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as exc:
        raise OSError(exc.errno, f"could not write {path} ({exc.strerror or exc}); the file there was left "
                                 f"as it was") from exc


def record_paths(out: str | Path, stem: str, scale: str) -> tuple[Path, Path]:
    """``(<out>/<stem>.<scale>.json, <out>/<stem>.<scale>.failed.json)``."""
    out = Path(out)
    return out / f"{stem}.{scale}.json", out / f"{stem}.{scale}.failed.json"


def check_out(out: str | Path, stems: list[str], scale: str) -> Path:
    """Check, before any seed runs, that the records of ``stems`` at ``scale`` can be written into
    ``out``: the folder exists (it is created if not) and a file can be created in it, and no record path
    there is a symbolic link or a folder. Returns ``out`` as a path. Raises ``ValueError`` naming
    ``--out`` otherwise."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
    if not out.is_dir():
        raise ValueError(f"--out {out} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"--out {out} is not writable ({exc.strerror or exc})") from None
    for stem in stems:
        for path in record_paths(out, stem, scale):
            _refuse_link(path)
    return out


def check_seeds(seeds) -> list[int]:
    """``seeds`` as a list, after checking that it holds 1 to :data:`MAX_SEEDS` distinct integers in
    ``[0, 2**32)``. Raises ``ValueError`` naming ``seeds`` otherwise."""
    seeds = list(seeds)
    if not seeds or len(seeds) > MAX_SEEDS:
        raise ValueError(f"seeds must hold 1 to {MAX_SEEDS} seeds, got {len(seeds)}")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < SEED_LIMIT]
    if bad:
        raise ValueError(f"seeds must be integers in [0, 2**32), got {bad[:5]}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds[:20]}")
    return seeds


def format_seeds(seeds) -> str:
    """``seeds`` in the form ``--seeds`` takes, sorted, runs of consecutive seeds as ranges:
    ``format_seeds([7, 0, 1, 2]) == "0-2,7"``, ``format_seeds([3]) == "3"``."""
    parts: list[str] = []
    ordered = sorted(set(seeds))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if j == i else f"{ordered[i]}-{ordered[j]}" if j > i + 1
                     else f"{ordered[i]},{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _stored_seeds(path: Path) -> tuple[list[int], dict] | None:
    """``(seeds, record)`` of the record stored at ``path``; ``None`` when there is none, or the file is not
    a readable record (not JSON, no list of integer ``seeds``): such a file holds no seed to lose."""
    if not path.is_file() or path.is_symlink():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    seeds = stored.get("seeds") if isinstance(stored, dict) else None
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        return None
    return seeds, stored


def seeds_lost(path: str | Path, seeds) -> str | None:
    """Why a record of ``seeds`` may not replace the record stored at ``path``, or ``None`` when it may
    (none is stored, or ``seeds`` holds every stored seed). The reason names the stored seeds, their commit
    and date, and the seeds that would be lost."""
    found = _stored_seeds(Path(path))
    if found is None:
        return None
    stored, record = found
    lost = sorted(set(stored) - set(seeds))
    if not lost:
        return None
    made = ", ".join(f"{k} {record[k]}" if k == "commit" else str(record[k]) for k in ("commit", "date")
                     if record.get(k))

    def plural(xs):
        return f"seed{'s' if len(set(xs)) > 1 else ''} {format_seeds(xs)}"

    return (f"{path} holds {plural(stored)}{f' ({made})' if made else ''}; a record of {plural(seeds)} would "
            f"replace it and lose {plural(lost)}")


def check_stored_seeds(out: str | Path, stems: list[str], scale: str, seeds, *, force: bool = False) -> None:
    """Before any seed runs: refuse a run whose record would replace a stored record with fewer seeds. For
    each of ``stems``, the record stored at ``<out>/<stem>.<scale>.json`` may only be replaced by a run
    whose ``seeds`` include every stored seed (more seeds, or the same seeds again, are fine), unless
    ``force``. Stored seeds are never merged with new ones: a record holds, at every seed, the values of one
    commit, one machine and one command, and a mix would state numbers no single run gave (the matrix's
    ``--rows`` replaces whole rows at every seed and names their commit in ``reruns``: :func:`merge_matrix_rows`).

    Raises ``ValueError`` naming, for each such record, the stored seeds and the seeds that would be lost,
    and the ways on: ``--seeds`` with every stored seed and the new ones (all run again), ``--out`` to write
    elsewhere, ``--force`` to replace it."""
    if force:
        return
    seeds = list(seeds)
    reasons, union = [], set(seeds)
    for stem in stems:
        path, _ = record_paths(out, stem, scale)
        reason = seeds_lost(path, seeds)
        if reason:
            reasons.append(reason)
            union |= set(_stored_seeds(path)[0])
    if reasons:
        raise ValueError("; ".join(reasons) + f". Nothing was run. To keep every stored seed, run them all "
                         f"(a record holds one commit's values, so stored seeds are run again, not merged): "
                         f"--seeds {format_seeds(union)}; to keep the stored record and write this run's "
                         f"elsewhere: --out DIR; to replace it with this run's seeds only: --force")


def write_record(record: dict, out: str | Path, *, force: bool = False) -> Path:
    """Write ``record`` to ``out/<chapter>.<scale>.json`` (atomically: see :func:`atomic_write_text`)
    and return the path. A record with failing seeds never replaces a stored record without failures
    (unless ``force``): it goes to ``<chapter>.<scale>.failed.json`` beside it instead. A record never
    replaces a stored record that holds a seed it lacks (unless ``force``; see :func:`check_stored_seeds`,
    which ``reproduce`` calls before any seed runs). Raises ``ValueError`` for a record that lacks a field
    or holds a NaN or an infinity (JSON has neither), for a record path that is a symbolic link, or for a
    record that would lose stored seeds (nothing is written); ``OSError`` if the write fails (the stored
    record is then left as it was)."""
    missing = [k for k in RECORD_FIELDS if k not in record]
    if missing:
        raise ValueError(f"record lacks the fields {missing}")
    text = json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path, failed = record_paths(out, record["chapter"], record["scale"])
    if record["failures"] and path.is_file() and not path.is_symlink() and not force:
        try:
            stored_clean = not json.loads(path.read_text()).get("failures")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
            stored_clean = False
        if stored_clean:
            return atomic_write_text(failed, text)
    lost = None if force else seeds_lost(path, record["seeds"])
    if lost:
        raise ValueError(f"{lost}: nothing was written (--force, force=True, replaces it; a run of every stored "
                         f"seed keeps them)")
    return atomic_write_text(path, text)


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM reached ``reproduce``: the whole run stops (a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` records it as a failed seed)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise_interrupted(signum, frame):
    raise RunInterrupted(signum)


@contextlib.contextmanager
def _stop_on_signals():
    """While inside: SIGINT and SIGTERM raise :class:`RunInterrupted` in the main thread (elsewhere
    nothing changes: only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stop_workers(pool, timeout: float = 20.0) -> None:
    """After an interrupt: ask every worker process of ``pool`` (a pool or a list of pools) to stop (SIGTERM:
    each stops its kernel), wait up to ``timeout`` s, then kill what is left, and shut the pool down."""
    import multiprocessing as mp

    workers = [p for p in mp.active_children()]
    for p in workers:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    for one in pool if isinstance(pool, list) else [pool]:
        one.shutdown(wait=False, cancel_futures=True)


def check_timeout(timeout) -> int | None:
    """``timeout`` (seconds a cell may run; ``None``: the default of the scale) after checking that it is
    a positive integer. Raises ``ValueError`` naming ``timeout`` otherwise (0 or a negative number does not
    mean "no limit": a paper-scale run must never wait for ever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM back (main thread only) while a record is renamed into place, so that the
    message after an interrupt says truly whether the record was written."""
    held = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    if held:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _run_seeds(chapter: Chapter, scale: str, seeds: list[int], jobs: int, timeout, bar) -> list[SeedRun]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if jobs == 1:
        return [_worker((chapter.path, s, scale, timeout, 0, lambda: bar.update(1))) for s in seeds]
    ctx = mp.get_context("spawn")
    # a plain queue handed to the workers at start-up (no manager process that could outlive us)
    queue = ctx.Queue()
    pump = threading.Thread(target=lambda: [bar.update(n) for n in iter(queue.get, None)], daemon=True)
    pump.start()
    args = [(chapter.path, s, scale, timeout, i if i < jobs else 0, None) for i, s in enumerate(seeds)]
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(seeds)), mp_context=ctx, initializer=_init_worker,
                               initargs=(queue, os.getpid()))
    runs = []
    try:
        futures = [pool.submit(_worker, a) for a in args]
        for seed, fut in zip(seeds, futures):
            try:
                runs.append(fut.result())
            except Exception as exc:  # a worker process died: a failed seed, not a crash
                runs.append(SeedRun(seed=seed, failure={"seed": seed, "cell": None, "line": "",
                                                        "error": f"{type(exc).__name__}: {exc}"}))
    except BaseException:   # RunInterrupted here or in a worker: stop every worker (and so its kernel)
        _stop_workers(pool)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        queue.put(None)
        pump.join(5)
    return runs


@dataclass(frozen=True, eq=False)
class Console:
    """What :func:`reproduce` prints while it runs, and where: ``show_progress`` (a progress bar of the code cells;
    the command line's ``--no-progress`` and ``FEDLAB_PROGRESS=0`` turn it off) and ``stderr`` (the stream of the
    bar and of the messages: failures, retries, the records written; ``None``: ``sys.stderr`` at the time of the
    call). Compares by identity (it holds a stream). Raises ``ValueError`` naming the field for a
    ``show_progress`` that is not a bool or a ``stderr`` without ``write``."""

    show_progress: bool = True
    stderr: object = None

    def __post_init__(self):
        if not isinstance(self.show_progress, bool):
            raise ValueError(f"Console.show_progress must be True or False, got {self.show_progress!r}")
        if self.stderr is not None and not callable(getattr(self.stderr, "write", None)):
            raise ValueError(f"Console.stderr must be a text stream (with write) or None, got {self.stderr!r}")


def reproduce(chapters: list[Chapter], *, scale: str, seeds: list[int], jobs: int = 1, out: str | Path,
              root: Path, timeout: int | None = DEFAULT_CELL_TIMEOUT, console: Console = Console(),
              command: str = "", force: bool = False) -> tuple[list[Path], list[dict]]:
    """Run every chapter at every seed (``jobs`` seeds at a time, each in its own process) and write
    one record per chapter. Returns the written paths and the failures (empty when all ran clean).
    ``console`` (a :class:`Console`): the progress bar and the stream the messages go to.

    ``out`` is checked before the first seed runs (:func:`check_out`). SIGINT or SIGTERM stops the whole
    run: the kernels are stopped, the record of the chapter being run is not written (a stored one is
    left as it was, and stderr says so), and :class:`RunInterrupted` is raised. Raises ``ValueError``
    for bad ``jobs``, ``seeds``, ``timeout`` or ``out``, and, before any seed runs, when a stored record
    holds a seed that ``seeds`` leaves out (:func:`check_stored_seeds`; ``force`` replaces it anyway)."""
    from tqdm.auto import tqdm

    if not isinstance(console, Console):
        raise ValueError(f"console must be a fedlab.reproduce.Console, got {type(console).__name__}: {console!r}")
    stderr, show_progress = console.stderr or sys.stderr, console.show_progress
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    seeds = check_seeds(seeds)
    timeout = check_timeout(timeout)
    out = check_out(out, [c.stem for c in chapters], scale)
    check_stored_seeds(out, [c.stem for c in chapters], scale, seeds, force=force)
    paths, failures = [], []
    with _stop_on_signals():
        for chapter in chapters:
            try:
                total = len(seeds) * _count_code_cells(chapter.path)
                bar = tqdm(total=total, desc=f"{chapter.stem} [{scale}, seeds {','.join(map(str, seeds))}]",
                           unit="cell", disable=not show_progress, file=stderr)
                runs = _run_seeds(chapter, scale, seeds, jobs, timeout, bar)
                bar.close()
                record = build_record(chapter, scale, runs, root=root, command=command)
                with _signals_held():
                    paths.append(write_record(record, out, force=force))
            except RunInterrupted as exc:
                stored, _ = record_paths(out, chapter.stem, scale)
                if len(paths) > chapters.index(chapter):     # the signal came as its record was renamed
                    kept = f"its record was written to {paths[-1]} before the signal was handled"
                elif stored.is_file():
                    kept = f"no record was written for it: the stored record {stored} is left as it was"
                else:
                    kept = f"no record was written for it (none is stored at {stored})"
                done = (f"; records written before: {', '.join(map(str, paths[:chapters.index(chapter)]))}"
                        if chapters.index(chapter) else "")
                print(f"\ninterrupted by {exc.name}: the run stopped during {chapter.stem}; {kept}{done}",
                      file=stderr, flush=True)
                raise
            for f in record["retries"]:
                print(f"note: {chapter.stem} seed {f['seed']} was run a second time after {f['error']}", file=stderr)
            for f in record["failures"]:
                failures.append(dict(f, chapter=chapter.stem))
                print(f"FAILED {chapter.stem} seed {f['seed']}, code cell {f['cell']} ({f['line']}): {f['error']}",
                      file=stderr)
            secs = ", ".join(f"{s:.0f}" for s in record["seconds"])
            print(f"{chapter.stem}: {len(seeds) - len(record['failures'])}/{len(seeds)} seeds clean, seconds per "
                  f"seed [{secs}] -> {paths[-1]}", file=stderr)
    return paths, failures


# --------------------------------------------------------------------------------------------------
# the attack x defense matrix (not a notebook: fedlab.experiments.matrix computes its cells)


def _matrix_seed(scale: str, seed: int, rows=None, stderr=None) -> tuple[SeedRun, dict]:
    """One seed of the matrix (in this process or a worker of :func:`reproduce_matrix`): ``FEDLAB_SCALE``
    set to ``scale``, every RNG seeded with ``seed``, one torch thread. Returns the :class:`SeedRun` (a row
    that raises is its failure) and ``{row: seconds}``."""
    import torch

    from .config import seed_everything
    from .experiments import matrix as mx

    stderr = stderr or sys.stderr
    os.environ["FEDLAB_SCALE"] = scale
    torch.set_num_threads(1)
    seed_everything(seed)
    t0 = time.perf_counter()
    run, done, row_secs = SeedRun(seed=seed), [], {}

    def progress(row, secs):
        done.append(row)
        print(f"matrix seed {seed}: {row} in {secs:.1f} s", file=stderr, flush=True)

    try:
        run.values, row_secs = mx.run_matrix(seed, progress=progress, **({} if rows is None else {"rows": rows}))
    except Exception as exc:   # a failing seed is a result: record it and go on
        keys = [a.key for a in mx.ATTACKS] if rows is None else list(rows)
        failed = keys[len(done)] if len(done) < len(keys) else None
        run.failure = {"seed": seed, "cell": failed, "line": "", "error": f"{type(exc).__name__}: {exc}"}
    bad = [k for k, v in run.values.items() if isinstance(v, float) and not math.isfinite(v)]
    for k in bad:   # JSON has no NaN: kept as text, and the seed is not clean
        run.values[k] = str(run.values[k])
    if bad and run.failure is None:
        run.failure = {"seed": seed, "cell": bad[0].split("|")[0], "line": "",
                       "error": f"NonFiniteValue: a NaN or an infinity in {', '.join(bad[:5])}"}
    run.seconds = time.perf_counter() - t0
    return run, row_secs


def reproduce_matrix(*, scale: str, seeds: list[int], out: str | Path, root: Path, command: str = "",
                     stderr=None, force: bool = False, jobs: int = 1,
                     rows: Sequence[str] | None = None, merge: bool = False) -> tuple[Path, list[dict]]:
    """Run :func:`fedlab.experiments.matrix.run_matrix` at every seed of ``seeds`` (``FEDLAB_SCALE`` set
    to ``scale``, every RNG seeded with the seed, one torch thread; ``jobs`` seeds at a time, each in a
    process of its own when ``jobs > 1``: the same values as one after the other, tested) and write the record
    ``<out>/matrix.<scale>.json`` with :func:`write_record`. A seed whose run raises is a failure
    (``{"seed", "cell": the attack row, "line": "", "error"}``), kept out of the summary. ``rows``: only
    these rows (a partial matrix, for tests and quick checks; default every row; refused, before any seed runs,
    when the stored record holds other rows, unless ``force``). ``merge=True`` (with ``rows``): re-run these rows
    of the stored record and keep its other rows (:func:`merge_matrix_rows`; the stored record must exist and
    hold exactly ``seeds`` at ``scale``, checked before any seed runs). Returns the
    written path and the failures. Raises ``ValueError`` for bad ``seeds``, ``scale`` or ``jobs``, and, before any
    seed runs, when the stored record holds a seed that ``seeds`` leaves out (:func:`check_stored_seeds`;
    ``force`` replaces it anyway). SIGINT or SIGTERM stops every worker; no record is written."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    import torch

    from .config import SCALES
    from .experiments import matrix as mx

    stderr = stderr or sys.stderr
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    seeds = check_seeds(seeds)
    if rows is not None:
        rows = _matrix_rows(rows)
    out = check_out(out, [MATRIX], scale)
    check_stored_seeds(out, [MATRIX], scale, seeds, force=force)
    stored = record_paths(out, MATRIX, scale)[0]
    base = _merge_base(stored, scale, seeds, rows) if merge else None
    if rows is not None and not force and not merge and stored.is_file():
        try:
            kept = {k.split("|")[0] for k in json.loads(stored.read_text()).get("values", {})}
        except (OSError, ValueError, AttributeError):
            kept = set()
        lost = sorted(kept - set(rows))
        if lost:
            raise ValueError(f"rows {rows} leave out rows {lost} of the stored record {stored}: a partial matrix would "
                             f"replace it; nothing was run (force=True replaces it, or choose another out)")
    old_scale, old_threads = os.environ.get("FEDLAB_SCALE"), torch.get_num_threads()
    results, pools = [], []
    try:
        interrupts = _stop_on_signals()
        interrupts.__enter__()
        if jobs == 1:
            results = [_matrix_seed(scale, seed, rows, stderr) for seed in seeds]
        else:
            # one single-worker pool per seed, at most `jobs` at a time: a worker that dies (os._exit, the OOM
            # killer) breaks only its own pool, so it fails its own seed and no other
            ctx, todo, running, by_seed = mp.get_context("spawn"), list(seeds), {}, {}
            while todo or running:
                while todo and len(running) < jobs:
                    seed = todo.pop(0)
                    pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
                    pools.append(pool)
                    running[pool.submit(_matrix_seed, scale, seed, rows)] = (seed, pool)
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    seed, pool = running.pop(fut)
                    try:
                        by_seed[seed] = fut.result()
                    except Exception as exc:  # its worker process died: a failed seed, not a crash
                        by_seed[seed] = (SeedRun(seed=seed, failure={"seed": seed, "cell": None, "line": "",
                                                                     "error": f"{type(exc).__name__}: {exc}"}), {})
                    pool.shutdown(wait=True)
                    pools.remove(pool)
            results = [by_seed[seed] for seed in seeds]
    except RunInterrupted as exc:
        if pools:
            _stop_workers(pools)
        stored, _ = record_paths(out, MATRIX, scale)
        kept = (f"the stored record {stored} is left as it was" if stored.is_file()
                else f"none is stored at {stored}")
        print(f"\ninterrupted by {exc.name}: the run stopped; no matrix record was written ({kept})",
              file=stderr, flush=True)
        raise
    finally:
        interrupts.__exit__(None, None, None)
        if old_scale is None:
            os.environ.pop("FEDLAB_SCALE", None)
        else:
            os.environ["FEDLAB_SCALE"] = old_scale
        torch.set_num_threads(old_threads)
    runs = [r for r, _ in results]
    row_seconds = {}
    for run, secs in results:
        for row, s in secs.items():
            row_seconds.setdefault(row, {})[run.seed] = round(s, 2)
    chapter = Chapter(MATRIX, root / "chapters" / f"{MATRIX_NOTEBOOK}.ipynb", "Chapter 7: The attack × defense matrix")
    record = build_record(chapter, scale, runs, root=root, command=command)
    record["matrix"] = mx.describe_matrix()
    record["row_seconds"] = {row: [by_seed.get(s) for s in seeds] for row, by_seed in row_seconds.items()}
    if base is not None:
        record = merge_matrix_rows(base, record, rows)
    path = write_record(record, out, force=force)     # atomic: an interrupt leaves the old record or the new
    failures = [dict(f, chapter=MATRIX) for f in record["failures"]]
    for f in failures:
        print(f"FAILED matrix seed {f['seed']}, row {f['cell']}: {f['error']}", file=stderr)
    secs = ", ".join(f"{s:.0f}" for s in record["seconds"])
    print(f"matrix: {len(seeds) - len(failures)}/{len(seeds)} seeds clean, seconds per seed [{secs}] -> {path}",
          file=stderr)
    return path, failures


def _matrix_rows(rows) -> list[str]:
    """``rows`` checked: a list of the matrix's row keys (or :class:`Attack` objects), at least one, each once.
    Returns the keys. Raises ``ValueError`` naming ``rows``."""
    from .experiments.matrix import rows as mx_rows

    if isinstance(rows, str):
        raise ValueError(f"rows must be a list of row keys, got the string {rows!r} (rows=[{rows!r}] for one row)")
    try:
        keys = [mx_rows._attack(r).key for r in rows]
    except ValueError as exc:
        raise ValueError(f"rows: {exc}") from None
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"rows must name at least one row, each once, got {keys!r}")
    return keys


def _merge_base(stored: Path, scale: str, seeds: list[int], rows) -> dict:
    """The stored matrix record that ``reproduce_matrix(merge=True)`` re-runs ``rows`` of, checked before any seed
    runs: it exists, is a matrix record at ``scale`` and holds exactly ``seeds``. Raises ``ValueError`` naming
    what is wrong."""
    if rows is None:
        raise ValueError("merge=True needs rows: the rows of the stored record to run again")
    if not stored.is_file():
        raise ValueError(f"rows {list(rows)}: no stored matrix record at {stored} to merge them into; run the whole "
                         f"matrix first")
    try:
        base = json.loads(stored.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"the stored matrix record {stored} cannot be read ({exc}); nothing was run") from None
    if base.get("chapter") != MATRIX or base.get("scale") != scale or "row_seconds" not in base:
        raise ValueError(f"{stored} is not a matrix record at scale {scale!r}; nothing was run")
    have = {k.split("|")[0] for k in base.get("values", {})}
    if set(rows) - have:
        raise ValueError(f"rows {sorted(set(rows) - have)} are not in the stored record {stored}: --rows re-runs rows "
                         f"it holds; nothing was run")
    if list(base.get("seeds", [])) != list(seeds):
        raise ValueError(f"seeds {list(seeds)}: the stored record {stored} holds seeds {base.get('seeds')}; a merged "
                         f"record needs every row at the same seeds (run --seeds {','.join(map(str, base['seeds']))})")
    return base


def merge_matrix_rows(stored: dict, part: dict, rows: Sequence[str]) -> dict:
    """The matrix record ``stored`` with its rows ``rows`` replaced by those of ``part`` (a partial matrix record
    of the same scale and seeds, :func:`reproduce_matrix` with ``rows``): their values (a row ``part`` has no
    value of, because its seed failed, is null there), row seconds and failures; the layout (``matrix``) is
    ``part``'s, the current code's; the summary is recomputed over the seeds that are clean in the merged record,
    and each seed's ``seconds`` is the stored one with the re-run rows' old seconds replaced by their new ones.
    A stored failure stays unless it belonged to a re-run row *and* the seed holds a value in every other row
    (a row that raised lost its seed's values of every row: that seed stays failed). ``commit``, ``date``,
    ``command`` and ``machine`` stay the stored record's (the other rows' provenance); ``reruns`` lists, for each
    merge, the rows and ``part``'s commit, date, command, machine, python, torch and retries (a later entry
    replaces the rows of an earlier one). Raises ``ValueError`` when the scales or seeds differ, ``rows`` is
    empty, or ``part`` holds a row outside ``rows``."""
    if part.get("scale") != stored.get("scale") or list(part.get("seeds", [])) != list(stored.get("seeds", [])):
        raise ValueError(f"part must hold the stored record's scale and seeds ({stored.get('scale')}, "
                         f"{stored.get('seeds')}), got ({part.get('scale')}, {part.get('seeds')})")
    rows = sorted(set(rows))
    if not rows:
        raise ValueError("rows must name at least one row of the matrix")
    extra = sorted({k.split("|")[0] for k in part.get("values", {})} - set(rows))
    if extra:
        raise ValueError(f"part holds rows {extra} outside rows {rows}")
    seeds = list(stored["seeds"])
    values = {k: v for k, v in stored["values"].items() if k.split("|")[0] not in rows}
    holes = {seeds[i] for v in values.values() for i, x in enumerate(v) if x is None}   # seeds the other rows lack
    values.update(part["values"])
    failures = ([f for f in stored.get("failures", []) if f.get("cell") not in rows or f.get("seed") in holes]
                + list(part.get("failures", [])))
    failed = {f["seed"] for f in failures}
    old_secs, new_secs = stored.get("row_seconds", {}), part.get("row_seconds", {})
    seconds = []
    for i, total in enumerate(stored["seconds"]):
        old = sum((old_secs.get(r) or [None] * len(seeds))[i] or 0.0 for r in rows)
        new = sum((new_secs.get(r) or [None] * len(seeds))[i] or 0.0 for r in rows)
        seconds.append(round(total - old + new, 1))
    out = dict(stored)
    out.update(values=values, summary=summarize(values, [s not in failed for s in seeds]), seconds=seconds,
               failures=failures, matrix=part.get("matrix", stored.get("matrix")),
               row_seconds={**{r: v for r, v in old_secs.items() if r not in rows},
                            **{r: new_secs[r] for r in rows if r in new_secs}},
               reruns=list(stored.get("reruns", [])) + [{"rows": rows, **{k: part.get(k) for k in (
                   "commit", "date", "command", "machine", "python", "torch", "retries")}}])
    return out


# --------------------------------------------------------------------------------------------------
# command line
def _parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-4`` or a mix (``0-2,7``): at most :data:`MAX_SEEDS` distinct integers in
    ``[0, 2**32)`` (a range is sized before it is expanded)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise argparse.ArgumentTypeError(f"--seeds range {part!r} runs backwards")
                if hi - lo + 1 + len(seeds) > MAX_SEEDS:
                    raise argparse.ArgumentTypeError(f"--seeds {text!r} names more than {MAX_SEEDS} seeds")
                seeds += list(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must look like 0,1,2 or 0-4, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed, e.g. 0,1,2 or 0-4")
    try:
        return check_seeds(seeds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: {exc}") from None


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout must be a whole number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--timeout must be a positive number of seconds (a cell always has a "
                                         f"time limit), got {value}")
    return value


#: ``python -m fedlab reproduce --help``: plain text (the module docstring is reStructuredText for the API pages)
HELP_DESCRIPTION = """\
Run chapters of the book headless, once per seed, and store every number each
chapter reports, with its mean and 95 % interval over the seeds.

Each chapter's record goes to chapters/records/<chapter>.<scale>.json (or to
--out DIR). The chapter pages show the paper-scale records beside the numbers
of the build you read.

A run never replaces a stored record with fewer seeds: if the stored record
holds a seed this run leaves out, nothing runs and the message says which seeds
would be lost (run them all again, write elsewhere with --out, or replace it
with --force). A seed that fails is named on stderr and the command exits 1;
its record goes to <chapter>.<scale>.failed.json rather than replace a stored
record without failures.

CHAPTER is a notebook name (02_pac_identifiability), its number (2, 02, 1a,
01a, ch3c), 'all' for every chapter, or 'matrix' for the attack x defense
matrix."""

HELP_EXAMPLES = """\
examples:
  python -m fedlab reproduce --list
  python -m fedlab reproduce 02 --seeds 0-4
  python -m fedlab reproduce 03c --scale paper --seeds 0-4 --jobs 2
  python -m fedlab reproduce all --seeds 0,1,2 --out /tmp/records
  python -m fedlab reproduce matrix --seeds 0-2
  python -m fedlab reproduce matrix --scale paper --seeds 0-9 --rows rs,oltr"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fedlab", description="fedlab command line")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="run chapters at several seeds and store their numbers",
                       description=HELP_DESCRIPTION, epilog=HELP_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("chapter", nargs="?", help="a notebook name or number (02_pac_identifiability, 2, 3c, ch1a), "
                                              "'all', or 'matrix' (the attack x defense matrix)")
    r.add_argument("--list", action="store_true",
                   help="list the chapters and their stored records (seeds, seconds per seed) and exit")
    r.add_argument("--scale", choices=("quick", "paper"), default="quick",
                   help="quick (the settings the book builds with; default) or paper (the papers' settings; "
                        "--list shows the stored seconds per seed)")
    r.add_argument("--seeds", type=_parse_seeds, default=[0, 1, 2], help="e.g. 0,1,2 or 0-4 (default 0,1,2)")
    r.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (default 1)")
    r.add_argument("--out", default=None, help="folder for the records (default chapters/records/)")
    r.add_argument("--root", default=None, help="the book's folder (default: found from the working directory)")
    r.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_CELL_TIMEOUT,
                   help="seconds one cell may run before the seed counts as failed, > 0 (default: 300 quick, 1200 "
                        "paper); a seed whose cell times out, whose kernel dies or stalls is run once more")
    r.add_argument("--rows", default=None,
                   help="matrix only: re-run these rows of the stored matrix record (comma-separated keys, e.g. "
                        "rs,oltr) and keep its other rows; --seeds must name exactly the record's seeds (the default "
                        "0,1,2 does not match a paper record of 0-9); the record lists the re-runs")
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    r.add_argument("--force", action="store_true",
                   help="replace the stored record whatever it holds: also when this run leaves out some of its "
                        "seeds (default: refuse before anything runs) or has failing seeds where the stored one "
                        "has none (default: write <chapter>.<scale>.failed.json)")
    return p


#: the notebook that shows the matrix's records (``matrix.<scale>.json``)
MATRIX_NOTEBOOK = "07_matrix"


def _stored_times(stem: str, folder: Path) -> str:
    """'  [paper: 3 seeds, 120 s/seed]' for the records stored in ``folder`` (empty when none); for
    :data:`MATRIX_NOTEBOOK`, the matrix's records; for a record split out of a chapter's (``split_from``), the
    seconds are named as the unsplit chapter's."""
    parts = []
    stem = MATRIX if stem == MATRIX_NOTEBOOK else stem
    for scale in ("quick", "paper"):
        path = folder / f"{stem}.{scale}.json"
        if path.is_file():
            rec = json.loads(path.read_text())
            failed = {f["seed"] for f in rec.get("failures") or []}
            secs = [t for s, t in zip(rec.get("seeds", []), rec.get("seconds", [])) if s not in failed] or [0]
            split = rec.get("split_from") or {}
            parts.append(f"{scale}: {len(secs)} seeds, {sum(secs) / len(secs):.0f} s/seed"
                         + (f" of the unsplit {split['chapter']}" if split.get("chapter") else ""))
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
            print("error: give a CHAPTER (a stem, its number such as 02 or 3c, 'all' or 'matrix') or --list",
                  file=sys.stderr)
            return 2
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        out = Path(args.out) if args.out else root / "chapters" / "records"
        if args.rows is not None and args.chapter.strip().lower() != MATRIX:
            raise ValueError(f"--rows re-runs rows of the matrix, not of {args.chapter!r}")
        if args.chapter.strip().lower() == MATRIX:
            check_out(out, [MATRIX], args.scale)
            check_stored_seeds(out, [MATRIX], args.scale, args.seeds, force=args.force)
            rows = None if args.rows is None else [r.strip() for r in args.rows.split(",") if r.strip()]
            if rows is not None:      # refused before anything runs: a usage error (2), not a failed seed (1)
                rows = _matrix_rows(rows)
                _merge_base(record_paths(out, MATRIX, args.scale)[0], args.scale, args.seeds, rows)
            try:
                _, failures = reproduce_matrix(scale=args.scale, seeds=args.seeds, out=out, root=root,
                                               command="python -m fedlab " + " ".join(argv), force=args.force,
                                               jobs=args.jobs, rows=rows, merge=rows is not None)
            except (OSError, ValueError) as exc:   # not written (another run stored more seeds meanwhile)
                print(f"error: {exc}", file=sys.stderr)
                return 1
            return 1 if failures else 0
        selected = resolve_chapters(args.chapter, chapters)
        show = not args.no_progress and progress_enabled()       # validates FEDLAB_PROGRESS
        check_out(out, [c.stem for c in selected], args.scale)   # before the first seed, not after the last
        check_stored_seeds(out, [c.stem for c in selected], args.scale, args.seeds, force=args.force)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        return 128 + exc.signum
    try:
        _, failures = reproduce(selected, scale=args.scale, seeds=args.seeds, jobs=args.jobs, out=out, root=root,
                                timeout=args.timeout, console=Console(show_progress=show),
                                command="python -m fedlab " + " ".join(argv), force=args.force)
    except RunInterrupted as exc:
        return 128 + exc.signum      # reproduce said on stderr what was kept
    except (OSError, ValueError) as exc:   # a record could not be written (the stored one is left as it was)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if failures else 0
