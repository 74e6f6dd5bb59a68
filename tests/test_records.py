"""fedlab.records: paper-scale run records written by notebooks and shown by the quick build."""
import json

import pytest

from fedlab.records import Record, compare_rows, describe, load_record


def test_record_round_trip(tmp_path):
    rec = Record(a=0.5, b="x")
    path = rec.save(tmp_path / "sub" / "r.paper.json", seconds=12.34, scale="paper")
    data = load_record(path)
    assert data["values"] == {"a": 0.5, "b": "x"} and data["seconds"] == 12.3 and data["scale"] == "paper"
    assert {"date", "python", "torch", "machine", "commit"} <= set(data)
    rows = compare_rows({"a": 0.4}, data, {"a": "A", "c": "C"})
    assert rows == [["A", 0.4, 0.5], ["C", "n/a", "n/a"]]
    assert compare_rows({"a": 1}, None, {"a": "A"}) == [["A", 1, "n/a"]]
    assert describe(data).startswith("The stored paper-scale run took 12 s on ") and "No" in describe(None)


def test_record_errors(tmp_path):
    assert load_record(tmp_path / "missing.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"values": 1}))
    with pytest.raises(ValueError, match="record"):
        load_record(bad)
    with pytest.raises(ValueError, match="seconds"):
        Record().save(tmp_path / "r.json", seconds=-1, scale="paper")


def test_record_glue_checks_type():
    pytest.importorskip("myst_nb")
    rec = Record()
    with pytest.raises(ValueError, match="value"):
        rec.glue("t", [1, 2])
    rec.glue("n", 3)
    assert rec == {"n": 3}
