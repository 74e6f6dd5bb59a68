"""LEAF's "synthetic" federated classification data (Caldas et al. 2018, Appendix A).

The generator follows the benchmark's written description (itself a variant of the synthetic data of
Li et al.'s FedProx paper): the clients' models are drawn around a few *clusters*, so clients that fall
in the same cluster solve similar tasks while clients in different clusters solve different ones; each
client's inputs are also shifted by its own random mean, so the data are heterogeneous both in ``x``
and in ``y | x``.

Generation, with ``d`` features, ``t`` classes and ``s`` clusters:

1. one shared tensor ``Q ~ N(0, 1)`` of shape ``[d + 1, t, s]`` and a diagonal covariance
   ``Sigma_jj = j^(-1.2)``;
2. per cluster ``j``: a scalar ``a_j ~ N(0, 1)`` and a centre ``mu_j ~ N(a_j, 1)`` in ``R^s``;
3. per client: a cluster ``j`` drawn with probabilities ``prob_clusters``; model information
   ``u ~ N(mu_j, 0.1^2 I_s)`` and weights ``w = Q u`` (shape ``[d + 1, t]``, the first row a bias);
   a scalar ``B ~ N(0, 1)``, a mean ``v ~ N(B, I_d)`` and inputs ``x ~ N(v, Sigma)``;
   labels ``y = argmax(softmax([1, x] w + N(0, 0.1^2)))``.

LEAF's published code first divided ``exp(z)`` by Python's ``sum`` over the ``[n, t]`` array, which adds
up the *samples*, not the classes: the label was ``argmax_j (z_ij - log sum_i exp(z_ij))``, each class's
logit shifted by a constant of the client, which balances the classes within a client. LEAF fixed this
on 2019-10-28 (commit 54669fd, "fixes softmax bug": ``scipy.special.softmax(..., axis=1)``, a softmax over
the classes), so its labels are the argmax of the logits, as the description says.
``label_rule="leaf"`` (the default) is the fixed rule; ``label_rule="leaf_pre_54669fd"`` reproduces the
old one (in a numerically stable form), for comparison with runs made before the fix.

Xu & Neglia (2021, Sec. 4) use ``d = 10``, ``t = 2``, ``s = 5`` and five clients of 280, 184, 1536,
256 and 208 samples (:data:`XU_NEGLIA_SIZES`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["LABEL_RULES", "XU_NEGLIA_SIZES", "make_leaf_synthetic"]

#: client sizes of Xu & Neglia (2021), Sec. 4 ("LEAF synthetic")
XU_NEGLIA_SIZES = (280, 184, 1536, 256, 208)

#: the label rules of :func:`make_leaf_synthetic`: LEAF's code since commit 54669fd (softmax over the
#: classes, the default) and before it (softmax over the client's samples)
LABEL_RULES = ("leaf", "leaf_pre_54669fd")


def make_leaf_synthetic(client_sizes: Sequence[int] = XU_NEGLIA_SIZES, *, num_features: int = 10,
                        num_classes: int = 2, num_clusters: int = 5,
                        prob_clusters: Sequence[float] | None = None, label_rule: str = "leaf", seed: int = 0):
    """Draw LEAF synthetic client data sets (Caldas et al. 2018, Appendix A).

    Parameters
    ----------
    client_sizes : sequence of int
        Number of samples of each client (its length is ``num_clients``).
    num_features, num_classes, num_clusters : int
        ``d``, ``t`` and ``s`` of the description above.
    prob_clusters : sequence of float, optional
        Probability of each cluster (uniform by default); must sum to 1.
    label_rule : {"leaf", "leaf_pre_54669fd"}
        How labels follow from the logits: ``"leaf"``, LEAF's code since commit 54669fd (2019-10-28), the
        argmax of a softmax over the classes, i.e. of the logits, as its description says; or
        ``"leaf_pre_54669fd"``, its code before that fix (softmax normalised over the client's samples).
        See the module docstring.
    seed : int
        Seed of the NumPy generator; the same seed gives the same data.

    Returns
    -------
    list of :class:`fedlab.data.Dataset`
        One per client: ``X`` float32 ``[n_k, num_features]``, ``y`` int64 ``[n_k]``; ``meta`` holds
        ``"cluster"`` (int) and ``"w"`` (the generating weights, ``[num_features + 1, num_classes]``).

    Raises
    ------
    ValueError
        If a size is not a positive integer, a count is below its minimum (1 feature, 2 classes,
        1 cluster), ``prob_clusters`` has the wrong length or does not sum to 1, or ``label_rule`` is
        unknown.
    """
    from . import Dataset

    sizes = [int(n) for n in client_sizes]
    if len(sizes) == 0 or min(sizes) < 1 or any(int(n) != n for n in client_sizes):
        raise ValueError(f"client_sizes must be positive integers, got {list(client_sizes)}")
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    if prob_clusters is None:
        prob = np.full(num_clusters, 1.0 / num_clusters)
    else:
        prob = np.asarray(prob_clusters, dtype=np.float64)
        if prob.shape != (num_clusters,) or (prob < 0).any() or not np.isclose(prob.sum(), 1.0):
            raise ValueError("prob_clusters must hold num_clusters non-negative numbers summing to 1")
    if label_rule not in LABEL_RULES:
        raise ValueError(f"label_rule must be one of {LABEL_RULES}, got {label_rule!r}")
    r = np.random.default_rng(seed)
    d, t, s = num_features, num_classes, num_clusters
    Q = r.normal(0.0, 1.0, size=(d + 1, t, s))
    sigma_diag = np.arange(1, d + 1, dtype=np.float64) ** -1.2
    centres = [r.normal(r.normal(0.0, 1.0), 1.0, size=s) for _ in range(s)]
    out = []
    for n in sizes:
        j = int(r.choice(s, p=prob))
        u = r.normal(centres[j], 0.1)
        w = Q @ u                                           # [d + 1, t]
        v = r.normal(r.normal(0.0, 1.0), 1.0, size=d)
        x = v + r.normal(size=(n, d)) * np.sqrt(sigma_diag)  # N(v, Sigma), Sigma diagonal
        logits = np.concatenate([np.ones((n, 1)), x], axis=1) @ w + r.normal(0.0, 0.1, size=(n, t))
        if label_rule == "leaf_pre_54669fd":                # exp(z) / sum over the samples, per class
            m = logits.max(axis=0)
            logits = logits - (m + np.log(np.exp(logits - m).sum(axis=0)))
        y = logits.argmax(axis=1)
        out.append(Dataset(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64)),
                           [f"x{i}" for i in range(d)], {"cluster": j, "w": w}))
    return out
