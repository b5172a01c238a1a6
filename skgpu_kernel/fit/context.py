"""What every solver's run of an attempt starts from, and how its stages shrink out of device memory."""

import dataclasses

import torch

from .._validation import unequal_weights
from .._warnings import warn_user
from ..blockwise import DeviceCopier, PredictionTensors, measure_batch_capacity, rows_taken
from ..device import SaturationBatch
from ..operators import OperatorPlan, measure_operator
from ..out_of_memory import ShrinkingStage, halvings, out_of_memory_reason, release_cached_memory
from ..planning.kernel import KernelProblem
from ..planning.operator import operator_probe_shape
from ..preconditioner import Spectrum
from ..process_group import agree_on_object
from .attempts import Fallback, FallbackNeeded

# Out of memory in the preconditioner's eigensystem, the Nystrom subsample is halved
# down to this many points (fewer when the plan had fewer).
SMALLEST_SUBSAMPLE = 100


class AttemptContext:
    """What every solver's run starts from: the prepared fit and runtime, the device copier, the penalty's scale.

    And how its stages go on out of device memory (:meth:`shrinking`): every stage
    that allocates in proportion to a planned size runs through one
    :class:`~skgpu_kernel.out_of_memory.ShrinkingStage`, whose events the driver
    records after the attempt (``fit_attempts_``).  One per attempt; the solvers'
    runs read it, none extends it.
    """

    def __init__(self, prepared, runtime, events, attempt):
        self.prepared, self.runtime = prepared, runtime
        # The attempt's own plan (the prepared fit's, or a fallback's new one), and the
        # coefficients it starts from.
        self.plan = attempt.plan
        self.coef_init = prepared.coef_init if attempt.coef_init is None else attempt.coef_init
        self.device = runtime.devices[0]
        self.to_device = DeviceCopier(self.device, runtime.dtype, prepared.offset)
        self.itemsize = runtime.itemsize
        self.events = events  # this attempt's own, which the driver adds to the record after it
        # The draws the attempt starts from: a refit with half the batch or subsample makes the same ones.
        self._draws = [
            (source, source.get_state()) for source in (runtime.rng, runtime.generator) if source is not None
        ]

    @property
    def alpha(self):
        """The attempt's penalty."""
        return self.plan.alpha

    @property
    def parameters(self):
        """The parameters the attempt plans with (a fallback's cache, components, batch or subsample in place)."""
        return self.plan.parameters

    @property
    def kernel(self):
        """The kernel fitted with."""
        return self.plan.kernel

    def rows(self, indices):
        """The training rows ``indices`` on the device, centred in the fit's dtype, as ``to_device(X[indices])``."""
        return self.to_device(rows_taken(self.prepared.X, self.prepared.X_device, indices))

    def centers(self):
        """The centers on the device, centred in the fit's dtype: the training rows they are, or the user's."""
        data = self.prepared
        if data.center_rows is None or data.X_device is None:
            return self.to_device(data.centers)
        return self.rows(data.center_rows)

    def measured(self, problem, rows, centers=None):
        """What planning reads of the operator ``K(rows, centers)``, measured once: the one measuring step of a fit.

        The grid ``rows`` (and ``centers``, where they are not rows of them) lie
        on and the speed of int8 products at the block a cache fill takes
        (:func:`~skgpu_kernel.operators.measure_operator`), for the operator
        planner (:func:`~skgpu_kernel.planning.operator.plan_operator`).  Under a
        process group every rank plans with rank 0's measurements.  Rows that are
        not on the device (streamed) are measured as on no grid.
        """
        if rows is None:
            return OperatorPlan()
        measurements = measure_operator(self.kernel, rows, operator_probe_shape(problem), centers)
        return agree_on_object(measurements, self.runtime.group, self.device)

    def shrinking(self, stage, what, sizes):
        """The :class:`~skgpu_kernel.out_of_memory.ShrinkingStage` of a stage of this run.

        One rank of a process group cannot shrink alone (the others would wait in
        its collectives): there the planned size alone is tried.
        """
        sizes = iter(sizes)
        if self.runtime.group is not None:
            sizes = iter([next(sizes)])
        return ShrinkingStage(stage, what, sizes, self.device, self.events)

    def on_subsample(self, compute, subsample_size):
        """``compute()`` on the layout's Nystrom subsample of ``subsample_size``; out of memory, the fit planned again.

        A smaller subsample is a new plan (its layout, memory and cache follow it):
        the driver runs a new attempt with half the subsample
        (:meth:`_planned_again`, stage ``"preconditioner subsample"``), down to
        :data:`SMALLEST_SUBSAMPLE` points.
        """
        try:
            return compute()
        except (torch.OutOfMemoryError, RuntimeError) as error:
            reason = out_of_memory_reason(error)
            halved = max(subsample_size // 2, SMALLEST_SUBSAMPLE)
            if halved >= subsample_size or self.runtime.group is not None:
                raise
        why = f"out of memory in the preconditioner's subsample of {subsample_size} rows ({reason})"
        fallback = Fallback.of(f"{why}: refit with subsample_size {halved}", subsample_size=halved)
        self._planned_again(fallback, "preconditioner subsample", subsample_size, reason)

    def reported(self, solution):
        """``solution``, once the warnings its solver reported (``Solution.warnings``) are raised: no solver warns."""
        for message, category in solution.warnings:
            warn_user(message, category)
        return solution

    def solved_or_halved(self, solve, batch_size):
        """``solve()``, an iterative solver's run at ``batch_size``; out of device memory, the fit planned again.

        The step that ran out of memory is the loop's largest allocation, so the
        driver runs a new attempt with half the batch, from the start (a new plan:
        its steps and step sizes follow the batch) and from the random state this
        attempt started from (the same shuffles, so that the two differ by the
        batch alone), recorded as the stage ``"epoch batch"``.  Any other error, a
        batch of one, or a rank of a process group (the others would wait in its
        collectives) raises the error.
        """
        try:
            return solve()
        except (torch.OutOfMemoryError, RuntimeError) as error:
            reason = out_of_memory_reason(error)
            if batch_size == 1 or self.runtime.group is not None:
                raise
            halved = batch_size // 2
        fallback = Fallback.of(
            f"out of memory in a step of {batch_size} rows ({reason}): refit with batch_size {halved}",
            batch_size=halved,
        )
        self._planned_again(fallback, "epoch batch", batch_size, reason)

    def _planned_again(self, fallback, stage, planned, reason):
        """Raise ``fallback``, a new attempt with one planned size smaller than ``planned``, out of memory in ``stage``.

        Called once the failed run's frames are gone (its tensors freed): CUDA's
        cached blocks are released, the random state this attempt started from is
        restored (the new attempt makes the same draws, so that the two differ by
        the size alone), and the shrink is recorded as ``stage``'s.
        """
        ((what, smaller),) = fallback.changes.items()
        release_cached_memory(self.device)
        for source, state in self._draws:
            source.set_state(state)
        self.events.shrank(stage, what, planned, smaller, reason)
        if self.runtime.log is not None:
            self.runtime.log(f"[{self.parameters.name}] {fallback.reason}")
        raise FallbackNeeded(fallback)

    def cached_or_planned_again(self, fill, plan, what):
        """``fill()`` the plan's kernel cache ``what``; where the device refuses it, the fit planned again without one.

        The budget is planned from the memory free when the fit starts; a device
        that is shared (or fragmented) may still refuse the cache's allocation,
        which is then recorded and the run asks the driver for the fit planned
        again with kernel blocks computed per batch (a new attempt).
        """

        def run(kind):
            if kind == "cached":
                return fill()
            message = f"the kernel cache ({plan.memory.describe()}) did not fit the memory free on {self.device}"
            warning = (
                f"{message[0].upper()}{message[1:]}: the fit is planned again with kernel blocks computed per "
                "batch. Lower memory_budget or set cache_kernel=False."
            )
            raise FallbackNeeded(Fallback.of(message, cache_kernel=False, warning=warning, category=RuntimeWarning))

        return self.shrinking("cache fill", what, ("cached", "evaluated"))(run)

    def cached_or_evaluated(self, fill, evaluated, what):
        """``fill()``: a cache the plan keeps; ``evaluated`` (blocks computed per product) where the device refuses it.

        The rest of the plan is kept: the products are the same, only computed again.
        """
        return self.shrinking("cache fill", what, ("cached", "evaluated"))(
            lambda kind: fill() if kind == "cached" else evaluated
        )

    def held_out_score(self, predict, row_block, targets):
        """``score(coef)``: the validation score of the held-out rows' ``predict(coef, row_block)`` against ``targets``.

        Where the device runs out of memory the row block is halved, for the rest
        of the fit (each row's prediction does not depend on the block).
        """
        stage = self.shrinking("validation", "validation row block", halvings(row_block))
        validation_score = self.prepared.validation_score
        return lambda coef: validation_score(stage(lambda rows: predict(coef, rows)), targets)

    def problem_with(self, **sizes):
        """The :class:`KernelProblem` of the host data, with the run's own ``sizes``."""
        X, Y = self.prepared.X, self.prepared.Y
        held = self.runtime.held_bytes
        return KernelProblem(
            X.shape[0], X.shape[1], Y.shape[1], self.itemsize, self.kernel.extra_blocks, held_bytes=held, **sizes
        )

    def validation_tensors(self):
        """The held-out rows and targets on the device (a :class:`KernelFitInput` of tensors), or None."""
        if self.prepared.validation is None:
            return None
        held_out = self.prepared.validation
        X = held_out.X if held_out.X_device is None else held_out.X_device
        Y = self.to_device(held_out.Y, center=False)
        return dataclasses.replace(held_out, X=self.to_device(X), Y=Y, X_device=None)

    def weights_tensor(self, weights):
        """Normalised sample weights on the device, or None when all are equal."""
        if unequal_weights(weights) is None:
            return None
        return self.to_device(weights / weights.max(), center=False)

    def prediction_tensors(self, centers_dev, coef, operator_plan=None, center_codes=None):
        """The tensors of predictions after fit; on the operator plan's grid where the fit's products took it."""
        tensors = PredictionTensors(self.device, centers_dev, coef, self.to_device.offset)
        if center_codes is None:
            return tensors
        return dataclasses.replace(tensors, grid=operator_plan.grid, center_codes=center_codes)

    def ridge(self):
        """``alpha`` on the scale of the normalised weights (``weights / weights.max()``) the loops see."""
        return self.alpha / float(self.prepared.weights.max())

    def starting_coef(self, n_coefficients):
        """The warm start's coefficients, or zeros, on the device."""
        coef = self.coef_init
        if coef is None:
            coef = torch.zeros(n_coefficients, self.prepared.Y.shape[1], dtype=self.runtime.dtype)
        return coef.to(self.device, self.runtime.dtype)

    def batch_capacity(self, layout, probe_rows, centers_dev, problem):
        """EigenPro's batch capacity: the user's batch, the memory limit of a cached kernel, or a throughput probe.

        Returns a :class:`~skgpu_kernel.device.SaturationBatch`: the probe's timings
        are empty where none ran.
        """
        given = self.given_batch(problem.n_rows)
        if given is not None:
            return SaturationBatch(given, {})
        if layout.cached:
            # Steps read their kernel rows: an epoch reads the cache once whatever the
            # batch, so a larger batch costs no more per row and no throughput is probed
            # (see planning.kernel.cached_batch_limit).
            return SaturationBatch(layout.memory_limit, {})
        return measure_batch_capacity(
            self.kernel,
            probe_rows,
            centers_dev,
            problem.n_outputs,
            layout.memory_limit,
            layout.column_block,
            layout.subsample_size,
        )

    def given_batch(self, n_rows):
        """The user's batch (bounded by ``n_rows``), or None when it is to be measured."""
        batch_size = self.parameters.batch_size
        return None if batch_size == "auto" else min(batch_size, n_rows)

    def spectral_settings(self, n_rows, eigenvalue_shift, diagonal_shift):
        """The :class:`~skgpu_kernel.preconditioner.Spectrum` EigenPro's preconditioner is asked for (not yet measured).

        The user's components and damping, a penalty's shifts, ``n``.
        """
        parameters = self.parameters
        return Spectrum(parameters.n_components, parameters.damping, eigenvalue_shift, diagonal_shift, n_rows)


class MeasuringStep:
    """A run's measuring step: what the planning call (:func:`~skgpu_kernel.planning.run.plan_run`) asks the device.

    It measures the operator ``K(rows, centers)`` and tells the rows' facts the
    plan reads; each run hands in the measurements its planning asks for (the
    batch capacity, the spectrum, the choices every rank takes, the condition of
    CG's system) as functions of the layout chosen.

    Parameters
    ----------
    context : AttemptContext
    rows : Tensor or None
        The training rows on the device (None: streamed).
    centers : Tensor or None
        The centers on the device where they are not rows of ``rows``.
    **measurements : callable
        ``capacity(layout)``, ``spectrum(layout, capacity)``,
        ``agreed(choices)``, ``condition(layout, max_components)``: those the run's
        planning asks for.
    """

    def __init__(self, context, rows, centers=None, **measurements):
        self.context, self.measured_rows, self.measured_centers = context, rows, centers
        self.measurements = measurements

    @property
    def device(self):
        return self.context.device

    @property
    def held_out(self):
        """Whether held-out rows score each epoch."""
        return self.context.prepared.validation is not None

    @property
    def ridge(self):
        """The attempt's penalty on the scale of the normalised weights (:meth:`AttemptContext.ridge`)."""
        return self.context.ridge()

    def operator(self, problem):
        """The operator's facts (grid, int8 products' speed), measured once (:meth:`AttemptContext.measured`)."""
        return self.context.measured(problem, self.measured_rows, self.measured_centers)

    def capacity(self, layout):
        """The batch capacity (:class:`~skgpu_kernel.device.SaturationBatch`) of ``layout``."""
        return self.measurements["capacity"](layout)

    def spectrum(self, layout, capacity):
        """The preconditioner's :class:`~skgpu_kernel.preconditioner.Spectrum` on ``layout``'s subsample."""
        return self.measurements["spectrum"](layout, capacity)

    def agreed(self, choices):
        """The layout's ``choices`` every rank of a process group takes."""
        return self.measurements["agreed"](choices)

    def condition(self, layout, max_components):
        """The estimated condition number of CG's preconditioned system on ``layout``'s subsample."""
        return self.measurements["condition"](layout, max_components)
