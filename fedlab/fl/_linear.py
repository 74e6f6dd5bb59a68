"""Small dense models trained without ``vmap``: ``nn.Linear(d, 1)`` with the squared or the logistic loss,
and ``nn.Sequential`` ReLU networks with one output (:func:`fedlab.models.mlp`) with the squared error. The
clients' SGD steps of :func:`fedlab.fl.clients_update` and IFCA's loss of every client under every
hypothesis are written out with the same floating-point operations in the same order, so they give the
same numbers bit for bit at a fraction of ``torch.func``'s per-call cost (a few milliseconds a step for a
model of a dozen parameters). Chapter 4's eavesdropped FedAvg and chapter 5's IFCA on the synthetic task
and the diabetes clinics run through it; ``tests/test_model_reconstruction.py`` and ``tests/test_ifca.py``
compare it with the ``vmap`` code, which stays the definition.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import finite_positive
from ..models import logistic_loss, squared_error
from .local import (ClientData, LocalTraining, _check_inputs, _check_weight_decay, _local, _start_params,
                    clients_update)
from .local import batch_plan as _vmap_batch_plan

__all__ = ["linear_fast_path", "batch_plan", "local_sgd"]


def linear_fast_path(model: nn.Module, loss_fn) -> bool:
    """Whether ``model`` is exactly ``nn.Linear(d, 1)`` (with or without bias) and ``loss_fn`` the squared
    or the logistic loss of :mod:`fedlab.models`, the case this module computes."""
    return type(model) is nn.Linear and model.out_features == 1 and loss_fn in (squared_error, logistic_loss)


def batch_plan(n: torch.Tensor, batch_size: int | None, local_epochs: int, generator: torch.Generator,
               local_steps: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fedlab.fl.batch_plan` with one slice assignment per shuffle instead of one per batch: the
    same ``randperm`` draws in the same order, so the same plan (and the same errors: the arguments go
    through ``batch_plan`` itself first, on one one-example client and a throwaway generator)."""
    _vmap_batch_plan(torch.ones(1, dtype=torch.long), batch_size, local_epochs, torch.Generator(), local_steps)
    n = torch.as_tensor(n, dtype=torch.long, device="cpu")
    if n.ndim != 1 or n.numel() == 0 or bool((n < 1).any()):
        return _vmap_batch_plan(n, batch_size, local_epochs, generator, local_steps)   # its error
    sizes = n.tolist()
    B = min(max(sizes) if batch_size is None else int(batch_size), max(sizes))
    per_epoch = [math.ceil(nk / B) for nk in sizes]
    if local_steps is not None:
        S = int(local_steps)
        shuffles = [math.ceil(S / pe) for pe in per_epoch]       # a fresh shuffle every per_epoch steps
    else:
        S = max(local_epochs * pe for pe in per_epoch)
        shuffles = [int(local_epochs)] * len(sizes)
    K = len(sizes)
    idx = torch.zeros((K, S, B), dtype=torch.long)
    weight = torch.zeros((K, S, B))
    for k, nk in enumerate(sizes):
        pe = per_epoch[k]
        for e in range(shuffles[k]):
            perm = torch.randperm(nk, generator=generator, device="cpu")
            steps = min(pe, S - e * pe) if local_steps is not None else pe
            full = torch.zeros(pe * B, dtype=torch.long)
            full[:nk] = perm
            mask = torch.zeros(pe * B)
            mask[:nk] = 1.0
            idx[k, e * pe:e * pe + steps] = full.view(pe, B)[:steps]
            weight[k, e * pe:e * pe + steps] = mask.view(pe, B)[:steps]
    return idx, weight


