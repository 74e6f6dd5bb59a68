"""The attack x defense matrix: every attack of the book against every defense.

Rows are the chapters' attacks, columns the defenses of :mod:`fedlab.privacy`; each cell is the
attack's own success metric (the one its chapter reports) under that defense, at one seed, computed
from the chapters' functions (nothing is re-implemented here: the attacks come from
:mod:`fedlab.attacks`, the mechanisms from :mod:`fedlab.privacy`, the protocols from :mod:`fedlab.fl`).
``python -m fedlab reproduce matrix --seeds 0-2`` runs :func:`run_matrix` once per seed and stores the
record ``chapters/records/matrix.<scale>.json``; the book's page ``chapters/07_matrix.ipynb`` renders
it with :func:`render_html`.

**One threat model per column** (:data:`DEFENSES`), the same for every row:

* ``none`` -- the attacker sees what its chapter lets it see (the server: each client's update; the
  eavesdropper: each message of the target);
* ``clip`` -- each client clips its update to L2 norm ``C`` (:func:`fedlab.privacy.defenses.clip_rows`),
  ``C`` the median norm of the clean updates of the round (the quantile adaptive clipping aims at);
* ``dp1`` / ``dp8`` -- DP-FedAvg (McMahan et al. 2018): updates clipped to ``C``, a *trusted* server adds
  ``N(0, (z C)^2)`` to their sum (:func:`fedlab.privacy.dp_fedavg.dp_aggregate`) with ``z`` calibrated by
  :func:`fedlab.privacy.dp_fedavg.noise_multiplier_for_epsilon` for client-level ``(eps, 1e-5)`` over a
  deployment of ``K = 1000`` clients, sampling rate ``q = 0.1``, ``T = 100`` rounds (the setting of
  Chapter 1b). What the attacker sees depends on where it stands (its row's :attr:`Attack.observer`, one
  per row): the honest-but-curious server that aggregates sees each client's *clipped
  update before the noise* (it adds the noise itself), so its cell is the clip-only view under the
  noisy training; the eavesdropper on a client's link sees the same clipped message (McMahan et al.'s
  Algorithm 1 clips on the client); an *outsider* (the rows of :data:`OUTSIDER_ROWS`, their own row
  group) sees the released noisy sum and knows every other client's update (the adversary the guarantee
  is stated against), i.e. the target's clipped update plus that noise. Against every *malicious*
  server (imprint, active membership, PAC, RAIFLE with ADM) central DP is n/a
  (:data:`MALICIOUS_SERVER_DP_NA`). ``z`` is calibrated for the deployment above; the epsilon that an
  outsider actually faces depends on how many releases it observes (:func:`effective_epsilons`, the
  privacy-loss-distribution accountant that also charges the ``ldp*`` columns);
* ``ldp1`` / ``ldp10`` / ``ldp500`` -- local DP (:func:`fedlab.privacy.ldp.ldp_gaussian`): each client
  clips to ``C`` and adds Gaussian noise for ``(eps, 1e-5)``-LDP, sensitivity ``2 C``, per release (it
  composes over the releases a row observes, charged by the same accountant as central DP);
* ``prune90`` -- each client zeroes the 90 % smallest coordinates (:func:`fedlab.privacy.defenses.prune_rows`);
  the zeros are visible in the update, so the DLG row's attacker matches only the kept coordinates
  (``gradient_inversion.dlg(mask=...)``, the attacker who knows the defense); the plain DLG that ignores the
  mask is kept beside it as ``"dlg|prune90@naive"`` (:data:`NAIVE_SUFFIX`) and printed under the cell (under
  ``clip`` the DLG row's attacker likewise clips its dummy gradient to ``C``, ``dlg(clip_norm=C)``);
* ``dp1safe`` / ``ldp10safe`` -- the floating-point-safe mechanisms beside the float ones: the
  same epsilon, the discrete Gaussian on a public grid (``dp_aggregate(..., safe=True)``, ``ldp_gaussian(...,
  safe=True)``), each row's attacker and threat model as in the float column; their epsilons come from the
  discrete Gaussian's Renyi bound (:func:`safe_central_epsilon`, :func:`safe_ldp_epsilon`);
* ``topk1`` -- top-k sparsification at k = 1 % (``prune90`` is top-k at k = 10 %), with the mask-aware DLG and
  Inverting Gradients (the naive twins kept as ``"<row>|topk1@naive"``);
* ``secagg`` -- secure aggregation (:func:`fedlab.privacy.secure_aggregation.secure_sum`): the attacker
  sees only the sum over a group of clients (its size is given per row); in the row of the malicious server
  inside SecAgg+ (:data:`SECAGG_ROW`, its own row group) the cell runs Flower's SecAgg+ itself
  (:func:`fedlab.flower.run` with ``secagg=True``), and ``secagg_cr`` is SecAgg+ with the consistency round;
* ``dpriv0.5`` / ``dpriv5`` -- d-privacy (Galli et al. 2022, Algorithm 2,
  :func:`fedlab.privacy.dprivacy.sanitize_update`): Euclidean Laplace noise with ``E ||rho|| = nu ||update||``
  (``nu = 5`` is Chapter 5's setting).

**A reader's own defense**: ``Defense(key, label, "user", fn=fn, public=(...))`` with ``fn``
of the contract :data:`USER_CONTRACT` (the clients' updates ``[A, n]`` and the row's generator in, what each
client sends out, optionally with public parameters from :data:`USER_PUBLIC`: a ``mask`` or a ``clip_norm``)
goes into :func:`run_row`'s ``columns`` beside the library's keys. Each client applies it to its own update
where the row applies a client-side defense; the row's attacker reads the public parameters where it has a
variant that uses them, else it is the naive attacker, and :func:`attacker` says which.

Each row (:data:`ATTACKS`) names its chapter, its metric and which direction means "the attack
succeeds", and a *no-information baseline* computed at every seed (the mean-colour image's PSNR, AUC
0.5, the error of the released global model, ...). The page colours a cell by the share of the
undefended attack's advantage over that baseline that survives the defense (:func:`advantage`); a row
whose undefended advantage is not significant over the record's seeds (:func:`undefended_advantage`)
is not coloured. A cell's interval is the 95 % Student-t interval over the seeds cut to its metric's
range (:func:`bounded_interval`).
"""
from __future__ import annotations

import contextvars
import functools
import html
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .. import fl, models
from ..config import pick
from .._stats import bounded_interval
from ..metrics import t_interval
from ..fl.dp_fedavg import dp_fedavg
from ..fl.recsys import ratings as rec
from ..attacks import gradient_inversion as gi
from ..attacks import imprint as imp
from ..attacks import identifiability as pac
from ..attacks import membership as mia
from ..attacks import model_reconstruction as mr
from ..attacks.interaction_inference import oltr as ro
from ..data.letor import synthetic_letor
from ..data.movielens import sample_user_items, synthetic_movielens
from ..data import client_datasets, images, load_digits, partition_iid, train_test_split
from ..privacy import defenses as pdef
from ..privacy import dp_fedavg as dpf
from ..privacy import dprivacy, ldp
from ..privacy import secure_aggregation as sa
from . import chapter3a as ch3a
from . import chapter3b as ch3b

__all__ = ["Defense", "USER_CONTRACT", "USER_PUBLIC", "protect_public", "attacker",
           "Attack", "DEFENSES", "ATTACKS", "DP_SETTING", "LDP_DELTA", "COLUMN_NOTES",
           "dp_noise_multiplier", "median_norm", "protect", "cell", "run_row", "run_matrix", "value_name",
           "describe_matrix", "threat_rows", "row_threats", "row_threat_header", "effective_epsilons",
           "undefended_advantage", "NOT_SIGNIFICANT", "MALICIOUS_SERVER_DP_NA", "OBSERVERS", "OUTSIDER", "OUTSIDER_ROWS",
           "OUTSIDER_COLUMNS", "OUTSIDER_SAME", "central_epsilon", "ldp_epsilon", "deployment_epsilons", "metric_range",
           "bounded_interval", "cell_interval", "adaptive_gaps", "adaptive_gap_table", "own_defense_table", "ACCOUNTANT", "NAIVE_SUFFIX", "NAIVE_NOTE", "LOSS_SUFFIX", "LOSS_TRUTH_SUFFIX", "page_values", "ldp_noise_ratio", "record_table", "advantage", "render_html",
           "consistent_with_record", "SECAGG_ROW", "SECAGG_ROWS", "SECAGG_ATTACKS", "SECAGG_COLUMNS",
           "SECAGG_CONSISTENT_SETTINGS", "SECAGG_REFUSED_NOTE", "safe_central_epsilon", "safe_ldp_epsilon", "UTILITY_ROW",
           "utility_table"]

#: what a floating-point-safe column adds to its kind's note (the page's threat-model table)
_SAFE_NOTE = ("; floating-point-safe: the discrete Gaussian on a public grid (Canonne, Kamath & Steinke 2020) instead "
              "of float Gaussian noise, so the guarantee holds for the float output as well")
#: the DP-FedAvg deployment the ``dp*`` columns are calibrated for (Chapter 1b's demonstration setting)
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
    the public parameters ``fn`` returns beside its view; :func:`run_row` takes it beside the library's keys.
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


#: the contract of a user defense's ``fn``, also in :func:`protect`'s docstring
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

#: what each column changes in what the attacker sees (the page's threat-model table)
COLUMN_NOTES = {
    "none": "what the attack's chapter lets it see: each client's update (the server), each message (the eavesdropper)",
    "clip": "each client scales its update to L2 norm at most C, the median norm of the clean updates",
    "dp": "each client clips to C, a trusted server adds N(0, (zC)²) to the sum. The curious server that aggregates "
          "sees each clipped update before its own noise (the clip-only view, under the noisy training), and so "
          "does an eavesdropper on a client's link; only an outsider sees the noisy release (its own rows, below: it "
          "knows every other client's update, the adversary of the guarantee); a malicious server would not add "
          "the noise (n/a)",
    "ldp": "each client clips to C and adds the Gaussian noise of (ε, 1e-5)-LDP for sensitivity 2C, per release",
    "prune": "each client sends only the k largest coordinates of its update (top-k sparsification: pruning 90 % is "
             "top-k at k = 10 %); the zeros show the attacker which coordinates were sent",
    "secagg": "the attacker sees only the sum over a group of clients (masked messages, exact sum); against the "
              "malicious server inside SecAgg+ (its own row) the cell runs Flower's SecAgg+ itself",
    "consistency": "Flower's SecAgg+ with Bonawitz et al.'s consistency round: each client signs the survivor set and "
                   "the model it received and refuses to reveal key shares when another client saw something else "
                   "(a column of the malicious-server-in-SecAgg+ row only)",
    "dpriv": "each client adds Euclidean Laplace noise with E‖ρ‖ = ν ‖update‖ (Galli et al., Algorithm 2)",
}


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


#: the user defenses of the :func:`run_row` call in progress, ``{key: Defense}`` (the rows look their columns up
#: with :func:`_defense`, which sees the library's columns and these)
_USER: contextvars.ContextVar[Mapping[str, Defense]] = contextvars.ContextVar("fedlab_matrix_user_defenses", default={})


def _defense(key) -> Defense:
    """The :class:`Defense` of a column key (the library's, or a user defense of the current :func:`run_row`)."""
    d = _BY_KEY.get(key) or _USER.get().get(key) if isinstance(key, str) else key
    if not isinstance(d, Defense):
        raise ValueError(f"defense must be one of {list(_BY_KEY)} or a user Defense, got {key!r}")
    return d


def protect(updates: torch.Tensor, defense: Defense | str, *, clip_norm: float | None = None, group: int = 1,
            generator: torch.Generator | None = None, rng: np.random.Generator | None = None,
            client_side_noise: bool = True) -> torch.Tensor:
    """What the attacker sees of the clients' updates ``updates`` ``[A, n]`` (row ``a``: client ``a``'s
    update) under ``defense`` (a :class:`Defense` or its key), in the threat model of the module docstring
    (:func:`protect_public` adds the defense's public parameters).

    Returns ``[A, n]`` (one view per client) for every column but ``secagg``, which returns the sums
    ``[A // group, n]`` of consecutive groups of ``group`` clients (the protocol's masked messages summed
    and decoded). ``clip_norm``: ``C`` (default :func:`median_norm` of ``updates``); ``generator``: the
    torch noise stream (DP, LDP, user defenses), ``rng``: the numpy stream of the Laplace draws (d-privacy).
    ``client_side_noise=False`` (DP-FedAvg columns only) returns what crosses the client's link under
    McMahan et al.'s Algorithm 1, the clipped update: the trusted server adds the noise after the link.
    A user defense (kind ``"user"``) returns its ``fn``'s view, checked against :data:`USER_CONTRACT`.
    Raises ``ValueError`` for an unknown defense, ``updates`` not ``[A, n]``, ``group`` not dividing ``A``,
    ``clip_norm <= 0``, or a user ``fn`` that breaks the contract (see :func:`protect_public`).
    """
    d = _defense(defense)
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
                         f"of a tensor of updates (only the row {SECAGG_ROW!r} runs it)")
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


