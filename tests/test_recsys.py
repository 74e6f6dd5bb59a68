"""RAIFLE (Pham, Kulkarni & Houmansadr): local algorithms, attacks, closed form, LDP and pruning."""
import math

import pytest
import torch

from fedlab.attacks.interaction_inference.recsys import (FncfUser, RaifleBudget, RaifleVariant, _guess_embeddings, analytic_fcf_attack, attack_hessian,
                                                        closed_form_interactions, matching_loss,
                                                        pointwise_l2_update, raifle, raifle_fcf, raifle_fncf)
from fedlab.metrics import roc_auc_rows
from fedlab.fl.recsys.interactions import fcf_item_updates, fncf_init, fncf_updates
from oracles import fcf_client_train, fcf_item_update, fncf_client_train, fncf_update, fncf_updates_vmap
from fedlab.privacy import prune_by_magnitude
from fedlab.privacy.ldp import (analytic_gaussian_delta, classical_gaussian_sigma, gaussian_sigma,
                                ldp_gaussian)
from fedlab.privacy.defenses import clip_rows, prune_rows

torch.set_num_threads(1)


def _users(U=4, m=40, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(U, m, d, generator=g)
    E = torch.randn(U, d, generator=g)
    I = torch.zeros(U, m)
    I[:, : m // 5] = 1.0
    I = I[:, torch.randperm(m, generator=g)]
    mask = torch.ones(U, m, dtype=torch.bool)
    mask[0, -5:] = False
    I[0, -5:] = 0.0
    return X * mask[..., None], E, I, mask


def test_fcf_functional_matches_plain_training():
    X, E, I, mask = _users()
    for alpha in (0.0, 2.0):
        ref = fcf_client_train(X[1], E[1], I[1], alpha=alpha, lr=0.3)
        assert torch.allclose(fcf_item_update(X[1], E[1], I[1], alpha=alpha, lr=0.3), ref, atol=1e-5)
    batched = fcf_item_updates(X, E, I, mask, lr=0.3)
    single = torch.func.vmap(lambda x, e, i, k: fcf_item_update(x, e, i, k, lr=0.3))(X, E, I, mask)
    assert torch.allclose(batched, single, atol=1e-5)
    assert torch.linalg.matrix_rank(batched[1]) == 1          # every row is a multiple of e_u
    with pytest.raises(ValueError):
        fcf_item_updates(X[0], E, I, mask)


def test_fncf_functional_matches_plain_training():
    X, E, I, mask = _users(U=3, m=20, d=6)
    model, theta = fncf_init(6, seed=0)
    a = fncf_update(model, theta, X[1], E[1], I[1], lr=0.5, local_steps=3)
    b = fncf_client_train(model, theta, X[1], E[1], I[1], lr=0.5, local_steps=3)
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[2], b[2], atol=1e-6)
    assert all(torch.allclose(a[1][k], b[1][k], atol=1e-6) for k in theta)
    c = fncf_updates(model, theta, X, E, I, mask, lr=0.5, local_steps=3)
    v = fncf_updates_vmap(model, theta, X, E, I, mask, lr=0.5, local_steps=3)
    assert torch.allclose(c[0], v[0], atol=1e-6)
    assert all(torch.allclose(c[1][k], v[1][k], atol=1e-6) for k in theta)
    assert c[0][0, -5:].abs().max() == 0                       # padded items are never updated
    with pytest.raises(ValueError):
        fncf_update(model, theta, X[0], E[0], I[0], local_steps=0)


def test_fncf_differentiable_in_interactions():
    X, E, I, mask = _users(U=2, m=12, d=4)
    model, theta = fncf_init(4, seed=1)
    Ip = I.clone().requires_grad_(True)
    dX, dT, _ = fncf_updates(model, theta, X, E, Ip, mask, lr=0.5, local_steps=2)
    dX.sum().backward()
    assert Ip.grad is not None and Ip.grad.abs().sum() > 0


def test_fncf_one_step_written_out_matches_autograd():
    """local_steps=1 runs the written-out backward pass (fncf_backprop): the same update as the
    vmapped autograd oracle, and the same derivative with respect to I and E as differentiating
    that oracle (autograd's double backward)."""
    X, E, I, mask = _users(U=3, m=20, d=6)
    model, theta = fncf_init(6, seed=2)
    a = fncf_updates(model, theta, X, E, I, mask, lr=0.7, local_steps=1)
    v = fncf_updates_vmap(model, theta, X, E, I, mask, lr=0.7, local_steps=1)
    assert torch.allclose(a[0], v[0], atol=1e-6) and torch.allclose(a[2], v[2], atol=1e-6)
    assert all(torch.allclose(a[1][k], v[1][k], atol=1e-6) for k in theta)
    Ip, Ep = I.clone().requires_grad_(True), E.clone().requires_grad_(True)

    def objective(fn):
        dX, dT, En = fn(Ip, Ep)
        return (dX ** 3).sum() + sum((t ** 2).sum() for t in dT.values()) + (En ** 2).sum()

    g1 = torch.autograd.grad(objective(lambda i, e: fncf_updates(model, theta, X, e, i, mask, lr=0.7, local_steps=1)),
                             [Ip, Ep])
    g2 = torch.autograd.grad(objective(lambda i, e: fncf_updates_vmap(model, theta, X, e, i, mask, lr=0.7,
                                                                      local_steps=1)), [Ip, Ep])
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(g1, g2))


