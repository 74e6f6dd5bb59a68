"""Robbing the Fed (Fowl et al. 2022, Sec. 3): the imprint module reads single inputs out of a gradient,
also out of the sum that secure aggregation releases; checked through the real autograd gradient."""
import numpy as np
import pytest
import torch
from torch import nn

from fedlab import fl
from fedlab.attacks import imprint as im
from fedlab.data import load_digits
from fedlab.data.images import digit_images

DIM, K = 20, 16


def planted(bins, *, dim=DIM, num_bins=K, seed=0):
    """Inputs ``[len(bins), dim]`` (float64) whose measurement ``h(x) = w . x`` lies at the middle of
    the given bins of the imprint layer built with ``N(0, 1)`` and a random unit direction, and the
    layer's weight and bias."""
    W, b = im.imprint_layer(dim, num_bins, mean=0.0, std=1.0, direction="random", seed=seed)
    w, c = W[0], -b
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.rand(len(bins), dim, generator=gen, dtype=torch.float64)
    width = float(c[1] - c[0])
    targets = []
    for j in bins:
        hi = c[j + 1] if j + 1 < num_bins else c[j] + width
        targets.append(float(c[j] + hi) / 2 + 0.01 * width * len(targets) / max(len(bins), 1))
    t = torch.tensor(targets, dtype=torch.float64)
    X = X + (t - X @ w)[:, None] * w[None]          # w has unit norm: now X @ w == t
    return X, W, b


def imprinted(W, b, num_classes=3, seed=0):
    torch.manual_seed(seed)
    base = nn.Linear(W.shape[1], num_classes)
    return im.ImprintedModel(base, W, b).double()


def autograd_imprint_grad(model, X, y):
    loss = nn.functional.cross_entropy(model(X), y)
    return torch.autograd.grad(loss, [model.imprint.weight, model.imprint.bias])


def test_imprint_layer_rows_and_equal_probability_bins():
    W, b = im.imprint_layer(64, 8, mean=2.0, std=0.5)
    assert W.shape == (8, 64) and b.shape == (8,)
    assert torch.allclose(W, torch.full_like(W, 1 / 64))
    from statistics import NormalDist
    p = [NormalDist(2.0, 0.5).cdf(float(c)) for c in -b]
    assert np.allclose(p, np.arange(1, 9) / 9)
    ref = torch.randn(1000, 5, dtype=torch.float64)
    W2, b2 = im.imprint_layer(5, 4, reference=ref, direction="random", seed=3)
    h = ref @ W2[0]
    assert np.allclose([(h <= c).double().mean() for c in -b2], [0.2, 0.4, 0.6, 0.8], atol=2e-3)


def test_planted_batch_recovered_exactly_through_autograd():
    bins = [0, 3, 5, 8, 11, 15]                      # every input alone in its bin, the last bin included
    X, W, b = planted(bins)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    model = imprinted(W, b)
    gW, gb = autograd_imprint_grad(model, X, y)
    rec = im.recover_from_imprint(gW, gb, weight=W, bias=b)
    assert rec.bins.tolist() == bins
    assert rec.occupied.sum() == len(bins) and rec.consistent[bins].all()
    assert (rec.x - X).abs().max() < 1e-5
    assert (rec.x - X).abs().max() < 1e-10               # in fact exact up to float64 rounding

    # an honest client training the imprinted model with fedlab.fl: one SGD step, the server reads
    # the update (a multiple of the gradient) and recovers the same inputs; theta_0 - theta_1 carries
    # rounding of the parameters (~eps |theta|) in the empty bins, hence a larger rtol
    params = {k: v.detach() for k, v in model.named_parameters()}
    new = fl.client_update(model, params, X, y, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=None))
    rec2 = im.recover_from_imprint(params["imprint.weight"] - new["imprint.weight"],
                                   params["imprint.bias"] - new["imprint.bias"], rtol=1e-8)
    assert rec2.bins.tolist() == bins
    assert (rec2.x - X).abs().max() < 1e-8

    res = im.imprint_attack(X, y, trap=im.ImprintTrap(num_bins=K), model=imprinted(W, b))
    assert res.rate == 1.0 and res.unique[bins].all() and res.counts.sum() == len(bins)


