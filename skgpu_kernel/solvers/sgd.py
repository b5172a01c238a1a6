"""Buffered mini-batch gradient descent (BMGD) on linear models.

Each pass over the data arrives as a sequence of buffers already on the device
(the caller's iterable, typically a :class:`~skgpu_kernel.buffer.BufferPrefetcher`
that loads the next buffer while this one trains).  Every buffer is used for
``n_rounds`` rounds; each round shuffles the buffer and takes one step per
mini-batch on the mean loss of the batch plus ``alpha / 2 ||W||^2``.  The loop only
sees tensors: no input validation, no scikit-learn.
"""

import math
import time
from dataclasses import dataclass, field, replace

import torch

from ..blockwise import linear_scores
from ..device import throughput_saturation_batch
from ..out_of_memory import out_of_memory_reason, release_cached_memory
from ..planning.stopping import NEVER, StoppingPlan
from .epochs import EpochClock, Stopping, epoch_record, format_record
from .losses import HuberLoss, SquaredLoss

__all__ = [
    "GradientPieces",
    "SGDOutcome",
    "SGDResult",
    "SGDRun",
    "apply_gradient",
    "batch_gradient",
    "buffer_batches",
    "check_finite_loss",
    "fit_buffered_sgd",
    "linear_spectrum",
    "measure_sgd_capacity",
    "penalised_loss",
    "transposed_product",
]


@dataclass(frozen=True)
class SGDRun:
    """How a BMGD loop steps and when it stops: everything but the data and the coefficients.

    Built once by the estimator from its plan; :func:`fit_buffered_sgd` and the
    parallel workers run it.

    Attributes
    ----------
    loss : callable
        ``loss(scores, targets) -> (loss per sample, dL/dscores)``; see
        :mod:`skgpu_kernel.solvers.losses`.
    rule : ScalingRule
        ``rule(step, context) -> learning rate``.
    context : ScheduleContext
        The plan's schedule context; its ``batch_size`` is the run's batch.
    n_rounds : int
        Rounds ``R`` of mini-batch steps on each buffer.
    n_epochs : int
        Passes over the data.
    alpha : float
        L2 penalty strength (0 for none).
    fit_intercept : bool
    shuffle : bool, default=True
    start_step : int, default=0
        Updates taken before this run (the schedule continues from there).
    stopping : StoppingPlan, default: never
        When to stop before ``n_epochs``: the package's one rule
        (:mod:`skgpu_kernel.planning.stopping`), judged after every pass by
        :func:`fit_buffered_sgd` and by every parallel worker.
    """

    loss: object
    rule: object
    context: object
    n_rounds: int
    n_epochs: int
    alpha: float
    fit_intercept: bool
    shuffle: bool = True
    start_step: int = 0
    stopping: StoppingPlan = NEVER

    @property
    def batch_size(self):
        """The planned mini-batch (the last batch of a buffer may be smaller)."""
        return self.context.batch_size

    def learning_rate(self, step, batch_size):
        """The rule's learning rate for update ``step`` on a batch of ``batch_size`` rows."""
        if batch_size == self.context.batch_size:
            return self.rule(step, self.context)
        return self.rule(step, replace(self.context, batch_size=batch_size))


@dataclass
class SGDResult:
    """What a run of :func:`fit_buffered_sgd` did and measured.

    ``batch_size`` is the mini-batch the run ended with: the planned one, or less
    after out-of-memory errors halved it.  ``converged`` is False where the
    stopping rule could stop the run and its last epoch came first.
    """

    n_epochs: int
    n_steps: int
    batch_size: int
    learning_rate: float
    io_wait_seconds: float
    seconds: float
    history: list = field(default_factory=list)
    converged: bool = True