@pytest.mark.parametrize("algorithm", ["fcf", "fncf"])
def test_raifle_losses_equal_the_matching_loss_of_the_simulated_update(algorithm):
    """raifle_fcf (rank-one expansion in float64) and raifle_fncf (first-layer row space) never form
    the simulated [m, d] update; their loss must still be matching_loss of that update against a
    noisy target (components outside the simulated update's span, as under LDP), with and without
    the users' clipping and the model-parameter term. max_iter=1 returns the starting point."""
    X, E, I, mask = _users(U=4, m=30, d=24, seed=4)     # d > 16 hidden units: a remainder outside W1x's rows
    model, theta = fncf_init(24, seed=3)
    noise = 0.1 * torch.randn(X.shape, generator=torch.Generator().manual_seed(0)) * mask[..., None]   # as after LDP
    for est in (True, False):
        for ump in ((False,) if algorithm == "fcf" else (False, True)):
            for clip in (None, (0.05, 0.02)):
                kw = dict(budget=RaifleBudget(max_iter=1, num_restarts=1), seed=7)
                if algorithm == "fcf":
                    upd = fcf_item_updates(X, E, I, mask, alpha=1.5) + noise
                    res = raifle_fcf(X, upd, mask, estimate_embedding=est, alpha=1.5, clip_norm=clip and clip[0], **kw)
                else:
                    upd, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=1.0, local_steps=1)
                    upd = upd + noise * upd.abs().mean()
                    res = raifle_fncf(model, theta, X, upd, dT, mask,
                                      variant=RaifleVariant(estimate_embedding=est, use_model_params=ump),
                                      user=FncfUser(items_clip_norm=clip and clip[0], params_clip_norm=clip and clip[1]),
                                      **kw)
                Eu = res.user_emb if est else _guess_embeddings(4, 24, 7, None)
                if algorithm == "fcf":
                    pX, pT = fcf_item_updates(X, Eu, res.interactions, mask, alpha=1.5), None
                else:
                    pX, pT, _ = fncf_updates(model, theta, X, Eu, res.interactions, mask, lr=1.0, local_steps=1)
                if clip:
                    pX = clip_rows(pX, clip[0])
                    pT = pT if pT is None else clip_rows(pT, clip[1])
                ref = matching_loss(pX, upd, mask, pT if ump else None, dT if ump else None)
                assert torch.allclose(res.loss, ref, rtol=1e-5, atol=1e-6), (est, ump, clip, res.loss, ref)
    with pytest.raises(ValueError, match="alpha"):
        raifle_fcf(X, X, mask, alpha=-1.0, budget=RaifleBudget(max_iter=1))


