"""BufferedSGDRegressor / BufferedSGDClassifier against closed forms and scikit-learn."""

import hashlib
import os
import pickle
import threading

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.base import clone
from sklearn.datasets import load_digits, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skgpu_kernel import BufferedSGDClassifier, BufferedSGDRegressor
from skgpu_kernel.scaling import LEGW, ConstantRule, EigenProRule, ScalingRule
from skgpu_kernel.solvers import sgd as sgd_solver

from .conftest import RTOL


def _regression(rng, n=4000, d=5, noise=1.0):
    X = rng.randn(n, d)
    coef = rng.randn(d)
    y = X @ coef + 0.5 + noise * rng.randn(n)
    return X, y


def _lstsq(X, y):
    design = np.hstack([X, np.ones((X.shape[0], 1))])
    return np.linalg.lstsq(design, y, rcond=None)[0]


def _parameters(model):
    return np.r_[np.ravel(model.coef_), np.ravel(model.intercept_)]


def _file_digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_decaying_step_reaches_least_squares_solution():
    rng = np.random.RandomState(0)
    n, d = 200_000, 20
    X = rng.randn(n, d) * np.linspace(0.5, 2.0, d)
    y = X @ rng.randn(d) + 1.0 + rng.randn(n)
    solution = _lstsq(X, y)
    decaying = BufferedSGDRegressor(
        penalty=None, scaling_rule=EigenProRule(decay="polynomial"), n_epochs=10, tol=None, random_state=0
    ).fit(X, y)
    error = np.linalg.norm(_parameters(decaying) - solution) / np.linalg.norm(solution)
    assert error <= 1e-2
    constant = BufferedSGDRegressor(penalty=None, n_epochs=10, tol=None, random_state=0).fit(X, y)
    constant_error = np.linalg.norm(_parameters(constant) - solution) / np.linalg.norm(solution)
    assert constant_error > 3 * error, "a constant step keeps a noise floor that the decay removes"


def test_buffer_reuse_bias_grows_with_the_step():
    """With R > 1 rounds per buffer and a constant step the iterate settles at a distance
    O(step) from the optimum (BMGD's bias); full-buffer batches remove sampling noise, so
    what is left is the bias of cycling through buffers."""
    X, y = _regression(np.random.RandomState(0))
    solution = _lstsq(X, y)

    def bias(rate, n_rounds):
        model = BufferedSGDRegressor(
            penalty=None,
            scaling_rule=ConstantRule(base_lr=rate),
            batch_size=1000,
            buffer_size=1000,
            n_rounds=n_rounds,
            shuffle=False,
            n_epochs=int(40 / rate / n_rounds),
            tol=None,
            dtype="float64",
        ).fit(X, y)
        return np.linalg.norm(_parameters(model) - solution)

    biases = [bias(rate, 4) for rate in (0.4, 0.1, 0.025)]
    assert biases[0] > 2 * biases[1] > 4 * biases[2] > 0
    assert bias(0.1, 4) > 2 * bias(0.1, 1), "reusing each buffer R times amplifies the bias"


def test_memmap_npy_and_array_give_the_same_model(tmp_path):
    rng = np.random.RandomState(1)
    X, y = _regression(rng, n=5000, d=8)
    X = X.astype(np.float32)
    path = tmp_path / "X.npy"
    np.save(path, X)
    digest = _file_digest(path)
    params = {"buffer_size": 1200, "n_epochs": 3, "random_state": 0, "tol": None}
    from_array = BufferedSGDRegressor(**params).fit(X, y)
    from_path = BufferedSGDRegressor(**params).fit(str(path), y)
    from_memmap = BufferedSGDRegressor(**params).fit(np.load(path, mmap_mode="r"), y)
    for model in (from_path, from_memmap):
        np.testing.assert_allclose(model.coef_, from_array.coef_, rtol=0, atol=1e-6)
        np.testing.assert_allclose(model.intercept_, from_array.intercept_, rtol=0, atol=1e-6)
        np.testing.assert_allclose(model.predict(X), from_array.predict(X), rtol=0, atol=1e-5)
    np.testing.assert_allclose(from_path.predict(str(path)), from_array.predict(X), rtol=0, atol=1e-5)
    assert _file_digest(path) == digest, "the source file must never be written"
    assert from_array.buffer_size_ == 1200 and len(from_array.history_) == 3


