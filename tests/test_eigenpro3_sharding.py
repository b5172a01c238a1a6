"""EigenPro 3 with its centers sharded (devices of one process, torch.distributed ranks)
and with memory-mapped training data streamed through the buffer module."""

import hashlib
import socket
import warnings

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.operators import shard_bounds

BANDWIDTH = 2.0
# Fixed epochs on all the data: these tests compare layouts of the same iteration.
PARAMS = dict(
    bandwidth=BANDWIDTH,
    n_centers=301,
    feature_learning=None,  # these fits compare layouts of one iteration
    n_epochs=2,
    batch_size=100,
    early_stopping=False,
    solver="eigenpro",
    dtype="float64",
    random_state=0,
)


def _problem(seed=0, n=2000, d=5):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X @ rng.randn(d)) + 0.1 * rng.randn(n)
    return X, y, rng.randn(300, d)


def test_shard_bounds_cover_the_centers_in_near_equal_parts():
    assert shard_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert shard_bounds(2, 3) == [(0, 1), (1, 1), (1, 2)]


@pytest.mark.parametrize("projection", ["exact", "iterative"])
@pytest.mark.parametrize("cache_kernel", [True, False])
def test_centers_sharded_over_devices_give_the_single_device_model(projection, cache_kernel):
    X, y, X_test = _problem()
    params = dict(PARAMS, projection=projection, cache_kernel=cache_kernel)
    single = AdaptiveKernelRegressor(device="cpu", **params).fit(X, y)
    # Three "devices" on the CPU exercise the same code as three GPUs: each shard's
    # kernel columns are computed on its device and the partial products summed.
    sharded = AdaptiveKernelRegressor(device=["cpu", "cpu", "cpu"], **params).fit(X, y)
    assert sharded.device_ == ["cpu", "cpu", "cpu"] and single.device_ == "cpu"
    scale = np.abs(single.predict(X_test)).max()
    np.testing.assert_allclose(sharded.predict(X_test), single.predict(X_test), rtol=0, atol=1e-10 * scale)


def test_a_list_of_devices_needs_centers():
    X, y, _ = _problem(n=200)
    with pytest.raises(ValueError, match="shards the centers of EigenPro 3: set n_centers"):
        AdaptiveKernelRegressor(device=["cpu", "cpu"]).fit(X, y)
    with pytest.raises(ValueError, match="empty list"):
        AdaptiveKernelRegressor(device=[], n_centers=10).fit(X, y)


def test_distributed_without_a_process_group_is_named():
    X, y, _ = _problem(n=200)
    with pytest.raises(ValueError, match="none is initialised"):
        AdaptiveKernelRegressor(n_centers=20, distributed=True).fit(X, y)


def _ranked_fit(rank, port, X, y, X_test, params, queue):
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        model = AdaptiveKernelRegressor(distributed=True, **params).fit(X, y)
        queue.put((rank, model.predict(X_test), model.n_projections_))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("projection", ["exact", "iterative"])
def test_two_gloo_ranks_sharding_the_centers_give_the_single_process_model(projection):
    X, y, X_test = _problem(seed=1)
    params = dict(PARAMS, projection=projection, cache_kernel=False)
    single = AdaptiveKernelRegressor(**params).fit(X, y)
    context = torch_mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_ranked_fit, args=(rank, port, X, y, X_test, params, queue)) for rank in range(2)
    ]
    for process in processes:
        process.start()
    results = sorted((queue.get(timeout=300) for _ in processes), key=lambda result: result[0])
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0, 0]
    expected = single.predict(X_test)
    for rank, predictions, n_projections in results:
        assert n_projections == single.n_projections_, rank
        np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def _memmap(tmp_path, X):
    path = tmp_path / "X.npy"
    np.save(path, X)
    return path, np.load(path, mmap_mode="r")


def test_memory_mapped_data_is_streamed_and_left_untouched(tmp_path):
    X, _, _ = _problem(seed=2, n=6000)
    y = np.sin(X[:, 0]) + np.cos(X[:, 1]) + 0.1 * np.random.RandomState(2).randn(X.shape[0])
    path, mapped = _memmap(tmp_path, X)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    # X takes 6000 * 7 * 8 = 336 kB, more than half of this budget: it is streamed.
    params = dict(PARAMS, n_centers=100, memory_budget="620kB", n_epochs=3)
    streamed = AdaptiveKernelRegressor(**params).fit(mapped, y)
    assert streamed.streamed_ and not streamed.kernel_cached_
    in_memory = AdaptiveKernelRegressor(**dict(params, memory_budget=None)).fit(X, y)
    assert not in_memory.streamed_
    np.testing.assert_array_equal(streamed.centers_, in_memory.centers_)
    # Streaming visits the rows in another order (shuffled chunks of buffers), so the
    # models are not equal; both fit the data as well.
    assert streamed.score(X, y) == pytest.approx(in_memory.score(X, y), abs=0.02)
    assert streamed.score(X, y) > 0.9
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_streamed_fit_refuses_early_stopping(tmp_path):
    X, y, _ = _problem(seed=2, n=6000)
    _, mapped = _memmap(tmp_path, X)
    model = AdaptiveKernelRegressor(**dict(PARAMS, n_centers=100, memory_budget="620kB", early_stopping=True))
    with pytest.raises(ValueError, match="early_stopping needs a held-out split"):
        model.fit(mapped, y)


def test_streamed_classifier_with_sample_weight(tmp_path):
    X, _, _ = _problem(seed=3, n=6000)
    labels = (X[:, 0] > 0).astype(int)
    _, mapped = _memmap(tmp_path, X)
    weights = np.where(labels == 1, 2.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model = AdaptiveKernelClassifier(**dict(PARAMS, n_centers=100, memory_budget="620kB"))
        model.fit(mapped, labels, sample_weight=weights)
    assert model.streamed_ and model.score(X, labels) > 0.9
