"""Executed notebooks kept between `make test` and `make book`, so that CI runs each notebook once (issue 32).

`make test` runs every chapter notebook under nbval. The root ``conftest.py`` listens to the kernel messages
nbval reads and rebuilds, through nbclient's own message handling, the executed notebook that
``scripts/execute_notebooks.py`` would have produced (outputs, display updates, widget state). When every code
cell of a notebook ran and passed, it is stored here as ``_build/executed/<name>.ipynb`` together with a
*fingerprint*. `make book` then puts a stored notebook into the book's cache instead of executing it again, but
only when the fingerprint still matches: the same notebook source, the same ``fedlab`` sources, stored records
and chapter helper files, the same ``FEDLAB_SCALE``, ``FEDLAB_SEED`` and ``FEDLAB_DEVICE``, and the same
Python and torch. Anything else, and `make book` executes the notebook itself, as before.

The fingerprint cannot see data files outside the repository (``FEDLAB_DATA``); `make book` after a change
there needs ``rm -rf _build/executed`` (or ``make clean``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXECUTED_DIR = ROOT / "_build" / "executed"
_ENV = ("FEDLAB_SCALE", "FEDLAB_SEED", "FEDLAB_DEVICE")
_SOURCES = ("fedlab/**/*.py", "chapters/**/*.py", "chapters/records/*.json", "pyproject.toml")


def _sources_digest() -> str:
    h = hashlib.sha256()
    files = sorted({p for pattern in _SOURCES for p in ROOT.glob(pattern) if p.is_file()})
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def fingerprint(notebook: Path) -> dict:
    """What an executed copy of ``notebook`` depends on; two equal fingerprints mean the same execution."""
    notebook = Path(notebook).resolve()
    return {
        "notebook": notebook.name,
        "notebook_sha256": hashlib.sha256(notebook.read_bytes()).hexdigest(),
        "sources_sha256": _sources_digest(),
        "env": {k: os.environ.get(k, "") for k in _ENV},
        "python": platform.python_version(),
        "torch": _torch_version(),
    }


def _torch_version() -> str:
    """torch's version from its installed metadata (the same string as ``torch.__version__``), without
    importing torch (about 3 s of CPU in a pytest process that runs only notebooks, as the one
    tests/test_executed_store.py starts); importing it where the metadata is missing."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        import torch

        return torch.__version__


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def store(notebook: Path, executed_nb, fp: dict, directory: Path = EXECUTED_DIR) -> Path:
    """Write the executed notebook, then its fingerprint (a reader that finds the fingerprint finds the
    notebook it describes)."""
    import nbformat

    name = Path(notebook).name
    out = Path(directory) / name
    _atomic_write(out, nbformat.writes(executed_nb))
    _atomic_write(out.with_suffix(".fingerprint.json"), json.dumps(fp, indent=1, sort_keys=True))
    return out


def load(notebook: Path, directory: Path = EXECUTED_DIR):
    """The stored executed copy of ``notebook`` if its fingerprint matches now, else ``None``."""
    import nbformat

    out = Path(directory) / Path(notebook).name
    fp_file = out.with_suffix(".fingerprint.json")
    if not (out.is_file() and fp_file.is_file()):
        return None
    try:
        stored = json.loads(fp_file.read_text())
        nb = nbformat.read(out, as_version=4)
    except (OSError, ValueError):
        return None
    if stored != fingerprint(notebook):
        return None
    return nb
