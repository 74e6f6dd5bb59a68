"""Chapter 2's experiment helpers (fedlab.experiments.chapter2): the names they glue, the bookkeeping they do
for the page, and the ValueErrors they raise on bad arguments."""
import math

import numpy as np
import pytest
import torch

from fedlab.attacks import identifiability as pac
from fedlab.experiments import chapter2 as ch2
from fedlab.fl.recsys import ratings as rec

torch.set_num_threads(1)


def _paper(name, digits=3, *, value_range=None):
    return f"paper:{name}:{value_range}"


def test_theorem1_sweep_and_rows_keep_the_theorems_promise():
    PS, BS, delta = [0.1, 0.3], [1, 5], 0.05
    pop = rec.make_synthetic(len(PS), 60, 4, 20, torch.tensor(PS), seed=0)
    thm1 = ch2.theorem1_sweep(pop, PS, BS, delta=delta, num_trials=50, seed=0)
    for B in BS:
        assert thm1[B]["T1"] == {p: math.ceil(pac.theorem1_num_interactions(p, B, delta)) for p in PS}
        assert set(thm1[B]["T1"].values()) <= set(thm1[B]["T"].tolist())
        assert thm1[B]["success"].shape == (len(thm1[B]["T"]), len(PS))
    rows = ch2.theorem1_rows(thm1, PS, delta=delta, num_rated=20)
    assert [(r.B, r.p) for r in rows] == [(B, p) for B in BS for p in PS]
    for r in rows:
        assert r.exact <= delta and 1 <= r.t_exact <= r.t1 and r.ratio == r.t1 / r.t_exact
        # t_exact is the first T whose exact failure is at most delta
        assert r.t_exact == 1 or pac.theorem1_exact_failure([r.t_exact - 1], r.p, r.B, 20)[0] > delta
    table = ch2.theorem1_table(rows, _paper)
    assert table.count("\n") == 1 + len(rows) and "paper:ch2_t1_fail_p01_b1:(0, 1)" in table   # a failure rate: interval cut to [0, 1]
    assert ch2.theorem1_fail_name(0.3, 10) == "ch2_t1_fail_p03_b10"
    with pytest.raises(ValueError, match="delta"):
        ch2.theorem1_sweep(pop, PS, BS, delta=1.0, num_trials=5)
    with pytest.raises(ValueError, match="pref_rates"):
        ch2.theorem1_sweep(pop, PS + [0.2], BS, delta=delta, num_trials=5)


