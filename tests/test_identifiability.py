"""PAC identifiability (London 2020): federated recommendation protocols and the zero-vector attack,
checked against closed forms, exact probabilities and the paper's theorems."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedlab.attacks import identifiability as pac
from fedlab.fl.recsys import ratings as rec

torch.set_num_threads(1)
F64 = torch.float64


def _data(num_users=64, p=0.2, num_items=120, dim=4, num_rated=20, seed=0):
    return rec.make_synthetic(num_users, num_items, dim, num_rated, p, seed=seed)


# ------------------------------------------------------------------ losses (Assumption 2)
def test_loss_derivative_at_zero_values():
    assert rec.loss_derivative_at_zero("negative_margin") == -1.0
    assert rec.loss_derivative_at_zero("hinge") == -1.0
    assert rec.loss_derivative_at_zero("log") == -0.5


@pytest.mark.parametrize("loss", rec.LOSSES)
def test_closed_form_loss_gradient_matches_autograd(loss):
    z = torch.tensor([-2.3, -0.4, 0.0, 0.3, 0.99, 1.7], dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(rec.margin_loss(z, loss).sum(), z)
    assert torch.allclose(rec.margin_loss_grad(z.detach(), loss), g)


def test_unknown_loss_raises():
    with pytest.raises(ValueError, match="loss"):
        rec.margin_loss(torch.zeros(2), "square")


# ------------------------------------------------------------------ data and honest protocol
def test_synthetic_data_has_the_requested_preference_rate():
    p = torch.tensor([0.1, 0.25, 0.45], dtype=F64).repeat(4)
    d = rec.make_synthetic(12, 200, 5, 40, p, seed=3)
    assert torch.allclose(d.pref_rate, torch.round(p * 40) / 40)
    # catalog-wide like rate matches too, and labels agree with the generating model
    assert torch.allclose((d.labels > 0).to(F64).mean(1), p, atol=0.01)
    assert rec.prediction_error(d.user_vectors, d.item_vectors, d.labels).max() == 0
    assert all(len(set(row.tolist())) == 40 for row in d.items)            # S_c has distinct items


def test_client_update_matches_hand_computation():
    """One Protocol-1 step with B = N (no randomness) against Eq. (1)-(2) written out."""
    u = torch.tensor([[0.5, -1.0]], dtype=F64)
    V = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], dtype=F64)
    items, y = torch.tensor([[0, 2]]), torch.tensor([[1.0, -1.0]], dtype=F64)
    lr = 0.1
    u_new, deltas = rec.protocol1_client_update(u, V, items, y, local_steps=1, batch_size=2, lr=lr, loss="log")
    s = [-1 / (1 + math.exp(0.5)) * 1.0, -1 / (1 + math.exp(1.5)) * -1.0]   # l'(y u.v) y
    g_u = (s[0] * V[0] + s[1] * V[2]) / 2
    assert torch.allclose(u_new[0], u[0] - lr * g_u)
    assert torch.allclose(deltas[0, 0], -lr * s[0] * u[0]) and torch.allclose(deltas[0, 1], -lr * s[1] * u[0])


def test_protocol3_client_update_under_a_nonzero_probe_matches_plain_sgd():
    """Protocol 3 (SGD without replacement, London 2020 App. A.4) from a non-zero user vector and
    non-zero item vectors, two epochs of N / B batches, against Eq. (1)-(2) written out item by item
    with autograd on l(y u.v) for the gradients; the batches are the permutations the client draws
    from the same generator. (The attack only ever runs it on the zero probe, where the user step
    is invisible in the message of the first batch.)"""
    C, N, k, B, lr, E = 3, 6, 4, 2, 0.3, 2
    g = torch.Generator().manual_seed(11)
    U = torch.randn(C, k, generator=g, dtype=F64)
    V = torch.randn(20, k, generator=g, dtype=F64)
    items = torch.stack([torch.randperm(20, generator=g)[:N] for _ in range(C)])
    y = torch.where(torch.rand(C, N, generator=g, dtype=F64) < 0.3, 1.0, -1.0).to(F64)
    for loss in ("log", "hinge"):
        u_new, deltas = rec.protocol3_client_update(U, V, items, y, local_epochs=E, batch_size=B, lr=lr, loss=loss,
                                                    generator=torch.Generator().manual_seed(5))
        gen = torch.Generator().manual_seed(5)
        perms = [torch.argsort(torch.rand(C, N, generator=gen, dtype=F64), dim=1) for _ in range(E)]
        for c in range(C):
            u, Vc = U[c].clone(), V[items[c]].clone()
            for perm in perms:
                for r in range(N // B):
                    batch = perm[c, r * B:(r + 1) * B].tolist()
                    uu, vv = u.clone().requires_grad_(True), Vc[batch].clone().requires_grad_(True)
                    f = rec.margin_loss(y[c, batch] * (vv @ uu), loss)
                    gu, = torch.autograd.grad(f.mean(), uu, retain_graph=True)   # Eq. (1): mean over the batch
                    gv, = torch.autograd.grad(f.sum(), vv)                 # Eq. (2): each item its own term
                    Vc[batch] = Vc[batch] - lr * gv
                    u = u - lr * gu
            assert torch.allclose(u_new[c], u, atol=1e-12), (loss, c)
            assert torch.allclose(deltas[c], Vc - V[items[c]], atol=1e-12), (loss, c)


def test_protocol1_training_learns():
    d = rec.make_synthetic(200, 80, 4, 30, torch.linspace(0.1, 0.4, 200), seed=1)
    res = rec.train_protocol1(d, num_rounds=30, clients_per_round=100, local_steps=3, batch_size=10, lr=0.3,
                              init_scale=0.3, seed=0)
    assert res.history["train_error"][0] > 0.3
    assert res.history["train_error"][-1] < 0.15 and res.history["catalog_error"][-1] < 0.2


def test_to_dense_places_deltas_on_their_items():
    deltas = torch.arange(12, dtype=F64).reshape(1, 3, 4)
    dense = rec.to_dense(deltas, torch.tensor([[4, 0, 2]]), 6)
    assert torch.equal(dense[0, 4], deltas[0, 0]) and torch.equal(dense[0, 1], torch.zeros(4, dtype=F64))
    assert torch.equal(dense.sum(1), deltas.sum(1))


# ------------------------------------------------------------------ the attack, noise free
@pytest.mark.parametrize("loss", rec.LOSSES)
def test_estimate_is_positive_multiple_of_user_vector(loss):
    d = _data(num_users=50, p=0.2)
    res = pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=40, client=pac.Client(5, 0.3, loss),
                               generator=torch.Generator().manual_seed(0))
    u, u_hat = d.user_vectors, res.final
    scale = (u_hat * u).sum(1) / (u * u).sum(1)
    assert torch.allclose(u_hat, scale[:, None] * u, atol=1e-12)
    assert (scale > 0).all()                                        # T = 40 >> Theorem 1's bound
    # the multiplier is 1 - 2 p_hat: a multiple of 1/(T B) in (0, 1]
    assert torch.allclose(scale * 200, torch.round(scale * 200), atol=1e-9)
    assert pac.sign_error(u_hat, u, d.item_vectors).max() == 0


def test_multiplier_sign_flips_for_users_who_like_most_items():
    d = _data(num_users=30, p=0.2)
    y_pos = -d.y                                                     # p_c = 0.8
    res = pac.protocol2_attack(d.user_vectors, d.items, y_pos, num_interactions=40, client=pac.Client(5, 1.0),
                               generator=torch.Generator().manual_seed(0))
    assert pac.sign_error(res.final, d.user_vectors, d.item_vectors).min() == 1.0    # every sign wrong
    fixed = pac.sign_rule(res.final, "positive")
    assert pac.sign_error(fixed, d.user_vectors, d.item_vectors).max() == 0


def test_attack_and_restore_leave_local_model_unchanged():
    d = _data(num_users=10)
    V_real = torch.randn(d.num_items, 4, dtype=F64, generator=torch.Generator().manual_seed(2))
    res = pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=5, client=pac.Client(4, 0.5),
                               server=pac.Server(restore_items=V_real), num_items=d.num_items)
    assert torch.equal(res.user_vectors, d.user_vectors)
    u0, deltas = rec.protocol1_client_update(d.user_vectors, V_real, d.items, d.y, local_steps=0, batch_size=4, lr=0.5)
    assert torch.equal(u0, d.user_vectors) and not deltas.any()
    # but a second step on the zero model does move u (the first step made the items non-zero)
    u2, _ = rec.protocol1_client_update(d.user_vectors, torch.zeros_like(V_real), d.items, d.y, local_steps=2,
                              batch_size=4, lr=0.5, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(u2, d.user_vectors)


def test_theorem1_failure_rate_matches_exact_probability_and_bound():
    p, B, N, trials = 0.3, 2, 20, 3000
    d = rec.make_synthetic(trials, 60, 3, N, p, seed=4)
    T_grid = [1, 3, 6, 12, 24]
    res = pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=24, client=pac.Client(B, 1.0),
                               record_at=T_grid, generator=torch.Generator().manual_seed(5))
    fail = (pac.sign_error(res.estimates, d.user_vectors, d.item_vectors) > 0).to(F64).mean(1).numpy()
    exact = pac.theorem1_exact_failure(T_grid, p, B, N)
    se = np.sqrt(exact * (1 - exact) / trials) + 1e-3
    assert np.all(np.abs(fail - exact) < 4 * se), (fail, exact)
    assert np.all(exact <= pac.theorem1_failure_bound(T_grid, p, B) + 1e-12)
    T_star = math.ceil(pac.theorem1_num_interactions(p, B, 0.05))
    assert pac.theorem1_exact_failure([T_star], p, B, N)[0] <= 0.05


def test_theorem1_exact_failure_is_binomial_tail_for_batch_one():
    T = np.array([1, 5, 10, 31])
    got = pac.theorem1_exact_failure(T, 0.35, 1, 20)
    want = stats.binom.sf(np.ceil(T / 2) - 1, T, 0.35)
    assert np.allclose(got, want)


def test_theorem1_bound_closed_form():
    assert pac.theorem1_num_interactions(0.25, 4, math.exp(-1)) == pytest.approx(2 / (4 * 0.25))
    assert pac.theorem1_num_interactions(0.1, 1, 0.05) < pac.theorem1_num_interactions(0.4, 1, 0.05)


def test_protocol3_noise_free_estimate_is_exact():
    d = _data(num_users=20, p=0.3)
    res = pac.protocol3_attack(d.user_vectors, d.items, d.y, num_interactions=2,
                               client=pac.Client(5, 0.7, "hinge"), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(res.touched, torch.full((20,), 20.0, dtype=F64))
    assert torch.allclose(res.final, (1 - 2 * 0.3) * d.user_vectors)
    assert torch.equal(res.user_vectors, d.user_vectors)             # one epoch never moves u


# ------------------------------------------------------------------ noise, tau_c, Theorems 2-3
def test_noisy_message_only_perturbs_changed_items():
    deltas = torch.zeros(3, 1000, 2, dtype=F64)
    deltas[:, :500] = 1.0
    out = rec.noisy_message(deltas, torch.tensor([0.0, 0.5, 2.0], dtype=F64),
                            generator=torch.Generator().manual_seed(0))
    assert not out[:, 500:].any()
    assert torch.equal(out[0], deltas[0])
    for c, s in [(1, 0.5), (2, 2.0)]:
        noise = (out[c, :500] - 1.0).reshape(-1)
        assert abs(float(noise.std()) - s) < 0.1 * s and abs(float(noise.mean())) < 4 * s / math.sqrt(1000)


def test_tau_c_hand_example():
    u = torch.tensor([[1.0, 0.0]], dtype=F64)
    V = torch.tensor([[0.4, 1.0], [-0.1, 0.0], [0.3, 5.0], [-0.2, 2.0]], dtype=F64)
    assert float(pac.tau_c(0.25, u, V)[0]) == pytest.approx(0.2)     # one item (|0.1|) may lie below
    assert float(pac.tau_c(0.0, u, V)[0]) == pytest.approx(0.1)
    assert math.isinf(float(pac.tau_c(1.0, u, V)[0]))
    tau = float(pac.tau_c(0.5, u, V)[0])
    assert ((u @ V.T).abs() < tau).to(F64).mean() <= 0.5


def test_theorem2_noisy_attack_meets_epsilon_at_the_bound():
    d = rec.make_synthetic(1, 150, 4, 20, 0.2, seed=0)
    trials, eps, delta, sigma, B, lr = 200, 0.1, 0.05, 0.1, 5, 1.0
    U, items, y = d.user_vectors.expand(trials, -1), d.items.expand(trials, -1), d.y.expand(trials, -1)
    tau = float(pac.tau_c(eps, d.user_vectors, d.item_vectors)[0])
    client = pac.Client(batch_size=B, lr=lr, loss="hinge", sigma=sigma)
    T2 = math.ceil(pac.theorem2_num_interactions(0.2, client, delta, 0.3, pac.max_item_norm(d.item_vectors), 150,
                                                 tau))
    res = pac.protocol2_attack(U, items, y, num_interactions=T2, client=client, record_at=[1, T2], generator=torch.Generator().manual_seed(1))
    err = pac.sign_error(res.estimates, U, d.item_vectors)
    assert (err[-1] > eps).to(F64).mean() <= delta
    assert err[0].mean() > err[-1].mean()                           # the noise does hurt a single message


def test_theorem3_noisy_attack_meets_epsilon_at_the_bound():
    d = rec.make_synthetic(1, 150, 4, 20, 0.2, seed=0)
    trials, eps, delta, sigma = 200, 0.1, 0.05, 0.3
    tau = float(pac.tau_c(eps, d.user_vectors, d.item_vectors)[0])
    T3 = math.ceil(pac.theorem3_num_interactions(0.2, 20, delta, sigma, pac.max_item_norm(d.item_vectors), 150,
                                                 1.0, "hinge", tau))
    rec_T, err = pac.attack_error_curve(d.user_vectors, d.items, d.y, d.item_vectors, num_trials=trials,
                                        num_interactions=T3, client=pac.Client(10, 1.0, "hinge", sigma=sigma),
                                        record_at=[1, T3], protocol=3, seed=2)
    assert err.shape == (2, 1, trials)
    assert (err[-1] > eps).to(F64).mean() <= delta
    assert err[0].mean() > err[-1].mean() and err[0].max() > 0


def test_bounds_scale_as_stated():
    kw = dict(item_norm_bound=2.0, num_items=100, tau=0.1)
    T_a, t1, t2 = pac.theorem2_num_interactions(0.2, pac.Client(5, 1.0, "log", sigma=0.2), 0.05, 0.3,
                                                return_terms=True, **kw)
    assert T_a == max(t1, t2)
    assert pac.theorem2_num_interactions(0.2, pac.Client(5, 1.0, "log", sigma=0.4), 0.05, 0.3, return_terms=True,
                                         **kw)[2] == pytest.approx(4 * t2)
    t3 = pac.theorem3_num_interactions(0.2, 20, 0.05, 0.2, lr=1.0, loss="log", **kw)
    assert t3 == pytest.approx(2 * 0.04 * 4 * math.log(2 * 100 / 0.05) / (20 * (0.6 * 0.5 * 0.1) ** 2))


# ------------------------------------------------------------------ Proposition 1, defenses
def test_proposition1_holds_and_is_tight_when_errors_align():
    g = torch.Generator().manual_seed(0)
    V = torch.randn(300, 4, dtype=F64, generator=g)
    u = torch.randn(40, 4, dtype=F64, generator=g)
    labels = torch.sign(torch.randn(40, 4, dtype=F64, generator=g) @ V.T)
    u_hat = u + 0.5 * torch.randn(40, 4, dtype=F64, generator=g)
    out = pac.proposition1_check(u_hat, u, V, labels)
    assert out["holds"].all() and (out["eps"] > 0).any()
    same = pac.proposition1_check(u, u, V, labels)
    assert torch.equal(same["err_hat"], same["eta"]) and not same["eps"].any()


def test_secure_aggregation_sums_cohorts():
    d = _data(num_users=8)
    kw = dict(num_interactions=3, client=pac.Client(4, 1.0))
    single = pac.protocol2_attack(d.user_vectors, d.items, d.y, generator=torch.Generator().manual_seed(0), **kw)
    pooled = pac.protocol2_attack(d.user_vectors, d.items, d.y, server=pac.Server(cohort_size=4),
                                  generator=torch.Generator().manual_seed(0), **kw)
    assert pooled.final.shape == (2, 4)
    assert torch.allclose(pooled.final, single.final.view(2, 4, 4).sum(1))


def test_zero_vector_defense_refuses_the_probe_but_not_a_tiny_one():
    d = _data(num_users=20)
    kw = dict(num_interactions=30, client=pac.Client(5, 1.0), update=pac.guarded_client_update)
    blocked = pac.protocol2_attack(d.user_vectors, d.items, d.y, generator=torch.Generator().manual_seed(0), **kw)
    assert not blocked.final.any() and (pac.sign_error(blocked.final, d.user_vectors, d.item_vectors) == 1).all()
    tiny = 1e-6 * torch.randn(d.num_items, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    evaded = pac.protocol2_attack(d.user_vectors, d.items, d.y, server=pac.Server(probe=tiny), num_items=d.num_items,
                                  generator=torch.Generator().manual_seed(0), **kw)
    assert pac.sign_error(evaded.final, d.user_vectors, d.item_vectors).max() < 0.02
    assert pac.detect_zero_probe(torch.zeros(5, 4), torch.tensor([[0, 1]])).all()


def test_one_nonzero_item_does_not_defeat_the_zero_probe_check():
    """Issue 17.6: with a check on *all* rated items one non-zero vector among zeros would pass."""
    d = _data(num_users=20)
    probe = torch.zeros(d.num_items, 4, dtype=F64)
    probe[d.items[:, 0]] = 1.0                       # every client's first rated item is non-zero
    for atol in [0.0, 1e-3, 0.5]:
        assert pac.detect_zero_probe(probe, d.items, atol).all()
    blocked = pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=5, client=pac.Client(5, 1.0),
                                   server=pac.Server(probe=probe), update=pac.guarded_client_update,
                                   num_items=d.num_items)
    assert not blocked.final.any()
    # lifting every rated item just above atol passes (exercise ch2b-ex-tiny)
    atol = 1e-3
    lifted = 2 * atol * torch.nn.functional.normalize(torch.randn(d.num_items, 4, dtype=F64,
                                                                  generator=torch.Generator().manual_seed(0)), dim=1)
    assert not pac.detect_zero_probe(lifted, d.items, atol).any()
    honest = torch.randn(d.num_items, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert not pac.detect_zero_probe(honest, d.items, 1e-6).any()
    with pytest.raises(ValueError, match="atol"):
        pac.detect_zero_probe(honest, d.items, -1.0)


def test_proposition1_on_the_rated_items():
    d = _data(num_users=30)
    g = torch.Generator().manual_seed(0)
    u_hat = d.user_vectors + 0.8 * torch.randn(30, 4, dtype=F64, generator=g)
    out = pac.proposition1_check(u_hat, d.user_vectors, d.item_vectors, d.y, items=d.items)
    assert out["holds"].all() and not out["eta"].any()              # the generating u_c fits its labels
    assert torch.allclose(out["err_hat"], out["eps"])               # so the error is the disagreement


# ------------------------------------------------------------------ bad input
def test_bad_arguments_raise_value_errors_naming_them():
    d = _data(num_users=4)
    with pytest.raises(ValueError, match="pref_rate"):
        pac.theorem1_num_interactions(0.5, 1, 0.1)
    with pytest.raises(ValueError, match="pref_rate"):
        rec.make_synthetic(4, 50, 3, 10, 0.6)
    with pytest.raises(ValueError, match="batch_size"):
        rec.protocol1_client_update(d.user_vectors, torch.zeros(d.num_items, 4, dtype=F64), d.items, d.y, local_steps=1,
                          batch_size=21, lr=0.1)
    with pytest.raises(ValueError, match="batch_size"):
        pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=2, client=pac.Client(21, 0.1))
    with pytest.raises(ValueError, match="sigma"):
        rec.noisy_message(torch.ones(2, 3, 4), -0.1)
    with pytest.raises(ValueError, match="sigma"):
        pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=2, client=pac.Client(2, 0.1, sigma=-1.0))
    with pytest.raises(ValueError, match="item_vectors"):
        rec.protocol1_client_update(d.user_vectors, torch.zeros(d.num_items, 5, dtype=F64), d.items, d.y, local_steps=1,
                          batch_size=2, lr=0.1)
    with pytest.raises(ValueError, match="k"):
        pac.sign_error(torch.zeros(4, 3), d.user_vectors, d.item_vectors)
    with pytest.raises(ValueError, match="beta"):
        pac.theorem2_num_interactions(0.3, pac.Client(5, 1.0, "log", sigma=0.1), 0.05, 0.5, 1.0, 10, 0.1)
    with pytest.raises(ValueError, match="epsilon"):
        pac.tau_c(1.5, d.user_vectors, d.item_vectors)
    with pytest.raises(ValueError, match="batch_size"):
        rec.protocol3_client_update(d.user_vectors, torch.zeros(d.num_items, 4, dtype=F64), d.items, d.y,
                                 local_epochs=1, batch_size=3, lr=0.1)


# ------------------------------------------------------------------ the exact law of the estimate (App. A.3-A.4)
def test_likes_pmf_is_the_convolution_of_hypergeometric_batches():
    for T in [1, 3, 70, 130]:                       # 130 * 5 labels: the FFT branch
        pmf = pac.likes_pmf(T, 0.3, 5, 20)
        direct = np.array([1.0])
        one = stats.hypergeom.pmf(np.arange(6), 20, 6, 5)
        for _ in range(T):
            direct = np.convolve(direct, one)
        assert pmf.shape == (5 * T + 1,) and np.allclose(pmf, direct, atol=1e-13)
    # B = 1: binomial
    assert np.allclose(pac.likes_pmf(40, 0.35, 1, 20), stats.binom.pmf(np.arange(41), 40, 0.35), atol=1e-13)
    with pytest.raises(ValueError, match="num_interactions"):
        pac.likes_pmf(0, 0.3, 5, 20)


def _likes_pmf_uncached(T, p, B, N):
    """likes_pmf as it was written before its caches: binary powers with scipy's fftconvolve."""
    from scipy.signal import fftconvolve

    def conv(a, b):
        if min(a.size, b.size) < 64:
            return np.convolve(a, b)
        out = np.clip(fftconvolve(a, b), 0.0, None)
        return out / out.sum()

    out, base, t = np.array([1.0]), pac._hypergeom_pmf(p, B, N), int(T)
    while t:
        if t & 1:
            out = conv(out, base)
        t >>= 1
        if t:
            base = conv(base, base)
    return out


