"""The experiments of chapters 1a and 1b. Chapter 1a (what a gradient gives away): embedding-row leakage of a
text model (Melis et al. 2019, Sec. 5.1), Deep Leakage from Gradients (Zhu et al. 2019, Alg. 1) and its
figures, the iDLG label rule (Zhao et al. 2020, Sec. 3.2) against DLG's labels, Inverting Gradients (Geiping
et al. 2020, Sec. 4) against DLG on a ReLU network, DLG's success against batch size and local steps (Wei et
al. 2020, Table 6a, as quoted by Xu & Neglia 2022, Sec. 1), every PSNR beside two reconstructions that use no
gradient (a flat grey image and the true image's mean colour), and the widget's noise grid. Chapter 1b
(``chapters/01b_gradient_defenses.ipynb``, defenses against gradient leakage): the noise and pruning defenses
of Zhu et al. (2019, Sec. 5) with their cost and the attacker who knows the pruning mask, and the imprint
module of Robbing the Fed (Fowl et al. 2022, Sec. 3) against secure aggregation.

The attacks themselves live in :mod:`fedlab.attacks.embedding_leakage` and
:mod:`fedlab.attacks.gradient_inversion`; this module runs them in the chapters' fixed order (so a page
that calls it draws exactly the random numbers it drew when the loops stood in its cells) and draws
the chapters' tables and figures.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..privacy.defenses import prune_rows
from .. import metrics, plots, privacy
from .._checks import positive_int
from ..attacks import embedding_leakage as el
from ..attacks import gradient_inversion as gi
from ..attacks import imprint as imp
from ..privacy.dprivacy import clopper_pearson

__all__ = ["UPDATE_SETTINGS", "ZHAO_LABEL_ACC", "WEI_RATES", "IG_PRIOR", "word_set_recovery", "recovery_table",
           "order_and_counts", "plot_dlg_snapshots", "plot_dlg_step", "plot_dlg_psnr", "label_table",
           "dlg_vs_inverting_gradients", "plot_dlg_vs_ig", "success_by_batch_size", "success_by_local_steps",
           "unrolled_local_steps", "unrolled_table", "unrolled_paragraph", "plot_wei_sweeps", "wei_table", "noise_grid",
           "plot_reconstruction", "plot_noise_grid",
           "pruning_grid", "defense_costs", "mean_psnr", "plot_defenses", "psnr_summary", "baseline_table",
           "plot_layer_distances", "layer_image_correlation", "images_per_cell", "imprint_demo", "plot_imprint",
           "plot_imprint_grid", "imprint_table", "success", "success_table", "imprint_psnr", "dlg_restarts",
           "restart_table", "restart_paragraph"]

#: the updates of Sec. 1 of the chapter: name -> local epochs (0: the FedSGD gradient)
UPDATE_SETTINGS = (("FedSGD gradient", 0), ("FedAvg, E = 1", 1), ("FedAvg, E = 5", 5))

#: Zhao et al. 2020, Table 1 (MNIST row): accuracy of the extracted labels
ZHAO_LABEL_ACC = {"DLG": 0.899, "iDLG": 1.000}

#: Wei et al. 2020, Table 6a, as quoted by Xu & Neglia 2022 (Sec. 1): success rate of the attack
WEI_RATES = {"batch size 1": 1.00, "batch size 16": 0.13, "local steps 1": 1.00, "local steps 9": 0.39}


# --- 1. embedding-layer leakage -------------------------------------------------------------------

def word_set_recovery(model, params: dict, clients, *, lr: float = 1.0, batch_size: int = 10,
                      settings: Sequence[tuple[str, int]] = UPDATE_SETTINGS) -> dict:
    """Melis et al. (2019, Sec. 5.1): the server reads every client's word set off the non-zero rows
    of the embedding update (:func:`fedlab.attacks.embedding_leakage.leaked_words`).

    For every ``(name, local_epochs)`` of ``settings`` (0: the FedSGD gradient) and every client ``k`` of
    ``clients`` (a :class:`fedlab.fl.ClientData`), the update from ``params`` with ``lr`` and
    ``batch_size`` (client ``k`` shuffles with ``torch.Generator().manual_seed(k)``).

    Returns ``{name: array [num_clients, 2]}`` of (precision, recall) per client. Raises ``ValueError``
    if ``settings`` is empty or a number of local epochs is negative.
    """
    if not settings:
        raise ValueError("settings must name at least one update")
    bad = [E for _, E in settings if E < 0]
    if bad:
        raise ValueError(f"settings: local epochs must be >= 0, got {bad}")
    per_setting = {}
    for name, E in settings:
        pr = []
        for k in range(clients.num_clients):
            Xk, yk = clients.client(k)
            upd = el.embedding_update(model, params, Xk, yk, lr=lr, local_epochs=E, batch_size=batch_size,
                                      generator=torch.Generator().manual_seed(k))
            pr.append(el.word_set_precision_recall(el.leaked_words(upd), el.true_word_set(Xk)))
        per_setting[name] = np.array(pr)
    return per_setting


def recovery_table(per_setting: Mapping):
    """Markdown table of :func:`word_set_recovery`: mean precision, mean recall and the worst client's
    recall per update. Raises ``ValueError`` if ``per_setting`` is empty."""
    if not per_setting:
        raise ValueError("per_setting must hold at least one update")
    rows = [[name, f"{pr[:, 0].mean():.3f}", f"{pr[:, 1].mean():.3f}", f"{pr[:, 1].min():.3f}"]
            for name, pr in per_setting.items()]
    return plots.md_table(["update the server sees", "precision", "recall", "worst client's recall"], rows)


def order_and_counts(model, params: dict, trained_params: dict, tokens: torch.Tensor, y: torch.Tensor, *,
                     vocab_size: int) -> dict:
    """What the embedding gradient does not give away (Melis et al. 2019, Sec. 5.1): word order and,
    for a batch, word counts.

    ``order_gap``: the largest change of the gradient at ``params`` when every sentence of ``tokens``
    ``[n, L]`` is shuffled (sentence ``i`` with ``torch.Generator().manual_seed(i)``). At
    ``trained_params``: ``ratio_spread``, ``max / min - 1`` of embedding-row norm over word count for
    the first sentence alone (0 up to round-off: norms are proportional to counts), and ``corr_batch``,
    the correlation of row norms and counts over the present words for the whole batch.

    Returns ``{"order_gap", "ratio_spread", "corr_batch"}`` (floats). Raises ``ValueError`` if
    ``vocab_size`` is not a positive integer or ``tokens`` is not ``[n, L]``.
    """
    vocab_size = positive_int("vocab_size", vocab_size)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be word ids [n, L], got shape {tuple(tokens.shape)}")
    perm = torch.stack([s[torch.randperm(s.numel(), generator=torch.Generator().manual_seed(i))]
                        for i, s in enumerate(tokens)])
    g, g_perm = el.embedding_update(model, params, tokens, y), el.embedding_update(model, params, perm, y)
    order_gap = max(float((g[k] - g_perm[k]).abs().max()) for k in g)

    def norms_and_counts(tok, labels):   # embedding-row norms of the update and true word counts, present words
        norms = el.embedding_update(model, trained_params, tok, labels)["embedding.weight"].norm(dim=1)
        counts = torch.bincount(tok.flatten(), minlength=vocab_size).float()
        return norms[counts > 0], counts[counts > 0]

    n1, c1 = norms_and_counts(tokens[:1], y[:1])           # one sentence: norm / count is one constant
    ratio_spread = float((n1 / c1).max() / (n1 / c1).min() - 1)
    nb_, cb = norms_and_counts(tokens, y)                   # the whole client's batch
    corr_batch = float(np.corrcoef(cb, nb_)[0, 1])
    return {"order_gap": order_gap, "ratio_spread": ratio_spread, "corr_batch": corr_batch}


# --- 2.-4. DLG, iDLG, Inverting Gradients ---------------------------------------------------------

def plot_dlg_snapshots(dlg_run, X_true: torch.Tensor, *, show: int = 4):
    """DLG's dummy images across L-BFGS iterations (``dlg_run.snapshots`` of
    :func:`fedlab.attacks.gradient_inversion.dlg`) for the first ``show`` attacks, the private image
    ``X_true [n, C, H, W]`` in the last column. Returns the figure. Raises ``ValueError`` if ``show`` is
    not a positive integer or the run kept no snapshot."""
    show = positive_int("show", show)
    snaps = dlg_run.snapshots
    if not snaps:
        raise ValueError("dlg_run has no snapshots (run gi.dlg with snapshot_every)")
    tiles = torch.cat([torch.stack([s[i, 0] for _, s in snaps] + [X_true[i]]) for i in range(show)])
    titles = ([f"it {it}" for it, _ in snaps] + ["true"]) * show
    return plots.image_grid(tiles, titles=titles, ncols=len(snaps) + 1, size=1.0,
                            suptitle="DLG on digits: dummy image across L-BFGS iterations (last column: the private image)")


def plot_dlg_step(dlg_run, X_true: torch.Tensor, *, image: int = 0, snapshot: int = -1):
    """One attack of a DLG run at one of its kept snapshots (``dlg_run.snapshots``): the dummy image beside the
    private one ``X_true[image]`` ``[C, H, W]``, titled with the iteration and the PSNR (:func:`fedlab.metrics.psnr`).
    The chapter's "Try it" widget redraws it. Returns the figure. Raises ``ValueError`` for a run without snapshots,
    or an ``image`` or ``snapshot`` out of range."""
    snaps = dlg_run.snapshots
    if not snaps:
        raise ValueError("dlg_run has no snapshots (run gi.dlg with snapshot_every)")
    if not -len(snaps) <= snapshot < len(snaps):
        raise ValueError(f"snapshot must index one of the {len(snaps)} snapshots, got {snapshot}")
    if not 0 <= image < min(len(X_true), snaps[0][1].shape[0]):
        raise ValueError(f"image must be in [0, {min(len(X_true), snaps[0][1].shape[0])}), got {image}")
    it, x = snaps[snapshot]
    dummy = x[image, 0]
    tiles = torch.stack([dummy, X_true[image]])
    titles = [f"iteration {it}: {metrics.psnr(dummy, X_true[image]):.1f} dB", "private image"]
    return plots.image_grid(tiles, titles=titles, ncols=2, size=1.6)


def plot_dlg_psnr(dlg_run, *, success_db: float, baselines: Mapping[str, float] | None = None):
    """Mean PSNR over the attacked images against DLG's objective evaluations (``dlg_run.history``, run
    with ``x_true``), the success threshold ``success_db`` dotted and, if given, ``baselines``
    (``{name: PSNR}``, e.g. the means of :func:`fedlab.attacks.gradient_inversion.psnr_baselines`) as
    dashed lines. Returns the axes. Raises ``ValueError`` if the run tracked no PSNR."""
    if not dlg_run.history.get("psnr"):
        raise ValueError("dlg_run has no PSNR history (run gi.dlg with x_true)")
    ax = plots.line_plot(dlg_run.history["iteration"], {"mean PSNR over the attacked digits": dlg_run.history["psnr"]},
                         xlabel="objective evaluations (closure calls)", ylabel="PSNR (dB)",
                         title="DLG converges in a few dozen evaluations")
    ax.axhline(success_db, color="gray", ls=":", label="success threshold")
    for i, (name, v) in enumerate((baselines or {}).items()):
        ax.axhline(v, color=plots.PALETTE[(i + 2) % len(plots.PALETTE)], ls="--", label=f"{name} (no attack)")
    ax.legend()
    return ax


def plot_layer_distances(dlg_run, layer_names: Sequence[str], *, attack: int = 0):
    """Zhu et al. (2019, Fig. 3) on our run: for attack ``attack`` of a stacked
    :func:`fedlab.attacks.gradient_inversion.dlg` run with ``x_true``, the mean squared difference
    between dummy and true gradient in every layer (``history["layer_mse"]``, one curve per name of
    ``layer_names``) and the mean squared error of the dummy image (``history["image_mse"]``) against
    the objective evaluations, on a log scale. Returns the axes. Raises ``ValueError`` if the run kept
    no image error or ``attack`` is out of range."""
    h = dlg_run.history
    if not h.get("image_mse") or not h.get("layer_mse"):
        raise ValueError("dlg_run has no per-layer / image history (run gi.dlg with x_true)")
    L, img = np.stack(h["layer_mse"]), np.stack(h["image_mse"])
    if not 0 <= attack < L.shape[1]:
        raise ValueError(f"attack must lie in [0, {L.shape[1]}), got {attack}")
    curves = {f"gradient MSE, layer {name}": L[:, attack, j] for j, name in enumerate(layer_names)}
    curves["image MSE (dummy vs private)"] = img[:, attack]
    styles = {"image MSE (dummy vs private)": {"color": "black", "lw": 2.5, "ls": "--"}}
    return plots.line_plot(h["iteration"], curves, xlabel="objective evaluations", ylabel="mean squared error",
                           logy=True, styles=styles, title="as the gradients match layer by layer, the image appears")


def layer_image_correlation(dlg_run, *, attack: int = 0) -> np.ndarray:
    """Spearman rank correlation, over the evaluations of attack ``attack``, between each layer's
    gradient MSE and the image MSE (``history`` of a stacked DLG run with ``x_true``): the lecture's
    "when the gradients' distance gets smaller, the MSE between the leaked and original images also
    gets smaller". Evaluations where the attack had already finished (NaN) are left out. Returns
    ``[layers]``."""
    from scipy.stats import spearmanr

    L, img = np.stack(dlg_run.history["layer_mse"])[:, attack], np.stack(dlg_run.history["image_mse"])[:, attack]
    seen = np.isfinite(L).all(1)                       # evaluations of this attack (NaN once it had finished)
    return np.array([spearmanr(L[seen, j], img[seen]).statistic for j in range(L.shape[1])])


def psnr_summary(psnr, x_true: torch.Tensor) -> dict:
    """An attack's PSNRs ``[n]`` (dB) beside the two reconstructions that need no gradient
    (:func:`fedlab.attacks.gradient_inversion.psnr_baselines` of ``x_true [n, C, H, W]``).

    Returns ``{"n", "attack", "grey", "mean colour"}`` (medians over the images, dB) and
    ``"beats grey"``, ``"beats mean colour"``: the share of images whose reconstruction has a higher
    PSNR than that image's flat grey / own mean-colour image. Raises ``ValueError`` if the lengths
    differ."""
    psnr = np.asarray(psnr, dtype=float).ravel()
    if len(psnr) != len(x_true):
        raise ValueError(f"psnr and x_true must hold one entry per image, got {len(psnr)} and {len(x_true)}")
    b = gi.psnr_baselines(x_true)
    return {"n": len(psnr), "attack": float(np.median(psnr)), "grey": float(np.median(b["grey"])),
            "mean colour": float(np.median(b["mean colour"])), "beats grey": float(np.mean(psnr > b["grey"])),
            "beats mean colour": float(np.mean(psnr > b["mean colour"]))}


def success(psnr, x_true: torch.Tensor, success_db: float) -> np.ndarray:
    """Chapter 1a's one success rule, for every attack (DLG, Inverting Gradients; chapter 1b's imprint module): a
    reconstruction succeeds when its PSNR is at least ``success_db`` **and** above the PSNR of the true
    image's own mean colour (:func:`fedlab.attacks.gradient_inversion.psnr_baselines`), so that a smooth
    image is not counted as recovered by its average. On the digits the mean colour scores far below 20
    dB and the second condition never binds.

    ``psnr`` ``[n]`` (dB), ``x_true`` ``[n, C, H, W]`` in ``[0, 1]``. Returns a bool array ``[n]`` (empty for
    ``n = 0``). Raises ``ValueError`` if the lengths differ or ``psnr`` holds a NaN."""
    psnr = np.asarray(psnr, dtype=float).ravel()
    if len(psnr) != len(x_true):
        raise ValueError(f"psnr and x_true must hold one entry per image, got {len(psnr)} and {len(x_true)}")
    if np.isnan(psnr).any():
        raise ValueError("psnr must not hold NaN")
    if len(psnr) == 0:
        return np.zeros(0, dtype=bool)
    return (psnr >= success_db) & (psnr > gi.psnr_baselines(x_true)["mean colour"])


def success_table(attacks: Mapping[str, tuple], *, success_db: float) -> tuple[dict, object]:
    """Every attack scored by :func:`success`: ``attacks`` is ``{name: (psnr [n], x_true [n, C, H, W])}``.
    Returns ``(rates, table)``: ``{name: success rate}`` and a Markdown table (images, median PSNR,
    successes, rate). Raises ``ValueError`` if ``attacks`` is empty or an attack has no image, and the
    errors of :func:`success`."""
    if not attacks:
        raise ValueError("attacks must hold at least one attack")
    rates, rows = {}, []
    for name, (psnr, x_true) in attacks.items():
        ok = success(psnr, x_true, success_db)
        if len(ok) == 0:
            raise ValueError(f"attacks[{name!r}] holds no image")
        rates[name] = float(ok.mean())
        rows.append([name, f"{len(ok)}", f"{float(np.median(psnr)):.1f}", f"{int(ok.sum())}", f"{rates[name]:.3f}"])
    return rates, plots.md_table(["attack", "images", "median PSNR (dB)",
                                  f"successes (≥ {success_db:g} dB and above the mean colour)", "success rate"], rows)


def imprint_psnr(demo: Mapping) -> np.ndarray:
    """PSNR (dB) of each image of :func:`imprint_demo` against what the server reads for it (the nearest
    recovered vector, zeros where nothing was recovered), capped at 120 dB (MSE 1e-12). Returns ``[n]``."""
    mse = ((demo["X_hat"].double() - demo["X"].double()) ** 2).reshape(len(demo["X"]), -1).mean(1).numpy()
    return metrics.psnr_from_mse(mse, min_mse=1e-12)


def dlg_restarts(model, params: dict, X: torch.Tensor, y: torch.Tensor, *, psnr0, loss0, evaluations0,
                 budget: gi.AttackBudget, seed: int = 0) -> dict:
    """DLG (Zhu et al. 2019, Alg. 1, the reference loop of :func:`fedlab.attacks.gradient_inversion.dlg`)
    restarted from ``num_restarts = budget.num_restarts`` further random starts, each run with ``budget``'s
    ``max_iter``, ``lr``, ``history_size`` and ``steps`` (Zhu et al.'s loop:
    ``gi.AttackBudget(max_iter=gi.DLG_REFERENCE_MAX_ITER, lr=1.0, num_restarts=R, steps=S)``), on the images
    ``X [n, C, H, W]``, ``y [n]`` (e.g. the
    ones a first run failed on), keeping per image the run whose matching loss is smallest (the attacker
    cannot see the PSNR). Run ``0`` is the first run, given by its ``psnr0``, ``loss0`` (its
    ``final_loss``) and ``evaluations0``, each ``[n]``; the ``num_restarts * n`` further attacks run as one
    stacked call (generator ``seed``; attack ``(r - 1) * n + i`` is restart ``r`` of image ``i``, each from
    its own random start). Also returns the loss at the truth, the matching loss of the true image with
    its one-hot label (0 up to round-off: the truth is a global minimum the optimiser did not reach).

    Returns ``{"psnr", "loss", "evaluations": [num_restarts + 1, n] arrays, "best": [n] run index of least
    loss, "psnr_best", "loss_best": [n], "loss_truth": [n]}``; with ``n = 0`` every array is empty and no
    attack runs. Raises ``ValueError`` for a ``budget`` that is not an :class:`~fedlab.attacks.AttackBudget` with
    ``steps`` (the reference loop), or inputs of different lengths."""
    if not isinstance(budget, gi.AttackBudget) or budget.steps is None:
        raise ValueError(f"budget must be an AttackBudget with steps (DLG's reference loop), got {budget!r}")
    num_restarts = budget.num_restarts
    n = len(X)
    first = [np.asarray(a, dtype=float).ravel() for a in (psnr0, loss0, evaluations0)]
    if len(y) != n or any(len(a) != n for a in first):
        raise ValueError(f"X, y, psnr0, loss0 and evaluations0 must have one entry per image, got {n}, {len(y)} "
                         f"and {[len(a) for a in first]}")
    psnr, loss, evals = ([a] for a in first)
    truth = np.zeros(n)
    if n:
        g = gi.per_example_gradients(model, params, X, y)
        for i in range(n):
            dummy = gi.parameter_gradient(model, params, X[i:i + 1], y[i:i + 1])
            truth[i] = float(gi.gradient_distance(dummy, {k: v[i] for k, v in g.items()}))
        reps = {k: v.repeat(num_restarts, *([1] * (v.ndim - 1))) for k, v in g.items()}   # row (r - 1) * n + i
        run = gi.dlg(model, params, reps, knows=gi.Knowledge(input_shape=tuple(X.shape[1:]), num_classes=10),
                     budget=replace(budget, num_restarts=1), stacked=True, seed=seed)
        p = np.array([gi.matched_psnr(run.x[j], X[j % n:j % n + 1])[0] for j in range(num_restarts * n)])
        psnr += list(p.reshape(num_restarts, n))
        loss += list(np.asarray(run.final_loss, dtype=float).reshape(num_restarts, n))
        evals += list(np.asarray(run.evaluations, dtype=float).reshape(num_restarts, n))
    psnr, loss, evals = (np.stack(a) if n else np.zeros((num_restarts + 1, 0)) for a in (psnr, loss, evals))
    best = loss.argmin(0) if n else np.zeros(0, dtype=int)
    cols = np.arange(n)
    return {"psnr": psnr, "loss": loss, "evaluations": evals, "best": best, "psnr_best": psnr[best, cols],
            "loss_best": loss[best, cols], "loss_truth": truth}


def restart_table(restart: Mapping, images: Sequence[int], *, max_evaluations: int):
    """Markdown table of :func:`dlg_restarts`, one row per restarted image (``images``: their indices on
    the page): evaluations the first run used (of ``max_evaluations``), the matching loss it reached, the
    loss at the truth, the PSNR of the first run and of the run of least loss, and which run that is.
    Raises ``ValueError`` if ``images`` does not match the result's length."""
    n = len(restart["psnr_best"])
    if len(images) != n:
        raise ValueError(f"images must name the {n} restarted images, got {len(images)}")
    rows = [[f"{int(i)}", f"{int(restart['evaluations'][0, j])} of {int(max_evaluations)}", f"{restart['loss'][0, j]:.2e}",
             f"{restart['loss_truth'][j]:.1e}", f"{restart['psnr'][0, j]:.1f}", f"{int(restart['best'][j])}",
             f"{restart['loss_best'][j]:.2e}", f"{restart['psnr_best'][j]:.1f}"] for j, i in enumerate(images)]
    return plots.md_table(["image", "first run: evaluations", "first run: loss reached", "loss at the truth",
                           "first run: PSNR (dB)", "run of least loss (0 = first)", "its loss", "its PSNR (dB)"],
                          rows or [["none failed at this seed"] + [""] * 7])


