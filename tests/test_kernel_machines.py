"""AdaptiveKernelRegressor / AdaptiveKernelClassifier against exact references.

These tests exercise the EigenPro 2 iteration, so they pin ``alpha=0.0``: on their
small, low-dimensional data ``alpha="auto"`` would choose a leave-one-out penalty and
solve by CG (tests/test_accuracy_defaults.py and tests/test_regularization.py test
that path).
"""

import io
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.datasets import load_digits
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.blockwise import kernel_predict
from skgpu_kernel.operators import EvaluatedOperator, OperatorBlocks
from skgpu_kernel.planning.kernel import cached_batch_limit
from skgpu_kernel.scaling import LEGW, ConstantRule, EigenProRule
from skgpu_kernel.solvers import eigenpro as eigenpro_solver
from skgpu_kernel.solvers.solution import Targets

from .conftest import RTOL


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def _interpolation_problem(seed=0, n=300, d=5):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X @ rng.randn(d)) + 0.1 * rng.randn(n)
    return X, y, rng.randn(100, d)


def test_converges_to_the_exact_interpolant_in_float64():
    X, y, X_test = _interpolation_problem()
    sigma = 1.0
    gamma = 1 / (2 * sigma**2)
    # The interpolant of the centred targets, plus their mean (the intercept).
    alpha = np.linalg.solve(rbf_kernel(X, X, gamma=gamma), y - y.mean())
    exact = rbf_kernel(X_test, X, gamma=gamma) @ alpha + y.mean()
    model = AdaptiveKernelRegressor(alpha=0.0, bandwidth=sigma, dtype="float64", n_epochs=100, tol=None, random_state=0)
    model.fit(X, y)
    error = np.linalg.norm(model.predict(X_test) - exact) / np.linalg.norm(exact)
    assert error <= 1e-3
    assert np.linalg.norm(model.predict(X) - y) / np.linalg.norm(y) <= 1e-3


def test_one_step_with_unit_batch_and_step_one_over_beta_interpolates_the_sample():
    rng = np.random.RandomState(1)
    X, y = rng.randn(1, 3), np.array([2.5])
    model = AdaptiveKernelRegressor(
        alpha=0.0, bandwidth=1.0, batch_size=1, n_components=0, n_epochs=1, dtype="float64", random_state=0
    ).fit(X, y)
    assert model.learning_rate_ == pytest.approx(1.0)  # 1 / beta, beta = 1 for the Gaussian
    assert model.predict(X)[0] == pytest.approx(2.5, rel=1e-12)


def test_one_step_on_a_sample_interpolates_it_within_a_larger_model(rng):
    # Run exactly one unit-batch step of the solver from a non-zero model.
    from skgpu_kernel.kernels import Gaussian

    kernel = Gaussian(bandwidth=0.7)
    X = torch.as_tensor(rng.randn(30, 2))
    Y = torch.as_tensor(rng.randn(30, 1))
    coef = torch.as_tensor(rng.randn(30, 1))
    batch = torch.tensor([4])
    operator = EvaluatedOperator(kernel, X, kernel.prepare_centers(X), OperatorBlocks(1, 16))
    plan = eigenpro_solver.EigenProPlan(1, lambda step, batch_size, steps: 1.0, 1)
    _, weighted, _, _ = eigenpro_solver._step(operator, Targets(Y), coef, batch, 30, 0, plan)
    coef.index_add_(0, batch, weighted, alpha=-1.0)  # eta / m = 1 / beta
    np.testing.assert_allclose((kernel(X[4:5], X) @ coef).item(), Y[4].item(), rtol=1e-12)


def test_digits_preconditioning_widens_the_critical_batch_20_fold(digits):
    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, random_state=0).fit(X, y)
    before, after = model.critical_batch_size_
    assert after / before >= 20
    assert model.n_components_ > 0 and model.batch_size_ > before