def test_secure_aggregation_sum_of_three_clients_recovered():
    bins = list(range(0, 16, 1))
    X, W, b = planted(bins, seed=4)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    clients = [X[perm[:5]], X[perm[5:9]], X[perm[9:]]]   # batches of 5, 4 and 7
    labels = [torch.randint(3, (len(c),), generator=torch.Generator().manual_seed(i)) for i, c in
              enumerate(clients)]
    model = imprinted(W, b)
    summed = [torch.zeros_like(W), torch.zeros_like(b)]
    for c, t in zip(clients, labels):                 # the server only sees the sum of the updates
        g = autograd_imprint_grad(model, c, t)
        summed = [summed[0] + g[0], summed[1] + g[1]]
    rec = im.recover_from_imprint(*summed)
    assert rec.x.shape == (16, DIM)
    assert (rec.x - X).abs().max() < 1e-9
    res = im.imprint_attack(clients, labels, trap=im.ImprintTrap(num_bins=K), model=imprinted(W, b))
    assert res.rate == 1.0 and res.error.max() < 1e-12

    # a real aggregate: every client in its own batch, inputs of different clients alone in their bins
    # and two inputs of *different* clients sharing a bin (only those two are lost)
    X2, W2, b2 = planted([1, 4, 4, 9, 12, 13], seed=5)
    res = im.imprint_attack([X2[:2], X2[2:4], X2[4:]], trap=im.ImprintTrap(num_bins=K), model=imprinted(W2, b2),
                            num_classes=3)
    assert res.recovered.tolist() == [True, False, False, True, True, True]
    assert res.unique.sum() == 4 and res.counts[4] == 2


def test_two_inputs_in_one_bin_give_their_gradient_weighted_mixture():
    X, W, b = planted([2, 2, 7], seed=1)
    y = torch.tensor([0, 2, 1])
    model = imprinted(W, b, seed=1)
    gW, gb = autograd_imprint_grad(model, X, y)
    rec = im.recover_from_imprint(gW, gb, weight=W, bias=b)
    assert rec.bins.tolist() == [2, 7]
    mix = rec.x[0]
    # g_x: the backward signal of each input alone, read off its own bias gradient in bin 2
    g = torch.stack([autograd_imprint_grad(model, X[i:i + 1], y[i:i + 1])[1][2] / 3 for i in range(2)])
    assert torch.allclose(mix, (g[0] * X[0] + g[1] * X[1]) / (g[0] + g[1]), atol=1e-10)
    assert min((mix - X[0]).norm(), (mix - X[1]).norm()) > 1e-2
    assert (rec.x[1] - X[2]).abs().max() < 1e-10
    res = im.imprint_attack(X, y, trap=im.ImprintTrap(num_bins=K), model=imprinted(W, b, seed=1))
    assert res.recovered.tolist() == [False, False, True]
    assert res.counts[2] == 2 and not res.unique[2] and res.unique[7]
    assert res.rate == pytest.approx(1 / 3)


def test_empty_bins_give_no_vector_and_zero_gradient_gives_nothing():
    rec = im.recover_from_imprint(torch.zeros(4, 3), torch.zeros(4))
    assert rec.x.shape == (0, 3) and not rec.occupied.any()
    assert torch.isinf(im.match_recovered(torch.ones(2, 3), rec.x)).all()


def digits_rates(batch, num_bins, trials=5):
    X = load_digits().X
    w = im._direction(64, "random", 0)
    h = X.double() @ w
    rng = np.random.default_rng(0)
    rates = []
    for t in range(trials):
        idx = torch.as_tensor(rng.choice(len(X), batch, replace=False))
        trap = im.ImprintTrap(num_bins=num_bins, mean=float(h.mean()), std=float(h.std()), direction=w)
        rates.append(im.imprint_attack(X[idx], trap=trap, seed=t).rate)
    return float(np.mean(rates))


def test_recovery_rate_falls_with_batch_size_on_digits():
    small, large = digits_rates(8, 64), digits_rates(128, 64)
    assert small > 0.7 and large < 0.3 and small > large


def test_recovery_grid_shape_and_monotone_in_bins():
    X = load_digits().X
    grid = im.imprint_recovery_grid(X, (4, 16), (16, 64, 256), trials=3, seed=0)
    assert grid.shape == (2, 3)
    assert ((grid >= 0) & (grid <= 1)).all()
    assert np.all(np.diff(grid[1]) >= 0) and grid[1, -1] > grid[1, 0]
    rates, alone = im.imprint_recovery_grid(X, (4, 16), (16, 64, 256), trials=3, seed=0, return_alone=True)
    assert np.array_equal(rates, grid)                  # the same batches and numbers, with or without the count
    assert np.array_equal(rates, alone)                 # recovered: exactly the inputs alone in their bin


