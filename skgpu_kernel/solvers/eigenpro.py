"""EigenPro 2 iteration: preconditioned mini-batch SGD on kernel coefficients.

The loop only sees tensors.  Its caller arranges the rows so that the first ``s``
rows of ``X`` are the Nystrom subsample of the preconditioner and, for a fresh fit,
the rows are already in a random order.  The first epoch of a fresh fit then visits
the rows in that order, and since coefficients beyond the rows visited so far (and
the subsample) are still zero, each step only evaluates the kernel against that
prefix: this is exact and halves the first epoch's cost.  The step size of each
update comes from the caller's scaling rule, as a function of the update count
and of the batch size.
"""

import math
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..blockwise import kernel_matmul, kernel_matmul_rows
from ..device import is_out_of_memory, synchronize

__all__ = ["EigenProResult", "fit_eigenpro"]

# Mean training loss this many times the loss of the zero model counts as divergence,
# and so does an epoch whose loss grew this many times over the lowest epoch loss:
# in the interpolation regime a stable step decreases the loss epoch after epoch.
_DIVERGENCE_FACTOR = 1e4
_GROWTH_FACTOR = 1.5
_MAX_STEP_HALVINGS = 10


@dataclass
class EigenProResult:
    """What a run of :func:`fit_eigenpro` decided and measured."""

    coef: torch.Tensor
    n_epochs: int
    n_steps: int
    batch_size: int
    learning_rate: float
    history: list = field(default_factory=list)


