"""The experiment helpers of chapters 3c and 3d (fedlab.experiments.chapter3c). Its settings (RAIFLE Sec. 4.1 and its
reference code): ranker initialisation, the user's own query order, the reference's first-layer weight
blocks, and the sweeps built on them (the settings comparison, gradient pruning of App. C.4). Then the
figures' and tables' helpers, built from hand-made results, and the grids run on tiny cases."""
import math

import pytest
import torch

from fedlab import records
from fedlab.attacks.interaction_inference import oltr as ro
from fedlab.data.letor import synthetic_letor
from fedlab.experiments import chapter3c as ex
from fedlab.fl import oltr
from fedlab.fl.oltr import OltrUsers, click_probabilities
from fedlab.attacks.interaction_inference.recsys import RaifleBudget
from fedlab.privacy.ldp import LdpGaussian
from fedlab.privacy.defenses import prune_rows

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return synthetic_letor(60, seed=0)


def test_init_rankers_uniform_and_fan_in_share_their_draws():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    u = oltr.init_rankers(4, 10, (6, 3), init="uniform", generator=g1)
    f = oltr.init_rankers(4, 10, (6, 3), init="fan_in", generator=g2)
    assert u.shape == f.shape == (4, oltr.ranker_size(10, (6, 3)))
    assert u.abs().max() <= 1 and u.abs().max() > 0.9                    # U(-1, 1), RAIFLE's gen_params
    sizes = [(10, 6), (6, 3), (3, 1)]
    i = 0
    for a, b in sizes:                                                    # layer k scaled by 1/sqrt(fan_in)
        assert torch.allclose(f[:, i:i + a * b], u[:, i:i + a * b] / math.sqrt(a))
        i += a * b
    with pytest.raises(ValueError, match="init"):
        oltr.init_rankers(2, 3, init="xavier")


def test_users_train_in_an_order_the_server_does_not_know(data):
    shuffled = ro.make_oltr_case(data, 5, 4, (), users=OltrUsers(click_model="informational", lr=1.0), seed=4)
    ordered = ro.make_oltr_case(data, 5, 4, (), users=OltrUsers(click_model="informational", lr=1.0,
                                                                shuffle_queries=False), seed=4)
    # the same users, lists and clicks; only the order of training differs
    assert torch.equal(shuffled.X, ordered.X) and torch.equal(shuffled.I, ordered.I)
    assert torch.equal(ordered.order, torch.arange(4).expand(5, -1))
    assert torch.equal(shuffled.order.sort(1).values, torch.arange(4).expand(5, -1))
    assert not torch.equal(shuffled.order, ordered.order)
    X, I, mask = ro.in_order(shuffled.order, shuffled.X, shuffled.I, shuffled.mask)
    assert torch.allclose(shuffled.update, oltr.local_update(shuffled.theta0, X, I, mask, (), lr=1.0))
    assert not torch.allclose(shuffled.update, ordered.update)           # order matters at lr = 1
    # the loss floor the server faces without the order, and the drift of the ranker within the round
    assert ex.order_mismatch([ordered]).abs().max() < 1e-5
    assert ex.order_mismatch([shuffled]).min() > 1e-3
    one = ro.make_oltr_case(data, 3, 1, (), users=OltrUsers(click_model="navigational", lr=1.0), seed=1)
    assert ex.update_drift([one]).abs().max() < 1e-5                     # one query: a single gradient step
    assert ex.update_drift([ordered]).min() > 0
    with pytest.raises(ValueError, match="order"):
        ro.in_order(shuffled.order[:, :2], shuffled.X)
    with pytest.raises(ValueError, match="cases"):
        ex.update_drift([])


