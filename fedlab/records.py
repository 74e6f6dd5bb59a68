"""Stored multi-seed runs, shown beside the numbers of the current build.

A chapter's numbers come from code (myst-nb ``glue``). ``python -m fedlab reproduce`` (see
:mod:`fedlab.reproduce`) runs a chapter at several seeds and one scale and writes every glued value to
``chapters/records/<stem>.<scale>.json``; this module only *reads* those records (nothing here writes
one, and nothing in a record is typed by hand).

In a notebook::

    from fedlab import book, records
    run = records.Run("02_pac_identifiability")      # this build's numbers + the stored paper-scale record
    book.glue_many(ch2_auc=0.731, record=run)         # glue (display=False) and keep in run
    run.stored("ch2_auc")                               # '0.725 ± 0.012 (n = 3)' or 'no record yet'

Every "paper vs ours" table of the book takes its paper-scale column from :meth:`Run.stored` (our own run at paper scale, not the paper's number): the mean
over the record's seeds with the half-width of the 95 % Student-t interval, and the number of seeds.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ._stats import median_range, pvalue_summary

__all__ = ["Run", "records_dir", "load", "load_record", "format_summary", "format_median_range", "compare_rows",
           "describe"]

_REQUIRED = ("chapter", "scale", "seeds", "values", "summary", "seconds")


def records_dir() -> Path:
    """``chapters/records`` of the book (found from the working directory upwards, as a notebook runs
    in ``chapters/``); ``./records`` when no ``_toc.yml`` is found."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder / "chapters" / "records"
    return here / "records"