@dataclass(frozen=True)
class SGDOutcome:
    """What a runner of a BMGD fit hands back: the run, the model, the runner's own facts.

    Attributes
    ----------
    result : SGDResult
    coef : Tensor of shape (d, l)
    intercept : Tensor of shape (l,)
    facts : dict
        Fitted attributes only this runner reports, by name (the strategy and its
        workers' figures for a parallel fit).
    """

    result: SGDResult
    coef: torch.Tensor
    intercept: torch.Tensor
    facts: dict


def buffer_batches(X, targets, weights, batch_size, shuffle, generator):
    """The mini-batches ``(X, targets, weights)`` of one round over a buffer.

    With ``shuffle`` the rows are visited in a fresh permutation drawn from
    ``generator`` (on the CPU, so that results do not depend on the device);
    the last batch may be smaller.
    """
    order = _round_order(X.shape[0], shuffle, generator, X.device)
    for start in range(0, X.shape[0], batch_size):
        yield _batch_rows((X, targets, weights), order, start, start + batch_size)


def _round_order(rows, shuffle, generator, device):
    """The visiting order of one round over ``rows`` rows: a permutation from ``generator``, or None (in order)."""
    return torch.randperm(rows, generator=generator).to(device) if shuffle else None


def _batch_rows(buffer, order, start, stop):
    """Positions ``start:stop`` of a round over ``buffer = (X, targets, weights)`` in ``order`` (None: in order)."""
    X, targets, weights = buffer
    stop = min(stop, X.shape[0])
    if order is None:
        return _row_range(X, start, stop), targets[start:stop], None if weights is None else weights[start:stop]
    batch = order[start:stop]
    return (
        X.index_select(0, batch),
        targets.index_select(0, batch),
        None if weights is None else weights.index_select(0, batch),
    )


def check_finite_loss(loss_sum, step, rate, alpha=0.0):
    """Raise when the accumulated training loss is no longer finite (a diverging step).

    Where ``rate * alpha`` is above 1 the penalty's shrinkage alone overshoots (each
    update multiplies the coefficients by ``1 - rate * alpha``), so the message
    names both.
    """
    if torch.isfinite(loss_sum):
        return
    if rate * alpha > 1.0:
        raise ValueError(
            f"The training loss became non-finite at update {step}: the learning rate {rate:.4g} times the "
            f"penalty alpha={alpha:.4g} is {rate * alpha:.4g}, above 1, so each update's shrinkage "
            "1 - rate * alpha overshoots zero. Lower alpha, or lower the step (the scaling rule's base_lr or "
            "scale)."
        )
    raise ValueError(
        f"The training loss became non-finite at update {step} with learning rate "
        f"{rate:.4g}: the step size is too large for this data. Lower the "
        "scaling rule's base_lr (or its scale), or standardise the features."
    )


def _row_range(X, start, stop):
    """Rows ``start:stop`` of a dense or sparse COO tensor (sparse tensors have no slicing)."""
    if X.is_sparse:
        return X.index_select(0, torch.arange(start, stop, device=X.device))
    return X[start:stop]


def transposed_product(X, gradient):
    """``X^T G`` for a dense or sparse (COO) ``X``."""
    if X.is_sparse:
        return torch.sparse.mm(X.t(), gradient)
    return X.T @ gradient


