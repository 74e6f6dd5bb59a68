"""Run every loop that honours ``FEDLAB_DEVICE`` on a device and on the CPU, and compare (issue 32, item 6).

``tests/test_device.py`` checks the plumbing on the CPU only (torch's default device set to ``meta``), so a
tensor that some step creates on the CPU while the model lives on a GPU -- the classic device-mismatch error --
is found only where a GPU is. This script is that check: each case (FedAvg, IFCA, DLG with and without the
fixed-step L-BFGS, Inverting Gradients, RAIFLE on FCF and FNCF, RAIFLE on OLTR) runs small, once with
``device="cpu"`` and once with ``device=<each --devices entry>``, and the result says whether it ran, where its
outputs live, and the largest absolute difference from the CPU run (not zero on a GPU: its float reductions run
in another order; the cases are small and well conditioned, so a difference above ``--tol`` is reported as a
disagreement).

Usage: ``python scripts/device_check.py --devices cuda --out check.json`` (``--devices cpu`` runs it here, and
every difference is then 0). Exit status 1 if a case raised or disagreed. Writes one JSON object, atomically.
"""
import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedlab import fl, models  # noqa: E402
from fedlab import data as D  # noqa: E402
from fedlab._io import atomic_write_bytes  # noqa: E402


def _clients(sizes=(6, 5, 7), d=5, C=3):
    g = torch.Generator().manual_seed(0)
    return [D.Dataset(torch.randn(n, d, generator=g), torch.randint(0, C, (n,), generator=g)) for n in sizes]


