"""Clipping and noise in low precision (issue 34, item 3): clip_rows never leaves a row above C in any
dtype, and gaussian_noise either adds noise the dtype can represent or says it cannot."""
import numpy as np
import pytest
import torch

from fedlab.privacy.defenses import clip_by_norm, clip_rows, gaussian_noise

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip_norm", [0.5, 1.0, 0.1, 3.7])
def test_clipped_norm_never_exceeds_c(dtype, clip_norm):
    g = torch.Generator().manual_seed(int(clip_norm * 100))
    scales = torch.logspace(-2, 2, 20_000, dtype=torch.float64)[:, None]
    x = (torch.randn(20_000, 9, generator=g, dtype=torch.float64) * scales).to(dtype)
    out = clip_rows(x, clip_norm)
    assert out.dtype == dtype
    norms = out.double().norm(dim=1)
    assert float(norms.max()) <= clip_norm                 # computed exactly (float64) on the stored values
    # rows above C land just below it (within a few units in the last place), rows below C are untouched
    big = x.double().norm(dim=1) > clip_norm * 1.01
    assert float(norms[big].min()) >= clip_norm * (1 - max(8 * torch.finfo(dtype).eps, 1e-10))  # (+1e-12 in the norm)
    small = x.double().norm(dim=1) < clip_norm * 0.99
    assert torch.equal(out[small], x[small])
    # dict updates too
    d = clip_rows({"a": x[:, :4], "b": x[:, 4:]}, clip_norm)
    assert float(torch.cat([d["a"], d["b"]], 1).double().norm(dim=1).max()) <= clip_norm
    assert float(clip_by_norm(x[0] * 1000, clip_norm).double().norm()) <= clip_norm


def test_clip_rows_stays_differentiable():
    x = torch.randn(5, 3, dtype=torch.float32, requires_grad=True)
    clip_rows(x * 10, 1.0).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


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