def test_digits_cross_validated_accuracy_with_defaults(digits):
    # Shuffled folds: digits is ordered by writer, and no kernel interpolant reaches
    # 0.98 on the unshuffled 3-fold split (the exact Gaussian one gets 0.977).
    X, y = digits
    cv = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
    scores = cross_val_score(AdaptiveKernelClassifier(alpha=0.0, random_state=0), X, y, cv=cv)
    assert scores.mean() >= 0.98


def test_pipeline_and_grid_search_over_bandwidth_with_two_jobs(digits):
    X, y = digits
    pipe = make_pipeline(
        StandardScaler(), AdaptiveKernelClassifier(alpha=0.0, n_epochs=3, batch_size=128, random_state=0)
    )
    search = GridSearchCV(pipe, {"adaptivekernelclassifier__bandwidth": [4.0, 8.0]}, cv=2, n_jobs=2)
    search.fit(X[:600], y[:600])
    assert search.best_params_["adaptivekernelclassifier__bandwidth"] in (4.0, 8.0)
    assert search.score(X[600:900], y[600:900]) > 0.9


def test_grid_search_reaches_kernel_parameters_of_a_kernel_object(digits):
    from skgpu_kernel.kernels import Laplacian

    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, kernel=Laplacian(), n_epochs=2, batch_size=64, random_state=0)
    search = GridSearchCV(model, {"kernel__bandwidth": [2.0, 6.0]}, cv=2).fit(X[:300], y[:300])
    assert search.best_estimator_.kernel_.bandwidth in (2.0, 6.0)


def test_multi_output_regression_matches_separate_fits():
    X, y, X_test = _interpolation_problem(n=120)
    Y = np.column_stack([y, -2 * y + 1])
    params = dict(bandwidth=1.0, dtype="float64", n_epochs=5, batch_size=16, n_components=3, random_state=0)
    joint = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, Y)
    assert joint.predict(X_test).shape == (100, 2)
    for column in range(2):
        single = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, Y[:, column])
        np.testing.assert_allclose(joint.predict(X_test)[:, column], single.predict(X_test), rtol=1e-9, atol=1e-12)


def test_classifier_handles_string_labels_and_binary_decision_function():
    rng = np.random.RandomState(0)
    X = np.vstack([rng.randn(40, 2) + 2, rng.randn(40, 2) - 2])
    y = np.array(["spam"] * 40 + ["ham"] * 40)
    model = AdaptiveKernelClassifier(alpha=0.0, n_epochs=3, random_state=0).fit(X, y)
    assert list(model.classes_) == ["ham", "spam"]
    scores = model.decision_function(X)
    assert scores.shape == (80,)
    np.testing.assert_array_equal(model.predict(X), np.where(scores > 0, "spam", "ham"))
    assert model.score(X, y) == 1.0