def _tensors(obj, prefix=""):
    """Every tensor inside ``obj`` (dicts, lists, tuples, dataclass-like objects with ``__dict__``), by path."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix or "value"] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_tensors(v, f"{prefix}[{i}]"))
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for k, v in vars(obj).items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else k))
    return out


def cases():
    """``name -> fn(device) -> result`` for every loop that takes a ``device``."""
    from fedlab.attacks import gradient_inversion as gi
    from fedlab.attacks.interaction_inference import oltr as ro
    from fedlab.fl import oltr as fl_oltr
    from fedlab.attacks.interaction_inference import recsys as rf
    from fedlab.data.letor import synthetic_letor
    from fedlab.fl.ifca import Hypotheses, Validation, ifca

    ev = D.Dataset(torch.randn(9, 5, generator=torch.Generator().manual_seed(5)), torch.arange(9) % 3)
    net = models.mlp(5, (4,), 3, seed=1)
    inv = models.mlp(6, (5,), 3, seed=1)
    params = {k: v.detach().clone() for k, v in inv.named_parameters()}
    X, y = torch.rand(2, 6, generator=torch.Generator().manual_seed(3)), torch.tensor([1, 2])
    obs = gi.parameter_gradient(inv, params, X, y)
    knows = gi.Knowledge(input_shape=(6,), num_classes=3, batch_size=2)
    g = torch.Generator().manual_seed(0)
    U, m, d = 3, 5, 4
    Xr, upd = torch.randn(U, m, d, generator=g), 0.1 * torch.randn(U, m, d, generator=g)
    mask = torch.ones(U, m, dtype=torch.bool)
    from fedlab.fl.recsys.interactions import fncf_init, fncf_updates
    Xn, En = torch.randn(U, 20, 8, generator=g), torch.randn(U, 8, generator=g)
    In = (torch.rand(U, 20, generator=g) < 0.2).float()
    maskn = torch.ones(U, 20, dtype=torch.bool)
    fmodel, theta = fncf_init(8, seed=3)
    fupd, fdT, _ = fncf_updates(fmodel, theta, Xn, En, In, maskn, lr=1.0, local_steps=1)
    letor = synthetic_letor(40, 6, min_docs=6, seed=1)
    ocase = ro.make_oltr_case(letor, 3, 2, users=fl_oltr.OltrUsers(click_model="navigational"), seed=1)
    return {
        "fedavg": lambda dev: fl.fedavg(net, _clients(), num_rounds=3, client_fraction=0.67,
                                        local=fl.LocalTraining(lr=0.3, batch_size=2), eval_data=ev, seed=4,
                                        device=dev).params,
        "ifca": lambda dev: ifca(models.mlp(5, (), 3, seed=1), _clients((5, 6, 4, 7)), hypotheses=Hypotheses(2),
                                 num_rounds=3, clients_per_round=3, local=fl.LocalTraining(batch_size=3), seed=2,
                                 validation=Validation(_clients((4, 4))), device=dev).hypotheses,
        "dlg": lambda dev: gi.dlg(inv, params, obs, knows=knows, budget=gi.AttackBudget(max_iter=6, lr=1.0),
                                  device=dev).x,
        "dlg_fixed_step": lambda dev: gi.dlg(inv, params, obs, knows=knows,
                                             budget=gi.AttackBudget(max_iter=3, lr=1.0, steps=3), device=dev).x,
        "inverting_gradients": lambda dev: gi.inverting_gradients(
            inv, params, obs, knows=gi.Knowledge(input_shape=(6,), labels=y),
            budget=gi.AttackBudget(max_iter=6, lr=0.1, num_restarts=2), device=dev).x,
        "raifle_fcf": lambda dev: rf.raifle_fcf(Xr, upd, mask, budget=rf.RaifleBudget(max_iter=8, num_restarts=2),
                                                device=dev).scores,
        "raifle_fncf": lambda dev: rf.raifle_fncf(fmodel, theta, Xn, fupd, fdT, maskn,
                                                  variant=rf.RaifleVariant(use_model_params=True),
                                                  budget=rf.RaifleBudget(max_iter=8, num_restarts=2), seed=7,
                                                  device=dev).scores,
        "raifle_oltr": lambda dev: ro.raifle_oltr(ocase, budget=rf.RaifleBudget(max_iter=8), device=dev).scores,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="cpu", help="comma-separated devices to compare with the CPU, e.g. cuda")
    p.add_argument("--tol", type=float, default=1e-3, help="largest absolute difference counted as agreement")
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args(argv)
    if not a.tol > 0:
        raise ValueError(f"--tol must be > 0, got {a.tol}")
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "tol": a.tol, "checks": {}}
    bad = 0
    for name, fn in cases().items():
        t0 = time.perf_counter()
        ref = _tensors(fn("cpu"))
        cpu_s = time.perf_counter() - t0
        for dev in a.devices.split(","):
            row = out["checks"].setdefault(name, {})
            try:
                t0 = time.perf_counter()
                got = _tensors(fn(dev))
                if dev.startswith("cuda"):
                    torch.cuda.synchronize()
                s = time.perf_counter() - t0
                if got.keys() != ref.keys():
                    raise AssertionError(f"outputs differ in structure: {sorted(got)} vs {sorted(ref)}")
                diff = max((got[k].detach().double().cpu() - ref[k].double()).abs().max().item() for k in ref)
                finite = all(bool(torch.isfinite(v.double()).all()) for v in got.values())
                ok = finite and diff <= a.tol
                row[dev] = {"ok": ok, "max_abs_diff": diff, "finite": finite, "seconds": round(s, 3),
                            "cpu_seconds": round(cpu_s, 3),
                            "output_devices": sorted({str(v.device) for v in got.values()})}
            except Exception as e:  # noqa: BLE001 - a crash on the device is the finding this script reports
                ok = False
                row[dev] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                            "where": traceback.format_exc().strip().splitlines()[-3:]}
            bad += not ok
            print(f"{name:22s} {dev:6s} {'ok' if ok else 'FAILED'}  {json.dumps(row[dev])[:200]}", flush=True)
    out["failed"] = bad
    if a.out:
        atomic_write_bytes(a.out, (json.dumps(out, indent=1) + "\n").encode())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
