"""The statistics the matrix's page reads off a stored record (one value per seed and cell): the undefended
attack's advantage over its baseline and whether it is significant (:func:`undefended_advantage`, the paired 95 %
Student-t interval), the share of it a defense leaves (:func:`advantage`), a cell's interval cut to its metric's
range (:func:`cell_interval`), the gap between the attacker who knows the defense and the naive one
(:func:`adaptive_gaps`), and whether a live value agrees with the record (:func:`consistent_with_record`)."""
from __future__ import annotations

import math
from typing import Mapping

from ..._stats import bounded_interval
from ...metrics import t_interval
from .layout import NAIVE_SUFFIX, UNIT, value_name
from .rows import _attack

__all__ = ["undefended_advantage", "NOT_SIGNIFICANT", "advantage", "record_table", "metric_range", "cell_interval",
           "bounded_interval", "adaptive_gaps", "consistent_with_record", "optimum_verdict"]


def undefended_advantage(record: Mapping, row: str) -> dict:
    """The paired difference, seed by seed, between the undefended cell and the baseline of ``row`` in a
    stored record, signed so that positive means the attack succeeds: ``{"mean", "ci95": [lo, hi] or
    None, "n", "significant"}``, ``significant`` when the 95 % t interval lies above 0. Raises
    ``ValueError`` when the record lacks the row's undefended cell or baseline."""
    vals = record.get("values", {})
    none, base = vals.get(value_name(row, "none")), vals.get(value_name(row, "baseline"))
    layout = {r["key"]: r for r in (record.get("matrix") or {}).get("rows", [])}
    if not none or not base or row not in layout:
        raise ValueError(f"the record holds no undefended cell and baseline of row {row!r}")
    sign = 1.0 if layout[row]["higher_is_success"] else -1.0
    diff = [sign * (a - b) for a, b in zip(none, base) if a is not None and b is not None]
    mean, _, ci = t_interval(diff)
    return {"mean": float(mean), "ci95": None if ci is None else [float(ci[0]), float(ci[1])], "n": len(diff),
            "significant": ci is not None and ci[0] > 0}


#: the note of a row whose undefended advantage is not significant (rendered neutral)
NOT_SIGNIFICANT = "no significant undefended advantage at this scale (the paired 95 % interval of undefended minus baseline includes 0)"


def advantage(value: float, baseline: float, undefended: float) -> float:
    """The share of the undefended attack's advantage over its baseline that survives a defense:
    ``(value - baseline) / (undefended - baseline)``, clipped to ``[0, 1]`` (the direction cancels, so it
    serves "higher is success" and "lower is success" alike; 0 when the undefended attack has no
    advantage). Raises ``ValueError`` for a non-finite argument."""
    if not all(math.isfinite(x) for x in (value, baseline, undefended)):
        raise ValueError(f"advantage needs finite numbers, got {value}, {baseline}, {undefended}")
    gap = undefended - baseline
    if gap == 0:
        return 0.0
    return float(min(1.0, max(0.0, (value - baseline) / gap)))


def record_table(record: Mapping) -> list[dict]:
    """One dict per row of a stored matrix record: ``{"row": layout dict, "baseline": summary,
    "cells": {column key: summary dict ({"mean", "ci95", "n"}) or {"na": reason} or None (missing)}}``.
    Raises ``ValueError`` when ``record`` lacks the matrix layout."""
    layout = record.get("matrix") if isinstance(record, Mapping) else None
    if not layout:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    summ = record.get("summary", {})
    out = []
    for row in layout["rows"]:
        cells = {}
        for col in layout["columns"]:
            k = col["key"]
            if k in row["not_applicable"]:
                cells[k] = {"na": row["not_applicable"][k]}
            else:
                cells[k] = summ.get(value_name(row["key"], k))
        out.append({"row": row, "baseline": summ.get(value_name(row["key"], "baseline")), "cells": cells})
    return out


def metric_range(record: Mapping, row: str) -> tuple[float, float]:
    """The range ``(low, high)`` of row ``row``'s metric (``-inf``/``inf`` for an open end), from the record's
    layout (``value_range``, ``None`` for an infinite bound) or, for a record written before it was stored,
    from :data:`ATTACKS`. Raises ``ValueError`` for a row neither knows."""
    layout = {r["key"]: r for r in (record.get("matrix") or {}).get("rows", [])} if isinstance(record, Mapping) else {}
    if row in layout and "value_range" in layout[row]:
        lo, hi = layout[row]["value_range"]
        return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
    return _attack(row).value_range


