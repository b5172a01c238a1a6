"""The operator plan: how every ``K(rows, centers) @ V`` of a fit is computed, decided once.

Every solver reads its kernel through operators (:mod:`skgpu_kernel.operators`).
What kind they are is decided here, by one pure function, after the device is
measured (:func:`skgpu_kernel.operators.measure_operator`: the grid the rows and
centers lie on, and the speed of int8 products at the operator's blocks, as the
capacity probe measures the batch) and after the memory layout has placed the
cache:

* **products**: blocks from the grid's exact distances wherever the rows lie on one
  (computed by int8 products where they pay, :func:`skgpu_kernel.operator_facts.integer_products_pay`:
  at least ``INTEGER_PRODUCTS_MIN_SPEEDUP`` times faster at the measured blocks, the
  one rule of the fit and ``predict``, else by exact float32 products of the codes:
  the same bits, so that no model depends on that timing), else float blocks from
  the kernel's prepared rows;
* **storage**: the cache the layout keeps (EigenPro 2's ``K(X, X)``, EigenPro 3's
  ``K(X, Z)``, CG's ``K(X, Z)``) and its dtype, filled by either kind of product,
  or none;
* **shards**: the centers split over the devices or the ranks of a process group;
* **streamed**: rows read from a memory-mapped file in buffers, always in float
  blocks (the rows are not on the device to be checked against a grid).

The grid is measured at one block shape per fit (:func:`operator_probe_shape`), the
cache fill's, before the layout: its codes and its int32 distance blocks take memory,
which the layout reserves only where the grid is taken (:func:`operator_problem`).
Nothing is patched afterwards: the paths build their operators from the plan, and
the shell records it (``kernel_grid_step_``, ``kernel_cached_``,
``kernel_cache_dtype_``).
"""

import dataclasses

from ..operator_facts import OperatorPlan, integer_products_pay
from .kernel import CACHE_DTYPE_NAMES, CACHE_FILL_COLUMNS, CACHE_FILL_ROWS, KernelProblem

__all__ = ["OperatorPlan", "operator_probe_shape", "operator_problem", "plan_operator"]


def operator_probe_shape(problem: KernelProblem):
    """``(rows, columns)`` of the block the grid's int8 products are timed at: a cache fill's block.

    Bounded by the rows and the centers of the largest shard.  The fill's block is
    also a CG pass's and (in size) a typical EigenPro step's.
    """
    n_columns = problem.n_rows if problem.n_centers is None else problem.n_local_centers
    return min(CACHE_FILL_ROWS, problem.n_rows), min(CACHE_FILL_COLUMNS, n_columns)


def plan_operator(problem: KernelProblem, measurements: OperatorPlan, cache_itemsize=0):
    """The operator plan of a fit: products, storage, shards, streaming.

    Parameters
    ----------
    problem : KernelProblem
    measurements : OperatorPlan
        What the device measured (``grid`` and ``integer_speedup``,
        :func:`skgpu_kernel.operators.measure_operator`).
    cache_itemsize : int, default=0
        Bytes per entry of the cache the memory layout keeps (0: none).

    Returns
    -------
    OperatorPlan
    """
    grid = None
    if measurements.grid is not None and not problem.streamed:
        pays = integer_products_pay(measurements.integer_speedup)
        grid = dataclasses.replace(measurements.grid, integer_products=pays)
    return dataclasses.replace(
        measurements,
        grid=grid,
        cache_dtype=CACHE_DTYPE_NAMES.get(cache_itemsize) if cache_itemsize else None,
        n_shards=problem.n_shards,
        streamed=problem.streamed,
    )


def operator_problem(problem: KernelProblem, measurements: OperatorPlan):
    """``problem`` with the memory of the grid's codes and int32 distance blocks where the plan takes the grid."""
    if not plan_operator(problem, measurements).on_grid:
        return problem
    return dataclasses.replace(problem, extra_blocks=problem.extra_blocks + 1, grid_codes=True)
