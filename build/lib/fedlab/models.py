"""Small models used across chapters, and helpers to treat parameters as plain tensors.

Models carry no buffers (no batch norm) so that a client update is a pure function of the
parameter dictionary, which :mod:`torch.func` can differentiate through and ``vmap`` over clients.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import seeded

__all__ = ["mlp", "logistic_regression", "linear_model", "lenet", "small_cnn", "get_params", "flatten_params",
           "unflatten_params", "flatten_stacked", "unflatten_stacked", "num_params", "text_classifier",
           "squared_error", "logistic_loss"]

_ACT = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def mlp(in_features: int, hidden: tuple[int, ...] | list[int], num_classes: int, *,
        activation: str = "relu", seed: int | None = None) -> nn.Module:
    """Fully connected network ``in_features -> hidden... -> num_classes`` (logits out).

    Input ``[batch, in_features]``; output ``[batch, num_classes]``. ``seed`` fixes the initialisation.
    """
    if activation not in _ACT:
        raise ValueError(f"activation must be one of {sorted(_ACT)}, got {activation!r}")
    if in_features < 1 or num_classes < 1 or any(h < 1 for h in hidden):
        raise ValueError("in_features, hidden sizes and num_classes must be positive")
    layers: list[nn.Module] = []
    width = in_features
    with seeded(seed):   # same init for the same seed, no side effect on the caller's random stream
        for h in hidden:
            layers += [nn.Linear(width, h), _ACT[activation]()]
            width = h
        layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def logistic_regression(in_features: int, num_classes: int = 2, *, seed: int | None = None) -> nn.Module:
    """Multinomial logistic regression (one linear layer, logits out)."""
    return mlp(in_features, (), num_classes, seed=seed)


def lenet(in_channels: int = 1, num_classes: int = 10, image_size: int = 8, *,
          activation: str = "sigmoid", seed: int | None = None) -> nn.Module:
    """The LeNet-style network of Zhu et al. (2019, DLG): three 5x5 convolutions with sigmoid
    activations and a linear classifier. Input ``[batch, in_channels, image_size, image_size]``.
    """
    if activation not in _ACT:
        raise ValueError(f"activation must be one of {sorted(_ACT)}, got {activation!r}")
    act = _ACT[activation]
    side = image_size
    convs: list[nn.Module] = []
    ch = in_channels
    with seeded(seed):
        for stride in (2, 2, 1):
            convs += [nn.Conv2d(ch, 12, kernel_size=5, padding=2, stride=stride), act()]
            ch = 12
            side = (side + 2 * 2 - 5) // stride + 1
        head = nn.Linear(12 * side * side, num_classes)
    return nn.Sequential(*convs, nn.Flatten(), head)


def small_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 8, *,
              channels: tuple[int, int] = (32, 64), hidden: int = 128, seed: int | None = None) -> nn.Module:
    """The CNN of Galli et al. (2022, Table 3, their FEMNIST model): two 2x2 convolutions with stride 1
    and ReLU (``channels[0]``, ``channels[1]`` feature maps), a 2x2 max pool, a fully connected ReLU
    layer of ``hidden`` units and a linear output of ``num_classes`` logits. The paper's widths are
    the defaults; smaller ``channels`` / ``hidden`` give the same architecture with fewer parameters.
    (On 28x28 FEMNIST with 62 classes the defaults have 1,400,990 parameters; the paper states 206,590
    in Sec. 4.3 and 1,206,590 in its appendix, neither of which Table 3 as printed yields.)
    Input ``[batch, in_channels, image_size, image_size]``; output ``[batch, num_classes]``.
    Raises ``ValueError`` for non-positive sizes or an image smaller than 4 pixels."""
    sizes = (in_channels, num_classes, image_size, hidden, *channels)
    if len(channels) != 2 or any(isinstance(v, bool) or int(v) != v or v < 1 for v in sizes):
        raise ValueError(f"in_channels, num_classes, image_size, hidden and the two channels must be "
                         f"positive integers, got {sizes}")
    if image_size < 4:
        raise ValueError(f"image_size must be >= 4, got {image_size}")
    side = (image_size - 2) // 2
    with seeded(seed):
        return nn.Sequential(nn.Conv2d(in_channels, channels[0], 2), nn.ReLU(),
                             nn.Conv2d(channels[0], channels[1], 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(channels[1] * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def get_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of a model's parameters, as the ``{name: tensor}`` dict used by fedlab.fl."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def flatten_params(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Concatenate a parameter dict into one vector ``theta`` of shape ``[d]``."""
    return torch.cat([v.reshape(-1) for v in params.values()])


