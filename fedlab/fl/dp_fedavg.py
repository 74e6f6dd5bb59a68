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

__all__ = ["DPSettings", "DPRoundRecord", "poisson_sample", "dp_server_step", "dp_fedavg", "dp_fedavg_runs"]

_DP_FIELDS = ("noise_multiplier", "clip_norm", "sampling_prob", "server_lr", "safe", "grid")


@dataclass(frozen=True)
class DPSettings:
    """The trusted server's mechanism in DP-FedAvg (McMahan et al. 2018, Alg. 1) and in Centaur (Shen et al.
    2023): one settings object, so that a page shows the privacy side of a run in one line,
    ``DPSettings(noise_multiplier=1.1, clip_norm=1.0, sampling_prob=0.1)``.

    ``noise_multiplier``
        ``z >= 0``: the noise std on the average is ``z S / (q K)`` (0: clipped FedAvg, no noise).
    ``clip_norm``
        ``S > 0``, the L2 bound on each client's update; ``None`` (no clipping) only with ``z = 0``.
    ``sampling_prob``
        ``q`` in (0, 1]: each client's independent chance to be sampled in a round (Poisson sampling).
    ``server_lr``
        the server's step on the noisy average (1: plain averaging).
    ``safe``, ``grid``
        ``True`` (default): the floating-point-safe discrete Gaussian on a public grid of step ``grid`` (default
        :func:`fedlab.privacy.dp_fedavg.safe_grid` of the noise std); ``False``: the float mechanism (a
        continuous Gaussian in float32, not private on its float output).

    The privacy spent is :func:`fedlab.privacy.dp_fedavg.epsilon_spent` with ``z``, ``q``, the rounds and
    ``delta``, and ``safe``. Raises ``ValueError`` naming the field for a negative or infinite ``z``, a
    ``clip_norm`` that is not positive (or ``None`` with ``z > 0``), ``q`` outside (0, 1], a ``server_lr`` that
    is not finite and positive, or a ``grid`` that is not positive.
    """

    noise_multiplier: float
    clip_norm: float | None
    sampling_prob: float
    server_lr: float = 1.0
    safe: bool = True
    grid: float | None = None

    def __post_init__(self):
        if isinstance(self.sampling_prob, bool) or not 0.0 < self.sampling_prob <= 1.0:
            raise ValueError(f"sampling_prob must be in (0, 1], got {self.sampling_prob}")
        finite_positive("server_lr", self.server_lr)
        check_dp_args(self.noise_multiplier, self.clip_norm, 1.0)
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError("noise_multiplier > 0 needs a finite clip_norm")
        if self.grid is not None:
            finite_positive("grid", self.grid)
        if not isinstance(self.safe, bool):
            raise ValueError(f"safe must be True or False, got {self.safe!r}")


def _dp_settings(dp) -> DPSettings:
    if not isinstance(dp, DPSettings):
        raise ValueError(f"dp must be a fedlab.fl.dp_fedavg.DPSettings (e.g. DPSettings(noise_multiplier=1.0, "
                         f"clip_norm=1.0, sampling_prob=0.1)), got {type(dp).__name__}: {dp!r}")
    return dp


def _spec_dp(spec) -> dict:
    """A run of ``dp_fedavg_runs`` or ``centaur_runs`` given with ``dp`` (a :class:`DPSettings`), as its single-run
    function takes it: the same run with the flat keys. Raises ``ValueError`` naming ``dp`` for flat keys beside
    it."""
    if "dp" not in spec:
        return dict(spec)
    dp = _dp_settings(spec["dp"])
    clash = sorted(set(_DP_FIELDS) & set(spec))
    if clash:
        raise ValueError(f"dp: a run gives its mechanism either as dp= or as {clash}, not both")
    return {**{k: v for k, v in spec.items() if k != "dp"}, **{k: getattr(dp, k) for k in _DP_FIELDS}}


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


def dp_server_step(t: int, params: dict, selected: torch.Tensor, updates: dict | None, *, dp: DPSettings,
                   expected_clients: float, generator: torch.Generator,
                   callback: Callable[[DPRoundRecord], None] | None = None) -> dict:
    """The trusted server's round ``t`` of DP-FedAvg (and of Centaur, on the shared part only): clip the
    stacked client ``updates`` ``{name: [m, ...]}`` (``None`` when no client was sampled) to ``dp.clip_norm``,
    average with the fixed denominator ``expected_clients``, add Gaussian noise of multiplier
    ``dp.noise_multiplier`` (:func:`fedlab.privacy.dp_fedavg.dp_aggregate` with ``dp.safe`` and ``dp.grid``: the
    discrete Gaussian on a public grid by default, ``safe=False`` the float mechanism) and step ``params`` by
    ``dp.server_lr`` (:class:`DPSettings`; its ``sampling_prob`` is the caller's sampler's). Calls ``callback``
    with the round's :class:`DPRoundRecord`; returns the new parameters."""
    dp = _dp_settings(dp)
    clip_norm, noise_multiplier, server_lr = dp.clip_norm, dp.noise_multiplier, dp.server_lr
    if updates is None:
        updates = {k: torch.zeros((0, *v.shape)) for k, v in params.items()}
    noisy, clipped_mean = dp_aggregate(updates, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                       expected_clients=expected_clients, generator=generator, like=params,
                                       safe=dp.safe, grid=dp.grid)
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


