"""The settings tables of chapters 3a and 3b (paper / reference code / ours): every row complete, and the
"ours" column computed from the notebook's constants and the library's defaults, never typed by hand."""
import inspect

import pytest
import torch

from fedlab import plots
from fedlab.attacks.interaction_inference import oltr as attack_oltr
from fedlab.attacks.interaction_inference import recsys as attack_recsys
from fedlab.data.letor import synthetic_letor
from fedlab.data.movielens import UserItems
from fedlab.experiments import chapter3a, chapter3b
from fedlab.fl import oltr as fl_oltr
from fedlab.privacy import ldp

SENS = {"fcf": 100.0, "fncf_items": 0.005, "fncf_params": 0.7}
EPS = [1.0, 10.0, 20.0, 100.0, 500.0]


def _user_items(num_users=3, pos=2, neg_ratio=4, num_items=40, seed=0):
    """``num_users`` users with ``pos`` positives and ``neg_ratio * pos`` negatives each."""
    g = torch.Generator().manual_seed(seed)
    m = pos * (1 + neg_ratio)
    items = torch.stack([torch.randperm(num_items, generator=g)[:m] for _ in range(num_users)])
    inter = torch.zeros(num_users, m)
    inter[:, :pos] = 1.0
    return UserItems(items, inter, torch.ones(num_users, m, dtype=torch.bool), torch.arange(num_users))


def _case(dim=8, fncf_lr=1.0, local_steps=1, neg_ratio=4):
    return chapter3a.make_recsys_case(_user_items(neg_ratio=neg_ratio), 40, dim=dim, fncf_lr=fncf_lr,
                                      local_steps=local_steps, seed=0)


def _table3a(case=None, **kw):
    args = dict(source="synthetic", num_users_total=943, fcf_max_iter=100, fncf_max_iter=150, num_restarts=2,
                epsilons=EPS, delta=1e-8, sensitivity=SENS)
    args.update(kw)
    return chapter3a.reference_settings_table(_case() if case is None else case, **args)


def _ours(table):
    header, rows = table
    assert header[-1].startswith("ours")
    return {r[0]: r[-1] for r in rows}


@pytest.fixture(scope="module")
def letor():
    return synthetic_letor(12, seed=0)


def _table3b(data, **kw):
    args = dict(queries=[1, 8, 16], click_models=["navigational", "informational"], num_users=8, lr=0.1,
                max_iter=25, epsilons=EPS, delta=1e-8, sensitivity=0.5)
    args.update(kw)
    rankers = args.pop("rankers", {"linear": (), "neural": (16, 8)})
    return chapter3b.reference_settings_table(data, rankers, **args)


def _check_complete(table):
    header, rows = table
    assert len(header) == 4 and header[1].startswith("paper") and header[2].startswith("reference code")
    assert len(rows) >= 10
    names = [r[0] for r in rows]
    assert len(set(names)) == len(names)
    for r in rows:
        assert len(r) == 4, r
        assert all(isinstance(c, str) and c.strip() for c in r), r
    plots.md_table(*table)      # renders: one cell per header


def test_tables_are_complete(letor):
    _check_complete(_table3a())
    _check_complete(_table3b(letor))


def test_3a_ours_follows_the_case():
    base = _ours(_table3a())
    assert "d = 8;" in base["embeddings"] and "(16 inputs)" in base["FNCF network"]
    assert base["FNCF local training"].startswith("1 full-batch gradient step of size 1 ")
    assert base["negatives"].startswith("4 sampled")
    assert "3 of its 943 users" in base["data and users"] and "random subset" in base["data and users"]
    other = _ours(_table3a(_case(dim=12, fncf_lr=0.5, local_steps=3, neg_ratio=2), num_users_total=3))
    assert "d = 12;" in other["embeddings"] and "(24 inputs)" in other["FNCF network"]
    assert other["FNCF local training"].startswith("3 full-batch gradient steps of size 0.5 ")
    assert other["negatives"].startswith("2 sampled")
    assert "(all)" in other["data and users"]
    hidden = [m.out_features for m in _case().model.modules() if isinstance(m, torch.nn.Linear)][:-1]
    assert f"hidden {', '.join(map(str, hidden))} ReLU" in base["FNCF network"]
    # three local steps: no continuation ("auto" needs one step)
    assert other["continuation (FNCF with the embedding)"].startswith("off")


def test_3a_ours_follows_the_budget_and_ldp_constants():
    base = _ours(_table3a())
    b = chapter3a.attack_budget(("FCF", False, False), fcf_max_iter=100, fncf_max_iter=150, num_restarts=2)
    assert "FCF 100 with the embedding" in base["budget"] and f"{b['max_iter']} without" in base["budget"]
    assert "FNCF 150" in base["budget"] and "evaluations" in base["budget"]
    assert "2 per user" in base["starts"] and f"without the embedding: {b['num_restarts']}" in base["starts"]
    more = _ours(_table3a(fcf_max_iter=300, fncf_max_iter=40, num_restarts=4))
    assert "FCF 300 with the embedding" in more["budget"] and "60 without" in more["budget"]
    assert "FNCF 40" in more["budget"] and "4 per user" in more["starts"]
    assert more["budget"] != base["budget"]
    # 40 evaluations leave the five stages fewer than 10 each: no continuation
    assert more["continuation (FNCF with the embedding)"].startswith("off")
    assert "0.3, 0.1, 0.03, 0.01" in base["continuation (FNCF with the embedding)"]
    assert "ε ∈ {1, 10, 20, 100, 500}" in base["LDP mechanism"] and "δ = 1e-08" in base["LDP mechanism"]
    clip = ldp.ldp_clip_norm(SENS["fncf_items"])
    assert f"clipped to 50 / {clip:g} / 0.35" in base["LDP mechanism"]
    ldp2 = _ours(_table3a(epsilons=[2.0, 50.0], delta=1e-6, sensitivity={**SENS, "fcf": 8.0}))["LDP mechanism"]
    assert "ε ∈ {2, 50}" in ldp2 and "δ = 1e-06" in ldp2 and "Δ₂ = 8 /" in ldp2 and "clipped to 4 /" in ldp2


