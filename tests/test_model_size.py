"""The model's size chosen with its prediction cost in view (issue 80, items 1 and 2).

Where ``n_centers="auto"`` keeps every point, feature learning also scores the
smaller model on ``auto_centers_target`` centers and keeps the larger one only where
its held-out losses are lower beyond their noise; from ``PATH_CENTERS_MAX_SHARE``
the learning path's candidates are that smaller model themselves.
"""

import math

import numpy as np
import pytest

import skgpu_kernel.fit.feature_learning as feature_learning
import skgpu_kernel.planning.solver as solver_planning
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.planning.agop import (
    MODEL_SIZE_MARGIN_SE,
    PATH_CENTERS_MAX_SHARE,
    SMALLER_MODEL_MAX_SHARE,
    learnt_metric_entries,
    lower_beyond_noise,
    plan_path_centers,
    plan_smaller_model,
)
from skgpu_kernel.planning.solver import AUTO_CENTERS_MIN, AUTO_CENTERS_PER_ROOT, auto_centers_target


@pytest.mark.parametrize(
    ("n_rows", "expected"),
    [(1, 1), (1999, 1999), (2000, 2000), (40_000, 2000), (40_001, 2001), (100_000, 3163), (1_000_000, 10_000)],
)
def test_the_smaller_models_centers_are_ten_root_n_and_at_least_2000(n_rows, expected):
    assert (AUTO_CENTERS_MIN, AUTO_CENTERS_PER_ROOT) == (2000, 10)
    assert auto_centers_target(n_rows) == expected == min(n_rows, max(2000, math.ceil(10 * math.sqrt(n_rows))))


@pytest.mark.parametrize(
    ("every_point", "n_training", "smaller", "path"),
    [
        (True, 2000, None, None),
        (True, 3999, None, None),  # 2000 centers are over half the rows
        (True, 4000, 2000, None),
        (True, 7999, 2000, None),  # over a quarter: the path fits every point
        (True, 8000, 2000, 2000),
        (True, 27_000, 2000, 2000),
        (True, 100_000, 3163, 3163),
        (False, 4000, None, None),  # the user's size, or centers already fewer than the rows
        (False, 100_000, None, None),
    ],
)
def test_the_smaller_model_and_the_paths_centers_at_their_boundaries(every_point, n_training, smaller, path):
    assert (SMALLER_MODEL_MAX_SHARE, PATH_CENTERS_MAX_SHARE) == (0.5, 0.25)
    assert plan_smaller_model(every_point, n_training) == smaller
    assert plan_path_centers(every_point, n_training, 20) == path


@pytest.mark.parametrize(
    ("n_features", "block_sizes", "mode", "entries", "path"),
    [
        (20, (), "diagonal", 20, 2000),
        (2000, (), "diagonal", 2000, 2000),  # as many entries as centers
        (2001, (), "diagonal", 2001, None),
        (205, (2, 194), "diagonal", 205 + 1 + 194 * 193 // 2, None),  # the VietNamI table's communes
        (30, (5, 60), "diagonal", 30 + 10 + 1770, 2000),
        (62, (), "full", 1953, 2000),
        (63, (), "full", 2016, None),
    ],
)
def test_the_path_fits_every_point_where_the_metric_has_more_entries_than_the_smaller_models_centers(
    n_features, block_sizes, mode, entries, path
):
    assert learnt_metric_entries(n_features, block_sizes, mode) == entries
    assert plan_path_centers(True, 27_000, entries) == path


def test_the_larger_model_must_be_lower_beyond_one_standard_error():
    assert MODEL_SIZE_MARGIN_SE == 1.0
    rng = np.random.RandomState(0)
    smaller = rng.uniform(0, 1, 400)
    noise = rng.standard_normal(400)
    difference = noise - noise.mean()
    standard_error = difference.std(ddof=1) / np.sqrt(400)
    # The mean gain set exactly at k standard errors of the paired differences.
    for k, expected in ((0.99, False), (1.01, True)):
        larger = smaller - (difference + k * standard_error)
        assert lower_beyond_noise(larger, smaller, 1.0) is expected
    assert not lower_beyond_noise(smaller, smaller, 0.0)  # no gain at all
    assert not lower_beyond_noise(smaller + 1.0, smaller, 0.0)  # worse
    assert not lower_beyond_noise(np.array([0.0]), np.array([5.0]), 0.0)  # one row has no noise estimate


@pytest.fixture
def small_centers(monkeypatch):
    """``auto_centers_target``'s floor at 100 centers: the rules' boundaries within a few thousand rows."""
    monkeypatch.setattr(solver_planning, "AUTO_CENTERS_MIN", 100)


def _sized_fits(monkeypatch):
    """Every kernel fit of a feature-learning fit, as ``(rows, n_centers)``, and each size decision's answer."""
    fits, decisions = [], []
    fit, lower = feature_learning.fit_kernel_model, feature_learning.lower_beyond_noise

    def recorded(data, parameters, runtime, plan=None):
        fits.append((data.X.shape[0], data.n_centers))
        return fit(data, parameters, runtime, plan)

    def decided(losses, baseline, margin_se):
        answer = lower(losses, baseline, margin_se)
        if margin_se == MODEL_SIZE_MARGIN_SE:
            decisions.append(answer)
        return answer

    monkeypatch.setattr(feature_learning, "fit_kernel_model", recorded)
    monkeypatch.setattr(feature_learning, "lower_beyond_noise", decided)
    return fits, decisions


def _smooth(n, seed, noise=0.3):
    X = np.random.RandomState(seed).uniform(-1, 1, (n, 3))
    y = np.sin(2 * X[:, 0]) + X[:, 1] + noise * np.random.RandomState(seed + 1).standard_normal(n)
    return X, y


def test_where_the_smaller_model_predicts_as_well_it_is_the_model_kept(monkeypatch, small_centers):
    # 1000 rows, 900 training: the smaller model has 300 centers (a third), the path fits every point.
    fits, decisions = _sized_fits(monkeypatch)
    X, y = _smooth(1000, 0)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 1, "random_state": 0, "dtype": "float64"}
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert decisions == [False]
    *candidates, smaller, final = fits
    assert all(fit == (900, "auto") for fit in candidates)
    assert smaller == (900, 300) and final == (1000, auto_centers_target(1000)) == (1000, 317)
    assert model.n_centers_ == 317
    # Its error is the larger model's within the noise: the same fit with every point kept.
    monkeypatch.setattr(feature_learning, "plan_smaller_model", lambda every_point, n_training: None)
    larger = AdaptiveKernelRegressor(**params).fit(X, y)
    assert larger.n_centers_ == 1000
    X_test, y_test = _smooth(2000, 50)
    errors = [np.mean((m.predict(X_test) - y_test) ** 2) for m in (model, larger)]
    assert errors[0] < 1.05 * errors[1]


