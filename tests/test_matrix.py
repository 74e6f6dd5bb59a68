"""The attack x defense matrix (issue 23, item 6): the defenses do what their column says, every cell runs,
the cells that must move do, the stored record covers every cell at >= 3 seeds, and the page's table has
one row per attack and one column per defense."""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlab.experiments import matrix as mx
from fedlab.privacy import dp_fedavg as dpf
from fedlab.privacy import ldp
from fedlab.reproduce import RECORD_FIELDS, summarize

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "chapters" / "records" / "matrix.quick.json"
KEYS = [d.key for d in mx.DEFENSES]


# ----------------------------------------------------------------------------------------------- protect
def _updates(A=64, n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(A, 1, generator=g))           # rows of different norms
    return (torch.randn(A, n, generator=g) * scale).double()


def test_protect_does_what_each_column_says():
    U = _updates()
    C = mx.median_norm(U)
    norms = U.norm(dim=1)
    gen = lambda: torch.Generator().manual_seed(1)              # noqa: E731
    assert torch.equal(mx.protect(U, "none"), U)
    clipped = mx.protect(U, "clip", clip_norm=C)
    assert (clipped.norm(dim=1) <= C * (1 + 1e-9)).all()
    assert torch.allclose(clipped[norms <= C], U[norms <= C])  # short rows untouched
    for key, eps in (("dp1", 1.0), ("dp8", 8.0)):
        noise = mx.protect(U, key, clip_norm=C, generator=gen()) - clipped
        z = mx.dp_noise_multiplier(eps)
        assert float(noise.std()) == pytest.approx(z * C, rel=0.02)      # the noise of the sum: z C
    assert mx.dp_noise_multiplier(1.0) > mx.dp_noise_multiplier(8.0) > 0
    s = mx.DP_SETTING
    assert dpf.epsilon_spent(mx.dp_noise_multiplier(1.0), s["sampling_prob"], s["num_rounds"], s["delta"],
                             num_clients=s["num_clients"]) <= 1.0 + 1e-6
    for key, eps in (("ldp1", 1.0), ("ldp10", 10.0), ("ldp500", 500.0)):
        noise = mx.protect(U, key, clip_norm=C, generator=gen()) - clipped   # clipped to (2C)/2 = C
        assert float(noise.std()) == pytest.approx(ldp.gaussian_sigma(eps, mx.LDP_DELTA, 2 * C), rel=0.02)
        assert float(noise.norm(dim=1).mean()) / C == pytest.approx(mx.ldp_noise_ratio(eps, 400), rel=0.02)
    pruned = mx.protect(U, "prune90")
    assert ((pruned != 0).sum(1) == 40).all() and torch.equal(pruned[pruned != 0], U[pruned != 0])
    sums = mx.protect(U, "secagg", group=4)
    assert sums.shape == (16, 400) and torch.allclose(sums, U.reshape(16, 4, 400).sum(1), atol=1e-8)
    for key, nu in (("dpriv0.5", 0.5), ("dpriv5", 5.0)):
        rho = mx.protect(U, key, rng=np.random.default_rng(0)) - U
        ratio = rho.norm(dim=1) / norms                          # E ||rho|| = nu ||update||
        assert float(ratio.mean()) == pytest.approx(nu, rel=0.1)


def test_protect_and_cells_refuse_bad_input():
    U = _updates(8, 10)
    with pytest.raises(ValueError, match="defense"):
        mx.protect(U, "magic")
    with pytest.raises(ValueError, match="updates"):
        mx.protect(U[0], "none")
    with pytest.raises(ValueError, match="group"):
        mx.protect(U, "secagg", group=3)
    with pytest.raises(ValueError, match="clip_norm"):
        mx.protect(U, "clip", clip_norm=-1.0)
    with pytest.raises(ValueError, match="row"):
        mx.run_row("nope", 0)
    with pytest.raises(ValueError, match="columns"):
        mx.run_row("mr", 0, ["none", "nope"])
    with pytest.raises(ValueError, match="seed"):
        mx.run_row("mr", -1)
    with pytest.raises(ValueError, match="n/a"):
        mx.cell("imprint", "dp1")
    with pytest.raises(ValueError, match="finite"):
        mx.advantage(float("nan"), 0.5, 0.9)


# ---------------------------------------------------------------------------------------------- the cells
@pytest.fixture(scope="module")
def tiny():
    """Every row at a tiny size, seed 0 (about 20 s on one core)."""
    return {a.key: mx.run_row(a, 0, tiny=True) for a in mx.ATTACKS}


