"""`make test` stores the notebooks nbval ran, executed, and `make book` reuses them only while nothing they
depend on changed (issue 32: every notebook runs once per CI run). scripts/executed_store.py, conftest.py."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from scripts import executed_store  # noqa: E402

CELLS = [
    "print('hello')",
    "from IPython.display import display, HTML\nh = display(HTML('<b>first</b>'), display_id=True)",
    "h.update(HTML('<b>second</b>'))\n1 + 1",
    "import ipywidgets as w\nw.IntSlider(value=3)",
    "import sys; print('to stderr', file=sys.stderr)",
    "out = w.Output()\nwith out:\n    print('inside an Output widget')\nout",
    "def f(x=1):\n    return x\n\nw.interact(f, x=[1, 2]);",     # the semicolon hides the returned function
]


def _notebook(path: Path, cells=CELLS) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_load_needs_the_same_fingerprint(tmp_path, monkeypatch):
    nb_path = _notebook(tmp_path / "a.ipynb")
    nb = nbformat.read(nb_path, as_version=4)
    out = tmp_path / "executed"
    monkeypatch.setenv("FEDLAB_SEED", "1")
    executed_store.store(nb_path, nb, executed_store.fingerprint(nb_path), out)
    assert executed_store.load(nb_path, out) is not None
    monkeypatch.setenv("FEDLAB_SEED", "2")                   # another seed: execute again
    assert executed_store.load(nb_path, out) is None
    monkeypatch.setenv("FEDLAB_SEED", "1")
    scale = os.environ.get("FEDLAB_SCALE")                  # make test sets it to quick
    monkeypatch.setenv("FEDLAB_SCALE", "paper" if scale != "paper" else "quick")   # another scale
    assert executed_store.load(nb_path, out) is None
    if scale is None:
        monkeypatch.delenv("FEDLAB_SCALE")
    else:
        monkeypatch.setenv("FEDLAB_SCALE", scale)
    assert executed_store.load(nb_path, out) is not None
    _notebook(nb_path, CELLS + ["2 + 2"])                     # the notebook changed
    assert executed_store.load(nb_path, out) is None
    (out / "a.fingerprint.json").write_text("{not json")      # a damaged fingerprint is no match
    assert executed_store.load(nb_path, out) is None


def test_fingerprint_sees_the_library(tmp_path, monkeypatch):
    import torch

    fp = executed_store.fingerprint(_notebook(tmp_path / "a.ipynb"))
    assert fp["torch"] == torch.__version__                  # read from the metadata, torch unimported
    files = sorted(ROOT.glob("fedlab/**/*.py"))
    assert files
    monkeypatch.setattr(executed_store, "_SOURCES", ("fedlab/privacy/*.py",))   # a different set of sources
    assert executed_store.fingerprint(tmp_path / "a.ipynb")["sources_sha256"] != fp["sources_sha256"]


def _run_nbval(root: Path, nb_paths: list[Path], out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FEDLAB_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *map(str, nb_paths), "--nbval-lax", "--nbval-current-env", "--keep-executed", str(out)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_nbval_run_stores_what_nbclient_would(tmp_path):
    """The copy rebuilt from nbval's kernel messages equals nbclient's execution of the notebook: streams,
    a display updated by id, an execute result, widget state; a notebook with a failing cell is not stored."""
    from nbclient import NotebookClient

    root = tmp_path / "book"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    shutil.copy(ROOT / "scripts" / "executed_store.py", root / "scripts" / "executed_store.py")
    nb_path = _notebook(root / "ok.ipynb")
    bad = _notebook(root / "bad.ipynb", ["x = 1", "raise ValueError('planted')", "print(x)"])
    out = root / "_build" / "executed"
    # one nbval run of both notebooks (one pytest start, not two): only bad.ipynb's raising cell fails
    run = _run_nbval(root, [nb_path, bad], out)
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert run.returncode == 1 and len(failed) == 1 and failed[0].startswith("FAILED bad.ipynb::Cell 1"), \
        run.stdout + run.stderr
    spec = importlib.util.spec_from_file_location("copied_store", root / "scripts" / "executed_store.py")
    store = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(store)                 # the copy, whose sources are those of `root`
    stored = store.load(nb_path, out)
    assert stored is not None

    reference = nbformat.read(nb_path, as_version=4)
    # fedlab's GuardedClient is nbclient's NotebookClient with the lost-wake-up fix for Output widgets (a plain
    # NotebookClient without a time limit once hung here for 8 minutes with its kernel idle) and a cell limit
    from fedlab.reproduce import GuardedClient

    assert issubclass(GuardedClient, NotebookClient)
    GuardedClient(reference, timeout=120, record_timing=False, resources={"metadata": {"path": str(root)}}).execute()

    def outputs(nb):
        cells = [c for c in nb.cells if c.cell_type == "code"]
        return [[{k: v for k, v in o.items() if k != "execution_count"} for o in c.outputs] for c in cells]

    def widget_models(nb):
        state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        return sorted((s["model_name"], json.dumps(s["state"].get("value")), json.dumps(s["state"].get("outputs"), sort_keys=True))
                      for s in state.values())

    got, want = outputs(stored), outputs(reference)
    # widget views carry random model ids: compare their kinds, and the rest exactly
    for cells in (got, want):
        for i in (3, 5, 6):
            for o in cells[i]:
                o["data"].pop("application/vnd.jupyter.widget-view+json", None)
    assert got == want
    assert "second" in json.dumps(got[1]) and "first" not in json.dumps(got[1])   # the update replaced it
    assert widget_models(stored) == widget_models(reference)
    assert "inside an Output widget" in json.dumps(stored.metadata["widgets"])
    assert stored.metadata["language_info"]["name"] == "python"

    assert not (out / "bad.ipynb").exists() and store.load(bad, out) is None