def test_raifle_fast_losses_have_the_gradient_of_the_matching_loss():
    """The gradient the optimiser follows (w.r.t. the interactions and the embedding) of the fast FCF
    and FNCF losses equals that of matching_loss on the simulated update, clipping included."""
    import fedlab.attacks.interaction_inference.recsys as rs

    X, E, I, mask = _users(U=3, m=25, d=24, seed=6)
    model, theta = fncf_init(24, seed=4)
    noise = 0.1 * torch.randn(X.shape, generator=torch.Generator().manual_seed(1)) * mask[..., None]
    fcf_upd = fcf_item_updates(X, E, I, mask) + noise
    fncf_upd, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=1.0, local_steps=1)
    fncf_upd = fncf_upd + noise * fncf_upd.abs().mean()
    captured = {}

    def grab(loss_fn, *args, **kwargs):
        captured["fn"] = loss_fn
        return None

    Ip = torch.rand(6, 25, generator=torch.Generator().manual_seed(2))
    Ep = torch.randn(6, 24, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([0, 1, 2, 0, 1, 2])                    # two restarts: the broadcast branch
    orig = rs.raifle
    try:
        rs.raifle = grab
        raifle_fcf(X, fcf_upd, mask, clip_norm=5.0)
        fast_fcf = captured["fn"]
        raifle_fncf(model, theta, X, fncf_upd, dT, mask, variant=RaifleVariant(use_model_params=True),
                    user=FncfUser(items_clip_norm=0.01, params_clip_norm=0.05))
        fast_fncf = captured["fn"]
    finally:
        rs.raifle = orig

    def slow_fcf(I_, E_, r):
        return matching_loss(clip_rows(fcf_item_updates(X[r], E_, I_, mask[r]), 5.0), fcf_upd[r], mask[r])

    def slow_fncf(I_, E_, r):
        pX, pT, _ = fncf_updates(model, theta, X[r], E_, I_, mask[r], lr=1.0, local_steps=1)
        return matching_loss(clip_rows(pX, 0.01), fncf_upd[r], mask[r], clip_rows(pT, 0.05), {k: v[r] for k, v in dT.items()})

    for fast, slow in ((fast_fcf, slow_fcf), (fast_fncf, slow_fncf)):
        for r in (rows, torch.tensor([2, 0])):                # all rows, then a subset (gather branch)
            grads = []
            for fn in (fast, slow):
                I_, E_ = Ip[:len(r)].clone().requires_grad_(True), Ep[:len(r)].clone().requires_grad_(True)
                grads.append(torch.autograd.grad(fn(I_, E_, r).sum(), [I_, E_]))
            assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(*grads))


def test_analytic_attack_recovers_planted_user_vector():
    X, E, I, mask = _users(U=5, m=60, d=8, seed=3)
    upd = fcf_item_updates(X, E, I, mask, lr=0.1)
    scores, I_hat, e_hat = analytic_fcf_attack(upd, X, mask, lr=0.1)
    cos = torch.nn.functional.cosine_similarity(e_hat, E, dim=1)
    assert (cos > 0.999).all(), cos                              # direction and sign
    assert torch.allclose(e_hat, E, atol=1e-3)                   # and scale
    assert torch.allclose(I_hat[mask], I[mask], atol=1e-3)
    assert roc_auc_rows(I, scores, mask).min() == 1.0


def test_raifle_fcf_with_embedding_estimation():
    X, E, I, mask = _users(U=3, m=40, d=8, seed=1)
    upd = fcf_item_updates(X, E, I, mask)
    res = raifle_fcf(X, upd, mask, estimate_embedding=True, budget=RaifleBudget(max_iter=150, num_restarts=3), seed=0)
    assert roc_auc_rows(I, res.scores, mask).mean() > 0.95
    guess = raifle_fcf(X, upd, mask, estimate_embedding=False, budget=RaifleBudget(max_iter=60), seed=0)
    assert roc_auc_rows(I, guess.scores, mask).mean() < 0.8       # wrong embedding: close to chance


