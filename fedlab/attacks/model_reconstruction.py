"""Local model reconstruction by an eavesdropper (Xu & Neglia 2021, "What else is leaked when
eavesdropping Federated Learning?").

An honest-but-curious adversary listens to the channel between one client ``c`` and the server. Each
time ``c`` takes part in a round it sees the pair (server model ``theta`` sent, client model
``theta_c`` returned). From these pairs it estimates the model ``theta_c*`` the client would have
trained on its own data, the *local optimum*.

What is here, in the paper's order:

* :func:`affine_update_map` and :func:`solve_affine` -- Observation 1: with full-batch local GD on a
  least-squares loss the update ``theta - theta_c = W theta - v`` is affine; ``d + 1`` observed rounds
  fix ``W`` and ``v`` and ``theta_c* = W^{-1} v``. With more rounds the same solve is the ordinary
  least-squares (OLS) estimator of Observation 5. :func:`consistent_decoding` shows that ``d`` rounds
  do not suffice, and :func:`symmetric_null_dimension` that they do not even when the decoder uses the
  symmetry of ``W`` (one direction stays free).
* :func:`hard_instance` -- the tridiagonal instance of Observation 2 (after Nesterov 2004, Sec. 2.1.2).
* :func:`noisy_local_gd`, :func:`obs5_rate`, :func:`obs6_lower_bound`, :func:`obs6_known_map_risk`,
  :func:`minibatch_gradient_variance` -- Observations 5 and 6 (stochastic gradients); the last but one is
  the exact risk the proof of Observation 6 bounds, which shows the printed bound counts ``d`` twice.
* :func:`fit_mapping`, :func:`minimise_mapping`, :func:`reconstruct_heuristic` -- Algorithm 3:
  learn a map ``G(theta) ~ theta - theta_c`` (one hidden layer of 1000 ReLU units, Adam) and return
  ``argmin ||G(theta)||^2``. Many independent attacks (seeds x clients) are trained in one batch.
* :class:`Eavesdropper` -- a ``fedlab.fl.fedavg`` callback that records what crosses the channel.
* :func:`leaf_table1`, :func:`adult_experiment` -- the experiments of Sec. 4 (Table 1, Figure 1).

Parameter vectors are called ``theta`` (shape ``[d]``); stacks of observations are ``[n, d]`` or,
batched over independent attacks, ``[P, n, d]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .. import fl
from ..fl._linear import dense_clients_update, linear_fast_path
from ..models import flatten_params, linear_model, logistic_loss
from ..models import squared_error as squared_loss
from ..privacy.defenses import gaussian_noise

__all__ = [
    "squared_loss", "logistic_loss", "linear_model", "affine_update_map", "AffineEstimate",
    "solve_affine", "consistent_decoding", "symmetric_null_dimension", "hard_instance", "hard_instance_optimum",
    "hard_instance_clients", "noisy_local_gd", "obs5_rate", "obs6_lower_bound", "obs6_known_map_risk", "max_lr",
    "minibatch_gradient_variance", "minibatch_local_sgd", "ols_error_curve", "Eavesdropper", "run_eavesdropped_fedavg", "MappingNet",
    "fit_mapping", "minimise_mapping", "HeuristicResult", "reconstruct_heuristic",
    "binary_accuracy", "relative_distances", "local_optimum",
]


# --------------------------------------------------------------------------------------------
# models and losses used with fedlab.fl
# --------------------------------------------------------------------------------------------
def binary_accuracy(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Accuracy of logistic models ``theta = [w (d_x), b]`` on ``(X, y)``.

    ``theta``: ``[d_x + 1]`` or ``[..., d_x + 1]``; returns a tensor of shape ``theta.shape[:-1]``."""
    w, b = theta[..., :-1], theta[..., -1:]
    logits = torch.einsum("nd,...d->...n", X.to(theta.dtype), w) + b
    return ((logits > 0).long() == y).to(torch.float64).mean(-1)


