"""Mironov's floating-point attack on the Euclidean Laplace release (fedlab.attacks.floating_point)
and the snapping release that defeats it (issue 20, item 1)."""
import numpy as np
import math

import pytest
import torch

from fedlab.attacks import floating_point as fp
from fedlab.privacy import dprivacy as dp

NU = 5.0
THETA_GLOBAL = torch.zeros(2)
# two secrets of the same norm, hence the same epsilon n / (nu ||delta||) = 0.4
SECRET_A, SECRET_B = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])


def _release(safe):
    def release(x, m, gen):
        return dp.sanitize_update(x.expand(m, -1), THETA_GLOBAL.expand(m, -1), NU, rng=gen, safe=safe).theta
    return release


def _floats_between(lo, hi, dtype=np.float32):
    """Every float of ``dtype`` in [lo, hi) for 0 < lo < hi."""
    itype = np.int32 if dtype == np.float32 else np.int64
    a, b = np.array(lo, dtype).view(itype), np.array(hi, dtype).view(itype)
    return np.arange(a, b, dtype=itype).view(dtype)


@pytest.mark.parametrize("x, r_lo, r_hi, y_lo, y_hi", [
    (1.0, 0.5, 2.0, -1.0, 0.5),      # y = 1 + r for r in [-2, -0.5): every such y in [-1, 0.5)
    (0.3, 0.05, 0.6, -0.29, 0.24),
])
def test_reachable_matches_exhaustive_enumeration(x, r_lo, r_hi, y_lo, y_hi):
    x = np.float32(x)
    r = -_floats_between(r_lo, r_hi)                  # every float32 noise value that can land in [y_lo, y_hi)
    ys = x + r                                        # float32 addition, round to nearest even
    ys = ys[(ys >= y_lo) & (ys < y_hi)][::-1]         # r falls, so x + r falls (rounding is monotone): ascending
    assert (np.diff(ys) >= 0).all()
    reach = ys[np.r_[True, ys[1:] != ys[:-1]]]        # np.unique without its sort (16 M floats)
    gen = np.random.default_rng(0)
    # candidates: random bit patterns (dense near 0) and random reals (dense where the mass is)
    bits = gen.integers(np.float32(1e-30).view(np.int32), np.float32(max(-y_lo, y_hi)).view(np.int32), 100_000)
    cand = np.concatenate([bits.astype(np.int32).view(np.float32) * gen.choice([-1, 1], 100_000).astype(np.float32),
                           gen.uniform(y_lo, y_hi, 100_000).astype(np.float32), reach[::97]])
    cand = cand[(cand >= y_lo) & (cand < y_hi)]
    pos = np.minimum(np.searchsorted(reach, cand), len(reach) - 1)
    truth = reach[pos] == cand                        # np.isin on the sorted set
    got = fp.reachable(cand, x)
    assert np.array_equal(got, truth)
    assert 0.05 < truth.mean() < 0.95                 # both kinds are present: the test can fail


def test_reachable_from_the_secret_itself_and_float64():
    gen = np.random.default_rng(1)
    x = gen.standard_normal((1000, 5)).astype(np.float32)
    y = x + (gen.standard_normal((1000, 5)) * 3).astype(np.float32)
    assert fp.reachable(y, x).all() and not fp.unreachable_from(y, x).any()
    x64 = gen.standard_normal((1000, 5))
    y64 = x64 + gen.standard_normal((1000, 5)) * 3
    assert fp.reachable(y64, x64).all()
    # float64: 1 + r is exact for r in [-2, -1), so y = -0.75 + 2^-53 (not a multiple of 2^-52) is out of reach
    assert not fp.reachable(np.array([-0.75 + 2.0**-53]), np.array([1.0]))[0]
    assert fp.reachable(np.array([-0.75 + 2.0**-53]), np.array([0.0]))[0]


def test_attack_distinguishes_the_plain_float32_release():
    res = fp.distinguishing_event_probabilities(_release(safe=False), SECRET_A, SECRET_B, num_samples=50_000, rng=0)
    assert res.count_b == 0 and res.p_b == 0.0           # the event is impossible under secret B
    assert res.interval_a[0] > 0.1                        # and likely under secret A (~0.21)
    assert res.distinguishes
    # symmetric: the roles of the secrets swap
    rev = fp.distinguishing_event_probabilities(_release(safe=False), SECRET_B, SECRET_A, num_samples=50_000, rng=1)
    assert rev.p_b == 0.0 and rev.interval_a[0] > 0.1


def test_attack_fails_against_the_snapping_release():
    eps_ab = 2 / NU * float(torch.linalg.vector_norm(SECRET_A - SECRET_B)) + dp.DEFAULT_FP_SLACK
    res = fp.distinguishing_event_probabilities(_release(safe=True), SECRET_A, SECRET_B, num_samples=50_000, rng=0)
    # the public grid (2^-22 at n = 2) is finer than float32 near 0, so some outputs are out of the
    # plain release's reach from B; they are about as likely under both secrets (within e^{eps d})
    assert res.count_b > 0 and not res.violates(eps_ab), res
    # with secrets (0.6, 0.8) and (0.8, 0.6) in float32 some grid points are out of the plain
    # release's reach from secret B (fl(0.8 + r) never equals -16), so the event is not empty under
    # the snapping release either: it is just as likely under both secrets
    a, b = torch.tensor([0.6, 0.8]), torch.tensor([0.8, 0.6])
    plain = fp.distinguishing_event_probabilities(_release(safe=False), a, b, num_samples=50_000, rng=3)
    assert plain.p_b == 0.0 and plain.interval_a[0] > 0.3 and plain.distinguishes
    snap = fp.distinguishing_event_probabilities(_release(safe=True), a, b, num_samples=200_000, rng=3)
    eps_d = 2 / NU * float(torch.linalg.vector_norm(a - b)) + dp.DEFAULT_FP_SLACK
    assert snap.count_a > 200 and snap.count_b > 200 and not snap.violates(eps_d) and plain.violates(eps_d)
    # and the snapped outputs' distribution itself is within eps d + eps_fp of the other secret's,
    # bin by bin (outputs are on the public grid)
    m = 200_000
    gen = np.random.default_rng(2)
    ya, yb = _release(True)(SECRET_A, m, gen), _release(True)(SECRET_B, m, gen)
    assert torch.equal(torch.remainder(ya.double(), dp.public_grid(2)), torch.zeros_like(ya.double()))
    u = (SECRET_B - SECRET_A) / torch.linalg.vector_norm(SECRET_B - SECRET_A)
    emp = dp.empirical_privacy_loss((ya @ u).numpy(), (yb @ u).numpy(), np.arange(-42.0, 43.0, 4.0) * 2 ** -0.5,
                                    level=0.99)
    eps = 2 / NU                                         # both secrets have ||delta|| = 1
    assert emp["max_lower"] <= eps * float(torch.linalg.vector_norm(SECRET_A - SECRET_B)) + dp.DEFAULT_FP_SLACK