def local_sgd(p: dict, X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, wt: torch.Tensor, *,
              lr: float, weight_decay: float, logistic: bool) -> dict:
    """``fedlab.fl.clients_update`` (``vmap`` of ``fedlab.fl.local._step_fn``) written out for ``nn.Linear(d, 1)``:
    every client's masked SGD steps at once, with the same floating-point operations in the same order,
    so the same numbers bit for bit. ``p`` stacked ``{"weight": [K, 1, d], ("bias": [K, 1])}``, ``X``
    ``[K, n, d]``, ``y`` ``[K, n]``, ``idx`` and ``wt`` ``[K, S, B]`` (:func:`batch_plan`). The products
    are the ``bmm`` calls ``vmap`` makes, in its operand order; for the logistic loss the gradient of
    ``F.binary_cross_entropy_with_logits`` is that of the composite ``torch.func`` differentiates (ATen's
    CPU formula ``(1 - y) x + m + log(exp(-m) + exp(-x - m))``, ``m = max(-x, 0)``), with autograd's order
    of accumulating the three paths into ``m`` and into ``x``."""
    W, b = p["weight"], p.get("bias")
    dtype = W.dtype
    rows = torch.arange(X.shape[0])[:, None, None]
    X_all, y_all = X[rows, idx], y[rows, idx].to(dtype)                     # every step's batch: [K, S, B, (d)]
    g_l_all = (1.0 / wt.sum(2).clamp_min(1.0).to(dtype))[:, :, None] * wt   # d loss / d per-sample loss
    decay_all = (wt.sum(2) > 0).to(dtype) * weight_decay                     # a padding step decays nothing
    zero = torch.zeros((), dtype=dtype)
    for s in range(idx.shape[1]):
        Xb, yb, g_l = X_all[:, s], y_all[:, s], g_l_all[:, s]               # [K, B, d], [K, B], [K, B]
        out = torch.bmm(Xb, W.transpose(1, 2))[..., 0]                      # [K, B]
        if b is not None:
            out = b + out
        if logistic:
            a = -out
            m = a.clamp_min(0)
            e1, e2 = (-m).exp(), (-out - m).exp()
            g_s = g_l / e1.add(e2)
            g_d, g_nm = g_s * e2, g_s * e1
            g_m = ((-g_d) + (-g_nm)) + g_l
            g_out = ((-g_d) + g_l * (1 - yb)) + (-torch.where(a >= 0, g_m, zero))
        else:
            g_out = g_l * (2 * (out - yb))
        gW = torch.bmm(g_out[:, None, :], Xb)
        if weight_decay == 0:
            W = W - lr * gW
            if b is not None:
                b = b - lr * g_out.sum(1, keepdim=True)
        else:
            dec = decay_all[:, s]
            W = W - lr * (gW + dec[:, None, None] * W)
            if b is not None:
                b = b - lr * (g_out.sum(1, keepdim=True) + dec[:, None] * b)
    return {"weight": W} if b is None else {"weight": W, "bias": b}


_CHECKED: set = set()


def _checked_inputs(model: nn.Module, p: dict, data: ClientData, loss_fn) -> None:
    """``fedlab.fl.local._check_inputs`` on the first client, as :func:`fedlab.fl.clients_update` runs it every
    call, but run once per combination of parameter shapes and dtypes, feature shape, dtypes and devices:
    for the models of this module (no label check: neither loss is the cross-entropy) its outcome depends
    on nothing else, and a round of IFCA otherwise spends a ``functional_call`` on it."""
    key = (type(model), loss_fn, tuple((k, tuple(v.shape[1:]), v.dtype, v.device.type) for k, v in p.items()),
           tuple(data.X.shape[2:]), data.X.dtype, data.y.dtype, data.X.device.type, data.y.device.type)
    if key not in _CHECKED:
        _check_inputs(model, {k: v[0] for k, v in p.items()}, data.X[0], data.y[0], loss_fn, n=data.n)
        _CHECKED.add(key)


# ------------------------------------------------------------------------------------------------
# small ReLU networks (nn.Sequential of Linear, ReLU, ..., Linear(., 1)) with the squared error
# ------------------------------------------------------------------------------------------------
def mlp_fast_path(model: nn.Module, loss_fn) -> bool:
    """Whether ``model`` is an ``nn.Sequential`` of ``nn.Linear`` layers separated by ``nn.ReLU`` (as
    :func:`fedlab.models.mlp` builds them), ending in one output, and ``loss_fn`` the squared error."""
    if type(model) is not nn.Sequential or loss_fn is not squared_error or len(model) % 2 == 0:
        return False
    layers = list(model)
    return (all(type(m) is nn.Linear for m in layers[::2]) and all(type(m) is nn.ReLU for m in layers[1::2])
            and layers[-1].out_features == 1)


def _mlp_layers(model: nn.Sequential) -> list[tuple[str, bool]]:
    """``[(prefix, has_bias)]`` of the Linear layers of ``model`` (every other module)."""
    return [(f"{i}.", model[i].bias is not None) for i in range(0, len(model), 2)]


