"""FedAvg / FedSGD / selective SGD checked against hand computations (McMahan et al. 2017)."""
import math

import pytest
import torch
from torch import nn

import fedlab
from fedlab import data as D
from fedlab import fl, models


def _toy_clients(sizes=(5, 9, 3), d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        X = torch.randn(n, d, generator=g)
        y = torch.randint(0, 3, (n,), generator=g)
        out.append(D.Dataset(X, y))
    return out


def _net(d=4):
    return models.mlp(d, (6,), 3, seed=1)


def test_weighted_average_matches_hand_computation():
    stacked = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]])}
    n = torch.tensor([1.0, 3.0, 6.0])
    got = fl.weighted_average(stacked, n)["w"]
    want = (1 * torch.tensor([1.0, 2.0]) + 3 * torch.tensor([3.0, 4.0]) + 6 * torch.tensor([10.0, 0.0])) / 10
    assert torch.allclose(got, want)


def test_weighted_average_keeps_float64_precision():
    # weights 1/3 normalised in float32 would be off by ~1e-8 relative; a float64 model keeps float64 weights
    v = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64) * (1 + 1e-12)
    got = fl.weighted_average({"w": v}, torch.tensor([1, 1, 1]))["w"]
    assert got.dtype == torch.float64 and abs(float(got) - 7 / 3 * (1 + 1e-12)) < 1e-14
    # float32 models get the correctly rounded float32 weights, as before the change
    v32 = torch.tensor([[1.0], [2.0], [4.0]])
    assert torch.equal(fl.weighted_average({"w": v32}, torch.tensor([1.0, 1.0, 1.0]))["w"],
                       torch.tensordot(torch.full((3,), 1.0) / 3.0, v32, dims=1))


def test_weighted_average_rejects_bad_weights():
    with pytest.raises(ValueError, match="weights"):
        fl.weighted_average({"w": torch.ones(2, 3)}, torch.tensor([-1.0, 1.0]))


def test_fedavg_round_equals_weighted_average_of_sequential_client_updates():
    clients = _toy_clients()
    net = _net()
    w0 = models.get_params(net)
    records = []
    res = fl.fedavg(net, clients, num_rounds=1, local=fl.LocalTraining(lr=0.05, local_epochs=2, batch_size=2), seed=3,
                    callback=records.append)
    # replay: the same generator draws the client selection, then one batch plan for all clients
    gen = torch.Generator().manual_seed(3)
    sel = torch.randperm(3, generator=gen)[:3].sort().values
    data = fl.stack_clients(clients).select(sel)
    idx, w = fl.batch_plan(data.n, 2, 2, gen)
    locals_ = []
    for k in range(3):
        p = {n: v.clone() for n, v in w0.items()}
        for s in range(idx.shape[1]):
            if w[k, s].sum() == 0:
                continue
            nk = int(w[k, s].sum())
            rows = idx[k, s, :nk]
            Xb, yb = data.X[k][rows], data.y[k][rows]
            p = {n: v.detach().requires_grad_(True) for n, v in p.items()}
            loss = nn.functional.cross_entropy(torch.func.functional_call(net, p, (Xb,)), yb)
            grads = torch.autograd.grad(loss, list(p.values()))
            p = {n: (v - 0.05 * g).detach() for (n, v), g in zip(p.items(), grads)}
        locals_.append(p)
    nks = torch.tensor([5.0, 9.0, 3.0])[sel]
    for name in w0:
        want = sum(nks[k] * locals_[k][name] for k in range(3)) / nks.sum()
        assert torch.allclose(res.params[name], want, atol=1e-6), name
    # the eavesdropper view: what the server sent and what each client returned
    assert len(records) == 1 and records[0].client_params["0.weight"].shape[0] == 3


