"""EigenPro 2 and EigenPro 3 attempts: the run planned in one call (measured capacity and spectrum), operator, loop."""

import dataclasses
import functools
import math

import numpy as np
import torch

from .._validation import unequal_weights
from .._warnings import warn_user
from ..kernels import bandwidth_of
from ..operators import CenterShards, center_codes
from ..planning.kernel import (
    BETA_PROBE_ROWS,
    PROJECTION_JITTER,
    PROJECTION_MAX_ITERATIONS,
    PROJECTION_TOL,
    preconditioner_target,
)
from ..planning.run import plan_run
from ..preconditioner import max_usable_components, plan_preconditioner
from ..process_group import agree, agree_on_object
from ..row_sources import as_row_source
from ..scaling import ScheduleContext
from ..scaling_rules import warn_if_warmup_fills_run
from ..solvers.eigenpro import EigenProPlan, solve_eigenpro2
from ..solvers.eigenpro3 import ExactProjection, InMemoryBatches, IterativeProjection, StreamedBatches, solve_eigenpro3
from ..solvers.solution import Targets
from .context import MeasuringStep
from .finish import KernelFitResult
from .operator import EveryPointOperators


def _run_eigenpro(stages, attempt):
    """Plan (one call, which asks the stages' measuring step), build, then the loop: both EigenPro solvers.

    ``stages`` (:class:`_EigenPro2Stages` or :class:`_EigenPro3Stages`) measures for
    the planning call and says what each stage does for its model; this function
    runs them in order.
    """
    context = stages.context
    runtime, parameters = context.runtime, context.parameters
    plan = plan_run(stages.run, stages.problem, context.plan, stages.measuring_step())
    spectrum = plan.spectrum
    _warn_if_degenerate_kernel(spectrum, plan.subsample_size, runtime.dtype, bandwidth_of(context.kernel))
    for message in plan.warnings:
        warn_user(message, UserWarning)
    stages.prepare(plan)
    steps_per_epoch = math.ceil(stages.problem.n_rows / plan.batch_size)
    learning_rate_for = _learning_rate_function(parameters.scaling_rule, spectrum, parameters.n_epochs)
    warn_if_warmup_fills_run(
        parameters.scaling_rule,
        _schedule_context(spectrum, plan.batch_size, steps_per_epoch, parameters.n_epochs),
    )
    _log_plan(stages, plan, learning_rate_for(runtime.first_step, plan.batch_size, steps_per_epoch))
    n_components = spectrum.preconditioner.n_components
    solver_plan = EigenProPlan(
        batch_size=plan.batch_size,
        learning_rate_for=learning_rate_for,
        n_epochs=parameters.n_epochs,
        first_step=runtime.first_step,
        stopping=plan.stopping,
        log=runtime.log,
        events=dataclasses.replace(context.events, log=None),  # the loops log their own line
        preconditioner=spectrum.preconditioner if n_components else None,
    )
    result = context.solved_or_halved(functools.partial(stages.solve, plan, solver_plan), plan.batch_size)
    context.reported(result)
    stages.release()  # the kernel cache, freed before the centers are copied out: one copy of X less at the peak
    device_cache = stages.device_cache(result.coef)
    return KernelFitResult(result, centers=stages.centers_host(), device_cache=device_cache, attempt=attempt.ran(plan))


def _log_plan(stages, plan, first_step_size):
    """``verbose``: the run's plan, its operator, spectrum, scaling rule and first step size."""
    context = stages.context
    runtime, parameters, spectrum = context.runtime, context.parameters, plan.spectrum
    if runtime.log is None:
        return
    runtime.log(
        f"[{parameters.name}] {stages.where()}, dtype={runtime.dtype}, n={stages.problem.n_rows}, {plan.describe()}, "
        f"{plan.operator.describe()}, critical batch "
        f"{spectrum.critical_batch:.1f} -> {spectrum.critical_batch_preconditioned:.1f} with "
        f"{spectrum.preconditioner.n_components} components, scaling rule {parameters.scaling_rule!r}, step size "
        f"{first_step_size:.4g}"
    )


