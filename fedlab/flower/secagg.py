"""fedlab's SecAgg+ server workflow around Flower's, with dropouts handled, a malicious server's hooks, and
Bonawitz et al.'s consistency round (CCS 2017, Sec. 6) as a client mod.

This module imports ``flwr``. The pieces:

* :class:`SecAggWorkflow`: ``flwr.server.workflow.SecAggPlusWorkflow`` (Bell et al. 2020) with Flower's first
  three stages unchanged and its own unmask stage. Flower's unmask stage (flwr 1.42) asks for shares of
  every *sampled* node, so a single client that fails in the setup or share-keys stage halts the round
  ("Not enough shares to recover secret"; measured); here a dead node is one that distributed its key
  shares but sent no masked model (``U2 \\ U3`` in Bonawitz et al.'s notation), and only the masks the
  survivors actually added are removed.
  Any stage may lose up to ``n - t`` clients; with fewer than ``t`` answers the workflow raises
  :class:`SecAggAborted` naming how many answered. It records what each stage sent and received in a
  :class:`SecAggLog`, including every client model it *could* unmask (it holds at least ``t`` shares of both
  the client's self-mask seed and its mask key: what a malicious server's lie buys, see
  :mod:`fedlab.flower.attacks`).
* ``attack``: an object of :mod:`fedlab.flower.attacks` (:class:`~fedlab.flower.attacks.FalseDropout`,
  :class:`~fedlab.flower.attacks.SplitView`, :class:`~fedlab.flower.attacks.InconsistentModel`) whose hooks
  change what the server sends; ``None`` is the honest server.
* ``consistency=True`` adds the consistency round between the masked-model and unmask stages, and the
  client side is :func:`consistency_mod` (placed before Flower's ``secaggplus_mod``) with the clients'
  signing keys :class:`ConsistencyKeys` (Ed25519, from ``cryptography``): every client signs its public keys
  (the server forwards them with the signatures; a client verifies each), the hash of the model it received
  (with its masked model), and the survivor set ``U3`` (in the consistency round); before revealing a share
  it checks that every member of ``U3`` received the same model, that at least ``t`` members of ``U3``
  signed the same ``U3``, and that the unmask request lists no member of ``U3`` as dropped. It also refuses
  a threshold ``2 t <= K`` (``K`` registered clients): otherwise two disjoint groups of ``t`` clients could
  each be shown, and sign, a different survivor set.
* :func:`disjoint_lists_mod`: the naive client-side fix (refuse an unmask request naming a node both active
  and dropped), which the split view defeats; :func:`drop_out_mod`: clients that fail in a given stage
  (for tests and the chapter).
"""
from __future__ import annotations

import hashlib
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import cast

import numpy as np

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.common import bytes_to_ndarray, ndarrays_to_parameters
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (factor_extract, get_parameters_shape,
                                                                    parameters_addition, parameters_mod,
                                                                    parameters_subtraction)
    from flwr.common.secure_aggregation.quantization import dequantize
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("fedlab.flower.secagg needs Flower and cryptography: install the extra with "
                      f"`pip install \".[flower]\"`; the import failed with: {err}") from err

__all__ = ["SecAggWorkflow", "SecAggLog", "SecAggAborted", "ConsistencyKeys", "consistency_mod",
           "disjoint_lists_mod", "drop_out_mod", "CONSISTENCY_STAGE", "STAGES"]

#: the stage name of the consistency round (a fedlab stage: Flower's ``secaggplus_mod`` never sees it)
CONSISTENCY_STAGE = "fedlab-consistency"
#: the stages in protocol order, with the consistency round where it runs
STAGES = (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, CONSISTENCY_STAGE, Stage.UNMASK)
_STATE = "fedlab-consistency-state"


class SecAggAborted(RuntimeError):
    """A SecAgg+ round stopped: fewer than ``t`` clients answered a stage (dropouts, or clients refusing a
    request). ``log`` is the run's :class:`SecAggLog` up to that point."""

    def __init__(self, message: str, log: "SecAggLog"):
        super().__init__(message)
        self.log = log


