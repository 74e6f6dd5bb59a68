"""The matrix's row of Chapter 4: the eavesdropper that decodes client 0's local optimum from the (sent,
returned) model pairs on its link (Xu & Neglia 2021)."""
from __future__ import annotations

from typing import Sequence

import torch

from ... import fl, models
from ...privacy import registry as reg
from ...privacy.registry import dp_noise_multiplier, median_norm
from ...fl.dp_fedavg import DPSettings, dp_fedavg
from ...attacks import model_reconstruction as mr
from .layout import _defense, _gens


# ----------------------------------------------------------------------------------------------------
# row 5: local-model reconstruction by an eavesdropper (Chapter 4)
#: Chapter 4's first example: clients, share of clients per round, rounds
_MR_CLIENTS, _MR_FRACTION, _MR_ROUNDS = 5, 0.6, 60
#: participants per FedAvg round (:func:`fedlab.fl.fedavg`'s ``max(round(fraction K), 1)``): the secure sum's group
_MR_GROUP = max(int(round(_MR_FRACTION * _MR_CLIENTS)), 1)


def _mr_clients(seed: int):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k in range(_MR_CLIENTS):
        X = torch.randn(40 + 20 * k, 10, generator=g, dtype=torch.float64) + 0.3 * k
        y = X @ torch.randn(10, generator=g, dtype=torch.float64) + 0.1 * torch.randn(len(X), generator=g,
                                                                                     dtype=torch.float64)
        clients.append((X, y))
    return clients


def _mr_decode(theta_in: torch.Tensor, sent: torch.Tensor, clip_norm: float | None) -> torch.Tensor:
    """The eavesdropper's decoding of ``theta*`` from pairs ``(theta_in [P, d], theta_in + sent [P, d])``
    with :func:`fedlab.attacks.model_reconstruction.solve_affine`. With ``clip_norm`` the attacker knows the
    clipping bound ``C`` (as RAIFLE's rows do): a message of norm ``C`` (to relative 1e-9 in float64, 16 ulps in a narrower dtype) was clipped, so
    it is ``u / lambda`` for the affine map's output ``u = M [theta_in; 1]`` and an unknown ``lambda >= 1``,
    a message shorter than ``C`` is ``u`` itself. Both are linear in ``(M, lambda)``: one least-squares
    solve (``P d`` equations, ``d (d + 1) + #clipped`` unknowns) restores the clipped messages' length,
    and ``solve_affine`` decodes from all pairs. When every message was clipped (DP-FedAvg's noisy
    broadcasts can push all of client 0's updates past ``C``), the first one is kept as it is: that fixes
    a common scale of ``(M, lambda)``, which leaves the decoded optimum unchanged (``theta*`` is the zero of
    ``M [theta; 1]``, and so of any multiple of it). With fewer equations than unknowns it decodes from the
    messages as they are."""
    # a clipped message's norm equals C to the rounding of the dtype it was sent in (float32: ~1e-7)
    rel = 1e-9 if sent.dtype == torch.float64 else 16 * torch.finfo(sent.dtype).eps
    ti, u = theta_in.double(), sent.double()
    if clip_norm is not None:
        clipped = u.norm(dim=1) >= clip_norm * (1 - rel)
        P, d = u.shape
        if bool(clipped.all()):
            clipped[0] = False           # the scale reference: a common factor does not move theta*
        m = int(clipped.sum())
        if 0 < m < P and P * d >= d * (d + 1) + m:
            X = torch.cat([ti, torch.ones(P, 1, dtype=torch.float64)], 1)             # [P, d + 1]
            A = torch.zeros(P, d, d * (d + 1) + m, dtype=torch.float64)
            A[:, :, :d * (d + 1)] = torch.stack([torch.kron(torch.eye(d, dtype=torch.float64), x[None]) for x in X])
            A[clipped.nonzero()[:, 0], :, d * (d + 1) + torch.arange(m)] = -u[clipped]
            rhs = torch.where(clipped[:, None], torch.zeros_like(u), u)
            sol = torch.linalg.lstsq(A.reshape(P * d, -1), rhs.reshape(-1, 1), driver="gelsd").solution[:, 0]   # same bits every call
            u = u.clone()
            u[clipped] = u[clipped] * sol[d * (d + 1):, None]
    return mr.solve_affine(ti, ti + u).theta


