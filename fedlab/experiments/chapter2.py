"""The experiments of Chapters 2 and 2b: London (2020), "PAC identifiability in federated personalization".
Chapter 2: Theorem 1 (exact recovery by Protocol 2, Sec. 4), Theorems 2 and 3 (noisy messages, Eq. 3; SGD
without replacement, Protocol 3, App. A.4) measured against their bounds, and the bounds' slack; chapter 2b:
Eq. (3) with clipping as a Gaussian mechanism (the attack's price in epsilon, footnote 5) and the defenses of
Sec. 6 (refusing all-zero item vectors, secure aggregation, the labels one honest message leaks).

The attack and the bounds are :mod:`fedlab.attacks.identifiability`; the federated recommender is
:mod:`fedlab.fl.recsys.ratings`. The functions here run the chapter's sweeps in the order the chapter
runs them (so that every number is the one the chapter has always printed), draw its figures and
build its tables; the page glues what they return.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from .._checks import in_range, positive_int
from .._stats import bounded_interval
from ..attacks import identifiability as pac
from ..fl.recsys import ratings as rec
from ..metrics import t_interval
from ..privacy import ldp

__all__ = ["Theorem1Row", "theorem1_sweep", "plot_theorem1", "theorem1_rows", "theorem1_fail_name",
           "theorem1_table", "noisy_error_curves", "noisy_panels", "noisy_summary", "attack_error_panel",
           "probe_defense", "secagg_experiment", "secagg_rows", "label_leak", "slack_chain", "slack_totals",
           "bound_checks", "bound_checks_table", "slack_table", "epsilon_sweep", "plot_epsilon_sweep", "dp_composition", "dp_error_targets",
           "plot_dp_composition"]


def _grid(t_max: int, bounds) -> list[int]:
    """30 log-spaced interaction counts in ``1..t_max`` and every bound's ``T`` (so each is measured)."""
    return sorted(set(np.geomspace(1, t_max, 30).round().astype(int).tolist()) | set(bounds))


# ---------------------------------------------------------------------------------------------------
# Theorem 1: exact recovery (London 2020, Sec. 4)
# ---------------------------------------------------------------------------------------------------

class Theorem1Row(NamedTuple):
    """One row of the Theorem 1 check: preference rate ``p``, batch size ``B``, the theorem's ``t1``,
    the measured failure rate ``fail`` and the exact failure probability ``exact`` at ``t1``, the
    smallest ``t_exact`` whose exact failure is at most ``delta``, and ``ratio = t1 / t_exact``."""
    p: float
    B: int
    t1: int
    fail: float
    exact: float
    t_exact: int
    ratio: float


def theorem1_sweep(pop, pref_rates: Sequence[float], batch_sizes: Sequence[int], *, delta: float,
                   num_trials: int, lr: float = 1.0, loss: str = "hinge", seed: int = 0) -> dict:
    """Protocol 2 (London 2020) against one user per preference rate, ``num_trials`` independent runs
    each, for every batch size ``B``: the success rate of exact sign recovery (error 0 in Definition 1)
    after each ``T`` of a log grid up to twice the largest ``T`` of Theorem 1, with Theorem 1's
    ``T = ceil(2 ln(1/delta) / (B (1 - 2p)^2))`` of every ``p`` on the grid.

    ``pop``: a :class:`~fedlab.fl.recsys.ratings.RecData` whose users ``0..len(pref_rates)-1`` like a
    fraction ``pref_rates`` of their rated items. The run for ``B`` uses seed ``seed + B``.

    Returns ``{B: {"T": [J] array of interaction counts, "success": [J, len(pref_rates)] array,
    "T1": {p: Theorem 1's T}}}``. Raises ``ValueError`` for ``delta`` outside (0, 1), ``num_trials < 1``
    or a population with fewer users than ``pref_rates``.
    """
    delta = in_range("delta", delta, 0.0, 1.0)
    num_trials = positive_int("num_trials", num_trials)
    if pop.user_vectors.shape[0] < len(pref_rates):
        raise ValueError(f"pop has {pop.user_vectors.shape[0]} users, fewer than the {len(pref_rates)} pref_rates")
    out = {}
    for B in batch_sizes:
        T1 = {p: math.ceil(pac.theorem1_num_interactions(p, B, delta)) for p in pref_rates}
        t_max = 2 * max(T1.values())
        T, err = pac.attack_error_curve(pop.user_vectors, pop.items, pop.y, pop.item_vectors, num_trials=num_trials,
                                        num_interactions=t_max, client=pac.Client(batch_size=B, lr=lr, loss=loss),
                                        record_at=_grid(t_max, T1.values()), seed=seed + B)
        out[B] = {"T": np.array(T), "success": (err == 0).double().mean(-1).numpy(), "T1": T1}
    return out


