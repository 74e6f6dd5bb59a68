"""fedlab.attacks.gradient_inversion's budgets and baselines (chapter 1a's attacks): DLG's budget in the
reference's units, the PSNR floors, Inverting Gradients with Gaussian starts and restarts, and the per-layer
gradient distance (Zhu et al. 2019, Fig. 3). The chapter's helpers built on them are tested in test_ch1a.py."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlab import models
from fedlab.attacks import gradient_inversion as gi
from fedlab.data.images import digit_images, sample_image_crops


@pytest.fixture(scope="module")
def digits_net():
    torch.set_num_threads(1)
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
    return net, models.get_params(net), digit_images(6, seed=1)


def _reference_run(net, params, obs, seed, steps, max_iter=20):
    """Zhu et al.'s reference loop (mit-han-lab/dlg, main.py): LBFGS([dummy_data, dummy_label]) with
    torch's defaults but max_iter, ``steps`` calls of ``step(closure)``; returns the dummy image, the
    dummy label logits and the number of closure calls."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((1, 1, 8, 8), generator=gen).requires_grad_(True)
    ylog = torch.randn((1, 10), generator=gen).requires_grad_(True)
    opt = torch.optim.LBFGS([x, ylog], lr=1.0, max_iter=max_iter)
    calls = [0]

    def closure():
        calls[0] += 1
        opt.zero_grad()
        v = gi.gradient_distance(gi.parameter_gradient(net, params, x, F.softmax(ylog, -1), create_graph=True), obs)
        v.backward()
        return v

    for _ in range(steps):
        opt.step(closure)
    assert opt.state[opt._params[0]]["func_evals"] == calls[0]
    return x.detach(), ylog.detach(), calls[0]