def _mr_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The eavesdropper of Chapter 4 (Xu & Neglia 2021): 5 linear-regression clients (Chapter 4's first
    example), FedAvg with 60% of the clients per round (3 of 5), 3 local full-batch steps, lr 0.01, 60
    rounds; the eavesdropper records every (server model, returned model) pair of client 0 and decodes
    its local optimum with :func:`fedlab.attacks.model_reconstruction.solve_affine` (OLS over the observed
    rounds). Client-side defenses are applied to client 0's messages (the decoding uses only those pairs);
    when a column clips, the eavesdropper knows ``C`` and restores the length of the messages of norm
    ``C`` before decoding (:func:`_mr_decode`). DP-FedAvg runs :func:`fedlab.fl.dp_fedavg.dp_fedavg` as McMahan et al.'s
    Algorithm 1: the client clips its update, the trusted server adds the noise after the tapped link, so
    the eavesdropper sees the clipped update (and broadcast models that carry the earlier rounds' noise).
    Under secure aggregation the eavesdropper sees only the masked messages, so it decodes from the
    round's aggregate of the 3 participants. Metric: relative error ``||theta_hat - theta*|| / ||theta*||``."""
    clients = _mr_clients(seed)
    theta_star = mr.local_optimum(*clients[0])
    kw = dict(num_rounds=_MR_ROUNDS, seed=seed,
              local=fl.LocalTraining(lr=0.01, local_epochs=3, batch_size=None, loss_fn=mr.squared_loss))
    net = mr.linear_model(10, seed=seed)
    res, spy = mr.run_eavesdropped_fedavg(net, clients, targets=None, client_fraction=_MR_FRACTION, **kw)
    rel = lambda th: float((th - theta_star).norm() / theta_star.norm())   # noqa: E731
    t_in, t_out, rounds = spy.observations(0)
    gen, rng = _gens(seed, 5)
    U = (t_out - t_in)
    C = median_norm(U)
    out = {"baseline": rel(models.flatten_params(res.params).double())}
    for c in columns:
        d = _defense(c)
        if d.kind == "dp":
            pairs = []

            def spy_dp(r, d=d):
                if 0 in r.selected.tolist():
                    j = r.selected.tolist().index(0)
                    th = models.flatten_params(r.global_params).double()
                    u = models.flatten_params({k: v[j] for k, v in r.updates.items()}).double()
                    # Algorithm 1: client 0 clips before sending; the server's noise comes after the link
                    pairs.append((th, reg.apply(u[None], d, clip_norm=C, client_side_noise=False)[0]))

            z = dp_noise_multiplier(d.param)
            dp = DPSettings(noise_multiplier=z, clip_norm=C, sampling_prob=_MR_FRACTION, safe=d.safe)  # float or
            dp_fedavg(mr.linear_model(10, seed=seed), clients, dp=dp, callback=spy_dp, **kw)           # discrete Gaussian
            ti, sent = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            out[c] = rel(_mr_decode(ti, sent, C))
            continue
        elif d.kind == "secagg":
            ti, to = [], []
            for r in rounds:
                outs = [spy.observations(k) for k in range(5)]
                sel = [(o[0][o[2] == r][0], o[1][o[2] == r][0], len(clients[k][1])) for k, o in enumerate(outs)
                       if (o[2] == r).any()]
                th = sel[0][0]
                wts = torch.tensor([s[2] for s in sel], dtype=torch.float64)
                msgs = torch.stack([(s[1] - th) * s[2] for s in sel])
                agg = reg.apply(msgs, d, group=len(sel), generator=gen)[0] / wts.sum()
                ti.append(th)
                to.append(th + agg)
            ti, to = torch.stack(ti), torch.stack(to)
            out[c] = rel(mr.solve_affine(ti.double(), to.double()).theta)
        elif d.kind == "user":                  # the eavesdropper knows the clipping bound the defense publishes
            sent, public = reg.apply_public(U, d, generator=gen)
            out[c] = rel(_mr_decode(t_in, sent, public.get("clip_norm")))
        else:
            out[c] = rel(_mr_decode(t_in, reg.apply(U, d, clip_norm=C, generator=gen, rng=rng),
                                    C if d.kind == "clip" else None))
    return out
