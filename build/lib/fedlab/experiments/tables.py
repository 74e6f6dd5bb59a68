"""Markdown tables for the chapters' "paper vs ours" comparisons, built from rows of values instead of
string concatenation in each chapter module, and the one way a multi-seed number is written in them."""
from __future__ import annotations

import math
from typing import Sequence

from ..metrics import t_interval

__all__ = ["markdown_table", "mean_interval"]


def _cell(value, digits: int) -> str:
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    if isinstance(value, bool) or value is None:
        raise ValueError(f"a table cell must be a number or a string, got {value!r}")
    if isinstance(value, int):
        return str(value)
    x = float(value)
    if not math.isfinite(x):
        return "–"
    return f"{x:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], *, digits: int = 3) -> str:
    """A Markdown (GitHub pipe) table: ``header`` names the columns, each row of ``rows`` gives one
    cell per column (a string, kept with ``|`` escaped; an int; a float, written with ``digits``
    decimals, ``–`` when not finite). Raises ``ValueError`` for an empty ``header``, a row of the
    wrong length or a cell that is neither a number nor a string."""
    if len(header) == 0:
        raise ValueError("header must name at least one column")
    lines = ["| " + " | ".join(_cell(str(h), digits) for h in header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"rows[{i}] has {len(row)} cells, header has {len(header)}")
        lines.append("| " + " | ".join(_cell(v, digits) for v in row) + " |")
    return "\n".join(lines)


def mean_interval(xs, digits: int = 3) -> str:
    """``'mean ± half-width'`` of the 95 % Student-t interval over the values ``xs`` (one per seed,
    :func:`fedlab.metrics.t_interval`), ``'mean'`` alone for one value. Raises ``ValueError`` for an
    empty or non-finite ``xs``."""
    mean, _, ci = t_interval(list(xs))
    if ci is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(ci[1] - ci[0]) / 2:.{digits}f}"
