"""fedlab on Flower (issue 23): the Flower apps give fedlab's FedAvg, the recorder's transcript holds what
the server received, Flower's DP wrappers act on it as documented, the apps (SecAgg+ too) run in the simulation
engine (Ray); deployment mode is tests/test_flower_deploy.py.

Needs the ``flower`` extra (``pip install ".[flower]"``); without ``flwr`` every test here is skipped.
"""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]', "
                                   "flwr[simulation]>=1.41) is needed for tests/test_flower.py")

from fedlab.fl import LocalTraining  # noqa: E402
from fedlab import flower  # noqa: E402
from fedlab.fl import fedavg  # noqa: E402
from fedlab.flower import deploy  # noqa: E402
from fedlab.flower.transcript import TranscriptWriter, load_transcript  # noqa: E402
from fedlab.models import flatten_params  # noqa: E402

TOL = 1e-6   # float32 rounding: vmap (fedlab) vs one client at a time (Flower), and numpy's aggregation


def _clients(K, base=40, step=10):
    """K digit partitions of unequal sizes base, base + step, ..."""
    return [type(c)(c.X[:base + step * k], c.y[:base + step * k]) for k, c in enumerate(deploy.demo_clients(K, seed=1))]


def _model_fn():
    return deploy.demo_model(seed=3, hidden=16)


def _maxdiff(a, b):
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def _delta_norm(p, g):
    return float(flatten_params({k: p[k].detach() - g[k].detach() for k in p}).norm())


def _weighted(replies):
    n = torch.tensor([float(r.num_examples) for r in replies])
    w = n / n.sum()
    return {k: sum(wi * r.params[k] for wi, r in zip(w, replies)) for k in replies[0].params}


@pytest.mark.parametrize("local", [LocalTraining(batch_size=8), LocalTraining(batch_size=None),
                                   LocalTraining(local_epochs=3, batch_size=16), LocalTraining(batch_size=16, local_steps=5),
                                   LocalTraining(batch_size=45, local_steps=3), LocalTraining(batch_size=8, weight_decay=0.1)])
def test_local_engine_gives_fedavg_with_client_sampling(local):
    """The same apps over LocalGrid (no Ray): C = 0.5 of 4 clients, fedavg's sampling is replayed."""
    clients = _clients(4)
    kw = dict(num_rounds=3, local=local, seed=7, client_fraction=0.5)
    sent = []
    ref = fedavg(_model_fn(), clients, callback=sent.append, **kw)
    res = flower.run(_model_fn, clients, engine=flower.Engine("local"), **kw)
    assert _maxdiff(ref.params, res.params) <= TOL
    for t, rec in enumerate(sent, start=1):
        assert [r.partition_id for r in res.transcript.train_replies(t)] == rec.selected.tolist()


def test_client_app_reuses_a_model_only_when_that_changes_nothing():
    """The ClientApp builds a seeded, buffer-free model once; a model_fn that draws from torch's global stream
    (or a model with buffers) is still called for every message, and both runs give the same models."""
    clients, kw = _clients(3), dict(num_rounds=2, local=LocalTraining(lr=0.1, batch_size=8), seed=7, engine=flower.Engine("local"))
    calls = {"seeded": 0, "unseeded": 0, "buffers": 0}

    def seeded():
        calls["seeded"] += 1
        return _model_fn()

    def unseeded():      # the same initial weights, and one draw from the global stream as a side effect
        calls["unseeded"] += 1
        torch.rand(1)
        return _model_fn()

    def with_buffer():
        calls["buffers"] += 1
        m = _model_fn()
        m.register_buffer("counter", torch.zeros(1))
        return m

    a, b, c = (flower.run(f, clients, **kw) for f in (seeded, unseeded, with_buffer))
    messages = len(a.transcript.train_replies())
    assert calls["unseeded"] > messages and calls["buffers"] > messages and calls["seeded"] < messages
    assert _maxdiff(a.params, b.params) == 0 and _maxdiff(a.params, c.params) == 0