def restart_paragraph(restart: Mapping, *, final_loss, won, failed, stalled: int, rescued, num_restarts: int,
                      success_before: float) -> str:
    """The page's paragraph on DLG's restarts (Zhu et al. 2019 with :func:`dlg_restarts`), with this seed's
    numbers: how many digits failed and how many of those stopped before the budget, the matching losses
    of the failed and the successful runs beside the loss at the truth, how many failed digits the
    ``num_restarts`` more starts rescue, and the success rate before and after.

    ``final_loss [n]``: the first run's matching loss per digit; ``won [n]`` (bool): its successes;
    ``failed``: the indices of the failed digits; ``rescued [len(failed)]`` (bool); ``stalled``: failed
    runs that used fewer evaluations than the budget. Raises ``ValueError`` if ``rescued`` does not match
    ``failed``."""
    final_loss, won, rescued = np.asarray(final_loss), np.asarray(won, dtype=bool), np.asarray(rescued, dtype=bool)
    failed = np.asarray(failed, dtype=int)
    if rescued.shape != failed.shape:
        raise ValueError(f"rescued must have one entry per failed digit ({failed.size}), got {rescued.size}")
    n = final_loss.size
    if not failed.size:
        return (f"At this seed DLG succeeded on all {n} digits (matching loss at most {final_loss[won].max():.0e}), "
                f"so there is nothing to restart.")
    after = (won.sum() + rescued.sum()) / n
    return (f"At this seed DLG failed on {failed.size} of the {n} digits ({stalled} of them stopped before the "
            f"budget). Each failed run ended at a matching loss of at least {final_loss[failed].min():.2g}, where the "
            f"successful ones reached at most {final_loss[won].max():.0e} and the true digit with its label scores "
            f"{restart['loss_truth'].max():.0e} (round-off): the truth is a far lower minimum that the optimiser did "
            f"not reach. Restarted from {num_restarts} more random starts, keeping per digit the run of least loss, "
            f"{int(rescued.sum())} of the {failed.size} failed digits pass the success rule, and DLG's success rate "
            f"becomes {after:.3f} (from {success_before:.3f}).")


