"""The "What reproduced" page (chapters/reproduced.ipynb) and its registry, fedlab.experiments.claims:
every claim reads a value its record has, every paper number comes from a constant that exists, every
link points at a target a chapter has, and every verdict is computed from the record (a changed record
value changes it)."""
import copy
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

from fedlab import records
from fedlab.experiments import claims as cl

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "chapters" / "records"


def _load(folder):
    return {stem: records.load(stem, "paper", folder) for stem in cl.chapters()}


@pytest.fixture(scope="module")
def recs():
    return _load(RECORDS)


def _labels(stem: str) -> set[str]:
    nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
    return {m for c in nb.cells if c.cell_type == "markdown" for m in re.findall(r"^\(([^)\s]+)\)=\s*$", c.source, re.M)}


def _markdown(stem: str) -> str:
    nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_every_chapter_with_a_record_has_two_to_four_headline_claims():
    per = {}
    for c in cl.CLAIMS:
        per[c.chapter] = per.get(c.chapter, 0) + 1
    # the matrix's record (page 07) reproduces no paper's headline number: it composes the chapters' attacks and
    # defenses, and page 07 reports its cells and the adaptive-vs-naive comparison itself
    stems = {p.name.split(".")[0] for p in RECORDS.glob("*.paper.json")} - {"matrix"}
    assert set(per) == stems, set(per) ^ stems
    assert all(2 <= n <= 5 for n in per.values()), per


def test_every_claim_reads_a_value_of_its_record_and_a_paper_constant(recs):
    for c in cl.CLAIMS:
        rec = recs[c.chapter]
        assert c.key in rec["values"], (c.chapter, c.key)
        if c.direction is not None and isinstance(c.direction[1], str):
            assert c.direction[1] in rec["values"], (c.chapter, c.direction)
        if c.paper is not None:
            low, high = c.paper.range()
            assert math.isfinite(low) and low <= high, (c.key, low, high)
            assert c.paper.source().startswith(c.paper.constant)


def test_our_numbers_are_the_records_summary(recs):
    """The mean and interval the page shows are the ones `reproduce` stored (recomputed from the values,
    so that a changed value changes them; cut to the metric's limits)."""
    for c in cl.CLAIMS:
        mean, low, high, n = cl._interval(c, recs[c.chapter])
        s = recs[c.chapter]["summary"][c.key]
        assert n == s["n"] and mean == pytest.approx(s["mean"], abs=1e-9), c.key
        lo, hi = s["ci95"]
        if c.limits is not None:
            lo, hi = max(lo, c.limits[0]), min(hi, c.limits[1])
        assert (low, high) == pytest.approx((lo, hi), abs=1e-9), c.key


def test_every_link_points_at_a_target_of_its_chapter():
    toc = (ROOT / "_toc.yml").read_text()
    for c in cl.CLAIMS:
        assert f"chapters/{c.chapter}\n" in toc, c.chapter
        assert c.label in _labels(c.chapter), (c.chapter, c.label)
    assert "chapters/reproduced\n" in toc


def _write(tmp_path, recs, stem, key, values):
    folder = tmp_path / "records"
    folder.mkdir(exist_ok=True)
    for s, r in recs.items():
        r = copy.deepcopy(r)
        if s == stem:
            r["values"][key] = list(values)
        (folder / f"{s}.paper.json").write_text(json.dumps(r))
    return _load(folder)


@pytest.mark.parametrize("claim", cl.CLAIMS, ids=lambda c: f"{c.chapter[:3]}-{c.key}")
def test_changing_the_record_flips_the_verdict(claim, recs, tmp_path):
    """In a temporary copy of the records, the claim's values are set so that the rule must say
    reproduced, then so that it must not: the verdict follows the record."""
    rec = recs[claim.chapter]
    n = len(rec["seeds"])
    jitter = [1e-6 * (i - n / 2) for i in range(n)]
    if claim.rule == "interval":
        low, high = claim.paper.range()
        at = low if math.isfinite(low) else high
        yes = [at + j for j in jitter]
        no = [low - 2 * max(1.0, abs(low)) + j for j in jitter]      # far below the paper's value or range
    else:
        op, other = claim.direction
        theirs = rec["values"][other] if isinstance(other, str) else [other] * n
        sign = 1 if op in (">", ">=") else -1
        yes = [t + sign for t in theirs]              # the direction holds at every seed
        no = list(yes)
        no[0] = theirs[0] - sign                      # ... at all but one
    got_yes = cl.verdict(claim, _write(tmp_path, recs, claim.chapter, claim.key, yes)[claim.chapter])
    got_no = cl.verdict(claim, _write(tmp_path, recs, claim.chapter, claim.key, no)[claim.chapter])
    assert got_yes.word == "reproduced", (claim.key, yes, got_yes)
    assert got_no.word != "reproduced", (claim.key, no, got_no)


