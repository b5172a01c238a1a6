"""The direct solve (issue 51): the tune stage's eigendecomposition, or one factorisation, gives the exact model."""

import dataclasses

import numpy as np
import pytest
import torch

import skgpu_kernel.fit.registry as registry
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian, Laplacian
from skgpu_kernel.operators import EvaluatedOperator, OperatorBlocks
from skgpu_kernel.regularization import select_alpha
from skgpu_kernel.solvers.direct import solve_direct
from skgpu_kernel.solvers.solution import Targets


def _data(n, seed, d=5):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, (n, d))
    return X, np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)


def _normal_equations(K, Y, w, alpha):
    """``(a, b)`` of ``min sum_i w_i (y_i - (K a)_i - b)^2 + alpha a^T K a`` by a dense solve (float64)."""
    total = w.sum()
    P = np.diag(w) - np.outer(w, w) / total
    a = np.linalg.solve(P @ K + alpha * np.eye(K.shape[0]), P @ Y)
    return a, w @ (Y - K @ a) / total


@pytest.mark.parametrize("kernel", [Gaussian(bandwidth=0.8), Laplacian(bandwidth=1.5)])
@pytest.mark.parametrize("penalty", [1e-7, 1e-3, 0.3])
def test_the_criterion_solution_is_the_penalised_least_squares_model_with_an_intercept(kernel, penalty):
    X, y = _data(300, 0)
    rng = np.random.RandomState(1)
    w = rng.uniform(0.5, 2.0, 300)
    Y = np.stack([y, rng.randn(300)], axis=1)
    as_tensor = torch.as_tensor
    selection = select_alpha(kernel, as_tensor(X), as_tensor(Y), as_tensor(w), 300, penalties=[penalty])
    K = kernel(as_tensor(X), as_tensor(X)).numpy()
    a, b = _normal_equations(K, Y, w, selection.alpha)
    X_test = rng.uniform(-1, 1, (100, 5))
    K_test = kernel(as_tensor(X_test), as_tensor(X)).numpy()
    expected = K_test @ a + b
    found = K_test @ selection.solution.coef.numpy() + selection.solution.intercept.numpy()
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-8 * np.abs(expected).max())


def test_a_nystrom_criterion_has_no_solution():
    X, y = _data(400, 2)
    selection = select_alpha(Gaussian(bandwidth=0.8), torch.as_tensor(X), torch.as_tensor(y[:, None]), None, 100)
    assert selection.solution is None


def test_default_small_regression_is_solved_directly_and_equals_cg_to_its_tolerance():
    X, y = _data(500, 3)
    X_test, _ = _data(200, 4)
    weights = np.random.RandomState(5).uniform(0.5, 2.0, 500)
    direct = AdaptiveKernelRegressor(dtype="float64", random_state=0).fit(X, y, sample_weight=weights)
    cg = AdaptiveKernelRegressor(dtype="float64", random_state=0, solver="cg").fit(X, y, sample_weight=weights)
    assert direct.solver_ == "direct" and cg.solver_ == "cg"
    assert direct.alpha_ == cg.alpha_ > 0 and direct.bandwidth_ == cg.bandwidth_
    assert direct.n_epochs_ == 0 and direct.history_ == [] and direct.n_centers_ == 500
    assert direct.fit_attempts_ == [{"solver": "direct", "alpha": direct.alpha_, "reason": "planned"}]
    assert direct.alpha_selection_.solution is None  # the fitted attribute keeps the criterion, not the model
    predictions = direct.predict(X_test)
    np.testing.assert_allclose(predictions, cg.predict(X_test), rtol=0, atol=1e-5 * np.abs(predictions).max())


def test_default_small_classifier_is_solved_directly_and_predicts_as_cg():
    X, y = _data(400, 6)
    labels = np.digitize(y, [-0.5, 0.5])  # three classes
    X_test, y_test = _data(300, 7)
    direct = AdaptiveKernelClassifier(random_state=0).fit(X, labels)
    cg = AdaptiveKernelClassifier(random_state=0, solver="cg").fit(X, labels)
    assert direct.solver_ == "direct" and cg.solver_ == "cg"
    np.testing.assert_allclose(direct.decision_function(X_test), cg.decision_function(X_test), rtol=0, atol=1e-3)
    assert np.mean(direct.predict(X_test) == np.digitize(y_test, [-0.5, 0.5])) > 0.8


@pytest.mark.parametrize("params", [{"solver": "cg"}, {"n_centers": 200}, {"tol": None, "n_epochs": 3}])
def test_no_direct_solve_where_the_user_asks_for_an_iterative_solver_centers_or_every_iteration(params):
    X, y = _data(400, 8)
    model = AdaptiveKernelRegressor(random_state=0, **params).fit(X, y)
    assert model.solver_ != "direct"


