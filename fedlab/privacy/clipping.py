"""Clipping an update to an L2 bound, and the one overflow-safe L2 norm every clip here takes.

* :func:`l2_norm`: the L2 norm over the last dimension, without overflow or underflow of the squares;
* :func:`clip_rows` (a batch ``[U, ...]`` of updates, or a dict of such tensors, one row per user) and
  :func:`clip_by_norm` (one update): ``u * min(1, clip_norm / ||u||)``, the per-client clipping of
  DP-FedAvg (McMahan et al. 2018); differentiable;
* :func:`clip_updates`: :func:`clip_rows` on a stacked dict, or nothing for ``clip_norm=None``
  (DP-FedAvg's server, :mod:`fedlab.privacy.dp_fedavg`);
* :func:`clip_update`: the projection of a local model onto the ball of radius ``clip_norm`` around the
  global one, in float64 (d-privacy's clipped SanitizeUpdate, :mod:`fedlab.privacy.dprivacy`).

The old homes keep their names: ``defenses.clip_rows``, ``defenses.clip_by_norm``,
``dprivacy.clip_update`` and ``dp_fedavg.clip_updates`` are these functions.
"""
from __future__ import annotations

import math

import torch

__all__ = ["l2_norm", "clip_by_norm", "clip_rows", "clip_updates", "clip_update"]


def _as_list(update):
    if isinstance(update, dict):
        return list(update.keys()), list(update.values())
    if isinstance(update, torch.Tensor):
        return None, [update]
    raise ValueError(f"update must be a tensor or a dict of tensors, got {type(update).__name__}")


def _pack(keys, tensors):
    return tensors[0] if keys is None else dict(zip(keys, tensors))


def _norm_parts(v: torch.Tensor):
    """The norm of :func:`l2_norm` ``[...]`` and, when some row needed the rescaled form, how it was
    computed: ``(plain, base, m, fix, odd)``, each ``[...]`` (else ``None``).

    ``plain`` is ``torch.linalg.vector_norm(v, dim=-1)``; ``odd`` marks the rows where it is not finite or
    ``0``; ``fix`` the odd rows with finite entries, not all zero (the squares over- or underflowed), for
    which ``m`` is the largest absolute entry (detached; ``1`` elsewhere), ``base = ||v / m||`` and the
    norm ``base * m``."""
    plain = torch.linalg.vector_norm(v, dim=-1)
    odd = ~torch.isfinite(plain) | (plain == 0)
    if v.shape[-1] == 0 or not bool(odd.any()):
        return plain, None
    m = v.detach().abs().amax(-1)
    fix = odd & (m > 0) & torch.isfinite(m)
    m = torch.where(fix, m, torch.ones_like(m))
    base = torch.linalg.vector_norm(v / m[..., None], dim=-1)
    return torch.where(fix, base * m, plain), (plain, base, m, fix, odd)


