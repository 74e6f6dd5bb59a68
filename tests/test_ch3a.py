"""Chapter 3a's experiment helpers (fedlab.experiments.chapter3a): the sweeps run on tiny cases, the tables
and glued names are built from hand-made results."""
import pytest
import torch

from fedlab import records
from fedlab.attacks.interaction_inference.recsys import RaifleBudget, RaifleVariant, make_recsys_case
from fedlab.experiments import chapter3a as ch3a
from fedlab.privacy.ldp import classical_gaussian_sigma, gaussian_sigma

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    """An honest round of FCF and FNCF for 3 users with 12 items each (the last user has 9)."""
    g = torch.Generator().manual_seed(0)
    U, m = 3, 12
    items = torch.stack([torch.randperm(30, generator=g)[:m] for _ in range(U)])
    mask = torch.ones(U, m, dtype=torch.bool)
    mask[2, -3:] = False
    interactions = torch.zeros(U, m)
    interactions[:, :3] = 1.0
    users = type("UserItems", (), {"items": items, "mask": mask, "interactions": interactions * mask,
                                   "__len__": lambda self: U})()
    return make_recsys_case(users, 30, dim=8, local_steps=1, seed=0)


@pytest.fixture
def run(tmp_path):
    return records.Run("03_test", folder=tmp_path)   # no stored record: every paper column says so


def test_table3_runs_every_configuration(case, run):
    res = ch3a.table3(case, fcf_max_iter=5, fncf_max_iter=3, num_restarts=1, seed=0)
    assert list(res) == ch3a.TABLE3_CONFIGS
    assert all(r["auc"].shape == (len(case),) for r in res.values())
    auc, emb = ch3a.table3_summary(res)
    assert set(auc) == set(ch3a.TABLE3_CONFIGS) and all(v == round(v, 3) for v in auc.values())
    assert set(emb) == {k for k in ch3a.TABLE3_CONFIGS if k[1]}            # only where the embedding is estimated
    names = ch3a.table3_values(auc, emb)
    assert names["ch3a_auc_fcf_emb"] == auc[("FCF", True, False)]
    assert names["ch3a_emb_err_fncf_emb_model"] == emb[("FNCF", True, True)]
    assert len(names) == len(auc) + len(emb)
    headers, rows = ch3a.table3_table(auc, emb, run)
    assert len(rows) == 6 and all(len(r) == len(headers) == 4 for r in rows)
    assert [r[0] for r in rows] == [ch3a.VARIANTS[k] for k in ch3a.PAPER_TABLE3] and rows[1][-1] == "no record yet"
    assert rows[1][1] == 0.979 and rows[1][2] == auc[("FCF", True, False)]
    headers, rows = ch3a.table3_emb_table(emb, run)
    assert [r[0] for r in rows] == ["FCF emb", "FNCF emb", "FNCF emb model"] and rows[0][1] == 0.07
    assert rows[1][2] == f'{emb[("FNCF", True, False)]:.2g}' and rows[2][-1] == "no record yet"
    with pytest.raises(ValueError, match="emb lacks"):
        ch3a.table3_emb_table({}, run)
    with pytest.raises(ValueError, match="do not estimate"):
        ch3a.table3_table(auc, {("FCF", False, False): 1.0}, run)
    with pytest.raises(ValueError, match="fcf_max_iter"):
        ch3a.table3(case, fcf_max_iter=0, fncf_max_iter=3, num_restarts=1)
    with pytest.raises(ValueError, match="configurations"):
        ch3a.table3_summary({})
    headers, rows = ch3a.table3_loss_table(res)
    assert [r[0] for r in rows] == [ch3a.VARIANTS[k] for k in ch3a.TABLE3_CONFIGS]
    for r, k in zip(rows, ch3a.TABLE3_CONFIGS):
        assert r[1] == round(res[k]["loss_truth"].median().item(), 3) and r[2] == round(res[k]["loss"].median().item(), 3)
        assert 1 <= r[4] and r[3] == round(res[k]["auc"].mean().item(), 3)
    # at the truth (true interactions and, where estimated, embedding) the loss is its floor, ~0
    assert rows[1][1] < 0.05 and rows[3][1] < 0.05, rows
    with pytest.raises(ValueError, match="configurations"):
        ch3a.table3_loss_table({})