def fit_buffered_sgd(coef, intercept, open_pass, run, generator, validation=None, log=None):
    """Run BMGD passes, updating ``coef`` and ``intercept`` in place.

    Parameters
    ----------
    coef : Tensor of shape (d, l)
    intercept : Tensor of shape (l,)
    open_pass : callable
        ``open_pass(epoch)`` returns a context manager and iterable of buffers
        ``(X, targets, weights)`` (``weights`` may be None) with an
        ``io_wait_seconds`` attribute: the time spent waiting for data.
    run : SGDRun
    generator : torch.Generator
        Seeds the shuffles within buffers (on the CPU).
    validation : callable or None
        ``validation(coef, intercept) -> float``, larger is better; the stopping
        criterion then uses it and the best coefficients are kept.
    log : callable or None
        Receives one progress line per pass (:func:`~skgpu_kernel.solvers.epochs.format_record`)
        and a line for each halving of the batch.

    Returns
    -------
    SGDResult

    Raises
    ------
    ValueError
        When the loss becomes non-finite (the step size diverges).  ``coef`` is
        then invalid; callers keep their previous coefficients.

    Notes
    -----
    A step that runs out of device memory is retried from the same row with half
    the batch, and the rest of the run keeps the halved batch (the scaling rule
    gives its learning rate at that size).
    """
    stopping = Stopping(run.stopping)
    clock = EpochClock(coef.device)
    progress, history, total_io_wait = _Progress(run.start_step, run.batch_size), [], 0.0
    started = time.perf_counter()
    for epoch in range(run.n_epochs):
        clock.start()
        with open_pass(epoch) as buffers:
            loss_sum, n_seen = _train_pass(coef, intercept, buffers, run, generator, progress, log)
            io_wait = float(buffers.io_wait_seconds)
        total_io_wait += io_wait
        seconds = clock.seconds()
        record = epoch_record(
            epoch + 1,
            progress.step,
            penalised_loss(loss_sum, n_seen, coef, run.alpha),
            progress.learning_rate(run, progress.step - 1),
            seconds,
            None if validation is None else float(validation(coef, intercept)),
            io_wait_seconds=io_wait,
            samples_per_second=n_seen / max(seconds, 1e-12),
        )
        history.append(record)
        if log is not None:
            log(format_record(record, run.n_epochs))
        if stopping.should_stop(record, (coef, intercept), log):
            break
        progress.step_factor = stopping.step_factor
    stopping.restore_best((coef, intercept))
    steps = progress.step - run.start_step
    return SGDResult(
        n_epochs=len(history),
        n_steps=steps,
        batch_size=progress.batch_size,
        learning_rate=progress.learning_rate(run, progress.step - 1) if steps else math.nan,
        converged=stopping.converged,
        io_wait_seconds=total_io_wait,
        seconds=time.perf_counter() - started,
        history=history,
    )


@dataclass
class _Progress:
    """Where a run stands: its next update, its mini-batch (halved on out-of-memory), its annealed step factor."""

    step: int
    batch_size: int
    step_factor: float = 1.0

    def learning_rate(self, run, step, batch_size=None):
        """The rule's rate for update ``step`` (on this batch, or ``batch_size`` rows) times the step factor."""
        return self.step_factor * run.learning_rate(step, self.batch_size if batch_size is None else batch_size)


def _train_pass(coef, intercept, buffers, run, generator, progress, log):
    """One pass: ``n_rounds`` rounds of mini-batch steps on each buffer; the summed loss and the rows seen."""
    loss_sum = torch.zeros((), dtype=coef.dtype, device=coef.device)
    n_seen, rate = 0, math.nan
    for buffer in buffers:
        rows, device = buffer[0].shape[0], buffer[0].device
        for _ in range(run.n_rounds):
            order, start = _round_order(rows, run.shuffle, generator, device), 0
            while start < rows:
                # The step's allocations (the batch's rows, scores, gradients) all come
                # before its in-place update, so a step that fails left the model as it was.
                try:
                    batch = _batch_rows(buffer, order, start, start + progress.batch_size)
                    rate = progress.learning_rate(run, progress.step, batch[0].shape[0])
                    batch_loss = _step(run.loss, coef, intercept, batch, rate, run.alpha, run.fit_intercept)
                except (torch.OutOfMemoryError, RuntimeError) as error:
                    progress.batch_size = _halved_batch(error, progress.batch_size, device)
                    if log is not None:
                        log(f"out of memory: batch size halved to {progress.batch_size}")
                    continue
                loss_sum += batch_loss
                start += batch[0].shape[0]
                progress.step += 1
            n_seen += rows
            check_finite_loss(loss_sum, progress.step, rate, run.alpha)
    return loss_sum, n_seen


