"""d-privacy (metric privacy) with the Laplace mechanism under the Euclidean distance in R^n.

Galli, Biswas, Jung, Cucinotta & Palamidessi, "Group privacy for personalized federated learning"
(Sec. 2.3, Sec. 3.1-3.2, Algorithm 2, Proposition 3.1, Proposition 3.2, Theorem 3.1), building on
d-privacy of Chatzikokolakis et al. (2013); the floating-point-safe release follows Mironov, "On
significance of the least significant bits for differential privacy" (CCS 2012, Sec. 5.2).

A mechanism ``R`` is epsilon-d-private when ``P[R(x1) in S] <= exp(eps * d(x1, x2)) P[R(x2) in S]``
(Galli et al., Eq. 5). The Euclidean Laplace mechanism releases ``x0 + rho`` with density
``K exp(-eps ||x - x0||_2)``. Proposition 3.1 says

1. ``K = eps^n Gamma(n/2) / (2 pi^(n/2) Gamma(n))`` and the mechanism is eps-d-private;
2. the radius ``||rho||_2`` follows ``Gamma(shape=n, rate=eps)``;
3. each component of ``rho`` has variance ``(n + 1) / eps^2``.

Because the density depends on ``x`` only through ``||x - x0||``, a draw is a Gamma radius times a
direction uniform on the unit sphere; :func:`sample_euclidean_laplace` builds it from SciPy's
``gamma`` and ``uniform_direction`` distributions.

Which guarantee each release gives:

* :func:`release_euclidean_laplace` with a fixed eps, ``safe=True`` (the default, snapping): eps-d-private
  up to an additive floating-point slack ``eps_fp`` (:func:`snapping_extra_epsilon`, about 1e-12).
  With ``safe=False`` (float noise added in float32, the paper's implementation) no finite eps holds:
  :mod:`fedlab.attacks.floating_point` builds an event of probability zero under one secret.
* :func:`sanitize_update` is Algorithm 2 (SanitizeUpdate): ``eps = n / (nu ||delta||)`` so that every
  participation "leaks ``n / nu`` towards the ``||delta||``-neighbourhood". Its safe release snaps to a
  grid that depends on no secret (:func:`public_grid`; a grid from this eps would reveal the norm's
  power-of-two bin) at a floating-point slack of at most ``fp_slack`` per release. Eps is computed
  from the secret, so this is *not* eps-d-private for any eps: one release reveals ``||delta||``
  (:func:`norm_disclosure`) and the loss between nearby secrets exceeds ``eps d`` often
  (:func:`privacy_loss_check`).
* :func:`sanitize_update_clipped` clips ``delta`` to a radius R and uses a fixed eps: eps-d-private in
  the Euclidean metric and ``2 eps R``-locally differentially private.

:class:`PrivacyAccountant` composes leakages per client by summation (Theorem 3.1) and can refuse a
participation that would exceed a budget; its docstring says what the sum means.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.special import gammaln

from .clipping import _check_pair, clip_update, l2_norm  # noqa: F401  (clip_update: its old home)

# scipy.stats is imported inside the three functions that use it: importing it costs ~1.5 s of CPU in
# every process that imports fedlab.privacy (each notebook kernel, each test worker)

__all__ = [
    "laplace_constant", "log_laplace_density", "log_likelihood_ratio", "radius_distribution",
    "expected_radius", "component_variance", "sample_euclidean_laplace", "DEFAULT_BOUND",
    "snapping_grid", "snapping_extra_epsilon", "DEFAULT_FP_SLACK", "public_grid", "epsilon_cap",
    "release_euclidean_laplace", "sanitize_update",
    "sanitize_update_clipped", "SanitizedUpdate", "estimate_update_norm",
    "norm_disclosure", "clopper_pearson", "empirical_privacy_loss", "privacy_loss_check",
    "PrivacyAccountant", "rmse_increase_bound",
]


def _check_eps(epsilon) -> np.ndarray:
    eps = np.asarray(epsilon, dtype=np.float64)
    if eps.size == 0 or np.any(~(eps > 0)):
        raise ValueError(f"epsilon must be > 0 (inf allowed for no noise), got {epsilon}")
    return eps


def _check_n(n) -> int:
    if int(n) != n or n < 1:
        raise ValueError(f"n (the dimension) must be a positive integer, got {n}")
    return int(n)


def _rng(rng) -> np.random.Generator:
    """``rng`` as a Generator (:func:`fedlab.config.as_generator`: an int seeds a new one, ``None``
    takes the seeded :func:`fedlab.config.global_rng`, never OS entropy)."""
    from ..config import as_generator

    return as_generator(rng)


def laplace_constant(n: int, epsilon: float, *, log: bool = False) -> float:
    """Normalising constant ``K`` of the Euclidean Laplace density in ``R^n`` (Galli et al.,
    Prop. 3.1 item 1, Eq. 9): ``K = eps^n Gamma(n/2) / (2 pi^(n/2) Gamma(n))``.

    Computed in log space (``log=True`` returns ``log K``) so that large ``n`` does not overflow.

    Raises ``ValueError`` if ``n`` is not a positive integer or ``epsilon <= 0``.
    """
    n = _check_n(n)
    eps = float(_check_eps(epsilon))
    logk = n * math.log(eps) + gammaln(n / 2) - math.log(2) - (n / 2) * math.log(math.pi) - gammaln(n)
    return logk if log else math.exp(logk)


def log_laplace_density(x: torch.Tensor, x0: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``log L_{x0,eps}(x) = log K - eps ||x - x0||_2`` for ``x`` of shape ``[..., n]`` and ``x0`` of
    shape ``[n]`` (or broadcastable). Returns shape ``[...]`` (float64).

    Raises ``ValueError`` on ``epsilon <= 0`` or mismatched last dimensions.
    """
    x, x0 = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(x0, dtype=torch.float64)
    if x.shape[-1] != x0.shape[-1]:
        raise ValueError(f"x and x0 must have the same dimension, got {x.shape[-1]} and {x0.shape[-1]}")
    logk = laplace_constant(x.shape[-1], epsilon, log=True)
    return logk - float(epsilon) * torch.linalg.vector_norm(x - x0, dim=-1)


def log_likelihood_ratio(y: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor,
                         epsilon: float) -> torch.Tensor:
    """``log L_{x1}(y) - log L_{x2}(y)``: the privacy loss of output ``y`` between secrets ``x1`` and
    ``x2``. d-privacy (Galli et al., Eq. 10-11) says it never exceeds ``eps * ||x1 - x2||_2``.
    All inputs have last dimension ``n``; returns shape ``[...]``."""
    return log_laplace_density(y, x1, epsilon) - log_laplace_density(y, x2, epsilon)


