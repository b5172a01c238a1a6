"""alpha="loo": the leave-one-out criterion against scikit-learn's RidgeCV on the same features."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import RidgeCV

from skgpu_kernel import AdaptiveKernelRegressor, regularization
from skgpu_kernel.fit import tune
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.planning import kernel as planning_kernel
from skgpu_kernel.regularization import PENALTY_GRID, _NystromFeatures, select_alpha


def _data(n=400, seed=0, noise=0.3):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 3)
    Y = np.column_stack([np.sin(2 * X[:, 0]) + X[:, 1], np.cos(X[:, 2])]) + noise * rng.randn(n, 2) + 4.0
    return X, Y, rng.uniform(0.5, 2.0, size=n)


@pytest.mark.parametrize("subsample_size", [400, 150])
def test_leave_one_out_errors_are_ridge_cv_on_the_nystrom_features(subsample_size):
    X, Y, weights = _data()
    kernel, X_t = Gaussian(bandwidth=1.5), torch.as_tensor(X)
    selection = select_alpha(kernel, X_t, torch.as_tensor(Y), torch.as_tensor(weights), subsample_size)
    if subsample_size == X.shape[0]:  # every row a feature: kernel ridge itself
        features = kernel_features(kernel, X_t)
    else:
        features = _NystromFeatures(kernel, X_t, subsample_size).of(X_t).numpy()
    alphas = PENALTY_GRID * weights.sum()
    reference = RidgeCV(alphas=alphas, store_cv_results=True).fit(features, Y, sample_weight=weights)
    assert selection.alpha == pytest.approx(reference.alpha_, rel=1e-12)
    # RidgeCV stores each row's squared leave-one-out error times its weight: the same
    # criterion up to the constant factor of the normalisation.
    ours = selection.loo_errors
    theirs = reference.cv_results_.sum(axis=(0, 1))
    # (to 1e-4: at the smallest penalties the two differ in which tiny singular values they keep)
    np.testing.assert_allclose(ours / ours.min(), theirs / theirs.min(), rtol=1e-4)
    if subsample_size < X.shape[0]:
        assert selection.n_features == features.shape[1] < subsample_size


def kernel_features(kernel, X):
    """``Phi`` with ``Phi Phi^T = K(X, X)`` to rounding: the kernel's eigenvectors times root eigenvalues."""
    values, vectors = np.linalg.eigh(kernel(X, X).cpu().numpy())  # the scored rows may be on CUDA
    return vectors * np.sqrt(np.clip(values, 0.0, None))


def test_the_penalty_of_a_p_center_cg_model_is_ridge_cv_on_the_scored_nystrom_features(monkeypatch):
    # The estimator's path: alpha="loo" on a model of 300 drawn centers fitted by CG.
    # The rows and subsample the criterion scored are captured; RidgeCV on their
    # kernel features must choose the penalty the CG model was fitted with.
    X, Y, weights = _data(n=1200, seed=5)
    scored = {}

    def capturing(kernel, X_rows, Y_rows, w, subsample_size, min_coverage=0.0, **criterion):
        scored.update(kernel=kernel, X=X_rows, Y=Y_rows, w=w, s=subsample_size)
        return select_alpha(kernel, X_rows, Y_rows, w, subsample_size, min_coverage, **criterion)

    monkeypatch.setattr(tune, "select_alpha", capturing)
    model = AdaptiveKernelRegressor(
        n_centers=300, solver="cg", alpha="loo", bandwidth=1.5, dtype="float64", random_state=0
    ).fit(X, Y[:, 0], sample_weight=weights)
    assert model.solver_ == "cg" and model.n_centers_ == 300
    assert scored["X"].shape[0] == 1200  # every row scored
    assert scored["s"] == 1200  # the subsample is every scored row: kernel ridge on them
    features = kernel_features(scored["kernel"], scored["X"])
    w = scored["w"].cpu().numpy()
    reference = RidgeCV(alphas=PENALTY_GRID * w.sum()).fit(features, scored["Y"].cpu().numpy(), sample_weight=w)
    assert model.alpha_ == pytest.approx(reference.alpha_, rel=1e-12)
    assert model.alpha_selection_.n_features <= 1200 and model.alpha_selection_.coverage == 1.0


def test_noise_gets_the_largest_penalty_and_a_clean_signal_a_small_one():
    rng = np.random.RandomState(1)
    X = torch.as_tensor(rng.randn(300, 2))
    kernel = Gaussian(bandwidth=1.0)
    noise = select_alpha(kernel, X, torch.as_tensor(rng.randn(300, 1)), None, 300)
    assert noise.penalty >= PENALTY_GRID[-3]  # close to the constant model
    clean = select_alpha(kernel, X, torch.sin(X[:, :1]), None, 300)
    assert clean.penalty <= 1e-6


@pytest.mark.parametrize("row_block", [64, 4096])
def test_row_blocks_do_not_change_the_errors(monkeypatch, row_block):
    X, Y, weights = _data(n=300, seed=3)
    kernel, X_t = Gaussian(bandwidth=1.5), torch.as_tensor(X)
    whole = select_alpha(kernel, X_t, torch.as_tensor(Y), torch.as_tensor(weights), 200)
    monkeypatch.setattr(regularization, "ROW_BLOCK", row_block)
    blocked = select_alpha(kernel, X_t, torch.as_tensor(Y), torch.as_tensor(weights), 200)
    # Only the summation order differs; near interpolation 1 - h_ii is small and
    # amplifies float64 rounding (8e-9 at the smallest penalty, 1e-13 at the chosen one).
    np.testing.assert_allclose(blocked.loo_errors, whole.loo_errors, rtol=1e-7)
    assert blocked.penalty == whole.penalty


