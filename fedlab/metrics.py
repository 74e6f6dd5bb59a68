"""Metrics shared by all chapters: accuracy, ROC AUC (scikit-learn), MSE and PSNR for images."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["accuracy", "roc_auc", "roc_curve", "mse", "psnr", "rounds_to_accuracy"]


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def accuracy(pred, y) -> float:
    """Fraction of correct predictions. ``pred`` is ``[n]`` labels or ``[n, C]`` scores/logits."""
    pred, y = _np(pred), _np(y)
    if pred.ndim == 2:
        pred = pred.argmax(1)
    if pred.shape != y.shape:
        raise ValueError(f"pred and y must have the same shape, got {pred.shape} and {y.shape}")
    if y.size == 0:
        raise ValueError("y must not be empty")
    return float((pred == y).mean())


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve (scikit-learn). ``labels`` in {0, 1} (1 = positive, e.g. member);
    a higher ``score`` should mean "more likely positive".

    Raises ``ValueError`` if only one class is present.
    """
    from sklearn.metrics import roc_auc_score

    labels, scores = _np(labels).ravel(), _np(scores).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores must have the same length, got {labels.shape} and {scores.shape}")
    if len(np.unique(labels)) != 2:
        raise ValueError("labels must contain both classes to compute an AUC")
    return float(roc_auc_score(labels, scores))


def roc_curve(labels, scores):
    """False- and true-positive rates (scikit-learn's ``roc_curve``): ``(fpr, tpr)``."""
    from sklearn.metrics import roc_curve as _rc

    fpr, tpr, _ = _rc(_np(labels).ravel(), _np(scores).ravel())
    return fpr, tpr


def mse(x, x_ref) -> float:
    """Mean squared error between two arrays of the same shape."""
    x, x_ref = _np(x).astype(np.float64), _np(x_ref).astype(np.float64)
    if x.shape != x_ref.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {x_ref.shape}")
    return float(np.mean((x - x_ref) ** 2))


def psnr(x, x_ref, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB, ``10 log10(data_range^2 / MSE)`` (``inf`` when identical).

    Raises ``ValueError`` if ``data_range <= 0``.
    """
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    m = mse(x, x_ref)
    return float("inf") if m == 0 else float(10.0 * np.log10(data_range**2 / m))


def rounds_to_accuracy(history: dict, target: float) -> int | None:
    """First round at which ``history["accuracy"]`` reaches ``target`` (McMahan et al. 2017 report
    FedAvg's speed-up over FedSGD this way); ``None`` if it never does."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    for r, a in zip(history["round"], history["accuracy"]):
        if a >= target:
            return int(r)
    return None
