"""Nasr et al.'s learned membership attack across targets (``mia.learned_loo_scores``) and its use in
chapter 1c's active-attack sweep."""
import numpy as np
import pytest

from fedlab.attacks import membership as mia
from fedlab.metrics import roc_auc


def _features(U=6, m=40, F=4, shift=1.0, seed=0):
    rng = np.random.default_rng(seed)
    is_member = np.r_[np.ones(m // 2), np.zeros(m // 2)]
    X = rng.normal(size=(U, m, F))
    X[:, :, 0] -= shift * is_member           # members: lower loss in the first signal
    return X, is_member


def test_learned_scores_find_the_signal_and_rank_members_high():
    X, lab = _features(shift=2.0)
    s = mia.learned_loo_scores(X, lab)
    assert s.shape == X.shape[:2]
    assert min(roc_auc(lab, row) for row in s) > 0.8      # higher score = member


def test_no_score_depends_on_its_own_targets_labels():
    X, lab = _features()
    L = np.tile(lab, (X.shape[0], 1))
    base = mia.learned_loo_scores(X, L)
    L2 = L.copy()
    L2[2] = 1 - L2[2]                                      # flip target 2's labels only
    moved = mia.learned_loo_scores(X, L2)
    assert np.array_equal(base[2], moved[2])
    assert not np.array_equal(base[0], moved[0])           # the others were trained on them


def test_pure_noise_stays_near_chance():
    X, lab = _features(U=8, m=60, shift=0.0, seed=3)
    s = mia.learned_loo_scores(X, lab)
    assert abs(np.mean([roc_auc(lab, row) for row in s]) - 0.5) < 0.1


@pytest.mark.parametrize("X,lab,match", [
    (np.zeros((1, 4, 2)), np.r_[1, 1, 0, 0], "U >= 2"),
    (np.zeros((3, 4)), np.r_[1, 1, 0, 0], "U, m, F"),
    (np.full((2, 4, 2), np.nan), np.r_[1, 1, 0, 0], "finite"),
    (np.zeros((2, 4, 2)), np.r_[1, 1, 0], "is_member"),
    (np.zeros((2, 4, 2)), np.r_[1, 1, 1, 1], "members and non-members"),
])
def test_bad_input_is_refused(X, lab, match):
    with pytest.raises(ValueError, match=match):
        mia.learned_loo_scores(X, lab)
