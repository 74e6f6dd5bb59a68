"""scripts/scan_asserts.py: every assert of a notebook at each seed, reported rather than raised."""
import io
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import scan_asserts as sc  # noqa: E402

sys.path.pop(0)


def _notebook(tmp_path, *sources):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# a page"], "metadata": {}}]
          + [{"cell_type": "code", "source": s.splitlines(True), "metadata": {}, "outputs": [],
              "execution_count": None} for s in sources],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "page.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_every_failing_assert_of_every_seed_is_reported_and_the_rest_runs(tmp_path):
    path = _notebook(tmp_path,
                     "import os\nSEED = int(os.environ['FEDLAB_SEED'])\n%matplotlib inline",
                     "assert SEED % 2 == 0, 'odd'\nassert SEED < 3\nreached = True",
                     "assert 1 / (SEED - 2) > 0")
    out = io.StringIO()
    res = sc.scan(path, [0, 1, 2, 4], show="reached", out=out)
    assert res[0] == ["1 / (SEED - 2) > 0"]                     # 1 / -2 < 0
    assert res[1] == ["SEED % 2 == 0", "1 / (SEED - 2) > 0"]     # a failing assert stops neither its cell nor the seed
    assert res[2][0].startswith("1 / (SEED - 2) > 0 [ZeroDivisionError")   # a condition that raises: a failure
    assert res[4] == ["SEED < 3"]
    text = out.getvalue()
    assert "1 FAIL: SEED % 2 == 0" in text and "    True" in text


def test_a_cell_that_raises_ends_the_seed_and_upto_stops_early(tmp_path):
    path = _notebook(tmp_path, "x = 1", "raise RuntimeError('boom')", "assert False")
    res = sc.scan(path, [0], out=io.StringIO())
    assert res[0] == ["cell 2 raised RuntimeError: boom"]
    assert sc.scan(path, [0], upto=1, out=io.StringIO()) == {0: []}


def test_seeds_text_and_bad_arguments(tmp_path, capsys):
    assert sc.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    for bad in ["", "a", "3-x", "-1", "0-20000"]:
        with pytest.raises(ValueError, match="--seeds"):
            sc.parse_seeds(bad)
    with pytest.raises(SystemExit):
        sc.main([str(tmp_path / "missing.ipynb")])
    assert "not found" in capsys.readouterr().err
    path = _notebook(tmp_path, "assert int(__import__('os').environ['FEDLAB_SEED']) != 1")
    assert sc.main([str(path), "--seeds", "0,2"]) == 0
    assert sc.main([str(path), "--seeds", "0-2"]) == 1
    assert "failing: [1]" in capsys.readouterr().out
