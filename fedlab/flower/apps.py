"""fedlab's client update and FedAvg server as a Flower ``ClientApp`` / ``ServerApp`` (Message API).

This module imports ``flwr`` (the ``flower`` extra: ``pip install ".[flower]"``). The apps are the
same objects in a simulation (:func:`run`: the client apps in Ray workers, :class:`RayGrid`, or in this
process, :class:`LocalGrid`) and in deployment mode (``flower-superlink``
+ ``flower-supernode`` + ``flwr run``, see the README).

The protocol (McMahan et al. 2017, Algorithm 1, as :func:`fedlab.fl.fedavg` runs it):

1. the ServerApp asks every node (a ``query`` message) for its partition id and its number of
   examples ``n_k``;
2. it replays the random stream of :func:`fedlab.fl.fedavg` with the run's seed
   (:func:`fedavg_schedule`): each round it samples ``m = max(round(C K), 1)`` partitions, and for
   each one the state of the generator at which that client's mini-batch shuffles begin;
3. each round, every sampled node receives the global model (an ``ArrayRecord``) and a
   ``ConfigRecord`` (``lr``, ``local-epochs``, ``batch-size`` (0: full batch), ``local-steps`` (0:
   epochs), ``weight-decay``, ``rng-state``); the ClientApp runs :func:`fedlab.fl.client_update` on
   its partition with that generator state and replies with its new model and ``num-examples``;
4. Flower's ``FedAvg`` averages the replies weighted by ``num-examples`` (optionally inside Flower's
   ``DifferentialPrivacyClientSideFixedClipping`` / ``DifferentialPrivacyServerSideFixedClipping``),
   and :class:`Recorder`, the outermost strategy, writes every reply it receives to the transcript
   (:mod:`fedlab.flower.transcript`) before anything else touches it.

With ``aggregation=SecAgg()`` (:func:`server_app`, :func:`run`; :func:`client_app`'s ``secagg=True``) steps 3-4 run through Flower's
SecAgg+ instead (Bell et al. 2020; Bonawitz et al. 2017): ``flwr.server.workflow.SecAggPlusWorkflow`` on
the server, ``flwr.client.mod.secaggplus_mod`` on the clients. Each round then takes four message
exchanges (public keys, encrypted key shares, masked models, unmasking shares); every client sends its
model weighted, quantized and masked, and the server learns only the weighted sum. The recorder then
stores what the server receives in each stage (:class:`SecAggRecordingGrid`): no reply carries a model.

Why this module still imports ``flwr.compat`` / ``flwr.server.compat`` (flwr 1.42): Flower's only SecAgg+
implementation is built on them. ``SecAggPlusWorkflow`` accepts nothing but a ``LegacyContext`` (it raises
``TypeError`` otherwise), asks a legacy ``Strategy`` for ``(ClientProxy, FitIns)`` pairs (we give it
``GridClientProxy``, Flower's own proxy over a ``Grid``) and converts with ``recorddict_compat``; on the
client, ``secaggplus_mod`` reads the reply in the legacy ``fitres.*`` layout that
``recorddict_compat.fitres_to_recorddict`` writes. Leaving them would mean re-implementing Flower's SecAgg+.
Everything outside SecAgg+ uses the Message API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``).

Because step 2 reproduces fedavg's client sampling and shuffles exactly, a Flower run and
``fedlab.fl.fedavg`` with the same data, seed and settings give the same global model up to float
rounding (``tests/test_flower.py`` measures the difference).
"""
from __future__ import annotations

import copy
import logging
import os
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..fl import ClientData, LocalTraining, batch_plan, client_update, cross_entropy, evaluate, stack_clients
from ..fl.local import _local
from .transcript import Transcript, TranscriptWriter, load_transcript

try:
    from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord,
                          RecordDict)
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import (DifferentialPrivacyClientSideFixedClipping,
                                         DifferentialPrivacyServerSideFixedClipping, FedAvg, Strategy)
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key as SecAggKey, Stage
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server import ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import Strategy as LegacyStrategy
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key as WorkflowKey
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("fedlab.flower needs Flower: install the extra with `pip install \".[flower]\"` "
                      f"(flwr[simulation]>=1.41,<2); the import failed with: {err}") from err

__all__ = ["fedavg_schedule", "client_app", "server_app", "Recorder", "ScheduledFedAvg", "LocalGrid", "run",
           "FixedClippingDP", "SecAgg", "Engine", "Timeouts",
           "RayStartError", "RayGrid", "FlowerRun", "quiet_flower", "DP_MODES", "ENGINES", "SECAGG_DEFAULTS", "secagg_config", "SecAggSchedule",
           "SecAggRecordingGrid", "RecordingGrid", "SECAGG_KINDS", "CONSISTENCY_KIND"]

#: the server's DP modes: none, Flower's client-side or server-side fixed clipping wrapper (:class:`FixedClippingDP`'s ``mode``)
DP_MODES = (None, "client", "server")
#: values of :class:`Engine`'s ``name``: the client apps in Ray workers (:class:`RayGrid`), or in-process (:class:`LocalGrid`)
ENGINES = ("ray", "local")
LoadPartition = Callable[[int, int], object]
#: SecAgg+ settings (``flwr.server.workflow.SecAggPlusWorkflow``'s arguments); ``num_shares=1.0`` shares every
#: key with all the round's clients, ``max_weight=None`` means the largest client's number of examples
#: (the server learns every ``n_k`` in the query); the rest are Flower's defaults
SECAGG_DEFAULTS = {"num_shares": 1.0, "reconstruction_threshold": 0.5, "max_weight": None, "clipping_range": 8.0,
                   "quantization_range": 2 ** 22, "modulus_range": 2 ** 32}


