"""float32 in, float32 out, for every public estimator, as in scikit-learn's linear models.

A float32 ``X`` gives float32 coefficients and float32 predictions, scores and
probabilities; float64 (or integer) input gives float64.  Mixed precisions promote
to float64, as numpy does for ``X @ coef_``.  The float32 data here are exactly
representable in float64, so the float32 and float64 fits see the same values and
must agree to float32 rounding.
"""

import numpy as np
import pytest
from sklearn.utils import get_tags

from skgpu_kernel import (
    AdaptiveKernelClassifier,
    AdaptiveKernelRegressor,
    BufferedSGDClassifier,
    BufferedSGDRegressor,
)

SETTINGS = dict(memory_budget="1GB", device="cpu", random_state=0)
KERNEL = dict(bandwidth=1.5, n_epochs=4, batch_size=64, **SETTINGS)
SGD = dict(n_epochs=3, batch_size=32, buffer_size=64, **SETTINGS)

ESTIMATORS = {
    "kernel_regressor": lambda **kw: AdaptiveKernelRegressor(**KERNEL, **kw),
    "kernel_regressor_eigenpro3": lambda **kw: AdaptiveKernelRegressor(n_centers=60, solver="eigenpro", **KERNEL, **kw),
    "kernel_regressor_cg": lambda **kw: AdaptiveKernelRegressor(n_centers=60, alpha=1e-3, solver="cg", **KERNEL, **kw),
    "kernel_classifier": lambda **kw: AdaptiveKernelClassifier(**KERNEL, **kw),
    "sgd_regressor": lambda **kw: BufferedSGDRegressor(**SGD, **kw),
    "sgd_classifier": lambda **kw: BufferedSGDClassifier(**SGD, **kw),
    "sgd_classifier_hinge": lambda **kw: BufferedSGDClassifier(loss="hinge", **SGD, **kw),
}

# Same training tensors; only the float64 bookkeeping (means, intercept) and the final
# rounding to float32 differ.
RTOL_FLOAT32 = 1e-5


def _data(name, n=200):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 4).astype(np.float32)
    if "classifier" in name:
        y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])  # three classes
    else:
        y = np.sin(X[:, 0]) + X[:, 1] ** 2
    return X, y


def _outputs(model, X):
    """Every prediction method's output, by name."""
    methods = ("predict", "decision_function", "predict_proba", "predict_log_proba")
    return {name: getattr(model, name)(X) for name in methods if hasattr(model, name)}


def _coefficients(model):
    names = ("dual_coef_", "coef_", "intercept_")
    return {name: np.asarray(getattr(model, name)) for name in names if hasattr(model, name)}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_float32_in_float32_out(name):
    X32, y = _data(name)
    X64 = X32.astype(np.float64)
    fit32 = ESTIMATORS[name]().fit(X32, y)
    fit64 = ESTIMATORS[name]().fit(X64, y)
    for what, values in _coefficients(fit32).items():
        assert values.dtype == np.float32, what
        assert _coefficients(fit64)[what].dtype == np.float64, what
        np.testing.assert_allclose(values, _coefficients(fit64)[what], rtol=RTOL_FLOAT32, atol=1e-6, err_msg=what)
    outputs32, outputs64 = _outputs(fit32, X32), _outputs(fit64, X64)
    for method, values in outputs32.items():
        reference = outputs64[method]
        if method == "predict" and "classifier" in name:
            assert values.dtype == reference.dtype == y.dtype
            np.testing.assert_array_equal(values, reference)
            continue
        assert values.dtype == np.float32, method
        assert reference.dtype == np.float64, method
        scale = np.abs(reference).max()
        np.testing.assert_allclose(values, reference, rtol=RTOL_FLOAT32, atol=RTOL_FLOAT32 * scale, err_msg=method)


@pytest.mark.parametrize("name", ["kernel_regressor", "kernel_classifier", "sgd_regressor", "sgd_classifier"])
def test_mixed_precisions_promote_to_float64(name):
    """A float32 fit predicting float64 X, or a float64 fit predicting float32 X, returns float64 (numpy's rule)."""
    X32, y = _data(name)
    X64 = X32.astype(np.float64)
    method = "decision_function" if "classifier" in name else "predict"
    fit32 = ESTIMATORS[name]().fit(X32, y)
    fit64 = ESTIMATORS[name]().fit(X64, y)
    assert getattr(fit32, method)(X64).dtype == np.float64
    assert getattr(fit64, method)(X32).dtype == np.float64
    np.testing.assert_allclose(getattr(fit32, method)(X64), getattr(fit32, method)(X32), rtol=RTOL_FLOAT32, atol=1e-6)


@pytest.mark.parametrize("name", ["kernel_regressor", "sgd_classifier"])
def test_float64_training_dtype_keeps_float32_results_for_float32_input(name):
    """``dtype`` is the training precision; the results still follow the input."""
    X32, y = _data(name)
    model = ESTIMATORS[name](dtype="float64").fit(X32, y)
    assert model.dtype_ == np.float64
    method = "decision_function" if "classifier" in name else "predict"
    assert getattr(model, method)(X32).dtype == np.float32
    assert getattr(model, method)(X32.astype(np.float64)).dtype == np.float64


def test_integer_input_gives_float64():
    X32, y = _data("sgd_regressor")
    X_int = np.round(X32 * 10).astype(np.int32)
    for name in ("kernel_regressor", "sgd_regressor"):
        model = ESTIMATORS[name]().fit(X_int, y)
        assert model.predict(X_int).dtype == np.float64, name


def test_float32_npy_file_gives_float32(tmp_path):
    """An out-of-core float32 source counts as float32 input, for fit and for predict."""
    X32, y = _data("sgd_classifier")
    path = tmp_path / "X.npy"
    np.save(path, X32)
    from_file = ESTIMATORS["sgd_classifier"]().fit(str(path), y)
    in_memory = ESTIMATORS["sgd_classifier"]().fit(X32, y)
    assert from_file.coef_.dtype == np.float32
    scores = from_file.decision_function(str(path))
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, in_memory.decision_function(X32), rtol=RTOL_FLOAT32, atol=1e-6)


@pytest.mark.parametrize(
    "estimator",
    [AdaptiveKernelRegressor(), AdaptiveKernelClassifier(), BufferedSGDRegressor(), BufferedSGDClassifier()],
)
def test_preserves_dtype_tag(estimator):
    assert get_tags(estimator).transformer_tags.preserves_dtype == ["float64", "float32"]
