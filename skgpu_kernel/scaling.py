"""Scaling rules: the learning rate as a function of the batch size and of time.

A scaling rule answers one question: which learning rate should update number
``t`` use when the batch has ``B`` samples?  It is a pure function
``lr = rule(t, context)`` of the update count and of a :class:`ScheduleContext`
(batch size, updates per epoch, length of the run and, for kernel machines, the
spectrum).  Rules hold parameters only, no training state: they are cloned,
pickled and grid-searched like scikit-learn estimators (``scaling_rule__base_lr``),
and :meth:`ScalingRule.schedule` computes a whole schedule without training.

Notation: ``k = B / B0`` is the batch over the base batch ``B0`` for which
``base_lr`` was tuned, ``e = t / steps_per_epoch`` the position of update ``t`` in
epochs, ``E`` the number of epochs of the run (the decay horizon).

* :class:`ConstantRule`: the peak is ``base_lr`` whatever the batch.
* :class:`LinearScaling` (Goyal et al. [1]_): peak ``k * base_lr``, reached by a
  linear warm-up from ``base_lr`` over ``w`` epochs (5 by default, whatever ``B``):
  ``lr = base_lr + (peak - base_lr) e / w`` for ``e < w``.
* :class:`SqrtScaling`: peak ``sqrt(k) * base_lr`` (keeps the variance of the
  update constant), same warm-up shape, none by default.
* :class:`LEGW` (linear-epoch gradual warm-up, You et al. [2]_): peak
  ``sqrt(k) * base_lr`` and a warm-up of ``w = k * w0`` epochs, which is the same
  number of updates as the base run's: ``lr = peak * min(1, (t + 1) / (w
  steps_per_epoch))``, then polynomial decay of power 2 by default.
* :class:`EigenProRule` (Ma and Belkin [3]_): the analytic EigenPro step for a
  batch of ``m`` samples, ``eta = m / beta`` up to the critical batch
  ``m* = beta / lambda_1`` and ``0.99 * 2 m / (beta + (m - 1) lambda_1)`` beyond,
  from the (preconditioned) kernel's largest diagonal entry ``beta`` and top
  eigenvalue ``lambda_1``; times ``scale``.  The kernel machines use it by default.

After the warm-up (from ``e = w``, ``w = 0`` without warm-up) every rule applies
its ``decay``:

* ``None``: ``lr = peak``;
* ``"polynomial"``: ``(peak - end_lr) (1 - (e - w) / (E - w)) ** decay_power +
  end_lr``, and ``end_lr`` from ``e = E`` on; when the warm-up fills the whole
  run (``w >= E``) there is no decay phase and the rate stays at the peak;
* ``"exponential"``: ``peak * decay_rate ** ((e - w) / decay_every)``;
* ``"step"``: ``peak * decay_rate ** floor((e - w) / decay_every)``.

The decay parameters are flat constructor arguments of every rule, so a grid
search reaches ``scaling_rule__decay_power``.

References
----------
.. [1] P. Goyal et al., "Accurate, large minibatch SGD: training ImageNet in 1
   hour", 2017. arXiv:1706.02677.
.. [2] Y. You, J. Hseu, C. Ying, J. Demmel, K. Keutzer and C.-J. Hsieh,
   "Large-batch training for LSTM and beyond", SC 2019. arXiv:1901.08256.
.. [3] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
   large batch training", SysML 2019. arXiv:1806.06144.
"""

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

__all__ = [
    "LEGW",
    "ConstantRule",
    "EigenProRule",
    "LinearScaling",
    "ScalingRule",
    "ScheduleContext",
    "SqrtScaling",
    "eigenpro_step_size",
]


