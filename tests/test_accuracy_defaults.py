"""Accuracy out of the box: intercept, ridge penalty, convergence-driven stopping.

Each test compares with an exact reference (KernelRidge, closed-form penalised least
squares) or with a tuned scikit-learn baseline on the same data.
"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.kernel_ridge import KernelRidge
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.model_selection import GridSearchCV

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

BANDWIDTH = 1.0
GAMMA = 1.0 / (2.0 * BANDWIDTH**2)


def _smooth_problem(seed=0, n=300, d=5, offset=0.0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X @ rng.randn(d)) + 0.1 * rng.randn(n) + offset
    return X, y, rng.randn(100, d)


PATHS = {
    "eigenpro2": {"alpha": 0.0},
    "eigenpro3": {"n_centers": 120, "solver": "eigenpro"},
    "cg": {"n_centers": 120, "solver": "cg"},
    "loo": {"alpha": "loo"},  # alpha by leave-one-out, then CG with every training point a center (and the intercept)
}
# Without a penalty the EigenPro paths hold out a validation split from 1000 rows on.
VALIDATES = {"eigenpro2": True, "eigenpro3": True, "cg": False, "loo": False}


def _fit_summary(model):
    """What decides an iterative fit's path, for a failure message: solver, batch, step size, steps, scores."""
    return (
        f"solver {model.solver_}, batch {model.batch_size_}, learning rate {model.learning_rate_!r}, "
        f"steps {[record['n_steps'] for record in model.history_]}, "
        f"validation {[record.get('validation_score') for record in model.history_]}, "
        f"train loss {[record.get('train_loss') for record in model.history_]}, attempts {model.fit_attempts_}"
    )


@pytest.mark.parametrize("path", PATHS)
def test_adding_a_constant_to_y_shifts_predictions_by_it(path):
    X, y, X_test = _smooth_problem(n=1200)  # >= 1000 rows: "auto" holds out a validation split too
    params = dict(bandwidth=BANDWIDTH, dtype="float64", n_epochs=8, random_state=0, **PATHS[path])
    base = AdaptiveKernelRegressor(**params).fit(X, y)
    shifted = AdaptiveKernelRegressor(**params).fit(X, y + 1000.0)
    assert base.early_stopping_ == VALIDATES[path]  # CG converges to its exact solution: no held-out split
    assert shifted.alpha_ == base.alpha_  # "loo" scores centred targets
    assert shifted.intercept_ == pytest.approx(base.intercept_ + 1000.0, rel=1e-12)
    np.testing.assert_allclose(
        shifted.dual_coef_,
        base.dual_coef_,
        rtol=1e-6,
        atol=1e-9 * np.abs(base.dual_coef_).max(),
        err_msg=f"base: {_fit_summary(base)}; shifted: {_fit_summary(shifted)}",
    )
    predictions = base.predict(X_test)
    scale = np.linalg.norm(predictions)
    assert np.linalg.norm(shifted.predict(X_test) - 1000.0 - predictions) <= 1e-6 * scale
    assert [r["n_steps"] for r in shifted.history_] == [r["n_steps"] for r in base.history_]