@dataclass
class SecAggLog:
    """What :class:`SecAggWorkflow` sent and received. ``rounds[t - 1]`` is a dict:

    * ``"stages"``: ``{stage: {"sent", "answered", "errors": {node: reason}, "seconds"}}``;
    * ``"threshold"``: ``t``; ``"sampled"``, ``"survivors"`` (``U3``): node ids;
    * ``"shares"``: ``{"seed": {node: count}, "key": {node: count}}``, the shares of each node's self-mask seed
      and mask key that the server received in the unmask stage;
    * ``"exposed"``: ``{node: [arrays]}``, the model of every node whose masked model the server could
      unmask on its own (at least ``t`` shares of both secrets), in the model's parameter order;
    * ``"weights"``: ``{node: r_k}``, the quantized weight each exposed model carried;
    * ``"aborted"``: the reason when the round stopped, else ``None``.

    ``partition_of_node`` maps node ids to partition ids (set by :func:`fedlab.flower.server_app`)."""

    rounds: list = field(default_factory=list)
    partition_of_node: dict = field(default_factory=dict)

    def messages(self, round: int = 1, stages=None) -> int:
        """Messages the server sent in ``round`` (in ``stages``, default all); each gets one reply or error."""
        st = self.rounds[round - 1]["stages"]
        return int(sum(v["sent"] for k, v in st.items() if stages is None or k in stages))

    def seconds(self, round: int = 1, stages=None) -> float:
        st = self.rounds[round - 1]["stages"]
        return float(sum(v["seconds"] for k, v in st.items() if stages is None or k in stages))

    def exposed_partitions(self, round: int = 1) -> list[int]:
        return sorted(self.partition_of_node.get(n, n) for n in self.rounds[round - 1]["exposed"])

    def refusals(self, round: int = 1, stage: str | None = None) -> dict[int, str]:
        """``{partition: reason}`` of the error replies of ``round`` (in ``stage``, default all stages)."""
        out = {}
        for name, st in self.rounds[round - 1]["stages"].items():
            if stage is None or name == stage:
                out.update({self.partition_of_node.get(n, n): r for n, r in st["errors"].items()})
        return out

    def key_shares_of_survivors(self, round: int = 1) -> int:
        """Shares of a *surviving* node's mask key the server received: 0 in an honest round (a survivor's
        key is never needed), and what a false-dropout lie collects."""
        r = self.rounds[round - 1]
        return int(sum(c for n, c in r["shares"]["key"].items() if n in r["survivors"]))


# --------------------------------------------------------------------------------------------
# signatures
# --------------------------------------------------------------------------------------------
def _int(x: int) -> bytes:
    # 16 bytes, signed: Flower's node ids are unsigned 64-bit (half of a deployment's are >= 2^63, which a
    # signed 8-byte field cannot hold: the consistency round then failed in setup on a real SuperNode)
    return int(x).to_bytes(16, "big", signed=True)


def _pack(*parts) -> bytes:
    """An unambiguous encoding of what a node signs: each part (a string, an integer, or a list of integers)
    length-prefixed."""
    out = []
    for p in parts:
        if isinstance(p, str):
            p = p.encode()
        elif isinstance(p, int):
            p = _int(p)
        elif isinstance(p, (list, tuple)):
            p = b"".join(_int(x) for x in p)
        out.append(struct.pack(">I", len(p)) + p)
    return b"".join(out)


