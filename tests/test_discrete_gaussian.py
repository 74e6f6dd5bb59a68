"""The discrete Gaussian mechanism (Canonne, Kamath & Steinke 2020) and the floating-point-safe Gaussian
releases of local DP and DP-FedAvg, tested on their real outputs (issue 34)."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedlab.attacks import floating_point as fp
from fedlab.privacy import discrete_gaussian as dg
from fedlab.privacy import dp_fedavg as D
from fedlab.privacy import ldp

EPS, DELTA, SENS = 2.0, 1e-5, 2.0
A, B = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])      # neighbours under LDP (distance sqrt 2 <= 2)


def test_bernoulli_exp_is_exact_in_law():
    gen = np.random.default_rng(0)
    m = 200_000
    for num, den in ((1, 3), (1, 1), (7, 2), (0, 5)):
        hits = dg._bernoulli_exp(np.full(m, num), np.full(m, den, dtype=np.int64), gen)
        p = math.exp(-num / den)
        assert abs(hits.mean() - p) < 5 * math.sqrt(p * (1 - p) / m) + 1e-12, (num, den, hits.mean(), p)


@pytest.mark.parametrize("sigma2", [1, 3, 50])
def test_sampler_matches_the_discrete_gaussian_pmf(sigma2):
    m = 200_000
    z = dg.sample_discrete_gaussian(sigma2, m, rng=sigma2)
    lim = int(4 * math.sqrt(sigma2)) + 1
    support = np.arange(-lim, lim + 1)
    expected = dg.discrete_gaussian_pmf(support, sigma2) * m
    observed = np.array([(z == v).sum() for v in support])
    tail_exp = m - expected.sum()
    tail_obs = m - observed.sum()
    chi2 = ((observed - expected) ** 2 / expected).sum() + (tail_obs - tail_exp) ** 2 / max(tail_exp, 1e-9)
    assert stats.chi2(len(support)).sf(chi2) > 1e-3, chi2
    # exact moments: mean 0, variance below sigma^2 (CKS20, Cor. 9) and close to it for sigma^2 >= 1
    var = float((dg.discrete_gaussian_pmf(support, sigma2) * support ** 2).sum())
    assert abs(z.mean()) < 5 * math.sqrt(var / m)
    assert z.var() == pytest.approx(var, rel=0.02)


def test_sampler_at_large_sigma_and_bad_input():
    z = dg.sample_discrete_gaussian(10 ** 8, 100_000, rng=1)
    assert z.dtype == np.int64 and abs(z.mean()) < 5 * 1e4 / math.sqrt(1e5)
    assert z.var() / 1e8 == pytest.approx(1.0, rel=0.02)
    assert dg.sample_discrete_gaussian(4, (3, 2), rng=0).shape == (3, 2)
    for bad in (0, 2.5, dg.MAX_SIGMA2 + 1, True):
        with pytest.raises(ValueError, match="sigma2"):
            dg.sample_discrete_gaussian(bad, 3)
    with pytest.raises(ValueError, match="size"):
        dg.sample_discrete_gaussian(4, -1)


def test_accounting_is_dp_accounting_renyi_on_the_same_curve():
    import dp_accounting
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(list(dg._ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(3.0), 5)
    assert dg.discrete_gaussian_epsilon(9.0, 1.0, 1e-5, compositions=5) == pytest.approx(acc.get_epsilon(1e-5))
    # the conversion is remembered (lru_cache): each of the three numbers is part of the key, and a remembered
    # answer is the bits of a fresh one
    for z, delta, k in ((3.0, 1e-5, 1), (3.0, 1e-5, 5), (3.0, 1e-6, 5), (2.5, 1e-6, 5), (3.0, 1e-5, 1)):
        fresh = rdp.RdpAccountant(list(dg._ORDERS))
        fresh.compose(dp_accounting.GaussianDpEvent(z), k)
        assert dg._rdp_epsilon(z, delta, k) == pytest.approx(fresh.get_epsilon(delta), rel=1e-9), (z, delta, k)
        assert dg._rdp_epsilon(z, delta, k) == dg._rdp_epsilon.__wrapped__(z, delta, k), (z, delta, k)
    s = dg.discrete_gaussian_sigma2(EPS, DELTA, 10.0)
    assert dg.discrete_gaussian_epsilon(s, 10.0, DELTA) <= EPS < dg.discrete_gaussian_epsilon(s - 1, 10.0, DELTA)
    # never less noise than the analytic (exact) Gaussian needs for the same (eps, delta)
    assert math.sqrt(s) >= ldp.analytic_gaussian_sigma(EPS, DELTA, 10.0)
    assert dg.integer_sensitivity(2.0, 0.5, 9) == 4.0 + 3.0
    for call, name in ((lambda: dg.integer_sensitivity(float("inf"), 1.0, 2), "sensitivity"),
                       (lambda: dg.integer_sensitivity(1.0, 0.0, 2), "grid"),
                       (lambda: dg.discrete_gaussian_epsilon(1.0, 1.0, 1.5), "delta"),
                       (lambda: dg.discrete_gaussian_sigma2(float("nan"), 1e-5, 1.0), "epsilon"),
                       (lambda: dg.choose_grid(2.0, 1e-5, 1.0, 10 ** 12), "n")):
        with pytest.raises(ValueError, match=name):
            call()


def _ldp_release(safe):
    def release(x, m, gen):
        g = torch.Generator().manual_seed(int(gen.integers(2 ** 62)))
        return ldp.ldp_gaussian(x.expand(m, -1).clone(), EPS, DELTA, SENS, generator=g, safe=safe)
    return release


@pytest.mark.slow
def test_float_ldp_gaussian_fails_and_the_safe_one_passes_the_distinguishing_test():
    # the numbers: (eps, delta) = (2, 1e-5), sensitivity 2, inputs [1, 0] and [0, 1], 10^5 releases
    plain = fp.distinguishing_event_probabilities(_ldp_release(False), A, B, num_samples=100_000, rng=0)
    assert plain.p_b == 0 and plain.p_a > 0.1 and plain.violates(EPS, DELTA), plain
    grid = dg.choose_grid(EPS, DELTA, SENS, 2)
    events = {"unreachable": None, "off the grid": fp.off_grid(grid), "off twice the grid": fp.off_grid(2 * grid)}
    for name, event in events.items():
        safe = fp.distinguishing_event_probabilities(_ldp_release(True), A, B, num_samples=100_000, rng=0, event=event)
        assert not safe.violates(EPS, DELTA), (name, safe)
    # a threshold event on the first coordinate: the mechanism's own (continuous) loss, within the guarantee
    thr = lambda y, _b: np.asarray(y[:, 0] > 2.5)                                  # noqa: E731
    safe = fp.distinguishing_event_probabilities(_ldp_release(True), A, B, num_samples=100_000, rng=1, event=thr)
    assert safe.p_a > safe.p_b > 0 and not safe.violates(EPS, DELTA), safe


def test_safe_ldp_release_is_on_its_grid_with_the_calibrated_noise():
    n = 2
    grid = dg.choose_grid(EPS, DELTA, SENS, n)
    s = dg.discrete_gaussian_sigma2(EPS, DELTA, dg.integer_sensitivity(SENS, grid, n))
    y = ldp.ldp_gaussian(A.expand(50_000, -1).clone(), EPS, DELTA, SENS, generator=torch.Generator().manual_seed(0),
                         safe=True).double()
    assert torch.equal(torch.remainder(y, grid), torch.zeros_like(y))
    noise = (y - A.double()) / grid
    assert float(noise.var()) == pytest.approx(s, rel=0.03)
    # the rounding costs little sensitivity: sigma within 5 % of the exact-rational calibration at SENS
    assert math.sqrt(s) * grid <= 1.05 * math.sqrt(dg.discrete_gaussian_sigma2(EPS, DELTA, 1000.0)) * SENS / 1000


def _dp_agg_release(safe):
    """m releases of a one-client DP-FedAvg round whose update is the secret, in one call: the client's
    update is m copies of the secret (rows of a [1, m, 2] tensor, clip norm above its norm), and the
    server's noise is i.i.d. per coordinate, so each row of the output is one release with sigma = 1."""
    def release(x, m, gen):
        g = torch.Generator().manual_seed(int(gen.integers(2 ** 62)))
        clip = 2.0 * math.sqrt(m)
        noisy, _ = D.dp_aggregate({"w": x.expand(1, m, -1).clone()}, clip_norm=clip, noise_multiplier=1.0 / clip,
                                  expected_clients=1.0, generator=g, safe=safe)
        return noisy["w"]
    return release


