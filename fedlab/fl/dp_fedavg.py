"""The DP-FedAvg round loop (McMahan, Ramage, Talwar & Zhang 2018, Algorithm 1): Poisson sampling of
clients, the vmapped client update of :mod:`fedlab.fl`, and the server step of
:func:`fedlab.privacy.dp_fedavg.dp_aggregate` (clip, average with the fixed denominator ``q K``, add
Gaussian noise). Its privacy is :func:`fedlab.privacy.dp_fedavg.epsilon_spent`.

The noise is floating-point-safe by default (``safe=True``: the discrete Gaussian on a public grid,
Canonne, Kamath & Steinke 2020, accounted by ``epsilon_spent(..., safe=True)``, the accountant's
default); ``safe=False`` is the float mechanism of McMahan et al., not private on its float output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from .._checks import finite_positive, finite_tensor, run_spec
from ..privacy.dp_fedavg import check_dp_args, dp_aggregate, noise_std
from .local import ClientData, LocalTraining, _local, _spec_local, cross_entropy, stack_clients
from .protocols import FLResult, eval_fn
from .rounds import History, run_rounds

__all__ = ["DPRoundRecord", "poisson_sample", "dp_server_step", "dp_fedavg", "dp_fedavg_runs"]


@dataclass
class DPRoundRecord:
    """One DP round as the trusted server sees it: ``global_params`` sent, ``selected`` clients,
    raw ``updates`` ``{name: [m, ...]}`` (before clipping), their ``clipped_mean`` (no noise), the
    per-coordinate ``noise_std`` and the ``new_params`` released after the round."""

    round: int
    global_params: dict
    selected: np.ndarray
    updates: dict
    clipped_mean: dict
    noise_std: float
    new_params: dict


def poisson_sample(num_clients: int, sampling_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of the clients sampled in a round, each independently with probability ``sampling_prob``
    (Poisson sampling, McMahan et al. 2018, Alg. 1); draws ``num_clients`` uniforms from ``generator``."""
    return torch.nonzero(torch.rand(num_clients, generator=generator) < sampling_prob).flatten()


def dp_server_step(t: int, params: dict, selected: torch.Tensor, updates: dict | None, *, clip_norm: float | None,
                   noise_multiplier: float, expected_clients: float, server_lr: float,
                   generator: torch.Generator, callback: Callable[[DPRoundRecord], None] | None = None,
                   safe: bool = True, grid: float | None = None) -> dict:
    """The trusted server's round ``t`` of DP-FedAvg (and of Centaur, on the shared part only): clip the
    stacked client ``updates`` ``{name: [m, ...]}`` (``None`` when no client was sampled), average with
    the fixed denominator ``expected_clients``, add Gaussian noise
    (:func:`fedlab.privacy.dp_fedavg.dp_aggregate` with ``safe`` and ``grid``: the discrete Gaussian on a
    public grid by default, ``safe=False`` the float mechanism) and step ``params`` by ``server_lr``. Calls
    ``callback`` with the round's :class:`DPRoundRecord`; returns the new parameters."""
    if updates is None:
        updates = {k: torch.zeros((0, *v.shape)) for k, v in params.items()}
    noisy, clipped_mean = dp_aggregate(updates, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                       expected_clients=expected_clients, generator=generator, like=params,
                                       safe=safe, grid=grid)
    new = {k: params[k] + server_lr * noisy[k] for k in params}
    finite_tensor(f"the global parameters after round {t}", new,
                  f" (server_lr={server_lr} or the noise made them overflow)")
    if callback is not None:
        sigma = 0.0 if noise_multiplier == 0 else noise_std(noise_multiplier, clip_norm, expected_clients)
        callback(DPRoundRecord(t, params, selected.numpy(), updates, clipped_mean, sigma, new))
    return new


_DP_RUN = {"clients": None, "sampling_prob": None, "noise_multiplier": None, "clip_norm": None, "local_epochs": 1,
           "batch_size": 10, "lr": 0.1, "server_lr": 1.0, "params": None, "seed": 0, "callback": None, "safe": True,
           "grid": None}


def dp_fedavg(model: nn.Module, clients, *, num_rounds: int, sampling_prob: float,
              noise_multiplier: float, clip_norm: float | None, local: LocalTraining = LocalTraining(),
              server_lr: float = 1.0, params: dict | None = None, seed: int = 0, eval_data=None,
              callback: Callable[[DPRoundRecord], None] | None = None,
              safe: bool = True, grid: float | None = None) -> FLResult:
    """DP-FedAvg (McMahan et al. 2018, Alg. 1) with the functional, vmapped client update of
    :mod:`fedlab.fl` (one run of :func:`dp_fedavg_runs`).

    Parameters
    ----------
    clients : ClientData or list of per-client data sets (``K`` clients)
    sampling_prob : float in (0, 1]
        ``q``, each client's independent chance to be sampled in a round.
    noise_multiplier : float >= 0
        ``z``; the noise std on the average is ``z * clip_norm / (q K)``. 0 gives clipped FedAvg.
    clip_norm : float or None
        ``S``, the L2 bound on each client's update (``None``: no clipping, only with ``z = 0``).
    local : LocalTraining
        The sampled clients' training (default ``E = 1``, ``B = 10``, step 0.1; ``local_steps`` and
        ``weight_decay`` are not supported here and raise ``ValueError``).
    safe : bool
        ``True`` (default): the floating-point-safe discrete Gaussian on a public grid
        (``dp_aggregate(..., safe=True)``, ``grid`` its step, default ``safe_grid(sigma)``);
        ``False``: the float mechanism (continuous Gaussian in float32, not private on its float output).

    Returns
    -------
    An :class:`fedlab.fl.FLResult` (final parameters, test history when ``eval_data``).
    The privacy spent is :func:`fedlab.privacy.dp_fedavg.epsilon_spent` with the run's noise multiplier,
    sampling probability, rounds and ``delta``, and ``safe=safe`` (with ``num_params`` for the default grid's
    rounding when ``safe``).
    """
    local = _local(local)
    if local.local_steps is not None or local.weight_decay != 0:
        raise ValueError(f"local: dp_fedavg trains clients for local_epochs epochs without weight decay, got "
                         f"local_steps={local.local_steps}, weight_decay={local.weight_decay}")
    run = dict(clients=clients, sampling_prob=sampling_prob, noise_multiplier=noise_multiplier, clip_norm=clip_norm,
               local_epochs=local.local_epochs, batch_size=local.batch_size, lr=local.lr, server_lr=server_lr,
               params=params, seed=seed, callback=callback, safe=safe, grid=grid)
    return dp_fedavg_runs(model, [run], num_rounds=num_rounds, eval_data=eval_data, loss_fn=local.loss_fn)[0]


