#!/usr/bin/env python
"""Every assert of a chapter notebook at many seeds, without stopping at the first that fails.

``python -m fedlab reproduce CHAPTER --seeds ...`` stops a seed at its first failing assert. Before deciding
what a page may claim, one wants every assert's verdict at every seed: this script runs the notebook's code
cells in this process once per seed (``FEDLAB_SEED`` set before each run), with each ``assert`` rewritten
into a call that records a failure and goes on. It prints one line per seed, ``SEED OK`` or ``SEED FAIL:``
and the failing conditions; ``--print EXPR`` evaluates an expression in the notebook's namespace after each
seed (the margins you are deciding about). Magics (``%``, ``!``) are dropped; a cell that raises ends that
seed (reported as a failure) and the next seed starts from the first cell.

The session of 2026-11-29 found 16 failing asserts at six seeds nobody had picked this way, and decided each
over 16-60 seeds (CONTRIBUTING.md, "Seeds"). The seeds share one process: a cache a notebook fills at one
seed is seen at the next (fedlab keys its caches by seed); for a clean check use ``reproduce``.

Usage::

    python scripts/scan_asserts.py chapters/00_fl_primer.ipynb --seeds 0-19 [--upto 6] \\
        [--print 'acc["FedAvg"]["iid"] - acc["centralized"]["iid"]']

Exit status 1 when any seed failed.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path


class _Asserts(ast.NodeTransformer):
    """``assert COND, MSG`` -> ``_scan_check("COND", lambda: (COND))``: evaluated, recorded, never raised."""

    def visit_Assert(self, node):
        src = ast.unparse(node.test)
        call = ast.parse(f"_scan_check({src!r}, lambda: ({src}))").body[0]
        return ast.copy_location(call, node)


def parse_seeds(text: str) -> list[int]:
    """``"0-3,7"`` -> ``[0, 1, 2, 3, 7]``. Raises ``ValueError`` naming ``--seeds`` for bad text."""
    out = []
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    except ValueError:
        raise ValueError(f"--seeds must look like 0-3,7, got {text!r}") from None
    if not out or min(out) < 0 or len(out) > 10_000:
        raise ValueError(f"--seeds must name 1 to 10000 non-negative seeds, got {text!r}")
    return out


def code_cells(path: Path, upto: int | None) -> list[tuple[int, str]]:
    """The notebook's code cells ``(index, source)`` up to cell ``upto`` (inclusive), magics dropped."""
    cells = json.loads(path.read_text())["cells"]
    out = []
    for i, c in enumerate(cells):
        if upto is not None and i > upto:
            break
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        if "google.colab" in src:
            continue
        out.append((i, "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))))
    return out


def scan(path: Path, seeds: list[int], *, upto: int | None = None, show: str | None = None,
         out=sys.stdout) -> dict[int, list[str]]:
    """Run the notebook at each seed; returns ``{seed: [failing conditions or 'cell N raised ...']}``."""
    import matplotlib

    matplotlib.use("Agg")
    cells = [(i, compile(ast.fix_missing_locations(_Asserts().visit(ast.parse(src))), f"<cell {i}>", "exec"))
             for i, src in code_cells(path, upto)]
    here = os.getcwd()
    os.chdir(path.parent)
    results = {}
    try:
        for seed in seeds:
            os.environ["FEDLAB_SEED"] = str(seed)
            fails: list[str] = []

            def check(src, cond, fails=fails):
                try:
                    ok = bool(cond())
                except Exception as e:   # noqa: BLE001 - a condition that raises is a failure to report
                    ok, src = False, f"{src} [{type(e).__name__}: {e}]"
                if not ok:
                    fails.append(src)

            ns = {"_scan_check": check, "__name__": "__main__"}
            for i, code in cells:
                try:
                    exec(code, ns)
                except Exception as e:   # noqa: BLE001 - reported, and the seed ends
                    fails.append(f"cell {i} raised {type(e).__name__}: {e}")
                    break
            results[seed] = fails
            print(seed, "OK" if not fails else "FAIL: " + " || ".join(f[:200] for f in fails), file=out, flush=True)
            if show:
                try:
                    print("   ", eval(show, ns), file=out, flush=True)
                except Exception as e:   # noqa: BLE001
                    print(f"    --print failed: {type(e).__name__}: {e}", file=out, flush=True)
    finally:
        os.chdir(here)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-19 or 3,5,8 (default 0-9)")
    ap.add_argument("--upto", type=int, default=None, help="the last cell to run (index in the notebook)")
    ap.add_argument("--print", dest="show", default=None, help="an expression printed after each seed")
    args = ap.parse_args(argv)
    if not args.notebook.is_file():
        ap.error(f"notebook {args.notebook} not found")
    if args.upto is not None and args.upto < 0:
        ap.error(f"--upto must be >= 0, got {args.upto}")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    results = scan(args.notebook.resolve(), seeds, upto=args.upto, show=args.show)
    failed = [s for s, f in results.items() if f]
    print(f"{len(seeds) - len(failed)} of {len(seeds)} seeds clean" + (f"; failing: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