def test_every_cell_runs_and_na_cells_have_reasons(tiny):
    for a in mx.ATTACKS:
        assert set(a.not_applicable) <= set(KEYS)
        assert all(isinstance(r, str) and len(r) > 40 for r in a.not_applicable.values()), a.key
        assert set(tiny[a.key]) == {"baseline"} | (set(KEYS) - set(a.not_applicable)), a.key
        assert all(np.isfinite(v) for v in tiny[a.key].values()), (a.key, tiny[a.key])
        assert a.chapter in {p.stem for p in (ROOT / "chapters").glob("*.ipynb")}
    assert mx.cell("mr", "none", tiny=True)(0) == pytest.approx(tiny["mr"]["none"])   # a cell is a function of the seed


def test_cells_move_the_way_their_defense_must(tiny):
    t = tiny
    # DLG: undefended it beats the mean-colour image by far; DP-FedAvg and LDP noise push it below it
    assert t["dlg"]["none"] > t["dlg"]["baseline"] + 20
    assert max(t["dlg"][k] for k in ("dp1", "dp8", "ldp1", "ldp10")) < t["dlg"]["baseline"] < t["dlg"]["none"] - 20
    # imprint reads inputs from ratios of gradient entries: clipping (a rescaling) leaves it intact,
    # pruning and any noise break exactness, secure aggregation lowers it (bins shared by 4 clients)
    assert t["imprint"]["clip"] == t["imprint"]["none"] > 0.5
    assert t["imprint"]["ldp500"] == t["imprint"]["prune90"] == 0.0
    assert 0 < t["imprint"]["secagg"] < t["imprint"]["none"]
    # membership: DP at eps = 1 brings both attacks to chance, clipping alone does not
    for row in ("mia", "mia_active"):
        assert t[row]["none"] > 0.7 and abs(t[row]["dp1"] - 0.5) < 0.1 and t[row]["clip"] > 0.7, t[row]
    # PAC: the zero-model probe identifies every sign undefended and under clipping (a rescaling of each
    # message); noise at eps = 1 brings it towards "always dislike"
    assert t["pac"]["none"] == t["pac"]["clip"] == 1.0
    assert t["pac"]["ldp1"] < t["pac"]["ldp500"] < t["pac"]["none"]
    # RAIFLE: LDP at eps = 1 is chance; with ADM the secure-aggregation bypass recovers the target exactly
    for row in ("rs", "oltr", "oltr_adm"):
        assert t[row]["none"] > 0.9 and abs(t[row]["ldp1"] - 0.5) < 0.1, t[row]
    assert t["oltr_adm"]["secagg"] > 0.95 > t["oltr"]["secagg"]
    # the eavesdropper: exact undefended and under DP-FedAvg (the trusted server's noise never touches the
    # client's message), wrong under client-side noise
    assert t["mr"]["none"] < 1e-6 and t["mr"]["dp1"] < 1e-6 and t["mr"]["ldp1"] > 0.1


# ----------------------------------------------------------------------------------------------- the table
def _fake_record(seeds=(0, 1, 2)):
    values = {}
    rng = np.random.default_rng(0)
    for a in mx.ATTACKS:
        values[mx.value_name(a.key, "baseline")] = [0.5] * len(seeds)
        for k in KEYS:
            if k not in a.not_applicable:
                values[mx.value_name(a.key, k)] = list(0.5 + 0.4 * rng.random(len(seeds)))
    layout = {"rows": [{"key": a.key, "label": a.label, "chapter": a.chapter, "metric": a.metric,
                        "higher_is_success": a.higher_is_success, "threat": a.threat, "baseline": a.baseline,
                        "not_applicable": dict(a.not_applicable), "secagg_group": a.secagg_group} for a in mx.ATTACKS],
              "columns": [{"key": d.key, "label": d.label} for d in mx.DEFENSES]}
    return {"values": values, "summary": summarize(values), "seeds": list(seeds), "matrix": layout}


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.head, self.section, self.titles = [], [], None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("thead", "tbody"):
            self.section = tag
        elif tag == "tr" and self.section == "tbody":
            self.rows.append([])
        elif tag in ("td", "th"):
            (self.head if self.section == "thead" else self.rows[-1]).append(a.get("class", tag))
            if a.get("class") == "mx-na":
                self.titles.append(a.get("title"))


def test_render_html_has_one_row_per_attack_and_one_column_per_defense():
    rec = _fake_record()
    page = mx.render_html(rec)
    p = _Cells()
    p.feed(page)
    assert len(p.head) == len(mx.DEFENSES) + 1
    assert len(p.rows) == len(mx.ATTACKS) and all(len(r) == len(mx.DEFENSES) + 1 for r in p.rows)
    n_na = sum(len(a.not_applicable) for a in mx.ATTACKS)
    assert sum(r.count("mx-na") for r in p.rows) == n_na and all(p.titles)
    assert sum(r.count("mx-cell") for r in p.rows) == len(mx.ATTACKS) * len(mx.DEFENSES) - n_na
    for a in mx.ATTACKS:
        assert f'href="{a.chapter}.html"' in page
    s = rec["summary"][mx.value_name("dlg", "none")]
    assert f"{s['mean']:.3g}<br><span style=\"font-size:0.85em\">[{s['ci95'][0]:.3g}, {s['ci95'][1]:.3g}]</span>" in page
    reasons = {r for a in mx.ATTACKS for r in a.not_applicable.values()}
    assert page.count("<li>") == len(reasons)                        # one note per distinct reason
    with pytest.raises(ValueError, match="matrix"):
        mx.render_html({"summary": {}})


