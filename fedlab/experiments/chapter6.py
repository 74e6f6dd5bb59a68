"""The bookkeeping of Chapter 6 (from the book to a real federation) and Chapter 6b (its secure aggregation):
the chapters' federations and attacks run on what a Flower server recorded (Beutel et al. 2020, Flower;
:mod:`fedlab.flower`). Chapter 6b uses the secure-aggregation helpers below, from :func:`secagg_stages` on,
and chapter 6's :func:`fedsgd_clients`.

* :func:`membership_federation`: chapter 1c's federation (10 clients with 20 scikit-learn digits each)
  with each client's candidate records (its own 20 members and 20 outsiders);
* :func:`reply_membership`: chapter 1c's passive attack (:func:`fedlab.flower.attacks.membership_auc`)
  on every client's returned models, beside a permutation floor (:func:`permutation_floor`) and the
  same attack on the *released global models* (what another participant sees);
* :func:`fedsgd_clients` / :func:`fedsgd_attack`: chapter 1a's FedSGD victims (one digit per client,
  the sigmoid LeNet) and DLG / iDLG (:func:`fedlab.flower.attacks.invert_gradients`) on the transcript,
  with the PSNR of a flat grey image as the floor a reconstruction has to beat;
* tables of a transcript's messages, of the DP wrappers' effect and of this chapter beside the stored
  records of chapters 1a and 1c;
* :func:`least_squares_clients`, :func:`eavesdrop_least_squares`, :func:`eavesdrop_logistic`: the
  eavesdropper of chapters 4 and 4b (:func:`fedlab.flower.attacks.reconstruct_local_models`) on a Flower transcript beside the
  same attack on :func:`fedlab.fl.fedavg`'s run (:class:`fedlab.attacks.model_reconstruction.Eavesdropper`);
* :func:`secagg_stages`, :func:`secagg_markdown`, :func:`masked_uniformity`: what a Flower server receives
  under SecAgg+, stage by stage;
* :func:`imprint_clients`, :func:`imprint_rows`, :func:`imprint_error_text`, :func:`imprint_markdown`: chapter
  1b's imprint attack by a malicious server through SecAgg+'s aggregate (:func:`fedlab.flower.attacks.imprint_from_aggregate`);
* :func:`secagg_outcome`, :func:`exposed_model`, :func:`survivor_average`, :func:`malicious_markdown`: a
  malicious server inside SecAgg+ (:mod:`fedlab.flower.attacks`' false dropout, split view and model
  inconsistency), the consistency round (:mod:`fedlab.flower.secagg`) and dropouts, summarised;
* :func:`item_federation`, :func:`item_sums_check`, :func:`item_sums_markdown`: chapter 2's recommender as a
  Flower federation, and the per-item sums its SecAgg+ aggregate still reveals
  (:func:`fedlab.flower.attacks.item_sums_from_aggregate`) beside chapter 2b's own count
  (:func:`fedlab.experiments.chapter2.secagg_experiment`).

This module reads transcripts and never imports ``flwr``; the notebooks run the federations with
:func:`fedlab.flower.run`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import math

import numpy as np
import torch
from torch import nn

from .. import data, fl, metrics, models
from .._checks import positive_int
from ..attacks import gradient_inversion as gi
from ..attacks import identifiability as pac
from ..attacks import imprint as imp
from ..attacks import membership as mia
from ..attacks import model_reconstruction as mr
from ..fl.recsys import ratings as rec
from ..flower import attacks as fa
from . import chapter2 as ch2
from ..flower.transcript import Transcript
from ..plots import MarkdownText, md_table

__all__ = ["MembershipFederation", "membership_federation", "max_abs_difference", "round_differences",
           "plot_round_differences", "transcript_markdown",
           "permutation_floor", "reply_membership", "fedsgd_clients", "grey_psnr", "fedsgd_attack",
           "update_norms", "plot_clipping", "defense_rows", "defense_markdown", "compare_markdown", "COMPARE_1A", "COMPARE_1B",
           "least_squares_clients", "eavesdrop_least_squares", "eavesdrop_logistic", "secagg_stages", "secagg_markdown",
           "masked_uniformity", "imprint_clients", "imprint_rows", "imprint_worst_error", "imprint_error_text", "imprint_markdown", "CHAPTER2",
           "ItemScores", "ItemFederation", "item_federation", "item_sums_check", "item_sums_markdown", "secagg_outcome",
           "exposed_model", "survivor_average", "malicious_markdown", "MALICIOUS_COLUMNS"]

#: values of chapter 1a's stored record quoted beside ours: record name -> (our name, label, decimals)
COMPARE_1A = {"idlg_acc": ("idlg_acc", "iDLG label accuracy", 3),
              "dlg_label_acc": ("dlg_label_acc", "DLG label accuracy", 3),
              "dlg_success": ("dlg_success", "DLG success (PSNR ≥ 20 dB)", 3),
              "dlg_median_psnr": ("dlg_median_psnr", "DLG median PSNR (dB)", 1)}
#: values of chapter 1c's stored record quoted beside ours
COMPARE_1B = {"auc_last": ("mia_auc", "passive MIA AUC, last returned model (mean over clients)", 3)}


@dataclass
class MembershipFederation:
    """Chapter 1c's federation: ``clients`` (:class:`fedlab.fl.ClientData`, ``K`` clients of ``n``
    digits), the candidates of each client ``cand_X`` ``[K, 2n, 64]`` / ``cand_y`` ``[K, 2n]`` (its
    ``n`` members first, then ``n`` outsiders), ``is_member`` ``[2n]`` and the ``test`` set."""

    clients: fl.ClientData
    cand_X: torch.Tensor
    cand_y: torch.Tensor
    is_member: np.ndarray
    test: data.Dataset


def membership_federation(seed: int, *, num_clients: int = 10, n_per_client: int = 20) -> MembershipFederation:
    """Chapter 1c's setting (its first cells): scikit-learn digits split in half (train / held out),
    the held-out half split into a pool of outsiders and a test set, ``num_clients`` IID clients of
    ``n_per_client`` training digits, and for every client its members and as many outsiders.

    Raises ``ValueError`` for a non-positive count or more records than the split holds."""
    num_clients = positive_int("num_clients", num_clients)
    n = positive_int("n_per_client", n_per_client)
    digits = data.load_digits()
    train, held_out = data.train_test_split(digits, test_fraction=0.5, seed=seed)
    nonmember_pool, test = data.train_test_split(held_out, test_fraction=0.5, seed=seed)
    if num_clients * n > min(len(train), len(nonmember_pool)):
        raise ValueError(f"num_clients * n_per_client = {num_clients * n} exceeds the {len(nonmember_pool)} "
                         "outsiders available")
    parts = [p[:n] for p in data.partition_iid(len(train), num_clients, seed=seed)]
    clients = fl.stack_clients(data.client_datasets(train, parts))
    nm = nonmember_pool.subset(np.arange(num_clients * n))
    dim = clients.X.shape[-1]
    cand_X = torch.cat([clients.X, nm.X.reshape(num_clients, n, dim)], dim=1)
    cand_y = torch.cat([clients.y, nm.y.reshape(num_clients, n)], dim=1)
    return MembershipFederation(clients, cand_X, cand_y, np.r_[np.ones(n), np.zeros(n)], test)


def max_abs_difference(a: Mapping, b: Mapping) -> float:
    """The largest absolute difference between two parameter dicts with the same names and shapes.

    Raises ``ValueError`` when the names or shapes differ."""
    if set(a) != set(b):
        raise ValueError(f"a and b must hold the same parameters, got {sorted(a)} and {sorted(b)}")
    out = 0.0
    for k in a:
        x, y = torch.as_tensor(a[k]).double(), torch.as_tensor(b[k]).double()
        if x.shape != y.shape:
            raise ValueError(f"parameter {k!r} has shape {tuple(x.shape)} in a and {tuple(y.shape)} in b")
        out = max(out, float((x - y).abs().max()) if x.numel() else 0.0)
    return out


def round_differences(transcript: Transcript, reference_globals: Sequence[Mapping]) -> dict:
    """Where a Flower run and :func:`fedlab.fl.fedavg` part, round by round.

    ``reference_globals``: fedavg's global model after rounds ``1..T`` (e.g.
    :attr:`fedlab.attacks.membership.SnapshotRecorder.global_models`). Returns ``{"end_to_end": [T]``
    (the largest absolute difference between the two global models after round ``t``),
    ``"aggregation": [T]`` (between Flower's global model of round ``t`` and
    :func:`fedlab.fl.weighted_average` of the replies Flower received in that round, weighted by
    ``num-examples``: the rounding of Flower's own average alone)``}``.

    Raises ``ValueError`` when the transcript and the reference hold different numbers of rounds."""
    T = transcript.num_rounds
    if len(reference_globals) != T:
        raise ValueError(f"reference_globals holds {len(reference_globals)} rounds, the transcript {T}")
    end, agg = [], []
    for t in range(1, T + 1):
        end.append(max_abs_difference(transcript.globals[t], reference_globals[t - 1]))
        replies = transcript.train_replies(t)
        stacked = {k: torch.stack([r.params[k] for r in replies]) for k in transcript.param_names}
        avg = fl.weighted_average(stacked, torch.tensor([float(r.num_examples) for r in replies]))
        agg.append(max_abs_difference(avg, transcript.globals[t]))
    return {"end_to_end": np.array(end), "aggregation": np.array(agg)}


def plot_round_differences(diffs: Mapping[str, np.ndarray], *, title: str = ""):
    """:func:`round_differences` against the round (log scale; a zero is drawn at the axis' floor, 1e-9).
    Returns the matplotlib ``Axes``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    rounds = np.arange(1, len(diffs["end_to_end"]) + 1)
    any_zero = False
    for key, label in (("end_to_end", "global models, Flower vs fedavg"),
                       ("aggregation", "Flower's average vs fedlab's, same replies")):
        values = np.asarray(diffs[key], dtype=float)
        zero = values == 0
        any_zero |= bool(zero.any())
        if zero.all():
            label += ": exactly 0 at every round"
        ax.plot(rounds, np.maximum(values, 1e-9), marker=".", label=label)
    ax.axhline(float(np.finfo(np.float32).eps), color="gray", ls=":", lw=1, label="float32 epsilon")

    ax.set(yscale="log", xlabel="round", ylabel="largest absolute difference", title=title)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))   # rounds are whole numbers
    # a zero has no place on a log axis: the legend says where it is drawn
    ax.legend(fontsize=8, title="a difference of exactly 0 is drawn at 1e-9" if any_zero else None, title_fontsize=8)
    return ax


def transcript_markdown(transcript: Transcript, *, rows: int = 6) -> MarkdownText:
    """The first ``rows`` train replies of a transcript as a Markdown table (round, Flower node id,
    partition, examples, train loss, the size of the returned arrays), plus one line of totals."""
    rows = positive_int("rows", rows)
    replies = [r for r in transcript.replies if r.kind == "train"]
    cells = []
    for r in replies[:rows]:
        size = sum(int(np.prod(v.shape)) for v in r.params.values())
        loss = r.metrics.get("train-loss")
        cells.append([str(r.round), str(r.node_id), str(r.partition_id), str(r.num_examples),
                      "n/a" if loss is None else f"{loss:.3f}", f"{size:,}"])
    table = md_table(["round", "node id", "partition", "examples", "train loss", "arrays (floats)"], cells,
                     align="rrrrrr")
    return MarkdownText(f"{table}\n\n{len(replies)} train replies in {transcript.num_rounds} rounds, "
                        f"{len(transcript.globals)} global models (round 0 is the initial one).")


def permutation_floor(scores: torch.Tensor, is_member, *, num_permutations: int = 200, quantile: float = 0.95,
                      seed: int = 0) -> float:
    """The ``quantile`` of the mean-over-clients AUC when the membership labels are shuffled: what an
    attack with no signal reaches by chance on these candidates.

    ``scores``: ``[K, r]`` membership scores (higher = member), ``is_member``: ``[r]``. Each
    permutation draws one shuffle of the labels per client; all AUCs come from one
    :func:`fedlab.metrics.roc_auc_rows` call. Raises ``ValueError`` for mismatched shapes or a
    ``quantile`` outside (0, 1)."""
    scores = torch.as_tensor(scores).double()
    labels = torch.as_tensor(np.asarray(is_member), dtype=torch.float64)
    if scores.ndim != 2 or scores.shape[1] != labels.numel():
        raise ValueError(f"scores must be [K, {labels.numel()}], got {tuple(scores.shape)}")
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    P = positive_int("num_permutations", num_permutations)
    K, r = scores.shape
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.argsort(torch.rand(P * K, r, generator=gen), dim=1)
    auc = metrics.roc_auc_rows(labels[perm], scores.repeat(P, 1)).reshape(P, K).mean(1)
    return float(torch.quantile(auc, quantile))


def reply_membership(model_fn: Callable, transcript: Transcript, fed: MembershipFederation, *,
                     window: int = 1, num_permutations: int = 200, seed: int = 0) -> dict:
    """Chapter 1c's passive attack on a transcript, for every client on its own candidates.

    Returns ``{"auc": [K] (each client's AUC from its returned models, mean of the last ``window``),
    "mia_auc": their mean, "floor": the 95 % permutation floor of that mean, "global_auc": the mean
    AUC of the same score under the released global models of the rounds (what a participant or an
    outsider sees), "global_floor": its floor}``.
    """
    K = fed.cand_X.shape[0]
    model = model_fn()
    sig = torch.stack([fa.membership_signals(model_fn, transcript, k, fed.cand_X[k], fed.cand_y[k]) for k in range(K)])
    auc = np.array([mia.attack_auc(s, fed.is_member, window) for s in sig])
    released = [transcript.globals[t] for t in range(1, transcript.num_rounds + 1)]
    gsig = torch.stack([mia.snapshot_signals(model, released, fed.cand_X[k], fed.cand_y[k]) for k in range(K)])
    gauc = mia.attack_auc(gsig, fed.is_member, window)
    score = torch.stack([mia.membership_score(s, window) for s in sig])
    gscore = torch.stack([mia.membership_score(s, window) for s in gsig])
    return {"auc": auc, "mia_auc": float(auc.mean()), "global_auc": float(gauc),
            "floor": permutation_floor(score, fed.is_member, num_permutations=num_permutations, seed=seed),
            "global_floor": permutation_floor(gscore, fed.is_member, num_permutations=num_permutations, seed=seed)}


def fedsgd_clients(seed: int, num_clients: int) -> tuple[list, Callable]:
    """Chapter 1a's DLG victims as a federation: client ``k`` holds digit ``k`` of
    ``digit_images(512, seed=seed)`` (``X`` ``[1, 1, 8, 8]``), and the model is chapter 1a's sigmoid
    LeNet with DLG's initialisation. Returns ``(clients, model_fn)``."""
    from ..data import images

    num_clients = positive_int("num_clients", num_clients)
    digits = images.digit_images(512, seed=seed)
    if num_clients > len(digits):
        raise ValueError(f"num_clients must be at most {len(digits)}, got {num_clients}")
    clients = [(digits.X[k:k + 1], digits.y[k:k + 1]) for k in range(num_clients)]
    return clients, lambda: gi.dlg_init_(models.lenet(1, 10, 8), seed=seed)


def grey_psnr(X: torch.Tensor) -> np.ndarray:
    """PSNR (dB) of a flat grey image (every pixel 0.5) against each image of ``X`` ``[n, ...]``: the
    score of a 'reconstruction' that knows nothing but the pixel range."""
    X = torch.as_tensor(X)
    return np.array([metrics.matched_psnr(torch.full_like(x[None], 0.5), x[None])[0] for x in X])


def update_norms(transcript: Transcript, round: int = 1) -> dict[int, float]:
    """``{partition_id: ||w_{round-1} - w_k||_2}``: the norm of every update the server received."""
    g = transcript.globals[round - 1]
    return {r.partition_id: float(torch.sqrt(sum(((g[k] - r.params[k]).double() ** 2).sum() for k in g)))
            for r in transcript.train_replies(round)}


def fedsgd_attack(model_fn: Callable, transcript: Transcript, clients: Sequence, *, max_iter: int,
                  success_db: float = 20.0, seed: int = 0, num_restarts: int = 1) -> dict:
    """iDLG and DLG (chapter 1a) on the round-1 FedSGD replies of ``transcript``, each from ``num_restarts``
    random starts per client, keeping the start of least matching loss (:func:`fedlab.flower.attacks.invert_gradients`).

    Returns ``{"idlg_acc", "dlg_label_acc", "idlg_psnr" [K], "dlg_psnr" [K], "idlg_success",
    "dlg_success", "dlg_median_psnr", "idlg_median_psnr", "grey_psnr" [K], "norms" [K], "x_idlg",
    "x_dlg"}`` (PSNRs matched per client, success = PSNR >= ``success_db``)."""
    truth = {k: X for k, (X, _) in enumerate(clients)}
    y = torch.cat([yk for _, yk in clients])
    out = {}
    for name, idlg in (("idlg", True), ("dlg", False)):
        inv = fa.invert_gradients(model_fn, transcript, input_shape=tuple(truth[0].shape[1:]), num_classes=10,
                                  budget=gi.AttackBudget(max_iter=max_iter, lr=1.0, num_restarts=num_restarts),
                                  idlg=idlg, x_true=truth, seed=seed)
        psnr = inv.psnr[:, 0]
        out.update({f"{name}_psnr": psnr, f"{name}_success": gi.success_rate(psnr, success_db),
                    f"{name}_median_psnr": float(np.median(psnr)), f"x_{name}": inv.x[:, 0],
                    f"{name}_{'acc' if idlg else 'label_acc'}": float((inv.labels[:, 0] == y).float().mean())})
    norms = update_norms(transcript, 1)
    out["norms"] = np.array([norms[k] for k in range(len(clients))])
    out["grey_psnr"] = grey_psnr(torch.cat([X for X, _ in clients]))
    return out


def plot_clipping(attacks: Mapping[str, dict], clip_norm: float, *, success_db: float = 20.0,
                  baseline: str = "none", defended: str = "client-side DP"):
    """iDLG's PSNR of every FedSGD client against the norm of its update (as sent without DP), without
    DP and under client-side clipping to ``clip_norm`` (dotted: the clipping norm, the success
    threshold and the flat-grey floor). Returns the matplotlib ``Axes``."""
    import matplotlib.pyplot as plt

    base, dp = attacks[baseline], attacks[defended]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.scatter(base["norms"], base["idlg_psnr"], marker="o", label=f"{baseline}")
    ax.scatter(base["norms"], dp["idlg_psnr"], marker="x", label=f"{defended}, C = {clip_norm:g}")
    ax.axvline(clip_norm, color="gray", ls="--", lw=1)
    ax.axhline(success_db, color="gray", ls=":", lw=1, label="success threshold")
    ax.axhline(float(np.median(base["grey_psnr"])), color="black", ls="-.", lw=1, label="flat grey image")
    ax.set(xlabel="norm of the client's update without DP", ylabel="iDLG PSNR (dB)",
           title="iDLG on FedSGD replies a Flower server recorded")
    ax.legend(fontsize=8)
    return ax


def defense_rows(attacks: Mapping[str, dict], membership: Mapping[str, dict], accuracy: Mapping[str, float]) -> dict:
    """One row per defense (the keys of ``attacks``: ``"none"``, ``"server-side DP"``, ...): the numbers
    of :func:`fedsgd_attack`, :func:`reply_membership` and the final global model's test accuracy."""
    if set(attacks) != set(membership) or set(attacks) != set(accuracy):
        raise ValueError("attacks, membership and accuracy must name the same defenses")
    return {d: {"idlg_acc": attacks[d]["idlg_acc"], "idlg_median_psnr": attacks[d]["idlg_median_psnr"],
                "dlg_median_psnr": attacks[d]["dlg_median_psnr"], "dlg_success": attacks[d]["dlg_success"],
                "mia_auc": membership[d]["mia_auc"], "global_auc": membership[d]["global_auc"],
                "accuracy": accuracy[d]} for d in attacks}


def defense_markdown(rows: Mapping[str, dict]) -> MarkdownText:
    """:func:`defense_rows` as a Markdown table (attacks of the server on the replies it recorded,
    the outsiders' attack on the released models, and the cost in test accuracy)."""
    return md_table(["defense", "iDLG labels", "iDLG median PSNR (dB)", "DLG median PSNR (dB)", "DLG success",
                     "MIA AUC on replies", "MIA AUC on global models", "test accuracy"],
                    [[d, f"{r['idlg_acc']:.3f}", f"{r['idlg_median_psnr']:.1f}", f"{r['dlg_median_psnr']:.1f}",
                      f"{r['dlg_success']:.3f}", f"{r['mia_auc']:.3f}", f"{r['global_auc']:.3f}", f"{r['accuracy']:.3f}"]
                     for d, r in rows.items()], align="lrrrrrrr")


def compare_markdown(ours: Mapping[str, float], paper_1a: Callable[[str], str], paper_1c: Callable[[str], str],
                     *, settings: Mapping[str, str]) -> MarkdownText:
    """This build's numbers on Flower transcripts beside the stored paper-scale records of chapters 1a
    and 1c (``paper_1a`` / ``paper_1c``: :meth:`fedlab.records.Run.stored` of those chapters, called with
    the record's name and the number of decimals), only for
    the names those records hold (:data:`COMPARE_1A`, :data:`COMPARE_1B`). ``settings``: the chapter
    name -> one line on how our setting differs."""
    cells = [[chapter, label, f"{ours[our_name]:.{digits}f}", paper(rec_name, digits)]
             for chapter, table, paper in (("1a", COMPARE_1A, paper_1a), ("1c", COMPARE_1B, paper_1c))
             for rec_name, (our_name, label, digits) in table.items()]
    table = md_table(["chapter", "value", "this build, on the Flower transcript", "stored record of the chapter"],
                     cells, align="llrr")
    notes = " ".join(f"**{c}:** {s}" for c, s in settings.items())
    return MarkdownText(table + ("\n\n" + notes if notes else ""))


# ------------------------------------------------------------------------------------------------
# chapter 4 on a transcript: the eavesdropper
# ------------------------------------------------------------------------------------------------
def least_squares_clients(seed: int, *, num_clients: int = 5, dim: int = 10) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Chapter 4's first federation (its Observation 1 cell): client ``k`` holds ``40 + 20 k`` records
    ``X ~ N(0.3 k, 1)^dim`` and ``y = X theta_k + 0.1 N(0, 1)`` with its own ``theta_k ~ N(0, I)``, all
    from one generator seeded ``seed`` (float64). Returns ``[(X [n_k, dim], y [n_k])]``. Raises
    ``ValueError`` for a non-positive count."""
    num_clients, dim = positive_int("num_clients", num_clients), positive_int("dim", dim)
    g = torch.Generator().manual_seed(int(seed))
    clients = []
    for k in range(num_clients):
        X = torch.randn(40 + 20 * k, dim, generator=g, dtype=torch.float64) + 0.3 * k
        y = X @ torch.randn(dim, generator=g, dtype=torch.float64) + 0.1 * torch.randn(len(X), generator=g, dtype=torch.float64)
        clients.append((X, y))
    return clients


def _pairs_difference(transcript: Transcript, reference: mr.Eavesdropper, partitions) -> float:
    """Largest difference between the eavesdropped pairs of a transcript and of a fedavg run (same rounds)."""
    out = 0.0
    for k in partitions:
        ti, to, rounds = fa.eavesdropped_pairs(transcript, k)
        ri, ro, rr = reference.observations(k)
        if not np.array_equal(rounds, rr):
            raise ValueError(f"client {k} was observed in rounds {rounds.tolist()} on Flower, {rr.tolist()} on fedavg")
        out = max(out, float((ti - ri.double()).abs().max()), float((to - ro.double()).abs().max()))
    return out


def eavesdrop_least_squares(transcript: Transcript, reference: mr.Eavesdropper, clients: Sequence) -> dict:
    """Observation 1 of chapter 4 (Xu & Neglia 2021) on a Flower transcript of least-squares clients with
    full-batch local gradient descent: every client's local optimum decoded from its first ``d + 1``
    and its first ``d`` eavesdropped rounds (:func:`fedlab.flower.attacks.reconstruct_local_models`), and
    the same ``d + 1``-round decoding on the pairs the :class:`~fedlab.attacks.model_reconstruction.Eavesdropper`
    of a :func:`fedlab.fl.fedavg` run with the same data and seed recorded.

    Returns ``{"pairs_diff": largest difference between the two runs' pairs, "err_d1", "err_d1_fedavg",
    "err_d": [K] relative errors ||theta_hat - theta_c*|| / ||theta_c*||, "identifiable_d1",
    "identifiable_d": [K] bool, "num_obs": [K] rounds each client was observed}``."""
    K, d = len(clients), clients[0][0].shape[1]
    star = torch.stack([mr.local_optimum(X, y) for X, y in clients])
    rel = lambda th: ((th - star).norm(dim=1) / star.norm(dim=1)).numpy()  # noqa: E731
    full = fa.reconstruct_local_models(transcript, range(K), max_obs=d + 1)
    short = fa.reconstruct_local_models(transcript, range(K), max_obs=d)
    ref = mr.solve_affine(torch.stack([reference.observations(k, d + 1)[0] for k in range(K)]).double(),
                          torch.stack([reference.observations(k, d + 1)[1] for k in range(K)]).double())
    return {"pairs_diff": _pairs_difference(transcript, reference, range(K)), "err_d1": rel(full.theta),
            "err_d1_fedavg": rel(ref.theta), "err_d": rel(short.theta), "identifiable_d1": np.array(full.identifiable),
            "identifiable_d": np.array(short.identifiable),
            "num_obs": np.array([len(fa.eavesdropped_pairs(transcript, k)[2]) for k in range(K)])}


def eavesdrop_logistic(transcript: Transcript, reference: mr.Eavesdropper, clients: Sequence, *, weight_decay: float,
                       fit_max_iter: int, decode_max_iter: int, hidden: int = 1000, seed: int = 0) -> dict:
    """Algorithm 3 of chapter 4b (Xu & Neglia 2021) on a Flower transcript of chapter 4b's Table 1
    federation (binary logistic regression on LEAF's synthetic clients, :class:`fedlab.data.Dataset`),
    beside the same attack (same seed and settings) on the pairs of a :func:`fedlab.fl.fedavg` run.

    Returns ``{"pairs_diff", "decoded", "decoded_fedavg", "last", "oracle": [K] train accuracies, "gap": [K]
    ||theta_hat(Flower) - theta_hat(fedavg)|| / ||theta_c*||,
    "dist_decoded", "dist_decoded_fedavg", "dist_last": [K] relative distances to the regularised local
    optimum theta_c* (:func:`~fedlab.attacks.model_reconstruction.logistic_local_optimum`),
    "mapping_loss": [K], "num_obs": int}``."""
    K = len(clients)
    star = torch.stack([mr.logistic_local_optimum(c.X, c.y, weight_decay=weight_decay) for c in clients])
    kw = dict(hidden=hidden, fit_max_iter=fit_max_iter, decode_max_iter=decode_max_iter, seed=seed)
    ours = fa.reconstruct_local_models(transcript, range(K), method="heuristic", **kw)
    n = ours.num_obs
    tin = torch.stack([reference.observations(k)[0][:n] for k in range(K)]).double()
    tout = torch.stack([reference.observations(k)[1][:n] for k in range(K)]).double()
    ref = mr.reconstruct_heuristic(tin, tout, **kw)
    acc = lambda th: np.array([float(mr.binary_accuracy(th[k], c.X, c.y)) for k, c in enumerate(clients)])  # noqa: E731
    rel = lambda th: ((th - star).norm(dim=1) / star.norm(dim=1)).numpy()  # noqa: E731
    return {"pairs_diff": _pairs_difference(transcript, reference, range(K)), "decoded": acc(ours.theta),
            "decoded_fedavg": acc(ref.theta), "last": acc(ours.last), "oracle": acc(star),
            "gap": ((ours.theta - ref.theta).norm(dim=1) / star.norm(dim=1)).numpy(),
            "dist_decoded": rel(ours.theta), "dist_decoded_fedavg": rel(ref.theta), "dist_last": rel(ours.last),
            "mapping_loss": ours.mapping_loss.numpy(), "num_obs": int(n)}


# ------------------------------------------------------------------------------------------------
# SecAgg+: what the server receives, and what it still learns
# ------------------------------------------------------------------------------------------------
_STAGE_TEXT = {"secagg-keys": "two public keys", "secagg-shares": "key shares encrypted for other clients",
               "secagg-masked": "the masked, quantized model", "secagg-unmask": "key shares to remove the masks"}


def secagg_stages(transcript: Transcript, round: int = 1) -> list[dict]:
    """One row per SecAgg+ stage of ``round`` in a transcript of a SecAgg+ run (``aggregation=flower.SecAgg()``) (in protocol order):
    ``{"kind", "replies", "bytes" (mean per reply), "models" (replies that carry float model parameters),
    "metrics" (names of the values each reply carries in the clear)}``. Raises ``ValueError`` when the round
    holds no SecAgg+ reply."""
    rows = []
    for kind in _STAGE_TEXT:
        rs = [r for r in transcript.replies if r.kind == kind and r.round == round and r.error is None]
        if rs:
            floats = sum(any(v.is_floating_point() for v in r.params.values()) for r in rs)
            rows.append({"kind": kind, "replies": len(rs), "bytes": float(np.mean([r.metrics["bytes"] for r in rs])),
                         "models": int(floats), "metrics": sorted({k for r in rs for k in r.metrics} - {"bytes"})})
    if not rows:
        raise ValueError(f"transcript {transcript.path} holds no SecAgg+ reply in round {round}")
    return rows


def secagg_markdown(rows: Sequence[dict]) -> MarkdownText:
    """:func:`secagg_stages` as a Markdown table."""
    cells = [[f"`{r['kind']}`", _STAGE_TEXT[r["kind"]], str(r["replies"]), f"{r['bytes']:,.0f}", str(r["models"]),
              ", ".join(f"`{m}`" for m in r["metrics"] if m != "masked-weight") or "none"] for r in rows]
    return md_table(["stage", "what each reply carries", "replies", "bytes per reply", "replies with a float model",
                     "values in the clear"], cells, align="llrrrl")


def masked_uniformity(transcript: Transcript, reference: Transcript, round: int = 1) -> dict:
    """How much the masked models of a SecAgg+ transcript say about the models the clients trained: the
    masked ring elements of every ``secagg-masked`` reply, scaled to ``[0, 1)`` by ``modulus_range``, against
    the model the same client returned in ``reference`` (a transcript of the same run without SecAgg+).

    Returns ``{"mean": mean scaled value (1/2 for uniform masks), "ks": largest Kolmogorov-Smirnov distance
    to Uniform(0, 1) over clients, "corr": largest |Pearson correlation| between a client's masked vector
    and its true model, "n": entries per client}``."""
    mod = float(transcript.meta["secagg_settings"]["modulus_range"])
    true = {r.partition_id: r for r in reference.train_replies(round)}
    ks, corr, means, n = [], [], [], 0
    for r in transcript.replies:
        if r.kind != "secagg-masked" or r.round != round:
            continue
        u = torch.cat([r.params[k].reshape(-1).double() for k in transcript.param_names]) / mod
        w = torch.cat([true[r.partition_id].params[k].reshape(-1).double() for k in transcript.param_names])
        s, n = torch.sort(u).values, len(u)
        grid = torch.arange(1, n + 1, dtype=torch.float64) / n
        ks.append(float(torch.maximum((grid - s).abs(), (s - (grid - 1 / n)).abs()).max()))
        corr.append(abs(float(torch.corrcoef(torch.stack([u, w]))[0, 1])))
        means.append(float(u.mean()))
    return {"mean": float(np.mean(means)), "ks": max(ks), "corr": max(corr), "n": n}


def imprint_clients(seed: int, *, num_clients: int = 4, batch_size: int = 8, num_bins: int = 256):
    """Chapter 1b's imprint setting (``chapter1a.imprint_demo``) as a federation: ``num_clients`` clients with
    ``batch_size`` scikit-learn digits each, drawn without replacement (numpy generator ``seed``),
    flattened to ``[batch_size, 64]`` with their labels; and the malicious server's model: the imprint
    module (:func:`fedlab.attacks.imprint.imprint_model`, ``num_bins`` bins, a random unit measurement
    direction drawn with ``seed``, cut-offs from the Gaussian fit of ``h(x)`` over all 1797 digits: known data
    statistics) in front of a linear classifier, in float64.

    Returns ``(clients, model_fn, X)``: the ``(X_k, y_k)`` pairs, a ``() -> ImprintedModel`` and all the
    clients' digits ``[num_clients * batch_size, 64]``. Raises ``ValueError`` for a non-positive count."""
    from ..data import images

    num_clients, batch_size = positive_int("num_clients", num_clients), positive_int("batch_size", batch_size)
    num_bins = positive_int("num_bins", num_bins)
    ds = images.digit_images(None)
    flat = ds.X.reshape(len(ds.X), -1).double()
    if num_clients * batch_size > len(flat):
        raise ValueError(f"num_clients * batch_size = {num_clients * batch_size} exceeds the {len(flat)} digits")
    w = imp.imprint_layer(flat.shape[1], 1, mean=0.0, std=1.0, direction="random", seed=seed)[0][0]
    h = flat @ w
    idx = torch.as_tensor(np.random.default_rng(seed).choice(len(flat), size=num_clients * batch_size, replace=False))
    X, y = flat[idx], ds.y[idx]
    clients = [(X[k * batch_size:(k + 1) * batch_size], y[k * batch_size:(k + 1) * batch_size]) for k in range(num_clients)]
    mean, std = float(h.mean()), float(h.std())

    def model_fn():
        g = torch.Generator().manual_seed(int(seed))
        base = torch.nn.Linear(flat.shape[1], 10)
        with torch.no_grad():
            base.weight.copy_(torch.randn(10, flat.shape[1], generator=g) / flat.shape[1] ** 0.5)
            base.bias.zero_()
        return imp.imprint_model(base, flat.shape[1], num_bins, mean=mean, std=std, direction=w).double()

    return clients, model_fn, X


def imprint_rows(runs: Mapping[str, Transcript], X: torch.Tensor, *, tol: float = 1e-4) -> dict:
    """:func:`fedlab.flower.attacks.imprint_from_aggregate` on each transcript of ``runs`` (label -> a
    one-round FedSGD transcript on the imprinted model), scored against the clients' digits ``X``.

    Returns ``{label: {"rate", "median_error", "decoded", "lr", "quantization_range" (``None`` without
    SecAgg+), "recovered": [n] bool, "error": [n] each digit's relative error to its nearest decoded vector
    (``inf`` when none was decoded), "x": the recovered vectors}}``. ``decoded`` is the number of vectors the
    server decodes (bins whose bias difference clears the occupancy threshold); when it is 0 no digit has a
    nearest vector, and ``median_error`` is ``inf`` (:func:`fedlab.attacks.imprint.match_recovered`): say so
    in words (:func:`imprint_error_text`), never quote it as a number."""
    out = {}
    for label, T in runs.items():
        res = fa.imprint_from_aggregate(T, X_true=X, tol=tol)
        settings = T.meta.get("secagg_settings") or {}
        out[label] = {"rate": res.rate, "median_error": float(res.error.median()),
                      "decoded": int(res.recovery.x.shape[0]), "lr": T.meta["lr"],
                      "quantization_range": settings.get("quantization_range"), "recovered": res.recovered,
                      "error": res.error, "x": res.recovery.x}
    return out


def imprint_worst_error(row: Mapping, digits: torch.Tensor) -> float:
    """The largest relative error, in a row of :func:`imprint_rows`, over the digits ``digits`` marks (``[n]``
    bool, e.g. the ones the plain run recovered): ``inf`` when one of them has no decoded vector, ``0.0`` when
    ``digits`` marks none. Raises ``ValueError`` when ``digits`` does not have one entry per digit."""
    err, digits = row["error"], torch.as_tensor(digits, dtype=torch.bool)
    if digits.shape != err.shape:
        raise ValueError(f"digits must mark each of the row's {err.shape[0]} digits, got shape {tuple(digits.shape)}")
    return float(err[digits].max()) if bool(digits.any()) else 0.0


def imprint_error_text(row: Mapping) -> str:
    """The median relative error of a row of :func:`imprint_rows` as page text: ``"1.2e-01"`` (two significant
    digits) when the server decoded some vector, ``"none: no vector decoded"`` when it decoded none (the error
    is then ``inf``, a nearest vector over an empty set, not a measurement)."""
    if row["decoded"] == 0:
        return "none: no vector decoded"
    return f"{row['median_error']:.1e}"


def imprint_markdown(rows: Mapping[str, dict], expected: float) -> MarkdownText:
    """:func:`imprint_rows` as a Markdown table, with the expected rate ``(k / (k + 1))^n`` of chapter 1b."""
    cells = [[label, "none" if r["quantization_range"] is None else f"$2^{{{int(np.log2(r['quantization_range']))}}}$",
              f"{r['lr']:g}", f"{r['rate']:.3f}", imprint_error_text(r)] for label, r in rows.items()]
    table = md_table(["run", "SecAgg+ quantization $Q$", "learning rate sent", "digits recovered",
                      "median relative error"], cells, align="lrrrr")
    return MarkdownText(f"{table}\n\nChapter 1b's expected rate for this many digits and bins: {expected:.3f}.")


# ------------------------------------------------------------------------------------------------
# chapter 2's recommender under SecAgg+: the per-item sums
# ------------------------------------------------------------------------------------------------
#: chapter 2's federation (its first cells): catalog, factor dimension, items rated per user, batch, step,
#: clients per training round, local steps and the scale of the initial vectors; users and rounds by scale
CHAPTER2 = dict(num_items=200, dim=6, num_rated=50, batch_size=10, lr=0.3, per_round=250, local_steps=5,
                init_scale=0.3, loss="log")


class ItemScores(nn.Module):
    """Chapter 2's predictor ``u_c . v_i`` (London 2020, Sec. 3) as a model with one parameter,
    ``item_vectors`` ``[I, k]`` (the global model): an example is a row ``[one-hot(i) (I), u_c (k)]``, the
    item and the client's private vector, and the output ``[n]`` is the score ``u_c . v_i``. The gradient of
    a row ``v_i`` is zero unless the batch holds item ``i``; with :func:`item_loss` it is Eq. (2)'s.

    Raises ``ValueError`` for an ``item_vectors`` that is not 2-D."""

    def __init__(self, item_vectors: torch.Tensor):
        super().__init__()
        if item_vectors.dim() != 2:
            raise ValueError(f"item_vectors must be [I, k], got shape {tuple(item_vectors.shape)}")
        self.item_vectors = nn.Parameter(item_vectors.detach().clone())

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        I = self.item_vectors.shape[0]
        return ((X[:, :I] @ self.item_vectors) * X[:, I:]).sum(-1)


@dataclass
class ItemFederation:
    """Chapter 2's recommender as a Flower federation (:func:`item_federation`): ``data`` (its
    :class:`~fedlab.fl.recsys.ratings.RecData`), ``honest`` (the model Protocol 1 trained), ``users`` ``[m]``
    the cohort (one Flower client each, partition ``j`` is user ``users[j]``), ``clients`` their ``(X, y)``
    (``[N, I + k]`` rows of :class:`ItemScores`, labels in {-1, +1}), ``model_fn``, ``loss_fn``, ``lr`` (the
    step on the mean loss that equals chapter 2's step ``alpha`` per item: ``alpha N``) and the SecAgg+
    ``clipping_range`` that holds the model."""

    data: rec.RecData
    honest: rec.RecResult
    users: torch.Tensor
    clients: list
    model_fn: Callable
    loss_fn: Callable
    lr: float
    clipping_range: float


def item_federation(seed: int, *, cohort_size: int = 10, num_users: int | None = None,
                    num_rounds: int | None = None) -> ItemFederation:
    """Chapter 2's setting (:data:`CHAPTER2`, ``num_users`` and ``num_rounds`` default to its
    ``pick(quick=500, paper=2000)`` and ``pick(quick=60, paper=150)``): synthetic ratings
    (:func:`~fedlab.fl.recsys.ratings.make_synthetic`), Protocol 1's honest training
    (:func:`~fedlab.fl.recsys.ratings.train_protocol1`), then a cohort of ``cohort_size`` users drawn with
    ``seed``, each a Flower client whose data are its ``N`` rated items. One Flower round with the result's
    ``lr``, ``local_epochs=1`` and ``batch_size=None`` is Protocol 1's client update with one local step on
    all ``N`` items (``R = 1``, ``B = N``): item ``i``'s row moves by ``-alpha l'(y u.v_i) y u_c``.

    Returns
    -------
    ItemFederation

    Raises ``ValueError`` for a ``cohort_size`` below 2 or above the number of users, or a non-positive
    ``num_users`` / ``num_rounds``."""
    from ..config import pick

    num_users = pick(quick=500, paper=2000) if num_users is None else positive_int("num_users", num_users)
    num_rounds = pick(quick=60, paper=150) if num_rounds is None else positive_int("num_rounds", num_rounds)
    m = positive_int("cohort_size", cohort_size)
    if not 2 <= m <= num_users:
        raise ValueError(f"cohort_size must be in [2, num_users={num_users}] (SecAgg+ needs 2 clients), got {m}")
    c = CHAPTER2
    data_ = rec.make_synthetic(num_users, c["num_items"], c["dim"], c["num_rated"],
                               torch.linspace(0.05, 0.45, num_users), seed=seed)
    honest = rec.train_protocol1(data_, num_rounds=num_rounds, clients_per_round=min(c["per_round"], num_users),
                                 local_steps=c["local_steps"], batch_size=c["batch_size"], lr=c["lr"], loss=c["loss"],
                                 init_scale=c["init_scale"], seed=seed)
    users = torch.randperm(num_users, generator=torch.Generator().manual_seed(int(seed)))[:m]
    I, N = c["num_items"], c["num_rated"]
    clients = [(torch.cat([torch.nn.functional.one_hot(data_.items[u], I).double(),
                           honest.user_vectors[u].expand(N, -1)], dim=1), data_.y[u].clone()) for u in users.tolist()]
    V = honest.item_vectors
    clip = float(2 ** math.ceil(math.log2(float(V.abs().max()) + 1.0)))   # SecAgg+ must hold the model's values
    return ItemFederation(data_, honest, users, clients, lambda: ItemScores(V),
                          lambda z, y: rec.margin_loss(y * z, c["loss"]), c["lr"] * N, clip)


def item_sums_check(fed: ItemFederation, sums: "fa.ItemSums", *, seed: int = 0) -> dict:
    """The server's per-item sums (``sums``, from :func:`fedlab.flower.attacks.item_sums_from_aggregate` on
    the federation's round) against chapter 2b's: the clients' exact updates
    (:func:`~fedlab.fl.recsys.ratings.protocol1_client_update`, ``R = 1``, ``B = N``), their per-item sums
    and contributor counts (:func:`~fedlab.attacks.identifiability.secure_aggregate_items`) and
    :func:`fedlab.experiments.chapter2.secagg_experiment` on the same cohort (one cohort of ``m``; its
    shuffle of the members changes nothing then).

    Returns a dict: ``max_error`` (largest ``|server's sum - exact sum|`` per coordinate), ``bound``,
    ``touched`` (items some member trained on), ``readable`` (rows above the bound), ``false_rows``
    (readable rows nobody touched), ``single`` (items with one contributor, ``secagg_experiment``'s count),
    ``single_counted`` (the same from the counts here), ``single_readable`` (those above the bound: the server
    holds that member's own update of the item, to within ``bound``), ``single_rel_error`` (median relative
    L2 error of those rows against the member's update), ``single_cos`` (median ``|cos|`` between those rows
    and the member's ``u_c``), ``exposed_exact`` (``secagg_experiment``'s fraction of members exposed by the
    exact sums), ``exposed`` (fraction of members with a readable single-contributor row), ``m``.

    Raises ``ValueError`` when ``sums`` is not of the federation's cohort."""
    m, c = len(fed.users), CHAPTER2
    if sums.cohort != list(range(m)):
        raise ValueError(f"sums must be of the federation's {m} clients (partitions 0..{m - 1}), got {sums.cohort}")
    U, items, y = fed.honest.user_vectors[fed.users], fed.data.items[fed.users], fed.data.y[fed.users]
    N, I = items.shape[1], c["num_items"]
    _, deltas = rec.protocol1_client_update(U, fed.honest.item_vectors, items, y, local_steps=1, batch_size=N,
                                            lr=c["lr"], loss=c["loss"])
    exact = pac.secure_aggregate_items(deltas, items, I, m)[0]                                     # [I, k]
    touched = rec.touched_items(deltas)                                                           # [m, N]
    counts = pac.secure_aggregate_items(touched[..., None].double(), items, I, m)[0, :, 0]        # [I]
    sub_data = rec.RecData(fed.data.item_vectors, fed.data.user_vectors[fed.users], fed.data.labels[fed.users], items, y)
    sub_honest = rec.RecResult(fed.honest.item_vectors, U, {})
    sa = ch2.secagg_experiment(sub_honest, sub_data, [m], client=pac.Client(batch_size=N, lr=c["lr"], loss=c["loss"]),
                               num_items=I, seed=seed)[m]
    ones = (counts == 1) & sums.readable                                                          # [I]
    owner = torch.zeros(I, dtype=torch.long)                                                      # the single contributor
    for j in range(m):
        owner[items[j][touched[j]]] = j
    own, rows = exact[ones], sums.sums[ones]
    rel = (rows - own).norm(dim=1) / own.norm(dim=1)
    cos = torch.nn.functional.cosine_similarity(rows, U[owner[ones]], dim=1).abs()
    exposed = torch.zeros(m, dtype=torch.bool)
    exposed[owner[ones]] = True
    nan = float("nan")
    return {"m": m, "max_error": float((sums.sums - exact).abs().max()), "bound": sums.bound,
            "touched": int((counts > 0).sum()), "readable": int(sums.readable.sum()),
            "false_rows": int((sums.readable & (counts == 0)).sum()), "single": int(sa["single"][0]),
            "single_counted": int((counts == 1).sum()), "single_readable": int(ones.sum()),
            "single_rel_error": float(rel.median()) if len(rel) else nan,
            "single_cos": float(cos.median()) if len(cos) else nan,
            "exposed_exact": float(sa["exposed"][0]), "exposed": float(exposed.double().mean())}


def item_sums_markdown(check: Mapping) -> MarkdownText:
    """:func:`item_sums_check` as a Markdown table: chapter 2b's exact per-item sums beside the server's."""
    r = check
    table = md_table(["per-item sums of one cohort", "chapter 2b (exact sums)", "Flower's SecAgg+ aggregate"],
                     [["items some member trained on", str(r["touched"]), f"{r['readable']} above the rounding bound"],
                      ["items with one contributor", str(r["single"]), f"{r['single_readable']} above the rounding bound"],
                      ["members whose $\\mathbf u_c$ a sum reveals", f"{r['exposed_exact']:.2f}",
                       f"{r['exposed']:.2f} (median cosine {r['single_cos']:.6f})"]], align="lrr")
    return MarkdownText(f"{table}\n\nCohort of {r['m']} clients; largest error of the server's sums "
                        f"{r['max_error']:.1e} (SecAgg+'s bound {r['bound']:.1e}).")


# --------------------------------------------------------------------------------------------
# what SecAgg+ promises: a malicious server, the consistency round, dropouts
# --------------------------------------------------------------------------------------------
#: the columns of :func:`malicious_markdown`: which client side each run had
MALICIOUS_COLUMNS = ("Flower's SecAgg+", "+ naive check (active ∩ dropped = ∅)", "+ consistency round")


def secagg_outcome(run_fn: Callable) -> dict:
    """Run ``run_fn() -> fedlab.flower.FlowerRun`` (a SecAgg+ run, ``aggregation=flower.SecAgg(...)``) and summarise what the server got.

    Returns ``{"completed", "exposed" (partitions whose model the server unmasked alone), "key_shares" (shares
    of a survivor's mask key received), "seed_shares", "refused" (clients that answered a stage with an
    error), "stage" (the stage where the round stopped, else ``None``), "reason" (the first refusal or the
    error), "messages", "seconds" (server-side, all stages), "run", "log"}``. A round that stops
    (:class:`fedlab.flower.secagg.SecAggAborted`) and an attack that cannot be mounted (``ValueError`` from
    the attack) are outcomes, not errors."""
    run, log, error = None, None, None
    try:
        run = run_fn()
        log = run.secagg_log
    except RuntimeError as err:
        log = getattr(err, "log", None)
        if log is None:
            raise
        error = str(err)
    except ValueError as err:      # the attack cannot be mounted with these settings
        return {"completed": False, "exposed": [], "key_shares": 0, "seed_shares": 0, "refused": 0, "stage": "none",
                "reason": str(err), "messages": 0, "seconds": 0.0, "run": None, "log": None}
    last = log.rounds[-1]
    stage = None
    if error is not None:
        stage = [k for k, v in last["stages"].items() if v["errors"]][-1]
    refusals = log.refusals(len(log.rounds))
    return {"completed": error is None, "exposed": log.exposed_partitions(len(log.rounds)),
            "key_shares": log.key_shares_of_survivors(len(log.rounds)),
            "seed_shares": int(sum(last["shares"]["seed"].values())), "refused": len(refusals), "stage": stage,
            "reason": error if error is not None else "", "messages": log.messages(len(log.rounds)),
            "seconds": log.seconds(len(log.rounds)), "run": run, "log": log}


def exposed_model(outcome: Mapping, partition: int, round: int = 1) -> dict:
    """The model of ``partition`` that the server unmasked on its own in ``outcome`` (:func:`secagg_outcome`),
    as ``{name: float64 tensor}``. Raises ``ValueError`` when it was not exposed."""
    log, run = outcome["log"], outcome["run"]
    node = {p: n for n, p in log.partition_of_node.items()}.get(partition)
    exposed = log.rounds[round - 1]["exposed"] if log is not None else {}
    if node not in exposed:
        raise ValueError(f"partition {partition} was not exposed (exposed: {outcome['exposed']})")
    return {k: torch.as_tensor(np.asarray(a)).double() for k, a in zip(run.transcript.param_names, exposed[node])}


def survivor_average(transcript: Transcript, partitions, round: int = 1) -> dict:
    """FedAvg's weighted average (by ``num_examples``) of the models that ``partitions`` returned in ``round``
    of a transcript without SecAgg+: what a SecAgg+ round whose survivors are ``partitions`` should decode.

    Raises ``ValueError`` for a partition without a reply."""
    replies = {r.partition_id: r for r in transcript.train_replies(round)}
    missing = [k for k in partitions if k not in replies]
    if missing or not partitions:
        raise ValueError(f"partitions {missing or partitions} returned no model in round {round}")
    total = sum(replies[k].num_examples for k in partitions)
    return {n: sum(replies[k].num_examples * replies[k].params[n].double() for k in partitions) / total
            for n in transcript.param_names}


def _outcome_text(o: Mapping) -> str:
    if o["stage"] == "none":
        return "cannot be mounted (" + o["reason"].split(":")[0] + ")"
    if o["completed"]:
        got = f"**model of client {', '.join(map(str, o['exposed']))} unmasked**" if o["exposed"] else "sum only"
        return f"round completes; {got}; {o['key_shares']} key shares of survivors"
    return f"refused in `{o['stage']}` by {o['refused']} clients; {o['key_shares']} key shares of survivors"


def malicious_markdown(outcomes: Mapping[str, Mapping[str, Mapping]], notes: Mapping[str, str] | None = None
                       ) -> MarkdownText:
    """``{attack: {column: outcome}}`` (columns of :data:`MALICIOUS_COLUMNS`, outcomes of
    :func:`secagg_outcome`) as a Markdown table; a missing cell reads "not run". ``notes``: ``{attack: text}``
    appended to the cells of that attack's completed rounds (what the sum gives the server);
    :func:`fedlab.plots.md_table`."""
    notes = dict(notes or {})

    def cell(name: str, row: Mapping, column: str) -> str:
        if column not in row:
            return "not run"
        o = row[column]
        return _outcome_text(o) + (f"; {notes[name]}" if name in notes and o["completed"] else "")

    return md_table(["attack", *MALICIOUS_COLUMNS],
                    [[f"{name}", *(cell(name, row, c) for c in MALICIOUS_COLUMNS)] for name, row in outcomes.items()])
