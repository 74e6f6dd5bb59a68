"""Chapter 1c's defenses, now chapter 1d's page (issue 16, item 6): delta of client-level DP checked against 1/K, the
chapter's delta below 1/K at every K it uses (both scales), and the budget sweep of local-only
training, DP-FedAvg + fine-tuning and Centaur (fedlab.experiments.chapter1c)."""
import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlab
from fedlab import fl, models
from fedlab.experiments import chapter1c as ch1c
from fedlab.fl.dp_fedavg import DPSettings
from fedlab.privacy import dp_fedavg as dpf

torch.set_num_threads(1)
NOTEBOOK = Path(__file__).resolve().parents[1] / "chapters" / "01d_membership_defenses.ipynb"   # the defenses' page


# ------------------------------------------------------------------ delta against 1/K
@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, 1.5, float("nan")])
def test_delta_outside_0_1_is_rejected(bad):
    with pytest.raises(ValueError, match="delta"):
        dpf.check_delta(bad)
    with pytest.raises(ValueError, match="delta"):
        dpf.epsilon_spent(1.0, 0.1, 10, bad)
    with pytest.raises(ValueError, match="delta"):
        dpf.noise_multiplier_for_epsilon(1.0, 0.1, 10, bad)


def test_delta_not_below_one_over_K_is_rejected_when_K_is_given():
    # the case: delta = 1e-3 with K = 1000 clients is not a meaningful guarantee
    with pytest.raises(ValueError, match="1/num_clients"):
        dpf.check_delta(1e-3, 1000)
    with pytest.raises(ValueError, match="1/num_clients"):
        dpf.noise_multiplier_for_epsilon(1.0, 0.3, 100, 1e-3, num_clients=1000)
    with pytest.raises(ValueError, match="1/num_clients"):
        dpf.epsilon_spent(2.0, 0.3, 100, 2e-3, num_clients=1000)
    with pytest.raises(ValueError, match="num_clients"):
        dpf.check_delta(1e-5, 0)
    assert dpf.check_delta(9.99e-4, 1000) == 9.99e-4
    # without K the accountant is unchanged: the same epsilon with or without a valid num_clients
    assert dpf.epsilon_spent(2.0, 0.3, 50, 1e-5) == dpf.epsilon_spent(2.0, 0.3, 50, 1e-5, num_clients=1000)


def test_delta_for_is_one_over_10K_and_validates():
    for K in (1, 10, 300, 1000, 763_430):
        d = dpf.delta_for(K)
        assert d == pytest.approx(1 / (10 * K)) and d < 1 / K
        dpf.check_delta(d, K)
    assert dpf.delta_for(100, factor=100) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="num_clients"):
        dpf.delta_for(0)
    with pytest.raises(ValueError, match="factor"):
        dpf.delta_for(10, factor=1.0)


def test_smaller_delta_needs_more_noise():
    z_loose = dpf.noise_multiplier_for_epsilon(1.0, 0.3, 20, 1e-3)
    z_tight = dpf.noise_multiplier_for_epsilon(1.0, 0.3, 20, dpf.delta_for(300), num_clients=300)
    assert z_tight > z_loose


def test_dp_grid_rejects_delta_not_below_one_over_K_before_training():
    with pytest.raises(ValueError, match="1/num_clients"):
        ch1c.DPGrid(client_counts=[10, 2000], epsilons=[1.0], delta=1e-3, clip_norm=1.0, n_per_client=2)


def _chapter_settings(scale, monkeypatch):
    """The DP settings of the chapter as its cells set them, at ``scale``: run the assignment lines of
    the notebook that define K and delta (nothing else) with ``fedlab.pick`` at that scale."""
    monkeypatch.setenv("FEDLAB_SCALE", scale)
    nb = json.loads(NOTEBOOK.read_text())
    wanted = re.compile(r"^(K_DEMO|DELTA_DEMO|CLIENT_COUNTS|DELTA|P_CLIENTS|DELTA_P)\b.*=")
    lines = [ln for c in nb["cells"] if c["cell_type"] == "code" for ln in "".join(c["source"]).splitlines()
             if wanted.match(ln)]
    ns = {"fedlab": fedlab, "dpf": dpf}
    exec("\n".join(lines), ns)      # noqa: S102 - the notebook's own assignments
    return ns


