"""FEDLAB_DEVICE (issue 32): parsing, the errors for a device torch cannot use, and the plumbing of the
heavy loops, checked on the CPU.

No GPU runs these tests. The plumbing is checked by running each loop with ``device="cpu"`` while torch's
*default* device is ``meta`` (tensors without data): a tensor that some step creates without following
the ``device`` argument lands on ``meta``, and the run then fails or its numbers differ. Every loop must
instead give, bit for bit, the numbers of the plain CPU run."""
import pytest
import torch

import fedlab
from fedlab import config, fl, models
from fedlab import data as D


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize("raw, want", [(None, "cpu"), ("cpu", "cpu"), (" CPU ", "cpu"), ("", "cpu")])
def test_fedlab_device_values(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("FEDLAB_DEVICE", raising=False)
    else:
        monkeypatch.setenv("FEDLAB_DEVICE", raw)
    assert config.device() == torch.device(want) and fedlab.device() == torch.device(want)


@pytest.mark.parametrize("raw", ["gpu", "cuda:x", "cuda:-1", "cpu:0", "mps:1", "tpu", "cuda0"])
def test_fedlab_device_rejects_unknown_values_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("FEDLAB_DEVICE", raw)
    with pytest.raises(ValueError, match=r"FEDLAB_DEVICE must be 'cpu', 'cuda', 'cuda:N' or 'mps'"):
        config.device()
    with pytest.raises(ValueError, match=r"^device must be"):
        config.device(raw)


def test_a_device_torch_cannot_use_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("FEDLAB_DEVICE", "cuda")
    with pytest.raises(ValueError, match="FEDLAB_DEVICE='cuda': torch finds no CUDA device"):
        config.device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert config.device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"device='cuda:2': there are 2 CUDA device\(s\)"):
        config.device("cuda:2")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="MPS backend is not available"):
        config.device("mps")
    # the loops read it too: a bad FEDLAB_DEVICE stops fedavg before any work
    monkeypatch.setenv("FEDLAB_DEVICE", "gpu")
    with pytest.raises(ValueError, match="FEDLAB_DEVICE"):
        fl.fedavg(models.mlp(3, (), 2, seed=0), [(torch.zeros(2, 3), torch.tensor([0, 1]))], num_rounds=1)


# ------------------------------------------------------------------ plumbing
def _clients(sizes=(6, 5, 7), d=5, C=3):
    g = torch.Generator().manual_seed(0)
    return [D.Dataset(torch.randn(n, d, generator=g), torch.randint(0, C, (n,), generator=g)) for n in sizes]


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a.device.type == "cpu" and torch.equal(a, b)


def _under_meta_default(fn):
    """``fn()`` with torch's default device set to meta: any tensor created without following the
    ``device`` argument has no data."""
    with torch.device("meta"):
        return fn()


@pytest.mark.slow
def test_fedavg_default_equals_fedlab_device_cpu_and_threads_its_device(monkeypatch):
    net = models.mlp(5, (4,), 3, seed=1)
    ev = D.Dataset(torch.randn(9, 5), torch.arange(9) % 3)
    seen, clients = [], _clients()
    run = lambda **kw: fl.fedavg(net, clients, num_rounds=3, client_fraction=0.67, local=fl.LocalTraining(lr=0.3, batch_size=2), # noqa: E731
                                 eval_data=ev, seed=4, **kw)
    monkeypatch.delenv("FEDLAB_DEVICE", raising=False)
    base = run(callback=lambda r: seen.append(r.client_params))
    monkeypatch.setenv("FEDLAB_DEVICE", "cpu")
    env = run()
    explicit = _under_meta_default(lambda: run(device="cpu"))
    for other in (env, explicit):
        assert _same(base.params, other.params) and base.history == other.history
    assert all(v.device.type == "cpu" for rec in seen for v in rec.values())


def test_ifca_threads_its_device():
    from fedlab.fl.ifca import ifca

    net = models.mlp(5, (), 3, seed=1)
    clients, val = _clients((5, 6, 4, 7)), _clients((4, 4))
    from fedlab.fl.ifca import Hypotheses, Validation

    run = lambda **kw: ifca(net, clients, hypotheses=Hypotheses(2), num_rounds=3, clients_per_round=3,  # noqa: E731
                            local=fl.LocalTraining(batch_size=3), seed=2, validation=Validation(val), **kw)
    a, b = run(), _under_meta_default(lambda: run(device="cpu"))
    assert _same(a.hypotheses, b.hypotheses) and _same(a.final, b.final) and a.history == b.history


