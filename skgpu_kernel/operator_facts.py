"""What the planners read about kernel operators: plain data and rules, no products.

The operators (:mod:`skgpu_kernel.operators`) and the grid's codes
(:mod:`skgpu_kernel.grid`) compute; the planners (:mod:`skgpu_kernel.planning`)
decide from facts alone: the blocks a product takes, what the device measured of
an operator (its grid, the speed of int8 products), the CPU's read sizes, how
centers split into shards and how wide the grid's codes are.  Those facts live
here, below both, so that planning imports nothing that computes.
"""

import itertools
from dataclasses import dataclass

import torch

from .device import CUDA_INT8_MULTIPLE, round_up_multiple

__all__ = [
    "CPU_READ_ENTRIES",
    "CPU_WIDE_COLUMNS",
    "INTEGER_PRODUCTS_MIN_SPEEDUP",
    "Grid",
    "OperatorBlocks",
    "OperatorMeasurements",
    "integer_products_pay",
    "padded_features",
    "shard_bounds",
]

# Entries of K a CPU read takes at once (a few MB), and the width the BLAS reads
# fastest: see CachedOperator and widened (the memory planner counts both).
CPU_READ_ENTRIES = 2**21
CPU_WIDE_COLUMNS = 16


# Data on a grid takes int8 products for kernel blocks when these run this many times
# faster than float ones at those blocks: the integer path spends three more
# element-wise passes per block (on the 2-core AMD EPYC the products ran 4x faster, and
# a 20000-row Fashion-MNIST fill took 0.8-0.9 s against 2.4-2.7 s).
INTEGER_PRODUCTS_MIN_SPEEDUP = 2.0


@dataclass(frozen=True)
class Grid:
    """A common grid of the features: ``step`` and each feature's ``origin`` (a tensor).

    ``integer_products``: how the codes' products are computed (``torch._int_mm``
    where it pays, else exact float32 products); the distances are the same either way.
    """

    step: float
    origin: torch.Tensor
    integer_products: bool = True


@dataclass(frozen=True)
class OperatorBlocks:
    """How many rows an evaluated product prepares at once, and how many columns of ``K`` it evaluates at once.

    ``rowwise``: on the CPU, ``V`` is multiplied with zero columns added up to a
    multiple of 16 (``widened_to_multiple``), so that a row's bits do not depend
    on the rows beside it or on its place in the block.  ``K @ V`` with 2 to 15
    columns need not give that: on an AMD EPYC, MKL's float64 ``(256 x 157) @ (157
    x 3)`` rounds a row differently at an odd and at an even place (28 of 56 rows
    moved to another place of a 256-row block with 3 columns in float64, 27 of 56
    with 10 in float32); with 16, 32 or 48 columns none of 960 moved (1 or 2
    threads, 7 to 4099 columns of ``K``).  It costs no more: the BLAS reads ``K``
    faster against 16 columns than against fewer (``widened``).
    """

    rows: int
    columns: int
    rowwise: bool = False

    @classmethod
    def whole(cls, n_rows, column_block):
        """Every row in one block (a batch, a prediction block), ``column_block`` columns at once."""
        return cls(max(int(n_rows), 1), max(int(column_block), 1))


@dataclass(frozen=True)
class OperatorMeasurements:
    """What only the device can tell the operator planner about ``K(rows, centers)``.

    Attributes
    ----------
    grid : Grid or None
        The common grid of the rows and the centers, for a kernel of their squared
        Euclidean distances (``Kernel.from_distances``); None otherwise.
    integer_speedup : float
        How many times faster int8 products run than float32 ones at the operator's
        blocks (``skgpu_kernel.device.integer_matmul_speedup``); measured only
        where there is a grid (0 otherwise).  It chooses how the grid's exact
        distances are computed, never whether: both ways give the same bits.
    """

    grid: Grid | None = None
    integer_speedup: float = 0.0


def integer_products_pay(speedup):
    """Whether kernel blocks of data on a grid come from exact int8 distances: the one rule, fit and ``predict``.

    Parameters
    ----------
    speedup : float
        ``skgpu_kernel.device.integer_matmul_speedup`` at the blocks evaluated (for a
        kernel of distances and data on a grid: what
        ``skgpu_kernel.operators.measure_operator`` measures).
    """
    return speedup >= INTEGER_PRODUCTS_MIN_SPEEDUP


def padded_features(n_features):
    """The codes' width: ``n_features`` rounded up to a multiple of 8."""
    return round_up_multiple(n_features, CUDA_INT8_MULTIPLE)


def shard_bounds(n_centers, n_shards):
    """Contiguous ``(start, stop)`` row ranges splitting ``n_centers`` into ``n_shards`` near-equal shards."""
    edges = [round(i * n_centers / n_shards) for i in range(n_shards + 1)]
    return list(itertools.pairwise(edges))
