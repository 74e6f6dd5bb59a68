"""RAIFLE against federated online learning to rank, with active data manipulation (ADM).

Pham, Kulkarni & Houmansadr (RAIFLE): the OLTR server serves the result lists, so it knows every
displayed list ``X`` and the global ranker ``theta``; it receives a user's FPDGD update and searches
for clicks ``I'`` whose simulated update matches it (Sec. 3.2, Algorithm 1). Implemented here,
batched over users:

* :func:`make_oltr_case` -- honest users: random rankers, ``Q`` queries of <= 10 displayed documents
  each, cascade clicks, local FPDGD training (optionally on ADM-fingerprinted features);
* :func:`raifle_oltr` / :func:`attack_oltr` -- RAIFLE with the normalised squared L2 loss
  ``||g(X, theta, I') - update||^2 / ||update||^2`` and an L-BFGS per user (App. B.3), batched
  (:func:`fedlab.optim.lbfgs_rows`), reusing :func:`fedlab.attacks.interaction_inference.recsys.raifle`;
* :class:`Adm`, :func:`feature_allocation`, :func:`adm_fingerprint` -- ADM by fingerprinting (Sec. 3.3, Fig. 3):
  disjoint feature blocks per query, the rest zeroed (or filled with server-known Gaussian noise,
  the noisy ADM of App. C.5);
* :func:`sa_bypass_features`, :func:`sa_recover` -- bypassing secure aggregation (Sec. 3.4.2, Fig. 4);
* :func:`pir_fingerprint`, :func:`pir_detect` -- bypassing PIR (Sec. 3.4.3);
* :func:`dead_features`, :func:`flag_dead_features` -- the data-validation countermeasure of Sec. 5.1.

The sweeps of Sec. 4 as chapter 3c runs them live in :mod:`fedlab.experiments.chapter3c`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ...config import device as _device
from ...fl.oltr import OltrUsers, init_rankers, local_update, ranker_size, present, simulate_clicks
from ...metrics import roc_auc_rows
from ...privacy.clipping import clip_rows
from .recsys import RaifleResult, raifle

__all__ = ["OltrCase", "Adm", "feature_allocation", "adm_fingerprint", "adm_noise_replacement", "adm_weight_blocks", "make_oltr_case", "in_order",
           "cat_cases",
           "oltr_matching_loss", "raifle_oltr", "attack_oltr", "sa_bypass_features", "sa_recover",
           "first_layer_mask", "pir_fingerprint", "pir_detect", "dead_features", "flag_dead_features"]


@dataclass
class OltrCase:
    """One round of federated OLTR for ``U`` users, as the server sees it plus the ground truth.

    ``theta0`` [U, P] the ranker each user starts from; ``X`` [U, Q, n, F] the features each user
    trained on (display order; after ADM if any); ``mask`` [U, Q, n] real documents; ``I``
    [U, Q, n] the private 0/1 clicks; ``relevance`` [U, Q, n]; ``update`` [U, P] what each user
    sent; ``hidden``, ``lr`` the local algorithm; ``num_queries`` [U] real queries per user;
    ``group`` [U] an integer label of the configuration each row belongs to; ``order`` [U, Q] the
    order in which each user trained on its queries (row ``u`` lists positions of ``X[u]``; padding
    last), which the server does not see.
    """

    theta0: torch.Tensor
    X: torch.Tensor
    mask: torch.Tensor
    I: torch.Tensor
    relevance: torch.Tensor
    update: torch.Tensor
    hidden: tuple
    lr: float
    num_queries: torch.Tensor
    group: torch.Tensor
    order: torch.Tensor

    def __len__(self) -> int:
        return int(self.theta0.shape[0])

    def subset(self, idx) -> "OltrCase":
        idx = torch.as_tensor(idx, dtype=torch.long)
        return replace(self, theta0=self.theta0[idx], X=self.X[idx], mask=self.mask[idx], I=self.I[idx],
                       relevance=self.relevance[idx], update=self.update[idx],
                       num_queries=self.num_queries[idx], group=self.group[idx], order=self.order[idx])


def feature_allocation(num_queries: torch.Tensor, max_queries: int, num_features: int) -> torch.Tensor:
    """ADM's disjoint feature blocks (RAIFLE Sec. 3.3, Fig. 3): for a user with ``q`` queries,
    feature ``j`` is allocated to query ``floor(j q / F)`` (contiguous, equal-as-possible blocks).
    ``num_queries`` [U] int -> ``[U, max_queries, F]`` bool. Raises ``ValueError`` if a count is < 1,
    exceeds ``max_queries`` or ``num_features``."""
    nq = torch.as_tensor(num_queries, dtype=torch.long).reshape(-1)
    if bool((nq < 1).any()) or bool((nq > max_queries).any()) or bool((nq > num_features).any()):
        raise ValueError(f"num_queries must be in 1..min(max_queries, num_features), got {nq.tolist()}")
    block = (torch.arange(num_features)[None, :] * nq[:, None]) // num_features       # [U, F]
    return block[:, None, :] == torch.arange(max_queries)[None, :, None]


def adm_fingerprint(X: torch.Tensor, mask: torch.Tensor, *, noise_std: float = 0.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Active data manipulation by fingerprinting (RAIFLE Sec. 3.3-3.4.1, Fig. 3; App. C.5).

    Each of a user's real queries keeps only its own block of features (:func:`feature_allocation`);
    the other features are set to 0, or with ``noise_std > 0`` to ``N(0, noise_std^2)`` noise drawn
    (and remembered) by the server. ``X`` [U, Q, n, F], ``mask`` [U, Q, n] -> same shape; padding
    stays 0. Raises ``ValueError`` for ``noise_std < 0`` or mismatched shapes.
    """
    if noise_std < 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    if X.dim() != 4 or mask.shape != X.shape[:3]:
        raise ValueError(f"X must be [U, Q, n, F] and mask [U, Q, n]; got {tuple(X.shape)}, {tuple(mask.shape)}")
    nq = mask.any(2).sum(1)
    alloc = feature_allocation(nq, X.shape[1], X.shape[3])[:, :, None, :]            # [U, Q, 1, F]
    fill = torch.zeros_like(X) if noise_std == 0 else noise_std * torch.randn(X.shape, generator=generator)
    return torch.where(alloc, X, fill) * mask[..., None]


