"""The mechanism and the accountant of client-level differentially private FedAvg (McMahan, Ramage,
Talwar & Zhang 2018, "Learning differentially private recurrent language models", Algorithm 1
"DP-FedAvg"; Shokri's CS5562 lecture, "Client-level differentially private federated averaging").
The round loop that uses them is :func:`fedlab.fl.dp_fedavg.dp_fedavg` (``privacy`` imports nothing
from ``fl``).

The server is trusted. Each round it

1. samples every client independently with probability ``q`` (Poisson sampling);
2. lets each sampled client run ClientUpdate and return its update ``Delta_k = theta_k - theta``;
3. clips each update to L2 norm ``S`` (:func:`fedlab.privacy.clipping.clip_updates`), so that one client moves the
   sum by at most ``S``;
4. averages with the *fixed* denominator ``m = q K`` (the expected number of sampled clients; the
   estimator ``f~_f`` of the paper with equal client weights) and adds Gaussian noise of standard
   deviation ``sigma = z S / m`` per coordinate (``z`` is the noise multiplier);
5. applies ``theta <- theta + server_lr * (noisy average)``.

Each round is a Poisson-subsampled Gaussian mechanism on the *set of clients*; its (epsilon, delta)
after ``T`` rounds comes from Google's ``dp_accounting`` library (Renyi DP accountant of Mironov 2017,
with the subsampling analysis of Mironov, Talwar & Zhang 2019). Nothing here re-derives the
accounting by hand.

The default noise is floating-point-safe (``safe=True`` in :func:`dp_aggregate`,
:func:`epsilon_spent` and :func:`noise_multiplier_for_epsilon`): the discrete Gaussian on a public grid
(Canonne, Kamath & Steinke 2020), accounted by its Renyi bound (CKS20 Thm. 14) without amplification
by sampling. The continuous Gaussian of McMahan et al. (``safe=False``, "the float mechanism") stays
for the chapters that reproduce a paper's setting; its guarantee holds for real-valued noise only and
fails on its float32 output (Mironov 2012; Chapter 5, ``tests/test_dp_fedavg.py``).
"""
from __future__ import annotations

import torch

from .clipping import clip_updates
from .defenses import gaussian_noise

#: Renyi orders used by every accountant here (integers: fast and numerically stable for the
#: Poisson-subsampled Gaussian; the fractional orders below 2 only matter for epsilon << 1)
RDP_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 256, 512)

#: the default grid of the safe mechanism is ``2^floor(log2(sigma / SAFE_GRID_RATIO))``: ``sigma / grid`` in
#: ``[SAFE_GRID_RATIO, 2 SAFE_GRID_RATIO)``
SAFE_GRID_RATIO = 1024

__all__ = ["RDP_ORDERS", "SAFE_GRID_RATIO", "check_delta", "delta_for", "check_dp_args", "noise_std",
           "dp_aggregate", "dp_event", "epsilon_spent", "noise_multiplier_for_epsilon", "discrete_noise",
           "safe_grid", "safe_noise_multiplier", "safe_noise_multiplier_bound"]


def check_dp_args(noise_multiplier: float, clip_norm: float | None, expected_clients: float) -> None:
    """Validate DP-FedAvg's mechanism arguments: raises ``ValueError`` naming ``noise_multiplier``
    unless it is ``>= 0``, ``clip_norm`` unless it is ``> 0`` or ``None`` (no clipping), and
    ``expected_clients`` unless it is ``> 0``."""
    if isinstance(noise_multiplier, bool) or not (noise_multiplier >= 0 and noise_multiplier < float("inf")):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 (or None for no clipping), got {clip_norm}")
    if not expected_clients > 0:
        raise ValueError(f"expected_clients must be > 0, got {expected_clients}")


def noise_std(noise_multiplier: float, clip_norm: float, expected_clients: float) -> float:
    """Per-coordinate standard deviation of the server's noise on the averaged update:
    ``sigma = z * S / m`` (McMahan et al. 2018, Alg. 1, ``sigma = z S / (q W)`` with unit weights)."""
    check_dp_args(noise_multiplier, clip_norm, expected_clients)
    if clip_norm is None:
        raise ValueError("clip_norm must be > 0 to define the noise scale")
    return float(noise_multiplier) * float(clip_norm) / float(expected_clients)


