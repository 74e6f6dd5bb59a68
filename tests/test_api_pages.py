"""The API reference (book/api.md and one page per subpackage under book/api/): every public module of fedlab is
documented on exactly one page, every page is in the table of contents and in the index's table, and each page's
example runs as written from the repository's root."""
import re
from pathlib import Path

import pytest
import yaml

import child_checks

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book" / "api").glob("*.md"))
#: examples that start Flower's SecAgg+ or run a matrix row take several seconds
SLOW = {"flower": [pytest.mark.flower, pytest.mark.slow], "experiments": [pytest.mark.slow]}


def _public_modules() -> set[str]:
    """Every module of fedlab outside private names and vendored code; a package's ``__init__`` counts when it
    defines public functions or classes of its own (``fedlab.data``), is an index that re-exports its modules'
    public names under the package's name (``fedlab.fl``: ``fl.fedavg`` is ``fedlab.fl.protocols.fedavg``), or is
    the home of a subpackage's API (``fedlab.flower``, whose public names arrive lazily)."""
    import ast

    out = set()
    for path in (ROOT / "fedlab").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if any(p.startswith("_") and p != "__init__" for p in parts) or "vendor" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
            tree = ast.parse(path.read_text())
            own = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
            if not own and ".".join(parts) not in ("fedlab.flower", "fedlab.fl"):
                continue
        out.add(".".join(parts))
    return out


def _documented() -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for page in PAGES:
        for mod in re.findall(r"automodule:: ([\w.]+)", page.read_text()):
            seen.setdefault(mod, []).append(page.stem)
    return seen


def test_every_public_module_is_on_exactly_one_page():
    seen = _documented()
    public = _public_modules()
    missing = sorted(public - set(seen))
    twice = {m: p for m, p in seen.items() if len(p) > 1}
    assert not missing, f"modules on no API page: {missing}"
    assert not twice, f"modules on several API pages: {twice}"
    assert not set(seen) - public, f"API pages document what is not a public module: {set(seen) - public}"


def test_every_page_is_in_the_toc_and_the_index_table():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [s["file"] for part in toc["parts"] for ch in part["chapters"] if ch["file"] == "book/api"
             for s in ch.get("sections", [])]
    assert files == [f"book/api/{p}" for p in ("core", "data", "privacy", "fl", "attacks", "flower", "experiments",
                                               "tooling")]
    assert sorted(files) == sorted(f"book/api/{p.stem}" for p in PAGES)
    index = (ROOT / "book" / "api.md").read_text()
    for page in PAGES:
        assert f"<api/{page.stem}>`" in index, page.stem
        text = page.read_text()
        table = re.search(r"autosummary::\n\n((?:   [\w.]+\n)+)", text)
        assert table, f"{page.stem}: no module table"
        assert table.group(1).split() == re.findall(r"automodule:: ([\w.]+)", text), page.stem


def _example(page: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) == 1, f"{page.stem}: {len(blocks)} python examples"
    return blocks[0]


def _results(pages) -> dict:
    """``{page stem: None, or why its example failed}``: each page's example run in a fresh namespace, all in one
    fresh interpreter (tests/child_checks.py: one torch import, not one per page) started in the repository's
    root with a bare environment; an example that raises or prints nothing fails, and the next still runs."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FEDLAB_PROGRESS": "0", "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home())}
    res = child_checks.run([{"name": p.stem, "cwd": str(ROOT), "code": _example(p)} for p in pages], cwd=ROOT,
                           env=env, inherit_env=False, timeout=300)
    return {name: r["error"] if not r["ok"] else None if r["stdout"].strip() else "the example prints nothing"
            for name, r in res.items()}


def _run(pages) -> None:
    """Fails naming the page whose example raised or printed nothing."""
    for name, error in _results(pages).items():
        assert error is None, f"{name}: {error}"


@pytest.fixture(scope="module")
def page_results(request):
    """`_results` of the pages whose tests run (``-m``, ``-k``), in one interpreter: the quick pages, then the slow
    ones (a matrix row, Flower's SecAgg+)."""
    ran = {(getattr(i, "originalname", i.name), getattr(getattr(i, "callspec", None), "id", None))
           for i in request.session.items if getattr(i, "module", None) is request.module}
    pages = [p for p in PAGES if p.stem not in SLOW] if ("test_the_page_examples_run", None) in ran else []
    pages += [p for p in PAGES if p.stem in SLOW and ("test_the_slow_page_examples_run", p.stem) in ran]
    return _results(pages)


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_the_page_examples_run(page_results):
    for p in PAGES:
        if p.stem not in SLOW:
            assert page_results[p.stem] is None, f"{p.stem}: {page_results[p.stem]}"


@pytest.mark.parametrize("page", [pytest.param(p, marks=SLOW[p.stem], id=p.stem) for p in PAGES if p.stem in SLOW])
def test_the_slow_page_examples_run(page, page_results):
    assert page_results[page.stem] is None, f"{page.stem}: {page_results[page.stem]}"


def test_a_failing_example_is_named(tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("# x\n\n```python\nimport fedlab\nraise RuntimeError('planted')\n```\n")
    with pytest.raises(AssertionError, match="(?s)broken: .*planted"):
        _run([page])
    page.write_text("# x\n\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="broken: the example prints nothing"):
        _run([page])
