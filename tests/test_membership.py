"""Membership-inference signals and attacks (Nasr, Shokri & Houmansadr 2019) checked against
closed forms, scikit-learn and planted effects."""
import numpy as np
import pytest
import torch
from torch import nn

from fedlab import fl, models
from fedlab.attacks import membership as mia
from fedlab.metrics import tpr_at_fpr

torch.set_num_threads(1)


def _net():
    return models.mlp(5, (7,), 3, seed=0)


def _xy(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_last_layer_names():
    p = models.get_params(_net())
    assert mia.last_layer_names(p) == ["2.weight", "2.bias"]
    with pytest.raises(ValueError):
        mia.last_layer_names({})


def test_per_example_loss_matches_torch():
    net = _net(); p = models.get_params(net); X, y = _xy()
    want = nn.functional.cross_entropy(net(X), y, reduction="none")
    assert torch.allclose(mia.per_example_loss(net, p, X, y), want, atol=1e-6)


def test_grad_norm_matches_autograd_one_by_one():
    net = _net(); p = models.get_params(net); X, y = _xy(6)
    got = mia.per_example_grad_norm(net, p, X, y)
    for i in range(6):
        net.zero_grad()
        nn.functional.cross_entropy(net(X[i:i + 1]), y[i:i + 1]).backward()
        want = torch.sqrt(net[2].weight.grad.pow(2).sum() + net[2].bias.grad.pow(2).sum())
        assert torch.allclose(got[i], want, atol=1e-5)


def test_grad_norm_closed_form_for_logistic_regression():
    # for softmax regression the last layer is the only layer: ||grad|| = ||p - e_y|| * sqrt(||x||^2 + 1)
    net = models.logistic_regression(5, 3, seed=0); p = models.get_params(net); X, y = _xy(8)
    probs = torch.softmax(net(X), 1)
    want = (probs - nn.functional.one_hot(y, 3)).norm(dim=1) * torch.sqrt(X.pow(2).sum(1) + 1)
    assert torch.allclose(mia.per_example_grad_norm(net, p, X, y), want, atol=1e-5)


def test_snapshot_signals_shapes_and_values():
    net = _net(); X, y = _xy()
    snaps = [models.get_params(models.mlp(5, (7,), 3, seed=s)) for s in range(4)]
    S = mia.snapshot_signals(net, snaps, X, y)
    assert S.shape == (4, 12)
    assert torch.allclose(S[2], mia.per_example_loss(net, snaps[2], X, y), atol=1e-6)
    G = mia.snapshot_signals(net, snaps, X, y, signal="grad_norm")
    assert torch.allclose(G[1], mia.per_example_grad_norm(net, snaps[1], X, y), atol=1e-5)
    with pytest.raises(ValueError, match="signal"):
        mia.snapshot_signals(net, snaps, X, y, signal="nope")


def test_auc_helper_agrees_with_sklearn():
    from sklearn.metrics import roc_auc_score
    r = np.random.default_rng(0)
    S = torch.tensor(r.normal(size=(6, 50)), dtype=torch.float32)
    lab = r.integers(0, 2, 50)
    for w in (1, 3, 6):
        want = roc_auc_score(lab, -S[-w:].mean(0).numpy())
        assert mia.attack_auc(S, lab, w) == pytest.approx(want)
    with pytest.raises(ValueError, match="window"):
        mia.membership_score(S, 7)
    # [K, T, n]: the mean over clients of each client's AUC
    S3 = torch.stack([S, -S])
    assert mia.attack_auc(S3, lab, 2) == pytest.approx((mia.attack_auc(S, lab, 2) + mia.attack_auc(-S, lab, 2)) / 2)
    with pytest.raises(ValueError, match="signals"):
        mia.attack_auc(S[0], lab)


def test_averaging_removes_round_noise():
    # planted: members have mean signal 0, non-members 0.5, i.i.d. N(0,1) noise per round
    r = np.random.default_rng(1)
    lab = np.r_[np.ones(500), np.zeros(500)]
    S = torch.tensor(r.normal(size=(20, 1000)) + 0.5 * (1 - lab), dtype=torch.float32)
    aucs = {w: mia.attack_auc(S, lab, w) for w in (1, 20)}
    assert aucs[20] > aucs[1] + 0.15
    # closed form: AUC = Phi(0.5 / sqrt(2 sigma^2 / W))
    from scipy.stats import norm
    assert aucs[20] == pytest.approx(norm.cdf(0.5 / np.sqrt(2 / 20)), abs=0.03)


def test_attack_accuracy_perfect_and_chance():
    lab = np.r_[np.ones(10), np.zeros(10)]
    assert mia.attack_accuracy(lab, lab.astype(float)) == 1.0
    assert mia.attack_accuracy(lab, np.zeros(20)) == 0.5


def test_attack_model_learns_planted_signal():
    r = np.random.default_rng(0)
    lab = np.r_[np.ones(200), np.zeros(200)]
    F = r.normal(size=(400, 3)); F[:, 1] += 1.5 * lab
    out = mia.attack_model_auc(F, lab, seed=0)
    assert out["auc"] > 0.8
    with pytest.raises(ValueError, match="train_fraction"):
        mia.attack_model_auc(F, lab, train_fraction=1.0)


def test_gradient_ascent_raises_target_loss():
    net = _net(); p = models.get_params(net); X, y = _xy()
    before = mia.per_example_loss(net, p, X, y).mean()
    adv = mia.gradient_ascent(net, p, X, y, ascent_lr=0.5)
    assert mia.per_example_loss(net, adv, X, y).mean() > before
    same = mia.gradient_ascent(net, p, X, y, ascent_lr=0.0)
    assert all(torch.equal(same[k], p[k]) for k in p)
    with pytest.raises(ValueError, match="ascent_lr"):
        mia.gradient_ascent(net, p, X, y, ascent_lr=-1.0)


def _federation():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4, 8, 5, generator=g); y = torch.randint(0, 3, (4, 8), generator=g)
    return fl.ClientData(X, y, torch.full((4,), 8))


