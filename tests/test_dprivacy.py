"""Euclidean Laplace mechanism, SanitizeUpdate and the d-privacy accountant
(Galli et al., Prop. 3.1, Prop. 3.2, Algorithm 2, Theorem 3.1)."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch import nn

from fedlab.privacy import dprivacy as dp
from fedlab.experiments import chapter5 as ex5

N_SAMPLES = 100_000


def test_constant_closed_forms_and_normalisation():
    # n = 1: the ordinary Laplace density eps/2 exp(-eps|x|); n = 2: planar Laplace eps^2 / (2 pi)
    assert dp.laplace_constant(1, 0.7) == pytest.approx(0.7 / 2)
    assert dp.laplace_constant(2, 1.3) == pytest.approx(1.3**2 / (2 * math.pi))
    # the density integrates to one: K * surface(S^{n-1}) * int r^{n-1} e^{-eps r} dr = 1
    for n, eps in [(3, 0.5), (7, 2.0)]:
        surface = 2 * math.pi ** (n / 2) / math.gamma(n / 2)
        radial, _ = integrate.quad(lambda r: r ** (n - 1) * math.exp(-eps * r), 0, np.inf)
        assert dp.laplace_constant(n, eps) * surface * radial == pytest.approx(1.0, rel=1e-8)
    # log space survives a large n where the plain formula overflows
    assert math.isfinite(dp.laplace_constant(100_000, 3.0, log=True))


def test_radius_is_gamma_ks_and_mean():
    n, eps = 5, 2.0
    rho = dp.sample_euclidean_laplace(n, eps, N_SAMPLES, rng=0, dtype=torch.float64)
    r = torch.linalg.vector_norm(rho, dim=1).numpy()
    ks = stats.kstest(r, dp.radius_distribution(n, eps).cdf)
    assert ks.pvalue > 1e-3, ks
    assert r.mean() == pytest.approx(dp.expected_radius(n, eps), rel=0.01)
    # a wrong law is rejected: Gamma(n-1) radius
    assert stats.kstest(r, stats.gamma(a=n - 1, scale=1 / eps).cdf).pvalue < 1e-6


def test_component_variance_is_n_plus_one_over_eps_squared():
    n, eps = 4, 1.5
    rho = dp.sample_euclidean_laplace(n, eps, N_SAMPLES, rng=1, dtype=torch.float64).numpy()
    target = dp.component_variance(n, eps)
    assert target == pytest.approx((n + 1) / eps**2)
    np.testing.assert_allclose(rho.var(axis=0), target, rtol=0.03)
    np.testing.assert_allclose(rho.mean(axis=0), 0.0, atol=4 * math.sqrt(target / N_SAMPLES))
    # the naive guess n/eps^2 (variance of the radius spread evenly) is rejected
    assert abs(rho.var(axis=0).mean() - n / eps**2) > 0.1 * n / eps**2


def test_isotropy():
    # n = 2: the polar angle is uniform on [-pi, pi)
    rho2 = dp.sample_euclidean_laplace(2, 1.0, N_SAMPLES, rng=2, dtype=torch.float64).numpy()
    angle = np.arctan2(rho2[:, 1], rho2[:, 0])
    assert stats.kstest(angle, stats.uniform(loc=-math.pi, scale=2 * math.pi).cdf).pvalue > 1e-3
    # n = 3: a coordinate of the unit direction is uniform on [-1, 1] (Archimedes)
    rho3 = dp.sample_euclidean_laplace(3, 1.0, N_SAMPLES, rng=3, dtype=torch.float64).numpy()
    u = rho3 / np.linalg.norm(rho3, axis=1, keepdims=True)
    for i in range(3):
        assert stats.kstest(u[:, i], stats.uniform(loc=-1, scale=2).cdf).pvalue > 1e-3
    # n = 6: covariance proportional to the identity
    rho6 = dp.sample_euclidean_laplace(6, 2.0, N_SAMPLES, rng=4, dtype=torch.float64).numpy()
    cov = np.cov(rho6.T)
    off = cov[~np.eye(6, dtype=bool)]
    assert np.abs(off).max() < 0.03 * cov.diagonal().mean()


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_log_likelihood_ratio_formula_is_bounded_and_tight():
    # a check of the closed-form density (Eq. 10-11: the triangle inequality), whatever the sampler
    # does; the sampler itself is checked on its outputs in test_sampler_privacy_loss_from_output*
    g = torch.Generator().manual_seed(0)
    n, eps = 4, 0.8
    x1, x2 = torch.randn(2000, n, generator=g, dtype=torch.float64), torch.randn(2000, n, generator=g,
                                                                              dtype=torch.float64)
    y = x1 + dp.sample_euclidean_laplace(n, eps, 2000, rng=5, dtype=torch.float64)
    lr = dp.log_likelihood_ratio(y, x1, x2, eps)
    bound = eps * torch.linalg.vector_norm(x1 - x2, dim=1)
    assert (lr <= bound + 1e-9).all()
    # the bound is tight: outputs on the ray from x2 through x1, beyond x1
    y_ray = x1 + 3.0 * (x1 - x2)
    torch.testing.assert_close(dp.log_likelihood_ratio(y_ray, x1, x2, eps), bound)


# --- the sampler checked on its outputs: an empirical privacy-loss histogram (issue 20, item 6) ---
N_HIST = 200_000
HIST_EDGES = np.arange(-8.0, 9.0, 0.5)


def _projected_outputs(eps, x1, x2, *, safe, rng):
    """Releases of x1 and x2 (N_HIST each) projected on the line through them."""
    u = (x2 - x1) / torch.linalg.vector_norm(x2 - x1)
    gen = np.random.default_rng(rng)
    y1 = dp.release_euclidean_laplace(x1.expand(N_HIST, -1).clone(), eps, rng=gen, safe=safe)
    y2 = dp.release_euclidean_laplace(x2.expand(N_HIST, -1).clone(), eps, rng=gen, safe=safe)
    return ((y1.double() - x1) @ u).numpy(), ((y2.double() - x1) @ u).numpy()


@pytest.mark.parametrize("safe", [False, True])
def test_sampler_privacy_loss_from_output_within_eps_d(safe):
    eps, x1, x2 = 1.0, torch.tensor([0.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    d = 1.0
    t1, t2 = _projected_outputs(eps, x1, x2, safe=safe, rng=11)
    # safe: outputs lie on the grid Lambda = 1 (eps = 1), so integer bins centred on it
    edges = np.arange(-8.5, 9.5, 1.0) if safe else HIST_EDGES
    res = dp.empirical_privacy_loss(t1, t2, edges, level=0.99)
    slack = float(dp.snapping_extra_epsilon(2, eps)) if safe else 0.0
    assert res["max_lower"] <= eps * d + slack, res["max_lower"]
    # the check has power: the tails come close to the bound (the loss approaches eps d there)
    assert np.nanmax(np.abs(res["log_ratio"][res["counts"].min(0) >= 200])) > 0.75 * eps * d


@pytest.mark.parametrize("safe", [False, True])
def test_sampler_privacy_loss_from_output_detects_half_the_noise(monkeypatch, safe):
    # a sampler that draws with 2 eps (half the noise) while the release claims eps must fail the check
    orig = dp.sample_euclidean_laplace

    def half_noise(n, epsilon, size=None, **kw):
        return orig(n, 2 * np.asarray(epsilon, dtype=np.float64), size, **kw)

    monkeypatch.setattr(dp, "sample_euclidean_laplace", half_noise)
    eps, x1, x2 = 1.0, torch.tensor([0.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    t1, t2 = _projected_outputs(eps, x1, x2, safe=safe, rng=12)
    edges = np.arange(-8.5, 9.5, 1.0) if safe else HIST_EDGES
    res = dp.empirical_privacy_loss(t1, t2, edges, level=0.99)
    assert res["max_lower"] > eps * 1.0, res["max_lower"]


def test_empirical_privacy_loss_bounds_and_one_sided_bins():
    rng = np.random.default_rng(0)
    t1, t2 = rng.laplace(0, 1, 50_000), rng.laplace(1, 1, 100_000)   # 1-D Laplace, eps d = 1, N2 = 2 N1
    edges = np.linspace(-6, 7, 27)
    res = dp.empirical_privacy_loss(t1, t2, edges, level=0.99)
    used = res["counts"].sum(0) > 0
    assert (res["lower"][used] <= res["log_ratio"][used]).all() and (res["log_ratio"][used] <= res["upper"][used]).all()
    assert res["max_lower"] <= 1.0
    # the simultaneous intervals cover the true per-bin log ratios (unequal sample sizes accounted for)
    true = (np.log(np.diff(stats.laplace(0, 1).cdf(edges))) - np.log(np.diff(stats.laplace(1, 1).cdf(edges))))
    assert (res["lower"][used] <= true[used]).all() and (true[used] <= res["upper"][used]).all()
    assert np.abs(res["log_ratio"] - true)[res["counts"].min(0) > 1000].max() < 0.1
    # a bin seen under one secret only: finite lower, infinite upper bound
    one = dp.empirical_privacy_loss(np.r_[np.zeros(100), np.full(50, 5.0)], np.zeros(100), [-1, 1, 6])
    assert np.isinf(one["upper"][1]) and one["lower"][1] > 0 and one["max_lower"] == one["lower"][1]


def test_sampler_is_seeded_and_accepts_per_draw_epsilon():
    a = dp.sample_euclidean_laplace(3, 1.0, 10, rng=7)
    b = dp.sample_euclidean_laplace(3, 1.0, 10, rng=7)
    assert torch.equal(a, b)
    eps = np.array([1.0, 10.0, np.inf] * 20000)
    rho = dp.sample_euclidean_laplace(3, eps, len(eps), rng=8, dtype=torch.float64)
    r = torch.linalg.vector_norm(rho, dim=1).numpy()
    assert r[0::3].mean() == pytest.approx(3.0, rel=0.02)
    assert r[1::3].mean() == pytest.approx(0.3, rel=0.02)
    assert (r[2::3] == 0).all()


def test_sanitize_update_leakage_is_n_over_nu():
    g = torch.Generator().manual_seed(1)
    K, n, nu = 2000, 10, 5.0
    theta_global = torch.randn(n, generator=g, dtype=torch.float64)
    scale = torch.rand(K, 1, generator=g, dtype=torch.float64) * 3 + 0.1
    theta_local = theta_global + scale * torch.randn(K, n, generator=g, dtype=torch.float64)
    out = dp.sanitize_update(theta_local, theta_global, nu, rng=9, safe=False)
    delta = torch.linalg.vector_norm(theta_local - theta_global, dim=1)
    torch.testing.assert_close(out.epsilon * delta, torch.full((K,), n / nu, dtype=torch.float64))
    assert torch.equal(out.leakage, torch.full((K,), n / nu, dtype=torch.float64))
    torch.testing.assert_close(out.theta, theta_local + out.noise)
    assert (out.fp_leakage == 0).all() and (out.grid == 0).all()
    # E ||rho|| = n / eps = nu ||delta||: the noise-to-update ratio averages nu
    ratio = torch.linalg.vector_norm(out.noise, dim=1) / delta
    assert float(ratio.mean()) == pytest.approx(nu, rel=0.02)
    # one vector in, one vector out; a zero update is released exactly and its leakage is inf
    single = dp.sanitize_update(theta_global.clone(), theta_global, nu, rng=0)
    assert single.theta.shape == (n,) and torch.equal(single.theta, theta_global)
    assert math.isinf(float(single.leakage)) and math.isinf(float(single.epsilon))
    with pytest.raises(ValueError, match="leakage"):
        dp.PrivacyAccountant(1).spend(0, single.leakage)


def test_safe_release_is_default_snapped_and_keeps_the_noise_law():
    g = torch.Generator().manual_seed(3)
    K, n, nu = 4000, 10, 5.0
    theta_global = torch.randn(n, generator=g)
    theta_local = theta_global + 0.5 * torch.randn(K, n, generator=g)
    out = dp.sanitize_update(theta_local, theta_global, nu, rng=4)               # safe by default
    assert out.theta.dtype == torch.float32
    torch.testing.assert_close(out.leakage, torch.full((K,), n / nu, dtype=torch.float64))
    # every coordinate on one public grid (a power of two from n, the bound and the slack, never from
    # the secret's epsilon, which would reveal the norm's power-of-two bin: issue 34)
    lam = out.grid.unsqueeze(1)
    assert (out.grid == dp.public_grid(n)).all() and math.log2(dp.public_grid(n)).is_integer()
    assert torch.equal(torch.remainder(out.theta.double(), lam), torch.zeros_like(lam).expand(K, n))
    assert ((out.fp_leakage > 0) & (out.fp_leakage <= dp.DEFAULT_FP_SLACK)).all()
    torch.testing.assert_close(out.fp_leakage, torch.from_numpy(
        dp.snapping_extra_epsilon(n, out.epsilon.numpy(), grid=dp.public_grid(n))))
    # the noise is the Laplace noise plus rounding (variance Lambda^2 / 12 per coordinate, at most 1/(3 eps^2)):
    # the mean noise norm stays within a few percent of nu ||delta||
    delta = torch.linalg.vector_norm((theta_local - theta_global).double(), dim=1)
    ratio = torch.linalg.vector_norm(out.noise.double(), dim=1) / delta
    assert float(ratio.mean()) == pytest.approx(nu, rel=0.05)
    # the same draws as the plain release, snapped: |safe - plain| <= Lambda / 2 per coordinate
    plain = dp.sanitize_update(theta_local, theta_global, nu, rng=4, safe=False)
    assert ((out.theta.double() - plain.theta.double()).abs() <= lam / 2 + 1e-5 * plain.theta.abs().double()).all()
    # clamping: outputs never leave [-B, B]
    tiny = dp.sanitize_update(torch.full((3,), 100.0), torch.zeros(3), 5.0, rng=0, bound=4.0)
    assert (tiny.theta.abs() <= 4.0).all()


def test_snapping_grid_and_extra_epsilon():
    assert dp.snapping_grid(0.4).item() == 4.0            # 1 / 0.4 = 2.5 -> 4
    assert dp.snapping_grid(0.5).item() == 2.0            # exact powers of two stay
    assert dp.snapping_grid(np.inf).item() == 0.0
    # derived bound: n log((L + 2 tau) / (L - 2 tau)) + 2 eps tau sqrt(n), tau = 4 u (2B + L)
    tau = 4 * 2.0**-53 * (2 * 1024 + 4.0)
    want = 2 * math.log((4 + 2 * tau) / (4 - 2 * tau)) + 2 * 0.4 * tau * math.sqrt(2)
    assert dp.snapping_extra_epsilon(2, 0.4).item() == pytest.approx(want, rel=1e-6)
    # same order as Mironov's 1-D term 2^-49 B / lambda, linear in B
    assert 0.1 < dp.snapping_extra_epsilon(1, 0.4) / (2.0**-49 * 1024 * 0.4) < 10
    assert dp.snapping_extra_epsilon(2, 0.4, bound=2048.0) == pytest.approx(2 * dp.snapping_extra_epsilon(2, 0.4), rel=0.01)
    # huge eps: the grid is floored at 64 tau, the slack stays finite
    assert np.isfinite(dp.snapping_extra_epsilon(100, 1e12)) and dp.snapping_grid(1e12) > 0


def test_clipped_variant_has_fixed_eps_and_clips():
    g = torch.Generator().manual_seed(4)
    K, n, nu, R = 3000, 6, 5.0, 0.5
    theta_global = torch.randn(n, generator=g, dtype=torch.float64)
    theta_local = theta_global + torch.rand(K, 1, generator=g, dtype=torch.float64) * torch.randn(K, n, generator=g, dtype=torch.float64)
    clipped = dp.clip_update(theta_local, theta_global, R)
    norms = torch.linalg.vector_norm(clipped - theta_global, dim=1)
    orig = torch.linalg.vector_norm(theta_local - theta_global, dim=1)
    torch.testing.assert_close(norms, torch.clamp(orig, max=R))
    out = dp.sanitize_update_clipped(theta_local, theta_global, nu, clip_norm=R, rng=5, safe=False)
    assert torch.equal(out.epsilon, torch.full((K,), n / (nu * R), dtype=torch.float64))
    assert torch.equal(out.leakage, torch.full((K,), n / nu, dtype=torch.float64))
    # noise independent of the secret: E ||rho|| = n / eps = nu R for every client
    rnorm = torch.linalg.vector_norm(out.theta - clipped, dim=1)
    assert float(rnorm.mean()) == pytest.approx(nu * R, rel=0.03)
    assert float(rnorm[orig < 0.2].mean()) == pytest.approx(nu * R, rel=0.1)
    # a zero update gets noise like any other
    z = dp.sanitize_update_clipped(theta_global, theta_global, nu, clip_norm=R, rng=0)
    assert not torch.equal(z.theta, theta_global) and math.isfinite(float(z.leakage))


def test_one_adaptive_release_reveals_the_update_norm():
    small = dp.norm_disclosure(2, 5.0, safe=False, rng=0)
    large = dp.norm_disclosure(650, 5.0, num_trials=4000, safe=False, rng=1)
    # reviewer: median relative error 0.46 at n = 2, 0.026 at n = 650
    assert 0.40 < small["median_relative_error"] < 0.52
    assert 0.02 < large["median_relative_error"] < 0.032
    lo, hi = large["interval"]
    assert lo <= large["median_relative_error"] <= hi
    # the default (snapped) release reveals it as well
    assert dp.norm_disclosure(650, 5.0, num_trials=2000, rng=2)["median_relative_error"] < 0.035
    # the estimator divides the released distance by sqrt(1 + nu^2 (n + 1) / n)
    est = dp.estimate_update_norm(torch.zeros(3, 4) + torch.tensor([3.0, 0, 0, 0]), torch.zeros(4), 1.0)
    torch.testing.assert_close(est, torch.full((3,), 3.0 / math.sqrt(1 + 5 / 4), dtype=torch.float64))


def test_adaptive_privacy_loss_exceeds_eps_d_in_the_reviewers_case():
    # norms 1.1 and 1.0, 0.1 apart, n = 2, nu = 5: the loss exceeds eps d about a third of the time
    res = dp.privacy_loss_check(torch.tensor([1.1, 0.0]), torch.tensor([1.0, 0.0]), torch.zeros(2), 5.0,
                                num_samples=100_000, rng=0)
    assert res["bound"] == pytest.approx(2 / (5 * 1.1) * 0.1, rel=1e-6)
    assert 0.32 < res["violation_rate"] < 0.37 and res["interval"][0] > 0.3
    # and from the outputs alone (histograms of the released norm): some bin's loss exceeds eps d
    gen = np.random.default_rng(1)
    g = torch.zeros(200_000, 2, dtype=torch.float64)
    r1 = dp.sanitize_update(g + torch.tensor([1.1, 0.0], dtype=torch.float64), g, 5.0, rng=gen)
    r2 = dp.sanitize_update(g + torch.tensor([1.0, 0.0], dtype=torch.float64), g, 5.0, rng=gen)
    emp = dp.empirical_privacy_loss(torch.linalg.vector_norm(r1.theta, dim=1), torch.linalg.vector_norm(r2.theta, dim=1),
                                    np.arange(0, 80, 4.0), level=0.99)
    assert emp["max_lower"] > 5 * res["bound"], emp["max_lower"]


@pytest.mark.parametrize("safe", [False, True])
def test_clipped_privacy_loss_stays_within_eps_d_on_worst_case_pairs(safe):
    n, nu, R = 2, 5.0, 1.0
    eps = n / (nu * R)
    u = torch.tensor([0.6, 0.8], dtype=torch.float64)
    theta_global = torch.tensor([0.25, -0.5], dtype=torch.float64)
    # worst case: updates far outside the ball on opposite sides -> clipped secrets 2R apart
    a, b = theta_global + 3 * u, theta_global - 3 * u
    dens = dp.privacy_loss_check(a, b, theta_global, nu, clip_norm=R, num_samples=100_000, rng=0)
    assert dens["bound"] == pytest.approx(2 * R * eps)
    assert dens["violation_rate"] == 0 and dens["loss"].max() > 0.99 * dens["bound"]   # attained, never exceeded
    # from the outputs: histogram of the projection on u
    gen = np.random.default_rng(1)
    m = 200_000
    ya = dp.sanitize_update_clipped(a.expand(m, -1), theta_global.expand(m, -1), nu, clip_norm=R, rng=gen, safe=safe).theta
    yb = dp.sanitize_update_clipped(b.expand(m, -1), theta_global.expand(m, -1), nu, clip_norm=R, rng=gen, safe=safe).theta
    ta, tb = ((ya - theta_global) @ u).numpy(), ((yb - theta_global) @ u).numpy()
    emp = dp.empirical_privacy_loss(ta, tb, np.arange(-30.0, 31.0, 2.0), level=0.99)
    slack = float(dp.snapping_extra_epsilon(n, eps)) if safe else 0.0
    assert emp["max_lower"] <= 2 * R * eps + slack
    assert np.nanmax(np.abs(emp["log_ratio"][emp["counts"].min(0) >= 200])) > 0.6 * 2 * R * eps   # the check has power


def test_accountant_composes_by_summation_and_refuses_past_budget():
    acct = dp.PrivacyAccountant(4)
    acct.spend([0, 1], 0.4, round=1)
    acct.spend([1, 2], [0.4, 1.5], round=2)
    acct.spend(1, 0.25, round=3)
    assert acct.total(0) == pytest.approx(0.4)
    assert acct.total(1) == pytest.approx(0.4 + 0.4 + 0.25)   # Theorem 3.1: sum of the epsilons
    assert acct.total(3) == 0.0
    assert acct.participations.tolist() == [1, 3, 1, 0]
    assert acct.summary() == {"median": pytest.approx(1.05), "max": pytest.approx(1.5), "clients": 3}

    capped = dp.PrivacyAccountant(3, budget=1.0)
    for _ in range(2):
        capped.spend([0, 1, 2], 0.4)
    assert capped.allowed([0, 1, 2], 0.4).tolist() == [False] * 3    # 1.2 > 1.0
    assert capped.allowed([0], 0.2).tolist() == [True]
    with pytest.raises(ValueError, match="budget"):
        capped.spend([0], 0.4)
    lax = dp.PrivacyAccountant(1, budget=1.0, refuse_past_budget=False)
    lax.spend(0, 5.0)
    assert lax.total(0) == 5.0


def test_accountant_budget_at_a_fixed_radius():
    # two releases of one client: ||delta|| = 1 then 0.1 with nu = 5, n = 2 -> eps = 0.4 then 4;
    # the ledger says 0.8 (n / nu twice) but at radius 1 the composed loss is 4.4
    acct = dp.PrivacyAccountant(2)
    acct.spend([0], 0.4, round=1, epsilon=0.4)
    acct.spend([0], 0.4, round=2, epsilon=4.0)
    assert acct.total(0) == pytest.approx(0.8)
    np.testing.assert_allclose(acct.budget_at_radius(1.0), [4.4, 0.0])
    s = acct.summary(radius=1.0)
    assert s["max_at_radius"] == pytest.approx(4.4) and s["max"] == pytest.approx(0.8)
    # a release recorded without its epsilon makes the fixed-radius budget unknown (NaN), not wrong
    acct.spend([1], 0.4)
    assert np.isnan(acct.budget_at_radius(1.0)[1])
    # with sanitize_update's output
    out = dp.sanitize_update(torch.tensor([[1.0, 0.0], [0.0, 0.1]]), torch.zeros(2), 5.0, rng=0)
    b = dp.PrivacyAccountant(2)
    b.spend([0, 1], out.leakage.numpy(), epsilon=out.epsilon.numpy())
    np.testing.assert_allclose(b.budget_at_radius(0.5), 0.5 * out.epsilon.numpy())


@pytest.mark.parametrize("call, name", [
    (lambda a: a.spend([0, 0], 0.1), "clients"),
    (lambda a: a.spend([1, 2, 1], [0.1, 0.2, 0.3]), "clients"),
    (lambda a: a.allowed([0, 0], 0.1), "clients"),
    (lambda a: a.spend([0], float("nan")), "leakage"),
    (lambda a: a.spend([0, 1], [0.1, float("inf")]), "leakage"),
    (lambda a: a.allowed([0], float("nan")), "leakage"),
    (lambda a: a.spend([0, 1], [0.1, 0.2, 0.3]), "leakage"),
    (lambda a: a.spend([0], 0.1, epsilon=float("nan")), "epsilon"),
    (lambda a: a.spend([0], 0.1, epsilon=0.0), "epsilon"),
    (lambda a: a.budget_at_radius(-1.0), "radius"),
])
def test_accountant_rejects_repeated_ids_and_non_finite_leakage(call, name):
    acct = dp.PrivacyAccountant(3, budget=10.0)
    with pytest.raises(ValueError, match=name):
        call(acct)
    # nothing was recorded
    assert (acct.spent == 0).all() and (acct.participations == 0).all() and acct.log == []


def test_first_order_bound_of_prop_3_2():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(50, 3, generator=g)
    model = nn.Linear(3, 1, bias=False)
    theta = torch.tensor([1.0, -2.0, 0.5])
    y = X @ torch.tensor([1.2, -1.8, 0.0]) + 0.1 * torch.randn(50, generator=g)
    bound = dp.rmse_increase_bound(model, theta, X)
    # linear model: the Jacobian is X, the constant is ||X||_2 / sqrt(|Z|)
    assert bound == pytest.approx(float(torch.linalg.matrix_norm(X.double(), 2)) / math.sqrt(50), rel=1e-5)
    rho = dp.sample_euclidean_laplace(3, 2.0, 5000, rng=3)
    base = ex5.rmse(model, theta, X, y)
    increase = ex5.rmse(model, theta + rho, X, y) - base
    assert (increase <= bound * torch.linalg.vector_norm(rho, dim=1) + 1e-5).all()


@pytest.mark.parametrize("call", [
    lambda: dp.laplace_constant(3, 0.0),
    lambda: dp.laplace_constant(0, 1.0),
    lambda: dp.sample_euclidean_laplace(3, -1.0, 5),
    lambda: dp.sample_euclidean_laplace(3, np.ones(4), 5),
    lambda: dp.sanitize_update(torch.zeros(3), torch.ones(3), 0.0),
    lambda: dp.sanitize_update(torch.zeros(3), torch.ones(3), -2.0),
    lambda: dp.sanitize_update(torch.zeros(4, 3), torch.ones(2), 1.0),
    lambda: dp.log_laplace_density(torch.zeros(3), torch.zeros(2), 1.0),
    lambda: dp.PrivacyAccountant(0),
    lambda: dp.PrivacyAccountant(2, budget=-1.0),
    lambda: dp.PrivacyAccountant(2).spend([5], 0.1),
    lambda: dp.PrivacyAccountant(2).spend([0], -0.1),
    lambda: dp.sanitize_update(torch.zeros(3), torch.ones(3), 1.0, bound=0.0),
    lambda: dp.sanitize_update(torch.zeros(3), torch.ones(3), float("inf")),
    lambda: dp.sanitize_update(torch.tensor([0.0, float("nan"), 0.0]), torch.ones(3), 1.0),
    lambda: dp.sanitize_update_clipped(torch.zeros(3), torch.ones(3), 1.0, clip_norm=0.0),
    lambda: dp.sanitize_update_clipped(torch.zeros(3), torch.ones(3), 0.0, clip_norm=1.0),
    lambda: dp.release_euclidean_laplace(torch.zeros(2, 3), np.ones(3)),
    lambda: dp.release_euclidean_laplace(torch.zeros(2, 3, 1), 1.0),
    lambda: dp.release_euclidean_laplace(torch.zeros(3, dtype=torch.int64), 1.0),
    lambda: dp.snapping_grid(0.0),
    lambda: dp.snapping_extra_epsilon(2, 1.0, bound=float("inf")),
    lambda: dp.estimate_update_norm(torch.zeros(3), torch.zeros(3), 0.0),
    lambda: dp.norm_disclosure(2, 5.0, num_trials=3),
    lambda: dp.privacy_loss_check(torch.zeros(2), torch.ones(2), torch.zeros(2), 5.0),   # zero update
    lambda: dp.empirical_privacy_loss([1.0], [1.0], [1.0, 0.0]),
    lambda: dp.clopper_pearson(5, 3),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("n", [2, 3, 11, 200])
def test_sampler_makes_the_draws_of_scipy_gamma_and_uniform_direction(n):
    """sample_euclidean_laplace draws with the generator directly; it must return what
    stats.gamma.rvs(n) and stats.uniform_direction(n).rvs give on the same generator (the stored records
    were made with those), and leave the generator in the same state."""
    from scipy import stats

    for seed, (eps, m) in enumerate([(0.5, 1), (2.0, 7), (30.0, 64)]):
        gen = np.random.default_rng(seed)
        radius = stats.gamma.rvs(n, size=m, random_state=gen) * (1.0 / eps)
        direction = stats.uniform_direction(n).rvs(size=m, random_state=gen).reshape(m, n)
        for dtype in (torch.float32, torch.float64):
            ref = torch.from_numpy(radius[:, None] * direction).to(dtype)
            assert torch.equal(dp.sample_euclidean_laplace(n, eps, m, rng=seed, dtype=dtype), ref)
        mine = np.random.default_rng(seed)
        dp.sample_euclidean_laplace(n, eps, m, rng=mine)
        assert mine.random() == gen.random()
