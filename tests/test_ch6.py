"""Chapters 6 and 6b's bookkeeping (fedlab.experiments.chapter6): the chapters' attacks on Flower transcripts.
The tests that run Flower apps use the in-process engine (the same ServerApp, ClientApp and Recorder
as the Ray engine, without Ray's start-up)."""
import numpy as np
import pytest
import torch

from fedlab import fl, models, records
from fedlab.attacks import membership as mia
from fedlab.experiments import chapter6 as ex


def test_membership_federation_is_chapter_1c_setting():
    fed = ex.membership_federation(0, num_clients=4, n_per_client=5)
    assert fed.clients.X.shape == (4, 5, 64) and fed.cand_X.shape == (4, 10, 64) and fed.cand_y.shape == (4, 10)
    assert fed.is_member.tolist() == [1] * 5 + [0] * 5
    assert torch.equal(fed.cand_X[:, :5], fed.clients.X)          # members first: the client's own data
    members = {tuple(x.tolist()) for x in fed.clients.X.reshape(-1, 64)}
    assert not any(tuple(x.tolist()) in members for x in fed.cand_X[:, 5:].reshape(-1, 64))   # outsiders are not
    with pytest.raises(ValueError, match="n_per_client"):
        ex.membership_federation(0, n_per_client=0)
    with pytest.raises(ValueError, match="outsiders"):
        ex.membership_federation(0, num_clients=100, n_per_client=20)


def test_max_abs_difference():
    a = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    b = {"w": torch.zeros(2, 3), "b": torch.tensor([0.0, -0.5, 0.25])}
    assert ex.max_abs_difference(a, b) == 0.5 and ex.max_abs_difference(a, a) == 0.0
    with pytest.raises(ValueError, match="same parameters"):
        ex.max_abs_difference(a, {"w": a["w"]})
    with pytest.raises(ValueError, match="shape"):
        ex.max_abs_difference(a, {"w": torch.zeros(3, 2), "b": a["b"]})


def test_permutation_floor_matches_the_null_distribution_of_the_auc():
    """One client, 20 + 20 candidates: under shuffled labels the AUC (Mann-Whitney) has mean 1/2 and
    variance (n1 + n2 + 1) / (12 n1 n2), so its 95 % quantile is about 0.5 + 1.645 * 0.0924 = 0.652.
    Averaging over K clients shrinks the spread by sqrt(K)."""
    scores = torch.randn(1, 40, generator=torch.Generator().manual_seed(0))
    is_member = np.r_[np.ones(20), np.zeros(20)]
    one = ex.permutation_floor(scores, is_member, num_permutations=4000, seed=1)
    assert 0.63 < one < 0.675, one
    many = ex.permutation_floor(torch.randn(10, 40), is_member, num_permutations=2000, seed=1)
    assert 0.53 < many < 0.56, many                       # 0.5 + 1.645 * 0.0924 / sqrt(10) = 0.548
    assert ex.permutation_floor(scores, is_member, num_permutations=50, seed=3) == \
        ex.permutation_floor(scores, is_member, num_permutations=50, seed=3)
    with pytest.raises(ValueError, match="scores"):
        ex.permutation_floor(torch.randn(2, 39), is_member)
    with pytest.raises(ValueError, match="quantile"):
        ex.permutation_floor(scores, is_member, quantile=1.0)
    with pytest.raises(ValueError, match="num_permutations"):
        ex.permutation_floor(scores, is_member, num_permutations=0)


def test_grey_psnr():
    X = torch.zeros(2, 1, 8, 8)
    X[1] = 1.0
    assert np.allclose(ex.grey_psnr(X), 10 * np.log10(4.0))     # MSE 0.25 either way: 6.02 dB