def test_raifle_validates_arguments():
    with pytest.raises(ValueError, match="RaifleBudget.num_restarts"):
        raifle(lambda I, E, r: I.sum(1), 2, 3, budget=RaifleBudget(num_restarts=0))
    with pytest.raises(ValueError, match="budget must be a RaifleBudget"):
        raifle(lambda I, E, r: I.sum(1), 2, 3, budget={"max_iter": 5})
    with pytest.raises(ValueError, match="user_ids"):
        raifle(lambda I, E, r: I.sum(1), 2, 3, user_ids=[0, 1, 2])
    # a loss normalised by a zero update (chapter 3a's linear check at seed 26): user 1's answer would be its
    # random start, returned as if optimised; now an error naming the user
    zero_norm = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match=r"not finite for users \[1\]"):
        raifle(lambda I, E, r: ((I - 0.5) ** 2).sum(1) / zero_norm[r], 2, 3, budget=RaifleBudget(max_iter=5))
    ok = raifle(lambda I, E, r: ((I - 0.5) ** 2).sum(1) / zero_norm[r].clamp_min(1e-12), 2, 3,
                budget=RaifleBudget(max_iter=20))
    assert bool(torch.isfinite(ok.loss).all())
    for field, bad in (("max_iter", 0), ("history_size", 1.5), ("tol", -1.0), ("emb_init_std", 0.0),
                       ("antithetic", 1)):
        with pytest.raises(ValueError, match=f"RaifleBudget.{field}"):
            RaifleBudget(**{field: bad})
    for field, bad in (("estimate_embedding", 1), ("use_model_params", "yes"), ("squared", None),
                       ("continuation", "on")):
        with pytest.raises(ValueError, match=f"RaifleVariant.{field}"):
            RaifleVariant(**{field: bad})
    for field, bad in (("lr", 0.0), ("local_steps", 0), ("items_clip_norm", -1.0), ("params_clip_norm", float("inf"))):
        with pytest.raises(ValueError, match=f"FncfUser.{field}"):
            FncfUser(**{field: bad})
    assert RaifleVariant(continuation=[0.3, 0.1]).continuation == (0.3, 0.1)   # a list is kept as a tuple


def test_a_users_result_does_not_depend_on_its_batch():
    """Per-user draws (user_generator) and one L-BFGS per candidate: attacking users 0-3 together,
    in another order with padding, or alone gives each user the same reconstruction."""
    X, E, I, mask = _users(U=4, m=30, d=6, seed=2)
    mask[1, 20:] = False                                           # users of different lengths
    upd = fcf_item_updates(X, E, I, mask)
    kw = dict(estimate_embedding=True, budget=RaifleBudget(max_iter=40, num_restarts=2), seed=5)
    together = raifle_fcf(X, upd, mask, user_ids=torch.arange(4), **kw)
    for u in range(4):
        alone = raifle_fcf(X[u:u + 1], upd[u:u + 1], mask[u:u + 1], user_ids=[u], **kw)
        m = int(mask[u].sum())
        assert torch.allclose(alone.scores[0, :m], together.scores[u, :m], atol=1e-5), u
    perm = torch.tensor([2, 0, 3, 1])
    shuffled = raifle_fcf(X[perm], upd[perm], mask[perm], user_ids=perm, **kw)
    assert torch.allclose(shuffled.scores, together.scores[perm], atol=1e-5)


