"""A registry of defenses: one call, :func:`apply`, for what an observer sees of the clients' updates under each
defense of the book (the columns of Chapter 7's attack x defense matrix, :mod:`fedlab.experiments.matrix`), and
for a reader's own defense function.

A defense is a :class:`Defense` (``key``, ``label``, ``kind``, ``param``); :data:`DEFENSES` lists the library's.
``apply(updates, defense)`` takes the clients' updates ``[A, n]`` (row ``a``: client ``a``'s update, a model delta
or a gradient, flattened) and returns what crosses each client's link, ``[A, n]`` (``secagg``: ``[A // group, n]``),
through the mechanisms of :mod:`fedlab.privacy` (nothing is re-implemented here). By kind:

* ``none`` -- the update as it is (a copy);
* ``clip`` -- each row clipped to L2 norm ``C`` (:func:`fedlab.privacy.clipping.clip_rows`), ``C`` given or the
  median norm of the rows (:func:`median_norm`, the quantile adaptive clipping aims at);
* ``dp`` -- DP-FedAvg (McMahan et al. 2018, Algorithm 1): each row clipped to ``C`` plus ``N(0, (z C)^2)``, the
  noise a trusted server adds to the sum (:func:`fedlab.privacy.dp_fedavg.noise_std`), ``z`` calibrated by
  :func:`dp_noise_multiplier` for client-level ``(param, 1e-5)`` over the deployment :data:`DP_SETTING`;
  ``client_side_noise=False`` is the clipped update before the server's noise (what crosses the client's link);
  ``safe=True`` the discrete Gaussian on a public grid (Canonne, Kamath & Steinke 2020;
  :func:`fedlab.privacy.dp_fedavg.discrete_noise`);
* ``ldp`` -- local DP (:func:`fedlab.privacy.ldp.ldp_gaussian`): each client clips to ``C`` and adds the Gaussian
  noise of ``(param, LDP_DELTA)``-LDP for sensitivity ``2 C`` (``safe=True``: the discrete Gaussian);
* ``prune`` -- each row keeps its ``1 - param`` largest coordinates (top-k sparsification,
  :func:`fedlab.privacy.defenses.prune_rows`); :func:`apply_public` publishes the mask of the kept coordinates;
* ``secagg`` -- secure aggregation (Bonawitz et al. 2017; :func:`fedlab.privacy.secure_aggregation.secure_sum`):
  only the sum over each group of ``group`` consecutive clients;
* ``dpriv`` -- d-privacy (Galli et al. 2022, Algorithm 2; :func:`fedlab.privacy.dprivacy.sanitize_update`):
  Euclidean Laplace noise with ``E ||rho|| = param ||update||``;
* ``consistency`` -- Flower's SecAgg+ with the consistency round: a protocol, not a map of a tensor
  (:func:`apply` refuses it; :mod:`fedlab.flower` runs it);
* ``user`` -- a reader's function of the contract :data:`USER_CONTRACT`, its answer checked.

Shapes: ``updates`` ``[A, n]`` float32 or float64 in, the same dtype out. Every function raises ``ValueError``
naming the argument on bad input.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import torch

from . import defenses as pdef
from . import dp_fedavg as dpf
from . import dprivacy, ldp
from . import secure_aggregation as sa

__all__ = ["Defense", "DEFENSES", "USER_CONTRACT", "USER_PUBLIC", "DP_SETTING", "LDP_DELTA", "apply", "apply_public",
           "dp_noise_multiplier", "median_norm"]

#: the DP-FedAvg deployment the ``dp*`` columns are calibrated for (Chapter 1c's demonstration setting)
DP_SETTING = {"num_clients": 1000, "sampling_prob": 0.1, "num_rounds": 100, "delta": 1e-5}
#: delta of the local (eps, delta)-DP Gaussian mechanism of the ``ldp*`` columns
LDP_DELTA = 1e-5


#: the kinds of the library's columns; ``"user"`` is a reader's defense function (:data:`USER_CONTRACT`)
_KINDS = ("none", "clip", "dp", "ldp", "prune", "secagg", "consistency", "dpriv", "user")
#: the public parameters a user defense may publish with its view (what an attacker who knows the defense reads)
USER_PUBLIC = ("mask", "clip_norm")


@dataclass(frozen=True)
class Defense:
    """A column: ``key`` (record names: cell ``"<row>|<key>"``), ``label`` (table header), ``kind`` (one of
    ``none, clip, dp, ldp, prune, secagg, dpriv`` for the library's columns, ``user`` for a reader's defense)
    and its parameter ``param`` (epsilon, pruned fraction or nu). ``safe=True`` (kinds ``dp`` and ``ldp`` only)
    is the floating-point-safe mechanism, the discrete Gaussian on a public grid
    (``fedlab.privacy.dp_fedavg.dp_aggregate(..., safe=True)``, ``fedlab.privacy.ldp.ldp_gaussian(..., safe=True)``),
    instead of the float Gaussian. Kind ``consistency`` is Flower's SecAgg+ with Bonawitz et al.'s consistency
    round (:func:`fedlab.flower.secagg.consistency_mod`), a column of the malicious-server-in-SecAgg+ row only.

    A **user defense** is ``Defense(key, label, "user", fn=fn, public=(...))``, with ``fn``
    a function of the contract :data:`USER_CONTRACT` and ``public`` the names (from :data:`USER_PUBLIC`) of
    the public parameters ``fn`` returns beside its view; the matrix's
    :func:`fedlab.experiments.matrix.run_row` takes it beside the library's keys.
    Raises ``ValueError`` for an unknown ``kind``, a user defense without a callable ``fn``, a key that is
    empty or holds ``|`` or ``@`` (the record's separators), an unknown public name, or ``fn``/``public``
    on a library kind."""

    key: str
    label: str
    kind: str
    param: float | None = None
    fn: Callable | None = field(default=None, compare=False, repr=False)
    public: tuple[str, ...] = ()
    safe: bool = False

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {list(_KINDS)}, got {self.kind!r}")
        if not isinstance(self.safe, bool) or (self.safe and self.kind not in ("dp", "ldp")):
            raise ValueError(f"safe must be a bool, True only for kinds 'dp' and 'ldp', got {self.safe!r} "
                             f"for kind {self.kind!r}")
        if not isinstance(self.key, str) or not self.key or "|" in self.key or "@" in self.key \
                or self.key == "baseline" or self.key.startswith("acc_"):
            raise ValueError(f"key must be a non-empty string without '|' or '@', not 'baseline' or 'acc_*', "
                             f"got {self.key!r}")
        object.__setattr__(self, "public", tuple(self.public))
        if self.kind == "user":
            if not callable(self.fn):
                raise ValueError(f"fn must be a callable (updates [A, n], generator) -> view, got {self.fn!r}")
            bad = [p for p in self.public if p not in USER_PUBLIC]
            if bad or len(set(self.public)) != len(self.public):
                raise ValueError(f"public must be distinct names from {list(USER_PUBLIC)}, got {self.public!r}")
        elif self.fn is not None or self.public:
            raise ValueError(f"fn and public are for kind 'user' only, got kind {self.kind!r}")


#: the contract of a user defense's ``fn``, checked by :func:`apply` and :func:`apply_public`
USER_CONTRACT = """\
fn(updates, generator) -> view, or (view, public) when the Defense declares public names.
  updates   torch.Tensor [A, n], float32 or float64: row a is client a's update (model delta or gradient),
            flattened in the model's parameter order; a copy (changing it in place changes nothing).
  generator torch.Generator: the row's noise stream, the only randomness fn may use (the cell is then a
            function of the seed).
  view      torch.Tensor [A, n], same dtype, finite: what client a sends, what the row's attacker observes.
  public    {name: value} with exactly the Defense's public names: "mask" a bool [A, n] tensor, True where
            a coordinate was sent (the view is 0 elsewhere); "clip_norm" a float C > 0, every row of the
            view has L2 norm at most C. An attacker who knows the defense reads them (DLG matches only the
            masked coordinates or clips its dummy gradient to C; the eavesdropper and RAIFLE undo or
            reproduce the clipping); a defense without them meets the row's naive attacker (attacker()).
