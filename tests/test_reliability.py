"""Issue 21: no silent wrong answers. Each test here failed before its fix (bad input now raises a
``ValueError`` naming the argument, or the result is correct)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlab.privacy import defenses, dp_fedavg, secure_aggregation as sa


# ---------------------------------------------------------------------- 1. secure aggregation
def test_secure_sum_refuses_a_sum_that_would_wrap_around():
    # each value is below encode's per-value limit (2^15) but their sum is not: it used to come back
    # as 40000 - 2^16 = -25536
    with pytest.raises(ValueError, match="updates"):
        sa.secure_sum(torch.tensor([[20000.0], [20000.0]]))
    with pytest.raises(ValueError, match="updates"):
        sa.mask_updates(torch.tensor([[-20000.0, 1.0], [-20000.0, 1.0]]))


def test_secure_sum_just_inside_the_range_is_exact():
    x = torch.tensor([[16000.0, -16000.0], [16000.0, -16000.0]], dtype=torch.float64)
    out = sa.secure_sum(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, x.sum(0))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_and_secure_sum_reject_non_finite(bad):
    with pytest.raises(ValueError, match="x"):
        sa.encode(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match="updates|x"):
        sa.secure_sum(torch.tensor([[1.0, bad], [0.0, 0.0]]))


def test_unmask_sum_rejects_values_off_the_ring_and_too_many_clients():
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[2 ** 48, 0], [0, 0]]))
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[-1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[0.5, 0.0], [0.0, 0.0]]))


# ---------------------------------------------------------------------- 2. clipping
def _old_clip_rows(update, clip_norm):
    """The formula clip_rows used before issue 21 (kept here to prove bit-identity)."""
    ts = list(update.values()) if isinstance(update, dict) else [update]
    flat = torch.cat([t.flatten(1) for t in ts], 1) if isinstance(update, dict) else ts[0].reshape(ts[0].shape[0], -1)
    factor = torch.clamp(clip_norm / (flat.norm(dim=1) + 1e-12), max=1.0)
    out = [t * factor.reshape(-1, *([1] * (t.dim() - 1))) for t in ts]
    return dict(zip(update.keys(), out)) if isinstance(update, dict) else out[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clip_rows_is_bit_identical_to_the_old_formula_on_ordinary_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    for scale in (1e-6, 1e-2, 1.0, 3.0, 1e3, 1e8):
        x = torch.randn(7, 5, 3, generator=g, dtype=dtype) * scale
        x[2] = 0.0                                           # a zero row stays zero
        for c in (0.1, 1.0, 10.0):
            assert torch.equal(defenses.clip_rows(x, c), _old_clip_rows(x, c))
            d = {"w": x, "b": x[:, 0]}
            new, old = defenses.clip_rows(d, c), _old_clip_rows(d, c)
            assert all(torch.equal(new[k], old[k]) for k in d)
            assert torch.equal(dp_fedavg.clip_updates(d, c)["w"], old["w"])
        assert torch.equal(defenses.clip_by_norm(x[0], 1.0), _old_clip_rows(x[:1], 1.0)[0])


def test_clip_rows_keeps_gradients_of_the_old_formula():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g_new, = torch.autograd.grad(defenses.clip_rows(x, 0.5).sum(), x)
    g_old, = torch.autograd.grad(_old_clip_rows(x, 0.5).sum(), x)
    assert torch.equal(g_new, g_old)


@pytest.mark.parametrize("x", [
    torch.tensor([2e19, 2e19]),                             # squares overflow float32
    torch.full((10 ** 6,), 2e16),                            # the sum of squares overflows float32
    torch.tensor([1e200, 1e200], dtype=torch.float64),       # squares overflow float64
    torch.tensor([1e-30, -1e-30]),                           # squares underflow float32
    torch.tensor([1e-200, 1e-200], dtype=torch.float64),     # squares underflow float64
    torch.tensor([3e38, -3e38, 3e38]),                       # near float32's maximum
])
def test_clip_by_norm_of_huge_or_tiny_entries_has_norm_c_not_zero(x):
    for c in (1.0, 0.25):
        out = defenses.clip_by_norm(x, c)
        assert out.dtype == x.dtype and bool(torch.isfinite(out).all())
        n = float(torch.linalg.vector_norm(out.double()))
        if float(torch.linalg.vector_norm(x.double())) > c:
            assert n == pytest.approx(c, rel=1e-5)
        else:
            assert torch.equal(out, x)
        assert torch.equal(torch.sign(out), torch.sign(x))


def test_clip_rows_mixes_overflowing_and_ordinary_rows():
    x = torch.tensor([[2e19, 2e19], [3.0, 4.0], [0.0, 0.0], [0.1, 0.0]])
    out = defenses.clip_rows(x, 1.0)
    assert torch.allclose(out[0], torch.tensor([0.70710677, 0.70710677]))
    assert torch.equal(out[1:], _old_clip_rows(x[1:], 1.0))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_clipping_rejects_non_finite_updates(bad):
    x = torch.tensor([[bad, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="update"):
        defenses.clip_rows(x, 1.0)
    with pytest.raises(ValueError, match="update"):
        defenses.clip_by_norm(x[0], 1.0)
    with pytest.raises(ValueError, match="update"):
        dp_fedavg.clip_updates({"w": x}, 1.0)


@pytest.mark.parametrize("c", [0.0, -1.0, math.nan, math.inf])
def test_clipping_rejects_bad_clip_norm(c):
    with pytest.raises(ValueError, match="clip_norm"):
        defenses.clip_rows(torch.ones(2, 2), c)


def test_clipping_an_integer_update_names_the_argument():
    with pytest.raises(ValueError, match="update"):
        defenses.clip_rows(torch.ones(2, 2, dtype=torch.long), 1.0)
