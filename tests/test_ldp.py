"""The local Gaussian mechanism is tested on its output against the guarantee it claims.

Under local DP any two inputs of a user are neighbours. Two worst-case updates (far outside the
clipping ball, in opposite directions) go through :func:`fedlab.privacy.ldp.ldp_gaussian` many times;
from the outputs alone we measure the distance of the two output means (the sensitivity the mechanism
really has) and the noise standard deviation, and feed both into the exact privacy-loss distribution
of the Gaussian mechanism (dp-accounting). The delta at the claimed epsilon must not exceed the
claimed delta (up to the sampling error of the measurement: a factor 2, which a 2 % larger
sensitivity already exceeds). The same check fails for the first edition's calibration (clip to
Delta_2, noise for Delta_2: half the noise the guarantee needs).
"""
import math

import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pld

from fedlab.privacy import ldp
from fedlab.privacy.defenses import clip_rows

DELTA = 1e-8
N = 200_000
#: dp-accounting's discretisation of the privacy loss: at 1e-2 the delta of every case below is the one at its
#: default 1e-4 to 1e-12 relative (and the closed-form delta of the Gaussian mechanism to 1e-11), in a
#: hundredth of the time (eps = 100 took 17 s of CPU at 1e-4); the estimate stays pessimistic (an upper bound)
PLD_INTERVAL = 1e-2


