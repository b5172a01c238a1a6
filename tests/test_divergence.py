"""The one divergence rule, the unfinished-CG rule, the 16-bit cache's bound and the last check (issue 62).

Planning's rules are table-tested at their boundaries; the estimator tests show the
driver acting on them (a warned fallback away from a named solver, the last check
turning a model worse than the trivial one into a recorded fallback).
"""

import math

import numpy as np
import pytest
import torch

import skgpu_kernel.planning.eigenpro as planning_eigenpro
import skgpu_kernel.planning.kernel as planning_kernel
import skgpu_kernel.planning.solver as planning_solver
from skgpu_kernel import AdaptiveKernelRegressor
from skgpu_kernel.planning.kernel import HALF_ROUNDING, HALF_ROUNDING_SHARE, half_cache_harmless
from skgpu_kernel.planning.parameters import KernelFitParameters
from skgpu_kernel.planning.stopping import (
    CG_RESIDUAL_CEILING,
    FIT_CHECK_ROWS,
    HELD_OUT_CHECK_ROWS,
    HELD_OUT_CHECK_SHARE,
    DivergenceRule,
    fit_check_rows,
    held_out_check_limit,
    plan_cg_stopping,
    plan_divergence,
    worse_than_trivial,
)
from skgpu_kernel.solvers import fit_check

RULE = DivergenceRule(ceiling=10.0, growth=2.0, window=1, best_slack=1e-3)


@pytest.mark.parametrize(
    ("value", "lowest", "reference", "floor", "expected"),
    [
        (math.nan, 1.0, 1.0, -math.inf, "not finite"),
        (math.inf, 1.0, 1.0, -math.inf, "not finite"),
        (10.0, math.inf, 1.0, -math.inf, None),  # at the ceiling: not above it
        (10.000001, math.inf, 1.0, -math.inf, "above the zero model"),
        (2.0, 1.0, 100.0, -math.inf, None),  # growth 2: exactly twice the lowest is allowed
        (2.000001, 1.0, 100.0, -math.inf, "grew"),
        (0.3, 0.01, 100.0, 0.2, None),  # below the floor's growth: noise
        (0.41, 0.01, 100.0, 0.2, "grew"),
        (-0.5, -1.0, None, -math.inf, None),  # a negative merit may rise by its size
        (0.01, -1.0, None, -math.inf, "grew"),
    ],
)
def test_the_divergence_rule_at_its_boundaries(value, lowest, reference, floor, expected):
    assert RULE.exceeded(value, lowest, reference, floor) == expected


@pytest.mark.parametrize(
    ("last", "best", "reference", "expected"),
    [(1.0, 1.0, 2.0, False), (1.002, 1.0, 2.0, False), (1.0021, 1.0, 2.0, True), (math.nan, 1.0, 2.0, True)],
)
def test_an_unconverged_run_keeps_its_best_iterate_beyond_the_slack(last, best, reference, expected):
    assert RULE.keeps_best(last, best, reference) is expected


def test_each_solver_measure_has_its_rule():
    assert plan_divergence("epoch loss").ceiling == 1e4 and plan_divergence("epoch loss").growth == 1.5
    assert plan_divergence("merit").ceiling is None and plan_divergence("merit").window == 1
    objective = plan_divergence("objective")
    assert (objective.ceiling, objective.growth, objective.window) == (10.0, 10.0, 3)


@pytest.mark.parametrize(
    ("stop", "residual", "float64", "unfinished"),
    [
        ("converged", 50.0, False, False),
        ("objective", CG_RESIDUAL_CEILING, False, False),
        ("objective", 1.0001 * CG_RESIDUAL_CEILING, False, True),  # issue 62: no progress on the system
        ("iterations", 1e-2, False, False),
        ("iterations", 1.01e-2, False, True),
        ("iterations", 1e-6, True, False),
        ("iterations", 1.01e-6, True, True),
        ("diverged", 5.0, False, True),
    ],
)
def test_cg_is_unfinished_above_its_stated_residual_or_above_its_start(stop, residual, float64, unfinished):
    assert plan_cg_stopping(1e-4, 3, float64).unfinished(stop, residual) is unfinished


@pytest.mark.parametrize(
    ("n_rows", "penalty", "harmless"),
    [
        (1000, None, True),  # EigenPro 2 needs no definiteness
        (1000, 1000 * HALF_ROUNDING / HALF_ROUNDING_SHARE, True),
        (1001, 1000 * HALF_ROUNDING / HALF_ROUNDING_SHARE, False),
        (47030, 0.026, False),  # the table of issue 62
    ],
)
def test_a_16_bit_cache_only_within_its_rounding_bound(n_rows, penalty, harmless):
    assert half_cache_harmless(n_rows, penalty) is harmless


def test_the_16_bit_cache_is_planned_for_eigenpro_and_refused_to_cg_beyond_its_bound():
    problem = planning_kernel.KernelProblem(20_000, 8, 1, 4, 0, unit_bounded_kernel=True)
    settings = KernelFitParameters()
    # room for the 16-bit cache, not the 32-bit one
    budget = int(2.5 * 20_000**2)

    def itemsize(penalty):
        layout = planning_eigenpro.plan_eigenpro2_layout(problem, budget, torch.device("cpu"), settings, penalty)
        return layout.cache_itemsize

    assert itemsize(None) == 2
    assert itemsize(0.5) == 0
    assert itemsize(20_000 * HALF_ROUNDING / HALF_ROUNDING_SHARE) == 2


