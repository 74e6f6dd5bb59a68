"""Local model reconstruction (Xu & Neglia 2021) checked against closed forms and known values."""
import math

import numpy as np
import pytest
import torch

import fedlab.data as D
from fedlab import fl
from fedlab.attacks import model_reconstruction as mr
from fedlab.data.leaf import XU_NEGLIA_SIZES, make_leaf_synthetic
from fedlab.experiments.chapter4 import adult_phd_split


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors only: one intra-op thread is faster and immune to CPU oversubscription."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _client(m=30, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(m, d, generator=g, dtype=torch.float64)
    y = X @ torch.randn(d, generator=g, dtype=torch.float64) + 0.1 * torch.randn(m, generator=g, dtype=torch.float64)
    return X, y


def _observe(X, y, server, *, lr, local_epochs):
    """The client's answers to given server models, through fedlab.fl.client_update (full batch)."""
    model = mr.linear_model(X.shape[1])
    outs = []
    for theta in server:
        p = fl.client_update(model, {"weight": theta[None].clone()}, X, y, local=fl.LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=None, loss_fn=mr.squared_loss))
        outs.append(p["weight"][0].detach())
    return torch.stack(outs)


def test_observation1_recovers_W_and_the_local_optimum_exactly():
    X, y = _client()
    d, lr, E = X.shape[1], 0.05, 3
    server = torch.randn(d + 1, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    est = mr.solve_affine(server, _observe(X, y, server, lr=lr, local_epochs=E))
    W, v, star = mr.affine_update_map(X, y, lr=lr, local_steps=E)
    m, H = X.shape[0], X.T @ X
    W_closed = torch.eye(d, dtype=X.dtype) - torch.linalg.matrix_power(torch.eye(d, dtype=X.dtype) - 2 * lr / m * H, E)
    assert torch.allclose(W, W_closed)
    assert est.identifiable
    assert torch.allclose(est.W, W_closed, atol=1e-10)
    assert torch.allclose(est.v, v, atol=1e-10)
    assert torch.allclose(est.theta, torch.linalg.solve(H, X.T @ y), atol=1e-9)


def test_observation1_needs_lr_below_m_over_lambda_max():
    """W = I - (I - 2 lr H / m)^E is singular when lr = m / lambda_max and E is even (the factor of the
    top eigenvalue is -1 and (-1)^2 = 1): the paper's Lemma 4 misses this case. Just below, the
    decoding is exact again."""
    X, y = _client(m=30, d=4, seed=6)
    d, m, E = X.shape[1], X.shape[0], 2
    lam_max = float(torch.linalg.eigvalsh(X.T @ X).max())
    star = mr.local_optimum(X, y)
    server = torch.randn(d + 1, d, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    lr_edge = m / lam_max
    W, _, _ = mr.affine_update_map(X, y, lr=lr_edge, local_steps=E)
    assert float(torch.linalg.svdvals(W).min()) < 1e-12 * float(torch.linalg.svdvals(W).max())
    assert int(torch.linalg.matrix_rank(W, rtol=1e-10)) == d - 1
    est = mr.solve_affine(server, _observe(X, y, server, lr=lr_edge, local_epochs=E))
    assert est.identifiable                     # (W, v) are still determined by the d + 1 rounds ...
    assert float((est.theta - star).norm() / star.norm()) > 1e-3   # ... but W^{-1} v is not theta_c*
    for lr in (0.99 * lr_edge, 0.9 * lr_edge):
        W, _, _ = mr.affine_update_map(X, y, lr=lr, local_steps=E)
        assert int(torch.linalg.matrix_rank(W, rtol=1e-10)) == d
        est = mr.solve_affine(server, _observe(X, y, server, lr=lr, local_epochs=E))
        assert float((est.theta - star).norm() / star.norm()) < 1e-8
    # an odd number of steps keeps W invertible even at the edge
    W3, _, _ = mr.affine_update_map(X, y, lr=lr_edge, local_steps=3)
    assert int(torch.linalg.matrix_rank(W3, rtol=1e-10)) == d


def test_d_rounds_do_not_identify_the_local_model():
    X, y = _client()
    d = X.shape[1]
    server = torch.randn(d, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = _observe(X, y, server, lr=0.05, local_epochs=2)
    assert not mr.solve_affine(server, out).identifiable
    target = torch.full((d,), 7.0, dtype=torch.float64)
    W2, v2 = mr.consistent_decoding(server, out, target)
    assert torch.allclose(server @ W2.T - v2, server - out, atol=1e-10)   # explains every observation
    assert torch.allclose(torch.linalg.solve(W2, v2), target, atol=1e-8)  # ... yet decodes to target
    with pytest.raises(ValueError, match="identifies"):
        mr.consistent_decoding(torch.cat([server, server[:1] + 1]), torch.cat([out, out[:1]]), target)


def test_symmetry_of_W_leaves_exactly_one_free_direction_at_d_rounds():
    X, y = _client()
    d = X.shape[1]
    server = torch.randn(d + 1, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    dims = [mr.symmetric_null_dimension(server[:n]) for n in (d - 1, d, d + 1)]
    assert dims == [3, 1, 0], dims          # k (k + 1) / 2 free directions with k = d + 1 - n
    # the free direction at d rounds: W + c z z^T, v + c z_0 z fits the data, stays symmetric, and
    # moves the decoded model off theta_c*
    out = _observe(X, y, server[:d], lr=0.05, local_epochs=2)
    W, v, star = mr.affine_update_map(X, y, lr=0.05, local_steps=2)
    A = torch.cat([server[:d], -torch.ones(d, 1, dtype=torch.float64)], 1)
    z = torch.linalg.svd(A, full_matrices=True).Vh[-1]
    W2, v2 = W + 0.3 * torch.outer(z[:d], z[:d]), v + 0.3 * z[d] * z[:d]
    assert torch.allclose(W2, W2.T) and torch.allclose(server[:d] @ W2.T - v2, server[:d] - out, atol=1e-10)
    assert float((torch.linalg.solve(W2, v2) - star).norm()) > 1e-3
    with pytest.raises(ValueError, match="theta_in"):
        mr.symmetric_null_dimension(server[None])


def test_hard_instance_structure_and_optimum():
    d = 6
    X, y = mr.hard_instance(d)
    H = X.T @ X
    want = torch.eye(d, dtype=H.dtype) - 0.5 * (torch.diag(torch.ones(d - 1), 1) + torch.diag(torch.ones(d - 1), -1)).double()
    assert torch.allclose(H, want)
    assert torch.allclose(X.T @ y, 0.5 * torch.eye(d, dtype=H.dtype)[0])
    assert torch.allclose(mr.local_optimum(X, y), mr.hard_instance_optimum(d))
    Xt, yt = mr.hard_instance(d, truncated=True)
    Ht = Xt.T @ Xt
    # the alternative client: H with the last coupling removed, still full rank with its own optimum
    want_t = want.clone()
    want_t[-1, -2] = want_t[-2, -1] = 0.0
    assert torch.allclose(Ht, want_t) and torch.allclose(Xt.T @ yt, X.T @ y)
    assert int(torch.linalg.matrix_rank(Ht)) == d and float(torch.linalg.eigvalsh(Ht).min()) > 0.1
    star_t = torch.linalg.solve(Ht, Xt.T @ yt)
    assert torch.allclose(star_t, mr.hard_instance_optimum(d, truncated=True))
    assert float((star_t - mr.hard_instance_optimum(d)).norm()) > 0.1
    with pytest.raises(ValueError, match="d must"):
        mr.hard_instance(1)


def _hard_run(d, truncated, local_epochs=1, rounds=None):
    model = mr.linear_model(d)
    zero = {"weight": torch.zeros(1, d, dtype=torch.float64)}
    _, spy = mr.run_eavesdropped_fedavg(model, mr.hard_instance_clients(d, 3, truncated=truncated),
                                        targets=[0], num_rounds=rounds or d, local=fl.LocalTraining(lr=0.3, local_epochs=local_epochs, batch_size=None, loss_fn=mr.squared_loss),
                                        params=zero)
    return spy.observations(0)


def test_hard_instance_zero_pattern_and_indistinguishability():
    d = 7
    ti, to, _ = _hard_run(d, truncated=False)
    for t in range(d):  # round t+1: the server model has support in the first t coordinates exactly
        assert torch.count_nonzero(ti[t, t:]) == 0 and torch.count_nonzero(to[t, t + 1:]) == 0
        assert torch.count_nonzero(to[t, : t + 1]) == t + 1
    ti2, to2, _ = _hard_run(d, truncated=True)
    assert torch.equal(ti[: d - 1], ti2[: d - 1]) and torch.equal(to[: d - 1], to2[: d - 1])
    assert not torch.equal(to[d - 1], to2[d - 1])
    # with E local steps per round the support grows by E coordinates per round
    _, toE, _ = _hard_run(d, truncated=False, local_epochs=2, rounds=3)
    assert torch.count_nonzero(toE[0, 2:]) == 0 and torch.count_nonzero(toE[1, 4:]) == 0


def test_observation6_lower_bound_and_ols_rate():
    X, y = _client(m=80, d=3, seed=3)
    lr = mr.max_lr(X, 4.0)
    r = mr.ols_error_curve(X, y, [10, 40, 160], lr=lr, noise=mr.NoiseModel(sigma=1.0, local_steps=2), trials=200, seed=0)
    lb = mr.obs6_lower_bound(3, r["n_obs"], lr=lr, sigma=1.0, local_steps=2)
    assert (r["mse"] > lb).all()
    slope = np.polyfit(np.log(r["n_obs"]), np.log(r["mse"]), 1)[0]
    assert -1.5 < slope < -0.7, slope        # the error shrinks like 1 / n_c
    with pytest.raises(ValueError, match="exactly one"):
        mr.ols_error_curve(X, y, [10], lr=lr)
    with pytest.raises(ValueError, match="NoiseModel.sigma"):
        mr.NoiseModel(sigma=-1.0)
    with pytest.raises(ValueError, match="NoiseModel.local_steps"):
        mr.NoiseModel(sigma=1.0, local_steps=0)
    with pytest.raises(ValueError, match="HeuristicSettings.hidden"):
        mr.HeuristicSettings(hidden=0)
    with pytest.raises(ValueError, match="n_obs"):
        mr.obs6_lower_bound(3, [0], lr=lr, sigma=1.0, local_steps=1)


@pytest.mark.slow
def test_observation6_bound_is_nearly_tight_for_isotropic_H_and_fails_beyond():
    """H = lambda I, lr = m / (4 lambda), S = 10 local steps: the known-W risk equals
    4 d lr^2 sigma^2 (1 - 4^-S) / (555 n) times 185 / (d (1 - 2^-S)^2), so the printed bound is nearly
    attained at d = 185 and exceeds what OLS achieves at d = 250 (its proof counts d twice)."""
    S = 10
    for d, n, lo, hi in ((185, 2500, 0.95, 1.25), (250, 3000, 0.6, 0.95)):
        X = math.sqrt(d) / 2 * torch.eye(d, dtype=torch.float64)          # lambda = d / 4, lr = m / (4 lambda) = 1
        y = X @ torch.randn(d, generator=torch.Generator().manual_seed(d), dtype=torch.float64)
        lr = mr.max_lr(X, 4.0)
        assert lr == pytest.approx(1.0)
        exact = mr.obs6_known_map_risk(X, [n], lr=lr, sigma=1.0, local_steps=S)
        lower = mr.obs6_lower_bound(d, [n], lr=lr, sigma=1.0, local_steps=S)
        assert exact[0] / lower[0] == pytest.approx(185 / (d * (1 - 2.0 ** -S) ** 2), rel=1e-9)
        mse = mr.ols_error_curve(X, y, [n], lr=lr, noise=mr.NoiseModel(sigma=1.0, local_steps=S), trials=3, seed=0)["mse"]
        assert lo < mse[0] / lower[0] < hi, (d, mse[0] / lower[0])
        assert 1.0 < mse[0] / exact[0] < 1.2, (d, mse[0] / exact[0])


def test_ols_attains_the_known_map_risk_on_a_random_design():
    X, y = _client(m=200, d=6, seed=11)
    lr = mr.max_lr(X, 4.0)
    r = mr.ols_error_curve(X, y, [300], lr=lr, noise=mr.NoiseModel(sigma=1.0, local_steps=2), trials=300, seed=0)
    exact = mr.obs6_known_map_risk(X, [300], lr=lr, sigma=1.0, local_steps=2)
    assert 0.95 < r["mse"][0] / exact[0] < 1.15, r["mse"][0] / exact[0]
    with pytest.raises(ValueError, match="singular"):
        mr.obs6_known_map_risk(X, [10], lr=X.shape[0] / float(torch.linalg.eigvalsh(X.T @ X).max()),
                               sigma=1.0, local_steps=2)
    with pytest.raises(ValueError, match="n_obs"):
        mr.obs6_known_map_risk(X, [0], lr=lr, sigma=1.0, local_steps=1)
    with pytest.raises(ValueError, match="local_steps"):
        mr.obs6_known_map_risk(X, [5], lr=lr, sigma=1.0, local_steps=0)


def test_minibatch_local_sgd_matches_client_update_and_variance_formula():
    X, y = _client(m=12, d=3, seed=4)
    server = torch.randn(2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    full = mr.minibatch_local_sgd(server, X, y, lr=0.05, batch_size=12, local_epochs=3)
    assert torch.allclose(full, _observe(X, y, server, lr=0.05, local_epochs=3), atol=1e-12)
    theta = torch.zeros(3, dtype=torch.float64)
    assert mr.minibatch_gradient_variance(X, y, theta, 12) == 0.0
    # Monte Carlo check of the finite-population variance formula for b = 4
    g_full = 2 / 12 * X.T @ (X @ theta - y)
    gen = torch.Generator().manual_seed(0)
    idx = torch.argsort(torch.rand(20000, 12, generator=gen), 1)[:, :4]
    Xb, yb = X[idx], y[idx]
    gb = 2 / 4 * torch.einsum("nbd,nb->nd", Xb, torch.einsum("nbd,d->nb", Xb, theta) - yb)
    mc = float(((gb - g_full) ** 2).sum(1).mean())
    assert abs(mc / mr.minibatch_gradient_variance(X, y, theta, 4) - 1) < 0.05


def test_heuristic_recovers_a_linear_update_map():
    X, y = _client(m=40, d=3, seed=5)
    g = torch.Generator().manual_seed(0)
    star = mr.local_optimum(X, y)
    server = star + 2.0 * torch.randn(60, 3, generator=g, dtype=torch.float64)
    out = mr.minibatch_local_sgd(server, X, y, lr=0.1, batch_size=40)
    res = mr.reconstruct_heuristic(server, out, hidden=100, fit_max_iter=500, decode_max_iter=500, seed=0)
    start = out[-1]
    assert res.mapping_loss < 0.05
    assert (res.theta - star).norm() < 0.25 * (start - star).norm()
    assert res.residual.shape == () and float(res.residual) < 0.02          # a zero of G was found
    # without decoding steps: the same fitted map (same seed) at the last returned model, over the RMS update
    stay = mr.reconstruct_heuristic(server, out, hidden=100, fit_max_iter=500, decode_max_iter=0, seed=0)
    G, _ = mr.fit_mapping(server, out, hidden=100, max_iter=500, seed=0)
    delta = server - out
    with torch.no_grad():
        expect = float(G(out[-1][None, None])[0, 0].norm() / delta.pow(2).sum(1).mean().sqrt())
    assert abs(float(stay.residual) - expect) < 1e-4 * expect and expect > 0.3, (float(stay.residual), expect)


def test_eavesdropper_sees_only_rounds_with_the_target():
    X, y = _client()
    clients = [(X, y), _client(seed=9), _client(seed=10)]
    _, spy = mr.run_eavesdropped_fedavg(mr.linear_model(4), clients, targets=[1], num_rounds=12,
                                        client_fraction=0.34, local=fl.LocalTraining(lr=0.05, batch_size=None, loss_fn=mr.squared_loss), seed=0)
    ti, to, rounds = spy.observations(1)
    assert 0 < len(rounds) < 12 and ti.shape == to.shape == (len(rounds), 4)
    with pytest.raises(ValueError, match="never observed"):
        spy.observations(0)


def test_eavesdropped_fedavg_reveals_the_local_optimum_exactly():
    """Observation 1 end to end: FedAvg with client sampling and full-batch local GD through
    fedlab.fl.fedavg; d + 1 rounds seen by the Eavesdropper give the target's local optimum."""
    d = 4
    clients = [_client(m=30 + 10 * k, d=d, seed=20 + k) for k in range(4)]
    _, spy = mr.run_eavesdropped_fedavg(mr.linear_model(d, seed=0), clients, targets=[2], num_rounds=40,
                                        client_fraction=0.5, local=fl.LocalTraining(lr=0.02, local_epochs=3, batch_size=None, loss_fn=mr.squared_loss), seed=1)
    assert spy.num_observations(2) >= d + 1
    ti, to, rounds = spy.observations(2, max_obs=d + 1)
    assert ti.shape == to.shape == (d + 1, d) and (np.diff(rounds) > 0).all()
    star = mr.local_optimum(*clients[2])
    est = mr.solve_affine(ti, to)
    assert est.identifiable
    assert float((est.theta - star).norm() / star.norm()) < 1e-8
    W, _, _ = mr.affine_update_map(*clients[2], lr=0.02, local_steps=3)
    assert torch.allclose(est.W, W, atol=1e-8)
    # d rounds are not enough: the minimum-norm decoding is off
    assert not mr.solve_affine(ti[:d], to[:d]).identifiable


def test_bad_inputs_raise():
    X, y = _client()
    with pytest.raises(ValueError, match="lr"):
        mr.affine_update_map(X, y, lr=0.0, local_steps=1)
    with pytest.raises(ValueError, match="local_steps"):
        mr.affine_update_map(X, y, lr=0.1, local_steps=0)
    with pytest.raises(ValueError, match="theta_in"):
        mr.solve_affine(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="batch_size"):
        mr.minibatch_local_sgd(torch.zeros(1, 4, dtype=torch.float64), X, y, lr=0.1, batch_size=0)


def test_leaf_synthetic_shapes_counts_and_determinism():
    cl = make_leaf_synthetic(seed=3)
    assert [len(c) for c in cl] == list(XU_NEGLIA_SIZES) == [280, 184, 1536, 256, 208]
    for c in cl:
        assert c.X.shape == (len(c), 10) and c.X.dtype == torch.float32
        assert set(c.y.unique().tolist()) <= {0, 1} and 0 <= c.meta["cluster"] < 5
        assert c.meta["w"].shape == (11, 2)
    again = make_leaf_synthetic(seed=3)
    assert all(torch.equal(a.X, b.X) and torch.equal(a.y, b.y) for a, b in zip(cl, again))
    # feature variance of a client is Sigma_jj = j^-1.2 (inputs ~ N(v_k, Sigma))
    var = cl[2].X.double().var(0).numpy()
    assert np.allclose(var, np.arange(1, 11) ** -1.2, rtol=0.15)
    big = make_leaf_synthetic([7, 9], num_features=4, num_classes=3, num_clusters=2, seed=0)
    assert big[0].X.shape == (7, 4) and big[1].meta["w"].shape == (5, 3)
    with pytest.raises(ValueError, match="client_sizes"):
        make_leaf_synthetic([10, 0])
    with pytest.raises(ValueError, match="num_classes"):
        make_leaf_synthetic(num_classes=1)
    with pytest.raises(ValueError, match="prob_clusters"):
        make_leaf_synthetic(prob_clusters=[0.5, 0.5])


def test_adult_rows_and_missing_file(tmp_path, monkeypatch):
    assert len(D.load_adult("train", drop_missing=False)) == 32561
    assert len(D.load_adult("test", drop_missing=False)) == 16281
    monkeypatch.setattr(D, "VENDOR", tmp_path)
    with pytest.raises(FileNotFoundError, match="adult"):
        D.load_adult("train")


def test_adult_phd_split():
    ds = D.load_adult("train")
    edu, age = ds.meta["education"], ds.meta["age"]
    parts = adult_phd_split(edu, age, seed=0)
    assert len(parts) == 10
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx))
    keep = np.isin(edu, ["Bachelors", "Masters", "Prof-school", "Doctorate"])
    assert len(allidx) == keep.sum()
    assert (edu[parts[0]] == "Doctorate").all() and (age[parts[0]] < 38).all()
    assert ((age[parts[1]] >= 38) & (age[parts[1]] <= 52)).all() and (age[parts[2]] > 52).all()
    assert not np.isin(edu[np.concatenate(parts[3:])], ["Doctorate"]).any()
    sizes = [len(p) for p in parts[3:]]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="num_other_clients"):
        adult_phd_split(edu, age, num_other_clients=0)
    with pytest.raises(ValueError, match="length"):
        adult_phd_split(edu[:5], age[:4])


def _fedavg_with_spy(model, clients, **kw):
    spy = mr.Eavesdropper(None)
    res = fl.fedavg(model, clients, callback=spy, **kw)
    return res, spy


@pytest.mark.parametrize("case", ["logistic", "logistic_sampled", "squared_minibatch", "squared_full", "squared_decay"])
def test_linear_fast_path_equals_fedavg_bit_for_bit(case):
    """run_eavesdropped_fedavg's loop without vmap (_linear_fedavg) must give fl.fedavg's numbers exactly:
    the stored paper-scale records of chapter 4 were made with fl.fedavg."""
    g = torch.Generator().manual_seed(3)
    if case.startswith("logistic"):
        leaf = make_leaf_synthetic([60, 45, 130, 20], seed=1)
        clients = [(c.X.float(), c.y) for c in leaf]
        model = mr.linear_model(10, bias=True, dtype=torch.float32, seed=2)
        kw = dict(num_rounds=6, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=32, local_steps=4, weight_decay=0.01, loss_fn=mr.logistic_loss), seed=5,
                  client_fraction=0.5 if case == "logistic_sampled" else 1.0)
    else:
        clients = []
        for k in range(4):
            X = torch.randn(15 + 7 * k, 6, generator=g, dtype=torch.float64) + 0.3 * k
            clients.append((X, X @ torch.randn(6, generator=g, dtype=torch.float64)))
        model = mr.linear_model(6, seed=4)
        kw = dict(num_rounds=7, client_fraction=0.75, local=fl.LocalTraining(lr=0.02, local_epochs=2, batch_size=None if case == "squared_full" else 4, weight_decay=0.1 if case == "squared_decay" else 0.0, loss_fn=mr.squared_loss), seed=9)
    assert mr._linear_fast_path_applies(model, clients, kw)
    ref, ref_spy = _fedavg_with_spy(model, clients, **kw)
    res, spy = mr.run_eavesdropped_fedavg(model, clients, **kw)
    assert all(torch.equal(ref.params[k], res.params[k]) for k in ref.params)
    assert set(spy._log) == set(ref_spy._log)
    for c in ref_spy._log:
        a, b = ref_spy.observations(c), spy.observations(c)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2])


