"""Gradient inversion: recover a client's training images from the gradient (or update) it sends.

* :func:`dlg` -- Deep Leakage from Gradients (Zhu et al. 2019, Alg. 1): a dummy input and a dummy
  soft label are optimised jointly with L-BFGS so that their gradient matches the observed one in
  squared Euclidean distance.
* :func:`idlg_label` -- the label rule of iDLG (Zhao et al. 2020, Sec. 3): with cross-entropy and
  non-negative penultimate activations, the row of the last layer's weight gradient that belongs to
  the true class is the only one with a negative sum.
* :func:`inverting_gradients` -- Inverting Gradients (Geiping et al. 2020, Sec. 4): cosine distance
  between gradients plus a total-variation prior, minimised with (signed) Adam inside the box [0, 1].
* :func:`client_update_as_gradient`, :func:`matched_psnr`, :func:`success_rate` -- the pieces of the
  success-rate study (Wei et al. 2020 evaluate DLG against batch size and local steps this way).

Every attack takes ``(model, params, observed)`` where ``observed`` is a parameter-shaped dict (the
gradient or the update the server receives) and returns an :class:`InversionResult` with the
reconstruction and a history of the objective (and of the PSNR when the true images are passed).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .. import fl
from ..metrics import matched_psnr
from ..optim import lbfgs_fixed_step

__all__ = [
    "InversionResult",
    "parameter_gradient",
    "gradient_distance",
    "total_variation",
    "idlg_label",
    "dlg",
    "inverting_gradients",
    "client_update_as_gradient",
    "matched_psnr",
    "success_rate",
    "dlg_init_",
    "attack_grid",
    "per_example_gradients",
]


@dataclass
class InversionResult:
    """Output of a gradient-inversion attack.

    ``x``: reconstruction ``[batch, *input_shape]`` clamped to ``[0, 1]``; ``labels``: recovered labels
    ``[batch]``; ``history``: ``{"iteration", "loss", "psnr"}`` lists (``psnr`` only when the true
    images were given); ``snapshots``: list of ``(iteration, x)`` pairs for figures.
    """

    x: torch.Tensor
    labels: torch.Tensor
    history: dict = field(default_factory=dict)
    snapshots: list = field(default_factory=list)


def dlg_init_(model: nn.Module, seed: int = 0, scale: float = 0.5) -> nn.Module:
    """Re-initialise every parameter i.i.d. uniform on ``[-scale, scale]`` in place, as the reference
    code of Zhu et al. (2019) does for its sigmoid LeNet (larger weights than PyTorch's default keep
    the sigmoid network's gradients informative). Returns the model."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-scale, scale, generator=gen)
    return model


# ------------------------------------------------------------------------------------------------
# gradients and distances
# ------------------------------------------------------------------------------------------------
def _check_observed(observed, params=None) -> dict:
    if not isinstance(observed, dict) or len(observed) == 0:
        raise ValueError("observed must be a non-empty dict {parameter name: gradient tensor}")
    if params is not None:
        if set(observed) != set(params):
            raise ValueError(f"observed must have the model's parameter names {sorted(params)}, "
                             f"got {sorted(observed)}")
        for k in params:
            if tuple(observed[k].shape) != tuple(params[k].shape):
                raise ValueError(f"observed[{k!r}] has shape {tuple(observed[k].shape)}, "
                                 f"expected {tuple(params[k].shape)}")
    return observed


def parameter_gradient(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *,
                       create_graph: bool = False) -> dict:
    """Gradient of the mean cross-entropy over the batch with respect to every parameter.

    ``X``: ``[batch, *input_shape]``; ``y``: integer labels ``[batch]`` or soft labels
    ``[batch, num_classes]`` (probabilities, as DLG's dummy label). Returns ``{name: tensor}`` shaped
    like ``params``. ``create_graph=True`` keeps the graph so an attack can differentiate through it.
    """
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same batch size, got {X.shape[0]} and {y.shape[0]}")
    names = list(params)
    leaves = [params[k] if params[k].requires_grad else params[k].detach().requires_grad_(True)
              for k in names]
    out = functional_call(model, dict(zip(names, leaves)), (X,))
    if y.is_floating_point():
        loss = -(y * F.log_softmax(out, dim=-1)).sum(-1).mean()
    else:
        loss = F.cross_entropy(out, y)
    grads = torch.autograd.grad(loss, leaves, create_graph=create_graph)
    return dict(zip(names, grads))


def gradient_distance(dummy: dict, observed: dict, kind: str = "l2") -> torch.Tensor:
    """Distance between two parameter-shaped gradients, all tensors taken as one vector.

    ``kind="l2"``: ``sum ||g' - g||^2`` (Zhu et al. 2019, Eq. 4); ``kind="cosine"``:
    ``1 - <g', g> / (||g'|| ||g||)`` (Geiping et al. 2020, Eq. 4). Raises ``ValueError`` if the dicts
    are empty, their keys or shapes differ, or ``kind`` is unknown.
    """
    _check_observed(observed, dummy)
    if kind == "l2":
        return sum(((dummy[k] - observed[k]) ** 2).sum() for k in observed)
    if kind == "cosine":
        dot = sum((dummy[k] * observed[k]).sum() for k in observed)
        n1 = sum((dummy[k] ** 2).sum() for k in observed)
        n2 = sum((observed[k] ** 2).sum() for k in observed)
        return 1.0 - dot / (n1.sqrt() * n2.sqrt() + 1e-12)
    raise ValueError(f"kind must be 'l2' or 'cosine', got {kind!r}")


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation, mean absolute difference of neighbouring pixels (Geiping et al.
    2020, Eq. 4 prior). ``x``: ``[batch, channels, H, W]``; returns a scalar."""
    if x.ndim != 4:
        raise ValueError(f"x must have shape [batch, channels, H, W], got {tuple(x.shape)}")
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return dx + dy


def _last_weight(observed: dict, weight_key: str | None) -> torch.Tensor:
    _check_observed(observed)
    if weight_key is None:
        two_d = [k for k, v in observed.items() if v.ndim == 2]
        if not two_d:
            raise ValueError("observed has no 2-d (linear layer) weight gradient; pass weight_key")
        weight_key = two_d[-1]
    if weight_key not in observed:
        raise ValueError(f"weight_key {weight_key!r} not in observed")
    return observed[weight_key]


def idlg_label(observed, weight_key: str | None = None) -> int:
    """iDLG label rule (Zhao et al. 2020, Sec. 3.2) for a gradient computed on ONE example.

    With cross-entropy, ``dL/dW_i = (p_i - 1[i = y]) h`` for the last linear layer, where ``h >= 0``
    (sigmoid or ReLU features). Row ``y`` is the only row with a non-positive sum, so
    ``y = argmin_i sum_j dL/dW_ij``.

    ``observed``: the gradient dict (the last 2-d entry is used unless ``weight_key`` names one) or the
    last layer's weight gradient itself, shape ``[num_classes, features]``. Returns the label.
    """
    g = observed if isinstance(observed, torch.Tensor) else _last_weight(observed, weight_key)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ValueError(f"the last-layer weight gradient must have shape [num_classes>=2, features], "
                         f"got {tuple(g.shape)}")
    return int(g.sum(dim=1).argmin())


# ------------------------------------------------------------------------------------------------
# the attacks
# ------------------------------------------------------------------------------------------------
def _log_iteration(history: dict, snapshots: list, it: int, loss: float, *, psnr=None,
                   snapshot_every: int | None = None, snapshot=None) -> None:
    """Append iteration ``it`` to an attack's ``history`` (``loss``, and ``psnr()`` when ``psnr`` is
    given) and ``(it, snapshot())`` to ``snapshots`` at iteration 1 and every ``snapshot_every``-th.
    ``psnr`` and ``snapshot`` are zero-argument callables, evaluated only when needed."""
    history["iteration"].append(it)
    history["loss"].append(loss)
    if psnr is not None:
        history["psnr"].append(psnr())
    if snapshot_every and (it % snapshot_every == 0 or it == 1):
        snapshots.append((it, snapshot()))


def _validate_common(input_shape, batch_size, max_iter):
    if len(input_shape) == 0 or any(int(s) < 1 for s in input_shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive sizes, got {input_shape}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")


def dlg(model: nn.Module, params: dict, observed: dict, *, input_shape: tuple, num_classes: int,
        batch_size: int = 1, max_iter: int = 100, lr: float = 1.0, labels: torch.Tensor | None = None,
        x_true: torch.Tensor | None = None, snapshot_every: int | None = None, stacked: bool = False,
        history_size: int = 100, seed: int = 0) -> InversionResult:
    """Deep Leakage from Gradients (Zhu et al. 2019, Algorithm 1).

    Draw dummy ``x' ~ N(0, 1)`` of shape ``[batch_size, *input_shape]`` and dummy label logits ``y'``;
    run ``max_iter`` L-BFGS iterations (step ``lr``, no line search, as the authors' code) on
    ``||grad(x', softmax(y')) - observed||^2``. With ``labels`` given (e.g. from :func:`idlg_label`:
    that is iDLG) only ``x'`` is optimised.

    ``stacked=True`` runs ``A`` independent attacks at once: every ``observed`` tensor has a leading
    dimension ``A``, ``labels`` (if given) is ``[A, batch_size]``, ``x_true`` is
    ``[A, batch_size, *input_shape]``, and the result's ``x`` is ``[A, batch_size, *input_shape]``.
    Each attack keeps its own L-BFGS memory (the two-loop recursion is batched), so the result equals
    ``A`` separate runs; the gradients of all attacks come from one ``torch.func.vmap`` call.

    Returns an :class:`InversionResult`; ``x`` is clamped to ``[0, 1]``. An attack whose objective
    becomes non-finite keeps its last finite iterate. History ``loss``/``psnr`` are means over attacks.
    """
    from torch.func import grad_and_value, vmap

    _validate_common(input_shape, batch_size, max_iter)
    if not isinstance(observed, dict) or len(observed) == 0:
        raise ValueError("observed must be a non-empty dict {parameter name: gradient tensor}")
    obs = {k: v.detach() for k, v in observed.items()}
    if not stacked:
        obs = {k: v.unsqueeze(0) for k, v in obs.items()}
        labels = None if labels is None else labels.unsqueeze(0)
        x_true = None if x_true is None else x_true.unsqueeze(0)
    A = int(next(iter(obs.values())).shape[0])
    _check_observed({k: v[0] for k, v in obs.items()}, params)
    if any(int(v.shape[0]) != A for v in obs.values()):
        raise ValueError("observed tensors must share the leading (attack) dimension when stacked")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if labels is not None and tuple(labels.shape) != (A, batch_size):
        raise ValueError(f"labels must have shape {[A, batch_size] if stacked else [batch_size]}, "
                         f"got {tuple(labels.shape[1:] if not stacked else labels.shape)}")
    gen = torch.Generator().manual_seed(int(seed))
    x0 = torch.randn((A, batch_size, *input_shape), generator=gen)
    y0 = torch.randn((A, batch_size, num_classes), generator=gen)
    nx = x0[0].numel()
    learn_label = labels is None
    onehot = None if learn_label else F.one_hot(labels, num_classes).float()
    params = {k: v.detach() for k, v in params.items()}

    def objective(x, ylogit, ob, fixed):
        soft = F.softmax(ylogit, -1) if learn_label else fixed

        def loss_p(p):
            out = functional_call(model, p, (x,))
            return -(soft * F.log_softmax(out, -1)).sum(-1).mean()

        return gradient_distance(torch.func.grad(loss_p)(params), ob, "l2")

    fixed = onehot if onehot is not None else torch.zeros(A, batch_size, num_classes)
    vg = vmap(grad_and_value(objective, argnums=(0, 1)))

    def evaluate(z):
        x = z[:, :nx].reshape(x0.shape)
        yl = z[:, nx:].reshape(y0.shape) if learn_label else y0
        (gx, gy), val = vg(x, yl, obs, fixed)
        g = torch.cat([gx.reshape(A, -1), gy.reshape(A, -1)], 1) if learn_label else gx.reshape(A, -1)
        return val, g

    z = torch.cat([x0.reshape(A, -1), y0.reshape(A, -1)], 1) if learn_label else x0.reshape(A, -1)
    history = {"iteration": [], "loss": [], "psnr": []}
    snapshots = []

    def as_images(z_best):
        return z_best[:, :nx].reshape(x0.shape).clamp(0, 1)

    def record(it, best, val, alive):
        psnr = None if x_true is None else (
            lambda: float(np.mean([matched_psnr(a, b).mean() for a, b in zip(as_images(best), x_true)])))
        _log_iteration(history, snapshots, it, float(val[alive].mean()), psnr=psnr, snapshot_every=snapshot_every,
                       snapshot=lambda: as_images(best) if stacked else as_images(best)[0])

    best, _ = lbfgs_fixed_step(evaluate, z, max_iter=max_iter, lr=lr, history_size=history_size, callback=record)
    x = as_images(best)
    rec = labels if labels is not None else best[:, nx:].reshape(y0.shape).argmax(-1)
    if not stacked:
        x, rec = x[0], rec[0]
    return InversionResult(x, rec.clone(), history, snapshots)


def inverting_gradients(model: nn.Module, params: dict, observed: dict, *, input_shape: tuple,
                        labels: torch.Tensor, max_iter: int = 200, lr: float = 0.1,
                        tv_weight: float = 1e-2, signed: bool = True,
                        x_true: torch.Tensor | None = None, snapshot_every: int | None = None,
                        seed: int = 0) -> InversionResult:
    """Inverting Gradients (Geiping et al. 2020, Sec. 4, Eq. 4).

    Minimise ``1 - cos(grad(x', y), observed) + tv_weight * TV(x')`` over ``x' in [0, 1]`` with Adam
    on the sign of the gradient (``signed=True``, as the authors do), the step decayed by 10 at 3/8,
    5/8 and 7/8 of ``max_iter``; ``x'`` is projected back onto the box after each step. The labels
    are assumed known (recover them with :func:`idlg_label`). ``labels``: ``[batch]`` integers.
    """
    batch_size = int(labels.shape[0]) if labels.ndim == 1 else -1
    if labels.ndim != 1 or labels.is_floating_point():
        raise ValueError(f"labels must be an integer vector [batch], got shape {tuple(labels.shape)}")
    _validate_common(input_shape, batch_size, max_iter)
    _check_observed(observed, params)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if tv_weight < 0:
        raise ValueError(f"tv_weight must be >= 0, got {tv_weight}")
    gen = torch.Generator().manual_seed(int(seed))
    x = torch.rand((batch_size, *input_shape), generator=gen).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    milestones = [int(max_iter * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    observed = {k: v.detach() for k, v in observed.items()}
    history = {"iteration": [], "loss": [], "psnr": []}
    snapshots = []
    for it in range(1, int(max_iter) + 1):
        opt.zero_grad()
        g = parameter_gradient(model, params, x, labels, create_graph=True)
        loss = gradient_distance(g, observed, "cosine")
        if tv_weight > 0 and x.ndim == 4:
            loss = loss + tv_weight * total_variation(x)
        loss.backward()
        if signed:
            x.grad.sign_()
        opt.step()
        sched.step()
        with torch.no_grad():
            x.clamp_(0, 1)
        _log_iteration(history, snapshots, it, float(loss.detach()),
                       psnr=None if x_true is None else (lambda: float(np.mean(matched_psnr(x.detach(), x_true)))),
                       snapshot_every=snapshot_every, snapshot=lambda: x.detach().clone())
    return InversionResult(x.detach().clone(), labels.clone(), history, snapshots)


# ------------------------------------------------------------------------------------------------
# the success-rate study
# ------------------------------------------------------------------------------------------------
def client_update_as_gradient(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *,
                              lr: float, local_steps: int = 1) -> dict:
    """What the server sees when a client takes ``local_steps`` full-batch SGD steps on ``(X, y)``
    (FedAvg's ClientUpdate with ``E = local_steps``, ``B = len(X)``), rescaled to a gradient:
    ``(theta_0 - theta_K) / (lr * K)``. With ``local_steps = 1`` this is exactly the gradient, so DLG
    applies unchanged; with more steps it is the average gradient along the local path, which an
    attacker that treats it as one gradient (Wei et al. 2020) mismatches.
    """
    if int(local_steps) < 1:
        raise ValueError(f"local_steps must be >= 1, got {local_steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    new = fl.client_update(model, params, X, y, lr=lr, local_epochs=int(local_steps), batch_size=None)
    return {k: (params[k] - new[k]).detach() / (lr * local_steps) for k in params}


def success_rate(psnrs, threshold: float) -> float:
    """Fraction of images recovered with PSNR at least ``threshold`` dB."""
    p = np.asarray(psnrs, dtype=float).ravel()
    if p.size == 0:
        raise ValueError("psnrs must not be empty")
    return float(np.mean(p >= threshold))


def per_example_gradients(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor) -> dict:
    """The gradient of every example separately, in one ``torch.func.vmap`` call: what ``n`` clients
    holding one example each would send in FedSGD. ``X``: ``[n, *shape]``, ``y``: ``[n]``; returns a
    dict of ``[n, *param_shape]`` tensors."""
    from torch.func import grad, vmap

    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same length, got {X.shape[0]} and {y.shape[0]}")
    params = {k: v.detach() for k, v in params.items()}

    def loss(p, x, t):
        return F.cross_entropy(functional_call(model, p, (x[None],)), t[None])

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, X, y)


def attack_grid(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *, num_classes: int,
                settings: dict, batch_size: int = 1, local_lr: float = 0.01, max_iter: int = 100,
                labels_known: bool = False, seed: int = 0) -> dict:
    """DLG against every client under several settings, all attacks in ONE stacked :func:`dlg` call.

    The images ``X [n, *shape]`` are dealt to ``A = n // batch_size`` clients of ``batch_size``
    images. ``settings`` maps a name to ``{"local_steps": K, "defense": f}`` (both optional): each
    client takes ``K`` full-batch steps with ``local_lr`` and sends :func:`client_update_as_gradient`
    (the plain gradient for ``K = 1``), passed through ``f`` (update dict -> update dict, e.g.
    ``lambda u: gaussian_noise(u, 0.01)``). Returns ``{name: {"psnr": array [A * batch_size],
    "x": reconstructions [A, batch_size, *shape]}}`` with PSNRs matched by :func:`matched_psnr`.
    """
    B = int(batch_size)
    if B < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    A = len(X) // B
    if A < 1:
        raise ValueError(f"X must hold at least batch_size={B} images, got {len(X)}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same length, got {X.shape[0]} and {y.shape[0]}")
    if not settings:
        raise ValueError("settings must name at least one setting")
    Xs, ys = X[:A * B].reshape(A, B, *X.shape[1:]), y[:A * B].reshape(A, B)
    updates = []
    for name, opt in settings.items():
        unknown = set(opt) - {"local_steps", "defense"}
        if unknown:
            raise ValueError(f"settings[{name!r}] has unknown keys {sorted(unknown)}")
        K, defense = int(opt.get("local_steps", 1)), opt.get("defense")
        for a in range(A):
            if K == 1:
                u = parameter_gradient(model, params, Xs[a], ys[a])
            else:
                u = client_update_as_gradient(model, params, Xs[a], ys[a], lr=local_lr, local_steps=K)
            updates.append(defense(u) if defense is not None else u)
    stacked = {k: torch.stack([u[k].detach() for u in updates]) for k in params}
    S = len(settings)
    res = dlg(model, params, stacked, input_shape=tuple(X.shape[1:]), num_classes=num_classes,
              batch_size=B, max_iter=max_iter, labels=ys.repeat(S, 1) if labels_known else None,
              stacked=True, seed=seed)
    out = {}
    for i, name in enumerate(settings):
        xr = res.x[i * A:(i + 1) * A]
        out[name] = {"psnr": np.concatenate([matched_psnr(r, t) for r, t in zip(xr, Xs)]), "x": xr}
    return out