def test_closed_form_and_rank_condition():
    g = torch.Generator().manual_seed(0)
    m, p = 6, 10
    J = torch.randn(m, p, generator=g, dtype=torch.float64)
    f0 = torch.rand(m, generator=g, dtype=torch.float64)
    I = (torch.rand(m, generator=g) < 0.5).double()
    theta_hat = pointwise_l2_update(J, f0, I)
    assert torch.allclose(closed_form_interactions(J, f0, theta_hat), I, atol=1e-9)
    H = attack_hessian(J)
    assert torch.linalg.eigvalsh(H).min() > 0                    # Thm. 2: rank m -> strictly convex
    J2 = torch.randn(12, p, generator=g, dtype=torch.float64)    # m > p: rank < m
    assert torch.linalg.eigvalsh(attack_hessian(J2)).min().abs() < 1e-8
    with pytest.raises(ValueError):
        closed_form_interactions(J2, torch.zeros(12, dtype=torch.float64), torch.zeros(p, dtype=torch.float64))


@pytest.mark.parametrize("eps,delta,sens,expected", [
    (1.0, 1e-5, 1.0, 3.730631),       # Balle & Wang (2018), analytic Gaussian, eps=1, delta=1e-5
    (0.5, 1e-5, 1.0, 2 * math.sqrt(2 * math.log(1.25e5))),   # classical, Dwork & Roth Thm. A.1
    (1.0, 1e-8, 100.0, 100 * math.sqrt(2 * math.log(1.25e8))),
])
def test_gaussian_sigma_published_values(eps, delta, sens, expected):
    method = "analytic" if (eps, delta) == (1.0, 1e-5) else "auto"
    assert gaussian_sigma(eps, delta, sens, method=method) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("eps", [10.0, 20.0, 100.0, 500.0])
def test_analytic_sigma_is_tight(eps):
    s = gaussian_sigma(eps, 1e-8, 0.7)
    assert analytic_gaussian_delta(s, eps, 0.7) == pytest.approx(1e-8, rel=0.05)
    # for eps > 1 the classical formula is not a valid bound: its sigma leaks far more than delta
    assert analytic_gaussian_delta(classical_gaussian_sigma(eps, 1e-8, 0.7), eps, 0.7) > 1.2e-8


def test_analytic_beats_classical_for_small_eps():
    s = gaussian_sigma(1.0, 1e-5, 1.0, method="analytic")
    assert s < classical_gaussian_sigma(1.0, 1e-5, 1.0)


def test_gaussian_sigma_rejects_bad_input():
    for args in [(0.0, 1e-5, 1.0), (1.0, 0.0, 1.0), (1.0, 1e-5, -1.0)]:
        with pytest.raises(ValueError):
            gaussian_sigma(*args)


def test_ldp_noise_has_calibrated_sigma():
    U = torch.zeros(50, 40, 20)
    out = ldp_gaussian(U, 10.0, 1e-8, 0.7, generator=torch.Generator().manual_seed(0), safe=False)   # the float one
    sigma = gaussian_sigma(10.0, 1e-8, 0.7)
    assert out.std().item() == pytest.approx(sigma, rel=0.02)
    big = torch.full((3, 10), 5.0)
    clipped = ldp_gaussian(big, 1e9, 0.5, 1.0, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(clipped.norm(dim=1), torch.full((3,), 0.5), atol=1e-3)     # Delta_2 / 2


def test_prune_rows_matches_prune_by_magnitude():
    g = torch.Generator().manual_seed(0)
    upd = {"items": torch.randn(4, 7, 3, generator=g), "w": torch.randn(4, 5, generator=g)}
    out = prune_rows(upd, 0.6)
    for u in range(4):
        ref = prune_by_magnitude({k: v[u] for k, v in upd.items()}, 0.6)
        assert all(torch.equal(out[k][u], ref[k]) for k in upd)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1, 5:] = False
    padded = upd["items"] * mask[..., None]
    p = prune_rows(padded, 0.5, mask=mask)
    assert (p[1] != 0).sum() == 15 - math.floor(0.5 * 15)
    with pytest.raises(ValueError):
        prune_rows(padded, 1.0)


