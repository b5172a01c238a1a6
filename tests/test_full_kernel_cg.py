"""Penalised fits with a center at every row beyond Falkon's factors: CG with a subsample preconditioner.

References are dense float64 solutions of ``(K + alpha W^-1) a = Y`` and
scikit-learn's ``KernelRidge`` on the same data.  The estimator-level tests lower
``FULL_KERNEL_CG_MAX_ROWS`` so that a few hundred rows take the path large data
takes (beyond 10000 rows).
"""

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.cg_preconditioner import (
    PenalisedRows,
    ShiftedNystromPreconditioner,
    rpcholesky_factor,
    shifted_condition,
    shifted_nystrom_preconditioner,
    shifted_rpcholesky_preconditioner,
)
from skgpu_kernel.fit import tune
from skgpu_kernel.fit.prepare import _tuned_spectrum
from skgpu_kernel.fit.tune import applied_tuning
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.operators import CachedOperator
from skgpu_kernel.planning import solver as planning_solver
from skgpu_kernel.planning.eigenpro import plan_eigenpro2_layout
from skgpu_kernel.planning.kernel import SHIFTED_MAX_COMPONENTS, KernelProblem
from skgpu_kernel.planning.kernel_policy import plan_kernel_fit
from skgpu_kernel.planning.parameters import KernelFitParameters
from skgpu_kernel.planning.solver import (
    CG_MAX_CONDITION,
    CG_ROW_BLOCK,
    full_kernel_cg_conditioned,
    full_kernel_cg_factors,
    plan_every_point_cg,
    plan_full_kernel_solver,
)
from skgpu_kernel.preconditioner import nystrom_eigensystem, nystrom_eigenvalues
from skgpu_kernel.regularization import AlphaSelection
from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings
from skgpu_kernel.solvers.full_kernel_cg import solve_full_kernel_cg
from skgpu_kernel.solvers.solution import Targets


def _solve(K, Y, weights, alpha, preconditioner, settings, coef_init=None):
    """CG on every point with ``K`` given as a float64 matrix (a cache of it)."""
    plan = CGPlan(alpha, settings, preconditioner, coef_init)
    return solve_full_kernel_cg(CachedOperator(K, torch.float64), Targets(Y, weights), plan)