def test_the_known_order_oracle_has_a_zero_loss_at_the_true_clicks(data):
    """With the order told to it, the server's simulation on the true clicks is the user's update: RAIFLE's
    matching loss is 0 at the truth (so the oracle's attack has an exact answer to reach), and it is not 0 when
    the server simulates the display order of a user who trained in another order. The attack runs on the
    oracle's loss and returns one score per displayed document and one AUC per user."""
    from fedlab.fl.oltr import local_update

    case = ro.make_oltr_case(data, 3, 3, (4,), users=OltrUsers(click_model="navigational", lr=1.0), seed=2)
    told = ro.in_order(case.order, case.X, case.I, case.mask)
    at_truth = ro.oltr_matching_loss(local_update(case.theta0, *told, case.hidden, lr=case.lr), case.update)
    assert float(at_truth.max()) < 1e-10, at_truth
    shuffled = (case.order != torch.arange(case.order.shape[1])).any(1)
    display = ro.oltr_matching_loss(local_update(case.theta0, case.X, case.I, case.mask, case.hidden, lr=case.lr),
                                    case.update)
    assert bool(shuffled.any()) and bool((display[shuffled] > 1e-6).all()), (case.order, display)
    res = ro.raifle_oltr(case, known_order=True, budget=RaifleBudget(max_iter=40), seed=0)
    auc = ro.attack_oltr(case, known_order=True, budget=RaifleBudget(max_iter=40), seed=0)
    assert res.scores.shape == (3, 3 * case.X.shape[2]) and auc.shape == (3,)
    assert bool(torch.isfinite(res.loss).all()) and bool((res.loss >= 0).all())


def test_adm_weight_blocks_isolate_queries(data):
    F, H = 8, (4, 2)
    theta = torch.ones(3, oltr.ranker_size(F, H))
    out = ro.adm_weight_blocks(theta, torch.tensor([4, 2, 3]), F, H, span=1)
    W1 = out[:, :F * 4].reshape(3, F, 4)                                 # [user, feature, unit]
    # user 0: 4 queries, 2 features each, one unit per query
    assert torch.equal(W1[0], torch.eye(4).repeat_interleave(2, 0))
    # user 2: 3 queries of features {0,1,2}, {3,4,5}, {6,7}; unit 3 has no block and keeps everything
    assert W1[2, :, 3].eq(1).all() and W1[2, 3:, 0].eq(0).all() and W1[2, :3, 0].eq(1).all()
    assert torch.equal(out[:, F * 4:], theta[:, F * 4:])                  # later layers untouched
    ref = ro.adm_weight_blocks(theta, torch.tensor([4, 2, 3]), F, H)     # the reference's span 2
    assert torch.equal(ref[0, :F * 4].reshape(F, 4)[:, 0], torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]))
    # zeroed weights stay zero in training on ADM features (their gradient is zero)
    case = ro.make_oltr_case(data, 3, 4, (8, 4), users=OltrUsers(click_model="navigational", lr=1.0),
                             adm=ro.Adm(weights=True), seed=0)
    zero = case.theta0 == 0
    assert zero.any() and case.update[zero].abs().max() == 0
    with pytest.raises(ValueError, match="hidden"):
        ro.adm_weight_blocks(torch.ones(1, F), torch.tensor([2]), F, ())
    with pytest.raises(ValueError, match="num_queries"):
        ro.adm_weight_blocks(theta, torch.tensor([5, 1, 1]), F, H)
    with pytest.raises(ValueError, match="span"):
        ro.adm_weight_blocks(theta, torch.tensor([2, 1, 1]), F, H, span=0)
    with pytest.raises(ValueError, match="Adm.weights"):
        ro.make_oltr_case(data, 2, 2, (), users=oltr.OltrUsers(), adm=ro.Adm(weights=True))