def dp_aggregate(updates: dict, *, clip_norm: float | None, noise_multiplier: float,
                 expected_clients: float, generator: torch.Generator | None = None,
                 like: dict | None = None, safe: bool = True, grid: float | None = None) -> tuple[dict, dict]:
    """The DP-FedAvg server step on a stacked dict of client updates ``{name: [m, ...]}``:
    clip each to ``clip_norm``, sum, divide by ``expected_clients`` and add ``N(0, sigma^2)`` with
    ``sigma = noise_multiplier * clip_norm / expected_clients`` on every coordinate.

    ``safe=True`` (the default) adds discrete Gaussian noise on a public grid
    (:func:`discrete_noise`, Canonne, Kamath & Steinke 2020): the average is rounded to ``grid``
    (default :func:`safe_grid` ``(sigma)``, the power of two ``2^floor(log2(sigma / 1024))``) and
    ``grid * Z`` added, ``Z ~ N_Z(0, ceil((sigma / grid)^2))``. Its noise multiplier is
    :func:`safe_noise_multiplier` (a little below ``z``: the rounding inflates the sensitivity);
    :func:`epsilon_spent` accounts it (``safe=True``, its default) given that multiplier, or given ``z``
    and ``num_params`` for the default grid. ``safe=False`` is the float mechanism, the continuous
    Gaussian of McMahan et al. (2018, Alg. 1) added in float32: not private on its float output
    (``tests/test_dp_fedavg.py`` shows an event of probability about 0.4 under one input and 0 under
    its neighbour); it is accounted by ``epsilon_spent(..., safe=False)``.

    ``m`` may be 0 (no client sampled): then pass ``like`` (a parameter dict giving the shapes) and
    the result is pure noise. Returns ``(noisy_average, clipped_average)``; the second is the
    noiseless signal, used for signal-to-noise diagnostics.
    """
    check_dp_args(noise_multiplier, clip_norm, expected_clients)
    if noise_multiplier > 0 and clip_norm is None:
        raise ValueError("noise needs a finite clip_norm (the sensitivity)")
    if len(updates) == 0 or next(iter(updates.values())).shape[0] == 0:
        if like is None:
            raise ValueError("with no client update, pass like= to give the parameter shapes")
        clipped_mean = {k: torch.zeros_like(v) for k, v in like.items()}
    else:
        clipped = clip_updates(updates, clip_norm)
        clipped_mean = {k: v.sum(0) / expected_clients for k, v in clipped.items()}
    sigma = 0.0 if noise_multiplier == 0 else noise_std(noise_multiplier, clip_norm, expected_clients)
    if safe and sigma > 0:
        return discrete_noise(clipped_mean, sigma, grid=grid, generator=generator), clipped_mean
    noisy = gaussian_noise(clipped_mean, sigma, generator=generator)
    return noisy, clipped_mean


def safe_grid(sigma: float, ratio: float = SAFE_GRID_RATIO) -> float:
    """The public grid of the safe mechanism for noise ``sigma`` per coordinate: the power of two
    ``2^floor(log2(sigma / ratio))`` (``sigma / grid`` in ``[ratio, 2 ratio)``; the default ``ratio``
    gives :func:`dp_aggregate`'s default grid). A larger ``ratio`` makes the rounding's extra
    sensitivity ``sqrt(n)`` smaller next to ``S / (m grid) >= ratio / z`` (Canonne, Kamath & Steinke
    2020, Sec. 4; :func:`safe_noise_multiplier_bound`); the sampler needs ``ratio <= 2^14``. Raises
    ``ValueError`` naming ``sigma`` or ``ratio`` unless finite and ``> 0`` (``ratio`` a power of two
    in ``[1, 2^14]``)."""
    import math

    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if not (1 <= ratio <= 2 ** 14 and math.log2(ratio) == int(math.log2(ratio))):
        raise ValueError(f"ratio must be a power of two in [1, 2^14], got {ratio!r}")
    return 2.0 ** math.floor(math.log2(sigma / ratio))


def _safe_grid(sigma: float, grid: float | None) -> float:
    import math

    if grid is None:
        return safe_grid(sigma)
    if not (grid > 0 and math.isfinite(grid)):
        raise ValueError(f"grid must be a finite number > 0, got {grid!r}")
    return float(grid)


