"""Chapter 5's experiment helpers (fedlab.experiments.chapter5) and the defense it attacks: the sanitised
update that DLG attacks (Galli et al., Sec. 4.3; fedlab.privacy.defenses.sanitised_gradient), the distance to
the optima, the convergence counts, the Table 2 bookkeeping, the IFCA grids behind Fig. 3-4 and Tables 1-2, and
the diabetes split."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedlab import fl, models
from fedlab.experiments import chapter5 as ex5
from fedlab.privacy import defenses
from fedlab.privacy import dprivacy as dp


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
    seen = {}

    def paper(name, **kw):
        seen[name] = kw
        return name
    ex5.table2_markdown(acc, [1], 2, paper=paper)
    assert seen == {"ch5_t2cnn_acc_nu1": {"value_range": (0, 1)}, "ch5_t2cnn_rel_nu1": {}}   # accuracy in [0, 1]
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
                         clients_per_round=5, local=fl.LocalTraining(lr=0.1, loss_fn=models.squared_error))


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
                      clients_per_round=1)


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


def test_diabetes_split_and_hospital_net():
    from fedlab.data.clustered import diabetes_clients

    tr, va = ex5.diabetes_split(3)
    clinics, _ = diabetes_clients(4, seed=3)
    assert len(tr) == round(0.7 * len(clinics)) and len(tr) + len(va) == len(clinics)
    assert torch.equal(tr[0].X, clinics[0].X) and torch.equal(va[-1].y, clinics[-1].y)
    assert models.num_params(ex5.hospital_net(0)) == 11
    with pytest.raises(ValueError, match="train_share"):
        ex5.diabetes_split(0, train_share=1.0)


def test_agreement_counts_clients_up_to_swapping_the_cluster_names():
    """05b compares the server's k-means clusters with the clients' own IFCA choices and with the true groups:
    cluster names are arbitrary, so 1 - x scores as x; bad labellings raise."""
    from fedlab.experiments import chapter5 as ex5

    assert ex5.agreement([0, 1, 1, 0], [1, 0, 0, 1]) == 1.0
    assert ex5.agreement([0, 1, 1, 0], [0, 1, 1, 1]) == 0.75 == ex5.agreement([0, 1, 1, 0], [1, 0, 0, 0])
    for a, b in (([0, 1], [0, 1, 1]), ([], []), ([0, 2], [0, 1])):
        with pytest.raises(ValueError, match="labels"):
            ex5.agreement(a, b)