def plot_theorem1(thm1: Mapping, pref_rates: Sequence[float], *, delta: float, num_rated: int):
    """One panel per batch size of :func:`theorem1_sweep`: the measured probability of exact recovery
    (dots), the exact one (solid, :func:`~fedlab.attacks.identifiability.theorem1_exact_failure` with ``num_rated``
    items), Hoeffding's bound (dashed) and Theorem 1's ``T`` (dotted). Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    from ..plots import PALETTE

    fig, axes = plt.subplots(1, len(thm1), figsize=(12, 5.0), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (B, res) in zip(axes, thm1.items()):
        T, succ = res["T"], res["success"]
        for j, p in enumerate(pref_rates):
            col = PALETTE[j]
            ax.plot(T, succ[:, j], "o", ms=4, color=col, label=f"measured, $p_c$={p}")
            ax.plot(T, 1 - pac.theorem1_exact_failure(T, p, B, num_rated), "-", lw=1.2, color=col)
            ax.plot(T, np.clip(1 - pac.theorem1_failure_bound(T, p, B), 0, 1), "--", lw=1.2, color=col)
            ax.axvline(res["T1"][p], color=col, ls=":", lw=1)
        ax.axhline(1 - delta, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="interactions T", title=f"B = {B}")
    axes[0].set_ylabel("P(exact recovery, $\\epsilon$ = 0)")
    axes[0].legend(loc="lower right", fontsize=9)
    fig.suptitle("Theorem 1: dots measured, solid exact, dashed Hoeffding bound,\n"
                 f"dotted T of the theorem ($\\delta$ = {delta:g})")
    return fig, axes


def theorem1_rows(thm1: Mapping, pref_rates: Sequence[float], *, delta: float, num_rated: int) -> list[Theorem1Row]:
    """One :class:`Theorem1Row` per batch size (outer) and preference rate (inner) of
    :func:`theorem1_sweep`: the measured failure at Theorem 1's ``T``, the exact failure there, and the
    smallest ``T`` whose exact failure (sampling ``B`` of ``num_rated`` items without replacement) is
    at most ``delta``. Raises ``ValueError`` for ``delta`` outside (0, 1)."""
    delta = in_range("delta", delta, 0.0, 1.0)
    rows = []
    for B, res in thm1.items():
        T, succ = res["T"], res["success"]
        for j, p in enumerate(pref_rates):
            t1 = res["T1"][p]
            fail_at = 1 - succ[list(T).index(t1), j]
            exact_at = pac.theorem1_exact_failure([t1], p, B, num_rated)[0]
            t_exact = int(np.argmax(pac.theorem1_exact_failure(np.arange(1, t1 + 1), p, B, num_rated) <= delta)) + 1
            rows.append(Theorem1Row(p, B, t1, fail_at, exact_at, t_exact, t1 / t_exact))
    return rows


def theorem1_fail_name(p: float, B: int) -> str:
    """The glue name of the measured failure at Theorem 1's ``T``: ``ch2_t1_fail_p<10p>_b<B>``."""
    return f"ch2_t1_fail_p{round(10 * p):02d}_b{B}"


def theorem1_table(rows: Sequence[Theorem1Row], paper: Callable[..., str]) -> str:
    """The Theorem 1 rows as a Markdown table, with the stored paper-scale record's measured failure
    (``paper(name, 4, value_range=(0, 1))``, e.g. :meth:`fedlab.records.Run.stored`: a failure rate, its
    interval cut to [0, 1]) beside ours (:func:`fedlab.plots.md_table`)."""
    from ..plots import md_table

    header = ["$p_c$", "$B$", "$T$ of Theorem 1", "measured failure at that $T$",
              "measured failure, paper scale (mean [95 % CI], n seeds)", "exact failure",
              "smallest $T$ with exact failure $\\le\\delta$", "bound / needed"]
    return md_table(header, [[f"{p}", f"{B}", f"{t1}", f"{f:.4f}", paper(theorem1_fail_name(p, B), 4, value_range=(0, 1)), f"{e:.4f}",
                              f"{te}", f"{r:.1f}"] for p, B, t1, f, e, te, r in rows])


# ---------------------------------------------------------------------------------------------------
# Theorems 2 and 3: noisy messages (Eq. 3), by batches (Protocol 1) or by epochs (Protocol 3)
# ---------------------------------------------------------------------------------------------------

def noisy_error_curves(target, sigmas: Sequence[float], T_bound: Mapping[float, int], *, batch_size: int, lr: float,
                       num_trials: int, protocol: int = 2, loss: str = "hinge", seed: int = 0):
    """The attack on one user with Eq. (3) noise, one noise level per copy of the user, in one batch
    (:func:`~fedlab.attacks.identifiability.attack_error_curve`; ``protocol`` 2 for Theorem 2, 3 for Theorem 3).

    ``target``: a :class:`~fedlab.fl.recsys.ratings.RecData` of one user; ``T_bound``: the theorem's
    ``T`` for every ``sigma``. The error is recorded on a log grid up to ``1.25 * max(T_bound)`` that
    contains every bound's ``T``. Returns ``(T, err)``: the list of interaction counts ``[J]`` and the
    errors ``[J, len(sigmas), num_trials]``. Raises ``ValueError`` for a target that is not one user or
    a ``sigma`` without a bound.
    """
    if target.user_vectors.shape[0] != 1:
        raise ValueError(f"target must hold one user, got {target.user_vectors.shape[0]}")
    missing = [s for s in sigmas if s not in T_bound]
    if missing:
        raise ValueError(f"T_bound has no T for sigma {missing}")
    reps = len(sigmas)
    t_max = math.ceil(1.25 * max(T_bound.values()))
    return pac.attack_error_curve(target.user_vectors.repeat(reps, 1), target.items.repeat(reps, 1),
                                  target.y.repeat(reps, 1), target.item_vectors, num_trials=num_trials,
                                  num_interactions=t_max,
                                  client=pac.Client(batch_size=batch_size, lr=lr, loss=loss, sigma=torch.tensor(sigmas)),
                                  record_at=_grid(t_max, T_bound.values()), protocol=protocol, seed=seed)