def l2_norm(v: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
    """The L2 norm of every row of ``v`` ``[..., n]`` (over the last dimension) in ``v``'s precision, returned
    as ``[...]`` (``[..., 1]`` with ``keepdim``), without overflow or underflow of the squares.

    It is ``torch.linalg.vector_norm(v, dim=-1)`` bit for bit (value and gradient) wherever that is right.
    A row whose norm came out ``inf``, or ``0`` while it has non-zero entries, is recomputed as
    ``m * ||v / m||`` with ``m`` its largest absolute entry (``[2e19, 2e19]`` in float32 gets
    ``2.83e19``, not ``inf``). A row with NaN or infinite entries keeps NaN or ``inf``; a row whose
    norm exceeds the dtype's largest number is ``inf``."""
    norm, _ = _norm_parts(v)
    return norm.unsqueeze(-1) if keepdim else norm


def clip_by_norm(update, clip_norm: float):
    """Scale the update so its global L2 norm is at most ``clip_norm`` (McMahan et al. 2018,
    per-client clipping of DP-FedAvg): ``u * min(1, clip_norm / ||u||)``, the norm taken over all
    tensors of a dict together. This is :func:`clip_rows` on a batch of one update."""
    keys, ts = _as_list(update)
    out = clip_rows(_pack(keys, [t[None] for t in ts]), clip_norm)
    return {k: v[0] for k, v in out.items()} if keys is not None else out[0]


def clip_rows(update, clip_norm: float):
    """Per-row L2 clipping of a batched update: ``update`` is a tensor ``[U, ...]`` or a dict of
    tensors ``[U, ...]`` (row ``u`` of every tensor together is user ``u``'s update); each row is scaled
    by ``min(1, clip_norm / ||row||)``. Differentiable, so an attacker can put it inside a simulated
    update (RAIFLE 4.1.1). Returns the same type.

    The norms are taken in the update's precision without overflow or underflow (:func:`l2_norm`:
    a row whose squares overflow, such as ``[2e19, 2e19]`` in float32, is clipped to norm
    ``clip_norm``, not to zero). Raises ``ValueError`` unless ``clip_norm`` is positive and finite, or
    for an update with NaN or infinite entries."""
    if not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be positive and finite, got {clip_norm}")
    keys, ts = _as_list(update)
    flat = torch.cat([t.flatten(1) for t in ts], 1) if keys is not None else ts[0].reshape(ts[0].shape[0], -1)
    if not flat.is_floating_point():
        raise ValueError(f"update must be floating point, got {flat.dtype}")
    norms, parts = _norm_parts(flat)
    over = None
    if parts is not None:
        plain, base, m, fix, odd = parts
        if not bool(torch.isfinite(flat.detach()[odd]).all()):
            raise ValueError("update must be finite (it has NaN or infinite entries)")
        over = fix & torch.isinf(plain)
        over = over if bool(over.any()) else None
    factor = torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
    if over is None:
        factor = factor * _round_down(flat, factor, clip_norm)
        return _pack(keys, [t * factor.reshape(-1, *([1] * (t.dim() - 1))) for t in ts])
    # rows whose squares overflow the dtype: row * C / ||row|| = (row / m) * (C / ||row / m||), with
    # base = ||row / m|| in [1, sqrt(n)]; the other rows get the factor they get in a batch without such a
    # row (each row's clipping is its own: clip_by_norm of one row equals its row of clip_rows whatever the
    # other rows hold)
    shrink = over & (clip_norm < m.double() * base.double())     # False only when C exceeds the norm
    div = torch.where(shrink, m, torch.ones_like(m))
    corr = torch.ones_like(factor)
    if bool((~over).any()):
        corr[~over] = _round_down(flat[~over], factor[~over], clip_norm)
    factor = torch.where(shrink, clip_norm / base, torch.where(over, torch.ones_like(factor), factor * corr))
    shape = lambda t: (-1, *([1] * (t.dim() - 1)))                # noqa: E731
    return _pack(keys, [(t / div.reshape(shape(t))) * factor.reshape(shape(t)) for t in ts])


def _round_down(flat: torch.Tensor, factor: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """A constant (detached) correction ``[U]`` to the clipping factor so that every clipped row's
    norm, computed in float64 on the values as stored in ``flat``'s dtype, is at most ``clip_norm``.

    In low precision the scaled row ``fl(row * factor)`` rounds each entry by up to half a unit in the
    last place, so its norm can exceed ``clip_norm`` (bfloat16: up to about ``C (1 + 2^-8)``). Rows
    that do are scaled down by ``(1 - 2u)^j`` (``u`` the dtype's unit roundoff) until they do not;
    the others keep a factor of exactly 1, so float32 and float64 results are unchanged wherever
    they were already within ``clip_norm``."""
    with torch.no_grad():
        f = factor.detach()
        u = torch.finfo(flat.dtype).eps / 2
        corr = torch.ones_like(f)
        for _ in range(64):
            row_norm = (flat.detach() * (f * corr)[:, None]).double().norm(dim=1)
            bad = row_norm > clip_norm
            if not bool(bad.any()):
                return corr
            corr = torch.where(bad, corr * (1 - 2 * u) * torch.clamp(
                clip_norm / row_norm, max=1.0).to(corr.dtype), corr)
        raise ValueError(f"clip_rows could not bring the rows within clip_norm={clip_norm:g} in {flat.dtype}")


def clip_updates(updates: dict, clip_norm: float | None) -> dict:
    """Clip every client's update of a stacked dict ``{name: [m, ...]}`` to global L2 norm
    ``clip_norm`` (each client's tensors taken together): :func:`clip_rows`.
    ``clip_norm=None`` returns the updates unchanged (no clipping)."""
    if clip_norm is None:
        return updates
    return clip_rows(updates, clip_norm)


def _check_pair(theta_local, theta_global):
    """``(theta_local, theta_global)`` as tensors of one floating dtype (the default dtype for an integer
    ``theta_local``). Raises ``ValueError`` unless ``theta_local`` is ``[n]`` or ``[K, n]``, ``theta_global``
    matches it (``[n]``, or ``[K, n]`` for a ``[K, n]`` ``theta_local``), and both are finite."""
    theta_local = torch.as_tensor(theta_local)
    if not theta_local.is_floating_point():
        theta_local = theta_local.to(torch.get_default_dtype())
    theta_global = torch.as_tensor(theta_global, dtype=theta_local.dtype)
    if theta_local.ndim not in (1, 2):
        raise ValueError(f"theta_local must have shape [n] or [K, n], got {tuple(theta_local.shape)}")
    if theta_global.shape[-1] != theta_local.shape[-1] or theta_global.ndim > theta_local.ndim or (
            theta_global.ndim == 2 and theta_global.shape[0] != theta_local.shape[0]):
        raise ValueError(f"theta_global shape {tuple(theta_global.shape)} does not match theta_local "
                         f"shape {tuple(theta_local.shape)}")
    if not (torch.isfinite(theta_local).all() and torch.isfinite(theta_global).all()):
        raise ValueError("theta_local and theta_global must be finite")
    return theta_local, theta_global


def clip_update(theta_local: torch.Tensor, theta_global: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``theta_global + delta * min(1, clip_norm / ||delta||)``: the Euclidean projection of
    ``theta_local`` ``[n]`` / ``[K, n]`` onto the ball of radius ``clip_norm`` around ``theta_global``.
    A projection onto a convex set never increases distances. Returns the shape and dtype of
    ``theta_local``. Raises ``ValueError`` on ``clip_norm <= 0`` or shape mismatch."""
    if not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    theta_local, theta_global = _check_pair(theta_local, theta_global)
    delta = (theta_local - theta_global).double()
    norm = l2_norm(delta, keepdim=True)
    scale = torch.clamp(clip_norm / torch.where(norm > 0, norm, torch.ones_like(norm)), max=1.0)
    return (theta_global.double() + delta * scale).to(theta_local.dtype)
