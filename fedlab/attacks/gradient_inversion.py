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
Its settings come as small frozen objects: :class:`Knowledge` (what the attacker knows about the client
besides its update: the data's shape, the batch size, the labels, a defense's mask or clip bound, the local
steps), :class:`fedlab.attacks.AttackBudget` (the optimiser's budget; the papers' values are
:data:`DLG_BUDGET` and :data:`IG_BUDGET`), :class:`ImagePrior` (Inverting Gradients' prior and start) and
:class:`Trace` (what the history records: PSNR against the true images, snapshots).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .. import fl
from ..fl.local import _model_on, _on
from ..config import device as _device
from ..metrics import matched_psnr, psnr_from_mse
from ..optim import Memory, lbfgs_fixed_step
from .._checks import finite_real, whole_int
from .budget import AttackBudget

__all__ = [
    "AttackBudget",
    "Knowledge",
    "ImagePrior",
    "Trace",
    "DLG_BUDGET",
    "IG_BUDGET",
    "InversionResult",
    "parameter_gradient",
    "gradient_distance",
    "matching_loss",
    "total_variation",
    "idlg_label",
    "dlg",
    "inverting_gradients",
    "client_update_as_gradient",
    "simulated_update",
    "matched_psnr",
    "success_rate",
    "dlg_init_",
    "attack_grid",
    "per_example_gradients",
    "DLG_REFERENCE_STEPS",
    "DLG_REFERENCE_MAX_ITER",
    "reference_evaluations",
    "layer_groups",
    "psnr_baselines",
]

#: Zhu et al.'s reference code (github.com/mit-han-lab/dlg, ``main.py``) calls ``optimizer.step(closure)``
#: 300 times on ``torch.optim.LBFGS`` with its defaults (``lr=1``, ``max_iter=20``, no line search)
DLG_REFERENCE_STEPS = 300
DLG_REFERENCE_MAX_ITER = 20


def reference_evaluations(steps: int = DLG_REFERENCE_STEPS, max_iter: int = DLG_REFERENCE_MAX_ITER) -> int:
    """The budget of DLG's reference code in objective evaluations (closure calls): ``steps`` calls of
    ``torch.optim.LBFGS(max_iter=max_iter).step(closure)`` without line search evaluate the closure once
    at the start of a step and once after each of its first ``max_iter - 1`` moves, so at most
    ``steps * max_iter`` evaluations (6000 for the reference's 300 x 20) and as many L-BFGS iterations;
    a step ends early only when the change of loss or iterate falls below ``1e-9`` or the gradient
    below ``1e-7`` (converged). Raises ``ValueError`` for a non-positive argument."""
    if int(steps) < 1 or int(max_iter) < 1:
        raise ValueError(f"steps and max_iter must be >= 1, got steps={steps}, max_iter={max_iter}")
    return int(steps) * int(max_iter)


#: :func:`dlg`'s budget by default: 100 L-BFGS iterations in one run, with the step and memory of Zhu et al.'s
#: code (``torch.optim.LBFGS``'s defaults: step 1, memory 100). Their code's own loop, 300 calls of 20
#: iterations, is ``AttackBudget(max_iter=DLG_REFERENCE_MAX_ITER, lr=1.0, steps=DLG_REFERENCE_STEPS)``.
DLG_BUDGET = AttackBudget(max_iter=100, lr=1.0)
#: :func:`inverting_gradients`' budget by default: 200 iterations of Adam with Geiping et al.'s step size 0.1
#: (Sec. 4) from one start; the paper's runs are far longer and restart, the chapters pass their own budget.
IG_BUDGET = AttackBudget(max_iter=200, lr=0.1)


@dataclass(frozen=True, eq=False)
class Knowledge:
    """What a gradient-inversion attacker knows about the client besides the update it received (the threat
    model of Geiping et al. 2020, Sec. 5, and of the adaptive attackers of Chapter 7).

    * ``input_shape``: the shape of one input, e.g. ``(1, 8, 8)`` (the architecture tells it); required.
    * ``num_classes``: the number of labels (:func:`dlg` optimises a dummy label over them; required there).
    * ``batch_size``: the images behind the update; ``None`` (default): from ``labels`` when given, else ``1``
      (Zhu et al. 2019 attack batches of 1 to 8).
    * ``labels``: the true labels, integer ``[batch]`` (``[A, batch]`` for a stacked attack), e.g. from
      :func:`idlg_label` (iDLG, Zhao et al. 2020); ``None``: :func:`dlg` optimises them too. Required by
      :func:`inverting_gradients` (Geiping et al. assume them known).
    * ``mask``: shaped like the observation, the coordinates a sparsifying defense (pruning, top-k) sent: the
      attacker matches only those (:func:`dlg`, :func:`inverting_gradients`); ``None`` (default): all.
    * ``clip_norm``: the L2 bound ``C`` the client clipped its update to; :func:`dlg` clips its dummy gradient
      the same way; ``None`` (default): no clipping known.
    * ``local_steps``, ``local_lr``: the client took ``K`` full-batch SGD steps of size ``eta`` and sent
      :func:`client_update_as_gradient`; :func:`dlg` simulates them (Geiping et al. 2020, Sec. 5); default
      ``1`` step (the plain gradient), where ``local_lr`` is not used.

    Raises ``ValueError`` naming the field for an empty or non-positive ``input_shape``, ``num_classes < 2``, a
    ``batch_size`` that is not a positive integer, non-integer ``labels``, a ``mask`` that is not a dict, a
    ``clip_norm`` that is not finite and ``> 0``, or ``local_steps`` / ``local_lr`` as :func:`dlg` rejects them.
    """

    input_shape: tuple
    num_classes: int | None = None
    batch_size: int | None = None
    labels: torch.Tensor | None = None
    mask: dict | None = None
    clip_norm: float | None = None
    local_steps: int = 1
    local_lr: float | None = None

    def __post_init__(self):
        shape = self.input_shape
        if (not isinstance(shape, (tuple, list, torch.Size)) or len(shape) == 0
                or any(isinstance(v, bool) or int(v) != v or int(v) < 1 for v in shape)):
            raise ValueError(f"Knowledge.input_shape must be a non-empty tuple of positive sizes, got {shape!r}")
        object.__setattr__(self, "input_shape", tuple(int(v) for v in shape))
        if self.num_classes is not None:
            object.__setattr__(self, "num_classes", whole_int("Knowledge.num_classes", self.num_classes, low=2))
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", whole_int("Knowledge.batch_size", self.batch_size, low=1))
        if self.labels is not None and (not isinstance(self.labels, torch.Tensor) or self.labels.is_floating_point()):
            raise ValueError(f"Knowledge.labels must be an integer tensor or None, got {type(self.labels).__name__}")
        if self.mask is not None and not isinstance(self.mask, dict):
            raise ValueError(f"Knowledge.mask must be a dict shaped like observed, or None; got {type(self.mask).__name__}")
        c = self.clip_norm
        if c is not None and not (isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 and math.isfinite(c)):
            raise ValueError(f"Knowledge.clip_norm must be a finite number > 0 or None, got {c!r}")
        _check_unroll(self.local_steps, self.local_lr, "Knowledge.")


@dataclass(frozen=True, eq=False)
class ImagePrior:
    """Inverting Gradients' image prior, start and step (Geiping et al. 2020, Sec. 4, Eq. 4; their code
    ``inversefed``), the choices besides the budget.

    * ``tv_weight``: weight of the total-variation prior, ``1e-2`` by default (``0``: none); only for images
      ``[C, H, W]``.
    * ``init``: ``"gaussian"`` (default, ``inversefed``'s ``init='randn'``): ``x' = init_mean + init_std
      N(0, 1)``, the data's normalised coordinates; ``"uniform"``: ``U[0, 1]``.
    * ``init_mean``, ``init_std``: scalars or per-channel ``[C]`` (the statistics a server normalises with),
      default ``0.5`` and ``0.25``.
    * ``signed``: Adam on the sign of the gradient, as the authors do; default ``True``.

    Raises ``ValueError`` naming the field for a ``tv_weight`` not a finite number ``>= 0``, an unknown
    ``init``, an ``init_mean`` or ``init_std`` with a NaN or infinite entry (or that is not numbers), an
    ``init_std`` not ``> 0`` in every entry (Gaussian start; the uniform start draws none).
    """

    tv_weight: float = 1e-2
    init: str = "gaussian"
    init_mean: object = 0.5
    init_std: object = 0.25
    signed: bool = True

    def __post_init__(self):
        finite_real("ImagePrior.tv_weight", self.tv_weight, 0)
        if not isinstance(self.init, str) or self.init not in ("gaussian", "uniform"):
            raise ValueError(f"ImagePrior.init must be 'gaussian' or 'uniform', got {self.init!r}")
        stats = {}
        for name in ("init_mean", "init_std"):
            value = getattr(self, name)
            try:
                t = None if isinstance(value, (bool, str, bytes)) else torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError):
                t = None
            if t is None or t.dtype == torch.bool or t.is_complex() or not bool(t.isfinite().all()):
                raise ValueError(f"ImagePrior.{name} must be a finite number or per-channel numbers, got {value!r}")
            stats[name] = t
        if self.init == "gaussian" and not bool((stats["init_std"] > 0).all()):
            raise ValueError(f"ImagePrior.init_std must be > 0, got {self.init_std}")
        if not isinstance(self.signed, bool):
            raise ValueError(f"ImagePrior.signed must be True or False, got {self.signed!r}")