def discrete_noise(update: dict, sigma: float, *, grid: float | None = None,
                   generator: torch.Generator | None = None) -> dict:
    """The floating-point-safe counterpart of :func:`fedlab.privacy.defenses.gaussian_noise` on a
    parameter dict: every tensor rounded to the public ``grid`` (default ``2^floor(log2(sigma /
    1024))``) and ``grid * Z`` added, ``Z`` the exact discrete Gaussian with ``ceil((sigma / grid)^2)``
    (:func:`fedlab.privacy.discrete_gaussian.sample_discrete_gaussian`, seeded from ``generator``).
    The output is ``grid`` times an integer, computed in float64 and cast to each tensor's dtype.
    Raises ``ValueError`` naming ``sigma`` or ``grid`` when not finite and ``> 0`` or when
    ``(sigma / grid)^2`` exceeds the sampler's range."""
    import math

    import numpy as np

    from .discrete_gaussian import MAX_SIGMA2, sample_discrete_gaussian

    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    g = _safe_grid(sigma, grid)
    s = math.ceil((sigma / g) ** 2)
    if s > MAX_SIGMA2:
        raise ValueError(f"grid={g:g} is too fine for sigma={sigma:g}: (sigma / grid)^2 > {MAX_SIGMA2}")
    gen = np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,), generator=generator)))
    out = {}
    for k, v in update.items():
        z = torch.from_numpy(sample_discrete_gaussian(s, tuple(v.shape), rng=gen).astype(np.float64))
        out[k] = (g * (torch.round(v.detach().double() / g) + z)).to(v.dtype)
    return out


def safe_noise_multiplier(noise_multiplier: float, clip_norm: float, expected_clients: float, num_params: int,
                          *, grid: float | None = None) -> float:
    """The noise multiplier that the discrete Gaussian of ``dp_aggregate(..., safe=True)`` really has:
    ``sqrt(ceil((sigma / grid)^2)) / (S / (m grid) + sqrt(n))`` with ``sigma = z S / m``, the integer
    vectors' sensitivity growing by ``sqrt(n)`` (``n = num_params``) from the rounding
    (:func:`fedlab.privacy.discrete_gaussian.integer_sensitivity`). Raises ``ValueError`` naming the
    argument on bad input."""
    import math

    from .discrete_gaussian import integer_sensitivity

    sigma = noise_std(noise_multiplier, clip_norm, expected_clients)
    if not sigma > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    g = _safe_grid(sigma, grid)
    return math.sqrt(math.ceil((sigma / g) ** 2)) / integer_sensitivity(clip_norm / expected_clients, g, num_params)


def safe_noise_multiplier_bound(noise_multiplier: float, num_params: int, *, ratio: float = SAFE_GRID_RATIO) -> float:
    """A lower bound on :func:`safe_noise_multiplier` for every clip norm and denominator when the grid is
    :func:`safe_grid` ``(sigma, ratio)`` (the default grid for ``ratio = 1024``): ``ratio / (ratio / z +
    sqrt(n))``. With ``r = sigma / grid`` in ``[ratio, 2 ratio)`` the multiplier is ``sqrt(ceil(r^2)) /
    (r / z + sqrt(n)) >= r / (r / z + sqrt(n))``, increasing in ``r`` (Canonne, Kamath & Steinke 2020,
    Thm. 14 with the rounding's sensitivity of
    :func:`fedlab.privacy.discrete_gaussian.integer_sensitivity`). Raises ``ValueError`` naming the argument
    for ``noise_multiplier`` not positive and finite, ``num_params`` not a positive integer or a bad ``ratio``."""
    import math

    if isinstance(noise_multiplier, bool) or not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier!r}")
    if isinstance(num_params, bool) or int(num_params) != num_params or num_params < 1:
        raise ValueError(f"num_params must be a positive integer, got {num_params!r}")
    safe_grid(1.0, ratio)                                                   # checks ratio
    return float(ratio) / (float(ratio) / float(noise_multiplier) + math.sqrt(int(num_params)))


