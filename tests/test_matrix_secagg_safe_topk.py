"""The matrix's SecAgg+ row and its safe-Gaussian and top-k columns (issue 35 item 4). The malicious server
inside Flower's SecAgg+ (row ``secagg_lie``: false dropout, split view, model inconsistency) against stock SecAgg+
and SecAgg+ with the consistency round (``secagg_cr``); the floating-point-safe Gaussian beside the float one
(``dp1safe``, ``ldp10safe``); top-k at 1 % (``topk1``)."""
import math

import pytest
import torch

from fedlab.experiments import matrix as mx
from fedlab import privacy
from fedlab.experiments.matrix import rows as mx_rows
from fedlab.privacy import dp_fedavg as dpf
from fedlab.privacy import ldp

KEYS = [d.key for d in mx.DEFENSES]


# ------------------------------------------------------------------------------------------------------------
# the layout: which cells exist
def test_layout_of_the_safe_and_topk_columns_and_the_secagg_row():
    by = {d.key: d for d in mx.DEFENSES}
    assert by["dp1safe"].kind == "dp" and by["dp1safe"].safe and by["dp1safe"].param == by["dp1"].param
    assert by["ldp10safe"].kind == "ldp" and by["ldp10safe"].safe and by["ldp10safe"].param == by["ldp10"].param
    assert not by["dp1"].safe and not by["ldp10"].safe
    assert by["topk1"].kind == "prune" and by["topk1"].param == 0.99 and by["prune90"].param == 0.9
    assert "top-k" in by["prune90"].label
    row = mx_rows._attack(mx.SECAGG_ROW)
    assert row.observer == "malicious server" and mx.SECAGG_ROWS == (row,) and mx.ATTACKS[-1] is row
    assert set(KEYS) - set(row.not_applicable) == set(mx.SECAGG_COLUMNS) == {"none", "secagg", "secagg_cr"}
    for a in mx.ATTACKS:          # the consistency column exists in the SecAgg+ row only
        assert ("secagg_cr" in a.not_applicable) == (a.key != mx.SECAGG_ROW), a.key
    # the safe DP column exists wherever the float one does (the eavesdropper's too: dp_fedavg has safe=True)
    for a in mx.ATTACKS:
        assert ("dp1safe" in a.not_applicable) == ("dp1" in a.not_applicable), a.key
        assert ("ldp10safe" in a.not_applicable) == ("ldp10" in a.not_applicable), a.key
    assert "dp1safe" in mx.OUTSIDER_COLUMNS
    with pytest.raises(ValueError, match="safe"):
        mx.Defense("x", "x", "clip", safe=True)
    with pytest.raises(ValueError, match="safe"):
        mx.Defense("x", "x", "dp", 1.0, safe=1)
    with pytest.raises(ValueError, match="secagg_cr"):
        privacy.apply(torch.ones(4, 3), "secagg_cr")
    with pytest.raises(ValueError, match="columns"):
        mx_rows._secagg_lie_row(0, ["clip"])
    html = mx.render_html(_fake_record())
    assert "Malicious server inside secure aggregation" in html and "consistency round" in html


def _fake_record():
    """A record with the SecAgg+ row's three cells and one seed each (enough for render_html)."""
    row = mx_rows._attack(mx.SECAGG_ROW)
    rows = [{"key": row.key, "label": row.label, "chapter": row.chapter, "metric": row.metric,
             "higher_is_success": True, "threat": row.threat, "baseline": row.baseline,
             "not_applicable": dict(row.not_applicable), "secagg_group": 8, "cell_notes": dict(row.cell_notes),
             "epsilons": {"rounds": 1, "sampling_prob": 1.0, "releases": 1, "dp": {}, "ldp": {}},
             "observer": row.observer, "value_range": [None, None]}]
    vals = {"baseline": [3.0, 3.5], "none": [110.0, 115.0], "secagg": [75.0, 76.0], "secagg_cr": [3.0, 3.5]}
    summary = {f"{mx.SECAGG_ROW}|{k}": {"mean": sum(v) / 2, "ci95": [min(v), max(v)], "n": 2} for k, v in vals.items()}
    return {"matrix": {"rows": rows, "columns": [{"key": d.key, "label": d.label} for d in mx.DEFENSES]},
            "summary": summary, "values": {f"{mx.SECAGG_ROW}|{k}": v for k, v in vals.items()}}