def _prefetch_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("skgpu_kernel-prefetch")]


def test_no_reader_thread_outlives_a_fit(tmp_path):
    X, y = _regression(np.random.RandomState(19), n=3000)
    # Stopped early by tol: the passes planned after the stop are never read.
    model = BufferedSGDRegressor(buffer_size=500, n_epochs=50, tol=10.0, n_iter_no_change=1, random_state=0)
    model.fit(X, y)
    assert model.n_iter_ < 50 and not _prefetch_threads()
    with pytest.raises(ValueError, match="non-finite"):
        BufferedSGDRegressor(buffer_size=500, scaling_rule=ConstantRule(base_lr=1e4)).fit(X, y)
    assert not _prefetch_threads()


def test_prefetch_does_not_change_the_model(tmp_path):
    X, y = _regression(np.random.RandomState(2), n=3000)
    params = {"buffer_size": 700, "n_epochs": 2, "random_state": 0, "tol": None}
    on = BufferedSGDRegressor(prefetch=True, **params).fit(X, y)
    off = BufferedSGDRegressor(prefetch=False, **params).fit(X, y)
    np.testing.assert_array_equal(on.coef_, off.coef_)
    assert 0.0 <= on.io_wait_fraction_ <= 1.0


class _SlicedDataset:
    """An h5py-style dataset: shape, dtype and row slicing only."""

    def __init__(self, array):
        self._array = array
        self.shape, self.dtype = array.shape, array.dtype

    def __getitem__(self, rows):
        return self._array[rows].copy()


def test_h5py_style_dataset_gives_the_same_model():
    X, y = _regression(np.random.RandomState(3), n=2000)
    params = {"buffer_size": 500, "n_epochs": 2, "random_state": 0}
    reference = BufferedSGDRegressor(**params).fit(X, y)
    model = BufferedSGDRegressor(**params).fit(_SlicedDataset(X), y)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=0, atol=1e-6)
    assert model.n_features_in_ == X.shape[1]