def test_compare_markdown_quotes_only_names_the_records_hold():
    for stem, table in (("01a_gradient_leakage", ex.COMPARE_1A), ("01c_membership_inference", ex.COMPARE_1B)):
        rec = records.load(stem)
        if rec is None:
            pytest.skip(f"no stored record of {stem}")
        assert set(table) <= set(rec["values"]), (stem, set(table) - set(rec["values"]))
    defenses = records.load("01d_membership_defenses")   # chapter 1c split in two: its attacks' keys stay in 01c
    assert defenses is None or not set(ex.COMPARE_1B) & set(defenses["values"])
    ours = {"idlg_acc": 1.0, "dlg_label_acc": 0.875, "dlg_success": 0.75, "dlg_median_psnr": 50.0, "mia_auc": 0.7}
    text = ex.compare_markdown(ours, lambda n, d: f"1a:{n}:{d}", lambda n, d: f"1c:{n}:{d}", settings={"1a": "fewer digits"})
    assert "| 1a | iDLG label accuracy | 1.000 | 1a:idlg_acc:3 |" in text and "1c:auc_last:3" in text
    assert "| DLG median PSNR (dB) | 50.0 | 1a:dlg_median_psnr:1 |" in text
    assert text.endswith("**1a:** fewer digits")


def test_defense_rows_checks_names():
    att = {"none": {"idlg_acc": 1.0, "idlg_median_psnr": 90.0, "dlg_median_psnr": 50.0, "dlg_success": 0.5}}
    mem = {"none": {"mia_auc": 0.7, "global_auc": 0.6}}
    rows = ex.defense_rows(att, mem, {"none": 0.9})
    assert rows["none"]["mia_auc"] == 0.7 and "| none | 1.000 | 90.0 | 50.0 | 0.500 | 0.700 | 0.600 | 0.900 |" in \
        ex.defense_markdown(rows)
    with pytest.raises(ValueError, match="same defenses"):
        ex.defense_rows(att, mem, {"other": 0.9})


def test_least_squares_clients_are_chapter_4s():
    """Chapter 4's first cell: client k holds 40 + 20 k records with mean shift 0.3 k and its own optimum."""
    from fedlab.attacks import model_reconstruction as mr

    clients = ex.least_squares_clients(0)
    assert [len(X) for X, _ in clients] == [40, 60, 80, 100, 120] and clients[0][0].dtype == torch.float64
    assert abs(float(clients[4][0].mean()) - 1.2) < 0.2
    fit = [float((X @ mr.local_optimum(X, y) - y).pow(2).mean()) for X, y in clients]
    assert max(fit) < 0.02                                       # y = X theta_k + 0.1 noise
    assert torch.equal(ex.least_squares_clients(3)[1][0], ex.least_squares_clients(3)[1][0])
    with pytest.raises(ValueError, match="num_clients"):
        ex.least_squares_clients(0, num_clients=0)


def test_imprint_clients_is_chapter_1b_setting():
    clients, model_fn, X = ex.imprint_clients(0, num_clients=2, batch_size=3, num_bins=16)
    assert X.shape == (6, 64) and torch.equal(clients[1][0], X[3:]) and float(X.max()) <= 1.0
    m = model_fn()
    assert m.imprint.weight.shape == (16, 64) and m.imprint.weight.dtype == torch.float64
    assert torch.equal(m.imprint.weight, model_fn().imprint.weight)                  # the same model every call
    assert (m.imprint.bias[1:] < m.imprint.bias[:-1]).all()                          # cut-offs increasing
    with pytest.raises(ValueError, match="batch_size"):
        ex.imprint_clients(0, batch_size=0)
    with pytest.raises(ValueError, match="exceeds"):
        ex.imprint_clients(0, num_clients=100, batch_size=20)


# ------------------------------------------------------------------------------------------------
# on Flower transcripts (the `flower` extra)
# ------------------------------------------------------------------------------------------------
def _flower():
    pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]') is "
                                       "needed for the transcript tests of tests/test_ch6.py")
    from fedlab import flower

    return flower