def test_float32_training_still_scores_every_float64_feature():
    # A float32 fit must not cut the features at float32's resolution: the cut
    # features' signal would count as noise and raise the penalty.
    X, Y, _ = _data(n=500, seed=4, noise=0.05)
    fits = [
        AdaptiveKernelRegressor(bandwidth=1.0, alpha="loo", dtype=dtype, random_state=0).fit(X, Y[:, 0])
        for dtype in ("float32", "float64")
    ]
    selections = [fit.alpha_selection_ for fit in fits]
    assert selections[0].n_features == selections[1].n_features
    assert selections[0].n_features > 200  # float32's resolution keeps well under half of these
    assert selections[0].penalty == selections[1].penalty


def test_alpha_beyond_the_scored_rows_is_kept(monkeypatch):
    X, Y, _ = _data(n=600, seed=2)
    monkeypatch.setattr(planning_kernel, "CRITERION_MAX_ROWS", 200)
    model = AdaptiveKernelRegressor(bandwidth=1.5, alpha="loo", dtype="float64", random_state=0).fit(X, Y[:, 0])
    selection = model.alpha_selection_
    assert selection.n_rows == 200
    assert model.alpha_ == selection.alpha == pytest.approx(selection.penalty * 200, rel=1e-12)
    again = AdaptiveKernelRegressor(bandwidth=1.5, alpha="loo", dtype="float64", random_state=0).fit(X, Y[:, 0])
    assert again.alpha_ == model.alpha_  # the scored rows follow random_state


@pytest.mark.parametrize("n_rows, scored", [(1, 1), (3999, 3999), (4000, 4000), (4001, 4000), (254_654, 4000)])
def test_the_criterion_scores_every_row_up_to_its_bound(n_rows, scored):
    assert planning_kernel.plan_criterion_rows(n_rows) == scored


def test_a_fit_beyond_the_bound_scores_the_bound():
    """Issue 80 item 3: 4200 rows, the penalty scored on 4000 of them (every one before the bound)."""
    X, Y, _ = _data(n=4200, seed=5)
    model = AdaptiveKernelRegressor(
        bandwidth=1.5, alpha="loo", solver="eigenpro", n_epochs=1, feature_learning=None, random_state=0
    ).fit(X, Y[:, 0])
    assert model.alpha_selection_.n_rows == planning_kernel.CRITERION_MAX_ROWS == 4000
    assert model.alpha_ == model.alpha_selection_.alpha  # kept as scored, not scaled to 4200 rows


def _ridge_with_intercept_on_the_kernel(X, y, w, bandwidth, alpha):
    """``min sum_i w_i (y_i - (K a)_i - b)^2 + alpha a^T K a`` by its dense normal equations."""
    K = Gaussian(bandwidth=bandwidth)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    ones = np.ones((X.shape[0], 1))
    system = np.block([[K @ (w[:, None] * K) + alpha * K, K @ (w[:, None] * ones)], [(w @ K)[None, :], w.sum()]])
    solution = np.linalg.lstsq(system, np.concatenate([K @ (w * y), [w @ y]]), rcond=None)[0]
    return solution[:-1], solution[-1]


@pytest.mark.parametrize("warm_start", [False, True])
def test_cg_on_every_point_fits_the_intercept_the_criterion_scores(warm_start):
    # The criterion scores ridge with an unpenalised intercept; with a narrow kernel the
    # mean of the targets is far from it (here 5.0 against the fitted 5.01).
    rng = np.random.RandomState(0)
    X, w = rng.randn(300, 3), rng.uniform(0.5, 2.0, size=300)
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.randn(300) + 5.0
    model = AdaptiveKernelRegressor(
        bandwidth=0.4, alpha=0.3, solver="cg", tol=1e-10, dtype="float64", warm_start=warm_start, random_state=0
    )
    model.fit(X, y, sample_weight=w)
    if warm_start:  # continued from its own solution: the same model
        model.fit(X, y, sample_weight=w)
    coef, intercept = _ridge_with_intercept_on_the_kernel(X, y, w, 0.4, 0.3)
    X_new = rng.randn(50, 3)
    reference = Gaussian(bandwidth=0.4)(torch.as_tensor(X_new), torch.as_tensor(X)).numpy() @ coef + intercept
    assert model.intercept_ == pytest.approx(intercept, rel=1e-7)  # CG stops at a relative residual of 1e-10
    assert abs(intercept - np.average(y, weights=w)) > 1e-3  # not the mean
    np.testing.assert_allclose(model.predict(X_new), reference, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_features_kept_between_the_passes_give_the_errors_of_evaluating_them_twice(monkeypatch, weighted):
    rng = np.random.RandomState(0)
    X = torch.tensor(rng.randn(9000, 3))
    Y = torch.sin(X[:, :1]) + 0.1 * torch.tensor(rng.randn(9000, 1))
    w = torch.tensor(rng.uniform(0.2, 1.0, 9000)) if weighted else None
    kernel = Gaussian(bandwidth=1.0)
    kept = select_alpha(kernel, X, Y, w, 300)
    monkeypatch.setattr(regularization, "_KEPT_FEATURE_BYTES", 0)
    evaluated = select_alpha(kernel, X, Y, w, 300)
    np.testing.assert_array_equal(kept.loo_errors, evaluated.loo_errors)
    assert kept.alpha == evaluated.alpha