def _dp_run(model: nn.Module, spec, loss_fn=cross_entropy) -> dict:
    r = run_spec(_spec_local(spec, loss_fn), _DP_RUN, ("clients", "sampling_prob", "noise_multiplier", "clip_norm"), "the dp_fedavg arguments")
    if not 0.0 < r["sampling_prob"] <= 1.0:
        raise ValueError(f"sampling_prob must be in (0, 1], got {r['sampling_prob']}")
    finite_positive("server_lr", r["server_lr"])
    finite_positive("lr", r["lr"])
    data = r["clients"] if isinstance(r["clients"], ClientData) else stack_clients(r["clients"])
    finite_tensor("clients' X", data.X)
    K = data.num_clients
    m = r["sampling_prob"] * K
    check_dp_args(r["noise_multiplier"], r["clip_norm"], m)
    if r["noise_multiplier"] > 0 and r["clip_norm"] is None:
        raise ValueError("noise_multiplier > 0 needs a finite clip_norm")
    r.update(data=data, K=K, m=m, gen=torch.Generator().manual_seed(r["seed"]),
             w={k: v.detach().clone() for k, v in (r["params"] or dict(model.named_parameters())).items()},
             history=History("accuracy", "loss"))
    return r


def dp_fedavg_runs(model: nn.Module, runs, *, num_rounds: int, eval_data=None, loss_fn=cross_entropy) -> list[FLResult]:
    """Several :func:`dp_fedavg` runs advanced round by round together: each run is a mapping of that
    function's arguments (``clients``, ``sampling_prob``, ``noise_multiplier``, ``clip_norm`` and
    optionally ``local`` (or, flat, ``local_epochs``, ``batch_size``, ``lr``), ``server_lr``, ``params``, ``seed``,
    ``callback``, ``safe``, ``grid``), ``num_rounds``, ``eval_data`` and ``loss_fn`` are shared. Every run samples its
    clients, mini-batches and noise from its own generator in :func:`dp_fedavg`'s order; the local steps
    of all runs go through one vmapped step (:func:`fedlab.fl.stacked.sgd_jobs`). Returns one
    :class:`fedlab.fl.FLResult` per run, bit for bit what :func:`dp_fedavg` returns. Raises
    ``ValueError`` as :func:`dp_fedavg` does, and for no runs or an unknown argument."""
    from .stacked import SGDJob, _expand, batch_plan, sgd_jobs

    if not runs:
        raise ValueError("runs must hold at least one run")
    state = [_dp_run(model, r, loss_fn) for r in runs]
    ev = eval_fn(model, eval_data, loss_fn)

    def step(t, ws):
        jobs, subs, live = [], [], []
        for i, (r, w) in enumerate(zip(state, ws)):
            selected = poisson_sample(r["K"], r["sampling_prob"], r["gen"])
            subs.append(selected)
            if len(selected):
                sub = r["data"].select(selected)
                idx, wt = batch_plan(sub.n, r["batch_size"], r["local_epochs"], r["gen"])
                jobs.append(SGDJob(_expand(w, len(selected)), sub.X, sub.y, idx, wt, r["lr"], single=len(selected) == 1))
                live.append(i)
        local = dict(zip(live, sgd_jobs(model, jobs, loss_fn=loss_fn))) if jobs else {}
        new = []
        for i, (r, w, selected) in enumerate(zip(state, ws, subs)):
            updates = {k: (local[i][k] - w[k]).detach() for k in w} if i in local else None
            new.append(dp_server_step(t, w, selected, updates, clip_norm=r["clip_norm"],
                                      noise_multiplier=r["noise_multiplier"], expected_clients=r["m"],
                                      server_lr=r["server_lr"], generator=r["gen"], callback=r["callback"],
                                      safe=r["safe"], grid=r["grid"]))
        return new

    def log(t, ws, _history=None):
        for r, w in zip(state, ws):
            r["history"].log(t, **ev(w))

    ws = [r["w"] for r in state]
    if ev is not None:
        log(0, ws)
    ws, _, _ = run_rounds(num_rounds, step, ws, after_round=None if ev is None else log)
    return [FLResult(w, r["history"]) for r, w in zip(state, ws)]
