"""fedlab.privacy.defenses: the global norm, clip, prune and Gaussian noise on known values, a sigma per row,
and noise in low precision (issue 34, item 3): gaussian_noise either adds noise the dtype can represent or
says it cannot. The clips themselves live in fedlab.privacy.clipping (test_clipping.py)."""
import pytest
import torch

from fedlab.privacy.defenses import gaussian_noise


def test_noise_in_bfloat16_is_not_silently_rounded_away():
    x = torch.full((1000,), 1000.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise(x, 0.5)                              # bfloat16's spacing at 1000 is 4
    y = gaussian_noise(x, 10.0, generator=torch.Generator().manual_seed(0))
    assert y.dtype == torch.bfloat16
    assert float((y != x).float().mean()) > 0.5             # the noise is there
    assert float((y.double() - 1000).std()) == pytest.approx(10.0, rel=0.15)
    # float16 / float32 / float64 with noise the dtype can hold: unchanged behaviour
    for dt in (torch.float16, torch.float32, torch.float64):
        z = gaussian_noise(torch.zeros(10_000, dtype=dt), 1.0, generator=torch.Generator().manual_seed(1))
        assert z.dtype == dt and float(z.double().std()) == pytest.approx(1.0, rel=0.05)
    # float32 and float64: bit for bit the old draw
    t = torch.ones(7)
    assert torch.equal(gaussian_noise(t, 0.3, generator=torch.Generator().manual_seed(2)),
                       t + 0.3 * torch.randn(7, generator=torch.Generator().manual_seed(2)))


def test_global_norm_clip_prune_and_noise_known_values():
    from fedlab.privacy import clip_by_norm, gaussian_noise, global_norm, prune_by_magnitude

    u = {"a": torch.tensor([3.0, -0.1]), "b": torch.tensor([[4.0, 0.2]])}
    assert float(global_norm(u)) == pytest.approx((9 + 0.01 + 16 + 0.04) ** 0.5)
    assert global_norm(torch.tensor([3, 4])).dtype == torch.float32                 # integers: float32
    assert global_norm(torch.tensor([3.0, 4.0], dtype=torch.float64)).dtype == torch.float64
    c = clip_by_norm(u, 1.0)
    assert float(global_norm(c)) == pytest.approx(1.0, rel=1e-5)
    p = prune_by_magnitude(u, 0.5)
    assert p["a"].tolist() == [3.0, 0.0] and p["b"].tolist() == [[4.0, 0.0]]
    z = gaussian_noise(torch.zeros(200_000), 0.5, generator=torch.Generator().manual_seed(0))
    assert float(z.std()) == pytest.approx(0.5, rel=0.01)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise(u, -1.0)
    with pytest.raises(ValueError, match="fraction"):
        prune_by_magnitude(u, 1.0)


def test_gaussian_noise_per_row_sigma():
    from fedlab.privacy import gaussian_noise

    x = torch.zeros(3, 20000, dtype=torch.float64)
    out = gaussian_noise(x, torch.tensor([0.0, 1.0, 3.0]), generator=torch.Generator().manual_seed(0))
    assert float(out[0].abs().max()) == 0.0
    assert abs(float(out[1].std()) - 1.0) < 0.03 and abs(float(out[2].std()) - 3.0) < 0.09
    for bad in (torch.tensor([1.0, -1.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([1.0, float("nan"), 1.0])):
        with pytest.raises(ValueError, match="sigma"):
            gaussian_noise(x, bad)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise(x, float("inf"))
