"""The operator stage: the operators of ``K(X, X)`` and ``K(X, Z)`` a plan asks for (the cache and grid branches)."""

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..device import is_out_of_memory, matmul_gflops, synchronize
from ..operators import (
    CenterOperators,
    OperatorBlocks,
    filled_entries,
)
from ..operators.row_blocks import CachedRowBlocks, KernelRowBlocks
from ..out_of_memory import in_row_blocks
from ..planning.kernel import CACHE_DTYPE_NAMES, CACHE_FILL_COLUMNS
from ..planning.solver import CG_ROW_BLOCK


class EveryPointOperators:
    """``K(X, X)`` with a center at every training row (and ``K(X_val, X)``): what EigenPro 2 and CG there read.

    The training rows on the device in the fit's order, the problem's sizes, and
    the operators the run's plan asks for (:meth:`build`): the one place the
    cache and grid branches of ``K(X, X)`` are taken.

    Attributes
    ----------
    problem : KernelProblem
        The sizes, before the operator is measured (the plan's layout holds the
        measured problem).
    train : operator or None
        ``K(X, X)`` once built (:meth:`build`), until :meth:`release`.
    held_out : operator or None
        ``K(X_val, X)`` with held-out rows, likewise; None without them.
    validation : KernelFitInput or None
        The held-out rows and targets on the device, likewise.
    """

    def __init__(self, context):
        self.context = context
        data = context.prepared
        n_validation = 0 if data.validation is None else data.validation.X.shape[0]
        self.problem = context.problem_with(n_validation=n_validation, unit_bounded_kernel=context.kernel.unit_bounded)
        self.X_dev = context.rows(data.order)
        self.centers_dev = context.kernel.prepare_centers(self.X_dev)
        # The operator plan once the run is planned, and the rows' grid codes where it takes the grid.
        self.operator_plan, self.center_codes = None, None
        self.train = self.held_out = self.validation = None

    def centers_host(self):
        return self.context.prepared.X[self.context.prepared.order]

    def build(self, plan):
        """``train`` and ``held_out``: the operators of ``K(X, X)`` and ``K(X_val, X)`` the plan asks for.

        Cached when the plan says so; a cache the device refuses is recorded and the
        fit planned again without it (:meth:`AttemptContext.cached_or_planned_again`).
        """
        self.validation = self.context.validation_tensors()
        self.operator_plan = plan.operator
        self._evaluated_operators(plan)
        if plan.cached:
            self.context.cached_or_planned_again(lambda: self._caches(plan), plan, "K(X, X)")

    def release(self):
        """Drop the operators and the held-out rows: the kernel cache goes before the centers are copied out.

        One copy of X less at the peak.
        """
        self.train = self.held_out = self.validation = None

    def device_cache(self, coef):
        return self.context.prediction_tensors(self.centers_dev, coef, self.operator_plan, self.center_codes)

    def held_out_score(self):
        """``score(coef)`` of ``K(X_val, X) @ coef`` against the held-out targets (row blocks halved out of memory).

        None without held-out rows.
        """
        if self.validation is None:
            return None
        held_out, n_rows = self.held_out, self.held_out.shape[0]

        def predict(coef, row_block):
            return in_row_blocks(lambda rows: held_out.matmul(coef, rows=rows), n_rows, row_block)

        return self.context.held_out_score(predict, n_rows, self.validation.Y)

    def _evaluated_operators(self, plan):
        """``train`` and ``held_out`` (or None) as operators that evaluate their blocks, on the grid or not.

        Held-out rows off the training rows' grid are evaluated in float blocks.
        """
        blocks = OperatorBlocks(plan.batch_size, plan.column_block)
        # measure_operator checked that the rows lie on the plan's grid, where it takes one.
        factory = CenterOperators.of(self.context.kernel, self.X_dev, self.operator_plan.grid, self.centers_dev)
        self.center_codes = factory.codes
        self.train = factory.operator(self.X_dev, blocks, factory.codes)
        validation, self.held_out = self.validation, None
        if validation is not None:
            self.held_out = factory.operator(validation.X, blocks, factory.encode(validation.X))

    def _product_rate(self, entries, seconds, block_shape):
        """``entries`` kernel entries in ``seconds``: their products' GFLOP/s against ``torch.mm``'s at the blocks."""
        n_features, seconds = self.X_dev.shape[1], max(seconds, 1e-9)
        rate = 2.0 * entries * n_features / seconds / 1e9
        rows, columns = (min(size, self.problem.n_rows) for size in block_shape)
        achieved = f"{entries / seconds / 1e9:.2g} G entries/s, {rate:.3g} GFLOP/s"
        try:
            peak = matmul_gflops(self.context.device, self.context.runtime.dtype, rows, n_features, columns)
        except (torch.OutOfMemoryError, RuntimeError) as error:  # a report never stops the fit
            if not is_out_of_memory(error):
                raise
            return f"{achieved} (torch.mm not timed at these blocks: out of memory)"
        return f"{achieved} = {rate / peak:.0%} of torch.mm's {peak:.3g} at these blocks"

    def report_epochs(self, result, plan, operator):
        """``verbose``: the rate a typical epoch reached, so that a slow machine reads as such."""
        steady = result.history[1:] or result.history  # the first epoch of a fresh fit reads half the rows
        runtime = self.context.runtime
        if runtime.log is None or not steady:
            return
        seconds = float(np.median([record["seconds"] for record in steady]))
        if operator.kind == "cached":
            gigabytes = operator.nbytes / 1e9
            rate = f"read K(X, X) ({gigabytes:.3g} GB) at {gigabytes / max(seconds, 1e-9):.3g} GB/s"
        else:
            n = self.problem.n_rows
            # Out of memory halves the plan's batch; CG has none (its row blocks are the plan's).
            rows = plan.batch_size if result.batch_size is None else min(result.batch_size, plan.batch_size)
            rate = f"evaluated K(X, X): {self._product_rate(n * n, seconds, (rows, plan.column_block))}"
        runtime.log(f"[{self.context.parameters.name}] a typical epoch ({seconds:.3g} s) {rate}")

    def _caches(self, plan):
        """``train`` and ``held_out`` replaced by the :class:`CachedOperator` objects they fill."""
        tic = time.perf_counter()
        storage = getattr(torch, CACHE_DTYPE_NAMES[plan.cache_itemsize])
        blocks = (plan.row_block, CACHE_FILL_COLUMNS)
        train = self.train.cached(storage, *blocks, symmetric=True)
        held_out = None if self.held_out is None else self.held_out.cached(storage, *blocks)
        synchronize(self.context.device)
        log = self.context.runtime.log
        if log is not None:
            seconds = time.perf_counter() - tic
            n_rows, n_columns = train.shape
            rows = n_rows + (0 if held_out is None else held_out.shape[0])
            entries = filled_entries(n_rows, n_columns, plan.row_block, symmetric=True)
            entries += 0 if held_out is None else held_out.values.numel()
            log(
                f"[{self.context.parameters.name}] kernel cached: {rows} x {n_columns}, "
                f"{self.operator_plan.describe()}, {seconds:.1f} s, {self._product_rate(entries, seconds, blocks)}"
            )
        self.train, self.held_out = train, held_out


