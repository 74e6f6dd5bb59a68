"""Personalised FL under client-level DP: local-only training, DP-FedAvg + local fine-tuning, and
Centaur (Shen, Ye, Kang, Hassani & Shokri 2023, "Share your representation only", Alg. 1-2), which
builds on FedRep (Collins et al. 2021).

A model ``f = head o representation`` is split by parameter names: ``head_names`` (the last layer by
default) stay on the client; the rest (the representation ``b``) is learned together.

Centaur, round ``t`` (lecture, "The Centaur algorithm"):

1. each sampled client fits its private head ``w_i`` on its data with ``b^t`` fixed (Phase 1);
2. it runs local SGD on ``b`` only, with ``w_i`` fixed (Phase 2);
3. it returns ``g_i = b_i - b^t`` (Phase 3); the server clips, averages with denominator ``q K``,
   adds Gaussian noise (:func:`fedlab.privacy.dp_fedavg.dp_aggregate`; by default the
   floating-point-safe discrete Gaussian on a public grid, ``safe=False`` the float mechanism) and
   steps ``b``.

Only the representation crosses the network, so the clipping budget and the noise are spent on
it alone. Diagnostics of the lecture: per-layer signal-to-noise ratio (:func:`per_layer_snr`) and the
client-agreement metric (:func:`client_agreement`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from .._checks import positive_int, run_spec
from .local import ClientData, LocalTraining, _local, cross_entropy
from .protocols import train_standalone
from .stacked import SGDJob, batch_plan, clients_update_runs, sgd_jobs
from .dp_fedavg import _DP_FIELDS, DPRoundRecord, DPSettings, _dp_settings, _spec_dp, dp_server_step, poisson_sample
from .rounds import run_rounds

__all__ = ["make_representation_task", "head_names_of", "partial_clients_update", "partial_clients_update_runs",
           "evaluate_clients", "local_only", "local_only_runs", "finetune", "finetune_runs", "PersonalHeads", "centaur", "centaur_runs",
           "per_layer_snr", "client_agreement"]


def make_representation_task(num_clients: int, n_train: int, n_test: int, *, dim: int = 64,
                             rep_dim: int = 4, num_classes: int = 10, classes_per_client: int = 2,
                             class_sep: float = 2.0, noise: float = 1.0, seed: int = 0
                             ) -> tuple[ClientData, ClientData]:
    """Synthetic heterogeneous clients that share a low-dimensional representation (the setting of
    Shen et al. 2023 and Collins et al. 2021, made a classification task).

    A fixed orthonormal ``B* in R^{dim x rep_dim}`` and class centres ``mu_c in R^{rep_dim}``
    (``N(0, class_sep^2 I)``) are shared. Client ``i`` draws ``classes_per_client`` of the
    ``num_classes`` labels (the heterogeneity knob: few classes = very heterogeneous) and records
    ``x = B* (mu_y + u) + noise * e`` with ``u ~ N(0, 0.25 I)``, ``e ~ N(0, I_dim)``. With few
    records per client the ``dim``-dimensional noise defeats local-only learning, while the shared
    ``B*`` is learnable from all clients together.

    Returns ``(train, test)`` :class:`ClientData`: ``X`` ``[K, n, dim]``, ``y`` ``[K, n]``.
    """
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes_per_client must be in 1..{num_classes}, got {classes_per_client}")
    if num_clients < 1 or n_train < 1 or n_test < 1:
        raise ValueError("num_clients, n_train and n_test must be positive")
    if not 1 <= rep_dim <= dim:
        raise ValueError(f"rep_dim must be in 1..dim, got {rep_dim}")
    g = torch.Generator().manual_seed(seed)
    B, _ = torch.linalg.qr(torch.randn(dim, rep_dim, generator=g))
    mu = class_sep * torch.randn(num_classes, rep_dim, generator=g)
    classes = torch.argsort(torch.rand(num_clients, num_classes, generator=g), dim=1)[:, :classes_per_client]

    def draw(n):
        pick = torch.randint(0, classes_per_client, (num_clients, n), generator=g)
        y = torch.gather(classes, 1, pick)
        u = mu[y] + 0.5 * torch.randn(num_clients, n, rep_dim, generator=g)
        X = u @ B.T + noise * torch.randn(num_clients, n, dim, generator=g)
        return ClientData(X, y, torch.full((num_clients,), n))

    return draw(n_train), draw(n_test)


def head_names_of(params: dict) -> list[str]:
    """Names of the last layer's parameters (the classification head)."""
    last = list(params)[-1].rsplit(".", 1)[0]
    return [k for k in params if k.rsplit(".", 1)[0] == last]


