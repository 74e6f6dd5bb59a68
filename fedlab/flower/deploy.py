"""Deployment mode: the apps of :mod:`fedlab.flower.apps` as a Flower App project, run by a SuperLink
and SuperNodes (``flower-superlink``, ``flower-supernode``, ``flwr run``; Flower 1.41).

* :func:`write_app` writes a Flower App directory (``pyproject.toml`` with ``[tool.flwr.app]`` and a
  module ``fedlab_app.py`` exposing ``server`` and ``client``) for the demonstration task of
  :func:`demo_clients` / :func:`demo_model`: the scikit-learn digits, one IID partition per SuperNode,
  an MLP; the server writes its transcript to the path given.
* :func:`local_federation` starts one SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (free ports, a
  private ``FLWR_HOME`` holding the connection in ``config.toml``) and stops every process it started
  (their whole process groups) when the block ends, also on an error.
* :func:`flwr_run` submits an app to such a federation and waits for it (``flwr run APP CONNECTION
  --stream``).
* SecAgg+ (``write_app(..., aggregation=SecAgg())``) with Bonawitz et al.'s consistency round (CCS 2017, Sec. 6;
  ``consistency=True``): :func:`write_consistency_keys` makes the federation's Ed25519 keys. Who holds what:
  SuperNode ``k`` holds its own signing key (``signing-key-k.pem``, private, given by path in its
  ``--node-config "signing-key=..."``) and the registry of everybody's verification keys
  (``verification-keys.json``, public, ``--node-config "verification-keys=..."``); the SuperLink and the
  ServerApp hold no key (the server only forwards signatures, which it cannot forge). The registry comes from
  the node's own configuration, never from the run config: the server writes the run config, and a registry
  it chose would let it sign for everybody. A SuperNode holding a signing key requires the consistency round
  in every SecAgg+ run: a server that leaves it out gets error replies and no share.
* "SecAgg+ only" (:func:`node_requires_secagg`): a SuperNode holding a signing key, or one whose node config
  says ``require-secagg=true``, refuses a run without SecAgg+ (the server writes the run config, so
  ``--run-config "secagg=false"`` would otherwise collect every node's plain model): it answers with an error
  and sends no model. ``require-secagg=false`` in the node's own config lifts it.

Every ``flwr`` command here runs as a subprocess; this module itself imports no ``flwr``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data import Dataset, client_datasets, load_digits, partition_iid
from ..fl import LocalTraining, cross_entropy
from ..fl.local import _local
from ..models import mlp

__all__ = ["demo_clients", "demo_model", "DemoApp", "write_app", "run_settings", "demo_server_app", "demo_client_app",
           "RUN_CONFIG", "Federation", "local_federation", "flwr_run", "write_tls_certificates",
           "write_supernode_keys", "write_consistency_keys", "node_consistency_keys", "node_requires_secagg"]

APP_MODULE = "fedlab_app"


def demo_clients(num_clients: int, *, seed: int = 0, examples_per_client: int | None = None) -> list[Dataset]:
    """The demonstration task's data: the digits (1797 images, 64 features in [0, 1]) split IID into
    ``num_clients`` partitions (:func:`fedlab.data.partition_iid` with ``seed``), each cut to its first
    ``examples_per_client`` examples when given.

    Raises ``ValueError`` for ``num_clients < 1`` or ``examples_per_client < 1``.
    """
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if examples_per_client is not None and examples_per_client < 1:
        raise ValueError(f"examples_per_client must be >= 1 or None, got {examples_per_client!r}")
    data = load_digits()
    parts = client_datasets(data, partition_iid(len(data.X), int(num_clients), seed=seed))
    if examples_per_client is None:
        return parts
    return [Dataset(c.X[:examples_per_client], c.y[:examples_per_client]) for c in parts]


def demo_model(*, seed: int = 0, hidden: int = 16) -> torch.nn.Module:
    """The demonstration task's model: ``mlp(64, [hidden], 10, seed=seed)``."""
    return mlp(64, [hidden], 10, seed=seed)