def test_schedule_replays_fedavg_sampling_and_validates():
    sched = flower.fedavg_schedule([5, 7, 9, 11, 13], num_rounds=4, client_fraction=0.4, seed=2)
    sent = []
    fedavg(_model_fn(), _clients(5, base=5, step=2), num_rounds=4, client_fraction=0.4, seed=2, callback=sent.append, local=LocalTraining(batch_size=4))
    assert [[k for k, _ in r] for r in sched] == [rec.selected.tolist() for rec in sent]
    for bad in (dict(sizes=[]), dict(sizes=[3, 0]), dict(client_fraction=0.0), dict(num_rounds=-1)):
        args = dict(sizes=[3, 4], num_rounds=1) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            flower.fedavg_schedule(args.pop("sizes"), **args)


def test_client_side_clipping_clips_what_the_server_receives():
    """DifferentialPrivacyClientSideFixedClipping + fixedclipping_mod: every recorded update has norm <= C;
    with noise 0 the next global model is the weighted average of the recorded (clipped) replies."""
    C = 0.05
    res = flower.run(_model_fn, _clients(3), engine=flower.Engine("local"), num_rounds=2, local=LocalTraining(lr=0.1, batch_size=16), seed=1,
                     aggregation=flower.FixedClippingDP("client", noise_multiplier=0.0, clipping_norm=C))
    T = res.transcript
    norms = [_delta_norm(r.params, T.globals[r.round - 1]) for r in T.train_replies()]
    assert max(norms) <= C * (1 + 1e-5) and min(norms) > 0.9 * C, norms   # clipped (unclipped ones are ~0.27)
    for t in (1, 2):
        assert _maxdiff(_weighted(T.train_replies(t)), T.globals[t]) <= TOL


def test_server_side_clipping_records_raw_updates_and_adds_the_documented_noise():
    """DifferentialPrivacyServerSideFixedClipping: the recorder sees the raw updates (norm > C); the server
    clips them, averages and adds N(0, (z C / m)^2) per coordinate (Flower's compute_stdv)."""
    C, m = 0.05, 3
    clients = _clients(m)
    quiet = flower.run(_model_fn, clients, engine=flower.Engine("local"), num_rounds=1, local=LocalTraining(lr=0.1, batch_size=16), seed=1,
                       aggregation=flower.FixedClippingDP("server", noise_multiplier=0.0, clipping_norm=C))
    T = quiet.transcript
    replies = T.train_replies(1)
    g0 = T.globals[0]
    assert min(_delta_norm(r.params, g0) for r in replies) > 2 * C
    clipped = []
    for r in replies:
        scale = min(1.0, C / _delta_norm(r.params, g0))
        clipped.append(type(r)(**{**r.__dict__, "params": {k: g0[k] + scale * (r.params[k] - g0[k]) for k in g0}}))
    assert _maxdiff(_weighted(clipped), T.globals[1]) <= TOL
    z = 2.0
    noisy = flower.run(_model_fn, clients, engine=flower.Engine("local"), num_rounds=1, local=LocalTraining(lr=0.1, batch_size=16), seed=1,
                       aggregation=flower.FixedClippingDP("server", noise_multiplier=z, clipping_norm=C))
    noise = flatten_params(noisy.params) - flatten_params(T.globals[1])
    assert abs(float(noise.std()) / (z * C / m) - 1) < 0.1, (float(noise.std()), z * C / m)   # d = 1210 draws