class _EigenPro2Stages:
    """EigenPro 2's stages for :func:`_run_eigenpro`: every training row a center, the solver ``solve_eigenpro2``.

    Its measuring step measures ``K(X, X)``, the batch capacity and the spectrum
    on the layout's subsample.
    """

    run = "eigenpro2"

    def __init__(self, context):
        self.context = context
        self.rows = EveryPointOperators(context)

    def measuring_step(self):
        return MeasuringStep(self.context, self.rows.X_dev, capacity=self.capacity, spectrum=self.spectrum)

    @property
    def problem(self):
        return self.rows.problem

    def where(self):
        return f"device={self.context.device}"

    def centers_host(self):
        return self.rows.centers_host()

    def device_cache(self, coef):
        return self.rows.device_cache(coef)

    def capacity(self, layout):
        return self.context.batch_capacity(layout, self.rows.X_dev, self.rows.centers_dev, layout.problem)

    def spectrum(self, layout, capacity):
        # The iteration solves (K + alpha I) a = Y: every eigenvalue of K / n moves up
        # by alpha / n and every diagonal entry by alpha.
        context, n_rows = self.context, self.problem.n_rows
        ridge = context.ridge()
        spectral = context.spectral_settings(n_rows, ridge / n_rows, ridge)
        target = preconditioner_target(capacity)
        X_dev, size = self.rows.X_dev, layout.subsample_size
        return context.on_subsample(
            lambda: plan_preconditioner(context.kernel, X_dev, size, target, spectral, layout.column_block(1024)), size
        )

    def prepare(self, plan):
        """The operators of ``K(X, X)`` (and ``K(X_val, X)``) the plan asks for."""
        self.rows.build(plan)

    def release(self):
        self.rows.release()

    def solve(self, plan, solver_plan):
        context = self.context
        data = context.prepared
        Y_dev = context.to_device(data.Y[data.order], center=False)
        targets = Targets(Y_dev, context.weights_tensor(data.weights[data.order]))
        validation = self.rows.held_out_score()
        solver_plan = dataclasses.replace(
            solver_plan,
            validation=validation,
            coef_init=None if context.coef_init is None else context.starting_coef(self.problem.n_rows),
            ridge=context.ridge(),
            column_block_for=plan.layout.column_block,
            generator=context.runtime.generator,
        )
        operator = self.rows.train
        result = solve_eigenpro2(operator, targets, solver_plan)
        self.rows.report_epochs(result, plan, operator)
        return result


def run_eigenpro2(context, attempt):
    """EigenPro 2 (every training row a center): :func:`_run_eigenpro` on :class:`_EigenPro2Stages`."""
    return _run_eigenpro(_EigenPro2Stages(context), attempt)