def test_recorder_and_client_signals():
    net = _net(); cd = _federation(); rec = mia.SnapshotRecorder()
    res = fl.fedavg(net, cd, num_rounds=3, local=fl.LocalTraining(lr=0.1, batch_size=4), params=models.get_params(net), callback=rec)
    assert len(rec.global_models) == 3
    assert all(torch.allclose(rec.global_models[-1][k], res.params[k]) for k in res.params)
    S = mia.client_signals(net, rec, cd.X, cd.y)
    assert S.shape == (4, 3, 8)
    hist = rec.client_history(2)
    assert torch.allclose(S[2, 1], mia.per_example_loss(net, {k: v[1] for k, v in hist.items()}, cd.X[2], cd.y[2]))


def test_active_attack_passive_equals_plain_fedavg_and_validates():
    net = _net(); cd = _federation(); p = models.get_params(net)
    Xc, yc = cd.X[0], cd.y[0]
    S = mia.active_attack_rounds(net, cd, p, Xc, yc, attack=mia.ActiveAttack(target=0, ascent_lr=0.0), num_rounds=2,
                                 local=fl.LocalTraining(batch_size=4, lr=0.1), seed=3)
    assert S.shape == (2, 8)
    with pytest.raises(ValueError, match="attacker_index"):
        mia.ActiveAttack(target=0, ascent_lr=1.0, attacker="participant", attacker_index=0)
    with pytest.raises(ValueError, match="attacker_index"):
        mia.active_attack_runs(net, cd, p, [dict(X_target=Xc, y_target=yc, target=0, ascent_lr=1.0,
                                                 attacker="participant", attacker_index=cd.num_clients)], num_rounds=1)
    with pytest.raises(ValueError, match="local"):
        mia.active_attack_rounds(net, cd, p, Xc, yc, attack=mia.ActiveAttack(target=0, ascent_lr=0.0), num_rounds=1,
                                 local=fl.LocalTraining(local_steps=2))
    with pytest.raises(ValueError, match="attacker"):
        mia.ActiveAttack(target=0, ascent_lr=1.0, attacker="x")
    with pytest.raises(ValueError, match="target"):
        mia.active_attack_rounds(net, cd, p, Xc, yc, attack=mia.ActiveAttack(target=cd.num_clients, ascent_lr=0.0),
                                 num_rounds=1)