@dataclass(frozen=True)
class DemoApp:
    """The demonstration app that :func:`write_app` generates, apart from its FedAvg settings: the project's
    ``name`` (``[project] name`` of its ``pyproject.toml``), the model (:func:`demo_model` with ``model_seed`` and
    ``hidden`` units) and the data (:func:`demo_clients` with ``data_seed`` and ``examples_per_client``, ``None``:
    every example of the partition). The digits task stands in for a real deployment's task (McMahan et al.
    2017's FedAvg on IID partitions, Sec. 3).

    Raises ``ValueError`` naming the field for an empty ``name``, a ``hidden`` or ``examples_per_client`` that is
    not a positive integer (``examples_per_client`` may be ``None``) or a seed that is not an integer.
    """

    name: str = "fedlab-flower-demo"
    model_seed: int = 0
    hidden: int = 16
    data_seed: int = 0
    examples_per_client: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DemoApp.name must be a non-empty string, got {self.name!r}")
        for key in ("model_seed", "data_seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"DemoApp.{key} must be an integer, got {value!r}")
        for key in ("hidden", "examples_per_client"):
            value = getattr(self, key)
            if key == "examples_per_client" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DemoApp.{key} must be an integer >= 1{' or None' if key != 'hidden' else ''}, "
                                 f"got {value!r}")


_PYPROJECT = """\
# A Flower App generated by fedlab.flower.deploy.write_app
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "fedlab's FedAvg on Flower (demonstration task: digits, one IID partition per SuperNode)"
# empty: Flower 1.41 installs an app's dependencies with `uv sync` into a fresh runtime environment,
# which needs a package index; the SuperLink's and SuperNodes' environment provides fedlab and flwr
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedlab"

[tool.flwr.app.components]
serverapp = "{module}:server"
clientapp = "{module}:client"

[tool.flwr.app.config]
"""

_MODULE = '''\
"""Flower App generated by fedlab.flower.deploy.write_app: fedlab's FedAvg (fedlab.flower.apps) on the
digits, partition ``partition-id`` of ``num-partitions`` (the SuperNode's --node-config) per node. The
settings are the run config (pyproject.toml's [tool.flwr.app.config], overridden by
``flwr run ... --run-config "num-rounds=5 lr=0.05"``); each run writes its transcript to
``<transcript-root>/run-<run id>``. With ``secagg=true`` the rounds run SecAgg+; a node whose --node-config
names ``signing-key`` and ``verification-keys`` (fedlab.flower.deploy.write_consistency_keys) requires
Bonawitz et al.'s consistency round (``consistency=true``) and signs with its own key, and refuses a run without
SecAgg+ (so does a node with ``require-secagg=true``; ``require-secagg=false`` lifts it)."""
from fedlab.flower.deploy import demo_client_app, demo_server_app

server = demo_server_app()
client = demo_client_app()
'''

#: the run-config keys of a generated app, with their types; 0 means "none" for ``batch-size`` (full batch),
#: ``local-steps`` and ``examples-per-client`` (all), ``"none"`` for ``dp`` (a run config holds no null);
#: ``secagg``, ``consistency``: SecAgg+ and its consistency round; ``secagg-threshold``: SecAgg+'s
#: ``reconstruction_threshold`` (a fraction of the round's clients)
RUN_CONFIG = {"num-clients": int, "num-rounds": int, "lr": float, "local-epochs": int, "batch-size": int,
              "local-steps": int, "weight-decay": float, "client-fraction": float, "seed": int, "dp": str,
              "noise-multiplier": float, "clipping-norm": float, "node-timeout": float, "transcript-root": str,
              "model-seed": int, "hidden": int, "data-seed": int, "examples-per-client": int, "secagg": bool,
              "consistency": bool, "secagg-threshold": float}