def test_sparse_input_matches_dense():
    rng = np.random.RandomState(4)
    X = sp.random(3000, 30, density=0.2, format="csr", random_state=rng)
    y = X @ rng.randn(30) + 0.1 * rng.randn(3000)
    params = {"n_epochs": 3, "random_state": 0, "buffer_size": 1000}
    dense = BufferedSGDRegressor(**params).fit(X.toarray(), y)
    sparse = BufferedSGDRegressor(**params).fit(X, y)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=0, atol=1e-5)
    np.testing.assert_allclose(sparse.predict(X), dense.predict(X.toarray()), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ridge_penalty_reaches_the_ridge_solution(dtype):
    X, y = _regression(np.random.RandomState(5), n=3000, d=4)
    alpha = 0.5
    model = BufferedSGDRegressor(
        alpha=alpha,
        scaling_rule=EigenProRule(decay="polynomial"),
        batch_size=1000,
        n_epochs=100,
        tol=None,
        fit_intercept=False,
        dtype=dtype,
        random_state=0,
    ).fit(X, y)
    # Mean square loss / 2 + alpha / 2 ||w||^2 -> (X^T X / n + alpha I) w = X^T y / n.
    n = X.shape[0]
    expected = np.linalg.solve(X.T @ X / n + alpha * np.eye(X.shape[1]), X.T @ y / n)
    # Large batches and a decaying step leave SGD noise of about 1e-3 here.
    np.testing.assert_allclose(model.coef_, expected, rtol=0, atol=2e-3)
    # Trained in dtype, stored and predicted in X's precision (float64 here; see tests/test_dtype.py).
    assert model.dtype_ == np.dtype(dtype)
    assert model.coef_.dtype == X.dtype == np.float64 and model.predict(X).dtype == np.float64


def test_multi_output_equals_separate_fits():
    rng = np.random.RandomState(6)
    X, y = _regression(rng, n=2000)
    Y = np.column_stack([y, 2 * y - 1])
    params = {"n_epochs": 3, "random_state": 0, "dtype": "float64", "scaling_rule": ConstantRule(base_lr=0.05)}
    both = BufferedSGDRegressor(batch_size=32, **params).fit(X, Y)
    assert both.coef_.shape == (2, X.shape[1]) and both.predict(X).shape == (2000, 2)
    for column in range(2):
        alone = BufferedSGDRegressor(batch_size=32, **params).fit(X, Y[:, column])
        np.testing.assert_allclose(both.coef_[column], alone.coef_, rtol=RTOL["float64"] * 1e3)


def test_huber_resists_outliers():
    rng = np.random.RandomState(7)
    X, y = _regression(rng, n=3000, d=3, noise=0.1)
    clean = _lstsq(X, y)
    y_dirty = y.copy()
    y_dirty[:150] += 200.0
    params = {"n_epochs": 20, "random_state": 0, "tol": None, "penalty": None}
    huber = BufferedSGDRegressor(loss="huber", epsilon=1.0, scaling_rule=EigenProRule(decay="polynomial"), **params)
    squared = BufferedSGDRegressor(scaling_rule=EigenProRule(decay="polynomial"), **params)
    huber_error = np.linalg.norm(_parameters(huber.fit(X, y_dirty))[:-1] - clean[:-1])
    squared_error = np.linalg.norm(_parameters(squared.fit(X, y_dirty))[:-1] - clean[:-1])
    assert huber_error < 0.2 < squared_error


def test_partial_fit_continues_the_schedule():
    X, y = _regression(np.random.RandomState(8), n=1000)
    rule = LEGW(base_lr=0.01, base_batch_size=10, base_warmup_epochs=0.5)
    model = BufferedSGDRegressor(scaling_rule=rule, batch_size=100, n_epochs=6, random_state=0)
    rates = []
    for _ in range(3):
        model.partial_fit(X, y)
        rates.append(model.learning_rate_)
    assert model.t_ == 30 and len(model.history_) == 3 and model.n_iter_ == 1
    schedule = rule.schedule(100, 30, steps_per_epoch=10, n_epochs=6)
    np.testing.assert_allclose(rates, schedule[[9, 19, 29]])
    assert rates[0] < rates[1] < rates[2] or rates[1] > rates[2], "the warm-up of 5 epochs continues across calls"
    with pytest.raises(ValueError, match="features"):
        model.partial_fit(X[:, :3], y)


def test_grid_search_over_base_lr_leaves_the_rule_alone():
    X, y = _regression(np.random.RandomState(9), n=600)
    rule = ConstantRule(base_lr=0.001)
    before = rule.get_params()
    search = GridSearchCV(
        BufferedSGDRegressor(scaling_rule=rule, n_epochs=3, random_state=0),
        {"scaling_rule__base_lr": [0.001, 0.01, 0.1]},
        cv=3,
    ).fit(X, y)
    assert search.best_params_ == {"scaling_rule__base_lr": 0.1}
    assert rule.get_params() == before
    assert search.best_estimator_.learning_rate_ == pytest.approx(0.1)


def test_sizes_larger_than_the_data_are_clamped_with_a_warning():
    X, y = _regression(np.random.RandomState(10), n=300)
    with pytest.warns(UserWarning, match="buffer_size=1000"):
        model = BufferedSGDRegressor(buffer_size=1000, n_epochs=1).fit(X, y)
    assert model.buffer_size_ == 300
    with pytest.warns(UserWarning, match="batch_size=500"):
        model = BufferedSGDRegressor(buffer_size=200, batch_size=500, n_epochs=1).fit(X, y)
    assert model.batch_size_ == 200


def test_diverging_step_raises_naming_the_learning_rate():
    X, y = _regression(np.random.RandomState(11), n=500)
    model = BufferedSGDRegressor(scaling_rule=ConstantRule(base_lr=1e4), n_epochs=5)
    with pytest.raises(ValueError, match=r"learning rate 1e\+04"):
        model.fit(X, y)
    assert not hasattr(model, "coef_"), "no NaN model is left behind"
    good = BufferedSGDRegressor(n_epochs=2, random_state=0).fit(X, y)
    coef = good.coef_.copy()
    with pytest.raises(ValueError, match="non-finite"):
        good.set_params(scaling_rule=ConstantRule(base_lr=1e4)).partial_fit(X, y)
    np.testing.assert_array_equal(good.coef_, coef)


class _TruncatingRule(ScalingRule):
    """A constant rule that truncates a file after a few updates (simulates a shrinking source)."""

    def __init__(self, path=None, after=3):
        self.path = path
        self.after = after

    def __call__(self, step, context):
        if step == self.after:
            os.truncate(self.path, 1024)
        return 0.01


def _steps_out_of_memory_above(monkeypatch, rows):
    """Every BMGD step on more than ``rows`` rows fails as a device out of memory would."""
    real_step = sgd_solver._step

    def step(loss, coef, intercept, batch, *args):
        if batch[0].shape[0] > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(loss, coef, intercept, batch, *args)

    monkeypatch.setattr(sgd_solver, "_step", step)


def test_out_of_memory_halves_the_batch_and_goes_on(monkeypatch, capsys):
    X, y = _regression(np.random.RandomState(0), n=3000)
    settings = dict(scaling_rule=ConstantRule(0.02), n_epochs=3, tol=None, random_state=0)
    planned_small = BufferedSGDRegressor(batch_size=50, **settings).fit(X, y)
    _steps_out_of_memory_above(monkeypatch, 50)
    halved = BufferedSGDRegressor(batch_size=200, verbose=1, **settings).fit(X, y)
    out = capsys.readouterr().out
    assert "out of memory: batch size halved to 100" in out and "halved to 50" in out
    assert out.count("out of memory") == 2, "the halved batch is kept for the rest of the run"
    assert halved.batch_size_ == 50 and halved.t_ == planned_small.t_ == 3 * 60
    # Retried from the same row, on the same shuffle: the run a batch of 50 takes from the start.
    np.testing.assert_array_equal(_parameters(halved), _parameters(planned_small))


def test_out_of_memory_with_the_default_rule_scales_the_step_with_the_batch(monkeypatch):
    X, y = _regression(np.random.RandomState(1), n=3000)
    planned_small = BufferedSGDRegressor(batch_size=64, n_epochs=2, tol=None, random_state=0).fit(X, y)
    _steps_out_of_memory_above(monkeypatch, 64)
    halved = BufferedSGDRegressor(batch_size=256, n_epochs=2, tol=None, random_state=0).fit(X, y)
    assert halved.batch_size_ == 64
    assert halved.learning_rate_ == pytest.approx(planned_small.learning_rate_, rel=1e-12)
    np.testing.assert_allclose(_parameters(halved), _parameters(planned_small), rtol=RTOL["float64"])


def test_each_partial_fit_call_starts_from_the_planned_batch(monkeypatch, capsys):
    X, y = _regression(np.random.RandomState(3), n=1000)
    _steps_out_of_memory_above(monkeypatch, 50)
    model = BufferedSGDRegressor(batch_size=100, verbose=1, random_state=0)
    model.partial_fit(X, y).partial_fit(X, y)
    assert capsys.readouterr().out.count("out of memory: batch size halved to 50") == 2
    assert model.batch_size_ == 50 and model.t_ == 2 * 1000 // 50


def test_out_of_memory_at_a_batch_of_one_and_other_errors_propagate(monkeypatch):
    X, y = _regression(np.random.RandomState(2), n=200)
    _steps_out_of_memory_above(monkeypatch, 0)
    with pytest.raises(torch.OutOfMemoryError):
        BufferedSGDRegressor(batch_size=8, n_epochs=1, random_state=0).fit(X, y)

    def broken_step(*args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(sgd_solver, "_step", broken_step)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        BufferedSGDRegressor(batch_size=8, n_epochs=1, random_state=0).fit(X, y)


def test_memmap_that_shrinks_during_fit_raises(tmp_path):
    X, y = _regression(np.random.RandomState(12), n=4000)
    path = tmp_path / "X.npy"
    np.save(path, X.astype(np.float32))
    model = BufferedSGDRegressor(
        scaling_rule=_TruncatingRule(path=str(path)), buffer_size=500, batch_size=100, n_epochs=2, prefetch=False
    )
    with pytest.raises(RuntimeError, match=r"X\.npy.* shrank"):
        model.fit(str(path), y)
    assert not hasattr(model, "coef_")


def test_bad_input_is_named():
    X, y = _regression(np.random.RandomState(13), n=100)
    with pytest.raises(TypeError, match="X"):
        BufferedSGDRegressor().fit((row for row in X), y)
    with pytest.raises(ValueError, match="rows"):
        BufferedSGDRegressor().fit(_SlicedDataset(X), y[:50])
    X_bad = X.copy()
    X_bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        BufferedSGDRegressor().fit(_SlicedDataset(X_bad), y)
    with pytest.raises(ValueError, match="sample_weight"):
        BufferedSGDRegressor().fit(X, y, sample_weight=-np.ones(100))


def test_sample_weights_scale_each_loss():
    X, y = _regression(np.random.RandomState(14), n=800)
    params = {"n_epochs": 2, "random_state": 0, "penalty": None, "batch_size": 50, "dtype": "float64"}
    unit = BufferedSGDRegressor(**params).fit(X, y, sample_weight=np.ones(800))
    none = BufferedSGDRegressor(**params).fit(X, y)
    np.testing.assert_array_equal(unit.coef_, none.coef_)
    doubled = BufferedSGDRegressor(scaling_rule=ConstantRule(base_lr=0.01), **params)
    doubled.fit(X, y, sample_weight=np.full(800, 2.0))
    double_rate = BufferedSGDRegressor(scaling_rule=ConstantRule(base_lr=0.02), **params).fit(X, y)
    np.testing.assert_allclose(doubled.coef_, double_rate.coef_, rtol=1e-12)
    # The analytic rule sees the weights in the spectrum: uniform weights change nothing.
    scaled = BufferedSGDRegressor(**params).fit(X, y, sample_weight=np.full(800, 3.0))
    np.testing.assert_allclose(scaled.coef_, none.coef_, rtol=1e-10)


def test_early_stopping_keeps_the_best_pass():
    X, y = _regression(np.random.RandomState(15), n=2000)
    model = BufferedSGDRegressor(early_stopping=True, n_epochs=30, n_iter_no_change=2, tol=1e-3, random_state=0)
    model.fit(X, y)
    scores = [record["validation_score"] for record in model.history_]
    assert model.n_iter_ < 30 and model.n_iter_ == len(scores)
    residual = y - np.hstack([X, np.ones((len(y), 1))]) @ _lstsq(X, y)
    best_possible = 1 - residual.var() / y.var()
    assert max(scores) > best_possible - 0.05


def test_pickle_round_trip_and_verbose(capsys):
    X, y = _regression(np.random.RandomState(16), n=500)
    model = BufferedSGDRegressor(n_epochs=2, random_state=0, verbose=1).fit(X, y)
    output = capsys.readouterr().out
    assert "samples/s" in output and "I/O wait" in output and "batch" in output
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(X), model.predict(X))


def test_random_state_reproduces_and_varies():
    X, y = _regression(np.random.RandomState(17), n=1500)
    first = BufferedSGDRegressor(buffer_size=400, n_epochs=2, random_state=3).fit(X, y)
    again = clone(first).fit(X, y)
    other = clone(first).set_params(random_state=4).fit(X, y)
    np.testing.assert_array_equal(first.coef_, again.coef_)
    assert not np.array_equal(first.coef_, other.coef_)


# --- classifier ----------------------------------------------------------------------


def test_log_loss_matches_logistic_regression():
    X, y = make_classification(n_samples=3000, n_features=10, n_informative=6, n_classes=3, random_state=0)
    X = StandardScaler().fit_transform(X)
    ours = BufferedSGDClassifier(
        alpha=1e-3, scaling_rule=EigenProRule(decay="polynomial"), n_epochs=40, tol=None, random_state=0
    ).fit(X, y)
    reference = LogisticRegression(C=1 / (1e-3 * X.shape[0]), max_iter=2000).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), reference.predict_proba(X), atol=0.05)
    assert abs(ours.score(X, y) - reference.score(X, y)) <= 0.01
    np.testing.assert_allclose(ours.predict_proba(X).sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.exp(ours.predict_log_proba(X)), ours.predict_proba(X), rtol=1e-10)