def protect_public(updates: torch.Tensor, defense: Defense | str, *, clip_norm: float | None = None,
                   group: int = 1, generator: torch.Generator | None = None, rng: np.random.Generator | None = None,
                   client_side_noise: bool = True) -> tuple[torch.Tensor, dict]:
    """:func:`protect`'s view and the defense's public parameters, ``(view, public)``: what an attacker who
    knows the defense reads, in the names of :data:`USER_PUBLIC`. For the library's columns ``{"clip_norm":
    C}`` under ``clip`` and under DP-FedAvg's pre-noise view (``client_side_noise=False``), ``{"mask": view !=
    0}`` under ``prune``, ``{}`` elsewhere; for a user defense (kind ``"user"``) what its ``fn`` returned.

    A user ``fn`` gets a copy of ``updates`` and ``generator`` (a fixed one when ``None``), and its answer is
    checked against :data:`USER_CONTRACT`. Raises ``ValueError`` as :func:`protect`, and for a user ``fn`` that
    returns a view of the wrong shape or dtype or with NaN or inf, public names other than its Defense's, a
    mask that is not a bool ``[A, n]`` tensor or with a coordinate outside it that is not 0 in the view, or a
    ``clip_norm`` that is not a finite float > 0 or shorter than a row of the view.
    """
    d = _defense(defense)
    if d.kind == "user":
        if updates.ndim != 2 or updates.shape[0] < 1:
            raise ValueError(f"updates must be [A, n], got shape {tuple(updates.shape)}")
        return _user_view(d, updates, generator)
    view = protect(updates, d, clip_norm=clip_norm, group=group, generator=generator, rng=rng,
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


@dataclass(frozen=True)
class Attack:
    """A row: ``key``, ``label``, ``chapter`` (notebook stem it links to), ``metric`` (what a cell holds),
    ``higher_is_success`` (the direction in which the attack succeeds), ``threat`` (one sentence: who
    attacks and what it sees), ``run(seed, columns, tiny) -> {column key: value, "baseline": value}``,
    ``not_applicable`` (``{column key: reason}``, cells that do not exist), ``secagg_group`` (clients
    per secure sum), ``releases() -> (T, q)`` (how many releases of the target the attacker observes: ``T``
    rounds, the target sampled with probability ``q`` in each; read at record time, so at the record's
    scale) and ``cell_notes`` (``{column key: note}``, a cell computed differently from its column's
    threat model, shown as a footnote); ``observer`` (one of :data:`OBSERVERS`) is the one attacker of every
    cell of the row (a cell never mixes attackers); ``value_range`` ``(low, high)`` is the
    range of the metric (``-inf``/``inf`` for none), inside which the page's intervals stay."""

    key: str
    label: str
    chapter: str
    metric: str
    higher_is_success: bool
    threat: str
    run: Callable[..., dict]
    baseline: str
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    secagg_group: int = 1
    releases: Callable[[], tuple[int, float]] = lambda: (1, 1.0)
    observer: str = "curious server"
    cell_notes: Mapping[str, str] = field(default_factory=dict)
    value_range: tuple[float, float] = (-math.inf, math.inf)

    def __post_init__(self):
        if self.observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {list(OBSERVERS)}, got {self.observer!r}")
        lo, hi = self.value_range
        if not lo < hi:
            raise ValueError(f"value_range must be (low, high) with low < high, got {self.value_range}")

    @property
    def sees_central_noise(self) -> bool:
        """Whether the row's attacker sees the trusted server's DP noise: only an outsider does (the
        server that adds it and the eavesdropper on a client's link see the clipped update before it)."""
        return self.observer == OUTSIDER


#: who attacks in a row, and what it sees under central DP (one observer per row)
OBSERVERS = {
    "curious server": "the honest-but-curious server that aggregates: each client's message; under central DP the "
                      "clipped update before the noise it adds itself",
    "malicious server": "a server that deviates from the protocol; it would not add central DP's noise (n/a)",
    "eavesdropper": "a tap on one client's link: that client's messages; under central DP the clipped update (the "
                    "server adds the noise after the link)",
    "outsider": "sees only what the server releases, and knows every other client's update (the adversary of the DP "
                "guarantee): under central DP the target's clipped update plus the noise of the sum",
}
OUTSIDER = "outsider"
#: the range of a rate (AUC, share, accuracy) and of an error
UNIT, NONNEG = (0.0, 1.0), (0.0, math.inf)


#: the note of a cell that shows the naive attack under the adaptive one
NAIVE_NOTE = ("the cell is the attacker who knows the defense (DLG and Inverting Gradients under pruning and top-k "
              "match only the coordinates that were sent; under clipping, and under central DP where the curious server sees the "
              "clipped gradient before its own noise, DLG clips its dummy gradient to the same C); 'naive' is the same attack "
              "ignoring the defense, which overstates the defense (its dummy images start elsewhere in each column)")
#: suffix of a cell's value for the attack that ignores the defense, kept beside the adaptive attacker's:
#: ``"<row>|<column>@naive"`` in a record; the page prints it under the cell
NAIVE_SUFFIX = "@naive"
#: suffixes of the evidence that a mask-aware DLG or IG cell reached its optimum: the median over the images of the
#: attack's masked matching term (:func:`fedlab.attacks.gradient_inversion.matching_loss`; DLG's normalised L2, IG's
#: cosine) at the reconstruction (``"<column>@loss"``) and at the true images (``"<column>@loss_truth"``, 0 up to
#: rounding). A reached loss far above
#: the truth's means the optimiser stalled: the cell is then a lower bound on what leaks, not a measure of the defense
LOSS_SUFFIX, LOSS_TRUTH_SUFFIX = "@loss", "@loss_truth"


def _size(tiny: bool, *, tiny_value, quick, paper):
    """``tiny_value`` for the unit tests' tiny run, else :func:`fedlab.pick` of ``quick`` / ``paper``."""
    return tiny_value if tiny else pick(quick=quick, paper=paper)


def _gens(seed: int, salt: int):
    return torch.Generator().manual_seed(1000 * int(seed) + salt), np.random.default_rng(1000 * int(seed) + salt)


# ----------------------------------------------------------------------------------------------------
# row 1: DLG with the iDLG label (Chapter 1a)
def _protected_gradients(G: torch.Tensor, w: dict, columns: Sequence[str], fc: str, *, publics: list | None = None,
                         **protect_kwargs):
    """The gradient rows ``G`` ``[A, n]`` under each of ``columns`` in turn (:func:`protect_public`), as the
    attacker observes them: ``(views [len(columns) * A, n], the same as stacked parameters like w, iDLG's label
    of each view read off the last linear layer fc [len(columns) * A, 1])``; each column's public parameters
    are appended to ``publics`` when given."""
    pairs = [protect_public(G, c, **protect_kwargs) for c in columns]
    if publics is not None:
        publics.extend(p for _, p in pairs)
    views = torch.cat([v for v, _ in pairs])
    obs = models.unflatten_stacked(views, w)
    return views, obs, torch.tensor([[gi.idlg_label(obs[fc][i])] for i in range(len(views))])


def _dlg_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """DLG (Zhu et al. 2019) with the iDLG label rule (Zhao et al. 2020) on one-image FedSGD gradients of
    the sigmoid LeNet, 16 digits of 8x8 at quick scale, 3 calls of L-BFGS(20) as Chapter 1a's quick
    scale; under secure aggregation groups of 4 clients are summed and DLG inverts the mean gradient of
    4 images (labels learned). Under DP-FedAvg the curious server sees the clipped gradient before its
    own noise and, knowing ``C``, runs the clip-aware DLG (the cell equals the clipping cell's attack on
    the same input; the plain DLG stays as ``"<column>@naive"``); with ``outsider`` the attacker sees the
    noisy release instead (:data:`OUTSIDER_ROWS`). Metric: mean matched PSNR (dB)."""
    n_img = _size(tiny, tiny_value=4, quick=16, paper=32)
    steps, group = _size(tiny, tiny_value=2, quick=3, paper=15), 4
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=seed)
    w = models.get_params(net)
    digits = images.digit_images(n_img, seed=seed)
    X, y = digits.X, digits.y
    G = models.flatten_stacked(gi.per_example_gradients(net, w, X, y))
    fc = [k for k, v in w.items() if v.ndim == 2][-1]
    gen, rng = _gens(seed, 1)
    C = median_norm(G)
    out = {"baseline": float(np.mean(gi.psnr_baselines(X)["mean colour"]))}
    single = [c for c in columns if _defense(c).kind != "secagg"]
    if single:
        publics = []
        views, obs, labels = _protected_gradients(G, w, single, fc, clip_norm=C, generator=gen, rng=rng,
                                                  client_side_noise=outsider, publics=publics)
        res = gi.dlg(net, w, obs, input_shape=(1, 8, 8), num_classes=10, max_iter=gi.DLG_REFERENCE_MAX_ITER,
                     steps=steps, labels=labels, stacked=True, seed=seed)
        psnr = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(res.x, X.repeat(len(single), 1, 1, 1))])
        out.update({c: float(psnr[i * n_img:(i + 1) * n_img].mean()) for i, c in enumerate(single)})
        # the attacker who knows a sparsifying defense matches only the coordinates that were sent (the others
        # are exactly 0 in the update it sees): that is the cell; the plain DLG above stays as "<column>@naive"
        # and the attacker who knows the clipping bound C clips its dummy gradient to C before matching (the
        # curious server under central DP sees the clipped gradient before its own noise: the same attacker)
        # (a user defense: the attacker reads the public parameters its fn returned)
        for i, c in enumerate(single):
            d = _defense(c)
            sl = slice(i * n_img, (i + 1) * n_img)
            ob = {k: v[sl] for k, v in obs.items()}
            if d.kind == "user":
                if not publics[i]:
                    continue
                knows = {}
                if "mask" in publics[i]:
                    knows["mask"] = models.unflatten_stacked(publics[i]["mask"], w)
                if "clip_norm" in publics[i]:
                    knows["clip_norm"] = publics[i]["clip_norm"]
            elif d.kind not in ("prune", "clip") and not (d.kind == "dp" and not outsider):
                continue
            else:
                knows = ({"mask": {k: v != 0 for k, v in ob.items()}} if d.kind == "prune"
                         else {"clip_norm": float(C)})
            ada = gi.dlg(net, w, ob, input_shape=(1, 8, 8), num_classes=10, max_iter=gi.DLG_REFERENCE_MAX_ITER,
                         steps=steps, labels=labels[sl], stacked=True, seed=seed, **knows)
            out[c + NAIVE_SUFFIX] = out[c]
            out[c] = float(np.mean([gi.matched_psnr(r, t[None])[0] for r, t in zip(ada.x, X)]))
            if "mask" in knows:       # did the attack reach its optimum? DLG's masked loss reached vs at the truth
                lab = labels[sl]
                out[c + LOSS_SUFFIX] = float(gi.matching_loss(net, w, ada.x, lab, ob, mask=knows["mask"]).median())
                out[c + LOSS_TRUTH_SUFFIX] = float(gi.matching_loss(net, w, X[:, None], lab, ob,
                                                                    mask=knows["mask"]).median())
    if "secagg" in columns:
        sums = protect(G, "secagg", group=group, generator=gen) / group     # the server knows the group size
        res = gi.dlg(net, w, models.unflatten_stacked(sums, w), input_shape=(1, 8, 8), num_classes=10,
                     batch_size=group, max_iter=gi.DLG_REFERENCE_MAX_ITER, steps=steps, stacked=True, seed=seed)
        Xs = X.reshape(-1, group, 1, 8, 8)
        out["secagg"] = float(np.concatenate([gi.matched_psnr(r, t) for r, t in zip(res.x, Xs)]).mean())
    return out


# ----------------------------------------------------------------------------------------------------
# row 2: Inverting Gradients (Chapter 1a)
def _ig_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """Inverting Gradients (Geiping et al. 2020) on one-image gradients of the ReLU LeNet, colour crops,
    with the iDLG label read from the (defended) gradient, as Chapter 1a: 6 crops of 32x32, 300
    signed-Adam steps from 2 restarts at quick scale. Under secure aggregation 2 clients are summed and
    IG, given both true labels, inverts the sum (cosine distance: the scale does not matter). Under
    DP-FedAvg the curious server inverts the clipped gradient before its noise, an outsider
    (``outsider``) the noisy release. Metric: mean matched PSNR (dB)."""
    n_img, size = _size(tiny, tiny_value=2, quick=6, paper=8), 32
    iters, group = _size(tiny, tiny_value=40, quick=300, paper=1500), 2
    restarts = _size(tiny, tiny_value=1, quick=2, paper=4)
    crops = images.sample_image_crops(n_img, size=size, crop=4 * size, seed=seed + 1)
    public = images.sample_image_crops(32, size=size, crop=4 * size, seed=seed + 2).X
    net = models.lenet(3, 10, size, activation="relu", seed=seed)
    w = models.get_params(net)
    X, y = crops.X, crops.y
    G = models.flatten_stacked(gi.per_example_gradients(net, w, X, y))
    fc = [k for k, v in w.items() if v.ndim == 2][-1]
    gen, rng = _gens(seed, 2)
    C = median_norm(G)
    kw = dict(input_shape=(3, size, size), max_iter=iters, lr=0.1, tv_weight=0.1, num_restarts=restarts,
              init_mean=public.mean((0, 2, 3)), init_std=public.std((0, 2, 3)), stacked=True, seed=seed)
    out = {"baseline": float(np.mean(gi.psnr_baselines(X)["mean colour"]))}
    single = [c for c in columns if _defense(c).kind != "secagg"]
    if single:
        publics = []
        views, obs, labels = _protected_gradients(G, w, single, fc, clip_norm=C, generator=gen, rng=rng,
                                                  client_side_noise=outsider, publics=publics)
        res = gi.inverting_gradients(net, w, obs, labels=labels, **kw)
        psnr = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(res.x, X.repeat(len(single), 1, 1, 1))])
        out.update({c: float(psnr[i * n_img:(i + 1) * n_img].mean()) for i, c in enumerate(single)})
        # the attacker who knows a sparsifying defense (pruning, top-k; a user defense that publishes its mask)
        # compares only the coordinates that were sent, as DLG's row does: that is the cell, the plain IG above
        # stays as "<column>@naive" (one stacked run for every such column)
        sparse = [i for i, c in enumerate(single) if _defense(c).kind == "prune" or "mask" in publics[i]]
        if sparse:
            rows = torch.cat([torch.arange(i * n_img, (i + 1) * n_img) for i in sparse])
            ob = {k: v[rows] for k, v in obs.items()}
            mk = models.unflatten_stacked(torch.cat([publics[i]["mask"] if "mask" in publics[i]
                                                     else views[i * n_img:(i + 1) * n_img] != 0 for i in sparse]), w)
            ada = gi.inverting_gradients(net, w, ob, labels=labels[rows], mask=mk, **kw)
            p_ada = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(ada.x, X.repeat(len(sparse), 1, 1, 1))])
            # did it reach its optimum? IG's cosine matching term (its prior aside) reached vs at the true crops
            lab = labels[rows]
            reached = gi.matching_loss(net, w, ada.x, lab, ob, mask=mk, kind="cosine")
            truth = gi.matching_loss(net, w, X.repeat(len(sparse), 1, 1, 1)[:, None], lab, ob, mask=mk, kind="cosine")
            for j, i in enumerate(sparse):
                c, sl = single[i], slice(j * n_img, (j + 1) * n_img)
                out[c + NAIVE_SUFFIX] = out[c]
                out[c] = float(p_ada[sl].mean())
                out[c + LOSS_SUFFIX], out[c + LOSS_TRUTH_SUFFIX] = float(reached[sl].median()), float(truth[sl].median())
    if "secagg" in columns:
        sums = protect(G, "secagg", group=group, generator=gen)
        res = gi.inverting_gradients(net, w, models.unflatten_stacked(sums, w), labels=y.reshape(-1, group), **kw)
        Xs = X.reshape(-1, group, *X.shape[1:])
        out["secagg"] = float(np.concatenate([gi.matched_psnr(r, t) for r, t in zip(res.x, Xs)]).mean())
    return out