def run_settings(run_config: dict) -> dict:
    """The settings of a generated app from Flower's run config (:data:`RUN_CONFIG`'s keys): ``{"server":
    server_app keyword arguments without transcript_dir (``aggregation``: ``None``, a
    :class:`fedlab.flower.FixedClippingDP` or a :class:`fedlab.flower.SecAgg`; ``timeouts``), "task": {model_seed, hidden, data_seed,
    examples_per_client}, "transcript_root": str}``.

    Raises ``ValueError`` naming the key for a missing key, an unknown key or a value of the wrong type,
    ``consistency`` without ``secagg``, ``secagg`` with ``dp``, a ``secagg-threshold`` outside (0, 1], or one that gives
    ``2 t <= num-clients`` with ``consistency`` (Flower's ``t = max(round(secagg-threshold m), 2)`` of the
    ``m`` clients a round; every node would refuse it, see :func:`fedlab.flower.secagg.consistency_mod`)."""
    missing = sorted(set(RUN_CONFIG) - set(run_config))
    unknown = sorted(set(run_config) - set(RUN_CONFIG))
    if missing or unknown:
        raise ValueError(f"run config: missing keys {missing}, unknown keys {unknown} (known: {sorted(RUN_CONFIG)})")
    cfg = {}
    for key, kind in RUN_CONFIG.items():
        value = run_config[key]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if kind is float else \
            (isinstance(value, int) and not isinstance(value, bool)) if kind is int else isinstance(value, kind)
        if not ok:
            raise ValueError(f"run config: {key} must be {kind.__name__}, got {value!r}")
        cfg[key] = kind(value)
    if cfg["dp"] not in ("none", "client", "server"):
        raise ValueError(f"run config: dp must be 'none', 'client' or 'server', got {cfg['dp']!r}")
    if cfg["consistency"] and not cfg["secagg"]:
        raise ValueError("run config: consistency=true needs secagg=true (the consistency round is part of SecAgg+)")
    if not 0.0 < cfg["secagg-threshold"] <= 1.0:
        raise ValueError(f"run config: secagg-threshold must be in (0, 1], got {cfg['secagg-threshold']!r}")
    if cfg["consistency"]:
        m = max(int(round(cfg["client-fraction"] * cfg["num-clients"])), 1)
        t = max(int(round(cfg["secagg-threshold"] * m)), 2)
        if 2 * t <= cfg["num-clients"]:
            raise ValueError(f"run config: secagg-threshold={cfg['secagg-threshold']} gives t={t} of {m} clients a "
                             f"round, not above half of num-clients={cfg['num-clients']}: the nodes' consistency "
                             "round would refuse it (raise secagg-threshold)")
    from .apps import FixedClippingDP, SecAgg, Timeouts

    local = LocalTraining(lr=cfg["lr"], local_epochs=cfg["local-epochs"], batch_size=cfg["batch-size"] or None,
                          local_steps=cfg["local-steps"] or None, weight_decay=cfg["weight-decay"])
    if cfg["secagg"]:
        if cfg["dp"] != "none":
            raise ValueError(f"run config: secagg=true cannot be combined with dp={cfg['dp']!r}")
        aggregation = SecAgg(reconstruction_threshold=cfg["secagg-threshold"], consistency=cfg["consistency"])
    elif cfg["dp"] != "none":
        aggregation = FixedClippingDP(cfg["dp"], noise_multiplier=cfg["noise-multiplier"],
                                      clipping_norm=cfg["clipping-norm"])
    else:
        aggregation = None
    server = dict(num_clients=cfg["num-clients"], num_rounds=cfg["num-rounds"], local=local,
                  client_fraction=cfg["client-fraction"], seed=cfg["seed"], aggregation=aggregation,
                  timeouts=Timeouts(node_timeout=cfg["node-timeout"]))
    task = dict(model_seed=cfg["model-seed"], hidden=cfg["hidden"], data_seed=cfg["data-seed"],
                examples_per_client=cfg["examples-per-client"] or None)
    return {"server": server, "task": task, "transcript_root": cfg["transcript-root"]}


def _task_fns(task: dict):
    def model_fn():
        return demo_model(seed=task["model_seed"], hidden=task["hidden"])

    def load_partition(partition_id, num_partitions):
        return demo_clients(num_partitions, seed=task["data_seed"],
                            examples_per_client=task["examples_per_client"])[partition_id]

    return model_fn, load_partition


def demo_server_app():
    """The ServerApp of a generated app: each run reads its settings from the run config (:func:`run_settings`)
    and writes its transcript to ``<transcript-root>/run-<run id>`` (a new directory per run, so a second
    ``flwr run`` never meets the first one's transcript)."""
    from flwr.serverapp import ServerApp

    from .apps import server_app

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        s = run_settings(dict(context.run_config))
        model_fn, _ = _task_fns(s["task"])
        inner = server_app(model_fn, Path(s["transcript_root"]) / f"run-{context.run_id}", **s["server"])
        inner(grid, context)

    return app


