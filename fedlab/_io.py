"""The one atomic file writer of fedlab (:func:`atomic_write_bytes`), a name of :mod:`fedlab.data.download`
(which imports it from here). It lives in this leaf module (standard library only) so that
``python -m fedlab reproduce`` writes its records without importing torch (``fedlab.data`` imports it).
Imports nothing from fedlab.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes"]


def atomic_write_bytes(target: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically: into a temporary file with a name unique to this process
    in the same directory, flushed and ``fsync``-ed, given the permissions the umask allows (not
    ``mkstemp``'s 0600), then ``os.replace``-d into place and the directory ``fsync``-ed. Two processes
    writing the same target never share a temporary file, and a reader sees the old file or the whole new
    one; on any failure the temporary file is removed and ``target`` is left as it was. The one atomic
    writer of fedlab (records use it through :func:`fedlab.reproduce.atomic_write_text`)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):         # the rename itself survives a power cut
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target