def mlp_local_sgd(model: nn.Sequential, p: dict, X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor,
                  wt: torch.Tensor, *, lr: float, weight_decay: float) -> dict:
    """:func:`local_sgd` for a model where :func:`mlp_fast_path` holds: the forward pass as ``vmap`` batches
    it (``bmm`` with the transposed weight, then the bias added), the backward pass as autograd runs it
    (``bmm(g^T, a)`` for a weight, the row sum for a bias, ``bmm(g, W)`` into the layer below,
    ``threshold_backward`` through a ReLU). ``p`` stacked ``{name: [K, ...]}``."""
    layers = _mlp_layers(model)
    dtype = p[layers[0][0] + "weight"].dtype
    rows = torch.arange(X.shape[0])[:, None, None]
    X_all, y_all = X[rows, idx], y[rows, idx].to(dtype)                     # every step's batch: [K, S, B, (d)]
    g_l_all = (1.0 / wt.sum(2).clamp_min(1.0).to(dtype))[:, :, None] * wt   # d loss / d per-sample loss
    decay_all = (wt.sum(2) > 0).to(dtype) * weight_decay
    p = dict(p)
    for s in range(idx.shape[1]):
        acts = [X_all[:, s]]                                                 # [K, B, d_in]
        for j, (pre, bias) in enumerate(layers):
            z = torch.bmm(acts[-1], p[pre + "weight"].transpose(1, 2))
            if bias:
                z = p[pre + "bias"][:, None, :] + z
            acts.append(torch.relu(z) if j < len(layers) - 1 else z)
        out = acts[-1][..., 0]
        g = (g_l_all[:, s] * (2 * (out - y_all[:, s])))[..., None]          # [K, B, 1]
        grads = {}
        for j in range(len(layers) - 1, -1, -1):
            pre, bias = layers[j]
            grads[pre + "weight"] = torch.bmm(g.transpose(1, 2), acts[j])
            if bias:
                grads[pre + "bias"] = g.sum(1)
            if j > 0:
                g = torch.ops.aten.threshold_backward(torch.bmm(g, p[pre + "weight"]), acts[j], 0)
        if weight_decay == 0:
            p = {k: p[k] - lr * grads[k] for k in p}
        else:
            dec = decay_all[:, s]
            p = {k: p[k] - lr * (grads[k] + dec.reshape(-1, *[1] * (p[k].ndim - 1)) * p[k]) for k in p}
    return p


def dense_clients_update(model: nn.Module, params: dict, data: ClientData, *, local: LocalTraining,
                         generator: torch.Generator | None = None, stacked: bool = False) -> dict:
    """:func:`fedlab.fl.clients_update` for a model where :func:`linear_fast_path` or :func:`mlp_fast_path`
    holds, with the same checks, batch plan and result (bit for bit); a single client (which
    ``clients_update`` runs outside ``vmap``, with other kernels) goes to ``clients_update`` itself.
    Returns the stacked dict ``{name: [K, ...]}``."""
    local = _local(local)
    K = data.num_clients
    if K < 2:
        return clients_update(model, params, data, local=local, generator=generator, stacked=stacked)
    loss_fn, lr, weight_decay = local.loss_fn, local.lr, local.weight_decay
    p = _start_params(params, K, stacked)
    _checked_inputs(model, p, data, loss_fn)
    idx, wt = batch_plan(data.n, local.batch_size, local.local_epochs, generator, local.local_steps)
    if linear_fast_path(model, loss_fn):
        return local_sgd(p, data.X, data.y, idx, wt, lr=lr, weight_decay=weight_decay,
                         logistic=loss_fn is logistic_loss)
    return mlp_local_sgd(model, p, data.X, data.y, idx, wt, lr=lr, weight_decay=weight_decay)


def dense_squared_losses(model: nn.Module, stacked: dict, data: ClientData) -> torch.Tensor:
    """IFCA's ``F_c(theta_j)`` for a model where :func:`linear_fast_path` or :func:`mlp_fast_path` holds and
    the squared error: the mean loss of every client (rows of ``data``, padding masked) under every
    hypothesis, given as a stacked parameter dict ``{name: [k, ...]}``; ``[K, k]``, as the nested ``vmap``
    of :func:`fedlab.fl.ifca.hypothesis_losses` computes it (one ``bmm`` per layer over the hypotheses,
    the bias added after it, the masked mean per client)."""
    X, y, n = data.X, data.y, data.n
    K, n_max, d = X.shape
    layers = [("", model.bias is not None)] if type(model) is nn.Linear else _mlp_layers(model)
    k = stacked[layers[0][0] + "weight"].shape[0]
    mask = (torch.arange(n_max, device=n.device)[None, :] < n[:, None]).float()
    a = X.reshape(1, K * n_max, d).expand(k, K * n_max, d)
    for j, (pre, bias) in enumerate(layers):
        W = stacked[pre + "weight"]
        z = torch.bmm(a, W.transpose(1, 2))                                  # [k, K n_max, out]
        if bias:
            z = stacked[pre + "bias"][:, None, :] + z
        a = torch.relu(z) if j < len(layers) - 1 else z
    out = a[..., 0].reshape(k, K, n_max)
    loss = ((out - y.to(out.dtype)) ** 2 * mask).sum(-1) / mask.sum(-1)
    return loss.T


__all__ += ["mlp_fast_path", "mlp_local_sgd", "dense_clients_update", "dense_squared_losses"]
