"""Feature learning inside the kernel estimators (issue 43): the metric from the AGOP, chosen on held-out rows."""

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch
from sklearn.feature_selection import SelectFromModel

import skgpu_kernel.fit.feature_learning as feature_learning
import skgpu_kernel.fit.prepare as prepare
import skgpu_kernel.fit.tune as tune
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian


def _few_relevant(n, seed, n_noise=20):
    """``y = sin(3 x_0) + x_1 x_2`` plus 20 features it does not depend on (all uniform on [-1, 1]).

    With standard normal features instead, ``sin(3 x_0)`` swings faster than the
    first fit resolves in 23 dimensions, and no metric learnt from its gradients
    finds ``x_0``: at 1500 rows ours and xRFM (defaults, the last 20% as its
    validation set) both ended near 0.55-0.61 test MSE against the plain kernel's
    0.65.
    """
    X = np.random.RandomState(seed).uniform(-1, 1, (n, 3 + n_noise))
    return X, np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2]


def _mse(model, X, y):
    return float(np.mean((model.predict(X) - y) ** 2))


@pytest.mark.parametrize("mode", ["diagonal", "full"])
def test_learnt_metric_finds_the_three_features_that_matter_and_halves_the_error(mode):
    X, y = _few_relevant(1500, 0)
    X_test, y_test = _few_relevant(2000, 1)
    plain = AdaptiveKernelRegressor(random_state=0, dtype="float64").fit(X, y)
    learnt = AdaptiveKernelRegressor(feature_learning=mode, random_state=0, dtype="float64").fit(X, y)
    assert set(np.argsort(learnt.feature_importances_)[::-1][:3]) == {0, 1, 2}
    assert learnt.feature_learning_iteration_ > 0
    assert len(learnt.feature_learning_scores_) >= learnt.feature_learning_iteration_ + 1
    assert _mse(learnt, X_test, y_test) <= 0.5 * _mse(plain, X_test, y_test)
    assert learnt.metric_.shape == (23, 23)
    if mode == "diagonal":
        assert np.count_nonzero(learnt.metric_ - np.diag(np.diag(learnt.metric_))) == 0


def test_the_plain_model_is_kept_where_no_learnt_metric_scores_better_and_it_is_the_plain_fit(monkeypatch):
    # A metric that keeps only the last feature, on which y does not depend: every
    # learnt model scores worse on the held-out rows.  With the user's own kernel the
    # path's first model is the plain one again, which is no better than itself.
    def useless_metric(agop, diagonal=False, power=1.0):
        metric = np.zeros(agop.shape[0])
        metric[-1] = 1.0
        return metric if diagonal else np.diag(metric)

    monkeypatch.setattr(feature_learning, "metric_from_agop", useless_metric)
    X, y = _few_relevant(600, 2, n_noise=3)
    params = {"kernel": Gaussian(), "random_state": 0, "dtype": "float64"}
    plain = AdaptiveKernelRegressor(**params).fit(X, y)
    learnt = AdaptiveKernelRegressor(feature_learning="diagonal", **params).fit(X, y)
    assert learnt.feature_learning_iteration_ == 0
    scores = learnt.feature_learning_scores_
    assert scores[1] == scores[0] and scores[0] > max(scores[2:])
    assert learnt.metric_transform_ is None and np.array_equal(learnt.metric_, np.eye(6))
    # The final fit draws what a fit without feature learning draws: the same model, bit for bit.
    np.testing.assert_array_equal(learnt.dual_coef_, plain.dual_coef_)
    np.testing.assert_array_equal(learnt.predict(X), plain.predict(X))


