"""Chapter 0's experiment helpers (fedlab.experiments.chapter0): the step size of each method tuned on
held-out validation data, the client-fraction table of McMahan et al. (Table 1), the tuned step sizes passed
through to the FedSGD / FedAvg comparison and the local-work grid, the DSSGD sweep, the settings table, and the
ValueErrors they raise on bad arguments."""
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from fedlab import data, fl, metrics
from fedlab.experiments import chapter0 as ch0

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


class _Run:
    """Stands in for fedlab.records.Run: quotes a stored value by name."""

    def stored(self, name, digits=3, *, scale_factor=1.0, value_range=None):
        return f"paper:{name}"


@pytest.mark.slow
def test_tuning_scores_each_lr_on_validation_data_never_on_test(digits_setup):
    net, w0, train, _, _ = digits_setup
    tuned = ch0.tune_learning_rates(net, train, params=w0, lrs=(1.0, 0.01), num_rounds=2, num_clients=4, seed=0)
    assert list(tuned["scores"]) == list(ch0.METHODS)
    # the score is the mean validation accuracy of rounds 1..R of the very run fl.fedavg makes
    fit, val = data.train_test_split(train, test_fraction=0.2, seed=0)
    cd = fl.stack_clients(data.client_datasets(fit, data.partition_iid(len(fit), 4, seed=0)))
    h = fl.fedavg(net, cd, num_rounds=2, local=fl.LocalTraining(lr=1.0, local_epochs=1, batch_size=None), params=w0, seed=0,
                  eval_data=val).history
    assert tuned["scores"]["FedSGD"][1.0] == pytest.approx(np.mean(h["accuracy"][1:]))
    for method, sc in tuned["scores"].items():
        assert set(sc) == {0.01, 1.0}
        assert tuned["chosen"][method] == max(sc, key=sc.get)
    # validation and fitting parts are disjoint and both come from train: the test set is never used
    assert len(fit) + len(val) == len(train)
    table = ch0.lr_table(tuned)
    assert table.count("*") == 2 and "| 0.01 |" in table


def test_tuning_breaks_ties_towards_the_smaller_step(digits_setup, monkeypatch):
    net, w0, train, _, _ = digits_setup

    class _H:
        history = {"round": [0, 1], "accuracy": [0.1, 0.5]}

    # every run (fl.fedavg per method and step size, advanced together by fedlab.fl.stacked) scores the same
    monkeypatch.setattr(ch0.stacked, "fedavg_runs", lambda model, runs, **k: [_H() for _ in runs])
    tuned = ch0.tune_learning_rates(net, train, params=w0, lrs=(0.3, 0.1, 1.0), num_rounds=1, seed=0)
    assert tuned["chosen"] == {m: 0.1 for m in ch0.METHODS}


@pytest.mark.slow
def test_the_comparison_and_the_grid_run_with_the_given_step_sizes(digits_setup):
    net, w0, _, test, clients = digits_setup
    lrs = {"FedSGD": 0.7, "FedAvg E=5, B=10": 0.02}
    curves = ch0.fedsgd_vs_fedavg(net, clients, params=w0, eval_data=test, num_rounds=2, seed=0, lrs=lrs)
    sgd = fl.fedsgd(net, clients["iid"], num_rounds=2, lr=0.7, params=w0, seed=0, eval_data=test).history
    avg = fl.fedavg(net, clients["iid"], num_rounds=2, local=fl.LocalTraining(lr=0.02, local_epochs=5, batch_size=10), params=w0, seed=0,
                    eval_data=test).history
    assert curves[("iid", "FedSGD")]["accuracy"] == sgd["accuracy"]
    assert curves[("iid", "FedAvg E=5, B=10")]["accuracy"] == avg["accuracy"]
    grid = ch0.local_work_grid(net, clients, curves, params=w0, eval_data=test, num_rounds=1, seed=0, lrs=lrs)
    e5_full = fl.fedavg(net, clients["iid"], num_rounds=1, local=fl.LocalTraining(lr=0.7, local_epochs=5, batch_size=None), params=w0,
                        seed=0, eval_data=test).history
    e1_b50 = fl.fedavg(net, clients["iid"], num_rounds=1, local=fl.LocalTraining(lr=0.02, local_epochs=1, batch_size=50), params=w0,
                       seed=0, eval_data=test).history
    assert grid[("iid", 5, None)]["accuracy"] == e5_full["accuracy"]
    assert grid[("iid", 1, 50)]["accuracy"] == e1_b50["accuracy"]


