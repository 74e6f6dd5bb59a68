"""Chapter 4's experiments (Xu & Neglia 2021, Sec. 4): the Adult PhD split, Table 1 on LEAF's
synthetic clients and Figure 1 on Adult, each an eavesdropped FedAvg run followed by the heuristic
reconstruction (Algorithm 3) of :mod:`fedlab.attacks.model_reconstruction`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..attacks.model_reconstruction import binary_accuracy, reconstruct_heuristic, run_eavesdropped_fedavg
from ..models import flatten_params, linear_model, logistic_loss

__all__ = ["BACHELOR_OR_ABOVE", "adult_phd_split", "adult_phd_clients", "leaf_table1", "adult_experiment"]


#: Adult education levels at least "bachelor" (Xu & Neglia 2021, Sec. 4)
BACHELOR_OR_ABOVE = ("Bachelors", "Masters", "Prof-school", "Doctorate")


def adult_phd_split(education, age, *, num_other_clients: int = 7, young: int = 38, old: int = 52,
                    seed: int = 0) -> list[np.ndarray]:
    """Xu & Neglia (2021, Sec. 4) non-iid split of Adult over ``3 + num_other_clients`` clients.

    Only records with education at least "bachelor" are kept. The PhDs ("Doctorate") go to the first
    three clients by age: client 0 holds ``age < young``, client 1 holds ``young <= age <= old`` and
    client 2 holds ``age > old``. The remaining records are shuffled and dealt evenly over the other
    ``num_other_clients`` clients.

    Parameters
    ----------
    education : array of str, shape ``[n]`` (``Dataset.meta["education"]`` of :func:`load_adult`)
    age : array of int, shape ``[n]`` (``Dataset.meta["age"]``)

    Returns
    -------
    list of ``3 + num_other_clients`` sorted index arrays into the ``n`` records (disjoint).

    Raises
    ------
    ValueError
        If the arrays differ in length, ``num_other_clients < 1``, ``young > old``, or a PhD client
        would be empty.
    """
    education = np.asarray(education).astype(str)
    age = np.asarray(age)
    if education.shape != age.shape or education.ndim != 1:
        raise ValueError(f"education and age must be 1-d arrays of one length, got {education.shape} "
                         f"and {age.shape}")
    if int(num_other_clients) != num_other_clients or num_other_clients < 1:
        raise ValueError(f"num_other_clients must be a positive integer, got {num_other_clients}")
    if young > old:
        raise ValueError(f"young ({young}) must not exceed old ({old})")
    keep = np.isin(education, BACHELOR_OR_ABOVE)
    phd = keep & (education == "Doctorate")
    parts = [np.flatnonzero(phd & (age < young)),
             np.flatnonzero(phd & (age >= young) & (age <= old)),
             np.flatnonzero(phd & (age > old))]
    if min(len(p) for p in parts) == 0:
        raise ValueError("a PhD client would be empty: does the data hold Doctorate records?")
    rest = np.random.default_rng(seed).permutation(np.flatnonzero(keep & ~phd))
    parts += [np.sort(p) for p in np.array_split(rest, num_other_clients)]
    return parts


def adult_phd_clients(split: str = "train", *, num_other_clients: int = 7, seed: int = 0):
    """The clients of :func:`adult_phd_split` on :func:`fedlab.data.load_adult` ``(split)``.

    Returns a list of :class:`fedlab.data.Dataset`, one per client (``X`` ``[n_k, 104]``).
    """
    from ..data import client_datasets, load_adult

    ds = load_adult(split)
    parts = adult_phd_split(ds.meta["education"], ds.meta["age"],
                            num_other_clients=num_other_clients, seed=seed)
    return client_datasets(ds, parts)


def _logistic_fedavg(clients, *, num_rounds, local_steps, batch_size, lr, seed, client_fraction=1.0):
    """FedAvg on binary logistic regression with an eavesdropper on every client. Returns the
    final global theta ``[d]`` and the observations ``(theta_in [K, n, d], theta_out [K, n, d])``."""
    d_x = clients[0].X.shape[1]
    model = linear_model(d_x, bias=True, dtype=torch.float32, seed=seed)
    pairs = [(c.X.float(), c.y) for c in clients]
    res, spy = run_eavesdropped_fedavg(model, pairs, num_rounds=num_rounds, local_epochs=1,
                                       local_steps=local_steps, batch_size=batch_size, lr=lr,
                                       seed=seed, loss_fn=logistic_loss, client_fraction=client_fraction)
    obs = [spy.observations(k) for k in range(len(clients))]
    return flatten_params(res.params).double(), obs


def leaf_table1(clients, *, local_steps: Sequence[int] = (1, 5, 10), seeds: Sequence[int] = range(10),
                num_rounds: int = 100, batch_size: int = 256, lr: float = 0.01, hidden: int = 1000,
                fit_steps: int = 1000, decode_steps: int = 1000) -> dict:
    """Xu & Neglia (2021), Table 1: train accuracy on each client's data of the last model it
    returned (``theta_tilde_c``) and of the model decoded by Algorithm 3 (``hat theta_c*``).

    FedAvg with every client in every round, ``local_steps`` SGD steps of ``batch_size`` per round,
    binary logistic regression; one run per seed (model initialisation, batches, mapping init).
    All ``len(seeds) * K`` attacks of a local-step setting are trained as one batch.

    Returns ``{"local_steps": [L], "last": [L, S, K], "decoded": [L, S, K], "mapping_loss": [L, S, K]}``
    (accuracies in [0, 1]).
    """
    K = len(clients)
    last = np.zeros((len(local_steps), len(seeds), K))
    dec = np.zeros_like(last)
    mloss = np.zeros_like(last)
    for i, E in enumerate(local_steps):
        tin, tout = [], []
        for s in seeds:
            _, obs = _logistic_fedavg(clients, num_rounds=num_rounds, local_steps=E,
                                      batch_size=batch_size, lr=lr, seed=int(s))
            tin += [o[0] for o in obs]
            tout += [o[1] for o in obs]
        tin, tout = torch.stack(tin).double(), torch.stack(tout).double()   # [S*K, n, d]
        res = reconstruct_heuristic(tin, tout, hidden=hidden, fit_steps=fit_steps,
                                    decode_steps=decode_steps, seed=i)
        for j in range(len(seeds)):
            for k in range(K):
                p = j * K + k
                X, y = clients[k].X, clients[k].y
                last[i, j, k] = float(binary_accuracy(tout[p, -1], X, y))
                dec[i, j, k] = float(binary_accuracy(res.theta[p], X, y))
                mloss[i, j, k] = float(res.mapping_loss[p])
    return {"local_steps": list(local_steps), "last": last, "decoded": dec, "mapping_loss": mloss}


def adult_experiment(train_clients, test_clients, *, targets: Sequence[int] = (0, 1, 2),
                     batch_sizes: Sequence[int] = (16, 64, 256), seeds: Sequence[int] = range(3),
                     num_rounds: int = 100, lr: float = 0.001, hidden: int = 1000,
                     fit_steps: int = 1000, decode_steps: int = 1000) -> dict:
    """Xu & Neglia (2021), Figure 1b-c on the Adult split: FedAvg with one local step, step ``lr``;
    for each batch size and seed, attack the ``targets`` with Algorithm 3 and report the relative
    mapping loss and the test accuracy (on each target's own test records) of the decoded model
    and of the last returned model.

    Returns ``{"batch_sizes", "mapping_loss": [B, S, T], "test_decoded": [B, S, T],
    "test_last": [B, S, T], "train_decoded", "train_last", "test_global": [B, S, T]}``.
    """
    T = len(targets)
    shape = (len(batch_sizes), len(seeds), T)
    out = {k: np.zeros(shape) for k in ("mapping_loss", "test_decoded", "test_last", "train_decoded",
                                        "train_last", "test_global")}
    for i, B in enumerate(batch_sizes):
        tin, tout, glob = [], [], []
        for s in seeds:
            g, obs = _logistic_fedavg(train_clients, num_rounds=num_rounds, local_steps=1,
                                      batch_size=B, lr=lr, seed=int(s))
            tin += [obs[t][0] for t in targets]
            tout += [obs[t][1] for t in targets]
            glob.append(g)
        tin, tout = torch.stack(tin).double(), torch.stack(tout).double()
        res = reconstruct_heuristic(tin, tout, hidden=hidden, fit_steps=fit_steps,
                                    decode_steps=decode_steps, seed=i)
        for j in range(len(seeds)):
            for k, t in enumerate(targets):
                p = j * T + k
                te, tr = test_clients[t], train_clients[t]
                out["mapping_loss"][i, j, k] = float(res.mapping_loss[p])
                out["test_decoded"][i, j, k] = float(binary_accuracy(res.theta[p], te.X, te.y))
                out["test_last"][i, j, k] = float(binary_accuracy(tout[p, -1], te.X, te.y))
                out["test_global"][i, j, k] = float(binary_accuracy(glob[j], te.X, te.y))
                out["train_decoded"][i, j, k] = float(binary_accuracy(res.theta[p], tr.X, tr.y))
                out["train_last"][i, j, k] = float(binary_accuracy(tout[p, -1], tr.X, tr.y))
    out["batch_sizes"] = list(batch_sizes)
    return out