def test_each_kernel_is_tuned_once_per_fit_and_the_path_kernel_takes_the_scale_rule_unsearched(monkeypatch):
    # The plain Gaussian's search serves its candidate and its refit (the plain model
    # is kept here); the path's Laplacian, with M = I, takes the scale rule's bandwidth
    # (no search of its own) and its penalty is tuned once, for every step of the path.
    monkeypatch.setattr(feature_learning, "_learning_pays", lambda learnt, plain: False)
    searched, tuned = [], []
    search, tune_kernel = tune.select_bandwidth, feature_learning.tune_kernel

    def counted(kernel, *args, **kwargs):
        searched.append(type(kernel).__name__)
        return search(kernel, *args, **kwargs)

    def recorded(data, parameters, runtime):
        plan = tune_kernel(data, parameters, runtime)
        tuned.append((parameters.kernel, parameters.bandwidth, plan.by_rule))
        return plan

    monkeypatch.setattr(tune, "select_bandwidth", counted)
    monkeypatch.setattr(feature_learning, "tune_kernel", recorded)
    X, y = _few_relevant(600, 3, n_noise=4)
    model = AdaptiveKernelRegressor(feature_learning="diagonal", feature_learning_iter=3, random_state=0).fit(X, y)
    assert len(model.feature_learning_scores_) >= 3  # the plain model and at least two of the path's steps
    assert model.feature_learning_iteration_ == 0
    assert searched == ["Gaussian"]
    assert tuned == [("gaussian", "auto", False), ("laplacian", "scale", True)]


@pytest.mark.parametrize(
    ("bandwidth", "path_bandwidth"), [("auto", "scale"), ("scale", "scale"), (2.0, 2.0), (0.25, 0.25)]
)
def test_the_path_kernel_searches_no_bandwidth_and_keeps_one_the_user_chose(bandwidth, path_bandwidth):
    from skgpu_kernel.planning.agop import PATH_BANDWIDTH, plan_path_bandwidth

    assert PATH_BANDWIDTH == "scale"
    assert plan_path_bandwidth(bandwidth) == path_bandwidth


@pytest.mark.parametrize(("subsample_size", "path_subsample"), [("auto", 1000), (300, 300), (3000, 3000)])
def test_the_path_fits_precondition_on_their_own_subsample_and_the_final_fit_on_the_fits(
    monkeypatch, subsample_size, path_subsample
):
    from skgpu_kernel.planning.agop import PATH_SUBSAMPLE_SIZE, plan_path_subsample

    assert PATH_SUBSAMPLE_SIZE == 1000 and plan_path_subsample(subsample_size) == path_subsample
    fitted = []
    fit_kernel_model = feature_learning.fit_kernel_model

    def recorded(data, parameters, *args, **kwargs):
        fitted.append((parameters.kernel, parameters.subsample_size))
        return fit_kernel_model(data, parameters, *args, **kwargs)

    monkeypatch.setattr(feature_learning, "fit_kernel_model", recorded)
    monkeypatch.setattr(feature_learning, "_learning_pays", lambda learnt, plain: True)
    X, y = _few_relevant(400, 3, n_noise=2)
    AdaptiveKernelRegressor(
        feature_learning="diagonal", feature_learning_iter=2, subsample_size=subsample_size, random_state=0
    ).fit(X, y)
    plain, *path, final = fitted
    assert plain == ("gaussian", subsample_size)
    assert path and all(step == ("laplacian", path_subsample) for step in path)
    assert final == ("laplacian", subsample_size)


def test_classifier_learns_features_with_a_stratified_split_and_selects_them():
    X, y_continuous = _few_relevant(1200, 3, n_noise=10)
    y = np.where(y_continuous > 0.3, "high", "low")
    model = AdaptiveKernelClassifier(feature_learning="diagonal", random_state=0).fit(X, y)
    assert set(np.argsort(model.feature_importances_)[::-1][:3]) == {0, 1, 2}
    # M = G: the features the target does not depend on end with importances near 0,
    # each under a tenth of the least important feature it depends on.
    importances = model.feature_importances_
    assert importances[3:].max() <= 0.1 * importances[:3].min()
    selected = SelectFromModel(model, prefit=True, threshold=0.1 * importances[:3].min()).get_support()
    np.testing.assert_array_equal(np.flatnonzero(selected), [0, 1, 2])
    assert np.isin(model.predict(X[:10]), ["high", "low"]).all()


def test_float32_fit_stays_float32_and_pickling_keeps_the_metric():
    X, y = _few_relevant(500, 4, n_noise=5)
    X32 = X.astype(np.float32)
    model = AdaptiveKernelRegressor(feature_learning="full", feature_learning_iter=2, random_state=0).fit(X32, y)
    assert model.dual_coef_.dtype == np.float32 and model.predict(X32).dtype == np.float32
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.metric_, model.metric_)
    np.testing.assert_allclose(again.predict(X32), model.predict(X32), rtol=1e-5, atol=1e-5)