def test_linear_fast_path_falls_back_where_it_does_not_apply():
    clients = [(torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)) for _ in range(3)]
    lin = mr.linear_model(3)
    assert not mr._linear_fast_path_applies(lin, clients, {"num_rounds": 2, "client_fraction": 0.3,
                                                          "loss_fn": mr.squared_loss})   # one client a round
    assert not mr._linear_fast_path_applies(lin, clients, {"num_rounds": 2})           # cross-entropy
    assert not mr._linear_fast_path_applies(torch.nn.Linear(3, 2).double(), clients,
                                            {"num_rounds": 2, "loss_fn": mr.squared_loss})
    assert not mr._linear_fast_path_applies(lin, clients, {"num_rounds": 2, "loss_fn": mr.squared_loss,
                                                          "eval_data": clients[0]})
    with pytest.raises(ValueError, match="client_fraction"):   # fl.fedavg's own error
        mr.run_eavesdropped_fedavg(lin, clients, num_rounds=2, client_fraction=1.5, local=fl.LocalTraining(loss_fn=mr.squared_loss))
    with pytest.raises(ValueError, match="batch_size"):
        mr.run_eavesdropped_fedavg(lin, clients, num_rounds=2, local=fl.LocalTraining(batch_size=0, loss_fn=mr.squared_loss))


