"""Scale switch, seeding, partitioners, data cache and the checksummed download helper."""
import hashlib

import numpy as np
import pytest
import torch

import fedlab
from fedlab import data as D
from fedlab import metrics
from fedlab.data import download


def test_scale_default_and_pick(monkeypatch):
    monkeypatch.delenv("FEDLAB_SCALE", raising=False)
    assert fedlab.scale() == "quick" and fedlab.pick(1, 2) == 1
    monkeypatch.setenv("FEDLAB_SCALE", "paper")
    assert fedlab.scale() == "paper" and fedlab.pick(1, 2) == 2 and fedlab.is_paper_scale()
    monkeypatch.setenv("FEDLAB_SCALE", "huge")
    with pytest.raises(ValueError, match="FEDLAB_SCALE"):
        fedlab.scale()


def test_seed_everything_repeats_all_generators():
    def draw():
        g = fedlab.seed_everything(123)
        import random
        return (random.random(), np.random.rand(), torch.rand(3).tolist(), torch.rand(2, generator=g).tolist())

    assert draw() == draw()
    with pytest.raises(ValueError, match="seed"):
        fedlab.seed_everything(-1)


def test_data_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDLAB_DATA", str(tmp_path / "cache"))
    assert fedlab.data_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()


def test_partition_iid_sizes_and_coverage():
    parts = D.partition_iid(103, 10, seed=1)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103
    assert sorted(np.concatenate(parts).tolist()) == list(range(103))
    with pytest.raises(ValueError, match="num_clients"):
        D.partition_iid(5, 0)


