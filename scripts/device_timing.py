"""Seconds of chapter 3a's paper-scale Table 3 (RAIFLE Sec. 4.2, the book's most expensive computation: about 75
CPU-minutes of a 2-core machine per seed) on each device given, with every configuration's mean AUC and median
loss reached, so that a GPU's numbers can be set beside the CPU's and checked against them (issue 32, item 6).

The case is the page's at ``FEDLAB_SCALE=paper`` (synthetic MovieLens 100K of ``--seed``, 4 negatives per
positive, 64-dimensional embeddings, one local step) on the first ``--users`` users (default: all 943), attacked
with the paper-scale budgets of :data:`fedlab.experiments.chapter3a.SCALE_SETTINGS`. Only the L-BFGS runs on the
device (``FEDLAB_DEVICE``); the starts are drawn on the CPU, so a GPU run starts from the CPU run's points.

Usage: ``python scripts/device_timing.py --devices cpu,cuda --users 64 --out timing.json``. Writes one JSON
object (atomically) and prints one line per device and configuration.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedlab import config  # noqa: E402
from fedlab.data.movielens import sample_user_items, synthetic_movielens  # noqa: E402
from fedlab.experiments import chapter3a as ex  # noqa: E402
from fedlab.attacks.interaction_inference.recsys import make_recsys_case  # noqa: E402
from fedlab._io import atomic_write_bytes  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="cpu", help="comma-separated FEDLAB_DEVICE values, e.g. cpu,cuda")
    p.add_argument("--users", type=int, default=None, help="the first N users of the case (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default="all", help="'all' or comma-separated Table 3 names, e.g. fncf_emb")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads on the CPU (default: torch's)")
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args(argv)
    if a.users is not None and a.users < 1:
        raise ValueError(f"--users must be >= 1, got {a.users}")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    names = {v: k for k, v in ex.TABLE3_NAMES.items()}
    configs = list(ex.TABLE3_CONFIGS) if a.configs == "all" else [names[c] for c in a.configs.split(",")]
    paper = {k: v[1] for k, v in ex.SCALE_SETTINGS.items()}
    data = synthetic_movielens(seed=a.seed)
    users = torch.arange(data.num_users if a.users is None else min(a.users, data.num_users)).numpy()
    items = sample_user_items(data, neg_ratio=4, users=users, seed=a.seed)
    case = make_recsys_case(items, data.num_items, dim=64, fncf_lr=1.0, local_steps=1, seed=a.seed)
    out = {"users": len(case), "seed": a.seed, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "runs": {}}
    for dev in a.devices.split(","):
        os.environ["FEDLAB_DEVICE"] = dev
        config.device()                                     # a device torch cannot use is an error here
        runs = out["runs"][dev] = {}
        for c in configs:
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = ex.run_config(case, c, fcf_max_iter=paper["fcf_max_iter"], fncf_max_iter=paper["fncf_max_iter"],
                              num_restarts=paper["num_restarts"], seed=a.seed)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            s = time.perf_counter() - t0
            runs[ex.TABLE3_NAMES[c]] = {"seconds": round(s, 2), "auc": r["auc"].mean().item(),
                                        "loss_reached": r["loss"].median().item(),
                                        "loss_truth": r["loss_truth"].median().item()}
            print(f"{dev:6s} {ex.TABLE3_NAMES[c]:16s} {s:8.1f} s  AUC {r['auc'].mean().item():.4f}  "
                  f"loss {r['loss'].median().item():.4g} (truth {r['loss_truth'].median().item():.4g})", flush=True)
        runs["total_seconds"] = round(sum(v["seconds"] for v in runs.values()), 2)
    if a.out:
        atomic_write_bytes(a.out, (json.dumps(out, indent=1) + "\n").encode())
    return out


if __name__ == "__main__":
    main()