def test_settings_grid_table_and_values(data):
    settings = {k: ex.SETTINGS[k] for k in ("before", "paper", "known_order", "weight_blocks")}
    auc, cases = ex.settings_grid(data, {"linear": (), "neural": (4,)}, settings, 2, ["navigational"], 2,
                                  max_iter=3, seed=0)
    assert ("weight_blocks", "linear", True) not in auc and ("weight_blocks", "neural", False) not in auc
    assert all(v.shape == (2,) for v in auc.values()) and set(cases) == set(auc)
    # the oracle and the paper's setting share users, lists and clicks
    assert torch.equal(cases[("paper", "neural", True)][0].I, cases[("known_order", "neural", True)][0].I)
    headers, rows = ex.settings_table(auc, cases, ["linear", "neural"], 2)
    assert len(rows) == len(settings) + 1 and all(len(r) == len(headers) for r in rows)
    assert rows[0][0] == ex.SETTING_LABELS["before"] and rows[0][-1] == 0.0   # display order: no mismatch
    vals = ex.settings_values(auc, cases, ["linear", "neural"])
    assert vals["ch3c_set_before_linear"] == auc[("before", "linear", False)].mean().item()
    assert {"ch3c_drift_paper", "ch3c_mismatch_weight_blocks"} <= set(vals)
    with pytest.raises(ValueError, match="settings"):
        ex.settings_grid(data, {"linear": ()}, {"x": {"momentum": 0.9}}, 2, ["navigational"], 2, max_iter=2)


def test_settings_batched_together_give_each_setting_its_own_result(data):
    """settings_grid attacks the settings of one step size in one batch (the oracle's users told the
    order, the others not): bit for bit one batch per setting, as before."""
    settings = {k: ex.SETTINGS[k] for k in ("before", "paper", "known_order")}
    auc, cases = ex.settings_grid(data, {"linear": ()}, settings, 2, ["navigational"], 2, max_iter=6, seed=1)
    for name, kw in settings.items():
        kw = dict(kw)
        known = kw.pop("known_order", False)
        alone = ro.cat_cases([ro.make_oltr_case(data, 2, 2, (), users=OltrUsers(click_model="navigational", **kw), adm=a,
                                                group=g, seed=1 + 2000 + 0) for g, a in enumerate([False, True])])
        ref = ro.attack_oltr(alone, known_order=known, budget=RaifleBudget(max_iter=6), seed=1)
        assert torch.equal(auc[(name, "linear", False)], ref[:2]) and torch.equal(auc[(name, "linear", True)], ref[2:])
    # a per-user known_order: told users as with True, the others as with False, to float32 round-off (bit for
    # bit on most CPUs; on an AVX-512 AMD EPYC the batch of 4 rows and the batches of 2 differ in the last bit)
    case = cases[("paper", "linear", True)][0]
    both = ro.cat_cases([case, case])
    mixed = ro.raifle_oltr(both, known_order=torch.tensor([True, True, False, False]), budget=RaifleBudget(max_iter=6), seed=1,
                           user_ids=torch.tensor([0, 1, 0, 1]))
    told = ro.raifle_oltr(case, known_order=True, budget=RaifleBudget(max_iter=6), seed=1)
    blind = ro.raifle_oltr(case, known_order=False, budget=RaifleBudget(max_iter=6), seed=1)
    close = dict(rtol=0.0, atol=1e-5 * float(told.scores.abs().max()))     # measured there: 3.9e-6 of 4.1
    assert torch.allclose(mixed.scores[:2], told.scores, **close) and torch.allclose(mixed.scores[2:], blind.scores, **close)
    assert not torch.allclose(told.scores[0], told.scores[1], **close)         # rows swapped would fail
    with pytest.raises(ValueError, match="known_order"):
        ro.raifle_oltr(case, known_order=torch.tensor([True]), budget=RaifleBudget(max_iter=2))


def test_ldp_grids_give_each_click_model_its_own_ldp_grid(data):
    kw = dict(ldp=ex.LdpSweep(epsilons=[1.0, 100.0], delta=1e-8, sensitivity=0.5, random_draws=2), lr=0.1,
              max_iter=5, seed=3)
    both = ex.ldp_grids(data, {"linear": ()}, [(1, [False]), (2, [False, True])], 2, **kw,
                        click_models={"informational": torch.Generator().manual_seed(1),
                                      "navigational": torch.Generator().manual_seed(2)})
    for click, s in (("informational", 1), ("navigational", 2)):
        alone = ex.ldp_grid(data, {"linear": ()}, [(1, [False]), (2, [False, True])], 2, **kw,
                            click_model=click, rand_generator=torch.Generator().manual_seed(s))
        for got, ref in zip(both[click], alone):
            assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref), click
    with pytest.raises(ValueError, match="click_models"):
        ex.ldp_grids(data, {"linear": ()}, [(1, [False])], 2, click_models={}, **kw)


