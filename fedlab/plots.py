"""Plotting helpers with one consistent style for every chapter (readable when projected)."""
from __future__ import annotations

import math
import numbers

from typing import Mapping, Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

__all__ = ["use_style", "PALETTE", "line_plot", "tidy_log_ticks", "wrap_title", "bar_plot", "image_grid", "partition_heatmap", "md_table", "MarkdownText"]

#: colour-blind-safe palette (Okabe & Ito) used in that order by every figure
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def use_style() -> None:
    """Set the course's matplotlib style: large fonts, light grid, the :data:`PALETTE`, PNG output
    (nbval skips PNG comparisons; SVG would be compared byte for byte)."""
    mpl.rcParams.update({
        "figure.figsize": (7.0, 4.2),
        "figure.dpi": 100,
        "savefig.dpi": 120,
        "font.size": 12,
        "axes.titlesize": 13,
        "axes.labelsize": 12,
        "legend.fontsize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": mpl.cycler(color=PALETTE),
        "lines.linewidth": 2.0,
        "figure.constrained_layout.use": True,
    })
    try:  # inline backend: PNG only
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except Exception:  # pragma: no cover - outside IPython
        pass


def line_plot(x: Sequence | Mapping, ys: Mapping[str, Sequence], *, xlabel: str = "",
              ylabel: str = "", title: str = "", ax=None, logx: bool = False, logy: bool = False,
              styles: Mapping[str, dict] | None = None, legend_loc: str = "best"):
    """Plot several named curves. ``x`` is shared, or a mapping name -> x values.

    ``styles`` maps a curve name to extra ``plot`` keyword arguments (e.g. ``{"bound": {"ls": "--"}}``).
    Returns the axes.
    """
    if ax is None:
        _, ax = plt.subplots()
    for name, y in ys.items():
        xv = x[name] if isinstance(x, Mapping) else x
        ax.plot(np.asarray(xv), np.asarray(y), label=name, **(styles or {}).get(name, {}))
    if logx:
        ax.set_xscale("log")
        xs = [np.asarray(v, dtype=float) for v in (x.values() if isinstance(x, Mapping) else [x])]
        tidy_log_ticks(ax, np.concatenate([v.ravel() for v in xs]) if xs else np.array([]))
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if len(ys) > 1:
        ax.legend(loc=legend_loc)
    return ax


