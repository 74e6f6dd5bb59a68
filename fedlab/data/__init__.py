"""Data sets and client partitioners.

* :func:`load_digits` -- scikit-learn's bundled 8x8 digits (real data, offline), as torch tensors.
* :func:`load_adult` -- UCI Adult (CC BY 4.0), vendored compressed in ``fedlab/data/vendor``.
* :func:`partition_iid`, :func:`partition_label_skew`, :func:`partition_dirichlet` -- split a data
  set over clients (McMahan et al. 2017, Sec. 3: iid and "pathological" label-skew non-iid).
* :mod:`fedlab.data.download` -- cached, checksummed downloads for data that may not be vendored.
"""
from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .download import ChecksumError, OfflineError, fetch, sha256sum, verify_sha256

__all__ = [
    "Dataset",
    "load_digits",
    "load_adult",
    "train_test_split",
    "partition_iid",
    "partition_label_skew",
    "partition_dirichlet",
    "client_datasets",
    "fetch",
    "sha256sum",
    "verify_sha256",
    "ChecksumError",
    "OfflineError",
    "real_or_synthetic",
]

VENDOR = Path(__file__).with_name("vendor")


def real_or_synthetic(load_real, make_synthetic, *, name: str = "the real data", echo=print):
    """The data a notebook runs on: ``load_real()`` when the real files are in the local cache, else
    ``make_synthetic()``, with one line (through ``echo``) saying which. Data we may not redistribute
    (MovieLens, LETOR) is only read from the local cache, so the one reason to fall back is
    :class:`OfflineError` (the data is absent). Any other error of the real loader -- a corrupt cache
    (:class:`ChecksumError`), an unreadable or half-written file (``OSError``), a parse error
    (``ValueError``), a bug -- propagates after a line naming ``name``: a page must never switch to
    synthetic data silently because the real loader crashed. Returns what the chosen function returns."""
    try:
        data = load_real()
    except OfflineError:
        echo(f"{name} is not in the local cache: using the synthetic default")
        return make_synthetic()
    except Exception as err:
        echo(f"{name} is in the local cache but could not be loaded ({type(err).__name__}: {err}); not "
             f"falling back to synthetic data: repair or remove the cached files")
        raise
    echo(f"using {name} from the local cache")
    return data


def as_index(idx, n: int, name: str = "idx") -> torch.Tensor:
    """``idx`` as a LongTensor of positions into ``n`` rows: integer positions pass through, a boolean
    mask (which must have length ``n``) becomes the positions of its ``True`` entries. Raises
    ``ValueError`` naming ``name`` for a mask of the wrong length or non-integer positions."""
    a = idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
    if a.dtype == bool:
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{name}: a boolean mask must have shape [{n}], got {a.shape}")
        return torch.from_numpy(np.flatnonzero(a)).long()
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must hold integer positions or be a boolean mask, got dtype {a.dtype}")
    return torch.as_tensor(a.astype(np.int64))


@dataclass
class Dataset:
    """Features ``X`` (shape ``[n, ...]``, float32) and labels ``y`` (shape ``[n]``, int64).

    ``meta`` holds raw columns or names a chapter may need (for example Adult's education and age,
    used to build the non-iid split of Xu & Neglia).
    """

    X: torch.Tensor
    y: torch.Tensor
    feature_names: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx) -> "Dataset":
        """Rows ``idx``: integer positions, or a boolean mask of length ``len(self)``. Raises
        ``ValueError`` naming ``idx`` for a mask of another length or non-integer positions."""
        idx = as_index(idx, len(self))
        meta = {k: (v[idx.numpy()] if isinstance(v, np.ndarray) and len(v) == len(self) else v)
                for k, v in self.meta.items()}
        return Dataset(self.X[idx], self.y[idx], list(self.feature_names), meta)