def test_prune_sweep_at_zero_is_the_honest_attack(case):
    kw = {"fcf_max_iter": 6, "fncf_max_iter": 3, "num_restarts": 1, "seed": 0}
    out = ch3a.prune_sweep(case, [0.0, 0.5], **kw)
    assert set(out) == {0.0, 0.5} and set(out[0.0]) == {"FCF emb", "FNCF emb"}
    honest = ch3a.attack_case(case, "fcf", variant=RaifleVariant(estimate_embedding=True),
                              budget=RaifleBudget(max_iter=6, num_restarts=1), seed=0)["auc"]
    assert torch.equal(out[0.0]["FCF emb"], honest)
    with pytest.raises(ValueError, match="fractions"):
        ch3a.prune_sweep(case, [1.0], **kw)


def test_ldp_attack_sweep_and_ks_table(case, run):
    clip = {"fcf": 100.0, "fncf_items": 0.005, "fncf_params": 0.7}
    kw = dict(delta=1e-8, sensitivity=clip, fcf_max_iter=4, fncf_max_iter=2, num_restarts=1)
    out = ch3a.ldp_attack_sweep(case, [1.0, 500.0], seed=0, **kw)
    assert set(out) == {1.0, 500.0} and all(a.shape == (len(case),) for r in out.values() for a in r.values())
    assert set(out[1.0]) == set(ch3a.PAPER_TABLE6)                          # all six variants of Table 6
    again = ch3a.ldp_attack_sweep(case, [1.0], configs=[("FNCF", True, False)], **kw)
    assert list(again[1.0]) == ["FNCF emb"]
    assert torch.equal(again[1.0]["FNCF emb"], out[1.0]["FNCF emb"])      # one generator per epsilon
    with pytest.raises(ValueError, match="fncf_params"):
        ch3a.ldp_attack_sweep(case, [1.0], delta=1e-8, sensitivity={"fcf": 1.0, "fncf_items": 1.0}, fcf_max_iter=1,
                              fncf_max_iter=1, num_restarts=1)
    ks = ch3a.ks_values(again, out[1.0]["FCF emb"], [1.0])
    assert set(ks) == {"ch3a_ks_fncf_emb_eps1"}                             # only what was swept
    ks = ch3a.ks_values(out, out[1.0]["FCF emb"], [1.0, 500.0])
    assert len(ks) == 12 and ks["ch3a_ks_fcf_emb_eps1"] == 1.0             # the same sample
    five = [1.0, 10.0, 20.0, 100.0, 500.0]
    ks.update({f"ch3a_ks_{n}_eps{e:g}": 0.5 for n in ("fcf_emb", "fncf_emb") for e in five[1:4]})
    headers, rows = ch3a.table6_table(ks, five, run)
    assert headers[2:] == ["ε=1", "ε=10", "ε=20", "ε=100", "ε=500"] and len(rows) == 18
    assert all(len(r) == len(headers) for r in rows)
    r = {(row[0], row[1]): row for row in rows}
    assert r[("FCF emb", "ours")][2] == "1.00e+00" and r[("FNCF", "ours")][3] == "—"   # not swept at eps 10
    assert r[("FNCF model", "paper")][2:] == [f"{v:.2e}" for v in ch3a.PAPER_TABLE6["FNCF model"]]
    with pytest.raises(ValueError, match="epsilons"):
        ch3a.table6_table(ks, [1.0, 500.0], run)


