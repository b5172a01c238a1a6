"""The full-batch polish of the linear SGD models (issue 78): L-BFGS to a certified optimum.

References: ``Ridge`` (the square loss's optimum, exact), scipy's L-BFGS in float64
to a gradient of 1e-12 (the log loss's), ``LogisticRegression`` on scikit-learn's
digits (real rows, nearly separable at ``alpha = 1e-4``, where the annealed SGD
alone ended 7.8x above the optimum's objective); for the hinge, weak duality (a
lower bound of its optimum whatever the point it is built from).
"""

import numpy as np
import pytest
import scipy.sparse
import torch
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from skgpu_kernel import BufferedSGDClassifier, BufferedSGDRegressor
from skgpu_kernel.passes import OrderedPasses, PassLayout
from skgpu_kernel.planning.sgd import PolishPlan
from skgpu_kernel.row_sources import as_row_source
from skgpu_kernel.solvers.losses import make_loss
from skgpu_kernel.solvers.polish import polish_linear

from ._hinge_dual import libsvm_dual_bound

ALPHA = 1e-4


def _nearly_separable(n, d, n_classes, seed):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    scores = X @ rng.randn(d, n_classes) * 4.0
    labels = (scores + 0.3 * rng.randn(n, n_classes)).argmax(axis=1)
    return X, labels, rng.uniform(0.5, 2.0, n)


def _objective(coef, intercept, X, labels, weights, n_classes):
    """The polish's objective in float64: ``mean(w log loss) + alpha / 2 ||W||^2``."""
    scores = X @ coef + intercept
    if n_classes == 2:
        signs = 2.0 * labels - 1.0
        losses = np.logaddexp(0.0, -signs * scores[:, 0])
    else:
        losses = -log_softmax(scores, axis=1)[np.arange(len(labels)), labels]
    return float(np.mean(weights * losses) + 0.5 * ALPHA * np.sum(coef * coef))


def _reference(X, labels, weights, n_classes):
    """scipy's L-BFGS on the same objective in float64, to a gradient of 1e-12."""
    n, d = X.shape
    n_outputs = 1 if n_classes == 2 else n_classes

    def value_and_gradient(z):
        coef, intercept = z[: d * n_outputs].reshape(d, n_outputs), z[d * n_outputs :]
        scores = X @ coef + intercept
        if n_outputs == 1:
            gradient = (1.0 / (1.0 + np.exp(-scores[:, 0])) - labels)[:, None]
        else:
            gradient = softmax(scores, axis=1)
            gradient[np.arange(n), labels] -= 1.0
        gradient *= weights[:, None] / n
        value = _objective(coef, intercept, X, labels, weights, n_classes)
        return value, np.r_[(X.T @ gradient + ALPHA * coef).ravel(), gradient.sum(axis=0)]

    z = minimize(
        value_and_gradient,
        np.zeros(d * n_outputs + n_outputs),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-12, "ftol": 1e-16, "maxiter": 20_000},
    ).x
    return z[: d * n_outputs].reshape(d, n_outputs), z[d * n_outputs :]


def _passes(X, targets, weights, buffer_size, dtype=torch.float64):
    sources = [as_row_source(X, "X"), as_row_source(targets, "y")]
    dtypes = [dtype, torch.int64 if targets.dtype.kind == "i" else dtype]
    if weights is not None:
        sources.append(as_row_source(weights, "sample_weight"))
        dtypes.append(dtype)
    layout = PassLayout(sources, dtypes, torch.device("cpu"), [(0, X.shape[0])], False, False)
    return OrderedPasses(layout, buffer_size, resident=buffer_size >= X.shape[0])


def _polish(X, targets, weights, loss, plan, buffer_size=None, dtype=torch.float64):
    n_outputs = targets.shape[1] if targets.ndim == 2 else getattr(loss, "n_outputs", 1)
    coef = torch.zeros(X.shape[1], n_outputs, dtype=dtype)
    intercept = torch.zeros(n_outputs, dtype=dtype)
    passes = _passes(X, targets, weights, buffer_size or X.shape[0], dtype)
    result = polish_linear(coef, intercept, passes, loss, plan)
    return coef.numpy(), intercept.numpy(), result


