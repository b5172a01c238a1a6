"""Device planning: which device, how much memory, how large a batch and a block.

Nothing here knows a kernel formula.  Memory plans come from a linear model of
bytes per row (as in Falkon's block-size helpers); the batch capacity also uses a
short measured throughput probe supplied by the caller as a function of the batch
size, so that the capacity reflects the actual device and operation.
"""

import math
import os
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ._probe_store import device_identity, locked_probe_store
from ._warnings import warn_user

__all__ = [
    "ProbeSettings",
    "SaturationBatch",
    "available_memory",
    "batch_limit",
    "column_block_size",
    "cuda_int8_shape",
    "default_memory_budget",
    "exact_gram_row_block",
    "integer_matmul_speedup",
    "is_out_of_memory",
    "matmul_gflops",
    "parse_memory_budget",
    "prediction_device",
    "resolve_device",
    "resolve_dtype",
    "resolve_memory_budget",
    "round_up_multiple",
    "rows_within_budget",
    "synchronize",
    "throughput_saturation_batch",
]

# Fraction of the free memory, rounded down to a power of two, used when no budget is
# given.  The host keeps more in reserve because the caller's numpy copies and the
# Python process live there too.
_DEFAULT_BUDGET_FRACTION = {"cuda": 0.8, "cpu": 0.5}