def baseline_table(summaries: Mapping[str, Mapping]):
    """Markdown table of :func:`psnr_summary` results, one row per ``{experiment: summary}``: median
    PSNR of the attack, of a flat grey image and of each image's mean colour, and the share of images
    the attack reconstructs better than each. Raises ``ValueError`` if ``summaries`` is empty."""
    if not summaries:
        raise ValueError("summaries must hold at least one experiment")
    rows = [[name, f"{s['n']}", f"{s['attack']:.1f}", f"{s['grey']:.1f}", f"{s['mean colour']:.1f}",
             f"{s['beats grey']:.2f}", f"{s['beats mean colour']:.2f}"] for name, s in summaries.items()]
    return plots.md_table(["experiment", "images", "attack, median PSNR (dB)", "flat grey 0.5", "mean colour",
                           "share above grey", "share above mean colour"], rows)


def label_table(ours: Mapping[str, float], n_eval: Mapping[str, int], run):
    """Markdown table of label accuracy, DLG's jointly optimised label against the iDLG rule, beside
    Zhao et al. 2020, Table 1 (:data:`ZHAO_LABEL_ACC`) and the stored paper-scale record of ``run``
    (names ``dlg_label_acc``, ``idlg_acc``). Raises ``ValueError`` if ``ours`` or ``n_eval`` lacks
    ``"DLG"`` or ``"iDLG"``."""
    names = {"DLG": "dlg_label_acc", "iDLG": "idlg_acc"}
    for arg, d in (("ours", ours), ("n_eval", n_eval)):
        if any(m not in d for m in names):
            raise ValueError(f"{arg} must hold 'DLG' and 'iDLG', got {sorted(d)}")
    paper = ZHAO_LABEL_ACC
    return plots.md_table(["label accuracy", "paper (MNIST)", "ours (sklearn digits)", "images",
                           "ours, paper scale (mean ± 95 % CI)"],
                          [[m, f"{paper[m]:.3f}", f"{ours[m]:.3f}", f"{n_eval[m]}", f"{run.stored(names[m])}"]
                           for m in paper])