def test_likes_pmf_windows_and_caches_match_plain_binary_powers(monkeypatch):
    """The cached squares and spectra, and the windows that drop the FFT's round-off at the tails, give the
    law of plain binary powers with fftconvolve to round-off (every entry and every tail probability), in
    any order of T, with an empty or a warm cache, and with the caches' limits hit."""
    def check(T, p, B):
        got, ref = pac.likes_pmf(T, p, B, 20), _likes_pmf_uncached(T, p, B, 20)
        assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-14, T
        assert np.abs(np.cumsum(got[::-1]) - np.cumsum(ref[::-1])).max() < 1e-11, T      # P(likes >= L)

    monkeypatch.setattr(pac, "_POWERS", {})
    for T in [1, 70, 131, 4096, 3000, 3001, 2999, 65, 12345, 3000]:
        check(T, 0.3, 5)
    monkeypatch.setattr(pac, "_POWERS_MAX_LEN", 2000)
    monkeypatch.setattr(pac, "_SPECTRA_MAX", 2)
    monkeypatch.setattr(pac, "_POWERS", {})
    for T in [5000, 4999, 777, 5000]:
        check(T, 0.25, 4)
    powers, spectra = pac._POWERS[(0.25, 4, 20)]
    assert max(p.size for _, p in powers) <= 2000 and len(spectra) <= 2