def test_prune_grid_at_zero_is_the_plain_attack(data):
    auc, aware, loss = ex.prune_grid(data, {"linear": ()}, [0.0, 0.5], [(1, False), (2, True)], 3, lr=0.1, max_iter=5,
                                     seed=0)
    assert set(auc) == set(aware) == set(loss) == {("linear", Q, a, f) for Q, a in [(1, False), (2, True)] for f in (0.0, 0.5)}
    base = ro.make_oltr_case(data, 3, 2, (), users=OltrUsers(click_model="informational", lr=0.1), adm=True,
                             seed=0 + 500 + 2)
    assert torch.allclose(auc[("linear", 2, True, 0.0)], ro.attack_oltr(base, budget=RaifleBudget(max_iter=5), seed=0))
    # the paper's attack is bit for bit the single-attacker grid; the mask-aware one is attack_oltr(knows_mask=True)
    # on the same users from the same starts (user ids 0..F U - 1 in both halves of the batch)
    case = ro.cat_cases([base] * 2)
    pruned = torch.cat([prune_rows(base.update, f) for f in (0.0, 0.5)])
    for knows, grid in ((False, auc), (True, aware)):
        ref = ro.attack_oltr(case, pruned, budget=RaifleBudget(max_iter=5), seed=0, knows_mask=knows)
        assert torch.equal(torch.cat([grid[("linear", 2, True, f)] for f in (0.0, 0.5)]), ref), knows
    one = loss[("linear", 1, False, 0.5)]
    assert float(one["aware_truth"].max()) == 0.0 and float(one["naive_truth"].min()) > 0   # one query: exact update
    vals = ex.prune_values(auc, [(1, False), (2, True)], aware=aware, loss=loss)
    assert vals["ch3c_prune_linear_2q_adm_f50"] == auc[("linear", 2, True, 0.5)].mean().item()
    assert vals["ch3c_prune_aware_linear_2q_adm_f50"] == aware[("linear", 2, True, 0.5)].mean().item()
    assert vals["ch3c_prune_loss_naive_truth_linear_1q_f50"] == one["naive_truth"].median().item()
    headers, rows = ex.prune_table(auc, ["linear"], [0.0, 0.5], [(1, False), (2, True)], aware=aware)
    assert rows[1][0] == "50 %" and all(len(r) == len(headers) == 6 for r in rows)
    assert rows[1][2] == round(aware[("linear", 1, False, 0.5)].mean().item(), 3) and headers[2] == "linear, 1 q, knows the mask"
    assert rows[1][3] == round(auc[("linear", 2, True, 0.5)].mean().item(), 3) and headers[3] == "linear, 2 q, ADM"
    assert len(ex.prune_table(auc, ["linear"], [0.0, 0.5], [(1, False), (2, True)])[0]) == 4
    ex.prune_plot(auc, ["linear"], [0.0, 0.5], [(1, False), (2, True)], aware=aware)
    from fedlab.plots import plt
    plt.close("all")
    with pytest.raises(ValueError, match="aware"):
        ex.prune_plot(auc, ["linear"], [0.0, 0.5, 0.9], [(1, False)], aware=aware)
    with pytest.raises(ValueError, match="fractions"):
        ex.prune_grid(data, {"linear": ()}, [1.0], [(1, False)], 2, lr=0.1, max_iter=2)
    with pytest.raises(ValueError, match="configs"):
        ex.prune_grid(data, {"linear": ()}, [0.5], [], 2, lr=0.1, max_iter=2)


