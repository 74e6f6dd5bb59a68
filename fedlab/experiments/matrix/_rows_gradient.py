"""The matrix's rows of Chapters 1a and 1b: DLG with the iDLG label and Inverting Gradients (1a), and the imprint
(Robbing the Fed) attack of a malicious server (1b). Each row is ``run(seed, columns, tiny) -> {column key: value, "baseline": value}``
(:class:`fedlab.experiments.matrix.Attack`); the defenses come from :func:`fedlab.privacy.apply`."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ... import models
from ...privacy import registry as reg
from ...privacy.registry import median_norm
from ...attacks import gradient_inversion as gi
from ...attacks import imprint as imp
from ...data import images, load_digits
from .layout import LOSS_SUFFIX, LOSS_TRUTH_SUFFIX, MALICIOUS_SERVER_DP_NA, NAIVE_SUFFIX, _defense, _gens, _size


# ----------------------------------------------------------------------------------------------------
# row 1: DLG with the iDLG label (Chapter 1a)
def _protected_gradients(G: torch.Tensor, w: dict, columns: Sequence[str], fc: str, *, publics: list | None = None,
                         **apply_kwargs):
    """The gradient rows ``G`` ``[A, n]`` under each of ``columns`` in turn (:func:`fedlab.privacy.apply_public`),
    as the attacker observes them: ``(views [len(columns) * A, n], the same as stacked parameters like w, iDLG's
    label of each view read off the last linear layer fc [len(columns) * A, 1])``; each column's public
    parameters are appended to ``publics`` when given."""
    pairs = [reg.apply_public(G, _defense(c), **apply_kwargs) for c in columns]
    if publics is not None:
        publics.extend(p for _, p in pairs)
    views = torch.cat([v for v, _ in pairs])
    obs = models.unflatten_stacked(views, w)
    return views, obs, torch.tensor([[gi.idlg_label(obs[fc][i])] for i in range(len(views))])


def _gradients_and_draws(net, w, X, y, seed: int, salt: int):
    """What both gradient-inversion rows start from: the per-image gradients ``G`` [n, P] (flattened), the name
    of the last linear layer's weight (iDLG's label), the row's generators (``salt``) and the median norm ``C``
    the clipping columns use."""
    G = models.flatten_stacked(gi.per_example_gradients(net, w, X, y))
    fc = [k for k, v in w.items() if v.ndim == 2][-1]
    gen, rng = _gens(seed, salt)
    return G, fc, gen, rng, median_norm(G)


def _dlg_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """DLG (Zhu et al. 2019) with the iDLG label rule (Zhao et al. 2020) on one-image FedSGD gradients of
    the sigmoid LeNet, 16 digits of 8x8 at quick scale, 3 calls of L-BFGS(20) as Chapter 1a's quick
    scale; under secure aggregation groups of 4 clients are summed and DLG inverts the mean gradient of
    4 images (labels learned). Under DP-FedAvg the curious server sees the clipped gradient before its
    own noise and, knowing ``C``, runs the clip-aware DLG (the cell equals the clipping cell's attack on
    the same input; the plain DLG stays as ``"<column>@naive"``); with ``outsider`` the attacker sees the
    noisy release instead (:data:`OUTSIDER_ROWS`). Metric: mean matched PSNR (dB)."""
    n_img = _size(tiny, tiny_value=4, quick=16, paper=32)
    steps, group = _size(tiny, tiny_value=2, quick=3, paper=15), 4
    net = gi.dlg_init_(models.lenet(1, 10, 8), seed=seed)
    w = models.get_params(net)
    digits = images.digit_images(n_img, seed=seed)
    X, y = digits.X, digits.y
    G, fc, gen, rng, C = _gradients_and_draws(net, w, X, y, seed, 1)
    out = {"baseline": float(np.mean(gi.psnr_baselines(X)["mean colour"]))}
    single = [c for c in columns if _defense(c).kind != "secagg"]
    if single:
        publics = []
        views, obs, labels = _protected_gradients(G, w, single, fc, clip_norm=C, generator=gen, rng=rng,
                                                  client_side_noise=outsider, publics=publics)
        budget = gi.AttackBudget(max_iter=gi.DLG_REFERENCE_MAX_ITER, lr=1.0, steps=steps)
        res = gi.dlg(net, w, obs, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, labels=labels),
                     budget=budget, stacked=True, seed=seed)
        psnr = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(res.x, X.repeat(len(single), 1, 1, 1))])
        out.update({c: float(psnr[i * n_img:(i + 1) * n_img].mean()) for i, c in enumerate(single)})
        # the attacker who knows a sparsifying defense matches only the coordinates that were sent (the others
        # are exactly 0 in the update it sees): that is the cell; the plain DLG above stays as "<column>@naive"
        # and the attacker who knows the clipping bound C clips its dummy gradient to C before matching (the
        # curious server under central DP sees the clipped gradient before its own noise: the same attacker)
        # (a user defense: the attacker reads the public parameters its fn returned)
        for i, c in enumerate(single):
            d = _defense(c)
            sl = slice(i * n_img, (i + 1) * n_img)
            ob = {k: v[sl] for k, v in obs.items()}
            if d.kind == "user":
                if not publics[i]:
                    continue
                knows = {}
                if "mask" in publics[i]:
                    knows["mask"] = models.unflatten_stacked(publics[i]["mask"], w)
                if "clip_norm" in publics[i]:
                    knows["clip_norm"] = publics[i]["clip_norm"]
            elif d.kind not in ("prune", "clip") and not (d.kind == "dp" and not outsider):
                continue
            else:
                knows = ({"mask": {k: v != 0 for k, v in ob.items()}} if d.kind == "prune"
                         else {"clip_norm": float(C)})
            ada = gi.dlg(net, w, ob, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, labels=labels[sl], **knows),
                         budget=budget, stacked=True, seed=seed)
            out[c + NAIVE_SUFFIX] = out[c]
            out[c] = float(np.mean([gi.matched_psnr(r, t[None])[0] for r, t in zip(ada.x, X)]))
            if "mask" in knows:       # did the attack reach its optimum? DLG's masked loss reached vs at the truth
                lab = labels[sl]
                out[c + LOSS_SUFFIX] = float(gi.matching_loss(net, w, ada.x, lab, ob, mask=knows["mask"]).median())
                out[c + LOSS_TRUTH_SUFFIX] = float(gi.matching_loss(net, w, X[:, None], lab, ob,
                                                                    mask=knows["mask"]).median())
    if "secagg" in columns:
        sums = reg.apply(G, "secagg", group=group, generator=gen) / group     # the server knows the group size
        res = gi.dlg(net, w, models.unflatten_stacked(sums, w),
                     knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, batch_size=group),
                     budget=gi.AttackBudget(max_iter=gi.DLG_REFERENCE_MAX_ITER, lr=1.0, steps=steps), stacked=True,
                     seed=seed)
        Xs = X.reshape(-1, group, 1, 8, 8)
        out["secagg"] = float(np.concatenate([gi.matched_psnr(r, t) for r, t in zip(res.x, Xs)]).mean())
    return out


# ----------------------------------------------------------------------------------------------------
# row 2: Inverting Gradients (Chapter 1a)
def _ig_row(seed: int, columns: Sequence[str], tiny: bool = False, *, outsider: bool = False) -> dict:
    """Inverting Gradients (Geiping et al. 2020) on one-image gradients of the ReLU LeNet, colour crops,
    with the iDLG label read from the (defended) gradient, as Chapter 1a: 6 crops of 32x32, 300
    signed-Adam steps from 2 restarts at quick scale. Under secure aggregation 2 clients are summed and
    IG, given both true labels, inverts the sum (cosine distance: the scale does not matter). Under
    DP-FedAvg the curious server inverts the clipped gradient before its noise, an outsider
    (``outsider``) the noisy release. Metric: mean matched PSNR (dB)."""
    n_img, size = _size(tiny, tiny_value=2, quick=6, paper=8), 32
    iters, group = _size(tiny, tiny_value=40, quick=300, paper=1500), 2
    restarts = _size(tiny, tiny_value=1, quick=2, paper=4)
    crops = images.sample_image_crops(n_img, size=size, crop=4 * size, seed=seed + 1)
    public = images.sample_image_crops(32, size=size, crop=4 * size, seed=seed + 2).X
    net = models.lenet(3, 10, size, activation="relu", seed=seed)
    w = models.get_params(net)
    X, y = crops.X, crops.y
    G, fc, gen, rng, C = _gradients_and_draws(net, w, X, y, seed, 2)
    kw = dict(budget=gi.AttackBudget(max_iter=iters, lr=0.1, num_restarts=restarts),
              prior=gi.ImagePrior(tv_weight=0.1, init_mean=public.mean((0, 2, 3)), init_std=public.std((0, 2, 3))),
              stacked=True, seed=seed)
    shape = (3, size, size)
    out = {"baseline": float(np.mean(gi.psnr_baselines(X)["mean colour"]))}
    single = [c for c in columns if _defense(c).kind != "secagg"]
    if single:
        publics = []
        views, obs, labels = _protected_gradients(G, w, single, fc, clip_norm=C, generator=gen, rng=rng,
                                                  client_side_noise=outsider, publics=publics)
        res = gi.inverting_gradients(net, w, obs, knows=gi.Knowledge(input_shape=shape, labels=labels), **kw)
        psnr = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(res.x, X.repeat(len(single), 1, 1, 1))])
        out.update({c: float(psnr[i * n_img:(i + 1) * n_img].mean()) for i, c in enumerate(single)})
        # the attacker who knows a sparsifying defense (pruning, top-k; a user defense that publishes its mask)
        # compares only the coordinates that were sent, as DLG's row does: that is the cell, the plain IG above
        # stays as "<column>@naive" (one stacked run for every such column)
        sparse = [i for i, c in enumerate(single) if _defense(c).kind == "prune" or "mask" in publics[i]]
        if sparse:
            rows = torch.cat([torch.arange(i * n_img, (i + 1) * n_img) for i in sparse])
            ob = {k: v[rows] for k, v in obs.items()}
            mk = models.unflatten_stacked(torch.cat([publics[i]["mask"] if "mask" in publics[i]
                                                     else views[i * n_img:(i + 1) * n_img] != 0 for i in sparse]), w)
            ada = gi.inverting_gradients(net, w, ob, knows=gi.Knowledge(input_shape=shape, labels=labels[rows], mask=mk),
                                         **kw)
            p_ada = np.array([gi.matched_psnr(r, t[None])[0] for r, t in zip(ada.x, X.repeat(len(sparse), 1, 1, 1))])
            # did it reach its optimum? IG's cosine matching term (its prior aside) reached vs at the true crops
            lab = labels[rows]
            reached = gi.matching_loss(net, w, ada.x, lab, ob, mask=mk, kind="cosine")
            truth = gi.matching_loss(net, w, X.repeat(len(sparse), 1, 1, 1)[:, None], lab, ob, mask=mk, kind="cosine")
            for j, i in enumerate(sparse):
                c, sl = single[i], slice(j * n_img, (j + 1) * n_img)
                out[c + NAIVE_SUFFIX] = out[c]
                out[c] = float(p_ada[sl].mean())
                out[c + LOSS_SUFFIX], out[c + LOSS_TRUTH_SUFFIX] = float(reached[sl].median()), float(truth[sl].median())
    if "secagg" in columns:
        sums = reg.apply(G, "secagg", group=group, generator=gen)
        res = gi.inverting_gradients(net, w, models.unflatten_stacked(sums, w),
                                     knows=gi.Knowledge(input_shape=shape, labels=y.reshape(-1, group)), **kw)
        Xs = X.reshape(-1, group, *X.shape[1:])
        out["secagg"] = float(np.concatenate([gi.matched_psnr(r, t) for r, t in zip(res.x, Xs)]).mean())
    return out


# ----------------------------------------------------------------------------------------------------
# row 3: imprint (Chapter 1b)
IMPRINT_TOL = 0.05


def _imprint_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """Robbing the Fed (Fowl et al. 2022): the malicious server sends the imprinted model of Chapter 1b
    (``imprint_model`` on a linear digit classifier, 64 bins, the server's Gaussian model of ``h(x)``);
    4 clients with 8 digits each compute their real gradient; the server reads inputs from the imprint
    layer's gradient of each client (of the 4-client sum under secure aggregation) with
    ``recover_from_imprint``. Metric: share of the 32 digits recovered within relative error 0.05
    (Chapter 1b asks 1e-4, exact, which no noise defense allows by construction)."""
    num_clients, batch, bins = 4, 8, _size(tiny, tiny_value=64, quick=64, paper=256)
    pool = load_digits().X.double()
    n = num_clients * batch
    idx = torch.as_tensor(np.random.default_rng(seed).choice(len(pool), size=n, replace=False))
    X = pool[idx]
    labels = torch.as_tensor(np.random.default_rng(seed + 1).integers(0, 10, n))
    direction = imp.imprint_layer(64, 1, mean=0.0, std=1.0, direction="random", seed=seed)[0][0]
    h = pool @ direction
    base = torch.nn.Linear(64, 10)
    with torch.no_grad():
        base.weight.copy_(torch.randn(10, 64, generator=torch.Generator().manual_seed(seed)) / 8.0)
        base.bias.zero_()
    model = imp.imprint_model(base, 64, bins, mean=float(h.mean()), std=float(h.std()), direction=direction,
                              seed=seed).double()
    names = [k for k, _ in model.named_parameters()]
    rows = []
    for c in range(num_clients):
        sl = slice(c * batch, (c + 1) * batch)
        loss = torch.nn.functional.cross_entropy(model(X[sl]), labels[sl])
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]))
    G = torch.stack(rows)
    like = {k: v.detach() for k, v in model.named_parameters()}
    iw, ib = names.index("imprint.weight"), names.index("imprint.bias")
    gen, rng = _gens(seed, 3)
    C = median_norm(G)

    def rate(views: torch.Tensor, truth: list[torch.Tensor]) -> float:
        obs = models.unflatten_stacked(views, like)
        hits = []
        for i, Xt in enumerate(truth):
            rec = imp.recover_from_imprint(obs[names[iw]][i], obs[names[ib]][i])
            hits.append(imp.match_recovered(Xt, rec.x) < IMPRINT_TOL)
        return float(torch.cat(hits).double().mean())

    chunks = list(X.reshape(num_clients, batch, 64))
    mean_digit = pool.mean(0, keepdim=True)
    out = {"baseline": float((imp.match_recovered(X, mean_digit) < IMPRINT_TOL).double().mean())}
    for c in columns:
        if c in _IMPRINT_NA:
            continue
        if _defense(c).kind == "secagg":
            out[c] = rate(reg.apply(G, _defense(c), group=num_clients, generator=gen), [X])
        else:
            out[c] = rate(reg.apply(G, _defense(c), clip_norm=C, generator=gen, rng=rng), chunks)
    return out


_IMPRINT_NA = {k: MALICIOUS_SERVER_DP_NA for k in ("dp1", "dp1safe", "dp8")}