@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_certificate_bounds_the_excess_objective(n_classes, seed):
    """At the planned tolerance the objective is within ``tolerance f`` of scipy's optimum; tight, at the optimum."""
    X, labels, weights = _nearly_separable(600, 8, n_classes, seed)
    n_outputs = 1 if n_classes == 2 else n_classes
    optimum = _objective(*_reference(X, labels, weights, n_classes), X, labels, weights, n_classes)
    for tolerance in (1e-4, 1e-10):
        coef, intercept, result = _polish(
            X, labels, weights, make_loss("log_loss", n_outputs), PolishPlan(ALPHA, True, tolerance)
        )
        value = _objective(coef, intercept, X, labels, weights, n_classes)
        assert result.converged and result.excess_bound <= tolerance
        # torch's softplus returns its argument above 20, off by at most exp(-20) a row.
        assert result.objective == pytest.approx(value, rel=1e-8)
        assert value - optimum <= tolerance * value + 1e-13
    assert value == pytest.approx(optimum, rel=1e-9)


def test_the_square_loss_reaches_ridges_solution_without_an_intercept():
    rng = np.random.RandomState(0)
    X = rng.randn(500, 6) * [1, 2, 5, 10, 20, 50]  # condition number 2500
    y = X @ rng.randn(6) + rng.randn(500)
    coef, intercept, result = _polish(
        X, y[:, None], None, make_loss("squared_error", 1), PolishPlan(ALPHA, False, 1e-14)
    )
    ridge = Ridge(alpha=ALPHA * 500, fit_intercept=False, tol=1e-14, solver="cholesky").fit(X, y)
    assert result.converged and intercept == pytest.approx([0.0])
    np.testing.assert_allclose(coef[:, 0], ridge.coef_, rtol=1e-9, atol=1e-12)


