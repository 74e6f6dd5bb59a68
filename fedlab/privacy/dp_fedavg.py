"""The mechanism and the accountant of client-level differentially private FedAvg (McMahan, Ramage,
Talwar & Zhang 2018, "Learning differentially private recurrent language models", Algorithm 1
"DP-FedAvg"; Shokri's CS5562 lecture, "Client-level differentially private federated averaging").
The round loop that uses them is :func:`fedlab.fl.dp_fedavg.dp_fedavg` (``privacy`` imports nothing
from ``fl``).

The server is trusted. Each round it

1. samples every client independently with probability ``q`` (Poisson sampling);
2. lets each sampled client run ClientUpdate and return its update ``Delta_k = theta_k - theta``;
3. clips each update to L2 norm ``S`` (``fedlab.privacy.clip_by_norm``), so that one client moves the
   sum by at most ``S``;
4. averages with the *fixed* denominator ``m = q K`` (the expected number of sampled clients; the
   estimator ``f~_f`` of the paper with equal client weights) and adds Gaussian noise of standard
   deviation ``sigma = z S / m`` per coordinate (``z`` is the noise multiplier);
5. applies ``theta <- theta + server_lr * (noisy average)``.

Each round is a Poisson-subsampled Gaussian mechanism on the *set of clients*; its (epsilon, delta)
after ``T`` rounds comes from Google's ``dp_accounting`` library (Renyi DP accountant of Mironov 2017,
with the subsampling analysis of Mironov, Talwar & Zhang 2019). Nothing here re-derives the
accounting by hand.
"""
from __future__ import annotations

import torch

from .defenses import clip_rows, gaussian_noise

#: Renyi orders used by every accountant here (integers: fast and numerically stable for the
#: Poisson-subsampled Gaussian; the fractional orders below 2 only matter for epsilon << 1)
RDP_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 256, 512)

__all__ = ["RDP_ORDERS", "check_delta", "delta_for", "check_dp_args", "noise_std", "clip_updates", "dp_aggregate", "dp_event",
           "epsilon_spent", "noise_multiplier_for_epsilon", "discrete_noise", "safe_noise_multiplier"]


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


def clip_updates(updates: dict, clip_norm: float | None) -> dict:
    """Clip every client's update of a stacked dict ``{name: [m, ...]}`` to global L2 norm
    ``clip_norm`` (each client's tensors taken together): :func:`fedlab.privacy.defenses.clip_rows`.
    ``None`` returns the updates unchanged."""
    if clip_norm is None:
        return {k: v.clone() for k, v in updates.items()}
    return clip_rows(updates, clip_norm)


def dp_aggregate(updates: dict, *, clip_norm: float | None, noise_multiplier: float,
                 expected_clients: float, generator: torch.Generator | None = None,
                 like: dict | None = None, safe: bool = False, grid: float | None = None) -> tuple[dict, dict]:
    """The DP-FedAvg server step on a stacked dict of client updates ``{name: [m, ...]}``:
    clip each to ``clip_norm``, sum, divide by ``expected_clients`` and add ``N(0, sigma^2)`` with
    ``sigma = noise_multiplier * clip_norm / expected_clients`` on every coordinate.

    ``safe=False`` (default; the float Gaussian of McMahan et al.) is not private on its float32
    output (``tests/test_dp_fedavg.py`` shows an event of probability about 0.4 under one input and 0
    under its neighbour). ``safe=True`` adds discrete Gaussian noise on a public grid instead
    (:func:`discrete_noise`, Canonne, Kamath & Steinke 2020): the average is rounded to ``grid``
    (default: ``sigma / 1024``, a power of two) and ``grid * Z`` added, ``Z ~ N_Z(0, ceil((sigma /
    grid)^2))``. Its noise multiplier is :func:`safe_noise_multiplier` (a little below ``z``: the
    rounding inflates the sensitivity), which is what :func:`epsilon_spent` must be given
    (``safe=True`` there). The default stays ``False`` so that Chapter 1b's numbers do not move.

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


def _safe_grid(sigma: float, grid: float | None) -> float:
    import math

    if grid is None:
        return 2.0 ** math.floor(math.log2(sigma / 1024))
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
                  num_clients: int | None = None, safe: bool = False) -> float:
    """Client-level epsilon of DP-FedAvg after ``num_rounds`` rounds at the given ``delta``
    (``dp_accounting.rdp.RdpAccountant``). ``noise_multiplier = 0`` returns ``inf``.
    ``delta`` is checked by :func:`check_delta` (with ``num_clients``, it must be below ``1/K``).

    ``safe=True``: the discrete Gaussian of ``dp_aggregate(..., safe=True)``, with
    ``noise_multiplier`` from :func:`safe_noise_multiplier`. Its Renyi curve per round is the
    Gaussian's (Canonne, Kamath & Steinke 2020, Thm. 14), but ``dp_accounting``'s analysis of Poisson
    subsampling is specific to the continuous Gaussian, so no amplification by sampling is claimed:
    the rounds compose as if every client took part in every round (a valid, looser bound)."""
    _check_acct(sampling_prob, num_rounds, delta, num_clients)
    if noise_multiplier == 0:
        return float("inf")
    if safe:
        from .discrete_gaussian import discrete_gaussian_epsilon

        return discrete_gaussian_epsilon(float(noise_multiplier) ** 2, 1.0, delta, compositions=int(num_rounds))
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(dp_event(noise_multiplier, sampling_prob, num_rounds))
    return float(acc.get_epsilon(delta))


def noise_multiplier_for_epsilon(epsilon: float, sampling_prob: float, num_rounds: int,
                                 delta: float, *, num_clients: int | None = None) -> float:
    """The smallest noise multiplier ``z`` whose DP-FedAvg run spends at most ``epsilon``
    (``dp_accounting.calibrate_dp_mechanism`` with the RDP accountant). ``epsilon = inf`` gives 0.
    ``delta`` is checked by :func:`check_delta` (with ``num_clients``, it must be below ``1/K``)."""
    _check_acct(sampling_prob, num_rounds, delta, num_clients)
    if epsilon == float("inf"):
        return 0.0
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    import dp_accounting
    from dp_accounting import rdp

    lowest = 0.05                       # the search's lower end: below it, noise no longer calibrates usefully
    floor = epsilon_spent(lowest, sampling_prob, num_rounds, delta)
    if floor <= epsilon:
        # dp_accounting would fail with 'Unable to find bracketing interval' (hostile-inputs P10i)
        raise ValueError(f"epsilon={epsilon:g} is so large that even the smallest noise multiplier searched, "
                         f"z={lowest}, spends less (epsilon {floor:.4g}); use a smaller epsilon, or epsilon=inf "
                         f"for no noise")
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: rdp.RdpAccountant(list(RDP_ORDERS)), lambda z: dp_event(z, sampling_prob, num_rounds), epsilon, delta,
        dp_accounting.LowerEndpointAndGuess(lowest, 1.0), tol=1e-3))