def test_reply_membership_on_a_transcript_equals_chapter_1c_on_fedavg():
    flower = _flower()
    fed = ex.membership_federation(1, num_clients=4, n_per_client=20)
    mlp = lambda: models.mlp(64, (32,), 10, seed=1)  # noqa: E731
    args = dict(num_rounds=5, local=fl.LocalTraining(lr=0.3, local_epochs=5, batch_size=10), seed=1)
    res = flower.run(mlp, fed.clients, engine=flower.Engine("local"), **args)
    rec = mia.SnapshotRecorder()
    ref = fl.fedavg(mlp(), fed.clients, callback=rec, **args)
    assert ex.max_abs_difference(res.params, ref.params) <= 1e-6
    drift = ex.round_differences(res.transcript, rec.global_models)
    assert drift["end_to_end"].shape == (5,) and drift["end_to_end"].max() <= 1e-6 and drift["aggregation"].max() <= 1e-6
    with pytest.raises(ValueError, match="rounds"):
        ex.round_differences(res.transcript, rec.global_models[:4])
    out = ex.reply_membership(mlp, res.transcript, fed, seed=0)
    direct = mia.client_signals(mlp(), rec, fed.cand_X, fed.cand_y)
    assert out["auc"].shape == (4,)
    assert out["mia_auc"] == pytest.approx(mia.attack_auc(direct, fed.is_member), abs=1e-9)
    released = torch.stack([mia.snapshot_signals(mlp(), rec.global_models, fed.cand_X[k], fed.cand_y[k]) for k in range(4)])
    assert out["global_auc"] == pytest.approx(mia.attack_auc(released, fed.is_member), abs=1e-9)
    assert out["mia_auc"] > out["floor"] and 0.5 < out["floor"] < 0.7
    md = ex.transcript_markdown(res.transcript, rows=3)
    assert md.count("\n| 1 |") == 3 and "20 train replies in 5 rounds, 6 global models" in md


@pytest.mark.slow
def test_fedsgd_attack_and_the_dp_wrappers():
    """iDLG on FedSGD replies: labels exact; server-side DP leaves the recorded replies (and so the attack)
    unchanged; client-side DP sends every update clipped to C, and the label rule survives the rescaling."""
    flower = _flower()
    victims, lenet = ex.fedsgd_clients(0, 3)
    assert len(victims) == 3 and victims[0][0].shape == (1, 1, 8, 8)
    args = dict(num_rounds=1, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=None), seed=0, engine=flower.Engine("local"))
    base = flower.run(lenet, victims, **args).transcript
    a = ex.fedsgd_attack(lenet, base, victims, max_iter=30, seed=0)
    assert a["idlg_acc"] == 1.0 and a["idlg_psnr"].shape == (3,) and a["x_idlg"].shape == (3, 1, 8, 8)
    assert np.all(a["grey_psnr"] < 10) and np.all(a["norms"] > 0.1)
    srv = flower.run(lenet, victims, aggregation=flower.FixedClippingDP("server", noise_multiplier=1.0, clipping_norm=0.05), **args).transcript
    s = ex.fedsgd_attack(lenet, srv, victims, max_iter=30, seed=0)
    assert np.array_equal(s["idlg_psnr"], a["idlg_psnr"]) and np.array_equal(s["norms"], a["norms"])
    cli = flower.run(lenet, victims, aggregation=flower.FixedClippingDP("client", noise_multiplier=1.0, clipping_norm=0.05), **args).transcript
    assert np.allclose(list(ex.update_norms(cli).values()), 0.05, rtol=1e-3)   # every reply clipped to C
    c = ex.fedsgd_attack(lenet, cli, victims, max_iter=30, seed=0)
    assert c["idlg_acc"] == 1.0
    with pytest.raises(ValueError, match="num_clients"):
        ex.fedsgd_clients(0, 0)


