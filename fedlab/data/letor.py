"""Learning-to-rank data: LETOR 4.0 / MSLR loaders and an offline synthetic generator.

RAIFLE (Pham, Kulkarni & Houmansadr, Sec. 4.1.2, Table 2) attacks federated online learning to rank
on MQ2007 (LETOR 4.0, 46 features, relevance 0-2) and MSLR-WEB10K (136 features, relevance 0-4),
normalising the MSLR features. Neither data set may be redistributed, so this module has

* :func:`read_svmlight` -- the SVMlight-style format both use, one document per line:
  ``<rel> qid:<id> 1:<v> 2:<v> ... [# comment]``, read by scikit-learn's ``load_svmlight_file``
  (``query_id=True``); malformed data raise ``ValueError``;
* :func:`load_letor` -- reads ``Fold<k>/<split>.txt`` of MQ2007 or MSLR-WEB10K from the fedlab cache,
  optionally checks its SHA-256; MSLR-WEB10K's zip archive is downloaded (and checked against
  :data:`MSLR10K_SHA256`) only when called with ``download=True``, MQ2007 (a RAR archive) must be
  unpacked into the cache by hand; it min-max normalises every feature within each query (``normalize="query"``, the usual OLTR
  preprocessing and the default for MSLR; the LETOR "QueryLevelNorm" files are already normalised);
* :func:`synthetic_letor` -- the offline default: queries of 20-60 documents with 46 features in
  [0, 1] (per-query min-max normalised) and 3 relevance grades drawn from a hidden nonlinear scoring
  function, with MQ2007-like grade frequencies.

All three return :class:`LTRData`, queries padded into one batch so that rankers run on many
queries at once.
"""
from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .download import OfflineError, atomic_write_bytes, fetch, verify_or_warn

__all__ = ["LTRData", "read_svmlight", "load_letor", "synthetic_letor", "normalize_per_query",
           "LETOR_DATASETS", "MSLR10K_URL", "MSLR10K_SHA256"]

#: name -> (folder in the cache, number of features, number of relevance grades)
LETOR_DATASETS = {"MQ2007": ("MQ2007", 46, 3), "MSLR-WEB10K": ("MSLR-WEB10K", 136, 5)}

#: Microsoft's OneDrive share of ``MSLR-WEB10K.zip`` (linked from the MSLR project page) and the
#: archive's SHA-256 as published by the third-party loaders pytorchltr and ltr_datasets (this
#: course is built offline and has not downloaded it itself).
MSLR10K_URL = "https://api.onedrive.com/v1.0/shares/s!AtsMfWUz5l8nbOIoJ6Ks0bEMp78/root/content"
MSLR10K_SHA256 = "2902142ea33f18c59414f654212de5063033b707d5c3939556124b1120d3a0ba"


@dataclass
class LTRData:
    """Queries padded into one batch.

    ``X`` float32 ``[num_queries, max_docs, num_features]`` (padding rows are 0), ``relevance``
    int64 ``[num_queries, max_docs]`` (padding 0), ``mask`` bool ``[num_queries, max_docs]`` (True =
    a real document), ``qids`` the original query ids, ``num_grades`` the number of relevance grades
    (3 for MQ2007, 5 for MSLR), ``source`` where the data came from.
    """

    X: torch.Tensor
    relevance: torch.Tensor
    mask: torch.Tensor
    qids: list
    num_grades: int
    source: str

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.X.shape[-1])

    def docs_per_query(self) -> torch.Tensor:
        return self.mask.sum(1)

    def subset(self, idx) -> "LTRData":
        """Queries ``idx`` (array-like of query positions), trimmed to their longest list."""
        from . import as_index

        idx = as_index(idx, len(self))
        m = int(self.mask[idx].sum(1).max())
        return LTRData(self.X[idx, :m], self.relevance[idx, :m], self.mask[idx, :m],
                       [self.qids[i] for i in idx.tolist()], self.num_grades, self.source)

    def split(self, test_fraction: float = 0.2, *, seed: int = 0) -> tuple["LTRData", "LTRData"]:
        """Random train/test split by query. Raises ``ValueError`` unless ``0 < test_fraction < 1``."""
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        perm = np.random.default_rng(seed).permutation(len(self))
        n_test = max(1, int(round(test_fraction * len(self))))
        return self.subset(np.sort(perm[n_test:])), self.subset(np.sort(perm[:n_test]))