def test_a_kernel_without_a_gradient_cannot_learn_features_and_says_so():
    def linear(A, B):
        return A @ B.T

    X, y = _few_relevant(100, 5, n_noise=2)
    with pytest.raises(ValueError, match="cannot learn features"):
        AdaptiveKernelRegressor(kernel=linear, feature_learning="diagonal", random_state=0).fit(X, y)


def test_without_feature_learning_no_metric_attributes_are_claimed():
    X, y = _few_relevant(200, 6, n_noise=2)
    model = AdaptiveKernelRegressor(random_state=0).fit(X, y)  # "auto" below its rows: no learning
    assert model.feature_learning_ is None
    assert model.metric_ is None and model.feature_learning_scores_ is None
    assert not hasattr(model, "feature_importances_")


@pytest.mark.parametrize(
    ("requested", "n_samples", "learnable", "expected", "in_memory"),
    [
        ("auto", 1999, True, None, True),
        ("auto", 2000, True, "diagonal", True),
        ("auto", 30000, True, "diagonal", True),
        ("auto", 30001, True, "diagonal", True),  # no size is too large: candidates on a subsample
        ("auto", 10**7, True, "diagonal", True),
        ("auto", 5000, False, None, True),
        ("auto", 5000, True, None, False),
        ("full", 100, True, "full", True),
        ("diagonal", 10**6, True, "diagonal", True),
        (None, 5000, True, None, True),
    ],
)
def test_auto_learns_a_diagonal_metric_within_its_rows_for_a_kernel_with_a_gradient(
    requested, n_samples, learnable, expected, in_memory
):
    from skgpu_kernel.planning.agop import plan_feature_learning

    assert plan_feature_learning(requested, n_samples, learnable, in_memory) == expected
    # A fit over the ranks of a process group learns only where asked.
    assert plan_feature_learning(requested, n_samples, learnable, in_memory, distributed=True) == (
        None if requested == "auto" else expected
    )


def test_auto_by_default_learns_where_it_pays_and_passes_over_a_kernel_without_a_gradient(monkeypatch):
    import skgpu_kernel.planning.agop as agop_planning

    # The rule's bounds lowered so that a small problem falls inside them.
    monkeypatch.setattr(agop_planning, "AUTO_LEARNING_MIN_ROWS", 500)
    X, y = _few_relevant(1500, 0)
    X_test, y_test = _few_relevant(2000, 1)
    plain = AdaptiveKernelRegressor(feature_learning=None, random_state=0, dtype="float64").fit(X, y)
    auto = AdaptiveKernelRegressor(random_state=0, dtype="float64").fit(X, y)
    assert auto.feature_learning_ == "diagonal" and auto.feature_learning_iteration_ > 0
    assert _mse(auto, X_test, y_test) <= 0.5 * _mse(plain, X_test, y_test)

    def linear(A, B):
        return A @ B.T

    params = {"kernel": linear, "random_state": 0, "dtype": "float64"}
    passed_over = AdaptiveKernelRegressor(**params).fit(X[:600], y[:600])
    assert passed_over.feature_learning_ is None and passed_over.metric_ is None
    np.testing.assert_array_equal(
        passed_over.predict(X_test),
        AdaptiveKernelRegressor(feature_learning=None, **params).fit(X[:600], y[:600]).predict(X_test),
    )


def test_warm_start_continues_in_the_learnt_features():
    X, y = _few_relevant(400, 7, n_noise=4)
    model = AdaptiveKernelRegressor(
        feature_learning="diagonal", feature_learning_iter=2, warm_start=True, random_state=0, dtype="float64"
    ).fit(X, y)
    transform, scores = model.metric_transform_, model.feature_learning_scores_
    model.fit(X, y)
    assert model.feature_learning_scores_ == scores
    if transform is None:
        assert model.metric_transform_ is None
    else:
        np.testing.assert_array_equal(model.metric_transform_, transform)
    assert np.isfinite(model.predict(X)).all()