# ------------------------------------------------------------------------------------------------------------
# the malicious server inside Flower's SecAgg+
@pytest.fixture(scope="module")
def secagg_row(tiny_matrix):
    pytest.importorskip("flwr", reason="the SecAgg+ row runs Flower's SecAgg+ (the `flower` extra)")
    return tiny_matrix.row(mx.SECAGG_ROW)[0]          # mx.run_row(mx.SECAGG_ROW, 0, tiny=True), shared


@pytest.mark.slow
def test_stock_secagg_gives_the_target_away_the_consistency_round_leaves_the_sum(secagg_row):
    r = secagg_row
    assert r["baseline"] < 10, r                                       # iDLG on the sum of 8 models: nothing
    assert r["none"] > 50 and r["secagg"] > 50, r                     # stock SecAgg+: the target's digit recovered
    assert r["secagg@exposed"] == 3.0, r                              # by each of the three attacks
    assert min(r[f"secagg@{a}"] for a in mx.SECAGG_ATTACKS) > 25, r
    assert r["secagg_cr@exposed"] == 0.0, r                           # the consistency round refuses all three
    assert r["secagg_cr"] == r["baseline"], r                         # the server gets only the honest sum
    assert all(r[f"secagg_cr@{a}"] == r["baseline"] for a in mx.SECAGG_ATTACKS), r


# ------------------------------------------------------------------------------------------------------------
# the floating-point-safe mechanisms
def _on_grid(x: torch.Tensor, grid: float) -> bool:
    k = x.double() / grid
    return bool((k - k.round()).abs().max() < 1e-6)