def test_fitted_attributes_record_every_decision(digits):
    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, n_epochs=2, random_state=0).fit(X[:500], y[:500])
    assert model.device_ == ("cuda" if torch.cuda.is_available() else "cpu") and model.dtype_ == np.float32
    assert model.centers_.shape == (500, 64) and model.dual_coef_.shape == (500, 10)
    assert isinstance(model.centers_, np.ndarray) and isinstance(model.dual_coef_, np.ndarray)
    assert model.subsample_size_ == 500
    assert model.top_eigenvalues_.shape == (model.n_components_ + 1,)
    assert np.all(np.diff(model.top_eigenvalues_) <= 0)
    # K(X, X) is cached: the capacity is the memory limit, and the batch keeps 32 updates per epoch.
    assert model.kernel_cached_ and model.batch_capacity_ == 500
    assert model.batch_size_ == min(int(model.critical_batch_size_[1] / 2), cached_batch_limit(500))
    assert model.learning_rate_ > 0 and model.n_epochs_ == 2 == len(model.history_)
    assert set(model.history_[0]) == {"epoch", "n_steps", "train_loss", "learning_rate", "validation_score", "seconds"}
    assert model.history_[-1]["learning_rate"] == model.learning_rate_
    assert model.scaling_rule_.get_params() == EigenProRule().get_params()
    assert model.n_steps_total_ == 2 * int(np.ceil(500 / model.batch_size_))
    # bandwidth="auto": searched from the scale rule.
    assert model.bandwidth_selection_.scale == pytest.approx(np.sqrt(64 * X[:500].var() / 2))
    assert model.bandwidth_ == model.bandwidth_selection_.bandwidth == model.kernel_.bandwidth
    np.testing.assert_allclose(model.X_offset_, X[:500].mean(axis=0))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_predictions_do_not_depend_on_the_block_size(dtype, digits):
    X, y = digits
    model = AdaptiveKernelRegressor(alpha=0.0, n_epochs=2, dtype=dtype, random_state=0).fit(
        X[:400], y[:400].astype(float)
    )
    tensors = model._prediction_tensors()
    centers, coef, offset = tensors.centers, tensors.coef, tensors.offset
    itemsize = 4 if dtype == "float32" else 8
    # Budgets that force 3-row blocks with few columns, and 256-row blocks.
    small = kernel_predict(model.kernel_, X[400:450], centers, coef, budget=2 * itemsize * 3 * 500, offset=offset)
    large = kernel_predict(model.kernel_, X[400:450], centers, coef, budget=10**9, offset=offset)
    # Column blocks change the summation order: compare against the float64 result
    # with the rounding scale of the sum, sum_j |k(x, c_j) alpha_j|.
    gram = rbf_kernel(X[400:450], model.centers_.astype(float), gamma=1 / (2 * model.bandwidth_**2))
    exact = gram @ model.dual_coef_.astype(float)
    scale = np.abs(gram) @ np.abs(model.dual_coef_.astype(float))
    for result in (small, large):
        assert np.all(np.abs(result - exact) <= RTOL[dtype] * scale)
    # Rows predicted alone or together are bitwise equal (fixed row blocks).
    one_by_one = np.concatenate([model.predict(X[i : i + 1]) for i in range(400, 450)])
    np.testing.assert_array_equal(one_by_one, model.predict(X[400:450]))


def test_reproducible_with_random_state(digits):
    X, y = digits
    params = dict(n_epochs=2, batch_size=64, random_state=3)
    first = AdaptiveKernelClassifier(alpha=0.0, **params).fit(X[:300], y[:300]).decision_function(X[300:400])
    second = AdaptiveKernelClassifier(alpha=0.0, **params).fit(X[:300], y[:300]).decision_function(X[300:400])
    np.testing.assert_array_equal(first, second)
    other = AdaptiveKernelClassifier(alpha=0.0, **{**params, "random_state": 4}).fit(X[:300], y[:300])
    assert not np.array_equal(other.decision_function(X[300:400]), first)


def test_sample_weight_zero_equals_removal_and_ones_equal_none(digits):
    X, y = digits
    X, y = X[:200], y[:200].astype(float)
    params = dict(n_epochs=2, batch_size=32, random_state=0)
    weights = np.ones(200)
    weights[::4] = 0
    weighted = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y, sample_weight=weights)
    removed = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X[weights > 0], y[weights > 0])
    np.testing.assert_array_equal(weighted.predict(X), removed.predict(X))
    ones = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y, sample_weight=np.ones(200))
    plain = AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y)
    np.testing.assert_array_equal(ones.predict(X), plain.predict(X))


def test_sample_weight_pulls_the_fit_towards_heavy_samples():
    rng = np.random.RandomState(0)
    X = rng.randn(200, 3)
    y = rng.randn(200)
    weights = np.where(np.arange(200) < 100, 1.0, 0.05)
    # Plain SGD (no preconditioner) and two epochs: far from the interpolant, where
    # the weights decide which samples are fitted first.
    params = dict(bandwidth=1.0, n_epochs=2, batch_size=16, n_components=0, random_state=0)
    weighted = (AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y, sample_weight=weights).predict(X) - y) ** 2
    plain = (AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y).predict(X) - y) ** 2
    assert weighted[:100].mean() < 0.8 * plain[:100].mean()
    assert weighted[:100].mean() < 0.8 * weighted[100:].mean()


