"""Metrics shared by all chapters: accuracy, ROC AUC (one vector, or every row of a batch), MSE and PSNR for
images, and the two-sample Kolmogorov-Smirnov p-value RAIFLE reports."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ._stats import t_interval  # noqa: F401  (lives in fedlab._stats: the command line needs it without torch)

__all__ = ["accuracy", "roc_auc", "roc_auc_rows", "roc_curve", "mse", "psnr", "psnr_from_mse", "matched_psnr",
           "rounds_to_accuracy", "ks_pvalue", "t_interval", "auc_permutation_floor", "best_threshold",
           "balanced_accuracy", "tpr_at_fpr", "optimum_status"]


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def accuracy(pred, y) -> float:
    """Fraction of correct predictions. ``pred`` is ``[n]`` labels or ``[n, C]`` scores/logits.
    Raises ``ValueError`` for mismatched shapes, an empty ``y`` or NaN / infinite entries of ``pred``
    (the argmax of NaN logits is not a prediction)."""
    pred, y = _np(pred), _np(y)
    if np.issubdtype(pred.dtype, np.inexact) and not np.isfinite(pred).all():
        raise ValueError("pred must be finite (NaN or infinite scores make no prediction)")
    if pred.ndim == 2:
        pred = pred.argmax(1)
    if pred.shape != y.shape:
        raise ValueError(f"pred and y must have the same shape, got {pred.shape} and {y.shape}")
    if y.size == 0:
        raise ValueError("y must not be empty")
    return float((pred == y).mean())


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve of one score vector: :func:`roc_auc_rows` on a batch of one.
    ``labels`` in {0, 1} (1 = positive, e.g. member); a higher ``score`` should mean "more likely
    positive". Equals scikit-learn's ``roc_auc_score`` (``tests/test_metrics.py`` compares them).

    Raises ``ValueError`` for mismatched lengths, non-finite scores or a single class.
    """
    labels, scores = _np(labels).ravel(), _np(scores).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores must have the same length, got {labels.shape} and {scores.shape}")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"labels must be 0/1 (1 = positive), got values {np.unique(labels)[:5].tolist()}")
    if len(np.unique(labels)) != 2:
        raise ValueError("labels must contain both classes to compute an AUC")
    lab = torch.as_tensor(labels.astype(np.float64))[None]
    return float(roc_auc_rows(lab, torch.as_tensor(scores.astype(np.float64))[None], torch.ones_like(lab, dtype=torch.bool))[0])


def roc_auc_rows(labels, scores, mask=None) -> torch.Tensor:
    """ROC AUC of every row over its real entries: ``labels`` (0/1 or bool), ``scores`` and ``mask``
    (bool, ``None`` = all real) ``[U, m]`` -> ``[U]`` float64, e.g. each user's reconstruction of its
    own items (RAIFLE reports the AUC per user).

    The Mann-Whitney statistic ``P(score_pos > score_neg) + P(tie) / 2`` from average ranks: with
    ``r_i`` the average rank of entry ``i`` among its row's real entries (ties share their mean
    rank), ``AUC = (sum_pos r_i - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``. The ranks come from one
    sort and two ``searchsorted`` per row, so the memory is ``O(U m)`` for any ``m``. Equals
    scikit-learn's ``roc_auc_score`` row by row (``tests/test_metrics.py``). Raises ``ValueError`` for
    mismatched shapes, non-finite real scores, or a row whose real entries are all of one class.
    """
    scores = torch.as_tensor(scores).double()
    labels = torch.as_tensor(labels)
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    if scores.dim() != 2 or labels.shape != scores.shape or mask.shape != scores.shape:
        raise ValueError(f"labels, scores and mask must all be [U, m], got {tuple(labels.shape)}, "
                         f"{tuple(scores.shape)}, {tuple(mask.shape)}")
    if not bool(torch.isfinite(scores[mask]).all()):
        raise ValueError("scores must be finite on the real entries")
    pos = (labels.double() > 0.5) & mask
    n_pos, n_real = pos.sum(1).double(), mask.sum(1).double()
    n_neg = n_real - n_pos
    if bool(((n_pos == 0) | (n_neg == 0)).any()):
        bad = torch.nonzero((n_pos == 0) | (n_neg == 0)).flatten().tolist()
        raise ValueError(f"labels: rows {bad[:5]} have only one class among their real entries; no AUC")
    s = scores.masked_fill(~mask, float("inf"))                       # padding sorts last, never counted
    ordered = s.sort(1).values.contiguous()
    below = torch.searchsorted(ordered, s.contiguous(), right=False).double()    # real entries < s_i
    upto = torch.searchsorted(ordered, s.contiguous(), right=True).double()      # real entries <= s_i
    rank = (below + upto + 1) / 2                                      # average 1-based rank among ties
    rank_sum = (rank * pos.double()).sum(1)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def roc_curve(labels, scores):
    """False- and true-positive rates (scikit-learn's ``roc_curve``): ``(fpr, tpr)``."""
    from sklearn.metrics import roc_curve as _rc

    fpr, tpr, _ = _rc(_np(labels).ravel(), _np(scores).ravel())
    return fpr, tpr