# --------------------------------------------------------------------------------------------
# Observation 1: exact reconstruction for least squares with full-batch GD
# --------------------------------------------------------------------------------------------
def local_optimum(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Least-squares local optimum ``theta_c* = (X^T X)^{-1} X^T y`` (shape ``[d]``). Solved with LAPACK's
    SVD driver ``gelsd``: the CPU default ``gelsy`` (QR with column pivoting) gives answers whose last bits
    depend on where the tensors sit in memory, so two identical calls could differ (measured: 108 of 200
    repeated calls on the matrix's clients); ``gelsd`` gave the same bits in all of them."""
    return torch.linalg.lstsq(X, y.to(X.dtype).unsqueeze(-1), driver="gelsd").solution[..., 0]


def affine_update_map(X: torch.Tensor, y: torch.Tensor, *, lr: float, local_steps: int):
    """The affine map of Xu & Neglia (2021), proof of Observation 1.

    ``local_steps`` full-batch GD steps of size ``lr`` on ``||X theta - y||^2 / m`` send a server
    model ``theta`` to ``theta_c`` with ``theta - theta_c = W theta - v``, where
    ``W = I - (I - 2 lr H / m)^E``, ``H = X^T X``, ``v = W theta_c*`` (Eqs. 4-5).

    ``W`` is invertible, and ``theta_c* = W^{-1} v``, when every factor ``1 - 2 lr lambda_i / m`` lies in
    ``(-1, 1)``, i.e. ``H`` positive definite and ``lr < m / lambda_max(H)``. The paper's Lemma 4 assumes
    ``H`` positive definite only: with ``lr = m / lambda_i`` and ``E`` even, ``W`` is singular.

    ``X``: ``[m, d]``, ``y``: ``[m]``. Returns ``(W [d, d], v [d], theta_star [d])``.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if int(local_steps) != local_steps or local_steps < 1:
        raise ValueError(f"local_steps must be a positive integer, got {local_steps}")
    m, d = X.shape
    H = X.T @ X
    A = torch.eye(d, dtype=X.dtype) - 2.0 * lr / m * H
    W = torch.eye(d, dtype=X.dtype) - torch.linalg.matrix_power(A, int(local_steps))
    theta_star = local_optimum(X, y)
    return W, W @ theta_star, theta_star


@dataclass
class AffineEstimate:
    """Result of :func:`solve_affine`: ``W`` ``[..., d, d]``, ``v`` ``[..., d]``, the decoded model
    ``theta = W^{-1} v`` ``[..., d]``, the number of observations and whether ``(W, v)`` was
    identifiable (design ``[theta_in, -1]`` of full column rank ``d + 1``)."""

    W: torch.Tensor
    v: torch.Tensor
    theta: torch.Tensor
    num_obs: int
    identifiable: bool
    residual: float


def solve_affine(theta_in: torch.Tensor, theta_out: torch.Tensor) -> AffineEstimate:
    """Decode a local model from eavesdropped pairs (Xu & Neglia 2021, Obs. 1; OLS of Obs. 5, Eq. 14).

    Regress the update ``Delta = theta_in - theta_out`` on ``[theta_in, -1]``: each of the ``d`` rows
    of ``W`` and entries of ``v`` solves a linear system with one equation per observed round; with
    ``n = d + 1`` rounds the solution is exact, with more rounds it is the OLS estimate (Eq. 14).
    Then ``theta_c* = W^{-1} v``. Neither the learning rate nor the number of local steps is used.

    Parameters
    ----------
    theta_in : ``[n, d]`` or ``[P, n, d]``: server models sent to the client (float64 recommended)
    theta_out : same shape: models the client returned

    Returns
    -------
    AffineEstimate. With fewer than ``d + 1`` affinely independent observations the system is
    under-determined: the minimum-norm solution is returned and ``identifiable`` is False.

    Raises
    ------
    ValueError
        If the shapes differ or are not ``[n, d]`` / ``[P, n, d]``.
    """
    if theta_in.shape != theta_out.shape or theta_in.ndim not in (2, 3):
        raise ValueError(f"theta_in and theta_out must both be [n, d] or [P, n, d], got "
                         f"{tuple(theta_in.shape)} and {tuple(theta_out.shape)}")
    n, d = theta_in.shape[-2:]
    ones = -torch.ones(*theta_in.shape[:-1], 1, dtype=theta_in.dtype)
    A = torch.cat([theta_in, ones], dim=-1)                       # [.., n, d + 1]
    B = theta_in - theta_out                                      # [.., n, d]
    rank = int(torch.linalg.matrix_rank(A).min())
    identifiable = rank == d + 1
    Z = torch.linalg.lstsq(A, B, driver="gelsd").solution          # [.., d + 1, d]
    W = Z[..., :d, :].transpose(-1, -2)
    v = Z[..., d, :]
    theta = torch.linalg.lstsq(W, v.unsqueeze(-1)).solution[..., 0]
    residual = float((A @ Z - B).norm() / B.norm().clamp_min(1e-300))
    return AffineEstimate(W, v, theta, n, identifiable, residual)


def consistent_decoding(theta_in: torch.Tensor, theta_out: torch.Tensor, target: torch.Tensor):
    """Why ``d`` rounds are not enough (Xu & Neglia 2021, Obs. 1-2): build an affine map that explains
    every observed pair exactly but whose fixed point is an arbitrary ``target``.

    With ``n <= d`` observations the design ``[theta_in, -1]`` has a null vector ``z = (z_theta, z_0)``;
    ``W' = W_0 + a z_theta^T`` and ``v' = v_0 + z_0 a`` fit the data for every ``a``, and
    ``a = (v_0 - W_0 t) / (z_theta^T t - z_0)`` makes ``W' t = v'``.

    ``theta_in``, ``theta_out``: ``[n, d]``; ``target``: ``[d]``. Returns ``(W' [d, d], v' [d])``.

    Raises
    ------
    ValueError
        If the observations already identify ``(W, v)`` (rank ``d + 1``), or ``target`` lies on the
        affine hull of the observed server models (then no such map exists).
    """
    n, d = theta_in.shape
    A = torch.cat([theta_in, -torch.ones(n, 1, dtype=theta_in.dtype)], dim=1)
    if int(torch.linalg.matrix_rank(A)) == d + 1:
        raise ValueError("theta_in already identifies (W, v): the decoding is unique")
    Z0 = torch.linalg.lstsq(A, theta_in - theta_out, driver="gelsd").solution
    W0, v0 = Z0[:d].T, Z0[d]
    z = torch.linalg.svd(A, full_matrices=True).Vh[-1]            # A z = 0
    denom = z[:d] @ target - z[d]
    if abs(float(denom)) < 1e-12:
        raise ValueError("target lies on the affine hull of the observed server models")
    a = (v0 - W0 @ target) / denom
    return W0 + torch.outer(a, z[:d]), v0 + z[d] * a


def symmetric_null_dimension(theta_in: torch.Tensor) -> int:
    """How many directions of ``(W, v)`` with ``W`` *symmetric* the observations leave free
    (Xu & Neglia 2021, Obs. 1: ``W = I - (I - 2 lr H / m)^E`` is symmetric because ``H`` is).

    The linear map ``(W = W^T, v) -> [W theta(t) - v]_t`` has ``d (d + 1) / 2 + d`` unknowns and ``n d``
    equations; this returns the dimension of its null space. With ``n = d`` affinely independent server
    models it is exactly 1 (the unconstrained solutions are ``W + a z_theta^T`` for a null vector ``z`` of
    ``[theta_in, -1]``, and ``a z_theta^T`` is symmetric only for ``a = c z_theta``), so a decoder that uses
    the symmetry is one scalar short at ``d`` rounds, and ``d + 1`` rounds are still needed.

    ``theta_in``: ``[n, d]``. Raises ``ValueError`` if it is not a 2-d tensor.
    """
    if theta_in.ndim != 2:
        raise ValueError(f"theta_in must be [n, d], got shape {tuple(theta_in.shape)}")
    n, d = theta_in.shape
    iu = torch.triu_indices(d, d)
    k = iu.shape[1]
    M = torch.zeros(n * d, k + d, dtype=torch.float64)
    th = theta_in.to(torch.float64)
    for j, (a, b) in enumerate(iu.T.tolist()):   # basis matrix E_ab + E_ba (E_aa on the diagonal)
        col = torch.zeros(n, d, dtype=torch.float64)
        col[:, a] += th[:, b]
        if a != b:
            col[:, b] += th[:, a]
        M[:, j] = col.reshape(-1)
    for i in range(d):                            # -v
        col = torch.zeros(n, d, dtype=torch.float64)
        col[:, i] = -1.0
        M[:, k + i] = col.reshape(-1)
    return int(k + d - torch.linalg.matrix_rank(M))


# --------------------------------------------------------------------------------------------
# Observation 2: the tridiagonal hard instance
# --------------------------------------------------------------------------------------------
def hard_instance(d: int, *, truncated: bool = False, dtype: torch.dtype = torch.float64):
    """Local data ``(X, y)`` of the hard client of Xu & Neglia (2021), proof of Observation 2.

    ``H = X^T X`` is tridiagonal with 1 on the diagonal and -1/2 beside it, and ``X^T y = e_1 / 2``.
    We take ``X = D / sqrt(2)`` with ``D`` the ``(d + 1) x d`` first-difference matrix (``D_ii = 1``,
    ``D_{i+1,i} = -1``) and ``y = e_1 / sqrt(2)``, so ``m = d + 1`` and every product keeps exact zeros.

    ``truncated=True`` builds the alternative client the adversary cannot tell apart before round ``d``:
    the last column of ``X`` becomes ``e_{d+1}`` (a feature seen only in the last record, where
    ``y = 0``). Then ``H' = diag(T_{d-1}, 1)``: ``H`` with the coupling ``H_{d-1,d} = H_{d,d-1} = -1/2``
    removed. ``H'`` is positive definite (full rank, unique optimum ``(1 - i/d)_{i<d}`` followed by 0,
    see :func:`hard_instance_optimum`), and ``H' theta = H theta`` for every ``theta`` supported on the
    first ``d - 2`` coordinates, so the two clients answer identically in rounds ``1..d-1``; in round
    ``d`` the server model reaches coordinate ``d - 1`` and the answers differ.

    Returns ``X [d + 1, d]`` and ``y [d + 1]``. Raises ``ValueError`` if ``d < 2``.
    """
    if int(d) != d or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d}")
    D = torch.zeros(d + 1, d, dtype=dtype)
    idx = torch.arange(d)
    D[idx, idx] = 1.0
    D[idx + 1, idx] = -1.0
    X = D / math.sqrt(2.0)
    if truncated:
        X[:, -1] = 0.0
        X[d, -1] = 1.0
    y = torch.zeros(d + 1, dtype=dtype)
    y[0] = 1.0 / math.sqrt(2.0)
    return X, y


def hard_instance_optimum(d: int, *, truncated: bool = False, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``theta_c* = H^{-1} X^T y`` of :func:`hard_instance` (Xu & Neglia 2021, proof of Observation 2):
    ``1 - i / (d + 1)``, ``i = 1..d``; with ``truncated=True`` (``H' = diag(T_{d-1}, 1)``) it is
    ``1 - i / d`` for ``i < d`` and 0 for ``i = d``. Shape ``[d]``. Raises ``ValueError`` if ``d < 2``."""
    if int(d) != d or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d}")
    if truncated:
        return torch.cat([1.0 - torch.arange(1, d, dtype=dtype) / d, torch.zeros(1, dtype=dtype)])
    return 1.0 - torch.arange(1, d + 1, dtype=dtype) / (d + 1)