def node_consistency_keys(node_config: dict):
    """The consistency-round keys a SuperNode holds, from its node config (``flower-supernode --node-config``):
    ``signing-key`` (the absolute path of its own Ed25519 private key) and ``verification-keys`` (the absolute
    path of the public registry), both written by :func:`write_consistency_keys`, for partition ``partition-id``. Returns a
    :class:`fedlab.flower.secagg.ConsistencyKeys` that signs only as this node, or ``None`` when the node
    config names neither.

    Raises ``ValueError`` when it names only one of the two, a relative path, or when the key is not the registry's key of
    the node's partition (:meth:`fedlab.flower.secagg.ConsistencyKeys.for_node`)."""
    signing, registry = node_config.get("signing-key"), node_config.get("verification-keys")
    if signing is None and registry is None:
        return None
    if signing is None or registry is None:
        raise ValueError("node config: signing-key and verification-keys go together (the node signs with its own "
                         f"key and verifies the others'), got signing-key={signing!r}, verification-keys={registry!r}")
    if "partition-id" not in node_config:
        raise ValueError("node config: signing-key needs the node's partition-id")
    for name, value in (("signing-key", signing), ("verification-keys", registry)):
        if not Path(str(value)).is_absolute():   # the ClientApp process need not share the SuperNode's directory
            raise ValueError(f"node config: {name} must be an absolute path, got {value!r}")
    from .secagg import ConsistencyKeys

    return ConsistencyKeys.for_node(registry, signing, partition=int(node_config["partition-id"]))


def node_requires_secagg(node_config: dict) -> bool:
    """The node's "SecAgg+ only" policy, from its own node config (``flower-supernode --node-config``): the
    value of ``require-secagg`` (a TOML boolean) if given, else whether the node holds a signing key for the
    consistency round (:func:`node_consistency_keys`). The server cannot change it: it writes the run
    config, not the node config. Raises ``ValueError`` for a ``require-secagg`` that is not a boolean."""
    value = node_config.get("require-secagg")
    if value is None:
        return node_config.get("signing-key") is not None
    if not isinstance(value, bool):
        raise ValueError(f"require-secagg must be true or false (a TOML boolean), got {value!r}")
    return value


def demo_client_app():
    """The ClientApp of a generated app: the node's partition of the demonstration task, with the settings of
    the message's run (:func:`run_settings` of ``context.run_config``; one fedlab ClientApp per distinct run
    config and node).

    A node whose policy requires SecAgg+ (:func:`node_requires_secagg`: it holds consistency keys, or its
    node config says ``require-secagg=true``) refuses a run without ``secagg`` with ``ValueError`` (an error
    reply, no model sent).

    Under SecAgg+ (run config ``secagg``) a node holding consistency keys in its node config
    (:func:`node_consistency_keys`) runs :func:`fedlab.flower.secagg.consistency_mod` with them whatever the
    run config says about ``consistency``: the node, not the server, decides that its shares leave only after
    the consistency round. A run asking for ``consistency`` on a node without keys raises ``ValueError``
    (an error reply)."""
    from flwr.clientapp import ClientApp

    from .apps import SecAgg, client_app

    apps: dict = {}

    def inner(context):
        s = run_settings(dict(context.run_config))
        aggregation = s["server"]["aggregation"]
        secagg = isinstance(aggregation, SecAgg)
        if not secagg and node_requires_secagg(context.node_config):
            raise ValueError("this node requires SecAgg+ (its --node-config holds a signing key or says "
                             "require-secagg=true), but the run asks for plain FedAvg (secagg=false): no model "
                             "leaves this node")
        node = {k: context.node_config.get(k) for k in ("partition-id", "signing-key", "verification-keys")}
        key = json.dumps([dict(context.run_config), node if secagg else None], sort_keys=True)
        if key not in apps:
            keys = node_consistency_keys(context.node_config) if secagg else None
            if secagg and aggregation.consistency and keys is None:
                raise ValueError("the run asks for the consistency round, but this node's --node-config names no "
                                 "signing-key and verification-keys (fedlab.flower.deploy.write_consistency_keys)")
            model_fn, load_partition = _task_fns(s["task"])
            apps[key] = client_app(model_fn, load_partition,
                                   dp_client_clipping=getattr(aggregation, "mode", None) == "client",
                                   secagg=secagg, consistency_keys=keys)
        return apps[key]

    app = ClientApp()

    @app.query()
    def query(msg, context):
        return inner(context)(msg, context)

    @app.train()
    def train(msg, context):
        return inner(context)(msg, context)

    @app.evaluate()
    def evaluate(msg, context):
        return inner(context)(msg, context)

    return app