fn may not: change the shape or dtype, return NaN or inf, mix clients (row a of the view depends on row a of
updates and the generator only: the defense runs on each client), or see anything else of the row."""


DEFENSES: tuple[Defense, ...] = (
    Defense("none", "none", "none"),
    Defense("clip", "clipping (C = median norm)", "clip"),
    Defense("dp1", "DP-FedAvg ε = 1", "dp", 1.0),
    Defense("dp1safe", "DP-FedAvg ε = 1, floating-point-safe", "dp", 1.0, safe=True),
    Defense("dp8", "DP-FedAvg ε = 8", "dp", 8.0),
    Defense("ldp1", "LDP ε = 1", "ldp", 1.0),
    Defense("ldp10", "LDP ε = 10", "ldp", 10.0),
    Defense("ldp10safe", "LDP ε = 10, floating-point-safe", "ldp", 10.0, safe=True),
    Defense("ldp500", "LDP ε = 500", "ldp", 500.0),
    Defense("prune90", "pruning 90 % (top-k, k = 10 %)", "prune", 0.9),
    Defense("topk1", "top-k, k = 1 %", "prune", 0.99),
    Defense("secagg", "secure aggregation", "secagg"),
    Defense("secagg_cr", "SecAgg+ with the consistency round", "consistency"),
    Defense("dpriv0.5", "d-privacy ν = 0.5", "dpriv", 0.5),
    Defense("dpriv5", "d-privacy ν = 5", "dpriv", 5.0),
)
_BY_KEY = {d.key: d for d in DEFENSES}


def _lookup(defense) -> Defense:
    """The :class:`Defense` of ``defense``: a :class:`Defense` itself, or the key of one of :data:`DEFENSES`.
    Raises ``ValueError`` naming ``defense`` otherwise."""
    d = _BY_KEY.get(defense) if isinstance(defense, str) else defense
    if not isinstance(d, Defense):
        raise ValueError(f"defense must be one of {list(_BY_KEY)} or a user Defense, got {defense!r}")
    return d


@functools.lru_cache(maxsize=None)
def dp_noise_multiplier(epsilon: float) -> float:
    """The DP-FedAvg noise multiplier ``z`` for client-level ``(epsilon, DP_SETTING['delta'])`` in the
    deployment :data:`DP_SETTING` (RDP accountant, :func:`fedlab.privacy.dp_fedavg.noise_multiplier_for_epsilon`).
    Raises ``ValueError`` unless ``epsilon > 0``."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    s = DP_SETTING
    # the float column's calibration (amplification by sampling); the safe columns reuse this z
    return dpf.noise_multiplier_for_epsilon(float(epsilon), s["sampling_prob"], s["num_rounds"], s["delta"],
                                            num_clients=s["num_clients"], safe=False)