def _pad(rows: list[tuple[np.ndarray, np.ndarray]], qids: list, num_grades: int, source: str) -> LTRData:
    m = max(len(r) for r, _ in rows)
    F = rows[0][1].shape[1]
    X = np.zeros((len(rows), m, F), dtype=np.float32)
    rel = np.zeros((len(rows), m), dtype=np.int64)
    mask = np.zeros((len(rows), m), dtype=bool)
    for q, (r, x) in enumerate(rows):
        X[q, :len(r)], rel[q, :len(r)], mask[q, :len(r)] = x, r, True
    return LTRData(torch.from_numpy(X), torch.from_numpy(rel), torch.from_numpy(mask), qids,
                   num_grades, source)


def read_svmlight(f, *, num_features: int | None = None, num_grades: int | None = None,
                  source: str = "svmlight") -> LTRData:
    """Read LETOR/MSLR's SVMlight-style data with scikit-learn's
    :func:`sklearn.datasets.load_svmlight_file` (``query_id=True``, one-based feature indices):
    ``<rel> qid:<id> <j>:<value> ...`` per line, anything after ``#`` ignored, the documents of a
    query on consecutive lines. ``f``: a path or a binary file object.

    ``num_features`` defaults to the largest index seen (missing features are 0); ``num_grades`` to
    ``max relevance + 1``. Returns :class:`LTRData` with the queries in file order (``qids`` as
    strings).

    Raises ``ValueError`` for what scikit-learn rejects (a malformed line, an index < 1 or
    > ``num_features``), and, naming the document (its position in the file, from 1), for a line
    without ``qid:``, a relevance that is not a non-negative integer, a non-finite value, or a query
    id that reappears after another query; and for an empty file.
    """
    from sklearn.datasets import load_svmlight_file

    try:
        X, y, qid = load_svmlight_file(f, n_features=num_features, zero_based=False, query_id=True,
                                       dtype=np.float32)
    except ValueError as exc:
        raise ValueError(f"{source}: malformed SVMlight data ({exc})") from exc
    if len(y) == 0:
        raise ValueError(f"{source}: no documents in the file")
    if len(qid) != len(y):
        raise ValueError(f"{source}: every line needs 'qid:<id>' after the relevance "
                         f"({len(qid)} of {len(y)} documents have one)")
    bad = np.flatnonzero((y < 0) | (y != np.round(y)))
    if len(bad):
        raise ValueError(f"{source}: document {bad[0] + 1}: relevance must be a non-negative integer, "
                         f"got {y[bad[0]]:g}")
    X = X.toarray()
    bad = np.flatnonzero(~np.isfinite(X).all(1))
    if len(bad):
        raise ValueError(f"{source}: document {bad[0] + 1}: feature values must be finite")
    starts = np.concatenate([[0], np.flatnonzero(np.diff(qid)) + 1])
    seen = qid[starts]
    if len(np.unique(seen)) != len(seen):
        dup = next(i for i in range(len(seen)) if seen[i] in seen[:i])
        raise ValueError(f"{source}: document {starts[dup] + 1}: query {seen[dup]} reappears after other queries")
    rel = y.astype(np.int64)
    G = num_grades if num_grades is not None else int(rel.max()) + 1
    if rel.max() >= G:
        raise ValueError(f"{source}: relevance {rel.max()} is outside 0..{G - 1} (num_grades={G})")
    ends = np.concatenate([starts[1:], [len(y)]])
    rows = [(rel[a:b], X[a:b]) for a, b in zip(starts, ends)]
    return _pad(rows, [str(q) for q in seen], G, source)


