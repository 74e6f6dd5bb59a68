"""Cheap defenses applied to a model update before it leaves the client.

Reused by several chapters (gradient inversion, RAIFLE, d-privacy); all functions accept a tensor,
or a parameter dict of tensors treated as one concatenated vector, and return the same type. Clipping
(:func:`fedlab.privacy.clipping.clip_rows`, :func:`~fedlab.privacy.clipping.clip_by_norm`) lives in
:mod:`fedlab.privacy.clipping` and is importable from here under its old names.
"""
from __future__ import annotations

import math

import torch

from .clipping import _as_list, _pack, clip_by_norm, clip_rows  # noqa: F401  (their old home: defenses.clip_rows)

__all__ = ["gaussian_noise", "prune_by_magnitude", "prune_rows", "global_norm", "sanitised_gradient"]


def global_norm(update) -> torch.Tensor:
    """L2 norm of a tensor or of all tensors of a dict taken together, computed in at least float32
    (float64 stays float64). ``torch.func.vmap(global_norm)`` gives the norm of every row of a
    batched update."""
    _, ts = _as_list(update)
    return torch.sqrt(sum((t.to(torch.promote_types(t.dtype, torch.float32)) ** 2).sum() for t in ts))


def gaussian_noise(update, sigma, *, generator: torch.Generator | None = None):
    """Add i.i.d. ``N(0, sigma^2)`` noise to every coordinate (Zhu et al. 2019, Sec. 5 defense; the
    noise of every mechanism in :mod:`fedlab.privacy` and of London's Eq. 3 message).

    ``sigma``: a float, or a ``[rows]`` tensor giving each row of a tensor ``update [rows, ...]`` its
    own standard deviation (several noise levels in one batch). Raises ``ValueError`` for a negative
    or non-finite ``sigma``, a ``[rows]`` tensor that does not match the update, an integer update, or
    a ``sigma`` so large that a finite update's noisy copy overflows its dtype. ``sigma = 0`` returns
    an unchanged copy.
    """
    keys, ts = _as_list(update)
    if any(not t.is_floating_point() for t in ts):
        raise ValueError(f"update must be floating point (noise on integers would be rounded), got "
                         f"{[t.dtype for t in ts if not t.is_floating_point()][0]}")
    if isinstance(sigma, torch.Tensor) and sigma.ndim > 0:
        if sigma.ndim != 1 or not isinstance(update, torch.Tensor) or update.shape[0] != sigma.shape[0]:
            raise ValueError(f"sigma as a tensor must be [rows] for a tensor update [rows, ...], got "
                             f"{tuple(sigma.shape)} for {type(update).__name__}")
        if not bool(torch.isfinite(sigma).all()) or not bool((sigma >= 0).all()):
            raise ValueError("sigma must be finite and >= 0")
        scale = sigma.to(update.dtype).reshape(-1, *([1] * (update.dim() - 1)))
        return _finite_noise(update + scale * torch.randn(update.shape, generator=generator, dtype=update.dtype),
                             update, float(sigma.max()))
    if not sigma >= 0 or not math.isfinite(float(sigma)):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    out = [_finite_noise(_add_noise(t, sigma, generator), t, sigma) if sigma > 0 else t.clone() for t in ts]
    return _pack(keys, out)


def _add_noise(t: torch.Tensor, sigma: float, generator) -> torch.Tensor:
    """``t + N(0, sigma^2)``: in ``t``'s dtype for float32 and float64 (bit for bit the old result);
    for float16 and bfloat16 the noise is drawn and added in float32 and the sum rounded once to the
    dtype. Raises ``ValueError`` naming ``sigma`` when the dtype cannot represent the noise: ``sigma``
    below half the spacing of the dtype at the median ``|t|`` (bfloat16 at 1000: spacing 4), where
    most noisy values would round back to the clean ones."""
    if t.numel():
        top = float(t.detach().abs().double().median())
        spacing = float(torch.finfo(t.dtype).eps) * 2.0 ** math.floor(math.log2(top)) if top > 0 else 0.0
        if sigma < spacing / 2:
            raise ValueError(f"sigma={sigma:g} is below the resolution of {t.dtype} at |value|={top:g} (spacing "
                             f"{spacing:g}): the noise would be rounded away; use float32 or float64")
    if t.dtype in (torch.float32, torch.float64):
        return t + sigma * torch.randn(t.shape, generator=generator, dtype=t.dtype)
    return (t.float() + sigma * torch.randn(t.shape, generator=generator, dtype=torch.float32)).to(t.dtype)