# --------------------------------------------------------------------------------------------
# settings objects: how the server aggregates, where the simulation runs, how long the server waits
# --------------------------------------------------------------------------------------------
def _finite(name: str, value, low: float, *, closed: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or not (value >= low if closed else value > low):
        raise ValueError(f"{name} must be a finite number {'>=' if closed else '>'} {low}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FixedClippingDP:
    """Flower's central differential privacy around FedAvg: DP-FedAvg with fixed clipping (McMahan et al.
    2018, Alg. 1; Flower's ``DifferentialPrivacyClientSideFixedClipping`` and
    ``DifferentialPrivacyServerSideFixedClipping``), one of the server's ``aggregation`` settings of
    :func:`server_app`, :func:`run` and :func:`fedlab.flower.deploy.write_app`.

    ``mode``
        ``"client"``: every client clips its update (the ClientApp's ``fixedclipping_mod``), the server adds
        the noise; ``"server"``: the server clips the updates it receives and adds the noise.
    ``noise_multiplier``
        ``z >= 0``: the noise std on the average is ``z C / m`` (``m`` clients a round).
    ``clipping_norm``
        ``C > 0``, the L2 bound on each client's update (Flower's name for ``clip_norm``).

    Raises ``ValueError`` naming the field for a ``mode`` not in ``("client", "server")``, a negative or
    non-finite ``noise_multiplier`` or a ``clipping_norm`` that is not finite and positive.
    """

    mode: str
    noise_multiplier: float = 1.0
    clipping_norm: float = 1.0

    def __post_init__(self):
        if self.mode not in ("client", "server"):
            raise ValueError(f"FixedClippingDP.mode must be 'client' or 'server', got {self.mode!r}")
        _finite("FixedClippingDP.noise_multiplier", self.noise_multiplier, 0.0, closed=True)
        _finite("FixedClippingDP.clipping_norm", self.clipping_norm, 0.0, closed=False)


@dataclass(frozen=True, eq=False)
class SecAgg:
    """Flower's SecAgg+ (Bell et al. 2020, Sec. 3, on Bonawitz et al. 2017's protocol) as the server's
    ``aggregation`` (:func:`server_app`, :func:`run`, :func:`fedlab.flower.deploy.write_app`): every round
    is the workflow's four stages and the server learns only the weighted sum of the clients' models.

    ``num_shares``, ``reconstruction_threshold``, ``max_weight``, ``clipping_range``, ``quantization_range``
    and ``modulus_range`` are ``flwr.server.workflow.SecAggPlusWorkflow``'s arguments, defaults
    :data:`SECAGG_DEFAULTS` (``num_shares=1.0`` shares every key with all the round's clients;
    ``max_weight=None``: the largest client's number of examples; the rest are Flower's defaults; see
    :func:`secagg_config`). The other fields:

    ``consistency``
        Add Bonawitz et al.'s consistency round (CCS 2017, Sec. 6): :func:`run` gives every client a signing
        key (:class:`fedlab.flower.secagg.ConsistencyKeys`); the clients then refuse a threshold ``t`` that
        is not above half of the registered clients.
    ``attack``
        A malicious server's hooks (:class:`fedlab.flower.attacks.FalseDropout`, ``SplitView``,
        ``InconsistentModel``); ``None``: honest.
    ``client_mods``
        Flower mods :func:`run` places first on the clients (:func:`client_app`'s ``secagg_mods``: for example
        :func:`fedlab.flower.secagg.disjoint_lists_mod`, :func:`fedlab.flower.secagg.drop_out_mod`).
    ``log``
        A :class:`fedlab.flower.secagg.SecAggLog` filled with what each stage sent and received (:func:`run`
        makes one when ``None`` and returns it as ``FlowerRun.secagg_log``).

    Compares by identity (it may hold a log and an attack). Raises ``ValueError`` naming the field for a bad
    setting (:func:`secagg_config`), a ``consistency`` that is not a bool or ``client_mods`` that are not
    callables.
    """

    num_shares: float = SECAGG_DEFAULTS["num_shares"]
    reconstruction_threshold: float = SECAGG_DEFAULTS["reconstruction_threshold"]
    max_weight: float | None = SECAGG_DEFAULTS["max_weight"]
    clipping_range: float = SECAGG_DEFAULTS["clipping_range"]
    quantization_range: int = SECAGG_DEFAULTS["quantization_range"]
    modulus_range: int = SECAGG_DEFAULTS["modulus_range"]
    consistency: bool = False
    attack: object = None
    client_mods: tuple = ()
    log: object = None

    def __post_init__(self):
        try:
            secagg_config(None, **{**self.settings, "max_weight": self.max_weight or 1.0})
        except ValueError as err:
            raise ValueError(f"SecAgg.{err}") from None
        if not isinstance(self.consistency, bool):
            raise ValueError(f"SecAgg.consistency must be True or False, got {self.consistency!r}")
        mods = tuple(self.client_mods or ())
        if not all(callable(m) for m in mods):
            raise ValueError(f"SecAgg.client_mods must be Flower mods (callables), got {self.client_mods!r}")
        object.__setattr__(self, "client_mods", mods)

    @property
    def settings(self) -> dict:
        """The six ``SecAggPlusWorkflow`` settings as :func:`secagg_config` takes them."""
        return {k: getattr(self, k) for k in SECAGG_DEFAULTS}


def _aggregation(aggregation):
    if aggregation is None or isinstance(aggregation, (FixedClippingDP, SecAgg)):
        return aggregation
    raise ValueError(f"aggregation must be None (FedAvg), a fedlab.flower.FixedClippingDP or a fedlab.flower.SecAgg, "
                     f"got {type(aggregation).__name__}: {aggregation!r}")


@dataclass(frozen=True)
class Engine:
    """Where :func:`run` simulates the clients.

    ``name``
        ``"ray"``: each round's messages go to the ``ClientApp`` in ``num_cpus`` Ray worker processes in parallel
        (:class:`RayGrid`); ``"local"``: the same apps over a :class:`LocalGrid` in this process (:data:`ENGINES`).
    ``num_cpus``
        Ray's CPUs and workers (a positive integer).
    ``verbose``
        Flower's INFO log and Ray's worker output (default: warnings only).

    Raises ``ValueError`` naming the field for a ``name`` not in :data:`ENGINES` or ``num_cpus < 1``.
    """

    name: str = "ray"
    num_cpus: int = 1
    verbose: bool = False

    def __post_init__(self):
        if self.name not in ENGINES:
            raise ValueError(f"Engine.name must be one of {ENGINES}, got {self.name!r}")
        _check_int("Engine.num_cpus", self.num_cpus, 1)


@dataclass(frozen=True)
class Timeouts:
    """How long :func:`server_app` waits, in seconds.

    ``node_timeout``
        For the ``num_clients`` nodes to connect, and again for them to answer the first query (Ray starts its
        workers on the first message: 10 virtual nodes on a loaded 2-core machine took over 60 s, the former
        default, three times in a row).
    ``round_timeout``
        For the replies of a round.

    Raises ``ValueError`` naming the field for a value that is not finite and positive.
    """

    node_timeout: float = 300.0
    round_timeout: float = 600.0

    def __post_init__(self):
        _finite("Timeouts.node_timeout", self.node_timeout, 0.0, closed=False)
        _finite("Timeouts.round_timeout", self.round_timeout, 0.0, closed=False)


#: transcript kinds of the four SecAgg+ stages, in protocol order (what each reply carries: public keys,
#: encrypted key shares for other clients, the masked model, key shares for unmasking)
SECAGG_KINDS = {Stage.SETUP: "secagg-keys", Stage.SHARE_KEYS: "secagg-shares",
                Stage.COLLECT_MASKED_VECTORS: "secagg-masked", Stage.UNMASK: "secagg-unmask"}
#: the transcript kind of the consistency round (stage ``fedlab.flower.secagg.CONSISTENCY_STAGE``), sent and received
CONSISTENCY_KIND = "secagg-consistency"


def _secagg_kind(stage: str) -> str:
    if stage == "fedlab-consistency":
        return CONSISTENCY_KIND
    return SECAGG_KINDS.get(stage, f"secagg-{stage}")


# --------------------------------------------------------------------------------------------
# the schedule: fedlab.fl.fedavg's random stream, replayed
# --------------------------------------------------------------------------------------------
def _check_int(name, value, low, allow_none=False):
    if allow_none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def fedavg_schedule(sizes, *, num_rounds: int, client_fraction: float = 1.0, local_epochs: int = 1,
                    batch_size: int | None = 10, local_steps: int | None = None,
                    seed: int = 0) -> list[list[tuple[int, torch.Tensor]]]:
    """Which clients :func:`fedlab.fl.fedavg` samples each round, and where each one's shuffles start.

    fedavg draws everything from one generator seeded with ``seed``: per round a ``randperm(K)`` whose
    first ``m = max(round(C K), 1)`` entries (sorted) are the sampled clients, then, client after
    client, the shuffles of :func:`fedlab.fl.batch_plan`. This function replays that stream.

    Parameters
    ----------
    sizes : sequence of int
        ``n_k`` of the ``K`` clients (partition ids ``0..K-1``).

    Returns
    -------
    list of rounds; round ``t - 1`` is a list of ``(k, state)``: partition ``k`` is sampled in round
    ``t`` and ``torch.Generator().set_state(state)`` makes :func:`fedlab.fl.client_update` shuffle
    exactly as fedavg's vmapped update did for it (``state``: ``uint8`` tensor).

    Raises
    ------
    ValueError
        For empty or non-positive ``sizes``, ``num_rounds < 0`` or ``client_fraction`` outside (0, 1].
    """
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must hold at least one client size >= 1, got {sizes}")
    num_rounds = _check_int("num_rounds", num_rounds, 0)
    if not 0.0 < client_fraction <= 1.0:
        raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
    K = len(sizes)
    m = max(int(round(client_fraction * K)), 1)
    gen = torch.Generator().manual_seed(int(seed))
    rounds = []
    for _ in range(num_rounds):
        selected = torch.randperm(K, generator=gen)[:m].sort().values.tolist()
        entries = []
        for k in selected:
            entries.append((k, gen.get_state()))
            batch_plan(torch.tensor([sizes[k]]), batch_size, local_epochs, gen, local_steps)  # consume k's draws
        rounds.append(entries)
    return rounds


# --------------------------------------------------------------------------------------------
# conversions
# --------------------------------------------------------------------------------------------
def _to_record(params: dict) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, Array(np.ascontiguousarray(v.detach().cpu().numpy())))
                                   for k, v in params.items()))


