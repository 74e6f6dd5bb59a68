"""Issue 21: no silent wrong answers. Each test here failed before its fix (bad input now raises a
``ValueError`` naming the argument, or the result is correct)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlab.fl import LocalTraining
from fedlab.privacy import defenses, dp_fedavg, secure_aggregation as sa


# ---------------------------------------------------------------------- 1. secure aggregation
def test_secure_sum_refuses_a_sum_that_would_wrap_around():
    # each value is below encode's per-value limit (2^15) but their sum is not: it used to come back
    # as 40000 - 2^16 = -25536
    with pytest.raises(ValueError, match="updates"):
        sa.secure_sum(torch.tensor([[20000.0], [20000.0]]))
    with pytest.raises(ValueError, match="updates"):
        sa.mask_updates(torch.tensor([[-20000.0, 1.0], [-20000.0, 1.0]]))


def test_secure_sum_just_inside_the_range_is_exact():
    x = torch.tensor([[16000.0, -16000.0], [16000.0, -16000.0]], dtype=torch.float64)
    out = sa.secure_sum(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, x.sum(0))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_and_secure_sum_reject_non_finite(bad):
    with pytest.raises(ValueError, match="x"):
        sa.encode(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match="updates|x"):
        sa.secure_sum(torch.tensor([[1.0, bad], [0.0, 0.0]]))


def test_unmask_sum_rejects_values_off_the_ring_and_too_many_clients():
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[2 ** 48, 0], [0, 0]]))
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[-1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="masked"):
        sa.unmask_sum(torch.tensor([[0.5, 0.0], [0.0, 0.0]]))


# ---------------------------------------------------------------------- 2. clipping
def _old_clip_rows(update, clip_norm):
    """The formula clip_rows used before issue 21 (kept here to prove bit-identity)."""
    ts = list(update.values()) if isinstance(update, dict) else [update]
    flat = torch.cat([t.flatten(1) for t in ts], 1) if isinstance(update, dict) else ts[0].reshape(ts[0].shape[0], -1)
    factor = torch.clamp(clip_norm / (flat.norm(dim=1) + 1e-12), max=1.0)
    out = [t * factor.reshape(-1, *([1] * (t.dim() - 1))) for t in ts]
    return dict(zip(update.keys(), out)) if isinstance(update, dict) else out[0]


def _same_or_rounded_down(new, old, c):
    """Issue 34: ``clip_rows`` equals the old formula bit for bit on every row whose old result was
    already within ``c`` (norm taken in float64 on the stored values); a row the old formula left above
    ``c`` by rounding is now within ``c`` and differs from the old one by a few units in the last place."""
    n_new = new.reshape(len(new), -1).double().norm(dim=1)
    n_old = old.reshape(len(old), -1).double().norm(dim=1)
    within = n_old <= c
    assert torch.equal(new[within], old[within])
    assert bool((n_new <= c).all()), (n_new.max().item(), c)
    eps = torch.finfo(new.dtype).eps
    assert torch.allclose(new[~within], old[~within], rtol=8 * eps, atol=0)
    return int((~within).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clip_rows_is_bit_identical_to_the_old_formula_on_ordinary_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    for scale in (1e-6, 1e-2, 1.0, 3.0, 1e3, 1e8):
        x = torch.randn(7, 5, 3, generator=g, dtype=dtype) * scale
        x[2] = 0.0                                           # a zero row stays zero
        for c in (0.1, 1.0, 10.0):
            _same_or_rounded_down(defenses.clip_rows(x, c), _old_clip_rows(x, c), c)
            d = {"w": x, "b": x[:, 0]}
            new, old = defenses.clip_rows(d, c), _old_clip_rows(d, c)
            flat = lambda u: torch.cat([u["w"].flatten(1), u["b"].flatten(1)], 1)      # noqa: E731
            _same_or_rounded_down(flat(new), flat(old), c)
            assert torch.equal(dp_fedavg.clip_updates(d, c)["w"], new["w"])
        assert torch.equal(defenses.clip_by_norm(x[0], 1.0), defenses.clip_rows(x[:1], 1.0)[0])


def test_clip_rows_keeps_gradients_of_the_old_formula():
    """The round-down correction is a detached constant: gradients are the old formula's on rows it
    leaves alone, and that gradient times the correction (1 - a few ulps) on the others."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g_new, = torch.autograd.grad(defenses.clip_rows(x, 0.5).sum(), x)
    g_old, = torch.autograd.grad(_old_clip_rows(x, 0.5).sum(), x)
    assert torch.allclose(g_new, g_old, rtol=8 * torch.finfo(x.dtype).eps, atol=0)


