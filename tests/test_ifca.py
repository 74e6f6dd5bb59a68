"""IFCA (Ghosh et al. 2020), Galli et al. Algorithm 1 and the clustered data sets."""
import csv

import numpy as np
import pytest
import torch
from torch import nn

from fedlab.fl import LocalTraining
from fedlab import models
from fedlab.data import OfflineError, clustered
from fedlab.fl import ifca as I
from fedlab.privacy import dprivacy as dp


@pytest.fixture(scope="module")
def synthetic():
    tr, mem = clustered.synthetic_linear_clusters(40, 10, seed=0)
    va, _ = clustered.synthetic_linear_clusters(20, 10, seed=1)
    return tr, mem, va


def _linear():
    return nn.Linear(2, 1, bias=False)


def test_synthetic_clusters_follow_the_generating_model(synthetic):
    tr, mem, _ = synthetic
    assert len(tr) == 40 and tr[0].X.shape == (10, 2) and tr[0].y.dtype == torch.float32
    assert np.bincount(mem).tolist() == [20, 20]
    for c, d in enumerate(tr):
        u = d.y - d.X @ clustered.THETA_STAR[mem[c]]
        assert (u >= 0).all() and (u < 1).all()           # y = x^T theta* + u, u ~ U[0, 1)


def test_hypothesis_losses_match_a_loop(synthetic):
    tr, _, _ = synthetic
    model = _linear()
    hyps = torch.tensor([[5.0, 6.0], [4.0, -4.5], [0.0, 0.0]])
    L = I.hypothesis_losses(model, hyps, tr[:5], loss_fn=I.squared_error)
    for c in range(5):
        for j in range(3):
            mse = ((tr[c].X @ hyps[j] - tr[c].y) ** 2).mean()
            assert float(L[c, j]) == pytest.approx(float(mse), rel=1e-5)
    ev = I.evaluate_hypotheses(model, hyps, tr[:5], loss_fn=I.squared_error)
    assert ev["assignment"].tolist() == L.argmin(1).tolist()


def test_one_round_with_one_cluster_is_unweighted_fedavg(synthetic):
    tr, _, _ = synthetic
    model = _linear()
    init = torch.tensor([[1.0, -1.0]])
    res = I.ifca(model, tr, hypotheses=I.Hypotheses(1, init=init), num_rounds=1, clients_per_round=5,
                 local=LocalTraining(lr=0.1, batch_size=None, loss_fn=I.squared_error), seed=3)
    sel = res.rounds[0].selected
    manual = []
    for c in sel:   # full-batch GD step on the MSE: theta - lr * 2 X^T (X theta - y) / n
        X, y = tr[c].X, tr[c].y
        manual.append(init[0] - 0.1 * 2 * X.T @ (X @ init[0] - y) / len(y))
    torch.testing.assert_close(res.final[0], torch.stack(manual).mean(0))


def test_ifca_recovers_both_optima_where_fedavg_cannot(synthetic):
    tr, _, va = synthetic
    model = _linear()
    init = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    common = dict(num_rounds=30, clients_per_round=10, local=LocalTraining(lr=0.3, batch_size=10, loss_fn=I.squared_error),
                  validation=I.Validation(va), seed=0)
    res = I.ifca(model, tr, hypotheses=I.Hypotheses(2, init=init), **common)
    dist = torch.cdist(res.hypotheses, clustered.THETA_STAR)
    assert float(dist.min(0).values.max()) < 0.3, res.hypotheses
    avg = I.ifca(model, tr, hypotheses=I.Hypotheses(1, init=init[:1]), **common)
    assert float(torch.cdist(avg.hypotheses, clustered.THETA_STAR).min()) > 3.0
    assert res.history["val_rmse"][res.best_round] < 0.7 < avg.history["val_rmse"][avg.best_round]


def test_private_ifca_accounts_n_over_nu_per_participation(synthetic):
    tr, _, _ = synthetic
    model = _linear()
    nu = 5.0
    res = I.private_ifca(model, tr, hypotheses=I.Hypotheses(2), privacy=I.DPrivacy(nu), num_rounds=12, clients_per_round=7,
                         local=LocalTraining(loss_fn=I.squared_error), seed=1)
    acct = res.accountant
    for rd in res.rounds:
        assert np.array_equal(rd.leakage, np.full(len(rd.selected), 2 / nu))
    # n / nu per participation plus the snapping's floating-point slack, charged and kept apart
    np.testing.assert_allclose(acct.spent, acct.participations * (2 / nu) + acct.fp_spent)
    assert (acct.fp_spent[acct.participations > 0] > 0).all()
    assert (acct.fp_spent <= acct.participations * dp.DEFAULT_FP_SLACK).all()
    assert acct.participations.sum() == 12 * 7
    # what the server saw is not what the clients trained: the released vectors carry noise
    assert res.rounds[0].released.shape == (7, 2)


