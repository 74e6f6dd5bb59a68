"""Local differential privacy for batched user updates (RAIFLE, Section 4.1.1 "With LDP" and App. C.4).

Each user clips its update to L2 norm ``Delta_2 / 2`` and adds Gaussian noise calibrated to
``(epsilon, delta)`` for L2 sensitivity ``Delta_2`` (under local DP any two updates are neighbours,
so a norm bound ``C`` means sensitivity ``2 C``). Calibration follows RAIFLE: the analytic Gaussian mechanism of Balle & Wang
(2018) for ``epsilon > 1`` -- taken from Google's maintained ``dp_accounting`` library, whose
privacy-loss-distribution accountant is exact for one Gaussian release -- and the classical
``sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon`` of Dwork & Roth (2014, Thm. A.1) for
``epsilon <= 1``. The default noise is floating-point-safe: ``ldp_gaussian(..., safe=True)`` uses the
discrete Gaussian of :mod:`fedlab.privacy.discrete_gaussian` on a public grid (Canonne, Kamath &
Steinke 2020). RAIFLE's float mechanism, :func:`fedlab.privacy.defenses.gaussian_noise` added in
floating point, is ``safe=False`` (not private on its float output; Chapters 3b, 3c and 3d pass it to
reproduce the paper's setting); pruning per
user is :func:`fedlab.privacy.defenses.prune_rows` and clipping :func:`fedlab.privacy.clipping.clip_rows`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

# scipy.stats is imported inside the two functions that use it (~1.5 s of CPU for every importer of fedlab.privacy)

from .clipping import clip_rows
from .defenses import gaussian_noise

__all__ = ["LdpGaussian", "classical_gaussian_sigma", "analytic_gaussian_sigma", "gaussian_sigma",
           "analytic_gaussian_delta", "ldp_clip_norm", "ldp_gaussian", "ldp_noise_multiplier",
           "gaussian_composed_epsilon", "gdp_mu_to_distinguish"]


def _check(epsilon, delta, sensitivity):
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity}")


@dataclass(frozen=True)
class LdpGaussian:
    """The users' local Gaussian mechanism of RAIFLE (Pham, Kulkarni & Houmansadr, Sec. 4.1.1 "With LDP"; App.
    C.6): each user clips its update to :func:`ldp_clip_norm` ``(sensitivity)`` and adds noise for
    ``(epsilon, delta)`` (:func:`ldp_gaussian`). One settings object, so that a page shows it in one line,
    ``LdpGaussian(epsilon=10.0)``.

    ``epsilon``
        the privacy budget of one release (finite, ``> 0``).
    ``delta``
        in (0, 1); default ``1e-8``, RAIFLE's.
    ``sensitivity``
        the L2 sensitivity ``Delta_2`` (finite, ``> 0``); default ``0.5``, RAIFLE's for OLTR (its recommender
        values are 100 for FCF items, 0.005 for FNCF items and 0.7 for FNCF parameters).

    Raises ``ValueError`` naming the field for an ``epsilon`` or ``sensitivity`` that is not finite and
    ``> 0``, or a ``delta`` outside (0, 1).
    """

    epsilon: float
    delta: float = 1e-8
    sensitivity: float = 0.5

    def __post_init__(self):
        for name in ("epsilon", "sensitivity"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"LdpGaussian.{name} must be a finite number > 0, got {v!r}")
        if isinstance(self.delta, bool) or not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"LdpGaussian.delta must be in (0, 1), got {self.delta!r}")


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork & Roth (2014, Thm. A.1): ``sigma = sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon``
    (a valid guarantee for ``epsilon <= 1``). Raises ``ValueError`` for ``epsilon <= 0``,
    ``delta`` outside (0, 1) or ``sensitivity <= 0``."""
    _check(epsilon, delta, sensitivity)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest ``sigma`` for which one Gaussian release with L2 sensitivity ``sensitivity`` is
    ``(epsilon, delta)``-DP (Balle & Wang 2018, analytic Gaussian mechanism), computed with
    ``dp_accounting.pld.accountant.get_smallest_gaussian_noise``. Raises ``ValueError`` on bad input."""
    _check(epsilon, delta, sensitivity)
    return _smallest_gaussian_noise(float(epsilon), float(delta), float(sensitivity))


@functools.lru_cache(maxsize=1024)
def _smallest_gaussian_noise(epsilon: float, delta: float, sensitivity: float) -> float:
    """dp_accounting's answer for one Gaussian release, remembered: a deterministic function of its
    three floats that costs about 30 ms (scipy distributions built inside a search), and a federated
    run under LDP asks for the same ``(epsilon, delta, sensitivity)`` every round."""
    from dp_accounting.pld import accountant, common

    params = common.DifferentialPrivacyParameters(epsilon, delta)
    return float(accountant.get_smallest_gaussian_noise(params, num_queries=1, sensitivity=sensitivity))


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """The exact ``delta(epsilon)`` of the Gaussian mechanism (Balle & Wang 2018, Thm. 8):
    ``Phi(D/(2s) - e s/D) - exp(e) Phi(-D/(2s) - e s/D)`` with ``D = sensitivity``, ``s = sigma``.
    The second term is computed as ``exp(e + log Phi(...))``, so ``epsilon`` in the thousands does not
    overflow. Raises ``ValueError`` for ``sigma`` or ``sensitivity`` not positive and finite,
    ``epsilon`` negative or not finite."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    if not math.isfinite(sigma) or not math.isfinite(sensitivity):
        raise ValueError(f"sigma and sensitivity must be finite, got {sigma}, {sensitivity}")
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    from scipy.stats import norm

    return float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b)))


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0, *,
                   method: str = "auto") -> float:
    """Noise scale as in RAIFLE Sec. 4.1.1: ``method="auto"`` uses the analytic Gaussian for
    ``epsilon > 1`` and the classical formula for ``epsilon <= 1``; ``"analytic"`` or
    ``"classical"`` force one. Raises ``ValueError`` naming the argument for an unknown method or bad
    parameters (non-finite ones included: an infinite ``sensitivity`` would never calibrate)."""
    if method not in ("auto", "analytic", "classical"):
        raise ValueError(f"method must be 'auto', 'analytic' or 'classical', got {method!r}")
    _check(epsilon, delta, sensitivity)
    if method == "classical" or (method == "auto" and epsilon <= 1.0):
        return classical_gaussian_sigma(epsilon, delta, sensitivity)
    return analytic_gaussian_sigma(epsilon, delta, sensitivity)