@pytest.mark.parametrize("x", [
    torch.tensor([2e19, 2e19]),                             # squares overflow float32
    torch.full((10 ** 6,), 2e16),                            # the sum of squares overflows float32
    torch.tensor([1e200, 1e200], dtype=torch.float64),       # squares overflow float64
    torch.tensor([1e-30, -1e-30]),                           # squares underflow float32
    torch.tensor([1e-200, 1e-200], dtype=torch.float64),     # squares underflow float64
    torch.tensor([3e38, -3e38, 3e38]),                       # near float32's maximum
])
def test_clip_by_norm_of_huge_or_tiny_entries_has_norm_c_not_zero(x):
    for c in (1.0, 0.25):
        out = defenses.clip_by_norm(x, c)
        assert out.dtype == x.dtype and bool(torch.isfinite(out).all())
        n = float(torch.linalg.vector_norm(out.double()))
        if float(torch.linalg.vector_norm(x.double())) > c:
            assert n == pytest.approx(c, rel=1e-5)
        else:
            assert torch.equal(out, x)
        assert torch.equal(torch.sign(out), torch.sign(x))


def test_clip_rows_mixes_overflowing_and_ordinary_rows():
    x = torch.tensor([[2e19, 2e19], [3.0, 4.0], [0.0, 0.0], [0.1, 0.0]])
    out = defenses.clip_rows(x, 1.0)
    assert torch.allclose(out[0], torch.tensor([0.70710677, 0.70710677]))
    # the other rows are clipped as in a batch without the overflowing row (each row's clipping is its own,
    # as clip_by_norm of the row): the old formula's, or its result rounded down to within C (issue 34)
    assert torch.equal(out[1:], defenses.clip_rows(x[1:], 1.0))
    _same_or_rounded_down(out[1:], _old_clip_rows(x[1:], 1.0), 1.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_clipping_rejects_non_finite_updates(bad):
    x = torch.tensor([[bad, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="update"):
        defenses.clip_rows(x, 1.0)
    with pytest.raises(ValueError, match="update"):
        defenses.clip_by_norm(x[0], 1.0)
    with pytest.raises(ValueError, match="update"):
        dp_fedavg.clip_updates({"w": x}, 1.0)


@pytest.mark.parametrize("c", [0.0, -1.0, math.nan, math.inf])
def test_clipping_rejects_bad_clip_norm(c):
    with pytest.raises(ValueError, match="clip_norm"):
        defenses.clip_rows(torch.ones(2, 2), c)


def test_clipping_an_integer_update_names_the_argument():
    with pytest.raises(ValueError, match="update"):
        defenses.clip_rows(torch.ones(2, 2, dtype=torch.long), 1.0)


# ---------------------------------------------------------------------- 3. the accountant (already fixed)
def test_accountant_rejects_repeated_ids_nan_leakage_and_float_ids():
    from fedlab.privacy.dprivacy import PrivacyAccountant

    acc = PrivacyAccountant(3, budget=1.0)
    with pytest.raises(ValueError, match="repeat"):
        acc.spend([1, 1], 0.6)
    with pytest.raises(ValueError, match="leakage must be finite"):
        acc.spend([1], math.nan)
    with pytest.raises(ValueError, match="clients"):
        acc.spend(1.7, 0.5)
    assert acc.spent.tolist() == [0.0, 0.0, 0.0] and acc.log == []


# ---------------------------------------------------------------------- 4. samplers
def test_sample_euclidean_laplace_rejects_integer_dtype_and_fractional_size():
    from fedlab.privacy.dprivacy import sample_euclidean_laplace

    with pytest.raises(ValueError, match="dtype"):
        sample_euclidean_laplace(3, 1.0, rng=0, dtype=torch.int64)
    for size in (2.7, True, 0, -1):
        with pytest.raises(ValueError, match="size"):
            sample_euclidean_laplace(3, 1.0, size=size, rng=0)
    assert sample_euclidean_laplace(3, 1.0, size=2.0, rng=0).shape == (2, 3)


def test_sample_euclidean_laplace_refuses_noise_that_overflows_its_dtype():
    from fedlab.privacy.dprivacy import sample_euclidean_laplace

    with pytest.raises(ValueError, match="epsilon"):
        sample_euclidean_laplace(3, 1e-39, rng=0)                      # float32: +-inf
    assert bool(torch.isfinite(sample_euclidean_laplace(3, 1e-39, rng=0, dtype=torch.float64)).all())


def test_sanitize_update_of_integer_parameters_adds_unrounded_noise():
    # already fixed before issue 21: integer parameters are cast to float, NaN ones are refused
    from fedlab.privacy.dprivacy import sanitize_update

    out = sanitize_update(torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0]), 1.0, rng=0, safe=False)
    assert out.theta.is_floating_point() and not torch.equal(out.theta, out.theta.round())
    with pytest.raises(ValueError, match="finite"):
        sanitize_update(torch.tensor([math.nan, 2.0, 3.0]), torch.zeros(3), 1.0, rng=0)


def test_gaussian_noise_on_integers_names_the_argument_and_refuses_overflow():
    with pytest.raises(ValueError, match="update"):
        defenses.gaussian_noise(torch.tensor([1, 2]), 1.0)
    with pytest.raises(ValueError, match="sigma"):
        defenses.gaussian_noise(torch.ones(3), 1e39)                  # float32 noise would be inf
    assert bool(torch.isfinite(defenses.gaussian_noise(torch.ones(3, dtype=torch.float64), 1e39)).all())


def test_ldp_gaussian_refuses_an_epsilon_whose_noise_overflows():
    from fedlab.privacy import ldp

    with pytest.raises(ValueError, match="epsilon"):
        ldp.ldp_gaussian(torch.ones(2, 3), 1e-40, 1e-5, 1.0, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="epsilon"):                  # the float mechanism: its float32 noise overflows
        ldp.ldp_gaussian(torch.ones(2, 3), 1e-40, 1e-5, 1.0, generator=torch.Generator().manual_seed(0), safe=False)


def test_analytic_gaussian_delta_input_checks_and_large_epsilon():
    # already fixed before issue 21
    from fedlab.privacy import ldp

    with pytest.raises(ValueError, match="epsilon"):
        ldp.analytic_gaussian_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        ldp.analytic_gaussian_delta(1.0, 1.0, -1.0)
    for eps in (709.0, 710.0, 1000.0, 1e6):
        d = ldp.analytic_gaussian_delta(1.0, eps)
        assert 0.0 <= d <= 1.0 and math.isfinite(d)
    with pytest.raises(ValueError, match="epsilon"):
        ldp.analytic_gaussian_delta(1.0, math.inf)


# ---------------------------------------------------------------------- 5. metrics and FL
def test_accuracy_refuses_non_finite_scores():
    from fedlab.metrics import accuracy

    with pytest.raises(ValueError, match="pred"):
        accuracy(torch.full((3, 2), math.nan), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="pred"):
        accuracy(np.array([0.0, math.nan]), np.array([0, 1]))
    assert accuracy(torch.tensor([[0.0, 1.0], [2.0, 1.0]]), torch.tensor([1, 1])) == 0.5


def test_mse_and_psnr_refuse_empty_and_non_finite_arrays():
    from fedlab.metrics import mse, psnr

    for f in (mse, psnr):
        with pytest.raises(ValueError, match="empty"):
            f(np.zeros(0), np.zeros(0))
        with pytest.raises(ValueError, match="finite"):
            f(np.array([1.0, math.nan]), np.zeros(2))
        with pytest.raises(ValueError, match="finite"):
            f(np.zeros(2), np.array([math.inf, 0.0]))
    assert mse(np.ones(3), np.zeros(3)) == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_weighted_average_refuses_non_finite_weights(bad):
    from fedlab.fl import weighted_average

    with pytest.raises(ValueError, match="weights"):
        weighted_average({"a": torch.ones(2, 2)}, torch.tensor([bad, 1.0]))


def test_stack_clients_refuses_mixed_dtypes():
    from fedlab.fl import stack_clients

    a = (torch.ones(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="dtype"):
        stack_clients([a, (torch.ones(2, 3, dtype=torch.float64), torch.tensor([0, 1]))])
    with pytest.raises(ValueError, match="dtype"):
        stack_clients([a, (torch.ones(2, 3), torch.tensor([0.5, 1.7]))])
    assert stack_clients([a, a]).X.dtype == torch.float32


def test_selective_sgd_and_fedavg_refuse_negative_rounds():
    from fedlab.fl import fedavg, selective_sgd

    model = torch.nn.Linear(3, 2)
    clients = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))] * 2
    for f in (selective_sgd, fedavg):
        with pytest.raises(ValueError, match="num_rounds"):
            f(model, clients, num_rounds=-3)