class _EigenPro3Stages:
    """EigenPro 3's stages for :func:`_run_eigenpro`: ``p`` centers; the solver ``solve_eigenpro3``.

    Its measuring step measures ``K(X, Z)``, the batch capacity and the spectrum
    on the centers' subsample, and agrees with the other ranks of a process group
    on each and on the layout's choices.  The centers' shards, the projection and the batches
    (in memory or streamed); :meth:`prepare` and :meth:`solve` are the one place
    their cache and grid branches are taken.
    """

    run = "eigenpro3"

    def __init__(self, context):
        self.context = context
        data, runtime = context.prepared, context.runtime
        self.problem = context.problem_with(
            n_centers=data.centers.shape[0],
            n_shards=runtime.n_shards,
            centers_from_data=data.centers_from_data,
            streamed=context.plan.streamed,
        )
        self.Z_dev = context.centers()
        self.centers_dev = context.kernel.prepare_centers(self.Z_dev)
        self.X_dev = None if self.problem.streamed else context.rows(data.order)
        self.operator_plan, self.center_codes = None, None

    def measuring_step(self):
        centers = None if self.problem.centers_from_data else self.Z_dev
        measured = {"capacity": self.capacity, "spectrum": self.spectrum, "agreed": self.agreed}
        return MeasuringStep(self.context, self.X_dev, centers, **measured)

    def where(self):
        group = self.context.runtime.group
        rank = f" (rank {group.rank()} of {group.size()})" if group is not None else ""
        return f"devices={[str(device) for device in self.context.runtime.devices]}{rank}"

    def centers_host(self):
        return self.context.prepared.centers

    def device_cache(self, coef):
        return self.context.prediction_tensors(self.centers_dev, coef, self.operator_plan, self.center_codes)

    def agreed(self, choices):
        """The layout's choices of rank 0, which every rank takes (ranks may see different free memory)."""
        return agree(choices, self.context.runtime.group, self.context.device)

    def capacity(self, layout):
        context = self.context
        probe_rows = self.Z_dev if self.X_dev is None else self.X_dev
        measured = context.batch_capacity(layout, probe_rows, self.centers_dev, layout.problem)
        if context.given_batch(layout.problem.n_rows) is None and not layout.cached:
            # Ranks time their own devices; they must agree on the batch to stay in step.
            (agreed,) = agree([measured.batch], context.runtime.group, context.device)
            measured = measured.bounded(agreed)
        return measured

    def spectrum(self, layout, capacity):
        return self.context.on_subsample(lambda: self._spectrum(layout, capacity), layout.subsample_size)

    def _spectrum(self, layout, capacity):
        # The spectrum is estimated on the first s centers (the Nystrom subsample), and
        # the preconditioned beta also on training rows outside it.
        context, data = self.context, self.context.prepared
        if self.X_dev is not None:
            probe_rows = self.X_dev[:BETA_PROBE_ROWS]
        else:
            probe_rows = context.rows(np.sort(data.order[:BETA_PROBE_ROWS]))
        # The penalty alpha ||f||^2 / n adds alpha / n to the operator and to one sample's curvature.
        shift = context.ridge() / self.problem.n_rows
        spectral = context.spectral_settings(self.problem.n_rows, shift, shift)
        target = preconditioner_target(capacity)
        spectrum = plan_preconditioner(
            context.kernel, self.Z_dev, layout.subsample_size, target, spectral, layout.column_block(1024), probe_rows
        )
        # Every rank estimates it; its eigensolver may round differently on each, and the
        # ranks' steps must be the same: rank 0's spectrum is everyone's.
        return agree_on_object(spectrum, context.runtime.group, context.device)

    def prepare(self, plan):
        """The run's operator plan, and the centers' grid codes where it takes the grid.

        The shards, cache and projection are built by :meth:`solve`.
        """
        self.operator_plan = plan.operator
        if self.operator_plan.on_grid:
            self.center_codes = center_codes(self.Z_dev, self.operator_plan.grid)

    def release(self):
        """Nothing to free: the shards and their cache live in :meth:`solve` alone."""

    def _shards(self, column_block):
        """The centers' shards, on the operator plan's grid where it takes one."""
        runtime, grid = self.context.runtime, self.operator_plan.grid
        kernel = self.context.kernel
        return CenterShards(kernel, self.Z_dev, runtime.devices, column_block, group=runtime.group, grid=grid)

    def solve(self, plan, solver_plan):
        context = self.context
        shards = self._shards(plan.column_block)
        if plan.cached:
            context.cached_or_planned_again(lambda: shards.cache(self.X_dev, plan.row_block), plan, "K(X, Z)")
        projection = self._projection(plan, shards, solver_plan.preconditioner)
        batches = self._batches(plan)
        score, validation = None, context.validation_tensors()
        if validation is not None:
            X_val = validation.X
            score = context.held_out_score(
                lambda coef, rows: shards.operator(X_val, rows).matmul(coef), plan.row_block, validation.Y
            )
        solver_plan = dataclasses.replace(
            solver_plan,
            validation=score,
            coef_init=context.starting_coef(plan.layout.problem.n_centers),
            projection=projection,
            n_temporary=plan.n_temporary,
        )
        return solve_eigenpro3(shards, batches, solver_plan)

    def _projection(self, plan, shards, preconditioner):
        context = self.context
        if plan.projection == "exact":
            jitter = max(PROJECTION_JITTER, 10 * torch.finfo(context.runtime.dtype).eps)
            return ExactProjection(context.kernel, self.Z_dev, jitter, context.runtime.dtype)
        if plan.cached and plan.layout.problem.centers_from_data:
            center_shards = shards  # K(Z, Z) is the first p rows of the K(X, Z) cache
        else:
            center_shards = self._shards(plan.column_block)
            if plan.layout.cache_centers:  # else (or where the device refuses it) K(Z, Z) is evaluated per product
                context.cached_or_evaluated(lambda: center_shards.cache(self.Z_dev, plan.row_block), None, "K(Z, Z)")
        return IterativeProjection(
            center_shards, self.Z_dev, preconditioner, PROJECTION_MAX_ITERATIONS, PROJECTION_TOL, plan.row_block
        )

    def _batches(self, plan):
        context = self.context
        data, runtime = context.prepared, context.runtime
        if self.operator_plan.streamed:
            sources = [as_row_source(data.X, "X"), as_row_source(data.Y, "y")]
            if unequal_weights(data.weights) is not None:
                sources.append(as_row_source(data.weights / data.weights.max(), "sample_weight"))
            seed = int(runtime.rng.randint(np.iinfo(np.int32).max)) + runtime.epochs_done
            offset = context.to_device.offset
            return StreamedBatches(sources, context.device, runtime.dtype, offset, plan.layout.buffer_rows, seed)
        order = data.order
        Y_dev = context.to_device(data.Y[order], center=False)
        return InMemoryBatches(self.X_dev, Y_dev, context.weights_tensor(data.weights[order]), runtime.generator)


