"""One epoch record and stopping component for every training loop.

Every loop (EigenPro 2, EigenPro 3, BMGD and the parallel workers) reports its
progress as ``history_`` records built by :func:`epoch_record`, printed by
:func:`format_record`, timed by :class:`EpochClock`, and stops early through
:class:`Stopping`, the one stopping rule (its plan and meaning:
:mod:`skgpu_kernel.planning.stopping`).  :class:`EpochGuard` adds the
EigenPro loops' divergence rollback on top.

The ``history_`` schema: every record of every estimator has the core keys
:data:`CORE_KEYS`,

``epoch``
    The pass over the data this record closes, from 1 (a float for
    :class:`~skgpu_kernel.parallel.AdaptiveSGD`, whose records close merges).
``n_steps``
    Updates taken so far, counting earlier calls that continue the schedule.
``train_loss``
    Mean training loss over the epoch, each batch measured before its step, plus
    the L2 penalty ``alpha / 2 ||W||^2`` of the coefficients at the end of the
    epoch for the linear models (the same with and without ``parallel=``); for the
    kernel machines the mean squared residual.
``learning_rate``
    Step size of the epoch's last update.
``validation_score``
    Score on the held-out rows at the end of the epoch; None without validation.
``seconds``
    Wall time of the epoch.

Loops add their own keys after these (``io_wait_seconds``,
``samples_per_second``, ``bytes_all_reduced``, ``merge_weights``, ...).
"""

import math
import time

import torch

from ..device import synchronize
from ..planning.stopping import ANNEAL_FACTOR, EIGENPRO_DIVERGENCE

__all__ = [
    "CORE_KEYS",
    "EarlyStopping",
    "EpochClock",
    "EpochGuard",
    "Stopping",
    "epoch_record",
    "format_record",
]

CORE_KEYS = ("epoch", "n_steps", "train_loss", "learning_rate", "validation_score", "seconds")

# Halvings of the step after which a loop that keeps diverging stops with its last
# stable coefficients (each one is recorded in the fit's record, fit_attempts_).
_MAX_STEP_HALVINGS = 10
# Epoch losses below this fraction of the zero model's loss are not judged by their growth.
_NOISE_FLOOR = 1e-2


