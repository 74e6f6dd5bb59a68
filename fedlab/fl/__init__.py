"""Federated learning protocols: FedAvg / FedSGD (McMahan et al. 2017) and selective SGD
(Shokri & Shmatikov 2015), with the client update written functionally.

The client update is a pure function of a parameter dictionary (``torch.func.functional_call`` and
``torch.func.grad``), so that

* many clients train at once: :func:`clients_update` runs every selected client in one ``vmap``
  (clients of different sizes are padded and masked, which gives exactly the same result as running
  them one by one, see ``tests/test_fl.py``);
* an attack can differentiate through a client's training (RAIFLE, DLG and friends).

Shapes: a parameter dict maps names to tensors; a *stacked* parameter dict has one extra leading
dimension ``K`` (one slice per client).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from .._checks import finite_positive, finite_tensor, positive_int
from ..config import device as _device
from ..models import flatten_params, unflatten_params
from .rounds import History, run_rounds

__all__ = [
    "ClientData", "stack_clients", "batch_plan", "client_update", "clients_update",
    "weighted_average", "FLResult", "History", "run_rounds", "eval_fn", "RoundRecord", "fedavg", "fedsgd", "train_centralized",
    "train_standalone", "selective_sgd", "select_upload", "cross_entropy", "evaluate",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy, shape ``[batch]`` (the default loss of every protocol here)."""
    return F.cross_entropy(logits, y, reduction="none")


@torch.no_grad()
def evaluate(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor,
             loss_fn: LossFn = cross_entropy) -> dict[str, float]:
    """Accuracy and mean loss of ``model`` with ``params`` on ``(X, y)`` (``X``: ``[n, ...]``,
    ``y``: ``[n]``; the model is run where ``X`` lives and the numbers returned as Python floats).

    Raises ``ValueError`` naming ``X`` when it is empty or its length differs from ``y``'s, naming
    ``params`` or ``X`` when they hold NaN or infinite entries, and when the model's outputs are not
    finite: the argmax of NaN logits is class 0, so a diverged model would otherwise report the share of
    class 0 as its accuracy."""
    if len(X) < 1 or len(y) != len(X):
        raise ValueError(f"X and y must hold the same number >= 1 of examples, got {len(X)} and {len(y)}")
    finite_tensor("params", params, " (a diverged model has no accuracy: lower the learning rate)")
    finite_tensor("X", X)
    out = functional_call(model, params, (X,))
    finite_tensor("the model's outputs on X", out, " (the parameters are finite but too large: training "
                  "diverged? lower the learning rate)")
    loss = float(loss_fn(out, y).mean())
    if not math.isfinite(loss):
        raise ValueError(f"the loss on (X, y) is {loss} (labels outside the model's classes?)")
    return {"accuracy": float((out.argmax(-1) == y).float().mean()), "loss": loss}


