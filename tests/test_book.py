"""fedlab.book: the page helpers glue what they are given, rounded, and refuse what a page must not quote."""
import math

import numpy as np
import pytest

import fedlab
import torch

from fedlab import book

pytest.importorskip("myst_nb")


@pytest.fixture
def glued(monkeypatch):
    seen = {}
    monkeypatch.setattr(book, "glue", lambda name, value, display=False: seen.__setitem__(name, value))
    return seen


def test_glue_many_rounds_floats_and_unwraps_scalars(glued):
    out = {}
    assert book.glue_many({"a": np.float64(0.123456)}, b=torch.tensor(2.5), c=np.int64(7), d="text", digits=3,
                          record=out) is None          # nothing to print at the end of a cell
    assert out == {"a": 0.123, "b": 2.5, "c": 7, "d": "text"} == glued
    assert type(out["a"]) is float and type(out["c"]) is int


def test_glue_many_keeps_values_in_the_record(glued):
    rec = {}
    book.glue_many(x=1.0, record=rec)
    assert rec == {"x": 1.0}


@pytest.mark.parametrize("bad", [float("nan"), math.inf, True, [1, 2], torch.ones(2)])
def test_glue_many_refuses_what_a_page_must_not_quote(glued, bad):
    with pytest.raises(ValueError, match="bad_value"):
        book.glue_many(bad_value=bad)
    assert glued == {}


def test_glue_many_refuses_a_name_given_twice(glued):
    with pytest.raises(ValueError, match="twice"):
        book.glue_many({"a": 1}, a=2)


def test_setup_seeds_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("FEDLAB_SEED", "5")
    seed = book.setup()
    first = torch.rand(3)
    assert seed == 5 and "seed: 5" in capsys.readouterr().out
    book.setup()
    assert torch.equal(first, torch.rand(3))
    with pytest.raises(ValueError, match="threads"):
        book.setup(threads=0)


def test_setup_prints_the_legend_of_the_page(monkeypatch, capsys, tmp_path):
    """Every chapter's first cell tells this build's numbers from the stored record's."""
    monkeypatch.setenv("FEDLAB_SEED", "2")
    seed, run = book.setup("no_such_chapter")
    out = capsys.readouterr().out
    assert seed == 2 and run.record is None
    assert f"this build's ({fedlab.scale()} scale, seed 2)" in out and "no paper-scale record is stored" in out
    record = {"scale": "paper", "seeds": [0, 1, 2, 3, 4], "commit": "abc1234", "date": "2026-11-27"}
    line = book.legend(record, "quick", 0)
    assert "stored paper-scale record (5 seeds, commit abc1234, 2026-11-27)" in line and "mean ± half-width" in line
    assert "(1 seed," in book.legend(dict(record, seeds=[0]), "quick", 0)


def test_a_glued_paragraph_renders_as_markdown_and_is_recorded_as_its_text(glued):
    """``glue_paragraph``: the page shows the text as Markdown (``{glue:md}``, not myst-nb's bold
    ``{glue:text}``) and ``reproduce`` reads the string back from ``text/plain``; bad entries are named."""
    from IPython.core.formatters import DisplayFormatter

    from fedlab.reproduce import _parse_plain

    text = "At seed 0 **two** of 8 digits failed; both stalled at loss 3.1e-1."
    book.glue_paragraph(para=text)
    value = glued["para"]
    data, _ = DisplayFormatter().format(value)
    assert data["text/markdown"] == text and _parse_plain(data["text/plain"]) == text
    for bad in ("", "  ", 3.0, None):
        with pytest.raises(ValueError, match="para"):
            book.glue_paragraph(para=bad)
    with pytest.raises(ValueError, match="later"):   # nothing glued when one entry is bad (the first one was)
        book.glue_paragraph(first="A sentence.", later="")
    assert "first" not in glued
