"""Chapter 1a's and 1c's attacks on what a Flower server recorded (fedlab.flower.attacks), run on
transcripts of the Flower apps (in-process engine: the same ServerApp, ClientApp and Recorder)."""
import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]', "
                                   "flwr[simulation]>=1.41) is needed for tests/test_flower_attacks.py")

from fedlab import fl, flower  # noqa: E402
from fedlab.attacks.gradient_inversion import dlg_init_, parameter_gradient  # noqa: E402
from fedlab.data.images import digit_images  # noqa: E402
from fedlab.flower import attacks as fa  # noqa: E402
from fedlab.flower.deploy import demo_clients  # noqa: E402
from fedlab.models import lenet, mlp  # noqa: E402


def _fedsgd_images(seed=0, num_clients=4):
    imgs = digit_images(num_clients, seed=seed)
    clients = [(imgs.X[i:i + 1], imgs.y[i:i + 1]) for i in range(num_clients)]

    def model_fn():
        return dlg_init_(lenet(1, 10, 8, seed=seed), seed=seed)   # chapter 1a's sigmoid LeNet

    res = flower.run(model_fn, clients, engine=flower.Engine("local"), num_rounds=1, local=fl.LocalTraining(lr=0.1, batch_size=None),
                     seed=seed)
    return clients, model_fn, res.transcript


def test_fedsgd_messages_are_the_clients_gradients():
    clients, model_fn, T = _fedsgd_images()
    obs = fa.observed_gradients(T, 1)
    assert sorted(obs) == [0, 1, 2, 3]
    for k, (X, y) in enumerate(clients):
        true = parameter_gradient(model_fn(), T.globals[0], X, y)
        assert max(float((obs[k][n] - true[n]).abs().max()) for n in true) < 1e-4
    with pytest.raises(ValueError, match="round"):
        fa.observed_gradients(T, 2)


@pytest.mark.slow
def test_idlg_and_dlg_reconstruct_the_clients_images_from_the_transcript():
    """One image per client, FedSGD: iDLG's label rule is exact, and the images come back (at seeds 0-9,
    at least 3 of the 4 clients' images had PSNR > 30 dB, most > 100 dB, with 100 L-BFGS iterations)."""
    clients, model_fn, T = _fedsgd_images(seed=0)
    truth = {k: X for k, (X, _) in enumerate(clients)}
    y = torch.cat([yk for _, yk in clients])
    for idlg in (True, False):
        inv = fa.invert_gradients(model_fn, T, input_shape=(1, 8, 8), num_classes=10, idlg=idlg,
                                  x_true=truth)
        assert inv.fedsgd and inv.partitions == [0, 1, 2, 3]
        assert inv.labels.flatten().tolist() == y.tolist()
        assert (inv.psnr > 30).mean() >= 0.5, inv.psnr
    with pytest.raises(ValueError, match="batch_size"):
        fa.invert_gradients(model_fn, T, input_shape=(1, 8, 8), num_classes=10, batch_size=2)


def test_restarts_keep_the_start_of_least_matching_loss():
    """iDLG from several random starts per client (chapter 6's server, at seed 38 half the clients stalled from
    one start): start 0 is the one-start run, bit for bit, and each client keeps the start whose gradient
    matches best, so no client's matching loss rises and the stalled ones come back."""
    from fedlab.experiments import chapter6 as ex

    from fedlab.attacks import gradient_inversion as gi

    victims, lenet = ex.fedsgd_clients(38, 8)
    T = flower.run(lenet, victims, num_rounds=1, local=fl.LocalTraining(lr=0.1, batch_size=None), seed=38,
                   engine=flower.Engine("local")).transcript
    truth = {k: X for k, (X, _) in enumerate(victims)}
    kw = dict(input_shape=(1, 8, 8), num_classes=10, x_true=truth, seed=38)
    budget = lambda r: gi.AttackBudget(max_iter=40, lr=1.0, num_restarts=r)   # noqa: E731
    one = fa.invert_gradients(lenet, T, budget=budget(1), **kw)
    two = fa.invert_gradients(lenet, T, budget=budget(2), **kw)
    assert one.final_loss.shape == (8,) and bool((two.final_loss <= one.final_loss).all())
    assert (two.psnr > 20).mean() > (one.psnr > 20).mean()          # 0.5 -> 0.875 at this seed
    assert torch.equal(two.labels, one.labels)                      # iDLG's label rule does not depend on the start
    with pytest.raises(ValueError, match="budget"):
        fa.invert_gradients(lenet, T, budget={"max_iter": 40}, **kw)
    # invert_model (one exposed model, chapter 6b): the starts of invert_gradients, one client at a time
    k = int(np.flatnonzero(two.psnr[:, 0] > 20)[0])
    w = {r.partition_id: r.params for r in T.train_replies(1)}[k]
    x1, lab1, p1 = fa.invert_model(lenet, T.globals[0], w, lr=0.1, input_shape=(1, 8, 8), num_classes=10, max_iter=40,
                                   x_true=victims[k][0], seed=38, num_restarts=4)
    assert lab1 == int(victims[k][1]) and p1 > 20
    with pytest.raises(ValueError, match="num_restarts"):
        fa.invert_model(lenet, T.globals[0], w, lr=0.1, input_shape=(1, 8, 8), num_classes=10, num_restarts=0)