def partial_clients_update(model: nn.Module, stacked: dict, data: ClientData, trainable: Sequence[str], *,
                           lr: float, local_epochs: int = 1, batch_size: int | None = None,
                           generator: torch.Generator | None = None, loss_fn=cross_entropy) -> dict:
    """Local SGD on the parameters ``trainable`` only, all ``K`` clients in one vmap (the other
    parameters stay frozen): FedRep/Centaur's head step (Phase 1) and representation step (Phase 2),
    and local fine-tuning. ``stacked`` is ``{name: [K, ...]}``; returns the same layout.
    ``batch_size=None`` (or at least the largest client) is full-batch gradient descent, one step per
    epoch, and draws nothing from ``generator``; otherwise :func:`fedlab.fl.batch_plan` shuffles."""
    run = dict(stacked=stacked, data=data, lr=lr, local_epochs=local_epochs, batch_size=batch_size, generator=generator)
    return partial_clients_update_runs(model, [run], trainable, loss_fn=loss_fn)[0]


def _partial_job(run: dict, trainable: list[str]) -> SGDJob:
    """The :class:`fedlab.fl.stacked.SGDJob` of one :func:`partial_clients_update` call (its plan drawn)."""
    if not run["lr"] > 0:
        raise ValueError(f"lr must be > 0, got {run['lr']}")
    stacked, data = run["stacked"], run["data"]
    bad = [k for k in trainable if k not in stacked]
    if bad:
        raise ValueError(f"trainable names not in params: {bad}")
    batch_size, local_epochs = run.get("batch_size"), run.get("local_epochs", 1)
    if batch_size is None or batch_size >= int(data.n.max()):
        # full batch: every step sees all of a client's records, so no shuffle is needed (and none is
        # drawn from ``generator``); the gradient is the same as with batch_plan's shuffled order
        if int(local_epochs) != local_epochs or local_epochs < 1:
            raise ValueError(f"local_epochs must be a positive integer, got {local_epochs}")
        n_max = int(data.n.max())
        idx = torch.arange(n_max).expand(data.num_clients, int(local_epochs), n_max)
        w = (idx < data.n.view(-1, 1, 1)).float()
    else:
        idx, w = batch_plan(data.n, batch_size, local_epochs, run.get("generator"))
    return SGDJob(stacked, data.X, data.y, idx, w, run["lr"])


def partial_clients_update_runs(model: nn.Module, runs: Sequence[dict], trainable: Sequence[str], *,
                                loss_fn=cross_entropy) -> list[dict]:
    """Several :func:`partial_clients_update` calls with the same ``trainable`` parameters at once:
    each run is a mapping of that function's ``stacked``, ``data``, ``lr`` and optionally
    ``local_epochs`` (1), ``batch_size`` (``None``) and ``generator``. The plans are drawn run by run,
    in order; the steps of all runs go through one vmapped step (:func:`fedlab.fl.stacked.sgd_jobs`).
    Returns each run's stacked parameters, bit for bit what :func:`partial_clients_update` returns."""
    trainable = list(trainable)
    jobs = [_partial_job(r, trainable) for r in runs]
    return [{k: v.detach() for k, v in out.items()} for out in sgd_jobs(model, jobs, trainable=trainable, loss_fn=loss_fn)]


@torch.no_grad()
def evaluate_clients(model: nn.Module, stacked: dict, data: ClientData) -> torch.Tensor:
    """Accuracy of client ``k``'s model ``stacked[.][k]`` on its own data ``data`` (padding
    ignored). Returns ``[K]``."""
    mask = torch.arange(data.X.shape[1]).unsqueeze(0) < data.n.unsqueeze(1)

    def acc(p, X, y, m):
        pred = functional_call(model, p, (X,)).argmax(-1)
        return ((pred == y) & m).sum() / m.sum()

    return vmap(acc)(stacked, data.X, data.y, mask)


def _stack(params: dict, K: int) -> dict:
    return {k: v.detach().unsqueeze(0).repeat(K, *([1] * v.ndim)) for k, v in params.items()}


