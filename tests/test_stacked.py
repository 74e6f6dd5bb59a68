"""Runs advanced together (fedlab.fl.stacked and the *_runs functions built on it) return, bit for bit,
what the single-run functions return, and those return what the loops they replaced returned (the
reference loops below are the pre-stacking code, written with the untouched fl.clients_update).

Every comparison is torch.equal / ==, never allclose: the chapters' stored paper-scale records were
computed by the one-run-after-another code, so the stacked code must give the very same numbers.
"""
import numpy as np
import pytest
import torch

from fedlab import data, fl, models
from fedlab.attacks import membership as mia
from fedlab.fl import personalization as pers
from fedlab.fl import stacked
from fedlab.fl.dp_fedavg import DPSettings, dp_fedavg, dp_fedavg_runs, dp_server_step, poisson_sample
from fedlab.metrics import auc_permutation_floor, roc_auc_rows, rounds_to_accuracy


def _eq(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(params=[True, pytest.param(False, marks=pytest.mark.slow)], ids=["traced", "eager"])
def trace(request, monkeypatch):
    """Every test runs with the steps traced (the default; a shape is traced after its first step, so
    the traced path is the one that runs) and, marked slow, through torch.func alone."""
    monkeypatch.setattr(stacked, "TRACE_STEPS", request.param)
    monkeypatch.setattr(stacked, "_TRACE_AFTER", 0)
    return request.param


@pytest.fixture(scope="module")
def digits():
    d = data.load_digits()
    train, test = data.train_test_split(d, test_fraction=0.5, seed=0)
    train = train.subset(np.arange(300))
    parts = {"iid": data.partition_iid(len(train), 6, seed=0),
             "non-iid": data.partition_label_skew(train.y, 6, classes_per_client=2, seed=0)}
    clients = {k: fl.stack_clients(data.client_datasets(train, p)) for k, p in parts.items()}
    net = models.mlp(64, (16,), 10, seed=0)
    return net, models.get_params(net), train, test.subset(np.arange(200)), clients


def test_batch_plan_is_fl_batch_plan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = torch.as_tensor(rng.integers(1, 30, size=int(rng.integers(1, 9))))
        B = [None, 1, 3, 10, 64][int(rng.integers(0, 5))]
        E = int(rng.integers(1, 4))
        g1, g2 = torch.Generator().manual_seed(int(rng.integers(99))), torch.Generator()
        g2.set_state(g1.get_state())
        a, b = fl.batch_plan(n, B, E, g1), stacked.batch_plan(n, B, E, g2)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[1].dtype == b[1].dtype
        assert torch.equal(g1.get_state(), g2.get_state())
    with pytest.raises(ValueError, match="local_epochs"):
        stacked.batch_plan(torch.tensor([3]), 2, 0)
    with pytest.raises(ValueError, match="n must"):
        stacked.batch_plan(torch.tensor([3, 0]), 2, 1)


def test_plan_cache_hands_out_the_plan_and_the_generator_state_of_a_draw():
    cache = stacked.PlanCache()
    n = torch.tensor([7, 5, 6])
    gens = [torch.Generator().manual_seed(3) for _ in range(3)]
    ref = torch.Generator().manual_seed(3)
    for _ in range(3):
        want = fl.batch_plan(n, 4, 2, ref)
        for g in gens:
            got = cache.batch_plan(n, 4, 2, g)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert torch.equal(g.get_state(), ref.get_state())


def test_clients_update_runs_are_clients_update(digits, trace):
    net, w0, _, _, clients = digits
    specs = [dict(data=clients["iid"], lr=0.1, local_epochs=2, batch_size=10, seed=1),
             dict(data=clients["non-iid"], lr=0.3, local_epochs=1, batch_size=10, seed=2),
             dict(data=clients["iid"].select([2]), lr=0.05, local_epochs=3, batch_size=7, seed=3),   # one client
             dict(data=clients["non-iid"], lr=1.0, local_epochs=2, batch_size=None, seed=4),
             dict(data=clients["iid"].select([4]), lr=0.2, local_epochs=1, batch_size=None, seed=5)]
    want = [fl.clients_update(net, w0, s["data"], local=fl.LocalTraining(lr=s["lr"], local_epochs=s["local_epochs"], batch_size=s["batch_size"]), generator=torch.Generator().manual_seed(s["seed"])) for s in specs]
    got = stacked.clients_update_runs(net, [dict(params=w0, data=s["data"], lr=s["lr"], local_epochs=s["local_epochs"],
                                                 batch_size=s["batch_size"],
                                                 generator=torch.Generator().manual_seed(s["seed"])) for s in specs])
    assert all(_eq(a, b) for a, b in zip(want, got))
    with pytest.raises(ValueError, match="unknown"):
        stacked.clients_update_runs(net, [dict(params=w0, data=clients["iid"], lr=0.1, nope=1)])


def test_fedavg_runs_are_fedavg_and_stop_at_the_target(digits, trace):
    net, w0, _, test, clients = digits
    LT = fl.LocalTraining
    specs = [dict(clients=clients["iid"], local=LT(lr=0.1, local_epochs=2, batch_size=10), params=w0, seed=0),
             dict(clients=clients["non-iid"], local=LT(lr=0.5, local_epochs=1, batch_size=None), params=w0, seed=0),
             dict(clients=clients["non-iid"], local=LT(lr=0.05, batch_size=10), client_fraction=0.2, params=w0,
                  seed=1),  # m = 1
             dict(clients=clients["iid"], local=LT(lr=0.3, batch_size=None), client_fraction=0.5, params=w0, seed=2),
             dict(clients=clients["iid"], local=LT(lr=0.2, local_epochs=3, batch_size=25), params=w0, seed=3)]
    want = [fl.fedavg(net, num_rounds=4, eval_data=test, **s) for s in specs]
    got = stacked.fedavg_runs(net, specs, num_rounds=4, eval_data=test)
    for a, b in zip(want, got):
        assert _eq(a.params, b.params) and a.history == b.history
    flat = [{**{k: v for k, v in s.items() if k != "local"}, "lr": s["local"].lr,
             "local_epochs": s["local"].local_epochs, "batch_size": s["local"].batch_size} for s in specs]
    for a, b in zip(got, stacked.fedavg_runs(net, flat, num_rounds=4, eval_data=test)):   # the flat spelling too
        assert _eq(a.params, b.params) and a.history == b.history
    with pytest.raises(ValueError, match="local"):
        stacked.fedavg_runs(net, [{**specs[0], "lr": 0.1}], num_rounds=1)
    with pytest.raises(ValueError, match="local"):
        stacked.fedavg_runs(net, [{**specs[0], "local": LT(weight_decay=0.1)}], num_rounds=1)
    cut = stacked.fedavg_runs(net, specs, num_rounds=4, eval_data=test, stop_at=0.4)
    for a, c in zip(want, cut):
        r = len(c.history["round"])
        assert {k: v[:r] for k, v in a.history.items()} == c.history
        assert rounds_to_accuracy(a.history, 0.4) == rounds_to_accuracy(c.history, 0.4)
        assert r == len(a.history["round"]) or c.history["accuracy"][-1] >= 0.4
    with pytest.raises(ValueError, match="fedavg arguments"):
        stacked.fedavg_runs(net, [dict(clients=clients["iid"], momentum=0.9)], num_rounds=1)
    with pytest.raises(ValueError, match="lr"):
        stacked.fedavg_runs(net, [dict(clients=clients["iid"], lr=0.0)], num_rounds=1)
    with pytest.raises(ValueError, match="stop_at"):
        stacked.fedavg_runs(net, specs, num_rounds=1, stop_at=0.5)


def test_selective_sgd_runs_are_selective_sgd(digits, trace):
    net, w0, _, test, clients = digits
    cfgs = [dict(criterion=c, upload_fraction=u, threshold=1e-3) for c in ("largest", "random") for u in (1.0, 0.1)]
    local = fl.LocalTraining(lr=0.1, batch_size=10)
    want = [fl.selective_sgd(net, clients["iid"], num_rounds=2, sharing=fl.Sharing(**c), local=local, params=w0, seed=4,
                             eval_data=test) for c in cfgs]
    got = stacked.selective_sgd_runs(net, clients["iid"], cfgs, num_rounds=2, local=local, params=w0, seed=4,
                                     eval_data=test)
    for a, b in zip(want, got):
        assert _eq(a.params, b.params) and a.history == b.history
    with pytest.raises(ValueError, match="upload_fraction"):
        stacked.selective_sgd_runs(net, clients["iid"], [dict(upload_fraction=0.0)], num_rounds=1)


def _single(spec: dict) -> dict:
    """A flat run of ``dp_fedavg_runs`` as ``dp_fedavg``'s keywords (``local=fl.LocalTraining``, ``dp=DPSettings``)."""
    flat = {k: spec[k] for k in ("lr", "local_epochs", "batch_size") if k in spec}
    dp = {k: spec[k] for k in ("noise_multiplier", "clip_norm", "sampling_prob", "server_lr", "safe", "grid") if k in spec}
    rest = {k: v for k, v in spec.items() if k not in flat and k not in dp}
    return {**rest, "local": fl.LocalTraining(**flat), "dp": DPSettings(**dp)}


def _dp_fedavg_reference(model, clients, *, num_rounds, sampling_prob, noise_multiplier, clip_norm, local_epochs=1,
                         batch_size=10, lr=0.1, server_lr=1.0, params=None, seed=0, callback=None):
    """DP-FedAvg's round loop as it was before the runs were stacked (fl.clients_update per run)."""
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach().clone() for k, v in params.items()}
    K, m = clients.num_clients, sampling_prob * clients.num_clients
    for t in range(1, num_rounds + 1):
        selected = poisson_sample(K, sampling_prob, gen)
        updates = None
        if len(selected):
            local = fl.clients_update(model, w, clients.select(selected), generator=gen,
                                      local=fl.LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=batch_size))
            updates = {k: (local[k] - w[k]).detach() for k in w}
        dp = DPSettings(noise_multiplier=noise_multiplier, clip_norm=clip_norm, sampling_prob=sampling_prob,
                        server_lr=server_lr)
        w = dp_server_step(t, w, selected, updates, dp=dp, expected_clients=m, generator=gen, callback=callback)
    return w


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_dp_fedavg_runs_are_dp_fedavg_and_its_old_loop(digits, trace):
    net, w0, _, test, clients = digits
    specs = [dict(clients=clients["iid"], sampling_prob=1.0, noise_multiplier=1.0, clip_norm=1.0, lr=0.3, seed=0),
             dict(clients=clients["non-iid"], sampling_prob=0.5, noise_multiplier=0.0, clip_norm=0.5, seed=1),
             dict(clients=clients["iid"], sampling_prob=0.2, noise_multiplier=2.0, clip_norm=1.0, batch_size=5, seed=2,
                  local_epochs=2)]
    recs = [[] for _ in specs]
    got = dp_fedavg_runs(net, [dict(s, params=w0, callback=r.append) for s, r in zip(specs, recs)], num_rounds=3,
                         eval_data=test)
    for s, g, r in zip(specs, got, recs):
        ref_recs = []
        ref = _dp_fedavg_reference(net, num_rounds=3, params=w0, callback=ref_recs.append, **s)
        alone = dp_fedavg(net, num_rounds=3, params=w0, eval_data=test, **_single(s))
        assert _eq(ref, g.params) and _eq(alone.params, g.params) and alone.history == g.history
        assert len(r) == len(ref_recs) == 3
        assert all(_eq(a.new_params, b.new_params) and _eq(a.updates, b.updates) for a, b in zip(r, ref_recs))