def test_membership_inference_on_the_models_a_client_returned():
    """Chapter 1c's passive attack on client 0's returned models: its own 30 training records against 30
    outsiders. At seeds 0-9 the AUC was 0.71-0.85 on client 0's models and 0.41-0.67 on client 1's
    (which never trained on them locally), client 0's above client 1's at every seed."""
    parts = demo_clients(3, seed=0)
    train = [type(c)(c.X[:30], c.y[:30]) for c in parts[:2]]
    outsiders = parts[2]

    def model_fn():
        return mlp(64, [64], 10, seed=0)

    res = flower.run(model_fn, train, engine=flower.Engine("local"), num_rounds=3, local=fl.LocalTraining(lr=0.5, local_epochs=10, batch_size=10), seed=0)
    X = torch.cat([train[0].X, outsiders.X[:30]])
    y = torch.cat([train[0].y, outsiders.y[:30]])
    is_member = np.r_[np.ones(30), np.zeros(30)]
    own = fa.membership_auc(model_fn, res.transcript, 0, X, y, is_member)
    other = fa.membership_auc(model_fn, res.transcript, 1, X, y, is_member)
    assert own > 0.65 and own > other, (own, other)
    assert fa.membership_signals(model_fn, res.transcript, 0, X, y).shape == (3, 60)
    with pytest.raises(ValueError, match="partition"):
        fa.membership_signals(model_fn, res.transcript, 5, X, y)


# ------------------------------------------------------------------------------------------------
# chapter 4's eavesdropper on a transcript
# ------------------------------------------------------------------------------------------------
def _least_squares_run(seed=0, num_rounds=40):
    from fedlab.attacks import model_reconstruction as mr
    from fedlab.experiments import chapter6 as ex

    clients = ex.least_squares_clients(seed)
    args = dict(num_rounds=num_rounds, client_fraction=0.6, seed=seed,
                local=fl.LocalTraining(lr=0.01, local_epochs=3, batch_size=None, loss_fn=mr.squared_loss))
    res = flower.run(lambda: mr.linear_model(10, seed=seed), clients, engine=flower.Engine("local"), **args)
    _, spy = mr.run_eavesdropped_fedavg(mr.linear_model(10, seed=seed), clients, **args)
    return clients, res.transcript, spy


