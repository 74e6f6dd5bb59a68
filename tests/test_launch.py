"""Launching the book elsewhere (issue 22, item 7): the Colab install cell of every chapter does what it
says on Colab and nothing anywhere else; one setting names the repository in every place; Binder installs
the CPU torch."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlab import book

ROOT = Path(__file__).resolve().parents[1]
URL = "https://github.com/example-org/fedlab-course"
_FIND_SPEC = importlib.util.find_spec


def _run_cell(monkeypatch, source, *, on_colab: bool, installed: bool):
    calls, moves = [], []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check=False: calls.append((list(cmd), check)))
    monkeypatch.setattr(os, "chdir", moves.append)
    real = _FIND_SPEC
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real("fedlab") if installed else None) if name == "fedlab" else real(name, *a))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", object())
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "colab-cell", "exec"), {})
    return calls, moves


def test_colab_cell_installs_on_colab_only(monkeypatch):
    src = book.colab_cell_source(URL)
    calls, moves = _run_cell(monkeypatch, src, on_colab=False, installed=False)
    assert calls == [] and moves == []                     # a laptop, nbval, the book build: nothing
    calls, moves = _run_cell(monkeypatch, src, on_colab=True, installed=True)
    assert calls == [] and moves == []                     # Colab with fedlab already installed: nothing
    calls, moves = _run_cell(monkeypatch, src, on_colab=True, installed=False)
    assert calls[0] == (["git", "clone", "--depth", "1", URL, "/content/fedlab-course"], True)
    # myst-nb comes with it: every chapter glues its numbers (a bare install failed at the first glue)
    assert calls[1] == ([sys.executable, "-m", "pip", "install", "--quiet", "/content/fedlab-course[book]"], True)
    assert moves == ["/content/fedlab-course/chapters"] and len(calls) == 2
    calls, _ = _run_cell(monkeypatch, book.colab_cell_source(URL, book.chapter_extras("06_flower")), on_colab=True,
                         installed=False)
    assert calls[1][0][-1] == "/content/fedlab-course[book,flower]"     # Chapter 6 runs Flower
    assert book.chapter_extras("06b_flower_secagg") == ("book", "flower")  # and so does 6b
    with pytest.raises(ValueError, match="extras"):
        book.colab_cell_source(URL, ("book]; rm -rf /",))


def test_colab_cell_without_a_repository_says_how_to_name_one(monkeypatch):
    with pytest.raises(RuntimeError, match="set_repository_url"):
        _run_cell(monkeypatch, book.colab_cell_source(""), on_colab=True, installed=False)
    for bad in ("http://example.org/x", 'https://x" + "y', "https://a b"):
        with pytest.raises(ValueError, match="repository"):
            book.colab_cell_source(bad)


@pytest.mark.slow
def test_every_notebook_and_the_config_name_the_same_repository():
    out = subprocess.run([sys.executable, "scripts/set_repository_url.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_setting_the_repository_updates_config_and_notebooks(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import set_repository_url as s
    finally:
        sys.path.pop(0)
    (tmp_path / "chapters").mkdir()
    for name in ("_config.yml", "_toc.yml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    nb = ROOT / "chapters" / "02_pac_identifiability.ipynb"
    (tmp_path / "chapters" / nb.name).write_text(nb.read_text())
    s.write_config(URL, "main", tmp_path)
    for path in s.chapter_notebooks(tmp_path):
        s.write_notebook(path, URL)
    assert s.configured_url(tmp_path) == URL and s.problems(tmp_path) == []
    text = (tmp_path / "_config.yml").read_text()
    assert 'binderhub_url: "https://mybinder.org"' in text and "use_repository_button: true" in text
    code = (tmp_path / "chapters" / nb.name).read_text()
    assert code.count(book.COLAB_CELL_ID) == 1 and URL in code          # replaced, not added twice
    s.write_notebook(tmp_path / "chapters" / nb.name, URL)
    assert (tmp_path / "chapters" / nb.name).read_text() == code


def test_binder_installs_the_cpu_torch_then_the_package():
    req = (ROOT / "binder" / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in req and "torch==2.13.0" in req
    post = (ROOT / "binder" / "postBuild").read_text()
    assert 'pip install --no-cache-dir ".[book,lab,flower]"' in post and os.access(ROOT / "binder" / "postBuild", os.X_OK)


def test_binder_installs_every_extra_a_chapter_needs():
    post = (ROOT / "binder" / "postBuild").read_text()
    import re
    installed = set(re.search(r'pip install [^\n]*"\.\[([\w,]+)\]"', post).group(1).split(","))
    needed = set(book.DEFAULT_EXTRAS).union(*book.CHAPTER_EXTRAS.values())
    assert needed <= installed, needed - installed
