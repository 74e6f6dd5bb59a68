"""Chapter 5's experiments (Galli et al. 2022, personalized FL with d-privacy): the RMSE of Eq. 15
for flat parameter vectors, as the chapter measures the utility cost of the Euclidean Laplace noise
against Proposition 3.2's bound (:func:`fedlab.privacy.dprivacy.rmse_increase_bound`); the checks of
Proposition 3.1's sampler; the seeds of private IFCA (Algorithm 1) on the synthetic task; the rotated
digits grid behind Tables 1-2; the sanitised update DLG attacks (Sec. 4.3); and the tables and figures
the chapter shows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.func import functional_call, vmap

from .._checks import positive_int
from ..fl import ifca as IF
from ..models import flatten_params, get_params, logistic_regression, num_params, unflatten_params
from ..privacy import dprivacy as dp

__all__ = ["rmse", "dist_to_optima", "private_ifca_runs", "private_distances", "convergence_counts",
           "convergence_markdown", "plot_released",
           "server_view_panel", "LAPLACE_SETTINGS", "laplace_sampler_checks", "laplace_checks_markdown",
           "plot_laplace_samples", "loss_increase_draws", "plot_loss_increase", "logistic_hypotheses",
           "digits_grid", "PAPER_TABLE2", "table2_name", "table2_values", "table2_markdown", "budget_markdown",
           "sanitised_gradient", "plot_dlg_reconstructions", "plot_dlg_psnr", "dlg_markdown",
           "guarantee_gaps"]


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


# --------------------------------------------------------------------------------------------------
# IFCA and private IFCA on the synthetic task (Galli et al., Sec. 4.1)
def dist_to_optima(theta: torch.Tensor, optima: torch.Tensor) -> np.ndarray:
    """For each optimum ``theta_j*`` (rows of ``optima`` ``[k*, n]``), the Euclidean distance to its
    nearest hypothesis among the rows of ``theta`` ``[k, n]``: the measure of Galli et al.'s Sec. 4.1
    experiment of how well (private) IFCA finds the clusters' models. Returns ``[k*]``. Raises
    ``ValueError`` if the two do not have the same number of columns."""
    theta, optima = torch.as_tensor(theta), torch.as_tensor(optima)
    if theta.ndim != 2 or optima.ndim != 2 or theta.shape[1] != optima.shape[1]:
        raise ValueError(f"theta [k, n] and optima [k*, n] must share n, got shapes {tuple(theta.shape)} "
                         f"and {tuple(optima.shape)}")
    return torch.cdist(theta, optima).min(0).values.numpy()


def private_ifca_runs(model, clients, seeds: Sequence[int], *, nu: float, num_clusters: int = 2,
                      **kwargs) -> dict:
    """Galli et al. (2022), Algorithm 1 (:func:`fedlab.fl.ifca.private_ifca`) once per seed ``s`` of
    ``seeds``, each started from ``num_clusters`` hypotheses drawn N(0, 1) from
    ``torch.Generator().manual_seed(s)`` and run with ``seed=s``; ``kwargs`` go to ``private_ifca``.
    Returns ``{s: IFCAResult}``. Raises ``ValueError`` for an empty ``seeds``."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    n = num_params(model)
    out = {}
    for s in seeds:
        init_s = torch.randn(num_clusters, n, generator=torch.Generator().manual_seed(s))
        out[s] = IF.private_ifca(model, clients, num_clusters=num_clusters, nu=nu, init=init_s, seed=s, **kwargs)
    return out


def private_distances(runs: dict, optima: torch.Tensor, *, patience: int = 6) -> tuple[dict, dict]:
    """The largest distance between an optimum and its nearest hypothesis (:func:`dist_to_optima`) of
    each run of :func:`private_ifca_runs`: at the end of the run, and at the round the early-stopping
    rule with ``patience`` (the paper's 6 rounds, Sec. 4.1) would have kept, replayed on the run's
    validation curve. Returns ``({seed: final}, {seed: at patience})``. Raises ``ValueError`` for
    ``patience < 1``."""
    positive_int("patience", patience)
    dist_long = {s: dist_to_optima(r.hypotheses, optima).max() for s, r in runs.items()}
    dist_short = {}
    for s, r in runs.items():
        best, _ = IF.early_stop_round(r.history["val_loss"], patience=patience)
        dist_short[s] = dist_to_optima(r.rounds[best - 1].hypotheses if best > 0 else r.rounds[0].hypotheses,
                                       optima).max()
    return dist_long, dist_short


