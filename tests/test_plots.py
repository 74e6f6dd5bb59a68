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
