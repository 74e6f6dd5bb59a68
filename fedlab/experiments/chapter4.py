"""The experiments of Chapters 4 and 4b (Xu & Neglia 2021, Section 4). Chapter 4b: the Adult PhD split, Table 1
on LEAF's synthetic clients and Figure 1 on Adult, each an eavesdropped FedAvg run followed by the heuristic
reconstruction (Algorithm 3) of :mod:`fedlab.attacks.model_reconstruction`; chapter 4: the hard instance of
Observation 2, the error curves of Observations 5 and 6; and the tables and figures the chapters show.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .._checks import positive_int
from ..attacks.model_reconstruction import (HeuristicSettings, NoiseModel, binary_accuracy, hard_instance_clients,
                                            local_optimum,
                                            obs6_known_map_risk, obs6_lower_bound, ols_error_curve,
                                            reconstruct_heuristic, run_eavesdropped_fedavg, solve_affine,
                                            squared_loss)
from ..fl import LocalTraining
from ..models import flatten_params, linear_model, logistic_loss

__all__ = ["BACHELOR_OR_ABOVE", "adult_phd_split", "adult_phd_clients", "leaf_table1", "ROUND_SWEEP",
           "leaf_round_sweep", "round_sweep_values", "round_sweep_markdown", "positive_control", "adult_experiment", "adult_movement", "fedavg_ols_curve",
           "hard_instance_transcript", "obs56_curves", "plot_obs56", "PAPER_TABLE1", "table1_values",
           "table1_markdown", "PAPER_ADULT_COUNTS", "adult_split_counts", "adult_counts_markdown", "adult_count_variants", "adult_variants_markdown",
           "phd_distance_means", "plot_distance_matrix", "plot_adult_figure1", "adult_values"]


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


def _logistic_fedavg(clients, *, num_rounds, local_steps, batch_size, lr, seed, client_fraction=1.0,
                     weight_decay=0.0):
    """FedAvg on binary logistic regression with an eavesdropper on every client. Returns the
    final global theta ``[d]`` and the observations ``(theta_in [n_c, d], theta_out [n_c, d], rounds)``
    of each client."""
    d_x = clients[0].X.shape[1]
    model = linear_model(d_x, bias=True, dtype=torch.float32, seed=seed)
    pairs = [(c.X.float(), c.y) for c in clients]
    local = LocalTraining(lr=lr, batch_size=batch_size, local_steps=local_steps, weight_decay=weight_decay,
                          loss_fn=logistic_loss)
    res, spy = run_eavesdropped_fedavg(model, pairs, num_rounds=num_rounds, local=local, seed=seed,
                                       client_fraction=client_fraction)
    obs = [spy.observations(k) for k in range(len(clients))]
    return flatten_params(res.params).double(), obs


def _heuristic(attack) -> HeuristicSettings:
    if not isinstance(attack, HeuristicSettings):
        raise ValueError(f"attack must be a fedlab.attacks.model_reconstruction.HeuristicSettings, got "
                         f"{type(attack).__name__}: {attack!r}")
    return attack


def _attack_batch(runs, *, hidden, fit_max_iter, decode_max_iter, seed):
    """Algorithm 3 on many eavesdropped transcripts at once. ``runs``: list of ``(theta_in [n_p, d],
    theta_out [n_p, d])``. With client sampling the clients are seen a different number of times; all
    attacks then use their last ``min n_p`` observations (the most recent, nearest the end of
    training). Returns ``(HeuristicResult, theta_in [P, n, d], last returned [P, d])``."""
    n = min(len(ti) for ti, _ in runs)
    if n < 2:
        raise ValueError(f"a client was observed in {n} round(s): run more rounds")
    tin = torch.stack([ti[-n:] for ti, _ in runs]).double()
    tout = torch.stack([to[-n:] for _, to in runs]).double()
    res = reconstruct_heuristic(tin, tout, hidden=hidden, fit_max_iter=fit_max_iter,
                                decode_max_iter=decode_max_iter, seed=seed)
    return res, tin, tout[:, -1]


def _majority_share(y: torch.Tensor) -> float:
    """Accuracy of always predicting the most frequent label of ``y`` (``[n]`` integer labels) on ``y``."""
    return float(torch.bincount(y.long()).max()) / len(y)


def leaf_table1(clients, *, local_steps: Sequence[int] = (1, 5, 10), seeds: Sequence[int] = range(10),
                num_rounds: int = 100, batch_size: int = 256, lr: float = 0.01, client_fraction: float = 1.0,
                weight_decay: float = 0.01, attack: HeuristicSettings = HeuristicSettings()) -> dict:
    """Xu & Neglia (2021), Table 1: train accuracy on each client's data of the last model it
    returned (``theta_tilde_c``) and of the model decoded by Algorithm 3 (``hat theta_c*``), beside
    the target itself (the *oracle*, the true local optimum ``theta_c*``).

    FedAvg on binary logistic regression with a fraction ``client_fraction`` of the clients per
    round, ``local_steps`` SGD steps of ``batch_size`` per round, step ``lr``. Each client's local
    objective is ``mean loss + weight_decay/2 ||theta||^2`` (our stated choice: most LEAF clients
    are linearly separable, see :func:`fedlab.attacks.model_reconstruction.linearly_separable`, and
    then have no unregularised optimum); ``theta_c*`` is its exact minimiser
    (:func:`~fedlab.attacks.model_reconstruction.logistic_local_optimum`). One FedAvg run per seed
    (model initialisation, client sampling, batches); all ``len(local_steps) * len(seeds) * K``
    attacks are trained as one batch (see :func:`_attack_batch` for unequal observation counts), with
    ``attack`` (:class:`~fedlab.attacks.model_reconstruction.HeuristicSettings`: Algorithm 3's hidden units
    and Adam steps; the paper's 1000 each by default).

    Returns ``{"local_steps": [L], "last", "decoded": [L, S, K] accuracies in [0, 1], "oracle": [K],
    "dist_last", "dist_decoded": [L, S, K] relative distances ||theta - theta_c*|| / ||theta_c*||,
    "flatness": [L, S, K] (:func:`~fedlab.attacks.model_reconstruction.trajectory_flatness` of the
    server models the attack used), "mapping_loss": [L, S, K] (in sample), "heldout_loss": [L, S, K] (on
    20 % of the rounds left out of a second fit, :func:`~fedlab.attacks.model_reconstruction.heldout_mapping_loss`),
    "residual": [L, S, K] (the fitted map's size at the decoded model relative to the RMS observed update,
    :class:`~fedlab.attacks.model_reconstruction.HeuristicResult`), "majority": [K] (train accuracy of
    always predicting the client's majority label), "num_obs": int, "separable": [K] bool}``.
    Raises ``ValueError`` for ``weight_decay <= 0``, a client observed fewer than 2 times or an ``attack`` that is
    not a ``HeuristicSettings``."""
    from ..attacks.model_reconstruction import (heldout_mapping_loss, linearly_separable, logistic_local_optimum,
                                                trajectory_flatness)

    attack = _heuristic(attack)

    K, L, S = len(clients), len(local_steps), len(seeds)
    stars = torch.stack([logistic_local_optimum(c.X, c.y, weight_decay=weight_decay) for c in clients])
    runs = []
    for E in local_steps:
        for s in seeds:
            _, obs = _logistic_fedavg(clients, num_rounds=num_rounds, local_steps=E, batch_size=batch_size,
                                      lr=lr, seed=int(s), client_fraction=client_fraction,
                                      weight_decay=weight_decay)
            runs += [(o[0], o[1]) for o in obs]
    res, tin, last_theta = _attack_batch(runs, hidden=attack.hidden, fit_max_iter=attack.fit_max_iter,
                                         decode_max_iter=attack.decode_max_iter, seed=0)
    n = tin.shape[1]
    heldout = heldout_mapping_loss(tin, torch.stack([to[-n:] for _, to in runs]).double(), hidden=attack.hidden,
                                   max_iter=attack.fit_max_iter, seed=1)
    shape = (L, S, K)
    star = stars.repeat(L * S, 1)                                      # [P, d], client index fastest
    rel = lambda th: ((th - star).norm(dim=1) / star.norm(dim=1)).reshape(shape).numpy()  # noqa: E731
    acc = lambda th: np.array([float(binary_accuracy(th[p], clients[p % K].X, clients[p % K].y))  # noqa: E731
                               for p in range(len(th))]).reshape(shape)
    return {"local_steps": list(local_steps), "last": acc(last_theta), "decoded": acc(res.theta),
            "oracle": np.array([float(binary_accuracy(stars[k], c.X, c.y)) for k, c in enumerate(clients)]),
            "dist_last": rel(last_theta), "dist_decoded": rel(res.theta),
            "flatness": trajectory_flatness(tin).reshape(shape).numpy(),
            "mapping_loss": res.mapping_loss.reshape(shape).numpy(), "heldout_loss": heldout.reshape(shape).numpy(),
            "residual": res.residual.reshape(shape).numpy(), "majority": np.array([_majority_share(c.y) for c in clients]),
            "num_obs": int(tin.shape[1]),
            "separable": np.array([linearly_separable(c.X, c.y) for c in clients])}


def adult_movement(train_clients, *, lr: float, num_rounds: int, batch_size: int, seed: int = 0,
                   weight_decay: float = 0.01) -> float:
    """How far FedAvg moves the global model on the Adult split, ``||theta_T - theta_0||``, with one
    local step of ``batch_size`` and step ``lr`` for ``num_rounds`` rounds (the setting of
    :func:`adult_experiment`). At the paper's ``lr = 0.001`` (Xu & Neglia 2021, Fig. 1) the model barely
    leaves its initialisation; this number says by how much."""
    g, obs = _logistic_fedavg(train_clients, num_rounds=num_rounds, local_steps=1, batch_size=batch_size,
                              lr=lr, seed=seed, weight_decay=weight_decay)
    return float((g - obs[0][0][0]).norm())


def adult_experiment(train_clients, test_clients, *, targets: Sequence[int] = (0, 1, 2, 3, 4, 5),
                     batch_sizes: Sequence[int] = (16, 64, 256), seeds: Sequence[int] = range(3),
                     num_rounds: int = 100, lr: float = 0.1, weight_decay: float = 0.01,
                     attack: HeuristicSettings = HeuristicSettings()) -> dict:
    """Xu & Neglia (2021), Figure 1b-c on the Adult split: FedAvg with every client in every round,
    one local SGD step of ``batch_size`` with step ``lr`` on the local objective ``mean loss +
    weight_decay/2 ||theta||^2``; for each batch size and seed, attack the ``targets`` with Algorithm 3
    (``attack``, a :class:`~fedlab.attacks.model_reconstruction.HeuristicSettings`; all ``B * S * T`` attacks in
    one batch) and report the relative mapping loss and accuracies on
    each target's own test and train records of the decoded model, the last returned model and the
    final global model. Clients 0-2 of :func:`adult_phd_clients` are the non-iid PhD clients, the
    others an iid control.

    Returns ``{"batch_sizes", "targets", "mapping_loss", "test_decoded", "test_last", "test_global",
    "train_decoded", "train_last", "train_global": [B, S, T], "majority": [T] (test accuracy of always
    predicting the target's majority train label), "train_majority": [T] (the same on its own train
    records: the attribute-inference baseline that uses no model), "train_oracle": [T] (train accuracy of the target's
    local optimum, Observation 7's best attribute-inference model), "test_oracle": [T] (the same local optimum on
    the target's held-out test records), "moved": [B, S] (``||theta_T -
    theta_0||`` of the global model),
    "init_norm": [S] (||theta_0||)}``. Raises ``ValueError`` for a target outside the clients or an ``attack``
    that is not a ``HeuristicSettings``."""
    attack = _heuristic(attack)
    K = len(train_clients)
    bad = [t for t in targets if not 0 <= int(t) < K]
    if bad or len(test_clients) != K:
        raise ValueError(f"targets must index the {K} clients (and test_clients match them), got {list(targets)}")
    from ..attacks.model_reconstruction import logistic_local_optimum

    T, shape = len(targets), (len(batch_sizes), len(seeds), len(targets))
    runs, glob, moved, init = [], [], np.zeros(shape[:2]), np.zeros(len(seeds))
    for i, B in enumerate(batch_sizes):
        for j, s in enumerate(seeds):
            g, obs = _logistic_fedavg(train_clients, num_rounds=num_rounds, local_steps=1, batch_size=B,
                                      lr=lr, seed=int(s), weight_decay=weight_decay)
            runs += [(obs[t][0], obs[t][1]) for t in targets]
            glob.append(g)
            moved[i, j], init[j] = float((g - obs[0][0][0]).norm()), float(obs[0][0][0].norm())
    res, _, last = _attack_batch(runs, hidden=attack.hidden, fit_max_iter=attack.fit_max_iter,
                                 decode_max_iter=attack.decode_max_iter, seed=0)
    out = {k: np.zeros(shape) for k in ("mapping_loss", "test_decoded", "test_last", "test_global",
                                        "train_decoded", "train_last", "train_global")}
    for p in range(len(runs)):
        i, j, k = np.unravel_index(p, shape)
        te, tr = test_clients[targets[k]], train_clients[targets[k]]
        out["mapping_loss"][i, j, k] = float(res.mapping_loss[p])
        for name, th in (("decoded", res.theta[p]), ("last", last[p])):
            out[f"test_{name}"][i, j, k] = float(binary_accuracy(th, te.X, te.y))
            out[f"train_{name}"][i, j, k] = float(binary_accuracy(th, tr.X, tr.y))
        out["test_global"][i, j, k] = float(binary_accuracy(glob[i * len(seeds) + j], te.X, te.y))
        out["train_global"][i, j, k] = float(binary_accuracy(glob[i * len(seeds) + j], tr.X, tr.y))
    major = [float(train_clients[t].y.float().mean()) >= 0.5 for t in targets]
    out["majority"] = np.array([float((test_clients[t].y == int(m)).float().mean()) for t, m in zip(targets, major)])
    out["train_majority"] = np.array([_majority_share(train_clients[t].y) for t in targets])
    optima = [logistic_local_optimum(train_clients[t].X, train_clients[t].y, weight_decay=weight_decay) for t in targets]
    out["train_oracle"] = np.array([float(binary_accuracy(th, train_clients[t].X, train_clients[t].y))
                                    for th, t in zip(optima, targets)])
    out["test_oracle"] = np.array([float(binary_accuracy(th, test_clients[t].X, test_clients[t].y))
                                   for th, t in zip(optima, targets)])
    out.update(batch_sizes=list(batch_sizes), targets=list(targets), moved=moved, init_norm=init)
    return out


def fedavg_ols_curve(clients, n_obs: Sequence[int], *, target: int = 0, batch_size: int | None = 10,
                     lr: float = 0.01, local_epochs: int = 1, client_fraction: float = 0.6,
                     seeds: Sequence[int] = (0,)) -> dict:
    """Observation 5's OLS decoder (:func:`~fedlab.attacks.model_reconstruction.solve_affine`) on the
    transcript of a *real* FedAvg run (Xu & Neglia 2021, Sec. 3.1): least-squares clients ``(X, y)``,
    ``local_epochs`` epochs of SGD with ``batch_size`` (``None``: full batch) and step ``lr``, a
    fraction ``client_fraction`` of the clients per round, the eavesdropper on ``target``. Unlike the
    server models of :func:`obs56_curves`, drawn with a fixed spread, FedAvg's server models converge,
    so the design ``[theta(t), -1]`` flattens as training goes on.

    For each seed and each prefix length ``n`` of ``n_obs`` returns the relative error
    ``||hat theta - theta_c*|| / ||theta_c*||`` and ``rho = s_min / s_max`` of the design of the first ``n``
    observations (its ``d + 1``-th singular value over its first, 0 when ``n <= d``): ``{"n_obs": [N], "rel_err": [S, N], "rho": [S, N]}``. Raises ``ValueError`` for an
    empty or non-increasing ``n_obs`` or one below 2."""
    n_obs = [int(n) for n in n_obs]
    if not n_obs or n_obs[0] < 2 or any(b <= a for a, b in zip(n_obs, n_obs[1:])):
        raise ValueError(f"n_obs must be increasing integers >= 2, got {n_obs}")
    X, y = clients[target]
    star = local_optimum(X, y)
    num_rounds = int(np.ceil(1.3 * n_obs[-1] / client_fraction)) + 30     # ~4 sd above what n_obs needs
    err, rho = np.zeros((len(seeds), len(n_obs))), np.zeros((len(seeds), len(n_obs)))
    for i, s in enumerate(seeds):
        _, spy = run_eavesdropped_fedavg(linear_model(X.shape[1], seed=int(s)), clients, targets=[target],
                                         num_rounds=num_rounds, client_fraction=client_fraction, seed=int(s),
                                         local=LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=batch_size,
                                                             loss_fn=squared_loss))
        ti, to, _ = spy.observations(target)
        if len(ti) < n_obs[-1]:
            raise ValueError(f"client {target} was observed {len(ti)} times, fewer than {n_obs[-1]}")
        for j, n in enumerate(n_obs):
            est = solve_affine(ti[:n], to[:n])
            err[i, j] = float((est.theta - star).norm() / star.norm())
            sv = torch.linalg.svdvals(torch.cat([ti[:n], -torch.ones(n, 1, dtype=ti.dtype)], 1))
            rho[i, j] = float(sv[-1] / sv[0]) if n > X.shape[1] else 0.0     # rank < d + 1: a null direction
    return {"n_obs": n_obs, "rel_err": err, "rho": rho}


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
                                     targets=[0], num_rounds=num_rounds, params=zero,
                                     local=LocalTraining(lr=lr, local_epochs=local_epochs, batch_size=None,
                                                         loss_fn=squared_loss))
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
    curve = ols_error_curve(X, y, n_obs, lr=lr, noise=NoiseModel(sigma, local_steps=local_steps), trials=trials,
                            seed=seed)
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
def positive_control(clients, *, num_obs: int = 100, spread: float = 1.0, local_steps: int = 5, lr: float = 0.5,
                     weight_decay: float = 0.01, attack: HeuristicSettings = HeuristicSettings(), seed: int = 0) -> dict:
    """Algorithm 3 (Xu & Neglia 2021, Sec. 3.2) where it should succeed: for every client, server models
    drawn around its local optimum
    (:func:`~fedlab.attacks.model_reconstruction.logistic_positive_control`), all clients attacked in one
    batch, with ``attack`` (:class:`~fedlab.attacks.model_reconstruction.HeuristicSettings`). A decoder that
    fails here is broken; one that succeeds here but not on FedAvg's transcripts fails because of what FedAvg
    lets it observe.

    Returns ``{"decoded", "last", "oracle": [K] train accuracies, "dist_decoded", "dist_last": [K]
    relative distances to theta_c*, "mapping_loss", "heldout_loss", "residual": [K]}`` (``residual``: the
    fitted map's size at the decoded model relative to the RMS observed update)."""
    from ..attacks.model_reconstruction import heldout_mapping_loss, logistic_positive_control

    obs = [logistic_positive_control(c.X, c.y, num_obs=num_obs, spread=spread, local_steps=local_steps, lr=lr,
                                     weight_decay=weight_decay, seed=seed + k) for k, c in enumerate(clients)]
    tin, tout, star = (torch.stack([o[i] for o in obs]) for i in range(3))
    attack = _heuristic(attack)
    res = reconstruct_heuristic(tin, tout, hidden=attack.hidden, fit_max_iter=attack.fit_max_iter,
                                decode_max_iter=attack.decode_max_iter, seed=seed)
    acc = lambda th: np.array([float(binary_accuracy(th[k], c.X, c.y)) for k, c in enumerate(clients)])  # noqa: E731
    rel = lambda th: ((th - star).norm(dim=1) / star.norm(dim=1)).numpy()  # noqa: E731
    return {"decoded": acc(res.theta), "last": acc(tout[:, -1]), "oracle": acc(star),
            "dist_decoded": rel(res.theta), "dist_last": rel(tout[:, -1]),
            "mapping_loss": res.mapping_loss.numpy(), "residual": res.residual.numpy(),
            "heldout_loss": heldout_mapping_loss(tin, tout, hidden=attack.hidden, max_iter=attack.fit_max_iter,
                                                 seed=seed + 1).numpy()}


#: Xu & Neglia (2021), Table 1: mean train accuracy (%) over 10 runs, clients c = 0..4, then the mean
PAPER_TABLE1 = {1: {"last": [53.9, 49.7, 85.1, 28.3, 75.8, 58.6], "decoded": [67.0, 74.3, 80.6, 77.9, 91.0, 78.1]},
                5: {"last": [60.1, 54.6, 87.6, 33.6, 79.2, 63.0], "decoded": [65.6, 72.9, 76.9, 72.5, 86.2, 74.8]},
                10: {"last": [69.4, 60.4, 90.6, 42.3, 83.9, 69.3], "decoded": [67.5, 79.5, 78.1, 75.8, 88.9, 78.0]}}

_T1_KEYS = {"local_steps", "last", "decoded", "oracle", "dist_last", "dist_decoded", "flatness", "separable",
            "mapping_loss", "heldout_loss", "residual", "majority"}


def table1_values(t1: dict, prefix: str = "ch4-t1") -> dict:
    """The numbers the chapter quotes from :func:`leaf_table1`'s output ``t1``, named ``{prefix}-...``:
    for every local-step setting ``E``, the train accuracy in % (one decimal, mean over runs and
    clients) of the last returned (``last{E}``) and decoded (``dec{E}``) models, their mean relative
    distances to the local optimum (``dlast{E}``, ``ddec{E}``, 3 decimals) and the flatness of the
    observed server models (``flat{E}``); the remaining update size at the decoded models in % of the RMS
    observed update (``resid{E}``: mean; ``resid{E}-lo``, ``resid{E}-hi``: smallest and largest over runs
    and clients, whole per cent); the oracle's accuracy (``oracle``), the majority-class accuracy
    (``major``) and the number of linearly separable clients (``sep``). Raises ``ValueError`` if ``t1`` lacks a key of :func:`leaf_table1`."""
    missing = _T1_KEYS - set(t1)
    if missing:
        raise ValueError(f"t1 lacks {sorted(missing)}: pass the output of leaf_table1")
    out = {f"{prefix}-oracle": round(100 * float(np.mean(t1["oracle"])), 1),
           f"{prefix}-major": round(100 * float(np.mean(t1["majority"])), 1),
           f"{prefix}-sep": int(np.sum(t1["separable"]))}
    for i, E in enumerate(t1["local_steps"]):
        out[f"{prefix}-last{E}"] = round(100 * float(t1["last"][i].mean()), 1)
        out[f"{prefix}-dec{E}"] = round(100 * float(t1["decoded"][i].mean()), 1)
        out[f"{prefix}-dlast{E}"] = round(float(t1["dist_last"][i].mean()), 3)
        out[f"{prefix}-ddec{E}"] = round(float(t1["dist_decoded"][i].mean()), 3)
        out[f"{prefix}-flat{E}"] = round(float(t1["flatness"][i].mean()), 3)
        out[f"{prefix}-held{E}"] = round(float(t1["heldout_loss"][i].mean()), 3)
        out[f"{prefix}-resid{E}"] = round(100 * float(t1["residual"][i].mean()), 1)
        out[f"{prefix}-resid{E}-lo"] = int(np.floor(100 * float(t1["residual"][i].min())))
        out[f"{prefix}-resid{E}-hi"] = int(np.ceil(100 * float(t1["residual"][i].max())))
    return out


def table1_markdown(tables: dict, paper=None, paper_table: dict | None = None) -> str:
    """Xu & Neglia (2021), Table 1 beside ours, as a Markdown table. ``tables`` maps a setting's label
    to ``(t1, prefix)`` (:func:`leaf_table1`'s output and its :func:`table1_values` prefix). Per setting
    and local-step count: the paper's mean train accuracy (last returned, decoded), ours as mean ± 95 %
    interval over the runs (each run's mean over clients), the oracle ``theta_c*``, the majority class
    (always predicting each client's most frequent label) and, last, the stored
    paper-scale record ``paper(name, digits)`` of the two means (e.g. :meth:`fedlab.records.Run.stored`;
    ``n/a`` when ``None``); then a second table with both models' mean relative distance to ``theta_c*``, the
    flatness of the server models and the map's loss (fitted / held out): two tables of 7 and 5 columns fit the
    page where one of 10 did not. ``paper_table`` defaults to :data:`PAPER_TABLE1`. Raises ``ValueError`` for
    a local-step setting the paper table lacks."""
    from .tables import markdown_table, mean_interval

    paper_table = PAPER_TABLE1 if paper_table is None else paper_table
    rows, diag = [], []
    for label, (t1, prefix) in tables.items():
        absent = [E for E in t1["local_steps"] if E not in paper_table]
        if absent:
            raise ValueError(f"paper_table has no row for local_steps {absent}")
        for i, E in enumerate(t1["local_steps"]):
            pt = paper_table[E]
            stored = ("n/a" if paper is None else
                      f"{paper(f'{prefix}-last{E}', 1)} / {paper(f'{prefix}-dec{E}', 1)}")
            rows.append([label, E, f"{pt['last'][-1]:.1f} / {pt['decoded'][-1]:.1f}",
                         mean_interval(100 * t1["last"][i].mean(1), 1) + " / "
                         + mean_interval(100 * t1["decoded"][i].mean(1), 1),
                         f"{100 * float(np.mean(t1['oracle'])):.1f}",
                         f"{100 * float(np.mean(t1['majority'])):.1f}", stored])
            diag.append([label, E, f"{float(t1['dist_last'][i].mean()):.2f} / {float(t1['dist_decoded'][i].mean()):.2f}",
                         float(t1["flatness"][i].mean()),
                         f"{float(t1['mapping_loss'][i].mean()):.3f} / {float(t1['heldout_loss'][i].mean()):.3f}"])
    header = ["setting", "$E$", "paper: last / dec.", "ours: last / dec.", "oracle", "majority class",
              "paper scale: last / dec. (mean ± 95 % CI, n)"]
    # two tables, so that each fits the page's column: the accuracies beside the paper's, then the diagnostics
    return ("Mean train accuracy over the five clients (%), last returned / decoded; $E$ local steps\n\n"
            + markdown_table(header, rows, digits=2)
            + "\n\nWhy: relative distance $\\lVert\\theta-\\theta_c^*\\rVert/\\lVert\\theta_c^*\\rVert$ of the last returned / "
            "decoded models, flatness of the observed server models, and the fitted map's loss on the observed / "
            "held-out rounds\n\n"
            + markdown_table(["setting", "$E$", "distance: last / dec.", "flatness", "map loss: fit / held out"], diag,
                             digits=2))


#: Rounds of the Table 1 round sweep (the paper's setting, one local step, the paper's step 0.01): the paper
#: trains for an unstated number of rounds; the issue's 100 / 1000 / 3000 at paper scale, a tenth-ish at quick
ROUND_SWEEP = {"quick": (30, 100, 300), "paper": (100, 1000, 3000)}


def leaf_round_sweep(clients, rounds: Sequence[int], *, local_steps: int = 1, seeds: Sequence[int] = (0,),
                     **table1_kwargs) -> dict:
    """Table 1's setting trained for each number of ``rounds`` (one :func:`leaf_table1` per length, with
    ``local_steps`` steps per round and the other settings of ``table1_kwargs``, e.g. the paper's step): does
    the decoder get closer to ``theta_c*`` when FedAvg runs longer and the eavesdropper sees more rounds?

    Returns ``{R: leaf_table1 output}`` in the order of ``rounds``. Raises ``ValueError`` for an empty or
    non-increasing ``rounds`` or a length below 2 (the attack needs two observations)."""
    rounds = [int(r) for r in rounds]
    if not rounds or any(r < 2 for r in rounds) or any(b <= a for a, b in zip(rounds, rounds[1:])):
        raise ValueError(f"rounds must be increasing numbers >= 2, got {list(rounds)}")
    positive_int("local_steps", local_steps)
    return {R: leaf_table1(clients, local_steps=(int(local_steps),), seeds=seeds, num_rounds=R, **table1_kwargs)
            for R in rounds}


def round_sweep_values(sweep: dict, prefix: str = "ch4-rs") -> dict:
    """The numbers the chapter quotes from :func:`leaf_round_sweep`, by position ``i`` of the length (so
    that quick and paper scale, which sweep different lengths, share names): ``{prefix}-rounds-i``, the train
    accuracy in % of the last returned and decoded models (``-last-i``, ``-dec-i``), decoded minus last in
    points (``-gain-i``), the mean relative distances to ``theta_c*`` (``-dlast-i``, ``-ddec-i``; ``-ddec-min``, the
    smallest over the lengths) and the flatness (``-flat-i``)."""
    out = {}
    for i, (R, t) in enumerate(sweep.items()):
        last, dec = 100 * float(t["last"].mean()), 100 * float(t["decoded"].mean())
        out.update({f"{prefix}-rounds-{i}": int(R), f"{prefix}-last-{i}": round(last, 1),
                    f"{prefix}-dec-{i}": round(dec, 1), f"{prefix}-gain-{i}": round(dec - last, 1),
                    f"{prefix}-dlast-{i}": round(float(t["dist_last"].mean()), 3),
                    f"{prefix}-ddec-{i}": round(float(t["dist_decoded"].mean()), 3),
                    f"{prefix}-flat-{i}": round(float(t["flatness"].mean()), 4)})
    out[f"{prefix}-ddec-min"] = min(out[f"{prefix}-ddec-{i}"] for i in range(len(sweep)))
    return out


def round_sweep_markdown(sweep: dict, paper=None, *, paper_rounds: Sequence[int] | None = None,
                         prefix: str = "ch4-rs") -> str:
    """:func:`leaf_round_sweep` as a Markdown table, one row per length: rounds, train accuracy (%) of the last
    returned and the decoded models, their mean relative distances to ``theta_c*``, the flatness of the
    server models, and the stored paper-scale record's decoded-minus-last gain at the same position
    (``paper(f"{prefix}-gain-{i}", 1)``, at ``paper_rounds[i]`` rounds; ``n/a`` without ``paper``)."""
    from .tables import markdown_table

    rows = []
    for i, (R, t) in enumerate(sweep.items()):
        at = "" if paper_rounds is None else f"{paper_rounds[i]} rounds: "
        rows.append([R, f"{100 * float(t['last'].mean()):.1f} / {100 * float(t['decoded'].mean()):.1f}",
                     f"{float(t['dist_last'].mean()):.2f} / {float(t['dist_decoded'].mean()):.2f}",
                     float(t["flatness"].mean()), at + ("n/a" if paper is None else paper(f"{prefix}-gain-{i}", 1))])
    return markdown_table(["rounds", "train accuracy %: last / decoded", "distance to θ*: last / decoded",
                           "flatness", "decoded − last (points), paper scale (mean ± 95 % CI)"], rows, digits=4)


# --------------------------------------------------------------------------------------------------
# Figure 1: the Adult split, the local optima, the attack
#: Xu & Neglia (2021), Sec. 4: records kept and the PhD clients' sizes, with the glued name of ours
PAPER_ADULT_COUNTS = {"ch4-adult-kept": ("records kept (all of Adult)", 12300),
                      "ch4-adult-c0": ("client 0 (PhD, <38)", 126),
                      "ch4-adult-c1": ("client 1 (PhD, 38-52)", 258),
                      "ch4-adult-c2": ("client 2 (PhD, >52)", 134)}


def _adult_education_age(split: str, *, drop_missing: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(meta["education"], meta["age"])`` of :func:`fedlab.data.load_adult` ``(split, drop_missing=...)``,
    read from the parsed rows without building the one-hot features (the counts below need only these
    two columns)."""
    from ..data import ADULT_COLUMNS, VENDOR, _read_adult

    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    files = {"train": ["adult.data.gz"], "test": ["adult.test.gz"], "all": ["adult.data.gz", "adult.test.gz"]}[split]
    rows = [r for f in files for r in _read_adult(VENDOR / f) if not (drop_missing and "?" in r)]
    arr = np.array(rows, dtype=object).reshape(len(rows), len(ADULT_COLUMNS))
    return (arr[:, ADULT_COLUMNS.index("education")].astype(str),
            arr[:, ADULT_COLUMNS.index("age")].astype(np.int64))


def adult_split_counts(train_clients) -> dict:
    """Our counts of the Adult split beside :data:`PAPER_ADULT_COUNTS`: the records kept by
    :func:`adult_phd_split` on all of Adult (train and test) and the train records of the three PhD
    clients ``train_clients[:3]``. Returns ``{glued name: int}``. Raises ``ValueError`` for fewer than
    three clients."""
    if len(train_clients) < 3:
        raise ValueError(f"train_clients must hold the three PhD clients first, got {len(train_clients)} clients")
    education, age = _adult_education_age("all")
    kept = len(np.concatenate(adult_phd_split(education, age)))
    ours = [kept, *[len(c) for c in train_clients[:3]]]
    return {name: int(o) for name, o in zip(PAPER_ADULT_COUNTS, ours)}


def adult_count_variants() -> list[list]:
    """Which reading of Adult gives the paper's PhD client sizes (126, 258, 134; Xu & Neglia 2021,
    Sec. 4)? Rows ``[file, missing-value rows, n(age < 38), n(38..52), n(age > 52)]`` of the Doctorate
    records for the train file, the test file and both, with the rows holding a ``?`` dropped or kept
    (:func:`fedlab.data.load_adult`)."""
    rows = []
    for split, label in (("train", "adult.data"), ("test", "adult.test"), ("all", "both files")):
        for drop in (True, False):
            education, age = _adult_education_age(split, drop_missing=drop)
            age = age[education == "Doctorate"]
            rows.append([label, "dropped" if drop else "kept", int((age < 38).sum()),
                         int(((age >= 38) & (age <= 52)).sum()), int((age > 52).sum())])
    return rows


def adult_variants_markdown(rows) -> str:
    """:func:`adult_count_variants`'s rows as a Markdown table."""
    from .tables import markdown_table

    return markdown_table(["file", "rows with '?'", "PhD, age < 38", "38-52", "> 52"], rows)


def adult_counts_markdown(counts: dict, paper=None) -> str:
    """The Adult split's counts as a Markdown table: the paper's, ours (``counts`` from
    :func:`adult_split_counts`) and the stored paper-scale record ``paper(name, digits)`` (``n/a`` when
    ``None``; :func:`fedlab.plots.md_table`). Raises ``ValueError`` for a name of :data:`PAPER_ADULT_COUNTS`
    missing from ``counts``."""
    missing = [n for n in PAPER_ADULT_COUNTS if n not in counts]
    if missing:
        raise ValueError(f"counts lacks {missing}: pass the output of adult_split_counts")
    from ..plots import md_table

    return md_table(["", "paper", "ours", "ours, paper scale (mean ± 95 % CI, n seeds)"],
                    [[str(label), str(v), str(counts[name]), paper(name, 0) if paper is not None else "n/a"]
                     for name, (label, v) in PAPER_ADULT_COUNTS.items()])


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


def _band(values):
    """Mean and 95 % t half-width over axis 0 (seeds) of ``values`` ``[S, ...]``; half-width 0 for S = 1."""
    from ..metrics import t_interval

    values = np.asarray(values, dtype=float)
    flat = values.reshape(values.shape[0], -1)
    mean = flat.mean(0)
    half = np.zeros_like(mean)
    if values.shape[0] > 1:
        for c in range(flat.shape[1]):
            lo, hi = t_interval(flat[:, c])[2]
            half[c] = (hi - lo) / 2
    return mean.reshape(values.shape[1:]), half.reshape(values.shape[1:])


def adult_values(fig1: dict, num_phd: int = 3) -> dict:
    """The numbers the chapter quotes from :func:`adult_experiment`'s output: test accuracy in %
    (mean over seeds and targets) of the decoded, last returned and global models and the majority
    baseline for the PhD targets (the first ``num_phd`` of ``fig1["targets"]`` must be clients below
    ``num_phd``) and the iid control, at the smallest and largest batch size, and the relative mapping
    loss there; ``ch4-fig1-moved`` is ``||theta_T - theta_0||``; ``ch4-obs7-*``: train accuracy on the PhD
    clients' own records at the largest batch (Observation 7 on Adult, the book's extension), with
    ``ch4-obs7-major`` the client's training-majority label; ``ch4-obs7-held-*``: the same models (and the
    training-majority label) on the PhD clients' held-out test records (the book's extension), and
    ``ch4-obs7-edge-in`` / ``ch4-obs7-edge-held``, the local optimum's lead over the global model in points on
    the training and on the held-out records. Raises ``ValueError`` for an output
    without both groups."""
    tg = np.asarray(fig1["targets"])
    phd, ctl = tg < num_phd, tg >= num_phd
    if not phd.any() or not ctl.any():
        raise ValueError(f"fig1 must attack PhD clients (< {num_phd}) and control clients, got targets {tg.tolist()}")
    out = {"ch4-fig1-moved": round(float(fig1["moved"].mean()), 3),
           "ch4-fig1-init": round(float(fig1["init_norm"].mean()), 3)}
    for grp, m in (("phd", phd), ("iid", ctl)):
        out[f"ch4-fig1-{grp}-major"] = round(100 * float(fig1["majority"][m].mean()), 1)
        for i, tag in ((0, "small"), (-1, "large")):
            for model in ("decoded", "last", "global"):
                out[f"ch4-fig1-{grp}-{model}-{tag}"] = round(100 * float(fig1[f"test_{model}"][i][:, m].mean()), 1)
            out[f"ch4-fig1-{grp}-mloss-{tag}"] = round(float(fig1["mapping_loss"][i][:, m].mean()), 3)
    # Observation 7 on Adult: infer the income of the client's own records, largest batch size
    for model in ("decoded", "last", "global"):
        out[f"ch4-obs7-{model}"] = round(100 * float(fig1[f"train_{model}"][-1][:, phd].mean()), 1)
    out["ch4-obs7-oracle"] = round(100 * float(fig1["train_oracle"][phd].mean()), 1)
    out["ch4-obs7-major"] = round(100 * float(fig1["train_majority"][phd].mean()), 1)
    # the book's extension: the same inference on held-out records of the PhD clients (their test records), the
    # baseline being the majority label of their training records
    for model in ("decoded", "last", "global"):
        out[f"ch4-obs7-held-{model}"] = round(100 * float(fig1[f"test_{model}"][-1][:, phd].mean()), 1)
    out["ch4-obs7-held-oracle"] = round(100 * float(fig1["test_oracle"][phd].mean()), 1)
    out["ch4-obs7-held-major"] = round(100 * float(fig1["majority"][phd].mean()), 1)
    out["ch4-obs7-edge-in"] = round(out["ch4-obs7-oracle"] - out["ch4-obs7-global"], 1)        # the local optimum's
    out["ch4-obs7-edge-held"] = round(out["ch4-obs7-held-oracle"] - out["ch4-obs7-held-global"], 1)  # edge, in points
    return out


def plot_adult_figure1(fig1: dict, num_phd: int = 3):
    """Xu & Neglia (2021), Figure 1b-c from :func:`adult_experiment`'s output: (b) the relative mapping
    loss against the batch size, for the PhD clients (non-iid) and the iid control; (c) the PhD clients'
    test accuracy of the decoded, last returned and final global models with the majority-class
    baseline. Means over seeds and targets, bands the 95 % t interval over seeds (none for one seed).
    Returns the two axes."""
    import matplotlib.pyplot as plt

    bs = np.asarray(fig1["batch_sizes"])
    tg = np.asarray(fig1["targets"])
    phd, ctl = tg < num_phd, tg >= num_phd
    _, axs = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)

    def curve(ax, key, mask, label, **kw):
        m, h = _band(np.moveaxis(fig1[key][:, :, mask].mean(2), 1, 0))     # [S, B] -> [B]
        scale = 100 if key.startswith("test") else 1
        line, = ax.plot(bs, scale * m, marker="o", label=label, **kw)
        ax.fill_between(bs, scale * (m - h), scale * (m + h), color=line.get_color(), alpha=0.2)

    curve(axs[0], "mapping_loss", phd, "PhD clients (non-iid)")
    curve(axs[0], "mapping_loss", ctl, "other clients (iid control)", ls="--")
    axs[0].set(xscale="log", xlabel="batch size", ylabel="relative mapping loss (Eq. 9)",
               title="(b) fitting the update map")
    for key, label, kw in (("test_decoded", "decoded", {}), ("test_last", "last returned", {"ls": "--"}),
                           ("test_global", "final global", {"ls": ":"})):
        curve(axs[1], key, phd, label, **kw)
    axs[1].axhline(100 * fig1["majority"][phd].mean(), color="k", lw=1, label="majority class")
    axs[1].set(xscale="log", xlabel="batch size", ylabel="test accuracy (%)", title="(c) PhD clients' test data")
    for ax in axs:
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    return axs