def test_noisy_summary_reads_the_curves_at_the_bound():
    T = [1, 2, 5, 10]
    err = torch.zeros(4, 2, 4, dtype=torch.float64)
    err[:, 0] = torch.tensor([[0.3, 0.3, 0.3, 0.0], [0.3, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4],
                             dtype=torch.float64)
    err[:, 1] = 0.5                                   # never below eps
    out = ch2.noisy_summary(T, err, [0.1, 0.2], {0.1: 2, 0.2: 10}, eps=0.1, delta=0.05)
    assert out[0.1] == {"T": 2, "fail": 0.25, "mean_err": pytest.approx(0.075), "first_ok": 5}
    assert out[0.2]["first_ok"] is None and out[0.2]["fail"] == 1.0
    with pytest.raises(ValueError, match="grid"):
        ch2.noisy_summary(T, err, [0.1], {0.1: 3}, eps=0.1, delta=0.05)


def test_noisy_error_curves_hold_every_bound_and_validate():
    target = rec.make_synthetic(1, 60, 4, 20, 0.2, seed=4)
    bounds = {0.05: 7, 0.1: 13}
    T, err = ch2.noisy_error_curves(target, [0.05, 0.1], bounds, batch_size=5, lr=1.0, num_trials=8, seed=0)
    assert set(bounds.values()) <= set(T) and max(T) == math.ceil(1.25 * 13)
    assert tuple(err.shape) == (len(T), 2, 8)
    with pytest.raises(ValueError, match="one user"):
        ch2.noisy_error_curves(rec.make_synthetic(2, 60, 4, 20, 0.2, seed=4), [0.1], {0.1: 3}, batch_size=5,
                               lr=1.0, num_trials=2)
    with pytest.raises(ValueError, match="sigma"):
        ch2.noisy_error_curves(target, [0.1, 0.2], {0.1: 3}, batch_size=5, lr=1.0, num_trials=2)


def test_chapter2_argument_validation():
    with pytest.raises(ValueError, match="pref_rate"):
        ch2.attack_error_panel(0.5, eps=0.1, delta=0.05, num_trials=2, user_seed=0, seed=0)
    with pytest.raises(ValueError, match="num_interactions"):
        ch2.probe_defense(None, None, num_interactions=0, batch_size=1, lr=0.1, loss="log", num_items=10)
    with pytest.raises(ValueError, match="cohorts"):
        ch2.secagg_experiment(None, None, [0, 2], client=pac.Client(1, 0.1, "log"), num_items=10)


def test_secagg_experiment_and_label_leak_on_a_small_population():
    data = rec.make_synthetic(40, 60, 4, 20, torch.linspace(0.05, 0.45, 40), seed=1)
    honest = rec.train_protocol1(data, num_rounds=5, clients_per_round=20, local_steps=2, batch_size=5, lr=0.3,
                                 loss="log", init_scale=0.3, seed=1)
    sa = ch2.secagg_experiment(honest, data, [1, 4, 40], client=pac.Client(5, 0.3, "log"), num_items=60, repeats=3,
                               seed=0)
    assert sa[1]["exposed"].shape == (120,) and bool((sa[1]["exposed"] == 1).all())   # no cohort: all exposed
    assert sa[40]["exposed"].shape == (3,) and float(sa[40]["exposed"].mean()) < float(sa[4]["exposed"].mean())
    rows = ch2.secagg_rows(sa)
    assert [r[0] for r in rows] == [1, 4, 40] and rows[0][1] == "1.000 (every cohort)" and rows[2][5] == 3
    lo, hi = (float(x) for x in rows[2][1].split("[")[1].rstrip("]").split(", "))   # a rate: its interval in [0, 1]
    assert 0.0 <= lo <= float(sa[40]["exposed"].mean()) <= hi <= 1.0
    for m, v in sa.items():        # every exposed member is exposed alone, through a dominated sum, or otherwise
        assert torch.allclose(v["exposed_alone"] + v["exposed_dominated"] + v["exposed_other"], v["exposed"])
        assert bool((v["share"] >= 0).all() and (v["share"] <= 1 + 1e-12).all())
    assert bool((sa[1]["exposed_alone"] == 1).all())                  # a cohort of one: every sum is its own
    assert rows[0][2:5] == [1.0, 0.0, 0.0] and rows[2][6] == int(sa[40]["single"].median())
    leak = ch2.label_leak(honest, data, batch_size=5, lr=0.3, loss="log", seed=0)
    assert leak["revealed"] == 0.25 and leak["all_or_nothing"] == 1.0                  # B = 5 of N = 20
    assert leak["accuracy"] == pytest.approx(leak["clients_right"])
    with pytest.raises(ValueError, match="repeats"):
        ch2.secagg_experiment(honest, data, [2], client=pac.Client(5, 0.3, "log"), num_items=60, repeats=0)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="dominance"):
            ch2.secagg_experiment(honest, data, [2], client=pac.Client(5, 0.3, "log"), num_items=60, dominance=bad)


def _secagg_routes_by_loops(honest, data, m, *, batch_size, lr, loss, num_items, seed, dominance, tol=1e-9):
    """Oracle for one repeat of ch2.secagg_experiment: the same round (same generator draws), then every
    cohort, item and member by Python loops: [G] fractions exposed alone / through a dominated shared
    sum / otherwise, and the shares of the members exposed through shared sums only."""
    g = torch.Generator().manual_seed(seed)
    u = honest.user_vectors
    perm = torch.randperm(u.shape[0], generator=g)
    up, items = u[perm], data.items[perm]
    _, deltas = rec.protocol1_client_update(up, honest.item_vectors, items, data.y[perm], local_steps=1,
                                            batch_size=batch_size, lr=lr, loss=loss, generator=g)
    fractions, shares = [], []
    for c0 in range(0, u.shape[0], m):
        contrib = {}                                     # item -> [(member, delta)] of the members who trained it
        for c in range(c0, c0 + m):
            for n in range(items.shape[1]):
                if bool((deltas[c, n] != 0).any()):
                    contrib.setdefault(int(items[c, n]), []).append((c, deltas[c, n]))
        routes = [0, 0, 0]
        for c in range(c0, c0 + m):
            alone, best, exposed = False, None, False
            for item, members in contrib.items():
                total = sum(d for _, d in members)
                cos = abs(float(total @ up[c] / (total.norm() * up[c].norm()))) if float(total.norm()) > 0 else 0.0
                exposed |= cos >= 1 - tol
                mine = [d for who, d in members if who == c]
                if not mine:
                    continue
                if len(members) == 1:
                    alone = True
                elif cos >= 1 - tol:
                    share = float(mine[0].norm() / sum(float(d.norm()) for _, d in members))
                    best = share if best is None else max(best, share)
            if exposed and alone:
                routes[0] += 1
            elif exposed:
                share = best if best is not None else 0.0
                shares.append(share)
                routes[1 if share >= dominance else 2] += 1
        fractions.append([r / m for r in routes])
    return torch.tensor(fractions, dtype=torch.float64).T, torch.tensor(shares, dtype=torch.float64)


