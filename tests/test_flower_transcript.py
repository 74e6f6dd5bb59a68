"""Transcript version 2 (issue 33 item 6): SHA-256 of every file, what the server sent, a size limit per array,
any array name, duplicates refused, version 1 still read. Pure NumPy/torch: no Flower needed."""
import io
import json
import zipfile

import numpy as np
import pytest
import torch

from fedlab.fl import LocalTraining
from fedlab.flower.transcript import TranscriptWriter, load_transcript, model_digest


def _write(path, **kw):
    w = TranscriptWriter(path, ["a", "file"], {"lr": 0.1})
    g0 = {"a": np.zeros(3, dtype=np.float32), "file": np.ones(2, dtype=np.float32)}
    w.add_global(0, g0)
    w.round = 1
    w.add_sent("train", 7, params=g0, config={"lr": 0.1, "rng-state": b"\x00" * 8, "ids": [1, 2], "x": {"no": 1}})
    w.add_sent("train", 8, params=[np.full(3, 9.0, dtype=np.float32), np.ones(2, dtype=np.float32)])  # a decoy
    w.add_sent("query", 8)
    w.add_reply(1, "train", 7, params={"a": np.ones(3, dtype=np.float32), "file": np.zeros(2, dtype=np.float32)},
                metrics={"num-examples": 3}, partition_id=0, num_examples=3)
    w.add_global(1, {"a": np.full(3, 0.5, dtype=np.float32), "file": np.ones(2, dtype=np.float32)})
    w.flush()
    return w


def test_version_2_records_what_was_sent_with_hashes(tmp_path):
    _write(tmp_path / "t")
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert index["version"] == 2
    assert all(len(e["sha256"]) == 64 for e in index["globals"] + index["messages"])
    T = load_transcript(tmp_path / "t")
    assert T.version == 2 and [s.node_id for s in T.sent] == [7, 8, 8]
    honest, decoy, query = T.sent
    assert honest.global_round == 0 and honest.params is T.globals[0] and honest.digest == model_digest(T.globals[0])
    assert honest.config == {"lr": 0.1, "ids": [1, 2]}           # bytes and nested values left out
    assert decoy.global_round is None and torch.equal(decoy.params["a"], torch.full((3,), 9.0))
    assert query.digest is None and query.params == {}
    assert T.models_sent(1) == {7: honest.digest, 8: decoy.digest} and T.inconsistent_rounds() == [1]
    # an array named "file" (np.savez(file, **arrays) raised TypeError on it) round-trips
    assert torch.equal(T.replies[0].params["file"], torch.zeros(2))
    # a digest hashes dtype, shape and bytes in order, not names
    assert model_digest({"x": np.zeros(3, np.float32)}) == model_digest([torch.zeros(3)])
    assert model_digest([np.zeros(3, np.float32)]) != model_digest([np.zeros(3, np.float64)])
    assert model_digest([np.zeros((3, 1), np.float32)]) != model_digest([np.zeros(3, np.float32)])


def test_a_changed_file_or_a_missing_hash_is_refused(tmp_path):
    _write(tmp_path / "t")
    f = tmp_path / "t" / "train_r001_n7.npz"
    data = bytearray(f.read_bytes())
    data[-30] ^= 1                                   # one bit of the reply's arrays
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="reply 0: file train_r001_n7.npz does not match its SHA-256"):
        load_transcript(tmp_path / "t")
    _write(tmp_path / "u")
    index = json.loads((tmp_path / "u" / "index.json").read_text())
    del index["globals"][1]["sha256"]
    (tmp_path / "u" / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="global model of round 1 names no SHA-256"):
        load_transcript(tmp_path / "u")


def _bomb_npz(shape, dtype="<f8") -> bytes:
    """A .npz whose one array *declares* ``shape`` but holds 16 bytes (a 1.6 MB file once declared 3.4 GB)."""
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        raw = io.BytesIO()
        np.lib.format.write_array_header_1_0(raw, header)
        zf.writestr("a.npy", raw.getvalue() + b"\x00" * 16)
    return buf.getvalue()


