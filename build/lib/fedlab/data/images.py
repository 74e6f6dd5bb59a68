"""Small real images and a synthetic text corpus, all available offline.

* :func:`digit_images` -- scikit-learn's 8x8 handwritten digits as ``[n, 1, 8, 8]`` tensors in [0, 1].
* :func:`sample_image_crops` -- colour crops of the two photographs shipped inside scikit-learn
  (``sklearn.datasets.load_sample_images``: a Chinese temple and a flower), downsampled to
  ``size x size`` (default 32x32, the CIFAR resolution used by Zhu et al. 2019).
* :func:`synthetic_sentences` -- a tiny topic-labelled corpus of fixed-length sentences with Zipfian
  word frequencies, for the embedding-leakage experiment of Melis et al. (2019).
"""
from __future__ import annotations

import numpy as np
import torch

from . import Dataset, load_digits

__all__ = ["digit_images", "sample_image_crops", "synthetic_sentences"]


def digit_images(num_images: int | None = None, *, seed: int = 0) -> Dataset:
    """``num_images`` digits drawn without replacement (all 1797 when ``None``), as ``X`` of shape
    ``[n, 1, 8, 8]`` in [0, 1] and labels ``y`` ``[n]``. Raises ``ValueError`` if ``num_images`` is
    not in ``1..1797``."""
    ds = load_digits(flatten=False)
    if num_images is None:
        return ds
    if not 1 <= int(num_images) <= len(ds):
        raise ValueError(f"num_images must be in 1..{len(ds)}, got {num_images}")
    idx = np.random.default_rng(seed).choice(len(ds), size=int(num_images), replace=False)
    return ds.subset(idx)


def sample_image_crops(num_images: int, *, size: int = 32, crop: int = 128, seed: int = 0) -> Dataset:
    """Random ``crop x crop`` patches of scikit-learn's two sample photographs, average-pooled to
    ``size x size``. ``X``: ``[num_images, 3, size, size]`` in [0, 1]; ``y``: which photograph
    (0 = china.jpg, 1 = flower.jpg), alternating. ``meta["origin"]`` holds ``(photo, row, col)``.

    Raises ``ValueError`` if ``crop`` is not a positive multiple of ``size`` or ``num_images < 1``.
    """
    from sklearn.datasets import load_sample_images

    if int(num_images) < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    if size < 1 or crop < size or crop % size != 0:
        raise ValueError(f"crop must be a positive multiple of size, got crop={crop}, size={size}")
    photos = [np.asarray(im, dtype=np.float32) / 255.0 for im in load_sample_images().images]
    rng = np.random.default_rng(seed)
    f = crop // size
    X, y, origin = [], [], []
    for i in range(int(num_images)):
        p = i % len(photos)
        H, W, _ = photos[p].shape
        r, c = int(rng.integers(0, H - crop + 1)), int(rng.integers(0, W - crop + 1))
        patch = photos[p][r:r + crop, c:c + crop]
        patch = patch.reshape(size, f, size, f, 3).mean(axis=(1, 3))
        X.append(patch.transpose(2, 0, 1))
        y.append(p)
        origin.append((p, r, c))
    return Dataset(torch.from_numpy(np.stack(X)), torch.tensor(y, dtype=torch.long),
                   meta={"origin": origin})


_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "da", "fu", "gi", "ho", "ju", "pe", "zo"]


def _vocabulary(vocab_size: int) -> list[str]:
    words = []
    n = len(_SYLLABLES)
    for i in range(vocab_size):
        a, b, c = i // (n * n) % n, i // n % n, i % n
        words.append(_SYLLABLES[a] + _SYLLABLES[b] + _SYLLABLES[c])
    return words


def synthetic_sentences(num_sentences: int, *, vocab_size: int = 500, sentence_length: int = 12,
                        num_classes: int = 2, zipf_exponent: float = 1.1, seed: int = 0) -> Dataset:
    """A topic-labelled corpus for a bag-of-words text classifier.

    Each class (topic) has its own Zipf distribution over the vocabulary (word ranks permuted per
    topic, probability of rank r proportional to ``r^-zipf_exponent``); a sentence draws its label
    uniformly, then ``sentence_length`` word ids i.i.d. from its topic. ``X``: ``[n, L]`` int64 word
    ids, ``y``: ``[n]`` labels, ``meta["vocab"]``: the word strings.

    Raises ``ValueError`` for non-positive sizes or ``num_classes < 2``.
    """
    if num_sentences < 1 or vocab_size < 2 or sentence_length < 1:
        raise ValueError("num_sentences, vocab_size (>= 2) and sentence_length must be positive")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    rng = np.random.default_rng(seed)
    base = np.arange(1, vocab_size + 1, dtype=float) ** -zipf_exponent
    probs = np.stack([base[rng.permutation(vocab_size)] for _ in range(num_classes)])
    probs /= probs.sum(1, keepdims=True)
    y = rng.integers(0, num_classes, size=num_sentences)
    cum = probs.cumsum(1)[y]                                   # [n, V]
    u = rng.random((num_sentences, sentence_length, 1))
    X = (u > cum[:, None, :]).sum(-1).clip(max=vocab_size - 1)  # inverse-CDF sampling, vectorised
    return Dataset(torch.from_numpy(X.astype(np.int64)), torch.from_numpy(y.astype(np.int64)),
                   meta={"vocab": _vocabulary(vocab_size), "topic_probs": probs})
