"""Issue 79 item 2: a solver is one module plus one registry entry.

The solver below is defined here, in the test file, registered through the
registry the package itself uses (:mod:`skgpu_kernel.fit.registry`), and fitted
through :class:`~skgpu_kernel.AdaptiveKernelRegressor` with no other change to
the package: the ``solver`` parameter's allowed values and docs read the registry.
"""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.kernel_ridge import KernelRidge
from sklearn.utils._param_validation import InvalidParameterError

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.fit.registry import register_solver, registered_solver, solver_docs, unregister_solver
from skgpu_kernel.solvers import Solution

NAME = "dense_lstsq"


def plan_dense_lstsq(problem, budget, alpha):
    """The toy solver's planning rule: its penalty, where two ``n x n`` float64 matrices fit the budget."""
    if 2 * 8 * problem.n_rows**2 > budget:
        raise ValueError(f"solver={NAME!r} needs two {problem.n_rows} x {problem.n_rows} matrices")
    return alpha


def solve_dense_lstsq(operator, targets, plan):
    """``(K + alpha W^-1) a = Y`` by a dense least-squares solve (no factorisation the package has)."""
    gram = operator.block()
    penalties = torch.full_like(gram[:, 0], plan) if targets.weights is None else plan / targets.weights
    system = gram + torch.diag(penalties)
    return Solution.direct(torch.linalg.lstsq(system, targets.Y).solution)


@pytest.fixture
def dense_lstsq():
    registered = register_solver(NAME, plan_dense_lstsq, solve_dense_lstsq, "a dense least-squares solve.")
    yield registered
    unregister_solver(NAME)


def _data(n=300, d=4, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, (n, d))
    return X, np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)


def _fast(**params):
    return {"bandwidth": 0.8, "dtype": "float64", "feature_learning": None, "random_state": 0, **params}


def test_a_solver_defined_in_a_test_file_fits_through_the_estimator(dense_lstsq):
    """The registered solver is the fit's; its model is kernel ridge's, to float64's rounding."""
    X, y = _data()
    model = AdaptiveKernelRegressor(**_fast(solver=NAME, alpha=0.05, fit_intercept=False)).fit(X, y)
    assert model.solver_ == NAME and model.alpha_ == 0.05
    assert [attempt["solver"] for attempt in model.fit_attempts_] == [NAME]
    reference = KernelRidge(alpha=0.05, kernel="rbf", gamma=1 / (2 * 0.8**2)).fit(X, y)
    X_test = _data(200, seed=1)[0]
    np.testing.assert_allclose(model.predict(X_test), reference.predict(X_test), rtol=0, atol=1e-8)


def test_the_registered_solver_gives_the_direct_solvers_model_with_an_intercept_and_weights(dense_lstsq):
    """With the intercept's column and sample weights, the same model as the package's own direct solve."""
    X, y = _data()
    weights = np.random.RandomState(2).uniform(0.5, 2.0, X.shape[0])
    ours = AdaptiveKernelRegressor(**_fast(solver=NAME, alpha=0.05)).fit(X, y, sample_weight=weights)
    direct = AdaptiveKernelRegressor(**_fast(solver="direct", alpha=0.05)).fit(X, y, sample_weight=weights)
    assert ours.solver_ == NAME and direct.solver_ == "direct"
    np.testing.assert_allclose(ours.predict(X), direct.predict(X), rtol=0, atol=1e-8)


def test_a_named_solver_takes_the_criterions_penalty(dense_lstsq):
    """``alpha="auto"`` with a named solver other than EigenPro: the leave-one-out criterion's ``alpha > 0``."""
    X, y = _data()
    ours = AdaptiveKernelRegressor(**_fast(solver=NAME)).fit(X, y)
    direct = AdaptiveKernelRegressor(**_fast(solver="direct")).fit(X, y)
    assert ours.alpha_ == direct.alpha_ > 0
    np.testing.assert_allclose(ours.predict(X), direct.predict(X), rtol=0, atol=1e-8)


def test_a_classifier_fits_with_the_registered_solver(dense_lstsq):
    X, y = _data()
    labels = y > np.median(y)
    model = AdaptiveKernelClassifier(**_fast(solver=NAME, alpha=0.05)).fit(X, labels)
    assert model.solver_ == NAME and model.score(X, labels) > 0.9


def test_the_parameter_and_its_docs_read_the_registry(dense_lstsq):
    """Accepted and documented while registered; refused, naming the registered ones, once removed."""
    heading, paragraphs = solver_docs()
    assert f'"{NAME}"' in heading and any(NAME in text for text in paragraphs)
    estimator = AdaptiveKernelRegressor(solver=NAME)
    assert clone(estimator).get_params()["solver"] == NAME
    unregister_solver(NAME)
    try:
        with pytest.raises(InvalidParameterError, match="'cg'"):
            AdaptiveKernelRegressor(**_fast(solver=NAME)).fit(*_data(50))
        assert NAME not in solver_docs()[0]
    finally:
        register_solver(NAME, plan_dense_lstsq, solve_dense_lstsq, "a dense least-squares solve.")


def test_a_solver_without_a_path_on_centers_is_refused_before_the_fit(dense_lstsq):
    with pytest.raises(ValueError, match="cannot fit a model on centers"):
        AdaptiveKernelRegressor(**_fast(solver=NAME, n_centers=50)).fit(*_data())


def test_its_planning_rule_refuses_what_cannot_run_with_its_message(dense_lstsq):
    X, y = _data()
    with pytest.raises(ValueError, match="needs two 300 x 300 matrices"):
        AdaptiveKernelRegressor(**_fast(solver=NAME, alpha=0.05, memory_budget=10**6)).fit(X, y)


def test_a_solver_that_finds_no_solution_falls_back_to_cg_and_is_recorded(dense_lstsq):
    X, y = _data()
    register_solver("finds_none", plan_dense_lstsq, lambda operator, targets, plan: None, "finds nothing.")
    try:
        with pytest.warns(UserWarning, match="solver='finds_none' was not kept: finds_none found no solution"):
            model = AdaptiveKernelRegressor(**_fast(solver="finds_none", alpha=0.05)).fit(X, y)
    finally:
        unregister_solver("finds_none")
    assert [attempt["solver"] for attempt in model.fit_attempts_] == ["finds_none", "cg"]
    assert model.solver_ == "cg"


@pytest.mark.parametrize("name", ["auto", "cg", "", None])
def test_register_refuses_a_name_taken_or_empty(name):
    with pytest.raises(ValueError, match="new non-empty string"):
        register_solver(name, plan_dense_lstsq, solve_dense_lstsq, "")


def test_the_packages_own_solvers_cannot_be_removed():
    with pytest.raises(ValueError, match="package's own"):
        unregister_solver("direct")
    assert registered_solver("direct").solve is not None
