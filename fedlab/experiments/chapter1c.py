"""The experiments of chapters 1c and 1d: membership inference against FedAvg (Nasr et al. 2019, Sections
IV-V, as taught in Shokri's CS5562 lecture; chapter 1c), client-level DP-FedAvg (McMahan et al. 2018, Alg. 1)
against that attack, and the personalised alternatives (local-only training, DP-FedAvg followed by
fine-tuning, Centaur of Shen et al. 2023, Alg. 1-2; chapter 1d, ``chapters/01d_membership_defenses.ipynb``).

The attacks are :mod:`fedlab.attacks.membership`; DP-FedAvg and Centaur are :mod:`fedlab.fl.dp_fedavg`
and :mod:`fedlab.fl.personalization`. The functions here run the chapter's sweeps in the order the
chapter runs them (so that every number is the one the chapter has always printed), return plain
dictionaries, and build the chapter's "paper vs ours" tables; the page glues what they return.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .._checks import finite_positive, positive_int, whole_int
from ..attacks import membership as mia
from ..data import Dataset, client_datasets, partition_iid
from ..fl import personalization as pers
from ..fl import LocalTraining, cross_entropy, stack_clients
from ..fl.local import _local
from ..fl.dp_fedavg import DPSettings, dp_fedavg_runs
from ..metrics import auc_permutation_floor, roc_auc, t_interval
from .tables import mean_interval
from ..privacy import dp_fedavg as dpf

__all__ = ["LECTURE_WINDOW_AUC", "SUMMARY_LABELS", "DEFENSE_SUMMARY_LABELS", "LECTURE_ACTIVE_ACCURACY", "LECTURE_WHITE_BOX", "window_values", "window_table",
           "passive_curves", "passive_curve_values", "plot_passive_curves", "white_black_box",
           "white_black_box_values", "white_black_box_table",
           "learned_attack_sweep", "learned_attack_values", "learned_attack_table", "ActiveGrid", "active_attack_sweep",
           "active_attack_name", "active_attack_values", "active_attack_table", "LOW_FPR",
           "active_learned_values", "active_learned_table", "lira_shadow_models", "lira_attack", "PASSIVE_ATTACKS",
           "passive_attack_scores", "passive_attack_values", "passive_attack_table", "heldout_gamma", "heldout_gamma_values", "heldout_gamma_table",
           "ascent_drop_values", "CHAPTER_MECHANISM", "safe_noise_cost", "ddg_calibration", "ddg_error_ratio", "DPGrid", "dp_grid", "plot_dp_grid",
           "PersonalizationTask", "PersonalizationSchedule", "personalization_sweep", "snr_and_agreement", "plot_snr_agreement", "PERSONALIZATION_METHODS",
           "personalization_eps_sweep", "personalization_eps_values", "personalization_eps_table",
           "EARLY_ROUND", "window_settings", "window_settings_values", "window_settings_table", "white_box_factors",
           "white_box_evidence", "personalized_attack", "personalized_attack_values", "personalized_attack_table"]

#: lecture slide "Additional information leaked in FL - multiple observations" (Nasr et al. 2019
#: setting): AUC of the loss signal, keyed by the window W (last round only, average of the last 10)
LECTURE_WINDOW_AUC = {1: 0.687, 10: 0.712}

#: lecture table "Gradient ascent attack" (Nasr et al. 2019, Table XI), AlexNet row: attack accuracy,
#: keyed by (attacker, active)
LECTURE_ACTIVE_ACCURACY = {("server", False): 0.851, ("server", True): 0.882, ("server, isolating", False): 0.890,
                           ("server, isolating", True): 0.921, ("participant", False): 0.731,
                           ("participant", True): 0.763}

#: lecture slide "Additional information leaked in FL - white-box access" (Nasr et al. 2019, Table IV),
#: Purchase100 fully connected row (the task of the lecture's gradient-norm figure): attack accuracy
LECTURE_WHITE_BOX = {"black-box (outputs)": 0.676, "white-box (gradients)": 0.734}

#: false-positive rates at which the active attacks' TPR is reported (Carlini et al., S&P 2022)
LOW_FPR = (0.001, 0.01)

#: The chapter's DP-FedAvg and Centaur use McMahan et al.'s float Gaussian (``safe=False``) and its accountant, not
#: fedlab's floating-point-safe default: the safe accountant (the discrete Gaussian's Renyi bound) has no
#: amplification by sampling, so at the personalisation section's q = 0.3 the safe noise would have to be about three
#: times larger for the same epsilon (:func:`safe_noise_cost`). The float mechanism's own flaw is chapter 5's subject.
CHAPTER_MECHANISM = "float"


def safe_noise_cost(epsilon: float, sampling_prob: float, num_rounds: int, delta: float, *, num_clients: int) -> dict:
    """What the chapter's choice of the float mechanism saves: the noise multiplier for client-level
    ``(epsilon, delta)`` after ``num_rounds`` rounds at sampling rate ``sampling_prob`` from the float accountant
    (amplification by sampling, Mironov et al. 2019) and from the safe one (no amplification), and their ratio.
    Returns ``{"float": z, "safe": z, "ratio": safe / float}``; raises ``ValueError`` as
    :func:`fedlab.privacy.dp_fedavg.noise_multiplier_for_epsilon` does."""
    zf = dpf.noise_multiplier_for_epsilon(epsilon, sampling_prob, num_rounds, delta, num_clients=num_clients, safe=False)
    zs = dpf.noise_multiplier_for_epsilon(epsilon, sampling_prob, num_rounds, delta, num_clients=num_clients, safe=True)
    return {"float": zf, "safe": zs, "ratio": zs / zf}
# chapter 1c's main numbers (the attacks), name -> label, for the over-seeds summary figure (plots.record_errorbars)
SUMMARY_LABELS = {
    "mia_auc_last": "MIA AUC, last round",
    "mia_auc_avg10": "MIA AUC, last 10 rounds",
    "auc_peak": "MIA AUC, best single round",
    "auc_floor": "MIA AUC, chance floor (shuffled labels)",
    "pa_lira_fixed_auc": "LiRA (shadow federations), AUC",
    "pa_lira_fixed_tpr1": "LiRA, TPR at 1 % FPR",
    "pa_loss_last_tpr1": "last-round loss, TPR at 1 % FPR",
    "wb_diff": "white-box − black-box AUC",
    "act_server_p_auc": "server, passive (AUC)",
    "act_server_isolating_p_auc": "server, isolating (AUC)",
    "d_iso_p": "isolating − passive server (AUC)",
    "act_server_isolating_g2_auc": "isolating, ascent γ = 2 (AUC)",
    "act_participant_p_auc": "participant, passive (AUC)",
    "act_participant_g5_auc": "participant, ascent γ = 5 (AUC)",
    "act_floor": "active attacks, chance floor (AUC)",
}
# chapter 1d's main numbers (the defenses), name -> label, for its over-seeds summary figure
DEFENSE_SUMMARY_LABELS = {
    "dp_auc_small": "DP-FedAvg, ε = 0.5, 10 clients: MIA AUC",
    "dp_acc_small": "DP-FedAvg, ε = 0.5, 10 clients: test accuracy",
    "lo2": "local-only, 2 classes",
    "ce2": "Centaur, 2 classes",
    "ft2": "DP-FedAvg + FT, 2 classes",
    "ce_minus_lo2": "Centaur − local-only, 2 classes",
    "ce_minus_ft2": "Centaur − DP-FedAvg + FT, 2 classes",
    "ce_minus_ft10": "Centaur − DP-FedAvg + FT, 10 classes",
    "pe_ce_minus_lo_0p5": "Centaur − local-only, ε = 0.5",
    "pe_ce_minus_ft_0p5": "Centaur − DP-FedAvg + FT, ε = 0.5",
}
# (the SNR ratio of the representation, a ratio around 1.6, is quoted in the text with its record: on this
# figure's axis of accuracies, AUCs and rates it squeezed every other row into a third of the width)


# ---------------------------------------------------------------------------------------------------
# passive attack: one snapshot vs many (Nasr et al. 2019, Sec. IV-C; lecture "multiple observations")
# ---------------------------------------------------------------------------------------------------

def window_values(auc_w: Mapping[str, Mapping[int, float]], best_w: int, *, w_lecture: int = 10,
                  floor: float | None = None) -> dict:
    """The numbers the chapter quotes from the passive window sweep (Nasr et al. 2019, Sec. IV-C).

    ``auc_w``: ``{"loss": {W: AUC}, "grad_norm": {W: AUC}}`` (mean over clients of
    :func:`fedlab.attacks.membership.attack_auc`); ``best_w`` the window with the best loss AUC.
    Returns unrounded ``{name: value}``: ``auc_last``, ``auc_w10``, ``auc_best``, ``best_w``,
    ``auc_grad_last``, ``auc_grad_best``, the table's ``mia_auc_last``, ``mia_auc_avg10``, their
    difference ``mia_auc_avg10_minus_last``, and ``auc_floor`` when the chance ``floor`` is given
    (:func:`fedlab.metrics.auc_permutation_floor`).

    Raises ``ValueError`` if ``auc_w`` lacks a signal, or the windows 1, ``w_lecture`` or ``best_w``.
    """
    for s in ("loss", "grad_norm"):
        if s not in auc_w:
            raise ValueError(f"auc_w must hold the signal {s!r}, got {sorted(auc_w)}")
    for w in (1, w_lecture, best_w):
        if w not in auc_w["loss"]:
            raise ValueError(f"auc_w['loss'] has no window {w} (w_lecture / best_w), got {sorted(auc_w['loss'])}")
    if 1 not in auc_w["grad_norm"]:
        raise ValueError("auc_w['grad_norm'] must hold the window 1")
    loss, gn = auc_w["loss"], auc_w["grad_norm"]
    out = {"auc_last": loss[1], "auc_w10": loss[w_lecture], "auc_best": loss[best_w], "best_w": int(best_w),
           "auc_grad_last": gn[1], "auc_grad_best": max(gn.values()),
           "mia_auc_last": loss[1], "mia_auc_avg10": loss[w_lecture], "mia_auc_avg10_minus_last": loss[w_lecture] - loss[1]}
    if floor is not None:
        out["auc_floor"] = float(floor)
    return out


def window_table(auc_loss: Mapping[int, float], best_w: int, paper: Callable[[str], str], *,
                 w_lecture: int = 10, floor: float | None = None):
    """The lecture's "multiple observations" comparison as a Markdown table: the lecture's AUC
    (:data:`LECTURE_WINDOW_AUC`), ours (rounded to 3 decimals), the stored paper-scale record
    (``paper(name)``, e.g. :meth:`fedlab.records.Run.stored`), a row for the best window here and,
    when given, one for the chance ``floor`` (95th percentile of the AUC with shuffled labels). Raises ``ValueError`` if ``auc_loss`` lacks the window 1, ``w_lecture`` or ``best_w``."""
    from ..plots import md_table

    for w in (1, w_lecture, best_w):
        if w not in auc_loss:
            raise ValueError(f"auc_loss has no window {w}, got {sorted(auc_loss)}")
    rows = [["last round only", LECTURE_WINDOW_AUC[1], round(auc_loss[1], 3), paper("mia_auc_last")],
            [f"average of the last {w_lecture} rounds", LECTURE_WINDOW_AUC.get(w_lecture, "-"), round(auc_loss[w_lecture], 3),
             paper("mia_auc_avg10")],
            [f"average of the last {best_w} rounds (best window here)", "-", round(auc_loss[best_w], 3), "-"]]
    if floor is not None:
        rows.append(["chance floor (95th percentile, shuffled labels)", "-", round(float(floor), 3), paper("auc_floor")])
    return md_table(["loss signal", "paper AUC", "ours AUC", "ours, paper scale (mean ± 95 % CI)"], rows)


# ---------------------------------------------------------------------------------------------------
# the passive attack over training: per-round AUC, windows moving back, gradient norms (lecture
# "white-box access" figure), and white-box vs black-box (Nasr et al. 2019, Sec. IV, Table IV)
# ---------------------------------------------------------------------------------------------------

def passive_curves(signals: Mapping[str, torch.Tensor], is_member, *, width: int = 5,
                   lags: Sequence[int] = (5, 10, 20, 30)) -> dict:
    """The passive server attack over training (Nasr et al. 2019, Sec. IV-C), from the client signals
    ``{"loss": [K, T, r], "grad_norm": [K, T, r]}`` of :func:`fedlab.attacks.membership.client_signals`
    and the membership labels ``is_member`` ``[r]``.

    Returns ``{"round_auc": {signal: [T]}`` (AUC of the round-``t`` signal, mean over clients,
    :func:`fedlab.attacks.membership.round_auc`), ``"lag_auc": {W: AUC}`` (the score averaged over the
    ``width`` rounds ``T-W+1 .. T-W+width``, i.e. ending ``W - width`` rounds before the last, for every
    ``W`` of ``lags`` with ``width <= W <= T``), ``"first_window_auc"`` (the same score on rounds
    ``1 .. width``), ``"gn_member"``, ``"gn_nonmember"`` (``[T]``: the mean
    last-layer gradient norm of members and of non-members each round, over clients and records)}.
    Raises ``ValueError`` for a missing signal or a ``width`` above ``T``.
    """
    for s in ("loss", "grad_norm"):
        if s not in signals or signals[s].ndim != 3:
            raise ValueError(f"signals must hold {s!r} as [K, T, r], got {sorted(signals)}")
    T = signals["loss"].shape[1]
    width = positive_int("width", width)
    if width > T:
        raise ValueError(f"width ({width}) must not exceed the number of rounds T = {T}")
    mem = torch.as_tensor(np.asarray(is_member) > 0.5)
    slide = mia.round_auc(signals["loss"], is_member, width)        # entry j: rounds j+1 .. j+width
    G = signals["grad_norm"]
    return {"round_auc": {s: mia.round_auc(signals[s], is_member) for s in ("loss", "grad_norm")},
            "lag_auc": {int(W): float(slide[T - W]) for W in lags if width <= W <= T}, "first_window_auc": float(slide[0]),
            "gn_member": G[:, :, mem].mean((0, 2)).numpy(), "gn_nonmember": G[:, :, ~mem].mean((0, 2)).numpy()}


def passive_curve_values(curves: Mapping) -> dict:
    """``{name: value}`` the chapter quotes from :func:`passive_curves` (unrounded): the loss AUC of the
    first round ``auc_round1``, its peak ``auc_peak`` at round ``peak_round``, the last round
    ``auc_round_last``, the lowest round ``auc_round_min``; the five-round windows ``lag_auc_<W>`` and
    ``lag_auc_first`` (the first rounds), and
    the ratio of the members' to the non-members' mean gradient norm in the first and last rounds
    (``gn_ratio_first``, ``gn_ratio_last``)."""
    la = np.asarray(curves["round_auc"]["loss"])
    ratio = np.asarray(curves["gn_member"]) / np.asarray(curves["gn_nonmember"])
    out = {"auc_round1": float(la[0]), "auc_peak": float(la.max()), "peak_round": int(la.argmax()) + 1,
           "auc_round_last": float(la[-1]), "auc_round_min": float(la.min()),
           "gn_ratio_first": float(ratio[0]), "gn_ratio_last": float(ratio[-1])}
    out.update({f"lag_auc_{W}": v for W, v in curves["lag_auc"].items()}, lag_auc_first=curves["first_window_auc"])
    return out


def plot_passive_curves(curves: Mapping, floor: float):
    """Two panels: the per-round AUC of both signals with the chance ``floor`` (dashed), and the mean
    last-layer gradient norm of members and non-members over the rounds (the lecture's figure,
    Nasr et al. 2019, Fig. 5). Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    from ..plots import line_plot

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    t = np.arange(1, len(curves["gn_member"]) + 1)
    ra = curves["round_auc"]
    line_plot(t, {"loss": ra["loss"], "last-layer gradient norm": ra["grad_norm"]}, ax=axes[0], xlabel="round t",
              ylabel="attack AUC (mean over clients)", title="Passive server attack, round by round")
    axes[0].axhline(floor, ls="--", c="gray", lw=1, label="chance floor (95 %)")
    axes[0].legend()
    line_plot(t, {"members": curves["gn_member"], "non-members": curves["gn_nonmember"]}, ax=axes[1],
              xlabel="round t", ylabel="mean last-layer gradient norm", title="Gradient norms over training")
    return fig, axes


