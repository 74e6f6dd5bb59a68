"""fedlab on Flower in deployment mode (issue 23): a SuperLink and two SuperNodes on 127.0.0.1 run the
generated Flower App, and the transcript gives fedlab's FedAvg; beside it, in the same federation, a SecAgg+
run with Bonawitz et al.'s consistency round (issue 33). In a file of its own (it was in tests/test_flower.py):
several minutes of wall time (286 s plain and 524 s for two SecAgg+ rounds, at once, at load 9 on 2 cores; the
SecAgg+ run now has one round), mostly Flower's
polling and a fresh flwr-clientapp process per message, which `make test` (``--dist loadfile``) can overlap
with test_flower.py's Ray runs on another worker.

Needs the ``flower`` extra (``pip install ".[flower]"``); without ``flwr`` the test is skipped.
"""
import dataclasses
import socket
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]', "
                                   "flwr[simulation]>=1.41) is needed for tests/test_flower_deploy.py")

from fedlab.fl import LocalTraining  # noqa: E402
from fedlab.fl import client_update, fedavg  # noqa: E402
from fedlab.flower import deploy  # noqa: E402
from fedlab.flower.apps import CONSISTENCY_KIND, fedavg_schedule  # noqa: E402
from fedlab.flower.attacks import secagg_error_bound  # noqa: E402
from fedlab.flower.transcript import load_transcript  # noqa: E402

TOL = 1e-6   # float32 rounding: vmap (fedlab) vs one client at a time (Flower), and numpy's aggregation


def _model_fn():
    return deploy.demo_model(seed=3, hidden=16)


def _maxdiff(a, b):
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def _fedavg_round(start, t, clients, kw):
    """FedAvg's round ``t`` from the global model ``start`` (fedlab's ClientUpdate with fedavg's shuffles for
    that round, weighted by n_k): the exact plain sum a SecAgg+ round decodes up to its rounding."""
    sizes = [len(c.X) for c in clients]
    local = kw["local"]
    schedule = fedavg_schedule(sizes, num_rounds=t, local_epochs=local.local_epochs, batch_size=local.batch_size,
                               seed=kw["seed"])[t - 1]
    total, model, out = sum(sizes[k] for k, _ in schedule), _model_fn(), {}
    for k, state in schedule:
        gen = torch.Generator()
        gen.set_state(state)
        new = client_update(model, {n: v.clone() for n, v in start.items()}, clients[k].X, clients[k].y, local=local,
                            generator=gen)
        for n, v in new.items():
            out[n] = out.get(n, 0) + sizes[k] / total * v.detach().double()
    return out


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
@pytest.mark.slow
def test_deployment_mode_superlink_and_two_supernodes(tmp_path, capsys):
    """One SuperLink and two SuperNodes on 127.0.0.1 over TLS (a certificate authority made here) with
    SuperNode authentication (each node's key registered with `flwr supernode register`), `flwr run` of a
    generated Flower App, 2 rounds; the transcript holds 2 replies a round from partitions 0 and 1, and the
    final model is fedlab's FedAvg. A node whose key was not registered is refused. In the same federation (each
    node started with its own consistency-round signing key and the public registry) a second `flwr run`
    with SecAgg+ and Bonawitz et al.'s consistency round, one round: the round runs for both nodes, and the
    aggregate is FedAvg's plain sum within SecAgg's rounding."""
    kw = dict(num_rounds=2, local=LocalTraining(lr=0.1, local_epochs=1, batch_size=16), seed=4)
    root = tmp_path / "transcripts"
    # the app's own settings say 3 rounds and lr 0.5; the run config of each `flwr run` overrides them
    app = deploy.write_app(tmp_path / "app", root, num_clients=2,
                           demo=deploy.DemoApp(model_seed=3, hidden=16, examples_per_client=60),
                           **{**kw, "num_rounds": 3, "local": dataclasses.replace(kw["local"], lr=0.5)})
    def timed_run(run_config):
        t0 = time.perf_counter()
        deploy.flwr_run(app, fed, run_config=run_config, timeout=900)
        return time.perf_counter() - t0

    # the nodes hold consistency keys, so by default they would refuse the plain run ("SecAgg+ only",
    # tests/test_flower_deploy_app.py); this federation runs both side by side, so its nodes lift that policy
    with deploy.local_federation(2, workdir=tmp_path / "federation", tls=True, supernode_auth=True,
                                 consistency_keys=True, require_secagg=False) as fed:
        # both runs at once (each message of either waits mostly on Flower's 3 s polling and a fresh
        # flwr-clientapp process), so the SecAgg+ run adds little wall time to the plain one
        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(timed_run, {"num-rounds": 2, "lr": 0.1})
            # one SecAgg+ round (five exchanges with the consistency round) checks the protocol; a second doubled
            # the test's time (604 s at load 9) and checks nothing the first does not
            secure = pool.submit(timed_run, {"num-rounds": 1, "lr": 0.1, "secagg": True, "consistency": True})
            seconds, secagg_seconds = plain.result(), secure.result()
        _check_tls(fed.address, tmp_path / "federation" / "certs" / "ca.crt")
        _check_unregistered_node_is_refused(fed, tmp_path)
    assert all(p.poll() is not None for p in fed.processes)          # the federation stopped its processes
    assert fed.stopped_descendants and not any(deploy._alive(d) for d in fed.stopped_descendants)
    runs = sorted(root.iterdir())
    assert len(runs) == 2 and all(r.name.startswith("run-") for r in runs)     # <transcript-root>/run-<run id>
    T, S = sorted((load_transcript(r) for r in runs), key=lambda tr: tr.meta["secagg"])
    assert T.num_rounds == 2 and T.meta["lr"] == 0.1
    for t in (1, 2):
        replies = T.train_replies(t)
        assert [r.partition_id for r in replies] == [0, 1] and [r.num_examples for r in replies] == [60, 60]
    ref = fedavg(_model_fn(), deploy.demo_clients(2, examples_per_client=60), **kw)
    diff = _maxdiff(ref.params, T.final_params)
    assert diff <= TOL, diff
    # SecAgg+ with the consistency round: every round sent both nodes the consistency stage, nobody refused,
    # and each round decoded FedAvg's plain sum of that round's client models within SecAgg's rounding
    assert S.meta["consistency"] and S.num_rounds == 1 and not [r for r in S.replies if r.error is not None]
    clients = deploy.demo_clients(2, examples_per_client=60)
    sdiff = []
    for t in (1,):
        assert len([s for s in S.sent if s.round == t and s.kind == CONSISTENCY_KIND]) == 2
        assert len([r for r in S.replies if r.round == t and r.kind == CONSISTENCY_KIND]) == 2
        exact = _fedavg_round(S.globals[t - 1], t, clients, kw)
        sdiff.append(max(float((S.globals[t][k].double() - exact[k]).abs().max()) for k in exact))
        assert sdiff[-1] <= secagg_error_bound(S, t) + TOL, (t, sdiff[-1], secagg_error_bound(S, t))
    with capsys.disabled():
        print(f"\n[flower] deployment mode vs fedlab.fl.fedavg: max |difference| = {diff:.3g} ({seconds:.1f} s); "
              f"SecAgg+ with the consistency round vs the plain sum: {max(sdiff):.3g} "
              f"(bound {secagg_error_bound(S, 1):.3g}; {secagg_seconds:.1f} s)")
