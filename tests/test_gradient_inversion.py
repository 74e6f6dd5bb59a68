"""Gradient inversion (Zhu et al. 2019 DLG; Zhao et al. 2020 iDLG; Geiping et al. 2020) and the cheap
defenses it is measured against, checked against closed forms and known behaviour."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlab import models
from fedlab.attacks import gradient_inversion as gi
from fedlab.data.images import digit_images, sample_image_crops, synthetic_sentences
from fedlab.privacy import gaussian_noise, prune_by_magnitude


def dlg_objective(net, params, x, y_soft, observed):
    """DLG's gradient-matching objective (Zhu et al. 2019, Eq. 4) at dummy data ``(x, y_soft)``,
    written with autograd: an oracle for the vmapped objective inside :func:`gi.dlg`."""
    g = gi.parameter_gradient(net, params, x, y_soft, create_graph=True)
    return gi.gradient_distance(g, observed, "l2")


@pytest.fixture(scope="module")
def digits_net():
    torch.set_num_threads(1)
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
    return net, models.get_params(net), digit_images(6, seed=1)


def test_objective_is_zero_with_zero_gradient_at_true_input(digits_net):
    net, params, ds = digits_net
    X, y = ds.X[:1], ds.y[:1]
    observed = gi.parameter_gradient(net, params, X, y)
    x = X.clone().requires_grad_(True)
    soft = F.one_hot(y, 10).float().requires_grad_(True)
    val = dlg_objective(net, params, x, soft, observed)
    gx, gs = torch.autograd.grad(val, [x, soft])
    assert float(val.detach()) < 1e-12
    assert float(gx.abs().max()) < 1e-6 and float(gs.abs().max()) < 1e-6
    # away from the truth the objective and its gradient are not zero (the test can fail)
    x2 = (X + 0.1).requires_grad_(True)
    val2 = dlg_objective(net, params, x2, soft.detach(), observed)
    (gx2,) = torch.autograd.grad(val2, [x2])
    assert float(val2.detach()) > 1e-6 and float(gx2.abs().max()) > 1e-6


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_idlg_label_rule_on_random_networks(activation):
    hits = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        net = models.mlp(16, (32, 24), 7, activation=activation, seed=seed)
        p = models.get_params(net)
        x, y = torch.randn(1, 16, generator=g), torch.randint(0, 7, (1,), generator=g)
        obs = gi.parameter_gradient(net, p, x, y)
        row_sums = obs["4.weight"].sum(1)
        assert row_sums[y].item() <= 0 and (torch.cat([row_sums[:y], row_sums[y + 1:]]) >= 0).all()
        hits += gi.idlg_label(obs) == int(y)
    assert hits == 20


def test_idlg_on_lenet_digits(digits_net):
    net, params, ds = digits_net
    labels = [gi.idlg_label(gi.parameter_gradient(net, params, ds.X[i:i + 1], ds.y[i:i + 1]))
              for i in range(len(ds))]
    assert labels == ds.y.tolist()


def test_dlg_recovers_single_digits_and_label(digits_net):
    net, params, ds = digits_net
    obs = {k: torch.stack([gi.parameter_gradient(net, params, ds.X[i:i + 1], ds.y[i:i + 1])[k]
                           for i in range(2)]) for k in params}
    res = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10), budget=gi.AttackBudget(max_iter=40, lr=1.0),
                 stacked=True)
    psnr = [gi.matched_psnr(r, t)[0] for r, t in zip(res.x, ds.X[:2, None])]
    assert min(psnr) > 25, psnr
    assert res.labels.flatten().tolist() == ds.y[:2].tolist()


def test_batched_lbfgs_matches_torch_lbfgs(digits_net):
    """Our batched two-loop L-BFGS reproduces torch.optim.LBFGS (lr=1, no line search) exactly."""
    net, params, ds = digits_net
    X, y = ds.X[:1], ds.y[:1]
    obs = gi.parameter_gradient(net, params, X, y)
    ours = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, labels=y),
                  budget=gi.AttackBudget(max_iter=5, lr=1.0), seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((1, 1, 8, 8), generator=gen).requires_grad_(True)
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=1, history_size=100)
    soft = F.one_hot(y, 10).float()

    def closure():
        opt.zero_grad()
        v = dlg_objective(net, params, x, soft, obs)
        v.backward()
        return v

    for _ in range(5):
        opt.step(closure)
    assert torch.allclose(ours.x, x.detach().clamp(0, 1), atol=2e-3)  # float32 round-off only


def test_local_steps_update_and_gradient(digits_net):
    net, params, ds = digits_net
    X, y = ds.X[:2], ds.y[:2]
    g = gi.parameter_gradient(net, params, X, y)
    u1 = gi.client_update_as_gradient(net, params, X, y, lr=0.01, local_steps=1)
    assert all(torch.allclose(u1[k], g[k], atol=1e-4) for k in g)
    u9 = gi.client_update_as_gradient(net, params, X, y, lr=0.01, local_steps=9)
    assert max(float((u9[k] - g[k]).abs().max()) for k in g) > 1e-3      # the path moved


def test_distances_closed_forms():
    a = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])}
    assert float(gi.gradient_distance(a, b, "l2")) == pytest.approx(26.0)
    assert float(gi.gradient_distance(a, b, "cosine")) == pytest.approx(1.0)
    scaled = {k: 7.0 * v for k, v in a.items()}
    assert float(gi.gradient_distance(scaled, a, "cosine")) == pytest.approx(0.0, abs=1e-6)
    assert float(gi.total_variation(torch.ones(2, 3, 5, 5))) == 0.0
    checker = (torch.arange(4)[:, None] + torch.arange(4)[None, :]) % 2
    assert float(gi.total_variation(checker.float()[None, None])) == pytest.approx(2.0)


def test_matched_psnr_ignores_order_and_success_rate():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 1, 8, 8, generator=g)
    noisy = (x + 0.01 * torch.randn(x.shape, generator=g))
    p_same = gi.matched_psnr(noisy, x)
    p_perm = gi.matched_psnr(noisy[[2, 0, 3, 1]], x)
    assert np.allclose(p_same, p_perm)
    assert abs(p_same.mean() - 40.0) < 1.5                   # MSE ~ 1e-4 -> 40 dB
    assert gi.success_rate([10, 25, 30, 15], 20) == 0.5


def test_inverting_gradients_improves_on_relu():
    torch.manual_seed(0)
    crops = sample_image_crops(1, size=16, crop=64, seed=0)
    net = models.lenet(3, 10, 16, activation="relu", seed=0)
    p = models.get_params(net)
    obs = gi.parameter_gradient(net, p, crops.X, crops.y)
    label = torch.tensor([gi.idlg_label(obs)])
    res = gi.inverting_gradients(net, p, obs, knows=gi.Knowledge(input_shape=(3, 16, 16), labels=label),
                                 budget=gi.AttackBudget(max_iter=60, lr=0.1), prior=gi.ImagePrior(tv_weight=0.1),
                                 trace=gi.Trace(x_true=crops.X))
    assert res.history["loss"][-1] < 0.5 * res.history["loss"][0]
    assert res.history["psnr"][-1] > res.history["psnr"][0] + 3


def test_pruning_keeps_exact_fraction_and_noise_scale():
    g = torch.Generator().manual_seed(0)
    upd = {"a": torch.randn(30, 10, generator=g), "b": torch.randn(50, generator=g)}
    n = 350
    for frac in [0.0, 0.3, 0.9, 0.99]:
        kept = prune_by_magnitude(upd, frac)
        nnz = sum(int((v != 0).sum()) for v in kept.values())
        assert nnz == n - math.floor(frac * n)
        smallest_kept = min(float(v[v != 0].abs().min()) for v in kept.values() if (v != 0).any())
        largest_cut = max([float(upd[k][kept[k] == 0].abs().max()) for k in upd if (kept[k] == 0).any()],
                          default=0.0)
        assert smallest_kept >= largest_cut
    noisy = gaussian_noise(torch.zeros(20000), 0.05, generator=g)
    assert abs(float(noisy.std()) - 0.05) < 0.002


def test_bad_inputs_raise(digits_net):
    net, params, ds = digits_net
    obs = gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1])
    with pytest.raises(ValueError, match="observed"):
        gi.dlg(net, params, {}, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10))
    bad = dict(obs)
    bad["6.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="observed"):
        gi.dlg(net, params, bad, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10))
    with pytest.raises(ValueError, match="observed"):
        gi.gradient_distance({}, {})
    with pytest.raises(ValueError, match="kind"):
        gi.gradient_distance(obs, obs, "l1")
    with pytest.raises(ValueError, match="max_iter"):
        gi.AttackBudget(max_iter=0, lr=1.0)
    with pytest.raises(ValueError, match="labels"):
        gi.Knowledge(input_shape=(1, 8, 8), labels=torch.zeros(1))
    with pytest.raises(ValueError, match="labels"):          # Inverting Gradients needs them
        gi.inverting_gradients(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8)))
    with pytest.raises(ValueError, match="x_rec"):
        gi.matched_psnr(torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="local_steps"):
        gi.client_update_as_gradient(net, params, ds.X[:1], ds.y[:1], lr=0.1, local_steps=0)
    with pytest.raises(ValueError, match="num_classes"):
        gi.idlg_label(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="batch_size"):
        gi.attack_grid(net, params, ds.X[:2], ds.y[:2], num_classes=10, settings={"one": {}}, batch_size=4)


def test_image_and_text_data():
    d = digit_images(5, seed=0)
    assert d.X.shape == (5, 1, 8, 8) and 0 <= float(d.X.min()) and float(d.X.max()) <= 1
    c = sample_image_crops(3, seed=0)
    assert c.X.shape == (3, 3, 32, 32) and c.y.tolist() == [0, 1, 0]
    assert 0 <= float(c.X.min()) and float(c.X.max()) <= 1 and float(c.X.std()) > 0.02
    with pytest.raises(ValueError, match="crop"):
        sample_image_crops(1, size=32, crop=40)
    with pytest.raises(ValueError, match="num_images"):
        digit_images(0)
    s = synthetic_sentences(4000, vocab_size=50, sentence_length=10, zipf_exponent=1.0, seed=0)
    assert s.X.shape == (4000, 10) and int(s.X.max()) < 50 and len(s.meta["vocab"]) == 50
    # the most frequent word of topic 0 appears with probability 1 / H_50 (Zipf with exponent 1)
    top = int(np.argmax(s.meta["topic_probs"][0]))
    freq = float((s.X[s.y == 0] == top).float().mean())
    expected = 1.0 / sum(1.0 / r for r in range(1, 51))
    assert abs(freq - expected) < 0.015, (freq, expected)


def test_matching_loss_is_zero_at_the_truth_and_ignores_what_was_not_sent():
    """DLG's normalised objective (the loss-at-the-truth check): 0 at the true input of an exact gradient,
    positive elsewhere; under a mask only the sent coordinates count; bad input raises."""
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
    w = models.get_params(net)
    X, y = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 4, 7])
    obs = {k: torch.stack([gi.parameter_gradient(net, w, X[a:a + 1], y[a:a + 1])[k] for a in range(3)]) for k in w}
    lab = y[:, None]
    at_truth = gi.matching_loss(net, w, X[:, None], lab, obs)
    elsewhere = gi.matching_loss(net, w, X.roll(1, 0)[:, None], lab, obs)
    assert at_truth.shape == (3,) and at_truth.dtype == torch.float64
    assert float(at_truth.max()) < 1e-12 and float(elsewhere.min()) > 1e-4, (at_truth, elsewhere)
    # a mask: garbage in the coordinates that were not sent changes nothing, in a sent one it does
    mask = {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(1)) < 0.3 for k, v in obs.items()}
    noisy = {k: torch.where(mask[k], v, v + 5.0) for k, v in obs.items()}
    assert float(gi.matching_loss(net, w, X[:, None], lab, noisy, mask=mask).max()) < 1e-12
    assert float(gi.matching_loss(net, w, X[:, None], lab, noisy).min()) > 0.5        # normalised by the garbage
    # the cosine term (Inverting Gradients'): 0 at the truth, blind to the observation's scale, positive elsewhere
    cos_truth = gi.matching_loss(net, w, X[:, None], lab, {k: 3 * v for k, v in obs.items()}, kind="cosine")
    assert float(cos_truth.abs().max()) < 1e-12
    assert float(gi.matching_loss(net, w, X.roll(1, 0)[:, None], lab, obs, kind="cosine").min()) > 1e-4
    with pytest.raises(ValueError, match="kind"):
        gi.matching_loss(net, w, X[:, None], lab, obs, kind="l1")
    with pytest.raises(ValueError, match="leading size"):
        gi.matching_loss(net, w, X[:2, None], lab, obs)
    with pytest.raises(ValueError, match="all zero"):
        gi.matching_loss(net, w, X[:, None], lab, {k: torch.zeros_like(v) for k, v in obs.items()})
    with pytest.raises(ValueError, match="stacked"):
        gi.matching_loss(net, w, X[:, None], lab, {k: v[0] for k, v in obs.items()})


def test_settings_objects_validate_their_fields(digits_net):
    """Knowledge, ImagePrior and Trace raise a ValueError naming the field; an attack rejects a budget field it
    does not use instead of ignoring it."""
    net, params, ds = digits_net
    for kw, field in [(dict(input_shape=()), "input_shape"), (dict(input_shape=(1, 0)), "input_shape"),
                      (dict(num_classes=1), "num_classes"), (dict(batch_size=0), "batch_size"),
                      (dict(labels=torch.zeros(2)), "labels"), (dict(mask=[1]), "mask"),
                      (dict(clip_norm=0.0), "clip_norm"), (dict(clip_norm=float("inf")), "clip_norm")]:
        with pytest.raises(ValueError, match=f"Knowledge.{field}"):
            gi.Knowledge(**{"input_shape": (1, 8, 8), **kw})
    for kw, field in [(dict(tv_weight=-1.0), "tv_weight"), (dict(init="zeros"), "init"),
                      (dict(init_std=0.0), "init_std"), (dict(init_std=[0.2, -0.1]), "init_std"),
                      (dict(signed=1), "signed")]:
        with pytest.raises(ValueError, match=f"ImagePrior.{field}"):
            gi.ImagePrior(**kw)
    assert gi.ImagePrior(init="uniform", init_std=0.0).init == "uniform"     # the std of a start not drawn
    inf, nan = float("inf"), float("nan")
    for kw, field in [(dict(tv_weight=inf), "tv_weight"), (dict(tv_weight=nan), "tv_weight"),
                      (dict(tv_weight="0.1"), "tv_weight"), (dict(init_std=inf), "init_std"),
                      (dict(init_std=torch.tensor([0.2, inf])), "init_std"), (dict(init_mean=nan), "init_mean"),
                      (dict(init_mean=[0.4, nan, 0.3]), "init_mean"), (dict(init_mean="0.5"), "init_mean"),
                      (dict(init="uniform", init_std=inf), "init_std")]:
        with pytest.raises(ValueError, match=f"ImagePrior.{field}"):
            gi.ImagePrior(**kw)
    gi.ImagePrior(tv_weight=0, init_mean=torch.tensor([0.4, 0.5, 0.3]), init_std=np.float64(0.2))
    with pytest.raises(ValueError, match="Trace.snapshot_every"):
        gi.Trace(snapshot_every=0)
    with pytest.raises(ValueError, match="Trace.x_true"):
        gi.Trace(x_true=[0.5])
    obs = gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1])
    knows = gi.Knowledge(input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match="num_restarts"):
        gi.dlg(net, params, obs, knows=knows, budget=gi.AttackBudget(max_iter=2, lr=1.0, num_restarts=2))
    with pytest.raises(ValueError, match="num_classes"):
        gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8)))
    ig_knows = gi.Knowledge(input_shape=(1, 8, 8), labels=ds.y[:1])
    with pytest.raises(ValueError, match="steps"):
        gi.inverting_gradients(net, params, obs, knows=ig_knows, budget=gi.AttackBudget(max_iter=2, lr=0.1, steps=2))
    with pytest.raises(ValueError, match="clip_norm"):
        gi.inverting_gradients(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), labels=ds.y[:1],
                                                                    clip_norm=1.0))
    with pytest.raises(ValueError, match="batch_size"):
        gi.inverting_gradients(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), labels=ds.y[:1],
                                                                    batch_size=2))
