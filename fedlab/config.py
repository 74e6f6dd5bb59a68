"""One place for the run-wide settings of the course: scale, seeding, progress bars and data directory.

Every chapter reads these through the functions below, never from ``os.environ`` directly, so that a
reader can change a setting once (an environment variable) and every notebook and test follows.

* ``FEDLAB_SCALE`` -- ``quick`` (default; every notebook < 60 s on a 2-core CPU) or ``paper`` (the
  settings of the paper a chapter reproduces).
* ``FEDLAB_DATA``  -- cache directory for downloaded data sets (default: the user's cache dir).
* ``FEDLAB_SEED``  -- the base seed handed to :func:`seed_everything` when no seed is given (default 0).
* ``FEDLAB_PROGRESS`` -- ``0`` / ``1`` (or false/true, no/yes, off/on): progress bars off / on (default on).

* ``FEDLAB_DEVICE`` -- where the computations that dominate paper scale run (default ``cpu``; also
  ``cuda``, ``cuda:N`` or ``mps``), read by :func:`device`: gradient inversion (DLG, Inverting
  Gradients), RAIFLE's batched L-BFGS (:mod:`fedlab.optim`), the FedAvg / DP-FedAvg round loops and
  IFCA. Their random draws stay on the CPU generators (a GPU run starts from the same points) and their
  results come back on the CPU; the default changes no number. A value torch cannot use (no CUDA
  device, an index past the last GPU) raises ``ValueError`` naming ``FEDLAB_DEVICE``.
* ``FEDLAB_WORKERS`` -- worker processes for the batches of users of RAIFLE's recommendation attacks
  (:func:`fedlab.experiments.chapter3a.attack_case`, chapters 3a-3b at paper scale), read by
  :func:`workers` (default ``1``: everything in this process; ``auto``: one per CPU). Each batch gives the
  same bits in a worker as in this process (``tests/test_parallel.py``), so the setting changes the wall
  time, never a number.
"""
from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import TypeVar

import numpy as np

# torch is imported inside the functions that use it: `import fedlab` and the command line
# (`python -m fedlab reproduce`, whose worker processes import it again) need no torch (about 3 s of CPU)

T = TypeVar("T")

SCALES = ("quick", "paper")
DEVICE_KINDS = ("cpu", "cuda", "mps")
DEFAULT_SEED = 0
_GLOBAL_NP: np.random.Generator | None = None


def scale() -> str:
    """Return the active scale, ``"quick"`` (default) or ``"paper"``, read from ``FEDLAB_SCALE``.

    Raises
    ------
    ValueError
        If ``FEDLAB_SCALE`` is set to anything else (a typo must not silently run the wrong scale).
    """
    value = os.environ.get("FEDLAB_SCALE", "quick").strip().lower() or "quick"
    if value not in SCALES:
        raise ValueError(f"FEDLAB_SCALE must be one of {SCALES}, got {value!r}")
    return value


def is_paper_scale() -> bool:
    """``True`` when ``FEDLAB_SCALE=paper``."""
    return scale() == "paper"


def pick(quick: T, paper: T) -> T:
    """Choose a setting by scale: ``pick(quick=200, paper=5000)``.

    Use it for every number that differs between the reduced run and the paper's setting, so a
    notebook states both values side by side in one line.
    """
    return paper if is_paper_scale() else quick


def default_seed() -> int:
    """Base seed from ``FEDLAB_SEED`` (default 0)."""
    raw = os.environ.get("FEDLAB_SEED", str(DEFAULT_SEED))
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"FEDLAB_SEED must be an integer, got {raw!r}") from exc
    if not 0 <= value < 2**64:
        raise ValueError(f"FEDLAB_SEED must be an integer in [0, 2^64), got {raw!r}")
    return value


def seed_everything(seed: int | None = None) -> torch.Generator:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and CUDA) from one integer.

    Returns a fresh :class:`torch.Generator` seeded with the same value, for code that prefers an
    explicit generator. Two calls with the same seed make every following draw identical.

    Raises
    ------
    ValueError
        If ``seed`` is not an integer in ``[0, 2^64)`` (torch takes unsigned 64-bit seeds only; ``2**64`` would
        fail inside torch with an overflow message that names no argument).
    """
    if seed is None:
        seed = default_seed()
    if isinstance(seed, bool) or int(seed) != seed:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed}")
    import torch

    global _GLOBAL_NP
    random.seed(seed)
    np.random.seed(seed % 2**32)
    _GLOBAL_NP = np.random.default_rng(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():  # pragma: no cover - depends on hardware
        torch.cuda.manual_seed_all(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def rng(seed: int | None = None) -> np.random.Generator:
    """A NumPy ``Generator`` seeded from ``seed`` (or the base seed)."""
    return np.random.default_rng(default_seed() if seed is None else int(seed))


def global_rng() -> np.random.Generator:
    """fedlab's shared NumPy ``Generator``, used by samplers called without a generator.

    It is created from the base seed (``FEDLAB_SEED``) on first use and re-created by every call of
    :func:`seed_everything`, so a notebook that seeds once gets the same draws on every run, and
    successive draws differ (never fresh OS entropy, never the same noise twice)."""
    global _GLOBAL_NP
    if _GLOBAL_NP is None:
        _GLOBAL_NP = np.random.default_rng(default_seed())
    return _GLOBAL_NP


def as_generator(rng) -> np.random.Generator:
    """``rng`` as a NumPy ``Generator``: a Generator is returned as is, an int seeds a new one and
    ``None`` takes :func:`global_rng` (never OS entropy). Raises ``ValueError`` naming ``rng`` for
    anything else (a bool included)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return global_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy Generator, an int seed or None, got {type(rng).__name__}")


