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

import torch

__all__ = ["MODULUS_BITS", "FRAC_BITS", "encode", "decode", "pairwise_masks", "mask_updates",
           "unmask_sum", "secure_sum"]

MODULUS_BITS = 48      # sums of up to 2^15 clients stay below 2^63: no int64 overflow
FRAC_BITS = 32         # fixed-point resolution 2^-32 ~ 2.3e-10


def _check(modulus_bits, frac_bits):
    if not 8 <= modulus_bits <= 48:
        raise ValueError(f"modulus_bits must be in [8, 48], got {modulus_bits}")
    if not 0 <= frac_bits < modulus_bits - 1:
        raise ValueError(f"frac_bits must be in [0, modulus_bits - 1), got {frac_bits}")


def encode(x: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS) -> torch.Tensor:
    """Fixed-point encoding ``round(x 2^frac_bits) mod 2^modulus_bits`` as int64 (any shape).
    Raises ``ValueError`` if ``|x|`` is too large to decode unambiguously."""
    _check(modulus_bits, frac_bits)
    limit = 2.0 ** (modulus_bits - frac_bits - 1)
    if bool((x.abs() >= limit).any()):
        raise ValueError(f"x: |x| must be < {limit} for frac_bits={frac_bits}, modulus_bits={modulus_bits}")
    q = torch.round(x.double() * 2.0 ** frac_bits).to(torch.int64)
    return torch.remainder(q, 2 ** modulus_bits)


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
    float -> ``[G, P]`` int64 (each row alone is uniform on the ring)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [num_clients, dim], got {tuple(updates.shape)}")
    masks = pairwise_masks(updates.shape[0], updates.shape[1], modulus_bits=modulus_bits, generator=generator)
    return torch.remainder(encode(updates, frac_bits=frac_bits, modulus_bits=modulus_bits) + masks,
                           2 ** modulus_bits)


def unmask_sum(masked: torch.Tensor, *, frac_bits: int = FRAC_BITS, modulus_bits: int = MODULUS_BITS) -> torch.Tensor:
    """The server's view: the sum of the masked updates (masks cancel) decoded to float64 ``[P]``."""
    if masked.dim() != 2:
        raise ValueError(f"masked must be [num_clients, dim], got {tuple(masked.shape)}")
    return decode(masked.sum(0), frac_bits=frac_bits, modulus_bits=modulus_bits)


def secure_sum(updates: torch.Tensor, *, generator: torch.Generator | None = None, **kwargs) -> torch.Tensor:
    """Mask, send, sum, decode: what secure aggregation gives the server for ``updates`` [G, P]."""
    return unmask_sum(mask_updates(updates, generator=generator, **kwargs), **kwargs)