class ConsistencyKeys:
    """The clients' Ed25519 signing keys and the public registry of their verification keys (the PKI that
    Bonawitz et al. assume, Sec. 6), by partition id. In a simulation one object holds every client's key;
    a client only ever signs with its own (:func:`consistency_mod` looks it up by its partition id). In a
    deployment each node holds only its own signing key and the registry (:meth:`for_node`).

    Raises ``ValueError`` for fewer than 2 partitions."""

    def __init__(self, partitions, *, seed: int | None = None):
        parts = sorted(int(p) for p in partitions)
        if len(parts) < 2 or len(set(parts)) != len(parts):
            raise ValueError(f"partitions must name at least 2 distinct clients, got {list(partitions)}")
        if seed is None:
            self._signing = {p: Ed25519PrivateKey.generate() for p in parts}
        else:   # reproducible keys (tests only: a key derived from a public seed is no secret)
            self._signing = {p: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(_pack("fedlab-key", seed, p)).digest())
                             for p in parts}
        self.public = {p: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for p, k in self._signing.items()}

    @classmethod
    def for_node(cls, verification_keys, signing_key=None, *, partition: int | None = None) -> "ConsistencyKeys":
        """One node's view in a deployment: the public registry ``verification_keys`` (a file written by
        :func:`fedlab.flower.deploy.write_consistency_keys`: JSON ``{"format": "fedlab-consistency-keys/1",
        "keys": {partition id: hex of the raw Ed25519 public key}}``) and, when ``signing_key`` is given, this
        node's own Ed25519 private key (PEM, PKCS#8) for ``partition``. The node can then sign only as
        ``partition``, and verify everybody.

        Raises
        ------
        ValueError
            For a registry that is unreadable, of another format or with fewer than 2 partitions; for a
            ``signing_key`` without ``partition``, unreadable, not Ed25519, or whose public key is not the
            registry's key of ``partition`` (a node given another node's key, or an unregistered one).
        """
        import json
        from pathlib import Path

        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        try:
            doc = json.loads(Path(verification_keys).read_text())
            if doc.get("format") != "fedlab-consistency-keys/1":
                raise ValueError(f"format {doc.get('format')!r}")
            public = {int(p): bytes.fromhex(h) for p, h in doc["keys"].items()}
            for p, raw in public.items():
                Ed25519PublicKey.from_public_bytes(raw)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"verification_keys {verification_keys}: not a fedlab consistency-key registry "
                             f"({type(err).__name__}: {err})") from err
        if len(public) < 2:
            raise ValueError(f"verification_keys {verification_keys}: registers {len(public)} partition(s), "
                             "at least 2 are needed")
        self = cls.__new__(cls)
        self.public, self._signing = dict(sorted(public.items())), {}
        if signing_key is None:
            return self
        if partition is None or isinstance(partition, bool) or int(partition) != partition:
            raise ValueError(f"partition must be the node's partition id (an integer), got {partition!r}")
        partition = int(partition)
        try:
            key = load_pem_private_key(Path(signing_key).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"signing_key {signing_key}: not a readable PEM private key ({err})") from err
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"signing_key {signing_key}: an Ed25519 key is needed, got {type(key).__name__}")
        mine = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        if self.public.get(partition) != mine:
            owner = [p for p, raw in self.public.items() if raw == mine]
            raise ValueError(f"signing_key {signing_key} is not partition {partition}'s key: its public key is "
                             + (f"partition {owner[0]}'s" if owner else "not in the registry"))
        self._signing[partition] = key
        return self

    @property
    def size(self) -> int:
        return len(self.public)

    def sign(self, partition: int, message: bytes) -> bytes:
        if partition not in self._signing:
            raise ValueError(f"partition {partition} has no signing key (registered: {sorted(self._signing)})")
        return self._signing[partition].sign(message)

    def verify(self, partition: int, message: bytes, signature) -> bool:
        if partition not in self.public or not isinstance(signature, bytes):
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.public[partition]).verify(signature, message)
            return True
        except InvalidSignature:
            return False


def model_hash(content: RecordDict) -> bytes:
    """SHA-256 of the model parameters in a SecAgg+ train message (``fitins.parameters``, in order)."""
    params = compat.recorddict_to_fitins(content, keep_input=True).parameters
    h = hashlib.sha256()
    for t in params.tensors:
        h.update(struct.pack(">Q", len(t)) + t)
    return h.digest()


def _refuse(node, what: str):
    raise ValueError(f"node {node} refuses: {what}")


