"""fedlab.experiments.tables: the Markdown tables of the chapters' "paper vs ours" comparisons."""
import math

import pytest

from fedlab.experiments.tables import markdown_table, mean_interval
from fedlab.metrics import t_interval


def test_markdown_table_formats_cells():
    md = markdown_table(["a", "b|c", "d"], [["x|y", 3, 0.12345], ["z", 10, float("nan")]], digits=2)
    assert md.splitlines() == ["| a | b\\|c | d |", "|---|---|---|", "| x\\|y | 3 | 0.12 |", "| z | 10 | – |"]


@pytest.mark.parametrize("header, rows", [([], []), (["a"], [[1, 2]]), (["a"], [[None]]), (["a"], [[True]])])
def test_markdown_table_rejects_bad_input(header, rows):
    with pytest.raises(ValueError):
        markdown_table(header, rows)


def test_mean_interval_is_the_t_interval():
    xs = [1.0, 2.0, 4.0]
    mean, _, (lo, hi) = t_interval(xs)
    assert mean_interval(xs, 2) == f"{mean:.2f} ± {(hi - lo) / 2:.2f}"
    assert mean_interval([0.5], 1) == "0.5"
    with pytest.raises(ValueError):
        mean_interval([])
    with pytest.raises(ValueError):
        mean_interval([1.0, math.inf])