@pytest.mark.parametrize("path", PATHS)
def test_classifier_intercept_is_fitted_jointly_when_penalised_else_the_weighted_mean_of_the_codes(path):
    rng = np.random.RandomState(1)
    X = rng.randn(200, 3)
    y = np.where(X[:, 0] + 0.3 * rng.randn(200) > 0.8, "a", "b")  # unbalanced: mean code far from 0
    weights = rng.uniform(0.5, 2.0, size=200)
    model = AdaptiveKernelClassifier(bandwidth=BANDWIDTH, n_epochs=3, random_state=0, **PATHS[path])
    model.fit(X, y, sample_weight=weights)
    codes = np.where(y == model.classes_[1], 1.0, -1.0)
    if model.alpha_ > 0 and not model.early_stopping_:
        # A penalised fit has the intercept fitted with the model: its normal equation holds instead
        # (to float32 CG's tolerance with every point a center, or exactly where the leave-one-out
        # criterion's eigendecomposition solved it directly; by construction on centers).
        assert model.solver_ in ("cg", "direct")
        residual = np.average(codes - model.decision_function(X), weights=weights)
        assert abs(residual) < 5e-3 and abs(model.intercept_[0] - np.average(codes, weights=weights)) > 1e-2
    else:
        np.testing.assert_allclose(model.intercept_, [np.average(codes, weights=weights)], rtol=1e-12)
    no_intercept = AdaptiveKernelClassifier(
        bandwidth=BANDWIDTH, n_epochs=3, random_state=0, fit_intercept=False, **PATHS[path]
    ).fit(X, y, sample_weight=weights)
    np.testing.assert_array_equal(no_intercept.intercept_, [0.0])


def _converged_eigenpro2(alpha):
    """EigenPro 2 (not CG) run for 300 epochs in float64: its iterate is the penalised solution."""
    return AdaptiveKernelRegressor(
        bandwidth=BANDWIDTH,
        alpha=alpha,
        solver="eigenpro",
        fit_intercept=False,
        dtype="float64",
        n_epochs=300,
        tol=None,
        random_state=0,
    )


@pytest.mark.parametrize("alpha", [1e-2, 1e-1, 1.0])
def test_eigenpro2_with_alpha_converges_to_kernel_ridge(alpha):
    X, y, X_test = _smooth_problem()
    reference = KernelRidge(alpha=alpha, kernel="rbf", gamma=GAMMA).fit(X, y).predict(X_test)
    model = _converged_eigenpro2(alpha).fit(X, y)
    error = np.linalg.norm(model.predict(X_test) - reference) / np.linalg.norm(reference)
    assert error <= 1e-3, error
    # The penalty moves the spectrum that sets the analytic step: eigenvalues of (K + alpha I) / n.
    plain = AdaptiveKernelRegressor(
        bandwidth=BANDWIDTH, alpha=0.0, fit_intercept=False, dtype="float64", n_epochs=1, random_state=0
    ).fit(X, y)
    np.testing.assert_allclose(model.top_eigenvalues_[0], plain.top_eigenvalues_[0] + alpha / X.shape[0], rtol=1e-6)


def test_eigenpro2_with_alpha_and_sample_weights_converges_to_kernel_ridge():
    X, y, X_test = _smooth_problem(seed=2)
    weights = np.random.RandomState(3).uniform(0.2, 3.0, size=X.shape[0])
    reference = KernelRidge(alpha=0.3, kernel="rbf", gamma=GAMMA).fit(X, y, sample_weight=weights).predict(X_test)
    model = _converged_eigenpro2(0.3).fit(X, y, sample_weight=weights)
    assert np.linalg.norm(model.predict(X_test) - reference) / np.linalg.norm(reference) <= 1e-3


