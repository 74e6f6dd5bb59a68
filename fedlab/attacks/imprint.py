"""The imprint module of "Robbing the Fed" (Fowl, Geiping, Czaja, Goldblum and Goldstein, ICLR 2022,
Sec. 3): a malicious server changes the *model*, not the protocol, and reads single training inputs
out of a gradient -- even out of the sum of many clients' gradients that secure aggregation releases.

The server puts in front of the model a linear layer with ``k`` units ("bins") followed by a ReLU.
Every row of its weight is the same measurement direction ``w`` and the biases are ``-c_1 > ... > -c_k``
for cut-offs ``c_1 < ... < c_k`` at quantiles of the distribution of ``h(x) = w . x`` over plausible
data. Unit ``i`` is active exactly for the inputs with ``h(x) > c_i``. When every unit sends the same
backward signal ``g_x`` to its pre-activation (the layer after the ReLU has equal columns), the gradient
of the loss with respect to row ``i`` of the weight and to bias ``i`` are

    dL/dW_i = sum_{x: h(x) > c_i} g_x x,        dL/db_i = sum_{x: h(x) > c_i} g_x,

so consecutive differences isolate the inputs whose measurement falls in ``(c_i, c_{i+1}]``:

    (dW_i - dW_{i+1}) / (db_i - db_{i+1}) = x     when exactly one input lies in bin i

(the last bin, ``(c_k, inf)``, is ``dW_k / db_k``). Sums over a batch, and over clients, keep this form,
which is why secure aggregation does not hide the inputs.

* :func:`imprint_layer` -- the weight ``[k, dim]`` and bias ``[k]`` of the imprint layer.
* :func:`imprint_model` / :class:`ImprintedModel` -- imprint linear + ReLU + a linear map back to the
  input (added to the input) + the base model; an honest client trains it like any model.
* :func:`recover_from_imprint` -- inputs from the gradient of the imprint layer.
* :class:`ImprintTrap` -- the server's settings of the trap: bins, its model of ``h(x)``, the direction.
* :func:`imprint_attack` -- gradient of the imprinted model on one batch or the sum over several
  clients' batches (secure aggregation), recovery, and matching against the true inputs.
* :func:`imprint_recovery_grid` -- recovery rate over batch sizes and numbers of bins.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._checks import positive_int

__all__ = [
    "imprint_layer",
    "ImprintedModel",
    "imprint_model",
    "ImprintRecovery",
    "recover_from_imprint",
    "ImprintAttackResult",
    "ImprintTrap",
    "match_recovered",
    "imprint_attack",
    "imprint_recovery_grid",
    "expected_recovery_rate",
]


# ------------------------------------------------------------------------------------------------
# the malicious layer
# ------------------------------------------------------------------------------------------------
def _direction(dim: int, direction, seed: int) -> torch.Tensor:
    """The measurement direction ``w`` as a float64 vector ``[dim]``."""
    if direction is None or (isinstance(direction, str) and direction == "mean"):
        return torch.full((dim,), 1.0 / dim, dtype=torch.float64)
    if isinstance(direction, str):
        if direction != "random":
            raise ValueError(f"direction must be None, 'mean', 'random' or a tensor of shape [{dim}], "
                             f"got {direction!r}")
        gen = torch.Generator().manual_seed(int(seed))
        w = torch.randn(dim, generator=gen, dtype=torch.float64)
        return w / w.norm()
    w = torch.as_tensor(direction, dtype=torch.float64)
    if w.shape != (dim,) or not torch.isfinite(w).all() or not (w != 0).any():
        raise ValueError(f"direction must be a finite non-zero vector of shape [{dim}], got shape "
                         f"{tuple(w.shape)}")
    return w.clone()


def imprint_layer(dim: int, num_bins: int, *, mean: float | None = None, std: float | None = None,
                  reference: torch.Tensor | None = None, direction=None, seed: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight ``[num_bins, dim]`` and bias ``[num_bins]`` (float64) of the imprint layer of Fowl et al.
    (2022, Sec. 3).

    Every row of the weight is the measurement direction ``w``: ``None`` or ``"mean"`` gives the mean of
    the pixels (``w = 1/dim``), ``"random"`` a unit Gaussian direction drawn with ``seed``, or a tensor
    ``[dim]``. The bias of unit ``i`` is ``-c_i`` with cut-offs ``c_1 < ... < c_k`` that split the
    distribution of ``h(x) = w . x`` into ``k + 1`` equally likely intervals, ``c_i`` its quantile of order
    ``i / (k + 1)``; inputs below ``c_1`` activate no unit and are never recovered. The server's estimate
    of that distribution is either ``N(mean, std^2)`` (``mean`` and ``std`` of ``h(x)``, e.g. from
    published statistics) or the empirical distribution of ``h`` over public data ``reference``
    ``[n, dim]``; give one of the two.
    """
    dim = positive_int("dim", dim)
    num_bins = positive_int("num_bins", num_bins)
    w = _direction(dim, direction, seed)
    probs = np.arange(1, num_bins + 1) / (num_bins + 1)
    if reference is not None:
        if mean is not None or std is not None:
            raise ValueError("give either mean and std or reference, not both")
        R = torch.as_tensor(reference, dtype=torch.float64)
        if R.ndim != 2 or R.shape[1] != dim or R.shape[0] < 2 or not torch.isfinite(R).all():
            raise ValueError(f"reference must be a finite tensor [n >= 2, {dim}], got shape {tuple(R.shape)}")
        h = (R @ w).numpy()
        cuts = np.quantile(h, probs)
        if not np.all(np.diff(cuts) > 0):
            raise ValueError("reference gives tied quantiles of h(x); use fewer bins or more public data")
    else:
        if mean is None or std is None:
            raise ValueError("mean and std (of h(x) = w . x) are required when reference is not given")
        if not np.isfinite(float(mean)):
            raise ValueError(f"mean must be finite, got {mean!r}")
        if not (np.isfinite(float(std)) and float(std) > 0):
            raise ValueError(f"std must be finite and > 0, got {std!r}")
        nd = NormalDist(float(mean), float(std))
        cuts = np.array([nd.inv_cdf(float(p)) for p in probs])
    weight = w.expand(num_bins, dim).clone()
    bias = -torch.as_tensor(cuts, dtype=torch.float64)
    return weight, bias


