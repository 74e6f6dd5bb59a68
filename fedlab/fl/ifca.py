"""Clustered (personalized) federated learning: IFCA and its d-private variant.

* IFCA, the Iterative Federated Clustering Algorithm of Ghosh et al. (2020, model-averaging version):
  the server broadcasts ``k`` hypotheses; each sampled client picks the one with the lowest loss on
  its data, trains it locally and returns it; the server averages the returned models of the clients
  that picked hypothesis ``j`` into the new ``theta_j``.
* Galli et al., Algorithm 1: the same loop, but every client sanitises its model with SanitizeUpdate
  (Algorithm 2, the Euclidean Laplace mechanism of :mod:`fedlab.privacy.dprivacy`) and the server,
  which no longer trusts or sees the clients' choices, clusters the sanitised vectors with k-means
  (scikit-learn, initialised at the current hypotheses) and averages each cluster.

With ``num_clusters=1`` and no noise both reduce to FedAvg with unweighted averaging.

All sampled clients run in one ``vmap`` (:func:`fedlab.fl.clients_update` with a stacked start point,
one hypothesis per client), and the ``[K, k]`` matrix of local losses is computed in one batched call.
Parameters travel as flat vectors ``theta`` (``[n]``; ``[k, n]`` for the hypotheses).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ..models import flatten_stacked as stack_to_flat, get_params, squared_error
from ..models import unflatten_stacked as flat_to_stack
from ..privacy.dprivacy import DEFAULT_FP_SLACK, PrivacyAccountant, sanitize_update
from ..config import device as _device
from .local import ClientData, LocalTraining, _local, _model_on, clients_update, cross_entropy, stack_clients
from ._linear import dense_clients_update, dense_squared_losses, linear_fast_path, mlp_fast_path
from .rounds import History, run_rounds

__all__ = ["squared_error", "hypothesis_losses", "evaluate_hypotheses", "kmeans_clusters",
           "IFCARound", "IFCAResult", "Hypotheses", "DPrivacy", "Validation", "ifca", "private_ifca", "stack_to_flat", "flat_to_stack",
           "server_view", "early_stop_round"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _per_client_stats(model, like, hyps: torch.Tensor, data: ClientData, loss_fn):
    """Mean loss and mean correctness of every client under every hypothesis: two ``[K, k]``, on the
    CPU (computed where ``data`` lives)."""
    dev = data.X.device
    if dev.type == "cpu" and loss_fn is squared_error and (linear_fast_path(model, loss_fn)
                                                           or mlp_fast_path(model, loss_fn)):
        loss = dense_squared_losses(model, flat_to_stack(hyps, like), data)   # the same numbers, without vmap
        return loss, torch.zeros(loss.shape)
    n_max = data.X.shape[1]
    mask = (torch.arange(n_max, device=data.n.device)[None, :] < data.n[:, None]).float().to(dev)  # [K, n_max]
    stacked = flat_to_stack(hyps.to(dev), like)

    def one(params, X, y, m):
        out = functional_call(model, params, (X,))
        loss = (loss_fn(out, y) * m).sum() / m.sum()
        if out.ndim == 2 and out.shape[-1] > 1 and not y.is_floating_point():
            acc = ((out.argmax(-1) == y).float() * m).sum() / m.sum()
        else:
            acc = torch.zeros(())
        return loss, acc

    over_clients = vmap(one, in_dims=(None, 0, 0, 0))
    over_hyps = vmap(over_clients, in_dims=(0, None, None, None))
    with torch.no_grad():
        loss, acc = over_hyps(stacked, data.X, data.y, mask)  # [k, K]
    return loss.T.cpu(), acc.T.cpu()


def hypothesis_losses(model: nn.Module, hypotheses: torch.Tensor, clients, *,
                      loss_fn: LossFn = cross_entropy) -> torch.Tensor:
    """Local empirical cost ``F_c(theta_j; Z_c)`` (Galli et al. Eq. 3) of every client ``c`` under every
    hypothesis ``j``, in one batched call: returns ``[K, k]``.

    ``hypotheses``: ``[k, n]`` flat parameter vectors of ``model``."""
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    like = get_params(model)
    return _per_client_stats(model, like, _check_hyps(hypotheses, like), data, loss_fn)[0]


def evaluate_hypotheses(model: nn.Module, hypotheses: torch.Tensor, clients, *,
                        loss_fn: LossFn = cross_entropy) -> dict:
    """Each client uses the hypothesis with its lowest loss (IFCA's cluster identity estimate).

    Returns ``{"loss", "rmse", "accuracy"}`` averaged over clients (RMSE is the per-client
    ``sqrt(mean squared_error)``, meaningful with :func:`squared_error`; accuracy is 0 for regression)
    and ``"assignment"``: int array ``[K]`` of the chosen hypotheses."""
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    like = get_params(model)
    loss, acc = _per_client_stats(model, like, _check_hyps(hypotheses, like), data, loss_fn)
    j = loss.argmin(dim=1)
    best = loss.gather(1, j[:, None])[:, 0]
    return {"loss": float(best.mean()), "rmse": float(best.clamp_min(0).sqrt().mean()),
            "accuracy": float(acc.gather(1, j[:, None]).mean()), "assignment": j.numpy()}


def kmeans_clusters(released: torch.Tensor, hypotheses: torch.Tensor, *, seed: int = 0) -> np.ndarray:
    """Server-side clustering of Galli et al. Algorithm 1 (Sec. 3): scikit-learn's
    ``KMeans(n_clusters=k, init=hypotheses, n_init=1)`` (Lloyd's iteration) on the released vectors
    ``[m, n]``, initialised at the current hypotheses ``[k, n]`` so that cluster ``j`` continues
    hypothesis ``j``. When a cluster empties during the iteration scikit-learn moves its centre to the
    point farthest from its assigned centre; this one backend runs at every scale, so quick and paper
    runs follow the same rule. ``seed`` is scikit-learn's ``random_state`` (which an explicit init never draws from). Returns labels ``[m]``. With fewer
    distinct vectors than clusters each vector joins its nearest hypothesis.

    Raises ``ValueError`` if ``released`` and ``hypotheses`` are not 2-D with the same number of
    columns, or hold a non-finite value."""
    from sklearn.cluster import KMeans

    X = torch.as_tensor(released).detach().double()
    C = torch.as_tensor(hypotheses).detach().double()
    if X.ndim != 2 or C.ndim != 2 or X.shape[1] != C.shape[1]:
        raise ValueError(f"released [m, n] and hypotheses [k, n] must share n, got "
                         f"{tuple(X.shape)} and {tuple(C.shape)}")
    if C.shape[0] < 1:
        raise ValueError("hypotheses must hold at least one row")
    if not (torch.isfinite(X).all() and torch.isfinite(C).all()):
        raise ValueError("released and hypotheses must be finite")
    k = C.shape[0]
    if k == 1:
        return np.zeros(len(X), dtype=np.int64)
    if len(X) < k or len(torch.unique(X, dim=0)) < k:
        return torch.cdist(X, C).argmin(1).numpy().astype(np.int64)
    lloyd = _sklearn_lloyd()
    if lloyd is None:
        km = KMeans(n_clusters=k, init=C.numpy(), n_init=1, random_state=seed, tol=0.0).fit(X.numpy())
        return km.labels_.astype(np.int64)
    single, n_threads = lloyd
    # what KMeans(init=C, n_init=1, tol=0).fit(X) computes, without its per-call validation (milliseconds a
    # round): copies centred on the mean of X, unit weights, one Lloyd run to strict convergence or 300
    # iterations (tests/test_ifca.py compares the labels with KMeans')
    Xc = np.array(X.numpy(), dtype=np.float64, order="C", copy=True)
    init = np.array(C.numpy(), dtype=np.float64, order="C", copy=True)
    mean = Xc.mean(axis=0)
    Xc -= mean
    init -= mean
    labels = single(Xc, np.ones(len(Xc), dtype=np.float64), init, max_iter=300, verbose=False, tol=0,
                    n_threads=n_threads)[0]
    return labels.astype(np.int64)


def _sklearn_lloyd():
    """scikit-learn's single Lloyd run and its thread count, as ``KMeans.fit`` calls them, or ``None`` when
    this scikit-learn does not have them where 1.x keeps them (then :func:`kmeans_clusters` calls
    ``KMeans``)."""
    try:
        from sklearn.cluster._kmeans import _kmeans_single_lloyd
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads
    except ImportError:
        return None
    return _kmeans_single_lloyd, _openmp_effective_n_threads()


@dataclass
class IFCARound:
    """What happened in one round: ``selected`` clients that released (ids), ``refused`` ids (past
    budget), ``chosen`` hypothesis per released client ``[m]``, ``released`` vectors ``[m, n]`` (what
    the server saw), ``labels`` the server's clusters ``[m]``, ``hypotheses`` after aggregation
    ``[k, n]``, ``leakage`` per released client ``[m]`` (empty without noise), ``val`` metrics, and
    ``idle``: ids of sampled clients of a private run whose local update was exactly zero (e.g. a ReLU
    network with every unit inactive on their data): SanitizeUpdate would release such a model
    exactly (``eps = inf``), so they send nothing that round and spend nothing."""

    round: int
    selected: np.ndarray
    refused: np.ndarray
    chosen: np.ndarray
    released: torch.Tensor
    labels: np.ndarray
    hypotheses: torch.Tensor
    leakage: np.ndarray
    val: dict
    idle: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))


@dataclass
class IFCAResult:
    """``hypotheses`` ``[k, n]`` at the best validation round (the last round without validation),
    ``final`` ``[k, n]`` after the last round, ``history`` lists (``round``, ``val_loss``, ``val_rmse``,
    ``val_accuracy``, ``max_leakage`` ``[k]`` per round), per-round records, the accountant (private
    runs), ``best_round``, ``stopped_early`` and ``diverged``: the round in which a client's local
    training produced a non-finite model (e.g. SGD from a hypothesis blown up by noise), after which the
    run stops and keeps its best validated hypotheses; ``None`` if it never happened."""

    hypotheses: torch.Tensor
    final: torch.Tensor
    history: dict = field(default_factory=dict)
    rounds: list = field(default_factory=list)
    accountant: PrivacyAccountant | None = None
    best_round: int = 0
    stopped_early: bool = False
    diverged: int | None = None

    def params(self, j: int, model: nn.Module) -> dict:
        """Hypothesis ``j`` as a parameter dict of ``model``."""
        return {k: v[0] for k, v in flat_to_stack(self.hypotheses[j:j + 1], get_params(model)).items()}


def _check_hyps(h: torch.Tensor, like: dict) -> torch.Tensor:
    n = sum(v.numel() for v in like.values())
    h = h.to(torch.float32) if isinstance(h, torch.Tensor) else torch.as_tensor(h, dtype=torch.float32, device="cpu")
    if h.ndim != 2 or h.shape[1] != n:
        raise ValueError(f"hypotheses must have shape [k, {n}] (the model has {n} parameters), "
                         f"got {tuple(h.shape)}")
    return h


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The client-schedule and the noise generators of a run with ``seed`` (see :func:`ifca`)."""
    return np.random.default_rng(seed), np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])


