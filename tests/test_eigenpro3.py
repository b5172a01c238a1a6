"""EigenPro 3 (centers distinct from the data) against exact references."""

import numpy as np
import pytest
import torch

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.solvers import eigenpro3 as eigenpro3_solver

from ._processes import status_bytes
from .conftest import RTOL

BANDWIDTH = 2.0


def _gaussian(A, B, bandwidth=BANDWIDTH):
    sq = (A**2).sum(1)[:, None] + (B**2).sum(1)[None, :] - 2 * A @ B.T
    return np.exp(-np.maximum(sq, 0) / (2 * bandwidth**2))


def _problem(seed=0, n=2000, d=5):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X @ rng.randn(d)) + 0.1 * rng.randn(n)
    return X, y, rng.randn(500, d), rng


# These tests check EigenPro 3 itself: solver="eigenpro" (the default picks CG where it fits).
# With a user's centers the analytic step from a 200-point Nystrom estimate can be too
# long at first; the solver halves it with a warning, which is not what these tests check.
@pytest.mark.filterwarnings("ignore:Training diverged:RuntimeWarning")
def test_converges_to_the_nystrom_least_squares_solution_on_given_centers():
    X, y, X_test, rng = _problem()
    centers = rng.randn(200, X.shape[1])
    # Least squares on the centers for the centred targets, plus their mean (the intercept).
    alpha, *_ = np.linalg.lstsq(_gaussian(X, centers), y - y.mean(), rcond=None)
    reference = _gaussian(X_test, centers) @ alpha + y.mean()
    # Full batches make the iteration deterministic gradient descent, whose fixed point
    # is the least-squares solution (the projected-gradient correction keeps it); after
    # 500 epochs it is within 0.2% (measured), so 1% leaves margin while a solver that
    # converged elsewhere (the published correction with these centers: 50%) fails.
    model = AdaptiveKernelRegressor(
        feature_learning=None,
        solver="eigenpro",
        bandwidth=BANDWIDTH,
        centers=centers,
        batch_size=X.shape[0],
        n_epochs=500,
        early_stopping=False,
        tol=None,
        dtype="float64",
        random_state=0,
    ).fit(X, y)
    predictions = model.predict(X_test)
    assert np.linalg.norm(predictions - reference) / np.linalg.norm(reference) < 1e-2
    assert model.projection_ == "exact"
    assert model.centers_.shape == (200, X.shape[1])
    assert model.dual_coef_.shape == (200, 1)
    np.testing.assert_allclose(model.centers_, centers)


def test_drawn_centers_reach_the_least_squares_fit_with_sgd():
    X, y, _, _ = _problem(seed=1)
    model = AdaptiveKernelRegressor(
        solver="eigenpro",
        bandwidth=BANDWIDTH,
        n_centers=150,
        n_epochs=30,
        batch_size=128,
        dtype="float64",
        random_state=0,
    )
    model.fit(X, y)
    centers = model.centers_
    assert centers.shape == (150, X.shape[1])
    # The drawn centers are training rows.
    assert all(np.any(np.all(X == row, axis=1)) for row in centers)
    alpha, *_ = np.linalg.lstsq(_gaussian(X, centers), y, rcond=None)
    reference_mse = np.mean((_gaussian(X, centers) @ alpha - y) ** 2)
    train_mse = np.mean((model.predict(X) - y) ** 2)
    # SGD at a constant step ends near, not at, the optimum: within 10% of its loss.
    assert reference_mse <= train_mse < 1.1 * reference_mse


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cached_and_streamed_kernels_give_the_same_model(dtype):
    X, y, X_test, _ = _problem(seed=2, n=1500)
    params = dict(bandwidth=BANDWIDTH, n_centers=120, n_epochs=3, batch_size=128, dtype=dtype, random_state=0)
    cached = AdaptiveKernelRegressor(solver="eigenpro", cache_kernel=True, **params).fit(X, y)
    streamed = AdaptiveKernelRegressor(solver="eigenpro", cache_kernel=False, **params).fit(X, y)
    auto = AdaptiveKernelRegressor(solver="eigenpro", **params).fit(X, y)
    assert cached.kernel_cached_ and not streamed.kernel_cached_ and auto.kernel_cached_
    np.testing.assert_array_equal(cached.centers_, streamed.centers_)
    rtol = 1e-10 if dtype == "float64" else 10 * RTOL[dtype]
    scale = np.abs(cached.predict(X_test)).max()
    np.testing.assert_allclose(streamed.predict(X_test), cached.predict(X_test), rtol=0, atol=rtol * scale)