def test_the_path_stops_after_patience_fits_without_a_lower_loss(monkeypatch):
    losses = iter([1.0, 0.5, 0.7, 0.8, 0.1, 0.05])  # the plain model, then the path's steps
    candidate = feature_learning._CandidateRows.candidate

    def scored(self, fit, transform, plan, budget):
        scored = candidate(self, fit, transform, plan, budget)
        return dataclasses.replace(scored, losses=np.full(10, next(losses)))

    monkeypatch.setattr(feature_learning._CandidateRows, "candidate", scored)
    X, y = _few_relevant(300, 8, n_noise=2)
    model = AdaptiveKernelRegressor(feature_learning="diagonal", feature_learning_iter=4, random_state=0).fit(X, y)
    assert len(model.feature_learning_scores_) == 4  # plain, then steps 0-2: two without a lower loss than 0.5
    assert model.feature_learning_iteration_ == 1  # the path's first model, 0.5 below the plain 1.0 on every row
    assert model.kernel_.__class__.__name__ == "Laplacian"


def test_a_learnt_model_must_beat_the_plain_one_beyond_the_noise_of_the_held_out_rows():
    rng = np.random.RandomState(0)
    plain = rng.rand(40)
    assert feature_learning._learning_pays(plain - 0.1, plain)
    noise = rng.randn(40)
    noise = (noise - noise.mean()) / noise.std(ddof=1)
    # Lower by 0.02 on average, with a standard error of 0.3 / sqrt(40) = 0.047: within the noise.
    assert not feature_learning._learning_pays(plain - 0.02 + 0.3 * noise, plain)
    assert feature_learning._learning_pays(plain - 0.2 + 0.3 * noise, plain)  # 0.2 > 2 x 0.047
    assert not feature_learning._learning_pays(plain, plain)


class _RowCopies:
    """Counts host rows turned into tensors: a numpy array with ``X``'s columns and more rows than columns.

    Every copy of host rows to a device starts as such a conversion (``torch.as_tensor``,
    ``torch.tensor``, ``torch.from_numpy`` or ``torch.asarray``); the ``d x d`` metric
    and AGOP are not rows.
    """

    def __init__(self, monkeypatch, n_features):
        self.count = 0
        for name in ("as_tensor", "tensor", "from_numpy", "asarray"):
            monkeypatch.setattr(torch, name, self._counted(getattr(torch, name), n_features))

    def _counted(self, convert, n_features):
        def counted(data, *args, **kwargs):
            if isinstance(data, np.ndarray) and data.ndim == 2 and data.shape[1] == n_features:
                self.count += data.shape[0] > n_features
            return convert(data, *args, **kwargs)

        return counted