def test_defaults_stop_on_convergence_before_the_epoch_bound():
    X, y, _ = _smooth_problem(n=2000)
    # alpha="auto": leave-one-out for CG on centers.
    on_centers = AdaptiveKernelRegressor(n_centers=300, random_state=0).fit(X, y)
    assert on_centers.solver_ == "cg" and on_centers.alpha_ == on_centers.alpha_selection_.alpha > 0
    model = AdaptiveKernelRegressor(alpha=0.0, random_state=0).fit(X, y)
    assert model.alpha_ == 0 and model.alpha_selection_ is None
    assert model.early_stopping_ and model.solver_ == "eigenpro"  # alpha = 0 and n >= 1000: a validation split
    assert model.n_epochs_ < model.n_epochs
    scores = [record["validation_score"] for record in model.history_]
    assert None not in scores and max(scores) > 0.9
    penalised = AdaptiveKernelRegressor(alpha=1.0, solver="eigenpro", random_state=0).fit(X, y)
    assert not penalised.early_stopping_  # a penalised loss converges by itself: stop on the training loss
    assert penalised.n_epochs_ < penalised.n_epochs
    assert all(record["validation_score"] is None for record in penalised.history_)
    loo = AdaptiveKernelRegressor(alpha="loo", random_state=0).fit(X, y)
    # Every row scored by the criterion: its eigendecomposition is the solution, no iteration.
    assert loo.alpha_ > 0 and loo.solver_ == "direct" and not loo.early_stopping_ and loo.n_epochs_ == 0
    loo_cg = AdaptiveKernelRegressor(alpha="loo", solver="cg", random_state=0).fit(X, y)
    assert loo_cg.alpha_ == loo.alpha_ and not loo_cg.early_stopping_
    assert 0 < loo_cg.n_epochs_ < loo_cg.n_epochs  # CG iterations, stopped on the objective (float32)
    fixed = AdaptiveKernelRegressor(n_epochs=4, tol=None, early_stopping=False, random_state=0)
    assert fixed.fit(X, y).n_epochs_ == 4


def test_float64_fits_as_well_as_float32_on_a_smooth_spectrum():
    # float64 resolves eigenvalues down to 1e-13 of the top one; flattening that far put
    # m*(P) at 400000 for 2700 rows, and five epochs reached R^2 0.06 where float32 has 0.98.
    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, size=(3000, 5))
    y = np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(3000)
    params = dict(bandwidth=2.0, alpha=0.0, solver="eigenpro", n_epochs=5, early_stopping=False, random_state=0)
    scores = {}
    for dtype in ("float32", "float64"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # float32 resolves fewer components than asked
            model = AdaptiveKernelRegressor(dtype=dtype, **params).fit(X[:2700], y[:2700])
        scores[dtype] = model.score(X[2700:], y[2700:])
    assert model.critical_batch_size_[1] < 2 * 2700
    assert scores["float32"] > 0.97
    assert scores["float64"] >= scores["float32"] - 0.005


def _heteroscedastic(n, seed):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(n, 4))
    signal = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.5 * np.cos(3 * X[:, 3])
    noise = 0.3 * (1.0 + np.abs(X[:, 0])) * rng.randn(n)
    return X, 250.0 + signal + noise