@dataclass(frozen=True, eq=False)
class Trace:
    """What an attack's history records besides its objective.

    * ``x_true``: the true images ``[batch, *input_shape]`` (``[A, batch, ...]`` stacked): the history then
      has the PSNR (and, for :func:`dlg`, the matched MSE) at every iteration; ``None`` (default): not recorded.
    * ``snapshot_every``: keep the reconstruction at iteration 1 and every ``snapshot_every``-th
      (``result.snapshots``, for figures); ``None`` (default): none.

    Raises ``ValueError`` naming the field for a non-tensor ``x_true`` or a ``snapshot_every`` that is not a
    positive integer.
    """

    x_true: torch.Tensor | None = None
    snapshot_every: int | None = None

    def __post_init__(self):
        if self.x_true is not None and not isinstance(self.x_true, torch.Tensor):
            raise ValueError(f"Trace.x_true must be a tensor or None, got {type(self.x_true).__name__}")
        if self.snapshot_every is not None:
            object.__setattr__(self, "snapshot_every", whole_int("Trace.snapshot_every", self.snapshot_every, low=1))


_NO_TRACE = Trace()


@dataclass
class InversionResult:
    """Output of a gradient-inversion attack.

    ``x``: reconstruction ``[batch, *input_shape]`` clamped to ``[0, 1]``; ``labels``: recovered labels
    ``[batch]``; ``history``: ``{"iteration", "loss", "psnr"}`` lists (``psnr`` only when the true
    images were given); ``snapshots``: list of ``(iteration, x)`` pairs for figures;
    ``evaluations``: objective evaluations the attack made (per attack and restart; see the module
    docstring); ``final_loss``: :func:`dlg` only, the matching loss at each attack's final (unclamped)
    iterate, ``[A]`` float64 array (a float when not stacked), ``None`` for other attacks.
    """

    x: torch.Tensor
    labels: torch.Tensor
    history: dict = field(default_factory=dict)
    snapshots: list = field(default_factory=list)
    evaluations: int = 0
    final_loss: object = None


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


def layer_groups(params: dict) -> dict:
    """``{layer: [parameter names]}``: the parameters grouped by the module that owns them (the name up
    to its last dot, e.g. ``"0.weight"`` and ``"0.bias"`` form layer ``"0"``), in the model's order.
    Raises ``ValueError`` for an empty dict."""
    if not params:
        raise ValueError("params must not be empty")
    groups: dict = {}
    for k in params:
        groups.setdefault(k.rsplit(".", 1)[0] if "." in k else k, []).append(k)
    return groups


def psnr_baselines(x_true: torch.Tensor, data_range: float = 1.0) -> dict:
    """PSNR of two reconstructions that use no gradient at all, the floor every attack must beat:
    ``"grey"``, a flat image of value ``0.5`` (mid-range), and ``"mean colour"``, each image replaced
    by its own mean colour (per channel; an oracle that knows the true image's average).

    ``x_true``: ``[n, C, H, W]`` (or ``[n, ...]``, channel axis 1) in ``[0, data_range]``. Returns
    ``{"grey": array [n], "mean colour": array [n]}`` in dB. Raises ``ValueError`` for fewer than two
    dimensions or a non-positive ``data_range``."""
    from ..metrics import psnr_from_mse

    if x_true.ndim < 2:
        raise ValueError(f"x_true must be [n, C, ...], got shape {tuple(x_true.shape)}")
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    x = x_true.detach().double().reshape(x_true.shape[0], x_true.shape[1], -1)
    grey = ((x - 0.5 * data_range) ** 2).mean((1, 2)).numpy()
    mean = ((x - x.mean(-1, keepdim=True)) ** 2).mean((1, 2)).numpy()
    return {"grey": psnr_from_mse(grey, data_range, min_mse=1e-12),
            "mean colour": psnr_from_mse(mean, data_range, min_mse=1e-12)}


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
    if not bool(torch.isfinite(g).all()):            # argmin of NaN sums is row 0: a label out of nothing
        raise ValueError("observed: the last-layer weight gradient holds NaN or infinite entries")
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