def test_auto_streams_when_the_kernel_matrix_does_not_fit():
    X, y, _, _ = _problem(seed=3, n=1000)
    # K(X, Z) would take 1000 * 100 * 8 = 800 kB: more than this budget leaves.
    model = AdaptiveKernelRegressor(
        solver="eigenpro",
        bandwidth=BANDWIDTH,
        n_centers=100,
        n_epochs=1,
        batch_size=64,
        dtype="float64",
        memory_budget=700_000,
    ).fit(X, y)
    assert not model.kernel_cached_


def test_cache_kernel_true_that_does_not_fit_names_the_bytes_and_budget():
    X, y, _, _ = _problem(seed=3, n=1000)
    model = AdaptiveKernelRegressor(
        solver="eigenpro",
        bandwidth=BANDWIDTH,
        n_centers=100,
        cache_kernel=True,
        early_stopping=False,
        dtype="float64",
        memory_budget=700_000,
    )
    with pytest.raises(ValueError, match=r"needs 800000 bytes, but memory_budget=700000"):
        model.fit(X, y)


def test_budgets_too_small_are_named():
    X, y, _, _ = _problem(seed=3, n=1000)
    # The 500-point eigensystem alone takes 2 MB.
    with pytest.raises(ValueError, match="memory_budget=1000000 bytes is too small"):
        AdaptiveKernelRegressor(solver="eigenpro", bandwidth=BANDWIDTH, n_centers=500, memory_budget=1_000_000).fit(
            X, y
        )
    # The exact projection's float64 factor and the row blocks that fill it take
    # 8 p^2 + 8 p ceil(p / 8) = 2252000 bytes.
    exact = AdaptiveKernelRegressor(
        solver="eigenpro", bandwidth=BANDWIDTH, n_centers=500, projection="exact", memory_budget="3MB"
    )
    with pytest.raises(ValueError, match=r"projection='exact' factorises K.*2252000 bytes"):
        exact.fit(X, y)


@pytest.mark.parametrize("budget", [None, "2.5MB"])
def test_iterative_projection_tracks_the_exact_one(budget):
    X, y, X_test, _ = _problem(seed=4, n=3000)
    params = dict(bandwidth=BANDWIDTH, n_centers=400, n_epochs=4, batch_size=128, early_stopping=False, dtype="float64")
    # 200 components put m*(P) at 49526 for 3000 rows: the iteration moves slowly and the
    # two projections stay within 0.4%.  "auto" now stops at m*(P) = n (96 components),
    # where both fit faster (loss 0.397 against 0.444 after 4 epochs) and the iterative
    # projection lags the exact one by 3.5% after 4 epochs and 2% after 12.
    params.update(n_components=200, random_state=0)
    # 2.5 MB leaves no room for the 2.56 MB Gram matrix and factor (nor for K(Z, Z)):
    # "auto" then projects iteratively with kernel rows recomputed per iteration.
    iterative = AdaptiveKernelRegressor(
        feature_learning=None, solver="eigenpro", projection="iterative", memory_budget=budget, **params
    ).fit(X, y)
    exact = AdaptiveKernelRegressor(feature_learning=None, solver="eigenpro", projection="exact", **params).fit(X, y)
    assert iterative.projection_ == "iterative" and exact.projection_ == "exact"
    if budget is not None:
        assert (
            AdaptiveKernelRegressor(feature_learning=None, solver="eigenpro", memory_budget=budget, **params)
            .fit(X, y)
            .projection_
            == "iterative"
        )
    # Same iteration, same batches: the epoch losses agree within 1% (measured 0.4%; a
    # projection that dropped its unresolved values instead of carrying them over
    # diverged here), and so do the test predictions, roughly.
    losses = [[record["train_loss"] for record in model.history_] for model in (iterative, exact)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-2)
    y_test = iterative.predict(X_test), exact.predict(X_test)
    assert np.linalg.norm(y_test[0] - y_test[1]) < 0.5 * np.linalg.norm(y_test[1])
    assert iterative.n_projections_ > exact.n_projections_ > 0