def ldp_clip_norm(sensitivity: float) -> float:
    """The L2 norm each user clips its update to so that the update has L2 sensitivity
    ``sensitivity`` under local DP: ``sensitivity / 2``. Under LDP the neighbouring inputs are *any*
    two updates of one user, and two vectors of norm at most ``C`` differ by up to ``2 C``. RAIFLE
    fixes the sensitivity ``Delta_2`` (Sec. 4.1.1: 0.5 for OLTR; 100, 0.005, 0.7 for FCF items,
    FNCF items, FNCF parameters) and its reference code clips to ``Delta_2 / 2``. Raises
    ``ValueError`` unless ``sensitivity > 0``."""
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    return float(sensitivity) / 2.0


def ldp_gaussian(update: torch.Tensor, epsilon: float, delta: float, sensitivity: float, *,
                 mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 safe: bool = True, grid: float | None = None) -> torch.Tensor:
    """The local Gaussian mechanism of RAIFLE Sec. 4.1.1, ``(epsilon, delta)``-LDP for each user.

    ``safe=True`` (the default): the discrete Gaussian mechanism on a public grid
    (:func:`fedlab.privacy.discrete_gaussian.discrete_gaussian_release`, Canonne, Kamath & Steinke
    2020; ``grid`` defaults to :func:`~fedlab.privacy.discrete_gaussian.choose_grid`), calibrated with
    the rounding's extra sensitivity; ``(epsilon, delta)``-LDP on its real output. It adds a little
    more noise than the float mechanism (its Renyi accounting is looser than the analytic Gaussian's,
    and rounding inflates the sensitivity by ``grid sqrt(n) / sensitivity``). Its noise is drawn from
    a numpy generator seeded from ``generator``.
    ``safe=False``: the float mechanism, RAIFLE's (Chapters 3b, 3c and 3d pass it): continuous Gaussian
    noise added in floating point. Its guarantee holds for the real-valued mechanism only: on its
    float32 output :func:`fedlab.attacks.floating_point.distinguishing_event_probabilities` finds an
    event of probability about 0.19 under one input and 0 under a neighbouring one at
    ``(epsilon, delta) = (2, 1e-5)`` (``tests/test_ldp.py``), so no ``delta`` below that holds.

    Each user clips its whole update to L2 norm :func:`ldp_clip_norm` ``(sensitivity) =
    sensitivity / 2`` (any two clipped updates then differ by at most ``sensitivity`` in L2); the float
    mechanism adds ``N(0, sigma^2)`` to every coordinate with ``sigma = gaussian_sigma(epsilon, delta,
    sensitivity)``. ``tests/test_ldp.py`` checks its output against the claimed ``(epsilon, delta)``
    with the exact privacy-loss distribution of two worst-case inputs.

    ``update`` [U, ...] (row u = user u's whole tensor); ``mask`` [U, m] marks real item rows of a
    padded ``[U, m, d]`` update (padding stays 0: it is never sent). Returns a tensor of the same
    shape. Raises ``ValueError`` on bad privacy parameters, a ``mask`` of the wrong shape, or an
    ``epsilon`` so small that the noise overflows the update's dtype.
    """
    sigma = gaussian_sigma(epsilon, delta, sensitivity)
    if mask is not None and tuple(mask.shape) != tuple(update.shape[:mask.dim()]):
        raise ValueError(f"mask must have shape {tuple(update.shape[:mask.dim()])}, got {tuple(mask.shape)}")
    clipped = clip_rows(update, ldp_clip_norm(sensitivity))
    if safe:
        from .discrete_gaussian import discrete_gaussian_release

        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
        noisy = discrete_gaussian_release(clipped.detach(), epsilon, delta, sensitivity, grid=grid, rng=seed)
        if mask is not None:
            noisy = noisy * mask.reshape(*mask.shape, *([1] * (update.dim() - mask.dim()))).to(noisy.dtype)
        return noisy
    try:
        noisy = gaussian_noise(clipped, sigma, generator=generator)
    except ValueError as err:
        if "overflows" not in str(err):
            raise
        raise ValueError(f"epsilon={epsilon} is too small for {update.dtype}: its noise sigma={sigma:g} "
                         f"overflows (use float64 or a larger epsilon)") from None
    if mask is not None:
        noisy = noisy * mask.reshape(*mask.shape, *([1] * (update.dim() - mask.dim()))).to(noisy.dtype)
    return noisy


