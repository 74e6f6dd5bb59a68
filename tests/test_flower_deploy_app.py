"""The generated Flower App's ServerApp and ClientApp (fedlab.flower.deploy, issue 33 item 5) run in this
process with fedlab's LocalGrid: settings from the run config, one transcript directory per run, bad run
configs named. The same apps under a real SuperLink: tests/test_flower_deploy.py."""
import sys

import pytest

pytest.importorskip("flwr", reason="the `flower` extra is needed")

from flwr.app import Context, RecordDict  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:                                                    # Flower depends on tomli
    import tomli as tomllib

from fedlab.fl import LocalTraining  # noqa: E402
from fedlab.fl import fedavg  # noqa: E402
from fedlab import flower  # noqa: E402
from fedlab.flower import deploy  # noqa: E402
from fedlab.flower.apps import LocalGrid, _task_identity  # noqa: E402
from fedlab.flower.transcript import load_transcript  # noqa: E402


def _run(server, client, run_id, run_config, num_nodes=2):
    grid = LocalGrid(client, num_nodes)
    for ctx in grid.contexts.values():
        ctx.run_config = dict(run_config)
    with _task_identity():
        server(grid, Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)))


def test_each_run_reads_its_run_config_and_writes_its_own_transcript(tmp_path):
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=2, num_rounds=3, local=LocalTraining(lr=0.5, batch_size=16), seed=4,
                           demo=deploy.DemoApp(model_seed=3, examples_per_client=30))
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert config["num-rounds"] == 3 and config["transcript-root"] == str((tmp_path / "tr").resolve())
    server, client = deploy.demo_server_app(), deploy.demo_client_app()
    _run(server, client, 11, {**config, "num-rounds": 2, "lr": 0.1})
    _run(server, client, 12, config)                       # a second run of the same app: a directory of its own
    assert sorted(p.name for p in (tmp_path / "tr").iterdir()) == ["run-11", "run-12"]
    a, b = load_transcript(tmp_path / "tr" / "run-11"), load_transcript(tmp_path / "tr" / "run-12")
    assert (a.num_rounds, a.meta["lr"], b.num_rounds, b.meta["lr"]) == (2, 0.1, 3, 0.5)
    ref = fedavg(deploy.demo_model(seed=3), deploy.demo_clients(2, examples_per_client=30), num_rounds=2, local=LocalTraining(lr=0.1, batch_size=16),
                 seed=4)
    assert max(float((ref.params[k] - a.final_params[k]).abs().max()) for k in ref.params) <= 1e-6


def test_bad_run_configs_are_named(tmp_path):
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=2, num_rounds=1)
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for bad, match in [({"num-rounds": 1.5}, "num-rounds must be int"), ({"lr": "fast"}, "lr must be float"),
                       ({"dp": "local"}, "dp must be"), ({"rounds": 2}, r"unknown keys \['rounds'\]")]:
        with pytest.raises(ValueError, match=match):
            deploy.run_settings({**config, **bad})
    with pytest.raises(ValueError, match=r"missing keys \['lr'\]"):
        deploy.run_settings({k: v for k, v in config.items() if k != "lr"})
    with pytest.raises(ValueError, match="batch_size"):
        deploy.write_app(tmp_path / "app2", tmp_path / "tr", num_clients=2, num_rounds=1, local=LocalTraining(batch_size=0))
    with pytest.raises(ValueError, match="already holds"):
        deploy.write_app(app, tmp_path / "tr", num_clients=2, num_rounds=1)
    with pytest.raises(ValueError, match="DemoApp.examples_per_client"):
        deploy.DemoApp(examples_per_client=0)
    with pytest.raises(ValueError, match="demo must be"):
        deploy.write_app(tmp_path / "app3", tmp_path / "tr", num_clients=2, num_rounds=1, demo={"hidden": 8})
    assert not (tmp_path / "tr").exists()                  # writing and checking an app creates no transcript


def _secagg_run(app, config, node_configs, run_id=21):
    """The generated apps over a LocalGrid whose nodes carry ``node_configs[k]`` on top of their partition."""
    server, client = deploy.demo_server_app(), deploy.demo_client_app()
    grid = LocalGrid(client, len(node_configs))
    for k, ctx in enumerate(grid.contexts.values()):
        ctx.run_config = dict(config)
        ctx.node_config = {**ctx.node_config, **node_configs[k]}
    with _task_identity():
        server(grid, Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(config)))


def _key_config(keys, k, signing_of=None):
    signing = keys["signing"][k if signing_of is None else signing_of]
    return {"signing-key": str(signing), "verification-keys": str(keys["verification"])}


def test_secagg_with_the_consistency_round_from_the_run_and_node_configs(tmp_path):
    """SecAgg+ with the consistency round, as a SuperNode runs it: each node holds its own signing key and the
    public registry (node config), the server none. The aggregate is FedAvg's within SecAgg's rounding; the
    transcript shows the consistency round."""
    from fedlab.flower.attacks import secagg_error_bound
    from fedlab.flower.apps import CONSISTENCY_KIND

    keys = deploy.write_consistency_keys(tmp_path / "keys", 3)
    assert oct(keys["signing"][0].stat().st_mode & 0o777) == "0o600"
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=3, num_rounds=1, local=LocalTraining(lr=0.1, batch_size=16), seed=4,
                           demo=deploy.DemoApp(model_seed=3, examples_per_client=30),
                           aggregation=flower.SecAgg(consistency=True))
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert (config["secagg"], config["consistency"]) == (True, True)
    _secagg_run(app, config, [_key_config(keys, k) for k in range(3)])
    T = load_transcript(tmp_path / "tr" / "run-21")
    assert T.meta["secagg"] and T.meta["consistency"]
    assert sorted(s.node_id for s in T.sent if s.kind == CONSISTENCY_KIND) == [1, 2, 3]     # transcript kind
    assert sorted(r.node_id for r in T.replies if r.kind == CONSISTENCY_KIND) == [1, 2, 3]
    assert not [r for r in T.replies if r.error is not None]
    ref = fedavg(deploy.demo_model(seed=3), deploy.demo_clients(3, examples_per_client=30), num_rounds=1, local=LocalTraining(lr=0.1, batch_size=16),
                 seed=4)
    diff = max(float((ref.params[k] - T.globals[1][k]).abs().max()) for k in ref.params)
    assert diff <= secagg_error_bound(T, 1) + 1e-6, diff


