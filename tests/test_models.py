"""fedlab.models: the constructors leave the caller's random stream alone and build the papers' networks."""
import pytest
import torch


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