def dp_fedavg(model: nn.Module, clients, *, num_rounds: int, dp: DPSettings, local: LocalTraining = LocalTraining(),
              params: dict | None = None, seed: int = 0, eval_data=None,
              callback: Callable[[DPRoundRecord], None] | None = None) -> FLResult:
    """DP-FedAvg (McMahan et al. 2018, Alg. 1) with the functional, vmapped client update of
    :mod:`fedlab.fl` (one run of :func:`dp_fedavg_runs`).

    Parameters
    ----------
    clients : ClientData or list of per-client data sets (``K`` clients)
    dp : DPSettings
        The server's mechanism: noise multiplier ``z``, clip bound ``S``, sampling probability ``q``, server step,
        and the safe discrete Gaussian (default) or the float one. The noise std on the average is ``z S / (q K)``.
    local : LocalTraining
        The sampled clients' training (default ``E = 1``, ``B = 10``, step 0.1; ``local_steps`` and
        ``weight_decay`` are not supported here and raise ``ValueError``).

    Returns
    -------
    An :class:`fedlab.fl.FLResult` (final parameters, test history when ``eval_data``).
    The privacy spent is :func:`fedlab.privacy.dp_fedavg.epsilon_spent` with the run's noise multiplier,
    sampling probability, rounds and ``delta``, and ``safe=dp.safe`` (with ``num_params`` for the default grid's
    rounding when ``safe``).
    """
    local = _local(local)
    if local.local_steps is not None or local.weight_decay != 0:
        raise ValueError(f"local: dp_fedavg trains clients for local_epochs epochs without weight decay, got "
                         f"local_steps={local.local_steps}, weight_decay={local.weight_decay}")
    run = dict(clients=clients, dp=_dp_settings(dp), local_epochs=local.local_epochs, batch_size=local.batch_size,
               lr=local.lr, params=params, seed=seed, callback=callback)
    return dp_fedavg_runs(model, [run], num_rounds=num_rounds, eval_data=eval_data, loss_fn=local.loss_fn)[0]


def _dp_run(model: nn.Module, spec, loss_fn=cross_entropy) -> dict:
    r = run_spec(_spec_dp(_spec_local(spec, loss_fn)), _DP_RUN,
                 ("clients", "sampling_prob", "noise_multiplier", "clip_norm"), "the dp_fedavg arguments")
    dp = DPSettings(**{k: r[k] for k in _DP_FIELDS})
    finite_positive("lr", r["lr"])
    data = r["clients"] if isinstance(r["clients"], ClientData) else stack_clients(r["clients"])
    finite_tensor("clients' X", data.X)
    K = data.num_clients
    m = r["sampling_prob"] * K
    check_dp_args(r["noise_multiplier"], r["clip_norm"], m)
    r.update(dp=dp, data=data, K=K, m=m, gen=torch.Generator().manual_seed(r["seed"]),
             w={k: v.detach().clone() for k, v in (r["params"] or dict(model.named_parameters())).items()},
             history=History("accuracy", "loss"))
    return r


def dp_fedavg_runs(model: nn.Module, runs, *, num_rounds: int, eval_data=None, loss_fn=cross_entropy) -> list[FLResult]:
    """Several :func:`dp_fedavg` runs advanced round by round together: each run is a mapping of that
    function's arguments (``clients``, ``dp`` (or, flat, ``sampling_prob``, ``noise_multiplier``, ``clip_norm`` and
    optionally ``server_lr``, ``safe``, ``grid``) and optionally ``local`` (or, flat, ``local_epochs``,
    ``batch_size``, ``lr``), ``params``, ``seed``, ``callback``), ``num_rounds``, ``eval_data`` and ``loss_fn`` are shared. Every run samples its
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
            new.append(dp_server_step(t, w, selected, updates, dp=r["dp"], expected_clients=r["m"],
                                      generator=r["gen"], callback=r["callback"]))
        return new

    def log(t, ws, _history=None):
        for r, w in zip(state, ws):
            r["history"].log(t, **ev(w))

    ws = [r["w"] for r in state]
    if ev is not None:
        log(0, ws)
    ws, _, _ = run_rounds(num_rounds, step, ws, after_round=None if ev is None else log)
    return [FLResult(w, r["history"]) for r, w in zip(state, ws)]
