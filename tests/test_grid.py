"""Data on a common grid: detection, codes, exact distances, and the cache filled from them."""

import json

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import skgpu_kernel.operators as operators
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.device import integer_matmul_speedup
from skgpu_kernel.grid import (
    INTEGER_PRODUCTS_MIN_SPEEDUP,
    _int8_product,
    encode_on_grid,
    find_grid,
    integer_sq_distances,
)
from skgpu_kernel.kernels import Cauchy, Gaussian, Laplacian, Matern
from skgpu_kernel.operators import (
    CachedOperator,
    EvaluatedOperator,
    GridOperator,
    OperatorBlocks,
    OperatorPlan,
    measure_operator,
)
from skgpu_kernel.planning.kernel import KernelProblem
from skgpu_kernel.planning.operator import operator_problem, plan_operator


def _centred(X, dtype=torch.float32):
    """``X`` minus its float64 mean, in ``dtype``: what the estimators hand the kernel."""
    return torch.from_numpy(X - X.mean(axis=0, dtype=np.float64)).to(dtype)


def _images(n=700, d=40, seed=0):
    """8-bit pixel values scaled by 1/255 in float32, as image data sets are read."""
    return np.random.RandomState(seed).randint(0, 256, (n, d)).astype(np.float32) / 255.0


def test_grid_of_8_bit_images_is_the_pixel_step():
    grid = find_grid(_centred(_images()))
    assert grid is not None and grid.step == pytest.approx(1 / 255, rel=1e-6)


def test_grid_of_integer_features_is_one():
    X = load_digits().data
    assert find_grid(_centred(X, torch.float64)).step == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    "case",
    ["continuous", "over 256 levels", "one value off the grid", "constant", "squares overflow", "squares underflow"],
)
def test_data_off_any_grid_has_none(case):
    rng = np.random.RandomState(0)
    levels = rng.randint(0, 4, (500, 6)).astype(float)
    X = {
        "continuous": rng.normal(size=(500, 6)),
        "over 256 levels": rng.randint(0, 300, (500, 6)).astype(float),
        "one value off the grid": _images(500, 6).astype(float),
        "constant": np.ones((500, 6)),
        "squares overflow": levels * 1e160,
        "squares underflow": levels * 1e-160,
    }[case]
    if case == "one value off the grid":
        X[123, 4] += 0.3 / 255
    assert find_grid(_centred(X, torch.float64)) is None


def test_spans_beyond_floats_have_no_grid():
    X = torch.tensor([[1e308, 0.0], [-1e308, 1.0], [0.0, 2.0]], dtype=torch.float64)
    assert find_grid(X) is None


def test_codes_reproduce_the_data_and_their_norms():
    X = _centred(_images())
    grid = find_grid(X)
    codes = encode_on_grid(X, grid)
    rows, sq_norms = codes.row_block(0, len(codes))
    assert rows.dtype == torch.int8 and rows.shape == (700, 40) and rows.is_contiguous()
    assert torch.equal(rows, codes.codes_t.T)
    values = grid.origin + grid.step * (rows.double() + 128)
    assert torch.allclose(values, X.double(), rtol=0, atol=1e-6)
    wide = rows.long()
    assert torch.equal(sq_norms.long(), (wide * wide).sum(1))


def test_codes_pad_the_features_to_a_multiple_of_8_with_zeros():
    X = _centred(load_digits().data[:, :13])
    codes = encode_on_grid(X, find_grid(X))
    assert codes.codes_t.shape == (16, 1797) and not codes.codes_t[13:].any()


def test_rows_outside_the_grids_levels_have_no_codes():
    X = _centred(_images())
    grid = find_grid(X)
    assert encode_on_grid(X[:50] + 2.0, grid) is None
    assert encode_on_grid(X[:50] + 0.5 / 255, grid) is None
    assert encode_on_grid(X[:50], grid) is not None