@pytest.mark.parametrize("dominance", [0.99, 1 - 1e-9])
def test_secagg_routes_match_a_loop_oracle(dominance):
    """The split of the exposed members (a sum of their own / a shared sum they dominate, own norm at
    least `dominance` of the sum's L1 mass / otherwise) against loops over cohorts, items and members."""
    data = rec.make_synthetic(100, 40, 4, 20, torch.linspace(0.05, 0.45, 100), seed=3)
    honest = rec.train_protocol1(data, num_rounds=60, clients_per_round=50, local_steps=5, batch_size=5, lr=0.3,
                                 loss="log", init_scale=0.3, seed=3)   # trained: most |l'| are negligible
    kw = dict(batch_size=5, lr=0.3, loss="log", num_items=40, seed=4, dominance=dominance)
    sa = ch2.secagg_experiment(honest, data, [20], client=pac.Client(5, 0.3, "log"), num_items=40, seed=4,
                               dominance=dominance)[20]
    routes, shares = _secagg_routes_by_loops(honest, data, 20, **kw)
    assert torch.allclose(sa["exposed_alone"], routes[0]) and torch.allclose(sa["exposed_dominated"], routes[1])
    assert torch.allclose(sa["exposed_other"], routes[2])
    assert torch.allclose(torch.sort(sa["share"]).values, torch.sort(shares).values)
    assert float(sa["exposed_alone"].sum()) > 0
    if dominance == 0.99:   # both routes occur, and every member exposed through a shared sum dominates it
        assert float(sa["exposed_dominated"].sum()) > 0 and float(sa["exposed_other"].sum()) == 0.0
    else:                   # a threshold above every exposing share moves them all to "otherwise"
        assert float(sa["exposed_dominated"].sum()) == 0.0 and float(sa["exposed_other"].sum()) > 0


# ------------------------------------------------------------------ checks a wrong constant breaks
def _laws(seed=4):
    d = rec.make_synthetic(1, 200, 4, 20, 0.2, seed=seed)
    kw = dict(pref_rate=0.2, num_rated=20, lr=1.0, loss="hinge", num_draws=20000, seed=0)
    return (pac.AttackLaw(d.user_vectors[0], d.item_vectors, batch_size=5, sigma=0.1, protocol=2, **kw),
            pac.AttackLaw(d.user_vectors[0], d.item_vectors, batch_size=10, sigma=0.2, protocol=3, **kw))


def _all_pass(checks):
    return all(measured <= allowed for _, measured, allowed in checks.values())


@pytest.mark.parametrize("seed", [4, 5])
def test_bound_checks_pass_at_the_theorems_T(seed):
    law2, law3 = _laws(seed)
    checks = ch2.bound_checks(law2, law3, epsilon=0.1, delta=0.05)
    assert set(checks) == {"thm1", "thm2_E1", "thm2_E2", "thm2_error", "thm3_events", "thm3_error"}
    assert _all_pass(checks), checks


def _shrunk(orig, which):
    def bound(*a, **k):
        out = orig(*a, **k)
        if not isinstance(out, tuple):
            return 0.2 * out
        T, t1, t2 = out
        t1, t2 = (0.2 * t1 if which in ("all", "t1") else t1), (0.2 * t2 if which in ("all", "t2") else t2)
        return (max(t1, t2), t1, t2)
    return bound


@pytest.mark.parametrize("bound,which", [("theorem1_num_interactions", "all"), ("theorem2_num_interactions", "all"),
                                         ("theorem2_num_interactions", "t1"), ("theorem2_num_interactions", "t2"),
                                         ("theorem3_num_interactions", "all")])
def test_a_bound_five_times_too_small_fails_a_check(monkeypatch, bound, which):
    """Mutation test (issue 17): multiply a bound's T (or one term of Theorem 2's maximum) by 0.2 and
    the chapter's checks must fail."""
    law2, law3 = _laws()
    monkeypatch.setattr(pac, bound, _shrunk(getattr(pac, bound), which))
    assert not _all_pass(ch2.bound_checks(law2, law3, epsilon=0.1, delta=0.05))