def run_eigenpro3(context, attempt):
    """EigenPro 3 (``p`` centers): :func:`_run_eigenpro` on :class:`_EigenPro3Stages`."""
    return _run_eigenpro(_EigenPro3Stages(context), attempt)


def _learning_rate_function(scaling_rule, spectrum, n_epochs):
    """``learning_rate_for(step, batch_size, steps_per_epoch)`` for the solver, from the rule and the spectrum."""

    def learning_rate_for(step, batch_size, steps_per_epoch):
        return scaling_rule(step, _schedule_context(spectrum, batch_size, steps_per_epoch, n_epochs))

    return learning_rate_for


def _schedule_context(spectrum, batch_size, steps_per_epoch, n_epochs):
    return ScheduleContext(
        batch_size,
        steps_per_epoch,
        n_epochs,
        beta=spectrum.beta_preconditioned,
        top_eigenvalue=spectrum.top_eigenvalue_preconditioned,
    )


def _warn_if_degenerate_kernel(spectrum, subsample_size, dtype, bandwidth):
    """Warn when the bandwidth makes the kernel matrix numerically the identity or constant."""
    if subsample_size < 2 or not np.all(np.isfinite(spectrum.eigenvalues)):
        return  # a kernel returning inf/NaN is reported by the solver as an error
    eigenvalues = spectrum.eigenvalues
    described = "The kernel" if bandwidth is None else f"With bandwidth={bandwidth:.4g}, the kernel"
    if eigenvalues[0] * subsample_size <= 1.05 * spectrum.beta:
        warn_user(
            f"{described} matrix is numerically the identity: samples do not see each other, and "
            "predictions away from the training points are close to zero. The bandwidth is "
            "probably too small for the distances in the data.",
            UserWarning,
        )
    elif max_usable_components(eigenvalues, dtype) == 0:
        warn_user(
            f"{described} is numerically constant on the data in {dtype}: the model can fit "
            "little more than a constant. The bandwidth is probably too large for the "
            "distances in the data.",
            UserWarning,
        )