def eigenpro_step_size(batch_size, beta, top_eigenvalue):
    """EigenPro's analytic step size for batch ``m``.

    ``eta = m / beta`` up to the critical batch ``m* = beta / lambda_1'``, then
    ``0.99 * 2 m / (beta + (m - 1) lambda_1')``, which saturates near
    ``2 / lambda_1'``.  With ``m = 1`` one step interpolates the sampled point.
    """
    critical = beta / top_eigenvalue if top_eigenvalue > 0 else math.inf
    if batch_size <= critical:
        return batch_size / beta
    return 0.99 * 2.0 * batch_size / (beta + (batch_size - 1) * top_eigenvalue)


@dataclass(frozen=True)
class ScheduleContext:
    """What a scaling rule may depend on besides the update count.

    Parameters
    ----------
    batch_size : int
        Number of samples ``B`` in the batch of this update (the last batch of an
        epoch may be smaller than the others).
    steps_per_epoch : float
        Updates per pass over the data (positive), which converts update counts
        into epochs.
    n_epochs : float
        Length ``E`` of the run in epochs (positive; ``math.inf`` for no horizon),
        the horizon of polynomial decay.
    beta : float or None, default=None
        Largest diagonal entry of the (preconditioned) operator the iteration
        applies (the kernel matrix for kernel machines), for rules with
        ``requires_spectrum``.
    top_eigenvalue : float or None, default=None
        Its top eigenvalue ``lambda_1``.

    Examples
    --------
    >>> from skgpu_kernel.scaling import ScheduleContext, SqrtScaling
    >>> context = ScheduleContext(batch_size=128, steps_per_epoch=100, n_epochs=10)
    >>> SqrtScaling(base_lr=0.1, base_batch_size=32)(0, context)
    0.2
    """

    batch_size: int
    steps_per_epoch: float
    n_epochs: float
    beta: float | None = None
    top_eigenvalue: float | None = None

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, Integral) or self.batch_size < 1:
            raise ValueError(f"ScheduleContext.batch_size must be an int >= 1, got {self.batch_size!r}.")
        if not _is_real(self.steps_per_epoch) or not (0 < self.steps_per_epoch < math.inf):
            raise ValueError(
                f"ScheduleContext.steps_per_epoch must be positive and finite, got {self.steps_per_epoch!r}."
            )
        if not _is_real(self.n_epochs) or not self.n_epochs > 0:
            raise ValueError(f"ScheduleContext.n_epochs must be positive, got {self.n_epochs!r}.")
        # The spectrum is not checked: a kernel returning inf or NaN gives a non-finite
        # spectrum, and the solver names the kernel as the problem once the loss is.


def _is_real(value):
    return isinstance(value, Real) and not isinstance(value, bool)