def test_interval_rule_edges():
    c = cl.Claim("x", "t", "v", "interval", "lab", paper=cl.Paper("chapter1a.ZHAO_LABEL_ACC", ("DLG",)),
                 direction=(">", "w"))
    paper = cl.Paper("chapter1a.ZHAO_LABEL_ACC", ("DLG",)).range()[0]
    rec = {"seeds": [0, 1, 2], "values": {"v": [paper - 0.1, paper, paper + 0.1], "w": [0.0, 0.0, 0.0]},
           "failures": []}
    assert cl.verdict(c, rec).word == "reproduced"
    rec["values"]["v"] = [paper + 0.1, paper + 0.1001, paper + 0.1002]     # narrow, above the paper
    assert cl.verdict(c, rec).word == "in direction only"                   # ... and v > w at every seed
    rec["values"]["w"] = [0.0, 0.0, 5.0]
    assert cl.verdict(c, rec).word == "not reproduced"
    # a seed with a failing assert is left out, and so is a missing value
    rec["failures"] = [{"seed": 2, "error": "AssertionError"}]
    assert cl.verdict(c, rec).word == "in direction only"
    with pytest.raises(ValueError, match="two clean seeds"):
        cl.verdict(c, {"seeds": [0], "values": {"v": [0.5], "w": [0.0]}, "failures": []})


def test_a_constant_is_shown_without_an_interval():
    """A value equal at every seed (a failure rate of 0, a share of 1) is shown as such, not as "1.000 [1.000,
    1.000]" (issue 39: no interval on constants); a value that moves keeps its interval."""
    c = cl.Claim("x", "t", "v", "direction", "lab", direction=("<=", 0.05), digits=4)
    rec = {"seeds": [0, 1, 2], "values": {"v": [0.0, 0.0, 0.0]}, "failures": []}
    v = cl.verdict(c, rec)
    assert v.ours == "0.0000 at every seed (n = 3)" and "[" not in v.ours and v.word == "reproduced"
    rec["values"]["v"] = [0.0, 0.0, 0.01]
    assert cl.verdict(c, rec).ours.startswith("0.0033 [") and "(n = 3)" in cl.verdict(c, rec).ours


def test_bad_records_and_claims_raise_clear_errors():
    c = cl.CLAIMS[0]
    with pytest.raises(ValueError, match="no stored record"):
        cl.verdict(c, None)
    with pytest.raises(ValueError, match="has no value"):
        cl.verdict(c, {"seeds": [0, 1], "values": {}, "failures": []})
    bad = {"seeds": [0, 1], "values": {c.key: ["x", 1.0], c.direction[1]: [1.0, 1.0]}, "failures": []}
    with pytest.raises(ValueError, match="not a number"):
        cl.verdict(c, bad)
    none = {"seeds": [0, 1], "values": {c.key: [None, None], c.direction[1]: [1.0, 1.0]}, "failures": []}
    with pytest.raises(ValueError, match="no clean seed"):
        cl.verdict(c, none)
    with pytest.raises(ValueError, match="rule must be"):
        cl.Claim("x", "t", "v", "mean", "lab", direction=(">", 0.0))
    with pytest.raises(ValueError, match="needs the paper's value"):
        cl.Claim("x", "t", "v", "interval", "lab")
    with pytest.raises(ValueError, match="direction must be"):
        cl.Claim("x", "t", "v", "direction", "lab", direction=("=>", 0.0))


def test_a_missing_record_is_named(tmp_path):
    with pytest.raises(ValueError, match="no stored record for 00_fl_primer"):
        cl.verdicts(_load(tmp_path))


def test_paper_ranges_are_read_from_the_constants_text(monkeypatch):
    from fedlab.experiments import chapter3c

    monkeypatch.setattr(chapter3c, "PAPER_FIG5", {"a": "0.6-0.75", "b": "≳ 0.9", "c": "≈ 0.5", "d": "about half"})
    assert cl.Paper("chapter3c.PAPER_FIG5", ("a",)).range() == (0.6, 0.75)
    assert cl.Paper("chapter3c.PAPER_FIG5", ("b",)).range() == (0.9, math.inf)
    assert cl.Paper("chapter3c.PAPER_FIG5", ("c",)).range() == (0.5, 0.5)
    with pytest.raises(ValueError, match="cannot read"):
        cl.Paper("chapter3c.PAPER_FIG5", ("d",)).range()
    with pytest.raises(ValueError, match="module.NAME"):
        cl.Paper("PAPER_FIG5").range()
    rel = cl.Paper("chapter5.PAPER_TABLE2", (10,), relative_to=(0,)).range()[0]
    from fedlab.experiments import chapter5
    assert rel == pytest.approx(chapter5.PAPER_TABLE2[10] / chapter5.PAPER_TABLE2[0])


def test_chapter2_delta_is_the_notebooks():
    for stem in ("02_pac_identifiability", "02b_pac_defenses"):      # 2b rebuilds chapter 2's setting
        nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
        found = {float(m) for c in nb.cells if c.cell_type == "code"
                 for m in re.findall(r"^DELTA = ([0-9.e-]+)", c.source, re.M)}
        assert found == {cl.CHAPTER2_DELTA}, stem


