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