def test_active_attack_refuses_non_finite_steps_non_bool_isolate_and_a_stray_attacker_index():
    for kw, field in [(dict(ascent_lr=float("inf")), "ActiveAttack.ascent_lr"),
                      (dict(ascent_lr=float("nan")), "ActiveAttack.ascent_lr"),
                      (dict(ascent_lr="1.0"), "ActiveAttack.ascent_lr"),
                      (dict(target=float("nan")), "ActiveAttack.target"), (dict(target=1.5), "ActiveAttack.target"),
                      (dict(isolate="yes"), "ActiveAttack.isolate"), (dict(isolate=1), "ActiveAttack.isolate"),
                      (dict(attacker="participant", attacker_index=1.5), "ActiveAttack.attacker_index"),
                      (dict(attacker="server", attacker_index=3), "ActiveAttack.attacker_index")]:
        with pytest.raises(ValueError, match=field):
            mia.ActiveAttack(**{"target": 0, "ascent_lr": 1.0, **kw})
    mia.ActiveAttack(target=np.int64(2), ascent_lr=0, isolate=np.bool_(True))
    mia.ActiveAttack(target=0, ascent_lr=2.0, attacker="participant", attacker_index=1)


def test_active_step_raises_the_loss_drop_of_members():
    # the target's local training pulls the ascended members back down: the drop is larger
    net = _net(); cd = _federation(); p = models.get_params(net)
    adv = mia.gradient_ascent(net, p, cd.X[0], cd.y[0], ascent_lr=2.0)
    loc = fl.client_update(net, adv, cd.X[0], cd.y[0], local=fl.LocalTraining(lr=0.2, local_epochs=3, batch_size=None))
    drop_adv = (mia.per_example_loss(net, adv, cd.X[0], cd.y[0]) - mia.per_example_loss(net, loc, cd.X[0], cd.y[0])).mean()
    loc0 = fl.client_update(net, p, cd.X[0], cd.y[0], local=fl.LocalTraining(lr=0.2, local_epochs=3, batch_size=None))
    drop0 = (mia.per_example_loss(net, p, cd.X[0], cd.y[0]) - mia.per_example_loss(net, loc0, cd.X[0], cd.y[0])).mean()
    assert drop_adv > drop0 > 0


def test_the_membership_attack_pools_its_clients_with_one_threshold():
    import torch

    from fedlab.attacks import membership as mia

    g = torch.Generator().manual_seed(0)
    is_member = np.r_[np.ones(20), np.zeros(20)]
    signals = torch.rand(3, 5, 40, generator=g) + torch.as_tensor(1 - is_member) * 0.3   # members: lower loss
    pooled = np.concatenate([-signals[k, -1].numpy() for k in range(3)])
    got = mia.attack_tpr_at_fpr(signals, is_member, [0.01, 0.1])
    assert got == tpr_at_fpr(np.tile(is_member, 3), pooled, [0.01, 0.1]) and got[1] > 0.1
    assert mia.attack_tpr_at_fpr(signals[0], is_member, 0.1, window=5) == [tpr_at_fpr(is_member, -signals[0].mean(0), 0.1)]
    with pytest.raises(ValueError, match="signals"):
        mia.attack_tpr_at_fpr(signals[0, 0], is_member)


def test_lira_scores_a_confidence_near_the_in_shadows_above_one_near_the_out_shadows():
    """LiRA's direction (Carlini et al. 2022, Algorithm 1): higher means member. Shadows that trained on a record
    (IN) give it confidence about 3, the others about 0; a target confidence of 3 must outscore one of 0, with
    the pooled and with the per-record variance (a swap of IN and OUT reverses the order)."""
    rng = np.random.default_rng(0)
    S, n = 16, 4
    shadow_in = np.zeros((S, n), dtype=bool)
    shadow_in[: S // 2] = True
    phi = np.where(shadow_in, 3.0, 0.0) + 0.3 * rng.standard_normal((S, n))
    for fixed in (True, False):
        member = mia.lira_scores(np.full(n, 3.0), phi, shadow_in, fixed_variance=fixed)
        outsider = mia.lira_scores(np.zeros(n), phi, shadow_in, fixed_variance=fixed)
        assert (member > 0).all() and (outsider < 0).all() and (member > outsider).all(), (fixed, member, outsider)