def white_black_box(signals: Mapping[str, torch.Tensor], is_member) -> dict:
    """Nasr et al. (2019, Sec. IV, Table IV)'s comparison on the last round: a black-box attacker scores a
    record by its loss (the model's *outputs* only), a white-box one by the last-layer gradient norm.
    ``signals``: ``{"loss", "grad_norm"}`` each ``[K, T, r]``; ``is_member``: ``[r]``. Returns
    ``{"black-box (outputs)": [K], "white-box (gradients)": [K]}``: each client's AUC on its own candidates."""
    names = {"black-box (outputs)": "loss", "white-box (gradients)": "grad_norm"}
    for s in names.values():
        if s not in signals or signals[s].ndim != 3:
            raise ValueError(f"signals must hold {s!r} as [K, T, r], got {sorted(signals)}")
    return {name: np.asarray([mia.attack_auc(S_k, is_member, 1) for S_k in signals[s]]) for name, s in names.items()}


def white_black_box_values(wb: Mapping[str, np.ndarray]) -> dict:
    """``wb_black``, ``wb_white`` (mean AUC over clients) and the paired difference white minus black:
    ``wb_diff`` (mean), ``wb_diff_lo``, ``wb_diff_hi`` (95 % t interval over clients)."""
    d = np.asarray(wb["white-box (gradients)"]) - np.asarray(wb["black-box (outputs)"])
    mean, _, ci = t_interval(d)
    ci = ci or (mean, mean)
    return {"wb_black": float(np.mean(wb["black-box (outputs)"])), "wb_white": float(np.mean(wb["white-box (gradients)"])),
            "wb_diff": mean, "wb_diff_lo": ci[0], "wb_diff_hi": ci[1]}


def white_black_box_table(wb: Mapping[str, np.ndarray], floor: float, paper: Callable[[str], str]):
    """The lecture's white-box table (:data:`LECTURE_WHITE_BOX`, accuracy) beside our AUC, mean ± 95 %
    interval over clients, the stored record, and the chance floor (Markdown)."""
    from ..plots import md_table

    tags = {"black-box (outputs)": "wb_black", "white-box (gradients)": "wb_white"}
    rows = [[name, "loss" if "black" in name else "last-layer gradient norm", LECTURE_WHITE_BOX[name],
             mean_interval(wb[name]), paper(tags[name])] for name in tags]
    rows.append(["white-box minus black-box", "paired, per client", round(LECTURE_WHITE_BOX["white-box (gradients)"]
                 - LECTURE_WHITE_BOX["black-box (outputs)"], 3),
                 mean_interval(np.asarray(wb["white-box (gradients)"]) - np.asarray(wb["black-box (outputs)"])),
                 paper("wb_diff")])
    rows.append(["chance floor (95th percentile, shuffled labels)", "-", "-", round(float(floor), 3), "-"])
    return md_table(["attacker", "signal (last round)", "paper accuracy (Purchase100, FC)",
                     "ours AUC (mean ± 95 % CI over clients)", "ours, paper scale (mean ± 95 % CI over seeds)"], rows)


# ---------------------------------------------------------------------------------------------------
# settings that can answer the chapter's questions: last round vs averaged rounds
# in a federation that has not converged, and what the white-box score adds to the black-box one
# ---------------------------------------------------------------------------------------------------

#: the round at which the chapter reads its federation "before convergence": the earliest round at which
#: the lecture's window of 10 rounds fits (the same at both scales: the first rounds of the quick and the
#: paper-scale federation are the same run)
EARLY_ROUND = 10


def _rank_corr_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation of ``a[k]`` and ``b[k]`` for every row ``k`` of two ``[K, r]`` arrays."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(1) * (rb ** 2).sum(1))
    if (den == 0).any():
        raise ValueError("a row of constant scores has no rank correlation")
    return (ra * rb).sum(1) / den


def window_settings(loss: torch.Tensor, is_member, at_rounds: Mapping[str, int], *, windows: Sequence[int] = (1, 10),
                    rates: Sequence[float] = LOW_FPR) -> dict:
    """The passive window attack of Nasr et al. (2019, Sec. IV-C; lecture "multiple observations") on
    the federation as it stood at several rounds: reading the recorded signals up to round ``t`` is the
    federation run for ``t`` rounds (same seed, same draws), so an early ``t`` is a federation that has
    not converged and the last round the converged one.

    ``loss``: ``[K, T, r]`` per-record losses of each client's returned models
    (:func:`fedlab.attacks.membership.client_signals`); ``is_member``: ``[r]``; ``at_rounds``:
    ``{name: t}`` with ``max(windows) <= t <= T``. For every ``name`` returns ``{"round": t, "auc": {W:
    mean AUC over clients}, "tpr": {W: [TPR at each of rates]}`` (pooled over clients, one threshold,
    :func:`fedlab.attacks.membership.attack_tpr_at_fpr`), ``"movement"`` (the mean over clients and records
    of ``|l_t - mean of l over rounds t-W+1..t|`` with ``W = max(windows)``: how far averaging moves a
    record's loss), ``"spread"`` (the mean over clients of the standard deviation of ``l_t`` over the
    records), ``"ratio"`` (movement / spread) and ``"rank_corr"`` (mean over clients of Spearman's
    correlation of the round-``t`` loss with the window's mean loss)}. When ``rank_corr`` is near 1 the
    two scores order the records alike, so their AUCs cannot differ much.

    Raises ``ValueError`` for ``loss`` not ``[K, T, r]``, no ``at_rounds``, a round outside
    ``max(windows)..T`` or a window below 1.
    """
    if not isinstance(loss, torch.Tensor) or loss.ndim != 3:
        raise ValueError(f"loss must be a [K, T, r] tensor, got {getattr(loss, 'shape', type(loss))}")
    if not at_rounds:
        raise ValueError("at_rounds must name at least one round")
    windows = [positive_int("windows", w) for w in windows]
    if not windows:
        raise ValueError("windows must hold at least one window")
    T, W = loss.shape[1], max(windows)
    out = {}
    for name, t in at_rounds.items():
        if int(t) != t or not W <= t <= T:
            raise ValueError(f"at_rounds[{name!r}] must be a round in {W}..{T} (max(windows)..T), got {t}")
        t = int(t)
        S = loss[:, :t].double()                                                  # the federation after t rounds
        last, avg = S[:, -1], S[:, -W:].mean(1)                                   # [K, r]
        movement = float((last - avg).abs().mean())
        spread = float(last.std(1).mean())
        out[name] = {"round": t, "auc": {w: mia.attack_auc(S, is_member, w) for w in windows},
                     "tpr": {w: mia.attack_tpr_at_fpr(S, is_member, list(rates), w) for w in windows},
                     "movement": movement, "spread": spread, "ratio": movement / spread,
                     "rank_corr": float(_rank_corr_rows(last.numpy(), avg.numpy()).mean())}
    return out


def window_settings_values(res: Mapping[str, Mapping], *, rates: Sequence[float] = LOW_FPR) -> dict:
    """``{name: value}`` the chapter quotes from :func:`window_settings` (unrounded), for every setting
    ``s`` (e.g. ``early``, ``conv``): ``ws_<s>_round``, ``ws_<s>_auc<W>`` and ``ws_<s>_tpr<rate>_w<W>``
    per window (rate ``0.01`` written ``1``, ``0.001`` written ``01``, as percent without the point), the
    largest window minus the window 1: ``ws_<s>_dauc``, ``ws_<s>_dtpr<rate>``; and ``ws_<s>_move``,
    ``ws_<s>_spread``, ``ws_<s>_ratio``, ``ws_<s>_rho``. Raises ``ValueError`` for an empty ``res`` or a
    setting without the window 1."""
    if not res:
        raise ValueError("res must hold at least one setting")
    out = {}
    for s, r in res.items():
        if 1 not in r["auc"]:
            raise ValueError(f"res[{s!r}] must hold the window 1")
        W = max(r["auc"])
        out[f"ws_{s}_round"] = int(r["round"])
        for w in r["auc"]:
            out[f"ws_{s}_auc{w}"] = r["auc"][w]
            for rate, v in zip(rates, r["tpr"][w]):
                out[f"ws_{s}_tpr{_rate_tag(rate)}_w{w}"] = v
        out[f"ws_{s}_dauc"] = r["auc"][W] - r["auc"][1]
        for i, rate in enumerate(rates):
            out[f"ws_{s}_dtpr{_rate_tag(rate)}"] = r["tpr"][W][i] - r["tpr"][1][i]
        out.update({f"ws_{s}_move": r["movement"], f"ws_{s}_spread": r["spread"], f"ws_{s}_ratio": r["ratio"],
                    f"ws_{s}_rho": r["rank_corr"]})
    return out


def _rate_tag(rate: float) -> str:
    return f"{100 * rate:g}".replace("0.", "0")


def window_settings_table(res: Mapping[str, Mapping], labels: Mapping[str, str], paper: Callable[[str], str], *,
                          rates: Sequence[float] = LOW_FPR):
    """:func:`window_settings` as a Markdown table with one column per setting (``labels[name]`` heads it)
    and one row per measure: the round read, the AUC and the TPR at the last of ``rates`` for the window 1
    and the largest window, the movement, the spread and the rank correlation (this build), and the stored
    record's AUC difference (``paper("ws_<name>_dauc")``, mean ± 95 % CI over seeds). Measures as rows keep
    the table as narrow as the settings are few, so that it fits the page."""
    from ..plots import md_table

    W = max(next(iter(res.values()))["auc"])
    pct = f"{100 * rates[-1]:g} %"
    measures = [("read at round", lambda r, s: r["round"]),
                ("AUC, window W = 1", lambda r, s: round(r["auc"][1], 3)),
                (f"AUC, window W = {W}", lambda r, s: round(r["auc"][W], 3)),
                (f"TPR at {pct} FPR, W = 1", lambda r, s: round(r["tpr"][1][-1], 3)),
                (f"TPR at {pct} FPR, W = {W}", lambda r, s: round(r["tpr"][W][-1], 3)),
                ("loss movement over the window", lambda r, s: f"{r['movement']:.3g}"),
                ("between-record spread", lambda r, s: round(r["spread"], 3)),
                ("rank correlation of the two scores", lambda r, s: round(r["rank_corr"], 3)),
                (f"AUC W = {W} − W = 1, paper scale (mean ± 95 % CI)", lambda r, s: paper(f"ws_{s}_dauc"))]
    return md_table(["measure", *(labels.get(s, s) for s in res)],
                    [[name, *(f(r, s) for s, r in res.items())] for name, f in measures])


