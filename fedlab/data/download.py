"""Cached, checksum-verified downloads. Nothing here touches the network unless asked.

The course builds and tests offline. Real data sets that may not be redistributed (MovieLens, LETOR,
...) are fetched only when a user calls a loader with ``download=True``; the file then lives in
:func:`fedlab.config.data_dir` and is verified by its SHA-256 digest on every use. The transfer itself is
pooch's (``pooch.retrieve`` with a required known hash: it downloads into a temporary file and moves it
into place only once the hash matches, so a partial or wrong download never becomes a cached file).
"""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from .._io import atomic_write_bytes
from ..config import data_dir

__all__ = ["sha256sum", "verify_sha256", "fetch", "ChecksumError", "OfflineError", "UnverifiedDataWarning",
           "atomic_write_bytes", "verify_or_warn"]


class ChecksumError(ValueError):
    """A file's SHA-256 digest differs from the expected one."""


class OfflineError(RuntimeError):
    """A file is missing from the cache and downloading it was not possible or not allowed."""


class UnverifiedDataWarning(UserWarning):
    """A data file was loaded without a digest to check it against (a truncated or altered file would go
    unnoticed)."""


def verify_or_warn(path: str | Path, expected: str | None, what: str) -> Path:
    """:func:`verify_sha256` when ``expected`` is known; otherwise an :class:`UnverifiedDataWarning`
    saying that ``what`` at ``path`` was NOT verified (pass its digest to check it)."""
    if expected is None:
        warnings.warn(f"{what} at {path} is NOT verified: no SHA-256 digest is known for it, so a truncated or "
                      f"altered file would load without an error; pass sha256=<its digest> to check it",
                      UnverifiedDataWarning, stacklevel=3)
        return verify_sha256(path, None)
    return verify_sha256(path, expected)


def sha256sum(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(chunk_size), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: str | Path, expected: str | None) -> Path:
    """Check ``path`` against the hex digest ``expected`` (skipped when ``expected`` is ``None``).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ChecksumError
        If the digest differs; the message names both digests.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if expected is not None:
        actual = sha256sum(path)
        if actual.lower() != expected.lower():
            raise ChecksumError(
                f"SHA-256 mismatch for {path}: expected {expected.lower()}, got {actual}. "
                "Delete the file and download it again."
            )
    return path


def fetch(
    url: str,
    filename: str,
    sha256: str | None,
    *,
    download: bool = False,
    cache_dir: str | Path | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return the path of ``filename`` in the cache, downloading it from ``url`` only if asked.

    Parameters
    ----------
    url : str
        Where the file can be downloaded from.
    filename : str
        Name of the file inside the cache directory.
    sha256 : str or None
        Expected hex digest; the cached or downloaded file is verified against it. A download requires
        it (``None`` raises ``ValueError`` naming ``sha256``); a file already in the cache is then only
        checked if a digest is given.
    download : bool
        When ``False`` (default) a missing file raises :class:`OfflineError` instead of going online.
    cache_dir : path, optional
        Defaults to :func:`fedlab.config.data_dir`.

    Raises
    ------
    OfflineError
        If the file is not cached and ``download`` is ``False`` or the download fails.
    ChecksumError
        If the file's digest differs from ``sha256`` (a failed download is removed, never cached).
    ValueError
        Naming ``FEDLAB_DATA`` (or ``cache_dir``) when the cache is a file, or cannot be created or
        written. A missing cache directory is created only to download into it.
    """
    if not filename or "/" in filename or "\\" in filename or filename in (".", ".."):
        raise ValueError(f"filename must be a plain file name, got {filename!r}")
    from ..config import _check_cache_dir, ensure_cache_dir

    name = "cache_dir" if cache_dir is not None else "FEDLAB_DATA"
    root = _check_cache_dir(Path(cache_dir), name) if cache_dir is not None else data_dir(create=False)
    target = root / filename
    if target.is_file():
        return verify_sha256(target, sha256)
    if not download:
        raise OfflineError(
            f"{filename} is not in the cache ({root}). Place the file there yourself, or call the "
            f"loader with download=True to fetch it from {url}."
        )
    if sha256 is None:
        raise ValueError(f"sha256: downloading {filename} needs its known SHA-256 digest, so that a wrong file "
                         f"(an error page, a truncated transfer) can never enter the cache; none is known for "
                         f"{url}: download the file yourself, check it, and place it in {root}")
    ensure_cache_dir(root, name)
    probe = root / f".{filename}.write-test"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{name}: cannot write to the data cache {root} ({exc})") from exc
    import pooch
    import requests

    try:
        return Path(pooch.retrieve(url, known_hash=f"sha256:{sha256.lower()}", fname=filename, path=root,
                                   progressbar=False, downloader=pooch.HTTPDownloader(timeout=timeout)
                                   if url.startswith(("http://", "https://")) else None))
    except requests.exceptions.RequestException as exc:
        raise OfflineError(f"could not download {url}: {exc}") from exc
    except ValueError as exc:
        if "hash" in str(exc).lower():      # pooch removed the temporary file; nothing was cached
            raise ChecksumError(f"SHA-256 mismatch for the download of {filename} from {url}: {exc}") from exc
        raise OfflineError(f"could not download {url}: {exc}") from exc
