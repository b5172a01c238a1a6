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
from dataclasses import dataclass, field

import torch

from ..operators import KernelOperator, OperatorBlocks
from ..out_of_memory import MemoryEvents
from ..planning.stopping import NEVER, StoppingPlan
from .epochs import EpochGuard, Stopping, halved_batch

__all__ = ["KernelLoopResult", "KernelTrainingData", "LoopSettings", "chunked_permutation", "fit_eigenpro"]


@dataclass
class KernelLoopResult:
    """What a kernel loop (EigenPro 2, EigenPro 3 or conjugate gradients) did and measured.

    Attributes
    ----------
    coef : Tensor of shape (p, l)
    n_epochs : int
        Epochs (CG: iterations, one pass over the data each) run.
    n_steps : int
        Updates made (CG: iterations).
    batch_size : int or None
        The batch the loop ended with (after any out-of-memory halving); None for CG.
    learning_rate : float or None
        Step size of the last update; None for CG.
    history : list of dict
    n_projections : int
        Projections onto the centers (EigenPro 3; 0 otherwise).
    converged : bool or None
        Whether CG met its tolerance; None for the EigenPro loops.
    """

    coef: torch.Tensor
    n_epochs: int
    n_steps: int
    batch_size: int | None
    learning_rate: float | None
    history: list = field(default_factory=list)
    n_projections: int = 0
    converged: bool | None = None

    @classmethod
    def direct(cls, coef):
        """The record of a direct solve: the exact solution, no epochs, no steps, no history."""
        return cls(coef, 0, 0, None, None, [], converged=True)


@dataclass(frozen=True)
class LoopSettings:
    """How the EigenPro loops run: batch, step sizes, epochs, validation and progress.

    Parameters
    ----------
    batch_size : int
    learning_rate_for : callable
        ``learning_rate_for(step, batch_size, steps_per_epoch) -> float``, the step
        size of update number ``step`` (counted from ``first_step``) on a batch of
        ``batch_size`` rows, when an epoch takes ``steps_per_epoch`` updates.  The
        last, smaller batch of an epoch passes its own size; after an out-of-memory
        error halves the batch, the halved size and its steps per epoch.  Each
        divergence rollback halves a factor on top of it.
    n_epochs : int
    first_step : int
        Updates made by earlier runs (warm starts): the count ``learning_rate_for``
        continues from.  A rollback rewinds the count with the coefficients.
    validation : callable or None
        ``validation(coef) -> float``, larger is better, scored after every epoch.
    stopping : StoppingPlan
        When to stop before ``n_epochs`` (made by
        :func:`~skgpu_kernel.planning.stopping.plan_stopping`; it monitors the
        validation score when ``validation`` is given).  The default never stops early.
    log : callable or None
        Receives progress messages.
    events : MemoryEvents or None
        Where an out-of-memory halving of the batch, and a halving of the step
        after a divergence, are recorded (the fit's ``fit_attempts_``; see
        :mod:`skgpu_kernel.out_of_memory`); the loops log the halving themselves.
    """

    batch_size: int
    learning_rate_for: Callable
    n_epochs: int
    first_step: int = 0
    validation: Callable | None = None
    stopping: StoppingPlan = NEVER
    log: Callable | None = None
    events: MemoryEvents | None = None

    def guard(self, coef):
        """The epoch guard of a loop on ``coef`` with these settings."""
        return EpochGuard(coef, self.first_step, self.n_epochs, Stopping(self.stopping), self.log, self.events)


@dataclass(frozen=True)
class KernelTrainingData:
    """Device tensors of an EigenPro 2 fit.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, X)`` of the training rows (evaluated, on a grid or cached); rows
        ``[0, s)`` are the preconditioner's subsample.
    Y : Tensor of shape (n, l)
    weights : Tensor of shape (n,) or None
        Per-row factors in (0, 1] on the residual (normalised sample weights).
    alpha : float
        Ridge penalty on the scale of the normalised weights: the iteration solves
        ``(K + alpha W^-1) a = Y``, the normal equations of
        ``sum_i w_i (f(x_i) - y_i)^2 + alpha ||f||^2``.
    """

    operator: KernelOperator
    Y: torch.Tensor
    weights: torch.Tensor | None = None
    alpha: float = 0.0