def test_n_centers_larger_than_n_warns_and_clamps():
    X, y, _, _ = _problem(n=80)
    with pytest.warns(UserWarning, match="n_centers=100 is larger than the 80"):
        model = AdaptiveKernelRegressor(solver="eigenpro", n_centers=100, n_epochs=1, random_state=0).fit(X, y)
    assert model.n_centers_ == 80 and model.centers_.shape[0] == 80


@pytest.mark.parametrize(
    "params, match",
    [
        ({"centers": np.zeros((10, 3))}, "centers has 3 features, but X has 5"),
        ({"centers": np.full((10, 5), np.nan)}, "NaN"),
        ({"centers": np.zeros(5)}, "2D array"),
        ({"centers": np.zeros((10, 5)), "n_centers": 10}, "either n_centers or centers"),
    ],
)
def test_bad_centers_are_named(params, match):
    X, y, _, _ = _problem(n=100)
    with pytest.raises(ValueError, match=match):
        AdaptiveKernelRegressor(solver="eigenpro", **params).fit(X, y)


def test_default_keeps_every_training_point_as_a_center():
    X, y, _, _ = _problem(n=300)
    model = AdaptiveKernelRegressor(solver="eigenpro", n_epochs=1, random_state=0).fit(X, y)
    assert model.n_centers_ == 300 and model.projection_ is None
    # EigenPro 2 caches its K(X, X) (300 x 300 in float32) when it fits.
    assert model.kernel_cached_ and model.kernel_cache_dtype_ == "float32"


def test_classifier_with_centers_and_warm_start():
    X, _, _, _ = _problem(n=600)
    labels = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = AdaptiveKernelClassifier(solver="eigenpro", n_centers=100, n_epochs=2, random_state=0, warm_start=True).fit(
        X, labels
    )
    assert model.score(X, labels) > 0.9
    first = model.dual_coef_.copy()
    model.fit(X, labels)
    assert model.n_epochs_total_ == 4 and not np.array_equal(first, model.dual_coef_)


def _nystrom_ridge_float64(X, y, centers, bandwidth, ridge, row_block=25_000):
    """Float64 solve of ``min ||K(X, Z) a - y||^2 + ridge * n * a^T K(Z, Z) a`` by normal equations in blocks."""
    import torch

    Z = torch.as_tensor(centers, dtype=torch.float64)
    z_norms = (Z * Z).sum(1)

    def gaussian(A):
        sq = ((A * A).sum(1)[:, None] + z_norms[None, :]).addmm_(A, Z.T, alpha=-2.0).clamp_(min=0.0)
        return sq.mul_(-1.0 / (2.0 * bandwidth**2)).exp_()

    gram = torch.zeros(Z.shape[0], Z.shape[0], dtype=torch.float64)
    moment = torch.zeros(Z.shape[0], 1, dtype=torch.float64)
    for start in range(0, X.shape[0], row_block):
        block = gaussian(torch.as_tensor(X[start : start + row_block], dtype=torch.float64))
        gram.addmm_(block.T, block)
        moment.addmm_(block.T, torch.as_tensor(y[start : start + row_block, None], dtype=torch.float64))
    gram += ridge * X.shape[0] * gaussian(Z)
    alpha = torch.linalg.solve(gram, moment)
    return lambda A: (gaussian(torch.as_tensor(A, dtype=torch.float64)) @ alpha)[:, 0].numpy()