def test_likes_window_grows_as_the_root_of_the_label_count():
    """At T B = 2 * 10^6 labels the law is kept on a window of O(sqrt(T B)) counts around T B p (what makes
    AttackLaw.needed fast at epsilon = 0), it holds all the mass, and likes_pmf puts it at its offset."""
    T, p, B = 200_000, 0.2, 10
    offset, w = pac._likes_window(T, p, B, 20)
    sd = np.sqrt(T * B * p * (1 - p))
    assert w.size < 20 * sd and abs(w.sum() - 1) < 1e-12
    assert abs(offset + np.argmax(w) - T * B * p) < 2
    full = pac.likes_pmf(T, p, B, 20)
    assert np.array_equal(full[offset:offset + w.size], w) and full[:offset].sum() == 0 == full[offset + w.size:].sum()


def test_event_E1_of_the_real_attack_matches_its_exact_probability():
    """Noise-free Protocol 2 returns m_T u_c exactly; the frequency of m_T <= beta (not E1, Eq. 6) over
    independent runs matches label_mean_tail."""
    p, B, N, trials, beta, T = 0.3, 2, 20, 4000, 0.2, 12
    d = rec.make_synthetic(1, 60, 3, N, p, seed=1)
    U = d.user_vectors.expand(trials, -1)
    res = pac.protocol2_attack(U, d.items.expand(trials, -1), d.y.expand(trials, -1), num_interactions=T,
                               client=pac.Client(B, 1.0), generator=torch.Generator().manual_seed(3))
    m = (res.final * U).sum(1) / (U * U).sum(1)
    exact = pac.label_mean_tail([T], p, B, N, beta)[0]
    assert 0.05 < exact < 0.5
    assert abs(float((m <= beta + 1e-12).double().mean()) - exact) < 4 * math.sqrt(exact * (1 - exact) / trials)
    assert pac.label_mean_tail([T], p, B, N, 0.0)[0] == pac.theorem1_exact_failure([T], p, B, N)[0]