# ----------------------------------------------------------------------------------------------------
# row 3: imprint (Chapter 1a)
IMPRINT_TOL = 0.05


def _imprint_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """Robbing the Fed (Fowl et al. 2022): the malicious server sends the imprinted model of Chapter 1a
    (``imprint_model`` on a linear digit classifier, 64 bins, the server's Gaussian model of ``h(x)``);
    4 clients with 8 digits each compute their real gradient; the server reads inputs from the imprint
    layer's gradient of each client (of the 4-client sum under secure aggregation) with
    ``recover_from_imprint``. Metric: share of the 32 digits recovered within relative error 0.05
    (Chapter 1a asks 1e-4, exact, which no noise defense allows by construction)."""
    num_clients, batch, bins = 4, 8, _size(tiny, tiny_value=64, quick=64, paper=256)
    pool = load_digits().X.double()
    n = num_clients * batch
    idx = torch.as_tensor(np.random.default_rng(seed).choice(len(pool), size=n, replace=False))
    X = pool[idx]
    labels = torch.as_tensor(np.random.default_rng(seed + 1).integers(0, 10, n))
    direction = imp.imprint_layer(64, 1, mean=0.0, std=1.0, direction="random", seed=seed)[0][0]
    h = pool @ direction
    base = torch.nn.Linear(64, 10)
    with torch.no_grad():
        base.weight.copy_(torch.randn(10, 64, generator=torch.Generator().manual_seed(seed)) / 8.0)
        base.bias.zero_()
    model = imp.imprint_model(base, 64, bins, mean=float(h.mean()), std=float(h.std()), direction=direction,
                              seed=seed).double()
    names = [k for k, _ in model.named_parameters()]
    rows = []
    for c in range(num_clients):
        sl = slice(c * batch, (c + 1) * batch)
        loss = torch.nn.functional.cross_entropy(model(X[sl]), labels[sl])
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]))
    G = torch.stack(rows)
    like = {k: v.detach() for k, v in model.named_parameters()}
    iw, ib = names.index("imprint.weight"), names.index("imprint.bias")
    gen, rng = _gens(seed, 3)
    C = median_norm(G)

    def rate(views: torch.Tensor, truth: list[torch.Tensor]) -> float:
        obs = models.unflatten_stacked(views, like)
        hits = []
        for i, Xt in enumerate(truth):
            rec = imp.recover_from_imprint(obs[names[iw]][i], obs[names[ib]][i])
            hits.append(imp.match_recovered(Xt, rec.x) < IMPRINT_TOL)
        return float(torch.cat(hits).double().mean())

    chunks = list(X.reshape(num_clients, batch, 64))
    mean_digit = pool.mean(0, keepdim=True)
    out = {"baseline": float((imp.match_recovered(X, mean_digit) < IMPRINT_TOL).double().mean())}
    for c in columns:
        if c in _IMPRINT_NA:
            continue
        if _defense(c).kind == "secagg":
            out[c] = rate(protect(G, c, group=num_clients, generator=gen), [X])
        else:
            out[c] = rate(protect(G, c, clip_norm=C, generator=gen, rng=rng), chunks)
    return out


#: central DP trusts the server to add the noise: against every malicious-server row its cells are n/a
MALICIOUS_SERVER_DP_NA = ("central DP trusts the server to add the noise; this attacker is a malicious server, "
                          "which would not (client-side noise, LDP or d-privacy, is the comparable cell)")
_IMPRINT_NA = {k: MALICIOUS_SERVER_DP_NA for k in ("dp1", "dp1safe", "dp8")}
_MALICIOUS_NA = _IMPRINT_NA


# ----------------------------------------------------------------------------------------------------
# row 4: passive membership inference by the server (Chapter 1b)
def _mia_federation(seed: int, K: int, n: int):
    """Chapter 1b's federation: ``K`` clients of ``n`` digits each, every client's candidates (its ``n``
    members, then ``n`` non-members from held-out digits), the membership labels, the 64-64-10 MLP and a
    test set (held-out digits that are no client's and no candidate's).
    Returns ``(clients, cand_X [K, 2n, 64], cand_y [K, 2n], is_member [2n], net, test)``."""
    digits = load_digits()
    train, held = train_test_split(digits, test_fraction=0.5, seed=seed)
    nonmembers, test = train_test_split(held, test_fraction=0.5, seed=seed)
    parts = [p[:n] for p in partition_iid(len(train), K, seed=seed)]
    clients = fl.stack_clients(client_datasets(train, parts))
    nm = nonmembers.subset(np.arange(K * n))
    cand_X = torch.cat([clients.X, nm.X.reshape(K, n, 64)], dim=1)
    cand_y = torch.cat([clients.y, nm.y.reshape(K, n)], dim=1)
    is_member = np.r_[np.ones(n), np.zeros(n)]
    return clients, cand_X, cand_y, is_member, models.mlp(64, (64,), 10, seed=seed), test


def _mia_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """The passive server of Chapter 1b (Nasr et al. 2019 setting): 10 clients with 20 digits each train
    an MLP with FedAvg (all clients every round, 2 local epochs, B = 10, lr 0.3); the server scores each
    client's 20 members against 20 non-members by their loss under the models it observed, averaged over
    the last 10 rounds (:func:`fedlab.attacks.membership.attack_auc`, mean over clients). Every client
    applies the defense to its update each round and the aggregate is the mean of what was sent (for
    DP-FedAvg: :func:`fedlab.privacy.dp_fedavg.dp_aggregate`; for secure aggregation the secure sum,
    and the server observes only the global models). Under DP-FedAvg the curious server observes each
    client's clipped update before its noise (added to the released model it trains on); an outsider
    (``outsider``) observes the target's clipped update plus the noise of the sum (the release, all
    other updates known). ``C`` is the median update norm of the first
    round, then fixed. Metric: AUC. Also returns ``"acc_<column>"``: the test accuracy of the final global
    model under each column (the utility the defense leaves)."""
    K, n, window = 10, 20, 10
    num_rounds = 12 if tiny else _mia_rounds()
    clients, cand_X, cand_y, is_member, net, test = _mia_federation(seed, K, n)
    w0 = models.get_params(net)
    out = {"baseline": 0.5}
    fixed = {}
    for c in columns:
        d = _defense(c)
        gen, rng = _gens(seed, 4)
        batches = torch.Generator().manual_seed(seed)
        recorder = mia.SnapshotRecorder()

        def step(t, w, d=d, gen=gen, rng=rng, batches=batches, recorder=recorder):
            local = fl.clients_update(net, w, clients, lr=0.3, local_epochs=2, batch_size=10, generator=batches)
            U = models.flatten_stacked({k: local[k] - w[k] for k in w})
            theta = models.flatten_params(w)
            if t == 1:                                                 # C fixed from the first round's updates
                fixed["C"] = median_norm(U)
            C = fixed["C"]
            if d.kind == "dp":
                upd = models.unflatten_stacked(U, w)
                noisy, clean = dpf.dp_aggregate(upd, clip_norm=C, noise_multiplier=dp_noise_multiplier(d.param),
                                                expected_clients=K, generator=gen, safe=d.safe)
                noise = K * (models.flatten_params(noisy) - models.flatten_params(clean))
                clipped = protect(U, d, clip_norm=C, client_side_noise=False)
                # the server sees each clipped update before its noise; an outsider the release minus the others
                views = theta + clipped + noise if outsider else theta + clipped
                new = theta + models.flatten_params(noisy)
            elif d.kind == "secagg":
                new = theta + protect(U, d, group=K, generator=gen)[0] / K
                views = new.expand(K, -1)                              # the server sees the aggregate only
            else:
                sent = protect(U, d, clip_norm=C, generator=gen, rng=rng)
                views = theta + sent
                new = theta + sent.mean(0)
            recorder(fl.RoundRecord(t, w, np.arange(K), models.unflatten_stacked(views, w), torch.ones(K)))
            return models.unflatten_params(new, w)

        final, _, _ = fl.run_rounds(num_rounds, step, {k: v.clone() for k, v in w0.items()})
        signals = mia.client_signals(net, recorder, cand_X, cand_y)
        out[c] = mia.attack_auc(signals[:, -window:], is_member, window)
        out[f"acc_{c}"] = fl.evaluate(net, final, test.X, test.y)["accuracy"]
    return out


#: Chapter 1b's honest FedAvg rounds of the membership rows, (quick, paper)
_MIA_ROUNDS = (30, 100)


def _mia_rounds() -> int:
    return pick(quick=_MIA_ROUNDS[0], paper=_MIA_ROUNDS[1])


# ----------------------------------------------------------------------------------------------------
# row 5: local-model reconstruction by an eavesdropper (Chapter 4)
#: Chapter 4's first example: clients, share of clients per round, rounds
_MR_CLIENTS, _MR_FRACTION, _MR_ROUNDS = 5, 0.6, 60
#: participants per FedAvg round (:func:`fedlab.fl.fedavg`'s ``max(round(fraction K), 1)``): the secure sum's group
_MR_GROUP = max(int(round(_MR_FRACTION * _MR_CLIENTS)), 1)


def _mr_clients(seed: int):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k in range(_MR_CLIENTS):
        X = torch.randn(40 + 20 * k, 10, generator=g, dtype=torch.float64) + 0.3 * k
        y = X @ torch.randn(10, generator=g, dtype=torch.float64) + 0.1 * torch.randn(len(X), generator=g,
                                                                                     dtype=torch.float64)
        clients.append((X, y))
    return clients


def _mr_decode(theta_in: torch.Tensor, sent: torch.Tensor, clip_norm: float | None) -> torch.Tensor:
    """The eavesdropper's decoding of ``theta*`` from pairs ``(theta_in [P, d], theta_in + sent [P, d])``
    with :func:`fedlab.attacks.model_reconstruction.solve_affine`. With ``clip_norm`` the attacker knows the
    clipping bound ``C`` (as RAIFLE's rows do): a message of norm ``C`` (to relative 1e-9) was clipped, so
    it is ``u / lambda`` for the affine map's output ``u = M [theta_in; 1]`` and an unknown ``lambda >= 1``,
    a message shorter than ``C`` is ``u`` itself. Both are linear in ``(M, lambda)``: one least-squares
    solve (``P d`` equations, ``d (d + 1) + #clipped`` unknowns; it needs one unclipped message to fix
    the scale) restores the clipped messages' length, and ``solve_affine`` decodes from all pairs. With no
    unclipped message, or fewer equations than unknowns, it decodes from the messages as they are."""
    ti, u = theta_in.double(), sent.double()
    if clip_norm is not None:
        clipped = u.norm(dim=1) >= clip_norm * (1 - 1e-9)
        P, d = u.shape
        m = int(clipped.sum())
        if 0 < m < P and P * d >= d * (d + 1) + m:
            X = torch.cat([ti, torch.ones(P, 1, dtype=torch.float64)], 1)             # [P, d + 1]
            A = torch.zeros(P, d, d * (d + 1) + m, dtype=torch.float64)
            A[:, :, :d * (d + 1)] = torch.stack([torch.kron(torch.eye(d, dtype=torch.float64), x[None]) for x in X])
            A[clipped.nonzero()[:, 0], :, d * (d + 1) + torch.arange(m)] = -u[clipped]
            rhs = torch.where(clipped[:, None], torch.zeros_like(u), u)
            sol = torch.linalg.lstsq(A.reshape(P * d, -1), rhs.reshape(-1, 1)).solution[:, 0]
            u = u.clone()
            u[clipped] = u[clipped] * sol[d * (d + 1):, None]
    return mr.solve_affine(ti, ti + u).theta