def test_client_update_and_batch_plan_on_empty_data_name_the_argument():
    from fedlab.fl import batch_plan, client_update

    with pytest.raises(ValueError, match="n"):
        batch_plan(torch.tensor([0]), 2, 1)
    with pytest.raises(ValueError, match="n"):
        batch_plan(torch.tensor([3, 0]), None, 1)
    with pytest.raises(ValueError, match="n"):
        batch_plan(torch.tensor([], dtype=torch.long), 2, 1)
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="X"):
        client_update(model, dict(model.named_parameters()), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long),
                      local=LocalTraining(lr=0.1, batch_size=None))


def test_subset_takes_a_boolean_mask_as_a_mask():
    from fedlab.data import Dataset

    d = Dataset(torch.arange(8.0).reshape(4, 2), torch.arange(4))
    s = d.subset([True, False, True, False])
    assert s.y.tolist() == [0, 2]
    assert d.subset(torch.tensor([False, False, False, True])).y.tolist() == [3]
    assert d.subset([1, 3]).y.tolist() == [1, 3]
    with pytest.raises(ValueError, match="idx"):
        d.subset([True, False])                                         # mask of the wrong length


def test_ndcg_refuses_non_finite_scores_on_real_entries():
    from fedlab.fl.oltr import ndcg_at_k

    rel = torch.tensor([[1, 0, 1, 0]])
    mask = torch.tensor([[True, True, True, False]])
    with pytest.raises(ValueError, match="scores"):
        ndcg_at_k(torch.full((1, 4), math.nan), rel, mask)
    ok = ndcg_at_k(torch.tensor([[1.0, 0.0, 0.5, math.nan]]), rel, mask)  # padding may hold anything
    assert float(ok[0]) == pytest.approx(1.0)


