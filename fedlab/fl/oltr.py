"""Federated online learning to rank (OLTR) with FPDGD, written so the server can differentiate it.

RAIFLE (Pham, Kulkarni & Houmansadr, Sec. 2.3.1, 4.1.3, App. B.1) attacks FPDGD (Wang et al. 2021),
federated Pairwise Differentiable Gradient Descent (Oosterhuis & de Rijke 2018). Implemented here,
batched over users (every function takes a leading user dimension ``B``):

* rankers with a flat parameter vector ``theta`` [B, P]: linear (``hidden=()``, ``P = F``) and
  ReLU networks without biases (``hidden=(16, 8)``, RAIFLE Sec. 4.1.3): :func:`ranker_scores`;
* :func:`pdgd_gradient` -- the PDGD gradient of one query with the pair weights
  ``W = I (1 - I)^T`` of RAIFLE Sec. 4.1.3, which for 0/1 clicks selects the (clicked, not clicked)
  pairs and for ``I in [0, 1]`` is smooth in the clicks;
* :func:`local_update` -- a user's local training on ``Q`` queries (one PDGD ascent step per query,
  as FedAvg's local epochs) and its update ``theta_Q - theta_0``;
* cascade click models (:data:`CLICK_MODELS`, :func:`simulate_clicks`) with the navigational and
  informational parameters of Oosterhuis & de Rijke (2018) / Wang et al. (2021);
* Plackett-Luce sampling of the displayed list (:func:`present`), NDCG@k (:func:`ndcg_at_k`) and
  federated training with optional LDP (:func:`federated_oltr`, RAIFLE App. C.6, Table 8);
* :class:`OltrUsers` -- the simulated users' settings: what they are shown, how they click, how they train.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rounds import run_rounds

__all__ = ["CLICK_MODELS", "OltrUsers", "click_probabilities", "ranker_size", "RANKER_INITS", "init_rankers", "ranker_scores",
           "pdgd_pair_weights", "pdgd_gradient",
           "local_update", "present", "simulate_clicks", "ndcg_at_k", "evaluate_ndcg",
           "federated_oltr", "FedOLTRResult"]

#: (click probabilities, stop probabilities) per relevance grade, for 3-grade data (MQ2007) and
#: 5-grade data (MSLR). Cascade/dependent click models of Oosterhuis & de Rijke (2018, Table 1),
#: used by FPDGD (Wang et al. 2021) and RAIFLE (Sec. 4.1.2).
CLICK_MODELS = {
    3: {"perfect": ((0.0, 0.5, 1.0), (0.0, 0.0, 0.0)),
        "navigational": ((0.05, 0.5, 0.95), (0.2, 0.5, 0.9)),
        "informational": ((0.4, 0.7, 0.9), (0.1, 0.3, 0.5))},
    5: {"perfect": ((0.0, 0.2, 0.4, 0.8, 1.0), (0.0, 0.0, 0.0, 0.0, 0.0)),
        "navigational": ((0.05, 0.3, 0.5, 0.7, 0.95), (0.2, 0.3, 0.5, 0.7, 0.9)),
        "informational": ((0.4, 0.6, 0.7, 0.8, 0.9), (0.1, 0.2, 0.3, 0.4, 0.5))},
}


def click_probabilities(name: str, num_grades: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p_click [G], p_stop [G])`` of click model ``name`` for ``num_grades`` relevance grades.
    Raises ``ValueError`` for an unknown ``name`` or ``num_grades`` other than 3 or 5."""
    if num_grades not in CLICK_MODELS:
        raise ValueError(f"num_grades must be 3 or 5, got {num_grades}")
    if name not in CLICK_MODELS[num_grades]:
        raise ValueError(f"click model name must be one of {sorted(CLICK_MODELS[num_grades])}, got {name!r}")
    pc, ps = CLICK_MODELS[num_grades][name]
    return torch.tensor(pc), torch.tensor(ps)