def convergence_counts(distances: dict, *, threshold: float = 0.5, level: float = 0.95) -> dict:
    """How many seeds of Galli et al.'s Sec. 4.1 experiment end with every optimum within ``threshold``
    of a hypothesis: for each named entry of ``distances`` (``{name: {seed: distance}}``, e.g. the two
    outputs of :func:`private_distances` as ``{"patience 30": long, "patience 6": short}``), the
    count, the number of seeds, the fraction and its exact (Clopper-Pearson) interval at ``level``
    (:func:`fedlab.privacy.dprivacy.clopper_pearson`). Returns ``{name: {"success", "seeds",
    "fraction", "interval"}}``. Raises ``ValueError`` for an empty ``distances`` or entry, a
    ``threshold <= 0`` or a ``level`` outside (0, 1)."""
    from .._checks import in_range

    if not distances:
        raise ValueError("distances must name at least one set of runs")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    in_range("level", level, 0, 1)
    out = {}
    for name, d in distances.items():
        if not d:
            raise ValueError(f"distances[{name!r}] holds no seed")
        k, m = int(sum(float(v) < threshold for v in d.values())), len(d)
        lo, hi = dp.clopper_pearson(k, m, level)
        out[name] = {"success": k, "seeds": m, "fraction": k / m, "interval": (float(lo), float(hi))}
    return out


def convergence_markdown(counts: dict, *, threshold: float = 0.5) -> str:
    """:func:`convergence_counts`' output as a Markdown table: one row per name, the seeds within
    ``threshold`` of both optima and the 95 % interval of that fraction."""
    if not counts:
        raise ValueError("counts must hold at least one row")
    lines = [f"| early stopping | seeds within {threshold:g} of both θ* | fraction | 95 % interval |",
             "|---|---|---|---|"]
    for name, c in counts.items():
        lo, hi = c["interval"]
        lines.append(f"| {name} | {c['success']} / {c['seeds']} | {c['fraction']:.2f} | [{lo:.2f}, {hi:.2f}] |")
    return "\n".join(lines)


def plot_released(rows: dict, optima: torch.Tensor):
    """Galli et al. (2022), Fig. 1: for each named run of ``rows`` (``{name: IFCAResult}``, one figure
    row each) the vectors released to the server in the first five and the last five rounds, coloured
    by cluster, with the optima and the hypotheses, and the validation RMSE per round. Returns the
    axes ``[len(rows), 3]``."""
    import matplotlib.pyplot as plt

    from .. import plots

    _, axes = plt.subplots(len(rows), 3, figsize=(13, 11 * len(rows) / 3), squeeze=False)
    for ax_row, (name, r) in zip(axes, rows.items()):
        for ax, part, title in [(ax_row[0], r.rounds[:5], "rounds 1–5"), (ax_row[1], r.rounds[-5:], "last 5 rounds")]:
            pts = torch.cat([rd.released for rd in part]).numpy()
            lab = np.concatenate([rd.labels for rd in part])
            ax.scatter(pts[:, 0], pts[:, 1], c=[plots.PALETTE[int(l)] for l in lab], s=18, alpha=0.7)
            ax.scatter(*optima.numpy().T, marker="*", s=250, c="k", label="θ*")
            ax.scatter(*part[-1].hypotheses.numpy().T, marker="X", s=120, c="red", label="hypotheses")
            ax.set(title=f"{name}: released, {title}", xlabel="θ[0]", ylabel="θ[1]", xlim=(-3, 9), ylim=(-9, 10))
        ax_row[2].plot(r.history["round"], r.history["val_rmse"])
        ax_row[2].axvline(r.best_round, ls=":", c="k")
        ax_row[2].set(title=f"{name}: validation RMSE", xlabel="round", ylabel="RMSE")
    axes[0, 0].legend(loc="lower left")
    return axes