class ImprintedModel(nn.Module):
    """``base(x + back(relu(imprint(x))))`` on flattened inputs ``[batch, dim]`` (Fowl et al. 2022,
    Sec. 3). ``imprint``: ``Linear(dim, k)`` set by :func:`imprint_layer`; ``back``: ``Linear(k, dim)``
    whose columns are all equal (``1 / k``, bias 0), so every bin receives the same backward signal
    and the recovery of :func:`recover_from_imprint` is exact; the residual keeps the base model's view
    of the input close to the input, so the model still trains. Inputs of another shape are flattened
    and reshaped back before ``base``."""

    def __init__(self, base: nn.Module, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        k, dim = weight.shape
        self.imprint = nn.Linear(dim, k)
        self.back = nn.Linear(k, dim)
        self.base = base
        with torch.no_grad():
            self.imprint.weight.copy_(weight)
            self.imprint.bias.copy_(bias)
            self.back.weight.fill_(1.0 / k)
            self.back.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        z = flat + self.back(F.relu(self.imprint(flat)))
        return self.base(z.reshape(x.shape))


def imprint_model(base: nn.Module, dim: int, num_bins: int, *, mean: float | None = None,
                  std: float | None = None, reference: torch.Tensor | None = None, direction=None,
                  seed: int = 0) -> ImprintedModel:
    """The malicious model the server sends: the imprint layer of :func:`imprint_layer` (same
    arguments), a ReLU and a linear map back to ``dim`` added to the input, then ``base`` (which takes
    ``[batch, dim]``). Its parameters ``imprint.weight`` ``[k, dim]`` and ``imprint.bias`` ``[k]`` are
    the ones whose gradient :func:`recover_from_imprint` reads. Parameters are float32 like ``base``'s
    defaults; call ``.double()`` for float64."""
    if not isinstance(base, nn.Module):
        raise ValueError(f"base must be an nn.Module, got {type(base).__name__}")
    weight, bias = imprint_layer(dim, num_bins, mean=mean, std=std, reference=reference,
                                 direction=direction, seed=seed)
    return ImprintedModel(base, weight.float(), bias.float())


# ------------------------------------------------------------------------------------------------
# recovery
# ------------------------------------------------------------------------------------------------
@dataclass
class ImprintRecovery:
    """Output of :func:`recover_from_imprint`.

    ``x``: recovered inputs ``[m, dim]``, one per occupied bin, in bin order; ``bins``: their bin
    indices ``[m]``; ``occupied``: ``[k]`` bool, bins whose bias-gradient difference is non-zero (at
    least one input there); ``consistent``: ``[k]`` bool, occupied bins whose recovered vector ``x`` has
    its measurement ``w . x`` inside the bin (a necessary condition for a single input; a mixture of
    two inputs with backward signals of opposite sign fails it, one with equal signs passes it, so the
    gradient alone cannot certify that a bin held exactly one input); ``edges``: the cut-offs ``c``
    ``[k]``.
    """

    x: torch.Tensor
    bins: torch.Tensor
    occupied: torch.Tensor
    consistent: torch.Tensor
    edges: torch.Tensor


def recover_from_imprint(grad_weight: torch.Tensor, grad_bias: torch.Tensor, *,
                         weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                         rtol: float | None = None) -> ImprintRecovery:
    """Inputs from the gradient of an imprint layer (Fowl et al. 2022, Sec. 3).

    ``grad_weight``: ``[k, dim]`` gradient (or a multiple of it, e.g. an SGD update, or a sum over
    clients) with respect to the imprint weight; ``grad_bias``: ``[k]`` with respect to its bias, rows in
    the order of increasing cut-off (as :func:`imprint_layer` makes them). Bin ``i < k`` is recovered as
    ``(dW_i - dW_{i+1}) / (db_i - db_{i+1})``, the last as ``dW_k / db_k``. A bin is occupied when
    ``|db_i - db_{i+1}|`` exceeds ``rtol`` times ``max |db|`` (default ``1000 * eps`` of the dtype), so
    empty bins (a zero difference up to rounding) yield no vector; for an update ``theta_0 - theta_1``
    instead of a gradient, the rounding of the parameters leaves about ``eps |theta|`` in empty bins,
    so raise ``rtol`` (e.g. ``1e-8`` in float64). ``weight`` and ``bias`` (the layer's
    own parameters) are optional and only used for :attr:`ImprintRecovery.consistent` and ``edges``.
    """
    gW = torch.as_tensor(grad_weight)
    gb = torch.as_tensor(grad_bias)
    if gW.ndim != 2 or gW.shape[0] < 1 or gW.shape[1] < 1 or not gW.is_floating_point():
        raise ValueError(f"grad_weight must be a floating tensor [k, dim], got shape {tuple(gW.shape)}")
    if gb.shape != (gW.shape[0],) or not gb.is_floating_point():
        raise ValueError(f"grad_bias must be a floating tensor [k] with k = {gW.shape[0]} (rows of "
                         f"grad_weight), got shape {tuple(gb.shape)}")
    if not torch.isfinite(gW).all():
        raise ValueError("grad_weight must be finite")
    if not torch.isfinite(gb).all():
        raise ValueError("grad_bias must be finite")
    if rtol is None:
        rtol = 1000 * torch.finfo(gb.dtype).eps
    elif not (np.isfinite(float(rtol)) and float(rtol) >= 0):
        raise ValueError(f"rtol must be finite and >= 0, got {rtol!r}")
    k = gW.shape[0]
    zero_row = torch.zeros(1, gW.shape[1], dtype=gW.dtype)
    dW = gW - torch.cat([gW[1:], zero_row])
    db = gb - torch.cat([gb[1:], torch.zeros(1, dtype=gb.dtype)])
    scale = gb.abs().max()
    occupied = db.abs() > rtol * scale if scale > 0 else torch.zeros(k, dtype=torch.bool)
    bins = torch.nonzero(occupied).flatten()
    x = dW[bins] / db[bins, None].to(dW.dtype)
    edges = torch.full((k,), float("nan"), dtype=torch.float64)
    consistent = occupied.clone()
    if weight is not None or bias is not None:
        if weight is None or bias is None:
            raise ValueError("give both weight and bias of the imprint layer, or neither")
        Wt = torch.as_tensor(weight, dtype=torch.float64)
        bt = torch.as_tensor(bias, dtype=torch.float64)
        if Wt.shape != gW.shape:
            raise ValueError(f"weight must have the shape of grad_weight {tuple(gW.shape)}, got {tuple(Wt.shape)}")
        if bt.shape != (k,):
            raise ValueError(f"bias must have shape [{k}], got {tuple(bt.shape)}")
        edges = -bt
        if k > 1 and not (edges[1:] > edges[:-1]).all():
            raise ValueError("bias must be strictly decreasing (cut-offs -bias increasing)")
        h = (x.to(torch.float64) * Wt[bins]).sum(1)
        lo = edges[bins]
        hi = torch.cat([edges[1:], torch.tensor([float("inf")], dtype=torch.float64)])[bins]
        tol = 1e-6 * (edges.abs().max() + 1.0)
        ok = (h > lo - tol) & (h <= hi + tol)
        consistent = torch.zeros(k, dtype=torch.bool)
        consistent[bins] = ok
    return ImprintRecovery(x=x, bins=bins, occupied=occupied, consistent=consistent, edges=edges)


# ------------------------------------------------------------------------------------------------
# the attack end to end
# ------------------------------------------------------------------------------------------------
@dataclass
class ImprintAttackResult:
    """Output of :func:`imprint_attack`.

    ``rate``: share of the true inputs recovered with relative error ``< tol``; ``recovered``: ``[n]``
    bool per true input (all clients' inputs concatenated); ``error``: ``[n]`` relative error of the
    nearest recovered vector (``inf`` when nothing was recovered); ``x``: recovered vectors ``[m, dim]``;
    ``recovery``: the :class:`ImprintRecovery`; ``counts``: ``[k]`` number of true inputs per bin
    (ground truth the attacker does not have); ``unique``: ``[k]`` bool, ``counts == 1``.
    """

    rate: float
    recovered: torch.Tensor
    error: torch.Tensor
    x: torch.Tensor
    recovery: ImprintRecovery
    counts: torch.Tensor
    unique: torch.Tensor


def match_recovered(X: torch.Tensor, X_hat: torch.Tensor) -> torch.Tensor:
    """For every true input ``X`` ``[n, dim]``, the relative error ``||x_hat - x|| / ||x||`` of the
    nearest recovered vector in ``X_hat`` ``[m, dim]`` (``inf`` when ``m = 0``; an all-zero ``x`` uses the
    absolute error). Returns ``[n]`` float64."""
    X = torch.as_tensor(X, dtype=torch.float64)
    X_hat = torch.as_tensor(X_hat, dtype=torch.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be [n, dim], got shape {tuple(X.shape)}")
    if X_hat.ndim != 2 or (X_hat.shape[0] and X_hat.shape[1] != X.shape[1]):
        raise ValueError(f"X_hat must be [m, {X.shape[1]}], got shape {tuple(X_hat.shape)}")
    if X_hat.shape[0] == 0:
        return torch.full((X.shape[0],), float("inf"), dtype=torch.float64)
    dist = torch.cdist(X, X_hat).min(1).values
    norm = X.norm(dim=1)
    return torch.where(norm > 0, dist / norm.clamp_min(1e-300), dist)


def _loss_mean_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)


def _finite(v) -> bool:
    """Whether ``v`` converts to a finite float (a number, a NumPy or a 0-d torch scalar)."""
    try:
        return not isinstance(v, (bool, str)) and bool(np.isfinite(float(v)))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, eq=False)