@pytest.mark.parametrize("scale", ["quick", "paper"])
def test_the_chapters_delta_is_below_one_over_K_for_every_K_it_uses(scale, monkeypatch):
    ns = _chapter_settings(scale, monkeypatch)
    pairs = [(ns["DELTA_DEMO"], ns["K_DEMO"]), (ns["DELTA_P"], ns["P_CLIENTS"])]
    pairs += [(ns["DELTA"], K) for K in ns["CLIENT_COUNTS"]]
    for delta, K in pairs:
        assert 0 < delta <= 1 / (10 * K) < 1 / K, (delta, K)
    assert ns["P_CLIENTS"] == (1000 if scale == "paper" else 200)


# ------------------------------------------------------------------ budget sweep (Centaur vs the others)
SMALL_DP = DPSettings(noise_multiplier=1.0, clip_norm=0.2, sampling_prob=0.5, server_lr=3.0, safe=False)
SMALL_TRAIN = dict(local=fl.LocalTraining(lr=0.2, batch_size=5), seed=0,
                   schedule=ch1c.PersonalizationSchedule(local_only_epochs=2, finetune_epochs=2, head_epochs=2,
                                                     final_head_epochs=2))
SMALL = dict(task=ch1c.PersonalizationTask(num_clients=24), num_rounds=2, dp=SMALL_DP, **SMALL_TRAIN)


def _net():
    net = models.mlp(64, (4,), 10, seed=0)
    return net, models.get_params(net)


def test_personalization_sweep_runs_a_subset_of_methods():
    net, w0 = _net()
    args = {k: v for k, v in SMALL.items()}
    full, diag, _ = ch1c.personalization_sweep(net, w0, [5], **args)
    part, diag_p, _ = ch1c.personalization_sweep(net, w0, [5], methods=["Centaur"], **args)
    assert set(full) == set(ch1c.PERSONALIZATION_METHODS) and set(part) == {"Centaur"}
    assert part["Centaur"][5] == full["Centaur"][5]           # same seed, same run
    assert diag_p[5][0] == [] and len(diag_p[5][1]) == 2
    with pytest.raises(ValueError, match="methods"):
        ch1c.personalization_sweep(net, w0, [5], methods=["FedAvg"], **args)


def test_personalization_eps_sweep_calibrates_each_budget_and_reuses_known_runs():
    net, w0 = _net()
    K, T, q = SMALL["task"].num_clients, SMALL["num_rounds"], SMALL_DP.sampling_prob
    delta = dpf.delta_for(K)
    sweep_args = dict(task=SMALL["task"], num_rounds=T, dp=SMALL_DP, **SMALL_TRAIN)
    out = ch1c.personalization_eps_sweep(net, w0, [0.5, 4.0], classes_per_client=5, delta=delta, **sweep_args)
    util, z = out["util"], out["z"]
    assert list(util["Centaur"]) == [0.5, 4.0] and z[0.5] > z[4.0] > 0
    # the chapter's float accountant (ch1c.CHAPTER_MECHANISM), not fedlab's safe default
    assert ch1c.CHAPTER_MECHANISM == "float" and z[0.5] == dpf.noise_multiplier_for_epsilon(0.5, q, T, delta, safe=False)
    cost = ch1c.safe_noise_cost(0.5, q, T, delta, num_clients=K)
    assert cost["float"] == z[0.5] and cost["safe"] == dpf.noise_multiplier_for_epsilon(0.5, q, T, delta, num_clients=K)
    assert cost["ratio"] > 1                      # no amplification by sampling in the safe accountant
    assert util["local-only"][0.5] == util["local-only"][4.0]       # no budget spent: one run
    # each budget is the heterogeneity sweep at that noise multiplier
    one, _, _ = ch1c.personalization_sweep(net, w0, [5], **{**sweep_args,
                                                           "dp": dataclasses.replace(SMALL_DP, noise_multiplier=z[4.0])})
    for m in ch1c.PERSONALIZATION_METHODS:
        assert util[m][4.0] == pytest.approx(one[m][5])
    # a known budget is copied, not rerun
    known = {1.0: {"local-only": 0.11, "DP-FedAvg + fine-tuning": 0.22, "Centaur": 0.33}}
    out2 = ch1c.personalization_eps_sweep(net, w0, [1.0, 4.0], classes_per_client=5, delta=delta, known=known,
                                          **sweep_args)
    assert out2["util"]["Centaur"][1.0] == 0.33 and out2["util"]["local-only"] == {1.0: 0.11, 4.0: 0.11}
    assert out2["util"]["Centaur"][4.0] == pytest.approx(util["Centaur"][4.0])