@pytest.mark.parametrize(
    "params",
    [
        {},  # the tune stage's exact solution
        {"alpha": 1.0},  # a given penalty: the direct solve
        {"alpha": 0.0},  # EigenPro 2, early-stopped on held-out rows
        {"solver": "cg"},
        {"n_centers": 200},  # CG on centers
        {"n_centers": 200, "solver": "eigenpro"},  # EigenPro 3
        {"feature_learning": "full"},
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_learning_fit_copies_its_rows_to_the_device_once_whatever_the_solver(monkeypatch, params, dtype):
    X, y = _few_relevant(700, 5, n_noise=2)
    X = X.astype(dtype)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 1, "random_state": 0, **params}
    expected = AdaptiveKernelRegressor(**params).fit(X, y)
    copies = _RowCopies(monkeypatch, X.shape[1])
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert copies.count == 1  # the plain fit, the path's fits, their AGOPs and scores, and the refit
    assert len(model.feature_learning_scores_) >= 2
    monkeypatch.undo()
    # Taking the rows from the one copy changes no value: the model is the one fitted with copies.
    np.testing.assert_array_equal(model.dual_coef_, expected.dual_coef_)


def test_without_room_for_the_rows_on_the_device_every_stage_copies_its_own(monkeypatch):
    X, y = _few_relevant(700, 6, n_noise=2)
    params = {"feature_learning": "diagonal", "feature_learning_iter": 1, "random_state": 0}
    expected = AdaptiveKernelRegressor(**params).fit(X, y)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate the rows")

    monkeypatch.setattr(prepare, "_copy_rows_to", out_of_memory)
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    np.testing.assert_array_equal(model.dual_coef_, expected.dual_coef_)


def test_the_candidates_rows_are_every_row_up_to_the_bound_then_a_share_of_the_final_fits_cost():
    from skgpu_kernel.planning.agop import (
        AUTO_LEARNING_MIN_ROWS,
        LEARNING_COST_SHARE,
        LEARNING_PATH_MAX_ROWS,
        plan_learning_rows,
    )

    assert plan_learning_rows(LEARNING_PATH_MAX_ROWS, None, 5) == LEARNING_PATH_MAX_ROWS
    # Beyond: 7 candidates on m rows cost the share of the final fit's n p kernel entries.
    n, p = 400_000, 20_000
    m = plan_learning_rows(n, p, 5)
    assert m == int((LEARNING_COST_SHARE * n * p / 7) ** 0.5)
    assert 7 * m * m <= LEARNING_COST_SHARE * n * p < 7 * (m + 1) ** 2
    assert plan_learning_rows(10**9, None, 5) == LEARNING_PATH_MAX_ROWS
    assert plan_learning_rows(LEARNING_PATH_MAX_ROWS + 1, 100, 5) == AUTO_LEARNING_MIN_ROWS


def test_beyond_the_bound_the_candidates_are_fitted_on_a_subsample_and_a_kept_plain_model_is_the_plain_fit(
    monkeypatch,
):
    import skgpu_kernel.planning.agop as agop_planning

    monkeypatch.setattr(agop_planning, "LEARNING_PATH_MAX_ROWS", 1000)
    monkeypatch.setattr(agop_planning, "AUTO_LEARNING_MIN_ROWS", 500)
    monkeypatch.setattr(feature_learning, "_learning_pays", lambda learnt, plain: False)
    fitted_rows = []
    fit = feature_learning.fit_kernel_model

    def counted(data, parameters, runtime, plan=None):
        fitted_rows.append(data.X.shape[0])
        return fit(data, parameters, runtime, plan)

    monkeypatch.setattr(feature_learning, "fit_kernel_model", counted)
    X, y = _few_relevant(3000, 7, n_noise=2)
    params = {"random_state": 0, "dtype": "float64", "feature_learning_iter": 2}
    model = AdaptiveKernelRegressor(**params).fit(X, y)
    learning = agop_planning.plan_learning_rows(3000, None, 2)
    assert model.feature_learning_ == "diagonal" and model.feature_learning_iteration_ == 0
    assert learning < 3000
    # Every candidate on the subsample's training rows; the final fit on every row.
    assert fitted_rows[:-1] == [learning - math.ceil(0.1 * learning)] * (len(fitted_rows) - 1)
    assert fitted_rows[-1] == 3000
    plain = AdaptiveKernelRegressor(feature_learning=None, **params).fit(X, y)
    np.testing.assert_array_equal(model.dual_coef_, plain.dual_coef_)


def test_a_handed_tuning_that_does_not_apply_is_tuned_again_and_recorded(monkeypatch):
    """Issue 64: the tune stage never runs again silently; the fit's record names the rerun."""
    fit = feature_learning.fit_kernel_model
    calls = []

    def with_a_tuning_that_scored_no_alpha(data, parameters, runtime, plan=None):
        calls.append(plan is not None)
        if plan is not None and plan.alpha_selection is not None:
            plan = dataclasses.replace(plan, alpha_selection=None)
        return fit(data, parameters, runtime, plan)

    monkeypatch.setattr(feature_learning, "fit_kernel_model", with_a_tuning_that_scored_no_alpha)
    X, y = _few_relevant(600, 5, n_noise=2)
    model = AdaptiveKernelRegressor(random_state=0, feature_learning="diagonal", feature_learning_iter=1).fit(X, y)
    assert any(calls)
    reruns = [entry for entry in model.fit_attempts_ if entry.get("event") == "ran_again"]
    assert reruns and reruns[0]["stage"] == "tune" and "asks for one" in reruns[0]["reason"]
    plain = AdaptiveKernelRegressor(random_state=0, feature_learning="diagonal", feature_learning_iter=1)
    monkeypatch.setattr(feature_learning, "fit_kernel_model", fit)
    assert not [entry for entry in plain.fit(X, y).fit_attempts_ if entry.get("event") == "ran_again"]
