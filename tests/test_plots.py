"""fedlab.plots: what a reader sees on a figure's axes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedlab import plots  # noqa: E402


def _labels(ax, minor=False):
    ax.figure.canvas.draw()
    return [t.get_text() for t in (ax.get_xticklabels(minor=minor))]


def test_a_short_log_axis_has_plain_labels_at_the_data():
    """Chapter 4's 'rounds observed' axis (20 to 300) printed '3×10¹4×10¹' on top of each other."""
    plots.use_style()
    n = [20, 30, 40, 60, 100, 200, 300]
    ax = plots.line_plot(n, {"a": np.linspace(1, 2, 7), "b": np.linspace(2, 3, 7)}, logx=True)
    assert _labels(ax) == ["20", "30", "40", "60", "100", "200", "300"]
    assert not any(_labels(ax, minor=True))
    plt.close("all")


def test_a_wide_log_axis_keeps_powers_of_ten():
    plots.use_style()
    n = np.logspace(0, 4, 9)
    ax = plots.line_plot(n, {"a": n}, logx=True)
    labels = [s for s in _labels(ax) if s]
    assert labels and all("10^" in s or "10" in s for s in labels) and "20" not in labels
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    plots.tidy_log_ticks(ax, [0.0, -1.0, np.nan])        # nothing positive: left alone, no error
    plt.close("all")


def test_tile_titles_are_wrapped_to_their_tile():
    """Chapter 5's 'ν=0.001: 29 dB' and 1a's '35.0 dB (mean colour 18.3)' ran into their neighbours."""
    import torch

    assert plots.wrap_title("35.0 dB (mean colour 18.3)", 19) == "35.0 dB\n(mean colour 18.3)"
    assert plots.wrap_title("ν=0.001: 29 dB", 10) == "ν=0.001:\n29 dB"
    assert plots.wrap_title("private", 10) == "private"
    assert plots.wrap_title("a b c d e f g h", 5) == "a b c\nd e f\ng h"
    fig = plots.image_grid(torch.rand(4, 8, 8), ncols=4, size=1.0, titles=["ν=0.001: 29 dB"] * 4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    width = plots._title_chars(1.0)
    assert texts and all(len(line) <= width for t in texts for line in t.split("\n")), texts
    plt.close("all")


def test_the_record_figure_legend_sits_above_the_rows():
    """On 1a's summary the legend ("best") covered the dots of two rows."""
    rec = {"scale": "paper", "summary": {f"v{i}": {"mean": 0.5, "std": 0.1, "ci95": [0.4, 0.6], "n": 5}
                                         for i in range(9)}}
    ax = plots.record_errorbars(rec, {f"v{i}": f"value {i}" for i in range(9)}, current={"v0": 0.5})
    ax.figure.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.y0 >= ax.get_window_extent().y1 - 1, (legend, ax.get_window_extent())
    plt.close("all")