def server_view_panel(model, hypotheses: torch.Tensor, clients, membership, optima: torch.Tensor, *,
                      nu: float, num_clusters: int, ax, seed: int = 0) -> float:
    """What the server of Galli et al.'s Algorithm 1 sees in one round (:func:`fedlab.fl.ifca.server_view`
    with noise multiplier ``nu``, ``0`` for none, and k-means with ``num_clusters`` clusters), drawn
    on ``ax``: released vectors coloured by the server's cluster, marked by the true group
    ``membership`` ``[K]`` (0/1), and the ``optima``. Returns the agreement of the clusters with the
    true groups (up to swapping the labels; ``nan`` unless ``num_clusters == 2``). Raises
    ``ValueError`` for ``nu < 0``."""
    from .. import plots

    if nu < 0:
        raise ValueError(f"nu must be >= 0 (0: no noise), got {nu}")
    v = IF.server_view(model, hypotheses, clients, nu=nu or None, num_clusters=num_clusters,
                       loss_fn=IF.squared_error, seed=seed)
    pts = v["released"].numpy()
    for grp, marker in [(0, "o"), (1, "^")]:
        m = membership == grp
        ax.scatter(pts[m, 0], pts[m, 1], c=[plots.PALETTE[int(l)] for l in v["labels"][m]], marker=marker,
                   s=20, alpha=0.7)
    ax.scatter(*optima.numpy().T, marker="*", s=250, c="k")
    purity = (max(np.mean(v["labels"] == membership), np.mean(v["labels"] == 1 - membership))
              if num_clusters == 2 else np.nan)
    ax.set(title=f"ν={nu:g}, k={num_clusters}" + ("" if np.isnan(purity) else f", agreement {purity:.2f}"),
           xlabel="θ[0]", ylabel="θ[1]")
    return purity


# --------------------------------------------------------------------------------------------------
# the Euclidean Laplace mechanism (Galli et al., Prop. 3.1) and its cost (Prop. 3.2)
#: (n, epsilon) settings the chapter checks the sampler at
LAPLACE_SETTINGS = ((2, 1.0), (5, 2.0), (20, 0.5))


def laplace_sampler_checks(settings: Sequence[tuple] = LAPLACE_SETTINGS, *, num_draws: int = 100_000,
                           seed: int = 0) -> dict:
    """Galli et al. (2022), Proposition 3.1, tested on ``num_draws`` draws of
    :func:`fedlab.privacy.dprivacy.sample_euclidean_laplace` (float64, ``rng=seed``) for each ``(n, eps)``
    of ``settings``: the KS p-value of the radius against Gamma(n, eps), the mean radius over
    ``n / eps``, the mean component variance over ``(n + 1) / eps^2``, the KS p-value of ``(u_1 + 1) / 2``
    (``u`` the unit direction) against Beta((n - 1)/2, (n - 1)/2), and the largest absolute mean
    direction coordinate. Returns ``{(n, eps): {statistic: value}}``. Raises ``ValueError`` for
    ``num_draws < 2``."""
    from scipy import stats

    if num_draws < 2:
        raise ValueError(f"num_draws must be >= 2, got {num_draws}")
    checks = {}
    for n, eps in settings:
        rho = dp.sample_euclidean_laplace(n, eps, num_draws, rng=seed, dtype=torch.float64).numpy()
        r = np.linalg.norm(rho, axis=1)
        u = rho / r[:, None]
        checks[(n, eps)] = {
            "KS p (radius ~ Gamma)": stats.kstest(r, dp.radius_distribution(n, eps).cdf).pvalue,
            "mean radius / (n/eps)": r.mean() / dp.expected_radius(n, eps),
            "component var / ((n+1)/eps^2)": rho.var(axis=0).mean() / dp.component_variance(n, eps),
            "KS p (u_1 ~ Beta law)": stats.kstest((u[:, 0] + 1) / 2, stats.beta((n - 1) / 2, (n - 1) / 2).cdf).pvalue,
            "max abs(mean direction)": np.abs(u.mean(axis=0)).max(),
        }
    return checks


def laplace_checks_markdown(checks: dict) -> str:
    """:func:`laplace_sampler_checks`' output as a Markdown table, one column per ``(n, eps)``."""
    if not checks:
        raise ValueError("checks must hold at least one setting")
    settings = list(checks)
    rows = "\n".join(f"| {k} | " + " | ".join(f"{checks[c][k]:.3f}" for c in settings) + " |"
                     for k in checks[settings[0]])
    return ("| statistic | " + " | ".join(f"n={n}, ε={e}" for n, e in settings) + " |\n|---"
            + "|---" * len(settings) + "|\n" + rows)


