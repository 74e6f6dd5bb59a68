"""Chapter 1c's experiment helpers (fedlab.experiments.chapter1c): the names they glue, the tables they write
for the page, and the ValueErrors they raise on bad arguments. The chapter's parts have their own files:
test_ch1c_mia.py, test_ch1c_lira.py, test_ch1c_settings.py, test_ch1c_defenses.py."""
import numpy as np
import pytest
import torch

from fedlab import fl
from fedlab.experiments import chapter1c as ch1c
from fedlab.fl.dp_fedavg import DPSettings

torch.set_num_threads(1)


def _paper(name, digits=3):
    return f"paper:{name}"


def test_window_values_names_and_best_window():
    auc_w = {"loss": {1: 0.6, 2: 0.62, 10: 0.65, 20: 0.64}, "grad_norm": {1: 0.58, 2: 0.61, 10: 0.6, 20: 0.59}}
    v = ch1c.window_values(auc_w, 10)
    assert v == {"auc_last": 0.6, "auc_w10": 0.65, "auc_best": 0.65, "best_w": 10, "auc_grad_last": 0.58,
                 "auc_grad_best": 0.61, "mia_auc_last": 0.6, "mia_auc_avg10": 0.65,
                 "mia_auc_avg10_minus_last": pytest.approx(0.05)}
    assert ch1c.window_values(auc_w, 10, floor=0.55)["auc_floor"] == 0.55
    with pytest.raises(ValueError, match="best_w"):
        ch1c.window_values(auc_w, 5)
    with pytest.raises(ValueError, match="grad_norm"):
        ch1c.window_values({"loss": auc_w["loss"]}, 10)


def test_window_table_quotes_rounded_values_and_the_record():
    table = ch1c.window_table({1: 0.61234, 10: 0.65678, 20: 0.7}, 20, _paper).data
    assert "| last round only | 0.687 | 0.612 | paper:mia_auc_last |" in table
    assert "| average of the last 10 rounds | 0.712 | 0.657 | paper:mia_auc_avg10 |" in table
    assert "best window here" in table and "0.700" in table
    floored = ch1c.window_table({1: 0.61234, 10: 0.65678, 20: 0.7}, 20, _paper, floor=0.5512).data
    assert "| chance floor (95th percentile, shuffled labels) | - | 0.551 | paper:auc_floor |" in floored


def test_learned_attack_sweep_scales_epochs_to_rounds():
    g = torch.Generator().manual_seed(0)
    K, T, n = 3, 30, 10
    is_member = np.r_[np.ones(n), np.zeros(n)]
    loss = torch.rand(K, T, 2 * n, generator=g) + torch.as_tensor(1 - is_member, dtype=torch.float32)  # members lower
    signals = {"loss": loss, "grad_norm": torch.rand(K, T, 2 * n, generator=g)}
    learned = ch1c.learned_attack_sweep(signals, is_member, [(5, 10, 15, 20, 25), (100, 150, 200, 250, 300)], T, seed=0)
    assert [r["rounds"] for r in learned] == [(1, 2), (10, 15, 20, 25, 30)]
    assert all(r["auc"] > 0.9 for r in learned)
    v = ch1c.learned_attack_values(learned)
    assert set(v) == {"mia_epochs25_acc", "mia_epochs25_auc", "mia_epochs300_acc", "mia_epochs300_auc",
                      "learned_first", "learned_last", "learned_min_auc"}
    assert v["learned_first"] == learned[0]["accuracy"] and v["learned_last"] == learned[-1]["accuracy"]
    with pytest.raises(ValueError, match="num_rounds"):
        ch1c.learned_attack_sweep(signals, is_member, [(5,)], T + 1)
    with pytest.raises(ValueError, match="grad_norm"):
        ch1c.learned_attack_sweep({"loss": loss}, is_member, [(5,)], T)
    with pytest.raises(ValueError, match="learned"):
        ch1c.learned_attack_values([])


