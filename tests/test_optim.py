"""fedlab.optim: one L-BFGS per row, batched (Armijo and fixed-step drivers)."""
import pytest
import torch

from fedlab.optim import lbfgs_fixed_step, lbfgs_rows


def rosenbrock(a, b):
    def fn(x, idx):
        return (a[idx] - x[:, 0]) ** 2 + b[idx] * (x[:, 1] - x[:, 0] ** 2) ** 2
    return fn


def test_converges_to_known_minima():
    # quadratic rows with known minimisers, and Rosenbrock rows (minimum at (a, a^2))
    A = torch.tensor([[3.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    c = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    quad = lambda x, idx: 0.5 * ((x @ A) * x).sum(1) - (c[idx] * x).sum(1)
    x, f, _ = lbfgs_rows(quad, torch.zeros(5, 2, dtype=torch.float64), max_iter=60, tol=0.0)
    assert torch.allclose(x, torch.linalg.solve(A, c.T).T, atol=1e-6)
    a = torch.tensor([1.0, 0.5, -1.0, 2.0], dtype=torch.float64)
    b = torch.tensor([100.0, 10.0, 50.0, 5.0], dtype=torch.float64)
    x, f, _ = lbfgs_rows(rosenbrock(a, b), torch.zeros(4, 2, dtype=torch.float64), max_iter=400, tol=0.0)
    assert torch.allclose(x, torch.stack([a, a ** 2], 1), atol=1e-4), x


def test_rows_do_not_depend_on_the_batch():
    """Each row follows its own path: solving a row alone or among others gives the same point."""
    a = torch.tensor([1.0, 0.5, -1.0, 2.0], dtype=torch.float64)
    b = torch.tensor([100.0, 10.0, 50.0, 5.0], dtype=torch.float64)
    x0 = torch.tensor([[-1.2, 1.0], [0.0, 0.0], [2.0, -1.0], [0.5, 3.0]], dtype=torch.float64)
    fn = rosenbrock(a, b)
    xb, fb, _ = lbfgs_rows(fn, x0, max_iter=25)
    for i in range(4):
        xi, fi, _ = lbfgs_rows(lambda x, idx: fn(x, idx + i), x0[i:i + 1], max_iter=25)
        assert torch.allclose(xi[0], xb[i], atol=1e-12) and torch.allclose(fi[0], fb[i], atol=1e-12), i


def test_argument_checks():
    fn = lambda x, idx: (x ** 2).sum(1)
    with pytest.raises(ValueError, match="x0"):
        lbfgs_rows(fn, torch.zeros(3))
    with pytest.raises(ValueError, match="max_iter"):
        lbfgs_rows(fn, torch.zeros(2, 3), max_iter=0)
    with pytest.raises(ValueError, match="c1"):
        lbfgs_rows(fn, torch.zeros(2, 3), c1=1.5)
    with pytest.raises(ValueError, match="one loss per row"):
        lbfgs_rows(lambda x, idx: x.sum(), torch.zeros(2, 3))


def test_fixed_step_rows_follow_their_own_paths_and_stop_when_non_finite():
    """lbfgs_fixed_step: each row's path does not depend on the other rows; a row that turns
    non-finite keeps its last finite iterate while the others go on."""
    A = torch.tensor([[3.0, 0.5], [0.5, 1.0]], dtype=torch.float64)

    def quad(x):
        return 0.5 * ((x @ A) * x).sum(1), x @ A

    x0 = torch.tensor([[1.0, -2.0], [0.3, 0.4], [-1.0, 1.0]], dtype=torch.float64)
    best, alive = lbfgs_fixed_step(quad, x0, max_iter=30, lr=1.0)
    assert bool(alive.all()) and float(best.abs().max()) < 1e-6          # converges to the minimum 0
    for i in range(3):
        bi, _ = lbfgs_fixed_step(quad, x0[i:i + 1], max_iter=30, lr=1.0)
        assert torch.allclose(bi, best[i:i + 1], atol=1e-12)

    def blows_up(x):
        f, g = quad(x)
        f = torch.where(x[:, 0] < -0.5, torch.full_like(f, float("inf")), f)   # row 2 starts outside
        return f, g

    best, alive = lbfgs_fixed_step(blows_up, x0, max_iter=30, lr=1.0)
    assert alive.tolist() == [True, True, False] and torch.equal(best[2], x0[2])
    with pytest.raises(ValueError, match="lr"):
        lbfgs_fixed_step(quad, x0, max_iter=3, lr=0.0)


def test_a_float64_loss_on_float32_rows_keeps_the_rows_float32():
    J = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def fn(x, idx):
        return ((x.double() @ J.T - 1.0) ** 2).sum(1)

    x, f, _ = lbfgs_rows(fn, torch.zeros(3, 4), max_iter=50)
    assert x.dtype == torch.float32 and f.dtype == torch.float64 and float(f.max()) < float(fn(torch.zeros(1, 4), None))


def test_direction_of_selected_rows_equals_those_rows_of_the_full_direction():
    """lbfgs_rows computes directions only for the rows starting an iteration (Memory.direction(g,
    rows)); they must be those rows of the full two-loop recursion, whatever each row's memory
    length and ring position."""
    from fedlab.optim import Memory
    g = torch.Generator().manual_seed(0)
    B, n, m = 6, 5, 4
    mem = Memory.empty(B, m, n, dtype=torch.float64)
    for step in range(7):                          # rows store different numbers of pairs
        s = torch.randn(B, n, generator=g, dtype=torch.float64)
        y = s + 0.1 * torch.randn(B, n, generator=g, dtype=torch.float64)    # s.y > 0
        mem.push(s, y, torch.arange(B) <= step)
    grad = torch.randn(B, n, generator=g, dtype=torch.float64)
    full = mem.direction(grad)
    rows = torch.tensor([4, 0, 5])
    assert torch.allclose(mem.direction(grad[rows], rows), full[rows], atol=1e-12)
    assert (full * grad).sum(1).lt(0).all()        # descent directions
    with pytest.raises(ValueError, match="one row per selected row"):
        mem.direction(grad, rows)