def _partial_reference(model, stacked_params, data, trainable, *, lr, local_epochs=1, batch_size=None, generator=None):
    """partial_clients_update as it was: one vmap over the clients, the trainable parameters only."""
    from torch.func import functional_call, grad, vmap

    if batch_size is None or batch_size >= int(data.n.max()):
        n_max = int(data.n.max())
        idx = torch.arange(n_max).expand(data.num_clients, int(local_epochs), n_max)
        w = (idx < data.n.view(-1, 1, 1)).float()
    else:
        idx, w = fl.batch_plan(data.n, batch_size, local_epochs, generator)

    def batch_loss(sub, frozen, X, y, i, wt):
        out = functional_call(model, {**frozen, **sub}, (X[i],))
        return (fl.cross_entropy(out, y[i]) * wt).sum() / wt.sum().clamp_min(1.0)

    g = grad(batch_loss)

    def step(sub, frozen, X, y, i, wt):
        gr = g(sub, frozen, X, y, i, wt)
        return {k: sub[k] - lr * gr[k] for k in sub}

    sub = {k: stacked_params[k].clone() for k in trainable}
    frozen = {k: v for k, v in stacked_params.items() if k not in trainable}
    for s in range(idx.shape[1]):
        sub = vmap(step)(sub, frozen, data.X, data.y, idx[:, s], w[:, s])
    return {k: (sub[k] if k in sub else stacked_params[k]).detach() for k in stacked_params}