def test_advantage_colours_against_the_baseline_in_either_direction():
    assert mx.advantage(0.5, 0.5, 0.9) == 0.0 and mx.advantage(0.9, 0.5, 0.9) == 1.0
    assert mx.advantage(0.7, 0.5, 0.9) == pytest.approx(0.5)
    assert mx.advantage(0.4, 0.8, 0.0) == pytest.approx(0.5)          # lower is success (relative error)
    assert mx.advantage(5.0, 0.8, 0.0) == 0.0 and mx.advantage(0.3, 0.5, 0.5) == 0.0


# ---------------------------------------------------------------------------------------------- the record
def test_stored_record_has_every_cell_at_three_or_more_seeds():
    rec = json.loads(RECORD.read_text())
    assert set(RECORD_FIELDS) <= set(rec) and rec["chapter"] == "matrix" and rec["failures"] == []
    assert len(rec["seeds"]) >= 3 and len(rec["seconds"]) == len(rec["seeds"])
    assert [r["key"] for r in rec["matrix"]["rows"]] == [a.key for a in mx.ATTACKS]
    assert [c["key"] for c in rec["matrix"]["columns"]] == KEYS
    for a in mx.ATTACKS:
        for k in ["baseline"] + KEYS:
            name = mx.value_name(a.key, k)
            if k in a.not_applicable:
                assert name not in rec["values"]
                assert rec["matrix"]["rows"][[r["key"] for r in rec["matrix"]["rows"]].index(a.key)][
                    "not_applicable"][k] == a.not_applicable[k]
            else:
                vals = rec["values"][name]
                assert len(vals) >= 3 and all(v is not None and np.isfinite(v) for v in vals), name
                assert rec["summary"][name]["n"] == len(vals)
    assert rec["summary"] == json.loads(json.dumps(summarize(rec["values"])))
    assert set(rec["row_seconds"]) == {a.key for a in mx.ATTACKS}
    assert re.fullmatch(r"[0-9a-f]{7,}", rec["commit"]), rec["commit"]   # committed code, not a dirty tree


def test_live_cell_is_checked_against_the_record():
    rec = json.loads(RECORD.read_text())
    v = rec["values"][mx.value_name("mr", "none")]
    assert mx.consistent_with_record(rec, "mr", "none", float(np.mean(v)))
    assert not mx.consistent_with_record(rec, "mr", "none", 10.0)
    with pytest.raises(ValueError, match="no values"):
        mx.consistent_with_record(rec, "imprint", "dp1", 0.0)


def test_reproduce_matrix_writes_a_record_and_names_a_failing_seed(tmp_path, monkeypatch):
    """`python -m fedlab reproduce matrix` through fedlab.reproduce.reproduce_matrix, with the cells stubbed
    (the real run is the stored record above): one entry per seed, the summary, the layout, a failing seed."""
    from fedlab import reproduce as rp

    def fake(seed, progress=None):
        if seed == 5:
            raise RuntimeError("boom")
        progress("dlg", 0.25)
        return {"dlg|none": 1.0 + seed, "dlg|baseline": 0.5}, {"dlg": 0.25}

    monkeypatch.setattr(mx, "run_matrix", fake)
    path, failures = rp.reproduce_matrix(scale="quick", seeds=[0, 1, 2], out=tmp_path, root=ROOT, command="c")
    rec = json.loads(path.read_text())
    assert path.name == "matrix.quick.json" and failures == [] and set(RECORD_FIELDS) <= set(rec)
    assert rec["values"]["dlg|none"] == [1.0, 2.0, 3.0] and rec["summary"]["dlg|none"]["n"] == 3
    assert rec["row_seconds"] == {"dlg": [0.25, 0.25, 0.25]} and len(rec["matrix"]["rows"]) == len(mx.ATTACKS)
    path2, failures = rp.reproduce_matrix(scale="quick", seeds=[4, 5, 6], out=tmp_path, root=ROOT)
    assert [f["seed"] for f in failures] == [5] and failures[0]["cell"] == "dlg" and "boom" in failures[0]["error"]
    assert path2.name == "matrix.quick.failed.json"                      # never replaces the clean record
    assert json.loads(path2.read_text())["summary"]["dlg|none"]["n"] == 2
    with pytest.raises(ValueError, match="seeds"):
        rp.reproduce_matrix(scale="quick", seeds=[1, 1], out=tmp_path, root=ROOT)
