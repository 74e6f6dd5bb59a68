"""The defense registry, fedlab.privacy.apply: the real output of a few defenses (the clip bound holds and
only long rows move, the top-k mask is applied and published, the pre-noise DP view is the clip, secure
aggregation sums groups), a user defense's contract, and a ValueError naming the argument on bad input."""
import pytest
import torch

from fedlab import privacy
from fedlab.privacy import registry


def _updates(A=8, n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    # rows of very different lengths, so that the median norm clips about half of them
    return torch.randn(A, n, generator=g, dtype=torch.float64) * torch.logspace(-1, 1, A, dtype=torch.float64)[:, None]


def test_clip_holds_the_bound_and_moves_only_the_long_rows():
    U = _updates()
    norms = U.norm(dim=1)
    C = registry.median_norm(U)
    assert C == pytest.approx(float(norms.median()))
    out = privacy.apply(U, "clip")                           # default C: the median norm of the rows
    assert torch.equal(out, privacy.apply(U, "clip", clip_norm=C))
    long = norms > C
    assert 0 < int(long.sum()) < len(U)
    assert torch.allclose(out[long].norm(dim=1), torch.full((int(long.sum()),), C, dtype=U.dtype))   # at C exactly
    assert torch.allclose(out[long], U[long] * (C / norms[long])[:, None])                          # same direction
    assert torch.allclose(out[~long], U[~long], rtol=1e-12, atol=0)                                 # short rows kept
    view, public = privacy.apply_public(U, "clip", clip_norm=0.5)
    assert public == {"clip_norm": 0.5} and float(view.norm(dim=1).max()) <= 0.5 * (1 + 1e-12)


def test_top_k_keeps_the_largest_coordinates_and_publishes_its_mask():
    U = _updates()
    view, public = privacy.apply_public(U, "prune90")        # top-k at k = 10 %: 5 of 50 coordinates per row
    mask = public["mask"]
    assert mask.dtype == torch.bool and mask.shape == U.shape
    assert (mask.sum(dim=1) == 5).all()
    assert torch.equal(view[mask], U[mask]) and not view[~mask].any()
    kept = torch.where(mask, U.abs(), torch.inf).min(dim=1).values
    dropped = torch.where(mask, -torch.inf, U.abs()).max(dim=1).values
    assert (kept >= dropped).all()                           # the kept ones are the largest in magnitude


def test_dp_view_before_the_noise_is_the_clip_and_the_noise_is_z_c():
    U = _updates(A=64, n=400)
    C = registry.median_norm(U)
    clipped = privacy.apply(U, "clip", clip_norm=C)
    assert torch.equal(privacy.apply(U, "dp1", clip_norm=C, client_side_noise=False), clipped)
    noisy = privacy.apply(U, "dp1", clip_norm=C, generator=torch.Generator().manual_seed(3))
    again = privacy.apply(U, "dp1", clip_norm=C, generator=torch.Generator().manual_seed(3))
    assert torch.equal(noisy, again)                         # a function of the generator
    z = registry.dp_noise_multiplier(1.0)
    assert float((noisy - clipped).std()) == pytest.approx(z * C, rel=0.02)


def test_secure_aggregation_returns_the_sum_of_each_group():
    U = _updates()
    sums = privacy.apply(U, "secagg", group=4)
    assert sums.shape == (2, U.shape[1])
    assert torch.allclose(sums, U.reshape(2, 4, -1).sum(dim=1), atol=1e-9)


def test_a_user_defense_is_applied_and_its_contract_checked():
    U = _updates()
    halve = privacy.Defense("halve", "halve", "user", fn=lambda u, g: u / 2)
    assert torch.equal(privacy.apply(U, halve), U / 2)
    bad = privacy.Defense("bad", "bad", "user", fn=lambda u, g: u[:, :3])
    with pytest.raises(ValueError, match="defense 'bad'"):
        privacy.apply(U, bad)


@pytest.mark.parametrize("call, match", [
    (lambda U: privacy.apply(U, "magic"), "defense"),
    (lambda U: privacy.apply(U[0], "none"), "updates"),
    (lambda U: privacy.apply(U, "clip", clip_norm=0.0), "clip_norm"),
    (lambda U: privacy.apply(U, "secagg", group=3), "group"),
    (lambda U: privacy.apply(U, "secagg_cr"), "secagg_cr"),
    (lambda U: registry.median_norm(torch.zeros(4, 3)), "updates"),
    (lambda U: registry.dp_noise_multiplier(0.0), "epsilon"),
])
def test_bad_input_is_a_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(_updates())
