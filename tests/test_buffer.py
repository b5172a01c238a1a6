import gc
import hashlib
import os
import sys
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from skgpu_kernel.buffer import BufferPrefetcher, default_chunk_size, plan_pass
from skgpu_kernel.row_sources import RowSource, as_row_source

CPU = torch.device("cpu")


def _prefetch_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("skgpu_kernel-prefetch")]


def _wait_no_threads(timeout=5.0):
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _prefetch_threads()


def _run_with_timeout(function, timeout=20.0):
    """Run ``function`` in a thread; fail instead of hanging the test suite."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=target, daemon=True)
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), f"the consumer hung for more than {timeout} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _rows(plan, buffer_index):
    return np.concatenate([np.arange(start, stop) for start, stop in plan[buffer_index]])


def _sha256(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _mapped_or_open(path):
    """Whether this process maps ``path`` or holds a descriptor on it (Linux)."""
    path = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        if any(line.rstrip("\n").endswith(path) for line in maps):
            return True
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                return True
        except OSError:
            pass
    return False


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc/self")


class SlicedDataset:
    """h5py/zarr-like stand-in: a shape, a dtype and row slicing, nothing else."""

    def __init__(self, array, delay=0.0, fail_rows=None):
        self._array, self.delay, self.fail_rows = array, delay, fail_rows
        self.shape, self.dtype = array.shape, array.dtype
        self.requests = []

    def __getitem__(self, key):
        assert isinstance(key, slice), "only row slices are allowed"
        self.requests.append((key.start, key.stop))
        if self.fail_rows is not None and key.start < self.fail_rows[1] and key.stop > self.fail_rows[0]:
            raise OSError("disk on fire")
        if self.delay:
            time.sleep(self.delay)
        return self._array[key].tolist()


# ---------------------------------------------------------------------------- sources


def test_ndarray_source_reads_copies_in_range_order(rng):
    X = rng.randn(12, 3)
    source = as_row_source(X)
    assert isinstance(source, RowSource)
    assert (source.shape, source.n_rows, source.dtype, source.is_sparse, source.path) == (
        (12, 3),
        12,
        X.dtype,
        False,
        None,
    )
    rows = source.read([(8, 12), (0, 2)])
    np.testing.assert_array_equal(rows, X[[8, 9, 10, 11, 0, 1]])
    assert rows.flags.c_contiguous and not np.shares_memory(rows, X)
    assert as_row_source(source) is source
    assert as_row_source([[1, 2], [3, 4]]).shape == (2, 2)
    one_d = as_row_source(np.arange(5, dtype=np.int32), name="y")
    np.testing.assert_array_equal(one_d.read([(3, 5)]), [3, 4])


def test_read_into_fills_a_prefix(rng):
    X = rng.randn(10, 2).astype(np.float32)
    source = as_row_source(X)
    out = np.full((8, 2), -1.0)
    assert source.read_into([(6, 10), (0, 1)], out) == 5
    np.testing.assert_array_equal(out[:5], X[[6, 7, 8, 9, 0]])
    np.testing.assert_array_equal(out[5:], -1.0)
    with pytest.raises(ValueError, match="cannot hold"):
        source.read_into([(0, 9)], out)
    with pytest.raises(ValueError, match="outside"):
        source.read([(5, 11)])


def test_memmap_source_is_watched_and_not_closed(tmp_path, rng):
    X = rng.randn(20, 4)
    path = tmp_path / "X.npy"
    np.save(path, X)
    user_map = np.load(path, mmap_mode="r")
    source = as_row_source(user_map[5:])
    assert source.path == str(path) and source.shape == (15, 4)
    np.testing.assert_array_equal(source.read([(0, 3)]), X[5:8])
    source.check_alive()
    source.close()
    # The user's own memory map is left alone.
    np.testing.assert_array_equal(user_map[:2], X[:2])
    with pytest.raises(ValueError, match="closed"):
        source.read([(0, 1)])


@linux_only
def test_npy_path_source_opens_read_only_and_closes(tmp_path, rng):
    X = rng.randn(30, 5).astype(np.float32)
    path = tmp_path / "X.npy"
    np.save(path, X)
    for spec in (path, str(path)):
        source = as_row_source(spec, name="X_train")
        assert source.path == str(path) and source.dtype == np.float32
        np.testing.assert_array_equal(source.read([(10, 12), (0, 1)]), X[[10, 11, 0]])
        assert not source._data.flags.writeable
        assert _mapped_or_open(path)
        source.close()
        source.close()
        assert not _mapped_or_open(path)


def test_lazy_source_reads_only_requested_slices(rng):
    X = rng.randn(9, 2)
    dataset = SlicedDataset(X)
    source = as_row_source(dataset)
    assert source.shape == (9, 2) and source.dtype == X.dtype and source.path is None
    np.testing.assert_array_equal(source.read([(7, 9), (2, 4)]), X[[7, 8, 2, 3]])
    assert dataset.requests == [(7, 9), (2, 4)]


def test_sparse_source(rng):
    dense = rng.randn(10, 6) * (rng.rand(10, 6) < 0.3)
    csr = sp.csr_matrix(dense)
    source = as_row_source(csr)
    assert source.is_sparse and source._data is csr
    rows = source.read([(6, 10), (0, 2)])
    assert sp.issparse(rows) and rows.format == "csr"
    np.testing.assert_array_equal(rows.toarray(), dense[[6, 7, 8, 9, 0, 1]])
    full = source.read([(0, 10)])
    assert not np.may_share_memory(full.data, csr.data)
    np.testing.assert_array_equal(as_row_source(sp.coo_matrix(dense)).read([(3, 5)]).toarray(), dense[3:5])
    with pytest.raises(TypeError, match="dense"):
        source.read_into([(0, 1)], np.zeros((1, 6)))


def test_bad_sources(tmp_path):
    with pytest.raises(TypeError, match=r"X_train.*generator"):
        as_row_source((i for i in range(3)), name="X_train")
    with pytest.raises(TypeError, match="dict"):
        as_row_source({"a": 1})
    missing = tmp_path / "missing.npy"
    with pytest.raises(FileNotFoundError, match=r"missing\.npy"):
        as_row_source(missing)
    text = tmp_path / "data.csv"
    text.write_text("1,2\n3,4\n")
    with pytest.raises(ValueError, match=r"not a \.npy"):
        as_row_source(text)
    with pytest.raises(ValueError, match="object"):
        as_row_source(np.array([{}, {}], dtype=object))
    with pytest.raises(ValueError, match="numbers"):
        as_row_source(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        as_row_source(np.zeros((2, 2, 2)))
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"objects\.npy"):
        as_row_source(pickled)


# ---------------------------------------------------------------------------- plans


@pytest.mark.parametrize(("n_rows", "buffer_size", "chunk_size"), [(100, 32, 5), (97, 10, 10), (50, 64, 7), (7, 1, 3)])
def test_plan_covers_each_row_once(n_rows, buffer_size, chunk_size):
    plan = plan_pass(n_rows, buffer_size, chunk_size, np.random.RandomState(0))
    rows = np.concatenate([_rows(plan, k) for k in range(len(plan))])
    np.testing.assert_array_equal(np.sort(rows), np.arange(n_rows))
    sizes = [len(_rows(plan, k)) for k in range(len(plan))]
    assert sizes[:-1] == [buffer_size] * (len(plan) - 1)
    assert 0 < sizes[-1] <= buffer_size
    assert len(plan) == -(-n_rows // buffer_size)
    # Ranges never cross a chunk boundary.
    assert all(start // chunk_size == (stop - 1) // chunk_size for ranges in plan for start, stop in ranges)


def test_plan_is_seeded_and_shuffles_chunk_order():
    first = plan_pass(200, 40, 10, np.random.RandomState(3))
    assert first == plan_pass(200, 40, 10, np.random.RandomState(3))
    assert first != plan_pass(200, 40, 10, np.random.RandomState(4))
    rows = np.concatenate([_rows(first, k) for k in range(len(first))])
    assert not np.array_equal(rows, np.arange(200))
    ordered = plan_pass(200, 40, 10, rng=None, shuffle=False)
    np.testing.assert_array_equal(np.concatenate([_rows(ordered, k) for k in range(5)]), np.arange(200))
    assert plan_pass(0, 40, 10, np.random.RandomState(0)) == []
    with pytest.raises(TypeError, match="RandomState"):
        plan_pass(10, 4, 2, rng=None)
    with pytest.raises(ValueError, match="positive"):
        plan_pass(10, 0, 2, rng=None, shuffle=False)


def test_default_chunk_size():
    assert default_chunk_size(1600, 10**6) == 100
    assert default_chunk_size(1600, 160) == 10  # whole data in one buffer: a sixteenth of it
    assert default_chunk_size(1, 10) == 1
    assert default_chunk_size(100, 10**9) == 100  # never more than a buffer
    assert default_chunk_size(10**6, 10**10) == 152588  # at most 65536 chunks per pass
    with pytest.raises(ValueError):
        default_chunk_size(0, 10)


# ---------------------------------------------------------------------------- prefetcher


def _collect(prefetcher):
    # On the CPU a yielded tensor can be a staging buffer, valid until the next step.
    with prefetcher:
        return [tuple(t.clone() for t in tensors) for tensors in prefetcher]


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetcher_yields_plan_rows_with_dtypes(prefetch, rng):
    X = rng.randn(53, 4).astype(np.float32)
    y = rng.randint(0, 3, 53)
    weights = rng.rand(53)
    plan = plan_pass(53, 16, 5, np.random.RandomState(1))
    sources = [as_row_source(X), as_row_source(y, name="y"), as_row_source(weights, name="sample_weight")]
    dtypes = [torch.float64, torch.int64, torch.float32]
    prefetcher = BufferPrefetcher(sources, plan, CPU, dtypes, prefetch=prefetch)
    assert prefetcher.n_buffers == 4
    buffers = _collect(prefetcher)
    assert len(buffers) == 4
    for k, (Xb, yb, wb) in enumerate(buffers):
        rows = _rows(plan, k)
        assert (Xb.dtype, yb.dtype, wb.dtype) == (torch.float64, torch.int64, torch.float32)
        assert Xb.shape == (len(rows), 4) and yb.shape == (len(rows),)
        np.testing.assert_array_equal(Xb.numpy(), X[rows].astype(np.float64))
        np.testing.assert_array_equal(yb.numpy(), y[rows])
        np.testing.assert_array_equal(wb.numpy(), weights[rows].astype(np.float32))
    assert prefetcher.read_seconds > 0
    assert not _wait_no_threads()


def test_prefetch_on_and_off_are_bitwise_equal(rng):
    X = rng.randn(40, 3)
    dense = rng.randn(40, 7) * (rng.rand(40, 7) < 0.4)
    y = rng.randint(0, 2, 40).astype(np.int32)
    plan = plan_pass(40, 12, 3, np.random.RandomState(0))
    runs = []
    for prefetch in (True, False):
        sources = [as_row_source(X), as_row_source(sp.csr_matrix(dense)), as_row_source(y)]
        dtypes = [torch.float64, torch.float32, torch.int64]
        runs.append(_collect(BufferPrefetcher(sources, plan, CPU, dtypes, prefetch=prefetch)))
    assert len(runs[0]) == len(runs[1]) == 4
    for with_prefetch, without in zip(*runs, strict=True):
        for a, b in zip(with_prefetch, without, strict=True):
            assert a.dtype == b.dtype and a.layout == b.layout
            if a.is_sparse:
                assert a.is_coalesced() and b.is_coalesced()
                assert torch.equal(a.indices(), b.indices()) and torch.equal(a.values(), b.values())
            else:
                assert torch.equal(a, b)
    for k, (_, Sb, _) in enumerate(runs[0]):
        assert Sb.is_sparse and Sb.shape == (len(_rows(plan, k)), 7)
        np.testing.assert_array_equal(Sb.to_dense().numpy(), dense[_rows(plan, k)].astype(np.float32))


def test_source_is_never_written(tmp_path, rng):
    X = rng.randn(64, 3)
    path = tmp_path / "X.npy"
    np.save(path, X)
    digest, mtime = _sha256(path), os.stat(path).st_mtime_ns
    in_memory = X.copy()
    plan = plan_pass(64, 20, 4, np.random.RandomState(0))
    for source_data in (path, in_memory):
        source = as_row_source(source_data)
        with BufferPrefetcher([source], plan, CPU, [torch.float64]) as prefetcher:
            for (Xb,) in prefetcher:
                Xb.mul_(0.0).add_(7.0)  # a consumer working in place must not reach the source
        source.close()
    assert _sha256(path) == digest and os.stat(path).st_mtime_ns == mtime
    np.testing.assert_array_equal(in_memory, X)


def test_reader_error_reaches_consumer_promptly(rng):
    X = rng.randn(40, 2)
    plan = plan_pass(40, 10, 10, rng=None, shuffle=False)
    for prefetch in (True, False):
        dataset = SlicedDataset(X, fail_rows=(10, 20))  # buffer 2 of 4
        sources = [as_row_source(np.arange(40)), as_row_source(dataset, name="X_h5")]
        prefetcher = BufferPrefetcher(sources, plan, CPU, [torch.int64, torch.float32], prefetch=prefetch)
        seen = []

        def consume(prefetcher=prefetcher, seen=seen):
            for tensors in prefetcher:
                seen.append(tensors[0][0].item())

        tic = time.monotonic()
        with pytest.raises(RuntimeError, match=r"'X_h5' for buffer 2 of 4.*disk on fire") as info:
            _run_with_timeout(consume)
        assert time.monotonic() - tic < 5.0
        assert isinstance(info.value.__cause__, OSError)
        assert seen == [0]
        assert not _wait_no_threads(), "a worker thread survived the error"
        with pytest.raises(StopIteration):
            next(prefetcher)


@pytest.mark.parametrize("prefetch", [True, False])
def test_truncated_memmap_gives_an_error_not_a_crash(tmp_path, rng, prefetch):
    X = rng.randn(256, 8)  # 64 rows = 4096 bytes per buffer
    path = tmp_path / "train.npy"
    np.save(path, X)
    source = as_row_source(path)
    offset = os.path.getsize(path) - X.nbytes
    plan = plan_pass(256, 64, 64, rng=None, shuffle=False)
    prefetcher = BufferPrefetcher([source], plan, CPU, [torch.float64], prefetch=prefetch)

    def consume():
        for k, (Xb,) in enumerate(prefetcher):
            np.testing.assert_array_equal(Xb.numpy(), X[64 * k : 64 * (k + 1)])
            if k == 0:
                # Keeps the two buffers the worker may be reading: no page it touches goes missing.
                os.truncate(path, offset + 2 * 64 * 8 * 8)

    with pytest.raises(RuntimeError, match="shrank") as info:
        _run_with_timeout(consume)
    assert str(path) in str(info.value)
    assert not _wait_no_threads()
    with pytest.raises(OSError, match="shrank"):
        source.check_alive()
    source.close()


def test_deleted_or_replaced_file_gives_an_error(tmp_path, rng):
    X = rng.randn(60, 2)
    path = tmp_path / "gone.npy"
    np.save(path, X)
    source = as_row_source(path)
    plan = plan_pass(60, 10, 10, rng=None, shuffle=False)
    prefetcher = BufferPrefetcher([source], plan, CPU, [torch.float64])

    def consume():
        for k, _ in enumerate(prefetcher):
            if k == 0:
                os.remove(path)

    with pytest.raises(RuntimeError, match="deleted") as info:
        _run_with_timeout(consume)
    assert str(path) in str(info.value) and isinstance(info.value.__cause__, FileNotFoundError)
    source.close()
    np.save(path, X)
    source = as_row_source(path)
    os.replace(source.path, tmp_path / "moved.npy")
    np.save(path, X)
    with pytest.raises(OSError, match="replaced"):
        source.read([(0, 1)])
    source.close()
    assert not _wait_no_threads()


def test_leaving_early_stops_the_worker(rng):
    X = rng.randn(100, 3)
    plan = plan_pass(100, 10, 5, np.random.RandomState(0))

    prefetcher = BufferPrefetcher([as_row_source(X)], plan, CPU, [torch.float64])
    for k, _ in enumerate(prefetcher):
        if k == 2:
            break
    assert _prefetch_threads()
    prefetcher.close()
    prefetcher.close()
    assert not _prefetch_threads()
    with pytest.raises(StopIteration):
        next(prefetcher)

    with pytest.raises(KeyError, match="training failed"):
        with BufferPrefetcher([as_row_source(X)], plan, CPU, [torch.float64]) as prefetcher:
            for _ in prefetcher:
                raise KeyError("training failed")
    assert not _prefetch_threads()

    # Dropped without close: the finalizer stops the thread.
    prefetcher = BufferPrefetcher([as_row_source(X)], plan, CPU, [torch.float64])
    next(iter(prefetcher))
    del prefetcher
    gc.collect()
    assert not _wait_no_threads()


def test_prefetch_hides_io_wait(rng):
    X = rng.randn(5, 2)
    plan = plan_pass(5, 1, 1, rng=None, shuffle=False)
    delay = 0.06
    waits = {}
    for prefetch in (True, False):
        source = as_row_source(SlicedDataset(X, delay=delay))
        with BufferPrefetcher([source], plan, CPU, [torch.float64], prefetch=prefetch) as prefetcher:
            for _ in prefetcher:
                time.sleep(delay)  # "training" on the buffer
        waits[prefetch] = prefetcher.io_wait_seconds
    assert waits[False] >= 5 * delay * 0.9
    # Only the first read is exposed with prefetch (about a fifth); allow for a busy machine.
    assert waits[True] < 0.6 * waits[False], waits


def test_prefetcher_validates_inputs(rng):
    X = as_row_source(rng.randn(10, 2))
    with pytest.raises(ValueError, match="same number of rows"):
        BufferPrefetcher([X, as_row_source(np.zeros(9))], [[(0, 9)]], CPU, [torch.float32, torch.float32])
    with pytest.raises(ValueError, match="one dtype per source"):
        BufferPrefetcher([X], [[(0, 10)]], CPU, [])
    with pytest.raises(ValueError, match="outside"):
        BufferPrefetcher([X], [[(0, 11)]], CPU, [torch.float32])
    with pytest.raises(TypeError, match="RowSource"):
        BufferPrefetcher([np.zeros((10, 2))], [[(0, 10)]], CPU, [torch.float32])
    assert list(BufferPrefetcher([X], [], CPU, [torch.float32])) == []
    assert not _prefetch_threads()


@pytest.mark.gpu
def test_cuda_side_stream_matches_cpu(rng):
    X = rng.randn(70, 5).astype(np.float32)
    dense = rng.randn(70, 6) * (rng.rand(70, 6) < 0.3)
    y = rng.randint(0, 4, 70)
    plan = plan_pass(70, 16, 4, np.random.RandomState(2))
    dtypes = [torch.float64, torch.float32, torch.int64]
    results = {}
    for device in (torch.device("cuda"), CPU):
        sources = [as_row_source(X), as_row_source(sp.csr_matrix(dense)), as_row_source(y)]
        prefetcher = BufferPrefetcher(sources, plan, device, dtypes)
        collected = []
        with prefetcher:
            for tensors in prefetcher:
                assert all(t.device.type == device.type for t in tensors)
                if device.type == "cuda":
                    assert prefetcher._pipeline.staging[0][0].is_pinned()
                # Work on the consumer's stream right away: the event wait must order it after the copy.
                collected.append(tuple((t.to_dense() if t.is_sparse else t).mul(1).cpu() for t in tensors))
        results[device.type] = collected
    for on_gpu, on_cpu in zip(results["cuda"], results["cpu"], strict=True):
        for a, b in zip(on_gpu, on_cpu, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert not _wait_no_threads()
