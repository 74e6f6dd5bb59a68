"""Stand-ins for the matrix's seed worker (``fedlab.reproduce._matrix_seed``) that spawned worker processes import
by name: a module of its own that imports neither torch nor the test module that uses it (tests/test_matrix.py
imports torch and the matrix; each spawned worker that unpickled a function from it paid that import, about 3 s
of CPU)."""
import os
import time


def crash_at_seed_0(scale, seed, rows=None, stderr=None):
    """A worker of test_a_worker_that_dies...: seed 0's process dies at once (as under the OOM killer); the
    others run no row and return a clean seed after a second (so that seed 0's death comes first): what
    ``_matrix_seed(scale, seed, [])`` returns, without importing torch and the matrix for no row."""
    from fedlab import reproduce as rp

    if seed == 0:
        os._exit(3)
    t0 = time.perf_counter()
    time.sleep(1)
    return rp.SeedRun(seed=seed, seconds=time.perf_counter() - t0), {}
