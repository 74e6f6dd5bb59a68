"""Chapter 5's experiment helpers (Galli et al.): the RMSE of Eq. 15 for flat parameter vectors, as
the chapter measures the utility cost of the Euclidean Laplace noise against Proposition 3.2's bound
(:func:`fedlab.privacy.dprivacy.rmse_increase_bound`).
"""
from __future__ import annotations

import torch
from torch.func import functional_call, vmap

from ..models import unflatten_params

__all__ = ["rmse"]


def rmse(model, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """RMSE of Galli et al. Eq. 15, ``||f(X, theta) - Y||_2 / sqrt(|Z|)``, for a flat parameter
    vector ``theta`` ``[n]`` of ``model`` (a module with a single output). ``theta`` may also be
    ``[m, n]`` (returns ``[m]``)."""
    like = {k: v.detach() for k, v in model.named_parameters()}

    def one(t):
        out = functional_call(model, unflatten_params(t, like), (X,)).reshape(-1)
        return torch.sqrt(((out - y.reshape(-1)) ** 2).mean())

    theta = torch.as_tensor(theta, dtype=torch.float32)
    return vmap(one)(theta) if theta.ndim == 2 else one(theta)
