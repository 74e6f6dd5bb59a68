"""The distributed discrete Gaussian: differential privacy inside secure aggregation.

Kairouz, Liu & Steinke, "The distributed discrete Gaussian mechanism for federated learning with
secure aggregation" (ICML 2021; KLS21). Central DP-FedAvg trusts the server to add the noise: the
server sees every clipped update before it does (chapter 6 reconstructs images from that view).
With secure aggregation the server sees only the sum, so the noise has to be added by the clients,
each a share, on integers, because secure aggregation sums integers modulo ``2^b``:

1. each client clips its update to L2 norm ``clip_norm`` (in float64 by
   :func:`fedlab.privacy.clipping.clip_rows`, whose clipped norm never exceeds ``clip_norm``), rounds it to a public grid, ``k = round(x / grid)``,
   and adds its own share ``Z ~ N_Z(0, local_sigma2)`` per coordinate (the exact sampler of
   :mod:`fedlab.privacy.discrete_gaussian`);
2. secure aggregation (:mod:`fedlab.privacy.secure_aggregation`'s pairwise masks) sums the integer
   vectors ``k + Z`` modulo ``2^modulus_bits``; the server decodes the signed integer sum and
   multiplies it by ``grid``. No floating-point noise is ever added: every output is ``grid`` times
   an integer, so Mironov's (2012) attack on float noise has nothing to read.

Privacy (KLS21, Prop. 14). A sum of ``n`` discrete Gaussians of variance ``sigma^2`` each is not a
discrete Gaussian, but close to one: for integer vectors ``Delta`` in ``Z^d`` and every Renyi order
``alpha >= 1``, ``D_alpha(S || S + Delta) <= alpha eps^2 / 2`` with::

    eps = min( sqrt(||Delta||_2^2 / (n sigma^2) + tau d / 2),  ||Delta||_2 / (sqrt(n) sigma) + tau ||Delta||_1 ),
    tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)),        valid for sigma >= 1/2,

i.e. ``eps^2 / 2``-zCDP, the Renyi curve of a Gaussian of noise multiplier ``1 / eps``; the
``(epsilon, delta)`` here comes from ``dp_accounting``'s Renyi conversion of that curve
(:func:`ddg_epsilon`). ``tau`` is the price of the sum not being a discrete Gaussian; it vanishes
quickly as ``sigma^2`` grows (``tau < 1e-3`` for ``sigma^2 >= 1``, ``n <= 10``) and cannot be dropped:
``tests/test_distributed_dg.py`` finds exact Renyi divergences above the bound without it.

Who adds noise: the guarantee counts the ``n`` clients whose shares are really in the sum. A client
that drops out, or that a malicious server declares dropped (chapter 6b's attack on SecAgg+), takes
its share with it; account with the number of honest, surviving clients you can guarantee, not the
number invited.

Neighbouring datasets: one client's update changed by at most ``sensitivity`` in L2 (``clip_norm``
when it is replaced by zeros, ``2 clip_norm`` when replaced by any other clipped update); rounding to
the grid adds at most ``sqrt(d) / 2`` per version, so the integer sensitivity is
``sensitivity / grid + sqrt(d)`` (:func:`fedlab.privacy.discrete_gaussian.integer_sensitivity`), and
``||Delta||_1 <= min(sqrt(d) ||Delta||_2, ||Delta||_2^2)`` for integer vectors. KLS21 also rotate the
vector randomly and round conditionally to shrink these bounds; this module uses plain rounding
(simpler, a larger bound, still a valid one).

Functions: :func:`kls_tau`, :func:`ddg_integer_sensitivity`, :func:`ddg_rho`, :func:`ddg_epsilon`,
:func:`ddg_local_sigma2`, :func:`distributed_discrete_gaussian_sum`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .clipping import clip_rows
from .discrete_gaussian import MAX_SIGMA2, _rdp_epsilon, integer_sensitivity, sample_discrete_gaussian
from .secure_aggregation import MODULUS_BITS, _check_num_clients, pairwise_masks

__all__ = ["kls_tau", "ddg_integer_sensitivity", "ddg_rho", "ddg_epsilon", "ddg_local_sigma2", "DDGSum",
           "distributed_discrete_gaussian_sum"]


def _positive(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def _count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def kls_tau(local_sigma2: float, num_clients: int) -> float:
    """KLS21 Prop. 14's ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k+1))`` (0 for one client,
    whose share is an exact discrete Gaussian). Raises ``ValueError`` naming the argument unless
    ``local_sigma2 >= 1/4`` (the proposition's ``sigma >= 1/2``) and ``num_clients`` is a positive integer."""
    s2 = _positive("local_sigma2", local_sigma2)
    if s2 < 0.25:
        raise ValueError(f"local_sigma2 must be >= 1/4 (KLS21 Prop. 14 needs sigma >= 1/2), got {local_sigma2!r}")
    n = _count("num_clients", num_clients)
    return 10.0 * sum(math.exp(-2.0 * math.pi ** 2 * s2 * k / (k + 1)) for k in range(1, n))


def ddg_integer_sensitivity(sensitivity: float, grid: float, dim: int) -> tuple[float, float]:
    """``(L2, L1)`` bounds on the integer difference ``round(x / grid) - round(x' / grid)`` for
    ``x, x'`` in ``R^dim`` at L2 distance at most ``sensitivity``: ``L2 = sensitivity / grid + sqrt(dim)``
    (:func:`~fedlab.privacy.discrete_gaussian.integer_sensitivity`) and ``L1 = min(sqrt(dim) L2, L2^2)``
    (``|v| <= v^2`` for integers). Raises ``ValueError`` as ``integer_sensitivity``."""
    l2 = integer_sensitivity(sensitivity, grid, dim)
    return l2, min(math.sqrt(dim) * l2, l2 * l2)


def ddg_rho(local_sigma2: float, num_clients: int, l2: float, l1: float, dim: int) -> float:
    """The zCDP parameter ``rho = eps^2 / 2`` of one release of the sum of ``num_clients`` shares
    ``N_Z(0, local_sigma2)^dim`` (KLS21 Prop. 14, formula in the module docstring), for integer
    differences of L2 norm ``<= l2`` and L1 norm ``<= l1``. Raises ``ValueError`` naming the argument
    on bad input (``local_sigma2 < 1/4`` included)."""
    tau = kls_tau(local_sigma2, num_clients)
    l2, l1 = _positive("l2", l2), _positive("l1", l1)
    d = _count("dim", dim)
    if l1 < l2 - 1e-12 * l2:
        raise ValueError(f"l1 must be >= l2 (an L1 norm is at least the L2 norm), got l1={l1!r}, l2={l2!r}")
    var = num_clients * float(local_sigma2)
    eps = min(math.sqrt(l2 * l2 / var + 0.5 * tau * d), l2 / math.sqrt(var) + tau * l1)
    return 0.5 * eps * eps


def ddg_epsilon(local_sigma2: float, num_clients: int, *, clip_norm: float, grid: float, dim: int, delta: float,
                compositions: int = 1, sensitivity: float | None = None) -> float:
    """``epsilon`` at ``delta`` of ``compositions`` rounds of :func:`distributed_discrete_gaussian_sum`
    with ``num_clients`` honest noise shares of ``local_sigma2`` (grid units) per coordinate, updates
    of ``dim`` coordinates clipped to ``clip_norm`` on a ``grid``. ``sensitivity`` (default
    ``clip_norm``: one client's update replaced by zeros; ``2 clip_norm`` for replacement by another
    update) is the L2 change of one client's clipped update. KLS21 Prop. 14 gives ``rho``-zCDP per
    round (:func:`ddg_rho`), composing additively; the Renyi curve ``alpha rho`` is converted by
    ``dp_accounting``. No subsampling amplification is claimed (every client of the round is counted).
    Raises ``ValueError`` naming the argument on bad input."""
    sens = _positive("clip_norm", clip_norm) if sensitivity is None else _positive("sensitivity", sensitivity)
    l2, l1 = ddg_integer_sensitivity(sens, _positive("grid", grid), _count("dim", dim))
    rho = ddg_rho(local_sigma2, num_clients, l2, l1, dim)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    # alpha * rho is the Renyi curve of a Gaussian with noise multiplier z = 1 / sqrt(2 rho)
    return _rdp_epsilon(1.0 / math.sqrt(2.0 * rho), float(delta), _count("compositions", compositions))


def ddg_local_sigma2(epsilon: float, num_clients: int, *, clip_norm: float, grid: float, dim: int, delta: float,
                     compositions: int = 1) -> int:
    """The smallest integer share variance ``local_sigma2`` (grid units, ``>= 1``) for which
    :func:`ddg_epsilon` is at most ``epsilon`` (bisection). Raises ``ValueError`` naming the argument
    on bad input, or when even :data:`~fedlab.privacy.discrete_gaussian.MAX_SIGMA2` is not enough (use
    a coarser grid)."""
    eps = _positive("epsilon", epsilon)
    ok = lambda s: ddg_epsilon(s, num_clients, clip_norm=clip_norm, grid=grid, dim=dim, delta=delta,   # noqa: E731
                               compositions=compositions) <= eps
    hi = 1
    while not ok(hi):
        hi *= 2
        if hi > MAX_SIGMA2:
            raise ValueError(f"epsilon={epsilon!r} needs local_sigma2 > {MAX_SIGMA2} grid units: use a coarser grid")
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class DDGSum:
    """What :func:`distributed_discrete_gaussian_sum` returns.

    ``total``: the server's decoded sum, float64 ``[d]`` (``grid`` times an integer vector);
    ``masked``: each client's message, int64 ``[K, d]`` in ``[0, 2^modulus_bits)`` (uniform on its own);
    ``num_clients``: the noise shares in the sum; ``local_sigma2``, ``grid``: the mechanism's parameters."""
    total: torch.Tensor
    masked: torch.Tensor
    num_clients: int
    local_sigma2: int
    grid: float


def distributed_discrete_gaussian_sum(updates: torch.Tensor, *, clip_norm: float, grid: float, local_sigma2: int,
                                      modulus_bits: int = MODULUS_BITS, rng=None,
                                      generator: torch.Generator | None = None) -> DDGSum:
    """One round of the distributed discrete Gaussian (KLS21, Alg. 1 without the rotation): clip each
    row of ``updates`` ``[K, d]`` to ``clip_norm`` (in float64, :func:`fedlab.privacy.clipping.clip_rows`), round to ``grid``, add a
    discrete Gaussian share ``N_Z(0, local_sigma2)`` per coordinate (``rng``: numpy seed or Generator),
    mask the integer vectors pairwise modulo ``2^modulus_bits`` (``generator``: the masks' torch
    generator), and return the server's decoded sum with the messages it received (:class:`DDGSum`).
    Privacy: :func:`ddg_epsilon` with ``num_clients = K`` honest shares.

    The simulation sees every share, so it raises ``ValueError`` naming ``updates`` when the integer sum
    would leave the ring's signed range (a real deployment picks ``modulus_bits`` so that this has
    negligible probability); also for bad arguments (``local_sigma2`` must be an integer in
    ``[1, MAX_SIGMA2]``, ``K >= 2``: one client's masked sum is its own update)."""
    c, g = _positive("clip_norm", clip_norm), _positive("grid", grid)
    if isinstance(local_sigma2, bool) or not isinstance(local_sigma2, (int, np.integer)) or not 1 <= local_sigma2 <= MAX_SIGMA2:
        raise ValueError(f"local_sigma2 must be an integer in [1, {MAX_SIGMA2}], got {local_sigma2!r}")
    x = torch.as_tensor(updates)
    if not x.is_floating_point() or x.dim() != 2:
        raise ValueError(f"updates must be a float tensor [num_clients, dim], got {x.dtype} {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("updates must be finite")
    x = clip_rows(x.double(), c)
    k_clients, dim = x.shape
    if k_clients < 2:
        raise ValueError(f"updates must hold at least 2 clients (a sum of one is that client's update), got {k_clients}")
    from .secure_aggregation import _check
    _check(modulus_bits, 0)
    _check_num_clients(k_clients, modulus_bits, "updates")
    k = torch.round(x / g)
    if bool((k.abs() > 2.0 ** 52).any()):
        raise ValueError(f"updates: clip_norm / grid = {c / g:g} is too large for exact integers (beyond 2^52)")
    z = torch.from_numpy(sample_discrete_gaussian(int(local_sigma2), (k_clients, dim), rng=rng))
    shares = k.to(torch.int64) + z.to(torch.int64)
    total_int = shares.sum(0)
    M, half = 2 ** modulus_bits, 2 ** (modulus_bits - 1)
    if bool(((total_int < -half) | (total_int >= half)).any()):
        raise ValueError(f"updates: the noisy integer sum leaves the signed range of a 2^{modulus_bits} ring "
                         f"(largest |sum| {int(total_int.abs().max())}); use more modulus_bits or a coarser grid")
    masks = pairwise_masks(k_clients, dim, modulus_bits=modulus_bits, generator=generator)
    masked = torch.remainder(torch.remainder(shares, M) + masks, M)
    s = torch.remainder(masked.sum(0), M)
    signed = torch.where(s >= half, s - M, s)
    return DDGSum(total=signed.double() * g, masked=masked, num_clients=k_clients, local_sigma2=int(local_sigma2),
                  grid=g)