def _data(n, d=4, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    Y = np.stack([np.sin(X[:, 0]) + 0.1 * rng.randn(n), X[:, 1] * X[:, 2]], axis=1)
    return X, Y


def _system(n, subsample, alpha, weighted, bandwidth=1.5, seed=0):
    X, Y = _data(n, seed=seed)
    X_t = torch.tensor(X)
    kernel = Gaussian(bandwidth=bandwidth)
    K = kernel(X_t, X_t)
    weights = torch.tensor(np.random.RandomState(seed + 1).uniform(0.2, 1.0, n)) if weighted else None
    rows = PenalisedRows(n, alpha, weights, torch.float64)
    eigensystem = nystrom_eigensystem(kernel, X_t[:subsample])
    preconditioner = shifted_nystrom_preconditioner(
        eigensystem, lambda V: K[:, :subsample] @ V, rows, SHIFTED_MAX_COMPONENTS
    )
    return K, torch.tensor(Y), weights, preconditioner


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("alpha", [1e-3, 1e-1])
def test_cg_reaches_the_exact_penalised_solution(alpha, weighted):
    K, Y, weights, preconditioner = _system(400, 120, alpha, weighted)
    settings = CGSettings(tol=1e-9, max_iterations=500)
    result = _solve(K, Y, weights, alpha, preconditioner, settings)
    inverse_weights = torch.ones(400, dtype=torch.float64) if weights is None else 1.0 / weights
    exact = torch.linalg.solve(K + alpha * torch.diag(inverse_weights), Y)
    assert result.converged
    torch.testing.assert_close(K @ result.coef, K @ exact, rtol=0, atol=1e-7)


def test_preconditioner_is_a_split_factor_that_lowers_the_condition_number():
    alpha = 1e-3
    K, _, weights, preconditioner = _system(400, 120, alpha, weighted=True)
    A = K + alpha * torch.diag(1.0 / weights)
    identity = torch.eye(400, dtype=torch.float64)
    C = preconditioner.apply(identity)
    torch.testing.assert_close(preconditioner.apply_transpose(identity), C.T, rtol=0, atol=1e-12)
    plain = torch.linalg.cond(A)
    preconditioned = torch.linalg.cond(C.T @ A @ C)
    assert preconditioner.n_components > 10
    assert preconditioned < plain / 100


def test_cg_needs_fewer_iterations_with_the_preconditioner():
    alpha = 1e-3
    K, Y, _, preconditioner = _system(400, 120, alpha, weighted=False)
    none = ShiftedNystromPreconditioner(torch.zeros(400, 0, dtype=torch.float64), torch.zeros(0), alpha)
    settings = CGSettings(tol=1e-8, max_iterations=400, n_iter_no_change=None)
    with_it = _solve(K, Y, None, alpha, preconditioner, settings)
    without = _solve(K, Y, None, alpha, none, settings)
    # Plain CG may not reach the tolerance at all within the bound (it then ran all 400).
    assert with_it.converged
    assert with_it.n_steps * 2 <= without.n_steps


def test_warm_start_from_the_solution_needs_no_iteration():
    alpha = 1e-2
    K, Y, _, preconditioner = _system(300, 100, alpha, weighted=False)
    exact = torch.linalg.solve(K + alpha * torch.eye(300, dtype=torch.float64), Y)
    result = _solve(K, Y, None, alpha, preconditioner, CGSettings(tol=1e-8), coef_init=exact)
    assert result.n_steps == 0 and result.converged


def test_planning_takes_cg_beyond_the_factored_rows_for_a_positive_alpha_only():
    large = KernelProblem(50_000, 8, 1, 4, 0)
    small = KernelProblem(5_000, 8, 1, 4, 0)
    assert not full_kernel_cg_factors(large) and full_kernel_cg_factors(small)
    assert plan_full_kernel_solver(large, 2**34, "auto", 0.1) == "cg"
    assert plan_full_kernel_solver(large, 2**34, "auto", 0.0) == "eigenpro"
    assert plan_full_kernel_solver(large, 2**34, "eigenpro", 0.1) == "eigenpro"


@pytest.fixture
def beyond_factors(monkeypatch):
    """Fits of more than 200 rows take the subsample-preconditioned CG."""
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)


@pytest.mark.parametrize("weighted", [False, True])
def test_regressor_matches_kernel_ridge(beyond_factors, weighted):
    X, Y = _data(700, seed=3)
    y = Y[:, 0]
    weights = np.random.RandomState(4).uniform(0.5, 2.0, 700) if weighted else None
    bandwidth, alpha = 1.5, 0.05
    model = AdaptiveKernelRegressor(
        bandwidth=bandwidth, alpha=alpha, dtype="float64", fit_intercept=False, subsample_size=150, random_state=0
    ).fit(X, y, sample_weight=weights)
    reference = KernelRidge(alpha=alpha, kernel="rbf", gamma=0.5 / bandwidth**2).fit(X, y, sample_weight=weights)
    assert model.solver_ == "cg" and model.n_centers_ == 700
    assert (model.subsample_size_, model.kernel_cached_, model.batch_size_) == (150, True, None)
    X_test, _ = _data(200, seed=5)
    np.testing.assert_allclose(model.predict(X_test), reference.predict(X_test), rtol=0, atol=1e-5)


def test_regressor_float32_is_close_to_float64(beyond_factors):
    X, Y = _data(700, seed=6)
    params = dict(bandwidth=1.5, alpha=0.05, subsample_size=150, random_state=0)
    single = AdaptiveKernelRegressor(**params).fit(X, Y)
    double = AdaptiveKernelRegressor(dtype="float64", **params).fit(X, Y)
    X_test, _ = _data(200, seed=7)
    difference = np.abs(single.predict(X_test) - double.predict(X_test)).max()
    assert single.solver_ == "cg" and difference < 1e-3 * np.abs(double.predict(X_test)).max()


def test_classifier_with_class_weights_takes_the_penalised_cg(beyond_factors):
    X, Y = _data(600, seed=8)
    y = (Y[:, 1] > 0.8).astype(int)  # a minority class
    # solver="cg": "auto" solves 600 rows directly from the penalty's criterion (tests/test_direct_solve.py).
    params = dict(random_state=0, subsample_size=150, solver="cg")
    model = AdaptiveKernelClassifier(class_weight="balanced", **params).fit(X, y)
    plain = AdaptiveKernelClassifier(**params).fit(X, y)
    assert model.solver_ == "cg" and model.alpha_ > 0
    minority = y == 1
    recall = (model.predict(X)[minority] == 1).mean()
    assert recall >= (plain.predict(X)[minority] == 1).mean()