class ScalingRule(BaseEstimator):
    """Base class of scaling rules; subclass it to write your own.

    A subclass implements :meth:`peak_lr`, the learning rate the rule scales to
    for the context's batch size; the rule is then constant in time.  A schedule
    that varies in time overrides :meth:`__call__` as well.  Parameters are
    constructor arguments stored under the same name, as for scikit-learn
    estimators, so ``get_params``, ``set_params`` and :func:`sklearn.base.clone`
    work and ``GridSearchCV`` reaches ``scaling_rule__<param>``.  Rules keep no
    state between calls: the update count comes in as an argument, and anything
    that evolves during training lives on the estimator.
    :func:`skgpu_kernel.testing.check_scaling_rule` checks a user-written rule
    against this contract.

    Attributes
    ----------
    requires_spectrum : bool
        ``True`` when the rule needs ``beta`` and ``top_eigenvalue`` in the
        context, which only the kernel machines provide.

    Examples
    --------
    >>> from skgpu_kernel.scaling import ScalingRule, ScheduleContext
    >>> class HalfOverBatch(ScalingRule):
    ...     def __init__(self, numerator=0.5):
    ...         self.numerator = numerator
    ...
    ...     def peak_lr(self, context):
    ...         return self.numerator / context.batch_size
    >>> HalfOverBatch().schedule(4, 3, steps_per_epoch=10, n_epochs=1)
    array([0.125, 0.125, 0.125])
    """

    requires_spectrum: ClassVar[bool] = False
    _parameter_constraints: ClassVar[dict] = {}

    def __call__(self, step, context):
        """Learning rate of update ``step``.

        Parameters
        ----------
        step : int
            Number of updates made before this one (0 for the first), counted over
            the whole training, across ``partial_fit`` calls and warm starts.
        context : ScheduleContext

        Returns
        -------
        float
        """
        return float(self.peak_lr(context))

    def peak_lr(self, context):
        """Learning rate the rule scales to for ``context.batch_size``, after any warm-up.

        Parameters
        ----------
        context : ScheduleContext

        Returns
        -------
        float
        """
        raise NotImplementedError(f"{type(self).__name__} must implement peak_lr(context).")

    def schedule(self, batch_size, n_steps, *, steps_per_epoch, n_epochs, beta=None, top_eigenvalue=None):
        """Learning rates of the first ``n_steps`` updates, computed without training.

        Parameters
        ----------
        batch_size : int
        n_steps : int
        steps_per_epoch : float
        n_epochs : float
        beta, top_eigenvalue : float or None, default=None
            The spectrum, for rules with ``requires_spectrum``.

        Returns
        -------
        ndarray of shape (n_steps,), float64
            ``[self(t, context) for t in range(n_steps)]``.
        """
        self._validate_params()
        if isinstance(n_steps, bool) or not isinstance(n_steps, Integral) or n_steps < 0:
            raise ValueError(f"n_steps must be an int >= 0, got {n_steps!r}.")
        context = ScheduleContext(batch_size, steps_per_epoch, n_epochs, beta=beta, top_eigenvalue=top_eigenvalue)
        return np.array([self(step, context) for step in range(n_steps)], dtype=np.float64)


_DECAY_CONSTRAINTS = {
    "decay": [StrOptions({"polynomial", "exponential", "step"}), None],
    "decay_power": [Interval(Real, 0, None, closed="neither")],
    "end_lr": [Interval(Real, 0, None, closed="left")],
    "decay_rate": [Interval(Real, 0, 1, closed="right")],
    "decay_every": [Interval(Real, 0, None, closed="neither")],
}

_BATCH_CONSTRAINTS = {
    "base_lr": [Interval(Real, 0, None, closed="neither")],
    "base_batch_size": [Interval(Integral, 1, None, closed="left")],
}

_DECAY_DOC = """decay : {"polynomial", "exponential", "step"} or None, default=%(decay)s
        What follows the warm-up, from epoch ``w`` (0 without warm-up), at epoch
        position ``e`` of a run of ``E`` epochs: ``None`` keeps the peak;
        ``"polynomial"`` gives ``(peak - end_lr) (1 - (e - w) / (E - w)) **
        decay_power + end_lr``, then ``end_lr`` from ``e = E`` on;
        ``"exponential"`` gives ``peak * decay_rate ** ((e - w) / decay_every)``
        and ``"step"`` ``peak * decay_rate ** floor((e - w) / decay_every)``.
    decay_power : float, default=%(decay_power)s
        Exponent of polynomial decay (positive).
    end_lr : float, default=0.0
        Learning rate that polynomial decay reaches at the end of the run (absolute, >= 0).
    decay_rate : float in (0, 1], default=0.1
        Factor per ``decay_every`` epochs of exponential and step decay.
    decay_every : float, default=1.0
        Epochs over which exponential and step decay multiply the rate by ``decay_rate``."""


def _decay_doc(decay="None", decay_power="1.0"):
    return _DECAY_DOC % {"decay": decay, "decay_power": decay_power}