def unflatten_params(theta: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten_params`: split ``theta`` (shape ``[d]``) into tensors shaped like ``like``."""
    total = sum(v.numel() for v in like.values())
    if theta.ndim != 1 or theta.numel() != total:
        raise ValueError(f"theta must be a vector of length {total}, got shape {tuple(theta.shape)}")
    out, i = {}, 0
    for k, v in like.items():
        out[k] = theta[i:i + v.numel()].reshape(v.shape)
        i += v.numel()
    return out


def flatten_stacked(stacked: dict) -> torch.Tensor:
    """Stacked parameter dict ``{name: [m, ...]}`` -> matrix ``[m, n]`` (``flatten_params`` per row)."""
    return torch.cat([v.reshape(v.shape[0], -1) for v in stacked.values()], dim=1)


def unflatten_stacked(theta: torch.Tensor, like: dict) -> dict:
    """Matrix ``[m, n]`` -> stacked dict ``{name: [m, *like[name].shape]}``.

    Raises ``ValueError`` if ``n`` differs from the number of parameters in ``like``."""
    total = sum(v.numel() for v in like.values())
    if theta.ndim != 2 or theta.shape[1] != total:
        raise ValueError(f"theta must have shape [m, {total}], got {tuple(theta.shape)}")
    out, i = {}, 0
    for name, v in like.items():
        out[name] = theta[:, i:i + v.numel()].reshape(theta.shape[0], *v.shape)
        i += v.numel()
    return out


def num_params(model_or_params) -> int:
    """Number of scalar parameters of a module or parameter dict."""
    if isinstance(model_or_params, nn.Module):
        return sum(p.numel() for p in model_or_params.parameters())
    return sum(v.numel() for v in model_or_params.values())


class _MeanPoolText(nn.Module):
    """Embedding -> mean over the sentence -> linear (see :func:`text_classifier`)."""

    def __init__(self, vocab_size: int, dim: int, num_classes: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(tokens).mean(dim=1))


def text_classifier(vocab_size: int, dim: int = 16, num_classes: int = 2, *,
                    seed: int | None = None) -> nn.Module:
    """Bag-of-words text model with an embedding layer, the setting of Melis et al. (2019, Sec. 4.1):
    ``tokens [batch, L] (int64) -> embedding [batch, L, dim] -> mean over L -> logits
    [batch, num_classes]``. The parameter ``"embedding.weight"`` is the matrix ``W_emb [V, d]``.
    """
    if vocab_size < 1 or dim < 1 or num_classes < 2:
        raise ValueError("vocab_size and dim must be positive and num_classes >= 2")
    with seeded(seed):
        return _MeanPoolText(vocab_size, dim, num_classes)


# --------------------------------------------------------------------------------------------
# one linear unit and per-sample losses (least squares and binary logistic regression)
# --------------------------------------------------------------------------------------------
def squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample squared error ``(x^T theta - y)^2`` (shape ``[batch]``); its batch mean is the
    local loss ``||X theta - y||^2 / m`` of Xu & Neglia (2021), Eq. (2)."""
    return (out.reshape(out.shape[0], -1)[:, 0] - y.to(out.dtype)) ** 2


def logistic_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample binary cross-entropy of a one-logit model (labels 0/1), shape ``[batch]``."""
    return F.binary_cross_entropy_with_logits(out.reshape(out.shape[0], -1)[:, 0], y.to(out.dtype),
                                              reduction="none")


def linear_model(num_features: int, *, bias: bool = False, dtype: torch.dtype = torch.float64,
                 seed: int | None = None) -> nn.Module:
    """One linear unit ``x -> x^T theta (+ b)``: least squares (``bias=False``, the paper's Eq. 2) or
    binary logistic regression (``bias=True`` with :func:`logistic_loss`). Input ``[n, num_features]``,
    output ``[n, 1]``. ``seed`` fixes the initial weights."""
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    with seeded(seed):
        return nn.Linear(num_features, 1, bias=bias).to(dtype)