def _reference_lbfgs(value_and_grad, z0: torch.Tensor, *, steps: int, max_iter: int, lr: float,
                     history_size: int, callback=None):
    """``steps`` calls of ``torch.optim.LBFGS(lr=lr, max_iter=max_iter, history_size=history_size)
    .step(closure)`` (no line search, default tolerances ``tolerance_grad=1e-7``,
    ``tolerance_change=1e-9``), emulated for every row of ``z0`` ``[A, n]`` at once, as Zhu et al.'s
    reference code runs it. Every tick evaluates all rows once (one batched call); each row follows
    torch's control flow on its own: a step evaluates at its start and after every move but the
    ``max_iter``-th, and ends early when the gradient is below ``tolerance_grad``, the loss or the
    move changes by less than ``tolerance_change``, or the L-BFGS direction is not a descent direction
    (``g . d > -tolerance_change``; the next step then re-evaluates the same point with the same
    memory, so the row stays there). ``max_eval = 1.25 max_iter`` never binds without line search.

    ``value_and_grad(z [k, n], rows [k]) -> (loss [k], grad [k, n])`` evaluates the rows ``rows``
    (those still running) at ``z``. Returns ``(z [A, n], evaluations [A])``: the final iterates and each
    row's closure calls, at most ``steps * max_iter``. ``callback(tick, z, loss [A], active [A])`` runs
    after every tick (``loss`` is 0 for rows not evaluated)."""
    tol_grad, tol_change = 1e-7, 1e-9
    z = z0.detach().clone()
    A, n = z.shape
    dev = z.device                                        # all state lives where z0 does
    mem = Memory.empty(A, int(history_size), n, dtype=z.dtype, device=dev)
    steps_done = torch.zeros(A, dtype=torch.long, device=dev)
    evals = torch.zeros(A, dtype=torch.long, device=dev)
    inner = torch.zeros(A, dtype=torch.long, device=dev)  # n_iter of the current step
    n_iter = torch.zeros(A, dtype=torch.long, device=dev)  # state["n_iter"], over all steps
    at_start = torch.ones(A, dtype=torch.bool, device=dev)  # the next evaluation opens a step
    d = torch.zeros_like(z)
    t = torch.zeros(A, dtype=z.dtype, device=dev)
    prev_g = torch.zeros_like(z)
    prev_loss = torch.zeros(A, dtype=z.dtype, device=dev)
    last_finite = z.clone()
    tick = 0
    while bool((steps_done < steps).any()):
        active = steps_done < steps
        idx = torch.nonzero(active).flatten()              # rows that finished their steps are not evaluated
        loss_a, g_a = value_and_grad(z[idx], idx)
        loss = torch.zeros(A, dtype=z.dtype, device=dev).index_put((idx,), loss_a.detach().to(z.dtype))
        g = torch.zeros_like(z).index_put((idx,), g_a.detach())
        broken = active & ~(torch.isfinite(loss) & torch.isfinite(g).all(1))
        if bool(broken.any()):                           # non-finite: stop the row at its last finite iterate
            z = torch.where(broken[:, None], last_finite, z)
            steps_done = torch.where(broken, torch.full_like(steps_done, steps), steps_done)
            active = active & ~broken
            loss = torch.where(broken, torch.zeros_like(loss), loss)
            g = torch.where(broken[:, None], torch.zeros_like(g), g)
        last_finite = torch.where(active[:, None], z, last_finite)
        tick += 1
        evals += active.long()
        opt_cond = g.abs().amax(1) <= tol_grad
        # after a move: torch's end-of-iteration tests (the iteration-count test cannot fire here)
        ends = active & ~at_start & (opt_cond | ((d * t[:, None]).abs().amax(1) <= tol_change)
                                     | ((loss - prev_loss).abs() < tol_change))
        ends |= active & at_start & opt_cond             # a step that starts converged returns at once
        iterate = active & ~ends
        # one L-BFGS iteration for the rows that go on
        first = iterate & (n_iter == 0)
        mem.push(d * t[:, None], g - prev_g, iterate & ~first)
        direction = torch.where(first[:, None], -g, mem.direction(g))
        inner = torch.where(iterate, inner + 1, inner)
        n_iter = torch.where(iterate, n_iter + 1, n_iter)
        prev_g = torch.where(iterate[:, None], g, prev_g)
        prev_loss = torch.where(iterate, loss, prev_loss)
        d = torch.where(iterate[:, None], direction, d)
        step1 = torch.clamp(1.0 / g.abs().sum(1).clamp_min(1e-30), max=1.0) * lr
        t = torch.where(iterate, torch.where(first, step1, torch.full_like(t, float(lr))), t)
        descent = (g * d).sum(1) <= -tol_change
        move = iterate & descent
        z = torch.where(move[:, None], z + t[:, None] * d, z)
        ends |= iterate & (~descent | (inner >= max_iter))
        steps_done += ends.long()
        inner = torch.where(ends, torch.zeros_like(inner), inner)
        at_start = torch.where(active, ends, at_start)
        if callback is not None:
            callback(tick, z, loss, active)
    return z, evals.cpu()


