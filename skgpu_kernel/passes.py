"""Passes over a fit's row sources, as the BMGD loop reads them.

:func:`~skgpu_kernel.solvers.sgd.fit_buffered_sgd` asks for each pass with
``open_pass(epoch)`` and iterates over its buffers.  Data that fits one buffer is
read once and stays resident (:class:`ResidentPasses`); otherwise one
:class:`~skgpu_kernel.buffer.BufferPrefetcher` streams every buffer of every pass
(:class:`StreamedPasses`), so that the first buffer of a pass loads while the last
one of the previous pass trains.
"""

import math
from dataclasses import dataclass

import torch

from .buffer import BufferPrefetcher, map_ranges, plan_pass, plan_passes

__all__ = [
    "OrderedPasses",
    "PassLayout",
    "ResidentPasses",
    "StreamedPasses",
    "check_finite_rows",
    "open_passes",
    "read_rows",
]


@dataclass(frozen=True)
class PassLayout:
    """Where the rows of every pass come from and in which order.

    Parameters
    ----------
    sources : list of RowSource
        X, the targets and (optionally) the weights.
    dtypes : list of torch.dtype
        The dtype each source is read in.
    device : torch.device
    segments : list of (int, int)
        The training rows.
    check_finite : bool
        Check features for NaN and infinity as buffers arrive (sources not
        validated in memory).
    prefetch : bool
        Load the next buffer in a background thread.
    """

    sources: list
    dtypes: list
    device: torch.device
    segments: list
    check_finite: bool
    prefetch: bool


def read_rows(layout, ranges, n_sources=None):
    """The rows ``ranges`` of the first ``n_sources`` sources (all by default), as tensors on the device."""
    sources, dtypes = layout.sources[:n_sources], layout.dtypes[:n_sources]
    with BufferPrefetcher(sources, [ranges], layout.device, dtypes, prefetch=False) as buffers:
        tensors = next(iter(buffers))
    if layout.check_finite:
        check_finite_rows(tensors[0])
    return tensors


def check_finite_rows(X):
    """Raise when a dense or sparse buffer holds NaN or infinity."""
    values = X.coalesce().values() if X.is_sparse else X
    if values.numel() == 0:
        return
    # Extremes propagate NaN and show infinities; on the CPU this is far faster
    # than an element-wise isfinite over the whole buffer.
    low, high = torch.aminmax(values)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        raise ValueError("Input X contains NaN or infinity.")


def open_passes(layout, plan, schedule):
    """The passes of a single-process fit.

    Parameters
    ----------
    layout : PassLayout
    plan : BMGDPlan
        ``plan.resident``: the data fits one buffer; else ``plan.buffer_size`` rows per buffer.
    schedule : tuple (seed, first_pass, n_passes, shuffle)
        Chunk orders are reshuffled per pass from ``seed``, continuing the passes of earlier calls.

    Returns
    -------
    ResidentPasses or StreamedPasses
    """
    if plan.resident:
        return ResidentPasses(_as_buffer(read_rows(layout, layout.segments)))
    seed, first_pass, n_passes, shuffle = schedule
    plans = plan_passes(layout.segments, plan.buffer_size, seed, first_pass, n_passes, shuffle)
    buffers = [buffer for plan_ in plans for buffer in plan_]
    prefetcher = BufferPrefetcher(layout.sources, buffers, layout.device, layout.dtypes, layout.prefetch)
    return StreamedPasses(prefetcher, len(plans[0]), layout.check_finite)


class StreamedPasses:
    """Every pass of a fit read by one prefetcher, buffer after buffer."""

    def __init__(self, prefetcher, buffers_per_pass, check_finite):
        self.prefetcher = prefetcher
        self.buffers = iter(prefetcher)
        self.buffers_per_pass = buffers_per_pass
        self.check_finite = check_finite

    def open(self, epoch):
        return _PassView(self)

    def close(self):
        self.prefetcher.close()


class _PassView:
    """The buffers of one pass out of :class:`StreamedPasses`, with its own I/O wait."""

    def __init__(self, stream):
        self.stream = stream
        self.wait_before = stream.prefetcher.io_wait_seconds

    @property
    def io_wait_seconds(self):
        return self.stream.prefetcher.io_wait_seconds - self.wait_before

    def __enter__(self):
        return self

    def __exit__(self, error_type, *exc_info):
        if error_type is not None:
            self.stream.close()

    def __iter__(self):
        for _ in range(self.stream.buffers_per_pass):
            buffer = _as_buffer(next(self.stream.buffers))
            if self.stream.check_finite:
                check_finite_rows(buffer[0])
            yield buffer


class ResidentPasses:
    """Passes over data that fits in one buffer, loaded once for all passes."""

    io_wait_seconds = 0.0

    def __init__(self, tensors):
        self.tensors = tensors

    def open(self, epoch):
        return self

    def close(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def __iter__(self):
        yield self.tensors


class OrderedPasses:
    """Passes over the training rows in their stored order, for full-batch products.

    Rows that fit one buffer are read once and kept; otherwise each pass streams
    buffers of ``buffer_size`` rows, the same ones in the same order every pass,
    so that a product's row blocks line up with the rows of the one before.

    Parameters
    ----------
    layout : PassLayout
    buffer_size : int
    resident : bool
    """

    def __init__(self, layout, buffer_size, resident):
        self.layout = layout
        n_rows = sum(stop - start for start, stop in layout.segments)
        ranges = plan_pass(n_rows, buffer_size, buffer_size, None, shuffle=False)
        self.buffers = [map_ranges(layout.segments, buffer) for buffer in ranges]
        self.resident = _as_buffer(read_rows(layout, layout.segments)) if resident else None

    def __iter__(self):
        """One pass: ``(X, targets, weights)`` per buffer (``weights`` may be None)."""
        if self.resident is not None:
            yield self.resident
            return
        layout = self.layout
        with BufferPrefetcher(layout.sources, self.buffers, layout.device, layout.dtypes, layout.prefetch) as stream:
            for tensors in stream:
                buffer = _as_buffer(tensors)
                if layout.check_finite:
                    check_finite_rows(buffer[0])
                yield buffer


def _as_buffer(tensors):
    """``(X, targets, weights)`` of the tensors read from the sources, ``weights`` None without a weight source."""
    X, targets, *weights = tensors
    return X, targets, weights[0] if weights else None
