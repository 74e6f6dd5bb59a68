"""scripts/split_record.py: a stored record split by key when its chapter is split into notebooks (chapter 1c into
01c_membership_inference and 01d_membership_defenses), and the two stored parts it wrote."""
import json
import sys
from pathlib import Path

import pytest

from fedlab import records
from fedlab.reproduce import RECORD_FIELDS, summarize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import split_record as sr  # noqa: E402

sys.path.pop(0)


def _record(values, seeds=(0, 1, 2), failures=()):
    return {"chapter": "01x_whole", "title": "Whole", "scale": "paper", "seeds": list(seeds), "values": values,
            "summary": summarize(values), "seconds": [100.0, 110.0, 120.0][:len(seeds)], "failures": list(failures),
            "retries": [], "machine": "x86_64, 2 CPUs", "python": "3.11", "torch": "2.13.0", "commit": "abc1234",
            "date": "2026-11-27", "command": "python -m fedlab reproduce 01x --scale paper --seeds 0-2"}


def _keys_folder(tmp_path, parts):
    folder = tmp_path / "quick"
    folder.mkdir()
    for stem, keys in parts.items():
        rec = _record({k: [1.0, 1.0, 1.0] for k in keys})
        rec.update(chapter=stem, title=stem.upper(), scale="quick")
        (folder / f"{stem}.quick.json").write_text(json.dumps(rec))
    return folder


def test_every_key_goes_to_exactly_one_part_unchanged(tmp_path):
    whole = _record({"auc": [0.6, 0.7, 0.8], "note": ["a", "a", "b"], "acc": [0.5, 0.6, 0.55], "k": [3, 3, 3]})
    src = tmp_path / "01x_whole.paper.json"
    src.write_text(json.dumps(whole))
    folder = _keys_folder(tmp_path, {"01x_whole": ["auc", "note"], "01y_part": ["acc", "k", "glued_since"]})
    assert sr.main([str(src), "01x_whole", "01y_part", "--keys-from", str(folder), "--force"]) == 0
    a, b = records.load_record(src), records.load_record(tmp_path / "01y_part.paper.json")   # the loader takes both
    assert set(a["values"]) == {"auc", "note"} and set(b["values"]) == {"acc", "k"}     # glued_since: not invented
    for part in (a, b):
        assert set(RECORD_FIELDS) <= set(part)
        for k, v in part["values"].items():
            assert v == whole["values"][k]
        assert part["summary"] == json.loads(json.dumps(summarize(part["values"])))      # as tests/test_records.py
        for field in ("seeds", "seconds", "commit", "command", "machine", "date", "scale"):
            assert part[field] == whole[field], field
        assert part["split_from"]["chapter"] == "01x_whole" and part["split_from"]["commit"] == "abc1234"
        assert "unsplit" in part["split_from"]["seconds"]
    assert (a["chapter"], b["chapter"], b["title"]) == ("01x_whole", "01y_part", "01Y_PART")


@pytest.mark.parametrize("parts, message", [
    ({"01x_whole": ["auc"], "01y_part": ["acc"]}, "in none: \\['k'\\]"),
    ({"01x_whole": ["auc", "k"], "01y_part": ["acc", "k"]}, "in several: \\['k'\\]"),
])
def test_a_key_in_no_part_or_in_two_writes_nothing(tmp_path, parts, message, capsys):
    whole = _record({"auc": [0.6, 0.7, 0.8], "acc": [0.5, 0.6, 0.55], "k": [3, 3, 3]})
    src = tmp_path / "01x_whole.paper.json"
    src.write_text(json.dumps(whole))
    folder = _keys_folder(tmp_path, parts)
    with pytest.raises(ValueError, match=message):
        sr.split_record(whole, sr.part_keys(folder, list(parts)))
    assert sr.main([str(src), *parts, "--keys-from", str(folder), "--force"]) == 1
    assert "nothing was written" in capsys.readouterr().err
    assert json.loads(src.read_text()) == whole and not (tmp_path / "01y_part.paper.json").exists()