def ldp_noise_multiplier(sigma: float, clip_norm: float, num_rows: int = 1) -> float:
    """The noise multiplier (noise std over L2 sensitivity) of a release that clips each of
    ``num_rows`` rows to L2 norm ``clip_norm`` and adds ``N(0, sigma^2)`` to every coordinate, under
    local DP: any two inputs are neighbours, so each clipped row may change by ``2 clip_norm`` and
    the whole release by ``2 clip_norm sqrt(num_rows)``. This is ``sigma / (2 clip_norm sqrt(num_rows))``,
    the ``noise_multiplier`` of ``dp_accounting.GaussianDpEvent``. (London 2020, footnote 5: Eq. (3)
    with clipping is this mechanism, with ``num_rows`` the items one message changes.) Raises
    ``ValueError`` naming the argument for ``sigma`` or ``clip_norm`` not positive and finite, or
    ``num_rows < 1``."""
    for name, value in (("sigma", sigma), ("clip_norm", clip_norm)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    if int(num_rows) != num_rows or num_rows < 1:
        raise ValueError(f"num_rows must be a positive integer, got {num_rows}")
    return float(sigma) / (2.0 * float(clip_norm) * math.sqrt(int(num_rows)))


def gaussian_composed_epsilon(noise_multiplier: float, num_compositions: int, delta: float) -> float:
    """``epsilon`` at ``delta`` of ``T = num_compositions`` adaptive compositions of a Gaussian
    mechanism with noise multiplier ``z = noise_multiplier`` (std over L2 sensitivity).

    The composition is exactly one Gaussian mechanism of multiplier ``z / sqrt(T)`` (Dong, Roth & Su
    2019, Cor. 3.3: ``T`` compositions of ``(1/z)``-GDP are ``(sqrt(T)/z)``-GDP, and a Gaussian
    mechanism's privacy profile is its GDP curve), whose ``delta(epsilon)`` is
    :func:`analytic_gaussian_delta`; this solves ``delta(epsilon) = delta`` for ``epsilon`` (0 when one
    release is already ``(0, delta)``-DP). It is what ``dp_accounting``'s privacy-loss-distribution
    accountant returns for ``SelfComposedDpEvent(GaussianDpEvent(z), T)``: ``tests/test_ldp.py``
    checks the two against each other, and against the Renyi accountant's upper bound. (The PLD
    accountant itself needs memory growing like ``T / z^2`` and fails at the ``T`` of the attacks
    Chapter 2b prices; this closed form does not.) Raises ``ValueError`` for ``noise_multiplier`` not
    positive and finite, ``num_compositions < 1`` or ``delta`` outside (0, 1)."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
    if int(num_compositions) != num_compositions or num_compositions < 1:
        raise ValueError(f"num_compositions must be a positive integer, got {num_compositions}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    from scipy.optimize import brentq

    sens = math.sqrt(int(num_compositions))
    f = lambda e: analytic_gaussian_delta(float(noise_multiplier), e, sens) - float(delta)   # noqa: E731
    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
    return float(brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12))


def gdp_mu_to_distinguish(success: float) -> float:
    """The smallest Gaussian-DP parameter ``mu`` at which *some* attack tells two neighbouring inputs
    apart with probability ``success`` under each (both error rates ``<= 1 - success``):
    ``2 Phi^{-1}(success)``. A ``mu``-GDP mechanism allows at best the trade-off
    ``beta = Phi(Phi^{-1}(1 - alpha) - mu)`` (Dong, Roth & Su 2019, Def. 2.7); setting
    ``alpha = beta = 1 - success`` gives the value. Below it no attack reaches ``success`` on that pair,
    whatever it computes. Raises ``ValueError`` unless ``1/2 < success < 1``."""
    if not 0.5 < success < 1:
        raise ValueError(f"success must lie in (1/2, 1), got {success}")
    from scipy.stats import norm

    return float(2.0 * norm.ppf(success))