def tpr_at_fpr(labels, scores, fpr: float | Sequence[float]) -> float | list[float]:
    """True-positive rate at a low false-positive rate (Carlini et al., "Membership inference attacks from
    first principles", S&P 2022, Sec. III): the largest TPR of a rule "positive when ``score >= tau``" whose
    FPR is at most ``fpr`` (a list of rates gives the list of TPRs).

    Ties are never split: a threshold takes all entries of a score or none, so the result is what a real
    threshold achieves. With ``n_neg`` negatives the FPRs a threshold can reach are multiples of ``1 / n_neg``;
    for ``fpr < 1 / n_neg`` this is the TPR at FPR 0 (positives scored above every negative), which is what
    such a small rate means with that many negatives: report ``n_neg`` beside it.

    ``labels`` in {0, 1} (1 = positive, e.g. member), ``scores`` ``[n]`` (higher: more likely positive).
    Raises ``ValueError`` for mismatched lengths, non-finite scores, a single class or ``fpr`` outside [0, 1].
    """
    many = isinstance(fpr, (list, tuple))
    rates = list(fpr) if many else [fpr]
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float, np.floating)) or not 0.0 <= float(r) <= 1.0:
            raise ValueError(f"fpr must be a rate in [0, 1], got {r!r}")
    labels, scores = _labels_scores(labels, scores)
    neg, pos = np.sort(scores[labels == 0]), np.sort(scores[labels == 1])
    # every threshold worth trying: each distinct score, and one above all of them (FPR 0, TPR of what lies above)
    taus = np.concatenate([np.unique(scores), [np.inf]])
    fprs = (len(neg) - np.searchsorted(neg, taus, side="left")) / len(neg)       # share of negatives >= tau
    tprs = (len(pos) - np.searchsorted(pos, taus, side="left")) / len(pos)
    out = [float(tprs[fprs <= float(r) + 1e-12].max()) for r in rates]
    return out if many else out[0]


def mse(x, x_ref) -> float:
    """Mean squared error between two arrays of the same shape. Raises ``ValueError`` for different
    shapes, empty arrays or NaN / infinite entries."""
    x, x_ref = _np(x).astype(np.float64), _np(x_ref).astype(np.float64)
    if x.shape != x_ref.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {x_ref.shape}")
    if x.size == 0:
        raise ValueError("x and x_ref must not be empty")
    if not (np.isfinite(x).all() and np.isfinite(x_ref).all()):
        raise ValueError("x and x_ref must be finite")
    return float(np.mean((x - x_ref) ** 2))


def psnr_from_mse(mse_value, data_range: float = 1.0, *, min_mse: float = 0.0):
    """``10 log10(data_range^2 / max(mse, min_mse))`` in dB, elementwise for an array of MSEs
    (``inf`` where the error is 0 and ``min_mse = 0``). The one PSNR formula of the book.

    Raises ``ValueError`` if ``data_range <= 0``, ``min_mse < 0`` or an MSE is negative or NaN."""
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    if not min_mse >= 0:
        raise ValueError(f"min_mse must be >= 0, got {min_mse}")
    m = np.asarray(mse_value, dtype=np.float64)
    if np.isnan(m).any() or (m < 0).any():
        raise ValueError(f"mse must be >= 0, got {mse_value}")
    m = np.maximum(m, min_mse)
    with np.errstate(divide="ignore"):
        out = 10.0 * np.log10(data_range ** 2 / m)
    return float(out) if out.ndim == 0 else out


