"""Client-side training of the federated protocols (McMahan et al. 2017, Algorithm 1, ClientUpdate),
written functionally, and the evaluation of a model.

The client update is a pure function of a parameter dictionary (``torch.func.functional_call`` and
``torch.func.grad``), so that

* many clients train at once: :func:`clients_update` runs every selected client in one ``vmap``
  (clients of different sizes are padded and masked, which gives exactly the same result as running
  them one by one, see ``tests/test_fl.py``);
* an attack can differentiate through a client's training (RAIFLE, DLG and friends).

Shapes: a parameter dict maps names to tensors; a *stacked* parameter dict has one extra leading
dimension ``K`` (one slice per client). The protocols that call these functions are in
:mod:`fedlab.fl.protocols`; every public name here is also :mod:`fedlab.fl`'s (``fl.client_update``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from .._checks import finite_positive, finite_tensor, positive_int

__all__ = ["ClientData", "LocalTraining", "stack_clients", "batch_plan", "client_update", "clients_update",
           "cross_entropy", "evaluate"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy, shape ``[batch]`` (the default loss of every protocol here)."""
    return F.cross_entropy(logits, y, reduction="none")


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains on its own data in a round: ClientUpdate of McMahan et al. (2017, Alg. 1).

    One settings object for every protocol of :mod:`fedlab.fl` (``fedavg``, ``dp_fedavg``, ``ifca``,
    ``selective_sgd``, ``centaur``, ``client_update``...) and the Flower apps, so that a page shows the
    client's training in one line, ``fl.LocalTraining(lr=0.1, local_epochs=5, batch_size=10)``, and a
    reader can pass the same object to the book's FedAvg and to Flower.

    Fields (defaults: FedAvg's ``E = 1``, ``B = 10`` and a step of 0.1, McMahan et al. 2017, Sec. 3):

    ``lr``
        the SGD step size ``eta``, finite and > 0.
    ``local_epochs``
        ``E``, passes over the client's data (a positive integer).
    ``batch_size``
        ``B``, the mini-batch size; ``None`` is the full batch (one step per epoch).
    ``local_steps``
        a fixed number of SGD steps instead of epochs (Xu & Neglia 2021, Table 1), or ``None``.
    ``weight_decay``
        ``lambda >= 0``: the client minimises ``mean loss + lambda/2 ||params||^2`` (0: plain SGD).
    ``loss_fn``
        the per-example loss ``(outputs [n, ...], y [n]) -> [n]``; the protocols also report it on their
        evaluation data.

    Raises ``ValueError`` naming the field for a step that is not finite and positive, an epoch count or
    batch size that is not a positive integer, or a negative or non-finite weight decay.
    """

    lr: float = 0.1
    local_epochs: int = 1
    batch_size: int | None = 10
    local_steps: int | None = None
    weight_decay: float = 0.0
    loss_fn: LossFn = cross_entropy

    def __post_init__(self):
        if not callable(self.loss_fn):
            raise ValueError(f"loss_fn must be a callable (outputs, y) -> per-example losses, got {self.loss_fn!r}")
        finite_positive("lr", self.lr)
        if isinstance(self.local_epochs, bool) or int(self.local_epochs) != self.local_epochs or self.local_epochs < 1:
            raise ValueError(f"local_epochs must be a positive integer, got {self.local_epochs!r}")
        if self.batch_size is not None:
            positive_int("batch_size", self.batch_size)
        if self.local_steps is not None:
            positive_int("local_steps", self.local_steps)
        _check_weight_decay(self.weight_decay)


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


def _local(local) -> "LocalTraining":
    """``local`` itself when it is a :class:`LocalTraining`, else a ``ValueError`` that says how to make one."""
    if not isinstance(local, LocalTraining):
        raise ValueError(f"local must be a fedlab.fl.LocalTraining (e.g. fl.LocalTraining(lr=0.1, local_epochs=1, "
                         f"batch_size=10)), got {type(local).__name__}: {local!r}")
    return local


def _spec_local(spec, loss_fn=cross_entropy) -> dict:
    """A run of a multi-run function (``fedavg_runs``, ``dp_fedavg_runs``) given, as its single-run function is,
    with ``local`` (a :class:`LocalTraining`): the same run with flat ``lr``, ``local_epochs`` and ``batch_size``.
    Raises ``ValueError`` naming ``local`` for flat keys beside it, ``local_steps`` or ``weight_decay`` (these runs
    do not take them) or a loss other than the one the runs share."""
    if "local" not in spec:
        return dict(spec)
    local = _local(spec["local"])
    clash = sorted({"lr", "local_epochs", "batch_size"} & set(spec))
    if clash:
        raise ValueError(f"local: a run gives its training either as local= or as {clash}, not both")
    if local.local_steps is not None or local.weight_decay != 0 or local.loss_fn is not loss_fn:
        raise ValueError(f"local: these runs train local_epochs epochs of the shared loss without weight decay, got "
                         f"local_steps={local.local_steps}, weight_decay={local.weight_decay}, loss_fn={local.loss_fn}")
    out = {k: v for k, v in spec.items() if k != "local"}
    return {**out, "lr": local.lr, "local_epochs": local.local_epochs, "batch_size": local.batch_size}


def client_update(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *, local: LocalTraining,
                  generator: torch.Generator | None = None) -> dict:
    """ClientUpdate(k, w) of McMahan et al. (2017, Alg. 1): ``local.local_epochs`` passes of mini-batch
    SGD with step ``local.lr`` over ``(X, y)`` (or ``local.local_steps`` steps, see :func:`batch_plan`;
    :class:`LocalTraining`). Pure function of ``params``: differentiable with ``torch.func`` and safe to call
    inside ``vmap``.

    ``X``: ``[n, ...]``, ``y``: ``[n]``. Returns the new parameter dict.
    """
    local = _local(local)
    if len(X) < 1 or len(y) != len(X):
        raise ValueError(f"X and y must hold the same number >= 1 of examples, got {len(X)} and {len(y)}")
    _check_inputs(model, params, X, y, local.loss_fn)
    idx, w = batch_plan(torch.tensor([len(X)]), local.batch_size, local.local_epochs, generator, local.local_steps)
    step = _step_fn(model, local.loss_fn, local.lr, local.weight_decay)
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


def clients_update(model: nn.Module, params: dict, data: ClientData, *, local: LocalTraining,
                   generator: torch.Generator | None = None, stacked: bool = False) -> dict:
    """Run :func:`client_update` for all ``K`` clients of ``data`` at once with ``torch.func.vmap``.

    ``params`` is one parameter dict broadcast to every client, or (``stacked=True``) a dict whose
    tensors have a leading client dimension ``K``. Returns a stacked dict ``{name: [K, ...]}``.
    The result equals running the clients one after the other with the same batch plan.
    """
    local = _local(local)
    K = data.num_clients
    p = _start_params(params, K, stacked)
    _check_inputs(model, {k: v[0] for k, v in p.items()}, data.X[0], data.y[0], local.loss_fn, n=data.n)
    idx, w = batch_plan(data.n, local.batch_size, local.local_epochs, generator, local.local_steps)  # on the CPU
    idx, w = idx.to(data.X.device), w.to(data.X.device)          # the same plan wherever the data lives
    step = _step_fn(model, local.loss_fn, local.lr, local.weight_decay)
    if K == 1:  # vmap's bookkeeping costs more than it saves for a single client
        q = {k: v[0] for k, v in p.items()}
        for s in range(idx.shape[1]):
            q = step(q, data.X[0], data.y[0], idx[0, s], w[0, s])
        return {k: v.unsqueeze(0) for k, v in q.items()}
    vstep = vmap(step)
    for s in range(idx.shape[1]):
        p = vstep(p, data.X, data.y, idx[:, s], w[:, s])
    return p
