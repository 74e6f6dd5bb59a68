"""The floating-point attack on a noise-adding mechanism (Mironov, "On significance of the least
significant bits for differential privacy", CCS 2012, Sec. 3-4), against the Euclidean Laplace release
of Galli et al. (Algorithm 2, :func:`fedlab.privacy.dprivacy.sanitize_update`).

Threat model: the server receives one released vector ``y`` and knows the implementation: noise is
drawn in float64, cast to the parameters' dtype (float32) and added in that dtype, so
``y_i = fl(x_i + fl(rho_i))``. It hesitates between two secrets ``x_A`` and ``x_B`` (for instance two
local models of the same update norm, which get the same epsilon).

Attack: not every float is a possible ``y_i`` for a given ``x_i``. With ``x_i = 1`` in float32 the sum
``1 + r`` for ``r`` in ``[-2, -1)`` is exact and a multiple of ``2^-23``, so outputs in ``[-1, -0.5)``
that are odd multiples of ``2^-24`` cannot come from ``x_i = 1``, while ``x_i = 0`` produces them
(``y_i = r``). The event ``E_B = {y : y is unreachable from x_B}`` (:func:`unreachable_from`) has
probability exactly 0 under ``x_B`` and a positive probability under ``x_A``: the privacy loss is
infinite, whatever epsilon says. :func:`distinguishing_event_probabilities` estimates both
probabilities from samples with exact binomial intervals. The snapping release
(:func:`fedlab.privacy.dprivacy.release_euclidean_laplace`, ``safe=True``) puts every output on a
power-of-two grid whose law depends on the secret only through the exact Laplace density, and the
event loses its power: with secrets ``(1, 0)`` and ``(0, 1)`` every grid point is reachable from both
(probability 0 under both); with ``(0.6, 0.8)`` and ``(0.8, 0.6)`` in float32 a few grid points (such
as ``-16``, which ``fl(0.8 + r)`` never equals) are out of the plain release's reach from the second
secret, and the snapping release produces them about equally often from either secret.
"""
from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..config import as_generator
from ..privacy.dprivacy import clopper_pearson

__all__ = ["FloatingPointAttack", "distinguishing_event_probabilities", "reachable", "unreachable_from",
           "off_grid"]

#: how many neighbouring floats on each side of ``fl(y - x)`` are tried as the noise value
_NEIGHBOURS = 3


