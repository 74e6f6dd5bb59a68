"""The matrix's privacy accounting: what each ``dp*`` and ``ldp*`` column guarantees against each row's attacker,
every epsilon from one accountant, the privacy-loss distribution (``dp_accounting.pld``; Koskela et al. 2020,
Doroshenko et al. 2022) -- :func:`central_epsilon`, :func:`ldp_epsilon`, their floating-point-safe twins
(:func:`safe_central_epsilon`, :func:`safe_ldp_epsilon`: the discrete Gaussian's Renyi bound, Canonne, Kamath &
Steinke 2020), :func:`effective_epsilons` per row, :func:`deployment_epsilons`, and the layout a record stores
(:func:`describe_matrix`)."""
from __future__ import annotations

import functools
import math

from ... import models
from ...config import pick
from ...data.letor import synthetic_letor
from ...data.movielens import synthetic_movielens
from ...privacy import dp_fedavg as dpf
from ...privacy import ldp
from ...privacy.registry import DEFENSES, DP_SETTING, LDP_DELTA, dp_noise_multiplier
from .rows import ATTACKS, _attack

__all__ = ["central_epsilon", "ldp_epsilon", "effective_epsilons", "safe_central_epsilon", "safe_ldp_epsilon",
           "deployment_epsilons", "describe_matrix", "ACCOUNTANT", "ldp_noise_ratio"]


