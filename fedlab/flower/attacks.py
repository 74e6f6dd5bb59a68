"""The book's attacks, unchanged, on what a Flower server recorded (a transcript of
:class:`fedlab.flower.Recorder`): the honest-but-curious server of the chapters is the ``ServerApp``.

* :func:`observed_gradients` turns a round's train replies into the gradients the server observes:
  ``(w_global - w_k) / lr`` (exactly client ``k``'s mean-loss gradient under FedSGD, i.e. one local epoch
  on the full batch; otherwise its average update, as in chapter 1a's study of local steps);
* :func:`invert_gradients` runs DLG (Zhu et al. 2019) or iDLG (Zhao et al. 2020: the label from the sign
  of the last layer's weight gradient) with :func:`fedlab.attacks.gradient_inversion.dlg` on them, one
  stacked attack over the clients of the round (chapter 1a);
* :func:`membership_signals` / :func:`membership_auc`: the passive membership inference of chapter 1c
  (per-example loss under the models a client returned, :mod:`fedlab.attacks.membership`);
* :func:`eavesdropped_pairs` / :func:`reconstruct_local_models`: chapter 4's eavesdropper (Xu & Neglia
  2021) on one client's link, read off the transcript: the (global model sent, model returned) pairs of
  every round the client took part in, and the local optimum decoded from them with
  :func:`fedlab.attacks.model_reconstruction.solve_affine` (Observations 1 and 5) or
  :func:`~fedlab.attacks.model_reconstruction.reconstruct_heuristic` (Algorithm 3, chapter 4b);
* under Flower's SecAgg+ (runs with ``aggregation=SecAgg()``), where no reply carries a model:
  :func:`secagg_error_bound` (how far the decoded average may sit from the exact one) and
  :func:`imprint_from_aggregate`, chapter 1b's imprint attack (Fowl et al. 2022) read off the aggregate
  by a malicious server (:func:`fedlab.attacks.imprint.recover_from_imprint`), and
  :func:`item_sums_from_aggregate`, chapter 2b's per-item sums (London 2020, Sec. 6) read off the aggregate
  by an honest-but-curious server.

* a malicious server inside SecAgg+ (:class:`fedlab.flower.secagg.SecAggWorkflow`'s ``attack``, run with
  ``flower.run(..., aggregation=flower.SecAgg(attack=...))``): :class:`FalseDropout` (tell the other clients in the
  unmask stage that the target dropped out while keeping it among the survivors: the server receives shares
  of both the target's self-mask seed and its mask key and unmasks its model alone; Bonawitz et al. 2017,
  Sec. 6, is why their protocol has a consistency round), :class:`SplitView` (the same lie against clients
  that refuse a node listed both active and dropped: some clients are told "active", the others "dropped",
  each view consistent) and :class:`InconsistentModel` (Pasquini et al., CCS 2022: every client but the
  target receives a decoy model whose update the server predicts, so the honest sum isolates the target's;
  :func:`isolate_from_aggregate`, :func:`silenced_parameters`); :func:`invert_model` runs iDLG on a
  recovered model.

None of these imports ``flwr``: they read a transcript or change what a server sends.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..attacks import gradient_inversion as gi
from ..attacks import imprint as imp
from ..attacks import membership
from ..attacks import model_reconstruction as mr
from ..metrics import matched_psnr
from ..models import flatten_params
from .transcript import Transcript

__all__ = ["observed_gradients", "TranscriptInversion", "invert_gradients", "membership_signals", "membership_auc",
           "eavesdropped_pairs", "LocalModelReconstruction", "reconstruct_local_models", "RECONSTRUCTION_METHODS",
           "secagg_error_bound", "ImprintFromAggregate", "imprint_from_aggregate",
           "ItemSums", "item_sums_from_aggregate", "FalseDropout", "SplitView", "InconsistentModel",
           "isolate_from_aggregate", "silenced_parameters", "invert_model", "zero_decoy"]

#: values of :func:`reconstruct_local_models`' ``method``
RECONSTRUCTION_METHODS = ("affine", "heuristic")


def _round(transcript: Transcript, round: int) -> int:
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or not 1 <= round <= transcript.num_rounds:
        raise ValueError(f"round must be in 1..{transcript.num_rounds} (the transcript's rounds), got {round!r}")
    return int(round)


def observed_gradients(transcript: Transcript, round: int = 1) -> dict[int, dict]:
    """``{partition_id: {name: (w_{round-1} - w_k) / lr}}`` for every train reply of ``round``.

    For FedSGD (the transcript's ``meta``: ``local_epochs = 1``, ``batch_size = None``, no ``local_steps``,
    ``weight_decay = 0``) this is client ``k``'s gradient of its mean loss at the global model; otherwise
    the average update per unit step.

    Raises
    ------
    ValueError
        For a ``round`` outside the transcript, or a transcript without ``lr`` in its meta or without
        replies in that round.
    """
    round = _round(transcript, round)
    lr = transcript.meta.get("lr")
    if not lr:
        raise ValueError(f"transcript {transcript.path} records no lr in its meta")
    g = transcript.globals[round - 1]
    replies = transcript.train_replies(round)
    if not replies:
        raise ValueError(f"transcript {transcript.path} holds no train reply in round {round}")
    return {r.partition_id: {k: (g[k] - r.params[k]) / lr for k in g} for r in replies}


def _is_fedsgd(meta: dict) -> bool:
    return (meta.get("local_epochs") == 1 and meta.get("batch_size") is None and not meta.get("local_steps")
            and not meta.get("weight_decay"))


@dataclass
class TranscriptInversion:
    """Result of :func:`invert_gradients`: ``partitions`` in attack order, ``x`` the reconstructions
    ``[K, batch, *input_shape]``, ``labels`` ``[K, batch]`` (iDLG's rule or DLG's learned labels),
    ``psnr`` ``[K, batch]`` (matched PSNR against ``x_true`` when given, else ``None``), ``fedsgd``
    (whether the observed updates were exact gradients) and ``final_loss`` ``[K]`` (the gradient-matching loss
    at each client's kept start, :func:`fedlab.attacks.gradient_inversion.dlg`'s ``final_loss``)."""

    partitions: list
    x: torch.Tensor
    labels: torch.Tensor
    psnr: np.ndarray | None
    fedsgd: bool
    final_loss: np.ndarray | None = None


def invert_gradients(model_fn: Callable[[], nn.Module], transcript: Transcript, *, round: int = 1,
                     input_shape: tuple, num_classes: int, batch_size: int = 1,
                     budget: gi.AttackBudget | None = None, idlg: bool = True, x_true: dict | None = None,
                     seed: int = 0) -> TranscriptInversion:
    """DLG / iDLG (chapter 1a) on every client update of ``round`` in ``transcript``, as one stacked
    :func:`fedlab.attacks.gradient_inversion.dlg` run at the global model the server sent.

    Parameters
    ----------
    model_fn : callable
        ``() -> nn.Module``, the architecture the federation trained.
    batch_size : int
        The number of examples each attacked client holds (every client of the round must hold this many).
    idlg : bool
        Take the labels from :func:`fedlab.attacks.gradient_inversion.idlg_label` (``batch_size`` must be
        1) and optimise the images only; ``False``: DLG learns the labels too.
    x_true : dict, optional
        ``{partition_id: X [batch, *input_shape]}``: the clients' true images, to report the PSNR.
    budget : fedlab.attacks.AttackBudget, optional
        DLG's L-BFGS budget (default ``AttackBudget(max_iter=100, lr=1.0)``: one run of 100 iterations at Zhu
        et al.'s fixed step). ``num_restarts = R``: random starts per client; the ``R * K`` attacks run as one
        stacked call (attack ``r * K + i`` is start ``r`` of client ``i``; start 0 is the one-start run's) and
        each client keeps the start whose matching loss is smallest (the server cannot see the PSNR): a start
        that stalls in a local minimum (chapter 1a) no longer decides the client's result.

    Raises
    ------
    ValueError
        For a bad ``round``, ``idlg`` with ``batch_size != 1``, a ``budget`` that is not an ``AttackBudget``, or
        a client whose reply names another number of examples than ``batch_size``.
    """
    budget = gi.AttackBudget(max_iter=100, lr=1.0) if budget is None else budget
    if not isinstance(budget, gi.AttackBudget):
        raise ValueError(f"budget must be an AttackBudget (e.g. AttackBudget(max_iter=100, lr=1.0, num_restarts=2)), "
                         f"got {budget!r}")
    num_restarts = budget.num_restarts
    if idlg and batch_size != 1:
        raise ValueError(f"idlg needs batch_size 1 (the label rule reads one example's gradient), got {batch_size}")
    obs = observed_gradients(transcript, round)
    replies = {r.partition_id: r for r in transcript.train_replies(round)}
    bad = [k for k, r in replies.items() if r.num_examples != batch_size]
    if bad:
        raise ValueError(f"batch_size={batch_size} but partitions {bad} trained on "
                         f"{[replies[k].num_examples for k in bad]} examples")
    parts = sorted(obs)
    stacked = {name: torch.stack([obs[k][name] for k in parts]) for name in obs[parts[0]]}
    labels = None
    if idlg:
        labels = torch.tensor([[gi.idlg_label(obs[k])] for k in parts])
    model = model_fn()
    params = transcript.globals[round - 1]
    K = len(parts)
    if num_restarts > 1:                                    # row r * K + i: start r of client i
        stacked = {k: v.repeat(num_restarts, *([1] * (v.ndim - 1))) for k, v in stacked.items()}
        if labels is not None:
            labels = labels.repeat(num_restarts, 1)
    knows = gi.Knowledge(input_shape=tuple(input_shape), num_classes=num_classes, batch_size=batch_size, labels=labels)
    res = gi.dlg(model, params, stacked, knows=knows, budget=replace(budget, num_restarts=1), stacked=True, seed=seed)
    x, lab = res.x, res.labels
    loss = torch.as_tensor(np.asarray(res.final_loss, dtype=float)).reshape(num_restarts, K)
    loss = torch.where(torch.isfinite(loss), loss, torch.full_like(loss, float("inf")))
    final = loss[0]
    if num_restarts > 1:
        best = loss.argmin(0)
        pick = best * K + torch.arange(K)
        x, lab, final = x[pick], lab[pick], loss[best, torch.arange(K)]
    psnr = None
    if x_true is not None:
        psnr = np.stack([matched_psnr(x[i], x_true[k]) for i, k in enumerate(parts)])
    return TranscriptInversion(parts, x, lab, psnr, _is_fedsgd(transcript.meta), final.numpy())


def membership_signals(model_fn: Callable[[], nn.Module], transcript: Transcript, partition: int,
                       X: torch.Tensor, y: torch.Tensor, *, rounds=None, signal: str = "loss") -> torch.Tensor:
    """Chapter 1c's passive signal of candidate records ``(X, y)`` under the models that client
    ``partition`` returned (:func:`fedlab.attacks.membership.snapshot_signals`): ``[T, n]``, one row per
    round the client took part in (of ``rounds`` when given).

    Raises ``ValueError`` when the client returned no model in those rounds.
    """
    rounds = None if rounds is None else {_round(transcript, t) for t in rounds}
    snaps = [r.params for r in transcript.train_replies()
             if r.partition_id == partition and (rounds is None or r.round in rounds)]
    if not snaps:
        raise ValueError(f"partition {partition} returned no model in the transcript's rounds {rounds or 'all'}")
    return membership.snapshot_signals(model_fn(), snaps, X, y, signal=signal)


def membership_auc(model_fn: Callable[[], nn.Module], transcript: Transcript, partition: int, X: torch.Tensor,
                   y: torch.Tensor, is_member, *, window: int = 1, signal: str = "loss") -> float:
    """ROC AUC of the passive membership attack (:func:`fedlab.attacks.membership.attack_auc`, the mean
    signal over the last ``window`` models client ``partition`` returned) on candidates ``(X, y)`` with
    labels ``is_member`` (1: in the client's training data)."""
    return membership.attack_auc(membership_signals(model_fn, transcript, partition, X, y, signal=signal),
                                 is_member, window)


def eavesdropped_pairs(transcript: Transcript, partition: int, *, max_obs: int | None = None):
    """What chapter 4's eavesdropper on client ``partition``'s link sees, read off a transcript (Xu &
    Neglia 2021, Sec. 3.2, the messages ``M^c``): for every round ``t`` in which the client returned a
    model, the global model ``w_{t-1}`` the server sent it and the model it returned, flattened in the
    transcript's parameter order (:func:`fedlab.models.flatten_params`, as
    :class:`fedlab.attacks.model_reconstruction.Eavesdropper` does on :func:`fedlab.fl.fedavg`).

    Returns ``(theta_in [n, d], theta_out [n, d], rounds [n])`` (float64, the first ``max_obs``
    observations when given).

    Raises
    ------
    ValueError
        When the client returned no model in the transcript (for example under secure aggregation,
        where no reply carries a model) or ``max_obs < 1``.
    """
    if max_obs is not None and (isinstance(max_obs, bool) or not isinstance(max_obs, (int, np.integer)) or max_obs < 1):
        raise ValueError(f"max_obs must be a positive integer or None, got {max_obs!r}")
    replies = [r for r in transcript.train_replies() if r.partition_id == partition and r.params]
    if not replies:
        raise ValueError(f"partition {partition} returned no model in transcript {transcript.path} "
                         f"(train replies with parameters: {len([r for r in transcript.train_replies() if r.params])})")
    replies = sorted(replies, key=lambda r: r.round)[:max_obs]
    names = transcript.param_names
    flat = lambda p: flatten_params({k: p[k] for k in names}).double()  # noqa: E731
    theta_in = torch.stack([flat(transcript.globals[r.round - 1]) for r in replies])
    theta_out = torch.stack([flat(r.params) for r in replies])
    return theta_in, theta_out, np.array([r.round for r in replies])


@dataclass
class LocalModelReconstruction:
    """Result of :func:`reconstruct_local_models`: ``partitions`` in attack order, the decoded local
    optima ``theta`` ``[P, d]`` (flattened in the transcript's parameter order, see ``params``), the
    eavesdropped pairs ``theta_in`` / ``theta_out`` ``[P, n, d]`` the decoder used, the last returned
    models ``last`` ``[P, d]`` (the baseline), ``num_obs`` and the decoder's diagnostics:
    ``identifiable`` ``[P]`` (affine: rank ``d + 1`` of ``[theta_in, -1]``, else ``None``), ``residual``
    (affine) or ``mapping_loss`` ``[P]`` (heuristic)."""

    partitions: list
    method: str
    theta: torch.Tensor
    theta_in: torch.Tensor
    theta_out: torch.Tensor
    last: torch.Tensor
    num_obs: int
    param_names: list
    shapes: list
    identifiable: list | None = None
    residual: float | None = None
    mapping_loss: torch.Tensor | None = None

    def params(self, i: int = 0) -> dict:
        """The ``i``-th decoded local optimum as a parameter dict (``{name: tensor}``, float64)."""
        out, j = {}, 0
        for name, shape in zip(self.param_names, self.shapes):
            n = int(np.prod(shape)) if len(shape) else 1
            out[name] = self.theta[i, j:j + n].reshape(shape)
            j += n
        return out


def reconstruct_local_models(transcript: Transcript, partitions, *, method: str = "affine",
                             max_obs: int | None = None, hidden: int = 1000, fit_max_iter: int = 1000,
                             decode_max_iter: int = 1000, seed: int = 0) -> LocalModelReconstruction:
    """Chapter 4's local-model reconstruction (Xu & Neglia 2021) on a Flower transcript: for each client
    of ``partitions``, the pairs :func:`eavesdropped_pairs` (the same ``n`` observations for every
    client: its first ``n = min`` over clients, or ``max_obs``) and the decoded local optimum.

    * ``method="affine"``: :func:`fedlab.attacks.model_reconstruction.solve_affine` (Observation 1:
      exact after ``d + 1`` rounds for least squares with full-batch local gradient descent; the OLS
      estimator of Observation 5 with more rounds); neither ``lr`` nor the local steps are used.
    * ``method="heuristic"``: :func:`fedlab.attacks.model_reconstruction.reconstruct_heuristic`
      (Algorithm 3, ``hidden``, ``fit_max_iter``, ``decode_max_iter``, ``seed``), all clients in one
      batch, started from the last returned model.

    Parameters
    ----------
    partitions : int or sequence of int
        The attacked clients (their data partitions).

    Returns
    -------
    LocalModelReconstruction

    Raises
    ------
    ValueError
        For a ``method`` not in :data:`RECONSTRUCTION_METHODS`, an empty ``partitions``, a client that
        returned no model, or fewer than 2 observations for the heuristic.
    """
    if method not in RECONSTRUCTION_METHODS:
        raise ValueError(f"method must be one of {RECONSTRUCTION_METHODS}, got {method!r}")
    parts = [int(partitions)] if isinstance(partitions, (int, np.integer)) else [int(p) for p in partitions]
    if not parts:
        raise ValueError("partitions must name at least one client")
    pairs = [eavesdropped_pairs(transcript, k, max_obs=max_obs) for k in parts]
    n = min(len(p[0]) for p in pairs)
    tin = torch.stack([p[0][:n] for p in pairs])
    tout = torch.stack([p[1][:n] for p in pairs])
    g0 = transcript.globals[0]
    shapes = [tuple(g0[k].shape) for k in transcript.param_names]
    common = dict(partitions=parts, method=method, theta_in=tin, theta_out=tout, last=tout[:, -1],
                  num_obs=n, param_names=list(transcript.param_names), shapes=shapes)
    if method == "affine":
        est = mr.solve_affine(tin, tout)
        ident = [bool(torch.linalg.matrix_rank(torch.cat([t, -torch.ones(n, 1, dtype=t.dtype)], 1)) == t.shape[1] + 1)
                 for t in tin]
        return LocalModelReconstruction(theta=est.theta, identifiable=ident, residual=est.residual, **common)
    if n < 2:
        raise ValueError(f"the heuristic needs at least 2 observations per client, got {n}")
    res = mr.reconstruct_heuristic(tin, tout, hidden=hidden, fit_max_iter=fit_max_iter,
                                   decode_max_iter=decode_max_iter, seed=seed)
    return LocalModelReconstruction(theta=res.theta, mapping_loss=res.mapping_loss, **common)


# --------------------------------------------------------------------------------------------
# under SecAgg+: what the server still gets
# --------------------------------------------------------------------------------------------
def secagg_error_bound(transcript: Transcript, round: int = 1) -> float:
    """The largest absolute difference, per coordinate, between the weighted average that Flower's SecAgg+
    decoded in ``round`` (``transcript.globals[round]``) and the exact FedAvg average of the same client
    models, from the settings in the transcript's meta (``secagg_settings``, ``sizes``) and the clients of
    the round (its ``secagg-masked`` replies).

    ``secaggplus_mod`` sends ``r_k w_k`` with ``r_k = round(n_k / max_weight * Q) / Q``, clipped to
    ``[-C, C]`` (``C = clipping_range``) and stochastically rounded to a grid of step ``2C / Q``; the
    server decodes ``sum_k r_k w_k / sum_k r_k`` up to the ``m`` rounding errors. So, for client models
    inside ``[-C, C]``::

        |decoded - sum_k n_k w_k / N| <= m (2C / Q) / sum_k r_k + C sum_k |r_k / sum r - n_k / N|.

    Raises ``ValueError`` for a transcript of a run without SecAgg+ or a round without masked replies.
    """
    round = _round(transcript, round)
    settings = transcript.meta.get("secagg_settings")
    if not transcript.meta.get("secagg") or not settings:
        raise ValueError(f"transcript {transcript.path} is not of a SecAgg+ run (meta secagg / secagg_settings)")
    masked = [r for r in transcript.replies if r.kind == "secagg-masked" and r.round == round and r.error is None]
    if not masked:
        raise ValueError(f"transcript {transcript.path} holds no masked reply in round {round}")
    sizes = transcript.meta["sizes"]
    n = np.array([sizes[r.partition_id] for r in masked], dtype=np.float64)
    C, Q, W = float(settings["clipping_range"]), int(settings["quantization_range"]), float(settings["max_weight"])
    r = np.round(n / W * Q) / Q
    return float(len(n) * 2 * C / Q / r.sum() + C * np.abs(r / r.sum() - n / n.sum()).sum())


@dataclass
class ImprintFromAggregate:
    """Result of :func:`imprint_from_aggregate`: the :class:`fedlab.attacks.imprint.ImprintRecovery` of the
    aggregated update, ``rtol`` (the occupancy threshold used), and, when ``X_true`` was given, ``error``
    ``[n]`` (relative error of the nearest recovered vector to each true input), ``recovered`` ``[n]``
    (``error < tol``) and ``rate``."""

    recovery: imp.ImprintRecovery
    rtol: float
    error: torch.Tensor | None = None
    recovered: torch.Tensor | None = None
    rate: float | None = None


def imprint_from_aggregate(transcript: Transcript, *, weight_name: str = "imprint.weight",
                           bias_name: str = "imprint.bias", round: int = 1, X_true: torch.Tensor | None = None,
                           tol: float = 1e-4) -> ImprintFromAggregate:
    """Chapter 1b's imprint attack (Fowl et al. 2022, Sec. 3) on what a server learns under secure
    aggregation: the change of the global model in ``round``, ``w_{round-1} - w_round``, which is ``lr`` times
    the weighted sum of the clients' gradients when they run FedSGD on the imprinted model
    (:func:`fedlab.attacks.imprint.imprint_model`) the server sent. The rows of the imprint layer
    (parameters ``weight_name`` ``[k, dim]`` and ``bias_name`` ``[k]``) are read with
    :func:`fedlab.attacks.imprint.recover_from_imprint`; the common factor ``lr n_k / N`` cancels in each
    ratio. A bin counts as occupied when its bias difference exceeds what rounding can explain: ``1e-8``
    of the largest bias change without SecAgg+, and twice :func:`secagg_error_bound` with it.

    ``X_true``: ``[n, dim]`` the clients' inputs, to score the recovery (``tol``: relative error).

    Raises
    ------
    ValueError
        For a bad ``round``, parameter names the transcript lacks, or a round that changed nothing.
    """
    round = _round(transcript, round)
    g0, g1 = transcript.globals[round - 1], transcript.globals[round]
    for name in (weight_name, bias_name):
        if name not in g0 or name not in g1:
            raise ValueError(f"the transcript's model has no parameter {name!r} (it has {list(g0)})")
    dW = (g0[weight_name] - g1[weight_name]).double()
    db = (g0[bias_name] - g1[bias_name]).double()
    scale = float(db.abs().max())
    if scale == 0:
        raise ValueError(f"the imprint bias did not change in round {round}: no client trained on the imprinted model")
    rtol = 1e-8
    if transcript.meta.get("secagg"):
        rtol = max(rtol, 4 * secagg_error_bound(transcript, round) / scale)
    rec = imp.recover_from_imprint(dW, db, weight=g0[weight_name].double(), bias=g0[bias_name].double(), rtol=rtol)
    out = ImprintFromAggregate(rec, rtol)
    if X_true is not None:
        err = imp.match_recovered(torch.as_tensor(X_true).double().flatten(1), rec.x)
        out.error, out.recovered = err, err < tol
        out.rate = float(out.recovered.double().mean())
    return out


@dataclass
class ItemSums:
    """Result of :func:`item_sums_from_aggregate`: ``sums`` ``[I, k]`` (float64) the per-item sums of the
    round's client updates as the server decodes them, ``bound`` the largest error per coordinate that
    SecAgg+'s rounding allows on them (float rounding without SecAgg+), ``readable`` ``[I]`` (bool) the rows with some
    coordinate above ``bound`` (an item some client of the cohort trained on, for certain), ``cohort`` the
    partitions of the round and ``num_examples`` their ``n_k`` (sent in the clear)."""

    sums: torch.Tensor
    bound: float
    readable: torch.Tensor
    cohort: list
    num_examples: list


def item_sums_from_aggregate(transcript: Transcript, *, name: str = "item_vectors", round: int = 1) -> ItemSums:
    """What a server learns of one round of chapter 2's recommender (London 2020, Sec. 6) from the aggregate
    alone: the change of the global parameter ``name`` (``[I, k]``, one row per item) times the number
    ``m`` of the round's clients, i.e. ``sum_k (n_k / mean n) (w_k - w)``, the per-item sum of the clients'
    updates (:func:`fedlab.attacks.identifiability.secure_aggregate_items`) when every client holds equally
    many examples, as chapter 2's clients do (each rates ``N`` items).

    A client's update of an item's row is non-zero only if it trained on that item, so the non-zero rows
    say which items the cohort touched, and a row touched by one client only is that client's own update.
    Under Flower's SecAgg+ (a SecAgg+ transcript, clients taken from its ``secagg-masked`` replies)
    each coordinate of the sums is off by at most ``bound = m *`` :func:`secagg_error_bound`; a row with a
    coordinate above ``bound`` is certainly touched (``readable``), a touched row whose change is smaller is
    lost in the rounding. Without SecAgg+ the clients are the round's train replies and ``bound`` is ``m`` times
    the float rounding of an average (``8 eps max|w|``, ``eps`` of the parameter's dtype).

    Returns
    -------
    ItemSums

    Raises
    ------
    ValueError
        For a bad ``round``, a ``name`` the transcript's model lacks or that is not 2-D, or a round without
        clients.
    """
    round = _round(transcript, round)
    g0, g1 = transcript.globals[round - 1], transcript.globals[round]
    if name not in g0 or name not in g1:
        raise ValueError(f"the transcript's model has no parameter {name!r} (it has {list(g0)})")
    if g0[name].dim() != 2:
        raise ValueError(f"parameter {name!r} must be [num_items, k], got shape {tuple(g0[name].shape)}")
    if transcript.meta.get("secagg"):
        replies = [r for r in transcript.replies if r.kind == "secagg-masked" and r.round == round and r.error is None]
        bound_avg = secagg_error_bound(transcript, round) if replies else 0.0
    else:   # FedAvg's average of equal rows may differ from them by float rounding
        replies = transcript.train_replies(round)
        bound_avg = 8 * torch.finfo(g0[name].dtype).eps * float(g0[name].abs().max())
    if not replies:
        raise ValueError(f"transcript {transcript.path} holds no client update in round {round}")
    sizes = transcript.meta.get("sizes")
    cohort = sorted(int(r.partition_id) for r in replies)
    n = [int(sizes[k]) if sizes is not None else None for k in cohort]
    m = len(cohort)
    sums = (g1[name].double() - g0[name].double()) * m
    bound = m * bound_avg
    readable = sums.abs().amax(dim=1) > bound
    return ItemSums(sums, float(bound), readable, cohort, n)


# --------------------------------------------------------------------------------------------
# a malicious server inside SecAgg+ (hooks of fedlab.flower.secagg.SecAggWorkflow)
# --------------------------------------------------------------------------------------------
def _target(target) -> int:
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or target < 0:
        raise ValueError(f"target must be a partition id (integer >= 0), got {target!r}")
    return int(target)


class _HonestHooks:
    """The honest server's hooks; the attacks override one each."""

    def fit_content(self, node, content, ctx):
        return content

    def survivors(self, node, survivors, ctx):
        return list(survivors)

    def unmask_lists(self, node, active, dead, ctx):
        return list(active), list(dead)


@dataclass
class FalseDropout(_HonestHooks):
    """The false-dropout lie (the attack Bonawitz et al.'s consistency round exists for, CCS 2017, Sec. 6).
    In the unmask stage every client but the target is told that the target (partition ``target``) dropped
    out, while the target stays in their active list: each returns a share of the target's self-mask seed
    (for an active node) *and* of its mask key ``sk1`` (for a dropped one). With ``t`` of each the server
    removes every mask from the target's masked model (its model, to SecAgg+'s rounding step) and still
    decodes the right aggregate. Flower's ``secaggplus_mod`` does not check that the two lists are disjoint."""

    target: int

    def __post_init__(self):
        self.target = _target(self.target)

    def unmask_lists(self, node, active, dead, ctx):
        t = ctx.target_node
        if node == t or t not in active:
            return list(active), list(dead)
        return list(active), sorted(set(dead) | {t})


@dataclass
class SplitView(_HonestHooks):
    """The split view against clients that refuse a node listed both active and dropped
    (:func:`fedlab.flower.secagg.disjoint_lists_mod`): of the other survivors, ``t`` (sorted by node id) are
    told the target dropped (they return shares of its mask key), the rest that it is active (they and the
    target itself return shares of its self-mask seed). Each client's lists are consistent. Under the
    consistency round the same groups are shown two survivor sets. It needs ``n >= 2 t`` survivors.

    Raises ``ValueError`` (in the round) when the survivors cannot be split so."""

    target: int

    def __post_init__(self):
        self.target = _target(self.target)

    def _dropped_group(self, ctx) -> set:
        others = sorted(set(ctx.survivors) - {ctx.target_node})
        if len(others) - ctx.threshold + 1 < ctx.threshold:
            raise ValueError(f"a split view needs n >= 2t survivors: {len(others) + 1} survivors, t={ctx.threshold}")
        return set(others[:ctx.threshold])

    def survivors(self, node, survivors, ctx):
        if node in self._dropped_group(ctx):
            return [j for j in survivors if j != ctx.target_node]
        return list(survivors)

    def unmask_lists(self, node, active, dead, ctx):
        t = ctx.target_node
        if node in self._dropped_group(ctx) and t in active:
            return [j for j in active if j != t], sorted(set(dead) | {t})
        return list(active), list(dead)


def zero_decoy(model_fn: Callable[[], nn.Module]) -> dict:
    """A decoy for :class:`InconsistentModel`: every parameter of ``model_fn()`` set to zero. In a network
    whose hidden units pass zero to a zero output layer (chapter 1a's sigmoid LeNet, a ReLU MLP), the
    gradient of every layer before the output layer vanishes on *any* input, so a client trained on it
    returns those parameters unchanged (:func:`silenced_parameters` checks which)."""
    return {k: torch.zeros_like(v.detach()) for k, v in model_fn().named_parameters()}


@dataclass
class InconsistentModel(_HonestHooks):
    """Model inconsistency (Pasquini et al., CCS 2022, "Eluding secure aggregation in federated learning via
    model inconsistency"): the server sends the target (partition ``target``) the real global model and every
    other client ``decoy`` (``{name: tensor}``, default :func:`zero_decoy`'s zeros, given by the caller as a
    dict). SecAgg+ runs honestly; the decoded weighted average is ``(r_t w_t + sum_{k != t} r_k w_k') /
    sum r``, and on the parameters the decoy silences every ``w_k'`` equals the decoy, so
    :func:`isolate_from_aggregate` reads off ``w_t``."""

    target: int
    decoy: dict

    def __post_init__(self):
        self.target = _target(self.target)
        if not isinstance(self.decoy, dict) or not self.decoy:
            raise ValueError("decoy must be a non-empty {name: tensor} dict (see zero_decoy)")

    def fit_content(self, node, content, ctx):
        if node == ctx.target_node:
            return content
        import flwr.compat.common.recorddict_compat as compat
        from flwr.common import ndarrays_to_parameters

        missing = [k for k in ctx.names if k not in self.decoy]
        if missing:
            raise ValueError(f"the decoy lacks parameters {missing}")
        fitins = compat.recorddict_to_fitins(content, keep_input=True)
        fitins.parameters = ndarrays_to_parameters([torch.as_tensor(self.decoy[k]).detach().cpu().numpy()
                                                    for k in ctx.names])
        return compat.fitins_to_recorddict(fitins, keep_input=True)


def isolate_from_aggregate(transcript: Transcript, target: int, decoy: dict, *, round: int = 1) -> dict:
    """The target's model under :class:`InconsistentModel`, from the aggregate SecAgg+ decoded
    (``transcript.globals[round]``) and what the server knows in the clear: the clients of the round (its
    ``secagg-masked`` replies), their ``n_k`` (``meta["sizes"]``) and SecAgg+'s weights ``r_k =
    round(n_k / max_weight * Q) / Q``::

        w_t = (sum_k r_k * aggregate - sum_{k != t} r_k * decoy) / r_t

    exact (to SecAgg+'s rounding, amplified by ``sum r / r_t``) on every parameter the decoy silences.
    Returns ``{name: float64 tensor}``.

    Raises ``ValueError`` for a transcript of a run without SecAgg+, a target not among the round's clients,
    or a decoy without the model's parameters."""
    round = _round(transcript, round)
    settings = transcript.meta.get("secagg_settings")
    if not transcript.meta.get("secagg") or not settings:
        raise ValueError(f"transcript {transcript.path} is not of a SecAgg+ run (meta secagg / secagg_settings)")
    cohort = sorted({int(r.partition_id) for r in transcript.replies
                     if r.kind == "secagg-masked" and r.round == round and r.error is None})
    if target not in cohort:
        raise ValueError(f"target {target} sent no masked model in round {round} (clients: {cohort})")
    agg = transcript.globals[round]
    missing = [k for k in agg if k not in decoy]
    if missing:
        raise ValueError(f"the decoy lacks parameters {missing}")
    Q, W = int(settings["quantization_range"]), float(settings["max_weight"])
    r = {k: round_half_even(transcript.meta["sizes"][k] / W * Q) / Q for k in cohort}
    total, rest = sum(r.values()), sum(v for k, v in r.items() if k != target)
    return {k: (total * agg[k].double() - rest * torch.as_tensor(decoy[k]).double()) / r[target] for k in agg}


def round_half_even(x: float) -> int:
    """Python's ``round`` (half to even), as ``secaggplus_mod`` rounds a weight."""
    return int(round(x))


def silenced_parameters(model_fn: Callable[[], nn.Module], decoy: dict, X: torch.Tensor, y: torch.Tensor,
                        loss_fn=None) -> list[str]:
    """The parameters whose gradient at ``decoy`` is exactly zero on every probe ``(X [n, ...], y [n])``, one
    example at a time (the server probes with inputs of its own; a zero for every probe is what makes a
    client's update on those parameters predictable)."""
    from ..fl import cross_entropy

    loss_fn = loss_fn or cross_entropy
    model = model_fn()
    params = {k: torch.as_tensor(decoy[k]).clone().requires_grad_(True) for k, _ in model.named_parameters()}
    silent = set(params)
    for i in range(len(X)):
        out = torch.func.functional_call(model, params, (X[i:i + 1],))
        grads = torch.autograd.grad(loss_fn(out, y[i:i + 1]), list(params.values()), allow_unused=True)
        silent -= {k for k, g in zip(params, grads) if g is not None and bool(g.abs().max() > 0)}
    return [k for k in params if k in silent]


def invert_model(model_fn: Callable[[], nn.Module], global_params: dict, client_params: dict, *, lr: float,
                 input_shape: tuple, num_classes: int, max_iter: int = 100, x_true: torch.Tensor | None = None,
                 seed: int = 0, num_restarts: int = 1):
    """iDLG (Zhao et al. 2020) on one client's FedSGD model recovered by a malicious server: the gradient
    ``(global - client) / lr``, the label from its last layer, one image of ``input_shape``, from
    ``num_restarts`` random starts (one stacked call; start 0 is the one-start run's), keeping the start of
    least matching loss (:func:`invert_gradients`).

    Returns ``(x [1, *input_shape], label, psnr)`` (``psnr`` against ``x_true`` ``[1, *input_shape]``, else
    ``None``). Raises ``ValueError`` for a ``num_restarts`` below 1."""
    if isinstance(num_restarts, bool) or not isinstance(num_restarts, int) or num_restarts < 1:
        raise ValueError(f"num_restarts must be an integer >= 1, got {num_restarts!r}")
    grad = {k: ((torch.as_tensor(global_params[k]).double() - torch.as_tensor(client_params[k]).double()) / lr)
            .to(torch.as_tensor(global_params[k]).dtype)[None] for k in global_params}
    label = gi.idlg_label({k: v[0] for k, v in grad.items()})
    grad = {k: v.repeat(num_restarts, *([1] * (v.ndim - 1))) for k, v in grad.items()}   # row r: start r
    knows = gi.Knowledge(input_shape=tuple(input_shape), num_classes=num_classes, batch_size=1,
                         labels=torch.tensor([[label]] * num_restarts))
    res = gi.dlg(model_fn(), dict(global_params), grad, knows=knows,
                 budget=gi.AttackBudget(max_iter=max_iter, lr=1.0), stacked=True, seed=seed)
    loss = np.asarray(res.final_loss, dtype=float).reshape(num_restarts)
    best = int(np.argmin(np.where(np.isfinite(loss), loss, np.inf)))
    psnr = None if x_true is None else float(matched_psnr(res.x[best], x_true)[0])
    return res.x[best], int(label), psnr