def test_eavesdropped_pairs_are_chapter_4s_and_decode_the_local_optimum_exactly():
    """Chapter 4's Observation 1 federation in Flower: the pairs on each client's link are the ones chapter 4's
    Eavesdropper records on fedavg (fedavg normalises its weights in float32: about 2e-7 apart), d + 1 of them
    decode the local optimum to rounding error and d of them do not identify it."""
    from fedlab.attacks import model_reconstruction as mr

    clients, T, spy = _least_squares_run()
    for k in range(5):
        ti, to, rounds = fa.eavesdropped_pairs(T, k)
        ri, ro, rr = spy.observations(k)
        assert np.array_equal(rounds, rr) and ti.dtype == torch.float64 and ti.shape == (len(rr), 10)
        assert float((ti - ri).abs().max()) < 1e-6 and float((to - ro).abs().max()) < 1e-6
        reply = next(r for r in T.train_replies(int(rounds[0])) if r.partition_id == k)
        assert torch.equal(to[0], reply.params["weight"].reshape(-1))
        assert torch.equal(ti[0], T.globals[int(rounds[0]) - 1]["weight"].reshape(-1))
    star = torch.stack([mr.local_optimum(X, y) for X, y in clients])
    rec = fa.reconstruct_local_models(T, range(5), max_obs=11)
    assert rec.num_obs == 11 and rec.theta.shape == (5, 10) and all(rec.identifiable)
    assert float(((rec.theta - star).norm(dim=1) / star.norm(dim=1)).max()) < 1e-8
    assert torch.equal(rec.params(2)["weight"], rec.theta[2].reshape(1, 10))
    assert torch.equal(rec.last, rec.theta_out[:, -1])
    short = fa.reconstruct_local_models(T, [0, 1], max_obs=10)
    assert not any(short.identifiable) and float(((short.theta - star[:2]).norm(dim=1) / star[:2].norm(dim=1)).min()) > 0.1
    with pytest.raises(ValueError, match="method"):
        fa.reconstruct_local_models(T, 0, method="oracle")
    with pytest.raises(ValueError, match="partition 7"):
        fa.eavesdropped_pairs(T, 7)
    with pytest.raises(ValueError, match="max_obs"):
        fa.eavesdropped_pairs(T, 0, max_obs=0)
    with pytest.raises(ValueError, match="partitions"):
        fa.reconstruct_local_models(T, [])


def test_heuristic_on_the_transcript_is_algorithm_3_on_the_same_pairs():
    """method="heuristic" runs chapter 4b's Algorithm 3 on the transcript's pairs (first n of each client, one
    batch, the seed given): the same decoded models as reconstruct_heuristic on those pairs."""
    from fedlab.attacks import model_reconstruction as mr

    _, T, _ = _least_squares_run(num_rounds=20)
    rec = fa.reconstruct_local_models(T, [0, 3], method="heuristic", hidden=32, fit_max_iter=60, decode_max_iter=60, seed=3)
    n = rec.num_obs
    assert n == min(len(fa.eavesdropped_pairs(T, k)[2]) for k in (0, 3)) and rec.identifiable is None
    tin = torch.stack([fa.eavesdropped_pairs(T, k)[0][:n] for k in (0, 3)])
    tout = torch.stack([fa.eavesdropped_pairs(T, k)[1][:n] for k in (0, 3)])
    ref = mr.reconstruct_heuristic(tin, tout, hidden=32, fit_max_iter=60, decode_max_iter=60, seed=3)
    assert torch.allclose(rec.theta, ref.theta, atol=1e-10) and rec.mapping_loss.shape == (2,)


# ------------------------------------------------------------------------------------------------
# Flower's SecAgg+
# ------------------------------------------------------------------------------------------------
def test_secagg_transcript_holds_no_model_and_the_aggregate_is_fedavgs():
    """Under SecAgg+ the server receives four stages of messages, none with a model: the single-client attacks
    stop with ValueError; the masked models look uniform and are uncorrelated with the true models; the decoded
    global model is plain FedAvg's within SecAgg+'s rounding bound (and not equal to it: the rounding is
    there); the training losses travel in the clear."""
    from fedlab.experiments import chapter6 as ex

    victims, lenet = ex.fedsgd_clients(0, 4)
    args = dict(num_rounds=1, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=None), seed=0, engine=flower.Engine("local"))
    plain = flower.run(lenet, victims, **args).transcript
    T = flower.run(lenet, victims, aggregation=flower.SecAgg(), **args).transcript
    assert T.meta["secagg"] and T.meta["secagg_settings"]["max_weight"] == 1.0
    kinds = [r.kind for r in T.replies]
    assert kinds == [k for k in ("secagg-keys", "secagg-shares", "secagg-masked", "secagg-unmask") for _ in range(4)]
    assert T.train_replies() == [] and all(not any(v.is_floating_point() for v in r.params.values()) for r in T.replies)
    with pytest.raises(ValueError, match="no train reply"):
        fa.invert_gradients(lenet, T, input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match="partition 0 returned no model"):
        fa.membership_signals(lenet, T, 0, *victims[0])
    with pytest.raises(ValueError, match="returned no model"):
        fa.reconstruct_local_models(T, 0)
    bound = fa.secagg_error_bound(T)
    assert bound == pytest.approx(4 * 16 / 2 ** 22 / 4)            # m (2C / Q) / sum r_k, equal weights r_k = 1
    diff = ex.max_abs_difference(T.globals[1], plain.globals[1])
    assert 0 < diff <= bound, (diff, bound)
    u = ex.masked_uniformity(T, plain)
    assert abs(u["mean"] - 0.5) < 0.01 and u["ks"] < 0.03 and u["corr"] < 0.05, u
    masked = {r.partition_id: r for r in T.replies if r.kind == "secagg-masked"}
    for r in plain.train_replies(1):
        assert masked[r.partition_id].metrics["train-loss"] == pytest.approx(r.metrics["train-loss"], abs=1e-7)
        assert masked[r.partition_id].num_examples == r.num_examples == 1
    rows = ex.secagg_stages(T)
    assert [row["kind"] for row in rows][2] == "secagg-masked" and rows[2]["metrics"] == ["masked-weight", "partition-id", "train-loss"]
    assert "| `secagg-masked` |" in ex.secagg_markdown(rows)
    with pytest.raises(ValueError, match="not of a SecAgg"):
        fa.secagg_error_bound(plain)
    with pytest.raises(ValueError, match="no SecAgg"):
        ex.secagg_stages(plain)


