#!/usr/bin/env python
"""Compare two folders of records written by `python -m fedlab reproduce` (e.g. before and after a
refactor): every glued value of every chapter at every seed must agree.

    python scripts/compare_records.py /tmp/before /tmp/after [--tol 0]

Prints each difference (chapter, name, seed, before, after) and exits 1 if there is one, or if a
chapter, seed or name is missing on one side. Names that quote a stored record or a run time
(ending in `_paper`, `_note`) and wall-clock timings (ending in `_s`, `_ms`, `_seconds`) are skipped.
"""
import argparse
import json
import math
import sys
from pathlib import Path

SKIP = ("_paper", "_note", "_s", "_ms", "_seconds")   # quoting a record, or wall-clock timings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--tol", type=float, default=0.0, help="absolute tolerance for numbers (default exact)")
    a = p.parse_args()
    before = {f.name: json.loads(f.read_text()) for f in Path(a.before).glob("*.json")}
    after = {f.name: json.loads(f.read_text()) for f in Path(a.after).glob("*.json")}
    diffs = [f"missing after: {n}" for n in before if n not in after]
    diffs += [f"new after: {n}" for n in after if n not in before]
    compared = 0
    for name in sorted(set(before) & set(after)):
        b, c = before[name], after[name]
        if b["seeds"] != c["seeds"]:
            diffs.append(f"{name}: seeds {b['seeds']} vs {c['seeds']}")
            continue
        for key in sorted(set(b["values"]) | set(c["values"])):
            if key.endswith(SKIP):
                continue
            vb, vc = b["values"].get(key), c["values"].get(key)
            if vb is None or vc is None:
                diffs.append(f"{name} {key}: only {'after' if vb is None else 'before'}")
                continue
            for seed, x, y in zip(b["seeds"], vb, vc):
                compared += 1
                same = x == y or (isinstance(x, (int, float)) and isinstance(y, (int, float))
                                  and math.isclose(x, y, rel_tol=0, abs_tol=a.tol))
                if not same:
                    diffs.append(f"{name} {key} seed {seed}: {x!r} -> {y!r}")
    print("\n".join(diffs) if diffs else f"identical: {compared} values in {len(before)} records")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