def hard_instance_clients(d: int, num_clients: int = 3, *, truncated: bool = False):
    """Clients of the Observation 2 scenario: client 0 is the hard client, the others have
    ``X = I_d`` and ``y = 0`` (``H = I``, local optimum 0). Returns a list of ``(X, y)`` pairs."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    out = [hard_instance(d, truncated=truncated)]
    out += [(torch.eye(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64))
            for _ in range(num_clients - 1)]
    return out


# --------------------------------------------------------------------------------------------
# Observations 5-6: stochastic gradients
# --------------------------------------------------------------------------------------------
def max_lr(X: torch.Tensor, factor: float = 4.0) -> float:
    """Largest step allowed by Observation 6, ``m / (factor * lambda_max(X^T X))`` (``factor=2`` is
    the condition of Observation 5)."""
    m = X.shape[0]
    return float(m / (factor * torch.linalg.eigvalsh(X.T @ X).max()))


def noisy_local_gd(theta_in: torch.Tensor, X: torch.Tensor, y: torch.Tensor, *, lr: float,
                   local_steps: int, sigma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The stochastic local update of Xu & Neglia (2021), proof of Observation 5 (Eq. 11).

    ``local_steps`` (``E * ceil(m / b)``) steps ``theta <- theta - lr * (grad L_c(theta) + eps)`` with
    ``eps ~ N(0, sigma^2 / d I)`` (:func:`fedlab.privacy.defenses.gaussian_noise`, which draws nothing
    when ``sigma = 0``), so ``E ||eps||^2 = sigma^2``. Every leading index of ``theta_in`` (shape
    ``[..., d]``) is an independent client round. Returns the client models, same shape.
    """
    if not lr > 0 or sigma < 0:
        raise ValueError(f"need lr > 0 and sigma >= 0, got lr={lr}, sigma={sigma}")
    if int(local_steps) != local_steps or local_steps < 1:
        raise ValueError(f"local_steps must be a positive integer, got {local_steps}")
    m, d = X.shape
    H, b = X.T @ X, X.T @ y.to(X.dtype)
    theta = theta_in.clone()
    for _ in range(int(local_steps)):
        theta = theta - lr * gaussian_noise(2.0 / m * (theta @ H - b), sigma / math.sqrt(d), generator=generator)
    return theta


def obs5_rate(theta_in: torch.Tensor, *, lr: float, sigma: float, local_steps: int) -> torch.Tensor:
    """The rate of Observation 5's bound on the OLS error (Eq. 16), corrected:
    ``d lr^2 sigma^2 S / (n_c rho_min([theta_in, -1] / sqrt(n_c))^2)``, without its unknown constant.
    The paper defines ``rho_min`` as the smallest *singular value* and writes it to the first power; the
    OLS risk ``sigma^2 tr((A^T A)^{-1}) <= sigma^2 (d + 1) / s_min(A)^2`` needs its square.

    ``theta_in``: ``[n_c, d]`` or ``[P, n_c, d]``; returns a scalar tensor or ``[P]``."""
    n, d = theta_in.shape[-2:]
    A = torch.cat([theta_in, -torch.ones(*theta_in.shape[:-1], 1, dtype=theta_in.dtype)], dim=-1)
    rho = torch.linalg.svdvals(A / math.sqrt(n))[..., -1]
    return d * lr ** 2 * sigma ** 2 * local_steps / (n * rho ** 2)


def obs6_lower_bound(d: int, n_obs, *, lr: float, sigma: float, local_steps: int):
    """Observation 6 (Xu & Neglia 2021, Eq. 28): for every estimator,
    ``E ||theta_c* - hat theta||^2 >= 4 d lr^2 sigma^2 / (555 n_c) * (1 - 4^{-S})`` when
    ``lr <= m / (4 lambda_max(H))``. ``n_obs`` may be an array; the result has its shape.

    As printed, the bound counts ``d`` twice (proof step (24)) and is not valid for large ``d``: for
    ``H = lambda I``, ``lr = m / (4 lambda)`` the exact risk :func:`obs6_known_map_risk` equals it at
    ``d = 185 / (1 - 2^{-S})^2`` and falls below it for larger ``d``."""
    n_obs = np.asarray(n_obs, dtype=np.float64)
    if (n_obs < 1).any():
        raise ValueError("n_obs must be >= 1")
    return 4.0 * d * lr ** 2 * sigma ** 2 / (555.0 * n_obs) * (1.0 - 0.25 ** local_steps)