@dataclass(frozen=True, eq=False)
class Hypotheses:
    """IFCA's ``k`` hypotheses (Ghosh et al. 2020, Alg. 2; Galli et al. 2022, Alg. 1): how many, where they
    start, and how the server groups the models it receives.

    ``num_clusters``
        ``k >= 1``, the number of hypotheses (``k = 1`` with no noise is FedAvg with unweighted averaging).
    ``init``
        Initial hypotheses ``[k, n]``; ``None``: ``N(0, init_std^2)`` per coordinate (Galli et al.'s Sec. 4.1
        choice), drawn from the run's generator.
    ``init_std``
        The standard deviation of that default draw (> 0).
    ``clustering``
        ``"argmin"``: by the clients' own choices, as in IFCA; ``"kmeans"``: k-means initialised at the
        hypotheses, as the server of Galli et al.'s Algorithm 1 does (it no longer sees the choices).

    Compares by identity (``init`` is a tensor). Raises ``ValueError`` naming the field for a ``num_clusters``
    that is not a positive integer, an ``init`` that is not ``[num_clusters, n]``, an ``init_std`` that is not
    finite and positive, or an unknown ``clustering``.
    """

    num_clusters: int
    init: torch.Tensor | None = None
    init_std: float = 1.0
    clustering: str = "argmin"

    def __post_init__(self):
        k = self.num_clusters
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"Hypotheses.num_clusters (k) must be an integer >= 1, got {k!r}")
        if self.clustering not in ("argmin", "kmeans"):
            raise ValueError(f"Hypotheses.clustering must be 'argmin' or 'kmeans', got {self.clustering!r}")
        if not (isinstance(self.init_std, (int, float)) and not isinstance(self.init_std, bool)
                and np.isfinite(self.init_std) and self.init_std > 0):
            raise ValueError(f"Hypotheses.init_std must be finite and > 0, got {self.init_std!r}")
        if self.init is not None:
            shape = tuple(torch.as_tensor(self.init).shape)
            if len(shape) != 2 or shape[0] != k:
                raise ValueError(f"Hypotheses.init must have shape [num_clusters={k}, n], got {shape}")