#: Inverting Gradients' prior in :func:`dlg_vs_inverting_gradients` by default: TV weight 0.1 and a Gaussian start
#: ``0.5 + 0.25 N(0, 1)`` (Geiping et al. 2020, Sec. 4; the chapter passes the data's per-channel statistics).
IG_PRIOR = gi.ImagePrior(tv_weight=0.1, init_mean=0.5, init_std=0.25)


def dlg_vs_inverting_gradients(model, params: dict, X: torch.Tensor, y: torch.Tensor, *, weight_key: str,
                               dlg_budget: gi.AttackBudget, ig_budget: gi.AttackBudget,
                               prior: gi.ImagePrior = IG_PRIOR, seed: int = 0) -> dict:
    """DLG (Zhu et al. 2019) against Inverting Gradients (Geiping et al. 2020, Sec. 4) on the same
    one-image gradients, both given the label found by the iDLG rule (Zhao et al. 2020) from the
    weight gradient ``weight_key`` of the last linear layer, so that only the objective differs.

    ``X [n, C, H, W]``, ``y [n]``. DLG runs with ``dlg_budget`` (with ``steps``: the reference loop,
    ``steps`` calls of L-BFGS with ``max_iter`` iterations each, at most ``steps * max_iter`` evaluations;
    without: one L-BFGS run of ``max_iter`` iterations); IG runs ``ig_budget.max_iter`` signed-Adam steps
    (step ``ig_budget.lr``, Geiping et al.'s 0.1) from ``ig_budget.num_restarts`` starts of ``prior``
    (:data:`IG_PRIOR` by default: TV weight 0.1, Gaussian ``init_mean + init_std * N(0, 1)``) per image and
    keeps the start of least gradient loss; all attacks of each method in one stacked call.

    Returns ``{"labels": [n, 1], "dlg_x": [n, C, H, W], "ig_x": [n, C, H, W], "psnr_dlg": array [n],
    "psnr_ig": array [n], "dlg_evaluations": array [n], "ig_evaluations": int (per restart)}``.
    Raises ``ValueError`` if ``weight_key`` is not a parameter of ``params``, and as
    :func:`~fedlab.attacks.gradient_inversion.dlg` and :func:`~fedlab.attacks.gradient_inversion.inverting_gradients`
    for their budgets (DLG starts once; IG has no ``steps``).
    """
    if weight_key not in params:
        raise ValueError(f"weight_key {weight_key!r} is not a parameter of params")
    n, shape = len(X), tuple(X.shape[1:])
    g = gi.per_example_gradients(model, params, X, y)
    labels = torch.tensor([[gi.idlg_label(g[weight_key][i])] for i in range(n)])
    dlg_run = gi.dlg(model, params, g, knows=gi.Knowledge(input_shape=shape, num_classes=10, labels=labels),
                     budget=dlg_budget, stacked=True, seed=seed)
    dlg_evals = np.full(n, dlg_run.evaluations) if dlg_budget.steps is None else np.asarray(dlg_run.evaluations)
    ig = gi.inverting_gradients(model, params, g, knows=gi.Knowledge(input_shape=shape, labels=labels),
                                budget=ig_budget, prior=prior, stacked=True, seed=seed)
    psnr_dlg = np.array([gi.matched_psnr(dlg_run.x[i], X[i:i + 1])[0] for i in range(n)])
    psnr_ig = np.array([gi.matched_psnr(ig.x[i], X[i:i + 1])[0] for i in range(n)])
    return {"labels": labels, "dlg_x": dlg_run.x[:, 0], "ig_x": ig.x[:, 0], "psnr_dlg": psnr_dlg, "psnr_ig": psnr_ig,
            "dlg_evaluations": dlg_evals, "ig_evaluations": ig.evaluations}