class WarmupDecayRule(ScalingRule):
    """The built-in rules: a peak from the batch size, an optional warm-up, then a decay."""

    _parameter_constraints: ClassVar[dict] = dict(_DECAY_CONSTRAINTS)

    def __init__(self, *, decay=None, decay_power=1.0, end_lr=0.0, decay_rate=0.1, decay_every=1.0):
        self.decay = decay
        self.decay_power = decay_power
        self.end_lr = end_lr
        self.decay_rate = decay_rate
        self.decay_every = decay_every

    def _warmup(self, context):
        """``(epochs w, start_lr, step_offset)``: during the warm-up, update ``t`` gets
        ``start_lr + (peak - start_lr) * min(1, (t + step_offset) / (w * steps_per_epoch))``.
        No warm-up by default."""
        return 0.0, 0.0, 0

    def __call__(self, step, context):
        peak = self.peak_lr(context)
        warmup_epochs, warmup_start, warmup_offset = self._warmup(context)
        steps_per_epoch = context.steps_per_epoch
        epoch = step / steps_per_epoch
        if epoch < warmup_epochs:
            progress = min(1.0, (step + warmup_offset) / (warmup_epochs * steps_per_epoch))
            return float(warmup_start + (peak - warmup_start) * progress)
        if self.decay is None:
            return float(peak)
        elapsed = epoch - warmup_epochs
        if self.decay == "polynomial":
            span = context.n_epochs - warmup_epochs
            if span <= 0:  # the warm-up fills the run: no decay phase
                return float(peak)
            if elapsed >= span:
                return float(self.end_lr)
            return float((peak - self.end_lr) * (1.0 - elapsed / span) ** self.decay_power + self.end_lr)
        periods = elapsed / self.decay_every
        if self.decay == "step":
            # Boundaries computed as 2.9999999999 in floating point count as 3 periods.
            periods = math.floor(round(periods, 9))
        return float(peak * self.decay_rate**periods)


def _batch_ratio(rule, context):
    return context.batch_size / rule.base_batch_size


def _sqrt_scaled_base_lr(rule, context):
    return float(math.sqrt(_batch_ratio(rule, context)) * rule.base_lr)


class ConstantRule(WarmupDecayRule):
    __doc__ = (
        """The same peak learning rate ``base_lr`` for every batch size.

    Parameters
    ----------
    base_lr : float, default=0.01
        The learning rate (positive).
    """
        + _decay_doc()
        + """

    See Also
    --------
    LinearScaling, SqrtScaling : Peaks that grow with the batch size.

    Examples
    --------
    >>> from skgpu_kernel.scaling import ConstantRule
    >>> rule = ConstantRule(0.1, decay="step", decay_rate=0.5, decay_every=1.0)
    >>> rule.schedule(64, 4, steps_per_epoch=2, n_epochs=2).tolist()
    [0.1, 0.1, 0.05, 0.05]
    """
    )

    _parameter_constraints: ClassVar[dict] = {**_DECAY_CONSTRAINTS, "base_lr": _BATCH_CONSTRAINTS["base_lr"]}

    def __init__(self, base_lr=0.01, *, decay=None, decay_power=1.0, end_lr=0.0, decay_rate=0.1, decay_every=1.0):
        super().__init__(
            decay=decay, decay_power=decay_power, end_lr=end_lr, decay_rate=decay_rate, decay_every=decay_every
        )
        self.base_lr = base_lr

    def peak_lr(self, context):
        """``base_lr``."""
        return float(self.base_lr)