# --------------------------------------------------------------------------------------------
# accounting (dp_accounting, never by hand)
# --------------------------------------------------------------------------------------------
def check_delta(delta: float, num_clients: int | None = None) -> float:
    """Validate the ``delta`` of a client-level ``(epsilon, delta)`` guarantee and return it as a float.

    ``delta`` is the probability with which the guarantee may fail outright; a mechanism that
    publishes one random client's whole data set is ``(0, 1/K)``-DP over ``K`` clients, so a
    meaningful ``delta`` is much smaller than ``1/K`` (common choices: ``delta = 1/K^1.1`` or
    ``delta <= 1/(10 K)``, :func:`delta_for`).

    Raises ``ValueError`` naming ``delta`` unless ``0 < delta < 1``, and, when ``num_clients`` is
    given, unless ``delta < 1 / num_clients``; ``num_clients`` itself must be a positive integer.
    """
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if num_clients is not None:
        if int(num_clients) != num_clients or num_clients < 1:
            raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
        if not delta < 1.0 / num_clients:
            raise ValueError(f"delta must be < 1/num_clients = {1.0 / num_clients:.3g} (K = {num_clients} clients) "
                             f"for a meaningful client-level guarantee, got {delta:g}; use e.g. delta_for(K)")
    return delta


def delta_for(num_clients: int, factor: float = 10.0) -> float:
    """The ``delta`` this book uses for ``num_clients = K`` clients: ``1 / (factor K)`` (default
    ``1 / (10 K)``, well below the ``1/K`` of a mechanism that publishes one client's data).
    Raises ``ValueError`` naming ``num_clients`` (a positive integer) or ``factor`` (``> 1``)."""
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
    if not factor > 1:
        raise ValueError(f"factor must be > 1 (so that delta < 1/K), got {factor}")
    return 1.0 / (float(factor) * int(num_clients))


def _check_acct(sampling_prob, num_rounds, delta, num_clients=None):
    if not 0.0 < sampling_prob <= 1.0:
        raise ValueError(f"sampling_prob must be in (0, 1], got {sampling_prob}")
    if isinstance(num_rounds, bool) or int(num_rounds) != num_rounds or num_rounds < 1:
        raise ValueError(f"num_rounds must be a positive integer, got {num_rounds!r}")
    check_delta(delta, num_clients)


def dp_event(noise_multiplier: float, sampling_prob: float, num_rounds: int):
    """The ``dp_accounting`` event of DP-FedAvg: ``num_rounds`` self-compositions of a
    Poisson-sampled (probability ``q``) Gaussian mechanism with noise multiplier ``z``."""
    import dp_accounting

    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0 for a finite epsilon, got {noise_multiplier}")
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(noise_multiplier)),
        int(num_rounds))


def epsilon_spent(noise_multiplier: float, sampling_prob: float, num_rounds: int, delta: float, *,
                  num_clients: int | None = None, safe: bool = True, num_params: int | None = None,
                  grid_ratio: float = SAFE_GRID_RATIO) -> float:
    """Client-level epsilon of DP-FedAvg (McMahan et al. 2018, Alg. 1) after ``num_rounds`` rounds at the
    given ``delta``. ``noise_multiplier = 0`` returns ``inf``. ``delta`` is checked by :func:`check_delta`
    (with ``num_clients``, it must be below ``1/K``).

    ``safe=True`` (the default, matching :func:`dp_aggregate`'s): the discrete Gaussian of
    ``dp_aggregate(..., safe=True)``. Its Renyi curve per round is the Gaussian's (Canonne, Kamath &
    Steinke 2020, Thm. 14), but ``dp_accounting``'s analysis of Poisson subsampling is specific to the
    continuous Gaussian, so no amplification by sampling is claimed: the rounds compose as if every
    client took part in every round (a valid, looser bound). Without ``num_params``,
    ``noise_multiplier`` is the discrete Gaussian's own multiplier (:func:`safe_noise_multiplier`);
    with ``num_params`` (the coordinates of one update), it is the ``z`` given to :func:`dp_aggregate`
    with the grid :func:`safe_grid` ``(sigma, grid_ratio)`` (the default grid for ``grid_ratio = 1024``)
    and the multiplier accounted is :func:`safe_noise_multiplier_bound`.

    ``safe=False``: the float mechanism (the continuous Gaussian, ``dp_aggregate(..., safe=False)``),
    with ``dp_accounting.rdp.RdpAccountant`` and amplification by Poisson sampling (Mironov, Talwar &
    Zhang 2019); a guarantee for real-valued noise only. Raises ``ValueError`` naming the argument on
    bad input (``num_params`` only with ``safe=True``)."""
    _check_acct(sampling_prob, num_rounds, delta, num_clients)
    if num_params is not None and not safe:
        raise ValueError("num_params is for the safe mechanism only (safe=True); the float one has no grid")
    if noise_multiplier == 0:
        return float("inf")
    if safe:
        from .discrete_gaussian import discrete_gaussian_epsilon

        z = float(noise_multiplier) if num_params is None else \
            safe_noise_multiplier_bound(noise_multiplier, num_params, ratio=grid_ratio)
        return discrete_gaussian_epsilon(z ** 2, 1.0, delta, compositions=int(num_rounds))
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(dp_event(noise_multiplier, sampling_prob, num_rounds))
    return float(acc.get_epsilon(delta))