# On a CPU, blocks of about this many entries stay in the last-level cache, which
# keeps the element-wise kernel passes from being memory bound.
_CPU_BLOCK_ENTRIES = 2**19

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def resolve_device(spec):
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` into a device.

    ``"auto"`` is CUDA when available, else the CPU.  A CUDA device that is not
    available raises ``ValueError``.
    """
    if isinstance(spec, torch.device):
        device = spec
    elif isinstance(spec, str):
        if spec == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(spec)
        except RuntimeError as exc:
            raise ValueError(f"Unknown device {spec!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'.") from exc
    else:
        raise TypeError(f"device must be a string or torch.device, got {type(spec).__name__}.")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"Unsupported device {spec!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'.")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={spec!r} was requested but CUDA is not available.")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={spec!r} was requested but only {torch.cuda.device_count()} CUDA device(s) are visible."
            )
        device = torch.device("cuda", index)
    return device


def prediction_device(spec):
    """The device to predict on: ``spec`` when available here, else the CPU with a warning.

    A model trained on CUDA and loaded on a machine without it still predicts.
    """
    try:
        return resolve_device(spec)
    except ValueError:
        warn_user(f"device={spec!r} is not available here; predicting on the CPU.", RuntimeWarning)
        return torch.device("cpu")


def resolve_dtype(spec):
    """Turn ``"float32"``/``"float64"`` (or numpy/torch equivalents) into a torch dtype."""
    names = {"float32": torch.float32, "float64": torch.float64}
    key = spec if isinstance(spec, str) else getattr(spec, "name", None) or str(spec).replace("torch.", "")
    if key not in names:
        raise ValueError(f"dtype must be 'float32' or 'float64', got {spec!r}.")
    return names[key]


def parse_memory_budget(spec):
    """Parse a memory budget into bytes.

    Parameters
    ----------
    spec : None, int or str
        ``None`` (no explicit budget), a positive number of bytes, or a string such as
        ``"4GB"``, ``"512 MiB"`` or ``"1.5g"``.  Decimal units (KB, MB, GB, TB) are
        powers of 1000, binary units (KiB, MiB, GiB, TiB) powers of 1024.

    Returns
    -------
    int or None
    """
    if spec is None:
        return None
    if isinstance(spec, bool):
        raise TypeError(f"memory_budget must be None, a number of bytes or a string like '4GB', got {spec!r}.")
    if isinstance(spec, (int, float)):
        value = spec
    elif isinstance(spec, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", spec)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"Cannot parse memory_budget {spec!r}; use a number of bytes or a string "
                "like '4GB', '512MiB' or '1.5GB'."
            )
        value = float(match.group(1)) * _UNITS[unit]
    else:
        raise TypeError(
            f"memory_budget must be None, a number of bytes or a string like '4GB', got {type(spec).__name__}."
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"memory_budget must be positive, got {spec!r}.")
    return int(value)


def _host_available_memory():
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 4 * 2**30
    # A container's cgroup limit can be far below the host's free memory.
    try:
        with open("/sys/fs/cgroup/memory.max") as limit_file:
            limit = limit_file.read().strip()
        with open("/sys/fs/cgroup/memory.current") as current_file:
            current = int(current_file.read().strip())
        if limit != "max":
            available = min(available, int(limit) - current)
    except (OSError, ValueError):
        pass
    return max(int(available), 0)


def available_memory(device):
    """Bytes that could be allocated on ``device`` now.

    On CUDA: free device memory plus what torch's caching allocator holds but does
    not use.  On the CPU: the host's available memory (``MemAvailable``), bounded by
    the container's cgroup limit.
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached_unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached_unused)
    return _host_available_memory()


def default_memory_budget(free, device_type):
    """The budget without a given one: a fraction of ``free`` bytes rounded down to a power of two.

    The budget sizes blocks (their summation order), caches and batches, so a
    budget that followed the free memory byte by byte would make the model depend
    on what else the machine held when the fit started.  Rounded down to a power of
    two, it is the same for every fit while the free memory stays within one
    octave (on a 24 GiB host with 23 GiB free: 8 GiB while 16 to 32 GiB are free),
    and never more than the fraction of what is free.  Half of it on a CPU, 80% on
    CUDA.

    Parameters
    ----------
    free : int
        Bytes free on the device (:func:`available_memory`).
    device_type : {"cpu", "cuda"}

    Returns
    -------
    int
    """
    octave = 2 ** (max(int(free), 1).bit_length() - 1)
    return int(_DEFAULT_BUDGET_FRACTION[device_type] * octave)


def resolve_memory_budget(spec, device):
    """Bytes the estimator may use on ``device``: the given budget, or :func:`default_memory_budget`.

    An explicit budget above the memory free on the device is kept (the caller may
    know better, e.g. about memory about to be released) but warned about.
    """
    budget = parse_memory_budget(spec)
    free = available_memory(device)
    if budget is None:
        return default_memory_budget(free, device.type)
    if budget > free:
        warn_user(
            f"memory_budget of {budget / 1e9:.2f} GB exceeds the {free / 1e9:.2f} GB free on {device}; "
            "blocks planned for it may not fit.",
            RuntimeWarning,
        )
    return budget


def rows_within_budget(budget, fixed_bytes, bytes_per_row):
    """Largest number of rows with ``fixed_bytes + rows * bytes_per_row <= budget`` (at least 1)."""
    if bytes_per_row <= 0:
        raise ValueError("bytes_per_row must be positive.")
    return max(int((budget - fixed_bytes) // bytes_per_row), 1)


def batch_limit(budget, fixed_bytes, bytes_for_batch, max_batch):
    """Largest batch ``m <= max_batch`` with ``fixed_bytes + bytes_for_batch(m) <= budget``.

    ``bytes_for_batch`` must not decrease with ``m``.  Returns at least 1.
    """
    low, high = 1, max(int(max_batch), 1)
    if fixed_bytes + bytes_for_batch(high) <= budget:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if fixed_bytes + bytes_for_batch(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def column_block_size(device, n_rows, n_columns, bytes_per_entry, budget):
    """Number of columns of a kernel block computed at once for ``n_rows`` rows.

    On the CPU the block is kept near the cache size; on CUDA it is as large as the
    budget allows, up to all columns.
    """
    if device.type == "cpu":
        wanted = max(_CPU_BLOCK_ENTRIES // max(n_rows, 1), 512)
    else:
        wanted = n_columns
    affordable = max(int(budget // max(n_rows * bytes_per_entry, 1)), 1)
    return int(max(min(wanted, affordable, n_columns), 1))


def exact_gram_row_block(n_centers):
    """Rows of ``K(Z, Z)`` the exact projection evaluates at once: an eighth of the centers.

    Their float64 blocks then add at most an eighth to the factor they fill.
    """
    return max(math.ceil(n_centers / 8), 1)


def synchronize(device):
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_out_of_memory(error):
    """Whether ``error`` is a device out-of-memory error."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


# torch.mm's GFLOP/s by (device, dtype, shape), measured once per process for verbose reports.
_MATMUL_RATES = {}


def matmul_gflops(device, dtype, rows, inner, columns):
    """GFLOP/s of ``torch.mm`` on ``device`` at ``(rows x inner) @ (inner x columns)``: best of three, after a warm-up.

    The reference that ``verbose`` compares a kernel fill or an epoch with, so that a
    slow machine reads as such (a few tens of milliseconds, measured once per shape).
    """
    key = (str(device), dtype, rows, inner, columns)
    if key not in _MATMUL_RATES:
        left = torch.rand(rows, inner, dtype=dtype, device=device)
        right = torch.rand(inner, columns, dtype=dtype, device=device)
        seconds = _best_seconds(lambda: torch.mm(left, right), device)
        _MATMUL_RATES[key] = 2.0 * rows * inner * columns / seconds / 1e9
    return _MATMUL_RATES[key]


# What CUDA's torch._int_mm takes: more than 16 rows, inner and column sizes in multiples
# of 8 (the CPU takes any shape).
CUDA_INT8_MULTIPLE, CUDA_INT8_MIN_ROWS = 8, 17


def cuda_int8_shape(rows, columns):
    """``(rows, columns)`` of an int8 product padded up to sizes CUDA's ``torch._int_mm`` takes."""
    rows = max(rows, CUDA_INT8_MIN_ROWS)
    return round_up_multiple(rows, CUDA_INT8_MULTIPLE), round_up_multiple(columns, CUDA_INT8_MULTIPLE)


def round_up_multiple(size, multiple):
    """``size`` rounded up to a multiple of ``multiple``."""
    return -(-size // multiple) * multiple


def integer_matmul_speedup(device, dtype, rows, inner, columns):
    """How many times faster an int8 product (summed in int32) runs than ``torch.mm`` in ``dtype``.

    At ``(rows x inner) @ (inner x columns)``; 0 where the device has no int8
    product (``torch._int_mm``).  Processors with 8-bit dot-product instructions run
    it several times faster, others may not at all.  Measured once per machine: the
    answer is kept in the machine's probe store (see ``_probe_store``) for the
    device, the torch version and the shape, as the throughput probes are, so that
    later fits and processes read it instead of timing the products again.
    """
    key = repr((device_identity(device), ("int8 speedup", str(dtype), rows, inner, columns)))
    return _measured_once_per_machine(
        _INT8_SPEEDUPS,
        key,
        lambda: _measured_integer_speedup(device, dtype, rows, inner, columns),
        decode=_stored_rate,
        encode=float,
    )


def _measured_once_per_machine(memo, key, measure, *, decode, encode, usable=lambda value: True):
    """``memo[key]``, else the machine's stored record (``decode``), else ``measure()`` stored (``encode``).

    A value that is not ``usable`` (a probe allowed a smaller batch than asked) is
    measured again; ``decode`` returns None for a record that is not a valid one.
    The store is read and written under its lock, so that concurrent fits on the
    machine measure once.
    """
    value = memo.get(key)
    if value is None or not usable(value):
        with locked_probe_store() as store:
            value = decode(store.get(key)) if store is not None else None
            if value is None or not usable(value):
                value = measure()
                if store is not None:
                    store[key] = encode(value)
        memo[key] = value
    return value


# int8 speedups by (device identity, shape), filled from and saved to the probe store.
_INT8_SPEEDUPS = {}


def _stored_rate(stored):
    """A stored speedup as a float, or None when the record is not a valid one."""
    try:
        rate = float(stored)
    except (TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) and rate >= 0.0 else None


def _measured_integer_speedup(device, dtype, rows, inner, columns):
    """The int8 product's speed over ``torch.mm``'s, timed here (best of three after a warm-up).

    Where the first timed product (after the warm-up) is slower than ``torch.mm``'s
    best, the repeats are skipped: the grid takes int8 products only where they run
    twice as fast (``operator_facts.INTEGER_PRODUCTS_MIN_SPEEDUP``), which a repeat
    could reach only by running in under half the first one's time.  On an AVX2-only
    CPU (no 8-bit dot products) the int8 product ran at 0.05x float32's, and each of
    its four timed calls took 0.4-0.8 s at a one-hot set's blocks (2048 x 192 x 2548,
    DNA).
    """
    if device.type == "cuda":  # as the grid runs it there: padded, the right factor column-major
        padded_rows, padded_columns = cuda_int8_shape(rows, columns)
        left = torch.randint(-128, 128, (padded_rows, inner), dtype=torch.int8, device=device)
        right = torch.randint(-128, 128, (padded_columns, inner), dtype=torch.int8, device=device).T
    else:
        left = torch.randint(-128, 128, (rows, inner), dtype=torch.int8, device=device)
        right = torch.randint(-128, 128, (inner, columns), dtype=torch.int8, device=device)
    flops = 2.0 * rows * inner * columns
    float_gflops = matmul_gflops(device, dtype, rows, inner, columns)
    float_seconds = flops / (float_gflops * 1e9)
    try:
        seconds = _best_seconds(lambda: torch._int_mm(left, right), device, enough=lambda best: best > float_seconds)
    except (RuntimeError, NotImplementedError):
        return 0.0
    return flops / seconds / 1e9 / float_gflops


def _best_seconds(run, device, repeats=3, enough=None):
    """The shortest of ``repeats`` timed calls of ``run`` after one warm-up (itself timed).

    ``enough(best)`` true after the first call past the warm-up stops there: the
    time known is enough for the caller.
    """
    best = math.inf
    for call in range(repeats + 1):
        synchronize(device)
        tic = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - tic)
        if call and enough is not None and enough(best):
            break
    return max(best, 1e-9)


# Probe records by (device identity, operation key): {"ceiling": largest batch the
# probe was allowed, "throughputs": {batch: samples per second}}.  Filled from, and
# saved to, the machine's probe store (see _probe_store).
_CAPACITY_CACHE = {}


@dataclass(frozen=True)
class ProbeSettings:
    """How the throughput probe measures.

    Batches ``min_batch, 2 min_batch, ...`` are timed (best of ``repeats``); the
    probe stops after ``patience`` successive sizes that fail to beat the best
    throughput by the factor ``growth``, or after ``time_limit`` seconds.
    """

    min_batch: int = 32
    growth: float = 1.1
    patience: int = 2
    repeats: int = 3
    time_limit: float = 2.0


class SaturationBatch(NamedTuple):
    """The batch at which samples per second stop growing, and the throughputs it was read from.

    Attributes
    ----------
    batch : int
    throughputs : dict
        Samples per second by measured batch size (empty where none was measured).
    """

    batch: int
    throughputs: dict

    def bounded(self, batch):
        """The same measurement with ``batch`` in place of its own (a bound or an agreement of ranks)."""
        return self._replace(batch=batch)


def throughput_saturation_batch(run_batch, max_batch, device, cache_key=None, settings=ProbeSettings()):
    """Smallest batch at which samples per second stop growing, measured once per machine.

    Batches ``min_batch, 2 min_batch, ...`` up to ``max_batch`` are timed with
    ``run_batch(batch_size)`` (best of ``repeats``, after one warm-up), as
    ``settings`` (:class:`ProbeSettings`) says.  The answer is the smallest
    measured batch within a factor ``growth`` of the best throughput.

    With a ``cache_key``, the measurement is stored for the device and the torch
    version in the machine's probe file (``$SKGPU_KERNEL_PROBE_DIR``, by default
    ``~/.cache/skgpu_kernel``) under a file lock, and reused by every later call
    whose ``max_batch`` it covers, in this process or another: the same fit on the
    same machine then makes the same choice whatever else is running.  A larger
    ``max_batch`` than the stored probe was allowed measures again.

    Parameters
    ----------
    run_batch : callable
        ``run_batch(batch_size)`` performs the operation whose throughput matters.
    max_batch : int
        Upper bound (from the memory budget and the data size).
    device : torch.device
        Synchronised around each timing.
    cache_key : hashable or None
        The operation and its shapes; its ``repr`` names the stored record.
    settings : ProbeSettings, optional

    Returns
    -------
    SaturationBatch
        The batch, and the samples per second of each measured batch size up to
        ``max_batch``.
    """
    max_batch = int(max_batch)
    if max_batch <= settings.min_batch:
        return SaturationBatch(max_batch, {})
    if cache_key is None:
        return _saturation(_probe(run_batch, max_batch, device, settings), max_batch, settings.growth)
    record = _measured_once_per_machine(
        _CAPACITY_CACHE,
        repr((device_identity(device), cache_key)),
        lambda: {"ceiling": max_batch, "throughputs": _probe(run_batch, max_batch, device, settings)},
        decode=_decoded,
        encode=_encoded,
        usable=lambda record: record["ceiling"] >= max_batch,
    )
    return _saturation(record["throughputs"], max_batch, settings.growth)


def _encoded(record):
    """A probe record as JSON stores it (batch sizes as strings)."""
    return {"ceiling": record["ceiling"], "throughputs": {str(b): r for b, r in record["throughputs"].items()}}


def _decoded(stored):
    """A stored record with integer batch sizes, or None when it is not a valid record."""
    try:
        return {
            "ceiling": int(stored["ceiling"]),
            "throughputs": {int(b): float(r) for b, r in stored["throughputs"].items()},
        }
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def _saturation(throughputs, max_batch, growth):
    """The smallest batch up to ``max_batch`` within ``growth`` of the best throughput there."""
    allowed = {size: rate for size, rate in sorted(throughputs.items()) if size <= max_batch}
    if not allowed:
        return SaturationBatch(max_batch, {})
    peak = max(allowed.values())
    return SaturationBatch(min(size for size, rate in allowed.items() if rate * growth >= peak), allowed)


def _probe(run_batch, max_batch, device, settings):
    """Samples per second of ``run_batch`` for ``min_batch, 2 min_batch, ..., max_batch``."""
    sizes = []
    size = settings.min_batch
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)

    throughputs = {}
    best = 0.0
    misses = 0
    started = time.perf_counter()
    for _ in range(2):  # warm-up: allocator, thread pools, kernels' first launch
        run_batch(sizes[0])
    for size in sizes:
        elapsed = math.inf
        for _ in range(settings.repeats):
            synchronize(device)
            tic = time.perf_counter()
            run_batch(size)
            synchronize(device)
            elapsed = min(elapsed, time.perf_counter() - tic)
        throughputs[size] = size / max(elapsed, 1e-9)
        misses = 0 if throughputs[size] > settings.growth * best else misses + 1
        best = max(best, throughputs[size])
        if misses >= settings.patience or time.perf_counter() - started > settings.time_limit:
            break
    return throughputs