def test_partition_label_skew_gives_few_classes():
    y = np.repeat(np.arange(10), 50)
    parts = D.partition_label_skew(y, 10, classes_per_client=2, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
    assert all(len(p) == 50 for p in parts)
    assert all(len(np.unique(y[p])) <= 2 for p in parts)


def test_partition_dirichlet_skew_decreases_with_alpha():
    y = np.repeat(np.arange(10), 100)

    def mean_classes(alpha):
        parts = D.partition_dirichlet(y, 10, alpha, seed=0)
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
        return np.mean([len(np.unique(y[p])) for p in parts])

    assert mean_classes(0.05) < mean_classes(100.0)
    with pytest.raises(ValueError, match="alpha"):
        D.partition_dirichlet(y, 10, 0.0)


def test_load_digits_and_adult():
    d = D.load_digits()
    assert d.X.shape == (1797, 64) and float(d.X.max()) <= 1.0 and d.y.unique().numel() == 10
    a = D.load_adult("train")
    assert a.X.shape[0] == 30162 and a.X.shape[1] == len(a.feature_names)
    assert 0.2 < float(a.y.float().mean()) < 0.3  # ~24.9 % earn > 50K
    assert abs(float(a.X[:, 0].mean())) < 1e-4  # standardised age
    assert set(a.meta["education"]) >= {"Doctorate", "Bachelors"}
    t = D.load_adult("test")
    assert t.X.shape == (15060, a.X.shape[1])


def test_fetch_uses_cache_and_verifies_checksum(tmp_path):
    payload = b"user item rating\n1 2 5\n"
    f = tmp_path / "ratings.txt"
    f.write_bytes(payload)
    good = hashlib.sha256(payload).hexdigest()
    assert download.fetch("http://invalid.example/x", "ratings.txt", good, cache_dir=tmp_path) == f
    with pytest.raises(download.ChecksumError, match="SHA-256 mismatch"):
        download.fetch("http://invalid.example/x", "ratings.txt", "0" * 64, cache_dir=tmp_path)


def test_fetch_offline_raises_without_network(tmp_path):
    with pytest.raises(download.OfflineError, match="download=True"):
        download.fetch("http://invalid.example/x", "missing.bin", None, cache_dir=tmp_path)


def test_fetch_download_over_http_and_bad_checksum(tmp_path, http_files):
    folder, base = http_files
    (folder / "src.bin").write_bytes(b"abc")
    cache = tmp_path / "cache"
    good = hashlib.sha256(b"abc").hexdigest()
    got = download.fetch(base + "src.bin", "abc.bin", good, download=True, cache_dir=cache)
    assert got == cache / "abc.bin" and got.read_bytes() == b"abc"
    with pytest.raises(download.ChecksumError):
        download.fetch(base + "src.bin", "abc2.bin", "f" * 64, download=True, cache_dir=cache)
    with pytest.raises(download.OfflineError, match="could not download"):      # 404: nothing cached
        download.fetch(base + "missing.bin", "abc3.bin", good, download=True, cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == ["abc.bin"]   # no corrupt, partial or temporary file


def test_metrics_known_values():
    assert metrics.accuracy(torch.tensor([1, 0, 2]), torch.tensor([1, 1, 2])) == pytest.approx(2 / 3)
    assert metrics.roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    from sklearn.metrics import roc_auc_score
    r = np.random.default_rng(0)
    for n in (5, 40, 400):
        lab, sc = r.integers(0, 2, n), r.integers(0, 7, n).astype(float)     # ties
        lab[:2] = [0, 1]
        assert metrics.roc_auc(lab, sc) == pytest.approx(roc_auc_score(lab, sc), abs=1e-12)
    x = np.zeros((4, 4))
    assert metrics.mse(x + 0.1, x) == pytest.approx(0.01)
    assert metrics.psnr(x + 0.1, x) == pytest.approx(20.0)
    assert metrics.psnr(x, x) == float("inf")
    with pytest.raises(ValueError, match="data_range"):
        metrics.psnr(x, x, data_range=0)
    with pytest.raises(ValueError, match="both classes"):
        metrics.roc_auc([1, 1], [0.2, 0.3])


def test_defenses():
    from fedlab.privacy import clip_by_norm, gaussian_noise, global_norm, prune_by_magnitude

    u = {"a": torch.tensor([3.0, -0.1]), "b": torch.tensor([[4.0, 0.2]])}
    assert float(global_norm(u)) == pytest.approx((9 + 0.01 + 16 + 0.04) ** 0.5)
    assert global_norm(torch.tensor([3, 4])).dtype == torch.float32                 # integers: float32
    assert global_norm(torch.tensor([3.0, 4.0], dtype=torch.float64)).dtype == torch.float64
    c = clip_by_norm(u, 1.0)
    assert float(global_norm(c)) == pytest.approx(1.0, rel=1e-5)
    p = prune_by_magnitude(u, 0.5)
    assert p["a"].tolist() == [3.0, 0.0] and p["b"].tolist() == [[4.0, 0.0]]
    z = gaussian_noise(torch.zeros(200_000), 0.5, generator=torch.Generator().manual_seed(0))
    assert float(z.std()) == pytest.approx(0.5, rel=0.01)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise(u, -1.0)
    with pytest.raises(ValueError, match="fraction"):
        prune_by_magnitude(u, 1.0)


def test_rounds_to_accuracy():
    h = {"round": [0, 1, 2, 3], "accuracy": [0.1, 0.5, 0.92, 0.95]}
    assert metrics.rounds_to_accuracy(h, 0.9) == 2
    assert metrics.rounds_to_accuracy(h, 0.99) is None
    with pytest.raises(ValueError, match="target"):
        metrics.rounds_to_accuracy(h, 0.0)


def test_model_constructors_leave_the_global_rng_alone():
    import fedlab
    from fedlab import models
    from fedlab.attacks.model_reconstruction import linear_model

    for build in (lambda: models.mlp(4, (3,), 2, seed=5), lambda: models.lenet(1, 10, 8, seed=5),
                  lambda: models.small_cnn(1, 10, 8, channels=(2, 3), hidden=4, seed=5),
                  lambda: models.text_classifier(10, 4, 2, seed=5), lambda: linear_model(3, seed=5)):
        fedlab.seed_everything(11)
        expected = torch.rand(3)
        fedlab.seed_everything(11)
        a = models.get_params(build())
        assert torch.equal(torch.rand(3), expected)          # the caller's stream is untouched
        b = models.get_params(build())
        assert all(torch.equal(a[k], b[k]) for k in a)         # the seed fixes the initialisation
    c = models.get_params(models.mlp(4, (3,), 2, seed=6))
    assert not torch.equal(c["0.weight"], models.get_params(models.mlp(4, (3,), 2, seed=5))["0.weight"])
    with pytest.raises(ValueError, match="seed"):
        models.mlp(4, (3,), 2, seed=-1)


def test_small_cnn_is_the_papers_table_3():
    from fedlab import models

    net = models.small_cnn(1, 62, 28)          # Galli et al., Table 3, on 28x28 FEMNIST
    assert models.num_params(net) == (4 * 32 + 32) + (32 * 4 * 64 + 64) + (64 * 13 * 13 + 1) * 128 + 129 * 62
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
    small = models.small_cnn(1, 10, 8, channels=(8, 16), hidden=32)
    assert models.num_params(small) == 5538 and small(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    for kwargs in (dict(image_size=3), dict(channels=(8,)), dict(hidden=0), dict(num_classes=True)):
        with pytest.raises(ValueError):
            models.small_cnn(**kwargs)


def test_samplers_without_generator_follow_the_base_seed():
    import fedlab
    from fedlab.privacy import dprivacy

    fedlab.seed_everything(3)
    a1, a2 = dprivacy.sample_euclidean_laplace(4, 1.0), dprivacy.sample_euclidean_laplace(4, 1.0)
    fedlab.seed_everything(3)
    b1 = dprivacy.sample_euclidean_laplace(4, 1.0)
    fedlab.seed_everything(4)
    c1 = dprivacy.sample_euclidean_laplace(4, 1.0)
    assert np.array_equal(a1, b1) and not np.array_equal(a1, a2) and not np.array_equal(a1, c1)


def test_argument_checks_name_the_argument():
    from fedlab._checks import in_range, positive_int

    assert positive_int("n", 3) == 3 and positive_int("n", 3.0) == 3 and isinstance(positive_int("n", 3.0), int)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="num_rounds must be a positive integer"):
            positive_int("num_rounds", bad)
    assert in_range("delta", 0.5, 0.0, 1.0) == 0.5
    assert in_range("f", 0.0, 0.0, 1.0, low_closed=True) == 0.0 and in_range("f", 1, 0, 1, high_closed=True) == 1.0
    for bad in (0.0, 1.0, float("nan"), -3):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
            in_range("delta", bad, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"f must be in \[0, 1\]"):
        in_range("f", 1.5, 0, 1, low_closed=True, high_closed=True)


def test_gaussian_noise_per_row_sigma():
    from fedlab.privacy import gaussian_noise

    x = torch.zeros(3, 20000, dtype=torch.float64)
    out = gaussian_noise(x, torch.tensor([0.0, 1.0, 3.0]), generator=torch.Generator().manual_seed(0))
    assert float(out[0].abs().max()) == 0.0
    assert abs(float(out[1].std()) - 1.0) < 0.03 and abs(float(out[2].std()) - 3.0) < 0.09
    for bad in (torch.tensor([1.0, -1.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([1.0, float("nan"), 1.0])):
        with pytest.raises(ValueError, match="sigma"):
            gaussian_noise(x, bad)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise(x, float("inf"))