@dataclass(frozen=True)
class DPrivacy:
    """The clients' d-privacy in private IFCA (Galli et al. 2022, Alg. 1-2): every released model goes through
    SanitizeUpdate, the Euclidean Laplace mechanism with noise multiplier ``nu``, and each client's
    :class:`~fedlab.privacy.dprivacy.PrivacyAccountant` keeps its spending (Sec. 3.3).

    ``nu``
        ``nu > 0``: the noise's scale relative to the update (a release costs ``n / nu``, ``n`` the parameters).
    ``budget``
        The total a client may spend; ``None``: no limit.
    ``refuse_past_budget``
        A client whose next release would pass ``budget`` refuses to take part (``False``: it takes part and the
        accountant records the excess).

    Raises ``ValueError`` naming the field for a ``nu`` or ``budget`` that is not finite and positive.
    """

    nu: float
    budget: float | None = None
    refuse_past_budget: bool = True

    def __post_init__(self):
        if isinstance(self.nu, bool) or not isinstance(self.nu, (int, float)) or not (np.isfinite(self.nu)
                                                                                    and self.nu > 0):
            raise ValueError(f"DPrivacy.nu (noise multiplier) must be finite and > 0, got {self.nu!r}")
        if self.budget is not None and (isinstance(self.budget, bool) or not np.isfinite(self.budget)
                                        or not self.budget > 0):
            raise ValueError(f"DPrivacy.budget must be finite and > 0 or None, got {self.budget!r}")