@pytest.mark.parametrize("protocol", [2, 3])
def test_attack_law_matches_the_simulated_attack(protocol):
    """AttackLaw's failure probabilities equal the frequencies of the real, simulated attack."""
    d = rec.make_synthetic(1, 120, 4, 20, 0.2, seed=4)
    sigma, B, trials, eps = (0.3, 5, 3000, 0.05) if protocol == 2 else (0.6, 10, 3000, 0.05)
    law = pac.AttackLaw(d.user_vectors[0], d.item_vectors, pref_rate=0.2, num_rated=20, batch_size=B, sigma=sigma,
                        lr=1.0, loss="hinge", protocol=protocol, num_draws=40000, seed=0)
    T_grid = [2, 8]
    T, err = pac.attack_error_curve(d.user_vectors, d.items, d.y, d.item_vectors, num_trials=trials,
                                    num_interactions=8, client=pac.Client(B, 1.0, "hinge", sigma=sigma),
                                    record_at=T_grid, protocol=protocol, seed=5)
    for j, t in enumerate(T_grid):
        want = law.fail(t, "error", epsilon=eps)
        got = float((err[j, 0] > eps).double().mean())
        assert 0.02 < want < 0.98 or t == 8
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / trials) + 0.01, (t, got, want)
    if protocol == 3:   # the noise term (b) is u_hat - (1 - 2 p_c) u_c: event E of Eq. (10), measured
        U, tau = d.user_vectors.expand(trials, -1), law.tau(0.1)
        T_half = law.needed("E2", 0.5, tau=tau)                 # where E fails about half the time
        res = pac.protocol3_attack(U, d.items.expand(trials, -1), d.y.expand(trials, -1), num_interactions=T_half,
                                   client=pac.Client(B, 1.0, "hinge", sigma=sigma),
                                   generator=torch.Generator().manual_seed(6))
        noise = res.final - law.multiplier * U
        got = float(((noise @ d.item_vectors.T).abs().max(1).values >= law.multiplier * tau).double().mean())
        want = law.fail(T_half, "E2", tau=tau)
        assert 0.05 < want < 0.95 and abs(got - want) < 4 * math.sqrt(want * (1 - want) / trials) + 0.01