class ImprintTrap:
    """The malicious server's imprint layer (Fowl et al. 2022, Sec. 3), as :func:`imprint_layer` builds it.

    * ``num_bins``: the ``k`` units (bins) of the layer; required (more bins than inputs leave most inputs
      alone in their bin, :func:`expected_recovery_rate`).
    * ``mean``, ``std``: the server's ``N(mean, std^2)`` model of ``h(x) = w . x`` (e.g. published data
      statistics), whose quantiles of order ``i / (k + 1)`` are the cut-offs; ``None`` (default).
    * ``reference``: public data ``[n, dim]`` whose empirical distribution of ``h`` gives the cut-offs instead;
      ``None`` (default). Give ``mean`` and ``std``, or ``reference``; with neither, :func:`imprint_attack`
      fits ``N(mean, std^2)`` to the attacked inputs themselves (a server that knows the data's statistics).
    * ``direction``: the measurement ``w``: ``None`` or ``"mean"`` (default: the mean of the pixels,
      ``w = 1/dim``), ``"random"`` (a unit Gaussian direction drawn with the attack's seed) or a tensor ``[dim]``.

    Raises ``ValueError`` naming the field for a ``num_bins`` that is not a positive integer, a ``std`` that is
    not finite and ``> 0``, a non-finite ``mean``, only one of ``mean`` and ``std``, both those and
    ``reference``, or an unknown ``direction`` string.
    """

    num_bins: int
    mean: float | None = None
    std: float | None = None
    reference: torch.Tensor | None = None
    direction: object = None

    def __post_init__(self):
        object.__setattr__(self, "num_bins", positive_int("ImprintTrap.num_bins", self.num_bins))
        if (self.mean is None) != (self.std is None):
            raise ValueError("ImprintTrap.mean and ImprintTrap.std go together: give both or neither")
        if self.mean is not None:
            if self.reference is not None:
                raise ValueError("ImprintTrap: give either mean and std or reference, not both")
            if not _finite(self.mean):
                raise ValueError(f"ImprintTrap.mean must be finite, got {self.mean!r}")
            if not (_finite(self.std) and float(self.std) > 0):
                raise ValueError(f"ImprintTrap.std must be finite and > 0, got {self.std!r}")
        if isinstance(self.direction, str) and self.direction not in ("mean", "random"):
            raise ValueError(f"ImprintTrap.direction must be None, 'mean', 'random' or a tensor, got {self.direction!r}")