def _from_record(record: ArrayRecord) -> dict:
    return OrderedDict((k, torch.from_numpy(np.array(a.numpy()))) for k, a in record.items())


def _as_xy(data):
    if hasattr(data, "X") and hasattr(data, "y"):
        return data.X, data.y
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return torch.as_tensor(data[0]), torch.as_tensor(data[1])
    raise ValueError(f"load_partition must return a Dataset or an (X, y) pair, got {type(data).__name__}")


def _partition(context: Context) -> tuple[int, int]:
    cfg = context.node_config
    if "partition-id" not in cfg:
        raise ValueError("the node has no 'partition-id' in its node config (start flower-supernode with "
                         "--node-config \"partition-id=0 num-partitions=2\")")
    return int(cfg["partition-id"]), int(cfg.get("num-partitions", 0))


# --------------------------------------------------------------------------------------------
# ClientApp
# --------------------------------------------------------------------------------------------
def client_app(model_fn: Callable[[], nn.Module], load_partition: LoadPartition, *,
               loss_fn=cross_entropy, dp_client_clipping: bool = False, secagg: bool = False,
               consistency_keys=None, secagg_mods=()) -> ClientApp:
    """A Flower ``ClientApp`` whose ``train`` is fedlab's ClientUpdate on the node's partition.

    Parameters
    ----------
    model_fn : callable
        ``() -> nn.Module``: the architecture (its parameters are replaced by the server's).
    load_partition : callable
        ``(partition_id, num_partitions) -> Dataset or (X, y)``: the node's data. The partition id is
        the node config's ``partition-id`` (set by :class:`LocalGrid` / :class:`RayGrid`, or by
        ``flower-supernode --node-config``).
    dp_client_clipping : bool
        Add Flower's ``fixedclipping_mod`` (needed by the server's
        ``DifferentialPrivacyClientSideFixedClipping``: the client clips its update to the norm the
        server sends).
    secagg : bool
        Run Flower's ``secaggplus_mod`` on train messages (the server must run SecAgg+).
    consistency_keys : fedlab.flower.secagg.ConsistencyKeys, optional
        With ``secagg``: add :func:`fedlab.flower.secagg.consistency_mod` (Bonawitz et al.'s consistency round,
        with the clients' signing keys) before ``secaggplus_mod``; the server must run ``consistency=True``.
    secagg_mods : sequence of Flower mods
        With ``secagg``: mods placed first (for example :func:`fedlab.flower.secagg.disjoint_lists_mod`,
        :func:`fedlab.flower.secagg.drop_out_mod`).

    Notes
    -----
    Messages: ``query`` replies ``ConfigRecord {"partition-id", "num-examples"}``; ``train`` expects
    ``"arrays"`` (the global model) and ``"config"`` (see :mod:`fedlab.flower.apps`) and replies
    ``"arrays"`` (the new model), ``"metrics"`` (``num-examples``, ``train-loss`` after training) and
    ``"client"`` (``partition-id``); ``evaluate`` replies ``"metrics"`` (``num-examples``,
    ``accuracy``, ``loss`` of the received model on the partition).
    """
    if not callable(model_fn):
        raise ValueError(f"model_fn must be callable, got {type(model_fn).__name__}")
    if not callable(load_partition):
        raise ValueError(f"load_partition must be callable, got {type(load_partition).__name__}")
    if secagg and dp_client_clipping:
        raise ValueError("secagg and dp_client_clipping cannot be combined (Flower's mods expect different records)")
    secagg_mods = list(secagg_mods or ())
    if (consistency_keys is not None or secagg_mods) and not secagg:
        raise ValueError("consistency_keys and secagg_mods need secagg=True")
    if not all(callable(m) for m in secagg_mods):
        raise ValueError(f"secagg_mods must be Flower mods (callables), got {secagg_mods!r}")
    app = ClientApp()
    skeleton = []   # the architecture, built once when that changes nothing (see model_of)

    def model_of():
        """``model_fn()``, or the instance built on the first call when reusing it cannot change a result:
        the model holds no buffers (the updates replace every parameter through ``functional_call``, and
        nothing else of the module is read or written) and building it left torch's global random stream
        as it was (a seeded constructor, :func:`fedlab.config.seeded`). Building a model per message costs
        a ``torch.manual_seed`` each time, most of a small client's round."""
        if skeleton:
            return skeleton[0]
        state = torch.get_rng_state()
        model = model_fn()
        if next(model.buffers(), None) is None and torch.equal(state, torch.get_rng_state()):
            skeleton.append(model)
        return model

    def data_of(context):
        pid, num = _partition(context)
        X, y = _as_xy(load_partition(pid, num))
        return pid, X, y

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid, X, _ = data_of(context)
        return Message(RecordDict({"client": ConfigRecord({"partition-id": pid, "num-examples": len(X)})}),
                       reply_to=msg)

    def local_update(context, params, cfg):
        pid, X, y = data_of(context)
        gen = torch.Generator()
        gen.set_state(torch.frombuffer(bytearray(cfg["rng-state"]), dtype=torch.uint8).clone())
        model = model_of()
        new = client_update(model, params, X, y, generator=gen, local=LocalTraining(
            lr=float(cfg["lr"]), local_epochs=int(cfg["local-epochs"]), batch_size=int(cfg["batch-size"]) or None,
            local_steps=int(cfg["local-steps"]) or None, weight_decay=float(cfg["weight-decay"]), loss_fn=loss_fn))
        new = {k: v.detach() for k, v in new.items()}
        return pid, len(X), new, evaluate(model, new, X, y, loss_fn)["loss"]

    if secagg:
        names = [k for k, _ in model_fn().named_parameters()]

        mods = list(secagg_mods)
        if consistency_keys is not None:
            from .secagg import consistency_mod

            mods.append(consistency_mod(consistency_keys))

        @app.train(mods=[*mods, secaggplus_mod])   # train messages only; the mod runs the four SecAgg+ stages
        def train(msg: Message, context: Context) -> Message:
            fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
            arrays = parameters_to_ndarrays(fitins.parameters)
            if len(arrays) != len(names):
                raise ValueError(f"the server sent {len(arrays)} arrays, the model has {len(names)} parameters")
            params = OrderedDict((k, torch.from_numpy(np.array(a))) for k, a in zip(names, arrays))
            pid, n, new, loss = local_update(context, params, fitins.config)
            res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([new[k].cpu().numpy() for k in names]), n,
                         {"train-loss": float(loss), "partition-id": pid})
            content = compat.fitres_to_recorddict(res, keep_input=True)
            content["client"] = ConfigRecord({"partition-id": pid})
            return Message(content, reply_to=msg)
    else:
        @app.train(mods=[fixedclipping_mod] if dp_client_clipping else None)   # train messages only
        def train(msg: Message, context: Context) -> Message:
            cfg = msg.content["config"]
            pid, n, new, loss = local_update(context, _from_record(msg.content["arrays"]), cfg)
            return Message(RecordDict({"arrays": _to_record(new),
                                       "metrics": MetricRecord({"num-examples": n, "train-loss": loss}),
                                       "client": ConfigRecord({"partition-id": pid})}), reply_to=msg)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        pid, X, y = data_of(context)
        res = evaluate(model_of(), _from_record(msg.content["arrays"]), X, y, loss_fn)
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(X), **res}),
                                   "client": ConfigRecord({"partition-id": pid})}), reply_to=msg)

    return app


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------
class ScheduledFedAvg(FedAvg):
    """Flower's ``FedAvg`` whose client sampling follows a fixed schedule (:func:`fedavg_schedule`):
    round ``t`` sends the global model to the nodes of the partitions of ``schedule[t - 1]``, each with
    its own ``rng-state`` in the config. Aggregation is Flower's (weighted by ``num-examples``)."""

    def __init__(self, schedule, node_of_partition: dict[int, int], train_config: dict, **kwargs):
        kwargs.setdefault("fraction_evaluate", 0.0)
        kwargs.setdefault("min_available_nodes", 1)
        super().__init__(**kwargs)
        self.schedule = schedule
        self.node_of_partition = dict(node_of_partition)
        self.train_config = dict(train_config)

    def configure_train(self, server_round, arrays, config, grid):
        if not 1 <= server_round <= len(self.schedule):
            raise ValueError(f"server_round {server_round} is outside the schedule of {len(self.schedule)} rounds")
        messages = []
        for k, state in self.schedule[server_round - 1]:
            cfg = ConfigRecord({**dict(config), **self.train_config, "server-round": server_round,
                                "rng-state": state.numpy().tobytes()})
            messages.append(Message(RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg}),
                                    dst_node_id=self.node_of_partition[k], message_type=MessageType.TRAIN))
        return messages