def median_norm(updates: torch.Tensor) -> float:
    """The median L2 norm of the rows of ``updates`` ``[A, n]`` (the clipping bound ``C`` of every
    column that clips). Raises ``ValueError`` for a shape other than ``[A, n]`` or a zero median."""
    if updates.ndim != 2 or updates.shape[0] < 1:
        raise ValueError(f"updates must be [A, n], got shape {tuple(updates.shape)}")
    c = float(updates.double().norm(dim=1).median())
    if not c > 0:
        raise ValueError("updates: the median update norm is 0, no clipping bound")
    return c


def apply(updates: torch.Tensor, defense: Defense | str, *, clip_norm: float | None = None, group: int = 1,
          generator: torch.Generator | None = None, rng: np.random.Generator | None = None,
          client_side_noise: bool = True) -> torch.Tensor:
    """What the attacker sees of the clients' updates ``updates`` ``[A, n]`` (row ``a``: client ``a``'s
    update) under ``defense`` (a :class:`Defense` or its key), in the threat model of the module docstring
    (:func:`apply_public` adds the defense's public parameters).

    Returns ``[A, n]`` (one view per client) for every column but ``secagg``, which returns the sums
    ``[A // group, n]`` of consecutive groups of ``group`` clients (the protocol's masked messages summed
    and decoded). ``clip_norm``: ``C`` (default :func:`median_norm` of ``updates``); ``generator``: the
    torch noise stream (DP, LDP, user defenses), ``rng``: the numpy stream of the Laplace draws (d-privacy).
    ``client_side_noise=False`` (DP-FedAvg columns only) returns what crosses the client's link under
    McMahan et al.'s Algorithm 1, the clipped update: the trusted server adds the noise after the link.
    A user defense (kind ``"user"``) returns its ``fn``'s view, checked against :data:`USER_CONTRACT`.
    Raises ``ValueError`` for an unknown defense, ``updates`` not ``[A, n]``, ``group`` not dividing ``A``,
    ``clip_norm <= 0``, or a user ``fn`` that breaks the contract (see :func:`apply_public`).
    """
    d = _lookup(defense)
    if updates.ndim != 2 or updates.shape[0] < 1:
        raise ValueError(f"updates must be [A, n], got shape {tuple(updates.shape)}")
    if d.kind == "user":
        return _user_view(d, updates, generator)[0]
    C = median_norm(updates) if clip_norm is None else float(clip_norm)
    if not C > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if d.kind == "none":
        return updates.clone()
    if d.kind == "clip":
        return pdef.clip_rows(updates, C)
    if d.kind == "dp":
        if not client_side_noise:
            return pdef.clip_rows(updates, C)
        sigma = dpf.noise_std(dp_noise_multiplier(d.param), C, 1.0)     # z C on the sum
        if d.safe:              # the discrete Gaussian of dp_aggregate(..., safe=True), on the target's clipped update
            return dpf.discrete_noise({"u": pdef.clip_rows(updates, C)}, sigma, generator=generator)["u"]
        return pdef.gaussian_noise(pdef.clip_rows(updates, C), sigma, generator=generator)
    if d.kind == "ldp":
        return ldp.ldp_gaussian(updates, d.param, LDP_DELTA, 2.0 * C, generator=generator, safe=d.safe)
    if d.kind == "consistency":
        raise ValueError(f"defense {d.key!r} is Flower's SecAgg+ protocol with the consistency round: it has no view "
                         f"of a tensor of updates (only the matrix's row 'secagg_lie' runs it, through fedlab.flower)")
    if d.kind == "prune":
        return pdef.prune_rows(updates, d.param)
    if d.kind == "secagg":
        if int(group) != group or group < 1 or updates.shape[0] % group:
            raise ValueError(f"group must be a positive integer dividing {updates.shape[0]}, got {group}")
        rows = updates.double().reshape(-1, int(group), updates.shape[1])
        return torch.stack([sa.secure_sum(r, generator=generator) for r in rows]).to(updates.dtype)
    if d.kind == "dpriv":
        out = dprivacy.sanitize_update(updates.double(), torch.zeros_like(updates, dtype=torch.float64), d.param,
                                       rng=rng).theta
        return out.to(updates.dtype)
    raise ValueError(f"unknown defense kind {d.kind!r}")


