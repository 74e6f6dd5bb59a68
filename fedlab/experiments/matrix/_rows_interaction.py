"""The matrix's rows of Chapters 2, 3a and 3c: what a user's item or ranker update reveals of its preferences and
interactions (PAC identifiability, London 2020; RAIFLE against FCF and against FPDGD, with and without ADM)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ...metrics import roc_auc_rows
from ...privacy import registry as reg
from ...privacy.registry import median_norm
from ...fl.recsys import ratings as rec
from ...attacks import identifiability as pac
from ...attacks.interaction_inference import oltr as ro
from ...attacks.interaction_inference.recsys import RaifleBudget, RaifleVariant, make_recsys_case
from ...fl.oltr import OltrUsers
from ...data.letor import synthetic_letor
from ...data.movielens import sample_user_items, synthetic_movielens
from .. import chapter3a as ch3a
from .. import chapter3c as ch3c
from .layout import LOSS_SUFFIX, LOSS_TRUTH_SUFFIX, NAIVE_SUFFIX, _defense, _gens, _size


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

        def update(u, probe, its, y, *, local_steps, batch_size, lr, loss, generator=None, d=d, gen=gen, rng=rng,
                   fixed=fixed):
            u2, deltas = rec.protocol1_client_update(u, probe, its, y, local_steps=local_steps, batch_size=batch_size,
                                                     lr=lr, loss=loss, generator=generator)
            if local_steps == 0 or d.kind == "secagg":
                return u2, deltas
            flat = deltas.reshape(deltas.shape[0], -1)
            fixed.setdefault("C", median_norm(flat))
            return u2, reg.apply(flat, d, clip_norm=fixed["C"], generator=gen, rng=rng).reshape(deltas.shape)

        group = cohort if d.kind == "secagg" else 1
        res = pac.protocol2_attack(data.user_vectors, data.items, data.y, num_interactions=T,
                                   client=pac.Client(batch_size=batch, lr=lr, loss="log"),
                                   server=pac.Server(cohort_size=group), num_items=items, update=update,
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
    Under pruning and top-k (and a user defense that publishes its mask, without a clipping bound) the cell is
    the attacker who matches only the sent coordinates (``attack_case(coord_mask=...)``), the paper's
    attacker kept as ``"<column>@naive"``, the median loss reached and at the truth as ``"<column>@loss"`` /
    ``"<column>@loss_truth"``. Metric: mean AUC over users of the inferred interactions."""
    U, group = _size(tiny, tiny_value=4, quick=16, paper=40), 4
    iters = _size(tiny, tiny_value=100, quick=1000, paper=1000)
    data = synthetic_movielens(seed=seed)
    users = np.sort(np.random.default_rng(seed).choice(data.num_users, U, replace=False))
    ui = sample_user_items(data, neg_ratio=4, users=users, seed=seed)
    case = make_recsys_case(ui, data.num_items, dim=64, fncf_lr=1.0, local_steps=1, seed=seed)
    mask = case.mask[..., None].to(case.fcf.dtype)
    flat = case.fcf.reshape(U, -1)
    gen, rng = _gens(seed, 6)
    C = median_norm(flat)
    out = {"baseline": 0.5}
    emb, budget = RaifleVariant(estimate_embedding=True), RaifleBudget(max_iter=iters, num_restarts=2)
    for c in columns:
        d = _defense(c)
        if d.kind == "secagg":
            dim = case.fcf.shape[-1]
            cat = torch.zeros(U, data.num_items, dim, dtype=case.fcf.dtype)
            for u in range(U):
                m = case.mask[u]
                cat[u].index_add_(0, ui.items[u][m], case.fcf[u][m])
            sums = reg.apply(cat.reshape(U, -1), d, group=group, generator=gen).reshape(-1, data.num_items, dim)
            targets = list(range(0, U, group))
            sub = case.subset(targets)
            m = sub.mask.shape[1]
            views = torch.stack([sums[g][ui.items[u][:m]] for g, u in enumerate(targets)]) * sub.mask[..., None]
            res = ch3a.attack_case(replace(sub, fcf=views.to(case.fcf.dtype)), "fcf", variant=emb, budget=budget,
                                   seed=seed)
        else:
            views, public = reg.apply_public(flat, d, clip_norm=C, generator=gen, rng=rng, client_side_noise=outsider)
            views = views.reshape(case.fcf.shape) * mask
            knows = public.get("clip_norm") if d.kind == "user" else C if d.kind in _CLIPPING else None
            res = ch3a.attack_case(replace(case, fcf=views), "fcf", variant=emb, clip_norm=knows, budget=budget,
                                   seed=seed)
            if "mask" in public and knows is None:
                # the attacker who knows a sparsifying defense (pruning, top-k; a user defense that publishes its
                # mask) matches only the coordinates that were sent (Chapter 3b's mask-aware RAIFLE): that is the
                # cell, RAIFLE as the paper runs it stays as "<column>@naive", with the loss reached and at the truth
                sent = public["mask"].reshape(case.fcf.shape) & case.mask[..., None]
                aware = ch3a.attack_case(replace(case, fcf=views), "fcf", variant=emb, coord_mask=sent,
                                         budget=budget, seed=seed)
                out[c + NAIVE_SUFFIX] = float(res["auc"].mean())
                out[c + LOSS_SUFFIX] = float(aware["loss"].median())
                out[c + LOSS_TRUTH_SUFFIX] = float(aware["loss_truth"].median())
                res = aware
        out[c] = float(res["auc"].mean())
    return out