def adm_noise_replacement(X: torch.Tensor, mask: torch.Tensor, *, fraction: float = 1.0, std: float = 0.1,
                          generator: torch.Generator | None = None) -> torch.Tensor:
    """The active data manipulation of RAIFLE's reference code from commit 0c39b80 (2024-04-29) to its
    HEAD 7d1a33b (``code/experiment_ltr.ipynb``, "stealthiness parameter" ``alpha``), which the paper does
    not describe: in every displayed list, a random set of ``int(F * fraction)`` features (drawn anew per
    list) is replaced by ``N(0, std^2)`` noise that the server draws and remembers; the other features keep
    their real values. ``fraction = 1`` (the code's final setting) replaces every feature: the user then
    trains on pure server-chosen noise, and only its clicks are its own.

    ``X`` [U, Q, n, F], ``mask`` [U, Q, n] -> same shape; padding stays 0. Raises ``ValueError`` for
    ``fraction`` outside [0, 1], ``std < 0`` or mismatched shapes."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    if not std >= 0:
        raise ValueError(f"std must be >= 0, got {std!r}")
    if X.dim() != 4 or mask.shape != X.shape[:3]:
        raise ValueError(f"X must be [U, Q, n, F] and mask [U, Q, n]; got {tuple(X.shape)}, {tuple(mask.shape)}")
    U, Q, n, F = X.shape
    noise = std * torch.randn(X.shape, generator=generator)
    k = int(F * fraction)
    ranks = torch.rand(U, Q, F, generator=generator).argsort(-1).argsort(-1)        # a random permutation per list
    replaced = (ranks < k)[:, :, None, :]                                            # [U, Q, 1, F]
    return torch.where(replaced, noise, X) * mask[..., None]


def adm_weight_blocks(theta: torch.Tensor, num_queries, num_features: int, hidden, *, span: int = 2) -> torch.Tensor:
    """Parameter manipulation that RAIFLE's reference code adds to ADM for networks (its notebook
    ``experiment_ltr.ipynb``, "Neural net Manipulation for multiple queries"; the paper mentions
    manipulating "the item's training features and/or model parameters", Sec. 4.1.1, without
    details): the first hidden layer's units are split into ``Q`` contiguous blocks of
    ``hidden[0] // Q`` units (the remaining units are left alone), and unit block ``q`` keeps only
    its weights from the features allocated to query ``q`` (:func:`feature_allocation`); its other
    first-layer weights are set to 0. With ADM features, query ``q`` then activates only its own
    units (and the left-over ones), so the queries also separate in the second layer. ``span``:
    unit block ``q`` keeps the features of queries ``q, ..., q + span - 1`` (the reference's code
    keeps ``q`` and ``q + 1``: ``span=2``; ``span=1`` isolates every query).

    ``theta`` [U, P], ``num_queries`` [U] int -> [U, P]. Raises ``ValueError`` for a linear ranker
    (``hidden=()``), a wrong ``theta`` width, a count outside ``1..hidden[0]`` or ``span < 1``."""
    hidden = tuple(hidden)
    if not hidden:
        raise ValueError("hidden: weight blocks need a network (hidden=() is the linear ranker)")
    H = hidden[0]
    if theta.dim() != 2 or theta.shape[1] != ranker_size(num_features, hidden):
        raise ValueError(f"theta must be [U, {ranker_size(num_features, hidden)}], got {tuple(theta.shape)}")
    nq = torch.as_tensor(num_queries, dtype=torch.long).reshape(-1).expand(theta.shape[0])
    if bool((nq < 1).any()) or bool((nq > H).any()):
        raise ValueError(f"num_queries must be in 1..hidden[0]={H}, got {nq.tolist()}")
    if span < 1:
        raise ValueError(f"span must be >= 1, got {span}")
    Qm = int(nq.max())
    alloc = feature_allocation(nq, Qm, num_features)                                  # [U, Qm, F]
    for j in range(1, span):                                                          # blocks q .. q+span-1
        alloc = alloc | torch.cat([alloc[:, j:], torch.zeros_like(alloc[:, :j])], 1)
    unit_block = torch.arange(H)[None, :] // (H // nq)[:, None]                      # [U, H]
    owned = unit_block < nq[:, None]                                                  # units with a block
    keep_feat = alloc.gather(1, unit_block.clamp(max=Qm - 1)[:, :, None].expand(-1, -1, num_features))  # [U, H, F]
    keep = keep_feat | ~owned[:, :, None]                                             # [U, H, F]
    first = keep.transpose(1, 2).reshape(theta.shape[0], num_features * H)           # layout [F, H] row-major
    out = theta.clone()
    out[:, :num_features * H] = theta[:, :num_features * H] * first.to(theta.dtype)
    return out


@dataclass(frozen=True)
class Adm:
    """The server's active data manipulation of an OLTR round (RAIFLE, Pham, Kulkarni & Houmansadr, Sec. 3.3-3.4.1,
    Fig. 3; App. C.5): fingerprint the users' training features (:func:`adm_fingerprint`). ``Adm()`` is the
    paper's ADM; :func:`make_oltr_case` also takes ``adm=True`` for it and ``False`` for none.

    ``noise_std``
        ``>= 0``: the features outside a query's block are set to 0 (default ``0.0``, Sec. 3.3) or to
        ``N(0, noise_std^2)`` noise the server draws and remembers (the noisy ADM of App. C.5).
    ``weights``
        also zero first-layer weight blocks of each user's network (:func:`adm_weight_blocks`, RAIFLE's
        reference code; networks only); default ``False``.

    Raises ``ValueError`` naming the field for a ``noise_std`` that is negative or not finite, or a
    ``weights`` that is not a bool.
    """

    noise_std: float = 0.0
    weights: bool = False

    def __post_init__(self):
        v = self.noise_std
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"Adm.noise_std must be a finite number >= 0, got {v!r}")
        if not isinstance(self.weights, bool):
            raise ValueError(f"Adm.weights must be True or False, got {self.weights!r}")


def make_oltr_case(data, num_users: int, num_queries: int, hidden=(), *, users: OltrUsers,
                   adm: bool | Adm = False, group: int = 0, theta0: torch.Tensor | None = None,
                   manipulate=None, seed: int = 0) -> OltrCase:
    """Simulate one honest round for ``num_users`` users (RAIFLE Sec. 4.1.1).

    Each user gets its own random ranker (:func:`fedlab.fl.oltr.init_rankers` with ``users.init``) and
    ``num_queries`` distinct queries of ``data`` (:class:`fedlab.data.letor.LTRData`); for each
    query the server displays ``users.k`` documents sampled from the user's ranker (Plackett-Luce), the
    user clicks by the cascade ``users.click_model`` and trains with :func:`fedlab.fl.oltr.local_update`
    (step ``users.lr``; :class:`fedlab.fl.oltr.OltrUsers`). ``users`` has no default: RAIFLE attacks both
    click models (Tables 4, 5 and 8 report each), so every caller names the one it simulates.
    With ``users.shuffle_queries`` (RAIFLE's code: ``random.sample`` of the user's lists) the user trains
    on its queries in a random order of its own, which the server does not learn (``X``, ``I``,
    ``mask`` stay in the server's display order, the order is kept in ``order``); otherwise in
    display order. With ``adm`` (:class:`Adm`, or ``True`` for ``Adm()``) the server fingerprints the
    training features first (:func:`adm_fingerprint`, ``adm.noise_std``); ``adm.weights`` also zeroes
    first-layer weight blocks of each user's network (:func:`adm_weight_blocks`, RAIFLE's reference code).
    ``group`` labels the case's users (``OltrCase.group``) so that concatenated cases (:func:`cat_cases`)
    can be told apart. ``theta0`` [P] gives every user the same (global)
    ranker instead; ``manipulate(X, mask) -> X`` is any other server-side manipulation of the
    training features (e.g. :func:`sa_bypass_features`), applied after ADM. The order and the ADM
    noise are drawn after the lists and clicks, so switching them does not change the users.

    Raises ``ValueError`` for ``num_users < 1``, ``num_queries`` outside ``1..len(data)``, ``users`` or
    ``adm`` of the wrong type, or ADM weight blocks with a linear ranker.
    """
    if num_users < 1:
        raise ValueError(f"num_users must be >= 1, got {num_users}")
    if not isinstance(users, OltrUsers):
        raise ValueError(f"users must be a fedlab.fl.oltr.OltrUsers, got {type(users).__name__}: {users!r}")
    if isinstance(adm, bool):
        adm = Adm() if adm else None
    elif not isinstance(adm, Adm):
        raise ValueError(f"adm must be True, False or an Adm, got {type(adm).__name__}: {adm!r}")
    usable = torch.nonzero(data.mask.sum(1) >= 2).flatten()
    if not 1 <= num_queries <= len(usable):
        raise ValueError(f"num_queries must be in 1..{len(usable)}, got {num_queries}")
    adm_weights = adm is not None and adm.weights
    if adm_weights and not tuple(hidden):
        raise ValueError("Adm.weights: weight blocks need a network (hidden=() is the linear ranker)")
    click_model, k, lr, init, shuffle_queries = users.click_model, users.k, users.lr, users.init, users.shuffle_queries
    gen = torch.Generator().manual_seed(seed)
    F = data.num_features
    theta0 = (init_rankers(num_users, F, hidden, init=init, generator=gen) if theta0 is None
              else theta0.reshape(1, -1).expand(num_users, -1).clone())
    if adm_weights:
        theta0 = adm_weight_blocks(theta0, torch.full((num_users,), num_queries), F, hidden)
    q = usable[torch.rand(num_users, len(usable), generator=gen).argsort(1)[:, :num_queries]]   # [U, Q]
    th = theta0.repeat_interleave(num_queries, 0)
    qf = q.reshape(-1)
    idx, shown = present(th, data.X[qf], data.mask[qf], hidden, k=k, generator=gen)
    X = data.X[qf[:, None], idx] * shown[..., None]
    rel = data.relevance[qf[:, None], idx] * shown
    clicks = simulate_clicks(rel, shown, click_model, num_grades=data.num_grades, generator=gen)

    def shape(t):
        return t.reshape(num_users, num_queries, *t.shape[1:])

    X, rel, mask, I = shape(X), shape(rel), shape(shown), shape(clicks)
    if adm is not None:
        X = adm_fingerprint(X, mask, noise_std=adm.noise_std, generator=gen)
    if manipulate is not None:
        X = manipulate(X, mask)
    order = torch.arange(num_queries).expand(num_users, -1).clone()
    if shuffle_queries:
        order[:, :num_queries] = torch.rand(num_users, num_queries, generator=gen).argsort(1)
    with torch.no_grad():
        update = local_update(theta0, *in_order(order, X, I, mask), hidden, lr=lr)
    return OltrCase(theta0, X, mask, I, rel, update, tuple(hidden), lr,
                    torch.full((num_users,), num_queries), torch.full((num_users,), group), order)


def in_order(order: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each user's queries in its training order: ``order`` [U, Q] (positions along dim 1), every
    tensor ``[U, Q, ...]`` -> the same shapes, ``t[u, order[u]]``. Raises ``ValueError`` on a shape
    mismatch."""
    out = []
    for t in tensors:
        if t.shape[:2] != order.shape:
            raise ValueError(f"order must have shape {tuple(t.shape[:2])}, got {tuple(order.shape)}")
        out.append(t.gather(1, order.reshape(*order.shape, *([1] * (t.dim() - 2))).expand_as(t)))
    return out


