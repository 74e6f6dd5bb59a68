"""Slow reference implementations that the tests compare fedlab's batched code against (oracles live
with the tests, not in the library)."""
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedlab.fl.oltr import _check_hidden, _forward


def pdgd_gradient_pairs(theta: torch.Tensor, X: torch.Tensor, clicks: torch.Tensor, hidden=()) -> torch.Tensor:
    """Reference PDGD for ONE user and ONE query with 0/1 ``clicks`` [n]: an explicit loop over every
    (clicked i, not clicked j) pair, each ranking swap built explicitly and ``grad f`` taken with
    autograd. ``theta`` [P], ``X`` [n, F] -> ``[P]``. Slow; an oracle for :func:`fedlab.fl.oltr.pdgd_gradient`."""
    hidden = _check_hidden(hidden)
    n = X.shape[0]
    th = theta.detach().clone().requires_grad_(True)
    f = _forward(th[None], X[None], hidden)[0][0]
    jac = [torch.autograd.grad(f[i], th, retain_graph=True)[0] for i in range(n)]
    f = f.detach()

    def logp(order):
        s = f[order]
        return sum(s[k] - torch.logsumexp(s[k:], 0) for k in range(n))

    base = list(range(n))
    out = torch.zeros_like(theta)
    for i in range(n):
        for j in range(n):
            if clicks[i] == 1 and clicks[j] == 0:
                sw = list(base)
                sw[i], sw[j] = sw[j], sw[i]
                lp, lps = logp(base), logp(sw)
                rho = torch.exp(lps - torch.logaddexp(lp, lps))
                c = torch.sigmoid(f[i] - f[j]) * torch.sigmoid(f[j] - f[i])
                out = out + rho * c * (jac[i] - jac[j])
    return out


def fncf_updates_vmap(model, theta, X, E, I, mask, *, lr: float = 1.0, local_steps: int = 3):
    """The same batch computed as ``vmap(fncf_update)`` (an oracle for :func:`fedlab.fl.recsys.interactions.fncf_updates`)."""

    def one(x, e, i, k):
        return fncf_update(model, theta, x, e, i, k, lr=lr, local_steps=local_steps)

    return vmap(one)(X, E, I, mask)


# ------------------------------------------------------------------- FCF / FNCF, one user at a time

def _check_fcf(X, e, I):
    if X.dim() != 2 or e.dim() != 1 or I.dim() != 1:
        raise ValueError(f"X must be [m, d], e [d], I [m]; got {tuple(X.shape)}, {tuple(e.shape)}, "
                         f"{tuple(I.shape)}")
    if X.shape[0] != I.shape[0] or X.shape[1] != e.shape[0]:
        raise ValueError(f"shapes do not match: X {tuple(X.shape)}, e {tuple(e.shape)}, I {tuple(I.shape)}")


def fcf_item_update(X, e, I, mask=None, *, alpha: float = 0.0, lr: float = 1.0):
    """FCF's item-embedding update for one user (Ammad-ud-din et al. 2019, eq. for dJ/dy_i).

    With ``p_i = I_i``, confidence ``c_i = 1 + alpha I_i`` and loss ``1/2 sum_i c_i (I_i - x_i.e)^2``,
    the update is minus ``lr`` times the item gradient: ``lr * c_i (I_i - x_i . e) e``.

    ``X`` [m, d], ``e`` [d], ``I`` [m] (0/1 or continuous), ``mask`` [m] bool or None -> ``[m, d]``.
    Differentiable in ``I`` and ``e``. Raises ``ValueError`` on mismatched shapes or ``alpha < 0``.
    """
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    r = (1.0 + alpha * I) * (I - X @ e)
    if mask is not None:
        r = r * mask.to(r.dtype)
    return lr * r[:, None] * e[None, :]


def fcf_client_train(X, e, I, *, alpha: float = 0.0, lr: float = 1.0):
    """The plain FCF client (reference): one SGD step of ``torch.optim.SGD`` on the item embeddings
    with the confidence-weighted squared loss; returns the change of the item embeddings ``[m, d]``.
    Used to check that :func:`fcf_item_update` is the same algorithm."""
    _check_fcf(X, e, I)
    Y = torch.nn.Parameter(X.detach().clone())
    opt = torch.optim.SGD([Y], lr=lr)
    opt.zero_grad()
    loss = 0.5 * ((1.0 + alpha * I) * (I - Y @ e.detach()) ** 2).sum()
    loss.backward()
    opt.step()
    return (Y.detach() - X).detach()


def fncf_scores(model, theta, X, e):
    """Logits of one user for its items: ``X`` [m, d], ``e`` [d] -> ``[m]``."""
    inp = torch.cat([e.expand(X.shape[0], -1), X], dim=1)
    return functional_call(model, theta, (inp,)).squeeze(-1)


def _fncf_loss(state, model, I, mask):
    e, X, theta = state
    logits = fncf_scores(model, theta, X, e)
    w = mask.to(logits.dtype)
    return (F.binary_cross_entropy_with_logits(logits, I, reduction="none") * w).sum() / w.sum()