def test_simulate_clicks_refuses_lists_that_can_never_have_a_pair():
    from fedlab.fl.oltr import simulate_clicks

    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="relevance"):               # perfect model: relevance 0 is never clicked
        simulate_clicks(torch.zeros(2, 4, dtype=torch.long), mask, "perfect", generator=gen)
    with pytest.raises(ValueError, match="relevance"):               # ... and relevance 2 always is, never stopping
        simulate_clicks(torch.full((2, 4), 2), mask, "perfect", generator=gen)
    clicks = simulate_clicks(torch.tensor([[0, 2, 0, 1], [2, 0, 0, 0]]), mask, "perfect", generator=gen)
    assert bool(((clicks.sum(1) > 0) & (clicks.sum(1) < 4)).all())
    # redraw=False keeps the old behaviour: whatever the cascade gives
    assert simulate_clicks(torch.zeros(2, 4, dtype=torch.long), mask, "perfect", redraw=False,
                           generator=gen).sum() == 0


@pytest.mark.parametrize("call", [
    lambda idn: idn.theorem1_failure_bound(-3, 0.3, 5),
    lambda idn: idn.theorem1_failure_bound([1, -1], 0.3, 5),
    lambda idn: idn.theorem1_failure_bound(3, 0.3, 0),
    lambda idn: idn.theorem1_failure_bound(3, 0.3, -2),
    lambda idn: idn.theorem1_failure_bound(math.nan, 0.3, 2),
])
def test_theorem_helpers_refuse_negative_interactions_or_batch_size(call):
    from fedlab.attacks import identifiability as idn

    with pytest.raises(ValueError, match="num_interactions|batch_size"):
        call(idn)


def test_theorem2_and_3_refuse_non_positive_counts():
    from fedlab.attacks import identifiability as idn

    kw = dict(delta=0.1, item_norm_bound=1.0, num_items=10, tau=0.1)
    with pytest.raises(ValueError, match="batch_size"):
        idn.theorem2_num_interactions(0.3, idn.Client(batch_size=0, lr=0.1, sigma=1.0), beta=0.1, **kw)
    with pytest.raises(ValueError, match="num_rated"):
        idn.theorem3_num_interactions(0.3, -1, sigma=1.0, lr=0.1, loss="log", **kw)
    assert idn.theorem2_num_interactions(0.3, idn.Client(batch_size=5, lr=0.1, sigma=1.0), beta=0.1, **kw) > 0