def _toml_value(value) -> str:
    return json.dumps(value)        # TOML's basic strings, integers, floats and booleans are JSON's


def write_app(path, transcript_root, *, num_clients: int, num_rounds: int, local: LocalTraining = LocalTraining(),
              client_fraction: float = 1.0, seed: int = 0, aggregation=None, demo: DemoApp = DemoApp(),
              node_timeout: float = 120.0) -> Path:
    """Write a Flower App project to ``path`` (created; must not hold a ``pyproject.toml``).

    The ServerApp is :func:`fedlab.flower.apps.server_app` with the given FedAvg settings (same meaning as in
    :func:`fedlab.fl.fedavg`; ``local``: the clients' :class:`fedlab.fl.LocalTraining`, with the demonstration
    task's cross-entropy loss: a run config cannot carry another loss function) and ``aggregation``
    (:func:`fedlab.flower.apps.server_app`'s: ``None``, a :class:`fedlab.flower.FixedClippingDP` or a
    :class:`fedlab.flower.SecAgg`); the ClientApp trains on :func:`demo_clients` partition ``partition-id``,
    the model and data of ``demo`` (:class:`DemoApp`). The
    settings are written as the app's run config (``[tool.flwr.app.config]``, keys :data:`RUN_CONFIG`), so
    ``flwr run APP CONNECTION --run-config "num-rounds=5"`` changes them for one run. Each run writes its
    transcript to ``<transcript_root>/run-<run id>`` (``transcript_root`` made absolute; a path on the
    SuperLink's machine). Returns ``path``.

    ``aggregation=SecAgg(...)`` aggregates with SecAgg+; a run config carries only its
    ``reconstruction_threshold`` (``secagg-threshold``) and ``consistency`` (Bonawitz et al.'s consistency
    round, for which every SuperNode needs its signing key and the registry in its node config:
    :func:`write_consistency_keys`, :func:`local_federation`'s ``consistency_keys``); its other fields must keep
    their defaults.

    Raises
    ------
    ValueError
        If ``path`` already holds a Flower App, or a setting is invalid (checked by building the apps
        here, as the SuperLink will), or ``aggregation`` holds SecAgg+ settings a run config cannot carry.
    """
    path = Path(path)
    if (path / "pyproject.toml").exists():
        raise ValueError(f"path {path} already holds a pyproject.toml")
    local = _local(local)
    if local.loss_fn is not cross_entropy:
        raise ValueError(f"local: a generated app trains with cross-entropy (a run config cannot carry a loss "
                         f"function), got loss_fn={local.loss_fn!r}")
    if not isinstance(demo, DemoApp):
        raise ValueError(f"demo must be a fedlab.flower.deploy.DemoApp, got {type(demo).__name__}: {demo!r}")
    from .apps import FixedClippingDP, SecAgg, _aggregation

    aggregation = _aggregation(aggregation)
    dp = aggregation if isinstance(aggregation, FixedClippingDP) else FixedClippingDP("server")   # unused without dp
    secagg = isinstance(aggregation, SecAgg)
    if secagg:
        default = SecAgg()
        carried = ("reconstruction_threshold", "consistency")
        other = [k for k in ("num_shares", "max_weight", "clipping_range", "quantization_range", "modulus_range",
                             "attack", "client_mods", "log") if getattr(aggregation, k) != getattr(default, k)]
        if other:
            raise ValueError(f"aggregation: a generated app's run config carries only SecAgg's {carried}, "
                             f"got other settings {other}")
    lr, local_epochs, batch_size = local.lr, local.local_epochs, local.batch_size
    local_steps, weight_decay = local.local_steps, local.weight_decay
    for key, value in (("batch_size", batch_size), ("local_steps", local_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be an integer >= 1 or None, got {value!r}")
    config = {"num-clients": num_clients, "num-rounds": num_rounds, "lr": lr, "local-epochs": local_epochs,
              "batch-size": batch_size or 0, "local-steps": local_steps or 0, "weight-decay": weight_decay,
              "client-fraction": client_fraction, "seed": seed,
              "dp": aggregation.mode if isinstance(aggregation, FixedClippingDP) else "none",
              "noise-multiplier": dp.noise_multiplier, "clipping-norm": dp.clipping_norm, "node-timeout": node_timeout,
              "transcript-root": str(Path(transcript_root).resolve()), "model-seed": demo.model_seed,
              "hidden": demo.hidden, "data-seed": demo.data_seed, "examples-per-client": demo.examples_per_client or 0,
              "secagg": secagg, "consistency": aggregation.consistency if secagg else False,
              "secagg-threshold": aggregation.reconstruction_threshold if secagg else 0.5}
    config = {k: (float(v) if RUN_CONFIG[k] is float and isinstance(v, int) and not isinstance(v, bool) else v)
              for k, v in config.items()}
    s = run_settings(config)          # types, then the FedAvg settings, checked now rather than on the SuperLink
    from .apps import server_app

    server_app(_task_fns(s["task"])[0], Path(s["transcript_root"]) / "run-0", **s["server"])   # writes nothing
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(_PYPROJECT.format(name=demo.name, module=APP_MODULE)
                                         + "".join(f"{k} = {_toml_value(v)}\n" for k, v in config.items()))
    (path / f"{APP_MODULE}.py").write_text(_MODULE)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float, procs) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with status {p.returncode} before listening")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@dataclass
class Federation:
    """A running local federation: the SuperLink's ``address``, the ``connection`` name that ``flwr``
    commands take, the ``env`` to run them with (``FLWR_HOME`` etc.) and the ``logs`` directory."""

    address: str
    connection: str
    env: dict
    logs: Path
    processes: list
    #: after the block: the pids of every process found below the started ones when stopping them
    stopped_descendants: list | None = None
    #: with ``consistency_keys``: :func:`write_consistency_keys`'s paths (node ``k`` got ``signing[k]``)
    consistency_keys: dict | None = None


def _bin(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else name


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; Flower's SuperExec starts its own session, so a
    process group does not hold it). Empty where ``/proc`` is missing."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for f in Path(f"/proc/{p}/task").iterdir()
                    for c in (f / "children").read_text().split()]
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError, ValueError):
            kids = []
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _stop(procs, grace: float = 5.0) -> list[int]:
    """Stop the processes we started, their process groups and every descendant (SIGTERM, then SIGKILL
    after ``grace`` seconds). Returns the pids of the descendants found."""
    below = [d for p in procs for d in _descendants(p.pid)]
    for p in procs:   # each was started in its own session: its group holds most of its subprocesses
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for d in below:
        try:
            os.kill(d, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    t0 = time.monotonic()
    for p in procs:
        try:
            p.wait(timeout=max(0.1, grace - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            pass
    while any(_alive(d) for d in below) and time.monotonic() - t0 < grace:
        time.sleep(0.1)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    for d in below:
        if _alive(d):
            try:
                os.kill(d, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return below


def write_tls_certificates(directory, *, host: str = "127.0.0.1", days: int = 2) -> dict[str, Path]:
    """A private certificate authority and a server certificate for ``host`` (an IP address, also valid for
    ``localhost``), signed by it, written to ``directory`` as PEM files: ``{"ca": ca.crt, "cert": server.pem,
    "key": server.key}`` (the key unencrypted, mode 0600). For tests and a trial on one host; a real
    federation uses certificates from its own authority."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(name("fedlab test CA")).issuer_name(name("fedlab test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name(host)).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": directory / "ca.crt", "cert": directory / "server.pem", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def write_supernode_keys(directory, name: str) -> dict[str, Path]:
    """A SuperNode's authentication key pair (NIST P-384, OpenSSH format, as ``flower-supernode
    --auth-supernode-private-key`` and ``flwr supernode register`` read them) in ``directory``:
    ``{"private": <name>, "public": <name>.pub}``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = {"private": directory / name, "public": directory / f"{name}.pub"}
    paths["private"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                   serialization.NoEncryption()))
    paths["private"].chmod(0o600)
    paths["public"].write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                              serialization.PublicFormat.OpenSSH))
    return paths


