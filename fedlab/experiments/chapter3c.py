"""The experiments of chapters 3c and 3d: the sweeps of RAIFLE Section 4 (Pham, Kulkarni & Houmansadr) against
federated online learning to rank, as the chapters run them, with their "paper vs ours" tables and figures.
Chapter 3c (``chapters/03c_raifle_oltr.ipynb``) runs the attack: Figs. 5 and 11, the settings tables, the
secure aggregation and PIR bypasses end to end; chapter 3d (``chapters/03d_raifle_oltr_defenses.ipynb``) the
defenses: local DP (Figs. 6-7, Tables 4-5 and 8), gradient pruning (Fig. 9) and the client's data validation
(Sec. 5.1), the last on chapter 3c's users rebuilt from the same seeds (:func:`fig5_cases`,
:func:`noisy_adm_cases`, :func:`sa_bypass_case`). The attack itself is
:mod:`fedlab.attacks.interaction_inference.oltr`.

Functions whose name ends in ``_grid`` run one sweep for every ranker of ``rankers``, a dict
``{name: hidden layer sizes}`` (the chapter's ``{"linear": (), "neural": (16, 8)}``), in that order,
and key their results by the ranker's name first.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import math

import torch

from ..attacks.interaction_inference.oltr import (Adm, attack_oltr, cat_cases, first_layer_mask, flag_dead_features,
                                                  make_oltr_case, pir_detect, pir_fingerprint, raifle_oltr,
                                                  sa_bypass_features, sa_recover)
from ..attacks.interaction_inference.recsys import RaifleBudget
from ..fl.oltr import (OltrUsers, click_probabilities, federated_oltr, init_rankers, local_update, pdgd_gradient, present,
                       simulate_clicks)
from ..metrics import ks_pvalue, roc_auc_rows
from ..privacy import secure_aggregation as sa
from ..privacy.defenses import prune_rows
from ..privacy.ldp import LdpGaussian, gaussian_sigma, ldp_clip_norm, ldp_gaussian
from .tables import scale_cells, scale_pairs, settings_header

__all__ = ["noise_replacement_grid", "SETTINGS", "SETTING_LABELS", "settings_grid", "update_drift", "order_mismatch", "settings_table",
           "settings_values", "adm_query_cases", "adm_query_sweep", "noisy_adm_sweep", "sa_bypass_case",
           "sa_bypass_experiment", "LdpSweep", "ldp_sweep", "click_model_rows", "fig5_cases", "fig5_grid", "fig5_plot", "fig5_mean", "fig5_summary", "PAPER_FIG5", "FIG5_NAMES",
           "fig5_table", "adm_gain", "noisy_adm_cases", "noisy_adm_grid", "noisy_adm_plot", "PAPER_FIG11", "noisy_name", "noisy_values",
           "noisy_table", "pir_experiment", "pir_grid", "ldp_grid", "ldp_grids", "ldp_plot", "PAPER_KS", "PAPER_KS_NAV", "ks_pvalues", "ks_values",
           "ks_table", "ks_queries_table", "utility_grid", "PAPER_T8", "table8_values", "table8_table", "table8_rise", "prune_grid", "prune_plot",
           "PAPER_FIG9", "prune_values", "prune_table", "flag_rounds", "ldp_boxplot", "RECORD_LABELS",
           "DEFENSE_RECORD_LABELS", "RECORD_KINDS", "DEFENSE_RECORD_KINDS",
           "REFERENCE_REPOSITORY", "SCALE_SETTINGS", "scaled", "reference_settings_table", "REFERENCE_BUDGET",
           "budget_check", "budget_table"]


def _query_cases(data, hidden, Q: int, click_models: list, num_users: int, *, lr: float, seed: int) -> list:
    """``[((click_model, adm), case)]`` that :func:`adm_query_sweep` attacks at ``Q`` queries, in its batch order
    (the position is the case's ``group``)."""
    cfgs = [(c, a) for c in click_models for a in ([False] if Q == 1 else [False, True])]
    return [((c, a), make_oltr_case(data, num_users, Q, hidden, users=OltrUsers(click_model=c, lr=lr), adm=a, group=g,
                                    seed=seed + 1000 * Q + 10 * click_models.index(c) + len(hidden)))
            for g, (c, a) in enumerate(cfgs)]


def adm_query_cases(data, hidden, queries, click_models, num_users: int, *, lr: float, seed: int = 0) -> dict:
    """The users :func:`adm_query_sweep` simulates, not attacked: ``{(Q, click_model, adm): OltrCase}``, each the
    case the sweep attacks for the same arguments (same seeds: the same lists, clicks and updates). Chapter 3d
    checks the client's data validation (RAIFLE Sec. 5.1) on them."""
    click_models = list(click_models)
    return {(Q, *cfg): case for Q in queries
            for cfg, case in _query_cases(data, hidden, Q, click_models, num_users, lr=lr, seed=seed)}


def adm_query_sweep(data, hidden, queries, click_models, num_users: int, *, lr: float, max_iter: int,
                    seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE Fig. 5 for one ranker: per-user AUC against the number of queries, with and without ADM.

    For every ``Q`` in ``queries`` and click model, ``num_users`` users are simulated once
    (:func:`~fedlab.attacks.interaction_inference.oltr.make_oltr_case`; the seed depends on ``Q``, the click model and the ranker but not on ADM,
    so ADM and no ADM are measured on the same users, lists and clicks) and attacked without ADM and,
    for ``Q > 1``, with ADM, all configurations of one ``Q`` in one batch (:func:`~fedlab.attacks.interaction_inference.oltr.attack_oltr`).
    Returns ``(auc, cases)``, both keyed ``(Q, click_model, adm)``: ``auc`` [num_users] tensors and
    the simulated :class:`OltrCase` objects.
    """
    click_models = list(click_models)
    auc_out, cases_out = {}, {}
    for Q in queries:
        built = _query_cases(data, hidden, Q, click_models, num_users, lr=lr, seed=seed)
        case = cat_cases([one for _, one in built])
        auc = attack_oltr(case, budget=RaifleBudget(max_iter=max_iter), seed=seed)
        for g, ((c, a), one) in enumerate(built):
            auc_out[(Q, c, a)], cases_out[(Q, c, a)] = auc[case.group == g], one
    return auc_out, cases_out


def noisy_adm_sweep(data, hidden, noise_stds, num_users: int, num_queries: int, *,
                    click_model: str = "informational", lr: float, max_iter: int,
                    seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE App. C.5 (Fig. 11): the same users attacked without ADM (key ``None``) and with ADM
    whose unallocated features are filled with server-known noise of each std in ``noise_stds``
    (0 = exact zeros). Returns ``(auc, cases)`` keyed by the std: [num_users] AUC tensors, cases."""
    cases = _noisy_cases(data, hidden, noise_stds, num_users, num_queries, click_model=click_model, lr=lr, seed=seed)
    case = cat_cases(list(cases.values()))
    auc = attack_oltr(case, budget=RaifleBudget(max_iter=max_iter), seed=seed)
    return {s: auc[case.group == g] for g, s in enumerate(cases)}, cases


def _noisy_cases(data, hidden, noise_stds, num_users: int, num_queries: int, *, click_model: str, lr: float,
                 seed: int) -> dict:
    """``{std: OltrCase}`` that :func:`noisy_adm_sweep` attacks (``None`` first: no ADM), in its batch order."""
    keys = [None] + list(noise_stds)
    return {s: make_oltr_case(data, num_users, num_queries, hidden, users=OltrUsers(click_model=click_model, lr=lr),
                              adm=False if s is None else Adm(noise_std=s), group=g, seed=seed + 50)
            for g, s in enumerate(keys)}


def sa_bypass_case(data, hidden, group_size: int, D: torch.Tensor, *, lr: float, generator: torch.Generator,
                   seed: int = 0):
    """The group :func:`sa_bypass_experiment` simulates, before secure aggregation: ``group_size`` users (user 0
    the target) train one query from one global ranker drawn from ``generator`` on the features the server
    manipulated (:func:`~fedlab.attacks.interaction_inference.oltr.sa_bypass_features`: the target keeps only the
    features in ``D``, a [num_features] bool mask, every other user only the rest). Returns the
    :class:`~fedlab.attacks.interaction_inference.oltr.OltrCase`; ``generator`` has drawn the ranker and nothing
    else, so a fresh generator of the experiment's seed gives the experiment's group."""
    theta = init_rankers(1, data.num_features, hidden, generator=generator)[0]
    return make_oltr_case(data, group_size, 1, hidden, users=OltrUsers(click_model="navigational", lr=lr),
                          theta0=theta, seed=seed + 7,
                          manipulate=lambda X, m: sa_bypass_features(X, 0, D))


def sa_bypass_experiment(data, hidden, group_size: int, D: torch.Tensor, *, lr: float, max_iter: int,
                         generator: torch.Generator, seed: int = 0) -> dict:
    """RAIFLE Sec. 3.4.2 end to end: a group of ``group_size`` users (user 0 the target) trains one
    query from a shared global ranker on features manipulated by :func:`~fedlab.attacks.interaction_inference.oltr.sa_bypass_features`, sends
    its updates through secure aggregation (:mod:`fedlab.privacy.secure_aggregation`), and the server
    recovers the target's share (:func:`~fedlab.attacks.interaction_inference.oltr.sa_recover`) and attacks it on those coordinates.

    Returns ``{"err": max abs error of the recovered coordinates, "auc": the target's AUC,
    "num_recovered", "num_params", "case", "masked": what the users sent}``. ``generator`` draws the
    global ranker and the masks; the group is :func:`sa_bypass_case`'s.
    """
    case = sa_bypass_case(data, hidden, group_size, D, lr=lr, generator=generator, seed=seed)
    masked = sa.mask_updates(case.update.double(), generator=generator)
    recovered = sa_recover(sa.unmask_sum(masked), D, hidden).float()
    coords = first_layer_mask(D, hidden)
    err = (recovered[coords] - case.update[0, coords]).abs().max().item()
    auc = attack_oltr(case.subset([0]), recovered[None], coords=coords, budget=RaifleBudget(max_iter=max_iter),
                      seed=seed)
    return {"err": err, "auc": auc.item(), "num_recovered": int(coords.sum()), "num_params": coords.numel(),
            "case": case, "masked": masked}


@dataclass(frozen=True)
class LdpSweep:
    """The local DP of RAIFLE's LDP experiments on OLTR (Pham, Kulkarni & Houmansadr, Sec. 4.1.1 "With LDP",
    Figs. 6-7, Tables 4-5): the users' local Gaussian mechanism at each budget of the sweep, what the attacker
    knows of it, and the random baseline the K-S tests compare against. One settings object, so that a page shows
    the sweep in one line, ``LdpSweep(epsilons=(1.0, 10.0, 20.0, 100.0, 500.0), delta=1e-8, sensitivity=0.5)``.

    ``epsilons``
        the privacy budgets of one release swept (each finite and ``> 0``); default RAIFLE's 1, 10, 20, 100, 500.
    ``delta``
        in (0, 1); default ``1e-8``, RAIFLE's.
    ``sensitivity``
        the L2 sensitivity ``Delta_2`` (finite, ``> 0``): users clip to ``Delta_2 / 2``
        (:func:`fedlab.privacy.ldp.ldp_clip_norm`); default ``0.5``, RAIFLE's for OLTR.
    ``attacker_knows_clip``
        the server reproduces the users' clipping in its simulated update (default ``True``); ``False``: it
        ignores it.
    ``random_draws``
        uniform guesses per user of the random baseline (a whole number ``>= 1``); default 10.

    Raises ``ValueError`` naming the field for empty or bad ``epsilons``, a ``delta`` outside (0, 1), a
    ``sensitivity`` that is not finite and ``> 0``, an ``attacker_knows_clip`` that is not a bool or a
    ``random_draws`` below 1.
    """

    epsilons: tuple = (1.0, 10.0, 20.0, 100.0, 500.0)
    delta: float = 1e-8
    sensitivity: float = 0.5
    attacker_knows_clip: bool = True
    random_draws: int = 10

    def __post_init__(self):
        eps = tuple(self.epsilons)
        if not eps or any(isinstance(e, bool) or not (isinstance(e, (int, float)) and math.isfinite(e) and e > 0)
                          for e in eps):
            raise ValueError(f"LdpSweep.epsilons must be finite numbers > 0 (at least one), got {self.epsilons!r}")
        object.__setattr__(self, "epsilons", eps)
        if isinstance(self.delta, bool) or not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"LdpSweep.delta must be in (0, 1), got {self.delta!r}")
        v = self.sensitivity
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"LdpSweep.sensitivity must be a finite number > 0, got {v!r}")
        if not isinstance(self.attacker_knows_clip, bool):
            raise ValueError(f"LdpSweep.attacker_knows_clip must be True or False, got {self.attacker_knows_clip!r}")
        if isinstance(self.random_draws, bool) or not isinstance(self.random_draws, int) or self.random_draws < 1:
            raise ValueError(f"LdpSweep.random_draws must be an integer >= 1, got {self.random_draws!r}")


