"""PAC identifiability of a client's private user vector (London 2020, "PAC Identifiability in
Federated Personalization", NeurIPS SpicyFL workshop).

The server of a federated recommender (:mod:`fedlab.fl.recsys.ratings`) sends a *fake* global model in
which every item vector is zero. By Eq. (2) of the paper each returned item delta is then
``-lr * l'(0) * y_{c,i} * u_c``: a multiple of the private vector ``u_c``. Summing the deltas of ``T``
interactions and dividing by ``lr * l'(0) * T * B`` (Protocol 2) gives ``u_c`` times the negated mean of
the labels used, which is positive when most of the user's labels are negative (Assumption 1).

This module holds the attack (Protocols 2 and 3), the estimator and sign rule, the error metric of
Definition 1, the sample-size bounds of Theorems 1-3, ``tau_c(eps)``, the check of Proposition 1 and a
client-side defense that refuses all-zero item vectors. Everything is batched over users/trials.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from fedlab._checks import finite_positive, finite_tensor
from fedlab.fl.recsys.ratings import (COUNTEREXAMPLE_LOSSES, DTYPE, LOSSES, protocol1_client_update,
                                      protocol3_client_update, loss_derivative_at_zero,
                                      noisy_message, touched_items)

__all__ = ["Client", "Server", "PACAttackResult", "protocol2_attack", "protocol3_attack", "estimate_user_vectors", "sign_rule",
           "sign_error", "tau_c", "max_item_norm", "theorem1_num_interactions", "theorem1_failure_bound",
           "theorem1_exact_failure", "likes_pmf", "label_mean_tail", "theorem2_num_interactions",
           "theorem2_optimal_beta", "theorem3_num_interactions", "AttackLaw",
           "proposition1_check", "detect_zero_probe", "guarded_client_update",
           "attack_error_curve", "clipped_sigma", "secure_aggregate_items", "exposed_members", "leaked_labels"]


# ----------------------------------------------------------------------------------------------
# argument checks
def _check_pref_rate(pref_rate) -> np.ndarray:
    p = np.asarray(pref_rate, dtype=float)
    if not np.all((p > 0) & (p < 0.5)):
        raise ValueError(f"pref_rate must lie in (0, 1/2) (London 2020, Assumption 1), got {pref_rate}")
    return p


def _mirror_pref_rate(pref_rate) -> np.ndarray:
    """``min(p_c, 1 - p_c)`` for the bounds. A client with ``p_c > 1/2`` (more likes than dislikes)
    is the mirror image of one with ``1 - p_c`` under ``y -> -y``: the attack is the same with the
    sign rule leaning the other way (:func:`sign_rule` with ``leaning="positive"``), and every bound
    depends on ``p_c`` through that symmetric distance from 1/2. Raises ``ValueError`` for ``p_c``
    outside (0, 1) or equal to 1/2, where no sign rule can work."""
    p = np.asarray(pref_rate, dtype=float)
    if not np.all((p > 0) & (p < 1) & (p != 0.5)):
        raise ValueError(f"pref_rate must lie in (0, 1) and differ from 1/2 (London 2020, Assumption 1; "
                         f"p_c > 1/2 is the mirror image of 1 - p_c), got {pref_rate}")
    return np.minimum(p, 1 - p)


def _check_open_unit(name, value):
    if not 0 < value < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {value}")


def _check_positive(name, value):
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _check_count(name, value, low: int = 1):
    """``value`` is a whole number ``>= low`` (not a bool); raises ``ValueError`` naming ``name``."""
    v = np.asarray(value)
    if v.dtype == bool or not np.all(np.isfinite(v.astype(float))) or not np.all(v == np.round(v)) \
            or not np.all(v >= low):
        raise ValueError(f"{name} must be a whole number >= {low}, got {value}")


# ----------------------------------------------------------------------------------------------
# settings of the attack

@dataclass(frozen=True, eq=False)
class Client:
    """What a client of London 2020 does with the global model it receives: CLIENTUPDATE of Protocol 1
    (Sec. 4.1) and the noise of Eq. (3) on the message it sends back.

    Fields: ``batch_size`` (``B``, the ratings per local step; for Protocol 3 it must divide ``N``),
    ``lr`` (the step ``alpha``), ``loss`` (``"log"``, ``"hinge"``, ... of Assumption 2), ``local_steps``
    (``R``, 1 in Protocol 2), ``sigma`` (Eq. (3)'s noise std, a float or a ``[C]`` tensor: one level per
    client) and ``clip_norm`` (each item's delta clipped to this L2 norm before the noise, the paper's
    footnote 5; ``None``: no clipping). Defaults: the paper's noise-free ``R = 1`` client with the
    logistic loss. Compares by identity (``sigma`` may be a tensor).

    Raises ``ValueError`` naming the field: ``batch_size`` not an integer >= 1, ``lr`` not a finite
    number > 0, ``loss`` not a loss of :mod:`fedlab.fl.recsys.ratings`, ``local_steps`` not an integer
    >= 1, ``sigma`` (every entry of a tensor) not finite and >= 0, ``clip_norm`` not ``None`` or a
    finite number > 0.
    """

    batch_size: int
    lr: float
    loss: str = "log"
    local_steps: int = 1
    sigma: float | torch.Tensor = 0.0
    clip_norm: float | None = None

    def __post_init__(self):
        if not isinstance(self.batch_size, (int, np.integer)) or isinstance(self.batch_size, bool) \
                or self.batch_size < 1:
            raise ValueError(f"Client.batch_size must be an integer >= 1, got {self.batch_size!r}")
        finite_positive("Client.lr", self.lr)
        if not isinstance(self.loss, str) or self.loss not in LOSSES + COUNTEREXAMPLE_LOSSES:
            raise ValueError(f"Client.loss must be one of {LOSSES + COUNTEREXAMPLE_LOSSES}, got {self.loss!r}")
        if not isinstance(self.local_steps, (int, np.integer)) or isinstance(self.local_steps, bool) \
                or self.local_steps < 1:
            raise ValueError(f"Client.local_steps must be an integer >= 1, got {self.local_steps!r}")
        try:
            sigma = None if isinstance(self.sigma, (bool, str, bytes)) else torch.as_tensor(self.sigma)
        except (TypeError, ValueError, RuntimeError):
            sigma = None
        if sigma is None or sigma.dtype == torch.bool or sigma.is_complex() \
                or not bool((sigma.isfinite() & (sigma >= 0)).all()):
            raise ValueError(f"Client.sigma must be finite and >= 0 (a number or a tensor, every entry), "
                             f"got {self.sigma!r}")
        if self.clip_norm is not None:
            finite_positive("Client.clip_norm", self.clip_norm)


@dataclass(frozen=True, eq=False)
class Server:
    """What the server of London 2020's Protocol 2 (Sec. 4.1) sends, sees and assumes.

    Fields: ``probe`` (the fake global model ``[num_items, k]`` sent at every interaction; ``None``: all
    zero, the paper's probe), ``restore_items`` (the real item vectors pushed back with ``R = 0`` after
    the attack; ``None``: none), ``cohort_size`` (``m``: the server sees only the sum of the messages of
    consecutive groups of ``m`` clients, secure aggregation; 1 in the paper) and ``leaning`` (what the
    server assumes of the user for :func:`sign_rule`: ``"negative"``, Assumption 1, or ``"positive"``).
    Compares by identity (the probes are tensors).

    Raises ``ValueError`` naming the field: ``Server.cohort_size`` not an integer >= 1, an unknown
    ``leaning``, a ``probe`` or ``restore_items`` that is not a tensor or holds NaN or infinite entries.
    """

    probe: torch.Tensor | None = None
    restore_items: torch.Tensor | None = None
    cohort_size: int = 1
    leaning: str = "negative"

    def __post_init__(self):
        if not isinstance(self.cohort_size, (int, np.integer)) or isinstance(self.cohort_size, bool) \
                or self.cohort_size < 1:
            raise ValueError(f"Server.cohort_size must be an integer >= 1, got {self.cohort_size!r}")
        for name in ("probe", "restore_items"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"Server.{name} must be a tensor or None, got {type(value).__name__}")
            finite_tensor(f"Server.{name}", value)
        if not isinstance(self.leaning, str) or self.leaning not in ("negative", "positive"):
            raise ValueError(f"Server.leaning must be 'negative' or 'positive', got {self.leaning!r}")


# ----------------------------------------------------------------------------------------------
# the attack
@dataclass
class PACAttackResult:
    """Output of :func:`protocol2_attack` / :func:`protocol3_attack`.

    Attributes
    ----------
    num_interactions : the ``T`` values at which the estimate was recorded, length ``J``.
    estimates : ``[J, G, k]`` sign-corrected estimates ``u_hat`` after each recorded ``T`` (``G`` users,
        or cohorts when ``cohort_size > 1``).
    user_vectors : ``[C, k]`` the clients' local models after the attack (and the restore step).
    touched : ``[C]`` mean number of items per interaction whose message was non-zero.
    """

    num_interactions: list
    estimates: torch.Tensor
    user_vectors: torch.Tensor
    touched: torch.Tensor

    @property
    def final(self) -> torch.Tensor:
        """``[G, k]`` the estimate after the last interaction."""
        return self.estimates[-1]


def _lprime0(loss: str) -> float:
    """``l'(0)`` of ``loss``; raises ``ValueError`` naming ``loss`` when it is 0 (Assumption 2 fails:
    under the zero probe every message is exactly zero and there is nothing to estimate or bound)."""
    g = loss_derivative_at_zero(loss)
    if g == 0:
        raise ValueError(f"loss {loss!r} has l'(0) = 0, which breaks Assumption 2 of London 2020: the "
                         "zero-probe messages are all zero")
    return g


def estimate_user_vectors(sum_deltas: torch.Tensor, *, lr: float, loss: str, num_interactions: int,
                          batch_size: float | torch.Tensor) -> torch.Tensor:
    """Protocol 2, line 4: ``u_hat = (lr * l'(0) * T * B)^{-1} * sum_t sum_i Delta v_i^(t)``.

    ``sum_deltas`` is ``[C, k]`` (the deltas already summed over items and interactions). For
    Protocol 3 pass the number of touched items ``N`` as ``batch_size`` (a float or a ``[C]`` tensor).
    """
    scale = lr * _lprime0(loss) * num_interactions
    b = torch.as_tensor(batch_size, dtype=DTYPE)
    if b.ndim == 1:
        b = b[:, None]
    return sum_deltas / (scale * b)


def sign_rule(u_hat: torch.Tensor, leaning: str = "negative") -> torch.Tensor:
    """Fix the sign of ``u_hat`` (London 2020, Sec. 4.1).

    The raw estimate is ``u_c * (-mean of the labels used)``. If the user is known to dislike most of
    their items (``leaning="negative"``, Assumption 1) the multiplier is positive with high probability
    and ``u_hat`` is kept; if the user leans positive (``p_c > 1/2``) it is flipped.
    """
    if leaning == "negative":
        return u_hat
    if leaning == "positive":
        return -u_hat
    raise ValueError(f"leaning must be 'negative' or 'positive', got {leaning!r}")


def _run_attack(step: Callable, user_vectors, *, num_interactions, sigma, record_at, cohort_size,
                generator, restore: Callable | None, clip_norm: float | None = None):
    if int(num_interactions) < 1:
        raise ValueError(f"num_interactions must be >= 1, got {num_interactions}")
    if not bool((torch.as_tensor(sigma) >= 0).all()):
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    C, k = user_vectors.shape
    if cohort_size < 1 or C % cohort_size:
        raise ValueError(f"cohort_size must divide the number of users {C}, got {cohort_size}")
    T = int(num_interactions)
    record = sorted({int(t) for t in (record_at if record_at is not None else [T])})
    if record[0] < 1 or record[-1] > T:
        raise ValueError(f"record_at must lie in [1, num_interactions={T}], got {record_at}")
    u = user_vectors.to(DTYPE)
    total = torch.zeros(C, k, dtype=DTYPE)
    touched = torch.zeros(C, dtype=DTYPE)
    sums, want = [], set(record)
    for t in range(1, T + 1):
        u, deltas = step(u)
        message = noisy_message(deltas, sigma, clip_norm=clip_norm, generator=generator)   # client, Eq. (3)
        total += message.sum(dim=1)
        touched += touched_items(message).sum(dim=1)
        if t in want:
            sums.append(total.view(C // cohort_size, cohort_size, k).sum(1).clone())  # secure aggregation
    if restore is not None:
        u = restore(u)
    return record, torch.stack(sums), u, touched / T


def protocol2_attack(user_vectors: torch.Tensor, items: torch.Tensor, y: torch.Tensor, *,
                     num_interactions: int, client: Client, server: Server = Server(), num_items: int | None = None,
                     record_at: Sequence[int] | None = None, update: Callable = protocol1_client_update,
                     generator: torch.Generator | None = None) -> PACAttackResult:
    """Protocol 2 of London 2020 (Sec. 4.1), the attack behind Theorems 1 and 2, for ``C`` clients.

    For ``t = 1..T`` the server asks each client to run CLIENTUPDATE (``update``, by default the honest
    :func:`~fedlab.fl.recsys.ratings.protocol1_client_update`, with the settings of ``client``: ``B``,
    ``lr``, the loss, ``R = client.local_steps``) on a fake global model (``server.probe``, default
    all-zero ``[num_items, k]``); the client returns its item deltas, corrupted by Eq. (3) when
    ``client.sigma > 0`` (each item's delta clipped to L2 norm ``client.clip_norm`` first when given:
    the clipped Gaussian mechanism of the paper's footnote 5). The server sums the messages and applies
    :func:`estimate_user_vectors` and :func:`sign_rule` (``server.leaning``). Optionally the real model
    ``server.restore_items`` is pushed back with ``R = 0``.

    With ``server.cohort_size = m > 1`` the server only sees the *sum* of the messages of consecutive
    groups of ``m`` clients (secure aggregation); estimates are then per group ``[C/m, k]``.
    ``client.local_steps`` (``R``) is 1 in the paper; other values let one study honest-looking rounds
    (``server.probe`` = the real model).

    Shapes: ``user_vectors [C, k]``, ``items, y [C, N]``; ``num_items`` defaults to ``items.max() + 1``.
    Returns a :class:`PACAttackResult` with estimates at each ``T`` in ``record_at`` (default ``[T]``).

    Raises ``ValueError`` naming the argument for ``batch_size > N``, mismatched ``k``, bad
    ``record_at`` / ``cohort_size`` / ``num_interactions`` (and :class:`Client` / :class:`Server` for
    their fields).
    """
    C, k = user_vectors.shape
    I = int(items.max()) + 1 if num_items is None else int(num_items)
    probe = torch.zeros(I, k, dtype=DTYPE) if server.probe is None else server.probe
    if probe.shape[-1] != k:
        raise ValueError(f"server.probe must have k={k} columns like user_vectors, got {tuple(probe.shape)}")
    B, lr, loss = client.batch_size, client.lr, client.loss

    def step(u):
        return update(u, probe, items, y, local_steps=client.local_steps, batch_size=B, lr=lr, loss=loss,
                      generator=generator)

    restore = None
    if server.restore_items is not None:
        def restore(u):
            return update(u, server.restore_items, items, y, local_steps=0, batch_size=B, lr=lr, loss=loss)[0]
    # validate shapes and batch_size once, before the loop
    update(user_vectors, probe, items, y, local_steps=0, batch_size=B, lr=lr, loss=loss)
    record, sums, u, touched = _run_attack(step, user_vectors, num_interactions=num_interactions, sigma=client.sigma,
                                           record_at=record_at, cohort_size=server.cohort_size, generator=generator,
                                           restore=restore, clip_norm=client.clip_norm)
    est = torch.stack([sign_rule(estimate_user_vectors(s, lr=lr, loss=loss, num_interactions=t,
                                                       batch_size=B), server.leaning)
                       for t, s in zip(record, sums)])
    return PACAttackResult(record, est, u, touched)


def protocol3_attack(user_vectors: torch.Tensor, items: torch.Tensor, y: torch.Tensor, *,
                     num_interactions: int, client: Client, server: Server = Server(), num_items: int | None = None,
                     record_at: Sequence[int] | None = None,
                     generator: torch.Generator | None = None) -> PACAttackResult:
    """The attack of London 2020, App. A.4 (Theorem 3) against Protocol 3 (SGD without replacement).

    As Protocol 2 with ``E = 1`` epoch instead of ``R = 1`` step; the estimate divides by
    ``lr * l'(0) * T * N`` where the server reads ``N`` off the number of items whose message is
    non-zero (averaged over interactions). Noise-free, ``u_hat = (1 - 2 p_c) u_c`` exactly.
    ``client.clip_norm`` clips each item's delta before the noise, as in :func:`protocol2_attack`;
    ``server`` is used for its ``leaning`` only (the zero probe, one client at a time, nothing restored).
    Shapes and errors as :func:`protocol2_attack`; ``client.batch_size`` must divide ``N``. Raises
    ``ValueError`` naming ``client.local_steps`` (not 1: Protocol 3 runs one epoch) or ``server.probe``,
    ``server.restore_items``, ``server.cohort_size`` (not the defaults).
    """
    if client.local_steps != 1:
        raise ValueError(f"client.local_steps must be 1 for Protocol 3 (one epoch), got {client.local_steps}")
    if server.probe is not None or server.restore_items is not None or server.cohort_size != 1:
        raise ValueError("server.probe, server.restore_items and server.cohort_size must keep their defaults "
                         "for Protocol 3's attack (the zero probe, one client at a time)")
    C, k = user_vectors.shape
    I = int(items.max()) + 1 if num_items is None else int(num_items)
    probe = torch.zeros(I, k, dtype=DTYPE)
    B, lr, loss = client.batch_size, client.lr, client.loss

    def step(u):
        return protocol3_client_update(u, probe, items, y, local_epochs=1, batch_size=B, lr=lr, loss=loss,
                                       generator=generator)

    protocol3_client_update(user_vectors, probe, items, y, local_epochs=0, batch_size=B, lr=lr, loss=loss)
    record, sums, u, touched = _run_attack(step, user_vectors, num_interactions=num_interactions, sigma=client.sigma,
                                           record_at=record_at, cohort_size=1, generator=generator, restore=None,
                                           clip_norm=client.clip_norm)
    est = torch.stack([sign_rule(estimate_user_vectors(s, lr=lr, loss=loss, num_interactions=t,
                                                       batch_size=touched), server.leaning)
                       for t, s in zip(record, sums)])
    return PACAttackResult(record, est, u, touched)


def attack_error_curve(user_vectors: torch.Tensor, items: torch.Tensor, y: torch.Tensor,
                       item_vectors: torch.Tensor, *, num_trials: int, num_interactions: int, client: Client,
                       record_at: Sequence[int] | None = None, protocol: int = 2, seed: int = 0):
    """Run the attack on ``num_trials`` independent copies of each of ``C`` clients in one batch and
    measure Definition 1's error after each ``T`` in ``record_at``.

    ``user_vectors [C, k]``, ``items, y [C, N]``, ``item_vectors [I, k]`` (the catalog on which the error is
    measured); ``client`` a :class:`Client` whose ``sigma`` is a float or ``[C]`` (one noise level per
    client); ``protocol`` 2 (Protocol 2, ``R = 1``) or 3 (Protocol 3, ``E = 1``); ``client.clip_norm``
    clips each item's delta before the noise. Returns ``(record, errors)`` with ``errors [J, C, num_trials]``.
    """
    if int(num_trials) < 1:
        raise ValueError(f"num_trials must be >= 1, got {num_trials}")
    if protocol not in (2, 3):
        raise ValueError(f"protocol must be 2 or 3, got {protocol}")
    C = user_vectors.shape[0]
    rep = lambda t: t.repeat_interleave(int(num_trials), dim=0)  # noqa: E731
    sig = torch.as_tensor(client.sigma, dtype=DTYPE)
    sig = rep(sig) if sig.ndim == 1 else sig
    U = rep(user_vectors.to(DTYPE))
    attack = protocol2_attack if protocol == 2 else protocol3_attack
    res = attack(U, rep(items), rep(y), num_interactions=num_interactions, client=replace(client, sigma=sig),
                 num_items=item_vectors.shape[0], record_at=record_at,
                 generator=torch.Generator().manual_seed(int(seed)))
    err = sign_error(res.estimates, U, item_vectors)
    return res.num_interactions, err.view(len(res.num_interactions), C, int(num_trials))


# ----------------------------------------------------------------------------------------------
# error metric, tau_c, bounds
def sign_error(u_hat: torch.Tensor, user_vectors: torch.Tensor, item_vectors: torch.Tensor) -> torch.Tensor:
    """Definition 1 of London 2020: the fraction of catalog items whose predicted sign differs,
    ``(1/I) sum_i 1{sgn(u_hat . v_i) != sgn(u_c . v_i)}``.

    ``u_hat`` is ``[..., C, k]`` (e.g. ``[J, C, k]`` estimates over ``T``), ``user_vectors [C, k]``,
    ``item_vectors [I, k]``; returns ``[..., C]``. Raises ``ValueError`` on mismatched ``k``.
    """
    if u_hat.shape[-1] != user_vectors.shape[-1] or item_vectors.shape[-1] != user_vectors.shape[-1]:
        raise ValueError(f"u_hat {tuple(u_hat.shape)}, user_vectors {tuple(user_vectors.shape)} and "
                         f"item_vectors {tuple(item_vectors.shape)} must share the last dimension k")
    V = item_vectors.to(DTYPE)
    truth = torch.sign(user_vectors.to(DTYPE) @ V.T)                  # [C, I]
    pred = torch.sign(u_hat.to(DTYPE) @ V.T)                          # [..., C, I]
    return (pred != truth).to(DTYPE).mean(dim=-1)


def tau_c(epsilon: float, user_vectors: torch.Tensor, item_vectors: torch.Tensor) -> torch.Tensor:
    """``tau_c(eps)`` of Theorems 2-3: the largest ``tau >= 0`` with
    ``(1/I) sum_i 1{|u_c . v_i| <= tau} <= eps``, per user ``[C]``.

    With sorted margins ``a_(1) <= ... <= a_(I)`` and ``j = floor(eps I)`` the set of admissible ``tau``
    is ``[0, a_(j+1))``; we return its supremum ``a_(j+1)``. The proofs (App. A.3-A.4) still hold there
    because conditions (6)-(7) and (10) are strict. ``j = I`` (``eps = 1``) gives ``inf``.
    Raises ``ValueError`` for ``epsilon`` outside ``[0, 1]``.
    """
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
    a = (user_vectors.to(DTYPE) @ item_vectors.to(DTYPE).T).abs().sort(dim=1).values    # [C, I]
    I = a.shape[1]
    j = int(math.floor(epsilon * I + 1e-9))
    if j >= I:
        return torch.full((a.shape[0],), math.inf, dtype=DTYPE)
    return a[:, j]


def max_item_norm(item_vectors: torch.Tensor) -> float:
    """``M = max_i ||v_i||`` of Theorems 2-3."""
    return float(item_vectors.to(DTYPE).norm(dim=1).max())


def theorem1_num_interactions(pref_rate, batch_size: int, delta: float):
    """Theorem 1 (London 2020): exact (eps = 0) identification with probability ``>= 1 - delta`` after
    ``T >= 2 ln(1/delta) / (B (1 - 2 p_c)^2)`` interactions. Returns the bound (float or array, not
    rounded up). Raises ``ValueError`` for ``pref_rate`` outside (0, 1) or equal to 1/2 (``p_c > 1/2`` uses
    ``1 - p_c``, :func:`_mirror_pref_rate`), ``delta`` outside (0, 1), ``batch_size < 1``.
    """
    p = _mirror_pref_rate(pref_rate)
    _check_open_unit("delta", delta)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out = 2 * np.log(1 / delta) / (batch_size * (1 - 2 * p) ** 2)
    return float(out) if out.ndim == 0 else out


def theorem1_failure_bound(num_interactions, pref_rate, batch_size: int):
    """Hoeffding's bound in the proof of Theorem 1 (App. A.2): the probability that the labels used in
    ``T`` interactions are *not* a strict negative majority is at most ``exp(-2 T B (1/2 - p_c)^2)``.
    Raises ``ValueError`` for ``num_interactions < 0`` or not whole, ``batch_size < 1`` and the
    ``pref_rate`` errors of :func:`theorem1_num_interactions`."""
    p = _mirror_pref_rate(pref_rate)
    _check_count("num_interactions", num_interactions, 0)
    _check_count("batch_size", batch_size)
    T = np.asarray(num_interactions, dtype=float)
    return np.exp(-2 * T * batch_size * (0.5 - p) ** 2)


def _hypergeom_pmf(pref_rate: float, batch_size: int, num_rated: int) -> np.ndarray:
    """``[B + 1]`` pmf of the number of likes in one batch of ``B`` of the ``N`` rated items drawn without
    replacement (``round(p_c N)`` likes in ``S_c``)."""
    K = int(round(pref_rate * num_rated))
    return np.array([math.comb(K, x) * math.comb(num_rated - K, batch_size - x) for x in range(batch_size + 1)],
                    dtype=float) / math.comb(num_rated, batch_size)


#: Per ``(p_c, B, N)`` (a few laws at a time): the repeated squares ``pmf, pmf^{*2}, pmf^{*4}, ...`` of one
#: batch's pmf and the spectra of the recent FFT convolutions with them. Every ``T`` of a search for the
#: smallest sufficient ``T`` reuses them; the arrays are the same as without them (the same convolutions,
#: the same FFTs, in the same order). Squares longer than ``_POWERS_MAX_LEN`` entries are recomputed
#: rather than kept, and at most ``_SPECTRA_MAX`` spectra are kept per law.
_POWERS: dict = {}
_POWERS_MAX_KEYS, _POWERS_MAX_LEN, _SPECTRA_MAX = 16, 1 << 22, 8


def _conv(a: np.ndarray, b: np.ndarray, spectra: dict | None = None, tag=None) -> np.ndarray:
    """The convolution of two pmfs (FFT once both are long, with round-off below ``1e-15`` clipped to zero
    and the result renormalised).

    The FFT convolution is ``scipy.signal.fftconvolve(a, b)`` (mode ``"full"``) written out as scipy
    computes it for two 1-D float arrays, so that the spectrum of ``b`` can be reused: it is looked up in,
    and stored into, ``spectra`` under ``(tag, FFT length)`` when ``spectra`` is given (``b`` must then
    be the array that ``tag`` names), and computed once when ``b is a``. The result is bit-for-bit
    ``fftconvolve``'s (``tests/test_identifiability.py`` checks it)."""
    if min(a.size, b.size) < 64:
        return np.convolve(a, b)
    from scipy import fft as sp_fft

    n = a.size + b.size - 1
    f = sp_fft.next_fast_len(n, True)                      # as fftconvolve: the next fast real length
    sa = sp_fft.rfftn(a, [f], axes=[0])
    if b is a:
        sb = sa
    elif spectra is None:
        sb = sp_fft.rfftn(b, [f], axes=[0])
    else:
        sb = spectra.get((tag, f))
        if sb is None:
            sb = sp_fft.rfftn(b, [f], axes=[0])
            if len(spectra) >= _SPECTRA_MAX:
                spectra.pop(next(iter(spectra)))             # the oldest goes
            spectra[(tag, f)] = sb
    out = np.clip(sp_fft.irfftn(sa * sb, [f], axes=[0])[:n].copy(), 0.0, None)
    return out / out.sum()


#: After every convolution of :func:`_conv_power`, the counts at either end whose probability is below
#: this fraction of the peak are dropped: the FFT's round-off there is about ``1e-16`` of the peak per
#: entry, so those entries are noise, and the true mass they hold is below ``1e-15``. The law then keeps
#: the ``O(sqrt(T B))`` counts that carry probability instead of all ``T B + 1``.
_TAIL_TRIM = 1e-14


def _trim(offset: int, pmf: np.ndarray, rel: float = _TAIL_TRIM) -> tuple[int, np.ndarray]:
    """Drop the leading and trailing entries of ``pmf`` (the law of ``offset + j``) below ``rel`` times its
    largest entry; returns ``(new offset, the kept window)`` (never empty). Pmfs shorter than 64 entries
    (convolved exactly by :func:`numpy.convolve`) are kept whole."""
    if pmf.size < 64:
        return offset, pmf
    keep = np.flatnonzero(pmf > rel * pmf.max())
    return offset + int(keep[0]), pmf[keep[0]:keep[-1] + 1]


def _conv_power(pmf1: np.ndarray, T: int, powers: list | None = None, spectra: dict | None = None
                ) -> tuple[int, np.ndarray]:
    """The ``T``-fold convolution of a pmf (binary powers; FFT convolution once arrays are long, with
    negative round-off clipped to zero), as ``(offset, window)``: ``window[j]`` is the probability of
    ``offset + j``; after each convolution the ends below ``_TAIL_TRIM`` of the peak are dropped
    (:func:`_trim`). ``powers``: a list that holds ``(0, pmf1)`` and the repeated squares
    computed so far, each ``(offset, window)`` (it is extended, up to ``_POWERS_MAX_LEN`` entries per
    square); ``spectra``: a dict of the squares' spectra (see :func:`_conv`)."""
    powers = [(0, pmf1)] if powers is None else powers
    (o, out), (bo, base), t, k = (0, np.array([1.0])), powers[0], int(T), 0
    while t:
        if t & 1:
            o, out = _trim(o + bo, _conv(out, base, spectra if k < len(powers) else None, k))
        t >>= 1
        if t:
            k += 1
            if k < len(powers):
                bo, base = powers[k]
            else:
                bo, base = _trim(2 * bo, _conv(base, base))
                if k == len(powers) and base.size <= _POWERS_MAX_LEN:
                    powers.append((bo, base))
    return o, out


def _likes_window(num_interactions: int, pref_rate: float, batch_size: int, num_rated: int
                  ) -> tuple[int, np.ndarray]:
    """:func:`likes_pmf` as ``(offset, window)``: the counts ``offset .. offset + len(window) - 1`` and
    their probabilities; the counts outside lie below the FFT's round-off (``_TAIL_TRIM`` of the peak).
    Its length grows as ``sqrt(T B)``, not ``T B``: each ``T`` of the search of :meth:`AttackLaw.needed`
    at ``T B ~ 10^7`` labels takes milliseconds instead of seconds.
    Raises as :func:`likes_pmf`."""
    T = int(num_interactions)
    if T < 1:
        raise ValueError(f"num_interactions must be >= 1, got {num_interactions}")
    if not 1 <= batch_size <= num_rated:
        raise ValueError(f"batch_size must be in [1, num_rated={num_rated}], got {batch_size}")
    if not 0 < pref_rate < 1:
        raise ValueError(f"pref_rate must lie in (0, 1), got {pref_rate}")
    key = (float(pref_rate), int(batch_size), int(num_rated))
    if key not in _POWERS:
        if len(_POWERS) >= _POWERS_MAX_KEYS:
            _POWERS.pop(next(iter(_POWERS)))                 # the oldest law goes
        _POWERS[key] = ([(0, _hypergeom_pmf(*key))], {})
    powers, spectra = _POWERS[key]
    return _conv_power(powers[0][1], T, powers, spectra)


def likes_pmf(num_interactions: int, pref_rate: float, batch_size: int, num_rated: int) -> np.ndarray:
    """Exact pmf ``[T B + 1]`` of the number of likes among the ``T B`` labels that Protocol 2 uses in
    ``T`` interactions (London 2020, App. A.2): each batch draws ``B`` of the ``N = num_rated`` items
    without replacement (hypergeometric), batches are independent, so the law is a ``T``-fold
    convolution. ``pref_rate`` may lie anywhere in ``(0, 1)`` here. Counts whose probability lies below
    the FFT's round-off are 0 (entries below ``1e-14`` of the peak; :func:`_likes_window` gives the window
    without the zeros).
    Raises ``ValueError`` for ``num_interactions < 1``, ``batch_size`` outside ``[1, num_rated]`` or
    ``pref_rate`` outside ``(0, 1)``."""
    offset, window = _likes_window(num_interactions, pref_rate, batch_size, num_rated)
    out = np.zeros(int(num_interactions) * int(batch_size) + 1)
    out[offset:offset + window.size] = window
    return out


def label_mean_tail(num_interactions: Sequence[int], pref_rate: float, batch_size: int, num_rated: int,
                    level: float = 0.0) -> np.ndarray:
    """Exact probability that the label multiplier of Protocol 2, ``m_T = -(1/TB) sum_t sum_{i in B_t} y_i
    = 1 - 2 p_hat``, is at most ``level`` (London 2020, App. A.2-A.3): ``level = 0`` is the failure of
    Theorem 1, ``level = beta`` the event ``not E1`` of Eq. (6) in the proof of Theorem 2.
    Returns ``[len(num_interactions)]``. Raises ``ValueError`` for ``pref_rate`` outside ``(0, 1/2)``,
    ``level`` outside ``[0, 1)`` and the errors of :func:`likes_pmf`."""
    p = float(_check_pref_rate(pref_rate))
    if not 0 <= level < 1:
        raise ValueError(f"level must lie in [0, 1), got {level}")
    out = []
    for t in [int(t) for t in num_interactions]:
        offset, pmf = _likes_window(t, p, batch_size, num_rated)
        likes = offset + np.arange(pmf.size)
        # m_T <= level  <=>  likes >= T B (1 - level) / 2
        out.append(float(pmf[likes >= t * batch_size * (1 - level) / 2 - 1e-9].sum()))
    return np.array(out)


def theorem1_exact_failure(num_interactions: Sequence[int], pref_rate: float, batch_size: int,
                           num_rated: int) -> np.ndarray:
    """Exact probability that Protocol 2 fails to recover the signs (noise-free): the number of likes
    among the ``T B`` labels used is at least ``T B / 2`` (:func:`label_mean_tail` at ``level = 0``).
    Returns ``[len(num_interactions)]``. Raises ``ValueError`` as :func:`label_mean_tail`.
    """
    p = float(_check_pref_rate(pref_rate))
    if not 1 <= batch_size <= num_rated:
        raise ValueError(f"batch_size must be in [1, num_rated={num_rated}], got {batch_size}")
    return label_mean_tail(num_interactions, p, batch_size, num_rated, 0.0)


def _theorem2_client(client: Client) -> Client:
    """``client`` when Theorem 2 applies to it: ``R = 1``, no clipping, one noise level (a float)."""
    if client.local_steps != 1:
        raise ValueError(f"client.local_steps must be 1 for Theorem 2 (Protocol 2), got {client.local_steps}")
    if client.clip_norm is not None:
        raise ValueError("client.clip_norm must be None for Theorem 2 (for clipped messages pass "
                         "clipped_sigma(...) as client.sigma)")
    if torch.as_tensor(client.sigma).ndim:
        raise ValueError(f"client.sigma must be one float for Theorem 2, got {client.sigma}")
    return client


def theorem2_num_interactions(pref_rate: float, client: Client, delta: float, beta: float, item_norm_bound: float,
                              num_items: int, tau: float, return_terms: bool = False):
    """Theorem 2 (London 2020, noisy messages of Eq. 3): identification to error ``eps`` with probability
    ``>= 1 - delta`` after ``T >= max{ 2 ln(2/delta) / (B (1 - 2p - beta)^2),
    2 sigma^2 M^2 ln(4 I / delta) / (B (lr beta l'(0) tau_c(eps))^2) }`` interactions.

    ``client`` gives ``B``, ``lr``, the loss and ``sigma`` (a :class:`Client` with ``local_steps = 1`` and
    no ``clip_norm``); ``beta`` must lie in ``(0, 1 - 2 p_c)``; ``tau = tau_c(eps)`` from :func:`tau_c`.
    With ``return_terms`` returns ``(T, label_term, noise_term)``. Raises ``ValueError`` naming the argument.
    """
    p = float(_mirror_pref_rate(pref_rate))
    client = _theorem2_client(client)
    batch_size, sigma, lr, loss = client.batch_size, float(client.sigma), client.lr, client.loss
    _check_count("num_items", num_items)
    if not item_norm_bound >= 0:
        raise ValueError(f"item_norm_bound must be >= 0, got {item_norm_bound}")
    _check_open_unit("delta", delta)
    if not 0 < beta < 1 - 2 * p:
        raise ValueError(f"beta must lie in (0, 1 - 2 p_c) = (0, {1 - 2 * p:.3g}), got {beta}")
    _check_positive("tau", tau)
    t1 = 2 * math.log(2 / delta) / (batch_size * (1 - 2 * p - beta) ** 2)
    t2 = 2 * sigma ** 2 * item_norm_bound ** 2 * math.log(4 * num_items / delta) / (
        batch_size * (lr * beta * _lprime0(loss) * tau) ** 2)
    T = max(t1, t2)
    return (T, t1, t2) if return_terms else T


def theorem3_num_interactions(pref_rate: float, num_rated: int, delta: float, sigma: float, item_norm_bound: float,
                              num_items: int, lr: float, loss: str, tau: float) -> float:
    """Theorem 3 (London 2020, Protocol 3 with Eq. 3 noise), Eq. (4):
    ``T >= 2 sigma^2 M^2 ln(2 I / delta) / (N (lr (1 - 2 p_c) l'(0) tau_c(eps))^2)``.
    Raises ``ValueError`` naming the argument."""
    p = float(_mirror_pref_rate(pref_rate))
    _check_count("num_rated", num_rated)
    _check_count("num_items", num_items)
    if not item_norm_bound >= 0:
        raise ValueError(f"item_norm_bound must be >= 0, got {item_norm_bound}")
    _check_open_unit("delta", delta)
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    _check_positive("tau", tau)
    _check_positive("lr", lr)
    return 2 * sigma ** 2 * item_norm_bound ** 2 * math.log(2 * num_items / delta) / (
        num_rated * (lr * (1 - 2 * p) * _lprime0(loss) * tau) ** 2)


def theorem2_optimal_beta(pref_rate: float, client: Client, delta: float, item_norm_bound: float,
                          num_items: int, tau: float) -> float:
    """The ``beta`` in ``(0, 1 - 2 p_c)`` that minimises Theorem 2's ``T`` (London 2020, Sec. 4.2), for the
    ``client`` of :func:`theorem2_num_interactions`.

    The first term ``c1 / (a - beta)^2`` grows and the second ``c2 / beta^2`` falls with ``beta``
    (``a = 1 - 2 p_c``), so the maximum is smallest where they are equal:
    ``beta* = a sqrt(c2) / (sqrt(c1) + sqrt(c2))``. Raises ``ValueError`` naming the argument
    (``client.sigma`` must be > 0: without noise the best ``beta`` tends to 0 and Theorem 1 applies)."""
    p = float(_mirror_pref_rate(pref_rate))
    client = _theorem2_client(client)
    batch_size, sigma, lr, loss = client.batch_size, float(client.sigma), client.lr, client.loss
    _check_open_unit("delta", delta)
    _check_positive("client.sigma", sigma)
    _check_positive("tau", tau)
    c1 = 2 * math.log(2 / delta) / batch_size
    c2 = 2 * sigma ** 2 * item_norm_bound ** 2 * math.log(4 * num_items / delta) / (
        batch_size * (lr * _lprime0(loss) * tau) ** 2)
    a = 1 - 2 * p
    return a * math.sqrt(c2) / (math.sqrt(c1) + math.sqrt(c2))


class AttackLaw:
    """The exact law of the server's estimate after ``T`` interactions of Protocol 2 (``protocol=2``,
    Theorem 2) or Protocol 3 (``protocol=3``, Theorem 3) against one client (London 2020, App. A.3-A.4).

    The proofs split the sign-corrected estimate into (a) + (b): ``u_hat = m_T u_c + s_T g`` with
    ``m_T = 1 - 2 p_hat`` (Protocol 2: ``p_hat`` the like rate of the ``T B`` labels used, whose exact
    law is :func:`likes_pmf`; Protocol 3: ``m_T = 1 - 2 p_c`` exactly), ``g ~ N(0, I_k)`` independent of
    the labels, and ``s_T = sigma / (|lr l'(0)| sqrt(T n))`` with ``n = B`` (Protocol 2) or ``N``
    (Protocol 3). Only ``g`` is Monte Carlo (``num_draws`` draws, seeded); everything that depends on
    the labels is exact. ``tests/test_identifiability.py`` checks this law against the simulated attack.

    :meth:`fail` gives the probability that an event of the proof, or the attack itself, fails at ``T``;
    :meth:`needed` the smallest ``T`` at which that probability is at most ``delta``.

    Shapes: ``user_vector [k]``, ``item_vectors [I, k]`` (the catalog of Definition 1). Raises
    ``ValueError`` naming the argument for ``protocol`` not 2 or 3, ``sigma <= 0``, ``num_draws < 1``,
    mismatched ``k``, ``pref_rate`` outside ``(0, 1/2)``, ``batch_size`` outside ``[1, num_rated]``.
    """

    EVENTS = ("E1", "E2", "E1E2", "above_tau", "error")
    MAX_LABELS = 10 ** 10        # the largest T B whose label-count law is computed (a window of ~2e6 floats)

    def __init__(self, user_vector: torch.Tensor, item_vectors: torch.Tensor, *, pref_rate: float, num_rated: int,
                 batch_size: int, sigma: float, lr: float, loss: str, protocol: int = 2, num_draws: int = 20000,
                 seed: int = 0):
        if protocol not in (2, 3):
            raise ValueError(f"protocol must be 2 or 3, got {protocol}")
        _check_positive("sigma", sigma)
        _check_positive("lr", lr)
        if int(num_draws) < 1:
            raise ValueError(f"num_draws must be >= 1, got {num_draws}")
        if not 1 <= batch_size <= num_rated:
            raise ValueError(f"batch_size must be in [1, num_rated={num_rated}], got {batch_size}")
        u = torch.as_tensor(user_vector, dtype=DTYPE).reshape(-1)
        if item_vectors.ndim != 2 or item_vectors.shape[1] != u.numel():
            raise ValueError(f"item_vectors must be [I, k={u.numel()}], got {tuple(item_vectors.shape)}")
        self.pref_rate = float(_check_pref_rate(pref_rate))
        self.num_rated, self.batch_size, self.protocol = int(num_rated), int(batch_size), int(protocol)
        self.sigma, self.lr, self.loss = float(sigma), float(lr), loss
        V = item_vectors.to(DTYPE).numpy()
        self.margins = V @ u.numpy()                                          # a_i = u_c . v_i, [I]
        self.norms = np.linalg.norm(V, axis=1)                                # ||v_i||, [I]
        self.num_items, self.item_norm_bound = V.shape[0], float(self.norms.max())   # I and M
        self.user_norm = float(u.norm())                                      # ||u_c||
        self._pmf_cache: dict = {}
        g = np.random.default_rng(int(seed)).standard_normal((int(num_draws), u.numel()))
        proj = g @ V.T                                                        # g . v_i, [S, I]
        self.max_proj = np.abs(proj).max(axis=1)                              # [S]
        # item i flips sign iff s / m >= |a_i| / |g . v_i| and g . v_i opposes a_i
        with np.errstate(divide="ignore"):
            thr = np.where(proj * self.margins < 0, np.abs(self.margins) / np.abs(proj), np.inf)
        self.thresholds = np.sort(thr, axis=1)                                # [S, I]
        self._thr_unsorted = thr
        self._tau_cache: dict = {}                                            # tau -> _tau_threshold(tau)
        self._lp0 = abs(lr * _lprime0(loss))
        self._n = self.batch_size if protocol == 2 else self.num_rated
        self.multiplier = 1 - 2 * round(self.pref_rate * self.num_rated) / self.num_rated   # 1 - 2 p_c

    def with_sigma(self, sigma: float) -> "AttackLaw":
        """The same law at another noise level, sharing this object's Gaussian draws (so that laws at
        several ``sigma`` are compared on common random numbers). Raises ``ValueError`` unless
        ``sigma > 0``."""
        _check_positive("sigma", sigma)
        other = copy.copy(self)
        other.sigma, other._pmf_cache = float(sigma), self._pmf_cache
        return other

    def tau(self, epsilon: float) -> float:
        """``tau_c(epsilon)`` of this client on this catalog, as :func:`tau_c` computes it (from the
        margins this object holds, so that the item at ``tau`` counts as ``>= tau``)."""
        if not 0 <= epsilon <= 1:
            raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
        j = int(math.floor(epsilon * self.num_items + 1e-9))    # as tau_c, on the same float64 margins
        return math.inf if j >= self.num_items else float(np.sort(np.abs(self.margins))[j])

    def bound(self, epsilon: float, delta: float, beta: float | None = None, return_terms: bool = False):
        """The theorem's ``T`` for this client (Theorem 2 through :func:`theorem2_num_interactions` with
        ``beta``, default :func:`theorem2_optimal_beta`; Theorem 3 through :func:`theorem3_num_interactions`).
        With ``return_terms`` (Theorem 2 only) returns ``(T, t1, t2)``."""
        tau = self.tau(epsilon)
        if self.protocol == 3:
            return theorem3_num_interactions(self.pref_rate, self.num_rated, delta, self.sigma, self.item_norm_bound,
                                             self.num_items, self.lr, self.loss, tau)
        client = Client(batch_size=self.batch_size, lr=self.lr, loss=self.loss, sigma=self.sigma)
        if beta is None:
            beta = theorem2_optimal_beta(self.pref_rate, client, delta, self.item_norm_bound, self.num_items, tau)
        return theorem2_num_interactions(self.pref_rate, client, delta, beta, self.item_norm_bound, self.num_items,
                                         tau, return_terms=return_terms)

    def noise_scale(self, num_interactions) -> np.ndarray:
        """``s_T = sigma / (|lr l'(0)| sqrt(T n))``: the std of term (b) per coordinate."""
        return self.sigma / (self._lp0 * np.sqrt(np.asarray(num_interactions, dtype=float) * self._n))

    def _prob_multiplier_at_most(self, T: int, x: np.ndarray) -> np.ndarray:
        """``P(m_T <= x)`` for each entry of ``x``: exact, except that a probability Hoeffding's
        inequality puts below ``1e-13`` (or above ``1 - 1e-13``) is returned as 0 (or 1) without
        computing the law of the label count."""
        x = np.asarray(x, dtype=float)
        if self.protocol == 3:
            return (self.multiplier <= x).astype(float)
        TB, p = T * self.batch_size, self.pref_rate
        gap = (1 - x) / 2 - p                      # m <= x  <=>  p_hat >= p + gap
        hoeff = np.exp(-2 * TB * gap ** 2)
        out = np.where(gap > 0, 0.0, 1.0)
        unsure = hoeff >= 1e-13
        if not unsure.any():
            return out
        if T not in self._pmf_cache:
            if TB > self.MAX_LABELS:
                raise ValueError(f"the exact law of T*B = {TB} labels is not computed beyond {self.MAX_LABELS} labels; "
                                 f"ask for fewer interactions (a larger sigma or error target, or a smaller one)")
            offset, pmf = _likes_window(T, p, self.batch_size, self.num_rated)
            # sf[j] = P(likes >= offset + j); below the window 1 (up to the trimmed tail), above it 0
            self._pmf_cache[T] = (offset, np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]]))
        offset, sf = self._pmf_cache[T]
        L0 = np.ceil(np.clip(TB * (1 - x[unsure]) / 2 - 1e-9, 0, TB + 1)).astype(int)  # likes >= TB(1-x)/2
        out[unsure] = sf[np.clip(L0 - offset, 0, sf.size - 1)]
        return out

    def _tau_threshold(self, tau: float) -> np.ndarray:
        """Per draw, the smallest flip threshold among the items with ``|u_c . v_i| >= tau`` (``inf`` if
        none); cached by ``tau`` (it does not depend on ``sigma``, so :meth:`with_sigma` shares it)."""
        tau = float(tau)
        if tau not in self._tau_cache:
            above = np.abs(self.margins) >= tau
            self._tau_cache[tau] = (self._thr_unsorted[:, above].min(axis=1) if above.any()
                                    else np.full(len(self.max_proj), np.inf))
        return self._tau_cache[tau]

    def fail(self, num_interactions: int, event: str = "error", *, epsilon: float | None = None,
             tau: float | None = None, beta: float | None = None) -> float:
        """Probability that ``event`` fails after ``T = num_interactions`` interactions:

        * ``"E1"``: Eq. (6) fails, ``m_T <= beta`` (exact; Protocol 2);
        * ``"E2"``: Eq. (7) (Protocol 2, needs ``beta``) or Eq. (10) (Protocol 3, level ``1 - 2 p_c``)
          fails for some item, ``s_T max_i |g . v_i| >= level * tau``;
        * ``"E1E2"``: ``not (E1 and E2)`` (labels and noise are independent; Protocol 3: as ``"E2"``);
        * ``"above_tau"``: some item with ``|u_c . v_i| >= tau`` gets the wrong sign (what E1 and E2
          are sufficient for);
        * ``"error"``: Definition 1's error exceeds ``epsilon`` (what the theorem promises).

        ``m_T <= 0`` counts as a failure of the last two (every sign flips when ``m_T < 0``). ``beta``
        may be a sequence: the events are then read at the ``beta`` where they fail least (the proof
        holds for every ``beta``, so the server may pick the best one).
        Raises ``ValueError`` for an unknown event or a missing ``epsilon`` / ``tau`` / ``beta``."""
        T = int(num_interactions)
        if T < 1:
            raise ValueError(f"num_interactions must be >= 1, got {num_interactions}")
        if event not in self.EVENTS:
            raise ValueError(f"event must be one of {self.EVENTS}, got {event!r}")
        s = float(self.noise_scale(T))
        if event in ("E1", "E2", "E1E2"):
            if self.protocol == 2 and beta is None:
                raise ValueError("beta is needed for the events E1 and E2 of Theorem 2")
            if event != "E1" and tau is None:
                raise ValueError("tau is needed for the event E2")
            level = np.atleast_1d(np.asarray(beta if self.protocol == 2 else self.multiplier, dtype=float))
            p1 = self._prob_multiplier_at_most(T, level) if self.protocol == 2 else np.zeros(1)
            if event == "E1":
                return float(p1.min())
            p2 = np.mean(s * self.max_proj[:, None] >= level[None] * tau, axis=0)
            return float(p2.min() if event == "E2" else (1 - (1 - p1) * (1 - p2)).min())
        if event == "above_tau":
            if tau is None:
                raise ValueError("tau is needed for the event above_tau")
            h = self._tau_threshold(tau)
        else:
            if epsilon is None or not 0 <= epsilon <= 1:
                raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
            j = int(math.floor(epsilon * self.margins.size + 1e-9))
            if j >= self.margins.size:
                return 0.0
            h = self.thresholds[:, j]                    # the (j+1)-th item to flip
        with np.errstate(divide="ignore"):
            x = np.where(np.isinf(h), 0.0, s / h)
        return float(np.mean(self._prob_multiplier_at_most(T, x)))

    def needed(self, event: str = "error", delta: float = 0.05, *, t_max: int = 10 ** 15, **kw) -> int:
        """The smallest ``T`` with :meth:`fail` ``<= delta`` (doubling, then bisection; the failure
        probability falls with ``T`` up to the lattice wiggles of the label count). Raises ``ValueError``
        for ``delta`` outside (0, 1) or when no ``T <= t_max`` suffices.

        ``t_max`` was ``10**9`` until 2026-11-29: at ``epsilon = 0`` the events must hold for the item with
        the smallest margin ``|u_c . v_i|``, and at ``FEDLAB_SEED=26`` chapter 2's target has one of
        ``1.3e-4``, so the proof's events need about ``10**9`` interactions (the theorem's ``T`` is
        ``1.3e10``). The failure probability is closed-form in ``T`` at that size (Hoeffding settles the
        label count, the noise is Monte Carlo over fixed draws), so the search costs the same there."""
        _check_open_unit("delta", delta)
        ok = lambda t: self.fail(t, event, **kw) <= delta     # noqa: E731
        if ok(1):
            return 1
        lo, hi = 1, 2
        while not ok(hi):
            lo, hi = hi, 2 * hi
            if hi > t_max:
                raise ValueError(f"no T <= t_max={t_max} makes {event} fail with probability <= {delta}")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        return hi

    def union_bound_needed(self, level: float, tau: float, share: float, norms: np.ndarray | None = None) -> float:
        """The smallest real ``T`` at which the proofs' union bound
        ``sum_i 2 exp(-(level tau)^2 / (2 s_T^2 ||v_i||^2)) <= share`` holds, with the items' own norms
        (default) or any ``norms [I]`` (``M`` for every item gives the theorems' term back)."""
        nv = self.norms if norms is None else np.asarray(norms, dtype=float)
        c = (level * tau) ** 2 * self._lp0 ** 2 * self._n / (2 * self.sigma ** 2)     # exponent per unit T
        f = lambda t: np.sum(2 * np.exp(-c * t / nv ** 2)) - share        # noqa: E731
        lo, hi = 1e-9, 1.0
        while f(hi) > 0:
            hi *= 2
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if f(mid) <= 0 else (mid, hi)
            if hi / lo < 1 + 1e-12:
                break
        return hi


