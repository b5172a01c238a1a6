"""Large-data defaults (issue 27): n_centers="auto", distinct centers, CG storing K(X, Z), CG's residual warning.

The planner's table is in tests/test_planning_kernel.py; here the estimators carry
its choices out.  References: the CG fit that evaluates K(X, Z) every iteration,
and the exact penalised least-squares solution on the centers (numpy, float64).
"""

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

from skgpu_kernel import AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian


def _regression(n, d, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.rand(n, d)
    return X, np.sin(4 * X[:, 0]) + X[:, 1:].sum(1) + 0.05 * rng.randn(n)


def _cg(capsys, budget, **params):
    X, y = _regression(3000, 5)
    model = AdaptiveKernelRegressor(
        n_centers=200, solver="cg", alpha=1e-3, dtype="float64", memory_budget=budget, verbose=1, random_state=0
    )
    model.set_params(**params).fit(X, y)
    return model, capsys.readouterr().out


def test_cg_storing_k_xz_equals_cg_evaluating_it(capsys):
    # 3000 rows x 200 centers in float64: data 0.17 MB, factors 0.64 MB, a row block
    # 3.3 MB without K(X, Z); K(X, Z) is 4.8 MB more.
    evaluated, log_evaluated = _cg(capsys, "5MB")
    stored, log_stored = _cg(capsys, "50MB")
    assert "K(X, Z): kernel evaluated per product" in log_evaluated
    assert "K(X, Z): kernel cached in float64" in log_stored
    assert evaluated.solver_ == stored.solver_ == "cg"
    assert stored.kernel_cached_ and stored.kernel_cache_dtype_ == "float64" and not evaluated.kernel_cached_
    np.testing.assert_allclose(stored.dual_coef_, evaluated.dual_coef_, rtol=0, atol=1e-8)
    assert stored.n_epochs_ == evaluated.n_epochs_


def _gaussian(X, Z, bandwidth):
    return Gaussian(bandwidth=bandwidth)(torch.as_tensor(X), torch.as_tensor(Z)).numpy()


def _exact_on_centers(X, y, Z, bandwidth, alpha):
    """Predictions on ``X`` of the penalised least squares on the centers with its unpenalised intercept."""
    features = np.hstack([_gaussian(X, Z, bandwidth), np.ones((X.shape[0], 1))])
    normal = features.T @ features
    normal[:-1, :-1] += alpha * _gaussian(Z, Z, bandwidth)
    return features @ np.linalg.lstsq(normal, features.T @ y, rcond=None)[0]


def test_cg_with_a_tiny_alpha_converges_to_the_solution_on_the_centers_or_warns():
    X, y = _regression(2000, 3)
    alpha = 1e-9  # K(Z, Z) of 150 Gaussian centers on [0, 1]^3 at bandwidth 1 is singular in float64
    model = AdaptiveKernelRegressor(
        feature_learning=None,
        n_centers=150,
        solver="cg",
        alpha=alpha,
        bandwidth=1.0,
        dtype="float64",
        n_epochs=25,
        random_state=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    warned = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    residual = model.history_[-1]["relative_residual"]
    if warned:
        assert residual > 1e-6
        assert f"relative residual of {residual:.3g}" in str(warned[0].message)
        return
    assert residual <= 1e-6
    reference = _exact_on_centers(X, y, model.centers_, 1.0, alpha)
    np.testing.assert_allclose(model.predict(X), reference, rtol=0, atol=1e-6)


def test_an_iteration_bound_below_convergence_warns():
    X, y = _regression(2000, 3)
    # alpha=1 (5e-4 per sample): CG reaches 4e-7 in 20 iterations.
    model = AdaptiveKernelRegressor(n_centers=150, solver="cg", alpha=1.0, dtype="float64", n_epochs=2)
    unfinished = r"stopped \(iterations\) after 2 iterations .* above its tolerance 1e-06"
    with pytest.warns(ConvergenceWarning, match=unfinished):
        model.fit(X, y)
    converged = AdaptiveKernelRegressor(n_centers=150, solver="cg", alpha=1.0, dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        converged.fit(X, y)
    assert converged.history_[-1]["relative_residual"] <= 1e-6


def test_drawn_centers_are_distinct_rows():
    rng = np.random.RandomState(0)
    levels = rng.rand(40, 4)
    X = levels[rng.randint(0, 40, 3000)]  # 3000 rows, 40 distinct
    y = X.sum(1) + 0.1 * rng.randn(3000)
    model = AdaptiveKernelRegressor(feature_learning=None, n_centers=100, random_state=0).fit(X, y)
    assert model.n_centers_ == 40
    assert np.unique(model.centers_, axis=0).shape[0] == 40
    # Every row's value is a center: the centers' shares make CG's preconditioner exact.
    exact = AdaptiveKernelRegressor(
        feature_learning=None, n_centers=100, solver="cg", alpha=1e-6, dtype="float64", random_state=0
    )
    exact.fit(X, y)
    assert exact.n_centers_ == 40 and exact.n_epochs_ <= 3
    assert exact.history_[-1]["relative_residual"] <= 1e-6
    # Continuous data: the first p shuffled rows, as before.
    X_continuous = rng.rand(3000, 4)
    model = AdaptiveKernelRegressor(feature_learning=None, n_centers=100, random_state=0).fit(X_continuous, y)
    # Continuous data: 100 distinct training rows (the first 100 shuffled ones, as before
    # distinct draws: benchmarks/check_unchanged.py's EigenPro 3 and CG fits are bitwise the same).
    assert model.n_centers_ == 100 and np.unique(model.centers_, axis=0).shape[0] == 100
    rows = {tuple(row) for row in X_continuous.astype(np.float32)}
    assert all(tuple(center) in rows for center in model.centers_)


def test_auto_keeps_every_point_on_small_data_and_draws_centers_beyond_the_budget(capsys):
    X, y = _regression(1500, 4)
    small = AdaptiveKernelRegressor(feature_learning=None, random_state=0, n_epochs=2, verbose=1).fit(X, y)
    assert small.n_centers_ == 1500  # every point: CG with K(X, X)'s factor for its penalty, as before
    assert "n_centers='auto' on 1500 rows: every training point (K(X, X) fits" in capsys.readouterr().out
    X, y = _regression(21_000, 3)
    # K(X, X) would take 0.88 GB in float16; K(X, Z) of 2000 centers 168 MB in float32.
    large = AdaptiveKernelRegressor(feature_learning=None, random_state=0, memory_budget="400MB", verbose=1).fit(X, y)
    log = capsys.readouterr().out
    assert "n_centers='auto' on 21000 rows: 2000 (max(2000, 10 sqrt(n)) = 2000)" in log
    assert large.n_centers_ == 2000 and large.solver_ == "cg"
    assert "K(X, Z) stored" in log
    X_test, y_test = _regression(2000, 3, seed=1)
    assert large.score(X_test, y_test) > 0.99


def test_auto_counts_the_float16_cache_of_bounded_kernels(capsys):
    # 21000 rows: K(X, X) takes 1.76 GB in float32 and 0.88 GB in float16, so with a
    # 1.2 GB budget every point stays a center for the Gaussian kernel (bounded by 1,
    # so its cache may be float16).  EigenPro 2 stores it so; CG, whose penalty
    # (about 0.04) is far below the 16-bit rounding's bound on 21000 rows (10.3),
    # computes its products instead (issue 62).
    X, y = _regression(21_000, 3)
    params = dict(feature_learning=None, memory_budget="1.2GB", n_epochs=1, verbose=1, random_state=0)
    bounded = AdaptiveKernelRegressor(**params).fit(X, y)
    assert "every training point (K(X, X) fits memory_budget in 16-bit entries)" in capsys.readouterr().out
    assert bounded.solver_ == "cg" and not bounded.kernel_cached_ and bounded.kernel_cache_dtype_ is None
    sgd = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y)
    assert sgd.solver_ == "eigenpro" and sgd.kernel_cache_dtype_ == "float16"


def _breaking_down(monkeypatch, n_breakdowns):
    """CG whose first ``n_breakdowns`` runs stop after one iteration on a non-positive curvature.

    Records ``(alpha, coef_init)`` of every run.  The breakdown is staged: which
    problems break down in float32 depends on the BLAS's rounding (see
    tests/test_centers_cg.py), the fallback's control must not.
    """
    from skgpu_kernel.fit import cg as cg_attempts

    calls, real = [], cg_attempts.solve_centers_cg

    def fit(operator, targets, plan):
        calls.append((plan.alpha, None if plan.coef_init is None else plan.coef_init.clone()))
        if len(calls) > n_breakdowns:
            return real(operator, targets, plan)
        one_step = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, max_iterations=1))
        return dataclasses.replace(real(operator, targets, one_step), stop="curvature")

    monkeypatch.setattr(cg_attempts, "solve_centers_cg", fit)
    return calls