def test_transcript_format_and_errors(tmp_path):
    w = TranscriptWriter(tmp_path / "t", ["a"], {"lr": 0.1})
    w.add_global(0, {"a": np.zeros(2, dtype=np.float32)})
    w.add_reply(1, "train", 42, params={"a": np.ones(2, dtype=np.float32)}, metrics={"num-examples": 3},
                partition_id=0, num_examples=3)
    w.add_reply(1, "train", 43, error="boom")
    w.add_global(1, {"a": np.full(2, 0.5, dtype=np.float32)})
    w.flush()
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert index["format"] == "fedlab.flower.transcript" and index["version"] == 2
    T = load_transcript(tmp_path / "t")
    assert T.num_rounds == 1 and T.meta == {"lr": 0.1}
    assert [r.node_id for r in T.train_replies()] == [42] and T.replies[1].error == "boom"
    assert torch.equal(T.final_params["a"], torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="path"):
        TranscriptWriter(tmp_path / "t", ["a"])
    with pytest.raises(ValueError, match="no transcript"):
        load_transcript(tmp_path / "missing")
    index["version"] = 99
    (tmp_path / "t" / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="version"):
        load_transcript(tmp_path / "t")


def test_index_json_is_the_text_json_dumps_gives(tmp_path):
    """The writer encodes each entry of the index once; the file must still be json.dumps(index, indent=1),
    byte for byte, after every flush (empty lists, nested metrics, an error with a line break, unicode)."""
    w = TranscriptWriter(tmp_path / "t", ["a", "b"], {"lr": 0.1, "sizes": [3, 4], "dp": None, "name": "σ"})
    text = lambda: (tmp_path / "t" / "index.json").read_text()   # noqa: E731
    assert text() == json.dumps(w.index, indent=1)
    for t in range(3):
        w.add_global(t, {"a": np.zeros(2, dtype=np.float32), "b": np.ones(1, dtype=np.float32)})
        w.add_reply(t + 1, "train", 42, params={"a": np.ones(2, dtype=np.float32), "b": np.zeros(1, dtype=np.float32)},
                    metrics={"num-examples": 3, "train-loss": 0.1 * t, "v": [1.5, 2]}, partition_id=0, num_examples=3)
        w.add_reply(t + 1, "evaluate", 43, metrics={}, error="boom\nagain" if t else None)
        w.flush()
        assert text() == json.dumps(w.index, indent=1), t
    assert load_transcript(tmp_path / "t").num_rounds == 2


def test_apps_validate_their_arguments(tmp_path):
    with pytest.raises(ValueError, match="aggregation"):
        flower.server_app(_model_fn, tmp_path, num_clients=2, num_rounds=1, local=LocalTraining(lr=0.1), aggregation="local")
    with pytest.raises(ValueError, match="FixedClippingDP.mode"):
        flower.FixedClippingDP("local")
    with pytest.raises(ValueError, match="FixedClippingDP.clipping_norm"):
        flower.FixedClippingDP("server", clipping_norm=0.0)
    with pytest.raises(ValueError, match="timeouts"):
        flower.server_app(_model_fn, tmp_path, num_clients=2, num_rounds=1, timeouts=300.0)
    with pytest.raises(ValueError, match="Timeouts.node_timeout"):
        flower.Timeouts(node_timeout=0)
    with pytest.raises(ValueError, match="lr"):
        flower.server_app(_model_fn, tmp_path, num_clients=2, num_rounds=1, local=LocalTraining(lr=0.0))
    with pytest.raises(ValueError, match="num_clients"):
        flower.server_app(_model_fn, tmp_path, num_clients=0, num_rounds=1, local=LocalTraining(lr=0.1))
    with pytest.raises(ValueError, match="load_partition"):
        flower.client_app(_model_fn, None)
    with pytest.raises(ValueError, match="Engine.name"):
        flower.run(_model_fn, _clients(2), num_rounds=1, engine=flower.Engine("spark"))
    with pytest.raises(ValueError, match="engine must be a fedlab.flower.Engine"):
        flower.run(_model_fn, _clients(2), num_rounds=1, engine="local")
    with pytest.raises(ValueError, match="Engine.num_cpus"):
        flower.Engine("ray", num_cpus=0)