def load_digits(*, flatten: bool = True, scale01: bool = True) -> Dataset:
    """scikit-learn's handwritten digits (1797 images of 8x8 pixels, 10 classes).

    Returns ``X`` of shape ``[1797, 64]`` (or ``[1797, 1, 8, 8]`` with ``flatten=False``), values in
    ``[0, 1]`` when ``scale01`` (the raw pixels are 0..16), and ``y`` of shape ``[1797]``.
    """
    data, target = _digits_arrays()
    X = data.astype(np.float32)
    if scale01:
        X = X / 16.0
    X = torch.from_numpy(X)
    if not flatten:
        X = X.reshape(-1, 1, 8, 8)
    return Dataset(X, torch.from_numpy(target.astype(np.int64)), [f"px{i}" for i in range(64)])


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(data [1797, 64] float64, target [1797])`` of scikit-learn's digits: its ``digits.csv.gz`` read the way
    ``sklearn.datasets.load_digits`` reads it (``np.loadtxt``, comma-separated, the last column the label),
    found without importing scikit-learn (about 1.7 s of CPU, in every process that only wants the digits:
    each Flower ClientApp of a deployment, each notebook kernel); through ``load_digits`` if the file is not
    where scikit-learn keeps it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if path is not None and path.is_file():
        with gzip.open(path, mode="rt", encoding="utf-8") as f:
            table = np.loadtxt(f, delimiter=",")
        return table[:, :-1], table[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits as _load

    d = _load()
    return d.data, d.target


ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


#: SHA-256 of the vendored Adult files (the gzip files as committed). :func:`load_adult` checks them,
#: so a truncated or altered copy (even a valid gzip of fewer rows) raises ``ChecksumError``.
ADULT_SHA256 = {
    "adult.data.gz": "79d673241aeed099ca33f8cfca8928cf5223509841c9857b1af0d5d6326467ab",
    "adult.test.gz": "cf86718d77ed3ab47d59b5277fff2b14b2c2fae24e14d4b09a365d006fb1025e",
}


#: parsed Adult files: path -> ((path, size, mtime_ns), rows); a file that changes is verified and read again
_ADULT_ROWS: dict[str, tuple] = {}


def _read_adult(path: Path) -> tuple[tuple[str, ...], ...]:
    """The records of one vendored Adult file (checksum verified), as immutable rows. Parsed once per
    process and file version: chapter 4b loads the files a dozen times."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    hit = _ADULT_ROWS.get(str(path))
    if hit is not None and hit[0] == key:
        return hit[1]
    verify_sha256(path, ADULT_SHA256[path.name])
    rows = []
    with gzip.open(path, "rt") as fh:
        for rec in csv.reader(fh, skipinitialspace=True):
            if len(rec) != len(ADULT_COLUMNS):
                continue  # blank lines and the test file's "|1x3 Cross validator" header
            rows.append(tuple(v.strip() for v in rec))
    _ADULT_ROWS[str(path)] = (key, tuple(rows))
    return _ADULT_ROWS[str(path)][1]


def load_adult(split: str = "train", *, drop_missing: bool = True) -> Dataset:
    """UCI Adult census income (Becker & Kohavi 1996; CC BY 4.0), read from the vendored copy.

    Parameters
    ----------
    split : {"train", "test", "all"}
        ``adult.data`` (32,561 rows), ``adult.test`` (16,281 rows) or both.
    drop_missing : bool
        Drop rows with a ``?`` entry (as most papers do).

    Returns
    -------
    Dataset
        ``X`` float32 ``[n, 104]``: the six numeric columns standardised with the training split's mean
        and std, then one-hot categorical columns (categories taken from the training split);
        ``y`` int64 ``[n]`` (1 for income > 50K). ``meta`` holds the raw ``age`` (int array) and
        ``education`` (str array) columns.

    Raises ``ChecksumError`` (a ``ValueError``) when a vendored file differs from the committed one
    (:data:`ADULT_SHA256`).
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    train_rows = _read_adult(VENDOR / "adult.data.gz")
    test_rows = _read_adult(VENDOR / "adult.test.gz")
    if drop_missing:
        train_rows = [r for r in train_rows if "?" not in r]
        test_rows = [r for r in test_rows if "?" not in r]
    rows = {"train": train_rows, "test": test_rows, "all": train_rows + test_rows}[split]

    cols = {c: i for i, c in enumerate(ADULT_COLUMNS)}
    cats = [c for c in ADULT_COLUMNS if c not in ADULT_NUMERIC and c != "income"]
    ref = np.array(train_rows, dtype=object)
    arr = np.array(rows, dtype=object)
    num_ref = ref[:, [cols[c] for c in ADULT_NUMERIC]].astype(np.float64)
    mu, sd = num_ref.mean(0), num_ref.std(0)
    num = (arr[:, [cols[c] for c in ADULT_NUMERIC]].astype(np.float64) - mu) / sd
    blocks, names = [num], list(ADULT_NUMERIC)
    for c in cats:
        levels = sorted(set(ref[:, cols[c]]))
        onehot = (arr[:, cols[c]][:, None] == np.array(levels, dtype=object)[None, :]).astype(np.float64)
        blocks.append(onehot)
        names += [f"{c}={lv}" for lv in levels]
    X = torch.from_numpy(np.concatenate(blocks, axis=1).astype(np.float32))
    y = torch.from_numpy(np.array([r[cols["income"]].rstrip(".") == ">50K" for r in rows], dtype=np.int64))
    meta = {
        "age": arr[:, cols["age"]].astype(np.int64),
        "education": arr[:, cols["education"]].astype(str),
    }
    return Dataset(X, y, names, meta)


def train_test_split(data: Dataset, test_fraction: float = 0.25, *, seed: int = 0,
                     stratify: bool = True) -> tuple[Dataset, Dataset]:
    """Split a :class:`Dataset` into train and test parts (scikit-learn's splitter, seeded)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.model_selection import train_test_split as _split

    idx = np.arange(len(data))
    tr, te = _split(idx, test_size=test_fraction, random_state=seed,
                    stratify=data.y.numpy() if stratify else None)
    return data.subset(np.sort(tr)), data.subset(np.sort(te))


def _check_clients(num_clients: int, n: int) -> None:
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
    if num_clients > n:
        raise ValueError(f"num_clients ({num_clients}) exceeds the number of samples ({n})")


def partition_iid(n: int, num_clients: int, *, seed: int = 0) -> list[np.ndarray]:
    """Shuffle ``range(n)`` and deal it into ``num_clients`` parts whose sizes differ by at most one.

    Returns a list of ``num_clients`` sorted index arrays that together cover ``range(n)`` once.
    """
    _check_clients(num_clients, n)
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def partition_label_skew(y, num_clients: int, classes_per_client: int = 2, *,
                         seed: int = 0) -> list[np.ndarray]:
    """McMahan et al. (2017)'s pathological non-iid split: sort by label, cut into
    ``num_clients * classes_per_client`` equal shards, give each client ``classes_per_client`` shards.

    Most clients then hold examples of only ``classes_per_client`` labels. Every index is used once.
    """
    y = np.asarray(y)
    _check_clients(num_clients, len(y))
    if classes_per_client < 1:
        raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
    num_shards = num_clients * classes_per_client
    if num_shards > len(y):
        raise ValueError("num_clients * classes_per_client exceeds the number of samples")
    r = np.random.default_rng(seed)
    order = np.lexsort((r.random(len(y)), y))  # sorted by label, random within a label
    shards = np.array_split(order, num_shards)
    shard_ids = r.permutation(num_shards).reshape(num_clients, classes_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in shard_ids]


def partition_dirichlet(y, num_clients: int, alpha: float, *, seed: int = 0,
                        min_size: int = 1) -> list[np.ndarray]:
    """Label-skew by a Dirichlet(``alpha``) draw of each class's spread over clients
    (Hsu et al. 2019). Small ``alpha`` -> very skewed; large ``alpha`` -> close to iid.

    Redraws until every client holds at least ``min_size`` samples.
    """
    y = np.asarray(y)
    _check_clients(num_clients, len(y))
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    r = np.random.default_rng(seed)
    for _ in range(1000):
        parts = [[] for _ in range(num_clients)]
        for c in np.unique(y):
            idx = r.permutation(np.flatnonzero(y == c))
            p = r.dirichlet(alpha * np.ones(num_clients))
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"could not give every client {min_size} samples with alpha={alpha}")


def client_datasets(data: Dataset, parts: list[np.ndarray]) -> list[Dataset]:
    """The per-client :class:`Dataset` objects of a partition."""
    return [data.subset(p) for p in parts]