@pytest.mark.parametrize("bad_weights", [-np.ones(50), np.zeros(50)])
def test_bad_sample_weight_is_rejected(bad_weights):
    X, y = np.random.RandomState(0).randn(50, 2), np.arange(50.0)
    with pytest.raises(ValueError, match=r"[Ss]ample.weight"):
        AdaptiveKernelRegressor(alpha=0.0).fit(X, y, sample_weight=bad_weights)


def test_early_stopping_keeps_the_best_validation_model(digits):
    X, y = digits
    model = AdaptiveKernelClassifier(
        alpha=0.0,
        early_stopping=True,
        n_iter_no_change=1,
        tol=0.5,
        n_epochs=20,
        validation_fraction=0.2,
        random_state=0,
    ).fit(X, y)
    assert model.n_epochs_ == 2, "no epoch gains 0.5 accuracy over the first"
    assert all("validation_score" in record for record in model.history_)
    assert model.centers_.shape[0] == X.shape[0] - int(np.ceil(0.2 * X.shape[0]))
    assert model.history_[0]["validation_score"] > 0.9


def test_warm_start_continues_from_the_previous_coefficients(digits):
    X, y = digits
    X, y = X[:400], y[:400].astype(float)
    model = AdaptiveKernelRegressor(alpha=0.0, n_epochs=1, batch_size=32, warm_start=True, random_state=0).fit(X, y)
    first = model.history_[-1]["train_loss"]
    model.fit(X, y)
    assert model.history_[-1]["train_loss"] < 0.7 * first
    assert model.n_epochs_total_ == 2
    with pytest.raises(ValueError, match="same X"):
        model.fit(X[::-1], y[::-1] * 0 + X[::-1, 0])
    model.fit(X[np.random.RandomState(0).permutation(400)][np.argsort(np.random.RandomState(0).permutation(400))], y)


def test_verbose_prints_decisions_and_epochs(capsys, digits):
    X, y = digits
    AdaptiveKernelClassifier(alpha=0.0, n_epochs=2, verbose=1, random_state=0).fit(X[:300], y[:300])
    out = capsys.readouterr().out
    assert "batch capacity m_G=" in out and "critical batch" in out and "step size" in out
    assert "epoch 1/2: train loss" in out and "epoch 2/2" in out


def test_out_of_memory_halves_the_batch_and_continues(monkeypatch, capsys, digits):
    X, y = digits
    real_step = eigenpro_solver._step

    def step_failing_on_large_batches(kernel, data, coef, batch, *args):
        if batch.shape[0] > 50:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(kernel, data, coef, batch, *args)

    params = {"alpha": 0.0, "n_epochs": 2, "random_state": 0}
    planned_small = AdaptiveKernelClassifier(batch_size=50, **params).fit(X[:600], y[:600])
    monkeypatch.setattr(eigenpro_solver, "_step", step_failing_on_large_batches)
    model = AdaptiveKernelClassifier(batch_size=200, verbose=1, **params).fit(X[:600], y[:600])
    assert model.batch_size_ == 50
    assert "out of memory in a step of 200 rows" in capsys.readouterr().out
    # Each halving is a new attempt planned with the halved batch from the same random
    # draws: the model is the one planned with the batch that fits (step sizes included).
    assert model.learning_rate_ == planned_small.learning_rate_
    np.testing.assert_array_equal(model.decision_function(X[600:900]), planned_small.decision_function(X[600:900]))
    shrank = [(entry["from"], entry["to"]) for entry in model.fit_attempts_ if entry.get("event") == "out_of_memory"]
    assert shrank[:2] == [(200, 100), (100, 50)] and set(shrank) == {(200, 100), (100, 50)}  # each fit of the path
    assert model.score(X[600:900], y[600:900]) > 0.9


