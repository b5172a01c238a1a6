"""The kernel solvers' one driver and registry (issue 42): fallbacks recorded, every operator kind the same model."""

import dataclasses
import functools
import inspect
import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

import skgpu_kernel.fit.cg as cg_attempts
import skgpu_kernel.fit.registry as registry
import skgpu_kernel.operators as operators
import skgpu_kernel.planning.solver as planning_solver
from skgpu_kernel import AdaptiveKernelRegressor
from skgpu_kernel.grid import find_grid
from skgpu_kernel.operators import CachedOperator


def _on_grid(n=400, d=5, seed=0):
    """Integer features in 0..7 (a grid of step 1) and a smooth target."""
    rng = np.random.RandomState(seed)
    X = rng.randint(0, 8, size=(n, d)).astype(np.float64)
    return X, np.sin(X[:, 0] / 2) + np.cos(X[:, 1] / 3) + 0.1 * rng.randn(n)


@pytest.fixture
def beyond_factors(monkeypatch):
    """Fits of more than 200 rows with every point a center take CG on every point (not on its factors)."""
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)


def test_the_registry_names_an_attempt_per_solver_and_model():
    """Each solver's attempt is a function of the attempt's context and the attempt (issue 51: no class hierarchy)."""
    attempts = {
        (name, on_centers): registry.registered_solver(name).attempt(on_centers)
        for name in ("cg", "direct", "eigenpro")
        for on_centers in (False, True)
    }
    assert {key for key, attempt in attempts.items() if attempt is None} == {("direct", True)}
    for attempt in attempts.values():
        if attempt is None:
            continue
        function = attempt.func if isinstance(attempt, functools.partial) else attempt
        assert inspect.isfunction(function), attempt
        parameters = list(inspect.signature(attempt).parameters)
        assert parameters[:2] == ["context", "attempt"], attempt


# The registry's solvers, each with the operator kinds it plans for: parameters that make it
# evaluate K or cache it, from float or grid (int8) products.
SOLVER_CASES = {
    "eigenpro2": {"solver": "eigenpro", "alpha": 0.0, "batch_size": 64, "n_epochs": 4},
    "cg every point": {"solver": "cg", "alpha": 0.5, "n_epochs": 60},
    "eigenpro3": {"solver": "eigenpro", "n_centers": 120, "batch_size": 64, "n_epochs": 3},
    "cg centers": {"solver": "cg", "alpha": 0.5, "n_centers": 120, "n_epochs": 60},
}
# The int8 products' measured speed-up; None: the rows treated as on no grid (float blocks).
EVERY_POINT_KINDS = [
    ("evaluated", False, None),
    ("cached", True, None),
    ("grid", False, 100.0),
    ("grid cached", True, 100.0),
    ("grid float32 products", False, 1.0),
]
OPERATOR_KINDS = {
    "eigenpro2": EVERY_POINT_KINDS,
    "cg every point": EVERY_POINT_KINDS,
    "eigenpro3": EVERY_POINT_KINDS,
    "cg centers": [("evaluated", "auto", None), ("grid", "auto", 100.0), ("grid float32 products", "auto", 1.0)],
}


@pytest.mark.parametrize("case", SOLVER_CASES)
def test_every_solver_fits_the_same_model_on_each_operator_kind_it_plans_for(beyond_factors, monkeypatch, case):
    """float64: each kind of ``K @ V`` (evaluated, cached, from a grid's distances): the same fit within 1e-10.

    The grid's distances by int8 or by float32 products: the same model to the bit.
    """
    X, y = _on_grid()
    X_test = X[::7] + 0.5
    predictions = {}
    for kind, cache_kernel, speedup in OPERATOR_KINDS[case]:
        on_grid = speedup is not None
        monkeypatch.setattr(operators.core, "find_grid", find_grid if on_grid else lambda rows: None)
        monkeypatch.setattr(operators.core, "integer_matmul_speedup", lambda *args, speedup=speedup: speedup or 0.0)
        params = dict(SOLVER_CASES[case], bandwidth=2.0, dtype="float64", random_state=0, tol=None)
        model = AdaptiveKernelRegressor(cache_kernel=cache_kernel, **params).fit(X, y)
        assert model.solver_ == params["solver"], kind
        assert (model.kernel_grid_step_ is not None) == kind.startswith("grid"), kind
        if case == "cg centers":
            assert model.kernel_cached_, kind  # K(X, Z) of 120 centers fits the budget: CG stores it
        elif cache_kernel is not True or case == "cg every point":
            assert model.kernel_cached_ == (cache_kernel is True), kind
        predictions[kind] = model.predict(X_test)
    reference = predictions["evaluated"]
    for kind, values in predictions.items():
        np.testing.assert_allclose(values, reference, rtol=1e-10, atol=1e-10 * np.abs(reference).max(), err_msg=kind)
    np.testing.assert_array_equal(predictions["grid float32 products"], predictions["grid"])