def write_consistency_keys(directory, num_nodes: int) -> dict:
    """The keys of Bonawitz et al.'s consistency round (CCS 2017, Sec. 6: a PKI in which every client signs
    and every client verifies) for a federation of ``num_nodes`` SuperNodes, partitions ``0..num_nodes-1``,
    written to ``directory``:

    * ``signing-key-<k>.pem``: node ``k``'s Ed25519 private key (PEM, PKCS#8, unencrypted, mode 0600). It is
      node ``k``'s secret: give it to that node only (``--node-config "signing-key=<path>"``);
    * ``verification-keys.json``: the public registry ``{"format": "fedlab-consistency-keys/1", "keys":
      {"k": hex of node k's raw public key}}``, the same file for every node (``--node-config
      "verification-keys=<path>"``); the server needs no key at all.

    Made in one place, this is for a trial on one host and for tests; across machines each node generates its
    own key pair and only the public halves are collected into the registry (same format). Files are written
    atomically. Returns ``{"verification": path, "signing": [path of node 0, ...]}``.

    Raises ``ValueError`` for ``num_nodes < 2`` (the round needs at least two signers)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from .._io import atomic_write_bytes

    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an integer >= 2, got {num_nodes!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    signing, public = [], {}
    for k in range(num_nodes):
        key = Ed25519PrivateKey.generate()
        path = directory / f"signing-key-{k}.pem"
        atomic_write_bytes(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        path.chmod(0o600)
        signing.append(path)
        public[str(k)] = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    registry = atomic_write_bytes(directory / "verification-keys.json",
                                  json.dumps({"format": "fedlab-consistency-keys/1", "keys": public}, indent=1).encode())
    return {"verification": registry, "signing": signing}


@contextmanager
def local_federation(num_nodes: int, *, workdir=None, startup_timeout: float = 60.0, env: dict | None = None,
                     tls: bool = False, supernode_auth: bool = False, consistency_keys: bool = False,
                     require_secagg: bool | None = None):
    """Start one SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (in-memory state); node ``k`` gets
    ``--node-config "partition-id=k num-partitions=num_nodes"`` and a port of its own. Yields a
    :class:`Federation`; on exit (normal or not) terminates the process group of every process it started,
    then kills what is left.

    ``tls=False`` runs everything ``--insecure`` (clear text). ``tls=True`` generates a private certificate
    authority and a certificate for 127.0.0.1 (:func:`write_tls_certificates`, in ``workdir/certs``): the
    SuperLink serves TLS, the SuperNodes and the ``flwr`` CLI verify it against that authority.
    ``supernode_auth=True`` (needs ``tls``) also starts the SuperLink with ``--enable-supernode-auth``,
    generates each SuperNode's key pair (:func:`write_supernode_keys`), registers its public key with ``flwr
    supernode register`` and starts it with ``--auth-supernode-private-key``: a SuperNode whose key was not
    registered is refused.

    ``consistency_keys=True`` generates the keys of the consistency round (:func:`write_consistency_keys`, in
    ``workdir/consistency``) and starts node ``k`` with ``signing-key`` (its own key only) and
    ``verification-keys`` (the public registry) in its node config; their paths are the federation's
    ``consistency_keys``. Such nodes require the consistency round in every SecAgg+ run, and refuse runs
    without SecAgg+ (:func:`node_requires_secagg`) unless ``require_secagg=False``, which writes
    ``require-secagg=false`` into every node's config (a federation that runs plain and SecAgg+ runs side by
    side); ``require_secagg=True`` writes ``require-secagg=true``; ``None`` leaves the nodes' default.

    ``workdir`` (default: a temporary directory) holds ``FLWR_HOME`` and one log file per process. The
    processes get ``env`` on top of this process's environment, with ``PYTHONPATH`` extended so that the
    apps' subprocesses import this ``fedlab`` and Flower's telemetry off.

    Raises
    ------
    ValueError
        For ``num_nodes < 1`` (``< 2`` with ``consistency_keys``), or ``supernode_auth`` without ``tls``.
    RuntimeError
        If the SuperLink does not listen within ``startup_timeout`` seconds, or a registration fails.
    """
    if isinstance(num_nodes, bool) or int(num_nodes) != num_nodes or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")
    if supernode_auth and not tls:
        raise ValueError("supernode_auth=True needs tls=True (Flower authenticates SuperNodes over TLS only)")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="fedlab-federation-"))
    home, logs = workdir / "flwr_home", workdir / "logs"
    home.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    connection = "fedlab-local"
    certs = write_tls_certificates(workdir / "certs") if tls else None
    ckeys = write_consistency_keys(workdir / "consistency", int(num_nodes)) if consistency_keys else None
    security = f'root-certificates = "{certs["ca"]}"\n' if tls else "insecure = true\n"
    (home / "config.toml").write_text(f'[superlink]\ndefault = "{connection}"\n\n[superlink.{connection}]\n'
                                      f'address = "127.0.0.1:{port}"\n{security}')
    root = str(Path(__file__).resolve().parents[2])
    full_env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
                **(env or {})}
    procs: list[subprocess.Popen] = []
    fed = None

    def start(name, args):
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                          cwd=workdir, start_new_session=True))

    link_security = (["--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile", str(certs["cert"]),
                      "--ssl-keyfile", str(certs["key"])] if tls else ["--insecure"])
    node_security = ["--root-certificates", str(certs["ca"])] if tls else ["--insecure"]
    try:
        start("superlink", [_bin("flower-superlink"), *link_security, "--host", "127.0.0.1", "--port", str(port),
                            "--database", ":flwr-in-memory-state:",
                            *(["--enable-supernode-auth"] if supernode_auth else [])])
        _wait_port(port, startup_timeout, procs)
        for k in range(int(num_nodes)):
            auth = []
            if supernode_auth:
                keys = write_supernode_keys(workdir / "keys", f"supernode{k}")
                res = subprocess.run([_bin("flwr"), "supernode", "register", str(keys["public"]), connection],
                                     env=full_env, capture_output=True, text=True, timeout=startup_timeout)
                if res.returncode != 0:
                    raise RuntimeError(f"flwr supernode register failed for node {k} (status {res.returncode}):\n"
                                       f"{(res.stdout + res.stderr)[-2000:]}")
                auth = ["--auth-supernode-private-key", str(keys["private"])]
            node_config = f"partition-id={k} num-partitions={int(num_nodes)}"
            if ckeys:     # node k's own signing key, and the public registry
                node_config += (f" signing-key={_toml_value(str(ckeys['signing'][k]))}"
                                f" verification-keys={_toml_value(str(ckeys['verification']))}")
            if require_secagg is not None:
                node_config += f" require-secagg={_toml_value(bool(require_secagg))}"
            start(f"supernode{k}", [_bin("flower-supernode"), *node_security, "--superlink", f"127.0.0.1:{port}",
                                    "--host", "127.0.0.1", "--port", str(_free_port()), *auth,
                                    "--node-config", node_config])
        fed = Federation(f"127.0.0.1:{port}", connection, full_env, logs, procs, consistency_keys=ckeys)
        yield fed
    finally:
        below = _stop(procs)
        if fed is not None:
            fed.stopped_descendants = below


def flwr_run(app_dir, federation: Federation, *, run_config: dict | None = None,
             timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``flwr run APP_DIR CONNECTION --stream [--run-config "k=v ..."]`` against ``federation``: submits the
    app and waits until the run ends (at most ``timeout`` seconds). ``run_config`` overrides keys of the
    app's run config for this run (for a generated app, :data:`RUN_CONFIG`'s keys). Returns the completed
    process (``stdout`` holds the run's log). Raises ``RuntimeError`` with the log's tail if the command
    fails, times out, or the streamed log reports that the ServerApp failed (``flwr run`` itself exits 0
    then)."""
    args = [_bin("flwr"), "run", str(app_dir), federation.connection, "--stream"]
    if run_config:
        args += ["--run-config", " ".join(f"{k}={_toml_value(v)}" for k, v in run_config.items())]
    try:
        res = subprocess.run(args, env=federation.env, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"")
        out = out.decode() if isinstance(out, bytes) else out
        raise RuntimeError(f"flwr run did not finish within {timeout} s; log tail:\n{out[-3000:]}") from err
    log = res.stdout + res.stderr
    failed = [m for m in ("ServerApp raised an exception", "Exit Code:") if m in log]
    if res.returncode != 0 or failed:
        raise RuntimeError(f"flwr run failed (status {res.returncode}, {failed}):\n{log[-3000:]}")
    return res