def fit_eigenpro(
    kernel,
    X,
    centers,
    Y,
    coef,
    preconditioner,
    batch_size,
    learning_rate_for,
    column_block_for,
    n_epochs,
    generator,
    weights=None,
    fresh_start=True,
    validation=None,
    n_iter_no_change=3,
    tol=1e-4,
    first_step=0,
    log=None,
):
    """Run EigenPro 2 epochs, updating ``coef`` in place.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
        Training rows; rows ``[0, s)`` are the preconditioner's subsample.
    centers : Tensor with n rows
        ``kernel.prepare_centers(X)``.
    Y : Tensor of shape (n, l)
    coef : Tensor of shape (n, l)
        Initial coefficients, updated in place.
    preconditioner : EigenProPreconditioner or None
    batch_size : int
    learning_rate_for : callable
        ``learning_rate_for(step, batch_size, steps_per_epoch) -> float``, the step
        size of update number ``step`` (counted from ``first_step``) on a batch of
        ``batch_size`` rows, when an epoch takes ``steps_per_epoch`` updates.  The
        last, smaller batch of an epoch passes its own size; after an out-of-memory
        error halves the batch, the halved size and its steps per epoch.  Each
        divergence rollback halves a factor on top of it.
    column_block_for : callable
        ``column_block_for(batch_size) -> int`` columns per kernel block.
    n_epochs : int
    generator : torch.Generator
        Seeds the per-epoch permutations (on the CPU).
    weights : Tensor of shape (n,) or None
        Per-row factors in (0, 1] on the residual (normalised sample weights).
    fresh_start : bool
        ``coef`` is zero and the rows are in random order: the first epoch visits
        them in order and evaluates only the non-zero prefix.
    validation : tuple (X_val, Y_val, score) or None
        ``score(predictions, Y_val) -> float``, larger is better; enables early
        stopping with ``n_iter_no_change`` and ``tol``, keeping the best coefficients.
    first_step : int
        Updates made by earlier runs (warm starts): the count ``learning_rate_for``
        continues from.  A rollback rewinds the count with the coefficients.
    log : callable or None
        Receives progress messages.

    Returns
    -------
    EigenProResult
    """
    n = X.shape[0]
    device = X.device
    leading = preconditioner.subsample_size if preconditioner is not None and preconditioner.n_components else 0
    column_block = column_block_for(batch_size)
    steps_per_epoch = math.ceil(n / batch_size)
    loss_of_zero_model = float((Y * Y).mean()) if Y.numel() else 0.0
    guard = EpochGuard(coef, first_step, n_epochs, tol, n_iter_no_change, log)

    def rate_at(step):
        return learning_rate_for(step, batch_size, steps_per_epoch)

    def validation_score():
        X_val, Y_val, score = validation
        return score(kernel_matmul_rows(kernel, X_val, centers, coef, batch_size, column_block), Y_val)

    while guard.epoch < n_epochs:
        guard.begin_epoch()
        sparse_epoch = fresh_start and guard.epoch == 0
        if sparse_epoch:
            order = torch.arange(n, device=device)
        else:
            order = torch.randperm(n, generator=generator).to(device)
        loss_sum = torch.zeros((), dtype=X.dtype, device=device)
        position = 0
        while position < n:
            batch = order[position : position + batch_size]
            active = max(leading, position) if sparse_epoch else n
            try:
                update = _step(
                    kernel, X, centers, Y, coef, batch, active, leading, preconditioner, weights, column_block
                )
            except (torch.OutOfMemoryError, RuntimeError) as error:
                if not is_out_of_memory(error) or batch_size == 1:
                    raise
                batch_size = max(batch_size // 2, 1)
                steps_per_epoch = math.ceil(n / batch_size)
                column_block = column_block_for(batch_size)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if log is not None:
                    rate = guard.rollback * rate_at(guard.step)
                    log(f"out of memory: batch size halved to {batch_size}, step size {rate:.4g}")
                continue
            residual, weighted, correction = update
            # The last batch of an epoch may be smaller: its step follows its own size.
            scale = guard.rollback * learning_rate_for(guard.step, batch.shape[0], steps_per_epoch) / batch.shape[0]
            coef.index_add_(0, batch, weighted, alpha=-scale)
            if correction is not None:
                coef[:leading].add_(correction, alpha=scale)
            loss_sum += (residual * residual).sum()
            position += batch.shape[0]
            guard.step += 1

        train_loss = float(loss_sum) / max(n * Y.shape[1], 1)
        if not math.isfinite(train_loss):
            _check_kernel_is_finite(kernel, X, centers, column_block)
        scored = validation_score if validation is not None else None
        if not guard.end_epoch(train_loss, loss_of_zero_model, rate_at, scored):
            break

    return EigenProResult(coef=coef, batch_size=batch_size, **guard.finish(rate_at, first_step))


class EpochGuard:
    """Epoch-end bookkeeping of the EigenPro loops: divergence rollback, history, validation, early stopping.

    The loss of an epoch is measured before each of its steps, so it reflects the
    coefficients during that epoch.  The anchor is the start of the epoch with the
    lowest loss so far: a safe point to return to when the loss grows again.  A
    divergence restores the anchor's coefficients and update count and halves a
    factor, :attr:`rollback`, that the loop multiplies into the scaling rule's step
    (so the rule's schedule stays as given); after ``_MAX_STEP_HALVINGS`` halvings
    the loop stops with the last stable coefficients.

    The loop owns :attr:`step` (updates made, counted from ``first_step``) and
    :attr:`epoch`: it calls :meth:`begin_epoch` and :meth:`end_epoch` around each
    epoch, runs while ``epoch < n_epochs`` and stops when :meth:`end_epoch` returns
    False, then calls :meth:`finish`.

    Parameters
    ----------
    coef : Tensor
        The coefficients the loop updates in place.
    first_step : int
    n_epochs : int
    tol, n_iter_no_change
        Early stopping on the validation score (see :class:`EarlyStopping`).
    log : callable or None
    """

    def __init__(self, coef, first_step, n_epochs, tol, n_iter_no_change, log):
        self.coef, self.n_epochs, self.log = coef, n_epochs, log
        self.step, self.epoch, self.rollback = first_step, 0, 1.0
        self.rolled_back = False
        self.history = []
        self.early_stopping = EarlyStopping(tol, n_iter_no_change)
        self._halvings = 0
        self._anchor_coef, self._anchor_epoch = coef.clone(), 0
        self._anchor_step, self._anchor_loss = first_step, math.inf

    def begin_epoch(self):
        synchronize(self.coef.device)
        self._tic = time.perf_counter()
        self._epoch_start, self._epoch_start_step = self.coef.clone(), self.step

    def end_epoch(self, train_loss, loss_of_zero_model, rate_at, validation_score=None):
        """Record the epoch, or roll back when it diverged; False when the loop must stop.

        ``rate_at(step)`` is the scaling rule's step size at update ``step`` for the
        loop's current batch; ``validation_score()`` scores the current coefficients.
        After a rollback, :attr:`rolled_back` is True until the next call.
        """
        self.rolled_back = _diverged(train_loss, loss_of_zero_model, self._anchor_loss, self.coef.dtype)
        if self.rolled_back:
            self.coef.copy_(self._anchor_coef)
            self.step = self._anchor_step
            del self.history[self._anchor_epoch :]
            if self._halvings >= _MAX_STEP_HALVINGS:
                warnings.warn(
                    "EigenPro iteration kept diverging after "
                    f"{_MAX_STEP_HALVINGS} step-size halvings; stopping with the last stable "
                    "coefficients. Check the bandwidth, the scale of the data and the scaling rule.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return False
            self._halvings += 1
            self.rollback *= 0.5
            warnings.warn(
                f"Training diverged in epoch {self.epoch + 1} (mean loss {train_loss:.3g}, lowest "
                f"{self._anchor_loss:.3g}); resuming from the start of epoch {self._anchor_epoch + 1} with the "
                f"scaling rule's step size halved ({self.rollback:g} times the rule's, "
                f"{self.rollback * rate_at(self.step):.4g} at the next update).",
                RuntimeWarning,
                stacklevel=3,
            )
            self.epoch, self._anchor_loss = self._anchor_epoch, math.inf
            return True
        if train_loss < self._anchor_loss:
            self._anchor_coef, self._anchor_epoch = self._epoch_start, self.epoch
            self._anchor_step, self._anchor_loss = self._epoch_start_step, train_loss

        record = {
            "epoch": self.epoch + 1,
            "train_mse": train_loss,
            "learning_rate": self.rollback * rate_at(self.step - 1),
        }
        if validation_score is not None:
            record["validation_score"] = float(validation_score())
        synchronize(self.coef.device)
        record["seconds"] = time.perf_counter() - self._tic
        self.history.append(record)
        self.epoch += 1
        if self.log is not None:
            self.log(_format_record(record, self.n_epochs))
        return validation_score is None or not self.early_stopping.should_stop(
            record["validation_score"], self.coef, self.log
        )

    def finish(self, rate_at, first_step):
        """Put the best validated coefficients back; the result fields the loops share.

        Returns ``n_epochs``, ``n_steps``, ``learning_rate`` (the last update's, with
        the rollback factor) and ``history``.
        """
        self.early_stopping.restore_best(self.coef)
        return {
            "n_epochs": len(self.history),
            "n_steps": self.step - first_step,
            "learning_rate": self.rollback * rate_at(max(self.step - 1, first_step)),
            "history": self.history,
        }


class EarlyStopping:
    """Tracks validation scores epoch by epoch, keeping the best coefficients.

    Stops after ``n_iter_no_change`` epochs without a gain above ``tol``.
    """

    def __init__(self, tol, n_iter_no_change):
        self.tol, self.n_iter_no_change = tol, n_iter_no_change
        self.best_score, self.best_coef, self.epochs_without_gain = -math.inf, None, 0

    def should_stop(self, score, coef, log=None):
        """Record this epoch's ``score`` for ``coef``; whether to stop now."""
        self.epochs_without_gain = 0 if score > self.best_score + self.tol else self.epochs_without_gain + 1
        if score > self.best_score:
            self.best_score, self.best_coef = score, coef.clone()
        if self.epochs_without_gain < self.n_iter_no_change:
            return False
        if log is not None:
            log(f"early stopping: no gain above tol for {self.n_iter_no_change} epochs")
        return True

    def restore_best(self, coef):
        """Put the best coefficients seen back into ``coef`` (no-op without validation)."""
        if self.best_coef is not None:
            coef.copy_(self.best_coef)


def _step(kernel, X, centers, Y, coef, batch, active, leading, preconditioner, weights, column_block):
    """Residual, weighted residual and subsample correction for one batch (no update yet).

    Everything that allocates happens here, so an out-of-memory error leaves the
    coefficients untouched.
    """
    X_batch = X[batch]
    if leading:
        predictions, subsample_block = kernel_matmul(
            kernel, X_batch, centers[:active], coef[:active], column_block, leading=leading
        )
    else:
        predictions = kernel_matmul(kernel, X_batch, centers[:active], coef[:active], column_block)
    residual = predictions.sub_(Y[batch])
    weighted = residual if weights is None else residual * weights[batch, None]
    correction = preconditioner.correction(subsample_block, weighted) if leading else None
    return residual, weighted, correction


def _check_kernel_is_finite(kernel, X, centers, column_block):
    """Raise when the kernel itself returns inf or NaN, which no step size can fix."""
    sample = X[: min(X.shape[0], 256)]
    block = kernel.block(sample, centers[:column_block])
    if not torch.isfinite(block).all():
        raise ValueError(
            f"The kernel {kernel!r} returned non-finite values (inf or NaN) on the training data "
            f"in {X.dtype}; check its parameters and the scale of the data."
        )


def _diverged(train_loss, loss_of_zero_model, lowest_loss, dtype):
    if not math.isfinite(train_loss) or train_loss > _DIVERGENCE_FACTOR * max(loss_of_zero_model, 1e-30):
        return True
    # Near the interpolant the loss sits at the rounding level of the predictions,
    # where it fluctuates by more than the growth factor without diverging.
    rounding_floor = loss_of_zero_model * (1e3 * torch.finfo(dtype).eps) ** 2
    return train_loss > _GROWTH_FACTOR * max(lowest_loss, rounding_floor)


def _format_record(record, n_epochs):
    text = f"epoch {record['epoch']}/{n_epochs}: train mse {record['train_mse']:.5g}"
    text += f", step size {record['learning_rate']:.4g}"
    if "validation_score" in record:
        text += f", validation score {record['validation_score']:.5g}"
    return text + f", {record['seconds']:.2f} s"