def matching_loss(model: nn.Module, params: dict, x: torch.Tensor, labels: torch.Tensor, observed: dict, *,
                  mask: dict | None = None, kind: str = "l2", local_steps: int = 1,
                  local_lr: float | None = None) -> torch.Tensor:
    """The gradient-matching term of an attack's objective at given inputs, for each of ``A`` stacked attacks,
    over the sent coordinates ``m`` (all when ``mask`` is ``None``), ``g = grad(x, labels)``, ``o = observed``:
    ``kind="l2"`` (DLG's, normalised) ``||m * (g - o)||^2 / ||m * o||^2``; ``kind="cosine"`` (Inverting
    Gradients', without its total-variation prior) ``1 - <m * g, m * o> / (||m * g|| ||m * o||)``.

    The check that an attack which "fails" reached its optimum (Carlini et al. 2019): evaluate it at the true
    inputs (the loss at the truth; 0 up to rounding when the observation is an exact gradient and the labels are
    right) and at the reconstruction (the loss reached). A reconstruction far from the truth with a loss near the
    truth's means the observation does not determine the input; a loss far above the truth's means the optimiser
    stopped early, and the attack's score is only a lower bound on what leaks.

    ``x``: ``[A, batch, *input_shape]``; ``labels``: integer ``[A, batch]``; ``observed`` and ``mask`` (0/1 or bool):
    ``{name: [A, *shape]}`` stacked like :func:`dlg`'s ``stacked=True``. ``local_steps`` ``K > 1`` with
    ``local_lr``: ``g`` is the client's rescaled update after ``K`` full-batch steps
    (:func:`client_update_as_gradient`, the unrolled attacker's model; at the truth the loss is then exactly 0).
    Returns a float64 tensor ``[A]``. Raises ``ValueError`` when the leading sizes disagree, a key or shape
    differs, a masked observation is all zero, or ``K > 1`` comes without ``local_lr > 0``.
    """
    obs = _check_observed(observed)
    if set(obs) != set(params) or any(tuple(obs[k].shape[1:]) != tuple(params[k].shape) for k in params):
        raise ValueError("observed must be stacked gradients {name: [A, *shape]} of the model's parameters")
    A = x.shape[0]
    if tuple(labels.shape[:1]) != (A,) or any(v.shape[0] != A for v in obs.values()):
        raise ValueError(f"x, labels and observed must share their leading size A = {A}")
    if kind not in ("l2", "cosine"):
        raise ValueError(f"kind must be 'l2' or 'cosine', got {kind!r}")
    local_steps = _check_unroll(local_steps, local_lr)
    m = _stack_mask(mask, observed, obs, stacked=True)
    out = torch.empty(A, dtype=torch.float64)
    for a in range(A):
        g = (parameter_gradient(model, params, x[a], labels[a]) if local_steps == 1 else
             client_update_as_gradient(model, params, x[a], labels[a], lr=local_lr, local_steps=local_steps))
        diff = dot = gg = oo = 0.0
        for k in obs:
            w = m[k][a].double() if m is not None else 1.0
            gk, ok = w * g[k].detach().double(), w * obs[k][a].double()
            diff, dot = diff + float(((gk - ok) ** 2).sum()), dot + float((gk * ok).sum())
            gg, oo = gg + float((gk ** 2).sum()), oo + float((ok ** 2).sum())
        if oo == 0.0:
            raise ValueError(f"observed (masked) is all zero for attack {a}: no loss to normalise by")
        out[a] = diff / oo if kind == "l2" else 1.0 - dot / math.sqrt(gg * oo) if gg > 0 else 1.0
    return out


def _matched_mse(x: torch.Tensor, x_true: torch.Tensor) -> np.ndarray:
    """Mean squared error per attack ``[A]`` between reconstructions ``x`` and true images ``x_true``
    (both ``[A, B, ...]``), each true image matched to its reconstruction as in :func:`matched_psnr`."""
    if x.shape[1] == 1:
        return ((x.detach().double() - x_true.double()) ** 2).reshape(len(x), -1).mean(1).numpy()
    return np.array([np.mean(10.0 ** (-matched_psnr(a, b) / 10.0)) for a, b in zip(x, x_true)])


def _stack_inputs(observed, params, labels, x_true, stacked):
    """Shared validation of the stacked attacks: ``observed`` as ``{name: [A, *shape]}``, ``labels``
    ``[A, B]`` or ``None``, ``x_true`` ``[A, B, ...]`` or ``None``; returns them with ``A``."""
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
    return obs, labels, x_true, A


def _check_unroll(local_steps, local_lr, prefix: str = "") -> int:
    """``local_steps`` as an int after checking it (an integer >= 1) and, for more than one step, ``local_lr``
    (a finite number > 0); ``ValueError`` naming the argument (after ``prefix``, e.g. ``"Knowledge."``) otherwise."""
    if isinstance(local_steps, bool) or not isinstance(local_steps, (int, np.integer)) or local_steps < 1:
        raise ValueError(f"{prefix}local_steps must be an integer >= 1, got {local_steps!r}")
    if local_steps > 1 and not (isinstance(local_lr, (int, float)) and not isinstance(local_lr, bool)
                                and math.isfinite(local_lr) and local_lr > 0):
        raise ValueError(f"{prefix}local_lr must be a finite number > 0 when local_steps > 1, got {local_lr!r}")
    return int(local_steps)


def simulated_update(loss, params: dict, *, local_steps: int = 1, local_lr: float | None = None) -> dict:
    """The update an attacker simulates on its dummy data: ``grad loss(params)`` for ``local_steps = 1``;
    for ``K > 1`` the client's ``K`` SGD steps ``p <- p - local_lr * grad loss(p)`` from ``params``, rescaled
    like :func:`client_update_as_gradient`: ``(params - p_K) / (local_lr K)`` (Geiping et al. 2020, Sec. 5).

    ``loss``: a function of a parameter dict (the dummy batch's mean loss); differentiable with
    ``torch.func`` end to end (the attack's gradient flows through every step). Returns ``{name: tensor}``."""
    if local_steps == 1:
        return torch.func.grad(loss)(params)
    p = params
    for _ in range(local_steps):
        gk = torch.func.grad(loss)(p)
        p = {k: p[k] - local_lr * gk[k] for k in p}
    return {k: (params[k] - p[k]) / (local_lr * local_steps) for k in params}


def _stack_mask(mask: dict | None, observed: dict, obs: dict, stacked: bool) -> dict | None:
    """The attacker's view of a sparsifying defense (pruning, top-k) as float ``{name: [A, *shape]}`` 0/1
    weights lined up with the stacked observation ``obs`` (``None`` stays ``None``). Raises ``ValueError`` for a
    mask whose keys are not ``observed``'s or whose shapes differ from the observation's."""
    if mask is None:
        return None
    if not isinstance(mask, dict) or set(mask) != set(observed):
        raise ValueError(f"mask must be a dict with the keys of observed {sorted(observed)}")
    mask = {k: (v if stacked else v.unsqueeze(0)).detach().to(torch.float32) for k, v in mask.items()}
    for k, v in mask.items():
        if tuple(v.shape) != tuple(obs[k].shape):
            raise ValueError(f"mask[{k!r}] has shape {tuple(v.shape)}, observed {tuple(obs[k].shape)}")
    return mask


