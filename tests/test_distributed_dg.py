"""The distributed discrete Gaussian (KLS21): its privacy bound against exact Renyi divergences of the
real noise, its outputs against the guarantee, and its integer arithmetic inside secure aggregation."""
import math

import numpy as np
import pytest
import torch

from fedlab.privacy import discrete_gaussian as dg
from fedlab.privacy import distributed_dg as ddg
from fedlab.privacy import secure_aggregation as sa
from fedlab.privacy.defenses import clip_rows


def _sum_log_pmf(n: int, sigma2: float):
    """Support and log pmf of the sum of ``n`` i.i.d. ``N_Z(0, sigma2)`` (exact convolution in float64)."""
    lim = int(40 * math.sqrt(sigma2)) + 10
    z = np.arange(-lim, lim + 1)
    p = np.exp(-z * z / (2 * sigma2))
    p /= p.sum()
    s = p.copy()
    for _ in range(n - 1):
        s = np.convolve(s, p)
    support = np.arange(-n * lim, n * lim + 1)
    return support, np.log(np.maximum(s, 1e-320))


def _renyi(n: int, sigma2: float, shift: int, alpha: float) -> float:
    """``D_alpha(S || S + shift)`` for the sum ``S`` of ``n`` discrete Gaussians, on the support where
    both pmfs are above 1e-250 (the tails beyond add positive terms: this is a lower bound)."""
    _, logp = _sum_log_pmf(n, sigma2)
    lp, lq = logp[shift:], logp[:-shift]          # P(s) and P(s - shift) = Q(s)
    keep = (lp > -575) & (lq > -575)
    terms = alpha * lp[keep] + (1 - alpha) * lq[keep]
    m = terms.max()
    return float((m + math.log(np.exp(terms - m).sum())) / (alpha - 1))


CASES = [(2, 0.25, 1), (3, 0.25, 1), (5, 0.3, 2), (10, 0.25, 1), (4, 0.26, 3), (2, 1.0, 1), (8, 2.0, 3)]


@pytest.mark.parametrize("n,sigma2,shift", CASES)
def test_prop14_bound_holds_against_the_exact_renyi_divergence(n, sigma2, shift):
    rho = ddg.ddg_rho(sigma2, n, float(shift), float(shift), 1)
    for alpha in (1.5, 2.0, 3.0, 5.0):
        assert _renyi(n, sigma2, shift, alpha) <= alpha * rho * (1 + 1e-9), (n, sigma2, shift, alpha)


def test_tau_cannot_be_dropped():
    """Without Prop. 14's tau the bound is the one of an exact discrete Gaussian of variance n sigma^2,
    and the real sum exceeds it: the test above would fail with tau = 0."""
    worst = 0.0
    for n, sigma2, shift in CASES:
        plain = shift * shift / (2 * n * sigma2)     # rho without tau
        worst = max(worst, _renyi(n, sigma2, shift, 2.0) / (2.0 * plain))
    assert worst > 1.05


def test_one_client_is_the_discrete_gaussian_and_epsilon_matches_the_central_mechanism():
    assert ddg.kls_tau(4.0, 1) == 0.0
    eps_d = ddg.ddg_epsilon(400, 1, clip_norm=1.0, grid=0.05, dim=10, delta=1e-5)
    l2 = dg.integer_sensitivity(1.0, 0.05, 10)
    assert eps_d == pytest.approx(dg.discrete_gaussian_epsilon(400, l2, 1e-5), rel=1e-12)


def test_noise_split_over_clients_costs_little_once_sigma2_is_one():
    """n shares of sigma^2 / n: the epsilon of the whole variance, up to tau (tiny from sigma^2 ~ 1)."""
    central = ddg.ddg_epsilon(1000, 1, clip_norm=1.0, grid=0.05, dim=20, delta=1e-5)
    split = ddg.ddg_epsilon(100, 10, clip_norm=1.0, grid=0.05, dim=20, delta=1e-5)
    assert central <= split <= central * 1.001
    # fewer honest shares, more epsilon: a dropped (or declared dropped) client takes its share with it
    assert ddg.ddg_epsilon(100, 5, clip_norm=1.0, grid=0.05, dim=20, delta=1e-5) > split * 1.3


def test_local_sigma2_calibration_is_the_smallest_that_meets_epsilon():
    kw = dict(clip_norm=1.0, grid=0.05, dim=20, delta=1e-5)
    s = ddg.ddg_local_sigma2(2.0, 8, **kw)
    assert ddg.ddg_epsilon(s, 8, **kw) <= 2.0 < ddg.ddg_epsilon(s - 1, 8, **kw)


def test_clipping_never_exceeds_the_bound_the_accounting_assumes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 37, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 64, dtype=torch.float64)[:, None]
    for c in (0.1, 1.0 / 3.0, 0.7):
        out = ddg.distributed_discrete_gaussian_sum(x, clip_norm=c, grid=1e-6, local_sigma2=1, rng=0)
        k = torch.round(clip_rows(x, c) / 1e-6)
        assert bool((clip_rows(x, c).norm(dim=1) <= c).all())
        assert (out.total / 1e-6 - k.sum(0)).abs().max() < 64 * 10     # the shares' noise only (sigma^2 = 1 each)