def noisy_panels(T, err: torch.Tensor, sigmas: Sequence[float], T_bound: Mapping[float, int], title: str, *,
                 eps: float, delta: float):
    """Two panels from :func:`noisy_error_curves`: the mean error (Definition 1) and the probability
    that it exceeds ``eps`` against ``T``, one colour per ``sigma``, the bound's ``T`` dotted, ``eps``
    and ``delta`` dashed. Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    from ..plots import PALETTE

    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.0))
    for j, s in enumerate(sigmas):
        col = PALETTE[j]
        axes[0].plot(T, err[:, j].mean(-1).numpy(), color=col, label=f"$\\sigma$ = {s}")
        axes[1].plot(T, (err[:, j] > eps).double().mean(-1).numpy(), color=col, label=f"$\\sigma$ = {s}")
        for ax in axes:
            ax.axvline(T_bound[s], color=col, ls=":", lw=1.2)
    axes[0].axhline(eps, color="gray", ls="--", lw=1)
    axes[1].axhline(delta, color="gray", ls="--", lw=1)
    axes[0].set(xscale="log", xlabel="interactions T", ylabel="mean error rate (Def. 1)")
    axes[1].set(xscale="log", xlabel="interactions T", ylabel="P(error > $\\epsilon$)")
    axes[0].legend()
    fig.suptitle(title)
    return fig, axes


def noisy_summary(T, err: torch.Tensor, sigmas: Sequence[float], T_bound: Mapping[float, int], *,
                  eps: float, delta: float) -> dict:
    """What Theorems 2-3 promise, measured: for every ``sigma``, ``{"T"`` (the bound's), ``"fail"``
    (P(error > eps) there), ``"mean_err"`` (mean error there), ``"first_ok"`` (the first ``T`` of the
    grid with P(error > eps) <= delta, ``None`` if none)``}``. Raises ``ValueError`` if a bound's ``T``
    is not on the grid ``T``."""
    T = list(T)
    out = {}
    for j, s in enumerate(sigmas):
        if T_bound[s] not in T:
            raise ValueError(f"the bound's T = {T_bound[s]} for sigma = {s} is not on the grid T")
        fail = (err[:, j] > eps).double().mean(-1).numpy()
        i = T.index(T_bound[s])
        ok = [t for t, f in zip(T, fail) if f <= delta]
        out[s] = {"T": T_bound[s], "fail": float(fail[i]), "mean_err": float(err[i, j].mean()),
                  "first_ok": ok[0] if ok else None}
    return out


def slack_chain(law: "pac.AttackLaw", *, epsilon: float, delta: float, beta_grid: int = 49) -> dict:
    """Where the slack of Theorem 2 (``law.protocol == 2``) or Theorem 3 (``3``) goes, one step of the
    proof (London 2020, App. A.3-A.4) at a time: each stage is the smallest ``T`` at which a weaker
    requirement holds with probability ``>= 1 - delta``.

    * ``"paper"``: the theorem's ``T`` (Theorem 2 with the chapter's ``beta = (1 - 2 p_c) / 2``);
    * ``"beta*"``: the theorem with the best ``beta`` (:func:`~fedlab.attacks.identifiability.theorem2_optimal_beta`;
      Theorem 3 has no ``beta``);
    * ``"norms"``: the union bound with each item's own ``||v_i||`` instead of ``M`` (``beta`` re-optimised);
    * ``"events"``: the exact probability of the proof's events (E1 and E2, or Eq. 10 for all items): no
      Hoeffding, Gaussian tail or union bound, no split of ``delta`` (``beta`` the best of a grid);
    * ``"above_tau"``: every item with ``|u_c . v_i| >= tau_c(eps)`` gets the right sign (what the
      events are sufficient for);
    * ``"error"``: Definition 1's error is at most ``eps`` (what the theorem promises).

    Returns ``{"T": {stage: T}, "factor": {"beta", "M", "tails", "events", "epsilon": ratio of
    consecutive stages}, "total": paper / error, "tau": tau_c(eps), "beta": the grid's best beta}``; the
    factors multiply to the total. Raises ``ValueError`` for ``delta`` outside (0, 1) or ``epsilon``
    outside [0, 1)."""
    delta = in_range("delta", delta, 0.0, 1.0)
    epsilon = in_range("epsilon", epsilon, 0.0, 1.0, low_closed=True)
    tau = law.tau(epsilon)
    a = law.multiplier
    if law.protocol == 2:
        T_paper = law.bound(epsilon, delta, beta=0.5 * a)
        T_beta = law.bound(epsilon, delta)
        c1 = 2 * math.log(2 / delta) / law.batch_size                  # t1 = c1 / (a - beta)^2
        U1 = law.union_bound_needed(1.0, tau, delta / 2)                 # union term = U1 / beta^2
        b = a * math.sqrt(U1) / (math.sqrt(c1) + math.sqrt(U1))
        T_norms = max(c1 / (a - b) ** 2, U1 / b ** 2)
        betas = a * np.linspace(0.02, 0.98, beta_grid)
        T_events = law.needed("E1E2", delta, tau=tau, beta=betas)
        best_beta = float(betas[np.argmin([law.fail(T_events, "E1E2", tau=tau, beta=bb) for bb in betas])])
    else:
        T_paper = T_beta = law.bound(epsilon, delta)
        T_norms = law.union_bound_needed(a, tau, delta)
        T_events, best_beta = law.needed("E1E2", delta, tau=tau), None
    T = {"paper": T_paper, "beta*": T_beta, "norms": T_norms, "events": float(T_events),
         "above_tau": float(law.needed("above_tau", delta, tau=tau)),
         "error": float(law.needed("error", delta, epsilon=epsilon))}
    names = ["beta", "M", "tails", "events", "epsilon"]
    vals = list(T.values())
    factor = {n: vals[i] / vals[i + 1] for i, n in enumerate(names)}
    return {"T": T, "factor": factor, "total": T_paper / T["error"], "tau": tau, "beta": best_beta}


def slack_totals(targets: Sequence, *, epsilon: float, delta: float, sigma: float, batch_sizes: Mapping[int, int],
                 lr: float, loss: str, seed: int = 0) -> dict:
    """The total slack of Theorems 2 and 3 (London 2020, App. A.3-A.4), the theorem's ``T`` over the ``T``
    the attack needs (``slack_chain(...)["total"]``), for each of several target users, so that it can
    be reported as a range over targets instead of one target's value.

    ``targets``: one-user :class:`~fedlab.fl.recsys.ratings.RecData` each (its ``pref_rate``, its ``N``
    rated items and its own catalog); ``batch_sizes``: ``{protocol (2 or 3): B}``. Each target gets an
    :class:`~fedlab.attacks.identifiability.AttackLaw` per protocol at noise ``sigma`` (its Monte Carlo
    draws seeded ``seed``). Returns ``{protocol: [len(targets)] float64 array of totals}``. Raises
    ``ValueError`` for no target, a target with more than one user, a protocol other than 2 or 3, and
    the errors of :func:`slack_chain` and :class:`~fedlab.attacks.identifiability.AttackLaw`."""
    if len(targets) < 1:
        raise ValueError("targets must hold at least one target user")
    if any(t.user_vectors.shape[0] != 1 for t in targets):
        raise ValueError("targets must be one-user RecData (user_vectors [1, k])")
    if not batch_sizes or any(p not in (2, 3) for p in batch_sizes):
        raise ValueError(f"batch_sizes must map protocol 2 and/or 3 to a batch size, got {dict(batch_sizes)}")
    out = {}
    for protocol, B in batch_sizes.items():
        out[protocol] = np.array([slack_chain(pac.AttackLaw(
            t.user_vectors[0], t.item_vectors, pref_rate=float(t.pref_rate[0]), num_rated=int(t.items.shape[1]),
            batch_size=B, sigma=sigma, lr=lr, loss=loss, protocol=protocol, seed=seed),
            epsilon=epsilon, delta=delta)["total"] for t in targets], dtype=np.float64)
    return out


def bound_checks(law2: "pac.AttackLaw", law3: "pac.AttackLaw", *, epsilon: float, delta: float,
                 thm1_pref_rate: float = 0.4, thm1_num_rated: int = 20) -> dict:
    """Checks of Theorems 1-3 that a wrong constant breaks (London 2020, App. A.2-A.4): each theorem's
    ``T`` (and each term of Theorem 2's maximum on its own) is read from the bound functions of
    :mod:`fedlab.attacks.identifiability`, and the probability that the event that term controls
    fails there is computed exactly or by :class:`~fedlab.attacks.identifiability.AttackLaw`:

    * ``"thm1"``: Theorem 1 at ``p_c = thm1_pref_rate``, ``B = 1`` (where Hoeffding is nearly tight),
      exact failure, allowed ``delta``;
    * ``"thm2_E1"``: ``not E1`` at the first term ``t1`` (``beta*``), allowed ``delta / 2``;
    * ``"thm2_E2"``: ``not E2`` at the second term ``t2``, allowed ``delta / 2``;
    * ``"thm2_error"``, ``"thm3_error"``: Definition 1's error above ``epsilon`` at the theorem's ``T``,
      allowed ``delta`` (these pass even for a bound 5x too small: the slack of :func:`slack_chain`);
    * ``"thm3_events"``: Eq. (10) fails for some item at Theorem 3's ``T``, allowed ``delta``.

    Returns ``{name: (T, measured failure, allowed)}``. Raises ``ValueError`` for a ``law2`` that is
    not Protocol 2 or a ``law3`` that is not Protocol 3."""
    if law2.protocol != 2 or law3.protocol != 3:
        raise ValueError(f"law2 must be Protocol 2 and law3 Protocol 3, got {law2.protocol} and {law3.protocol}")
    delta = in_range("delta", delta, 0.0, 1.0)
    T1 = math.ceil(pac.theorem1_num_interactions(thm1_pref_rate, 1, delta))
    out = {"thm1": (T1, float(pac.theorem1_exact_failure([T1], thm1_pref_rate, 1, thm1_num_rated)[0]), delta)}
    tau2, tau3 = law2.tau(epsilon), law3.tau(epsilon)
    client2 = pac.Client(batch_size=law2.batch_size, lr=law2.lr, loss=law2.loss, sigma=law2.sigma)
    beta = pac.theorem2_optimal_beta(law2.pref_rate, client2, delta, law2.item_norm_bound, law2.num_items, tau2)
    T2, t1, t2 = (math.ceil(x) for x in law2.bound(epsilon, delta, beta=beta, return_terms=True))
    out["thm2_E1"] = (t1, law2.fail(t1, "E1", beta=beta), delta / 2)
    out["thm2_E2"] = (t2, law2.fail(t2, "E2", beta=beta, tau=tau2), delta / 2)
    out["thm2_error"] = (T2, law2.fail(T2, "error", epsilon=epsilon), delta)
    T3 = math.ceil(law3.bound(epsilon, delta))
    out["thm3_events"] = (T3, law3.fail(T3, "E2", tau=tau3), delta)
    out["thm3_error"] = (T3, law3.fail(T3, "error", epsilon=epsilon), delta)
    return out


CHECK_LABELS = {"thm1": "Theorem 1, $p_c$ = 0.4, $B$ = 1: P(error > 0) (exact)",
                "thm2_E1": "Theorem 2, first term $t_1$ alone: P(not $E_1$) (exact)",
                "thm2_E2": "Theorem 2, second term $t_2$ alone: P(not $E_2$)",
                "thm2_error": "Theorem 2, $T$: P(error > $\\epsilon$)",
                "thm3_events": "Theorem 3, $T$: P(Eq. 10 fails for some item)",
                "thm3_error": "Theorem 3, $T$: P(error > $\\epsilon$)"}
SLACK_LABELS = {"beta": "$\\beta=(1-2p_c)/2$ vs best $\\beta$", "M": "worst-case norm $M$ vs each $\\|\\mathbf v_i\\|$",
                "tails": "Hoeffding, Gaussian tail, union bound, $\\delta/2$ split vs exact P($E_1\\wedge E_2$)",
                "events": "one $\\beta$, one $\\tau$ for all items vs every item above $\\tau_c$ right",
                "epsilon": "every item above $\\tau_c$ right vs only error $\\le\\epsilon$"}


def bound_checks_table(checks: Mapping) -> str:
    """:func:`bound_checks` as a Markdown table: the check, the ``T`` it is read at, the measured
    failure probability, what the proof allows there, and the failure at ``0.2 T``'s bound is not
    shown (the mutation test of ``tests/test_ch2.py`` runs it); :func:`fedlab.plots.md_table`."""
    from ..plots import md_table

    return md_table(["check", "$T$", "failure probability", "allowed"],
                    [[f"{CHECK_LABELS.get(k, k)}", f"{T}", f"{f:.4f}", f"{a:.3f}"] for k, (T, f, a) in checks.items()])


def slack_table(chains: Mapping) -> str:
    """Markdown table of :func:`slack_chain` results ``{column title: chain}``: one row per factor,
    the ``T`` of the theorem and the ``T`` needed, and the total (:func:`fedlab.plots.md_table`)."""
    from ..plots import md_table

    def row(label, fmt, get):
        return [label] + [format(get(c), fmt) for c in chains.values()]

    rows = [row("$T$ of the theorem (paper's $\\beta$)", ".0f", lambda c: c["T"]["paper"])]
    rows += [row(f"factor: {SLACK_LABELS[n]}".replace("\\|", "|"), ".2f", lambda c, n=n: c["factor"][n])   # md_table escapes |
             for n in SLACK_LABELS]
    rows += [row("$T$ needed for P(error > $\\epsilon$) $\\le\\delta$", ".0f", lambda c: c["T"]["error"]),
             row("total: theorem / needed", ".1f", lambda c: c["total"])]
    return md_table([""] + list(chains), rows)


def epsilon_sweep(laws: Mapping, epsilons: Sequence[float], *, delta: float) -> dict:
    """For each ``{name: AttackLaw}`` and ``eps``: ``tau_c(eps)``, the theorem's ``T`` (Theorem 2 at
    ``beta = (1 - 2 p_c) / 2`` and at the best ``beta``) and the ``T`` the attack needs for
    P(error > eps) <= delta (:meth:`~fedlab.attacks.identifiability.AttackLaw.needed`).
    Returns ``{name: {"tau", "paper", "best_beta", "needed": [len(epsilons)] arrays}}``."""
    delta = in_range("delta", delta, 0.0, 1.0)
    out = {}
    for name, law in laws.items():
        rows = {"tau": [], "paper": [], "best_beta": [], "needed": []}
        for eps in epsilons:
            rows["tau"].append(law.tau(eps))
            rows["paper"].append(law.bound(eps, delta, beta=0.5 * law.multiplier) if law.protocol == 2
                                 else law.bound(eps, delta))
            rows["best_beta"].append(law.bound(eps, delta))
            rows["needed"].append(law.needed("error", delta, epsilon=eps))
        out[name] = {k: np.array(v, dtype=float) for k, v in rows.items()}
    return out


def plot_epsilon_sweep(sweep: Mapping, epsilons: Sequence[float]):
    """The theorem's ``T`` and the ``T`` needed against ``eps`` (log scale), one colour per law of
    :func:`epsilon_sweep`; ``eps = 0`` is drawn at the left edge. Returns ``(fig, ax)``."""
    import matplotlib.pyplot as plt

    from ..plots import PALETTE

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    x = np.arange(len(epsilons))
    for j, (name, r) in enumerate(sweep.items()):
        col = PALETTE[j]
        ax.plot(x, r["paper"], "--", color=col, label=f"{name}: theorem's T")
        if not np.allclose(r["paper"], r["best_beta"]):
            ax.plot(x, r["best_beta"], ":", color=col, label=f"{name}: theorem, best $\\beta$")
        ax.plot(x, r["needed"], "o-", color=col, label=f"{name}: needed (exact law)")
    ax.set(yscale="log", xticks=x, xticklabels=[f"{e:g}" for e in epsilons], xlabel="$\\epsilon$",
           ylabel="interactions T", title="How many interactions: the theorems against what the attack needs")
    ax.legend(fontsize=8)
    return fig, ax


def _dp_point(law: "pac.AttackLaw", z: float, *, clip_norm: float, epsilon: float, delta: float,
              dp_delta: float, bound: bool) -> dict:
    """One noise multiplier ``z``: Eq. (3)'s ``sigma`` for it, the attack's ``T`` and its DP cost."""
    n = law.batch_size if law.protocol == 2 else law.num_rated     # items one message changes
    sigma = 2.0 * z * clip_norm * math.sqrt(n)                     # ldp_noise_multiplier(sigma, C, n) = z
    equiv = law.with_sigma(pac.clipped_sigma(sigma, clip_norm, law.user_norm, lr=law.lr, loss=law.loss))
    out = {"z": z, "sigma": sigma, "needed": equiv.needed("error", delta, epsilon=epsilon)}
    out["eps_needed"] = ldp.gaussian_composed_epsilon(z, out["needed"], dp_delta)
    out["mu_needed"] = math.sqrt(out["needed"]) / z
    if bound:
        out["bound"] = math.ceil(equiv.bound(epsilon, delta))
        out["eps_bound"] = ldp.gaussian_composed_epsilon(z, out["bound"], dp_delta)
    return out


def dp_composition(laws: Mapping, noise_multipliers: Sequence[float], *, clip_norm: float, epsilon: float,
                   delta: float, dp_delta: float) -> dict:
    """London 2020, footnote 5: Eq. (3) with each item's delta clipped to ``clip_norm`` is a Gaussian
    mechanism. For each ``{name: AttackLaw}`` and noise multiplier ``z``, the client's ``sigma`` is the
    one that makes a message ``z``-noisy for its local-DP sensitivity
    (:func:`~fedlab.privacy.ldp.ldp_noise_multiplier`: ``2 C sqrt(n)``, ``n`` = the items one message
    changes, ``B`` for Protocol 2 and ``N`` for Protocol 3); the attack's exact law
    (:func:`~fedlab.attacks.identifiability.clipped_sigma`) gives the ``T`` it needs for
    ``P(error > epsilon) <= delta``, the theorem the ``T`` it promises, and
    :func:`~fedlab.privacy.ldp.gaussian_composed_epsilon` the ``epsilon_DP`` (at ``dp_delta``) that
    ``T`` messages cost the client. Returns ``{name: {key: array [len(noise_multipliers)]}}`` with keys
    ``z, sigma, needed, eps_needed, mu_needed, bound, eps_bound``. Raises ``ValueError`` for
    ``clip_norm`` or a multiplier not positive, ``delta`` / ``dp_delta`` outside (0, 1)."""
    in_range("delta", delta, 0.0, 1.0)
    in_range("dp_delta", dp_delta, 0.0, 1.0)
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if not all(z > 0 for z in noise_multipliers):
        raise ValueError(f"noise_multipliers must all be > 0, got {list(noise_multipliers)}")
    out = {}
    for name, law in laws.items():
        rows = [_dp_point(law, float(z), clip_norm=clip_norm, epsilon=epsilon, delta=delta, dp_delta=dp_delta,
                          bound=True) for z in noise_multipliers]
        out[name] = {k: np.array([r[k] for r in rows], dtype=float) for k in rows[0]}
    return out


def dp_error_targets(law: "pac.AttackLaw", targets: Sequence[float], *, noise_multiplier: float,
                     clip_norm: float, delta: float, dp_delta: float) -> dict:
    """The ``epsilon_DP`` the attack of :func:`dp_composition` must cost the client before
    ``P(error > target) <= delta``, for each error target of Definition 1 (at one noise multiplier).
    Returns ``{"target", "needed", "eps_needed", "mu_needed"}`` arrays ``[len(targets)]``."""
    in_range("delta", delta, 0.0, 1.0)
    rows = [_dp_point(law, float(noise_multiplier), clip_norm=clip_norm, epsilon=float(t), delta=delta,
                      dp_delta=dp_delta, bound=False) for t in targets]
    out = {k: np.array([r[k] for r in rows], dtype=float) for k in ("needed", "eps_needed", "mu_needed")}
    out["target"] = np.asarray(targets, dtype=float)
    return out


def plot_dp_composition(comp: Mapping, targets: Mapping, *, floor_eps: float, epsilon: float, delta: float,
                        dp_delta: float):
    """Left: interactions the attack needs (filled) and the theorem's ``T`` (open) against the
    composed ``epsilon_DP``, one point per noise multiplier, one colour per law of
    :func:`dp_composition`, with the floor below which no attack can succeed. Right: the
    ``epsilon_DP`` needed against the error target (:func:`dp_error_targets`). Returns ``(fig, axes)``."""
    import matplotlib.pyplot as plt

    from ..plots import PALETTE

    # one above the other: side by side the 12-inch figure is shrunk to the text column and its legends
    # and labels came out about 6 px high
    fig, axes = plt.subplots(2, 1, figsize=(7.5, 9.0), layout="constrained")
    ax = axes[0]
    for j, (name, r) in enumerate(comp.items()):
        col, mk = PALETTE[j], "ox+^"[j % 4]
        ax.plot(r["eps_needed"], r["needed"], mk + "-", color=col, ms=7, label=f"{name}: attack needs (exact law)")
        ax.plot(r["eps_bound"], r["bound"], mk + "--", color=col, ms=7, mfc="none", label=f"{name}: theorem's T")
        if j == 0:
            for z, e, t in zip(r["z"], r["eps_needed"], r["needed"]):
                ax.annotate(f"z = {z:g}", (e, t), xytext=(-8, 0), textcoords="offset points", ha="right",
                            va="center", fontsize=9)
    ax.axvspan(1.0, floor_eps, color="0.85", zorder=0,
               label=f"no attack reaches {1 - delta:g} (DP floor)")
    ax.set(xscale="log", yscale="log", xlabel=f"composed $\\epsilon_{{DP}}$ at $\\delta$ = {dp_delta:g}",
           ylabel="interactions T", title=f"P(error > {epsilon:g}) $\\leq$ {delta:g}: one point per noise multiplier z")
    ax.set_xlim(left=1.0)
    ax.legend(fontsize=9, loc="upper left")
    ax = axes[1]
    for j, (name, r) in enumerate(targets.items()):
        ax.plot(r["target"], r["eps_needed"], "ox+^"[j % 4] + "-", color=PALETTE[j], ms=7, label=name)
    ax.axhline(floor_eps, color="0.4", ls=":", label="DP floor (any attack)")
    ax.set(yscale="log", xlabel="error target $\\epsilon$ of Definition 1",
           ylabel="composed $\\epsilon_{DP}$ the attack needs", title="Coarser goals cost less budget")
    ax.legend(fontsize=9)
    return fig, axes


def attack_error_panel(pref_rate: float = 0.2, sigma: float = 0.1, batch_size: int = 5, num_interactions: int = 100,
                       *, eps: float, delta: float, num_trials: int, user_seed: int, seed: int, ax=None) -> torch.Tensor:
    """The chapter's widget: Protocol 2 with Eq. (3) noise ``sigma`` against one synthetic user
    (200 items, ``k = 4``, 20 rated, like rate ``pref_rate``; drawn with ``user_seed``), ``num_trials``
    runs of ``num_interactions`` interactions with batches of ``batch_size``, hinge loss, ``alpha = 1``.
    Draws the mean error and P(error > ``eps``) against ``T`` on ``ax`` (a new figure when ``None``)
    with Theorem 2's ``T`` (``beta = (1 - 2 p_c) / 2``) dotted, or, for ``sigma = 0``, P(error > 0) and
    Theorem 1's ``T`` (which promises error 0); a ``T`` beyond the axis is written, not drawn.
    Returns the errors ``[J, 1, num_trials]``. Raises ``ValueError`` for ``pref_rate`` outside (0, 1/2)."""
    import matplotlib.pyplot as plt

    p, B, T = pref_rate, batch_size, num_interactions
    if not 0.0 < p < 0.5:
        raise ValueError(f"pref_rate must be in (0, 1/2) (Assumption 1), got {p}")
    user = rec.make_synthetic(1, 200, 4, 20, p, seed=user_seed)
    grid = sorted(set(np.geomspace(1, T, 25).round().astype(int).tolist()))
    client = pac.Client(batch_size=B, lr=1.0, loss="hinge", sigma=sigma)
    Ts, err = pac.attack_error_curve(user.user_vectors, user.items, user.y, user.item_vectors,
                                     num_trials=num_trials, num_interactions=T, client=client, record_at=grid,
                                     seed=seed)
    eps = 0.0 if sigma == 0 else eps          # Theorem 1 promises error 0, not error <= eps
    tau_u = float(pac.tau_c(eps, user.user_vectors, user.item_vectors)[0])
    bound = (pac.theorem1_num_interactions(p, B, delta) if sigma == 0 else
             pac.theorem2_num_interactions(p, client, delta, 0.5 * (1 - 2 * p), pac.max_item_norm(user.item_vectors),
                                           200, tau_u))
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(Ts, err[:, 0].mean(-1).numpy(), label="mean error")
    ax.plot(Ts, (err[:, 0] > eps).double().mean(-1).numpy(), label=f"P(error > {eps:g})")
    if bound <= T:
        ax.axvline(bound, color="k", ls=":", label=f"theorem's T = {bound:.0f}")
    else:
        ax.annotate(f"theorem's T = {bound:.0f} (beyond the axis)", xy=(T, 0.5), xytext=(0.98, 0.55),
                    textcoords="axes fraction", ha="right", fontsize=8, arrowprops=dict(arrowstyle="->"))
    ax.axhline(eps, color="gray", ls="--", lw=0.8)
    ax.set(xscale="log", xlim=(1, T), ylim=(-0.02, 1.02), xlabel="interactions T",
           title=f"$p_c$={p}, $\\sigma$={sigma}, B={B}")
    ax.legend(fontsize=8)
    return err


# ---------------------------------------------------------------------------------------------------
# defenses (London 2020, Sec. 6)
# ---------------------------------------------------------------------------------------------------

def probe_defense(honest, data, *, num_interactions: int, batch_size: int, lr: float, loss: str, num_items: int,
                  seed: int = 0) -> tuple[dict, dict]:
    """The client-side check of London (2020, Sec. 6), refusing all-zero item vectors
    (:func:`~fedlab.attacks.identifiability.guarded_client_update`), and two ways around it.

    ``honest``: the trained :class:`~fedlab.fl.recsys.ratings.RecResult` (``user_vectors [C, k]``,
    ``item_vectors [I, k]``), ``data`` its :class:`~fedlab.fl.recsys.ratings.RecData`. Runs Protocol 2
    against guarded clients with the zero probe and with a probe of norm about ``1e-6``, then one
    honest round (the real item vectors) with ``R = 1`` and ``R = 5`` local steps; every run draws
    from a generator seeded with ``seed`` (the tiny probe from its own, also ``seed``).

    Returns ``(defense, abs_cos)``: the mean sign error of ``"zero probe, guarded client"`` and
    ``"tiny probe, guarded client"``, and ``{R: median |cos(u_hat, u)|}`` after one honest round.
    Raises ``ValueError`` for ``num_interactions < 1``.
    """
    num_interactions = positive_int("num_interactions", num_interactions)
    client = pac.Client(batch_size=batch_size, lr=lr, loss=loss)
    kw = dict(num_interactions=num_interactions, client=client, num_items=num_items)
    u, V = honest.user_vectors, honest.item_vectors
    blocked = pac.protocol2_attack(u, data.items, data.y, update=pac.guarded_client_update,
                                   generator=torch.Generator().manual_seed(seed), **kw)
    tiny = 1e-6 * torch.randn(num_items, u.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    evaded = pac.protocol2_attack(u, data.items, data.y, update=pac.guarded_client_update, server=pac.Server(probe=tiny),
                                  generator=torch.Generator().manual_seed(seed), **kw)
    one_round = {R: pac.protocol2_attack(u, data.items, data.y, num_interactions=1, client=replace(client, local_steps=R),
                                         server=pac.Server(probe=V), num_items=num_items,
                                         generator=torch.Generator().manual_seed(seed))
                 for R in [1, 5]}
    abs_cos = {R: float(torch.nn.functional.cosine_similarity(r.final, u, dim=1).abs().median())
               for R, r in one_round.items()}
    defense = {"zero probe, guarded client": float(pac.sign_error(blocked.final, u, V).mean()),
               "tiny probe, guarded client": float(pac.sign_error(evaded.final, u, V).mean())}
    return defense, abs_cos


def secagg_experiment(honest, data, cohorts: Sequence[int], *, client: pac.Client, num_items: int, repeats: int = 1,
                      seed: int = 0, dominance: float = 0.99, tol: float = 1e-9) -> dict:
    """One honest round of Protocol 1 (the real item vectors, ``R = client.local_steps``, 1 in the paper;
    the client's ``B``, ``lr`` and loss from ``client``, a :class:`~fedlab.attacks.identifiability.Client`
    without Eq. (3) noise) through secure aggregation
    (London 2020, Sec. 6; Bonawitz et al. 2017), which reveals per cohort of ``m`` clients the
    per-item sum of their deltas (:func:`~fedlab.attacks.identifiability.secure_aggregate_items`).
    Each client's deltas are multiples of its ``u_c``, so an item trained on by one member only
    exposes that member's vector up to sign (:func:`~fedlab.attacks.identifiability.exposed_members`,
    ``|cos(S_gi, u_c)| >= 1 - tol``).

    The exposed members are split by the route that exposes them:

    * *alone*: the member trained an item no other member of its cohort trained: a single-contributor
      sum, exactly a multiple of ``u_c``;
    * *dominated*: otherwise, a shared sum (two or more contributors) that exposes the member and that
      the member dominates: its contribution's norm ``||Delta v_ci||`` is at least ``dominance`` of the
      sum's L1 mass ``sum_j ||Delta v_ji||`` over the sum's contributors ``j`` (so the others together
      make up at most ``1 - dominance`` of it);
    * *other*: exposed by neither route (a shared sum that the member does not dominate and that still
      points along ``u_c``).

    Every repeat shuffles the clients into cohorts and runs the round again (one generator seeded
    ``seed``). Returns ``{m: {"exposed": [cohorts * repeats] fraction of each cohort's members
    exposed, "single": [cohorts * repeats] number of per-item sums with exactly one contributor,
    "exposed_alone", "exposed_dominated", "exposed_other": [cohorts * repeats] fraction of each
    cohort's members exposed by each route, "share": [n] float64, for each of the ``n`` members
    exposed only through shared sums, the largest share (own norm / the sum's L1 mass) among the
    shared sums that expose it}}``; ``exposed_alone + exposed_dominated + exposed_other = exposed``.
    Raises ``ValueError`` for a cohort size below 1 or one that does not divide the clients, for
    ``repeats < 1``, and for ``dominance`` or ``tol`` outside (0, 1).
    """
    if any(int(m) != m or m < 1 for m in cohorts):
        raise ValueError(f"cohorts must be positive integers, got {list(cohorts)}")
    if client.clip_norm is not None or bool((torch.as_tensor(client.sigma) != 0).any()):
        raise ValueError("client.sigma and client.clip_norm must keep their defaults (no Eq. 3 noise, no clipping): "
                         "the round is honest and exact")
    repeats = positive_int("repeats", repeats)
    dominance = in_range("dominance", dominance, 0.0, 1.0)
    tol = in_range("tol", tol, 0.0, 1.0)
    g = torch.Generator().manual_seed(seed)
    u, V = honest.user_vectors, honest.item_vectors
    out = {}
    for m in cohorts:
        parts = {key: [] for key in ("exposed", "single", "exposed_alone", "exposed_dominated", "exposed_other",
                                     "share")}
        for _ in range(repeats):
            perm = torch.randperm(u.shape[0], generator=g)
            up, items = u[perm], data.items[perm]
            _, deltas = rec.protocol1_client_update(up, V, items, data.y[perm], local_steps=client.local_steps,
                                                    batch_size=client.batch_size, lr=client.lr, loss=client.loss,
                                                    generator=g)
            sums = pac.secure_aggregate_items(deltas, items, num_items, int(m))               # [G, I, k]
            exp = pac.exposed_members(sums, up, tol=tol)                                     # [G, m]
            touched = rec.touched_items(deltas)                                             # [C, N]
            counts = pac.secure_aggregate_items(touched[..., None].to(deltas.dtype), items, num_items,
                                                int(m))[..., 0]                             # [G, I]
            norm = deltas.norm(dim=-1) * touched                                            # [C, N]
            mass = pac.secure_aggregate_items(norm[..., None], items, num_items, int(m))[..., 0]   # [G, I] L1 mass
            cohort = (torch.arange(u.shape[0]) // int(m))[:, None]                           # [C, 1]
            own_sum = sums[cohort, items]                                                   # [C, N, k]
            cos = torch.nn.functional.cosine_similarity(own_sum, up[:, None, :].expand_as(own_sum), dim=-1).abs()
            shared = touched & (counts[cohort, items] >= 2) & (cos >= 1 - tol)               # exposing shared sums
            share = torch.where(shared, norm / mass[cohort, items].clamp_min(1e-300), torch.zeros_like(norm))
            best = share.max(1).values.view(exp.shape)                                      # [G, m]
            sole = (touched & (counts[cohort, items] == 1)).any(1).view(exp.shape)          # [G, m]
            via_shared = exp & ~sole
            parts["exposed"].append(exp.double().mean(1))
            parts["single"].append((counts == 1).sum(1).double())
            parts["exposed_alone"].append((exp & sole).double().mean(1))
            parts["exposed_dominated"].append((via_shared & (best >= dominance)).double().mean(1))
            parts["exposed_other"].append((via_shared & (best < dominance)).double().mean(1))
            parts["share"].append(best[via_shared])
        out[int(m)] = {key: torch.cat(v) for key, v in parts.items()}
    return out


def label_leak(honest, data, *, batch_size: int, lr: float, loss: str, seed: int = 0) -> dict:
    """The labels one honest round of Protocol 1 (``R = 1``) gives away
    (:func:`~fedlab.attacks.identifiability.leaked_labels`). Returns ``{"revealed": fraction of the
    rated items whose label leaked, "accuracy": fraction of those labels right, "clients_right":
    fraction of clients with every leaked label right, "all_or_nothing": fraction of clients whose
    leaked labels are all right or all flipped (one global sign per client)}``."""
    _, deltas = rec.protocol1_client_update(honest.user_vectors, honest.item_vectors, data.items, data.y,
                                            local_steps=1, batch_size=batch_size, lr=lr, loss=loss,
                                            generator=torch.Generator().manual_seed(seed))
    guess = pac.leaked_labels(deltas)
    shown = guess != 0
    right = (guess == data.y.to(guess.dtype)) | ~shown
    wrong = (guess == -data.y.to(guess.dtype)) | ~shown
    return {"revealed": float(shown.double().mean()), "accuracy": float(right[shown].double().mean()),
            "clients_right": float(right.all(1).double().mean()),
            "all_or_nothing": float((right.all(1) | wrong.all(1)).double().mean())}


def secagg_rows(sa: Mapping) -> list[list]:
    """Rows ``[m, mean fraction of members exposed with its 95 % t interval over cohorts, of which through a
    single-contributor sum, of which through a shared sum they dominate, of which otherwise, number of
    cohorts, median number of single-contributor item sums per cohort]`` of a :func:`secagg_experiment`
    result (the three parts as mean fractions of all members, 3 decimals). The exposed fraction is a rate:
    its interval is cut to [0, 1] and written ``'mean [lo, hi]'``; a fraction equal in every cohort has no
    interval (``'1.000 (every cohort)'``)."""
    rows = []
    for m, v in sa.items():
        mean, _, ci = t_interval(v["exposed"].tolist())
        if ci is None or ci[0] == ci[1]:
            shown = f"{mean:.3f} (every cohort)" if ci is not None else f"{mean:.3f} (1 cohort)"
        else:
            lo, hi = bounded_interval(ci, (0.0, 1.0))
            shown = f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"
        rows.append([m, shown]
                    + [round(float(v[f"exposed_{part}"].mean()), 3) for part in ("alone", "dominated", "other")]
                    + [len(v["exposed"]), int(v["single"].median())])
    return rows