def test_client_fraction_zero_is_one_client_per_round(digits_setup):
    net, w0, train, test, _ = digits_setup
    lrs = {"FedSGD": 0.5, "FedAvg E=5, B=10": 0.1}
    rounds = ch0.client_fraction_rounds(net, train, params=w0, eval_data=test, num_clients=20, target=0.3,
                                        num_rounds=6, lrs=lrs, fractions=(0.0, 0.05, 1.0), seed=0)
    assert set(rounds) == {(s, B, C) for s in ("iid", "non-iid") for B in (None, 10) for C in (0.0, 0.05, 1.0)}
    # with K = 20, C = 0 and C = 0.05 both mean m = 1 client: the same run
    for s in ("iid", "non-iid"):
        for B in (None, 10):
            assert rounds[(s, B, 0.0)] == rounds[(s, B, 0.05)]
    # one cell against a direct run of fl.fedavg
    parts = data.partition_label_skew(train.y, 20, classes_per_client=2, seed=0)
    cd = fl.stack_clients(data.client_datasets(train, parts))
    h = fl.fedavg(net, cd, num_rounds=6, client_fraction=1.0, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=10), params=w0,
                  seed=0, eval_data=test).history
    assert rounds[("non-iid", 10, 1.0)] == metrics.rounds_to_accuracy(h, 0.3)
    table = ch0.client_fraction_table(rounds, 6)
    assert table.splitlines()[0].startswith("| C | iid, B = ∞ | iid, B = 10 |")
    assert len(table.splitlines()) == 2 + 3


def test_client_fraction_table_marks_misses_and_speedups():
    rounds = {("iid", None, 0.0): None, ("iid", None, 1.0): 5, ("iid", 10, 0.0): 40, ("iid", 10, 1.0): 10}
    table = ch0.client_fraction_table(rounds, 100)
    assert "> 100" in table and "10 (4.0×)" in table and "| 5 |" in table


@pytest.mark.parametrize("call, name", [
    (lambda s: ch0.tune_learning_rates(s[0], s[2], params=s[1], lrs=(), num_rounds=1), "lrs"),
    (lambda s: ch0.tune_learning_rates(s[0], s[2], params=s[1], lrs=(0.1, -1.0), num_rounds=1), "lrs"),
    (lambda s: ch0.tune_learning_rates(s[0], s[2], params=s[1], lrs=(0.1,), num_rounds=0), "num_rounds"),
    (lambda s: ch0.tune_learning_rates(s[0], s[2], params=s[1], lrs=(0.1,), num_rounds=1, val_fraction=1.0),
     "val_fraction"),
    (lambda s: ch0.lr_table({"scores": {}}), "tuned"),
    (lambda s: ch0.fedsgd_vs_fedavg(s[0], s[4], params=s[1], eval_data=s[3], num_rounds=1, lrs={"FedSGD": 0.1}),
     "lrs"),
    (lambda s: ch0.fedsgd_vs_fedavg(s[0], s[4], params=s[1], eval_data=s[3], num_rounds=1,
                                    lrs={"FedSGD": 0.1, "FedAvg E=5, B=10": 0.0}), "lrs"),
    (lambda s: ch0.client_fraction_rounds(s[0], s[2], params=s[1], eval_data=s[3], num_clients=10, target=0.5,
                                          num_rounds=1, lrs=ch0.DEFAULT_LRS, fractions=(1.5,)), "fractions"),
    (lambda s: ch0.client_fraction_rounds(s[0], s[2], params=s[1], eval_data=s[3], num_clients=10, target=0.0,
                                          num_rounds=1, lrs=ch0.DEFAULT_LRS), "target"),
    (lambda s: ch0.client_fraction_rounds(s[0], s[2], params=s[1], eval_data=s[3], num_clients=10, target=0.5,
                                          num_rounds=1, lrs={}), "lrs"),
    (lambda s: ch0.client_fraction_rounds(s[0], s[2], params=s[1], eval_data=s[3], num_clients=0, target=0.5,
                                          num_rounds=1, lrs=ch0.DEFAULT_LRS), "num_clients"),
    (lambda s: ch0.client_fraction_table({}, 10), "rounds"),
])
def test_tuning_and_client_fraction_helpers_reject_bad_arguments(digits_setup, call, name):
    with pytest.raises(ValueError, match=name):
        call(digits_setup)


