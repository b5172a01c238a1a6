"""Device planning: pure functions, testable on the CPU."""

import json
import random
import time

import pytest
import torch

from skgpu_kernel import device as device_module
from skgpu_kernel.device import (
    available_memory,
    batch_limit,
    column_block_size,
    cuda_int8_shape,
    default_memory_budget,
    parse_memory_budget,
    resolve_device,
    resolve_dtype,
    resolve_memory_budget,
    rows_within_budget,
    throughput_saturation_batch,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, None),
        (1024, 1024),
        ("4GB", 4 * 10**9),
        ("4 GiB", 4 * 2**30),
        ("1.5gb", 1_500_000_000),
        ("512MiB", 512 * 2**20),
        ("2048", 2048),
        ("10kb", 10_000),
    ],
)
def test_parse_memory_budget(spec, expected):
    assert parse_memory_budget(spec) == expected


@pytest.mark.parametrize("spec", ["lots", "4 GX", "-1GB", "", "GB", "1e400"])
def test_parse_memory_budget_rejects_unparsable(spec):
    with pytest.raises(ValueError, match="memory_budget"):
        parse_memory_budget(spec)


@pytest.mark.parametrize("spec", [0, -5])
def test_parse_memory_budget_rejects_non_positive(spec):
    with pytest.raises(ValueError, match="positive"):
        parse_memory_budget(spec)


