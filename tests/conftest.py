"""Shared fixtures. ``http_files`` serves a temporary folder on the loopback interface, so download code
runs its real HTTP path (pooch, requests) without touching the network."""
import functools
import http.server
import threading

import pytest


@pytest.fixture
def http_files(tmp_path):
    """``(folder, base_url)``: files written into ``folder`` are served at ``base_url + name``."""
    folder = tmp_path / "served"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def digits_setup():
    """Chapter 0's small federation: ``(net, w0, train, test, {"iid": 4 stacked iid clients})`` on the digits."""
    from fedlab import data, fl, models

    digits = data.load_digits()
    train, test = data.train_test_split(digits, test_fraction=0.3, seed=0)
    parts = data.partition_iid(len(train), 4, seed=0)
    clients = {"iid": fl.stack_clients(data.client_datasets(train, parts))}
    net = models.mlp(64, (8,), 10, seed=0)
    return net, models.get_params(net), train, test, clients


class TinyMatrix:
    """The attack x defense matrix at its tiny size, every column: ``row(key)`` is ``(values, apply_keys)``, what
    ``run_row(key, 0, tiny=True)`` returns and the defense key of each `privacy.apply` call it made, in order. Only
    that call is shared, never a row's columns run alone: some cells depend on the columns run beside them (DLG's
    naive twins, the DLG outsider's DP cell), so a run of other columns is another computation.

    tests/test_matrix.py reads every row and test_matrix_secagg_safe_topk.py the SecAgg+ row, and ``--dist loadfile``
    may put them on different xdist workers: each row is written, once computed, to a file in the run's temporary
    folder that all workers share (a fresh folder each run, so nothing outlives the run), under a lock, so that a
    worker that needs a row another is computing waits for it instead of computing it again. Call it from a
    fixture or from a test that patches nothing: a row runs with the patches active at the time."""

    def __init__(self, shared):
        self.shared, self.memo = shared, {}

    @staticmethod
    def _run(key):
        import json

        from fedlab.experiments import matrix as mx
        from fedlab.privacy import registry

        keys, real = [], registry.apply

        def spy(updates, defense, **kw):
            keys.append(defense if isinstance(defense, str) else defense.key)
            return real(updates, defense, **kw)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(registry, "apply", spy)
            values = mx.run_row(key, 0, tiny=True)
        return json.loads(json.dumps([values, keys]))      # as a worker that reads it from the shared file sees it

    def row(self, key):
        import json

        if key not in self.memo:
            if self.shared is None:
                self.memo[key] = self._run(key)
            else:
                from filelock import FileLock

                path = self.shared / f"matrix-tiny-{key}.json"
                with FileLock(str(path) + ".lock"):
                    if not path.is_file():
                        path.write_text(json.dumps(self._run(key)))
                    self.memo[key] = json.loads(path.read_text())
        values, keys = self.memo[key]
        return dict(values), list(keys)


@pytest.fixture(scope="session")
def tiny_matrix(tmp_path_factory):
    """:class:`TinyMatrix`, shared by every test file of one run (and by its xdist workers)."""
    import os

    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    return TinyMatrix(shared)