def _mr_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The eavesdropper of Chapter 4 (Xu & Neglia 2021): 5 linear-regression clients (Chapter 4's first
    example), FedAvg with 60% of the clients per round (3 of 5), 3 local full-batch steps, lr 0.01, 60
    rounds; the eavesdropper records every (server model, returned model) pair of client 0 and decodes
    its local optimum with :func:`fedlab.attacks.model_reconstruction.solve_affine` (OLS over the observed
    rounds). Client-side defenses are applied to client 0's messages (the decoding uses only those pairs);
    when a column clips, the eavesdropper knows ``C`` and restores the length of the messages of norm
    ``C`` before decoding (:func:`_mr_decode`). DP-FedAvg runs :func:`fedlab.fl.dp_fedavg.dp_fedavg` as McMahan et al.'s
    Algorithm 1: the client clips its update, the trusted server adds the noise after the tapped link, so
    the eavesdropper sees the clipped update (and broadcast models that carry the earlier rounds' noise).
    Under secure aggregation the eavesdropper sees only the masked messages, so it decodes from the
    round's aggregate of the 3 participants. Metric: relative error ``||theta_hat - theta*|| / ||theta*||``."""
    clients = _mr_clients(seed)
    theta_star = mr.local_optimum(*clients[0])
    kw = dict(num_rounds=_MR_ROUNDS, local_epochs=3, batch_size=None, lr=0.01, loss_fn=mr.squared_loss, seed=seed)
    net = mr.linear_model(10, seed=seed)
    res, spy = mr.run_eavesdropped_fedavg(net, clients, targets=None, client_fraction=_MR_FRACTION, **kw)
    rel = lambda th: float((th - theta_star).norm() / theta_star.norm())   # noqa: E731
    t_in, t_out, rounds = spy.observations(0)
    gen, rng = _gens(seed, 5)
    U = (t_out - t_in)
    C = median_norm(U)
    out = {"baseline": rel(models.flatten_params(res.params).double())}
    for c in columns:
        d = _defense(c)
        if d.kind == "dp":
            pairs = []

            def spy_dp(r, d=d):
                if 0 in r.selected.tolist():
                    j = r.selected.tolist().index(0)
                    th = models.flatten_params(r.global_params).double()
                    u = models.flatten_params({k: v[j] for k, v in r.updates.items()}).double()
                    # Algorithm 1: client 0 clips before sending; the server's noise comes after the link
                    pairs.append((th, protect(u[None], d, clip_norm=C, client_side_noise=False)[0]))

            z = dp_noise_multiplier(d.param)
            dp_fedavg(mr.linear_model(10, seed=seed), clients, sampling_prob=_MR_FRACTION, noise_multiplier=z,
                      clip_norm=C, callback=spy_dp, safe=d.safe, **kw)   # float or discrete Gaussian
            ti, sent = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            out[c] = rel(_mr_decode(ti, sent, C))
            continue
        elif d.kind == "secagg":
            ti, to = [], []
            for r in rounds:
                outs = [spy.observations(k) for k in range(5)]
                sel = [(o[0][o[2] == r][0], o[1][o[2] == r][0], len(clients[k][1])) for k, o in enumerate(outs)
                       if (o[2] == r).any()]
                th = sel[0][0]
                wts = torch.tensor([s[2] for s in sel], dtype=torch.float64)
                msgs = torch.stack([(s[1] - th) * s[2] for s in sel])
                agg = protect(msgs, d, group=len(sel), generator=gen)[0] / wts.sum()
                ti.append(th)
                to.append(th + agg)
            ti, to = torch.stack(ti), torch.stack(to)
            out[c] = rel(mr.solve_affine(ti.double(), to.double()).theta)
        elif d.kind == "user":                  # the eavesdropper knows the clipping bound the defense publishes
            sent, public = protect_public(U, d, generator=gen)
            out[c] = rel(_mr_decode(t_in, sent, public.get("clip_norm")))
        else:
            out[c] = rel(_mr_decode(t_in, protect(U, d, clip_norm=C, generator=gen, rng=rng),
                                    C if d.kind == "clip" else None))
    return out


def _mia_active_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The isolating server of Chapter 1b with Nasr et al.'s gradient ascent (gamma = 2): after Chapter 1b's
    30 honest FedAvg rounds (10 clients x 20 digits, MLP), the server runs 5 attack rounds against each
    of the 10 clients in turn (:func:`fedlab.attacks.membership.active_attack_rounds`, ``isolate=True``),
    and scores the target's candidates by their mean loss under the models the target returned. The
    defenses act on the target's returned update (model returned minus model received) of the
    undefended run's trace: the attacker's observations change, the run's trajectory does not (a
    simplification). DP-FedAvg: the target's clipped update plus the noise of the sum; secure
    aggregation: the server sees only the average of all returned models (the target's among the nine
    others'), so isolation no longer shows it the target alone. Metric: AUC (mean over targets)."""
    K, n, gamma = 10, 20, 2.0
    rounds = _size(tiny, tiny_value=3, quick=5, paper=10)
    honest_rounds = 12 if tiny else _mia_rounds()
    fl_args = dict(local_epochs=2, batch_size=10, lr=0.3)
    clients, cand_X, cand_y, is_member, net, _ = _mia_federation(seed, K, n)
    honest = fl.fedavg(net, clients, num_rounds=honest_rounds, params=models.get_params(net), seed=seed,
                       progress=False, **fl_args)
    traces = [mia.active_attack_rounds(net, clients, honest.params, cand_X[k], cand_y[k], target=k, num_rounds=rounds,
                                       ascent_lr=gamma, attacker="server", isolate=True, seed=seed + 1,
                                       return_trace=True, **fl_args) for k in range(K)]
    like = honest.params
    received = torch.stack([models.flatten_params(p) for tr in traces for p in tr["received"]])    # [K * rounds, n]
    returned = torch.stack([models.flatten_params(p) for tr in traces for p in tr["returned"]])
    others = torch.stack([models.flatten_params(p) for tr in traces for p in tr["global"]])
    U = returned - received
    C = median_norm(U)
    gen, rng = _gens(seed, 10)
    out = {"baseline": 0.5}
    for c in columns:
        d = _defense(c)
        if d.kind == "secagg":
            views = (returned + (K - 1) * others) / K
        else:
            views = received + protect(U, d, clip_norm=C, generator=gen, rng=rng)
        aucs = []
        for k in range(K):
            rows = models.unflatten_stacked(views[k * rounds:(k + 1) * rounds], like)
            S = torch.stack([mia.per_example_loss(net, {name: v[t] for name, v in rows.items()}, cand_X[k], cand_y[k])
                             for t in range(rounds)])
            aucs.append(mia.attack_auc(S, is_member, rounds))
        out[c] = float(np.mean(aucs))
    return out


# ----------------------------------------------------------------------------------------------------
# row 5b: PAC identifiability of the user vector (Chapter 2)
def _pac_interactions() -> int:
    """Theorem 1's ``T`` of the PAC row (failure probability 0.05 at its largest preference rate, 0.45)."""
    return math.ceil(pac.theorem1_num_interactions(0.45, 10, 0.05))


def _pac_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """Protocol 2 of London (2020), Chapter 2's attack: a malicious server sends an all-zero item model,
    each user runs Protocol 1's CLIENTUPDATE (B = 10, lr 0.3, log loss) and returns its item deltas, and
    after ``T`` interactions (Theorem 1's ``T`` for failure probability 0.05 at the largest preference
    rate) the server estimates every user vector (:func:`fedlab.attacks.identifiability.protocol2_attack`,
    its ``client`` wrapped so that each message goes through the defense; ``C`` is the median norm of
    the first messages). Synthetic low-rank data as Chapter 2 (200 items, k = 6, 50 rated, preference
    rates 0.05-0.45), 100 users at quick scale. Secure aggregation: Protocol 2's own cohorts of 4 (the
    server sees the sum of each cohort's messages; the cohort's first user is the target). Metric: sign
    accuracy, the share of the catalogue whose like/dislike the estimate predicts right (1 - Definition 1's
    sign error)."""
    users = _size(tiny, tiny_value=20, quick=100, paper=500)
    items, dim, rated, batch, lr, cohort = 200, 6, 50, 10, 0.3, 4
    data = rec.make_synthetic(users, items, dim, rated, torch.linspace(0.05, 0.45, users), seed=seed)
    T = math.ceil(pac.theorem1_num_interactions(float(data.pref_rate.max()), batch, 0.05))
    out = {"baseline": float((data.labels < 0).double().mean())}          # always predict "dislike"
    for c in columns:
        d = _defense(c)
        gen, rng = _gens(seed, 9)
        fixed = {}

        def client(u, probe, its, y, *, local_steps, batch_size, lr, loss, generator=None, d=d, gen=gen, rng=rng,
                   fixed=fixed):
            u2, deltas = rec.protocol1_client_update(u, probe, its, y, local_steps=local_steps, batch_size=batch_size,
                                                     lr=lr, loss=loss, generator=generator)
            if local_steps == 0 or d.kind == "secagg":
                return u2, deltas
            flat = deltas.reshape(deltas.shape[0], -1)
            fixed.setdefault("C", median_norm(flat))
            return u2, protect(flat, d, clip_norm=fixed["C"], generator=gen, rng=rng).reshape(deltas.shape)

        group = cohort if d.kind == "secagg" else 1
        res = pac.protocol2_attack(data.user_vectors, data.items, data.y, num_interactions=T, batch_size=batch,
                                   lr=lr, loss="log", num_items=items, cohort_size=group, client=client,
                                   generator=torch.Generator().manual_seed(seed))
        err = pac.sign_error(res.final, data.user_vectors[::group], data.item_vectors)
        out[c] = float(1.0 - err.mean())
    return out


# ----------------------------------------------------------------------------------------------------
# row 6: RAIFLE against federated collaborative filtering (Chapter 3a)
_CLIPPING = ("clip", "dp", "ldp")     # columns whose clipping the attacker reproduces (RAIFLE's "knows the clip")


def _rs_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """RAIFLE (Sec. 4.2, Algorithm 1) against FCF with the user embedding estimated (Chapter 3a's
    "FCF emb", the configuration that leaks): synthetic MovieLens-100K (the offline default), 16 users
    (quick) with 4 sampled negatives per positive, 64-dimensional embeddings, 1000 L-BFGS evaluations and
    2 restarts per user (:func:`fedlab.experiments.chapter3a.attack_case`), the users' clipping reproduced
    when a column clips. The defense acts on each user's whole item update (padding stays 0: it is
    never sent). Under secure aggregation groups of 4 users send catalogue-wide updates and the server
    attacks each group's first user with the sum restricted to that user's items. Under DP-FedAvg the
    curious server sees the clipped update before its noise, an outsider (``outsider``) the noisy release.
    Metric: mean AUC over users of the inferred interactions."""
    U, group = _size(tiny, tiny_value=4, quick=16, paper=40), 4
    iters = _size(tiny, tiny_value=100, quick=1000, paper=1000)
    data = synthetic_movielens(seed=seed)
    users = np.sort(np.random.default_rng(seed).choice(data.num_users, U, replace=False))
    ui = sample_user_items(data, neg_ratio=4, users=users, seed=seed)
    case = ch3a.make_recsys_case(ui, data.num_items, dim=64, fncf_lr=1.0, local_steps=1, seed=seed)
    mask = case.mask[..., None].to(case.fcf.dtype)
    flat = case.fcf.reshape(U, -1)
    gen, rng = _gens(seed, 6)
    C = median_norm(flat)
    out = {"baseline": 0.5}
    for c in columns:
        d = _defense(c)
        if d.kind == "secagg":
            dim = case.fcf.shape[-1]
            cat = torch.zeros(U, data.num_items, dim, dtype=case.fcf.dtype)
            for u in range(U):
                m = case.mask[u]
                cat[u].index_add_(0, ui.items[u][m], case.fcf[u][m])
            sums = protect(cat.reshape(U, -1), d, group=group, generator=gen).reshape(-1, data.num_items, dim)
            targets = list(range(0, U, group))
            sub = case.subset(targets)
            m = sub.mask.shape[1]
            views = torch.stack([sums[g][ui.items[u][:m]] for g, u in enumerate(targets)]) * sub.mask[..., None]
            res = ch3a.attack_case(sub, "fcf", estimate_embedding=True, fcf=views.to(case.fcf.dtype),
                                   max_iter=iters, num_restarts=2, seed=seed)
        else:
            views, public = protect_public(flat, d, clip_norm=C, generator=gen, rng=rng, client_side_noise=outsider)
            views = views.reshape(case.fcf.shape) * mask
            knows = public.get("clip_norm") if d.kind == "user" else C if d.kind in _CLIPPING else None
            res = ch3a.attack_case(case, "fcf", estimate_embedding=True, fcf=views,
                                   clip_norm=knows, max_iter=iters, num_restarts=2, seed=seed)
        out[c] = float(res["auc"].mean())
    return out


# ----------------------------------------------------------------------------------------------------
# rows 7-8: RAIFLE against federated online learning to rank, without and with ADM (Chapter 3b)
def _oltr_row(seed: int, columns: Sequence[str], tiny: bool = False, *, adm: bool, outsider: bool = False) -> dict:
    """RAIFLE against FPDGD (Chapter 3b): synthetic LETOR (the offline default, 300 queries at quick
    scale), the linear ranker, 32 users (quick) with 8 queries each, informational clicks, lr 0.1,
    35 L-BFGS evaluations (:func:`fedlab.attacks.interaction_inference.oltr.attack_oltr`); with ``adm``
    the server first fingerprints the features (ADM, RAIFLE Sec. 3.3). The users' clipping is reproduced
    when a column clips. Secure aggregation: groups of 4 users; without ADM the server attacks each
    group's first user with the group's sum; with ADM it runs RAIFLE's bypass (Sec. 3.4.2,
    :func:`fedlab.experiments.chapter3b.sa_bypass_experiment`, one query, 4 groups of 4). Under DP-FedAvg
    the curious server sees the clipped update before its noise, an outsider (``outsider``) the noisy
    release. Metric: mean AUC over users of the inferred clicks."""
    U, Q, group = _size(tiny, tiny_value=8, quick=32, paper=64), 8, 4
    iters = _size(tiny, tiny_value=20, quick=35, paper=200)
    data = synthetic_letor(_size(tiny, tiny_value=100, quick=300, paper=1000), seed=seed)
    case = ro.make_oltr_case(data, U, Q, (), click_model="informational", adm=adm, lr=0.1, seed=seed + 11)
    gen, rng = _gens(seed, 7 + int(adm))
    C = median_norm(case.update)
    out = {"baseline": 0.5}
    for clipped in (True, False):
        cols = [c for c in columns if _defense(c).kind not in ("secagg", "user")
                and (_defense(c).kind in _CLIPPING) == clipped]
        if not cols:
            continue
        views = torch.cat([protect(case.update, c, clip_norm=C, generator=gen, rng=rng, client_side_noise=outsider)
                           for c in cols])
        auc = ro.attack_oltr(ro.cat_cases([case] * len(cols)), views, clip_norm=C if clipped else None,
                             max_iter=iters, seed=seed)
        out.update({c: float(auc[i * U:(i + 1) * U].mean()) for i, c in enumerate(cols)})
    for c in [c for c in columns if _defense(c).kind == "user"]:     # the clipping bound it publishes, if any
        view, public = protect_public(case.update, c, generator=gen)
        auc = ro.attack_oltr(case, view, clip_norm=public.get("clip_norm"), max_iter=iters, seed=seed)
        out[c] = float(auc.mean())
    if "secagg" in columns:
        if adm:
            D = torch.arange(data.num_features) < data.num_features // 2
            runs = [ch3b.sa_bypass_experiment(data, (), group, D, lr=0.1, max_iter=iters, seed=seed + 100 * t,
                                              generator=torch.Generator().manual_seed(1000 * seed + t))
                    for t in range(U // group)]
            out["secagg"] = float(np.mean([r["auc"] for r in runs]))
        else:
            sums = protect(case.update, "secagg", group=group, generator=gen)
            auc = ro.attack_oltr(case.subset(list(range(0, U, group))), sums.to(case.update.dtype),
                                 max_iter=iters, seed=seed)
            out["secagg"] = float(auc.mean())
    return out


def _oltr_plain(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    return _oltr_row(seed, columns, tiny, adm=False, outsider=outsider)


def _oltr_adm(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    return _oltr_row(seed, columns, tiny, adm=True)


#: the columns of an outsider row: the undefended reference and central DP, the one defense whose release differs
#: from each client's message (under a client-side defense an outsider who knows every other update sees the
#: target's message, which is the curious server's cell)
OUTSIDER_COLUMNS = ("none", "dp1", "dp1safe", "dp8")
OUTSIDER_SAME = ("not computed for the outsider: knowing every other client's update, it sees under this defense "
                 "the target's own message, the curious server's view (that row's cell, above)")


def _outsider(run: Callable[..., dict]) -> Callable[..., dict]:
    def row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
        return run(seed, columns, tiny, outsider=True)
    return row


ATTACKS: tuple[Attack, ...] = (
    Attack("dlg", "DLG / iDLG (digits, one image per client)", "01a_gradient_leakage", "mean PSNR (dB)", True,
           "honest-but-curious server inverts each client's FedSGD gradient", _dlg_row,
           "PSNR of each digit's mean-colour image", secagg_group=4),
    Attack("ig", "Inverting Gradients (colour crops)", "01a_gradient_leakage", "mean PSNR (dB)", True,
           "honest-but-curious server inverts each client's gradient (cosine distance + TV prior)", _ig_row,
           "PSNR of each crop's mean-colour image", secagg_group=2),
    Attack("imprint", "Imprint (Robbing the Fed)", "01a_gradient_leakage", "share of digits recovered", True,
           "malicious server sends an imprinted model and reads inputs from the gradient", _imprint_row,
           "share of digits the pool's mean digit matches", not_applicable=_IMPRINT_NA, secagg_group=4,
           observer="malicious server", value_range=UNIT),
    Attack("mia", "Membership inference, passive server", "01b_membership_inference", "AUC", True,
           "honest-but-curious server scores members by their loss under the models it observes", _mia_row,
           "chance AUC", secagg_group=10, releases=lambda: (_mia_rounds(), 1.0), value_range=UNIT),
    Attack("mia_active", "Membership inference, active server (isolation + gradient ascent)",
           "01b_membership_inference", "AUC", True,
           "malicious server isolates the target and ascends the loss of the candidates before sending the model",
           _mia_active_row, "chance AUC", not_applicable=_MALICIOUS_NA, secagg_group=10,
           releases=lambda: (pick(quick=5, paper=10), 1.0), observer="malicious server", value_range=UNIT),
    Attack("pac", "PAC identifiability (Protocol 2)", "02_pac_identifiability", "sign accuracy", True,
           "malicious server sends a zero item model and estimates each user vector from the item deltas",
           _pac_row, "accuracy of always predicting 'dislike'", not_applicable=_MALICIOUS_NA, secagg_group=4,
           releases=lambda: (_pac_interactions(), 1.0), observer="malicious server", value_range=UNIT),
    Attack("rs", "RAIFLE, recommendation (FCF, embedding estimated)", "03a_raifle_recsys", "AUC", True,
           "curious server infers which items a user interacted with from its item-embedding update", _rs_row,
           "chance AUC", secagg_group=4, value_range=UNIT,
           cell_notes={"secagg": "an upper bound: the server attacks the group's sum restricted to the target's own "
                                 "item set, which it is given (an attacker without it would search the group's union)"}),
    Attack("oltr", "RAIFLE, online learning to rank", "03b_raifle_oltr", "AUC", True,
           "curious server infers a user's clicks from its ranker update", _oltr_plain, "chance AUC",
           secagg_group=4, value_range=UNIT),
    Attack("oltr_adm", "RAIFLE, online learning to rank + ADM", "03b_raifle_oltr", "AUC", True,
           "active server manipulates the documents' features (ADM) before inferring the clicks", _oltr_adm,
           "chance AUC", not_applicable=_MALICIOUS_NA, secagg_group=4, observer="malicious server",
           value_range=UNIT,
           cell_notes={"secagg": "a different experiment: RAIFLE's bypass (Chapter 3b's sa_bypass_experiment), one "
                                 "query per user, groups of 4, a fresh ranker per group, not the row's 8-query case"}),
    Attack("mr", "Local-model reconstruction (eavesdropper)", "04_model_reconstruction", "relative error", False,
           "eavesdropper on client 0's link decodes its local optimum from (sent, returned) model pairs", _mr_row,
           "relative error of the released global model", secagg_group=_MR_GROUP,
           releases=lambda: (_MR_ROUNDS, _MR_FRACTION), observer="eavesdropper", value_range=NONNEG),
)


def _outsider_row(a: Attack) -> Attack:
    """The outsider's twin of curious-server row ``a``: the same attack on the released noisy aggregate, all
    other updates known, in the columns :data:`OUTSIDER_COLUMNS` (the others would repeat ``a``'s cells)."""
    na = {d.key: OUTSIDER_SAME for d in DEFENSES if d.key not in OUTSIDER_COLUMNS}
    return Attack(f"{a.key}_outsider", f"{a.label}: outsider who sees the release", a.chapter, a.metric,
                  a.higher_is_success, f"outsider who sees the released aggregate and knows every other update "
                  f"runs the same attack ({_OUTSIDER_TASK[a.key]})", _outsider(a.run), a.baseline, not_applicable=na,
                  releases=a.releases, observer=OUTSIDER, value_range=a.value_range)


_OUTSIDER_TASK = {"dlg": "DLG on the target's gradient read off the release", "ig": "Inverting Gradients on the "
                  "target's gradient read off the release", "mia": "loss scores under the target's model read off "
                  "each release", "rs": "RAIFLE on the target's item update read off the release",
                  "oltr": "RAIFLE on the target's ranker update read off the release"}




# ----------------------------------------------------------------------------------------------------
# the malicious server inside SecAgg+, through Flower's SecAgg+ (fedlab.flower)
#: the row's key; its cells run :func:`fedlab.flower.run` with ``secagg=True``
SECAGG_ROW = "secagg_lie"
#: the malicious server's attacks inside SecAgg+ (:mod:`fedlab.flower.attacks`), in the order the row runs them
SECAGG_ATTACKS = ("false_dropout", "split_view", "inconsistent_model")
#: clients of the SecAgg+ round (Chapter 6's FedSGD federation) and FedSGD's learning rate
_SA_CLIENTS, _SA_LR = 8, 0.1
#: the SecAgg+ settings of the consistency column: Bonawitz et al.'s consistency round needs ``t > n / 2``
#: (Chapter 6: at the default ``t`` every client refuses the setup); stock SecAgg+ keeps Flower's defaults
SECAGG_CONSISTENT_SETTINGS = {"reconstruction_threshold": 0.6}
#: the cell note of the consistency column: what the row does when the clients refuse
SECAGG_REFUSED_NOTE = ("when the clients refuse (or the attack cannot be mounted), the round stops before the server "
                       "gets any share of a survivor's key; the server's best is then an honest round, whose sum is "
                       "the row's baseline: the cell is that sum's inversion")


def _secagg_lie_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The malicious server inside secure aggregation (Chapter 6; Bonawitz et al. 2017, Sec. 6-7): one FedSGD
    round of Chapter 6's federation (:func:`fedlab.experiments.chapter6.fedsgd_clients`: 8 clients, one digit
    each, the sigmoid LeNet, lr 0.1) through **Flower's SecAgg+** (:func:`fedlab.flower.run` with
    ``secagg=True``, in-process engine), the target client ``seed % 8``. The server mounts each attack of
    :data:`SECAGG_ATTACKS` (:class:`fedlab.flower.attacks.FalseDropout`, :class:`~fedlab.flower.attacks.SplitView`,
    :class:`~fedlab.flower.attacks.InconsistentModel` with the zero decoy) against stock SecAgg+ (column
    ``secagg``, Flower's default settings) and against SecAgg+ with the consistency round (column
    ``secagg_cr``: ``consistency=True`` with :data:`SECAGG_CONSISTENT_SETTINGS`).

    Metric: the PSNR (dB) of the attacker's best reconstruction of the target's digit, iDLG on the target's
    FedSGD gradient ``(w_global - w_target) / lr`` as Chapter 6 (:func:`fedlab.flower.attacks.invert_model`),
    with the target's model as the server recovered it: unmasked alone (false dropout, split view), or isolated
    from the decoded sum on the parameters the decoy silences (model inconsistency; DLG then matches only
    those, labels learned: the output layer is not isolated). A round that completes without exposing the
    target, one the clients refuse, and an attack that cannot be mounted leave the server the honest round's
    sum (:data:`SECAGG_REFUSED_NOTE`): iDLG on the sum of the 8 models is the row's **baseline** (the sum-only
    view secure aggregation promises). Column ``none``: no secure aggregation, the server reads the target's
    model from the plain Flower round. A cell is the best of the three attacks; each attack's value is kept as
    ``"<column>@<attack>"``, and ``"<column>@exposed"`` counts the attacks that got the target's model.
    ``tiny``: fewer L-BFGS iterations (40 instead of 100). Needs the ``flower`` extra. Raises ``ValueError``
    for a column other than ``none``, ``secagg`` and ``secagg_cr``."""
    from .. import flower
    from ..flower import attacks as fa
    from . import chapter6 as ch6

    bad = [c for c in columns if c not in ("none", "secagg", "secagg_cr")]
    if bad:
        raise ValueError(f"columns: row {SECAGG_ROW!r} has only the columns none, secagg and secagg_cr, got {bad}")
    iters = _size(tiny, tiny_value=40, quick=100, paper=300)
    target = int(seed) % _SA_CLIENTS
    victims, lenet = ch6.fedsgd_clients(seed, _SA_CLIENTS)
    args = dict(num_rounds=1, lr=_SA_LR, local_epochs=1, batch_size=None, seed=seed, engine="local")
    x_true = victims[target][0]
    plain = flower.run(lenet, victims, **args)
    w0 = plain.transcript.globals[0]

    def invert(w: Mapping) -> float:
        return float(fa.invert_model(lenet, w0, w, lr=_SA_LR, input_shape=(1, 8, 8), num_classes=10, max_iter=iters,
                                     x_true=x_true, seed=seed)[2])

    def invert_silenced(w: Mapping, silent: Sequence[str]) -> float:
        grad = {k: ((torch.as_tensor(w0[k]).double() - torch.as_tensor(w[k]).double()) / _SA_LR)
                .to(torch.as_tensor(w0[k]).dtype)[None] for k in w0}
        mask = {k: torch.full_like(v, k in silent, dtype=torch.bool) for k, v in grad.items()}
        res = gi.dlg(lenet(), dict(w0), grad, input_shape=(1, 8, 8), num_classes=10, batch_size=1, max_iter=iters,
                     stacked=True, seed=seed, mask=mask)
        return float(gi.matched_psnr(res.x[0], x_true)[0])

    honest = ch6.secagg_outcome(lambda: flower.run(lenet, victims, secagg=True, **args))
    if not honest["completed"] or honest["exposed"]:
        raise RuntimeError(f"the honest SecAgg+ round did not complete with nothing exposed: {honest['reason']}")
    base = invert(honest["run"].params)
    out = {"baseline": base}
    if "none" in columns:
        out["none"] = invert({r.partition_id: r.params for r in plain.transcript.train_replies(1)}[target])
    decoy = fa.zero_decoy(lenet)
    probes = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
    attacks = {"false_dropout": lambda: fa.FalseDropout(target), "split_view": lambda: fa.SplitView(target),
               "inconsistent_model": lambda: fa.InconsistentModel(target, decoy)}
    for c in [c for c in columns if c != "none"]:
        consistency = c == "secagg_cr"
        settings = dict(SECAGG_CONSISTENT_SETTINGS) if consistency else None
        got, exposed = {}, 0
        for name in SECAGG_ATTACKS:
            o = ch6.secagg_outcome(lambda name=name: flower.run(
                lenet, victims, secagg=True, secagg_attack=attacks[name](), consistency=consistency,
                secagg_settings=settings, **args))
            if target in o["exposed"]:
                got[name], exposed = invert(ch6.exposed_model(o, target)), exposed + 1
            elif name == "inconsistent_model" and o["completed"]:
                silent = fa.silenced_parameters(lenet, decoy, probes, torch.arange(32) % 10)
                if silent:
                    w = fa.isolate_from_aggregate(o["run"].transcript, target, decoy)
                    got[name], exposed = invert_silenced(w, silent), exposed + 1
                else:
                    got[name] = invert(o["run"].params)
            elif o["completed"]:
                got[name] = invert(o["run"].params)         # the sum of a round that exposed nothing
            else:
                got[name] = base                             # refused: an honest round's sum is all the server gets
        out[c] = max(got.values())
        out.update({f"{c}@{name}": v for name, v in got.items()})
        out[f"{c}@exposed"] = float(exposed)
    return out


#: the row group of the malicious server inside SecAgg+: every column but these is n/a in its row
SECAGG_COLUMNS = ("none", "secagg", "secagg_cr")
_SECAGG_ONLY = ("a column of the malicious-server-in-SecAgg+ row only: the consistency round guards against a server "
                "that lies inside the protocol; against this row's attacker it is secure aggregation (its column)")
_SECAGG_ROW_NA = ("this row attacks the secure-aggregation protocol itself (Flower's SecAgg+); the column's defense "
                  "is no secure aggregation, so the row has no such cell (the malicious server's attacks on the other "
                  "defenses are the imprint, active membership, PAC and ADM rows)")

SECAGG_ROWS: tuple[Attack, ...] = (
    Attack(SECAGG_ROW, "Malicious server inside SecAgg+ (false dropout, split view, model inconsistency)", "06_flower",
           "PSNR (dB) of the target's digit", True,
           "malicious server lies inside Flower's SecAgg+ to unmask or isolate the target's model, then runs iDLG on it",
           _secagg_lie_row, "iDLG on the honest round's sum of 8 models (what SecAgg+ promises)",
           not_applicable={d.key: _SECAGG_ROW_NA for d in DEFENSES if d.key not in SECAGG_COLUMNS},
           secagg_group=_SA_CLIENTS, observer="malicious server",
           cell_notes={"secagg_cr": SECAGG_REFUSED_NOTE}),
)


#: the outsider row group: for every curious-server row that central DP applies to, the same
#: attack by an outsider who sees only the noisy release (the adversary DP-FedAvg's guarantee is stated against)
OUTSIDER_ROWS: tuple[Attack, ...] = tuple(_outsider_row(a) for a in ATTACKS if a.observer == "curious server")
ATTACKS = tuple(replace(a, not_applicable={**a.not_applicable, "secagg_cr": _SECAGG_ONLY})
                for a in ATTACKS + OUTSIDER_ROWS) + SECAGG_ROWS
_ATTACK_BY_KEY = {a.key: a for a in ATTACKS}


def _attack(row) -> Attack:
    a = _ATTACK_BY_KEY.get(row) if isinstance(row, str) else row
    if not isinstance(a, Attack):
        raise ValueError(f"row must be one of {list(_ATTACK_BY_KEY)}, got {row!r}")
    return a


def _columns(columns) -> list[str]:
    return _resolve_columns(columns)[0]


def _resolve_columns(columns) -> tuple[list[str], dict]:
    """``columns`` (keys of :data:`DEFENSES`, library :class:`Defense` objects or user defenses) as
    ``(keys, {key: user Defense})``. Raises ``ValueError`` naming ``columns`` for an unknown key, a
    non-Defense entry, a user defense whose key is a library key, or a key given twice."""
    if isinstance(columns, (str, Defense)):
        raise ValueError(f"columns must be a sequence of column keys or Defense objects, got {columns!r}")
    cols = [d.key for d in DEFENSES] if columns is None else list(columns)
    keys, user, bad = [], {}, []
    for c in cols:
        if isinstance(c, Defense) and c.kind == "user":
            if c.key in _BY_KEY:
                raise ValueError(f"columns: user defense key {c.key!r} is a library column's key; pick another")
            user[c.key] = c
            keys.append(c.key)
        elif isinstance(c, Defense) and _BY_KEY.get(c.key) == c:
            keys.append(c.key)
        elif isinstance(c, str) and c in _BY_KEY:
            keys.append(c)
        else:
            bad.append(c)
    if bad or not cols:
        raise ValueError(f"columns must be keys of DEFENSES {list(_BY_KEY)} or user Defense objects "
                         f"(Defense(key, label, 'user', fn=...)), got {bad or cols}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"columns: a key is given twice, got {keys}")
    return keys, user


def run_row(row, seed: int, columns: Sequence | None = None, *, tiny: bool = False) -> dict:
    """Every applicable cell of attack ``row`` (an :class:`Attack` or its key) at ``seed``, the columns
    ``columns`` (default: all library columns) in one call; ``tiny`` shrinks every size to a few seconds a
    row (the unit tests; not a setting the book quotes). Returns ``{column key: value, "baseline": value}``
    (no entry for an n/a cell; ``"<key>@naive"`` beside a cell whose attacker knows the defense, where the row
    keeps the naive one).

    ``columns`` may mix keys of :data:`DEFENSES` and **user defenses**:
    ``Defense(key, label, "user", fn=fn, public=(...))`` with ``fn`` of the contract :data:`USER_CONTRACT`.
    Each client applies ``fn`` to its own update wherever the row applies a client-side defense (the
    generic branch of every row: no secure sum, no central noise); the cell's record name is
    ``"<row>|<key>"``, its header the Defense's ``label``. The row's attacker reads the public parameters
    the defense declares where it has a variant that uses them (:func:`attacker` says which attacker a
    cell gets: the naive one for a defense without them).

    Raises ``ValueError`` for an unknown row or column (naming ``columns``), a negative seed, a user
    defense in an outsider row (a client-side defense shows the outsider the target's message, the
    curious server's cell), or a user ``fn`` that breaks the contract."""
    a = _attack(row)
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    keys, user = _resolve_columns(columns)
    if user and a.observer == OUTSIDER:
        raise ValueError(f"columns: a user defense runs on each client, so the outsider of row {a.key!r} sees the "
                         f"target's message, the curious server's cell: run it in row {a.key[:-len('_outsider')]!r}")
    cols = [c for c in keys if c not in a.not_applicable]
    token = _USER.set(user)
    try:
        return a.run(int(seed), cols, bool(tiny))
    finally:
        _USER.reset(token)


#: the public parameter each row's attacker reads when a user defense publishes it (its adaptive variant)
_READS = {"dlg": ("mask", "clip_norm"), "ig": ("mask",), "mr": ("clip_norm",), "rs": ("clip_norm",), "oltr": ("clip_norm",),
          "oltr_adm": ("clip_norm",)}


def attacker(row, defense: Defense) -> str:
    """Which attacker cell ``(row, defense)`` gets for a user defense ``defense``: ``"adaptive (reads
    <names>)"`` when the row's attacker has a variant that uses one of the public parameters the defense
    declares (DLG: ``mask``, ``clip_norm``; the eavesdropper and the RAIFLE rows: ``clip_norm``), else
    ``"naive (...)"``, the row's attack run on the view as it is (so the cell may overstate the defense).
    Raises ``ValueError`` for an unknown row or a ``defense`` that is not a user :class:`Defense`."""
    a = _attack(row)
    if not isinstance(defense, Defense) or defense.kind != "user":
        raise ValueError(f"defense must be a user Defense (kind 'user'), got {defense!r}")
    reads = [p for p in _READS.get(a.key, ()) if p in defense.public]
    if reads:
        return f"adaptive (reads {', '.join(reads)})"
    why = ("the defense publishes no parameter" if not defense.public else
           f"this row's attack has no variant that uses {', '.join(defense.public)}")
    return f"naive ({why}: the cell may overstate the defense)"


def cell(row, column, *, tiny: bool = False) -> Callable[[int], float]:
    """The cell ``(row, column)`` as a function ``seed -> value`` (``column`` a key or a :class:`Defense`).
    Raises ``ValueError`` for an unknown row or column and for an n/a cell (its reason in the message)."""
    a = _attack(row)
    key = _columns([column])[0]
    if key in a.not_applicable:
        raise ValueError(f"cell ({a.key}, {key}) is n/a: {a.not_applicable[key]}")
    return lambda seed: run_row(a, seed, [column], tiny=tiny)[key]


def value_name(row: str, column: str) -> str:
    """The record's name of a cell: ``"<row>|<column>"`` (``column`` may be ``"baseline"``)."""
    return f"{row}|{column}"


def run_matrix(seed: int, *, rows: Sequence[str] | None = None, columns: Sequence[str] | None = None,
               progress: Callable[[str, float], None] | None = None) -> tuple[dict, dict]:
    """Every row at ``seed``: returns ``(values, seconds)``, ``values`` ``{value_name(row, col): float}``
    (baselines included, n/a cells absent) and ``seconds`` ``{row: wall seconds}``. ``progress(row,
    seconds)`` is called after each row."""
    keys = [a.key for a in ATTACKS] if rows is None else [_attack(r).key for r in rows]
    values, seconds = {}, {}
    for r in keys:
        t0 = time.perf_counter()
        res = run_row(r, seed, columns)
        seconds[r] = time.perf_counter() - t0
        values.update({value_name(r, c): float(v) for c, v in res.items()})
        if progress is not None:
            progress(r, seconds[r])
    return values, seconds


@functools.lru_cache(maxsize=None)
def central_epsilon(noise_multiplier: float, sampling_prob: float, num_rounds: int, delta: float) -> float:
    """Client-level epsilon at ``delta`` of DP-FedAvg's event (:func:`fedlab.privacy.dp_fedavg.dp_event`:
    ``num_rounds`` compositions of the Poisson-sampled Gaussian of multiplier ``noise_multiplier``) from
    ``dp_accounting``'s privacy-loss-distribution accountant (``pld.PLDAccountant``, pessimistic
    discretisation: an upper bound; Koskela et al. 2020, Doroshenko et al. 2022), the accountant of every
    epsilon the matrix reports (:func:`effective_epsilons`). Raises ``ValueError`` for
    ``noise_multiplier <= 0``, ``sampling_prob`` outside (0, 1], ``num_rounds < 1`` or ``delta`` outside (0, 1)."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
    if not 0 < sampling_prob <= 1:
        raise ValueError(f"sampling_prob must be in (0, 1], got {sampling_prob}")
    if int(num_rounds) != num_rounds or num_rounds < 1:
        raise ValueError(f"num_rounds must be a positive integer, got {num_rounds}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    from dp_accounting import pld

    acc = pld.PLDAccountant()
    acc.compose(dpf.dp_event(float(noise_multiplier), float(sampling_prob), int(num_rounds)))
    return float(acc.get_epsilon(float(delta)))


def ldp_epsilon(epsilon: float, releases: int) -> float:
    """The epsilon at :data:`LDP_DELTA` of ``releases`` releases of the ``ldp*`` columns' Gaussian (each
    ``(epsilon, LDP_DELTA)``-LDP for sensitivity ``2 C``: noise multiplier
    ``sigma / (2 C) = ldp.gaussian_sigma(epsilon, LDP_DELTA, 1)``), composed by the privacy-loss-distribution
    accountant of :func:`central_epsilon`: for unsampled Gaussian releases its answer is the closed form
    :func:`fedlab.privacy.ldp.gaussian_composed_epsilon` (exact Gaussian-DP composition, Dong, Roth & Su
    2019, Cor. 3.3), which ``dp_accounting``'s ``PLDAccountant`` matches (``tests/test_ldp.py``,
    ``tests/test_matrix_threats.py``) and which stays cheap where the library's discretised distribution
    needs seconds to minutes (``epsilon = 500``). At most ``releases * epsilon``, the basic composition.
    Raises ``ValueError`` for ``epsilon`` not positive and finite or ``releases < 1``."""
    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases must be a positive integer, got {releases}")
    z = ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 1.0)     # checks epsilon
    return ldp.gaussian_composed_epsilon(z, int(releases), LDP_DELTA)


def effective_epsilons(row) -> dict:
    """What the ``dp*`` and ``ldp*`` columns guarantee against the attacker of ``row`` (an :class:`Attack`
    or its key), given the releases it observes (``row.releases()``: ``T`` rounds, sampled with
    probability ``q``), every epsilon from one accountant, the privacy-loss distribution.
    Returns ``{"rounds": T, "sampling_prob": q, "releases": round(T q), "dp": {column: epsilon or None},
    "ldp": {column: epsilon}}``: ``dp`` is :func:`central_epsilon` of the column's ``z`` at ``(q, T)``
    (``None`` for an n/a cell and for an attacker that sees the update before the noise, i.e. every
    observer but the outsider: no guarantee against it), ``ldp`` is :func:`ldp_epsilon`, the per-release
    guarantee composed over the releases (the client adds fresh noise to each message it sends). Raises
    ``ValueError`` for an unknown row."""
    a = _attack(row)
    T, q = a.releases()
    k = max(int(round(T * q)), 1)
    s = DP_SETTING
    dp = {}
    for d in DEFENSES:
        if d.kind == "dp":
            if d.key in a.not_applicable or not a.sees_central_noise:
                dp[d.key] = None
            elif d.safe:
                dp[d.key] = safe_central_epsilon(dp_noise_multiplier(d.param), _SAFE_NUM_PARAMS[a.key](), float(q),
                                                 int(T), s["delta"])
            else:
                dp[d.key] = central_epsilon(dp_noise_multiplier(d.param), float(q), int(T), s["delta"])
    return {"rounds": int(T), "sampling_prob": float(q), "releases": k, "dp": dp,
            "ldp": {d.key: (safe_ldp_epsilon if d.safe else ldp_epsilon)(d.param, k)
                    for d in DEFENSES if d.kind == "ldp"}}


#: an upper bound on the coordinates ``n`` of one client's update in each outsider row (the floating-point-safe
#: DP column's rounding adds ``sqrt(n)`` to the integer sensitivity): the models' sizes, the RAIFLE rows' whole
#: catalogue of item embeddings (a user's update holds at most every item) and the ranker's features
_SAFE_NUM_PARAMS = {
    "dlg_outsider": lambda: models.num_params(models.lenet(1, 10, 8)),
    "ig_outsider": lambda: models.num_params(models.lenet(3, 10, 32, activation="relu")),
    "mia_outsider": lambda: models.num_params(models.mlp(64, (64,), 10)),
    "rs_outsider": lambda: synthetic_movielens(seed=0).num_items * 64,
    "oltr_outsider": lambda: synthetic_letor(pick(quick=300, paper=1000), seed=0).num_features,
}


@functools.lru_cache(maxsize=None)
def safe_central_epsilon(noise_multiplier: float, num_params: int, sampling_prob: float, num_rounds: int,
                         delta: float) -> float:
    """Client-level epsilon at ``delta`` of the floating-point-safe DP-FedAvg column (the discrete Gaussian of
    ``dp_aggregate(..., safe=True)``, default grid ``2^floor(log2(sigma / 1024))``) calibrated with the float
    column's ``noise_multiplier`` ``z`` on updates of at most ``num_params`` coordinates: its true multiplier
    (:func:`fedlab.privacy.dp_fedavg.safe_noise_multiplier`) is at least ``1024 / (1024 / z + sqrt(n))`` for
    every clipping bound (the grid puts ``S / (m grid)`` in ``[1024 / z, 2048 / z)``, and the multiplier grows
    with it), and that lower bound goes to :func:`fedlab.privacy.dp_fedavg.epsilon_spent` with ``safe=True``
    (the discrete Gaussian's Renyi bound, Canonne, Kamath & Steinke 2020, Thm. 14, composed over the rounds
    without amplification by sampling, which ``dp_accounting`` proves for the continuous Gaussian only): an
    upper bound, and larger than :func:`central_epsilon` of the float column. Raises ``ValueError`` for
    ``noise_multiplier <= 0``, ``num_params < 1`` or bad accounting arguments."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
    if int(num_params) != num_params or num_params < 1:
        raise ValueError(f"num_params must be a positive integer, got {num_params}")
    z = 1024.0 / (1024.0 / float(noise_multiplier) + math.sqrt(int(num_params)))
    return float(dpf.epsilon_spent(z, float(sampling_prob), int(num_rounds), float(delta), safe=True))


def safe_ldp_epsilon(epsilon: float, releases: int) -> float:
    """The epsilon at :data:`LDP_DELTA` of ``releases`` releases of a floating-point-safe LDP column
    (``ldp.ldp_gaussian(..., safe=True)``: the discrete Gaussian calibrated to ``(epsilon, LDP_DELTA)`` per
    release at its integer sensitivity, :func:`fedlab.privacy.discrete_gaussian.discrete_gaussian_sigma2`),
    composed by the discrete Gaussian's Renyi bound (:func:`fedlab.privacy.discrete_gaussian.discrete_gaussian_epsilon`;
    ``dp_accounting``'s PLD covers the continuous Gaussian only). The per-release variance is the least integer
    that gives ``epsilon`` at sensitivity ``2^10`` (a finer grid than any release's, so at most the release's
    ratio of variance to squared sensitivity: an upper bound). One release gives at most ``epsilon``. Raises
    ``ValueError`` for ``epsilon`` not positive and finite or ``releases < 1``."""
    from ..privacy import discrete_gaussian as dg

    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases must be a positive integer, got {releases}")
    ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 1.0)     # checks epsilon
    if releases == 1:
        return float(epsilon)
    sens = 2.0 ** 10
    s2 = dg.discrete_gaussian_sigma2(float(epsilon), LDP_DELTA, sens)
    return float(dg.discrete_gaussian_epsilon(s2, sens, LDP_DELTA, compositions=int(releases)))