def test_attack_law_events_are_nested_and_validate():
    d = rec.make_synthetic(1, 150, 4, 20, 0.2, seed=0)
    law = pac.AttackLaw(d.user_vectors[0], d.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5, sigma=0.2,
                        lr=1.0, loss="hinge", num_draws=5000)
    tau, beta = law.tau(0.1), 0.3
    assert tau == pytest.approx(float(pac.tau_c(0.1, d.user_vectors, d.item_vectors)[0]))
    for T in [1, 5, 20, 80]:
        f = {e: law.fail(T, e, epsilon=0.1, tau=tau, beta=beta) for e in law.EVENTS}
        # E1 and E2 imply every item above tau is right, which implies error <= eps (tau_c is a supremum
        # and Eqs. 6-7 are strict: the item at tau itself is right)
        assert f["error"] <= f["above_tau"] + 1e-12 <= f["E1E2"] + 2e-12
        assert max(f["E1"], f["E2"]) <= f["E1E2"] + 1e-12
    assert law.needed("error", 0.05, epsilon=0.1) <= law.needed("E1E2", 0.05, tau=tau, beta=beta)
    with pytest.raises(ValueError, match="event"):
        law.fail(3, "E3")
    with pytest.raises(ValueError, match="beta"):
        law.fail(3, "E1")
    with pytest.raises(ValueError, match="protocol"):
        pac.AttackLaw(d.user_vectors[0], d.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5, sigma=0.2,
                      lr=1.0, loss="hinge", protocol=1)
    with pytest.raises(ValueError, match="sigma"):
        pac.AttackLaw(d.user_vectors[0], d.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5, sigma=0.0,
                      lr=1.0, loss="hinge")


