"""Chapter 5's experiments (Galli et al. 2022, personalized FL with d-privacy): the RMSE of Equation 15
for flat parameter vectors, as the chapter measures the utility cost of the Euclidean Laplace noise
against Proposition 3.2's bound (:func:`fedlab.privacy.dprivacy.rmse_increase_bound`); the checks of
Proposition 3.1's sampler; the seeds of private IFCA (Algorithm 1) on the synthetic task; the grids of
(private) IFCA over the number of hypotheses and the noise multiplier behind Fig. 3-4 and Tables 1-2
(the diabetes clinics, the rotated digits); the sanitised update DLG attacks (Sec. 4.3); and the tables
and figures the chapter shows.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from .._checks import positive_int
from ..fl import LocalTraining
from ..fl import ifca as IF
from ..metrics import t_interval
from ..models import flatten_params, get_params, num_params, unflatten_params
from ..privacy import defenses
from ..privacy import dprivacy as dp
from .tables import markdown_table, mean_interval

__all__ = ["hospital_net", "diabetes_split", "rmse", "dist_to_optima", "private_ifca_runs", "private_distances", "convergence_counts",
           "convergence_markdown", "plot_released",
           "agreement", "server_view_panel", "LAPLACE_SETTINGS", "laplace_sampler_checks", "laplace_checks_markdown",
           "plot_laplace_samples", "output_privacy_loss", "loss_increase_draws", "plot_loss_increase", "model_hypotheses", "ifca_grid",
           "grid_values", "grid_budgets", "plot_grid_metric", "PAPER_TABLE1", "table1_markdown",
           "plot_budget_histogram", "PAPER_TABLE2", "table2_name", "table2_values", "table2_markdown",
           "dlg_on_sanitised", "gaussian_float_check", "plot_dlg_reconstructions", "plot_dlg_psnr", "dlg_markdown",
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


def private_ifca_runs(model, clients, seeds: Sequence[int], *, privacy: IF.DPrivacy, num_clusters: int = 2,
                      **kwargs) -> dict:
    """Galli et al. (2022), Algorithm 1 (:func:`fedlab.fl.ifca.private_ifca` with ``privacy``, a
    :class:`fedlab.fl.ifca.DPrivacy`) once per seed ``s`` of ``seeds``, each started from ``num_clusters``
    hypotheses drawn N(0, 1) from ``torch.Generator().manual_seed(s)`` and run with ``seed=s``; ``kwargs`` go to
    ``private_ifca`` (``num_rounds``, ``clients_per_round``, ``local``, ``validation``...).
    Returns ``{s: IFCAResult}``. Raises ``ValueError`` for an empty ``seeds``."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    n = num_params(model)
    out = {}
    for s in seeds:
        init_s = torch.randn(num_clusters, n, generator=torch.Generator().manual_seed(s))
        out[s] = IF.private_ifca(model, clients, hypotheses=IF.Hypotheses(num_clusters, init=init_s), privacy=privacy,
                                 seed=s, **kwargs)
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
    ``threshold`` of both optima and the 95 % interval of that fraction (:func:`fedlab.plots.md_table`).
    Raises ``ValueError`` for an empty ``counts``."""
    from .. import plots

    if not counts:
        raise ValueError("counts must hold at least one row")
    return plots.md_table(["early stopping", f"seeds within {threshold:g} of both θ*", "fraction", "95 % interval"],
                          [[f"{name}", f"{c['success']} / {c['seeds']}", f"{c['fraction']:.2f}",
                            f"[{c['interval'][0]:.2f}, {c['interval'][1]:.2f}]"] for name, c in counts.items()])


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


def agreement(labels, groups) -> float:
    """The share of clients on which two 0/1 labellings ``[K]`` agree, up to swapping the labels of one (a
    clustering names its clusters arbitrarily): ``max(mean(a == b), mean(a == 1 - b))``. Raises ``ValueError``
    for labellings of different lengths or with values other than 0 and 1."""
    a, b = np.asarray(labels).ravel(), np.asarray(groups).ravel()
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"labels and groups must be two non-empty labellings of one length, got {a.shape} and {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("labels and groups must hold only 0 and 1 (two clusters)")
    return float(max(np.mean(a == b), np.mean(a == 1 - b)))


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
                       local=LocalTraining(loss_fn=IF.squared_error), seed=seed)
    pts = v["released"].numpy()
    for grp, marker in [(0, "o"), (1, "^")]:
        m = membership == grp
        ax.scatter(pts[m, 0], pts[m, 1], c=[plots.PALETTE[int(l)] for l in v["labels"][m]], marker=marker,
                   s=20, alpha=0.7)
    ax.scatter(*optima.numpy().T, marker="*", s=250, c="k")
    purity = agreement(v["labels"], membership) if num_clusters == 2 else np.nan
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
    """:func:`laplace_sampler_checks`' output as a Markdown table, one column per ``(n, eps)``
    (:func:`fedlab.plots.md_table`). Raises ``ValueError`` for an empty ``checks``."""
    from .. import plots

    if not checks:
        raise ValueError("checks must hold at least one setting")
    settings = list(checks)
    return plots.md_table(["statistic", *(f"n={n}, ε={e}" for n, e in settings)],
                          [[f"{k}", *(f"{checks[c][k]:.3f}" for c in settings)] for k in checks[settings[0]]])


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


def output_privacy_loss(n: int, epsilon: float, distance: float, *, num_draws: int = 200_000, seed: int = 0,
                        safe: bool = True, level: float = 0.99) -> dict:
    """Galli et al.'s Eq. 5 checked on the mechanism's *outputs*, not on its density formula:
    ``num_draws`` releases (:func:`fedlab.privacy.dprivacy.release_euclidean_laplace`, ``safe`` as
    there) of each of two secrets in ``R^n``, ``0`` and ``distance * e_1``, at ``epsilon``, projected on
    the line through them and histogrammed (bins of about ``0.5 / epsilon``, whole multiples of the
    snapping grid when ``safe``); :func:`fedlab.privacy.dprivacy.empirical_privacy_loss` gives each
    bin's log ratio with simultaneous ``level`` bounds. Returns that dict plus ``"bound"``, the loss
    the guarantee allows (``epsilon * distance``, plus the snapping's extra epsilon when ``safe``), and
    ``"edges"``. Raises ``ValueError`` for ``n < 1``, ``epsilon <= 0``, ``distance <= 0`` or
    ``num_draws < 1``."""
    n, m = positive_int("n", n), positive_int("num_draws", num_draws)
    if not epsilon > 0 or not distance > 0:
        raise ValueError(f"epsilon and distance must be > 0, got {epsilon} and {distance}")
    x1 = torch.zeros(n, dtype=torch.float64)
    x2 = x1.clone()
    x2[0] = distance
    gen = np.random.default_rng(seed)
    t1 = dp.release_euclidean_laplace(x1.expand(m, -1).clone(), epsilon, rng=gen, safe=safe)[:, 0].double().numpy()
    t2 = dp.release_euclidean_laplace(x2.expand(m, -1).clone(), epsilon, rng=gen, safe=safe)[:, 0].double().numpy()
    if safe:
        grid = float(np.asarray(dp.snapping_grid(epsilon)).ravel()[0])
        width = grid * max(1, round(0.5 / epsilon / grid))
        edges = (np.arange(np.floor(-10 / epsilon / width), np.ceil((distance + 10 / epsilon) / width) + 1) - 0.5) * width
        extra = float(np.asarray(dp.snapping_extra_epsilon(n, epsilon)).ravel()[0])
    else:
        edges, extra = np.arange(-10 / epsilon, distance + 10 / epsilon + 0.5 / epsilon, 0.5 / epsilon), 0.0
    out = dp.empirical_privacy_loss(t1, t2, edges, level=level)
    out.update(bound=epsilon * distance + extra, edges=edges)
    return out


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
# real clustered tasks: Fig. 3, Tables 1-2 and Fig. 4 (Galli et al., Sec. 4.2-4.3)
def model_hypotheses(make_model: Callable[[int], nn.Module], k: int, *, seed: int = 0) -> torch.Tensor:
    """``k`` initial IFCA hypotheses ``[k, n]``: the flat parameters of ``make_model(seed + j)`` for
    ``j = 0, ..., k - 1`` (``make_model`` maps a seed to a freshly initialised module, e.g.
    ``lambda s: models.mlp(3, (2,), 1, seed=s)``). Raises ``ValueError`` for ``k < 1``."""
    k = positive_int("k", k)
    return torch.stack([flatten_params(get_params(make_model(seed + j))) for j in range(k)])


def hospital_net(seed: int | None = None) -> nn.Module:
    """The tiny regression network of Galli et al. (2022, Sec. 4.2, their hospital-charge model): 3 inputs
    -> 2 ReLU units -> 1 output, n = 11 parameters (:func:`fedlab.models.mlp`)."""
    from ..models import mlp

    return mlp(3, (2,), 1, seed=seed)


def diabetes_split(seed: int = 0, *, patients_per_client: int = 4, train_share: float = 0.7):
    """The clinics of :func:`fedlab.data.clustered.diabetes_clients` (order shuffled with ``seed``) split
    into ``round(train_share * K)`` training clinics and the rest for validation, the paper's 70 / 30 split
    of clients (Galli et al. 2022, Sec. 4.2). Returns ``(train, val)`` lists of datasets. Raises
    ``ValueError`` for ``train_share`` outside (0, 1)."""
    from ..data.clustered import diabetes_clients

    if not 0 < train_share < 1:
        raise ValueError(f"train_share must be in (0, 1), got {train_share}")
    clinics, _ = diabetes_clients(patients_per_client, seed=seed)
    n_train = round(train_share * len(clinics))
    return clinics[:n_train], clinics[n_train:]


def ifca_grid(make_model: Callable[[int], nn.Module], train_clients, val_clients, *,
              settings: Sequence[tuple], seeds: Sequence[int], num_rounds: int, clients_per_round: int,
              local: LocalTraining = LocalTraining(), patience: int | None = None) -> dict:
    """The experiment behind Galli et al.'s Fig. 3 and Tables 1-2 (Sec. 4.2-4.3): (private) IFCA
    (:func:`fedlab.fl.ifca.ifca`) for every ``(k, nu)`` of ``settings`` and every seed ``s`` of ``seeds``.
    ``nu = 0`` is IFCA without sanitisation (the clients' argmin assignment); ``nu > 0`` is Algorithm 1
    (SanitizeUpdate, the server's k-means). A run starts from :func:`model_hypotheses` ``(make_model,
    k, seed=100 * s)``, runs with ``seed=s`` (so for one ``s`` every ``nu`` samples the same clients),
    keeps its best validation round and stops after ``patience`` rounds without improvement. ``local``: the
    clients' :class:`fedlab.fl.LocalTraining` (its loss is also the validation loss).

    Returns ``{(k, nu, s): IFCAResult}``. Raises ``ValueError`` for empty ``settings`` or ``seeds``, a
    ``k < 1`` or a negative ``nu``."""
    settings, seeds = [(int(k), float(nu)) for k, nu in settings], list(seeds)
    if not settings or not seeds:
        raise ValueError("settings and seeds must each hold at least one entry")
    bad = [(k, nu) for k, nu in settings if k < 1 or not nu >= 0]
    if bad:
        raise ValueError(f"settings must be (k >= 1, nu >= 0) pairs (nu = 0: no noise), got {bad}")
    model = make_model(0)
    grid = {}
    for k, nu in settings:
        for s in seeds:
            hypotheses = IF.Hypotheses(k, init=model_hypotheses(make_model, k, seed=100 * s),
                                       clustering="kmeans" if nu else "argmin")
            grid[(k, nu, s)] = IF.ifca(model, train_clients, hypotheses=hypotheses, num_rounds=num_rounds,
                                       clients_per_round=clients_per_round, local=local,
                                       privacy=IF.DPrivacy(nu) if nu else None,
                                       validation=IF.Validation(val_clients, patience=patience), seed=s)
    return grid


def grid_values(grid: dict, metric: str = "val_rmse") -> dict:
    """The validation ``metric`` (a column of the runs' history: ``val_rmse``, ``val_accuracy``,
    ``val_loss``) at each run's best round, gathered over seeds: ``{(k, nu): float array [seeds]}``
    from the ``{(k, nu, seed): IFCAResult}`` of :func:`ifca_grid`. Raises ``ValueError`` for an
    unknown ``metric``."""
    out: dict = {}
    for (k, nu, _), r in grid.items():
        if metric not in r.history:
            raise ValueError(f"metric must be a history column such as 'val_rmse', got {metric!r}")
        out.setdefault((k, nu), []).append(float(r.history[metric][r.best_round]))
    return {key: np.asarray(v) for key, v in out.items()}


def grid_budgets(grid: dict) -> dict:
    """Galli et al.'s Table 1 statistics for each private run of :func:`ifca_grid`: the median and the
    maximum composed budget over the clients that took part (``PrivacyAccountant.summary``), per
    seed: ``{(k, nu): {"median": [seeds], "max": [seeds]}}`` (runs without noise are left out)."""
    out: dict = {}
    for (k, nu, _), r in grid.items():
        if r.accountant is None:
            continue
        summ = r.accountant.summary()
        entry = out.setdefault((k, nu), {"median": [], "max": []})
        entry["median"].append(summ["median"])
        entry["max"].append(summ["max"])
    return {key: {m: np.asarray(v) for m, v in e.items()} for key, e in out.items()}


def plot_grid_metric(values: dict, ks: Sequence[int], nus: Sequence[float], *, ylabel: str, title: str = "",
                     ax=None):
    """Galli et al.'s Fig. 3 as we draw it: the mean over seeds of ``values`` (``{(k, nu): [seeds]}``,
    :func:`grid_values`) against the noise multiplier, one line per ``k``, with the 95 % Student-t
    interval over seeds as error bars (the paper shows +-1 standard deviation). Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(nus))
    for i, k in enumerate(ks):
        stats = [t_interval(values[(k, float(nu))]) for nu in nus]
        mean = np.array([m for m, _, _ in stats])
        half = np.array([0.0 if ci is None else (ci[1] - ci[0]) / 2 for _, _, ci in stats])
        ax.errorbar(x + 0.06 * (i - (len(ks) - 1) / 2), mean, yerr=half, marker="o", capsize=3, label=f"k = {k}")
    ax.set_xticks(x, [f"{nu:g}" for nu in nus])
    ax.set(xlabel="noise multiplier ν (0: no sanitisation)", ylabel=ylabel, title=title)
    ax.legend()
    return ax