def plot_dlg_vs_ig(X: torch.Tensor, result: Mapping):
    """Private images (titled with the PSNR of their own mean colour, the floor of
    :func:`fedlab.attacks.gradient_inversion.psnr_baselines`), DLG's and IG's reconstructions
    (:func:`dlg_vs_inverting_gradients`) with their PSNR. Returns the figure."""
    n = len(X)
    floor = gi.psnr_baselines(X)["mean colour"]
    return plots.image_grid(torch.cat([X, result["dlg_x"], result["ig_x"]]), ncols=3 if n == 1 else n, size=2.0,
                            titles=[f"mean colour {b:.1f} dB" for b in floor]
                            + [f"DLG {p:.1f} dB" for p in result["psnr_dlg"]]
                            + [f"IG {p:.1f} dB" for p in result["psnr_ig"]])


# --- 5. batch size and local steps (Wei et al. 2020) -----------------------------------------------

def images_per_cell(num_images: int, batch_size: int) -> int:
    """Images attacked at batch size ``batch_size`` in :func:`success_by_batch_size`: ``num_images``
    rounded up to a multiple of ``batch_size`` (at least one batch)."""
    num_images, batch_size = positive_int("num_images", num_images), positive_int("batch_size", batch_size)
    return batch_size * int(np.ceil(num_images / batch_size))


def success_by_batch_size(model, params: dict, X: torch.Tensor, y: torch.Tensor, batch_sizes: Sequence[int], *,
                          num_images: int, max_iter: int, success_db: float, steps: int | None = None,
                          seed: int = 0) -> dict:
    """DLG's success rate against the batch size ``B`` of one FedSGD gradient (Wei et al. 2020,
    Table 6a): for each ``B`` in order, ``n`` images of ``X [N, ...]`` (``num_images`` rounded up to a
    multiple of ``B``, at least ``B``) are dealt to ``n / B`` clients and attacked with
    :func:`fedlab.attacks.gradient_inversion.attack_grid`; success is PSNR >= ``success_db``.

    ``max_iter`` / ``steps`` set DLG's budget as in :func:`fedlab.attacks.gradient_inversion.dlg`.
    Returns ``{B: success rate}``. Raises ``ValueError`` if ``num_images`` or a batch size is not a
    positive integer, or ``X`` holds too few images.
    """
    num_images = positive_int("num_images", num_images)
    by_batch = {}
    for B in batch_sizes:
        positive_int("batch_sizes", B)
        n = images_per_cell(num_images, B)
        if n > len(X):
            raise ValueError(f"X holds {len(X)} images, batch size {B} needs {n}")
        by_batch[B] = gi.attack_grid(model, params, X[:n], y[:n], num_classes=10, batch_size=B, settings={"plain": {}},
                                     budget=gi.AttackBudget(max_iter=max_iter, lr=1.0, steps=steps), seed=seed)["plain"]
    return {B: gi.success_rate(r["psnr"], success_db) for B, r in by_batch.items()}


def success_by_local_steps(model, params: dict, X: torch.Tensor, y: torch.Tensor, local_steps: Sequence[int], *,
                           local_lr: float, max_iter: int, success_db: float, steps: int | None = None,
                           seed: int = 0) -> dict:
    """DLG's success rate against the number ``K`` of local steps (Wei et al. 2020, Table 6a): every
    image of ``X`` is one client taking ``K`` steps with ``local_lr`` and sending
    :func:`fedlab.attacks.gradient_inversion.client_update_as_gradient`, which the attacker treats as
    one gradient. All ``K`` in one stacked attack.

    Returns ``{K: success rate}``. Raises ``ValueError`` if a ``K`` is not a positive integer or
    ``local_lr <= 0``."""
    for K in local_steps:
        positive_int("local_steps", K)
    if not local_lr > 0:
        raise ValueError(f"local_lr must be > 0, got {local_lr}")
    by_steps = gi.attack_grid(model, params, X, y, num_classes=10,
                              settings={K: {"local_steps": K} for K in local_steps}, local_lr=local_lr,
                              budget=gi.AttackBudget(max_iter=max_iter, lr=1.0, steps=steps), seed=seed)
    return {K: gi.success_rate(r["psnr"], success_db) for K, r in by_steps.items()}


def unrolled_local_steps(model, params: dict, X: torch.Tensor, y: torch.Tensor, *, local_steps: int = 9,
                         local_lrs: Sequence[float] = (0.01, 0.1), max_iter: int, success_db: float,
                         steps: int | None = None, seed: int = 0) -> dict:
    """Two attackers against the same clients, each holding one image of ``X`` and taking ``local_steps``
    ``K`` full-batch SGD steps with learning rate ``eta`` (every ``eta`` of ``local_lrs``) before it sends
    :func:`fedlab.attacks.gradient_inversion.client_update_as_gradient`:

    * ``"one gradient"``: DLG treats the update as one gradient (Wei et al. 2020; the sweep above);
    * ``"unrolled"``: DLG simulates the ``K`` steps on its dummy image and matches the simulated update
      (Geiping et al. 2020, Sec. 5; :func:`fedlab.attacks.gradient_inversion.dlg` with ``local_steps``).

    Both start from the same points (same ``seed``, same clients) with the same budget. For the unrolled
    attacker, the evidence of whether it reached its optimum: the normalised matching loss
    (:func:`fedlab.attacks.gradient_inversion.matching_loss` with the client's ``K`` steps, true labels) at
    each reconstruction; at the true image it is exactly 0, because the simulated update is then the
    client's own computation.

    Returns ``{eta: {"one gradient": rate, "unrolled": rate, "psnr_one": array [n], "psnr_unrolled":
    array [n], "loss_unrolled": array [n], "loss_truth": array [n]}}`` (rates: share with PSNR >=
    ``success_db``). Raises ``ValueError`` if ``local_steps`` < 2 or an ``eta`` is not a finite number > 0."""
    positive_int("local_steps", local_steps)
    if local_steps < 2:
        raise ValueError(f"local_steps must be >= 2 (one step is the plain gradient), got {local_steps}")
    if not local_lrs:
        raise ValueError("local_lrs must hold at least one learning rate")
    for lr in local_lrs:
        if isinstance(lr, bool) or not (isinstance(lr, (int, float)) and np.isfinite(lr) and lr > 0):
            raise ValueError(f"local_lrs must hold finite numbers > 0, got {list(local_lrs)}")
    out = {}
    for lr in local_lrs:
        budget = gi.AttackBudget(max_iter=max_iter, lr=1.0, steps=steps)
        res = {u: gi.attack_grid(model, params, X, y, num_classes=10, local_lr=lr, budget=budget, seed=seed,
                                 settings={local_steps: {"local_steps": local_steps, "knows_local_steps": u}})[local_steps]
               for u in (False, True)}
        updates = [gi.client_update_as_gradient(model, params, X[i:i + 1], y[i:i + 1], lr=lr, local_steps=local_steps)
                   for i in range(len(X))]
        observed = {k: torch.stack([u[k] for u in updates]) for k in params}
        loss = lambda x: gi.matching_loss(model, params, x, y[:, None], observed, local_steps=local_steps,
                                          local_lr=lr).numpy()
        out[lr] = {"one gradient": gi.success_rate(res[False]["psnr"], success_db),
                   "unrolled": gi.success_rate(res[True]["psnr"], success_db),
                   "psnr_one": res[False]["psnr"], "psnr_unrolled": res[True]["psnr"],
                   "loss_unrolled": loss(res[True]["x"]), "loss_truth": loss(X[:, None])}
    return out


