"""Values too large for the training dtype are refused before any work, with a message that names them."""

import numpy as np
import pytest

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor, BufferedSGDClassifier, BufferedSGDRegressor

ESTIMATORS = [AdaptiveKernelRegressor, AdaptiveKernelClassifier, BufferedSGDRegressor, BufferedSGDClassifier]


def _data():
    rng = np.random.RandomState(0)
    X = rng.randn(60, 3)
    return X, (X[:, 0] > 0).astype(float)


@pytest.mark.parametrize("estimator", [BufferedSGDRegressor, BufferedSGDClassifier])
def test_inputs_whose_squares_overflow_float32_are_refused(estimator):
    X, y = _data()
    X[7, 2] = 1e300
    with pytest.raises(ValueError, match=r"X holds values up to 1e\+300 .* float32 .* or use dtype='float64'"):
        estimator(n_epochs=1).fit(X, y)
    X[7, 2] = 1e25  # finite in float32's range (3.4e38), but its square is not
    with pytest.raises(ValueError, match=r"X holds values up to 1e\+25"):
        estimator(n_epochs=1).fit(X, y)


@pytest.mark.parametrize("estimator", [AdaptiveKernelRegressor, AdaptiveKernelClassifier])
def test_kernel_estimators_refuse_columns_kept_in_units_whose_squares_overflow(estimator):
    X, y = _data()
    X *= 1e25  # every column in one unit: kept as it is (skgpu_kernel.planning.columns)
    with pytest.raises(ValueError, match=r"X holds values up to 2.\d+e\+25 .* float32 .* or use dtype='float64'"):
        estimator(n_epochs=1).fit(X, y)


@pytest.mark.parametrize("estimator", [AdaptiveKernelRegressor, AdaptiveKernelClassifier])
def test_kernel_estimators_standardize_one_column_in_large_units_and_refuse_unmeasurable_spread(estimator):
    X, y = _data()
    X[7, 2] = 1e25  # a column in other units than the rest: standardized, so its squares are finite
    model = estimator(n_epochs=1, random_state=0).fit(X, y)
    assert model.column_scaling_ == "standardize"
    assert np.all(np.isfinite(model.decision_function(X) if hasattr(model, "classes_") else model.predict(X)))
    X[7, 2] = 1e300  # the column's variance overflows float64
    with pytest.raises(ValueError, match=r"X holds values up to 1e\+300 .* overflow float64"):
        estimator(n_epochs=1).fit(X, y)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_large_but_safe_values_are_fitted(estimator):
    X, y = _data()
    X[7, 2] = 1e6
    model = estimator(n_epochs=1, random_state=0).fit(X, y)
    assert np.all(np.isfinite(model.predict(X[:5]).astype(float)))


@pytest.mark.parametrize("estimator", [AdaptiveKernelRegressor, BufferedSGDRegressor])
def test_regression_targets_are_checked_in_float64_too(estimator):
    X, y = _data()
    with pytest.raises(ValueError, match=r"y holds values up to 4e\+200 .* overflows beyond 1.34e\+154\. Rescale y"):
        estimator(n_epochs=1, dtype="float64").fit(X, y * 4e200 + 1)
