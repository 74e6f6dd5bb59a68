"""What the server of a Flower run saw: the transcript file of :class:`fedlab.flower.Recorder`.

A transcript is a directory (written by the server, read by :func:`load_transcript`; neither needs
``flwr``)::

    <dir>/index.json                 the index, rewritten atomically after every round
    <dir>/global_<t>.npz             the global model after round t (t = 0: the initial model)
    <dir>/<kind>_r<t>_n<node>.npz    the arrays of one reply
    <dir>/sent_<kind>_r<t>_n<node>.npz   a model the server sent that is none of its global models

``index.json`` (version 2) holds ``{"format": "fedlab.flower.transcript", "version": 2, "param_names": [...],
"meta": {...}, "globals": [...], "messages": [...], "sent": [...]}``:

* ``globals``: ``{"round": t, "file": ..., "sha256": <of the file>, "digest": <of the arrays>}``;
* ``messages``: one entry per reply the server received, in the order received::

    {"round": t, "kind": <kind>, "node_id": <Flower node id>, "partition_id": <int or null>,
     "num_examples": <int or null>, "metrics": {name: number or list}, "file": "<npz name>" or null,
     "sha256": <of the file> or null, "error": "<reason>" or null}

* ``sent`` (new in version 2): one entry per message the server *sent*, in the order sent::

    {"round": t, "kind": <kind>, "node_id": <destination node>, "digest": <of its arrays> or null,
     "global": <round r whose global model it carried> or null, "file": "<npz name>" or null,
     "sha256": <of the file> or null, "config": {name: int, float, str or list of ints}}

  A message that carried the global model of a round names that round in ``global``; one that carried any
  other model (a malicious server's decoy, Pasquini et al. 2022) stores it in its own ``file``. ``config``
  keeps the small values of the message's configuration (for SecAgg+ the stage and the active and dropped
  node lists of the unmask request, so a false-dropout lie or a split view is on the record); byte strings
  (keys, shares, the model's generator state) are left out.

Kinds: ``"train"``, ``"evaluate"`` (FedAvg's rounds; an evaluate reply carries no arrays), and the four
SecAgg+ stages (:data:`fedlab.flower.apps.SECAGG_KINDS`): ``"secagg-keys"`` (each client's two public keys),
``"secagg-shares"`` (the encrypted key shares it forwards to the others), ``"secagg-masked"`` (its masked
model: ``{name: uint64/int64 array}`` of ring elements modulo ``modulus_range``, the masked weight in its
metrics as ``masked-weight``, its ``num_examples`` and ``train-loss`` in the clear) and ``"secagg-unmask"``
(the shares it reveals); the other three store only the size of what they carry (``metrics["bytes"]``).
``"secagg-consistency"`` is the consistency round's stage (:mod:`fedlab.flower.secagg`).

The ``digest`` of a model is the SHA-256 of its arrays in order (each one's dtype, shape and bytes), so a
model the server sent and a global model compare by digest; ``sha256`` is that of the ``.npz`` file, checked
when the transcript is read. Each ``.npz`` maps the parameter names of the model (``param_names``) to arrays
exactly as they crossed the network (before any server-side clipping or noise). ``meta`` holds the run's
settings (``lr``, ``local_epochs``, ``batch_size``, ``seed``, the DP mode and its parameters, ...).
Version 1 transcripts (no ``sent``, no hashes) are still read.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._io import atomic_write_bytes

__all__ = ["FORMAT", "VERSION", "MAX_ARRAY_BYTES", "Reply", "Sent", "Transcript", "TranscriptWriter",
           "load_transcript", "model_digest"]

FORMAT = "fedlab.flower.transcript"
VERSION = 2
#: versions :func:`load_transcript` reads
READABLE_VERSIONS = (1, 2)
#: default limit on one array of a transcript when it is read (1 GiB): a 1.6 MB ``.npz`` can declare an array
#: of gigabytes (a zip bomb), so the sizes are checked before anything is allocated
MAX_ARRAY_BYTES = 2 ** 30
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+\.npz")


@dataclass
class Reply:
    """One reply message as the server received it.

    ``params``: ``{name: tensor}`` the client sent (empty for an evaluate reply or an error);
    ``partition_id``: the data partition the node reported (``None`` if it did not say).
    """

    round: int
    kind: str
    node_id: int
    partition_id: int | None
    num_examples: int | None
    metrics: dict
    params: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class Sent:
    """One message the server sent (transcript version 2).

    ``digest``: :func:`model_digest` of the model it carried (``None``: it carried none); ``global_round``:
    the round whose global model it was (``None``: none of them); ``params``: that model ``{name: tensor}``
    (empty when it carried none); ``config``: the message's small configuration values (SecAgg+'s stage and
    node lists)."""

    round: int
    kind: str
    node_id: int
    digest: str | None
    global_round: int | None
    params: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


@dataclass
class Transcript:
    """A loaded transcript: ``globals[t]`` is the global parameter dict after round ``t`` (0: the
    initial model), ``replies`` every reply in the order received, ``sent`` every message the server sent
    (empty for a version 1 transcript), ``meta`` the run's settings."""

    path: Path
    param_names: list[str]
    meta: dict
    globals: dict[int, dict]
    replies: list[Reply]
    sent: list[Sent] = field(default_factory=list)
    version: int = VERSION

    def models_sent(self, round: int, kind: str = "train") -> dict[int, str]:
        """``{node_id: digest}`` of the models the server sent in ``round`` (messages of ``kind``; for a SecAgg+
        run the model travels in the ``"secagg-masked"`` stage's request)."""
        return {s.node_id: s.digest for s in self.sent if s.round == round and s.kind == kind and s.digest}

    def inconsistent_rounds(self) -> list[int]:
        """The rounds in which the server sent different models to different nodes in one kind of message
        (model inconsistency, Pasquini et al. CCS 2022), read from ``sent``."""
        seen: dict = {}
        for s in self.sent:
            if s.digest is not None:
                seen.setdefault((s.round, s.kind), set()).add(s.digest)
        return sorted({r for (r, _), d in seen.items() if len(d) > 1})

    @property
    def num_rounds(self) -> int:
        """The last round whose global model was recorded."""
        return max(self.globals) if self.globals else 0

    def train_replies(self, round: int | None = None) -> list[Reply]:
        """The train replies (of one ``round`` when given), sorted by partition id then node id."""
        out = [r for r in self.replies if r.kind == "train" and r.error is None
               and (round is None or r.round == round)]
        return sorted(out, key=lambda r: (r.round, -1 if r.partition_id is None else r.partition_id, r.node_id))

    @property
    def final_params(self) -> dict:
        """The global model after the last round."""
        if not self.globals:
            raise ValueError(f"transcript {self.path} holds no global model")
        return self.globals[self.num_rounds]


