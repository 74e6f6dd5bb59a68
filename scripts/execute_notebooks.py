#!/usr/bin/env python
"""Execute every chapter notebook once, in parallel, into the book's jupyter-cache (issue 32).

`make book` runs this first and then `jupyter-book build` with ``execute_notebooks: cache``: the build reads
every notebook's outputs from the cache this script has just filled, so each notebook runs once per build and
the two cores are both used. The cache is wiped first, so a change in `fedlab` (which jupyter-cache cannot
see) never leaves a page with stale outputs, and the environment (``FEDLAB_SCALE``, ``FEDLAB_SEED``) of this
run is the one every page shows.

Executed once per CI run: a notebook that `make test` has just run and passed under nbval is stored, executed,
in ``_build/executed`` with a fingerprint (``scripts/executed_store.py``: the notebook, ``fedlab``, the records,
the environment). When the fingerprint still matches, this script puts that copy into the cache instead of
executing the notebook again (``--no-reuse`` turns this off).

Strict: a notebook that raises (outside a cell tagged ``raises-exception``), times out or loses its kernel
makes this script print its traceback and exit 1, so `make book` stops before Sphinx runs. Should a
notebook still be missing from the cache when Sphinx reads it, myst-nb executes it itself and
``nb_execution_raise_on_error`` fails the strict build, so the build never shows a page without outputs.

Usage: ``python scripts/execute_notebooks.py [--jobs N] [--cache DIR] [--timeout S] [notebook ...]``;
by default every ``chapters/*.ipynb`` of ``_toc.yml`` runs, longest first (by the seconds of the previous run,
kept in ``<cache>/../notebook_seconds.json``), ``--jobs`` = number of CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _toc_notebooks() -> list[Path]:
    """The notebooks of ``_toc.yml`` that exist under ``chapters/`` (the book's pages that execute)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    found.append(node[key])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    paths = []
    for name in found:
        path = ROOT / (name if name.endswith(".ipynb") else name + ".ipynb")
        if path.exists():
            paths.append(path)
    return paths


def _execute(path: str, timeout: int) -> tuple[str, float, dict | None, str | None]:
    """Run one notebook in its own folder; ``(path, seconds, executed nb as dict or None, error or None)``."""
    import nbformat
    from nbclient import NotebookClient

    start = time.perf_counter()
    nb = nbformat.read(path, as_version=4)
    kernel = (nb.metadata.get("kernelspec") or {}).get("name", "python3")
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=False, record_timing=False,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    try:
        client.execute()
    except BaseException:  # noqa: BLE001 - reported to the caller with the traceback
        return path, time.perf_counter() - start, None, traceback.format_exc(limit=3)
    return path, time.perf_counter() - start, nb, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: every chapter of _toc.yml)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (> 0)")
    parser.add_argument("--no-reuse", action="store_true",
                        help="execute every notebook, even one `make test` stored with a matching fingerprint")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    import nbformat

    notebooks = [Path(p).resolve() for p in args.notebooks] or _toc_notebooks()
    if not notebooks:
        print("no notebooks to execute", file=sys.stderr)
        return 1
    cache_dir = Path(args.cache)
    seconds_file = cache_dir.parent / "notebook_seconds.json"
    previous = json.loads(seconds_file.read_text()) if seconds_file.exists() else {}
    notebooks.sort(key=lambda p: -float(previous.get(p.name, 1e9)))   # longest first: balanced workers
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    cache = get_cache(str(cache_dir))

    reused = []
    if not args.no_reuse:
        sys.path.insert(0, str(ROOT))
        from scripts import executed_store

        for path in list(notebooks):
            nb = executed_store.load(path)
            if nb is not None:
                cache.cache_notebook_bundle(CacheBundleIn(nb, str(path), data={"executed_by": "make test"}),
                                            check_validity=False, overwrite=True)
                notebooks.remove(path)
                reused.append(path.name)
        if reused:
            print(f"reused {len(reused)} notebooks that `make test` executed with the same fedlab, records and "
                  f"environment: {', '.join(sorted(reused))}", flush=True)
    env = {k: os.environ.get(k, "") for k in ("FEDLAB_SCALE", "FEDLAB_SEED")}
    print(f"executing {len(notebooks)} notebooks, {args.jobs} at a time ({env})", flush=True)
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    failures = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_execute, str(p), args.timeout) for p in notebooks]
        for future in as_completed(futures):
            path, secs, nb_dict, error = future.result()
            name = Path(path).name
            seconds[name] = round(secs, 1)
            if error is not None:
                failures.append((name, error))
                print(f"  FAILED {name} after {secs:.1f} s", flush=True)
                continue
            nb = nbformat.from_dict(nb_dict)
            cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": secs}),
                                        check_validity=False, overwrite=True)
            print(f"  {secs:6.1f} s  {name}", flush=True)
    total = time.perf_counter() - start
    merged = {**previous, **seconds}
    tmp = seconds_file.with_name(f".{seconds_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
    os.replace(tmp, seconds_file)
    print(f"executed in {total:.1f} s wall (sum of notebooks {sum(seconds.values()):.1f} s)", flush=True)
    for name, error in failures:
        print(f"\n{name} failed:\n{error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