def _fit_with_breakdowns(monkeypatch, n_breakdowns, **params):
    """``(X, y, model, calls, messages)`` of a float64 CG fit whose first runs break down."""
    X, y = _regression(2000, 3)
    calls = _breaking_down(monkeypatch, n_breakdowns)
    model = AdaptiveKernelRegressor(
        feature_learning=None, n_centers=150, solver="cg", dtype="float64", random_state=0, **params
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    messages = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    return X, y, model, calls, messages


def test_cg_broken_down_by_rounding_is_refit_with_a_larger_alpha_from_where_it_ended(monkeypatch):
    X, y, model, calls, messages = _fit_with_breakdowns(monkeypatch, 2, alpha=1.0, bandwidth=1.0)
    assert [alpha for alpha, _ in calls] == [1.0, 10.0, 100.0]
    assert calls[0][1] is None and calls[1][1] is not None and calls[2][1] is not None
    assert len(messages) == 2
    assert "stopped (curvature)" in messages[0] and "Refitting from there with alpha=10 " in messages[0]
    assert "Refitting from there with alpha=100 " in messages[1]
    # The model is the converged solution at the penalty it reports.
    assert model.alpha_ == 100.0 and model.history_[-1]["relative_residual"] <= 1e-6
    reference = _exact_on_centers(X, y, model.centers_, 1.0, 100.0)
    np.testing.assert_allclose(model.predict(X), reference, rtol=0, atol=1e-6)


def test_cg_refits_are_bounded_and_an_unfinished_last_one_warns(monkeypatch):
    from skgpu_kernel.fit.attempts import CG_FALLBACK_REFITS

    _, _, model, calls, messages = _fit_with_breakdowns(monkeypatch, 100, alpha=0.0, bandwidth=1.0)
    # alpha=0 starts from float64's resolution of the summed errors (n * eps), then tenfold.
    first = np.finfo(np.float64).eps * 2000
    alphas = [alpha for alpha, _ in calls]
    np.testing.assert_allclose(alphas, [0.0] + [first * 10**k for k in range(CG_FALLBACK_REFITS)], rtol=1e-12)
    assert model.alpha_ == alphas[-1]
    assert len(messages) == CG_FALLBACK_REFITS + 1
    assert "the model is not yet the penalised least-squares solution" in messages[-1]


def test_a_stalled_residual_or_the_iteration_bound_keeps_the_asked_alpha(monkeypatch):
    _, _, model, calls, messages = _fit_with_breakdowns(monkeypatch, 0, alpha=1.0, n_epochs=2)
    assert [alpha for alpha, _ in calls] == [1.0] and model.alpha_ == 1.0
    assert len(messages) == 1 and "stopped (iterations)" in messages[0]