def white_box_factors(model, client_params: Mapping[str, torch.Tensor], X: torch.Tensor, y: torch.Tensor,
                      grad_norm: torch.Tensor | None = None) -> dict:
    """The two factors of the last-layer gradient norm that the white-box attack of Nasr et al. (2019,
    Sec. IV, Table IV) thresholds. For softmax outputs ``p`` and the last layer's input ``h`` the
    gradient of the cross-entropy with respect to the last (linear) layer is ``(p - e_y) [h; 1]^T``, so
    its norm is ``||p - e_y||_2 * ||[h; 1]||_2``: an *output* factor, a function of what a black-box
    attacker sees, times an *activation* factor, the only white-box information in the score.

    ``client_params``: stacked ``{name: [K, ...]}`` (one model per client, e.g. the last round of a
    :class:`~fedlab.attacks.membership.SnapshotRecorder`); ``X``: ``[K, r, ...]``, ``y``: ``[K, r]``
    (client ``k``'s candidates). ``grad_norm`` (optional, ``[K, r]``): the measured last-layer gradient
    norms, compared with the product. Returns ``{"output": [K, r], "activation": [K, r]}`` and, with
    ``grad_norm``, ``"rel_error"`` and ``"max_rel_error"`` (the median and the largest relative gap between
    the product and ``grad_norm``: float32 rounding makes the largest one grow where a member's gradient is
    tiny; a missing factor moves the median).
    Raises ``ValueError`` if the model's last module is not ``nn.Linear`` or the shapes disagree.
    """
    from torch import nn
    from torch.func import functional_call

    last = list(model.modules())[-1]
    if not isinstance(last, nn.Linear):
        raise ValueError(f"the model's last module must be nn.Linear, got {type(last).__name__}")
    K = X.shape[0]
    if y.shape[:2] != X.shape[:2] or any(v.shape[0] != K for v in client_params.values()):
        raise ValueError(f"X [K, r, ...], y [K, r] and client_params [K, ...] must agree on K and r, got "
                         f"{tuple(X.shape[:2])}, {tuple(y.shape[:2])}")
    seen = []
    hook = last.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    try:
        outs = [functional_call(model, {k: v[i] for k, v in client_params.items()}, (X[i],)).detach()
                for i in range(K)]
    finally:
        hook.remove()
    p = torch.softmax(torch.stack(outs).double(), -1)                              # [K, r, C]
    out_f = (p - torch.nn.functional.one_hot(y.long(), p.shape[-1]).double()).norm(dim=-1)
    act_f = torch.sqrt((torch.stack(seen).double() ** 2).sum(-1) + 1.0)            # [K, r]
    res = {"output": out_f, "activation": act_f}
    if grad_norm is not None:
        if grad_norm.shape != out_f.shape:
            raise ValueError(f"grad_norm must be [K, r] = {tuple(out_f.shape)}, got {tuple(grad_norm.shape)}")
        g = grad_norm.double()
        rel = (out_f * act_f - g).abs() / g.clamp_min(1e-12)
        res["rel_error"], res["max_rel_error"] = float(rel.median()), float(rel.max())
    return res


def white_box_evidence(signals: Mapping[str, torch.Tensor], factors: Mapping[str, torch.Tensor], is_member) -> dict:
    """Why the last-round comparison of :func:`white_black_box` cannot separate a white-box from a
    black-box attacker here: ``wbe_rho`` and ``wbe_rho_min`` (mean and smallest over clients of Spearman's
    correlation of the last-round loss with the last-round gradient norm over the client's candidates),
    and the AUC of each factor of the gradient norm (:func:`white_box_factors`; lower = member):
    ``wbe_auc_output`` (what a black-box attacker also has) and ``wbe_auc_activation`` (the white-box
    part alone), means over clients. ``signals``: ``{"loss", "grad_norm"}`` each ``[K, T, r]``;
    ``factors``: ``{"output", "activation"}`` each ``[K, r]``; ``is_member``: ``[r]``.
    Raises ``ValueError`` for a missing signal or factor."""
    for s in ("loss", "grad_norm"):
        if s not in signals or signals[s].ndim != 3:
            raise ValueError(f"signals must hold {s!r} as [K, T, r], got {sorted(signals)}")
    for f in ("output", "activation"):
        if f not in factors:
            raise ValueError(f"factors must hold {f!r}, got {sorted(factors)}")
    rho = _rank_corr_rows(signals["loss"][:, -1].double().numpy(), signals["grad_norm"][:, -1].double().numpy())
    lab = np.asarray(is_member)
    auc = {f: float(np.mean([roc_auc(lab, -row) for row in factors[f].numpy()])) for f in ("output", "activation")}
    return {"wbe_rho": float(rho.mean()), "wbe_rho_min": float(rho.min()),
            "wbe_auc_output": auc["output"], "wbe_auc_activation": auc["activation"]}

# ---------------------------------------------------------------------------------------------------
# learned attack on the signal history (Nasr et al. 2019, Sec. IV-C; lecture "MIA performance in FL")
# ---------------------------------------------------------------------------------------------------

def learned_attack_sweep(signals: Mapping[str, torch.Tensor], is_member, epoch_sets: Sequence[Sequence[int]],
                         num_rounds: int, *, total_epochs: int = 300, seed: int = 0) -> list[dict]:
    """Nasr et al. (2019)'s learned attack (simplified: :func:`fedlab.attacks.membership.attack_model_auc`)
    on the losses and last-layer gradient norms at a few observed rounds.

    ``signals``: ``{"loss": [K, T, 2n], "grad_norm": [K, T, 2n]}`` with ``T = num_rounds``;
    ``is_member``: ``[2n]`` (the same for every client). Each entry of ``epoch_sets`` (epochs out of
    ``total_epochs``, as in the lecture's table) is scaled to rounds ``max(1, round(e * T / total_epochs))``;
    the features of a candidate are its two signals at those rounds, and the attack is fit on half
    of the ``K * 2n`` candidates and scored on the rest.

    Returns one dict per epoch set, in order: ``{"epochs", "rounds", "accuracy", "auc", "floor"}``: the
    accuracy of a threshold chosen on the fitting half, the AUC on the other half, and that AUC's
    chance floor (95th percentile with shuffled labels).
    Raises ``ValueError`` for a missing signal, a signal whose round axis is not ``num_rounds``, or
    ``total_epochs < 1``.
    """
    num_rounds = positive_int("num_rounds", num_rounds)
    total_epochs = positive_int("total_epochs", total_epochs)
    for s in ("loss", "grad_norm"):
        if s not in signals:
            raise ValueError(f"signals must hold {s!r}, got {sorted(signals)}")
        if signals[s].ndim != 3 or signals[s].shape[1] != num_rounds:
            raise ValueError(f"signals[{s!r}] must be [K, num_rounds = {num_rounds}, r], got {tuple(signals[s].shape)}")
    feats = torch.cat([signals["loss"], signals["grad_norm"]], dim=1)           # [K, 2T, 2n]
    labels = np.tile(np.asarray(is_member), feats.shape[0])
    out = []
    for epochs in epoch_sets:
        rounds = sorted({max(1, round(e * num_rounds / total_epochs)) for e in epochs})
        cols = [r - 1 for r in rounds] + [num_rounds + r - 1 for r in rounds]
        F = feats[:, cols, :].permute(0, 2, 1).reshape(-1, len(cols)).numpy()
        res = mia.attack_model_auc(F, labels, seed=seed)
        out.append({"epochs": tuple(epochs), "rounds": tuple(rounds), "accuracy": res["accuracy"], "auc": res["auc"],
                    "floor": res["floor"]})
    return out


def learned_attack_values(learned: Sequence[dict]) -> dict:
    """``{name: value}`` the chapter quotes from :func:`learned_attack_sweep` (unrounded): per row
    ``mia_epochs<last epoch>_acc`` / ``_auc``, then ``learned_first``, ``learned_last`` (accuracy of
    the first and last row) and ``learned_min_auc``. Raises ``ValueError`` for no rows."""
    if not learned:
        raise ValueError("learned must hold at least one row")
    out = {}
    for r in learned:
        out[f"mia_epochs{r['epochs'][-1]}_acc"] = r["accuracy"]
        out[f"mia_epochs{r['epochs'][-1]}_auc"] = r["auc"]
    out.update(learned_first=learned[0]["accuracy"], learned_last=learned[-1]["accuracy"],
               learned_min_auc=min(r["auc"] for r in learned))
    return out


def learned_attack_table(learned: Sequence[dict], paper_accuracy: Mapping, paper: Callable[[str], str]):
    """The lecture's "MIA performance in FL" table beside ours (Markdown): ``paper_accuracy`` maps an
    epoch set to the lecture's attack accuracy; ``paper(name)`` quotes the stored paper-scale record;
    the last column is the chance floor of our AUC (95th percentile with shuffled labels)."""
    from ..plots import md_table

    rows = []
    for r in learned:
        tag = f"mia_epochs{r['epochs'][-1]}"
        rows.append([", ".join(map(str, r["epochs"])), paper_accuracy.get(r["epochs"], "-"),
                     ", ".join(map(str, r["rounds"])), round(r["accuracy"], 3), round(r["auc"], 3),
                     paper(tag + "_acc"), paper(tag + "_auc"), round(r["floor"], 3)])
    return md_table(["paper epochs", "paper accuracy", "our rounds", "our accuracy (held-out threshold)", "our AUC",
                     "our accuracy, paper scale (mean ± 95 % CI)", "our AUC, paper scale", "AUC chance floor"], rows)


# ---------------------------------------------------------------------------------------------------
# active gradient-ascent attack (Nasr et al. 2019, Sec. V-B, Table XI)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ActiveGrid:
    """The attacks of :func:`active_attack_sweep`: Nasr et al. (2019, Sec. V-B, Table XI) passive and
    gradient-ascent attackers, every variant at every step against every target.

    ``variants``
        ``{name: settings}``, each the ``attacker`` (and ``isolate``) of a
        :class:`fedlab.attacks.membership.ActiveAttack`, e.g. ``{"server": {"attacker": "server"},
        "server, isolating": {"attacker": "server", "isolate": True}, "participant": {"attacker": "participant"}}``
        (a participant attacker is client ``target + 1``).
    ``ascent_lrs``
        the steps ``gamma > 0`` of the gradient ascent (the passive attack, ``gamma = 0``, always runs too);
        Nasr et al. give none.
    ``targets``
        the client indices attacked, at least two (every target's threshold is chosen on the others).

    Raises ``ValueError`` naming the field for no variants or a variant that is not an attacker's settings
    (an unknown ``attacker``, an ``isolate`` that is not a bool), no step or one not a finite number ``> 0``,
    fewer than two targets, a negative or non-integer one or the same target twice.
    """

    variants: Mapping[str, Mapping]
    ascent_lrs: Sequence[float]
    targets: Sequence[int]

    def __post_init__(self):
        if not self.variants:
            raise ValueError("ActiveGrid.variants must name at least one attacker")
        for name, kw in self.variants.items():
            if not set(kw) <= {"attacker", "isolate"} or "attacker" not in kw:
                raise ValueError(f"ActiveGrid.variants[{name!r}] must give 'attacker' (and 'isolate'), got {dict(kw)}")
            other = {"attacker_index": 1} if kw["attacker"] == "participant" else {}
            try:
                mia.ActiveAttack(target=0, ascent_lr=0.0, **kw, **other)
            except ValueError as e:
                raise ValueError(f"ActiveGrid.variants[{name!r}]: {e}") from None
        given = list(self.ascent_lrs)
        try:
            lrs = tuple(finite_positive("ActiveGrid.ascent_lrs", g) for g in given)
        except ValueError:
            lrs = ()
        if not lrs:
            raise ValueError(f"ActiveGrid.ascent_lrs must be a non-empty list of finite steps > 0, got {given}")
        targets = tuple(self.targets)
        try:
            ints = [whole_int("ActiveGrid.targets", k, low=0) for k in targets]
        except ValueError:
            ints = []
        if len(ints) < 2 or len(set(ints)) < len(ints):
            raise ValueError(f"ActiveGrid.targets must list at least two distinct client indices, got {list(targets)}")
        object.__setattr__(self, "variants", {k: dict(v) for k, v in self.variants.items()})
        object.__setattr__(self, "ascent_lrs", lrs)
        object.__setattr__(self, "targets", tuple(int(k) for k in targets))


