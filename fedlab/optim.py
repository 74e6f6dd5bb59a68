"""L-BFGS for many independent problems at once: one row of a matrix per problem.

Every attack of the book that runs L-BFGS runs this one: DLG / iDLG (Zhu et al. 2019; fixed step,
no line search, as the authors' code) and RAIFLE (Pham, Kulkarni & Houmansadr, Algorithm 1,
App. B.3: an L-BFGS per user, here with a backtracking Armijo line search).

Running ``torch.optim.LBFGS`` on the *sum* of many problems' losses is cheaper than a Python loop,
but it is not the same algorithm: the quasi-Newton scalars and the line-search step are then shared
by all problems, so an easy problem's progress depends on which hard problems share its batch. Here
every scalar is kept per row: the curvature memory :class:`Memory` (``[B, m, n]`` pairs in a ring
buffer per row) and the two-loop recursion :func:`lbfgs_direction` (Nocedal & Wright, Algorithm 7.4, with
``[B]``-shaped ``rho``, ``alpha``, ``beta`` and initial scaling ``gamma``). One batched function
evaluation serves all rows, and a row's path is the path it would follow alone
(``tests/test_optim.py`` checks this).

Two drivers share that memory and that recursion:

* :func:`lbfgs_rows` -- per-row Armijo backtracking, each row with its own budget and tolerance;
* :func:`lbfgs_fixed_step` -- every row takes ``lr`` times the L-BFGS direction each iteration (the
  first step scaled by ``min(1, 1 / ||g||_1)``, as ``torch.optim.LBFGS`` without line search); a
  row whose objective turns non-finite stops and keeps its last finite iterate.

Device: the state of both drivers lives on the device of ``x0`` (a GPU iterate keeps everything on the
GPU; the callers choose it from :func:`fedlab.config.device`), and on the CPU nothing changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Memory", "lbfgs_direction", "lbfgs_rows", "lbfgs_fixed_step"]

#: a curvature pair with ``s^T y`` at or below this is not stored (it would not keep H positive definite)
CURVATURE_EPS = 1e-10


def lbfgs_direction(g: torch.Tensor, S: torch.Tensor, Y: torch.Tensor, ys: torch.Tensor, head: torch.Tensor,
                    count: torch.Tensor, h_diag: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The L-BFGS search direction ``-H g`` per row: the two-loop recursion (Nocedal & Wright,
    Algorithm 7.4) batched over rows.

    ``g``: ``[B, n]``; ``S``, ``Y``: ``[B, m, n]`` ring buffers of curvature pairs, ``ys`` ``[B, m]``
    their ``s^T y``; row ``b``'s newest pair is in slot ``head[b] - 1`` (mod ``m``), and it holds
    ``count[b] <= m`` pairs; ``h_diag``: ``[B]`` the initial scaling ``gamma``. Returns ``[B, n]``.
    Steps past the longest memory of the batch are skipped. ``rows`` [k] (optional): compute the
    direction of those rows of the memory only, ``g`` then being their ``[k, n]`` gradients (the
    rows still running, so that finished rows cost nothing); returns ``[k, n]``."""
    rows = torch.arange(S.shape[0], device=g.device) if rows is None else rows
    if g.shape[0] != rows.numel():
        raise ValueError(f"g must have one row per selected row ({rows.numel()}), got {tuple(g.shape)}")
    m = ys.shape[1]
    count, h_diag = count[rows], h_diag[rows]
    q = -g
    steps = int(count.max()) if rows.numel() else 0
    if steps == 0:
        return q * h_diag[:, None]
    ar = torch.arange(steps, device=g.device)
    slots = (head[rows][:, None] - 1 - ar[None, :]) % m                      # [k, steps], newest first
    S_o, Y_o = S[rows[:, None], slots], Y[rows[:, None], slots]             # [k, steps, n], one gather each
    valid = ar[None, :] < count[:, None]
    rho_all = torch.where(valid, 1.0 / ys[rows[:, None], slots].clamp_min(CURVATURE_EPS), torch.zeros((), dtype=g.dtype, device=g.device))
    # The loops run one small kernel per step, so they are written to launch few of them: views made once
    # (unbind), products into one buffer, updates in place. Each value is the same float operation as
    # alpha = rho * (s . q), q = q - alpha y, beta = rho * (y . d), d = d + (alpha - beta) s, so the
    # direction is bit-for-bit what those expressions give.
    S_j, Y_j, rho_j = S_o.unbind(1), Y_o.unbind(1), rho_all.unsqueeze(-1).unbind(1)   # [k, n], [k, n], [k, 1]
    buf = torch.empty_like(q)
    alphas = []
    for j in range(steps):                  # newest -> oldest
        alpha = rho_j[j] * torch.mul(S_j[j], q, out=buf).sum(-1, keepdim=True)
        q.sub_(torch.mul(Y_j[j], alpha, out=buf))
        alphas.append(alpha)
    d = q.mul_(h_diag[:, None])
    for j in range(steps - 1, -1, -1):      # oldest -> newest
        beta = rho_j[j] * torch.mul(Y_j[j], d, out=buf).sum(-1, keepdim=True)
        d.add_(torch.mul(S_j[j], alphas[j].sub_(beta), out=buf))
    return d


