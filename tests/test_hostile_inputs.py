"""Inputs of the hostile-input review (shared/reviews/hostile-inputs.md) that gave a silent wrong answer
or a confusing error: each now gives the right answer or a ValueError naming the argument. The review's
row id is in each test's comment."""
import warnings
import zipfile

import pytest
import torch

from fedlab import config, fl, models
from fedlab import data as D
from fedlab.fl.dp_fedavg import DPSettings, dp_fedavg
from fedlab._checks import finite_positive, finite_tensor, whole_int


def _clients(sizes=(6, 5, 7, 4), d=5, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [D.Dataset(torch.randn(n, d, generator=g), torch.randint(0, C, (n,), generator=g)) for n in sizes]


def _eval(d=5, C=3, n=20):
    g = torch.Generator().manual_seed(9)
    return D.Dataset(torch.randn(n, d, generator=g), torch.arange(n) % C)


def _net(d=5, C=3):
    return models.mlp(d, (4,), C, seed=1)


# ------------------------------------------------------------------ the shared validators
def test_checks_name_the_argument():
    assert whole_int("k", 3.0) == 3 and finite_positive("lr", 0.5) == 0.5
    for bad in (2.5, True, "3", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="k must be an integer"):
            whole_int("k", bad)
    for bad in (0, -1, float("inf"), float("nan"), True, "1.0"):
        with pytest.raises(ValueError, match="lr must be a finite number > 0"):
            finite_positive("lr", bad)
    finite_tensor("x", torch.arange(3))                       # integer tensors always pass
    with pytest.raises(ValueError, match=r"params\['w'\] holds NaN"):
        finite_tensor("params", {"b": torch.zeros(2), "w": torch.tensor([1.0, float("nan")])})


# ------------------------------------------------------------------ FL: silent wrong answers
def test_fedavg_with_an_infinite_lr_raises_naming_lr():                               # F1
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        fl.fedavg(_net(), _clients(), num_rounds=2, local=fl.LocalTraining(lr=float("inf")), eval_data=_eval())
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        fl.fedavg(_net(), _clients(), num_rounds=2, local=fl.LocalTraining(lr=float("nan")))


def test_fedavg_that_diverges_raises_naming_lr_instead_of_reporting_accuracy():       # F1, F30
    clients = [D.Dataset(c.X * 1e3, c.y) for c in _clients()]
    with pytest.raises(ValueError, match=r"(after round \d+ .*|on X .*)lower (lr|the learning rate)"):
        fl.fedavg(_net(), clients, num_rounds=30, local=fl.LocalTraining(lr=1e6, batch_size=None), eval_data=_eval())


def test_fedavg_with_one_nan_feature_raises_naming_the_data():                        # F4
    clients = _clients()
    clients[1].X[2, 3] = float("nan")
    with pytest.raises(ValueError, match="clients' X holds NaN"):
        fl.fedavg(_net(), clients, num_rounds=1, eval_data=_eval())
    with pytest.raises(ValueError, match="clients' X holds NaN"):
        dp_fedavg(_net(), clients, num_rounds=1,
                  dp=DPSettings(noise_multiplier=0.0, clip_norm=1.0, sampling_prob=1.0))


def test_evaluate_refuses_nan_logits_and_empty_data():                                # F30
    net = _net()
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    ev = _eval()
    assert 0 <= fl.evaluate(net, params, ev.X, ev.y)["accuracy"] <= 1
    bad = {k: v.clone() for k, v in params.items()}
    bad["net.0.weight" if "net.0.weight" in bad else next(iter(bad))].fill_(float("nan"))
    with pytest.raises(ValueError, match="params.*NaN"):
        fl.evaluate(net, bad, ev.X, ev.y)
    X = ev.X.clone()
    X[0, 0] = float("inf")
    with pytest.raises(ValueError, match="X holds NaN or infinite"):
        fl.evaluate(net, params, X, ev.y)
    with pytest.raises(ValueError, match="same number >= 1"):
        fl.evaluate(net, params, ev.X[:0], ev.y[:0])


def test_dp_fedavg_with_an_infinite_server_lr_raises_naming_it():                     # F22, F22b, F23
    dp = dict(noise_multiplier=1.0, clip_norm=1.0, sampling_prob=1.0)
    for kw, name in ((lambda: {"dp": DPSettings(**dp, server_lr=float("inf"))}, "server_lr"),
                     (lambda: {"dp": DPSettings(**dp), "local": fl.LocalTraining(lr=float("inf"))}, "lr")):
        for rounds in (1, 2):
            with pytest.raises(ValueError, match=f"^{name} must be a finite number > 0"):
                dp_fedavg(_net(), _clients(), num_rounds=rounds, **kw())
    with pytest.raises(ValueError, match="after round 1.*server_lr"):                  # finite, but overflows
        dp_fedavg(_net(), _clients(), num_rounds=1, dp=DPSettings(**dp, server_lr=1e308))


def test_labels_outside_the_classes_raise_naming_y():                                 # F5, F6
    for label in (7, -100):
        clients = _clients()
        clients[0].y[1] = label
        with pytest.raises(ValueError, match=r"y: labels must lie in 0\.\.2"):
            fl.fedavg(_net(), clients, num_rounds=1)
    X, y = _clients()[0].X, _clients()[0].y.clone()
    y[0] = 3
    with pytest.raises(ValueError, match=r"y: labels must lie in 0\.\.2"):
        fl.client_update(_net(), dict(_net().named_parameters()), X, y, local=fl.LocalTraining(lr=0.1, batch_size=None))


def test_a_dtype_or_shape_the_model_does_not_take_raises_a_value_error():             # F8, F9, F19
    with pytest.raises(ValueError, match="cannot be applied to X.*float64"):
        fl.fedavg(_net(), [D.Dataset(c.X.double(), c.y) for c in _clients()], num_rounds=1)
    with pytest.raises(ValueError, match=r"cannot be applied to X.*shape \(4,\)"):
        fl.fedavg(_net(), _clients(d=4), num_rounds=1)
    p64 = {k: v.detach().double() for k, v in _net().named_parameters()}
    with pytest.raises(ValueError, match="cannot be applied to X.*params dtype torch.float64"):
        fl.fedavg(_net(), _clients(), num_rounds=1, params=p64)


def test_meta_tensors_raise_a_value_error():                                          # F21
    clients = fl.stack_clients(_clients())
    meta = fl.ClientData(clients.X.to("meta"), clients.y.to("meta"), clients.n)
    with pytest.raises(ValueError, match="meta tensors"):
        fl.clients_update(_net(), dict(_net().named_parameters()), meta, local=fl.LocalTraining(lr=0.1, batch_size=None))


def test_a_fractional_batch_size_raises():                                            # F15
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        fl.fedavg(_net(), _clients(), num_rounds=1, local=fl.LocalTraining(batch_size=2.7))
    # 2.0 is a whole number and gives the same run as 2
    a = fl.fedavg(_net(), _clients(), num_rounds=1, local=fl.LocalTraining(batch_size=2.0)).params
    b = fl.fedavg(_net(), _clients(), num_rounds=1, local=fl.LocalTraining(batch_size=2)).params
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ secure aggregation
def test_secure_sum_needs_integer_bits():                                             # SA6, SA6b
    from fedlab.privacy.secure_aggregation import secure_sum

    ones = torch.ones(2, 2)
    assert torch.allclose(secure_sum(ones, frac_bits=2), torch.full((2,), 2.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="frac_bits must be an integer, got 2.5"):
        secure_sum(ones, frac_bits=2.5)
    with pytest.raises(ValueError, match="modulus_bits must be an integer, got 40.5"):
        secure_sum(ones, modulus_bits=40.5)


# ------------------------------------------------------------------ seeds
def test_seed_everything_names_the_seed_out_of_range(monkeypatch):                    # X1, X3
    config.seed_everything(2**64 - 1)                                                   # torch's largest seed
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\^64\)"):
            config.seed_everything(bad)
    with pytest.raises(ValueError, match="seed must be an integer, got 1.5"):
        config.seed_everything(1.5)
    monkeypatch.setenv("FEDLAB_SEED", "1" * 30)
    with pytest.raises(ValueError, match="FEDLAB_SEED must be an integer in"):
        config.seed_everything()


def test_fedlab_data_with_an_unknown_user_names_the_variable(monkeypatch):            # D3c
    monkeypatch.setenv("FEDLAB_DATA", "~nosuchuser_fedlab_xyz/x")
    with pytest.raises(ValueError, match="FEDLAB_DATA"):
        config.data_dir(create=False)


# ------------------------------------------------------------------ data loaders
LETOR = ("2 qid:1 1:0.5 2:0.1 46:0.732\n0 qid:1 1:0.1 2:0.9 46:0.237\n"
         "1 qid:2 1:0.3 2:0.2 46:0.5\n0 qid:2 1:0.7 2:0.4 46:0.25\n")


def test_a_truncated_mq2007_split_raises_and_an_unverified_one_says_so(tmp_path):     # D4c
    from fedlab.data.download import ChecksumError, UnverifiedDataWarning, sha256sum
    from fedlab.data.letor import load_letor

    path = tmp_path / "MQ2007" / "Fold1" / "train.txt"
    path.parent.mkdir(parents=True)
    path.write_text(LETOR)
    with pytest.warns(UnverifiedDataWarning, match="NOT verified"):
        full = load_letor("MQ2007", cache_dir=tmp_path)
    assert full.X[0, 1, 45] == pytest.approx(0.237)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_letor("MQ2007", cache_dir=tmp_path, sha256=sha256sum(path))              # verified: no warning
    with pytest.raises(ChecksumError):
        load_letor("MQ2007", cache_dir=tmp_path, sha256="0" * 64)
    path.write_text(LETOR[:-4])                                                         # cut to '46:0.'
    with pytest.warns(UnverifiedDataWarning), pytest.raises(ValueError, match="looks truncated"):
        load_letor("MQ2007", cache_dir=tmp_path)


def test_a_truncated_cms_csv_raises_instead_of_dropping_rows(tmp_path):              # D4d
    from fedlab.data import clustered
    from fedlab.data.download import UnverifiedDataWarning

    cond = clustered.CMS_CONDITIONS[0]
    lines = ["DRG Definition,Provider Id,Provider Zip Code,Average Total Payments"]
    lines += [f'"{cond}",{100 + i},{10000 + i},"$1,{i:03d}.00"' for i in range(6)]
    path = tmp_path / "cms.csv"
    path.write_text("\n".join(lines) + "\n\n")
    with pytest.warns(UnverifiedDataWarning, match="NOT verified"):
        clients, ids = clustered.load_cms_inpatient(path)
    assert len(ids) == 6
    path.write_text("\n".join(lines)[:-12] + "\n")                                     # the last row cut short
    with pytest.warns(UnverifiedDataWarning), pytest.raises(ValueError, match="line 7.*truncated"):
        clustered.load_cms_inpatient(path)


def test_fetch_refuses_dot_names(tmp_path):                                           # D5b
    from fedlab.data.download import fetch

    for name in ("..", "."):
        with pytest.raises(ValueError, match="filename must be a plain file name"):
            fetch("http://127.0.0.1:9/x", name, "0" * 64, download=True, cache_dir=tmp_path)


def test_concurrent_extractions_of_one_split_never_share_a_temporary_file(tmp_path):   # D7
    # two processes loading MSLR on a fresh cache once both wrote "train.part" and one crashed on the rename;
    # now each writes a temporary file of its own (threads here stand in for the processes: the old shared
    # name fails this test)
    import threading

    from fedlab.data.download import ChecksumError, sha256sum
    from fedlab.data.letor import _extract_member, load_letor

    text = "".join(f"{q % 5} qid:{q} 1:{q / 7:.3f} 136:0.5\n" for q in range(1, 20001))
    zpath = tmp_path / "MSLR-WEB10K.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("Fold1/train.txt", text)
    errors = []
    for trial in range(5):
        target = tmp_path / f"cache{trial}" / "MSLR-WEB10K" / "Fold1" / "train.txt"
        barrier = threading.Barrier(6)

        def run():
            barrier.wait()
            try:
                _extract_member(zpath, "Fold1/train.txt", target)
            except Exception as exc:                                   # noqa: BLE001 - collected
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert target.read_text() == text
        assert sorted(p.name for p in target.parent.iterdir()) == ["train.txt", "train.txt.sha256"]  # no temp left
    # the digest recorded at extraction is checked by default: a split cut short afterwards is caught
    cache = tmp_path / "cache0"
    (cache / "MSLR-WEB10K.zip").write_bytes(zpath.read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_letor("MSLR-WEB10K", cache_dir=cache, archive_sha256=sha256sum(zpath)).X.shape[0] == 20000
    target = cache / "MSLR-WEB10K" / "Fold1" / "train.txt"
    target.write_text(text[:1000])
    with pytest.raises(ChecksumError):
        load_letor("MSLR-WEB10K", cache_dir=cache, archive_sha256=sha256sum(zpath))


# ------------------------------------------------------------------ accounting, attacks, metrics
def test_dp_accounting_arguments_are_named():                                         # P10g, P10i, P10k
    from fedlab.privacy import dp_fedavg as dpa

    with pytest.raises(ValueError, match="num_rounds must be a positive integer, got True"):
        dpa.epsilon_spent(1.0, 0.1, True, 1e-5)
    with pytest.raises(ValueError, match="epsilon=10000 is so large"):
        dpa.noise_multiplier_for_epsilon(1e4, 0.1, 10, 1e-5)
    assert 0.05 <= dpa.noise_multiplier_for_epsilon(10.0, 0.1, 10, 1e-5, safe=False) < 1.0   # an ordinary call works
    # the safe default claims no amplification by sampling: ten full Gaussian rounds at epsilon 10
    assert 1.0 < dpa.noise_multiplier_for_epsilon(10.0, 0.1, 10, 1e-5) < 2.0
    for z in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="noise_multiplier must be finite and >= 0"):
            dpa.dp_aggregate({"w": torch.ones(2, 3)}, clip_norm=1.0, noise_multiplier=z, expected_clients=2.0)


def test_idlg_label_refuses_a_nan_gradient():                                         # F29
    from fedlab.attacks.gradient_inversion import idlg_label

    g = torch.tensor([[0.2, 0.1], [-0.5, -0.3], [0.3, 0.2]])
    assert idlg_label(g) == 1
    g[2, 0] = float("nan")
    with pytest.raises(ValueError, match="observed: .*NaN"):
        idlg_label(g)
    with pytest.raises(ValueError, match="observed: .*NaN"):
        idlg_label({"fc.weight": g, "fc.bias": torch.zeros(3)})


def test_roc_auc_needs_0_1_labels():                                                  # M2
    from fedlab.metrics import roc_auc

    assert roc_auc([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]) == 1.0
    assert roc_auc([False, True], [0.2, 0.1]) == 0.0
    with pytest.raises(ValueError, match="labels must be 0/1"):
        roc_auc([1, 2, 2, 1], [0.1, 0.9, 0.8, 0.3])