def test_fncf_backprop_temperature_tends_to_the_relu_network():
    """fncf_backprop(temperature=tau) smooths the hidden ReLUs into tau * softplus(a / tau): close to
    the network at a small tau, different at a large one; a negative tau is refused."""
    from fedlab.fl.recsys.interactions import fncf_backprop, fncf_first_layer
    X, E, I, mask = _users(U=2, m=15, d=6, seed=3)
    model, theta = fncf_init(6, seed=1)
    _, W1x, layers = fncf_first_layer(model, theta, 6)
    args = (layers, theta, X @ W1x.T, E, I, mask.float())
    exact, gE, _ = fncf_backprop(*args)
    small, gE_small, _ = fncf_backprop(*args, temperature=1e-5)
    large, _, _ = fncf_backprop(*args, temperature=1.0)
    assert torch.allclose(small, exact, atol=1e-6) and torch.allclose(gE_small, gE, atol=1e-6)
    assert (large - exact).abs().max() > 1e-3
    with pytest.raises(ValueError, match="temperature"):
        fncf_backprop(*args, temperature=-0.1)


@pytest.mark.slow
def test_fncf_continuation_ends_below_the_plain_lbfgs_stall_and_ranks_better():
    """Algorithm 2 on FNCF: the exact matching loss is piecewise smooth in the embedding (ReLU
    patterns), and plain L-BFGS stalls far above the loss at the truth; the continuation over
    smoothed ReLUs (raifle_fncf's default) ends well below that stall, within the same budget, and its
    scores rank the true interactions better. It does not reach the loss at the truth (below 0.3, not
    0.01). How many evaluations the stages use before their stopping tests fire depends on floating
    point, so only the budget is checked. The loss at the truth is reported (truth=) and equals
    matching_loss there."""
    d = 32
    X, E, I, mask = _users(U=3, m=60, d=d, seed=5)
    model, theta = fncf_init(d, seed=4)
    dX, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=1.0, local_steps=1)
    kw = dict(budget=RaifleBudget(max_iter=250, num_restarts=2), seed=0, truth=(I, E))
    plain = raifle_fncf(model, theta, X, dX, dT, mask, variant=RaifleVariant(continuation=None), **kw)
    cont = raifle_fncf(model, theta, X, dX, dT, mask, **kw)
    assert torch.allclose(cont.loss_truth, matching_loss(dX, dX, mask), atol=1e-2) and cont.loss_truth.max() < 0.01
    assert plain.loss.min() > 0.5, plain.loss                    # the stall
    assert cont.loss.max() < 0.3 and 0 < cont.iterations <= 250, (cont.loss, cont.iterations)
    assert roc_auc_rows(I, cont.scores, mask).mean() > roc_auc_rows(I, plain.scores, mask).mean()
    with pytest.raises(ValueError, match="max_iter"):
        raifle_fncf(model, theta, X, dX, dT, mask, variant=RaifleVariant(continuation=(0.1, 0.01)),
                    budget=RaifleBudget(max_iter=2))
    with pytest.raises(ValueError, match="temperatures"):
        raifle_fncf(model, theta, X, dX, dT, mask, variant=RaifleVariant(continuation=(0.1, 0.0)),
                    budget=RaifleBudget(max_iter=30))


