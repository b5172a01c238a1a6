"""One epoch record and stopping component for every training loop.

:class:`EpochGuard` does the epoch-end bookkeeping of the EigenPro loops
(divergence rollback, history, validation, early stopping); :class:`EarlyStopping`
is the one stopping rule every loop uses.
"""

import math
import time
import warnings

import torch

from ..device import synchronize

__all__ = ["EarlyStopping", "EpochGuard"]

# Mean training loss this many times the loss of the zero model counts as divergence,
# and so does an epoch whose loss grew this many times over the lowest epoch loss:
# in the interpolation regime a stable step decreases the loss epoch after epoch.
_DIVERGENCE_FACTOR = 1e4
_GROWTH_FACTOR = 1.5
_MAX_STEP_HALVINGS = 10


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