def test_evaluate_replies_are_recorded_and_a_failing_node_is_named():
    res = flower.run(_model_fn, _clients(2), engine=flower.Engine("local"), num_rounds=2, local=LocalTraining(lr=0.1, batch_size=16), seed=0,
                     evaluate_clients=True)
    ev = [r for r in res.transcript.replies if r.kind == "evaluate"]
    assert [(r.round, r.partition_id) for r in sorted(ev, key=lambda r: (r.round, r.partition_id))] == \
        [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(0 <= r.metrics["accuracy"] <= 1 and r.params == {} for r in ev)

    def broken(pid, num):
        if pid == 1:
            raise OSError("disk gone")
        return _clients(2)[pid]

    app = flower.client_app(_model_fn, broken)
    server = flower.server_app(_model_fn, res.transcript_path.parent / "t2", num_clients=2, num_rounds=1, local=LocalTraining(lr=0.1))
    from fedlab.flower.apps import LocalGrid, _task_identity
    from flwr.app import Context, RecordDict
    with _task_identity(), pytest.raises(RuntimeError, match="disk gone"):
        server(LocalGrid(app, 2), Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}))


def test_transcript_reads_only_its_own_files_and_refuses_duplicates(tmp_path):
    """A transcript index names files inside its directory only (an absolute or ``..`` path once let
    load_transcript read any .npz on the disk), and a reply or global model is never listed twice."""
    outside = tmp_path / "secret.npz"
    np.savez(outside, a=np.full(2, 7.0, dtype=np.float32))
    w = TranscriptWriter(tmp_path / "t", ["a"])
    w.add_global(0, {"a": np.zeros(2, dtype=np.float32)})
    w.add_reply(1, "train", 42, params={"a": np.ones(2, dtype=np.float32)}, partition_id=0, num_examples=1)
    with pytest.raises(ValueError, match="already holds a 'train' reply of node 42 in round 1"):
        w.add_reply(1, "train", 42, params={"a": np.zeros(2, dtype=np.float32)})
    w.add_global(1, {"a": np.full(2, 0.5, dtype=np.float32)})
    w.flush()
    good = json.loads((tmp_path / "t" / "index.json").read_text())
    assert load_transcript(tmp_path / "t").num_rounds == 1

    def load_with(edit):
        index = json.loads(json.dumps(good))
        edit(index)
        (tmp_path / "t" / "index.json").write_text(json.dumps(index))
        return load_transcript(tmp_path / "t")

    for bad in [str(outside), "../secret.npz", "sub/x.npz", "global_000.npy", 3]:
        with pytest.raises(ValueError, match="file"):
            load_with(lambda ix: ix["messages"][0].update(file=bad))
        with pytest.raises(ValueError, match="global model of round 0"):
            load_with(lambda ix: ix["globals"][0].update(file=bad))
    (tmp_path / "t" / "link.npz").symlink_to(outside)
    with pytest.raises(ValueError, match="leads outside"):
        load_with(lambda ix: ix["messages"][0].update(file="link.npz"))
    with pytest.raises(ValueError, match="replies twice"):
        load_with(lambda ix: ix["messages"].append(dict(ix["messages"][0], file=None)))
    with pytest.raises(ValueError, match="global model twice"):
        load_with(lambda ix: ix["globals"].append(dict(ix["globals"][1])))
    with pytest.raises(ValueError, match="same file"):
        load_with(lambda ix: ix["messages"].append(dict(ix["messages"][0], node_id=43)))


# ------------------------------------------------------------------------------------------------
# The Ray engine (fedlab.flower.RayGrid): the two runs share one Ray runtime, and come last in this file
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_ray_runtime():
    """One Ray runtime for this module's Ray-engine runs. ``flower.run`` starts Ray only where it is not
    running and stops what it started after the run (``ray.shutdown``); here the stop waits for the module's end
    (right after the last of these tests, which come last): each start of Ray's own processes (GCS, raylet,
    dashboard, agents, monitors) costs about 8 s of CPU. Each run still starts its own ClientApp actors."""
    import ray

    stop = ray.shutdown
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "shutdown", lambda *args, **kwargs: None)
        yield
    stop()


