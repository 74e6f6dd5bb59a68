"""The settings tables of chapters 3a and 3c (paper / reference code / ours): every row complete, and the
"ours" column computed from the notebook's constants and the library's defaults, never typed by hand."""
import inspect

import pytest
import torch

from fedlab import plots
from fedlab.attacks.interaction_inference import oltr as attack_oltr
from fedlab.attacks.interaction_inference import recsys as attack_recsys
from fedlab.attacks.interaction_inference.recsys import make_recsys_case
from fedlab.data.letor import synthetic_letor
from fedlab.data.movielens import UserItems
from fedlab.experiments import chapter3a, chapter3c
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
    return make_recsys_case(_user_items(neg_ratio=neg_ratio), 40, dim=dim, fncf_lr=fncf_lr,
                                      local_steps=local_steps, seed=0)


#: chapter 3a's scale settings as the tests pass them (the module's own are checked separately)
SETTINGS_3A = {"table3_users": (3, None), "fcf_max_iter": (100, 1000), "fncf_max_iter": (150, 1000),
               "num_restarts": (2, 2), "sweep_users": (2, 200), "sweep_max_iter": (50, 1000), "ldp_variants": (4, 6),
               "loop_users": (2, 16), "network_draws": (10, 10), "draw_users": (2, 100),
               "reference_users": (3, 50), "prune_aware_users": (4, 50)}


def _table3a(case=None, settings=None, **kw):
    """Chapter 3a's table; ``fcf_max_iter``, ``fncf_max_iter``, ``num_restarts``, ``table3_users`` in
    ``kw`` set the quick-scale value of that setting."""
    settings = dict(SETTINGS_3A if settings is None else settings)
    for name in ("fcf_max_iter", "fncf_max_iter", "num_restarts", "table3_users", "sweep_users", "sweep_max_iter"):
        if name in kw:
            settings[name] = (kw.pop(name), settings[name][1])
    args = dict(source="synthetic", num_users_total=943, epsilons=EPS, delta=1e-8, sensitivity=SENS,
                settings=settings)
    args.update(kw)
    return chapter3a.reference_settings_table(_case() if case is None else case, **args)


def _ours(table, scale="quick"):
    """``{setting: our cell}`` at ``scale``; a paper-scale cell "same" is the quick-scale one."""
    header, rows = table
    assert header[-2] == "ours, quick scale" and header[-1] == "ours, paper scale"
    if scale == "quick":
        return {r[0]: r[-2] for r in rows}
    return {r[0]: r[-2] if r[-1] == "same" else r[-1] for r in rows}


@pytest.fixture(scope="module")
def letor():
    return synthetic_letor(12, seed=0)


SETTINGS_3B = {"synthetic_queries": (300, 1000), "fig5_queries": ([1, 8, 16], [1, 4, 8, 12, 16]),
               "num_users": (8, 100), "max_iter": (25, 200), "settings_users": (4, 50), "noisy_users": (6, 100),
               "replaced_fractions": ([1.0], [0.5, 1.0]), "pir_users": (40, 1000), "ldp_users": (8, 100),
               "ldp_queries": ([8], [4, 8, 12, 16]), "num_rounds": (60, 300), "budget_users": (2, 50)}


def _table3b(data, **kw):
    """Chapter 3c's table; ``queries``, ``num_users``, ``max_iter`` in ``kw`` set the quick-scale value of
    ``fig5_queries``, ``num_users``, ``max_iter``."""
    settings = dict(kw.pop("settings", SETTINGS_3B))
    for arg, name in (("queries", "fig5_queries"), ("num_users", "num_users"), ("max_iter", "max_iter")):
        if arg in kw:
            settings[name] = (kw.pop(arg), settings[name][1])
    args = dict(click_models=["navigational", "informational"], lr=0.1, epsilons=EPS, delta=1e-8, sensitivity=0.5,
                clients_per_round=100, settings=settings)
    args.update(kw)
    rankers = args.pop("rankers", {"linear": (), "neural": (16, 8)})
    return chapter3c.reference_settings_table(data, rankers, **args)