def test_ldp_updates_clip_and_noise_each_part(case):
    sens = {"fcf": 100.0, "fncf_items": 0.005, "fncf_params": 0.7}
    upd = ch3a.ldp_updates(case, 1e6, delta=1e-8, sensitivity=sens, seed=0)    # almost no noise: the clipping shows
    params = torch.cat([v.flatten(1) for v in upd["fncf_params"].values()], 1)
    assert (params.norm(dim=1) <= 0.35 * 1.001).all()                          # clipped to Delta_2 / 2
    assert torch.allclose(upd["fncf_items"].flatten(1).norm(dim=1), torch.full((3,), 0.0025), rtol=0.01)
    assert upd["fcf"][~case.mask].abs().max() == 0                              # padding never sent
    with pytest.raises(ValueError, match="sensitivity"):
        ch3a.ldp_updates(case, 1.0, delta=1e-8, sensitivity={"fcf": 1.0})


def test_clip_knowledge_rows():
    a = {1.0: {"FCF emb": torch.tensor([0.5, 0.7]), "FNCF emb": torch.tensor([0.9, 0.9])}}
    b = {1.0: {"FCF emb": torch.tensor([0.5, 0.5]), "FNCF emb": torch.tensor([0.6, 0.6])}}
    rows = ch3a.clip_knowledge_rows(a, b, [1.0])
    assert rows == [["FCF emb", "yes", 0.6], ["FCF emb", "no", 0.5], ["FNCF emb", "yes", 0.9], ["FNCF emb", "no", 0.6]]
    with pytest.raises(ValueError, match="blind"):
        ch3a.clip_knowledge_rows(a, {1.0: {"FCF emb": b[1.0]["FCF emb"]}}, [1.0])


def test_table7_compares_the_papers_pairs(case, run):
    res = ch3a.table3(case, fcf_max_iter=5, fncf_max_iter=3, num_restarts=1, seed=0)
    vals = ch3a.table7_values(res)
    assert set(vals) == {"ch3a_t7_fncf_emb_vs_fncf", "ch3a_t7_fncf_emb_vs_fncf_model",
                         "ch3a_t7_fncf_emb_model_vs_fncf_emb", "ch3a_t7_fncf_model_vs_fncf"}
    assert all(0 <= v <= 1 for v in vals.values())
    headers, rows = ch3a.table7_table(vals, run)
    assert len(rows) == 4 and rows[0][2] == "7.89e-94" and rows[0][4] == "no record yet"


def test_subset_keeps_users_and_trims_padding(case):
    sub = case.subset([2])
    assert len(sub) == 1 and sub.X.shape[1] == 9 and torch.equal(sub.fcf, case.fcf[2:3, :9])
    assert torch.equal(sub.fncf_params["0.weight"], case.fncf_params["0.weight"][2:3])
    with pytest.raises(ValueError, match="users"):
        case.subset([3])
    with pytest.raises(ValueError, match="users"):
        case.subset([])


def test_ldp_sigma_rows():
    rows = ch3a.ldp_sigma_rows([1.0, 100.0], 1e-8)
    assert rows[0][1] == rows[0][2] == round(classical_gaussian_sigma(1.0, 1e-8), 4)   # classical at eps <= 1
    assert rows[1][1] == round(gaussian_sigma(100.0, 1e-8), 4) and rows[1][1] > rows[1][2]
    assert rows[1][3] == "9.8e-01"                                     # the classical sigma is not valid there


def test_linear_case_and_loop_vs_batch(case):
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    J, f0, I = ch3a.linear_case(5, 4, generator=g1)
    assert J.shape == (5, 4) and J.dtype == torch.float64 and f0.abs().sum() == 0
    assert set(I.tolist()) <= {0.0, 1.0}
    assert torch.equal(ch3a.linear_case(5, 4, generator=g2)[0], J)
    with pytest.raises(ValueError, match="m must"):
        ch3a.linear_case(0, 4, generator=g1)
    loop_s, batch_s = ch3a.loop_vs_batch(case, [0, 1], max_iter=3)
    assert loop_s >= 0 and batch_s >= 0
    with pytest.raises(ValueError, match="users"):
        ch3a.loop_vs_batch(case, [], max_iter=3)