def test_fast_batch_plan_equals_fl_batch_plan():
    from fedlab.fl._linear import batch_plan as fast_plan

    rng = np.random.default_rng(0)
    for trial in range(60):
        n = torch.tensor(rng.integers(1, 30, size=int(rng.integers(1, 5))))
        B = [None, 1, 3, 8, 64][trial % 5]
        steps = [None, 1, 2, 7][trial % 4]
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        a, b = fl.batch_plan(n, B, 1 + trial % 3, g1, steps), fast_plan(n, B, 1 + trial % 3, g2, steps)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert torch.equal(torch.rand(2, generator=g1), torch.rand(2, generator=g2))   # same draws used


@pytest.mark.parametrize("shape", [(3, 12, 5, 11), (4, 20, 11, 100), (2, 10, 30, 64)])
def test_mapping_fit_and_decode_equal_autograd_and_torch_adam(shape):
    """fit_mapping / minimise_mapping write the gradient and Adam's step out; they must match autograd
    with torch.optim.Adam bit for bit (the stored records were made with the latter)."""
    from oracles import mapping_fit_autograd, mapping_minimise_autograd

    P, n, d, H = shape
    g = torch.Generator().manual_seed(sum(shape))
    ti = 3 * torch.randn(P, n, d, generator=g, dtype=torch.float64)
    to = 0.8 * ti + 0.1 * torch.randn(P, n, d, generator=g, dtype=torch.float64)
    G_ref, curve_ref = mapping_fit_autograd(ti, to, hidden=H, max_iter=25, seed=7)
    G, curve = mr.fit_mapping(ti, to, hidden=H, max_iter=25, seed=7)
    assert torch.equal(curve, curve_ref)
    assert all(torch.equal(a, b) for a, b in zip(G.parameters(), G_ref.parameters()))
    assert torch.equal(mr.minimise_mapping(G, to[:, -1], max_iter=30),
                       mapping_minimise_autograd(G_ref, to[:, -1], max_iter=30))


def test_local_optimum_is_the_same_bits_wherever_the_data_sit_in_memory():
    """LAPACK's default CPU driver for least squares (gelsy) answers differently in the last bits for the
    same matrix at another memory offset; the matrix's eavesdropper row was not reproducible bit for bit
    because of it. The local optimum must not depend on where X lies."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(80, 10, generator=g, dtype=torch.float64) + 0.6
    y = X @ torch.randn(10, generator=g, dtype=torch.float64) + 0.1 * torch.randn(80, generator=g, dtype=torch.float64)
    outs = []
    for off in range(8):
        buf = torch.empty(X.numel() + 8, dtype=torch.float64)
        Xo = buf[off:off + X.numel()].view(X.shape)
        Xo.copy_(X)
        outs.append(mr.local_optimum(Xo, y))
    assert all(torch.equal(o, outs[0]) for o in outs), [float((o - outs[0]).abs().max()) for o in outs]
    assert torch.allclose(outs[0], torch.linalg.solve(X.T @ X, X.T @ y), rtol=1e-10, atol=1e-12)