@pytest.mark.slow
def test_fedsgd_vs_fedavg_and_the_grid_reuse_its_corners(digits_setup):
    net, w0, _, test, clients = digits_setup
    curves = ch0.fedsgd_vs_fedavg(net, clients, params=w0, eval_data=test, num_rounds=3, seed=0)
    assert list(curves) == [("iid", "FedSGD"), ("iid", "FedAvg E=5, B=10")]
    again = fl.fedsgd(net, clients["iid"], num_rounds=3, lr=0.5, params=w0, seed=0, eval_data=test).history
    assert curves[("iid", "FedSGD")]["accuracy"] == again["accuracy"]
    grid = ch0.local_work_grid(net, clients, curves, params=w0, eval_data=test, num_rounds=2, seed=0)
    assert set(grid) == {("iid", E, B) for E in (1, 5) for B in (10, 50, None)}
    assert grid[("iid", 1, None)]["accuracy"] == curves[("iid", "FedSGD")]["accuracy"][:3]   # rounds 0..2
    assert all(len(h["accuracy"]) == 3 for h in grid.values())
    ch0.plot_rounds(curves)
    ch0.plot_local_work_grid(grid)
    ch0.plot_grid_curve(grid, "iid", 1, "50")
    with pytest.raises(ValueError, match="batch_size"):
        ch0.plot_grid_curve(grid, "iid", 5, "20")


def test_dssgd_sweep_order_and_keys(digits_setup):
    net, w0, _, test, clients = digits_setup
    dssgd = ch0.dssgd_sweep(net, clients["iid"], params=w0, eval_data=test, num_rounds=1, threshold=1e-3,
                            upload_fractions=(1.0, 0.1), seed=0)
    assert list(dssgd) == [("largest", 1.0), ("largest", 0.1), ("random", 1.0), ("random", 0.1)]
    ch0.plot_dssgd(dssgd, standalone=0.5)


def test_settings_table_quotes_the_record():
    acc = {"centralized": {"iid": 0.9, "non-iid": 0.9}, "standalone (mean client)": {"iid": 0.8, "non-iid": 0.2},
           "FedAvg": {"iid": 0.88, "non-iid": 0.7}}
    table = ch0.settings_table(acc, _Run()).data
    assert "| standalone (mean client) | 0.800 | 0.200 | paper:standalone_iid | paper:standalone_noniid |" in table
    with pytest.raises(ValueError, match="acc"):
        ch0.settings_table({"FedAvg": acc["FedAvg"]}, _Run())


@pytest.mark.parametrize("call, name", [
    (lambda s: ch0.compare_settings(*s[:1], s[2], s[4], params=s[1], eval_data=s[3], num_rounds=0, num_epochs=1),
     "num_rounds"),
    (lambda s: ch0.compare_settings(*s[:1], s[2], s[4], params=s[1], eval_data=s[3], num_rounds=1, num_epochs=1.5),
     "num_epochs"),
    (lambda s: ch0.compare_settings(*s[:1], s[2], {}, params=s[1], eval_data=s[3], num_rounds=1, num_epochs=1),
     "clients"),
    (lambda s: ch0.dssgd_sweep(s[0], s[4]["iid"], params=s[1], eval_data=s[3], num_rounds=1, threshold=-1.0),
     "threshold"),
    (lambda s: ch0.dssgd_sweep(s[0], s[4]["iid"], params=s[1], eval_data=s[3], num_rounds=1, threshold=0.0,
                               upload_fractions=(0.0,)), "upload_fractions"),
    (lambda s: ch0.local_work_grid(s[0], s[4], {}, params=s[1], eval_data=s[3], num_rounds=0), "num_rounds"),
])
def test_comparison_dssgd_and_grid_helpers_reject_bad_arguments(digits_setup, call, name):
    with pytest.raises(ValueError, match=name):
        call(digits_setup)