def test_other_runtime_errors_propagate(monkeypatch, digits):
    X, y = digits

    def broken_step(*args):
        raise RuntimeError("shape mismatch in a user kernel")

    monkeypatch.setattr(eigenpro_solver, "_step", broken_step)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        AdaptiveKernelClassifier(alpha=0.0, n_epochs=1, random_state=0).fit(X[:100], y[:100])


def _tensors_pickled(obj):
    """The shapes of the torch tensors anywhere in ``obj``'s pickle (nested fitted objects too)."""
    found = []

    class _Watching(pickle.Pickler):
        def reducer_override(self, value):
            if isinstance(value, torch.Tensor):
                found.append(tuple(value.shape))
            return NotImplemented

    _Watching(io.BytesIO()).dump(obj)
    return found


def test_pickle_round_trip_and_cpu_fallback_for_a_cuda_model(digits):
    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, n_epochs=2, random_state=0).fit(X[:300], y[:300])
    expected = model.decision_function(X[300:350])
    assert not _tensors_pickled(model), "pickles hold numpy only: a CUDA model then loads without a GPU"
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.decision_function(X[300:350]), expected)
    if not torch.cuda.is_available():
        # As if fitted on a GPU machine: the model asks for CUDA, which is absent here.
        restored.set_params(device="cuda")
        restored.device_ = "cuda:0"
        with pytest.warns(RuntimeWarning, match="predicting on the CPU"):
            np.testing.assert_array_equal(restored.decision_function(X[300:350]), expected)


@pytest.mark.parametrize(
    ("X", "y", "error", "match"),
    [
        # NaN, strings and sparse matrices in X are taken (tests/test_tables.py); these are not.
        (np.array([[1.0, np.inf], [0.0, 1.0]]), [0.0, 1.0], ValueError, "infinity"),
        (np.array([[1.0, -np.inf], [np.nan, 1.0]]), [0.0, 1.0], ValueError, "infinity"),
        (np.empty((0, 3)), [], ValueError, "0 sample"),
        (np.ones((4, 2, 2)), [0.0, 1.0, 0.0, 1.0], ValueError, "dim 3"),
        (np.array([[{"a": 1}, 1.0], [2.0, 1.0]], dtype=object), [0.0, 1.0], TypeError, "string or a real number"),
        (np.array([[1.0 + 1j, 1.0], [2.0, 1.0]]), [0.0, 1.0], ValueError, "[Cc]omplex"),
        (np.ones((3, 2)), [0.0, np.nan, 1.0], ValueError, "NaN"),
    ],
)
def test_bad_training_input_names_the_problem(X, y, error, match):
    with pytest.raises(error, match=match):
        AdaptiveKernelRegressor(alpha=0.0).fit(X, y)


def test_sparse_input_beyond_the_memory_budget_is_refused_by_size():
    X = sp.csr_matrix(np.eye(64))  # 32 KiB dense
    with pytest.raises(ValueError, match=r"sparse matrix of shape \(64, 64\).*0.00 GiB, over the memory budget"):
        AdaptiveKernelRegressor(alpha=0.0, memory_budget=1024).fit(X, np.arange(64.0))


def test_wrong_feature_count_at_predict():
    model = AdaptiveKernelRegressor(alpha=0.0, n_epochs=1).fit(np.random.RandomState(0).randn(20, 3), np.arange(20.0))
    with pytest.raises(ValueError, match="3 features"):
        model.predict(np.ones((2, 4)))


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        ({"bandwidth": -1.0}, ValueError, "bandwidth"),
        ({"bandwidth": 0}, ValueError, "bandwidth"),
        ({"kernel": "sigmoid"}, ValueError, "kernel"),
        ({"device": "tpu"}, ValueError, "Unknown device 'tpu'"),
        ({"memory_budget": "a lot"}, ValueError, "Cannot parse memory_budget"),
        ({"memory_budget": "-3GB"}, ValueError, "memory_budget"),
        ({"dtype": "float16"}, ValueError, "dtype"),
        ({"kernel": "matern", "kernel_params": {"nu": 0.7}}, ValueError, "Matern nu"),
    ],
)
def test_bad_parameters_name_the_problem(params, error, match):
    X, y = np.random.RandomState(0).randn(20, 3), np.arange(20.0)
    with pytest.raises(error, match=match):
        AdaptiveKernelRegressor(alpha=0.0, **params).fit(X, y)


