"""EigenPro 2 converges to the interpolant as fast as its theory allows (float64, every point a center)."""

import numpy as np
import pytest
import torch

from skgpu_kernel import AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.planning.kernel import preconditioner_target
from skgpu_kernel.preconditioner import Spectrum, plan_preconditioner


def _interpolation_case(bandwidth, seed=0, n=300, n_test=200):
    """Training rows, targets, test rows and the exact interpolant's test predictions ``K_tX K^-1 y``."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n + n_test, 5)
    y = np.sin(X @ rng.randn(5)) + 0.1 * rng.randn(n + n_test)
    kernel = Gaussian(bandwidth=bandwidth)
    train, test = torch.as_tensor(X[:n]), torch.as_tensor(X[n:])
    exact = kernel(test, train).numpy() @ np.linalg.solve(kernel(train, train).numpy(), y[:n])
    return X[:n], y[:n], X[n:], exact


def _distance_to_interpolant(bandwidth, n_epochs, seed=0, **params):
    X, y, X_test, exact = _interpolation_case(bandwidth, seed)
    model = AdaptiveKernelRegressor(
        kernel="gaussian",
        bandwidth=bandwidth,
        alpha=0.0,
        fit_intercept=False,
        early_stopping=False,
        tol=None,
        solver="eigenpro",
        n_epochs=n_epochs,
        dtype="float64",
        random_state=seed,
        **params,
    ).fit(X, y)
    assert model.solver_ == "eigenpro" and model.n_epochs_ == n_epochs
    return np.linalg.norm(model.predict(X_test) - exact) / np.linalg.norm(exact), model


@pytest.mark.parametrize("seed", [0, 1])
def test_the_interpolant_is_reached_within_the_epochs_the_theory_allows(seed):
    # K is conditioned at about 3e8 here: float64 resolves the interpolant to about 1e-9.
    early, _ = _distance_to_interpolant(2.0, 30, seed)
    assert early <= 1e-3
    late, model = _distance_to_interpolant(2.0, 200, seed)
    assert late <= 1e-8
    assert model.n_components_ == 299  # the subsample is every row: every resolvable direction flattened


@pytest.mark.parametrize("batch_size", [10, 113, 300])
def test_a_given_batch_loses_no_accuracy_against_the_automatic_one(batch_size):
    automatic, model = _distance_to_interpolant(2.0, 30)
    given, _ = _distance_to_interpolant(2.0, 30, batch_size=batch_size)
    assert model.batch_size_ != 113  # the automatic batch differs from the middle one
    assert given <= max(2.0 * automatic, 1e-8)


def _components(n_rows, subsample_size, capacity):
    rng = np.random.RandomState(0)
    X = torch.as_tensor(rng.randn(n_rows, 5))
    spectrum = Spectrum(rows_per_epoch=n_rows)
    plan = plan_preconditioner(
        Gaussian(bandwidth=2.0), X, subsample_size, preconditioner_target(capacity), spectrum, 1024
    )
    return plan.preconditioner.n_components, plan.critical_batch_preconditioned


def test_an_exact_subsample_flattens_every_resolvable_direction_and_a_partial_one_half():
    # A small capacity reaches its critical batch with few directions: beyond those, an
    # exact subsample (every training row) flattens all it can resolve, a partial one at
    # most half (fewer where the critical batch reaches the rows of an epoch first).
    exact, critical = _components(300, 300, capacity=16)
    assert exact == 299 and critical >= 2 * 16
    partial, _ = _components(600, 300, capacity=16)
    assert 16 <= partial <= 150