# --------------------------------------------------------------------------------------------
# client data and batching
# --------------------------------------------------------------------------------------------
@dataclass
class ClientData:
    """Clients' data padded to a common length.

    ``X``: ``[K, n_max, *feature_shape]``; ``y``: ``[K, n_max]``; ``n``: ``[K]`` true sizes ``n_k``.
    Rows past ``n[k]`` are padding and never used.
    """

    X: torch.Tensor
    y: torch.Tensor
    n: torch.Tensor

    @property
    def num_clients(self) -> int:
        return int(self.n.shape[0])

    def select(self, idx) -> "ClientData":
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.n.device)   # n stays on the CPU
        return ClientData(self.X[idx], self.y[idx], self.n[idx])

    def client(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The unpadded ``(X_k, y_k)`` of client ``k``."""
        n = int(self.n[k])
        return self.X[k, :n], self.y[k, :n]


def stack_clients(datasets: Sequence) -> ClientData:
    """Pad a list of per-client data sets (``Dataset`` objects or ``(X, y)`` pairs) into a
    :class:`ClientData`.

    Raises
    ------
    ValueError
        If the list is empty, a client has no data, or feature shapes or dtypes differ between clients.
    """
    if len(datasets) == 0:
        raise ValueError("datasets must hold at least one client")
    pairs = [(d.X, d.y) if hasattr(d, "X") else (torch.as_tensor(d[0]), torch.as_tensor(d[1]))
             for d in datasets]
    shapes = {tuple(X.shape[1:]) for X, _ in pairs}
    if len(shapes) != 1:
        raise ValueError(f"all clients must have the same feature shape, got {sorted(shapes)}")
    sizes = [int(X.shape[0]) for X, _ in pairs]
    if min(sizes) < 1:
        raise ValueError("every client needs at least one example")
    for X, y in pairs:
        if y.shape[0] != X.shape[0]:
            raise ValueError("X and y of a client must have the same length")
    for name, i in (("X", 0), ("y", 1)):
        dtypes = {p[i].dtype for p in pairs}
        if len(dtypes) != 1:
            raise ValueError(f"all clients' {name} must have one dtype (stacking would cast them silently), "
                             f"got {sorted(str(d) for d in dtypes)}")
    n_max, K = max(sizes), len(pairs)
    X0, y0 = pairs[0]
    X = torch.zeros((K, n_max, *X0.shape[1:]), dtype=X0.dtype, device=X0.device)
    y = torch.zeros((K, n_max, *y0.shape[1:]), dtype=y0.dtype, device=y0.device)
    for k, (Xk, yk) in enumerate(pairs):
        X[k, : len(Xk)] = Xk
        y[k, : len(yk)] = yk
    return ClientData(X, y, torch.tensor(sizes, device="cpu"))


def batch_plan(n: torch.Tensor, batch_size: int | None, local_epochs: int,
               generator: torch.Generator | None = None,
               local_steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mini-batch schedule of ClientUpdate for every client (McMahan et al. 2017, Algorithm 1).

    Each epoch, client ``k`` shuffles its ``n_k`` examples and splits them into
    ``ceil(n_k / B)`` batches (the last one may be smaller). ``batch_size=None`` means full batch
    (``B = infinity``), one step per epoch.

    ``local_steps`` (optional) replaces the epoch count by a fixed number of SGD steps per client, as
    in Xu & Neglia (2021, Table 1): step ``s`` uses batch ``s mod ceil(n_k/B)`` of a fresh shuffle
    every ``ceil(n_k/B)`` steps, so every client makes exactly ``local_steps`` steps.

    Returns
    -------
    idx : LongTensor ``[K, S, B]``
        Example indices used at step ``s`` by client ``k`` (padding entries point at 0).
    weight : FloatTensor ``[K, S, B]``
        1 for a real example, 0 for padding. Steps past a client's last batch have all-zero weight,
        i.e. the client stays put, so clients of any size share one schedule of ``S`` steps.
    """
    if int(local_epochs) != local_epochs or local_epochs < 1:
        raise ValueError(f"local_epochs must be a positive integer, got {local_epochs}")
    n = torch.as_tensor(n, dtype=torch.long, device="cpu")   # the plan is drawn on the CPU
    if n.ndim != 1 or n.numel() == 0 or bool((n < 1).any()):
        raise ValueError(f"n must be a non-empty vector of client sizes >= 1 (a client without data has no "
                         f"batch), got {n.tolist()}")
    n_max = int(n.max())
    B = n_max if batch_size is None else positive_int("batch_size", batch_size)
    B = min(B, n_max)
    if local_steps is not None:
        if int(local_steps) != local_steps or local_steps < 1:
            raise ValueError(f"local_steps must be a positive integer or None, got {local_steps}")
        local_steps = int(local_steps)
        K = len(n)
        idx = torch.zeros((K, local_steps, B), dtype=torch.long, device="cpu")
        weight = torch.zeros((K, local_steps, B), device="cpu")
        for k, nk in enumerate(n.tolist()):
            per_epoch = math.ceil(nk / B)
            for s in range(local_steps):
                if s % per_epoch == 0:
                    perm = torch.randperm(nk, generator=generator, device="cpu")
                b = s % per_epoch
                chunk = perm[b * B:(b + 1) * B]
                idx[k, s, : len(chunk)] = chunk
                weight[k, s, : len(chunk)] = 1.0
        return idx, weight
    steps = [local_epochs * math.ceil(int(nk) / B) for nk in n]
    S, K = max(steps), len(n)
    idx = torch.zeros((K, S, B), dtype=torch.long, device="cpu")
    weight = torch.zeros((K, S, B), device="cpu")
    for k, nk in enumerate(n.tolist()):
        per_epoch = math.ceil(nk / B)
        for e in range(local_epochs):
            perm = torch.randperm(nk, generator=generator, device="cpu")
            for b in range(per_epoch):
                chunk = perm[b * B:(b + 1) * B]
                s = e * per_epoch + b
                idx[k, s, : len(chunk)] = chunk
                weight[k, s, : len(chunk)] = 1.0
    return idx, weight


def _step_fn(model: nn.Module, loss_fn: LossFn, lr: float, weight_decay: float = 0.0):
    """One masked SGD step of one client: ``params <- params - lr * grad(mean loss over batch)``;
    with ``weight_decay`` lambda > 0 the gradient of the local objective ``mean loss + lambda/2 ||params||^2``
    (every parameter, biases included). A step whose weights ``w`` are all zero (padding) changes nothing."""

    def batch_loss(params, X, y, idx, w):
        out = functional_call(model, params, (X[idx],))
        return (loss_fn(out, y[idx]) * w).sum() / w.sum().clamp_min(1.0)

    g = grad(batch_loss)

    if weight_decay == 0:
        def step(params, X, y, idx, w):
            gr = g(params, X, y, idx, w)
            return {k: params[k] - lr * gr[k] for k in params}
    else:
        def step(params, X, y, idx, w):
            # a padding step (all weights 0: this client has run out of batches while the stacked clients
            # go on) must leave the parameters alone, decay included; otherwise a smaller client would be
            # shrunk by steps it never takes when run on its own
            gr = g(params, X, y, idx, w)
            live = (w.sum() > 0).to(next(iter(params.values())).dtype)
            return {k: params[k] - lr * (gr[k] + live * weight_decay * params[k]) for k in params}

    return step


def _check_weight_decay(weight_decay) -> None:
    if isinstance(weight_decay, bool) or not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay)
                                              and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")