def load_record(path: str | Path) -> dict | None:
    """The record stored at ``path``, or ``None`` if there is no such file. Raises ``ValueError`` if the
    file exists but is not a record of :mod:`fedlab.reproduce` (missing fields, values not lists of one
    entry per seed)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or any(k not in data for k in _REQUIRED):
        raise ValueError(f"{path} is not a fedlab record (needs the fields {_REQUIRED})")
    n = len(data["seeds"])
    bad = [k for k, v in data["values"].items() if not isinstance(v, list) or len(v) != n]
    if bad or len(data["seconds"]) != n:
        raise ValueError(f"{path}: every value and 'seconds' must hold one entry per seed ({n}); bad: {bad[:5]}")
    return data


def load(stem: str, scale: str = "paper", folder: str | Path | None = None) -> dict | None:
    """The record of chapter ``stem`` at ``scale`` in ``folder`` (default :func:`records_dir`), or
    ``None`` when none is stored."""
    from .config import SCALES

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return load_record(Path(folder or records_dir()) / f"{stem}.{scale}.json")


def _sci(x: float, digits: int) -> bool:
    return x != 0 and (abs(x) < 10 ** -(digits - 1) or abs(x) >= 10 ** 6)


def _fmt(x: float, digits: int, sci: bool | None = None) -> str:
    """``x`` with ``digits`` decimals, or in scientific notation when ``sci`` (default: for tiny or huge x)."""
    return f"{x:.2e}" if (_sci(x, digits) if sci is None else sci) else f"{x:.{digits}f}"


def _clean_values(record: dict, name: str) -> list:
    """The stored values of ``name`` at the seeds that finished cleanly, in seed order (``None`` left out)."""
    failed = {f["seed"] for f in record.get("failures", [])}
    values = record.get("values", {}).get(name, [])
    return [v for s, v in zip(record.get("seeds", []), values) if s not in failed and v is not None]


def paired_values(record: dict | None, a: str, b: str) -> list[tuple]:
    """``(value of a, value of b)`` at each seed of ``record`` that finished cleanly and stores both, in seed
    order (``[]`` without a record). Pairing :func:`_clean_values` lists by position instead would pair
    different seeds as soon as one value is missing (``None``) at a seed where the other is not."""
    if record is None:
        return []
    failed = {f["seed"] for f in record.get("failures", [])}
    values = record.get("values", {})
    va, vb = values.get(a, []), values.get(b, [])
    return [(x, y) for s, x, y in zip(record.get("seeds", []), va, vb)
            if s not in failed and x is not None and y is not None]


def _equal_at_every_seed(record: dict, name: str) -> bool:
    """Whether the stored value ``name`` is the same number at every clean seed (the summary's std can be
    1e-17 rather than 0 for equal values)."""
    try:
        return len({float(v) for v in _clean_values(record, name)}) == 1
    except (TypeError, ValueError):
        return False


def format_summary(record: dict | None, name: str, digits: int = 3, *, scale_factor: float = 1.0,
                   value_range: tuple[float, float] | None = None) -> str:
    """``'mean ± half-width (n = k)'`` for ``name`` in ``record`` (the half-width of the 95 % t interval;
    ``'mean (n = 1)'`` for one seed; ``'value (all n = k seeds)'`` for a value equal at every seed, which has
    no interval), the distinct values for a text value, ``'no record yet'`` when
    there is no record, ``'not in record'`` when the record lacks ``name``. ``scale_factor`` multiplies
    the numbers (e.g. 100 for percent). ``value_range`` ``(low, high)`` (after ``scale_factor``; e.g. ``(0, 1)``
    for a rate): the interval is cut to it and shown as ``'mean [lo, hi] (n = k)'`` in fixed notation (with more
    decimals for a mean below ``10**-digits``: two significant digits), so that
    a rate's interval never leaves [0, 1] (the true value lies in the range, so the cut keeps the coverage).
    Raises ``ValueError`` for a ``value_range`` that is not ``(low, high)`` with ``low < high``, or that does not
    hold the (scaled) mean."""
    if value_range is not None:
        try:
            low, high = (float(v) for v in value_range)
        except (TypeError, ValueError):
            low = high = math.nan
        if not low < high:
            raise ValueError(f"value_range must be (low, high) with low < high, got {value_range!r}")
    if record is None:
        return "no record yet"
    if name in record.get("summary", {}):
        s = record["summary"][name]
        mean = s["mean"] * scale_factor
        if s["ci95"] is None:
            return f"{_fmt(mean, digits)} (n = {s['n']})"
        if s.get("std") == 0 or _equal_at_every_seed(record, name):   # a constant has no interval
            return f"{_fmt(mean, digits)} (all n = {s['n']} seeds)"
        half = (s["ci95"][1] - s["ci95"][0]) / 2 * abs(scale_factor)
        if value_range is not None:
            if not low <= mean <= high:     # a range in the unscaled unit, or the wrong metric: no interval to cut
                raise ValueError(f"value_range {value_range!r} does not hold the mean {mean!r} of {name!r} (after "
                                 f"scale_factor={scale_factor!r}; the range is in the scaled unit)")
            lo, hi = max(mean - half, low), min(mean + half, high)
            if 0 < abs(mean) < 10 ** -digits:     # a small rate keeps two significant digits, never reads "0.000"
                digits = 1 - math.floor(math.log10(abs(mean)))
            return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] (n = {s['n']})"
        sci = _sci(max(abs(mean), half), digits)   # one notation for both, set by the larger
        return f"{_fmt(mean, digits, sci)} ± {_fmt(half, digits, sci)} (n = {s['n']})"
    if name in record.get("values", {}):
        seen = [v for v in record["values"][name] if v is not None]
        distinct = list(dict.fromkeys(str(v) for v in seen))
        return ", ".join(distinct) if distinct else "failed at every seed"
    return "not in record"


def format_pvalue(record: dict | None, name: str, *, brief: bool = False) -> str:
    """A p-value of ``record`` over its seeds as ``'median m (range lo-hi, n = k)'``, two significant
    digits: a t interval is no summary for p-values (it runs below 0 and averages numbers that live on a log
    scale). ``'m (n = 1)'`` for one seed, ``'m (all n = k seeds)'`` when equal at every seed; the same words
    as :func:`format_summary` without a record or without ``name``; ``brief``: the median alone (for a table
    whose header says "median over seeds"). Raises ``ValueError`` for a stored value outside [0, 1]."""
    if record is None:
        return "no record yet"
    values = record.get("values", {})
    if name not in values:
        return "not in record"
    seen = [float(v) for v in _clean_values(record, name)]
    if not seen:
        return "failed at every seed"
    bad = [x for x in seen if not 0.0 <= x <= 1.0]
    if bad:
        raise ValueError(f"name={name!r} holds {bad[0]!r}, not a p-value in [0, 1]")
    return pvalue_summary(seen, brief=brief)


def format_median_range(record: dict | None, name: str) -> str:
    """A heavy-tailed value of ``record`` over its seeds (e.g. a mean squared error that one seed blows up) as
    ``'median m (range lo-hi, n = k)'``, two significant digits: a t interval there is dominated by the outlier
    and runs below 0. ``'m (n = 1)'`` for one seed, ``'m (all n = k seeds)'`` when equal at every seed; the
    same words as :func:`format_summary` without a record or without ``name``. Raises ``ValueError`` for a
    stored value that is not finite."""
    if record is None:
        return "no record yet"
    if name not in record.get("values", {}):
        return "not in record"
    seen = sorted(float(v) for v in _clean_values(record, name))
    if not seen:
        return "failed at every seed"
    if not all(math.isfinite(x) for x in seen):
        raise ValueError(f"name={name!r} holds a non-finite value: {seen}")
    return median_range(seen, lambda x: f"{x:.2g}")


class Run(dict):
    """The glued numbers of this build (``name -> value``) and the stored paper-scale record of the
    chapter ``stem`` (``self.record``, ``None`` when there is none)."""

    def __init__(self, stem: str, *, scale: str = "paper", folder: str | Path | None = None):
        super().__init__()
        self.stem = stem
        self.record = load(stem, scale, folder)

    def stored(self, name: str, digits: int = 3, *, scale_factor: float = 1.0,
              value_range: tuple[float, float] | None = None) -> str:
        """Our stored paper-scale value of ``name`` (this book's own run at the papers' settings, from the stored
        record; not the paper's number): see :func:`format_summary` (``value_range=(0, 1)`` for a rate)."""
        return format_summary(self.record, name, digits, scale_factor=scale_factor, value_range=value_range)

    def stored_p(self, name: str, *, brief: bool = False) -> str:
        """The stored paper-scale p-value ``name`` as a median and range over seeds: :func:`format_pvalue`."""
        return format_pvalue(self.record, name, brief=brief)

    def stored_median(self, name: str) -> str:
        """The stored paper-scale value ``name`` as a median and range over seeds: :func:`format_median_range`."""
        return format_median_range(self.record, name)

    def per_seed(self, name: str) -> list[float]:
        """The stored value of ``name`` at each seed that finished cleanly (``[]`` without a record)."""
        return [] if self.record is None else _clean_values(self.record, name)

    def per_seed_pairs(self, a: str, b: str) -> list[tuple]:
        """``(a, b)`` stored at the same seed, for each clean seed that stores both (:func:`paired_values`;
        ``[]`` without a record): what a claim comparing two values seed by seed must iterate over."""
        return paired_values(self.record, a, b)

    def count_below(self, name: str, other: float | str = 0.0) -> int:
        """At how many clean seeds of the record the value ``name`` is below ``other`` (a number, or the
        name of another stored value compared seed by seed). ``0`` without a record.

        Raises ``ValueError`` if ``other`` names a value whose seeds do not line up with ``name``'s."""
        values = self.per_seed(name)
        if isinstance(other, str):
            pairs = self.per_seed_pairs(name, other)
            if len(pairs) != len(values) or len(pairs) != len(self.per_seed(other)):
                raise ValueError(f"other={other!r} has {len(self.per_seed(other))} stored seeds, {name!r} has "
                                 f"{len(values)}, {len(pairs)} in common")
            return sum(a < b for a, b in pairs)
        return sum(a < float(other) for a in values)

    def describe(self) -> str:
        """One sentence on the stored record (see :func:`describe`)."""
        return describe(self.record, stem=self.stem)


#: how :func:`compare_rows` writes a stored value of each kind: a rate's interval cut to [0, 1], a p-value or a
#: heavy-tailed value as a median and range over seeds (never a t interval)
ROW_KINDS = ("rate", "p", "median")


def compare_rows(current: dict, recorded: dict | None, labels: dict, digits: int = 3, *,
                 kinds: dict | None = None) -> list[list]:
    """Rows ``[label, this build's value, stored value]`` for every ``name -> label``. The stored value is
    :func:`format_summary`'s mean and 95 % interval over seeds, unless ``kinds`` (``name -> kind``, a kind of
    :data:`ROW_KINDS`) says otherwise: ``"rate"`` cuts the interval to [0, 1] (an AUC, an accuracy, a share),
    ``"p"`` writes a p-value as :func:`format_pvalue`'s median and range, ``"median"`` a heavy-tailed value as
    :func:`format_median_range`'s. Raises ``ValueError`` naming ``kinds`` for an unknown kind or a name that is
    not in ``labels``."""
    kinds = dict(kinds or {})
    bad = {k: v for k, v in kinds.items() if v not in ROW_KINDS or k not in labels}
    if bad:
        raise ValueError(f"kinds must map names of labels to one of {ROW_KINDS}, got {bad}")

    def stored(name):
        kind = kinds.get(name)
        if kind == "p":
            return format_pvalue(recorded, name)
        if kind == "median":
            return format_median_range(recorded, name)
        return format_summary(recorded, name, digits, value_range=(0, 1) if kind == "rate" else None)
    return [[label, current.get(name, "n/a"), stored(name)] for name, label in labels.items()]


def describe(record: dict | None, *, stem: str | None = None) -> str:
    """One sentence on a stored record (seeds, seconds per seed, machine, date, commit, failing seeds, the
    rows of a matrix record run again since, ``reruns``, the chapter a split record came from, ``split_from``, and the page's old name, ``renamed``),
    or how to make one when there is none."""
    if record is None:
        cmd = f"python -m fedlab reproduce {stem or '<chapter>'} --scale paper --seeds 0,1,2"
        return f"No paper-scale record is stored for this chapter yet (make one with `{cmd}`)."
    secs = record["seconds"]
    mean_s = sum(secs) / len(secs)
    seeds = ", ".join(str(s) for s in record["seeds"])
    fails = record.get("failures") or []
    tail = "" if not fails else (" Seeds with a failing assert: "
                                 + "; ".join(f"{f['seed']} ({f['error'][:80]})" for f in fails) + ".")
    return (f"The stored {record['scale']}-scale record ran seeds {seeds} (n = {len(secs)}), "
            f"{mean_s:.0f} s per seed on average on {record.get('machine', '?')} ({record.get('date', '?')}, "
            f"commit {record.get('commit', '?')}, torch {record.get('torch', '?')}); intervals are 95 % t "
            f"intervals over seeds.{tail}"
            + (f" Made by `{record['command']}`." if record.get("command") else "")
            + (f" It is the part of that run's record which this chapter glues: the chapter was split out of "
               f"{split['chapter']} on {split.get('split', '?')}, so the seconds are the whole unsplit chapter's."
               if (split := record.get("split_from")) else "")
            + (f" The record was made when its chapter was named {ren['from']}; renumbered on {ren.get('date', '?')} "
               f"({ren.get('what', '')})."
               if (ren := record.get("renamed")) else "")
            + "".join(f" Rows {', '.join(r.get('rows', []))} were run again at commit {r.get('commit', '?')} "
                      f"({r.get('date', '?')}) at the same seeds." for r in record.get("reruns") or []))