def penalised_loss(loss_sum, n_samples, coef, alpha):
    """``train_loss`` of a history record: the mean of ``n_samples`` summed losses plus ``alpha / 2 ||W||^2``."""
    train_loss = float(loss_sum) / max(n_samples, 1)
    if alpha:
        train_loss += 0.5 * alpha * float((coef * coef).sum())
    return train_loss


def batch_gradient(loss, coef, intercept, X, targets, weights=None):
    """Summed loss and summed gradients of a batch (divide by the batch size for the mean).

    Returns
    -------
    loss_sum : Tensor (scalar)
    coef_gradient : Tensor of shape (d, l)
    intercept_gradient : Tensor of shape (l,)
    """
    values, gradient = loss(linear_scores(X, coef, intercept), targets)
    if weights is not None:
        gradient = gradient * weights[:, None]
        values = values * weights
    return values.sum(), transposed_product(X, gradient), gradient.sum(dim=0)


class GradientPieces:
    """A batch's summed gradient, taken in row pieces that shrink on out-of-memory errors.

    Where every worker's step must stay in step with the others' (a collective per
    step, or a synchronisation every few steps), a worker cannot take a smaller
    batch alone.  It keeps the batch and its step, and computes the batch's summed
    loss and gradients in pieces of rows instead: out of device memory, the piece
    is halved and the batch computed again; the rest of the run keeps the smaller
    piece.  While the whole batch fits, this is :func:`batch_gradient` itself.

    Parameters
    ----------
    loss : callable
    log : callable or None
        Receives a line for each halving of the piece.
    """

    def __init__(self, loss, log=None):
        self.loss, self.log = loss, log
        self.rows = None  # rows per piece; None: the whole batch

    def __call__(self, coef, intercept, batch):
        """``(loss_sum, coef_gradient, intercept_gradient)`` of ``batch = (X, targets, weights)``."""
        while True:
            try:
                return self._summed(coef, intercept, batch)
            except (torch.OutOfMemoryError, RuntimeError) as error:
                self.rows = _halved_batch(error, self.rows or batch[0].shape[0], batch[0].device)
                if self.log is not None:
                    self.log(f"out of memory: gradients taken in pieces of {self.rows} rows")

    def _summed(self, coef, intercept, batch):
        X, targets, weights = batch
        if self.rows is None or self.rows >= X.shape[0]:
            return batch_gradient(self.loss, coef, intercept, X, targets, weights)
        parts = [
            batch_gradient(self.loss, coef, intercept, *_batch_rows(batch, None, start, start + self.rows))
            for start in range(0, X.shape[0], self.rows)
        ]
        return tuple(torch.stack(values).sum(dim=0) for values in zip(*parts, strict=True))


def apply_gradient(coef, intercept, coef_gradient, intercept_gradient, batch_size, rate, alpha, fit_intercept):
    """``W -= rate (G / m + alpha W)`` and ``b -= rate g / m`` from summed gradients of ``m`` samples."""
    scale = rate / batch_size
    if fit_intercept:
        intercept.sub_(intercept_gradient, alpha=scale)
    if alpha:
        coef.mul_(1.0 - rate * alpha)
    coef.sub_(coef_gradient, alpha=scale)


def _step(loss, coef, intercept, batch, rate, alpha, fit_intercept):
    """One gradient step on the mean loss of ``batch = (X, targets, weights)``; returns its summed loss before it."""
    loss_sum, coef_gradient, intercept_gradient = batch_gradient(loss, coef, intercept, *batch)
    apply_gradient(coef, intercept, coef_gradient, intercept_gradient, batch[0].shape[0], rate, alpha, fit_intercept)
    return loss_sum


