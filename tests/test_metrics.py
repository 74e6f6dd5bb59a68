"""fedlab.metrics: tpr_at_fpr (Carlini et al. 2022's TPR at a low FPR) against a brute force over every threshold
and against scikit-learn's ROC curve (ties, resolution and bad input); accuracy, ROC AUC (one vector, and per row
of a batch against scikit-learn), MSE, PSNR and rounds-to-target on known values."""
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from fedlab import metrics
from fedlab.metrics import roc_auc_rows, tpr_at_fpr


def _brute(labels, scores, rate):
    best = 0.0
    for tau in list(np.unique(scores)) + [np.inf]:
        pred = scores >= tau
        if pred[labels == 0].mean() <= rate:
            best = max(best, pred[labels == 1].mean())
    return best


@pytest.mark.parametrize("seed", range(6))
def test_tpr_at_fpr_equals_the_brute_force_and_sklearns_curve(seed):
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


def test_tpr_at_fpr_resolution_and_ties():
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
def test_tpr_at_fpr_refuses_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        tpr_at_fpr(**kw)


def test_accuracy_roc_auc_mse_and_psnr_known_values():
    assert metrics.accuracy(torch.tensor([1, 0, 2]), torch.tensor([1, 1, 2])) == pytest.approx(2 / 3)
    assert metrics.roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    from sklearn.metrics import roc_auc_score
    r = np.random.default_rng(0)
    for n in (5, 40, 400):
        lab, sc = r.integers(0, 2, n), r.integers(0, 7, n).astype(float)     # ties
        lab[:2] = [0, 1]
        assert metrics.roc_auc(lab, sc) == pytest.approx(roc_auc_score(lab, sc), abs=1e-12)
    x = np.zeros((4, 4))
    assert metrics.mse(x + 0.1, x) == pytest.approx(0.01)
    assert metrics.psnr(x + 0.1, x) == pytest.approx(20.0)
    assert metrics.psnr(x, x) == float("inf")
    with pytest.raises(ValueError, match="data_range"):
        metrics.psnr(x, x, data_range=0)
    with pytest.raises(ValueError, match="both classes"):
        metrics.roc_auc([1, 1], [0.2, 0.3])


def test_rounds_to_accuracy_first_round_at_the_target_or_none():
    h = {"round": [0, 1, 2, 3], "accuracy": [0.1, 0.5, 0.92, 0.95]}
    assert metrics.rounds_to_accuracy(h, 0.9) == 2
    assert metrics.rounds_to_accuracy(h, 0.99) is None
    with pytest.raises(ValueError, match="target"):
        metrics.rounds_to_accuracy(h, 0.0)


def test_roc_auc_rows_matches_sklearn_with_ties_and_masks():
    from sklearn.metrics import roc_auc_score

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (30, 12), generator=g).float()            # many ties
    labels = (torch.rand(30, 12, generator=g) < 0.4).float()
    mask = torch.rand(30, 12, generator=g) < 0.8
    labels[:, 0], labels[:, 1], mask[:, :2] = 1.0, 0.0, True               # both classes present
    scores[~mask] = float("nan")                                           # padding is never read
    auc = roc_auc_rows(labels, scores, mask)
    ref = torch.tensor([roc_auc_score(labels[u][mask[u]].numpy(), scores[u][mask[u]].numpy()) for u in range(30)],
                       dtype=torch.float64)
    assert torch.allclose(auc, ref, atol=1e-12)
    with pytest.raises(ValueError, match="one class"):
        roc_auc_rows(torch.zeros(1, 12), scores[:1], mask[:1])
    with pytest.raises(ValueError, match="finite"):
        roc_auc_rows(labels[:1], torch.full((1, 12), float("inf")), mask[:1])


def test_optimum_status_stalled_below_reached():
    """The one rule of the book's optimum checks: above 10x the truth's loss (plus 1e-3) the attack stalled."""
    from fedlab.metrics import optimum_status

    assert optimum_status(9e-3, 1.5e-7) == "stalled" and optimum_status(0.0111, 1e-3) == "stalled"
    assert optimum_status(0.0109, 1e-3) == "reached" and optimum_status(1e-3, 1e-3) == "reached"
    assert optimum_status(1e-12, 2e-3) == "below" and optimum_status(0.0, 0.0) == "reached"
    for bad in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="reached"):
            optimum_status(bad, 0.0)