def test_letor_and_movielens_subsets_take_boolean_masks():
    from fedlab.data.letor import LTRData
    from fedlab.data.movielens import UserItems

    X = torch.randn(3, 4, 2)
    mask = torch.ones(3, 4, dtype=torch.bool)
    d = LTRData(X, torch.zeros(3, 4, dtype=torch.long), mask, ["a", "b", "c"], 3, "test")
    assert d.subset([False, True, True]).qids == ["b", "c"]
    u = UserItems(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4), mask, torch.arange(3))
    assert u.subset(np.array([True, False, True])).users.tolist() == [0, 2]
    with pytest.raises(ValueError, match="idx"):
        u.subset([True])


# ---------------------------------------------------------------------- 7. the vendored Adult
def test_load_adult_checks_the_vendored_files(tmp_path, monkeypatch):
    import gzip
    import shutil

    import fedlab.data as data

    for name in ("adult.data.gz", "adult.test.gz"):
        shutil.copy(data.VENDOR / name, tmp_path / name)
    # a valid gzip holding only the first half of the training rows used to load 15,081 rows silently
    lines = gzip.open(data.VENDOR / "adult.data.gz", "rt").read().splitlines(keepends=True)
    with gzip.open(tmp_path / "adult.data.gz", "wt") as fh:
        fh.writelines(lines[: len(lines) // 2])
    monkeypatch.setattr(data, "VENDOR", tmp_path)
    with pytest.raises(data.ChecksumError, match="adult.data.gz"):
        data.load_adult()
    monkeypatch.undo()
    assert len(data.load_adult()) == 30162


def test_load_adult_parses_once_but_a_changed_file_is_verified_again(tmp_path, monkeypatch):
    import gzip
    import shutil

    import fedlab.data as data

    for name in ("adult.data.gz", "adult.test.gz"):
        shutil.copy(data.VENDOR / name, tmp_path / name)
    monkeypatch.setattr(data, "VENDOR", tmp_path)
    first = data.load_adult()
    assert data._read_adult(tmp_path / "adult.data.gz") is data._read_adult(tmp_path / "adult.data.gz")  # cached
    lines = gzip.open(tmp_path / "adult.data.gz", "rt").read().splitlines(keepends=True)
    with gzip.open(tmp_path / "adult.data.gz", "wt") as fh:      # the file changes after it was parsed
        fh.writelines(lines[: len(lines) // 2])
    with pytest.raises(data.ChecksumError, match="adult.data.gz"):
        data.load_adult()
    assert len(first) == 30162


# ---------------------------------------------------------------------- 9. environment switches
def test_the_device_switch_is_read_by_config():
    # FEDLAB_DEVICE was once read by nothing (issue 21); it is now fedlab.config.device() (issue 32), tested
    # in tests/test_device.py
    import fedlab
    import fedlab.config

    assert fedlab.device is fedlab.config.device and "FEDLAB_DEVICE" in fedlab.config.__doc__


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("False", False), ("1", True),
                                       ("yes", True), (" ON ", True)])
def test_fedlab_progress_values(monkeypatch, value, on):
    from fedlab.config import progress_enabled

    monkeypatch.setenv("FEDLAB_PROGRESS", value)
    assert progress_enabled() is on


@pytest.mark.parametrize("value", ["2", "maybe", "nope", "0.5"])
def test_fedlab_progress_rejects_other_values(monkeypatch, value):
    from fedlab.config import progress_enabled

    monkeypatch.setenv("FEDLAB_PROGRESS", value)
    with pytest.raises(ValueError, match="FEDLAB_PROGRESS"):
        progress_enabled()


# ---------------------------------------------------------------------- found by tests/test_properties.py
@pytest.mark.parametrize("v", [1e-299, 1e200])
def test_sanitize_update_measures_tiny_and_huge_updates_without_under_or_overflow(v):
    # the squared norm of [1e-299, 1e-299] underflowed to 0 in float64: the non-zero update was
    # released exactly with leakage inf, as if it were zero; [1e200, 1e200] overflowed to eps = 0
    from fedlab.privacy.dprivacy import clip_update, estimate_update_norm, sanitize_update

    x = torch.tensor([[v, v]], dtype=torch.float64)
    out = sanitize_update(x, torch.zeros(2, dtype=torch.float64), 1.0, rng=0, safe=False)
    assert float(out.leakage[0]) == 2.0
    assert float(out.epsilon[0]) == pytest.approx(2.0 / (v * math.sqrt(2)))
    assert not torch.equal(out.theta, x)
    c = clip_update(x, torch.zeros(2, dtype=torch.float64), 0.5 * v)
    assert float(torch.linalg.vector_norm(c / v)) == pytest.approx(0.5)
    assert float(estimate_update_norm(x, torch.zeros(2, dtype=torch.float64), 1.0)[0]) > 0


# ---------------------------------------------------------------------- 6 (part, without pooch). the data cache
def test_fedlab_data_pointing_at_a_file_names_the_variable(monkeypatch, tmp_path):
    from fedlab.config import data_dir
    from fedlab.data import fetch

    f = tmp_path / "not_a_dir"
    f.write_text("x")
    monkeypatch.setenv("FEDLAB_DATA", str(f))
    with pytest.raises(ValueError, match="FEDLAB_DATA"):
        data_dir()
    with pytest.raises(ValueError, match="FEDLAB_DATA"):
        fetch("https://example.invalid/x.zip", "x.zip", None)


def test_fetch_does_not_create_a_missing_cache_just_to_find_a_file_missing(monkeypatch, tmp_path):
    from fedlab.data import OfflineError, fetch

    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDLAB_DATA", str(cache))
    with pytest.raises(OfflineError):
        fetch("https://example.invalid/x.zip", "x.zip", None)
    assert not cache.exists()
    with pytest.raises(OfflineError):
        fetch("https://example.invalid/x.zip", "x.zip", None, cache_dir=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_offline_loaders_leave_a_missing_cache_uncreated(monkeypatch, tmp_path):
    from fedlab.data import OfflineError
    from fedlab.data.letor import load_letor
    from fedlab.data.movielens import load_movielens_100k

    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDLAB_DATA", str(cache))
    with pytest.raises(OfflineError):
        load_movielens_100k()
    with pytest.raises(OfflineError):
        load_letor("MQ2007")
    with pytest.raises(OfflineError):
        load_letor("MSLR-WEB10K")
    assert not cache.exists()


def test_real_or_synthetic_falls_back_only_when_the_data_is_absent_and_lets_every_crash_through():
    from fedlab.data import ChecksumError, OfflineError, real_or_synthetic

    said = []

    def raising(exc):
        def load():
            raise exc
        return load

    assert real_or_synthetic(raising(OfflineError("absent")), lambda: "synthetic", name="MQ2007",
                             echo=said.append) == "synthetic"
    assert len(said) == 1 and "not in the local cache" in said[0] and "MQ2007" in said[0]
    # a crash of the real loader (a corrupt cache, a half-written file, a parse error, a bug) must not turn
    # into a silent switch to synthetic data (hostile-inputs D7): it propagates after one line naming the data
    for exc in (ChecksumError("sha256 mismatch"), FileNotFoundError("train.part"), ValueError("bad line 3"),
                TypeError("a bug")):
        said.clear()
        with pytest.raises(type(exc)):
            real_or_synthetic(raising(exc), lambda: "synthetic", name="MQ2007", echo=said.append)
        assert len(said) == 1 and "MQ2007" in said[0] and type(exc).__name__ in said[0] and "not falling back" in said[0]
    said.clear()
    assert real_or_synthetic(lambda: "real", lambda: "synthetic", echo=said.append) == "real" and len(said) == 1


def test_reproduce_command_rejects_a_bad_fedlab_progress(monkeypatch, capsys):
    from fedlab import reproduce

    monkeypatch.setenv("FEDLAB_PROGRESS", "maybe")
    assert reproduce.main(["reproduce", "04", "--seeds", "0", "--out", "/nonexistent-never-written"]) == 2
    assert "FEDLAB_PROGRESS" in capsys.readouterr().err


def test_a_download_needs_a_known_hash_so_a_landing_page_never_enters_the_cache(tmp_path):
    from fedlab.data.clustered import load_cms_inpatient
    from fedlab.data.download import fetch

    page = tmp_path / "landing.html"
    page.write_text("<html>not the CSV</html>")
    with pytest.raises(ValueError, match="sha256"):
        fetch(page.as_uri(), "cms.csv", None, download=True, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "cms.csv").exists()
    with pytest.raises(ValueError, match="sha256"):
        load_cms_inpatient(download=True)
