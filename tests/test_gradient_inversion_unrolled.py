"""The unrolled attacker of Geiping et al. (2020, Sec. 5): DLG that simulates the client's K local steps on
its dummy data (``gi.simulated_update``, ``gi.dlg(knows=Knowledge(local_steps=K, local_lr=eta))``,
``gi.attack_grid(settings={K: {"local_steps": K, "knows_local_steps": True}})``,
``ch1a.unrolled_local_steps``)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedlab import models
from fedlab.attacks import gradient_inversion as gi
from fedlab.data.images import digit_images
from fedlab.experiments import chapter1a as ch1a


@pytest.fixture(scope="module")
def net8():
    torch.set_num_threads(1)
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
    return net, models.get_params(net), digit_images(8, seed=7)


def _loss(net, x, y):
    soft = F.one_hot(y, 10).float()
    return lambda p: -(soft * F.log_softmax(functional_call(net, p, (x,)), -1)).sum(-1).mean()


@pytest.mark.parametrize("K,lr", [(1, 0.1), (3, 0.01), (9, 0.1)])
def test_simulated_update_is_the_clients_update(net8, K, lr):
    """At the true data the simulated update is the client's own (to float32 round-off): an off-by-one in
    the steps, a wrong sign or a wrong rescaling fails here."""
    net, params, ds = net8
    X, y = ds.X[:2], ds.y[:2]
    sim = gi.simulated_update(_loss(net, X, y), params, local_steps=K, local_lr=lr)
    real = gi.client_update_as_gradient(net, params, X, y, lr=lr, local_steps=K)
    scale = max(float(real[k].abs().max()) for k in real)
    assert max(float((sim[k] - real[k]).abs().max()) for k in real) < 1e-4 * scale
    if K > 1:   # and it is not the plain gradient (the test can tell the two attackers apart)
        g = gi.parameter_gradient(net, params, X, y)
        assert max(float((sim[k] - g[k]).abs().max()) for k in g) > 1e-2 * scale


def test_unrolled_update_is_differentiable_in_the_data(net8):
    net, params, ds = net8
    x = ds.X[:1].clone().requires_grad_(True)
    sim = gi.simulated_update(_loss(net, x, ds.y[:1]), params, local_steps=4, local_lr=0.1)
    total = sum((v ** 2).sum() for v in sim.values())
    (gx,) = torch.autograd.grad(total, [x])
    assert torch.isfinite(gx).all() and float(gx.abs().max()) > 0


def test_matching_loss_unrolled_is_zero_at_the_truth_only(net8):
    net, params, ds = net8
    X, y = ds.X[:3], ds.y[:3]
    ups = [gi.client_update_as_gradient(net, params, X[i:i + 1], y[i:i + 1], lr=0.1, local_steps=9) for i in range(3)]
    obs = {k: torch.stack([u[k] for u in ups]) for k in params}
    truth = gi.matching_loss(net, params, X[:, None], y[:, None], obs, local_steps=9, local_lr=0.1)
    assert float(truth.max()) == 0.0
    one = gi.matching_loss(net, params, X[:, None], y[:, None], obs)        # the one-gradient model of the same update
    assert float(one.min()) > 1e-3
    other = gi.matching_loss(net, params, X.roll(1, 0)[:, None], y.roll(1, 0)[:, None], obs, local_steps=9, local_lr=0.1)
    assert float(other.min()) > 1e-2


def test_bad_unroll_arguments_name_themselves(net8):
    net, params, ds = net8
    obs = gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1])
    kw = dict(input_shape=(1, 8, 8), num_classes=10)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="Knowledge.local_steps"):
            gi.Knowledge(local_steps=bad, local_lr=0.1, **kw)
    for bad in (None, 0.0, -0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Knowledge.local_lr"):
            gi.Knowledge(local_steps=3, local_lr=bad, **kw)
    stacked = {k: v[None] for k, v in obs.items()}
    with pytest.raises(ValueError, match="local_lr"):
        gi.matching_loss(net, params, ds.X[:1, None], ds.y[:1, None], stacked, local_steps=2)
    with pytest.raises(ValueError, match="knows_local_steps"):
        gi.attack_grid(net, params, ds.X[:1], ds.y[:1], num_classes=10, settings={1: {"knows_local_steps": "yes"}})
    with pytest.raises(ValueError, match="local_steps"):
        ch1a.unrolled_local_steps(net, params, ds.X[:1], ds.y[:1], local_steps=1, max_iter=2, success_db=20.0)
    with pytest.raises(ValueError, match="local_lrs"):
        ch1a.unrolled_local_steps(net, params, ds.X[:1], ds.y[:1], local_lrs=(0.1, -1.0), max_iter=2, success_db=20.0)


def test_one_step_objective_is_unchanged(net8):
    """``local_steps=1`` is the plain objective: bit-identical reconstructions with and without the argument."""
    net, params, ds = net8
    obs = {k: v[None] for k, v in gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1]).items()}
    kw = dict(budget=gi.AttackBudget(max_iter=15, lr=1.0), stacked=True, seed=3)
    a = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10), **kw)
    b = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, local_steps=1, local_lr=0.5),
               **kw)
    assert torch.equal(a.x, b.x) and np.array_equal(a.final_loss, b.final_loss)


@pytest.mark.slow
def test_unrolled_attacker_beats_the_one_gradient_attacker(net8):
    """Four clients, nine steps at eta = 0.1: the one-gradient attacker recovers none (the path has moved far
    from w), the unrolled one most, and each unrolled reconstruction it calls a success matches the update
    far better than its failures (which stopped early: the loss at the truth is 0)."""
    net, params, ds = net8
    r = ch1a.unrolled_local_steps(net, params, ds.X[:4], ds.y[:4], local_lrs=(0.1,), max_iter=20, steps=2,
                                  success_db=20.0, seed=0)[0.1]
    assert r["one gradient"] == 0.0 and r["unrolled"] >= 0.5
    ok = r["psnr_unrolled"] >= 20.0
    assert float(r["loss_unrolled"][ok].max()) < 1e-3 and float(r["loss_truth"].max()) == 0.0


def _fake(psnr, loss):
    return {"psnr_unrolled": np.asarray(psnr, float), "loss_unrolled": np.asarray(loss, float),
            "loss_truth": np.zeros(len(psnr))}


def test_unrolled_paragraph_says_what_was_measured():
    stalls = ch1a.unrolled_paragraph({0.1: _fake([30, 5, 40], [1e-6, 2e-2, 3e-6]), 0.01: _fake([2, 50], [4e-3, 0.0])})
    assert "2 of the 5 unrolled attacks failed" in stalls and "at least 0.004" in stalls and "stalls" in stalls
    mixed = ch1a.unrolled_paragraph({0.1: _fake([30, 5], [1e-2, 2e-3])})
    assert "1 of the 2" in mixed and "does not separate" in mixed and "stalls" not in mixed
    assert "every one of the 2" in ch1a.unrolled_paragraph({0.1: _fake([30, 25], [1e-6, 2e-6])})