def measured_delta(epsilon: float, sensitivity: float, seed: int = 0) -> float:
    """delta(epsilon) of the float mechanism (``safe=False``, RAIFLE's calibration) as measured on its
    outputs for the inputs +100 and -100."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((N, 1), 100.0, dtype=torch.float64)
    a = ldp.ldp_gaussian(x, epsilon, DELTA, sensitivity, generator=g, safe=False)[:, 0]
    b = ldp.ldp_gaussian(-x, epsilon, DELTA, sensitivity, generator=g, safe=False)[:, 0]
    gap = float(a.mean() - b.mean())                                   # the sensitivity the outputs show
    sigma = float(torch.sqrt((a.var() + b.var()) / 2))                 # the noise they carry
    return pld.from_gaussian_mechanism(sigma, sensitivity=gap,
                                       value_discretization_interval=PLD_INTERVAL).get_delta_for_epsilon(epsilon)


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 10.0, 100.0])
@pytest.mark.parametrize("sensitivity", [0.5, 100.0])
def test_ldp_gaussian_meets_its_claim_on_worst_case_inputs(epsilon, sensitivity):
    assert measured_delta(epsilon, sensitivity) <= 2 * DELTA


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 10.0, 100.0])
def test_clipping_to_the_whole_sensitivity_fails_the_same_check(monkeypatch, epsilon):
    monkeypatch.setattr(ldp, "ldp_clip_norm", lambda s: float(s))      # clip to Delta_2, noise for Delta_2
    assert measured_delta(epsilon, 0.5) > 1000 * DELTA


def test_clips_to_half_the_sensitivity_and_keeps_padding_zero():
    U = torch.randn(6, 4, 3, generator=torch.Generator().manual_seed(1)) * 50
    out = ldp.ldp_gaussian(U, 1e9, 0.5, 0.7, generator=torch.Generator().manual_seed(0))   # ~no noise
    assert torch.allclose(out.reshape(6, -1).norm(dim=1), torch.full((6,), 0.35), atol=1e-3)
    mask = torch.tensor([[True, True, False, False]] * 6)
    out = ldp.ldp_gaussian(U, 10.0, 1e-8, 0.7, mask=mask, generator=torch.Generator().manual_seed(0))
    assert bool((out[:, 2:] == 0).all()) and bool((out[:, :2] != 0).all())
    assert ldp.ldp_clip_norm(0.5) == 0.25


@pytest.mark.parametrize("args, match", [((10.0, 1e-8, 0.0), "sensitivity"), ((0.0, 1e-8, 1.0), "epsilon"),
                                         ((10.0, 1.5, 1.0), "delta")])
def test_bad_parameters(args, match):
    with pytest.raises(ValueError, match=match):
        ldp.ldp_gaussian(torch.ones(2, 3), *args)
    with pytest.raises(ValueError, match="mask"):
        ldp.ldp_gaussian(torch.ones(2, 3, 4), 1.0, 1e-8, 1.0, mask=torch.ones(3, 3, dtype=torch.bool))


# ------------------------------------------------------------------ composition (Chapter 2b's DP link)
@pytest.mark.slow
@pytest.mark.parametrize("z,T", [(1.0, 1), (1.0, 10), (4.0, 1000), (0.8, 3)])
def test_composed_epsilon_equals_dp_accountings_pld(z, T):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    # at 1e-3 dp-accounting's epsilon is the one at 1e-4 to 1e-6 relative in all four cases (1000-fold
    # composition: 0.5 s instead of 4 s of CPU); the tolerance below is 1e-3
    acc = PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), T))
    assert ldp.gaussian_composed_epsilon(z, T, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)


@pytest.mark.parametrize("z,T", [(0.25, 200), (4.0, 50_000), (1.0, 3000)])
def test_composed_epsilon_is_below_the_renyi_bound_and_close_to_it(z, T):
    import dp_accounting
    from dp_accounting import rdp

    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), T))
    eps_rdp = acc.get_epsilon(1e-5)
    eps = ldp.gaussian_composed_epsilon(z, T, 1e-5)
    assert eps <= eps_rdp <= 1.15 * eps          # RDP is an upper bound, a few per cent loose


def test_composed_epsilon_depends_on_sqrt_T_over_z_only():
    a = ldp.gaussian_composed_epsilon(0.5, 100, 1e-5)
    assert ldp.gaussian_composed_epsilon(2.0, 1600, 1e-5) == pytest.approx(a, rel=1e-9)
    assert ldp.gaussian_composed_epsilon(2.0, 1601, 1e-5) > a
    assert ldp.gaussian_composed_epsilon(1e3, 1, 0.5) == 0.0          # already (0, delta)-DP


def test_large_epsilon_does_not_overflow():
    eps = ldp.gaussian_composed_epsilon(0.01, 100, 1e-5)               # mu = 1000
    assert math.isfinite(eps) and eps > 4e5
    assert ldp.analytic_gaussian_delta(0.001, eps, 1.0) <= 1e-5


def test_ldp_noise_multiplier_is_sigma_over_local_sensitivity():
    # n rows clipped to C: two inputs differ by 2C per row, 2C sqrt(n) in all
    assert ldp.ldp_noise_multiplier(3.0, 0.5, 9) == pytest.approx(3.0 / (2 * 0.5 * 3))
    x = torch.randn(5, 4, dtype=torch.float64) * 100
    rows = clip_rows(x, 0.5)
    assert float((rows - clip_rows(-x, 0.5)).norm()) == pytest.approx(2 * 0.5 * math.sqrt(5))


def test_gdp_mu_to_distinguish_is_the_gaussian_test():
    from scipy.stats import norm

    mu = ldp.gdp_mu_to_distinguish(0.95)
    # N(0,1) vs N(mu,1), threshold mu/2: both errors Phi(-mu/2) = 0.05; any smaller mu cannot do it
    assert norm.cdf(-mu / 2) == pytest.approx(0.05)
    assert norm.cdf(-0.9 * mu / 2) > 0.05


@pytest.mark.parametrize("call,match", [
    (lambda: ldp.gaussian_composed_epsilon(0.0, 3, 1e-5), "noise_multiplier"),
    (lambda: ldp.gaussian_composed_epsilon(float("nan"), 3, 1e-5), "noise_multiplier"),
    (lambda: ldp.gaussian_composed_epsilon(1.0, 0, 1e-5), "num_compositions"),
    (lambda: ldp.gaussian_composed_epsilon(1.0, 2.5, 1e-5), "num_compositions"),
    (lambda: ldp.gaussian_composed_epsilon(1.0, 3, 1.0), "delta"),
    (lambda: ldp.ldp_noise_multiplier(-1.0, 1.0), "sigma"),
    (lambda: ldp.ldp_noise_multiplier(1.0, float("inf")), "clip_norm"),
    (lambda: ldp.ldp_noise_multiplier(1.0, 1.0, 0), "num_rows"),
    (lambda: ldp.gdp_mu_to_distinguish(0.5), "success"),
    (lambda: ldp.analytic_gaussian_delta(1.0, -0.1), "epsilon"),
])
def test_composition_helpers_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_analytic_sigma_is_dp_accountings_answer_remembered():
    """The answer is cached (a federated run asks for the same sigma every round); it stays
    dp_accounting's, for floats and ints alike, and bad arguments are still refused."""
    from dp_accounting.pld import accountant, common

    direct = accountant.get_smallest_gaussian_noise(common.DifferentialPrivacyParameters(20.0, DELTA), num_queries=1,
                                                    sensitivity=0.5)
    assert ldp.analytic_gaussian_sigma(20.0, DELTA, 0.5) == float(direct)
    assert ldp.analytic_gaussian_sigma(20, DELTA, 0.5) == float(direct)     # an int epsilon: the same entry
    assert ldp.gaussian_sigma(20.0, DELTA, 0.5) == float(direct)
    with pytest.raises(ValueError, match="epsilon"):
        ldp.analytic_gaussian_sigma(float("nan"), DELTA, 0.5)


def test_ldp_gaussian_settings_have_raifles_defaults_and_name_the_bad_field():
    s = ldp.LdpGaussian(10.0)
    assert (s.epsilon, s.delta, s.sensitivity) == (10.0, 1e-8, 0.5)      # RAIFLE Sec. 4.1.1, OLTR's Delta_2
    for field, bad in (("epsilon", 0.0), ("epsilon", math.inf), ("delta", 0.0), ("delta", 1.0),
                       ("sensitivity", -1.0), ("sensitivity", True)):
        with pytest.raises(ValueError, match=f"LdpGaussian.{field}"):
            ldp.LdpGaussian(**{"epsilon": 1.0, field: bad})