def test_gradient_inversion_threads_its_device():
    from fedlab.attacks import gradient_inversion as gi

    net = models.mlp(6, (5,), 3, seed=1)
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    X, y = torch.rand(2, 6, generator=torch.Generator().manual_seed(3)), torch.tensor([1, 2])
    obs = gi.parameter_gradient(net, params, X, y)
    knows = gi.Knowledge(input_shape=(6,), num_classes=3, batch_size=2)
    for fn in (lambda **kw: gi.dlg(net, params, obs, knows=knows, budget=gi.AttackBudget(max_iter=6, lr=1.0),
                                   trace=gi.Trace(x_true=X), **kw),
               lambda **kw: gi.dlg(net, params, obs, knows=knows, budget=gi.AttackBudget(max_iter=3, lr=1.0, steps=3),
                                   **kw),
               lambda **kw: gi.inverting_gradients(net, params, obs, knows=gi.Knowledge(input_shape=(6,), labels=y),
                                                   budget=gi.AttackBudget(max_iter=6, lr=0.1, num_restarts=2),
                                                   trace=gi.Trace(x_true=X), **kw)):
        a, b = fn(), _under_meta_default(lambda: fn(device="cpu"))
        assert _same(a.x, b.x) and _same(a.labels, b.labels)
        assert a.history["loss"] == b.history["loss"]


def test_raifle_threads_its_device():
    from fedlab.attacks.interaction_inference import oltr as ro
    from fedlab.fl.oltr import OltrUsers
    from fedlab.attacks.interaction_inference import recsys as rf

    g = torch.Generator().manual_seed(0)
    U, m, d = 3, 5, 4
    X, upd = torch.randn(U, m, d, generator=g), 0.1 * torch.randn(U, m, d, generator=g)
    mask = torch.ones(U, m, dtype=torch.bool)
    fcf = lambda **kw: rf.raifle_fcf(X, upd, mask, budget=rf.RaifleBudget(max_iter=8, num_restarts=2), **kw)  # noqa: E731
    a, b = fcf(), _under_meta_default(lambda: fcf(device="cpu"))
    assert _same(a.scores, b.scores) and _same(a.user_emb, b.user_emb) and _same(a.loss, b.loss)

    from fedlab.data.letor import synthetic_letor

    data = synthetic_letor(40, 6, min_docs=6, seed=1)
    case = ro.make_oltr_case(data, 3, 2, users=OltrUsers(click_model="navigational"), seed=1)
    oltr = lambda **kw: ro.raifle_oltr(case, budget=rf.RaifleBudget(max_iter=8), **kw)  # noqa: E731
    a, b = oltr(), _under_meta_default(lambda: oltr(device="cpu"))
    assert _same(a.scores, b.scores) and _same(a.loss, b.loss)


# ------------------------------------------------------------------ the GPU timing script and its stored run
@pytest.fixture(scope="module")
def device_scripts(request, tmp_path_factory):
    """scripts/device_check.py, then scripts/device_timing.py (which sets FEDLAB_DEVICE and the thread count for
    what runs after it), each as ``__main__`` in one fresh interpreter (tests/child_checks.py: one torch import,
    not two), only those whose tests run: ``({name: {"ok", "stdout", "error"}}, folder of their JSON)``."""
    import os
    from pathlib import Path

    import child_checks

    root, out = Path(__file__).resolve().parents[1], tmp_path_factory.mktemp("device")
    checks = []
    if child_checks.selected(request, "test_device_check_script_runs_on_the_cpu"):
        checks.append({"name": "device_check", "cwd": os.getcwd(), "script": str(root / "scripts" / "device_check.py"),
                       "args": ["--devices", "cpu", "--out", str(out / "c.json")]})
    if child_checks.selected(request, "test_device_timing_script_runs_on_the_cpu"):
        checks.append({"name": "device_timing", "cwd": os.getcwd(), "script": str(root / "scripts" / "device_timing.py"),
                       "args": ["--devices", "cpu", "--users", "2", "--configs", "fcf,fcf_emb", "--threads", "1",
                                "--out", str(out / "t.json")]})
    return child_checks.run(checks, cwd=os.getcwd(), env={"FEDLAB_PROGRESS": "0"}), out