@pytest.mark.parametrize("spec", [True, [1], 2.5j])
def test_parse_memory_budget_rejects_wrong_types(spec):
    with pytest.raises(TypeError, match="memory_budget"):
        parse_memory_budget(spec)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="Unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="Unsupported device"):
        resolve_device("meta")
    with pytest.raises(TypeError, match="device must be"):
        resolve_device(3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_resolve_device_without_cuda_names_the_problem():
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("float16")


def test_memory_budget_defaults_to_a_fraction_of_available_memory_rounded_down_to_a_power_of_two():
    cpu = torch.device("cpu")
    free = available_memory(cpu)
    assert free > 0
    budget = resolve_memory_budget(None, cpu)
    assert 0.25 * free < budget <= 0.5 * free
    assert resolve_memory_budget("1GB", cpu) == 10**9
    with pytest.warns(RuntimeWarning, match="exceeds the"):
        assert resolve_memory_budget(100 * free, cpu) == 100 * free


def test_the_default_budget_does_not_move_with_the_free_memory_within_an_octave():
    gib = 2**30
    budgets = {default_memory_budget(free, "cpu") for free in (16 * gib, 20 * gib, 23 * gib + 12345, 32 * gib - 1)}
    assert budgets == {8 * gib}
    assert default_memory_budget(15 * gib, "cpu") == 4 * gib
    assert default_memory_budget(20 * gib, "cuda") == int(0.8 * 16 * gib)
    assert default_memory_budget(0, "cpu") == 0


def test_rows_within_budget_and_batch_limit():
    assert rows_within_budget(1000, 200, 100) == 8
    assert rows_within_budget(100, 200, 100) == 1
    # 10 fixed bytes + 3 bytes per row + 1 byte per row squared
    assert batch_limit(10 + 3 * 20 + 20**2, 10, lambda m: 3 * m + m * m, max_batch=100) == 20
    assert batch_limit(10**9, 0, lambda m: m, max_batch=64) == 64
    assert batch_limit(0, 0, lambda m: m, max_batch=64) == 1


@pytest.mark.parametrize(
    ("shape", "padded"), [((5, 3), (24, 8)), ((17, 9), (24, 16)), ((24, 16), (24, 16)), ((1400, 56), (1400, 56))]
)
def test_cuda_int8_shape_pads_to_what_int_mm_takes_there(shape, padded):
    # More than 16 rows, columns a multiple of 8: what the grid pads to and the speed probe times on CUDA.
    assert cuda_int8_shape(*shape) == padded


def test_column_block_size_is_cache_sized_on_cpu_and_bounded_by_budget():
    cpu = torch.device("cpu")
    assert column_block_size(cpu, 256, 10**6, 4, 10**12) == 2048  # 2**19 entries
    assert column_block_size(cpu, 4096, 10**6, 4, 10**12) == 512  # at least 512 columns
    assert column_block_size(cpu, 256, 500, 4, 10**12) == 500
    assert column_block_size(cpu, 256, 10**6, 4, 256 * 4 * 300) == 300


@pytest.fixture
def probe_store(monkeypatch, tmp_path):
    """A fresh per-machine probe store in ``tmp_path`` and an empty in-process cache."""
    monkeypatch.setenv("SKGPU_KERNEL_PROBE_DIR", str(tmp_path))
    monkeypatch.setattr(device_module, "_CAPACITY_CACHE", {})
    return tmp_path / "throughput_probes.json"


def test_throughput_probe_finds_the_saturation_point(probe_store):
    # A device that costs a fixed 10 ms per call up to 256 rows and is linear beyond:
    # samples per second grow until 256 and stay flat after.  (Long enough sleeps
    # that scheduling noise on a busy machine stays well below the 10% criterion.)
    calls = []

    def run_batch(size):
        calls.append(size)
        time.sleep(0.01 * max(size, 256) / 256)

    batch, throughputs = throughput_saturation_batch(run_batch, 4096, torch.device("cpu"), cache_key="fake")
    assert batch == 256
    assert max(throughputs) < 4096, "the probe stops once throughput stops growing"
    n_calls = len(calls)
    again, _ = throughput_saturation_batch(run_batch, 4096, torch.device("cpu"), cache_key="fake")
    assert again == 256 and len(calls) == n_calls, "the result is cached per key"


def test_throughput_probe_small_problem_skips_measuring():
    batch, throughputs = throughput_saturation_batch(lambda m: None, 20, torch.device("cpu"))
    assert batch == 20 and throughputs == {}


def _noisy_device(calls, seed):
    """A fake device whose timings carry up to 30% noise: enough to move the choice between sizes."""
    noise = random.Random(seed)

    def run_batch(size):
        calls.append(size)
        time.sleep(0.002 * max(size, 128) / 128 * (1 + 0.3 * noise.random()))

    return run_batch


def test_throughput_probe_is_measured_once_per_machine(probe_store, monkeypatch):
    cpu = torch.device("cpu")
    first_calls, later_calls = [], []
    first = throughput_saturation_batch(_noisy_device(first_calls, 0), 2048, cpu, cache_key=("op", 3))
    stored = json.loads(probe_store.read_text())
    assert len(stored) == 1 and next(iter(stored.values()))["ceiling"] == 2048
    # A new process (empty in-process cache), on a machine with other timings, reads
    # the stored measurement: same choice, nothing timed.
    for seed in range(1, 4):
        monkeypatch.setattr(device_module, "_CAPACITY_CACHE", {})
        again = throughput_saturation_batch(_noisy_device(later_calls, seed), 2048, cpu, cache_key=("op", 3))
        assert again == first
    assert first_calls and not later_calls
    # A smaller ceiling is answered from the same record; a larger one measures again.
    batch, throughputs = throughput_saturation_batch(_noisy_device(later_calls, 5), 100, cpu, cache_key=("op", 3))
    assert not later_calls and max(throughputs) <= 100 and batch <= 100
    throughput_saturation_batch(_noisy_device(later_calls, 6), 4096, cpu, cache_key=("op", 3))
    assert later_calls
    assert next(iter(json.loads(probe_store.read_text()).values()))["ceiling"] == 4096


def test_throughput_probe_store_can_be_switched_off_and_survives_corruption(probe_store, monkeypatch):
    cpu = torch.device("cpu")
    probe_store.write_text("{not json")
    calls = []
    throughput_saturation_batch(_noisy_device(calls, 0), 256, cpu, cache_key="op")
    assert calls and len(json.loads(probe_store.read_text())) == 1, "a corrupt store is replaced"
    monkeypatch.setenv("SKGPU_KERNEL_PROBE_DIR", "")
    monkeypatch.setattr(device_module, "_CAPACITY_CACHE", {})
    calls.clear()
    throughput_saturation_batch(_noisy_device(calls, 1), 256, cpu, cache_key="op")
    assert calls, "without a store every process measures for itself"