@pytest.mark.slow
def test_400k_rows_4000_centers_in_a_1gb_budget_match_a_float64_nystrom_ridge():
    """The issue's acceptance check: peak RSS growth, centers and test R^2 against a float64 solve."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # A fresh process, so that the peak RSS is this fit's alone.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = pool.submit(_fit_400k).result(timeout=1500)
    print(result)
    assert result["n_centers"] == 4000
    assert result["peak_rss_growth_gib"] <= 1.5, result
    assert result["r2_ours"] >= result["r2_reference"] - 0.01, result


def _fit_400k():
    import time

    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, size=(420_000, 8)).astype(np.float32)
    y = (np.sin(1.5 * X.sum(1)) + 0.1 * rng.randn(X.shape[0])).astype(np.float32)
    X_train, y_train, X_test, y_test = X[:400_000], y[:400_000], X[400_000:], y[400_000:]
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # the peak RSS restarts from the current RSS
    before = status_bytes("VmRSS")
    tic = time.perf_counter()
    # A fixed batch keeps the run independent of the device probe's timings.
    model = AdaptiveKernelRegressor(
        solver="eigenpro",
        bandwidth=1.0,
        n_centers=4000,
        memory_budget="1GB",
        n_epochs=2,
        batch_size=512,
        random_state=0,
    ).fit(X_train, y_train)
    seconds = time.perf_counter() - tic
    growth = (status_bytes("VmHWM") - before) / 2**30
    reference = _nystrom_ridge_float64(X_train, y_train, model.centers_, 1.0, ridge=1e-6)
    residual = reference(X_test) - y_test
    return {
        "n_centers": model.centers_.shape[0],
        "peak_rss_growth_gib": growth,
        "r2_ours": model.score(X_test, y_test),
        "r2_reference": 1.0 - np.mean(residual**2) / np.var(y_test),
        "fit_seconds": seconds,
        "projection": model.projection_,
    }


# Centers in 3-d with a bandwidth below their spread: K(Z, Z) is ill-conditioned enough
# to need the preconditioner but solvable to 1e-3 within the iteration cap.
PROJECTION_BANDWIDTH = 0.7


def _projection_problem(p=600, subsample=60, n_components=30, seed=5):
    import torch

    from skgpu_kernel.kernels import Gaussian
    from skgpu_kernel.operators import CenterShards
    from skgpu_kernel.preconditioner import EigenProPreconditioner, nystrom_eigensystem

    rng = np.random.RandomState(seed)
    Z = torch.as_tensor(rng.randn(p, 3))
    kernel = Gaussian(bandwidth=PROJECTION_BANDWIDTH)
    eigenvalues, eigenvectors = nystrom_eigensystem(kernel, Z[:subsample])
    preconditioner = EigenProPreconditioner(
        eigenvalues, eigenvectors, n_components, 1.0, torch.float64, torch.device("cpu")
    )
    shards = CenterShards(kernel, Z, [torch.device("cpu")], column_block=128)
    return kernel, Z, preconditioner, shards


def test_iterative_projection_step_is_the_measured_top_eigenvalue_and_converges():
    import torch

    from skgpu_kernel.solvers.eigenpro3 import IterativeProjection, _flatten

    _, Z, preconditioner, shards = _projection_problem()
    gram = _gaussian(Z.numpy(), Z.numpy(), PROJECTION_BANDWIDTH)
    # The preconditioned operator R -> R - E_S Psi D Psi^T K(Z_S, Z) R applied to K(Z, Z).
    s = preconditioner.subsample_size
    flatten = np.zeros((gram.shape[0], gram.shape[0]))
    for column in range(gram.shape[0]):
        unit = torch.zeros(gram.shape[0], 1, dtype=torch.float64)
        unit[column] = 1.0
        flatten[:s, column] = _flatten(preconditioner, torch.as_tensor(gram) @ unit).numpy()[:, 0]
    operator = (np.eye(gram.shape[0]) - flatten) @ gram
    spectral_radius = np.abs(np.linalg.eigvals(operator)).max()
    # The subsample (60 of 600 centers) flattens its own Nystrom estimate; over all the
    # centers the flattened top eigenvalue is several times that estimate, which is why
    # the step is measured (a step from the estimate diverges).
    estimate = preconditioner.top_eigenvalue * s
    assert spectral_radius > 2 * estimate

    projection = IterativeProjection(shards, Z, preconditioner, max_iterations=2000, tol=1e-3, row_block=256)
    assert projection.top_eigenvalue == pytest.approx(spectral_radius, rel=0.05)
    h = torch.as_tensor(gram @ np.random.RandomState(0).randn(gram.shape[0], 2))
    theta, remainder = projection(h)
    assert np.linalg.norm(remainder.numpy()) <= 1e-3 * np.linalg.norm(h.numpy())
    np.testing.assert_allclose(gram @ theta.numpy(), h.numpy() - remainder.numpy(), rtol=1e-8, atol=1e-8)


def test_exact_projection_factor_solves_the_jittered_gram_system():
    import torch

    from skgpu_kernel.solvers.eigenpro3 import ExactProjection

    kernel, Z, _, _ = _projection_problem(p=300)
    projection = ExactProjection(kernel, Z, 1e-10, torch.float64)
    gram = _gaussian(Z.numpy(), Z.numpy(), PROJECTION_BANDWIDTH)
    h = np.random.RandomState(1).randn(300, 3)
    theta, remainder = projection(torch.as_tensor(h))
    assert remainder is None
    # K(Z, Z) is nearly singular (a million-fold coefficients): the solve is checked
    # by its residual, which a backward-stable float64 solve keeps at rounding level.
    jittered = gram + projection.jitter * np.eye(300)
    residual = jittered @ theta.numpy() - h
    assert np.linalg.norm(residual) <= 1e-6 * np.linalg.norm(h)
    assert np.linalg.norm(theta.numpy()) > 1e3 * np.linalg.norm(h)


def test_exact_projection_is_preferred_to_the_cache_when_both_do_not_fit():
    X, y, _, _ = _problem(seed=3, n=2000)
    # p = 600 (float64): K(X, Z) takes 9.6 MB and the exact factor with its blocks
    # 3.24 MB, the fixed costs 3.1 MB: 14 MB holds either, not both.
    params = dict(bandwidth=BANDWIDTH, n_centers=600, n_epochs=1, dtype="float64", memory_budget="14MB")
    model = AdaptiveKernelRegressor(solver="eigenpro", **params).fit(X, y)
    assert (model.projection_, model.kernel_cached_) == ("exact", False)
    forced = AdaptiveKernelRegressor(solver="eigenpro", cache_kernel=True, **params).fit(X, y)
    assert (forced.projection_, forced.kernel_cached_) == ("iterative", True)
    roomy = AdaptiveKernelRegressor(solver="eigenpro", **{**params, "memory_budget": "20MB"}).fit(X, y)
    assert (roomy.projection_, roomy.kernel_cached_) == ("exact", True)


def test_out_of_memory_halves_the_batch_and_continues(monkeypatch, capsys):
    X, y, X_test, _ = _problem(seed=3)
    real = eigenpro3_solver._residual_and_gradient
    calls = []

    def failing_on_large_batches(shards, temporary, coef, batch):
        calls.append(batch[0].shape[0])
        if batch[0].shape[0] > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(shards, temporary, coef, batch)

    params = dict(solver="eigenpro", bandwidth=BANDWIDTH, n_centers=300, n_epochs=2, dtype="float64", random_state=0)
    reference = AdaptiveKernelRegressor(batch_size=100, **params).fit(X, y)
    monkeypatch.setattr(eigenpro3_solver, "_residual_and_gradient", failing_on_large_batches)
    model = AdaptiveKernelRegressor(batch_size=400, verbose=1, **params).fit(X, y)
    assert calls[:3] == [400, 200, 100] and model.batch_size_ == 100
    assert "out of memory in a step of 400 rows" in capsys.readouterr().out
    # Each halving is a new attempt, planned again with the halved batch from the
    # same random draws: the model is the one planned with the batch that fits.
    # (Every fit of feature learning's path halves its batch twice.)
    shrank = [(entry["from"], entry["to"]) for entry in model.fit_attempts_ if entry.get("event") == "out_of_memory"]
    assert shrank[:2] == [(400, 200), (200, 100)] and set(shrank) == {(400, 200), (200, 100)}
    np.testing.assert_array_equal(model.predict(X_test), reference.predict(X_test))