def test_plots_refuse_unswept_values():
    auc = {"FCF emb": torch.rand(3), "FNCF emb": torch.rand(3)}
    axs = ch3a.defense_boxplots({1.0: auc}, {0.5: auc}, 1.0, 0.5)
    assert len(axs) == 2
    with pytest.raises(ValueError, match="eps"):
        ch3a.defense_boxplots({1.0: auc}, {0.5: auc}, 2.0, 0.5)
    with pytest.raises(ValueError, match="frac"):
        ch3a.defense_boxplots({1.0: auc}, {0.5: auc}, 1.0, 0.9)
    res = {k: {"auc": torch.rand(3)} for k in ch3a.TABLE3_CONFIGS}
    assert ch3a.table3_boxplot(res) is not None


# --- the FNCF network as a random effect ------------------------------------------------------------

def test_network_draws_case_gives_each_draw_its_own_network(case):
    """Draw k of the stacked case is the case's users under network fncf_init(seed=seeds[k]): its
    parameters and its honest updates are those of that network alone, and no two draws share one."""
    from fedlab.fl.recsys.interactions import fncf_init, fncf_updates

    seeds = ch3a.network_draw_seeds(0, 3)
    assert len(set(seeds)) == 3 and ch3a.network_draw_seeds(0, 2) == seeds[:2]    # draw k whatever the number
    assert ch3a.network_draw_seeds(1, 3) != seeds
    stacked = ch3a.network_draws_case(case, seeds)
    U = len(case)
    assert len(stacked) == 3 * U and torch.equal(stacked.I[U:2 * U], case.I) and torch.equal(stacked.X[2 * U:], case.X)
    for k, s in enumerate(seeds):
        model, theta = fncf_init(case.X.shape[2], seed=s)
        rows = slice(k * U, (k + 1) * U)
        for name, v in theta.items():
            assert all(torch.equal(stacked.theta[name][r], v) for r in range(k * U, (k + 1) * U)), (k, name)
        dX, dT, _ = fncf_updates(model, theta, case.X, case.E, case.I, case.mask, lr=case.fncf_lr, local_steps=1)
        assert torch.allclose(stacked.fncf_items[rows], dX, atol=1e-7), k
        assert all(torch.allclose(stacked.fncf_params[n][rows], dT[n], atol=1e-7) for n in dT), k
    w = stacked.theta["0.weight"]
    assert not torch.equal(w[0], w[U]) and not torch.equal(w[U], w[2 * U]) and not torch.equal(w[0], w[2 * U])
    with pytest.raises(ValueError, match="draw_seeds"):
        ch3a.network_draws_case(case, [])
    with pytest.raises(ValueError, match="one network per user"):
        ch3a.network_draws_case(stacked, seeds)