#: Galli et al. (2022), Table 1: hospital charge data, (median, max) budget per client over 10 seeds
PAPER_TABLE1 = {0.1: {7: (517.0, 1551.0), 5: (418.0, 1342.0), 3: (473.0, 1386.0), 1: (528.0, 1540.0)},
                1: {7: (36.3, 126.5), 5: (40.7, 127.6), 3: (44.0, 138.6), 1: (49.5, 147.4)},
                2: {7: (15.4, 57.8), 5: (14.3, 54.5), 3: (22.0, 69.3), 1: (21.5, 66.6)},
                3: {7: (7.7, 32.3), 5: (8.4, 36.7), 3: (12.5, 40.0), 1: (12.1, 40.0)},
                5: {7: (5.7, 21.3), 5: (5.9, 22.0), 3: (5.5, 21.6), 1: (5.3, 20.9)}}


def table1_markdown(budgets: dict, ks: Sequence[int], nus: Sequence[float], *, paper_table: dict | None = None) -> str:
    """Galli et al.'s Table 1 beside ours: one row per private ``(nu, k)`` (``nu > 0``) with the paper's
    median and maximum budget per client (``paper_table``, default :data:`PAPER_TABLE1`; ``n/a`` where
    it has no entry) and ours from :func:`grid_budgets`, mean ± 95 % interval over seeds.
    Raises ``ValueError`` if ``budgets`` lacks a requested ``(k, nu)``."""
    paper_table = PAPER_TABLE1 if paper_table is None else paper_table
    rows = []
    for nu in nus:
        if not nu > 0:
            continue
        for k in ks:
            if (k, float(nu)) not in budgets:
                raise ValueError(f"budgets lacks (k, nu) = {(k, nu)}")
            b = budgets[(k, float(nu))]
            paper = paper_table.get(nu, {}).get(k)
            rows.append([f"{nu:g}", k, "n/a" if paper is None else f"{paper[0]:.1f}",
                         "n/a" if paper is None else f"{paper[1]:.1f}", mean_interval(b["median"], 1),
                         mean_interval(b["max"], 1)])
    return markdown_table(["ν", "k", "paper: median", "paper: max", "ours: median (mean ± 95 % CI)",
                           "ours: max (mean ± 95 % CI)"], rows)


