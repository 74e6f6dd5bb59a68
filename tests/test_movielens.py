"""MovieLens-100K loader (u.data format, checksum, cache, offline) and the synthetic default."""
import numpy as np
import pytest
import torch

from fedlab.data import ChecksumError, OfflineError, sha256sum
from fedlab.data.movielens import (load_movielens_100k, parse_udata, sample_user_items,
                                   synthetic_movielens)

UDATA = "1\t3\t4\t881250949\n1\t1\t5\t881250950\n2\t2\t1\t881250951\n3\t5\t3\t881250952\n2\t3\t2\t881250953\n"


def test_parse_udata_binarises_and_reindexes():
    d = parse_udata(UDATA)
    assert (d.num_users, d.num_items) == (3, 5)
    items = d.user_items()
    assert [list(x) for x in items] == [[0, 2], [1, 2], [4]]
    assert d.ratings[:, 2].min() >= 1 and d.ratings[:, 2].max() <= 5


@pytest.mark.parametrize("bad", ["1\t2\t3\n", "1\t2\tx\t4\n", "0\t2\t3\t4\n", "1\t2\t9\t4\n", ""])
def test_parse_udata_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_udata(bad)


def test_loader_reads_cache_and_checks_sha(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLAB_DATA", str(tmp_path))
    with pytest.raises(OfflineError):                      # nothing cached, no download
        load_movielens_100k()
    path = tmp_path / "u.data"
    path.write_text(UDATA)
    d = load_movielens_100k(udata_sha256=sha256sum(path))
    assert d.num_users == 3 and len(d.ratings) == 5
    with pytest.raises(ChecksumError):                     # the real digest does not match our file
        load_movielens_100k()
    with pytest.raises(ChecksumError):
        load_movielens_100k(udata_sha256="0" * 64)


def test_loader_reads_zip(tmp_path, monkeypatch):
    import zipfile
    monkeypatch.setenv("FEDLAB_DATA", str(tmp_path))
    zp = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.writestr("ml-100k/u.data", UDATA)
    d = load_movielens_100k(zip_sha256=sha256sum(zp))
    assert d.num_items == 5
    with pytest.raises(ChecksumError):
        load_movielens_100k(zip_sha256="f" * 64)


def test_synthetic_has_movielens_shape():
    d = synthetic_movielens(seed=0)
    counts = d.ratings_per_user()
    assert (d.num_users, d.num_items) == (943, 1682)
    assert counts.min() >= 20
    assert 95 <= counts.mean() <= 120, counts.mean()       # MovieLens-100K: 106.0 (RAIFLE Table 2)
    again = synthetic_movielens(seed=0)
    assert np.array_equal(d.ratings, again.ratings)


def test_sample_user_items_four_to_one():
    d = synthetic_movielens(num_users=20, num_items=300, mean_ratings=40, seed=1)
    ui = sample_user_items(d, neg_ratio=4, seed=0)
    pos = ui.interactions.sum(1)
    real = ui.mask.sum(1)
    assert ((real - pos) == torch.minimum(4 * pos, 300 - pos)).all()   # 4 negatives per positive
    items = d.user_items()
    for u in range(20):                                      # positives are the rated items, negatives are not
        it = ui.items[u][ui.mask[u]].numpy()
        lab = ui.interactions[u][ui.mask[u]].numpy()
        assert set(it[lab == 1]) == set(items[u]) and not set(it[lab == 0]) & set(items[u])
    with pytest.raises(ValueError):
        sample_user_items(d, neg_ratio=0)