def test_fncf_network_draws_attack_each_draw_with_its_network(case):
    """The batched attack of all draws at once: where the embedding is estimated, the loss at the truth is ~0
    under every draw only if the attack simulates the network that produced that draw's update (a shared
    or shifted network gives ~1); the draws' results differ (one network reused for all would give the same
    numbers, the users starting from the same points under every draw)."""
    res = ch3a.fncf_network_draws(case, 4, fncf_max_iter=8, num_restarts=1, seed=0)
    assert res["draw_seeds"] == ch3a.network_draw_seeds(0, 4) and res["num_users"] == len(case)
    assert [c for c in res if isinstance(c, tuple)] == ch3a.FNCF_CONFIGS
    for c in ch3a.FNCF_CONFIGS:
        r = res[c]
        assert r["auc"].shape == r["loss"].shape == r["loss_truth"].shape == (4, len(case))
        assert (r["emb_error"] is not None) == c[1] and r["evaluations"] >= 1
        assert len({tuple(row) for row in r["loss_truth"].tolist()}) == 4, c    # every draw its own network
        if c[1]:
            assert r["loss_truth"].max() < 0.05, (c, r["loss_truth"])
    # one draw alone gives that draw's row (the users' results do not depend on the other draws)
    one = ch3a.fncf_network_draws(case.subset([0, 1]), 1, fncf_max_iter=8, num_restarts=1, seed=0)
    c = ("FNCF", True, True)
    assert torch.allclose(one[c]["loss_truth"][0], res[c]["loss_truth"][0, :2], atol=1e-6)
    with pytest.raises(ValueError, match="num_draws"):
        ch3a.fncf_network_draws(case, 0, fncf_max_iter=8, num_restarts=1)
    with pytest.raises(ValueError, match="configs"):
        ch3a.fncf_network_draws(case, 2, fncf_max_iter=8, num_restarts=1, configs=[("FCF", True, False)])
    with pytest.raises(ValueError, match="fncf_max_iter"):
        ch3a.fncf_network_draws(case, 2, fncf_max_iter=0, num_restarts=1)


def test_network_draws_summary_interval_over_draws():
    """The interval is Student's t over the draws' mean AUCs (each the mean over that draw's users), cut to
    [0, 1]; checked against scipy on a hand-made result with more users than draws."""
    from scipy import stats

    g = torch.Generator().manual_seed(5)
    D, U = 5, 7
    auc = 0.6 + 0.4 * torch.rand(D, U, generator=g, dtype=torch.float64)
    loss, truth = torch.rand(D, U, generator=g), torch.rand(D, U, generator=g)
    res = {("FNCF", True, False): {"auc": auc, "loss": loss, "loss_truth": truth, "emb_error": None, "evaluations": 1},
           "draw_seeds": list(range(D)), "num_users": U}
    s = ch3a.network_draws_summary(res)[("FNCF", True, False)]
    per = auc.mean(1).numpy()
    half = stats.t.ppf(0.975, D - 1) * per.std(ddof=1) / D ** 0.5
    assert s["auc"] == pytest.approx(per.mean()) and s["sd"] == pytest.approx(per.std(ddof=1))
    assert s["ci"][0] == pytest.approx(per.mean() - half) and s["ci"][1] == pytest.approx(min(1.0, per.mean() + half))
    assert s["range"] == pytest.approx((per.min(), per.max()))
    assert s["loss"] == pytest.approx(loss.median().item()) and s["loss_truth"] == pytest.approx(truth.median().item())
    assert s["num_draws"] == D and s["num_users"] == U
    # near 1 the interval stops at 1
    near_one = torch.ones(D, U, dtype=torch.float64)
    near_one[-1] = 0.9                                     # mean 0.98, t half-width 0.056: the raw interval passes 1
    top = ch3a.network_draws_summary({("FNCF", True, True): {**res[("FNCF", True, False)], "auc": near_one}})
    assert top[("FNCF", True, True)]["ci"] == pytest.approx((0.98 - stats.t.ppf(0.975, D - 1) * 0.02, 1.0))   # sd/sqrt(D) = 0.02
    headers, rows = ch3a.network_draws_table(ch3a.network_draws_summary(res))
    assert len(rows) == 1 and len(rows[0]) == len(headers) and rows[0][0] == "FNCF emb"
    values = ch3a.network_draws_values(ch3a.network_draws_summary(res))
    assert values["ch3a_draws_auc_fncf_emb"] == round(per.mean(), 3) and values["ch3a_draws_n"] == D
    with pytest.raises(ValueError, match="2 draws"):
        ch3a.network_draws_summary({("FNCF", True, False): {**res[("FNCF", True, False)], "auc": auc[:1]}})
    with pytest.raises(ValueError, match="configuration"):
        ch3a.network_draws_summary({"num_users": 3})