def local_only(model: nn.Module, train: ClientData, *, num_epochs: int, lr: float, batch_size: int | None = 10,
               params: dict | None = None, seed: int = 0) -> dict:
    """Local-only training: every client trains the whole model alone (no privacy cost, no
    collaboration). Returns stacked models ``{name: [K, ...]}``."""
    local, _ = train_standalone(model, train, num_epochs=num_epochs, batch_size=batch_size, lr=lr,
                                params=params, seed=seed)
    return {k: v.detach() for k, v in local.items()}


def local_only_runs(model: nn.Module, runs: Sequence[dict]) -> list[dict]:
    """Several :func:`local_only` trainings at once (each a mapping of its ``train``, ``num_epochs``,
    ``lr`` and optionally ``batch_size`` (10), ``params``, ``seed`` (0)), their steps stacked
    (:func:`fedlab.fl.stacked.clients_update_runs`); bit for bit what :func:`local_only` returns."""
    specs = []
    for r in runs:
        w = {k: v.detach().clone() for k, v in (r.get("params") or dict(model.named_parameters())).items()}
        specs.append(dict(params=w, data=r["train"], lr=r["lr"], local_epochs=r["num_epochs"],
                          batch_size=r.get("batch_size", 10), generator=torch.Generator().manual_seed(r.get("seed", 0))))
    return [{k: v.detach() for k, v in out.items()} for out in clients_update_runs(model, specs)]


def finetune(model: nn.Module, params: dict, train: ClientData, *, trainable: Sequence[str] | None = None,
             num_epochs: int, lr: float, batch_size: int | None = None, seed: int = 0) -> dict:
    """Local fine-tuning of a global model (lecture, "DP-FedAvg + fine-tuning"): every client
    trains ``trainable`` (default: the head) on its own data, the rest frozen. The result never
    leaves the client, so it costs no privacy. Returns stacked models ``{name: [K, ...]}``."""
    return finetune_runs(model, [dict(params=params, train=train, num_epochs=num_epochs, lr=lr, batch_size=batch_size,
                                      seed=seed)], trainable=trainable)[0]


def finetune_runs(model: nn.Module, runs: Sequence[dict], *, trainable: Sequence[str] | None = None) -> list[dict]:
    """Several :func:`finetune` calls at once (each a mapping of its ``params``, ``train``,
    ``num_epochs``, ``lr`` and optionally ``batch_size``, ``seed``), the same ``trainable`` (default:
    the head of the first run's ``params``) for all; bit for bit what :func:`finetune` returns."""
    trainable = head_names_of(runs[0]["params"]) if trainable is None else list(trainable)
    specs = [dict(stacked=_stack(r["params"], r["train"].num_clients), data=r["train"], lr=r["lr"],
                  local_epochs=r["num_epochs"], batch_size=r.get("batch_size"),
                  generator=torch.Generator().manual_seed(r.get("seed", 0))) for r in runs]
    return partial_clients_update_runs(model, specs, trainable)


@dataclass(frozen=True)
class PersonalHeads:
    """The clients' private heads in Centaur (Shen et al. 2023, Alg. 2, Phase 1 and the final fit) and FedRep
    (Collins et al. 2021, Alg. 1): which parameters stay on the client and how long each client fits its head.

    ``head_epochs``
        Phase 1: epochs of full-batch gradient descent on the head with the representation fixed (approximating
        the argmin), a positive integer (default 5).
    ``final_head_epochs``
        The same at the end, on the final representation (free of privacy cost); ``None``: ``head_epochs``.
    ``head_names``
        The head's parameter names; ``None``: the last layer (:func:`head_names_of`).

    Raises ``ValueError`` naming the field for an epoch count that is not a positive integer or ``head_names``
    that is a string or empty.
    """

    head_epochs: int = 5
    final_head_epochs: int | None = None
    head_names: Sequence[str] | None = None

    def __post_init__(self):
        positive_int("PersonalHeads.head_epochs", self.head_epochs)
        if self.final_head_epochs is not None:
            positive_int("PersonalHeads.final_head_epochs", self.final_head_epochs)
        if self.head_names is not None:
            if isinstance(self.head_names, str) or not len(self.head_names):
                raise ValueError(f"PersonalHeads.head_names must be a non-empty sequence of parameter names, "
                                 f"got {self.head_names!r}")
            object.__setattr__(self, "head_names", tuple(self.head_names))