def active_attack_sweep(model, clients, params: dict, cand_X: torch.Tensor, cand_y: torch.Tensor, is_member, *,
                        attacks: ActiveGrid, num_rounds: int, seed: int = 0, local: LocalTraining = LocalTraining()) -> dict:
    """Nasr et al. (2019, Sec. V-B) passive and gradient-ascent attacks, for each attacker variant and
    every target client (``attacks``, an :class:`ActiveGrid`).

    For every ``name, kw`` of ``attacks.variants`` (the attacker's settings of a
    :class:`fedlab.attacks.membership.ActiveAttack`, e.g. ``{"attacker": "server", "isolate": True}``),
    every ``gamma`` of ``(0, *attacks.ascent_lrs)`` and every target ``k`` of ``attacks.targets``: ``num_rounds``
    FedAvg rounds from ``params`` (``seed`` fixes them, the same batches for every variant; a participant
    attacker is client ``k + 1``), scored on client ``k``'s candidates ``cand_X[k], cand_y[k]``
    (``[K, 2n, ...]``, ``[K, 2n]``) by minus the loss averaged over the rounds. ``local``: the clients'
    :class:`fedlab.fl.LocalTraining` (epochs, batch size, step and loss).

    Returns ``{"auc": {(name, gamma): [U]}, "accuracy": {(name, gamma): [U]}, "auc_learned": {(name, gamma): [U]},
    "tpr": {(name, gamma): {"mean loss": [..], "learned": [..]}}, "fpr": LOW_FPR, "floor": float,
    "drop": {(name, gamma): {"auc": [U], "member": [U], "nonmember": [U]}}}``: per
    target the AUC against ``is_member`` ``[2n]``, the balanced accuracy of a threshold chosen on the
    *other* targets' candidates (:func:`fedlab.attacks.membership.leave_one_out_accuracy`); the AUC of
    Nasr et al.'s learned attack (:func:`fedlab.attacks.membership.learned_loo_scores`: a classifier on the
    loss of the model the target received and of the model it returned at every attack round, trained on
    the other targets' candidates); both scores' TPR at the false-positive rates :data:`LOW_FPR`, pooled
    over the targets with one threshold (:func:`fedlab.metrics.tpr_at_fpr`); and the chance floor of the
    mean AUC over the ``U`` targets (:func:`fedlab.metrics.auc_permutation_floor`); the *loss drop*, the loss
    of the model the target received minus the loss of the model observed (for the server: the model the
    target returned), averaged over the attack rounds: per target the AUC of the drop taken as a membership
    score and the members' and non-members' mean drops.
    Raises ``ValueError`` for a target that is not a client (and :class:`ActiveGrid` for its fields).
    """
    from ..metrics import auc_permutation_floor, roc_auc, tpr_at_fpr

    if not isinstance(attacks, ActiveGrid):
        raise ValueError(f"attacks must be an ActiveGrid, got {attacks!r}")
    targets, variants, ascent_lrs = list(attacks.targets), attacks.variants, list(attacks.ascent_lrs)
    num_clients = cand_X.shape[0]
    if any(not 0 <= k < num_clients for k in targets):
        raise ValueError(f"targets must list at least two clients in 0..{num_clients - 1}, got {targets}")
    num_rounds = positive_int("num_rounds", num_rounds)
    cells = [(name, gamma) for name in variants for gamma in [0.0, *ascent_lrs]]
    runs = []
    for name, gamma in cells:
        kw = variants[name]
        for k in targets:
            extra = {"attacker_index": (k + 1) % num_clients} if kw["attacker"] == "participant" else {}
            runs.append(dict(X_target=cand_X[k], y_target=cand_y[k], target=k, ascent_lr=gamma, **kw, **extra))
    # mia.active_attack_rounds for every (variant, gamma, target), all runs' clients trained in one vmap
    local = _local(local)
    traces = iter(mia.active_attack_runs(model, clients, params, runs, num_rounds=num_rounds, local=local, seed=seed,
                                         return_trace=True))
    out = {"auc": {}, "accuracy": {}, "auc_learned": {}, "tpr": {}, "fpr": tuple(LOW_FPR), "drop": {}}
    labels = np.tile(np.asarray(is_member), len(targets))
    mem = np.asarray(is_member) > 0.5
    for cell in cells:
        scores, feats, drops = [], [], []
        for k in targets:
            tr = next(traces)
            with torch.no_grad():
                sent = torch.stack([mia.per_example_loss(model, rec, cand_X[k], cand_y[k], local.loss_fn)
                                    for rec in tr["received"]])
            scores.append(mia.membership_score(tr["signals"], num_rounds).numpy())
            feats.append(torch.cat([sent, tr["signals"]]).T.numpy())       # [2n, 2R]: sent and observed losses
            drops.append((sent - tr["signals"]).mean(0).numpy())           # [2n]: received minus returned loss
        scores, feats, drops = np.stack(scores), np.stack(feats), np.stack(drops)   # [U, 2n], [U, 2n, 2R], [U, 2n]
        out["drop"][cell] = {"auc": np.asarray([roc_auc(is_member, d) for d in drops]),
                             "member": drops[:, mem].mean(1), "nonmember": drops[:, ~mem].mean(1)}
        learned = mia.learned_loo_scores(feats, is_member)
        out["auc"][cell] = np.asarray([roc_auc(is_member, s) for s in scores])
        out["accuracy"][cell] = mia.leave_one_out_accuracy(is_member, scores)[0]
        out["auc_learned"][cell] = np.asarray([roc_auc(is_member, s) for s in learned])
        out["tpr"][cell] = {"mean loss": tpr_at_fpr(labels, scores.ravel(), list(LOW_FPR)),
                            "learned": tpr_at_fpr(labels, learned.ravel(), list(LOW_FPR))}
    out["floor"] = auc_permutation_floor(np.tile(np.asarray(is_member), (len(targets), 1)), scores)
    return out


def _gamma_tag(gamma: float) -> str:
    return "p" if gamma == 0 else "g" + f"{gamma:g}".replace(".", "p")


def active_attack_name(name: str, gamma: float, stat: str = "auc") -> str:
    """The glue name of one cell of the active-attack table: ``act_<variant>_<p|g<gamma>>_<stat>``,
    e.g. ``act_server_isolating_g2_auc`` (``p``: passive, ``gamma = 0``; ``0.5`` is written ``0p5``)."""
    return f"act_{name.replace(', ', '_')}_{_gamma_tag(gamma)}_{stat}"


def active_attack_values(sweep: Mapping) -> dict:
    """``{name: value}`` the chapter quotes from :func:`active_attack_sweep` (unrounded): every cell's mean
    AUC and mean held-out accuracy over targets (:func:`active_attack_name` with ``stat`` ``auc`` / ``hacc``),
    the paired differences over targets ``d_<variant>_<gamma>`` (mean) with ``_lo`` / ``_hi`` (95 % t
    interval) of each ascent against the same variant's passive attack, and ``d_iso_p``: the isolating
    passive attack minus the server's passive one, both over the same targets; ``act_floor``; the
    largest and smallest ascent gains ``d_ascent_max``, ``d_ascent_min``.
    Raises ``ValueError`` if the server or the isolating server is missing."""
    auc = sweep["auc"]
    for v in ("server", "server, isolating"):
        if (v, 0.0) not in auc:
            raise ValueError(f"sweep lacks the passive {v!r} attack: {sorted(auc)}")
    out = {}
    gains = []
    for (name, gamma), a in auc.items():
        out[active_attack_name(name, gamma)] = float(np.mean(a))
        out[active_attack_name(name, gamma, "hacc")] = float(np.mean(sweep["accuracy"][(name, gamma)]))
        if gamma > 0:
            m, _, ci = t_interval(np.asarray(a) - np.asarray(auc[(name, 0.0)]))
            tag = active_attack_name(name, gamma, "d")
            out.update({tag: m, tag + "_lo": (ci or (m, m))[0], tag + "_hi": (ci or (m, m))[1]})
            gains.append(m)
    m, _, ci = t_interval(np.asarray(auc[("server, isolating", 0.0)]) - np.asarray(auc[("server", 0.0)]))
    out.update(d_iso_p=m, d_iso_p_lo=(ci or (m, m))[0], d_iso_p_hi=(ci or (m, m))[1], act_floor=float(sweep["floor"]))
    if gains:
        out.update(d_ascent_max=max(gains), d_ascent_min=min(gains))
    return out


def active_attack_table(sweep: Mapping, paper: Callable[[str], str]):
    """Nasr et al. (2019) Table XI (AlexNet row, :data:`LECTURE_ACTIVE_ACCURACY`, attack accuracy) beside
    ours, one row per attacker and ascent step (Markdown): our AUC and held-out accuracy (mean ± 95 %
    interval over targets), the AUC gain over the same attacker's passive attack (paired over targets),
    the stored paper-scale record's AUC, and a last row with the chance floor of the mean AUC."""
    from ..plots import md_table

    rows = []
    for (name, gamma), a in sweep["auc"].items():
        passive = np.asarray(sweep["auc"][(name, 0.0)])
        rows.append([name, "passive" if gamma == 0 else f"gradient ascent, γ = {gamma:g}",
                     LECTURE_ACTIVE_ACCURACY.get((name, gamma > 0), "-"), mean_interval(a),
                     mean_interval(sweep["accuracy"][(name, gamma)]),
                     "-" if gamma == 0 else mean_interval(np.asarray(a) - passive), paper(active_attack_name(name, gamma))])
    rows.append(["chance floor (95th percentile, shuffled labels)", "-", "-", round(float(sweep["floor"]), 3), "-", "-",
                 paper("act_floor")])
    return md_table(["attacker", "mode", "paper accuracy", "ours AUC", "ours accuracy (held-out threshold)",
                     "AUC − passive (paired)", "ours AUC, paper scale (mean ± 95 % CI over seeds)"], rows)