def test_table7_draws_tests_each_network_on_its_own_rows():
    """Table 7 under network draws: draw k's p-value compares the two variants' AUCs of draw k (same users,
    same network), not pooled draws and not another draw's row; checked against scipy's K-S test on a
    hand-made result where draw 1 separates the variants and draw 0 does not."""
    from scipy import stats

    D, U = 3, 6
    g = torch.Generator().manual_seed(2)
    # the draws' AUCs lie in disjoint ranges, so a test that compares rows of two different draws gives 2 / 924
    base = 0.3 + 0.15 * torch.arange(D, dtype=torch.float64)[:, None] + 0.05 * torch.rand(D, U, generator=g, dtype=torch.float64)
    auc = {c: base.clone() for c in ch3a.FNCF_CONFIGS}
    auc[("FNCF", True, False)][1] += 0.4                   # under draw 1 only, FNCF emb is far above the others
    res = {c: {"auc": a, "loss": torch.zeros(D, U), "loss_truth": torch.zeros(D, U), "emb_error": None,
               "evaluations": 1} for c, a in auc.items()}
    res.update(draw_seeds=list(range(D)), num_users=U)
    per = ch3a.table7_draws(res)
    name = "ch3a_t7_fncf_emb_vs_fncf"
    assert set(per) == {"ch3a_t7_fncf_emb_vs_fncf", "ch3a_t7_fncf_emb_vs_fncf_model",
                        "ch3a_t7_fncf_emb_model_vs_fncf_emb", "ch3a_t7_fncf_model_vs_fncf"}
    for k in range(D):
        want = stats.ks_2samp(auc[("FNCF", True, False)][k].numpy(), auc[("FNCF", False, False)][k].numpy()).pvalue
        assert per[name][k] == pytest.approx(want)
    assert per[name][0] == pytest.approx(1.0) and per[name][1] == pytest.approx(2 / 924)   # 2 / C(12, 6): apart
    assert per["ch3a_t7_fncf_model_vs_fncf"] == pytest.approx([1.0] * D)
    vals = ch3a.table7_draws_values(per)
    assert vals[f"{name}_draws_min"] == pytest.approx(2 / 924) and vals[f"{name}_draws_median"] == pytest.approx(1.0)
    headers, rows = ch3a.table7_table({n: 0.5 for n in per}, records.Run("03a_none"), per, draw_users=U)
    assert len(headers) == 6 and "6 users" in headers[4] and rows[0][4] == "median 1.00 (range 2.2e-03–1.00, n = 3 networks)"
    assert len(ch3a.table7_table({n: 0.5 for n in per}, records.Run("03a_none"))[0]) == 5   # without draws
    with pytest.raises(ValueError, match="draws lacks"):
        ch3a.table7_draws({c: r for c, r in res.items() if c != ("FNCF", False, True)})


def test_pvalue_summary_median_and_range_never_an_interval():
    from fedlab._stats import pvalue_summary

    assert pvalue_summary([0.3, 0.002, 0.5]) == "median 0.30 (range 2.0e-03–0.50, n = 3)"
    assert pvalue_summary([0.3, 0.1, 0.5, 0.2], unit="networks") == "median 0.25 (range 0.10–0.50, n = 4 networks)"
    assert pvalue_summary([0.4, 0.4], unit="networks") == "0.40 (all n = 2 networks)"
    assert pvalue_summary([0.4, 0.4]) == "0.40 (all n = 2 seeds)" and pvalue_summary([1e-5]) == "1.0e-05 (n = 1)"
    assert pvalue_summary([0.3, 0.002, 0.5], brief=True) == "0.30"
    for bad in ([], [0.5, float("nan")], [1.5], [-0.1]):
        with pytest.raises(ValueError, match="pvalues"):
            pvalue_summary(bad)