def clipped_sigma(sigma: float, clip_norm: float, user_norm: float, *, lr: float, loss: str) -> float:
    """The noise level at which the *unclipped* attack behaves exactly like the attack on messages
    clipped to ``clip_norm`` per item before Eq. (3)'s noise ``sigma`` (London 2020, footnote 5).

    Under the zero probe every item delta is ``-lr l'(0) y_i u_c`` (Eq. 2), of norm
    ``a = |lr l'(0)| ||u_c||`` whatever the label; clipping scales every delta by the same
    ``min(1, clip_norm / a)``, which neither the sign rule nor Definition 1's error can see, so the
    clipped attack is the unclipped one with noise ``sigma / min(1, clip_norm / a)``. Feed the result to
    :class:`AttackLaw` (``tests/test_identifiability.py`` checks this against the simulated clipped
    attack). Raises ``ValueError`` for ``sigma``, ``clip_norm``, ``user_norm`` or ``lr`` not positive.
    """
    for name, value in (("sigma", sigma), ("clip_norm", clip_norm), ("user_norm", user_norm), ("lr", lr)):
        _check_positive(name, value)
    a = abs(lr * _lprime0(loss)) * float(user_norm)
    return float(sigma) / min(1.0, float(clip_norm) / a)


def proposition1_check(u_hat: torch.Tensor, user_vectors: torch.Tensor, item_vectors: torch.Tensor,
                       labels: torch.Tensor, items: torch.Tensor | None = None) -> dict:
    """Proposition 1 (London 2020): if ``u_c`` errs on a fraction ``eta`` of the labels and ``u_hat``
    disagrees with ``u_c`` in sign on a fraction ``eps`` of the same items, then ``u_hat`` errs on at
    most ``eps + eta``. This is a triangle inequality that holds item by item (App. A.1), so the check
    is deterministic: it tests the code, not the attack.

    Over the catalog (``labels [C, I]``) or, with ``items [C, N]``, over each client's rated items
    ``S_c`` (``labels [C, N]``): how well the stolen vector predicts the client's own data. Returns
    per-user tensors ``eps``, ``eta``, ``err_hat`` (``[C]``) and ``holds`` (bool ``[C]``)."""
    from fedlab.fl.recsys.ratings import prediction_error

    if items is None:
        eps = sign_error(u_hat, user_vectors, item_vectors)
    else:
        V = item_vectors.to(DTYPE)
        truth = torch.sign(user_vectors.to(DTYPE) @ V.T).gather(1, items)
        eps = (torch.sign(u_hat.to(DTYPE) @ V.T).gather(1, items) != truth).to(DTYPE).mean(1)
    eta = prediction_error(user_vectors, item_vectors, labels, items)
    err_hat = prediction_error(u_hat, item_vectors, labels, items)
    return {"eps": eps, "eta": eta, "err_hat": err_hat, "holds": err_hat <= eps + eta + 1e-12}