def test_integer_squared_distances_are_exact():
    X = _centred(load_digits().data, torch.float64)
    grid = find_grid(X)
    codes = encode_on_grid(X, grid)
    out = torch.empty(300, 1797, dtype=torch.int32)
    sq = integer_sq_distances(*codes.row_block(0, 300), codes.codes_t, codes.sq_norms, out)
    reference = ((X[:300, None, :] - X[None, :, :]) ** 2).sum(-1)
    assert torch.equal(sq.double(), reference.round()) and torch.allclose(sq.double(), reference, atol=1e-9)


@pytest.mark.parametrize("shape", [(5, 3), (20, 9), (33, 41)])
def test_padded_int8_product_equals_the_plain_one(shape, monkeypatch):
    """The padding and layout CUDA's ``torch._int_mm`` needs (checked on the CPU, which takes any)."""
    int_mm, layouts = torch._int_mm, []

    def recording_int_mm(left, right, **kwargs):
        layouts.append((left.shape[0], left.stride(1), right.shape[1] % 8, right.stride(0)))
        return int_mm(left, right, **kwargs)

    # cuBLASLt (an H200, torch 2.11) refuses a row-major right factor: CUBLAS_STATUS_NOT_SUPPORTED.
    monkeypatch.setattr(torch, "_int_mm", recording_int_mm)
    generator = torch.Generator().manual_seed(0)
    left = torch.randint(-128, 128, (shape[0], 16), dtype=torch.int8, generator=generator)
    right = torch.randint(-128, 128, (16, shape[1]), dtype=torch.int8, generator=generator)
    out = torch.empty(shape, dtype=torch.int32)
    _int8_product(left, right, out, pad=True)
    assert torch.equal(out, left.long().mm(right.long()).int())
    wide = torch.randint(-128, 128, (16, 64), dtype=torch.int8, generator=generator)
    column_slice, out = wide[:, 8:24], torch.empty(shape[0], 16, dtype=torch.int32)
    _int8_product(left, column_slice, out, pad=True)
    assert torch.equal(out, left.long().mm(column_slice.long()).int())
    # Left row-major with more than 16 rows, right column-major with a multiple of 8 columns.
    assert layouts == [(max(-(-shape[0] // 8) * 8, 24), 1, 0, 1)] * 2


@pytest.mark.parametrize("kernel", [Gaussian(0.8), Laplacian(1.5), Cauchy(0.5), Matern(1.0, nu=2.5)], ids=repr)
@pytest.mark.parametrize("symmetric", [True, False])
def test_cache_from_grid_codes_equals_the_float64_kernel(kernel, symmetric):
    X = _centred(_images(600, 30))
    grid = find_grid(X)
    codes = encode_on_grid(X, grid)
    rows, row_codes = (X, codes) if symmetric else (X[:170], encode_on_grid(X[:170], grid))
    blocks = OperatorBlocks(64, 96)
    on_grid = GridOperator(kernel, row_codes, codes, torch.float32, blocks)
    cache = CachedOperator.fill(on_grid, torch.float32, 64, 96, symmetric=symmetric).values
    reference = kernel(rows.double(), X.double())
    assert torch.allclose(cache.double(), reference, rtol=0, atol=2e-6)
    evaluated = EvaluatedOperator(kernel, rows, kernel.prepare_centers(X), blocks)
    floats = CachedOperator.fill(evaluated, torch.float32, 64, 96, symmetric=symmetric).values
    assert (cache.double() - reference).abs().max() <= (floats.double() - reference).abs().max() + 1e-7
    assert torch.equal(torch.diagonal(cache[:, : len(rows)]), torch.ones(len(rows)))


@pytest.mark.parametrize("leading", [0, 40])
def test_kernel_products_from_grid_codes_equal_the_float64_ones(leading):
    X = _centred(_images(500, 30))
    codes = encode_on_grid(X, find_grid(X))
    batch = torch.tensor([3, 499, 17, 250, 0, 77])
    V = torch.randn(500, 3, generator=torch.Generator().manual_seed(0))
    kernel = Gaussian(0.9)
    products = GridOperator(kernel, codes, codes, X.dtype, OperatorBlocks(500, 64)).matmul(
        V, rows=batch, leading=leading
    )
    reference = kernel(X[batch].double(), X.double())
    out = products[0] if leading else products
    assert torch.allclose(out.double(), reference @ V.double(), rtol=0, atol=1e-5)
    if leading:
        assert torch.allclose(products[1].double(), reference[:, :leading], rtol=0, atol=1e-6)


def test_integer_products_are_measured_against_torch_mm():
    speedup = integer_matmul_speedup(torch.device("cpu"), torch.float32, 256, 64, 256)
    assert np.isfinite(speedup) and speedup > 0


@pytest.fixture
def counted_int8_products(monkeypatch, tmp_path):
    """A fresh probe store and in-process cache; the list gains one entry per int8 product run."""
    from skgpu_kernel import device as device_module

    int_mm, called = torch._int_mm, []

    def counted(left, right):
        called.append(1)
        return int_mm(left, right)

    monkeypatch.setattr(torch, "_int_mm", counted)
    monkeypatch.setenv("SKGPU_KERNEL_PROBE_DIR", str(tmp_path))
    monkeypatch.setattr(device_module, "_INT8_SPEEDUPS", {})
    return called


@pytest.mark.parametrize(("float_gflops", "calls"), [(1e-6, 4), (1e6, 2)])
def test_an_int8_probe_slower_than_the_float_product_stops_after_its_first_timed_call(
    monkeypatch, counted_int8_products, float_gflops, calls
):
    # The grid takes int8 products only at twice float's speed: one timed call slower than
    # float's best decides it; where int8 may pay, the probe runs its warm-up and three calls.
    from skgpu_kernel import device as device_module

    monkeypatch.setattr(device_module, "matmul_gflops", lambda *args: float_gflops)
    speedup = integer_matmul_speedup(torch.device("cpu"), torch.float32, 96, 24, 80)
    assert len(counted_int8_products) == calls
    assert (speedup < 1) == (float_gflops > 1)


def test_the_int8_speedup_is_measured_once_per_machine_and_shape(monkeypatch, counted_int8_products, tmp_path):
    from skgpu_kernel import device as device_module

    cpu = torch.device("cpu")
    first = integer_matmul_speedup(cpu, torch.float32, 96, 24, 80)
    measured = len(counted_int8_products)
    assert measured >= 2
    monkeypatch.setattr(device_module, "_INT8_SPEEDUPS", {})  # another process on the same machine
    assert integer_matmul_speedup(cpu, torch.float32, 96, 24, 80) == first
    assert len(counted_int8_products) == measured, "read from the probe store, not timed again"
    integer_matmul_speedup(cpu, torch.float32, 96, 24, 88)
    assert len(counted_int8_products) > measured, "another shape is measured"
    store = tmp_path / "throughput_probes.json"
    records = json.loads(store.read_text())
    assert len(records) == 2
    for key in records:
        records[key] = "not a rate"
    store.write_text(json.dumps(records))
    monkeypatch.setattr(device_module, "_INT8_SPEEDUPS", {})
    again = len(counted_int8_products)
    assert np.isfinite(integer_matmul_speedup(cpu, torch.float32, 96, 24, 80))
    assert len(counted_int8_products) > again, "a record that is not a rate is measured again"


def test_the_operator_plan_takes_the_grid_wherever_the_rows_lie_on_one_and_the_speed_picks_only_the_products():
    problem = KernelProblem(700, 40, 1, 4)
    grid = find_grid(_centred(_images()))
    fast = OperatorPlan(grid, INTEGER_PRODUCTS_MIN_SPEEDUP)
    slow = OperatorPlan(grid, INTEGER_PRODUCTS_MIN_SPEEDUP * 0.99)
    assert plan_operator(problem, fast).grid_step == pytest.approx(1 / 255, rel=1e-6)
    assert plan_operator(problem, fast).grid.integer_products
    assert plan_operator(problem, slow).grid_step == plan_operator(problem, fast).grid_step
    assert not plan_operator(problem, slow).grid.integer_products
    assert not plan_operator(problem, OperatorPlan()).on_grid
    streamed = KernelProblem(700, 40, 1, 4, n_centers=100, streamed=True)
    assert not plan_operator(streamed, fast).on_grid, "streamed rows are never checked against a grid"
    assert operator_problem(problem, fast).grid_codes and operator_problem(problem, fast).extra_blocks == 1
    assert operator_problem(problem, slow) == operator_problem(problem, fast), "the memory plan ignores the speed"
    assert operator_problem(problem, OperatorPlan()) == problem
    cached = plan_operator(problem, fast, cache_itemsize=2)
    assert cached.cached and cached.cache_dtype == "float16" and "grid" in cached.describe()


@pytest.mark.parametrize("n_features", [40, 1024, 1030, 2100])
def test_exact_float32_products_of_the_codes_give_the_int8_products_bits(rng, n_features):
    """Beyond 1024 features the float32 products go in chunks: every partial sum stays an exact integer."""
    rows = torch.as_tensor(rng.randint(-128, 128, (37, n_features)), dtype=torch.int8)
    centers = torch.as_tensor(rng.randint(-128, 128, (n_features, 29)), dtype=torch.int8)
    # The extreme codes make the largest sums: a row and a center of all -128.
    rows[0], centers[:, 0] = -128, -128
    norms_rows = (rows.int() ** 2).sum(1, dtype=torch.int32)
    norms_centers = (centers.int() ** 2).sum(0, dtype=torch.int32)
    shape = (rows.shape[0], centers.shape[1])
    by_int8 = integer_sq_distances(rows, norms_rows, centers, norms_centers, torch.empty(shape, dtype=torch.int32))
    by_float = integer_sq_distances(
        rows, norms_rows, centers, norms_centers, torch.empty(shape, dtype=torch.int32), torch.empty(shape)
    )
    exact = ((rows.long()[:, None, :] - centers.long().T[None, :, :]) ** 2).sum(-1)
    assert torch.equal(by_int8.long(), exact) and torch.equal(by_float, by_int8)


def test_measurements_find_the_grid_only_for_kernels_of_distances_and_centers_on_it():
    X = _centred(_images())
    assert measure_operator(Gaussian(1.0), X, (256, 256)).grid is not None
    assert measure_operator(Gaussian(1.0), X, (256, 256), centers=X[:50] + 1e-3).grid is None
    assert measure_operator(Gaussian(1.0), X + 1e-3 * torch.rand_like(X), (256, 256)).grid is None
    stretched = _StretchedGaussian(1.0)
    assert measure_operator(stretched, X, (256, 256)) == OperatorPlan()


def _fit_with_speedup(monkeypatch, speedup, estimator, X, y):
    """Fit with the int8 products' speed measured as ``speedup``; None: as if the rows lay on no grid."""
    if speedup is None:
        monkeypatch.setattr(operators.core, "find_grid", lambda rows: None)
    else:
        monkeypatch.setattr(operators.core, "find_grid", find_grid)
        monkeypatch.setattr(operators.core, "integer_matmul_speedup", lambda *args: speedup)
    return estimator.fit(X, y)


@pytest.mark.parametrize("cache_kernel", ["auto", False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fit_on_a_grid_equals_the_float_fill(monkeypatch, dtype, cache_kernel):
    """Same data, same decisions: only the kernel's rounding differs, and the grid's is smaller.

    Cached, the fill takes the grid's distances; not cached, every step's blocks and the
    validation scores do.  Whether int8 products pay changes no bit of the model.
    """
    X, y = load_digits(return_X_y=True)
    X, y = X[:1400] / 16.0, y[:1400]
    params = {"bandwidth": 2.0, "dtype": dtype, "batch_size": 96, "random_state": 0, "solver": "eigenpro"}
    params["cache_kernel"] = cache_kernel
    grid = _fit_with_speedup(monkeypatch, 100.0, AdaptiveKernelClassifier(**params), X, y)
    slow_int8 = _fit_with_speedup(monkeypatch, 0.0, AdaptiveKernelClassifier(**params), X, y)
    floats = _fit_with_speedup(monkeypatch, None, AdaptiveKernelClassifier(**params), X, y)
    assert grid.kernel_grid_step_ == pytest.approx(1 / 16) and floats.kernel_grid_step_ is None
    assert slow_int8.kernel_grid_step_ == grid.kernel_grid_step_
    np.testing.assert_array_equal(slow_int8.dual_coef_, grid.dual_coef_)
    assert grid.kernel_cached_ == floats.kernel_cached_ == (cache_kernel == "auto")
    assert grid.n_epochs_ == floats.n_epochs_
    scale = np.abs(floats.dual_coef_).max()
    # In float32 the two caches round differently (by about 1e-7) and the steps carry it
    # on; the float32 fit itself is 0.12 (relative) from the float64 one here.
    tolerance = 1e-3 if dtype == "float32" else 1e-9
    assert np.abs(grid.dual_coef_ - floats.dual_coef_).max() <= tolerance * scale


def test_continuous_data_fills_with_float_products(monkeypatch):
    rng = np.random.RandomState(0)
    X = rng.normal(size=(800, 5))
    y = np.sin(X).sum(1)
    params = {"bandwidth": 1.0, "alpha": 0.0, "random_state": 0, "solver": "eigenpro", "n_epochs": 2}
    model = _fit_with_speedup(monkeypatch, 100.0, AdaptiveKernelRegressor(**params), X, y)
    assert model.kernel_cached_ and model.kernel_grid_step_ is None


class _StretchedGaussian(Gaussian):
    """A user's radial kernel with its own row transform: the Gaussian of ``stretch * x``.

    It keeps the profile and ``block_from_sq_distances`` of the Gaussian, so only its
    ``prepare_rows`` and ``prepare_centers`` make it another kernel: blocks from the
    raw rows' grid distances would be the plain Gaussian's.
    """

    def __init__(self, bandwidth=1.0, stretch=2.0):
        super().__init__(bandwidth)
        self.stretch = stretch

    def prepare_rows(self, X):
        return super().prepare_rows(X * self.stretch)

    def prepare_centers(self, Z):
        return super().prepare_centers(Z * self.stretch)


def test_a_radial_kernel_with_its_own_row_transform_never_takes_the_grid(monkeypatch):
    """Without declaring ``from_distances`` itself, it fits as with float products: as the Gaussian of ``stretch``."""
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16.0, y[:600]
    params = {"dtype": "float64", "batch_size": 96, "random_state": 0, "solver": "eigenpro", "alpha": 0.0}
    stretched = _StretchedGaussian(bandwidth=2.0, stretch=2.0)
    assert not stretched.from_distances and Gaussian(1.0).from_distances
    with pytest.raises(ValueError, match="does not declare from_distances"):
        codes = encode_on_grid(_centred(X, torch.float64), find_grid(_centred(X, torch.float64)))
        GridOperator(stretched, codes, codes, torch.float64, OperatorBlocks(64, 64))
    custom = _fit_with_speedup(monkeypatch, 100.0, AdaptiveKernelClassifier(kernel=stretched, **params), X, y)
    # The Gaussian of 2 x at bandwidth 2 is the Gaussian of x at bandwidth 1 (which takes the grid).
    plain = _fit_with_speedup(monkeypatch, 100.0, AdaptiveKernelClassifier(kernel=Gaussian(1.0), **params), X, y)
    assert custom.kernel_grid_step_ is None and plain.kernel_grid_step_ == pytest.approx(1 / 16)
    scale = np.abs(plain.dual_coef_).max()
    assert np.abs(custom.dual_coef_ - plain.dual_coef_).max() <= 1e-9 * scale


def test_predictions_of_a_grid_fit_take_the_grid_and_equal_float64(monkeypatch):
    """Rows on the training grid are predicted from exact int8 distances, also after pickling; others from floats."""
    import pickle

    from skgpu_kernel import blockwise

    X, y = load_digits(return_X_y=True)
    X, y = X / 16.0, y.astype(float)
    params = {"bandwidth": 2.0, "dtype": "float32", "batch_size": 96, "random_state": 0, "solver": "eigenpro"}
    model = _fit_with_speedup(
        monkeypatch, 100.0, AdaptiveKernelRegressor(alpha=0.0, n_epochs=3, **params), X[:1200], y[:1200]
    )
    assert model.kernel_grid_step_ == pytest.approx(1 / 16)
    on_grid_calls = []
    real = blockwise.kernel_predict

    def recording(*args, **kwargs):
        on_grid_calls.append(kwargs.get("on_grid") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(blockwise, "kernel_predict", recording)
    X_test = X[1200:]
    monkeypatch.setattr(blockwise, "integer_matmul_speedup", lambda *args: 1.9)  # int8 does not pay: float32
    slow_int8 = model.predict(X_test)
    assert on_grid_calls == [True]
    on_grid_calls.clear()
    monkeypatch.setattr(blockwise, "integer_matmul_speedup", lambda *args: 100.0)
    predictions = model.predict(X_test)
    assert on_grid_calls == [True]
    np.testing.assert_array_equal(slow_int8, predictions)  # the same distances, whichever products
    # The same model in float64 arithmetic.  Both ways sum K(x, Z) c in float32, whose
    # rounding (up to eps * sum_j |K_ij c_j|, 5e-4 here: coefficients up to 77)
    # dominates the predictions' error, so the distances are compared on kernel blocks.
    centers = torch.as_tensor(model.centers_, dtype=torch.float64)
    offset = torch.as_tensor(model.X_offset_, dtype=torch.float64)
    block = model.kernel_(torch.as_tensor(X_test) - offset, centers - offset).numpy()
    exact = block @ model.dual_coef_.astype(float).ravel() + model.intercept_
    scale = np.abs(exact).max()
    summed = (np.abs(block) @ np.abs(model.dual_coef_.astype(float).ravel())).max()
    eps = np.finfo(np.float32).eps
    for way in (predictions, slow_int8):
        assert np.abs(way - exact).max() <= eps * summed
    # K(X_test, Z) itself through both ways (coefficients: the first 64 unit vectors):
    # the grid's distances are exact, so its entries are the exponential's rounding
    # only; the float32 expansion's are not.
    tensors = model._device_cache
    units = torch.eye(tensors.centers.shape[0], 64, dtype=tensors.coef.dtype, device=tensors.coef.device)
    ways = [
        blockwise.kernel_predict(model.kernel_, X_test, tensors.centers, units, 2**28, tensors.offset, grid)
        for grid in (tensors, None)
    ]
    grid_error, float_error = (np.abs(np.asarray(way, dtype=float) - block[:, :64]).max() for way in ways)
    assert grid_error <= 4 * eps
    assert grid_error < float_error
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(X_test), predictions)
    # One row off the grid: every row from float blocks, as a model without the grid predicts them.
    off = X_test.copy()
    off[0, 0] += 0.01
    on_grid_calls.clear()
    mixed = model.predict(off)
    assert on_grid_calls == [True, False]
    assert np.abs(mixed[1:] - predictions[1:]).max() <= 1e-4 * scale
