"""Statistics that need no torch: the Student-t interval of a mean (:func:`t_interval`).

It is a name of :mod:`fedlab.metrics` (which imports it from here); it lives in this leaf module (no torch,
no numpy; ``scipy.special`` imported when called) so that ``python -m fedlab reproduce`` summarises a record
without importing torch or ``scipy.stats``. Imports nothing from fedlab.
"""
from __future__ import annotations

import math

__all__ = ["t_interval"]


def t_interval(xs, confidence: float = 0.95) -> tuple[float, float | None, tuple[float, float] | None]:
    """``(mean, std, (low, high))``: the Student-t interval of the mean of ``xs`` (``std`` with
    ``ddof=1``). With one value ``std`` and the interval are ``None``. Raises ``ValueError`` for an
    empty or non-finite ``xs`` or a ``confidence`` outside (0, 1)."""
    from scipy import special    # stats.t.ppf(q, df) is special.stdtrit(df, q); scipy.stats costs ~1-2 s to import

    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("xs must hold at least one value")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"xs must be finite, got {xs}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return mean, None, None
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(special.stdtrit(n - 1, 0.5 + confidence / 2)) * std / math.sqrt(n)
    return mean, std, (mean - half, mean + half)