def plot_budget_histogram(result, *, ax=None, title: str = ""):
    """Galli et al.'s Fig. 4: the histogram, over the clients that took part, of the composed budget
    of one private run (``result.accountant.spent``; each participation costs ``n / nu``, so the bars
    sit at multiples of it). Returns the axes. Raises ``ValueError`` for a run without noise."""
    import matplotlib.pyplot as plt

    acct = result.accountant
    if acct is None:
        raise ValueError("result must be a private run (it has no accountant)")
    spent = acct.spent[acct.participations > 0]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    step = float(np.min(spent)) / max(int(acct.participations[acct.participations > 0].min()), 1)
    edges = (np.arange(0, acct.participations.max() + 2) - 0.5) * step
    ax.hist(spent, bins=edges, alpha=0.8)
    ax.set(xlabel="composed budget ε·r per client", ylabel="clients", title=title)
    return ax


#: Galli et al. (2022), Table 2 (cross-entropy column): FEMNIST validation accuracy vs noise multiplier
PAPER_TABLE2 = {0: 0.832, 1e-3: 0.843, 1e-2: 0.832, 0.1: 0.834, 1: 0.834, 3: 0.835, 5: 0.812, 10: 0.692, 15: 0.561}


def table2_name(what: str, nu: float) -> str:
    """The glued name of a Table 2 number of the rotated-digits CNN: ``ch5_t2cnn_{what}_nu{nu}`` with
    ``.`` written ``p`` (``table2_name("acc", 0.1) == "ch5_t2cnn_acc_nu0p1"``; the ``ch5_t2_*`` names of
    earlier records belong to the logistic model the chapter used before)."""
    return f"ch5_t2cnn_{what}_nu" + f"{nu:g}".replace(".", "p")


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
    paper-scale record ``paper(name)`` (e.g. :meth:`fedlab.records.Run.stored`; ``n/a`` when ``None``), the
    accuracy with ``value_range=(0, 1)`` (its interval cut to [0, 1]; the ratio to ``nu = 0`` may pass 1).
    Raises ``ValueError`` for a ``nu`` the paper table lacks."""
    paper_table = PAPER_TABLE2 if paper_table is None else paper_table
    absent = [nu for nu in [0, *nus] if nu not in paper_table]
    if absent:
        raise ValueError(f"paper_table has no entry for nu {absent}")
    stored = (lambda name, **kw: paper(name, **kw)) if paper is not None else (lambda name, **kw: "n/a")
    ps = "paper scale (mean and 95 % CI, n seeds)"
    rows = [[f"{nu:g}", paper_table[nu], paper_table[nu] / paper_table[0], acc[(k, nu)],
             stored(table2_name("acc", nu), value_range=(0, 1)),   # an accuracy: its interval cut to [0, 1]
             acc[(k, nu)] / acc[(k, 0)], stored(table2_name("rel", nu))] for nu in nus]   # a ratio: may pass 1
    return markdown_table(["ν", "paper acc. (FEMNIST, Table 2)", "paper acc. / acc. at ν=0", f"ours (digits, k={k})",
                           f"ours, {ps}", "ours / ours at ν=0", f"ours / ours at ν=0, {ps}"], rows)


# --------------------------------------------------------------------------------------------------
# DLG against the mechanism (Galli et al., Sec. 4.3, Fig. 5)
def dlg_on_sanitised(model, X: torch.Tensor, y: torch.Tensor, nus: Sequence[float], *, lr: float,
                     max_iter: int, num_classes: int = 10, seed: int = 0) -> dict:
    """Galli et al. (2022), Sec. 4.3 (Fig. 5): DLG (:func:`fedlab.attacks.gradient_inversion.attack_grid`,
    one victim per image of ``X`` ``[m, C, H, W]`` with labels ``y`` ``[m]``, label unknown to the
    attacker, ``max_iter`` L-BFGS iterations) against the sanitised one-step update of each victim:
    for every noise multiplier of ``nus`` the client steps with ``lr`` from ``model``'s parameters and
    releases SanitizeUpdate's output, which the server rescales to a gradient
    (:func:`fedlab.privacy.defenses.sanitised_gradient`; ``nu = 0``: the plain gradient). One noise
    stream ``np.random.default_rng(seed)`` serves every release, drawn in the order of ``nus``.
    Returns ``{nu: {"psnr": [m], "x": reconstructions}}``. Raises ``ValueError`` for an empty ``nus``,
    a negative ``nu`` or ``lr <= 0``."""
    from ..attacks import gradient_inversion as gi

    if len(nus) == 0:
        raise ValueError("nus must hold at least one noise multiplier")
    params = get_params(model)
    theta0 = flatten_params(params)
    noise = np.random.default_rng(seed)
    settings = {nu: {"defense": defenses.sanitised_gradient(nu, theta0, lr=lr, rng=noise)} for nu in nus}
    return gi.attack_grid(model, params, X, y, num_classes=num_classes,
                          budget=gi.AttackBudget(max_iter=max_iter, lr=1.0), seed=seed, settings=settings)


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
    """Median DLG PSNR and the fraction of images recovered per noise multiplier, as a Markdown table
    (:func:`fedlab.plots.md_table`)."""
    from .. import plots

    return plots.md_table(["ν", *(f"{nu:g}" for nu in nus)],
                          [["median PSNR (dB)", *(f"{np.median(psnr[nu]):.1f}" for nu in nus)],
                           [f"recovered (≥ {success_db:g} dB)", *(f"{rate[nu]:.2f}" for nu in nus)]])


def guarantee_gaps(nu: float, *, num_samples: int, seed: int, norm_dims: Sequence[int] = (2, 650),
                   clip_norm: float = 1.0) -> dict:
    """What SanitizeUpdate's guarantee covers (issue-level checks of Galli et al., Sec. 3.2), at ``nu``:

    * ``"float"``: Mironov's (2012) attack on two secrets of equal norm, ``(0.6, 0.8)`` and ``(0.8, 0.6)``,
      released in float32 from ``theta_global = 0`` by the plain (``safe=False``) and the snapping
      (``safe=True``) release: ``{safe: FloatingPointAttack}``, and ``"float_eps_d"``, the ``eps d``
      (plus the snapping's largest extra eps, ``fp_slack``) that the guarantee allows between them;
    * ``"grid"``: the snapping grid's own leak: secrets of norms 0.79 and 0.81 (0.02 apart,
      ``eps d`` about ``0.01`` at ``nu = 5``), the event "some coordinate off the 4-grid", with the
      grid chosen from the secret's epsilon (``"secret"``, the old release: grids 2 and 4 at
      ``nu = 5``) and with the public grid of the safe release (``"public"``):
      ``{kind: FloatingPointAttack}``, and ``"grid_eps_d"``, the ``eps d + fp_slack`` allowed;
    * ``"norm"``: how well one plain release reveals ``||delta||`` (median relative error of
      :func:`~fedlab.privacy.dprivacy.estimate_update_norm`) for ``n`` in ``norm_dims``;
    * ``"adaptive"``: the privacy loss between secrets of norms 1.1 and 1.0 (0.1 apart) against the
      promised ``eps d`` (:func:`~fedlab.privacy.dprivacy.privacy_loss_check`);
    * ``"clipped"``: the same for the fixed-eps variant clipped to ``clip_norm`` on a worst-case pair
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
    out["float_eps_d"] = eps * float(torch.linalg.vector_norm(a - b)) + dp.DEFAULT_FP_SLACK

    def adaptive(secret_grid):
        def f(x, size, g):
            x32 = x.to(torch.float32).expand(size, -1)
            if not secret_grid:
                return dp.sanitize_update(x32, torch.zeros_like(x32), nu, rng=g).theta
            e = 2 / (nu * float(torch.linalg.vector_norm(x.double())))
            return dp.release_euclidean_laplace(x32, e, rng=g)           # grid = snapping_grid(e)
        return f

    a2, b2 = torch.tensor([0.79, 0.0]), torch.tensor([0.81, 0.0])
    out["grid"] = {kind: fp.distinguishing_event_probabilities(adaptive(kind == "secret"), a2, b2, num_samples=m,
                                                               rng=seed, event=fp.off_grid(4.0))
                   for kind in ("secret", "public")}
    out["grid_eps_d"] = 2 / (nu * 0.79) * 0.02 + dp.DEFAULT_FP_SLACK
    out["norm"] = {n: dp.norm_disclosure(n, nu, num_trials=max(m // 25, 10), safe=False, rng=seed)
                   for n in norm_dims}
    vec = lambda *v: torch.tensor(v, dtype=torch.float64)     # noqa: E731
    zero = vec(0.0, 0.0)
    out["adaptive"] = dp.privacy_loss_check(vec(1.1, 0.0), vec(1.0, 0.0), zero, nu, num_samples=m, rng=seed)
    out["clipped"] = dp.privacy_loss_check(vec(5 * clip_norm, 0.0), vec(-5 * clip_norm, 0.0), zero, nu,
                                           clip_norm=clip_norm, num_samples=m, rng=seed)
    return out



def gaussian_float_check(*, num_samples: int, seed: int, epsilon: float = 2.0, delta: float = 1e-5,
                         sensitivity: float = 2.0) -> dict:
    """Mironov's distinguishing test on the book's Gaussian mechanisms: the local Gaussian
    (:func:`fedlab.privacy.ldp.ldp_gaussian`) at ``(epsilon, delta)`` with L2 ``sensitivity``, on the
    neighbouring inputs ``[1, 0]`` and ``[0, 1]`` in float32, as the float mechanism (``safe=False``)
    and as the discrete Gaussian on a grid (``safe=True``). ``num_samples`` releases per input, the
    event "some coordinate out of the plain release's reach from ``[0, 1]``"
    (:func:`fedlab.attacks.floating_point.unreachable_from`).

    Returns ``{safe: FloatingPointAttack}`` for ``safe`` in ``(False, True)``, with ``"epsilon"`` and
    ``"delta"``. The guarantee requires ``P_A <= e^epsilon P_B + delta`` (``violates(epsilon, delta)``
    is ``False``). Raises ``ValueError`` on a bad ``num_samples``."""
    from ..attacks import floating_point as fp
    from ..privacy import ldp

    m = positive_int("num_samples", num_samples)

    def release(safe):
        def f(x, size, g):
            gen = torch.Generator().manual_seed(int(g.integers(2 ** 62)))
            return ldp.ldp_gaussian(x.expand(size, -1).clone(), epsilon, delta, sensitivity, generator=gen, safe=safe)
        return f

    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    out = {safe: fp.distinguishing_event_probabilities(release(safe), a, b, num_samples=m, rng=seed)
           for safe in (False, True)}
    out.update(epsilon=float(epsilon), delta=float(delta))
    return out
