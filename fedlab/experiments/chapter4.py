"""Chapter 4's experiments (Xu & Neglia 2021, Sec. 4): the Adult PhD split, Table 1 on LEAF's
synthetic clients and Figure 1 on Adult, each an eavesdropped FedAvg run followed by the heuristic
reconstruction (Algorithm 3) of :mod:`fedlab.attacks.model_reconstruction`; the hard instance of
Observation 2, the error curves of Observations 5 and 6, and the tables and figures the chapter shows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .._checks import positive_int
from ..attacks.model_reconstruction import (binary_accuracy, hard_instance_clients, obs6_known_map_risk, obs6_lower_bound,
                                            ols_error_curve, reconstruct_heuristic, run_eavesdropped_fedavg,
                                            squared_loss)
from ..models import flatten_params, linear_model, logistic_loss

__all__ = ["BACHELOR_OR_ABOVE", "adult_phd_split", "adult_phd_clients", "leaf_table1", "adult_experiment",
           "hard_instance_transcript", "obs56_curves", "plot_obs56", "PAPER_TABLE1", "table1_values",
           "table1_markdown", "PAPER_ADULT_COUNTS", "adult_split_counts", "adult_counts_markdown",
           "phd_distance_means", "plot_distance_matrix", "plot_adult_figure1"]


#: Adult education levels at least "bachelor" (Xu & Neglia 2021, Sec. 4)
BACHELOR_OR_ABOVE = ("Bachelors", "Masters", "Prof-school", "Doctorate")


def adult_phd_split(education, age, *, num_other_clients: int = 7, young: int = 38, old: int = 52,
                    seed: int = 0) -> list[np.ndarray]:
    """Xu & Neglia (2021, Sec. 4) non-iid split of Adult over ``3 + num_other_clients`` clients.

    Only records with education at least "bachelor" are kept. The PhDs ("Doctorate") go to the first
    three clients by age: client 0 holds ``age < young``, client 1 holds ``young <= age <= old`` and
    client 2 holds ``age > old``. The remaining records are shuffled and dealt evenly over the other
    ``num_other_clients`` clients.

    Parameters
    ----------
    education : array of str, shape ``[n]`` (``Dataset.meta["education"]`` of :func:`load_adult`)
    age : array of int, shape ``[n]`` (``Dataset.meta["age"]``)

    Returns
    -------
    list of ``3 + num_other_clients`` sorted index arrays into the ``n`` records (disjoint).

    Raises
    ------
    ValueError
        If the arrays differ in length, ``num_other_clients < 1``, ``young > old``, or a PhD client
        would be empty.
    """
    education = np.asarray(education).astype(str)
    age = np.asarray(age)
    if education.shape != age.shape or education.ndim != 1:
        raise ValueError(f"education and age must be 1-d arrays of one length, got {education.shape} "
                         f"and {age.shape}")
    positive_int("num_other_clients", num_other_clients)
    if young > old:
        raise ValueError(f"young ({young}) must not exceed old ({old})")
    keep = np.isin(education, BACHELOR_OR_ABOVE)
    phd = keep & (education == "Doctorate")
    parts = [np.flatnonzero(phd & (age < young)),
             np.flatnonzero(phd & (age >= young) & (age <= old)),
             np.flatnonzero(phd & (age > old))]
    if min(len(p) for p in parts) == 0:
        raise ValueError("a PhD client would be empty: does the data hold Doctorate records?")
    rest = np.random.default_rng(seed).permutation(np.flatnonzero(keep & ~phd))
    parts += [np.sort(p) for p in np.array_split(rest, num_other_clients)]
    return parts


def adult_phd_clients(split: str = "train", *, num_other_clients: int = 7, seed: int = 0):
    """The clients of :func:`adult_phd_split` on :func:`fedlab.data.load_adult` ``(split)``.

    Returns a list of :class:`fedlab.data.Dataset`, one per client (``X`` ``[n_k, 104]``).
    """
    from ..data import client_datasets, load_adult

    ds = load_adult(split)
    parts = adult_phd_split(ds.meta["education"], ds.meta["age"],
                            num_other_clients=num_other_clients, seed=seed)
    return client_datasets(ds, parts)


def _logistic_fedavg(clients, *, num_rounds, local_steps, batch_size, lr, seed, client_fraction=1.0):
    """FedAvg on binary logistic regression with an eavesdropper on every client. Returns the
    final global theta ``[d]`` and the observations ``(theta_in [K, n, d], theta_out [K, n, d])``."""
    d_x = clients[0].X.shape[1]
    model = linear_model(d_x, bias=True, dtype=torch.float32, seed=seed)
    pairs = [(c.X.float(), c.y) for c in clients]
    res, spy = run_eavesdropped_fedavg(model, pairs, num_rounds=num_rounds, local_epochs=1,
                                       local_steps=local_steps, batch_size=batch_size, lr=lr,
                                       seed=seed, loss_fn=logistic_loss, client_fraction=client_fraction)
    obs = [spy.observations(k) for k in range(len(clients))]
    return flatten_params(res.params).double(), obs


def leaf_table1(clients, *, local_steps: Sequence[int] = (1, 5, 10), seeds: Sequence[int] = range(10),
                num_rounds: int = 100, batch_size: int = 256, lr: float = 0.01, hidden: int = 1000,
                fit_max_iter: int = 1000, decode_max_iter: int = 1000) -> dict:
    """Xu & Neglia (2021), Table 1: train accuracy on each client's data of the last model it
    returned (``theta_tilde_c``) and of the model decoded by Algorithm 3 (``hat theta_c*``).

    FedAvg with every client in every round, ``local_steps`` SGD steps of ``batch_size`` per round,
    binary logistic regression; one run per seed (model initialisation, batches, mapping init).
    All ``len(seeds) * K`` attacks of a local-step setting are trained as one batch.

    Returns ``{"local_steps": [L], "last": [L, S, K], "decoded": [L, S, K], "mapping_loss": [L, S, K]}``
    (accuracies in [0, 1]).
    """
    K = len(clients)
    last = np.zeros((len(local_steps), len(seeds), K))
    dec = np.zeros_like(last)
    mloss = np.zeros_like(last)
    for i, E in enumerate(local_steps):
        tin, tout = [], []
        for s in seeds:
            _, obs = _logistic_fedavg(clients, num_rounds=num_rounds, local_steps=E,
                                      batch_size=batch_size, lr=lr, seed=int(s))
            tin += [o[0] for o in obs]
            tout += [o[1] for o in obs]
        tin, tout = torch.stack(tin).double(), torch.stack(tout).double()   # [S*K, n, d]
        res = reconstruct_heuristic(tin, tout, hidden=hidden, fit_max_iter=fit_max_iter,
                                    decode_max_iter=decode_max_iter, seed=i)
        for j in range(len(seeds)):
            for k in range(K):
                p = j * K + k
                X, y = clients[k].X, clients[k].y
                last[i, j, k] = float(binary_accuracy(tout[p, -1], X, y))
                dec[i, j, k] = float(binary_accuracy(res.theta[p], X, y))
                mloss[i, j, k] = float(res.mapping_loss[p])
    return {"local_steps": list(local_steps), "last": last, "decoded": dec, "mapping_loss": mloss}


def adult_experiment(train_clients, test_clients, *, targets: Sequence[int] = (0, 1, 2),
                     batch_sizes: Sequence[int] = (16, 64, 256), seeds: Sequence[int] = range(3),
                     num_rounds: int = 100, lr: float = 0.001, hidden: int = 1000,
                     fit_max_iter: int = 1000, decode_max_iter: int = 1000) -> dict:
    """Xu & Neglia (2021), Figure 1b-c on the Adult split: FedAvg with one local step, step ``lr``;
    for each batch size and seed, attack the ``targets`` with Algorithm 3 and report the relative
    mapping loss and the test accuracy (on each target's own test records) of the decoded model
    and of the last returned model.

    Returns ``{"batch_sizes", "mapping_loss": [B, S, T], "test_decoded": [B, S, T],
    "test_last": [B, S, T], "train_decoded", "train_last", "test_global": [B, S, T]}``.
    """
    T = len(targets)
    shape = (len(batch_sizes), len(seeds), T)
    out = {k: np.zeros(shape) for k in ("mapping_loss", "test_decoded", "test_last", "train_decoded",
                                        "train_last", "test_global")}
    for i, B in enumerate(batch_sizes):
        tin, tout, glob = [], [], []
        for s in seeds:
            g, obs = _logistic_fedavg(train_clients, num_rounds=num_rounds, local_steps=1,
                                      batch_size=B, lr=lr, seed=int(s))
            tin += [obs[t][0] for t in targets]
            tout += [obs[t][1] for t in targets]
            glob.append(g)
        tin, tout = torch.stack(tin).double(), torch.stack(tout).double()
        res = reconstruct_heuristic(tin, tout, hidden=hidden, fit_max_iter=fit_max_iter,
                                    decode_max_iter=decode_max_iter, seed=i)
        for j in range(len(seeds)):
            for k, t in enumerate(targets):
                p = j * T + k
                te, tr = test_clients[t], train_clients[t]
                out["mapping_loss"][i, j, k] = float(res.mapping_loss[p])
                out["test_decoded"][i, j, k] = float(binary_accuracy(res.theta[p], te.X, te.y))
                out["test_last"][i, j, k] = float(binary_accuracy(tout[p, -1], te.X, te.y))
                out["test_global"][i, j, k] = float(binary_accuracy(glob[j], te.X, te.y))
                out["train_decoded"][i, j, k] = float(binary_accuracy(res.theta[p], tr.X, tr.y))
                out["train_last"][i, j, k] = float(binary_accuracy(tout[p, -1], tr.X, tr.y))
    out["batch_sizes"] = list(batch_sizes)
    return out


# --------------------------------------------------------------------------------------------------
# Observation 2: the hard instance
def hard_instance_transcript(dim: int, *, truncated: bool = False, num_rounds: int | None = None,
                             local_epochs: int = 1, lr: float = 0.3, num_clients: int = 3):
    """What an eavesdropper sees on client 0's link in the lower-bound construction of Xu & Neglia
    (2021), Observation 2: FedAvg with full-batch local gradient descent (step ``lr``) on
    :func:`fedlab.attacks.model_reconstruction.hard_instance_clients` ``(dim, num_clients,
    truncated=truncated)``, every client in every round, started from ``theta(0) = 0``.

    Returns ``(theta_in [T, dim], theta_out [T, dim], rounds [T])`` (float64), ``T = num_rounds``
    (``dim`` by default). Raises ``ValueError`` if ``dim``, ``num_rounds``, ``local_epochs`` or
    ``num_clients`` is not a positive integer.
    """
    num_rounds = dim if num_rounds is None else num_rounds
    for name, v in (("dim", dim), ("num_rounds", num_rounds), ("local_epochs", local_epochs),
                    ("num_clients", num_clients)):
        positive_int(name, v)
    zero = {"weight": torch.zeros(1, dim, dtype=torch.float64)}
    _, spy = run_eavesdropped_fedavg(linear_model(dim), hard_instance_clients(dim, num_clients, truncated=truncated),
                                     targets=[0], num_rounds=num_rounds, local_epochs=local_epochs,
                                     batch_size=None, lr=lr, params=zero, loss_fn=squared_loss)
    return spy.observations(0)


# --------------------------------------------------------------------------------------------------
# Observations 5 and 6: the OLS decoder under gradient noise
def obs56_curves(X: torch.Tensor, y: torch.Tensor, n_obs: Sequence[int], *, lr: float, sigma: float,
                 local_steps: int, trials: int, seed: int = 0) -> dict:
    """Xu & Neglia (2021), Observations 5 and 6: the measured squared error of the OLS decoder
    (:func:`fedlab.attacks.model_reconstruction.ols_error_curve` under the noise model of the proof)
    against the number ``n_obs`` of observed rounds, Observation 5's rate rescaled to meet the first
    measured point (its constant is unknown), Observation 6's lower bound as printed, the exact risk of
    the best estimator that knows ``W`` (:func:`fedlab.attacks.model_reconstruction.obs6_known_map_risk`,
    the quantity the proof of Observation 6 bounds), and the log-log slope of the measured curve.

    ``X`` ``[m, d]``, ``y`` ``[m]``. Returns ``{"n_obs", "mse", "rate", "upper", "lower", "exact" (each
    ``[len(n_obs)]``), "slope"}``. Raises ``ValueError`` if ``n_obs`` has fewer than two entries.
    """
    if len(n_obs) < 2:
        raise ValueError(f"n_obs needs at least two entries to fit a slope, got {list(n_obs)}")
    curve = ols_error_curve(X, y, n_obs, lr=lr, sigma=sigma, local_steps=local_steps, trials=trials, seed=seed)
    lower = obs6_lower_bound(X.shape[1], n_obs, lr=lr, sigma=sigma, local_steps=local_steps)
    upper = curve["rate"] * curve["mse"][0] / curve["rate"][0]
    slope = float(np.polyfit(np.log(n_obs), np.log(curve["mse"]), 1)[0])
    exact = obs6_known_map_risk(X, n_obs, lr=lr, sigma=sigma, local_steps=local_steps)
    return {"n_obs": list(n_obs), "mse": curve["mse"], "rate": curve["rate"], "upper": upper, "lower": lower,
            "exact": exact, "slope": slope}


def plot_obs56(curves: dict, ax=None):
    """The figure of Observations 5 and 6 (Xu & Neglia 2021, Sec. 3.3): measured error, rescaled
    Observation 5 rate, Observation 6 lower bound and the exact known-``W`` risk against the rounds
    observed, log-log. ``curves``: the output of :func:`obs56_curves`. Returns the axes."""
    from .. import plots

    lines = {"measured (OLS decoder)": curves["mse"], "Obs. 5 rate (rescaled)": curves["upper"],
             "Obs. 6 lower bound": curves["lower"]}
    if "exact" in curves:
        lines["best estimator knowing W"] = curves["exact"]
    return plots.line_plot(curves["n_obs"], lines, ax=ax, logx=True, logy=True,
                           xlabel="rounds observed $n_c$", ylabel=r"$E\|\hat\theta_c^*-\theta_c^*\|^2$",
                           styles={"Obs. 6 lower bound": {"ls": "--", "color": "k"},
                                   "best estimator knowing W": {"ls": "-.", "color": "0.5"},
                                   "Obs. 5 rate (rescaled)": {"ls": ":"}})


# --------------------------------------------------------------------------------------------------
# Table 1: the page's numbers and table
#: Xu & Neglia (2021), Table 1: mean train accuracy (%) over 10 runs, clients c = 0..4, then the mean
PAPER_TABLE1 = {1: {"last": [53.9, 49.7, 85.1, 28.3, 75.8, 58.6], "decoded": [67.0, 74.3, 80.6, 77.9, 91.0, 78.1]},
                5: {"last": [60.1, 54.6, 87.6, 33.6, 79.2, 63.0], "decoded": [65.6, 72.9, 76.9, 72.5, 86.2, 74.8]},
                10: {"last": [69.4, 60.4, 90.6, 42.3, 83.9, 69.3], "decoded": [67.5, 79.5, 78.1, 75.8, 88.9, 78.0]}}

#: the short names of the two models in the glued names (``ch4-t1-last1``, ``ch4-t1-dec1-c0``)
_T1_SHORT = {"last": "last", "decoded": "dec"}


def table1_values(t1: dict) -> dict:
    """The numbers the chapter quotes from :func:`leaf_table1`'s output ``t1``: for every local-step
    setting ``E`` and model (``last``, ``dec``), the train accuracy in % (one decimal) averaged over
    seeds and clients (``ch4-t1-{model}{E}``) and over seeds for each client ``c``
    (``ch4-t1-{model}{E}-c{c}``). Raises ``ValueError`` if ``t1`` lacks a key of :func:`leaf_table1`."""
    missing = {"local_steps", "last", "decoded"} - set(t1)
    if missing:
        raise ValueError(f"t1 lacks {sorted(missing)}: pass the output of leaf_table1")
    means = {key: 100 * t1[key].mean((1, 2)) for key in _T1_SHORT}
    out = {}
    for i, E in enumerate(t1["local_steps"]):
        for key, short in _T1_SHORT.items():
            out[f"ch4-t1-{short}{E}"] = round(float(means[key][i]), 1)
            for c, o in enumerate((100 * t1[key][i].mean(0)).tolist()):
                out[f"ch4-t1-{short}{E}-c{c}"] = round(o, 1)
    return out


def table1_markdown(t1: dict, paper=None, paper_table: dict | None = None) -> str:
    """Xu & Neglia (2021), Table 1 beside ours, as a Markdown table: train accuracy (%) per client and
    mean, ``paper / **ours**``, and the stored paper-scale record of the mean, ``paper(name, digits)``
    (e.g. :meth:`fedlab.records.Run.paper`; ``n/a`` when ``None``). ``paper_table`` defaults to
    :data:`PAPER_TABLE1`. Raises ``ValueError`` for a local-step setting the paper table lacks."""
    paper_table = PAPER_TABLE1 if paper_table is None else paper_table
    absent = [E for E in t1["local_steps"] if E not in paper_table]
    if absent:
        raise ValueError(f"paper_table has no row for local_steps {absent}")
    rows = ["| local steps | model | c=0 | c=1 | c=2 | c=3 | c=4 | mean | mean, ours at paper scale (mean ± 95 % CI, n seeds) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for i, E in enumerate(t1["local_steps"]):
        for key, name in (("last", r"last returned $\tilde\theta_c$"), ("decoded", r"decoded $\hat\theta_c^*$")):
            ours = 100 * t1[key][i].mean(0)
            cells = [f"{p:.1f} / **{o:.1f}**" for p, o in zip(paper_table[E][key], list(ours) + [ours.mean()])]
            stored = paper(f"ch4-t1-{_T1_SHORT[key]}{E}", 1) if paper is not None else "n/a"
            rows.append(f"| {E} | {name} | " + " | ".join(cells) + f" | {stored} |")
    return "Train accuracy (%), paper / **ours**\n\n" + "\n".join(rows)


# --------------------------------------------------------------------------------------------------
# Figure 1: the Adult split, the local optima, the attack
#: Xu & Neglia (2021), Sec. 4: records kept and the PhD clients' sizes, with the glued name of ours
PAPER_ADULT_COUNTS = {"ch4-adult-kept": ("records kept (all of Adult)", 12300),
                      "ch4-adult-c0": ("client 0 (PhD, <38)", 126),
                      "ch4-adult-c1": ("client 1 (PhD, 38-52)", 258),
                      "ch4-adult-c2": ("client 2 (PhD, >52)", 134)}


def adult_split_counts(train_clients) -> dict:
    """Our counts of the Adult split beside :data:`PAPER_ADULT_COUNTS`: the records kept by
    :func:`adult_phd_split` on all of Adult (train and test) and the train records of the three PhD
    clients ``train_clients[:3]``. Returns ``{glued name: int}``. Raises ``ValueError`` for fewer than
    three clients."""
    from ..data import load_adult

    if len(train_clients) < 3:
        raise ValueError(f"train_clients must hold the three PhD clients first, got {len(train_clients)} clients")
    full = load_adult("all")
    kept = len(np.concatenate(adult_phd_split(full.meta["education"], full.meta["age"])))
    ours = [kept, *[len(c) for c in train_clients[:3]]]
    return {name: int(o) for name, o in zip(PAPER_ADULT_COUNTS, ours)}


def adult_counts_markdown(counts: dict, paper=None) -> str:
    """The Adult split's counts as a Markdown table: the paper's, ours (``counts`` from
    :func:`adult_split_counts`) and the stored paper-scale record ``paper(name, digits)`` (``n/a`` when
    ``None``). Raises ``ValueError`` for a name of :data:`PAPER_ADULT_COUNTS` missing from ``counts``."""
    missing = [n for n in PAPER_ADULT_COUNTS if n not in counts]
    if missing:
        raise ValueError(f"counts lacks {missing}: pass the output of adult_split_counts")
    rows = [f"| {label} | {v} | {counts[name]} | {paper(name, 0) if paper is not None else 'n/a'} |"
            for name, (label, v) in PAPER_ADULT_COUNTS.items()]
    return ("| | paper | ours | ours, paper scale (mean ± 95 % CI, n seeds) |\n|---|---|---|---|\n"
            + "\n".join(rows))


def phd_distance_means(dist, num_phd: int = 3) -> tuple[float, float]:
    """Xu & Neglia (2021), Figure 1a, summarised: the mean relative distance between the local optima
    of the ``num_phd`` PhD clients and the others, and among the others (off the diagonal). ``dist``
    ``[K, K]`` from :func:`fedlab.attacks.model_reconstruction.relative_distances`. Raises ``ValueError``
    unless ``1 <= num_phd <= K - 2``."""
    dist = np.asarray(dist)
    K = dist.shape[0]
    if not 1 <= num_phd <= K - 2:
        raise ValueError(f"num_phd must be in [1, {K - 2}] for {K} clients, got {num_phd}")
    phd_vs_rest = float(dist[:num_phd, num_phd:].mean())
    rest_vs_rest = float(dist[num_phd:, num_phd:][~np.eye(K - num_phd, dtype=bool)].mean())
    return phd_vs_rest, rest_vs_rest


def plot_distance_matrix(dist, ax=None):
    """Xu & Neglia (2021), Figure 1a: heat map of the relative distances ``dist`` ``[K, K]`` between
    the clients' local optima. Returns the axes."""
    import matplotlib.pyplot as plt

    dist = np.asarray(dist)
    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 4.2))
    im = ax.imshow(dist, cmap="viridis")
    ax.figure.colorbar(im, ax=ax)
    ax.set(xlabel="client j", ylabel="client i", title="relative distance of local optima",
           xticks=range(dist.shape[1]), yticks=range(dist.shape[0]))
    ax.grid(False)
    return ax


def plot_adult_figure1(fig1: dict):
    """Xu & Neglia (2021), Figure 1b-c from :func:`adult_experiment`'s output: (b) the relative mapping
    loss and (c) the PhD clients' test accuracy of the decoded and last returned models, against the
    batch size (means over seeds and targets). Returns the two axes."""
    import matplotlib.pyplot as plt

    from .. import plots

    bs = fig1["batch_sizes"]
    _, axs = plt.subplots(1, 2, figsize=(11, 4))
    plots.line_plot(bs, {"mapping loss (Eq. 9, relative)": fig1["mapping_loss"].mean((1, 2))}, ax=axs[0], logx=True,
                    xlabel="batch size", ylabel="relative mapping loss", title="(b) fitting the update map")
    plots.line_plot(bs, {"decoded": 100 * fig1["test_decoded"].mean((1, 2)),
                         "last returned": 100 * fig1["test_last"].mean((1, 2))},
                    ax=axs[1], logx=True, xlabel="batch size", ylabel="test accuracy (%)",
                    title="(c) PhD clients' test data", styles={"last returned": {"ls": "--"}})
    return axs