def _check_complete(table):
    header, rows = table
    assert len(header) == 5 and header[1].startswith("paper") and header[2].startswith("reference code")
    assert len(rows) >= 10
    names = [r[0] for r in rows]
    assert len(set(names)) == len(names)
    for r in rows:
        assert len(r) == 5, r
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
    assert "3 of its 943 users, drawn at random" in base["data and users"]
    assert "all 943 users" in _ours(_table3a(), "paper")["data and users"]
    other = _ours(_table3a(_case(dim=12, fncf_lr=0.5, local_steps=3, neg_ratio=2), num_users_total=3))
    assert "d = 12;" in other["embeddings"] and "(24 inputs)" in other["FNCF network"]
    assert other["FNCF local training"].startswith("3 full-batch gradient steps of size 0.5 ")
    assert other["negatives"].startswith("2 sampled")
    assert "all 3 users" in other["data and users"]
    hidden = [m.out_features for m in _case().model.modules() if isinstance(m, torch.nn.Linear)][:-1]
    assert f"hidden {', '.join(map(str, hidden))} ReLU" in base["FNCF network"]
    # three local steps: no continuation ("auto" needs one step)
    assert other["continuation (FNCF with the embedding)"].startswith("off")


def test_3a_ours_follows_the_budget_and_ldp_constants():
    base = _ours(_table3a())
    b = chapter3a.attack_budget(("FCF", False, False), fcf_max_iter=100, fncf_max_iter=150, num_restarts=2)
    assert "FCF 100 with the embedding" in base["budget"] and f"{b.max_iter} without" in base["budget"]
    assert "FNCF 150" in base["budget"] and "evaluations" in base["budget"]
    assert "2 per user" in base["starts"] and f"without the embedding: {b.num_restarts}" in base["starts"]
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
    budget = inspect.signature(attack_recsys.raifle).parameters["budget"].default
    assert f"history {budget.history_size}," in base["optimiser and line search"]
    assert ("antithetic" in base["starts"]) == budget.antithetic
    monkeypatch.setattr(attack_recsys, "FNCF_CONTINUATION", (0.5, 0.05))
    real = attack_recsys.raifle

    def raifle(loss_fn, num_users, num_items, *,
               budget=attack_recsys.RaifleBudget(history_size=7, emb_init_std=0.5, antithetic=False, tol=1e-5), **kw):
        return real(loss_fn, num_users, num_items, budget=budget, **kw)

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
    with pytest.raises(ValueError, match="settings lacks"):
        _table3a(settings={k: v for k, v in SETTINGS_3A.items() if k != "sweep_users"})
    with pytest.raises(ValueError, match="ldp_variants"):
        _table3a(settings={**SETTINGS_3A, "ldp_variants": (4, 7)})
    with pytest.raises(ValueError, match="table3_users"):
        _table3a(settings={**SETTINGS_3A, "table3_users": (0, None)})
    with pytest.raises(ValueError, match="num_users_total"):
        _table3a(table3_users=8, num_users_total=5)


def test_3c_ours_follows_the_constants(letor):
    base = _ours(_table3b(letor))
    # synthetic data is drawn with the scale's number of queries
    assert base["data"].startswith(f"synthetic (MQ2007-shaped): 300 queries, {letor.num_features} features, 3 relevance grades")
    assert _ours(_table3b(letor), "paper")["data"].startswith("synthetic (MQ2007-shaped): 1000 queries")
    assert base["users and queries"].startswith("8 users per") and "Q ∈ {1, 8, 16}" in base["users and queries"]
    assert base["budget"].startswith("25 loss evaluations")
    paper = _ours(_table3b(letor), "paper")
    assert paper["budget"].startswith("200 loss evaluations") and "Q ∈ {1, 4, 8, 12, 16}" in paper["users and queries"]
    assert "1000 in the PIR test" in paper["users and queries"] and "40 in the PIR test" in base["users and queries"]
    assert base["federated training (Table 8)"].startswith("60 rounds of 100 users")
    assert paper["federated training (Table 8)"].startswith("300 rounds of 100 users")
    assert "α ∈ {1}" in base["ADM"] and "α ∈ {0.5, 1}" in paper["ADM"]
    assert "Q ∈ {8} with and without ADM" in base["LDP"] and "Q ∈ {4, 8, 12, 16}" in paper["LDP"]
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


def test_3c_ours_reads_library_defaults(letor, monkeypatch):
    base = _ours(_table3b(letor))
    budget = inspect.signature(attack_recsys.raifle).parameters["budget"].default
    assert base["starts"].startswith(f"{budget.num_restarts} per user")
    assert "top 10" in base["displayed list"] and "random order" in base["local training"]
    real = fl_oltr.OltrUsers

    def users(**kw):      # the library's default users changed: the table follows
        return real(**{"k": 5, "init": "fan_in", "shuffle_queries": False, **kw})

    monkeypatch.setattr(fl_oltr, "OltrUsers", users)
    patched = _ours(_table3b(letor))
    assert "top 5" in patched["displayed list"] and "init='fan_in'" in patched["initialisation"]
    assert patched["local training"].endswith("in display order")


