"""Clustered federated tasks: clients whose data come from one of k distributions.

* :func:`synthetic_linear_clusters` -- the two-cluster linear regression of Galli et al. (Sec. 4.1):
  ``y = x^T theta_j* + u``, ``u ~ U[0, 1)``, ``theta_1* = [5, 6]``, ``theta_2* = [4, -4.5]``.
* :func:`rotated_digits_clients` -- scikit-learn digits dealt to clients, each client's images rotated
  by 90 degrees with probability 1/2 (the rotation trick Galli et al. apply to FEMNIST, Sec. 4.3,
  after Ghosh et al. 2020).
* :func:`diabetes_clients` -- scikit-learn's bundled diabetes regression data (real, offline) dealt to
  small "clinics" of patients of one sex and similar age: the offline stand-in for the paper's
  hospital-charge clients (Sec. 4.2).
* :func:`load_cms_inpatient` -- the CMS inpatient charge data (Galli et al., Sec. 4.2 and appendix):
  a real loader for the CSV format, cached and never downloaded unless asked.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from . import Dataset, load_digits
from .download import fetch, verify_or_warn

__all__ = ["THETA_STAR", "synthetic_linear_clusters", "rotated_digits_clients", "DIABETES_INPUTS",
           "DIABETES_TARGET_SCALE", "diabetes_clients", "CMS_URL",
           "CMS_FILENAME", "CMS_CONDITIONS", "load_cms_inpatient"]

#: optimal parameters of the two synthetic clusters (Galli et al., Sec. 4.1)
THETA_STAR = torch.tensor([[5.0, 6.0], [4.0, -4.5]])


def synthetic_linear_clusters(num_clients: int = 100, samples_per_client: int = 10, *,
                              theta_star: torch.Tensor | None = None, seed: int = 0,
                              x_low: float = -1.0, x_high: float = 1.0):
    """Clients of the synthetic regression of Galli et al. (Sec. 4.1 and appendix "Synthetic Data").

    Client ``c`` belongs to cluster ``j`` (alternating, so the clusters are balanced) and holds
    ``samples_per_client`` pairs with ``x ~ U[x_low, x_high)^n`` and ``y = x^T theta_j* + u``,
    ``u ~ U[0, 1)``. The paper does not state the law of ``x``; with the default centred ``x``
    independent of ``u``, ``theta_j*`` is still the least-squares optimum of a model without
    intercept, and the irreducible RMSE is ``sqrt(E u^2) = 1/sqrt(3)``. (With ``x`` of unit variance
    one SGD step of size 0.1 contracts so fast that the relative noise of SanitizeUpdate at
    ``nu = 5`` makes private training diverge: see the chapter's exercise.)

    Returns
    -------
    clients : list of :class:`Dataset` with ``X`` float32 ``[samples_per_client, n]`` and ``y`` float32
        ``[samples_per_client]``.
    membership : int64 array ``[num_clients]``, the true cluster of each client.

    Raises ``ValueError`` on non-positive sizes or a ``theta_star`` that is not ``[k, n]``.
    """
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
    if int(samples_per_client) != samples_per_client or samples_per_client < 1:
        raise ValueError(f"samples_per_client must be a positive integer, got {samples_per_client}")
    ts = THETA_STAR if theta_star is None else torch.as_tensor(theta_star, dtype=torch.float32)
    if ts.ndim != 2:
        raise ValueError(f"theta_star must have shape [k, n], got {tuple(ts.shape)}")
    k, n = ts.shape
    g = torch.Generator().manual_seed(seed)
    membership = np.arange(num_clients) % k
    if not x_high > x_low:
        raise ValueError(f"x_high must exceed x_low, got [{x_low}, {x_high})")
    X = x_low + (x_high - x_low) * torch.rand(num_clients, samples_per_client, n, generator=g)
    u = torch.rand(num_clients, samples_per_client, generator=g)
    y = torch.einsum("csn,cn->cs", X, ts[torch.from_numpy(membership)]) + u
    clients = [Dataset(X[c], y[c], [f"x{i}" for i in range(n)], {"cluster": int(membership[c])})
               for c in range(num_clients)]
    return clients, membership


def rotated_digits_clients(num_clients: int = 60, *, p_rotate: float = 0.5, seed: int = 0,
                           flatten: bool = True):
    """Digits dealt iid to ``num_clients`` clients; each client's images are rotated 90 degrees
    counter-clockwise when ``rot_c ~ Bernoulli(p_rotate)`` is 1 (Galli et al., appendix "FEMNIST";
    Ghosh et al. 2020). Labels are unchanged, so the two groups need different models.

    Returns ``(clients, rotated)``: a list of :class:`Dataset` (``X`` ``[n_c, 64]`` or
    ``[n_c, 1, 8, 8]``) and a bool array ``[num_clients]``.

    Raises ``ValueError`` if ``p_rotate`` is outside ``[0, 1]`` or ``num_clients`` is invalid.
    """
    from . import partition_iid

    if not 0.0 <= p_rotate <= 1.0:
        raise ValueError(f"p_rotate must be in [0, 1], got {p_rotate}")
    digits = load_digits(flatten=False)
    parts = partition_iid(len(digits), num_clients, seed=seed)
    rotated = np.random.default_rng(seed + 1).random(num_clients) < p_rotate
    clients = []
    for c, idx in enumerate(parts):
        X = digits.X[torch.from_numpy(idx)]
        if rotated[c]:
            X = torch.rot90(X, k=1, dims=(-2, -1))
        if flatten:
            X = X.reshape(len(X), -1)
        clients.append(Dataset(X.contiguous(), digits.y[torch.from_numpy(idx)], [],
                               {"rotated": bool(rotated[c])}))
    return clients, rotated


#: inputs of :func:`diabetes_clients`: column of scikit-learn's unscaled diabetes data -> (reference,
#: scale), fixed round constants (body-mass index in kg/m^2, mean blood pressure in mm Hg, log serum
#: triglycerides), never estimated from the clients' data
DIABETES_INPUTS = {"bmi": (25.0, 5.0), "bp": (90.0, 15.0), "s5": (4.5, 0.5)}
#: the target (disease progression after one year, 25..346) is divided by this constant
DIABETES_TARGET_SCALE = 100.0


def diabetes_clients(patients_per_client: int = 4, *, inputs: dict | None = None, seed: int = 0):
    """scikit-learn's diabetes data (442 patients, real, shipped in the wheel) as clinics: the offline
    stand-in for the hospital-charge clients of Galli et al. (Sec. 4.2 and appendix), whose providers
    hold at most four rows each.

    How the clients are formed: the patients are sorted by sex, then age, and dealt in consecutive
    blocks of about ``patients_per_client`` (``numpy.array_split`` into ``442 // patients_per_client``
    blocks), so a clinic serves patients of one sex and similar age; sex and age are *not* inputs,
    so they act as the hidden group the hypotheses may pick up. Inputs are the columns of ``inputs``
    (default :data:`DIABETES_INPUTS`: BMI, blood pressure, log triglycerides) as ``(x - reference) /
    scale`` with fixed constants, and the target is progression / :data:`DIABETES_TARGET_SCALE`:
    like the paper, no normalisation estimated from the data. The clinics are returned in an order
    shuffled with ``seed``, so any prefix is a random subset (e.g. 70 % for training, the paper's split).

    Returns ``(clients, info)``: a list of :class:`Dataset` (``X`` float32 ``[n_c, len(inputs)]``, ``y``
    float32 ``[n_c]``) and a dict of arrays ``[K]``: ``"sex"`` (1 or 2, the majority in the clinic),
    ``"age"`` (mean age). Raises ``ValueError`` for ``patients_per_client`` outside ``[1, 221]`` or an
    unknown input column."""
    from sklearn.datasets import load_diabetes

    if isinstance(patients_per_client, bool) or int(patients_per_client) != patients_per_client \
            or not 1 <= patients_per_client <= 221:
        raise ValueError(f"patients_per_client must be an integer in [1, 221], got {patients_per_client!r}")
    inputs = DIABETES_INPUTS if inputs is None else dict(inputs)
    raw = load_diabetes(scaled=False)
    names = list(raw.feature_names)
    unknown = [c for c in inputs if c not in names]
    if unknown or not inputs:
        raise ValueError(f"inputs must name columns among {names}, got {list(inputs)}")
    data, target = raw.data, raw.target
    sex, age = data[:, names.index("sex")], data[:, names.index("age")]
    order = np.lexsort((age, sex))
    ref = np.array([inputs[c][0] for c in inputs])
    scale = np.array([inputs[c][1] for c in inputs])
    X_all = (data[:, [names.index(c) for c in inputs]] - ref) / scale
    blocks = np.array_split(order, len(order) // int(patients_per_client))
    perm = np.random.default_rng(seed).permutation(len(blocks))
    clients, info = [], {"sex": np.zeros(len(blocks), dtype=np.int64), "age": np.zeros(len(blocks))}
    for c, b in enumerate(blocks[i] for i in perm):
        info["sex"][c] = int(np.round(np.median(sex[b])))
        info["age"][c] = float(age[b].mean())
        clients.append(Dataset(torch.tensor(X_all[b], dtype=torch.float32),
                               torch.tensor(target[b] / DIABETES_TARGET_SCALE, dtype=torch.float32),
                               list(inputs), {"sex": int(info["sex"][c]), "age": info["age"][c]}))
    return clients, info


# ------------------------------------------------------------------------------------------------
# CMS inpatient charges (Galli et al., Sec. 4.2)
# ------------------------------------------------------------------------------------------------
#: Inpatient Prospective Payment System provider summary for the top 100 DRGs, FY2011 (data.cms.gov)
CMS_URL = ("https://data.cms.gov/provider-summary-by-type-of-service/medicare-inpatient-hospitals/"
           "medicare-inpatient-hospitals-by-provider-and-service")
CMS_FILENAME = "Inpatient_Prospective_Payment_System__IPPS__Provider_Summary_for_the_Top_100_DRG.csv"
#: the four most treated conditions the paper keeps (appendix, "Hospital Charge Data", item i)
CMS_CONDITIONS = (
    "194 - SIMPLE PNEUMONIA & PLEURISY W CC",
    "690 - KIDNEY & URINARY TRACT INFECTIONS W/O MCC",
    "292 - HEART FAILURE & SHOCK W CC",
    "392 - ESOPHAGITIS, GASTROENT & MISC DIGEST DISORDERS W/O MCC",
)
_COLS = {"drg": "DRG Definition", "provider": "Provider Id", "zip": "Provider Zip Code",
         "payment": "Average Total Payments"}


def _money(s: str) -> float:
    return float(s.replace("$", "").replace(",", "").strip())


def load_cms_inpatient(path: str | Path | None = None, *, zip_coords: dict | None = None,
                       conditions=CMS_CONDITIONS, sha256: str | None = None, download: bool = False,
                       payment_scale: float = 1e4):
    """Per-provider clients of the CMS inpatient charge data (Galli et al., Sec. 4.2 and appendix).

    Reads the CSV of the IPPS provider summary (columns ``DRG Definition``, ``Provider Id``,
    ``Provider Zip Code``, ``Average Total Payments``, ...; leading/trailing spaces in headers and
    ``$`` signs in amounts are tolerated). Keeps the rows of ``conditions`` and builds, per provider,
    inputs ``[condition index, longitude, latitude]`` and target ``Average Total Payments``, all
    brought to the range of units by fixed constants (longitude/100, latitude/100,
    payment/``payment_scale``), as the paper does instead of data-dependent standardisation.

    Parameters
    ----------
    path : path, optional
        A CSV file; by default ``CMS_FILENAME`` in :func:`fedlab.data_dir`, obtained through
        :func:`fedlab.data.download.fetch` (offline unless ``download=True``).
    zip_coords : dict, optional
        ``{zip: (longitude, latitude)}``.
        ZIP-code geocoding (the paper's step ii). ZIP codes missing from it drop their rows; without it
        the 5-digit ZIP divided by 1e5 replaces both coordinates (a crude but monotone location).
    conditions : sequence of str
        DRG definitions to keep, in the order that defines the condition index.

    Returns
    -------
    tuple
        ``(clients, provider_ids)``: a list of :class:`Dataset` (``X`` float32 ``[n_c, 3]``, ``y`` float32
        ``[n_c]``) and the matching provider ids.

    Raises
    ------
    fedlab.data.download.OfflineError
        If the file is not cached and ``download`` is False.
    fedlab.data.download.UnverifiedDataWarning
        When no ``sha256`` is given: the file is loaded, but said NOT to be verified.
    ValueError
        If a required column is missing, a row has fewer fields than the header (a truncated file), or
        no row matches ``conditions``, or the digest differs from ``sha256`` (a ``ChecksumError``), or ``download=True`` without
        ``sha256``: CMS publishes no checksum for the file and :data:`CMS_URL` is a landing page, so a
        download must be checked against a digest you computed for the CSV you chose.
    """
    if path is None:
        path = fetch(CMS_URL, CMS_FILENAME, sha256, download=download)
    path = Path(path)
    verify_or_warn(path, sha256, "the CMS inpatient CSV")
    cond_index = {c.strip().upper(): i for i, c in enumerate(conditions)}
    per_provider: dict[str, list] = {}
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader)]
        missing = [v for v in _COLS.values() if v not in header]
        if missing:
            raise ValueError(f"CSV at {path} lacks required column(s) {missing}")
        col = {k: header.index(v) for k, v in _COLS.items()}
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue                    # a blank line
            if len(row) < len(header):
                # a row cut short (a truncated file) was once skipped silently, dropping providers
                raise ValueError(f"CSV at {path}, line {reader.line_num}: {len(row)} fields, the header has "
                                 f"{len(header)}: the file looks truncated or malformed")
            j = cond_index.get(row[col["drg"]].strip().upper())
            if j is None:
                continue
            z = row[col["zip"]].strip().zfill(5)
            if zip_coords is not None:
                if z not in zip_coords and int(z) not in zip_coords:
                    continue
                lon, lat = zip_coords.get(z, zip_coords.get(int(z)))
                loc = (float(lon) / 100.0, float(lat) / 100.0)
            else:
                loc = (int(z) / 1e5, int(z) / 1e5)
            feats = [float(j), *loc]
            per_provider.setdefault(row[col["provider"]].strip(), []).append(
                (feats, _money(row[col["payment"]]) / payment_scale))
    if not per_provider:
        raise ValueError(f"no row of {path} matches the conditions {list(conditions)}")
    ids = sorted(per_provider)
    clients = []
    for pid in ids:
        rows = per_provider[pid]
        X = torch.tensor([r[0] for r in rows], dtype=torch.float32)
        y = torch.tensor([r[1] for r in rows], dtype=torch.float32)
        clients.append(Dataset(X, y, ["condition", "longitude", "latitude"], {"provider": pid}))
    return clients, ids