def test_fncf_one_network_per_user_is_each_network_alone():
    """theta stacked per user (one FNCF network each, the network draws of chapter 3a): the honest update
    and the attack's loss at the truth of user u are those of network u run alone; the multi-step update
    refuses per-user networks."""
    from fedlab.fl.recsys.interactions import fncf_per_user

    g = torch.Generator().manual_seed(7)
    U, m, d = 3, 9, 6
    X, E = torch.randn(U, m, d, generator=g), torch.randn(U, d, generator=g)
    mask = torch.ones(U, m, dtype=torch.bool)
    mask[1, -2:] = False
    I = (torch.rand(U, m, generator=g) < 0.3).float() * mask
    nets = [fncf_init(d, seed=s) for s in (11, 12, 13)]
    model = nets[0][0]
    stacked = {k: torch.stack([t[k] for _, t in nets]) for k in nets[0][1]}
    assert fncf_per_user(model, stacked) and not fncf_per_user(model, nets[0][1])
    dX, dT, En = fncf_updates(model, stacked, X, E, I, mask, lr=0.5, local_steps=1)
    ump, four = RaifleVariant(use_model_params=True), RaifleBudget(max_iter=4)
    res = raifle_fncf(model, stacked, X, dX, dT, mask, variant=ump, budget=four, truth=(I, E))
    for u, (mo, th) in enumerate(nets):
        a, b, c = fncf_updates(mo, th, X[u:u + 1], E[u:u + 1], I[u:u + 1], mask[u:u + 1], lr=0.5, local_steps=1)
        assert torch.allclose(dX[u:u + 1], a, atol=1e-7) and torch.allclose(En[u:u + 1], c, atol=1e-7)
        assert all(torch.allclose(dT[k][u:u + 1], b[k], atol=1e-7) for k in b)
        one = raifle_fncf(mo, th, X[u:u + 1], a, b, mask[u:u + 1], variant=ump, budget=four,
                          truth=(I[u:u + 1], E[u:u + 1]), user_ids=[u])
        assert torch.allclose(res.loss_truth[u:u + 1], one.loss_truth, atol=1e-6), u
    with pytest.raises(ValueError, match="one network per user"):
        fncf_updates(model, stacked, X, E, I, mask, lr=0.5, local_steps=2)
    with pytest.raises(ValueError, match="one network per user"):
        raifle_fncf(model, stacked, X[:2], dX[:2], {k: v[:2] for k, v in dT.items()}, mask[:2], budget=four)
    with pytest.raises(ValueError, match="theta"):
        fncf_per_user(model, {**nets[0][1], "0.weight": stacked["0.weight"]})


@pytest.mark.parametrize("algorithm", ["fcf", "fncf"])
def test_raifle_with_a_pruning_mask_matches_only_the_kept_coordinates(algorithm):
    """The attacker who knows the pruning (coord_mask): its loss is matching_loss of the simulated update
    with the pruned coordinates zeroed, against the pruned update (FNCF: also with the network term and
    with one network per user), and the true answer then scores ~0, where the paper's attacker, whose
    dense simulation must reproduce the zeros, scores the true answer far above 0 (FNCF's float32 simulation
    leaves a floor of ~1e-3 at the truth even unpruned)."""
    X, E, I, mask = _users(U=4, m=30, d=24, seed=5)
    model, theta = fncf_init(24, seed=3)
    for est in (True, False):
        for ump in ((False,) if algorithm == "fcf" else (False, True)):
            kw = dict(budget=RaifleBudget(max_iter=1, num_restarts=1), seed=7, truth=(I, E))
            if algorithm == "fcf":
                upd = prune_rows(fcf_item_updates(X, E, I, mask), 0.7, mask=mask)
                res = raifle_fcf(X, upd, mask, estimate_embedding=est, coord_mask=upd != 0, **kw)
                naive = raifle_fcf(X, upd, mask, estimate_embedding=est, **kw)
            else:
                full, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=1.0, local_steps=1)
                upd = prune_rows(full, 0.7, mask=mask)
                v = RaifleVariant(estimate_embedding=est, use_model_params=ump)
                res = raifle_fncf(model, theta, X, upd, dT, mask, variant=v, coord_mask=upd != 0, **kw)
                naive = raifle_fncf(model, theta, X, upd, dT, mask, variant=v, **kw)
            Eu = res.user_emb if est else _guess_embeddings(4, 24, 7, None)
            if algorithm == "fcf":
                pX, pT = fcf_item_updates(X, Eu, res.interactions, mask), None
            else:
                pX, pT, _ = fncf_updates(model, theta, X, Eu, res.interactions, mask, lr=1.0, local_steps=1)
            ref = matching_loss(pX * (upd != 0), upd, mask, pT if ump else None, dT if ump else None)
            assert torch.allclose(res.loss, ref, rtol=1e-5, atol=1e-6), (est, ump, res.loss, ref)
            if est:      # the true interactions and embedding reproduce every kept coordinate
                assert res.loss_truth.max() < 0.01 and naive.loss_truth.min() > 0.1, (res.loss_truth, naive.loss_truth)
    # one network per user: the same numbers as each network alone
    if algorithm == "fncf":
        thetas = [fncf_init(24, seed=s)[1] for s in (3, 4, 5, 6)]
        stacked = {k: torch.stack([t[k] for t in thetas]) for k in thetas[0]}
        full, dT, _ = fncf_updates(model, stacked, X, E, I, mask, lr=1.0, local_steps=1)
        upd = prune_rows(full, 0.7, mask=mask)
        res = raifle_fncf(model, stacked, X, upd, dT, mask, coord_mask=upd != 0,
                          budget=RaifleBudget(max_iter=1, num_restarts=1), seed=7,
                          truth=(I, E))
        assert res.loss_truth.max() < 0.01, res.loss_truth
    with pytest.raises(ValueError, match="coord_mask"):
        if algorithm == "fcf":
            raifle_fcf(X, X, mask, coord_mask=torch.ones(4, 30, 23, dtype=torch.bool), budget=RaifleBudget(max_iter=1))
        else:
            raifle_fncf(model, theta, X, X, None, mask, coord_mask=torch.ones_like(X, dtype=torch.bool),
                        user=FncfUser(items_clip_norm=1.0), budget=RaifleBudget(max_iter=1))


