"""Every chapter notebook tells the story and keeps the plumbing in fedlab (CONTRIBUTING.md):
at most one code cell over 15 non-blank lines, at most two ``def``s, at most three ``glue(`` calls
visible on the page (bookkeeping goes through ``fedlab.book`` in cells tagged ``remove-input``), and
no ``assert`` hidden from the page."""
import json
import re
from pathlib import Path

import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("*.ipynb"))
HIDDEN = {"remove-input", "remove-cell"}


def _code_cells(path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield i, "".join(cell["source"]), set(cell.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_notebook_is_thin(path):
    cells = list(_code_cells(path))
    long = [(i, n) for i, src, _ in cells if (n := sum(1 for line in src.splitlines() if line.strip())) > 15]
    defs = sum(len(re.findall(r"^\s*def ", src, re.M)) for _, src, _ in cells)
    glue = sum(len(re.findall(r"\bglue\(", src)) for _, src, tags in cells if not tags & HIDDEN)
    hidden_asserts = [i for i, src, tags in cells if tags & HIDDEN and re.search(r"^\s*assert\b", src, re.M)]
    assert len(long) <= 1, f"code cells over 15 lines (cell, lines): {long}"
    assert defs <= 2, f"{defs} defs: move the logic into fedlab/experiments"
    assert glue <= 3, f"{glue} glue( calls on the page: use fedlab.book.glue_many in a remove-input cell"
    assert not hidden_asserts, f"asserts hidden from the page in cells {hidden_asserts}"


def test_there_are_chapters():
    assert len(CHAPTERS) >= 8


TABLE_CALL = re.compile(r"(^|\.)(md_table|markdown_table|\w+_table)$")


def _discarded_tables(src: str) -> list[str]:
    """Calls that build a table (``plots.md_table``, ``*_table``) as a statement of their own before the cell's
    last line: Jupyter shows only the last expression, so such a table is computed and never seen."""
    import ast

    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return []
    return [ast.unparse(st.value.func) for st in body[:-1]
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
            and TABLE_CALL.search(ast.unparse(st.value.func))]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_table_is_computed_and_discarded(path):
    lost = [(i, f) for i, src, _ in _code_cells(path) for f in _discarded_tables(src)]
    assert not lost, f"tables built and never shown (cell, call): {lost}; wrap them in display(...)"


def test_the_discarded_table_check_sees_one():
    assert _discarded_tables("t = 1\nplots.md_table(['a'], [[1]])\nassert t") == ["plots.md_table"]
    assert _discarded_tables("display(plots.md_table(['a'], [[1]]))\nassert True") == []
    assert _discarded_tables("x = 2\nplots.md_table(['a'], [[x]])") == []


def test_no_page_cites_an_internal_issue():
    """Readers never saw this project's issue tracker: a page says what changed and why, not "Issue 35 added"."""
    pages = list(CHAPTERS) + sorted((CHAPTERS[0].parents[1] / "book").rglob("*.md"))
    hits = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if page.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        hits += [f"{page.name}: {m.group(0)}" for m in re.finditer(r".{0,30}\bissues? #?\d+.{0,30}", text, re.I)]
    assert not hits, hits


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_cell_has_a_unique_id(path):
    """nbformat 4.5: a cell without an id is a warning today and a hard error in future nbformat versions (four
    cells added to 07 without one were seen as MissingIDFieldWarning in CI)."""
    nb = json.loads(path.read_text())
    ids = [c.get("id") for c in nb["cells"]]
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5) and all(ids), [i for i, x in enumerate(ids) if not x]
    assert len(set(ids)) == len(ids), "duplicate cell ids"


COMMENTED_ASSERT = re.compile(r"#.*?(?:\S)assert\s|#\s*assert\s+\S.*(?:[<>]=?|==|!=|\bin\b)")


def _commented_asserts(src: str) -> list[str]:
    """Lines whose comment holds an assert statement (a lost newline turns ``# note\\nassert x`` into a comment)."""
    return [line.strip() for line in src.splitlines() if "#" in line and COMMENTED_ASSERT.search(line[line.index("#"):])]


def test_commented_assert_is_found():
    lost = '''# the income of the records (largest batch)assert f1["a"] > f1["b"] + 3, f1'''
    assert _commented_asserts(lost) and _commented_asserts("x = 1  # assert y > 2")
    assert not _commented_asserts('assert a > b, a   # ... and it holds at every seed')


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_assert_hidden_in_a_comment(path):
    found = [(i, line) for i, src, _ in _code_cells(path) for line in _commented_asserts(src)]
    assert not found, f"an assert inside a comment never runs (cell, line): {found}"