@pytest.mark.flower
def test_simulation_engine_gives_fedavg_and_records_every_reply(capsys, one_ray_runtime):
    """One FedAvg run with the Ray engine (the ClientApp in Ray workers) and through fedlab.fl.fedavg: same data,
    seed and schedule (all 3 clients every round, E=2, B=16) -> same global model."""
    clients = _clients(3)
    kw = dict(num_rounds=2, local=LocalTraining(lr=0.1, local_epochs=2, batch_size=16), seed=5)
    sent = []
    ref = fedavg(_model_fn(), clients, callback=sent.append, **kw)
    res = flower.run(_model_fn, clients, engine=flower.Engine("ray", num_cpus=2), **kw)   # two workers: contexts move between them
    diff = _maxdiff(ref.params, res.params)
    with capsys.disabled():
        print(f"\n[flower] Ray engine vs fedlab.fl.fedavg: max |difference| = {diff:.3g} "
              f"({res.seconds:.1f} s for the simulation)")
    assert diff <= TOL, diff
    T = res.transcript
    assert T.num_rounds == 2 and T.meta["sizes"] == [40, 50, 60]
    assert _maxdiff(T.globals[0], dict(_model_fn().named_parameters())) == 0.0
    for t, rec in enumerate(sent, start=1):
        replies = T.train_replies(t)
        assert [r.partition_id for r in replies] == [0, 1, 2]
        assert [r.num_examples for r in replies] == [40, 50, 60]
        assert len({r.node_id for r in replies}) == 3
        for j, r in enumerate(replies):      # each client's returned model is the one fedlab computed
            assert _maxdiff(r.params, {k: v[j] for k, v in rec.client_params.items()}) <= TOL
        assert _maxdiff(_weighted(replies), T.globals[t]) <= TOL   # FedAvg of what was recorded


@pytest.mark.flower
def test_secagg_runs_with_the_ray_engine(one_ray_runtime):
    """Flower 1.42's SecAggPlusWorkflow and secaggplus_mod run with the Ray engine offline: the
    recorded stages and the decoded aggregate are those of the in-process engine (within the rounding bound
    of both)."""
    from fedlab.experiments import chapter6 as ex
    from fedlab.flower import attacks as fa

    victims, lenet = ex.fedsgd_clients(1, 3)
    args = dict(num_rounds=1, local=LocalTraining(lr=0.1, local_epochs=1, batch_size=None), seed=1)
    T = flower.run(lenet, victims, engine=flower.Engine("ray", num_cpus=2), aggregation=flower.SecAgg(), **args).transcript   # state in the contexts
    plain = flower.run(lenet, victims, engine=flower.Engine("local"), **args).transcript
    assert sorted(r.kind for r in T.replies) == sorted(["secagg-keys", "secagg-shares", "secagg-masked", "secagg-unmask"] * 3)
    assert T.train_replies() == [] and T.num_rounds == 1
    assert ex.max_abs_difference(T.globals[1], plain.globals[1]) <= fa.secagg_error_bound(T)


def _counting_app(msg, context):
    """A stand-in ClientApp: node 2 fails; every other node counts the messages it got in its context."""
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    if context.node_id == 2:
        raise RuntimeError("boom")
    seen = int(context.state["c"]["n"]) + 1 if "c" in context.state else 1
    context.state["c"] = ConfigRecord({"n": seen})
    return Message(RecordDict({"m": MetricRecord({"node": context.node_id, "seen": seen})}), reply_to=msg)


def test_local_grid_gives_every_pushed_message_an_id_of_its_own():
    """push_messages numbered a batch by the count of replies not yet pulled: after a partial pull a later push
    reused a pending id and overwrote its reply (node 3's reply came back as node 2's)."""
    from flwr.app import Message, MetricRecord, RecordDict

    from fedlab.flower.apps import LocalGrid, _task_identity

    def app(msg, context):
        return Message(RecordDict({"m": MetricRecord({"node": context.node_id})}), reply_to=msg)

    grid = LocalGrid(app, 3)
    with _task_identity():
        make = lambda n: grid.create_message(RecordDict(), "query", n, "g")   # noqa: E731
        a = grid.push_messages([make(1), make(2)])
        grid.pull_messages(a[:1])
        b = grid.push_messages([make(3), make(3)])
        grid.pull_messages([a[1], b[0]])
        c = grid.push_messages([make(1), make(2)])
        assert len(set(a + b + c)) == 6
        assert [int(r.content["m"]["node"]) for r in grid.pull_messages([b[1], *c])] == [3, 1, 2]


