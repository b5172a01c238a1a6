"""Data buffering: pass plans and a prefetching buffer iterator.

Training data that does not fit on the device (or in memory) is read one *buffer*
of rows at a time (BMGD, ``ALGORITHMS.md`` section 2), from a row source
(:mod:`skgpu_kernel.row_sources`).  This module provides

* :func:`plan_pass`: which rows go into which buffer during one pass, as lists of
  contiguous row ranges (sequential reads) in a shuffled order (mixed labels);
* :class:`BufferPrefetcher`: an iterator that hands device tensors of one buffer to
  the trainer while a background thread reads the next one, through pinned
  staging memory and a side CUDA stream when the device is a GPU.

Nothing here knows about models or losses.
"""

import math
import queue
import threading
import time
import weakref

import numpy as np
import scipy.sparse as sp
import torch

from ._warnings import warn_user
from .row_sources import RowSource

__all__ = [
    "BufferPrefetcher",
    "RangeMap",
    "default_chunk_size",
    "map_ranges",
    "plan_pass",
    "plan_passes",
]

# Seconds between checks of the stop flag and of the worker's liveness: short enough
# that close() and error propagation feel immediate, long enough not to spin.
_POLL_SECONDS = 0.05

# close() gives a worker stuck in one slow read this long before warning about it.
_JOIN_SECONDS = 10.0

# Chunks per buffer for default_chunk_size: enough to mix data sorted by label
# within each buffer, few enough that each chunk is a long sequential read.
_CHUNKS_PER_BUFFER = 16

# Upper bound on chunks per pass for default_chunk_size: keeps the plan's Python
# lists (and the per-chunk overhead) small for very large data sets.
_MAX_CHUNKS_PER_PASS = 2**16

_THREAD_PREFIX = "skgpu_kernel-prefetch"


def default_chunk_size(buffer_size, n_rows):
    """Rows per contiguous chunk of :func:`plan_pass` for a given buffer size.

    About a sixteenth of a buffer (of the whole data when it is smaller than a
    buffer), so that each buffer gathers rows from 16 random places of the data
    set while each read stays a long sequential run; but at least
    ``n_rows / 65536`` rows, so that a pass has at most 65,536 chunks however
    small the buffer; and at most one buffer.

    Parameters
    ----------
    buffer_size : int
    n_rows : int

    Returns
    -------
    int

    Examples
    --------
    >>> from skgpu_kernel.buffer import default_chunk_size
    >>> default_chunk_size(100_000, 10_000_000)
    6250
    >>> default_chunk_size(1000, 10**9)
    1000
    """
    buffer_size, n_rows = int(buffer_size), int(n_rows)
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be positive, got {buffer_size}.")
    by_buffer = math.ceil(min(buffer_size, max(n_rows, 1)) / _CHUNKS_PER_BUFFER)
    by_count = math.ceil(n_rows / _MAX_CHUNKS_PER_PASS)
    return max(1, min(buffer_size, max(by_buffer, by_count)))


def plan_pass(n_rows, buffer_size, chunk_size, rng, shuffle=True):
    """Row ranges of each buffer for one pass over ``n_rows`` rows.

    The rows are cut into contiguous chunks of ``chunk_size`` rows (the last may be
    shorter).  With ``shuffle`` the order of the chunks is permuted, then
    consecutive chunks fill buffers of ``buffer_size`` rows, a chunk being split at
    a buffer boundary when needed: every buffer but the last has exactly
    ``buffer_size`` rows.  Contiguous chunks keep reads sequential, the shuffled
    order mixes data stored sorted (by label, by time); the rows within a buffer
    are shuffled later, on the device, by the solver.

    Parameters
    ----------
    n_rows : int
    buffer_size : int
        Rows per buffer.
    chunk_size : int
        Rows per chunk (see :func:`default_chunk_size`).
    rng : numpy.random.RandomState
        Draws the chunk order (``rng.permutation``); a ``numpy.random.Generator``
        works too but gives other permutations.  Unused (may be None) without
        ``shuffle``.
    shuffle : bool, default=True
        Without it the buffers are ``0..buffer_size-1``, ``buffer_size..`` and so on.

    Returns
    -------
    list of list of (int, int)
        Per buffer, its ``(start, stop)`` row ranges in reading order.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel.buffer import plan_pass
    >>> plan_pass(10, buffer_size=4, chunk_size=3, rng=None, shuffle=False)
    [[(0, 3), (3, 4)], [(4, 6), (6, 8)], [(8, 9), (9, 10)]]
    >>> plan = plan_pass(10, buffer_size=4, chunk_size=3, rng=np.random.RandomState(0))
    >>> [sum(stop - start for start, stop in buffer) for buffer in plan]
    [4, 4, 2]
    """
    n_rows, buffer_size, chunk_size = int(n_rows), int(buffer_size), int(chunk_size)
    if n_rows < 0:
        raise ValueError(f"n_rows must be non-negative, got {n_rows}.")
    if buffer_size < 1 or chunk_size < 1:
        raise ValueError(f"buffer_size and chunk_size must be positive, got {buffer_size} and {chunk_size}.")
    starts = range(0, n_rows, chunk_size)
    if shuffle:
        if not hasattr(rng, "permutation"):
            raise TypeError(f"rng must be a numpy RandomState (or Generator), got {type(rng).__name__}.")
        starts = [starts[i] for i in rng.permutation(len(starts))]
    plan, current, room = [], [], buffer_size
    for chunk_start in starts:
        start, chunk_stop = int(chunk_start), min(int(chunk_start) + chunk_size, n_rows)
        while start < chunk_stop:
            stop = min(chunk_stop, start + room)
            current.append((start, stop))
            room -= stop - start
            start = stop
            if room == 0:
                plan.append(current)
                current, room = [], buffer_size
    if current:
        plan.append(current)
    return plan