def _to_numpy(params: dict) -> dict[str, np.ndarray]:
    return {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in params.items()}


def model_digest(arrays) -> str:
    """SHA-256 (hex) of a model: ``arrays`` a ``{name: array}`` dict or a sequence of arrays (tensors or
    NumPy), hashed in order, each by its dtype, shape and C-order bytes (names are not hashed, so a model
    sent as Flower's legacy ``Parameters`` and the same model by name have one digest)."""
    values = arrays.values() if isinstance(arrays, dict) else arrays
    h = hashlib.sha256()
    for a in values:
        a = np.ascontiguousarray(a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a))
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` of ``arrays``, written entry by entry (``np.savez(file, **arrays)`` fails on an
    array named ``file``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
                raise ValueError(f"array name {name!r}: must be a non-empty string without '/' and not start with '.'")
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(a), allow_pickle=False)
    return buf.getvalue()


class TranscriptWriter:
    """Appends to a transcript directory (see the module docstring for the format).

    Raises ``ValueError`` if ``path`` exists and is not an empty directory (a transcript is never
    overwritten silently).
    """

    def __init__(self, path, param_names, meta: dict | None = None):
        self.path = Path(path)
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise ValueError(f"path {self.path} exists and is not an empty directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self.index = {"format": FORMAT, "version": VERSION, "param_names": list(param_names),
                      "meta": dict(meta or {}), "globals": [], "messages": [], "sent": []}
        self._encoded: dict = {}       # {"globals" / "messages" / "sent": (encoded entries, the list they encode)}
        self._global_of_digest: dict[str, int] = {}
        #: the round the server is in (set by the recorder; :meth:`add_sent` files a message under it)
        self.round = 0
        self.flush()

    def _write(self, name: str, arrays: dict) -> str:
        data = _npz_bytes(_to_numpy(arrays))
        atomic_write_bytes(self.path / name, data)
        return hashlib.sha256(data).hexdigest()

    def add_global(self, round: int, params: dict) -> None:
        """Store the global model after ``round`` (arrays: ``{name: array}``). Storing the same model for a
        round again does nothing; a different one raises ``ValueError``."""
        digest = model_digest(_to_numpy(params))
        known = [g for g in self.index["globals"] if g["round"] == round]
        if known:
            if known[0]["digest"] != digest:
                raise ValueError(f"the transcript already holds a different global model of round {round}")
            return
        name = f"global_{round:03d}.npz"
        sha = self._write(name, params)
        self.index["globals"].append({"round": int(round), "file": name, "sha256": sha, "digest": digest})
        self._global_of_digest.setdefault(digest, int(round))

    def add_sent(self, kind: str, node_id: int, *, params: dict | list | None = None, config: dict | None = None,
                 round: int | None = None) -> None:
        """Record one message the server sent to ``node_id`` in ``round`` (default :attr:`round`): the model it
        carried (``params``: ``{name: array}`` or arrays in ``param_names`` order; ``None``: none) and its small
        ``config`` values (ints, floats, strings, bools and lists of ints; anything else is left out).
        A model that is none of the stored global models is written to its own file."""
        round = self.round if round is None else int(round)
        entry = {"round": round, "kind": str(kind), "node_id": int(node_id), "digest": None, "global": None,
                 "file": None, "sha256": None, "config": {}}
        for k, v in (config or {}).items():
            if isinstance(v, (bool, int, float, str)) and not (isinstance(v, str) and len(v) > 200):
                entry["config"][str(k)] = v
            elif isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                entry["config"][str(k)] = [int(x) for x in v]
        if params is not None:
            arrays = params if isinstance(params, dict) else dict(zip(self.index["param_names"], params))
            if len(arrays) != len(self.index["param_names"]) or (not isinstance(params, dict) and
                                                                  len(params) != len(arrays)):
                raise ValueError(f"params: the server sent {len(params)} arrays, the model has "
                                 f"{len(self.index['param_names'])}")
            entry["digest"] = model_digest(_to_numpy(arrays))
            entry["global"] = self._global_of_digest.get(entry["digest"])
            if entry["global"] is None:
                same = sum(1 for m in self.index["sent"] if (m["round"], m["kind"], m["node_id"]) ==
                           (round, entry["kind"], entry["node_id"]))
                entry["file"] = f"sent_{kind}_r{round:03d}_n{int(node_id)}" + (f"_{same}" if same else "") + ".npz"
                entry["sha256"] = self._write(entry["file"], arrays)
        self.index["sent"].append(entry)

    def add_reply(self, round: int, kind: str, node_id: int, *, params: dict | None = None,
                  metrics: dict | None = None, partition_id: int | None = None,
                  num_examples: int | None = None, error: str | None = None) -> None:
        """Store one reply message.

        Raises ``ValueError`` for a second reply of the same ``(round, kind, node_id)`` (it would overwrite
        the first one's file)."""
        if any(m["round"] == round and m["kind"] == kind and m["node_id"] == node_id for m in self.index["messages"]):
            raise ValueError(f"the transcript already holds a {kind!r} reply of node {node_id} in round {round}")
        name = sha = None
        if params:
            name = f"{kind}_r{round:03d}_n{node_id}.npz"
            sha = self._write(name, params)
        self.index["messages"].append({
            "round": int(round), "kind": kind, "node_id": int(node_id),
            "partition_id": None if partition_id is None else int(partition_id),
            "num_examples": None if num_examples is None else int(num_examples),
            "metrics": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in (metrics or {}).items()},
            "file": name, "sha256": sha, "error": error})

    def flush(self) -> None:
        """Rewrite ``index.json`` atomically."""
        atomic_write_bytes(self.path / "index.json", self._dumps().encode())

    def _dumps(self) -> str:
        """``json.dumps(self.index, indent=1)``, with each entry of ``globals`` and ``messages`` encoded once.

        The index is rewritten after every round and those lists only grow, so encoding all of it each time
        cost time quadratic in the rounds (most of a small federation's run). The text is the same string
        (``tests/test_flower.py`` compares it with ``json.dumps``): every entry is encoded on its own with
        ``indent=1`` and shifted to its depth, as the encoder nests it."""
        cache = self._encoded
        parts = []
        for key, value in self.index.items():
            if key in ("globals", "messages", "sent") and isinstance(value, list) and value:
                done = cache.get(key)
                if done is None or done[1] is not value or len(done[0]) > len(value):
                    done = cache[key] = ([], value)
                for entry in value[len(done[0]):]:
                    done[0].append(json.dumps(entry, indent=1).replace("\n", "\n  "))
                text = "[\n  " + ",\n  ".join(done[0]) + "\n ]"
            else:
                text = json.dumps(value, indent=1).replace("\n", "\n ")
            parts.append(json.dumps(key) + ": " + text)
        return "{\n " + ",\n ".join(parts) + "\n}" if parts else "{}"


def _load_npz(path: Path, sha256: str | None, max_array_bytes: int, what: str) -> dict:
    """The arrays of one ``.npz``, after checking the file against ``sha256`` (when the index gives one) and
    every array's declared size against ``max_array_bytes`` (before anything is read into memory)."""
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{what}: file {path.name} does not match its SHA-256 in the index (changed or damaged)")
    out = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"{what}: file {path.name} holds {info.filename!r}, not an array")
                if info.file_size > max_array_bytes + 4096:
                    raise ValueError(f"{what}: array {info.filename!r} of {path.name} is {info.file_size} bytes, over "
                                     f"max_array_bytes={max_array_bytes}")
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version not in ((1, 0), (2, 0)):
                        raise ValueError(f"{what}: array {info.filename!r} of {path.name} has .npy version {version}")
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read_header(fh)
                    if dtype.hasobject:
                        raise ValueError(f"{what}: array {info.filename!r} of {path.name} holds Python objects")
                    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if size > max_array_bytes:
                        raise ValueError(f"{what}: array {info.filename!r} of {path.name} declares {size} bytes, "
                                         f"over max_array_bytes={max_array_bytes}")
                    raw = fh.read(size + 1)
                if len(raw) != size:
                    raise ValueError(f"{what}: array {info.filename!r} of {path.name} is truncated or too long")
                arr = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                out[info.filename[:-4]] = torch.from_numpy(arr.copy())
    except zipfile.BadZipFile as err:
        raise ValueError(f"{what}: file {path.name} is not a valid .npz ({err})") from err
    return out


def _confined(path: Path, name, what: str) -> Path:
    """``path / name`` for a plain ``.npz`` file name inside the transcript directory; anything else (an
    absolute path, ``..``, a sub-directory, a link leading out) raises ``ValueError`` naming the entry."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name.startswith(".."):
        raise ValueError(f"{what}: file {name!r} is not a plain .npz file name inside the transcript directory")
    full = path / name
    if full.resolve().parent != path.resolve():
        raise ValueError(f"{what}: file {name!r} leads outside the transcript directory {path}")
    return full


def load_transcript(path, *, max_array_bytes: int = MAX_ARRAY_BYTES) -> Transcript:
    """Read a transcript directory written by :class:`fedlab.flower.Recorder` (version 2, or version 1).

    Only files inside ``path`` are read: every file the index names must be a plain ``.npz`` file name. In
    a version 2 transcript each file must match its SHA-256 in the index; in any version no array may declare
    more than ``max_array_bytes`` bytes (checked before it is read).

    Raises
    ------
    ValueError
        If ``path`` holds no ``index.json``, the index is not a fedlab transcript of a known version, it
        names a file outside the directory (absolute, ``..``, a sub-directory or a link out), or it holds a
        round's global model or a ``(round, kind, node_id)`` reply twice, or two entries share a file; if a
        file does not match its SHA-256 (version 2), an array is larger than ``max_array_bytes``, or a file is
        not a plain ``.npz`` of arrays.
    """
    path = Path(path)
    if isinstance(max_array_bytes, bool) or not isinstance(max_array_bytes, int) or max_array_bytes < 1:
        raise ValueError(f"max_array_bytes must be a positive integer, got {max_array_bytes!r}")
    index_file = path / "index.json"
    if not index_file.is_file():
        raise ValueError(f"path {path} holds no transcript (no index.json)")
    index = json.loads(index_file.read_text())
    version = index.get("version")
    if index.get("format") != FORMAT or version not in READABLE_VERSIONS:
        raise ValueError(f"path {path}: not a {FORMAT} index of version {' or '.join(map(str, READABLE_VERSIONS))} "
                         f"(format={index.get('format')!r}, version={version!r})")
    names = index["param_names"]
    v2 = version >= 2

    def sha(entry, what):
        if not v2:
            return None
        value = entry.get("sha256")
        if not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value)):
            raise ValueError(f"path {path}: {what} names no SHA-256 of its file (version 2 needs one)")
        return value

    def load(entry, what):
        return ordered(_load_npz(_confined(path, entry["file"], what), sha(entry, what), max_array_bytes, what))

    def ordered(d):
        return {k: d[k] for k in names if k in d}

    rounds = [int(g["round"]) for g in index["globals"]]
    if len(set(rounds)) != len(rounds):
        raise ValueError(f"path {path}: the index lists a round's global model twice (rounds {rounds})")
    keys = [(m["round"], m["kind"], m["node_id"]) for m in index["messages"]]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"path {path}: the index lists replies twice (round, kind, node): {twice[:3]}")
    sent_entries = index.get("sent", []) if v2 else []
    files = ([g["file"] for g in index["globals"]] + [m["file"] for m in index["messages"] if m["file"]]
             + [m["file"] for m in sent_entries if m.get("file")])
    if len(set(files)) != len(files):
        raise ValueError(f"path {path}: two index entries name the same file")
    globals_ = {int(g["round"]): load(g, f"global model of round {g['round']}") for g in index["globals"]}
    replies = [Reply(m["round"], m["kind"], m["node_id"], m["partition_id"], m["num_examples"], m["metrics"],
                     load(m, f"reply {i}") if m["file"] else {}, m["error"])
               for i, m in enumerate(index["messages"])]
    sent = []
    for i, m in enumerate(sent_entries):
        g = m.get("global")
        if g is not None and int(g) not in globals_:
            raise ValueError(f"path {path}: sent message {i} names the global model of round {g}, which is not stored")
        params = load(m, f"sent message {i}") if m.get("file") else (globals_[int(g)] if g is not None else {})
        sent.append(Sent(int(m["round"]), str(m["kind"]), int(m["node_id"]), m.get("digest"),
                         None if g is None else int(g), params, dict(m.get("config") or {})))
    return Transcript(path, names, index["meta"], globals_, replies, sent, int(version))
