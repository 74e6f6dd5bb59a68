"""Federated recommendation with global item factors and private user vectors (London 2020, Section 3-4).

The server holds a catalog of ``I`` item vectors ``v_i`` (the *global* model, shape ``[I, k]``); every
client ``c`` keeps a private user vector ``u_c`` (the *local* model, shape ``[k]``) and binary labels
``y_{c,i}`` in {-1, +1} for the ``N`` items ``S_c`` it has rated. Predictions are ``sgn(u_c . v_i)`` and
the loss has the margin form ``l(y u.v)`` of Assumption 2.

Everything here is batched over users: a batch of ``C`` clients is a tensor ``user_vectors [C, k]``,
``items [C, N]`` (item indices of each ``S_c``) and ``y [C, N]``. One call to :func:`protocol1_client_update` runs
Protocol 1's CLIENTUPDATE for all ``C`` clients at once; :func:`protocol3_client_update` runs Protocol 3's.
A client's item deltas come back in the same sparse layout, ``[C, N, k]`` aligned with ``items``
(:func:`to_dense` scatters them into the ``[C, I, k]`` message of the paper).

Float64 is used throughout: the attacks of :mod:`fedlab.attacks.identifiability` compare signs of dot products.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...privacy.clipping import clip_rows
from ...privacy.defenses import gaussian_noise
from ..rounds import run_rounds

__all__ = ["LOSSES", "COUNTEREXAMPLE_LOSSES", "margin_loss", "margin_loss_grad", "loss_derivative_at_zero", "RecData",
           "make_synthetic", "protocol1_client_update", "protocol3_client_update", "noisy_message", "to_dense",
           "touched_items", "prediction_error", "train_protocol1", "RecResult"]

#: the three margin losses of London 2020, Assumption 2
LOSSES = ("negative_margin", "hinge", "log")
#: a margin loss that breaks Assumption 2 (``l'(0) = 0``): the counterexample of the chapter
COUNTEREXAMPLE_LOSSES = ("squared_perceptron",)
DTYPE = torch.float64


def _check_loss(loss: str) -> None:
    if loss not in LOSSES + COUNTEREXAMPLE_LOSSES:
        raise ValueError(f"loss must be one of {LOSSES + COUNTEREXAMPLE_LOSSES}, got {loss!r}")


def margin_loss(z: torch.Tensor, loss: str = "log") -> torch.Tensor:
    """Auxiliary loss ``l(z)`` of the margin ``z = y u.v`` (London 2020, Assumption 2), elementwise.

    * ``"negative_margin"``: ``l(z) = -z``;
    * ``"hinge"``: ``l(z) = max(0, 1 - z)``;
    * ``"log"``: ``l(z) = ln(1 + e^{-z})`` (binary cross-entropy);
    * ``"squared_perceptron"``: ``l(z) = max(0, -z)^2``, a margin loss with ``l'(0) = 0`` that breaks
      Assumption 2 (not in :data:`LOSSES`).

    Raises ``ValueError`` for an unknown ``loss``.
    """
    _check_loss(loss)
    z = torch.as_tensor(z)
    if loss == "negative_margin":
        return -z
    if loss == "hinge":
        return torch.clamp(1.0 - z, min=0.0)
    if loss == "squared_perceptron":
        return torch.clamp(-z, min=0.0) ** 2
    return torch.nn.functional.softplus(-z)


def margin_loss_grad(z: torch.Tensor, loss: str = "log") -> torch.Tensor:
    """Derivative ``l'(z)`` in closed form, elementwise (the hinge uses the subgradient 0 at ``z = 1``).

    Raises ``ValueError`` for an unknown ``loss``.
    """
    _check_loss(loss)
    z = torch.as_tensor(z)
    if loss == "negative_margin":
        return -torch.ones_like(z)
    if loss == "hinge":
        return -(z < 1.0).to(z.dtype)
    if loss == "squared_perceptron":
        return -2.0 * torch.clamp(-z, min=0.0)
    return -torch.sigmoid(-z)


def loss_derivative_at_zero(loss: str = "log") -> float:
    """``l'(0)`` computed by automatic differentiation of :func:`margin_loss` (Assumption 2 needs it
    non-zero): -1 for the negative margin and hinge losses, -1/2 for the log loss."""
    _check_loss(loss)
    z = torch.zeros((), dtype=DTYPE, requires_grad=True)
    (g,) = torch.autograd.grad(margin_loss(z, loss), z)
    return float(g)


@dataclass
class RecData:
    """A synthetic federated recommendation problem (shapes: ``C`` users, ``I`` items, ``N`` rated).

    Attributes
    ----------
    item_vectors : ``[I, k]`` ground-truth item factors (used to generate labels; the federation
        learns its own).
    user_vectors : ``[C, k]`` ground-truth user factors.
    labels : ``[C, I]`` preference labels in {-1, +1} for the whole catalog.
    items : ``[C, N]`` long, the rated items ``S_c`` of each user (distinct within a row).
    y : ``[C, N]`` the labels of the rated items, ``labels.gather(1, items)``.
    """

    item_vectors: torch.Tensor
    user_vectors: torch.Tensor
    labels: torch.Tensor
    items: torch.Tensor
    y: torch.Tensor
    meta: dict = field(default_factory=dict)

    @property
    def num_users(self) -> int:
        return self.items.shape[0]

    @property
    def num_items(self) -> int:
        return self.labels.shape[1]

    @property
    def num_rated(self) -> int:
        return self.items.shape[1]

    @property
    def pref_rate(self) -> torch.Tensor:
        """``p_c`` of Assumption 1: the fraction of liked items in ``S_c``, shape ``[C]``."""
        return (self.y > 0).to(DTYPE).mean(dim=1)


def make_synthetic(num_users: int, num_items: int, dim: int, num_rated: int, pref_rate, *,
                   exact_rate: bool = True, seed: int = 0) -> RecData:
    """Generate users, a catalog and like/dislike labels from a low-rank model with a bias coordinate.

    Item ``i`` has ``v_i = (g_i, 1)`` with ``g_i ~ N(0, I_{k-1}/(k-1))``; user ``c`` has
    ``u_c = (w_c, b_c)`` with ``w_c ~ N(0, I_{k-1})`` and ``b_c`` chosen as a quantile so that the user
    likes a fraction ``pref_rate[c]`` of the catalog; ``labels = sgn(u_c . v_i)``. With
    ``exact_rate=True``, ``S_c`` holds exactly ``round(p_c N)`` liked items (drawn at random among the
    user's likes, the rest among the dislikes), so Assumption 1 holds with the stated ``p_c``;
    otherwise ``S_c`` is a uniform sample of the catalog.

    ``pref_rate`` is a float or a tensor ``[num_users]`` with values in ``(0, 1/2)``.

    Raises ``ValueError`` naming the argument for non-positive sizes, ``num_rated > num_items``,
    ``pref_rate`` outside ``(0, 1/2)`` or of the wrong shape, or too few likes/dislikes in the catalog.
    """
    for name, val in [("num_users", num_users), ("num_items", num_items), ("dim", dim),
                      ("num_rated", num_rated)]:
        if int(val) < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    if dim < 2:
        raise ValueError(f"dim must be >= 2 (one coordinate is the bias), got {dim}")
    if num_rated > num_items:
        raise ValueError(f"num_rated ({num_rated}) must be <= num_items ({num_items})")
    p = torch.as_tensor(pref_rate, dtype=DTYPE).reshape(-1)
    if p.numel() == 1:
        p = p.expand(num_users).clone()
    if p.numel() != num_users:
        raise ValueError(f"pref_rate must be a float or have num_users={num_users} entries, got {p.numel()}")
    if not bool(((p > 0) & (p < 0.5)).all()):
        raise ValueError(f"pref_rate must lie in (0, 1/2) (Assumption 1), got values in "
                         f"[{float(p.min()):.3g}, {float(p.max()):.3g}]")
    g = torch.Generator().manual_seed(int(seed))
    G = torch.randn(num_items, dim - 1, generator=g, dtype=DTYPE) / (dim - 1) ** 0.5
    V = torch.cat([G, torch.ones(num_items, 1, dtype=DTYPE)], dim=1)
    W = torch.randn(num_users, dim - 1, generator=g, dtype=DTYPE)
    scores = W @ G.T                                               # [C, I]
    # bias b_c: exactly a fraction p_c of the catalog gets scores + b_c > 0
    n_like = torch.clamp(torch.round(p * num_items).long(), 1, num_items - 1)
    srt = scores.sort(dim=1, descending=True).values
    above = srt.gather(1, (n_like - 1)[:, None]).squeeze(1)
    below = srt.gather(1, n_like[:, None]).squeeze(1)
    b = -(above + below) / 2
    U = torch.cat([W, b[:, None]], dim=1)
    labels = torch.where(U @ V.T > 0, 1.0, -1.0).to(DTYPE)
    keys = torch.rand(num_users, num_items, generator=g, dtype=DTYPE)
    if exact_rate:
        k_pos = torch.round(p * num_rated).long()
        n_pos = (labels > 0).sum(1)
        if bool((n_pos < k_pos).any()) or bool(((num_items - n_pos) < (num_rated - k_pos)).any()):
            raise ValueError("num_items is too small to draw S_c with the requested pref_rate")
        order = torch.argsort(keys + 2.0 * (labels < 0), dim=1)    # likes first, each part shuffled
        j = torch.arange(num_rated)[None, :]
        pos_in_order = torch.where(j < k_pos[:, None], j, n_pos[:, None] + (j - k_pos[:, None]))
        items = order.gather(1, pos_in_order)
    else:
        items = torch.argsort(keys, dim=1)[:, :num_rated]
    y = labels.gather(1, items)
    return RecData(V, U, labels, items, y, meta={"target_pref_rate": p, "seed": seed})


def _check_batch(user_vectors, item_vectors, items, y):
    if user_vectors.ndim != 2:
        raise ValueError(f"user_vectors must have shape [C, k], got {tuple(user_vectors.shape)}")
    C, k = user_vectors.shape
    if item_vectors.ndim not in (2, 3) or item_vectors.shape[-1] != k:
        raise ValueError(f"item_vectors must have shape [I, k] or [C, I, k] with k={k} (the user_vectors "
                         f"dimension), got {tuple(item_vectors.shape)}")
    if item_vectors.ndim == 3 and item_vectors.shape[0] != C:
        raise ValueError(f"item_vectors [C, I, k] must have C={C} rows, got {item_vectors.shape[0]}")
    if items.ndim != 2 or items.shape[0] != C:
        raise ValueError(f"items must have shape [C={C}, N], got {tuple(items.shape)}")
    if y.shape != items.shape:
        raise ValueError(f"y must have the shape of items {tuple(items.shape)}, got {tuple(y.shape)}")
    if int(items.max()) >= item_vectors.shape[-2] or int(items.min()) < 0:
        raise ValueError("items holds an index outside the catalog of item_vectors")
    return C, k


def _gather_items(item_vectors, items):
    if item_vectors.ndim == 2:
        return item_vectors[items]                                  # [C, N, k]
    return item_vectors.gather(1, items[..., None].expand(-1, -1, item_vectors.shape[-1]))


def _sgd_step(u, V_local, y, batch, lr, loss):
    """One step of Protocol 1 lines 10-12 for all users: ``batch [C, B]`` indexes into ``S_c``."""
    k = u.shape[1]
    bidx = batch[..., None].expand(-1, -1, k)
    vb = V_local.gather(1, bidx)                                    # [C, B, k]
    yb = y.gather(1, batch)                                         # [C, B]
    z = yb * torch.einsum("ck,cbk->cb", u, vb)                      # margins
    s = margin_loss_grad(z, loss) * yb                              # s_i = l'(y u.v) y, Eq. (1)-(2)
    g_u = torch.einsum("cb,cbk->ck", s, vb) / batch.shape[1]        # mean over the batch, Eq. (1)
    grad_v = s[..., None] * u[:, None, :]                           # Eq. (2)
    V_local.scatter_add_(1, bidx, -lr * grad_v)                     # in place on the client's copy
    return u - lr * g_u, V_local


def _client_start(user_vectors, item_vectors, items, y, batch_size, lr, loss):
    """Validate a CLIENTUPDATE call; returns ``(C, N, u [C, k], V0 [C, N, k], y [C, N])`` in float64,
    ``V0`` the received vectors of each client's rated items."""
    _check_loss(loss)
    C, _ = _check_batch(user_vectors, item_vectors, items, y)
    N = items.shape[1]
    if not 1 <= int(batch_size) <= N:
        raise ValueError(f"batch_size must be in [1, |S_c|={N}], got {batch_size}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    return C, N, user_vectors.to(DTYPE), _gather_items(item_vectors.to(DTYPE), items), y.to(DTYPE)


def protocol1_client_update(user_vectors: torch.Tensor, item_vectors: torch.Tensor, items: torch.Tensor,
                  y: torch.Tensor, *, local_steps: int, batch_size: int, lr: float, loss: str = "log",
                  generator: torch.Generator | None = None):
    """Protocol 1, CLIENTUPDATE (London 2020, Sec. 4.1), for ``C`` clients at once.

    Each client copies the received item vectors, then runs ``local_steps`` (``R``) SGD steps; each step
    samples a batch of ``batch_size`` (``B``) of its rated items uniformly *without* replacement (fresh
    for every step), computes the user gradient from Eq. (1) averaged over the batch, updates every
    item of the batch by Eq. (2) and then the user vector. ``local_steps = 0`` only pushes the model
    (the optional restore step of Protocol 2).

    Parameters
    ----------
    user_vectors : ``[C, k]`` the clients' private vectors ``u_c`` (not modified in place).
    item_vectors : ``[I, k]`` the global model the server sends (same for all) or ``[C, I, k]``.
    items, y : ``[C, N]`` rated items ``S_c`` and their labels in {-1, +1}.

    Returns
    -------
    (new_user_vectors ``[C, k]``, deltas ``[C, N, k]``): the updated local models and the change of each
    rated item vector (items outside ``S_c`` never change), the message of Protocol 1 line 13.

    Raises ``ValueError`` naming the argument on shape mismatches, ``batch_size`` outside
    ``[1, N]``, ``local_steps < 0``, ``lr <= 0`` or an unknown ``loss``.
    """
    if int(local_steps) < 0:
        raise ValueError(f"local_steps must be >= 0, got {local_steps}")
    C, N, u, V0, yd = _client_start(user_vectors, item_vectors, items, y, batch_size, lr, loss)
    V_local = V0.clone()
    for _ in range(int(local_steps)):
        keys = torch.rand(C, N, generator=generator, dtype=DTYPE)
        batch = keys.topk(int(batch_size), dim=1).indices          # B distinct items per client
        u, V_local = _sgd_step(u, V_local, yd, batch, lr, loss)
    return u, V_local - V0


def protocol3_client_update(user_vectors: torch.Tensor, item_vectors: torch.Tensor, items: torch.Tensor,
                         y: torch.Tensor, *, local_epochs: int, batch_size: int, lr: float, loss: str = "log",
                         generator: torch.Generator | None = None):
    """Protocol 3, CLIENTUPDATE (London 2020, Sec. 4.3 and App. A.4): SGD *without replacement*.

    For each of ``local_epochs`` (``E``) epochs every client shuffles ``S_c`` and splits it into
    ``R = N / B`` disjoint batches; each item is updated exactly once per epoch. Same shapes and
    return value as :func:`protocol1_client_update`.

    Raises ``ValueError`` if ``batch_size`` does not divide ``N`` (the paper assumes it does), and the
    errors of :func:`protocol1_client_update`.
    """
    if int(local_epochs) < 0:
        raise ValueError(f"local_epochs must be >= 0, got {local_epochs}")
    C, N, u, V0, yd = _client_start(user_vectors, item_vectors, items, y, batch_size, lr, loss)
    if N % int(batch_size):
        raise ValueError(f"batch_size must divide |S_c|={N}, got {batch_size}")
    V_local = V0.clone()
    B = int(batch_size)
    for _ in range(int(local_epochs)):
        perm = torch.argsort(torch.rand(C, N, generator=generator, dtype=DTYPE), dim=1)
        for r in range(N // B):
            u, V_local = _sgd_step(u, V_local, yd, perm[:, r * B:(r + 1) * B], lr, loss)
    return u, V_local - V0


def touched_items(deltas: torch.Tensor) -> torch.Tensor:
    """Mask ``[C, N]`` of the items whose vector changed (``v_i != v_i^(0)``) in a message ``[C, N, k]``."""
    return (deltas != 0).any(dim=-1)


def noisy_message(deltas: torch.Tensor, sigma: float, *, clip_norm: float | None = None,
                  generator: torch.Generator | None = None):
    """The corrupted message of London 2020, Eq. (3): add ``N(0, sigma^2 I_k)`` to the delta of every
    item whose vector changed, and send exactly zero for the items that did not change.

    With ``clip_norm = C`` each item's delta is first scaled to L2 norm at most ``C`` (the gradient
    clipping of the paper's footnote 5, which turns Eq. (3) into a Gaussian mechanism; see
    :func:`fedlab.privacy.ldp.ldp_noise_multiplier`). Clipping never turns a changed item into an
    unchanged one.

    ``deltas`` is ``[C, N, k]``; ``sigma`` a float or a ``[C]`` tensor (one noise level per client, to
    run several noise levels in one batch). Returns a new tensor of the same shape. Raises
    ``ValueError`` if ``sigma < 0`` or has the wrong shape, or ``clip_norm <= 0``.
    """
    sig = torch.as_tensor(sigma, dtype=deltas.dtype)
    if not bool((sig >= 0).all()):
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if sig.ndim > 1 or (sig.ndim == 1 and sig.shape[0] != deltas.shape[0]):
        raise ValueError(f"sigma must be a float or a [C={deltas.shape[0]}] tensor, got shape {tuple(sig.shape)}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    out = deltas.clone() if clip_norm is None else clip_rows(deltas.reshape(-1, deltas.shape[-1]),
                                                              float(clip_norm)).reshape(deltas.shape)
    if not bool((sig > 0).any()):
        return out
    mask = touched_items(deltas)
    scale = sig.expand(mask.shape[:1]) if sig.ndim == 1 else sig
    scale = scale.reshape(scale.shape + (1,) * (mask.ndim - scale.ndim)).expand(mask.shape)[mask]
    # draw noise only for the changed items (what is sent); the rest stays exactly zero
    out[mask] = gaussian_noise(out[mask], scale, generator=generator)
    return out


def to_dense(deltas: torch.Tensor, items: torch.Tensor, num_items: int) -> torch.Tensor:
    """Scatter the sparse message ``deltas [C, N, k]`` (aligned with ``items [C, N]``) into the paper's
    full message ``[C, I, k]`` over the catalog (zero for items outside ``S_c``)."""
    C, N, k = deltas.shape
    out = torch.zeros(C, num_items, k, dtype=deltas.dtype)
    return out.scatter_add(1, items[..., None].expand(-1, -1, k), deltas)


def prediction_error(user_vectors: torch.Tensor, item_vectors: torch.Tensor, labels: torch.Tensor,
                     items: torch.Tensor | None = None) -> torch.Tensor:
    """Fraction of items with ``sgn(u_c . v_i) != y_{c,i}``, per user ``[C]``.

    Over the whole catalog (``labels [C, I]``) or, with ``items [C, N]``, over those items only
    (``labels`` then ``[C, N]``). The error rate ``eta`` of London 2020, Proposition 1.
    """
    scores = user_vectors.to(DTYPE) @ item_vectors.to(DTYPE).T     # [C, I]
    if items is not None:
        scores = scores.gather(1, items)
    return (torch.sign(scores) != labels).to(DTYPE).mean(dim=1)


@dataclass
class RecResult:
    """Output of :func:`train_protocol1`: the learned global ``item_vectors [I, k]``, the clients'
    ``user_vectors [C, k]`` and ``history`` (lists ``round``, ``train_error``, ``catalog_error``)."""

    item_vectors: torch.Tensor
    user_vectors: torch.Tensor
    history: dict


def train_protocol1(data: RecData, *, num_rounds: int, clients_per_round: int, local_steps: int,
                    batch_size: int, lr: float, dim: int | None = None, loss: str = "log",
                    init_scale: float = 0.1, seed: int = 0) -> RecResult:
    """Honest federated training with Protocol 1 (London 2020, Sec. 4.1), server and clients.

    Each round the server samples ``clients_per_round`` clients, sends them the global item vectors,
    every selected client runs :func:`protocol1_client_update` (all of them in one batched call) and returns its
    item deltas; the server adds the *sum* of the deltas to the global model (Protocol 1, line 4).
    User vectors never leave the clients. ``dim`` defaults to the data's ``k``.

    ``history["train_error"]``: mean error on the clients' rated items; ``history["catalog_error"]``:
    mean error against the labels of the whole catalog (``eta`` of Proposition 1).
    """
    if not 1 <= clients_per_round <= data.num_users:
        raise ValueError(f"clients_per_round must be in [1, {data.num_users}], got {clients_per_round}")
    k = data.item_vectors.shape[1] if dim is None else int(dim)
    g = torch.Generator().manual_seed(int(seed))
    V = init_scale * torch.randn(data.num_items, k, generator=g, dtype=DTYPE)
    U = init_scale * torch.randn(data.num_users, k, generator=g, dtype=DTYPE)
    def step(t, state):
        U, V = state
        sel = torch.randperm(data.num_users, generator=g)[:clients_per_round]
        U_new, deltas = protocol1_client_update(U[sel], V, data.items[sel], data.y[sel], local_steps=local_steps,
                                      batch_size=batch_size, lr=lr, loss=loss, generator=g)
        return U.index_copy(0, sel, U_new), V.index_add(0, data.items[sel].reshape(-1), deltas.reshape(-1, k))

    def evaluate(state):
        U, V = state
        return {"train_error": float(prediction_error(U, V, data.y, data.items).mean()),
                "catalog_error": float(prediction_error(U, V, data.labels).mean())}

    (U, V), hist, _ = run_rounds(num_rounds, step, (U, V), evaluate=evaluate)
    return RecResult(V, U, hist)