def test_active_attack_names_values_and_table():
    rng = np.random.default_rng(0)
    auc = {(name, g): 0.6 + 0.01 * i + 0.01 * rng.normal(size=4) for i, (name, g) in enumerate(
        (n, g) for n in ["server", "server, isolating", "participant"] for g in (0.0, 2.0))}
    sweep = {"auc": auc, "accuracy": {k: v - 0.05 for k, v in auc.items()}, "floor": 0.55}
    assert ch1c.active_attack_name("server, isolating", 2.0) == "act_server_isolating_g2_auc"
    assert ch1c.active_attack_name("participant", 0.0, "hacc") == "act_participant_p_hacc"
    assert ch1c.active_attack_name("server", 0.5) == "act_server_g0p5_auc"
    v = ch1c.active_attack_values(sweep)
    assert v["act_server_isolating_g2_auc"] == pytest.approx(np.mean(auc[("server, isolating", 2.0)]))
    assert v["act_participant_p_hacc"] == pytest.approx(np.mean(auc[("participant", 0.0)]) - 0.05)
    d = auc[("server, isolating", 0.0)] - auc[("server", 0.0)]
    assert v["d_iso_p"] == pytest.approx(d.mean()) and v["d_iso_p_lo"] < d.mean() < v["d_iso_p_hi"]
    assert v["act_floor"] == 0.55
    table = ch1c.active_attack_table(sweep, _paper).data
    assert "| server, isolating | passive | 0.890 |" in table
    assert "| server, isolating | gradient ascent, γ = 2 | 0.921 |" in table and "paper:act_server_isolating_g2_auc" in table
    assert "| chance floor (95th percentile, shuffled labels) | - | - | 0.550 |" in table
    with pytest.raises(ValueError, match="isolating"):
        ch1c.active_attack_values({"auc": {("server", 0.0): auc[("server", 0.0)]}, "accuracy": {}, "floor": 0.5})


def test_chapter1c_argument_validation():
    X = torch.zeros(4, 6, 64)
    server = {"server": {"attacker": "server"}}
    with pytest.raises(ValueError, match="targets"):
        ch1c.active_attack_sweep(None, None, {}, X, X[..., 0], np.ones(6), num_rounds=1,
                                 attacks=ch1c.ActiveGrid(variants=server, ascent_lrs=[1.0], targets=[0, 4]))
    with pytest.raises(ValueError, match="targets"):
        ch1c.ActiveGrid(variants=server, ascent_lrs=[1.0], targets=[0])
    with pytest.raises(ValueError, match="ascent_lrs"):
        ch1c.ActiveGrid(variants=server, ascent_lrs=[0.0], targets=[0, 1])
    with pytest.raises(ValueError, match="variants"):
        ch1c.ActiveGrid(variants={}, ascent_lrs=[1.0], targets=[0, 1])
    with pytest.raises(ValueError, match="attacker"):
        ch1c.ActiveGrid(variants={"x": {"attacker": "client"}}, ascent_lrs=[1.0], targets=[0, 1])
    with pytest.raises(ValueError, match="attacks"):
        ch1c.active_attack_sweep(None, None, {}, X, X[..., 0], np.ones(6), num_rounds=1, attacks=server)
    cells = ch1c.DPGrid(client_counts=[2], epsilons=[1.0], delta=1e-3, clip_norm=1.0, n_per_client=2)
    with pytest.raises(ValueError, match="window"):
        ch1c.dp_grid(None, {}, None, None, None, cells=cells, num_rounds=3, window=5)
    with pytest.raises(ValueError, match="n_per_client"):
        ch1c.DPGrid(client_counts=[2], epsilons=[1.0], delta=1e-3, clip_norm=1.0, n_per_client=0)
    with pytest.raises(ValueError, match="clip_norm"):
        ch1c.DPGrid(client_counts=[2], epsilons=[1.0], delta=1e-3, clip_norm=0.0, n_per_client=2)
    with pytest.raises(ValueError, match="epsilons"):
        ch1c.DPGrid(client_counts=[2], epsilons=[], delta=1e-3, clip_norm=1.0, n_per_client=2)
    server = {"server": {"attacker": "server"}}
    with pytest.raises(ValueError, match="ascent_lrs"):
        ch1c.ActiveGrid(variants=server, ascent_lrs=[float("inf")], targets=[0, 1])
    with pytest.raises(ValueError, match="targets"):
        ch1c.ActiveGrid(variants=server, ascent_lrs=[1.0], targets=[0, 0])
    with pytest.raises(ValueError, match=r"ActiveGrid.variants\['x'\].*isolate"):
        ch1c.ActiveGrid(variants={"x": {"attacker": "server", "isolate": "yes"}}, ascent_lrs=[1.0], targets=[0, 1])
    cells = ch1c.DPGrid(client_counts=[2], epsilons=[1.0], delta=1e-3, clip_norm=1.0, n_per_client=10.0)
    assert cells.n_per_client == 10 and isinstance(cells.n_per_client, int)      # 10.0 failed later in a slice
    with pytest.raises(ValueError, match="num_clients"):
        ch1c.PersonalizationTask(num_clients=0)
    with pytest.raises(ValueError, match="head_epochs"):
        ch1c.PersonalizationSchedule(head_epochs=0)
    with pytest.raises(ValueError, match="local"):
        ch1c.personalization_sweep(None, {}, [2], task=ch1c.PersonalizationTask(num_clients=4), num_rounds=1,
                                   dp=DPSettings(noise_multiplier=1.0, clip_norm=1.0, sampling_prob=0.5),
                                   local=fl.LocalTraining(weight_decay=0.1))
    with pytest.raises(ValueError, match="recs_fa"):
        ch1c.snr_and_agreement([], [object()], {})
