"""Interaction-based FL for recommendation: the local algorithms g of FCF and FNCF.

In interaction-based FL (Pham, Kulkarni & Houmansadr, RAIFLE, Sec. 2.3) a user only owns its
interactions ``I`` (1 = clicked/rated, 0 = not) with items the server chose; the item embeddings
``X`` and the model ``theta`` are the server's. Each function here is written functionally so that

* a user runs it on 0/1 interactions (the honest protocol), and
* the server can run it on continuous "degrees of interaction" ``I' in [0, 1]`` and differentiate the
  simulated update with respect to ``I'`` and the user embedding (RAIFLE, App. B.1),

and every batched variant maps over users with :func:`torch.func.vmap`. Padding: a batch of users has
``[U, m_max]`` items with a boolean ``mask``; padded rows contribute nothing and their updates are 0.

* FCF -- federated collaborative filtering (Ammad-ud-din et al. 2019): score ``x_i . e_u``,
  confidence-weighted squared loss; the update the user sends is the step on the item embeddings
  ``lr * c_i (I_i - x_i . e_u) e_u`` (rank one: every row is a multiple of ``e_u``).
* FNCF -- federated neural collaborative filtering (Perifanis & Efraimidis 2022) as configured in
  RAIFLE Sec. 4.1.3: an MLP on ``[e_u, x_i]`` with 16 and 8 ReLU hidden units and one logit, binary
  cross-entropy, ``local_steps`` full-batch gradient steps on ``(e_u, X, theta)``; the user sends the
  change of the item embeddings and of ``theta`` and keeps ``e_u``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


from ...models import get_params, mlp

__all__ = ["fcf_item_updates", "fncf_init", "fncf_updates", "fncf_first_layer", "fncf_per_user", "fncf_backprop"]


def fcf_item_updates(X, E, I, mask, *, alpha: float = 0.0, lr: float = 1.0):
    """FCF's item-embedding update for a batch of users (Ammad-ud-din et al. 2019, eq. for dJ/dy_i).

    With ``p_i = I_i``, confidence ``c_i = 1 + alpha I_i`` and loss ``1/2 sum_i c_i (I_i - x_i.e)^2``,
    the update of user ``u`` is minus ``lr`` times the item gradient: ``lr * c_i (I_i - x_i . e_u)
    e_u`` on its real items, 0 on padding. Differentiable in ``I`` and ``E``. (A one-user version
    and a ``torch.optim.SGD`` client are the test oracles in ``tests/oracles.py``.)

    ``X`` [U, m, d] (each user's items), ``E`` [U, d], ``I`` [U, m], ``mask`` [U, m] -> ``[U, m, d]``.
    """
    if X.dim() != 3 or E.dim() != 2 or I.dim() != 2 or mask.shape != I.shape:
        raise ValueError(f"expected X [U,m,d], E [U,d], I and mask [U,m]; got {tuple(X.shape)}, "
                         f"{tuple(E.shape)}, {tuple(I.shape)}, {tuple(mask.shape)}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    # same numbers as vmapping the one-user update of tests/oracles.py (checked in the tests), one einsum
    r = (1.0 + alpha * I) * (I - torch.einsum("umd,ud->um", X, E)) * mask.to(X.dtype)
    return lr * r[..., None] * E[:, None, :]


# ----------------------------------------------------------------------------------------------- FNCF

def fncf_init(dim: int = 64, hidden: tuple[int, ...] = (16, 8), *, seed: int = 0):
    """The FNCF network of RAIFLE Sec. 4.1.3: ``mlp(2 dim -> 16 -> 8 -> 1)`` with ReLU.

    Returns ``(model, theta)``: the ``nn.Module`` (used through ``functional_call``) and its
    parameter dict. Raises ``ValueError`` if ``dim < 1``.
    """
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    model = mlp(2 * dim, tuple(hidden), 1, activation="relu", seed=seed)
    return model, get_params(model)


def _mlp_layers(model):
    """Names of the (weight, bias) pairs of an ``nn.Sequential`` MLP, in order."""
    names = [k for k, _ in model.named_parameters()]
    return [(names[i], names[i + 1]) for i in range(0, len(names), 2)]


def _batched_fncf_loss(layers, E, X, Theta, I, w):
    """Sum over users of each user's mean BCE; per-user parameters stacked on dim 0, so the
    gradient of the sum is every user's own gradient (the users' losses are separate)."""
    (w1, b1) = layers[0]
    d = E.shape[1]
    W1 = Theta[w1]                                               # [U, h1, 2d]
    h = torch.einsum("ud,uhd->uh", E, W1[:, :, :d])[:, None, :] \
        + torch.einsum("umd,uhd->umh", X, W1[:, :, d:]) + Theta[b1][:, None, :]
    for (wk, bk) in layers[1:]:
        h = torch.einsum("umh,ukh->umk", torch.relu(h), Theta[wk]) + Theta[bk][:, None, :]
    logits = h.squeeze(-1)
    bce = F.binary_cross_entropy_with_logits(logits, I, reduction="none") * w
    return (bce.sum(1) / w.sum(1)).sum()


def fncf_first_layer(model, theta, dim: int):
    """``(W1e [h1, d], W1x [h1, d], names)`` of the FNCF network's first layer: the columns acting on
    the user embedding and on the item embedding (the input is ``[e_u, x_i]``), and the
    ``(weight, bias)`` names of every layer. With a stacked ``theta`` (one network per user, every
    tensor ``[U, ...]``, see :func:`fncf_backprop`) the two blocks are ``[U, h1, d]``. Raises
    ``ValueError`` if the first layer is not ``[h1, 2 dim]`` or ``[U, h1, 2 dim]``."""
    layers = _mlp_layers(model)
    W1 = theta[layers[0][0]].detach()
    if W1.dim() not in (2, 3) or W1.shape[-1] != 2 * dim:
        raise ValueError(f"the first layer must be [h1, 2*dim={2 * dim}] or [U, h1, 2*dim], got {tuple(W1.shape)}")
    return W1[..., :dim], W1[..., dim:], layers


def fncf_per_user(model, theta) -> bool:
    """Whether ``theta`` holds one FNCF network per user (every tensor one dimension more than the
    model's parameter, stacked on dim 0) rather than one network shared by all. Raises ``ValueError``
    for a ``theta`` that is neither (mixed, or a tensor of another shape)."""
    shapes = dict(model.named_parameters())
    stacked = [v.dim() == shapes[k].dim() + 1 and tuple(v.shape[1:]) == tuple(shapes[k].shape) for k, v in theta.items()]
    shared = [tuple(v.shape) == tuple(shapes[k].shape) for k, v in theta.items()]
    if all(stacked) and len({v.shape[0] for v in theta.values()}) == 1:
        return True
    if all(shared):
        return False
    raise ValueError("theta must hold the model's parameters, either shared or all stacked on one leading user dimension")


def fncf_backprop(layers, theta, XW, E, I, w, *, X=None, temperature: float = 0.0):
    """The backward pass of one FNCF step written out (ReLU hidden layers, ``theta`` shared by the
    users; RAIFLE Sec. 4.1.3), for a batch of users.

    ``XW`` [U, m, h1] = ``X @ W1x^T`` (the item part of the first pre-activation; constant for a
    server that knows ``X`` and ``theta``, so it is computed once), ``E`` [U, d], ``I``, ``w``
    [U, m] (``w`` 0/1 real items). The loss is each user's mean binary cross-entropy over its real
    items. Returns ``(delta [U, m, h1], grad_E [U, d], grads)``: ``delta`` the loss gradient with
    respect to the first pre-activation (the item gradient is ``delta @ W1x``), and the parameter
    gradients ``{name: [U, ...]}`` when the items ``X`` [U, m, d] are given (else ``None``; ``X``
    may also be a function ``delta -> delta^T X`` [U, h1, d], for a caller that avoids gathering ``X``).
    Differentiable in ``I`` and ``E`` with one autograd pass (no double backward); matches autograd
    (``tests/test_recsys.py``).

    ``theta`` is one network shared by the users, or one network per user (every tensor ``[U, ...]``
    stacked on dim 0, :func:`fncf_per_user`; the attack on many network draws at once,
    :func:`fedlab.experiments.chapter3a.fncf_network_draws`); with a shared ``theta`` the float
    operations are those of the shared network alone.

    ``temperature`` ``tau > 0`` replaces every hidden ReLU by its smooth version ``tau *
    softplus(a / tau)`` (derivative ``sigmoid(a / tau)``), which tends to the ReLU as ``tau -> 0``;
    ``0`` (default) is the network itself. A server uses it to see, in the gradient, which hidden
    units of which item are active (RAIFLE's attack by continuation,
    :func:`fedlab.attacks.interaction_inference.recsys.raifle_fncf`). Raises ``ValueError`` for a
    negative ``temperature``.
    """
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    d = E.shape[1]
    n = w.sum(1)
    (w1, b1) = layers[0]
    W1e = theta[w1].detach()[..., :d]
    per_user = W1e.dim() == 3                                     # one network per user: [U, h1, d]
    a = [XW + ((torch.einsum("ud,uhd->uh", E, W1e) if per_user else E @ W1e.T) + theta[b1].detach())[:, None, :]]
    z = [None]                                                    # pre-activations a [U, m, h]
    for (wk, bk) in layers[1:]:
        z.append(torch.relu(a[-1]) if temperature == 0 else temperature * F.softplus(a[-1] / temperature))
        b = theta[bk].detach()
        a.append(z[-1] @ theta[wk].detach().transpose(-1, -2) + (b[:, None, :] if per_user else b))
    delta = ((torch.sigmoid(a[-1].squeeze(-1)) - I) * w / n[:, None])[..., None]   # dL/dlogit [U, m, 1]
    grads = {} if X is not None else None
    for k in range(len(layers) - 1, 0, -1):                      # layer k's input is z[k]
        wk, bk = layers[k]
        if grads is not None:
            grads[wk] = delta.transpose(1, 2) @ z[k]             # [U, out, in]
            grads[bk] = delta.sum(1)
        gate = (a[k - 1] > 0).to(delta.dtype) if temperature == 0 else torch.sigmoid(a[k - 1] / temperature)
        delta = (delta @ theta[wk].detach()) * gate
    g1 = delta.sum(1)                                            # [U, h1]
    if grads is not None:
        dXt = X(delta) if callable(X) else delta.transpose(1, 2) @ X        # [U, h1, d]
        grads[w1] = torch.cat([g1[:, :, None] * E[:, None, :], dXt], 2)
        grads[b1] = g1
    return delta, (torch.einsum("uh,uhd->ud", g1, W1e) if per_user else g1 @ W1e), grads


def fncf_updates(model, theta, X, E, I, mask, *, lr: float = 1.0, local_steps: int = 3,
                 create_graph: bool | None = None):
    """FNCF local training (Perifanis & Efraimidis 2022; RAIFLE Sec. 4.1.3) for a batch of users at
    once (shared starting ``theta``): ``local_steps`` full-batch gradient steps with step size ``lr`` on
    each user's embedding, its item embeddings and the MLP parameters, minimising the mean binary
    cross-entropy between the logits and the interactions over the real (``mask``) items.

    ``X`` [U, m, d], ``E`` [U, d], ``I`` [U, m], ``mask`` [U, m] -> ``(delta_X [U, m, d],
    delta_theta {name: [U, ...]}, E_new [U, d])``. Instead of vmapping a one-user update (``tests/oracles.py``) (same
    numbers, see the tests) every user gets its own copy of ``theta`` stacked on dim 0 and one
    autograd pass differentiates the sum of the users' losses, which is several times faster on a
    CPU. With ``local_steps=1`` (RAIFLE's setting) the backward pass is written out instead
    (:func:`fncf_backprop`; the same numbers), several times faster for an attacker that
    differentiates it. ``create_graph`` (default: whether ``I`` or ``E`` requires grad) keeps the
    graph so the server can differentiate the result with respect to ``I`` and ``E``.

    ``theta`` may also hold one network per user (every tensor ``[U, ...]``, :func:`fncf_per_user`)
    with ``local_steps=1``: user ``u`` then trains network ``u``. Raises ``ValueError`` for
    mismatched shapes, ``local_steps < 1``, ``lr <= 0``, or per-user networks with ``local_steps >
    1`` or a number of networks other than ``U``.
    """
    if X.dim() != 3 or E.dim() != 2 or I.dim() != 2 or mask.shape != I.shape:
        raise ValueError(f"expected X [U,m,d], E [U,d], I and mask [U,m]; got {tuple(X.shape)}, "
                         f"{tuple(E.shape)}, {tuple(I.shape)}, {tuple(mask.shape)}")
    if local_steps < 1:
        raise ValueError(f"local_steps must be >= 1, got {local_steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if create_graph is None:
        create_graph = I.requires_grad or E.requires_grad
    U = X.shape[0]
    layers = _mlp_layers(model)
    w = mask.to(X.dtype)
    per_user = fncf_per_user(model, theta)
    if per_user and (local_steps != 1 or next(iter(theta.values())).shape[0] != U):
        raise ValueError(f"a theta with one network per user needs local_steps == 1 and {U} networks")
    if local_steps == 1:
        W1e, W1x, _ = fncf_first_layer(model, theta, X.shape[2])
        with torch.set_grad_enabled(create_graph):
            delta, gE, grads = fncf_backprop(layers, theta, X @ W1x.transpose(-1, -2), E, I, w, X=X)
            dX, dT, E_new = -lr * (delta @ W1x), {k: -lr * grads[k] for k in theta}, E - lr * gE
        if not create_graph:
            dX, dT, E_new = dX.detach(), {k: v.detach() for k, v in dT.items()}, E_new.detach()
        return dX, dT, E_new
    with torch.enable_grad():
        Ec = E if E.requires_grad else E.detach().clone().requires_grad_(True)
        Xc = X.detach().clone().requires_grad_(True)
        Th = {k: v.detach().expand(U, *v.shape).clone().requires_grad_(True) for k, v in theta.items()}
        Ec0, Xc0, Th0 = Ec, Xc, Th
        keys = list(Th)
        for _ in range(local_steps):
            loss = _batched_fncf_loss(layers, Ec, Xc, Th, I, w)
            grads = torch.autograd.grad(loss, [Ec, Xc, *[Th[k] for k in keys]], create_graph=create_graph)
            Ec = Ec - lr * grads[0]
            Xc = Xc - lr * grads[1]
            Th = {k: Th[k] - lr * g for k, g in zip(keys, grads[2:])}
    dX = Xc - Xc0
    dT = {k: Th[k] - Th0[k] for k in keys}
    if not create_graph:
        dX, dT, Ec = dX.detach(), {k: v.detach() for k, v in dT.items()}, Ec.detach()
    return dX, dT, Ec


