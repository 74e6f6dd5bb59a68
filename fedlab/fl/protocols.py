"""Federated learning protocols: FedAvg / FedSGD (McMahan et al. 2017), centralised and standalone
training as its two limits, and distributed selective SGD (Shokri & Shmatikov 2015).

Each protocol is a loop of :func:`fedlab.fl.rounds.run_rounds` around the clients' training of
:mod:`fedlab.fl.local` (all selected clients of a round in one ``vmap``) and the server's
:func:`weighted_average`. Every public name here is also :mod:`fedlab.fl`'s (``fl.fedavg``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from .._checks import finite_positive, finite_tensor
from ..config import device as _device
from ..models import flatten_params, unflatten_params
from .local import (ClientData, LocalTraining, LossFn, _local, _model_on, _on, client_update, clients_update,
                    cross_entropy, evaluate, stack_clients)
from .rounds import History, run_rounds

__all__ = ["weighted_average", "FLResult", "eval_fn", "RoundRecord", "fedavg", "fedsgd", "train_centralized",
           "train_standalone", "selective_sgd", "select_upload", "Sharing"]


def weighted_average(stacked: dict, weights: torch.Tensor) -> dict:
    """Server aggregation of FedAvg: ``sum_k (n_k / m) * w^k`` for a stacked dict ``{name: [K, ...]}``.

    ``weights``: ``[K]`` non-negative and finite (e.g. the ``n_k``); normalised here in float64 and then
    cast to each tensor's dtype (a float64 model gets float64 weights; for float32 the result is the
    correctly rounded float32 quotient, as before). Raises ``ValueError`` for NaN / infinite / negative
    weights or a zero sum.
    """
    weights = torch.as_tensor(weights, dtype=torch.float64, device="cpu")   # checked on the CPU
    if weights.ndim != 1 or not bool(torch.isfinite(weights).all()) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"weights must be a finite non-negative vector with a positive sum, got {weights}")
    wn = weights / weights.sum()
    out = {}
    for k, v in stacked.items():
        if v.shape[0] != len(wn):
            raise ValueError(f"stacked[{k!r}] has {v.shape[0]} clients, weights has {len(wn)}")
        out[k] = torch.tensordot(wn.to(device=v.device, dtype=v.dtype), v, dims=1)
    return out


@dataclass
class RoundRecord:
    """What crossed the network in one round, handed to a ``callback`` (e.g. an eavesdropper).

    ``global_params``: the model the server sent; ``selected``: client indices ``[m]``;
    ``client_params``: stacked models the clients returned ``{name: [m, ...]}``;
    ``weights``: their ``n_k``.
    """

    round: int
    global_params: dict
    selected: np.ndarray
    client_params: dict
    weights: torch.Tensor


@dataclass
class FLResult:
    """Final global parameters and per-round history (``round``, ``accuracy``, ``loss`` on the
    evaluation data when given; a :class:`fedlab.fl.rounds.History`)."""

    params: dict
    history: History = field(default_factory=lambda: History("accuracy", "loss"))


def eval_fn(model: nn.Module, eval_data, loss_fn: LossFn = cross_entropy, device=None):
    """``params -> {"accuracy", "loss"}`` on ``eval_data`` (for :func:`fedlab.fl.rounds.run_rounds`),
    or ``None`` when ``eval_data`` is ``None``. ``eval_data`` is a ``Dataset`` (anything with ``X`` and
    ``y``) or an ``(X, y)`` pair; anything else raises a ``ValueError`` naming ``eval_data``. With
    ``device`` (a ``torch.device``) the data is moved there once, for parameters living there."""
    if eval_data is None:
        return None
    if hasattr(eval_data, "X") and hasattr(eval_data, "y"):
        X, y = eval_data.X, eval_data.y
    elif isinstance(eval_data, (tuple, list)) and len(eval_data) == 2:
        X, y = eval_data
    else:
        raise ValueError(f"eval_data must be a Dataset or an (X, y) pair, got {type(eval_data).__name__}")
    if device is not None:
        X, y, model = torch.as_tensor(X, device=device), torch.as_tensor(y, device=device), _model_on(model, device)
    return lambda params: evaluate(model, params, X, y, loss_fn)


def fedavg(model: nn.Module, clients, *, num_rounds: int, local: LocalTraining = LocalTraining(),
           client_fraction: float = 1.0, params: dict | None = None, seed: int = 0, eval_data=None,
           callback: Callable[[RoundRecord], None] | None = None, device=None) -> FLResult:
    """FederatedAveraging (McMahan et al. 2017; Shokri's CS5562 lecture, Algorithm 1).

    Each round ``t``: the server samples ``m = max(C*K, 1)`` clients, each runs ClientUpdate from the
    current global model (``local``: :class:`LocalTraining`, E = ``local_epochs`` epochs of SGD with batch
    B = ``batch_size`` and step eta = ``lr``), and the server sets ``w_{t+1} = sum_k n_k / m_t * w^k_{t+1}``.
    A progress bar shows the rounds unless ``FEDLAB_PROGRESS=0`` (:func:`fedlab.config.progress_enabled`).

    Parameters
    ----------
    clients : ClientData or list of per-client data sets
    local : LocalTraining
        The clients' training (default: E = 1, B = 10, eta = 0.1; ``batch_size=None`` is the full local
        batch, ``local_steps`` a fixed number of steps, ``weight_decay`` lambda, ``loss_fn`` the loss, also
        reported on ``eval_data``).
    client_fraction : float in (0, 1]
        C, the fraction of the K clients sampled per round.
    eval_data : Dataset, optional
        Evaluated after round 0 (initial model) and after every round.
    callback : callable, optional
        Called with a :class:`RoundRecord` after each round.
    device : str or torch.device, optional
        Where the clients train and the server averages (default :func:`fedlab.config.device`, i.e.
        ``FEDLAB_DEVICE``, ``cpu`` unless set). Client sampling and mini-batches are drawn on the CPU,
        so every device runs the same schedule; the callback's record and the result are on the CPU.

    Returns
    -------
    FLResult

    Raises
    ------
    ValueError
        Naming ``local`` (not a :class:`LocalTraining`), ``lr`` (training diverged to NaN/inf parameters),
        the clients' ``X`` (NaN or infinite entries), ``y`` (labels outside the model's classes), ``params``,
        or ``device`` / ``FEDLAB_DEVICE``.
    """
    return _fedavg(model, clients, num_rounds=num_rounds, local=local, client_fraction=client_fraction,
                   params=params, seed=seed, eval_data=eval_data, callback=callback, device=device)


def _fedavg(model: nn.Module, clients, *, num_rounds: int, local: LocalTraining, client_fraction: float = 1.0,
            params: dict | None = None, seed: int = 0, eval_data=None, eval_every: int = 1,
            callback: Callable[[RoundRecord], None] | None = None, progress: bool | None = None,
            device=None) -> FLResult:
    """:func:`fedavg`, with the evaluation period and the progress bar as arguments (the library's own callers
    run FedAvg inside loops of their own and pass ``progress=False``)."""
    local = _local(local)
    if not 0.0 < client_fraction <= 1.0:
        raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
    dev = _device(device)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    finite_tensor("clients' X", data.X, " (one NaN makes every parameter NaN after the first round)")
    data = ClientData(data.X.to(dev), data.y.to(dev), data.n)        # no copy on the CPU
    K = data.num_clients
    m = max(int(round(client_fraction * K)), 1)
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    finite_tensor("params", w)
    w, on_model = _on(w, dev), _model_on(model, dev)
    cpu = (lambda d: d) if dev.type == "cpu" else (lambda d: {k: v.cpu() for k, v in d.items()})

    def step(t, w):
        selected = torch.randperm(K, generator=gen, device="cpu")[:m].sort().values
        sub = data.select(selected)
        updated = clients_update(on_model, w, sub, local=local, generator=gen)
        weights = sub.n.float()
        if callback is not None:
            callback(RoundRecord(t, cpu(w), selected.numpy(), cpu(updated), weights))
        new = weighted_average(updated, weights)
        finite_tensor(f"the global parameters after round {t}", new,
                      f" (training diverged: lower lr, got {local.lr})")
        return new

    w, history, _ = run_rounds(num_rounds, step, w, evaluate=eval_fn(model, eval_data, local.loss_fn, dev),
                               eval_every=eval_every, history=History("accuracy", "loss"),
                               progress=progress, desc="FedAvg rounds")
    return FLResult(cpu(w), history)


def fedsgd(model: nn.Module, clients, *, num_rounds: int, client_fraction: float = 1.0,
           lr: float = 0.1, **kwargs) -> FLResult:
    """FedSGD: FedAvg with one local epoch on the full local batch (E = 1, B = infinity).

    Each round is one gradient step ``w <- w - lr * sum_k n_k/m * grad F_k(w)``; with C = 1 that is
    exactly full-batch gradient descent on the pooled data.
    """
    loss_fn = kwargs.pop("loss_fn", cross_entropy)
    return fedavg(model, clients, num_rounds=num_rounds, client_fraction=client_fraction,
                  local=LocalTraining(lr=lr, local_epochs=1, batch_size=None, loss_fn=loss_fn), **kwargs)


def train_centralized(model: nn.Module, train, *, num_epochs: int, batch_size: int | None = 32,
                      lr: float = 0.1, params: dict | None = None, seed: int = 0, eval_data=None,
                      loss_fn: LossFn = cross_entropy) -> FLResult:
    """Centralized learning: all data pooled at one party, ``num_epochs`` of mini-batch SGD."""
    return _fedavg(model, [train], num_rounds=num_epochs,
                   local=LocalTraining(lr=lr, local_epochs=1, batch_size=batch_size, loss_fn=loss_fn),
                   params=params, seed=seed, eval_data=eval_data, progress=False)


def train_standalone(model: nn.Module, clients, *, num_epochs: int, batch_size: int | None = 32,
                     lr: float = 0.1, params: dict | None = None, seed: int = 0, eval_data=None,
                     loss_fn: LossFn = cross_entropy) -> tuple[dict, list[dict]]:
    """Standalone learning: every client trains alone on its own data (all clients in one vmap).

    Returns the stacked client models ``{name: [K, ...]}`` and, when ``eval_data`` is given, each
    client's accuracy and loss on it.
    """
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    local = clients_update(model, w, data, generator=gen,
                           local=LocalTraining(lr=lr, local_epochs=num_epochs, batch_size=batch_size, loss_fn=loss_fn))
    evals = []
    if eval_data is not None:
        for k in range(data.num_clients):
            evals.append(evaluate(model, {n: v[k] for n, v in local.items()}, eval_data.X,
                                  eval_data.y, loss_fn))
    return local, evals


def select_upload(delta: torch.Tensor, upload_fraction: float, criterion: str = "largest",
                  threshold: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Which coordinates of a parameter change ``delta`` (shape ``[d]``) a participant uploads in
    selective SGD (Shokri & Shmatikov 2015): a boolean mask with at most ``ceil(theta_u * d)`` ones.

    * ``"largest"``: the ``theta_u`` fraction of largest ``|delta|``;
    * ``"random"``: a random subset of the coordinates with ``|delta| > threshold`` (tau).
    """
    if not 0.0 < upload_fraction <= 1.0:
        raise ValueError(f"upload_fraction must be in (0, 1], got {upload_fraction}")
    if criterion not in ("largest", "random"):
        raise ValueError(f"criterion must be 'largest' or 'random', got {criterion!r}")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    d = delta.numel()
    k = max(1, math.ceil(upload_fraction * d))
    mask = torch.zeros(d, dtype=torch.bool)
    if criterion == "largest":
        mask[delta.abs().topk(k).indices] = True
    else:
        cand = torch.nonzero(delta.abs() > threshold).flatten()
        chosen = cand[torch.randperm(len(cand), generator=generator)[:k]]
        mask[chosen] = True
    return mask