def test_slack_totals_per_target_and_protocol():
    """slack_totals gives each target its own law (its p_c, N, catalog) for each protocol's batch size:
    target by target it equals slack_chain on the law built by hand, and two targets differ."""
    targets = [rec.make_synthetic(1, 200, 4, 20, p, seed=s) for p, s in ((0.2, 4), (0.3, 50))]
    kw = dict(lr=1.0, loss="hinge", sigma=1.0, seed=0)
    totals = ch2.slack_totals(targets, epsilon=0.1, delta=0.05, batch_sizes={2: 5, 3: 10}, **kw)
    assert set(totals) == {2, 3} and totals[2].shape == totals[3].shape == (2,)
    for j, t in enumerate(targets):
        for protocol, B in ((2, 5), (3, 10)):
            law = pac.AttackLaw(t.user_vectors[0], t.item_vectors, pref_rate=float(t.pref_rate[0]), num_rated=20,
                                batch_size=B, protocol=protocol, **kw)
            assert totals[protocol][j] == ch2.slack_chain(law, epsilon=0.1, delta=0.05)["total"], (j, protocol)
    assert totals[2][0] != totals[2][1] and bool((totals[2] > 1).all() and (totals[3] > 1).all())
    with pytest.raises(ValueError, match="targets"):
        ch2.slack_totals([], epsilon=0.1, delta=0.05, batch_sizes={2: 5}, **kw)
    with pytest.raises(ValueError, match="targets"):
        ch2.slack_totals([rec.make_synthetic(2, 50, 4, 20, 0.2, seed=0)], epsilon=0.1, delta=0.05,
                         batch_sizes={2: 5}, **kw)
    with pytest.raises(ValueError, match="batch_sizes"):
        ch2.slack_totals(targets, epsilon=0.1, delta=0.05, batch_sizes={1: 5}, **kw)


def test_slack_chain_factors_multiply_to_the_total():
    law2, law3 = _laws()
    for law in (law2, law3):
        r = ch2.slack_chain(law, epsilon=0.1, delta=0.05)
        T = list(r["T"].values())
        assert all(a >= b for a, b in zip(T, T[1:])), r["T"]
        assert math.prod(r["factor"].values()) == pytest.approx(r["total"])
        assert r["T"]["paper"] == pytest.approx(law.bound(0.1, 0.05, beta=0.5 * law.multiplier)
                                                if law.protocol == 2 else law.bound(0.1, 0.05))
    assert ch2.slack_chain(law3, epsilon=0.1, delta=0.05)["factor"]["beta"] == 1.0
    with pytest.raises(ValueError, match="law2"):
        ch2.bound_checks(law3, law3, epsilon=0.1, delta=0.05)


def test_dp_composition_budget_is_the_same_at_every_noise_level_and_above_dps_floor():
    from fedlab.privacy import ldp

    data = rec.make_synthetic(1, 200, 4, 20, 0.2, seed=4)
    kw = dict(pref_rate=0.2, num_rated=20, lr=1.0, loss="hinge", seed=0, sigma=1.0)
    laws = {"P2": pac.AttackLaw(data.user_vectors[0], data.item_vectors, batch_size=5, protocol=2, **kw),
            "P3": pac.AttackLaw(data.user_vectors[0], data.item_vectors, batch_size=10, protocol=3, **kw)}
    comp = ch2.dp_composition(laws, [0.5, 1.0, 2.0], clip_norm=1.0, epsilon=0.1, delta=0.05, dp_delta=1e-5)
    floor = ldp.gaussian_composed_epsilon(1 / ldp.gdp_mu_to_distinguish(0.95), 1, 1e-5)
    for r in comp.values():
        assert np.ptp(r["mu_needed"]) < 0.01 * r["mu_needed"].mean()        # T needed grows like z^2
        assert (r["needed"] >= 100).all() and (r["bound"] > r["needed"]).all()
        assert (r["eps_needed"] > 10 * floor).all() and (r["eps_bound"] > r["eps_needed"]).all()
        # sigma is 2 z C sqrt(n): the multiplier the accountant is told is the one the message has
        n = 5 if r is comp["P2"] else 20
        assert np.allclose([ldp.ldp_noise_multiplier(s, 1.0, n) for s in r["sigma"]], r["z"])
    goals = ch2.dp_error_targets(laws["P2"], [0.05, 0.1, 0.3], noise_multiplier=0.5, clip_norm=1.0, delta=0.05,
                                 dp_delta=1e-5)
    assert (np.diff(goals["eps_needed"]) < 0).all()                       # coarser goals cost less
    with pytest.raises(ValueError, match="noise_multipliers"):
        ch2.dp_composition(laws, [0.0], clip_norm=1.0, epsilon=0.1, delta=0.05, dp_delta=1e-5)
    with pytest.raises(ValueError, match="dp_delta"):
        ch2.dp_composition(laws, [1.0], clip_norm=1.0, epsilon=0.1, delta=0.05, dp_delta=0.0)
