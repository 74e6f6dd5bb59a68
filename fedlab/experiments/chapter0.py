"""Chapter 0's experiments (the federated-learning primer): centralized, standalone and FedAvg training
on scikit-learn's digits (McMahan et al. 2017, Sec. 3), distributed selective SGD (Shokri & Shmatikov
2015, Sec. 4.2) at several upload fractions, and the FedSGD / FedAvg comparison over communication
rounds with its grid of local epochs ``E`` and batch sizes ``B`` (McMahan et al. 2017, Sec. 3, Table 2),
the step size of each method tuned on held-out validation data, and the rounds to a target accuracy
against the client fraction ``C`` (McMahan et al. 2017, Table 1).

Every function takes the model, its starting parameters and the seed from the page and runs the
library's algorithms (:mod:`fedlab.fl`), so a page that calls them gets exactly the numbers it got when
the loops stood in its cells. The runs of a sweep are independent (each has its own generator), so they
go through :mod:`fedlab.fl.stacked`, which advances them together with their local SGD steps in one
``vmap`` and returns, bit for bit, what running them one after another returns.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .. import data, fl, metrics, plots
from .._checks import positive_int
from ..fl import stacked

__all__ = ["SETTING_NAMES", "METHODS", "DEFAULT_LRS", "compare_settings", "settings_table", "dssgd_sweep", "plot_dssgd",
           "tune_learning_rates", "lr_table", "fedsgd_vs_fedavg", "plot_rounds", "client_fraction_rounds",
           "client_fraction_table", "local_work_grid", "plot_grid_curve", "plot_local_work_grid"]

#: the two methods of :func:`fedsgd_vs_fedavg`, name -> (local epochs E, batch size B; ``None`` = infinity)
METHODS = {"FedSGD": (1, None), "FedAvg E=5, B=10": (5, 10)}
#: the learning rates the chapter used before they were tuned (FedSGD 0.5, FedAvg 0.05)
DEFAULT_LRS = {"FedSGD": 0.5, "FedAvg E=5, B=10": 0.05}

#: the glued name of each (setting, split) accuracy of :func:`compare_settings`
SETTING_NAMES = {"centralized": ("central_acc", "central_acc"),
                 "standalone (mean client)": ("standalone_iid", "standalone_noniid"),
                 "FedAvg": ("fedavg_iid", "fedavg_noniid")}

_GRID_E = (1, 5)
_GRID_B = (10, 50, None)


def _panel_per_key(keys, draw):
    """One figure with a row of panels sharing the y axis, ``draw(ax, key)`` filling the panel of
    each key in order. Returns the figure."""
    fig, axes = plt.subplots(1, len(keys), figsize=(11, 3.8), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        draw(ax, key)
    return fig


def _check_clients(clients: Mapping) -> None:
    if not isinstance(clients, Mapping) or not clients:
        raise ValueError("clients must be a non-empty mapping split name -> stacked clients")


def compare_settings(model, train, clients: Mapping, *, params: dict, eval_data, num_rounds: int,
                     num_epochs: int, local: fl.LocalTraining = fl.LocalTraining(lr=0.1, local_epochs=2,
                                                                                batch_size=10),
                     seed: int = 0) -> dict:
    """Centralized, standalone and collaborative (FedAvg) learning of one model on the same data, the
    three settings of Shokri's CS5562 lecture (FedAvg: McMahan et al. 2017, Algorithm 1).

    Centralized: ``num_epochs`` epochs of SGD on all of ``train`` (B = 32, step ``local.lr``). For every split
    of ``clients`` (``{"iid": stacked clients, "non-iid": ...}``) in order: standalone training of every
    client (``num_epochs`` epochs, batch ``local.batch_size``, step ``local.lr``), then FedAvg for
    ``num_rounds`` rounds with the clients' training ``local`` (:class:`fedlab.fl.LocalTraining`; default E = 2,
    B = 10, step 0.1), all from ``params``.

    Returns ``{setting: {split: test accuracy}}`` with settings ``"centralized"`` (the same number for
    every split), ``"standalone (mean client)"`` (mean of the clients' accuracies) and ``"FedAvg"``.
    Raises ``ValueError`` if ``num_rounds`` or ``num_epochs`` is not a positive integer or ``clients``
    is empty.
    """
    num_rounds = positive_int("num_rounds", num_rounds)
    num_epochs = positive_int("num_epochs", num_epochs)
    _check_clients(clients)
    if local.local_steps is not None or local.weight_decay != 0 or local.loss_fn is not fl.cross_entropy:
        raise ValueError(f"local: compare_settings trains local_epochs epochs of cross-entropy without weight decay, "
                         f"got {local}")
    # fl.train_centralized: FedAvg with one client holding all the data, one epoch per round
    central = stacked.fedavg_runs(model, [dict(clients=[train], local_epochs=1, batch_size=32, lr=local.lr,
                                               params=params, seed=seed)], num_rounds=num_epochs, eval_data=eval_data)[0]
    central_acc = central.history["accuracy"][-1]
    acc = {"centralized": {name: central_acc for name in clients},
           "standalone (mean client)": {}, "FedAvg": {}}
    # fl.train_standalone of every split (each client alone, its own generator per split), stacked
    w = {k: v.detach().clone() for k, v in params.items()}
    alone = stacked.clients_update_runs(model, [
        dict(params=w, data=cd, lr=local.lr, local_epochs=num_epochs, batch_size=local.batch_size,
             generator=torch.Generator().manual_seed(seed)) for cd in clients.values()])
    fed = stacked.fedavg_runs(model, [dict(clients=cd, local=local, params=params, seed=seed) for cd in clients.values()],
                              num_rounds=num_rounds, eval_data=eval_data)
    for name, cd, local, res in zip(clients, clients.values(), alone, fed):
        evals = [fl.evaluate(model, {n: v[k] for n, v in local.items()}, eval_data.X, eval_data.y)
                 for k in range(cd.num_clients)]
        acc["standalone (mean client)"][name] = float(np.mean([e["accuracy"] for e in evals]))
        acc["FedAvg"][name] = res.history["accuracy"][-1]
    return acc


def settings_table(acc: Mapping, run):
    """The Markdown table of :func:`compare_settings`'s accuracies (iid, non-iid) beside the stored
    paper-scale record of ``run`` (a :class:`fedlab.records.Run`). Raises ``ValueError`` if ``acc``
    lacks a setting of :data:`SETTING_NAMES`."""
    missing = [k for k in SETTING_NAMES if k not in acc]
    if missing:
        raise ValueError(f"acc lacks the settings {missing}")
    return plots.md_table(["setting", "iid", "non-iid", "iid, paper scale (mean ± 95 % CI)", "non-iid, paper scale"],
                          [[k, v["iid"], v["non-iid"], run.stored(SETTING_NAMES[k][0]), run.stored(SETTING_NAMES[k][1])]
                           for k, v in acc.items()])


def dssgd_sweep(model, clients, *, params: dict, eval_data, num_rounds: int, threshold: float,
                criteria: Sequence[str] = ("largest", "random"),
                upload_fractions: Sequence[float] = (1.0, 0.1, 0.01), seed: int = 0) -> dict:
    """Distributed selective SGD (Shokri & Shmatikov 2015, Sec. 4.2, Algorithm 1) for every selection
    criterion and upload fraction ``theta_u`` (in that order: criteria outer, fractions inner), each run
    ``num_rounds`` round-robin rounds of one local epoch with B = 10, lr 0.1 from ``params``;
    ``threshold`` is the ``tau`` of the random-with-threshold criterion.

    Returns ``{(criterion, theta_u): history}`` (``history["round"]``, ``history["accuracy"]``, ...).
    Raises ``ValueError`` if ``num_rounds`` is not a positive integer, ``threshold < 0``, or an upload
    fraction is outside ``(0, 1]``.
    """
    num_rounds = positive_int("num_rounds", num_rounds)
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    bad = [u for u in upload_fractions if not 0.0 < u <= 1.0]
    if bad:
        raise ValueError(f"upload_fractions must lie in (0, 1], got {bad}")
    keys = [(criterion, theta_u) for criterion in criteria for theta_u in upload_fractions]
    # fl.selective_sgd once per (criterion, theta_u), the runs stacked (the same numbers, bit for bit)
    runs = stacked.selective_sgd_runs(model, clients, [dict(criterion=c, upload_fraction=u, threshold=threshold)
                                                       for c, u in keys], num_rounds=num_rounds,
                                      local=fl.LocalTraining(lr=0.1, batch_size=10), params=params, seed=seed,
                                      eval_data=eval_data)
    return {key: res.history for key, res in zip(keys, runs)}


def plot_dssgd(dssgd: Mapping, *, standalone: float):
    """Test accuracy against rounds of :func:`dssgd_sweep`, one panel per criterion, one curve per
    upload fraction, with the standalone accuracy ``standalone`` as a dotted line. Returns the figure.
    Raises ``ValueError`` if ``dssgd`` is empty."""
    if not dssgd:
        raise ValueError("dssgd must hold at least one run")
    criteria = list(dict.fromkeys(c for c, _ in dssgd))
    fractions = list(dict.fromkeys(u for _, u in dssgd))

    def draw(ax, criterion):
        curves = {f"θu = {tu:g}": dssgd[(criterion, tu)]["accuracy"] for tu in fractions}
        plots.line_plot(dssgd[(criterion, fractions[0])]["round"], curves, xlabel="round (every participant once)",
                        ylabel="test accuracy", title=f"criterion: {criterion}", ax=ax)
        ax.axhline(standalone, color="gray", ls=":", label="standalone")
        ax.legend()

    return _panel_per_key(criteria, draw)


def _split_validation(train, num_clients: int, val_fraction: float, seed: int):
    fit, val = data.train_test_split(train, test_fraction=val_fraction, seed=seed)
    return fl.stack_clients(data.client_datasets(fit, data.partition_iid(len(fit), num_clients, seed=seed))), val


def tune_learning_rates(model, train, *, params: dict, lrs: Sequence[float], num_rounds: int,
                        num_clients: int = 10, val_fraction: float = 0.2, seed: int = 0) -> dict:
    """Choose the step size eta of each method of :data:`METHODS` on held-out validation data, as
    McMahan et al. (2017, Sec. 3) tune eta per method over a grid (they pick the best on test data;
    we never look at the test set). ``train`` is split into a fitting part and a validation part
    (``val_fraction``, stratified), the fitting part dealt iid to ``num_clients`` clients; every
    method runs ``num_rounds`` rounds with all clients from ``params`` for every ``eta`` in ``lrs``.
    A run's score is its mean validation accuracy over rounds ``1..num_rounds`` (the area under the
    accuracy-vs-rounds curve, which rewards reaching a target in few rounds); the chosen ``eta`` has
    the highest score (the smaller ``eta`` on a tie).

    Returns ``{"scores": {method: {eta: score}}, "chosen": {method: eta}}``. Raises ``ValueError`` if
    ``lrs`` is empty or holds a value <= 0, ``num_rounds`` or ``num_clients`` is not a positive
    integer, or ``val_fraction`` is outside ``(0, 1)``."""
    num_rounds = positive_int("num_rounds", num_rounds)
    num_clients = positive_int("num_clients", num_clients)
    lrs = sorted(float(v) for v in lrs)
    if not lrs or lrs[0] <= 0:
        raise ValueError(f"lrs must be a non-empty list of positive step sizes, got {lrs}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    clients, val = _split_validation(train, num_clients, val_fraction, seed)
    keys = [(method, lr) for method in METHODS for lr in lrs]
    runs = stacked.fedavg_runs(model, [dict(clients=clients, local_epochs=METHODS[m][0], batch_size=METHODS[m][1],
                                            lr=lr, params=params, seed=seed) for m, lr in keys],
                               num_rounds=num_rounds, eval_data=val)       # fl.fedavg per (method, eta), stacked
    scores = {method: {} for method in METHODS}
    for (method, lr), res in zip(keys, runs):
        scores[method][lr] = float(np.mean(res.history["accuracy"][1:]))
    chosen = {m: max(sc, key=lambda lr: (sc[lr], -lr)) for m, sc in scores.items()}
    return {"scores": scores, "chosen": chosen}


def lr_table(tuned: Mapping):
    """The Markdown table of :func:`tune_learning_rates`: one row per step size, one column per method
    (mean validation accuracy over rounds), the chosen step size marked with ``*``. Raises
    ``ValueError`` if ``tuned`` lacks ``"scores"`` or ``"chosen"``."""
    if "scores" not in tuned or "chosen" not in tuned:
        raise ValueError("tuned must be the result of tune_learning_rates (keys 'scores' and 'chosen')")
    methods = list(tuned["scores"])
    lrs = sorted({lr for sc in tuned["scores"].values() for lr in sc})
    cell = lambda m, lr: f"{tuned['scores'][m][lr]:.3f}" + (" *" if tuned["chosen"][m] == lr else "")
    return plots.md_table(["η"] + [f"{m}: mean validation accuracy" for m in methods],
                          [[f"{lr:g}"] + [cell(m, lr) for m in methods] for lr in lrs])


def fedsgd_vs_fedavg(model, clients: Mapping, *, params: dict, eval_data, num_rounds: int, seed: int = 0,
                     lrs: Mapping | None = None) -> dict:
    """FedSGD against FedAvg with E = 5, B = 10, all clients every round, for every split of
    ``clients`` (McMahan et al. 2017, Sec. 3: FedAvg needs far fewer communication rounds). Runs, per
    split in order, FedSGD then FedAvg. ``lrs``: ``{method: eta}`` for the methods of :data:`METHODS`
    (e.g. ``tune_learning_rates(...)["chosen"]``); ``None`` uses :data:`DEFAULT_LRS` (0.5 and 0.05).

    Returns ``{(split, "FedSGD" | "FedAvg E=5, B=10"): history}``. Raises ``ValueError`` if
    ``num_rounds`` is not a positive integer, ``clients`` is empty, or ``lrs`` lacks a method or holds
    a step size <= 0."""
    num_rounds = positive_int("num_rounds", num_rounds)
    _check_clients(clients)
    lrs = dict(DEFAULT_LRS if lrs is None else lrs)
    if any(m not in lrs or not lrs[m] > 0 for m in METHODS):
        raise ValueError(f"lrs must give a positive step size for each of {list(METHODS)}, got {lrs}")
    keys = [(name, method) for name in clients for method in METHODS]
    runs = stacked.fedavg_runs(model, [dict(clients=clients[n], local_epochs=METHODS[m][0], batch_size=METHODS[m][1],
                                            lr=lrs[m], params=params, seed=seed) for n, m in keys],
                               num_rounds=num_rounds, eval_data=eval_data)   # fl.fedavg per run, stacked
    return {key: res.history for key, res in zip(keys, runs)}


def client_fraction_rounds(model, train, *, params: dict, eval_data, num_clients: int, target: float,
                           num_rounds: int, lrs: Mapping, fractions: Sequence[float] = (0.0, 0.1, 0.5, 1.0),
                           seed: int = 0) -> dict:
    """McMahan et al. (2017), Table 1: rounds of FedAvg with E = 1 until the test accuracy reaches
    ``target``, for every client fraction C in ``fractions`` and B in {infinity, 10}, on ``train``
    dealt to ``num_clients`` clients iid and by label skew (two classes per client). C = 0 means one
    client per round (``m = max(C K, 1)``, as in the paper). B = infinity uses ``lrs["FedSGD"]``,
    B = 10 uses ``lrs["FedAvg E=5, B=10"]`` (the step sizes tuned for those batch sizes).

    Returns ``{(split, B, C): rounds or None}`` (``None``: not within ``num_rounds``; B = ``None`` is
    infinity). Raises ``ValueError`` if ``num_clients`` or ``num_rounds`` is not a positive integer, a
    fraction lies outside ``[0, 1]``, ``target`` outside ``(0, 1]``, or ``lrs`` lacks a method."""
    num_clients = positive_int("num_clients", num_clients)
    num_rounds = positive_int("num_rounds", num_rounds)
    bad = [c for c in fractions if not 0.0 <= c <= 1.0]
    if bad or not fractions:
        raise ValueError(f"fractions must be a non-empty list in [0, 1], got {list(fractions)}")
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    if any(m not in lrs for m in METHODS):
        raise ValueError(f"lrs must give a step size for each of {list(METHODS)}, got {dict(lrs)}")
    parts = {"iid": data.partition_iid(len(train), num_clients, seed=seed),
             "non-iid": data.partition_label_skew(train.y, num_clients, classes_per_client=2, seed=seed)}
    keys, runs = [], []
    for split, p in parts.items():
        cd = fl.stack_clients(data.client_datasets(train, p))
        for B, lr in ((None, lrs["FedSGD"]), (10, lrs["FedAvg E=5, B=10"])):
            for C in fractions:
                keys.append((split, B, C))
                runs.append(dict(clients=cd, client_fraction=max(C, 1.0 / num_clients), local_epochs=1, batch_size=B,
                                 lr=lr, params=params, seed=seed))
    # fl.fedavg per cell, stacked; a run stops at the target (the rounds to it are those of the full run)
    res = stacked.fedavg_runs(model, runs, num_rounds=num_rounds, eval_data=eval_data, stop_at=target)
    return {key: metrics.rounds_to_accuracy(r.history, target) for key, r in zip(keys, res)}


def client_fraction_table(rounds: Mapping, num_rounds: int):
    """The Markdown table of :func:`client_fraction_rounds` in the layout of McMahan et al.'s Table 1:
    one row per C, columns (split, B), each cell the rounds to target and in parentheses the speed-up
    over C = 0 of the same column (``> num_rounds`` when the target was not reached). Raises
    ``ValueError`` if ``rounds`` is empty."""
    if not rounds:
        raise ValueError("rounds must hold at least one run")
    cols = list(dict.fromkeys((s, B) for s, B, _ in rounds))
    fractions = list(dict.fromkeys(C for _, _, C in rounds))

    def cell(s, B, C):
        r, r0 = rounds[(s, B, C)], rounds[(s, B, fractions[0])]
        if r is None:
            return f"> {num_rounds}"
        return f"{r}" + (f" ({r0 / r:.1f}×)" if r0 is not None and C != fractions[0] else "")

    return plots.md_table(["C"] + [f"{s}, B = {'∞' if B is None else B}" for s, B in cols],
                          [[f"{C:g}"] + [cell(s, B, C) for s, B in cols] for C in fractions])


def plot_rounds(curves: Mapping):
    """Test accuracy against communication rounds of :func:`fedsgd_vs_fedavg`, one panel per split.
    Returns the figure. Raises ``ValueError`` if ``curves`` is empty."""
    if not curves:
        raise ValueError("curves must hold at least one run")
    splits = list(dict.fromkeys(s for s, _ in curves))
    algs = list(dict.fromkeys(a for _, a in curves))
    return _panel_per_key(splits, lambda ax, name: plots.line_plot(
        curves[(name, algs[0])]["round"], {alg: curves[(name, alg)]["accuracy"] for alg in algs},
        xlabel="communication round", ylabel="test accuracy", title=f"{name} clients", ax=ax))


def local_work_grid(model, clients: Mapping, curves: Mapping, *, params: dict, eval_data, num_rounds: int,
                    seed: int = 0, lrs: Mapping | None = None) -> dict:
    """FedAvg over the grid E in {1, 5} x B in {10, 50, infinity} for every split of ``clients``
    (McMahan et al. 2017, Table 2: more local computation per round, fewer rounds), each for
    ``num_rounds`` rounds. Step sizes: ``lrs`` as passed to :func:`fedsgd_vs_fedavg` (``None``:
    :data:`DEFAULT_LRS`); B = infinity uses FedSGD's, a finite B FedAvg's (tuned at B = 10), the rule
    that ran ``curves``. The corners already run by
    :func:`fedsgd_vs_fedavg` (``curves``: FedSGD is E = 1, B = infinity, and E = 5, B = 10) are cut to
    ``num_rounds`` rounds, not run again.

    Returns ``{(split, E, B): history}`` with ``B = None`` for infinity, rounds ``0..num_rounds``.
    Raises ``ValueError`` if ``num_rounds`` is not a positive integer or ``clients`` is empty, and
    ``KeyError`` if ``curves`` lacks a split's FedSGD or FedAvg run."""
    num_rounds = positive_int("num_rounds", num_rounds)
    _check_clients(clients)
    lrs = dict(DEFAULT_LRS if lrs is None else lrs)
    first = lambda h: {k: v[:num_rounds + 1] for k, v in h.items()}   # rounds 0..num_rounds
    grid, todo = {}, []
    for name in clients:
        grid[(name, 1, None)] = first(curves[(name, "FedSGD")])
        grid[(name, 5, 10)] = first(curves[(name, "FedAvg E=5, B=10")])
        for E in _GRID_E:
            for B in _GRID_B:
                if (name, E, B) not in grid:
                    grid[(name, E, B)] = None
                    todo.append((name, E, B))
    runs = stacked.fedavg_runs(model, [dict(clients=clients[n], local_epochs=E, batch_size=B, params=params, seed=seed,
                                            lr=lrs["FedSGD" if B is None else "FedAvg E=5, B=10"]) for n, E, B in todo],
                               num_rounds=num_rounds, eval_data=eval_data)   # fl.fedavg per cell, stacked
    for key, res in zip(todo, runs):
        grid[key] = res.history
    return grid