@dataclass(frozen=True)
class Sharing:
    """What a participant of distributed selective SGD shares (Shokri & Shmatikov 2015, Sec. 4, "Distributed
    selective SGD"; the paper's defaults).

    ``upload_fraction``
        ``theta_u`` in (0, 1]: the fraction of its parameter change a participant uploads (default 0.1).
    ``criterion``
        ``"largest"``: the coordinates of largest absolute change; ``"random"``: a random subset (:func:`select_upload`).
    ``threshold``
        ``tau >= 0``: only changes larger than ``tau`` in absolute value are eligible (0: all).
    ``download_fraction``
        ``theta_d`` in (0, 1]: the fraction of the global parameters a participant downloads before training
        (default 1: all).

    Raises ``ValueError`` naming the field for a fraction outside (0, 1], an unknown ``criterion`` or a negative
    ``threshold``.
    """

    upload_fraction: float = 0.1
    criterion: str = "largest"
    threshold: float = 0.0
    download_fraction: float = 1.0

    def __post_init__(self):
        try:
            select_upload(torch.zeros(1), self.upload_fraction, self.criterion, self.threshold)
        except ValueError as err:
            raise ValueError(f"Sharing.{err}") from None
        if isinstance(self.download_fraction, bool) or not 0.0 < self.download_fraction <= 1.0:
            raise ValueError(f"Sharing.download_fraction must be in (0, 1], got {self.download_fraction}")


