"""Kernel operators: how ``K(rows, centers) @ V`` is computed, one object per kind.

Every product of a kernel matrix with coefficients in the package goes through an
operator (as Falkon's ``kernel.mmv`` goes through ``fmmv``): the solvers, the
preconditioner, the validation scores and ``predict`` call :meth:`KernelOperator.matmul`
or read :meth:`KernelOperator.block` and never branch on how the entries come to be.
The kinds:

* :class:`EvaluatedOperator`: float blocks from the kernel's prepared rows and
  centers (one matrix product and the kernel's profile per block);
* :class:`GridOperator`: blocks from exact squared distances of data on a common
  grid, by int8 products (:mod:`skgpu_kernel.grid`); only kernels that declare
  that they are functions of the raw rows' squared Euclidean distances
  (``Kernel.from_distances``) are accepted;
* :class:`CachedOperator`: ``K(X, Z)`` computed once by either of the above
  (:meth:`CachedOperator.fill`), stored in the training dtype or float16, and read
  by every later product;
* :class:`ShardedOperator`: the centers split in contiguous shards over devices
  or the ranks of a process group (:class:`CenterShards`), one operator of any of
  the kinds above per shard, products summed (an all-reduce across ranks);
* :class:`StreamedOperator`: host rows (an array, a memory map, a sparse matrix)
  that never sit on the device whole, moved there in fixed-size blocks, each
  multiplied by an operator of its own (``predict``).

Which kind a fit uses is planned once
(:func:`skgpu_kernel.planning.operator.plan_operator`) from what
:func:`measure_operator` measures on the device, and the operators of a plan are
made in one place, :class:`CenterOperators` (``operators/factory.py``; per shard in
:class:`CenterShards`).

Products are blocked: ``blocks.rows`` rows of the operator are prepared at once,
and ``blocks.columns`` columns of ``K`` are evaluated at once; each row of a result
depends only on that row and on the column blocking, so results do not depend on
the row block.
"""

from ..operator_facts import CPU_READ_ENTRIES, CPU_WIDE_COLUMNS, OperatorBlocks, OperatorPlan, shard_bounds
from .core import (
    CUDA_READ_ENTRIES,
    BlockBuffer,
    CachedOperator,
    EvaluatedOperator,
    GridOperator,
    KernelOperator,
    csr_to_torch,
    filled_entries,
    kernel_matrix,
    kernel_matrix_product,
    map_row_blocks,
    measure_operator,
    symmetrised_product,
    widened,
    widened_to_multiple,
)
from .factory import CenterOperators, center_codes
from .sharded import CenterShards, ShardedBlock, ShardedOperator, ShardLayout
from .streamed import StreamedOperator

__all__ = [
    "CPU_READ_ENTRIES",
    "CPU_WIDE_COLUMNS",
    "CUDA_READ_ENTRIES",
    "BlockBuffer",
    "CachedOperator",
    "CenterOperators",
    "CenterShards",
    "EvaluatedOperator",
    "GridOperator",
    "KernelOperator",
    "OperatorBlocks",
    "OperatorPlan",
    "ShardLayout",
    "ShardedBlock",
    "ShardedOperator",
    "StreamedOperator",
    "center_codes",
    "csr_to_torch",
    "filled_entries",
    "kernel_matrix",
    "kernel_matrix_product",
    "map_row_blocks",
    "measure_operator",
    "shard_bounds",
    "symmetrised_product",
    "widened",
    "widened_to_multiple",
]