def test_private_ifca_releases_lie_on_the_public_grid(synthetic):
    # Algorithm 1's releases are snapped to one grid that depends on no secret (issue 34): every
    # coordinate of every released vector is a multiple of public_grid(n), in every round, whatever
    # the client's update norm. The plain float32 release (safe=False) fails this.
    tr, _, _ = synthetic
    res = I.private_ifca(_linear(), tr, hypotheses=I.Hypotheses(2), privacy=I.DPrivacy(5.0), num_rounds=8, clients_per_round=7,
                         local=LocalTraining(loss_fn=I.squared_error), seed=3)
    lam = dp.public_grid(2)
    released = torch.cat([rd.released for rd in res.rounds]).double()
    assert released.shape[0] == 8 * 7
    assert torch.equal(torch.remainder(released, lam), torch.zeros_like(released))
    assert released.unique().numel() > 50                # not a degenerate (coarse) grid


def test_budget_refusal_caps_every_client(synthetic):
    tr, _, _ = synthetic
    res = I.private_ifca(_linear(), tr, hypotheses=I.Hypotheses(2), privacy=I.DPrivacy(5.0, budget=1.0), num_rounds=30,
                         clients_per_round=10, local=LocalTraining(loss_fn=I.squared_error), seed=2)
    assert res.accountant.spent.max() <= 1.0 + 1e-9
    assert res.accountant.participations.max() == 2          # floor(1.0 / 0.4)
    assert sum(len(r.refused) for r in res.rounds) > 0


def test_kmeans_clusters_continue_the_hypotheses():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 6.0, 6.0]])
    X = centres.repeat_interleave(15, 0) + torch.randn(45, 3, generator=g)
    init = centres + torch.randn(3, 3, generator=g)
    a = I.kmeans_clusters(X, init)
    assert a.tolist() == np.repeat([0, 1, 2], 15).tolist()   # cluster j continues hypothesis j
    perm = [2, 0, 1]
    assert I.kmeans_clusters(X, init[perm]).tolist() == np.repeat([1, 2, 0], 15).tolist()


def test_kmeans_clusters_is_scikit_learn_even_when_a_cluster_empties():
    from sklearn.cluster import KMeans

    g = torch.Generator().manual_seed(1)
    X = torch.randn(20, 2, generator=g, dtype=torch.float64)
    init = torch.tensor([[0.0, 0.0], [50.0, 50.0]], dtype=torch.float64)   # hypothesis 1 attracts nothing
    ref = KMeans(n_clusters=2, init=init.numpy(), n_init=1, random_state=0, tol=0.0).fit(X.numpy()).labels_
    got = I.kmeans_clusters(X, init, seed=0)
    assert got.tolist() == ref.tolist()
    assert set(got.tolist()) == {0, 1}          # scikit-learn relocates the empty centre to a far point
    # too few distinct vectors: each joins its nearest hypothesis
    assert I.kmeans_clusters(X[:1].repeat(5, 1), init).tolist() == [0] * 5
    assert I.kmeans_clusters(X, init[:1]).tolist() == [0] * 20