def test_warm_start_continues_from_the_previous_solution(beyond_factors):
    # Without an intercept: the joint intercept's column of ones starts again from zero.
    X, Y = _data(600, seed=9)
    params = dict(bandwidth=1.5, alpha=0.05, dtype="float64", subsample_size=150, random_state=0, fit_intercept=False)
    model = AdaptiveKernelRegressor(warm_start=True, **params).fit(X, Y)
    first = model.predict(X)
    model.fit(X, Y)
    assert model.solver_ == "cg" and model.n_epochs_ <= 1
    np.testing.assert_allclose(model.predict(X), first, rtol=0, atol=1e-6)


def test_the_subsample_spectrum_alone_is_the_full_decompositions():
    X, _ = _data(300, seed=12)
    kernel = Gaussian(bandwidth=1.5)
    X_t = torch.as_tensor(X)
    values = nystrom_eigenvalues(kernel, X_t)
    full, _ = nystrom_eigensystem(kernel, X_t)
    assert values.dtype == np.float64 and np.all(np.diff(values) <= 0) and values.min() >= 0
    np.testing.assert_allclose(values, full, rtol=0, atol=1e-13 * full[0])


@pytest.fixture
def decompositions(monkeypatch):
    """``(name, size)`` of every ``torch.linalg.eigh`` and ``eigvalsh`` the test runs."""
    decomposed = []
    for name in ("eigh", "eigvalsh"):
        original = getattr(torch.linalg, name)

        def recorded(matrix, *args, _name=name, _original=original, **kwargs):
            decomposed.append((_name, matrix.shape[-1]))
            return _original(matrix, *args, **kwargs)

        monkeypatch.setattr(torch.linalg, name, recorded)
    return decomposed


def test_cg_on_every_point_decomposes_its_subsample_for_the_spectrum_alone(beyond_factors, decompositions):
    X, Y = _data(500, seed=13)
    params = dict(bandwidth=1.5, alpha=0.05, dtype="float64", subsample_size=170, random_state=0)
    model = AdaptiveKernelRegressor(feature_learning=None, **params).fit(X, Y[:, 0])
    assert model.solver_ == "cg" and model.subsample_size_ == 170
    assert ("eigvalsh", 170) in decompositions and ("eigh", 170) not in decompositions


def test_the_preconditioner_basis_is_planned_within_the_budget():
    problem = KernelProblem(50_000, 8, 2, 4, 0)
    per_component = 50_000 * (8 + 4)

    def planned(budget):
        layout = plan_eigenpro2_layout(problem, budget, torch.device("cpu"), KernelFitParameters(cache_kernel=False))
        return plan_every_point_cg(layout)

    roomy = planned(10**10)
    assert roomy.max_components == SHIFTED_MAX_COMPONENTS and roomy.memory.fits()
    assert roomy.method == "cg" and roomy.batch_size == CG_ROW_BLOCK and not roomy.cached
    before_basis = roomy.memory.total - SHIFTED_MAX_COMPONENTS * per_component
    tight = planned(before_basis + 300 * per_component + 5)
    assert tight.max_components == 300 and tight.memory.fits()
    none = planned(before_basis)
    assert none.max_components == 0 and none.memory.fits()


def test_without_room_for_a_basis_cg_still_solves_a_well_conditioned_system(beyond_factors, without_cg_basis):
    X, Y = _data(500, seed=10)
    alpha = 200.0  # above n lambda_1 / 99: the estimated condition is below CG_MAX_CONDITION without a basis
    params = dict(bandwidth=1.5, alpha=alpha, dtype="float64", fit_intercept=False, subsample_size=150)
    model = AdaptiveKernelRegressor(**params).fit(X, Y[:, 0])
    reference = KernelRidge(alpha=alpha, kernel="rbf", gamma=0.5 / 1.5**2).fit(X, Y[:, 0])
    assert model.solver_ == "cg"
    np.testing.assert_allclose(model.predict(X), reference.predict(X), rtol=0, atol=1e-6)