def _centaur_reference(model, train, *, num_rounds, sampling_prob, noise_multiplier, clip_norm, head_epochs, lr,
                       batch_size, server_lr, final_head_epochs, params, seed, callback=None):
    """Centaur's loop as it was before the runs were stacked."""
    K = train.num_clients
    gen = torch.Generator().manual_seed(seed)
    w0 = {k: v.detach().clone() for k, v in params.items()}
    heads = pers.head_names_of(w0)
    rep = [k for k in w0 if k not in heads]
    stack = lambda p, n: {k: v.detach().unsqueeze(0).repeat(n, *([1] * v.ndim)) for k, v in p.items()}
    b = {k: w0[k] for k in rep}
    head_state = {k: v for k, v in stack(w0, K).items() if k in heads}
    for t in range(1, num_rounds + 1):
        sel = poisson_sample(K, sampling_prob, gen)
        updates = None
        if len(sel):
            sub = train.select(sel)
            p = {**stack(b, len(sel)), **{k: head_state[k][sel] for k in heads}}
            p = _partial_reference(model, p, sub, heads, lr=lr, local_epochs=head_epochs, generator=gen)
            for k in heads:
                head_state[k][sel] = p[k]
            p = _partial_reference(model, p, sub, rep, lr=lr, local_epochs=1, batch_size=batch_size, generator=gen)
            updates = {k: p[k] - b[k] for k in rep}
        dp = DPSettings(noise_multiplier=noise_multiplier, clip_norm=clip_norm, sampling_prob=sampling_prob,
                        server_lr=server_lr)
        b = dp_server_step(t, b, sel, updates, dp=dp, expected_clients=sampling_prob * K, generator=gen, callback=callback)
    final = {**stack(b, K), **head_state}
    return _partial_reference(model, {k: final[k] for k in w0}, train, heads, lr=lr, local_epochs=final_head_epochs,
                              generator=gen)


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_personalisation_runs_are_the_old_loops(trace):
    net = models.mlp(64, (4,), 10, seed=0)
    w0 = models.get_params(net)
    tasks = [pers.make_representation_task(24, 10, 5, classes_per_client=c, seed=1)[0] for c in (2, 5)]
    args = dict(sampling_prob=0.3, clip_norm=0.2, head_epochs=3, lr=0.2, batch_size=5, server_lr=3.0,
                final_head_epochs=4, params=w0, seed=2)
    zs = (0.8, 1.5)
    recs = [[] for _ in tasks]
    got = pers.centaur_runs(net, [dict(train=tr, noise_multiplier=z, callback=r.append, **args)
                                  for tr, z, r in zip(tasks, zs, recs)], num_rounds=3)
    for tr, z, g, r in zip(tasks, zs, got, recs):
        ref_recs = []
        assert _eq(_centaur_reference(net, tr, num_rounds=3, noise_multiplier=z, callback=ref_recs.append, **args), g)
        single = {k: v for k, v in args.items() if k not in ("lr", "batch_size", "sampling_prob", "clip_norm", "server_lr",
                                                             "head_epochs", "final_head_epochs")}
        heads = pers.PersonalHeads(head_epochs=args["head_epochs"], final_head_epochs=args["final_head_epochs"])
        local = fl.LocalTraining(lr=args["lr"], batch_size=args["batch_size"])
        dp = DPSettings(noise_multiplier=z, clip_norm=args["clip_norm"], sampling_prob=args["sampling_prob"],
                        server_lr=args["server_lr"])
        assert _eq(pers.centaur(net, tr, num_rounds=3, dp=dp, local=local, heads=heads, **single), g)
        assert all(_eq(a.new_params, b.new_params) for a, b in zip(r, ref_recs))
    heads = pers.head_names_of(w0)
    ft = pers.finetune_runs(net, [dict(params=w0, train=tr, num_epochs=3, lr=0.2, seed=0) for tr in tasks])
    for tr, f in zip(tasks, ft):
        assert _eq(_partial_reference(net, pers._stack(w0, tr.num_clients), tr, heads, lr=0.2, local_epochs=3), f)
    lo = pers.local_only_runs(net, [dict(train=tr, num_epochs=2, lr=0.2, batch_size=5, params=w0, seed=3) for tr in tasks])
    for tr, o in zip(tasks, lo):
        assert _eq(pers.local_only(net, tr, num_epochs=2, lr=0.2, batch_size=5, params=w0, seed=3), o)
    shuffled = [dict(stacked=pers._stack(w0, tr.num_clients), data=tr, lr=0.3, local_epochs=2, batch_size=4,
                     generator=torch.Generator().manual_seed(5)) for tr in tasks]
    for tr, p in zip(tasks, pers.partial_clients_update_runs(net, shuffled, heads)):
        ref = _partial_reference(net, pers._stack(w0, tr.num_clients), tr, heads, lr=0.3, local_epochs=2, batch_size=4,
                                 generator=torch.Generator().manual_seed(5))
        assert _eq(ref, p)