class Recorder(Strategy):
    """Wraps a strategy and writes every reply message it receives to a transcript
    (:mod:`fedlab.flower.transcript`) before the wrapped strategy sees it (so before Flower's
    server-side clipping or noise), plus the global model before round 1 and after every round.

    ``partition_of_node``: the node id -> partition id map learned from the query (used when a reply
    does not name its partition).
    """

    def __init__(self, strategy: Strategy, writer: TranscriptWriter, partition_of_node: dict | None = None):
        super().__init__()
        self.strategy = strategy
        self.writer = writer
        self.partition_of_node = dict(partition_of_node or {})

    def summary(self) -> None:
        self.strategy.summary()

    def _record(self, server_round, kind, replies):
        replies = list(replies)
        for msg in replies:
            node = int(msg.metadata.src_node_id)
            if msg.has_error():
                self.writer.add_reply(server_round, kind, node, partition_id=self.partition_of_node.get(node),
                                      error=str(msg.error.reason))
                continue
            content = msg.content
            metrics = {}
            for rec in content.metric_records.values():
                metrics.update(dict(rec))
            pid = self.partition_of_node.get(node)
            if "client" in content.config_records and "partition-id" in content["client"]:
                pid = int(content["client"]["partition-id"])
            params = {}
            for rec in content.array_records.values():
                params.update({k: np.array(a.numpy()) for k, a in rec.items()})
            n = metrics.get("num-examples")
            self.writer.add_reply(server_round, kind, node, params=params, metrics=metrics, partition_id=pid,
                                  num_examples=None if n is None else int(n))
        return replies

    def configure_train(self, server_round, arrays, config, grid):
        self.writer.round = int(server_round)
        if server_round == 1:
            self.writer.add_global(0, {k: a.numpy() for k, a in arrays.items()})
            self.writer.flush()
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = self._record(server_round, "train", replies)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is not None:
            self.writer.add_global(server_round, {k: a.numpy() for k, a in arrays.items()})
        self.writer.flush()
        return arrays, metrics

    def configure_evaluate(self, server_round, arrays, config, grid):
        self.writer.round = int(server_round)
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        replies = self._record(server_round, "evaluate", replies)
        self.writer.flush()
        return self.strategy.aggregate_evaluate(server_round, replies)