def dlg(model: nn.Module, params: dict, observed: dict, *, knows: Knowledge, budget: AttackBudget = DLG_BUDGET,
        trace: Trace | None = None, stacked: bool = False, seed: int = 0, device=None) -> InversionResult:
    """Deep Leakage from Gradients (Zhu et al. 2019, Algorithm 1).

    ``knows`` (:class:`Knowledge`): ``input_shape`` and ``num_classes`` (required), ``batch_size``, ``labels``,
    ``mask``, ``clip_norm``, ``local_steps`` / ``local_lr``; ``budget`` (:class:`fedlab.attacks.AttackBudget`,
    default :data:`DLG_BUDGET`): ``max_iter``, ``lr``, ``history_size``, ``steps`` (``num_restarts`` must be 1:
    DLG starts once); ``trace`` (:class:`Trace`): ``x_true``, ``snapshot_every``. Below, each field by its name.

    Draw dummy ``x' ~ N(0, 1)`` of shape ``[batch_size, *input_shape]`` and dummy label logits ``y'``;
    run ``max_iter`` L-BFGS iterations (step ``lr``, no line search, memory ``history_size``, as the
    authors' code) on ``||grad(x', softmax(y')) - observed||^2``. With ``labels`` given (e.g. from
    :func:`idlg_label`: that is iDLG) only ``x'`` is optimised.

    **Two loops, budgets in objective evaluations** (``result.evaluations``, counted: one evaluation is
    the dummy gradient, the distance and its gradient, for every attack at once).

    * ``steps=None``: ``max_iter`` L-BFGS iterations in one run, one evaluation each, plus one last
      evaluation that checks the final iterate: ``max_iter + 1`` evaluations.
    * ``steps=S``: the reference code's loop (github.com/mit-han-lab/dlg): ``S`` calls of
      ``torch.optim.LBFGS(lr=lr, max_iter=max_iter).step(closure)``, emulated row by row with torch's
      stopping tests (:func:`_reference_lbfgs`), at most ``S * max_iter`` evaluations
      (:func:`reference_evaluations`; the reference is ``S = 300``, ``max_iter = 20``: 6000).
      ``result.evaluations`` is then an array ``[A]`` (an int when not stacked): each attack's
      closure calls. Where torch's L-BFGS meets a direction that is not a descent direction it ends
      the step without moving, and every later step repeats that, so such an attack stops there;
      the ``steps=None`` loop moves on instead. ``tests/test_gradient_inversion_budget.py`` checks iterates and
      counts against ``torch.optim.LBFGS``.

    ``stacked=True`` runs ``A`` independent attacks at once: every ``observed`` tensor has a leading
    dimension ``A``, ``labels`` (if given) is ``[A, batch_size]``, ``x_true`` is
    ``[A, batch_size, *input_shape]``, and the result's ``x`` is ``[A, batch_size, *input_shape]``.
    Each attack keeps its own L-BFGS memory (the two-loop recursion is batched), so the result equals
    ``A`` separate runs; the gradients of all attacks come from one ``torch.func.vmap`` call.

    History: ``iteration``, ``loss`` (mean over the attacks evaluated), ``layer_mse`` (one array
    ``[A, layers]`` per iteration, NaN for an attack that had finished its steps: mean squared difference between dummy and observed gradient in each layer of
    :func:`layer_groups`, the quantity of Zhu et al. 2019, Fig. 3) and, with ``x_true``, ``psnr`` (mean)
    and ``image_mse`` (array ``[A]``, matched MSE per attack). Returns an :class:`InversionResult`;
    ``x`` is clamped to ``[0, 1]``; ``final_loss`` is the matching loss at each attack's final iterate
    (one more evaluation after the loop, not counted in ``evaluations``). An attack whose objective
    becomes non-finite keeps its last finite iterate.

    ``device`` (default :func:`fedlab.config.device`, i.e. ``FEDLAB_DEVICE``): where the model, the
    gradients and L-BFGS run. The starting points are drawn on the CPU (every device starts from the
    same ones); ``x``, the labels and the history come back on the CPU.

    ``mask`` (optional, shaped like ``observed``, leading ``A`` when stacked): match only the coordinates
    where it is non-zero, ``sum mask * (grad - observed)^2``. This is the attacker who knows a sparsifying
    defense: under pruning or top-k compression the kept coordinates are visible in the update (the others
    are exactly 0), so ``mask = observed != 0`` matches what was sent and ignores what was withheld, where
    the plain objective would pull every withheld coordinate of the dummy gradient to 0. The
    default ``None`` is the plain objective, unchanged.

    ``clip_norm`` (optional, ``C > 0``): the attacker who knows that the client clipped its update to L2 norm
    ``C`` (:func:`fedlab.privacy.clipping.clip_rows`) clips the dummy gradient the same way,
    ``g' min(1, C / ||g'||)``, before matching, so a rescaled observation is matched by a rescaled dummy
    instead of pulling the dummy towards a smaller gradient. ``None``: no clipping (the plain objective).

    ``local_steps`` ``K > 1`` with ``local_lr`` ``eta``: the attacker who knows that the client took ``K``
    full-batch SGD steps of size ``eta`` and sent :func:`client_update_as_gradient` (``(theta_0 - theta_K) /
    (eta K)``) simulates those ``K`` steps on the dummy batch and matches the simulated update instead of one
    dummy gradient (Geiping et al. 2020, Sec. 5, "multiple local steps"); the gradient of the matching loss
    flows through all ``K`` steps. Each evaluation then costs about ``K`` times a plain one. ``K = 1`` (the
    default) is the plain objective, unchanged (``local_lr`` is not used). Raises ``ValueError`` if ``K`` is
    not a positive integer, or ``K > 1`` without a finite ``local_lr > 0``.
    """
    from torch.func import grad_and_value, vmap

    if not isinstance(knows, Knowledge):
        raise ValueError(f"knows must be a Knowledge, got {type(knows).__name__}")
    if not isinstance(budget, AttackBudget) or budget.num_restarts != 1:
        raise ValueError(f"budget must be an AttackBudget with num_restarts=1 (DLG starts once), got {budget!r}")
    trace = _NO_TRACE if trace is None else trace
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a Trace or None, got {type(trace).__name__}")
    if knows.num_classes is None:
        raise ValueError("knows.num_classes must be given: DLG optimises a dummy label over the classes")
    input_shape, num_classes, labels, mask, clip_norm = (knows.input_shape, knows.num_classes, knows.labels,
                                                         knows.mask, knows.clip_norm)
    batch_size = knows.batch_size if knows.batch_size is not None else 1 if labels is None else int(labels.shape[-1])
    max_iter, lr, history_size, steps = budget.max_iter, budget.lr, budget.history_size, budget.steps
    x_true, snapshot_every = trace.x_true, trace.snapshot_every
    local_steps, local_lr = knows.local_steps, knows.local_lr
    obs, labels, x_true, A = _stack_inputs(observed, params, labels, x_true, stacked)
    mask = _stack_mask(mask, observed, obs, stacked)
    local_steps = _check_unroll(local_steps, local_lr)
    if labels is not None and tuple(labels.shape) != (A, batch_size):
        raise ValueError(f"labels must have shape {[A, batch_size] if stacked else [batch_size]}, "
                         f"got {tuple(labels.shape[1:] if not stacked else labels.shape)}")
    dev = _device(device)
    gen = torch.Generator().manual_seed(int(seed))
    x0 = torch.randn((A, batch_size, *input_shape), generator=gen, device="cpu").to(dev)   # drawn on the CPU
    y0 = torch.randn((A, batch_size, num_classes), generator=gen, device="cpu").to(dev)
    nx = x0[0].numel()
    learn_label = labels is None
    onehot = None if learn_label else F.one_hot(labels, num_classes).float().to(dev)
    params = {k: v.detach().to(dev) for k, v in params.items()}
    obs, model = _on(obs, dev), _model_on(model, dev)
    groups = list(layer_groups(params).values())
    sizes = torch.tensor([sum(params[k].numel() for k in g) for g in groups], dtype=torch.float32, device=dev)

    def objective(x, ylogit, ob, fixed, mk=None):
        """The matching loss; ``mk`` (the attacker who knows a sparsifying defense) weights each coordinate,
        ``clip_norm`` (one who knows the clipping bound) clips the dummy gradient first."""
        soft = F.softmax(ylogit, -1) if learn_label else fixed

        def loss_p(p):
            out = functional_call(model, p, (x,))
            return -(soft * F.log_softmax(out, -1)).sum(-1).mean()

        g = simulated_update(loss_p, params, local_steps=local_steps, local_lr=local_lr)
        if clip_norm is not None:
            norm = torch.sqrt(sum((g[k] ** 2).sum() for k in g))
            g = {k: v * torch.clamp(clip_norm / norm, max=1.0) for k, v in g.items()}
        if mk is None:
            terms = {k: ((g[k] - ob[k]) ** 2).sum() for k in ob}   # each term once, for both sums below
        else:
            terms = {k: (mk[k] * (g[k] - ob[k]) ** 2).sum() for k in ob}
        per_layer = torch.stack([sum(terms[k] for k in grp) for grp in groups])
        return sum(terms[k] for k in ob), per_layer.detach()         # = gradient_distance(g, ob, "l2")

    fixed = onehot if onehot is not None else torch.zeros(A, batch_size, num_classes, device=dev)
    vg = vmap(grad_and_value(objective, argnums=(0, 1), has_aux=True))
    mask_dev = None if mask is None else _on(mask, dev)
    last = {"layer_mse": None}
    count = [0]

    def evaluate(z, rows=None):
        """Objective and gradient of the rows ``rows`` (all when ``None``) at ``z [len(rows), n]``."""
        count[0] += 1
        k = A if rows is None else len(rows)
        sel = (lambda t: t) if rows is None else (lambda t: t[rows])
        x = z[:, :nx].reshape(k, *x0.shape[1:])
        yl = z[:, nx:].reshape(k, *y0.shape[1:]) if learn_label else sel(y0)
        extra = () if mask_dev is None else ({kk: sel(v) for kk, v in mask_dev.items()},)
        (gx, gy), (val, per_layer) = vg(x, yl, {kk: sel(v) for kk, v in obs.items()}, sel(fixed), *extra)
        full = np.full((A, len(groups)), np.nan)              # NaN: a row that was not evaluated
        full[slice(None) if rows is None else rows.cpu().numpy()] = (per_layer / sizes).cpu().numpy()
        last["layer_mse"] = full
        g = torch.cat([gx.reshape(k, -1), gy.reshape(k, -1)], 1) if learn_label else gx.reshape(k, -1)
        return val, g

    z = torch.cat([x0.reshape(A, -1), y0.reshape(A, -1)], 1) if learn_label else x0.reshape(A, -1)
    history = {"iteration": [], "loss": [], "psnr": [], "layer_mse": [], "image_mse": []}
    snapshots = []

    def as_images(z_best):
        return z_best[:, :nx].reshape(x0.shape).clamp(0, 1).cpu()

    def record(it, best, val, alive):
        history["layer_mse"].append(last["layer_mse"])
        psnr = None
        if x_true is not None:
            mse = _matched_mse(as_images(best), x_true)
            history["image_mse"].append(mse)
            psnr = (lambda: float(np.mean(psnr_from_mse(mse, min_mse=1e-12))))
        _log_iteration(history, snapshots, it, float(val[alive].mean()), psnr=psnr, snapshot_every=snapshot_every,
                       snapshot=lambda: as_images(best) if stacked else as_images(best)[0])

    if steps is None:
        best, _ = lbfgs_fixed_step(evaluate, z, max_iter=max_iter, lr=lr, history_size=history_size,
                                   callback=record)
        evaluations = count[0]
    else:
        best, ev = _reference_lbfgs(evaluate, z, steps=int(steps), max_iter=int(max_iter), lr=lr,
                                    history_size=history_size, callback=record)
        evaluations = ev.numpy() if stacked else int(ev[0])
    final_loss = evaluate(best)[0].detach().double().cpu().numpy()   # the loss reached (not counted in the budget)
    x = as_images(best)
    rec = labels if labels is not None else best[:, nx:].reshape(y0.shape).argmax(-1).cpu()
    if not stacked:
        x, rec, final_loss = x[0], rec[0], float(final_loss[0])
    return InversionResult(x, rec.clone(), history, snapshots, evaluations=evaluations, final_loss=final_loss)