def test_streamed_sparse_and_resident_rows_reach_the_same_optimum():
    """Buffers of 64 rows of a CSR matrix: the row blocks of each pass line up with the scores kept whole."""
    X, labels, weights = _nearly_separable(500, 6, 3, 2)
    plan, loss = PolishPlan(ALPHA, True, 1e-12), make_loss("log_loss", 3)
    resident = _polish(X, labels, weights, loss, plan)
    streamed = _polish(scipy.sparse.csr_matrix(X), labels, weights, loss, plan, buffer_size=64)
    np.testing.assert_allclose(streamed[0], resident[0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(streamed[1], resident[1], rtol=1e-6, atol=1e-8)


def test_a_polish_never_ends_above_where_it_started():
    """Float32 rows, a tolerance below their precision: it stops, says so, and keeps the best iterate."""
    X, labels, weights = _nearly_separable(400, 5, 2, 3)
    loss = make_loss("log_loss", 1)
    coef, intercept, result = _polish(X, labels, weights, loss, PolishPlan(ALPHA, True, 1e-30), dtype=torch.float32)
    start = _objective(np.zeros((5, 1)), np.zeros(1), X, labels, weights, 2)
    assert not result.converged and result.excess_bound > 1e-30
    assert _objective(coef, intercept, X, labels, weights, 2) < start


def _digits():
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), y_train, scaler.transform(X_test), y_test


@pytest.mark.parametrize("binary", [False, True])
def test_the_default_classifier_reaches_logistic_regressions_optimum_on_digits(binary):
    """Real, nearly separable rows: objective within 1% of the optimum's, test accuracy within 1%."""
    X_train, y_train, X_test, y_test = _digits()
    if binary:
        y_train, y_test = (y_train >= 5).astype(int), (y_test >= 5).astype(int)
    n = X_train.shape[0]
    exact = LogisticRegression(C=1.0 / (ALPHA * n), tol=1e-10, max_iter=100_000).fit(X_train, y_train)
    ours = BufferedSGDClassifier(random_state=0).fit(X_train, y_train)
    n_classes = len(exact.classes_)

    def objective(model):
        coef = np.atleast_2d(model.coef_).T.astype(np.float64)
        return _objective(coef, model.intercept_, X_train, y_train, np.ones(n), n_classes)

    assert ours.polish_.converged
    assert objective(ours) <= 1.01 * objective(exact)
    assert ours.score(X_test, y_test) >= exact.score(X_test, y_test) - 0.01


def test_a_memory_mapped_file_and_an_array_get_the_same_polished_model(tmp_path):
    """Out-of-core rows are polished by streamed buffers, as the array is: the same model, whatever the source."""
    X_train, y_train, _, _ = _digits()
    path = tmp_path / "X.npy"
    np.save(path, X_train.astype(np.float32))
    from_array = BufferedSGDClassifier(random_state=0, buffer_size=256).fit(X_train.astype(np.float32), y_train)
    from_file = BufferedSGDClassifier(random_state=0, buffer_size=256).fit(str(path), y_train)
    assert from_file.polish_.converged and from_file.polish_.n_iter == from_array.polish_.n_iter
    np.testing.assert_array_equal(from_file.coef_, from_array.coef_)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_hinges_certificate_bounds_its_excess_over_the_dual_bound(n_classes, dtype):
    """The hinge through smoothed copies: the certificate is honest against weak duality, in either dtype.

    The reference: libsvm's dual solution of each column, a lower bound of the
    optimum by weak duality (checked tight: within 1e-6 of a point polished to 1e-9);
    the planned tolerance's model must be within its certificate of it.
    """
    X, labels, weights = _nearly_separable(800, 6, n_classes, 3)
    n_outputs = 1 if n_classes == 2 else n_classes
    loss = make_loss("hinge", n_outputs)
    signs = np.eye(n_classes)[labels] * 2.0 - 1.0 if n_outputs > 1 else 2.0 * labels[:, None] - 1.0

    def hinge_objective(coef, intercept):
        coef, intercept = coef.astype(np.float64), intercept.astype(np.float64)
        losses = np.maximum(0.0, 1.0 - signs * (X @ coef + intercept)).sum(axis=1)
        return float(np.mean(weights * losses) + 0.5 * ALPHA * np.sum(coef**2))

    tight, tight_intercept, _ = _polish(X, labels, weights, loss, PolishPlan(ALPHA, True, 1e-9, smoothing=1.0))
    tight_value = hinge_objective(tight, tight_intercept)
    bound = libsvm_dual_bound(X, signs, weights, ALPHA)
    assert bound <= tight_value <= (1 + 1e-6) * bound

    plan = PolishPlan(ALPHA, True, 1e-4, smoothing=1.0, in_float64=True)
    coef, intercept, result = _polish(X, labels, weights, loss, plan, dtype=dtype)
    value = hinge_objective(coef, intercept)
    assert result.converged and result.excess_bound <= 1e-4
    assert result.objective == pytest.approx(value, rel=1e-6)
    assert value - bound <= result.excess_bound * value


def _huber_reference(X, y, epsilon):
    """scipy's L-BFGS on ``mean(huber(x W + b - y)) + alpha / 2 ||W||^2`` in float64."""
    n, d = X.shape

    def value_and_gradient(z):
        residual = X @ z[:d] + z[d] - y
        gradient = np.clip(residual, -epsilon, epsilon)
        value = np.mean(residual * gradient - 0.5 * gradient**2) + 0.5 * ALPHA * z[:d] @ z[:d]
        return value, np.r_[X.T @ gradient / n + ALPHA * z[:d], gradient.sum() / n]

    options = {"gtol": 1e-12, "ftol": 1e-16, "maxiter": 20_000}
    z = minimize(value_and_gradient, np.zeros(d + 1), jac=True, method="L-BFGS-B", options=options).x
    return z[:d], z[d], value_and_gradient(z)[0]


def test_the_regressor_polishes_the_square_and_the_huber_loss_to_their_optimum():
    rng = np.random.RandomState(0)
    X = rng.randn(300, 4)
    y = X @ rng.randn(4) + rng.standard_t(2, 300)  # heavy tails: many residuals beyond epsilon
    assert BufferedSGDRegressor(random_state=0).fit(X, y).polish_.converged
    model = BufferedSGDRegressor(loss="huber", random_state=0, dtype="float64").fit(X, y)
    coef, _, optimum = _huber_reference(X, y, model.epsilon)
    residual = X @ model.coef_ + model.intercept_ - y
    gradient = np.clip(residual, -model.epsilon, model.epsilon)
    value = np.mean(residual * gradient - 0.5 * gradient**2) + 0.5 * ALPHA * model.coef_ @ model.coef_
    assert model.polish_.converged and optimum <= value <= (1 + 1e-4) * optimum
    np.testing.assert_allclose(model.coef_, coef, rtol=1e-2)
