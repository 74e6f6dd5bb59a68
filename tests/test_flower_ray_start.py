"""Ray's start-up for the Ray engine (issue 33 item 5): a failed start is retried once with a
warning, a second failure raises RayStartError naming both reasons, before any round. No Ray process starts
here: ray.init is replaced."""
import pytest

pytest.importorskip("flwr", reason="the `flower` extra is needed")
ray = pytest.importorskip("ray", reason="Flower's simulation extra (ray) is needed")

from fedlab.fl import LocalTraining  # noqa: E402
from fedlab.flower import apps  # noqa: E402


def test_a_failed_start_is_retried_once_then_reported(monkeypatch):
    calls, shutdowns = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))

    def init(**kw):
        calls.append(kw)
        if len(calls) == 1:
            raise RuntimeError("raylet died in WaitForDashboardAgentPorts")

    monkeypatch.setattr(ray, "init", init)
    with pytest.warns(RuntimeWarning, match="Ray failed to start .*WaitForDashboardAgentPorts.*trying once more"):
        apps._start_ray({"num_cpus": 1, "include_dashboard": False})
    assert len(calls) == 2 and len(shutdowns) == 1
    assert calls[1]["num_cpus"] == 1 and "PYTHONPATH" in calls[1]["runtime_env"]["env_vars"]

    calls.clear()
    monkeypatch.setattr(ray, "init", lambda **kw: (calls.append(kw), (_ for _ in ()).throw(OSError(f"no {len(calls)}")))[1])
    with pytest.warns(RuntimeWarning), pytest.raises(apps.RayStartError, match=r"2 times \(OSError: no 1; OSError: no 2\)"):
        apps._start_ray({"num_cpus": 1})
    assert len(calls) == 2


def test_a_running_ray_is_used_as_it_is(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("ray.init called although Ray runs"))
    apps._start_ray({"num_cpus": 1})


def test_run_stops_before_any_round_when_ray_cannot_start(monkeypatch, tmp_path):
    import torch
    from fedlab import flower, models

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    clients = [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))] * 2
    with pytest.warns(RuntimeWarning), pytest.raises(flower.RayStartError, match="Engine\\('local'\\) runs the same"):
        flower.run(lambda: models.mlp(3, (2,), 2, seed=0), clients, num_rounds=1, engine=flower.Engine("ray"),
                   transcript_dir=tmp_path / "t")


def test_flower_deprecations_reach_the_user_and_fedlab_itself_calls_none(tmp_path):
    """fedlab.flower.run calls no deprecated Flower entry point (it once called run_simulation, deprecated in
    Flower 1.42): a run shows no FutureWarning or DeprecationWarning. A deprecation Flower logs during a run
    (here a loss function that calls Flower's own ``warn_deprecated_feature``) reaches the caller as a
    FutureWarning; Flower's logger level would otherwise hide nothing, but a notebook shows warnings, not logs."""
    import warnings

    import torch
    from flwr.common.logger import warn_deprecated_feature

    from fedlab import flower, models
    from fedlab.fl import cross_entropy

    clients = [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))] * 2
    model_fn = lambda: models.mlp(3, (2,), 2, seed=0)     # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        flower.run(model_fn, clients, num_rounds=1, engine=flower.Engine("local"), transcript_dir=tmp_path / "a")

    def old_loss(*args, **kwargs):
        warn_deprecated_feature("an old thing")
        return cross_entropy(*args, **kwargs)

    with pytest.warns(FutureWarning, match=r"Flower says: DEPRECATED FEATURE: an old thing.*calls no deprecated"):
        flower.run(model_fn, clients, num_rounds=1, engine=flower.Engine("local"), local=LocalTraining(loss_fn=old_loss), transcript_dir=tmp_path / "b")