class RangeMap:
    """Positions in the concatenation of ``segments`` mapped onto the rows they stand for.

    The cumulative offsets are computed once, so that mapping many small ranges (a
    worker's claims, one per update) costs a binary search each.

    Parameters
    ----------
    segments : sequence of (int, int)
        Disjoint row ranges, in the order they are concatenated (e.g. the training
        rows left by a validation split, a worker's shard, or a pass's chunk order).
    """

    def __init__(self, segments):
        self.starts = np.array([start for start, _ in segments], dtype=np.int64)
        lengths = np.array([stop - start for start, stop in segments], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])

    def __call__(self, ranges):
        """Row ranges for ``ranges`` of positions, split where they cross segments."""
        mapped = []
        for start, stop in ranges:
            while start < stop:
                segment = int(np.searchsorted(self.offsets, start, side="right")) - 1
                take = int(min(stop, self.offsets[segment + 1]) - start)
                first = int(self.starts[segment] + start - self.offsets[segment])
                mapped.append((first, first + take))
                start += take
        return mapped


def map_ranges(segments, ranges):
    """Map ranges over the concatenation of ``segments`` onto the rows they stand for.

    Parameters
    ----------
    segments : sequence of (int, int)
        Disjoint row ranges, in concatenation order.
    ranges : sequence of (int, int)
        Ranges of positions in ``range(total length of the segments)``.

    Returns
    -------
    list of (int, int)
        Row ranges, split where a range crosses from one segment into the next.

    Examples
    --------
    >>> from skgpu_kernel.buffer import map_ranges
    >>> map_ranges([(0, 3), (10, 20)], [(2, 5)])
    [(2, 3), (10, 12)]
    """
    return RangeMap(segments)(ranges)


def plan_passes(segments, buffer_size, seed, first_pass, n_passes, shuffle=True):
    """Buffers of ``n_passes`` consecutive passes over the rows of ``segments``.

    Pass ``p`` (counted from ``first_pass``, so that continued fits draw new chunk
    orders) is :func:`plan_pass` with ``RandomState([seed, p, 1])`` and
    :func:`default_chunk_size`, mapped onto the segments' rows.

    Returns
    -------
    plans : list of lists
        Per pass, per buffer, its ``(start, stop)`` row ranges.
    """
    n_rows = sum(stop - start for start, stop in segments)
    chunk_size = default_chunk_size(buffer_size, n_rows)
    plans = []
    for index in range(first_pass, first_pass + n_passes):
        rng = np.random.RandomState([seed, index, 1])
        plan = plan_pass(n_rows, buffer_size, chunk_size, rng, shuffle=shuffle)
        plans.append([map_ranges(segments, ranges) for ranges in plan])
    return plans


class _Stopped(Exception):
    """The consumer asked the worker to stop."""


class _ReadFailure(Exception):
    def __init__(self, buffer_index, source_index, error):
        super().__init__(buffer_index, source_index, error)
        self.buffer_index, self.source_index, self.error = buffer_index, source_index, error


def _torch_dtype_of(np_dtype):
    try:
        return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype
    except TypeError:
        return None


