"""fedlab.privacy.clipping: the one home of every clip and of the one overflow-safe L2 norm (issue 38)."""
import pytest
import torch

from fedlab.privacy import clipping, defenses, dp_fedavg, dprivacy
from fedlab.privacy.clipping import clip_by_norm, clip_rows


def test_defenses_dprivacy_and_dp_fedavg_clips_are_the_clipping_functions():
    assert defenses.clip_rows is clipping.clip_rows and defenses.clip_by_norm is clipping.clip_by_norm
    assert dprivacy.clip_update is clipping.clip_update and dp_fedavg.clip_updates is clipping.clip_updates
    assert not hasattr(defenses, "_row_norms") and not hasattr(dprivacy, "_vector_norm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_l2_norm_is_torch_vector_norm_bit_for_bit_on_ordinary_rows(dtype):
    x = torch.randn(7, 33, generator=torch.Generator().manual_seed(0), dtype=dtype).requires_grad_(True)
    ours, ref = clipping.l2_norm(x), torch.linalg.vector_norm(x, dim=-1)
    assert torch.equal(ours, ref) and torch.equal(clipping.l2_norm(x[0], keepdim=True), ref[:1])
    w = torch.arange(7, dtype=dtype)
    g_ours, = torch.autograd.grad((ours * w).sum(), x)
    g_ref, = torch.autograd.grad((ref * w).sum(), x)
    assert torch.equal(g_ours, g_ref)


def test_l2_norm_survives_overflow_and_underflow_of_the_squares():
    x = torch.tensor([[2e19, 2e19], [1e-30, 1e-30], [0.0, 0.0], [3.0, 4.0]])
    assert torch.linalg.vector_norm(x, dim=-1)[:2].tolist() == [float("inf"), 0.0]
    norms = clipping.l2_norm(x)
    expected = torch.tensor([2e19, 1e-30], dtype=torch.float64) * 2 ** 0.5
    assert torch.allclose(norms[:2].double(), expected, rtol=1e-6)
    assert norms[2:].tolist() == [0.0, 5.0]
    assert clipping.l2_norm(torch.tensor([3e38, 3e38])).isinf()            # the norm itself exceeds float32
    assert clipping.l2_norm(torch.tensor([1.0, float("nan")])).isnan()


def test_clip_rows_gradient_of_an_underflowed_row_beside_an_overflowing_one_is_finite():
    x = torch.tensor([[1e-30, -2e-30], [2e19, 2e19], [3.0, 4.0]], requires_grad=True)
    y = clipping.clip_rows(x, 1.0)
    assert y[0].tolist() == x[0].tolist() and torch.allclose(y[1].norm(), torch.tensor(1.0))
    g, = torch.autograd.grad((y * torch.arange(6.0).reshape(3, 2)).sum(), x)
    assert torch.isfinite(g[0]).all() and g[0].tolist() == [0.0, 1.0]      # unclipped: the identity


def test_clip_updates_without_a_bound_returns_the_updates():
    u = {"w": torch.full((2, 3), 5.0)}
    assert clipping.clip_updates(u, None) is u
    assert torch.allclose(clipping.clip_updates(u, 1.0)["w"].norm(dim=1), torch.ones(2))


# in low precision (issue 34, item 3): clip_rows never leaves a row above C in any dtype
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip_norm", [0.5, 1.0, 0.1, 3.7])
def test_clipped_norm_never_exceeds_c_in_any_dtype(dtype, clip_norm):
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