def cat_cases(cases) -> OltrCase:
    """Concatenate cases with the same ranker, ``lr``, number of queries and list length."""
    c0 = cases[0]
    if any(c.hidden != c0.hidden or c.lr != c0.lr or c.X.shape[1:] != c0.X.shape[1:] for c in cases):
        raise ValueError("cases must share hidden, lr and the shape [Q, n, F]")
    cat = lambda name: torch.cat([getattr(c, name) for c in cases])
    return OltrCase(cat("theta0"), cat("X"), cat("mask"), cat("I"), cat("relevance"), cat("update"),
                    c0.hidden, c0.lr, cat("num_queries"), cat("group"), cat("order"))


def oltr_matching_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """RAIFLE's L2 loss, normalised per user: ``||pred - target||^2 / ||target||^2`` ([B, P] -> [B]).

    ``mask`` [B, P] bool (optional): compare only the coordinates marked True, in the numerator and the
    denominator (the attacker who knows which coordinates a pruned update withholds; RAIFLE App. C.4 does
    not model it). ``None`` (default) is RAIFLE's loss, computed exactly as without the argument.
    Raises ``ValueError`` if ``mask`` is not a bool tensor of ``target``'s shape."""
    if mask is None:
        return ((pred - target) ** 2).sum(1) / ((target ** 2).sum(1) + 1e-20)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != target.shape:
        raise ValueError(f"mask must be a bool tensor of shape {tuple(target.shape)}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    w = mask.to(pred.dtype)
    return (((pred - target) ** 2) * w).sum(1) / ((target ** 2 * w).sum(1) + 1e-20)


def raifle_oltr(case: OltrCase, update: torch.Tensor | None = None, *, clip_norm: float | None = None,
                coords: torch.Tensor | None = None, known_order: bool | torch.Tensor = False,
                mask: torch.Tensor | None = None, **kwargs) -> RaifleResult:
    """RAIFLE (Algorithm 1) on FPDGD for every user of ``case`` in one batched L-BFGS problem.

    ``update`` [U, P] replaces ``case.update`` (e.g. after LDP noise or SA recovery); ``clip_norm``: the
    users' clipping norm, reproduced in the simulated ``g``; ``coords`` [P] bool: match only these
    parameters (e.g. what :func:`sa_recover` can isolate for a network). The server simulates the
    user's training in display order, since it does not know the order the user trained in
    (``case.order``); ``known_order=True`` hands it that order (an oracle, to measure what not
    knowing it costs); a ``[U]`` bool tensor hands it to the users marked True only (the others are
    simulated in display order, bit for bit as with ``False``: one batch can hold both). Keywords go to
    :func:`fedlab.attacks.interaction_inference.recsys.raifle` (``budget``, ``seed``, ``user_ids``...): one L-BFGS per user run as a batch,
    with per-user random starts, so that each user is attacked as if alone (RAIFLE attacks users one
    by one) whatever else shares the batch.
    ``mask`` [U, P] bool: the coordinates of each user's update that the server compares
    (:func:`oltr_matching_loss`'s ``mask``): for a pruned update (RAIFLE App. C.4, Fig. 9) the attacker who
    knows the defense passes ``update != 0`` and ignores the withheld coordinates, where the paper's code
    asks its unpruned simulation for zeros there. With ``coords`` too, a coordinate is compared where
    both say so. ``None`` (default): every coordinate, bit for bit as without the argument.
    ``scores`` of the result are ``[U, Q n]`` (query-major), on the CPU; ``device=`` (default
    ``FEDLAB_DEVICE``) is where the simulation and L-BFGS run. Raises ``ValueError`` if ``update``
    has the wrong shape, or ``mask`` is not a ``[U, P]`` bool tensor.
    """
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    target = case.update if update is None else update
    if target.shape != case.update.shape:
        raise ValueError(f"update must be {tuple(case.update.shape)}, got {tuple(target.shape)}")
    U, Q, n, _ = case.X.shape
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or mask.shape != case.update.shape):
        raise ValueError(f"mask must be a bool tensor of shape {tuple(case.update.shape)}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    dev = kwargs["device"] = _device(kwargs.get("device"))           # FEDLAB_DEVICE unless given
    case = replace(case, X=case.X.to(dev), mask=case.mask.to(dev), theta0=case.theta0.to(dev),
                   order=case.order.to(dev))
    target = target.to(dev)
    coords = None if coords is None else torch.as_tensor(coords).to(dev)
    sent = None if mask is None else mask.to(dev)                    # the coordinates compared
    order = None                                                     # the order the server simulates
    if isinstance(known_order, torch.Tensor):
        told = known_order.to(device=dev, dtype=torch.bool).reshape(-1)
        if told.shape != (U,):
            raise ValueError(f"known_order must be a bool or a [U={U}] bool tensor, got shape {tuple(known_order.shape)}")
        if bool(told.any()):                                         # display order where not told
            order = torch.where(told[:, None], case.order, torch.arange(Q, device=dev).expand(U, Q))
    elif known_order:
        order = case.order

    def loss_fn(I, E, rows):
        X, Ir, mask = case.X[rows], I.reshape(-1, Q, n), case.mask[rows]
        if order is not None:
            X, Ir, mask = in_order(order[rows], X, Ir, mask)
        pred = local_update(case.theta0[rows], X, Ir, mask, case.hidden, lr=case.lr)
        if clip_norm is not None:
            pred = clip_rows(pred, clip_norm)
        m = None if sent is None else sent[rows]
        if coords is not None:
            return oltr_matching_loss(pred[:, coords], target[rows][:, coords], None if m is None else m[:, coords])
        return oltr_matching_loss(pred, target[rows], m)

    return raifle(loss_fn, U, Q * n, **kwargs)


def attack_oltr(case: OltrCase, update: torch.Tensor | None = None, *, clip_norm: float | None = None,
                coords: torch.Tensor | None = None, known_order: bool | torch.Tensor = False,
                knows_mask: bool | torch.Tensor = False, **kwargs) -> torch.Tensor:
    """Per-user AUC ``[U]`` of :func:`raifle_oltr`'s reconstruction over the user's real documents.

    ``knows_mask=True``: the attacker who knows that the update was pruned (RAIFLE App. C.4 attacks pruned
    updates without modelling it) compares only the coordinates the received update carries,
    ``mask = update != 0`` (:func:`raifle_oltr`'s ``mask``); a ``[U]`` bool tensor does so for the users
    marked True only, the others as with ``False`` (RAIFLE's loss over every coordinate), so both attackers
    can share one batch. Raises ``ValueError`` if ``knows_mask`` is neither a bool nor a ``[U]`` bool tensor."""
    target = case.update if update is None else update
    if isinstance(knows_mask, torch.Tensor):
        if knows_mask.dtype != torch.bool or knows_mask.shape != (len(case),):
            raise ValueError(f"knows_mask must be True, False or a [U={len(case)}] bool tensor, got "
                             f"{knows_mask.dtype} {tuple(knows_mask.shape)}")
        mask = (target != 0) | ~knows_mask.to(target.device)[:, None] if bool(knows_mask.any()) else None
    elif isinstance(knows_mask, bool):
        mask = (target != 0) if knows_mask else None
    else:
        raise ValueError(f"knows_mask must be True, False or a [U] bool tensor, got {knows_mask!r}")
    res = raifle_oltr(case, update, clip_norm=clip_norm, coords=coords, known_order=known_order, mask=mask, **kwargs)
    U = len(case)
    return roc_auc_rows(case.I.reshape(U, -1), res.scores, case.mask.reshape(U, -1))


# ------------------------------------------------------------------------------------- SA bypass

def sa_bypass_features(X: torch.Tensor, target: int, D: torch.Tensor) -> torch.Tensor:
    """Secure-aggregation bypass by ADM (RAIFLE Sec. 3.4.2, Fig. 4): the ``target`` user keeps only
    the features in ``D``, every other user only the features outside ``D``.
    ``X`` [G, ..., F], ``D`` [F] bool -> same shape as ``X``. Raises ``ValueError`` for a bad
    ``target`` or ``D`` shape."""
    if not 0 <= target < X.shape[0]:
        raise ValueError(f"target must be in 0..{X.shape[0] - 1}, got {target}")
    if D.shape != (X.shape[-1],) or D.dtype != torch.bool:
        raise ValueError(f"D must be a bool tensor of shape ({X.shape[-1]},)")
    keep = (~D).expand(X.shape[0], -1).clone()
    keep[target] = D
    return X * keep.reshape(X.shape[0], *([1] * (X.dim() - 2)), X.shape[-1]).to(X.dtype)


def first_layer_mask(D: torch.Tensor, hidden=()) -> torch.Tensor:
    """Which parameters touch the features ``D`` directly: the weights ``D`` (linear ranker) or
    the rows ``D`` of the first weight matrix (network). ``D`` [F] bool -> ``[P]`` bool."""
    F = D.shape[0]
    P = ranker_size(F, hidden)
    out = torch.zeros(P, dtype=torch.bool)
    width = hidden[0] if len(hidden) else 1
    out[:F * width] = D[:, None].expand(F, width).reshape(-1)
    return out


def sa_recover(aggregate: torch.Tensor, D: torch.Tensor, hidden=()) -> torch.Tensor:
    """The target's share of a securely aggregated sum after :func:`sa_bypass_features`: the
    coordinates of :func:`first_layer_mask` (every other user's update is exactly 0 there), the
    rest set to 0. For the linear ranker this is the target's whole update. ``aggregate`` [P] -> [P]."""
    m = first_layer_mask(D, hidden)
    if aggregate.shape != m.shape:
        raise ValueError(f"aggregate must have shape {tuple(m.shape)}, got {tuple(aggregate.shape)}")
    return aggregate * m.to(aggregate.dtype)


# ------------------------------------------------------------------------------------ PIR bypass

def pir_fingerprint(X: torch.Tensor, mask: torch.Tensor, item: torch.Tensor, feature: int, *,
                    value: float = 1.0) -> torch.Tensor:
    """PIR bypass by fingerprinting (RAIFLE Sec. 3.4.3): feature ``feature`` is set to ``value`` for
    the item of interest and to 0 for every other item. ``X`` [U, m, F] (each user's candidate
    pool), ``mask`` [U, m], ``item`` [U] position of the item of interest -> same shape as ``X``.
    Raises ``ValueError`` for ``feature`` out of range or ``value == 0``."""
    if not 0 <= feature < X.shape[-1]:
        raise ValueError(f"feature must be in 0..{X.shape[-1] - 1}, got {feature}")
    if value == 0:
        raise ValueError("value must be non-zero")
    X = X.clone()
    X[..., feature] = 0.0
    X[torch.arange(X.shape[0]), item, feature] = value
    return X * mask[..., None]


def pir_detect(update: torch.Tensor, feature: int, num_features: int, hidden=(), *,
               tol: float = 0.0) -> torch.Tensor:
    """Did the user train on the fingerprinted item? ``True`` where the parameters attached to
    ``feature`` moved by more than ``tol`` (any non-zero change without noise). ``update`` [U, P]
    -> ``[U]`` bool. Raises ``ValueError`` for ``feature`` outside ``0..num_features-1`` or
    ``tol < 0``."""
    if not 0 <= feature < num_features:
        raise ValueError(f"feature must be in 0..{num_features - 1}, got {feature}")
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    D = torch.zeros(num_features, dtype=torch.bool)
    D[feature] = True
    m = first_layer_mask(D, hidden)
    if update.shape[-1] != m.shape[0]:
        raise ValueError(f"update must have {m.shape[0]} parameters, got {update.shape[-1]}")
    return update[:, m].abs().amax(1) > tol


# ----------------------------------------------------------------------- countermeasure (Sec. 5.1)

def dead_features(X: torch.Tensor, mask: torch.Tensor, *, tol: float = 0.0) -> torch.Tensor:
    """Dead features of every displayed list: ``max_i |x_ij| <= tol`` over the list's real items.
    ``X`` [..., n, F], ``mask`` [..., n] -> ``[..., F]`` bool (all False for an empty list)."""
    if mask.shape != X.shape[:-1]:
        raise ValueError(f"mask must have shape {tuple(X.shape[:-1])}, got {tuple(mask.shape)}")
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    mag = (X.abs() * mask[..., None]).amax(-2)
    return (mag <= tol) & mask.any(-1)[..., None]


def flag_dead_features(X: torch.Tensor, mask: torch.Tensor, *, max_dead_fraction: float = 0.2,
                       tol: float = 0.0) -> torch.Tensor:
    """Client-side data validation (RAIFLE Sec. 5.1): refuse a round if any of its lists has more
    than ``max_dead_fraction`` of its features dead (:func:`dead_features`). ``X`` [U, Q, n, F],
    ``mask`` [U, Q, n] -> ``[U]`` bool (True = suspicious). Raises ``ValueError`` unless
    ``0 <= max_dead_fraction < 1``."""
    if not 0.0 <= max_dead_fraction < 1.0:
        raise ValueError(f"max_dead_fraction must be in [0, 1), got {max_dead_fraction}")
    frac = dead_features(X, mask, tol=tol).float().mean(-1)                           # [U, Q]
    return (frac > max_dead_fraction).any(-1)