def _finite_noise(noisy: torch.Tensor, clean: torch.Tensor, sigma: float) -> torch.Tensor:
    """``noisy``, after checking that the noise did not overflow ``clean``'s dtype (a finite update
    must stay finite): raises ``ValueError`` naming ``sigma`` otherwise."""
    if not bool(torch.isfinite(noisy).all()) and bool(torch.isfinite(clean).all()):
        raise ValueError(f"sigma={sigma:g} is too large for {clean.dtype}: the noisy update overflows to inf "
                         f"(use float64 or a smaller sigma)")
    return noisy


def prune_by_magnitude(update, fraction: float):
    """Gradient pruning (Zhu et al. 2019): set the ``fraction`` of coordinates with the smallest
    absolute value to zero, ranked over the whole update (all tensors of a dict together).

    ``fraction`` in ``[0, 1)``: 0 keeps everything, 0.9 keeps the top 10 % by magnitude. This is
    :func:`prune_rows` on a batch of one update.
    """
    keys, ts = _as_list(update)
    out = prune_rows(_pack(keys, [t[None] for t in ts]), fraction)
    return {k: v[0] for k, v in out.items()} if keys is not None else out[0]


def prune_rows(update, fraction: float, *, mask: torch.Tensor | None = None):
    """Gradient pruning per user (Zhu et al. 2019; RAIFLE App. C.4), vectorised over users.

    ``update``: a tensor [U, ...] or a dict of tensors [U, ...] (each user's tensors ranked
    together; :func:`prune_by_magnitude` is this function on one user). In each
    user's update the ``floor(fraction * n_real)`` entries of smallest magnitude become 0, where
    ``n_real`` counts the real entries (``mask`` [U, m] marks real item rows of ``[U, m, d]``
    tensors; padding is never counted). Raises ``ValueError`` unless ``0 <= fraction < 1``.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    is_dict = isinstance(update, dict)
    tensors = list(update.values()) if is_dict else [update]
    U = tensors[0].shape[0]
    flats, valid = [], []
    for t in tensors:
        flats.append(t.reshape(U, -1))
        if mask is not None and t.dim() >= 2 and t.shape[:2] == mask.shape:
            valid.append(mask.reshape(*mask.shape, *([1] * (t.dim() - 2))).expand_as(t).reshape(U, -1))
        else:
            valid.append(torch.ones(U, flats[-1].shape[1], dtype=torch.bool))
    flat, ok = torch.cat(flats, 1), torch.cat(valid, 1)
    n_real = ok.sum(1)
    k = (n_real.double() * fraction).floor().long() + (~ok).sum(1)      # padding sorts first
    mag = torch.where(ok, flat.abs(), torch.full_like(flat, -1.0))
    order = mag.argsort(dim=1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(flat.shape[1]).expand(U, -1).contiguous())
    keep = ranks >= k[:, None]
    out_flat = torch.where(keep, flat, torch.zeros_like(flat))
    out, i = [], 0
    for t in tensors:
        n = t[0].numel()
        out.append(out_flat[:, i:i + n].reshape(t.shape))
        i += n
    return dict(zip(update.keys(), out)) if is_dict else out[0]


def sanitised_gradient(nu: float, theta0: torch.Tensor, *, lr: float, rng=None, safe: bool = True):
    """The defense of Galli et al. (2022), Sec. 4.3 (Fig. 5) in the form the gradient-inversion
    attacks take (:func:`fedlab.attacks.gradient_inversion.attack_grid`: a map from the gradient dict
    to what the server recovers). The client takes one SGD step of size ``lr`` from the flat
    parameters ``theta0`` ``[n]``, releases SanitizeUpdate's output (Algorithm 2,
    :func:`fedlab.privacy.dprivacy.sanitize_update`, noise multiplier ``nu``, ``safe`` release, noise
    from ``rng``), and the server rescales it back to a gradient, ``(theta0 - released) / lr =
    grad - rho / lr``. With ``nu == 0`` the gradient passes unchanged.

    Returns ``release(g)``: a function of a gradient dict (shaped like the model's parameters, ``n``
    entries in all) returning the recovered gradient dict. One ``rng`` (a NumPy ``Generator``) shared
    by several defenses is drawn in the order they are called. Raises ``ValueError`` for ``nu < 0``,
    ``lr <= 0`` or a ``theta0`` that is not a vector."""
    from ..models import flatten_params, unflatten_params
    from .dprivacy import sanitize_update

    if not nu >= 0:
        raise ValueError(f"nu must be >= 0 (0: no noise), got {nu}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    theta0 = torch.as_tensor(theta0)
    if theta0.ndim != 1:
        raise ValueError(f"theta0 must be a flat parameter vector [n], got shape {tuple(theta0.shape)}")

    def release(g):
        if nu == 0:
            return g
        flat = flatten_params(g)
        out = sanitize_update(theta0 - lr * flat, theta0, nu, rng=rng, safe=safe)
        return unflatten_params((theta0 - out.theta) / lr, g)

    return release