@pytest.mark.slow
def test_defaults_match_tuned_kernel_ridge_on_offset_heteroscedastic_data():
    X, y = _heteroscedastic(4000, seed=0)
    X_test, y_test = _heteroscedastic(4000, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no divergence rollback with defaults
        ours = AdaptiveKernelRegressor(random_state=0).fit(X, y)
    ours_mse = np.mean((ours.predict(X_test) - y_test) ** 2)
    gamma = 1.0 / (2.0 * ours.bandwidth_**2)
    # KernelRidge has no intercept: it gets the centred targets, as a user would give it.
    search = GridSearchCV(KernelRidge(kernel="rbf", gamma=gamma), {"alpha": np.logspace(-3, 2, 11)}, cv=3)
    search.fit(X, y - y.mean())
    ridge_mse = np.mean((search.predict(X_test) + y.mean() - y_test) ** 2)
    assert ours_mse <= 1.05 * ridge_mse, (ours_mse, ridge_mse, search.best_params_)


def _gaussian(A, B):
    return rbf_kernel(A, B, gamma=GAMMA)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_centers_with_alpha_converge_to_the_exact_penalised_least_squares(alpha):
    X, y, X_test = _smooth_problem(seed=4, n=800, offset=3.0)
    weights = np.random.RandomState(5).uniform(0.5, 2.0, size=X.shape[0])
    centers = X[::8]
    K, K_centers = _gaussian(X, centers), _gaussian(centers, centers)
    mean = np.average(y, weights=weights)
    if alpha > 0:  # the normal equations of the coefficients and the unpenalised intercept together
        features = np.hstack([K, np.ones((X.shape[0], 1))])
        normal = features.T @ (weights[:, None] * features)
        normal[:-1, :-1] += alpha * K_centers
        solution = np.linalg.lstsq(normal, features.T @ (weights * y), rcond=None)[0]
    else:  # without a penalty the intercept is the targets' weighted mean
        normal = K.T @ (weights[:, None] * K)
        solution = np.r_[np.linalg.lstsq(normal, K.T @ (weights * (y - mean)), rcond=None)[0], mean]
    reference = _gaussian(X_test, centers) @ solution[:-1] + solution[-1]
    model = AdaptiveKernelRegressor(bandwidth=BANDWIDTH, centers=centers, alpha=alpha, dtype="float64", random_state=0)
    model.fit(X, y, sample_weight=weights)
    assert model.solver_ == "cg" and not model.early_stopping_
    error = np.linalg.norm(model.predict(X_test) - reference) / np.linalg.norm(reference - mean)
    assert error <= 1e-5, error
    assert model.n_epochs_ == len(model.history_) < model.n_epochs


def test_solver_choice_and_its_errors():
    X, y, _ = _smooth_problem(n=400)
    eigenpro = AdaptiveKernelRegressor(n_centers=40, solver="eigenpro", n_epochs=2, random_state=0).fit(X, y)
    assert eigenpro.solver_ == "eigenpro" and eigenpro.projection_ is not None
    everywhere = AdaptiveKernelRegressor(alpha=0.0, n_epochs=2, random_state=0).fit(X, y)
    assert everywhere.solver_ == "eigenpro"  # no penalty: EigenPro 2's early-stopped iterates
    penalised = AdaptiveKernelRegressor(alpha=0.1, n_epochs=2, random_state=0).fit(X, y)
    # A penalty with every point a center, up to 10000 rows: one factorisation of K + alpha W^-1.
    assert penalised.solver_ == "direct" and penalised.n_centers_ == X.shape[0] and penalised.n_epochs_ == 0
    with pytest.raises(ValueError, match=r"solver='cg' needs .* more than memory_budget"):
        AdaptiveKernelRegressor(solver="cg", alpha=0.1, memory_budget=1_000_000).fit(X, y)
    with pytest.raises(ValueError, match="EigenPro 3's SGD has no penalty"):
        AdaptiveKernelRegressor(n_centers=40, solver="eigenpro", alpha=1.0).fit(X, y)
    with pytest.raises(ValueError, match=r"solver='cg' needs .* more than memory_budget"):
        AdaptiveKernelRegressor(n_centers=300, solver="cg", memory_budget=1_000_000).fit(X, y)
    small = AdaptiveKernelRegressor(n_centers=300, memory_budget=1_500_000, n_epochs=2, random_state=0).fit(X, y)
    assert small.solver_ == "eigenpro"  # 16 p^2 = 1.44 MB of factors do not fit next to the data


REAL_DATASETS = [
    "Computers",
    "VietNamI",
    "BudgetFood",
    "HI",
    "Fertility",
    "CPSSW8",
    "LetterRecognition",
    "DNA",
    "FertilityMorekids",
    "FashionMNIST",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_DATASETS)
def test_no_divergence_rollback_with_defaults_on_the_benchmarked_datasets(name):
    """The benchmark's split and preprocessing, its first 1500 rows, our defaults: no rollback, CG finished."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = pytest.importorskip("bench_real_data")
    try:
        X_train, y_train, X_test, y_test, _ = bench.prepare(name, max_train=1500)
    except (ImportError, FileNotFoundError) as error:  # the data package is not installed
        pytest.skip(str(error))
    estimator = AdaptiveKernelClassifier if name in bench.CLASSIFICATION else AdaptiveKernelRegressor
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Training diverged", category=RuntimeWarning)
        warnings.filterwarnings("error", category=ConvergenceWarning)  # CG ended unfinished
        model = estimator(random_state=0).fit(X_train, y_train)
    assert model.score(X_test, y_test) > 0.0


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-6), ("float32", 1e-3)])
def test_cg_with_every_point_a_center_is_kernel_ridge(dtype, tol):
    X, y, X_test = _smooth_problem(seed=6, n=500)
    reference = KernelRidge(alpha=0.05, kernel="rbf", gamma=GAMMA).fit(X, y).predict(X_test)
    model = AdaptiveKernelRegressor(
        bandwidth=BANDWIDTH, alpha=0.05, solver="cg", fit_intercept=False, dtype=dtype, random_state=0
    ).fit(X, y)
    assert model.solver_ == "cg" and model.n_centers_ == X.shape[0]
    error = np.linalg.norm(model.predict(X_test) - reference) / np.linalg.norm(reference)
    assert error <= tol, error
    assert model.n_epochs_ < 15  # the preconditioner is K's own factor: a few iterations


def test_loo_alpha_is_ridge_leave_one_out_and_beats_no_penalty_on_noisy_data():
    from sklearn.linear_model import RidgeCV

    rng = np.random.RandomState(7)
    X = rng.uniform(-2, 2, size=(600, 3))
    y = np.sin(2 * X[:, 0]) + X[:, 1] + 0.5 * rng.randn(600)  # noisy: the interpolant overfits
    X_test = rng.uniform(-2, 2, size=(2000, 3))
    y_test = np.sin(2 * X_test[:, 0]) + X_test[:, 1]
    model = AdaptiveKernelRegressor(bandwidth=BANDWIDTH, alpha="loo", dtype="float64", random_state=0).fit(X, y)
    selection = model.alpha_selection_
    assert model.alpha_ == pytest.approx(selection.penalty * X.shape[0])
    # With fewer rows than the Nystrom subsample the features span the kernel: the criterion is
    # KernelRidge's exact leave-one-out error, i.e. RidgeCV's on any factor of K.
    K = _gaussian(X, X)
    values, vectors = np.linalg.eigh(K)
    keep = values > values.max() * 1e-10
    factor = vectors[:, keep] * np.sqrt(values[keep])
    ridge = RidgeCV(alphas=selection.penalties * X.shape[0]).fit(factor, y)
    assert model.alpha_ == pytest.approx(ridge.alpha_, rel=1e-9)
    mse = np.mean((model.predict(X_test) - y_test) ** 2)
    interpolating = AdaptiveKernelRegressor(bandwidth=BANDWIDTH, alpha=1e-8, dtype="float64", random_state=0)
    assert mse < 0.5 * np.mean((interpolating.fit(X, y).predict(X_test) - y_test) ** 2)


def test_loo_alpha_is_zero_for_eigenpro3_which_stops_early_instead():
    X, y, _ = _smooth_problem(n=1200)
    model = AdaptiveKernelRegressor(n_centers=100, solver="eigenpro", alpha="loo", n_epochs=3, random_state=0)
    model.fit(X, y)
    assert model.alpha_ == 0.0 and model.alpha_selection_ is None and model.early_stopping_


def _high_dimensional_problem(n=2600, d=60, seed=5):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    return X, np.tanh(X[:, :10].sum(axis=1) / 3.0) + 0.05 * rng.randn(n)


def test_auto_alpha_trusts_the_criterion_only_where_the_nystrom_model_covers_the_kernel():
    from skgpu_kernel.planning.solver import LOO_MIN_COVERAGE

    # At the scale rule's bandwidth, whose coverage these data were made for (the search moves it).

    # Low-dimensional data: 2000 points span the kernel, the leave-one-out penalty is used
    # (and with it the direct solve on every point, up to 10000 rows).
    X, y, _ = _smooth_problem(n=2600)
    covered = AdaptiveKernelRegressor(feature_learning=None, bandwidth="scale", random_state=0).fit(X, y)
    assert covered.alpha_selection_.scored and covered.alpha_selection_.coverage > 0.99
    assert covered.alpha_ == covered.alpha_selection_.alpha > 0 and covered.solver_ == "direct"
    # 60 dimensions at the scale bandwidth: 2000 points capture a fraction of the kernel's
    # trace, the criterion is not evaluated and EigenPro 2 stops early, unpenalised.
    X, y = _high_dimensional_problem()
    uncovered = AdaptiveKernelRegressor(feature_learning=None, bandwidth="scale", random_state=0).fit(X, y)
    selection = uncovered.alpha_selection_
    assert not selection.scored and selection.coverage < LOO_MIN_COVERAGE and selection.loo_errors is None
    assert uncovered.alpha_ == 0 and uncovered.solver_ == "eigenpro" and uncovered.early_stopping_
    # Declining draws nothing from the fit's generator: the same model as alpha=0 (fixed batch,
    # since the throughput probe's choice is timed).
    declined = AdaptiveKernelRegressor(
        feature_learning=None, bandwidth="scale", batch_size=64, n_epochs=3, random_state=0
    ).fit(X, y)
    unpenalised = AdaptiveKernelRegressor(
        feature_learning=None, bandwidth="scale", alpha=0.0, batch_size=64, n_epochs=3, random_state=0
    ).fit(X, y)
    np.testing.assert_array_equal(declined.dual_coef_, unpenalised.dual_coef_)
    # The classifier's penalty is chosen by leave-one-out misclassifications, under the same coverage rule.
    X_small, y_small, _ = _smooth_problem(n=1200)
    classifier = AdaptiveKernelClassifier(feature_learning=None, bandwidth="scale", n_epochs=3, random_state=0).fit(
        X_small, y_small > 0
    )
    selection = classifier.alpha_selection_
    assert selection.scored and selection.loo_misclassification is not None
    assert classifier.alpha_ == selection.alpha > 0 and not classifier.early_stopping_
    # alpha="loo" asks for the criterion whatever the coverage.
    asked = AdaptiveKernelRegressor(
        feature_learning=None, bandwidth="scale", alpha="loo", n_epochs=2, random_state=0
    ).fit(X, y)
    assert asked.alpha_selection_.scored and asked.alpha_ == asked.alpha_selection_.alpha > 0


def test_below_the_coverage_the_searchs_exact_penalty_is_carried_over_to_a_few_more_rows():
    """Issue 51: where the Nystrom criterion is gated off, the bandwidth search's exact penalty is carried over.

    As it is (``alpha``), to a fit of up to ``PENALTY_CARRY_MAX_RATIO`` times the rows
    the search scored; the fit, penalised, is solved directly.  Beyond, early stopping.
    """
    from skgpu_kernel.planning.kernel import BANDWIDTH_SEARCH_ROWS
    from skgpu_kernel.planning.kernel_policy import PENALTY_CARRY_MAX_RATIO
    from skgpu_kernel.planning.solver import LOO_MIN_COVERAGE

    within = int(PENALTY_CARRY_MAX_RATIO * BANDWIDTH_SEARCH_ROWS)
    X, y = _high_dimensional_problem(n=within)
    carried = AdaptiveKernelRegressor(feature_learning=None, random_state=0).fit(X, y)
    selection = carried.alpha_selection_
    assert selection.carried and selection.scored and selection.n_rows == BANDWIDTH_SEARCH_ROWS
    assert selection.coverage < LOO_MIN_COVERAGE and selection.solution is None
    # alpha as the search scored it on its rows: the per-sample penalty falls as 1 / n.
    assert carried.alpha_ > 0 and carried.alpha_ == selection.alpha
    assert selection.alpha == pytest.approx(selection.penalty * BANDWIDTH_SEARCH_ROWS, rel=1e-12)
    assert carried.solver_ == "direct" and not carried.early_stopping_
    # The model is kernel ridge at that penalty, with an unpenalised intercept.
    gamma = 0.5 / carried.bandwidth_**2
    expected = _joint_intercept_reference(X, y, np.ones(within), X[:50], carried.alpha_, gamma)
    np.testing.assert_allclose(carried.predict(X[:50]), expected, rtol=0, atol=1e-4)
    X, y = _high_dimensional_problem(n=within + 1)
    beyond = AdaptiveKernelRegressor(feature_learning=None, random_state=0).fit(X, y)
    assert not beyond.alpha_selection_.scored and not beyond.alpha_selection_.carried
    assert beyond.alpha_ == 0 and beyond.solver_ == "eigenpro"


def test_a_subsample_penalty_is_carried_over_within_one_step_of_the_penalty_grid():
    from skgpu_kernel.planning.kernel_policy import PENALTY_CARRY_MAX_RATIO, carries_subsample_penalty
    from skgpu_kernel.regularization import PENALTY_GRID

    assert PENALTY_CARRY_MAX_RATIO == pytest.approx(PENALTY_GRID[1] / PENALTY_GRID[0], rel=1e-12)
    assert carries_subsample_penalty(1500, 1500) and carries_subsample_penalty(1500, 2667)
    assert not carries_subsample_penalty(1500, 2668)


def _joint_intercept_reference(X, y, weights, X_test, alpha, gamma):
    """Predictions of the one model: ``sum_j a_j k(x_j, .) + b`` minimising the weighted loss plus ``alpha a^T K a``.

    Stationarity gives ``(K + alpha W^-1) a + b 1 = y`` and ``1^T a = 0`` (the
    unpenalised intercept's normal equation), solved here as one bordered system.
    """
    n = X.shape[0]
    system = np.zeros((n + 1, n + 1))
    system[:n, :n] = rbf_kernel(X, X, gamma=gamma) + alpha * np.diag(1.0 / weights)
    system[:n, n] = system[n, :n] = 1.0
    solution = np.linalg.solve(system, np.r_[y, 0.0])
    return rbf_kernel(X_test, X, gamma=gamma) @ solution[:n] + solution[n]


ONE_MODEL_SOLVERS = {
    "cg": {"solver": "cg", "n_epochs": 40, "tol": None},
    "eigenpro": {"solver": "eigenpro", "n_epochs": 300, "tol": None},
    "cg on centers": {"solver": "cg", "n_epochs": 40, "tol": None, "centers": "X"},
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("solver", ONE_MODEL_SOLVERS)
def test_every_solver_converges_to_the_one_model_with_its_joint_intercept(solver, weighted):
    """Same parameters, same function: the intercept is fitted with the kernel part, unpenalised, by every solver.

    EigenPro 3 takes no penalty (``alpha > 0`` on centers is CG's), so it is not here.
    Before the one model, EigenPro 2 used the targets' mean as the intercept and
    differed from the joint solution by 1.9% of the targets' standard deviation here.
    """
    rng = np.random.RandomState(0)
    X = rng.randn(400, 5)
    y = np.sin(X @ rng.randn(5)) + 0.1 * rng.randn(400) + 0.5 * X[:, 0] ** 2
    X_test = rng.randn(200, 5)
    weights = rng.uniform(0.3, 2.0, size=400) if weighted else np.ones(400)
    bandwidth, alpha = 3.0, 1.0
    reference = _joint_intercept_reference(X, y, weights, X_test, alpha, 1.0 / (2.0 * bandwidth**2))
    params = dict(ONE_MODEL_SOLVERS[solver])
    if params.get("centers") == "X":
        params["centers"] = X
    model = AdaptiveKernelRegressor(bandwidth=bandwidth, alpha=alpha, dtype="float64", random_state=0, **params)
    model.fit(X, y, sample_weight=weights if weighted else None)
    assert model.solver_ == params["solver"]
    error = np.linalg.norm(model.predict(X_test) - reference) / np.linalg.norm(reference)
    assert error <= 1e-6, error
