"""d-privacy (metric privacy) with the Laplace mechanism under the Euclidean distance in R^n.

Galli, Biswas, Jung, Cucinotta & Palamidessi, "Group privacy for personalized federated learning"
(Sec. 2.3, Sec. 3.1-3.2, Algorithm 2, Proposition 3.1, Proposition 3.2, Theorem 3.1), building on
d-privacy of Chatzikokolakis et al. (2013).

A mechanism ``R`` is epsilon-d-private when ``P[R(x1) in S] <= exp(eps * d(x1, x2)) P[R(x2) in S]``
(Galli et al., Eq. 5). The Euclidean Laplace mechanism releases ``x0 + rho`` with density
``K exp(-eps ||x - x0||_2)``. Proposition 3.1 says

1. ``K = eps^n Gamma(n/2) / (2 pi^(n/2) Gamma(n))`` and the mechanism is eps-d-private;
2. the radius ``||rho||_2`` follows ``Gamma(shape=n, rate=eps)``;
3. each component of ``rho`` has variance ``(n + 1) / eps^2``.

Because the density depends on ``x`` only through ``||x - x0||``, a draw is a Gamma radius times a
direction uniform on the unit sphere; :func:`sample_euclidean_laplace` builds it from SciPy's
``gamma`` and ``uniform_direction`` distributions.

:func:`sanitize_update` is Algorithm 2 (SanitizeUpdate): ``eps = n / (nu ||delta||)`` so that every
participation leaks exactly ``eps * ||delta|| = n / nu`` towards the clients in the
``||delta||``-neighbourhood. :class:`PrivacyAccountant` composes these leakages per client by
summation (Theorem 3.1) and can refuse a participation that would exceed a budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats
from scipy.special import gammaln

__all__ = [
    "laplace_constant", "log_laplace_density", "log_likelihood_ratio", "radius_distribution",
    "expected_radius", "component_variance", "sample_euclidean_laplace", "sanitize_update",
    "SanitizedUpdate", "PrivacyAccountant", "rmse_increase_bound",
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
    """``rng`` as a Generator: an int seeds a new one; ``None`` takes :func:`fedlab.config.global_rng`
    (seeded from ``FEDLAB_SEED`` / :func:`fedlab.seed_everything`, never OS entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        from ..config import global_rng

        return global_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy Generator, an int seed or None, got {type(rng).__name__}")


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
    rng : numpy Generator or int seed; ``None`` uses :func:`fedlab.config.global_rng`

    Raises ``ValueError`` on ``n < 1``, ``epsilon <= 0`` or an epsilon array whose length is not ``size``.
    """
    n = _check_n(n)
    eps = _check_eps(epsilon)
    gen = _rng(rng)
    m = 1 if size is None else int(size)
    if m < 1:
        raise ValueError(f"size must be a positive integer or None, got {size}")
    if eps.ndim > 0 and eps.size not in (1, m):
        raise ValueError(f"epsilon has {eps.size} values but size is {m}")
    eps = np.broadcast_to(eps.reshape(-1) if eps.ndim else eps, (m,))
    finite = np.isfinite(eps)
    scale = np.where(finite, 1.0 / np.where(finite, eps, 1.0), 0.0)
    radius = stats.gamma.rvs(n, size=m, random_state=gen) * scale
    if n == 1:
        direction = np.where(gen.random(m) < 0.5, -1.0, 1.0)[:, None]
    else:
        direction = stats.uniform_direction(n).rvs(size=m, random_state=gen).reshape(m, n)
    rho = torch.from_numpy(radius[:, None] * direction).to(dtype)
    return rho[0] if size is None else rho


@dataclass
class SanitizedUpdate:
    """Output of :func:`sanitize_update`.

    ``theta``: released parameters ``[..., n]``; ``epsilon``: per-vector epsilon ``[...]``;
    ``leakage``: ``eps * ||delta||`` per vector (equal to ``n / nu``); ``noise``: the added ``rho``.
    """

    theta: torch.Tensor
    epsilon: torch.Tensor
    leakage: torch.Tensor
    noise: torch.Tensor


def sanitize_update(theta_local: torch.Tensor, theta_global: torch.Tensor, nu: float, *,
                    rng=None) -> SanitizedUpdate:
    """SanitizeUpdate (Galli et al., Algorithm 2) for one or many clients at once.

    ``delta = theta_local - theta_global``, ``eps = n / (nu ||delta||_2)``, ``rho ~ L_{0,eps}``,
    release ``theta_local + rho``. The client then is ``eps ||delta|| = n / nu``-indistinguishable
    from every parameter vector in its ``||delta||``-neighbourhood (Sec. 3.2).

    Parameters
    ----------
    theta_local : ``[n]`` or ``[K, n]``
        Locally updated parameters ``theta_{j,c}``.
    theta_global : ``[n]`` or ``[K, n]``
        The hypothesis each client started from ``theta_j``.
    nu : float > 0
        Noise multiplier; ``E ||rho|| = nu ||delta||``.

    A client whose update is exactly zero gets ``eps = inf`` and no noise (nothing to hide).

    Raises ``ValueError`` on ``nu <= 0`` or shape mismatch.
    """
    if not nu > 0:
        raise ValueError(f"nu (noise multiplier) must be > 0, got {nu}")
    theta_local = torch.as_tensor(theta_local)
    theta_global = torch.as_tensor(theta_global, dtype=theta_local.dtype)
    if theta_local.ndim not in (1, 2):
        raise ValueError(f"theta_local must have shape [n] or [K, n], got {tuple(theta_local.shape)}")
    if theta_global.shape[-1] != theta_local.shape[-1] or theta_global.ndim > theta_local.ndim or (
            theta_global.ndim == 2 and theta_global.shape[0] != theta_local.shape[0]):
        raise ValueError(f"theta_global shape {tuple(theta_global.shape)} does not match theta_local "
                         f"shape {tuple(theta_local.shape)}")
    single = theta_local.ndim == 1
    tl = theta_local.reshape(-1, theta_local.shape[-1])
    n = tl.shape[-1]
    delta = tl - theta_global
    norm = torch.linalg.vector_norm(delta.double(), dim=-1)
    eps = torch.where(norm > 0, n / (nu * norm), torch.full_like(norm, math.inf))
    rho = sample_euclidean_laplace(n, eps.numpy(), size=tl.shape[0], rng=rng, dtype=tl.dtype)
    leakage = torch.full_like(norm, n / nu)
    out = SanitizedUpdate(tl + rho, eps, leakage, rho)
    if single:
        out = SanitizedUpdate(out.theta[0], eps[0], leakage[0], rho[0])
    return out


@dataclass
class PrivacyAccountant:
    """Per-client d-privacy ledger (Galli et al., Theorem 3.1 and Sec. 4.1).

    Independent releases compose by summation: after participations with leakages ``l_1, l_2, ...``
    a client is ``sum_i l_i``-d-private with respect to its neighbourhood. With a ``budget``, a client
    refuses (``refuse_past_budget=True``) any participation that would push its total above it; the
    decision is made before the client releases anything.

    Attributes: ``spent`` float64 array ``[num_clients]``; ``participations`` int array; ``log`` a list
    of ``(round, client, leakage)``.
    """

    num_clients: int
    budget: float | None = None
    refuse_past_budget: bool = True
    spent: np.ndarray = field(init=False)
    participations: np.ndarray = field(init=False)
    log: list = field(init=False, default_factory=list)

    def __post_init__(self):
        if int(self.num_clients) != self.num_clients or self.num_clients < 1:
            raise ValueError(f"num_clients must be a positive integer, got {self.num_clients}")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"budget must be > 0 or None, got {self.budget}")
        self.spent = np.zeros(int(self.num_clients))
        self.participations = np.zeros(int(self.num_clients), dtype=np.int64)

    def _clients(self, clients) -> np.ndarray:
        c = np.atleast_1d(np.asarray(clients, dtype=np.int64))
        if c.size and (c.min() < 0 or c.max() >= self.num_clients):
            raise ValueError(f"client ids must lie in [0, {self.num_clients}), got {c.tolist()}")
        return c

    def allowed(self, clients, leakage) -> np.ndarray:
        """Boolean mask: which ``clients`` may release a contribution of ``leakage`` (scalar or one
        per client) without exceeding the budget. All ``True`` without a budget or refusal."""
        c = self._clients(clients)
        lk = np.broadcast_to(np.asarray(leakage, dtype=np.float64), c.shape)
        if self.budget is None or not self.refuse_past_budget:
            return np.ones(c.shape, dtype=bool)
        return self.spent[c] + lk <= self.budget * (1 + 1e-12)

    def spend(self, clients, leakage, round: int | None = None) -> None:
        """Record that ``clients`` released updates with the given ``leakage`` (scalar or ``[m]``).

        Raises ``ValueError`` on a negative leakage, unknown client ids, or (with refusal on) a
        release that would exceed the budget.
        """
        c = self._clients(clients)
        lk = np.broadcast_to(np.asarray(leakage, dtype=np.float64), c.shape)
        if np.any(lk < 0):
            raise ValueError("leakage must be >= 0")
        if not np.all(self.allowed(c, lk)):
            raise ValueError("a release would exceed the privacy budget; call allowed() first")
        np.add.at(self.spent, c, lk)
        np.add.at(self.participations, c, 1)
        self.log.extend((round, int(ci), float(li)) for ci, li in zip(c, lk))

    def total(self, client: int) -> float:
        """Composed leakage of one client (Theorem 3.1: the sum of its leakages)."""
        return float(self.spent[self._clients(client)][0])

    def summary(self) -> dict:
        """Median and maximum budget over the clients that participated at least once (the two
        statistics of Galli et al., Table 1), and how many participated."""
        used = self.spent[self.participations > 0]
        if used.size == 0:
            return {"median": 0.0, "max": 0.0, "clients": 0}
        return {"median": float(np.median(used)), "max": float(used.max()), "clients": int(used.size)}


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
