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
    "OperatorPlan",
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

    Each operator's own, not a field of the fit's :class:`OperatorPlan`: whoever
    builds an operator sets them (a fit's layout, a prediction, a preconditioner,
    a probe), EigenPro changes them with its batch (``with_blocks``), and a fit's
    blocks are its layout's (``batch_size``, ``column_block``).

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
class OperatorPlan:
    """How a fit's kernel products are computed: what the device measured, then what planning decided.

    :func:`skgpu_kernel.operators.measure_operator` fills what only the device can
    tell (``grid`` and ``integer_speedup``, the rest at its defaults);
    :func:`skgpu_kernel.planning.operator.plan_operator` decides the rest.

    Attributes
    ----------
    grid : Grid or None
        The grid whose exact distances give the blocks (its ``integer_products``:
        by int8 products, else by exact float32 ones); None: float blocks.  As
        measured: the common grid of the rows and the centers, for a kernel of
        their squared Euclidean distances (``Kernel.from_distances``).
    integer_speedup : float
        How many times faster int8 products run than float32 ones at the
        operator's blocks (``skgpu_kernel.device.integer_matmul_speedup``; 0: not
        measured, the data lie on no grid or the kernel is not one of distances).
        It chooses how the grid's exact distances are computed, never whether:
        both ways give the same bits.
    cache_dtype : {"float16", "float32", "float64"} or None
        The storage of the cached kernel; None: blocks evaluated at every product.
    n_shards : int
        Devices or ranks the centers are split over.
    streamed : bool
        Rows read from a memory-mapped file in buffers.
    """

    grid: Grid | None = None
    integer_speedup: float = 0.0
    cache_dtype: str | None = None
    n_shards: int = 1
    streamed: bool = False

    @property
    def on_grid(self):
        return self.grid is not None

    @property
    def grid_step(self):
        """The grid's step where the products take it (``kernel_grid_step_``), else None."""
        return None if self.grid is None else self.grid.step

    @property
    def cached(self):
        return self.cache_dtype is not None

    def describe(self):
        """One line for ``verbose``."""
        if self.on_grid:
            how = "int8" if self.grid.integer_products else "exact float32"
            products = (
                f"{how} products on a grid of step {self.grid.step:.4g} (int8 {self.integer_speedup:.2f}x float32's)"
            )
        else:
            products = "float products"
        storage = f"cached in {self.cache_dtype}" if self.cached else "evaluated per product"
        shards = f", {self.n_shards} shards" if self.n_shards > 1 else ""
        streamed = ", rows streamed" if self.streamed else ""
        return f"kernel {storage} from {products}{shards}{streamed}"


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
