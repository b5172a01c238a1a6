"""What the shell hands a kernel fit: the validated rows, the warm start's continuation and the runtime.

The rows (:class:`KernelFitInput`) and the estimator's parameters
(:class:`~skgpu_kernel.planning.parameters.KernelFitParameters`) are passed as
they are: from the resolve stage on, the plan holds both
(:class:`~skgpu_kernel.planning.kernel_policy.FitPlan`).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import unequal_weights


@dataclass(frozen=True)
class KernelContinuation:
    """What a warm start continues from: the previous fit's coefficients, centers, shuffle and bandwidth.

    ``bandwidth`` (None for kernels without one) is kept instead of searched again:
    the coefficients belong to that kernel; so is ``transform``, the learnt features'
    ``L`` (None: the input's features), see
    ``skgpu_kernel.fit.feature_learning``.
    """

    dual_coef: np.ndarray
    centers: np.ndarray
    training_order: np.ndarray
    bandwidth: float | None = None
    transform: np.ndarray | None = None


@dataclass(frozen=True)
class KernelFitInput:
    """The validated host data of a kernel fit.

    Parameters
    ----------
    X : ndarray or memory map of shape (n, d)
    Y : ndarray of shape (n, l)
        Float targets (the classifier's class codes), not centred.
    weights : ndarray of shape (n,)
        Positive sample weights (zero-weight rows already dropped).
    stratify : ndarray of shape (n,) or None
        Class indices the validation split is stratified by.
    centers : ndarray of shape (p, d) or None
        The user's validated centers (float64).
    n_centers : int, "auto" or None
        Centers to draw from the shuffled training rows; ``"auto"``: as many as
        :func:`~skgpu_kernel.planning.solver.plan_auto_centers` says (None: every point).
    continuation : KernelContinuation or None
        The previous fit, when ``warm_start`` continues it.
    X_device : Tensor of shape (n, d) or None
        The same rows on the compute device, in ``X``'s dtype: the fit's one copy
        of them (:func:`with_rows_on_device`), which every stage takes its rows
        from; None: each stage copies its rows from ``X``.
    column_blocks : tuple of ndarray
        The columns of ``X`` that encode one categorical input column each (its
        levels' indicators, at least two): one block of a learnt metric
        (:func:`~skgpu_kernel.agop.block_diagonal`).
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    stratify: np.ndarray | None = None
    centers: np.ndarray | None = None
    n_centers: int | None = None
    continuation: KernelContinuation | None = None
    X_device: torch.Tensor | None = None
    column_blocks: tuple = ()

    @property
    def uses_centers(self):
        return self.centers is not None or self.n_centers is not None

    @property
    def equal_weights(self):
        """Every sample weight the same (the criteria then skip the weights)."""
        return unequal_weights(self.weights) is None


@dataclass(frozen=True)
class KernelRuntime:
    """Resolved facts of the run: devices, precision, memory, randomness, process group.

    ``rng`` is the fit's ``RandomState`` (the validation split, the shuffle and a
    streamed fit's seed are drawn from it, in that order); ``generator`` seeds the
    epoch permutations; ``group`` is the ``torch.distributed`` group the centers
    are sharded over (or None); ``memory_events`` are the events earlier stages of
    the fit recorded (out of memory, divergences, a stage run again:
    :mod:`skgpu_kernel.out_of_memory`), in order, which the fit's record
    (``fit_attempts_``) starts with: a stage returns its events and the next
    stage is handed a runtime that holds them (:meth:`recorded`);
    ``held_bytes`` is what the fit's rows held on the device take of the user's
    budget (already off ``budget``).
    """

    devices: list
    dtype: torch.dtype
    budget: int
    rng: np.random.RandomState
    generator: torch.Generator
    group: object = None
    first_step: int = 0
    epochs_done: int = 0
    log: Callable | None = None
    memory_events: tuple = ()
    held_bytes: int = 0

    def recorded(self, events):
        """This runtime with ``events``, the fit's record of events so far (earlier ones included)."""
        return dataclasses.replace(self, memory_events=tuple(events))

    @property
    def itemsize(self):
        """Bytes per value of the training dtype."""
        return torch.finfo(self.dtype).bits // 8

    @property
    def n_shards(self):
        """Shards the centers would be split in: the group's ranks, else the devices."""
        return self.group.size() if self.group is not None else len(self.devices)


def log_fit(runtime, parameters, message):
    """``verbose``: ``message`` with the estimator's name, where the runtime logs."""
    if runtime.log is not None:
        runtime.log(f"[{parameters.name}] {message}")