def deployment_epsilons() -> dict:
    """``{dp column: epsilon}``: what the privacy-loss-distribution accountant (:func:`central_epsilon`) charges
    the deployment :data:`DP_SETTING` that each ``dp*`` column's ``z`` was calibrated for (by the RDP
    accountant, as in Chapter 1b: the column's label; PLD is tighter, so at most the label)."""
    s = DP_SETTING
    return {d.key: central_epsilon(dp_noise_multiplier(d.param), s["sampling_prob"], s["num_rounds"], s["delta"])
            for d in DEFENSES if d.kind == "dp"}


def describe_matrix() -> dict:
    """The matrix's layout for the record: rows (key, label, chapter, metric, direction, threat, baseline,
    n/a reasons, secure-aggregation group, cell notes, :func:`effective_epsilons`) and columns (key,
    label), and the DP settings."""
    return {"rows": [{"key": a.key, "label": a.label, "chapter": a.chapter, "metric": a.metric,
                      "higher_is_success": a.higher_is_success, "threat": a.threat, "baseline": a.baseline,
                      "not_applicable": dict(a.not_applicable), "secagg_group": a.secagg_group,
                      "cell_notes": dict(a.cell_notes), "epsilons": effective_epsilons(a), "observer": a.observer,
                      "value_range": [_json_bound(v) for v in a.value_range]} for a in ATTACKS],
            "columns": [{"key": d.key, "label": d.label} for d in DEFENSES],
            "dp_setting": dict(DP_SETTING), "ldp_delta": LDP_DELTA, "accountant": ACCOUNTANT,
            "dp_noise_multipliers": {d.key: dp_noise_multiplier(d.param) for d in DEFENSES if d.kind == "dp"},
            "dp_deployment_epsilons": deployment_epsilons()}