def test_personalization_eps_sweep_validation():
    kw = dict(classes_per_client=2, task=ch1c.PersonalizationTask(num_clients=100), num_rounds=2, dp=SMALL_DP)
    with pytest.raises(ValueError, match="epsilons"):
        ch1c.personalization_eps_sweep(None, {}, [], delta=1e-4, **kw)
    with pytest.raises(ValueError, match="epsilons"):
        ch1c.personalization_eps_sweep(None, {}, [1.0, math.inf], delta=1e-4, **kw)
    with pytest.raises(ValueError, match="1/num_clients"):
        ch1c.personalization_eps_sweep(None, {}, [1.0], delta=1e-2, **kw)
    with pytest.raises(ValueError, match="known"):
        ch1c.personalization_eps_sweep(None, {}, [1.0], delta=1e-4, known={1.0: {"Centaur": 0.5}}, **kw)
    with pytest.raises(ValueError, match="safe"):
        ch1c.personalization_eps_sweep(None, {}, [1.0], delta=1e-4,
                                       **{**kw, "dp": dataclasses.replace(SMALL_DP, safe=True)})


def test_personalization_eps_values_and_table():
    util = {"local-only": {0.5: 0.40, 2.0: 0.40}, "DP-FedAvg + fine-tuning": {0.5: 0.45, 2.0: 0.60},
            "Centaur": {0.5: 0.50, 2.0: 0.55}}
    v = ch1c.personalization_eps_values(util)
    assert v["pe_ce_0p5"] == 0.50 and v["pe_lo_2"] == 0.40 and v["pe_ft_2"] == 0.60
    assert v["pe_ce_minus_lo_0p5"] == pytest.approx(0.10) and v["pe_ce_minus_ft_2"] == pytest.approx(-0.05)
    assert v["pe_min_ce_minus_lo"] == pytest.approx(0.10) and v["pe_min_ce_minus_lo_ge1"] == pytest.approx(0.15)
    table = ch1c.personalization_eps_table(util, lambda name: f"paper:{name}").data
    assert "| 0.5 | 0.400 | 0.450 | 0.500 | paper:pe_ce_minus_lo_0p5 | paper:pe_ce_minus_ft_0p5 |" in table
    with pytest.raises(ValueError, match="methods"):
        ch1c.personalization_eps_values({"Centaur": {0.5: 0.5}})
    with pytest.raises(ValueError, match="budgets"):
        ch1c.personalization_eps_values({**util, "Centaur": {0.5: 0.5}})


# ------------------------------------------------------------------ full-batch local steps (Centaur Phase 1, fine-tuning)
def test_full_batch_partial_update_is_plain_gradient_descent_per_client_with_padding():
    from torch.func import functional_call

    from fedlab import fl
    from fedlab.data import Dataset
    from fedlab.fl import personalization as pers

    g = torch.Generator().manual_seed(3)
    sizes = [7, 3, 5]
    clients = [(torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in sizes]
    data = fl.stack_clients([Dataset(X, y) for X, y in clients])
    net = models.mlp(6, (5,), 4, seed=1)
    w0 = models.get_params(net)
    stacked = {k: v.unsqueeze(0).repeat(len(sizes), *([1] * v.ndim)) for k, v in w0.items()}
    head = pers.head_names_of(w0)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    out = pers.partial_clients_update(net, stacked, data, head, lr=0.3, local_epochs=4, batch_size=None, generator=gen)
    assert torch.equal(gen.get_state(), state)                       # full batch draws no shuffle
    for k, (X, y) in enumerate(clients):
        p = {n: v.clone() for n, v in w0.items()}
        for _ in range(4):
            sub = {n: p[n].clone().requires_grad_(True) for n in head}
            loss = torch.nn.functional.cross_entropy(functional_call(net, {**p, **sub}, (X,)), y)
            grads = torch.autograd.grad(loss, [sub[n] for n in head])
            for n, gr in zip(head, grads):
                p[n] = (sub[n] - 0.3 * gr).detach()
        for n in w0:
            torch.testing.assert_close(out[n][k], p[n], rtol=1e-5, atol=1e-6)
    # a batch at least the largest client is the same full-batch descent
    same = pers.partial_clients_update(net, stacked, data, head, lr=0.3, local_epochs=4, batch_size=7)
    for n in w0:
        torch.testing.assert_close(same[n], out[n])
    with pytest.raises(ValueError, match="local_epochs"):
        pers.partial_clients_update(net, stacked, data, head, lr=0.3, local_epochs=0, batch_size=None)


def test_dp_grid_reports_chance_floors_of_its_auc():
    # issue 16 item 3: every MIA number comes with its chance floor; tiny run, two budgets
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 5, generator=g)
    y = (X[:, 0] > 0).long()
    from fedlab.data import Dataset
    train, nonmem, test = Dataset(X[:30], y[:30]), Dataset(X[30:45], y[30:45]), Dataset(X[45:], y[45:])
    net = models.mlp(5, [8], 2, seed=0)
    grid = ch1c.dp_grid(net, models.get_params(net), train, nonmem, test,
                        cells=ch1c.DPGrid(client_counts=[2], epsilons=[1.0, float("inf")], delta=1e-3, clip_norm=1.0,
                                          n_per_client=10),
                        num_rounds=3, window=2, seed=0, local=fl.LocalTraining(lr=0.1, local_epochs=1, batch_size=5))
    for cell in grid.values():
        assert 0.5 < cell["floor"] < cell["floor_999"] < 1.0
        assert np.isfinite(cell["auc"])
    # the floor is of the same scores: shuffling 20 members against 15 non-members, the 95th percentile
    # of the AUC under no signal is about 0.5 + 1.645 * sqrt((20 + 15 + 1) / (12 * 20 * 15)) = 0.66
    assert grid[(1.0, 2)]["floor"] == pytest.approx(0.5 + 1.645 * math.sqrt(36 / 3600), abs=0.03)