@dataclass(frozen=True, eq=False)
class Validation:
    """Held-out clients that pick IFCA's best round (Galli et al. 2022, Sec. 4.1: early stopping on the
    validation loss): every round each of ``val_clients`` picks its best hypothesis and the run keeps the
    hypotheses of the round with the lowest validation loss; with ``patience`` it stops after ``patience``
    rounds without a lower one (the paper's 6 rounds).

    ``val_clients``
        A :class:`~fedlab.fl.ClientData` or a list of per-client data sets.
    ``patience``
        A positive integer, or ``None``: run every round.

    Compares by identity (it holds data). Raises ``ValueError`` naming the field for a ``patience`` below 1.
    """

    val_clients: object
    patience: int | None = None

    def __post_init__(self):
        if self.patience is not None and (isinstance(self.patience, bool) or int(self.patience) != self.patience
                                          or self.patience < 1):
            raise ValueError(f"Validation.patience must be an integer >= 1 or None, got {self.patience!r}")


def _of_type(name: str, value, kind, optional: bool = True):
    if (optional and value is None) or isinstance(value, kind):
        return value
    raise ValueError(f"{name} must be a fedlab.fl.ifca.{kind.__name__}{' or None' if optional else ''}, "
                     f"got {type(value).__name__}: {value!r}")