def test_3a_ours_reads_library_defaults(monkeypatch):
    base = _ours(_table3a())
    sig = inspect.signature(attack_recsys.raifle).parameters
    assert f"history {sig['history_size'].default}," in base["optimiser and line search"]
    assert ("antithetic" in base["starts"]) == sig["antithetic"].default
    monkeypatch.setattr(attack_recsys, "FNCF_CONTINUATION", (0.5, 0.05))
    real = attack_recsys.raifle

    def raifle(loss_fn, num_users, num_items, *, history_size=7, emb_init_std=0.5, antithetic=False, tol=1e-5,
               **kw):
        return real(loss_fn, num_users, num_items, history_size=history_size, **kw)

    monkeypatch.setattr(attack_recsys, "raifle", raifle)
    patched = _ours(_table3a())
    assert "τ = 0.5, 0.05," in patched["continuation (FNCF with the embedding)"]
    assert "history 7," in patched["optimiser and line search"] and "< 1e-05" in patched["optimiser and line search"]
    assert "N(0, 0.5²)" in patched["start distribution"] and "(independent)" in patched["starts"]


def test_3a_bad_input():
    with pytest.raises(ValueError, match="fcf_max_iter"):
        _table3a(fcf_max_iter=0)
    with pytest.raises(ValueError, match="num_restarts"):
        _table3a(num_restarts=0)
    with pytest.raises(ValueError, match="sensitivity"):
        _table3a(sensitivity={"fcf": 1.0})
    with pytest.raises(ValueError, match="epsilons"):
        _table3a(epsilons=[])


def test_3b_ours_follows_the_constants(letor):
    base = _ours(_table3b(letor))
    assert base["data"].startswith(f"{letor.source}: 12 queries, {letor.num_features} features, 3 relevance grades")
    assert base["users and queries"].startswith("8 users per") and "Q ∈ {1, 8, 16}" in base["users and queries"]
    assert base["budget"].startswith("25 loss evaluations")
    assert "η = 0.1 per query" in base["local training"]
    assert f"({fl_oltr.ranker_size(letor.num_features, (16, 8))} parameters)" in base["rankers"]
    assert "Δ₂ = 0.5 (clip to 0.25)" in base["LDP"] and "ε ∈ {1, 10, 20, 100, 500}" in base["LDP"]
    pc, ps = fl_oltr.click_probabilities("informational", 3)
    assert "informational click " + ", ".join(f"{x:g}" for x in pc.tolist()) in base["click model"]
    blocks = attack_oltr.feature_allocation(torch.tensor([16]), 16, letor.num_features)[0].sum(-1)
    assert f"at Q = 16: {int(blocks.min())}-{int(blocks.max())} features" in base["ADM"]
    other = _ours(_table3b(letor, queries=[1, 4], click_models=["perfect"], num_users=3, lr=1.0, max_iter=200,
                           epsilons=[5.0], sensitivity=2.0, rankers={"net": (4,)}))
    assert other["users and queries"].startswith("3 users per") and "Q ∈ {1, 4}" in other["users and queries"]
    assert other["budget"].startswith("200 loss evaluations") and "η = 1 per query" in other["local training"]
    assert f"net: hidden 4 ReLU, no biases ({fl_oltr.ranker_size(letor.num_features, (4,))} parameters)" == other["rankers"]
    assert "Δ₂ = 2 (clip to 1)" in other["LDP"] and "ε ∈ {5}" in other["LDP"]
    assert "perfect click 0, 0.5, 1" in other["click model"] and "at Q = 4:" in other["ADM"]


def test_3b_ours_reads_library_defaults(letor, monkeypatch):
    base = _ours(_table3b(letor))
    assert base["starts"].startswith(f"{inspect.signature(attack_recsys.raifle).parameters['num_restarts'].default} per user")
    assert "top 10" in base["displayed list"] and "random order" in base["local training"]
    real = attack_oltr.make_oltr_case

    def make_oltr_case(data, num_users, num_queries, hidden=(), *, k=5, init="fan_in", shuffle_queries=False, **kw):
        return real(data, num_users, num_queries, hidden, k=k, init=init, shuffle_queries=shuffle_queries, **kw)

    monkeypatch.setattr(attack_oltr, "make_oltr_case", make_oltr_case)
    patched = _ours(_table3b(letor))
    assert "top 5" in patched["displayed list"] and "init='fan_in'" in patched["initialisation"]
    assert patched["local training"].endswith("in display order")


def test_3b_bad_input(letor):
    with pytest.raises(ValueError, match="click model"):
        _table3b(letor, click_models=["bored"])
    with pytest.raises(ValueError, match="queries"):
        _table3b(letor, queries=[])
    with pytest.raises(ValueError, match="lr"):
        _table3b(letor, lr=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        _table3b(letor, max_iter=0)