def test_3c_bad_input(letor):
    with pytest.raises(ValueError, match="click model"):
        _table3b(letor, click_models=["bored"])
    with pytest.raises(ValueError, match="fig5_queries"):
        _table3b(letor, queries=[])
    with pytest.raises(ValueError, match="lr"):
        _table3b(letor, lr=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        _table3b(letor, max_iter=0)
    with pytest.raises(ValueError, match="replaced_fractions"):
        _table3b(letor, settings={**SETTINGS_3B, "replaced_fractions": ([1.5], [1.0])})
    with pytest.raises(ValueError, match="settings lacks"):
        _table3b(letor, settings={k: v for k, v in SETTINGS_3B.items() if k != "num_rounds"})
    with pytest.raises(ValueError, match="clients_per_round"):
        _table3b(letor, clients_per_round=0)


# --- both scales from the module's constants, the departures of issue 37, the notebooks' use of them --------

def test_default_settings_are_the_modules_and_follow_a_change(monkeypatch, letor):
    """Called without ``settings`` the tables read the modules' SCALE_SETTINGS at the call: changing one
    constant changes the column of its scale, and only that one."""
    base3a = chapter3a.reference_settings_table(_case(), source="synthetic", num_users_total=943, epsilons=EPS,
                                                delta=1e-8, sensitivity=SENS)
    q, p = _ours(base3a), _ours(base3a, "paper")
    fcf_q, fcf_p = chapter3a.SCALE_SETTINGS["fcf_max_iter"]
    assert f"FCF {fcf_q} with the embedding, {fcf_q // 5} without" in q["budget"]
    assert f"FCF {fcf_p} with the embedding, {fcf_p // 5} without" in p["budget"]
    monkeypatch.setitem(chapter3a.SCALE_SETTINGS, "fcf_max_iter", (fcf_q, 777))
    monkeypatch.setitem(chapter3a.SCALE_SETTINGS, "sweep_users", (chapter3a.SCALE_SETTINGS["sweep_users"][0], 123))
    changed = chapter3a.reference_settings_table(_case(), source="synthetic", num_users_total=943, epsilons=EPS,
                                                 delta=1e-8, sensitivity=SENS)
    assert _ours(changed) == q
    cp = _ours(changed, "paper")
    assert "FCF 777 with the embedding, 155 without" in cp["budget"]
    assert "a random 123 of them" in cp["data and users"] and "123 users" in cp["defense sweeps (LDP, pruning)"]

    kw = dict(click_models=["navigational", "informational"], lr=0.1, epsilons=EPS, delta=1e-8, sensitivity=0.5,
              clients_per_round=100)
    base3b = chapter3c.reference_settings_table(letor, {"linear": ()}, **kw)
    it_q, it_p = chapter3c.SCALE_SETTINGS["max_iter"]
    assert _ours(base3b)["budget"].startswith(f"{it_q} loss evaluations")
    assert _ours(base3b, "paper")["budget"].startswith(f"{it_p} loss evaluations")
    monkeypatch.setitem(chapter3c.SCALE_SETTINGS, "max_iter", (31, it_p))
    monkeypatch.setitem(chapter3c.SCALE_SETTINGS, "num_rounds", (chapter3c.SCALE_SETTINGS["num_rounds"][0], 999))
    changed = chapter3c.reference_settings_table(letor, {"linear": ()}, **kw)
    assert _ours(changed)["budget"].startswith("31 loss evaluations")
    assert _ours(changed, "paper")["federated training (Table 8)"].startswith("999 rounds")
    assert _ours(changed, "paper")["budget"] == _ours(base3b, "paper")["budget"]


def test_scale_dependent_rows_say_same_only_when_equal():
    table = _table3a(settings={**SETTINGS_3A, "num_restarts": (2, 2), "fncf_max_iter": (150, 150)})
    rows = {r[0]: r for r in table[1]}
    assert rows["starts"][-1] == "same" and rows["continuation (FNCF with the embedding)"][-1] == "same"
    assert rows["budget"][-1] != "same" and rows["data and users"][-1] != "same"


#: issue 37's undisclosed departures: (row, words in the reference column, words in our quick column)
DEPARTURES_3A = [
    ("budget", ["1000", "iterations", "the same for FCF with and without the embedding"],
     ["not iterations", "FCF 100 with the embedding, 20 without"]),
    ("starts", ["`num_atk = 5` independent"], ["antithetic", "FCF without the embedding: 1"]),
    ("attack loss (items)", ["F.mse_loss", "max(1, 100"], ["mean target row norm"]),
    ("optimiser and line search", ["torch.optim.LBFGS", "strong Wolfe"], ["Armijo"]),
    ("data and users", ["every user"], ["3 of its 943 users"]),
    ("defense sweeps (LDP, pruning)", ["every user"], ["4 of the 6 variants"]),
    ("attack loss (network term)", ["detached"], ["differentiated"]),
]
DEPARTURES_3B = [
    ("budget", ["1000", "iterations"], ["25 loss evaluations", "not iterations"]),
    ("ADM", ["0c39b80", "00c8e99", "replaced by N(0, 0.1²)"], ["the reference's final ADM as its own row"]),
    ("displayed list", ["in proportion to the scores, shifted"], ["Plackett-Luce"]),
    ("click model", ["not reset"], ["clicks reset"]),
    ("optimiser and line search", ["strong Wolfe"], ["Armijo"]),
    ("attack loss", ["F.mse_loss"], ["‖θ̂‖²"]),
    ("starts", ["`num_atk = 1`"], ["per user"]),
    ("federated training (Table 8)", ["10 shuffled passes"], ["60 rounds", "one run per seed"]),
    ("data", ["MQ2008", "MQ2007"], ["synthetic"]),
]


@pytest.mark.parametrize("chapter", ["3a", "3c"])
def test_every_departure_has_its_row(chapter, letor):
    table, departures = (_table3a(), DEPARTURES_3A) if chapter == "3a" else (_table3b(letor), DEPARTURES_3B)
    rows = {r[0]: r for r in table[1]}
    for name, reference_words, our_words in departures:
        assert name in rows, name
        for w in reference_words:
            assert w in rows[name][2], (name, w, rows[name][2])
        for w in our_words:
            assert w in rows[name][3], (name, w, rows[name][3])
        assert "(" in rows[name][1] or rows[name][1] in ("none", "not given"), rows[name][1]   # a citation


def _notebook_code(stem):
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[1] / "chapters" / f"{stem}.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("stems,module", [(("03a_raifle_recsys", "03b_raifle_recsys_defenses"), chapter3a),
                                          (("03c_raifle_oltr", "03d_raifle_oltr_defenses"), chapter3c)])