@pytest.mark.parametrize("bandwidth", [1e-4, 1e4])
def test_extreme_bandwidth_warns_and_gives_a_finite_model(bandwidth, digits):
    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, bandwidth=bandwidth, n_epochs=2, random_state=0)
    with pytest.warns(UserWarning, match="bandwidth"):
        model.fit(X[:300], y[:300])
    assert np.all(np.isfinite(model.decision_function(X[300:400])))
    assert np.all(np.isfinite(model.dual_coef_))


def test_kernel_returning_infinities_is_named_as_the_problem():
    def exploding(X, Z):
        return torch.exp(100 * (X @ Z.T))  # overflows float32

    X, y = np.random.RandomState(0).randn(40, 3), np.arange(40.0)
    with pytest.raises(ValueError, match="non-finite values"):
        AdaptiveKernelRegressor(alpha=0.0, kernel=exploding, n_epochs=2, batch_size=8, n_components=0).fit(X, y)


def test_unstable_steps_are_rolled_back_with_a_warning():
    # Four times the analytic step: the iteration overshoots, the solver detects
    # the growing loss, rolls back, halves the step and still converges.
    X, y, _ = _interpolation_problem(n=150)
    params = dict(bandwidth=1.0, n_epochs=8, batch_size=150, random_state=0)
    with pytest.warns(RuntimeWarning, match="diverged"):
        model = AdaptiveKernelRegressor(alpha=0.0, scaling_rule=EigenProRule(scale=4), **params).fit(X, y)
    assert np.all(np.isfinite(model.dual_coef_))
    assert model.history_[-1]["train_loss"] < model.history_[0]["train_loss"]
    # The halving acts on top of the rule: half of four times the analytic step.
    analytic = AdaptiveKernelRegressor(alpha=0.0, **{**params, "n_epochs": 1}).fit(X, y).learning_rate_
    assert model.learning_rate_ == pytest.approx(2 * analytic, rel=1e-12)
    assert model.scaling_rule_.scale == 4, "the rule itself is not modified by the rollback"


def test_constant_rule_sets_the_learning_rate(digits):
    X, y = digits
    X, y = X[:200], y[:200].astype(float)
    rule = ConstantRule(base_lr=1e-6)
    model = AdaptiveKernelRegressor(alpha=0.0, scaling_rule=rule, n_epochs=2, batch_size=32, random_state=0).fit(X, y)
    assert model.learning_rate_ == 1e-6
    assert [record["learning_rate"] for record in model.history_] == [1e-6, 1e-6]
    # Such a step barely moves the model away from zero: predictions stay at the intercept.
    assert model.intercept_ == pytest.approx(y.mean())
    assert np.abs(model.predict(X) - model.intercept_).max() < 1e-4 * np.abs(y).max()
    assert model.scaling_rule_ is not rule and model.scaling_rule is rule
    assert rule.get_params() == ConstantRule(base_lr=1e-6).get_params()
    assert model.n_steps_total_ == 2 * 7


