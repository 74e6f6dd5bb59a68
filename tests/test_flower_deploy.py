"""fedlab on Flower in deployment mode (issue 23): a SuperLink and two SuperNodes on 127.0.0.1 run the
generated Flower App, and the transcript gives fedlab's FedAvg. In a file of its own (it was in
tests/test_flower.py): about two minutes of wall time, mostly Flower's polling, which `make test`
(``--dist loadfile``) can now overlap with test_flower.py's Ray runs on another worker.

Needs the ``flower`` extra (``pip install ".[flower]"``); without ``flwr`` the test is skipped.
"""
import socket
import ssl
import subprocess
import time

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]', "
                                   "flwr[simulation]>=1.41) is needed for tests/test_flower_deploy.py")

from fedlab.fl import fedavg  # noqa: E402
from fedlab.flower import deploy  # noqa: E402
from fedlab.flower.transcript import load_transcript  # noqa: E402

TOL = 1e-6   # float32 rounding: vmap (fedlab) vs one client at a time (Flower), and numpy's aggregation


def _model_fn():
    return deploy.demo_model(seed=3, hidden=16)


def _maxdiff(a, b):
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def _check_tls(address, ca):
    """The SuperLink's port speaks TLS with a certificate of the test's own authority for 127.0.0.1: a client
    trusting that authority completes the handshake, one trusting only the system's authorities does not."""
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, int(port)), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=host) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with socket.create_connection((host, int(port)), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        ssl.create_default_context().wrap_socket(raw, server_hostname=host)


def _check_unregistered_node_is_refused(fed, tmp_path):
    """A SuperNode with a valid key that nobody registered (`flwr supernode register`) is not let in."""
    keys = deploy.write_supernode_keys(tmp_path / "intruder", "intruder")
    args = [deploy._bin("flower-supernode"), "--root-certificates", str(tmp_path / "federation" / "certs" / "ca.crt"),
            "--superlink", fed.address, "--host", "127.0.0.1", "--port", str(deploy._free_port()),
            "--auth-supernode-private-key", str(keys["private"]), "--node-config", "partition-id=0 num-partitions=2"]
    log = tmp_path / "intruder.log"
    with open(log, "wb") as out:      # a file, not a pipe: the SuperExec it starts would hold a pipe open
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=fed.env, start_new_session=True)
    try:
        code = proc.wait(timeout=120)
    finally:
        deploy._stop([proc])           # its process group and every descendant (the SuperExec)
    assert code != 0 and "Failed to activate SuperNode" in log.read_text(), log.read_text()[-2000:]


@pytest.mark.flower
def test_deployment_mode_superlink_and_two_supernodes(tmp_path, capsys):
    """One SuperLink and two SuperNodes on 127.0.0.1 over TLS (a certificate authority made here) with
    SuperNode authentication (each node's key registered with `flwr supernode register`), `flwr run` of a
    generated Flower App, 2 rounds; the transcript holds 2 replies a round from partitions 0 and 1, and the
    final model is fedlab's FedAvg. A node whose key was not registered is refused."""
    kw = dict(num_rounds=2, lr=0.1, local_epochs=1, batch_size=16, seed=4)
    root = tmp_path / "transcripts"
    # the app's own settings say 3 rounds and lr 0.5; the run config of each `flwr run` overrides them
    app = deploy.write_app(tmp_path / "app", root, num_clients=2, model_seed=3, hidden=16, examples_per_client=60,
                           **{**kw, "num_rounds": 3, "lr": 0.5})
    t0 = time.perf_counter()
    with deploy.local_federation(2, workdir=tmp_path / "federation", tls=True, supernode_auth=True) as fed:
        deploy.flwr_run(app, fed, run_config={"num-rounds": 2, "lr": 0.1}, timeout=240)
        seconds = time.perf_counter() - t0
        _check_tls(fed.address, tmp_path / "federation" / "certs" / "ca.crt")
        _check_unregistered_node_is_refused(fed, tmp_path)
    assert all(p.poll() is not None for p in fed.processes)          # the federation stopped its processes
    assert fed.stopped_descendants and not any(deploy._alive(d) for d in fed.stopped_descendants)
    runs = sorted(root.iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("run-")        # <transcript-root>/run-<run id>
    T = load_transcript(runs[0])
    assert T.num_rounds == 2 and T.meta["lr"] == 0.1
    for t in (1, 2):
        replies = T.train_replies(t)
        assert [r.partition_id for r in replies] == [0, 1] and [r.num_examples for r in replies] == [60, 60]
    ref = fedavg(_model_fn(), deploy.demo_clients(2, examples_per_client=60), progress=False, **kw)
    diff = _maxdiff(ref.params, T.final_params)
    with capsys.disabled():
        print(f"\n[flower] deployment mode vs fedlab.fl.fedavg: max |difference| = {diff:.3g} ({seconds:.1f} s)")
    assert diff <= TOL, diff