def test_safe_columns_release_the_discrete_gaussian_on_a_grid():
    G = torch.randn(6, 400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    C = mx.median_norm(G)
    z = mx.dp_noise_multiplier(1.0)
    grid = 2.0 ** math.floor(math.log2(z * C / 1024))                 # dp_aggregate(safe=True)'s default grid
    gen = lambda: torch.Generator().manual_seed(3)                    # noqa: E731
    safe = privacy.apply(G, "dp1safe", clip_norm=C, generator=gen())
    flt = privacy.apply(G, "dp1", clip_norm=C, generator=gen())
    assert _on_grid(safe, grid) and not _on_grid(flt, grid)
    # the same noise scale: the safe release's noise std is the float one's (z C) to a few per cent
    clipped = privacy.apply(G, "clip", clip_norm=C)
    assert abs(float((safe - clipped).std()) / float((flt - clipped).std()) - 1) < 0.05
    # the pre-noise view of the curious server is the same clipped update under both
    assert torch.equal(privacy.apply(G, "dp1safe", clip_norm=C, client_side_noise=False),
                       privacy.apply(G, "dp1", clip_norm=C, client_side_noise=False))
    # LDP: the safe column is ldp_gaussian(safe=True), the float column ldp_gaussian(safe=False)
    s = privacy.apply(G, "ldp10safe", clip_norm=C, generator=gen())
    assert torch.equal(s, ldp.ldp_gaussian(G, 10.0, mx.LDP_DELTA, 2 * C, generator=gen(), safe=True))
    assert torch.equal(privacy.apply(G, "ldp10", clip_norm=C, generator=gen()),
                       ldp.ldp_gaussian(G, 10.0, mx.LDP_DELTA, 2 * C, generator=gen(), safe=False))
    diffs = (s[0][None] - s[0][:, None]).abs()                        # the discrete release lives on a lattice
    step = float(diffs[diffs > 0].min())
    assert _on_grid(s[0] - s[0][0], step) and not _on_grid(privacy.apply(G, "ldp10", clip_norm=C, generator=gen())[0]
                                                           - privacy.apply(G, "ldp10", clip_norm=C, generator=gen())[0][0],
                                                           step)


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_the_safe_mechanism_reaches_the_rows():
    # the passive membership row trains under dp_aggregate(safe=True): another release than the float column's
    # (the same generator seeds: the float mechanism in both would give the same AUC to the last digit)
    r = mx.run_row("mia_outsider", 0, ["dp1", "dp1safe"], tiny=True)
    assert r["dp1"] != r["dp1safe"], r
    assert abs(r["dp1safe"] - 0.5) < 0.2 and abs(r["dp1"] - 0.5) < 0.2, r    # both near chance: no weaker
    d = mx.run_row("imprint", 0, ["none", "ldp10", "ldp10safe"], tiny=True)
    assert d["ldp10safe"] <= d["none"] and d["ldp10"] <= d["none"], d


def test_safe_epsilons_are_upper_bounds_from_the_discrete_gaussian():
    e = mx.effective_epsilons("dlg_outsider")
    assert e["dp"]["dp1safe"] >= e["dp"]["dp1"] and e["ldp"]["ldp10safe"] == 10.0
    assert mx.effective_epsilons("dlg")["dp"]["dp1safe"] is None          # the curious server: before the noise
    # the lower bound on the safe multiplier is below the true one for clipping bounds across the grid's range
    z, n = mx.dp_noise_multiplier(1.0), 5000
    for C in (0.3, 1.0, 1.7, 123.0):
        assert dpf.safe_noise_multiplier(z, C, 1.0, n) >= 1024 / (1024 / z + math.sqrt(n)) * (1 - 1e-12)
    assert mx.safe_central_epsilon(z, n, 1.0, 1, 1e-5) == pytest.approx(
        dpf.epsilon_spent(1024 / (1024 / z + math.sqrt(n)), 1.0, 1, 1e-5, safe=True))
    assert mx.safe_ldp_epsilon(10.0, 1) == 10.0 and mx.safe_ldp_epsilon(10.0, 30) <= 30 * 10.0
    with pytest.raises(ValueError, match="num_params"):
        mx.safe_central_epsilon(z, 0, 1.0, 1, 1e-5)
    with pytest.raises(ValueError, match="releases"):
        mx.safe_ldp_epsilon(10.0, 0)


# ------------------------------------------------------------------------------------------------------------
# top-k at 1 %
@pytest.mark.slow
def test_topk1_sends_one_percent_and_dlg_reads_its_mask():
    G = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2))
    view, public = privacy.apply_public(G, "topk1")
    assert (view != 0).sum(1).tolist() == [10, 10, 10]                # 1 % of 1000 coordinates each
    top = G.abs().topk(10, dim=1).indices
    assert torch.equal(view.gather(1, top), G.gather(1, top)) and torch.equal(public["mask"], view != 0)
    r = mx.run_row("dlg", 0, ["topk1"], tiny=True)
    assert "topk1@naive" in r and r["topk1"] != r["topk1@naive"], r   # the mask-aware attacker ran
    # ... with the evidence of whether it reached its optimum: the true digits fit the sent coordinates exactly
    assert r["topk1" + mx.LOSS_TRUTH_SUFFIX] < 1e-10 < r["topk1" + mx.LOSS_SUFFIX], r
    r = mx.run_row("ig", 0, ["topk1"], tiny=True)                     # IG's row: its cosine term, the same check
    assert r["topk1" + mx.LOSS_TRUTH_SUFFIX] < 1e-10 < r["topk1" + mx.LOSS_SUFFIX] and "topk1@naive" in r, r