def plot_grid_curve(grid: Mapping, partition: str, local_epochs: int, batch_size: str):
    """One cell of :func:`local_work_grid` (``batch_size`` as the widget gives it: ``"10"``, ``"50"``
    or ``"∞"``) beside FedSGD, accuracy against rounds. Returns the axes. Raises ``ValueError`` for a
    cell that is not in the grid."""
    B = None if batch_size == "∞" else int(batch_size)
    if (partition, local_epochs, B) not in grid or (partition, 1, None) not in grid:
        raise ValueError(f"no run for partition={partition!r}, local_epochs={local_epochs}, batch_size={batch_size!r}")
    h, base = grid[(partition, local_epochs, B)], grid[(partition, 1, None)]
    ax = plots.line_plot(h["round"], {f"FedAvg E={local_epochs}, B={batch_size}": h["accuracy"],
                                      "FedSGD (E=1, B=∞)": base["accuracy"]},
                         xlabel="round", ylabel="test accuracy", title=f"{partition} clients")
    ax.set_ylim(0, 1)
    return ax


def plot_local_work_grid(grid: Mapping):
    """The whole grid of :func:`local_work_grid`, one panel per split (the static view of the page's
    widget). Returns the figure. Raises ``ValueError`` if ``grid`` is empty."""
    if not grid:
        raise ValueError("grid must hold at least one run")
    splits = list(dict.fromkeys(s for s, _, _ in grid))
    return _panel_per_key(splits, lambda ax, name: plots.line_plot(
        grid[(name, 1, None)]["round"],
        {f"E={E}, B={'∞' if B is None else B}": grid[(name, E, B)]["accuracy"] for E in _GRID_E for B in _GRID_B},
        xlabel="round", ylabel="test accuracy", ax=ax, title=f"{name} clients (static view of the widget)"))