def client_update(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *, lr: float,
                  local_epochs: int = 1, batch_size: int | None = None,
                  generator: torch.Generator | None = None, loss_fn: LossFn = cross_entropy,
                  local_steps: int | None = None, weight_decay: float = 0.0) -> dict:
    """ClientUpdate(k, w) of McMahan et al. (2017, Alg. 1): ``local_epochs`` passes of mini-batch
    SGD with step ``lr`` over ``(X, y)``. Pure function of ``params``: differentiable with
    ``torch.func`` and safe to call inside ``vmap``. ``local_steps`` (optional): a fixed number of
    SGD steps instead of epochs (see :func:`batch_plan`). ``weight_decay`` lambda >= 0: the client
    minimises ``mean loss + lambda/2 ||params||^2`` (0, the default, is plain SGD).

    ``X``: ``[n, ...]``, ``y``: ``[n]``. Returns the new parameter dict.
    """
    finite_positive("lr", lr)
    _check_weight_decay(weight_decay)
    if len(X) < 1 or len(y) != len(X):
        raise ValueError(f"X and y must hold the same number >= 1 of examples, got {len(X)} and {len(y)}")
    _check_inputs(model, params, X, y, loss_fn)
    idx, w = batch_plan(torch.tensor([len(X)]), batch_size, local_epochs, generator, local_steps)
    step = _step_fn(model, loss_fn, lr, weight_decay)
    for s in range(idx.shape[1]):
        params = step(params, X, y, idx[0, s], w[0, s])
    return params


@torch.no_grad()
def _check_inputs(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                  n: torch.Tensor | None = None) -> None:
    """Clear errors, before any training, for what would otherwise fail deep inside ``vmap`` or pass
    silently: a meta tensor, a dtype or shape the model does not take (applied to one example of ``X``),
    and, for the default cross-entropy loss, labels outside ``0..C-1`` (a negative label such as -100 is
    silently ignored by ``F.cross_entropy``; one ``>= C`` is an index error under ``vmap``). ``X``:
    ``[n, ...]``, ``y``: ``[n]`` (with ``n`` given, only the first ``n.max()`` rows count)."""
    if X.device.type == "meta" or y.device.type == "meta":
        raise ValueError("X and y are meta tensors (shapes without data): load real data onto a device")
    try:
        out = functional_call(model, params, (X[:1],))
    except RuntimeError as exc:
        raise ValueError(f"the model cannot be applied to X (one example: shape {tuple(X.shape[1:])}, dtype "
                         f"{X.dtype}; params dtype {next(iter(params.values())).dtype}): {exc}") from exc
    if loss_fn is cross_entropy and not y.is_floating_point() and out.ndim == 2:
        C = out.shape[-1]
        rows = y if n is None else y[..., : int(n.max())]
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= C):
            raise ValueError(f"y: labels must lie in 0..{C - 1} for a model with {C} outputs, got labels in "
                             f"{int(rows.min())}..{int(rows.max())}")


def _model_on(model: nn.Module, dev: torch.device) -> nn.Module:
    """``model`` itself when its buffers (the parameters are passed to ``functional_call``) already live
    on ``dev`` (always on the CPU), else a copy moved there."""
    if all(b.device == dev for b in model.buffers()):
        return model
    return copy.deepcopy(model).to(dev)