def test_kmeans_clusters_labels_equal_kmeans_fit_on_random_rounds():
    """kmeans_clusters runs scikit-learn's Lloyd iteration without KMeans.fit's per-call checks; its labels
    must be KMeans' on every input (the stored records were made with KMeans.fit)."""
    import warnings

    from sklearn.cluster import KMeans

    rng = np.random.default_rng(0)
    for trial in range(300):
        m, n, k = int(rng.integers(6, 30)), int(rng.integers(1, 12)), int(rng.integers(2, 6))
        X = rng.normal(size=(m, n)) * [0.01, 1.0, 100.0][trial % 3]
        if trial % 5 == 0:
            X[: m // 2] = X[0]                                  # repeated releases
        C = rng.normal(size=(k, n)) * [0.1, 1.0, 10.0][trial % 3]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = KMeans(n_clusters=k, init=C, n_init=1, random_state=trial, tol=0.0).fit(X).labels_
        if len(np.unique(X, axis=0)) >= k:
            assert I.kmeans_clusters(torch.tensor(X), torch.tensor(C), seed=trial).tolist() == ref.tolist()


@pytest.mark.parametrize("released, hyps", [
    (torch.zeros(5, 2), torch.zeros(2, 3)), (torch.zeros(5), torch.zeros(2, 2)),
    (torch.zeros(5, 2), torch.zeros(0, 2)), (torch.full((5, 2), float("nan")), torch.zeros(2, 2)),
])
def test_kmeans_clusters_rejects_bad_input(released, hyps):
    with pytest.raises(ValueError, match="released|hypotheses"):
        I.kmeans_clusters(released, hyps)


def test_noise_does_not_change_the_client_schedule(synthetic):
    tr, _, _ = synthetic
    common = dict(num_rounds=8, clients_per_round=7, local=LocalTraining(loss_fn=I.squared_error), seed=4)
    plain = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2), **common)
    noisy = [I.private_ifca(_linear(), tr, hypotheses=I.Hypotheses(2), privacy=I.DPrivacy(nu), **common) for nu in (0.1, 5.0)]
    plain_km = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2, clustering="kmeans"), **common)
    for r in [*noisy, plain_km]:
        assert [rd.selected.tolist() for rd in r.rounds] == [rd.selected.tolist() for rd in plain.rounds]
    # and the noise differs between noise levels only through nu, not through the schedule
    assert not torch.equal(noisy[0].rounds[0].released, noisy[1].rounds[0].released)
    other = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2), **{**common, "seed": 5})
    assert [rd.selected.tolist() for rd in other.rounds] != [rd.selected.tolist() for rd in plain.rounds]


@pytest.mark.parametrize("nu", [0.5, 2.0])
def test_private_ifca_converges_to_the_optima_for_small_noise(synthetic, nu):
    tr, _, va = synthetic
    init = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    res = I.private_ifca(_linear(), tr, hypotheses=I.Hypotheses(2, init=init), privacy=I.DPrivacy(nu), num_rounds=60,
                         clients_per_round=10, local=LocalTraining(lr=0.3, batch_size=10, loss_fn=I.squared_error),
                         validation=I.Validation(va), seed=0)
    # each optimum to its nearest hypothesis: at the best validation round (8 seeds: at most 0.24) and at the end
    best = torch.cdist(res.hypotheses, clustered.THETA_STAR).min(0).values
    final = torch.cdist(res.final, clustered.THETA_STAR).min(0).values
    assert float(best.max()) < 0.35 and float(final.max()) < 0.5, (res.hypotheses, res.final)
    # the two hypotheses went to different optima, and the validation RMSE approaches the floor 1/sqrt(3)
    assert sorted(torch.cdist(res.final, clustered.THETA_STAR).argmin(1).tolist()) == [0, 1]
    assert res.history["val_rmse"][res.best_round] < 0.8 < res.history["val_rmse"][0]


def test_a_zero_update_sends_nothing(synthetic):
    tr, _, _ = synthetic
    init = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    flat = lambda out, y: 0.0 * out[:, 0]   # noqa: E731  a loss with zero gradient: every update is zero
    res = I.private_ifca(_linear(), tr, hypotheses=I.Hypotheses(2, init=init), privacy=I.DPrivacy(5.0), num_rounds=3,
                         clients_per_round=7, local=LocalTraining(loss_fn=flat), seed=0)
    for rd in res.rounds:
        assert len(rd.idle) == 7 and len(rd.selected) == 0 and rd.released.shape == (0, 2)
    assert res.accountant.spent.sum() == 0 and torch.equal(res.final, init)
    # without noise a zero update is released as it is
    plain = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2, init=init), num_rounds=1, clients_per_round=7,
                   local=LocalTraining(loss_fn=flat), seed=0)
    assert len(plain.rounds[0].selected) == 7 and len(plain.rounds[0].idle) == 0


