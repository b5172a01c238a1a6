"""Preconditioned conjugate gradients on the centers (skgpu_kernel.solvers.centers_cg).

References are dense float64 solutions computed with numpy or scikit-learn:
KernelRidge's dual coefficients when every point is a center, the normal
equations when they are well conditioned, and a least-squares solve of the
stacked problem (conditioning squared root of the normal equations') when they
are not.
"""

import itertools
import warnings

import numpy as np
import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.operators.row_blocks import CachedRowBlocks, KernelRowBlocks, center_operator
from skgpu_kernel.solvers.centers_cg import default_jitter, solve_centers_cg
from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings, _Monitor
from skgpu_kernel.solvers.epochs import CORE_KEYS
from skgpu_kernel.solvers.solution import Targets


def _gaussian(A, B, bandwidth):
    return np.exp(-((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / (2.0 * bandwidth**2))


def _problem(n, p, d, seed=0, weighted=True):
    rng = np.random.RandomState(seed)
    X = rng.rand(n, d)
    Y = np.stack([np.sin(3 * X[:, 0]), np.cos(2 * X[:, 1]), X.sum(1)], axis=1) + 0.01 * rng.randn(n, 3)
    w = rng.uniform(0.5, 2.0, n) if weighted else None
    Z = X[rng.choice(n, p, replace=False)]
    return X, Y, w, Z


def _fit(X, Y, w, Z, bandwidth, alpha, dtype=torch.float64, row_block=128, **settings):
    kernel = Gaussian(bandwidth=bandwidth)
    Z_t = torch.tensor(Z, dtype=torch.float64)
    weights = None if w is None else torch.tensor(w, dtype=dtype)
    operator = center_operator(kernel, torch.tensor(X, dtype=dtype), Z_t, row_block)
    rows = KernelRowBlocks(operator, Z_t, row_block)
    return solve_centers_cg(rows, Targets(torch.tensor(Y, dtype=dtype), weights), CGPlan(alpha, CGSettings(**settings)))


def _normal_equations(X, Y, w, Z, bandwidth, alpha):
    K, K_zz = _gaussian(X, Z, bandwidth), _gaussian(Z, Z, bandwidth)
    w = np.ones(len(X)) if w is None else w
    return np.linalg.solve(K.T @ (w[:, None] * K) + alpha * K_zz, K.T @ (w[:, None] * Y))


def _stacked_least_squares(K, K_zz, Y, w, alpha):
    """argmin ||W^1/2 (K a - Y)||^2 + alpha tr(a^T K_zz a), by lstsq on [W^1/2 K; sqrt(alpha) R]."""
    eigenvalues, vectors = np.linalg.eigh(K_zz)
    R = (vectors * np.sqrt(np.clip(eigenvalues, 0.0, None))).T
    root = np.sqrt(w)[:, None]
    stacked = np.vstack([root * K, np.sqrt(alpha) * R])
    targets = np.vstack([root * Y, np.zeros((R.shape[0], Y.shape[1]))])
    return np.linalg.lstsq(stacked, targets, rcond=None)[0]


def _objective(K, K_zz, Y, w, alpha, coef):
    return float((w[:, None] * (K @ coef - Y) ** 2).sum() + alpha * np.trace(coef.T @ K_zz @ coef))


def _relative(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("alpha", [1e-3, 1e-1, 1.0])
def test_every_point_a_center_gives_kernel_ridge(alpha):
    # K(X, X) has condition number ~2e8 here: far from trivial, still invertible.
    rng = np.random.RandomState(0)
    X = rng.randn(300, 5)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(300)
    bandwidth = 2.0
    reference = KernelRidge(alpha=alpha, kernel="rbf", gamma=1.0 / (2.0 * bandwidth**2)).fit(X, y).dual_coef_
    result = _fit(X, y, None, X, bandwidth, alpha, tol=1e-10)
    assert result.converged
    # With Z = X the preconditioner is exact up to the jitter: a handful of iterations.
    assert result.n_steps <= 5
    assert result.coef.shape == (300, 1)
    assert _relative(result.coef.numpy().ravel(), reference) < 1e-6


def test_weighted_subset_of_centers_solves_normal_equations():
    X, Y, w, Z = _problem(500, 50, 8)
    bandwidth, alpha = 1.0, 0.1
    reference = _normal_equations(X, Y, w, Z, bandwidth, alpha)
    result = _fit(X, Y, w, Z, bandwidth, alpha, tol=1e-10)
    assert result.converged
    assert result.coef.shape == (50, 3)
    assert _relative(result.coef.numpy(), reference) < 1e-6
    # Each output is the solution of its own problem.
    single = _fit(X, Y[:, 1], w, Z, bandwidth, alpha, tol=1e-10)
    assert _relative(single.coef.numpy().ravel(), reference[:, 1]) < 1e-6


def test_alpha_zero_is_weighted_least_squares():
    X, Y, w, Z = _problem(500, 50, 8, seed=1)
    bandwidth = 1.0
    K = _gaussian(X, Z, bandwidth)
    root = np.sqrt(w)[:, None]
    reference = np.linalg.lstsq(root * K, root * Y, rcond=None)[0]
    result = _fit(X, Y, w, Z, bandwidth, 0.0, tol=1e-10)
    assert result.converged
    assert _relative(result.coef.numpy(), reference) < 1e-6


def _plain_cg(H, b, n_iterations):
    """Conjugate gradients on H a = b without a preconditioner (columns solved together)."""
    x, r = np.zeros_like(b), b.copy()
    d, squared = r.copy(), (r * r).sum(0)
    for _ in range(n_iterations):
        Hd = H @ d
        step = squared / (d * Hd).sum(0)
        x += step * d
        r -= step * Hd
        new = (r * r).sum(0)
        d, squared = r + d * (new / squared), new
    return x


def test_ill_conditioned_problem_converges_where_plain_cg_does_not():
    # Smooth kernel (bandwidth 8 on the unit square), alpha 1e-8 on the sum: the normal
    # equations have condition number ~1e19, far beyond what their float64 solve or
    # SGD resolves, and the coefficients are not determined to any useful accuracy;
    # the fitted values and the objective are, so those are compared.
    X, Y, _, Z = _problem(2000, 200, 2, weighted=False)
    w = np.ones(len(X))
    bandwidth, alpha = 8.0, 1e-8
    K, K_zz = _gaussian(X, Z, bandwidth), _gaussian(Z, Z, bandwidth)
    reference = _stacked_least_squares(K, K_zz, Y, w, alpha)
    result = _fit(X, Y, None, Z, bandwidth, alpha, row_block=512)
    assert result.converged
    assert result.n_steps <= 30
    coef = result.coef.numpy()
    assert _relative(K @ coef, K @ reference) < 1e-4
    best = _objective(K, K_zz, Y, w, alpha, reference)
    assert _objective(K, K_zz, Y, w, alpha, coef) < best * (1 + 1e-4)
    # Plain CG, given over three times the iterations, is still far from the optimum.
    plain = _plain_cg(K.T @ K + alpha * K_zz, K.T @ Y, 100)
    assert _objective(K, K_zz, Y, w, alpha, plain) > 1.1 * best
    assert _relative(K @ plain, K @ reference) > 1e-3


def test_float32_blocks_approach_the_float64_solution():
    X, Y, w, Z = _problem(500, 50, 8, seed=2)
    bandwidth, alpha = 1.0, 1.0
    exact = _fit(X, Y, w, Z, bandwidth, alpha, tol=1e-10)
    single = _fit(X, Y, w, Z, bandwidth, alpha, dtype=torch.float32, tol=1e-5)
    assert single.coef.dtype == torch.float32
    assert _relative(single.coef.double().numpy(), exact.coef.numpy()) < 1e-3
    assert single.jitter == pytest.approx(default_jitter(torch.float32, 1.0, 1.0))


def test_objective_growth_puts_the_best_coefficients_back_with_a_warning():
    monitor = _Monitor(torch.zeros(2, 1), CGSettings())
    for loss, value in [(1.0, 1.0), (0.5, 2.0), (0.6, 3.0)]:  # growth within the factor 1.5 is kept
        assert not monitor.diverged(loss, torch.full((2, 1), value))
    coef = torch.full((2, 1), 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CG reports its warnings for the fit to raise: it never warns itself
        assert monitor.diverged(0.8, coef)
        torch.testing.assert_close(coef, torch.full((2, 1), 2.0), rtol=0, atol=0)
        coef = torch.full((2, 1), 5.0)
        assert monitor.diverged(float("nan"), coef)
    torch.testing.assert_close(coef, torch.full((2, 1), 2.0), rtol=0, atol=0)
    (first, first_category), (second, second_category) = monitor.warnings
    assert first_category is second_category is RuntimeWarning
    assert "objective grew to 0.8 from 0.5" in first and "objective grew to nan" in second


def test_float32_on_a_nearly_singular_problem_never_returns_worse_than_zero():
    # With float64's tiny jitter, float32 blocks may not evaluate the exact solution's
    # large coefficients: how the run ends depends on the BLAS's rounding (the
    # objective grew on a 2-core AMD EPYC; it converged on one Intel Xeon and met a
    # non-positive curvature at the first step on another), but every ending is a
    # documented stop with finite coefficients no worse than zero.
    X, Y, _, Z = _problem(2000, 200, 3, weighted=False)
    bandwidth, alpha = 5.0, 1e-8
    K, K_zz, w = _gaussian(X, Z, bandwidth), _gaussian(Z, Z, bandwidth), np.ones(len(X))
    zero = _objective(K, K_zz, Y, w, alpha, np.zeros((200, 3)))
    result = _fit(X, Y, None, Z, bandwidth, alpha, dtype=torch.float32, row_block=512, jitter=1e-10)
    grew = any("objective grew" in message for message, _ in result.warnings)
    assert result.stop in ("converged", "objective grew", "curvature")
    assert grew == (result.stop == "objective grew")
    assert torch.isfinite(result.coef).all()
    assert _objective(K, K_zz, Y, w, alpha, result.coef.double().numpy()) <= zero
    # The float32 jitter keeps CG where float32 resolves it: no warning, a fit.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = _fit(X, Y, None, Z, bandwidth, alpha, dtype=torch.float32, row_block=512)
    assert _objective(K, K_zz, Y, w, alpha, fitted.coef.double().numpy()) < 1e-2 * zero


def test_history_records_and_convergence_flag():
    X, Y, w, Z = _problem(500, 50, 8)
    lines = []
    result = _fit(X, Y, w, Z, 1.0, 0.1, log=lines.append)
    assert result.converged
    assert result.n_steps == len(result.history) == len(lines) > 1
    for number, record in enumerate(result.history, start=1):
        assert tuple(record)[: len(CORE_KEYS)] == CORE_KEYS
        assert record["epoch"] == record["n_steps"] == number
        assert record["validation_score"] is None
        assert record["seconds"] >= 0.0
        assert isinstance(record["learning_rate"], float)
    assert result.history[-1]["relative_residual"] <= 1e-6
    assert lines[0].startswith(f"epoch 1/100: train loss {result.history[0]['train_loss']:.5g}")
    losses = [record["train_loss"] for record in result.history]
    # The first record measures the zero coefficients: the weighted mean of y^2.
    assert losses[0] == pytest.approx((w[:, None] * Y**2).sum() / w.sum() / 3, rel=1e-12)
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in itertools.pairwise(losses))

    short = _fit(X, Y, w, Z, 1.0, 0.1, max_iterations=2)
    assert not short.converged
    assert short.n_steps == len(short.history) == 2


def test_train_loss_is_the_penalised_objective():
    X, Y, w, Z = _problem(300, 40, 4)
    bandwidth, alpha = 1.0, 0.5
    result = _fit(X, Y, w, Z, bandwidth, alpha, max_iterations=3)
    # Record k measures the coefficients iteration k started from: continue from
    # the two-iteration run's result and compare its first record.
    two = _fit(X, Y, w, Z, bandwidth, alpha, max_iterations=2)
    K, K_zz = _gaussian(X, Z, bandwidth), _gaussian(Z, Z, bandwidth)
    expected = _objective(K, K_zz, Y, w, alpha, two.coef.numpy()) / w.sum() / 3
    assert result.history[2]["train_loss"] == pytest.approx(expected, rel=1e-10)


def test_warm_start():
    X, Y, w, Z = _problem(500, 50, 8)
    bandwidth, alpha = 1.0, 0.1
    exact = _fit(X, Y, w, Z, bandwidth, alpha, tol=1e-10)
    kernel = Gaussian(bandwidth=bandwidth)
    Z_t = torch.tensor(Z)
    rows = KernelRowBlocks(center_operator(kernel, torch.tensor(X), Z_t, 128), Z_t, 128)
    targets = Targets(torch.tensor(Y), torch.tensor(w))
    again = solve_centers_cg(rows, targets, CGPlan(alpha, CGSettings(tol=1e-6), coef_init=exact.coef))
    assert again.converged and again.n_steps == 0
    partial = solve_centers_cg(rows, targets, CGPlan(alpha, CGSettings(max_iterations=3)))
    resumed = solve_centers_cg(rows, targets, CGPlan(alpha, CGSettings(tol=1e-10), coef_init=partial.coef))
    assert resumed.converged
    assert resumed.n_steps < exact.n_steps
    assert _relative(resumed.coef.numpy(), exact.coef.numpy()) < 1e-7


def test_row_block_sources_agree():
    X, Y, w, Z = _problem(500, 50, 8)
    bandwidth, alpha = 1.0, 0.1
    kernel = Gaussian(bandwidth=bandwidth)
    X_t, Y_t, w_t, Z_t = (torch.tensor(a) for a in (X, Y, w, Z))
    computed = KernelRowBlocks(center_operator(kernel, X_t, Z_t, 64), Z_t, 64)
    cached = CachedRowBlocks(kernel(X_t, Z_t), kernel, Z_t, 500)
    plan = CGPlan(alpha, CGSettings(tol=1e-10))
    first = solve_centers_cg(computed, Targets(Y_t, w_t), plan)
    second = solve_centers_cg(cached, Targets(Y_t, w_t), plan)
    # Rounding differs with the block sizes: equal to the tolerance, not bit for bit.
    assert abs(first.n_steps - second.n_steps) <= 2
    assert _relative(first.coef.numpy(), second.coef.numpy()) < 1e-8


def test_zero_target_column_and_stagnation():
    X, Y, w, Z = _problem(500, 50, 8)
    Y[:, 2] = 0.0
    result = _fit(X, Y, w, Z, 1.0, 0.1, tol=1e-8)
    assert result.converged
    assert torch.all(result.coef[:, 2] == 0.0)
    # float32 blocks cannot reach a relative residual of 1e-12: the run stops once
    # the residual makes no new low for n_iter_no_change iterations.
    stalled = _fit(X, Y, w, Z, 1.0, 0.1, dtype=torch.float32, tol=1e-12, n_iter_no_change=5)
    assert not stalled.converged
    assert stalled.n_steps < 100
    residuals = [record["relative_residual"] for record in stalled.history]
    assert min(residuals[-5:]) >= min(residuals)


def test_center_shares_make_the_preconditioner_exact_on_repeated_rows():
    # 3000 rows taking 40 distinct values with very unequal counts (as categorical
    # tabular data do), the 40 values as centers: K_XZ^T K_XZ = K_ZZ M K_ZZ with M the
    # counts, so weighing the centers by their shares solves in a couple of
    # iterations where Falkon's uniform n / p needs many more.
    rng = np.random.RandomState(0)
    values = rng.rand(40, 3)
    counts = np.maximum((3000 * rng.dirichlet(np.full(40, 0.3))).astype(int), 1)
    X = np.repeat(values, counts, axis=0)
    Y = np.sin(3 * X[:, :1]) + 0.1 * rng.randn(len(X), 1)
    alpha = 1e-6
    K, K_zz = _gaussian(X, values, 0.5), _gaussian(values, values, 0.5)
    reference = _stacked_least_squares(K, K_zz, Y, np.ones(len(X)), alpha)
    shares = torch.tensor(counts / counts.sum())
    kernel = Gaussian(bandwidth=0.5)
    Z = torch.tensor(values)
    rows = KernelRowBlocks(center_operator(kernel, torch.tensor(X), Z, 512), Z, 512)
    targets = Targets(torch.tensor(Y))
    weighted = solve_centers_cg(rows, targets, CGPlan(alpha, CGSettings(tol=1e-10), center_shares=shares))
    uniform = solve_centers_cg(rows, targets, CGPlan(alpha, CGSettings(tol=1e-10)))
    assert weighted.converged and weighted.n_steps <= 3
    assert uniform.n_steps > 3 * weighted.n_steps
    np.testing.assert_allclose(K @ weighted.coef.numpy(), K @ reference, rtol=0, atol=1e-8)


@pytest.mark.parametrize("uniform", [True, False])
def test_lower_gram_is_the_lower_triangle_of_the_weighted_product(monkeypatch, uniform):
    from skgpu_kernel.solvers import centers_cg

    monkeypatch.setattr(centers_cg, "_GRAM_BLOCK", 64)  # 150 rows: blocks of 64, 64 and 22
    rng = np.random.RandomState(0)
    A = rng.randn(150, 150)
    L = torch.linalg.cholesky(torch.as_tensor(A @ A.T + np.eye(150)))
    masses = 2.5 if uniform else torch.as_tensor(rng.uniform(0.5, 2.0, 150))
    full = (L.mT * masses) @ L if not uniform else masses * (L.mT @ L)
    gram = centers_cg._lower_gram(L, masses)
    torch.testing.assert_close(torch.tril(gram), torch.tril(full), rtol=1e-12, atol=1e-12)
    # Above the diagonal, only the diagonal blocks are filled (correctly); the rest stays zero.
    torch.testing.assert_close(gram, torch.where(gram == 0, 0.0, full), rtol=1e-12, atol=1e-12)
    assert (gram[:64, 64:] == 0).all() and (gram[64:128, 128:] == 0).all()