def ldp_sweep(data, hidden, configs, num_users: int, *, ldp: LdpSweep, lr: float, max_iter: int,
              click_model: str = "informational", rand_generator: torch.Generator, seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE Figs. 6-7 and Tables 4-5 for one ranker: RAIFLE against LDP updates.

    ``configs``: ``[(Q, [adm, ...]), ...]``. For each ``Q`` the same ``num_users`` users are simulated
    with and without ADM, every update is clipped and noised once per epsilon of ``ldp`` (:class:`LdpSweep`;
    :func:`fedlab.privacy.ldp.ldp_gaussian`), and all (ADM, epsilon) blocks are attacked in one batch
    with the clipping reproduced when ``ldp.attacker_knows_clip`` (one L-BFGS per user, so the blocks do not
    interact). The random baseline scores the *same* users' items ``ldp.random_draws`` times with uniform
    guesses (drawn from ``rand_generator``), so it has the spread of a real attack on those lists.

    Returns ``(auc, random_auc)``: ``auc[(Q, adm, epsilon)]`` [num_users] and
    ``random_auc[(Q, adm)]`` [num_users * random_draws].
    """
    return _ldp_sweeps(data, hidden, configs, num_users, {click_model: rand_generator}, ldp=ldp, lr=lr,
                       max_iter=max_iter, seed=seed)[click_model]


def _ldp_sweeps(data, hidden, configs, num_users: int, click_models: dict, *, ldp: LdpSweep, lr: float,
                max_iter: int, seed: int) -> dict:
    """:func:`ldp_sweep` for every click model of ``click_models`` (``{name: rand_generator}``), each
    ``Q`` of every click model in one batch: each click model's users keep the ids ``0..`` they have
    in their own sweep (so their random starts) and every user runs its own L-BFGS, so each click
    model's result is bit for bit :func:`ldp_sweep`'s (fewer, larger batches only save time).
    Returns ``{click model: (auc, random_auc)}``."""
    if not isinstance(ldp, LdpSweep):
        raise ValueError(f"ldp must be an LdpSweep, got {type(ldp).__name__}: {ldp!r}")
    epsilons, delta, sensitivity = list(ldp.epsilons), ldp.delta, ldp.sensitivity
    attacker_knows_clip, random_draws = ldp.attacker_knows_clip, ldp.random_draws
    out = {c: ({}, {}) for c in click_models}
    for Q, adms in configs:
        runs = []                                              # (click model, bases, case, noisy updates)
        for click_model in click_models:
            bases = [make_oltr_case(data, num_users, Q, hidden, users=OltrUsers(click_model=click_model, lr=lr), adm=a,
                                    seed=seed + 300 + Q) for a in adms]
            gen = torch.Generator().manual_seed(seed)
            case = cat_cases([b for b in bases for _ in epsilons])
            # RAIFLE's float mechanism (the paper's setting); not private on its float output, see chapter 5
            noisy = torch.cat([ldp_gaussian(b.update, e, delta, sensitivity, generator=gen, safe=False)
                               for b in bases for e in epsilons])
            runs.append((click_model, bases, case, noisy))
        auc_all = attack_oltr(cat_cases([r[2] for r in runs]), torch.cat([r[3] for r in runs]),
                              clip_norm=ldp_clip_norm(sensitivity) if attacker_knows_clip else None,
                              budget=RaifleBudget(max_iter=max_iter), seed=seed,
                              user_ids=torch.cat([torch.arange(len(r[2])) for r in runs]))
        start = 0
        for click_model, bases, case, _ in runs:
            auc = auc_all[start:start + len(case)].reshape(len(adms), len(epsilons), num_users)
            start += len(case)
            auc_out, random_out = out[click_model]
            for j, (adm, base) in enumerate(zip(adms, bases)):
                for i, e in enumerate(epsilons):
                    auc_out[(Q, adm, e)] = auc[j, i]
                I = base.I.reshape(num_users, -1).repeat(random_draws, 1)
                m = base.mask.reshape(num_users, -1).repeat(random_draws, 1)
                random_out[(Q, adm)] = roc_auc_rows(I, torch.rand(I.shape, generator=click_models[click_model]), m)
    return out


# ---------------------------------------------------------------------------------------------------
# The protocol and Fig. 5 (RAIFLE Sec. 4.2.1-4.2.2)
# ---------------------------------------------------------------------------------------------------

def _rankers(rankers) -> dict:
    if not isinstance(rankers, dict) or not rankers:
        raise ValueError(f"rankers must be a non-empty dict {{name: hidden sizes}}, got {rankers!r}")
    return rankers


def click_model_rows(grades=(3, 5), click_models=("navigational", "informational")) -> list[list]:
    """Rows ``[grades, click model, click probabilities by grade, stop probabilities by grade]`` of the
    cascade click models (RAIFLE Sec. 4.1.2, :func:`fedlab.fl.oltr.click_probabilities`)."""
    rows = []
    for G in grades:
        for name in click_models:
            pc, ps = click_probabilities(name, G)
            rows.append([G, name, " / ".join(f"{p:g}" for p in pc.tolist()), " / ".join(f"{p:g}" for p in ps.tolist())])
    return rows


def fig5_grid(data, rankers: dict, queries, click_models, num_users: int, *, lr: float, max_iter: int,
              seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE Fig. 5 for every ranker: :func:`adm_query_sweep` per ranker. Returns ``(auc, cases)``
    keyed ``(ranker, Q, click_model, adm)``: [num_users] AUC tensors and the simulated cases."""
    auc_out, cases_out = {}, {}
    for model, hidden in _rankers(rankers).items():
        auc, cases = adm_query_sweep(data, hidden, queries, click_models, num_users, lr=lr, max_iter=max_iter,
                                     seed=seed)
        auc_out.update({(model, *k): v for k, v in auc.items()})
        cases_out.update({(model, *k): v for k, v in cases.items()})
    return auc_out, cases_out


def fig5_cases(data, rankers: dict, queries, click_models, num_users: int, *, lr: float, seed: int = 0) -> dict:
    """The users of :func:`fig5_grid`, not attacked: ``{(ranker, Q, click_model, adm): OltrCase}``, the cases
    ``fig5_grid`` returns for the same arguments (:func:`adm_query_cases` per ranker)."""
    return {(model, *k): v for model, hidden in _rankers(rankers).items()
            for k, v in adm_query_cases(data, hidden, queries, click_models, num_users, lr=lr, seed=seed).items()}


def fig5_plot(fig5: dict, rankers, queries, click_models):
    """RAIFLE Fig. 5: mean AUC against queries per user, one panel per ranker, with and without ADM
    for each click model; error bars span one standard deviation over users, as in the paper.
    Returns the axes."""
    from ..plots import plt

    queries = list(queries)
    _, axs = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, model in zip(axs, rankers):
        for c, ls, dx in zip(click_models, ["-", "--"], [-0.15, 0.15]):
            for adm, mk, col in [(False, "o", "C0"), (True, "s", "C1")]:
                qs = queries[1:] if adm else queries
                ax.errorbar([q + dx for q in qs], [fig5[(model, q, c, adm)].mean() for q in qs],
                            yerr=[fig5[(model, q, c, adm)].std() for q in qs], fmt=mk + ls, color=col, capsize=2,
                            label=f"{c[:3]}, {'ADM' if adm else 'no ADM'}")
        ax.axhline(0.5, color="gray", ls=":")
        ax.set(title=f"{model} ranker", xlabel="queries per user", xticks=queries)
    axs[0].set_ylabel("mean attack AUC")
    axs[1].legend(fontsize=8)
    return axs


def fig5_mean(fig5: dict, model: str, Q: int, adm: bool, click_models) -> float:
    """Mean AUC of ranker ``model`` at ``Q`` queries (with ADM or not) over the users of every click
    model together."""
    return float(torch.cat([fig5[(model, Q, c, adm)] for c in click_models]).mean())


def fig5_summary(fig5: dict, rankers, click_models) -> dict:
    """The numbers the chapter quotes from Fig. 5 (mean over both click models, unrounded):
    ``single`` (one query, the lower of the rankers), ``lin16`` / ``lin16_adm`` (linear ranker, 16
    queries, without / with ADM) and ``nn16`` / ``nn16_adm`` (neural ranker)."""
    return {"single": min(fig5_mean(fig5, m, 1, False, click_models) for m in rankers),
            "lin16": fig5_mean(fig5, "linear", 16, False, click_models),
            "lin16_adm": fig5_mean(fig5, "linear", 16, True, click_models),
            "nn16": fig5_mean(fig5, "neural", 16, False, click_models),
            "nn16_adm": fig5_mean(fig5, "neural", 16, True, click_models)}


#: RAIFLE Sec. 4.2.1-4.2.2 (the text describing Fig. 5, MSLR-WEB10K): approximate values
PAPER_FIG5 = {("linear", 1, False): "≳ 0.9", ("neural", 1, False): "≳ 0.9",
              ("linear", 16, False): "0.6-0.7", ("linear", 16, True): "≈ 0.75",
              ("neural", 16, False): "≈ 0.5", ("neural", 16, True): "0.6-0.75"}

#: the glued name of each row of :data:`PAPER_FIG5` (its paper-scale column comes from the record)
FIG5_NAMES = {("linear", 1, False): "ch3c_fig5_single", ("neural", 1, False): "ch3c_fig5_single",
              ("linear", 16, False): "ch3c_fig5_lin16", ("linear", 16, True): "ch3c_fig5_lin16_adm",
              ("neural", 16, False): "ch3c_fig5_nn16", ("neural", 16, True): "ch3c_fig5_nn16_adm"}


def fig5_table(fig5: dict, click_models, run) -> tuple[list, list]:
    """``(headers, rows)`` of "paper vs ours" for Fig. 5: :data:`PAPER_FIG5`, our mean AUC (3 decimals)
    and the stored paper-scale record (``run.stored``, ``run`` a :class:`fedlab.records.Run`)."""
    headers = ["ranker", "queries", "ADM", "paper AUC", "our AUC",
               "ours, paper scale (mean [95 % CI]; 1 query: lower ranker)"]
    rows = [[m, Q, "yes" if a else "no", p, round(fig5_mean(fig5, m, Q, a, click_models), 3),
             run.stored(FIG5_NAMES[(m, Q, a)], value_range=(0, 1))] for (m, Q, a), p in PAPER_FIG5.items()]
    return headers, rows


def adm_gain(fig5: dict, queries, click_models, model: str = "neural") -> tuple[torch.Tensor, torch.Tensor]:
    """``(no_adm, adm)``: the mean AUC of ranker ``model`` for every ``(Q, click model)`` with
    ``Q > 1`` (the first entry of ``queries`` is the single query, which ADM does not apply to)."""
    queries = list(queries)
    noadm = torch.stack([fig5[(model, Q, c, False)].mean() for Q in queries[1:] for c in click_models])
    withadm = torch.stack([fig5[(model, Q, c, True)].mean() for Q in queries[1:] for c in click_models])
    return noadm, withadm


# ---------------------------------------------------------------------------------------------------
# Settings the paper leaves open, against the paper's code (RAIFLE Sec. 4.1, the reference code)
# ---------------------------------------------------------------------------------------------------

#: the settings the chapter compares at 16 queries: key -> keywords of
#: :func:`~fedlab.attacks.interaction_inference.oltr.make_oltr_case` (``known_order`` goes to the
#: attack). ``before`` is what a first implementation is likely to choose (the key keeps its record
#: name); ``eta``, ``init`` and ``order`` change one
#: thing each towards the paper's (eta = 0.1, U(-1, 1) initialisation, users training in an order
#: of their own); ``paper`` is the paper's (the Fig. 5 grid's); the last two add to it the order
#: (an oracle) or the reference code's first-layer weight blocks (:func:`~fedlab.attacks.
#: interaction_inference.oltr.adm_weight_blocks`, networks with ADM only).
SETTINGS = {
    "before": dict(lr=1.0, init="fan_in", shuffle_queries=False),
    "eta": dict(lr=0.1, init="fan_in", shuffle_queries=False),
    "init": dict(lr=1.0, init="uniform", shuffle_queries=False),
    "order": dict(lr=1.0, init="fan_in", shuffle_queries=True),
    "paper": dict(lr=0.1, init="uniform", shuffle_queries=True),
    "known_order": dict(lr=0.1, init="uniform", shuffle_queries=True, known_order=True),
    "weight_blocks": dict(lr=0.1, init="uniform", shuffle_queries=True, adm_weights=True),
}

#: the label of each of :data:`SETTINGS` in the chapter's table
SETTING_LABELS = {
    "before": "a first choice: η = 1, fan-in init, display order",
    "eta": "η = 0.1 only", "init": "U(-1, 1) init only", "order": "own order only",
    "paper": "paper's: η = 0.1, U(-1, 1) init, own order",
    "known_order": "paper's, order told to the server",
    "weight_blocks": "paper's + reference's weight blocks"}


def settings_grid(data, rankers: dict, settings: dict, num_queries: int, click_models, num_users: int, *,
                  max_iter: int, seed: int = 0) -> tuple[dict, dict]:
    """Fig. 5 at ``num_queries`` queries under other settings of the simulation (RAIFLE Sec. 4.1
    against the reference code): for every ``{key: keywords}`` of ``settings`` (fields of the simulated
    users, :class:`fedlab.fl.oltr.OltrUsers`, plus ``adm_weights`` for :class:`~fedlab.attacks.
    interaction_inference.oltr.Adm`'s ``weights`` and ``known_order`` for
    :func:`~fedlab.attacks.interaction_inference.oltr.attack_oltr`), every ranker, click model and
    ADM or not, ``num_users`` users are simulated with the seeds :func:`adm_query_sweep` uses (so
    settings that share ``lr`` and ``init`` share users, lists and clicks) and attacked. The
    settings of one ranker that share ``lr`` are attacked in one batch (``known_order`` per user), each
    setting's users with the ids ``0..`` it would have alone: one L-BFGS per user with per-user
    random starts, so every user's result is bit for bit the one of a batch per setting (fewer,
    larger batches only save time). A setting with ``adm_weights`` runs only for networks, only with
    ADM.

    Returns ``(auc, cases)``: ``auc[(key, ranker, adm)]`` [num_users * len(click_models)] and
    ``cases[(key, ranker, adm)]`` the simulated cases (one per click model). Raises ``ValueError``
    for empty ``settings`` or keywords other than ``lr``, ``init``, ``shuffle_queries``,
    ``adm_weights``, ``known_order``.
    """
    allowed = {"lr", "init", "shuffle_queries", "adm_weights", "known_order"}
    if not settings or any(set(kw) - allowed for kw in settings.values()):
        raise ValueError(f"settings must be a non-empty dict of {{key: keywords in {sorted(allowed)}}}, got {settings!r}")
    click_models = list(click_models)
    out, out_cases = {}, {}
    for model, hidden in _rankers(rankers).items():
        batches = {}                                   # lr -> [(key, known_order, adms, cfgs, cases)]
        for name, kw in settings.items():
            kw = dict(kw)
            known = kw.pop("known_order", False)
            weights = kw.pop("adm_weights", False)
            if weights and not hidden:
                continue
            adms = [True] if weights else [False, True]
            cfgs = [(c, a) for a in adms for c in click_models]
            cases = [make_oltr_case(data, num_users, num_queries, hidden, users=OltrUsers(click_model=c, **kw),
                                    adm=Adm(weights=weights) if a else False, group=g,
                                    seed=seed + 1000 * num_queries + 10 * click_models.index(c) + len(hidden))
                     for g, (c, a) in enumerate(cfgs)]
            batches.setdefault(kw.get("lr", 0.1), []).append((name, known, adms, cfgs, cases))
        for jobs in batches.values():
            merged = [cat_cases(cases) for *_, cases in jobs]
            ids = torch.cat([torch.arange(len(c)) for c in merged])
            told = torch.cat([torch.full((len(c),), known) for (_, known, *_), c in zip(jobs, merged)])
            auc_all = attack_oltr(cat_cases(merged), known_order=told, budget=RaifleBudget(max_iter=max_iter), seed=seed,
                                  user_ids=ids)
            start = 0
            for (name, _, adms, cfgs, cases), case in zip(jobs, merged):
                auc = auc_all[start:start + len(case)]
                start += len(case)
                for a in adms:
                    groups = [g for g, (_, aa) in enumerate(cfgs) if aa == a]
                    out[(name, model, a)] = torch.cat([auc[case.group == g] for g in groups])
                    out_cases[(name, model, a)] = [cases[g] for g in groups]
    out = {(name, model, a): out[(name, model, a)] for name in settings for model in _rankers(rankers)
           for a in (False, True) if (name, model, a) in out}
    out_cases = {k: out_cases[k] for k in out}
    return out, out_cases


def update_drift(cases) -> torch.Tensor:
    """How far each user's ranker moved within its round, as the attack sees it:
    ``||update - lr sum_q g_q(theta0)|| / ||update||`` with ``g_q`` the FPDGD gradient of query ``q``
    at the starting ranker (:func:`fedlab.fl.oltr.pdgd_gradient`). 0 when every query is trained on
    the same ranker (the update is then a sum of per-query terms); large when each step changes the
    ranker the next query is trained on, which couples the queries. ``cases``: OltrCase objects ->
    ``[sum of U]``. Raises ``ValueError`` for empty ``cases``."""
    cases = list(cases)
    if not cases:
        raise ValueError("cases must not be empty")
    out = []
    for c in cases:
        with torch.no_grad():
            lin = sum(pdgd_gradient(c.theta0, c.X[:, q], c.I[:, q], c.mask[:, q], c.hidden)
                      for q in range(c.X.shape[1])) * c.lr
        out.append((c.update - lin).norm(dim=1) / c.update.norm(dim=1).clamp_min(1e-30))
    return torch.cat(out)


def order_mismatch(cases) -> torch.Tensor:
    """The floor of the attack's loss when the server does not know the user's order:
    ``||update - g(X, theta0, I)|| / ||update||`` with ``g`` the local training on the *true*
    clicks in display order (:func:`fedlab.fl.oltr.local_update`); 0 when the user trained in
    display order. ``cases``: OltrCase objects -> ``[sum of U]``. Raises ``ValueError`` for empty
    ``cases``."""
    cases = list(cases)
    if not cases:
        raise ValueError("cases must not be empty")
    out = []
    for c in cases:
        with torch.no_grad():
            sim = local_update(c.theta0, c.X, c.I, c.mask, c.hidden, lr=c.lr)
        out.append((c.update - sim).norm(dim=1) / c.update.norm(dim=1).clamp_min(1e-30))
    return torch.cat(out)


#: the reference code's attack budget in loss evaluations: ``torch.optim.LBFGS(max_iter=1000)`` stops after 1000
#: iterations or ``max_eval = max_iter * 5 // 4 = 1250`` evaluations of the loss, whichever comes first
REFERENCE_BUDGET = 1000 * 5 // 4


def budget_check(case, budgets, *, seed: int = 0, known_order: bool = False) -> dict:
    """Did the attack reach its optimum, and does the reference code's budget change the answer? RAIFLE
    (:func:`~fedlab.attacks.interaction_inference.oltr.raifle_oltr`) on every user of ``case`` once per
    loss-evaluation budget of ``budgets`` (e.g. ours and :data:`REFERENCE_BUDGET`), from the same random
    starts (the same user ids), with the loss at the true clicks beside the loss reached: a loss reached
    below the truth's means the server's objective has a better answer than the truth (its simulation, in
    display order, is not the user's training), which no budget changes. Returns ``{budget: {"auc": [U],
    "loss": [U], "loss_truth": [U], "evaluations": int}}`` (``evaluations``: loss evaluations the batch used,
    at most the budget: fewer when every user's L-BFGS stopped on its own). ``known_order=True``: the server is
    told the order each user trained in (:func:`~fedlab.attacks.interaction_inference.oltr.raifle_oltr`'s oracle),
    so that its simulation is the user's training and the loss at the truth is 0 up to rounding. Raises
    ``ValueError`` for empty ``budgets`` or a budget that is not an integer >= 1."""
    budgets = list(budgets)
    if not budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in budgets):
        raise ValueError(f"budgets must be a non-empty list of integers >= 1, got {budgets!r}")
    U = len(case)
    truth = (case.I.reshape(U, -1).to(case.update.dtype), None)
    out = {}
    for b in budgets:
        res = raifle_oltr(case, budget=RaifleBudget(max_iter=b), seed=seed, truth=truth, known_order=bool(known_order))
        out[b] = {"auc": roc_auc_rows(case.I.reshape(U, -1), res.scores, case.mask.reshape(U, -1)),
                  "loss": res.loss, "loss_truth": res.loss_truth, "evaluations": int(res.iterations)}
    return out


