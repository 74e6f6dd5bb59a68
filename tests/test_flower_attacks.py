"""Chapter 1a's and 1b's attacks on what a Flower server recorded (fedlab.flower.attacks), run on
transcripts of the Flower apps (in-process engine: the same ServerApp, ClientApp and Recorder)."""
import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: the `flower` extra (pip install '.[flower]', "
                                   "flwr[simulation]>=1.41) is needed for tests/test_flower_attacks.py")

from fedlab import flower  # noqa: E402
from fedlab.attacks.gradient_inversion import dlg_init_, parameter_gradient  # noqa: E402
from fedlab.data.images import digit_images  # noqa: E402
from fedlab.flower import attacks as fa  # noqa: E402
from fedlab.flower.deploy import demo_clients  # noqa: E402
from fedlab.models import lenet, mlp  # noqa: E402


def _fedsgd_images(seed=0, num_clients=4):
    imgs = digit_images(num_clients, seed=seed)
    clients = [(imgs.X[i:i + 1], imgs.y[i:i + 1]) for i in range(num_clients)]

    def model_fn():
        return dlg_init_(lenet(1, 10, 8, seed=seed), seed=seed)   # chapter 1a's sigmoid LeNet

    res = flower.run(model_fn, clients, engine="local", num_rounds=1, lr=0.1, batch_size=None, seed=seed)
    return clients, model_fn, res.transcript


def test_fedsgd_messages_are_the_clients_gradients():
    clients, model_fn, T = _fedsgd_images()
    obs = fa.observed_gradients(T, 1)
    assert sorted(obs) == [0, 1, 2, 3]
    for k, (X, y) in enumerate(clients):
        true = parameter_gradient(model_fn(), T.globals[0], X, y)
        assert max(float((obs[k][n] - true[n]).abs().max()) for n in true) < 1e-4
    with pytest.raises(ValueError, match="round"):
        fa.observed_gradients(T, 2)


def test_idlg_and_dlg_reconstruct_the_clients_images_from_the_transcript():
    """One image per client, FedSGD: iDLG's label rule is exact, and the images come back (at seeds 0-9,
    at least 3 of the 4 clients' images had PSNR > 30 dB, most > 100 dB, with 100 L-BFGS iterations)."""
    clients, model_fn, T = _fedsgd_images(seed=0)
    truth = {k: X for k, (X, _) in enumerate(clients)}
    y = torch.cat([yk for _, yk in clients])
    for idlg in (True, False):
        inv = fa.invert_gradients(model_fn, T, input_shape=(1, 8, 8), num_classes=10, max_iter=100, idlg=idlg,
                                  x_true=truth)
        assert inv.fedsgd and inv.partitions == [0, 1, 2, 3]
        assert inv.labels.flatten().tolist() == y.tolist()
        assert (inv.psnr > 30).mean() >= 0.5, inv.psnr
    with pytest.raises(ValueError, match="batch_size"):
        fa.invert_gradients(model_fn, T, input_shape=(1, 8, 8), num_classes=10, batch_size=2)


def test_membership_inference_on_the_models_a_client_returned():
    """Chapter 1b's passive attack on client 0's returned models: its own 30 training records against 30
    outsiders. At seeds 0-9 the AUC was 0.71-0.85 on client 0's models and 0.41-0.67 on client 1's
    (which never trained on them locally), client 0's above client 1's at every seed."""
    parts = demo_clients(3, seed=0)
    train = [type(c)(c.X[:30], c.y[:30]) for c in parts[:2]]
    outsiders = parts[2]

    def model_fn():
        return mlp(64, [64], 10, seed=0)

    res = flower.run(model_fn, train, engine="local", num_rounds=3, lr=0.5, batch_size=10, local_epochs=10, seed=0)
    X = torch.cat([train[0].X, outsiders.X[:30]])
    y = torch.cat([train[0].y, outsiders.y[:30]])
    is_member = np.r_[np.ones(30), np.zeros(30)]
    own = fa.membership_auc(model_fn, res.transcript, 0, X, y, is_member)
    other = fa.membership_auc(model_fn, res.transcript, 1, X, y, is_member)
    assert own > 0.65 and own > other, (own, other)
    assert fa.membership_signals(model_fn, res.transcript, 0, X, y).shape == (3, 60)
    with pytest.raises(ValueError, match="partition"):
        fa.membership_signals(model_fn, res.transcript, 5, X, y)