class _WarmupFromBaseRule(WarmupDecayRule):
    """Rules whose warm-up climbs linearly from ``base_lr`` to the peak over ``warmup_epochs``."""

    _parameter_constraints: ClassVar[dict] = {
        **_DECAY_CONSTRAINTS,
        **_BATCH_CONSTRAINTS,
        "warmup_epochs": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(
        self,
        base_lr=0.01,
        base_batch_size=32,
        *,
        warmup_epochs=0.0,
        decay=None,
        decay_power=1.0,
        end_lr=0.0,
        decay_rate=0.1,
        decay_every=1.0,
    ):
        super().__init__(
            decay=decay, decay_power=decay_power, end_lr=end_lr, decay_rate=decay_rate, decay_every=decay_every
        )
        self.base_lr = base_lr
        self.base_batch_size = base_batch_size
        self.warmup_epochs = warmup_epochs

    def _warmup(self, context):
        return float(self.warmup_epochs), float(self.base_lr), 0


class LinearScaling(_WarmupFromBaseRule):
    __doc__ = (
        """Linear scaling rule with gradual warm-up (Goyal et al.).

    The peak is ``k * base_lr`` with ``k = batch_size / base_batch_size``.  The rate
    climbs linearly from ``base_lr`` to the peak over ``warmup_epochs`` epochs,
    whatever the batch size: ``lr = base_lr + (peak - base_lr) e / warmup_epochs``
    at epoch position ``e``.

    Parameters
    ----------
    base_lr : float, default=0.01
        Learning rate tuned for ``base_batch_size`` (positive).
    base_batch_size : int, default=32
        Batch size ``B0`` of the tuned run.
    warmup_epochs : float, default=5.0
        Length of the warm-up in epochs (0 for none).
    """
        + _decay_doc()
        + """

    See Also
    --------
    SqrtScaling : Square-root scaling of the peak.
    LEGW : Square-root scaling with a warm-up that grows with the batch.

    References
    ----------
    .. [1] P. Goyal et al., "Accurate, large minibatch SGD: training ImageNet in 1
       hour", 2017. arXiv:1706.02677.

    Examples
    --------
    >>> from skgpu_kernel.scaling import LinearScaling
    >>> rule = LinearScaling(base_lr=0.1, base_batch_size=32, warmup_epochs=1.0)
    >>> rule.schedule(128, 5, steps_per_epoch=4, n_epochs=10).round(3).tolist()
    [0.1, 0.175, 0.25, 0.325, 0.4]
    """
    )

    def __init__(
        self,
        base_lr=0.01,
        base_batch_size=32,
        *,
        warmup_epochs=5.0,
        decay=None,
        decay_power=1.0,
        end_lr=0.0,
        decay_rate=0.1,
        decay_every=1.0,
    ):
        super().__init__(
            base_lr,
            base_batch_size,
            warmup_epochs=warmup_epochs,
            decay=decay,
            decay_power=decay_power,
            end_lr=end_lr,
            decay_rate=decay_rate,
            decay_every=decay_every,
        )

    def peak_lr(self, context):
        """``k * base_lr`` with ``k = batch_size / base_batch_size``."""
        return float(_batch_ratio(self, context) * self.base_lr)


class SqrtScaling(_WarmupFromBaseRule):
    __doc__ = (
        """Square-root scaling rule: the peak grows as the square root of the batch.

    The peak is ``sqrt(k) * base_lr`` with ``k = batch_size / base_batch_size``,
    which keeps the variance of an update constant as the batch grows.  An
    optional warm-up climbs linearly from ``base_lr`` to the peak over
    ``warmup_epochs`` epochs, as in :class:`LinearScaling`.

    Parameters
    ----------
    base_lr : float, default=0.01
        Learning rate tuned for ``base_batch_size`` (positive).
    base_batch_size : int, default=32
        Batch size ``B0`` of the tuned run.
    warmup_epochs : float, default=0.0
        Length of the warm-up in epochs (0 for none).
    """
        + _decay_doc()
        + """

    See Also
    --------
    LinearScaling : Linear scaling of the peak.
    LEGW : Square-root scaling with a warm-up that grows with the batch.

    Examples
    --------
    >>> from skgpu_kernel.scaling import ScheduleContext, SqrtScaling
    >>> rule = SqrtScaling(base_lr=0.1, base_batch_size=32)
    >>> [rule.peak_lr(ScheduleContext(b, 10, 1)) for b in (32, 128, 512)]
    [0.1, 0.2, 0.4]
    """
    )

    def __init__(
        self,
        base_lr=0.01,
        base_batch_size=32,
        *,
        warmup_epochs=0.0,
        decay=None,
        decay_power=1.0,
        end_lr=0.0,
        decay_rate=0.1,
        decay_every=1.0,
    ):
        super().__init__(
            base_lr,
            base_batch_size,
            warmup_epochs=warmup_epochs,
            decay=decay,
            decay_power=decay_power,
            end_lr=end_lr,
            decay_rate=decay_rate,
            decay_every=decay_every,
        )

    def peak_lr(self, context):
        """``sqrt(k) * base_lr`` with ``k = batch_size / base_batch_size``."""
        return _sqrt_scaled_base_lr(self, context)


class LEGW(WarmupDecayRule):
    __doc__ = (
        """Linear-epoch gradual warm-up (You et al.): square-root peak, warm-up growing with the batch.

    The peak is ``sqrt(k) * base_lr`` with ``k = batch_size / base_batch_size`` and
    the warm-up lasts ``w = k * base_warmup_epochs`` epochs, which is as many
    updates as the base run's warm-up: a batch ``k`` times larger makes ``k``
    times fewer updates per epoch.  During the warm-up the rate of update ``t`` is
    ``peak * min(1, (t + 1) / (w * steps_per_epoch))``; counting from ``t + 1``
    makes the first update move the model instead of using a zero rate.  The
    decay then runs from epoch ``w`` to the end of the run (none if the warm-up
    fills the whole run); by default it is polynomial of power 2 down to
    ``end_lr``.

    Parameters
    ----------
    base_lr : float, default=0.01
        Learning rate tuned for ``base_batch_size`` (positive).
    base_batch_size : int, default=32
        Batch size ``B0`` of the tuned run.
    base_warmup_epochs : float, default=0.25
        Warm-up ``w0`` in epochs at the base batch size (0 for none).
    """
        + _decay_doc(decay='"polynomial"', decay_power="2.0")
        + """

    See Also
    --------
    SqrtScaling : The same peak without the batch-dependent warm-up.

    References
    ----------
    .. [1] Y. You, J. Hseu, C. Ying, J. Demmel, K. Keutzer and C.-J. Hsieh,
       "Large-batch training for LSTM and beyond", SC 2019. arXiv:1901.08256.

    Examples
    --------
    Four times the base batch: twice the peak, a warm-up of ``4 * 0.25 = 1``
    epoch (4 updates), then quadratic decay to zero at the end of epoch 3.

    >>> from skgpu_kernel.scaling import LEGW
    >>> rule = LEGW(base_lr=0.1, base_batch_size=32)
    >>> rule.schedule(128, 13, steps_per_epoch=4, n_epochs=3).round(4).tolist()
    [0.05, 0.1, 0.15, 0.2, 0.2, 0.1531, 0.1125, 0.0781, 0.05, 0.0281, 0.0125, 0.0031, 0.0]
    """
    )

    _parameter_constraints: ClassVar[dict] = {
        **_DECAY_CONSTRAINTS,
        **_BATCH_CONSTRAINTS,
        "base_warmup_epochs": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(
        self,
        base_lr=0.01,
        base_batch_size=32,
        *,
        base_warmup_epochs=0.25,
        decay="polynomial",
        decay_power=2.0,
        end_lr=0.0,
        decay_rate=0.1,
        decay_every=1.0,
    ):
        super().__init__(
            decay=decay, decay_power=decay_power, end_lr=end_lr, decay_rate=decay_rate, decay_every=decay_every
        )
        self.base_lr = base_lr
        self.base_batch_size = base_batch_size
        self.base_warmup_epochs = base_warmup_epochs

    def peak_lr(self, context):
        """``sqrt(k) * base_lr`` with ``k = batch_size / base_batch_size``."""
        return _sqrt_scaled_base_lr(self, context)

    def _warmup(self, context):
        return _batch_ratio(self, context) * self.base_warmup_epochs, 0.0, 1


class EigenProRule(WarmupDecayRule):
    __doc__ = (
        """EigenPro's analytic step size for the batch, from the kernel's spectrum (Ma and Belkin).

    For a batch of ``m`` samples the peak is ``scale`` times

    * ``m / beta`` up to the critical batch ``m* = beta / lambda_1`` (a step of
      ``1 / beta`` on one sample interpolates it),
    * ``0.99 * 2 m / (beta + (m - 1) lambda_1)`` beyond, which saturates near
      ``2 / lambda_1``, the edge of stability of the top eigendirection,

    where ``beta`` and ``lambda_1`` are the largest diagonal entry and the top
    eigenvalue of the (preconditioned) kernel operator, provided in the context by
    the kernel machines (the linear SGD models provide those of the data's
    second-moment matrix).  The rule needs no tuning: this is the default of
    :class:`~skgpu_kernel.AdaptiveKernelRegressor` and
    :class:`~skgpu_kernel.AdaptiveKernelClassifier`.

    With ``step="optimal"`` the peak is instead ``m / (beta + (m - 1) lambda_1)``,
    the step that minimises the expected error after one mini-batch step on a
    quadratic in the interpolation regime (Ma, Bassily and Belkin, 2018): close to
    ``m / beta`` for batches well below ``m*`` and saturating at ``1 / lambda_1``,
    half the edge of stability, so batches far beyond ``m*`` stay safe when
    ``lambda_1`` is an estimate.  It is the default of the linear SGD models
    (alias ``"optimal"``), whose batches follow the device's throughput rather than
    ``m*``.

    Parameters
    ----------
    scale : float, default=1.0
        Factor on the analytic step (positive); above 1 the iteration may diverge.
    step : {"maximal", "optimal"}, default="maximal"
        EigenPro 2's step (linear up to ``m*``, then towards ``2 / lambda_1``) or the
        optimal mini-batch step (towards ``1 / lambda_1``).
    """
        + _decay_doc()
        + """

    References
    ----------
    .. [1] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
       large batch training", SysML 2019. arXiv:1806.06144.
    .. [2] S. Ma, R. Bassily and M. Belkin, "The power of interpolation: understanding
       the effectiveness of SGD in modern over-parametrized learning", ICML 2018.
       arXiv:1712.06559.

    Examples
    --------
    With ``beta = 1`` and ``lambda_1 = 0.01`` the critical batch is 100: the step
    grows linearly up to it, then saturates towards ``2 / lambda_1 = 200``.

    >>> from skgpu_kernel.scaling import EigenProRule, ScheduleContext
    >>> rule = EigenProRule()
    >>> [round(rule.peak_lr(ScheduleContext(m, 1, 1, beta=1.0, top_eigenvalue=0.01)), 2) for m in (1, 100, 10000)]
    [1.0, 100.0, 196.06]
    """
    )

    requires_spectrum: ClassVar[bool] = True
    _parameter_constraints: ClassVar[dict] = {
        **_DECAY_CONSTRAINTS,
        "scale": [Interval(Real, 0, None, closed="neither")],
        "step": [StrOptions({"maximal", "optimal"})],
    }

    def __init__(
        self,
        scale=1.0,
        *,
        step="maximal",
        decay=None,
        decay_power=1.0,
        end_lr=0.0,
        decay_rate=0.1,
        decay_every=1.0,
    ):
        super().__init__(
            decay=decay, decay_power=decay_power, end_lr=end_lr, decay_rate=decay_rate, decay_every=decay_every
        )
        self.scale = scale
        self.step = step

    def peak_lr(self, context):
        """``scale`` times EigenPro's step size for ``context.batch_size``."""
        if context.beta is None or context.top_eigenvalue is None:
            raise ValueError(
                "EigenProRule needs the spectrum: the ScheduleContext must carry beta and top_eigenvalue "
                "(the kernel machines provide them; use another scaling rule elsewhere)."
            )
        m, beta, top = context.batch_size, context.beta, context.top_eigenvalue
        if self.step == "optimal":
            return float(self.scale * m / (beta + (m - 1) * top))
        return float(self.scale * eigenpro_step_size(m, beta, top))