def test_diabetes_clinics():
    clients, info = clustered.diabetes_clients(4, seed=0)
    assert len(clients) == 110 and sum(len(c) for c in clients) == 442
    assert {len(c) for c in clients} <= {4, 5} and clients[0].X.shape[1] == 3 == len(clustered.DIABETES_INPUTS)
    # a clinic serves one sex (but for the block that straddles the boundary) and a narrow age band
    assert set(info["sex"].tolist()) == {1, 2}
    from sklearn.datasets import load_diabetes

    raw = load_diabetes(scaled=False)
    y = np.sort(np.concatenate([c.y.numpy() for c in clients]))
    np.testing.assert_allclose(y, np.sort(raw.target / clustered.DIABETES_TARGET_SCALE), rtol=1e-6)
    bmi = raw.data[:, raw.feature_names.index("bmi")]
    x0 = np.sort(np.concatenate([c.X[:, 0].numpy() for c in clients]))
    np.testing.assert_allclose(x0, np.sort((bmi - 25.0) / 5.0), rtol=1e-5, atol=1e-6)
    other, _ = clustered.diabetes_clients(4, seed=1)
    assert not torch.equal(other[0].y, clients[0].y)           # the order of the clinics follows the seed
    for kwargs in (dict(patients_per_client=0), dict(patients_per_client=300), dict(inputs={"height": (0, 1)})):
        with pytest.raises(ValueError):
            clustered.diabetes_clients(**kwargs)


def test_rotated_digits():
    clients, rot = clustered.rotated_digits_clients(20, seed=0)
    assert 0 < rot.sum() < 20 and clients[0].X.shape[1] == 64
    img, _ = clustered.rotated_digits_clients(20, seed=0, flatten=False)
    c = int(np.flatnonzero(rot)[0])
    plain, _ = clustered.rotated_digits_clients(20, seed=0, p_rotate=0.0, flatten=False)
    torch.testing.assert_close(img[c].X, torch.rot90(plain[c].X, 1, dims=(-2, -1)))
    assert torch.equal(img[c].y, plain[c].y)


def test_cms_loader_reads_the_csv_format(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLAB_DATA", str(tmp_path))
    with pytest.raises(OfflineError):
        clustered.load_cms_inpatient()
    header = ["DRG Definition", "Provider Id", "Provider Name", "Provider Zip Code",
              " Total Discharges ", " Average Covered Charges ", " Average Total Payments ",
              "Average Medicare Payments"]
    rows = [
        [clustered.CMS_CONDITIONS[0], "10001", "A", "36301", "91", "$32963.07", "$5777.24", "$4763.73"],
        [clustered.CMS_CONDITIONS[2], "10001", "A", "36301", "38", "$20312.78", "$4894.76", "$3865.50"],
        ["039 - EXTRACRANIAL PROCEDURES W/O CC/MCC", "10001", "A", "36301", "5", "$1", "$9999", "$1"],
        [clustered.CMS_CONDITIONS[1], "20002", "B", "02134", "12", "$15000.00", "$12,000.50", "$1"],
    ]
    path = tmp_path / clustered.CMS_FILENAME
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    clients, ids = clustered.load_cms_inpatient()
    assert ids == ["10001", "20002"]
    assert clients[0].X.shape == (2, 3) and clients[1].X.shape == (1, 3)
    torch.testing.assert_close(clients[0].y, torch.tensor([0.577724, 0.489476]))
    assert clients[1].y.item() == pytest.approx(1.20005)
    assert clients[0].X[:, 0].tolist() == [0.0, 2.0] and clients[1].X[0, 0] == 1.0
    geo = {"36301": (-85.4, 31.2), "02134": (-71.1, 42.35)}
    clients, _ = clustered.load_cms_inpatient(path, zip_coords=geo)
    torch.testing.assert_close(clients[1].X[0], torch.tensor([1.0, -0.711, 0.4235]))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="column"):
        clustered.load_cms_inpatient(bad)