@pytest.mark.parametrize("params", [{"fit_intercept": False}, {"alpha": 0.1}])
def test_a_model_the_criterion_did_not_solve_is_factored_instead(params):
    X, y = _data(400, 8)
    model = AdaptiveKernelRegressor(random_state=0, **params).fit(X, y)
    assert model.solver_ == "direct" and model.fit_attempts_[-1]["reason"] == "planned"


def _penalised_solution(model, X, y, weights):
    """The dense float64 normal equations' model at ``model``'s kernel and ``alpha_``, predicting ``X``."""
    K = model.kernel_(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    if model.fit_intercept:
        a, b = _normal_equations(K, y[:, None], weights, model.alpha_)
        return lambda rows: (model.kernel_(torch.as_tensor(rows), torch.as_tensor(X)).numpy() @ a)[:, 0] + b[0]
    a = np.linalg.solve(K + model.alpha_ * np.diag(1.0 / weights), y)
    return lambda rows: model.kernel_(torch.as_tensor(rows), torch.as_tensor(X)).numpy() @ a


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha", [1e-4, 0.3])
def test_the_factored_solve_is_the_weighted_penalised_least_squares_model(fit_intercept, alpha):
    X, y = _data(600, 10)
    weights = np.random.RandomState(11).uniform(0.5, 2.0, 600)
    X_test, _ = _data(200, 12)
    model = AdaptiveKernelRegressor(dtype="float64", random_state=0, alpha=alpha, fit_intercept=fit_intercept)
    model.fit(X, y, sample_weight=weights)
    assert model.solver_ == "direct" and model.n_epochs_ == 0 and model.alpha_ == alpha
    expected = _penalised_solution(model, X, y, weights)(X_test)
    np.testing.assert_allclose(model.predict(X_test), expected, rtol=0, atol=1e-8 * np.abs(expected).max())


def test_above_the_criterion_rows_the_default_fit_is_factored_and_matches_cg():
    X, y = _data(2600, 13)
    X_test, _ = _data(300, 14)
    direct = AdaptiveKernelRegressor(dtype="float64", random_state=0).fit(X, y)
    # The default keeps the plain kernel of its learning path (candidate 0); CG is
    # fitted to that kernel.  (With solver="cg" on the learning path too, its
    # candidates take the criterion's alpha where the default's are unpenalised, and
    # may keep another metric: CG on every point needs a penalty, issue 77.)
    cg = AdaptiveKernelRegressor(dtype="float64", random_state=0, solver="cg", feature_learning=None).fit(X, y)
    assert direct.feature_learning_iteration_ == 0
    assert direct.solver_ == "direct" and cg.solver_ == "cg" and direct.alpha_ == cg.alpha_ > 0
    assert direct.n_centers_ == 2600
    predictions = direct.predict(X_test)
    np.testing.assert_allclose(predictions, cg.predict(X_test), rtol=0, atol=1e-4 * np.abs(predictions).max())


def test_a_factorisation_rounding_breaks_falls_back_to_cg_and_is_recorded(monkeypatch):
    X, y = _data(400, 15)
    direct = registry.registered_solver("direct")
    failing = dataclasses.replace(direct, solve=lambda operator, targets, plan: None)
    monkeypatch.setitem(registry._SOLVERS, "direct", failing)
    model = AdaptiveKernelRegressor(dtype="float64", random_state=0, alpha=0.1).fit(X, y)
    assert [entry["solver"] for entry in model.fit_attempts_] == ["direct", "cg"]
    assert "direct found no solution of K + alpha W^-1 on" in model.fit_attempts_[1]["reason"]
    assert model.solver_ == "cg" and model.alpha_ == 0.1


def test_solve_direct_refuses_a_system_rounding_leaves_indefinite():
    rows = torch.zeros(50, 3, dtype=torch.float64)  # K is all ones: rank one
    kernel = Gaussian(bandwidth=1.0)
    operator = EvaluatedOperator(kernel, rows, kernel.prepare_centers(rows), OperatorBlocks.whole(50, 50))
    targets = Targets(torch.ones(50, 1, dtype=torch.float64))
    assert solve_direct(operator, targets, -1e-3) is None
    solved = solve_direct(operator, targets, 0.5)
    assert solved.converged
    np.testing.assert_allclose(solved.coef.numpy(), np.full((50, 1), 1.0 / 50.5), rtol=1e-12)


def test_a_warm_start_after_a_direct_solve_continues_by_cg_from_its_solution():
    X, y = _data(300, 9)
    model = AdaptiveKernelRegressor(random_state=0, dtype="float64", warm_start=True).fit(X, y)
    first = model.predict(X)
    assert model.solver_ == "direct"
    model.fit(X, y)
    assert model.solver_ == "cg"
    np.testing.assert_allclose(model.predict(X), first, rtol=0, atol=1e-6 * np.abs(first).max())