def obs6_known_map_risk(X: torch.Tensor, n_obs, *, lr: float, sigma: float, local_steps: int):
    """The exact minimax risk behind Observation 6 (Xu & Neglia 2021, Appendix A, proof of Obs. 6):
    ``E ||hat theta - theta_c*||^2 = tr(W^{-1} Sigma_gamma W^{-1}) / n_c`` of the best estimator that even
    knows ``W``, under the noise model of Eq. (11) (``eps ~ N(0, sigma^2 / d I)``), where
    ``Sigma_gamma = lr^2 sigma^2 / d * sum_{k<S} A^{2k}``, ``A = I - 2 lr H / m``, ``S = local_steps``.

    With ``W`` known the observations ``W theta(t) - Delta(t) = v - gamma_t`` are i.i.d. Gaussian around
    ``v = W theta_c*``; their mean is minimax for ``theta_c* = W^{-1} v``, so no estimator (in particular
    none that has to learn ``W``) has a smaller worst-case risk. The proof's (22)-(23) bound this
    quantity from below; its step (24) multiplies the per-coordinate variance by ``d`` once more, so the
    printed bound :func:`obs6_lower_bound` exceeds this exact risk when ``d > 185 / (1 - 2^{-S})^2``
    (``H = lambda I``, ``lr = m / (4 lambda)``).

    ``X``: ``[m, d]`` of rank ``d``; ``n_obs`` a number or array. Returns a float array of its shape.
    Raises ``ValueError`` if ``lr <= 0``, ``sigma < 0``, ``local_steps`` is not a positive integer,
    some ``n_obs < 1``, or ``W`` is singular.
    """
    if not lr > 0 or sigma < 0:
        raise ValueError(f"need lr > 0 and sigma >= 0, got lr={lr}, sigma={sigma}")
    if int(local_steps) != local_steps or local_steps < 1:
        raise ValueError(f"local_steps must be a positive integer, got {local_steps}")
    n_obs = np.asarray(n_obs, dtype=np.float64)
    if (n_obs < 1).any():
        raise ValueError("n_obs must be >= 1")
    m, d = X.shape
    lam, U = torch.linalg.eigh(X.T @ X)
    a = 1.0 - 2.0 * lr / m * lam                                   # eigenvalues of A (A, W, Sigma commute)
    w = 1.0 - a ** int(local_steps)
    if float(w.abs().min()) <= 1e-12 * float(w.abs().max()):
        raise ValueError("W is singular (lr = m / lambda_i with an even number of steps): theta_c* is not identifiable")
    var = lr ** 2 * sigma ** 2 / d * sum(a ** (2 * k) for k in range(int(local_steps)))
    return float((var / w ** 2).sum()) / n_obs


def minibatch_gradient_variance(X: torch.Tensor, y: torch.Tensor, theta: torch.Tensor,
                                batch_size: int) -> float:
    """``E ||g_b(theta) - grad L_c(theta)||^2`` for a batch of ``batch_size`` rows drawn without
    replacement (the ``sigma^2`` of Observations 5-6 at ``theta``, for the squared loss).

    Uses the finite-population formula ``(m - b) / (b (m - 1)) * mean_i ||g_i - g||^2``."""
    m = X.shape[0]
    if not 1 <= batch_size <= m:
        raise ValueError(f"batch_size must be in [1, {m}], got {batch_size}")
    g_i = 2.0 * X * (X @ theta - y.to(X.dtype)).unsqueeze(1)       # per-sample gradients [m, d]
    spread = ((g_i - g_i.mean(0)) ** 2).sum(1).mean()
    return float((m - batch_size) / (batch_size * max(m - 1, 1)) * spread)


