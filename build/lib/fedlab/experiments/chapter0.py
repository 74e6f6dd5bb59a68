"""Chapter 0's experiments (the federated-learning primer): centralized, standalone and FedAvg training
on scikit-learn's digits (McMahan et al. 2017, Sec. 3), distributed selective SGD (Shokri & Shmatikov
2015, Sec. 4.2) at several upload fractions, and the FedSGD / FedAvg comparison over communication
rounds with its grid of local epochs ``E`` and batch sizes ``B`` (McMahan et al. 2017, Sec. 3, Table 2).

Every function takes the model, its starting parameters and the seed from the page and runs the
library's algorithms (:mod:`fedlab.fl`) in a fixed order, so a page that calls them draws exactly the
random numbers it drew when the loops stood in its cells.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from .. import fl, plots
from .._checks import positive_int

__all__ = ["SETTING_NAMES", "compare_settings", "settings_table", "dssgd_sweep", "plot_dssgd",
           "fedsgd_vs_fedavg", "plot_rounds", "local_work_grid", "plot_grid_curve", "plot_local_work_grid"]

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
                     num_epochs: int, seed: int = 0) -> dict:
    """Centralized, standalone and collaborative (FedAvg) learning of one model on the same data, the
    three settings of Shokri's CS5562 lecture (FedAvg: McMahan et al. 2017, Algorithm 1).

    Centralized: ``num_epochs`` epochs of SGD on all of ``train`` (B = 32, lr 0.1). For every split of
    ``clients`` (``{"iid": stacked clients, "non-iid": ...}``) in order: standalone training of every
    client (``num_epochs`` epochs, B = 10, lr 0.1), then FedAvg for ``num_rounds`` rounds (E = 2,
    B = 10, lr 0.1), all from ``params``.

    Returns ``{setting: {split: test accuracy}}`` with settings ``"centralized"`` (the same number for
    every split), ``"standalone (mean client)"`` (mean of the clients' accuracies) and ``"FedAvg"``.
    Raises ``ValueError`` if ``num_rounds`` or ``num_epochs`` is not a positive integer or ``clients``
    is empty.
    """
    num_rounds = positive_int("num_rounds", num_rounds)
    num_epochs = positive_int("num_epochs", num_epochs)
    _check_clients(clients)
    central = fl.train_centralized(model, train, num_epochs=num_epochs, batch_size=32, lr=0.1,
                                   params=params, seed=seed, eval_data=eval_data)
    central_acc = central.history["accuracy"][-1]
    acc = {"centralized": {name: central_acc for name in clients},
           "standalone (mean client)": {}, "FedAvg": {}}
    for name, cd in clients.items():
        _, evals = fl.train_standalone(model, cd, num_epochs=num_epochs, batch_size=10, lr=0.1,
                                       params=params, seed=seed, eval_data=eval_data)
        acc["standalone (mean client)"][name] = float(np.mean([e["accuracy"] for e in evals]))
        res = fl.fedavg(model, cd, num_rounds=num_rounds, local_epochs=2, batch_size=10, lr=0.1,
                        params=params, seed=seed, eval_data=eval_data)
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
                          [[k, v["iid"], v["non-iid"], run.paper(SETTING_NAMES[k][0]), run.paper(SETTING_NAMES[k][1])]
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
    out = {}
    for criterion in criteria:
        for theta_u in upload_fractions:
            res = fl.selective_sgd(model, clients, num_rounds=num_rounds, upload_fraction=theta_u,
                                   criterion=criterion, threshold=threshold, batch_size=10, lr=0.1,
                                   params=params, seed=seed, eval_data=eval_data)
            out[(criterion, theta_u)] = res.history
    return out


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


def fedsgd_vs_fedavg(model, clients: Mapping, *, params: dict, eval_data, num_rounds: int, seed: int = 0) -> dict:
    """FedSGD (lr 0.5) against FedAvg with E = 5, B = 10 (lr 0.05), all clients every round, for every
    split of ``clients`` (McMahan et al. 2017, Sec. 3: FedAvg needs far fewer communication rounds).
    Runs, per split in order, FedSGD then FedAvg.

    Returns ``{(split, "FedSGD" | "FedAvg E=5, B=10"): history}``. Raises ``ValueError`` if
    ``num_rounds`` is not a positive integer or ``clients`` is empty."""
    num_rounds = positive_int("num_rounds", num_rounds)
    _check_clients(clients)
    curves = {}
    for name, cd in clients.items():
        curves[(name, "FedSGD")] = fl.fedsgd(model, cd, num_rounds=num_rounds, lr=0.5, params=params,
                                             seed=seed, eval_data=eval_data).history
        curves[(name, "FedAvg E=5, B=10")] = fl.fedavg(model, cd, num_rounds=num_rounds, local_epochs=5,
                                                       batch_size=10, lr=0.05, params=params, seed=seed,
                                                       eval_data=eval_data).history
    return curves


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
                    seed: int = 0) -> dict:
    """FedAvg over the grid E in {1, 5} x B in {10, 50, infinity} for every split of ``clients``
    (McMahan et al. 2017, Table 2: more local computation per round, fewer rounds), each for
    ``num_rounds`` rounds (lr 0.05 for B = 10, else 0.5). The corners already run by
    :func:`fedsgd_vs_fedavg` (``curves``: FedSGD is E = 1, B = infinity, and E = 5, B = 10) are cut to
    ``num_rounds`` rounds, not run again.

    Returns ``{(split, E, B): history}`` with ``B = None`` for infinity, rounds ``0..num_rounds``.
    Raises ``ValueError`` if ``num_rounds`` is not a positive integer or ``clients`` is empty, and
    ``KeyError`` if ``curves`` lacks a split's FedSGD or FedAvg run."""
    num_rounds = positive_int("num_rounds", num_rounds)
    _check_clients(clients)
    first = lambda h: {k: v[:num_rounds + 1] for k, v in h.items()}   # rounds 0..num_rounds
    grid = {}
    for name, cd in clients.items():
        grid[(name, 1, None)] = first(curves[(name, "FedSGD")])
        grid[(name, 5, 10)] = first(curves[(name, "FedAvg E=5, B=10")])
        for E in _GRID_E:
            for B in _GRID_B:
                if (name, E, B) in grid:
                    continue
                grid[(name, E, B)] = fl.fedavg(model, cd, num_rounds=num_rounds, local_epochs=E, batch_size=B,
                                               lr=0.05 if B == 10 else 0.5, params=params, seed=seed,
                                               eval_data=eval_data).history
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