@pytest.mark.parametrize("image, seed, full", [(0, 0, True), (2, 0, False), (2, 3, False)])
def test_dlg_reference_loop_matches_torch_lbfgs_iterates_and_evaluations(image, seed, full):
    """gi.dlg(budget=AttackBudget(max_iter=20, lr=1.0, steps=S)) is the reference's loop: the same closure calls as torch's LBFGS in the
    reference's loop (S x 20 = 60 when no stopping test fires; fewer when a step ends early, as in the last
    two cases with torch 2.13: 52 when the loss stops changing, 25 when L-BFGS meets a non-descent direction
    and the run stays there; the first ran all 60) and the same final dummy image and label, in float64 to
    machine precision. The counts themselves are torch's and may move with its version: the test compares ours
    with torch's own count, checks the budget is never exceeded, and requires only that the last two cases stop
    before it (so the early-stop path is exercised); it pins no count."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.set_num_threads(1)
        net = gi.dlg_init_(models.lenet(1, 10, 8), seed=0)
        params = models.get_params(net)
        ds = digit_images(6, seed=1)
        X = ds.X.double()
        obs = gi.parameter_gradient(net, params, X[image:image + 1], ds.y[image:image + 1])
        x_ref, y_ref, calls = _reference_run(net, params, obs, seed, steps=3)
        assert 0 < calls <= 60 and (full or calls < 60), calls
        assert gi.reference_evaluations(3, 20) == 60
        ours = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10),
                      budget=gi.AttackBudget(max_iter=20, lr=1.0, steps=3), seed=seed)
        assert ours.evaluations == calls and len(ours.history["iteration"]) == calls
        assert torch.allclose(ours.x, x_ref.clamp(0, 1), atol=1e-8)
        assert int(ours.labels[0]) == int(y_ref.argmax())
    finally:
        torch.set_default_dtype(old)


def test_dlg_evaluation_counts_and_reference_budget(digits_net):
    net, params, ds = digits_net
    obs = {k: v[:3] for k, v in gi.per_example_gradients(net, params, ds.X[:3], ds.y[:3]).items()}
    assert gi.reference_evaluations() == 6000 == gi.DLG_REFERENCE_STEPS * gi.DLG_REFERENCE_MAX_ITER
    one_run = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10), budget=gi.AttackBudget(max_iter=40, lr=1.0),
                     stacked=True)
    assert one_run.evaluations == 41                            # 40 iterations + the final check
    ref = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10), budget=gi.AttackBudget(max_iter=20, lr=1.0, steps=2),
                 stacked=True)
    assert ref.evaluations.shape == (3,) and (ref.evaluations <= 40).all() and (ref.evaluations >= 2).all()
    with pytest.raises(ValueError, match="steps"):
        gi.AttackBudget(max_iter=20, lr=1.0, steps=0)


def test_inverting_gradients_counts_evaluations_and_restarts(digits_net):
    net, params, ds = digits_net
    obs = gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1])
    res = gi.inverting_gradients(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), labels=ds.y[:1]),
                                 budget=gi.AttackBudget(max_iter=7, lr=0.1, num_restarts=3))
    assert res.evaluations == 8 and res.history["restart_loss"].shape == (1, 3)
    chosen = int(res.history["chosen"][0])
    assert chosen == int(np.argmin(res.history["restart_loss"][0]))


def test_stacked_inverting_gradients_equals_separate_runs():
    torch.set_num_threads(1)
    crops = sample_image_crops(2, size=16, crop=64, seed=3)
    net = models.lenet(3, 10, 16, activation="relu", seed=0)
    p = models.get_params(net)
    g = gi.per_example_gradients(net, p, crops.X, crops.y)
    both = gi.inverting_gradients(net, p, g, knows=gi.Knowledge(input_shape=(3, 16, 16), labels=crops.y[:, None]),
                                  budget=gi.AttackBudget(max_iter=12, lr=0.1, num_restarts=2),
                                  prior=gi.ImagePrior(tv_weight=0.1, init_mean=[0.4, 0.5, 0.3], init_std=0.2),
                                  stacked=True, seed=4)
    assert both.x.shape == (2, 1, 3, 16, 16)
    # row a*R + r of the stack is trial r of attack a: rerun attack 1 alone with the same starting draws
    gen = torch.Generator().manual_seed(4)
    m = torch.tensor([0.4, 0.5, 0.3]).reshape(3, 1, 1)
    x0 = (m + 0.2 * torch.randn((4, 1, 3, 16, 16), generator=gen))[2:4]
    for r in range(2):
        x = x0[r].clone().requires_grad_(True)
        opt = torch.optim.Adam([x], lr=0.1)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[4, 7, 10], gamma=0.1)
        for _ in range(12):
            opt.zero_grad()
            gd = gi.parameter_gradient(net, p, x, crops.y[1:2], create_graph=True)
            loss = gi.gradient_distance(gd, {k: v[1] for k, v in g.items()}, "cosine") + 0.1 * gi.total_variation(x)
            loss.backward()
            x.grad.sign_()
            opt.step(); sched.step()
            with torch.no_grad():
                x.clamp_(0, 1)
        if r == int(both.history["chosen"][1]):
            assert torch.allclose(both.x[1], x.detach(), atol=1e-4)


def test_restarts_keep_the_best_trial_and_gaussian_start_beats_nothing():
    torch.set_num_threads(1)
    crops = sample_image_crops(1, size=16, crop=64, seed=0)
    net = models.lenet(3, 10, 16, activation="relu", seed=0)
    p = models.get_params(net)
    obs = gi.parameter_gradient(net, p, crops.X, crops.y)
    res = gi.inverting_gradients(net, p, obs, knows=gi.Knowledge(input_shape=(3, 16, 16), labels=crops.y),
                                 budget=gi.AttackBudget(max_iter=60, lr=0.1, num_restarts=4),
                                 prior=gi.ImagePrior(tv_weight=0.1), trace=gi.Trace(x_true=crops.X))
    losses = res.history["restart_loss"][0]
    assert losses.min() <= losses.max() and np.isfinite(losses).all() and losses.min() < 0.5
    assert res.history["psnr"][-1] > res.history["psnr"][0] + 3


def test_psnr_baselines_closed_forms():
    x = torch.zeros(2, 3, 4, 4)
    x[0] = 0.5                                           # grey image: grey baseline is exact
    x[1, 0] = 1.0                                        # red channel 1, others 0: mean colour is exact
    b = gi.psnr_baselines(x)
    assert b["grey"][0] == pytest.approx(120.0) and b["mean colour"][1] == pytest.approx(120.0)
    assert b["grey"][1] == pytest.approx(10 * np.log10(1 / 0.25))   # every pixel 0.5 away
    rnd = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    b = gi.psnr_baselines(rnd)
    assert (b["mean colour"] >= b["grey"] - 1e-9).all()               # the image's own mean is never worse
    with pytest.raises(ValueError, match="x_true"):
        gi.psnr_baselines(torch.zeros(3))
    with pytest.raises(ValueError, match="steps"):
        gi.reference_evaluations(0, 20)


def test_layer_mse_history_falls_with_image_mse(digits_net):
    """Zhu et al. (2019, Fig. 3): as DLG runs, every layer's gradient distance falls and so does the
    image error; the per-layer values sum back to the objective."""
    net, params, ds = digits_net
    obs = gi.parameter_gradient(net, params, ds.X[:1], ds.y[:1])
    res = gi.dlg(net, params, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10), budget=gi.AttackBudget(max_iter=40, lr=1.0),
                 trace=gi.Trace(x_true=ds.X[:1]))
    layers = gi.layer_groups(params)
    L = np.stack(res.history["layer_mse"])[:, 0]          # [iterations, layers]
    sizes = np.array([sum(params[k].numel() for k in g) for g in layers.values()])
    assert L.shape == (40, len(layers))
    assert np.allclose((L * sizes).sum(1), res.history["loss"], rtol=1e-3)
    assert (L[-1] < 1e-2 * L[0]).all()
    mse = np.array(res.history["image_mse"])[:, 0]
    assert mse[-1] < 1e-2 * mse[0]
    assert list(layers) == ["0", "2", "4", "7"]