# ----------------------------------------------------------------------------------------------
# defense
def secure_aggregate_items(messages: torch.Tensor, items: torch.Tensor, num_items: int,
                           cohort_size: int) -> torch.Tensor:
    """What secure aggregation (Bonawitz et al. 2017) reveals of one round of Protocol 1 messages: for
    every cohort of ``cohort_size`` consecutive clients, the *per-item* sum of their item deltas, the
    ``[I, k]`` update the server needs to apply (London 2020, Sec. 6), not one vector per cohort.

    ``messages`` [C, N, k] (client ``c``'s delta for its ``n``-th rated item), ``items`` [C, N] item
    ids in ``0..num_items-1`` -> ``[C / cohort_size, num_items, k]``. Raises ``ValueError`` naming
    ``cohort_size`` (must divide ``C``), ``items`` (shape or range) or ``num_items``."""
    C, N, k = messages.shape
    if int(cohort_size) < 1 or C % int(cohort_size):
        raise ValueError(f"cohort_size must divide the number of clients {C}, got {cohort_size}")
    if items.shape != (C, N):
        raise ValueError(f"items must be [C, N] = {(C, N)}, got {tuple(items.shape)}")
    if int(num_items) < 1 or int(items.min()) < 0 or int(items.max()) >= int(num_items):
        raise ValueError(f"items must lie in [0, num_items={num_items})")
    G, I = C // int(cohort_size), int(num_items)
    slot = (torch.arange(C) // int(cohort_size))[:, None] * I + items                  # [C, N] -> cohort x item
    out = torch.zeros(G * I, k, dtype=messages.dtype)
    out.index_add_(0, slot.reshape(-1), messages.reshape(-1, k))
    return out.view(G, I, k)


def exposed_members(item_sums: torch.Tensor, user_vectors: torch.Tensor, *, tol: float = 1e-9) -> torch.Tensor:
    """Which cohort members' private vectors appear, up to sign and scale, among the per-item sums of
    :func:`secure_aggregate_items`: member ``c`` of cohort ``g`` is exposed when some non-zero sum
    ``S_gi`` has ``|cos(S_gi, u_c)| >= 1 - tol``. Under the zero probe every delta of client ``c`` is
    a multiple of ``u_c``, so an item only ``c`` trained on in its cohort gives ``S_gi = a u_c``.

    ``item_sums`` [G, I, k], ``user_vectors`` [G * m, k] (cohorts consecutive) -> ``[G, m]`` bool.
    Raises ``ValueError`` when the shapes do not match."""
    G, I, k = item_sums.shape
    if user_vectors.shape[1] != k or user_vectors.shape[0] % G:
        raise ValueError(f"user_vectors must be [G*m, k={k}] for G={G} cohorts, got {tuple(user_vectors.shape)}")
    m = user_vectors.shape[0] // G
    U = torch.nn.functional.normalize(user_vectors.view(G, m, k), dim=-1)
    norms = item_sums.norm(dim=-1, keepdim=True)
    S = torch.where(norms > 0, item_sums / norms.clamp_min(1e-300), torch.zeros_like(item_sums))
    cos = torch.einsum("gik,gmk->gim", S, U).abs()                                   # [G, I, m]
    return (cos >= 1 - tol).any(1)


def leaked_labels(deltas: torch.Tensor, leaning: str = "negative") -> torch.Tensor:
    """The labels one Protocol 1 message gives away (London 2020, Sec. 4's remark on recovering
    ``S_c``). Every item delta of one local step is ``-alpha l'(y_i <u_c, v_i>) y_i u_c`` (Eq. 2), and
    ``-l' > 0`` for the losses of Assumption 2: all non-zero rows are multiples of one vector, with the
    sign of ``y_i``. The signs against the longest row give the labels up to one global sign, which
    the class prior fixes as :func:`sign_rule` does (``leaning="negative"``: most labels are ``-1``).

    ``deltas`` [C, N, k] -> ``[C, N]`` in {-1, 0, +1} (0: the item did not change, nothing leaked).
    Raises ``ValueError`` for a non-3-D ``deltas`` or an unknown ``leaning``."""
    if deltas.dim() != 3:
        raise ValueError(f"deltas must be [C, N, k], got shape {tuple(deltas.shape)}")
    if leaning not in ("negative", "positive"):
        raise ValueError(f"leaning must be 'negative' or 'positive', got {leaning!r}")
    ref = deltas.gather(1, deltas.norm(dim=-1).argmax(1)[:, None, None].expand(-1, 1, deltas.shape[-1]))  # [C, 1, k]
    s = torch.sign((deltas * ref).sum(-1))                                                            # [C, N]
    flip = s.sum(1, keepdim=True) > 0 if leaning == "negative" else s.sum(1, keepdim=True) < 0
    return torch.where(flip, -s, s)


def detect_zero_probe(item_vectors: torch.Tensor, items: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Client-side check (London 2020, Sec. 4.1: the attack is straightforward for a client to detect):
    ``True`` for each client that received a vector of norm ``<= atol`` for *any* of its rated items.

    A check on *all* rated items would be defeated by one non-zero item vector among the zeros, for
    any ``atol``; with *any*, the server has to lift every rated item above ``atol`` (the tiny probe
    of exercise ch2b-ex-tiny). An honestly trained catalog has no zero item vector, so honest rounds
    pass. ``item_vectors [I, k]`` or ``[C, I, k]``, ``items [C, N]``; returns bool ``[C]``.
    Raises ``ValueError`` for ``atol < 0``."""
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    if item_vectors.ndim == 2:
        V = item_vectors[items]
    else:
        V = item_vectors.gather(1, items[..., None].expand(-1, -1, item_vectors.shape[-1]))
    return (V.norm(dim=-1) <= atol).any(dim=-1)


def guarded_client_update(user_vectors, item_vectors, items, y, *, local_steps, batch_size, lr, loss="log",
                          generator=None, atol: float = 0.0):
    """:func:`~fedlab.fl.recsys.ratings.protocol1_client_update` behind :func:`detect_zero_probe`: a client
    that receives a vector of norm ``<= atol`` for any of its rated items refuses to train and returns
    zero deltas with its user vector unchanged. Same signature and return value."""
    u_new, deltas = protocol1_client_update(user_vectors, item_vectors, items, y, local_steps=local_steps,
                                  batch_size=batch_size, lr=lr, loss=loss, generator=generator)
    refuse = detect_zero_probe(item_vectors, items, atol)
    u_new = torch.where(refuse[:, None], user_vectors.to(DTYPE), u_new)
    return u_new, deltas * (~refuse)[:, None, None]