def test_secagg_training_follows_fedavg_over_rounds():
    """Several rounds with unequal weights (12..20 examples, max_weight = the largest client) and client sampling:
    the SecAgg+ run follows fedavg to well below 1e-4 (4.5e-6 measured after 3 rounds of an equal-size run)."""
    from fedlab import fl, models
    from fedlab.experiments import chapter6 as ex

    fed = ex.membership_federation(0, num_clients=5, n_per_client=20)
    clients = [(fed.clients.X[k, :12 + 2 * k], fed.clients.y[k, :12 + 2 * k]) for k in range(5)]   # 12, 14, ..., 20
    mlp = lambda: models.mlp(64, (32,), 10, seed=0)  # noqa: E731
    args = dict(num_rounds=3, local=fl.LocalTraining(lr=0.3, local_epochs=2, batch_size=10), seed=0, client_fraction=0.8)
    T = flower.run(mlp, clients, engine=flower.Engine("local"), aggregation=flower.SecAgg(), **args).transcript
    ref = fl.fedavg(mlp(), clients, **args)
    assert ex.max_abs_difference(T.final_params, ref.params) < 1e-4
    assert all(len([r for r in T.replies if r.kind == "secagg-masked" and r.round == t]) == 4 for t in (1, 2, 3))
    assert T.meta["secagg_settings"]["max_weight"] == 20.0
    assert all(fa.secagg_error_bound(T, t) < 1e-4 for t in (1, 2, 3))