def budget_table(check: dict) -> tuple[list, list]:
    """``(headers, rows)`` of :func:`budget_check`'s result: per budget the loss evaluations used, the mean AUC,
    the median loss reached and at the true clicks, and the largest ratio of the two over the users."""
    rows = []
    for b, r in check.items():
        ratio = float((r["loss"] / r["loss_truth"].clamp_min(1e-300)).max())
        rows.append([b, r["evaluations"], round(float(r["auc"].mean()), 3), f"{float(r['loss'].median()):.3g}",
                     f"{float(r['loss_truth'].median()):.3g}", f"{ratio:.2f}"])
    return (["budget (loss evaluations)", "used", "mean AUC", "loss reached (median)", "loss at the true clicks (median)",
             "largest ratio reached / truth"], rows)


def settings_table(grid: dict, cases: dict, rankers, num_queries: int) -> tuple[list, list]:
    """``(headers, rows)``: for every setting of :func:`settings_grid` (labels from
    :data:`SETTING_LABELS`), the mean AUC (3 decimals) of every ranker without and with ADM, and for
    the network (the last of ``rankers``) with ADM the median :func:`update_drift` and
    :func:`order_mismatch` ("told" for a setting of :data:`SETTINGS` whose server is told the order);
    the paper's values (:data:`PAPER_FIG5`) in the last row."""
    rankers = list(rankers)
    cols = [(m, a) for m in rankers for a in (False, True)]
    net = rankers[-1]
    fmt = lambda v: "—" if v is None else round(float(v), 3)
    rows = []
    for key in dict.fromkeys(k[0] for k in grid):
        c = cases[(key, net, True)]
        told = SETTINGS.get(key, {}).get("known_order", False)
        rows.append([SETTING_LABELS.get(key, key)]
                    + [fmt(grid[(key, m, a)].mean() if (key, m, a) in grid else None) for m, a in cols]
                    + [fmt(update_drift(c).median()), "told" if told else fmt(order_mismatch(c).median())])
    rows.append(["RAIFLE paper (MSLR-WEB10K, Sec. 4.2)"] + [PAPER_FIG5.get((m, num_queries, a), "—") for m, a in cols]
                + ["—", "—"])
    return (["setting"] + [f"{m}{', ADM' if a else ''}" for m, a in cols]
            + [f"{net}, ADM: drift (median)", "order mismatch (median)"], rows)


def settings_values(grid: dict, cases: dict, rankers) -> dict:
    """The glued numbers of :func:`settings_grid` (unrounded): ``ch3c_set_<key>_<ranker>[_adm]`` the
    mean AUCs and, for the network (last of ``rankers``) with ADM, ``ch3c_drift_<key>`` and
    ``ch3c_mismatch_<key>``, the medians of :func:`update_drift` and :func:`order_mismatch`."""
    rankers = list(rankers)
    out = {f"ch3c_set_{k}_{m}{'_adm' if a else ''}": v.mean().item() for (k, m, a), v in grid.items()}
    for k in dict.fromkeys(k[0] for k in grid):
        out[f"ch3c_drift_{k}"] = update_drift(cases[(k, rankers[-1], True)]).median().item()
        out[f"ch3c_mismatch_{k}"] = order_mismatch(cases[(k, rankers[-1], True)]).median().item()
    return out


# ---------------------------------------------------------------------------------------------------
# Noisy ADM (App. C.5, Fig. 11)
# ---------------------------------------------------------------------------------------------------

