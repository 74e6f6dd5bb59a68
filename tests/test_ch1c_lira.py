"""LiRA (Carlini et al., S&P 2022) adapted to FedAvg (issue 36 item 1), the ascent step chosen on held-out
targets (item 1: "every gamma reported, gamma chosen on held-out targets") and the loss drop of the
ascent (item 3): fedlab.attacks.membership.logit_confidence / balanced_inclusion / lira_scores and the
chapter 1c helpers built on them."""
import numpy as np
import pytest
import torch
from scipy.stats import norm

from fedlab import fl, metrics, models
from fedlab.attacks import membership as mia
from fedlab.experiments import chapter1c as ch1c

torch.set_num_threads(1)


# ------------------------------------------------------------------ logit_confidence
def test_logit_confidence_is_the_log_odds_of_the_true_label():
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(7, 4, generator=g).double()
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    p = torch.softmax(Z, -1)[torch.arange(7), y]
    assert torch.allclose(mia.logit_confidence(Z, y), torch.log(p / (1 - p)))
    # stable where p rounds to 1: a margin of 60 nats is log-odds about 60, not inf
    big = torch.tensor([[60.0, 0.0, 0.0]])
    assert float(mia.logit_confidence(big, torch.tensor([0]))) == pytest.approx(60 - np.log(2), abs=1e-9)
    assert float(mia.logit_confidence(big, torch.tensor([1]))) == pytest.approx(-60 - np.log(1 + np.exp(-60)))
    # leading dimensions broadcast the labels: [S, K, n, C] with labels [n]
    ZZ = torch.randn(3, 2, 7, 4, generator=g)
    out = mia.logit_confidence(ZZ, y)
    assert out.shape == (3, 2, 7) and torch.allclose(out[2, 1], mia.logit_confidence(ZZ[2, 1], y))


def test_logit_confidence_rejects_bad_input():
    Z = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="C >= 2"):
        mia.logit_confidence(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="labels must lie"):
        mia.logit_confidence(Z, torch.tensor([0, 1, 4]))
    with pytest.raises(ValueError, match="labels must be \\[n\\]"):
        mia.logit_confidence(Z, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integers"):
        mia.logit_confidence(Z, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="finite"):
        mia.logit_confidence(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))


# ------------------------------------------------------------------ balanced_inclusion
def test_balanced_inclusion_puts_every_record_in_half_of_the_shadows():
    I = mia.balanced_inclusion(6, 11, seed=3)
    assert I.dtype == torch.bool and I.shape == (6, 11)
    assert (I.sum(0) == 3).all()
    assert set(I.sum(1).tolist()) <= {5, 6}
    assert (I[0::2] ^ I[1::2]).all()                       # pairs are complements
    assert torch.equal(I, mia.balanced_inclusion(6, 11, seed=3)) and not torch.equal(I, mia.balanced_inclusion(6, 11, seed=4))
    for bad in (3, 0, 1.5, True):
        with pytest.raises(ValueError, match="num_shadows"):
            mia.balanced_inclusion(bad, 10)
    with pytest.raises(ValueError, match="n must"):
        mia.balanced_inclusion(4, 1)


# ------------------------------------------------------------------ lira_scores on toys whose answer is known
def _toy(shift, n=400, S=16, spread=3.0, sd=0.5, seed=0):
    """Records of very different difficulty (per-record mean ``spread`` apart); under IN shadows the confidence
    is ``shift`` higher. The target model's confidence of a member is drawn from its IN law, of a non-member
    from its OUT law."""
    rng = np.random.default_rng(seed)
    base = spread * rng.normal(size=n)
    I = mia.balanced_inclusion(S, n, seed=seed).numpy()
    P = base + shift * I + sd * rng.normal(size=(S, n))
    member = np.arange(n) % 2 == 0
    target = base + shift * member + sd * rng.normal(size=n)
    return target, P, I, member.astype(int)


@pytest.mark.parametrize("fixed", [True, False])
def test_lira_separated_gaussians_give_auc_near_one(fixed):
    t, P, I, m = _toy(shift=3.0)
    assert metrics.roc_auc(m, mia.lira_scores(t, P, I, fixed_variance=fixed)) > 0.98
    # a fixed threshold on the raw confidence cannot undo the records' different difficulty
    assert metrics.roc_auc(m, t) < 0.85


@pytest.mark.parametrize("fixed", [True, False])
def test_lira_identical_in_and_out_gives_auc_near_one_half(fixed):
    t, P, I, m = _toy(shift=0.0, n=4000)
    assert abs(metrics.roc_auc(m, mia.lira_scores(t, P, I, fixed_variance=fixed)) - 0.5) < 0.03