def psnr(x, x_ref, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB, ``10 log10(data_range^2 / MSE)`` (``inf`` when identical).

    Raises ``ValueError`` if ``data_range <= 0`` and as :func:`mse`.
    """
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    return psnr_from_mse(mse(x, x_ref), data_range)


def matched_psnr(x_rec: torch.Tensor, x_true: torch.Tensor, data_range: float = 1.0) -> np.ndarray:
    """PSNR (dB) of every true image against the reconstruction assigned to it.

    A batch attack returns the images in an arbitrary order, so reconstructions are matched to true
    images by the assignment of smallest total MSE (Hungarian algorithm). ``x_rec`` and ``x_true``:
    ``[batch, ...]`` with the same shape. Returns an array ``[batch]``.
    """
    from scipy.optimize import linear_sum_assignment

    if tuple(x_rec.shape) != tuple(x_true.shape):
        raise ValueError(f"x_rec and x_true must have the same shape, got {tuple(x_rec.shape)} "
                         f"and {tuple(x_true.shape)}")
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    a = x_rec.detach().reshape(len(x_rec), -1).double()
    b = x_true.detach().reshape(len(x_true), -1).double()
    cost = ((a[:, None, :] - b[None, :, :]) ** 2).mean(-1).numpy()  # [rec, true]
    rows, cols = linear_sum_assignment(cost)
    m = np.empty(len(b))
    m[cols] = cost[rows, cols]
    return psnr_from_mse(m, data_range, min_mse=1e-12)


def rounds_to_accuracy(history: dict, target: float) -> int | None:
    """First round at which ``history["accuracy"]`` reaches ``target`` (McMahan et al. 2017 report
    FedAvg's speed-up over FedSGD this way); ``None`` if it never does."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    for r, a in zip(history["round"], history["accuracy"]):
        if a >= target:
            return int(r)
    return None


def ks_pvalue(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov p-value (exact for small samples, as ``scipy.stats.ks_2samp``'s
    default) that ``a`` and ``b`` come from the same distribution: RAIFLE (Pham et al., App. C.1)
    compares per-user attack AUCs with those of random guessing this way (Tables 4-7). ``a``, ``b``:
    1-D arrays or tensors. Raises ``ValueError`` for an empty or non-finite sample."""
    from scipy.stats import ks_2samp

    a, b = _np(a).astype(np.float64).ravel(), _np(b).astype(np.float64).ravel()
    for name, x in (("a", a), ("b", b)):
        if x.size == 0:
            raise ValueError(f"{name} must not be empty")
        if not np.isfinite(x).all():
            raise ValueError(f"{name} must be finite")
    return float(ks_2samp(a, b).pvalue)


def auc_permutation_floor(labels, scores, *, num_permutations: int = 1000, quantile: float | Sequence[float] = 0.95,
                          seed: int = 0) -> float | list[float]:
    """Chance floor of a (mean) ROC AUC: the ``quantile`` of the AUC when the labels are shuffled
    (a list of quantiles gives the list of floors, each the number a call with that one quantile gives,
    from one set of shuffles).

    ``labels`` and ``scores``: ``[m]`` or ``[U, m]`` (``U`` rows, e.g. target clients, each with its own
    candidates). Each of ``num_permutations`` draws shuffles the labels within every row and takes the
    mean over rows of :func:`roc_auc_rows`; the result is the ``quantile`` of those means. An AUC (mean
    over the same rows) above it is unlikely (probability ``1 - quantile``) for scores that carry no
    information about the labels. One batched call, ``O(num_permutations U m)`` memory.

    Raises ``ValueError`` for mismatched shapes, ``num_permutations < 1`` or ``quantile`` outside (0, 1).
    """
    if int(num_permutations) != num_permutations or num_permutations < 1:
        raise ValueError(f"num_permutations must be a positive integer, got {num_permutations}")
    many = isinstance(quantile, (list, tuple))
    quantiles = list(quantile) if many else [quantile]
    for q in quantiles:
        if not 0 < q < 1:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
    lab = torch.as_tensor(_np(labels).astype(np.float64))
    sc = torch.as_tensor(_np(scores).astype(np.float64))
    if lab.shape != sc.shape or lab.dim() not in (1, 2):
        raise ValueError(f"labels and scores must both be [m] or [U, m], got {tuple(lab.shape)} and {tuple(sc.shape)}")
    if lab.dim() == 1:
        lab, sc = lab[None], sc[None]
    U, m = lab.shape
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.argsort(torch.rand(int(num_permutations), U, m, generator=g), dim=2)
    shuffled = torch.gather(lab.expand(int(num_permutations), U, m), 2, perm)
    # roc_auc_rows of every shuffle, with the ranks of the scores (the same under every shuffle) taken
    # once: the same arithmetic on the same numbers as roc_auc_rows(shuffled rows, repeated scores)
    roc_auc_rows(lab, sc)                                 # its checks: finite scores, both classes per row
    ordered = sc.sort(1).values.contiguous()
    below = torch.searchsorted(ordered, sc.contiguous(), right=False).double()
    upto = torch.searchsorted(ordered, sc.contiguous(), right=True).double()
    rank = ((below + upto + 1) / 2).repeat(int(num_permutations), 1)
    pos = shuffled.reshape(-1, m).double() > 0.5
    n_pos = pos.sum(1).double()
    n_neg = float(m) - n_pos
    aucs = (((rank * pos.double()).sum(1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)).reshape(-1, U).mean(1)
    floors = [float(torch.quantile(aucs, q)) for q in quantiles]
    return floors if many else floors[0]


def _labels_scores(labels, scores):
    labels, scores = _np(labels).ravel().astype(np.float64), _np(scores).ravel().astype(np.float64)
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores must have the same length, got {labels.shape} and {scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if not set(np.unique(labels)) == {0.0, 1.0}:
        raise ValueError("labels must hold both classes, 0 and 1")
    return labels, scores


def balanced_accuracy(labels, scores, threshold: float) -> float:
    """``(TPR + TNR) / 2`` of the rule "positive when ``score >= threshold``". Raises ``ValueError``
    for mismatched lengths, non-finite scores or labels that are not both 0 and 1."""
    labels, scores = _labels_scores(labels, scores)
    pred = scores >= threshold
    return float((pred[labels == 1].mean() + (~pred[labels == 0]).mean()) / 2)


def best_threshold(labels, scores) -> float:
    """The threshold ``tau`` that maximises :func:`balanced_accuracy` on ``(labels, scores)``: the
    midpoint between two neighbouring distinct scores (or just below / above all of them); the
    smallest such ``tau`` when several tie. Choose it on data *disjoint* from the data on which the
    accuracy is reported: on the evaluation data itself the best accuracy is optimistic (random
    scores on 20 + 20 candidates reach about 0.59). Raises ``ValueError`` as :func:`balanced_accuracy`."""
    labels, scores = _labels_scores(labels, scores)
    u = np.unique(scores)
    cands = np.r_[u[0] - 1.0, (u[:-1] + u[1:]) / 2, u[-1] + 1.0]
    pred = scores[None, :] >= cands[:, None]                                   # [C, n]
    pos = labels == 1
    bacc = (pred[:, pos].mean(1) + (~pred[:, ~pos]).mean(1)) / 2
    return float(cands[int(np.argmax(bacc))])


def optimum_status(reached: float, truth: float) -> str:
    """Did an attack that minimises a matching loss reach its optimum? Compares the loss it ended at
    (``reached``) with the same loss at the true answer (``truth``): ``"stalled"`` when it ended more than 10 times
    (plus 1e-3) above the truth's loss (the optimiser failed: what the attack recovered is a lower bound on what
    leaks), ``"below"`` when it ended under the truth's loss (the objective has better answers than the truth, so
    no optimiser finds the truth through it), else ``"reached"``. The one rule of the book's optimum checks
    (Chapter 3b's pruning sweep, the matrix's mask-aware cells). Raises ``ValueError`` for a loss that is negative
    or not finite."""
    for name, v in (("reached", reached), ("truth", truth)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite loss >= 0, got {v!r}")
    if reached > 10 * truth + 1e-3:
        return "stalled"
    return "below" if reached < truth else "reached"