def test_where_every_point_is_measurably_more_accurate_it_is_kept(monkeypatch, small_centers):
    # A surface finer than 300 centers resolve in 2 dimensions.  In float32 (the default): in float64
    # CG on 300 centers stalls at a relative residual of 2e-4 here, as it does with n_centers=300 given.
    fits, decisions = _sized_fits(monkeypatch)
    X = np.random.RandomState(3).uniform(-1, 1, (1000, 2))
    y = np.sin(9 * X[:, 0]) * np.cos(9 * X[:, 1]) + 0.05 * np.random.RandomState(4).standard_normal(1000)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 1, "random_state": 0}
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert decisions == [True]
    assert fits[-2] == (900, 300) and fits[-1] == (1000, "auto")
    assert model.n_centers_ == 1000


def test_from_a_quarter_of_the_rows_the_path_fits_the_smaller_model_and_every_point_is_fitted_once(
    monkeypatch, small_centers
):
    # 2000 rows, 1800 training: 425 centers are under a quarter; the larger model is fitted once to compare.
    fits, decisions = _sized_fits(monkeypatch)
    X, y = _smooth(2000, 1)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 2, "random_state": 0, "dtype": "float64"}
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert len(decisions) == 1
    *candidates, larger, final = fits
    assert len(candidates) >= 2 and all(fit == (1800, 425) for fit in candidates)
    assert larger == (1800, "auto")
    kept = "auto" if decisions[0] else auto_centers_target(2000)
    assert final == (2000, kept)
    assert model.n_centers_ == (2000 if decisions[0] else 448)


@pytest.mark.parametrize("size", [{"n_centers": 300}, {"n_centers": None}])
def test_a_size_the_user_set_is_every_candidates_and_the_fits(monkeypatch, small_centers, size):
    fits, decisions = _sized_fits(monkeypatch)
    X, y = _smooth(2000, 2)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 1, "random_state": 0, **size}
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert decisions == []
    assert {centers for _, centers in fits} == {size["n_centers"]}
    assert model.n_centers_ == (size["n_centers"] or 2000)


def test_a_classifier_keeps_the_smaller_model_with_its_own_temperature(monkeypatch, small_centers):
    fits, decisions = _sized_fits(monkeypatch)
    X, y = _smooth(1000, 4)
    labels = (y > np.median(y)).astype(int)
    model = AdaptiveKernelClassifier(feature_learning="diagonal", feature_learning_iter=1, random_state=0)
    model.fit(X, labels)
    assert decisions == [False] and model.n_centers_ == 317 and fits[-1] == (1000, 317)
    probabilities = model.predict_proba(X[:50])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert np.isfinite(model.calibration_temperature_) and model.calibration_temperature_ > 0


def test_where_the_gate_left_alpha_unscored_the_smaller_model_takes_the_exact_criterions_on_1500_rows(
    monkeypatch, small_centers
):
    # 60 noisy features: 2000 Nystrom features of 3000 rows capture less of the kernel than the gate asks
    # (early stopping regularises the model on every point); CG on centers needs a penalty.
    from skgpu_kernel.planning.kernel_policy import PENALISED_REFIT_ROWS

    fits, decisions = _sized_fits(monkeypatch)
    carried = []
    exact = feature_learning.with_exact_penalty

    def recorded(plan, data, runtime):
        assert not plan.alpha_selection.scored
        sized = exact(plan, data, runtime)
        carried.append(sized.alpha_selection)
        return sized

    monkeypatch.setattr(feature_learning, "with_exact_penalty", recorded)
    rng = np.random.RandomState(5)
    X = rng.standard_normal((3000, 60))
    y = np.tanh(X[:, 0]) + X[:, 1] + 0.5 * rng.standard_normal(3000)
    model = AdaptiveKernelRegressor(feature_learning="diagonal", feature_learning_iter=1, random_state=0).fit(X, y)
    assert carried and all(selection.n_rows == PENALISED_REFIT_ROWS and selection.carried for selection in carried)
    assert all(selection.alpha > 0 for selection in carried)
    # The smaller model kept: CG on its centers at the carried alpha, as it is (10 sqrt(3000) = 548 centers).
    assert decisions == [False]
    assert model.n_centers_ == auto_centers_target(3000) == 548 and model.alpha_ == carried[-1].alpha
    assert fits[-1] == (3000, 548)
