"""What the server of a Flower run saw: the transcript file of :class:`fedlab.flower.Recorder`.

A transcript is a directory (written by the server, read by :func:`load_transcript`; neither needs
``flwr``)::

    <dir>/index.json            the index, rewritten atomically after every round
    <dir>/global_<t>.npz        the global model after round t (t = 0: the initial model)
    <dir>/<kind>_r<t>_n<node>.npz   the arrays of one reply (kind "train"; "evaluate" replies carry none)

``index.json`` holds ``{"format": "fedlab.flower.transcript", "version": 1, "param_names": [...],
"meta": {...}, "globals": [{"round": t, "file": ...}, ...], "messages": [...]}``. Each entry of
``messages`` is one reply the server received, in the order received::

    {"round": t, "kind": "train" | "evaluate", "node_id": <Flower node id>,
     "partition_id": <int or null>, "num_examples": <int or null>,
     "metrics": {name: number or list}, "file": "<npz name>" or null, "error": "<reason>" or null}

Each ``.npz`` maps the parameter names of the model (``param_names``) to float arrays exactly as they
crossed the network (before any server-side clipping or noise). ``meta`` holds the run's settings
(``lr``, ``local_epochs``, ``batch_size``, ``seed``, the DP mode and its parameters, ...).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

__all__ = ["FORMAT", "VERSION", "Reply", "Transcript", "TranscriptWriter", "load_transcript"]

FORMAT = "fedlab.flower.transcript"
VERSION = 1
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
class Transcript:
    """A loaded transcript: ``globals[t]`` is the global parameter dict after round ``t`` (0: the
    initial model), ``replies`` every reply in the order received, ``meta`` the run's settings."""

    path: Path
    param_names: list[str]
    meta: dict
    globals: dict[int, dict]
    replies: list[Reply]

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
                      "meta": dict(meta or {}), "globals": [], "messages": []}
        self._encoded: dict = {}       # {"globals" / "messages": (encoded entries, the list they encode)}
        self.flush()

    def add_global(self, round: int, params: dict) -> None:
        """Store the global model after ``round`` (arrays: ``{name: array}``)."""
        if any(g["round"] == round for g in self.index["globals"]):
            return
        name = f"global_{round:03d}.npz"
        np.savez(self.path / name, **_to_numpy(params))
        self.index["globals"].append({"round": int(round), "file": name})

    def add_reply(self, round: int, kind: str, node_id: int, *, params: dict | None = None,
                  metrics: dict | None = None, partition_id: int | None = None,
                  num_examples: int | None = None, error: str | None = None) -> None:
        """Store one reply message.

        Raises ``ValueError`` for a second reply of the same ``(round, kind, node_id)`` (it would overwrite
        the first one's file)."""
        if any(m["round"] == round and m["kind"] == kind and m["node_id"] == node_id for m in self.index["messages"]):
            raise ValueError(f"the transcript already holds a {kind!r} reply of node {node_id} in round {round}")
        name = None
        if params:
            name = f"{kind}_r{round:03d}_n{node_id}.npz"
            np.savez(self.path / name, **_to_numpy(params))
        self.index["messages"].append({
            "round": int(round), "kind": kind, "node_id": int(node_id),
            "partition_id": None if partition_id is None else int(partition_id),
            "num_examples": None if num_examples is None else int(num_examples),
            "metrics": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in (metrics or {}).items()},
            "file": name, "error": error})

    def flush(self) -> None:
        """Rewrite ``index.json`` atomically."""
        tmp = self.path / "index.json.tmp"
        tmp.write_text(self._dumps())
        os.replace(tmp, self.path / "index.json")

    def _dumps(self) -> str:
        """``json.dumps(self.index, indent=1)``, with each entry of ``globals`` and ``messages`` encoded once.

        The index is rewritten after every round and those lists only grow, so encoding all of it each time
        cost time quadratic in the rounds (most of a small federation's run). The text is the same string
        (``tests/test_flower.py`` compares it with ``json.dumps``): every entry is encoded on its own with
        ``indent=1`` and shifted to its depth, as the encoder nests it."""
        cache = self._encoded
        parts = []
        for key, value in self.index.items():
            if key in ("globals", "messages") and isinstance(value, list) and value:
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


def _load_npz(path: Path) -> dict:
    with np.load(path) as z:
        return {k: torch.from_numpy(z[k].copy()) for k in z.files}


def _confined(path: Path, name, what: str) -> Path:
    """``path / name`` for a plain ``.npz`` file name inside the transcript directory; anything else (an
    absolute path, ``..``, a sub-directory, a link leading out) raises ``ValueError`` naming the entry."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name.startswith(".."):
        raise ValueError(f"{what}: file {name!r} is not a plain .npz file name inside the transcript directory")
    full = path / name
    if full.resolve().parent != path.resolve():
        raise ValueError(f"{what}: file {name!r} leads outside the transcript directory {path}")
    return full


def load_transcript(path) -> Transcript:
    """Read a transcript directory written by :class:`fedlab.flower.Recorder`.

    Only files inside ``path`` are read: every file the index names must be a plain ``.npz`` file name.

    Raises
    ------
    ValueError
        If ``path`` holds no ``index.json``, the index is not a fedlab transcript of a known version, it
        names a file outside the directory (absolute, ``..``, a sub-directory or a link out), or it holds a
        round's global model or a ``(round, kind, node_id)`` reply twice, or two entries share a file.
    """
    path = Path(path)
    index_file = path / "index.json"
    if not index_file.is_file():
        raise ValueError(f"path {path} holds no transcript (no index.json)")
    index = json.loads(index_file.read_text())
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise ValueError(f"path {path}: not a {FORMAT} version {VERSION} index "
                         f"(format={index.get('format')!r}, version={index.get('version')!r})")
    names = index["param_names"]

    def ordered(d):
        return {k: d[k] for k in names if k in d}

    rounds = [int(g["round"]) for g in index["globals"]]
    if len(set(rounds)) != len(rounds):
        raise ValueError(f"path {path}: the index lists a round's global model twice (rounds {rounds})")
    keys = [(m["round"], m["kind"], m["node_id"]) for m in index["messages"]]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"path {path}: the index lists replies twice (round, kind, node): {twice[:3]}")
    files = [g["file"] for g in index["globals"]] + [m["file"] for m in index["messages"] if m["file"]]
    if len(set(files)) != len(files):
        raise ValueError(f"path {path}: two index entries name the same file")
    globals_ = {int(g["round"]): ordered(_load_npz(_confined(path, g["file"], f"global model of round {g['round']}")))
                for g in index["globals"]}
    replies = [Reply(m["round"], m["kind"], m["node_id"], m["partition_id"], m["num_examples"], m["metrics"],
                     ordered(_load_npz(_confined(path, m["file"], f"reply {i}"))) if m["file"] else {}, m["error"])
               for i, m in enumerate(index["messages"])]
    return Transcript(path, names, index["meta"], globals_, replies)