class _Pipeline:
    """State shared by the consumer and the worker thread.

    Holds no reference to the :class:`BufferPrefetcher`, so that a prefetcher
    dropped without ``close`` is garbage collected and its finalizer stops the
    worker.
    """

    def __init__(self, sources, plan, device, dtypes, pin_memory):
        self.sources, self.plan, self.device, self.dtypes = sources, plan, device, dtypes
        self.pin_memory = pin_memory
        self.cuda = device.type == "cuda"
        self.max_rows = max((sum(stop - start for start, stop in ranges) for ranges in plan), default=0)
        # Staged in the source's own dtype where torch has one, so that the
        # host-to-device copy moves the source's bytes and the cast runs on the device.
        self.stage_dtypes = []
        for source, dtype in zip(sources, dtypes, strict=True):
            staged = None if source.is_sparse else _torch_dtype_of(source.dtype)
            if staged is None and not source.is_sparse:
                staged = dtype
                target = torch.empty(0, dtype=dtype).numpy().dtype
                if not np.can_cast(source.dtype, target, "same_kind"):
                    raise ValueError(f"{source.name}: cannot convert dtype {source.dtype} to {dtype}.")
            self.stage_dtypes.append(staged)
        self.staging = [None, None]
        self.slot_events = [None, None]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.stop = threading.Event()
        self.ready = queue.Queue()
        self.free = queue.Queue()
        self.read_seconds = 0.0

    def _slot_buffers(self, slot):
        if self.staging[slot] is None:
            self.staging[slot] = [
                None
                if source.is_sparse
                else torch.empty(
                    (self.max_rows, *source.shape[1:]),
                    dtype=staged,
                    pin_memory=self.pin_memory,
                )
                for source, staged in zip(self.sources, self.stage_dtypes, strict=True)
            ]
        return self.staging[slot]

    def _read_dense(self, source, ranges, host):
        position = 0
        array = host.numpy()
        for start, stop in ranges:
            if self.stop.is_set():
                raise _Stopped
            position += source.read_into([(start, stop)], array[position:])
        return host

    def _read_sparse(self, source, ranges, rows):
        parts = []
        for start, stop in ranges:
            if self.stop.is_set():
                raise _Stopped
            parts.append(source.read([(start, stop)]))
        matrix = sp.vstack(parts, format="csr") if len(parts) != 1 else parts[0]
        matrix.sum_duplicates()  # also sorts the indices: the COO tensor is then coalesced
        coo = matrix.tocoo()
        indices = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
        values = torch.from_numpy(np.ascontiguousarray(coo.data, dtype=coo.data.dtype.newbyteorder("=")))
        return torch.sparse_coo_tensor(indices, values, (rows, source.shape[1]), check_invariants=False).coalesce()

    def _to_device(self, host, dtype):
        # Copy first, cast after: the transfer moves the source's bytes, not the wider training dtype's.
        tensor = host.to(self.device, non_blocking=True).to(dtype)
        if tensor.is_sparse and not tensor.is_coalesced():
            tensor = tensor.coalesce()
        return tensor

    def produce(self, index, slot):
        """Read buffer ``index`` into staging ``slot`` and start its transfer; returns the payload."""
        ranges = self.plan[index]
        rows = sum(stop - start for start, stop in ranges)
        tic = time.perf_counter()
        buffers = self._slot_buffers(slot)
        if self.slot_events[slot] is not None:
            # The pinned slot is still the source of an asynchronous copy until this fires.
            self.slot_events[slot].synchronize()
            self.slot_events[slot] = None
        hosts = []
        for position, source in enumerate(self.sources):
            try:
                if source.is_sparse:
                    hosts.append(self._read_sparse(source, ranges, rows))
                else:
                    hosts.append(self._read_dense(source, ranges, buffers[position][:rows]))
            except _Stopped:
                raise
            except Exception as exc:
                raise _ReadFailure(index, position, exc) from exc
        event = None
        if self.cuda:
            with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                tensors = tuple(self._to_device(host, dtype) for host, dtype in zip(hosts, self.dtypes, strict=True))
                event = torch.cuda.Event()
                event.record(self.stream)
            self.slot_events[slot] = event
        else:
            tensors = tuple(self._to_device(host, dtype) for host, dtype in zip(hosts, self.dtypes, strict=True))
        self.read_seconds += time.perf_counter() - tic
        return index, slot, tensors, event

    def next_free_slot(self):
        while not self.stop.is_set():
            try:
                slot = self.free.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if slot is not None:
                return slot
        raise _Stopped


def _worker(pipeline):
    try:
        for index in range(len(pipeline.plan)):
            slot = pipeline.next_free_slot()
            pipeline.ready.put(("buffer", pipeline.produce(index, slot)))
        pipeline.ready.put(("done", None))
    except _Stopped:
        pass
    except BaseException as exc:  # reported to the consumer, which re-raises it
        pipeline.ready.put(("error", exc))