def test_chapter_6b_picks_its_target_from_chapter_6s_idlg():
    """Chapter 6b runs iDLG alone on the plain FedSGD round (no DLG) to pick the lying server's target and quote
    its PSNR: the same PSNRs as chapter 6's :func:`fedsgd_attack`, so 6b's target is the unsplit chapter's."""
    flower = _flower()
    from fedlab.flower import attacks as fa

    victims, lenet = ex.fedsgd_clients(1, 3)
    args = dict(num_rounds=1, local=fl.LocalTraining(lr=0.1, batch_size=None), seed=1, engine=flower.Engine("local"))
    base = flower.run(lenet, victims, **args).transcript
    a = ex.fedsgd_attack(lenet, base, victims, max_iter=20, seed=1)
    from fedlab.attacks import AttackBudget

    alone = fa.invert_gradients(lenet, base, input_shape=(1, 8, 8), num_classes=10,
                                budget=AttackBudget(max_iter=20, lr=1.0),
                                x_true={k: X for k, (X, _) in enumerate(victims)}, seed=1).psnr[:, 0]
    assert np.array_equal(alone, a["idlg_psnr"]), (alone, a["idlg_psnr"])


def test_eavesdrop_logistic_compares_the_two_runs():
    """Algorithm 3 on a Flower transcript of chapter 4b's LEAF federation and on fedavg's pairs: the same pairs up
    to float rounding, decoded models 1 % of ||theta_c*|| apart at most (3.7e-3 measured at seeds 0-11 with 250
    Adam steps; fewer steps here)."""
    flower = _flower()
    from fedlab.attacks import model_reconstruction as mr
    from fedlab.data.leaf import make_leaf_synthetic

    leaf = make_leaf_synthetic(seed=0)[:3]
    args = dict(num_rounds=12, seed=0, local=fl.LocalTraining(lr=0.01, batch_size=256, local_steps=1, weight_decay=0.01,
                                                            loss_fn=mr.logistic_loss))
    model = lambda: mr.linear_model(leaf[0].X.shape[1], bias=True, dtype=torch.float32, seed=0)  # noqa: E731
    pairs = [(c.X.float(), c.y) for c in leaf]
    T = flower.run(model, pairs, engine=flower.Engine("local"), **args).transcript
    _, spy = mr.run_eavesdropped_fedavg(model(), pairs, **args)
    out = ex.eavesdrop_logistic(T, spy, leaf, weight_decay=0.01, fit_max_iter=60, decode_max_iter=60, hidden=64)
    assert out["num_obs"] == 12 and out["decoded"].shape == (3,) and out["pairs_diff"] < 1e-6
    assert out["gap"].max() < 0.01 and np.all(out["oracle"] > 0.8), out


def test_item_federation_is_chapter_2s_model_and_data():
    from fedlab.fl.recsys import ratings as rec

    fed = ex.item_federation(2, cohort_size=3, num_users=30, num_rounds=3)
    I, k, N = ex.CHAPTER2["num_items"], ex.CHAPTER2["dim"], ex.CHAPTER2["num_rated"]
    assert len(fed.clients) == 3 and len(set(fed.users.tolist())) == 3 and fed.lr == ex.CHAPTER2["lr"] * N
    X, y = fed.clients[1]
    u = fed.users[1]
    assert X.shape == (N, I + k) and X.dtype == torch.float64 and torch.equal(y, fed.data.y[u])
    model = fed.model_fn()
    scores = model(X)                                                     # u_c . v_i for each rated item i
    want = (fed.honest.item_vectors[fed.data.items[u]] * fed.honest.user_vectors[u]).sum(-1)
    assert torch.allclose(scores, want, atol=1e-12)
    loss = fed.loss_fn(scores, y)
    assert torch.allclose(loss, rec.margin_loss(y * want, "log"))
    assert fed.clipping_range >= float(fed.honest.item_vectors.abs().max()) + 1
    with pytest.raises(ValueError, match="cohort_size"):
        ex.item_federation(0, cohort_size=1, num_users=30, num_rounds=1)
    with pytest.raises(ValueError, match="item_vectors"):
        ex.ItemScores(torch.zeros(3))


