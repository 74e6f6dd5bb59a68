"""Secure aggregation with pairwise additive masks (Bonawitz et al. 2017, the masking core).

Every pair of clients ``a < b`` shares a random mask ``m_ab`` (in the real protocol derived from a
Diffie-Hellman shared seed); client ``a`` adds ``+m_ab`` and client ``b`` adds ``-m_ab``, so each
masked update on its own is uniformly random while the masks cancel in the sum. As in the protocol,
arithmetic is modular on fixed-point integers: updates are encoded as ``round(x 2^frac_bits) mod
2^modulus_bits`` in int64, so the cancellation is exact (no floating-point error) and the server
decodes the sum with an error of at most ``num_clients * 2^-(frac_bits+1)`` per coordinate.
Dropouts, key agreement and secret sharing of the seeds are not simulated (RAIFLE Sec. 3.4.2 only
needs the sum to be exact).

Functions: :func:`encode`, :func:`decode`, :func:`pairwise_masks`, :func:`mask_updates`,
:func:`unmask_sum`, :func:`secure_sum`.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["MODULUS_BITS", "FRAC_BITS", "encode", "decode", "pairwise_masks", "mask_updates",
           "unmask_sum", "secure_sum"]

MODULUS_BITS = 48      # sums of up to 2^15 clients stay below 2^63: no int64 overflow
FRAC_BITS = 32         # fixed-point resolution 2^-32 ~ 2.3e-10


def _check(modulus_bits, frac_bits):
    # integers only (3.0 too would make the ring's 2^bits a float): frac_bits=2.5 would scale by 2^2.5
    # and decode 1.0 as 1.06, silently
    for name, v in (("modulus_bits", modulus_bits), ("frac_bits", frac_bits)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if not 8 <= modulus_bits <= 48:
        raise ValueError(f"modulus_bits must be in [8, 48], got {modulus_bits}")
    if not 0 <= frac_bits < modulus_bits - 1:
        raise ValueError(f"frac_bits must be in [0, modulus_bits - 1), got {frac_bits}")


def encode(x: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS) -> torch.Tensor:
    """Fixed-point encoding ``round(x 2^frac_bits) mod 2^modulus_bits`` as int64 (any shape).
    Raises ``ValueError`` if ``x`` has NaN or infinite entries or ``|x|`` is too large to decode
    unambiguously (``>= 2^(modulus_bits - frac_bits - 1)``)."""
    return torch.remainder(_quantize(x, "x", frac_bits, modulus_bits), 2 ** modulus_bits)


def _quantize(x: torch.Tensor, name: str, frac_bits: int, modulus_bits: int) -> torch.Tensor:
    """``round(x 2^frac_bits)`` as signed int64, after the checks of :func:`encode`."""
    _check(modulus_bits, frac_bits)
    x = torch.as_tensor(x)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite (NaN or infinite entries cannot be encoded)")
    limit = 2.0 ** (modulus_bits - frac_bits - 1)
    if bool((x.abs() >= limit).any()):
        raise ValueError(f"{name}: |x| must be < {limit} for frac_bits={frac_bits}, modulus_bits={modulus_bits}")
    return torch.round(x.double() * 2.0 ** frac_bits).to(torch.int64)


def decode(q: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS) -> torch.Tensor:
    """Inverse of :func:`encode` (values in the upper half of the ring are negative); float64."""
    _check(modulus_bits, frac_bits)
    M = 2 ** modulus_bits
    q = torch.remainder(q, M)
    signed = torch.where(q >= M // 2, q - M, q)
    return signed.double() / 2.0 ** frac_bits


def pairwise_masks(num_clients: int, dim: int, *, modulus_bits: int = MODULUS_BITS,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-client total masks ``[num_clients, dim]`` int64: client ``a`` gets ``sum_{b>a} m_ab -
    sum_{b<a} m_ba mod 2^modulus_bits`` with independent uniform ``m_ab``; the rows sum to 0 mod
    ``2^modulus_bits``. Raises ``ValueError`` for ``num_clients < 2`` or ``dim < 1``."""
    if num_clients < 2:
        raise ValueError(f"num_clients must be >= 2, got {num_clients}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    _check(modulus_bits, 0)
    M = 2 ** modulus_bits
    m = torch.randint(0, M, (num_clients, num_clients, dim), generator=generator, dtype=torch.int64)
    upper = torch.triu(torch.ones(num_clients, num_clients, dtype=torch.bool), diagonal=1)
    m = m * upper[..., None]
    return torch.remainder(m.sum(1) - m.sum(0), M)


def mask_updates(updates: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """What each client sends: ``encode(update) + mask mod 2^modulus_bits``. ``updates`` [G, P]
    float -> ``[G, P]`` int64 (each row alone is uniform on the ring).

    The server decodes the sum modulo ``2^modulus_bits``, so a sum outside the ring's signed range
    would come back wrapped around (two updates of 20000 would sum to -25536 with the defaults). The
    simulation sees every update, so it checks the sum of the encoded updates itself, coordinate by
    coordinate, and raises ``ValueError`` naming ``updates`` when it would not decode exactly (as well
    as for NaN or infinite entries, an entry too large for :func:`encode`, or more than
    ``2^(63 - modulus_bits)`` clients, whose masked sum could overflow int64)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [num_clients, dim], got {tuple(updates.shape)}")
    _check_num_clients(updates.shape[0], modulus_bits, "updates")
    q = _quantize(updates, "updates", frac_bits, modulus_bits)
    total = q.sum(0)
    half = 2 ** (modulus_bits - 1)
    if bool(((total < -half) | (total >= half)).any()):
        limit = half / 2.0 ** frac_bits
        raise ValueError(f"updates: the sum over the {updates.shape[0]} clients must lie in [-{limit:g}, {limit:g}) "
                         f"in every coordinate to decode without wrapping around (frac_bits={frac_bits}, "
                         f"modulus_bits={modulus_bits}); got a coordinate summing to "
                         f"{float(updates.double().sum(0).abs().max()):g}")
    masks = pairwise_masks(updates.shape[0], updates.shape[1], modulus_bits=modulus_bits, generator=generator)
    return torch.remainder(torch.remainder(q, 2 ** modulus_bits) + masks, 2 ** modulus_bits)


def _check_num_clients(num_clients: int, modulus_bits: int, name: str) -> None:
    if num_clients > 2 ** (63 - modulus_bits):
        raise ValueError(f"{name}: at most 2^{63 - modulus_bits} clients fit in int64 sums of a "
                         f"2^{modulus_bits} ring, got {num_clients}")


def unmask_sum(masked: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS) -> torch.Tensor:
    """The server's view: the sum of the masked updates (masks cancel) decoded to float64 ``[P]``.
    Raises ``ValueError`` naming ``masked`` unless it is an integer ``[num_clients, dim]`` tensor with
    entries in ``[0, 2^modulus_bits)`` (what :func:`mask_updates` sends). The server cannot tell a
    wrapped-around sum from a true one: :func:`mask_updates` refuses updates whose sum would wrap."""
    _check(modulus_bits, frac_bits)
    if masked.dim() != 2:
        raise ValueError(f"masked must be [num_clients, dim], got {tuple(masked.shape)}")
    if masked.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"masked must be an integer tensor (ring elements), got {masked.dtype}")
    if bool(((masked < 0) | (masked >= 2 ** modulus_bits)).any()):
        raise ValueError(f"masked must hold ring elements in [0, 2^{modulus_bits})")
    _check_num_clients(masked.shape[0], modulus_bits, "masked")
    masked = masked.to(torch.int64)
    return decode(masked.sum(0), frac_bits=frac_bits, modulus_bits=modulus_bits)


def secure_sum(updates: torch.Tensor, *, generator: torch.Generator | None = None, **kwargs) -> torch.Tensor:
    """Mask, send, sum, decode: what secure aggregation gives the server for ``updates`` [G, P]."""
    return unmask_sum(mask_updates(updates, generator=generator, **kwargs), **kwargs)
