"""Membership inference against federated learning (Nasr, Shokri & Houmansadr 2019; Shokri's CS5562
lecture, "Membership information leakage" to "Gradient ascent attack").

Threat model: the attacker is the parameter server (a *global* attacker) or one participant (a
*local* attacker). Both see the model at *every* round, not only at the end. A **passive** attacker
only reads what crosses the network; an **active** one changes what it sends (the gradient-ascent
attack) and watches how the target reacts.

Signals (computed for many records and many snapshots at once with ``torch.func.vmap``):

* the per-record loss ``l(theta_t; x, y)``; members of the training set have lower loss;
* the L2 norm of the per-record gradient of the loss w.r.t. the *last layer* (Nasr et al. 2019,
  Fig. "gradient norms of the last layer"); members have smaller gradients.

Shapes: ``X`` is ``[n, ...]``, ``y`` is ``[n]``; a signal matrix is ``[T, n]`` (rounds x records).
A membership *score* is ``[n]``, higher meaning "more likely a member".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from .. import fl
from .._checks import finite_real, run_spec, whole_int
from ..metrics import auc_permutation_floor, balanced_accuracy, best_threshold, roc_auc, roc_auc_rows
from ..privacy.defenses import global_norm

__all__ = [
    "last_layer_names", "per_example_loss", "per_example_grad_norm", "stack_snapshots",
    "snapshot_signals", "SnapshotRecorder", "membership_score", "attack_auc", "attack_tpr_at_fpr", "attack_accuracy",
    "client_signals", "attack_model_auc", "gradient_ascent", "ActiveAttack", "active_attack_rounds", "active_attack_runs", "round_auc",
    "heldout_accuracy", "leave_one_out_accuracy", "learned_loo_scores",
    "logit_confidence", "balanced_inclusion", "lira_scores",
]


def last_layer_names(params: dict) -> list[str]:
    """Names of the parameters of the last module (e.g. ``["2.weight", "2.bias"]`` of an MLP)."""
    if not params:
        raise ValueError("params must not be empty")
    last = list(params)[-1]
    prefix = last.rsplit(".", 1)[0] if "." in last else ""
    return [k for k in params if (k.rsplit(".", 1)[0] if "." in k else "") == prefix]


def _check_xy(X, y):
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same length, got {X.shape[0]} and {y.shape[0]}")
    if X.shape[0] == 0:
        raise ValueError("X must hold at least one record")


@torch.no_grad()
def per_example_loss(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor,
                     loss_fn=fl.cross_entropy) -> torch.Tensor:
    """Per-record loss ``l(theta; x_i, y_i)``, shape ``[n]``."""
    _check_xy(X, y)
    return loss_fn(functional_call(model, params, (X,)), y)


def per_example_grad_norm(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor,
                          names: Sequence[str] | None = None, loss_fn=fl.cross_entropy) -> torch.Tensor:
    """L2 norm of each record's loss gradient w.r.t. the parameters ``names`` (default: the last
    layer, :func:`last_layer_names`), as in Nasr et al. (2019, Sec. IV, white-box gradient
    features), :func:`fedlab.privacy.defenses.global_norm` of each record's gradient. Returns ``[n]``;
    one ``vmap`` over records, no loop."""
    _check_xy(X, y)
    names = list(names) if names is not None else last_layer_names(params)
    missing = [k for k in names if k not in params]
    if missing:
        raise ValueError(f"names not in params: {missing}")
    frozen = {k: v for k, v in params.items() if k not in names}

    def loss_one(sub, x, t):
        out = functional_call(model, {**frozen, **sub}, (x.unsqueeze(0),))
        return loss_fn(out, t.unsqueeze(0)).sum()

    g = vmap(grad(loss_one), in_dims=(None, 0, 0))({k: params[k] for k in names}, X, y)
    return vmap(global_norm)(g).detach()


def stack_snapshots(snapshots: Sequence[dict]) -> dict:
    """Stack a list of ``T`` parameter dicts into one dict ``{name: [T, ...]}``."""
    if len(snapshots) == 0:
        raise ValueError("snapshots must not be empty")
    return {k: torch.stack([s[k].detach() for s in snapshots]) for k in snapshots[0]}


def snapshot_signals(model: nn.Module, snapshots, X: torch.Tensor, y: torch.Tensor, *,
                     signal: str = "loss", loss_fn=fl.cross_entropy) -> torch.Tensor:
    """The membership signal of every record under every snapshot: ``[T, n]``.

    ``snapshots``: a list of ``T`` parameter dicts or a stacked dict ``{name: [T, ...]}``.
    ``signal``: ``"loss"`` or ``"grad_norm"`` (last-layer gradient norm). Vectorised over snapshots.
    """
    if signal not in ("loss", "grad_norm"):
        raise ValueError(f"signal must be 'loss' or 'grad_norm', got {signal!r}")
    stacked = snapshots if isinstance(snapshots, dict) else stack_snapshots(snapshots)
    if signal == "loss":
        return vmap(lambda p: per_example_loss(model, p, X, y, loss_fn))(stacked)
    names = last_layer_names(stacked)
    return vmap(lambda p: per_example_grad_norm(model, p, X, y, names, loss_fn))(stacked)


class SnapshotRecorder:
    """A ``callback`` for :func:`fedlab.fl.fedavg` that keeps what an honest-but-curious server
    sees each round: the aggregated (released) model and every returned local model.

    Attributes: ``rounds``; ``global_models`` (list of dicts, the model released after round ``t``);
    ``client_models`` (list of stacked dicts ``{name: [m, ...]}``) and ``selected`` (list of index
    arrays). :meth:`client_history` gives one client's models over the rounds it took part in.
    """

    def __init__(self):
        self.rounds: list[int] = []
        self.global_models: list[dict] = []
        self.client_models: list[dict] = []
        self.selected: list[np.ndarray] = []

    def __call__(self, rec: fl.RoundRecord) -> None:
        self.rounds.append(rec.round)
        self.global_models.append({k: v.detach().clone() for k, v in
                                   fl.weighted_average(rec.client_params, rec.weights).items()})
        self.client_models.append({k: v.detach().clone() for k, v in rec.client_params.items()})
        self.selected.append(np.asarray(rec.selected))

    def client_history(self, k: int) -> dict:
        """Stacked ``{name: [T_k, ...]}`` of the models client ``k`` returned (rounds it was selected)."""
        rows = [(cm, int(np.flatnonzero(sel == k)[0])) for cm, sel in zip(self.client_models, self.selected)
                if (sel == k).any()]
        if not rows:
            raise ValueError(f"client {k} was never selected")
        return {name: torch.stack([cm[name][i] for cm, i in rows]) for name in rows[0][0]}


def membership_score(signals: torch.Tensor, window: int = 1) -> torch.Tensor:
    """Passive score from a ``[T, n]`` signal matrix: minus the mean over the last ``window``
    rounds (lower loss / gradient norm means "member"). Returns ``[n]``.

    Raises ``ValueError`` if ``window`` is not in ``1..T``.
    """
    if signals.ndim != 2:
        raise ValueError(f"signals must be [T, n], got shape {tuple(signals.shape)}")
    if not 1 <= window <= signals.shape[0]:
        raise ValueError(f"window must be in 1..{signals.shape[0]}, got {window}")
    return -signals[-window:].mean(0)


def attack_auc(signals: torch.Tensor, is_member, window: int = 1) -> float:
    """ROC AUC (:func:`fedlab.metrics.roc_auc`) of :func:`membership_score` for labels ``is_member``
    (``[n]``, 1 = member). ``signals``: ``[T, n]`` (one observer), or ``[K, T, n]``: the mean over the
    ``K`` clients of each client's AUC on its own candidates (the signals of
    :func:`client_signals`). Raises ``ValueError`` for another shape."""
    if signals.ndim == 3:
        return float(np.mean([attack_auc(s, is_member, window) for s in signals]))
    if signals.ndim != 2:
        raise ValueError(f"signals must be [T, n] or [K, T, n], got shape {tuple(signals.shape)}")
    return roc_auc(np.asarray(is_member), membership_score(signals, window).numpy())


def attack_tpr_at_fpr(signals: torch.Tensor, is_member, fpr=(0.001, 0.01), window: int = 1) -> list[float]:
    """TPR at low FPR (:func:`fedlab.metrics.tpr_at_fpr`, Carlini et al. S&P 2022) of :func:`membership_score`
    with **one** threshold for every candidate: ``signals`` ``[T, n]`` (one observer) or ``[K, T, n]`` (each
    client's own ``n`` candidates, all labelled by ``is_member`` ``[n]``; the ``K n`` scores are pooled, as a
    server that flags records across its clients with a single rule). ``fpr``: a rate or a sequence of rates;
    with ``n_neg`` pooled non-members a rate below ``1 / n_neg`` means no false positive at all. Returns a
    list (one TPR per rate). Raises ``ValueError`` for another shape."""
    from ..metrics import tpr_at_fpr

    if signals.ndim not in (2, 3):
        raise ValueError(f"signals must be [T, n] or [K, T, n], got shape {tuple(signals.shape)}")
    rates = list(fpr) if isinstance(fpr, (list, tuple)) else [fpr]
    S = signals if signals.ndim == 3 else signals[None]
    scores = torch.cat([membership_score(s, window) for s in S]).numpy()
    labels = np.tile(np.asarray(is_member), len(S))
    return tpr_at_fpr(labels, scores, rates)


def attack_accuracy(is_member, scores) -> float:
    """Best balanced accuracy ``max_tau (TPR + TNR) / 2`` of a threshold on ``scores`` (the
    "attack accuracy" of Nasr et al. 2019, who evaluate on equally many members and non-members).

    The threshold is tuned on the very records it is measured on, so this is *optimistic* (random
    scores on 20 + 20 candidates reach about 0.59): report :func:`heldout_accuracy` or
    :func:`leave_one_out_accuracy`, with the AUC, instead."""
    from ..metrics import roc_curve

    fpr, tpr = roc_curve(np.asarray(is_member), np.asarray(scores))
    return float(np.max((tpr + 1.0 - fpr) / 2.0))


def heldout_accuracy(cal_member, cal_scores, eval_member, eval_scores) -> tuple[float, float]:
    """Balanced accuracy of a threshold chosen on calibration records and applied to disjoint
    evaluation records: ``tau = best_threshold(cal_member, cal_scores)`` (:func:`fedlab.metrics.best_threshold`;
    the evaluation labels are never seen), then :func:`fedlab.metrics.balanced_accuracy` on
    ``(eval_member, eval_scores)``. Returns ``(accuracy, tau)``. Raises ``ValueError`` as those functions."""
    tau = best_threshold(cal_member, cal_scores)
    return balanced_accuracy(eval_member, eval_scores, tau), tau


def leave_one_out_accuracy(is_member, scores) -> tuple[np.ndarray, np.ndarray]:
    """Held-out attack accuracy for ``U >= 2`` targets: target ``u``'s threshold is chosen on the pooled
    candidates of the *other* targets (an attacker who knows the membership of other clients'
    records, as in Nasr et al. 2019's supervised attack) and applied to target ``u``'s candidates.

    ``is_member``: ``[m]`` (the same for every target) or ``[U, m]``; ``scores``: ``[U, m]``.
    Returns ``(accuracy [U], thresholds [U])``; ``thresholds[u]`` never depends on row ``u``'s labels.
    Raises ``ValueError`` for fewer than two targets or mismatched shapes."""
    S = np.asarray(scores, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 2:
        raise ValueError(f"scores must be [U, m] with U >= 2 targets, got shape {S.shape}")
    L = np.asarray(is_member, dtype=np.float64)
    L = np.broadcast_to(L, S.shape) if L.ndim == 1 else L
    if L.shape != S.shape:
        raise ValueError(f"is_member must be [m] or [U, m] matching scores {S.shape}, got {np.shape(is_member)}")
    accs, taus = [], []
    for u in range(S.shape[0]):
        rest = np.arange(S.shape[0]) != u
        a, t = heldout_accuracy(L[rest].ravel(), S[rest].ravel(), L[u], S[u])
        accs.append(a)
        taus.append(t)
    return np.asarray(accs), np.asarray(taus)


def round_auc(signals: torch.Tensor, is_member, width: int = 1) -> np.ndarray:
    """AUC of the score "minus the signal averaged over ``width`` consecutive rounds", for every window
    position: entry ``j`` uses rounds ``j .. j + width - 1`` (0-based), so ``width = 1`` gives the
    per-round AUC over training. ``signals``: ``[T, n]`` or ``[K, T, n]`` (then the mean over the ``K``
    clients, each scored on its own candidates); ``is_member``: ``[n]``. Returns ``[T - width + 1]``;
    one batched :func:`fedlab.metrics.roc_auc_rows` call. Raises ``ValueError`` for another shape or
    ``width`` outside ``1..T``."""
    S = signals if signals.ndim == 3 else signals.unsqueeze(0) if signals.ndim == 2 else None
    if S is None:
        raise ValueError(f"signals must be [T, n] or [K, T, n], got shape {tuple(signals.shape)}")
    K, T, n = S.shape
    if int(width) != width or not 1 <= width <= T:
        raise ValueError(f"width must be an integer in 1..{T}, got {width}")
    win = -S.double().unfold(1, int(width), 1).mean(-1)                     # [K, T - width + 1, n]
    lab = torch.as_tensor(np.asarray(is_member, dtype=np.float64)).expand(K * win.shape[1], n)
    return roc_auc_rows(lab, win.reshape(-1, n)).reshape(K, -1).mean(0).numpy()


def client_signals(model: nn.Module, recorder: SnapshotRecorder, X: torch.Tensor, y: torch.Tensor, *,
                   signal: str = "loss", loss_fn=fl.cross_entropy) -> torch.Tensor:
    """Signals of each client's own candidate records under the models that client returned, as the
    server sees them (every client must have taken part in every recorded round, ``client_fraction=1``).

    ``X``: ``[K, r, ...]`` (client ``k``'s candidates: its members and as many non-members),
    ``y``: ``[K, r]``. Returns ``[K, T, r]``; one vmap over clients and rounds.
    """
    sel = np.stack(recorder.selected) if recorder.selected else None
    if sel is None or sel.shape[1] != X.shape[0] or not (sel == np.arange(X.shape[0])).all():
        raise ValueError("every one of the K clients of X must be selected in every recorded round")
    if y.shape[:2] != X.shape[:2]:
        raise ValueError(f"X and y must agree on [K, r], got {tuple(X.shape[:2])} and {tuple(y.shape[:2])}")
    hist = {k: torch.stack([cm[k] for cm in recorder.client_models], dim=1)
            for k in recorder.client_models[0]}                                   # [K, T, ...]
    return vmap(lambda h, Xk, yk: snapshot_signals(model, h, Xk, yk, signal=signal, loss_fn=loss_fn))(hist, X, y)


def attack_model_auc(features, is_member, *, train_fraction: float = 0.5, seed: int = 0) -> dict:
    """Nasr et al. (2019)'s learned attack, simplified: the adversary knows the membership of a
    ``train_fraction`` of the records (stratified), trains a classifier on their signal histories
    ``features`` (``[n, F]``, e.g. losses and gradient norms at the observed rounds, concatenated),
    and scores the rest. The paper uses a neural network; we use a standardised logistic
    regression (scikit-learn). Returns, on the held-out records, ``{"auc", "accuracy", "floor"}``: the
    accuracy of a threshold chosen on the training records' scores (:func:`heldout_accuracy`) and the
    chance floor of the AUC (:func:`fedlab.metrics.auc_permutation_floor`, 95th percentile).
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    F = np.asarray(features, dtype=np.float64)
    lab = np.asarray(is_member).astype(int)
    if F.ndim != 2 or F.shape[0] != lab.shape[0]:
        raise ValueError(f"features must be [n, F] with n = len(is_member), got {F.shape}")
    tr, te = train_test_split(np.arange(len(lab)), train_size=train_fraction, random_state=seed,
                              stratify=lab)
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    clf.fit(F[tr], lab[tr])
    s = clf.decision_function(F[te])
    acc, _ = heldout_accuracy(lab[tr], clf.decision_function(F[tr]), lab[te], s)
    return {"auc": roc_auc(lab[te], s), "accuracy": acc, "floor": auc_permutation_floor(lab[te], s, seed=seed)}


def learned_loo_scores(features, is_member) -> np.ndarray:
    """Nasr et al. (2019, Sec. IV-C)'s supervised attack across targets: for each target ``u`` a classifier
    (standardised logistic regression, scikit-learn; the paper uses a neural network) is trained on the
    signal histories of the *other* targets' candidates, whose membership the adversary knows, and scores
    target ``u``'s candidates. No score depends on its own target's labels.

    ``features``: ``[U, m, F]`` (``U >= 2`` targets, ``m`` candidates each, ``F`` signals, e.g. the loss of
    the model the target received and of the model it returned at every attack round); ``is_member``:
    ``[m]`` (the same for every target) or ``[U, m]``, both classes present among the other targets.
    Returns the decision scores ``[U, m]`` (higher means "member"). Raises ``ValueError`` for other shapes,
    fewer than two targets, or non-finite features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    F = np.asarray(features, dtype=np.float64)
    if F.ndim != 3 or F.shape[0] < 2:
        raise ValueError(f"features must be [U, m, F] with U >= 2 targets, got shape {F.shape}")
    if not np.isfinite(F).all():
        raise ValueError("features must be finite")
    L = np.asarray(is_member).astype(int)
    L = np.broadcast_to(L, F.shape[:2]) if L.shape == F.shape[1:2] else L
    if L.shape != F.shape[:2]:
        raise ValueError(f"is_member must be [m] or [U, m] matching features {F.shape[:2]}, got {np.shape(is_member)}")
    out = np.empty(F.shape[:2])
    for u in range(F.shape[0]):
        rest = np.arange(F.shape[0]) != u
        y = L[rest].ravel()
        if y.min() == y.max():
            raise ValueError("is_member must hold members and non-members among the other targets")
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        clf.fit(F[rest].reshape(-1, F.shape[2]), y)
        out[u] = clf.decision_function(F[u])
    return out


def gradient_ascent(model: nn.Module, params: dict, X: torch.Tensor, y: torch.Tensor, *,
                    ascent_lr: float, ascent_steps: int = 1, loss_fn=fl.cross_entropy) -> dict:
    """The adversary's model update of the gradient-ascent attack (Nasr et al. 2019, Sec. V-B):
    ``theta <- theta + ascent_lr * grad_theta mean_i l(theta; x_i, y_i)`` over the target records,
    ``ascent_steps`` times. It *raises* the loss on the targets; a client that trains on a target pulls
    it back down. ``ascent_lr = 0`` returns a copy (the passive attacker)."""
    if not ascent_lr >= 0:
        raise ValueError(f"ascent_lr must be >= 0, got {ascent_lr}")
    _check_xy(X, y)
    p = {k: v.detach().clone() for k, v in params.items()}
    if ascent_lr == 0:
        return p

    def mean_loss(q):
        return loss_fn(functional_call(model, q, (X,)), y).mean()

    g = grad(mean_loss)
    for _ in range(int(ascent_steps)):
        gr = g(p)
        p = {k: p[k] + ascent_lr * gr[k] for k in p}
    return p


@dataclass(frozen=True)
class ActiveAttack:
    """Who attacks whom in the membership attack of Nasr, Shokri & Houmansadr (2019, Sec. V-B), and how.

    Fields:

    ``target``
        the client (an index) whose training set the candidate records are tested against.
    ``ascent_lr``
        the step of the gradient-ascent attack on the candidates (:func:`gradient_ascent`, one step per
        round); 0 is the passive attacker on the same schedule.
    ``attacker``
        ``"server"`` (the global attacker, which observes the model the target returns) or
        ``"participant"`` (a local attacker, client ``attacker_index``, which observes the next global model).
    ``isolate``
        the server's *isolating* variant: the target is cut off from the other participants (server only).
    ``attacker_index``
        the participant that attacks (``attacker="participant"`` only), a client other than ``target``.

    Defaults: the paper's global (server) attacker without isolation. Raises ``ValueError`` naming the field:
    ``ActiveAttack.target`` not an integer index >= 0, ``ascent_lr`` not a finite number >= 0, an unknown
    ``attacker``, ``isolate`` not a bool or true with a participant, a participant without an integer
    ``attacker_index`` >= 0 (or with ``attacker_index == target``), an ``attacker_index`` with the server.
    The bounds that depend on the federation (an index below the number of clients, two clients to isolate)
    are checked by :func:`active_attack_runs`.
    """

    target: int
    ascent_lr: float
    attacker: str = "server"
    isolate: bool = False
    attacker_index: int | None = None

    def __post_init__(self):
        whole_int("ActiveAttack.target", self.target, low=0)
        finite_real("ActiveAttack.ascent_lr", self.ascent_lr, 0)
        if not isinstance(self.attacker, str) or self.attacker not in ("server", "participant"):
            raise ValueError(f"ActiveAttack.attacker must be 'server' or 'participant', got {self.attacker!r}")
        if not isinstance(self.isolate, (bool, np.bool_)):
            raise ValueError(f"ActiveAttack.isolate must be True or False, got {self.isolate!r}")
        if self.attacker == "server" and self.attacker_index is not None:
            raise ValueError("ActiveAttack.attacker_index is for attacker='participant' only (the server attacks "
                             f"itself), got {self.attacker_index!r}")
        if self.attacker == "participant":
            if self.attacker_index is None or whole_int("ActiveAttack.attacker_index", self.attacker_index, low=0) \
                    == self.target:
                raise ValueError("ActiveAttack.attacker_index must be a client index different from target, got "
                                 f"{self.attacker_index!r}")
            if self.isolate:
                raise ValueError("ActiveAttack.isolate: only the server (attacker='server') can isolate a participant")


def active_attack_rounds(model: nn.Module, clients: fl.ClientData, params: dict, X_target: torch.Tensor,
                         y_target: torch.Tensor, *, attack: ActiveAttack, num_rounds: int,
                         local: fl.LocalTraining = fl.LocalTraining(), seed: int = 0, return_trace: bool = False):
    """Run ``num_rounds`` FedAvg rounds (all clients, McMahan et al. 2017; each client trains as ``local``
    says, FedAvg's defaults ``E = 1``, ``B = 10``, step 0.1) during which an attacker observes the model
    and, when ``attack.ascent_lr > 0``, mounts the gradient-ascent attack of Nasr et al. (2019, Sec. V-B)
    on the candidate records ``(X_target, y_target)`` (members of client ``attack.target`` and
    non-members, mixed; the attacker does not know which is which).

    ``attack.attacker="server"`` (global attacker) observes the model the target returns each round.

    * ``isolate=False``: the global model goes to every client; when ``ascent_lr > 0`` the server
      first applies :func:`gradient_ascent` on the candidates to it (every client, the target
      included, receives the ascended global model), and aggregates all returned models.
    * ``isolate=True`` (Nasr et al.'s *isolating* server): from the first attack round on, the target
      is cut off from the other participants. It receives a model of its own, which starts at the
      global model ``params`` and is afterwards the model the target itself returned in the previous
      round (ascended first when ``ascent_lr > 0``): it never contains another participant's update.
      The other clients go on with FedAvg among themselves (the target's returns are left out of
      their aggregate).

    ``attack.attacker="participant"`` (local attacker, client ``attack.attacker_index``): it trains
    honestly, adds the ascent step to what it uploads, and observes the next global model.
    ``ascent_lr = 0`` gives the passive attacker on exactly the same schedule (the same batches: ``seed``).

    The rounds run on :func:`fedlab.fl.rounds.run_rounds` (one run of :func:`active_attack_runs`).
    Returns the loss signal ``[num_rounds, n_candidates]`` that the attacker observed each round; with
    ``return_trace`` a dict ``{"signals", "received", "returned", "global"}``, the last three lists of
    ``num_rounds`` parameter dicts: the model the target received, the model it returned, and the other
    clients' next global model (the FedAvg aggregate of the round).

    Raises ``ValueError`` for a ``target`` or ``attacker_index`` that is not a client, fewer than two
    clients with ``isolate``, ``num_rounds`` not a positive integer, a ``local`` with ``local_steps`` or
    ``weight_decay`` (as :func:`active_attack_runs`), and as :class:`ActiveAttack` for its fields.
    """
    if not isinstance(attack, ActiveAttack):
        raise ValueError(f"attack must be an ActiveAttack, got {attack!r}")
    run = dict(X_target=X_target, y_target=y_target, **asdict(attack))
    return active_attack_runs(model, clients, params, [run], num_rounds=num_rounds, local=local, seed=seed,
                              return_trace=return_trace)[0]


_ACTIVE_RUN = {"X_target": None, "y_target": None, "target": None, "ascent_lr": None, "attacker": "server",
               "isolate": False, "attacker_index": None}


def _check_active_run(run: dict, K: int) -> dict:
    r = run_spec(run, _ACTIVE_RUN, ("X_target", "y_target", "target", "ascent_lr"), "the arguments")
    ActiveAttack(**{k: r[k] for k in ("target", "ascent_lr", "attacker", "isolate", "attacker_index")})
    if not r["target"] < K:
        raise ValueError(f"target must be a client index in 0..{K - 1}, got {r['target']}")
    if r["attacker"] == "participant" and not r["attacker_index"] < K:
        raise ValueError(f"attacker_index must be a client index in 0..{K - 1}, got {r['attacker_index']}")
    if r["isolate"] and K < 2:
        raise ValueError("isolate needs at least two clients (the target and the rest of the federation)")
    return r


def active_attack_runs(model: nn.Module, clients: fl.ClientData, params: dict, runs: Sequence[dict], *,
                       num_rounds: int, local: fl.LocalTraining = fl.LocalTraining(), seed: int = 0,
                       return_trace: bool = False) -> list:
    """Several :func:`active_attack_rounds` at once, on the same federation (``clients``, ``params``,
    ``num_rounds``, the clients' training ``local`` and the ``seed``): each run is a mapping of the
    candidates ``X_target``, ``y_target`` and the fields of an :class:`ActiveAttack`, ``target``,
    ``ascent_lr`` and optionally ``attacker``, ``isolate``, ``attacker_index``. Every run has its own
    generator seeded with ``seed``, as a call of :func:`active_attack_rounds` has; the local training of all
    runs' clients goes through one vmapped step (:func:`fedlab.fl.stacked.sgd_jobs`). Returns what
    :func:`active_attack_rounds` returns for each run, bit for bit, in order. Raises ``ValueError`` as
    that function does, for no runs, and naming ``local`` for ``local_steps`` or ``weight_decay`` (these
    rounds train ``local_epochs`` epochs of plain SGD)."""
    from ..fl.stacked import PlanCache, SGDJob, sgd_jobs

    K = clients.num_clients
    if not runs:
        raise ValueError("runs must hold at least one run")
    if local.local_steps is not None or local.weight_decay != 0:
        raise ValueError(f"local: these rounds train local_epochs epochs of plain SGD, got "
                         f"local_steps={local.local_steps}, weight_decay={local.weight_decay}")
    lr, local_epochs, batch_size, loss_fn = local.lr, local.local_epochs, local.batch_size, local.loss_fn
    runs = [_check_active_run(dict(r), K) for r in runs]
    if int(num_rounds) != num_rounds or num_rounds < 1:
        raise ValueError(f"num_rounds must be a positive integer, got {num_rounds}")
    weights = clients.n.float()
    plans = PlanCache()
    state = []
    for r in runs:
        others = weights.clone()
        others[r["target"]] = 0.0         # the isolated target's returns stay out of the others' aggregate
        state.append({"gen": torch.Generator().manual_seed(seed), "others": others, "observed": [],
                      "trace": {"received": [], "returned": [], "global": []},
                      "own": {k: v.detach().clone() for k, v in params.items()}})   # the isolated target's model

    def step(t, ws):
        jobs, sends = [], []
        for r, st, w in zip(runs, state, ws):
            send = {k: v.unsqueeze(0).repeat(K, *([1] * v.ndim)) for k, v in w.items()}
            if r["attacker"] == "server":
                base = st["own"] if r["isolate"] else w
                if r["ascent_lr"] > 0:
                    base = gradient_ascent(model, base, r["X_target"], r["y_target"], ascent_lr=r["ascent_lr"],
                                           loss_fn=loss_fn)
                rows = [r["target"]] if r["isolate"] else list(range(K))
                for k in send:
                    send[k][rows] = base[k]
            idx, wt = plans.batch_plan(clients.n, batch_size, local_epochs, st["gen"])
            jobs.append(SGDJob(send, clients.X, clients.y, idx.to(clients.X.device), wt.to(clients.X.device), lr,
                               single=K == 1))
            sends.append(send)
        new_ws = []
        for r, st, send, local in zip(runs, state, sends, sgd_jobs(model, jobs, loss_fn=loss_fn)):
            target = r["target"]
            if r["attacker"] == "participant" and r["ascent_lr"] > 0:
                a = r["attacker_index"]
                mine = {k: v[a] for k, v in local.items()}
                up = gradient_ascent(model, mine, r["X_target"], r["y_target"], ascent_lr=r["ascent_lr"], loss_fn=loss_fn)
                for k in local:
                    local[k][a] = up[k]
            new_w = fl.weighted_average(local, st["others"] if r["isolate"] else weights)
            returned = {k: v[target].detach().clone() for k, v in local.items()}
            if r["isolate"]:
                st["own"] = returned
            seen = returned if r["attacker"] == "server" else new_w
            st["observed"].append(per_example_loss(model, seen, r["X_target"], r["y_target"], loss_fn))
            if return_trace:
                st["trace"]["received"].append({k: v[target].detach().clone() for k, v in send.items()})
                st["trace"]["returned"].append(returned)
                st["trace"]["global"].append({k: v.detach().clone() for k, v in new_w.items()})
            new_ws.append({k: v.detach() for k, v in new_w.items()})
        return new_ws

    fl.run_rounds(int(num_rounds), step, [{k: v.detach().clone() for k, v in params.items()} for _ in runs])
    out = []
    for st in state:
        signals = torch.stack(st["observed"])
        out.append({"signals": signals, **st["trace"]} if return_trace else signals)
    return out


# ---------------------------------------------------------------------------------------------------
# the likelihood-ratio attack (LiRA) of Carlini et al. (S&P 2022)
# ---------------------------------------------------------------------------------------------------

def logit_confidence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The logit-scaled confidence of the true label (Carlini et al., "Membership inference attacks from
    first principles", S&P 2022, Sec. IV-B): ``phi = log(p_y / (1 - p_y))`` with ``p = softmax(logits)``,
    computed stably as ``logit_y - logsumexp_{j != y} logit_j`` (no ``log(0)`` for a confident model).

    ``logits``: ``[..., n, C]`` with ``C >= 2``; ``labels``: ``[n]`` or ``[..., n]`` (broadcast over the
    leading dimensions), integers in ``0..C-1``. Returns ``[..., n]`` (float64). Raises ``ValueError`` for
    fewer than two classes, labels whose shape does not match, labels outside ``0..C-1``, or non-finite
    logits."""
    Z = torch.as_tensor(logits).double()
    if Z.ndim < 2 or Z.shape[-1] < 2:
        raise ValueError(f"logits must be [..., n, C] with C >= 2 classes, got shape {tuple(Z.shape)}")
    if not torch.isfinite(Z).all():
        raise ValueError("logits must be finite")
    y = torch.as_tensor(labels)
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    if y.shape != Z.shape[-2 - y.ndim + 1:-1] or y.ndim == 0:
        raise ValueError(f"labels must be [n] or [..., n] matching logits {tuple(Z.shape)}, got {tuple(y.shape)}")
    C = Z.shape[-1]
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= C):
        raise ValueError(f"labels must lie in 0..{C - 1}, got values in {int(y.min())}..{int(y.max())}")
    y = y.long().expand(Z.shape[:-1])
    true = Z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    others = Z.scatter(-1, y.unsqueeze(-1), float("-inf"))
    return true - torch.logsumexp(others, dim=-1)


def balanced_inclusion(num_shadows: int, n: int, *, seed: int = 0) -> torch.Tensor:
    """Which of ``n`` records each of ``num_shadows`` shadow models trains on, for LiRA's online variant
    (Carlini et al. 2022, Sec. IV-C: every record IN half of the shadows, OUT of the other half): shadows
    come in pairs, the first of a pair takes a uniformly random half of the records (``n // 2``), the
    second the other half. Returns a bool ``[num_shadows, n]``; every column holds exactly
    ``num_shadows / 2`` trues and every row ``n // 2`` or ``n - n // 2``. Raises ``ValueError`` for
    ``num_shadows`` not an even integer >= 2 or ``n < 2``."""
    if isinstance(num_shadows, bool) or int(num_shadows) != num_shadows or num_shadows < 2 or num_shadows % 2:
        raise ValueError(f"num_shadows must be an even integer >= 2 (shadows come in IN/OUT pairs), got {num_shadows}")
    if isinstance(n, bool) or int(n) != n or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n}")
    gen = torch.Generator().manual_seed(int(seed))
    rows = []
    for _ in range(int(num_shadows) // 2):
        first = torch.zeros(int(n), dtype=torch.bool)
        first[torch.randperm(int(n), generator=gen)[: int(n) // 2]] = True
        rows += [first, ~first]
    return torch.stack(rows)


def lira_scores(target_phi, shadow_phi, shadow_in, *, fixed_variance: bool = False,
                min_std: float = 1e-6) -> np.ndarray:
    """The online likelihood-ratio attack, LiRA (Carlini et al., "Membership inference attacks from first
    principles", S&P 2022, Sec. IV, Algorithm 1): for each record fit one Gaussian to its logit-scaled
    confidence (:func:`logit_confidence`) under the shadow models that trained on it (IN) and one under
    those that did not (OUT), and score the target model's confidence by the log likelihood ratio
    ``log N(phi; mu_in, sigma_in^2) - log N(phi; mu_out, sigma_out^2)`` (higher means "member").

    ``target_phi``: ``[n]``, the target model's confidence on each record; ``shadow_phi``: ``[S, n]``,
    shadow ``s``'s confidence on record ``i``; ``shadow_in``: bool ``[S, n]``, whether shadow ``s`` trained on
    record ``i``. ``fixed_variance``: per-record means but one ``sigma_in`` and one ``sigma_out`` pooled over
    all records (the paper's choice with few shadows, Sec. VI-A: "fixed variance"); otherwise each record's
    own standard deviations. Standard deviations are floored at ``min_std`` (records whose shadows agree
    exactly). Returns ``[n]`` (float64).

    Raises ``ValueError`` for mismatched shapes, non-finite confidences, a ``shadow_in`` that is not boolean,
    ``min_std`` not > 0, or a record without an IN or an OUT shadow (two of each without ``fixed_variance``,
    to estimate a variance)."""
    t = np.asarray(target_phi, dtype=np.float64)
    P = np.asarray(shadow_phi, dtype=np.float64)
    I = np.asarray(shadow_in)
    if t.ndim != 1 or t.shape[0] == 0:
        raise ValueError(f"target_phi must be [n] with n >= 1, got shape {t.shape}")
    if P.ndim != 2 or P.shape[1] != t.shape[0]:
        raise ValueError(f"shadow_phi must be [S, n] with n = {t.shape[0]}, got shape {P.shape}")
    if I.shape != P.shape:
        raise ValueError(f"shadow_in must have the shape of shadow_phi {P.shape}, got {I.shape}")
    if I.dtype != np.bool_:
        raise ValueError(f"shadow_in must be boolean, got dtype {I.dtype}")
    if not (np.isfinite(t).all() and np.isfinite(P).all()):
        raise ValueError("target_phi and shadow_phi must be finite")
    if not min_std > 0:
        raise ValueError(f"min_std must be > 0, got {min_std}")
    n_in, n_out = I.sum(0), (~I).sum(0)
    need = 1 if fixed_variance else 2
    if n_in.min() < need or n_out.min() < need:
        bad = int(np.flatnonzero((n_in < need) | (n_out < need))[0])
        raise ValueError(f"shadow_in: every record needs at least {need} IN and {need} OUT shadows "
                         f"(record {bad} has {int(n_in[bad])} IN, {int(n_out[bad])} OUT)")
    mu_in = (P * I).sum(0) / n_in
    mu_out = (P * ~I).sum(0) / n_out
    dev_in, dev_out = (P - mu_in) * I, (P - mu_out) * ~I
    if fixed_variance:
        sd_in = np.sqrt((dev_in ** 2).sum() / max(int(n_in.sum()) - len(t), 1))
        sd_out = np.sqrt((dev_out ** 2).sum() / max(int(n_out.sum()) - len(t), 1))
        sd_in, sd_out = np.full_like(t, sd_in), np.full_like(t, sd_out)
    else:
        sd_in = np.sqrt((dev_in ** 2).sum(0) / (n_in - 1))
        sd_out = np.sqrt((dev_out ** 2).sum(0) / (n_out - 1))
    sd_in, sd_out = np.maximum(sd_in, min_std), np.maximum(sd_out, min_std)

    def log_normal(x, mu, sd):
        return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd)

    return log_normal(t, mu_in, sd_in) - log_normal(t, mu_out, sd_out)