@pytest.mark.slow
def test_float_dp_fedavg_fails_and_the_safe_one_passes_the_distinguishing_test():
    grid = 2.0 ** math.floor(math.log2(1.0 / 1024))
    eps = dg.discrete_gaussian_epsilon(math.ceil((1.0 / grid) ** 2), dg.integer_sensitivity(math.sqrt(2), grid, 2), DELTA)
    assert 5 < eps < 9                                      # sigma = 1, L2 distance sqrt(2): Renyi bound
    plain = fp.distinguishing_event_probabilities(_dp_agg_release(False), A, B, num_samples=100_000, rng=0)
    assert plain.p_b == 0 and plain.p_a > 0.1 and plain.violates(eps, DELTA), plain
    for event in (None, fp.off_grid(grid), fp.off_grid(2 * grid)):
        safe = fp.distinguishing_event_probabilities(_dp_agg_release(True), A, B, num_samples=100_000, rng=0,
                                                     event=event)
        assert not safe.violates(eps, DELTA), safe
    y = _dp_agg_release(True)(A, 1000, np.random.default_rng(0)).double()
    assert torch.equal(torch.remainder(y, grid), torch.zeros_like(y))


def test_safe_dp_fedavg_accounting():
    z_eff = D.safe_noise_multiplier(1.0, 1.0, 10.0, 100)
    assert 0.95 < z_eff < 1.0                               # the rounding's sensitivity costs a little
    e_safe = D.epsilon_spent(z_eff, 0.1, 50, 1e-5, safe=True)
    # no amplification by sampling is claimed: as many full-participation Gaussian rounds
    assert e_safe == pytest.approx(dg.discrete_gaussian_epsilon(z_eff ** 2, 1.0, 1e-5, compositions=50))
    assert e_safe > D.epsilon_spent(z_eff, 0.1, 50, 1e-5, safe=False)       # the float accountant amplifies
    with pytest.raises(ValueError, match="grid"):
        D.discrete_noise({"w": torch.zeros(3)}, 1.0, grid=1e-9)
    with pytest.raises(ValueError, match="sigma"):
        D.discrete_noise({"w": torch.zeros(3)}, float("inf"))


@pytest.mark.parametrize("args, name", [((2.0, 1e-5, float("inf")), "sensitivity"), ((float("inf"), 1e-5, 1.0), "epsilon"),
                                        ((2.0, float("nan"), 1.0), "delta"), ((float("nan"), 1e-5, 1.0), "epsilon")])
def test_gaussian_sigma_rejects_non_finite_arguments(args, name):
    # issue 32 item 5: gaussian_sigma(2.0, 1e-5, inf) used to never return
    with pytest.raises(ValueError, match=name):
        ldp.gaussian_sigma(*args)