def normalize_per_query(data: LTRData) -> LTRData:
    """Min-max normalise every feature within each query to [0, 1] (a feature constant within a
    query becomes 0), the standard OLTR preprocessing for MSLR. Padding stays 0."""
    m = data.mask[..., None]
    big = torch.finfo(data.X.dtype).max
    lo = torch.where(m, data.X, torch.full_like(data.X, big)).amin(1, keepdim=True)
    hi = torch.where(m, data.X, torch.full_like(data.X, -big)).amax(1, keepdim=True)
    span = hi - lo
    X = torch.where(span > 0, (data.X - lo) / torch.where(span > 0, span, torch.ones_like(span)),
                    torch.zeros_like(data.X)) * m
    return LTRData(X, data.relevance, data.mask, data.qids, data.num_grades, data.source)


def load_letor(name: str = "MQ2007", *, fold: int = 1, split: str = "train",
               normalize: str | None = None, cache_dir: str | Path | None = None,
               sha256: str | None = None, download: bool = False,
               archive_sha256: str = MSLR10K_SHA256) -> LTRData:
    """MQ2007 (LETOR 4.0) or MSLR-WEB10K from the fedlab cache: ``<cache>/<name>/Fold<fold>/<split>.txt``.

    The archives are distributed by Microsoft Research and may not be redistributed. Unpack MQ2007
    (a RAR archive) into ``<cache>/MQ2007`` yourself. For MSLR-WEB10K, if the split file is missing,
    ``MSLR-WEB10K.zip`` is taken from the cache or, with ``download=True``, fetched from
    :data:`MSLR10K_URL`; either way it is checked against ``archive_sha256`` (default
    :data:`MSLR10K_SHA256`) and the split file extracted into the cache (atomically, with its digest
    beside it in ``<split>.txt.sha256``). ``sha256`` checks the split file itself; by default the digest
    recorded at extraction is checked, and a split without one (MQ2007, which you unpack yourself) loads
    with an :class:`fedlab.data.download.UnverifiedDataWarning` saying it was not verified. A split that
    does not end with a newline (cut short) raises ``ValueError``. ``normalize``: ``"query"`` (per-query min-max, :func:`normalize_per_query`) or ``None``;
    by default ``"query"`` for MSLR-WEB10K and ``None`` for MQ2007.

    Raises ``ValueError`` for an unknown ``name``/``split``/``normalize``, ``fold`` outside 1..5 or
    a malformed file, :class:`fedlab.data.OfflineError` if the file is not in the cache (and, for
    MSLR-WEB10K, ``download`` is ``False`` or the download fails), and
    :class:`fedlab.data.ChecksumError` on a digest mismatch.
    """
    from ..config import data_dir

    if name not in LETOR_DATASETS:
        raise ValueError(f"name must be one of {sorted(LETOR_DATASETS)}, got {name!r}")
    if split not in ("train", "vali", "test"):
        raise ValueError(f"split must be 'train', 'vali' or 'test', got {split!r}")
    if fold not in (1, 2, 3, 4, 5):
        raise ValueError(f"fold must be in 1..5, got {fold!r}")
    folder, F, G = LETOR_DATASETS[name]
    if normalize is None and name == "MSLR-WEB10K":
        normalize = "query"
    if normalize not in (None, "query"):
        raise ValueError(f"normalize must be 'query' or None, got {normalize!r}")
    root = Path(cache_dir) if cache_dir is not None else data_dir(create=False)
    path = root / folder / f"Fold{fold}" / f"{split}.txt"
    if not path.is_file() and name == "MSLR-WEB10K":
        archive = fetch(MSLR10K_URL, "MSLR-WEB10K.zip", archive_sha256, download=download, cache_dir=root)
        _extract_member(archive, f"Fold{fold}/{split}.txt", path)
    if not path.is_file():
        raise OfflineError(f"{path} not found: download {name} from Microsoft Research, unpack it "
                           f"into {root / folder}, and call load_letor again")
    sidecar = path.with_name(path.name + ".sha256")
    if sha256 is None and sidecar.is_file():      # written when the split was extracted from the verified archive
        sha256 = sidecar.read_text().strip()
    verify_or_warn(path, sha256, f"{name} Fold{fold}/{split}.txt")
    data = read_svmlight(path, num_features=F, num_grades=G, source=name)
    _check_complete(path, name)
    return normalize_per_query(data) if normalize == "query" else data