def test_vmap_clients_update_equals_one_by_one():
    clients = _toy_clients(sizes=(7, 2, 11))
    data = fl.stack_clients(clients)
    net = _net()
    w0 = models.get_params(net)
    batched = fl.clients_update(net, w0, data, local=fl.LocalTraining(lr=0.1, local_epochs=3, batch_size=4), generator=torch.Generator().manual_seed(0))
    idx, w = fl.batch_plan(data.n, 4, 3, torch.Generator().manual_seed(0))
    step = fl.local._step_fn(net, fl.cross_entropy, 0.1)
    for k in range(3):
        p = dict(w0)
        for s in range(idx.shape[1]):
            p = step(p, data.X[k], data.y[k], idx[k, s], w[k, s])
        for name in w0:
            assert torch.allclose(batched[name][k], p[name], atol=1e-6)


def test_fedsgd_is_full_batch_gradient_descent_on_pooled_data():
    clients = _toy_clients(sizes=(4, 6, 10))
    net = _net()
    w0 = models.get_params(net)
    res = fl.fedsgd(net, clients, num_rounds=3, lr=0.2)
    X = torch.cat([c.X for c in clients])
    y = torch.cat([c.y for c in clients])
    p = {n: v.clone() for n, v in w0.items()}
    for _ in range(3):
        g = torch.func.grad(lambda q: nn.functional.cross_entropy(torch.func.functional_call(net, q, (X,)), y))(p)
        p = {n: p[n] - 0.2 * g[n] for n in p}
    for name in w0:
        assert torch.allclose(res.params[name], p[name], atol=1e-5)


def test_fedavg_with_one_client_equals_centralized_sgd():
    clients = _toy_clients(sizes=(12,))
    net = _net()
    a = fl.fedavg(net, clients, num_rounds=2, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=5), seed=7)
    b = fl.train_centralized(net, clients[0], num_epochs=2, batch_size=5, lr=0.1, seed=7)
    for name in a.params:
        assert torch.allclose(a.params[name], b.params[name])


def test_client_fraction_samples_m_clients():
    clients = _toy_clients(sizes=(3,) * 10)
    seen = []
    fl.fedavg(_net(), clients, num_rounds=4, client_fraction=0.3, local=fl.LocalTraining(lr=0.1), callback=seen.append)
    assert all(len(r.selected) == 3 and len(set(r.selected)) == 3 for r in seen)
    seen = []
    fl.fedavg(_net(), clients, num_rounds=1, client_fraction=0.01, local=fl.LocalTraining(lr=0.1), callback=seen.append)
    assert len(seen[0].selected) == 1  # m = max(C K, 1)


@pytest.mark.parametrize("kwargs, arg", [
    ({"client_fraction": 0.0}, "client_fraction"),
    ({"client_fraction": 1.5}, "client_fraction"),
    ({"lr": -1.0}, "lr"),
    ({"local_epochs": 0}, "local_epochs"),
    ({"batch_size": 0}, "batch_size"),
    ({"num_rounds": -1}, "num_rounds"),
])
def test_fedavg_validates_arguments(kwargs, arg):
    local = {k: v for k, v in kwargs.items() if k in ("lr", "local_epochs", "batch_size")}   # fl.LocalTraining's
    base = {"num_rounds": 1, **{k: v for k, v in kwargs.items() if k not in local}}
    with pytest.raises(ValueError, match=arg):
        fl.fedavg(_net(), _toy_clients(), local=fl.LocalTraining(**{"lr": 0.1, **local}), **base)


def test_batch_plan_covers_each_example_once_per_epoch():
    n = torch.tensor([7, 3, 10])
    idx, w = fl.batch_plan(n, 4, 2, torch.Generator().manual_seed(0))
    assert idx.shape == (3, 2 * math.ceil(10 / 4), 4)
    for k, nk in enumerate(n.tolist()):
        used = idx[k][w[k] > 0]
        assert len(used) == 2 * nk
        assert sorted(used.tolist()) == sorted(list(range(nk)) * 2)