def test_lira_score_is_the_gaussian_log_likelihood_ratio():
    t, P, I, _ = _toy(shift=1.0, n=5, S=6)
    s = mia.lira_scores(t, P, I)
    for i in range(5):
        a, b = P[I[:, i], i], P[~I[:, i], i]
        want = (norm.logpdf(t[i], a.mean(), a.std(ddof=1)) - norm.logpdf(t[i], b.mean(), b.std(ddof=1)))
        assert s[i] == pytest.approx(want)
    # fixed variance: one pooled sigma_in and sigma_out for every record, per-record means
    f = mia.lira_scores(t, P, I, fixed_variance=True)
    din = np.concatenate([P[I[:, i], i] - P[I[:, i], i].mean() for i in range(5)])
    dout = np.concatenate([P[~I[:, i], i] - P[~I[:, i], i].mean() for i in range(5)])
    sin, sout = np.sqrt((din ** 2).sum() / (len(din) - 5)), np.sqrt((dout ** 2).sum() / (len(dout) - 5))
    for i in range(5):
        want = norm.logpdf(t[i], P[I[:, i], i].mean(), sin) - norm.logpdf(t[i], P[~I[:, i], i].mean(), sout)
        assert f[i] == pytest.approx(want)
    # exchanging IN and OUT negates the score: a swapped attack is caught by its AUC falling below 0.5
    assert np.allclose(mia.lira_scores(t, P, ~I), -s)


def test_lira_scores_rejects_bad_input():
    t, P, I, _ = _toy(shift=1.0, n=6, S=4)
    with pytest.raises(ValueError, match="target_phi"):
        mia.lira_scores(P, P, I)
    with pytest.raises(ValueError, match="shadow_phi"):
        mia.lira_scores(t, P[:, :5], I)
    with pytest.raises(ValueError, match="shadow_in must have"):
        mia.lira_scores(t, P, I[:3])
    with pytest.raises(ValueError, match="boolean"):
        mia.lira_scores(t, P, I.astype(int))
    with pytest.raises(ValueError, match="finite"):
        mia.lira_scores(np.r_[t[:5], np.inf], P, I)
    with pytest.raises(ValueError, match="min_std"):
        mia.lira_scores(t, P, I, min_std=0.0)
    J = I.copy()
    J[:, 2] = False                                         # record 2 is never IN
    with pytest.raises(ValueError, match="record 2 has 0 IN"):
        mia.lira_scores(t, P, J, fixed_variance=True)
    # two shadows, one IN and one OUT per record: enough for the fixed variance, not for per-record variances
    t2, P2, I2, _ = _toy(shift=1.0, n=6, S=2)
    assert np.isfinite(mia.lira_scores(t2, P2, I2, fixed_variance=True)).all()
    with pytest.raises(ValueError, match="at least 2 IN and 2 OUT"):
        mia.lira_scores(t2, P2, I2)
    # shadows that agree exactly: the floor on the standard deviation keeps the score finite
    assert np.isfinite(mia.lira_scores(t, np.zeros_like(P), I)).all()