def minibatch_local_sgd(theta_in: torch.Tensor, X: torch.Tensor, y: torch.Tensor, *, lr: float,
                        batch_size: int, local_epochs: int = 1,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """FedAvg's local update (Xu & Neglia 2021, Algorithm 2) for the least-squares loss, for many
    independent rounds at once: each leading index of ``theta_in`` (``[N, d]``) is one round in
    which the client reshuffles its ``m`` rows every epoch and takes ``ceil(m / b)`` SGD steps on
    ``(1/|batch|) sum ||x^T theta - y||^2`` (the last batch may be smaller). Returns ``[N, d]``.

    Same update as :func:`fedlab.fl.client_update` with :func:`squared_loss`, batched over rounds.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    m, d = X.shape
    if not 1 <= batch_size <= m:
        raise ValueError(f"batch_size must be in [1, {m}], got {batch_size}")
    N = theta_in.shape[0]
    yv = y.to(X.dtype)
    theta = theta_in.clone()
    chunk = max(1, (1 << 22) // (m * d))        # rounds per slice: the gathered batches stay <= 4M entries
    for _ in range(int(local_epochs)):
        keys = torch.rand(N, m, generator=generator)     # one draw for all rounds: chunking changes nothing
        for lo in range(0, N, chunk):
            perm = torch.argsort(keys[lo:lo + chunk], dim=1)
            th = theta[lo:lo + chunk]
            for start in range(0, m, batch_size):
                idx = perm[:, start:start + batch_size]             # [c, b]
                Xb, yb = X[idx], yv[idx]                             # [c, b, d], [c, b]
                r = torch.einsum("nbd,nd->nb", Xb, th) - yb
                th = th - lr * 2.0 / idx.shape[1] * torch.einsum("nbd,nb->nd", Xb, r)
            theta[lo:lo + chunk] = th
    return theta


@dataclass(frozen=True)
class NoiseModel:
    """The stochastic local update of Xu & Neglia (2021), proof of Observation 5 (Eq. 11): ``local_steps``
    gradient steps, each with Gaussian noise of total standard deviation ``sigma`` added to the gradient
    (:func:`noisy_local_gd`); it stands in for mini-batch SGD's noise in Observations 5 and 6.

    ``sigma``
        ``sigma >= 0``, the noise's standard deviation (over all ``d`` coordinates).
    ``local_steps``
        The number of noisy steps per round (``E * ceil(m / b)`` for ``E`` epochs of batch ``b``), a positive
        integer (default 1).

    Raises ``ValueError`` naming the field for a ``sigma`` that is negative or not finite, or ``local_steps``
    that is not a positive integer.
    """

    sigma: float
    local_steps: int = 1

    def __post_init__(self):
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not math.isfinite(self.sigma) \
                or self.sigma < 0:
            raise ValueError(f"NoiseModel.sigma must be a finite number >= 0, got {self.sigma!r}")
        if isinstance(self.local_steps, bool) or int(self.local_steps) != self.local_steps or self.local_steps < 1:
            raise ValueError(f"NoiseModel.local_steps must be a positive integer, got {self.local_steps!r}")


def ols_error_curve(X: torch.Tensor, y: torch.Tensor, n_obs: Sequence[int], *, lr: float,
                    trials: int = 20, spread: float = 1.0, noise: NoiseModel | None = None,
                    batch_size: int | None = None, local_epochs: int = 1, seed: int = 0) -> dict:
    """Squared error ``||hat theta - theta_c*||^2`` of the OLS decoder (Obs. 5, Eq. 14) against the
    number of observed rounds ``n_c``, averaged over ``trials`` independent eavesdroppers.

    Server models are drawn as ``theta_c* + spread * N(0, I)`` (one per round). The client update is
    either the noise model of Obs. 5 (``noise``, a :class:`NoiseModel`: :func:`noisy_local_gd` with its
    ``sigma`` and ``local_steps``) or real mini-batch SGD (``batch_size`` given, ``local_epochs`` epochs:
    :func:`minibatch_local_sgd`).

    Returns ``{"n_obs", "mse" [len(n_obs)], "rate" [len(n_obs)] (Eq. 16 without constant)}``. Raises
    ``ValueError`` unless exactly one of ``noise`` and ``batch_size`` is given, or for an ``n_obs`` below ``d + 1``.
    """
    if (noise is None) == (batch_size is None):
        raise ValueError("give exactly one of noise (Obs. 5 noise model, a NoiseModel) and batch_size (mini-batch SGD)")
    if noise is not None and not isinstance(noise, NoiseModel):
        raise ValueError(f"noise must be a fedlab.attacks.model_reconstruction.NoiseModel, got {type(noise).__name__}")
    sigma, local_steps = (None, 1) if noise is None else (noise.sigma, noise.local_steps)
    d = X.shape[1]
    n_obs = [int(n) for n in n_obs]
    if min(n_obs) < d + 1:
        raise ValueError(f"every n_obs must be >= d + 1 = {d + 1}")
    g = torch.Generator().manual_seed(seed)
    star = local_optimum(X, y)
    n_max = max(n_obs)
    theta_in = star + spread * torch.randn(trials, n_max, d, generator=g, dtype=X.dtype)
    if sigma is not None:
        theta_out = noisy_local_gd(theta_in, X, y, lr=lr, local_steps=local_steps, sigma=sigma, generator=g)
    else:
        theta_out = minibatch_local_sgd(theta_in.reshape(-1, d), X, y, lr=lr, batch_size=batch_size,
                                        local_epochs=local_epochs, generator=g).reshape(trials, n_max, d)
    mse, rate = [], []
    for n in n_obs:
        est = solve_affine(theta_in[:, :n], theta_out[:, :n])
        mse.append(float(((est.theta - star) ** 2).sum(-1).mean()))
        if sigma is not None:
            rate.append(float(obs5_rate(theta_in[:, :n], lr=lr, sigma=sigma, local_steps=local_steps).mean()))
    return {"n_obs": n_obs, "mse": np.array(mse), "rate": np.array(rate)}


# --------------------------------------------------------------------------------------------
# the eavesdropper
# --------------------------------------------------------------------------------------------
class Eavesdropper:
    """A ``callback`` for :func:`fedlab.fl.fedavg` that records, for each target client, the
    server model sent and the client model returned in every round the client took part in
    (the messages ``M^c`` of Xu & Neglia 2021, Sec. 3.2).

    After training, :meth:`observations` returns ``(theta_in [n_c, d], theta_out [n_c, d], rounds)``.
    """

    def __init__(self, targets: Sequence[int] | None = None):
        self.targets = None if targets is None else set(int(t) for t in targets)
        self._log: dict[int, list] = {}

    def __call__(self, rec: fl.RoundRecord) -> None:
        theta = flatten_params(rec.global_params).detach().clone()
        for j, c in enumerate(rec.selected.tolist()):
            if self.targets is not None and c not in self.targets:
                continue
            out = flatten_params({k: v[j] for k, v in rec.client_params.items()}).detach().clone()
            self._log.setdefault(c, []).append((rec.round, theta, out))

    def num_observations(self, client: int) -> int:
        return len(self._log.get(int(client), []))

    def observations(self, client: int, max_obs: int | None = None):
        log = self._log.get(int(client), [])
        if not log:
            raise ValueError(f"client {client} was never observed")
        log = log[:max_obs] if max_obs is not None else log
        return (torch.stack([t for _, t, _ in log]), torch.stack([o for _, _, o in log]),
                np.array([r for r, _, _ in log]))


def run_eavesdropped_fedavg(model: nn.Module, clients, *, targets=None, **fedavg_kwargs):
    """Run :func:`fedlab.fl.fedavg` honestly with an :class:`Eavesdropper` on ``targets`` (all clients
    by default). Returns ``(FLResult, Eavesdropper)``.

    For the one-output linear models of this module (:func:`linear_model` with :func:`squared_loss` or
    :func:`logistic_loss`, at least two clients per round, on the CPU, no evaluation data) the rounds run
    through :func:`_linear_fedavg`, which computes the same numbers bit for bit without ``vmap``'s
    per-step overhead (``tests/test_model_reconstruction.py`` compares the two)."""
    spy = Eavesdropper(targets)
    if _linear_fast_path_applies(model, clients, fedavg_kwargs):
        res = _linear_fedavg(model, clients, callback=spy, **fedavg_kwargs)
    else:
        res = fl.fedavg(model, clients, callback=spy, **fedavg_kwargs)   # the clients' training: local=fl.LocalTraining
    return res, spy


# --------------------------------------------------------------------------------------------
# FedAvg for one-output linear models, without vmap (the same numbers as fl.fedavg)
# --------------------------------------------------------------------------------------------
_FAST_KWARGS = {"num_rounds", "client_fraction", "local", "params", "seed"}


def _linear_fast_path_applies(model, clients, kwargs) -> bool:
    """Whether :func:`_linear_fedavg` reproduces ``fl.fedavg(model, clients, **kwargs)``: an exact
    ``nn.Linear`` with one output, the squared or logistic loss, only the keywords it implements
    (no evaluation data, no device other than the CPU), every tensor on the CPU and at least two clients per
    round (a single client runs outside ``vmap`` in :func:`fedlab.fl.clients_update`, with other kernels)."""
    from ..config import device as _device

    local = kwargs.get("local", fl.LocalTraining())
    if (not set(kwargs) <= _FAST_KWARGS | {"device"} or not isinstance(local, fl.LocalTraining)
            or not linear_fast_path(model, local.loss_fn)):
        return False
    try:
        if _device(kwargs.get("device")).type != "cpu":
            return False
        K = clients.num_clients if isinstance(clients, fl.ClientData) else len(clients)
        C = float(kwargs.get("client_fraction", 1.0))
    except (TypeError, ValueError):
        return False                         # let fl.fedavg raise its own error
    if not 0.0 < C <= 1.0 or max(int(round(C * K)), 1) < 2:
        return False
    tensors = list(model.parameters()) + list((kwargs.get("params") or {}).values())
    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors)


def _linear_fedavg(model: nn.Module, clients, *, num_rounds: int, local: fl.LocalTraining = fl.LocalTraining(),
                   client_fraction: float = 1.0, params: dict | None = None, seed: int = 0, callback=None,
                   device=None) -> fl.FLResult:
    """:func:`fedlab.fl.fedavg` for ``nn.Linear(d, 1)`` with :func:`squared_loss` or :func:`logistic_loss`
    and at least two clients per round (see :func:`_linear_fast_path_applies`): the same client
    sampling, batch plans, checks, callback records and aggregation, and the same numbers bit for bit,
    with the clients' SGD steps computed by :func:`fedlab.fl._linear.dense_clients_update` instead of
    ``vmap(grad(...))``."""
    from .._checks import finite_tensor

    if not 0.0 < client_fraction <= 1.0:
        raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
    data = clients if isinstance(clients, fl.ClientData) else fl.stack_clients(clients)
    finite_tensor("clients' X", data.X, " (one NaN makes every parameter NaN after the first round)")
    K = data.num_clients
    m = max(int(round(client_fraction * K)), 1)
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    finite_tensor("params", w)

    def step(t, w):
        selected = torch.randperm(K, generator=gen, device="cpu")[:m].sort().values
        sub = data.select(selected)
        p = dense_clients_update(model, w, sub, local=local, generator=gen)
        weights = sub.n.float()
        if callback is not None:
            callback(fl.RoundRecord(t, w, selected.numpy(), p, weights))
        new = fl.weighted_average(p, weights)
        finite_tensor(f"the global parameters after round {t}", new,
                      f" (training diverged: lower lr, got {local.lr})")
        return new

    w, history, _ = fl.run_rounds(num_rounds, step, w, history=fl.History("accuracy", "loss"), progress=False)
    return fl.FLResult(w, history)


# --------------------------------------------------------------------------------------------
# Algorithm 3: learn the update map, then find its zero
# --------------------------------------------------------------------------------------------
class MappingNet(nn.Module):
    """``P`` independent mappings ``G^c : R^d -> R^d`` with one hidden ReLU layer (Xu & Neglia 2021,
    Sec. 4: 1000 units), evaluated in one batched matrix product. Input ``[P, n, d]`` -> ``[P, n, d]``.

    Inputs and outputs are rescaled per attack (centre of the observed server models, one scalar
    scale for models and one for updates), an invertible change of variables that leaves the
    minimisers of Eqs. (9)-(10) unchanged.
    """

    def __init__(self, num_problems: int, d: int, hidden: int = 1000, *, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        b1, b2 = 1.0 / math.sqrt(d), 1.0 / math.sqrt(hidden)   # nn.Linear's default init
        u = lambda *s, b: (torch.rand(*s, generator=g) * 2 - 1) * b  # noqa: E731
        self.W1 = nn.Parameter(u(num_problems, d, hidden, b=b1))
        self.b1 = nn.Parameter(u(num_problems, 1, hidden, b=b1))
        self.W2 = nn.Parameter(u(num_problems, hidden, d, b=b2))
        self.b2 = nn.Parameter(u(num_problems, 1, d, b=b2))
        self.register_buffer("centre", torch.zeros(num_problems, 1, d))
        self.register_buffer("in_scale", torch.ones(num_problems, 1, 1))
        self.register_buffer("out_scale", torch.ones(num_problems, 1, 1))

    def normalised(self, z: torch.Tensor) -> torch.Tensor:
        return torch.relu(z @ self.W1 + self.b1) @ self.W2 + self.b2

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        z = (theta.to(self.W1.dtype) - self.centre) / self.in_scale
        return self.normalised(z) * self.out_scale


def _batched(theta_in, theta_out):
    if theta_in.shape != theta_out.shape or theta_in.ndim not in (2, 3):
        raise ValueError(f"theta_in and theta_out must both be [n, d] or [P, n, d], got "
                         f"{tuple(theta_in.shape)} and {tuple(theta_out.shape)}")
    single = theta_in.ndim == 2
    if single:
        theta_in, theta_out = theta_in[None], theta_out[None]
    if theta_in.shape[1] < 2:
        raise ValueError("need at least 2 observations per client")
    return theta_in, theta_out, single


def fit_mapping(theta_in: torch.Tensor, theta_out: torch.Tensor, *, hidden: int = 1000,
                max_iter: int = 1000, lr: float = 1e-3, seed: int = 0):
    """Step 3 of Algorithm 3 (Xu & Neglia 2021, Eq. 9): fit ``G(theta) ~ theta - theta_c`` on the
    eavesdropped pairs by full-batch Adam.

    ``theta_in``, ``theta_out``: ``[n, d]`` or ``[P, n, d]`` (``P`` independent attacks trained at once).
    Returns ``(G, loss_curve)``: a :class:`MappingNet` and the relative mapping loss per step,
    ``sum ||G(theta) - Delta||^2 / sum ||Delta||^2`` (``[max_iter, P]``).
    """
    ti, to, _ = _batched(theta_in, theta_out)
    ti, to = ti.float(), to.float()
    P, n, d = ti.shape
    delta = ti - to
    G = MappingNet(P, d, hidden, seed=seed)
    centre = ti.mean(1, keepdim=True)
    G.centre.copy_(centre)
    G.in_scale.copy_((ti - centre).pow(2).sum(-1).mean(1, keepdim=True).sqrt().clamp_min(1e-12)[..., None])
    G.out_scale.copy_(delta.pow(2).sum(-1).mean(1, keepdim=True).sqrt().clamp_min(1e-12)[..., None])
    z_in = (ti - G.centre) / G.in_scale
    z_out = delta / G.out_scale
    var = z_out.pow(2).sum((1, 2)).clamp_min(1e-12)
    params = [G.W1, G.b1, G.W2, G.b2]
    adam = _Adam(params, lr)
    curve = torch.empty(max_iter, P)
    z_in_t = z_in.transpose(1, 2)
    with torch.no_grad():                 # the gradient of per.sum() written out: see _mapping_grads
        for s in range(max_iter):
            per, grads = _mapping_grads(G, z_in, z_in_t, z_out)
            adam.step(params, grads)
            curve[s] = (per / var)
    return G, curve


class _Adam:
    """``torch.optim.Adam(params, lr)`` with its defaults (betas 0.9, 0.999, eps 1e-8, no weight decay,
    ``foreach=False``) taking the gradients as arguments: the same in-place operations as its
    single-tensor step, so the same numbers bit for bit, without the optimiser's per-call bookkeeping
    (``tests/test_model_reconstruction.py`` compares the two)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, (self.beta1, self.beta2), self.eps, self.t = lr, betas, eps, 0
        self.m = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.v = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]

    @torch.no_grad()
    def step(self, params, grads) -> None:
        self.t += 1
        step = float(self.t)
        bias_correction1 = 1 - self.beta1 ** step
        bias_correction2 = 1 - self.beta2 ** step
        step_size = self.lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m.lerp_(g, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(m, denom, value=-step_size)


def _mapping_grads(G, z_in, z_in_t, z_out):
    """``per = ||G.normalised(z_in) - z_out||^2`` per attack ``[P]`` and the gradients of ``per.sum()``
    with respect to ``W1, b1, W2, b2``, by the operations autograd runs for it (``bmm`` with the same
    transposed operands, ``threshold_backward`` for the ReLU, bias gradients summed over the rows)."""
    h = torch.relu(torch.bmm(z_in, G.W1) + G.b1)
    diff = torch.bmm(h, G.W2) + G.b2 - z_out
    per = diff.pow(2).sum((1, 2))
    g = diff.pow(1) * 2                                   # PowBackward: grad * (2 * diff^1), grad = 1
    g_W2 = torch.bmm(h.transpose(1, 2), g)
    g_h = torch.ops.aten.threshold_backward(torch.bmm(g, G.W2.transpose(1, 2)), h, 0)
    return per, [torch.bmm(z_in_t, g_h), g_h.sum(1, keepdim=True), g_W2, g.sum(1, keepdim=True)]


def minimise_mapping(G: MappingNet, init: torch.Tensor, *, max_iter: int = 1000,
                     lr: float = 1e-2) -> torch.Tensor:
    """Step 4 of Algorithm 3 (Eq. 10): ``argmin_theta ||G(theta)||^2`` by Adam from ``init``
    (``[P, d]``), in the normalised coordinates of ``G``. Returns ``[P, d]`` (float64)."""
    for p in G.parameters():
        p.requires_grad_(False)
    z = ((init.float()[:, None, :] - G.centre) / G.in_scale).clone()
    adam = _Adam([z], lr)
    W1_t, W2_t = G.W1.transpose(1, 2), G.W2.transpose(1, 2)
    with torch.no_grad():      # the gradient of ||G(z)||^2 in z, by the operations autograd runs for it
        for _ in range(max_iter):
            h = torch.relu(torch.bmm(z, G.W1) + G.b1)
            g = (torch.bmm(h, G.W2) + G.b2).pow(1) * 2
            g_h = torch.ops.aten.threshold_backward(torch.bmm(g, W2_t), h, 0)
            adam.step([z], [torch.bmm(g_h, W1_t)])
    return (z * G.in_scale + G.centre)[:, 0, :].double()


@dataclass(frozen=True)
class HeuristicSettings:
    """Algorithm 3's network and budgets (Xu & Neglia 2021, Sec. 4: a mapping ``G`` with one hidden ReLU
    layer of 1000 units, fitted with Adam, then the decoder's Adam steps), as the chapter's experiments pass
    them to :func:`reconstruct_heuristic`.

    ``hidden``
        The hidden units of :class:`MappingNet` (the paper's 1000).
    ``fit_max_iter``
        Adam steps fitting ``G`` to the observed updates.
    ``decode_max_iter``
        Adam steps decoding ``hat theta`` (the root of ``G``).

    Raises ``ValueError`` naming the field for a value that is not a positive integer.
    """

    hidden: int = 1000
    fit_max_iter: int = 1000
    decode_max_iter: int = 1000

    def __post_init__(self):
        for key in ("hidden", "fit_max_iter", "decode_max_iter"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"HeuristicSettings.{key} must be a positive integer, got {value!r}")


@dataclass
class HeuristicResult:
    """Output of :func:`reconstruct_heuristic`: decoded models ``theta`` ``[P, d]`` (or ``[d]``),
    final relative mapping loss ``mapping_loss`` ``[P]``, the loss curve ``[steps, P]`` and the
    *remaining update size* ``residual`` ``[P]``: ``||G(hat theta)|| / sqrt(mean ||Delta theta||^2)``, the
    fitted map's value at the decoded model relative to the typical observed update (0 when the decoder
    found a zero of ``G``; ``None`` when the result was built without it)."""

    theta: torch.Tensor
    mapping_loss: torch.Tensor
    loss_curve: torch.Tensor = field(repr=False)
    residual: torch.Tensor | None = None


def reconstruct_heuristic(theta_in: torch.Tensor, theta_out: torch.Tensor, *, hidden: int = 1000,
                          fit_max_iter: int = 1000, fit_lr: float = 1e-3, decode_max_iter: int = 1000,
                          decode_lr: float = 1e-2, init: torch.Tensor | None = None,
                          seed: int = 0) -> HeuristicResult:
    """Algorithm 3 of Xu & Neglia (2021): local model reconstruction for any model and local rule.

    * steps 1-3: from the eavesdropped pairs ``Delta M^c = {(theta, theta - theta_c)}``, fit the mapping
      ``G^c`` (:func:`fit_mapping`, Eq. 9);
    * step 4: ``hat theta_c* = argmin ||G^c(theta)||^2`` (:func:`minimise_mapping`, Eq. 10), started from
      ``init`` (default: the last model the client returned).

    ``theta_in``, ``theta_out``: ``[n, d]`` or ``[P, n, d]``. Raises ``ValueError`` on bad shapes.
    """
    ti, to, single = _batched(theta_in, theta_out)
    G, curve = fit_mapping(ti, to, hidden=hidden, max_iter=fit_max_iter, lr=fit_lr, seed=seed)
    start = to[:, -1, :] if init is None else (init[None] if single else init)
    theta = minimise_mapping(G, start, max_iter=decode_max_iter, lr=decode_lr)
    with torch.no_grad():                       # ||G(theta)|| in units of the RMS observed update norm
        residual = G.normalised((theta.float()[:, None, :] - G.centre) / G.in_scale)[:, 0, :].norm(dim=-1).double()
    res = HeuristicResult(theta, curve[-1], curve, residual)
    if single:
        res = HeuristicResult(theta[0], curve[-1, 0], curve[:, 0], residual[0])
    return res


# --------------------------------------------------------------------------------------------
# Sec. 4 experiments
# --------------------------------------------------------------------------------------------
def relative_distances(thetas: torch.Tensor) -> torch.Tensor:
    """Relative Euclidean distances ``||theta_i - theta_j|| / ||theta_i||`` between models
    (``[K, d]`` -> ``[K, K]``), as in Xu & Neglia (2021), Figure 1a."""
    diff = (thetas[:, None, :] - thetas[None, :, :]).norm(dim=-1)
    return diff / thetas.norm(dim=-1, keepdim=True).clamp_min(1e-12)


# --------------------------------------------------------------------------------------------
# Sec. 4 diagnostics: is the local optimum defined, and how much do the observed models vary?
# --------------------------------------------------------------------------------------------
def logistic_local_optimum(X: torch.Tensor, y: torch.Tensor, *, weight_decay: float,
                           max_iter: int = 100, tol: float = 1e-10) -> torch.Tensor:
    """The local optimum ``theta_c* = argmin mean BCE(x^T w + b, y) + lambda/2 ||(w, b)||^2`` of binary
    logistic regression with ``weight_decay`` lambda > 0: the target of Algorithm 3 of Xu & Neglia
    (2021, Sec. 3.2) when the clients of :func:`fedlab.fl.fedavg` train with the same ``weight_decay``.
    Without it a linearly separable client (:func:`linearly_separable`) has no minimiser at all: the
    loss keeps falling as ``||theta||`` grows.

    Damped Newton in float64 (backtracking on the objective), to gradient norm ``tol`` or a Newton
    decrement ``g^T H^{-1} g`` below ``1e-16`` (a suboptimality float64 cannot resolve in the objective;
    large clients stall there just above ``tol``). ``X``
    ``[m, d_x]``, ``y`` ``[m]`` in {0, 1}. Returns ``[d_x + 1]`` (weights, then the bias, the order of
    :func:`fedlab.models.linear_model` flattened). Raises ``ValueError`` for ``weight_decay <= 0``, bad
    shapes, labels outside {0, 1}, non-finite inputs or no convergence in ``max_iter`` steps."""
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay > 0):
        raise ValueError(f"weight_decay must be a finite number > 0 (a separable client has no optimum "
                         f"without it), got {weight_decay!r}")
    X, y = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] == 0:
        raise ValueError(f"X must be [m, d_x] and y [m] with m >= 1, got {tuple(X.shape)} and {tuple(y.shape)}")
    if not (torch.isfinite(X).all() and ((y == 0) | (y == 1)).all()):
        raise ValueError("X must be finite and y must hold labels 0 and 1")
    X1 = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
    eye = torch.eye(X1.shape[1], dtype=torch.float64)

    def objective(t):
        return float(nn.functional.binary_cross_entropy_with_logits(X1 @ t, y) + weight_decay / 2 * t @ t)

    theta = torch.zeros(X1.shape[1], dtype=torch.float64)
    for _ in range(max_iter):
        p = torch.sigmoid(X1 @ theta)
        g = X1.T @ (p - y) / len(y) + weight_decay * theta
        if float(g.norm()) <= tol:
            return theta
        H = (X1.T * (p * (1 - p))) @ X1 / len(y) + weight_decay * eye
        step, a, f0 = torch.linalg.solve(H, g), 1.0, objective(theta)
        decrement = float(g @ step)          # Newton decrement squared: twice the remaining suboptimality
        if decrement <= 1e-16:               # below what float64 resolves in the objective: done
            return theta
        while objective(theta - a * step) > f0 - 1e-4 * a * decrement and a > 1e-12:
            a /= 2
        theta = theta - a * step
    raise ValueError(f"Newton's method did not reach gradient norm {tol} in {max_iter} steps")