def test_needed_finds_a_T_beyond_a_billion_when_the_smallest_margin_is_tiny():
    """At epsilon = 0 the events must hold for the item of smallest margin; chapter 2's target at
    FEDLAB_SEED=26 has one of 1.3e-4 and needs about 9e8 interactions, past the old search ceiling of 1e9
    (the page raised ValueError). E2's failure depends on T only through s_T / tau, so shrinking tau 1e4
    times multiplies the T it needs by about 1e8."""
    d = rec.make_synthetic(1, 150, 4, 20, 0.2, seed=0)
    law = pac.AttackLaw(d.user_vectors[0], d.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5, sigma=0.2,
                        lr=1.0, loss="hinge", num_draws=2000)
    tau = law.tau(0.1)
    small = law.needed("E2", 0.05, tau=tau, beta=0.3)
    big = law.needed("E2", 0.05, tau=tau * 1e-4, beta=0.3)
    assert big > 10 ** 9 and 0.5e8 < big / small < 2e8, (small, big)
    assert law.needed("E1E2", 0.05, tau=tau * 1e-4, beta=0.3) >= big
    with pytest.raises(ValueError, match="t_max"):
        law.needed("E2", 0.05, tau=tau * 1e-4, beta=0.3, t_max=10 ** 6)


def test_theorem2_optimal_beta_minimises_the_bound():
    kw = dict(pref_rate=0.2, client=pac.Client(5, 1.0, "hinge", sigma=0.2), delta=0.05, item_norm_bound=2.0,
              num_items=100, tau=0.1)
    b = pac.theorem2_optimal_beta(**kw)
    T, t1, t2 = pac.theorem2_num_interactions(beta=b, return_terms=True, **kw)
    assert t1 == pytest.approx(t2)
    grid = np.linspace(0.001, 0.599, 500)
    assert T <= min(pac.theorem2_num_interactions(beta=float(g), **kw) for g in grid) + 1e-9
    with pytest.raises(ValueError, match="sigma"):
        pac.theorem2_optimal_beta(**{**kw, "client": pac.Client(5, 1.0, "hinge", sigma=0.0)})


# ------------------------------------------------------------------ secure aggregation per item, label leakage
def test_secure_aggregation_reveals_per_item_sums():
    msgs = torch.arange(4 * 3 * 2, dtype=F64).view(4, 3, 2)
    items = torch.tensor([[0, 1, 2], [1, 2, 3], [0, 3, 4], [4, 0, 1]])
    out = pac.secure_aggregate_items(msgs, items, 5, 2)
    want = torch.zeros(2, 5, 2, dtype=F64)
    for c in range(4):
        for n in range(3):
            want[c // 2, items[c, n]] += msgs[c, n]
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="cohort_size"):
        pac.secure_aggregate_items(msgs, items, 5, 3)
    with pytest.raises(ValueError, match="items"):
        pac.secure_aggregate_items(msgs, items, 4, 2)


def test_an_item_one_member_trained_on_exposes_its_vector():
    u = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0]], dtype=F64)
    msgs = torch.stack([torch.stack([0.3 * u[0], -0.1 * u[0]]), torch.stack([0.2 * u[1], 0.5 * u[1]])])
    shared = pac.secure_aggregate_items(msgs, torch.tensor([[0, 1], [0, 1]]), 3, 2)     # both items shared
    assert not pac.exposed_members(shared, u).any()
    alone = pac.secure_aggregate_items(msgs, torch.tensor([[0, 2], [0, 1]]), 3, 2)      # item 2: member 0 only
    assert pac.exposed_members(alone, u).tolist() == [[True, True]]                      # item 1: member 1 only
    one = pac.secure_aggregate_items(msgs, torch.tensor([[1, 2], [1, 1]]), 3, 2)      # item 2: member 0 only
    assert pac.exposed_members(one, u).tolist() == [[True, False]]
    with pytest.raises(ValueError, match="user_vectors"):
        pac.exposed_members(alone, u[:, :2])


def test_one_honest_message_leaks_every_trained_label_up_to_one_sign():
    d = _data(num_users=40)
    V = torch.randn(d.num_items, 4, dtype=F64, generator=torch.Generator().manual_seed(2))
    _, deltas = rec.protocol1_client_update(d.user_vectors, V, d.items, d.y, local_steps=1, batch_size=5, lr=0.1,
                                            generator=torch.Generator().manual_seed(3))
    guess = pac.leaked_labels(deltas)
    shown = guess != 0
    assert (shown.sum(1) == 5).all()                              # the B trained items, nothing else
    agree = (guess * d.y.to(guess.dtype))[shown].view(40, 5)
    assert ((agree == 1).all(1) | (agree == -1).all(1)).all()     # right up to one sign per client
    assert ((guess == -1) & shown).sum(1).ge((guess == 1).sum(1)).all()   # the majority rule: more -1
    flipped = pac.leaked_labels(deltas, leaning="positive")
    assert torch.equal(flipped, -guess)
    with pytest.raises(ValueError, match="leaning"):
        pac.leaked_labels(deltas, leaning="up")