def test_the_chapters_dp_runs_use_the_float_mechanism_they_are_accounted_for(monkeypatch):
    """1c accounts its DP-FedAvg and Centaur runs with the float accountant (ch1c.CHAPTER_MECHANISM), so the runs
    must add the float Gaussian: a run that fell back on fedlab's safe default would be accounted wrongly."""
    def safe_noise_called(*args, **kwargs):
        raise AssertionError("the chapter's DP run used the safe mechanism while its epsilon is the float one's")

    monkeypatch.setattr(dpf, "discrete_noise", safe_noise_called)
    net, w0 = _net()
    accs, _, _ = ch1c.personalization_sweep(net, w0, [5], methods=["DP-FedAvg + fine-tuning", "Centaur"], **SMALL)
    assert set(accs) == {"DP-FedAvg + fine-tuning", "Centaur"} and all(5 in v for v in accs.values())


# ------------------------------------------------------------------ the DP grid's attack (chapter 1d's first figure)
@pytest.mark.slow           # 3.4 s on one core
def test_dp_grid_attacks_the_last_window_of_released_models():
    """The attack of dp_grid reads the *last* ``window`` models DP-FedAvg released (a slice taken from the front,
    the first rounds' models, passed every assert of chapter 1d's page): recomputed from the same run."""
    from fedlab import data
    from fedlab.attacks import membership as mia
    from fedlab.fl.dp_fedavg import dp_fedavg_runs

    digits = data.load_digits()
    train, held_out = data.train_test_split(digits, test_fraction=0.5, seed=0)
    nonmembers, test = data.train_test_split(held_out, test_fraction=0.5, seed=0)
    nonmembers = nonmembers.subset(np.arange(40))
    net = models.mlp(64, (16,), 10, seed=0)
    w0 = models.get_params(net)
    K, n, rounds, window, local = 4, 10, 6, 2, fl.LocalTraining(lr=0.3, local_epochs=2, batch_size=10)
    grid = ch1c.dp_grid(net, w0, train, nonmembers, test,
                        cells=ch1c.DPGrid(client_counts=[K], epsilons=[math.inf], delta=1e-3, clip_norm=1.0, n_per_client=n),
                        num_rounds=rounds, window=window, seed=0, local=local)
    parts = [p[:n] for p in data.partition_iid(len(train), K, seed=0)]
    clients = fl.stack_clients(data.client_datasets(train, parts))
    released = []
    z = dpf.noise_multiplier_for_epsilon(math.inf, 1.0, rounds, 1e-3, num_clients=K, safe=False)
    dp_fedavg_runs(net, [dict(clients=clients, sampling_prob=1.0, noise_multiplier=z, clip_norm=1.0, params=w0,
                              safe=False, seed=0, callback=lambda r: released.append(r.new_params), local=local)],
                   num_rounds=rounds, eval_data=test)
    idx = np.concatenate(parts)
    X_all = torch.cat([train.X[idx], nonmembers.X])
    y_all = torch.cat([train.y[idx], nonmembers.y])
    lab = np.r_[np.ones(len(idx)), np.zeros(len(nonmembers))]
    last = mia.attack_auc(mia.snapshot_signals(net, released[-window:], X_all, y_all), lab, window)
    first = mia.attack_auc(mia.snapshot_signals(net, released[:window], X_all, y_all), lab, window)
    assert grid[(math.inf, K)]["auc"] == last and last != first, (grid[(math.inf, K)]["auc"], last, first)
