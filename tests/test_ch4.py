"""The chapter 4 and 5 helpers of fedlab.experiments that the notebooks call: the hard instance of
Xu & Neglia's Observation 2, the Table 1 bookkeeping, the sanitised update DLG attacks (Galli et al.,
Sec. 4.3), the distance to the optima and the Table 2 bookkeeping."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedlab import models
from fedlab.attacks import model_reconstruction as mr
from fedlab.experiments import chapter4 as ex4
from fedlab.experiments import chapter5 as ex5
from fedlab.privacy import defenses
from fedlab.privacy import dprivacy as dp


# ------------------------------------------------------------------------------------------------
# chapter 4
def test_hard_instance_support_grows_one_coordinate_a_round_and_truncation_hides_until_round_d():
    d = 6
    h_in, h_out, rounds = ex4.hard_instance_transcript(d)
    assert h_in.shape == h_out.shape == (d, d) and h_out.dtype == torch.float64
    assert [int(torch.count_nonzero(h_out[t])) for t in range(d)] == list(range(1, d + 1))
    t_in, t_out, _ = ex4.hard_instance_transcript(d, truncated=True)
    same = [bool(torch.equal(h_in[k], t_in[k]) and torch.equal(h_out[k], t_out[k])) for k in range(d)]
    assert same.index(False) + 1 == d
    # the alternative client is full rank and has another local optimum
    Xt, yt = mr.hard_instance(d, truncated=True)
    assert int(torch.linalg.matrix_rank(Xt.T @ Xt)) == d
    assert not torch.allclose(mr.local_optimum(Xt, yt), mr.hard_instance_optimum(d))
    # E local steps: the support grows by E a round
    _, e_out, _ = ex4.hard_instance_transcript(d, num_rounds=2, local_epochs=3)
    assert [int(torch.count_nonzero(e_out[k])) for k in range(2)] == [3, 6]


@pytest.mark.parametrize("kwargs", [{"dim": 0}, {"dim": 4, "num_rounds": 0}, {"dim": 4, "local_epochs": 1.5},
                                    {"dim": 4, "num_clients": 0}])
def test_hard_instance_rejects_bad_sizes(kwargs):
    dim = kwargs.pop("dim")
    with pytest.raises(ValueError, match=next(iter(kwargs), "dim")):
        ex4.hard_instance_transcript(dim, **kwargs)


def test_obs56_curves_follow_one_over_n_and_stay_above_the_lower_bound():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(100, 4, generator=g, dtype=torch.float64)
    y = X @ torch.randn(4, generator=g, dtype=torch.float64)
    n_obs = [10, 40, 160]
    c = ex4.obs56_curves(X, y, n_obs, lr=mr.max_lr(X, 4.0), sigma=1.0, local_steps=2, trials=30, seed=0)
    assert c["n_obs"] == n_obs and c["upper"][0] == pytest.approx(c["mse"][0])
    assert (c["mse"] >= c["lower"]).all() and -1.6 < c["slope"] < -0.6
    # the OLS decoder pays for learning W when n_c is close to d, then approaches the known-W risk
    assert np.allclose(c["exact"], mr.obs6_known_map_risk(X, n_obs, lr=mr.max_lr(X, 4.0), sigma=1.0, local_steps=2))
    ratio = c["mse"] / c["exact"]
    assert (ratio > 0.7).all() and 0.8 < ratio[-1] < 1.4 and ratio[0] > ratio[-1], ratio
    with pytest.raises(ValueError, match="n_obs"):
        ex4.obs56_curves(X, y, [40], lr=0.01, sigma=1.0, local_steps=1, trials=2)


def _fake_t1(L=2, S=3, K=5):
    t1 = {"local_steps": [1, 5][:L], "last": np.full((L, S, K), 0.5), "decoded": np.full((L, S, K), 0.5),
          "mapping_loss": np.zeros((L, S, K)), "heldout_loss": np.full((L, S, K), 0.25),
          "oracle": np.full(K, 0.9), "dist_last": np.ones((L, S, K)),
          "dist_decoded": np.full((L, S, K), 0.8), "flatness": np.full((L, S, K), 0.99),
          "separable": np.array([True, True, False, True, False])[:K],
          "residual": np.full((L, S, K), 0.2), "majority": np.full(K, 0.75)}
    t1["decoded"][1, :, 2] = 0.12345
    t1["residual"][0, 0, 0], t1["residual"][0, 1, 1] = 0.051, 0.6001
    return t1


def test_table1_values_names_and_rounding():
    t1 = _fake_t1()
    v = ex4.table1_values(t1)
    assert len(v) == 3 + 2 * 9 and v["ch4-t1-held5"] == 0.25 and v["ch4-t1-major"] == 75.0
    assert (v["ch4-t1-resid1-lo"], v["ch4-t1-resid1-hi"], v["ch4-t1-resid5-lo"], v["ch4-t1-resid5-hi"]) == (5, 61, 20, 20)
    assert v["ch4-t1-resid5"] == 20.0
    assert v["ch4-t1-last5"] == 50.0 and v["ch4-t1-oracle"] == 90.0 and v["ch4-t1-sep"] == 3
    assert v["ch4-t1-dec5"] == round(float(100 * t1["decoded"][1].mean()), 1)
    assert v["ch4-t1-ddec1"] == 0.8 and v["ch4-t1-flat5"] == 0.99
    assert set(ex4.table1_values(t1, "x")) == {k.replace("ch4-t1", "x") for k in v}
    md = ex4.table1_markdown({"a": (t1, "ch4-t1"), "b": (t1, "x")})
    assert md.count("\n| ") == 2 * (2 * 2 + 1) and "n/a" in md and "flatness" in md.split("\n\n")[-1]
    assert "\t" not in md and "\r" not in md and "\\lVert\\theta" in md        # the TeX survived Python's escapes
    assert "0.5" not in md.split("\n")[4] or "50.0 ± 0.0" in md      # ours as mean ± interval over runs
    seen = []
    ex4.table1_markdown({"a": (t1, "p")}, paper=lambda name, digits: seen.append(name) or "R")
    assert seen == ["p-last1", "p-dec1", "p-last5", "p-dec5"]
    with pytest.raises(ValueError, match="t1"):
        ex4.table1_values({"last": t1["last"]})
    with pytest.raises(ValueError, match="paper_table"):
        ex4.table1_markdown({"a": ({**t1, "local_steps": [1, 7]}, "p")})


def test_leaf_table1_small_run_reports_oracle_distances_and_flatness():
    from fedlab.data.leaf import make_leaf_synthetic

    leaf = make_leaf_synthetic((60, 40, 50), seed=3)
    t1 = ex4.leaf_table1(leaf, local_steps=(1, 2), seeds=[0, 1], num_rounds=30, batch_size=32, lr=0.05,
                         client_fraction=2 / 3, hidden=16, fit_max_iter=20, decode_max_iter=20)
    assert t1["last"].shape == t1["decoded"].shape == t1["flatness"].shape == (2, 2, 3)
    assert ((0 <= t1["last"]) & (t1["last"] <= 1)).all() and t1["oracle"].shape == (3,)
    # every client was seen, the attacks used the same number of (most recent) observations
    assert 10 <= t1["num_obs"] < 30
    # the oracle is the exact regularised optimum: its accuracy matches an independent fit
    for k, c in enumerate(leaf):
        star = mr.logistic_local_optimum(c.X, c.y, weight_decay=0.01)
        assert t1["oracle"][k] == pytest.approx(float(mr.binary_accuracy(star, c.X, c.y)))
    assert (t1["dist_last"] > 0).all() and ((0 < t1["flatness"]) & (t1["flatness"] <= 1 + 1e-12)).all()
    assert t1["residual"].shape == (2, 2, 3) and (t1["residual"] > 0).all()
    assert t1["majority"].tolist() == [max(float(c.y.float().mean()), 1 - float(c.y.float().mean())) for c in leaf]
    assert t1["heldout_loss"].shape == (2, 2, 3) and (t1["heldout_loss"] >= 0).all()
    with pytest.raises(ValueError, match="weight_decay"):
        ex4.leaf_table1(leaf, seeds=[0], num_rounds=3, weight_decay=0.0)


def test_round_sweep_runs_table1_at_each_length_and_names_values_by_position():
    from fedlab.data.leaf import make_leaf_synthetic

    leaf = make_leaf_synthetic((60, 40, 50), seed=3)
    kw = dict(batch_size=32, lr=0.05, hidden=8, fit_max_iter=5, decode_max_iter=5)
    sweep = ex4.leaf_round_sweep(leaf, (10, 14), seeds=[0], **kw)
    assert list(sweep) == [10, 14] and all(t["last"].shape == (1, 1, 3) for t in sweep.values())
    assert sweep[14]["num_obs"] == 14 and sweep[10]["num_obs"] == 10          # every round observed
    alone = ex4.leaf_table1(leaf, local_steps=(1,), seeds=[0], num_rounds=14, **kw)
    assert np.array_equal(alone["decoded"], sweep[14]["decoded"])          # one leaf_table1 per length
    v = ex4.round_sweep_values(sweep)
    assert v["ch4-rs-rounds-1"] == 14 and v["ch4-rs-last-0"] == round(100 * float(sweep[10]["last"].mean()), 1)
    assert v["ch4-rs-gain-1"] == round(100 * float(sweep[14]["decoded"].mean()) - 100 * float(sweep[14]["last"].mean()), 1)
    assert v["ch4-rs-ddec-min"] == min(v["ch4-rs-ddec-0"], v["ch4-rs-ddec-1"])
    seen = []
    md = ex4.round_sweep_markdown(sweep, lambda name, digits: seen.append(name) or "R", paper_rounds=(100, 1000))
    assert seen == ["ch4-rs-gain-0", "ch4-rs-gain-1"] and "1000 rounds: R" in md and md.count("\n") == 3
    for bad in ((), (12, 6), (1, 5)):
        with pytest.raises(ValueError, match="rounds"):
            ex4.leaf_round_sweep(leaf, bad, **kw)
    assert ex4.ROUND_SWEEP["paper"] == (100, 1000, 3000)


@pytest.mark.slow
def test_logistic_local_optimum_is_the_regularised_minimiser():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(80, 3, generator=g, dtype=torch.float64)
    y = (X[:, 0] + 0.5 * torch.randn(80, generator=g, dtype=torch.float64) > 0).long()
    lam = 0.05
    th = mr.logistic_local_optimum(X, y, weight_decay=lam)
    X1 = torch.cat([X, torch.ones(80, 1, dtype=torch.float64)], 1)
    grad = X1.T @ (torch.sigmoid(X1 @ th) - y.double()) / 80 + lam * th
    assert float(grad.norm()) < 1e-9
    # it is what FedAvg's local SGD with the same weight decay converges to (one client, full batch)
    model = models.linear_model(3, bias=True, dtype=torch.float64, seed=0)
    res = mr.fl.fedavg(model, [(X, y)], num_rounds=400, local_epochs=5, batch_size=None, lr=0.5,
                       loss_fn=models.logistic_loss, weight_decay=lam, progress=False)
    assert torch.allclose(models.flatten_params(res.params), th, atol=1e-6)
    # a separable client: the optimum exists only with weight decay, and its norm grows as lambda falls
    ys = (X[:, 0] > 0).long()
    assert mr.linearly_separable(X, ys) and not mr.linearly_separable(X, y)
    norms = [float(mr.logistic_local_optimum(X, ys, weight_decay=w).norm()) for w in (1e-1, 1e-2, 1e-3)]
    assert norms[0] < norms[1] < norms[2] and norms[2] > 3 * norms[0]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="weight_decay"):
            mr.logistic_local_optimum(X, y, weight_decay=bad)
    with pytest.raises(ValueError, match="labels"):
        mr.logistic_local_optimum(X, y + 1, weight_decay=lam)


def test_trajectory_flatness_line_and_cloud():
    g = torch.Generator().manual_seed(0)
    line = torch.linspace(0, 1, 20, dtype=torch.float64)[:, None] * torch.randn(6, generator=g, dtype=torch.float64)
    cloud = torch.randn(4000, 6, generator=g, dtype=torch.float64)
    f = mr.trajectory_flatness(torch.stack([line, cloud[:20]]))
    assert f.shape == (2,) and float(f[0]) == pytest.approx(1.0)
    assert float(mr.trajectory_flatness(cloud)) == pytest.approx(1 / 6, abs=0.05)
    with pytest.raises(ValueError, match="theta_in"):
        mr.trajectory_flatness(torch.zeros(1, 3))


def test_weight_decay_in_fedavg_is_the_regularised_gradient_step_and_zero_changes_nothing():
    from fedlab import fl

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(10, 3, generator=g), (torch.rand(10, generator=g) > 0.5).long()
    model = models.linear_model(3, bias=True, dtype=torch.float32, seed=0)
    p0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    run = lambda **kw: fl.client_update(model, p0, X, y, lr=0.1, batch_size=None, loss_fn=models.logistic_loss,  # noqa: E731
                                        generator=torch.Generator().manual_seed(1), **kw)
    plain, same = run(), run(weight_decay=0)
    assert all(torch.equal(plain[k], same[k]) for k in plain)
    wd = run(weight_decay=0.5)
    for k in plain:     # one step: theta - lr * (grad + lambda theta) = plain - lr * lambda * theta
        assert torch.allclose(wd[k], plain[k] - 0.1 * 0.5 * p0[k], atol=1e-7)
    for bad in (-0.1, float("inf"), True):
        with pytest.raises(ValueError, match="weight_decay"):
            fl.client_update(model, p0, X, y, lr=0.1, weight_decay=bad)


@pytest.mark.slow
def test_adult_experiment_values_and_count_variants():
    train = ex4.adult_phd_clients("train", num_other_clients=3)
    test = ex4.adult_phd_clients("test", num_other_clients=3)
    f = ex4.adult_experiment(train, test, targets=(0, 3), batch_sizes=(16, 64), seeds=[0, 1], num_rounds=4,
                             hidden=8, fit_max_iter=5, decode_max_iter=5)
    assert f["test_decoded"].shape == f["mapping_loss"].shape == (2, 2, 2) and f["moved"].shape == (2, 2)
    # the majority baseline: always the target's majority train label, scored on its test records
    y_tr, y_te = train[3].y.float(), test[3].y
    assert f["majority"][1] == pytest.approx(float((y_te == int(y_tr.mean() >= 0.5)).float().mean()))
    v = ex4.adult_values(f)
    assert v["ch4-fig1-phd-decoded-small"] == round(100 * float(f["test_decoded"][0][:, 0].mean()), 1)
    assert v["ch4-fig1-iid-mloss-large"] == round(float(f["mapping_loss"][-1][:, 1].mean()), 3)
    star = mr.logistic_local_optimum(train[0].X, train[0].y, weight_decay=0.01)
    assert v["ch4-obs7-oracle"] == round(100 * float(mr.binary_accuracy(star, train[0].X, train[0].y)), 1)
    assert v["ch4-obs7-global"] == round(100 * float(f["train_global"][-1][:, 0].mean()), 1)
    y0 = train[0].y.float()   # always the PhD client's majority label, on its own train records
    assert v["ch4-obs7-major"] == round(100 * max(float(y0.mean()), 1 - float(y0.mean())), 1)
    # held out (the book's extension): the same local optimum, scored on the PhD client's test records
    assert f["test_oracle"][0] == pytest.approx(float(mr.binary_accuracy(star, test[0].X, test[0].y)))
    assert v["ch4-obs7-held-oracle"] == round(100 * float(f["test_oracle"][0]), 1)
    assert v["ch4-obs7-held-global"] == round(100 * float(f["test_global"][-1][:, 0].mean()), 1)
    assert v["ch4-obs7-held-major"] == round(100 * float(f["majority"][0]), 1)    # the training-majority label
    assert v["ch4-obs7-edge-held"] == round(v["ch4-obs7-held-oracle"] - v["ch4-obs7-held-global"], 1)
    assert v["ch4-obs7-edge-in"] == round(v["ch4-obs7-oracle"] - v["ch4-obs7-global"], 1)
    with pytest.raises(ValueError, match="targets"):
        ex4.adult_values({**f, "targets": [0, 1]})
    with pytest.raises(ValueError, match="targets"):
        ex4.adult_experiment(train, test, targets=(7,), seeds=[0], num_rounds=2)
    rows = ex4.adult_count_variants()
    assert [r[:2] for r in rows if r[4] == 134] == [["adult.data", "kept"]]
    assert rows[0] == ["adult.data", "dropped", len(train[0]), len(train[1]), len(train[2])]
    assert ex4.adult_variants_markdown(rows).count("\n") == len(rows) + 1


def test_phd_distance_means_and_counts_table():
    dist = np.ones((5, 5)) - np.eye(5)
    dist[:2, 2:] = 3.0
    assert ex4.phd_distance_means(dist, num_phd=2) == (3.0, 1.0)
    with pytest.raises(ValueError, match="num_phd"):
        ex4.phd_distance_means(dist, num_phd=4)
    counts = {"ch4-adult-kept": 10, "ch4-adult-c0": 1, "ch4-adult-c1": 2, "ch4-adult-c2": 3}
    assert "| client 1 (PhD, 38-52) | 258 | 2 | n/a |" in ex4.adult_counts_markdown(counts)
    with pytest.raises(ValueError, match="counts"):
        ex4.adult_counts_markdown({"ch4-adult-kept": 10})


# ------------------------------------------------------------------------------------------------
# chapter 5
def _grads(seed=0):
    model = models.mlp(3, (4,), 2, seed=seed)
    g = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(seed + i))
         for i, (k, v) in enumerate(models.get_params(model).items())}
    return models.flatten_params(models.get_params(model)), g


def test_sanitised_gradient_is_sanitize_update_rescaled():
    theta0, g = _grads()
    assert defenses.sanitised_gradient(0, theta0, lr=0.1, rng=np.random.default_rng(0))(g) is g
    out = defenses.sanitised_gradient(2.0, theta0, lr=0.1, rng=np.random.default_rng(5))(g)
    assert out.keys() == g.keys() and all(out[k].shape == g[k].shape for k in g)
    flat = models.flatten_params(g)
    ref = dp.sanitize_update(theta0 - 0.1 * flat, theta0, 2.0, rng=np.random.default_rng(5))
    torch.testing.assert_close(models.flatten_params(out), (theta0 - ref.theta) / 0.1)
    # the noise on the gradient is rho / lr: the gradient minus it is what was drawn
    assert not torch.allclose(models.flatten_params(out), flat)


def test_sanitised_gradient_shares_one_stream_in_call_order():
    theta0, g = _grads()
    rng = np.random.default_rng(3)
    a, b = defenses.sanitised_gradient(1.0, theta0, lr=0.1, rng=rng), defenses.sanitised_gradient(5.0, theta0, lr=0.1, rng=rng)
    first, second = models.flatten_params(a(g)), models.flatten_params(b(g))
    rng2 = np.random.default_rng(3)
    flat = models.flatten_params(g)
    r1 = dp.sanitize_update(theta0 - 0.1 * flat, theta0, 1.0, rng=rng2).theta
    r2 = dp.sanitize_update(theta0 - 0.1 * flat, theta0, 5.0, rng=rng2).theta
    torch.testing.assert_close(first, (theta0 - r1) / 0.1)
    torch.testing.assert_close(second, (theta0 - r2) / 0.1)


@pytest.mark.parametrize("nu, lr, name", [(-1.0, 0.1, "nu"), (1.0, 0.0, "lr")])
def test_sanitised_gradient_rejects_bad_arguments(nu, lr, name):
    theta0, _ = _grads()
    with pytest.raises(ValueError, match=name):
        defenses.sanitised_gradient(nu, theta0, lr=lr, rng=np.random.default_rng(0))


def test_dist_to_optima_and_private_distances():
    optima = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    hyps = torch.tensor([[3.0, 4.0], [0.0, 1.0], [10.0, 10.0]])
    np.testing.assert_allclose(ex5.dist_to_optima(hyps, optima), [1.0, 0.0])
    with pytest.raises(ValueError, match="optima"):
        ex5.dist_to_optima(hyps, torch.zeros(2, 3))
    rd = lambda h: SimpleNamespace(hypotheses=torch.tensor(h))   # noqa: E731
    run = SimpleNamespace(hypotheses=torch.tensor([[0.0, 0.0], [3.0, 4.0]]),
                          rounds=[rd([[2.0, 0.0], [3.0, 4.0]]), rd([[5.0, 0.0], [3.0, 4.0]])] + [rd([[0.0, 0.0], [3.0, 4.0]])] * 8,
                          history={"val_loss": [3.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.5]})
    long, short = ex5.private_distances({7: run}, optima, patience=3)   # best round 1: the hypotheses after round 1
    assert long[7] == 0.0 and short[7] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="patience"):
        ex5.private_distances({7: run}, optima, patience=0)


def test_convergence_counts_and_markdown():
    d = {"patience 30": {0: 0.1, 1: 0.4, 2: 0.6, 3: 0.2}, "patience 6": {0: 3.0, 1: 0.49, 2: 0.5, 3: 9.0}}
    c = ex5.convergence_counts(d, threshold=0.5)
    assert (c["patience 30"]["success"], c["patience 30"]["seeds"]) == (3, 4) and c["patience 6"]["success"] == 1
    lo, hi = c["patience 30"]["interval"]
    ref = dp.clopper_pearson(3, 4)
    assert lo == pytest.approx(float(ref[0])) and hi == pytest.approx(float(ref[1])) and lo < 0.75 < hi
    md = ex5.convergence_markdown(c)
    assert "| patience 30 | 3 / 4 | 0.75 |" in md and md.count("\n") == 3
    for kwargs, name in [(dict(distances={}), "distances"), (dict(distances={"a": {}}), "distances"),
                         (dict(distances=d, threshold=0), "threshold"), (dict(distances=d, level=1.5), "level")]:
        with pytest.raises(ValueError, match=name):
            ex5.convergence_counts(**kwargs)


def test_table2_names_values_and_markdown():
    assert ex5.table2_name("acc", 0.1) == "ch5_t2cnn_acc_nu0p1" and ex5.table2_name("rel", 15) == "ch5_t2cnn_rel_nu15"
    acc = {(2, 0): 0.8, (2, 1): 0.6, (1, 0): 0.5, (1, 1): 0.4}
    assert ex5.table2_values(acc, [0, 1], 2) == {"ch5_t2cnn_acc_nu0": 0.8, "ch5_t2cnn_rel_nu0": 1.0,
                                                  "ch5_t2cnn_acc_nu1": 0.6, "ch5_t2cnn_rel_nu1": 0.6 / 0.8}
    with pytest.raises(ValueError, match="acc"):
        ex5.table2_values(acc, [0, 5], 2)
    md = ex5.table2_markdown(acc, [0, 1], 2)
    assert "| 1 | 0.834 | 1.002 | 0.600 | n/a | 0.750 | n/a |" in md
    with pytest.raises(ValueError, match="paper_table"):
        ex5.table2_markdown({**acc, (2, 2): 0.1}, [2], 2)


def test_loss_increase_bound_holds_for_a_linear_model():
    g = torch.Generator().manual_seed(0)
    X, y = torch.rand(20, 2, generator=g) * 2 - 1, torch.randn(20, generator=g)
    linear = nn.Linear(2, 1, bias=False)
    out = ex5.loss_increase_draws(linear, torch.tensor([1.0, -2.0]), X, y, [0.5, 4.0], num_draws=300, seed=1)
    assert out["increase"].shape == out["norm"].shape == out["ratio"].shape == (600,)
    assert out["ratio"].max() <= 1 + 1e-5
    with pytest.raises(ValueError, match="epsilons"):
        ex5.loss_increase_draws(linear, torch.zeros(2), X, y, [])


def test_laplace_checks_and_hypotheses():
    checks = ex5.laplace_sampler_checks([(3, 1.0)], num_draws=20_000, seed=0)
    c = checks[(3, 1.0)]
    assert abs(c["mean radius / (n/eps)"] - 1) < 0.03 and c["KS p (radius ~ Gamma)"] > 1e-3
    assert ex5.laplace_checks_markdown(checks).count("\n") == 2 + len(c) - 1
    with pytest.raises(ValueError, match="num_draws"):
        ex5.laplace_sampler_checks(num_draws=1)
    make = lambda s: models.logistic_regression(64, 10, seed=s)   # noqa: E731
    h = ex5.model_hypotheses(make, 3, seed=4)
    assert h.shape == (3, 650)
    torch.testing.assert_close(h[1], models.flatten_params(models.get_params(make(5))))
    with pytest.raises(ValueError, match="k"):
        ex5.model_hypotheses(make, 0)


# --- the grids behind Fig. 3-4 and Tables 1-2 ---
@pytest.fixture(scope="module")
def small_grid():
    from fedlab.data import clustered

    tr, _ = clustered.synthetic_linear_clusters(20, 10, seed=0)
    va, _ = clustered.synthetic_linear_clusters(10, 10, seed=1)
    make = lambda s: models.mlp(2, (), 1, seed=s)   # noqa: E731  (linear with intercept, n = 3)
    return ex5.ifca_grid(make, tr, va, settings=[(1, 0), (2, 0), (2, 5.0)], seeds=[0, 1], num_rounds=6,
                         clients_per_round=5, lr=0.1, loss_fn=models.squared_error)


def test_ifca_grid_runs_every_setting_and_seed_on_one_schedule(small_grid):
    assert sorted(small_grid) == [(1, 0.0, 0), (1, 0.0, 1), (2, 0.0, 0), (2, 0.0, 1), (2, 5.0, 0), (2, 5.0, 1)]
    for s in (0, 1):   # one seed: the same clients every round, with and without noise
        plain, noisy = small_grid[(2, 0.0, s)], small_grid[(2, 5.0, s)]
        assert [r.selected.tolist() for r in plain.rounds] == [r.selected.tolist() for r in noisy.rounds]
        assert plain.accountant is None and noisy.accountant is not None
    vals = ex5.grid_values(small_grid, "val_rmse")
    assert set(vals) == {(1, 0.0), (2, 0.0), (2, 5.0)} and vals[(2, 5.0)].shape == (2,)
    r = small_grid[(2, 0.0, 1)]
    assert vals[(2, 0.0)][1] == r.history["val_rmse"][r.best_round]
    with pytest.raises(ValueError, match="metric"):
        ex5.grid_values(small_grid, "val_auc")
    with pytest.raises(ValueError, match="settings"):
        ex5.ifca_grid(lambda s: nn.Linear(2, 1), [], [], settings=[(0, 1.0)], seeds=[0], num_rounds=1,
                      clients_per_round=1, lr=0.1)


def test_grid_budgets_table1_and_fig4(small_grid):
    b = ex5.grid_budgets(small_grid)
    assert set(b) == {(2, 5.0)}
    acct = small_grid[(2, 5.0, 0)].accountant
    assert b[(2, 5.0)]["median"][0] == pytest.approx(acct.summary()["median"])
    # n / nu per participation plus the snapping's floating-point slack (at most DEFAULT_FP_SLACK each)
    assert b[(2, 5.0)]["max"][0] == pytest.approx(acct.participations.max() * 3 / 5.0,
                                                  abs=acct.participations.max() * dp.DEFAULT_FP_SLACK)
    md = ex5.table1_markdown(b, [2], [0, 5.0])
    assert md.count("\n") == 2 and md.splitlines()[2].startswith("| 5 | 2 | n/a | n/a | ")
    md = ex5.table1_markdown({(3, 5.0): b[(2, 5.0)]}, [3], [5.0])   # the paper's entry for nu = 5, k = 3
    assert md.splitlines()[2].startswith("| 5 | 3 | 5.5 | 21.6 | ")
    with pytest.raises(ValueError, match="budgets"):
        ex5.table1_markdown(b, [3], [5.0])
    ax = ex5.plot_budget_histogram(small_grid[(2, 5.0, 0)])
    assert sum(p.get_height() for p in ax.patches) == (acct.participations > 0).sum()
    with pytest.raises(ValueError, match="private"):
        ex5.plot_budget_histogram(small_grid[(2, 0.0, 0)])
    ax = ex5.plot_grid_metric(ex5.grid_values(small_grid), [2], [0, 5.0], ylabel="RMSE")
    assert len(ax.get_xticks()) == 2


@pytest.mark.parametrize("safe", [True, False])
def test_output_privacy_loss_within_the_bound_with_power(safe):
    res = ex5.output_privacy_loss(3, 1.0, 1.5, num_draws=100_000, seed=0, safe=safe)
    assert res["max_lower"] <= res["bound"] and res["bound"] >= 1.5
    well = res["counts"].min(0) >= 200
    assert np.nanmax(np.abs(res["log_ratio"][well])) > 0.7 * res["bound"]
    for kwargs, name in [(dict(n=0), "n"), (dict(epsilon=0.0), "epsilon"), (dict(num_draws=0), "num_draws")]:
        with pytest.raises(ValueError, match=name):
            ex5.output_privacy_loss(**{**dict(n=3, epsilon=1.0, distance=1.5), **kwargs})


def test_dlg_on_sanitised_attacks_every_noise_level():
    from fedlab.attacks import gradient_inversion as gi
    from fedlab.data import images

    cnn = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
    victims = images.digit_images(1, seed=0)
    res = ex5.dlg_on_sanitised(cnn, victims.X, victims.y, [0, 1.0], lr=0.1, max_iter=3, seed=0)
    assert set(res) == {0, 1.0} and res[0]["psnr"].shape == (1,)
    with pytest.raises(ValueError, match="nus"):
        ex5.dlg_on_sanitised(cnn, victims.X, victims.y, [], lr=0.1, max_iter=3)


@pytest.mark.slow
def test_fedavg_ols_curve_exact_at_full_batch_and_not_with_mini_batches():
    g = torch.Generator().manual_seed(0)
    clients = []
    for k in range(3):
        X = torch.randn(30 + 10 * k, 3, generator=g, dtype=torch.float64) + 0.3 * k
        clients.append((X, X @ torch.randn(3, generator=g, dtype=torch.float64)
                        + 0.1 * torch.randn(len(X), generator=g, dtype=torch.float64)))
    full = ex4.fedavg_ols_curve(clients, [3, 4, 10], batch_size=None, lr=0.02, local_epochs=2, seeds=[0, 1])
    assert full["rel_err"].shape == full["rho"].shape == (2, 3)
    assert (full["rel_err"][:, 1:] < 1e-8).all() and (full["rel_err"][:, 0] > 1e-3).all()   # d + 1 = 4 rounds
    assert (full["rho"][:, 0] < 1e-12).all() and (full["rho"][:, 1:] > 0).all()              # rank-deficient at d
    mb = ex4.fedavg_ols_curve(clients, [4, 40], batch_size=5, lr=0.02, local_epochs=2, seeds=[0, 1])
    assert (mb["rel_err"] > 1e-4).all()
    with pytest.raises(ValueError, match="n_obs"):
        ex4.fedavg_ols_curve(clients, [10, 4])


@pytest.mark.slow
def test_positive_control_finds_the_optimum_and_a_broken_decoder_fails_it(monkeypatch):
    from fedlab.data.leaf import make_leaf_synthetic

    leaf = make_leaf_synthetic(seed=0)
    pc = ex4.positive_control(leaf, fit_max_iter=250, decode_max_iter=250)     # the quick notebook's setting
    assert np.median(pc["dist_decoded"]) < 0.5 < np.median(pc["dist_last"]), pc
    assert np.median(pc["heldout_loss"]) < 0.2 and pc["oracle"].mean() > pc["last"].mean()
    assert np.median(pc["residual"]) < 0.03, pc["residual"]     # it finds a zero of the fitted map
    # a decoder that returns the last model it saw (what the FedAvg results alone could not rule out) fails
    broken = lambda ti, to, **kw: mr.HeuristicResult(to[:, -1], torch.zeros(len(to)), torch.zeros(1, len(to)),  # noqa: E731
                                                     torch.zeros(len(to)))
    monkeypatch.setattr(ex4, "reconstruct_heuristic", broken)
    bad = ex4.positive_control(leaf, fit_max_iter=250, decode_max_iter=250)
    assert not np.median(bad["dist_decoded"]) < 0.5


def test_heldout_mapping_loss_separates_a_learnable_map_from_noise():
    g = torch.Generator().manual_seed(0)
    ti = torch.randn(2, 60, 3, generator=g, dtype=torch.float64)
    to = torch.stack([0.5 * ti[0], ti[1] + torch.randn(60, 3, generator=g, dtype=torch.float64)])  # affine / pure noise
    loss = mr.heldout_mapping_loss(ti, to, hidden=64, max_iter=400)
    assert float(loss[0]) < 0.05 and float(loss[1]) > 0.5, loss
    with pytest.raises(ValueError, match="holdout"):
        mr.heldout_mapping_loss(ti, to, holdout=1.0)


def _leaf_reference(sizes, seed, softmax_fn, d=10, t=2, s=5):
    """LEAF's data/synthetic/data_generator.py label step, replayed on the same NumPy draws as
    make_leaf_synthetic: labels = argmax(softmax_fn(logits))."""
    r = np.random.default_rng(seed)
    Q = r.normal(0.0, 1.0, size=(d + 1, t, s))
    sig = np.arange(1, d + 1, dtype=np.float64) ** -1.2
    centres = [r.normal(r.normal(0.0, 1.0), 1.0, size=s) for _ in range(s)]
    ys = []
    for n in sizes:
        j = int(r.choice(s, p=np.full(s, 1.0 / s)))
        w = Q @ r.normal(centres[j], 0.1)
        v = r.normal(r.normal(0.0, 1.0), 1.0, size=d)
        x = v + r.normal(size=(n, d)) * np.sqrt(sig)
        z = np.concatenate([np.ones((n, 1)), x], axis=1) @ w + r.normal(0.0, 0.1, size=(n, t))
        ys.append(np.argmax(softmax_fn(z), axis=1))
    return ys


def test_leaf_labels_are_the_fixed_softmax_over_classes_and_the_old_rule_is_a_named_variant():
    from scipy.special import softmax

    from fedlab.data.leaf import LABEL_RULES, XU_NEGLIA_SIZES, make_leaf_synthetic

    assert LABEL_RULES == ("leaf", "leaf_pre_54669fd")
    for seed in (0, 1, 4):
        fixed, old = make_leaf_synthetic(seed=seed), make_leaf_synthetic(seed=seed, label_rule="leaf_pre_54669fd")
        # LEAF since 54669fd: scipy.special.softmax(z, axis=1), a softmax over the classes
        ref_fixed = _leaf_reference(XU_NEGLIA_SIZES, seed, lambda z: softmax(z, axis=1))
        # LEAF before it: np.exp(z) / sum(np.exp(z)), Python's sum adds up the rows (the samples)
        ref_old = _leaf_reference(XU_NEGLIA_SIZES, seed, lambda z: np.exp(z) / sum(np.exp(z)))
        assert all(np.array_equal(c.y.numpy(), r) for c, r in zip(fixed, ref_fixed))
        assert all(np.array_equal(c.y.numpy(), r) for c, r in zip(old, ref_old))
        assert all(torch.equal(a.X, b.X) for a, b in zip(fixed, old))   # same inputs, only the labels differ
        assert any(not torch.equal(a.y, b.y) for a, b in zip(fixed, old))
    share = lambda cs: np.array([float(c.y.float().mean()) for c in cs])  # noqa: E731
    assert np.abs(share(make_leaf_synthetic(seed=1, label_rule="leaf_pre_54669fd")) - 0.5).max() \
        < np.abs(share(make_leaf_synthetic(seed=1)) - 0.5).max()          # the old rule balances the classes
    for bad in ("softmax", "code", "description"):
        with pytest.raises(ValueError, match="label_rule"):
            make_leaf_synthetic(seed=1, label_rule=bad)


def test_logistic_local_optimum_converges_on_every_adult_client_of_every_seed_we_record():
    # seed 3's client 3 (1031 records) stalled at gradient norm 1.03e-10 > tol before the decrement check
    for seed in (3,):
        for c in ex4.adult_phd_clients("train", seed=seed):
            th = mr.logistic_local_optimum(c.X, c.y, weight_decay=0.01)
            X1 = torch.cat([c.X.double(), torch.ones(len(c.X), 1, dtype=torch.float64)], 1)
            g = X1.T @ (torch.sigmoid(X1 @ th) - c.y.double()) / len(c.y) + 0.01 * th
            assert float(g.norm()) < 1e-8


def test_diabetes_split_and_hospital_net():
    from fedlab.data.clustered import diabetes_clients

    tr, va = ex5.diabetes_split(3)
    clinics, _ = diabetes_clients(4, seed=3)
    assert len(tr) == round(0.7 * len(clinics)) and len(tr) + len(va) == len(clinics)
    assert torch.equal(tr[0].X, clinics[0].X) and torch.equal(va[-1].y, clinics[-1].y)
    assert models.num_params(ex5.hospital_net(0)) == 11
    with pytest.raises(ValueError, match="train_share"):
        ex5.diabetes_split(0, train_share=1.0)