def test_bounds_for_a_majority_of_likes_mirror_the_minority_case():
    """Issue 17.5: p_c > 1/2 is p_c' = 1 - p_c under y -> -y (sign rule leaning 'positive')."""
    assert pac.theorem1_num_interactions(0.8, 5, 0.05) == pytest.approx(pac.theorem1_num_interactions(0.2, 5, 0.05))
    assert pac.theorem1_failure_bound([10], 0.7, 5)[0] == pytest.approx(pac.theorem1_failure_bound([10], 0.3, 5)[0])
    kw = dict(client=pac.Client(5, 1.0, "hinge", sigma=0.2), delta=0.05, item_norm_bound=2.0, num_items=100, tau=0.1)
    assert pac.theorem2_num_interactions(0.9, beta=0.3, **kw) == pytest.approx(pac.theorem2_num_interactions(0.1, beta=0.3, **kw))
    for bad in (0.5, 0.0, 1.0):
        with pytest.raises(ValueError, match="pref_rate"):
            pac.theorem1_num_interactions(bad, 5, 0.05)
    d = rec.make_synthetic(30, 80, 4, 20, 0.2, seed=2)
    U, Y = -d.user_vectors, -d.y                                       # the mirror image: each user likes 80 %
    res = pac.protocol2_attack(U, d.items, Y, num_interactions=int(
        math.ceil(pac.theorem1_num_interactions(0.8, 5, 0.05))), client=pac.Client(5, 1.0),
        server=pac.Server(leaning="positive"), generator=torch.Generator().manual_seed(0))
    assert float((pac.sign_error(res.final, U, d.item_vectors) == 0).double().mean()) >= 0.95