def selective_sgd(model: nn.Module, clients, *, num_rounds: int, sharing: Sharing = Sharing(),
                  local: LocalTraining = LocalTraining(batch_size=32), params: dict | None = None, seed: int = 0,
                  eval_data=None) -> FLResult:
    """Distributed selective SGD (Shokri & Shmatikov 2015; CS5562 lecture, "De-centralized learning").

    Participants take turns (round robin). A participant downloads a ``sharing.download_fraction`` (theta_d)
    of the global parameters into its local model, trains on its own data (``local``, a
    :class:`LocalTraining`; default one epoch of batch 32, step 0.1), and uploads only the selected
    coordinates (:func:`select_upload` with ``sharing``'s ``criterion`` and ``threshold``, fraction
    ``sharing.upload_fraction`` = theta_u) of its change, which the server adds to the global parameters.
    ``sharing`` is a :class:`Sharing`. A progress bar shows the turns unless ``FEDLAB_PROGRESS=0``.

    Returns an :class:`FLResult` whose ``history`` is logged once per full turn of all participants.
    Raises ``ValueError`` for a ``sharing`` that is not a :class:`Sharing`.
    """
    local = _local(local)
    if not isinstance(sharing, Sharing):
        raise ValueError(f"sharing must be a fedlab.fl.Sharing, got {type(sharing).__name__}: {sharing!r}")
    upload_fraction, criterion = sharing.upload_fraction, sharing.criterion
    threshold, download_fraction = sharing.threshold, sharing.download_fraction
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    gen = torch.Generator().manual_seed(seed)
    w0 = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    global_theta = flatten_params(w0)
    local_theta = [global_theta.clone() for _ in range(data.num_clients)]

    def step(t, global_theta):
        for k in range(data.num_clients):
            down = torch.rand(global_theta.numel(), generator=gen) < download_fraction
            theta = torch.where(down, global_theta, local_theta[k])
            Xk, yk = data.client(k)
            new = client_update(model, unflatten_params(theta, w0), Xk, yk, local=local, generator=gen)
            new_theta = flatten_params(new).detach()
            delta = new_theta - theta
            mask = select_upload(delta, upload_fraction, criterion, threshold, gen)
            global_theta = global_theta + torch.where(mask, delta, torch.zeros_like(delta))
            local_theta[k] = new_theta
        return global_theta

    ev = eval_fn(model, eval_data, local.loss_fn)
    global_theta, history, _ = run_rounds(
        num_rounds, step, global_theta, evaluate=None if ev is None else (lambda th: ev(unflatten_params(th, w0))),
        history=History("accuracy", "loss"), progress=None, desc="selective SGD rounds")
    return FLResult(unflatten_params(global_theta, w0), history)
