"""The reference code's final ADM: a fraction of every list's features replaced by server-known noise."""
import pytest
import torch

from fedlab.attacks.interaction_inference.oltr import adm_noise_replacement


def _lists(U=3, Q=4, n=5, F=10):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(U, Q, n, F, generator=g) + 1.0                 # real features in [1, 2): noise is never there
    mask = torch.ones(U, Q, n, dtype=torch.bool)
    mask[0, 1, 3:] = False                                         # padding
    return X * mask[..., None], mask


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
def test_exactly_int_F_fraction_features_are_replaced_in_every_list(fraction):
    X, mask = _lists()
    out = adm_noise_replacement(X, mask, fraction=fraction, generator=torch.Generator().manual_seed(1))
    changed = ((out != X) & mask[..., None]).any(2)                # [U, Q, F]
    assert (changed.sum(-1) == int(X.shape[-1] * fraction)).all()
    assert (out[~mask] == 0).all()
    # replaced columns hold small noise, not features; the others are untouched
    real = ~changed[:, :, None, :].expand_as(X) & mask[..., None]
    assert torch.equal(out[real], X[real])
    assert (out[changed[:, :, None, :].expand_as(X) & mask[..., None]].abs() < 1.0).all()


def test_replaced_features_differ_between_lists():
    X, mask = _lists(Q=8)
    out = adm_noise_replacement(X, mask, fraction=0.5, generator=torch.Generator().manual_seed(2))
    changed = (out != X).any(2)
    assert len({tuple(r.tolist()) for r in changed.reshape(-1, X.shape[-1])}) > 1


def test_noise_std_and_server_knowledge():
    X, mask = _lists(U=20, Q=10, n=10, F=10)
    a = adm_noise_replacement(X, mask, fraction=1.0, std=0.1, generator=torch.Generator().manual_seed(3))
    b = adm_noise_replacement(X, mask, fraction=1.0, std=0.1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)                                       # the server can redraw what it sent
    assert abs(a[mask].std().item() - 0.1) < 0.005


@pytest.mark.parametrize("kw,match", [(dict(fraction=1.5), "fraction"), (dict(fraction=-0.1), "fraction"),
                                      (dict(std=-1.0), "std")])
def test_bad_arguments(kw, match):
    X, mask = _lists()
    with pytest.raises(ValueError, match=match):
        adm_noise_replacement(X, mask, **kw)
    with pytest.raises(ValueError, match="mask"):
        adm_noise_replacement(X, mask[:, :, :2])