def noisy_adm_grid(data, rankers: dict, noise_stds, num_users: int, num_queries: int, *, lr: float,
                   max_iter: int, click_model: str = "informational", seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE App. C.5 (Fig. 11) for every ranker: :func:`noisy_adm_sweep` per ranker (clicks by
    ``click_model``). Returns
    ``(mean_auc, cases)`` keyed ``(ranker, std)`` (std ``None``: the same users without ADM): the mean
    AUC over users as a float, and the simulated cases."""
    noisy, noisy_cases = {}, {}
    for model, hidden in _rankers(rankers).items():
        auc, cases = noisy_adm_sweep(data, hidden, noise_stds, num_users, num_queries, click_model=click_model,
                                     lr=lr, max_iter=max_iter, seed=seed)
        noisy.update({(model, s): a.mean().item() for s, a in auc.items()})
        noisy_cases.update({(model, s): c for s, c in cases.items()})
    return noisy, noisy_cases


def noisy_adm_cases(data, rankers: dict, noise_stds, num_users: int, num_queries: int, *, lr: float,
                    click_model: str = "informational", seed: int = 0) -> dict:
    """The users of :func:`noisy_adm_grid`, not attacked: ``{(ranker, std): OltrCase}`` (std ``None``: the same
    users without ADM), the cases ``noisy_adm_grid`` returns for the same arguments."""
    return {(model, s): c for model, hidden in _rankers(rankers).items()
            for s, c in _noisy_cases(data, hidden, noise_stds, num_users, num_queries, click_model=click_model,
                                     lr=lr, seed=seed).items()}


def noisy_adm_plot(noisy: dict, rankers, noise_stds, num_queries: int):
    """RAIFLE Fig. 11: mean AUC against the ADM noise std (0 plotted at 1e-5), one curve per ranker,
    with the same users without ADM as a dashed line. Returns the axes."""
    from ..plots import plt

    _, ax = plt.subplots(figsize=(6, 3.2))
    for i, m in enumerate(rankers):
        ax.plot([max(s, 1e-5) for s in noise_stds], [noisy[(m, s)] for s in noise_stds], "o-", color=f"C{i}",
                label=f"{m}, ADM")
        ax.axhline(noisy[(m, None)], color=f"C{i}", ls="--", label=f"{m}, no ADM (same users)")
    ax.set(xscale="log", xlabel="ADM noise std (0 plotted at 1e-5)", ylabel="mean attack AUC", ylim=(0.4, 1.02),
           title=f"Noisy ADM, {num_queries} queries, informational (cf. RAIFLE Fig. 11)")
    ax.legend(fontsize=8, loc="lower right")
    return ax


#: RAIFLE App. C.5 (the text describing Fig. 11, MSLR-WEB10K, no LDP), relative to std 0
PAPER_FIG11 = {1e-4: "≈ as std 0", 1e-3: "≈ as std 0", 1e-2: "linear near 1; neural +0.1-0.5",
               1e-1: "linear near 1; neural +0.1-0.5"}


def noisy_name(model: str, std: float) -> str:
    """The glued name of ranker ``model`` at ADM noise ``std``: ``ch3c_noisy_linear_std0p01``, ..."""
    return f"ch3c_noisy_{model}_std{std:g}".replace(".", "p")


def noisy_values(noisy: dict, noise_stds) -> dict:
    """The glued numbers of Fig. 11 (unrounded): :func:`noisy_name` for every ranker and std;
    ``ch3c_noisy_<lin|nn>`` at std 0.1, ``..z`` at std 0 (exact zeros), ``..0`` without ADM; and
    ``ch3c_noisy_worst_drop``, the largest fall of noisy ADM below exact-zero ADM. ``noisy`` from
    :func:`noisy_adm_grid` with the rankers ``"linear"`` and ``"neural"``; ``noise_stds`` must start
    with 0 and contain 0.1. Raises ``ValueError`` otherwise."""
    noise_stds = list(noise_stds)
    if not noise_stds or noise_stds[0] != 0.0 or 0.1 not in noise_stds:
        raise ValueError(f"noise_stds must start with 0 and contain 0.1, got {noise_stds}")
    models = list(dict.fromkeys(m for m, _ in noisy))
    out = {noisy_name(m, s): noisy[(m, s)] for s in noise_stds for m in models}
    for short, m in [("lin", "linear"), ("nn", "neural")]:
        out[f"ch3c_noisy_{short}"] = noisy[(m, 0.1)]
        out[f"ch3c_noisy_{short}z"] = noisy[(m, 0.0)]
        out[f"ch3c_noisy_{short}0"] = noisy[(m, None)]
    out["ch3c_noisy_worst_drop"] = max(noisy[(m, 0.0)] - noisy[(m, s)] for m in models for s in noise_stds[1:])
    return out


def noisy_table(noisy: dict, rankers, noise_stds, run) -> tuple[list, list]:
    """``(headers, rows)`` of "paper vs ours" for Fig. 11: :data:`PAPER_FIG11`, our mean AUC per ranker
    (3 decimals) and the stored paper-scale record (``run.stored``)."""
    rows = [[f"{s:g}" + (" (exact zeros)" if s == 0 else ""), PAPER_FIG11.get(s, "reference")]
            + [round(noisy[(m, s)], 3) for m in rankers] + [run.stored(noisy_name(m, s), value_range=(0, 1)) for m in rankers]
            for s in noise_stds]
    headers = ["noise std", "paper (vs std 0)", "our linear", "our neural", "linear, paper scale (mean [95 % CI])",
               "neural, paper scale"]
    return headers, rows


def noise_replacement_grid(data, rankers: dict, fractions, num_users: int, num_queries: int, *, lr: float,
                           max_iter: int, click_model: str = "informational", std: float = 0.1,
                           seed: int = 0) -> dict:
    """The reference code's final ADM (:func:`~fedlab.attacks.interaction_inference.oltr.adm_noise_replacement`:
    a fraction of each list's features replaced by server-known ``N(0, std^2)`` noise) for every ranker and
    every fraction in ``fractions``, on the same users as :func:`noisy_adm_grid` with the same ``seed`` (same
    lists and clicks: only the manipulation differs). Returns ``(mean_auc, cases)``, both keyed
    ``(ranker, fraction)``: the mean AUC over users as a float, and the simulated cases."""

    from ..attacks.interaction_inference.oltr import adm_noise_replacement

    fractions = [float(f) for f in fractions]
    if not fractions:
        raise ValueError("fractions must not be empty")
    out, out_cases = {}, {}
    for model, hidden in _rankers(rankers).items():
        cases = []
        for g, f in enumerate(fractions):
            manip = partial(adm_noise_replacement, fraction=f, std=std,
                            generator=torch.Generator().manual_seed(seed + 51 + g))
            cases.append(make_oltr_case(data, num_users, num_queries, hidden,
                                        users=OltrUsers(click_model=click_model, lr=lr), manipulate=manip, group=g,
                                        seed=seed + 50))
        case = cat_cases(cases)
        auc = attack_oltr(case, budget=RaifleBudget(max_iter=max_iter), seed=seed)
        out.update({(model, f): auc[case.group == g].mean().item() for g, f in enumerate(fractions)})
        out_cases.update({(model, f): c for f, c in zip(fractions, cases)})
    return out, out_cases


# ---------------------------------------------------------------------------------------------------
# PIR bypass (Sec. 3.4.3)
# ---------------------------------------------------------------------------------------------------

def pir_experiment(data, num_users: int, hidden=(), *, users: OltrUsers, pool_size: int = 20,
                   feature: int = 0, ldp: LdpGaussian | None = None, tol: float = 0.0, seed: int = 0) -> dict:
    """The PIR bypass of RAIFLE Sec. 3.4.3, end to end, for ``num_users`` users.

    Each user holds a pool of ``pool_size`` documents of one query (known to the server) and
    privately retrieves ``users.k`` of them (unknown to the server; the item of interest, pool position 0,
    is retrieved by every other user); it ranks them with the shared global ranker (drawn with ``users.init``),
    clicks by ``users.click_model``, trains with step ``users.lr`` (:class:`fedlab.fl.oltr.OltrUsers`) and
    sends its FPDGD update, optionally with LDP (``ldp``, :class:`fedlab.privacy.ldp.LdpGaussian`: the local
    Gaussian mechanism, :func:`fedlab.privacy.ldp.ldp_gaussian`). The server fingerprinted the item of
    interest with ``feature`` (:func:`pir_fingerprint`) and runs :func:`pir_detect` with ``tol``.
    Returns ``{"included": [U] bool, "detected": [U] bool, "detected_exact": [U] bool}``;
    ``detected_exact``: the same detection on the same users' updates computed in float64 and without
    noise. A document far below the only click gets a tiny PDGD weight ``rho * c`` (1e-7 in a case
    we checked), and a float32 client adding ``lr * rho * c`` to a weight near 0.5 rounds the move
    away; float64 keeps it. Raises ``ValueError`` if ``k >= pool_size``, no query has ``pool_size`` documents, or
    ``users`` or ``ldp`` is of the wrong type.
    """
    if not isinstance(users, OltrUsers) or not (ldp is None or isinstance(ldp, LdpGaussian)):
        raise ValueError(f"users must be an OltrUsers and ldp None or an LdpGaussian, got {type(users).__name__}, "
                         f"{type(ldp).__name__}")
    k, click_model, lr = users.k, users.click_model, users.lr
    if not 2 <= k < pool_size:
        raise ValueError(f"need 2 <= k < pool_size, got k={k}, pool_size={pool_size}")
    big = torch.nonzero(data.mask.sum(1) >= pool_size).flatten()
    if len(big) == 0:
        raise ValueError(f"pool_size: no query has {pool_size} documents")
    gen = torch.Generator().manual_seed(seed)
    q = big[torch.randint(len(big), (num_users,), generator=gen)]
    order = torch.rand(num_users, int(data.mask.shape[1]), generator=gen).masked_fill(~data.mask[q], 2.0)
    pool = order.argsort(1)[:, :pool_size]                                            # [U, pool]
    Xp = data.X[q[:, None], pool]
    relp = data.relevance[q[:, None], pool]
    maskp = torch.ones(num_users, pool_size, dtype=torch.bool)
    Xp = pir_fingerprint(Xp, maskp, torch.zeros(num_users, dtype=torch.long), feature)
    included = torch.arange(num_users) % 2 == 0
    # retrieved subset: k pool positions, position 0 forced in or out
    keys = torch.rand(num_users, pool_size, generator=gen)
    keys[:, 0] = torch.where(included, -1.0, 2.0)
    chosen = keys.argsort(1)[:, :k]
    theta = init_rankers(1, data.num_features, hidden, init=users.init, generator=gen).expand(num_users, -1)
    idx, shown = present(theta, Xp.gather(1, chosen[..., None].expand(-1, -1, Xp.shape[-1])),
                         torch.ones(num_users, k, dtype=torch.bool), hidden, k=k, generator=gen)
    docs = chosen.gather(1, idx)
    X = Xp[torch.arange(num_users)[:, None], docs]
    rel = relp[torch.arange(num_users)[:, None], docs]
    clicks = simulate_clicks(rel, shown, click_model, num_grades=data.num_grades, generator=gen)
    with torch.no_grad():
        update = local_update(theta, X[:, None], clicks[:, None], shown[:, None], hidden, lr=lr)
        exact = local_update(theta.double(), X.double()[:, None], clicks.double()[:, None], shown[:, None], hidden,
                             lr=lr)
    if ldp is not None:
        # RAIFLE's float mechanism (the paper's setting); not private on its float output, see chapter 5
        update = ldp_gaussian(update, ldp.epsilon, ldp.delta, ldp.sensitivity, generator=gen, safe=False)
    return {"included": included, "detected": pir_detect(update, feature, data.num_features, hidden, tol=tol),
            "detected_exact": pir_detect(exact, feature, data.num_features, hidden)}


def pir_grid(data, rankers: dict, num_users: int, *, epsilons=(None, 100.0), delta: float = 1e-8,
             sensitivity: float = 0.5, lr: float, seed: int = 0) -> dict:
    """RAIFLE Sec. 3.4.3 for every ranker and LDP budget (``None``: no noise):
    :func:`pir_experiment` with ``num_users`` users (navigational clicks), detecting with
    threshold 0 without noise and 3 noise standard deviations (of the user's Gaussian mechanism,
    ``delta``, ``sensitivity``) under LDP. Returns ``{(ranker, epsilon): (true-positive rate,
    false-positive rate, true-positive rate of the float64 noiseless updates)}`` (see
    :func:`pir_experiment`'s ``detected_exact``)."""
    pir = {}
    for model, hidden in _rankers(rankers).items():
        for eps in epsilons:
            tol = 0.0 if eps is None else 3 * gaussian_sigma(eps, delta, sensitivity)
            r = pir_experiment(data, num_users, hidden, users=OltrUsers(click_model="navigational", lr=lr),
                               ldp=None if eps is None else LdpGaussian(eps, delta, sensitivity), tol=tol, seed=seed)
            tpr = r["detected"][r["included"]].float().mean().item()
            fpr = r["detected"][~r["included"]].float().mean().item()
            tpr_exact = r["detected_exact"][r["included"]].float().mean().item()
            pir[(model, eps)] = (tpr, fpr, tpr_exact)
    return pir


# ---------------------------------------------------------------------------------------------------
# LDP: attack (Figs. 6-7, Tables 4-5) and utility (App. C.6, Table 8)
# ---------------------------------------------------------------------------------------------------

def ldp_grid(data, rankers: dict, configs, num_users: int, *, ldp: LdpSweep, lr: float, max_iter: int,
             rand_generator: torch.Generator, click_model: str = "informational", seed: int = 0) -> tuple[dict, dict]:
    """RAIFLE Figs. 6-7 and Tables 4-5 for every ranker: :func:`ldp_sweep` per ranker (one
    ``rand_generator`` shared, in ranker order; clicks by ``click_model``; ``ldp`` an :class:`LdpSweep`).
    Returns ``(auc, random_auc)`` keyed ``(ranker, Q, adm, epsilon)`` and ``(ranker, Q, adm)``."""
    return ldp_grids(data, rankers, configs, num_users, click_models={click_model: rand_generator}, ldp=ldp, lr=lr,
                     max_iter=max_iter, seed=seed)[click_model]


def ldp_grids(data, rankers: dict, configs, num_users: int, *, click_models: dict, ldp: LdpSweep, lr: float,
              max_iter: int, seed: int = 0) -> dict:
    """:func:`ldp_grid` for several click models at once: ``click_models`` maps each click model to
    the ``rand_generator`` of its random baseline. Each click model's result is bit for bit that of
    its own :func:`ldp_grid` call; the click models only share the attack's batches (fewer, larger
    batches are faster). Returns ``{click model: (auc, random_auc)}``, keyed as :func:`ldp_grid`'s.
    Raises ``ValueError`` for an empty ``click_models`` or an ``ldp`` that is not an :class:`LdpSweep`."""
    if not click_models:
        raise ValueError("click_models must map at least one click model to its rand_generator")
    out = {c: ({}, {}) for c in click_models}
    for model, hidden in _rankers(rankers).items():
        res = _ldp_sweeps(data, hidden, configs, num_users, click_models, ldp=ldp, lr=lr, max_iter=max_iter, seed=seed)
        for c, (auc, rnd) in res.items():
            out[c][0].update({(model, *k): v for k, v in auc.items()})
            out[c][1].update({(model, *k): v for k, v in rnd.items()})
    return out


def ldp_plot(ldp_auc: dict, random_auc: dict, rankers, epsilons, num_queries: int):
    """RAIFLE Figs. 6 (linear) and 7 (neural): mean AUC against epsilon at one query and at
    ``num_queries`` queries with and without ADM, with the mean of every random baseline. Returns
    the axes."""
    from ..plots import plt

    _, axs = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, model in zip(axs, rankers):
        for (Q, adm), st in zip([(1, False), (num_queries, False), (num_queries, True)], ["o-", "s--", "^-"]):
            ax.plot(epsilons, [ldp_auc[(model, Q, adm, e)].mean() for e in epsilons], st,
                    label=f"{Q} q{', ADM' if adm else ''}")
        ax.axhline(torch.cat(list(random_auc.values())).mean(), color="gray", ls=":", label="random guess")
        ax.set(xscale="log", xlabel="ε (δ = 1e-8)",
               title=f"{model} (cf. RAIFLE Fig. {6 if model == 'linear' else 7})")
    axs[0].set_ylabel("mean attack AUC")
    axs[1].legend(fontsize=8)
    return axs


#: RAIFLE Tables 4 and 5 (MSLR-WEB10K, informational clicks): K-S p-values against random guessing at
#: epsilon = 1, 10, 20, 100, 500, keyed (ranker, queries, ADM)
PAPER_KS = {("linear", 1, False): [2.35e-02, 1.40e-62, 1.39e-171, 0.00e+00, 0.00e+00],
            ("linear", 4, False): [2.68e-05, 1.13e-52, 4.27e-91, 0.00e+00, 0.00e+00],
            ("linear", 8, False): [1.25e-03, 8.03e-28, 2.97e-46, 4.84e-143, 4.51e-229],
            ("linear", 12, False): [1.27e-01, 1.41e-13, 7.48e-25, 1.20e-81, 3.55e-122],
            ("linear", 16, False): [6.37e-02, 1.41e-11, 6.75e-17, 4.33e-36, 2.26e-76],
            ("linear", 4, True): [3.51e-01, 3.33e-30, 2.12e-55, 3.44e-297, 0.00e+00],
            ("linear", 8, True): [5.96e-02, 2.42e-13, 3.48e-30, 7.15e-120, 2.10e-255],
            ("linear", 12, True): [7.10e-01, 5.14e-08, 1.67e-19, 1.36e-73, 5.48e-160],
            ("linear", 16, True): [3.87e-01, 5.57e-06, 1.39e-08, 6.17e-43, 6.55e-112],
            ("neural", 1, False): [9.83e-01, 8.31e-01, 9.11e-04, 6.83e-128, 0.00e+00],
            ("neural", 4, False): [3.95e-01, 6.67e-01, 7.66e-01, 2.85e-04, 2.83e-02],
            ("neural", 8, False): [8.71e-01, 1.56e-01, 7.34e-02, 3.29e-02, 8.27e-01],
            ("neural", 12, False): [4.28e-01, 7.93e-01, 9.62e-01, 5.13e-01, 8.49e-01],
            ("neural", 16, False): [4.10e-01, 5.32e-01, 1.12e-01, 4.10e-01, 8.67e-01],
            ("neural", 4, True): [5.63e-03, 2.80e-01, 7.77e-01, 3.20e-10, 2.31e-79],
            ("neural", 8, True): [8.71e-01, 3.96e-01, 1.75e-01, 4.08e-08, 2.23e-38],
            ("neural", 12, True): [1.01e-01, 5.56e-01, 7.31e-01, 3.30e-04, 1.50e-20],
            ("neural", 16, True): [8.47e-01, 5.57e-01, 6.34e-01, 1.57e-01, 1.41e-11]}


def _check_paper_epsilons(epsilons, paper) -> None:
    if list(epsilons) != paper:
        raise ValueError(f"epsilons must be the paper's {paper} to sit beside its columns, got {list(epsilons)}")


#: the same for navigational clicks (RAIFLE Tables 4 and 5, rows "nav")
PAPER_KS_NAV = {("linear", 1, False): [2.46e-01, 9.29e-43, 3.01e-120, 0.00e+00, 0.00e+00],
                ("linear", 4, False): [2.62e-04, 2.70e-50, 5.22e-117, 0.00e+00, 0.00e+00],
                ("linear", 8, False): [1.72e-04, 2.03e-25, 4.13e-49, 1.01e-147, 4.48e-254],
                ("linear", 12, False): [1.36e-01, 4.42e-15, 8.22e-32, 9.28e-75, 1.75e-127],
                ("linear", 16, False): [9.33e-02, 3.41e-11, 1.39e-16, 2.89e-45, 4.32e-78],
                ("linear", 4, True): [4.41e-01, 1.46e-17, 4.23e-54, 8.64e-206, 0.00e+00],
                ("linear", 8, True): [2.28e-01, 9.90e-11, 1.56e-27, 5.50e-78, 7.08e-218],
                ("linear", 12, True): [5.17e-02, 2.71e-06, 3.28e-19, 8.62e-60, 1.44e-130],
                ("linear", 16, True): [3.44e-01, 5.83e-10, 1.32e-09, 2.52e-36, 3.55e-89],
                ("neural", 1, False): [8.04e-01, 1.38e-01, 6.02e-02, 8.66e-118, 0.00e+00],
                ("neural", 4, False): [9.80e-01, 4.30e-01, 3.30e-01, 4.06e-01, 2.99e-01],
                ("neural", 8, False): [7.80e-01, 7.12e-01, 3.96e-01, 4.45e-01, 3.96e-01],
                ("neural", 12, False): [9.32e-02, 9.62e-01, 6.23e-01, 5.64e-02, 6.89e-01],
                ("neural", 16, False): [8.86e-01, 6.34e-01, 1.02e-01, 9.36e-01, 4.34e-01],
                ("neural", 4, True): [8.83e-01, 3.16e-02, 9.53e-01, 6.22e-15, 1.50e-73],
                ("neural", 8, True): [5.32e-01, 7.12e-01, 1.09e-01, 4.15e-05, 1.88e-40],
                ("neural", 12, True): [8.67e-01, 4.70e-01, 3.50e-01, 8.60e-02, 3.68e-21],
                ("neural", 16, True): [3.87e-01, 6.84e-01, 3.87e-01, 3.47e-04, 2.53e-10]}


def _paper_ks(click_model: str) -> dict:
    tables = {"informational": PAPER_KS, "navigational": PAPER_KS_NAV}
    if click_model not in tables:
        raise ValueError(f"click_model must be one of {sorted(tables)}, got {click_model!r}")
    return tables[click_model]


def _ks_name(model: str, Q: int, adm: bool, eps: float, click_model: str = "informational") -> str:
    nav = "_nav" if click_model == "navigational" else ""
    return f"ch3c_ks_{model}_{Q}q{'_adm' if adm else ''}{nav}_eps{eps:g}"


def ks_pvalues(ldp_auc: dict, random_auc: dict, epsilons, *, click_model: str = "informational") -> dict:
    """Tables 4-5: for every row of the paper's table for ``click_model`` (:data:`PAPER_KS`,
    :data:`PAPER_KS_NAV`) that ``ldp_auc`` holds (the grid may run only some numbers of queries),
    the two-sample Kolmogorov-Smirnov p-value (:func:`fedlab.metrics.ks_pvalue`) of the attack's
    per-user AUCs against the same users' random guesses at each epsilon. Returns ``{(ranker, Q,
    adm): [p per epsilon]}`` keyed as the paper's table. Raises ``ValueError`` for another
    ``click_model``."""
    return {key: [ks_pvalue(ldp_auc[(*key, e)], random_auc[key]) for e in epsilons]
            for key in _paper_ks(click_model) if all((*key, e) in ldp_auc for e in epsilons)}


def ks_values(ks: dict, epsilons, *, click_model: str = "informational") -> dict:
    """The glued p-values of Tables 4-5, ``ch3c_ks_<ranker>_<Q>q[_adm]_eps<epsilon>`` (``_nav``
    appended for navigational clicks) -> the p-value as text with two significant digits
    (``"1.4e-03"``)."""
    _paper_ks(click_model)
    return {_ks_name(*key, e, click_model): f"{v:.1e}" for key, ps in ks.items() for e, v in zip(epsilons, ps)}


def ks_table(ks: dict, epsilons, run, *, ks_nav: dict | None = None, queries=(1, 8)) -> tuple[list, list]:
    """``(headers, rows)`` of Tables 4-5 for the rows with ``Q`` in ``queries``: the paper's p-values
    (:data:`PAPER_KS`), ours ("—" where not run at this scale) and the stored paper-scale record
    (``run.stored``), for informational clicks (``ks``) and, if given, navigational clicks (``ks_nav``,
    :data:`PAPER_KS_NAV`). ``epsilons`` must be the paper's five (1, 10, 20, 100, 500); raises
    ``ValueError`` otherwise."""
    _check_paper_epsilons(epsilons, [1.0, 10.0, 20.0, 100.0, 500.0])
    rows = []
    for click, res in [("informational", ks), ("navigational", ks_nav)]:
        if res is None:
            continue
        for (model, Q, adm), paper in _paper_ks(click).items():
            if Q not in queries:
                continue
            label = f"{model}, {click[:3]}, {Q} q{', ADM' if adm else ''}"
            names = [_ks_name(model, Q, adm, e, click) for e in epsilons]
            ours = res.get((model, Q, adm))
            rows.append([label, "paper"] + [f"{v:.2e}" for v in paper])
            rows.append([label, "ours"] + ([f"{v:.1e}" for v in ours] if ours is not None else ["—"] * len(epsilons)))
            rows.append([label, "ours, paper scale (median, range, n seeds)"] + [run.stored_p(n) for n in names])
    return ["attack", "source"] + [f"ε={e:g}" for e in epsilons], rows


def ks_queries_table(run, epsilon: float, queries=(4, 8, 12, 16)) -> tuple[list, list]:
    """``(headers, rows)``: Tables 4-5 across the number of queries at one ``epsilon``, one row per
    (ranker, click model, ADM), each cell "paper p / our paper-scale p" (``run.stored_p``, the median over
    the record's seeds). Raises ``ValueError`` for an epsilon outside the paper's five."""
    eps = [1.0, 10.0, 20.0, 100.0, 500.0]
    if epsilon not in eps:
        raise ValueError(f"epsilon must be one of the paper's {eps}, got {epsilon}")
    j = eps.index(epsilon)
    rows = []
    for click in ("informational", "navigational"):
        paper = _paper_ks(click)
        for model in ("linear", "neural"):
            for adm in (False, True):
                cells = [f"{paper[(model, Q, adm)][j]:.1e} / {run.stored_p(_ks_name(model, Q, adm, epsilon, click), brief=True)}"
                         if (model, Q, adm) in paper else "—" for Q in queries]
                rows.append([model, click[:3], "yes" if adm else "no"] + cells)
    return ["ranker", "clicks", "ADM"] + [f"{Q} queries: paper / ours (median over seeds)" for Q in queries], rows


def utility_grid(train, test, rankers: dict, epsilons, *, num_rounds: int, clients_per_round: int,
                 users: OltrUsers = OltrUsers(), delta: float, sensitivity: float, seed: int = 0) -> dict:
    """RAIFLE App. C.6 (Table 8): federated FPDGD (:func:`fedlab.fl.oltr.federated_oltr`, its ``users`` an
    :class:`fedlab.fl.oltr.OltrUsers`) for every ranker and every epsilon (the local Gaussian mechanism
    :class:`fedlab.privacy.ldp.LdpGaussian` of ``delta`` and L2 sensitivity ``sensitivity``; ``None``: no noise
    and no clipping, the column "infinity"), evaluated once at the end. Returns
    ``{(ranker, epsilon): test NDCG@10}``."""
    ndcg = {}
    for model, hidden in _rankers(rankers).items():
        for e in epsilons:
            r = federated_oltr(train, test, hidden, users=users, num_rounds=num_rounds,
                               clients_per_round=clients_per_round,
                               ldp=None if e is None else LdpGaussian(e, delta, sensitivity), eval_every=num_rounds,
                               seed=seed)
            ndcg[(model, e)] = r.ndcg[-1]
    return ndcg


#: RAIFLE Table 8 (MSLR-WEB10K, informational clicks): test NDCG@10 at epsilon = 1, 10, 20, 100, 500, inf
PAPER_T8 = {"linear": [0.228, 0.260, 0.280, 0.298, 0.301, 0.315],
            "neural": [0.223, 0.244, 0.226, 0.218, 0.228, 0.282]}


def _t8_name(model: str, eps) -> str:
    return f"ch3c_t8_{model}_eps{eps:g}" if eps else f"ch3c_t8_{model}_inf"


def table8_values(ndcg: dict, rankers, epsilons) -> dict:
    """The glued numbers of Table 8 (unrounded): ``ch3c_t8_<ranker>_eps<epsilon>`` (``_inf`` for no
    noise) for every ranker and epsilon, and ``ch3c_ndcg_<ranker>_eps1`` / ``_inf`` that the text
    quotes. Raises ``ValueError`` unless ``epsilons`` holds 1.0 and ``None``."""
    epsilons = list(epsilons)
    if 1.0 not in epsilons or None not in epsilons:
        raise ValueError(f"epsilons must contain 1.0 and None, got {epsilons}")
    out = {_t8_name(m, e): ndcg[(m, e)] for m in rankers for e in epsilons}
    for m in rankers:
        out[f"ch3c_ndcg_{m}_eps1"] = ndcg[(m, 1.0)]
        out[f"ch3c_ndcg_{m}_inf"] = ndcg[(m, None)]
    return out


def table8_table(ndcg: dict, rankers, epsilons, run) -> tuple[list, list]:
    """``(headers, rows)`` of Table 8: the paper's NDCG@10 (:data:`PAPER_T8`), ours (3 decimals) and the
    stored paper-scale record (``run.stored``). ``epsilons`` must be the paper's (1, 10, 20, 100, 500,
    ``None`` for no noise); raises ``ValueError`` otherwise."""
    _check_paper_epsilons(epsilons, [1.0, 10.0, 20.0, 100.0, 500.0, None])
    rows = []
    for m in rankers:
        rows.append([m, "paper"] + PAPER_T8[m])
        rows.append([m, "ours"] + [round(ndcg[(m, e)], 3) for e in epsilons])
        rows.append([m, "ours, paper scale (mean [95 % CI])"] + [run.stored(_t8_name(m, e), value_range=(0, 1)) for e in epsilons])
    return ["ranker", "source"] + [f"ε={e:g}" if e else "ε=∞" for e in epsilons], rows


def table8_rise(ndcg: dict, rankers, run) -> tuple[tuple[list, list], dict]:
    """How much NDCG@10 the ranker gains from epsilon = 1 to no noise (RAIFLE App. C.6, Table 8), as
    ``((header, rows), values)``. One row per ranker: the paper's rise (:data:`PAPER_T8`, last column
    minus first), this build's (``ndcg`` of :func:`utility_grid`, one run), and the stored paper-scale
    record's, seed by seed from ``ch3c_ndcg_<ranker>_inf`` and ``_eps1`` (``run.per_seed``): the mean
    with the half-width of its 95 % t interval (:func:`fedlab.metrics.t_interval`) and the range over
    seeds ("no record yet" without them). ``values``: ``ch3c_t8_rise_<ranker>`` (this build, unrounded)
    and ``ch3c_t8_rise_<ranker>_paper`` (the record's cell, a string) for :func:`fedlab.book.glue_many`.
    Raises ``ValueError`` for a ranker without both ``(ranker, 1.0)`` and ``(ranker, None)`` in ``ndcg``,
    or a record whose two values have different numbers of seeds."""
    from ..metrics import t_interval

    rows, values = [], {}
    for m in rankers:
        if (m, 1.0) not in ndcg or (m, None) not in ndcg:
            raise ValueError(f"ndcg must hold ({m!r}, 1.0) and ({m!r}, None)")
        ours = float(ndcg[(m, None)] - ndcg[(m, 1.0)])
        hi, lo = run.per_seed(f"ch3c_ndcg_{m}_inf"), run.per_seed(f"ch3c_ndcg_{m}_eps1")
        if len(hi) != len(lo):
            raise ValueError(f"the record holds {len(hi)} seeds of ch3c_ndcg_{m}_inf and {len(lo)} of _eps1")
        rises = [a - b for a, b in zip(hi, lo)]
        if not rises:
            record, spread = "no record yet", "no record yet"
        else:
            mean, _, ci = t_interval(rises)
            record = (f"{mean:.3f} (n = 1)" if ci is None
                      else f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f} (n = {len(rises)})")
            spread = f"{min(rises):.3f} to {max(rises):.3f}"
        paper = PAPER_T8[m][-1] - PAPER_T8[m][0] if m in PAPER_T8 else float("nan")
        rows.append([m, paper, ours, record, spread])
        values[f"ch3c_t8_rise_{m}"] = ours
        values[f"ch3c_t8_rise_{m}_paper"] = record
    header = ["ranker", "paper (Table 8, mean of 10 runs)", "ours, this build (one run)",
              "ours, paper-scale record (mean ± 95 % CI)", "record: range over seeds"]
    return (header, rows), values


# ---------------------------------------------------------------------------------------------------
# Gradient pruning (App. C.4, Fig. 9)
# ---------------------------------------------------------------------------------------------------

def prune_grid(data, rankers: dict, fractions, configs, num_users: int, *, lr: float, max_iter: int,
               click_model: str = "informational", seed: int = 0) -> tuple[dict, dict, dict]:
    """RAIFLE App. C.4 (Fig. 9): RAIFLE against gradient pruning (Zhu et al. 2019), by two attackers.
    For every ranker and ``(Q, adm)`` of ``configs`` the same ``num_users`` users (``Q`` queries, ADM or
    not) prune each fraction of ``fractions`` of their update's smallest-magnitude entries
    (:func:`fedlab.privacy.defenses.prune_rows`). The server attacks every pruned update twice: as the
    paper's code does, matching its unpruned simulation to what it received (the withheld zeros
    included), and as the attacker who knows the defense, matching only the coordinates the update
    carries (``update != 0``; :func:`~fedlab.attacks.interaction_inference.oltr.attack_oltr`'s
    ``knows_mask``). Both attackers and all fractions of a ranker and configuration run in one batched
    L-BFGS call (per-row problems: each row is attacked as if alone); a user starts from the same point
    under both attackers, so the two are compared pair by pair.

    Returns ``(naive, aware, loss)``: ``naive`` and ``aware`` map ``(ranker, Q, adm, fraction)`` to the
    per-user AUC ``[num_users]`` (``naive`` is bit for bit the single-attacker grid); ``loss`` maps the
    same keys to ``{"naive", "aware", "naive_truth", "aware_truth"}``, each attacker's matching loss
    reached and the same loss at the true clicks (``[num_users]``; 0 at the truth when the update is
    exact and the order of queries does not matter, above 0 for the naive loss once coordinates are
    withheld). Raises ``ValueError`` for a fraction outside [0, 1) or empty ``configs``.
    """
    fractions = list(fractions)
    bad = [f for f in fractions if not 0 <= f < 1]
    if bad or not fractions:
        raise ValueError(f"fractions must be a non-empty list in [0, 1), got {fractions}")
    configs = list(configs)
    if not configs:
        raise ValueError("configs must not be empty")
    naive, aware, loss = {}, {}, {}
    F, U = len(fractions), num_users
    for model, hidden in _rankers(rankers).items():
        for Q, adm in configs:
            base = make_oltr_case(data, num_users, Q, hidden, users=OltrUsers(click_model=click_model, lr=lr), adm=adm,
                                  seed=seed + 500 + Q + len(hidden))
            case = cat_cases([base] * (2 * F))                       # rows: [naive | aware] x fraction x user
            pruned = torch.cat([prune_rows(base.update, f) for f in fractions])
            target = torch.cat([pruned, pruned])
            knows = torch.arange(2 * F * U) >= F * U
            mask = (target != 0) | ~knows[:, None]                    # naive rows compare every coordinate
            res = raifle_oltr(case, target, mask=mask, budget=RaifleBudget(max_iter=max_iter), seed=seed,
                              user_ids=torch.arange(F * U).repeat(2),
                              truth=(case.I.reshape(2 * F * U, -1).to(target.dtype), None))
            auc = roc_auc_rows(case.I.reshape(2 * F * U, -1), res.scores,
                               case.mask.reshape(2 * F * U, -1)).reshape(2, F, U)
            reached, at_truth = res.loss.reshape(2, F, U), res.loss_truth.reshape(2, F, U)
            for i, f in enumerate(fractions):
                key = (model, Q, adm, f)
                naive[key], aware[key] = auc[0, i], auc[1, i]
                loss[key] = {"naive": reached[0, i], "aware": reached[1, i],
                             "naive_truth": at_truth[0, i], "aware_truth": at_truth[1, i]}
    return naive, aware, loss


def prune_plot(prune_auc: dict, rankers, fractions, configs, *, aware: dict | None = None):
    """RAIFLE Fig. 9: mean AUC against the percentage of the update pruned, one panel per ranker,
    one curve per ``(Q, adm)`` of ``configs`` (results of :func:`prune_grid`): the paper's attack,
    solid markers; with ``aware`` (:func:`prune_grid`'s second result) the attacker who knows the
    pruning mask too, the same colour dotted with hollow markers. Returns the axes. Raises
    ``ValueError`` if ``aware`` lacks a key of the curves drawn."""
    from ..plots import plt

    keys = [(m, Q, a, f) for m in rankers for Q, a in configs for f in fractions]
    if aware is not None and any(k not in aware for k in keys):
        raise ValueError(f"aware lacks keys: {[k for k in keys if k not in aware][:3]}")
    _, axs = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    x = [100 * f for f in fractions]
    for ax, model in zip(axs, rankers):
        for (Q, adm), st in zip(configs, ["o-", "s--", "^-", "d-."]):
            label = f"{Q} q{', ADM' if adm else ''}"
            line, = ax.plot(x, [prune_auc[(model, Q, adm, f)].mean() for f in fractions], st,
                            label=f"{label} (paper's attack)" if aware is not None else label)
            if aware is not None:
                ax.plot(x, [aware[(model, Q, adm, f)].mean() for f in fractions], st[0] + ":",
                        color=line.get_color(), mfc="none", label=f"{label}, knows the mask")
        ax.axhline(0.5, color="gray", ls=":", label="random guess")
        ax.set(xlabel="% of the update pruned", title=f"{model} (cf. RAIFLE Fig. 9)")
    axs[0].set_ylabel("mean attack AUC")
    axs[min(len(list(rankers)), 2) - 1].legend(fontsize=7)
    return axs


#: RAIFLE App. C.4 (the text describing Fig. 9, MQ2007; ADM for more than one query)
PAPER_FIG9 = {0.9: "pruning must exceed 90 % before the AUC nears 0.5", 0.99: "close to random guessing",
              "neural": "networks less affected than linear rankers"}


def prune_values(prune_auc: dict, configs, *, aware: dict | None = None, loss: dict | None = None) -> dict:
    """The glued numbers of :func:`prune_grid` (unrounded): the paper's attack's mean AUCs
    ``ch3c_prune_<ranker>_<Q>q[_adm]_f<percent>``; with ``aware`` the mask-aware attacker's
    ``ch3c_prune_aware_<...>``; with ``loss`` the median matching losses ``ch3c_prune_loss_<attacker>[_truth]_<...>``
    (``attacker`` ``naive`` or ``aware``; reached, or at the true clicks)."""
    keep = set(configs)
    name = lambda m, Q, a, f: f"{m}_{Q}q{'_adm' if a else ''}_f{100 * f:g}"
    out = {f"ch3c_prune_{name(*k)}": v.mean().item() for k, v in prune_auc.items() if k[1:3] in keep}
    out.update({f"ch3c_prune_aware_{name(*k)}": v.mean().item() for k, v in (aware or {}).items() if k[1:3] in keep})
    for k, d in (loss or {}).items():
        if k[1:3] in keep:
            out.update({f"ch3c_prune_loss_{which}_{name(*k)}": d[which].median().item() for which in d})
    return out


def prune_table(prune_auc: dict, rankers, fractions, configs, *, aware: dict | None = None) -> tuple[list, list]:
    """``(headers, rows)``: one row per fraction pruned, our mean AUC (3 decimals) for every ranker and
    ``(Q, adm)`` of ``configs``, each followed (with ``aware``, :func:`prune_grid`'s second result) by the
    mask-aware attacker's, and the paper's statement (:data:`PAPER_FIG9`) where it makes one."""
    cols = [(m, Q, a) for m in rankers for Q, a in configs]
    head = [f"{m}, {Q} q{', ADM' if a else ''}" for m, Q, a in cols]
    grids = [prune_auc] + ([aware] if aware is not None else [])          # each mask-aware column beside its own
    rows = [[f"{100 * f:g} %"] + [round(g[(m, Q, a, f)].mean().item(), 3) for m, Q, a in cols for g in grids]
            + [PAPER_FIG9.get(f, "")] for f in fractions]
    headers = ["pruned"] + [x for h in head for x in ([h, f"{h}, knows the mask"] if aware is not None else [h])]
    return headers + ["paper (text of App. C.4)"], rows


# ---------------------------------------------------------------------------------------------------
# Countermeasure (Sec. 5.1), widget, record table
# ---------------------------------------------------------------------------------------------------

def flag_rounds(cases, **kwargs) -> torch.Tensor:
    """:func:`fedlab.attacks.interaction_inference.oltr.flag_dead_features` on every user of every case in
    ``cases``, concatenated: a [sum of users] bool tensor (True: the user refuses the round)."""
    cases = list(cases)
    if not cases:
        raise ValueError("cases must not be empty")
    return torch.cat([flag_dead_features(c.X, c.mask, **kwargs) for c in cases])


def ldp_boxplot(ldp_auc: dict, rankers, num_queries: int, eps: float):
    """Box plots of the per-user AUCs under LDP at ``eps`` (results of :func:`ldp_grid`; nothing is
    recomputed) for every ranker at one query and at ``num_queries`` queries without and with ADM.
    Raises ``ValueError`` naming ``eps`` when it was not swept. Returns the axes."""
    from ..plots import plt

    if not any(k[-1] == eps for k in ldp_auc):
        raise ValueError(f"eps={eps} was not swept")
    _, ax = plt.subplots(figsize=(7, 2.8))
    keys = [(m, Q, a) for m in rankers for Q, a in [(1, False), (num_queries, False), (num_queries, True)]]
    ax.boxplot([ldp_auc[(m, Q, a, eps)].numpy() for m, Q, a in keys],
               tick_labels=[f"{m[:3]} {Q}q{' ADM' if a else ''}" for m, Q, a in keys])
    ax.axhline(0.5, color="gray", ls=":")
    ax.set_ylabel("per-user AUC")
    ax.set_title(f"LDP ε = {eps:g}")
    return ax


#: chapter 3c's headline numbers (the attack): glued name -> label, for the table of this build against the record
RECORD_LABELS = {
    "ch3c_users": "users per cell (Fig. 5)",
    "ch3c_fig5_single": "Fig. 5: 1 query, AUC (lower of the two rankers)",
    "ch3c_fig5_lin16": "Fig. 5: linear, 16 queries", "ch3c_fig5_lin16_adm": "Fig. 5: linear, 16 queries, ADM",
    "ch3c_fig5_nn16": "Fig. 5: neural, 16 queries", "ch3c_fig5_nn16_adm": "Fig. 5: neural, 16 queries, ADM",
    "ch3c_set_before_neural_adm": "16 queries, neural, ADM: a first choice (η = 1, fan-in, display order)",
    "ch3c_set_paper_neural_adm": "16 queries, neural, ADM: the paper's setting",
    "ch3c_set_weight_blocks_neural_adm": "16 queries, neural, ADM: + the reference's weight blocks",
    "ch3c_noisy_nn0": "Fig. 11: neural, 16 queries, no ADM", "ch3c_noisy_nnz": "Fig. 11: neural, exact-zero ADM",
    "ch3c_noisy_nn": "Fig. 11: neural, ADM noise 0.1",
    "ch3c_sa_err": "SA bypass: max abs error of the recovered update",
    "ch3c_pir_tpr_ldp": "PIR bypass under LDP ε=100: true-positive rate",
    "ch3c_total_s": "notebook run time (s)"}
#: chapter 3d's headline numbers (the defenses): glued name -> label, for its table of this build against the record
DEFENSE_RECORD_LABELS = {
    "ch3c_ldp_lin1_eps10": "LDP ε=10: linear, 1 query, AUC", "ch3c_ks_lin1_eps10": "LDP ε=10: K-S p-value",
    "ch3c_ldp_nn_noadm": "LDP ε=500: neural, 8 queries", "ch3c_ldp_nn_adm": "LDP ε=500: neural, 8 queries, ADM",
    "ch3c_prune_min90": "Fig. 9: 90 % pruned, lowest mean AUC",
    "ch3c_prune_linear_8q_adm_f99": "Fig. 9: 99 % pruned, linear, 8 queries, ADM",
    "ch3c_prune_neural_1q_f99": "Fig. 9: 99 % pruned, neural, 1 query",
    "ch3c_prune_aware_neural_1q_f99": "Fig. 9: 99 % pruned, neural, 1 query, attacker who knows the mask",
    "ch3c_ndcg_linear_eps1": "Table 8: linear NDCG@10, ε=1",
    "ch3c_ndcg_linear_inf": "Table 8: linear NDCG@10, no noise",
    "ch3c_ndcg_neural_eps1": "Table 8: neural NDCG@10, ε=1",
    "ch3c_ndcg_neural_inf": "Table 8: neural NDCG@10, no noise",
    "ch3d_total_s": "notebook run time (s)"}
#: how the stored value of each row of :data:`RECORD_LABELS` and :data:`DEFENSE_RECORD_LABELS` is written
#: (:func:`fedlab.records.compare_rows`): AUCs, NDCG and rates with their interval cut to [0, 1], the K-S p-value as
#: a median and range over seeds
RECORD_KINDS = {k: "rate" for k in RECORD_LABELS if k not in ("ch3c_users", "ch3c_sa_err", "ch3c_total_s")}
DEFENSE_RECORD_KINDS = {k: ("p" if k.startswith("ch3c_ks_") else "rate") for k in DEFENSE_RECORD_LABELS
                        if k != "ch3d_total_s"}


# ---------------------------------------------------------------------------------------------------
# The chapter's settings: the paper, its authors' reference code, and ours
# ---------------------------------------------------------------------------------------------------

#: the authors' public code quoted by :func:`reference_settings_table`: commit c513b97 (2023-11-17) is
#: the last version before 2024 (two-layer 16-8 network, exact-zero fingerprinting, the paper's Figs.
#: 5-7); HEAD 7d1a33b (2025-03-04) is the newest
REFERENCE_REPOSITORY = "github.com/dzungvpham/raifle"


#: Chapter 3c's settings that differ between the quick and the paper scale, ``name -> (quick, paper)``:
#: the notebook reads each with :func:`scaled` and :func:`reference_settings_table` states both.
#: ``synthetic_queries``: queries of the synthetic data set (real data is used whole);
#: ``fig5_queries``: queries per user in Figure 5; ``num_users``: users per Figure 5 cell;
#: ``max_iter``: the attack's L-BFGS loss evaluations everywhere; ``settings_users``, ``noisy_users``,
#: ``ldp_users``: users per click model and cell of the settings table, of Fig. 11 (and the reference's
#: noise replacement), of Tables 4-5 and Fig. 9; ``replaced_fractions``: the fractions of features the
#: reference's final ADM replaces; ``ldp_queries``: Tables 4-5's numbers of queries (with ADM and
#: without); ``pir_users``: users of the PIR test; ``num_rounds``: rounds of federated training (Table 8);
#: ``budget_users``: users of the check at the reference code's budget (:func:`budget_check`)
SCALE_SETTINGS = {"synthetic_queries": (300, 1000), "fig5_queries": ([1, 8, 16], [1, 4, 8, 12, 16]),
                  "num_users": (8, 100), "max_iter": (25, 200), "settings_users": (4, 50), "noisy_users": (6, 100),
                  "replaced_fractions": ([1.0], [0.5, 1.0]), "pir_users": (40, 1000), "ldp_users": (8, 100),
                  "ldp_queries": ([8], [4, 8, 12, 16]), "num_rounds": (60, 300), "budget_users": (2, 50)}


def scaled(name: str):
    """The value of the scale-dependent setting ``name`` of :data:`SCALE_SETTINGS` at the active scale
    (``FEDLAB_SCALE``, :func:`fedlab.config.pick`); a list comes back as a fresh copy. Raises
    ``ValueError`` for an unknown ``name``."""
    from ..config import pick

    if name not in SCALE_SETTINGS:
        raise ValueError(f"name must be one of {sorted(SCALE_SETTINGS)}, got {name!r}")
    quick, paper = SCALE_SETTINGS[name]
    value = pick(quick=quick, paper=paper)
    return list(value) if isinstance(value, list) else value


def _check_scale_settings(settings: dict) -> None:
    """``ValueError`` naming ``settings`` unless it holds every key of :data:`SCALE_SETTINGS` as a
    ``(quick, paper)`` pair: positive integers, or non-empty lists (of positive integers, or of
    fractions in (0, 1] for ``replaced_fractions``)."""
    for name, value in scale_pairs(settings, SCALE_SETTINGS):
        if isinstance(SCALE_SETTINGS[name][0], list):
            ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
                (0 < float(v) <= 1) if name == "replaced_fractions"
                else (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in value)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not ok:
            raise ValueError(f"settings[{name!r}] has a bad value {value!r}")


def reference_settings_table(data, rankers: dict, *, click_models, lr: float, epsilons, delta: float,
                             sensitivity: float, clients_per_round: int,
                             settings: dict | None = None) -> tuple[list, list]:
    """Chapter 3c's settings as ``(header, rows)`` for :func:`fedlab.plots.md_table`: one row per
    setting that matters for RAIFLE's result on federated OLTR (FPDGD), and one per departure from the
    paper or its code, with four columns: the paper (Pham, Kulkarni & Houmansadr; section cited), its
    authors' reference code (:data:`REFERENCE_REPOSITORY`, the commit cited, with where it changed
    across commits), ours at quick scale and ours at paper scale ("same" where the two agree).

    The first two columns quote their sources. Every value of the two "ours" columns comes from code:
    from ``settings`` (default :data:`SCALE_SETTINGS`, read at the call: users, queries, budget, rounds
    at each scale), from the arguments (the notebook's constants: ``data`` a
    :class:`fedlab.data.letor.LTRData` (synthetic data is drawn with ``synthetic_queries`` queries at
    each scale, real data is used whole), ``rankers`` ``{name: hidden sizes}``, ``click_models`` their
    names, ``lr`` the users' step size, ``epsilons``, ``delta``, ``sensitivity`` the LDP sweep's settings,
    ``clients_per_round`` the users per round of Table 8's federated training) or read from the library
    (the defaults of :func:`fedlab.attacks.interaction_inference.oltr.make_oltr_case`'s
    :class:`fedlab.fl.oltr.OltrUsers`, :func:`fedlab.attacks.interaction_inference.recsys.raifle`'s
    :class:`~fedlab.attacks.interaction_inference.recsys.RaifleBudget`, :func:`fedlab.optim.lbfgs_rows` and
    :class:`LdpSweep`, :data:`fedlab.fl.oltr.CLICK_MODELS`, :func:`fedlab.fl.oltr.ranker_size` and the
    ADM blocks of :func:`fedlab.attacks.interaction_inference.oltr.feature_allocation`).

    Raises ``ValueError`` for empty ``rankers``, ``click_models`` or ``epsilons``, an unknown click model,
    ``settings`` without a key of :data:`SCALE_SETTINGS` or with a bad value (naming it),
    ``clients_per_round < 1`` or ``lr``, ``delta``, ``sensitivity`` not > 0.
    """
    import inspect

    from ..attacks.interaction_inference import oltr as _oltr
    from ..attacks.interaction_inference import recsys as _recsys
    from .. import optim as _optim
    from ..fl import oltr as _fl_oltr

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    rankers, click_models, epsilons = dict(rankers), list(click_models), list(epsilons)
    for name, value in (("rankers", rankers), ("click_models", click_models), ("epsilons", epsilons)):
        if not value:
            raise ValueError(f"{name} must not be empty")
    settings = SCALE_SETTINGS if settings is None else settings
    _check_scale_settings(settings)
    if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, int) or clients_per_round < 1:
        raise ValueError(f"clients_per_round must be an integer >= 1, got {clients_per_round!r}")
    for name, value in (("lr", lr), ("delta", delta), ("sensitivity", sensitivity)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    F, G = data.num_features, data.num_grades
    probs = {c: _fl_oltr.click_probabilities(c, G) for c in click_models}      # ValueError if unknown
    fmt = ", ".join
    nums = lambda xs: fmt(f"{float(x):g}" for x in xs)                          # noqa: E731
    ranker_text = "; ".join(f"{m}: {'w·x' if not tuple(h) else 'hidden ' + fmt(map(str, h)) + ' ReLU, no biases'} "
                            f"({_fl_oltr.ranker_size(F, h)} parameters)" for m, h in rankers.items())
    clicks_text = "; ".join(f"{c} click {nums(pc)}, stop {nums(ps)}" for c, (pc, ps) in probs.items())
    oltr_users = _fl_oltr.OltrUsers()      # the simulated users' defaults (make_oltr_case takes users= explicitly)
    k, init, shuffle = oltr_users.k, oltr_users.init, oltr_users.shuffle_queries
    budget = default(_recsys.raifle, "budget")
    restarts, history, tol = budget.num_restarts, budget.history_size, budget.tol
    c1 = default(_optim.lbfgs_rows, "c1")
    backtracks = default(_optim.lbfgs_rows, "max_backtracks")
    knows_clip = LdpSweep().attacker_knows_clip
    init_text = {"uniform": "every parameter U(−1, 1)", "fan_in": "U(±1/√fan-in) per layer"}.get(init, init)
    synthetic = data.source == "synthetic"

    def at(i):
        """The scale-dependent cells at scale ``i`` (0 quick, 1 paper)."""
        s = {name: pair[i] for name, pair in settings.items()}
        qmax = max(s["fig5_queries"])
        blocks = _oltr.feature_allocation(torch.tensor([qmax]), qmax, F)[0].sum(-1)
        n_queries = s["synthetic_queries"] if synthetic else len(data)
        return {
            "data": f"{data.source}{' (MQ2007-shaped)' if synthetic else ''}: {n_queries} queries, {F} features, "
                    f"{G} relevance grades",
            "users and queries": f"{s['num_users']} users per (ranker, Q, click model) cell of Fig. 5, "
                                 f"Q ∈ {{{fmt(map(str, s['fig5_queries']))}}}; {s['settings_users']} per click model "
                                 f"in the table of open settings, {s['noisy_users']} in Fig. 11, {s['ldp_users']} in "
                                 f"Tables 4-5 and Fig. 9, {s['pir_users']} in the PIR test",
            "budget": f"{s['max_iter']} loss evaluations per attack, not iterations; the reference's "
                      f"{REFERENCE_BUDGET} checked on {s['budget_users']} users (`budget_check`)",
            "ADM": f"{F} features in Q contiguous blocks of ⌊F/Q⌋ or ⌈F/Q⌉ (`feature_allocation`; at Q = {qmax}: "
                   f"{int(blocks.min())}-{int(blocks.max())} features); exact zeros, or N(0, s²) noise "
                   "(`adm_fingerprint`); the reference's final ADM as its own row (`noise_replacement_grid`, "
                   f"α ∈ {{{nums(s['replaced_fractions'])}}}); first-layer weight blocks only in one row of the "
                   "table of settings the paper leaves open",
            "LDP": f"`ldp_gaussian`, Δ₂ = {sensitivity:g} (clip to {ldp_clip_norm(sensitivity):g}), δ = {delta:g}, "
                   f"ε ∈ {{{nums(epsilons)}}}; analytic for ε > 1, classical for ε ≤ 1; 1 query and "
                   f"Q ∈ {{{fmt(map(str, s['ldp_queries']))}}} with and without ADM",
            "federated training (Table 8)":
                f"{s['num_rounds']} rounds of {clients_per_round} users, one query each, drawn with replacement from "
                "the training split; lists without or with only clicks drawn again; one run per seed, the "
                "same initial ranker for every ε",
        }

    ours = partial(scale_cells, at(0), at(1))     # the two "ours" cells of a row (quick, paper)
    header = settings_header(REFERENCE_REPOSITORY)
    rows = [
        ["data",
         "MSLR-WEB10K (136 features, grades 0-4, normalised) for the main results, MQ2007 (46 features, "
         "grades 0-2) for Fig. 9 (Sec. 4.1.2, App. C.4)",
         "c513b97: MQ2008 Fold 1 test set (the MSLR click models commented out); HEAD 7d1a33b: MQ2007 Fold 1 train by default, "
         "MSLR-WEB10K selectable",
         *ours("data")],
        ["users and queries",
         "each user attacked once; 1 or {4, 8, 12, 16} queries per user (Sec. 4.1.1); users per cell not given",
         "every disjoint group of Q shuffled queries is one user (`grouper`); c513b97: Q ∈ {1, 4, 8, 12, 16}; "
         "HEAD: Q = 16 (MQ2007) or 48 (MSLR)",
         *ours("users and queries")],
        ["rankers",
         "linear; 2-layer MLP with 16 and 8 ReLU units (Sec. 4.1.3)",
         "c513b97: `LinearPDGDRanker`, `Neural2LayerPDGDRanker(16, 8)`, no biases; from 14e057a (2024-04-02) to "
         "HEAD: `Neural1LayerPDGDRanker`, one hidden layer (16 units at HEAD)",
         *ours("rankers", ranker_text)],
        ["initialisation",
         "'a different random set of model parameters' per user (Sec. 4.1.1)",
         "`gen_params`: every parameter U(−1, 1) (c513b97 to HEAD)",
         *ours("initialisation", f"one ranker per user, {init_text} (`init_rankers`, init={init!r})")],
        ["displayed list",
         "at most 10 items 'sampled according to the current ranking model' (Sec. 4.1.1)",
         "`rank(sample=True)`: `torch.multinomial` without replacement in proportion to the scores, shifted "
         "by their minimum (+1e-10) when one is ≤ 0; the top 10 kept (c513b97 to HEAD)",
         *ours("displayed list", f"Plackett-Luce (Gumbel top-k, `present`), top {k}")],
        ["click model",
         "cascade 'navigational' and 'informational' models of federated OLTR (Sec. 4.1.2)",
         "`CascadeClickModel`: lists with no or all clicks are drawn again, but the clicks are not reset "
         "between draws, so positions after a stop keep the previous draw's clicks (c513b97 to HEAD)",
         *ours("click model", f"cascade, redrawn whole (clicks reset) when no or all documents are clicked; "
                              f"{clicks_text}")],
        ["local training",
         "FPDGD (Sec. 4.1.3); step size not given",
         "one PDGD step of lr 0.1 per query, in a random order of the user's (`random.sample`); the server "
         "simulates the display order (c513b97 to HEAD)",
         *ours("local training", f"one PDGD step of η = {lr:g} per query, "
               + ("in a random order of the user's; the server simulates the display order" if shuffle
                  else "in display order"))],
        ["attack loss",
         "L2 (App. B.3)",
         "`F.mse_loss` of the simulated and received updates (c513b97), both divided by the lr (HEAD)",
         *ours("attack loss", "‖g(I′) − θ̂‖² / ‖θ̂‖² (`oltr_matching_loss`)")],
        ["optimiser and line search",
         "L-BFGS with the L2 loss (App. B.3)",
         "`torch.optim.LBFGS`, lr 0.1, strong Wolfe line search, torch's defaults (history 100, "
         "tolerance_grad 1e-7, tolerance_change 1e-9), c513b97 to HEAD",
         *ours("optimiser and line search", f"`lbfgs_rows`: one L-BFGS per user, history {history}, Armijo "
                                            f"backtracking (c1 = {c1:g}, at most {backtracks} steps), stops when the "
                                            f"loss changes by < {tol:g}")],
        ["budget",
         "none given; a step budget and a loss-improvement threshold as termination criteria (App. B.3)",
         "`max_iter = 1000` L-BFGS iterations (torch evaluates the loss up to 1250 times), c513b97 to HEAD",
         *ours("budget")],
        ["starts",
         "random restarts, best kept; number not given (App. B.3)",
         "`num_atk = 1`, z ~ U(−1, 1) (c513b97 to HEAD)",
         *ours("starts", f"{restarts} per user, z ~ U(−1, 1)")],
        ["ADM",
         "features split equally, one block per query, the other features zeroed (Secs. 3.3, 4.1.1); the "
         "unallocated features N(0, s²) instead, s ∈ {1e-4, 1e-3, 0.01, 0.1} (App. C.5)",
         "c513b97: contiguous blocks of ⌊F/Q⌋ features (features past Q⌊F/Q⌋ zeroed for every query), noisy "
         "variant, and first-layer weight blocks in a separate cell; 5c8a715 (2024-03-19): optimised noise on "
         "the unallocated features; 14e057a: a blend (1 − α)x + α·N(0, 0.1²); 00c8e99 (2024-04-08, the CV experiment) and "
         "0c39b80 (2024-04-29) to HEAD: a random fraction α of the features replaced by N(0, 0.1²) noise, "
         "α ∈ {0, 1} at HEAD (no ADM, or every feature replaced)",
         *ours("ADM")],
        ["LDP",
         "Gaussian, Δ₂ = 0.5, δ = 1e-8, ε ∈ {1, 10, 20, 100, 500}; analytic Gaussian for ε > 1, classical for "
         "ε ≤ 1 (Sec. 4.1.1)",
         "`apply_gaussian_mechanism`: clip to Δ₂/2 = 0.25, diffprivlib noise; c513b97: ε ∈ {1, 10, 20, 100, 500, "
         "∞}; HEAD: ε ∈ {1, 20, 100, 500, ∞}",
         *ours("LDP")],
        ["attacker knows the clipping",
         "not given",
         "no: it simulates the unclipped update (c513b97 to HEAD)",
         *ours("attacker knows the clipping", "yes (reproduced in the simulation); one table drops it" if knows_clip
               else "no: it simulates the unclipped update")],
        ["federated training (Table 8)",
         "one pass over MSLR-WEB10K's Fold 1 training queries, one unique query per user, aggregation every "
         "100 users; test NDCG@10; 10 repetitions with different aggregation orders and initial rankers "
         "(App. C.6)",
         "24087aa (2024-07-11): 10 shuffled passes over the training queries from one initial ranker per "
         "(ranker, click model), 100 users per aggregation, lr 0.1, lists with no or all clicks skipped, "
         "ε ∈ {1, 20, 100, 500, ∞}",
         *ours("federated training (Table 8)")],
    ]
    return header, rows