@pytest.mark.parametrize("room", [True, False])
def test_an_ill_conditioned_penalised_system_falls_back_to_eigenpro(beyond_factors, request, room):
    if not room:
        request.getfixturevalue("without_cg_basis")
    X, Y = _data(700, seed=11)
    alpha = 1e-7 if room else 0.05
    model = AdaptiveKernelRegressor(bandwidth=1.5, alpha=alpha, subsample_size=150, random_state=0).fit(X, Y[:, 0])
    assert model.solver_ == "eigenpro" and model.batch_size_ is not None
    assert model.score(X, Y[:, 0]) > 0.5


def test_shifted_condition_counts_the_first_direction_left_unflattened():
    eigenvalues = np.array([1.0, 1e-1, 1e-2, 1e-3, 1e-4])
    rows = PenalisedRows(100, 1e-3, None, torch.float64)  # n lambda: 100, 10, 1, 0.1, 0.01, all above alpha
    assert shifted_condition(eigenvalues, rows, SHIFTED_MAX_COMPONENTS) == 1.0
    assert shifted_condition(eigenvalues, rows, max_components=2) == pytest.approx((1.0 + 1e-3) / 1e-3)
    assert shifted_condition(eigenvalues, rows, max_components=0) == pytest.approx((100.0 + 1e-3) / 1e-3)
    shifted = PenalisedRows(100, 0.5, None, torch.float64)  # flattens 100, 10, 1; 0.1 is below the shift
    assert shifted_condition(eigenvalues, shifted, SHIFTED_MAX_COMPONENTS) == 1.0


def test_cg_on_every_point_is_planned_only_up_to_its_condition_bound():
    assert full_kernel_cg_conditioned(1.0) and full_kernel_cg_conditioned(CG_MAX_CONDITION)
    assert not full_kernel_cg_conditioned(np.nextafter(CG_MAX_CONDITION, np.inf))


def _rpcholesky(X, max_rank, stop_level, bandwidth=1.5, seed=0):
    kernel = Gaussian(bandwidth=bandwidth)
    return rpcholesky_factor(
        lambda pivots: kernel(X, X[pivots]),
        kernel.diagonal(X),
        max_rank,
        stop_level,
        torch.Generator().manual_seed(seed),
    )


def test_rpcholesky_stops_at_the_rank_of_the_kernel_and_reproduces_it():
    distinct = torch.tensor(np.random.RandomState(12).randn(20, 3))
    X = distinct.repeat(3, 1)  # K has rank 20
    factor = _rpcholesky(X, max_rank=60, stop_level=0.0)
    K = Gaussian(bandwidth=1.5)(X, X)
    assert factor.shape == (60, 20)
    torch.testing.assert_close(factor @ factor.T, K, rtol=0, atol=1e-10)


@pytest.mark.parametrize("stop_level", [1e-1, 1e-3])
def test_rpcholesky_stops_once_nothing_above_the_level_is_left(stop_level):
    X = torch.tensor(_data(400, seed=13)[0])
    factor = _rpcholesky(X, max_rank=400, stop_level=stop_level)
    left = torch.linalg.eigvalsh(Gaussian(bandwidth=1.5)(X, X) - factor @ factor.T)
    assert factor.shape[1] < 400
    assert left.min() > -1e-10  # F F^T stays below K
    assert left.max() <= 10 * stop_level


def test_rpcholesky_captures_a_small_distant_cluster_that_uniform_columns_miss():
    # Uniform columns find the 6 distant points about once in 60 draws; each one
    # missed leaves its diagonal entry, 1, in the trace of what the estimate misses.
    rng = np.random.RandomState(14)
    X = torch.tensor(np.vstack([rng.randn(594, 2), 10.0 + 0.3 * rng.randn(6, 2)]))
    K = Gaussian(bandwidth=1.0)(X, X)
    factor = _rpcholesky(X, max_rank=60, stop_level=0.0, bandwidth=1.0)
    sampled = torch.randperm(600, generator=torch.Generator().manual_seed(0))[:60]
    uniform = K[:, sampled] @ torch.linalg.pinv(K[sampled][:, sampled], hermitian=True) @ K[sampled]
    assert torch.trace(K - factor @ factor.T) < 0.1 * torch.trace(K - uniform)


