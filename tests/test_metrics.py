"""fedlab.metrics.tpr_at_fpr (Carlini et al. 2022's TPR at a low FPR) against a brute force over every threshold
and against scikit-learn's ROC curve; ties, resolution and bad input."""
import numpy as np
import pytest
from sklearn.metrics import roc_curve

from fedlab.metrics import tpr_at_fpr


def _brute(labels, scores, rate):
    best = 0.0
    for tau in list(np.unique(scores)) + [np.inf]:
        pred = scores >= tau
        if pred[labels == 0].mean() <= rate:
            best = max(best, pred[labels == 1].mean())
    return best


@pytest.mark.parametrize("seed", range(6))
def test_equals_the_brute_force_and_sklearns_curve(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    labels = rng.integers(0, 2, n)
    labels[:2] = [0, 1]
    scores = np.round(rng.normal(labels * rng.uniform(0, 2), 1.0), int(rng.integers(0, 3)))   # rounding: ties
    rates = [0.0, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0]
    got = tpr_at_fpr(labels, scores, rates)
    assert got == [_brute(labels, scores, r) for r in rates]
    fpr, tpr, _ = roc_curve(labels, scores)           # its points are exactly the thresholds at distinct scores
    assert got == [float(tpr[fpr <= r + 1e-12].max()) for r in rates]
    assert got == sorted(got) and got[-1] == 1.0


def test_resolution_and_ties():
    # 3 negatives: a rate below 1/3 can only mean FPR 0, the positives above every negative
    assert tpr_at_fpr([0, 0, 0, 1, 1, 1], [1, 2, 3, 2.5, 3.5, 4], [0.001, 0.34]) == [2 / 3, 1.0]
    # a positive tied with a negative is counted only with it: no threshold splits a tie
    assert tpr_at_fpr([0, 0, 1, 1], [1, 2, 2, 3], 0.4) == 0.5
    assert tpr_at_fpr([0, 1], [5.0, 5.0], 0.5) == 0.0 and tpr_at_fpr([0, 1], [5.0, 5.0], 1.0) == 1.0


@pytest.mark.parametrize("kw, match", [(dict(labels=[0, 1], scores=[0.1], fpr=0.1), "same length"),
                                       (dict(labels=[0, 1], scores=[0.1, np.nan], fpr=0.1), "finite"),
                                       (dict(labels=[1, 1], scores=[0.1, 0.2], fpr=0.1), "both classes"),
                                       (dict(labels=[0, 1], scores=[0.1, 0.2], fpr=1.5), "fpr"),
                                       (dict(labels=[0, 1], scores=[0.1, 0.2], fpr=[0.1, -0.1]), "fpr")])
def test_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        tpr_at_fpr(**kw)


def test_the_membership_attack_pools_its_clients_with_one_threshold():
    import torch

    from fedlab.attacks import membership as mia

    g = torch.Generator().manual_seed(0)
    is_member = np.r_[np.ones(20), np.zeros(20)]
    signals = torch.rand(3, 5, 40, generator=g) + torch.as_tensor(1 - is_member) * 0.3   # members: lower loss
    pooled = np.concatenate([-signals[k, -1].numpy() for k in range(3)])
    got = mia.attack_tpr_at_fpr(signals, is_member, [0.01, 0.1])
    assert got == tpr_at_fpr(np.tile(is_member, 3), pooled, [0.01, 0.1]) and got[1] > 0.1
    assert mia.attack_tpr_at_fpr(signals[0], is_member, 0.1, window=5) == [tpr_at_fpr(is_member, -signals[0].mean(0), 0.1)]
    with pytest.raises(ValueError, match="signals"):
        mia.attack_tpr_at_fpr(signals[0, 0], is_member)