@dataclass
class Memory:
    """The last ``m`` curvature pairs of each of ``B`` rows in a ring buffer (row ``b``'s newest in
    slot ``head[b] - 1`` mod ``m``; storing a pair writes one slot, nothing is shifted), their
    ``s^T y``, how many each row holds, and each row's initial inverse-Hessian scaling ``gamma = s^T
    y / y^T y`` of its newest pair (1 while empty)."""
    S: torch.Tensor        # [B, m, n]
    Y: torch.Tensor        # [B, m, n]
    ys: torch.Tensor       # [B, m]
    head: torch.Tensor     # [B] long: the slot the next pair goes to
    count: torch.Tensor    # [B] long: pairs held (<= m)
    h_diag: torch.Tensor   # [B]

    @classmethod
    def empty(cls, rows: int, size: int, dim: int, dtype=torch.float32, device=None) -> "Memory":
        """An empty memory on ``device`` (``None``: the CPU; the optimisers pass their iterate's device)."""
        if rows < 1 or size < 1 or dim < 1:
            raise ValueError(f"rows, size (history_size) and dim must be >= 1, got {rows}, {size}, {dim}")
        z = torch.zeros(rows, size, dim, dtype=dtype, device=device)
        zl = torch.zeros(rows, dtype=torch.long, device=device)
        return cls(z, z.clone(), torch.ones(rows, size, dtype=dtype, device=device), zl, zl.clone(),
                   torch.ones(rows, dtype=dtype, device=device))

    def push(self, s: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Store the pair ``(s, y)`` [B, n] for the rows in ``mask`` [B] whose ``s^T y`` exceeds
        :data:`CURVATURE_EPS` (the oldest pair drops out). Returns the rows that stored a pair."""
        ys = (y * s).sum(1)
        accept = (ys > CURVATURE_EPS) & mask
        idx = torch.nonzero(accept).flatten()
        if idx.numel():
            slot = self.head[idx]
            self.S[idx, slot] = s[idx]
            self.Y[idx, slot] = y[idx]
            self.ys[idx, slot] = ys[idx]
            self.head[idx] = (slot + 1) % self.ys.shape[1]
            self.count[idx] = torch.clamp(self.count[idx] + 1, max=self.ys.shape[1])
        self.h_diag = torch.where(accept, ys / (y * y).sum(1).clamp_min(1e-20), self.h_diag)
        return accept

    def direction(self, g: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``-H g`` for every row, or for ``rows`` only with ``g`` their gradients (:func:`lbfgs_direction`)."""
        return lbfgs_direction(g, self.S, self.Y, self.ys, self.head, self.count, self.h_diag, rows)


def _first_step(g: torch.Tensor) -> torch.Tensor:
    """``min(1, 1 / ||g||_1)`` per row: the first step of ``torch.optim.LBFGS``."""
    return torch.clamp(1.0 / g.abs().sum(1).clamp_min(1e-12), max=1.0)


def _value_and_grad(fn, x, idx):
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        f = fn(x, idx)
        if f.shape != x.shape[:1]:
            raise ValueError(f"fn must return one loss per row, shape {tuple(x.shape[:1])}, got {tuple(f.shape)}")
        (g,) = torch.autograd.grad(f.sum(), x)
    return f.detach(), g.detach()


def lbfgs_rows(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x0: torch.Tensor, *, max_iter: int = 100,
               history_size: int = 20, tol: float = 1e-9, c1: float = 1e-4,
               max_backtracks: int = 10) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Minimise ``fn`` row by row with a per-row Armijo line search: ``fn(x [k, n], idx [k]) -> [k]``
    is the loss of rows ``idx`` at the points ``x`` (row ``i`` of the result depends on row ``i`` of
    ``x`` only). Returns ``(x [B, n], f [B], evaluations)``, the last the number of batched calls of
    ``fn``.

    Each row runs its own L-BFGS (:class:`Memory`, :func:`lbfgs_direction`): its first step is scaled
    to ``min(1, 1 / ||g||_1)``, later ones start at ``t = 1``, and while the Armijo condition
    ``f(x + t d) <= f(x) + c1 t g^T d`` fails, ``t`` shrinks (quadratic interpolation, kept in
    ``[0.1 t, 0.5 t]``), at most ``max_backtracks`` times. Every batched call evaluates each running
    row at its own current trial point, whether that row starts an iteration or backtracks, so rows
    never wait for each other. A row stops when its loss changes by less than ``tol``, its line
    search fails, or it has used ``max_iter`` evaluations.

    Raises ``ValueError`` for ``x0`` that is not 2-D, ``max_iter < 1``, ``history_size < 1``,
    ``max_backtracks < 0`` or ``c1`` outside (0, 1).
    """
    if x0.dim() != 2:
        raise ValueError(f"x0 must be [B, n], got shape {tuple(x0.shape)}")
    if max_iter < 1 or history_size < 1 or max_backtracks < 0:
        raise ValueError(f"max_iter and history_size must be >= 1 and max_backtracks >= 0, got "
                         f"{max_iter}, {history_size}, {max_backtracks}")
    if not 0 < c1 < 1:
        raise ValueError(f"c1 must be in (0, 1), got {c1}")
    x = x0.detach().clone()
    B, n = x.shape
    dev = x.device                                       # every state tensor lives where x0 does
    f, g = _value_and_grad(fn, x, torch.arange(B, device=dev))
    evals = 1
    used = torch.ones(B, dtype=torch.long, device=dev)   # evaluations charged to each row
    mem = Memory.empty(B, history_size, n, dtype=x.dtype, device=dev)
    iters = torch.zeros(B, dtype=torch.long, device=dev)
    d = torch.zeros_like(x)
    gd = torch.zeros(B, dtype=x.dtype, device=dev)
    t = torch.ones(B, dtype=x.dtype, device=dev)
    tries = torch.zeros(B, dtype=torch.long, device=dev)
    searching = torch.zeros(B, dtype=torch.bool, device=dev)
    active = used < max_iter
    while bool(active.any()):
        new = active & ~searching
        if bool(new.any()):
            nidx = torch.nonzero(new).flatten()           # only the rows starting an iteration need a direction
            gn = g[nidx]
            dn = mem.direction(gn, nidx)
            gdn = (gn * dn).sum(1)
            bad = ~(gdn < 0)                             # not a descent direction: steepest descent
            dn = torch.where(bad[:, None], -gn, dn)
            gdn = torch.where(bad, -(gn * gn).sum(1), gdn)
            d[nidx] = dn
            gd[nidx] = gdn
            t[nidx] = torch.where(iters[nidx] == 0, _first_step(gn), torch.ones_like(gdn))
            tries[nidx] = 0
            searching = searching | new
        idx = torch.nonzero(active).flatten()
        trial = x + t[:, None] * d
        ft, gt = torch.full_like(f, float("nan")), torch.zeros_like(g)
        ft[idx], gt[idx] = _value_and_grad(fn, trial[idx], idx)
        evals += 1
        used = used + active.long()
        ok = active & torch.isfinite(ft) & (ft <= f + c1 * t * gd)
        # accepted rows: store the curvature pair, move, test the change of the loss
        mem.push(trial - x, gt - g, ok)
        change = (f - ft).abs()
        x = torch.where(ok[:, None], trial, x)
        f = torch.where(ok, ft, f)
        g = torch.where(ok[:, None], gt, g)
        iters = iters + ok.long()
        searching = searching & ~ok
        converged = ok & (change < tol)
        # rejected rows: shrink the step (quadratic interpolation, a non-finite value halves it)
        failed = active & ~ok
        denom = 2 * (ft - f - gd * t)
        good = torch.isfinite(ft) & (denom > 0)
        t_q = torch.where(good, -gd * t * t / torch.where(good, denom, torch.ones_like(denom)), 0.5 * t)
        t_q = t_q.to(t.dtype)                             # a float64 loss must not promote the step
        t = torch.where(failed, torch.minimum(torch.maximum(t_q, 0.1 * t), 0.5 * t), t)
        tries = tries + failed.long()
        active = active & ~converged & ~(failed & (tries > max_backtracks)) & (used < max_iter)
    return x, f, evals


def lbfgs_fixed_step(value_and_grad: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                     x0: torch.Tensor, *, max_iter: int, lr: float = 1.0, history_size: int = 100,
                     callback: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise every row of ``x0`` [B, n] by L-BFGS with a fixed step and no line search, as the
    DLG authors' code runs ``torch.optim.LBFGS(lr=lr)`` (Zhu et al. 2019, Algorithm 1).

    ``value_and_grad(x [B, n]) -> (f [B], g [B, n])`` evaluates all rows at once. Iteration ``k``
    evaluates, stores the curvature pair of the last step, and moves each row by ``lr * t * d`` with
    ``d`` its L-BFGS direction and ``t = min(1, 1 / ||g||_1)`` at the first iteration, ``1`` after.
    A row whose value, gradient or iterate becomes non-finite stops there and keeps its last finite
    iterate; the run ends early when no row is left. ``callback(k, best [B, n], f [B], alive [B])``
    runs after every iteration ``k = 1..max_iter`` (``best``: each row's last finite iterate).

    Returns ``(best [B, n], alive [B])`` after a last check of the final iterate. Raises
    ``ValueError`` for ``x0`` not 2-D, ``max_iter < 1``, ``lr <= 0`` or ``history_size < 1``.
    """
    if x0.dim() != 2:
        raise ValueError(f"x0 must be [B, n], got shape {tuple(x0.shape)}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    z = x0.detach().clone()
    B, n = z.shape
    mem = Memory.empty(B, int(history_size), n, dtype=z.dtype, device=z.device)
    alive = torch.ones(B, dtype=torch.bool, device=z.device)
    prev_g = prev_step = None
    best = z.clone()
    for it in range(1, int(max_iter) + 1):
        val, g = value_and_grad(z)
        finite = torch.isfinite(val) & torch.isfinite(g).all(1) & torch.isfinite(z).all(1)
        alive &= finite
        if not alive.any():
            break
        best = torch.where(alive[:, None], z, best)
        g = torch.where(alive[:, None], g, torch.zeros_like(g))
        if prev_g is None:
            t = _first_step(g) * lr
        else:
            mem.push(prev_step, g - prev_g, alive)
            t = torch.full((B,), float(lr), device=z.device)
        d = mem.direction(g)
        step = torch.where(alive[:, None], t[:, None] * d, torch.zeros_like(d))
        z = z + step
        prev_g, prev_step = g, step
        if callback is not None:
            callback(it, best, val, alive)
    # the last step may have left the finite region: check once more
    val, _ = value_and_grad(z)
    ok = alive & torch.isfinite(val) & torch.isfinite(z).all(1)
    best = torch.where(ok[:, None], z, best)
    return best, alive