def centaur(model: nn.Module, train: ClientData, *, num_rounds: int, dp: DPSettings,
            local: LocalTraining = LocalTraining(), heads: PersonalHeads = PersonalHeads(), params: dict | None = None,
            seed: int = 0, callback: Callable[[DPRoundRecord], None] | None = None) -> dict:
    """Centaur (Shen et al. 2023, Alg. 1 server / Alg. 2 client): DP-FedRep that shares only the
    representation, with the server's mechanism ``dp`` (:class:`~fedlab.fl.dp_fedavg.DPSettings`: clip bound,
    noise multiplier, Poisson sampling, server step) on the representation's updates. ``noise_multiplier = 0`` and
    ``clip_norm = None`` give FedRep (Collins et al. 2021). Client heads persist across rounds (each client
    keeps ``w_i``).

    Phase 1 is ``heads.head_epochs`` of full-batch gradient descent on the head (``heads``, a
    :class:`PersonalHeads`: which parameters, how many epochs), Phase 2 is ``local`` (a
    :class:`~fedlab.fl.LocalTraining`: ``local_epochs`` epochs of mini-batch SGD of batch ``batch_size`` and step
    ``lr``, the step of both phases) on the representation.
    At the end every client fits its head on the final representation (``heads.final_head_epochs``,
    default ``head_epochs``; free of privacy cost). ``local`` takes neither ``local_steps`` nor
    ``weight_decay`` nor another loss than cross-entropy (``ValueError``).

    Returns the stacked personalised models ``{name: [K, ...]}``. Privacy: the same
    :func:`fedlab.privacy.dp_fedavg.epsilon_spent` as DP-FedAvg with the same ``(z, q, T)`` and ``safe``
    (``dp.safe`` and ``dp.grid`` as in :func:`fedlab.fl.dp_fedavg.dp_fedavg`: the discrete Gaussian by default).
    """
    local = _local(local)
    if local.local_steps is not None or local.weight_decay != 0 or local.loss_fn is not cross_entropy:
        raise ValueError(f"local: centaur trains local_epochs epochs of cross-entropy without weight decay, got "
                         f"local_steps={local.local_steps}, weight_decay={local.weight_decay}, loss_fn={local.loss_fn}")
    if not isinstance(heads, PersonalHeads):
        raise ValueError(f"heads must be a fedlab.fl.personalization.PersonalHeads, got {type(heads).__name__}: {heads!r}")
    run = dict(train=train, dp=_dp_settings(dp),
               head_epochs=heads.head_epochs, rep_epochs=local.local_epochs, lr=local.lr, batch_size=local.batch_size,
               final_head_epochs=heads.final_head_epochs, params=params,
               head_names=None if heads.head_names is None else list(heads.head_names), seed=seed, callback=callback)
    return centaur_runs(model, [run], num_rounds=num_rounds)[0]


_CENTAUR_RUN = {"train": None, "sampling_prob": None, "noise_multiplier": None, "clip_norm": None, "head_epochs": 5,
                "rep_epochs": 1, "lr": 0.1, "batch_size": 10, "server_lr": 1.0, "final_head_epochs": None,
                "params": None, "head_names": None, "seed": 0, "callback": None, "safe": True, "grid": None}