def radius_distribution(n: int, epsilon: float):
    """The law of ``||rho||_2`` (Prop. 3.1 item 2): a frozen ``scipy.stats.gamma`` with shape ``n`` and
    scale ``1/eps`` (density ``eps^n exp(-eps r) r^(n-1) / Gamma(n)``)."""
    n = _check_n(n)
    eps = float(_check_eps(epsilon))
    from scipy import stats

    return stats.gamma(a=n, scale=1.0 / eps)


def expected_radius(n: int, epsilon: float) -> float:
    """``E ||rho||_2 = n / eps`` (Galli et al., Sec. 3.2)."""
    return _check_n(n) / float(_check_eps(epsilon))


def component_variance(n: int, epsilon: float) -> float:
    """Variance of one coordinate of ``rho``: ``(n + 1) / eps^2`` (Prop. 3.1 item 3)."""
    return (_check_n(n) + 1) / float(_check_eps(epsilon)) ** 2


def sample_euclidean_laplace(n: int, epsilon, size: int | None = None, *, rng=None,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Draw ``rho ~ L_{0,eps}`` in ``R^n`` (Galli et al., Sec. 3.1): radius from
    ``Gamma(shape=n, rate=eps)`` (``scipy.stats.gamma``), direction uniform on the unit sphere
    (``scipy.stats.uniform_direction``), ``rho = radius * direction``.

    Parameters
    ----------
    n : int
        Dimension.
    epsilon : float or array of shape ``[size]``
        Privacy parameter(s); one value per draw is allowed (per-client epsilons of Algorithm 2).
        ``inf`` gives ``rho = 0``.
    size : int, optional
        Number of draws; ``None`` returns one vector ``[n]``, else ``[size, n]``.
    rng : numpy Generator or int seed, optional
        ``None`` uses :func:`fedlab.config.global_rng`.
    dtype : torch floating-point dtype
        Of the returned noise.

    Raises
    ------
    ValueError
        On ``n < 1``, ``epsilon <= 0``, an epsilon array whose length is not ``size``, a ``size`` that is
        not a positive integer, a ``dtype`` that is not floating point, or noise that overflows
        ``dtype`` (an epsilon below about ``1e-38`` in float32).
    """
    n = _check_n(n)
    eps = _check_eps(epsilon)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch dtype (integer noise would be truncated), got {dtype}")
    if size is not None and (isinstance(size, bool) or int(size) != size or size < 1):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    gen = _rng(rng)
    m = 1 if size is None else int(size)
    if eps.ndim > 0 and eps.size not in (1, m):
        raise ValueError(f"epsilon has {eps.size} values but size is {m}")
    eps = np.broadcast_to(eps.reshape(-1) if eps.ndim else eps, (m,))
    finite = np.isfinite(eps)
    scale = np.where(finite, 1.0 / np.where(finite, eps, 1.0), 0.0)
    # the draws of stats.gamma.rvs(n, size=m) and stats.uniform_direction(n).rvs(size=m) with random_state=gen,
    # made directly (the same generator calls and arithmetic, without SciPy's per-call argument handling;
    # tests/test_dprivacy.py compares the two)
    radius = gen.standard_gamma(n, m) * scale
    if n == 1:
        direction = np.where(gen.random(m) < 0.5, -1.0, 1.0)[:, None]
    else:
        direction = gen.standard_normal((m, n))
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    rho = torch.from_numpy(radius[:, None] * direction).to(dtype)
    if not bool(torch.isfinite(rho).all()):
        raise ValueError(f"epsilon too small for {dtype}: the noise overflows to inf (smallest epsilon "
                         f"{float(eps.min()):g}; use float64 or a larger epsilon)")
    return rho[0] if size is None else rho


# ------------------------------------------------------------------------------------------------
# Floating-point-safe release: the snapping mechanism (Mironov 2012, Sec. 5.2) in R^n
# ------------------------------------------------------------------------------------------------
#: Default clamp bound ``B`` of the safe release: parameters are clamped to ``[-B, B]`` before noise
#: and the output after it. A power of two, far above the parameters of the course's models.
DEFAULT_BOUND = 2.0 ** 10
_UNIT_ROUNDOFF = 2.0 ** -53      # float64
_SAMPLER_ULPS = 3                # assumed relative error of one float64 noise coordinate, in roundoffs


def _check_bound(bound) -> float:
    b = float(bound)
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"bound must be a finite number > 0, got {bound!r}")
    return b


def _rounding_error(bound: float, grid: np.ndarray) -> np.ndarray:
    """``tau``: the largest error, per coordinate, of the float64 sum ``clamp_B(x) + rho`` against the
    exact sum wherever it can change the released cell (``|x + rho| <= B + grid``)."""
    return (_SAMPLER_ULPS + 1) * _UNIT_ROUNDOFF * (2 * bound + grid)


def snapping_grid(epsilon, bound: float = DEFAULT_BOUND) -> np.ndarray:
    """The grid ``Lambda`` of the safe release: the smallest power of two ``>= 1/epsilon`` (Mironov 2012,
    Sec. 5.2, whose Laplace scale ``lambda`` is ``1/epsilon`` here), and never finer than
    ``64 tau`` (so the extra epsilon of :func:`snapping_extra_epsilon` stays finite when ``epsilon``
    is huge). ``epsilon`` scalar or array ``[m]`` (``inf`` gives ``0``: no noise, no grid); returns
    float64 of the same shape. Raises ``ValueError`` on ``epsilon <= 0`` or a bad ``bound``."""
    eps = _check_eps(epsilon)
    b = _check_bound(bound)
    finite = np.isfinite(eps)
    safe_eps = np.where(finite, eps, 1.0)
    lam = np.exp2(np.ceil(-np.log2(safe_eps)))
    floor = np.exp2(np.ceil(np.log2(64 * _rounding_error(b, 0.0))))
    return np.where(finite, np.maximum(lam, floor), 0.0)


def snapping_extra_epsilon(n: int, epsilon, bound: float = DEFAULT_BOUND, *, grid=None) -> np.ndarray:
    """Extra privacy loss ``eps_fp`` of the safe release (:func:`release_euclidean_laplace` with
    ``safe=True``): for every pair of secrets and every released vector ``y``,
    ``log P[y | x1] - log P[y | x2] <= epsilon * ||x1 - x2|| + eps_fp``.

    Derivation (our n-dimensional version of Mironov 2012, Sec. 5.2, Theorem 1, which is stated for
    the 1-D Laplace mechanism with a sampler built on an exactly rounded logarithm and whose extra
    term is of order ``2^-49 B / lambda``). Model, stated not proved for SciPy's samplers: the float64 noise coordinate
    equals an exact draw of ``L_{0,eps}`` up to a relative error of ``3 * 2^-53``; the float64 sum adds
    one rounding. Where the cell can change (``|z_i| <= B + Lambda``) the computed ``z~ = clamp_B(x) + rho``
    is then within ``tau = 4 * 2^-53 (2B + Lambda)`` of the exact ``z`` in every coordinate. Output
    ``y`` (a grid point, after clamping) has the cell ``C(y)``; write ``C+`` / ``C-`` for it grown /
    shrunk by ``tau`` per side. Then ``P[y | x1] <= P[z1 in C+] <= e^{eps d} P[z2 in C+]`` (exact
    d-privacy, post-processing) and ``P[z2 in C+] <= R * P[z2 in C-] <= R * P[y | x2]``, where the map
    from ``C-`` onto ``C+`` that scales the bounded sides by ``s = (Lambda + 2 tau) / (Lambda - 2 tau)``
    about their centre and shifts the half-infinite (clamped) sides by ``2 tau`` moves no point by
    more than ``2 tau`` per coordinate, so the density drops by at most ``e^{2 eps tau sqrt(n)}``,
    and its Jacobian is at most ``s^n``: ``eps_fp = log R = n log s + 2 eps tau sqrt(n)``.

    The term does not scale with the distance: it is an additive slack on every pair, tiny for the
    course's settings (about 2e-12 at n = 2, eps = 0.4, B = 1024). ``epsilon`` scalar or ``[m]``
    (``inf``: nothing is added, 0 returned). ``grid``: the grid ``Lambda`` actually used (scalar or
    ``[m]``; default :func:`snapping_grid` of ``epsilon``); the derivation holds for any grid that does
    not depend on the secret and is coarser than ``4 tau``. Raises ``ValueError`` on bad ``n``,
    ``epsilon``, ``bound`` or a ``grid`` that is not finite and ``> 4 tau``.
    """
    n = _check_n(n)
    eps = _check_eps(epsilon)
    b = _check_bound(bound)
    lam = snapping_grid(eps, b) if grid is None else _check_grid(grid, b)
    finite = np.isfinite(eps)
    lam_f = np.where(finite, lam, 1.0)
    tau = _rounding_error(b, lam_f)
    extra = n * np.log1p(4 * tau / (lam_f - 2 * tau)) + 2 * np.where(finite, eps, 0.0) * tau * math.sqrt(n)
    return np.where(finite, extra, 0.0)


def _check_grid(grid, bound: float) -> np.ndarray:
    g = np.asarray(grid, dtype=np.float64)
    if g.size == 0 or not np.all(np.isfinite(g)) or np.any(g <= 4 * _rounding_error(bound, g)):
        raise ValueError(f"grid must be finite and coarser than the float64 rounding error "
                         f"(> {4 * _rounding_error(bound, 0.0):.3g} for bound={bound:g}), got {grid!r}")
    return g


#: Default floating-point slack of the adaptive release (:func:`sanitize_update`): the largest
#: ``eps_fp`` it may add to each release's privacy loss, and what :class:`PrivacyAccountant`
#: charges per release on top of ``n / nu`` in :func:`fedlab.fl.ifca.ifca`.
DEFAULT_FP_SLACK = 1e-4


def public_grid(n: int, bound: float = DEFAULT_BOUND, fp_slack: float = DEFAULT_FP_SLACK) -> float:
    """The snapping grid of the *adaptive* release (:func:`sanitize_update`), chosen from public
    quantities only: the finest power of two ``Lambda`` whose volume term
    ``n log((Lambda + 2 tau) / (Lambda - 2 tau))`` of :func:`snapping_extra_epsilon` is at most
    ``fp_slack / 2`` (``tau`` the float64 rounding error at ``bound``).

    Why not :func:`snapping_grid` of the release's epsilon: Algorithm 2's epsilon is
    ``n / (nu ||delta||)``, a function of the secret, so a grid chosen from it tells the server the
    power-of-two bin of ``||delta||`` in one release (norms 0.79 and 0.81 at ``n = 2``,
    ``nu = 5`` get grids 2 and 4, and "some coordinate off the 4-grid" has probability about 0.74
    under one and 0 under the other). A grid from ``n``, ``bound`` and ``fp_slack`` is the same for
    every secret. It is usually much finer than the noise (about ``7e-6 n`` for the default ``bound``
    and slack, against a noise scale ``nu ||delta|| / n``), so the release is close to the plain one.

    Returns a float. Raises ``ValueError`` on bad ``n``, ``bound`` or ``fp_slack`` (finite, > 0).
    """
    n = _check_n(n)
    b = _check_bound(bound)
    if not (fp_slack > 0 and math.isfinite(fp_slack)):
        raise ValueError(f"fp_slack must be a finite number > 0, got {fp_slack!r}")
    k = math.ceil(math.log2(64 * _rounding_error(b, 0.0)))
    while True:
        lam = 2.0 ** k
        tau = float(_rounding_error(b, lam))
        if lam > 4 * tau and n * math.log1p(4 * tau / (lam - 2 * tau)) <= fp_slack / 2:
            return lam
        k += 1


def epsilon_cap(n: int, bound: float = DEFAULT_BOUND, fp_slack: float = DEFAULT_FP_SLACK) -> float:
    """The largest epsilon the adaptive release uses: ``fp_slack / (4 tau sqrt(n))``, so that the
    density term ``2 eps tau sqrt(n)`` of :func:`snapping_extra_epsilon` stays below ``fp_slack / 2``.
    A larger ``n / (nu ||delta||)`` (a tiny update) is released with this epsilon instead: more noise
    than Algorithm 2 asks for, never less, so the leakage ``eps ||delta||`` stays below ``n / nu``.
    Raises ``ValueError`` as :func:`public_grid`."""
    n = _check_n(n)
    lam = public_grid(n, bound, fp_slack)
    return float(fp_slack / (4 * _rounding_error(_check_bound(bound), lam) * math.sqrt(n)))


def release_euclidean_laplace(x: torch.Tensor, epsilon, *, rng=None, safe: bool = True,
                              bound: float = DEFAULT_BOUND, grid=None) -> torch.Tensor:
    """Release ``x + rho`` with ``rho ~ L_{0,eps}`` (Galli et al., Prop. 3.1), one draw per row.

    ``safe=False`` is the textbook implementation: ``rho`` drawn in float64, cast to ``x.dtype`` and
    added in ``x.dtype``. It is not eps-d-private on a computer: the set of floats reachable as
    ``x + rho`` depends on ``x`` (Mironov 2012, Sec. 3-4), and
    :func:`fedlab.attacks.floating_point.distinguishing_event_probabilities` finds an event with
    positive probability under one secret and probability zero under another.

    ``safe=True`` (default) is the snapping mechanism (Mironov 2012, Sec. 5.2) applied to every
    coordinate: ``clamp_B(round_Lambda(clamp_B(x) + rho))`` computed in float64, ``Lambda`` from
    :func:`snapping_grid`, the result cast to ``x.dtype`` (post-processing of a grid point, so the cast
    leaks nothing). It is ``(eps d + eps_fp)``-private with ``eps_fp`` from
    :func:`snapping_extra_epsilon`; clamping is a projection onto a box, which does not increase
    Euclidean distances. Rows with ``eps = inf`` are released exactly (clamped when ``safe``).

    Arguments: ``x``, the secrets, a float tensor ``[n]`` or ``[m, n]``; ``epsilon``, a scalar or an
    array ``[m]``, ``> 0`` (``inf`` allowed); ``rng``, a numpy Generator, an int seed or ``None``
    (:func:`fedlab.config.global_rng`); ``safe``, snapping (``True``) or the plain float addition
    (``False``); ``bound``, the clamp bound ``B > 0`` of the safe release; ``grid``, the snapping grid
    (scalar or ``[m]``; default :func:`snapping_grid` of ``epsilon``, right when ``epsilon`` is public;
    pass :func:`public_grid` when ``epsilon`` depends on the secret).

    Returns the released tensor, same shape and dtype as ``x``. Raises ``ValueError`` on a ``x`` that is
    not ``[n]`` / ``[m, n]`` floating point or not finite, bad ``epsilon`` (length not ``m``) or ``bound``.
    """
    x = torch.as_tensor(x)
    if x.ndim not in (1, 2) or not x.is_floating_point() or x.shape[-1] < 1:
        raise ValueError(f"x must be a floating-point tensor of shape [n] or [m, n], got "
                         f"{tuple(x.shape)} {x.dtype}")
    if not torch.isfinite(x).all():
        raise ValueError("x must be finite")
    single = x.ndim == 1
    xm = x.reshape(-1, x.shape[-1])
    m, n = xm.shape
    eps = _check_eps(epsilon)
    if eps.ndim > 0 and eps.size not in (1, m):
        raise ValueError(f"epsilon has {eps.size} values but x has {m} rows")
    eps = np.broadcast_to(eps.reshape(-1) if eps.ndim else eps, (m,))
    if not safe:
        out = xm + sample_euclidean_laplace(n, eps, size=m, rng=rng, dtype=xm.dtype)
    else:
        b = _check_bound(bound)
        x64 = xm.double().clamp(-b, b)
        rho = sample_euclidean_laplace(n, eps, size=m, rng=rng, dtype=torch.float64)
        lam_np = snapping_grid(eps, b) if grid is None else np.broadcast_to(_check_grid(grid, b), (m,))
        lam = torch.from_numpy(np.where(np.isfinite(eps), lam_np, 0.0)).unsqueeze(1)
        finite = torch.from_numpy(np.isfinite(eps)).unsqueeze(1)
        lam_f = torch.where(finite, lam, torch.ones_like(lam))
        snapped = torch.round((x64 + rho) / lam_f) * lam_f
        out = torch.where(finite, snapped, x64).clamp(-b, b).to(xm.dtype)
    return out[0] if single else out


@dataclass
class SanitizedUpdate:
    """Output of :func:`sanitize_update` and :func:`sanitize_update_clipped`.

    ``theta``: released parameters ``[..., n]``; ``epsilon``: per-vector epsilon ``[...]``;
    ``leakage``: ``eps * r`` per vector, the privacy loss towards every parameter vector at distance
    ``r`` (adaptive: ``r = ||delta||``, so ``n / nu``; ``inf`` for a zero update, which is released
    exactly; clipped: ``r = radius``, so ``n / nu`` too); ``noise``: ``theta - theta_local``, the
    perturbation actually applied (snapping and clamping included); ``fp_leakage``: the additive
    floating-point slack ``eps_fp`` of :func:`snapping_extra_epsilon` (0 for ``safe=False``, whose
    floating-point loss is unbounded); ``grid``: the snapping grid ``Lambda`` (0: none).
    """

    theta: torch.Tensor
    epsilon: torch.Tensor
    leakage: torch.Tensor
    noise: torch.Tensor
    fp_leakage: torch.Tensor | None = None
    grid: torch.Tensor | None = None


def _sanitized(tl, x, eps, leakage, *, rng, safe, bound, single, grid=None) -> SanitizedUpdate:
    n = tl.shape[-1]
    released = release_euclidean_laplace(x, eps.numpy(), rng=rng, safe=safe, bound=bound, grid=grid)
    if safe:
        fp = torch.from_numpy(snapping_extra_epsilon(n, eps.numpy(), bound, grid=grid))
        grid = torch.from_numpy(np.where(np.isfinite(eps.numpy()), snapping_grid(eps.numpy(), bound)
                                         if grid is None else grid, 0.0))
    else:
        fp, grid = torch.zeros_like(eps), torch.zeros_like(eps)
    out = SanitizedUpdate(released, eps, leakage, released - tl, fp, grid)
    if single:
        out = SanitizedUpdate(*(v[0] for v in (out.theta, eps, leakage, out.noise, fp, grid)))
    return out


def sanitize_update(theta_local: torch.Tensor, theta_global: torch.Tensor, nu: float, *,
                    rng=None, safe: bool = True, bound: float = DEFAULT_BOUND,
                    fp_slack: float = DEFAULT_FP_SLACK) -> SanitizedUpdate:
    """SanitizeUpdate (Galli et al., Algorithm 2) for one or many clients at once: the *adaptive*
    mechanism, whose epsilon is computed from the secret.

    ``delta = theta_local - theta_global``, ``eps = n / (nu ||delta||_2)``, ``rho ~ L_{0,eps}``,
    release ``theta_local + rho`` through :func:`release_euclidean_laplace` (snapping by default,
    ``safe=False`` for the paper's plain float addition).

    What it guarantees, plainly. For a *fixed* epsilon the Laplace release is eps-d-private
    (Prop. 3.1), so Galli et al. (Sec. 3.2) read one participation as "``n / nu``-indistinguishable
    from every vector in the ``||delta||``-ball". But epsilon is a function of the secret, so the
    mechanism as a whole is not eps-d-private for any eps: two secrets with different update norms
    use different noise laws, their privacy loss grows without bound far from them (like
    ``(eps_2 - eps_1) ||y||`` for an output ``y``), and one release estimates ``||delta||``
    (:func:`estimate_update_norm`; :func:`norm_disclosure`). :func:`privacy_loss_check` measures how
    often the loss exceeds the promised ``eps * d``. :func:`sanitize_update_clipped` is the
    data-independent variant with a real guarantee.

    Arguments: ``theta_local``, the locally updated parameters ``theta_{j,c}``, ``[n]`` or ``[K, n]``;
    ``theta_global``, the hypothesis ``theta_j`` each client started from, same shape; ``nu > 0``, the
    noise multiplier (``E ||rho|| = nu ||delta||``); ``rng``, a numpy Generator, an int seed or
    ``None``; ``safe`` and ``bound`` as in :func:`release_euclidean_laplace`; ``fp_slack``, the
    floating-point slack allowed per release (``safe=True`` only).

    The safe release snaps to :func:`public_grid` ``(n, bound, fp_slack)``, a grid that depends on no
    secret, and caps epsilon at :func:`epsilon_cap` (more noise for tiny updates, never less). A grid
    chosen from this epsilon (:func:`snapping_grid`, right for a fixed epsilon) would reveal the
    power-of-two bin of ``||delta||`` in one release (see :func:`public_grid`). With the public grid
    the floating-point side is closed: for two secrets ``x1, x2`` and every event ``S`` of outputs,
    ``P[S | x1]`` relates to ``P[S | x2]`` exactly as for the continuous adaptive mechanism, up to the
    factor ``exp(fp_leakage)`` with ``fp_leakage <= fp_slack`` (:func:`snapping_extra_epsilon` at the
    grid used). What the adaptive epsilon guarantees is then what the continuous mechanism guarantees:
    ``eps ||x1 - x2|| (+ fp_leakage)`` between secrets of *equal* update norm (same epsilon), and no
    eps-d-privacy between secrets of different norms (the noise law itself differs;
    :func:`privacy_loss_check`). ``fp_leakage`` is returned per row for the accountant.

    A client whose update is exactly zero gets ``eps = inf`` and is released exactly. That release
    tells the server ``delta = 0``, which no finite budget covers, so its ``leakage`` is ``inf``
    (:meth:`PrivacyAccountant.spend` refuses to record it; use :func:`sanitize_update_clipped`,
    which noises every update, or leave the client out).

    Raises ``ValueError`` on ``nu <= 0``, shape mismatch or non-finite parameters.
    """
    if not nu > 0 or not math.isfinite(nu):
        raise ValueError(f"nu (noise multiplier) must be a finite number > 0, got {nu}")
    theta_local, theta_global = _check_pair(theta_local, theta_global)
    single = theta_local.ndim == 1
    tl = theta_local.reshape(-1, theta_local.shape[-1])
    n = tl.shape[-1]
    norm = l2_norm((tl - theta_global).double())
    eps = torch.where(norm > 0, n / (nu * norm), torch.full_like(norm, math.inf))
    leakage = torch.where(norm > 0, torch.full_like(norm, n / nu), torch.full_like(norm, math.inf))
    grid = None
    if safe:
        grid = public_grid(n, bound, fp_slack)
        eps = torch.where(torch.isfinite(eps), eps.clamp(max=epsilon_cap(n, bound, fp_slack)), eps)
    return _sanitized(tl, tl, eps, leakage, rng=rng, safe=safe, bound=bound, single=single, grid=grid)


def sanitize_update_clipped(theta_local: torch.Tensor, theta_global: torch.Tensor, nu: float, *,
                            clip_norm: float, rng=None, safe: bool = True,
                            bound: float = DEFAULT_BOUND) -> SanitizedUpdate:
    """The data-independent variant of SanitizeUpdate: clip the update to ``clip_norm`` R, then add
    Euclidean Laplace noise with the *fixed* ``eps = n / (nu R)`` (the noise Algorithm 2 would use for
    an update of norm R; Galli et al., Algorithm 2 and Sec. 3.2, with the clipping of DP-FedAvg).

    Release ``clip_update(theta_local, theta_global, R) + rho`` through
    :func:`release_euclidean_laplace`. What it guarantees, plainly: for every two local models
    ``theta, theta'`` started from the same ``theta_global`` and every event,
    ``log P[.|theta] - log P[.|theta'] <= eps ||clip(theta) - clip(theta')|| (+ eps_fp when safe)
    <= eps * min(||theta - theta'||, 2R)``: eps-d-privacy in the Euclidean metric (Prop. 3.1 plus
    post-processing), hence ``2 eps R = 2 n / nu`` local DP between *any* two updates. ``leakage`` is
    ``eps R = n / nu`` (the loss towards a model at distance R); ``epsilon`` reveals nothing about the
    secret. The price: updates longer than R are shortened (bias), shorter ones get more noise than
    Algorithm 2 would give them.

    Shapes as :func:`sanitize_update`. Raises ``ValueError`` on ``nu <= 0``, ``clip_norm <= 0``, shape
    mismatch or non-finite parameters.
    """
    if not nu > 0 or not math.isfinite(nu):
        raise ValueError(f"nu (noise multiplier) must be a finite number > 0, got {nu}")
    clipped = clip_update(theta_local, theta_global, clip_norm)
    theta_local, _ = _check_pair(theta_local, theta_global)
    single = theta_local.ndim == 1
    tl = theta_local.reshape(-1, theta_local.shape[-1])
    n = tl.shape[-1]
    eps = torch.full((tl.shape[0],), n / (nu * clip_norm), dtype=torch.float64)
    leakage = torch.full_like(eps, n / nu)
    return _sanitized(tl, clipped.reshape(tl.shape), eps, leakage, rng=rng, safe=safe, bound=bound,
                      single=single)


# ------------------------------------------------------------------------------------------------
# What one release reveals: the update norm, and the privacy loss measured on outputs
# ------------------------------------------------------------------------------------------------
def estimate_update_norm(released: torch.Tensor, theta_global: torch.Tensor, nu: float) -> torch.Tensor:
    """Estimate ``||delta||`` from one release of the adaptive :func:`sanitize_update`.

    ``released - theta_global = delta + rho`` with ``E ||rho||^2 = n (n + 1) / eps^2
    = (n + 1) nu^2 ||delta||^2 / n`` (Prop. 3.1 items 2-3 with ``eps = n / (nu ||delta||)``) and
    ``E <delta, rho> = 0``, so ``||released - theta_global|| / sqrt(1 + nu^2 (n + 1) / n)`` estimates
    ``||delta||``, with relative spread ``~ 1 / sqrt(n)`` (the radius is Gamma(n)). The server knows
    ``theta_global`` (it sent it) and ``nu``. ``released`` ``[n]`` or ``[K, n]``; returns ``[]`` or
    ``[K]`` float64. Raises ``ValueError`` on ``nu <= 0`` or shape mismatch.
    """
    if not nu > 0 or not math.isfinite(nu):
        raise ValueError(f"nu must be a finite number > 0, got {nu}")
    released, theta_global = _check_pair(released, theta_global)
    n = released.shape[-1]
    dist = l2_norm((released - theta_global).double())
    return dist / math.sqrt(1 + nu**2 * (n + 1) / n)


def norm_disclosure(n: int, nu: float, *, norm: float = 1.0, num_trials: int = 10_000,
                    safe: bool = True, level: float = 0.95, rng=None) -> dict:
    """How well one release of the adaptive mechanism (:func:`sanitize_update`) reveals the update
    norm: ``num_trials`` updates of norm ``norm`` in uniformly random directions in ``R^n`` from
    ``theta_global = 0``, each released once, ``||delta||`` estimated by
    :func:`estimate_update_norm` (which ignores the snapping grid of ``safe=True``; at small ``n`` the
    grid is coarse and the median error differs from the plain release's, ``safe=False``).

    Returns ``{"median_relative_error": float, "interval": (lo, hi), "relative_errors": [num_trials]}``
    with the distribution-free order-statistic interval of the median at ``level``.
    Raises ``ValueError`` on bad ``n``, ``nu``, ``norm``, ``num_trials`` or ``level``.
    """
    n = _check_n(n)
    if not (norm > 0 and math.isfinite(norm)):
        raise ValueError(f"norm must be a finite number > 0, got {norm}")
    if int(num_trials) != num_trials or num_trials < 10:
        raise ValueError(f"num_trials must be an integer >= 10, got {num_trials}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    gen = _rng(rng)
    m = int(num_trials)
    direction = gen.standard_normal((m, n))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    theta_local = torch.from_numpy(norm * direction)
    out = sanitize_update(theta_local, torch.zeros(n, dtype=torch.float64), nu, rng=gen, safe=safe)
    rel = (np.abs(estimate_update_norm(out.theta, torch.zeros(n, dtype=torch.float64), nu).numpy()
                  - norm) / norm)
    srt = np.sort(rel)
    from scipy import stats

    lo_i, hi_i = stats.binom(m, 0.5).interval(level)
    return {"median_relative_error": float(np.median(rel)),
            "interval": (float(srt[max(int(lo_i) - 1, 0)]), float(srt[min(int(hi_i), m - 1)])),
            "relative_errors": rel}


def clopper_pearson(k, m, level: float = 0.95):
    """Exact (Clopper-Pearson) two-sided interval for a binomial proportion, vectorised: ``k``
    successes out of ``m`` trials (arrays broadcast). Returns ``(lo, hi)`` float64 arrays.
    Raises ``ValueError`` on ``k < 0``, ``k > m`` or ``level`` outside (0, 1)."""
    k, m = np.asarray(k, dtype=np.float64), np.asarray(m, dtype=np.float64)
    if np.any(k < 0) or np.any(k > m) or np.any(m < 1):
        raise ValueError("k must lie in [0, m] and m must be >= 1")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    from scipy import stats

    a = (1 - level) / 2
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(a, k, m - k + 1), 0.0)
        hi = np.where(k < m, stats.beta.ppf(1 - a, k + 1, m - k), 1.0)
    return lo, hi


def empirical_privacy_loss(t1, t2, edges, *, level: float = 0.99) -> dict:
    """The privacy loss of a mechanism measured on its *outputs*: histograms of a statistic of the
    outputs under two secrets (``t1`` ``[N1]``, ``t2`` ``[N2]``, e.g. outputs projected on the line
    through the secrets) on the bins ``edges`` ``[B + 1]``, and for every bin ``b`` the log ratio
    ``log P1[b] - log P2[b]`` with simultaneous confidence bounds.

    For an eps-d-private mechanism every bin satisfies ``|log P1[b] - log P2[b]| <= eps d(x1, x2)``
    (Galli et al., Eq. 5, with ``S`` the preimage of the bin). The bounds come from the conditional
    binomial: given the ``c1 + c2`` samples in a bin, ``c1`` is binomial with ``q = N1 P1 / (N1 P1 +
    N2 P2)``, so an exact (Clopper-Pearson) interval for ``q`` at level ``1 - (1 - level) / B_used``
    (Bonferroni over the ``B_used`` non-empty bins) maps to ``log(q / (1 - q)) + log(N2 / N1)``. A bin
    seen under one secret only gets a finite lower and an infinite upper bound.

    Returns ``{"log_ratio", "lower", "upper"}`` (float64 ``[B]``, NaN for empty bins),
    ``"counts"`` (``[2, B]``), ``"max_lower"``: the largest lower bound of ``|log ratio|`` over bins
    (a violation of ``eps d`` is established, at ``level``, when it exceeds ``eps d``).
    Raises ``ValueError`` on empty samples, non-increasing ``edges`` or a bad ``level``.
    """
    t1, t2 = np.asarray(t1, dtype=np.float64).ravel(), np.asarray(t2, dtype=np.float64).ravel()
    edges = np.asarray(edges, dtype=np.float64)
    if t1.size == 0 or t2.size == 0:
        raise ValueError("t1 and t2 must be non-empty")
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError("edges must be a strictly increasing 1-D array with at least 2 entries")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    c1 = np.histogram(t1, edges)[0].astype(np.float64)
    c2 = np.histogram(t2, edges)[0].astype(np.float64)
    tot = c1 + c2
    used = tot > 0
    nb = max(int(used.sum()), 1)
    shift = math.log(t2.size / t1.size)
    lo, hi = clopper_pearson(c1[used], tot[used], 1 - (1 - level) / nb)
    with np.errstate(divide="ignore"):
        def logit(q):
            return np.log(q) - np.log1p(-q)
        lower = np.full(c1.shape, np.nan)
        upper = np.full(c1.shape, np.nan)
        est = np.full(c1.shape, np.nan)
        lower[used], upper[used] = logit(lo) + shift, logit(hi) + shift
        est[used] = np.log(c1[used]) - np.log(c2[used]) + shift
    abs_lower = np.where(used, np.maximum(np.nan_to_num(lower, nan=-np.inf), -np.nan_to_num(upper, nan=np.inf)),
                         -np.inf)
    return {"log_ratio": est, "lower": lower, "upper": upper, "counts": np.stack([c1, c2]),
            "max_lower": float(abs_lower.max())}


def privacy_loss_check(theta_1: torch.Tensor, theta_2: torch.Tensor, theta_global: torch.Tensor,
                       nu: float, *, clip_norm: float | None = None, num_samples: int = 100_000,
                       level: float = 0.95, rng=None) -> dict:
    """Privacy loss of the exact (continuous) mechanism between two secrets, on its own outputs.

    Draws ``y`` from the mechanism run on ``theta_1`` (adaptive :func:`sanitize_update` when
    ``clip_norm`` is ``None``, else :func:`sanitize_update_clipped`; the continuous law, so the density
    is exact) and evaluates ``L(y) = log p(y | theta_1) - log p(y | theta_2)`` with each secret's own
    mechanism (adaptive: ``eps_i = n / (nu ||theta_i - theta_global||)``; clipped: one eps and the
    clipped centres). The bound is what the mechanism promises: adaptive, ``eps_1 ||theta_1 -
    theta_2||`` with the eps of the release observed (Galli et al., Sec. 3.2; with ``max(eps_1,
    eps_2)`` instead the rates barely move); clipped, ``eps ||clip(theta_1) - clip(theta_2)||
    <= eps min(||theta_1 - theta_2||, 2R)``, which the clipped mechanism attains on the ray through
    the clipped secrets and never exceeds.

    Returns ``{"loss": [num_samples] float64, "bound": float, "violation_rate": float,
    "interval": (lo, hi)}`` (Clopper-Pearson at ``level``). Inputs are ``[n]`` vectors.
    Raises ``ValueError`` on bad shapes, a zero update, ``nu``, ``clip_norm``, ``num_samples``.
    """
    if not nu > 0 or not math.isfinite(nu):
        raise ValueError(f"nu must be a finite number > 0, got {nu}")
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples}")
    t1, g = _check_pair(torch.as_tensor(theta_1, dtype=torch.float64), theta_global)
    t2, _ = _check_pair(torch.as_tensor(theta_2, dtype=torch.float64), theta_global)
    if t1.ndim != 1 or t2.shape != t1.shape or g.ndim != 1:
        raise ValueError("theta_1, theta_2 and theta_global must be vectors [n] of one length")
    n = t1.shape[0]
    if clip_norm is None:
        d1, d2 = float(torch.linalg.vector_norm(t1 - g)), float(torch.linalg.vector_norm(t2 - g))
        if d1 == 0 or d2 == 0:
            raise ValueError("theta_1 and theta_2 must differ from theta_global (adaptive eps is inf)")
        e1, e2 = n / (nu * d1), n / (nu * d2)
        c1, c2 = t1, t2
    else:
        c1, c2 = clip_update(t1, g, clip_norm), clip_update(t2, g, clip_norm)
        e1 = e2 = n / (nu * clip_norm)
    y = c1 + sample_euclidean_laplace(n, e1, int(num_samples), rng=rng, dtype=torch.float64)
    loss = (log_laplace_density(y, c1, e1) - log_laplace_density(y, c2, e2)).numpy()
    bound = e1 * float(torch.linalg.vector_norm(t1 - t2) if clip_norm is None else torch.linalg.vector_norm(c1 - c2))
    k = int((loss > bound * (1 + 1e-9)).sum())
    lo, hi = clopper_pearson(k, loss.size, level)
    return {"loss": loss, "bound": bound, "violation_rate": k / loss.size,
            "interval": (float(lo), float(hi))}


@dataclass
class PrivacyAccountant:
    """Per-client d-privacy ledger (Galli et al., Theorem 3.1 and Sec. 4.1).

    Releases compose by summation: after participations with leakages ``l_i = eps_i r_i`` a client is
    credited ``sum_i l_i`` (``spent``), the paper's number. Read it with care:

    * ``l_i = eps_i ||delta_i||`` is the loss towards vectors in the ``||delta_i||``-ball of *that round*;
      the ball shrinks as training converges, so the sum protects a different, shrinking neighbourhood
      each round. For a fixed radius ``r`` the composed loss is ``r * sum_i eps_i``
      (:meth:`budget_at_radius`), available when :meth:`spend` is given the ``epsilon`` of each release.
    * Theorem 3.1 is stated for an *independent* composition; in IFCA the rounds are adaptive (round
      ``t`` trains on models built from earlier releases, and the clients' secrets change every
      round). Sequential composition of pure guarantees also holds adaptively when each round's eps
      is fixed before the secret is seen (the likelihood ratio of the transcript factorises round by
      round), but the paper does not state or prove that version, and it does not apply when eps is
      computed from the secret, as in the adaptive :func:`sanitize_update`: there the ledger's
      number is a bookkeeping convention, not a guarantee. :func:`sanitize_update_clipped` fixes eps.
    * "Group privacy" in Galli et al. means indistinguishability among clients whose parameters lie
      in one neighbourhood (a cluster). It is *not* DP's group privacy (the ``k * eps`` bound for
      datasets differing in ``k`` records).

    With a ``budget``, a client refuses (``refuse_past_budget=True``) any participation that would
    push its total above it; the decision is made before the client releases anything.

    The floating-point slack of the safe release (``SanitizedUpdate.fp_leakage``, at most
    ``fp_slack`` per release) is charged too when :meth:`spend` is given it: it enters ``spent`` and is
    kept apart in ``fp_spent``; a refusal decided before the release should test ``allowed(c, n / nu
    + fp_slack)``, the public upper bound (:func:`fedlab.fl.ifca.ifca` does).

    Attributes: ``spent`` float64 array ``[num_clients]`` (leakage plus floating-point slack);
    ``fp_spent`` float64 ``[num_clients]`` (the slack alone); ``epsilon_spent`` float64 ``[num_clients]``
    (sum of the eps of the releases, NaN once a release was recorded without one);
    ``participations`` int array; ``log`` a list of ``(round, client, leakage)``.
    """

    num_clients: int
    budget: float | None = None
    refuse_past_budget: bool = True
    spent: np.ndarray = field(init=False)
    fp_spent: np.ndarray = field(init=False)
    epsilon_spent: np.ndarray = field(init=False)
    participations: np.ndarray = field(init=False)
    log: list = field(init=False, default_factory=list)

    def __post_init__(self):
        if isinstance(self.num_clients, bool) or int(self.num_clients) != self.num_clients or self.num_clients < 1:
            raise ValueError(f"num_clients must be a positive integer, got {self.num_clients}")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise ValueError(f"budget must be a finite number > 0 or None, got {self.budget}")
        self.spent = np.zeros(int(self.num_clients))
        self.fp_spent = np.zeros(int(self.num_clients))
        self.epsilon_spent = np.zeros(int(self.num_clients))
        self.participations = np.zeros(int(self.num_clients), dtype=np.int64)

    def _clients(self, clients, *, unique: bool = True) -> np.ndarray:
        c = np.atleast_1d(np.asarray(clients))
        if c.ndim != 1 or (c.size and not np.issubdtype(c.dtype, np.integer)):
            raise ValueError(f"clients must be an integer id or a 1-D array of ids, got {clients!r}")
        c = c.astype(np.int64)
        if c.size and (c.min() < 0 or c.max() >= self.num_clients):
            raise ValueError(f"clients must lie in [0, {self.num_clients}), got {c.tolist()}")
        if unique and np.unique(c).size != c.size:
            raise ValueError(f"clients must not repeat within one call, got {c.tolist()}")
        return c

    def _leakage(self, c, leakage) -> np.ndarray:
        lk = np.asarray(leakage, dtype=np.float64)
        if lk.ndim > 1 or (lk.ndim == 1 and lk.size != c.size):
            raise ValueError(f"leakage must be a scalar or have one value per client ({c.size}), "
                             f"got shape {lk.shape}")
        lk = np.broadcast_to(lk, c.shape)
        if not np.all(np.isfinite(lk)):
            raise ValueError("leakage must be finite (NaN or inf would poison the ledger; an "
                             "adaptive release of a zero update has inf leakage)")
        if np.any(lk < 0):
            raise ValueError("leakage must be >= 0")
        return lk

    def allowed(self, clients, leakage) -> np.ndarray:
        """Boolean mask: which ``clients`` (distinct ids) may release a contribution of ``leakage``
        (scalar or one per client) without exceeding the budget. All ``True`` without a budget or
        refusal. Raises ``ValueError`` on unknown or repeated ids, or NaN / inf / negative leakage."""
        c = self._clients(clients)
        lk = self._leakage(c, leakage)
        if self.budget is None or not self.refuse_past_budget:
            return np.ones(c.shape, dtype=bool)
        return self.spent[c] + lk <= self.budget * (1 + 1e-12)

    def spend(self, clients, leakage, round: int | None = None, *, epsilon=None, fp_leakage=None) -> None:
        """Record that ``clients`` (distinct ids ``[m]``) released updates with the given ``leakage``
        (scalar or ``[m]``) and, optionally, the ``epsilon`` of each release (scalar or ``[m]``, for
        :meth:`budget_at_radius`) and its floating-point slack ``fp_leakage`` (scalar or ``[m]``,
        ``SanitizedUpdate.fp_leakage``), which is added to ``spent`` and to ``fp_spent``.

        Raises ``ValueError`` on a negative, NaN or infinite leakage, a non-positive or non-finite
        epsilon, unknown or repeated client ids (one release per client per call), or (with refusal
        on) a release that would exceed the budget. Nothing is recorded when it raises.
        """
        c = self._clients(clients)
        lk = self._leakage(c, leakage)
        if epsilon is None:
            ep = np.full(c.shape, np.nan)
        else:
            ep = np.asarray(epsilon, dtype=np.float64)
            if ep.ndim > 1 or (ep.ndim == 1 and ep.size != c.size):
                raise ValueError(f"epsilon must be a scalar or have one value per client ({c.size})")
            ep = np.broadcast_to(ep, c.shape)
            if not np.all(np.isfinite(ep) & (ep > 0)):
                raise ValueError("epsilon must be finite and > 0")
        fp = np.zeros(c.shape) if fp_leakage is None else self._leakage(c, fp_leakage)
        if not np.all(self.allowed(c, lk + fp)):
            raise ValueError("a release would exceed the privacy budget; call allowed() first")
        self.spent[c] += lk + fp
        self.fp_spent[c] += fp
        self.epsilon_spent[c] += ep
        self.participations[c] += 1
        self.log.extend((round, int(ci), float(li)) for ci, li in zip(c, lk))

    def total(self, client: int) -> float:
        """Composed leakage of one client (Theorem 3.1: the sum of its leakages)."""
        return float(self.spent[self._clients(client)][0])

    def budget_at_radius(self, radius: float) -> np.ndarray:
        """Composed loss of every client towards parameter vectors at distance ``radius``:
        ``radius * sum_i eps_i`` (Theorem 3.1 with ``d = radius``), float64 ``[num_clients]``; NaN for
        a client with a release recorded without its epsilon. Unlike ``spent``, this protects the same
        neighbourhood in every round. Raises ``ValueError`` on ``radius < 0`` or non-finite."""
        if not (radius >= 0 and math.isfinite(radius)):
            raise ValueError(f"radius must be a finite number >= 0, got {radius}")
        return radius * self.epsilon_spent

    def summary(self, radius: float | None = None) -> dict:
        """Median and maximum budget over the clients that participated at least once (the two
        statistics of Galli et al., Table 1), and how many participated. With ``radius``, also
        ``"median_at_radius"`` and ``"max_at_radius"`` from :meth:`budget_at_radius`."""
        used = self.participations > 0
        out = {"median": 0.0, "max": 0.0, "clients": 0}
        if used.any():
            out = {"median": float(np.median(self.spent[used])), "max": float(self.spent[used].max()),
                   "clients": int(used.sum())}
        if radius is not None:
            at = self.budget_at_radius(radius)[used]
            out["median_at_radius"] = float(np.median(at)) if at.size else 0.0
            out["max_at_radius"] = float(at.max()) if at.size else 0.0
        return out


# ------------------------------------------------------------------------------------------------
# Proposition 3.2: first-order bound on the increase of the RMSE under noise
# ------------------------------------------------------------------------------------------------
def rmse_increase_bound(model, theta: torch.Tensor, X: torch.Tensor) -> float:
    """First-order constant of Proposition 3.2: ``||J_f(X, theta)||_2 / sqrt(|Z|)``, with ``J_f`` the
    ``[|Z|, n]`` Jacobian of the predictions with respect to the parameters. To first order,
    ``RMSE(theta + rho) - RMSE(theta) <= bound * ||rho||_2`` whatever the direction of ``rho``.
    For a model linear in ``theta`` the bound is exact (no higher-order term)."""
    from torch.func import functional_call, jacrev

    from ..models import unflatten_params

    like = {k: v.detach() for k, v in model.named_parameters()}
    theta = torch.as_tensor(theta, dtype=torch.float32)
    if theta.ndim != 1 or theta.numel() != sum(v.numel() for v in like.values()):
        raise ValueError(f"theta must be a vector with the model's {sum(v.numel() for v in like.values())} "
                         f"parameters, got shape {tuple(theta.shape)}")

    def pred(t):
        return functional_call(model, unflatten_params(t, like), (X,)).reshape(-1)

    J = jacrev(pred)(theta)
    return float(torch.linalg.matrix_norm(J.double(), ord=2) / math.sqrt(X.shape[0]))
