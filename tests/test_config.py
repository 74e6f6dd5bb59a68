"""fedlab.config: the scale switch, seeding (every generator, and the samplers that take no generator follow
the base seed) and the data directory."""
import numpy as np
import pytest
import torch

import fedlab


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