def ifca(model: nn.Module, clients, *, hypotheses: Hypotheses, num_rounds: int, clients_per_round: int,
         local: LocalTraining = LocalTraining(), privacy: DPrivacy | None = None,
         validation: Validation | None = None, seed: int = 0, device=None) -> IFCAResult:
    """IFCA (Ghosh et al. 2020) and, with ``privacy`` and ``Hypotheses(clustering="kmeans")``, Galli et al.
    Algorithm 1.

    Each round ``t``: sample ``U = clients_per_round`` clients; each computes ``F_c(theta_j)`` for all
    ``k`` hypotheses, picks ``j = argmin``, runs LocalUpdate (``local``, a :class:`~fedlab.fl.LocalTraining`:
    ``local_epochs`` E, step ``lr`` s, batch ``batch_size`` B_s; its ``loss_fn`` is also ``F_c``) from
    ``theta_j``; with ``privacy`` (a :class:`DPrivacy`) it releases SanitizeUpdate(theta_{j,c}; nu) and
    pays ``n / nu`` plus the snapping's floating-point slack (at most
    :data:`~fedlab.privacy.dprivacy.DEFAULT_FP_SLACK`; the release snaps to the secret-independent
    :func:`~fedlab.privacy.dprivacy.public_grid`) to its
    :class:`~fedlab.privacy.dprivacy.PrivacyAccountant` (or refuses, past
    ``budget``; a client whose update is exactly zero sends nothing, see :class:`IFCARound`). The server groups
    the released vectors as ``hypotheses.clustering`` says (``"argmin"``: by the clients' own choices, as
    in IFCA; ``"kmeans"``: k-means initialised at the hypotheses, as in Algorithm 1) and sets each
    ``theta_j`` to the mean of its group (an empty group keeps its hypothesis).

    Parameters
    ----------
    clients : ClientData or list of per-client data sets (``K`` clients)
    hypotheses : Hypotheses
        ``k`` (``num_clusters``), the start (``init``, ``init_std``) and the server's ``clustering``.
    privacy : DPrivacy, optional
        The clients' SanitizeUpdate (``nu``) and budget; ``None``: the models travel in the clear.
    validation : Validation, optional
        Held-out clients; when given, evaluated every round (each picks its best hypothesis) and, with
        ``patience``, training stops after ``patience`` rounds without a lower validation loss; the
        returned ``hypotheses`` are those of the best round.
    seed : int
        Derives three independent random streams: ``torch.Generator().manual_seed(seed)`` for the
        default ``init`` and the local mini-batches, ``np.random.default_rng(seed)`` for the client
        schedule, and the first child of ``np.random.SeedSequence(seed)`` for the noise. The schedule
        never depends on ``nu``: runs with and without noise (and with different ``nu``) sample the
        same clients each round, up to budget refusals.
    device : str or torch.device, optional
        Where the clients' losses and local updates are computed (default :func:`fedlab.config.device`,
        i.e. ``FEDLAB_DEVICE``). Hypotheses, noise, k-means and the records stay on the CPU, so every
        device draws the same numbers.

    Raises
    ------
    ValueError
        On settings objects of another type, ``clients_per_round`` outside ``[1, K]`` or an ``init`` whose
        columns are not the model's parameters (the objects check their own fields).
    """
    local = _local(local)
    loss_fn = local.loss_fn
    hypotheses = _of_type("hypotheses", hypotheses, Hypotheses, optional=False)
    privacy = _of_type("privacy", privacy, DPrivacy)
    validation = _of_type("validation", validation, Validation)
    num_clusters, init, init_std = hypotheses.num_clusters, hypotheses.init, hypotheses.init_std
    clustering = hypotheses.clustering
    nu = None if privacy is None else privacy.nu
    val_clients = None if validation is None else validation.val_clients
    patience = None if validation is None else validation.patience
    dev = _device(device)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    val = None if val_clients is None else (
        val_clients if isinstance(val_clients, ClientData) else stack_clients(val_clients))
    data = ClientData(data.X.to(dev), data.y.to(dev), data.n)        # no copy on the CPU
    val = None if val is None else ClientData(val.X.to(dev), val.y.to(dev), val.n)
    model = _model_on(model, dev)
    K, k = data.num_clients, int(num_clusters)
    if int(clients_per_round) != clients_per_round or not 1 <= clients_per_round <= K:
        raise ValueError(f"clients_per_round must be an integer in [1, {K}], got {clients_per_round}")
    like = get_params(model)
    n = sum(v.numel() for v in like.values())
    gen = torch.Generator().manual_seed(seed)
    schedule_rng, noise_rng = _streams(seed)
    if init is None:
        hyps = init_std * torch.randn(k, n, generator=gen, device="cpu")
    else:
        hyps = _check_hyps(init, like).clone()
        if hyps.shape[0] != k:
            raise ValueError(f"init must have num_clusters={k} rows, got {hyps.shape[0]}")
    acct = PrivacyAccountant(K, privacy.budget, privacy.refuse_past_budget) if privacy is not None else None
    # nn.Linear(d, 1) or a small ReLU net with one output on the CPU: the same local updates without vmap's
    # per-step cost (fedlab.fl._linear)
    update = (dense_clients_update if dev.type == "cpu" and (linear_fast_path(model, loss_fn)
                                                             or mlp_fast_path(model, loss_fn)) else clients_update)
    last_choice = np.full(K, -1)
    hist = History("val_loss", "val_rmse", "val_accuracy")
    hist["max_leakage"] = []                  # [k] per round (private runs), no entry for round 0
    res = IFCAResult(hyps.clone(), hyps.clone(), hist, [], acct)
    pending = {}

    def step(t, hyps):
        selected = np.sort(schedule_rng.choice(K, size=int(clients_per_round), replace=False))
        refused = np.array([], dtype=np.int64)
        if acct is not None:
            ok = acct.allowed(selected, n / nu + DEFAULT_FP_SLACK)   # the release's public worst case
            selected, refused = selected[ok], selected[~ok]
        idle = np.array([], dtype=np.int64)
        chosen = np.array([], dtype=np.int64)
        released, leak, labels = torch.zeros(0, n), np.array([]), np.array([], dtype=np.int64)
        if len(selected) > 0:
            sub = data.select(selected)
            chosen = _per_client_stats(model, like, hyps, sub, loss_fn)[0].argmin(1).numpy()
            start = hyps[torch.from_numpy(chosen)]
            trained = stack_to_flat(update(
                model, flat_to_stack(start.to(dev), like), sub, local=local, generator=gen,
                stacked=True)).detach().cpu()
            if not torch.isfinite(trained).all():
                # local SGD blew up: nothing is released, the run stops after this round (see IFCAResult)
                res.diverged = t
                selected = chosen = np.array([], dtype=np.int64)
            elif nu is not None:
                # a zero update would be released exactly (eps = inf): such a client sends nothing
                moved = (trained != start).any(1).numpy()
                idle = selected[~moved]
                selected, chosen = selected[moved], chosen[moved]
                start, trained = start[torch.from_numpy(moved)], trained[torch.from_numpy(moved)]
        if len(selected) > 0:
            if nu is not None:
                san = sanitize_update(trained, start, nu, rng=noise_rng)
                released, leak = san.theta, san.leakage.numpy()
                acct.spend(selected, leak, round=t, epsilon=san.epsilon.numpy(),   # for budget_at_radius
                           fp_leakage=san.fp_leakage.numpy())                     # the snapping's slack
            else:
                released = trained
            labels = (chosen if clustering == "argmin"
                      else kmeans_clusters(released, hyps, seed=seed + t))
            new = hyps.clone()
            for j in range(k):
                members = labels == j
                if members.any():
                    new[j] = released[torch.from_numpy(members)].mean(0)
            hyps = new
            last_choice[selected] = labels
        if acct is not None:
            hist["max_leakage"].append([float(acct.spent[last_choice == j].max(initial=0.0))
                                        for j in range(k)])
        pending.update(selected=selected, refused=refused, chosen=chosen, released=released, labels=labels,
                       leak=leak, idle=idle)
        return hyps

    def validate(h):
        ev = evaluate_hypotheses(model, h, val, loss_fn=loss_fn)
        return {"val_loss": ev["loss"], "val_rmse": ev["rmse"], "val_accuracy": ev["accuracy"]}

    track = {"best": np.inf, "since": 0}

    def after_round(t, hyps, history):
        ev = {key[4:]: v for key, v in history.last.items() if key.startswith("val_")} if val is not None else {}
        p = pending
        res.rounds.append(IFCARound(t, p["selected"], p["refused"], p["chosen"], p["released"], p["labels"],
                                    hyps.clone(), p["leak"], ev, p["idle"]))
        if val is None:
            res.hypotheses, res.best_round = hyps.clone(), t
            return res.diverged is not None
        if res.diverged is not None:
            res.stopped_early = True
            return True
        if t == 1:
            track["best"] = history["val_loss"][0]
        if ev["loss"] < track["best"] - 1e-12:
            track["best"], track["since"], res.best_round, res.hypotheses = ev["loss"], 0, t, hyps.clone()
            return False
        track["since"] += 1
        res.stopped_early = patience is not None and track["since"] >= patience
        return res.stopped_early

    hyps, _, _ = run_rounds(num_rounds, step, hyps, evaluate=None if val is None else validate, history=hist,
                            after_round=after_round)
    res.final = hyps.clone()
    return res


