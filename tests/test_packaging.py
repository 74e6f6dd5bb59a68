"""Packaging claims of the README: the library works without the notebook stack, the import-name
clash with SMILELab's FedLab is detected, the pinned ranges are what the code needs."""
import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch

import child_checks as child_checks_
import fedlab
from fedlab import plots

ROOT = Path(__file__).resolve().parents[1]


_MD_TABLE_CODE = ("from fedlab import plots; from fedlab.privacy import ldp, dp_fedavg\n"
                  "from fedlab import data; assert data.load_digits().X.shape == (1797, 64)\n"
                  "print(plots.md_table(['x'], [[1]]), ldp.gaussian_sigma(10, 1e-5) > 0, 'sklearn' in sys.modules)")


def _readme_one_liners(srv: Path) -> list[str]:
    import re
    readme = (ROOT / "README.md").read_text()
    codes = re.findall(r'^python -c "(.+)"$', readme, flags=re.M)
    return [code.replace("/srv/fedlab", str(srv)) for code in codes]


@pytest.fixture(scope="module")
def child_checks(tmp_path_factory):
    """The checks of this file that need a fresh interpreter, in one (tests/child_checks.py; one torch import, not
    one a check): the md_table snippet first (no scikit-learn imported before it), then scripts/core_smoke.py,
    both with IPython and myst_nb unimportable as in a core install, then the README's one-liners from a
    temporary folder. ``{name: {"ok", "stdout", "error"}}``: a check that fails, fails its own test alone."""
    tmp = tmp_path_factory.mktemp("readme")
    checks = [{"name": "md_table", "cwd": str(ROOT), "code": "import sys\n" + _MD_TABLE_CODE,
               "block_notebook_stack": True},
              {"name": "core_smoke", "cwd": str(ROOT), "script": str(ROOT / "scripts" / "core_smoke.py"),
               "block_notebook_stack": True}]
    checks += [{"name": f"readme {i}", "cwd": str(tmp), "code": code}
               for i, code in enumerate(_readme_one_liners(tmp / "srv"))]
    return child_checks_.run(checks, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "FEDLAB_PROGRESS": "0"}, timeout=300)


@pytest.mark.slow
def test_md_table_needs_no_ipython_and_renders_as_markdown(child_checks):
    t = plots.md_table(["a", "b"], [[1, 0.5]])
    assert isinstance(t, str) and t._repr_markdown_() == "| a | b |\n|---|---|\n| 1 | 0.500 |"
    # a fresh process (child_checks) also loads the digits: without importing scikit-learn (fedlab.data reads its
    # file) and without IPython
    res = child_checks["md_table"]
    assert res["ok"], res["error"]
    assert res["stdout"].strip().endswith("True False"), res["stdout"]


def test_md_table_aligns_columns_and_checks_align():
    """``align`` writes each column's separator (``l`` the default ``---``, ``r`` ``---:``, ``c`` ``:---:``); the
    default is the plain table, and a wrong ``align`` names the argument."""
    assert plots.md_table(["a", "b", "c"], [["x", 1, 2.0]], align="lrc") == \
        "| a | b | c |\n|---|---:|:---:|\n| x | 1 | 2.000 |"
    assert plots.md_table(["a", "b"], [[1, 2]], align="ll") == plots.md_table(["a", "b"], [[1, 2]])
    for bad in ("l", "lrx", "LR", 3):
        with pytest.raises(ValueError, match="align"):
            plots.md_table(["a", "b"], [[1, 2]], align=bad)


def test_the_digits_are_scikit_learns():
    """fedlab.data reads scikit-learn's digits file itself (importing scikit-learn costs about 1.7 s of CPU in
    each process that wants only the digits): the very arrays of sklearn.datasets.load_digits."""
    import numpy as np
    from sklearn.datasets import load_digits

    from fedlab import data

    ref = load_digits()
    X, y = data._digits_arrays()
    assert X.dtype == ref.data.dtype and np.array_equal(X, ref.data) and np.array_equal(y, ref.target)
    d = data.load_digits()
    assert d.X.dtype == torch.float32 and torch.equal(d.X, torch.from_numpy(ref.data.astype(np.float32) / 16.0))
    assert torch.equal(d.y, torch.from_numpy(ref.target.astype(np.int64)))


def test_a_distribution_named_fedlab_stops_the_import(monkeypatch):
    class Other:
        version = "1.3.0"

    def fake(name):
        if name == "fedlab":
            return Other()
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    with pytest.raises(ImportError, match="SMILELab"):
        fedlab._check_no_other_fedlab()


def test_dependencies_hold_what_the_library_imports_and_the_extras_match_their_use():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(meta["dependencies"])
    assert "dp-accounting" in core and "matplotlib>=3.9" in core
    extras = meta["optional-dependencies"]
    assert {"book", "test", "lab"} <= set(extras)
    assert not any("jupyterlab" in r for r in extras["book"] + extras["test"])   # not needed to build or test
    assert any("jupyter-book" in r for r in extras["book"]) and any("nbval" in r for r in extras["test"])
    assert (ROOT / "LICENSE").read_text().count("CC BY 4.0") >= 1 and meta["license-files"] == ["LICENSE"]


def test_ci_runs_the_readme_commands_and_the_fresh_install_check():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make book" in readme
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert "make test" in lines and "make book" in lines
    assert any(line.startswith("scripts/check_core_install.sh") for line in lines)
    assert lines.index("make test") < lines.index("make book")   # the book reuses what make test executed
    assert any(line.startswith("if ! wait") for line in lines)   # a failed core install fails CI
    assert "(src|href)=\"https?://" in ci                       # the offline check of the built pages
    script = (ROOT / "scripts" / "check_core_install.sh").read_text()
    assert 'pip install --quiet "$SRC"' in script and "git ls-files" in script
    assert 'scripts/core_smoke.py" --installed' in script
    smoke = (ROOT / "scripts" / "core_smoke.py").read_text()
    assert "IPython" in smoke and "epsilon_spent" in smoke and "fl.fedavg(" in smoke


def test_core_smoke_script_runs_against_this_tree(child_checks):
    """The calls the fresh-install check makes (scripts/core_smoke.py) run here too: an API change that breaks
    them fails ``make test`` and not only CI (stop 53's CI failed on ``fedavg(lr=...)`` in that script). It runs
    in child_checks' fresh interpreter, as ``__main__``, with IPython unimportable as in the core install."""
    res = child_checks["core_smoke"]
    assert res["ok"], res["error"]
    assert res["stdout"].startswith("core install OK"), res["stdout"]


def test_readme_python_one_liners_run(child_checks, tmp_path):
    """Every ``python -c "..."`` command of the README runs against this tree (its /srv paths moved into a
    temporary folder, run from there): the deployment recipe's ``write_app`` and ``write_consistency_keys`` calls."""
    codes = _readme_one_liners(tmp_path)
    assert len(codes) >= 2, codes
    for i, code in enumerate(codes):
        res = child_checks[f"readme {i}"]
        assert res["ok"], (code, res["error"])
