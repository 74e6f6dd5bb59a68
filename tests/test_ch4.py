"""Chapter 4's experiment helpers (fedlab.experiments.chapter4) and the parts of fedlab.attacks.model_reconstruction
they stand on: the hard instance of Xu & Neglia's Observation 2, the Table 1 bookkeeping, the Adult and LEAF
experiments, the FedAvg OLS curve and the positive control of the decoder."""
import numpy as np
import pytest
import torch

from fedlab import fl, models
from fedlab.attacks import model_reconstruction as mr
from fedlab.experiments import chapter4 as ex4


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
                         client_fraction=2 / 3, attack=mr.HeuristicSettings(hidden=16, fit_max_iter=20, decode_max_iter=20))
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
    kw = dict(batch_size=32, lr=0.05, attack=mr.HeuristicSettings(hidden=8, fit_max_iter=5, decode_max_iter=5))
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
    res = fl.fedavg(model, [(X, y)], num_rounds=400, local=fl.LocalTraining(
        lr=0.5, local_epochs=5, batch_size=None, weight_decay=lam, loss_fn=models.logistic_loss))
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
    run = lambda **kw: fl.client_update(  # noqa: E731
        model, p0, X, y, local=fl.LocalTraining(lr=0.1, batch_size=None, loss_fn=models.logistic_loss, **kw),
        generator=torch.Generator().manual_seed(1))
    plain, same = run(), run(weight_decay=0)
    assert all(torch.equal(plain[k], same[k]) for k in plain)
    wd = run(weight_decay=0.5)
    for k in plain:     # one step: theta - lr * (grad + lambda theta) = plain - lr * lambda * theta
        assert torch.allclose(wd[k], plain[k] - 0.1 * 0.5 * p0[k], atol=1e-7)
    for bad in (-0.1, float("inf"), True):
        with pytest.raises(ValueError, match="weight_decay"):
            fl.client_update(model, p0, X, y, local=fl.LocalTraining(lr=0.1, batch_size=None, weight_decay=bad))


@pytest.mark.slow
def test_adult_experiment_values_and_count_variants():
    train = ex4.adult_phd_clients("train", num_other_clients=3)
    test = ex4.adult_phd_clients("test", num_other_clients=3)
    f = ex4.adult_experiment(train, test, targets=(0, 3), batch_sizes=(16, 64), seeds=[0, 1], num_rounds=4,
                             attack=mr.HeuristicSettings(hidden=8, fit_max_iter=5, decode_max_iter=5))
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
    pc = ex4.positive_control(leaf, attack=mr.HeuristicSettings(fit_max_iter=250, decode_max_iter=250))   # the quick page's
    assert np.median(pc["dist_decoded"]) < 0.5 < np.median(pc["dist_last"]), pc
    assert np.median(pc["heldout_loss"]) < 0.2 and pc["oracle"].mean() > pc["last"].mean()
    assert np.median(pc["residual"]) < 0.03, pc["residual"]     # it finds a zero of the fitted map
    # a decoder that returns the last model it saw (what the FedAvg results alone could not rule out) fails
    broken = lambda ti, to, **kw: mr.HeuristicResult(to[:, -1], torch.zeros(len(to)), torch.zeros(1, len(to)),  # noqa: E731
                                                     torch.zeros(len(to)))
    monkeypatch.setattr(ex4, "reconstruct_heuristic", broken)
    # the broken run's claim reads dist_decoded only: its held-out mapping loss (a 250-step MLP fit on the same
    # observations, 1.5 s of CPU, the decoder plays no part in it) is not fitted again
    monkeypatch.setattr(mr, "heldout_mapping_loss", lambda tin, tout, **kw: torch.full((len(tin),), float("nan")))
    bad = ex4.positive_control(leaf, attack=mr.HeuristicSettings(fit_max_iter=250, decode_max_iter=250))
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