def test_selective_sgd_upload_masks():
    delta = torch.tensor([0.1, -5.0, 0.3, 2.0, -0.05, 0.0, 1.0, -0.2, 0.4, 0.6])
    m = fl.select_upload(delta, 0.2, "largest")
    assert m.sum() == 2 and set(torch.nonzero(m).flatten().tolist()) == {1, 3}
    m = fl.select_upload(delta, 0.3, "random", threshold=0.35, generator=torch.Generator().manual_seed(0))
    assert m.sum() == 3 and bool((delta[m].abs() > 0.35).all())
    with pytest.raises(ValueError, match="upload_fraction"):
        fl.select_upload(delta, 0.0)
    with pytest.raises(ValueError, match="criterion"):
        fl.select_upload(delta, 0.5, "smallest")
    with pytest.raises(ValueError, match="Sharing.upload_fraction"):
        fl.Sharing(upload_fraction=1.5)
    with pytest.raises(ValueError, match="Sharing.criterion"):
        fl.Sharing(criterion="smallest")
    with pytest.raises(ValueError, match="Sharing.download_fraction"):
        fl.Sharing(download_fraction=0.0)


def test_selective_sgd_full_upload_single_client_equals_sgd():
    clients = _toy_clients(sizes=(8,))
    net = _net()
    a = fl.selective_sgd(net, clients, num_rounds=1, sharing=fl.Sharing(upload_fraction=1.0),
                         local=fl.LocalTraining(lr=0.1, batch_size=None))
    b = fl.fedsgd(net, clients, num_rounds=1, lr=0.1)
    for name in a.params:
        assert torch.allclose(a.params[name], b.params[name], atol=1e-6)


def test_fedavg_learns_digits():
    fedlab.seed_everything(0)
    ds = D.load_digits()
    tr, te = D.train_test_split(ds, 0.3, seed=0)
    clients = D.client_datasets(tr, D.partition_iid(len(tr), 5))
    net = models.mlp(64, (32,), 10, seed=0)
    res = fl.fedavg(net, clients, num_rounds=5, local=fl.LocalTraining(lr=0.3, local_epochs=1, batch_size=20), eval_data=te)
    assert res.history["accuracy"][0] < 0.3 < 0.85 < res.history["accuracy"][-1]


def test_eval_data_may_be_a_pair_and_anything_else_names_the_argument():
    import pytest
    from fedlab import data, fl, models
    d = data.load_digits()
    model = models.mlp(64, [8], 10, seed=0)
    params = dict(model.named_parameters())
    by_pair = fl.eval_fn(model, (d.X, d.y))(params)
    assert by_pair == fl.eval_fn(model, d)(params)
    with pytest.raises(ValueError, match="eval_data"):
        fl.eval_fn(model, d.X)


def test_stacked_clients_with_weight_decay_equal_clients_run_one_by_one():
    """Padding steps of a smaller client must not decay it (found by the Flower equivalence check: 3.7e-3
    off at weight_decay = 0.1 with clients of 40/60/80 examples before the fix). A client of 16 examples
    with B = 16 takes one full-batch step per epoch whatever the shuffle; stacked beside a client of 48
    it is padded with two empty steps per epoch, which must change nothing."""
    from fedlab import fl, models
    g = torch.Generator().manual_seed(0)
    small = (torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g))
    big = (torch.randn(48, 5, generator=g), torch.randint(0, 3, (48,), generator=g))
    model = models.mlp(5, [8], 3, seed=0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    kw = dict(local=fl.LocalTraining(lr=0.1, local_epochs=3, batch_size=16, weight_decay=0.1))
    both = fl.clients_update(model, params, fl.stack_clients([small, big]), generator=torch.Generator().manual_seed(1), **kw)
    alone = fl.clients_update(model, params, fl.stack_clients([small]), generator=torch.Generator().manual_seed(2), **kw)
    for name in params:
        torch.testing.assert_close(both[name][0], alone[name][0], rtol=0, atol=1e-6)