@functools.lru_cache(maxsize=None)
def central_epsilon(noise_multiplier: float, sampling_prob: float, num_rounds: int, delta: float) -> float:
    """Client-level epsilon at ``delta`` of DP-FedAvg's event (:func:`fedlab.privacy.dp_fedavg.dp_event`:
    ``num_rounds`` compositions of the Poisson-sampled Gaussian of multiplier ``noise_multiplier``) from
    ``dp_accounting``'s privacy-loss-distribution accountant (``pld.PLDAccountant``, pessimistic
    discretisation: an upper bound; Koskela et al. 2020, Doroshenko et al. 2022), the accountant of every
    epsilon the matrix reports (:func:`effective_epsilons`). Raises ``ValueError`` for
    ``noise_multiplier <= 0``, ``sampling_prob`` outside (0, 1], ``num_rounds < 1`` or ``delta`` outside (0, 1)."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
    if not 0 < sampling_prob <= 1:
        raise ValueError(f"sampling_prob must be in (0, 1], got {sampling_prob}")
    if int(num_rounds) != num_rounds or num_rounds < 1:
        raise ValueError(f"num_rounds must be a positive integer, got {num_rounds}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    from dp_accounting import pld

    acc = pld.PLDAccountant()
    acc.compose(dpf.dp_event(float(noise_multiplier), float(sampling_prob), int(num_rounds)))
    return float(acc.get_epsilon(float(delta)))


def ldp_epsilon(epsilon: float, releases: int) -> float:
    """The epsilon at :data:`LDP_DELTA` of ``releases`` releases of the ``ldp*`` columns' Gaussian (each
    ``(epsilon, LDP_DELTA)``-LDP for sensitivity ``2 C``: noise multiplier
    ``sigma / (2 C) = ldp.gaussian_sigma(epsilon, LDP_DELTA, 1)``), composed by the privacy-loss-distribution
    accountant of :func:`central_epsilon`: for unsampled Gaussian releases its answer is the closed form
    :func:`fedlab.privacy.ldp.gaussian_composed_epsilon` (exact Gaussian-DP composition, Dong, Roth & Su
    2019, Cor. 3.3), which ``dp_accounting``'s ``PLDAccountant`` matches (``tests/test_ldp.py``,
    ``tests/test_matrix_threats.py``) and which stays cheap where the library's discretised distribution
    needs seconds to minutes (``epsilon = 500``). At most ``releases * epsilon``, the basic composition.
    Raises ``ValueError`` for ``epsilon`` not positive and finite or ``releases < 1``."""
    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases must be a positive integer, got {releases}")
    z = ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 1.0)     # checks epsilon
    return ldp.gaussian_composed_epsilon(z, int(releases), LDP_DELTA)


def effective_epsilons(row) -> dict:
    """What the ``dp*`` and ``ldp*`` columns guarantee against the attacker of ``row`` (an :class:`Attack`
    or its key), given the releases it observes (``row.releases()``: ``T`` rounds, sampled with
    probability ``q``), every epsilon from one accountant, the privacy-loss distribution.
    Returns ``{"rounds": T, "sampling_prob": q, "releases": round(T q), "dp": {column: epsilon or None},
    "ldp": {column: epsilon}}``: ``dp`` is :func:`central_epsilon` of the column's ``z`` at ``(q, T)``
    (``None`` for an n/a cell and for an attacker that sees the update before the noise, i.e. every
    observer but the outsider: no guarantee against it), ``ldp`` is :func:`ldp_epsilon`, the per-release
    guarantee composed over the releases (the client adds fresh noise to each message it sends). Raises
    ``ValueError`` for an unknown row."""
    a = _attack(row)
    T, q = a.releases()
    k = max(int(round(T * q)), 1)
    s = DP_SETTING
    dp = {}
    for d in DEFENSES:
        if d.kind == "dp":
            if d.key in a.not_applicable or not a.sees_central_noise:
                dp[d.key] = None
            elif d.safe:
                dp[d.key] = safe_central_epsilon(dp_noise_multiplier(d.param), _SAFE_NUM_PARAMS[a.key](), float(q),
                                                 int(T), s["delta"])
            else:
                dp[d.key] = central_epsilon(dp_noise_multiplier(d.param), float(q), int(T), s["delta"])
    return {"rounds": int(T), "sampling_prob": float(q), "releases": k, "dp": dp,
            "ldp": {d.key: (safe_ldp_epsilon if d.safe else ldp_epsilon)(d.param, k)
                    for d in DEFENSES if d.kind == "ldp"}}


#: an upper bound on the coordinates ``n`` of one client's update in each outsider row (the floating-point-safe
#: DP column's rounding adds ``sqrt(n)`` to the integer sensitivity): the models' sizes, the RAIFLE rows' whole
#: catalogue of item embeddings (a user's update holds at most every item) and the ranker's features
_SAFE_NUM_PARAMS = {
    "dlg_outsider": lambda: models.num_params(models.lenet(1, 10, 8)),
    "ig_outsider": lambda: models.num_params(models.lenet(3, 10, 32, activation="relu")),
    "mia_outsider": lambda: models.num_params(models.mlp(64, (64,), 10)),
    "rs_outsider": lambda: synthetic_movielens(seed=0).num_items * 64,
    "oltr_outsider": lambda: synthetic_letor(pick(quick=300, paper=1000), seed=0).num_features,
}


@functools.lru_cache(maxsize=None)
def safe_central_epsilon(noise_multiplier: float, num_params: int, sampling_prob: float, num_rounds: int,
                         delta: float) -> float:
    """Client-level epsilon at ``delta`` of the floating-point-safe DP-FedAvg column (the discrete Gaussian of
    ``dp_aggregate(..., safe=True)``, default grid ``2^floor(log2(sigma / 1024))``) calibrated with the float
    column's ``noise_multiplier`` ``z`` on updates of at most ``num_params`` coordinates: its true multiplier
    (:func:`fedlab.privacy.dp_fedavg.safe_noise_multiplier`) is at least ``1024 / (1024 / z + sqrt(n))`` for
    every clipping bound (the grid puts ``S / (m grid)`` in ``[1024 / z, 2048 / z)``, and the multiplier grows
    with it), and that lower bound goes to :func:`fedlab.privacy.dp_fedavg.epsilon_spent` with ``safe=True``
    (the discrete Gaussian's Renyi bound, Canonne, Kamath & Steinke 2020, Thm. 14, composed over the rounds
    without amplification by sampling, which ``dp_accounting`` proves for the continuous Gaussian only): an
    upper bound, and larger than :func:`central_epsilon` of the float column. Raises ``ValueError`` for
    ``noise_multiplier <= 0``, ``num_params < 1`` or bad accounting arguments."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
    if int(num_params) != num_params or num_params < 1:
        raise ValueError(f"num_params must be a positive integer, got {num_params}")
    z = 1024.0 / (1024.0 / float(noise_multiplier) + math.sqrt(int(num_params)))
    return float(dpf.epsilon_spent(z, float(sampling_prob), int(num_rounds), float(delta), safe=True))