@pytest.mark.parametrize("weighted", [False, True])
def test_rpcholesky_preconditioned_cg_reaches_the_exact_solution_in_fewer_iterations(weighted):
    alpha = 1e-3
    K, Y, weights, uniform = _system(400, 120, alpha, weighted)
    X = torch.tensor(_data(400)[0])
    rows = PenalisedRows(400, alpha, weights, torch.float64)
    pivoted = shifted_rpcholesky_preconditioner(Gaussian(bandwidth=1.5), X, rows, 120, torch.Generator().manual_seed(0))
    settings = CGSettings(tol=1e-9, max_iterations=400, n_iter_no_change=None)
    result = _solve(K, Y, weights, alpha, pivoted, settings)
    baseline = _solve(K, Y, weights, alpha, uniform, settings)
    inverse_weights = torch.ones(400, dtype=torch.float64) if weights is None else 1.0 / weights
    exact = torch.linalg.solve(K + alpha * torch.diag(inverse_weights), Y)
    assert result.converged and baseline.converged
    torch.testing.assert_close(K @ result.coef, K @ exact, rtol=0, atol=1e-7)
    assert result.n_steps < baseline.n_steps


@pytest.fixture
def criterion_subsample(monkeypatch):
    """The penalty's criterion takes 150 of its rows as its Nystrom subsample (2000 by default)."""
    monkeypatch.setattr(tune, "auto_subsample_size", lambda n_rows: min(n_rows, 150))


@pytest.mark.parametrize("feature_learning", [None, "auto"])
def test_cg_on_every_point_reads_the_penalty_criterions_spectrum(
    beyond_factors, criterion_subsample, decompositions, feature_learning
):
    # The criterion decomposes a subsample of the kernel it scored; a CG fit of that kernel with as many
    # subsample rows estimates its condition from those eigenvalues, without a decomposition of its own
    # (the plain model on the held-out split and the refit on every row, with feature learning).
    X, Y = _data(500, seed=14)
    y = (Y[:, 0] > 0).astype(int)
    params = dict(subsample_size=150, solver="cg", random_state=0, feature_learning=feature_learning)
    model = AdaptiveKernelClassifier(**params).fit(X, y)
    assert model.solver_ == "cg" and model.alpha_selection_.n_features > 0
    assert ("eigh", 150) in decompositions and ("eigvalsh", 150) not in decompositions
    assert model.alpha_selection_.nystrom_eigenvalues.shape == (150,)


def test_cg_on_every_point_decomposes_its_own_subsample_where_the_criterions_is_of_another_size(
    beyond_factors, criterion_subsample, decompositions
):
    X, Y = _data(500, seed=14)
    params = dict(subsample_size=170, solver="cg", random_state=0, feature_learning=None)
    model = AdaptiveKernelRegressor(**params).fit(X, Y[:, 0])
    assert model.solver_ == "cg" and model.alpha_selection_.nystrom_eigenvalues.shape == (150,)
    assert ("eigh", 150) in decompositions and ("eigvalsh", 170) in decompositions


def test_the_criterions_spectrum_serves_only_the_kernel_it_scored():
    spectrum = np.array([1.0, 0.5])
    selection = AlphaSelection(0.01, np.array([0.01]), np.array([1.0]), 10, 10.0, 2, nystrom_eigenvalues=spectrum)
    kernel = Gaussian(bandwidth=1.0)
    # Every row of a 20-row problem, alpha by leave-one-out: the policy's part of a resolved plan.
    policy = plan_kernel_fit(KernelProblem(20, 2, 1, 8), 10**9, KernelFitParameters())
    tuned = dataclasses.replace(policy, kernel=kernel, tuned=True, alpha_selection=selection, by_rule=False, n_rows=20)
    assert _tuned_spectrum(tuned, kernel) is spectrum
    assert _tuned_spectrum(tuned, Gaussian(bandwidth=1.0)) is None  # the rule's, on the training rows
    assert tuned.pinned().alpha_selection.nystrom_eigenvalues is None  # other features, X L
    assert tuned.pinned().alpha_selection.penalty == selection.penalty

    by_rule = dataclasses.replace(tuned, by_rule=True)
    for bandwidth, kept in [(1.0, True), (0.9, False)]:  # the rule's bandwidth on the subset's rows
        resolved = dataclasses.replace(policy, kernel=Gaussian(bandwidth=bandwidth))
        applied = applied_tuning(by_rule, resolved)
        assert (applied.alpha_selection.nystrom_eigenvalues is spectrum) == kept