def plot_laplace_samples(settings: Sequence[tuple] = LAPLACE_SETTINGS, *, seed: int = 0):
    """Galli et al. (2022), Proposition 3.1 drawn: the radius histogram of 20,000 draws
    (``rng=seed + 1``) against the Gamma(n, eps) density for each ``(n, eps)`` of ``settings``, a cloud
    of 3000 draws in the plane (``rng=seed + 2``) and the histogram of 50,000 direction angles
    (``rng=seed + 3``) against the uniform density. Returns the three axes."""
    import matplotlib.pyplot as plt

    from .. import plots

    _, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for (n, eps), color in zip(settings, plots.PALETTE):
        r = np.linalg.norm(dp.sample_euclidean_laplace(n, eps, 20_000, rng=seed + 1, dtype=torch.float64).numpy(), axis=1)
        grid = np.linspace(0, np.quantile(r, 0.995), 200)
        axes[0].hist(r / (n / eps), bins=60, density=True, alpha=0.35, color=color)
        axes[0].plot(grid / (n / eps), dp.radius_distribution(n, eps).pdf(grid) * n / eps, color=color,
                     label=f"n={n}, ε={eps}")
    axes[0].set(xlabel="‖ρ‖ / (n/ε)", ylabel="density", title="radius vs Gamma(n, ε)", xlim=(0, 4))
    axes[0].legend()
    pts = dp.sample_euclidean_laplace(2, 1.0, 3000, rng=seed + 2).numpy()
    axes[1].scatter(pts[:, 0], pts[:, 1], s=3, alpha=0.4)
    axes[1].set_aspect("equal")
    axes[1].set(title="3000 draws, n=2, ε=1", xlabel="ρ₁", ylabel="ρ₂")
    ang = np.arctan2(*dp.sample_euclidean_laplace(2, 1.0, 50_000, rng=seed + 3).numpy().T[::-1])
    axes[2].hist(ang, bins=36, density=True, alpha=0.6)
    axes[2].axhline(1 / (2 * np.pi), color="k", ls="--", label="uniform")
    axes[2].set(title="direction angle (n=2)", xlabel="angle (rad)")
    axes[2].legend()
    return axes


def loss_increase_draws(model, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor,
                        epsilons: Sequence[float], *, num_draws: int = 2000, seed: int = 0) -> dict:
    """Galli et al. (2022), Proposition 3.2 measured: ``num_draws`` Euclidean Laplace draws ``rho`` per
    ``epsilons[i]`` (``rng=seed + i``), the RMSE increase (Eq. 15, :func:`rmse`) they cause at the flat
    parameters ``theta`` ``[n]`` of ``model``, their norms, and the first-order constant
    :func:`fedlab.privacy.dprivacy.rmse_increase_bound`. Returns ``{"increase", "norm", "ratio"
    (increase / (bound * norm)), each [len(epsilons) * num_draws], "bound": float}``. Raises
    ``ValueError`` for an empty ``epsilons`` or ``num_draws < 1``."""
    if len(epsilons) == 0:
        raise ValueError("epsilons must hold at least one value")
    positive_int("num_draws", num_draws)
    bound = dp.rmse_increase_bound(model, theta, X)
    rho = torch.cat([dp.sample_euclidean_laplace(theta.numel(), e, num_draws, rng=seed + i)
                     for i, e in enumerate(epsilons)])
    inc = (rmse(model, theta + rho, X, y) - rmse(model, theta, X, y)).numpy()
    norm = torch.linalg.vector_norm(rho, dim=1).numpy()
    return {"increase": inc, "norm": norm, "ratio": inc / (bound * norm), "bound": bound}


def plot_loss_increase(panels: dict):
    """Proposition 3.2 drawn: for each named output of :func:`loss_increase_draws` in ``panels``, the
    measured RMSE increase against ``||rho||`` and the bound line. Returns the axes."""
    import matplotlib.pyplot as plt

    _, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (title, p) in zip(axes[0], panels.items()):
        ax.scatter(p["norm"], p["increase"], s=4, alpha=0.3, label="measured")
        grid = np.linspace(0, p["norm"].max(), 50)
        ax.plot(grid, p["bound"] * grid, "k--", label="bound ‖J‖‖ρ‖/√|Z|")
        ax.set(xlabel="‖ρ‖", ylabel="RMSE increase", title=title)
        ax.legend()
    return axes[0]