def imprint_attack(X, y=None, *, trap: ImprintTrap, model: ImprintedModel | None = None,
                   num_classes: int = 10, loss_fn=None, dtype=torch.float64, tol: float = 1e-4,
                   seed: int = 0) -> ImprintAttackResult:
    """Robbing the Fed (Fowl et al. 2022, Sec. 3) end to end.

    ``trap`` (:class:`ImprintTrap`): the imprint layer's ``num_bins``, the server's model of ``h(x)``
    (``mean``/``std`` or ``reference``) and the ``direction``; with ``model`` given, only ``trap.num_bins``
    is used (to check the model's imprint layer). Below, each field by its name.

    ``X``: one client's batch ``[B, dim]`` or a list of clients' batches ``[B_c, dim]``; ``y``: integer
    labels ``[B]`` (or a list matching ``X``; ``None`` draws random labels in ``range(num_classes)``).
    Each client computes the real autograd gradient of ``loss_fn(model(X_c), y_c)`` (default: mean
    cross-entropy) of the imprinted ``model`` (default: :func:`imprint_model` on a linear classifier
    ``Linear(dim, num_classes)``, with the distribution of ``h(x)`` from ``mean``/``std`` or ``reference``;
    when none is given, the Gaussian fit of ``h`` over all inputs, i.e. a server that knows the data's
    statistics); the server sees only the *sum* over clients (secure aggregation), recovers with
    :func:`recover_from_imprint` and each true input counts as recovered when some recovered vector is
    within relative error ``tol``. Computations run in ``dtype``.
    """
    Xs = list(X) if isinstance(X, (list, tuple)) else [X]
    if not Xs:
        raise ValueError("X must hold at least one client's batch")
    Xs = [torch.as_tensor(x) for x in Xs]
    for x in Xs:
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1 or not torch.isfinite(x.to(torch.float64)).all():
            raise ValueError(f"X must be finite batches of shape [B, dim], got shape {tuple(x.shape)}")
    dim = Xs[0].shape[1]
    if any(x.shape[1] != dim for x in Xs):
        raise ValueError("X: every client's batch must have the same dim")
    if not isinstance(trap, ImprintTrap):
        raise ValueError(f"trap must be an ImprintTrap, got {type(trap).__name__}")
    num_bins, mean, std, reference, direction = trap.num_bins, trap.mean, trap.std, trap.reference, trap.direction
    num_classes = positive_int("num_classes", num_classes)
    if not (np.isfinite(float(tol)) and float(tol) > 0):
        raise ValueError(f"tol must be finite and > 0, got {tol!r}")
    gen = torch.Generator().manual_seed(int(seed))
    if y is None:
        ys = [torch.randint(num_classes, (x.shape[0],), generator=gen) for x in Xs]
    else:
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        ys = [torch.as_tensor(t) for t in ys]
        if len(ys) != len(Xs) or any(t.shape[:1] != x.shape[:1] for t, x in zip(ys, Xs)):
            raise ValueError("y must match X: one label tensor [B_c] per client batch")
    if model is None:
        if mean is None and std is None and reference is None:
            w = _direction(dim, direction, seed)
            h = torch.cat(Xs).to(torch.float64) @ w
            mean, std = float(h.mean()), float(h.std()) if h.numel() > 1 else 1.0
            std = std if std > 0 else 1.0
        base = nn.Linear(dim, num_classes)
        with torch.no_grad():
            base.weight.copy_(torch.randn(num_classes, dim, generator=gen) / dim ** 0.5)
            base.bias.zero_()
        model = imprint_model(base, dim, num_bins, mean=mean, std=std, reference=reference,
                              direction=direction, seed=seed)
    elif not isinstance(model, ImprintedModel):
        raise ValueError(f"model must be an ImprintedModel, got {type(model).__name__}")
    elif model.imprint.weight.shape != (num_bins, dim):
        raise ValueError(f"model's imprint layer is {tuple(model.imprint.weight.shape)}, expected "
                         f"num_bins x dim = ({num_bins}, {dim})")
    model = model.to(dtype)
    loss_fn = _loss_mean_ce if loss_fn is None else loss_fn
    params = [model.imprint.weight, model.imprint.bias]
    gW = torch.zeros_like(model.imprint.weight)
    gb = torch.zeros_like(model.imprint.bias)
    for x, t in zip(Xs, ys):                       # each client's gradient; the server sees the sum
        loss = loss_fn(model(x.to(dtype)), t)
        a, b = torch.autograd.grad(loss, params)
        gW, gb = gW + a, gb + b
    with torch.no_grad():
        rec = recover_from_imprint(gW.detach(), gb.detach(), weight=model.imprint.weight.detach(),
                                   bias=model.imprint.bias.detach())
        Xall = torch.cat(Xs).to(torch.float64)
        err = match_recovered(Xall, rec.x)
        edges = rec.edges
        h = Xall @ model.imprint.weight.detach().to(torch.float64)[0]
        idx = torch.searchsorted(edges, h, right=False) - 1    # bin i holds c_i < h <= c_{i+1}
        counts = torch.bincount(idx[idx >= 0], minlength=num_bins)
    recovered = err < tol
    return ImprintAttackResult(rate=float(recovered.double().mean()), recovered=recovered, error=err,
                               x=rec.x, recovery=rec, counts=counts, unique=counts == 1)


