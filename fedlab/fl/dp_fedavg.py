"""The DP-FedAvg round loop (McMahan, Ramage, Talwar & Zhang 2018, Algorithm 1): Poisson sampling of
clients, the vmapped client update of :mod:`fedlab.fl`, and the server step of
:func:`fedlab.privacy.dp_fedavg.dp_aggregate` (clip, average with the fixed denominator ``q K``, add
Gaussian noise). Its privacy is :func:`fedlab.privacy.dp_fedavg.epsilon_spent`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from .._checks import finite_positive, finite_tensor
from ..privacy.dp_fedavg import check_dp_args, dp_aggregate, noise_std
from . import ClientData, FLResult, clients_update, cross_entropy, eval_fn, stack_clients
from .rounds import History, run_rounds

__all__ = ["DPRoundRecord", "poisson_sample", "dp_server_step", "dp_fedavg"]


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
                   generator: torch.Generator, callback: Callable[[DPRoundRecord], None] | None = None) -> dict:
    """The trusted server's round ``t`` of DP-FedAvg (and of Centaur, on the shared part only): clip the
    stacked client ``updates`` ``{name: [m, ...]}`` (``None`` when no client was sampled), average with
    the fixed denominator ``expected_clients``, add Gaussian noise
    (:func:`fedlab.privacy.dp_fedavg.dp_aggregate`) and step ``params`` by ``server_lr``. Calls
    ``callback`` with the round's :class:`DPRoundRecord`; returns the new parameters."""
    if updates is None:
        updates = {k: torch.zeros((0, *v.shape)) for k, v in params.items()}
    noisy, clipped_mean = dp_aggregate(updates, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                       expected_clients=expected_clients, generator=generator, like=params)
    new = {k: params[k] + server_lr * noisy[k] for k in params}
    finite_tensor(f"the global parameters after round {t}", new,
                  f" (server_lr={server_lr} or the noise made them overflow)")
    if callback is not None:
        sigma = 0.0 if noise_multiplier == 0 else noise_std(noise_multiplier, clip_norm, expected_clients)
        callback(DPRoundRecord(t, params, selected.numpy(), updates, clipped_mean, sigma, new))
    return new


def dp_fedavg(model: nn.Module, clients, *, num_rounds: int, sampling_prob: float,
              noise_multiplier: float, clip_norm: float | None, local_epochs: int = 1,
              batch_size: int | None = 10, lr: float = 0.1, server_lr: float = 1.0,
              params: dict | None = None, seed: int = 0, eval_data=None,
              loss_fn=cross_entropy, callback: Callable[[DPRoundRecord], None] | None = None) -> FLResult:
    """DP-FedAvg (McMahan et al. 2018, Alg. 1) with the functional, vmapped client update of
    :mod:`fedlab.fl`.

    Parameters
    ----------
    clients : ClientData or list of per-client data sets (``K`` clients)
    sampling_prob : float in (0, 1]
        ``q``, each client's independent chance to be sampled in a round.
    noise_multiplier : float >= 0
        ``z``; the noise std on the average is ``z * clip_norm / (q K)``. 0 gives clipped FedAvg.
    clip_norm : float or None
        ``S``, the L2 bound on each client's update (``None``: no clipping, only with ``z = 0``).

    Returns
    -------
    An :class:`fedlab.fl.FLResult` (final parameters, test history when ``eval_data``).
    The privacy spent is :func:`fedlab.privacy.dp_fedavg.epsilon_spent` ``(noise_multiplier, sampling_prob, num_rounds, delta)``.
    """
    if not 0.0 < sampling_prob <= 1.0:
        raise ValueError(f"sampling_prob must be in (0, 1], got {sampling_prob}")
    finite_positive("server_lr", server_lr)
    finite_positive("lr", lr)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    finite_tensor("clients' X", data.X)
    K = data.num_clients
    m = sampling_prob * K
    check_dp_args(noise_multiplier, clip_norm, m)
    if noise_multiplier > 0 and clip_norm is None:
        raise ValueError("noise_multiplier > 0 needs a finite clip_norm")
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}

    def step(t, w):
        selected = poisson_sample(K, sampling_prob, gen)
        updates = None
        if len(selected):
            local = clients_update(model, w, data.select(selected), lr=lr, local_epochs=local_epochs,
                                   batch_size=batch_size, generator=gen, loss_fn=loss_fn)
            updates = {k: (local[k] - w[k]).detach() for k in w}
        return dp_server_step(t, w, selected, updates, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                              expected_clients=m, server_lr=server_lr, generator=gen, callback=callback)

    w, history, _ = run_rounds(num_rounds, step, w, evaluate=eval_fn(model, eval_data, loss_fn),
                               history=History("accuracy", "loss"))
    return FLResult(w, history)