def test_bad_inputs_raise_value_error_naming_the_argument():
    with pytest.raises(ValueError, match="num_bins"):
        im.imprint_layer(4, 0, mean=0, std=1)
    with pytest.raises(ValueError, match="dim"):
        im.imprint_layer(0, 3, mean=0, std=1)
    with pytest.raises(ValueError, match="std"):
        im.imprint_layer(4, 3, mean=0, std=0)
    with pytest.raises(ValueError, match="mean"):
        im.imprint_layer(4, 3, mean=float("nan"), std=1)
    with pytest.raises(ValueError, match="mean and std"):
        im.imprint_layer(4, 3)
    with pytest.raises(ValueError, match="direction"):
        im.imprint_layer(4, 3, mean=0, std=1, direction="sideways")
    with pytest.raises(ValueError, match="direction"):
        im.imprint_layer(4, 3, mean=0, std=1, direction=torch.ones(5))
    with pytest.raises(ValueError, match="reference"):
        im.imprint_layer(4, 3, reference=torch.ones(10, 5))
    with pytest.raises(ValueError, match="base"):
        im.imprint_model("not a module", 4, 3, mean=0, std=1)
    with pytest.raises(ValueError, match="grad_weight"):
        im.recover_from_imprint(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="grad_bias"):
        im.recover_from_imprint(torch.zeros(4, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="grad_weight"):
        im.recover_from_imprint(torch.full((4, 3), float("nan")), torch.zeros(4))
    with pytest.raises(ValueError, match="rtol"):
        im.recover_from_imprint(torch.zeros(4, 3), torch.zeros(4), rtol=-1)
    with pytest.raises(ValueError, match="bias"):
        im.recover_from_imprint(torch.zeros(4, 3), torch.zeros(4), weight=torch.zeros(4, 3),
                                bias=torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="X"):
        im.imprint_attack(torch.zeros(5), trap=im.ImprintTrap(num_bins=4))
    with pytest.raises(ValueError, match="y"):
        im.imprint_attack(torch.zeros(5, 3), torch.zeros(4, dtype=torch.long), trap=im.ImprintTrap(num_bins=4))
    with pytest.raises(ValueError, match="ImprintTrap.num_bins"):
        im.ImprintTrap(num_bins=-2)
    with pytest.raises(ValueError, match="ImprintTrap.std"):
        im.ImprintTrap(num_bins=4, mean=0.5, std=0.0)
    with pytest.raises(ValueError, match="ImprintTrap.mean and ImprintTrap.std"):
        im.ImprintTrap(num_bins=4, mean=0.5)
    with pytest.raises(ValueError, match="trap"):
        im.imprint_attack(torch.rand(5, 3), trap=4)
    with pytest.raises(ValueError, match="tol"):
        im.imprint_attack(torch.rand(5, 3), trap=im.ImprintTrap(num_bins=4), tol=0)
    with pytest.raises(ValueError, match="model"):
        im.imprint_attack(torch.rand(5, 3), trap=im.ImprintTrap(num_bins=4), model=nn.Linear(3, 2))
    X = load_digits().X
    with pytest.raises(ValueError, match="batch_sizes"):
        im.imprint_recovery_grid(X, (0,), (4,), 1, 0)
    with pytest.raises(ValueError, match="bins"):
        im.imprint_recovery_grid(X, (4,), (), 1, 0)
    with pytest.raises(ValueError, match="trials"):
        im.imprint_recovery_grid(X, (4,), (4,), 0, 0)


def test_expected_imprint_rate_matches_the_measured_grid():
    """(k / (k + 1))^B: k + 1 equally likely intervals, the lowest never recovered, and no other of the
    B inputs in the same interval. Measured on digits over 20 random batches per cell."""
    from fedlab.attacks import imprint

    assert imprint.expected_recovery_rate(1, 1) == pytest.approx(0.5)
    assert imprint.expected_recovery_rate(64, 256) == pytest.approx((256 / 257) ** 64)
    grid_e = imprint.expected_recovery_rate(np.array([[16], [64]]), np.array([[16, 256]]))
    assert grid_e.shape == (2, 2)
    X = digit_images(None).X.reshape(-1, 64)
    grid = imprint.imprint_recovery_grid(X, [16, 64], [16, 256], trials=20, seed=3)
    assert np.abs(grid - grid_e).max() < 0.08, (grid, grid_e)
    with pytest.raises(ValueError, match="batch_size"):
        imprint.expected_recovery_rate(0, 16)