def test_sum_is_exact_on_the_grid_and_messages_are_masked():
    g = torch.Generator().manual_seed(1)
    u = torch.randn(6, 50, generator=g, dtype=torch.float64) * 0.1
    out = ddg.distributed_discrete_gaussian_sum(u, clip_norm=0.5, grid=2 ** -10, local_sigma2=64, rng=3,
                                                generator=torch.Generator().manual_seed(2))
    # the same shares without masks: the masks cancel exactly
    z = torch.from_numpy(dg.sample_discrete_gaussian(64, (6, 50), rng=3))
    k = torch.round(clip_rows(u, 0.5) / 2 ** -10).to(torch.int64)
    assert torch.equal(out.total, (k + z).sum(0).double() * 2 ** -10)
    assert torch.equal(out.total / 2 ** -10, torch.round(out.total / 2 ** -10))     # on the grid
    assert out.masked.dtype == torch.int64 and bool(((out.masked >= 0) & (out.masked < 2 ** sa.MODULUS_BITS)).all())
    # one message alone says nothing: uniform on the ring (the top bit is a fair coin)
    top = (out.masked >> (sa.MODULUS_BITS - 1)).double().mean().item()
    assert 0.3 < top < 0.7


def _violation(a: float, b: float, eps: float, delta: float, releases: int) -> float:
    """How far the estimated P0(E) = a exceeds e^eps P1(E) + delta beyond sampling error: a's lower and
    b's upper 4.5-sigma binomial bounds (b's never below 5 / releases, the rule of three's order)."""
    a_low = a - 4.5 * math.sqrt(a * (1 - a) / releases)
    b_high = b + 4.5 * math.sqrt(max(b * (1 - b), 1 / releases) / releases) + 5 / releases
    return a_low - math.exp(eps) * b_high - delta


def test_outputs_meet_the_guarantee_on_every_threshold_event():
    """Two neighbouring federations (the target's update at +clip_norm on coordinate 0, or zeros), 100 000
    real releases each: for every event {sum_0 >= t} and its complement, P0 <= e^eps P1 + delta both ways,
    up to sampling error."""
    n, releases, c, grid, s2, delta = 4, 100_000, 1.0, 1 / 16, 400, 1e-6
    eps = ddg.ddg_epsilon(s2, n, clip_norm=c, grid=grid, dim=1, delta=delta)
    assert 1.0 < eps < 4.0           # a guarantee worth testing
    rng = np.random.default_rng(0)
    shift = int(round(c / grid))     # the target's rounded update, in grid units
    sums = [shift + dg.sample_discrete_gaussian(s2, (releases, n), rng=rng).sum(1),
            dg.sample_discrete_gaussian(s2, (releases, n), rng=rng).sum(1)]
    worst = -1.0
    for t in range(int(min(s.min() for s in sums)), int(max(s.max() for s in sums)) + 2):
        p0, p1 = (sums[0] >= t).mean(), (sums[1] >= t).mean()
        for a, b in ((p0, p1), (1 - p0, 1 - p1), (p1, p0), (1 - p1, 1 - p0)):
            worst = max(worst, _violation(a, b, eps, delta, releases))
    assert worst <= 0.0, worst


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_the_event_test_sees_a_claim_the_noise_does_not_support():
    """The same event test is not vacuous: shares of variance 1 with epsilon claimed for shares of 400 break
    the claim on a threshold event."""
    n, releases, c, grid, delta = 4, 100_000, 1.0, 1 / 16, 1e-6
    eps_claimed = ddg.ddg_epsilon(400, n, clip_norm=c, grid=grid, dim=1, delta=delta)
    rng = np.random.default_rng(1)
    shift = int(round(c / grid))
    s0 = shift + dg.sample_discrete_gaussian(1, (releases, n), rng=rng).sum(1)
    s1 = dg.sample_discrete_gaussian(1, (releases, n), rng=rng).sum(1)
    t = shift // 2
    assert _violation((s0 >= t).mean(), (s1 >= t).mean(), eps_claimed, delta, releases) > 0.1


@pytest.mark.parametrize("kwargs,name", [
    (dict(clip_norm=0.0), "clip_norm"), (dict(grid=-1.0), "grid"), (dict(local_sigma2=0), "local_sigma2"),
    (dict(local_sigma2=2.5), "local_sigma2"), (dict(modulus_bits=4), "modulus_bits")])
def test_bad_arguments_name_themselves(kwargs, name):
    args = dict(clip_norm=1.0, grid=0.01, local_sigma2=16)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        ddg.distributed_discrete_gaussian_sum(torch.zeros(3, 4), **args)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="updates"):
        ddg.distributed_discrete_gaussian_sum(torch.zeros(1, 4), clip_norm=1.0, grid=0.01, local_sigma2=16)
    with pytest.raises(ValueError, match="finite"):
        ddg.distributed_discrete_gaussian_sum(torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), clip_norm=1.0,
                                              grid=0.01, local_sigma2=16)
    with pytest.raises(ValueError, match="updates"):      # the sum wraps in a small ring
        ddg.distributed_discrete_gaussian_sum(torch.ones(3, 2), clip_norm=10.0, grid=2 ** -10, local_sigma2=1,
                                              modulus_bits=12)
    with pytest.raises(ValueError, match="local_sigma2"):
        ddg.kls_tau(0.2, 3)
    with pytest.raises(ValueError, match="num_clients"):
        ddg.ddg_rho(1.0, 0, 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="l1"):
        ddg.ddg_rho(1.0, 2, 2.0, 1.0, 1)
    with pytest.raises(ValueError, match="delta"):
        ddg.ddg_epsilon(16, 3, clip_norm=1.0, grid=0.1, dim=3, delta=1.5)