# --------------------------------------------------------------------------------------------------
# rotated digits (the offline stand-in for Galli et al.'s FEMNIST, Sec. 4.3)
def logistic_hypotheses(k: int, *, num_features: int = 64, num_classes: int = 10, seed: int = 0) -> torch.Tensor:
    """``k`` initial IFCA hypotheses ``[k, n]``: the flat parameters of
    :func:`fedlab.models.logistic_regression` initialised with seeds ``seed, ..., seed + k - 1``.
    Raises ``ValueError`` for ``k < 1``."""
    k = positive_int("k", k)
    return torch.stack([flatten_params(get_params(logistic_regression(num_features, num_classes, seed=seed + j)))
                        for j in range(k)])


def digits_grid(model, train_clients, val_clients, *, ks: Sequence[int], nus: Sequence[float],
                num_rounds: int, clients_per_round: int = 10, lr: float = 0.5, batch_size: int = 10,
                seed: int = 0) -> dict:
    """The question of Galli et al.'s Fig. 3 and Tables 1-2 on the rotated digits: (private) IFCA
    (:func:`fedlab.fl.ifca.ifca`) for every number of hypotheses ``k`` of ``ks`` and noise multiplier
    ``nu`` of ``nus`` (``0``: no sanitisation and the clients' argmin assignment; otherwise
    SanitizeUpdate and the server's k-means, :func:`fedlab.fl.ifca.kmeans_clusters`), started from
    :func:`logistic_hypotheses` ``(k, seed=seed)``. Returns ``{(k, nu): IFCAResult}``, run in the order
    of ``ks`` then ``nus``. Raises ``ValueError`` for an empty ``ks`` or ``nus`` or a negative ``nu``."""
    if not ks or not nus:
        raise ValueError("ks and nus must each hold at least one value")
    if min(nus) < 0:
        raise ValueError(f"every nu must be >= 0 (0: no noise), got {list(nus)}")
    grid = {}
    for k in ks:
        for nu in nus:
            grid[(k, nu)] = IF.ifca(model, train_clients, num_clusters=k, init=logistic_hypotheses(k, seed=seed),
                                    num_rounds=num_rounds, clients_per_round=clients_per_round, lr=lr,
                                    batch_size=batch_size, nu=nu or None,
                                    clustering="kmeans" if nu else "argmin",
                                    val_clients=val_clients, seed=seed)
    return grid


#: Galli et al. (2022), Table 2 (cross-entropy column): FEMNIST validation accuracy vs noise multiplier
PAPER_TABLE2 = {0: 0.832, 1e-3: 0.843, 1e-2: 0.832, 0.1: 0.834, 1: 0.834, 3: 0.835, 5: 0.812, 10: 0.692, 15: 0.561}


def table2_name(what: str, nu: float) -> str:
    """The glued name of a Table 2 number: ``ch5_t2_{what}_nu{nu}`` with ``.`` written ``p``
    (``table2_name("acc", 0.1) == "ch5_t2_acc_nu0p1"``)."""
    return f"ch5_t2_{what}_nu" + f"{nu:g}".replace(".", "p")


def table2_values(acc: dict, nus: Sequence[float], k: int) -> dict:
    """Our Table 2 numbers at ``k`` hypotheses: for each ``nu`` of ``nus`` the validation accuracy
    ``acc[(k, nu)]`` (``table2_name("acc", nu)``) and its ratio to the accuracy without noise
    (``table2_name("rel", nu)``), unrounded, in that order. Raises ``ValueError`` if ``acc`` lacks
    ``(k, 0)`` or a ``(k, nu)``."""
    missing = [(k, nu) for nu in [0, *nus] if (k, nu) not in acc]
    if missing:
        raise ValueError(f"acc lacks {missing}")
    out = {}
    for nu in nus:
        out[table2_name("acc", nu)] = acc[(k, nu)]
        out[table2_name("rel", nu)] = acc[(k, nu)] / acc[(k, 0)]
    return out