def noise_multiplier_for_epsilon(epsilon: float, sampling_prob: float, num_rounds: int,
                                 delta: float, *, num_clients: int | None = None, safe: bool = True,
                                 num_params: int | None = None, grid_ratio: float = SAFE_GRID_RATIO) -> float:
    """The smallest noise multiplier ``z`` whose DP-FedAvg run spends at most ``epsilon`` by
    :func:`epsilon_spent` with the same ``safe``, ``num_params`` and ``grid_ratio`` (McMahan et al.
    2018, Alg. 1). ``epsilon = inf`` gives 0. ``delta`` is checked by :func:`check_delta` (with
    ``num_clients``, it must be below ``1/K``).

    ``safe=True`` (the default): the discrete Gaussian (Canonne, Kamath & Steinke 2020, Thm. 14, no
    amplification by sampling), by bisection; with ``num_params`` the answer is the ``z`` to give
    :func:`dp_aggregate` with the grid :func:`safe_grid` ``(sigma, grid_ratio)``, and ``ValueError`` is
    raised when that grid is too coarse for the budget (``sqrt(num_params) >= grid_ratio / z``: the
    rounding alone would cost more; use a larger ``grid_ratio``). ``safe=False``: the float mechanism,
    ``dp_accounting.calibrate_dp_mechanism`` with the RDP accountant (amplification by sampling)."""
    import math

    _check_acct(sampling_prob, num_rounds, delta, num_clients)
    if num_params is not None and not safe:
        raise ValueError("num_params is for the safe mechanism only (safe=True); the float one has no grid")
    if epsilon == float("inf"):
        return 0.0
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    lowest = 0.05                       # the search's lower end: below it, noise no longer calibrates usefully
    floor = epsilon_spent(lowest, sampling_prob, num_rounds, delta, safe=safe)
    if floor <= epsilon:
        # dp_accounting would fail with 'Unable to find bracketing interval' (hostile-inputs P10i)
        raise ValueError(f"epsilon={epsilon:g} is so large that even the smallest noise multiplier searched, "
                         f"z={lowest}, spends less (epsilon {floor:.4g}); use a smaller epsilon, or epsilon=inf "
                         f"for no noise")
    if safe:
        from .discrete_gaussian import discrete_gaussian_epsilon

        def spent(z):
            return discrete_gaussian_epsilon(z * z, 1.0, delta, compositions=int(num_rounds))

        lo, hi = lowest, 1.0
        while spent(hi) > epsilon:
            lo, hi = hi, 2.0 * hi
        while hi - lo > 1e-4 * hi:                   # spent(lo) > epsilon >= spent(hi)
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if spent(mid) > epsilon else (lo, mid)
        if num_params is None:
            return float(hi)
        safe_grid(1.0, grid_ratio)                                          # checks grid_ratio
        room = 1.0 / hi - math.sqrt(int(num_params)) / float(grid_ratio)
        if not room > 0:
            raise ValueError(f"grid_ratio={grid_ratio:g} is too small for epsilon={epsilon:g} with num_params="
                             f"{num_params}: the discrete Gaussian needs multiplier {hi:.4g} but the rounding caps it "
                             f"below {float(grid_ratio) / math.sqrt(int(num_params)):.4g}; use a larger grid_ratio")
        z = 1.0 / room
        while epsilon_spent(z, sampling_prob, num_rounds, delta, num_params=num_params, grid_ratio=grid_ratio) > epsilon:
            z = math.nextafter(z, math.inf)                                 # float rounding of 1 / room
        return float(z)
    import dp_accounting
    from dp_accounting import rdp

    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: rdp.RdpAccountant(list(RDP_ORDERS)), lambda z: dp_event(z, sampling_prob, num_rounds), epsilon, delta,
        dp_accounting.LowerEndpointAndGuess(lowest, 1.0), tol=1e-3))