def _extract_member(archive: Path, suffix: str, target: Path) -> None:
    """Copy the member of ``archive`` whose name ends with ``suffix`` (the archive may or may not
    have a top-level folder) to ``target``. Raises ``ValueError`` if no member matches."""
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if n == suffix or n.endswith("/" + suffix)]
        if not names:
            raise ValueError(f"archive {archive} has no member {suffix!r}")
        member = zf.read(min(names, key=len))      # zipfile checks the member's CRC-32
    # a temporary name unique to this process (two processes extracting on a fresh cache once shared
    # "train.part", and one crashed); the digest of the extracted file goes beside it, so a later load
    # checks the split file by default
    atomic_write_bytes(target.with_name(target.name + ".sha256"), hashlib.sha256(member).hexdigest().encode())
    atomic_write_bytes(target, member)


def _check_complete(path: Path, source: str) -> None:
    """Raise ``ValueError`` when the file at ``path`` does not end with a newline: a LETOR split cut short
    (an interrupted copy, a full disk) ends inside its last line, which would otherwise parse with the cut
    features silently 0."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return                      # read_svmlight names the empty file
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            raise ValueError(f"{source}: {path} does not end with a newline: the file looks truncated "
                             f"(its last line would load with features missing); copy it again")


def synthetic_letor(num_queries: int = 1000, num_features: int = 46, *, min_docs: int = 20,
                    max_docs: int = 60, num_grades: int = 3, latent_dim: int = 8,
                    grade_quantiles: tuple = (0.74, 0.94), seed: int = 0) -> LTRData:
    """An offline stand-in for MQ2007 (the default data of the OLTR chapter).

    Every document has a latent vector ``z ~ N(mu_q, I)`` (``latent_dim``, a per-query offset
    ``mu_q``); its ``num_features`` features are noisy nonlinear views ``tanh(A z) + 0.3 eps`` of
    it, min-max normalised per query (as LETOR's QueryLevelNorm files are). The hidden relevance
    score is ``w^T z + 0.5 (v^T z)^2`` plus noise; grades ``0..num_grades-1`` cut it at the pooled
    quantiles ``grade_quantiles`` (default: 74 % / 20 % / 6 %, close to MQ2007's grade frequencies).
    Documents per query are uniform in ``[min_docs, max_docs]`` (MQ2007: 41.5 on average).

    Raises ``ValueError`` for non-positive sizes, ``min_docs < 2``, ``max_docs < min_docs`` or
    ``len(grade_quantiles) != num_grades - 1``.
    """
    if num_queries < 1 or num_features < 1 or latent_dim < 1:
        raise ValueError(f"num_queries, num_features and latent_dim must be >= 1, got "
                         f"{num_queries}, {num_features}, {latent_dim}")
    if min_docs < 2 or max_docs < min_docs:
        raise ValueError(f"need 2 <= min_docs <= max_docs, got min_docs={min_docs}, max_docs={max_docs}")
    if len(grade_quantiles) != num_grades - 1:
        raise ValueError(f"grade_quantiles must have num_grades - 1 = {num_grades - 1} entries")
    gen = np.random.default_rng(seed)
    A = gen.normal(size=(num_features, latent_dim)) / np.sqrt(latent_dim)
    w, v = gen.normal(size=latent_dim), gen.normal(size=latent_dim) / np.sqrt(latent_dim)
    sizes = gen.integers(min_docs, max_docs + 1, size=num_queries)
    Z = [gen.normal(size=latent_dim) * 0.5 + gen.normal(size=(n, latent_dim)) for n in sizes]
    scores = [z @ w + 0.5 * (z @ v) ** 2 + 0.5 * gen.normal(size=len(z)) for z in Z]
    cuts = np.quantile(np.concatenate(scores), grade_quantiles)
    rows = []
    for z, s in zip(Z, scores):
        x = np.tanh(z @ A.T) + 0.3 * gen.normal(size=(len(z), num_features))
        x = (x - x.min(0)) / (x.max(0) - x.min(0))
        rows.append((np.searchsorted(cuts, s).astype(np.int64), x.astype(np.float32)))
    return _pad(rows, list(range(num_queries)), num_grades, "synthetic")