def safe_ldp_epsilon(epsilon: float, releases: int) -> float:
    """The epsilon at :data:`LDP_DELTA` of ``releases`` releases of a floating-point-safe LDP column
    (``ldp.ldp_gaussian(..., safe=True)``: the discrete Gaussian calibrated to ``(epsilon, LDP_DELTA)`` per
    release at its integer sensitivity, :func:`fedlab.privacy.discrete_gaussian.discrete_gaussian_sigma2`),
    composed by the discrete Gaussian's Renyi bound (:func:`fedlab.privacy.discrete_gaussian.discrete_gaussian_epsilon`;
    ``dp_accounting``'s PLD covers the continuous Gaussian only). The per-release variance is the least integer
    that gives ``epsilon`` at sensitivity ``2^10`` (a finer grid than any release's, so at most the release's
    ratio of variance to squared sensitivity: an upper bound). One release gives at most ``epsilon``. Raises
    ``ValueError`` for ``epsilon`` not positive and finite or ``releases < 1``."""
    from ...privacy import discrete_gaussian as dg

    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases must be a positive integer, got {releases}")
    ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 1.0)     # checks epsilon
    if releases == 1:
        return float(epsilon)
    sens = 2.0 ** 10
    s2 = dg.discrete_gaussian_sigma2(float(epsilon), LDP_DELTA, sens)
    return float(dg.discrete_gaussian_epsilon(s2, sens, LDP_DELTA, compositions=int(releases)))


def deployment_epsilons() -> dict:
    """``{dp column: epsilon}``: what the privacy-loss-distribution accountant (:func:`central_epsilon`) charges
    the deployment :data:`DP_SETTING` that each ``dp*`` column's ``z`` was calibrated for (by the RDP
    accountant, as in Chapter 1d: the column's label; PLD is tighter, so at most the label)."""
    s = DP_SETTING
    return {d.key: central_epsilon(dp_noise_multiplier(d.param), s["sampling_prob"], s["num_rounds"], s["delta"])
            for d in DEFENSES if d.kind == "dp"}


def describe_matrix() -> dict:
    """The matrix's layout for the record: rows (key, label, chapter, metric, direction, threat, baseline,
    n/a reasons, secure-aggregation group, cell notes, :func:`effective_epsilons`) and columns (key,
    label), and the DP settings."""
    return {"rows": [{"key": a.key, "label": a.label, "chapter": a.chapter, "metric": a.metric,
                      "higher_is_success": a.higher_is_success, "threat": a.threat, "baseline": a.baseline,
                      "not_applicable": dict(a.not_applicable), "secagg_group": a.secagg_group,
                      "cell_notes": dict(a.cell_notes), "epsilons": effective_epsilons(a), "observer": a.observer,
                      "value_range": [_json_bound(v) for v in a.value_range]} for a in ATTACKS],
            "columns": [{"key": d.key, "label": d.label} for d in DEFENSES],
            "dp_setting": dict(DP_SETTING), "ldp_delta": LDP_DELTA, "accountant": ACCOUNTANT,
            "dp_noise_multipliers": {d.key: dp_noise_multiplier(d.param) for d in DEFENSES if d.kind == "dp"},
            "dp_deployment_epsilons": deployment_epsilons()}


#: the accountant of every epsilon in the record (central and local DP alike)
ACCOUNTANT = "privacy-loss distribution (dp_accounting.pld; unsampled Gaussian compositions in its exact closed form)"


def _json_bound(v: float) -> float | None:
    """A range bound for JSON (which has no infinity): ``None`` for an infinite one."""
    return None if math.isinf(v) else float(v)


def ldp_noise_ratio(epsilon: float, num_params: int) -> float:
    """The expected norm of the ``ldp*`` columns' noise over the clipping bound ``C``: ``sigma sqrt(n) / C``
    with ``sigma`` the Gaussian noise of :func:`fedlab.privacy.ldp.ldp_gaussian` for sensitivity ``2 C``
    and ``n = num_params`` coordinates (the noise's norm concentrates there). Raises ``ValueError`` for
    ``epsilon <= 0`` or ``num_params < 1``."""
    if int(num_params) != num_params or num_params < 1:
        raise ValueError(f"num_params must be a positive integer, got {num_params}")
    return float(ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 2.0) * math.sqrt(int(num_params)))