def test_imprint_through_the_secagg_aggregate():
    """Chapter 1b's imprint attack on one FedSGD round of 4 clients x 8 digits: without SecAgg+ Flower's round
    gives imprint_attack's recovery; under SecAgg+ with Flower's defaults at lr 0.1 the rounding buries it
    (0 digits, seeds 0-3); with lr 1000 and Q = 2^29 the server recovers the same digits as without (at seed 0;
    at seeds 15, 42 and 52 of 60 one to three digits end between 1e-4 and 1e-3, chapter 6b)."""
    from fedlab.attacks import imprint as imp
    from fedlab.experiments import chapter6 as ex

    clients, model_fn, X = ex.imprint_clients(0)
    assert len(clients) == 4 and X.shape == (32, 64) and clients[0][0].dtype == torch.float64
    args = dict(num_rounds=1, seed=0, engine=flower.Engine("local"))
    step = lambda lr: fl.LocalTraining(lr=lr, batch_size=None)   # noqa: E731  (one full-batch step)
    runs = {"plain": flower.run(model_fn, clients, local=step(0.1), **args).transcript}
    for name, lr, q in [("default", 0.1, 2 ** 22), ("chosen", 1000.0, 2 ** 29)]:
        runs[name] = flower.run(model_fn, clients, local=step(lr), aggregation=flower.SecAgg(quantization_range=q),
                                **args).transcript
    rows = ex.imprint_rows(runs, X)
    direct = imp.imprint_attack([x for x, _ in clients], [y for _, y in clients], model=model_fn(),
                                trap=imp.ImprintTrap(num_bins=256))
    assert rows["plain"]["rate"] == direct.rate > 0.5 and torch.equal(rows["plain"]["recovered"], direct.recovered)
    assert rows["default"]["rate"] == 0.0
    assert torch.equal(rows["chosen"]["recovered"], rows["plain"]["recovered"]) and rows["chosen"]["median_error"] < 1e-5
    res = fa.imprint_from_aggregate(runs["chosen"])
    assert res.error is None and res.rtol > 1e-8                # the occupancy threshold follows SecAgg+'s rounding
    assert "| chosen | $2^{29}$ | 1000 |" in ex.imprint_markdown(rows, 0.88)
    assert rows["plain"]["decoded"] == len(rows["plain"]["x"]) > 0
    assert ex.imprint_error_text(rows["chosen"]) == f"{rows['chosen']['median_error']:.1e}"
    worst = ex.imprint_worst_error(rows["chosen"], rows["plain"]["recovered"])
    assert worst == float(rows["chosen"]["error"][rows["plain"]["recovered"]].max()) < 1e-3
    assert ex.imprint_worst_error(rows["default"], rows["plain"]["recovered"]) > 1e-3      # buried: far off or none
    assert ex.imprint_worst_error(rows["chosen"], torch.zeros(len(X), dtype=torch.bool)) == 0.0
    with pytest.raises(ValueError, match="digits"):
        ex.imprint_worst_error(rows["chosen"], torch.ones(3, dtype=torch.bool))
    for name, T in runs.items():       # each row's per-digit errors are its own run's (06b asserts on them)
        own = fa.imprint_from_aggregate(T, X_true=X, tol=1e-4)
        assert torch.equal(rows[name]["error"], own.error) and rows[name]["error"].shape == (len(X),), name
        assert rows[name]["median_error"] == float(own.error.median())
    with pytest.raises(ValueError, match="no parameter"):
        fa.imprint_from_aggregate(runs["plain"], weight_name="fc.weight")


def test_imprint_rows_say_when_nothing_was_decoded():
    """Under SecAgg+ at a learning rate so small that no bias difference clears the rounding, the server decodes no
    vector: the median error is inf (a nearest vector over an empty set), and the page text and the table say "no
    vector decoded" instead (chapter 6b glued inf at seed 21, quick scale, where lr 0.1 decoded nothing)."""
    from fedlab.experiments import chapter6 as ex

    clients, model_fn, X = ex.imprint_clients(0)
    T = flower.run(model_fn, clients, local=fl.LocalTraining(lr=1e-4, batch_size=None), num_rounds=1, seed=0,
                   engine=flower.Engine("local"), aggregation=flower.SecAgg()).transcript
    row = ex.imprint_rows({"tiny": T}, X)["tiny"]
    assert row["decoded"] == 0 and row["rate"] == 0.0 and row["median_error"] == float("inf")
    assert ex.imprint_error_text(row) == "none: no vector decoded"
    table = ex.imprint_markdown({"tiny": row}, 0.88)
    assert "none: no vector decoded" in table and "inf" not in table


def test_secagg_arguments_are_checked():
    from fedlab.experiments import chapter6 as ex
    from fedlab.flower import apps

    victims, lenet = ex.fedsgd_clients(0, 4)
    run = lambda **kw: flower.run(lenet, victims, num_rounds=1, engine=flower.Engine("local"), **kw)  # noqa: E731
    with pytest.raises(ValueError, match="SecAgg\\+ cannot be combined with evaluate_clients"):
        run(aggregation=flower.SecAgg(), evaluate_clients=True)
    with pytest.raises(ValueError, match="aggregation must be None"):
        run(aggregation={"clipping_range": 1.0})
    with pytest.raises(ValueError, match="at least 2 clients"):
        run(aggregation=flower.SecAgg(), client_fraction=0.25)
    with pytest.raises(TypeError, match="shares"):
        flower.SecAgg(shares=3)
    with pytest.raises(ValueError, match="SecAgg.clipping_range"):
        flower.SecAgg(clipping_range=0.0)
    with pytest.raises(ValueError, match="SecAgg.client_mods"):
        flower.SecAgg(client_mods=[3])
    with pytest.raises(ValueError, match="wraps around"):
        run(aggregation=flower.SecAgg(quantization_range=2 ** 30))
    with pytest.raises(ValueError, match="modulus_range"):
        apps.secagg_config([5], modulus_range=3 * 2 ** 20)
    with pytest.raises(ValueError, match="max_weight"):
        apps.secagg_config([5, 40], max_weight=10)
    assert apps.secagg_config([5, 40])["max_weight"] == 40.0
    with pytest.raises(ValueError, match="dp_client_clipping"):
        apps.client_app(lenet, lambda pid, num: victims[pid], secagg=True, dp_client_clipping=True)


