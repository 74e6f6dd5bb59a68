"""Markdown tables for the chapters' "paper vs ours" comparisons, built from rows of values instead of
string concatenation in each chapter module, and the one way a multi-seed number is written in them."""
from __future__ import annotations

from typing import Sequence

from ..metrics import t_interval
from ..plots import md_table

__all__ = ["markdown_table", "mean_interval", "settings_header", "scale_cells", "scale_pairs"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], *, digits: int = 3) -> str:
    """A Markdown (GitHub pipe) table with floats written with ``digits`` decimals:
    :func:`fedlab.plots.md_table` (strings kept with ``|`` escaped, ints as is, ``–`` for a non-finite
    float). Raises ``ValueError`` for an empty ``header``, a row of the wrong length or a cell that is
    neither a number nor a string."""
    if int(digits) != digits or digits < 0:
        raise ValueError(f"digits must be a non-negative integer, got {digits!r}")
    return md_table(header, rows, floatfmt=f"{{:.{int(digits)}f}}")


def mean_interval(xs, digits: int = 3) -> str:
    """``'mean ± half-width'`` of the 95 % Student-t interval over the values ``xs`` (one per seed,
    :func:`fedlab.metrics.t_interval`), ``'mean'`` alone for one value. Raises ``ValueError`` for an
    empty or non-finite ``xs``."""
    mean, _, ci = t_interval(list(xs))
    if ci is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(ci[1] - ci[0]) / 2:.{digits}f}"


def settings_header(reference: str) -> list[str]:
    """The header of a chapter's settings table (the paper, its reference code, ours at both scales):
    ``["setting", "paper (RAIFLE)", "reference code (<reference>)", "ours, quick scale", "ours, paper scale"]``."""
    return ["setting", "paper (RAIFLE)", f"reference code ({reference})", "ours, quick scale", "ours, paper scale"]


def scale_pairs(settings: dict, names) -> list[tuple[str, object]]:
    """Every ``(name, value)`` of a chapter's ``settings`` (``{name: (quick, paper)}``) for the ``names`` of its
    ``SCALE_SETTINGS``, both values of each pair in turn, for the chapter's own value checks. Raises
    ``ValueError`` naming ``settings`` if it lacks a name or holds something other than a pair."""
    missing = set(names) - set(settings)
    if missing:
        raise ValueError(f"settings lacks {sorted(missing)}")
    out = []
    for name in names:
        pair = settings[name]
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"settings[{name!r}] must be a (quick, paper) pair, got {pair!r}")
        out += [(name, value) for value in pair]
    return out


def scale_cells(quick: dict, paper: dict, name: str, text: str | None = None) -> list[str]:
    """The two "ours" cells of settings row ``name``: ``[text, "same"]`` for a setting both scales share,
    else ``[quick[name], paper[name]]`` with ``"same"`` where the paper scale's text equals the quick one's.
    Raises ``KeyError`` for a ``name`` neither dict holds when ``text`` is not given."""
    if text is not None:
        return [text, "same"]
    return [quick[name], paper[name] if paper[name] != quick[name] else "same"]