@pytest.mark.parametrize("kwargs, match", [
    (lambda: dict(hypotheses=I.Hypotheses(0)), "Hypotheses.num_clusters"),
    (lambda: dict(privacy=I.DPrivacy(0.0)), "DPrivacy.nu"), (lambda: dict(privacy=I.DPrivacy(-1.0)), "DPrivacy.nu"),
    (lambda: dict(privacy=I.DPrivacy(5.0, budget=0.0)), "DPrivacy.budget"),
    (lambda: dict(clients_per_round=0), "clients_per_round"), (lambda: dict(clients_per_round=999), "clients_per_round"),
    (lambda: dict(hypotheses=I.Hypotheses(2, clustering="dbscan")), "Hypotheses.clustering"),
    (lambda: dict(hypotheses=I.Hypotheses(2, init=torch.zeros(2, 3))), "hypotheses must have shape"),
    (lambda: dict(hypotheses=I.Hypotheses(3, init=torch.zeros(2, 2))), "Hypotheses.init"),
    (lambda: dict(hypotheses=I.Hypotheses(2, init_std=0.0)), "Hypotheses.init_std"),
    (lambda: dict(validation=I.Validation(None, patience=0)), "Validation.patience"),
    (lambda: dict(hypotheses=2), "hypotheses must be a fedlab.fl.ifca.Hypotheses"),
    (lambda: dict(privacy=5.0), "privacy must be a fedlab.fl.ifca.DPrivacy"),
])
def test_bad_arguments_raise(synthetic, kwargs, match):
    tr, _, _ = synthetic
    base = dict(hypotheses=I.Hypotheses(2), num_rounds=1, clients_per_round=3, local=LocalTraining(loss_fn=I.squared_error))
    with pytest.raises(ValueError, match=match):
        base.update(kwargs())
        I.ifca(_linear(), tr, **base)


def test_flat_stack_roundtrip():
    model = models.mlp(4, (3,), 2, seed=0)
    p = models.get_params(model)
    theta = torch.stack([models.flatten_params(p), 2 * models.flatten_params(p)])
    st = I.flat_to_stack(theta, p)
    torch.testing.assert_close(I.stack_to_flat(st), theta)
    with pytest.raises(ValueError):
        I.flat_to_stack(theta[:, :-1], p)


def test_a_run_whose_local_training_blows_up_stops_and_keeps_its_best_finite_hypotheses(synthetic):
    tr, _, va = synthetic
    # a step far above 1/L makes gradient descent on the MSE diverge to inf/NaN within a few rounds
    res = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2, init=torch.tensor([[1.0, 1.0], [-1.0, 1.0]])), num_rounds=200,
                 clients_per_round=10, local=LocalTraining(lr=50.0, batch_size=None, loss_fn=I.squared_error),
                 validation=I.Validation(va), seed=0)
    assert res.diverged is not None and res.stopped_early and len(res.rounds) == res.diverged < 200
    assert torch.isfinite(res.hypotheses).all() and res.best_round < res.diverged
    assert len(res.rounds[-1].selected) == 0                  # nothing was released in that round
    ok = I.ifca(_linear(), tr, hypotheses=I.Hypotheses(2), num_rounds=3, clients_per_round=10,
                local=LocalTraining(lr=0.1, loss_fn=I.squared_error), seed=0)
    assert ok.diverged is None


def _run_record(r):
    return (r.hypotheses, r.final, r.best_round, r.history["val_loss"],
            [(x.selected, x.chosen, x.released, x.labels) for x in r.rounds],
            None if r.accountant is None else r.accountant.spent)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("case", ["linear", "linear_private", "mlp", "mlp_private"])
def test_dense_fast_path_equals_the_vmap_path(synthetic, monkeypatch, case):
    """ifca computes nn.Linear(d, 1) and small ReLU nets without vmap (fedlab.fl._linear); every number of a
    run must equal the vmap path's (the stored records of chapter 5 were made with it)."""
    from fedlab.experiments import chapter5 as ex5

    if case.startswith("linear"):
        train, _, val = synthetic
        model, kw, k, init = nn.Linear(2, 1, bias=False), dict(clients_per_round=7), 2, None
    else:
        train, val = ex5.diabetes_split(0)
        model = ex5.hospital_net(0)
        kw, k, init = dict(clients_per_round=10), 3, ex5.model_hypotheses(ex5.hospital_net, 3)
    kw.update(num_rounds=12, local=LocalTraining(lr=0.1, batch_size=10, loss_fn=models.squared_error),
              validation=I.Validation(val), seed=4, hypotheses=I.Hypotheses(k, init=init))
    if case.endswith("private"):
        kw.update(privacy=I.DPrivacy(3.0), hypotheses=I.Hypotheses(k, init=init, clustering="kmeans"))
    fast = I.ifca(model, train, **kw)
    monkeypatch.setattr(I, "linear_fast_path", lambda *a: False)
    monkeypatch.setattr(I, "mlp_fast_path", lambda *a: False)
    slow = I.ifca(model, train, **kw)
    assert _same(_run_record(fast), _run_record(slow))
