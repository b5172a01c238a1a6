"""EigenPro 2 iteration: preconditioned mini-batch SGD on kernel coefficients.

The loop only sees tensors.  Its caller arranges the rows so that the first ``s``
rows of ``X`` are the Nystrom subsample of the preconditioner and, for a fresh fit,
the rows are already in a random order.  Later epochs visit them in random chunks of
consecutive rows (:func:`chunked_permutation`), which a cached kernel reads fast.
The first epoch of a fresh fit visits the rows in order, and since coefficients beyond the rows visited so far (and
the subsample) are still zero, each step only evaluates the kernel against that
prefix: this is exact and halves the first epoch's cost.  The step size of each
update comes from the caller's scaling rule, as a function of the update count
and of the batch size.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..operators import OperatorBlocks
from ..out_of_memory import MemoryEvents
from ..planning.stopping import NEVER, StoppingPlan
from .epochs import EpochGuard, Stopping
from .solution import Solution

__all__ = ["EigenProPlan", "chunked_permutation", "solve_eigenpro2"]


@dataclass(frozen=True)
class EigenProPlan:
    """How the EigenPro loops (2 and 3) run: batch, step sizes, when they stop and where they report, preconditioner.

    Parameters
    ----------
    batch_size : int
    learning_rate_for : callable
        ``learning_rate_for(step, batch_size, steps_per_epoch) -> float``, the step
        size of update number ``step`` (counted from ``first_step``) on a
        batch of ``batch_size`` rows, when an epoch takes ``steps_per_epoch``
        updates.  The last, smaller batch of an epoch passes its own size.  Each
        divergence rollback halves a factor on top of it.
    n_epochs : int
        Epochs at most.
    first_step : int
        Updates made by earlier runs (warm starts): the count the step sizes
        continue from.  A rollback rewinds the count with the coefficients.
    validation : callable or None
        ``validation(coef) -> float``, larger is better, scored after every epoch.
    stopping : StoppingPlan
        When to stop before ``n_epochs`` (made by
        :func:`~skgpu_kernel.planning.stopping.plan_stopping`; it monitors the
        validation score when ``validation`` is given).  The default never stops early.
    log : callable or None
        Receives progress messages.
    events : MemoryEvents or None
        Where a halving of the step after a divergence is recorded (the fit's
        ``fit_attempts_``; see :mod:`skgpu_kernel.out_of_memory`).
    preconditioner : EigenProPreconditioner or None
        The data preconditioner on the first ``s`` rows (EigenPro 2) or centers
        (EigenPro 3); None: plain SGD.
    coef_init : Tensor of shape (p, l) or None
        The starting coefficients, updated in place.  None: zeros (EigenPro 2: a
        fresh start, whose first epoch visits the rows in order; EigenPro 3 needs
        them given).
    ridge : float
        EigenPro 2's penalty ``alpha`` on the scale of the normalised weights
        (``alpha / max(w)``): the iteration solves ``(K + ridge W^-1) a = Y``, the
        normal equations of ``sum_i w_i (f(x_i) - y_i)^2 + ridge ||f||^2``.
    column_block_for : callable or None
        EigenPro 2: ``column_block_for(batch_size) -> int`` columns per kernel block.
    generator : torch.Generator or None
        EigenPro 2: seeds the per-epoch permutations (on the CPU).
    projection : ExactProjection or IterativeProjection or None
        EigenPro 3: ``projection(h) -> (theta, remainder)`` solving ``K(Z, Z) theta = h``.
    n_temporary : int
        EigenPro 3: temporary centers kept between projections (at least the batch size).
    """

    batch_size: int
    learning_rate_for: Callable
    n_epochs: int
    first_step: int = 0
    validation: Callable | None = None
    stopping: StoppingPlan = NEVER
    log: Callable | None = None
    events: MemoryEvents | None = None
    preconditioner: object = None
    coef_init: torch.Tensor | None = None
    ridge: float = 0.0
    column_block_for: Callable | None = None
    generator: torch.Generator | None = None
    projection: object = None
    n_temporary: int = 0

    def guard(self, coef):
        """The epoch guard of a loop on ``coef``: its epochs, stopping plan, log and record."""
        return EpochGuard(coef, self.first_step, self.n_epochs, Stopping(self.stopping), self.log, self.events)


def solve_eigenpro2(operator, targets, plan):
    """Run EigenPro 2 epochs on ``K(X, X)``.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, X)`` of the training rows (evaluated, on a grid or cached); rows
        ``[0, s)`` are the preconditioner's subsample.
    targets : Targets
    plan : EigenProPlan
        With ``coef_init`` None the rows must be in random order (a fresh start):
        the first epoch visits them in order and evaluates only the non-zero prefix.

    Returns
    -------
    Solution
    """
    Y, n, preconditioner = targets.Y, operator.shape[0], plan.preconditioner
    device = Y.device
    fresh_start, coef = plan.coef_init is None, plan.coef_init
    if fresh_start:
        coef = torch.zeros(n, Y.shape[1], dtype=Y.dtype, device=device)
    leading = preconditioner.subsample_size if preconditioner is not None and preconditioner.n_components else 0
    batch_size = plan.batch_size
    operator = operator.with_blocks(OperatorBlocks.whole(batch_size, plan.column_block_for(batch_size)))
    steps_per_epoch = math.ceil(n / batch_size)
    loss_of_zero_model = float((Y * Y).mean()) if Y.numel() else 0.0
    guard = plan.guard(coef)

    def rate_at(step):
        return plan.learning_rate_for(step, batch_size, steps_per_epoch)

    def validation_score():
        return plan.validation(coef)

    while guard.epoch < plan.n_epochs:
        guard.begin_epoch()
        sparse_epoch = fresh_start and guard.epoch == 0
        if sparse_epoch:
            order = torch.arange(n, device=device)
        else:
            order = chunked_permutation(n, EPOCH_CHUNK_ROWS, plan.generator).to(device)
        loss_sum = torch.zeros((), dtype=Y.dtype, device=device)
        position = 0
        while position < n:
            batch = order[position : position + batch_size]
            active = max(leading, position) if sparse_epoch else n
            residual, weighted, correction, penalty = _step(operator, targets, coef, batch, active, leading, plan)
            # The last batch of an epoch may be smaller: its step follows its own size.
            scale = (
                guard.rollback * plan.learning_rate_for(guard.step, batch.shape[0], steps_per_epoch) / batch.shape[0]
            )
            coef.index_add_(0, batch, weighted, alpha=-scale)
            if correction is not None:
                coef[:leading].add_(correction, alpha=scale)
            loss_sum += (residual * residual).sum() + penalty
            position += batch.shape[0]
            guard.step += 1

        train_loss = float(loss_sum) / max(n * Y.shape[1], 1)
        if not math.isfinite(train_loss):
            operator.require_finite(Y.dtype)
        scored = validation_score if plan.validation is not None else None
        if not guard.end_epoch(train_loss, loss_of_zero_model, rate_at, scored):
            break

    return Solution(coef=coef, batch_size=batch_size, **guard.finish(rate_at, plan.first_step))


# Later epochs visit the (once shuffled) rows in chunks of this many consecutive
# rows, the chunks in a new random order each epoch: a step on a cached kernel then
# reads runs of contiguous rows, at the speed of a plain matrix product (random rows
# had to be gathered first, 1.4 to 2 times slower on the CPU; see CachedOperator).
EPOCH_CHUNK_ROWS = 32


def chunked_permutation(n, chunk, generator):
    """``range(n)`` in chunks of ``chunk`` consecutive indices, the chunks randomly permuted."""
    starts = torch.randperm(math.ceil(n / chunk), generator=generator) * chunk
    order = (starts[:, None] + torch.arange(chunk)).reshape(-1)
    return order[order < n]


def _step(operator, targets, coef, batch, active, leading, plan):
    """Residual, gradient coefficients, subsample correction and penalty share for one batch (no update yet).

    Everything that allocates happens here, so an out-of-memory error leaves the
    coefficients untouched.
    """
    weights, ridge = targets.weights, plan.ridge
    products = operator.matmul(coef[:active], rows=batch, leading=leading)
    predictions, subsample_block = products if leading else (products, None)
    penalty = 0.0
    if ridge:
        # The batch's share of the penalty ridge a^T K a, and its gradient ridge a_B.
        penalty = ridge * (coef[batch] * predictions).sum()
    residual = predictions.sub_(targets.Y[batch])
    weighted = residual if weights is None else residual * weights[batch, None]
    if ridge:
        weighted = weighted + ridge * coef[batch]
    correction = plan.preconditioner.correction(subsample_block, weighted) if leading else None
    return residual, weighted, correction, penalty