def unrolled_table(result: Mapping, run, *, local_steps: int = 9, success_db: float = 20.0):
    """Markdown table of :func:`unrolled_local_steps`: per learning rate, the success of the attacker that
    treats the update as one gradient and of the one that unrolls the ``K`` steps, each as this run's rate
    beside the stored paper-scale record (``unroll_one_<i>`` / ``unroll_rate_<i>``, ``i`` the learning rate's
    position), and the unrolled attacker's failures: how many, and the median normalised matching loss they
    stopped at (the loss at the truth is 0). Four columns, so that it fits the page."""
    rows = []
    for i, (lr, r) in enumerate(result.items()):
        fail = r["psnr_unrolled"] < success_db
        lost = f"{int(fail.sum())} of {fail.size}, median loss {np.median(r['loss_unrolled'][fail]):.2g}" if fail.any() \
            else f"none of {fail.size}"
        rows.append([f"{lr:g}", f"{r['one gradient']:.2f} (paper scale: {run.stored(f'unroll_one_{i}', 2, value_range=(0, 1))})",
                     f"{r['unrolled']:.2f} (paper scale: {run.stored(f'unroll_rate_{i}', 2, value_range=(0, 1))})", lost])
    return plots.md_table([f"learning rate η, K = {local_steps} steps", "treats the update as one gradient",
                           "unrolls the K steps", "unrolled attacks that failed: where they stopped (loss at the truth: 0)"],
                          rows)


def unrolled_paragraph(result: Mapping, *, success_db: float = 20.0) -> str:
    """The page's sentence on the unrolled attacker's failures (:func:`unrolled_local_steps`), with this run's
    numbers: how many attacks failed over all learning rates, the least matching loss a failure stopped at,
    the largest a success reached, and the loss at the truth (0)."""
    loss = np.concatenate([np.asarray(r["loss_unrolled"]) for r in result.values()])
    won = np.concatenate([np.asarray(r["psnr_unrolled"]) >= success_db for r in result.values()])
    truth = max(float(np.max(r["loss_truth"])) for r in result.values())
    if won.all():
        return (f"At this seed every one of the {won.size} unrolled attacks succeeded (matching loss at most "
                f"{loss.max():.0e}; {truth:.0e} at the truth).")
    ended = ("Each failure stopped at a matching loss of at least {:.2g}, where every success reached at most {:.0e} "
             "and the true digit scores {:.0e}: the failures are stalls of the optimiser, not other images that explain "
             "the update, so the unrolled rates are lower bounds on what the update gives away."
             if won.any() and loss[~won].min() > loss[won].max() else
             "The failures stopped at matching losses from {:.2g} up, some at or below the largest a success reached ({:.0e}; "
             "{:.0e} at the truth): loss alone does not separate them here.")
    return (f"At this seed {int((~won).sum())} of the {won.size} unrolled attacks failed. "
            + ended.format(loss[~won].min(), loss[won].max() if won.any() else float("nan"), truth))


def plot_wei_sweeps(rate_b: Mapping[int, float], rate_k: Mapping[int, float]):
    """Success rate against batch size and against local steps (ours, from
    :func:`success_by_batch_size` and :func:`success_by_local_steps`) beside Wei et al.'s end points
    (:data:`WEI_RATES`). Returns the figure."""
    batch_sizes, local_steps = list(rate_b), list(rate_k)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    plots.line_plot(batch_sizes, {"ours": [rate_b[B] for B in batch_sizes]}, xlabel="batch size B", logx=True,
                    ylabel="success rate (PSNR ≥ 20 dB)", title="larger batches hide the images", ax=axes[0],
                    styles={"ours": {"marker": "o"}})
    axes[0].plot([1, 16], [WEI_RATES["batch size 1"], WEI_RATES["batch size 16"]], "s--", color=plots.PALETTE[1],
                 label="Wei et al. (B = 1, 16)")
    plots.line_plot(local_steps, {"ours": [rate_k[K] for K in local_steps]}, xlabel="local steps K",
                    title="so do local steps", ax=axes[1], styles={"ours": {"marker": "o"}})
    axes[1].plot([1, 9], [WEI_RATES["local steps 1"], WEI_RATES["local steps 9"]], "s--", color=plots.PALETTE[1],
                 label="Wei et al. (K = 1, 9)")
    for ax in axes:
        ax.legend(); ax.set_ylim(-0.05, 1.05)
    return fig


def wei_table(rate_b: Mapping[int, float], rate_k: Mapping[int, float], run, *, scale: str,
              num_images: int | None = None):
    """Markdown table: Wei et al.'s success rates (:data:`WEI_RATES`) beside ours at B = 1, 16 and
    K = 1, 9 (this ``scale``'s run) and the stored paper-scale record of ``run``. With ``num_images``
    (the images per cell asked of :func:`success_by_batch_size`; every local-steps cell attacks that
    many), two more columns: the images of the cell and the exact (Clopper-Pearson) 95 % interval of
    this run's rate over them. Raises ``ValueError`` if ``rate_b`` lacks B = 1 or 16, or ``rate_k``
    lacks K = 1 or 9."""
    if 1 not in rate_b or 16 not in rate_b:
        raise ValueError(f"rate_b must hold batch sizes 1 and 16, got {sorted(rate_b)}")
    if 1 not in rate_k or 9 not in rate_k:
        raise ValueError(f"rate_k must hold local steps 1 and 9, got {sorted(rate_k)}")
    ours = {"batch size 1": rate_b[1], "batch size 16": rate_b[16], "local steps 1": rate_k[1], "local steps 9": rate_k[9]}
    names = {"batch size 1": "rate_b1", "batch size 16": "rate_b16", "local steps 1": "rate_k1", "local steps 9": "rate_k9"}
    head = ["setting", "paper", f"ours ({scale} run)", "ours, paper scale (mean ± 95 % CI)"]
    extra = {k: [] for k in WEI_RATES}
    if num_images is not None:
        cells = {"batch size 1": images_per_cell(num_images, 1), "batch size 16": images_per_cell(num_images, 16),
                 "local steps 1": int(num_images), "local steps 9": int(num_images)}
        for k, m in cells.items():
            lo, hi = clopper_pearson(int(round(ours[k] * m)), m, 0.95)
            extra[k] = [f"{m}", f"[{float(lo):.2f}, {float(hi):.2f}]"]
        head += ["images in the cell", "95 % interval of this run (Clopper-Pearson)"]
    return plots.md_table(head, [[k, f"{WEI_RATES[k]:.2f}", f"{ours[k]:.2f}",
                                  f"{run.stored(names[k], 2, value_range=(0, 1))}", *extra[k]] for k in WEI_RATES])


# --- 1a Sec. 6, 1b Sec. 1: noise and pruning (Zhu et al. 2019, Sec. 5) ------------------------------

def noise_grid(model, params: dict, X: torch.Tensor, y: torch.Tensor, *, sigmas: Sequence[float],
               batch_sizes: Sequence[int], max_iter: int, steps: int | None = None, seed: int = 0) -> dict:
    """DLG against gradients with Gaussian noise of standard deviation ``sigma`` on every coordinate
    (Zhu et al. 2019, Sec. 5; :func:`fedlab.privacy.gaussian_noise`), for every batch size (outer) and
    ``sigma`` (inner), all noise drawn in that order from one ``torch.Generator`` seeded with ``seed``.

    Returns ``{B: {sigma: {"psnr", "x"}}}`` (see :func:`fedlab.attacks.gradient_inversion.attack_grid`).
    Raises ``ValueError`` if a ``sigma`` is negative or a batch size is not a positive integer."""
    if any(not s >= 0 for s in sigmas):
        raise ValueError(f"sigmas must be >= 0, got {list(sigmas)}")
    for B in batch_sizes:
        positive_int("batch_sizes", B)
    noise_gen = torch.Generator().manual_seed(seed)
    budget = gi.AttackBudget(max_iter=max_iter, lr=1.0, steps=steps)
    return {B: gi.attack_grid(model, params, X, y, num_classes=10, batch_size=B, budget=budget, seed=seed,
                              settings={s: {"defense": (lambda u, s=s: privacy.gaussian_noise(u, s, generator=noise_gen))}
                                        for s in sigmas})
            for B in batch_sizes}