@pytest.mark.parametrize("algorithm", ["fcf", "fncf"])
def test_masked_losses_on_restarts_and_running_subsets(monkeypatch, algorithm):
    """The masked losses are evaluated as L-BFGS calls them: every user once per restart (the broadcast path)
    and a subset of rows still running, with repeats, in any order; each row must be matching_loss of its
    own user's masked simulated update (a mask taken by position instead of by user fails here)."""
    import fedlab.attacks.interaction_inference.recsys as rf

    captured = {}
    monkeypatch.setattr(rf, "raifle", lambda loss_fn, *a, **k: captured.setdefault("fn", loss_fn))
    X, E, I, mask = _users(U=5, m=20, d=16, seed=6)
    mask[3, 9:] = False
    X = X * mask[..., None]
    model, theta = fncf_init(16, seed=3)
    if algorithm == "fcf":
        upd = prune_rows(fcf_item_updates(X, E, I, mask), 0.6, mask=mask)
        rf.raifle_fcf(X, upd, mask, coord_mask=upd != 0, budget=rf.RaifleBudget(max_iter=1))
    else:
        full, dT, _ = fncf_updates(model, theta, X, E, I, mask, lr=1.0, local_steps=1)
        upd = prune_rows(full, 0.6, mask=mask)
        rf.raifle_fncf(model, theta, X, upd, dT, mask, coord_mask=upd != 0, budget=rf.RaifleBudget(max_iter=1),
                       variant=rf.RaifleVariant(continuation=None))
    fn, keep = captured["fn"], upd != 0
    g = torch.Generator().manual_seed(1)
    for rows in (torch.arange(5).repeat(3), torch.tensor([0, 3, 4, 4, 1]), torch.tensor([2])):
        Ic, Ec = torch.rand(len(rows), 20, generator=g), torch.randn(len(rows), 16, generator=g)
        if algorithm == "fcf":
            pX = fcf_item_updates(X[rows], Ec, Ic, mask[rows])
        else:
            pX, _, _ = fncf_updates(model, theta, X[rows], Ec, Ic, mask[rows], lr=1.0, local_steps=1)
        ref = matching_loss(pX * keep[rows], upd[rows], mask[rows])
        assert torch.allclose(fn(Ic, Ec, rows), ref, rtol=1e-5, atol=1e-6), rows