def test_ks_rows_for_navigational_clicks(tmp_path):
    eps = [1.0, 10.0, 20.0, 100.0, 500.0]
    keys = [(m, Q, a) for m in ("linear", "neural") for Q, a in [(1, False), (8, False), (8, True)]]
    auc = {(*k, e): torch.linspace(0, 1, 8) for k in keys for e in eps}
    rnd = {k: torch.linspace(0, 1, 8) for k in keys}
    ks_nav = ex.ks_pvalues(auc, rnd, eps, click_model="navigational")
    assert set(ks_nav) == {k for k in ex.PAPER_KS_NAV if k[1] in (1, 8)} and ex.PAPER_KS_NAV[("linear", 1, False)][0] == 2.46e-01
    vals = ex.ks_values(ks_nav, eps, click_model="navigational")
    assert "ch3c_ks_neural_8q_adm_nav_eps500" in vals and len(vals) == 5 * 6
    ks = ex.ks_pvalues(auc, rnd, eps)
    headers, rows = ex.ks_table(ks, eps, records.Run("03_test", folder=tmp_path), ks_nav=ks_nav)
    assert len(rows) == 3 * 12 and rows[-1][0] == "neural, nav, 8 q, ADM"
    with pytest.raises(ValueError, match="click_model"):
        ex.ks_pvalues(auc, rnd, eps, click_model="perfect")


def test_budget_check_runs_each_budget_from_the_same_starts_and_reports_the_truths_loss(data):
    """The check at the reference code's budget (issue 37): every budget starts from the same points, so a larger
    budget never ends at a higher loss; the loss at the true clicks does not depend on the budget; the batch
    never uses more evaluations than its budget; the table has one row per budget."""
    case = ro.make_oltr_case(data, 3, 4, (4,), users=OltrUsers(click_model="informational", lr=0.1), adm=True, seed=2)
    check = ex.budget_check(case, [3, 40], seed=1)
    small, large = check[3], check[40]
    assert small["evaluations"] <= 3 and 3 < large["evaluations"] <= 40
    assert torch.all(large["loss"] <= small["loss"] + 1e-12), (small["loss"], large["loss"])
    for b in (3, 40):      # each budget is the chapter's attack at that budget, from the attack's own starts
        assert torch.equal(check[b]["loss"], ro.raifle_oltr(case, budget=RaifleBudget(max_iter=b), seed=1).loss)
    assert torch.equal(small["loss_truth"], large["loss_truth"]) and torch.all(small["loss_truth"] >= 0)
    assert small["auc"].shape == (3,) and torch.isfinite(large["auc"]).all()
    head, rows = ex.budget_table(check)
    assert len(head) == len(rows[0]) == 6 and [r[0] for r in rows] == [3, 40]
    assert ex.REFERENCE_BUDGET == 1250        # torch.optim.LBFGS(max_iter=1000): max_eval = 1000 * 5 // 4
    # told the order the users trained in, the server's simulation is their training: the truth fits exactly
    # (a truth laid out in the wrong order of queries and documents does not)
    shuffled = ro.make_oltr_case(data, 3, 4, (4,), users=OltrUsers(click_model="informational", lr=0.1,
                                                                   shuffle_queries=True), adm=True, seed=2)
    told = ex.budget_check(shuffled, [1], known_order=True)[1]["loss_truth"]
    assert float(told.max()) < 1e-10, told
    assert float(ex.budget_check(shuffled, [1])[1]["loss_truth"].max()) > 1e-6    # in display order it does not
    for bad in ([], [0], [2.5], [True]):
        with pytest.raises(ValueError, match="budgets"):
            ex.budget_check(case, bad)


# --- the figures', tables' and grids' helpers -----------------------------------------------------

@pytest.fixture
def run(tmp_path):
    return records.Run("03_test", folder=tmp_path)   # no stored record: every paper column says so


RANKERS = {"linear": (), "neural": (4,)}
CLICKS = ["navigational", "informational"]


def _fig5():
    """A hand-made Fig. 5 grid: AUC = 0.5 + Q / 100 (+ 0.2 with ADM, + 0.01 for informational clicks)."""
    return {(m, Q, c, a): torch.full((4,), 0.5 + Q / 100 + 0.2 * a + 0.01 * CLICKS.index(c))
            for m in RANKERS for Q in (1, 16) for c in CLICKS for a in ([False] if Q == 1 else [False, True])}