def test_attack_result_and_bad_input():
    res = fp.FloatingPointAttack(0.2, 0.0, (0.19, 0.21), (0.0, 1e-4), 20, 0, 100, 0.95)
    assert res.distinguishes and res.violates(1.0) and not res.violates(10.0)
    close = fp.FloatingPointAttack(0.2, 0.1, (0.19, 0.21), (0.09, 0.11), 20, 10, 100, 0.95)
    assert close.distinguishes and not close.violates(math.log(2.5)) and close.violates(math.log(1.5))
    with pytest.raises(ValueError, match="eps_d"):
        res.violates(-1.0)
    with pytest.raises(ValueError, match="secret_a"):
        fp.distinguishing_event_probabilities(_release(False), torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="num_samples"):
        fp.distinguishing_event_probabilities(_release(False), SECRET_A, SECRET_B, num_samples=0)
    with pytest.raises(ValueError, match="release"):
        fp.distinguishing_event_probabilities(lambda x, m, g: torch.zeros(m, 3), SECRET_A, SECRET_B, num_samples=10)
    with pytest.raises(ValueError, match="y"):
        fp.reachable(np.array([1, 2]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="rng"):
        fp.distinguishing_event_probabilities(_release(False), SECRET_A, SECRET_B, num_samples=10, rng="seed")


def test_chapter5_guarantee_gaps_shows_each_gap():
    from fedlab.experiments import chapter5 as ex

    g = ex.guarantee_gaps(5.0, num_samples=20_000, seed=3)
    assert g["float"][False].violates(g["float_eps_d"]) and g["float"][False].p_b == 0
    assert not g["float"][True].violates(g["float_eps_d"])
    assert g["grid"]["secret"].p_b == 0 and g["grid"]["secret"].violates(g["grid_eps_d"])
    assert not g["grid"]["public"].violates(g["grid_eps_d"])
    assert g["adaptive"]["interval"][0] > 0.2 and g["clipped"]["violation_rate"] == 0
    assert g["norm"][650]["median_relative_error"] < g["norm"][2]["median_relative_error"]
    with pytest.raises(ValueError, match="nu"):
        ex.guarantee_gaps(0.0, num_samples=10, seed=0)


def _adaptive(eps_from_secret_grid):
    """Algorithm 2's release from theta_global = 0 in float32: the book's (public grid) or the old one
    whose snapping grid came from the secret's epsilon (issue 34)."""
    def release(x, m, gen):
        x32 = x.to(torch.float32).expand(m, -1)
        if not eps_from_secret_grid:
            return dp.sanitize_update(x32, torch.zeros_like(x32), NU, rng=gen).theta
        eps = 2 / (NU * float(torch.linalg.vector_norm(x.double())))
        return dp.release_euclidean_laplace(x32, eps, rng=gen)        # grid = snapping_grid(eps)
    return release


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_adaptive_release_grid_does_not_reveal_the_norm():
    # secrets of norms 0.79 and 0.81 (0.02 apart): promised loss eps d = 2 / (5 * 0.79) * 0.02 ~ 0.01.
    # Events "some coordinate off the 2^k grid" and Mironov's unreachable event, 10^5 releases each.
    a, b = torch.tensor([0.79, 0.0]), torch.tensor([0.81, 0.0])
    eps_d = 2 / (NU * 0.79) * 0.02 + dp.DEFAULT_FP_SLACK
    events = {f"off 2^{k}": fp.off_grid(2.0 ** k) for k in range(-24, 4)} | {"unreachable": None}
    for name, event in events.items():
        res = fp.distinguishing_event_probabilities(_adaptive(False), a, b, num_samples=100_000, rng=7, event=event)
        assert not res.violates(eps_d), (name, res)
    # the grid chosen from the secret's epsilon (2 for norm 0.79, 4 for 0.81) fails on "off the 4-grid"
    old = fp.distinguishing_event_probabilities(_adaptive(True), a, b, num_samples=100_000, rng=7,
                                                event=fp.off_grid(4.0))
    assert old.p_b == 0 and old.p_a > 0.5 and old.violates(eps_d), old


def test_chapter5_gaussian_float_check():
    from fedlab.experiments import chapter5 as ex

    g = ex.gaussian_float_check(num_samples=5_000, seed=1)
    assert g[False].p_b == 0 and g[False].violates(g["epsilon"], g["delta"])
    assert not g[True].violates(g["epsilon"], g["delta"])
    with pytest.raises(ValueError, match="num_samples"):
        ex.gaussian_float_check(num_samples=0, seed=0)
