"""Chapters 3a's and 3b's experiments: one honest round of federated recommendation (RAIFLE Section 4.1) for
a set of users, one Table 3 configuration of the attack run on all of them in batches, and the sweeps and tables
of chapter 3a (Table 3, App. A on a linear model) and of chapter 3b, its defenses (LDP with Table 6, pruning).
The attacks themselves are :func:`fedlab.attacks.interaction_inference.recsys.raifle_fcf` and :func:`fedlab.attacks.interaction_inference.recsys.raifle_fncf`;
the honest round they attack is :func:`fedlab.attacks.interaction_inference.recsys.make_recsys_case` (beside
chapter 3c's :class:`~fedlab.attacks.interaction_inference.oltr.OltrCase`).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import inspect

import torch

from ..attacks.interaction_inference.recsys import (FncfUser, RaifleBudget, RaifleVariant, RecsysCase, raifle_fcf,
                                                    raifle_fncf)
from ..fl.recsys.interactions import fncf_init, fncf_per_user, fncf_updates
from ..metrics import ks_pvalue, optimum_status, roc_auc_rows, t_interval
from ..privacy import ldp
from ..privacy.defenses import prune_rows
from .tables import scale_cells, scale_pairs, settings_header
from .._checks import positive_int
from .._parallel import map_tasks
from ..config import device as _device, workers
from .._stats import pvalue_summary

__all__ = ["attack_case", "TABLE3_CONFIGS", "TABLE3_NAMES", "PAPER_TABLE3",
           "VARIANTS", "attack_budget", "run_config", "table3", "table3_summary", "table3_values", "table3_table",
           "table3_emb_table", "table3_loss_table",
           "REFERENCE_ATTACK", "table3_reference", "table3_reference_table", "table3_reference_values",
           "FNCF_CONFIGS", "network_draw_seeds", "network_draws_case", "fncf_network_draws", "network_draws_summary",
           "network_draws_table", "network_draws_values", "table3_boxplot", "linear_case", "loop_vs_batch", "PAPER_TABLE6", "PAPER_TABLE7",
           "LDP_EPSILONS", "LDP_DELTA", "LDP_SENSITIVITY", "ldp_sigma_rows",
           "ldp_updates", "ldp_attack_sweep", "clip_knowledge_rows", "ks_values", "table6_table", "table7_values", "table7_draws", "table7_draws_values", "table7_table",
           "prune_sweep", "prune_curves", "prune_plot", "prune_aware_values", "defense_boxplots", "REFERENCE_REPOSITORY", "SCALE_SETTINGS", "scaled", "reference_settings_table"]


def attack_case(case: RecsysCase, algorithm: str, *, variant: RaifleVariant, clip_norm=None,
                batch_size: int = 64, user_ids=None, coord_mask=None, **kwargs) -> dict:
    """Run one Table 3 configuration on every user of ``case`` in batches of ``batch_size`` users
    (users sorted by their number of items so each batch is padded little).

    ``algorithm``: ``"fcf"`` or ``"fncf"``; ``variant``: the row of Table 3 and the loss's details
    (:class:`fedlab.attacks.interaction_inference.recsys.RaifleVariant`; FCF has no model parameters to
    match, so its ``use_model_params`` must be ``False``, and no continuation: FCF's loss has no ReLU to
    smooth; no default: whether the embedding is estimated is the row of Table 3 each caller names). The updates attacked are the case's: to attack
    released ones (after LDP or pruning) pass ``dataclasses.replace(case, fcf=..., fncf_items=...,
    fncf_params=...)``. ``clip_norm`` = the clipping norm(s) the users applied (float for FCF, ``(items,
    params)`` for FNCF); the simulated FNCF user trains as the case's (``fncf_lr``, ``local_steps``).
    Other keywords go to :func:`fedlab.attacks.interaction_inference.recsys.raifle` (``budget``, ``seed``,
    ...). Returns ``{"auc": [U], "emb_error": [U] or None,
    "loss": [U], "loss_truth": [U], "evaluations": int}``; ``emb_error`` is the mean squared error of
    the estimated user embedding, ``loss`` the matching loss the attack reached and ``loss_truth`` the
    same loss at the true interactions (and true embedding where it is estimated), the answer the
    optimiser should reach; ``evaluations`` the batched loss evaluations summed over batches.
    ``user_ids`` [U] (default ``0..U-1``): the ids that seed each user's random starts
    (:func:`fedlab.attacks.interaction_inference.recsys.user_generator`); users with the same id start
    from the same points. ``coord_mask`` [U, m, d] (optional): the coordinates of the (pruned) item
    updates the attacker matches, batched with the users (``coord_mask`` of
    :func:`fedlab.attacks.interaction_inference.recsys.raifle_fcf`). Raises ``ValueError`` for an
    unknown ``algorithm``, a ``variant`` that is not a ``RaifleVariant`` (or matches FCF's model parameters),
    ``batch_size < 1``, ``user_ids`` of the wrong length or a ``coord_mask`` not shaped as the case's items.
    """
    if algorithm not in ("fcf", "fncf"):
        raise ValueError(f"algorithm must be 'fcf' or 'fncf', got {algorithm!r}")
    if not isinstance(variant, RaifleVariant) or (algorithm == "fcf" and (variant.use_model_params
                                                                         or variant.continuation not in ("auto", None))):
        raise ValueError(f"variant must be a RaifleVariant (for FCF with use_model_params=False and no continuation), "
                         f"got {variant!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = torch.arange(len(case)) if user_ids is None else torch.as_tensor(user_ids, dtype=torch.long).flatten()
    if ids.numel() != len(case):
        raise ValueError(f"user_ids must hold one id per user ({len(case)}), got {ids.numel()}")
    if coord_mask is not None and tuple(coord_mask.shape) != tuple(case.X.shape):
        raise ValueError(f"coord_mask must be {tuple(case.X.shape)}, got {tuple(coord_mask.shape)}")
    estimate_embedding = variant.estimate_embedding
    order = torch.argsort(case.mask.sum(1), stable=True)
    batches = [order[start:start + batch_size] for start in range(0, len(case), batch_size)]
    # one batch after the other here, or FEDLAB_WORKERS processes at once (the same bits, tests/test_parallel.py)
    tasks = (_batch_task(case, idx, algorithm, variant, clip_norm, ids, coord_mask, kwargs) for idx in batches)
    on_cpu = _device(kwargs.get("device")).type == "cpu"
    results = map_tasks(_attack_batch, tasks, workers=workers() if on_cpu else 1)
    auc = torch.empty(len(case), dtype=torch.float64)
    err = torch.empty(len(case))
    loss = torch.empty(len(case))
    loss_truth = torch.empty(len(case))
    evals = 0
    for idx, (batch_auc, res) in zip(batches, results):
        auc[idx] = batch_auc
        loss[idx] = res.loss
        loss_truth[idx] = res.loss_truth
        evals += res.iterations
        if res.user_emb is not None:
            err[idx] = ((res.user_emb - case.E[idx]) ** 2).mean(1)
    return {"auc": auc, "emb_error": err if estimate_embedding else None, "loss": loss, "loss_truth": loss_truth,
            "evaluations": evals}


def _batch_task(case: RecsysCase, idx, algorithm: str, variant: RaifleVariant, clip_norm, ids, coord_mask,
                kwargs: dict) -> dict:
    """What :func:`_attack_batch` needs to attack the users ``idx`` of ``case`` (their items cut to the batch's
    longest list), as plain tensors, so that the batch runs the same in this process or in a worker."""
    m = int(case.mask[idx].sum(1).max())
    task = {"algorithm": algorithm, "variant": variant, "clip_norm": clip_norm, "X": case.X[idx, :m],
            "mask": case.mask[idx, :m], "truth": (case.I[idx, :m], case.E[idx]), "user_ids": ids[idx],
            "kwargs": dict(kwargs, **({"coord_mask": coord_mask[idx, :m]} if coord_mask is not None else {}))}
    if algorithm == "fcf":
        task["updates"] = case.fcf[idx, :m]
    else:
        task.update(updates=case.fncf_items[idx, :m], params={k: v[idx] for k, v in case.fncf_params.items()},
                    model=case.model, theta=case.networks(idx), fncf_lr=case.fncf_lr, local_steps=case.local_steps)
    return task


def _attack_batch(task: dict):
    """One batch of :func:`attack_case`: ``(auc [k] float64, RaifleResult)`` for the task of :func:`_batch_task`
    (module-level, so that a worker process of :func:`fedlab._parallel.map_tasks` can run it)."""
    kw, truth = task["kwargs"], task["truth"]
    if task["algorithm"] == "fcf":
        res = raifle_fcf(task["X"], task["updates"], task["mask"], estimate_embedding=task["variant"].estimate_embedding,
                         clip_norm=task["clip_norm"], squared=task["variant"].squared, user_ids=task["user_ids"],
                         truth=truth, **kw)
    else:
        ci, cp = task["clip_norm"] if task["clip_norm"] is not None else (None, None)
        user = FncfUser(lr=task["fncf_lr"], local_steps=task["local_steps"], items_clip_norm=ci, params_clip_norm=cp)
        res = raifle_fncf(task["model"], task["theta"], task["X"], task["updates"], task["params"], task["mask"],
                          variant=task["variant"], user=user, user_ids=task["user_ids"], truth=truth, **kw)
    return roc_auc_rows(truth[0], res.scores, task["mask"]), res

# ---------------------------------------------------------------------------------------------------
# Table 3: the six configurations of RAIFLE Sec. 4.2 (Table 3) on one honest round
# ---------------------------------------------------------------------------------------------------

#: RAIFLE Table 3's rows: (algorithm, estimate the user embedding, use the model-parameter update)
TABLE3_CONFIGS = [("FCF", False, False), ("FCF", True, False), ("FNCF", False, False),
                  ("FNCF", True, False), ("FNCF", False, True), ("FNCF", True, True)]

#: glue-name stems of the rows: ``ch3a_auc_<name>``, ``ch3a_emb_err_<name>``
TABLE3_NAMES = {("FCF", False, False): "fcf", ("FCF", True, False): "fcf_emb", ("FNCF", False, False): "fncf",
                ("FNCF", True, False): "fncf_emb", ("FNCF", False, True): "fncf_model",
                ("FNCF", True, True): "fncf_emb_model"}

#: RAIFLE Table 3 (MovieLens-100K): configuration -> (mean AUC, embedding error or None)
PAPER_TABLE3 = {("FCF", False, False): (0.489, None), ("FCF", True, False): (0.979, 0.07),
                ("FNCF", False, False): (0.977, None), ("FNCF", True, False): (0.990, 2.03),
                ("FNCF", False, True): (0.977, None), ("FNCF", True, True): (0.990, 2.00)}


#: RAIFLE's names of the six variants (Tables 6-7, Fig. 8), by configuration
VARIANTS = {("FCF", False, False): "FCF", ("FCF", True, False): "FCF emb", ("FNCF", False, False): "FNCF",
            ("FNCF", True, False): "FNCF emb", ("FNCF", False, True): "FNCF model",
            ("FNCF", True, True): "FNCF emb model"}


def attack_budget(config, *, fcf_max_iter: int, fncf_max_iter: int, num_restarts: int) -> RaifleBudget:
    """The L-BFGS budget of one configuration, a
    :class:`~fedlab.attacks.interaction_inference.recsys.RaifleBudget` (its other fields the defaults): FCF
    gets ``fcf_max_iter`` evaluations and ``num_restarts`` restarts when it estimates the embedding,
    ``fcf_max_iter // 5`` and one start when it does not (it cannot succeed, see the chapter); FNCF gets
    ``fncf_max_iter`` and ``num_restarts``. Raises ``ValueError`` naming a budget below 1."""
    for name, value in (("fcf_max_iter", fcf_max_iter), ("fncf_max_iter", fncf_max_iter), ("num_restarts", num_restarts)):
        positive_int(name, value)
    alg, est, _ = config
    if alg == "FCF":
        return RaifleBudget(max_iter=fcf_max_iter if est else max(1, fcf_max_iter // 5),
                            num_restarts=num_restarts if est else 1)
    return RaifleBudget(max_iter=fncf_max_iter, num_restarts=num_restarts)


def run_config(case: RecsysCase, config, *, fcf_max_iter: int, fncf_max_iter: int, num_restarts: int,
               fcf=None, fncf_items=None, fncf_params=None, clip_norm=None, seed: int = 0, **kwargs) -> dict:
    """One configuration of :data:`TABLE3_CONFIGS` on every user of ``case`` with its
    :func:`attack_budget`, through :func:`attack_case` (which see for ``clip_norm`` and the result).
    ``fcf``, ``fncf_items``, ``fncf_params``: released updates attacked in place of the case's (``None``:
    the case's). Raises ``ValueError`` for an unknown configuration."""
    if config not in VARIANTS:
        raise ValueError(f"config must be one of {list(VARIANTS)}, got {config!r}")
    alg, est, ump = config
    budget = attack_budget(config, fcf_max_iter=fcf_max_iter, fncf_max_iter=fncf_max_iter, num_restarts=num_restarts)
    released = {k: v for k, v in (("fcf", fcf), ("fncf_items", fncf_items), ("fncf_params", fncf_params))
                if v is not None}
    return attack_case(replace(case, **released), alg.lower(),
                       variant=RaifleVariant(estimate_embedding=est, use_model_params=ump), clip_norm=clip_norm,
                       seed=seed, budget=budget, **kwargs)


def table3(case: RecsysCase, *, fcf_max_iter: int, fncf_max_iter: int, num_restarts: int, seed: int = 0) -> dict:
    """RAIFLE Table 3 (Sec. 4.2, Algorithms 1-2): every configuration of :data:`TABLE3_CONFIGS` run on
    all users of ``case`` with :func:`run_config`, in that order. Returns ``{config: attack_case(...)
    result}``. Raises ``ValueError`` naming ``fcf_max_iter``, ``fncf_max_iter`` or ``num_restarts``
    when below 1.
    """
    attack_budget(TABLE3_CONFIGS[0], fcf_max_iter=fcf_max_iter, fncf_max_iter=fncf_max_iter, num_restarts=num_restarts)
    return {c: run_config(case, c, fcf_max_iter=fcf_max_iter, fncf_max_iter=fncf_max_iter, num_restarts=num_restarts,
                          seed=seed) for c in TABLE3_CONFIGS}


def table3_summary(results: dict) -> tuple[dict, dict]:
    """``(auc, emb)`` of a :func:`table3` result, keyed by configuration: the mean AUC over users
    rounded to 3 decimals, and the mean squared error of the estimated embedding (unrounded; only the
    configurations that estimate it). Raises ``ValueError`` for a result missing a configuration."""
    missing = [k for k in TABLE3_CONFIGS if k not in results]
    if missing:
        raise ValueError(f"results lacks the configurations {missing}")
    auc = {k: round(results[k]["auc"].mean().item(), 3) for k in TABLE3_NAMES}
    emb = {k: results[k]["emb_error"].mean().item() for k in TABLE3_NAMES if results[k]["emb_error"] is not None}
    return auc, emb


def table3_values(auc: dict, emb: dict) -> dict:
    """The glued names of Table 3: ``ch3a_auc_<name>`` for every configuration and
    ``ch3a_emb_err_<name>`` for those of ``emb`` (see :data:`TABLE3_NAMES`)."""
    out = {f"ch3a_auc_{TABLE3_NAMES[k]}": v for k, v in auc.items()}
    out.update({f"ch3a_emb_err_{TABLE3_NAMES[k]}": v for k, v in emb.items()})
    return out


def table3_table(auc: dict, emb: dict, run) -> tuple[list, list]:
    """``(headers, rows)`` of "paper vs ours" for RAIFLE Table 3's AUC: per configuration (:data:`VARIANTS`'
    names), the paper's AUC (:data:`PAPER_TABLE3`), ours (``auc`` from :func:`table3_summary`) and the stored
    paper-scale record (``run.stored``, ``run`` a :class:`fedlab.records.Run`: mean and 95 % t interval cut to
    [0, 1]). The embedding errors are :func:`table3_emb_table`. ``emb`` is accepted for the call's symmetry and
    must hold only configurations that estimate the embedding (``ValueError`` otherwise)."""
    extra = [k for k in emb if not k[1]]
    if extra:
        raise ValueError(f"emb holds configurations that do not estimate the embedding: {extra}")
    rows = [[VARIANTS[k], p_auc, auc[k], run.stored(f"ch3a_auc_{TABLE3_NAMES[k]}", value_range=(0.0, 1.0))]
            for k, (p_auc, _) in PAPER_TABLE3.items()]
    return ["configuration", "paper AUC", "our AUC", "our AUC, paper scale (mean [95 % CI])"], rows


def table3_emb_table(emb: dict, run) -> tuple[list, list]:
    """``(headers, rows)`` of RAIFLE Table 3's embedding error (mean squared error of the estimated user
    embedding, mean over users) for the configurations that estimate it: the paper's, ours (``emb`` from
    :func:`table3_summary`, two significant digits) and the stored paper-scale record as a median and range
    over seeds (:meth:`fedlab.records.Run.stored_median`: one seed's blow-up would dominate a t interval and
    send it below 0). Raises ``ValueError`` if ``emb`` lacks such a configuration."""
    want = [k for k in PAPER_TABLE3 if k[1]]
    missing = [k for k in want if k not in emb]
    if missing:
        raise ValueError(f"emb lacks the configurations {missing}")
    rows = [[VARIANTS[k], PAPER_TABLE3[k][1], f"{emb[k]:.2g}", run.stored_median(f"ch3a_emb_err_{TABLE3_NAMES[k]}")]
            for k in want]
    return ["configuration", "paper emb. err.", "our emb. err.", "our emb. err., paper scale (median, range)"], rows


def table3_loss_table(results: dict) -> tuple[list, list]:
    """``(headers, rows)``: for every Table 3 configuration of a :func:`table3` result, the median over
    users of the matching loss at the true answer (``loss_truth``: the true interactions, and the true
    embedding where it is estimated; where it is not, the server's guess) beside the median loss the
    attack reached, the mean AUC and the loss evaluations used. A reached loss far above the loss at
    the truth is the optimiser's failure, not the attack's: the truth would have scored better.
    Raises ``ValueError`` for a result missing a configuration."""
    missing = [k for k in TABLE3_CONFIGS if k not in results]
    if missing:
        raise ValueError(f"results lacks the configurations {missing}")
    rows = [[VARIANTS[k], round(results[k]["loss_truth"].median().item(), 3), round(results[k]["loss"].median().item(), 3),
             round(results[k]["auc"].mean().item(), 3), results[k]["evaluations"]] for k in TABLE3_CONFIGS]
    return ["configuration", "median loss at the truth", "median loss reached", "mean AUC", "loss evaluations"], rows


#: The attack settings of the authors' reference code (:data:`REFERENCE_REPOSITORY`, c513b97) where they
#: differ from our Table 3 (:func:`table3_reference`): five independent random starts (no antithetic pairs),
#: one budget for every configuration (FCF without the embedding included), FCF's item loss the squared
#: error (its MSE up to a constant factor per user) and no continuation for FNCF (our addition). The
#: optimiser stays ours (:func:`fedlab.optim.lbfgs_rows`; the code runs ``torch.optim.LBFGS``).
REFERENCE_ATTACK = {"num_restarts": 5, "antithetic": False}


def table3_reference(case: RecsysCase, *, max_iter: int, seed: int = 0) -> dict:
    """RAIFLE Table 3 under the reference code's attack settings (:data:`REFERENCE_ATTACK`): every
    configuration of :data:`TABLE3_CONFIGS` on every user of ``case`` with ``max_iter`` loss evaluations
    per start, five independent starts, FCF's squared-error loss and FNCF without continuation. Returns
    ``{config: attack_case(...) result}`` as :func:`table3`. Raises ``ValueError`` naming ``max_iter``
    below 1."""
    positive_int("max_iter", max_iter)
    out = {}
    budget = RaifleBudget(max_iter=max_iter, **REFERENCE_ATTACK)
    for alg, est, ump in TABLE3_CONFIGS:
        variant = (RaifleVariant(estimate_embedding=est, squared=True) if alg == "FCF" else
                   RaifleVariant(estimate_embedding=est, use_model_params=ump, continuation=None))
        out[(alg, est, ump)] = attack_case(case, alg.lower(), variant=variant, budget=budget, seed=seed)
    return out


def table3_reference_table(ours: dict, reference: dict, users) -> tuple[list, list]:
    """``(headers, rows)``: per Table 3 configuration, on the users ``users`` (indices into the case of
    ``ours``, the users ``reference`` ran on, in that order), our mean AUC with Table 3's settings
    (``ours``, a :func:`table3` result) beside the mean AUC with the reference code's
    (``reference``, a :func:`table3_reference` result), and the median loss each reached beside the
    loss at the truth. The losses of FCF differ in kind (ours the distance, the reference's its square).
    Raises ``ValueError`` when ``users`` does not match the reference's users or a configuration is
    missing."""
    idx = torch.as_tensor(users, dtype=torch.long).flatten()
    missing = [k for k in TABLE3_CONFIGS if k not in ours or k not in reference]
    if missing:
        raise ValueError(f"ours or reference lacks the configurations {missing}")
    if any(reference[k]["auc"].numel() != idx.numel() for k in TABLE3_CONFIGS):
        raise ValueError(f"users must name the {reference[TABLE3_CONFIGS[0]]['auc'].numel()} users of reference, "
                         f"got {idx.numel()}")
    rows = []
    for k in TABLE3_CONFIGS:
        o, r = ours[k], reference[k]
        rows.append([VARIANTS[k], round(o["auc"][idx].mean().item(), 3), round(r["auc"].mean().item(), 3),
                     round(o["loss_truth"][idx].median().item(), 3), round(o["loss"][idx].median().item(), 3),
                     round(r["loss_truth"].median().item(), 3), round(r["loss"].median().item(), 3)])
    headers = ["configuration", "AUC, our settings", "AUC, reference settings", "loss at the truth (ours)",
               "loss reached (ours)", "loss at the truth (reference)", "loss reached (reference)"]
    return headers, rows


def table3_reference_values(reference: dict) -> dict:
    """The glued names of a :func:`table3_reference` result: ``ch3a_ref_auc_<name>`` (mean AUC, 3
    decimals) per configuration."""
    return {f"ch3a_ref_auc_{TABLE3_NAMES[k]}": round(r["auc"].mean().item(), 3) for k, r in reference.items()}


# ---------------------------------------------------------------------------------------------------
# The FNCF network as a random effect: Table 3's FNCF rows over independent network draws
# ---------------------------------------------------------------------------------------------------

#: Table 3's FNCF rows (the configurations whose result depends on the random FNCF network)
FNCF_CONFIGS = [c for c in TABLE3_CONFIGS if c[0] == "FNCF"]


def network_draw_seeds(seed: int, num_draws: int) -> list[int]:
    """``num_draws`` seeds of independent FNCF networks for run ``seed``: NumPy ``SeedSequence((seed,
    k))`` for draw ``k``, so draw ``k`` is the same whatever ``num_draws`` is, and no draw reuses the
    seed :func:`~fedlab.attacks.interaction_inference.recsys.make_recsys_case` gave the case's own network. Raises ``ValueError`` naming
    ``num_draws`` when below 1."""
    import numpy as np

    positive_int("num_draws", num_draws)
    return [int(np.random.SeedSequence([int(seed), 0x6E6574, k]).generate_state(1)[0]) for k in range(num_draws)]


def network_draws_case(case: RecsysCase, draw_seeds) -> RecsysCase:
    """The users of ``case`` under ``D = len(draw_seeds)`` FNCF networks at once: a :class:`~fedlab.attacks.interaction_inference.recsys.RecsysCase`
    of ``D * U`` rows, draw-major (row ``k * U + u`` is user ``u`` under network ``k``), with the same
    items ``X``, embeddings ``E`` and interactions ``I`` in every draw, network ``k`` from
    :func:`fedlab.fl.recsys.interactions.fncf_init` with seed ``draw_seeds[k]`` and the widths of
    ``case.model``, its honest one-step updates ``fncf_items`` [D*U, m, d] and ``fncf_params``
    {name: [D*U, ...]}, and ``theta`` stacked per row (every tensor ``[D*U, ...]``). FCF's update
    ``fcf`` does not depend on the network and is repeated. Raises ``ValueError`` for an empty
    ``draw_seeds``, a ``case`` whose users take more than one local step (the stacked networks run the
    written-out one-step update) or a ``case`` that already holds one network per user."""
    seeds = [int(s) for s in draw_seeds]
    if not seeds:
        raise ValueError("draw_seeds must hold at least one seed")
    if case.local_steps != 1:
        raise ValueError(f"case.local_steps must be 1 for stacked network draws, got {case.local_steps}")
    if fncf_per_user(case.model, case.theta):
        raise ValueError("case already holds one network per user")
    D, U, d = len(seeds), len(case), case.X.shape[2]
    widths = tuple(m.out_features for m in case.model.modules() if isinstance(m, torch.nn.Linear))[:-1]
    nets = [fncf_init(d, widths, seed=s)[1] for s in seeds]
    theta = {k: torch.stack([t[k] for t in nets]).repeat_interleave(U, 0) for k in nets[0]}   # [D*U, ...]

    def rep(t):
        return t.repeat(D, *([1] * (t.dim() - 1)))

    X, E, I, mask = rep(case.X), rep(case.E), rep(case.I), rep(case.mask)
    dX, dT, _ = fncf_updates(case.model, theta, X, E, I, mask, lr=case.fncf_lr, local_steps=1)
    return RecsysCase(X, E, I, mask, rep(case.fcf), case.model, theta, dX, dT, case.fncf_lr, 1)


def fncf_network_draws(case: RecsysCase, num_draws: int, *, fncf_max_iter: int, num_restarts: int, seed: int = 0,
                       configs=None, batch_size: int = 64) -> dict:
    """Table 3's FNCF rows (RAIFLE Sec. 4.2, Algorithms 1-2) with the FNCF network as a random effect:
    the users of ``case`` (their items, embeddings and interactions fixed) under ``num_draws``
    independent networks (:func:`network_draw_seeds`, :func:`network_draws_case`), each user starting
    from the same points under every network (its id seeds its starts), so only the network differs
    between draws. All draws of a batch of users run as one batched attack (one L-BFGS row per draw,
    user and start; :func:`attack_case`), not a loop over draws; a batch holds ``batch_size // D`` users
    (at least one) of similar item counts, all ``D`` draws each.

    ``configs``: the FNCF configurations of :data:`TABLE3_CONFIGS` to run (default all four,
    :data:`FNCF_CONFIGS`), each with :func:`attack_budget` (``fncf_max_iter``, ``num_restarts``).
    Returns ``{"draw_seeds": [D], "num_users": U, config: {"auc", "loss", "loss_truth": [D, U],
    "emb_error": [D, U] or None, "evaluations": int}}`` (``loss`` the matching loss reached, ``loss_truth``
    the loss at the true answer, as :func:`attack_case`). Raises ``ValueError`` naming ``num_draws``,
    ``fncf_max_iter``, ``num_restarts`` or ``batch_size`` below 1, or for a configuration that is not
    an FNCF row."""
    configs = FNCF_CONFIGS if configs is None else list(configs)
    bad = [c for c in configs if c not in FNCF_CONFIGS]
    if bad or not configs:
        raise ValueError(f"configs must be FNCF rows of Table 3 {FNCF_CONFIGS}, got {configs!r}")
    positive_int("batch_size", batch_size)
    attack_budget(configs[0], fcf_max_iter=1, fncf_max_iter=fncf_max_iter, num_restarts=num_restarts)
    seeds = network_draw_seeds(seed, num_draws)
    D, U = len(seeds), len(case)
    out = {"draw_seeds": seeds, "num_users": U}
    for c in configs:
        out[c] = {"auc": torch.empty(D, U, dtype=torch.float64), "loss": torch.empty(D, U),
                  "loss_truth": torch.empty(D, U), "emb_error": torch.empty(D, U) if c[1] else None, "evaluations": 0}
    order = torch.argsort(case.mask.sum(1), stable=True)
    per_batch = max(1, batch_size // D)
    batches = [order[start:start + per_batch] for start in range(0, U, per_batch)]
    # one batch of users (all draws) after the other, or FEDLAB_WORKERS at once: the same bits (tests/test_parallel.py)
    tasks = ((network_draws_case(case.subset(idx), seeds), idx, D, configs, fncf_max_iter, num_restarts, seed)
             for idx in batches)
    for idx, results in zip(batches, map_tasks(_draws_batch, tasks, workers=workers())):
        for c, res in results.items():
            for key in ("auc", "loss", "loss_truth") + (("emb_error",) if c[1] else ()):
                out[c][key][:, idx] = res[key].reshape(D, len(idx)).to(out[c][key].dtype)
            out[c]["evaluations"] += res["evaluations"]
    return out


def _draws_batch(task) -> dict:
    """One batch of users of :func:`fncf_network_draws` under all its draws: ``{config: run_config result}``
    (module-level, so that a worker process can run it)."""
    stacked, idx, D, configs, fncf_max_iter, num_restarts, seed = task
    return {c: run_config(stacked, c, fcf_max_iter=1, fncf_max_iter=fncf_max_iter, num_restarts=num_restarts,
                          seed=seed, batch_size=len(stacked), user_ids=idx.repeat(D)) for c in configs}


def network_draws_summary(result: dict, confidence: float = 0.95) -> dict:
    """Per configuration of a :func:`fncf_network_draws` result: the mean AUC of each draw (over its
    users) ``per_draw`` [D]; their mean over draws ``auc``, the Student-t interval ``ci`` (``(low,
    high)``, :func:`fedlab.metrics.t_interval` at ``confidence``, cut to [0, 1]) and the standard
    deviation ``sd`` over draws (the network's random effect on these users), the range ``(min,
    max)``; the median over draws and users of the loss at the truth ``loss_truth`` and of the loss
    reached ``loss``, and the share of (draw, user) pairs whose reached loss is at most twice the
    truth's plus 0.01, ``at_truth``. Raises ``ValueError`` for a result without configurations or with
    fewer than 2 draws (no interval)."""
    configs = [c for c in result if isinstance(c, tuple)]
    if not configs:
        raise ValueError("result holds no configuration")
    out = {}
    for c in configs:
        r = result[c]
        per_draw = r["auc"].mean(1)
        if per_draw.numel() < 2:
            raise ValueError(f"result must hold at least 2 draws for an interval, got {per_draw.numel()}")
        mean, sd, (lo, hi) = t_interval(per_draw.tolist(), confidence)
        out[c] = {"per_draw": per_draw, "auc": mean, "ci": (max(lo, 0.0), min(hi, 1.0)), "sd": sd,
                  "range": (per_draw.min().item(), per_draw.max().item()),
                  "loss_truth": r["loss_truth"].median().item(), "loss": r["loss"].median().item(),
                  "at_truth": (r["loss"] <= 2 * r["loss_truth"] + 0.01).double().mean().item(),
                  "num_draws": per_draw.numel(), "num_users": r["auc"].shape[1]}
    return out


def network_draws_table(summary: dict) -> tuple[list, list]:
    """``(headers, rows)`` of a :func:`network_draws_summary`: per FNCF configuration the paper's AUC
    (:data:`PAPER_TABLE3`), our mean AUC over network draws with its 95 % interval, the standard deviation
    ("sd") and range of the draws' mean AUCs (over networks), the median loss at the truth and reached, and the share of
    (draw, user) pairs that reached the truth's loss (``at_truth``: at most twice it plus 0.01)."""
    rows = [[VARIANTS[c], PAPER_TABLE3[c][0], f"{s['auc']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]", round(s["sd"], 3),
             f"{s['range'][0]:.3f}–{s['range'][1]:.3f}", round(s["loss_truth"], 3), round(s["loss"], 3),
             round(s["at_truth"], 2)] for c, s in summary.items()]
    n = next(iter(summary.values()))
    headers = ["configuration", "paper AUC", f"mean AUC, {n['num_draws']} networks [95 % CI]", "sd", "range",
               "loss at the truth (median)", "loss reached (median)", "share at the truth's loss (≤ 2× + 0.01)"]
    return headers, rows


def network_draws_values(summary: dict) -> dict:
    """The glued names of a :func:`network_draws_summary`: ``ch3a_draws_auc_<name>`` (mean over draws),
    ``ch3a_draws_lo_<name>`` / ``ch3a_draws_hi_<name>`` (its interval), ``ch3a_draws_sd_<name>``,
    ``ch3a_draws_min_<name>`` / ``ch3a_draws_max_<name>``, ``ch3a_draws_loss_truth_<name>`` /
    ``ch3a_draws_loss_<name>`` (medians), all rounded to 3 decimals, and ``ch3a_draws_n`` /
    ``ch3a_draws_users`` (draws, users)."""
    out = {}
    for c, s in summary.items():
        n = TABLE3_NAMES[c]
        out.update({f"ch3a_draws_auc_{n}": s["auc"], f"ch3a_draws_lo_{n}": s["ci"][0], f"ch3a_draws_hi_{n}": s["ci"][1],
                    f"ch3a_draws_sd_{n}": s["sd"], f"ch3a_draws_min_{n}": s["range"][0],
                    f"ch3a_draws_max_{n}": s["range"][1], f"ch3a_draws_loss_truth_{n}": s["loss_truth"],
                    f"ch3a_draws_loss_{n}": s["loss"]})
    out = {k: round(float(v), 3) for k, v in out.items()}
    first = next(iter(summary.values()))
    out.update(ch3a_draws_n=first["num_draws"], ch3a_draws_users=first["num_users"])
    return out


def table3_boxplot(results: dict):
    """Per-user AUC of every Table 3 configuration as box plots, with the random-guess line.
    Returns the axes."""
    from ..plots import plt

    _, ax = plt.subplots(figsize=(7, 3))
    labels = [f"{a}{' +emb' if e else ''}{' +params' if p else ''}" for a, e, p in TABLE3_CONFIGS]
    ax.boxplot([results[c]["auc"].numpy() for c in TABLE3_CONFIGS], tick_labels=labels)
    ax.axhline(0.5, color="gray", ls=":", label="random guess")
    ax.set_ylabel("per-user AUC")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    return ax


# ---------------------------------------------------------------------------------------------------
# Appendix A (Theorems 1-2) on a linear model; batched vs per-user
# ---------------------------------------------------------------------------------------------------

def linear_case(m: int, p: int, *, generator: torch.Generator):
    """A linear model's attack problem for RAIFLE App. A (Theorems 1-2): Jacobian ``J`` [m, p] with
    N(0, 1) entries (float64), base predictions ``f0 = 0`` [m] and interactions [m], 1 with
    probability 0.2, both drawn from ``generator`` in that order. Returns ``(J, f0, I)``.
    Raises ``ValueError`` naming ``m`` or ``p`` when below 1."""
    positive_int("m", m)
    positive_int("p", p)
    J = torch.randn(m, p, generator=generator, dtype=torch.float64)
    I = (torch.rand(m, generator=generator) < 0.2).double()
    return J, torch.zeros(m, dtype=torch.float64), I


def loop_vs_batch(case: RecsysCase, users, *, max_iter: int, seed: int = 0) -> tuple[float, float]:
    """Seconds of the FCF attack (:func:`fedlab.attacks.interaction_inference.recsys.raifle_fcf`, one start, the
    embedding estimated jointly) on ``users`` of ``case``: first one call per user, then one batched
    call for all of them. Returns ``(loop_seconds, batch_seconds)``. Raises ``ValueError`` for an
    empty ``users``."""
    import time

    users = list(users)
    if not users:
        raise ValueError("users must not be empty")

    def attack(idx):
        m = int(case.mask[idx].sum(1).max())
        return raifle_fcf(case.X[idx, :m], case.fcf[idx, :m], case.mask[idx, :m],
                          budget=RaifleBudget(max_iter=max_iter, num_restarts=1), seed=seed)

    t0 = time.time()
    for u in users:
        attack([u])
    loop_s = time.time() - t0
    t0 = time.time()
    attack(users)
    return loop_s, time.time() - t0


# ---------------------------------------------------------------------------------------------------
# Defenses: LDP (RAIFLE Sec. 4.1.1, Fig. 8, Table 6) and gradient pruning (App. C.4, Fig. 10)
# ---------------------------------------------------------------------------------------------------

#: RAIFLE Table 6 (MovieLens-100K): K-S p-values of each variant's AUCs against random guessing at
#: epsilon = 1, 10, 20, 100, 500
PAPER_TABLE6 = {"FCF": [8.12e-01, 9.99e-01, 9.18e-01, 9.74e-01, 9.96e-01],
                "FCF emb": [8.58e-01, 8.80e-01, 8.80e-01, 1.54e-01, 8.55e-03],
                "FNCF": [8.12e-01, 4.10e-01, 6.90e-05, 6.65e-41, 1.27e-158],
                "FNCF emb": [5.99e-01, 2.94e-01, 9.47e-04, 1.69e-45, 2.53e-170],
                "FNCF emb model": [4.36e-01, 5.43e-01, 6.41e-03, 2.62e-36, 5.06e-158],
                "FNCF model": [8.99e-01, 5.43e-01, 1.85e-03, 2.74e-47, 3.27e-187]}

#: RAIFLE Sec. 4.1.1's local-DP settings, which chapter 3b's sweeps run with and chapter 3a's settings table
#: shows: the epsilon of one release, delta, and the sensitivity Delta_2 of each of a user's three releases
#: (FCF's items, FNCF's items, FNCF's network; the users clip to Delta_2 / 2, :func:`ldp_updates`)
LDP_EPSILONS = (1.0, 10.0, 20.0, 100.0, 500.0)
LDP_DELTA = 1e-8
LDP_SENSITIVITY = {"fcf": 100.0, "fncf_items": 0.005, "fncf_params": 0.7}

#: RAIFLE Table 7 (MovieLens-100K, no defense): K-S p-values between pairs of variants' AUCs
PAPER_TABLE7 = [("FNCF emb", "FNCF", 7.89e-94), ("FNCF emb", "FNCF model", 5.96e-93),
                ("FNCF emb model", "FNCF emb", 6.27e-01), ("FNCF model", "FNCF", 9.74e-01)]


def ldp_sigma_rows(epsilons, delta: float) -> list[list]:
    """Rows ``[epsilon, sigma / Delta_2 used, sigma / Delta_2 of the classical formula, true delta of
    the classical sigma]`` (RAIFLE Sec. 4.1.1: analytic Gaussian mechanism for epsilon > 1, Dwork &
    Roth's formula below; the true delta from Balle & Wang 2018, Thm. 8), for unit sensitivity."""
    rows = []
    for eps in epsilons:
        s_classic = ldp.classical_gaussian_sigma(eps, delta, 1.0)
        rows.append([eps, round(ldp.gaussian_sigma(eps, delta, 1.0), 4), round(s_classic, 4),
                     f"{ldp.analytic_gaussian_delta(s_classic, eps, 1.0):.1e}"])
    return rows


def ldp_updates(case: RecsysCase, eps: float, *, delta: float, sensitivity: dict, seed: int = 0) -> dict:
    """Every user's three updates released through the local Gaussian mechanism
    (:func:`fedlab.privacy.ldp.ldp_gaussian`: clipped to ``Delta_2 / 2``, noise for sensitivity
    ``Delta_2``), each with its own ``(eps, delta)`` mechanism as in RAIFLE Sec. 4.1.1 and its code
    (so an FNCF user sending items and network is ``(2 eps, 2 delta)``-LDP by basic composition). ``sensitivity``: the
    paper's ``Delta_2`` per update, ``{"fcf", "fncf_items", "fncf_params"}``. One generator seeded
    ``seed`` draws FCF's noise, then FNCF's items, then its network. Returns ``{"fcf", "fncf_items",
    "fncf_params"}``. Raises ``ValueError`` for a ``sensitivity`` without those keys."""
    missing = {"fcf", "fncf_items", "fncf_params"} - set(sensitivity)
    if missing:
        raise ValueError(f"sensitivity lacks {sorted(missing)}")
    gen = torch.Generator().manual_seed(seed)
    # RAIFLE's float mechanism (the paper's setting); not private on its float output, see chapter 5
    return {"fcf": ldp.ldp_gaussian(case.fcf, eps, delta, sensitivity["fcf"], mask=case.mask, generator=gen,
                                    safe=False),
            "fncf_items": ldp.ldp_gaussian(case.fncf_items, eps, delta, sensitivity["fncf_items"], mask=case.mask,
                                           generator=gen, safe=False),
            "fncf_params": ldp.ldp_gaussian(case.fncf_params, eps, delta, sensitivity["fncf_params"], generator=gen,
                                            safe=False)}


def ldp_attack_sweep(case: RecsysCase, epsilons, *, delta: float, sensitivity: dict, fcf_max_iter: int,
                     fncf_max_iter: int, num_restarts: int, configs=None, attacker_knows_clip: bool = True,
                     seed: int = 0) -> dict:
    """RAIFLE Fig. 8 / Table 6: for each epsilon every user releases its updates through
    :func:`ldp_updates` and RAIFLE attacks them in each configuration of ``configs`` (default: all
    six of :data:`TABLE3_CONFIGS`) with :func:`run_config`'s budgets, reproducing the users' clipping
    in its simulated update when ``attacker_knows_clip``. Returns ``{epsilon: {variant name
    (:data:`VARIANTS`): auc [U]}}``.
    """
    configs = TABLE3_CONFIGS if configs is None else list(configs)
    clip = {k: ldp.ldp_clip_norm(v) if attacker_knows_clip else None for k, v in sensitivity.items()}
    out = {}
    for eps in epsilons:
        upd = ldp_updates(case, eps, delta=delta, sensitivity=sensitivity, seed=seed)
        out[eps] = {}
        for c in configs:
            clip_norm = clip["fcf"] if c[0] == "FCF" else (clip["fncf_items"], clip["fncf_params"])
            out[eps][VARIANTS[c]] = run_config(case, c, fcf_max_iter=fcf_max_iter, fncf_max_iter=fncf_max_iter,
                                               num_restarts=num_restarts, clip_norm=clip_norm, seed=seed, **upd)["auc"]
    return out


def _ks_name(attack: str, eps: float) -> str:
    return f"ch3a_ks_{attack.lower().replace(' ', '_')}_eps{eps:g}"   # ch3a_ks_fcf_emb_eps1, ...


def ks_values(ldp_auc: dict, random_auc: torch.Tensor, epsilons) -> dict:
    """RAIFLE Table 6: the two-sample Kolmogorov-Smirnov p-value (:func:`fedlab.metrics.ks_pvalue`) of
    each swept variant's per-user AUCs at each epsilon (``ldp_auc`` from :func:`ldp_attack_sweep`)
    against those of random guessing (``random_auc`` [U]), as the glued names
    ``ch3a_ks_<variant>_eps<epsilon>`` -> float."""
    return {_ks_name(name, e): ks_pvalue(ldp_auc[e][name], random_auc)
            for name in PAPER_TABLE6 for e in epsilons if name in ldp_auc[e]}


def table6_table(ks: dict, epsilons, run) -> tuple[list, list]:
    """``(headers, rows)`` of RAIFLE Table 6: the paper's p-values (:data:`PAPER_TABLE6`), ours
    (``ks`` from :func:`ks_values`; "—" for a variant not swept) and the stored paper-scale record
    (``run.stored_p``: median and range over seeds, never a t interval). ``epsilons`` must be the paper's five (1, 10, 20, 100, 500); raises
    ``ValueError`` otherwise."""
    if list(epsilons) != [1.0, 10.0, 20.0, 100.0, 500.0]:
        raise ValueError(f"epsilons must be the paper's [1, 10, 20, 100, 500], got {list(epsilons)}")
    rows = []
    for name, paper in PAPER_TABLE6.items():
        tags = [_ks_name(name, e) for e in epsilons]
        rows.append([name, "paper"] + [f"{v:.2e}" for v in paper])
        rows.append([name, "ours"] + [f"{ks[t]:.2e}" if t in ks else "—" for t in tags])
        rows.append([name, "ours, paper scale (median, range, n seeds)"] + [run.stored_p(t) for t in tags])
    return ["variant", "source"] + [f"ε={e:g}" for e in epsilons], rows


def clip_knowledge_rows(knows: dict, blind: dict, epsilons, variants=("FCF emb", "FNCF emb")) -> list[list]:
    """Rows ``[variant, "yes" | "no", mean AUC at each epsilon]`` comparing an attacker that
    reproduces the users' clipping (``knows``) with one that does not (``blind``), both results of
    :func:`ldp_attack_sweep` on the same users. Raises ``ValueError`` for a variant or epsilon
    missing from either."""
    for res, name in ((knows, "knows"), (blind, "blind")):
        missing = [(e, v) for e in epsilons for v in variants if e not in res or v not in res[e]]
        if missing:
            raise ValueError(f"{name} lacks (epsilon, variant) {missing}")
    return [[v, label] + [round(res[e][v].mean().item(), 3) for e in epsilons]
            for v in variants for label, res in (("yes", knows), ("no", blind))]


def _t7_name(a: str, b: str) -> str:
    return f"ch3a_t7_{a.lower().replace(' ', '_')}_vs_{b.lower().replace(' ', '_')}"


def table7_values(results: dict) -> dict:
    """RAIFLE Table 7: for each pair of :data:`PAPER_TABLE7`, the K-S p-value between the two
    variants' per-user AUCs of a :func:`table3` result, as ``ch3a_t7_<a>_vs_<b>`` -> float."""
    auc = {VARIANTS[c]: r["auc"] for c, r in results.items()}
    return {_t7_name(a, b): ks_pvalue(auc[a], auc[b]) for a, b, _ in PAPER_TABLE7}


def table7_draws(draws: dict) -> dict:
    """RAIFLE Table 7 under each FNCF network draw of a :func:`fncf_network_draws` result: for each pair
    of :data:`PAPER_TABLE7` (all four are FNCF variants) the K-S p-value between the two variants' AUCs
    of the same users under the same network, one per draw, so that the network is a random effect of
    the test as of Table 3's rows. Returns ``{ch3a_t7_<a>_vs_<b>: [D] p-values}``. Raises ``ValueError``
    naming ``draws`` when it lacks a configuration of a pair."""
    auc = {VARIANTS[c]: draws[c]["auc"] for c in draws if isinstance(c, tuple)}
    missing = sorted({v for a, b, _ in PAPER_TABLE7 for v in (a, b)} - set(auc))
    if missing:
        raise ValueError(f"draws lacks the variants {missing} (run fncf_network_draws with all FNCF_CONFIGS)")
    return {_t7_name(a, b): [ks_pvalue(x, y) for x, y in zip(auc[a], auc[b])] for a, b, _ in PAPER_TABLE7}


def table7_draws_values(per_draw: dict) -> dict:
    """The glued names of a :func:`table7_draws` result: ``<name>_draws_median``, ``_draws_min``,
    ``_draws_max`` per pair (p-values over the network draws, no interval)."""
    out = {}
    for name, ps in per_draw.items():
        v = sorted(ps)
        k = len(v)
        out.update({f"{name}_draws_median": v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2,
                    f"{name}_draws_min": v[0], f"{name}_draws_max": v[-1]})
    return out


def table7_table(values: dict, run, per_draw: dict | None = None, *, draw_users: int | None = None) -> tuple[list, list]:
    """``(headers, rows)`` of RAIFLE Table 7: paper, ours (``values`` from :func:`table7_values`), ours
    over network draws (``per_draw`` from :func:`table7_draws`, on ``draw_users`` users; median and range,
    :func:`fedlab.records.pvalue_summary`) when given, and the stored paper-scale record."""
    rows = []
    for a, b, p in PAPER_TABLE7:
        name = _t7_name(a, b)
        row = [a, b, f"{p:.2e}", f"{values[name]:.2e}"]
        if per_draw is not None:
            row.append(pvalue_summary(per_draw[name], unit="networks"))
        rows.append(row + [run.stored_p(name)])
    headers = ["variant 1", "variant 2", "paper p", "our p (one network, Table 3's users)"]
    if per_draw is not None:
        headers.append(f"our p per network ({draw_users} users; median, range)")
    return headers + ["our p, paper scale (median, range, n seeds)"], rows


def prune_sweep(case: RecsysCase, fractions, *, fcf_max_iter: int, fncf_max_iter: int, num_restarts: int,
                seed: int = 0, knows_mask: bool = False, results: bool = False, user_ids=None) -> dict:
    """RAIFLE App. C.4 (Fig. 10): for each fraction, every user prunes that fraction of the
    smallest-magnitude entries of each row of its FCF and FNCF item updates
    (:func:`fedlab.privacy.defenses.prune_rows`) and RAIFLE with embedding estimation attacks both (FCF:
    ``fcf_max_iter`` evaluations; FNCF: ``fncf_max_iter``; both ``num_restarts`` restarts).

    ``knows_mask=False`` is the paper's attacker, whose dense simulated update is asked to reproduce
    the zeros too; ``True`` the attacker who knows the defense: it reads the kept coordinates off the
    update (its non-zero entries) and matches only those (``coord_mask`` of
    :func:`fedlab.attacks.interaction_inference.recsys.raifle_fcf` and ``raifle_fncf``). ``user_ids``:
    as :func:`attack_case` (the same ids give the same starts). Returns ``{fraction: {"FCF emb": auc
    [U], "FNCF emb": auc [U]}}``, or with ``results=True`` the whole :func:`attack_case` results (AUC,
    loss reached, loss at the truth) in place of the AUCs. Raises ``ValueError`` for a fraction outside
    [0, 1)."""
    fractions = list(fractions)
    bad = [f for f in fractions if not 0 <= f < 1]
    if bad:
        raise ValueError(f"fractions must lie in [0, 1), got {bad}")
    out = {}
    for frac in fractions:
        fcf = prune_rows(case.fcf, frac, mask=case.mask)
        items = prune_rows(case.fncf_items, frac, mask=case.mask)
        fcf_kw = {"coord_mask": fcf != 0} if knows_mask else {}
        fncf_kw = {"coord_mask": items != 0} if knows_mask else {}
        emb = RaifleVariant(estimate_embedding=True)
        res = {"FCF emb": attack_case(replace(case, fcf=fcf), "fcf", variant=emb,
                                      budget=RaifleBudget(max_iter=fcf_max_iter, num_restarts=num_restarts),
                                      seed=seed, user_ids=user_ids, **fcf_kw),
               "FNCF emb": attack_case(replace(case, fncf_items=items), "fncf", variant=emb,
                                       budget=RaifleBudget(max_iter=fncf_max_iter, num_restarts=num_restarts),
                                       seed=seed, user_ids=user_ids, **fncf_kw)}
        out[frac] = res if results else {k: r["auc"] for k, r in res.items()}
    return out


def prune_curves(naive: dict, aware: dict, aware_pos) -> dict:
    """The mean AUC per pruning fraction of :func:`prune_sweep`'s two attackers: ``"naive"`` the paper's
    attacker on every user of ``naive`` (``{fraction: {name: auc [U]}}``), ``"naive_same"`` it on the users
    ``aware_pos`` (indices into those users) alone, and ``"aware"`` the attacker who knows the mask on the
    same users (``aware``: ``prune_sweep(..., knows_mask=True, results=True)`` on them, every fraction of
    ``naive`` but 0, where nothing is pruned and both attackers are one: its point is ``naive_same``'s).
    Each ``{name: [mean AUC per fraction of naive]}``. Raises ``ValueError`` when ``aware`` lacks a
    non-zero fraction of ``naive``."""
    fractions = list(naive)
    missing = [f for f in fractions if f != 0 and f not in aware]
    if missing:
        raise ValueError(f"aware lacks the fractions {missing}")
    idx = torch.as_tensor(aware_pos, dtype=torch.long)
    names = list(next(iter(naive.values())))
    same = {n: [naive[f][n][idx].mean().item() for f in fractions] for n in names}
    return {"naive": {n: [naive[f][n].mean().item() for f in fractions] for n in names}, "naive_same": same,
            "aware": {n: [same[n][i] if f == 0 else aware[f][n]["auc"].mean().item() for i, f in enumerate(fractions)]
                      for n in names}}


def prune_plot(fractions, curves: dict):
    """RAIFLE Fig. 10 with both attackers: :func:`prune_curves`' ``"naive"`` curves (solid) and
    ``"aware"`` ones (dashed, triangles, the same colour per variant) over the percentage pruned. Returns
    the axes."""
    from ..plots import line_plot

    ys = {**curves["naive"], **{f"{n}, knows the mask": v for n, v in curves["aware"].items()}}
    styles = {f"{n}, knows the mask": {"ls": "--", "marker": "^", "color": f"C{i}"} for i, n in enumerate(curves["aware"])}
    return line_plot([100 * f for f in fractions], ys, xlabel="% of update pruned", ylabel="mean AUC", styles=styles,
                     title="RAIFLE under gradient pruning (cf. RAIFLE Fig. 10)")


def prune_aware_values(curves: dict, aware: dict, case: RecsysCase, *, budget: int) -> dict:
    """The glued names of the attacker who knows the pruning mask (``curves`` from :func:`prune_curves`,
    ``aware`` its :func:`prune_sweep` results with ``results=True`` at 0.5, 0.9 and 0.99, ``case`` its
    users, ``budget`` its loss evaluations per start): FCF's and FNCF's mean AUCs of both attackers on the
    same users; at 90 % FCF's (lower) median loss reached and at the truth, and a verdict sentence from
    them (:func:`fedlab.metrics.optimum_status`'s "stalled" makes the AUC a lower bound); and the
    share of the users' real items whose pruned FCF row keeps any coordinate at 90 % and 99 %
    (``prune_rows`` works on a user's whole update, so whole item rows vanish)."""
    positive_int("budget", budget)
    fr = list(aware)
    missing = sorted({0.5, 0.9, 0.99} - set(fr))
    if missing:
        raise ValueError(f"aware lacks the fractions {missing}")
    pos = {f: 1 + fr.index(f) for f in (0.5, 0.9, 0.99)}       # curves hold fraction 0 first
    r90 = aware[0.9]["FCF emb"]
    reached, at_truth = r90["loss"].median().item(), r90["loss_truth"].median().item()
    verdict = (f"the attack stops far above the truth's loss within the sweep's {budget} evaluations, so this AUC "
               "is a lower bound on what leaks, not a measure of the defense" if optimum_status(reached, at_truth) == "stalled"
               else "the attack reaches the truth's loss, so this AUC is what the update gives away")
    kept = {f: ((prune_rows(case.fcf, f, mask=case.mask) != 0).any(-1)[case.mask]).double().mean().item()
            for f in (0.9, 0.99)}
    a, n = curves["aware"], curves["naive_same"]
    out = {"ch3a_fcf_prune50_same": n["FCF emb"][pos[0.5]], "ch3a_fcf_prune50_aware": a["FCF emb"][pos[0.5]],
           "ch3a_fcf_prune90_aware": a["FCF emb"][pos[0.9]], "ch3a_fcf_prune99_aware": a["FCF emb"][pos[0.99]],
           "ch3a_prune90_same": n["FNCF emb"][pos[0.9]], "ch3a_prune90_aware": a["FNCF emb"][pos[0.9]],
           "ch3a_prune99_same": n["FNCF emb"][pos[0.99]], "ch3a_prune99_aware": a["FNCF emb"][pos[0.99]]}
    out = {k: round(v, 3) for k, v in out.items()}
    out.update(ch3a_prune_aware_users=len(case), ch3a_fcf_prune90_loss=f"{reached:.2g}",
               ch3a_fcf_prune90_loss_truth=f"{at_truth:.2g}", ch3a_fcf_prune90_verdict=verdict,
               ch3a_fcf_rows_kept90=round(kept[0.9], 2), ch3a_fcf_rows_kept99=round(kept[0.99], 2))
    return out


def defense_boxplots(ldp_auc: dict, prune_auc: dict, eps: float, frac: float):
    """Side-by-side box plots of the per-user AUCs under LDP at ``eps`` and under pruning ``frac``
    (results of :func:`ldp_attack_sweep` and :func:`prune_sweep`; nothing is recomputed). Raises
    ``ValueError`` naming ``eps`` or ``frac`` when it was not swept. Returns the axes."""
    from ..plots import plt

    if eps not in ldp_auc:
        raise ValueError(f"eps={eps} was not swept; choose one of {list(ldp_auc)}")
    if frac not in prune_auc:
        raise ValueError(f"frac={frac} was not swept; choose one of {list(prune_auc)}")
    _, axs = plt.subplots(1, 2, figsize=(8, 2.8), sharey=True)
    for ax, res, title in [(axs[0], ldp_auc[eps], f"LDP ε = {eps:g}"),
                           (axs[1], prune_auc[frac], f"pruned {100 * frac:g} %")]:
        ax.boxplot([res["FCF emb"].numpy(), res["FNCF emb"].numpy()], tick_labels=["FCF emb", "FNCF emb"])
        ax.axhline(0.5, color="gray", ls=":")
        ax.set_title(title)
    axs[0].set_ylabel("per-user AUC")
    return axs


# ---------------------------------------------------------------------------------------------------
# The chapter's settings: the paper, its authors' reference code, and ours
# ---------------------------------------------------------------------------------------------------

#: the authors' public code (github.com/dzungvpham/raifle) quoted by :func:`reference_settings_table`:
#: commit c513b97 (2023-11-17) is the last version before 2024, the one that matches the paper's
#: Table 3 setting (FCF and FNCF 16-8 on MovieLens-100K); HEAD 7d1a33b (2025-03-04) is the newest
REFERENCE_REPOSITORY = "github.com/dzungvpham/raifle"


def _signature_default(fn, name: str):
    """The default of parameter ``name`` of ``fn``, read from its signature (so the table follows the
    library when a default changes)."""
    return inspect.signature(fn).parameters[name].default


#: Chapter 3a's settings that differ between the quick and the paper scale, ``name -> (quick, paper)``:
#: the notebook reads each with :func:`scaled` and :func:`reference_settings_table` states both.
#: ``table3_users``: users attacked in Table 3 (``None``: every user of the data set); ``fcf_max_iter``,
#: ``fncf_max_iter``, ``num_restarts``: Table 3's budget and starts (:func:`attack_budget`);
#: ``sweep_users``, ``sweep_max_iter``: the defense sweeps' users (a random subset of Table 3's) and
#: budget; ``ldp_variants``: how many of :data:`TABLE3_CONFIGS` the LDP sweep runs (the first ones);
#: ``loop_users``: users of the per-user loop against the batched call; ``network_draws``, ``draw_users``:
#: the FNCF rows over independent network draws (:func:`fncf_network_draws`, with Table 3's budget): how
#: many networks, and how many users (Table 3's users with the fewest items); ``reference_users``: the users
#: (a random subset of Table 3's) of Table 3 under the reference code's attack settings (:func:`table3_reference`);
#: ``prune_aware_users``: the users (a random subset of the sweeps') the attacker who knows the pruning mask attacks
SCALE_SETTINGS = {"table3_users": (8, None), "fcf_max_iter": (100, 1000), "fncf_max_iter": (150, 1000),
                  "num_restarts": (2, 2), "sweep_users": (4, 200), "sweep_max_iter": (50, 1000),
                  "ldp_variants": (4, 6), "loop_users": (4, 16), "network_draws": (10, 10), "draw_users": (2, 100),
                  "reference_users": (3, 50), "prune_aware_users": (4, 50)}


def scaled(name: str):
    """The value of the scale-dependent setting ``name`` of :data:`SCALE_SETTINGS` at the active scale
    (``FEDLAB_SCALE``, :func:`fedlab.config.pick`). Raises ``ValueError`` for an unknown ``name``."""
    from ..config import pick

    if name not in SCALE_SETTINGS:
        raise ValueError(f"name must be one of {sorted(SCALE_SETTINGS)}, got {name!r}")
    quick, paper = SCALE_SETTINGS[name]
    return pick(quick=quick, paper=paper)


def _check_scale_settings(settings: dict) -> None:
    """``ValueError`` naming ``settings`` unless it holds every key of :data:`SCALE_SETTINGS` as a
    ``(quick, paper)`` pair of positive integers (``table3_users`` may be ``None``: every user)."""
    for name, value in scale_pairs(settings, SCALE_SETTINGS):
        if value is None and name == "table3_users":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"settings[{name!r}] must hold positive integers, got {settings[name]!r}")
    for value in settings["ldp_variants"]:
        if value > len(TABLE3_CONFIGS):
            raise ValueError(f"settings['ldp_variants'] must be at most {len(TABLE3_CONFIGS)}, got {value}")


def reference_settings_table(case: RecsysCase, *, source: str, num_users_total: int, epsilons, delta: float,
                             sensitivity: dict, settings: dict | None = None) -> tuple[list, list]:
    """Chapter 3a's settings as ``(header, rows)`` for :func:`fedlab.plots.md_table`: one row per
    setting that matters for RAIFLE's result on federated recommendation, and one per departure from
    the paper or its code, with four columns: the paper (Pham, Kulkarni & Houmansadr; section cited),
    its authors' reference code (:data:`REFERENCE_REPOSITORY`, the commit cited, with where it changed
    across commits), ours at quick scale and ours at paper scale ("same" where the two scales agree).

    The first two columns quote their sources. Every value of the two "ours" columns comes from code:
    from ``settings`` (default :data:`SCALE_SETTINGS`, read at the call: the budgets, starts and users
    the notebook runs at each scale, through :func:`attack_budget`), from the arguments (the notebook's
    constants: ``case`` the honest round the chapter attacks, built by :func:`~fedlab.attacks.interaction_inference.recsys.make_recsys_case`;
    ``source`` and ``num_users_total`` the data set's name and size; ``epsilons``, ``delta``,
    ``sensitivity`` the LDP sweep's settings, as for :func:`ldp_attack_sweep`) or read from the library
    (the network of ``case.model``, the defaults of
    :func:`fedlab.attacks.interaction_inference.recsys.raifle`, :func:`fedlab.optim.lbfgs_rows`,
    :func:`fedlab.attacks.interaction_inference.recsys.matching_loss` and
    :func:`fedlab.fl.recsys.interactions.fcf_item_updates`, and
    :data:`fedlab.attacks.interaction_inference.recsys.FNCF_CONTINUATION`).

    Raises ``ValueError`` for an empty ``case``, ``num_users_total`` below the users ``settings``
    attack, ``settings`` without a key of :data:`SCALE_SETTINGS` or with a value that is not a
    positive integer, an empty ``epsilons`` or a ``sensitivity`` without the keys ``fcf``,
    ``fncf_items``, ``fncf_params``.
    """
    from ..attacks.interaction_inference import recsys as _recsys
    from .. import optim as _optim
    from ..fl.recsys import interactions as _interactions

    if len(case) < 1:
        raise ValueError("case must hold at least one user")
    settings = SCALE_SETTINGS if settings is None else settings
    _check_scale_settings(settings)
    positive_int("num_users_total", num_users_total)
    for scale_users in settings["table3_users"]:
        if scale_users is not None and scale_users > num_users_total:
            raise ValueError(f"num_users_total={num_users_total} is below the {scale_users} users settings attack")
    epsilons = list(epsilons)
    if not epsilons:
        raise ValueError("epsilons must hold at least one value")
    missing = {"fcf", "fncf_items", "fncf_params"} - set(sensitivity)
    if missing:
        raise ValueError(f"sensitivity lacks {sorted(missing)}")

    _, _, d = case.X.shape
    pos = case.I.sum(1)
    neg = case.mask.sum(1) - pos
    ratio = float((neg / pos.clamp_min(1)).median())
    linears = [m for m in case.model.modules() if isinstance(m, torch.nn.Linear)]
    widths = [m.out_features for m in linears[:-1]]
    biases = "with biases" if all(m.bias is not None for m in linears) else "without biases"
    raifle_fn = _recsys.raifle
    budget = _signature_default(raifle_fn, "budget")
    history, tol, emb_std, antithetic = budget.history_size, budget.tol, budget.emb_init_std, budget.antithetic
    c1 = _signature_default(_optim.lbfgs_rows, "c1")
    backtracks = _signature_default(_optim.lbfgs_rows, "max_backtracks")
    squared = _signature_default(_recsys.matching_loss, "squared")
    alpha = _signature_default(_interactions.fcf_item_updates, "alpha")
    fcf_lr = _signature_default(_interactions.fcf_item_updates, "lr")
    temps = tuple(_recsys.FNCF_CONTINUATION)
    knows_clip = _signature_default(ldp_attack_sweep, "attacker_knows_clip")
    steps = case.local_steps
    fmt = ", ".join

    def at(i):
        """The scale-dependent cells at scale ``i`` (0 quick, 1 paper)."""
        s = {name: pair[i] for name, pair in settings.items()}
        kw = dict(fcf_max_iter=s["fcf_max_iter"], fncf_max_iter=s["fncf_max_iter"], num_restarts=s["num_restarts"])
        with_emb, no_emb = attack_budget(("FCF", True, False), **kw), attack_budget(("FCF", False, False), **kw)
        fncf = attack_budget(("FNCF", True, False), **kw)
        sweep_kw = dict(fcf_max_iter=s["sweep_max_iter"], fncf_max_iter=s["sweep_max_iter"], num_restarts=s["num_restarts"])
        sweep_no_emb = attack_budget(("FCF", False, False), **sweep_kw)
        n3 = s["table3_users"]
        users = (f"all {num_users_total} users" if n3 is None or n3 == num_users_total
                 else f"{n3} of its {num_users_total} users, drawn at random")
        continuation_on = steps == 1 and fncf.max_iter >= 10 * (len(temps) + 1)
        variants = [VARIANTS[c] for c in TABLE3_CONFIGS[:s["ldp_variants"]]]
        return {
            "data and users": f"{source}: {users}, attacked in Table 3; a random {s['sweep_users']} of them in the "
                              "defense sweeps",
            "budget": f"loss evaluations per start, not iterations: FCF {with_emb.max_iter} with the embedding, "
                      f"{no_emb.max_iter} without; FNCF {fncf.max_iter}; defense sweeps {s['sweep_max_iter']} "
                      f"(FCF without the embedding {sweep_no_emb.max_iter})",
            "starts": f"FCF with the embedding and FNCF: {with_emb.num_restarts} per user"
                      + (" (antithetic pairs e, −e)" if antithetic else " (independent)")
                      + f"; FCF without the embedding: {no_emb.num_restarts}",
            "continuation (FNCF with the embedding)":
                (f"smoothed ReLUs, τ = {fmt(f'{t:g}' for t in temps)}, then the exact network, in equal shares of "
                 "the budget" if continuation_on else "off at this budget or local training"),
            "Table 3 under the reference's attack settings":
                f"{s['reference_users']} of Table 3's users, drawn at random: {REFERENCE_ATTACK['num_restarts']} "
                + ("antithetic" if REFERENCE_ATTACK["antithetic"] else "independent")
                + f" starts, {fncf.max_iter} evaluations for every configuration, FCF's squared error, no "
                  "continuation (`table3_reference`)",
            "defense sweeps (LDP, pruning)": f"{s['sweep_users']} users, {s['sweep_max_iter']} evaluations per start; "
                                             f"LDP: {len(variants)} of the 6 variants ({fmt(variants)}); pruning: "
                                             f"FCF emb and FNCF emb, by the paper's attacker and, on a random "
                                             f"{s['prune_aware_users']} of the users, by the one who knows the mask",
        }

    ours = partial(scale_cells, at(0), at(1))     # the two "ours" cells of a row (quick, paper)
    header = settings_header(REFERENCE_REPOSITORY)
    rows = [
        ["data and users",
         "MovieLens-100K binarised (rated = 1): 943 users, 1682 items, 106 ratings per user on average "
         "(Sec. 4.1.2, Table 2); every user attacked once (Sec. 4.1.1)",
         "c513b97: MovieLens-100K, every user; HEAD 7d1a33b: the first 30 users ('scaled down for artifact "
         "eval'), MovieLens-100K or Steam-200K, FNCF without embedding estimation only",
         *ours("data and users")],
        ["negatives",
         "non-interacted items sampled 4:1 to interacted ones (Sec. 4.1.2)",
         "c513b97 and HEAD: `neg_sample_ratio = 4`, `random.sample` of the non-interacted items",
         *ours("negatives", f"{ratio:g} sampled per interacted item (median over the attacked users)")],
        ["embeddings",
         "d = 64, user and item embeddings 'randomly initialized' (Sec. 4.1.3)",
         "c513b97 and HEAD: `embedding_dim = 64`, `nn.Embedding`, i.e. N(0, 1)",
         *ours("embeddings", f"d = {d}; users and items N(0, 1) (`make_recsys_case`)")],
        ["FCF update",
         "FCF of Ammad-ud-din et al. (Sec. 2.3.2); local training not given",
         "c513b97: the item gradient (I − X e) eᵀ with confidence 1 + αI, α = 0; FCF is commented out of "
         "`experiment_rec.ipynb` from 10b5f8c (2024-03-18) and gone at HEAD",
         *ours("FCF update", f"(I − X e) eᵀ times lr = {fcf_lr:g}, confidence 1 + αI with α = {alpha:g} "
                             "(`fcf_item_updates`)")],
        ["FNCF network",
         "2-layer MLP, 16 and 8 ReLU units (Sec. 4.1.3)",
         "c513b97: `NeuralCollaborativeFilteringRecommender(64, [16, 8])` on [e_u, x_i], biases, sigmoid output, "
         "BCE; from 10b5f8c to HEAD: hidden [128, 64, 32]",
         *ours("FNCF network", f"MLP on [e_u, x_i] ({2 * d} inputs), hidden {fmt(map(str, widths))} ReLU, {biases}, "
                               "one logit, BCE")],
        ["FNCF local training",
         "not given",
         "c513b97: the update is one BCE gradient (items, and network), no step size; from 10b5f8c to HEAD: "
         "20 Adam epochs (torchopt, lr 0.001) on e_u, items and network, the update divided by the lr",
         *ours("FNCF local training", f"{steps} full-batch gradient step{'s' if steps != 1 else ''} of size "
                                      f"{case.fncf_lr:g} on (e_u, items, network); the change of items and network is sent")],
        ["attack loss (items)",
         "mean L2 distance between matching item rows (Sec. 4.1.1)",
         "FNCF: mean `F.pairwise_distance` × max(1, 100 / mean target row norm) (c513b97 and HEAD); "
         "FCF: `F.mse_loss`, the default (c513b97)",
         *ours("attack loss (items)", "FCF and FNCF: mean L2 row distance / mean target row norm (`matching_loss`, "
                                      f"squared={squared})")],
        ["attack loss (network term)",
         "the sum of the model-parameter and item losses (App. B.2, Algorithm 2); form not given",
         "`F.mse_loss`; up to c1295a3 (2024-03-13) the simulated network gradient is detached (`backward()` "
         "without `create_graph`)",
         *ours("attack loss (network term)", "‖Δθ′ − Δθ̂‖² / ‖Δθ̂‖², differentiated")],
        ["optimiser and line search",
         "L-BFGS with the L2 loss (App. B.3)",
         "c513b97 to HEAD: `torch.optim.LBFGS`, lr 0.1, strong Wolfe line search, torch's defaults (history 100, "
         "tolerance_grad 1e-7, tolerance_change 1e-9)",
         *ours("optimiser and line search", f"`lbfgs_rows`: one L-BFGS per (user, start), history {history}, Armijo "
                                            f"backtracking (c1 = {c1:g}, at most {backtracks} steps), stops when the loss "
                                            f"changes by < {tol:g}")],
        ["budget",
         "none given; a step budget and a loss-improvement threshold as termination criteria (App. B.3)",
         "`max_iter = 1000` L-BFGS iterations per start (torch evaluates the loss up to 1250 times), the same for "
         "FCF with and without the embedding; 100000 in c513b97's synthetic-data simulation",
         *ours("budget")],
        ["starts",
         "random restarts, best result kept; number not given (App. B.3)",
         "c513b97: `num_atk = 5` independent starts (MovieLens cells, every variant), 10 in the synthetic "
         "simulation; from 10b5f8c to HEAD: 1",
         *ours("starts")],
        ["start distribution",
         "z ~ U(−1, 1), I′ = sigmoid(z) (App. B.3); e′_u 'random' (Algorithm 2)",
         "z and the estimated e′_u ~ U(−1, 1) (`torch.rand(...) * 2 - 1`, c513b97 to HEAD)",
         *ours("start distribution", f"z ~ U(−1, 1); the estimated e′_u ~ N(0, {emb_std:g}²)")],
        ["embedding without estimation",
         "not given",
         "`torch.rand(64)`: one U(0, 1) draw per user (c513b97 to HEAD)",
         *ours("embedding without estimation", "one N(0, I) draw per user")],
        ["continuation (FNCF with the embedding)",
         "none",
         "none",
         *ours("continuation (FNCF with the embedding)")],
        ["Table 3 under the reference's attack settings",
         "—",
         "c513b97: 5 independent starts, 1000 iterations for every variant, FCF's loss the MSE, no continuation",
         *ours("Table 3 under the reference's attack settings")],
        ["defense sweeps (LDP, pruning)",
         "every user, all six variants under LDP (Fig. 8, Table 6); pruning (App. C.4, Fig. 10)",
         "c513b97: the MovieLens cells with LDP attack every user with the Table 3 budget and starts",
         *ours("defense sweeps (LDP, pruning)")],
        ["LDP mechanism",
         "Gaussian, δ = 1e-8, ε ∈ {1, 10, 20, 100, 500}; Δ₂ = 100 (FCF items), 0.005 (FNCF items), 0.7 (FNCF "
         "network); analytic Gaussian for ε > 1, classical for ε ≤ 1 (Sec. 4.1.1)",
         "`apply_gaussian_mechanism`: clip to Δ₂/2, diffprivlib `GaussianAnalytic` / `Gaussian`; c513b97: "
         "ε ∈ {1, 10, 100, ∞}, Δ₂ 100 / 0.005 / 0.7; HEAD: ε ∈ {1, 20, 100, 500, ∞}, Δ₂ = 0.1 (FNCF items)",
         *ours("LDP mechanism",
               f"`ldp_gaussian`, δ = {delta:g}, ε ∈ {{{fmt(f'{e:g}' for e in epsilons)}}}; Δ₂ = "
               f"{sensitivity['fcf']:g} / {sensitivity['fncf_items']:g} / {sensitivity['fncf_params']:g}, clipped to "
               f"{ldp.ldp_clip_norm(sensitivity['fcf']):g} / {ldp.ldp_clip_norm(sensitivity['fncf_items']):g} / "
               f"{ldp.ldp_clip_norm(sensitivity['fncf_params']):g}; analytic for ε > 1, classical for ε ≤ 1")],
        ["attacker knows the clipping",
         "not given",
         "no: it simulates the unclipped update (c513b97 to HEAD)",
         *ours("attacker knows the clipping",
               "yes (reproduced in the simulation); the 'blind' table drops it" if knows_clip
               else "no: it simulates the unclipped update")],
    ]
    return header, rows