# ------------------------------------------------------------------ the shadow federations and the FL attack
def _fed(K=2, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(K, 2 * n, 5, generator=g)
    y = torch.randint(0, 3, (K, 2 * n), generator=g)
    return X, y


@pytest.mark.slow
def test_shadow_federations_are_the_librarys_fedavg():
    K, n, S, R = 2, 4, 4, 3
    X, y = _fed(K, n)
    net = models.mlp(5, (6,), 3, seed=0)
    w0 = models.get_params(net)
    pool_X, pool_y = X.reshape(-1, 5), y.reshape(-1)
    I = mia.balanced_inclusion(S, 2 * K * n, seed=1)
    kw = dict(local=fl.LocalTraining(lr=0.3, local_epochs=1, batch_size=2))
    shadows, owner = ch1c.lira_shadow_models(net, w0, pool_X, pool_y, I, num_clients=K, num_rounds=R, seed=7, **kw)
    assert shadows["0.weight"].shape == (S, K, 6, 5) and owner.shape == I.shape
    assert torch.equal(owner >= 0, I)
    for s in range(S):
        assert sorted(torch.bincount(owner[s][owner[s] >= 0]).tolist()) == [n, n]      # equal shares
        idx = [torch.nonzero(owner[s] == k).flatten() for k in range(K)]
        # the order of a client's records inside the shadow is the shuffle's; rebuild it from the shadow's data
        g = torch.Generator().manual_seed(7)
        for _ in range(s):
            torch.randperm(K * n, generator=g)
        rows = torch.nonzero(I[s]).flatten()[torch.randperm(K * n, generator=g)].reshape(K, n)
        assert all(set(rows[k].tolist()) == set(idx[k].tolist()) for k in range(K))
        data = fl.ClientData(pool_X[rows], pool_y[rows], torch.full((K,), n))
        glob = fl.fedavg(net, data, num_rounds=R - 1, params=w0, seed=7 + 1 + s, **kw).params
        last = fl.clients_update(net, glob, data, generator=torch.Generator().manual_seed(7 + 1 + s), **kw)
        assert all(torch.allclose(shadows[k][s], last[k], atol=1e-6) for k in last)
    with pytest.raises(ValueError, match="multiple of num_clients"):
        ch1c.lira_shadow_models(net, w0, pool_X, pool_y, I, num_clients=3, num_rounds=R, **kw)
    with pytest.raises(ValueError, match="shadow_in must be bool"):
        ch1c.lira_shadow_models(net, w0, pool_X, pool_y, I.int(), num_clients=K, num_rounds=R, **kw)


def test_lira_attack_reads_in_from_the_owner_and_out_from_the_targets_client():
    K, n, S, R = 2, 4, 4, 2
    X, y = _fed(K, n, seed=2)
    net = models.mlp(5, (6,), 3, seed=0)
    w0 = models.get_params(net)
    kw = dict(local=fl.LocalTraining(lr=0.3, local_epochs=1, batch_size=2))
    target = fl.clients_update(net, w0, fl.ClientData(X[:, :n], y[:, :n], torch.full((K,), n)), **kw)
    is_member = np.r_[np.ones(n), np.zeros(n)]
    out = ch1c.lira_attack(net, target, X, y, is_member, params=w0, num_shadows=S, num_rounds=R, seed=5, **kw)
    shadows, owner = ch1c.lira_shadow_models(net, w0, X.reshape(-1, 5), y.reshape(-1), out["shadow_in"], num_clients=K,
                                             num_rounds=R, seed=5, **kw)
    for s in range(S):
        for i in range(2 * K * n):
            c = int(owner[s, i]) if owner[s, i] >= 0 else i // (2 * n)       # IN: its shadow client; OUT: client k
            p = {k: v[s, c] for k, v in shadows.items()}
            logits = torch.func.functional_call(net, p, (X.reshape(-1, 5)[i:i + 1],))
            assert float(out["phi_shadow"][s, i]) == pytest.approx(float(mia.logit_confidence(logits, y.reshape(-1)[i:i + 1])),
                                                                 abs=1e-6)
    for k in range(K):
        logits = torch.func.functional_call(net, {q: v[k] for q, v in target.items()}, (X[k],))
        assert torch.allclose(out["phi_target"][k], mia.logit_confidence(logits, y[k]))
    assert set(out["auc"]) == {"LiRA, fixed variance", "LiRA, per-record variance"}
    assert out["scores"]["LiRA, fixed variance"].shape == (K, 2 * n) and out["shadow_records"] == K * n
    for bad, match in ((dict(num_shadows=2), "num_shadows"), (dict(num_shadows=5), "num_shadows")):
        with pytest.raises(ValueError, match=match):
            ch1c.lira_attack(net, target, X, y, is_member, params=w0, num_rounds=R, **{**kw, **bad})
    with pytest.raises(ValueError, match="even number r"):
        ch1c.lira_attack(net, target, X[:, :7], y[:, :7], is_member[:7], params=w0, num_shadows=4, num_rounds=R, **kw)
    with pytest.raises(ValueError, match="is_member"):
        ch1c.lira_attack(net, target, X, y, is_member[:4], params=w0, num_shadows=4, num_rounds=R, **kw)


@pytest.mark.slow
def test_lira_finds_memorised_records():
    """An overfitted federation (few records, many local steps): LiRA's scores separate each client's members."""
    K, n = 2, 6
    X, y = _fed(K, n, seed=3)
    net = models.mlp(5, (32,), 3, seed=0)
    w0 = models.get_params(net)
    kw = dict(local=fl.LocalTraining(lr=0.5, local_epochs=20, batch_size=None))
    data = fl.ClientData(X[:, :n], y[:, :n], torch.full((K,), n))
    glob = fl.fedavg(net, data, num_rounds=2, params=w0, seed=1, **kw).params
    target = fl.clients_update(net, glob, data, **kw)
    is_member = np.r_[np.ones(n), np.zeros(n)]
    out = ch1c.lira_attack(net, target, X, y, is_member, params=w0, num_shadows=8, num_rounds=3, seed=4, **kw)
    assert np.mean(out["auc"]["LiRA, fixed variance"]) > 0.8, out["auc"]


def test_passive_attack_scores_values_and_table():
    rng = np.random.default_rng(0)
    K, T, r = 4, 5, 10
    is_member = np.r_[np.ones(r // 2), np.zeros(r // 2)]
    loss = torch.tensor(rng.random((K, T, r)) + 0.3 * (1 - is_member))
    signals = {"loss": loss, "grad_norm": loss * 2}
    lira = {"scores": {"LiRA, fixed variance": -loss[:, -1].numpy() + 0.1, "LiRA, per-record variance": rng.random((K, r))}}
    cmp_ = ch1c.passive_attack_scores(signals, is_member, lira)
    assert set(cmp_["auc"]) == set(ch1c.PASSIVE_ATTACKS)
    last = [metrics.roc_auc(is_member, -loss[k, -1].numpy()) for k in range(K)]
    assert cmp_["auc"]["mean loss, last round"] == pytest.approx(last)
    assert cmp_["auc"]["LiRA, fixed variance"] == pytest.approx(last)       # a shifted score ranks alike
    v = ch1c.passive_attack_values(cmp_)
    assert v["pa_lira_minus_loss"] == pytest.approx(0.0)
    assert v["pa_loss_all_auc_lo"] <= v["pa_loss_all_auc"] <= v["pa_loss_all_auc_hi"]
    assert {"pa_learned_tpr0p1", "pa_learned_tpr1", "pa_lira_rec_tpr1", "pa_lira_rec_minus_loss_hi"} <= set(v)
    for name, ci in cmp_["tpr_ci"].items():                                 # a bootstrap interval around each TPR
        assert all(lo <= t <= hi for (lo, hi), t in zip(ci, cmp_["tpr"][name])), name
    assert v["pa_lira_fixed_tpr1_lo"] <= v["pa_lira_fixed_tpr1"] <= v["pa_lira_fixed_tpr1_hi"]
    table = ch1c.passive_attack_table(cmp_, lambda name: f"paper:{name}").data
    assert "| LiRA, fixed variance |" in table and "paper:pa_lira_rec_tpr0p1" in table
    lo, hi = cmp_["tpr_ci"]["mean loss, last round"][1]
    assert f"{cmp_['tpr']['mean loss, last round'][1]:.3f} [{lo:.3f}, {hi:.3f}]" in table
    with pytest.raises(ValueError, match="n_boot"):
        ch1c.passive_attack_scores(signals, is_member, lira, n_boot=0)
    with pytest.raises(ValueError, match="LiRA, per-record variance"):
        ch1c.passive_attack_scores(signals, is_member, {"scores": {"LiRA, fixed variance": lira["scores"]["LiRA, fixed variance"]}})
    with pytest.raises(ValueError, match="grad_norm"):
        ch1c.passive_attack_scores({"loss": loss}, is_member, lira)


# ------------------------------------------------------------------ gamma chosen on held-out targets
def test_heldout_gamma_chooses_on_one_half_and_scores_the_other():
    U = 6
    passive = np.full(U, 0.6)
    # gamma 5 looks best on the first half only, gamma 0.5 on the second half only
    auc = {("server", 0.0): passive, ("server", 0.5): np.r_[0.6, 0.6, 0.6, 0.7, 0.7, 0.7],
           ("server", 5.0): np.r_[0.8, 0.8, 0.8, 0.5, 0.5, 0.5]}
    sweep = {"auc": auc, "auc_learned": auc}
    r = ch1c.heldout_gamma(sweep)["server"]
    assert r["gammas"] == (5.0, 0.5)
    # the first half is scored at gamma 0.5 (chosen on the second), the second half at gamma 5
    assert r["gain"] == pytest.approx([0, 0, 0, -0.1, -0.1, -0.1])
    # the best row of the table would have claimed +0.05 (gamma 5 mean 0.65): cross-fitting does not
    v = ch1c.heldout_gamma_values(sweep)
    assert v["hg_server_auc"] == pytest.approx(-0.05) and v["hg_server_lauc_gamma_a"] == 5.0
    assert v["hg_max"] == pytest.approx(-0.05)
    table = ch1c.heldout_gamma_table(sweep, lambda name: f"paper:{name}").data
    assert "| server | mean loss | 5 / 0.5 |" in table and "paper:hg_server_lauc" in table
    with pytest.raises(ValueError, match="stat"):
        ch1c.heldout_gamma(sweep, "accuracy")
    with pytest.raises(ValueError, match="four targets"):
        ch1c.heldout_gamma({"auc": {k: v[:3] for k, v in auc.items()}})
    with pytest.raises(ValueError, match="passive cell"):
        ch1c.heldout_gamma({"auc": {("server", 0.0): passive}})


def test_ascent_drop_values_names():
    d = {"auc": np.r_[0.3, 0.4], "member": np.r_[1.0, 2.0], "nonmember": np.r_[3.0, 5.0]}
    v = ch1c.ascent_drop_values({"drop": {("server, isolating", 2.0): d, ("server", 0.0): d}})
    assert v == {"drop_server_isolating_g2_auc": pytest.approx(0.35), "drop_server_isolating_g2_mem": 1.5,
                 "drop_server_isolating_g2_non": 4.0, "drop_server_p_auc": pytest.approx(0.35), "drop_server_p_mem": 1.5,
                 "drop_server_p_non": 4.0}