# --------------------------------------------------------------------------------------------
# SecAgg+: Flower's workflow with fedlab's schedule, and what the server receives
# --------------------------------------------------------------------------------------------
def secagg_config(sizes=None, **overrides) -> dict:
    """The SecAgg+ settings :func:`server_app` uses: :data:`SECAGG_DEFAULTS` updated with ``overrides``,
    ``max_weight=None`` replaced by ``max(sizes)`` (the largest client's number of examples).

    ``flwr.client.mod.secaggplus_mod`` sends ``round(n_k / max_weight * Q) / Q`` times its model, clipped to
    ``[-clipping_range, clipping_range]`` and stochastically rounded to ``Q = quantization_range`` levels,
    masked modulo ``modulus_range``; the server's weighted average is then off by at most
    ``m * 2 clipping_range / Q / sum_k r_k`` per coordinate (``r_k`` the rounded weights, ``m`` clients).

    Raises
    ------
    ValueError
        For an unknown key, ``max_weight`` below the largest size, a ``modulus_range`` that is not a power
        of 2 or not larger than ``quantization_range``, or a non-positive value.
    """
    unknown = set(overrides) - set(SECAGG_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown SecAgg+ settings {sorted(unknown)}; known: {sorted(SECAGG_DEFAULTS)}")
    cfg = {**SECAGG_DEFAULTS, **overrides}
    largest = max(int(n) for n in sizes) if sizes is not None else None
    if cfg["max_weight"] is None:
        if largest is None:
            raise ValueError("max_weight=None needs the clients' sizes")
        cfg["max_weight"] = float(largest)
    cfg["max_weight"] = float(cfg["max_weight"])
    if largest is not None and cfg["max_weight"] < largest:
        raise ValueError(f"max_weight must be at least the largest client size {largest}, got {cfg['max_weight']}")
    for key in ("num_shares", "reconstruction_threshold", "max_weight", "clipping_range"):
        if not cfg[key] > 0:
            raise ValueError(f"{key} must be > 0, got {cfg[key]!r}")
    cfg["clipping_range"] = float(cfg["clipping_range"])
    q, mod = cfg["quantization_range"], cfg["modulus_range"]
    if not (isinstance(q, int) and 0 < q < 2 ** 31):
        raise ValueError(f"quantization_range must be an integer in [1, 2^31) (int32 rounding), got {q!r}")
    if not (isinstance(mod, int) and mod > q and bin(mod).count("1") == 1 and mod <= 2 ** 32):
        raise ValueError(f"modulus_range must be a power of 2 in (quantization_range, 2^32], got {mod!r}")
    return cfg


class SecAggSchedule(LegacyStrategy):
    """The legacy Flower ``Strategy`` that ``SecAggPlusWorkflow`` drives: ``configure_fit`` sends round ``t``'s
    global model to the nodes of ``schedule[t - 1]`` (:func:`fedavg_schedule`, each with its ``rng-state``),
    and ``aggregate_fit`` receives the unmasked weighted average (the workflow hands it, in place of every
    client's parameters, the one aggregate it decoded), casts it to the model's dtypes and writes it to the
    transcript as the global model of round ``t``. No evaluation."""

    def __init__(self, schedule, node_of_partition: dict[int, int], train_config: dict, names, dtypes,
                 writer: TranscriptWriter):
        super().__init__()
        self.schedule, self.node_of_partition = schedule, dict(node_of_partition)
        self.train_config, self.names, self.dtypes, self.writer = dict(train_config), list(names), list(dtypes), writer
        self.grid = None
        self.aggregated_rounds: list[int] = []

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        if not 1 <= server_round <= len(self.schedule):
            raise ValueError(f"server_round {server_round} is outside the schedule of {len(self.schedule)} rounds")
        out = []
        for k, state in self.schedule[server_round - 1]:
            cfg = {**self.train_config, "server-round": server_round, "rng-state": state.numpy().tobytes()}
            proxy = GridClientProxy(self.node_of_partition[k], self.grid, 0)
            out.append((proxy, FitIns(parameters, cfg)))
        return out

    def aggregate_fit(self, server_round, results, failures):
        if not results:
            raise RuntimeError(f"SecAgg+ round {server_round}: no results, failures {failures}")
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        arrays = [np.asarray(a).astype(dt, copy=False) for a, dt in zip(arrays, self.dtypes)]
        self.writer.add_global(server_round, dict(zip(self.names, arrays)))
        self.writer.flush()
        self.aggregated_rounds.append(int(server_round))
        return ndarrays_to_parameters(arrays), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class RecordingGrid(Grid):
    """Wraps the ``Grid`` the ServerApp gets and writes every message the server *sends* through it to the
    transcript (:meth:`fedlab.flower.transcript.TranscriptWriter.add_sent`): the model it carries, by digest
    (stored in full when it is none of the global models) and its small configuration values, under the
    writer's current round. This is the last step before the transport, so whatever a server's strategy or
    workflow changed (a decoy model, a false dropout list) is what gets recorded."""

    def __init__(self, grid: Grid, writer: TranscriptWriter, names):
        self.grid, self.writer, self.names = grid, writer, list(names)

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def _kind_of(self, msg: Message) -> str:
        return str(msg.metadata.message_type)

    def _record_sent(self, messages) -> None:
        for m in messages:
            content = m.content
            arrays = [a.numpy() for rec in content.array_records.values() for a in rec.values()]
            config = {}
            for rec in content.config_records.values():
                config.update(dict(rec))
            self.writer.add_sent(self._kind_of(m), int(m.metadata.dst_node_id), params=arrays or None, config=config)

    def push_messages(self, messages):
        messages = list(messages)
        self._record_sent(messages)
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self._record_sent(messages)
        return self.grid.send_and_receive(messages, timeout=timeout)


class SecAggRecordingGrid(RecordingGrid):
    """Wraps the ``Grid`` the ServerApp gets and writes every reply of the SecAgg+ workflow to the transcript
    as it arrives, under the kind of its stage (:data:`SECAGG_KINDS`): the transport-level view of a server
    operator who logs everything. A ``secagg-masked`` reply stores the masked model (``{name: uint64/int64
    array}``, ring elements modulo ``modulus_range``; the masked weight in its metrics as ``masked-weight``)
    together with what the client sent unmasked (``num_examples``, the ``fitres.metrics``: ``train-loss``);
    the other stages store the sizes of what they carry (``bytes``). Every message the server sends is
    recorded as :class:`RecordingGrid` does, under its stage's kind (the model travels in the
    ``secagg-masked`` request)."""

    def __init__(self, grid: Grid, writer: TranscriptWriter, names, partition_of_node: dict[int, int]):
        super().__init__(grid, writer, names)
        self.partition_of_node = dict(partition_of_node)

    @property
    def round(self) -> int:
        return self.writer.round

    @round.setter
    def round(self, value: int) -> None:
        self.writer.round = int(value)

    def _kind_of(self, msg: Message) -> str:
        if RECORD_KEY_CONFIGS in msg.content.config_records:
            stage = str(msg.content.config_records[RECORD_KEY_CONFIGS].get(SecAggKey.STAGE))
            return _secagg_kind(stage)
        return super()._kind_of(msg)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        stages = {str(m.content.config_records[RECORD_KEY_CONFIGS][SecAggKey.STAGE]) for m in messages
                  if RECORD_KEY_CONFIGS in m.content.config_records}
        self._record_sent(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        if len(stages) == 1:
            kind = _secagg_kind(stages.pop())
            for r in replies:
                self._record(kind, r)
            self.writer.flush()
        return replies

    def _record(self, kind: str, reply: Message) -> None:
        node = int(reply.metadata.src_node_id)
        pid = self.partition_of_node.get(node)
        if reply.has_error():
            self.writer.add_reply(self.round, kind, node, partition_id=pid, error=str(reply.error.reason))
            return
        cfg = reply.content.config_records[RECORD_KEY_CONFIGS]
        size = sum(len(b) if isinstance(b, bytes) else 8 for v in cfg.values()
                   for b in (v if isinstance(v, list) else [v]))
        params, metrics, n = None, {"bytes": int(size)}, None
        if kind == "secagg-masked":
            from flwr.common import bytes_to_ndarray

            masked = [bytes_to_ndarray(b) for b in cfg[SecAggKey.MASKED_PARAMETERS]]
            params = dict(zip(self.names, masked[1:]))
            metrics["masked-weight"] = int(masked[0].reshape(-1)[0])
            if "fitres.num_examples" in reply.content.metric_records:
                n = int(reply.content.metric_records["fitres.num_examples"]["num_examples"])
            if "fitres.metrics" in reply.content.config_records:
                metrics.update({k: v for k, v in reply.content.config_records["fitres.metrics"].items()
                                if isinstance(v, (int, float))})
        self.writer.add_reply(self.round, kind, node, params=params, metrics=metrics, partition_id=pid,
                              num_examples=n)


# --------------------------------------------------------------------------------------------
# ServerApp
# --------------------------------------------------------------------------------------------
def _wait_for_nodes(grid: Grid, num_clients: int, timeout: float) -> list[int]:
    t0 = time.monotonic()
    while len(nodes := sorted(grid.get_node_ids())) < num_clients:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"only {len(nodes)} of num_clients={num_clients} nodes connected within {timeout} s")
        time.sleep(0.2)
    return nodes


def server_app(model_fn: Callable[[], nn.Module], transcript_dir, *, num_clients: int, num_rounds: int,
               local: LocalTraining = LocalTraining(), client_fraction: float = 1.0, seed: int = 0,
               aggregation: FixedClippingDP | SecAgg | None = None, evaluate_clients: bool = False,
               timeouts: Timeouts = Timeouts()) -> ServerApp:
    """A Flower ``ServerApp`` running FedAvg with fedlab's schedule, recording a transcript.

    Parameters
    ----------
    model_fn : callable
        ``() -> nn.Module``; its parameters are the initial global model (give it a seed).
    transcript_dir : path
        Where the :class:`Recorder` writes (must not exist or be empty).
    num_clients : int
        K, the number of nodes (= partitions) the server waits for.
    local, client_fraction, seed
        As in :func:`fedlab.fl.fedavg`: ``local`` is the clients' :class:`fedlab.fl.LocalTraining` (its step,
        epochs, batch size, steps and weight decay go to the clients in each round's ``ConfigRecord``; its loss
        is the ClientApp's, :func:`client_app`'s ``loss_fn``).
    aggregation : None, FixedClippingDP or SecAgg
        ``None``: Flower's ``FedAvg``. A :class:`FixedClippingDP`: FedAvg wrapped in Flower's
        ``DifferentialPrivacyClientSideFixedClipping`` (``mode="client"``; the ClientApp must be built with
        ``dp_client_clipping=True``) or ``DifferentialPrivacyServerSideFixedClipping`` (``mode="server"``), with
        its ``noise_multiplier`` and ``clipping_norm`` (noise std ``z C / m`` on the average). A :class:`SecAgg`:
        Flower's SecAgg+ (``SecAggPlusWorkflow``; the ClientApp must be built with ``secagg=True``, and with
        ``consistency_keys`` when ``consistency``): each round is the workflow's four stages,
        :class:`SecAggSchedule` samples the clients and receives the decoded weighted average,
        :class:`SecAggRecordingGrid` records what the server receives in each stage; the workflow is
        :class:`fedlab.flower.secagg.SecAggWorkflow` (Flower's, with dropouts in any stage up to ``n - t``),
        with the object's ``attack`` hooks, filling its ``log``. A SecAgg+ round needs at least 2 clients.
    evaluate_clients : bool
        Also send each round's global model to every node for evaluation (replies are recorded).
    timeouts : Timeouts
        How long the server waits for the nodes and for each round.

    Raises
    ------
    ValueError
        For an ``aggregation`` of another type, a ``local`` that is not a LocalTraining, a bad count, SecAgg+
        combined with ``evaluate_clients``, or SecAgg+ settings whose masked sum would wrap around.
    RuntimeError
        (in the running ServerApp) When a SecAgg+ round halts without an aggregate.
    """
    aggregation = _aggregation(aggregation)
    if not isinstance(timeouts, Timeouts):
        raise ValueError(f"timeouts must be a fedlab.flower.Timeouts, got {type(timeouts).__name__}: {timeouts!r}")
    secagg = isinstance(aggregation, SecAgg)
    dp = aggregation.mode if isinstance(aggregation, FixedClippingDP) else None
    num_clients = _check_int("num_clients", num_clients, 1)
    num_rounds = _check_int("num_rounds", num_rounds, 1)
    local = _local(local)
    lr, weight_decay = local.lr, local.weight_decay
    local_epochs = _check_int("local_epochs", local.local_epochs, 1)
    batch_size = _check_int("batch_size", local.batch_size, 1, allow_none=True)
    local_steps = _check_int("local_steps", local.local_steps, 1, allow_none=True)
    if not 0.0 < client_fraction <= 1.0:
        raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
    if secagg and evaluate_clients:
        raise ValueError(f"SecAgg+ cannot be combined with evaluate_clients ({evaluate_clients})")
    if secagg:
        checked = secagg_config(None, **{**aggregation.settings, "max_weight": aggregation.max_weight or 1.0})
        m = max(int(round(client_fraction * num_clients)), 1)
        if m * checked["quantization_range"] >= checked["modulus_range"]:    # the masked sum would wrap around
            raise ValueError(f"SecAgg: {m} clients a round x quantization_range {checked['quantization_range']} "
                             f"must stay below modulus_range {checked['modulus_range']}, or the sum wraps around")
    if secagg and max(int(round(client_fraction * num_clients)), 1) < 2:
        raise ValueError(f"SecAgg+ needs at least 2 clients a round, got num_clients={num_clients}, "
                         f"client_fraction={client_fraction}")
    noise_multiplier = aggregation.noise_multiplier if dp else None
    clipping_norm = aggregation.clipping_norm if dp else None
    node_timeout, round_timeout = timeouts.node_timeout, timeouts.round_timeout
    transcript_dir = Path(transcript_dir)
    meta = dict(num_clients=num_clients, num_rounds=num_rounds, lr=float(lr), local_epochs=local_epochs,
                batch_size=batch_size, local_steps=local_steps, weight_decay=float(weight_decay),
                client_fraction=float(client_fraction), seed=int(seed), dp=dp,
                noise_multiplier=float(noise_multiplier) if dp else None,
                clipping_norm=float(clipping_norm) if dp else None, secagg=bool(secagg))
    train_config = {"lr": float(lr), "local-epochs": local_epochs, "batch-size": batch_size or 0,
                    "local-steps": local_steps or 0, "weight-decay": float(weight_decay)}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        init = {k: v.detach() for k, v in model_fn().named_parameters()}
        nodes = _wait_for_nodes(grid, num_clients, node_timeout)
        replies = list(grid.send_and_receive(
            [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type=MessageType.QUERY)
             for n in nodes], timeout=node_timeout))
        bad = [r for r in replies if r.has_error()]
        if bad or len(replies) != len(nodes):
            raise RuntimeError(f"query: {len(replies)} replies from {len(nodes)} nodes, errors: "
                               f"{[r.error.reason for r in bad]}")
        info = {int(r.metadata.src_node_id): dict(r.content["client"]) for r in replies}
        node_of = {int(v["partition-id"]): n for n, v in info.items()}
        if sorted(node_of) != list(range(num_clients)):
            raise RuntimeError(f"the nodes' partition ids are {sorted(node_of)}, expected 0..{num_clients - 1}")
        sizes = [int(info[node_of[k]]["num-examples"]) for k in range(num_clients)]
        schedule = fedavg_schedule(sizes, num_rounds=num_rounds, client_fraction=client_fraction,
                                   local_epochs=local_epochs, batch_size=batch_size, local_steps=local_steps,
                                   seed=seed)
        m = len(schedule[0])
        if secagg:
            _run_secagg(grid, context, init, schedule, node_of, train_config, sizes,
                        secagg_config(sizes, **aggregation.settings), transcript_dir,
                        {**meta, "sizes": sizes, "node_of_partition": {str(k): v for k, v in node_of.items()}},
                        round_timeout, attack=aggregation.attack, consistency=aggregation.consistency,
                        log=aggregation.log)
            return
        strategy: Strategy = ScheduledFedAvg(schedule, node_of, train_config, min_train_nodes=m,
                                             fraction_evaluate=1.0 if evaluate_clients else 0.0,
                                             min_evaluate_nodes=num_clients if evaluate_clients else 0)
        if dp == "client":
            strategy = DifferentialPrivacyClientSideFixedClipping(strategy, noise_multiplier, clipping_norm, m)
        elif dp == "server":
            strategy = DifferentialPrivacyServerSideFixedClipping(strategy, noise_multiplier, clipping_norm, m)
        writer = TranscriptWriter(transcript_dir, list(init), {**meta, "sizes": sizes,
                                                               "node_of_partition": {str(k): v for k, v in node_of.items()}})
        recorder = Recorder(strategy, writer, {n: k for k, n in node_of.items()})
        recorder.start(RecordingGrid(grid, writer, list(init)), _to_record(init), num_rounds=num_rounds,
                       timeout=round_timeout)

    return app


