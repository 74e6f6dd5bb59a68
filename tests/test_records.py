"""fedlab.records: reading the records that `python -m fedlab reproduce` writes."""
import json

import pytest

from fedlab import records
from fedlab.reproduce import summarize


def _record(tmp_path, values, seeds=(0, 1, 2), failures=()):
    rec = {"chapter": "02_x", "title": "X", "scale": "paper", "seeds": list(seeds), "values": values,
           "summary": summarize(values), "seconds": [10.0] * len(seeds), "failures": list(failures),
           "machine": "x86_64, 2 CPUs", "python": "3.11", "torch": "2.13.0", "commit": "abc", "date": "2026-11-23",
           "command": "python -m fedlab reproduce 02"}
    path = tmp_path / "02_x.paper.json"
    path.write_text(json.dumps(rec))
    return path


def test_format_and_run(tmp_path):
    _record(tmp_path, {"auc": [0.5, 0.6, 0.7], "p": ["1.0e-03", "2.0e-03", "3.0e-03"], "src": ["syn", "syn", "syn"],
                       "one": [0.25, None, None]})
    run = records.Run("02_x", folder=tmp_path)
    # 0.6 ± t(0.975, 2) * 0.1 / sqrt(3) = 0.6 ± 0.248
    assert run.paper("auc") == "0.600 ± 0.248 (n = 3)"
    assert run.paper("auc", 1, scale_factor=100) == "60.0 ± 24.8 (n = 3)"
    assert run.paper("p") == "2.00e-03 ± 2.48e-03 (n = 3)"
    assert run.paper("src") == "syn" and run.paper("one") == "0.250 (n = 1)" and run.paper("zzz") == "not in record"
    assert "seeds 0, 1, 2 (n = 3)" in run.describe() and "10 s per seed" in run.describe()
    assert records.Run("03_none", folder=tmp_path).paper("auc") == "no record yet"
    assert "reproduce 03_none --scale paper" in records.Run("03_none", folder=tmp_path).describe()
    rows = records.compare_rows({"auc": 0.55}, run.record, {"auc": "AUC", "c": "C"})
    assert rows == [["AUC", 0.55, "0.600 ± 0.248 (n = 3)"], ["C", "n/a", "not in record"]]


def test_per_seed_and_count_below_skip_failed_seeds(tmp_path):
    _record(tmp_path, {"d": [-0.1, 0.2, -0.3], "a": [1.0, 2.0, 3.0], "b": [2.0, 1.0, 5.0], "short": [1.0, None, None]},
            failures=[{"seed": 1, "cell": 3, "error": "x"}])
    run = records.Run("02_x", folder=tmp_path)
    assert run.per_seed("d") == [-0.1, -0.3]            # seed 1 failed: its value is not counted
    assert run.count_below("d") == 2 and run.count_below("d", -0.2) == 1 and run.count_below("a", "b") == 2
    with pytest.raises(ValueError, match="other='short'"):
        run.count_below("a", "short")
    assert records.Run("03_none", folder=tmp_path).count_below("d") == 0


def test_a_small_mean_with_a_wide_interval_reads_in_decimals(tmp_path):
    _record(tmp_path, {"d": [-0.024, 0.031, 0.024, -0.008, 0.023], "tiny": [1e-4, 2e-4, 3e-4, 1e-4, 2e-4]},
            seeds=range(5))
    run = records.Run("02_x", folder=tmp_path)
    assert run.paper("d") == "0.009 ± 0.030 (n = 5)"       # not 9.20e-03 ± 2.97e-02
    assert run.paper("tiny").startswith("1.80e-04 ± ")


def test_record_errors(tmp_path):
    assert records.load_record(tmp_path / "missing.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"values": 1}))
    with pytest.raises(ValueError, match="not a fedlab record"):
        records.load_record(bad)
    path = _record(tmp_path, {"a": [1, 2, 3]})
    data = json.loads(path.read_text())
    data["values"]["a"] = [1, 2]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="one entry per seed"):
        records.load_record(path)
    with pytest.raises(ValueError, match="scale"):
        records.load("02_x", "huge", tmp_path)


def test_stored_records_are_well_formed():
    """Every record committed under chapters/records/ was written by the command and reads back."""
    from pathlib import Path
    from fedlab.reproduce import RECORD_FIELDS

    folder = Path(__file__).resolve().parents[1] / "chapters" / "records"
    for path in folder.glob("*.json"):
        rec = records.load_record(path)
        assert set(RECORD_FIELDS) <= set(rec), path
        assert path.name == f"{rec['chapter']}.{rec['scale']}.json"
        failed = {f["seed"] for f in rec["failures"]}
        clean = [s not in failed for s in rec["seeds"]]
        assert rec["summary"] == json.loads(json.dumps(summarize(rec["values"], clean))), path
        # what the book shows must be a clean multi-seed run
        assert rec["failures"] == [] and len(rec["seeds"]) >= 3, (path, rec["failures"])
    assert not list(folder.glob("*.failed.json")), "a failed run's record is lying in chapters/records/"


def test_record_errorbars_draws_the_interval(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from fedlab import plots

    _record(tmp_path, {"auc": [0.5, 0.6, 0.7], "b": [1.0, 1.0, 1.0]})
    rec = records.load("02_x", folder=tmp_path)
    ax = plots.record_errorbars(rec, {"auc": "AUC", "b": "B"}, current={"auc": 0.55})
    bars = [c for c in ax.containers if hasattr(c, "lines")]
    seg = bars[0].lines[2][0].get_segments()[0]                # the x error segment of "AUC"
    assert seg[0][0] == pytest.approx(0.6 - 0.2484, abs=1e-3) and seg[1][0] == pytest.approx(0.6 + 0.2484, abs=1e-3)
    ax2 = plots.record_errorbars(None, {"auc": "AUC"})
    assert any("no stored record" in t.get_text() for t in ax2.texts)
    with pytest.raises(ValueError, match="names"):
        plots.record_errorbars(rec, {})


def test_readme_quotes_the_stored_records():
    """The README's table of stored records is what `python -m fedlab reproduce --list` prints."""
    import re
    from pathlib import Path
    from fedlab.reproduce import _stored_times, list_chapters

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    block = re.search(r"<!-- reproduce --list -->\n```text\n(.*?)```", text, re.S)
    assert block, "README lacks the block of `reproduce --list` output"
    want = "".join(f"{c.stem:32s} {c.title}{_stored_times(c.stem, root / 'chapters' / 'records')}\n"
                   for c in list_chapters(root))
    assert block.group(1) == want


def test_bar_plot_draws_the_reference_line():
    import matplotlib
    matplotlib.use("Agg")
    from fedlab import plots
    ax = plots.bar_plot({"accuracy": 0.9, "AUC": 0.6}, hline=(0.55, "chance floor"))
    lines = [ln for ln in ax.get_lines() if ln.get_label() == "chance floor"]
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [0.55, 0.55]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["chance floor"]
    assert plots.bar_plot({"a": 1.0}).get_legend() is None