def inverting_gradients(model: nn.Module, params: dict, observed: dict, *, knows: Knowledge,
                        budget: AttackBudget = IG_BUDGET, prior: ImagePrior = ImagePrior(),
                        trace: Trace | None = None, stacked: bool = False, seed: int = 0,
                        device=None) -> InversionResult:
    """Inverting Gradients (Geiping et al. 2020, Sec. 4, Eq. 4) with the authors' restarts.

    ``knows`` (:class:`Knowledge`): ``input_shape`` and ``labels`` (required), ``mask``; the attack does not
    model clipping or local steps (``clip_norm`` must be ``None``, ``local_steps`` 1), ``batch_size`` is the
    labels'. ``budget`` (:class:`fedlab.attacks.AttackBudget`, default :data:`IG_BUDGET`): ``max_iter``, ``lr``,
    ``num_restarts`` (``steps`` must be ``None``; ``history_size`` is not used). ``prior``
    (:class:`ImagePrior`): ``tv_weight``, ``init``, ``init_mean``, ``init_std``, ``signed``. ``trace``
    (:class:`Trace`): ``x_true``, ``snapshot_every``. Below, each field by its name.

    Minimise ``1 - cos(grad(x', y), observed) + tv_weight * TV(x')`` over ``x' in [0, 1]`` with Adam
    on the sign of the gradient (``signed=True``, as the authors do), the step decayed by 10 at 3/8,
    5/8 and 7/8 of ``max_iter``; ``x'`` is projected back onto the box after each step. The labels
    are assumed known (recover them with :func:`idlg_label`).

    **Initialisation and restarts** as the authors' code (``inversefed``: ``init='randn'``,
    ``restarts``, ``scoring_choice='loss'``): each of ``num_restarts`` trials starts from a Gaussian draw in
    the data's normalised coordinates, ``x' = init_mean + init_std * N(0, 1)`` (``init_mean`` /
    ``init_std``: scalars or per-channel ``[C]``, the data statistics a server uses to normalise; the
    first projection clips it to the box), and the trial with the smallest gradient distance
    ``1 - cos`` (without the prior) at the end is kept. ``init="uniform"`` draws ``U[0, 1]`` instead.
    All trials of all attacks run as one stacked problem: one ``torch.func.vmap`` gradient and one
    elementwise Adam, which equals separate runs.

    ``labels``: ``[batch]`` integers, or ``[A, batch]`` with ``stacked=True`` (then every ``observed``
    tensor has a leading dimension ``A``, ``x_true`` is ``[A, batch, *input_shape]`` and the result's
    ``x`` is ``[A, batch, *input_shape]``). Budget: ``max_iter + 1`` evaluations per trial
    (``result.evaluations``). History ``loss``/``psnr`` are means over attacks and trials.

    ``device`` (default :func:`fedlab.config.device`, i.e. ``FEDLAB_DEVICE``): where the model, the
    gradients and Adam run; the starting points are drawn on the CPU and the result comes back on it.

    ``mask`` (optional, shaped like ``observed``, leading ``A`` when stacked): the attacker who knows a
    sparsifying defense (pruning, top-k) compares only the coordinates that were sent, the cosine of the
    masked dummy gradient ``mask * g'`` and the observation (exactly 0 where the mask is 0), as :func:`dlg`'s
    ``mask``. ``None`` (default): the plain objective, unchanged. Raises ``ValueError`` for a mask
    that is not a dict with ``observed``'s keys and shapes.
    """
    from torch.func import grad_and_value, vmap

    if not isinstance(knows, Knowledge):
        raise ValueError(f"knows must be a Knowledge, got {type(knows).__name__}")
    if knows.clip_norm is not None or knows.local_steps != 1:
        raise ValueError("knows.clip_norm and knows.local_steps are not modelled by inverting_gradients "
                         "(use dlg); leave them None and 1")
    if not isinstance(budget, AttackBudget) or budget.steps is not None:
        raise ValueError(f"budget must be an AttackBudget with steps=None (Adam runs once), got {budget!r}")
    if not isinstance(prior, ImagePrior):
        raise ValueError(f"prior must be an ImagePrior, got {type(prior).__name__}")
    trace = _NO_TRACE if trace is None else trace
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a Trace or None, got {type(trace).__name__}")
    input_shape, labels, mask = knows.input_shape, knows.labels, knows.mask
    max_iter, lr, num_restarts = budget.max_iter, budget.lr, budget.num_restarts
    tv_weight, signed, init, init_mean, init_std = (prior.tv_weight, prior.signed, prior.init, prior.init_mean,
                                                    prior.init_std)
    x_true, snapshot_every = trace.x_true, trace.snapshot_every
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.ndim != (2 if stacked else 1):
        raise ValueError(f"labels must be an integer tensor [{'A, ' if stacked else ''}batch], got "
                         f"{getattr(labels, 'shape', labels)}")
    batch_size = int(labels.shape[-1])
    if knows.batch_size is not None and knows.batch_size != batch_size:
        raise ValueError(f"knows.batch_size ({knows.batch_size}) differs from the labels' batch ({batch_size})")
    obs, labels, x_true, A = _stack_inputs(observed, params, labels, x_true, stacked)
    if labels.shape[0] != A:
        raise ValueError(f"labels must hold one row per attack ({A}), got {labels.shape[0]}")
    mask = _stack_mask(mask, observed, obs, stacked)
    R = int(num_restarts)
    gen = torch.Generator().manual_seed(int(seed))
    shape = (A * R, batch_size, *input_shape)
    if init == "gaussian":
        m = torch.as_tensor(init_mean, dtype=torch.float32, device="cpu")
        sd = torch.as_tensor(init_std, dtype=torch.float32, device="cpu")
        if m.ndim == 1:
            m = m.reshape(-1, *([1] * (len(input_shape) - 1)))
        if sd.ndim == 1:
            sd = sd.reshape(-1, *([1] * (len(input_shape) - 1)))
        x = m + sd * torch.randn(shape, generator=gen, device="cpu")
    else:
        x = torch.rand(shape, generator=gen, device="cpu")
    dev = _device(device)
    x = x.to(dev).requires_grad_(True)                               # drawn on the CPU
    row = torch.arange(A, device="cpu").repeat_interleave(R)         # trial r of attack a is row a * R + r
    obs_r = {k: v[row].to(dev) for k, v in obs.items()}
    labels_r = labels[row].to(dev)
    extra = () if mask is None else ({k: v[row].to(dev) for k, v in mask.items()},)
    params = {k: v.detach().to(dev) for k, v in params.items()}
    model = _model_on(model, dev)
    use_tv = tv_weight > 0 and len(input_shape) == 3

    def objective(xi, ob, yi, mi=None):
        def loss_p(p):
            return F.cross_entropy(functional_call(model, p, (xi,)), yi)

        g = torch.func.grad(loss_p)(params)
        if mi is not None:                                   # the attacker who knows the mask: only what was sent
            g = {k: v * mi[k] for k, v in g.items()}
        dist = gradient_distance(g, ob, "cosine")
        total = dist + tv_weight * total_variation(xi) if use_tv else dist
        return total, dist.detach()

    vg = vmap(grad_and_value(objective, has_aux=True))
    opt = torch.optim.Adam([x], lr=lr)
    milestones = [int(max_iter * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    history = {"iteration": [], "loss": [], "psnr": []}
    snapshots = []
    xt_r = None if x_true is None else x_true[row]
    for it in range(1, int(max_iter) + 1):
        gx, (loss, _) = vg(x.detach(), obs_r, labels_r, *extra)
        x.grad = gx.sign() if signed else gx
        opt.step()
        sched.step()
        with torch.no_grad():
            x.clamp_(0, 1)
        _log_iteration(history, snapshots, it, float(loss.mean()),
                       psnr=None if xt_r is None else (lambda: float(np.mean(
                           [matched_psnr(a, b).mean() for a, b in zip(x.detach().cpu(), xt_r)]))),
                       snapshot_every=snapshot_every, snapshot=lambda: x.detach().cpu().clone())
    _, (_, score) = vg(x.detach(), obs_r, labels_r, *extra)         # keep the trial of least gradient loss
    score = score.cpu()
    best = score.reshape(A, R).argmin(1)
    x_best = x.detach().cpu().reshape(A, R, batch_size, *input_shape)[torch.arange(A, device="cpu"), best].clone()
    history["restart_loss"] = score.reshape(A, R).numpy()
    history["chosen"] = best.numpy()
    out_x, out_y = (x_best, labels.clone()) if stacked else (x_best[0], labels[0].clone())
    return InversionResult(out_x, out_y, history, snapshots, evaluations=int(max_iter) + 1)


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
    new = fl.client_update(model, params, X, y,
                           local=fl.LocalTraining(lr=lr, local_epochs=int(local_steps), batch_size=None))
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
                settings: dict, batch_size: int = 1, local_lr: float = 0.01,
                budget: AttackBudget = DLG_BUDGET, seed: int = 0) -> dict:
    """DLG against every client under several settings, all attacks in ONE stacked :func:`dlg` call.

    The images ``X [n, *shape]`` are dealt to ``A = n // batch_size`` clients of ``batch_size``
    images. ``settings`` maps a name to ``{"local_steps": K, "defense": f}`` (both optional): each
    client takes ``K`` full-batch steps with ``local_lr`` and sends :func:`client_update_as_gradient`
    (the plain gradient for ``K = 1``), passed through ``f`` (update dict -> update dict, e.g.
    ``lambda u: gaussian_noise(u, 0.01)``). Returns ``{name: {"psnr": array [A * batch_size],
    "x": reconstructions [A, batch_size, *shape]}}`` with PSNRs matched by :func:`matched_psnr`.
    ``budget`` (:class:`fedlab.attacks.AttackBudget`, default :data:`DLG_BUDGET`) is passed to :func:`dlg`
    (``steps``: the reference's loop of ``steps`` calls of L-BFGS with ``max_iter`` iterations each).

    What the attacker knows, per setting (each ``False`` by default; the settings that share the same
    knowledge, and with ``"knows_local_steps"`` the same ``K``, run as one stacked :func:`dlg` call, and no
    setting's result depends on the others'):

    * ``"knows_local_steps": True``: it knows ``K`` and ``local_lr`` and simulates the ``K`` local steps
      (:func:`dlg` with ``Knowledge(local_steps=K)``; Geiping et al. 2020, Sec. 5); otherwise the update is
      matched as if it were one gradient (Wei et al. 2020).
    * ``"knows_mask": True``: it knows that the defense withholds coordinates (pruning, top-k) and matches only
      those the update carries, ``mask = update != 0`` (:class:`Knowledge`'s ``mask``); otherwise it does not
      model the ``defense``.
    * ``"knows_labels": True``: it is given the true labels (:class:`Knowledge`'s ``labels``, as iDLG finds
      them); otherwise DLG optimises them.

    ``"final_loss"`` is each attack's matching loss reached (masked where the mask is known); at the truth that
    loss is 0. Raises ``ValueError`` for an unknown key or a flag that is not ``True`` or ``False``.
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
    flags = ("knows_mask", "knows_labels", "knows_local_steps")
    for name, opt in settings.items():
        unknown = set(opt) - {"local_steps", "defense", *flags}
        if unknown:
            raise ValueError(f"settings[{name!r}] has unknown keys {sorted(unknown)}")
        K, defense = int(opt.get("local_steps", 1)), opt.get("defense")
        for a in range(A):
            if K == 1:
                u = parameter_gradient(model, params, Xs[a], ys[a])
            else:
                u = client_update_as_gradient(model, params, Xs[a], ys[a], lr=local_lr, local_steps=K)
            updates.append(defense(u) if defense is not None else u)
    names = list(settings)
    Ks = [int(settings[n].get("local_steps", 1)) for n in names]
    for n in names:
        for f in flags:
            if not isinstance(settings[n].get(f, False), bool):
                raise ValueError(f"settings[{n!r}][{f!r}] must be True or False")
    knows = [settings[n].get("knows_mask", False) for n in names]
    labels_known = [settings[n].get("knows_labels", False) for n in names]
    unroll = [settings[n].get("knows_local_steps", False) for n in names]
    keys = [(Ks[i] if unroll[i] else 1, knows[i], labels_known[i], unroll[i]) for i in range(len(names))]
    groups = [[i for i, key in enumerate(keys) if key == g] for g in dict.fromkeys(keys)]
    out = {}
    for grp in groups:
        i0 = grp[0]
        rows = [i * A + a for i in grp for a in range(A)]
        stacked = {k: torch.stack([updates[r][k].detach() for r in rows]) for k in params}
        mask = {k: v != 0 for k, v in stacked.items()} if knows[i0] else None
        known = Knowledge(input_shape=tuple(X.shape[1:]), num_classes=num_classes, batch_size=B,
                          labels=ys.repeat(len(grp), 1) if labels_known[i0] else None, mask=mask,
                          local_steps=Ks[i0] if unroll[i0] else 1, local_lr=local_lr if unroll[i0] else None)
        res = dlg(model, params, stacked, knows=known, budget=budget, stacked=True, seed=seed)
        for j, i in enumerate(grp):
            xr = res.x[j * A:(j + 1) * A]
            out[names[i]] = {"psnr": np.concatenate([matched_psnr(r, t) for r, t in zip(xr, Xs)]), "x": xr,
                             "final_loss": np.asarray(res.final_loss[j * A:(j + 1) * A])}
    return {n: out[n] for n in names}