def test_a_staged_cg_breakdown_is_refitted_and_recorded(monkeypatch):
    """CG that rounding breaks down (staged here on the first run) is refitted with ten times alpha by the driver."""
    X, y = _on_grid(seed=1)
    solve = cg_attempts.solve_centers_cg
    calls = []

    def breaks_down_once(operator, targets, plan):
        solved = solve(operator, targets, plan)
        calls.append(plan.alpha)
        if len(calls) > 1:
            return solved
        history = [{**solved.history[-1], "relative_residual": 0.5}]
        return dataclasses.replace(solved, history=history, stop="curvature")

    monkeypatch.setattr(cg_attempts, "solve_centers_cg", breaks_down_once)
    params = {"solver": "cg", "alpha": 0.5, "n_centers": 120, "bandwidth": 2.0, "random_state": 0}
    with pytest.warns(ConvergenceWarning, match="Refitting from there with alpha=5"):
        model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert calls == [0.5, 5.0]
    assert [(a["solver"], a["alpha"]) for a in model.fit_attempts_] == [("cg", 0.5), ("cg", 5.0)]
    assert model.fit_attempts_[0]["reason"] == "planned"
    assert "curvature" in model.fit_attempts_[1]["reason"]
    assert model.alpha_ == 5.0 and model.solver_ == "cg"


def test_a_planned_fit_records_one_attempt():
    X, y = _on_grid(seed=2)
    model = AdaptiveKernelRegressor(solver="eigenpro", alpha=0.0, n_epochs=2, random_state=0).fit(X, y)
    assert model.fit_attempts_ == [{"solver": "eigenpro", "alpha": 0.0, "reason": "planned"}]


def test_an_ill_conditioned_cg_on_every_point_is_recorded_as_fitted_by_eigenpro(beyond_factors, without_cg_basis):
    X, y = _on_grid(n=500, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = AdaptiveKernelRegressor(bandwidth=2.0, alpha=1e-7, subsample_size=150, random_state=0).fit(X, y)
    assert [a["solver"] for a in model.fit_attempts_] == ["cg", "eigenpro"]
    assert "condition" in model.fit_attempts_[1]["reason"] and model.solver_ == "eigenpro"


def test_a_refused_kernel_cache_is_planned_again_without_it(monkeypatch):
    def refuse(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.48 GiB")

    X, y = _on_grid(seed=4)
    params = {"bandwidth": 2.0, "alpha": 0.0, "solver": "eigenpro", "dtype": "float64", "random_state": 0}
    computed = AdaptiveKernelRegressor(cache_kernel=False, n_epochs=3, **params).fit(X, y)
    monkeypatch.setattr(CachedOperator, "fill", refuse)
    with pytest.warns(RuntimeWarning, match="planned again with kernel blocks computed per batch"):
        model = AdaptiveKernelRegressor(n_epochs=3, **params).fit(X, y)
    # The run, the cache fill's out-of-memory event (tests/test_out_of_memory.py), the run planned again.
    assert [a["reason"].startswith("the kernel cache") for a in model.fit_attempts_] == [False, False, True]
    assert model.fit_attempts_[1]["event"] == "out_of_memory"
    assert not model.kernel_cached_ and model.batch_size_ == computed.batch_size_
    np.testing.assert_array_equal(model.dual_coef_, computed.dual_coef_)