def _run_secagg(grid, context, init, schedule, node_of, train_config, sizes, settings, transcript_dir, meta,
                round_timeout, attack=None, consistency=False, log=None):
    """The ServerApp's rounds under SecAgg+: :class:`fedlab.flower.secagg.SecAggWorkflow` once per round with
    a LegacyContext."""
    from .secagg import SecAggLog, SecAggWorkflow

    names = list(init)
    writer = TranscriptWriter(transcript_dir, names, {**meta, "secagg_settings": settings,
                                                      "secagg_attack": None if attack is None else type(attack).__name__,
                                                      "consistency": bool(consistency)})
    strategy = SecAggSchedule(schedule, node_of, train_config, names, [v.detach().cpu().numpy().dtype for v in init.values()],
                              writer)
    rgrid = SecAggRecordingGrid(grid, writer, names, {n: k for k, n in node_of.items()})
    strategy.grid = rgrid
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=len(schedule)), strategy=strategy,
                           client_manager=SimpleClientManager())
    arrays = [v.detach().cpu().numpy() for v in init.values()]
    writer.add_global(0, dict(zip(names, arrays)))
    writer.flush()
    legacy.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(ndarrays_to_parameters(arrays), True)
    cfg = ConfigRecord()
    legacy.state.config_records[MAIN_CONFIGS_RECORD] = cfg
    log = log if log is not None else SecAggLog()
    log.partition_of_node.update({n: k for k, n in node_of.items()})
    workflow = SecAggWorkflow(settings["num_shares"], settings["reconstruction_threshold"],
                              max_weight=settings["max_weight"], clipping_range=settings["clipping_range"],
                              quantization_range=settings["quantization_range"],
                              modulus_range=settings["modulus_range"], timeout=round_timeout, attack=attack,
                              consistency=consistency, log=log, names=names)
    if attack is not None:
        if attack.target not in node_of:
            raise ValueError(f"the attack's target {attack.target} is not a partition of this run (0..{len(node_of) - 1})")
        workflow.target_node = node_of[attack.target]
    for t in range(1, len(schedule) + 1):
        cfg[WorkflowKey.CURRENT_ROUND] = t
        rgrid.round = t
        workflow(rgrid, legacy)
        if strategy.aggregated_rounds[-1:] != [t]:
            raise RuntimeError(f"SecAgg+ halted in round {t} without an aggregate; see the transcript in "
                               f"{transcript_dir} (errors of the replies) and rerun with verbose=True")


# --------------------------------------------------------------------------------------------
# simulation
# --------------------------------------------------------------------------------------------
class LocalGrid(Grid):
    """A Flower ``Grid`` that delivers each message to a ``ClientApp`` in this process, one node per
    partition (node ids ``1..K``, node config ``partition-id`` / ``num-partitions`` as Flower's runtimes
    set them). The same ``ServerApp`` and ``ClientApp`` objects run unchanged; only Ray (:class:`RayGrid`,
    several seconds of start-up on a 2-core machine) and the message transport are left out. A ClientApp that
    raises is answered with an error reply, as Flower does.
    """

    def __init__(self, app: ClientApp, num_nodes: int):
        num_nodes = _check_int("num_nodes", num_nodes, 1)
        self.app = app
        self.contexts = {k + 1: Context(run_id=0, node_id=k + 1,
                                        node_config={"partition-id": k, "num-partitions": num_nodes},
                                        state=RecordDict(), run_config={}) for k in range(num_nodes)}
        self._run = None
        self._replies: dict[str, Message] = {}
        self._pushed = 0     # messages pushed so far: each id is used once

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.contexts)

    def _deliver(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if node not in self.contexts:
            return Message(Error(code=0, reason=f"no node {node}"), reply_to=msg)
        try:   # a copy, as a transport would deliver: a ClientApp (or a mod) may change what it receives
            return self.app(copy.deepcopy(msg), self.contexts[node])
        except Exception as err:  # noqa: BLE001 - Flower turns a failing ClientApp into an error reply
            return Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg)

    def _deliver_all(self, messages) -> list[Message]:
        """The replies to ``messages``, in their order (here one after the other)."""
        return [self._deliver(msg) for msg in messages]

    def push_messages(self, messages):
        messages = list(messages)
        ids = [str(self._pushed + i) for i in range(len(messages))]
        self._pushed += len(messages)
        self._replies.update(zip(ids, self._deliver_all(messages)))
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self._deliver_all(list(messages))