def test_item_sums_check_refuses_another_cohort_and_reports_the_table():
    from fedlab.flower.attacks import ItemSums

    fed = ex.item_federation(0, cohort_size=2, num_users=20, num_rounds=2)
    I, k = ex.CHAPTER2["num_items"], ex.CHAPTER2["dim"]
    wrong = ItemSums(torch.zeros(I, k, dtype=torch.float64), 0.0, torch.zeros(I, dtype=torch.bool), [0, 1, 2], [50] * 3)
    with pytest.raises(ValueError, match="sums must be of the federation's 2 clients"):
        ex.item_sums_check(fed, wrong)
    none = ItemSums(torch.zeros(I, k, dtype=torch.float64), 1e-5, torch.zeros(I, dtype=torch.bool), [0, 1], [50] * 2)
    chk = ex.item_sums_check(fed, none)                    # a server that read nothing exposes nobody
    assert chk["readable"] == chk["single_readable"] == 0 and chk["exposed"] == 0.0 and chk["touched"] > 0
    md = str(ex.item_sums_markdown(chk))
    assert "| items with one contributor |" in md and f"| {chk['touched']} | 0 above the rounding bound |" in md


def test_secagg_outcome_summarises_completed_refused_and_impossible_rounds():
    """The malicious-server section's bookkeeping: a completed run, a round that stopped (an error carrying a
    SecAggLog) and an attack that cannot be mounted, summarised and tabulated; errors without a log pass."""
    pytest.importorskip("flwr")
    from fedlab import flower
    from fedlab.flower import attacks as fa

    victims, lenet = ex.fedsgd_clients(0, 4)
    args = dict(num_rounds=1, local=fl.LocalTraining(lr=0.1, batch_size=None), seed=0, engine=flower.Engine("local"))
    lie = ex.secagg_outcome(lambda: flower.run(lenet, victims, aggregation=flower.SecAgg(attack=fa.FalseDropout(1)), **args))
    assert lie["completed"] and lie["exposed"] == [1] and lie["key_shares"] >= 2 and lie["messages"] == 16
    assert ex.exposed_model(lie, 1).keys() == lie["run"].params.keys()
    with pytest.raises(ValueError, match="not exposed"):
        ex.exposed_model(lie, 0)
    refused = ex.secagg_outcome(lambda: flower.run(lenet, victims, aggregation=flower.SecAgg(
        attack=fa.FalseDropout(1), consistency=True, reconstruction_threshold=0.75), **args))
    assert not refused["completed"] and refused["stage"] == "unmask" and refused["key_shares"] == 0
    impossible = ex.secagg_outcome(lambda: flower.run(lenet, victims, aggregation=flower.SecAgg(
        attack=fa.SplitView(1), consistency=True, reconstruction_threshold=0.75), **args))
    assert impossible["stage"] == "none" and "n >= 2t" in impossible["reason"]
    table = ex.malicious_markdown({"(a)": {ex.MALICIOUS_COLUMNS[0]: lie, ex.MALICIOUS_COLUMNS[2]: refused}},
                                  {"(a)": "note"})
    assert f"**model of client 1 unmasked**; {lie['key_shares']} key shares of survivors; note" in table
    assert "not run" in table and "refused in `unmask`" in table
    with pytest.raises(RuntimeError, match="boom"):
        ex.secagg_outcome(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(ValueError, match="returned no model"):
        ex.survivor_average(lie["run"].transcript, [0])      # a SecAgg+ transcript holds no train reply


def test_round_difference_plot_says_where_an_exact_zero_is_drawn():
    """A difference of exactly 0 cannot sit on the log axis: it is drawn at 1e-9, and the legend and a note say
    so (the Ray engine's run equals fedavg exactly since RayGrid; the plot read as a 1e-9 difference)."""
    import matplotlib.pyplot as plt

    zeros = {"end_to_end": np.zeros(3), "aggregation": np.zeros(3)}
    ax = ex.plot_round_differences(zeros)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sum("exactly 0 at every round" in t for t in labels) == 2
    assert "exactly 0 is drawn at 1e-9" in ax.get_legend().get_title().get_text()
    plt.close("all")
    ax = ex.plot_round_differences({"end_to_end": np.array([1e-8, 2e-8]), "aggregation": np.array([1e-9, 3e-9])})
    assert not any("exactly 0" in t.get_text() for t in ax.get_legend().get_texts())
    assert "exactly 0" not in ax.get_legend().get_title().get_text()
    plt.close("all")