def imprint_recovery_grid(X, batch_sizes, bins, trials: int = 5, seed: int = 0, *, y=None,
                          num_classes: int = 10, direction="random", return_alone: bool = False):
    """Recovery rate of :func:`imprint_attack` averaged over ``trials`` random batches, for every batch
    size and number of bins: ``[len(batch_sizes), len(bins)]``. ``X``: the pool ``[n, dim]`` (e.g. the
    flattened digits); batches are drawn without replacement; the same batches serve every number of
    bins. The server's ``N(mean, std)`` for ``h(x)`` is fitted on the whole pool (known data
    statistics). ``direction`` as in :func:`imprint_layer` (one direction, drawn with ``seed``, for
    the whole grid); the default is a random Gaussian direction because the mean of the pixels of
    quantised images (digits: multiples of 1/16) takes few distinct values, so distinct images tie in
    ``h`` and share a bin. ``y``: labels ``[n]`` (``None``: random labels).

    ``return_alone=True`` returns ``(rates, alone)``: ``alone`` ``[len(batch_sizes), len(bins)]`` is the share
    of the inputs that lay alone in their bin above ``c_1`` (counted from the true inputs' measurements and the
    cut-offs, :attr:`ImprintAttackResult.unique`, not from the gradient), averaged over the same trials: the
    rate an exact recovery must reach, input for input."""
    X = torch.as_tensor(X)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"X must be [n, dim], got shape {tuple(X.shape)}")
    batch_sizes = [positive_int("batch_sizes", b) for b in batch_sizes]
    bins = [positive_int("bins", k) for k in bins]
    if not batch_sizes:
        raise ValueError("batch_sizes must not be empty")
    if not bins:
        raise ValueError("bins must not be empty")
    if max(batch_sizes) > X.shape[0]:
        raise ValueError(f"batch_sizes must not exceed the pool size {X.shape[0]}, got {max(batch_sizes)}")
    trials = positive_int("trials", trials)
    if y is not None:
        y = torch.as_tensor(y)
        if y.shape != (X.shape[0],):
            raise ValueError(f"y must have shape [{X.shape[0]}], got {tuple(y.shape)}")
    w = _direction(X.shape[1], direction, seed)
    h = X.to(torch.float64) @ w
    mean, std = float(h.mean()), float(h.std())
    rng = np.random.default_rng(int(seed))
    out = np.zeros((len(batch_sizes), len(bins)))
    alone = np.zeros_like(out)
    for i, B in enumerate(batch_sizes):
        for t in range(trials):
            idx = torch.as_tensor(rng.choice(X.shape[0], size=B, replace=False))
            yb = None if y is None else y[idx]
            s = int(rng.integers(2 ** 31))
            for j, k in enumerate(bins):
                res = imprint_attack(X[idx], yb, trap=ImprintTrap(num_bins=k, mean=mean, std=std, direction=w),
                                     num_classes=num_classes, seed=s)
                out[i, j] += res.rate
                alone[i, j] += float(res.unique.sum()) / B
    return (out / trials, alone / trials) if return_alone else out / trials


def expected_recovery_rate(batch_size, num_bins):
    """The recovery rate :func:`imprint_attack` should reach when the server's model of ``h(x)`` is
    right: the ``k`` cut-offs split the distribution into ``k + 1`` equally likely intervals, an input
    is recovered when it falls above ``c_1`` (probability ``k / (k + 1)``) and none of the other
    ``B - 1`` inputs of the (aggregated) batch falls in its interval (``(k / (k + 1))^(B - 1)``), so the
    rate is ``(k / (k + 1))^B``. ``batch_size`` (``B``, all clients' inputs together under secure
    aggregation) and ``num_bins`` (``k``) broadcast as arrays. Raises ``ValueError`` for a value < 1."""
    B = np.asarray(batch_size, dtype=float)
    k = np.asarray(num_bins, dtype=float)
    if (B < 1).any() or (k < 1).any():
        raise ValueError(f"batch_size and num_bins must be >= 1, got {batch_size}, {num_bins}")
    out = (k / (k + 1.0)) ** B
    return float(out) if out.ndim == 0 else out