def test_fig5_summary_table_and_gain(run):
    fig5 = _fig5()
    assert ex.fig5_mean(fig5, "linear", 16, True, CLICKS) == pytest.approx(0.865)
    f5 = ex.fig5_summary(fig5, RANKERS, CLICKS)
    assert f5["single"] == pytest.approx(0.515) and f5["nn16_adm"] == pytest.approx(0.865)
    headers, rows = ex.fig5_table(fig5, CLICKS, run)
    assert len(rows) == len(ex.PAPER_FIG5) and all(len(r) == len(headers) for r in rows)
    assert rows[2][4] == round(f5["lin16"], 3)
    noadm, withadm = ex.adm_gain(fig5, [1, 16], CLICKS)
    assert (withadm - noadm).mean().item() == pytest.approx(0.2)
    rows = ex.click_model_rows(grades=(3,))
    pc, _ = click_probabilities("navigational", 3)
    assert len(rows) == 2 and rows[0][2] == " / ".join(f"{p:g}" for p in pc.tolist())


def test_noisy_values_and_table(run):
    stds = [0.0, 0.01, 0.1]
    noisy = {(m, s): 0.9 - (s or 0) for m in ("linear", "neural") for s in stds}
    noisy.update({("linear", None): 0.7, ("neural", None): 0.6})
    vals = ex.noisy_values(noisy, stds)
    assert vals["ch3c_noisy_neural_std0p01"] == pytest.approx(0.89) and vals["ch3c_noisy_nn0"] == 0.6
    assert vals["ch3c_noisy_linz"] == 0.9 and vals["ch3c_noisy_worst_drop"] == pytest.approx(0.1)
    headers, rows = ex.noisy_table(noisy, RANKERS, stds, run)
    assert rows[0][0] == "0 (exact zeros)" and rows[1][1] == ex.PAPER_FIG11[1e-2] and len(rows[0]) == len(headers)
    with pytest.raises(ValueError, match="noise_stds"):
        ex.noisy_values(noisy, [0.01, 0.1])


def test_ks_and_table8(run):
    eps = [1.0, 10.0, 20.0, 100.0, 500.0]
    auc = {(m, Q, a, e): torch.linspace(0, 1, 8) for m in RANKERS for Q, a in [(1, False), (8, False), (8, True)]
           for e in eps}
    rnd = {(m, Q, a): torch.linspace(0, 1, 8) for m in RANKERS for Q, a in [(1, False), (8, False), (8, True)]}
    ks = ex.ks_pvalues(auc, rnd, eps)                                   # only the rows that were run
    assert set(ks) == {k for k in ex.PAPER_KS if k[1] in (1, 8)} and all(p == [1.0] * 5 for p in ks.values())
    vals = ex.ks_values(ks, eps)
    assert vals["ch3c_ks_neural_8q_adm_eps500"] == "1.0e+00" and len(vals) == 5 * 6
    headers, rows = ex.ks_table(ks, eps, run)
    assert len(rows) == 3 * 6 and all(len(r) == len(headers) for r in rows)
    headers, rows = ex.ks_table(ks, eps, run, queries=(1, 4, 8, 12, 16))
    assert len(rows) == 3 * len(ex.PAPER_KS) and rows[4] == ["linear, inf, 4 q", "ours"] + ["—"] * 5
    with pytest.raises(ValueError, match="epsilons"):
        ex.ks_table(ks, eps[:2], run)
    headers, rows = ex.ks_queries_table(run, 500.0)
    assert len(rows) == 8 and rows[0][:3] == ["linear", "inf", "no"] and rows[0][4] == f"{4.51e-229:.1e} / no record yet"
    with pytest.raises(ValueError, match="epsilon"):
        ex.ks_queries_table(run, 50.0)
    eps_u = eps + [None]
    ndcg = {(m, e): 0.5 + (e or 1000) / 10000 for m in RANKERS for e in eps_u}
    vals = ex.table8_values(ndcg, RANKERS, eps_u)
    assert vals["ch3c_t8_linear_inf"] == vals["ch3c_ndcg_linear_inf"] == 0.6
    assert vals["ch3c_t8_neural_eps1"] == vals["ch3c_ndcg_neural_eps1"] and len(vals) == 2 * 6 + 4
    headers, rows = ex.table8_table(ndcg, RANKERS, eps_u, run)
    assert headers[-1] == "ε=∞" and rows[1][:3] == ["linear", "ours", 0.5] and rows[1][-1] == 0.6
    assert all(len(r) == len(headers) for r in rows)
    with pytest.raises(ValueError, match="epsilons"):
        ex.table8_values(ndcg, RANKERS, [1.0])
    with pytest.raises(ValueError, match="epsilons"):
        ex.table8_table(ndcg, RANKERS, [1.0, None], run)


