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

from fedlab.fl import fedavg  # noqa: E402
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
    app = deploy.write_app(tmp_path / "app", tmp_path / "tr", num_clients=2, num_rounds=3, lr=0.5, batch_size=16,
                           seed=4, model_seed=3, examples_per_client=30)
    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert config["num-rounds"] == 3 and config["transcript-root"] == str((tmp_path / "tr").resolve())
    server, client = deploy.demo_server_app(), deploy.demo_client_app()
    _run(server, client, 11, {**config, "num-rounds": 2, "lr": 0.1})
    _run(server, client, 12, config)                       # a second run of the same app: a directory of its own
    assert sorted(p.name for p in (tmp_path / "tr").iterdir()) == ["run-11", "run-12"]
    a, b = load_transcript(tmp_path / "tr" / "run-11"), load_transcript(tmp_path / "tr" / "run-12")
    assert (a.num_rounds, a.meta["lr"], b.num_rounds, b.meta["lr"]) == (2, 0.1, 3, 0.5)
    ref = fedavg(deploy.demo_model(seed=3), deploy.demo_clients(2, examples_per_client=30), num_rounds=2, lr=0.1,
                 batch_size=16, seed=4, progress=False)
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
        deploy.write_app(tmp_path / "app2", tmp_path / "tr", num_clients=2, num_rounds=1, batch_size=0)
    with pytest.raises(ValueError, match="already holds"):
        deploy.write_app(app, tmp_path / "tr", num_clients=2, num_rounds=1)
    assert not (tmp_path / "tr").exists()                  # writing and checking an app creates no transcript