def _shutdown(pipeline):
    pipeline.stop.set()
    pipeline.free.put(None)  # wakes a worker waiting for a free slot


class BufferPrefetcher:
    """Iterate over the buffers of a pass as device tensors, reading ahead in a thread.

    Each step yields one tuple of tensors, one per source, for the next buffer of
    ``plan``: a dense 2-D source gives a ``(rows, d)`` tensor, a 1-D source a
    ``(rows,)`` tensor, a sparse source a coalesced ``torch.sparse_coo_tensor`` of
    shape ``(rows, d)``; all on ``device`` in the corresponding ``dtypes``.

    With ``prefetch``, a daemon thread reads buffer ``k + 1`` while the consumer
    works on buffer ``k``; at most two buffers are resident (the one yielded and
    the next).  Rows are read in their source dtype into host staging buffers
    (pinned on CUDA), copied to the device on a side stream and converted there,
    so float32 data trained in float64 crosses the bus at half the size; the
    consumer's current stream waits on the copy with an event and nothing blocks
    the host unless the prefetch is late.  Without ``prefetch`` the same steps run
    inside ``__next__``; the tensors are the same, bit for bit.

    Parameters
    ----------
    sources : list of RowSource
        All with the same number of rows (``X``, ``y``, ``sample_weight``, ...).
    plan : list of list of (int, int)
        Buffers of row ranges, as returned by :func:`plan_pass`.
    device : torch.device or str
    dtypes : list of torch.dtype
        One per source.
    prefetch : bool, default=True
        Read the next buffer in a background thread.
    pin_memory : bool or "auto", default="auto"
        Pinned host staging for dense sources; "auto" pins on CUDA.  Ignored on the
        CPU.

    Attributes
    ----------
    io_wait_seconds : float
        Time the consumer spent blocked in ``__next__`` waiting for data (the BMGD
        "I/O wait"); all of the reading without ``prefetch``.
    read_seconds : float
        Time spent reading and copying, in the worker (or in ``__next__``).
    n_buffers : int

    Notes
    -----
    Memory: two staging buffers per dense source, each as large as the largest
    buffer of the plan.  On the CPU, when the dtype does not change, a yielded
    tensor *is* a staging buffer: it stays valid until the next call to
    ``__next__``, after which the worker refills it; clone it to keep it longer.
    Tensors on CUDA are fresh device allocations.  Sparse sources are read as CSR,
    converted to COO on the host and moved with ``.to(device)``: not zero-copy.

    Errors raised while reading (a failing reader, a memory-mapped file that was
    deleted, replaced or truncated) are re-raised by the next ``__next__`` as a
    ``RuntimeError`` naming the source and the buffer, chained to the original.
    Leaving early (``break``, an exception in training) should be followed by
    :meth:`close`, or use the prefetcher as a context manager; a prefetcher that is
    garbage collected also stops its thread.  Sources are not closed: they belong
    to the caller.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from skgpu_kernel.buffer import BufferPrefetcher, plan_pass
    >>> from skgpu_kernel.row_sources import as_row_source
    >>> X = np.arange(20, dtype=np.float32).reshape(10, 2)
    >>> y = np.arange(10) % 3
    >>> plan = plan_pass(10, buffer_size=4, chunk_size=2, rng=np.random.RandomState(0))
    >>> sources = [as_row_source(X), as_row_source(y, name="y")]
    >>> with BufferPrefetcher(sources, plan, torch.device("cpu"), [torch.float64, torch.int64]) as buffers:
    ...     shapes = [(tuple(Xb.shape), Xb.dtype, yb.dtype) for Xb, yb in buffers]
    >>> shapes[0], shapes[-1]
    (((4, 2), torch.float64, torch.int64), ((2, 2), torch.float64, torch.int64))
    """

    def __init__(self, sources, plan, device, dtypes, prefetch=True, pin_memory="auto"):
        sources, dtypes = list(sources), list(dtypes)
        if not sources:
            raise ValueError("BufferPrefetcher needs at least one source.")
        for source in sources:
            if not isinstance(source, RowSource):
                raise TypeError(f"sources must be RowSource objects (see as_row_source), got {type(source).__name__}.")
        if len({source.n_rows for source in sources}) != 1:
            rows = ", ".join(f"{source.name}: {source.n_rows}" for source in sources)
            raise ValueError(f"All sources must have the same number of rows, got {rows}.")
        if len(dtypes) != len(sources):
            raise ValueError(f"Expected one dtype per source ({len(sources)}), got {len(dtypes)}.")
        for dtype in dtypes:
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"dtypes must be torch dtypes, got {dtype!r}.")
        for source in sources:
            if source.is_sparse and len(source.shape) != 2:
                raise ValueError(f"{source.name}: sparse sources must be 2-D.")
        device = torch.device(device)
        if pin_memory == "auto":
            pin_memory = device.type == "cuda"
        elif not isinstance(pin_memory, bool):
            raise ValueError(f"pin_memory must be True, False or 'auto', got {pin_memory!r}.")
        plan = [sources[0]._check_ranges(ranges) for ranges in plan]

        self.device = device
        self.prefetch = bool(prefetch)
        self.n_buffers = len(plan)
        self.io_wait_seconds = 0.0
        self._pipeline = _Pipeline(sources, plan, device, dtypes, pin_memory and device.type == "cuda")
        self._thread = None
        self._next_index = 0
        self._held_slot = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._pipeline)

    @property
    def read_seconds(self):
        """Time spent reading and copying data so far."""
        return self._pipeline.read_seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __iter__(self):
        self._start()
        return self

    def _start(self):
        if self.prefetch and self._thread is None and not self._closed and self.n_buffers:
            for slot in (0, 1):
                self._pipeline.free.put(slot)
            self._thread = threading.Thread(
                target=_worker,
                args=(self._pipeline,),
                name=f"{_THREAD_PREFIX}-{id(self):x}",
                daemon=True,
            )
            self._thread.start()

    def _wait_for_worker(self):
        ready = self._pipeline.ready
        while True:
            try:
                return ready.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not self._thread.is_alive():
                    try:  # the worker may have delivered just before exiting
                        return ready.get_nowait()
                    except queue.Empty:
                        return ("error", RuntimeError("the prefetch thread stopped without delivering a buffer"))

    def _raise(self, error):
        self.close()
        if isinstance(error, _ReadFailure):
            source = self._pipeline.sources[error.source_index]
            raise RuntimeError(
                f"Reading {source.name!r} for buffer {error.buffer_index + 1} of {self.n_buffers} failed: "
                f"{type(error.error).__name__}: {error.error}"
            ) from error.error
        raise RuntimeError(f"Prefetching buffer {self._next_index + 1} of {self.n_buffers} failed: {error}") from error

    def __next__(self):
        if self._closed or self._next_index >= self.n_buffers:
            self.close()
            raise StopIteration
        pipeline = self._pipeline
        tic = time.perf_counter()
        if self.prefetch:
            self._start()
            if self._held_slot is not None:
                # The consumer has moved past the previous buffer: its slot may be refilled.
                pipeline.free.put(self._held_slot)
                self._held_slot = None
            kind, payload = self._wait_for_worker()
            if kind == "error":
                self.io_wait_seconds += time.perf_counter() - tic
                self._raise(payload)
            if kind == "done":  # pragma: no cover - the worker delivers exactly n_buffers buffers
                self.close()
                raise StopIteration
        else:
            try:
                payload = pipeline.produce(self._next_index, 0)
            except Exception as exc:
                self.io_wait_seconds += time.perf_counter() - tic
                self._raise(exc)
        self.io_wait_seconds += time.perf_counter() - tic
        _index, slot, tensors, event = payload
        self._held_slot = slot if self.prefetch else None
        self._next_index += 1
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for tensor in tensors:
                # Allocated on the side stream, used on this one: keep the caching
                # allocator from handing the memory out before this stream is done.
                parts = (tensor._indices(), tensor._values()) if tensor.is_sparse else (tensor,)
                for part in parts:
                    part.record_stream(stream)
        return tensors

    def close(self):
        """Stop and join the worker thread and release the staging memory; idempotent."""
        if self._closed:
            return
        self._closed = True
        pipeline = self._pipeline
        self._finalizer()  # sets the stop flag and wakes the worker
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(_JOIN_SECONDS)
            if thread.is_alive():
                warn_user(
                    f"The prefetch thread {thread.name} is still reading after {_JOIN_SECONDS:.0f} s; "
                    "it will stop after its current read.",
                    RuntimeWarning,
                )
        if pipeline.cuda:
            for event in pipeline.slot_events:
                if event is not None:
                    event.synchronize()
        pipeline.staging = [None, None]
        pipeline.slot_events = [None, None]
        while True:  # drop buffers read ahead but never consumed
            try:
                pipeline.ready.get_nowait()
            except queue.Empty:
                break