def linear_spectrum(X, weights, fit_intercept, generator, n_iter=30):
    """``beta`` and ``lambda_1`` of the square loss's Hessian, from sample rows.

    With rows ``x_i`` (augmented with 1 when fitting an intercept) and weights
    ``w_i``, ``beta = max_i w_i ||x_i||^2`` bounds the curvature of one sample's
    loss and ``lambda_1`` is the top eigenvalue of ``sum_i w_i x_i x_i^T / m``
    (power iteration, Rayleigh quotient).  These are the quantities EigenPro's
    step rule needs; the caller scales them by the loss's curvature.

    Parameters
    ----------
    X : Tensor of shape (m, d), dense or sparse COO
    weights : Tensor of shape (m,) or None
    fit_intercept : bool
    generator : torch.Generator
        Seeds the power iteration's start.
    n_iter : int, default=30

    Returns
    -------
    beta, top_eigenvalue : float
    """
    m, d = X.shape
    w = torch.ones(m, dtype=X.dtype, device=X.device) if weights is None else weights
    squared_norms = (X * X).sum(dim=1).to_dense() if X.is_sparse else (X * X).sum(dim=1)
    beta = float((w * (squared_norms + float(fit_intercept))).max())
    vector = torch.randn(d + 1, 1, generator=generator, dtype=torch.float64).to(X.device, X.dtype)
    if not fit_intercept:
        vector[d] = 0.0
    eigenvalue = 0.0
    for _ in range(n_iter):
        vector /= vector.norm().clamp_min(torch.finfo(X.dtype).tiny)
        scores = linear_scores(X, vector[:d], vector[d])
        weighted = scores * w[:, None] / m
        image = torch.cat([transposed_product(X, weighted), weighted.sum(dim=0, keepdim=True) * fit_intercept])
        eigenvalue = float((vector * image).sum())
        vector = image
    return beta, eigenvalue


def measure_sgd_capacity(X, n_outputs, loss, max_batch, cache_key):
    """Measured batch capacity of one SGD step on ``X``'s device.

    Times a step (scores, loss gradient, the coefficient update) on the rows of
    ``X`` (repeated when ``max_batch`` exceeds them) and returns the smallest batch
    at which samples per second stop growing (see
    :func:`~skgpu_kernel.device.throughput_saturation_batch`).

    Returns
    -------
    SaturationBatch
        The batch, and the samples per second of each probed batch size.
    """
    device, dtype = X.device, X.dtype
    repeats = -(-int(max_batch) // X.shape[0])
    rows = torch.cat([X] * repeats).coalesce() if X.is_sparse and repeats > 1 else torch.cat([X] * repeats)
    coef = torch.zeros(X.shape[1], n_outputs, dtype=dtype, device=device)
    intercept = torch.zeros(n_outputs, dtype=dtype, device=device)
    targets = (
        torch.zeros(rows.shape[0], n_outputs, dtype=dtype, device=device)
        if isinstance(loss, (SquaredLoss, HuberLoss))
        else torch.zeros(rows.shape[0], dtype=torch.int64, device=device)
    )

    def run_batch(batch_size):
        _step(loss, coef, intercept, (_row_range(rows, 0, batch_size), targets[:batch_size], None), 0.0, 0.0, True)

    return throughput_saturation_batch(run_batch, max_batch, device, cache_key=cache_key)


def _halved_batch(error, batch_size, device, events=None):
    """The batch the SGD loop retries with after ``error`` in a step of ``batch_size`` rows on ``device``.

    Out of device memory, the batch is halved (CUDA's cached blocks are released
    first, so the smaller step finds them) and the halving recorded in ``events``
    (a :class:`~skgpu_kernel.out_of_memory.MemoryEvents`, stage ``"epoch
    batch"``); any other error, or running out of memory with a batch of one, is
    raised again.
    """
    reason = out_of_memory_reason(error)
    if batch_size == 1:
        raise error
    release_cached_memory(device)
    halved = max(batch_size // 2, 1)
    if events is not None:
        events.shrank("epoch batch", "batch_size", batch_size, halved, reason)
    return halved