#: the accountant of every epsilon in the record (central and local DP alike)
ACCOUNTANT = "privacy-loss distribution (dp_accounting.pld; unsampled Gaussian compositions in its exact closed form)"


def _json_bound(v: float) -> float | None:
    """A range bound for JSON (which has no infinity): ``None`` for an infinite one."""
    return None if math.isinf(v) else float(v)


def threat_rows(record: Mapping | None = None) -> list[list[str]]:
    """Rows ``[column, what the attacker sees]`` of the page's threat-model table, one per column of
    :data:`DEFENSES` (DP columns with their noise multiplier ``z`` from ``record``'s layout when given,
    else from :func:`dp_noise_multiplier`)."""
    zs = (record or {}).get("matrix", {}).get("dp_noise_multipliers") or {}
    rows = []
    for d in DEFENSES:
        note = COLUMN_NOTES[d.kind]
        if d.safe:
            note = note + _SAFE_NOTE
        if d.kind == "dp":
            z = zs.get(d.key, dp_noise_multiplier(d.param))
            note = f"z = {z:.3f}: " + note
        rows.append([d.label, note])
    return rows


def row_threats(record: Mapping) -> list[list[str]]:
    """Rows of the page's per-attack threat table, from a record's layout: ``[attack, secure-aggregation
    group, releases observed, effective epsilon of each DP-FedAvg column, LDP epsilon composed over the
    releases]`` (see :func:`effective_epsilons`). Raises ``ValueError`` for a record without the layout."""
    layout = record.get("matrix") if isinstance(record, Mapping) else None
    if not layout:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    out = []
    for r in layout["rows"]:
        e = r["epsilons"]
        obs = str(e["releases"]) if e["sampling_prob"] == 1 else f'{e["releases"]} ({e["rounds"]} rounds × q = {e["sampling_prob"]:g})'
        dp = ["n/a" if k in r["not_applicable"] else "none" if v is None else f"{v:.3g}" for k, v in e["dp"].items()]
        if "none" in dp and set(dp) <= {"none", "n/a"}:     # no guarantee in any cell that exists
            dp = [_NO_GUARANTEE.get(r.get("observer"), "none: the attacker sees the update before the noise")]
        group = "n/a" if "secagg" in r["not_applicable"] else str(r["secagg_group"])
        out.append([r["label"], group, obs, " / ".join(dp),
                    " / ".join(f"{v:.3g}" if v < 1000 else f"{v:,.0f}" for v in e["ldp"].values())])
    return out