def _active_reference(model, clients, params, X_target, y_target, *, target, num_rounds, ascent_lr, attacker="server",
                      isolate=False, attacker_index=None, lr=0.1, local_epochs=1, batch_size=10, seed=0):
    """active_attack_rounds' loop as it was before the runs were stacked."""
    K = clients.num_clients
    gen = torch.Generator().manual_seed(seed)
    weights = clients.n.float()
    others = weights.clone()
    others[target] = 0.0
    own = {k: v.detach().clone() for k, v in params.items()}
    w = {k: v.detach().clone() for k, v in params.items()}
    observed = []
    for _ in range(num_rounds):
        send = {k: v.unsqueeze(0).repeat(K, *([1] * v.ndim)) for k, v in w.items()}
        if attacker == "server":
            base = own if isolate else w
            if ascent_lr > 0:
                base = mia.gradient_ascent(model, base, X_target, y_target, ascent_lr=ascent_lr)
            rows = [target] if isolate else list(range(K))
            for k in send:
                send[k][rows] = base[k]
        local = fl.clients_update(model, send, clients, local=fl.LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=batch_size), generator=gen, stacked=True)
        if attacker == "participant" and ascent_lr > 0:
            up = mia.gradient_ascent(model, {k: v[attacker_index] for k, v in local.items()}, X_target, y_target,
                                     ascent_lr=ascent_lr)
            for k in local:
                local[k][attacker_index] = up[k]
        new_w = fl.weighted_average(local, others if isolate else weights)
        returned = {k: v[target].detach().clone() for k, v in local.items()}
        if isolate:
            own = returned
        observed.append(mia.per_example_loss(model, returned if attacker == "server" else new_w, X_target, y_target))
        w = {k: v.detach() for k, v in new_w.items()}
    return torch.stack(observed)


