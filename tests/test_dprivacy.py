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


def test_dprivacy_likelihood_ratio_bound_on_sampled_pairs():
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
    out = dp.sanitize_update(theta_local, theta_global, nu, rng=9)
    delta = torch.linalg.vector_norm(theta_local - theta_global, dim=1)
    torch.testing.assert_close(out.epsilon * delta, torch.full((K,), n / nu, dtype=torch.float64))
    assert torch.equal(out.leakage, torch.full((K,), n / nu, dtype=torch.float64))
    torch.testing.assert_close(out.theta, theta_local + out.noise)
    # E ||rho|| = n / eps = nu ||delta||: the noise-to-update ratio averages nu
    ratio = torch.linalg.vector_norm(out.noise, dim=1) / delta
    assert float(ratio.mean()) == pytest.approx(nu, rel=0.02)
    # one vector in, one vector out; a zero update gets no noise
    single = dp.sanitize_update(theta_global.clone(), theta_global, nu, rng=0)
    assert single.theta.shape == (n,) and torch.equal(single.theta, theta_global)


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
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