#: why central DP guarantees nothing against an observer before the noise (the threat table's text)
_NO_GUARANTEE = {"curious server": "none: the server sees each clipped update before the noise it adds",
                 "eavesdropper": "none: the noise is added after the tapped link"}


def row_threat_header(record: Mapping) -> list[str]:
    """The header of :func:`row_threats`' table (column labels from the record's layout)."""
    cols = {c["key"]: c["label"] for c in record["matrix"]["columns"]}
    first = record["matrix"]["rows"][0]["epsilons"]
    dp = " / ".join(cols[k] for k in first["dp"])
    ldp = " / ".join(cols[k] for k in first["ldp"])
    return ["attack", "secure-aggregation group", "releases observed",
            f"effective ε of {dp}", f"{ldp}, composed over the releases (same accountant)"]


def undefended_advantage(record: Mapping, row: str) -> dict:
    """The paired difference, seed by seed, between the undefended cell and the baseline of ``row`` in a
    stored record, signed so that positive means the attack succeeds: ``{"mean", "ci95": [lo, hi] or
    None, "n", "significant"}``, ``significant`` when the 95 % t interval lies above 0. Raises
    ``ValueError`` when the record lacks the row's undefended cell or baseline."""
    vals = record.get("values", {})
    none, base = vals.get(value_name(row, "none")), vals.get(value_name(row, "baseline"))
    layout = {r["key"]: r for r in (record.get("matrix") or {}).get("rows", [])}
    if not none or not base or row not in layout:
        raise ValueError(f"the record holds no undefended cell and baseline of row {row!r}")
    sign = 1.0 if layout[row]["higher_is_success"] else -1.0
    diff = [sign * (a - b) for a, b in zip(none, base) if a is not None and b is not None]
    mean, _, ci = t_interval(diff)
    return {"mean": float(mean), "ci95": None if ci is None else [float(ci[0]), float(ci[1])], "n": len(diff),
            "significant": ci is not None and ci[0] > 0}


#: the note of a row whose undefended advantage is not significant (rendered neutral)
NOT_SIGNIFICANT = "no significant undefended advantage at this scale (the paired 95 % interval of undefended minus baseline includes 0)"


def ldp_noise_ratio(epsilon: float, num_params: int) -> float:
    """The expected norm of the ``ldp*`` columns' noise over the clipping bound ``C``: ``sigma sqrt(n) / C``
    with ``sigma`` the Gaussian noise of :func:`fedlab.privacy.ldp.ldp_gaussian` for sensitivity ``2 C``
    and ``n = num_params`` coordinates (the noise's norm concentrates there). Raises ``ValueError`` for
    ``epsilon <= 0`` or ``num_params < 1``."""
    if int(num_params) != num_params or num_params < 1:
        raise ValueError(f"num_params must be a positive integer, got {num_params}")
    return float(ldp.gaussian_sigma(float(epsilon), LDP_DELTA, 2.0) * math.sqrt(int(num_params)))


def page_values(record: Mapping) -> dict:
    """The numbers the page quotes from a matrix record, ``{name: value}``: every cell's mean as
    ``mx_<row>_<column>`` (dots in keys become ``p``), the baselines, the DP noise multipliers, the
    number of seeds, the wall seconds (total, mean per seed, slowest row per seed) and the machine, each
    row's secure-aggregation group (``mx_group_<row>``), releases observed and effective DP-FedAvg epsilons
    (``mx_eps_<row>_<column>``), the eavesdropper's cells in scientific notation (``mx_mr_<column>_sci``),
    :data:`IMPRINT_TOL` and the sentence naming the rows without a significant undefended advantage.
    Raises ``ValueError`` for a record without the matrix layout."""
    if not record or "matrix" not in record:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    tag = lambda k: k.replace(".", "p").replace("@", "_")   # noqa: E731
    out = {f"mx_{tag(n.replace('|', '_'))}": s["mean"] for n, s in record["summary"].items()}
    out.update({f"mx_z_{tag(k)}": z for k, z in record["matrix"]["dp_noise_multipliers"].items()})
    secs = record["seconds"]
    slow = max(record["row_seconds"], key=lambda r: np.mean([x for x in record["row_seconds"][r] if x is not None]))
    for r in record["matrix"]["rows"]:
        out[f"mx_group_{r['key']}"] = r["secagg_group"]
        out[f"mx_releases_{r['key']}"] = r["epsilons"]["releases"]
        out.update({f"mx_eps_{r['key']}_{k}": v for k, v in r["epsilons"]["dp"].items() if v is not None})
        out.update({f"mx_eps_{r['key']}_{k}": v for k, v in r["epsilons"]["ldp"].items()})
    out.update({f"mx_eps_deploy_{k}": v for k, v in (record["matrix"].get("dp_deployment_epsilons") or {}).items()})
    out.update({f"mx_{tag(n.replace('|', '_'))}_sci": f"{s['mean']:.1e}" for n, s in record["summary"].items()
                if n.startswith("mr|")})                                 # ~1e-14: not 0.0 at 3 digits
    flat = [r["label"] for r in record["matrix"]["rows"] if not undefended_advantage(record, r["key"])["significant"]]
    out["mx_not_significant"] = ("every row has a significant undefended advantage at this scale" if not flat else
                                 f"{' and '.join(flat)}: {NOT_SIGNIFICANT}; its row is not coloured")
    out["mx_imprint_tol"] = IMPRINT_TOL
    out.update(mx_seeds=len(record["seeds"]), mx_wall_s=float(sum(secs)), mx_seed_s=float(np.mean(secs)),
               mx_slowest_row=next((r["label"] for r in record["matrix"]["rows"] if r["key"] == slow), slow),
               mx_slowest_s=float(np.mean(record["row_seconds"][slow])),
               mx_machine=str(record.get("machine", "?")), mx_commit=str(record.get("commit", "?")))
    return out


# ----------------------------------------------------------------------------------------------------
# the table
def advantage(value: float, baseline: float, undefended: float) -> float:
    """The share of the undefended attack's advantage over its baseline that survives a defense:
    ``(value - baseline) / (undefended - baseline)``, clipped to ``[0, 1]`` (the direction cancels, so it
    serves "higher is success" and "lower is success" alike; 0 when the undefended attack has no
    advantage). Raises ``ValueError`` for a non-finite argument."""
    if not all(math.isfinite(x) for x in (value, baseline, undefended)):
        raise ValueError(f"advantage needs finite numbers, got {value}, {baseline}, {undefended}")
    gap = undefended - baseline
    if gap == 0:
        return 0.0
    return float(min(1.0, max(0.0, (value - baseline) / gap)))


def record_table(record: Mapping) -> list[dict]:
    """One dict per row of a stored matrix record: ``{"row": layout dict, "baseline": summary,
    "cells": {column key: summary dict ({"mean", "ci95", "n"}) or {"na": reason} or None (missing)}}``.
    Raises ``ValueError`` when ``record`` lacks the matrix layout."""
    layout = record.get("matrix") if isinstance(record, Mapping) else None
    if not layout:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    summ = record.get("summary", {})
    out = []
    for row in layout["rows"]:
        cells = {}
        for col in layout["columns"]:
            k = col["key"]
            if k in row["not_applicable"]:
                cells[k] = {"na": row["not_applicable"][k]}
            else:
                cells[k] = summ.get(value_name(row["key"], k))
        out.append({"row": row, "baseline": summ.get(value_name(row["key"], "baseline")), "cells": cells})
    return out


def metric_range(record: Mapping, row: str) -> tuple[float, float]:
    """The range ``(low, high)`` of row ``row``'s metric (``-inf``/``inf`` for an open end), from the record's
    layout (``value_range``, ``None`` for an infinite bound) or, for a record written before it was stored,
    from :data:`ATTACKS`. Raises ``ValueError`` for a row neither knows."""
    layout = {r["key"]: r for r in (record.get("matrix") or {}).get("rows", [])} if isinstance(record, Mapping) else {}
    if row in layout and "value_range" in layout[row]:
        lo, hi = layout[row]["value_range"]
        return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
    return _attack(row).value_range


def own_defense_table(record: Mapping, row: str, defense: "Defense", own: Mapping, seed: int):
    """Page 07's "Add your own defense" table (Markdown): the stored undefended cell of ``row`` (mean and
    :func:`cell_interval` over the record's seeds), this build's undefended cell and the ``defense`` cell
    from ``own`` (what :func:`run_row` returned for ``["none", defense]`` at ``seed``), with the attacker
    each cell had (:func:`attacker`). Raises ``ValueError`` when the record lacks the cell or ``own`` a value."""
    from ..plots import md_table

    stored = (record.get("summary") or {}).get(value_name(row, "none"))
    if stored is None or "none" not in own or defense.key not in own:
        raise ValueError(f"own_defense_table needs the record's {row}|none cell and own['none'], own[{defense.key!r}]")
    lo, hi = cell_interval(record, row, "none")
    return md_table(
        [f"{row} row", "value", "attacker"],
        [[f"no defense, stored record ({stored['n']} seeds)", f"{stored['mean']:.3f} [{lo:.3f}, {hi:.3f}]", "the row's attack"],
         [f"no defense, this build, seed {seed}", f"{own['none']:.3f}", "the row's attack"],
         [f"{defense.label}, this build, seed {seed}", f"{own[defense.key]:.3f}", attacker(row, defense)]])