class Stopping:
    """A :class:`~skgpu_kernel.planning.stopping.StoppingPlan` run over a loop's epochs.

    The one stopping rule of the package (the plan's module states it): each
    epoch's record is judged on its validation score, or on its training loss as
    a fraction of a reference loss (the zero model's when the loop passes it,
    else the first judged epoch's), and the loop stops after ``n_iter_no_change``
    epochs without a gain above ``tol``.

    Parameters
    ----------
    plan : StoppingPlan
    """

    def __init__(self, plan):
        self.plan = plan
        never = -math.inf if plan.monitor == "validation_score" else math.inf
        self._rule = EarlyStopping(never if plan.tol is None else plan.tol, plan.n_iter_no_change)
        self.reference = None
        self.annealed = 0
        # The rule stopped the loop (False: it ran its last epoch first).
        self.met = False

    @property
    def step_factor(self):
        """What the loop multiplies its step by: divided by ``ANNEAL_FACTOR`` at each annealing plateau."""
        return ANNEAL_FACTOR**-self.annealed

    @property
    def converged(self):
        """The rule stopped the loop, or had nothing to judge (False: the last epoch came first)."""
        return self.met or not self.plan.judges

    def should_stop(self, record, state=None, log=None, reference_loss=None):
        """Judge an epoch's record; whether the loop stops now.

        ``state`` (coefficient tensors) is copied when its validation score is the
        best so far; ``reference_loss`` is the zero model's loss, where known.  A
        plateau of a plan that anneals divides :attr:`step_factor` instead of
        stopping, ``plan.anneal`` times.
        """
        if self.plan.monitor == "validation_score":
            plateau = self._rule.should_stop(record["validation_score"], state, None)
        elif self.plan.monitor == "none":
            return False
        else:
            if self.reference is None:
                self.reference = max(record["train_loss"] if reference_loss is None else reference_loss, 1e-300)
            plateau = self._rule.should_stop(-record["train_loss"] / self.reference, None, None)
        if plateau and self.annealed < self.plan.anneal:
            self.annealed += 1
            self._rule.epochs_without_gain = 0
            if log is not None:
                log(
                    f"plateau: no gain above tol={self.plan.tol:g} for {self.plan.n_iter_no_change} epochs; "
                    f"step divided by {ANNEAL_FACTOR:g} ({self.annealed} of {self.plan.anneal})"
                )
            return False
        if plateau:
            self.met = True
            if log is not None:
                log(f"early stopping: no gain above tol={self.plan.tol:g} for {self.plan.n_iter_no_change} epochs")
        return plateau

    def restore_best(self, state):
        """Put the coefficients of the best validation score back (no-op without validation)."""
        self._rule.restore_best(state)

    def rolled_back(self):
        """Epochs undone by a rollback no longer count as epochs without a gain (the best score is kept)."""
        self._rule.epochs_without_gain = 0


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
    stopping : Stopping
        When to stop before ``n_epochs``.
    log : callable or None
    events : MemoryEvents or None
        The fit's record, where each halving of the step is recorded (stage
        ``"epoch"``, what changed ``"step size factor"``, the reason).
    """

    def __init__(self, coef, first_step, n_epochs, stopping, log, events=None):
        self.coef, self.n_epochs, self.log, self.events = coef, n_epochs, log, events
        self.step, self.epoch, self.rollback = first_step, 0, 1.0
        self.rolled_back = False
        self.history = []
        self.warnings = []  # (message, category): the fit raises them, the loop never warns
        self.stopping = stopping
        self._halvings = 0
        self._clock = EpochClock(coef.device)
        self._anchor_coef, self._anchor_epoch = coef.clone(), 0
        self._anchor_step, self._anchor_loss = first_step, math.inf

    def begin_epoch(self):
        self._clock.start()
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
                self.warnings.append(
                    (
                        "EigenPro iteration kept diverging after "
                        f"{_MAX_STEP_HALVINGS} step-size halvings; stopping with the last stable "
                        "coefficients. Check the bandwidth, the scale of the data and the scaling rule.",
                        RuntimeWarning,
                    )
                )
                return False
            self._halvings += 1
            self.rollback *= 0.5
            reason = (
                f"training diverged in epoch {self.epoch + 1} (mean loss {train_loss:.3g}, lowest "
                f"{self._anchor_loss:.3g}, the zero model's {loss_of_zero_model:.3g})"
            )
            if self.events is not None:
                self.events.changed("epoch", "step size factor", 2.0 * self.rollback, self.rollback, reason)
            self.warnings.append(
                (
                    f"{reason[0].upper()}{reason[1:]}; resuming from the start of epoch {self._anchor_epoch + 1} with "
                    f"the scaling rule's step size halved ({self.rollback:g} times the rule's, "
                    f"{self.rollback * rate_at(self.step):.4g} at the next update).",
                    RuntimeWarning,
                )
            )
            self.epoch, self._anchor_loss = self._anchor_epoch, math.inf
            self.stopping.rolled_back()
            return True
        if train_loss < self._anchor_loss:
            self._anchor_coef, self._anchor_epoch = self._epoch_start, self.epoch
            self._anchor_step, self._anchor_loss = self._epoch_start_step, train_loss

        score = None if validation_score is None else float(validation_score())
        record = epoch_record(
            self.epoch + 1, self.step, train_loss, self.rollback * rate_at(self.step - 1), self._clock.seconds(), score
        )
        self.history.append(record)
        self.epoch += 1
        if self.log is not None:
            self.log(format_record(record, self.n_epochs))
        return not self.stopping.should_stop(record, self.coef, self.log, loss_of_zero_model)

    def finish(self, rate_at, first_step):
        """Put the best validated coefficients back; the result fields the loops share.

        Returns ``n_epochs``, ``n_steps``, ``learning_rate`` (the last update's, with
        the rollback factor), ``history`` and ``warnings``.
        """
        self.stopping.restore_best(self.coef)
        return {
            "n_epochs": len(self.history),
            "n_steps": self.step - first_step,
            "learning_rate": self.rollback * rate_at(max(self.step - 1, first_step)),
            "history": self.history,
            "warnings": tuple(self.warnings),
        }


class EarlyStopping:
    """The counting core of :class:`Stopping`: stop after ``n_iter_no_change`` epochs without a gain above ``tol``.

    Each epoch gives a score, larger is better (a validation score, or the
    negated training loss).  An epoch gains when its score exceeds the best so far
    by more than ``tol``; the best score is tracked whatever the gain.  When the
    caller passes the state that produced a score (coefficient tensors), a copy of
    the best one is kept for :meth:`restore_best`.

    Parameters
    ----------
    tol : float
    n_iter_no_change : int

    Examples
    --------
    >>> rule = EarlyStopping(tol=0.1, n_iter_no_change=2)
    >>> [rule.should_stop(score) for score in (1.0, 1.05, 1.3, 1.35, 1.38)]
    [False, False, False, False, True]
    """

    def __init__(self, tol, n_iter_no_change):
        self.tol, self.n_iter_no_change = tol, n_iter_no_change
        self.best_score, self.best_state, self.epochs_without_gain = -math.inf, None, 0

    def should_stop(self, score, state=None, log=None):
        """Record this epoch's ``score`` (for ``state``: a tensor or tuple of tensors); whether to stop now."""
        self.epochs_without_gain = 0 if score > self.best_score + self.tol else self.epochs_without_gain + 1
        if score > self.best_score:
            self.best_score = score
            if state is not None:
                self.best_state = tuple(tensor.clone() for tensor in _as_tuple(state))
        if self.epochs_without_gain < self.n_iter_no_change:
            return False
        if log is not None:
            log(f"early stopping: no gain above tol={self.tol:g} for {self.n_iter_no_change} epochs")
        return True

    def restore_best(self, state):
        """Copy the best state seen back into ``state`` (no-op when none was kept)."""
        if self.best_state is not None:
            for tensor, best in zip(_as_tuple(state), self.best_state, strict=True):
                tensor.copy_(best)