def centaur_runs(model: nn.Module, runs: Sequence[dict], *, num_rounds: int) -> list[dict]:
    """Several :func:`centaur` runs advanced round by round together: each run is a mapping of that
    function's arguments but ``num_rounds`` (``train``, ``dp`` or, flat, ``sampling_prob``, ``noise_multiplier``,
    ``clip_norm`` (and ``server_lr``, ``safe``, ``grid``); flat ``lr``, ``batch_size``, ``rep_epochs`` for the
    training, and optionally the others), every run with its own generator, drawing in
    :func:`centaur`'s order. Each phase of all runs goes through one vmapped step
    (:func:`fedlab.fl.stacked.sgd_jobs`), which needs the same head names in every run. Returns each
    run's stacked personalised models, bit for bit what :func:`centaur` returns. Raises ``ValueError``
    as :func:`centaur` does, for no runs, an unknown argument or runs whose heads differ."""
    if not runs:
        raise ValueError("runs must hold at least one run")
    state = []
    for spec in runs:
        r = run_spec(_spec_dp(spec), _CENTAUR_RUN, ("train", "sampling_prob", "noise_multiplier", "clip_norm"),
                     "the centaur arguments")
        r["dp"] = DPSettings(**{k: r[k] for k in _DP_FIELDS})
        K = r["train"].num_clients
        w0 = {k: v.detach().clone() for k, v in (r["params"] or dict(model.named_parameters())).items()}
        heads = list(r["head_names"]) if r["head_names"] is not None else head_names_of(w0)
        r.update(K=K, m=r["sampling_prob"] * K, gen=torch.Generator().manual_seed(r["seed"]), w0=w0, heads=heads,
                 rep=[k for k in w0 if k not in heads],
                 head_state={k: v for k, v in _stack(w0, K).items() if k in heads})
        state.append(r)
    heads, rep = state[0]["heads"], state[0]["rep"]
    if any(r["heads"] != heads or r["rep"] != rep for r in state):
        raise ValueError("every run must split its parameters into the same head and representation")

    def step(t, bs):
        sels, phase1 = [], []
        for r, b in zip(state, bs):
            sel = poisson_sample(r["K"], r["sampling_prob"], r["gen"])
            sels.append(sel)
            if len(sel):
                p = {**_stack(b, len(sel)), **{k: r["head_state"][k][sel] for k in heads}}
                phase1.append((r, dict(stacked=p, data=r["train"].select(sel), lr=r["lr"], local_epochs=r["head_epochs"],
                                       batch_size=None, generator=r["gen"])))
        phase2 = []
        if phase1:
            for (r, spec), p in zip(phase1, partial_clients_update_runs(model, [s for _, s in phase1], heads)):  # Phase 1
                phase2.append((r, dict(spec, stacked=p, local_epochs=r["rep_epochs"], batch_size=r["batch_size"])))
        updates = {}
        if phase2:
            for (r, spec), p in zip(phase2, partial_clients_update_runs(model, [s for _, s in phase2], rep)):  # Phase 2
                updates[id(r)] = (spec["stacked"], p)
        new = []
        for r, b, sel in zip(state, bs, sels):
            upd = None
            if id(r) in updates:
                p1, p = updates[id(r)]
                for k in heads:
                    r["head_state"][k][sel] = p1[k]
                upd = {k: p[k] - b[k] for k in rep}                                             # Phase 3
            new.append(dp_server_step(t, b, sel, upd, dp=r["dp"], expected_clients=r["m"], generator=r["gen"],
                                      callback=r["callback"]))
        return new

    bs, _, _ = run_rounds(num_rounds, step, [{k: r["w0"][k] for k in rep} for r in state])
    finals = []
    for r, b in zip(state, bs):
        final = {**_stack(b, r["K"]), **r["head_state"]}
        finals.append(dict(stacked={k: final[k] for k in r["w0"]}, data=r["train"], lr=r["lr"],
                           local_epochs=r["final_head_epochs"] or r["head_epochs"], batch_size=None, generator=r["gen"]))
    return partial_clients_update_runs(model, finals, heads)


def per_layer_snr(clipped_mean: dict, noise_std_value: float) -> dict[str, float]:
    """Per-dimension signal-to-noise ratio of each layer (lecture, "Effect of clipping and additive
    noise"): the mean over a tensor's coordinates of ``|clipped average update| / sigma``."""
    if not noise_std_value > 0:
        raise ValueError(f"noise_std_value must be > 0, got {noise_std_value}")
    return {k: float(v.abs().mean() / noise_std_value) for k, v in clipped_mean.items()}


def client_agreement(updates: dict, names: Sequence[str] | None = None) -> torch.Tensor:
    """Client-agreement metric of Shen et al. (2023): cosine similarity between each client's
    update (before clipping) and the average update, over the parameters ``names`` (default: all).
    ``updates`` is ``{name: [m, ...]}``; returns ``[m]`` (needs ``m >= 1``)."""
    names = list(updates) if names is None else list(names)
    if not names:
        raise ValueError("names must not be empty")
    m = updates[names[0]].shape[0]
    if m < 1:
        raise ValueError("need at least one client update")
    flat = torch.cat([updates[k].reshape(m, -1) for k in names], dim=1)
    mean = flat.mean(0, keepdim=True)
    return torch.nn.functional.cosine_similarity(flat, mean.expand_as(flat), dim=1, eps=1e-12)