def fit_eigenpro(kernel, data, coef, preconditioner, loop, column_block_for, generator, fresh_start=True):
    """Run EigenPro 2 epochs, updating ``coef`` in place.

    Parameters
    ----------
    kernel : Kernel
    data : KernelTrainingData
    coef : Tensor of shape (n, l)
        Initial coefficients, updated in place.
    preconditioner : EigenProPreconditioner or None
    loop : LoopSettings
    column_block_for : callable
        ``column_block_for(batch_size) -> int`` columns per kernel block.
    generator : torch.Generator
        Seeds the per-epoch permutations (on the CPU).
    fresh_start : bool
        ``coef`` is zero and the rows are in random order: the first epoch visits
        them in order and evaluates only the non-zero prefix.

    Returns
    -------
    KernelLoopResult
    """
    Y = data.Y
    n = data.operator.shape[0]
    device = Y.device
    leading = preconditioner.subsample_size if preconditioner is not None and preconditioner.n_components else 0
    batch_size = loop.batch_size
    operator = data.operator.with_blocks(OperatorBlocks.whole(batch_size, column_block_for(batch_size)))
    steps_per_epoch = math.ceil(n / batch_size)
    loss_of_zero_model = float((Y * Y).mean()) if Y.numel() else 0.0
    guard = loop.guard(coef)

    def rate_at(step):
        return loop.learning_rate_for(step, batch_size, steps_per_epoch)

    def validation_score():
        return loop.validation(coef)

    while guard.epoch < loop.n_epochs:
        guard.begin_epoch()
        sparse_epoch = fresh_start and guard.epoch == 0
        if sparse_epoch:
            order = torch.arange(n, device=device)
        else:
            order = chunked_permutation(n, EPOCH_CHUNK_ROWS, generator).to(device)
        loss_sum = torch.zeros((), dtype=Y.dtype, device=device)
        position = 0
        while position < n:
            batch = order[position : position + batch_size]
            active = max(leading, position) if sparse_epoch else n
            try:
                update = _step(operator, data, coef, batch, active, leading, preconditioner)
            except (torch.OutOfMemoryError, RuntimeError) as error:
                batch_size = halved_batch(error, batch_size, device, loop.events)
                steps_per_epoch = math.ceil(n / batch_size)
                operator = operator.with_blocks(OperatorBlocks.whole(batch_size, column_block_for(batch_size)))
                if loop.log is not None:
                    rate = guard.rollback * rate_at(guard.step)
                    loop.log(f"out of memory: batch size halved to {batch_size}, step size {rate:.4g}")
                continue
            residual, weighted, correction, penalty = update
            # The last batch of an epoch may be smaller: its step follows its own size.
            scale = (
                guard.rollback * loop.learning_rate_for(guard.step, batch.shape[0], steps_per_epoch) / batch.shape[0]
            )
            coef.index_add_(0, batch, weighted, alpha=-scale)
            if correction is not None:
                coef[:leading].add_(correction, alpha=scale)
            loss_sum += (residual * residual).sum() + penalty
            position += batch.shape[0]
            guard.step += 1

        train_loss = float(loss_sum) / max(n * Y.shape[1], 1)
        if not math.isfinite(train_loss):
            _check_kernel_is_finite(kernel, operator, Y.dtype)
        scored = validation_score if loop.validation is not None else None
        if not guard.end_epoch(train_loss, loss_of_zero_model, rate_at, scored):
            break

    return KernelLoopResult(coef=coef, batch_size=batch_size, **guard.finish(rate_at, loop.first_step))


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


def _step(operator, data, coef, batch, active, leading, preconditioner):
    """Residual, gradient coefficients, subsample correction and penalty share for one batch (no update yet).

    Everything that allocates happens here, so an out-of-memory error leaves the
    coefficients untouched.
    """
    weights = data.weights
    products = operator.matmul(coef[:active], rows=batch, leading=leading)
    predictions, subsample_block = products if leading else (products, None)
    penalty = 0.0
    if data.alpha:
        # The batch's share of the penalty alpha a^T K a, and its gradient alpha a_B.
        penalty = data.alpha * (coef[batch] * predictions).sum()
    residual = predictions.sub_(data.Y[batch])
    weighted = residual if weights is None else residual * weights[batch, None]
    if data.alpha:
        weighted = weighted + data.alpha * coef[batch]
    correction = preconditioner.correction(subsample_block, weighted) if leading else None
    return residual, weighted, correction, penalty


def _check_kernel_is_finite(kernel, operator, dtype):
    """Raise when the kernel itself returns inf or NaN, which no step size can fix."""
    kernel.require_finite(operator.block(slice(0, min(operator.shape[0], 256))), dtype)