def test_legw_on_the_classifier_warms_up_then_decays(digits):
    X, y = digits
    # 600 rows in batches of 64: 10 updates per epoch.  k = 64 / 16 = 4: peak
    # 2 * 100, warm-up 4 * 0.5 = 2 epochs, quadratic decay to 0 over epochs 2 to 5.
    rule = LEGW(base_lr=100.0, base_batch_size=16, base_warmup_epochs=0.5)
    model = AdaptiveKernelClassifier(alpha=0.0, scaling_rule=rule, batch_size=64, n_epochs=5, random_state=0)
    model.fit(X[:600], y[:600])
    rates = [record["learning_rate"] for record in model.history_]  # at each epoch's last update
    expected = [200 * 10 / 20, 200.0] + [200 * (1 - (t / 10 - 2) / 3) ** 2 for t in (29, 39, 49)]
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    assert model.learning_rate_ == rates[-1]
    assert model.n_steps_total_ == 50
    assert model.history_[-1]["train_loss"] < model.history_[0]["train_loss"]
    assert model.score(X[600:900], y[600:900]) > 0.9


def test_warm_start_continues_the_schedule(digits):
    X, y = digits
    X, y = X[:200], y[:200].astype(float)
    # 7 updates per epoch; the rate halves after each epoch.
    rule = ConstantRule(base_lr=1.0, decay="step", decay_rate=0.5, decay_every=1.0)
    model = AdaptiveKernelRegressor(
        alpha=0.0, scaling_rule=rule, n_epochs=1, batch_size=32, n_components=0, warm_start=True, random_state=0
    )
    assert model.fit(X, y).learning_rate_ == 1.0
    assert model.fit(X, y).learning_rate_ == 0.5
    assert model.n_steps_total_ == 14 and model.n_epochs_total_ == 2
    model.set_params(warm_start=False)
    assert model.fit(X, y).learning_rate_ == 1.0 and model.n_steps_total_ == 7


@pytest.mark.parametrize(
    ("scaling_rule", "match"),
    [
        ("adam", "'scaling_rule' parameter of AdaptiveKernelRegressor"),
        (LEGW(base_lr=-1.0), "'base_lr' parameter of LEGW"),
        (EigenProRule(scale=0), "'scale' parameter of EigenProRule"),
    ],
)
def test_bad_scaling_rules_are_named(scaling_rule, match):
    X, y = np.random.RandomState(0).randn(20, 3), np.arange(20.0)
    with pytest.raises(ValueError, match=match):
        AdaptiveKernelRegressor(alpha=0.0, scaling_rule=scaling_rule).fit(X, y)


@pytest.mark.gpu
def test_cuda_fit_matches_cpu_and_pickles_to_numpy(digits):
    X, y = digits
    params = dict(n_epochs=2, batch_size=128, dtype="float64", random_state=0)
    gpu = AdaptiveKernelClassifier(alpha=0.0, device="cuda", **params).fit(X[:800], y[:800])
    cpu = AdaptiveKernelClassifier(alpha=0.0, device="cpu", **params).fit(X[:800], y[:800])
    assert gpu.device_.startswith("cuda")
    # Named in the failure: the resolved choices (plain fitted values) that the two devices made differently.
    differing = {
        name: (value, getattr(cpu, name, None))
        for name, value in vars(gpu).items()
        if name.endswith("_") and isinstance(value, (bool, int, float, str)) and value != getattr(cpu, name, None)
    }
    np.testing.assert_allclose(
        gpu.decision_function(X[800:]), cpu.decision_function(X[800:]), rtol=1e-8, atol=1e-10, err_msg=str(differing)
    )
    state = gpu.__getstate__()
    assert not any(isinstance(value, torch.Tensor) for value in state.values())
    restored = pickle.loads(pickle.dumps(gpu))
    restored.set_params(device="cpu")
    # atol: entries near zero come from cancellation, where only the absolute error is meaningful.
    np.testing.assert_allclose(
        restored.decision_function(X[800:]), gpu.decision_function(X[800:]), rtol=1e-10, atol=1e-12
    )


@pytest.mark.gpu
def test_cuda_auto_decisions_use_the_device(digits):
    X, y = digits
    model = AdaptiveKernelClassifier(alpha=0.0, random_state=0).fit(X, y)
    assert model.device_.startswith("cuda")
    assert model.batch_capacity_ >= 256
    assert model.memory_budget_ > 10**9