def linearly_separable(X: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether some affine classifier ``x^T w + b`` puts every record of ``(X [m, d_x], y [m])`` strictly
    on the side of its label (an exact linear-programming feasibility check, ``y_i (x_i^T w + b) >= 1``
    with signs ``+-1``). A client for which this holds has no unregularised logistic local optimum
    (Xu & Neglia 2021, Sec. 4, Table 1's target). One-class data count as separable. Raises
    ``ValueError`` for bad shapes, non-finite ``X`` or labels outside {0, 1}."""
    from scipy.optimize import linprog

    X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] == 0:
        raise ValueError(f"X must be [m, d_x] and y [m] with m >= 1, got {X.shape} and {y.shape}")
    if not (np.isfinite(X).all() and np.isin(y, (0, 1)).all()):
        raise ValueError("X must be finite and y must hold labels 0 and 1")
    s = 2.0 * y - 1.0
    A = -s[:, None] * np.concatenate([X, np.ones((len(X), 1))], 1)
    res = linprog(np.zeros(X.shape[1] + 1), A_ub=A, b_ub=-np.ones(len(X)), bounds=(None, None), method="highs")
    return bool(res.status == 0)


def trajectory_flatness(theta_in: torch.Tensor) -> torch.Tensor:
    """The share of the spread of the observed server models that lies along their first principal
    direction, ``s_1^2 / sum_i s_i^2`` for the singular values ``s`` of the centred ``theta_in``
    (``[n, d]`` -> scalar, or ``[P, n, d]`` -> ``[P]``). Near 1 the models lie on a line, so the update
    map is observed along one direction only and Algorithm 3 (Xu & Neglia 2021, Sec. 3.2) must
    extrapolate in the other ``d - 1``. Raises ``ValueError`` for fewer than 2 observations, bad shapes
    or non-finite values."""
    t = torch.as_tensor(theta_in, dtype=torch.float64)
    if t.ndim not in (2, 3) or t.shape[-2] < 2:
        raise ValueError(f"theta_in must be [n, d] or [P, n, d] with n >= 2, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError("theta_in must be finite")
    s = torch.linalg.svdvals(t - t.mean(-2, keepdim=True))
    return s[..., 0] ** 2 / (s ** 2).sum(-1).clamp_min(1e-300)


__all__ += ["logistic_local_optimum", "linearly_separable", "trajectory_flatness", "NoiseModel", "HeuristicSettings"]


def heldout_mapping_loss(theta_in: torch.Tensor, theta_out: torch.Tensor, *, holdout: float = 0.2,
                         hidden: int = 1000, max_iter: int = 1000, lr: float = 1e-3, seed: int = 0) -> torch.Tensor:
    """Does Algorithm 3's mapping ``G^c`` (Xu & Neglia 2021, Eq. 9) generalise, or only interpolate the
    observed pairs? Fits :func:`fit_mapping` on a random ``1 - holdout`` share of the observations
    (the same rounds for every attack, drawn with ``seed``) and returns the relative mapping loss
    ``sum ||G(theta) - Delta||^2 / sum ||Delta||^2`` on the held-out rounds, ``[P]`` (or a scalar for
    ``[n, d]`` input). A value near the in-sample loss means ``G`` predicts updates it never saw; a value
    near 1 or above means it does not. Raises ``ValueError`` for ``holdout`` outside (0, 1) or fewer
    than 2 observations on either side."""
    ti, to, single = _batched(theta_in, theta_out)
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    n = ti.shape[1]
    k = int(round(holdout * n))
    if k < 2 or n - k < 2:
        raise ValueError(f"holdout={holdout} of {n} observations leaves fewer than 2 on one side")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test, train = perm[:k], perm[k:]
    G, _ = fit_mapping(ti[:, train], to[:, train], hidden=hidden, max_iter=max_iter, lr=lr, seed=seed)
    with torch.no_grad():
        delta = (ti[:, test] - to[:, test]).float()
        loss = (G(ti[:, test].float()) - delta).pow(2).sum((1, 2)) / delta.pow(2).sum((1, 2)).clamp_min(1e-30)
    return loss[0] if single else loss


def logistic_positive_control(X: torch.Tensor, y: torch.Tensor, *, num_obs: int = 100, spread: float = 1.0,
                              local_steps: int = 5, lr: float = 0.5, weight_decay: float = 0.01,
                              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A transcript on which Algorithm 3 (Xu & Neglia 2021, Sec. 3.2) *should* work: ``num_obs`` server
    models drawn around the client's regularised local optimum ``theta_c*``
    (:func:`logistic_local_optimum`) as ``theta_c* + spread * ||theta_c*|| / sqrt(d) * N(0, I)``, each
    answered by ``local_steps`` full-batch gradient steps of size ``lr`` on the client's regularised
    logistic loss. The observations surround the optimum in every direction, the opposite of a FedAvg
    trajectory, so a decoder that fails here is broken. Returns ``(theta_in [n, d], theta_out [n, d],
    theta_c* [d])`` in float64. Raises ``ValueError`` for ``num_obs < 2`` or non-positive ``spread``,
    ``local_steps`` or ``lr``."""
    if num_obs < 2 or not spread > 0 or local_steps < 1 or not lr > 0:
        raise ValueError(f"need num_obs >= 2 and positive spread, local_steps, lr; got {num_obs}, {spread}, "
                         f"{local_steps}, {lr}")
    star = logistic_local_optimum(X, y, weight_decay=weight_decay)
    X1 = torch.cat([torch.as_tensor(X, dtype=torch.float64), torch.ones(len(X), 1, dtype=torch.float64)], 1)
    yv = torch.as_tensor(y, dtype=torch.float64)
    d = X1.shape[1]
    g = torch.Generator().manual_seed(seed)
    theta_in = star + spread * star.norm() / math.sqrt(d) * torch.randn(num_obs, d, generator=g, dtype=torch.float64)
    theta = theta_in.clone()
    for _ in range(int(local_steps)):
        grad = (torch.sigmoid(theta @ X1.T) - yv) @ X1 / len(yv) + weight_decay * theta
        theta = theta - lr * grad
    return theta_in, theta, star


__all__ += ["heldout_mapping_loss", "logistic_positive_control"]