def _on(tensors: dict, dev: torch.device) -> dict:
    """``{name: tensor on dev}`` (no copy for a tensor already there)."""
    return {k: v.to(dev) for k, v in tensors.items()}


def _expand(params: dict, K: int) -> dict:
    return {k: v.unsqueeze(0).expand(K, *v.shape).clone() for k, v in params.items()}


def _start_params(params: dict, K: int, stacked: bool) -> dict:
    """Every client's starting parameters ``{name: [K, ...]}``, a copy: ``params`` broadcast to the ``K``
    clients, or (``stacked``) ``params`` already holding one row per client. Raises ``ValueError`` when a
    stacked tensor's leading dimension is not ``K``."""
    if not stacked:
        return _expand(params, K)
    bad = [k for k, v in params.items() if v.shape[0] != K]
    if bad:
        raise ValueError(f"stacked params must have leading dimension K={K}: {bad}")
    return {k: v.clone() for k, v in params.items()}


def clients_update(model: nn.Module, params: dict, data: ClientData, *, lr: float,
                   local_epochs: int = 1, batch_size: int | None = None,
                   generator: torch.Generator | None = None, loss_fn: LossFn = cross_entropy,
                   stacked: bool = False, local_steps: int | None = None, weight_decay: float = 0.0) -> dict:
    """Run :func:`client_update` for all ``K`` clients of ``data`` at once with ``torch.func.vmap``.

    ``params`` is one parameter dict broadcast to every client, or (``stacked=True``) a dict whose
    tensors have a leading client dimension ``K``. Returns a stacked dict ``{name: [K, ...]}``.
    The result equals running the clients one after the other with the same batch plan.
    """
    finite_positive("lr", lr)
    K = data.num_clients
    p = _start_params(params, K, stacked)
    _check_weight_decay(weight_decay)
    _check_inputs(model, {k: v[0] for k, v in p.items()}, data.X[0], data.y[0], loss_fn, n=data.n)
    idx, w = batch_plan(data.n, batch_size, local_epochs, generator, local_steps)   # drawn on the CPU
    idx, w = idx.to(data.X.device), w.to(data.X.device)          # the same plan wherever the data lives
    step = _step_fn(model, loss_fn, lr, weight_decay)
    if K == 1:  # vmap's bookkeeping costs more than it saves for a single client
        q = {k: v[0] for k, v in p.items()}
        for s in range(idx.shape[1]):
            q = step(q, data.X[0], data.y[0], idx[0, s], w[0, s])
        return {k: v.unsqueeze(0) for k, v in q.items()}
    vstep = vmap(step)
    for s in range(idx.shape[1]):
        p = vstep(p, data.X, data.y, idx[:, s], w[:, s])
    return p


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


# --------------------------------------------------------------------------------------------
# protocols
# --------------------------------------------------------------------------------------------
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


def fedavg(model: nn.Module, clients, *, num_rounds: int, client_fraction: float = 1.0,
           local_epochs: int = 1, batch_size: int | None = 10, lr: float = 0.1,
           params: dict | None = None, seed: int = 0, eval_data=None, eval_every: int = 1,
           loss_fn: LossFn = cross_entropy, callback: Callable[[RoundRecord], None] | None = None,
           progress: bool | None = None, local_steps: int | None = None,
           weight_decay: float = 0.0, device=None) -> FLResult:
    """FederatedAveraging (McMahan et al. 2017; Shokri's CS5562 lecture, Algorithm 1).

    Each round ``t``: the server samples ``m = max(C*K, 1)`` clients, each runs ClientUpdate from the
    current global model (``local_epochs`` = E epochs of SGD, batch ``batch_size`` = B, step ``lr`` =
    eta), and the server sets ``w_{t+1} = sum_k n_k / m_t * w^k_{t+1}``.

    Parameters
    ----------
    clients : ClientData or list of per-client data sets
    client_fraction : float in (0, 1]
        C, the fraction of the K clients sampled per round.
    batch_size : int or None
        B; ``None`` is the full local batch (B = infinity).
    eval_data : Dataset, optional
        Evaluated after round 0 (initial model) and every ``eval_every`` rounds.
    callback : callable, optional
        Called with a :class:`RoundRecord` after each round.
    local_steps : int, optional
        Run exactly this many SGD steps per client and round instead of ``local_epochs`` epochs.
    weight_decay : float
        lambda >= 0: each client's local objective is ``mean loss + lambda/2 ||w||^2`` (0: none).
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
        Naming ``lr`` (not finite and > 0, or training diverged to NaN/inf parameters), the clients'
        ``X`` (NaN or infinite entries), ``y`` (labels outside the model's classes), ``params``, or
        ``device`` / ``FEDLAB_DEVICE``.
    """
    if not 0.0 < client_fraction <= 1.0:
        raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
    finite_positive("lr", lr)
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
        local = clients_update(on_model, w, sub, lr=lr, local_epochs=local_epochs,
                               batch_size=batch_size, generator=gen, loss_fn=loss_fn,
                               local_steps=local_steps, weight_decay=weight_decay)
        weights = sub.n.float()
        if callback is not None:
            callback(RoundRecord(t, cpu(w), selected.numpy(), cpu(local), weights))
        new = weighted_average(local, weights)
        finite_tensor(f"the global parameters after round {t}", new,
                      f" (training diverged: lower lr, got {lr})")
        return new

    w, history, _ = run_rounds(num_rounds, step, w, evaluate=eval_fn(model, eval_data, loss_fn, dev),
                               eval_every=eval_every, history=History("accuracy", "loss"),
                               progress=progress, desc="FedAvg rounds")
    return FLResult(cpu(w), history)


