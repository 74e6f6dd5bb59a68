"""Embedding-layer leakage (Melis et al. 2019): the non-zero rows of the embedding gradient are the
client's words; order is invisible and counts only show for a single sentence."""
import pytest
import torch

from fedlab import models
from fedlab.attacks import embedding_leakage as el
from fedlab.data.images import synthetic_sentences


@pytest.fixture(scope="module")
def setup():
    ds = synthetic_sentences(60, vocab_size=300, sentence_length=8, seed=0)
    net = models.text_classifier(300, 8, 2, seed=0)
    return ds, net, models.get_params(net)


@pytest.mark.parametrize("local_epochs", [0, 1, 4])
def test_word_set_is_recovered_exactly(setup, local_epochs):
    ds, net, p = setup
    X, y = ds.X[:10], ds.y[:10]
    upd = el.embedding_update(net, p, X, y, lr=0.5, local_epochs=local_epochs, batch_size=3,
                              generator=torch.Generator().manual_seed(0))
    rec = el.leaked_words(upd)
    assert torch.equal(rec, el.true_word_set(X))
    assert el.word_set_precision_recall(rec, X) == (1.0, 1.0)
    absent = torch.ones(300, dtype=torch.bool)
    absent[el.true_word_set(X)] = False
    assert float(upd["embedding.weight"][absent].abs().max()) == 0.0


def test_order_is_invisible(setup):
    ds, net, p = setup
    X, y = ds.X[:5], ds.y[:5]
    perm = torch.stack([row[torch.randperm(8, generator=torch.Generator().manual_seed(i))]
                        for i, row in enumerate(X)])
    g1 = el.embedding_update(net, p, X, y)
    g2 = el.embedding_update(net, p, perm, y)
    assert all(torch.allclose(g1[k], g2[k], atol=1e-7) for k in g1)


def test_counts_of_a_single_sentence_are_proportional_to_row_norms(setup):
    _, net, p = setup
    sent = torch.tensor([[5, 5, 5, 9, 9, 17, 17, 17]])       # counts 3, 2, 3 (mean pooling, L = 8)
    g = el.embedding_update(net, p, sent, torch.tensor([1]))["embedding.weight"]
    norms = g.norm(dim=1)
    assert norms[5] / norms[9] == pytest.approx(1.5, rel=1e-5)
    assert norms[17] / norms[5] == pytest.approx(1.0, rel=1e-5)


def test_precision_recall_values_and_errors():
    assert el.word_set_precision_recall([1, 2, 3, 4], [2, 4, 6]) == (0.5, pytest.approx(2 / 3))
    assert el.word_set_precision_recall([], [1]) == (1.0, 0.0)
    with pytest.raises(ValueError, match="true_words"):
        el.word_set_precision_recall([1], [])
    with pytest.raises(ValueError, match="key"):
        el.leaked_words({"fc.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="update"):
        el.leaked_words({})
    with pytest.raises(ValueError, match="threshold"):
        el.leaked_words(torch.zeros(3, 2), threshold=-1)
    with pytest.raises(ValueError, match="tokens"):
        el.embedding_update(models.text_classifier(10, 2, 2), {}, torch.zeros(2, 3), torch.zeros(2))


def test_text_classifier_shapes():
    net = models.text_classifier(50, 4, 3, seed=0)
    out = net(torch.randint(0, 50, (7, 11)))
    assert out.shape == (7, 3)
    assert dict(net.named_parameters())["embedding.weight"].shape == (50, 4)
    with pytest.raises(ValueError):
        models.text_classifier(50, 4, 1)