def _as_tuple(state):
    return tuple(state) if isinstance(state, (tuple, list)) else (state,)


class EpochClock:
    """Wall time of an epoch, with the device synchronised at both ends (asynchronous CUDA work counts).

    Parameters
    ----------
    device : torch.device
    """

    def __init__(self, device):
        self.device = device
        self._tic = time.perf_counter()

    def start(self):
        """Start timing an epoch."""
        synchronize(self.device)
        self._tic = time.perf_counter()

    def seconds(self):
        """Seconds since :meth:`start`."""
        synchronize(self.device)
        return time.perf_counter() - self._tic


def epoch_record(epoch, n_steps, train_loss, learning_rate, seconds, validation_score=None, **extra):
    """One ``history_`` record: the core keys (see the module's docstring), then a loop's own keys.

    Parameters
    ----------
    epoch : int or float
    n_steps : int
    train_loss : float
    learning_rate : float
    seconds : float
    validation_score : float or None, default=None
    **extra
        Loop-specific keys, appended after the core keys.

    Returns
    -------
    dict

    Examples
    --------
    >>> list(epoch_record(1, 10, 0.5, 0.1, 0.02, io_wait_seconds=0.0))
    ['epoch', 'n_steps', 'train_loss', 'learning_rate', 'validation_score', 'seconds', 'io_wait_seconds']
    """
    return {
        "epoch": epoch,
        "n_steps": n_steps,
        "train_loss": train_loss,
        "learning_rate": learning_rate,
        "validation_score": validation_score,
        "seconds": seconds,
        **extra,
    }


def format_record(record, n_epochs):
    """The progress line ``verbose`` prints for a record of :func:`epoch_record`.

    Examples
    --------
    >>> format_record(epoch_record(2, 20, 0.25, 0.1, 1.5, 0.9), 5)
    'epoch 2/5: train loss 0.25, learning rate 0.1, validation score 0.9, 1.50 s'
    """
    text = f"epoch {record['epoch']}/{n_epochs}: train loss {record['train_loss']:.5g}"
    text += f", learning rate {record['learning_rate']:.4g}"
    if record["validation_score"] is not None:
        text += f", validation score {record['validation_score']:.5g}"
    if "samples_per_second" in record:
        text += f", {record['samples_per_second']:.3g} samples/s"
    if "io_wait_seconds" in record:
        return text + f", I/O wait {record['io_wait_seconds']:.2f} of {record['seconds']:.2f} s"
    return text + f", {record['seconds']:.2f} s"


def _diverged(train_loss, loss_of_zero_model, lowest_loss, dtype):
    """Whether an epoch's loss breaks the planned rule (:data:`~skgpu_kernel.planning.stopping.EIGENPRO_DIVERGENCE`)."""
    # Near the interpolant the loss sits at the rounding level of the predictions, or at
    # the level of the SGD noise, where it fluctuates by more than the growth factor
    # without diverging (DNA, 1350 rows, float32: a mean loss of 2.7e-4 then 4.2e-4,
    # about 0.2% of the zero model's); a divergence grows geometrically and passes the
    # floor within an epoch or two.
    rounding_floor = loss_of_zero_model * (1e3 * torch.finfo(dtype).eps) ** 2
    floor = max(rounding_floor, _NOISE_FLOOR * loss_of_zero_model)
    return EIGENPRO_DIVERGENCE.exceeded(train_loss, lowest_loss, loss_of_zero_model, floor) is not None