def test_an_array_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    _write(tmp_path / "t")
    assert load_transcript(tmp_path / "t", max_array_bytes=12).num_rounds == 1   # the largest array: 12 bytes
    with pytest.raises(ValueError, match="over max_array_bytes=11"):
        load_transcript(tmp_path / "t", max_array_bytes=11)
    # a version 1 transcript has no hashes, so only the limit stands between the reader and a bomb
    d = tmp_path / "v1"
    d.mkdir()
    (d / "global_000.npz").write_bytes(_bomb_npz((2 ** 31,)))
    (d / "index.json").write_text(json.dumps({"format": "fedlab.flower.transcript", "version": 1, "param_names": ["a"],
                                              "meta": {}, "globals": [{"round": 0, "file": "global_000.npz"}],
                                              "messages": []}))
    with pytest.raises(ValueError, match="declares 17179869184 bytes, over max_array_bytes"):
        load_transcript(d)
    (d / "global_000.npz").write_bytes(_bomb_npz((4,)))           # declares 32 bytes, holds 16
    with pytest.raises(ValueError, match="truncated"):
        load_transcript(d)
    (d / "global_000.npz").write_bytes(_bomb_npz((4,), "|O"))
    with pytest.raises(ValueError, match="Python objects"):
        load_transcript(d)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_array_bytes"):
            load_transcript(tmp_path / "t", max_array_bytes=bad)


def test_version_1_is_still_read(tmp_path):
    d = tmp_path / "v1"
    d.mkdir()
    np.savez(d / "global_000.npz", a=np.zeros(2, dtype=np.float32))
    np.savez(d / "train_r001_n4.npz", a=np.ones(2, dtype=np.float32))
    (d / "index.json").write_text(json.dumps({
        "format": "fedlab.flower.transcript", "version": 1, "param_names": ["a"], "meta": {"lr": 0.1},
        "globals": [{"round": 0, "file": "global_000.npz"}],
        "messages": [{"round": 1, "kind": "train", "node_id": 4, "partition_id": 0, "num_examples": 2,
                      "metrics": {}, "file": "train_r001_n4.npz", "error": None}]}))
    T = load_transcript(d)
    assert T.version == 1 and T.sent == [] and torch.equal(T.train_replies(1)[0].params["a"], torch.ones(2))


def test_writer_refuses_a_second_different_global_and_bad_names(tmp_path):
    w = TranscriptWriter(tmp_path / "t", ["a"])
    w.add_global(0, {"a": np.zeros(2, dtype=np.float32)})
    w.add_global(0, {"a": np.zeros(2, dtype=np.float32)})        # the same model again: nothing happens
    with pytest.raises(ValueError, match="different global model of round 0"):
        w.add_global(0, {"a": np.ones(2, dtype=np.float32)})
    with pytest.raises(ValueError, match="params: the server sent 2 arrays, the model has 1"):
        w.add_sent("train", 1, params=[np.zeros(2), np.zeros(2)])
    w2 = TranscriptWriter(tmp_path / "u", ["../x"])
    with pytest.raises(ValueError, match="array name '../x'"):
        w2.add_global(0, {"../x": np.zeros(2)})
    w.flush()
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert len(index["globals"]) == 1 and index["sent"] == []
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "t").iterdir())   # atomic writes leave no temp file


def test_a_flower_run_records_each_nodes_model_as_that_rounds_global(tmp_path):
    pytest.importorskip("flwr", reason="the `flower` extra is needed to run the apps")
    from fedlab import flower, models

    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)) for _ in range(3)]
    res = flower.run(lambda: models.mlp(4, (5,), 3, seed=0), clients, engine=flower.Engine("local"), num_rounds=2, local=LocalTraining(lr=0.1, batch_size=6),
                     seed=0, evaluate_clients=True)
    T = res.transcript
    for t in (1, 2):
        train = [s for s in T.sent if s.round == t and s.kind == "train"]
        assert sorted(s.node_id for s in train) == [1, 2, 3]
        assert all(s.global_round == t - 1 and s.config["server-round"] == t for s in train), train
        assert all(s.global_round == t for s in T.sent if s.round == t and s.kind == "evaluate")
    assert T.inconsistent_rounds() == [] and not any(s.params is not T.globals[s.global_round] for s in T.sent)
