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
