#!/usr/bin/env python
"""Seconds per cell of a chapter notebook: CPU seconds of the kernel process and wall seconds.

CPU seconds barely move when other work shares the machine, so they are the figure to profile with before
cutting a notebook's sizes (issue 32: profile first). The kernel's CPU time includes every thread it runs.

Usage: ``python scripts/profile_notebook.py chapters/02_pac_identifiability.ipynb [--top 8]``
(the environment, ``FEDLAB_SCALE`` and ``FEDLAB_SEED`` included, is passed to the kernel as it is).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_HOOK = """
import time as _fedlab_prof_time, json as _fedlab_prof_json
_fedlab_prof, _fedlab_prof_start = [], []
def _fedlab_prof_pre(info):
    _fedlab_prof_start[:] = [_fedlab_prof_time.process_time(), _fedlab_prof_time.perf_counter(), info.raw_cell]
def _fedlab_prof_post(result):
    if _fedlab_prof_start:
        cpu, wall, source = _fedlab_prof_start
        _fedlab_prof.append((_fedlab_prof_time.process_time() - cpu, _fedlab_prof_time.perf_counter() - wall,
                             source))
get_ipython().events.register("pre_run_cell", _fedlab_prof_pre)
get_ipython().events.register("post_run_cell", _fedlab_prof_post)
"""


def main(argv: list[str] | None = None) -> int:
    import nbformat
    from nbclient import NotebookClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--top", type=int, default=10, help="how many of the costliest cells to print")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (> 0)")
    args = parser.parse_args(argv)
    if args.top < 1 or args.timeout <= 0:
        parser.error("--top and --timeout must be positive")
    path = Path(args.notebook).resolve()
    nb = nbformat.read(path, as_version=4)
    sources = {c.source: i for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    nb.cells.insert(0, nbformat.v4.new_code_cell(_HOOK))
    nb.cells.append(nbformat.v4.new_code_cell("print(_fedlab_prof_json.dumps(_fedlab_prof))"))
    start = time.perf_counter()
    NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(path.parent)}}).execute()
    wall = time.perf_counter() - start
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout")
    rows = []
    for cpu, secs, source in json.loads(text):
        lines = source.strip().splitlines()
        rows.append((cpu, secs, sources.get(source, -1), (lines[0] if lines else "")[:70]))
    total_cpu = sum(r[0] for r in rows)
    print(f"{path.name}: {wall:.1f} s wall in all (kernel start included), "
          f"{sum(r[1] for r in rows):.1f} s wall and {total_cpu:.1f} s CPU in cells")
    print(f"{'CPU s':>7} {'wall s':>7}  cell  first line")
    for cpu, secs, index, line in sorted(rows, reverse=True)[: args.top]:
        print(f"{cpu:7.1f} {secs:7.1f}  {index:4d}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