class _ClientAppActor:
    """One Ray worker of :class:`RayGrid`: runs the ``ClientApp`` on a (message, node context) pair and
    returns the reply and the context it changed (the grid keeps each node's context between rounds)."""

    def __init__(self, app: ClientApp):
        self.app = app

    def ready(self) -> bool:
        """True once the worker runs (Ray placed it on a free CPU)."""
        return True

    def deliver(self, msg: Message, context: Context):
        with _task_identity():
            try:
                reply = self.app(msg, context)
            except Exception as err:  # noqa: BLE001 - Flower turns a failing ClientApp into an error reply
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
        return reply, context


class RayGrid(LocalGrid):
    """A :class:`LocalGrid` whose ``ClientApp`` runs in ``num_actors`` Ray worker processes (one CPU each):
    the messages of a round are delivered in parallel, each with its node's context, which comes back
    with the reply (as Flower's Ray backend ships contexts to its actors). Only public APIs: Flower's
    ``Grid``, ``ClientApp``, ``Message``, ``Context`` and Ray's ``ray.remote`` / ``ray.util.ActorPool``
    (Flower 1.42 deprecates its own in-process entry to the Ray engine, ``run_simulation``, in favour of
    ``flwr run``; :mod:`fedlab.flower.deploy` runs the apps that way). Ray must be running
    (:func:`run` starts it); at most as many workers as nodes and as the runtime's free CPUs (a runtime whose
    CPUs other actors or tasks hold gets fewer workers, with a ``RuntimeWarning``: a message sent to a worker Ray
    cannot place would wait for ever); :meth:`close` stops them. A worker that has not started within
    ``start_timeout`` seconds (Ray's view of the free CPUs lags, or a start hangs) is left out with a
    ``RuntimeWarning``. Raises ``ValueError`` for ``num_actors < 1`` or ``start_timeout <= 0``, ``RuntimeError``
    when no worker starts."""

    def __init__(self, app: ClientApp, num_nodes: int, *, num_actors: int = 1, start_timeout: float = 300.0):
        import ray
        from ray.util import ActorPool

        super().__init__(app, num_nodes)
        num_actors = _check_int("num_actors", num_actors, 1)
        if not start_timeout > 0:
            raise ValueError(f"start_timeout must be > 0 seconds, got {start_timeout!r}")
        actor = ray.remote(num_cpus=1)(_ClientAppActor)
        ref = ray.put(app)
        # only as many workers as Ray can place now: the runtime's CPUs may be held by other actors or tasks
        wanted = min(num_actors, num_nodes)
        free = int(ray.available_resources().get("CPU", 0))
        count = max(1, min(wanted, free))
        if count < wanted:
            warnings.warn(f"the Ray runtime has {free} free CPU(s) of {int(ray.cluster_resources().get('CPU', 0))}: "
                          f"the ClientApp runs in {count} of the {wanted} workers asked for", RuntimeWarning,
                          stacklevel=2)
        actors = [actor.remote(ref) for _ in range(count)]
        pings = {a.ready.remote(): a for a in actors}
        ready, late = ray.wait(list(pings), num_returns=len(pings), timeout=start_timeout)
        for p in late:
            ray.kill(pings[p])
        self._actors = [pings[p] for p in ready]
        if not self._actors:
            raise RuntimeError(f"no Ray worker for the ClientApp started within {start_timeout} s (the runtime's "
                               f"free CPUs: {ray.available_resources().get('CPU', 0)}); free one, or run with "
                               f"engine=Engine('local')")
        if late:
            warnings.warn(f"{len(late)} of {len(actors)} Ray workers did not start within {start_timeout} s; the "
                          f"ClientApp runs in {len(self._actors)}", RuntimeWarning, stacklevel=2)
        self._pool = ActorPool(self._actors)

    def _deliver_all(self, messages) -> list[Message]:
        out: list = [None] * len(messages)
        todo = []
        for i, msg in enumerate(messages):
            if msg.metadata.dst_node_id in self.contexts:
                todo.append(i)
            else:
                out[i] = Message(Error(code=0, reason=f"no node {msg.metadata.dst_node_id}"), reply_to=msg)
        nodes = [messages[i].metadata.dst_node_id for i in todo]
        # one message per node at a time: a node's context goes out with its message and comes back changed
        batches = [todo] if len(set(nodes)) == len(nodes) else [[i] for i in todo]
        for batch in batches:
            jobs = [(i, messages[i]) for i in batch]
            replies = self._pool.map(lambda a, job: a.deliver.remote(job[1], self.contexts[job[1].metadata.dst_node_id]),
                                     jobs)
            for (i, msg), (reply, context) in zip(jobs, replies):
                self.contexts[msg.metadata.dst_node_id] = context
                out[i] = reply
        return out

    def close(self, wait: float = 10.0) -> None:
        """Stop the Ray workers (the grid delivers nothing afterwards) and wait up to ``wait`` seconds until
        Ray counts their CPUs as free again (``ray.kill`` returns at once; a grid made right after would
        otherwise see them held and start fewer workers)."""
        import ray

        before = ray.available_resources().get("CPU", 0)
        for a in self._actors:
            ray.kill(a)
        target, deadline = before + len(self._actors), time.monotonic() + wait
        self._actors = []
        while ray.available_resources().get("CPU", 0) < target and time.monotonic() < deadline:
            time.sleep(0.05)


@contextmanager
def _task_identity():
    """Flower's messages take their run and source node from ``TaskIdentity``, which Flower's runtimes set
    per process; set it through its public setters as ``flwr.server.compat`` does (task 1, run 0, the
    SuperLink's node id) and restore what was there (an unset identity reads as ``RuntimeError`` and is
    restored unset)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    def current(name):
        try:
            return getattr(TaskIdentity, name)
        except RuntimeError:   # not set in this process
            return None

    old = {name: current(name) for name in ("task_id", "run_id", "node_id")}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 0, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(TaskIdentity, name, value)


class RayStartError(RuntimeError):
    """Ray's runtime did not start (twice): raised by :func:`run` with ``Engine("ray")`` before any round."""


def _start_ray(init_args: dict, *, attempts: int = 2) -> None:
    """Start Ray for :class:`RayGrid` unless it is running, with the arguments Flower's
    ``RayBackend.init_ray`` uses (``init_args``, and this process's ``sys.path`` as the workers'
    ``PYTHONPATH``, so that they import the ``fedlab`` and ``model_fn`` of this process).

    Ray's start-up can fail on a loaded machine (a raylet aborting in ``WaitForDashboardAgentPorts`` was seen
    three times out of three): a failed start is shut down, reported with a warning and tried once more; a
    second failure raises :class:`RayStartError` with both reasons."""
    # no usage report to the network (Ray's default) and no warning about a GPU setting we do not use
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    errors = []
    for attempt in range(attempts):
        try:
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
            return
        except Exception as err:  # noqa: BLE001 - any failure of Ray's start-up is retried once, then reported
            errors.append(f"{type(err).__name__}: {err}")
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - a half-started runtime may fail to stop; the retry starts afresh
                pass
            if attempt + 1 < attempts:
                warnings.warn(f"Ray failed to start ({errors[-1]}); trying once more", RuntimeWarning, stacklevel=3)
    raise RayStartError(f"Ray failed to start {attempts} times ({'; '.join(errors)}); Engine('local') runs the same "
                        f"ServerApp and ClientApp without Ray")