def test_a_loss_with_zero_slope_at_zero_defeats_the_zero_probe():
    """Issue 17.5: Assumption 2 is needed. With l(z) = max(0, -z)^2, l'(0) = 0: under the zero probe
    every message is exactly zero, and the estimator and the bounds refuse instead of dividing by 0."""
    assert rec.loss_derivative_at_zero("squared_perceptron") == 0.0
    z = torch.linspace(-2, 2, 9, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(rec.margin_loss(z, "squared_perceptron").sum(), z)
    assert torch.allclose(g, rec.margin_loss_grad(z.detach(), "squared_perceptron"))
    d = _data(num_users=10)
    _, msg = rec.protocol1_client_update(d.user_vectors, torch.zeros(d.num_items, 4, dtype=F64), d.items, d.y,
                                         local_steps=1, batch_size=5, lr=1.0, loss="squared_perceptron")
    assert msg.abs().max() == 0
    with pytest.raises(ValueError, match="Assumption 2"):
        pac.protocol2_attack(d.user_vectors, d.items, d.y, num_interactions=3,
                             client=pac.Client(5, 1.0, "squared_perceptron"))
    with pytest.raises(ValueError, match="Assumption 2"):
        pac.theorem2_num_interactions(0.2, pac.Client(5, 1.0, "squared_perceptron", sigma=0.2), 0.05, 0.3, 2.0, 100,
                                      0.1)
    assert "squared_perceptron" not in rec.LOSSES


# ------------------------------------------------------------------ clipping: Eq. (3) as a Gaussian mechanism
def test_noisy_message_clips_each_changed_item_and_keeps_zeros():
    deltas = torch.zeros(2, 5, 3, dtype=F64)
    deltas[0, 1] = torch.tensor([3.0, 4.0, 0.0], dtype=F64)          # norm 5 -> clipped to 1
    deltas[1, 3] = torch.tensor([0.3, 0.0, 0.4], dtype=F64)          # norm 0.5 -> kept
    out = rec.noisy_message(deltas, 0.0, clip_norm=1.0)
    assert torch.allclose(out[0, 1], torch.tensor([0.6, 0.8, 0.0], dtype=F64))
    assert torch.equal(out[1, 3], deltas[1, 3])
    noisy = rec.noisy_message(deltas, 0.7, clip_norm=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(rec.touched_items(noisy), rec.touched_items(deltas))   # zeros stay exact zeros
    with pytest.raises(ValueError, match="clip_norm"):
        rec.noisy_message(deltas, 0.1, clip_norm=0.0)


def test_clipped_attack_follows_the_law_at_the_clipped_sigma_and_not_at_sigma():
    """pac.clipped_sigma: clipping every delta by one factor = the unclipped attack at a larger sigma.
    The simulated clipped attack's failure rate matches the law at that sigma; at the raw sigma the
    law would be far off (so the check can fail)."""
    data = rec.make_synthetic(1, 200, 4, 20, 0.2, seed=4)
    law = pac.AttackLaw(data.user_vectors[0], data.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5,
                        sigma=1.0, lr=1.0, loss="hinge", protocol=2, seed=0)
    clip, sigma, T, trials = 1.0, 1.0, 40, 2000
    assert law.user_norm > 2 * clip                                  # clipping is active for this user
    _, err = pac.attack_error_curve(data.user_vectors, data.items, data.y, data.item_vectors, num_trials=trials,
                                    num_interactions=T,
                                    client=pac.Client(5, 1.0, "hinge", sigma=sigma, clip_norm=clip), seed=1)
    sim = float((err[-1] > 0.1).double().mean())
    right = law.with_sigma(pac.clipped_sigma(sigma, clip, law.user_norm, lr=1.0, loss="hinge")).fail(T, "error",
                                                                                                   epsilon=0.1)
    wrong = law.with_sigma(sigma).fail(T, "error", epsilon=0.1)
    se = math.sqrt(right * (1 - right) / trials)
    assert 0.1 < right < 0.9 and abs(sim - right) < 4 * se, (sim, right)
    assert abs(sim - wrong) > 10 * se, (sim, wrong)


def test_clipped_sigma_values_and_errors():
    # hinge: |l'(0)| = 1; ||u|| = 3, lr = 0.5 -> delta norm 1.5; clip 0.5 scales by 1/3
    assert pac.clipped_sigma(0.2, 0.5, 3.0, lr=0.5, loss="hinge") == pytest.approx(0.6)
    assert pac.clipped_sigma(0.2, 5.0, 3.0, lr=0.5, loss="hinge") == pytest.approx(0.2)   # no clipping
    for bad in ("sigma", "clip_norm", "user_norm"):
        kw = dict(sigma=0.2, clip_norm=0.5, user_norm=3.0)
        kw[bad] = 0.0
        with pytest.raises(ValueError, match=bad):
            pac.clipped_sigma(kw["sigma"], kw["clip_norm"], kw["user_norm"], lr=0.5, loss="hinge")


def test_with_sigma_shares_draws_and_matches_a_fresh_law():
    data = rec.make_synthetic(1, 120, 4, 20, 0.2, seed=3)
    kw = dict(pref_rate=0.2, num_rated=20, batch_size=5, lr=1.0, loss="hinge", protocol=2, seed=0)
    a = pac.AttackLaw(data.user_vectors[0], data.item_vectors, sigma=0.3, **kw).with_sigma(0.8)
    b = pac.AttackLaw(data.user_vectors[0], data.item_vectors, sigma=0.8, **kw)
    assert a.sigma == 0.8 and [a.fail(t, "error", epsilon=0.1) for t in (1, 5, 30)] == \
        [b.fail(t, "error", epsilon=0.1) for t in (1, 5, 30)]


def test_exact_label_law_refuses_what_it_cannot_hold():
    data = rec.make_synthetic(1, 120, 4, 20, 0.2, seed=3)
    law = pac.AttackLaw(data.user_vectors[0], data.item_vectors, pref_rate=0.2, num_rated=20, batch_size=5,
                        sigma=0.3, lr=1.0, loss="hinge", protocol=2, seed=0)
    with pytest.raises(ValueError, match="exact law"):
        law.fail(10 ** 10, "E1", beta=0.59999)
    # 10^8 labels (beyond the full pmf's memory): the window holds the law, and E1 at beta just below
    # 1 - 2 p_c = 0.6 fails with probability near 1/2 (the label mean sits at the threshold)
    assert 0.3 < law.fail(2 * 10 ** 7, "E1", beta=0.59999) < 0.7


# ------------------------------------------------------------------ the settings objects
def test_client_and_server_settings_name_the_bad_field():
    for kw, field in [(dict(batch_size=0, lr=1.0), "Client.batch_size"), (dict(batch_size=2, lr=0.0), "Client.lr"),
                      (dict(batch_size=2, lr=1.0, local_steps=-1), "Client.local_steps"),
                      (dict(batch_size=2, lr=1.0, sigma=-0.1), "Client.sigma"),
                      (dict(batch_size=2, lr=1.0, sigma=torch.tensor([0.1, -0.1])), "Client.sigma"),
                      (dict(batch_size=2, lr=1.0, clip_norm=0.0), "Client.clip_norm")]:
        with pytest.raises(ValueError, match=field):
            pac.Client(**kw)
    with pytest.raises(ValueError, match="Server.cohort_size"):
        pac.Server(cohort_size=0)
    with pytest.raises(ValueError, match="Server.leaning"):
        pac.Server(leaning="up")
    d = _data(num_users=4)
    with pytest.raises(ValueError, match="local_steps"):          # Protocol 3 runs one epoch
        pac.protocol3_attack(d.user_vectors, d.items, d.y, num_interactions=1, client=pac.Client(5, 1.0, local_steps=2))
    with pytest.raises(ValueError, match="cohort_size"):
        pac.protocol3_attack(d.user_vectors, d.items, d.y, num_interactions=1, client=pac.Client(5, 1.0),
                             server=pac.Server(cohort_size=2))
    kw = dict(delta=0.05, beta=0.3, item_norm_bound=1.0, num_items=10, tau=0.1)
    with pytest.raises(ValueError, match="local_steps"):          # Theorem 2 is Protocol 2, R = 1
        pac.theorem2_num_interactions(0.2, pac.Client(5, 1.0, sigma=0.1, local_steps=2), **kw)
    with pytest.raises(ValueError, match="clipped_sigma"):
        pac.theorem2_num_interactions(0.2, pac.Client(5, 1.0, sigma=0.1, clip_norm=1.0), **kw)


def test_client_and_server_refuse_non_finite_and_wrongly_typed_fields():
    # lr=inf made protocol2_attack return all-NaN estimates; local_steps=0 made it return zeros
    inf, nan = math.inf, math.nan
    for kw, field in [(dict(lr=inf), "Client.lr"), (dict(lr=nan), "Client.lr"), (dict(lr="0.1"), "Client.lr"),
                      (dict(lr=1.0, sigma=inf), "Client.sigma"), (dict(lr=1.0, sigma=nan), "Client.sigma"),
                      (dict(lr=1.0, sigma=torch.tensor([0.1, inf])), "Client.sigma"),
                      (dict(lr=1.0, sigma="0.1"), "Client.sigma"),
                      (dict(lr=1.0, clip_norm=inf), "Client.clip_norm"),
                      (dict(lr=1.0, local_steps=0), "Client.local_steps"),
                      (dict(lr=1.0, local_steps=1.5), "Client.local_steps"),
                      (dict(lr=1.0, loss="logistic"), "Client.loss")]:
        with pytest.raises(ValueError, match=field):
            pac.Client(batch_size=2, **kw)
    for kw, field in [(dict(cohort_size=True), "Server.cohort_size"), (dict(cohort_size=2.0), "Server.cohort_size"),
                      (dict(probe=torch.full((3, 2), nan)), "Server.probe"),
                      (dict(restore_items=torch.tensor([[inf, 0.0]])), "Server.restore_items"),
                      (dict(probe=[[0.0, 0.0]]), "Server.probe"), (dict(leaning=["negative"]), "Server.leaning")]:
        with pytest.raises(ValueError, match=field):
            pac.Server(**kw)
    # what the pages pass still builds: a [C] tensor of noise levels, the counterexample loss, no clipping
    pac.Client(2, 0.5, "squared_perceptron", sigma=torch.tensor([0.0, 0.3]), clip_norm=None)
    pac.Client(np.int64(2), np.float64(0.5), sigma=np.float64(0.1), clip_norm=2)