def test_table3_reference_runs_the_codes_settings(case):
    """Table 3 under the reference code's attack settings: every configuration the same budget, five
    independent starts, FCF's squared loss and FNCF without continuation, each the attack_case call with
    exactly those settings (a continuation left on, antithetic starts or FCF's distance loss would change
    the numbers: the budget of 60 evaluations lets the continuation run)."""
    ref = ch3a.table3_reference(case, max_iter=60, seed=3)
    assert list(ref) == ch3a.TABLE3_CONFIGS
    budget = RaifleBudget(max_iter=60, num_restarts=5, antithetic=False)
    for (alg, est, ump), r in ref.items():
        variant = (RaifleVariant(estimate_embedding=est, squared=True) if alg == "FCF"
                   else RaifleVariant(estimate_embedding=est, use_model_params=ump, continuation=None))
        want = ch3a.attack_case(case, alg.lower(), variant=variant, budget=budget, seed=3)
        assert torch.equal(r["auc"], want["auc"]) and torch.equal(r["loss"], want["loss"]), (alg, est, ump)
    # the settings matter: our Table 3 settings give other losses on FNCF emb (continuation) and FCF emb (loss)
    for c, kw in [(("FNCF", True, False), {}), (("FCF", True, False), {})]:
        ours = ch3a.attack_case(case, c[0].lower(), variant=RaifleVariant(estimate_embedding=True), budget=budget,
                                seed=3)
        assert not torch.equal(ours["loss"], ref[c]["loss"]), c
    with pytest.raises(ValueError, match="max_iter"):
        ch3a.table3_reference(case, max_iter=0)


def test_table3_reference_table_compares_the_same_users():
    U = 5
    ours = {c: {"auc": torch.arange(U, dtype=torch.float64) / 10, "loss": torch.arange(U, dtype=torch.float32),
                "loss_truth": torch.zeros(U)} for c in ch3a.TABLE3_CONFIGS}
    ref = {c: {"auc": torch.tensor([0.9, 0.7], dtype=torch.float64), "loss": torch.tensor([2.0, 4.0]),
               "loss_truth": torch.tensor([1.0, 1.0])} for c in ch3a.TABLE3_CONFIGS}
    headers, rows = ch3a.table3_reference_table(ours, ref, [1, 4])
    assert len(rows) == 6 and all(len(r) == len(headers) for r in rows)
    # ours on users 1 and 4 only (AUC 0.1, 0.4; loss 1, 4); torch.median takes the lower middle value; each
    # number under its own header (the page reads them by header)
    assert dict(zip(headers, rows[0])) == {
        "configuration": "FCF", "AUC, our settings": 0.25, "AUC, reference settings": 0.8,
        "loss at the truth (ours)": 0.0, "loss reached (ours)": 1.0,
        "loss at the truth (reference)": 1.0, "loss reached (reference)": 2.0}
    assert ch3a.table3_reference_values(ref)["ch3a_ref_auc_fncf_emb"] == 0.8
    with pytest.raises(ValueError, match="users"):
        ch3a.table3_reference_table(ours, ref, [1, 2, 4])
    with pytest.raises(ValueError, match="configurations"):
        ch3a.table3_reference_table({}, ref, [1, 4])