def test_item_sums_from_the_aggregate_are_chapter_2s_per_item_sums():
    """Chapter 2's recommender as Flower clients (chapter 6b's ItemScores): one round without SecAgg+ returns
    exactly Protocol 1's item deltas (R = 1, B = N) and the per-item sums of secure_aggregate_items; under
    SecAgg+ the server's sums stay within m x secagg_error_bound of them, and every row above that bound is
    an item some client rated."""
    from fedlab.attacks import identifiability as pac
    from fedlab.experiments import chapter6 as ex
    from fedlab.fl.recsys import ratings as rec

    fed = ex.item_federation(1, cohort_size=4, num_users=40, num_rounds=5)
    m, N, I = 4, fed.data.num_rated, fed.data.num_items
    args = dict(num_rounds=1, local=fl.LocalTraining(lr=fed.lr, batch_size=None, loss_fn=fed.loss_fn), seed=1, engine=flower.Engine("local"))
    plain = flower.run(fed.model_fn, fed.clients, **args).transcript
    T = flower.run(fed.model_fn, fed.clients, aggregation=flower.SecAgg(clipping_range=fed.clipping_range),
                   **args).transcript
    U, items, y = fed.honest.user_vectors[fed.users], fed.data.items[fed.users], fed.data.y[fed.users]
    _, deltas = rec.protocol1_client_update(U, fed.honest.item_vectors, items, y, local_steps=1, batch_size=N,
                                            lr=0.3, loss="log")
    dense = rec.to_dense(deltas, items, I)                                            # [m, I, k]
    V0 = plain.globals[0]["item_vectors"]
    for r in plain.train_replies(1):                                                  # each reply is Protocol 1's
        assert float((r.params["item_vectors"] - V0 - dense[r.partition_id]).abs().max()) < 1e-12
    exact = pac.secure_aggregate_items(deltas, items, I, m)[0]
    counts = pac.secure_aggregate_items(rec.touched_items(deltas)[..., None].double(), items, I, m)[0, :, 0]
    clear = fa.item_sums_from_aggregate(plain)
    assert clear.cohort == [0, 1, 2, 3] and clear.num_examples == [N] * 4 and clear.bound < 1e-12
    assert float((clear.sums - exact).abs().max()) <= clear.bound
    assert not bool((clear.readable & (counts == 0)).any()) and int(clear.readable.sum()) >= int((counts > 0).sum()) - 5
    sa = fa.item_sums_from_aggregate(T)
    assert sa.bound == pytest.approx(m * fa.secagg_error_bound(T)) and 1e-6 < sa.bound < 1e-3
    assert float((sa.sums - exact).abs().max()) <= sa.bound
    assert not bool((sa.readable & (counts == 0)).any()) and int(sa.readable.sum()) > 0
    assert float((sa.sums - clear.sums).abs().max()) > 0                             # the rounding is really there
    with pytest.raises(ValueError, match="no parameter"):
        fa.item_sums_from_aggregate(T, name="fc.weight")
    with pytest.raises(ValueError, match="round"):
        fa.item_sums_from_aggregate(T, round=2)
    chk = ex.item_sums_check(fed, sa, seed=1)
    assert chk["single"] == chk["single_counted"] == int((counts == 1).sum())
    assert chk["false_rows"] == 0 and chk["max_error"] <= chk["bound"] and chk["exposed"] <= chk["exposed_exact"]