def heldout_gamma(sweep: Mapping, stat: str = "auc") -> dict:
    """The ascent step chosen on held-out targets: the ``U`` targets of :func:`active_attack_sweep` are split
    into their first and second half (two folds); on each fold the step ``gamma > 0`` with the best mean
    ``stat`` (``"auc"``: the fixed score, ``"auc_learned"``: the learned attack) is chosen, and the *other*
    fold's targets are scored with it. Every target's gain over the same attacker's passive attack is thus
    measured at a step chosen without it (cross-fitting), which a step picked as the best of the table is not.

    Returns ``{variant: {"gammas": (step chosen on the first half, step chosen on the second half),
    "gain": [U]}}``, ``gain[u]`` being target ``u``'s AUC at the step chosen on the other half minus its
    passive AUC. Raises ``ValueError`` for an unknown ``stat``, fewer than four targets, or a variant
    without a passive cell or an ascent step."""
    if stat not in ("auc", "auc_learned"):
        raise ValueError(f"stat must be 'auc' or 'auc_learned', got {stat!r}")
    table = sweep[stat]
    out = {}
    for name in dict.fromkeys(v for v, _ in table):
        gammas = sorted(g for v, g in table if v == name and g > 0)
        if (name, 0.0) not in table or not gammas:
            raise ValueError(f"variant {name!r} needs a passive cell and at least one ascent step")
        U = len(table[(name, 0.0)])
        if U < 4:
            raise ValueError(f"heldout_gamma needs at least four targets (two per half), got {U}")
        halves = [np.arange(U // 2), np.arange(U // 2, U)]
        passive = np.asarray(table[(name, 0.0)])
        gain = np.empty(U)
        chosen = []
        for fit, score in (halves, halves[::-1]):
            g = max(gammas, key=lambda gm: float(np.mean(np.asarray(table[(name, gm)])[fit])))
            chosen.append(g)
            gain[score] = np.asarray(table[(name, g)])[score] - passive[score]
        out[name] = {"gammas": tuple(chosen), "gain": gain}
    return out


def heldout_gamma_values(sweep: Mapping) -> dict:
    """``{name: value}`` from :func:`heldout_gamma` for both scores (unrounded): per variant
    ``hg_<variant>_<auc|lauc>`` (the mean cross-fitted gain over targets) with ``_lo`` / ``_hi`` (95 % t
    interval over targets) and the steps chosen on the two halves, ``..._gamma_a`` / ``..._gamma_b``;
    ``hg_max`` / ``hg_min``: the largest and smallest mean gain over variants and scores."""
    out, gains = {}, []
    for stat, tag in (("auc", "auc"), ("auc_learned", "lauc")):
        for name, r in heldout_gamma(sweep, stat).items():
            m, _, ci = t_interval(r["gain"])
            key = f"hg_{name.replace(', ', '_')}_{tag}"
            out.update({key: m, key + "_lo": (ci or (m, m))[0], key + "_hi": (ci or (m, m))[1],
                        key + "_gamma_a": r["gammas"][0], key + "_gamma_b": r["gammas"][1]})
            gains.append(m)
    out.update(hg_max=max(gains), hg_min=min(gains))
    return out


def heldout_gamma_table(sweep: Mapping, paper: Callable[[str], str]):
    """:func:`heldout_gamma` for both scores as a Markdown table, one row per attacker and score: the steps
    chosen on each half of the targets, the cross-fitted gain over the passive attack (mean ± 95 % interval
    over targets) and the stored paper-scale record's gain (``paper(name)``, over seeds)."""
    from ..plots import md_table

    rows = []
    for stat, label, tag in (("auc", "mean loss", "auc"), ("auc_learned", "learned", "lauc")):
        for name, r in heldout_gamma(sweep, stat).items():
            rows.append([name, label, " / ".join(f"{g:g}" for g in r["gammas"]), mean_interval(r["gain"]),
                         paper(f"hg_{name.replace(', ', '_')}_{tag}")])
    return md_table(["attacker", "score", "γ chosen on 1st / 2nd half of targets",
                     "AUC − passive, γ chosen on the other half", "the same, paper scale (over seeds)"], rows)


def ascent_drop_values(sweep: Mapping) -> dict:
    """``{name: value}`` of the loss drop (received minus returned loss, :func:`active_attack_sweep`) for
    every cell (unrounded): ``drop_<variant>_<p|g<gamma>>_auc`` (the mean over targets of the AUC of the drop
    as a membership score), ``..._mem`` and ``..._non`` (members' and non-members' mean drop)."""
    out = {}
    for (name, gamma), d in sweep["drop"].items():
        tag = active_attack_name(name, gamma, "").replace("act_", "drop_", 1).rstrip("_")
        out.update({tag + "_auc": float(np.mean(d["auc"])), tag + "_mem": float(np.mean(d["member"])),
                    tag + "_non": float(np.mean(d["nonmember"]))})
    return out


def _fpr_tag(rate: float) -> str:
    return f"{100 * rate:g}".replace(".", "p")


def active_learned_values(sweep: Mapping) -> dict:
    """``{name: value}`` the chapter quotes about the learned attack of :func:`active_attack_sweep`
    (unrounded): per cell the learned attack's mean AUC over targets (:func:`active_attack_name` with
    ``stat`` ``lauc``), its paired gain over the same attacker's learned passive attack (``ld``, with ``_lo``
    / ``_hi``: 95 % t interval over targets), and the pooled TPR of both scores at each rate of
    ``sweep["fpr"]`` (``tpr<percent>`` for the mean loss, ``ltpr<percent>`` for the learned score, e.g.
    ``act_server_g2_ltpr1``); ``lgain_max`` / ``lgain_min``: the largest and smallest learned ascent gains;
    ``ltpr<percent>_max``: the learned score's best TPR over the cells at each rate."""
    out, gains = {}, []
    for (name, gamma), a in sweep["auc_learned"].items():
        out[active_attack_name(name, gamma, "lauc")] = float(np.mean(a))
        for i, rate in enumerate(sweep["fpr"]):
            out[active_attack_name(name, gamma, f"tpr{_fpr_tag(rate)}")] = float(sweep["tpr"][(name, gamma)]["mean loss"][i])
            out[active_attack_name(name, gamma, f"ltpr{_fpr_tag(rate)}")] = float(sweep["tpr"][(name, gamma)]["learned"][i])
        if gamma > 0:
            m, _, ci = t_interval(np.asarray(a) - np.asarray(sweep["auc_learned"][(name, 0.0)]))
            tag = active_attack_name(name, gamma, "ld")
            out.update({tag: m, tag + "_lo": (ci or (m, m))[0], tag + "_hi": (ci or (m, m))[1]})
            gains.append(m)
    if gains:
        out.update(lgain_max=max(gains), lgain_min=min(gains))
    for i, rate in enumerate(sweep["fpr"]):
        out[f"ltpr{_fpr_tag(rate)}_max"] = max(float(t["learned"][i]) for t in sweep["tpr"].values())
    return out


def active_learned_table(sweep: Mapping, paper: Callable[[str], str]):
    """The active attacks scored two ways (Markdown), one row per attacker and ascent step: the fixed score
    (mean loss over the attack rounds) and Nasr et al.'s learned attack (trained on the other targets),
    each as AUC (mean ± 95 % interval over targets) and pooled TPR at the rates of ``sweep["fpr"]``; the
    learned attack's gain over the same attacker's learned passive attack (paired over targets); the
    stored paper-scale record's learned AUC."""
    from ..plots import md_table

    rows = []
    for (name, gamma), a in sweep["auc_learned"].items():
        t = sweep["tpr"][(name, gamma)]
        passive = np.asarray(sweep["auc_learned"][(name, 0.0)])
        rows.append([name, "passive" if gamma == 0 else f"γ = {gamma:g}", mean_interval(sweep["auc"][(name, gamma)]),
                     " / ".join(f"{v:.3f}" for v in t["mean loss"]), mean_interval(a),
                     " / ".join(f"{v:.3f}" for v in t["learned"]),
                     "-" if gamma == 0 else mean_interval(np.asarray(a) - passive),
                     paper(active_attack_name(name, gamma, "lauc"))])
    rates = " / ".join(f"{100 * r:g} %" for r in sweep["fpr"])
    return md_table(["attacker", "ascent", "mean loss: AUC", f"mean loss: TPR at {rates} FPR", "learned: AUC",
                     f"learned: TPR at {rates} FPR", "learned: AUC − passive (paired)",
                     "learned AUC, paper scale (over seeds)"], rows)


# ---------------------------------------------------------------------------------------------------
# LiRA adapted to FL (Carlini et al., S&P 2022): shadow federations, per-record likelihood ratio
# ---------------------------------------------------------------------------------------------------

def lira_shadow_models(model, params: dict, X_pool: torch.Tensor, y_pool: torch.Tensor, shadow_in: torch.Tensor, *,
                       num_clients: int, num_rounds: int, seed: int = 0,
                       local: LocalTraining = LocalTraining()) -> tuple[dict, torch.Tensor]:
    """The attacker's shadow federations for LiRA adapted to FedAvg (Carlini et al. 2022, Sec. IV-C, online
    variant; FedAvg of McMahan et al. 2017). Shadow ``s`` is a federation of ``num_clients`` clients that
    share out the records ``i`` with ``shadow_in[s, i]`` (shuffled, equal shares) and run FedAvg from
    ``params`` with the target federation's clients' training ``local`` (:class:`fedlab.fl.LocalTraining`, epochs
    without ``local_steps`` or ``weight_decay``, cross-entropy): ``num_rounds - 1``
    rounds of :func:`fedlab.fl.stacked.fedavg_runs` (all shadows advanced together, one vmapped step) and
    the local training of the last round (:func:`fedlab.fl.stacked.clients_update_runs`), which gives the
    model each shadow client returns in round ``num_rounds``, what the server sees of a real client.

    ``X_pool``: ``[N, ...]``, ``y_pool``: ``[N]``, the attacker's records; ``shadow_in``: bool ``[S, N]``
    (e.g. :func:`fedlab.attacks.membership.balanced_inclusion`), each row holding the same number of trues, a
    multiple of ``num_clients``. Returns ``(models, owner)``: ``models`` ``{name: [S, num_clients, ...]}``, the
    returned client models, and ``owner`` ``[S, N]`` (long), the shadow client that holds record ``i`` in
    shadow ``s`` (``-1`` where the record is OUT). Raises ``ValueError`` for mismatched shapes, rows of
    ``shadow_in`` of different sizes or not divisible into ``num_clients`` equal shares, or ``num_clients``,
    ``num_rounds`` not positive integers."""
    from ..fl import ClientData
    from ..fl.stacked import clients_update_runs, fedavg_runs

    num_clients = positive_int("num_clients", num_clients)
    num_rounds = positive_int("num_rounds", num_rounds)
    I = torch.as_tensor(shadow_in)
    if I.dtype != torch.bool or I.ndim != 2 or I.shape[1] != X_pool.shape[0] or y_pool.shape[0] != X_pool.shape[0]:
        raise ValueError(f"shadow_in must be bool [S, N] with N = len(X_pool) = len(y_pool), got {tuple(I.shape)}, "
                         f"{X_pool.shape[0]} and {y_pool.shape[0]}")
    sizes = I.sum(1)
    if int(sizes.min()) != int(sizes.max()) or int(sizes[0]) == 0 or int(sizes[0]) % num_clients:
        raise ValueError(f"shadow_in: every shadow must hold the same number of records, a positive multiple of "
                         f"num_clients = {num_clients}, got {sorted(set(sizes.tolist()))}")
    n = int(sizes[0]) // num_clients
    gen = torch.Generator().manual_seed(int(seed))
    owner = torch.full(I.shape, -1, dtype=torch.long)
    feds = []
    for s in range(I.shape[0]):
        rows = torch.nonzero(I[s]).flatten()[torch.randperm(int(sizes[s]), generator=gen)].reshape(num_clients, n)
        for k in range(num_clients):
            owner[s, rows[k]] = k
        feds.append(ClientData(X_pool[rows], y_pool[rows], torch.full((num_clients,), n, dtype=torch.long)))
    local = _local(local)
    fl_args = dict(lr=local.lr, local_epochs=local.local_epochs, batch_size=local.batch_size)
    if local.local_steps is not None or local.weight_decay != 0 or local.loss_fn is not cross_entropy:
        raise ValueError(f"local: the shadow federations train local_epochs epochs of cross-entropy without weight "
                         f"decay, got {local}")
    if num_rounds > 1:   # the global model each shadow federation sends in its last round
        starts = [r.params for r in fedavg_runs(model, [dict(clients=c, params=params, seed=int(seed) + 1 + s, **fl_args)
                                                        for s, c in enumerate(feds)], num_rounds=num_rounds - 1)]
    else:
        starts = [params] * len(feds)
    last = clients_update_runs(model, [dict(params=w, data=c, generator=torch.Generator().manual_seed(int(seed) + 1 + s),
                                            **fl_args) for s, (w, c) in enumerate(zip(starts, feds))])
    return {k: torch.stack([m[k] for m in last]) for k in last[0]}, owner


def lira_attack(model, target_models: dict, cand_X: torch.Tensor, cand_y: torch.Tensor, is_member, *, params: dict,
                num_shadows: int, num_rounds: int, seed: int = 0, local: LocalTraining = LocalTraining()) -> dict:
    """LiRA (Carlini et al., S&P 2022, Sec. IV, online variant) adapted to FedAvg, against the model each
    client returns in the last round.

    Threat model: the attacker is the server, honest but curious. It sees the model each client returns
    every round (here the last, round ``num_rounds``), knows the training algorithm, its settings
    (``local``: the clients' :class:`fedlab.fl.LocalTraining`) and the initial model ``params`` (it sent it),
    and holds the candidate records, not their membership. Its own data are the ``K r`` candidates
    themselves, drawn from the same distribution as the clients' data (half of them members of some
    client): it trains ``num_shadows`` shadow federations of ``K`` clients (:func:`lira_shadow_models`),
    each on half of the candidates (:func:`fedlab.attacks.membership.balanced_inclusion`: every candidate
    IN exactly half of the shadows), the size of the real federation (``K r / 2`` records).

    For candidate ``i`` of client ``k`` the shadow statistic is its logit-scaled confidence
    (:func:`fedlab.attacks.membership.logit_confidence`) under the model returned by the shadow client
    that held it (IN) or by shadow client ``k`` (OUT); the target statistic is its confidence under the
    model client ``k`` returned; the score is :func:`fedlab.attacks.membership.lira_scores`, with the
    fixed variance (pooled over the candidates) and with each record's own variance.

    ``target_models``: ``{name: [K, ...]}`` (e.g. ``SnapshotRecorder.client_models[-1]``); ``cand_X``:
    ``[K, r, ...]``, ``cand_y``: ``[K, r]``; ``is_member``: ``[r]`` (the same for every client, used only
    to score the attack). Returns ``{"scores": {variant: [K, r]}, "auc": {variant: [K]}`` (each client's
    AUC on its own candidates), ``"tpr": {variant: [..]}`` (TPR at :data:`LOW_FPR`, pooled over the clients
    with one threshold), ``"fpr"``, ``"num_shadows"``, ``"shadow_records"`` (records per shadow federation),
    ``"phi_target"`` ``[K, r]``, ``"phi_shadow"`` ``[S, K r]``, ``"shadow_in"`` ``[S, K r]}``; the variants are
    ``"LiRA, fixed variance"`` and ``"LiRA, per-record variance"``.
    Raises ``ValueError`` for mismatched shapes, ``r`` odd, or ``num_shadows`` not an even integer >= 4."""
    from torch.func import functional_call, vmap

    from ..metrics import roc_auc, tpr_at_fpr

    if cand_X.shape[:2] != cand_y.shape[:2] or cand_y.ndim != 2:
        raise ValueError(f"cand_X [K, r, ...] and cand_y [K, r] must agree, got {tuple(cand_X.shape)}, {tuple(cand_y.shape)}")
    K, r = cand_y.shape
    if r % 2:
        raise ValueError(f"each client needs an even number r of candidates (its members and as many others), got {r}")
    if isinstance(num_shadows, bool) or int(num_shadows) != num_shadows or num_shadows < 4:
        raise ValueError(f"num_shadows must be an even integer >= 4 (two IN and two OUT per record), got {num_shadows}")
    lab = np.asarray(is_member)
    if lab.shape != (r,):
        raise ValueError(f"is_member must be [r] = [{r}], got shape {lab.shape}")
    if any(v.shape[0] != K for v in target_models.values()):
        raise ValueError(f"target_models must hold one model per client, [K = {K}, ...]")
    X_pool, y_pool = cand_X.reshape(K * r, *cand_X.shape[2:]), cand_y.reshape(K * r)
    shadow_in = mia.balanced_inclusion(int(num_shadows), K * r, seed=seed)
    models, owner = lira_shadow_models(model, params, X_pool, y_pool, shadow_in, num_clients=K, num_rounds=num_rounds,
                                       seed=seed, local=local)
    with torch.no_grad():
        logits = vmap(vmap(lambda p: functional_call(model, p, (X_pool,))))(models)          # [S, K, N, C]
        phi_all = mia.logit_confidence(logits, y_pool)                                        # [S, K, N]
        home = torch.arange(K).repeat_interleave(r)                                           # candidate -> its client
        col = torch.where(owner >= 0, owner, home.expand_as(owner))                           # [S, N]
        phi_shadow = phi_all.gather(1, col.unsqueeze(1)).squeeze(1)                           # [S, N]
        phi_target = mia.logit_confidence(vmap(lambda p, x: functional_call(model, p, (x,)))(target_models, cand_X),
                                          cand_y)                                             # [K, r]
    out = {"scores": {}, "auc": {}, "tpr": {}, "fpr": tuple(LOW_FPR), "num_shadows": int(num_shadows),
           "shadow_records": int(shadow_in[0].sum()), "phi_target": phi_target, "phi_shadow": phi_shadow,
           "shadow_in": shadow_in}
    for name, fixed in (("LiRA, fixed variance", True), ("LiRA, per-record variance", False)):
        sc = mia.lira_scores(phi_target.reshape(-1), phi_shadow, shadow_in.numpy(), fixed_variance=fixed).reshape(K, r)
        out["scores"][name] = sc
        out["auc"][name] = np.asarray([roc_auc(lab, s) for s in sc])
        out["tpr"][name] = tpr_at_fpr(np.tile(lab, K), sc.ravel(), list(LOW_FPR))
    return out


#: the passive attacks on the model each client returns, compared by :func:`passive_attack_scores`, with glue tags
PASSIVE_ATTACKS = {"mean loss, last round": "loss_last", "mean loss, all rounds": "loss_all",
                   "learned (Nasr et al.), all rounds": "learned", "LiRA, fixed variance": "lira_fixed",
                   "LiRA, per-record variance": "lira_rec"}


def passive_attack_scores(signals: Mapping[str, torch.Tensor], is_member, lira: Mapping, *, n_boot: int = 500,
                          seed: int = 0) -> dict:
    """The passive server's attacks on each client's candidates, side by side (Carlini et al. 2022's
    comparison: AUC and TPR at low FPR): minus the loss of the last round and of all rounds averaged
    (:func:`fedlab.attacks.membership.membership_score`), Nasr et al.'s learned attack on the loss and
    last-layer gradient norm of every round (:func:`fedlab.attacks.membership.learned_loo_scores`, trained on
    the other clients' candidates, whose membership the attacker is given), and the two LiRA variants of
    :func:`lira_attack` (``lira``).

    ``signals``: ``{"loss": [K, T, r], "grad_norm": [K, T, r]}``; ``is_member``: ``[r]``. Returns
    ``{"auc": {attack: [K]}, "tpr": {attack: [..]}, "tpr_ci": {attack: [(lo, hi), ..]}, "fpr": LOW_FPR}`` keyed
    by :data:`PASSIVE_ATTACKS`: each client's AUC, the TPR of one threshold over all clients' candidates at
    each rate of :data:`LOW_FPR`, and its 95 % percentile bootstrap interval over clients (``n_boot``
    resamples of the ``K`` clients with replacement, drawn from ``seed``). Raises ``ValueError`` for a missing
    signal, LiRA results of other clients or candidates, or ``n_boot`` not a positive integer."""
    from ..metrics import roc_auc, tpr_at_fpr

    for s in ("loss", "grad_norm"):
        if s not in signals or signals[s].ndim != 3:
            raise ValueError(f"signals must hold {s!r} as [K, T, r], got {sorted(signals)}")
    L = signals["loss"]
    K, T, r = L.shape
    for name in ("LiRA, fixed variance", "LiRA, per-record variance"):
        if name not in lira["scores"] or np.shape(lira["scores"][name]) != (K, r):
            raise ValueError(f"lira must hold {name!r} scores of shape [K, r] = [{K}, {r}]")
    lab = np.asarray(is_member)
    feats = torch.cat([L, signals["grad_norm"]], dim=1).permute(0, 2, 1).numpy()       # [K, r, 2T]
    scores = {"mean loss, last round": np.stack([mia.membership_score(S, 1).numpy() for S in L]),
              "mean loss, all rounds": np.stack([mia.membership_score(S, T).numpy() for S in L]),
              "learned (Nasr et al.), all rounds": mia.learned_loo_scores(feats, lab),
              **{k: np.asarray(v) for k, v in lira["scores"].items()}}
    n_boot = positive_int("n_boot", n_boot)
    draws = np.random.default_rng(seed).integers(0, K, size=(n_boot, K))           # the same resamples for every attack
    tpr_ci = {}
    for k, v in scores.items():
        boot = np.asarray([tpr_at_fpr(np.tile(lab, K), v[d].ravel(), list(LOW_FPR)) for d in draws])   # [n_boot, rates]
        tpr_ci[k] = [(float(lo), float(hi)) for lo, hi in zip(*np.percentile(boot, [2.5, 97.5], axis=0))]
    return {"auc": {k: np.asarray([roc_auc(lab, s) for s in v]) for k, v in scores.items()},
            "tpr": {k: tpr_at_fpr(np.tile(lab, K), v.ravel(), list(LOW_FPR)) for k, v in scores.items()},
            "tpr_ci": tpr_ci, "fpr": tuple(LOW_FPR)}


def passive_attack_values(comparison: Mapping) -> dict:
    """``{name: value}`` the chapter quotes from :func:`passive_attack_scores` (unrounded): per attack (tag of
    :data:`PASSIVE_ATTACKS`) ``pa_<tag>_auc`` (mean over clients), ``_auc_lo`` / ``_auc_hi`` (95 % t interval
    over clients), ``pa_<tag>_tpr0p1`` and ``pa_<tag>_tpr1`` (with ``_lo`` / ``_hi``, the bootstrap interval over
    clients, when ``comparison`` holds ``"tpr_ci"``); ``pa_lira_minus_loss`` (LiRA with the fixed
    variance minus the last-round mean loss, paired over clients, with ``_lo`` / ``_hi``) and the same for
    the per-record variance (``pa_lira_rec_minus_loss``)."""
    out = {}
    for name, tag in PASSIVE_ATTACKS.items():
        a = np.asarray(comparison["auc"][name])
        m, _, ci = t_interval(a)
        out.update({f"pa_{tag}_auc": m, f"pa_{tag}_auc_lo": (ci or (m, m))[0], f"pa_{tag}_auc_hi": (ci or (m, m))[1]})
        for i, rate in enumerate(comparison["fpr"]):
            out[f"pa_{tag}_tpr{_fpr_tag(rate)}"] = float(comparison["tpr"][name][i])
            if "tpr_ci" in comparison:
                lo, hi = comparison["tpr_ci"][name][i]
                out.update({f"pa_{tag}_tpr{_fpr_tag(rate)}_lo": lo, f"pa_{tag}_tpr{_fpr_tag(rate)}_hi": hi})
    base = np.asarray(comparison["auc"]["mean loss, last round"])
    for name, tag in (("LiRA, fixed variance", "pa_lira_minus_loss"), ("LiRA, per-record variance", "pa_lira_rec_minus_loss")):
        m, _, ci = t_interval(np.asarray(comparison["auc"][name]) - base)
        out.update({tag: m, tag + "_lo": (ci or (m, m))[0], tag + "_hi": (ci or (m, m))[1]})
    return out


def passive_attack_table(comparison: Mapping, paper: Callable[[str], str]):
    """:func:`passive_attack_scores` as a Markdown table, one row per attack: this build's AUC (mean ± 95 %
    interval over clients) and pooled TPR at the rates of ``comparison["fpr"]`` (with its bootstrap interval over
    clients in brackets), and the stored paper-scale
    record's AUC and TPRs (``paper(name)``, mean ± 95 % interval over seeds)."""
    from ..plots import md_table

    rates = [_fpr_tag(r) for r in comparison["fpr"]]
    rows = []
    for name, tag in PASSIVE_ATTACKS.items():
        ci = comparison.get("tpr_ci", {}).get(name)
        tprs = [f"{v:.3f}" + (f" [{ci[i][0]:.3f}, {ci[i][1]:.3f}]" if ci else "") for i, v in enumerate(comparison["tpr"][name])]
        rows.append([name, mean_interval(comparison["auc"][name]), *tprs,
                     paper(f"pa_{tag}_auc"), *(paper(f"pa_{tag}_tpr{t}") for t in rates)])
    head = [f"TPR at {100 * r:g} % FPR" for r in comparison["fpr"]]
    return md_table(["attack", "AUC (mean ± 95 % CI over clients)", *head, "AUC, paper scale (over seeds)",
                     *[h + ", paper scale" for h in head]], rows)


# ---------------------------------------------------------------------------------------------------
# distributed DP inside secure aggregation (Kairouz, Liu & Steinke 2021)
# ---------------------------------------------------------------------------------------------------

def ddg_calibration(epsilon: float, num_clients: int, *, clip_norm: float, grid: float, dim: int, delta: float,
                    missing: Sequence[int] | None = None) -> tuple[int, dict]:
    """The share variance (grid units) that makes ``num_clients`` discrete Gaussian shares
    ``(epsilon, delta)``-DP (:func:`fedlab.privacy.distributed_dg.ddg_local_sigma2`), and the epsilon the
    same shares give when only ``m`` of them are in the sum, for ``m`` in ``(num_clients, *missing)``
    (default ``missing``: half of them, and one). Returns ``(share, {m: epsilon})``."""
    from ..privacy import distributed_dg as ddg

    kw = dict(clip_norm=clip_norm, grid=grid, dim=dim, delta=delta)
    share = ddg.ddg_local_sigma2(epsilon, num_clients, **kw)
    counts = [num_clients, *((num_clients // 2, 1) if missing is None else missing)]
    return share, {m: ddg.ddg_epsilon(share, m, **kw) for m in counts}


def ddg_error_ratio(out, updates: torch.Tensor, clip_norm: float) -> float:
    """The server's error on the clipped sum (``out``: :class:`fedlab.privacy.distributed_dg.DDGSum` of
    ``updates`` [K, d] clipped to ``clip_norm``), as its standard deviation over the coordinates divided by
    the calibrated one, ``sqrt(K sigma_share^2) grid``: about 1 when every share is in the sum."""
    from ..privacy.clipping import clip_rows

    err = out.total - clip_rows(updates.double(), clip_norm).sum(0)
    return float(err.std()) / ((out.num_clients * out.local_sigma2) ** 0.5 * out.grid)


# ---------------------------------------------------------------------------------------------------
# client-level DP: utility and leakage of the released models (McMahan et al. 2018, Alg. 1)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DPGrid:
    """The cells of :func:`dp_grid`: DP-FedAvg (McMahan et al. 2018, Alg. 1, every client every round,
    ``q = 1``) over a grid of federations and budgets.

    ``client_counts``
        the federations' sizes ``K`` (each of ``K`` iid clients).
    ``epsilons``
        the budgets ``eps`` (``inf``: no noise, the updates still clipped), each calibrated with the RDP
        accountant at ``delta``.
    ``delta``
        the ``delta`` of every budget; below ``1/K`` for every ``K`` (:func:`fedlab.privacy.dp_fedavg.check_delta`).
    ``clip_norm``
        the L2 bound ``S`` on each client's update.
    ``n_per_client``
        the records of each client.

    Raises ``ValueError`` naming the field for no client counts or a count that is not a positive integer, no
    budgets or one not ``> 0``, a ``delta`` not below ``1/K``, a ``clip_norm`` that is not finite and ``> 0``,
    or ``n_per_client`` not a positive integer.
    """

    client_counts: Sequence[int]
    epsilons: Sequence[float]
    delta: float
    clip_norm: float
    n_per_client: int

    def __post_init__(self):
        counts = tuple(self.client_counts)
        if not counts:
            raise ValueError("DPGrid.client_counts must hold at least one client count")
        counts = tuple(positive_int("DPGrid.client_counts", K) for K in counts)
        eps = tuple(float(e) for e in self.epsilons)
        if not eps or not all(e > 0 for e in eps):
            raise ValueError(f"DPGrid.epsilons must be a non-empty list of budgets > 0 (inf: no noise), got {list(eps)}")
        for K in counts:
            dpf.check_delta(self.delta, K)
        finite_positive("DPGrid.clip_norm", self.clip_norm)
        object.__setattr__(self, "n_per_client", positive_int("DPGrid.n_per_client", self.n_per_client))
        object.__setattr__(self, "client_counts", counts)
        object.__setattr__(self, "epsilons", eps)


def dp_grid(model, params: dict, train: Dataset, nonmembers: Dataset, test: Dataset, *, cells: DPGrid,
            num_rounds: int, window: int = 5, seed: int = 0, local: LocalTraining = LocalTraining()) -> dict:
    """DP-FedAvg (McMahan et al. 2018, Alg. 1, every client every round, ``q = 1``) against the
    passive attack on its *released* models, over a grid of client counts and budgets (``cells``, a
    :class:`DPGrid`).

    For every ``K`` in ``cells.client_counts``: ``K`` iid clients of ``cells.n_per_client`` records of ``train``
    (:func:`fedlab.data.partition_iid` with ``seed``); for every ``eps`` of ``cells.epsilons`` (``inf`` = no
    noise) the noise multiplier is calibrated with the RDP accountant at ``cells.delta``, DP-FedAvg runs
    ``num_rounds`` rounds from ``params`` with updates clipped to ``cells.clip_norm``, and the attacker averages
    each record's loss over the last ``window`` released models (members: every client's records; non-members:
    all of ``nonmembers``). ``local``: the clients' :class:`fedlab.fl.LocalTraining` (epochs, batch size and
    step; cross-entropy).

    Returns ``{(eps, K): {"z", "accuracy" (on test), "auc", "floor", "floor_999"}}``: ``floor`` and
    ``floor_999`` are the 95th and 99.9th percentiles of the AUC with shuffled membership labels
    (:func:`fedlab.metrics.auc_permutation_floor`, 1000 shuffles). Raises ``ValueError`` for
    ``num_rounds`` or ``window`` not positive integers or ``window > num_rounds`` (and :class:`DPGrid` for
    its fields). The ``eps = inf`` runs add no noise but still clip every update to ``clip_norm``.
    """
    if not isinstance(cells, DPGrid):
        raise ValueError(f"cells must be a DPGrid, got {cells!r}")
    n, client_counts, epsilons = cells.n_per_client, cells.client_counts, cells.epsilons
    delta, clip_norm = cells.delta, cells.clip_norm
    num_rounds = positive_int("num_rounds", num_rounds)
    window = positive_int("window", window)
    if window > num_rounds:
        raise ValueError(f"window ({window}) must not exceed num_rounds ({num_rounds})")
    cells, runs, released, data = [], [], {}, {}
    for K in client_counts:
        parts_K = [p[:n] for p in partition_iid(len(train), K, seed=seed)]
        members = Dataset(train.X[np.concatenate(parts_K)], train.y[np.concatenate(parts_K)])
        cl_K = stack_clients(client_datasets(train, parts_K))
        data[K] = (torch.cat([members.X, nonmembers.X]), torch.cat([members.y, nonmembers.y]),
                   np.r_[np.ones(len(members)), np.zeros(len(nonmembers))])
        for eps in epsilons:
            z = dpf.noise_multiplier_for_epsilon(eps, 1.0, num_rounds, delta, num_clients=K, safe=False)
            cells.append((eps, K, z))
            released[(eps, K)] = []
            runs.append(dict(clients=cl_K, sampling_prob=1.0, noise_multiplier=z, clip_norm=clip_norm, params=params, safe=False,
                             seed=seed, callback=lambda r, out=released[(eps, K)]: out.append(r.new_params),
                             local=local))
    # dp_fedavg for every (eps, K), the runs advanced together (the same numbers as one after another)
    results = dp_fedavg_runs(model, runs, num_rounds=num_rounds, eval_data=test)
    grid = {}
    for (eps, K, z), res in zip(cells, results):
        X_all, y_all, lab = data[K]
        S_rel = mia.snapshot_signals(model, released[(eps, K)][-window:], X_all, y_all)
        scores = mia.membership_score(S_rel, window).numpy()
        floor, floor_999 = auc_permutation_floor(lab, scores, quantile=[0.95, 0.999], seed=seed)   # the same shuffles
        grid[(eps, K)] = {"z": z, "accuracy": res.history["accuracy"][-1], "auc": mia.attack_auc(S_rel, lab, window),
                          "floor": floor, "floor_999": floor_999}
    return grid


def plot_dp_grid(grid: Mapping, epsilons: Sequence[float], client_counts: Sequence[int], *, delta: float = 1e-3):
    """Two panels from :func:`dp_grid`: test accuracy and the attack's AUC against ``eps`` (log axis,
    ``inf`` drawn at 32 and labelled "∞"), one line per client count; the AUC panel draws the largest
    chance floor of the grid (dashed) and 0.5 (dotted). Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    xs = [e if np.isfinite(e) else 32.0 for e in epsilons]
    for K in client_counts:
        axes[0].plot(xs, [grid[(e, K)]["accuracy"] for e in epsilons], "o-", label=f"K = {K}")
        axes[1].plot(xs, [grid[(e, K)]["auc"] for e in epsilons], "o-", label=f"K = {K}")
    for ax, label in zip(axes, ["test accuracy", "MIA AUC (released models)"]):
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{e:g}" if np.isfinite(e) else "∞" for e in epsilons])
        ax.set(xlabel=f"ε (δ = {delta:.0e})".replace("e-0", "e-"), ylabel=label)
        ax.legend()
    floor = max(grid[(e, K)]["floor"] for e in epsilons for K in client_counts)
    axes[1].axhline(0.5, color="gray", ls=":", lw=1)
    axes[1].axhline(floor, color="gray", ls="--", label="chance floor (95th pct., shuffled labels)")
    axes[1].legend()
    return fig, axes


# ---------------------------------------------------------------------------------------------------
# keeping utility: local-only, DP-FedAvg + fine-tuning, Centaur (Shen et al. 2023)
# ---------------------------------------------------------------------------------------------------

#: the three private options of :func:`personalization_sweep`, in the chapter's order, with short glue tags
PERSONALIZATION_METHODS = {"local-only": "lo", "DP-FedAvg + fine-tuning": "ft", "Centaur": "ce"}


@dataclass(frozen=True)
class PersonalizationTask:
    """The federation of :func:`personalization_sweep`: ``num_clients`` clients of the synthetic task of
    :func:`fedlab.fl.personalization.make_representation_task` (the setting of Shen et al. 2023, Sec. 5: few
    records per client, a shared low-dimensional representation), ``n_train`` training and ``n_test`` test
    records each (defaults 10 and 20).

    Raises ``ValueError`` naming the field for a count that is not a positive integer.
    """

    num_clients: int
    n_train: int = 10
    n_test: int = 20

    def __post_init__(self):
        for name in ("num_clients", "n_train", "n_test"):
            object.__setattr__(self, name, positive_int(f"PersonalizationTask.{name}", getattr(self, name)))


@dataclass(frozen=True)
class PersonalizationSchedule:
    """How long each private option of :func:`personalization_sweep` fits, besides the federated rounds:
    ``local_only_epochs`` of local-only training (default 20), ``finetune_epochs`` of fine-tuning the head
    after DP-FedAvg (default 30), and Centaur's (Shen et al. 2023, Alg. 2) ``head_epochs`` of head fitting per
    round (default 10) and ``final_head_epochs`` for the final heads (default 30).

    Raises ``ValueError`` naming the field for an epoch count that is not a positive integer.
    """

    local_only_epochs: int = 20
    finetune_epochs: int = 30
    head_epochs: int = 10
    final_head_epochs: int = 30

    def __post_init__(self):
        for name in ("local_only_epochs", "finetune_epochs", "head_epochs", "final_head_epochs"):
            object.__setattr__(self, name, positive_int(f"PersonalizationSchedule.{name}", getattr(self, name)))


def _personalization_local(local: LocalTraining) -> LocalTraining:
    local = _local(local)
    if local.local_steps is not None or local.weight_decay != 0 or local.loss_fn is not cross_entropy:
        raise ValueError(f"local: the personalisation runs train local_epochs epochs of cross-entropy without weight "
                         f"decay, got {local}")
    return local


def personalization_sweep(model, params: dict, classes_per_client: Sequence[int], *, task: PersonalizationTask,
                          num_rounds: int, dp: DPSettings, local: LocalTraining,
                          schedule: PersonalizationSchedule = PersonalizationSchedule(), seed: int = 0,
                          methods: Sequence[str] | None = None) -> tuple:
    """Mean client test accuracy of three private options on
    :func:`fedlab.fl.personalization.make_representation_task` (``task``, a :class:`PersonalizationTask`:
    ``num_clients`` clients of ``n_train`` records, ``n_test`` test records each), for each heterogeneity level
    in ``classes_per_client``:

    * ``"local-only"``: :func:`~fedlab.fl.personalization.local_only`, ``schedule.local_only_epochs`` epochs;
    * ``"DP-FedAvg + fine-tuning"``: DP-FedAvg (McMahan et al. 2018, Alg. 1) then
      :func:`~fedlab.fl.personalization.finetune` of the head for ``schedule.finetune_epochs``;
    * ``"Centaur"`` (Shen et al. 2023, Alg. 1-2): :func:`~fedlab.fl.personalization.centaur` with
      ``schedule.head_epochs`` per round and ``schedule.final_head_epochs`` for the final heads.

    Both federated methods share the server's mechanism ``dp`` (a :class:`~fedlab.fl.dp_fedavg.DPSettings`:
    ``noise_multiplier``, ``clip_norm``, ``sampling_prob``, ``server_lr``, ``safe``; the chapter's is McMahan et
    al.'s float Gaussian, ``safe=False``, :data:`CHAPTER_MECHANISM`) and the clients' training ``local`` (a
    :class:`~fedlab.fl.LocalTraining`: ``lr``, ``batch_size``, ``local_epochs``, 1 in the chapter), so they
    spend the same privacy budget; local-only and fine-tuning use ``local.lr`` too, local-only
    ``local.batch_size``. Every run starts from ``params`` with ``seed``.

    ``methods`` (default: all three) runs a subset; a method left out has no entry in ``util`` and
    leaves its list in ``diag`` empty.

    Returns ``(util, diag, kept)``: ``util[method][level]`` accuracies, ``diag[level] = (records of
    DP-FedAvg, records of Centaur)``, one :class:`~fedlab.fl.dp_fedavg.DPRoundRecord` per round, and
    ``kept["models"][method][level]`` the stacked personalised models ``{name: [K, ...]}`` with
    ``kept["tasks"][level]`` the ``(train, test)`` :class:`~fedlab.fl.ClientData` they were trained and scored on
    (for :func:`personalized_attack`). Raises ``ValueError`` for ``num_rounds`` not a positive integer, an
    unknown or empty ``methods``, or a ``local`` with ``local_steps``, weight decay or another loss than
    cross-entropy (and the settings objects for their fields).
    """
    num_rounds = positive_int("num_rounds", num_rounds)
    methods = list(PERSONALIZATION_METHODS) if methods is None else list(methods)
    if not methods or any(m not in PERSONALIZATION_METHODS for m in methods):
        raise ValueError(f"methods must be a non-empty subset of {list(PERSONALIZATION_METHODS)}, got {methods}")
    runs = _personalization_runs(model, params, [(cpc, dp.noise_multiplier, methods) for cpc in classes_per_client],
                                 task=task, num_rounds=num_rounds, dp=dp, local=local, schedule=schedule, seed=seed)
    util = {m: {} for m in PERSONALIZATION_METHODS if m in methods}
    diag, kept = {}, {"models": {m: {} for m in util}, "tasks": {}}
    for cpc, (acc, recs, run) in zip(classes_per_client, runs):
        for m, a in acc.items():
            util[m][cpc] = a
            kept["models"][m][cpc] = run["models"][m]
        diag[cpc] = recs
        kept["tasks"][cpc] = run["task"]
    return util, diag, kept


def _personalization_runs(model, params: dict, settings: Sequence[tuple[int, float, Sequence[str]]], *,
                          task: PersonalizationTask, num_rounds: int, dp: DPSettings, local: LocalTraining,
                          schedule: PersonalizationSchedule = PersonalizationSchedule(),
                          seed: int = 0) -> list[tuple[dict, tuple[list, list]]]:
    """The runs of :func:`personalization_sweep` for every setting ``(classes per client, noise
    multiplier, methods)`` (the noise multiplier of each setting replaces ``dp.noise_multiplier``): one task per
    setting, each method's runs of all settings advanced together
    (:func:`fedlab.fl.personalization.local_only_runs`, :func:`fedlab.fl.dp_fedavg.dp_fedavg_runs` and
    :func:`~fedlab.fl.personalization.finetune_runs`, :func:`~fedlab.fl.personalization.centaur_runs`;
    the same numbers as one run after another). Returns per setting ``({method: mean client test
    accuracy}, (records of DP-FedAvg, records of Centaur), {"models": {method: stacked personalised
    models}, "task": (train, test)})``."""
    if not isinstance(task, PersonalizationTask) or not isinstance(schedule, PersonalizationSchedule):
        raise ValueError(f"task must be a PersonalizationTask and schedule a PersonalizationSchedule, got {task!r}, {schedule!r}")
    if not isinstance(dp, DPSettings):
        raise ValueError(f"dp must be a fedlab.fl.dp_fedavg.DPSettings, got {dp!r}")
    local = _personalization_local(local)
    lr, batch_size = local.lr, local.batch_size
    tasks = [pers.make_representation_task(task.num_clients, task.n_train, task.n_test, classes_per_client=cpc,
                                           seed=seed)
             for cpc, _, _ in settings]
    out = [({}, ([], []), {"models": {}, "task": t}) for t in tasks]
    # both federated methods: the server's mechanism dp (the chapter's: McMahan et al.'s float Gaussian,
    # accounted with amplification by sampling, see CHAPTER_MECHANISM) and the clients' training local
    dp_args = dict(sampling_prob=dp.sampling_prob, clip_norm=dp.clip_norm, server_lr=dp.server_lr, lr=lr,
                   batch_size=batch_size, params=params, seed=seed, safe=dp.safe, grid=dp.grid)

    def which(method):
        return [i for i, (_, _, methods) in enumerate(settings) if method in methods]

    def record(method, idx, models):
        for i, stacked in zip(idx, models):
            out[i][0][method] = float(pers.evaluate_clients(model, stacked, tasks[i][1]).mean())
            out[i][2]["models"][method] = stacked

    idx = which("local-only")
    if idx:
        record("local-only", idx, pers.local_only_runs(model, [
            dict(train=tasks[i][0], num_epochs=schedule.local_only_epochs, lr=lr, batch_size=batch_size, params=params,
                 seed=seed)
            for i in idx]))
    idx = which("DP-FedAvg + fine-tuning")
    if idx:
        glob = dp_fedavg_runs(model, [dict(clients=tasks[i][0], local_epochs=local.local_epochs,
                                           noise_multiplier=settings[i][1], callback=out[i][1][0].append, **dp_args)
                                      for i in idx], num_rounds=num_rounds)
        record("DP-FedAvg + fine-tuning", idx, pers.finetune_runs(model, [
            dict(params=g.params, train=tasks[i][0], num_epochs=schedule.finetune_epochs, lr=lr, seed=seed)
            for i, g in zip(idx, glob)]))
    idx = which("Centaur")
    if idx:
        record("Centaur", idx, pers.centaur_runs(model, [
            dict(train=tasks[i][0], head_epochs=schedule.head_epochs, final_head_epochs=schedule.final_head_epochs,
                 rep_epochs=local.local_epochs, noise_multiplier=settings[i][1], callback=out[i][1][1].append,
                 **dp_args) for i in idx],
            num_rounds=num_rounds))
    return out


def personalized_attack(model, stacked: Mapping[str, torch.Tensor], train, test, *,
                        rates: Sequence[float] = LOW_FPR, seed: int = 0) -> dict:
    """The loss-threshold membership attack (Yeom et al. 2018; the black-box attacker of Nasr et al.
    2019, Sec. IV) on every client's *personalised* model: client ``k``'s model ``stacked[.][k]`` scores
    its own training records (members) against its own test records (non-members, drawn from the same
    client's distribution), lower loss = member. The attacker is anyone who can query the client's
    final model; under Centaur (Shen et al. 2023, Alg. 1-2) that model holds a head fitted on the client's
    records that no DP noise protects, so the attack measures what the shared part's guarantee does not cover.

    ``stacked``: ``{name: [K, ...]}`` (the ``kept["models"]`` of :func:`personalization_sweep`);
    ``train``, ``test``: :class:`~fedlab.fl.ClientData` with ``X`` ``[K, n, ...]``, ``y`` ``[K, n]`` and no
    padding. Returns ``{"auc": [K]`` (each client's AUC on its own records), ``"tpr": [TPR at each of
    rates]`` (all clients' records pooled under one threshold, :func:`fedlab.metrics.tpr_at_fpr`),
    ``"floor"`` (95th percentile of the mean AUC with shuffled labels,
    :func:`fedlab.metrics.auc_permutation_floor`), ``"gap"`` (mean non-member minus member loss)}.
    Raises ``ValueError`` for padded clients or data whose ``K`` differs from the models'.
    """
    from torch.func import vmap

    from ..metrics import roc_auc_rows, tpr_at_fpr

    K = next(iter(stacked.values())).shape[0]
    for name, d in (("train", train), ("test", test)):
        if d.X.shape[0] != K or not bool((d.n == d.X.shape[1]).all()):
            raise ValueError(f"{name} must hold K = {K} clients with no padding, got X {tuple(d.X.shape)}, "
                             f"n {d.n.tolist()[:5]}...")
    loss = vmap(lambda p, X, y: mia.per_example_loss(model, p, X, y))
    with torch.no_grad():
        lin, lout = loss(dict(stacked), train.X, train.y), loss(dict(stacked), test.X, test.y)
    scores = -torch.cat([lin, lout], 1).double()                                   # [K, n_in + n_out]
    labels = torch.cat([torch.ones_like(lin), torch.zeros_like(lout)], 1).double()
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("a personalised model gives a non-finite loss")
    return {"auc": roc_auc_rows(labels, scores).numpy(),
            "tpr": tpr_at_fpr(labels.reshape(-1).numpy(), scores.reshape(-1).numpy(), list(rates)),
            "floor": float(auc_permutation_floor(labels.numpy(), scores.numpy(), num_permutations=200, seed=seed)),
            "gap": float(lout.mean() - lin.mean())}


def personalized_attack_values(util: Mapping[str, Mapping[int, float]],
                               attacks: Mapping[str, Mapping[int, Mapping]], *, rates: Sequence[float] = LOW_FPR) -> dict:
    """``{name: value}`` (unrounded) from :func:`personalized_attack` results ``attacks[method][level]``
    beside the accuracies ``util[method][level]`` of :func:`personalization_sweep`: for every method tag
    ``t`` (``lo``, ``ft``, ``ce``) and level ``c`` (classes per client) ``pm_<t>_acc_<c>``,
    ``pm_<t>_auc_<c>`` (mean AUC over clients), ``pm_<t>_tpr<rate>_<c>`` (rate ``0.01`` written ``1``),
    ``pm_<t>_gap_<c>``, and ``pm_floor_<c>`` (the largest floor of the methods). Raises ``ValueError`` for
    a method of ``attacks`` without accuracies at the same levels."""
    out = {}
    for m, by_level in attacks.items():
        if m not in PERSONALIZATION_METHODS or any(c not in util.get(m, {}) for c in by_level):
            raise ValueError(f"util must hold {m!r} at the levels {sorted(by_level)}")
        t = PERSONALIZATION_METHODS[m]
        for c, a in by_level.items():
            out[f"pm_{t}_acc_{c}"] = util[m][c]
            out[f"pm_{t}_auc_{c}"] = float(np.mean(a["auc"]))
            for rate, v in zip(rates, a["tpr"]):
                out[f"pm_{t}_tpr{_rate_tag(rate)}_{c}"] = v
            out[f"pm_{t}_gap_{c}"] = a["gap"]
            out[f"pm_floor_{c}"] = max(out.get(f"pm_floor_{c}", 0.0), a["floor"])
    return out


def personalized_attack_table(util: Mapping[str, Mapping[int, float]], attacks: Mapping[str, Mapping[int, Mapping]],
                              labels: Mapping[int, str], paper: Callable[[str], str]):
    """Markdown table of :func:`personalized_attack_values`: one row per method and level
    (``labels[level]`` names the split), with this build's mean client test accuracy, the attack's AUC
    (mean ± 95 % CI over clients), the TPR at 1 % FPR, and the stored record's AUC (``paper(name)``)."""
    from ..plots import md_table

    rows = []
    for m, by_level in attacks.items():
        t = PERSONALIZATION_METHODS[m]
        for c, a in by_level.items():
            rows.append([m, labels.get(c, f"{c} classes per client"), round(util[m][c], 3), mean_interval(a["auc"]),
                         round(a["tpr"][-1], 3), paper(f"pm_{t}_auc_{c}")])
    return md_table(["method", "clients' data", "mean client test accuracy", "attack AUC (mean ± 95 % CI over clients)",
                     "TPR at 1 % FPR", "attack AUC, paper scale (mean ± 95 % CI over seeds)"], rows)


def snr_and_agreement(recs_fa: Sequence, recs_ce: Sequence, params: dict) -> dict:
    """The lecture's two diagnostics of Centaur vs DP-FedAvg (Shen et al. 2023, Sec. 5), averaged over
    the rounds of one run of each: the per-dimension signal-to-noise ratio of every layer
    (:func:`~fedlab.fl.personalization.per_layer_snr`) and the cosine of each client's representation
    update with the mean update (:func:`~fedlab.fl.personalization.client_agreement`).

    Returns ``{"snr_fa", "snr_ce"`` (layer name -> mean SNR; Centaur's lacks the head), ``"agree_fa",
    "agree_ce"`` (1-d tensors, one cosine per client and round), ``"rep_names", "head_names",
    "summary"}``, the summary holding what the chapter quotes: ``snr_head`` (DP-FedAvg's head),
    ``snr_rep_fa``, ``snr_rep_ce`` (mean over the representation's layers), ``agree_fa``, ``agree_ce``
    (mean cosines) and ``agree_fa_sd``, ``agree_ce_sd`` (their standard deviations).
    Raises ``ValueError`` if either list of round records is empty.
    """
    if not recs_fa or not recs_ce:
        raise ValueError("recs_fa and recs_ce must each hold at least one round record")
    head_names = pers.head_names_of(params)
    rep_names = [k for k in params if k not in head_names]
    snr_fa = {k: np.mean([pers.per_layer_snr(r.clipped_mean, r.noise_std)[k] for r in recs_fa]) for k in params}
    snr_ce = {k: np.mean([pers.per_layer_snr(r.clipped_mean, r.noise_std)[k] for r in recs_ce])
              for k in recs_ce[0].clipped_mean}
    agree_fa = torch.cat([pers.client_agreement(r.updates, rep_names) for r in recs_fa if len(r.selected)])
    agree_ce = torch.cat([pers.client_agreement(r.updates, rep_names) for r in recs_ce if len(r.selected)])
    return {"snr_fa": snr_fa, "snr_ce": snr_ce, "agree_fa": agree_fa, "agree_ce": agree_ce,
            "rep_names": rep_names, "head_names": head_names,
            "summary": {"snr_head": float(np.mean([snr_fa[k] for k in head_names])),
                        "snr_rep_fa": float(np.mean([snr_fa[k] for k in rep_names])),
                        "snr_rep_ce": float(np.mean([snr_ce[k] for k in rep_names])),
                        "agree_fa": float(agree_fa.mean()), "agree_ce": float(agree_ce.mean()),
                        "agree_fa_sd": float(agree_fa.std()), "agree_ce_sd": float(agree_ce.std())}}


def plot_snr_agreement(diagnostics: Mapping, layer_names: Sequence[str]):
    """Two panels from :func:`snr_and_agreement`: per-dimension SNR by layer (DP-FedAvg beside Centaur,
    whose head is not shared and shows 0) and box plots of client agreement on the representation.
    Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    snr_fa, snr_ce = diagnostics["snr_fa"], diagnostics["snr_ce"]
    layer_names = list(layer_names)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(layer_names))
    axes[0].bar(x - 0.2, [snr_fa[k] for k in layer_names], 0.4, label="DP-FedAvg")
    axes[0].bar(x + 0.2, [snr_ce.get(k, 0.0) for k in layer_names], 0.4, label="Centaur (head not shared)")
    axes[0].set_xticks(x, layer_names)
    axes[0].set(ylabel="per-dimension SNR", title="signal-to-noise by layer")
    axes[0].legend()
    axes[1].boxplot([diagnostics["agree_fa"].numpy(), diagnostics["agree_ce"].numpy()])
    axes[1].set_xticks([1, 2], ["DP-FedAvg", "Centaur"])
    axes[1].set(ylabel="cosine(client update, mean)", title="client agreement on the representation")
    return fig, axes


# ---------------------------------------------------------------------------------------------------
# the privacy-utility trade-off over budgets at one heterogeneity level (lecture, "Improved privacy
# utility trade-off across privacy budgets"; Shen et al. 2023, Sec. 5)
# ---------------------------------------------------------------------------------------------------

def personalization_eps_sweep(model, params: dict, epsilons: Sequence[float], *, classes_per_client: int,
                              task: PersonalizationTask, num_rounds: int, dp: DPSettings, delta: float,
                              known: Mapping[float, Mapping[str, float]] | None = None, **sweep_args) -> dict:
    """Mean client test accuracy of local-only training, DP-FedAvg + fine-tuning and Centaur at one
    heterogeneity level (``classes_per_client``) for every budget of ``epsilons`` (the lecture's
    "across privacy budgets" comparison, Shen et al. 2023, Sec. 5).

    For each ``eps`` the noise multiplier is calibrated with the RDP accountant
    (:func:`fedlab.privacy.dp_fedavg.noise_multiplier_for_epsilon` for McMahan et al.'s float Gaussian at
    ``dp.sampling_prob`` and ``delta``, which must be below ``1 / task.num_clients``) and replaces
    ``dp.noise_multiplier``; then :func:`personalization_sweep` runs with ``[classes_per_client]``, ``task``,
    ``dp`` and ``sweep_args`` (its ``local``, ``schedule``, ``seed``). Local-only training spends no budget: it runs
    once and its accuracy is entered for every ``eps``. ``known`` (``{eps: {method: accuracy}}``) holds results
    already measured with the same settings and level (e.g. from :func:`personalization_sweep`); those are
    copied, not rerun.

    Returns ``{"util": {method: {eps: accuracy}}, "z": {eps: noise multiplier}}``.
    Raises ``ValueError`` for no budgets, a budget that is not ``> 0`` and finite, ``delta`` not in
    ``(0, 1 / task.num_clients)``, ``dp.safe`` (the calibration is the float Gaussian's), or a ``known`` entry
    that lacks a method.
    """
    epsilons = [float(e) for e in epsilons]
    if not epsilons or any(not (e > 0 and np.isfinite(e)) for e in epsilons):
        raise ValueError(f"epsilons must be a non-empty list of finite budgets > 0, got {epsilons}")
    if not isinstance(task, PersonalizationTask) or not isinstance(dp, DPSettings):
        raise ValueError(f"task must be a PersonalizationTask and dp a fedlab.fl.dp_fedavg.DPSettings, got {task!r}, {dp!r}")
    if dp.safe:
        raise ValueError("dp.safe must be False: the budgets are calibrated for McMahan et al.'s float Gaussian")
    num_clients, sampling_prob = task.num_clients, dp.sampling_prob
    dpf.check_delta(delta, num_clients)
    known = {float(e): dict(v) for e, v in (known or {}).items()}
    for e, v in known.items():
        if set(v) != set(PERSONALIZATION_METHODS):
            raise ValueError(f"known[{e}] must hold every method {list(PERSONALIZATION_METHODS)}, got {sorted(v)}")
    util = {m: {} for m in PERSONALIZATION_METHODS}
    zs = {}
    local = next((v["local-only"] for v in known.values()), None)
    settings, todo = [], []
    for eps in epsilons:
        zs[eps] = dpf.noise_multiplier_for_epsilon(eps, sampling_prob, num_rounds, delta, num_clients=num_clients,
                                                   safe=False)
        if eps not in known:
            # local-only spends no budget: it runs once, with the first budget not already known
            methods = [m for m in PERSONALIZATION_METHODS if m != "local-only" or (local is None and not todo)]
            settings.append((classes_per_client, zs[eps], methods))
            todo.append(eps)
    # personalization_sweep([classes_per_client], noise_multiplier=z) for every budget, the runs advanced together
    ran = dict(zip(todo, _personalization_runs(model, params, settings, task=task, num_rounds=num_rounds, dp=dp,
                                               **sweep_args))) if todo else {}
    for eps in epsilons:
        u = known[eps] if eps in known else ran[eps][0]
        if local is None:
            local = u["local-only"]
        for m in PERSONALIZATION_METHODS:
            util[m][eps] = local if m == "local-only" else u[m]
    return {"util": util, "z": zs}


def _eps_tag(eps: float) -> str:
    return f"{eps:g}".replace(".", "p")


def personalization_eps_values(util_eps: Mapping[str, Mapping[float, float]]) -> dict:
    """``{name: value}`` the chapter quotes from :func:`personalization_eps_sweep` (unrounded): per
    budget ``pe_<lo|ft|ce>_<eps>`` (``eps`` written with ``p`` for the point, e.g. ``pe_ce_0p5``), the
    differences ``pe_ce_minus_lo_<eps>``, ``pe_ce_minus_ft_<eps>``, ``pe_min_ce_minus_lo`` (the
    smallest Centaur minus local-only over the budgets) and, when some ``eps >= 1``,
    ``pe_min_ce_minus_lo_ge1`` (the same over those budgets). Raises ``ValueError`` if a method is missing
    or the methods disagree on the budgets."""
    missing = [m for m in PERSONALIZATION_METHODS if m not in util_eps]
    if missing:
        raise ValueError(f"util_eps lacks the methods {missing}")
    epsilons = list(util_eps["Centaur"])
    if not epsilons or any(list(util_eps[m]) != epsilons for m in PERSONALIZATION_METHODS):
        raise ValueError("util_eps must hold the same, non-empty list of budgets for every method")
    out = {}
    for eps in epsilons:
        t = _eps_tag(eps)
        for m, tag in PERSONALIZATION_METHODS.items():
            out[f"pe_{tag}_{t}"] = util_eps[m][eps]
        out[f"pe_ce_minus_lo_{t}"] = util_eps["Centaur"][eps] - util_eps["local-only"][eps]
        out[f"pe_ce_minus_ft_{t}"] = util_eps["Centaur"][eps] - util_eps["DP-FedAvg + fine-tuning"][eps]
    out["pe_min_ce_minus_lo"] = min(out[f"pe_ce_minus_lo_{_eps_tag(e)}"] for e in epsilons)
    if any(e >= 1 for e in epsilons):
        out["pe_min_ce_minus_lo_ge1"] = min(out[f"pe_ce_minus_lo_{_eps_tag(e)}"] for e in epsilons if e >= 1)
    return out


def personalization_eps_table(util_eps: Mapping[str, Mapping[float, float]], paper: Callable[[str], str]):
    """The budget sweep as a Markdown table, one row per ``eps``: this build's three accuracies, and
    the stored paper-scale record's Centaur minus local-only and Centaur minus DP-FedAvg +
    fine-tuning (``paper(name)``, mean ± 95 % CI over seeds, :meth:`fedlab.records.Run.stored`)."""
    from ..plots import md_table

    vals = personalization_eps_values(util_eps)
    rows = []
    for eps in util_eps["Centaur"]:
        t = _eps_tag(eps)
        rows.append([f"{eps:g}", round(vals[f"pe_lo_{t}"], 3), round(vals[f"pe_ft_{t}"], 3), round(vals[f"pe_ce_{t}"], 3),
                     paper(f"pe_ce_minus_lo_{t}"), paper(f"pe_ce_minus_ft_{t}")])
    return md_table(["ε", "local-only", "DP-FedAvg + FT", "Centaur",
                     "Centaur − local-only, paper scale (mean ± 95 % CI)", "Centaur − DP-FedAvg + FT, paper scale"], rows)
