"""MovieLens-100K for federated recommendation (Harper & Konstan 2015), as used by RAIFLE.

Pham, Kulkarni & Houmansadr (RAIFLE, Sec. 4.1.2) binarise MovieLens-100K (1 = the user rated the
movie) and give every user its rated movies plus non-rated movies sampled at a ratio of 4:1. The data
may not be redistributed, so this module has

* :func:`load_movielens_100k` -- the real loader: parses ``u.data`` (tab separated
  ``user item rating timestamp``, ids starting at 1) from the cache, verified by SHA-256; it is
  downloaded only when ``download=True``;
* :func:`synthetic_movielens` -- the offline default: 943 users, 1682 items, about 106 ratings per
  user (at least 20 each, heavy tailed), Zipf-like item popularity, ratings 1..5, written through the
  same parser so both paths share one code path;
* :func:`sample_user_items` -- per-user item sets (positives + ``neg_ratio`` sampled negatives),
  padded into one batch :class:`UserItems` so attacks can run on many users at once.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .download import fetch, verify_sha256

__all__ = ["RatingsData", "UserItems", "parse_udata", "load_movielens_100k", "synthetic_movielens",
           "sample_user_items", "ML100K_URL", "ML100K_SHA256", "ML100K_UDATA_SHA256"]

ML100K_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
#: SHA-256 of ``ml-100k.zip`` as published by GroupLens (the archive has not changed since 1998).
ML100K_SHA256 = "50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229"
#: SHA-256 of the extracted ``u.data`` (checked when a user places the bare file in the cache).
ML100K_UDATA_SHA256 = "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490"


@dataclass
class RatingsData:
    """Explicit ratings: ``ratings`` int64 array ``[n, 4]`` of (user, item, rating, timestamp),
    with 0-based user and item indices; ``num_users``, ``num_items``; ``source`` says where it came
    from ("MovieLens-100K" or "synthetic")."""

    ratings: np.ndarray
    num_users: int
    num_items: int
    source: str

    def user_items(self) -> list[np.ndarray]:
        """Binarised interactions: for every user the sorted array of items it rated (any rating
        counts as an interaction, RAIFLE Sec. 4.1.2)."""
        order = np.lexsort((self.ratings[:, 1], self.ratings[:, 0]))
        r = self.ratings[order]
        bounds = np.searchsorted(r[:, 0], np.arange(self.num_users + 1))
        return [np.unique(r[bounds[u]:bounds[u + 1], 1]) for u in range(self.num_users)]

    def ratings_per_user(self) -> np.ndarray:
        """Number of distinct items per user, shape ``[num_users]``."""
        return np.array([len(x) for x in self.user_items()])


def parse_udata(text: str, *, source: str = "MovieLens-100K") -> RatingsData:
    """Parse the ``u.data`` format: one rating per line, ``user\\titem\\trating\\ttimestamp``,
    ids starting at 1, ratings 1..5.

    Raises ``ValueError`` on a malformed line (wrong number of fields, non-integers, ids < 1,
    ratings outside 1..5) or an empty file.
    """
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"u.data line {lineno}: expected 4 tab-separated fields, got {len(fields)}")
        try:
            u, i, r, t = (int(f) for f in fields)
        except ValueError as exc:
            raise ValueError(f"u.data line {lineno}: fields must be integers: {line!r}") from exc
        if u < 1 or i < 1:
            raise ValueError(f"u.data line {lineno}: user and item ids start at 1, got {u}, {i}")
        if not 1 <= r <= 5:
            raise ValueError(f"u.data line {lineno}: rating must be in 1..5, got {r}")
        rows.append((u - 1, i - 1, r, t))
    if not rows:
        raise ValueError("u.data is empty")
    arr = np.asarray(rows, dtype=np.int64)
    return RatingsData(arr, int(arr[:, 0].max()) + 1, int(arr[:, 1].max()) + 1, source)


def load_movielens_100k(*, download: bool = False, cache_dir: str | Path | None = None,
                        udata_sha256: str = ML100K_UDATA_SHA256,
                        zip_sha256: str = ML100K_SHA256) -> RatingsData:
    """MovieLens-100K ratings (Harper & Konstan 2015) from the fedlab cache.

    Looks for ``u.data`` in the cache (checked against ``udata_sha256``, default
    :data:`ML100K_UDATA_SHA256`) and otherwise for ``ml-100k.zip`` (checked against ``zip_sha256``,
    default :data:`ML100K_SHA256`; downloaded from GroupLens only when ``download=True``). The
    digests are parameters so tests can check the parser on small generated files. Returns
    :class:`RatingsData` (943 users, 1682 items for the real file).

    Raises
    ------
    fedlab.data.OfflineError
        If neither file is cached and ``download`` is ``False``.
    fedlab.data.ChecksumError
        If a cached or downloaded file has the wrong SHA-256.
    """
    from ..config import data_dir

    root = Path(cache_dir) if cache_dir is not None else data_dir(create=False)
    bare = root / "u.data"
    if bare.is_file():
        verify_sha256(bare, udata_sha256)
        return parse_udata(bare.read_text())
    archive = fetch(ML100K_URL, "ml-100k.zip", zip_sha256, download=download, cache_dir=root)
    with zipfile.ZipFile(archive) as zf:
        text = zf.read("ml-100k/u.data").decode("utf-8")
    return parse_udata(text)


def synthetic_movielens(num_users: int = 943, num_items: int = 1682, mean_ratings: float = 106.0,
                        *, min_ratings: int = 20, zipf_exponent: float = 0.9,
                        seed: int = 0) -> RatingsData:
    """A synthetic stand-in for MovieLens-100K with the same shape (the offline default).

    Per-user counts are ``min_ratings`` plus a geometric tail with mean ``mean_ratings``
    (MovieLens-100K: 943 users, 1682 items, 100,000 ratings, >= 20 per user, mean 106); items are
    drawn without replacement with Zipf-like popularity ``rank^-zipf_exponent``; ratings 1..5 follow
    MovieLens' marginal (6 %, 11 %, 27 %, 35 %, 21 %), in the (0-based) layout :func:`parse_udata`
    returns.

    Raises ``ValueError`` for non-positive sizes or ``mean_ratings`` outside
    ``(min_ratings, num_items)``.
    """
    if num_users < 1 or num_items < 1:
        raise ValueError(f"num_users and num_items must be positive, got {num_users}, {num_items}")
    if not min_ratings < mean_ratings < num_items:
        raise ValueError(f"mean_ratings must be in ({min_ratings}, {num_items}), got {mean_ratings}")
    gen = np.random.default_rng(seed)
    counts = min_ratings + gen.geometric(1.0 / (mean_ratings - min_ratings + 1), size=num_users) - 1
    counts = np.minimum(counts, num_items // 2)
    pop = 1.0 / np.arange(1, num_items + 1) ** zipf_exponent
    pop = pop[gen.permutation(num_items)]
    rows = []
    for u in range(num_users):
        # Gumbel top-k = sampling without replacement with probability proportional to pop
        keys = np.log(pop) + gen.gumbel(size=num_items)
        items = np.argpartition(-keys, counts[u])[:counts[u]]
        ratings = gen.choice(5, size=counts[u], p=[0.06, 0.11, 0.27, 0.35, 0.21]) + 1
        ts = 874_724_710 + gen.integers(0, 15_000_000, size=counts[u])
        rows.append(np.stack([np.full(counts[u], u), items, ratings, ts], axis=1))
    data = RatingsData(np.concatenate(rows).astype(np.int64), num_users, num_items, "synthetic")
    return data


@dataclass
class UserItems:
    """The items each user trains on, padded to one batch.

    ``items`` long ``[U, m_max]`` item indices (0 where padded); ``interactions`` float ``[U, m_max]``
    (1 = interacted, 0 = sampled negative or padding); ``mask`` bool ``[U, m_max]`` (True = real);
    ``users`` long ``[U]`` user indices. Positives come first in each row, then negatives.
    """

    items: torch.Tensor
    interactions: torch.Tensor
    mask: torch.Tensor
    users: torch.Tensor

    def __len__(self) -> int:
        return int(self.users.shape[0])

    def subset(self, idx) -> "UserItems":
        """Rows ``idx`` (a list/array/tensor of row positions), trimmed to their longest row."""
        from . import as_index

        idx = as_index(idx, len(self))
        m = int(self.mask[idx].sum(1).max())
        return UserItems(self.items[idx, :m], self.interactions[idx, :m], self.mask[idx, :m],
                         self.users[idx])


def sample_user_items(data: RatingsData, *, neg_ratio: int = 4, users=None, seed: int = 0) -> UserItems:
    """Positives + sampled negatives per user (RAIFLE Sec. 4.1.2: non-interacted items sampled
    at ``neg_ratio``:1), padded into :class:`UserItems`. ``users``: indices to keep (default all).

    Raises ``ValueError`` if ``neg_ratio < 1``.
    """
    if neg_ratio < 1:
        raise ValueError(f"neg_ratio must be >= 1, got {neg_ratio}")
    gen = np.random.default_rng(seed)
    per_user = data.user_items()
    users = np.arange(data.num_users) if users is None else np.asarray(users)
    rows = []
    for u in users:
        pos = per_user[u]
        others = np.setdiff1d(np.arange(data.num_items), pos, assume_unique=True)
        neg = gen.choice(others, size=min(neg_ratio * len(pos), len(others)), replace=False)
        rows.append((pos, np.sort(neg)))
    m_max = max(len(p) + len(n) for p, n in rows)
    items = torch.zeros(len(rows), m_max, dtype=torch.long)
    inter = torch.zeros(len(rows), m_max)
    mask = torch.zeros(len(rows), m_max, dtype=torch.bool)
    for r, (p, n) in enumerate(rows):
        k = len(p) + len(n)
        items[r, :k] = torch.from_numpy(np.concatenate([p, n]))
        inter[r, :len(p)] = 1.0
        mask[r, :k] = True
    return UserItems(items, inter, mask, torch.as_tensor(users, dtype=torch.long))
