"""Independent tasks in worker processes, with the results a loop in this process gives.

:func:`map_tasks` runs ``fn`` on each task, in this process (``workers=1``) or in ``spawn``-ed worker
processes that use as many torch threads as this process does, and returns the results in the order of
the tasks. It is meant for batches that do not depend on each other (RAIFLE's batches of users,
:func:`fedlab.experiments.chapter3a.attack_case`); a batch's floating-point operations are then the same
wherever it runs (``tests/test_parallel.py`` checks bit-for-bit equality). Imports nothing from fedlab.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable

__all__ = ["map_tasks"]


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def map_tasks(fn: Callable, tasks: Iterable, *, workers: int) -> list:
    """``[fn(t) for t in tasks]`` (``tasks`` any iterable, consumed lazily when ``workers`` is 1), computed by ``min(workers, len(tasks))`` processes (this one when that is 1).

    ``fn`` must be a module-level function and the tasks and results picklable (tensors are). Worker
    processes are started with ``spawn`` (no fork of a process holding torch's thread pools) and set torch's
    intra-op threads to this process's. A task that raises raises here. Raises ``ValueError`` for ``workers``
    that is not a positive integer."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if workers == 1:                      # one task at a time, each made only when it runs
        return [fn(t) for t in tasks]
    tasks = list(tasks)
    n = min(workers, len(tasks))
    if n <= 1:
        return [fn(t) for t in tasks]
    import torch

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker,
                             initargs=(torch.get_num_threads(),)) as pool:
        return list(pool.map(fn, tasks))