def fncf_update(model, theta, X, e, I, mask=None, *, lr: float = 1.0, local_steps: int = 3):
    """FNCF local training of one user (Perifanis & Efraimidis 2022; RAIFLE Sec. 4.1.3).

    ``local_steps`` full-batch gradient steps with step size ``lr`` on the user embedding ``e``,
    the item embeddings ``X`` and the MLP parameters ``theta``, minimising the mean binary
    cross-entropy between the logits and the interactions ``I`` over the real (``mask``) items.

    Shapes: ``X`` [m, d], ``e`` [d], ``I`` [m], ``mask`` [m] or None. Returns
    ``(delta_X [m, d], delta_theta {name: tensor}, e_new [d])``; only ``delta_X`` and ``delta_theta``
    leave the device. Written with :func:`torch.func.grad`, so it is differentiable in ``I`` and
    ``e`` (the server's view) and vmappable over users. Raises ``ValueError`` if ``local_steps < 1``
    or ``lr <= 0``.
    """
    if local_steps < 1:
        raise ValueError(f"local_steps must be >= 1, got {local_steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if mask is None:
        mask = torch.ones_like(I, dtype=torch.bool)
    state = (e, X, theta)
    g = grad(_fncf_loss)
    for _ in range(local_steps):
        ge, gX, gt = g(state, model, I, mask)
        state = (state[0] - lr * ge, state[1] - lr * gX,
                 {k: v - lr * gt[k] for k, v in state[2].items()})
    e_new, X_new, theta_new = state
    return X_new - X, {k: theta_new[k] - theta[k] for k in theta}, e_new


def fncf_client_train(model, theta, X, e, I, *, lr: float = 1.0, local_steps: int = 3):
    """The plain FNCF client (reference): ``torch.optim.SGD`` on ``nn.Parameter`` copies of the
    user embedding, item embeddings and network, ``local_steps`` full-batch steps of mean BCE on
    0/1 interactions. Returns ``(delta_X, delta_theta, e_new)`` like :func:`fncf_update`."""
    import copy

    net = copy.deepcopy(model)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(theta[k])
    ep = torch.nn.Parameter(e.detach().clone())
    Xp = torch.nn.Parameter(X.detach().clone())
    opt = torch.optim.SGD([ep, Xp, *net.parameters()], lr=lr)
    for _ in range(local_steps):
        opt.zero_grad()
        logits = net(torch.cat([ep.expand(Xp.shape[0], -1), Xp], dim=1)).squeeze(-1)
        F.binary_cross_entropy_with_logits(logits, I).backward()
        opt.step()
    dtheta = {k: (p.detach() - theta[k]) for k, p in net.named_parameters()}
    return (Xp.detach() - X), dtheta, ep.detach()


def mapping_fit_autograd(theta_in, theta_out, *, hidden, max_iter, lr=1e-3, seed=0):
    """Reference for :func:`fedlab.attacks.model_reconstruction.fit_mapping`: the same
    :class:`~fedlab.attacks.model_reconstruction.MappingNet` and normalisation, trained with autograd and
    ``torch.optim.Adam``. ``[P, n, d]`` inputs; returns ``(G, loss_curve [max_iter, P])``."""
    from fedlab.attacks.model_reconstruction import MappingNet

    ti, to = theta_in.float(), theta_out.float()
    P, n, d = ti.shape
    delta = ti - to
    G = MappingNet(P, d, hidden, seed=seed)
    centre = ti.mean(1, keepdim=True)
    G.centre.copy_(centre)
    G.in_scale.copy_((ti - centre).pow(2).sum(-1).mean(1, keepdim=True).sqrt().clamp_min(1e-12)[..., None])
    G.out_scale.copy_(delta.pow(2).sum(-1).mean(1, keepdim=True).sqrt().clamp_min(1e-12)[..., None])
    z_in, z_out = (ti - G.centre) / G.in_scale, delta / G.out_scale
    var = z_out.pow(2).sum((1, 2)).clamp_min(1e-12)
    opt = torch.optim.Adam([G.W1, G.b1, G.W2, G.b2], lr=lr)
    curve = torch.empty(max_iter, P)
    for s in range(max_iter):
        opt.zero_grad()
        per = (G.normalised(z_in) - z_out).pow(2).sum((1, 2))
        per.sum().backward()
        opt.step()
        curve[s] = per.detach() / var
    return G, curve


def mapping_minimise_autograd(G, init, *, max_iter, lr=1e-2):
    """Reference for :func:`fedlab.attacks.model_reconstruction.minimise_mapping`: Adam on
    ``||G(z)||^2`` with autograd. Returns ``[P, d]`` float64."""
    for p in G.parameters():
        p.requires_grad_(False)
    z = ((init.float()[:, None, :] - G.centre) / G.in_scale).clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(max_iter):
        opt.zero_grad()
        G.normalised(z).pow(2).sum().backward()
        opt.step()
    return (z.detach() * G.in_scale + G.centre)[:, 0, :].double()