def test_grids_run_every_ranker(data):
    auc, cases = ex.fig5_grid(data, {"linear": ()}, [1, 2], ["navigational"], 2, lr=1.0, max_iter=2)
    assert set(auc) == {("linear", 1, "navigational", False), ("linear", 2, "navigational", False),
                        ("linear", 2, "navigational", True)} and set(cases) == set(auc)
    noisy, noisy_cases = ex.noisy_adm_grid(data, {"linear": ()}, [0.0], 2, 2, lr=1.0, max_iter=2)
    assert set(noisy) == {("linear", None), ("linear", 0.0)} and all(isinstance(v, float) for v in noisy.values())
    flags = ex.flag_rounds([noisy_cases[("linear", None)], noisy_cases[("linear", 0.0)]])
    assert flags.tolist() == [False, False, True, True]                   # exact-zero ADM leaves dead features
    _, nav_cases = ex.noisy_adm_grid(data, {"linear": ()}, [0.0], 2, 2, lr=1.0, max_iter=2, click_model="navigational")
    nav = ex.make_oltr_case(data, 2, 2, (), users=OltrUsers(click_model="navigational", lr=1.0), adm=False, group=0,
                            seed=50)
    assert torch.equal(nav_cases[("linear", None)].I, nav.I)             # the click model reaches the users
    ldp_auc, rnd = ex.ldp_grid(data, {"linear": ()}, [(1, [False])], 2,
                               ldp=ex.LdpSweep(epsilons=[1.0], delta=1e-8, sensitivity=0.5, random_draws=2), lr=1.0,
                               max_iter=2, rand_generator=torch.Generator().manual_seed(0))
    assert set(ldp_auc) == {("linear", 1, False, 1.0)} and rnd[("linear", 1, False)].shape == (4,)
    with pytest.raises(ValueError, match="rankers"):
        ex.fig5_grid(data, {}, [1], ["navigational"], 2, lr=1.0, max_iter=2)
    with pytest.raises(ValueError, match="cases"):
        ex.flag_rounds([])


def test_the_case_builders_give_the_users_the_sweeps_attack(data):
    """Chapter 3d checks the data validation on chapter 3c's users, rebuilt without the attack: fig5_cases,
    noisy_adm_cases and sa_bypass_case give the very cases fig5_grid, noisy_adm_grid and sa_bypass_experiment
    attack (same lists, features, clicks and updates)."""
    rankers = {"linear": (), "tiny": (3,)}
    fields = ("theta0", "X", "mask", "I", "update", "group", "order")

    def same(a, b):
        return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)

    _, swept = ex.fig5_grid(data, rankers, [1, 2], ["navigational", "informational"], 3, lr=0.1, max_iter=2, seed=4)
    built = ex.fig5_cases(data, rankers, [1, 2], ["navigational", "informational"], 3, lr=0.1, seed=4)
    assert list(built) == list(swept) and all(same(built[k], swept[k]) for k in swept)
    _, swept = ex.noisy_adm_grid(data, rankers, [0.0, 0.1], 3, 2, lr=0.1, max_iter=2, seed=4)
    built = ex.noisy_adm_cases(data, rankers, [0.0, 0.1], 3, 2, lr=0.1, seed=4)
    assert list(built) == list(swept) and all(same(built[k], swept[k]) for k in swept)
    D = torch.arange(data.num_features) < data.num_features // 2
    run = ex.sa_bypass_experiment(data, (), 4, D, lr=0.1, max_iter=2, generator=torch.Generator().manual_seed(5),
                                  seed=4)
    assert same(ex.sa_bypass_case(data, (), 4, D, lr=0.1, generator=torch.Generator().manual_seed(5), seed=4),
                run["case"])
    assert ex.flag_rounds([run["case"]]).all()          # every user of the bypass has zeroed features