def table2_markdown(acc: dict, nus: Sequence[float], k: int, paper=None, paper_table: dict | None = None) -> str:
    """Galli et al.'s Table 2 (``paper_table``, default :data:`PAPER_TABLE2`) beside ours at ``k``
    hypotheses, as a Markdown table: accuracy and accuracy relative to ``nu = 0``, with the stored
    paper-scale record ``paper(name)`` (e.g. :meth:`fedlab.records.Run.paper`; ``n/a`` when ``None``).
    Raises ``ValueError`` for a ``nu`` the paper table lacks."""
    paper_table = PAPER_TABLE2 if paper_table is None else paper_table
    absent = [nu for nu in [0, *nus] if nu not in paper_table]
    if absent:
        raise ValueError(f"paper_table has no entry for nu {absent}")
    stored = (lambda name: paper(name)) if paper is not None else (lambda name: "n/a")
    ps = "paper scale (mean ± 95 % CI, n seeds)"
    lines = [f"| ν | paper acc. (FEMNIST, Table 2) | paper acc. / acc. at ν=0 | ours (digits, k={k}) | ours, {ps} "
             f"| ours / ours at ν=0 | ours / ours at ν=0, {ps} |", "|---|---|---|---|---|---|---|"]
    for nu in nus:
        lines.append(f"| {nu:g} | {paper_table[nu]:.3f} | {paper_table[nu] / paper_table[0]:.3f} | "
                     f"{acc[(k, nu)]:.3f} | {stored(table2_name('acc', nu))} | "
                     f"{acc[(k, nu)] / acc[(k, 0)]:.3f} | {stored(table2_name('rel', nu))} |")
    return "\n".join(lines)