def test_nodes_refuse_a_wrong_key_and_a_secagg_run_without_the_consistency_round(tmp_path):
    """A node given another node's signing key refuses to take part (no share leaves it); nodes holding keys
    refuse a SecAgg+ run whose server leaves the consistency round out (SecAggAborted); a run asking for the
    round on nodes without keys is refused too. Each stops the run with an error naming why, never silently."""
    from fedlab.flower.secagg import ConsistencyKeys, SecAggAborted

    keys = deploy.write_consistency_keys(tmp_path / "keys", 2)
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=2, num_rounds=1, local=LocalTraining(batch_size=16),
                           demo=deploy.DemoApp(examples_per_client=20), aggregation=flower.SecAgg(consistency=True))
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    with pytest.raises(ValueError, match="is not partition 0's key: its public key is partition 1's"):
        ConsistencyKeys.for_node(keys["verification"], keys["signing"][1], partition=0)
    with pytest.raises(RuntimeError, match="is not partition 0's key"):      # refused at the first message
        _secagg_run(app, config, [_key_config(keys, 0, signing_of=1), _key_config(keys, 1)], run_id=1)
    with pytest.raises(SecAggAborted, match="without a consistency round|carry no valid signature"):
        _secagg_run(app, {**config, "consistency": False}, [_key_config(keys, k) for k in range(2)], run_id=2)
    with pytest.raises(RuntimeError, match="names no signing-key"):
        _secagg_run(app, config, [{}, {}], run_id=3)
    with pytest.raises(ValueError, match="signing-key and verification-keys go together"):
        deploy.node_consistency_keys({"partition-id": 0, "signing-key": str(keys["signing"][0])})
    (tmp_path / "bad.json").write_text('{"format": "other", "keys": {}}')
    with pytest.raises(ValueError, match="not a fedlab consistency-key registry"):
        ConsistencyKeys.for_node(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="consistency=true needs secagg=true"):
        deploy.run_settings({**config, "secagg": False})
    with pytest.raises(ValueError, match="secagg-threshold"):
        deploy.write_app(tmp_path / "app8", tmp_path / "tr", num_clients=8, num_rounds=1,   # t = 4 of 8: the nodes
                         aggregation=flower.SecAgg(reconstruction_threshold=0.5, consistency=True))   # would refuse it
    with pytest.raises(ValueError, match="carries only SecAgg's"):
        deploy.write_app(tmp_path / "app9", tmp_path / "tr", num_clients=2, num_rounds=1,
                         aggregation=flower.SecAgg(clipping_range=1.0))
    with pytest.raises(ValueError, match="secagg=true cannot be combined with dp"):
        deploy.run_settings({**config, "dp": "server"})
    with pytest.raises(ValueError, match="num_nodes"):
        deploy.write_consistency_keys(tmp_path / "k1", 1)


def test_secagg_only_nodes_refuse_a_plain_run(tmp_path):
    """The server writes the run config, so a server that wants every model asks for plain FedAvg
    (secagg=false): a node holding a signing key, or told require-secagg=true by its own node config, answers
    with an error and sends no model (the run stops with the node's reason); require-secagg=false in the
    node's own config lifts it."""
    keys = deploy.write_consistency_keys(tmp_path / "keys", 2)
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=2, num_rounds=1, local=LocalTraining(batch_size=16),
                           demo=deploy.DemoApp(examples_per_client=20), aggregation=flower.SecAgg(consistency=True))
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    plain = {**config, "secagg": False, "consistency": False}
    with pytest.raises(RuntimeError, match="requires SecAgg\\+"):
        _secagg_run(app, plain, [_key_config(keys, k) for k in range(2)], run_id=31)
    with pytest.raises(RuntimeError, match="requires SecAgg\\+"):
        _secagg_run(app, plain, [{"require-secagg": True}, {}], run_id=32)
    _secagg_run(app, plain, [{**_key_config(keys, k), "require-secagg": False} for k in range(2)], run_id=33)
    assert load_transcript(tmp_path / "tr" / "run-33").num_rounds == 1          # the node's owner lifted it
    assert deploy.node_requires_secagg({}) is False and deploy.node_requires_secagg(_key_config(keys, 0)) is True
    with pytest.raises(ValueError, match="require-secagg must be true or false"):
        deploy.node_requires_secagg({"require-secagg": "yes"})


def test_what_a_node_signs_holds_flowers_64_bit_node_ids():
    """A deployment's node ids are unsigned 64-bit; half are >= 2^63. The signed survivor set must encode them
    (an 8-byte signed field raised struct.error in the setup stage on real SuperNodes) and keep them apart."""
    from fedlab.flower.secagg import _pack

    big = [2 ** 64 - 1, 2 ** 63, 2 ** 63 - 1, 1]
    assert len({_pack("survivors", "1", j, big) for j in big}) == 4
    assert _pack("x", [2 ** 63]) != _pack("x", [-(2 ** 63)]) and _pack("x", 1, 2) != _pack("x", [1, 2])
