"""fedlab.data: the partitioners, the digits and Adult loaders, the data cache and the checksummed download
helper (fedlab.data.download)."""
import hashlib

import numpy as np
import pytest

from fedlab import data as D
from fedlab.data import download


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