def test_active_attack_runs_are_the_old_loop(digits, trace):
    net, w0, _, _, clients = digits
    cd = clients["iid"]
    Xc, yc = cd.X[:, :8], cd.y[:, :8]
    runs = [dict(target=0, ascent_lr=0.0), dict(target=1, ascent_lr=2.0), dict(target=2, ascent_lr=1.0, isolate=True),
            dict(target=3, ascent_lr=0.0, isolate=True), dict(target=4, ascent_lr=3.0, attacker="participant",
                                                              attacker_index=5)]
    got = mia.active_attack_runs(net, cd, w0, [dict(r, X_target=Xc[r["target"]], y_target=yc[r["target"]]) for r in runs],
                                 num_rounds=3, local=fl.LocalTraining(lr=0.3, local_epochs=2, batch_size=10), seed=7)
    for r, g in zip(runs, got):
        ref = _active_reference(net, cd, w0, Xc[r["target"]], yc[r["target"]], num_rounds=3, lr=0.3, local_epochs=2,
                                batch_size=10, seed=7, **r)
        alone = mia.active_attack_rounds(net, cd, w0, Xc[r["target"]], yc[r["target"]], attack=mia.ActiveAttack(**r),
                                         num_rounds=3, local=fl.LocalTraining(lr=0.3, local_epochs=2, batch_size=10),
                                         seed=7)
        assert torch.equal(ref, g) and torch.equal(alone, g)
    with pytest.raises(ValueError, match="runs"):
        mia.active_attack_runs(net, cd, w0, [], num_rounds=1)


def test_permutation_floor_is_the_mean_auc_of_shuffled_labels_quantile():
    rng = np.random.default_rng(1)
    for U, m in ((1, 30), (3, 17), (2, 200)):
        lab = np.zeros((U, m))
        for u in range(U):
            lab[u, rng.permutation(m)[: int(rng.integers(1, m))]] = 1
        sc = rng.normal(size=(U, m)).round(1)                          # ties
        g = torch.Generator().manual_seed(4)                           # the floor's own shuffles, by hand
        perm = torch.argsort(torch.rand(300, U, m, generator=g), dim=2)
        shuffled = torch.gather(torch.as_tensor(lab).expand(300, U, m), 2, perm)
        aucs = roc_auc_rows(shuffled.reshape(-1, m), torch.as_tensor(sc).repeat(300, 1)).reshape(-1, U).mean(1)
        for q in (0.5, 0.95, 0.999):
            assert auc_permutation_floor(lab, sc, num_permutations=300, quantile=q, seed=4) == float(torch.quantile(aucs, q))
        assert auc_permutation_floor(lab, sc, num_permutations=300, quantile=[0.95, 0.5], seed=4) == [
            float(torch.quantile(aucs, 0.95)), float(torch.quantile(aucs, 0.5))]
    with pytest.raises(ValueError, match="quantile"):
        auc_permutation_floor(lab, sc, quantile=[0.5, 1.0])
    with pytest.raises(ValueError, match="one class"):
        auc_permutation_floor(np.ones(5), np.arange(5.0))