def test_refuses_failures_an_empty_part_and_an_existing_file_without_force(tmp_path):
    whole = _record({"auc": [0.6, 0.7, 0.8]})
    with pytest.raises(ValueError, match="failing seeds"):
        sr.split_record(_record({"auc": [0.6, None, None]}, failures=[{"seed": 1, "cell": 2, "error": "x"}]),
                        {"a": {"keys": {"auc"}, "title": "A"}})
    with pytest.raises(ValueError, match="gets no key"):
        sr.split_record(whole, {"a": {"keys": {"auc"}, "title": "A"}, "b": {"keys": {"x"}, "title": "B"}})
    parts, _ = sr.split_record(whole, {"a": {"keys": {"auc"}, "title": "A"}})
    (tmp_path / "a.paper.json").write_text("{}")
    with pytest.raises(ValueError, match="--force"):
        sr.write_parts(parts, tmp_path)
    assert (tmp_path / "a.paper.json").read_text() == "{}"
    with pytest.raises(ValueError, match="no record of b"):
        sr.part_keys(tmp_path, ["b"])


def test_the_part_that_replaces_the_unsplit_record_is_written_last(tmp_path, monkeypatch):
    whole = _record({"auc": [0.6, 0.7, 0.8], "acc": [0.5, 0.6, 0.55]})
    parts, _ = sr.split_record(whole, {"01x_whole": {"keys": {"auc"}, "title": "X"},
                                       "01y_part": {"keys": {"acc"}, "title": "Y"}})
    order = []
    monkeypatch.setattr(sr, "atomic_write_text", lambda path, text: order.append(Path(path).name))
    sr.write_parts(parts, tmp_path, force=True, source=tmp_path / "01x_whole.paper.json")
    assert order == ["01y_part.paper.json", "01x_whole.paper.json"]


#: the stored records still split from one run: (first part, second part, keys of each part a test names)
SPLIT_RECORDS = [
    ("04_model_reconstruction", "04b_reconstruction_heuristic", ("ch4-err-d1", "ch4-mse-dec"),
     ("ch4-t1-dec1", "ch4-t1-last5", "ch4-obs7-oracle")),
    ("03a_raifle_recsys", "03b_raifle_recsys_defenses", ("ch3a_auc_fncf_emb", "ch3a_draws_auc_fncf_emb"),
     ("ch3a_ldp_eps500", "ch3a_prune90", "ch3a_item_norm")),
    ("03c_raifle_oltr", "03d_raifle_oltr_defenses", ("ch3c_fig5_single", "ch3c_sa_err", "ch3c_pir_tpr"),
     # Tables 4-5 beyond 8 queries are glued at paper scale only
     ("ch3c_ldp_nn_adm", "ch3c_prune_min90", "ch3c_flag_n", "ch3c_ks_neural_16q_adm_eps500")),
]


@pytest.mark.parametrize("first, second, keys_a, keys_b", SPLIT_RECORDS, ids=[s[0][:3] for s in SPLIT_RECORDS])
def test_the_stored_split_records_are_one_run_split_by_key(first, second, keys_a, keys_b):
    a = records.load(first, "paper", ROOT / "chapters" / "records")
    b = records.load(second, "paper", ROOT / "chapters" / "records")
    assert a is not None and b is not None
    assert not set(a["values"]) & set(b["values"])
    for field in ("seeds", "seconds", "commit", "command", "date", "machine", "torch"):
        assert a[field] == b[field], field
    assert a["split_from"] == b["split_from"] and a["split_from"]["chapter"] == first
    assert all(k in a["values"] for k in keys_a) and all(k in b["values"] for k in keys_b)


def test_the_3c_record_predates_the_budget_check():
    """03c's record was made before the budget check's keys were glued: the page must say they are missing."""
    a = records.load("03c_raifle_oltr", "paper", ROOT / "chapters" / "records")
    assert not any(k.startswith("ch3c_budget_") for k in a["values"])