def consistency_mod(keys: ConsistencyKeys, *, check_threshold: bool = True):
    """The client side of the consistency round (Bonawitz et al. 2017, Sec. 6), as a Flower mod to put
    *before* ``flwr.client.mod.secaggplus_mod`` in the ``ClientApp``'s mods. ``keys``: the clients' signing
    keys and the public registry (:class:`ConsistencyKeys`); the node signs with its partition's key.

    Per stage: setup: refuse ``2 t <= K`` (``K = keys.size``), sign ``(round, node, partition, pk1, pk2)``;
    share keys: verify every neighbour's signed keys (distinct registered partitions); masked model: sign
    the hash of the received model; consistency round: verify that every member of ``U3`` signed the hash
    of *this* node's model, then sign ``(round, U3)``; unmask: verify at least ``t`` signatures of members of
    ``U3`` over the same ``U3``, and that the request's active list lies in ``U3``, its dead list outside
    ``U3`` and among the nodes whose shares this node holds. Any failed check raises ``ValueError`` (the
    node's reply is an error, and no share leaves it). ``check_threshold=False`` drops the setup check (to
    show what the signatures alone do not stop: a split view when ``2 t <= K``)."""
    if not isinstance(keys, ConsistencyKeys):
        raise ValueError(f"keys must be a ConsistencyKeys, got {type(keys).__name__}")

    def mod(msg: Message, ctxt, call_next):
        if msg.metadata.message_type != MessageType.TRAIN or RECORD_KEY_CONFIGS not in msg.content.config_records:
            return call_next(msg, ctxt)
        cfg = msg.content.config_records[RECORD_KEY_CONFIGS]
        stage = cfg.get(Key.STAGE)
        node, rnd = int(msg.metadata.dst_node_id), str(msg.metadata.group_id)
        pid = int(ctxt.node_config["partition-id"])
        if _STATE not in ctxt.state.config_records:
            ctxt.state.config_records[_STATE] = ConfigRecord({})
        st = ctxt.state.config_records[_STATE]
        if stage == Stage.SETUP:
            t = int(cfg[Key.THRESHOLD])
            if check_threshold and 2 * t <= keys.size:
                _refuse(node, f"threshold t={t} is not above half of the K={keys.size} registered clients; two "
                              "disjoint groups of t clients could each sign a different survivor set")
            st.clear()
            st.update({"round": rnd, "t": t})
            reply = call_next(msg, ctxt)
            rc = reply.content.config_records[RECORD_KEY_CONFIGS]
            rc["fedlab-pid"] = pid
            rc["fedlab-sig"] = keys.sign(pid, _pack("keys", rnd, node, pid, rc[Key.PUBLIC_KEY_1], rc[Key.PUBLIC_KEY_2]))
            return reply
        if st.get("round") != rnd:
            _refuse(node, f"stage {stage!r} of round {rnd} without this round's setup")
        if stage == Stage.SHARE_KEYS:
            extra = {k: cfg.pop(k) for k in list(cfg) if str(k).startswith("fedlab-")}
            nids, pids = [], []
            for k, v in cfg.items():
                if k == Key.STAGE:
                    continue
                j = int(k)
                p, sig = extra.get(f"fedlab-pid/{j}"), extra.get(f"fedlab-sig/{j}")
                if not isinstance(p, int) or not keys.verify(p, _pack("keys", rnd, j, p, v[0], v[1]), sig):
                    _refuse(node, f"the public keys of node {j} carry no valid signature")
                nids.append(j)
                pids.append(p)
            if len(set(pids)) != len(pids) or node not in nids:
                _refuse(node, "the key list repeats a client or leaves this node out")
            st.update({"nids": nids, "pids": pids})
            return call_next(msg, ctxt)
        if stage == Stage.COLLECT_MASKED_VECTORS:
            h = model_hash(msg.content)
            st.update({"sources": [int(s) for s in cfg[Key.SOURCE_LIST]], "model": h})
            reply = call_next(msg, ctxt)
            reply.content.config_records[RECORD_KEY_CONFIGS]["fedlab-sig-model"] = keys.sign(pid, _pack("model", rnd, node, h))
            return reply
        pid_of = dict(zip(st.get("nids", []), st.get("pids", [])))
        if stage == CONSISTENCY_STAGE:
            u3 = sorted(int(j) for j in cfg["survivors"])
            sigs = dict(zip([int(j) for j in cfg["model-signers"]], cfg["model-signatures"]))
            if node not in u3 or not set(u3) <= set(pid_of):
                _refuse(node, f"survivor set {u3} leaves this node out or names unknown nodes")
            bad = [j for j in u3 if not keys.verify(pid_of[j], _pack("model", rnd, j, st["model"]), sigs.get(j))]
            if bad:
                _refuse(node, f"nodes {bad} of the survivor set did not receive the model this node received")
            st["survivors"] = u3
            return Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
                {"signature": keys.sign(pid, _pack("survivors", rnd, node, u3))})}), reply_to=msg)
        if stage == Stage.UNMASK:
            signers = [int(j) for j in cfg.pop("fedlab-signers", [])]
            sigs = cfg.pop("fedlab-signatures", [])
            if "survivors" not in st:
                _refuse(node, "unmask request without a consistency round")
            u3 = list(st["survivors"])
            valid = {j for j, s in zip(signers, sigs)
                     if j in u3 and j in pid_of and keys.verify(pid_of[j], _pack("survivors", rnd, j, u3), s)}
            if len(valid) < st["t"]:
                _refuse(node, f"{len(valid)} valid signatures of the survivor set, fewer than t={st['t']}")
            active, dead = set(cfg[Key.ACTIVE_NODE_ID_LIST]), set(cfg[Key.DEAD_NODE_ID_LIST])
            if not active <= set(u3) or dead & set(u3) or not dead <= set(st["sources"]):
                _refuse(node, f"the unmask request (active {sorted(active)}, dropped {sorted(dead)}) contradicts "
                              f"the signed survivor set {u3}")
            return call_next(msg, ctxt)
        return call_next(msg, ctxt)

    return mod


