"""The syllabus on the landing page (book/index.md) is what scripts/make_syllabus.py generates from the
notebooks and the stored records: a stale table fails here."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_syllabus as ms  # noqa: E402

sys.path.pop(0)


def test_the_landing_page_holds_a_fresh_syllabus():
    text = (ROOT / "book" / "index.md").read_text()
    assert ms.replace_block(text, ms.generate()) == text, "run: python scripts/make_syllabus.py"


def test_check_mode_fails_on_a_stale_page(tmp_path):
    assert ms.main(["--check"]) == 0
    (tmp_path / "chapters").mkdir()
    # a copy of the book whose first chapter grew by 400 words: the syllabus there is stale
    for name in ("_toc.yml",):
        (tmp_path / name).write_text((ROOT / name).read_text())
    for path in (ROOT / "chapters").glob("*.ipynb"):
        (tmp_path / "chapters" / path.name).write_text(path.read_text())
    (tmp_path / "chapters" / "records").symlink_to(ROOT / "chapters" / "records")
    nb = json.loads((tmp_path / "chapters" / "00_fl_primer.ipynb").read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "grown", "metadata": {}, "source": "word " * 400})
    (tmp_path / "chapters" / "00_fl_primer.ipynb").write_text(json.dumps(nb))
    text = (ROOT / "book" / "index.md").read_text()
    assert ms.replace_block(text, ms.generate(tmp_path)) != text


def test_reading_time_counts_the_markdown_words(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["one two\n", "three"]},
                    {"cell_type": "code", "source": "not counted at all"},
                    {"cell_type": "markdown", "source": "four"}]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    assert ms.markdown_words(path) == 4
    assert [ms.reading_minutes(w) for w in (0, 1, 200, 201)] == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="words must be"):
        ms.reading_minutes(-1)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not a notebook"):
        ms.markdown_words(path)


def test_run_time_comes_from_the_record():
    from fedlab import records

    rec = records.load("00_fl_primer", "paper", ROOT / "chapters" / "records")
    minutes = sum(rec["seconds"]) / len(rec["seconds"]) / 60
    assert ms.run_time("00_fl_primer") == f"{minutes:.0f} min (n = {len(rec['seconds'])})"
    fast = records.load("01c_membership_inference", "paper", ROOT / "chapters" / "records")   # under 90 s a seed
    secs = sum(fast["seconds"]) / len(fast["seconds"])
    assert secs < 90 and ms.run_time("01c_membership_inference") == f"{secs:.0f} s (n = {len(fast['seconds'])})"
    part = records.load("04b_reconstruction_heuristic", "paper", ROOT / "chapters" / "records")   # a part of a split record
    minutes = sum(part["seconds"]) / len(part["seconds"]) / 60
    assert ms.run_time("04b_reconstruction_heuristic") == f"{minutes:.0f} min (n = {len(part['seconds'])}, unsplit 04)"
    mx = records.load("matrix", "paper", ROOT / "chapters" / "records")     # the matrix: its own record's name
    assert ms.run_time("07_matrix") == f"{sum(mx['seconds']) / len(mx['seconds']) / 60:.0f} min (n = {len(mx['seconds'])})"


def test_every_chapter_of_the_toc_is_in_the_syllabus_and_in_one_lecture():
    from fedlab.reproduce import list_chapters

    assert [c.stem for c in list_chapters(ROOT)] == list(ms.CHAPTERS)
    order = list(ms.CHAPTERS)
    for stem in ms.CHAPTERS:       # prerequisites come earlier in the book
        assert all(order.index(p) < order.index(stem) for p in ms.prerequisites(stem)), stem
    assert sorted(s for _, stems in ms.LECTURES for s in stems) == sorted(ms.CHAPTERS)


def test_missing_markers_are_a_clear_error():
    with pytest.raises(ValueError, match="syllabus markers"):
        ms.replace_block("# no markers\n", "x")


@pytest.mark.slow
def test_the_matrix_needs_the_chapters_of_its_attacks():
    from fedlab.experiments import matrix

    assert set(ms.prerequisites("07_matrix")) == {a.chapter for a in matrix.ATTACKS}
