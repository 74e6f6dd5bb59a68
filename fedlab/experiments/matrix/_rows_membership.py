"""The matrix's rows of Chapter 1c: membership inference by the passive server (its FedAvg run under each
column also gives the column's utility) and by the active server (isolation and gradient ascent)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ... import fl, models
from ...config import pick
from ...privacy import registry as reg
from ...privacy import dp_fedavg as dpf
from ...privacy.registry import dp_noise_multiplier, median_norm
from ...attacks import membership as mia
from ...data import client_datasets, load_digits, partition_iid, train_test_split
from .layout import _defense, _gens, _size


# ----------------------------------------------------------------------------------------------------
# row 4: passive membership inference by the server (Chapter 1c)
def _mia_federation(seed: int, K: int, n: int):
    """Chapter 1c's federation: ``K`` clients of ``n`` digits each, every client's candidates (its ``n``
    members, then ``n`` non-members from held-out digits), the membership labels, the 64-64-10 MLP and a
    test set (held-out digits that are no client's and no candidate's).
    Returns ``(clients, cand_X [K, 2n, 64], cand_y [K, 2n], is_member [2n], net, test)``."""
    digits = load_digits()
    train, held = train_test_split(digits, test_fraction=0.5, seed=seed)
    nonmembers, test = train_test_split(held, test_fraction=0.5, seed=seed)
    parts = [p[:n] for p in partition_iid(len(train), K, seed=seed)]
    clients = fl.stack_clients(client_datasets(train, parts))
    nm = nonmembers.subset(np.arange(K * n))
    cand_X = torch.cat([clients.X, nm.X.reshape(K, n, 64)], dim=1)
    cand_y = torch.cat([clients.y, nm.y.reshape(K, n)], dim=1)
    is_member = np.r_[np.ones(n), np.zeros(n)]
    return clients, cand_X, cand_y, is_member, models.mlp(64, (64,), 10, seed=seed), test


def _mia_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """The passive server of Chapter 1c (Nasr et al. 2019 setting): 10 clients with 20 digits each train
    an MLP with FedAvg (all clients every round, 2 local epochs, B = 10, lr 0.3); the server scores each
    client's 20 members against 20 non-members by their loss under the models it observed, averaged over
    the last 10 rounds (:func:`fedlab.attacks.membership.attack_auc`, mean over clients). Every client
    applies the defense to its update each round and the aggregate is the mean of what was sent (for
    DP-FedAvg: :func:`fedlab.privacy.dp_fedavg.dp_aggregate`; for secure aggregation the secure sum,
    and the server observes only the global models). Under DP-FedAvg the curious server observes each
    client's clipped update before its noise (added to the released model it trains on); an outsider
    (``outsider``) observes the target's clipped update plus the noise of the sum (the release, all
    other updates known). ``C`` is the median update norm of the first
    round, then fixed. Metric: AUC. Also returns ``"acc_<column>"``: the test accuracy of the final global
    model under each column (the utility the defense leaves)."""
    K, n, window = 10, 20, 10
    num_rounds = 12 if tiny else _mia_rounds()
    clients, cand_X, cand_y, is_member, net, test = _mia_federation(seed, K, n)
    w0 = models.get_params(net)
    out = {"baseline": 0.5}
    fixed = {}
    for c in columns:
        d = _defense(c)
        gen, rng = _gens(seed, 4)
        batches = torch.Generator().manual_seed(seed)
        recorder = mia.SnapshotRecorder()

        def step(t, w, d=d, gen=gen, rng=rng, batches=batches, recorder=recorder):
            local = fl.clients_update(net, w, clients, generator=batches,
                                      local=fl.LocalTraining(lr=0.3, local_epochs=2, batch_size=10))
            U = models.flatten_stacked({k: local[k] - w[k] for k in w})
            theta = models.flatten_params(w)
            if t == 1:                                                 # C fixed from the first round's updates
                fixed["C"] = median_norm(U)
            C = fixed["C"]
            if d.kind == "dp":
                upd = models.unflatten_stacked(U, w)
                noisy, clean = dpf.dp_aggregate(upd, clip_norm=C, noise_multiplier=dp_noise_multiplier(d.param),
                                                expected_clients=K, generator=gen, safe=d.safe)
                noise = K * (models.flatten_params(noisy) - models.flatten_params(clean))
                clipped = reg.apply(U, d, clip_norm=C, client_side_noise=False)
                # the server sees each clipped update before its noise; an outsider the release minus the others
                views = theta + clipped + noise if outsider else theta + clipped
                new = theta + models.flatten_params(noisy)
            elif d.kind == "secagg":
                new = theta + reg.apply(U, d, group=K, generator=gen)[0] / K
                views = new.expand(K, -1)                              # the server sees the aggregate only
            else:
                sent = reg.apply(U, d, clip_norm=C, generator=gen, rng=rng)
                views = theta + sent
                new = theta + sent.mean(0)
            recorder(fl.RoundRecord(t, w, np.arange(K), models.unflatten_stacked(views, w), torch.ones(K)))
            return models.unflatten_params(new, w)

        final, _, _ = fl.run_rounds(num_rounds, step, {k: v.clone() for k, v in w0.items()})
        signals = mia.client_signals(net, recorder, cand_X, cand_y)
        out[c] = mia.attack_auc(signals[:, -window:], is_member, window)
        out[f"acc_{c}"] = fl.evaluate(net, final, test.X, test.y)["accuracy"]
    return out


#: Chapter 1c's honest FedAvg rounds of the membership rows, (quick, paper)
_MIA_ROUNDS = (30, 100)


def _mia_rounds() -> int:
    return pick(quick=_MIA_ROUNDS[0], paper=_MIA_ROUNDS[1])


def _mia_active_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The isolating server of Chapter 1c with Nasr et al.'s gradient ascent (gamma = 2): after Chapter 1c's
    30 honest FedAvg rounds (10 clients x 20 digits, MLP), the server runs 5 attack rounds against each
    of the 10 clients in turn (:func:`fedlab.attacks.membership.active_attack_rounds`, ``isolate=True``),
    and scores the target's candidates by their mean loss under the models the target returned. The
    defenses act on the target's returned update (model returned minus model received) of the
    undefended run's trace: the attacker's observations change, the run's trajectory does not (a
    simplification). DP-FedAvg: the target's clipped update plus the noise of the sum; secure
    aggregation: the server sees only the average of all returned models (the target's among the nine
    others'), so isolation no longer shows it the target alone. Metric: AUC (mean over targets)."""
    K, n, gamma = 10, 20, 2.0
    rounds = _size(tiny, tiny_value=3, quick=5, paper=10)
    honest_rounds = 12 if tiny else _mia_rounds()
    fl_args = dict(local_epochs=2, batch_size=10, lr=0.3)
    clients, cand_X, cand_y, is_member, net, _ = _mia_federation(seed, K, n)
    honest = fl.fedavg(net, clients, num_rounds=honest_rounds, params=models.get_params(net), seed=seed,
                       local=fl.LocalTraining(**fl_args))
    traces = [mia.active_attack_rounds(net, clients, honest.params, cand_X[k], cand_y[k],
                                       attack=mia.ActiveAttack(target=k, ascent_lr=gamma, attacker="server", isolate=True),
                                       num_rounds=rounds, local=fl.LocalTraining(**fl_args), seed=seed + 1,
                                       return_trace=True) for k in range(K)]
    like = honest.params
    received = torch.stack([models.flatten_params(p) for tr in traces for p in tr["received"]])    # [K * rounds, n]
    returned = torch.stack([models.flatten_params(p) for tr in traces for p in tr["returned"]])
    others = torch.stack([models.flatten_params(p) for tr in traces for p in tr["global"]])
    U = returned - received
    C = median_norm(U)
    gen, rng = _gens(seed, 10)
    out = {"baseline": 0.5}
    for c in columns:
        d = _defense(c)
        if d.kind == "secagg":
            views = (returned + (K - 1) * others) / K
        else:
            views = received + reg.apply(U, d, clip_norm=C, generator=gen, rng=rng)
        aucs = []
        for k in range(K):
            rows = models.unflatten_stacked(views[k * rounds:(k + 1) * rounds], like)
            S = torch.stack([mia.per_example_loss(net, {name: v[t] for name, v in rows.items()}, cand_X[k], cand_y[k])
                             for t in range(rounds)])
            aucs.append(mia.attack_auc(S, is_member, rounds))
        out[c] = float(np.mean(aucs))
    return out
