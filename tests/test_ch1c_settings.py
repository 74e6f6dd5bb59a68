"""Chapter 1c's settings that can answer its questions: the window attack read at an
early round (a federation that has not converged) and at the last, the two factors of the last-layer
gradient norm (white-box vs black-box), and the membership attack on Centaur's personalised models on iid
and label-skewed clients (fedlab.experiments.chapter1c)."""
import numpy as np
import pytest
import torch
from torch import nn

from fedlab import fl, models
from fedlab.attacks import membership as mia
from fedlab.experiments import chapter1c as ch1c
from fedlab.fl.dp_fedavg import DPSettings
from fedlab.fl import personalization as pers

torch.set_num_threads(1)
IS_MEMBER = np.r_[np.ones(4), np.zeros(4)]


# ------------------------------------------------------------------ window read at a round
def _loss(T=12, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 1.0 + 0.1 * torch.rand(K, T, 8, generator=g)


def test_window_settings_reads_only_the_rounds_up_to_t_and_exactly_the_window():
    L = _loss()
    sep = torch.tensor(1 - IS_MEMBER, dtype=L.dtype)          # members low, non-members high
    L[:, 4] += 5 * sep                                          # round 5 (the last at t = 5) separates perfectly
    L[:, 5:] -= 50 * sep                                        # every later round is reversed: must not be read
    L[:, 0] -= 50 * sep                                         # round 1, just outside the window 4 at t = 5
    res = ch1c.window_settings(L, IS_MEMBER, {"early": 5, "late": 12}, windows=(1, 4))
    e = res["early"]
    assert e["round"] == 5 and e["auc"][1] == 1.0 and e["auc"][4] == 1.0, e["auc"]
    assert res["late"]["auc"][1] == 0.0                         # the late rounds are the reversed ones
    # the window of 4 at t = 5 is rounds 2..5: including round 1 would reverse the ranking
    assert mia.attack_auc(L[:, :5], IS_MEMBER, 5) == 0.0
    assert e["auc"][4] == mia.attack_auc(L[:, 1:5], IS_MEMBER, 4)
    assert e["tpr"][1] == mia.attack_tpr_at_fpr(L[:, :5], IS_MEMBER, list(ch1c.LOW_FPR), 1)


def test_window_settings_movement_spread_and_rank_correlation():
    base = torch.linspace(0, 1, 8).repeat(2, 1)                 # [K, r]
    L = base[:, None, :].repeat(1, 10, 1).clone()               # the same loss every round
    res = ch1c.window_settings(L, IS_MEMBER, {"flat": 10}, windows=(1, 5))["flat"]
    assert res["movement"] == 0.0 and res["rank_corr"] == pytest.approx(1.0)
    assert res["spread"] == pytest.approx(float(base[0].double().std()))
    assert res["auc"][1] == res["auc"][5]
    # a last round that reverses the order of the records: movement by hand, rank correlation -1
    L[:, -1] = 1 - base
    res = ch1c.window_settings(L, IS_MEMBER, {"t": 10}, windows=(1, 5))["t"]
    avg = (4 * base + (1 - base)) / 5
    assert res["movement"] == pytest.approx(float(((1 - base) - avg).abs().mean()))
    assert res["rank_corr"] == pytest.approx(-1.0)
    assert res["ratio"] == pytest.approx(res["movement"] / res["spread"])


def test_window_settings_values_and_table():
    res = ch1c.window_settings(_loss(), IS_MEMBER, {"early": 10, "conv": 12}, windows=(1, 10))
    v = ch1c.window_settings_values(res)
    for s in ("early", "conv"):
        assert v[f"ws_{s}_dauc"] == pytest.approx(res[s]["auc"][10] - res[s]["auc"][1])
        assert v[f"ws_{s}_tpr1_w10"] == res[s]["tpr"][10][1] and v[f"ws_{s}_tpr01_w1"] == res[s]["tpr"][1][0]
        assert v[f"ws_{s}_rho"] == res[s]["rank_corr"]
    assert v["ws_early_round"] == 10 and v["ws_conv_round"] == 12
    table = ch1c.window_settings_table(res, {"early": "not converged"}, lambda k: f"<{k}>")
    assert "not converged" in str(table) and "<ws_conv_dauc>" in str(table)


@pytest.mark.parametrize("kwargs, match", [
    (dict(loss=torch.zeros(3, 8), at_rounds={"a": 1}), "loss"),
    (dict(loss=_loss(), at_rounds={}), "at_rounds"),
    (dict(loss=_loss(), at_rounds={"a": 13}), "at_rounds"),
    (dict(loss=_loss(), at_rounds={"a": 5}, windows=(1, 10)), "at_rounds"),
    (dict(loss=_loss(), at_rounds={"a": 5}, windows=(0, 2)), "windows"),
])
def test_window_settings_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ch1c.window_settings(is_member=IS_MEMBER, **kwargs)
    with pytest.raises(ValueError, match="window 1"):
        ch1c.window_settings_values({"a": {"auc": {5: 0.5}}})


# ------------------------------------------------------------------ white-box factors
def _net_and_clients(K=3, r=8, seed=0):
    net = models.mlp(6, (5,), 4, seed=seed)
    w = models.get_params(net)
    g = torch.Generator().manual_seed(seed)
    stacked = {k: v[None] + 0.3 * torch.randn(K, *v.shape, generator=g) for k, v in w.items()}
    X = torch.randn(K, r, 6, generator=g)
    y = torch.randint(0, 4, (K, r), generator=g)
    return net, stacked, X, y


def test_gradient_norm_is_the_product_of_the_output_and_activation_factors():
    net, stacked, X, y = _net_and_clients()
    gn = torch.stack([mia.per_example_grad_norm(net, {k: v[i] for k, v in stacked.items()}, X[i], y[i],
                                                mia.last_layer_names(stacked)) for i in range(3)])
    fac = ch1c.white_box_factors(net, stacked, X, y, gn)
    assert fac["max_rel_error"] < 1e-5 and fac["rel_error"] <= fac["max_rel_error"]
    assert torch.allclose(fac["output"] * fac["activation"], gn.double(), rtol=1e-5)
    assert (fac["activation"] >= 1).all()                      # ||[h; 1]|| >= 1
    with pytest.raises(ValueError, match="grad_norm"):
        ch1c.white_box_factors(net, stacked, X, y, gn[:, :3])
    with pytest.raises(ValueError, match="agree"):
        ch1c.white_box_factors(net, stacked, X[:2], y[:2])
    with pytest.raises(ValueError, match="nn.Linear"):
        ch1c.white_box_factors(nn.Sequential(nn.Linear(6, 4), nn.ReLU()), {}, X, y)


def test_white_box_evidence_scores_each_factor_and_ranks_the_signals():
    K = 3
    loss = torch.rand(K, 2, 8)
    signals = {"loss": loss, "grad_norm": 2 * loss}               # the same ranking: rank correlation 1
    mem = torch.tensor(IS_MEMBER)
    factors = {"output": (1 - mem).repeat(K, 1) + 0.01 * torch.rand(K, 8),   # members lower: AUC 1
               "activation": mem.repeat(K, 1) + 0.01 * torch.rand(K, 8)}      # members higher: AUC 0
    ev = ch1c.white_box_evidence(signals, factors, IS_MEMBER)
    assert ev["wbe_rho"] == pytest.approx(1.0) and ev["wbe_rho_min"] == pytest.approx(1.0)
    assert ev["wbe_auc_output"] == 1.0 and ev["wbe_auc_activation"] == 0.0
    signals["grad_norm"] = -loss
    assert ch1c.white_box_evidence(signals, factors, IS_MEMBER)["wbe_rho"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="factors"):
        ch1c.white_box_evidence(signals, {"output": factors["output"]}, IS_MEMBER)
    with pytest.raises(ValueError, match="signals"):
        ch1c.white_box_evidence({"loss": loss}, factors, IS_MEMBER)


# ------------------------------------------------------------------ Centaur on iid and label-skewed clients
SWEEP = dict(task=ch1c.PersonalizationTask(num_clients=24), num_rounds=2,
             dp=DPSettings(noise_multiplier=0.5, clip_norm=0.2, sampling_prob=0.5, server_lr=3.0, safe=False),
             local=fl.LocalTraining(lr=0.2, batch_size=5),
             schedule=ch1c.PersonalizationSchedule(local_only_epochs=5, finetune_epochs=5, head_epochs=3, final_head_epochs=5),
             seed=1)


@pytest.fixture(scope="module")
def kept_sweep():
    net = models.mlp(64, (4,), 10, seed=1)
    w0 = models.get_params(net)
    return net, w0, ch1c.personalization_sweep(net, w0, [2, 10], **SWEEP)


def test_kept_models_change_no_number_and_give_the_reported_accuracy(kept_sweep):
    net, w0, (util, diag, kept) = kept_sweep
    plain, _, _ = ch1c.personalization_sweep(net, w0, [2, 10], methods=list(ch1c.PERSONALIZATION_METHODS), **SWEEP)
    assert plain == util
    for m in util:
        for c in (2, 10):
            acc = pers.evaluate_clients(net, kept["models"][m][c], kept["tasks"][c][1]).mean()
            assert float(acc) == util[m][c]


def test_label_skewed_split_is_skewed_and_iid_split_is_not(kept_sweep):
    _, _, (_, _, kept) = kept_sweep
    per_client = {c: [len(set(row.tolist())) for row in kept["tasks"][c][0].y] for c in (2, 10)}
    assert max(per_client[2]) <= 2
    assert np.mean(per_client[10]) > 4                          # 10 records over 10 classes: most labels differ
    # the test records come from each client's own classes
    for tr, te in zip(kept["tasks"][2][0].y, kept["tasks"][2][1].y):
        assert set(te.tolist()) <= set(range(10)) and len(set(te.tolist()) | set(tr.tolist())) <= 2


def test_personalized_attack_scores_members_by_their_own_client_model():
    train, test = pers.make_representation_task(6, 5, 10, classes_per_client=10, seed=0)
    net = models.mlp(64, (8,), 10, seed=0)
    local = pers.local_only(net, train, num_epochs=60, lr=0.3, batch_size=5, params=models.get_params(net), seed=0)
    a = ch1c.personalized_attack(net, local, train, test, seed=0)
    assert a["auc"].shape == (6,) and np.mean(a["auc"]) > 0.8 and a["gap"] > 0
    assert np.mean(a["auc"]) > a["floor"] > 0.5 and len(a["tpr"]) == len(ch1c.LOW_FPR)
    swapped = ch1c.personalized_attack(net, local, test, train, seed=0)          # members and non-members exchanged
    assert np.mean(swapped["auc"]) < 0.2
    # another client's model carries no membership of this client's records
    other = {k: v.roll(1, 0) for k, v in local.items()}
    assert abs(np.mean(ch1c.personalized_attack(net, other, train, test, seed=0)["auc"]) - 0.5) < 0.15


def test_personalized_attack_rejects_padding_and_wrong_K():
    train, test = pers.make_representation_task(4, 5, 10, seed=0)
    net = models.mlp(64, (4,), 10, seed=0)
    stacked = {k: v[None].repeat(4, *[1] * v.ndim) for k, v in models.get_params(net).items()}
    padded = type(train)(train.X, train.y, torch.tensor([5, 5, 4, 5]))
    with pytest.raises(ValueError, match="train"):
        ch1c.personalized_attack(net, stacked, padded, test)
    with pytest.raises(ValueError, match="test"):
        ch1c.personalized_attack(net, stacked, train, type(test)(test.X[:3], test.y[:3], test.n[:3]))


def test_personalized_attack_values_and_table(kept_sweep):
    net, _, (util, _, kept) = kept_sweep
    att = {"Centaur": {c: ch1c.personalized_attack(net, kept["models"]["Centaur"][c], *kept["tasks"][c]) for c in (10, 2)}}
    v = ch1c.personalized_attack_values(util, att)
    for c in (10, 2):
        assert v[f"pm_ce_acc_{c}"] == util["Centaur"][c]
        assert v[f"pm_ce_auc_{c}"] == pytest.approx(float(np.mean(att["Centaur"][c]["auc"])))
        assert v[f"pm_ce_tpr1_{c}"] == att["Centaur"][c]["tpr"][1] and v[f"pm_floor_{c}"] == att["Centaur"][c]["floor"]
    table = ch1c.personalized_attack_table(util, att, {10: "iid"}, lambda k: f"<{k}>")
    assert "iid" in str(table) and "<pm_ce_auc_2>" in str(table)
    with pytest.raises(ValueError, match="util"):
        ch1c.personalized_attack_values({"Centaur": {10: 0.5}}, att)