def cell_interval(record: Mapping, row: str, column: str) -> list[float] | None:
    """The interval the page shows for cell ``(row, column)`` of a record (``column`` may carry
    :data:`NAIVE_SUFFIX` or be ``"acc_<column>"``, an accuracy in [0, 1]): :func:`bounded_interval` of the
    record's t interval and the metric's range. Raises ``ValueError`` when the record lacks the cell."""
    s = (record.get("summary") or {}).get(value_name(row, column))
    if s is None:
        raise ValueError(f"the record holds no summary of cell ({row}, {column})")
    rng = UNIT if column.startswith("acc_") else metric_range(record, row)
    return bounded_interval(s.get("ci95"), rng)


def adaptive_gaps(record: Mapping) -> list[dict]:
    """Every cell of a matrix record that keeps a naive twin (``"<row>|<column>@naive"``, :data:`NAIVE_SUFFIX`:
    the attacker who ignores the defense, beside the cell's attacker who knows it), in the record's row and
    column order: ``{"row", "column", "adaptive", "naive"`` (summaries: ``mean``, ``ci95``, ``n``),
    ``"interval"`` (:func:`cell_interval` of the adaptive cell), ``"difference"`` (mean over the seeds of
    adaptive minus naive, the same seed's pair; only the clean seeds, those the summaries count: a seed in the
    record's ``failures`` is left out), ``"difference_ci95"`` (its t interval, ``None`` for one seed)
    and ``"beyond"`` (whether the naive mean lies outside the adaptive cell's interval: the naive evaluation
    misstates the defense by more than the cell's own uncertainty)}``. Raises ``ValueError`` for a record
    without the matrix layout."""
    from ..._stats import t_interval

    summ, vals = record.get("summary") or {}, record.get("values") or {}
    failed = {f.get("seed") for f in record.get("failures") or [] if isinstance(f, Mapping)}
    clean = [s not in failed for s in record.get("seeds") or []]   # the seeds the summaries count
    out = []
    for r in record_table(record):
        key = r["row"]["key"]
        for col, s in r["cells"].items():
            naive = summ.get(value_name(key, col + NAIVE_SUFFIX))
            if not s or "na" in s or not naive:
                continue
            a, b = vals.get(value_name(key, col), []), vals.get(value_name(key, col + NAIVE_SUFFIX), [])
            ok = clean if len(clean) == len(a) else [True] * len(a)
            diffs = [x - y for x, y, keep in zip(a, b, ok) if keep and _number(x) and _number(y)]
            mean, _, ci = t_interval(diffs) if diffs else (float("nan"), None, None)
            lo, hi = cell_interval(record, key, col) or (s["mean"], s["mean"])
            out.append({"row": key, "column": col, "adaptive": s, "naive": naive, "interval": [lo, hi],
                        "difference": mean, "difference_ci95": None if ci is None else list(ci),
                        "beyond": not lo <= naive["mean"] <= hi})
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def consistent_with_record(record: Mapping, row: str, column: str, value: float, *, slack: float = 0.0) -> bool:
    """Whether ``value`` (this build's cell) lies within the range of the record's per-seed values of
    ``(row, column)`` widened by its 95 % interval and ``slack``. Raises ``ValueError`` when the record
    lacks the cell."""
    name = value_name(row, column)
    vals = [v for v in record.get("values", {}).get(name, []) if v is not None]
    s = record.get("summary", {}).get(name)
    if not vals or s is None:
        raise ValueError(f"the record holds no values of cell ({row}, {column})")
    half = 0.0 if not s.get("ci95") else (s["ci95"][1] - s["ci95"][0]) / 2
    return min(vals) - half - slack <= value <= max(vals) + half + slack


def optimum_verdict(reached: float, truth: float) -> str:
    """What a mask-aware cell's optimum check says (``"<column>@loss"`` beside ``"<column>@loss_truth"``: the attack's
    matching loss where it ended and at the true answer), as a phrase the page quotes, by
    :func:`fedlab.metrics.optimum_status`: ``"stalled above the truth's loss ... a lower bound on what leaks"``,
    ``"ended below the truth's loss ... does not determine the answer"`` or ``"reached the truth's loss"``, with
    both losses printed. Raises ``ValueError`` for a loss that is negative or not finite."""
    from ...metrics import optimum_status

    status = optimum_status(reached, truth)
    both = f"(loss {reached:.1e} where it ended, {truth:.1e} at the truth)"
    if status == "stalled":
        return f"stalled above the truth's loss {both}: the cell is a lower bound on what leaks"
    if status == "below":
        return f"ended below the truth's loss {both}: what was sent does not determine the answer"
    return f"reached the truth's loss {both}"
