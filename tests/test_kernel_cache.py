"""EigenPro 2's cached kernel: the blocks that fill it, the reads, and fits equal to streamed ones.

A fit that reads ``K(X, X)`` from its cache must be the fit that evaluates each
batch's kernel rows (same seed, same batch): the two differ only in the rounding of
the kernel entries' sums, so float64 fits agree to 1e-8.  The peak memory of a
cached fit is measured in a fresh process against its budget.
"""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor, operators
from skgpu_kernel.kernels import CallableKernel, Gaussian, Laplacian
from skgpu_kernel.operators import CachedOperator, EvaluatedOperator, OperatorBlocks, filled_entries
from skgpu_kernel.solvers.eigenpro import chunked_permutation

from ._processes import status_bytes


def _points(n=700, d=4, seed=0):
    return torch.as_tensor(np.random.RandomState(seed).randn(n, d))


def _filled(kernel, X, Z, storage, row_block, column_block, symmetric=False):
    """The values of ``K(X, Z)`` cached from an evaluated operator."""
    source = EvaluatedOperator(kernel, X, kernel.prepare_centers(Z), OperatorBlocks(row_block, column_block))
    return CachedOperator.fill(source, storage, row_block, column_block, symmetric=symmetric).values


@pytest.mark.parametrize("mirror_tile", [None, 5])
@pytest.mark.parametrize("blocks", [(64, 100), (128, 700), (700, 700), (7, 13), (300, 256)])
def test_symmetric_fill_equals_the_kernel_matrix(monkeypatch, blocks, mirror_tile):
    if mirror_tile is not None:  # tiles smaller than a band, some cut short at its edges
        monkeypatch.setattr(operators.core, "_MIRROR_TILE", mirror_tile)
    X = _points()
    kernel = Laplacian(bandwidth=1.5)
    cache = _filled(kernel, X, X, torch.float64, *blocks, symmetric=True)
    np.testing.assert_allclose(cache.numpy(), kernel(X, X).numpy(), rtol=0, atol=1e-14)


def test_rectangular_fill_and_float16_storage():
    X, Z = _points(300, seed=1), _points(500, seed=2)
    kernel = Gaussian(bandwidth=2.0)
    exact = kernel(X, Z).numpy()
    cache = _filled(kernel, X, Z, torch.float64, 64, 128)
    np.testing.assert_allclose(cache.numpy(), exact, rtol=0, atol=1e-14)
    half = _filled(kernel, X.float(), Z.float(), torch.float16, 64, 128)
    assert half.dtype == torch.float16
    # float16 keeps 11 significant bits: values in [0, 1] within 2^-12 (plus float32 rounding).
    np.testing.assert_allclose(half.double().numpy(), exact, rtol=0, atol=2.0**-12 + 1e-5)


