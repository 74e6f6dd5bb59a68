"""scripts/compare_records.py, the check that a refactor changed no number: a moved value is reported, a
wall-clock timing (``_s``, ``_ms``, ``_seconds``) is not."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, values: dict) -> None:
    folder.mkdir()
    (folder / "x.paper.json").write_text(json.dumps({"seeds": [0, 1], "values": values}))


def _compare(tmp_path, before: dict, after: dict):
    _write(tmp_path / "b", before)
    _write(tmp_path / "a", after)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_records.py"), str(tmp_path / "b"),
                           str(tmp_path / "a")], capture_output=True, text=True)


def test_timings_are_skipped_and_equal_values_pass(tmp_path):
    r = _compare(tmp_path, {"auc": [0.5, 0.6], "run_s": [1, 2], "t_ms": [3, 4], "ray_seconds": [5, 6]},
                 {"auc": [0.5, 0.6], "run_s": [9, 9], "t_ms": [9, 9], "ray_seconds": [9, 9]})
    assert r.returncode == 0 and "identical: 2 values in 1 records" in r.stdout


def test_a_moved_value_and_a_lost_key_are_reported(tmp_path):
    r = _compare(tmp_path, {"auc": [0.5, 0.6], "gone": [1, 1]}, {"auc": [0.5, 0.61]})
    assert r.returncode == 1 and "x.paper.json auc seed 1: 0.6 -> 0.61" in r.stdout and "gone: only before" in r.stdout