def test_the_two_pages_tables_of_record_labels_split_the_chapters_numbers():
    assert not set(ex.RECORD_LABELS) & set(ex.DEFENSE_RECORD_LABELS)
    assert {"ch3c_fig5_single", "ch3c_sa_err", "ch3c_total_s"} <= set(ex.RECORD_LABELS)
    assert {"ch3c_ldp_nn_adm", "ch3c_prune_min90", "ch3c_ndcg_linear_inf", "ch3d_total_s"} <= set(ex.DEFENSE_RECORD_LABELS)
    # the stored side of those tables: AUCs and NDCG cut to [0, 1], the K-S p-value as a median and range
    assert ex.DEFENSE_RECORD_KINDS["ch3c_ks_lin1_eps10"] == "p" and ex.DEFENSE_RECORD_KINDS["ch3c_ndcg_linear_inf"] == "rate"
    assert ex.RECORD_KINDS["ch3c_fig5_single"] == "rate" and "ch3c_sa_err" not in ex.RECORD_KINDS
    from fedlab import records
    rows = records.compare_rows({}, records.load("03d_raifle_oltr_defenses", "paper"), ex.DEFENSE_RECORD_LABELS,
                                kinds=ex.DEFENSE_RECORD_KINDS)                 # on the stored record
    stored = {label: shown for label, _, shown in rows}
    assert stored["LDP ε=10: K-S p-value"].startswith("median ") and "±" not in stored["LDP ε=10: K-S p-value"]
    for name in ex.DEFENSE_RECORD_KINDS:
        shown = stored[ex.DEFENSE_RECORD_LABELS[name]]
        if ex.DEFENSE_RECORD_KINDS[name] == "rate" and "[" in shown:
            lo, hi = (float(x) for x in shown.split("[")[1].split("]")[0].split(", "))
            assert 0.0 <= lo <= hi <= 1.0, (name, shown)


def test_pir_and_utility_grids(data):
    pir = ex.pir_grid(data, {"linear": ()}, 6, epsilons=[None], lr=1.0, seed=0)
    assert pir == {("linear", None): (1.0, 0.0, 1.0)}                    # exact without noise (Sec. 3.4.3)
    train, test = data.split(0.2, seed=0)
    ndcg = ex.utility_grid(train, test, {"linear": ()}, [None, 10.0], num_rounds=2, clients_per_round=4,
                           users=OltrUsers(lr=1.0), delta=1e-8, sensitivity=0.5)
    assert set(ndcg) == {("linear", None), ("linear", 10.0)} and all(0.0 <= v <= 1.0 for v in ndcg.values())
    # utility_grid is federated_oltr per (ranker, epsilon), with the LDP mechanism as one settings object
    ref = oltr.federated_oltr(train, test, (), users=OltrUsers(lr=1.0), num_rounds=2, clients_per_round=4,
                              ldp=LdpGaussian(10.0, 1e-8, 0.5), eval_every=2)
    assert ndcg[("linear", 10.0)] == ref.ndcg[-1]
    with pytest.raises(ValueError, match="clip_norm"):
        oltr.federated_oltr(train, test, (), ldp=LdpGaussian(10.0), clip_norm=1.0, num_rounds=1)
    with pytest.raises(ValueError, match="ldp must be"):
        oltr.federated_oltr(train, test, (), ldp=10.0, num_rounds=1)


def test_ldp_boxplot_refuses_unswept_eps():
    auc = {(m, Q, a, 1.0): torch.rand(3) for m in RANKERS for Q, a in [(1, False), (8, False), (8, True)]}
    assert ex.ldp_boxplot(auc, RANKERS, 8, 1.0) is not None
    with pytest.raises(ValueError, match="eps"):
        ex.ldp_boxplot(auc, RANKERS, 8, 10.0)
    assert set(ex.RECORD_LABELS) >= {"ch3c_fig5_single", "ch3c_total_s"}
