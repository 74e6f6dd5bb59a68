"""Federated learning protocols: FedAvg / FedSGD (McMahan et al. 2017) and selective SGD
(Shokri & Shmatikov 2015), and the protocols built on them.

This package's ``__init__`` is an index: ``from fedlab import fl; fl.fedavg(...)`` reaches every name below,
each defined once in its module:

* :mod:`fedlab.fl.local`: a client's training and the evaluation of a model (:class:`ClientData`,
  :func:`stack_clients`, :func:`batch_plan`, :func:`client_update`, :func:`clients_update` (every client in
  one ``vmap``), :func:`cross_entropy`, :func:`evaluate`);
* :mod:`fedlab.fl.protocols`: the server's side and the protocols (:func:`weighted_average`, :func:`fedavg`,
  :func:`fedsgd`, :func:`train_centralized`, :func:`train_standalone`, :func:`selective_sgd` (its :class:`Sharing`),
  :func:`select_upload`, :class:`FLResult`, :class:`RoundRecord`, :func:`eval_fn`);
* :mod:`fedlab.fl.rounds`: the one round loop (:func:`run_rounds`) and its :class:`History`.

The other modules are imported by name: :mod:`fedlab.fl.stacked` (several runs at once),
:mod:`fedlab.fl.dp_fedavg`, :mod:`fedlab.fl.personalization`, :mod:`fedlab.fl.ifca`,
:mod:`fedlab.fl.recsys`, :mod:`fedlab.fl.oltr`.
"""
from .local import (ClientData, LocalTraining, batch_plan, client_update, clients_update, cross_entropy, evaluate,
                    stack_clients)
from .protocols import (FLResult, RoundRecord, Sharing, eval_fn, fedavg, fedsgd, select_upload, selective_sgd,
                        train_centralized, train_standalone, weighted_average)
from .rounds import History, run_rounds

__all__ = [
    "ClientData", "LocalTraining", "stack_clients", "batch_plan", "client_update", "clients_update",
    "weighted_average", "FLResult", "History", "run_rounds", "eval_fn", "RoundRecord", "fedavg", "fedsgd", "train_centralized",
    "train_standalone", "selective_sgd", "Sharing", "select_upload", "cross_entropy", "evaluate",
]