@dataclass(frozen=True)
class CentersOperator:
    """``K(X, Z)`` in row blocks of CG's passes, from the grid where the operator plan takes it (``codes``: Z's)."""

    operator: object
    plan: object
    codes: torch.Tensor | None = None

    @classmethod
    def build(cls, context, plan, X, centers):
        factory = CenterOperators.of(context.kernel, centers, plan.grid)
        blocks = OperatorBlocks.whole(CG_ROW_BLOCK, centers.shape[0])
        operator = factory.operator(X, blocks, factory.encode(X, on_grid=True))
        return cls(operator, plan, factory.codes)


def centers_row_blocks(context, operator, centers):
    """CG's source of ``K(X, Z)`` row blocks: stored where the operator plan caches it, else evaluated per pass.

    A cache the device refuses is recorded and evaluated per pass instead, the
    same blocks bit for bit (:meth:`AttemptContext.cached_or_evaluated`).
    """
    evaluated = KernelRowBlocks(operator.operator, centers, CG_ROW_BLOCK)
    if not operator.plan.cached:
        return evaluated
    fill = lambda: CachedRowBlocks.computed(evaluated)  # noqa: E731
    return context.cached_or_evaluated(fill, evaluated, "K(X, Z)")


def stored_plan(operator, rows):
    """The operator plan as carried out: without its cache where the device refused the stored row blocks."""
    if operator.plan.cached and isinstance(rows, KernelRowBlocks):
        return dataclasses.replace(operator.plan, cache_dtype=None)
    return operator.plan