def fedsgd(model: nn.Module, clients, *, num_rounds: int, client_fraction: float = 1.0,
           lr: float = 0.1, **kwargs) -> FLResult:
    """FedSGD: FedAvg with one local epoch on the full local batch (E = 1, B = infinity).

    Each round is one gradient step ``w <- w - lr * sum_k n_k/m * grad F_k(w)``; with C = 1 that is
    exactly full-batch gradient descent on the pooled data.
    """
    return fedavg(model, clients, num_rounds=num_rounds, client_fraction=client_fraction,
                  local_epochs=1, batch_size=None, lr=lr, **kwargs)


def train_centralized(model: nn.Module, train, *, num_epochs: int, batch_size: int | None = 32,
                      lr: float = 0.1, params: dict | None = None, seed: int = 0, eval_data=None,
                      loss_fn: LossFn = cross_entropy) -> FLResult:
    """Centralized learning: all data pooled at one party, ``num_epochs`` of mini-batch SGD."""
    return fedavg(model, [train], num_rounds=num_epochs, local_epochs=1, batch_size=batch_size,
                  lr=lr, params=params, seed=seed, eval_data=eval_data, loss_fn=loss_fn,
                  progress=False)


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
    local = clients_update(model, w, data, lr=lr, local_epochs=num_epochs, batch_size=batch_size,
                           generator=gen, loss_fn=loss_fn)
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


def selective_sgd(model: nn.Module, clients, *, num_rounds: int, upload_fraction: float = 0.1,
                  criterion: str = "largest", threshold: float = 0.0, download_fraction: float = 1.0,
                  local_epochs: int = 1, batch_size: int | None = 32, lr: float = 0.1,
                  params: dict | None = None, seed: int = 0, eval_data=None,
                  loss_fn: LossFn = cross_entropy, progress: bool | None = None) -> FLResult:
    """Distributed selective SGD (Shokri & Shmatikov 2015; CS5562 lecture, "De-centralized learning").

    Participants take turns (round robin). A participant downloads a ``download_fraction`` (theta_d)
    of the global parameters into its local model, runs ``local_epochs`` of SGD on its own data,
    and uploads only the selected coordinates (:func:`select_upload`, fraction ``upload_fraction`` =
    theta_u) of its change, which the server adds to the global parameters.

    Returns an :class:`FLResult` whose ``history`` is logged once per full turn of all participants.
    """
    if not 0.0 < download_fraction <= 1.0:
        raise ValueError(f"download_fraction must be in (0, 1], got {download_fraction}")
    select_upload(torch.zeros(1), upload_fraction, criterion, threshold)  # validates the arguments
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
            new = client_update(model, unflatten_params(theta, w0), Xk, yk, lr=lr,
                                local_epochs=local_epochs, batch_size=batch_size, generator=gen,
                                loss_fn=loss_fn)
            new_theta = flatten_params(new).detach()
            delta = new_theta - theta
            mask = select_upload(delta, upload_fraction, criterion, threshold, gen)
            global_theta = global_theta + torch.where(mask, delta, torch.zeros_like(delta))
            local_theta[k] = new_theta
        return global_theta

    ev = eval_fn(model, eval_data, loss_fn)
    global_theta, history, _ = run_rounds(
        num_rounds, step, global_theta, evaluate=None if ev is None else (lambda th: ev(unflatten_params(th, w0))),
        history=History("accuracy", "loss"), progress=progress, desc="selective SGD rounds")
    return FLResult(unflatten_params(global_theta, w0), history)