def test_notebook_reads_every_scale_setting_from_the_module(stems, module):
    """The tables' columns are the notebooks' settings only if the notebooks run with them: every
    SCALE_SETTINGS entry is read by ``ex.scaled`` (the tables of 3a and 3c also give the settings of the
    defense sweeps of 3b and 3d, so each pair of pages together) and no scale-dependent number is typed with fedlab.pick; the table
    is on the first page."""
    codes = [_notebook_code(stem) for stem in stems]
    for name in module.SCALE_SETTINGS:
        assert any(f'ex.scaled("{name}")' in code for code in codes), name
    assert all("fedlab.pick(" not in code for code in codes) and "ex.reference_settings_table(" in codes[0]


def test_3a_and_3b_run_with_the_ldp_constants_the_table_shows():
    """Chapter 3a's settings table and chapter 3b's sweeps read RAIFLE's LDP settings from the module's constants,
    so the table shows the values the sweeps run with."""
    for stem in ("03a_raifle_recsys", "03b_raifle_recsys_defenses"):
        code = _notebook_code(stem)
        assert "ex.LDP_EPSILONS" in code and "ex.LDP_DELTA" in code and "ex.LDP_SENSITIVITY" in code, stem
        assert "500.0]" not in code and '"fcf": 100.0' not in code, stem
    assert chapter3a.LDP_EPSILONS == (1.0, 10.0, 20.0, 100.0, 500.0) and chapter3a.LDP_DELTA == 1e-8
    assert chapter3a.LDP_SENSITIVITY == {"fcf": 100.0, "fncf_items": 0.005, "fncf_params": 0.7}   # RAIFLE Sec. 4.1.1


