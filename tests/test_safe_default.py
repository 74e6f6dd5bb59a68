"""The floating-point-safe Gaussian is fedlab's default (issue 34, item 1).

Every Gaussian DP mechanism defaults to the discrete Gaussian on a public grid (Canonne, Kamath &
Steinke 2020) and every accountant to its Renyi bound, so that a default release is never accounted
as the float mechanism (McMahan et al. 2018 Alg. 1; RAIFLE Sec. 4.1.1), whose guarantee fails on its
float output (Mironov 2012; Chapter 5). ``safe=False`` still gives the float mechanism.
"""
import dataclasses
import math

import pytest
import torch

from fedlab import models
from fedlab.fl import dp_fedavg as fdp
from fedlab.fl.dp_fedavg import DPSettings
from fedlab.fl import personalization as pers
from fedlab.privacy import dp_fedavg as dpf
from fedlab.privacy import ldp


def _on_grid(x: torch.Tensor, grid: float) -> bool:
    k = x.double() / grid
    return bool((k - k.round()).abs().max() < 1e-6)


def _lattice_step(row: torch.Tensor) -> float:
    d = (row[None] - row[:, None]).abs()
    return float(d[d > 0].min())


# ---------------------------------------------------------------------------------------------- mechanisms
def test_ldp_gaussian_defaults_to_the_discrete_gaussian():
    G = torch.randn(4, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gen = lambda: torch.Generator().manual_seed(5)                   # noqa: E731
    default = ldp.ldp_gaussian(G, 4.0, 1e-5, 1.0, generator=gen())
    assert torch.equal(default, ldp.ldp_gaussian(G, 4.0, 1e-5, 1.0, generator=gen(), safe=True))
    flt = ldp.ldp_gaussian(G, 4.0, 1e-5, 1.0, generator=gen(), safe=False)
    step = _lattice_step(default[0])
    assert _on_grid(default[0] - default[0][0], step)                 # the safe release lives on a lattice
    assert not _on_grid(flt[0] - flt[0][0], step)                     # the float one does not
    # the float mechanism is the continuous Gaussian of RAIFLE's calibration
    clipped = ldp.clip_rows(G, ldp.ldp_clip_norm(1.0))
    assert float((flt - clipped).std()) == pytest.approx(ldp.gaussian_sigma(4.0, 1e-5, 1.0), rel=0.05)


def test_dp_aggregate_defaults_to_the_discrete_gaussian_on_its_grid():
    u = {"w": torch.randn(6, 500, generator=torch.Generator().manual_seed(1))}
    kw = dict(clip_norm=1.0, noise_multiplier=1.3, expected_clients=6.0)
    gen = lambda: torch.Generator().manual_seed(2)                   # noqa: E731
    default, _ = dpf.dp_aggregate(u, generator=gen(), **kw)
    safe, _ = dpf.dp_aggregate(u, generator=gen(), safe=True, **kw)
    flt, _ = dpf.dp_aggregate(u, generator=gen(), safe=False, **kw)
    grid = dpf.safe_grid(dpf.noise_std(1.3, 1.0, 6.0))
    assert grid == 2.0 ** math.floor(math.log2(1.3 / 6.0 / 1024))
    assert torch.equal(default["w"], safe["w"]) and _on_grid(default["w"], grid)
    assert not _on_grid(flt["w"], grid)


def _server_step(**kw):
    params = {"w": torch.zeros(400, dtype=torch.float64)}
    updates = {"w": torch.randn(3, 400, generator=torch.Generator().manual_seed(4), dtype=torch.float64)}
    dp = DPSettings(noise_multiplier=1.1, clip_norm=1.0, sampling_prob=1.0, **kw)
    return fdp.dp_server_step(1, params, torch.arange(3), updates, dp=dp, expected_clients=3.0,
                              generator=torch.Generator().manual_seed(6))["w"]


def test_dp_server_step_forwards_safe_and_defaults_to_it():
    grid = dpf.safe_grid(dpf.noise_std(1.1, 1.0, 3.0))
    default, safe, flt = _server_step(), _server_step(safe=True), _server_step(safe=False)
    assert torch.equal(default, safe) and _on_grid(default, grid)     # from theta = 0 the step is the release
    assert not _on_grid(flt, grid)
    assert _on_grid(_server_step(grid=grid / 8), grid / 8) and not _on_grid(_server_step(grid=grid / 8), grid)


def _record_safe(monkeypatch):
    seen = []
    real = fdp.dp_aggregate

    def spy(*a, **kw):
        seen.append((kw.get("safe", "unset"), kw.get("grid", "unset")))
        return real(*a, **kw)

    monkeypatch.setattr(fdp, "dp_aggregate", spy)
    return seen


def _task():
    net = models.mlp(64, (4,), 10, seed=0)
    train, _ = pers.make_representation_task(6, 5, 5, classes_per_client=5, seed=0)
    return net, models.get_params(net), train


@pytest.mark.parametrize("kw, want", [({}, (True, None)), ({"safe": False}, (False, None)),
                                      ({"grid": 2.0 ** -12}, (True, 2.0 ** -12))])
def test_dp_fedavg_and_centaur_forward_safe_to_the_server_step(monkeypatch, kw, want):
    net, w0, train = _task()
    seen = _record_safe(monkeypatch)
    dp = DPSettings(noise_multiplier=1.0, clip_norm=0.5, sampling_prob=1.0, **kw)
    fdp.dp_fedavg(net, train, num_rounds=2, dp=dp, params=w0)
    assert seen == [want, want]
    seen.clear()
    pers.centaur(net, train, num_rounds=2, dp=dp, params=w0, heads=pers.PersonalHeads(head_epochs=1, final_head_epochs=1))
    assert seen == [want, want]


def test_dp_fedavg_default_release_is_on_the_grid():
    net, w0, train = _task()
    w0 = {k: torch.zeros_like(v) for k, v in w0.items()}
    rec = []
    dp = DPSettings(noise_multiplier=2.0, clip_norm=0.5, sampling_prob=1.0)
    fdp.dp_fedavg(net, train, num_rounds=1, dp=dp, params=w0, callback=rec.append)
    grid = dpf.safe_grid(dpf.noise_std(2.0, 0.5, 6.0))
    assert all(_on_grid(v, grid) for v in rec[0].new_params.values())
    rec.clear()
    fdp.dp_fedavg(net, train, num_rounds=1, dp=dataclasses.replace(dp, safe=False), params=w0, callback=rec.append)
    assert not all(_on_grid(v, grid) for v in rec[0].new_params.values())


# ---------------------------------------------------------------------------------------------- accountant
def test_the_accountants_default_is_the_mechanisms():
    z, q, T, delta = 1.2, 0.1, 50, 1e-5
    e = dpf.epsilon_spent(z, q, T, delta)
    assert e == dpf.epsilon_spent(z, q, T, delta, safe=True)
    # a safe release accounted as float would be charged far less (amplification by sampling is the float one's)
    assert e > 2 * dpf.epsilon_spent(z, q, T, delta, safe=False)
    assert dpf.noise_multiplier_for_epsilon(2.0, q, T, delta) == dpf.noise_multiplier_for_epsilon(2.0, q, T, delta,
                                                                                                   safe=True)
    assert dpf.noise_multiplier_for_epsilon(2.0, q, T, delta) > dpf.noise_multiplier_for_epsilon(2.0, q, T, delta,
                                                                                                  safe=False)


@pytest.mark.parametrize("ratio", [1024, 2 ** 14])
def test_safe_calibration_charges_the_rounding_of_every_parameter(ratio):
    eps, q, T, delta, n = 1.0, 0.3, 10, 1e-4, 310
    z = dpf.noise_multiplier_for_epsilon(eps, q, T, delta, num_params=n, grid_ratio=ratio)
    assert dpf.epsilon_spent(z, q, T, delta, num_params=n, grid_ratio=ratio) <= eps
    assert dpf.epsilon_spent(0.99 * z, q, T, delta, num_params=n, grid_ratio=ratio) > eps
    z_eff = dpf.noise_multiplier_for_epsilon(eps, q, T, delta)           # the discrete Gaussian's own multiplier
    assert z > z_eff
    # the true multiplier of the release on that grid is at least the bound, for every clip norm and denominator
    for S in (0.05, 0.2, 1.0, 7.0):
        for m in (3.0, 60.0, 300.0):
            grid = dpf.safe_grid(dpf.noise_std(z, S, m), ratio)
            true = dpf.safe_noise_multiplier(z, S, m, n, grid=grid)
            assert true >= dpf.safe_noise_multiplier_bound(z, n, ratio=ratio) * (1 - 1e-12)
            assert true >= z_eff * (1 - 1e-9)


def test_safe_accounting_arguments_are_checked():
    with pytest.raises(ValueError, match="num_params"):
        dpf.epsilon_spent(1.0, 0.1, 10, 1e-5, safe=False, num_params=10)
    with pytest.raises(ValueError, match="num_params"):
        dpf.epsilon_spent(1.0, 0.1, 10, 1e-5, num_params=0)
    with pytest.raises(ValueError, match="ratio"):
        dpf.epsilon_spent(1.0, 0.1, 10, 1e-5, num_params=10, grid_ratio=3)
    with pytest.raises(ValueError, match="ratio"):
        dpf.safe_grid(1.0, 2 ** 15)
    with pytest.raises(ValueError, match="sigma"):
        dpf.safe_grid(0.0)
    # 4,810 coordinates on the default grid cap the multiplier near 1024 / sqrt(4810) = 14.8
    with pytest.raises(ValueError, match="grid_ratio"):
        dpf.noise_multiplier_for_epsilon(0.5, 1.0, 10, 1e-3, num_params=4810)
    assert dpf.noise_multiplier_for_epsilon(0.5, 1.0, 10, 1e-3, num_params=4810, grid_ratio=2 ** 14) < 20