def tidy_log_ticks(ax, values, *, axis: str = "x", max_ticks: int = 8) -> None:
    """On a log axis spanning less than two decades matplotlib labels its minor ticks in scientific
    notation, and the labels run into each other ("3×10¹4×10¹"). There, put the ticks at the data's own
    values (when there are at most ``max_ticks`` of them) with plain labels ("20", "30", "300") and no minor
    labels. Wider axes keep matplotlib's powers of ten. ``values``: the positive coordinates plotted."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    v = np.asarray(values, dtype=float).ravel()
    v = np.unique(v[np.isfinite(v) & (v > 0)])
    if v.size == 0 or v.max() / v.min() >= 100:
        return
    target = ax.xaxis if axis == "x" else ax.yaxis
    if v.size <= max_ticks:
        target.set_ticks(v)
    target.set_major_formatter(FuncFormatter(lambda t, _: f"{t:g}"))
    target.set_minor_formatter(NullFormatter())


def bar_plot(values: Mapping[str, float], *, ylabel: str = "", title: str = "", ax=None,
             fmt: str = "{:.2f}", ylim=None, hline: tuple[float, str] | None = None):
    """Bar chart of named values with the value printed on each bar, and, when ``hline = (y, label)`` is
    given, a dashed reference line at ``y`` (e.g. an attack's chance floor) in the legend. Returns the axes."""
    if ax is None:
        _, ax = plt.subplots()
    names = list(values)
    bars = ax.bar(names, [values[n] for n in names], color=PALETTE[: len(names)])
    for b, n in zip(bars, names):
        ax.annotate(fmt.format(values[n]), (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=10)
    ax.set(ylabel=ylabel, title=title)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if hline is not None:
        ax.axhline(float(hline[0]), color="gray", ls="--", lw=1, label=hline[1])
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # beside the bars, never on them
    ax.tick_params(axis="x", rotation=15)
    return ax


def _title_chars(size: float, fontsize: float = 9.0) -> int:
    """How many characters of a ``fontsize``-point title fit over a tile ``size`` inches wide (the tile and
    its gap; measured: DejaVu Sans takes about 0.7 em a character in these titles)."""
    return max(4, int(size * 0.95 / (0.7 * fontsize / 72)))


def wrap_title(title: str, width: int) -> str:
    """``title`` broken into lines of at most ``width`` characters where it can be: first at ``": "`` or before
    ``" ("`` ("35.0 dB (mean colour 18.3)" becomes "35.0 dB" over "(mean colour 18.3)"), else at spaces. A title
    that fits, or a word longer than ``width``, is left as it is."""
    import textwrap

    if len(title) <= width or "\n" in title:
        return title
    for sep, keep in ((": ", ":"), (" (", "(")):
        k = title.find(sep)
        if 0 < k and max(k + len(keep.rstrip("(")), len(title) - k - 1) <= width:
            head, tail = title[:k] + (":" if keep == ":" else ""), ("(" if keep == "(" else "") + title[k + len(sep):]
            return head + "\n" + tail
    return "\n".join(textwrap.wrap(title, width, break_long_words=False)) or title


def image_grid(images, *, titles: Sequence[str] | None = None, ncols: int = 8, cmap: str = "gray",
               size: float = 1.4, suptitle: str = ""):
    """Show a batch of images ``[n, H, W]``, ``[n, 1, H, W]`` or ``[n, 3, H, W]`` (values in [0, 1]) in
    rows of ``ncols`` tiles of about ``size`` inches, each under its title of ``titles``. The tiles are
    laid out in one RGBA array and drawn by one ``imshow`` on one axes (a 44-tile grid as 44 axes cost
    about 2 s of matplotlib time; this costs a tenth). Returns the figure."""
    imgs = np.asarray(images.detach().cpu() if hasattr(images, "detach") else images)
    if imgs.ndim == 4 and imgs.shape[1] in (1, 3):
        imgs = imgs.transpose(0, 2, 3, 1)
    if imgs.ndim == 4 and imgs.shape[-1] == 1:
        imgs = imgs[..., 0]
    n = len(imgs)
    ncols = min(ncols, n)
    nrows = int(np.ceil(n / ncols))
    if titles is not None:       # a title wider than its tile runs into its neighbours': break it into lines
        titles = [wrap_title(str(t), _title_chars(size)) for t in titles]
    lines = max((t.count("\n") + 1 for t in titles), default=1) if titles is not None else 0
    fig = plt.figure(figsize=(size * ncols, size * nrows + (0.4 if suptitle else 0)), layout="none")
    clipped = np.clip(imgs.astype(np.float64), 0, 1)
    if clipped.ndim == 3:                        # grey values through the colormap, as imshow(vmin=0, vmax=1)
        rgba = mpl.colormaps[cmap](clipped)
    else:
        rgba = np.concatenate([clipped, np.ones(clipped.shape[:-1] + (1,))], axis=-1)
    f = max(1, math.ceil(32 / max(rgba.shape[1:3])))   # each pixel drawn as f x f, so the gaps can be finer
    rgba = rgba.repeat(f, axis=1).repeat(f, axis=2)
    H, W = rgba.shape[1:3]
    gap_x = max(1, round(0.15 * W))                     # the blank between tiles (transparent)
    gap_top = max(1, round(0.06 * H)) + round(0.22 * lines / size * H)   # the titles' room, line by line
    cell_w, cell_h = W + gap_x, H + gap_top
    canvas = np.zeros((nrows * cell_h + gap_x // 2, ncols * cell_w, 4))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0 - (0.4 / (size * nrows + 0.4) if suptitle else 0.0)))
    ax.axis("off")
    for i in range(n):
        r, c = divmod(i, ncols)
        y0, x0 = r * cell_h + gap_top, c * cell_w + gap_x // 2
        canvas[y0:y0 + H, x0:x0 + W] = rgba[i]
        if titles is not None:
            ax.text(x0 + (W - 1) / 2, y0 - 0.5 - 0.03 * H, titles[i], ha="center", va="bottom", fontsize=9)
    ax.imshow(canvas, interpolation="nearest")
    ax.set(xlim=(-0.5, canvas.shape[1] - 0.5), ylim=(canvas.shape[0] - 0.5, -0.5))
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def partition_heatmap(y, parts, *, num_classes: int | None = None, ax=None, title: str = ""):
    """Class counts per client (rows: clients, columns: labels) for a partition ``parts``."""
    y = np.asarray(y)
    C = int(num_classes if num_classes is not None else y.max() + 1)
    counts = np.stack([np.bincount(y[p], minlength=C) for p in parts])
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    im = ax.imshow(counts, cmap="Blues", aspect="auto")
    ax.set(xlabel="label", ylabel="client", title=title, xticks=range(C), yticks=range(len(parts)))
    ax.grid(False)
    plt.colorbar(im, ax=ax, label="examples")
    return ax


class MarkdownText(str):
    """A string that Jupyter, and the book's notebooks, render as Markdown (``_repr_markdown_``), without
    importing IPython: the package works where the notebook stack is not installed."""

    def _repr_markdown_(self) -> str:
        return str(self)

    @property
    def data(self) -> str:
        """The Markdown source (the attribute IPython's ``Markdown`` objects have)."""
        return str(self)


def _table_cell(value, floatfmt: str) -> str:
    """One Markdown table cell: a string with ``|`` escaped and newlines joined, an integer as is, a
    real number with ``floatfmt`` (``–`` when not finite). Raises ``ValueError`` for anything else."""
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    if isinstance(value, bool) or value is None or not isinstance(value, numbers.Real):
        raise ValueError(f"a table cell must be a number or a string, got {value!r}")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    x = float(value)
    return floatfmt.format(x) if math.isfinite(x) else "–"


def md_table(headers: Sequence[str], rows: Sequence[Sequence], *, floatfmt: str = "{:.3f}",
             align: str | None = None) -> MarkdownText:
    """A Markdown (GitHub pipe) table, rendered by Jupyter and by the book, from a header and rows of
    values: the one table writer of the package (:func:`fedlab.experiments.tables.markdown_table` is it
    with ``digits``). Use it for every "paper vs ours" table so that the numbers shown are the numbers
    computed.

    A cell is a string (``|`` escaped), an integer, or a real number written with ``floatfmt`` (``–``
    when not finite). ``align``: one letter per column, ``l`` (the default for every column), ``r`` or ``c``
    (``---``, ``---:``, ``:---:`` in the separator row). Returns a :class:`MarkdownText` (a ``str``). Raises
    ``ValueError`` for an empty ``headers``, a row of the wrong length, a cell that is neither a number nor a
    string, or an ``align`` that is not one of ``l``, ``r``, ``c`` per header."""
    if len(headers) == 0:
        raise ValueError("headers must name at least one column")
    if align is None:
        align = "l" * len(headers)
    if not isinstance(align, str) or len(align) != len(headers) or set(align) - set("lrc"):
        raise ValueError(f"align must hold one of 'l', 'r', 'c' per header ({len(headers)}), got {align!r}")
    sep = {"l": "---|", "r": "---:|", "c": ":---:|"}
    lines = ["| " + " | ".join(_table_cell(str(h), floatfmt) for h in headers) + " |",
             "|" + "".join(sep[a] for a in align)]
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"rows[{i}] has {len(row)} cells, headers has {len(headers)}: "
                             "every row must have one value per header")
        lines.append("| " + " | ".join(_table_cell(v, floatfmt) for v in row) + " |")
    return MarkdownText("\n".join(lines))


def record_errorbars(record: Mapping | None, names: Mapping[str, str], *, current: Mapping | None = None,
                     xlabel: str = "", title: str = "", ax=None):
    """Dot-and-whisker plot of a stored multi-seed record (see :mod:`fedlab.reproduce`): for every
    ``name -> label`` of ``names`` the mean over seeds with its 95 % t interval as an error bar, and,
    if ``current`` (``name -> value``) is given, this build's value as an open marker beside it.
    Names missing from the record are drawn from ``current`` only. With no record, the axes say so in
    words (the page must never show an empty figure). Returns the axes.

    Raises ``ValueError`` if ``names`` is empty."""
    if not names:
        raise ValueError("names must hold at least one name -> label")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 0.45 * len(names) + 1.2))
    summary = (record or {}).get("summary", {})
    ys = np.arange(len(names))[::-1]
    labelled = {"record": False, "current": False}
    for y, (name, label) in zip(ys, names.items()):
        s = summary.get(name)
        if s is not None:
            lo, hi = s["ci95"] if s["ci95"] is not None else (s["mean"], s["mean"])
            ax.errorbar(s["mean"], y, xerr=[[s["mean"] - lo], [hi - s["mean"]]], fmt="o", color="C0", capsize=3,
                        label=None if labelled["record"] else "stored record: mean ± 95 % CI")
            labelled["record"] = True
        if current is not None and isinstance(current.get(name), (int, float)):
            ax.plot(current[name], y + 0.18, "o", mfc="none", color="C1",
                    label=None if labelled["current"] else "this build")
            labelled["current"] = True
    ax.set_yticks(ys, list(names.values()))
    ax.set(xlabel=xlabel, title=title)
    if record is None:
        ax.text(0.5, 0.5, "no stored record yet", transform=ax.transAxes, ha="center", va="center", color="gray")
    else:
        ns = sorted({summary[k]["n"] for k in names if k in summary})
        n_txt = "no value" if not ns else (f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}-{ns[-1]}")
        ax.set_title(title or f"stored {record.get('scale', '')}-scale record, {n_txt} seeds")
    handles, _ = ax.get_legend_handles_labels()
    if handles:    # above the rows, under the title: "best" put it on top of the dots of a long figure
        ax.legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
        ax.set_title(ax.get_title(), pad=24)
    return ax