@pytest.mark.flower
@pytest.mark.parametrize("grid_kind", ["local", "ray"])
def test_grids_answer_in_order_keep_each_nodes_context_and_turn_failures_into_error_replies(grid_kind, request):
    """LocalGrid and RayGrid (two Ray workers) deliver a batch in order, keep each node's context between
    batches (the count reaches 2 at every healthy node, whichever worker ran it), answer a failing ClientApp and
    an unknown node with an error reply, as Flower does."""
    from flwr.app import Message, RecordDict

    from fedlab.flower.apps import LocalGrid, RayGrid, _start_ray, _task_identity

    if grid_kind == "ray":
        request.getfixturevalue("one_ray_runtime")
        _start_ray({"num_cpus": 2, "num_gpus": 0, "include_dashboard": False, "log_to_driver": False,
                    "logging_level": "ERROR"})
        grid = RayGrid(_counting_app, 4, num_actors=2)
    else:
        grid = LocalGrid(_counting_app, 4)
    try:
        for round_ in (1, 2):
            with _task_identity():      # as flower.run: Flower's messages read the run and node from it
                msgs = [grid.create_message(RecordDict(), "query", node, "g") for node in (1, 2, 3, 4, 9)]
                replies = grid.send_and_receive(msgs)
            assert [r.has_error() for r in replies] == [False, True, False, False, True]
            assert "boom" in replies[1].error.reason and "no node 9" in replies[4].error.reason
            assert [int(replies[i].content["m"]["node"]) for i in (0, 2, 3)] == [1, 3, 4]
            assert [int(replies[i].content["m"]["seen"]) for i in (0, 2, 3)] == [round_] * 3
    finally:
        if grid_kind == "ray":
            grid.close()


@pytest.mark.flower
def test_ray_grid_on_a_runtime_whose_cpus_are_held_starts_what_it_can_instead_of_waiting_for_ever(one_ray_runtime):
    """Ray running with 2 CPUs, one held by another actor: RayGrid(num_actors=2) once created two workers, the second
    never placed, and the first batch sent to it waited for ever (seen: no reply in 60 s). It now starts only the
    worker Ray can place (with a RuntimeWarning), answers in order, and a batch with one node three times counts 1, 2, 3 there."""
    import ray
    from flwr.app import RecordDict

    from fedlab.flower.apps import RayGrid, _start_ray, _task_identity

    _start_ray({"num_cpus": 2, "num_gpus": 0, "include_dashboard": False, "log_to_driver": False,
                "logging_level": "ERROR"})

    @ray.remote(num_cpus=1)
    class Holder:
        def ping(self):
            return 1

    holder = Holder.remote()
    ray.get(holder.ping.remote())
    grid = None
    try:
        with pytest.warns(RuntimeWarning, match="1 free CPU.*in 1 of the 2 workers"):
            grid = RayGrid(_counting_app, 4, num_actors=2)
        assert len(grid._actors) == 1
        with _task_identity():
            msgs = [grid.create_message(RecordDict(), "query", node, "g") for node in (1, 1, 3, 1)]
            replies = grid.send_and_receive(msgs)
        assert [(int(r.content["m"]["node"]), int(r.content["m"]["seen"])) for r in replies] == [(1, 1), (1, 2), (3, 1), (1, 3)]
        with pytest.raises(ValueError, match="start_timeout"):
            RayGrid(_counting_app, 4, start_timeout=0)
    finally:
        if grid is not None:
            grid.close()
        ray.kill(holder)