def apply_public(updates: torch.Tensor, defense: Defense | str, *, clip_norm: float | None = None,
                 group: int = 1, generator: torch.Generator | None = None, rng: np.random.Generator | None = None,
                 client_side_noise: bool = True) -> tuple[torch.Tensor, dict]:
    """:func:`apply`'s view and the defense's public parameters, ``(view, public)``: what an attacker who
    knows the defense reads, in the names of :data:`USER_PUBLIC`. For the library's columns ``{"clip_norm":
    C}`` under ``clip`` and under DP-FedAvg's pre-noise view (``client_side_noise=False``), ``{"mask": view !=
    0}`` under ``prune``, ``{}`` elsewhere; for a user defense (kind ``"user"``) what its ``fn`` returned.

    A user ``fn`` gets a copy of ``updates`` and ``generator`` (a fixed one when ``None``), and its answer is
    checked against :data:`USER_CONTRACT`. Raises ``ValueError`` as :func:`apply`, and for a user ``fn`` that
    returns a view of the wrong shape or dtype or with NaN or inf, public names other than its Defense's, a
    mask that is not a bool ``[A, n]`` tensor or with a coordinate outside it that is not 0 in the view, or a
    ``clip_norm`` that is not a finite float > 0 or shorter than a row of the view.
    """
    d = _lookup(defense)
    if d.kind == "user":
        if updates.ndim != 2 or updates.shape[0] < 1:
            raise ValueError(f"updates must be [A, n], got shape {tuple(updates.shape)}")
        return _user_view(d, updates, generator)
    view = apply(updates, d, clip_norm=clip_norm, group=group, generator=generator, rng=rng,
                   client_side_noise=client_side_noise)
    C = median_norm(updates) if clip_norm is None else float(clip_norm)
    if d.kind == "clip" or (d.kind == "dp" and not client_side_noise):
        return view, {"clip_norm": C}
    if d.kind == "prune":
        return view, {"mask": view != 0}
    return view, {}