# ------------------------------------------------------------------------------------------------------------
# the utility of every column
@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_utility_table_shows_every_column_from_the_membership_rows_training():
    rec = {"matrix": {"rows": [], "columns": []},
           "summary": {"mia|acc_none": {"mean": 0.9, "ci95": [0.85, 0.95], "n": 3},
                       "mia|acc_dp1": {"mean": 0.25, "ci95": [-0.1, 0.6], "n": 3},
                       "mia|acc_secagg": {"mean": 0.9, "ci95": [0.85, 0.95], "n": 3}}}
    lines = str(mx.utility_table(rec)).splitlines()
    assert len(lines) == 2 + len(mx.DEFENSES)
    row = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    label = {d.key: d.label for d in mx.DEFENSES}
    assert "0.250 [0.000, 0.600]" in row[label["dp1"]]                 # the interval cut to [0, 1]
    assert "not in the stored record yet" in row[label["dp1safe"]] and "not in the stored" in row[label["topk1"]]
    assert "0.900" in row[label["secagg_cr"]] and "consistency round changes no sum" in row[label["secagg_cr"]]
    with pytest.raises(ValueError, match="acc_none"):
        mx.utility_table({"matrix": {}, "summary": {"mia|none": {"mean": 1}}})
    with pytest.raises(ValueError, match="matrix"):
        mx.utility_table({})
    r = mx.run_row("mia", 0, ["none", "dp1safe", "topk1"], tiny=True)         # the new columns are trained too
    assert {"acc_none", "acc_dp1safe", "acc_topk1"} <= set(r) and all(0 <= r[k] <= 1 for k in r if k.startswith("acc_"))


# ------------------------------------------------------------------------------------------------------------
# Inverting Gradients that reads the mask
@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_inverting_gradients_matches_only_the_sent_coordinates():
    from fedlab import models
    from fedlab.attacks import gradient_inversion as gi

    net = models.lenet(3, 10, 8, activation="relu", seed=0)
    w = models.get_params(net)
    X = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([3])
    G = models.flatten_stacked(gi.per_example_gradients(net, w, X, y))
    view = privacy.apply(G, "prune90")
    obs = models.unflatten_stacked(view, w)
    mask = models.unflatten_stacked(view != 0, w)
    kw = dict(budget=gi.AttackBudget(max_iter=300, lr=0.1), prior=gi.ImagePrior(tv_weight=0.0), stacked=True, seed=0)
    knows = lambda mask=None: gi.Knowledge(input_shape=(3, 8, 8), labels=y[None], mask=mask)   # noqa: E731
    naive = gi.inverting_gradients(net, w, obs, knows=knows(), **kw)
    ada = gi.inverting_gradients(net, w, obs, knows=knows(mask), **kw)
    p_naive, p_ada = float(gi.matched_psnr(naive.x[0], X)[0]), float(gi.matched_psnr(ada.x[0], X)[0])
    assert p_ada > p_naive + 1, (p_ada, p_naive)           # measured: 15.0 dB against 12.5 dB
    # an all-True mask is the plain objective, to the last bit. Checked on 40 iterations instead of the 300 above
    # (1.4 s of CPU instead of 5.3): every iteration runs the same code, and the only thing that depends on
    # max_iter, the learning-rate milestones at 3/8, 5/8 and 7/8 of it, falls at iterations 15, 25 and 35, so the
    # masked and the plain run still pass every step of the schedule before their images are compared
    ones = {k: torch.ones_like(v, dtype=torch.bool) for k, v in obs.items()}
    short = dict(kw, budget=gi.AttackBudget(max_iter=40, lr=0.1))
    assert torch.equal(gi.inverting_gradients(net, w, obs, knows=knows(ones), **short).x,
                       gi.inverting_gradients(net, w, obs, knows=knows(), **short).x)
    with pytest.raises(ValueError, match="mask"):
        gi.inverting_gradients(net, w, obs, knows=knows({"nope": 1}), **kw)


def test_the_eavesdropper_row_has_a_floating_point_safe_dp_cell():
    """The eavesdropper row runs fl.dp_fedavg with the discrete Gaussian in its dp1safe column (it once had only
    the float one, and the cell was "not applicable"): the noise differs, so the broadcast models and the decoded
    model differ from the float column's; the eavesdropper still sees the clipped update before the noise."""
    out = mx_rows._mr_row(0, ["dp1", "dp1safe"], tiny=True)
    assert "dp1safe" not in mx_rows._attack("mr").not_applicable
    assert all(math.isfinite(v) for v in out.values())
    assert out["dp1safe"] != out["dp1"]                 # a float run in both columns gives the same number
    assert max(out["dp1"], out["dp1safe"]) < 1e-6 < out["baseline"]