@contextlib.contextmanager
def seeded(seed: int | None):
    """Context in which torch's global RNG is seeded with ``seed``, restored on exit.

    Model constructors use it so that ``mlp(..., seed=3)`` gives the same initialisation every time
    without resetting the caller's random stream (no side effect on later draws). ``seed=None`` draws
    from the global stream as usual (seeded by :func:`seed_everything`)."""
    if seed is None:
        yield
        return
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def data_dir(*, create: bool = True) -> Path:
    """Directory where data sets are cached: ``FEDLAB_DATA`` or ``<user cache dir>/fedlab``.

    The directory is created on first use (``create=False`` only names it: looking a file up must not
    create an empty cache). Raises ``ValueError`` naming ``FEDLAB_DATA`` when the path exists but is
    not a directory, or cannot be created.
    """
    env = os.environ.get("FEDLAB_DATA")
    if env:
        try:
            path = Path(env).expanduser()
        except RuntimeError as exc:     # "~nosuchuser/x": no such home directory
            raise ValueError(f"FEDLAB_DATA: cannot expand {env!r} ({exc})") from exc
    else:
        from platformdirs import user_cache_dir

        path = Path(user_cache_dir("fedlab"))
    return ensure_cache_dir(path, "FEDLAB_DATA") if create else _check_cache_dir(path, "FEDLAB_DATA")


def _check_cache_dir(path: Path, name: str) -> Path:
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}: the data cache {path} exists but is not a directory (set {name} to a directory)")
    return path


def ensure_cache_dir(path: Path, name: str = "FEDLAB_DATA") -> Path:
    """Create the cache directory ``path`` (and parents) if needed; raises ``ValueError`` naming
    ``name`` when it is a file or cannot be created or written."""
    _check_cache_dir(path, name)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}: cannot create the data cache {path} ({exc})") from exc
    return path


def progress_enabled() -> bool:
    """Whether long loops show a tqdm progress bar: ``FEDLAB_PROGRESS=0`` turns them off (the book
    build and the tests do, so the pages stay clean); on when unset or ``1``. Raises ``ValueError``
    naming ``FEDLAB_PROGRESS`` for any other value than 0/1, false/true, no/yes, off/on (any case)."""
    raw = os.environ.get("FEDLAB_PROGRESS", "1")
    value = raw.strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("", "1", "true", "yes", "on"):
        return True
    raise ValueError(f"FEDLAB_PROGRESS must be 0 or 1 (or false/true, no/yes, off/on), got {raw!r}")


#: the most worker processes :func:`workers` accepts
MAX_WORKERS = 256


def workers() -> int:
    """Worker processes for the batched attacks that can use them, from ``FEDLAB_WORKERS``: an integer in
    ``[1, 256]`` or ``auto`` (``os.cpu_count()``); default ``1`` (no worker process).

    Raises
    ------
    ValueError
        Naming ``FEDLAB_WORKERS`` for anything else (``0``, ``-2``, ``2.5``, ``many``).
    """
    raw = os.environ.get("FEDLAB_WORKERS", "1")
    text = raw.strip().lower() or "1"
    if text == "auto":
        return max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise ValueError(f"FEDLAB_WORKERS must be an integer in [1, {MAX_WORKERS}] or 'auto', got {raw!r}")
    return int(text)


def device(value: str | torch.device | None = None) -> torch.device:
    """The ``torch.device`` the heavy computations run on: ``value`` when given (a string or a device,
    validated the same way), else ``FEDLAB_DEVICE`` (default ``cpu``). Accepted: ``cpu``, ``cuda``,
    ``cuda:N`` and ``mps`` (any case, surrounding spaces ignored).

    Raises
    ------
    ValueError
        Naming ``FEDLAB_DEVICE`` (or ``device``) for any other value, and for a device torch cannot
        use here: ``cuda`` without an available CUDA device, ``cuda:N`` with ``N`` past the last GPU,
        ``mps`` without the MPS backend.
    """
    import torch

    name = "device"
    if value is None:
        name, value = "FEDLAB_DEVICE", os.environ.get("FEDLAB_DEVICE", "cpu")
    raw = value
    text = str(value).strip().lower() or "cpu"
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"{name} must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {raw!r}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={raw!r}: torch finds no CUDA device here (torch.cuda.is_available() is "
                             f"False); unset {name} or set it to 'cpu'")
        if index and int(index) >= torch.cuda.device_count():
            raise ValueError(f"{name}={raw!r}: there are {torch.cuda.device_count()} CUDA device(s), numbered "
                             f"from 0")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{name}={raw!r}: the MPS backend is not available here; unset {name} or set it to 'cpu'")
    return torch.device(text)