@contextmanager
def quiet_flower(level: int = logging.WARNING):
    """Set the ``flwr`` logger to ``level`` inside the block (default ``WARNING``: Flower's own warnings,
    deprecations included, reach the user; its per-round INFO lines do not) and switch Flower's telemetry
    off."""
    logger = logging.getLogger("flwr")
    old = logger.level
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


class _Deprecations(logging.Filter):
    """Takes Flower's ``DEPRECATED FEATURE`` log records off its console handler and keeps their text."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "DEPRECATED FEATURE" not in text:
            return True
        self.messages.append(" ".join(text.split()))
        return False


#: what fedlab adds to a deprecation Flower reports during :func:`run` (fedlab itself calls no deprecated entry point)
DEPRECATION_NOTE = ("reported during fedlab.flower.run, which calls no deprecated Flower entry point itself: it comes "
                    "from the model, data or mods you passed")


@contextmanager
def _deprecations_as_warnings(note: str):
    """Flower logs a deprecation once as a WARNING record; inside the block each such record becomes a
    ``FutureWarning`` (Python's category for deprecations meant for end users, shown by default, also in a
    notebook) that names it and adds ``note``. Issued when the block ends, also on an error."""
    caught = _Deprecations()
    logger = logging.getLogger("flwr")
    logger.addFilter(caught)
    try:
        yield caught
    finally:
        logger.removeFilter(caught)
        for text in caught.messages:
            warnings.warn(f"Flower says: {text} -- {note}", FutureWarning, stacklevel=4)


@dataclass
class FlowerRun:
    """Result of :func:`run`: the final global ``params``, the ``transcript`` directory, the loaded
    :class:`~fedlab.flower.transcript.Transcript` and the wall time ``seconds``."""

    params: dict
    transcript_path: Path
    transcript: Transcript
    seconds: float
    secagg_log: object = None


def run(model_fn: Callable[[], nn.Module], clients, *, num_rounds: int, local: LocalTraining = LocalTraining(),
        client_fraction: float = 1.0, seed: int = 0, aggregation: FixedClippingDP | SecAgg | None = None,
        evaluate_clients: bool = False, transcript_dir=None, engine: Engine = Engine()) -> FlowerRun:
    """Run FedAvg as a Flower ``ServerApp`` and ``ClientApp`` simulated on this machine, one node per client.

    Same arguments as :func:`fedlab.fl.fedavg` (``clients``: a :class:`fedlab.fl.ClientData` or a list
    of per-client data sets; partition ``k`` is client ``k``; ``local``: the clients' :class:`fedlab.fl.LocalTraining`,
    the same object ``fedavg`` takes, its ``loss_fn`` the ClientApp's), plus the server's ``aggregation`` and
    ``evaluate_clients`` of :func:`server_app` and ``transcript_dir`` (default: a new temporary directory). Under
    SecAgg+ (``aggregation=SecAgg(...)``): ``consistency=True`` gives every client a signing key
    (:class:`fedlab.flower.secagg.ConsistencyKeys`), its ``client_mods`` go to :func:`client_app`'s
    ``secagg_mods``, followed by :func:`fedlab.flower.secagg.seeded_rounding_mod` of ``seed`` (the clients'
    stochastic rounding is seeded, so the decoded aggregate is the same on every run), and the returned ``secagg_log`` is its ``log`` (a new :class:`fedlab.flower.secagg.SecAggLog`
    when ``None``). A SecAgg+ round that stops raises :class:`fedlab.flower.secagg.SecAggAborted` (its ``log`` says
    which clients refused). ``engine`` (an :class:`Engine`): ``Engine("ray", num_cpus=...)`` delivers each round's
    messages to the ``ClientApp`` in ``num_cpus`` Ray worker processes in parallel (:class:`RayGrid`);
    ``Engine("local")`` runs the same apps over a :class:`LocalGrid` in this process.

    Both engines drive Flower's ``ServerApp`` with a Flower ``Grid``, through public APIs only. Until
    2026-11-28 the Ray engine called ``flwr.simulation.run_simulation``, which Flower 1.42 deprecates in
    favour of ``flwr run`` (apps in processes of their own, which cannot receive this call's in-memory
    ``model_fn``, data, attack hooks or signing keys; :mod:`fedlab.flower.deploy` runs the apps that way). A
    deprecation Flower logs during the run reaches the caller as a ``FutureWarning`` (:data:`DEPRECATION_NOTE`).

    Returns
    -------
    FlowerRun
        Its ``params`` equal ``fedlab.fl.fedavg(model_fn(), clients, ...).params`` up to float rounding
        when ``aggregation`` is None (with weight decay too: fedlab's vmapped update once decayed a smaller
        client on its zero-weight padding steps, 3.7e-3 off at ``weight_decay=0.1``; fixed).

    Raises
    ------
    ValueError
        For bad arguments (see :func:`server_app`) or an ``engine`` that is not an :class:`Engine`.
    RayStartError
        (``Engine("ray")``) When Ray's runtime fails to start twice (a first failure is retried with a warning).
    """
    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a fedlab.flower.Engine (Engine('ray', num_cpus=1) or Engine('local')), "
                         f"got {type(engine).__name__}: {engine!r}")
    num_cpus, verbose = engine.num_cpus, engine.verbose
    aggregation = _aggregation(aggregation)
    local = _local(local)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    log = keys = None
    secagg = isinstance(aggregation, SecAgg)
    if secagg:
        from dataclasses import replace

        from .secagg import ConsistencyKeys, SecAggLog, seeded_rounding_mod

        if aggregation.log is None:
            aggregation = replace(aggregation, log=SecAggLog())
        log = aggregation.log
        keys = ConsistencyKeys(range(data.num_clients)) if aggregation.consistency else None
    if transcript_dir is None:
        transcript_dir = Path(tempfile.mkdtemp(prefix="fedlab-flower-")) / "transcript"
    sapp = server_app(model_fn, transcript_dir, num_clients=data.num_clients, num_rounds=num_rounds, local=local,
                      client_fraction=client_fraction, seed=seed, aggregation=aggregation,
                      evaluate_clients=evaluate_clients)
    capp = client_app(model_fn, lambda pid, num: data.client(pid), loss_fn=local.loss_fn,
                      dp_client_clipping=isinstance(aggregation, FixedClippingDP) and aggregation.mode == "client",
                      secagg=secagg, consistency_keys=keys,
                      secagg_mods=(*aggregation.client_mods, seeded_rounding_mod(seed)) if secagg else ())
    ray_init = {"num_cpus": num_cpus, "num_gpus": 0, "include_dashboard": False, "log_to_driver": bool(verbose),
                "logging_level": "INFO" if verbose else "ERROR"}
    t0 = time.perf_counter()
    with quiet_flower(logging.INFO if verbose else logging.WARNING), _deprecations_as_warnings(DEPRECATION_NOTE):
        if engine.name == "local":
            with _task_identity():
                sapp(LocalGrid(capp, data.num_clients), Context(run_id=0, node_id=0, node_config={},
                                                                state=RecordDict(), run_config={}))
        else:
            import ray

            started = not ray.is_initialized()
            _start_ray(ray_init)
            grid = None
            try:
                with _task_identity():
                    grid = RayGrid(capp, data.num_clients, num_actors=num_cpus)
                    sapp(grid, Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}))
            finally:
                try:
                    if grid is not None:
                        grid.close()
                finally:
                    if started:      # as Flower's engine did: a runtime this call started is stopped
                        ray.shutdown()
    seconds = time.perf_counter() - t0
    if not (Path(transcript_dir) / "index.json").is_file():     # the ServerApp never started
        raise RuntimeError(f"the simulation recorded 0 of {num_rounds} rounds (no transcript in {transcript_dir}); "
                           "rerun with verbose=True")
    transcript = load_transcript(transcript_dir)
    if transcript.num_rounds != num_rounds:
        raise RuntimeError(f"the simulation recorded {transcript.num_rounds} of {num_rounds} rounds; "
                           f"see the transcript in {transcript_dir} and rerun with verbose=True")
    return FlowerRun(transcript.final_params, Path(transcript_dir), transcript, seconds, log)