@pytest.mark.parametrize(
    ("mean", "error", "worse"), [(1.0, 0.5, False), (1.0, 0.49, True), (0.0, 0.0, False), (-1.0, 0.01, False)]
)
def test_worse_than_trivial_is_two_standard_errors_above(mean, error, worse):
    assert worse_than_trivial(mean, error) is worse


def test_the_last_check_scores_evenly_spaced_rows_without_a_draw():
    rows = fit_check_rows(10 * FIT_CHECK_ROWS)
    assert rows.size == FIT_CHECK_ROWS and rows[0] == 0 and rows[-1] == 10 * FIT_CHECK_ROWS - 1
    assert np.all(np.diff(rows) > 0)
    rng = np.random.RandomState(0)
    Y = rng.randn(500, 2)
    good = fit_check.check_fit(lambda rows: Y[rows] + 0.1 * rng.randn(rows.size, 2), Y, np.ones(500))
    assert good.passed and good.n_rows == 500 and good.model_loss < 0.05 * good.trivial_loss
    nan = fit_check.check_fit(lambda rows: np.full((rows.size, 2), np.nan), Y, np.ones(500))
    assert not nan.passed and nan.model_loss == math.inf


@pytest.mark.parametrize(
    ("n_fitted", "limit"),
    [
        (10, FIT_CHECK_ROWS),
        (HELD_OUT_CHECK_SHARE * FIT_CHECK_ROWS, FIT_CHECK_ROWS),
        (HELD_OUT_CHECK_SHARE * (FIT_CHECK_ROWS + 1) - 1, FIT_CHECK_ROWS),
        (HELD_OUT_CHECK_SHARE * (FIT_CHECK_ROWS + 1), FIT_CHECK_ROWS + 1),
        (52_200, 1631),
        (HELD_OUT_CHECK_SHARE * HELD_OUT_CHECK_ROWS, HELD_OUT_CHECK_ROWS),
        (10**7, HELD_OUT_CHECK_ROWS),
    ],
)
def test_the_held_out_check_scores_one_in_32_training_rows_within_its_bounds(n_fitted, limit):
    """Its cost is at most 1/32 of one pass of the fit over its rows' kernel rows (issue 77: 4096 rows were 6%)."""
    assert held_out_check_limit(n_fitted) == limit
    Y = np.arange(5000.0)[:, None]
    scored = []

    def predict(rows):
        scored.append(rows.size)
        return Y[rows]

    check = fit_check.check_fit(predict, Y, np.ones(5000), trivial=np.zeros(1), limit=limit)
    assert scored == [min(limit, 5000)] and check.n_rows == min(limit, 5000) and check.held_out


def test_weights_enter_the_last_check():
    """Rows of weight zero do not count: a model wrong only there passes."""
    Y = np.arange(100.0)[:, None]
    weights = np.r_[np.ones(50), np.zeros(50)]
    wrong_where_absent = lambda rows: np.where(Y[rows] < 50, Y[rows], -1e6)  # noqa: E731
    assert fit_check.check_fit(wrong_where_absent, Y, weights).passed
    assert not fit_check.check_fit(wrong_where_absent, Y, np.ones(100)).passed


def test_a_fallback_away_from_a_named_solver_warns(monkeypatch):
    """``solver="cg"`` whose preconditioned system is too ill-conditioned becomes EigenPro 2, with a warning."""
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)
    rng = np.random.RandomState(0)
    X = rng.randn(400, 4)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(400)
    with pytest.warns(UserWarning, match="solver='cg' was not kept"):
        model = AdaptiveKernelRegressor(solver="cg", alpha=1e-6, bandwidth=2.0, feature_learning=None).fit(X, y)
    assert [attempt["solver"] for attempt in model.fit_attempts_] == ["cg", "eigenpro"]


def test_a_model_that_fails_the_last_check_is_refit_and_recorded(monkeypatch):
    """A model made worse than the trivial one after its solver returned: the driver refits it, recorded."""
    from skgpu_kernel.fit import solve

    run = solve._run_attempt
    spoiled = {"n": 0}

    def spoil_the_first(*arguments):
        outcome = run(*arguments)
        if spoiled["n"] == 0 and outcome.device_cache is not None:
            spoiled["n"] += 1
            coef = -50.0 * outcome.device_cache.coef
            return solve.dataclasses.replace(outcome, device_cache=outcome.device_cache.with_coef(coef))
        return outcome

    monkeypatch.setattr(solve, "_run_attempt", spoil_the_first)
    rng = np.random.RandomState(0)
    X = rng.randn(300, 3)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(300)
    params = dict(solver="cg", alpha=0.1, bandwidth=2.0, feature_learning=None, n_centers=50)
    with pytest.warns(UserWarning, match="trivial predictor"):
        model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert [attempt["alpha"] for attempt in model.fit_attempts_] == [0.1, 1.0]
    assert "trivial predictor" in model.fit_attempts_[1]["reason"] and model.fit_check_["passed"]