def test_device_timing_script_runs_on_the_cpu(device_scripts):
    """scripts/device_timing.py (the GPU seconds of the README) runs here on the CPU and writes its JSON."""
    import json
    res, out = device_scripts
    assert res["device_timing"]["ok"], res["device_timing"]["error"]
    got = json.loads((out / "t.json").read_text())
    assert got["users"] == 2 and set(got["runs"]["cpu"]) == {"fcf", "fcf_emb", "total_seconds"}
    assert 0.0 <= got["runs"]["cpu"]["fcf_emb"]["auc"] <= 1.0


def test_stored_gpu_table3_agrees_with_the_cpu_record():
    """The H200 run of chapter 3a's Table 3 (chapters/records/device/) on seed 0's 943 users gives the CPU paper
    record's seed-0 AUCs to within 0.002 (not bit for bit: the L-BFGS's floating-point path differs on a GPU),
    and its total is the sum of its rows."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    gpu = json.loads((root / "chapters" / "records" / "device" / "03a_table3_nvidia-h200.json").read_text())
    cpu = json.loads((root / "chapters" / "records" / "03a_raifle_recsys.paper.json").read_text())
    runs = gpu["all_users"]["runs"]
    assert gpu["all_users"]["users"] == 943 and len(runs) == 6
    assert abs(gpu["all_users"]["total_seconds"] - sum(v["seconds"] for v in runs.values())) < 0.05
    seed0 = cpu["seeds"].index(0)
    for name, v in runs.items():
        assert abs(v["auc"] - cpu["values"][f"ch3a_auc_{name}"][seed0]) <= 0.002, (name, v["auc"])


@pytest.mark.slow
def test_device_check_script_runs_on_the_cpu(device_scripts):
    """scripts/device_check.py (the GPU check of every loop that takes a device) runs here with --devices cpu:
    every case runs and equals the CPU run exactly."""
    import json
    res, out = device_scripts
    assert res["device_check"]["ok"], res["device_check"]["error"]
    got = json.loads((out / "c.json").read_text())
    assert got["failed"] == 0 and len(got["checks"]) >= 8
    assert all(v["cpu"]["ok"] and v["cpu"]["max_abs_diff"] == 0.0 for v in got["checks"].values())


def test_stored_gpu_device_check_passed():
    """The H200 run of scripts/device_check.py (chapters/records/device/): every case ran on cuda and cuda:0,
    returned finite outputs on the CPU, and agreed with the CPU run within the script's tolerance."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    got = json.loads((root / "chapters" / "records" / "device" / "device_check_nvidia-h200.json").read_text())
    assert got["failed"] == 0 and got["gpu"] == "NVIDIA H200"
    assert {"fedavg", "ifca", "dlg", "inverting_gradients", "raifle_fcf", "raifle_fncf", "raifle_oltr"} <= set(got["checks"])
    for name, row in got["checks"].items():
        for dev in ("cuda", "cuda:0"):
            assert row[dev]["ok"] and row[dev]["max_abs_diff"] <= got["tol"], (name, dev)
            assert row[dev]["output_devices"] == ["cpu"], (name, dev)


def test_stored_gpu_table3_seed_1_agrees_with_the_cpu_record():
    """A second seed of chapter 3a's Table 3 on the H200 (all 943 users of seed 1) gives the CPU record's seed-1
    AUCs to within 0.002 as well."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    gpu = json.loads((root / "chapters" / "records" / "device" / "03a_table3_nvidia-h200.json").read_text())["seed_1"]
    cpu = json.loads((root / "chapters" / "records" / "03a_raifle_recsys.paper.json").read_text())
    runs = {k: v for k, v in gpu["runs"].items() if k != "total_seconds"}
    assert gpu["users"] == 943 and gpu["seed"] == 1 and len(runs) == 6
    seed1 = cpu["seeds"].index(1)
    for name, v in runs.items():
        assert abs(v["auc"] - cpu["values"][f"ch3a_auc_{name}"][seed1]) <= 0.002, (name, v["auc"])