def budget_markdown(grid: dict, ks: Sequence[int], nus: Sequence[float]) -> str:
    """Galli et al.'s Table 1 for our runs: the median and maximum composed privacy budget per
    client of each run of :func:`digits_grid` (``–`` without sanitisation), as a Markdown table."""
    lines = ["| ν | " + " | ".join(f"k = {k}: median, max" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for nu in nus:
        cells = []
        for k in ks:
            a = grid[(k, nu)].accountant
            cells.append("–, –" if a is None else f"{a.summary()['median']:.1f}, {a.summary()['max']:.1f}")
        lines.append(f"| {nu:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# DLG against the mechanism (Galli et al., Sec. 4.3, Fig. 5)
def sanitised_gradient(nu: float, theta0: torch.Tensor, *, lr: float, rng):
    """The defense of Galli et al.'s Sec. 4.3 (Fig. 5) as :func:`fedlab.attacks.gradient_inversion.attack_grid`
    takes it (a map from the gradient dict to what the server recovers): the client takes one SGD
    step of size ``lr`` from the flat parameters ``theta0`` ``[n]``, releases SanitizeUpdate's output
    (Algorithm 2, :func:`fedlab.privacy.dprivacy.sanitize_update`, noise multiplier ``nu``, noise drawn
    from ``rng``), and the server rescales it back to a gradient, ``(theta0 - released) / lr``. With
    ``nu == 0`` the gradient passes unchanged. One ``rng`` (a NumPy ``Generator``) shared by several
    defenses is drawn in the order they are called. Raises ``ValueError`` for ``nu < 0`` or ``lr <= 0``.

    (A candidate for :mod:`fedlab.privacy.dprivacy`; it lives here until the library takes it.)
    """
    if nu < 0:
        raise ValueError(f"nu must be >= 0 (0: no noise), got {nu}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")

    def release(g):
        if nu == 0:
            return g
        flat = flatten_params(g)
        out = dp.sanitize_update(theta0 - lr * flat, theta0, nu, rng=rng)
        return unflatten_params((theta0 - out.theta) / lr, g)

    return release


def plot_dlg_reconstructions(private_images: torch.Tensor, results: dict, nus: Sequence[float],
                             show: Sequence[int] = (0, 1, 2)):
    """The private images ``show`` and DLG's reconstructions of them under each noise multiplier of
    ``nus`` (``results`` from ``attack_grid``, keyed by ``nu``), titled with their PSNR."""
    from .. import plots

    show = list(show)
    return plots.image_grid(torch.cat([private_images[show]] + [results[nu]["x"][show, 0] for nu in nus]),
                            ncols=len(show) * 2, size=1.0,
                            titles=["private"] * len(show) + [f"ν={nu:g}: {results[nu]['psnr'][i]:.0f} dB"
                                                              for nu in nus for i in show])


def plot_dlg_psnr(psnr: dict, nus: Sequence[float], *, success_db: float, title: str = ""):
    """Galli et al. (2022), Fig. 5 as a curve: median DLG PSNR (and min-max band over the victims)
    against the noise multiplier, ``nu = 0`` drawn at 1e-4, with the success threshold. ``psnr``:
    ``{nu: array of PSNRs}``. Returns the axes."""
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 3.6))
    xs = [max(nu, 1e-4) for nu in nus]
    ax.plot(xs, [np.median(psnr[nu]) for nu in nus], "o-", label="median PSNR")
    ax.fill_between(xs, [psnr[nu].min() for nu in nus], [psnr[nu].max() for nu in nus], alpha=0.2,
                    label="min–max over victims")
    ax.axhline(success_db, color="gray", ls=":", label="success threshold")
    ax.set(xscale="log", xlabel="noise multiplier ν (ν = 0 drawn at 1e-4)", ylabel="DLG PSNR (dB)", title=title)
    ax.legend()
    return ax


def dlg_markdown(psnr: dict, rate: dict, nus: Sequence[float], *, success_db: float = 20.0) -> str:
    """Median DLG PSNR and the fraction of images recovered per noise multiplier, as a Markdown table."""
    return ("| ν | " + " | ".join(f"{nu:g}" for nu in nus) + " |\n|---" + "|---" * len(nus) + "|\n"
            + "| median PSNR (dB) | " + " | ".join(f"{np.median(psnr[nu]):.1f}" for nu in nus) + " |\n"
            + f"| recovered (≥ {success_db:g} dB) | " + " | ".join(f"{rate[nu]:.2f}" for nu in nus) + " |")


def guarantee_gaps(nu: float, *, num_samples: int, seed: int, norm_dims: Sequence[int] = (2, 650),
                   clip_radius: float = 1.0) -> dict:
    """What SanitizeUpdate's guarantee covers (issue-level checks of Galli et al., Sec. 3.2), at ``nu``:

    * ``"float"``: Mironov's (2012) attack on two secrets of equal norm, ``(0.6, 0.8)`` and ``(0.8, 0.6)``,
      released in float32 from ``theta_global = 0`` by the plain (``safe=False``) and the snapping
      (``safe=True``) release: ``{safe: FloatingPointAttack}``, and ``"float_eps_d"``, the ``eps d``
      (plus the snapping's extra eps) that the guarantee allows between them;
    * ``"norm"``: how well one plain release reveals ``||delta||`` (median relative error of
      :func:`~fedlab.privacy.dprivacy.estimate_update_norm`) for ``n`` in ``norm_dims``;
    * ``"adaptive"``: the privacy loss between secrets of norms 1.1 and 1.0 (0.1 apart) against the
      promised ``eps d`` (:func:`~fedlab.privacy.dprivacy.privacy_loss_check`);
    * ``"clipped"``: the same for the fixed-eps variant clipped to ``clip_radius`` on a worst-case pair
      (secrets far outside the ball, on opposite sides).

    ``num_samples`` releases per estimate, all from ``seed``. Raises ``ValueError`` for ``nu <= 0``."""
    from ..attacks import floating_point as fp

    if not nu > 0:
        raise ValueError(f"nu must be > 0, got {nu}")
    m = positive_int("num_samples", num_samples)

    def release(safe):
        def f(x, size, g):
            x32 = x.to(torch.float32).expand(size, -1)
            return dp.sanitize_update(x32, torch.zeros_like(x32), nu, rng=g, safe=safe).theta
        return f

    a, b = torch.tensor([0.6, 0.8]), torch.tensor([0.8, 0.6])
    out = {"float": {safe: fp.distinguishing_event_probabilities(release(safe), a, b, num_samples=m, rng=seed)
                     for safe in (False, True)}}
    eps = 2 / nu                                               # both secrets have ||delta|| = 1, n = 2
    out["float_eps_d"] = eps * float(torch.linalg.vector_norm(a - b)) + float(dp.snapping_extra_epsilon(2, eps))
    out["norm"] = {n: dp.norm_disclosure(n, nu, num_trials=max(m // 25, 10), safe=False, rng=seed)
                   for n in norm_dims}
    vec = lambda *v: torch.tensor(v, dtype=torch.float64)     # noqa: E731
    zero = vec(0.0, 0.0)
    out["adaptive"] = dp.privacy_loss_check(vec(1.1, 0.0), vec(1.0, 0.0), zero, nu, num_samples=m, rng=seed)
    out["clipped"] = dp.privacy_loss_check(vec(5 * clip_radius, 0.0), vec(-5 * clip_radius, 0.0), zero, nu,
                                           radius=clip_radius, num_samples=m, rng=seed)
    return out