# ----------------------------------------------------------------------------------------------------
# rows 7-8: RAIFLE against federated online learning to rank, without and with ADM (Chapter 3c)
def _oltr_row(seed: int, columns: Sequence[str], tiny: bool = False, *, adm: bool, outsider: bool = False) -> dict:
    """RAIFLE against FPDGD (Chapter 3c): synthetic LETOR (the offline default, 300 queries at quick
    scale), the linear ranker, 32 users (quick) with 8 queries each, informational clicks, lr 0.1,
    35 L-BFGS evaluations (:func:`fedlab.attacks.interaction_inference.oltr.attack_oltr`); with ``adm``
    the server first fingerprints the features (ADM, RAIFLE Sec. 3.3). The users' clipping is reproduced
    when a column clips. Secure aggregation: groups of 4 users; without ADM the server attacks each
    group's first user with the group's sum; with ADM it runs RAIFLE's bypass (Sec. 3.4.2,
    :func:`fedlab.experiments.chapter3c.sa_bypass_experiment`, one query, 4 groups of 4). Under DP-FedAvg
    the curious server sees the clipped update before its noise, an outsider (``outsider``) the noisy
    release. Under pruning and top-k (and a user defense that publishes its mask) the cell is the attacker who
    compares only the sent coordinates (:func:`_oltr_aware`, chapter 3d's mask-aware attack), with ``@naive``, ``@loss`` and ``@loss_truth``
    beside it. Every column's users start from the same points (user ids ``0..U-1`` in each column), so a cell
    does not depend on the columns run with it. Metric: mean AUC over users of the inferred clicks."""
    U, Q, group = _size(tiny, tiny_value=8, quick=32, paper=64), 8, 4
    iters = _size(tiny, tiny_value=20, quick=35, paper=200)
    data = synthetic_letor(_size(tiny, tiny_value=100, quick=300, paper=1000), seed=seed)
    case = ro.make_oltr_case(data, U, Q, (), users=OltrUsers(click_model="informational", lr=0.1), adm=adm,
                             seed=seed + 11)
    gen, rng = _gens(seed, 7 + int(adm))
    C = median_norm(case.update)
    out = {"baseline": 0.5}
    for clipped in (True, False):
        cols = [c for c in columns if _defense(c).kind not in ("secagg", "user")
                and (_defense(c).kind in _CLIPPING) == clipped]
        if not cols:
            continue
        views = torch.cat([reg.apply(case.update, _defense(c), clip_norm=C, generator=gen, rng=rng,
                                     client_side_noise=outsider) for c in cols])
        auc = ro.attack_oltr(ro.cat_cases([case] * len(cols)), views, clip_norm=C if clipped else None,
                             budget=RaifleBudget(max_iter=iters), seed=seed, user_ids=torch.arange(U).repeat(len(cols)))
        out.update({c: float(auc[i * U:(i + 1) * U].mean()) for i, c in enumerate(cols)})
        sparse = [i for i, c in enumerate(cols) if _defense(c).kind == "prune"]
        if sparse:                                                   # the attacker who knows the pruning mask
            rows = torch.cat([torch.arange(i * U, (i + 1) * U) for i in sparse])
            _oltr_aware(out, case, [cols[i] for i in sparse], views[rows], views[rows] != 0,
                        torch.arange(U).repeat(len(sparse)), iters, seed)
    for c in [c for c in columns if _defense(c).kind == "user"]:     # the clipping bound it publishes, if any
        view, public = reg.apply_public(case.update, _defense(c), generator=gen)
        auc = ro.attack_oltr(case, view, clip_norm=public.get("clip_norm"), budget=RaifleBudget(max_iter=iters),
                             seed=seed)
        out[c] = float(auc.mean())
        if "mask" in public:                                         # ... and the mask it publishes
            _oltr_aware(out, case, [c], view, public["mask"], torch.arange(len(case)), iters, seed,
                        clip_norm=public.get("clip_norm"))
    if "secagg" in columns:
        if adm:
            D = torch.arange(data.num_features) < data.num_features // 2
            runs = [ch3c.sa_bypass_experiment(data, (), group, D, lr=0.1, max_iter=iters, seed=seed + 100 * t,
                                              generator=torch.Generator().manual_seed(1000 * seed + t))
                    for t in range(U // group)]
            out["secagg"] = float(np.mean([r["auc"] for r in runs]))
        else:
            sums = reg.apply(case.update, "secagg", group=group, generator=gen)
            auc = ro.attack_oltr(case.subset(list(range(0, U, group))), sums.to(case.update.dtype),
                                 budget=RaifleBudget(max_iter=iters), seed=seed)
            out["secagg"] = float(auc.mean())
    return out


def _oltr_aware(out: dict, case, cols: Sequence[str], views: torch.Tensor, sent: torch.Tensor, ids: torch.Tensor,
                iters: int, seed: int, clip_norm: float | None = None) -> None:
    """The cells of sparsifying columns ``cols`` under the attacker who knows the mask (RAIFLE App. C.4's attack
    compares its dense simulation with the pruned update; this one compares only the coordinates ``sent``
    [len(cols) U, P], :func:`fedlab.attacks.interaction_inference.oltr.raifle_oltr`'s ``mask``), one batch for
    every column; ``ids`` [len(cols) U] are the users' ids in the naive run, so that both start from the same points;
    ``clip_norm``: a clipping bound the defense published too (reproduced in the simulation). ``out[c]`` becomes
    that attacker's mean AUC, the paper's attacker moves to ``"<c>@naive"``, and the median loss reached and at
    the true clicks go to ``"<c>@loss"`` / ``"<c>@loss_truth"`` (did the attack reach its optimum?)."""
    U = len(case)
    many = ro.cat_cases([case] * len(cols))
    res = ro.raifle_oltr(many, views, mask=sent, clip_norm=clip_norm, budget=RaifleBudget(max_iter=iters), seed=seed,
                         user_ids=ids,
                         truth=(many.I.reshape(len(many), -1).to(views.dtype), None))
    auc = roc_auc_rows(many.I.reshape(len(many), -1), res.scores, many.mask.reshape(len(many), -1))
    for i, c in enumerate(cols):
        sl = slice(i * U, (i + 1) * U)
        out[c + NAIVE_SUFFIX] = out[c]
        out[c] = float(auc[sl].mean())
        out[c + LOSS_SUFFIX] = float(res.loss[sl].median())
        out[c + LOSS_TRUTH_SUFFIX] = float(res.loss_truth[sl].median())


def _oltr_plain(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    return _oltr_row(seed, columns, tiny, adm=False, outsider=outsider)


def _oltr_adm(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    return _oltr_row(seed, columns, tiny, adm=True)