def disjoint_lists_mod(msg: Message, ctxt, call_next):
    """The naive client-side fix of the false-dropout lie, as a Flower mod before ``secaggplus_mod``: refuse
    (``ValueError``) an unmask request that names a node both active and dropped. A split view, each
    client's lists consistent, passes it (:class:`fedlab.flower.attacks.SplitView`)."""
    if msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records:
        cfg = msg.content.config_records[RECORD_KEY_CONFIGS]
        if cfg.get(Key.STAGE) == Stage.UNMASK:
            both = set(cfg[Key.ACTIVE_NODE_ID_LIST]) & set(cfg[Key.DEAD_NODE_ID_LIST])
            if both:
                _refuse(msg.metadata.dst_node_id, f"nodes {sorted(both)} are listed both active and dropped")
    return call_next(msg, ctxt)


def seeded_rounding_mod(seed: int):
    """A Flower mod for simulations (among the mods before ``secaggplus_mod``): the client's stochastic rounding
    of its model to SecAgg+'s ``Q`` levels (Flower's ``quantize`` draws from numpy's global random stream)
    draws from a stream of its own, seeded by ``(seed, partition id, server round)``, so that a simulated
    run's aggregate is the same on every call. Without it the rounding drew from whatever state the previous
    client's mask generator had left in numpy's global stream, and two runs with the same seed decoded
    aggregates that differed in the last levels (06b's imprint rows, the matrix's false-dropout row).

    Only the rounding stage (``COLLECT_MASKED_VECTORS``) is seeded; numpy's global state is restored after
    it. In a real deployment (:mod:`fedlab.flower.deploy`) the client rounds with randomness of its own: a
    server that knew the rounding's draws would learn more of each coordinate from the sum.

    Raises ``ValueError`` for a ``seed`` that is not a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)

    def mod(msg: Message, ctxt, call_next):
        if not (msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records
                and msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS):
            return call_next(msg, ctxt)
        cfg = compat.recorddict_to_fitins(msg.content, keep_input=True).config
        key = [seed, int(ctxt.node_config["partition-id"]), int(cfg.get("server-round", 0)), 0x5EC]
        state = np.random.get_state()
        np.random.seed(np.random.SeedSequence(key).generate_state(4))
        try:
            return call_next(msg, ctxt)
        finally:
            np.random.set_state(state)

    return mod


def drop_out_mod(stage: str, partitions):
    """A Flower mod making the clients of ``partitions`` fail (``ConnectionError``) when they receive a
    message of ``stage`` (one of :data:`STAGES`): a dropout in that stage. Put it first in the mods.

    Raises ``ValueError`` for an unknown stage."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    parts = {int(p) for p in partitions}

    def mod(msg: Message, ctxt, call_next):
        if (msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records
                and msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == stage
                and int(ctxt.node_config["partition-id"]) in parts):
            raise ConnectionError(f"partition {ctxt.node_config['partition-id']} dropped out in stage {stage}")
        return call_next(msg, ctxt)

    return mod