def test_scaled_picks_by_scale(monkeypatch):
    monkeypatch.setenv("FEDLAB_SCALE", "quick")
    assert chapter3a.scaled("fcf_max_iter") == chapter3a.SCALE_SETTINGS["fcf_max_iter"][0]
    q = chapter3c.scaled("fig5_queries")
    assert q == chapter3c.SCALE_SETTINGS["fig5_queries"][0] and q is not chapter3c.SCALE_SETTINGS["fig5_queries"][0]
    monkeypatch.setenv("FEDLAB_SCALE", "paper")
    assert chapter3a.scaled("table3_users") is None
    assert chapter3c.scaled("num_rounds") == chapter3c.SCALE_SETTINGS["num_rounds"][1]
    for module in (chapter3a, chapter3c):
        with pytest.raises(ValueError, match="name"):
            module.scaled("fcf_iters")


class _Run:
    def __init__(self, values):
        self.values = values

    def per_seed(self, name):
        return self.values.get(name, [])


def test_table8_rise():
    ndcg = {("linear", 1.0): 0.30, ("linear", None): 0.50, ("neural", 1.0): 0.40, ("neural", None): 0.45}
    run = _Run({"ch3c_ndcg_linear_inf": [0.8, 0.9, 0.7], "ch3c_ndcg_linear_eps1": [0.3, 0.3, 0.3]})
    (header, rows), values = chapter3c.table8_rise(ndcg, ["linear", "neural"], run)
    plots.md_table(header, rows)
    lin, nn = rows
    assert lin[1] == pytest.approx(chapter3c.PAPER_T8["linear"][-1] - chapter3c.PAPER_T8["linear"][0])
    assert lin[2] == pytest.approx(0.2) and values["ch3c_t8_rise_linear"] == pytest.approx(0.2)
    # rises 0.5, 0.6, 0.4: mean 0.5, t interval half-width 4.303 * 0.1 / sqrt(3) = 0.248
    assert lin[3] == "0.500 ± 0.248 (n = 3)" and lin[4] == "0.400 to 0.600"
    assert values["ch3c_t8_rise_linear_paper"] == lin[3]
    assert nn[2] == pytest.approx(0.05) and nn[3] == "no record yet"
    with pytest.raises(ValueError, match="ndcg"):
        chapter3c.table8_rise({("linear", 1.0): 0.3}, ["linear"], run)
    with pytest.raises(ValueError, match="seeds"):
        chapter3c.table8_rise(ndcg, ["linear"], _Run({"ch3c_ndcg_linear_inf": [0.8], "ch3c_ndcg_linear_eps1": []}))


def _perturbed(value):
    """Another valid quick-scale value of a setting."""
    if isinstance(value, list):
        return value + [0.25] if isinstance(value[0], float) else value + [max(value) + 4]
    return value + 1


#: scale settings that no row of the table states (the per-user loop of the timing comparison; the network
#: draws, whose users and draws the page states, glued, beside their table)
NOT_IN_TABLE_3A = {"loop_users", "network_draws", "draw_users"}


def test_every_scale_setting_reaches_its_column(letor):
    """Changing the quick value of any setting of SCALE_SETTINGS changes the quick column and leaves the
    paper column alone (a row that reads another constant, e.g. the sweeps' budget from Table 3's,
    fails here)."""
    base = _table3a()
    for name in set(SETTINGS_3A) - NOT_IN_TABLE_3A:
        quick, paper = SETTINGS_3A[name]
        new = 2 if name == "table3_users" else quick - 1 if name == "ldp_variants" else _perturbed(quick)
        changed = _table3a(settings={**SETTINGS_3A, name: (new, paper)})
        assert _ours(changed) != _ours(base), name
        assert _ours(changed, "paper") == _ours(base, "paper"), name
    base = _table3b(letor)
    for name, (quick, paper) in SETTINGS_3B.items():
        changed = _table3b(letor, settings={**SETTINGS_3B, name: (_perturbed(quick), paper)})
        assert _ours(changed) != _ours(base), name
        assert _ours(changed, "paper") == _ours(base, "paper"), name
    assert NOT_IN_TABLE_3A <= set(chapter3a.SCALE_SETTINGS) and set(SETTINGS_3A) == set(chapter3a.SCALE_SETTINGS)
    assert set(SETTINGS_3B) == set(chapter3c.SCALE_SETTINGS)


def test_3a_defense_sweeps_state_their_own_budget():
    ours, paper = _ours(_table3a()), _ours(_table3a(), "paper")
    assert "defense sweeps 50 (FCF without the embedding 10)" in ours["budget"]
    assert ours["defense sweeps (LDP, pruning)"].startswith("2 users, 50 evaluations per start")
    assert paper["defense sweeps (LDP, pruning)"].startswith("200 users, 1000 evaluations per start")
    assert "6 of the 6 variants" in paper["defense sweeps (LDP, pruning)"]