def _user_view(d: Defense, updates: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, dict]:
    """Run user defense ``d`` on ``updates`` ``[A, n]`` and check its answer against :data:`USER_CONTRACT`."""
    name = f"defense {d.key!r}"
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    out = d.fn(updates.clone(), generator)
    if d.public:
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping)):
            raise ValueError(f"{name} declares public {d.public}: its fn must return (view, {{name: value}})")
        view, public = out[0], dict(out[1])
        if set(public) != set(d.public):
            raise ValueError(f"{name}: fn returned public names {sorted(public)}, its Defense declares "
                             f"{sorted(d.public)}")
    else:
        view, public = out, {}
        if isinstance(view, tuple):
            raise ValueError(f"{name} declares no public names: its fn must return the view tensor only "
                             f"(declare public=('mask',) or ('clip_norm',) to publish parameters)")
    if not isinstance(view, torch.Tensor) or view.shape != updates.shape or view.dtype != updates.dtype:
        got = (tuple(view.shape), view.dtype) if isinstance(view, torch.Tensor) else type(view).__name__
        raise ValueError(f"{name}: fn must return a tensor of shape {tuple(updates.shape)} and dtype "
                         f"{updates.dtype}, got {got}")
    if not torch.isfinite(view).all():
        raise ValueError(f"{name}: fn returned a view with NaN or inf")
    if "mask" in public:
        m = public["mask"]
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.shape != updates.shape:
            raise ValueError(f"{name}: public 'mask' must be a bool tensor of shape {tuple(updates.shape)}")
        if (view[~m] != 0).any():
            raise ValueError(f"{name}: the view is not 0 where public 'mask' is False")
    if "clip_norm" in public:
        c = public["clip_norm"]
        if isinstance(c, torch.Tensor) and c.numel() == 1:
            c = c.item()
        if not isinstance(c, (int, float)) or not (math.isfinite(c) and c > 0):
            raise ValueError(f"{name}: public 'clip_norm' must be a finite float > 0, got {c!r}")
        if float(view.double().norm(dim=1).max()) > float(c) * (1 + 1e-6):
            raise ValueError(f"{name}: a row of the view is longer than public 'clip_norm' {c}")
        public["clip_norm"] = float(c)
    return view, public