# --------------------------------------------------------------------------------------------
# the server workflow
# --------------------------------------------------------------------------------------------
@dataclass
class AttackContext:
    """What an attack hook of :mod:`fedlab.flower.attacks` is told: the ``target_node``, the round's
    ``threshold`` ``t``, the survivor set ``survivors`` (``U3``, once known) and the model's ``names``."""

    target_node: int | None
    threshold: int = 0
    survivors: frozenset = frozenset()
    names: tuple = ()


def _stage_of(messages) -> str | None:
    stages = {m.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) for m in messages
              if RECORD_KEY_CONFIGS in m.content.config_records}
    return stages.pop() if len(stages) == 1 else None


class _Tap:
    """The grid as the workflow sees it: counts, times and keeps what each stage sends and receives, and
    lets the workflow change an outgoing message (signatures to forward)."""

    def __init__(self, grid, workflow: "SecAggWorkflow"):
        self.grid, self.wf = grid, workflow

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        stage = _stage_of(messages)
        for m in messages:
            self.wf._outgoing(stage, m)
        t0 = time.perf_counter()
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.wf._incoming(stage, messages, replies, time.perf_counter() - t0)
        return replies


class SecAggWorkflow(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow`` with fedlab's unmask stage (dropouts in any stage, up to ``n - t``),
    the hooks of a malicious server (``attack``), the consistency round (``consistency``) and a
    :class:`SecAggLog` (``log``). Other arguments: Flower's.

    Raises (when run) :class:`SecAggAborted` when fewer than ``t`` clients answer a stage."""

    def __init__(self, num_shares, reconstruction_threshold, *, attack=None, consistency: bool = False,
                 log: SecAggLog | None = None, names=(), **kwargs):
        super().__init__(num_shares, reconstruction_threshold, **kwargs)
        self.attack, self.consistency = attack, bool(consistency)
        self.log = log if log is not None else SecAggLog()
        self.names = tuple(names)
        self.target_node = None

    # ---- bookkeeping ----
    def _outgoing(self, stage, msg):
        if stage == Stage.SHARE_KEYS and self.consistency:
            cfg = msg.content.config_records[RECORD_KEY_CONFIGS]
            for k in [k for k in cfg if k != Key.STAGE]:
                j = int(k)
                if j in self._r["key_sigs"]:
                    cfg[f"fedlab-pid/{j}"], cfg[f"fedlab-sig/{j}"] = self._r["key_sigs"][j]
        if stage == Stage.COLLECT_MASKED_VECTORS:
            cfg = msg.content.config_records[RECORD_KEY_CONFIGS]
            self._r["sources"][int(msg.metadata.dst_node_id)] = [int(s) for s in cfg[Key.SOURCE_LIST]]

    def _incoming(self, stage, messages, replies, seconds):
        errors = {int(r.metadata.src_node_id): str(r.error.reason) for r in replies if r.has_error()}
        self._r["stages"][stage] = {"sent": len(messages), "answered": len(replies) - len(errors), "errors": errors,
                                    "seconds": seconds}
        for r in replies:
            if r.has_error():
                continue
            node, cfg = int(r.metadata.src_node_id), r.content.config_records[RECORD_KEY_CONFIGS]
            if stage == Stage.SETUP and "fedlab-sig" in cfg:
                self._r["key_sigs"][node] = (cfg["fedlab-pid"], cfg["fedlab-sig"])
            elif stage == Stage.SHARE_KEYS:
                self._u2.add(node)
            elif stage == Stage.COLLECT_MASKED_VECTORS:
                self._masked[node] = [bytes_to_ndarray(b) for b in cfg[Key.MASKED_PARAMETERS]]
                if "fedlab-sig-model" in cfg:
                    self._r["model_sigs"][node] = cfg["fedlab-sig-model"]

    def _abort(self, stage, state, answered: int, sent: int):
        errors = self._r["stages"].get(stage, {}).get("errors", {})
        reasons = sorted(set(errors.values()))[:3]
        msg = (f"SecAgg+ round {self._round}, stage {stage}: {answered} of {sent} clients answered, fewer than the "
               f"reconstruction threshold t={state.threshold}" + (f"; errors: {reasons}" if reasons else ""))
        self._r["aborted"] = msg
        raise SecAggAborted(msg, self.log)

    def _check(self, stage, state, sent, ok=True):
        if not ok or len(state.active_node_ids) < state.threshold:
            self._abort(stage, state, len(state.active_node_ids), sent)

    # ---- the protocol ----
    def __call__(self, grid, context) -> None:
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        self._round = int(cfg[WorkflowKey.CURRENT_ROUND])
        self._r = {"stages": {}, "key_sigs": {}, "model_sigs": {}, "sources": {}, "shares": {"seed": {}, "key": {}},
                   "exposed": {}, "weights": {}, "aborted": None, "threshold": 0, "sampled": [], "survivors": []}
        self.log.rounds.append(self._r)
        self._u2, self._masked = set(), {}
        state, tap = WorkflowState(), _Tap(grid, self)
        ok = self.setup_stage(tap, context, state)
        if not state.threshold:
            raise SecAggAborted(f"SecAgg+ round {self._round}: fewer than 2 clients sampled", self.log)
        self._r["threshold"], self._r["sampled"] = state.threshold, sorted(state.sampled_node_ids)
        self._check(Stage.SETUP, state, len(state.sampled_node_ids), ok)
        actx = AttackContext(self.target_node, state.threshold, names=self.names)
        n = len(state.active_node_ids)
        ok = self.share_keys_stage(tap, context, state)
        self._check(Stage.SHARE_KEYS, state, n, ok)
        if self.attack is not None:
            for nid in list(state.nid_to_fitins):
                state.nid_to_fitins[nid] = self.attack.fit_content(nid, state.nid_to_fitins[nid], actx)
        n = len(state.active_node_ids)
        ok = self.collect_masked_vectors_stage(tap, context, state)
        self._check(Stage.COLLECT_MASKED_VECTORS, state, n, ok)
        actx.survivors = frozenset(state.active_node_ids)
        self._r["survivors"] = sorted(state.active_node_ids)
        recipients = set(state.active_node_ids)
        extra = {}
        if self.consistency:
            signers, sigs = self._consistency_round(tap, state, actx)
            recipients = set(signers)
            extra = {"fedlab-signers": signers, "fedlab-signatures": sigs}
        self._unmask(tap, context, state, recipients, extra, actx)

    def _consistency_round(self, tap, state, actx):
        u3 = sorted(state.active_node_ids)
        signers = [j for j in u3 if j in self._r["model_sigs"]]
        msgs = []
        for nid in u3:
            shown = self.attack.survivors(nid, u3, actx) if self.attack is not None else u3
            msgs.append(Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
                {Key.STAGE: CONSISTENCY_STAGE, "survivors": list(shown), "model-signers": signers,
                 "model-signatures": [self._r["model_sigs"][j] for j in signers]})}),
                dst_node_id=nid, message_type=MessageType.TRAIN, group_id=str(self._round)))
        replies = tap.send_and_receive(msgs, timeout=self.timeout)
        ok = [r for r in replies if not r.has_error()]
        if len(ok) < state.threshold:
            self._abort(CONSISTENCY_STAGE, state, len(ok), len(msgs))
        return ([int(r.metadata.src_node_id) for r in ok],
                [r.content.config_records[RECORD_KEY_CONFIGS]["signature"] for r in ok])

    def _unmask(self, tap, context, state, recipients, extra, actx):
        u3 = set(state.active_node_ids)
        dead = self._u2 - u3                      # distributed its shares, sent no masked model
        sent_active = {}
        msgs = []
        for nid in sorted(recipients):
            nb = state.nid_to_neighbours[nid]
            active, dropped = sorted(nb & u3), sorted(nb & dead)
            if self.attack is not None:
                active, dropped = self.attack.unmask_lists(nid, active, dropped, actx)
            sent_active[nid] = len(active)
            msgs.append(Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
                {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: list(active), Key.DEAD_NODE_ID_LIST: list(dropped),
                 **extra})}), dst_node_id=nid, message_type=MessageType.TRAIN, group_id=str(self._round)))
        replies = tap.send_and_receive(msgs, timeout=self.timeout)
        ok = [r for r in replies if not r.has_error()]
        seed, key = defaultdict(list), defaultdict(list)
        for r in ok:
            res = r.content.config_records[RECORD_KEY_CONFIGS]
            na = sent_active[int(r.metadata.src_node_id)]
            for i, (owner, share) in enumerate(zip(res[Key.NODE_ID_LIST], res[Key.SHARE_LIST], strict=True)):
                (seed if i < na else key)[int(owner)].append(share)
        self._r["shares"] = {"seed": {k: len(v) for k, v in seed.items()}, "key": {k: len(v) for k, v in key.items()}}
        t, mod = state.threshold, state.mod_range
        shape = get_parameters_shape(state.aggregate_ndarrays)
        # what the server can unmask on its own: any node with t shares of both secrets
        for j in sorted(u3):
            if len(seed[j]) >= t and len(key[j]) >= t:
                self._r["exposed"][j], self._r["weights"][j] = self._unmask_one(j, seed[j], key[j], state, shape)
        if len(ok) < t:
            self._abort(Stage.UNMASK, state, len(ok), len(msgs))
        masked = state.aggregate_ndarrays
        for j in sorted(u3):
            if len(seed[j]) < t:
                self._abort(Stage.UNMASK, state, len(seed[j]), len(msgs))
            masked = parameters_subtraction(masked, pseudo_rand_gen(combine_shares(seed[j][:t]), mod, shape))
        for d in sorted(dead):
            if len(key[d]) < t:
                self._abort(Stage.UNMASK, state, len(key[d]), len(msgs))
            sk1 = bytes_to_private_key(combine_shares(key[d][:t]))
            for j in sorted(u3):
                if d not in self._r["sources"].get(j, ()):
                    continue       # j never added a mask with d
                mask = pseudo_rand_gen(generate_shared_key(sk1, bytes_to_public_key(state.nid_to_publickeys[j][0])),
                                       mod, shape)
                masked = parameters_addition(masked, mask) if d > j else parameters_subtraction(masked, mask)
        q_total, recon = factor_extract(parameters_mod(masked, mod))
        agg = dequantize(recon, state.clipping_range, state.quantization_range)
        offset = -(len(u3) - 1) * state.clipping_range
        for vec in agg:
            vec += offset
            vec *= state.quantization_range / q_total
        params = ndarrays_to_parameters(agg)
        for _, fitres in state.legacy_results:
            fitres.parameters = params
        p_agg, m_agg = context.strategy.aggregate_fit(self._round, state.legacy_results, state.failures)
        if p_agg:
            context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(p_agg, True)
            context.history.add_metrics_distributed_fit(server_round=self._round, metrics=m_agg)

    def _unmask_one(self, j, seed_shares, key_shares, state, shape):
        """Node ``j``'s model from its masked model, its self-mask seed and its mask key (``[arrays]``, ``r_j``)."""
        t, mod = state.threshold, state.mod_range
        vec = parameters_subtraction(self._masked[j], pseudo_rand_gen(combine_shares(seed_shares[:t]), mod, shape))
        sk1 = bytes_to_private_key(combine_shares(key_shares[:t]))
        for i in self._r["sources"].get(j, ()):
            mask = pseudo_rand_gen(generate_shared_key(sk1, bytes_to_public_key(state.nid_to_publickeys[i][0])),
                                   mod, shape)
            vec = parameters_subtraction(vec, mask) if j > i else parameters_addition(vec, mask)
        q_ratio, rest = factor_extract(parameters_mod(vec, mod))
        w = dequantize(rest, state.clipping_range, state.quantization_range)
        r = int(q_ratio) / state.quantization_range
        return [np.asarray(a) / r for a in w], r
