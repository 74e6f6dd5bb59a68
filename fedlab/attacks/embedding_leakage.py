"""Embedding-layer leakage (Melis et al. 2019, Section 4.1; CS5562 lecture, "Information leakage via the
gradient").

A text model turns word ``v`` into the row ``W_emb[v]`` of its embedding matrix. The loss depends on
row ``v`` only if word ``v`` occurs in the batch, so the gradient (and, with plain SGD, the whole local
update after any number of steps) is exactly zero on the rows of every absent word. A server that sees
the update reads the client's set of words off the non-zero rows.

* :func:`leaked_words` -- indices of rows whose norm exceeds a threshold (0: exactly non-zero).
* :func:`word_set_precision_recall` -- precision and recall of a recovered word set.
* :func:`embedding_update` -- the embedding part of a client's FedSGD gradient or FedAvg update.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import fl
from ..attacks.gradient_inversion import parameter_gradient

__all__ = ["leaked_words", "word_set_precision_recall", "embedding_update", "true_word_set"]


def _embedding_rows(update, key: str) -> torch.Tensor:
    if isinstance(update, dict):
        if len(update) == 0:
            raise ValueError("update must not be an empty dict")
        if key not in update:
            raise ValueError(f"key {key!r} not in update (keys: {sorted(update)})")
        update = update[key]
    if not isinstance(update, torch.Tensor) or update.ndim != 2:
        raise ValueError("update must be the embedding gradient [vocab_size, dim] or a dict holding it")
    return update


def leaked_words(update, *, key: str = "embedding.weight", threshold: float = 0.0) -> torch.Tensor:
    """Word ids whose embedding row in ``update`` has L2 norm ``> threshold`` (Melis et al. 2019).

    ``update``: the embedding gradient/update ``[vocab_size, dim]`` or a parameter dict holding
    it under ``key``. ``threshold = 0`` reads exact non-zeros (no defense); a positive threshold is
    the natural reading of a noised update. Returns a sorted LongTensor of word ids.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    rows = _embedding_rows(update, key)
    return torch.nonzero(rows.norm(dim=1) > threshold).flatten()


def true_word_set(tokens: torch.Tensor) -> torch.Tensor:
    """Sorted unique word ids of a batch of token sequences ``[n, L]``."""
    return torch.unique(tokens.flatten())


def word_set_precision_recall(recovered, true_words) -> tuple[float, float]:
    """Precision ``|R & T| / |R|`` and recall ``|R & T| / |T|`` of the recovered set ``R`` against the
    client's true word set ``T`` (both iterables of word ids). Precision is 1 for an empty ``R``
    (no false claims). Raises ``ValueError`` if ``T`` is empty."""
    R = set(int(v) for v in torch.as_tensor(recovered).flatten().tolist())
    T = set(int(v) for v in torch.as_tensor(true_words).flatten().tolist())
    if not T:
        raise ValueError("true_words must not be empty")
    hit = len(R & T)
    return (hit / len(R) if R else 1.0), hit / len(T)


def embedding_update(model: nn.Module, params: dict, tokens: torch.Tensor, y: torch.Tensor, *,
                     lr: float = 0.1, local_epochs: int = 0, batch_size: int | None = None,
                     generator: torch.Generator | None = None) -> dict:
    """What the server receives from a client holding sentences ``tokens [n, L]`` with labels ``y [n]``.

    ``local_epochs = 0``: the FedSGD gradient on all ``n`` sentences. ``local_epochs >= 1``: the FedAvg
    update ``theta_0 - theta_E`` after ``local_epochs`` epochs of SGD with ``batch_size`` and ``lr``
    (McMahan et al. 2017, Alg. 1). Returns a dict shaped like ``params``.
    """
    if tokens.ndim != 2 or tokens.is_floating_point():
        raise ValueError(f"tokens must be integer word ids [n, L], got shape {tuple(tokens.shape)}")
    if tokens.shape[0] != y.shape[0]:
        raise ValueError(f"tokens and y must have the same length, got {tokens.shape[0]} and {y.shape[0]}")
    if local_epochs < 0:
        raise ValueError(f"local_epochs must be >= 0, got {local_epochs}")
    if local_epochs == 0:
        return {k: v.detach() for k, v in parameter_gradient(model, params, tokens, y).items()}
    new = fl.client_update(model, params, tokens, y, generator=generator,
                           local=fl.LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=batch_size))
    return {k: (params[k] - new[k]).detach() for k in params}