def plot_reconstruction(result: Mapping, X: torch.Tensor, *, image: int, batch_size: int, sigma: float):
    """One private image ``X[image]`` beside its closest reconstruction in ``result`` (one setting of
    :func:`noise_grid` at ``batch_size``). Returns the figure. Raises ``ValueError`` if ``image`` is
    out of range."""
    if not 0 <= image < len(result["psnr"]):
        raise ValueError(f"image must lie in [0, {len(result['psnr'])}), got {image}")
    a = image // batch_size
    x_rec = result["x"][a]
    best = int(np.argmin([metrics.mse(r, X[image]) for r in x_rec]))      # the dummy matched to this image
    return plots.image_grid(torch.stack([X[image], x_rec[best]]), titles=["private", f"{result['psnr'][image]:.1f} dB"],
                            ncols=2, size=2.0, suptitle=f"B = {batch_size}, σ = {sigma:g}")


def plot_noise_grid(noisy: Mapping, X: torch.Tensor):
    """The whole :func:`noise_grid` on the images ``X [n, C, H, W]`` attacked there: first row the private
    images, then one row per (B, sigma) with each image's closest reconstruction. Returns the figure."""
    n = len(X)
    tiles, titles = [], []
    for B, by_sigma in noisy.items():
        for s, res in by_sigma.items():
            x_rec = res["x"].reshape(-1, *X.shape[1:])   # [A * B, C, H, W]
            for i in range(n):
                best = int(np.argmin([metrics.mse(r, X[i]) for r in x_rec[(i // B) * B:(i // B + 1) * B]]))
                tiles.append(x_rec[(i // B) * B + best]); titles.append(f"B={B} σ={s:g}")
    return plots.image_grid(torch.cat([X] + [torch.stack(tiles)]), ncols=n, size=1.2, titles=["private"] * n + titles,
                            suptitle="static view of the widget: rows = (B, σ), columns = images")


def pruning_grid(model, params: dict, X: torch.Tensor, y: torch.Tensor, *, fractions: Sequence[float],
                 max_iter: int, steps: int | None = None, seed: int = 0, knows_mask: bool = False) -> dict:
    """DLG against pruned gradients (Zhu et al. 2019, Sec. 5; :func:`fedlab.privacy.prune_by_magnitude`
    zeroes the ``p`` smallest fraction of coordinates), one image per client, every ``p`` of
    ``fractions`` in one stacked attack. ``knows_mask=False`` (default): Zhu et al.'s DLG, which matches
    every coordinate, the withheld zeros included; ``True``: the attacker who knows the defense (the zeros
    are visible in the update) and matches only the coordinates that were sent
    (:func:`fedlab.attacks.gradient_inversion.attack_grid`'s ``knows_mask``). Returns ``{p: {"psnr", "x",
    "final_loss"}}`` (the loss reached); with ``knows_mask`` also ``"matching_loss"`` and ``"matching_loss_truth"``
    ``[n]``: :func:`fedlab.attacks.gradient_inversion.matching_loss` over the sent coordinates (normalised by the
    sent update's norm, with the true labels) at the reconstruction and at the true image (0 up to rounding), the
    check that the attack reached its optimum. Raises ``ValueError`` if a fraction is outside ``[0, 1)``."""
    bad = [p for p in fractions if not 0 <= p < 1]
    if bad:
        raise ValueError(f"fractions must lie in [0, 1), got {bad}")
    if not isinstance(knows_mask, bool):
        raise ValueError(f"knows_mask must be True or False, got {knows_mask!r}")
    out = gi.attack_grid(model, params, X, y, num_classes=10, budget=gi.AttackBudget(max_iter=max_iter, lr=1.0, steps=steps),
                         seed=seed, settings={p: {"defense": (lambda u, p=p: privacy.prune_by_magnitude(u, p)),
                                       **({"knows_mask": True} if knows_mask else {})} for p in fractions})
    if knows_mask:       # did it reach its optimum? the normalised masked matching loss, reached and at the truth
        labels = y[:len(X)].reshape(-1, 1)
        grads = gi.per_example_gradients(model, params, X, y)
        for p in fractions:
            obs = prune_rows(grads, p)                       # prune_by_magnitude per image, vectorised
            mask = {k: v != 0 for k, v in obs.items()}
            out[p]["matching_loss"] = gi.matching_loss(model, params, out[p]["x"], labels, obs, mask=mask).numpy()
            out[p]["matching_loss_truth"] = gi.matching_loss(model, params, X[:, None], labels, obs, mask=mask).numpy()
    return out


def defense_costs(grads: Mapping, *, num_clients: int, sigmas: Sequence[float], fractions: Sequence[float],
                  seed: int = 0) -> tuple[dict, dict]:
    """The price of the defenses (Zhu et al. 2019, Sec. 5): the relative error ``||g~ - g|| / ||g||`` of
    the sent update, averaged over the first ``num_clients`` one-image gradients of ``grads`` (stacked,
    ``{name: [N, ...]}``), for Gaussian noise of every ``sigma`` (noise from one ``torch.Generator``
    seeded with ``seed``) and pruning of every fraction.

    Returns ``(cost_sigma, cost_prune)``: ``{sigma: error}``, ``{fraction: error}``. Raises
    ``ValueError`` if ``num_clients`` is not a positive integer or exceeds the clients of ``grads``."""
    num_clients = positive_int("num_clients", num_clients)
    n = len(next(iter(grads.values())))
    if num_clients > n:
        raise ValueError(f"num_clients ({num_clients}) exceeds the {n} gradients in grads")
    g4 = [{k: v[i] for k, v in grads.items()} for i in range(num_clients)]

    def rel_error(defense):
        # defense(g) runs once per tensor name, as the chapter's cell did: the noise draws depend on it
        return float(np.mean([privacy.global_norm({k: defense(g)[k] - g[k] for k in g}) / privacy.global_norm(g)
                              for g in g4]))

    gen_cost = torch.Generator().manual_seed(seed)
    cost_sigma = {s: rel_error(lambda g, s=s: privacy.gaussian_noise(g, s, generator=gen_cost)) for s in sigmas}
    cost_prune = {p: rel_error(lambda g, p=p: privacy.prune_by_magnitude(g, p)) for p in fractions}
    return cost_sigma, cost_prune


def mean_psnr(grid: Mapping) -> dict:
    """``{setting: mean PSNR}`` of an :func:`~fedlab.attacks.gradient_inversion.attack_grid` result."""
    return {k: float(r["psnr"].mean()) for k, r in grid.items()}


def plot_defenses(psnr_sigma: Mapping, cost_sigma: Mapping, psnr_prune: Mapping, cost_prune: Mapping, *,
                  success_db: float, baselines: Mapping[str, float] | None = None,
                  psnr_prune_aware: Mapping | None = None):
    """Attack PSNR (left axis) and relative error of the update (right axis) against the noise level
    and against the pruned fraction (sigma = 0 drawn at 1e-4 on the log axis), with ``baselines``
    (``{name: PSNR}`` of reconstructions that use no gradient) dashed. ``psnr_prune_aware`` (optional,
    ``{p: PSNR}`` over some of ``psnr_prune``'s fractions): the attacker who knows the pruning mask, a
    second curve on the pruning panel. Returns the figure. Raises ``ValueError`` if a PSNR curve and its
    cost curve have different keys, or ``psnr_prune_aware`` has a fraction ``psnr_prune`` lacks."""
    if list(psnr_sigma) != list(cost_sigma) or list(psnr_prune) != list(cost_prune):
        raise ValueError("psnr and cost curves must have the same keys in the same order")
    if psnr_prune_aware is not None and set(psnr_prune_aware) - set(psnr_prune):
        raise ValueError(f"psnr_prune_aware has fractions psnr_prune lacks: {sorted(set(psnr_prune_aware) - set(psnr_prune))}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    plots.line_plot([max(s, 1e-4) for s in psnr_sigma], {"attack PSNR (dB)": list(psnr_sigma.values())}, logx=True,
                    xlabel="noise σ (σ = 0 drawn at 1e-4)", ylabel="PSNR (dB)", title="Gaussian noise", ax=axes[0])
    plots.line_plot(list(psnr_prune), {"attack PSNR (dB)": list(psnr_prune.values())}, xlabel="pruned fraction p",
                    title="gradient pruning", ax=axes[1])
    if psnr_prune_aware is not None:
        axes[1].plot(list(psnr_prune_aware), list(psnr_prune_aware.values()), "^-", color=plots.PALETTE[7],
                     label="attack PSNR, DLG that knows the mask (dB)")
    for ax, cost in zip(axes, [cost_sigma, cost_prune]):
        ax.axhline(success_db, color="gray", ls=":")
        for i, (name, v) in enumerate((baselines or {}).items()):
            ax.axhline(v, color=plots.PALETTE[(i + 2) % len(plots.PALETTE)], ls="--", label=f"{name} (no attack)")
        if baselines or (ax is axes[1] and psnr_prune_aware is not None):   # below the panel: it covered the curves
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        tw = ax.twinx(); tw.plot(ax.lines[0].get_xdata(), list(cost.values()), "s--", color=plots.PALETTE[1])
        tw.set_ylabel("relative error of the update", color=plots.PALETTE[1]); tw.grid(False)
    return fig


# --- 1b Sec. 2: a malicious server against secure aggregation (Fowl et al. 2022) ----------------------

def imprint_demo(X: torch.Tensor, *, num_clients: int, batch_size: int, num_bins: int, seed: int = 0) -> dict:
    """Robbing the Fed (Fowl et al. 2022, Sec. 3) under secure aggregation: ``num_clients`` clients each
    hold ``batch_size`` images drawn without replacement from ``X [N, C, H, W]`` (``numpy`` generator
    ``seed``), compute the gradient of the imprinted model (a random unit measurement direction, the
    server's Gaussian model of ``h(x)`` fitted on the pool ``X``: known data statistics), and the server
    sees only their *sum* (:func:`fedlab.attacks.imprint.imprint_attack` with a list of batches).

    Returns ``{"X": true images [n, C, H, W], "X_hat": the nearest recovered vector of each as an image
    (zeros where nothing was recovered), "recovered": bool [n], "error": relative error [n], "rate",
    "expected": (k / (k + 1))^n, "alone": the number of inputs alone in their bin above ``c_1`` (from the
    true inputs' measurements and the cut-offs, not from the gradient: the inputs the attack must recover
    exactly)}`` with ``n = num_clients * batch_size``. Raises ``ValueError`` if the pool
    holds fewer than ``n`` images or an argument is not a positive integer."""
    num_clients, batch_size = positive_int("num_clients", num_clients), positive_int("batch_size", batch_size)
    num_bins = positive_int("num_bins", num_bins)
    n = num_clients * batch_size
    if n > len(X):
        raise ValueError(f"X holds {len(X)} images, {num_clients} clients x {batch_size} need {n}")
    flat = X.reshape(len(X), -1).double()
    w = imp.imprint_layer(flat.shape[1], 1, mean=0.0, std=1.0, direction="random", seed=seed)[0][0]   # the direction
    h = flat @ w
    idx = torch.as_tensor(np.random.default_rng(seed).choice(len(X), size=n, replace=False))
    batches = list(flat[idx].reshape(num_clients, batch_size, -1))
    res = imp.imprint_attack(batches, trap=imp.ImprintTrap(num_bins=num_bins, mean=float(h.mean()), std=float(h.std()),
                                                           direction=w), seed=seed)
    Xt = flat[idx]
    if len(res.x):
        nearest = torch.cdist(Xt, res.x.double()).argmin(1)
        X_hat = torch.where(res.recovered[:, None], res.x.double()[nearest], torch.zeros_like(Xt))
    else:
        X_hat = torch.zeros_like(Xt)
    return {"X": X[idx], "X_hat": X_hat.reshape(X[idx].shape).float(), "recovered": res.recovered,
            "error": res.error, "rate": res.rate, "expected": imp.expected_recovery_rate(n, num_bins),
            "alone": int(res.unique.sum())}


def plot_imprint(demo: Mapping, *, show: int = 16):
    """The first ``show`` private images of :func:`imprint_demo` above what the server read off the
    aggregated gradient (blank where the image shared its bin). Returns the figure."""
    show = min(positive_int("show", show), len(demo["X"]))
    titles = ["private"] * show + ["exact" if r else "mixed" for r in demo["recovered"][:show].tolist()]
    return plots.image_grid(torch.cat([demo["X"][:show], demo["X_hat"][:show].clamp(0, 1)]), ncols=show, size=0.9,
                            titles=titles, suptitle="Robbing the Fed: inputs read off the SUM of the clients' gradients")


def plot_imprint_grid(grid: np.ndarray, batch_sizes: Sequence[int], bins: Sequence[int]):
    """Measured recovery rate (:func:`fedlab.attacks.imprint.imprint_recovery_grid`, ``[len(batch_sizes),
    len(bins)]``) against the batch size, one curve per number of bins, with the expected rate
    ``(k / (k + 1))^B`` dashed. Returns the axes. Raises ``ValueError`` on a shape mismatch."""
    grid = np.asarray(grid)
    if grid.shape != (len(batch_sizes), len(bins)):
        raise ValueError(f"grid must have shape {(len(batch_sizes), len(bins))}, got {grid.shape}")
    _, ax = plt.subplots(figsize=(6, 3.8))
    Bs = np.geomspace(min(batch_sizes), max(batch_sizes), 50)
    for j, k in enumerate(bins):
        c = plots.PALETTE[j % len(plots.PALETTE)]
        ax.plot(batch_sizes, grid[:, j], "o-", color=c, label=f"{k} bins, measured")
        ax.plot(Bs, imp.expected_recovery_rate(Bs, k), "--", color=c, alpha=0.7, label=f"{k} bins, (k/(k+1))^B")
    ax.set_xscale("log"); ax.set_xlabel("images in the aggregate B"); ax.set_ylabel("share recovered exactly")
    ax.set_ylim(-0.05, 1.05); ax.legend(fontsize=8); ax.set_title("more bins than images: nearly everything leaks")
    return ax


def imprint_table(grid: np.ndarray, batch_sizes: Sequence[int], bins: Sequence[int], *, trials: int):
    """Markdown table of the measured recovery rate (``grid`` of
    :func:`fedlab.attacks.imprint.imprint_recovery_grid` over ``trials`` batches) beside the expected
    ``(k / (k + 1))^B``, rows = batch sizes, columns = numbers of bins."""
    grid = np.asarray(grid)
    if grid.shape != (len(batch_sizes), len(bins)):
        raise ValueError(f"grid must have shape {(len(batch_sizes), len(bins))}, got {grid.shape}")
    rows = [[f"{B}", *(f"{grid[i, j]:.2f} / {imp.expected_recovery_rate(B, k):.2f}" for j, k in enumerate(bins))]
            for i, B in enumerate(batch_sizes)]
    table = plots.md_table(["images B", *(f"{k} bins: measured / expected" for k in bins)], rows)
    return plots.MarkdownText(f"{table}\n\n(measured: mean over {trials} random batches)")
