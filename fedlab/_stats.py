"""Statistics that need no torch: the Student-t interval of a mean (:func:`t_interval`), that interval cut
to a metric's range (:func:`bounded_interval`), and p-values summarised as a median and range
(:func:`pvalue_summary`; a t interval is no summary for p-values).

It is a name of :mod:`fedlab.metrics` (which imports it from here); it lives in this leaf module (no torch,
no numpy; ``scipy.special`` imported when called) so that ``python -m fedlab reproduce`` summarises a record
without importing torch or ``scipy.stats``. Imports nothing from fedlab.
"""
from __future__ import annotations

import math

__all__ = ["t_interval", "bounded_interval", "pvalue_summary", "median_range"]


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


def bounded_interval(ci, value_range) -> list[float] | None:
    """The 95 % Student-t interval ``ci`` ``[low, high]`` of a cell's mean over the seeds, cut to the metric's
    range ``value_range`` ``(low, high)`` (an AUC interval never passes 1, an error's never 0; the matrix's cells
    and the What-reproduced page's claims). The cell's expected value lies in the range, so cutting the interval there keeps its coverage and
    it still holds the mean of the seeds (which lies in the range too); it leaves the Student-t width
    where the range does not bind, the honest width for 3 to 10 seeds. (A bootstrap percentile interval
    over 3 seeds has 10 distinct resampled means and covers far less than 95 %; a logit-scale interval is
    undefined at a rate of exactly 0 or 1, which cells reach, and need not contain the mean shown.) The
    matrix's significance rule keeps the plain paired t interval. ``None`` for
    ``ci`` None (one seed). Raises ``ValueError`` for an interval or range that is not ``low <= high``."""
    if ci is None:
        return None
    lo, hi = (float(ci[0]), float(ci[1]))
    a, b = (float(value_range[0]), float(value_range[1]))
    if not lo <= hi or math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"ci must be [low, high] with low <= high, got {ci}")
    if not a < b:
        raise ValueError(f"value_range must be (low, high) with low < high, got {value_range}")
    return [min(max(lo, a), b), max(min(hi, b), a)]


def pvalue_summary(pvalues, *, brief: bool = False, unit: str | None = None) -> str:
    """Several p-values of one test (over seeds, or over network draws of one seed) as ``'median m
    (range lo-hi, n = k)'``, two significant digits (:func:`format_pvalue`'s words): ``'m (n = 1)'`` for
    one, ``'m (all n = k seeds)'`` when all are equal, the median alone with ``brief``; ``unit`` (e.g.
    ``"networks"``) is written after ``k`` in place of ``seeds``. Raises
    ``ValueError`` naming ``pvalues`` when it is empty or holds a value outside [0, 1] (NaN included)."""
    seen = sorted(float(x) for x in pvalues)
    if not seen:
        raise ValueError("pvalues must not be empty")
    if not all(0.0 <= x <= 1.0 for x in seen):
        raise ValueError(f"pvalues must lie in [0, 1], got {[x for x in seen if not 0.0 <= x <= 1.0][:3]}")

    def p(x):
        return f"{x:.1e}" if x < 0.01 else f"{x:.2f}"
    return median_range(seen, p, brief=brief, unit=unit)


def median_range(values, fmt, *, brief: bool = False, unit: str | None = None) -> str:
    """Numbers over seeds as ``'median m (range lo-hi, n = k)'`` with ``fmt`` writing each number: ``'m (n =
    1)'`` for one, ``'m (all n = k seeds)'`` when all are equal, the median alone with ``brief``; ``unit``
    (e.g. ``"networks"``) is written after ``k`` in place of ``seeds``. The summary of p-values
    (:func:`pvalue_summary`) and of heavy-tailed values (:func:`fedlab.records.format_median_range`), where a
    t interval would mislead. Raises ``ValueError`` naming ``values`` when it is empty."""
    seen = sorted(float(x) for x in values)
    if not seen:
        raise ValueError("values must not be empty")
    k = len(seen)
    median = seen[k // 2] if k % 2 else (seen[k // 2 - 1] + seen[k // 2]) / 2
    if brief:
        return fmt(median)
    if k == 1:
        return f"{fmt(median)} (n = 1)"
    if seen[0] == seen[-1]:
        return f"{fmt(median)} (all n = {k} {unit or 'seeds'})"
    return f"median {fmt(median)} (range {fmt(seen[0])}–{fmt(seen[-1])}, n = {k}{' ' + unit if unit else ''})"