def test_prune_sweep_attacker_who_knows_the_mask(case):
    """prune_sweep(knows_mask=True): each user's own mask goes with it through attack_case's batches (users
    sorted by item count, the last one shorter): the true answer then scores ~0 for every user, where the
    paper's attacker scores it far above; results=True returns the whole attack results."""
    aware = ch3a.prune_sweep(case, [0.7], fcf_max_iter=4, fncf_max_iter=4, num_restarts=1, seed=0, knows_mask=True,
                             results=True)
    naive = ch3a.prune_sweep(case, [0.7], fcf_max_iter=4, fncf_max_iter=4, num_restarts=1, seed=0, results=True)
    for n in ("FCF emb", "FNCF emb"):
        assert set(aware[0.7][n]) >= {"auc", "loss", "loss_truth"}
        assert aware[0.7][n]["loss_truth"].max() < 0.01 < 0.1 < naive[0.7][n]["loss_truth"].min(), n
    assert set(ch3a.prune_sweep(case, [0.7], fcf_max_iter=2, fncf_max_iter=2, num_restarts=1)[0.7]) == {"FCF emb", "FNCF emb"}
    with pytest.raises(ValueError, match="coord_mask"):
        ch3a.attack_case(case, "fcf", variant=RaifleVariant(), coord_mask=torch.ones(2, 3, 4, dtype=torch.bool),
                         budget=RaifleBudget(max_iter=1))
    with pytest.raises(ValueError, match="use_model_params=False"):
        ch3a.attack_case(case, "fcf", variant=RaifleVariant(use_model_params=True))
    with pytest.raises(ValueError, match="variant"):     # FCF's loss has no ReLU: a continuation would be ignored
        ch3a.attack_case(case, "fcf", variant=RaifleVariant(continuation=(0.3, 0.1)))
    with pytest.raises(TypeError, match="variant"):      # the row of Table 3 is the caller's to name
        ch3a.attack_case(case, "fcf")


def test_prune_curves_and_values_put_both_attackers_on_the_same_users(case):
    """prune_curves: the naive curve over every user, the same attack on the aware attacker's users, and the
    aware curve whose 0 % point is the naive one on those users; prune_aware_values reads each number from
    its own curve and fraction, and the share of items whose FCF row keeps a coordinate falls with pruning."""
    t = lambda *v: torch.tensor(v, dtype=torch.float64)   # noqa: E731
    naive = {0.0: {"FCF emb": t(1.0, 0.9, 0.8), "FNCF emb": t(0.9, 0.9, 0.6)},
             0.5: {"FCF emb": t(0.5, 0.6, 0.1), "FNCF emb": t(0.8, 0.8, 0.5)},
             0.9: {"FCF emb": t(0.5, 0.5, 0.2), "FNCF emb": t(0.7, 0.6, 0.5)},
             0.99: {"FCF emb": t(0.5, 0.5, 0.3), "FNCF emb": t(0.6, 0.5, 0.5)}}
    res = lambda a: {"auc": t(*a), "loss": torch.tensor([0.2, 0.4]), "loss_truth": torch.tensor([0.0, 0.0])}   # noqa: E731
    aware = {f: {"FCF emb": res([0.98, 0.96 - f / 2]), "FNCF emb": res([0.7, 0.9])} for f in (0.5, 0.9, 0.99)}
    curves = ch3a.prune_curves(naive, aware, [0, 2])
    assert curves["naive"]["FCF emb"] == pytest.approx([0.9, 0.4, 0.4, 0.4333333])
    assert curves["naive_same"]["FCF emb"] == pytest.approx([0.9, 0.3, 0.35, 0.4])
    assert curves["aware"]["FCF emb"] == pytest.approx([0.9, 0.845, 0.745, 0.7225])
    vals = ch3a.prune_aware_values(curves, aware, case, budget=50)
    assert vals["ch3a_fcf_prune50_same"] == 0.3 and vals["ch3a_fcf_prune50_aware"] == 0.845
    assert vals["ch3a_prune99_same"] == 0.55 and vals["ch3a_prune99_aware"] == 0.8
    assert vals["ch3a_fcf_prune90_loss"] == "0.2" and "lower bound" in vals["ch3a_fcf_prune90_verdict"]
    assert 0 < vals["ch3a_fcf_rows_kept99"] <= vals["ch3a_fcf_rows_kept90"] <= 1
    with pytest.raises(ValueError, match="fractions"):
        ch3a.prune_curves(naive, {0.5: aware[0.5]}, [0, 2])
    assert ch3a.prune_plot([0.0, 0.5, 0.9, 0.99], curves) is not None