@pytest.mark.parametrize("storage", [torch.float64, torch.float16])
@pytest.mark.parametrize("outputs", [1, 3, 20])
def test_reads_of_runs_gathers_and_slices_equal_the_products(storage, outputs):
    kernel = Gaussian(bandwidth=2.0)
    X = _points(600)
    K = kernel(X, X)
    stored = K.to(storage)
    reference = stored.double()  # what the reads see
    cache = CachedOperator(stored, torch.float64)
    cache.read_rows = 16  # several pieces per run
    V = torch.as_tensor(np.random.RandomState(3).randn(600, outputs))
    chunked = chunked_permutation(600, 32, torch.Generator().manual_seed(0))[:200]
    scattered = torch.randperm(600, generator=torch.Generator().manual_seed(1))[:50]
    for rows in (chunked, scattered, torch.arange(100, 180)):
        out, leading = cache.matmul(V[:450], rows=rows, leading=40)
        np.testing.assert_allclose(out.numpy(), (reference[rows, :450] @ V[:450]).numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(leading.numpy(), reference[rows, :40].numpy())
    out = cache.matmul(V)
    np.testing.assert_allclose(out.numpy(), (reference @ V).numpy(), rtol=1e-12, atol=1e-12)


def test_chunked_permutation_permutes_whole_chunks():
    order = chunked_permutation(103, 10, torch.Generator().manual_seed(0)).numpy()
    assert sorted(order) == list(range(103))
    runs = np.split(order, np.flatnonzero(np.diff(order) != 1) + 1)
    assert all(run[0] % 10 == 0 for run in runs)
    assert not np.array_equal(order, np.arange(103))


def _regression(n=1500, d=6, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)
    return X, y


CASES = {
    # Half the 1350-row subsample's directions: every direction (the automatic choice when
    # the subsample is every row) reaches eigenvalues near float64's resolution, where the
    # two paths' different summation orders are amplified to 6e-8 of the coefficients.
    "interpolation, validation split": (
        AdaptiveKernelRegressor,
        {"alpha": 0.0, "early_stopping": True, "n_epochs": 6, "tol": None, "n_components": 675},
    ),
    "penalty and sample weights": (AdaptiveKernelRegressor, {"alpha": 1e-3, "early_stopping": False, "n_epochs": 6}),
    "classifier, 10 outputs": (AdaptiveKernelClassifier, {"alpha": 0.0, "early_stopping": True, "n_epochs": 4}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cached_and_streamed_fits_are_equal_in_float64(case):
    estimator, params = CASES[case]
    if estimator is AdaptiveKernelClassifier:
        X, y = load_digits(return_X_y=True)
        X, y, weights = X[:1200] / 16.0, y[:1200], None
    else:
        X, y = _regression()
        weights = np.random.RandomState(1).uniform(0.2, 1.0, len(y)) if params["alpha"] else None
    common = {"bandwidth": 2.0, "dtype": "float64", "batch_size": 96, "random_state": 0, "solver": "eigenpro"}
    fits = {
        cached: estimator(cache_kernel=cached, **common, **params).fit(X, y, sample_weight=weights)
        for cached in (True, False)
    }
    assert fits[True].kernel_cached_ and fits[True].kernel_cache_dtype_ == "float64"
    assert not fits[False].kernel_cached_ and fits[False].kernel_cache_dtype_ is None
    assert fits[True].n_epochs_ == fits[False].n_epochs_ > 1
    reference = fits[False].dual_coef_
    assert np.abs(fits[True].dual_coef_ - reference).max() <= 1e-8 * np.abs(reference).max()
    for epoch_cached, epoch_streamed in zip(fits[True].history_, fits[False].history_, strict=True):
        assert epoch_cached["train_loss"] == pytest.approx(epoch_streamed["train_loss"], rel=1e-8)


def test_float16_where_only_it_fits_fits_as_well_as_float32():
    X, y = _regression(2500, seed=4)
    X_test, y_test = _regression(1000, seed=5)
    common = {"bandwidth": 1.0, "alpha": 0.0, "batch_size": 128, "random_state": 0, "n_epochs": 8}
    # 55 MB: the fixed costs and fill blocks (about 37 MB) leave room for K(X, X) in
    # float16 (12.5 MB), not in float32 (25 MB).
    half = AdaptiveKernelRegressor(memory_budget="55MB", **common).fit(X, y)
    single = AdaptiveKernelRegressor(**common).fit(X, y)
    computed = AdaptiveKernelRegressor(cache_kernel=False, **common).fit(X, y)
    assert half.kernel_cache_dtype_ == "float16" and single.kernel_cache_dtype_ == "float32"
    assert half.score(X_test, y_test) == pytest.approx(single.score(X_test, y_test), abs=2e-3)
    assert single.score(X_test, y_test) == pytest.approx(computed.score(X_test, y_test), abs=1e-5)


def test_kernels_of_unknown_range_are_cached_in_the_training_dtype():
    X, y = _regression(400)
    kernel = CallableKernel(lambda A, B: torch.exp(-torch.cdist(A, B)))
    model = AdaptiveKernelRegressor(kernel=kernel, alpha=0.0, random_state=0, n_epochs=2).fit(X, y)
    assert model.kernel_cache_dtype_ == "float32"


def test_required_cache_that_does_not_fit_names_the_sizes():
    X, y = _regression(3000)
    with pytest.raises(ValueError, match=r"cache_kernel=True: K\(X, X\) for 3000 training rows needs 18000000"):
        AdaptiveKernelRegressor(
            feature_learning=None, cache_kernel=True, alpha=0.0, early_stopping=False, memory_budget="10MB"
        ).fit(X, y)


def _fit_in_fresh_process(n, budget):
    """Peak RSS growth of a cached (or not) fit, in a process of its own."""
    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, size=(n, 8)).astype(np.float32)
    y = np.sin(X.sum(1)).astype(np.float32)
    params = {"alpha": 0.0, "early_stopping": False, "memory_budget": budget, "batch_size": 256, "random_state": 0}
    # A first small fit loads torch's kernels and thread pools, which are not the fit's memory.
    AdaptiveKernelRegressor(feature_learning=None, n_epochs=1, **params).fit(X[:500], y[:500])
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # the peak RSS restarts from the current RSS
    before = status_bytes("VmRSS")
    model = AdaptiveKernelRegressor(feature_learning=None, n_epochs=2, **params).fit(X, y)
    return {"growth": status_bytes("VmHWM") - before, "cached": model.kernel_cache_dtype_}


@pytest.mark.slow
@pytest.mark.parametrize(("budget", "cached"), [(2.2e9, "float16"), (1.5e9, "float32")])
def test_peak_memory_of_a_fit_stays_within_its_budget(budget, cached):
    # 30000 rows: K(X, X) takes 1.8 GB in float16, which fits 2.2 GB next to the rest
    # and not 1.5 GB, where n_centers="auto" takes 2000 centers and CG stores their
    # K(X, Z) (240 MB in float32).  (At a few hundred MB, the allocator's own variation
    # of about 100 MB from run to run would decide the test.)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        result = pool.submit(_fit_in_fresh_process, 30_000, int(budget)).result(timeout=600)
    assert result["cached"] == cached
    assert result["growth"] <= budget, result


def test_a_cache_the_device_refuses_falls_back_to_computed_blocks(monkeypatch):
    from skgpu_kernel.operators import CachedOperator

    def refuse(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.48 GiB")

    X, y = _regression(800)
    params = {"bandwidth": 2.0, "alpha": 0.0, "dtype": "float64", "batch_size": 64, "random_state": 0, "n_epochs": 3}
    computed = AdaptiveKernelRegressor(cache_kernel=False, **params).fit(X, y)
    monkeypatch.setattr(CachedOperator, "fill", refuse)
    with pytest.warns(RuntimeWarning, match="did not fit the memory free"):
        model = AdaptiveKernelRegressor(**params).fit(X, y)
    assert not model.kernel_cached_ and model.kernel_cache_dtype_ is None
    np.testing.assert_array_equal(model.dual_coef_, computed.dual_coef_)


@pytest.mark.parametrize("symmetric", [True, False])
def test_filled_entries_counts_the_blocks_the_fill_evaluates(monkeypatch, symmetric):
    X = torch.randn(70, 3, dtype=torch.float64)
    kernel = Gaussian(bandwidth=1.0)
    evaluated = []
    block = kernel.prepared_block

    def counting(rows, centers, out=None):
        evaluated.append(rows.shape[0] * centers.shape[0])
        return block(rows, centers, out=out)

    monkeypatch.setattr(kernel, "prepared_block", counting)
    cache = _filled(kernel, X, X, torch.float64, 16, 24, symmetric)
    assert sum(evaluated) == filled_entries(70, 70, 16, symmetric)
    torch.testing.assert_close(cache, Gaussian(bandwidth=1.0)(X, X))


@pytest.mark.parametrize("cache_kernel", [True, False])
def test_verbose_reports_the_rates_of_the_fill_and_of_an_epoch(capsys, cache_kernel):
    rng = np.random.RandomState(0)
    X, y = rng.randn(600, 4), rng.randn(600)
    AdaptiveKernelRegressor(
        solver="eigenpro", alpha=0.0, bandwidth=1.0, n_epochs=3, cache_kernel=cache_kernel, verbose=1, random_state=0
    ).fit(X, y)
    out = capsys.readouterr().out
    assert ("kernel cached:" in out and "GFLOP/s" in out) is cache_kernel
    epoch = [line for line in out.splitlines() if "a typical epoch" in line]
    assert len(epoch) == 1
    assert ("GB/s" if cache_kernel else "of torch.mm's") in epoch[0]


def test_a_verbose_report_out_of_memory_leaves_the_fit_as_it_is(monkeypatch, capsys):
    # On an H200 with 2 GB allowed, timing torch.mm at the plan's blocks for the
    # report ran out of memory after the fit itself had halved its batch to fit.
    from skgpu_kernel.fit import operator as fit_operator

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.20 GiB.")

    rng = np.random.RandomState(0)
    X, y = rng.randn(600, 4), rng.randn(600)
    params = dict(solver="eigenpro", alpha=0.0, bandwidth=1.0, n_epochs=3, cache_kernel=False, random_state=0)
    quiet = AdaptiveKernelRegressor(**params).fit(X, y)
    monkeypatch.setattr(fit_operator, "matmul_gflops", out_of_memory)
    model = AdaptiveKernelRegressor(verbose=1, **params).fit(X, y)
    epoch = [line for line in capsys.readouterr().out.splitlines() if "a typical epoch" in line]
    assert len(epoch) == 1 and "torch.mm not timed at these blocks: out of memory" in epoch[0]
    np.testing.assert_array_equal(model.dual_coef_, quiet.dual_coef_)


@pytest.mark.parametrize("rows", [slice(None), slice(3, 41), slice(2, 40, 3)])
def test_whole_cache_products_read_views_in_pieces_where_a_batch_is_gathered(monkeypatch, rows):
    # As on CUDA (read_rows None): a slice of rows is read as views of at most
    # CUDA_READ_ENTRIES entries, never gathered into a copy of the cache.
    monkeypatch.setattr(operators.core, "CUDA_READ_ENTRIES", 64)
    values = torch.randn(50, 16, dtype=torch.float64)
    cache = CachedOperator(values.to(torch.float16), torch.float64)
    cache.read_rows = None
    gathers, gather = [], cache._pieces
    cache._pieces = lambda columns, indices: gathers.append(len(indices)) or gather(columns, indices)
    V = torch.randn(16, 3, dtype=torch.float64)
    expected = values.to(torch.float16).to(torch.float64)[rows] @ V
    torch.testing.assert_close(cache.matmul(V, rows=rows), expected, rtol=1e-12, atol=1e-12)
    assert gathers == ([] if rows.step is None else [13])


def _operator_problem(seed=0, m=301, n=157, d=4):
    rng = np.random.RandomState(seed)
    X = torch.as_tensor(rng.randn(m, d))
    Z = torch.as_tensor(rng.randn(n, d))
    V = torch.as_tensor(rng.randn(n, 3))
    kernel = Gaussian(bandwidth=1.5)
    return kernel, X, Z, V, kernel(X, Z) @ V


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("n_shards", [1, 3])
def test_sharded_operator_products_equal_the_whole_kernel_matrix(n_shards, cached):
    kernel, X, Z, V, expected = _operator_problem()
    shards = operators.CenterShards(kernel, Z, [torch.device("cpu")] * n_shards, column_block=40)
    if cached:
        shards.cache(X, row_block=64)
    operator = shards.cached if cached else shards.operator(X, row_block=64)
    assert operator.kind == "sharded" and operator.shape == (X.shape[0], Z.shape[0])
    torch.testing.assert_close(operator.matmul(V), expected, rtol=0, atol=1e-12)
    rows = torch.tensor([5, 6, 7, 100, 3])
    torch.testing.assert_close(operator.matmul(V, rows), expected[rows], rtol=0, atol=1e-12)
    block = operator.sharded_block(slice(10, 50))
    torch.testing.assert_close(block.matmul(V), expected[10:50], rtol=0, atol=1e-12)
    values = torch.as_tensor(np.random.RandomState(1).randn(40, 2))
    torch.testing.assert_close(block.transpose_matmul(values), kernel(Z, X[10:50]) @ values, rtol=0, atol=1e-12)
    torch.testing.assert_close(operator.block(slice(10, 50)), kernel(X[10:50], Z), rtol=0, atol=1e-12)
    assert operator.nbytes == (X.shape[0] * Z.shape[0] * 8 if cached else 0)
    # The cache is read where there is one, and evaluated from the rows otherwise: the same values.
    torch.testing.assert_close(
        shards.rows_block(X[10:50], slice(10, 50)).matmul(V), expected[10:50], atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("n_rows", [0, 1, 255, 256, 700])
def test_streamed_operator_equals_the_evaluated_products_whatever_the_rows_it_streams(n_rows):
    kernel, _, Z, V, _ = _operator_problem()
    X = np.random.RandomState(2).randn(n_rows, Z.shape[1])
    offset = torch.full((Z.shape[1],), 0.25, dtype=torch.float64)
    centers = kernel.prepare_centers(Z)
    blocks = OperatorBlocks(256, 64)

    def on_device(rows):
        return EvaluatedOperator(kernel, rows, centers, blocks)

    streamed = operators.StreamedOperator(X, on_device, Z.shape[0], 256, torch.device("cpu"), torch.float64, offset)
    assert streamed.kind == "streamed" and streamed.shape == (n_rows, Z.shape[0])
    scores = streamed.matmul(V)
    expected = kernel(torch.as_tensor(X) - offset, Z) @ V
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-12)
    if n_rows > 1:  # each row's score is the same whichever rows are streamed with it (blocks of one shape)
        alone = operators.StreamedOperator(
            X[1:2], on_device, Z.shape[0], 256, torch.device("cpu"), torch.float64, offset
        )
        assert torch.equal(alone.matmul(V), scores[1:2])
    with pytest.raises(NotImplementedError, match="all its rows"):
        streamed.matmul(V, rows=slice(0, 1))