def _as_float_array(name: str, v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    a = np.asarray(v)
    if a.dtype not in (np.float32, np.float64):
        raise ValueError(f"{name} must be a float32 or float64 array, got dtype {a.dtype}")
    return a


def reachable(y, x) -> np.ndarray:
    """Per coordinate: is there a float ``r`` of ``y``'s dtype with ``fl(x + r) == y`` (addition in that
    dtype, round to nearest even)? That is exactly the set of outputs the plain release
    ``x + fl(rho)`` can produce from the secret ``x`` (the float64 draw, cast, can be any float of the
    dtype in its range).

    The reals ``r`` that round ``x + r`` to ``y`` form an interval around ``y - x``; the candidates are
    ``fl(y - x)`` and its ``3`` neighbouring floats on each side, which contain every float of that
    interval closest to ``y - x`` (vectorised, no loop over samples).

    ``y`` ``[..., n]`` and ``x`` broadcastable to it, float32 or float64 (``x`` is cast to ``y``'s
    dtype, which is exact when the secret was stored in that dtype). Returns a bool array of the
    broadcast shape. Raises ``ValueError`` on a non-float dtype or non-finite ``y``.
    """
    y = _as_float_array("y", y)
    x = _as_float_array("x", x).astype(y.dtype)
    if not np.all(np.isfinite(y)):
        raise ValueError("y must be finite")
    with np.errstate(over="ignore", invalid="ignore"):
        r0 = y - x
        up, down = r0.copy(), r0.copy()
        ok = (x + r0) == y
        inf = np.array(np.inf, dtype=y.dtype)
        for _ in range(_NEIGHBOURS):
            up, down = np.nextafter(up, inf), np.nextafter(down, -inf)
            ok |= ((x + up) == y) | ((x + down) == y)
    return ok


def unreachable_from(y, x) -> np.ndarray:
    """The attack's event ``E_x``: ``y`` ``[..., n]`` has at least one coordinate that the plain release
    cannot produce from ``x`` (:func:`reachable`). Returns a bool array ``[...]``; under the secret
    ``x`` itself the event has probability exactly 0."""
    return ~reachable(y, x).all(axis=-1)


def off_grid(step: float):
    """The event "some coordinate is not a multiple of ``step``", as a function ``event(y, x_b)`` for
    :func:`distinguishing_event_probabilities` (``x_b`` unused). Against a snapping release whose
    grid is chosen from a secret-dependent epsilon it tells secrets of different update
    norms apart: with the grid of the safe release it has the same probability (0 or 1) under every
    secret. Raises ``ValueError`` unless ``step`` is finite and ``> 0``."""
    if not (step > 0 and math.isfinite(step)):
        raise ValueError(f"step must be a finite number > 0, got {step!r}")

    def event(y, x_b=None):
        y = np.asarray(torch.as_tensor(y).detach().cpu().double().numpy())
        return (np.remainder(y, step) != 0).any(axis=-1)

    return event


@dataclass
class FloatingPointAttack:
    """Result of :func:`distinguishing_event_probabilities`: the event ``E_B`` (unreachable from
    ``secret_b``) counted on ``num_samples`` releases of each secret. ``p_a``, ``p_b``: estimated
    probabilities; ``interval_a``, ``interval_b``: exact (Clopper-Pearson) intervals at ``level``;
    ``count_a``, ``count_b``: how many releases fell in the event."""

    p_a: float
    p_b: float
    interval_a: tuple
    interval_b: tuple
    count_a: int
    count_b: int
    num_samples: int
    level: float

    @property
    def distinguishes(self) -> bool:
        """True when the intervals are disjoint: the event's probability differs under the two secrets
        beyond sampling error (at ``level`` per interval)."""
        return self.interval_a[0] > self.interval_b[1] or self.interval_b[0] > self.interval_a[1]

    def violates(self, eps_d: float, delta: float = 0.0) -> bool:
        """True when the counts establish (at ``level`` per interval) that the event breaks the
        guarantee ``P_A[E] <= exp(eps_d) P_B[E] + delta`` or the same with the secrets swapped, i.e.
        the lower end of one interval exceeds ``exp(eps_d)`` times the upper end of the other plus
        ``delta``. A private mechanism may make ``P_A`` and ``P_B`` differ (by up to that much), so
        this, not :attr:`distinguishes`, is the test of the claim. Raises ``ValueError`` for
        ``eps_d < 0`` or ``delta`` outside ``[0, 1)``."""
        if not eps_d >= 0:
            raise ValueError(f"eps_d must be >= 0, got {eps_d}")
        if not 0 <= delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        f = math.exp(eps_d)
        return (self.interval_a[0] > f * self.interval_b[1] + delta
                or self.interval_b[0] > f * self.interval_a[1] + delta)


def distinguishing_event_probabilities(release: Callable, secret_a, secret_b, *,
                                       num_samples: int = 100_000, level: float = 0.95,
                                       rng=None, event: Callable | None = None) -> FloatingPointAttack:
    """Mironov's distinguishing test (Mironov 2012, Sec. 4) as probabilities with intervals.

    ``release(secret, size, rng)`` must return ``size`` independent releases ``[size, n]`` of the
    mechanism run on ``secret`` ``[n]`` (a tensor of the mechanism's dtype; for example
    ``lambda x, m, g: dp.sanitize_update(x.expand(m, -1), theta_global.expand(m, -1), nu, rng=g,
    safe=False).theta``). Both secrets are released ``num_samples`` times from one generator
    (``rng``: numpy Generator, int seed or ``None`` for :func:`fedlab.config.global_rng`), and
    the event ``E_B = unreachable_from(y, secret_b)`` is counted under each (or ``event(y, secret_b)``,
    a function returning a bool array ``[size]``, for instance :func:`off_grid`).

    For an eps-d-private mechanism ``P_A[E] <= exp(eps d) P_B[E]``; the plain float32 release gives
    ``P_B[E] = 0`` exactly and ``P_A[E] > 0``. Returns a :class:`FloatingPointAttack`.
    Raises ``ValueError`` if the secrets are not vectors of one length, ``num_samples < 1``, ``level``
    outside (0, 1) or ``release`` returns the wrong shape.
    """
    a = torch.as_tensor(secret_a)
    b = torch.as_tensor(secret_b)
    if a.ndim != 1 or b.shape != a.shape:
        raise ValueError(f"secret_a and secret_b must be vectors [n] of one length, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    gen = as_generator(rng)
    m = int(num_samples)
    counts = []
    for secret in (a, b):
        y = release(secret, m, gen)
        y = torch.as_tensor(y)
        if tuple(y.shape) != (m, a.shape[0]):
            raise ValueError(f"release must return shape {(m, a.shape[0])}, got {tuple(y.shape)}")
        hit = unreachable_from(y, b.to(y.dtype)) if event is None else np.asarray(event(y, b.to(y.dtype)))
        if hit.shape != (m,):
            raise ValueError(f"event must return a bool array of shape {(m,)}, got {hit.shape}")
        counts.append(int(hit.sum()))
    lo, hi = clopper_pearson(np.array(counts), m, level)
    return FloatingPointAttack(counts[0] / m, counts[1] / m, (float(lo[0]), float(hi[0])),
                               (float(lo[1]), float(hi[1])), counts[0], counts[1], m, level)