def private_ifca(model: nn.Module, clients, *, hypotheses: Hypotheses, privacy: DPrivacy, **kwargs) -> IFCAResult:
    """Galli et al., Algorithm 1: IFCA with SanitizeUpdate on every released model (``privacy``, a
    :class:`DPrivacy`) and server-side k-means (``hypotheses`` with its ``clustering`` set to ``"kmeans"``).
    Keyword arguments as in :func:`ifca`."""
    hypotheses = _of_type("hypotheses", hypotheses, Hypotheses, optional=False)
    return ifca(model, clients, hypotheses=replace(hypotheses, clustering="kmeans"),
                privacy=_of_type("privacy", privacy, DPrivacy, optional=False), **kwargs)


def server_view(model: nn.Module, hypotheses: torch.Tensor, clients, *, nu: float | None,
                num_clusters: int | None = None, local: LocalTraining = LocalTraining(), seed: int = 0) -> dict:
    """One round of Galli et al. Algorithm 1 seen from the server, without aggregation: every client
    of ``clients`` picks its best hypothesis, trains it, sanitises it with noise multiplier ``nu``
    (``None``: no noise; ``local``: the clients' :class:`~fedlab.fl.LocalTraining`) and the server runs k-means
    with ``num_clusters`` clusters (default: the
    number of hypotheses, initialised at them; another value uses scikit-learn's k-means++ seeding).

    Returns ``{"chosen": [K], "local": [K, n], "released": [K, n], "labels": [K]}``."""
    from sklearn.cluster import KMeans

    local = _local(local)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    like = get_params(model)
    hyps = _check_hyps(hypotheses, like)
    k = hyps.shape[0] if num_clusters is None else int(num_clusters)
    if k < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    chosen = _per_client_stats(model, like, hyps, data, local.loss_fn)[0].argmin(1)
    start = hyps[chosen]
    trained = stack_to_flat(clients_update(
        model, flat_to_stack(start, like), data, local=local, generator=torch.Generator().manual_seed(seed),
        stacked=True)).detach()
    released = trained if nu is None else sanitize_update(trained, start, nu, rng=seed).theta
    if k == hyps.shape[0]:
        labels = kmeans_clusters(released, hyps, seed=seed)
    elif k == 1:
        labels = np.zeros(len(released), dtype=np.int64)
    else:
        labels = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(released.double().numpy()).labels_
    return {"chosen": chosen.numpy(), "local": trained, "released": released, "labels": labels}


def early_stop_round(val_losses, patience: int) -> tuple[int, int]:
    """Replay early stopping on a validation curve ``val_losses[t]`` (``t = 0`` is the initial
    model): training stops once ``patience`` rounds in a row bring no lower loss.

    Returns ``(best_round, stop_round)``. Because a run is deterministic given its seed, a run with a
    long patience contains every shorter-patience run as a prefix; this recovers them for free.
    Raises ``ValueError`` if ``patience < 1``."""
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    best, best_t, since = np.inf, 0, 0
    for t, v in enumerate(val_losses):
        if v < best - 1e-12:
            best, best_t, since = v, t, 0
        elif t > 0:
            since += 1
            if since >= patience:
                return best_t, t
    return best_t, len(val_losses) - 1
