"""Records of paper-scale runs, so that a quick build can show what the paper scale measured.

A chapter's numbers come from code (myst-nb ``glue``). At ``FEDLAB_SCALE=paper`` a notebook can
take many minutes, too long for the book build, so a notebook keeps its glued numbers in a
:class:`Record` and, when run at paper scale, writes them with :meth:`Record.save` to a JSON file
next to it (``chapters/records/<notebook>.paper.json``), together with the wall time, the date,
the versions and the git commit. The quick build loads that file with :func:`load_record` and shows
both columns side by side (:func:`compare_rows`). Nothing in a record is typed by hand: a record is
only ever written by the notebook it belongs to.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
from pathlib import Path

__all__ = ["Record", "load_record", "compare_rows", "describe"]


class Record(dict):
    """The numbers a notebook glues, by name. ``record.glue(name, value)`` stores ``value`` and
    glues it (myst-nb, ``display=False``); values must be JSON-serialisable (numbers, strings)."""

    def glue(self, name: str, value) -> None:
        from myst_nb import glue

        if not isinstance(value, (int, float, str, bool)):
            raise ValueError(f"value of {name!r} must be a number or a string, got {type(value).__name__}")
        self[name] = value
        glue(name, value, display=False)

    def save(self, path: str | Path, *, seconds: float, scale: str) -> Path:
        """Write the record as JSON: ``{"scale", "seconds", "date", "python", "torch", "machine",
        "commit", "values"}``. Raises ``ValueError`` for ``seconds < 0``."""
        import torch

        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=path.parent, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
        meta = {"scale": scale, "seconds": round(float(seconds), 1),
                "date": _dt.date.today().isoformat(), "python": platform.python_version(),
                "torch": torch.__version__, "machine": f"{platform.machine()}, {_cpu_count()} CPUs",
                "commit": commit, "values": dict(self)}
        path.write_text(json.dumps(meta, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        return path


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_record(path: str | Path) -> dict | None:
    """The record saved at ``path`` (see :meth:`Record.save`), or ``None`` if there is none.
    Raises ``ValueError`` if the file exists but is not a record."""
    path = Path(path)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("values"), dict) or "seconds" not in data:
        raise ValueError(f"{path} is not a fedlab run record")
    return data


def compare_rows(current: dict, recorded: dict | None, labels: dict) -> list[list]:
    """Rows ``[label, current value, recorded value]`` for every ``name -> label`` of ``labels``
    (``"n/a"`` where a value is missing), for a quick-vs-paper table."""
    rec = (recorded or {}).get("values", {})
    return [[label, current.get(name, "n/a"), rec.get(name, "n/a")] for name, label in labels.items()]


def describe(recorded: dict | None) -> str:
    """One sentence on a stored run (time, machine, date, commit, torch), or that there is none."""
    if recorded is None:
        return "No paper-scale record is stored yet."
    return (f"The stored {recorded['scale']}-scale run took {recorded['seconds']:.0f} s on {recorded['machine']} "
            f"({recorded['date']}, commit {recorded['commit']}, torch {recorded['torch']}).")
