"""Cheap defenses applied to a model update before it leaves the client.

Reused by several chapters (gradient inversion, RAIFLE, d-privacy); all functions accept a tensor,
or a parameter dict of tensors treated as one concatenated vector, and return the same type.
"""
from __future__ import annotations

import math

import torch

__all__ = ["gaussian_noise", "prune_by_magnitude", "clip_by_norm", "global_norm"]


def _as_list(update):
    if isinstance(update, dict):
        return list(update.keys()), list(update.values())
    if isinstance(update, torch.Tensor):
        return None, [update]
    raise ValueError(f"update must be a tensor or a dict of tensors, got {type(update).__name__}")


def _pack(keys, tensors):
    return tensors[0] if keys is None else dict(zip(keys, tensors))


def global_norm(update) -> torch.Tensor:
    """L2 norm of a tensor or of all tensors of a dict taken together."""
    _, ts = _as_list(update)
    return torch.sqrt(sum((t.float() ** 2).sum() for t in ts))


def gaussian_noise(update, sigma: float, *, generator: torch.Generator | None = None):
    """Add i.i.d. ``N(0, sigma^2)`` noise to every coordinate (Zhu et al. 2019, Sec. 5 defense).

    Raises ``ValueError`` if ``sigma < 0``. ``sigma = 0`` returns an unchanged copy.
    """
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    keys, ts = _as_list(update)
    out = [t + sigma * torch.randn(t.shape, generator=generator, dtype=t.dtype) if sigma > 0 else t.clone()
           for t in ts]
    return _pack(keys, out)


def prune_by_magnitude(update, fraction: float):
    """Gradient pruning (Zhu et al. 2019): set the ``fraction`` of coordinates with the smallest
    absolute value to zero, ranked over the whole update (all tensors of a dict together).

    ``fraction`` in ``[0, 1)``: 0 keeps everything, 0.9 keeps the top 10 % by magnitude.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    keys, ts = _as_list(update)
    flat = torch.cat([t.reshape(-1) for t in ts])
    n_prune = int(math.floor(fraction * flat.numel()))
    if n_prune == 0:
        return _pack(keys, [t.clone() for t in ts])
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[flat.abs().argsort()[:n_prune]] = False
    out, i = [], 0
    for t in ts:
        out.append(torch.where(keep[i:i + t.numel()].reshape(t.shape), t, torch.zeros_like(t)))
        i += t.numel()
    return _pack(keys, out)


def clip_by_norm(update, max_norm: float):
    """Scale the update so its global L2 norm is at most ``max_norm`` (McMahan et al. 2018,
    per-client clipping of DP-FedAvg): ``u * min(1, max_norm / ||u||)``."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    keys, ts = _as_list(update)
    factor = torch.clamp(max_norm / (global_norm(update) + 1e-12), max=1.0)
    return _pack(keys, [t * factor for t in ts])
