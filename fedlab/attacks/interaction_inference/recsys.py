"""RAIFLE: reconstruction of user interactions in interaction-based FL (Pham, Kulkarni & Houmansadr).

The server knows the items ``X`` it showed a user, the global model ``theta`` and the local algorithm
``g``; it receives the user's update and searches for interactions ``I'`` whose simulated update
``g(X, theta, I')`` matches it (RAIFLE Sec. 3.2, eq. 5). Implemented here:

* :class:`RaifleBudget` -- the optimiser's budget (evaluations, restarts, L-BFGS memory, starting points);
  :class:`RaifleVariant` -- which row of Table 3 runs (embedding estimated, model parameters matched);
  :class:`FncfUser` -- the simulated FNCF user's local training (the model attacked).
* :func:`raifle` -- Algorithm 1 / Algorithm 2 for a batch of users: interactions parameterised as
  ``sigmoid(z)`` with ``z ~ U(-1, 1)`` (App. B.3), optional joint estimation of the private user
  embedding (Algorithm 2, App. B.2), an L-BFGS per user run as one batch (App. B.3;
  :func:`fedlab.optim.lbfgs_rows`), termination by an evaluation budget and a loss-change
  threshold, random restarts keeping each user's best, and per-user random draws
  (:func:`user_generator`), so that a user's result does not depend on its batch.
* :func:`raifle_fcf`, :func:`raifle_fncf` -- the recommender instances of Table 3 (estimate the user
  embedding or not; include the model-parameter update in the loss or not). With the embedding
  estimated, FNCF's attack runs a continuation over smoothed ReLUs first (:data:`FNCF_CONTINUATION`,
  our addition): the exact loss is piecewise smooth in the embedding and L-BFGS stalls on it.
* :func:`matching_loss` -- the RS loss of Sec. 4.1.1: mean L2 distance between matching rows of the
  item-embedding updates (+ squared error on the model-parameter update).
* :func:`analytic_fcf_attack` -- a one-shot attack on FCF: the update ``(I - X e) e^T`` has rank one,
  so an SVD gives the direction of ``e``; the sign comes from "negatives outnumber positives"
  and the scale from the gap between the two clusters; then ``I`` follows exactly.
* :func:`pointwise_l2_update`, :func:`closed_form_interactions`, :func:`attack_hessian` -- App. A:
  for a pointwise squared loss ``g`` is linear in ``I'``, the attack is convex (Thm. 1), unique iff
  the Jacobian has rank ``m`` (Thm. 2) and then solved in closed form (eq. 12).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...fl.recsys.interactions import (fcf_item_updates, fncf_backprop, fncf_first_layer, fncf_init, fncf_per_user,
                                       fncf_updates)
from ...config import device as _device
from ...fl.local import _model_on
from ..._checks import finite_positive, whole_int
from ...optim import lbfgs_rows
from ...privacy.clipping import clip_rows

__all__ = ["RaifleBudget", "RaifleVariant", "FncfUser", "RecsysCase", "make_recsys_case", "RaifleResult", "user_generator", "raifle", "matching_loss", "raifle_fcf", "raifle_fncf", "FNCF_CONTINUATION",
           "analytic_fcf_attack", "pointwise_l2_update", "closed_form_interactions", "attack_hessian"]


@dataclass(frozen=True)
class RaifleBudget:
    """The optimiser's budget of RAIFLE (Pham, Kulkarni & Houmansadr, App. B.3): one settings object, so that a
    page shows it in one line, ``RaifleBudget(max_iter=1000, num_restarts=2)``.

    ``max_iter``
        loss evaluations per start (not iterations: :func:`fedlab.optim.lbfgs_rows` counts every evaluation,
        line search included); default ``100``.
    ``num_restarts``
        random starts per user, the best kept (App. B.3's random restarts); default ``1``.
    ``tol``
        a start stops when its loss changes by less than this (``>= 0``); default ``1e-9``.
    ``history_size``
        the L-BFGS memory (pairs kept); default ``20``.
    ``emb_init_std``
        the std of the user-embedding starts ``E ~ N(0, emb_init_std^2)`` (Algorithm 2; App. B.3); default ``1``.
    ``antithetic``
        ``True`` (default; our addition, not in the paper): restart ``2k+1`` starts from ``-E`` of restart
        ``2k``, so both basins of FCF's sign symmetry ``e -> -e`` are explored; ``False``: independent draws
        (the paper's random restarts).

    Raises ``ValueError`` naming the field for a ``max_iter``, ``num_restarts`` or ``history_size`` that is not
    a whole number ``>= 1``, a negative or non-finite ``tol``, an ``emb_init_std`` that is not finite and
    ``> 0``, or an ``antithetic`` that is not a bool.
    """

    max_iter: int = 100
    num_restarts: int = 1
    tol: float = 1e-9
    history_size: int = 20
    emb_init_std: float = 1.0
    antithetic: bool = True

    def __post_init__(self):
        for name in ("max_iter", "num_restarts", "history_size"):
            object.__setattr__(self, name, whole_int(f"RaifleBudget.{name}", getattr(self, name), low=1))
        if isinstance(self.tol, bool) or not (math.isfinite(float(self.tol)) and self.tol >= 0):
            raise ValueError(f"RaifleBudget.tol must be a finite number >= 0, got {self.tol!r}")
        finite_positive("RaifleBudget.emb_init_std", self.emb_init_std)
        if not isinstance(self.antithetic, bool):
            raise ValueError(f"RaifleBudget.antithetic must be True or False, got {self.antithetic!r}")


@dataclass(frozen=True)
class RaifleVariant:
    """Which RAIFLE attack on a recommender runs: a row of Table 3 (Pham, Kulkarni & Houmansadr, Sec. 4.2) and
    the details of its loss (Sec. 4.1.1).

    ``estimate_embedding``
        ``True`` (default): Algorithm 2, the private user embedding estimated jointly; ``False``: Algorithm 1
        with the server's guess in its place.
    ``use_model_params``
        FNCF only: add the model-parameter update to the matching loss (Table 3's "model" rows); default
        ``False``.
    ``squared``
        the item loss: ``False`` (default) the mean L2 distance of Sec. 4.1.1, ``True`` its square (the
        reference code's MSE up to a constant per user).
    ``continuation``
        FNCF only: ReLU temperatures (decreasing, ``> 0``) of warm-up stages, ``None`` for none, or ``"auto"``
        (default; our addition, not in the paper): :data:`FNCF_CONTINUATION` when the embedding is estimated,
        the user trains one step and the budget gives every stage at least 10 evaluations.

    Raises ``ValueError`` naming the field for a flag that is not a bool, or a ``continuation`` that is not
    ``"auto"``, ``None`` or a sequence of temperatures ``> 0``.
    """

    estimate_embedding: bool = True
    use_model_params: bool = False
    squared: bool = False
    continuation: str | tuple | None = "auto"

    def __post_init__(self):
        for name in ("estimate_embedding", "use_model_params", "squared"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RaifleVariant.{name} must be True or False, got {getattr(self, name)!r}")
        c = self.continuation
        if isinstance(c, str):
            if c != "auto":
                raise ValueError(f"RaifleVariant.continuation must be 'auto', None or a tuple of temperatures, "
                                 f"got {c!r}")
        elif c is not None:
            temps = tuple(float(t) for t in c)
            if any(not t > 0 for t in temps):
                raise ValueError(f"RaifleVariant.continuation temperatures must be > 0, got {temps}")
            object.__setattr__(self, "continuation", temps)


@dataclass(frozen=True)
class FncfUser:
    """The FNCF user's local training as the server simulates it (the model attacked, not the attack's optimiser;
    Pham, Kulkarni & Houmansadr, Sec. 4.1): the defaults are the honest round of
    :func:`make_recsys_case` (one step of rate 1, no clipping).

    ``lr``
        the user's learning rate (finite, ``> 0``); default ``1.0``.
    ``local_steps``
        the user's local steps (a whole number ``>= 1``); default ``1``.
    ``items_clip_norm``, ``params_clip_norm``
        the L2 norms the user clips its item and parameter updates to (e.g. under LDP), reproduced inside the
        simulation; ``None`` (default): no clipping.

    Raises ``ValueError`` naming the field for an ``lr`` or a clipping norm that is not finite and ``> 0``, or
    ``local_steps`` that is not a whole number ``>= 1``.
    """

    lr: float = 1.0
    local_steps: int = 1
    items_clip_norm: float | None = None
    params_clip_norm: float | None = None

    def __post_init__(self):
        finite_positive("FncfUser.lr", self.lr)
        object.__setattr__(self, "local_steps", whole_int("FncfUser.local_steps", self.local_steps, low=1))
        for name in ("items_clip_norm", "params_clip_norm"):
            if getattr(self, name) is not None:
                finite_positive(f"FncfUser.{name}", getattr(self, name))


@dataclass
class RaifleResult:
    """Output of :func:`raifle` for ``U`` users.

    ``scores`` [U, m]: the optimised logits ``z`` (the reconstruction is ``sigmoid(z)``; higher =
    more likely interacted, used for the AUC); ``user_emb`` [U, d] or None (Algorithm 2's estimate);
    ``loss`` [U]: the best final matching loss per user; ``iterations``: function evaluations used;
    ``loss_truth`` [U] or None: the same loss at the true interactions (and the true embedding where
    it is estimated), when the caller passed them to evaluate the optimiser (``truth=``).
    """

    scores: torch.Tensor
    user_emb: torch.Tensor | None
    loss: torch.Tensor
    iterations: int
    loss_truth: torch.Tensor | None = None

    @property
    def interactions(self) -> torch.Tensor:
        return torch.sigmoid(self.scores)


# ------------------------------------------------------------------------------- the honest round attacked

@dataclass
class RecsysCase:
    """One honest round of federated recommendation for a set of users (RAIFLE Sec. 4.1).

    ``X`` [U, m, d] the items each user trains on (public), ``E`` [U, d] the private user
    embeddings, ``I`` [U, m] the private 0/1 interactions, ``mask`` [U, m]; FCF's item update
    ``fcf`` [U, m, d]; FNCF's network ``model, theta`` and its updates ``fncf_items`` [U, m, d] and
    ``fncf_params`` {name: [U, ...]}; the users' local settings ``fncf_lr``, ``local_steps``.
    ``theta`` is one network shared by the users, or one per user (every tensor ``[U, ...]``, as
    :func:`fedlab.experiments.chapter3a.network_draws_case` builds: the same users under several network draws).
    """

    X: torch.Tensor
    E: torch.Tensor
    I: torch.Tensor
    mask: torch.Tensor
    fcf: torch.Tensor
    model: torch.nn.Module
    theta: dict
    fncf_items: torch.Tensor
    fncf_params: dict
    fncf_lr: float
    local_steps: int

    def __len__(self) -> int:
        return int(self.I.shape[0])

    def networks(self, users) -> dict:
        """The FNCF network(s) of ``users`` (indices into this case): the shared ``theta``, or their rows of a
        per-user one."""
        return _theta_of(self, users)

    def subset(self, users) -> "RecsysCase":
        """The same round restricted to ``users`` (indices into this case), padding trimmed to their
        longest item list. Raises ``ValueError`` for an empty selection or an index out of range."""
        idx = torch.as_tensor(users, dtype=torch.long).flatten()
        if idx.numel() == 0:
            raise ValueError("users must not be empty")
        if int(idx.min()) < 0 or int(idx.max()) >= len(self):
            raise ValueError(f"users must lie in [0, {len(self)}), got {idx.min().item()}..{idx.max().item()}")
        m = int(self.mask[idx].sum(1).max())
        return RecsysCase(self.X[idx, :m], self.E[idx], self.I[idx, :m], self.mask[idx, :m], self.fcf[idx, :m],
                          self.model, _theta_of(self, idx), self.fncf_items[idx, :m],
                          {k: v[idx] for k, v in self.fncf_params.items()}, self.fncf_lr, self.local_steps)


def _theta_of(case: RecsysCase, idx) -> dict:
    """The FNCF network(s) of the users ``idx`` of ``case``: the shared ``theta``, or their rows of a
    per-user one."""
    return {k: v[idx] for k, v in case.theta.items()} if fncf_per_user(case.model, case.theta) else case.theta


def make_recsys_case(user_items, num_items: int, *, dim: int = 64, fncf_lr: float = 1.0,
                     local_steps: int = 1, seed: int = 0) -> RecsysCase:
    """Random item and user embeddings (N(0, 1), as ``nn.Embedding`` initialises them; RAIFLE
    Sec. 4.1.3), the FNCF network, and every user's honest FCF and FNCF updates.
    ``user_items``: a :class:`fedlab.data.movielens.UserItems`."""
    g = torch.Generator().manual_seed(seed)
    item_emb = torch.randn(num_items, dim, generator=g)
    E = torch.randn(len(user_items), dim, generator=g)
    mask = user_items.mask
    X = item_emb[user_items.items] * mask[..., None]
    I = user_items.interactions
    model, theta = fncf_init(dim, seed=seed)
    fcf = fcf_item_updates(X, E, I, mask)
    dX, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=fncf_lr, local_steps=local_steps)
    return RecsysCase(X, E, I, mask, fcf, model, theta, dX, dT, fncf_lr, local_steps)



def user_generator(seed: int, user: int, stream: int) -> torch.Generator:
    """A ``torch.Generator`` for one user's random draws: seeded from ``(seed, user, stream)`` by
    NumPy's ``SeedSequence``, so a user's draws depend on its id and the run's seed only, never on
    which other users share its batch or how long the batch's padded item lists are."""
    state = np.random.SeedSequence([int(seed), int(user), int(stream)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


def raifle(loss_fn: Callable, num_users: int, num_items: int, *, dim: int | None = None,
           budget: RaifleBudget = RaifleBudget(), seed: int = 0, user_ids: torch.Tensor | None = None,
           device=None, warmup=(), truth=None) -> RaifleResult:
    """RAIFLE, Algorithm 1 (``dim=None``) or Algorithm 2 (``dim=d``), batched over users.

    ``loss_fn(I, E, rows) -> [k]`` returns the matching loss of each of ``k`` candidate rows: ``I``
    [k, m] in (0, 1), ``E`` [k, d] (or None), ``rows`` [k] the user (``0..num_users-1``) each
    candidate belongs to (of the ``B = num_restarts * num_users`` candidates, ``b`` is restart
    ``b // num_users`` of user ``b % num_users``); row ``i`` of the result must depend on row ``i``
    of the inputs only. ``budget`` (:class:`RaifleBudget`): evaluations, restarts, L-BFGS memory and
    starting points. Initialisation (App. B.3): ``z ~ U(-1, 1)``, ``I = sigmoid(z)``; ``E ~ N(0,
    emb_init_std^2)``, each restart from its own draw (the paper's random restarts), or with
    ``budget.antithetic`` (default; our addition, not in the paper) in antithetic pairs: restart
    ``2k+1`` starts from ``-E`` of restart ``2k``, so both basins of the sign symmetry ``e -> -e``
    of FCF are always explored.
    Each user's draws come from :func:`user_generator` with its id (``user_ids`` [num_users],
    default ``0..num_users-1``). Every candidate runs its own L-BFGS
    (:func:`fedlab.optim.lbfgs_rows`: own curvature memory, own Armijo line search, a budget of
    ``max_iter`` evaluations, stopping when its loss changes by less than ``tol``), so a user's
    result does not depend on the users it is batched with (``tests/test_recsys.py``
    checks this). Each user keeps its best restart.

    ``device``: where the L-BFGS runs (``None``: the CPU). ``loss_fn`` then receives ``I``, ``E`` and
    ``rows`` on that device, so the tensors it holds must live there too: :func:`raifle_fcf`,
    :func:`raifle_fncf` and :func:`fedlab.attacks.interaction_inference.oltr.raifle_oltr` move theirs
    and pass :func:`fedlab.config.device` (``FEDLAB_DEVICE``). The starting points are drawn on the CPU;
    the result is on the CPU.

    ``warmup``: loss functions with ``loss_fn``'s signature minimised first, in order, each from
    where the previous one stopped (continuation: smoothed versions of ``loss_fn``, see
    :func:`raifle_fncf`); the budget is split evenly, each warm-up stage gets ``max_iter // (len(warmup)
    + 1)`` evaluations and ``loss_fn`` the rest, and the restart kept is the best under ``loss_fn``.
    ``truth``: ``(I [U, m], E [U, d] or None)``, the true answer, used only to report
    ``loss_fn`` there (``RaifleResult.loss_truth``), never by the attack.

    Raises ``ValueError`` for non-positive sizes, a ``budget`` that is not a :class:`RaifleBudget`, its
    ``max_iter`` below ``len(warmup) + 1``, ``user_ids`` of the wrong length, or a ``loss_fn`` that is
    not finite at every restart of some user (L-BFGS stops a row at its first non-finite value, so such a
    user's answer would be its random start: chapter 3a's linear check at ``FEDLAB_SEED=26`` divided by
    the norm of a zero update).
    """
    if num_users < 1 or num_items < 1:
        raise ValueError(f"num_users and num_items must be >= 1, got {num_users}, {num_items}")
    if not isinstance(budget, RaifleBudget):
        raise ValueError(f"budget must be a RaifleBudget (e.g. RaifleBudget(max_iter=100, num_restarts=2)), "
                         f"got {type(budget).__name__}: {budget!r}")
    num_restarts, max_iter, tol, history_size = budget.num_restarts, budget.max_iter, budget.tol, budget.history_size
    emb_init_std, antithetic = budget.emb_init_std, budget.antithetic
    warmup = list(warmup)
    if max_iter < len(warmup) + 1:
        raise ValueError(f"max_iter must be >= {len(warmup) + 1} (one evaluation per stage), got {max_iter}")
    ids = torch.arange(num_users, device="cpu") if user_ids is None else torch.as_tensor(user_ids).flatten()
    if len(ids) != num_users:
        raise ValueError(f"user_ids must hold num_users={num_users} ids, got {len(ids)}")
    B = num_restarts * num_users
    rows = torch.arange(B, device="cpu") % num_users
    z = torch.empty(num_restarts, num_users, num_items, device="cpu")
    E = None if dim is None else torch.empty(num_restarts, num_users, dim, device="cpu")
    for u, uid in enumerate(ids.tolist()):
        for r in range(num_restarts):
            z[r, u] = torch.rand(num_items, generator=user_generator(seed, uid, 2 * r), device="cpu") * 2 - 1
            if E is not None:
                if antithetic:
                    pair = r - r % 2
                    e = emb_init_std * torch.randn(dim, generator=user_generator(seed, uid, 2 * pair + 1), device="cpu")
                    E[r, u] = e if r % 2 == 0 else -e
                else:
                    E[r, u] = emb_init_std * torch.randn(dim, generator=user_generator(seed, uid, 2 * r + 1), device="cpu")
    x0 = z.reshape(B, num_items) if E is None else torch.cat([z.reshape(B, num_items), E.reshape(B, dim)], 1)
    dev = torch.device("cpu") if device is None else _device(device)
    x0, rows = x0.to(dev), rows.to(dev)                           # drawn on the CPU: the same starts anywhere

    def rows_loss(fn):
        def f(x, idx):
            Ex = None if E is None else x[:, num_items:]
            return fn(torch.sigmoid(x[:, :num_items]), Ex, rows[idx])
        return f

    stage_iter = max_iter // (len(warmup) + 1)
    x, evals = x0, 0
    for k, fn in enumerate(warmup + [loss_fn]):
        budget = stage_iter if k < len(warmup) else max_iter - stage_iter * len(warmup)
        x, _, used = lbfgs_rows(rows_loss(fn), x, max_iter=budget, history_size=history_size, tol=tol)
        evals += used
    zx, Ex = x[:, :num_items], None if E is None else x[:, num_items:]
    with torch.no_grad():
        final = loss_fn(torch.sigmoid(zx), Ex, rows).reshape(num_restarts, num_users)
        bad = ~torch.isfinite(final).any(0)                       # users with no restart of finite loss
        if bool(bad.any()):
            raise ValueError(f"loss_fn is not finite for users {ids[bad.cpu()].tolist()[:10]} at every restart "
                             f"(nothing was optimised for them): a loss normalised by the update's norm needs a "
                             f"denominator that cannot be 0, e.g. .clamp_min(1e-12)")
        best = final.argmin(0)                                    # [U]
        pick = best * num_users + torch.arange(num_users, device=dev)
        at_truth = None
        if truth is not None:
            tI, tE = truth
            at_truth = loss_fn(tI.to(device=dev, dtype=zx.dtype),
                               None if E is None else tE.to(device=dev, dtype=zx.dtype),
                               torch.arange(num_users, device=dev)).cpu()
        return RaifleResult(zx[pick].cpu(), None if Ex is None else Ex[pick].cpu(), final.min(0).values.cpu(), evals,
                            at_truth)


def matching_loss(pred_items, target_items, mask, pred_params=None, target_params=None,
                  *, params_weight: float = 1.0, squared: bool = False):
    """RAIFLE's RS matching loss (Sec. 4.1.1), one value per user.

    Items: mean over the user's real items of ``||pred_i - target_i||_2``, divided by the mean row
    norm of the target so every user's loss has the same scale (the paper rescales FNCF the same
    way). Params (optional, "use model params"): ``||pred - target||^2 / ||target||^2`` over all
    parameter tensors. Shapes: items ``[B, m, d]``, ``mask`` [B, m]; params dicts of ``[B, ...]``.
    """
    w = mask.to(pred_items.dtype)
    loss = _items_distance(((pred_items - target_items) ** 2).sum(-1), target_items.norm(dim=-1), w, squared)
    if pred_params is not None:
        loss = loss + _params_distance(pred_params, target_params, params_weight)
    return loss


def _items_distance(sq, target_norm, w, squared: bool):
    """The item part of :func:`matching_loss` from the squared row distances ``sq`` [B, m] and the
    target row norms [B, m]; ``w`` [B, m] 0/1 real items."""
    if squared:
        dist, scale = sq * w, (target_norm ** 2 * w).sum(1) / w.sum(1) + 1e-12
    else:
        dist, scale = torch.sqrt(sq + 1e-12) * w, (target_norm * w).sum(1) / w.sum(1) + 1e-12
    return dist.sum(1) / w.sum(1) / scale


def _params_distance(pred_params, target_params, params_weight: float = 1.0):
    num = sum(((pred_params[k] - target_params[k]) ** 2).flatten(1).sum(1) for k in target_params)
    den = sum((target_params[k] ** 2).flatten(1).sum(1) for k in target_params) + 1e-12
    return params_weight * num / den


def _guess_embeddings(num_users: int, dim: int, seed: int, user_ids) -> torch.Tensor:
    """Algorithm 1's stand-in for the unknown embeddings: ``N(0, I)`` per user from its own generator."""
    ids = torch.arange(num_users, device="cpu") if user_ids is None else torch.as_tensor(user_ids).flatten()
    return torch.stack([torch.randn(dim, generator=user_generator(seed, u, -1 % 2**31), device="cpu") for u in ids.tolist()])


def _restarts(rows, num_users: int) -> int:
    """``R`` when ``rows`` is every user once per restart (``0..U-1`` repeated ``R`` times), else 0."""
    k = rows.numel()
    return k // num_users if k % num_users == 0 and torch.equal(rows, torch.arange(num_users, device=rows.device).repeat(k // num_users)) else 0


def _rows_matvec(T, rows, v):
    """``T[rows] @ v`` per row: ``T`` [U, m, d], ``rows`` [k] user indices, ``v`` [k, d] -> [k, m].
    When ``rows`` is every user once per restart (``0..U-1`` repeated, the usual case while all
    candidates are running) ``T`` is broadcast over the restarts instead of gathered."""
    R = _restarts(rows, T.shape[0])
    if R:
        return torch.einsum("umd,rud->rum", T, v.reshape(R, T.shape[0], -1)).reshape(rows.numel(), -1)
    return torch.einsum("kmd,kd->km", T[rows], v)


def _rows_tmatmul(T, rows, a):
    """``a^T @ T[rows]`` per row: ``T`` [U, m, d], ``a`` [k, m, h] -> [k, h, d], broadcasting ``T`` over
    the restarts as :func:`_rows_matvec` does."""
    R = _restarts(rows, T.shape[0])
    if R:
        return torch.einsum("rumh,umd->ruhd", a.reshape(R, T.shape[0], *a.shape[1:]), T).reshape(rows.numel(), a.shape[2], -1)
    return a.transpose(1, 2) @ T[rows]


def raifle_fcf(X, updates, mask, *, estimate_embedding: bool = True, guess_emb=None,
               alpha: float = 0.0, user_lr: float = 1.0, clip_norm: float | None = None, squared: bool = False,
               coord_mask=None, **kwargs) -> RaifleResult:
    """RAIFLE on FCF (Table 3, rows "FCF"). ``X`` [U, m, d] the users' items, ``updates`` [U, m, d]
    their (possibly noised/pruned) item updates, ``mask`` [U, m].

    ``estimate_embedding=True``: Algorithm 2 (joint estimate of ``e_u``); ``False``: Algorithm 1
    with the server's guess ``guess_emb`` [U, d] (default: an N(0, 1) draw per user,
    :func:`user_generator`) standing in for the unknown private embedding. ``alpha``, ``user_lr``: the
    simulated user's FCF confidence weight and learning rate (the model attacked, not the attack's
    optimiser). ``clip_norm``: the users' clipping norm, reproduced inside the simulated ``g``.
    ``coord_mask`` [U, m, d] (bool, optional): the coordinates the update carries when the users pruned
    it (:func:`fedlab.privacy.defenses.prune_rows`; a server reads them off the zeros it receives): the
    attacker who knows the defense matches only those, ``||M (rho_i e - G_i)||``, instead of asking its
    dense simulation to reproduce the zeros (the loss keeps its scale, the received update's row norms, which
    a pruned update carries on the mask alone). Other keywords go to :func:`raifle` (``budget``, ``seed``,
    ``user_ids``, ``device`` -- default ``FEDLAB_DEVICE`` here --, ...). Raises ``ValueError`` for
    mismatched shapes, a negative ``alpha``, or ``coord_mask`` with ``clip_norm`` (not supported).
    """
    U, m, d = X.shape
    if updates.shape != X.shape or mask.shape != (U, m):
        raise ValueError(f"updates must be {tuple(X.shape)} and mask {(U, m)}, got "
                         f"{tuple(updates.shape)}, {tuple(mask.shape)}")
    if coord_mask is not None and (tuple(coord_mask.shape) != tuple(X.shape) or clip_norm is not None):
        raise ValueError(f"coord_mask must be {tuple(X.shape)} and is not supported with clip_norm, got "
                         f"{tuple(coord_mask.shape)}, clip_norm={clip_norm}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if not estimate_embedding and guess_emb is None:
        guess_emb = _guess_embeddings(U, d, kwargs.get("seed", 0), kwargs.get("user_ids"))
    dev = kwargs["device"] = _device(kwargs.get("device"))           # FEDLAB_DEVICE unless given
    X, updates, mask = X.to(dev), updates.to(dev), mask.to(dev)
    guess_emb = None if guess_emb is None else guess_emb.to(dev)

    w = mask.to(X.dtype)
    G = updates.double()
    Mc = None
    if coord_mask is not None:                                    # the attacker matches the kept coordinates only
        Mc = coord_mask.to(device=dev, dtype=torch.float64)
        G = G * Mc
    G_sq = (G ** 2).sum(-1)                                       # [U, m] float64
    target_norm = updates.norm(dim=-1)

    def loss_fn(I, E, rows):
        # the simulated update is rho_i e (fcf_item_updates; rank one), so each row's squared distance
        # ||rho_i e - G_i||^2 = rho_i^2 ||e||^2 - 2 rho_i G_i.e + ||G_i||^2 needs G e and X e, never an
        # [m, d] prediction; float64 keeps the cancellation near a perfect match far below the loss
        Eu = E if estimate_embedding else guess_emb[rows]
        wr = w[rows]
        rho = user_lr * (1.0 + alpha * I) * (I - _rows_matvec(X, rows, Eu)) * wr
        e64 = Eu.double()
        e_sq = (e64 ** 2).sum(1, keepdim=True)
        rho = rho.double()
        if clip_norm is not None:                                  # clip_rows on the [m, d] update
            norm = torch.sqrt((rho ** 2).sum(1, keepdim=True) * e_sq)
            rho = rho * torch.clamp(clip_norm / (norm + 1e-12), max=1.0)
        # with a coordinate mask M: ||M (rho e - G)||^2 = rho^2 (M e^2) - 2 rho (M G) e + ||M G||^2
        e_sq_rows = e_sq if Mc is None else _rows_matvec(Mc, rows, e64 ** 2)
        sq = rho ** 2 * e_sq_rows - 2 * rho * _rows_matvec(G, rows, e64) + G_sq[rows]
        return _items_distance(sq.clamp_min(0).to(X.dtype), target_norm[rows], wr, squared)

    return raifle(loss_fn, U, m, dim=d if estimate_embedding else None, **kwargs)


def _fncf_projected_loss(model, theta, X, item_updates, param_updates, mask, *, guess_emb, use_model_params,
                         user_lr, items_clip_norm, params_clip_norm, squared, temperature: float = 0.0,
                         coord_mask=None):
    """:func:`matching_loss` of a simulated one-step FNCF update, computed in the row space of the
    first layer's item weights. The item update of item ``i`` is ``-lr W1x^T delta_i`` with
    ``delta_i`` in ``R^h1`` (:func:`fedlab.fl.recsys.interactions.fncf_backprop`), so it lies in the
    ``h1``-dimensional span of ``W1x^T = Q R``; splitting the target ``T_i`` into its coordinates
    ``Q^T T_i`` and the rest gives ``||dX_i - T_i||^2 = ||-lr R delta_i - Q^T T_i||^2 + ||T_i - Q Q^T
    T_i||^2`` exactly. The server computes ``X W1x^T``, ``Q^T T_i`` and the remainders once, so an
    evaluation touches ``[k, m, h1]`` tensors instead of ``[k, m, d]`` ones (h1 = 16, d = 64).
    ``temperature > 0`` simulates the smoothed network of :func:`fncf_backprop` (continuation).
    ``theta`` shared, or one network per user (every tensor ``[U, ...]``; then ``Q`` [U, d, h1] and
    ``R`` [U, h1, h1] per user, and each candidate row runs its user's network). ``coord_mask`` [U, m, d]
    (pruned updates, the attacker who knows the defense): the masked distance ``||M (dX_i - T_i)||`` has
    no such split, so the item update is formed in full, ``-lr delta_i W1x`` [k, m, d]."""
    d = X.shape[2]
    W1e, W1x, layers = fncf_first_layer(model, theta, d)
    per_user = W1x.dim() == 3
    Q, R = torch.linalg.qr(W1x.transpose(-1, -2))                 # W1x^T [(U,) d, h1] = Q [(U,) d, h1] R [(U,) h1, h1]
    w = mask.to(X.dtype)
    XW = X @ W1x.transpose(-1, -2)                                # [U, m, h1]
    coords = item_updates @ Q                                     # [U, m, h1]
    rest = ((item_updates - coords @ Q.transpose(-1, -2)) ** 2).sum(-1)   # [U, m]
    target_norm = item_updates.norm(dim=-1)
    Mc = None if coord_mask is None else coord_mask.to(X.dtype)

    def loss_fn(I, E, rows):
        Eu = E if guess_emb is None else guess_emb[rows]
        th = {k: v[rows] for k, v in theta.items()} if per_user else theta
        delta, _, grads = fncf_backprop(layers, th, XW[rows], Eu, I, w[rows],
                                        X=(lambda dl: _rows_tmatmul(X, rows, dl)) if use_model_params else None,
                                        temperature=temperature)
        if Mc is not None:                                        # pruned: only the kept coordinates are matched
            dX = -user_lr * (delta @ (W1x[rows] if per_user else W1x))                    # [k, m, d]
            sq = (((dX - item_updates[rows]) ** 2) * Mc[rows]).sum(-1)
            loss = _items_distance(sq, target_norm[rows], w[rows], squared)
        else:
            pred = -user_lr * (delta @ (R[rows] if per_user else R).transpose(-1, -2))   # coordinates of dX_i in the basis Q
            if items_clip_norm is not None:
                pred = clip_rows(pred, items_clip_norm)           # ||dX|| = ||pred||: Q is orthonormal
            loss = _items_distance(((pred - coords[rows]) ** 2).sum(-1) + rest[rows], target_norm[rows], w[rows], squared)
        if use_model_params:
            dT = {k: -user_lr * g for k, g in grads.items()}
            if params_clip_norm is not None:
                dT = clip_rows(dT, params_clip_norm)
            loss = loss + _params_distance(dT, {k: v[rows] for k, v in param_updates.items()})
        return loss

    return loss_fn


#: ReLU temperatures of :func:`raifle_fncf`'s continuation when it estimates the embedding: each
#: stage minimises the matching loss of the network with ``tau * softplus(a / tau)`` hidden units,
#: then the exact network (``tau = 0``) takes the last share of the budget
FNCF_CONTINUATION = (0.3, 0.1, 0.03, 0.01)


def raifle_fncf(model, theta, X, item_updates, param_updates, mask, *, variant: RaifleVariant = RaifleVariant(),
                user: FncfUser = FncfUser(), guess_emb=None, coord_mask=None, **kwargs) -> RaifleResult:
    """RAIFLE on FNCF (Table 3, rows "FNCF"). ``X`` [U, m, d], ``item_updates`` [U, m, d],
    ``param_updates`` {name: [U, ...]}, ``mask`` [U, m]; ``model, theta`` from
    :func:`fedlab.fl.recsys.interactions.fncf_init`; ``user`` (:class:`FncfUser`) the simulated users'
    local training (the model attacked, not the attack's optimiser), its clipping reproduced inside the
    simulation.

    ``variant`` (:class:`RaifleVariant`): ``use_model_params`` adds the parameter-update term to the loss;
    ``estimate_embedding`` switches between Algorithms 2 and 1 as in :func:`raifle_fcf`. Other keywords go
    to :func:`raifle` (``budget``, ``seed``, ``user_ids``, ``truth``, ``device`` -- default ``FEDLAB_DEVICE``
    here: where the simulation and L-BFGS run).

    ``variant.continuation``: ReLU temperatures (decreasing, > 0) of warm-up stages (:func:`raifle`'s
    ``warmup``), or ``None`` for none; ``"auto"`` (default) is :data:`FNCF_CONTINUATION` when the
    embedding is estimated, ``local_steps == 1`` and the budget gives every stage at least 10
    evaluations, else none. Why (our addition, not in the paper):
    the embedding enters an item's update through which hidden ReLUs are active, and the matching
    loss is piecewise smooth in it; inside one activation pattern a change of the embedding is
    absorbed by the interactions, so the exact loss's gradient says nothing about the right pattern
    and L-BFGS stops after a few dozen evaluations far above the loss at the truth. Smoothed ReLUs
    make the pattern visible to the gradient. Raises ``ValueError`` for a continuation with
    ``local_steps > 1``, or a ``variant`` or ``user`` of the wrong type.

    ``theta`` may hold one network per user (every tensor ``[U, ...]`` stacked on dim 0,
    :func:`fedlab.fl.recsys.interactions.fncf_per_user`; ``local_steps == 1`` only): user ``u``'s
    update then came from network ``u``, and one call attacks the same users under many network
    draws (:func:`fedlab.experiments.chapter3a.fncf_network_draws`). Raises ``ValueError`` for
    per-user networks with ``local_steps > 1`` or not ``U`` of them.

    ``coord_mask`` [U, m, d] (bool, optional): the coordinates of the item updates the users kept when
    they pruned them (:func:`fedlab.privacy.defenses.prune_rows`): the attacker who knows the defense
    matches only those (as :func:`raifle_fcf`). Needs ``local_steps == 1``; not supported with
    ``items_clip_norm`` (``ValueError``).
    """
    if not isinstance(variant, RaifleVariant) or not isinstance(user, FncfUser):
        raise ValueError(f"variant must be a RaifleVariant and user an FncfUser, got {type(variant).__name__}, "
                         f"{type(user).__name__}")
    estimate_embedding, use_model_params = variant.estimate_embedding, variant.use_model_params
    squared, continuation = variant.squared, variant.continuation
    user_lr, local_steps = user.lr, user.local_steps
    items_clip_norm, params_clip_norm = user.items_clip_norm, user.params_clip_norm
    U, m, d = X.shape
    if item_updates.shape != X.shape or mask.shape != (U, m):
        raise ValueError(f"item_updates must be {tuple(X.shape)} and mask {(U, m)}")
    if isinstance(theta, dict) and fncf_per_user(model, theta):
        if local_steps != 1 or any(v.shape[0] != U for v in theta.values()):
            raise ValueError(f"theta with one network per user needs local_steps == 1 and {U} networks, got "
                             f"local_steps={local_steps}, {next(iter(theta.values())).shape[0]} networks")
    if coord_mask is not None and (tuple(coord_mask.shape) != tuple(X.shape) or local_steps != 1
                                   or items_clip_norm is not None):
        raise ValueError(f"coord_mask must be {tuple(X.shape)}, with local_steps == 1 and no items_clip_norm; got "
                         f"{tuple(coord_mask.shape)}, local_steps={local_steps}, items_clip_norm={items_clip_norm}")
    if not estimate_embedding and guess_emb is None:
        guess_emb = _guess_embeddings(U, d, kwargs.get("seed", 0), kwargs.get("user_ids"))
    dev = kwargs["device"] = _device(kwargs.get("device"))           # FEDLAB_DEVICE unless given
    coord_mask = None if coord_mask is None else coord_mask.to(dev)
    X, item_updates, mask, model = X.to(dev), item_updates.to(dev), mask.to(dev), _model_on(model, dev)
    theta = {k: v.to(dev) for k, v in theta.items()} if isinstance(theta, dict) else theta.to(dev)
    param_updates = None if param_updates is None else {k: v.to(dev) for k, v in param_updates.items()}
    guess_emb = None if guess_emb is None else guess_emb.to(dev)
    if continuation == "auto":
        max_iter = getattr(kwargs.get("budget", RaifleBudget()), "max_iter", 0)   # raifle checks the budget
        continuation = (FNCF_CONTINUATION if estimate_embedding and local_steps == 1
                        and max_iter >= 10 * (len(FNCF_CONTINUATION) + 1) else None)
    temps = () if continuation is None else tuple(float(t) for t in continuation)
    if temps and local_steps != 1:
        raise ValueError("continuation needs local_steps == 1 (the written-out backward pass)")

    if local_steps == 1:
        def projected(temperature):
            return _fncf_projected_loss(model, theta, X, item_updates, param_updates, mask,
                                        guess_emb=None if estimate_embedding else guess_emb,
                                        use_model_params=use_model_params, user_lr=user_lr,
                                        items_clip_norm=items_clip_norm, params_clip_norm=params_clip_norm,
                                        squared=squared, temperature=temperature, coord_mask=coord_mask)
        return raifle(projected(0.0), U, m, dim=d if estimate_embedding else None,
                      warmup=[projected(t) for t in temps], **kwargs)

    def loss_fn(I, E, rows):
        Eu = E if estimate_embedding else guess_emb[rows]
        dX, dT, _ = fncf_updates(model, theta, X[rows], Eu, I, mask[rows], lr=user_lr,
                                 local_steps=local_steps, create_graph=True)
        if items_clip_norm is not None:
            dX = clip_rows(dX, items_clip_norm)
        if use_model_params:
            if params_clip_norm is not None:
                dT = clip_rows(dT, params_clip_norm)
            return matching_loss(dX, item_updates[rows], mask[rows], dT,
                                 {k: v[rows] for k, v in param_updates.items()}, squared=squared)
        return matching_loss(dX, item_updates[rows], mask[rows], squared=squared)

    return raifle(loss_fn, U, m, dim=d if estimate_embedding else None, **kwargs)


# ------------------------------------------------------------------------------- analytic FCF attack

def analytic_fcf_attack(updates, X, mask, *, lr: float = 1.0):
    """One-shot reconstruction of FCF interactions and user embeddings (no optimisation).

    Each user's update is ``lr (I - X e) e^T`` (``alpha = 0``): rank one, every row a multiple of
    ``e``. With the top singular triple ``(s, u, v)``, ``e = a v`` for an unknown scalar ``a`` and
    ``s u / lr = a I - a^2 X v``. Removing the known direction ``Xv`` leaves ``a`` times the
    projected interactions: the scores separate into a large cluster (the negatives, which
    outnumber the positives 4:1) and a small one; the sign of ``a`` makes the small cluster the
    high one (the rule "negatives outnumber positives"); with those 0/1 labels, ``s u`` is linear
    in ``(a, -a^2)``, least squares gives ``a``, and then ``I = s u / (lr a) + a X v`` exactly.

    Shapes: ``updates``, ``X`` [U, m, d], ``mask`` [U, m]. Returns ``(scores [U, m],
    interactions [U, m], user_emb [U, d])``; ``scores`` rank the items (higher = interacted).
    Raises ``ValueError`` on mismatched shapes.
    """
    if updates.shape != X.shape or mask.shape != updates.shape[:2]:
        raise ValueError(f"updates and X must both be [U, m, d] and mask [U, m]; got "
                         f"{tuple(updates.shape)}, {tuple(X.shape)}, {tuple(mask.shape)}")
    w = mask.to(updates.dtype)
    G = (updates / lr) * w[..., None]
    Xm = X * w[..., None]
    Uu, S, Vh = torch.linalg.svd(G, full_matrices=False)
    su = Uu[:, :, 0] * S[:, :1]                                     # [U, m]  = a I - a^2 X v
    v = Vh[:, 0, :]                                                 # [U, d]
    xv = torch.einsum("umd,ud->um", Xm, v)
    q = xv / (xv.norm(dim=1, keepdim=True) + 1e-12)
    proj = su - (su * q).sum(1, keepdim=True) * q                   # a * (I - (I.q) q)
    scores = torch.empty_like(proj)
    a_hat = torch.empty(proj.shape[0])
    for_users = range(proj.shape[0])
    for r in for_users:                                             # cheap 1-D work per user
        p = proj[r][mask[r]]
        sign = 1.0 if p.mean() >= p.median() else -1.0       # the minority lies on the mean's side
        s = sign * p
        # two clusters: the majority (negatives) low, the minority (positives) high
        thr = (s.median() + s.max()) / 2
        labels = (s > thr).to(s.dtype)
        # with the labels known, s u = a I - a^2 X v is linear in (a, -a^2): least squares for a
        A = torch.stack([labels, xv[r][mask[r]]], 1)
        coef = torch.linalg.lstsq(A, su[r][mask[r]][:, None]).solution
        a_hat[r] = coef[0, 0] if labels.sum() > 0 else sign * s.std()
        scores[r] = sign * proj[r]
    interactions = su / a_hat[:, None] + a_hat[:, None] * xv
    user_emb = a_hat[:, None] * v
    return scores * w, interactions * w, user_emb


# -------------------------------------------------------------------- App. A: closed form, convexity

def pointwise_l2_update(jac, f0, interactions):
    """The local update of a pointwise squared loss (RAIFLE App. A.2, eq. 8):
    ``g(I) = grad_theta ||I - f(X, theta)||^2 = -2 J^T (I - f0)`` with ``J = d f / d theta``.

    ``jac`` [m, p], ``f0`` [m] (the model's outputs), ``interactions`` [m] -> ``[p]``. Linear in
    the interactions, so ``d^2 g / dI^2 = 0`` (eq. 10).
    """
    if jac.dim() != 2 or f0.shape != (jac.shape[0],) or interactions.shape != f0.shape:
        raise ValueError(f"expected jac [m,p], f0 [m], interactions [m]; got {tuple(jac.shape)}, "
                         f"{tuple(f0.shape)}, {tuple(interactions.shape)}")
    return -2.0 * jac.T @ (interactions - f0)


def closed_form_interactions(jac, f0, theta_hat):
    """RAIFLE's closed-form solution (App. A.2, eq. 12):
    ``I' = f0 - 1/2 (J J^T)^{-1} J theta_hat``, valid iff ``rank(J) = m`` (so ``m <= p``).

    ``jac`` [m, p], ``f0`` [m], ``theta_hat`` [p] -> ``[m]``. Raises ``ValueError`` if ``J J^T`` is
    singular (rank < m), the case where Theorem 2 says the optimum is not unique.
    """
    m, p = jac.shape
    rank = int(torch.linalg.matrix_rank(jac))
    if rank < m:
        raise ValueError(f"rank(J) = {rank} < m = {m}: J J^T is singular and the attack has no "
                         "unique optimum (RAIFLE Thm. 2)")
    return f0 - 0.5 * torch.linalg.solve(jac @ jac.T, jac @ theta_hat)


def attack_hessian(jac):
    """Hessian of ``||theta_hat - g(I)||^2`` w.r.t. ``I`` for the pointwise-L2 ``g`` (App. A.1,
    eq. 7): ``2 (dg/dI)^T (dg/dI) = 8 J J^T``, ``[m, m]``; positive semi-definite (Thm. 1),
    definite iff ``rank(J) = m`` (Thm. 2)."""
    return 8.0 * jac @ jac.T


# ------------------------------------------------------------------------ experiment driver (Table 3)