@pytest.mark.parametrize("stem, phrase, key, word", [
    ("01c_membership_inference", "**Not reproduced.** The white-box score", "wb_diff", "not reproduced"),
    ("04b_reconstruction_heuristic", "**Verdict: the paper's Table 1 is not reproduced.**", "ch4-t1-last1",
     "not reproduced"),
    ("05b_dprivacy_experiments", "reproduced in direction; our drop is steeper", "ch5_rel10", "in direction only"),
    ("01c_membership_inference", "reproduced with a learned attack", "act_server_g2_ld", "reproduced"),
    ("01d_membership_defenses", "heterogeneous, is **not** established here", "ce_minus_ft2", "not reproduced"),
    ("01d_membership_defenses", "This part reproduces (asserted below)", "snr_gain", "reproduced"),
    ("01d_membership_defenses", "*Clients agree more on the representation update.* **Not reproduced.**", "agree_ce",
     "not reproduced"),
    ("01d_membership_defenses", "Centaur beats local-only training at every budget from $\\varepsilon = 1$ up",
     "pe_ce_minus_lo_1", "reproduced"),
])
def test_the_page_agrees_with_the_chapters_words(recs, stem, phrase, key, word):
    """Where a chapter states a verdict, the page gives the same (04b's Table 1: the decoded value is not
    reproduced, only its direction; the page's notes say so)."""
    assert phrase in _markdown(stem).replace("\n", " "), phrase
    claim = next(c for c in cl.CLAIMS if c.chapter == stem and c.key == key)
    assert cl.verdict(claim, recs[stem]).word == word


def test_tables_link_every_claim_and_record(recs):
    pairs = cl.verdicts(recs)
    table = cl.claims_table(pairs)
    assert table.count("\n") == len(cl.CLAIMS) + 1
    assert all(f"<{c.label}>`" in table for c in cl.CLAIMS)
    rt = cl.records_table(recs)
    for stem, r in recs.items():
        assert f"{{doc}}`{stem.split('_')[0]} <{stem}>`" in rt and r["commit"] in rt
    counts = cl.summary_counts(pairs)
    assert sum(counts.values()) == len(pairs) and set(counts) == set(cl.VERDICTS)
    notes = cl.notes_markdown(pairs)
    assert all(k in {(c.chapter, c.key) for c in cl.CLAIMS} for k in cl.NOTES)
    assert notes.count("\n* ") == len(cl.NOTES) - 1


def test_chapters_are_in_book_order():
    from fedlab.reproduce import list_chapters

    order = [c.stem for c in list_chapters(ROOT)]
    assert cl.chapters() == sorted(cl.chapters(), key=order.index)


def test_each_chapter_closes_with_its_own_summary(recs):
    """Every chapter with claims ends (before its exercises) with "What this chapter reproduced", computed from its
    own record: the summary names every claim of the chapter with the verdict the "What reproduced" page gives."""
    for stem in cl.chapters():
        nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
        calls = [c.source for c in nb.cells if c.cell_type == "code" and "chapter_summary(" in c.source]
        assert len(calls) == 1 and f'chapter_summary("{stem}", run.record)' in calls[0], stem
        text = cl.chapter_summary(stem, recs[stem])
        mine = [(c, v) for c, v in cl.verdicts(recs) if c.chapter == stem]
        for c, v in mine:
            assert f"* **{v.word}**: {c.text} (" in text and f"<{c.label}>" in text, (stem, c.key)
        counts = cl.summary_counts(mine)
        assert f"{counts['reproduced']} reproduced" in text, stem


def test_the_chapter_summary_follows_the_record_and_refuses_a_stem_without_claims(recs, tmp_path):
    claim = next(c for c in cl.CLAIMS if c.rule == "direction" and not isinstance(c.direction[1], str))
    rec = copy.deepcopy(recs[claim.chapter])
    op, bound = claim.direction
    sign = 1 if op in (">", ">=") else -1
    rec["values"][claim.key] = [bound - sign] * len(rec["seeds"])           # the direction fails at every seed
    rec["summary"] = __import__("fedlab.reproduce", fromlist=["summarize"]).summarize(rec["values"])
    assert f"* **not reproduced**: {claim.text}" in cl.chapter_summary(claim.chapter, rec)
    assert "No paper-scale record is stored" in cl.chapter_summary(claim.chapter, None)
    with pytest.raises(ValueError, match="stem 'nope'"):
        cl.chapter_summary("nope", rec)


def test_a_value_below_the_claims_decimals_is_written_in_scientific_notation():
    """Chapter 4's exact decoding errs by ~1e-11: with 3 decimals it read "0.000 [0.000, 0.000]", a constant to the
    eye, though it moves from seed to seed."""
    from fedlab import records
    from fedlab.experiments import claims as cl

    claim = next(c for c in cl.CLAIMS if c.key == "ch4-err-d1")
    ours = cl.verdict(claim, records.load(claim.chapter, "paper")).ours
    assert "e-" in ours and "0.000 [0.000" not in ours, ours