@pytest.mark.parametrize("loss", ["log_loss", "hinge"])
def test_classifier_on_digits(loss):
    X, y = load_digits(return_X_y=True)
    model = make_pipeline(StandardScaler(), BufferedSGDClassifier(loss=loss, random_state=0))
    accuracy = model.fit(X[:1200], y[:1200]).score(X[1200:], y[1200:])
    assert accuracy > 0.88
    fitted = model[-1]
    assert fitted.coef_.shape == (10, 64) and list(fitted.classes_) == list(range(10))
    assert hasattr(fitted, "predict_proba") == (loss == "log_loss")


def test_binary_classifier_shapes_and_labels():
    X, y = make_classification(n_samples=600, n_features=6, random_state=1)
    labels = np.where(y == 1, "spam", "ham")
    model = BufferedSGDClassifier(random_state=0).fit(X, labels)
    assert model.coef_.shape == (1, 6) and model.intercept_.shape == (1,)
    assert model.decision_function(X).shape == (600,)
    assert set(model.predict(X)) <= {"spam", "ham"} and model.score(X, labels) > 0.8
    assert np.all((model.predict_proba(X)[:, 1] > 0.5) == (model.predict(X) == "spam"))


def test_classifier_partial_fit_needs_classes():
    X, y = make_classification(n_samples=400, n_features=5, n_classes=3, n_informative=3, random_state=2)
    model = BufferedSGDClassifier(random_state=0)
    with pytest.raises(ValueError, match="classes must be passed"):
        model.partial_fit(X, y)
    model.partial_fit(X[:200], y[:200], classes=[0, 1, 2])
    model.partial_fit(X[200:], y[200:])
    assert model.t_ > 0 and list(model.classes_) == [0, 1, 2]
    with pytest.raises(ValueError, match="not in classes"):
        model.partial_fit(X, y + 5)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    X, y = _regression(np.random.RandomState(18), n=3000)
    params = {"buffer_size": 800, "batch_size": 64, "n_epochs": 2, "random_state": 0, "dtype": "float64"}
    cpu = BufferedSGDRegressor(device="cpu", **params).fit(X, y)
    cuda = BufferedSGDRegressor(device="cuda", **params).fit(X, y)
    np.testing.assert_allclose(cuda.coef_, cpu.coef_, rtol=1e-9, atol=1e-12)
    assert cuda.device_.startswith("cuda")
    assert torch.cuda.is_available()