#: the row whose training gives every column's utility (its FedAvg run under each column: ``"mia|acc_<column>"``)
UTILITY_ROW = "mia"


def utility_table(record: Mapping):
    """Page 07's utility table (Markdown): for every column of :data:`DEFENSES`, the test accuracy of the global
    model that the passive membership row (:data:`UTILITY_ROW`: 10 clients, the 64-64-10 MLP, FedAvg for
    Chapter 1b's rounds) trains under that column, from the record's ``"mia|acc_<column>"`` (mean and
    :func:`cell_interval` over its seeds). A column the record does not hold yet reads "not in the stored record
    yet"; the consistency round (kind ``consistency``) changes no sum, so its utility is secure aggregation's.
    Raises ``ValueError`` for a record without the matrix layout or without the undefended accuracy."""
    from ..plots import md_table

    summ = record.get("summary") if isinstance(record, Mapping) else None
    if not record or "matrix" not in record or not summ:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    if value_name(UTILITY_ROW, "acc_none") not in summ:
        raise ValueError(f"the record holds no {UTILITY_ROW}|acc_none: no utility to show")
    rows = []
    for d in DEFENSES:
        key = "secagg" if d.kind == "consistency" else d.key
        s = summ.get(value_name(UTILITY_ROW, f"acc_{key}"))
        if s is None:
            rows.append([d.label, "not in the stored record yet", "—"])
            continue
        lo, hi = cell_interval(record, UTILITY_ROW, f"acc_{key}")
        same = " (secure aggregation's: the consistency round changes no sum)" if key != d.key else ""
        rows.append([d.label, f"{s['mean']:.3f} [{lo:.3f}, {hi:.3f}]{same}", str(s["n"])])
    return md_table(["defense (column)", "test accuracy of the trained model", "seeds"], rows)


def cell_interval(record: Mapping, row: str, column: str) -> list[float] | None:
    """The interval the page shows for cell ``(row, column)`` of a record (``column`` may carry
    :data:`NAIVE_SUFFIX` or be ``"acc_<column>"``, an accuracy in [0, 1]): :func:`bounded_interval` of the
    record's t interval and the metric's range. Raises ``ValueError`` when the record lacks the cell."""
    s = (record.get("summary") or {}).get(value_name(row, column))
    if s is None:
        raise ValueError(f"the record holds no summary of cell ({row}, {column})")
    rng = UNIT if column.startswith("acc_") else metric_range(record, row)
    return bounded_interval(s.get("ci95"), rng)


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.2e}"


def _colour(share: float) -> str:
    """White-ish green (0: at the baseline) to red (1: as strong as undefended)."""
    lo, hi = np.array([220, 240, 220]), np.array([235, 120, 110])
    r, g, b = (lo + share * (hi - lo)).round().astype(int)
    return f"rgb({r},{g},{b})"


#: the header of a row group (a ``<tr class="mx-group">`` above its first row), by observer
_ROW_GROUPS = {OUTSIDER: "Outsider who sees only the released aggregate (and, as the DP guarantee assumes, every other "
                         "update): the same attacks as the curious-server rows above, under central DP's noise",
               SECAGG_ROW: "Malicious server inside secure aggregation, computed through Flower's SecAgg+ (Chapter 6): "
                           "stock SecAgg+ against SecAgg+ with the consistency round"}


def render_html(record: Mapping, *, chapter_link: Callable[[str], str] | None = None) -> str:
    """The colour-coded HTML table of a matrix record: one ``<tr>`` per attack, one column per defense,
    each cell ``mean`` over ``[lo, hi]`` (the 95 % t interval over the seeds cut to the metric's range,
    :func:`cell_interval`), coloured by :func:`advantage`
    of the mean against the row's baseline mean and the undefended mean; n/a cells grey with the reason as
    tooltip and as a numbered note under the table. A row whose undefended advantage over the baseline is
    not significant (:func:`undefended_advantage`) is rendered neutral (class ``mx-neutral``, no share)
    with the note :data:`NOT_SIGNIFICANT`; a cell with a note of its row's ``cell_notes`` carries it as a
    numbered note. Each row header links to its chapter
    (``chapter_link(stem)``, default ``"<stem>.html"``) and states the metric, its direction, the
    baseline and the threat model. The outsider rows (:data:`OUTSIDER_ROWS`) come under a group header
    (``<tr class="mx-group">``). Raises ``ValueError`` for a record without the matrix layout."""
    rows = record_table(record)
    link = chapter_link or (lambda stem: f"{stem}.html")
    cols = record["matrix"]["columns"]
    notes: list[str] = []
    cell_css = "padding:3px 4px;text-align:center;min-width:5.2em;border:1px solid #fff;font-size:1em"
    head = "".join(f'<th style="{cell_css};font-weight:600">{html.escape(c["label"])}</th>' for c in cols)
    body = []

    def note_mark(text: str) -> str:
        if text not in notes:
            notes.append(text)
        return f"<sup>{notes.index(text) + 1}</sup>"

    groups_seen = set()
    for r in rows:
        row = r["row"]
        base = r["baseline"]
        group = _ROW_GROUPS.get(row["key"]) or _ROW_GROUPS.get(row.get("observer"))
        if group and group not in groups_seen:
            groups_seen.add(group)
            body.append(f'<tr class="mx-group"><th colspan="{len(cols) + 1}" style="text-align:left;padding:6px 6px 3px;'
                        f'border-top:2px solid #888">{html.escape(group)}</th></tr>')
        none = r["cells"].get("none")
        try:
            significant = undefended_advantage(record, row["key"])["significant"]
        except ValueError:
            significant = True
        row_mark = "" if significant else note_mark(NOT_SIGNIFICANT)
        cell_notes = row.get("cell_notes") or {}
        arrow = "↑" if row["higher_is_success"] else "↓"
        base_txt = "—" if not base else _fmt(base["mean"])
        href, label = html.escape(link(row["chapter"])), html.escape(row["label"])
        tds = [f'<th style="text-align:left;font-weight:normal;min-width:17em;padding:3px 6px">'
               f'<a href="{href}"><b>{label}</b></a>{row_mark}<br><span style="font-size:0.9em">{html.escape(row["metric"])} {arrow} = success; '
               f'baseline {base_txt} ({html.escape(row["baseline"])})<br><i>{html.escape(row["threat"])}</i>'
               f'</span></th>']
        for c in cols:
            s = r["cells"][c["key"]]
            if s is None:
                tds.append(f'<td class="mx-missing" style="{cell_css};background:#fff">missing</td>')
            elif "na" in s:
                mark = note_mark(s["na"])
                tds.append(f'<td class="mx-na" style="{cell_css};background:#d0d0d0" title="{html.escape(s["na"])}">'
                           f'n/a{mark}</td>')
            else:
                ci = bounded_interval(s.get("ci95"), metric_range(record, row["key"]))
                interval = f'<br><span style="font-size:0.85em">[{_fmt(ci[0])}, {_fmt(ci[1])}]</span>' if ci else ""
                extra = cell_notes.get(c["key"])
                mark = note_mark(extra) if extra else ""
                tail = f"; {extra}" if extra else ""
                if significant:
                    share = (advantage(s["mean"], base["mean"], none["mean"])
                             if base and none and "mean" in none else 0.0)
                    cls, bg = "mx-cell", _colour(share)
                    title = f"{share:.0%} of the undefended advantage over the baseline; n = {s['n']} seeds{tail}"
                else:
                    cls, bg = "mx-cell mx-neutral", "#f2f2f2"
                    title = f"{NOT_SIGNIFICANT}; n = {s['n']} seeds{tail}"
                naive = record.get("summary", {}).get(value_name(row["key"], c["key"] + NAIVE_SUFFIX))
                naive_txt = ""
                if naive and "mean" in naive:
                    naive_txt = (f'<br><span class="mx-naive" style="font-size:0.85em">naive {html.escape(_fmt(naive["mean"]))}'
                                 f'{note_mark(NAIVE_NOTE)}</span>')
                tds.append(f'<td class="{cls}" style="{cell_css};background:{bg}" title="{html.escape(title)}">'
                           f'{html.escape(_fmt(s["mean"]))}{mark}{interval}{naive_txt}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    foot = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return ('<div style="overflow-x:auto"><table class="fedlab-matrix" '
            'style="font-size:0.72em;border-collapse:collapse;line-height:1.25">'
            f'<thead><tr><th style="{cell_css}">attack \\ defense</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>"
            + (f'<ol class="mx-notes" style="font-size:0.8em">{foot}</ol>' if notes else ""))


def adaptive_gaps(record: Mapping) -> list[dict]:
    """Every cell of a matrix record that keeps a naive twin (``"<row>|<column>@naive"``, :data:`NAIVE_SUFFIX`:
    the attacker who ignores the defense, beside the cell's attacker who knows it), in the record's row and
    column order: ``{"row", "column", "adaptive", "naive"`` (summaries: ``mean``, ``ci95``, ``n``),
    ``"interval"`` (:func:`cell_interval` of the adaptive cell), ``"difference"`` (mean over the seeds of
    adaptive minus naive, the same seed's pair; only the clean seeds, those the summaries count: a seed in the
    record's ``failures`` is left out), ``"difference_ci95"`` (its t interval, ``None`` for one seed)
    and ``"beyond"`` (whether the naive mean lies outside the adaptive cell's interval: the naive evaluation
    misstates the defense by more than the cell's own uncertainty)}``. Raises ``ValueError`` for a record
    without the matrix layout."""
    from .._stats import t_interval

    summ, vals = record.get("summary") or {}, record.get("values") or {}
    failed = {f.get("seed") for f in record.get("failures") or [] if isinstance(f, Mapping)}
    clean = [s not in failed for s in record.get("seeds") or []]   # the seeds the summaries count
    out = []
    for r in record_table(record):
        key = r["row"]["key"]
        for col, s in r["cells"].items():
            naive = summ.get(value_name(key, col + NAIVE_SUFFIX))
            if not s or "na" in s or not naive:
                continue
            a, b = vals.get(value_name(key, col), []), vals.get(value_name(key, col + NAIVE_SUFFIX), [])
            ok = clean if len(clean) == len(a) else [True] * len(a)
            diffs = [x - y for x, y, keep in zip(a, b, ok) if keep and _number(x) and _number(y)]
            mean, _, ci = t_interval(diffs) if diffs else (float("nan"), None, None)
            lo, hi = cell_interval(record, key, col) or (s["mean"], s["mean"])
            out.append({"row": key, "column": col, "adaptive": s, "naive": naive, "interval": [lo, hi],
                        "difference": mean, "difference_ci95": None if ci is None else list(ci),
                        "beyond": not lo <= naive["mean"] <= hi})
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def adaptive_gap_table(record: Mapping):
    """Page 07's table of :func:`adaptive_gaps` (Markdown): each cell with a naive twin, the attacker who knows the
    defense (mean [interval]) beside the naive one, their paired difference with its 95 % interval, and whether
    the naive number lies outside the cell's interval. Raises ``ValueError`` for a record without the layout."""
    from ..plots import md_table

    labels = {d.key: d.label for d in DEFENSES}
    row_labels = {r["key"]: r.get("label", r["key"]) for r in (record.get("matrix") or {}).get("rows", [])}
    rows = []
    for g in adaptive_gaps(record):
        lo, hi = g["interval"]
        ci = g["difference_ci95"]
        diff = f"{_fmt(g['difference'])}" + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
        rows.append([row_labels.get(g["row"], g["row"]), labels.get(g["column"], g["column"]),
                     f"{_fmt(g['adaptive']['mean'])} [{_fmt(lo)}, {_fmt(hi)}]", _fmt(g["naive"]["mean"]), diff,
                     "yes" if g["beyond"] else "no", str(g["adaptive"]["n"])])
    return md_table(["attack", "defense", "attacker who knows it", "naive attacker", "difference (paired)",
                     "naive outside the interval", "seeds"], rows)


def consistent_with_record(record: Mapping, row: str, column: str, value: float, *, slack: float = 0.0) -> bool:
    """Whether ``value`` (this build's cell) lies within the range of the record's per-seed values of
    ``(row, column)`` widened by its 95 % interval and ``slack``. Raises ``ValueError`` when the record
    lacks the cell."""
    name = value_name(row, column)
    vals = [v for v in record.get("values", {}).get(name, []) if v is not None]
    s = record.get("summary", {}).get(name)
    if not vals or s is None:
        raise ValueError(f"the record holds no values of cell ({row}, {column})")
    half = 0.0 if not s.get("ci95") else (s["ci95"][1] - s["ci95"][0]) / 2
    return min(vals) - half - slack <= value <= max(vals) + half + slack


def live_table(rows: Mapping[str, Mapping[str, float]], *, digits: int = 3) -> str:
    """A Markdown table of cells a page computes live with :func:`run_row`: one line per ``label -> cells``
    (``{column key: value}`` as ``run_row`` returns it), one column per defense in :data:`DEFENSES` order
    (headed by its label), the attack's ``baseline`` first; ``acc_<column>`` values (the membership row's test
    accuracy) go to a line of their own, ``<label>: test accuracy``; ``@``-suffixed values (naive twins, a
    cell's parts) are left out. Values to ``digits`` significant digits; "–" where a line has no such cell.
    Raises ``ValueError`` for no rows."""
    if not rows:
        raise ValueError("rows must hold at least one label -> cells")
    lines: dict[str, dict] = {}
    for label, cells in rows.items():
        lines[label] = {k: v for k, v in cells.items() if "@" not in k and not k.startswith("acc_")}
        acc = {k[4:]: v for k, v in cells.items() if k.startswith("acc_") and "@" not in k}
        if acc:
            lines[f"{label}: test accuracy"] = acc
    used = {k for cells in lines.values() for k in cells}
    keys = (["baseline"] if "baseline" in used else []) + [d.key for d in DEFENSES if d.key in used]
    keys += sorted(used - set(keys))
    head = ["", *("the attack's baseline" if k == "baseline" else _BY_KEY[k].label if k in _BY_KEY else k
                  for k in keys)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in lines.items():
        out.append("| " + " | ".join([label, *(f"{cells[k]:.{digits}g}" if k in cells else "–" for k in keys)]) + " |")
    return "\n".join(out)