# ----------------------------------------------------------------------------------------- rankers

@dataclass(frozen=True)
class OltrUsers:
    """The simulated FPDGD users of RAIFLE (Pham, Kulkarni & Houmansadr, Sec. 4.1.2-4.1.3, App. B.1): what
    they are shown, how they click and how they train. One settings object for the attacked round
    (:func:`fedlab.attacks.interaction_inference.oltr.make_oltr_case`) and federated training
    (:func:`federated_oltr`), so that a page shows the users in one line,
    ``OltrUsers(click_model="navigational", lr=0.1)``.

    ``click_model``
        the cascade click model (:data:`CLICK_MODELS`: ``"navigational"``, ``"informational"`` or
        ``"perfect"``); default ``"informational"``, that of RAIFLE's Figs. 6-7 and of federated training
        here (Tables 4, 5 and 8 report both models; the attacked round, ``make_oltr_case``, takes no default).
    ``k``
        documents displayed per query (Plackett-Luce sampled from the ranker, :func:`present`); default 10.
    ``lr``
        the user's PDGD step (:func:`local_update`), finite and ``> 0``; default ``0.1``, RAIFLE's.
    ``init``
        how a fresh ranker starts (:data:`RANKER_INITS`, :func:`init_rankers`); default ``"uniform"``.
    ``shuffle_queries``
        a user with several queries trains on them in a random order of its own (RAIFLE's code:
        ``random.sample`` of the user's lists), unknown to the server; default ``True``. A user with one
        query (:func:`federated_oltr`) is not affected.

    Raises ``ValueError`` naming the field for an unknown click model or ``init``, a ``k`` that is not a whole
    number ``>= 1``, an ``lr`` that is not finite and ``> 0``, or a ``shuffle_queries`` that is not a bool.
    """

    click_model: str = "informational"
    k: int = 10
    lr: float = 0.1
    init: str = "uniform"
    shuffle_queries: bool = True

    def __post_init__(self):
        if self.click_model not in CLICK_MODELS[3]:
            raise ValueError(f"OltrUsers.click_model must be one of {sorted(CLICK_MODELS[3])}, "
                             f"got {self.click_model!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"OltrUsers.k must be an integer >= 1, got {self.k!r}")
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ValueError(f"OltrUsers.lr must be a finite number > 0, got {self.lr!r}")
        if self.init not in RANKER_INITS:
            raise ValueError(f"OltrUsers.init must be one of {RANKER_INITS}, got {self.init!r}")
        if not isinstance(self.shuffle_queries, bool):
            raise ValueError(f"OltrUsers.shuffle_queries must be True or False, got {self.shuffle_queries!r}")


def _check_hidden(hidden) -> tuple:
    hidden = tuple(int(h) for h in hidden)
    if any(h < 1 for h in hidden):
        raise ValueError(f"hidden sizes must be >= 1, got {hidden}")
    return hidden


def ranker_size(num_features: int, hidden=()) -> int:
    """Number of parameters of a ranker: ``F`` (linear) or ``F h1 + h1 h2 + ... + h_last`` (ReLU
    network without biases, as RAIFLE's code). Raises ``ValueError`` for ``num_features < 1``."""
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    sizes = (num_features, *_check_hidden(hidden), 1)
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


#: how :func:`init_rankers` draws each parameter: ``"uniform"`` U(-1, 1) (RAIFLE's code,
#: ``gen_params``; "all model parameters ... are randomly initialized", Sec. 4.1.3) or ``"fan_in"``
#: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default for ``nn.Linear``)
RANKER_INITS = ("uniform", "fan_in")


def init_rankers(num_users: int, num_features: int, hidden=(), *, init: str = "uniform",
                 generator=None) -> torch.Tensor:
    """One random ranker per user, ``[num_users, P]`` ("we attacked each user once using a different
    random set of model parameters", RAIFLE Sec. 4.1.1). ``init="uniform"`` draws every parameter
    from U(-1, 1), as RAIFLE's reference code does; ``init="fan_in"`` draws layer ``k`` from
    ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's default for ``nn.Linear``; the scores are then
    ``sqrt(F)`` times smaller for the linear ranker). Both consume the same random numbers. Raises
    ``ValueError`` on bad sizes or an ``init`` outside :data:`RANKER_INITS`."""
    if num_users < 1:
        raise ValueError(f"num_users must be >= 1, got {num_users}")
    if init not in RANKER_INITS:
        raise ValueError(f"init must be one of {RANKER_INITS}, got {init!r}")
    ranker_size(num_features, hidden)
    sizes = (num_features, *_check_hidden(hidden), 1)
    parts = [(torch.rand(num_users, a * b, generator=generator) * 2 - 1) / (math.sqrt(a) if init == "fan_in" else 1.0)
             for a, b in zip(sizes[:-1], sizes[1:])]
    return torch.cat(parts, 1)


def _unpack(theta, num_features, hidden):
    sizes = (num_features, *hidden, 1)
    mats, i = [], 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        mats.append(theta[:, i:i + a * b].reshape(-1, a, b))
        i += a * b
    if i != theta.shape[1]:
        raise ValueError(f"theta has {theta.shape[1]} parameters, expected {i} for F={num_features}, "
                         f"hidden={hidden}")
    return mats


def _forward(theta, X, hidden):
    """Scores and the hidden activations (for the manual backward pass)."""
    mats = _unpack(theta, X.shape[-1], hidden)
    acts = [X]
    h = X
    for W in mats[:-1]:
        h = torch.relu(h @ W)
        acts.append(h)
    return (h @ mats[-1])[..., 0], acts, mats


def ranker_scores(theta: torch.Tensor, X: torch.Tensor, hidden=()) -> torch.Tensor:
    """Scores ``f(x)`` of every item: ``theta`` [B, P], ``X`` [B, n, F] -> ``[B, n]``."""
    hidden = _check_hidden(hidden)
    if X.dim() != 3 or theta.dim() != 2 or X.shape[0] != theta.shape[0]:
        raise ValueError(f"theta must be [B, P] and X [B, n, F]; got {tuple(theta.shape)}, {tuple(X.shape)}")
    return _forward(theta, X, hidden)[0]


def _vjp(acts, mats, v):
    """sum_i v_i d f(x_i) / d theta for the batched ReLU net, by hand (differentiable)."""
    grads = [None] * len(mats)
    delta = v[..., None]                                        # [B, n, 1]
    for k in range(len(mats) - 1, -1, -1):
        grads[k] = acts[k].transpose(1, 2) @ delta                # [B, in, out]
        if k > 0:
            delta = (delta @ mats[k].transpose(1, 2)) * (acts[k] > 0).to(delta.dtype)
    return torch.cat([g.flatten(1) for g in grads], 1)


# --------------------------------------------------------------------------------------------- PDGD

def pdgd_pair_weights(f: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``rho_ij * c_ij`` for every pair of displayed items (Oosterhuis & de Rijke 2018, eq. 9-13).

    ``c_ij = e^{f_i} e^{f_j} / (e^{f_i} + e^{f_j})^2`` is the derivative of ``P(i > j) =
    sigmoid(f_i - f_j)``; ``rho_ij = P(R*_ij) / (P(R) + P(R*_ij))`` the debiasing weight, with
    ``R*_ij`` the displayed ranking ``R`` with items ``i`` and ``j`` swapped (Plackett-Luce over the
    displayed items). ``f`` [B, n], ``mask`` [B, n] -> ``[B, n, n]`` (0 outside real pairs).
    """
    # Swapping the items at positions a < b changes only the Plackett-Luce denominators of the
    # positions a < k <= b: S_k = sum_{l >= k} e^{f_l} loses e^{f_b} and gains e^{f_a}. So
    # log P(R*_ab) - log P(R) = -sum_{a < k <= b} [log(S_k - e^{f_b} + e^{f_a}) - log S_k]  (O(n^3)).
    n = f.shape[-1]
    fm = torch.where(mask, f, torch.full_like(f, -1e4))
    e = torch.exp(fm - fm.amax(-1, keepdim=True).detach()) * mask
    S = e.flip(-1).cumsum(-1).flip(-1)                                   # [B, n]
    pos = torch.arange(n, device=f.device)
    win = (pos[:, None, None] < pos[None, None, :]) & (pos[None, None, :] <= pos[None, :, None])  # [a, b, k]
    inner = (S[:, None, None, :] - e[:, None, :, None]).clamp_min(0) + e[:, :, None, None]
    ok = win & (S[:, None, None, :] > 0)
    one = torch.ones_like(inner)
    T = torch.where(ok, torch.log(torch.where(ok, inner, one)) - torch.log(torch.where(ok, S[:, None, None, :].expand_as(inner), one)),
                    torch.zeros_like(inner))
    delta = -T.sum(-1)                                                    # [B, a, b], a < b
    delta = delta + delta.transpose(1, 2)
    log_rho = torch.nn.functional.logsigmoid(delta)                       # log P* - log(P + P*)
    fi, fj = f[:, :, None], f[:, None, :]
    log_c = fi + fj - 2 * torch.logaddexp(fi, fj)
    pair_mask = (mask[:, :, None] & mask[:, None, :]).to(f.dtype)
    return torch.exp(log_rho + log_c) * pair_mask


def pdgd_gradient(theta: torch.Tensor, X: torch.Tensor, I: torch.Tensor, mask: torch.Tensor,
                  hidden=()) -> torch.Tensor:
    """The FPDGD gradient of one query per user (RAIFLE Sec. 4.1.3), differentiable in ``I``.

    ``grad = sum_{i,j} W_ij rho_ij c_ij (grad f(x_i) - grad f(x_j))`` with ``W = I (1 - I)^T``
    (:func:`pdgd_pair_weights` for ``rho, c``). For 0/1 clicks this is PDGD over all (clicked, not
    clicked) pairs of the displayed list; for ``I`` in [0, 1] it is smooth (RAIFLE App. B.1).
    Written as one vector-Jacobian product ``J^T v`` with ``v_i = sum_j A_ij - sum_j A_ji``.

    Shapes: ``theta`` [B, P], ``X`` [B, n, F] (items in display order), ``I`` [B, n], ``mask``
    [B, n] bool (real items first) -> ``[B, P]`` (ascent direction). A query without real items
    gives 0. Raises ``ValueError`` on mismatched shapes.
    """
    hidden = _check_hidden(hidden)
    if X.dim() != 3 or I.shape != X.shape[:2] or mask.shape != I.shape or theta.shape[0] != X.shape[0]:
        raise ValueError(f"expected theta [B,P], X [B,n,F], I [B,n], mask [B,n]; got {tuple(theta.shape)}, "
                         f"{tuple(X.shape)}, {tuple(I.shape)}, {tuple(mask.shape)}")
    f, acts, mats = _forward(theta, X, hidden)
    Im = I * mask
    W = Im[:, :, None] * (1 - Im)[:, None, :]
    A = W * pdgd_pair_weights(f, mask)
    v = A.sum(2) - A.sum(1)
    return _vjp(acts, mats, v)


def local_update(theta0: torch.Tensor, X: torch.Tensor, I: torch.Tensor, mask: torch.Tensor,
                 hidden=(), *, lr: float = 0.1) -> torch.Tensor:
    """A user's local FPDGD training on ``Q`` queries and the update it sends, ``theta_Q - theta_0``.

    ``theta_q = theta_{q-1} + lr * pdgd_gradient(theta_{q-1}, X_q, I_q)`` (one ascent step per
    query, the multi-query setting of RAIFLE Sec. 4.1.1). Shapes: ``theta0`` [B, P], ``X``
    [B, Q, n, F], ``I`` [B, Q, n], ``mask`` [B, Q, n] -> ``[B, P]``. Queries without real items are
    skipped (padding). Differentiable in ``I`` (and ``X``). Raises ``ValueError`` for ``lr <= 0``
    or mismatched shapes.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if X.dim() != 4 or I.shape != X.shape[:3] or mask.shape != I.shape:
        raise ValueError(f"expected X [B,Q,n,F], I and mask [B,Q,n]; got {tuple(X.shape)}, "
                         f"{tuple(I.shape)}, {tuple(mask.shape)}")
    theta = theta0
    for q in range(X.shape[1]):
        if not bool(mask[:, q].any()):
            continue
        theta = theta + lr * pdgd_gradient(theta, X[:, q], I[:, q], mask[:, q], hidden)
    return theta - theta0


# ------------------------------------------------------------------------------- clicks and display

def present(theta: torch.Tensor, X_pool: torch.Tensor, mask_pool: torch.Tensor, hidden=(), *,
            k: int = 10, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample the displayed list from the ranker's Plackett-Luce distribution (PDGD's stochastic
    ranking; Gumbel top-k). ``theta`` [B, P], ``X_pool`` [B, M, F], ``mask_pool`` [B, M] ->
    ``(idx [B, k'], shown [B, k'])`` with ``k' = min(k, M)``: pool positions in display order and
    which are real documents. Raises ``ValueError`` for ``k < 1``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    with torch.no_grad():
        f = ranker_scores(theta, X_pool, hidden)
        u = torch.rand(f.shape, generator=generator).clamp_min(1e-12)
        keys = torch.where(mask_pool, f - torch.log(-torch.log(u)), torch.full_like(f, -math.inf))
        kk = min(k, X_pool.shape[1])
        top = keys.topk(kk, dim=1)
    return top.indices, torch.isfinite(top.values)


def simulate_clicks(relevance: torch.Tensor, mask: torch.Tensor, click_model: str = "navigational",
                    *, num_grades: int = 3, redraw: bool = True, max_redraws: int = 1000,
                    generator=None) -> torch.Tensor:
    """Cascade clicks on displayed lists (RAIFLE Sec. 4.1.2): the user scans from the top, clicks
    item ``k`` with probability ``p_click[rel_k]``, and after a click stops with probability
    ``p_stop[rel_k]``. With ``redraw`` a list where all or no real items were clicked is drawn
    again (as RAIFLE's code does), so every list has a (clicked, not clicked) pair.

    ``relevance`` [B, n] int, ``mask`` [B, n] bool -> clicks ``[B, n]`` float 0/1. Raises
    ``ValueError`` for an unknown click model, relevance outside ``0..num_grades-1``, or (with
    ``redraw``) a list with fewer than 2 real items, a list that can never get a (clicked, not
    clicked) pair under the click model, or one that still lacks it after ``max_redraws`` draws.
    """
    pc, ps = click_probabilities(click_model, num_grades)
    if relevance.shape != mask.shape:
        raise ValueError(f"relevance and mask must have the same shape, got {tuple(relevance.shape)}, "
                         f"{tuple(mask.shape)}")
    if bool(((relevance < 0) | (relevance >= num_grades))[mask].any()):
        raise ValueError(f"relevance must be in 0..{num_grades - 1}")
    if redraw and bool((mask.sum(1) < 2).any()):
        raise ValueError("mask: every list needs at least 2 real items when redraw=True")
    rel = relevance.clamp(0, num_grades - 1)
    p_c, p_s = pc[rel], ps[rel]
    if redraw:
        never = ((p_c == 0) | ~mask).all(1)                          # no real item can be clicked
        always = (((p_c == 1) & (p_s == 0)) | ~mask).all(1)          # every real item is clicked
        if bool((never | always).any()):
            bad = torch.nonzero(never | always).flatten().tolist()
            raise ValueError(f"relevance: lists {bad[:5]} can never have a (clicked, not clicked) pair under "
                             f"click model {click_model!r} (all real items clicked with probability 0, or "
                             f"all with probability 1); use redraw=False")

    def draw(rows):
        B, n = rows.shape[0], relevance.shape[1]
        r1 = torch.rand(B, n, generator=generator)
        r2 = torch.rand(B, n, generator=generator)
        clicks = torch.zeros(B, n)
        looking = torch.ones(B, dtype=torch.bool)
        for k in range(n):
            c = looking & mask[rows, k] & (r1[:, k] < p_c[rows, k])
            clicks[:, k] = c.float()
            looking = looking & ~(c & (r2[:, k] < p_s[rows, k]))
        return clicks

    rows = torch.arange(relevance.shape[0])
    clicks = draw(rows)
    if redraw:
        for _ in range(max_redraws):
            n_click = clicks.sum(1)
            bad = (n_click == 0) | (n_click == mask.sum(1))
            if not bool(bad.any()):
                break
            idx = rows[bad]
            clicks[idx] = draw(idx)
        else:
            n_click = clicks.sum(1)
            bad = (n_click == 0) | (n_click == mask.sum(1))
            if bool(bad.any()):
                raise ValueError(f"max_redraws: {int(bad.sum())} lists still lack a (clicked, not clicked) pair "
                                 f"after {max_redraws} redraws")
    return clicks


# ---------------------------------------------------------------------------------------- utility

def ndcg_at_k(scores: torch.Tensor, relevance: torch.Tensor, mask: torch.Tensor, k: int = 10) -> torch.Tensor:
    """NDCG@k per query with gain ``2^rel - 1`` and discount ``1 / log2(rank + 1)`` (Jarvelin &
    Kekalainen 2002; the metric of RAIFLE Table 8). Items are ranked by decreasing score (ties by
    position); a query without relevant documents scores 0. ``scores, relevance, mask`` [N, n] ->
    ``[N]``. Raises ``ValueError`` for ``k < 1``, mismatched shapes or non-finite real scores."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if scores.shape != relevance.shape or mask.shape != scores.shape:
        raise ValueError("scores, relevance and mask must have the same shape")
    if not bool(torch.isfinite(scores[mask]).all()):
        raise ValueError("scores must be finite on the real entries (mask)")
    gain = (2.0 ** relevance.double() - 1) * mask
    s = torch.where(mask, scores.double(), torch.full_like(scores.double(), -math.inf))
    order = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :k]
    disc = 1.0 / torch.log2(torch.arange(order.shape[1], dtype=torch.float64) + 2)
    dcg = (gain.gather(1, order) * disc).sum(1)
    ideal = (torch.sort(gain, dim=1, descending=True).values[:, :k] * disc).sum(1)
    return torch.where(ideal > 0, dcg / torch.where(ideal > 0, ideal, torch.ones_like(ideal)),
                       torch.zeros_like(ideal))


def evaluate_ndcg(theta: torch.Tensor, data, hidden=(), k: int = 10) -> float:
    """Mean NDCG@k of one ranker ``theta`` [P] over all queries of ``data``
    (:class:`fedlab.data.letor.LTRData`)."""
    with torch.no_grad():
        f = ranker_scores(theta[None].expand(len(data), -1), data.X, hidden)
    return float(ndcg_at_k(f, data.relevance, data.mask, k).mean())


@dataclass
class FedOLTRResult:
    """``theta`` [P] the final global ranker; ``rounds`` and ``ndcg`` the test NDCG@10 history."""

    theta: torch.Tensor
    rounds: list
    ndcg: list


def federated_oltr(train, test, hidden=(), *, users: OltrUsers = OltrUsers(), num_rounds: int = 50,
                   clients_per_round: int = 100, ldp=None, clip_norm: float | None = None, eval_every: int = 10,
                   seed: int = 0) -> FedOLTRResult:
    """FPDGD federated training (Wang et al. 2021; RAIFLE App. C.6): every round
    ``clients_per_round`` users each get one training query, see ``users.k`` documents sampled from the
    global ranker, click by ``users.click_model``, run :func:`local_update` (step ``users.lr``) on that query
    and, with ``ldp`` (:class:`fedlab.privacy.ldp.LdpGaussian`), release it through the local Gaussian
    mechanism of L2 sensitivity ``ldp.sensitivity`` (:func:`fedlab.privacy.ldp.ldp_gaussian`: clipped to
    ``sensitivity / 2``, noise for ``(epsilon, delta)``; RAIFLE sets ``Delta_2 = 0.5``); with ``ldp=None``
    (the column "infinity" of Table 8) the update is sent as it is, or clipped to ``clip_norm`` when given.
    The server adds the mean update. All clients of a round run as one batch. The global ranker starts
    from :func:`init_rankers` with ``users.init``.

    ``train``, ``test``: :class:`fedlab.data.letor.LTRData`. Returns :class:`FedOLTRResult` with
    test NDCG@``k`` every ``eval_every`` rounds (and at the end). Raises ``ValueError`` for
    non-positive sizes, ``users`` or ``ldp`` of the wrong type, or ``clip_norm`` together with ``ldp`` (the
    mechanism fixes its own clipping).
    """
    from ..privacy.ldp import LdpGaussian, clip_rows, ldp_gaussian

    if not isinstance(users, OltrUsers):
        raise ValueError(f"users must be an OltrUsers, got {type(users).__name__}: {users!r}")
    if ldp is not None and not isinstance(ldp, LdpGaussian):
        raise ValueError(f"ldp must be None or a fedlab.privacy.ldp.LdpGaussian, got {type(ldp).__name__}: {ldp!r}")
    if ldp is not None and clip_norm is not None:
        raise ValueError("clip_norm: with ldp the mechanism clips to sensitivity / 2; pass one of them")
    click_model, lr, k, init = users.click_model, users.lr, users.k, users.init
    if num_rounds < 1 or clients_per_round < 1 or eval_every < 1:
        raise ValueError(f"num_rounds, clients_per_round and eval_every must be >= 1, got "
                         f"{num_rounds}, {clients_per_round}, {eval_every}")
    gen = torch.Generator().manual_seed(seed)
    F = train.num_features
    theta = init_rankers(1, F, hidden, init=init, generator=gen)[0]
    ok = torch.nonzero(train.mask.sum(1) >= 2).flatten()

    def step(t, theta):
        q = ok[torch.randint(len(ok), (clients_per_round,), generator=gen)]
        th = theta[None].expand(clients_per_round, -1)
        idx, shown = present(th, train.X[q], train.mask[q], hidden, k=k, generator=gen)
        X = train.X[q[:, None], idx]
        rel = train.relevance[q[:, None], idx]
        clicks = simulate_clicks(rel, shown, click_model, num_grades=train.num_grades, generator=gen)
        with torch.no_grad():
            upd = local_update(th, X[:, None], clicks[:, None], shown[:, None], hidden, lr=lr)
        if ldp is not None:
            # RAIFLE's float mechanism (the paper's setting); not private on its float output, see chapter 5
            upd = ldp_gaussian(upd, ldp.epsilon, ldp.delta, ldp.sensitivity, generator=gen, safe=False)
        elif clip_norm is not None:
            upd = clip_rows(upd, clip_norm)
        return theta + upd.mean(0)

    theta, hist, _ = run_rounds(num_rounds, step, theta, eval_every=eval_every,
                                evaluate=lambda th: {"ndcg": evaluate_ndcg(th, test, hidden, k)})
    rounds, ndcg = hist["round"], hist["ndcg"]
    return FedOLTRResult(theta, rounds, ndcg)
