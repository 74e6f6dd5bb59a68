"""The discrete Gaussian mechanism: a Gaussian release that is private on its real floating-point output.

Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy" (NeurIPS 2020; CKS20):

* the discrete Gaussian ``N_Z(0, sigma^2)`` on the integers, ``P[Z = z] ∝ exp(-z^2 / (2 sigma^2))``;
* an *exact* sampler (CKS20, Sec. 5, Algorithms 1-3): Bernoulli(``exp(-gamma)``) for rational
  ``gamma``, the discrete Laplace by rejection, the discrete Gaussian by rejection from the discrete
  Laplace. Only integer arithmetic and uniform integers are used, so every output has exactly the
  probability the analysis assumes: no floating-point rounding of the noise (Mironov 2012) can leak;
* its privacy (CKS20, Thm. 14): the multivariate discrete Gaussian with ``sigma^2`` per coordinate on
  integer vectors whose L2 distance is at most ``Delta`` satisfies ``Delta^2 / (2 sigma^2)``-zCDP,
  the Renyi curve of the continuous Gaussian of noise multiplier ``sigma / Delta``. Its
  ``(epsilon, delta)`` here comes from ``dp_accounting``'s Renyi accountant on
  ``GaussianDpEvent(sigma / Delta)`` (same curve; the conversion is CKS20's Prop. 12 / Cor. 13).

The release on real vectors (:func:`discrete_gaussian_release`): a public grid step ``gamma``; the
input is rounded to the grid, ``k = round(x / gamma)`` (integers), and ``gamma (k + Z)`` is released.
Rounding moves each coordinate by at most ``gamma / 2``, so two inputs at L2 distance ``Delta`` give
integer vectors at L2 distance at most ``Delta / gamma + sqrt(n)`` (:func:`integer_sensitivity`): the
accounting uses that. The output is ``gamma`` times an integer, computed in float64 and then cast (a
deterministic function of the integer vector: post-processing).

Secure aggregation: the released integers ``k + Z`` are what the distributed discrete Gaussian of
Kairouz, Liu & Steinke ("The distributed discrete Gaussian mechanism for federated learning with
secure aggregation", ICML 2021) sums modulo ``2^b`` inside secure aggregation
(:mod:`fedlab.privacy.secure_aggregation` works on integers modulo its field). Each client would add
its own discrete Gaussian share; the sum of discrete Gaussians is close to, not exactly, a discrete
Gaussian, and that paper accounts for the gap. This module implements the central (one-noise) form;
:mod:`fedlab.privacy.distributed_dg` the distributed one.

Arithmetic: numpy int64 for the uniform draws and Python integers (object arrays) where a product
could overflow; ``sigma^2`` is an integer in grid units, at most ``MAX_SIGMA2``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["MAX_SIGMA2", "sample_discrete_gaussian", "discrete_gaussian_pmf", "integer_sensitivity",
           "discrete_gaussian_epsilon", "discrete_gaussian_sigma2", "choose_grid", "discrete_gaussian_release"]

#: Largest ``sigma^2`` (in grid units) of the sampler: ``2^30``, so that every rejection step's
#: denominator ``2 sigma^2 t^2`` fits in int64.
MAX_SIGMA2 = 2 ** 30


def _rng(rng) -> np.random.Generator:
    from ..config import as_generator

    return as_generator(rng)


def _bernoulli_exp_frac(num: np.ndarray, den: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(``exp(-num/den)``) for integer arrays with ``0 <= num <= den`` (CKS20,
    Algorithm 1, first part): draw ``A_k ~ Bernoulli(gamma / k)`` for ``k = 1, 2, ...`` until one is 0;
    return whether the stopping ``k`` is odd. ``Bernoulli(gamma / k)`` is the AND of
    ``U < num`` (``U`` uniform on ``[0, den)``) and ``V == 0`` (``V`` uniform on ``[0, k)``)."""
    num, den = np.asarray(num, dtype=np.int64), np.asarray(den, dtype=np.int64)
    out = np.zeros(num.shape, dtype=bool)
    k = np.ones(num.shape, dtype=np.int64)
    active = np.ones(num.shape, dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        a = (gen.integers(0, den[idx]) < num[idx]) & (gen.integers(0, k[idx]) == 0)
        stop = idx[~a]
        out[stop] = (k[stop] % 2) == 1
        active[stop] = False
        k[idx[a]] += 1
    return out


def _bernoulli_exp(num, den: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(``exp(-num/den)``) for ``num >= 0`` (Python ints allowed) and ``den >= 1``
    int64 (CKS20, Algorithm 1): ``floor(gamma)`` draws of Bernoulli(``exp(-1)``), all 1, and one
    Bernoulli(``exp(-(gamma - floor(gamma)))``)."""
    num = np.asarray(num, dtype=object)
    den_o = np.asarray(den, dtype=object)
    q = num // den_o
    r = (num - q * den_o).astype(np.int64)
    q = np.minimum(q, 2 ** 62).astype(np.int64)
    ok = np.ones(q.shape, dtype=bool)
    done = np.zeros(q.shape, dtype=np.int64)
    while True:
        todo = np.flatnonzero(ok & (done < q))
        if todo.size == 0:
            break
        one = np.ones(todo.size, dtype=np.int64)
        ok[todo] = _bernoulli_exp_frac(one, one, gen)
        done[todo] += 1
    idx = np.flatnonzero(ok)
    ok[idx] = _bernoulli_exp_frac(r[idx], np.asarray(den, dtype=np.int64)[idx], gen)
    return ok


def _discrete_laplace(t: int, size: int, gen: np.random.Generator) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace ``P[Y = y] ∝ exp(-|y| / t)`` for an integer
    ``t >= 1`` (CKS20, Algorithm 2). int64 array ``[size]``."""
    out = np.zeros(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        m = todo.size
        u = gen.integers(0, t, size=m)
        d = _bernoulli_exp_frac(u, np.full(m, t, dtype=np.int64), gen)
        v = np.zeros(m, dtype=np.int64)
        going = np.ones(m, dtype=bool)
        while going.any():
            g = np.flatnonzero(going)
            one = np.ones(g.size, dtype=np.int64)
            a = _bernoulli_exp_frac(one, one, gen)
            v[g[a]] += 1
            going[g[~a]] = False
        b = gen.integers(0, 2, size=m)
        accept = d & ~((b == 1) & (u == 0) & (v == 0))
        out[todo[accept]] = (1 - 2 * b[accept]) * (u[accept] + t * v[accept])
        todo = todo[~accept]
    return out


def _check_sigma2(sigma2) -> int:
    if isinstance(sigma2, bool) or int(sigma2) != sigma2 or not 1 <= sigma2 <= MAX_SIGMA2:
        raise ValueError(f"sigma2 must be an integer in [1, {MAX_SIGMA2}] (sigma^2 in grid units), got {sigma2!r}")
    return int(sigma2)


def sample_discrete_gaussian(sigma2: int, size, *, rng=None) -> np.ndarray:
    """Exact draws of the discrete Gaussian ``N_Z(0, sigma2)`` (CKS20, Algorithm 3): with
    ``t = floor(sigma) + 1``, draw ``Y`` from the discrete Laplace of scale ``t`` and accept it with
    probability ``exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))``, computed as the exact rational
    ``(|Y| t - sigma2)^2 / (2 sigma2 t^2)``. Vectorised over the draws.

    ``sigma2``: an integer ``sigma^2`` in ``[1, MAX_SIGMA2]``; ``size``: an int or a shape; ``rng``: numpy
    Generator, int seed or ``None`` (:func:`fedlab.config.global_rng`). Returns an int64 array of that
    shape. Raises ``ValueError`` on a bad ``sigma2`` or ``size``."""
    s = _check_sigma2(sigma2)
    shape = (size,) if np.ndim(size) == 0 else tuple(size)
    if any(isinstance(d, bool) or int(d) != d or d < 0 for d in shape):
        raise ValueError(f"size must be a non-negative int or a shape, got {size!r}")
    shape = tuple(int(d) for d in shape)
    total = int(np.prod(shape, dtype=np.int64))
    gen = _rng(rng)
    t = math.isqrt(s) + 1
    den = 2 * s * t * t
    out = np.zeros(total, dtype=np.int64)
    todo = np.arange(total)
    while todo.size:
        y = _discrete_laplace(t, todo.size, gen)
        diff = np.abs(y).astype(object) * t - s
        c = _bernoulli_exp(diff * diff, np.full(todo.size, den, dtype=np.int64), gen)
        out[todo[c]] = y[c]
        todo = todo[~c]
    return out.reshape(shape)


def discrete_gaussian_pmf(values, sigma2: float) -> np.ndarray:
    """``P[Z = v]`` of ``N_Z(0, sigma2)`` for integer ``values`` (float64), normalised by the sum over
    ``|z| <= 40 sigma + 10`` (the rest is below ``1e-300``). Raises ``ValueError`` unless ``sigma2 > 0``."""
    if not (sigma2 > 0 and math.isfinite(sigma2)):
        raise ValueError(f"sigma2 must be a finite number > 0, got {sigma2!r}")
    lim = int(40 * math.sqrt(sigma2)) + 10
    z = np.arange(-lim, lim + 1, dtype=np.float64)
    norm = np.exp(-z * z / (2 * sigma2)).sum()
    v = np.asarray(values, dtype=np.float64)
    return np.exp(-v * v / (2 * sigma2)) / norm


def integer_sensitivity(sensitivity: float, grid: float, n: int) -> float:
    """L2 sensitivity of ``round(x / grid)`` for inputs ``x`` in ``R^n`` at L2 distance at most
    ``sensitivity``: ``sensitivity / grid + sqrt(n)`` (each rounding moves a coordinate by at most
    ``1/2``, so a vector by at most ``sqrt(n) / 2``, twice). Raises ``ValueError`` naming the argument
    unless ``sensitivity`` and ``grid`` are finite and ``> 0`` and ``n`` a positive integer."""
    for name, v in (("sensitivity", sensitivity), ("grid", grid)):
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return float(sensitivity) / float(grid) + math.sqrt(int(n))


#: Renyi orders of the conversion (dense: the zCDP curve is known in closed form at every order)
_ORDERS = tuple([1 + x / 20 for x in range(1, 100)] + list(range(6, 257)) + [320, 512, 1024, 4096, 16384])


@functools.lru_cache(maxsize=4096, typed=True)
def _rdp_epsilon(z: float, delta: float, compositions: int) -> float:
    """``dp_accounting``'s RDP-to-(epsilon, delta) conversion of ``compositions`` Gaussian releases of
    noise multiplier ``z``: the curve ``alpha T / (2 z^2)`` is what ``RdpAccountant`` computes for
    ``GaussianDpEvent(z)`` (``tests/test_discrete_gaussian.py`` checks the two agree). Remembered: a
    deterministic function of its three numbers (about 1.5 ms a call), and every release of the discrete
    Gaussian calibrates its ``sigma^2`` by bisection over it (:func:`discrete_gaussian_sigma2`, about 30
    calls) for the same public ``(epsilon, delta, sensitivity)`` round after round."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = [a * compositions / (2 * z * z) for a in _ORDERS]
    return float(compute_epsilon(_ORDERS, rdp, delta)[0])


def discrete_gaussian_epsilon(sigma2: float, sensitivity: float, delta: float, *, compositions: int = 1) -> float:
    """``epsilon`` at ``delta`` of ``compositions`` releases of the discrete Gaussian with ``sigma2``
    per coordinate on integer vectors at L2 distance ``<= sensitivity``: CKS20 Thm. 14 (zCDP with
    ``rho = sensitivity^2 / (2 sigma2)`` per release, composing additively), converted by
    ``dp_accounting``'s Renyi accountant (``GaussianDpEvent(sqrt(sigma2) / sensitivity)``: the same
    Renyi curve). Raises ``ValueError`` naming the argument for non-positive or non-finite values,
    ``delta`` outside (0, 1) or ``compositions < 1``."""
    for name, v in (("sigma2", sigma2), ("sensitivity", sensitivity)):
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(compositions, bool) or int(compositions) != compositions or compositions < 1:
        raise ValueError(f"compositions must be a positive integer, got {compositions!r}")
    return _rdp_epsilon(math.sqrt(sigma2) / sensitivity, float(delta), int(compositions))


def discrete_gaussian_sigma2(epsilon: float, delta: float, sensitivity: float) -> int:
    """The smallest integer ``sigma^2`` for which one discrete Gaussian release with L2 sensitivity
    ``sensitivity`` (integer units) is ``(epsilon, delta)``-DP by :func:`discrete_gaussian_epsilon`
    (bisection). Raises ``ValueError`` naming the argument on bad input, or when the answer exceeds
    :data:`MAX_SIGMA2` (use a coarser grid)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    ok = lambda s: _rdp_epsilon(math.sqrt(s) / sensitivity, delta, 1) <= epsilon   # noqa: E731
    hi = max(1, int(sensitivity ** 2))
    while not ok(hi):
        hi *= 2
        if hi > 4 * MAX_SIGMA2:
            raise ValueError(f"the discrete Gaussian needs sigma^2 > {MAX_SIGMA2} grid units for sensitivity "
                             f"{sensitivity:g}: use a coarser grid")
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    if hi > MAX_SIGMA2:
        raise ValueError(f"the discrete Gaussian needs sigma^2 = {hi} > {MAX_SIGMA2} grid units: use a coarser grid")
    return hi


def choose_grid(epsilon: float, delta: float, sensitivity: float, n: int, *, max_sigma2: int = 2 ** 28) -> float:
    """A public grid step for :func:`discrete_gaussian_release`: the finest power of two ``gamma``
    whose calibrated ``sigma^2`` (:func:`discrete_gaussian_sigma2` at
    :func:`integer_sensitivity` ``(sensitivity, gamma, n)``) is at most ``max_sigma2``. Finer grids
    cost less in rounding (the sensitivity grows by ``gamma sqrt(n) / sensitivity``, relatively) but
    need a larger ``sigma^2`` in grid units. Depends only on public parameters. Raises ``ValueError``
    as :func:`discrete_gaussian_sigma2` (also when even the coarsest sensible grid, ``sensitivity``,
    does not fit: ``n`` too large), naming ``epsilon`` when it is so small that even sensitivity 1 needs
    more than :data:`MAX_SIGMA2`."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    # the continuous calibration scales linearly: sigma_int ~ c (sensitivity / gamma + sqrt(n)); c is read at a
    # reference sensitivity whose sigma^2 fits the sampler (1000 unless epsilon is small)
    for ref in (1000.0, 100.0, 10.0, 1.0):
        try:
            c = math.sqrt(discrete_gaussian_sigma2(epsilon, delta, ref)) / ref
            break
        except ValueError as err:
            if "grid units" not in str(err):
                raise
    else:
        raise ValueError(f"epsilon={epsilon:g} is too small for the discrete Gaussian's sampler at delta={delta:g}: "
                         f"sigma^2 exceeds {MAX_SIGMA2} grid units even at sensitivity 1 (use a larger epsilon)")
    target = math.sqrt(max_sigma2) / c - math.sqrt(n)
    if target <= 1:
        raise ValueError(f"n={n} is too large for an integer grid at sigma^2 <= {max_sigma2} (sqrt(n) rounding "
                         f"error alone needs more noise)")
    k = math.ceil(math.log2(sensitivity / target))
    while discrete_gaussian_sigma2(epsilon, delta, integer_sensitivity(sensitivity, 2.0 ** k, n)) > max_sigma2:
        k += 1
    return 2.0 ** k


def discrete_gaussian_release(x: torch.Tensor, epsilon: float, delta: float, sensitivity: float, *,
                              grid: float | None = None, rng=None) -> torch.Tensor:
    """``(epsilon, delta)``-DP release of every row of ``x`` ``[m, ...]`` (one user per row, inputs at L2
    distance at most ``sensitivity``) by the discrete Gaussian on a grid: ``grid * (round(x / grid) +
    Z)``, ``Z ~ N_Z(0, sigma2)`` i.i.d. per coordinate, ``sigma2`` from :func:`discrete_gaussian_sigma2`
    at the integer sensitivity :func:`integer_sensitivity` ``(sensitivity, grid, n)`` with ``n`` the
    coordinates per row. ``grid`` (public) defaults to :func:`choose_grid`. The result is computed in
    float64 (exact: grid times an integer below ``2^53``) and cast to ``x``'s dtype, a deterministic map
    of the integers. Clipping is the caller's job (the guarantee holds for inputs whose rows are within
    ``sensitivity`` of each other).

    Returns a tensor of ``x``'s shape and dtype. Raises ``ValueError`` naming the argument on a non-float
    or non-finite ``x``, bad privacy parameters or ``grid``, or values too large for the grid."""
    x = torch.as_tensor(x)
    if not x.is_floating_point() or x.ndim < 1:
        raise ValueError(f"x must be a floating-point tensor [m, ...], got {x.dtype} {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x must be finite")
    rows = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)
    n = max(rows.shape[1], 1)
    if grid is None:
        grid = choose_grid(epsilon, delta, sensitivity, n)
    sens_int = integer_sensitivity(sensitivity, grid, n)
    s = discrete_gaussian_sigma2(epsilon, delta, sens_int)
    k = torch.round(rows.double() / grid)
    if bool((k.abs() > 2.0 ** 52).any()):
        raise ValueError(f"x is too large for grid={grid:g} (integers beyond 2^52)")
    z = torch.from_numpy(sample_discrete_gaussian(s, tuple(rows.shape), rng=rng).astype(np.float64))
    out = (grid * (k + z)).to(x.dtype)
    return out.reshape(x.shape)
