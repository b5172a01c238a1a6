"""The kernel solvers and their one driver: EigenPro 2, EigenPro 3, CG on every point, CG on centers, direct.

:func:`~skgpu_kernel.solvers.kernel_fit.fit_kernel_model` resolves the fit (policy,
penalty, split, kernel, centers) and hands :func:`run_solver`, the driver, the same
:class:`KernelHostData` and :class:`KernelFitSettings` for every solver.  The
driver calls the function the registry (:data:`SOLVER_PATHS`) names for the solver
and the data with the attempt's :class:`_PathContext`, then every
:class:`Fallback` a solver asks for, and returns one :class:`PathOutcome` with the
attempts it ran.  No class here inherits from another: the two EigenPro solvers
run the same stages (layout, measured capacity, spectrum, plan, loop) through
:func:`_run_eigenpro`, each with its own stage object; EigenPro 2 and CG on every
point build the operators of ``K(X, X)`` from one :class:`_EveryPointOperators`;
CG needs no spectrum and no batch.  Every kernel product goes through
:mod:`skgpu_kernel.operators`.  No scikit-learn and no input validation here.
"""

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from .._warnings import warn_user
from ..blockwise import DeviceCopier, PredictionTensors, measure_batch_capacity, rows_taken
from ..buffer import as_row_source
from ..device import SaturationBatch, is_out_of_memory, matmul_gflops, synchronize
from ..grid import encode_on_grid
from ..operators import (
    CachedOperator,
    CenterShards,
    EvaluatedOperator,
    GridOperator,
    OperatorBlocks,
    OperatorMeasurements,
    filled_entries,
    measure_operator,
)
from ..out_of_memory import MemoryEvents, ShrinkingStage, halvings, in_row_blocks
from ..planning.kernel import (
    BETA_PROBE_ROWS,
    CACHE_DTYPE_NAMES,
    CACHE_FILL_COLUMNS,
    CG_MAX_CONDITION,
    CG_ROW_BLOCK,
    PROJECTION_JITTER,
    PROJECTION_MAX_ITERATIONS,
    PROJECTION_TOL,
    KernelProblem,
    full_kernel_cg_conditioned,
    plan_centers_solver,
    plan_eigenpro2,
    plan_eigenpro2_layout,
    plan_eigenpro3,
    plan_eigenpro3_layout,
    plan_every_point_cg,
)
from ..planning.operator import operator_probe_shape, operator_problem, plan_operator
from ..planning.stopping import plan_cg_stopping, plan_divergence, plan_stopping
from ..preconditioner import (
    PenalisedRows,
    SpectralSettings,
    max_usable_components,
    nystrom_eigensystem,
    plan_preconditioner,
    shifted_condition,
    shifted_rpcholesky_preconditioner,
)
from ..process_group import agree, agree_on_object
from ..scaling import ScheduleContext, warn_if_warmup_fills_run
from .centers_cg import CachedRowBlocks, CGSettings, KernelRowBlocks, center_operator, fit_centers_cg
from .direct import solve_kernel_ridge
from .eigenpro import KernelLoopResult, KernelTrainingData, LoopSettings, fit_eigenpro
from .eigenpro3 import ExactProjection, InMemoryBatches, IterativeProjection, StreamedBatches, fit_eigenpro3
from .fit_check import check_fit
from .full_kernel_cg import fit_full_kernel_cg

# CG that rounding breaks down above its stated residual (a curvature was not
# positive, the objective grew) is refit from where it ended with the penalty raised
# tenfold, at most this many times; the penalty it ends with becomes alpha_.  A stalled
# residual is not a breakdown: CG's residual is not monotone, and on tiny penalties it
# stalled at 1e-3 while the objective had settled to six digits.
CG_FALLBACK_REFITS = 3
_ROUNDING_STOPS = ("curvature", "objective grew")
# CG on every point that ended by one of these stops above its stated residual is refit
# by the driver's safe changes (_safer_attempt): its operator was not positive definite
# to the digits its penalty needs, or rounding took over.
_BROKEN_STOPS = ("curvature", "objective grew", "diverged")
# Out of memory in the preconditioner's eigensystem, the Nystrom subsample is halved
# down to this many points (fewer when the plan had fewer).
SMALLEST_SUBSAMPLE = 100

__all__ = [
    "SOLVER_PATHS",
    "Attempt",
    "Fallback",
    "HeldOut",
    "KernelFitSettings",
    "KernelHostData",
    "PathOutcome",
    "run_solver",
]


@dataclass(frozen=True)
class HeldOut:
    """Held-out rows and their targets: host arrays, or their copies on the device.

    ``X_device``: host rows' copy on the device, taken from the fit's one copy of its
    rows (None: copied from ``X`` when they are needed there).
    """

    X: object
    Y: object
    X_device: object = None


@dataclass(frozen=True)
class KernelHostData:
    """Host arrays of a kernel fit, split and shuffled by the pipeline.

    Parameters
    ----------
    X : ndarray or memory map of shape (n, d)
        Training rows (unshuffled; ``order`` is the shuffle).
    Y : ndarray of shape (n, l)
        Centred targets.
    weights : ndarray of shape (n,)
    order : ndarray of shape (n,)
        The seeded permutation of the rows.
    validation : HeldOut or None
    centers : ndarray of shape (p, d) or None
        The centers of EigenPro 3 and CG (float64); None puts a center at every
        training row (EigenPro 2).
    coef_init : Tensor or None
        Warm-start coefficients in the order of the centers.
    centers_from_data : bool
        The centers are the first ``p`` shuffled training rows.
    streamed : bool
        ``X`` is a memory-mapped file read in buffers.
    center_shares : ndarray of shape (p,) or None
        The share of the training rows each center's value stands for, when
        centers were drawn from repeated rows (CG's preconditioner reads it).
    X_device : Tensor of shape (n, d) or None
        ``X`` on the device, in its dtype (the fit's one copy of its rows, taken
        there): every stage takes its rows from it; None: from ``X``.
    center_rows : ndarray of shape (p,) or None
        The training rows the centers are (None: the user's centers).
    joint_intercept : bool
        ``Y``'s last column is the column of ones of the joint intercept, not a
        target of the model (the last check leaves it out).
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    order: np.ndarray
    validation: HeldOut | None
    centers: np.ndarray | None
    coef_init: torch.Tensor | None
    centers_from_data: bool = True
    streamed: bool = False
    center_shares: np.ndarray | None = None
    X_device: torch.Tensor | None = None
    center_rows: np.ndarray | None = None
    joint_intercept: bool = False


@dataclass(frozen=True)
class KernelRuntime:
    """Resolved facts of the run: devices, precision, memory, randomness, process group.

    ``rng`` is the fit's ``RandomState`` (the validation split, the shuffle and a
    streamed fit's seed are drawn from it, in that order); ``generator`` seeds the
    epoch permutations; ``group`` is the ``torch.distributed`` group the centers
    are sharded over (or None); ``memory_events`` collects the fit's out-of-memory
    events (:mod:`skgpu_kernel.out_of_memory`), in order, for ``fit_attempts_``;
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
    memory_events: list = dataclasses.field(default_factory=list)
    held_bytes: int = 0

    @property
    def itemsize(self):
        """Bytes per value of the training dtype."""
        return torch.finfo(self.dtype).bits // 8

    @property
    def n_shards(self):
        """Shards the centers would be split in: the group's ranks, else the devices."""
        return self.group.size() if self.group is not None else len(self.devices)


@dataclass(frozen=True)
class KernelFitSettings:
    """What every path reads: the resolved kernel and penalty, and the user's parameters.

    Attributes
    ----------
    kernel : Kernel
    bandwidth : float or None
    offset : ndarray or None
        Feature means subtracted before a translation-invariant kernel.
    alpha : float
    validation_score : callable
        ``validation_score(predictions, targets)`` of predictions of the centred
        targets, the intercept added back.
    parameters : KernelFitParameters
        The estimator's parameters (planning, preconditioner, scaling rule, epochs,
        stopping, name).
    """

    kernel: object
    bandwidth: float | None
    offset: np.ndarray | None
    alpha: float
    validation_score: Callable
    parameters: object


@dataclass(frozen=True)
class Fallback:
    """A new attempt a path asks the driver to run instead of, or after, its own: what changes and why.

    Attributes
    ----------
    reason : str
        Why, in a few words (recorded in ``fit_attempts_``).
    solver : str or None
        The solver to run (None: the same).
    alpha : float or None
        The penalty to run with (None: the same).
    cache_kernel : bool or None
        ``cache_kernel`` to plan with (None: the estimator's).
    cache_dtype : str or None
        ``kernel_cache_dtype`` to plan with (None: the estimator's).
    n_components : int or None
        EigenPro's preconditioner components (None: the estimator's).
    coef_init : Tensor or None
        Coefficients to start from (None: the fit's warm start, if any).
    warning : str or None
        Raised as a ``ConvergenceWarning`` (or ``category``) when the driver takes it.
    category : type
    """

    reason: str
    solver: str | None = None
    alpha: float | None = None
    cache_kernel: object = None
    cache_dtype: str | None = None
    n_components: int | None = None
    coef_init: torch.Tensor | None = None
    warning: str | None = None
    category: type = ConvergenceWarning


@dataclass(frozen=True)
class Attempt:
    """One run of a solver by the driver: its solver, penalty and planning, and why it was made."""

    solver: str
    alpha: float
    reason: str = "planned"
    cache_kernel: object = None
    cache_dtype: str | None = None
    n_components: int | None = None
    coef_init: torch.Tensor | None = None
    n_refits: int = 0

    def record(self):
        """What ``fit_attempts_`` keeps of it."""
        return {"solver": self.solver, "alpha": self.alpha, "reason": self.reason}

    def after(self, fallback):
        """The attempt ``fallback`` asks for after this one."""
        refit = fallback.solver in (None, self.solver)
        return Attempt(
            solver=fallback.solver or self.solver,
            alpha=self.alpha if fallback.alpha is None else fallback.alpha,
            reason=fallback.reason,
            cache_kernel=self.cache_kernel if fallback.cache_kernel is None else fallback.cache_kernel,
            cache_dtype=self.cache_dtype if fallback.cache_dtype is None else fallback.cache_dtype,
            n_components=self.n_components if fallback.n_components is None else fallback.n_components,
            coef_init=fallback.coef_init,
            n_refits=self.n_refits + 1 if refit and fallback.alpha is not None else self.n_refits,
        )


@dataclass(frozen=True)
class PathOutcome:
    """What a path decided and produced.

    ``plan`` and ``spectrum`` are None for CG on centers, which has neither (CG on
    every point has its plan, ``method="cg"``: its subsample, row blocks and kernel cache); ``operator`` is the
    :class:`~skgpu_kernel.planning.operator.OperatorPlan` the products ran on;
    ``device_cache`` holds the :class:`~skgpu_kernel.blockwise.PredictionTensors`
    for predictions after fit.
    ``fallback``: the attempt the path asks the driver to run next (``result`` None
    when it gave up before solving).  ``attempts``: every attempt the driver ran,
    this one last.  ``record``: the fit's record of what was tried
    (``fit_attempts_``): the out-of-memory events reported before the driver ran,
    then each attempt's :meth:`Attempt.record` followed by the events of its run.
    ``check``: the last check of the model (:class:`~skgpu_kernel.solvers.fit_check.FitCheck`'s
    record, ``fit_check_``), or None where none ran.
    """

    result: KernelLoopResult | None
    plan: object = None
    spectrum: object = None
    throughputs: dict = dataclasses.field(default_factory=dict)
    centers: np.ndarray | None = None
    device_cache: PredictionTensors | None = None
    operator: object = None
    fallback: Fallback | None = None
    attempts: tuple = ()
    record: tuple = ()
    check: dict | None = None


class _FallbackNeeded(Exception):
    """Raised by a stage of a path that cannot go on as planned; the driver runs ``fallback`` instead."""

    def __init__(self, fallback):
        super().__init__(fallback.reason)
        self.fallback = fallback


def run_solver(solver, alpha, data, runtime, settings):
    """Run ``solver`` at ``alpha``, then every fallback it asks for: the one driver of the kernel solvers.

    Each attempt runs the path the registry (:data:`SOLVER_PATHS`) gives for the
    solver and the data (centers or every point).  A path asks for a fallback by
    returning or raising one (:class:`Fallback`): CG broken down by rounding, refit
    with a larger penalty (at most :data:`CG_FALLBACK_REFITS` times); CG on every
    point that diverged, refit with a 32-bit kernel cache in place of a 16-bit one,
    else with a larger penalty; CG on every point whose preconditioned system is too
    ill-conditioned, fitted by EigenPro 2; a kernel cache the device refused,
    fitted without it.  Every model a path returns then meets the last check
    (:func:`~skgpu_kernel.solvers.fit_check.check_fit`): one worse than the trivial
    predictor beyond noise is refit by the same order of safe changes
    (:func:`_safer_attempt`), and where none is left the fit keeps the trivial
    model with a ``ConvergenceWarning`` naming what was tried.  The driver warns,
    runs the new attempt from scratch and records every attempt in the outcome, as
    scikit-learn's ``_ridge_regression`` reports the solver that actually ran,
    with the out-of-memory events of each run after it (``runtime.memory_events``).

    Returns
    -------
    PathOutcome
        The last attempt's, with ``attempts``, ``record`` and ``check``.
    """
    attempt, attempts = Attempt(solver, alpha), []
    events = runtime.memory_events
    record = list(events)  # what earlier stages of the fit shrank (feature learning's fits and AGOP)
    while True:
        attempts.append(attempt)
        record.append(attempt.record())
        reported = len(events)
        outcome = _run_attempt(attempt, data, runtime, settings)
        record.extend(events[reported:])
        fallback = outcome.fallback
        if fallback is None:
            check = _last_check(outcome, data, runtime, settings)
            outcome = dataclasses.replace(outcome, check=None if check is None else check.record())
            if check is None or check.passed:
                return dataclasses.replace(outcome, attempts=tuple(attempts), record=tuple(record))
            why = (
                f"the model's squared error on {check.n_rows} training rows, {check.model_loss:.4g}, is above the "
                f"trivial predictor's, {check.trivial_loss:.4g}"
            )
            fallback = _safer_attempt(attempt, outcome, data, runtime.dtype, why)
            if fallback is None:
                outcome = _trivial_model(outcome, attempts)
                return dataclasses.replace(outcome, attempts=tuple(attempts), record=tuple(record))
        _warn_of(fallback, attempt, settings.parameters.solver)
        attempt = attempt.after(fallback)


def _warn_of(fallback, attempt, requested):
    """The fallback's warning; a plain one where it leaves a solver the user named and has none of its own."""
    if fallback.warning is not None:
        warn_user(fallback.warning, fallback.category)
    elif fallback.solver not in (None, attempt.solver) and requested == attempt.solver:
        warn_user(f"solver={requested!r} was not kept: {fallback.reason} (fit_attempts_ records it).", UserWarning)


def _last_check(outcome, data, runtime, settings):
    """The last check of the attempt's model on its training rows, or None where it is not run.

    The rows are taken from the fit's one copy on the device where it holds one.
    Not under a process group: the ranks would have to agree on a fallback, and
    each holds the same model (its coefficients agreed every epoch).
    """
    if runtime.group is not None or outcome.device_cache is None or data.X.shape[0] < 2:
        return None
    tensors, to_device = outcome.device_cache, DeviceCopier(runtime.devices[0], runtime.dtype, settings.offset)

    n_targets = data.Y.shape[1] - data.joint_intercept  # the ones column is no target

    def predict(indices):
        rows = to_device(rows_taken(data.X, data.X_device, indices))
        return tensors.predict_on_device(settings.kernel, rows, runtime.budget)[:, :n_targets]

    check = check_fit(predict, data.Y[:, :n_targets], data.weights)
    if runtime.log is not None:
        verdict = "passed" if check.passed else "FAILED"
        runtime.log(
            f"[{settings.parameters.name}] last check {verdict}: squared error {check.model_loss:.4g} against the "
            f"trivial predictor's {check.trivial_loss:.4g} on {check.n_rows} training rows ({check.seconds:.2f} s)"
        )
    return check


def _safer_attempt(attempt, outcome, data, dtype, why):
    """The next safe change after ``attempt``'s model (``outcome``) went wrong (``why``); None when none is left.

    In this order, the cheapest first:

    1. a 16-bit kernel cache stored in the training dtype (its products exact
       where that does not fit the budget): it changes only rounding;
    2. EigenPro with half its preconditioner's components: its analytic step,
       ``1 / lambda_{k+1}``, shrinks with them (the loop has halved its own step
       already, each halving recorded);
    3. the penalty ten times larger (at least the dtype's resolution of the rows'
       weight), at most :data:`CG_FALLBACK_REFITS` times, EigenPro 3 excepted (its
       SGD has no penalty): the last resort, it changes the model.
    """
    operator_plan, spectrum = outcome.operator, outcome.spectrum
    if operator_plan is not None and operator_plan.cache_dtype == "float16":
        wider = str(dtype).removeprefix("torch.")
        reason = f"{why}: the 16-bit kernel cache's rounding; refit with the cache in {wider}"
        warning = f"{reason[0].upper()}{reason[1:]} (or computed per product where it does not fit)."
        return Fallback(reason, cache_dtype=wider, warning=warning)
    n_components = 0 if spectrum is None else spectrum.preconditioner.n_components
    if attempt.solver == "eigenpro" and n_components > 0:
        reason = f"{why}: refit with {n_components // 2} preconditioner components (was {n_components})"
        return Fallback(reason, n_components=n_components // 2, warning=f"{reason[0].upper()}{reason[1:]}.")
    if attempt.n_refits >= CG_FALLBACK_REFITS or (attempt.solver == "eigenpro" and data.centers is not None):
        return None
    larger = _larger_penalty(attempt.alpha, dtype, data)
    reason = f"{why}: refit with alpha {larger:.3g} (was {attempt.alpha:.3g})"
    warning = f"{reason[0].upper()}{reason[1:]}; alpha_ holds the penalty used. Set a larger alpha or dtype='float64'."
    return Fallback(reason, alpha=larger, warning=warning)


def _larger_penalty(alpha, dtype, data):
    """Ten times ``alpha``, at least the smallest penalty that resolves the errors to ``dtype``'s precision."""
    return max(10.0 * alpha, torch.finfo(dtype).eps * float(data.weights.sum()))


def _trivial_model(outcome, attempts):
    """The trivial model (zero coefficients: the intercept, the targets' weighted mean) after every attempt failed."""
    tried = "; ".join(f"{attempt.solver} at alpha {attempt.alpha:.3g} ({attempt.reason})" for attempt in attempts)
    warn_user(
        f"Every attempt of the fit gave a model worse than the trivial predictor (the targets' weighted mean) on "
        f"its training rows: {tried}. The fit keeps the trivial model; check the bandwidth and the scale of the "
        "data, or set a larger alpha or dtype='float64'.",
        ConvergenceWarning,
    )
    coef = torch.zeros_like(outcome.result.coef)
    result = dataclasses.replace(outcome.result, coef=coef, converged=False)
    return dataclasses.replace(outcome, result=result, device_cache=outcome.device_cache.with_coef(coef))


def _run_attempt(attempt, data, runtime, settings):
    """One attempt: its path built on the data and settings the attempt changes, run; a raised fallback returned."""
    if attempt.coef_init is not None:
        data = dataclasses.replace(data, coef_init=attempt.coef_init)
    parameters = settings.parameters
    if attempt.cache_kernel is not None:
        parameters = dataclasses.replace(parameters, cache_kernel=attempt.cache_kernel)
    if attempt.cache_dtype is not None:
        parameters = dataclasses.replace(parameters, cache_dtype=attempt.cache_dtype)
    if attempt.n_components is not None:
        parameters = dataclasses.replace(parameters, n_components=attempt.n_components)
    settings = dataclasses.replace(settings, alpha=attempt.alpha, parameters=parameters)
    run = SOLVER_PATHS[attempt.solver, data.centers is not None]
    try:
        return run(_PathContext(data, runtime, settings, attempt.solver), attempt)
    except _FallbackNeeded as needed:
        return PathOutcome(None, fallback=needed.fallback)


def _run_eigenpro(stages):
    """Layout, measured capacity, spectrum, plan, then the loop: the stages of both EigenPro solvers.

    ``stages`` (:class:`_EigenPro2Stages` or :class:`_EigenPro3Stages`) says what
    each stage does for its model; this function runs them in order.
    """
    context = stages.context
    runtime, parameters = context.runtime, context.settings.parameters
    layout = stages.layout()
    measured = stages.capacity(layout)
    capacity = measured.batch
    layout, spectrum = context.on_subsample(layout, stages.layout, lambda sized: stages.spectrum(sized, capacity))
    n_components = spectrum.preconditioner.n_components
    _warn_if_degenerate_kernel(spectrum, layout.subsample_size, runtime.dtype, context.settings.bandwidth)
    plan = stages.plan(layout, capacity, spectrum.critical_batch_preconditioned)
    prepared = stages.prepare(plan)
    n = stages.problem.n_rows
    steps_per_epoch = math.ceil(n / plan.batch_size)
    learning_rate_for = _learning_rate_function(parameters.scaling_rule, spectrum, parameters.n_epochs)
    warn_if_warmup_fills_run(
        parameters.scaling_rule,
        _schedule_context(spectrum, plan.batch_size, steps_per_epoch, parameters.n_epochs),
    )
    if runtime.log is not None:
        runtime.log(
            f"[{parameters.name}] {stages.where()}, dtype={runtime.dtype}, n={n}, {plan.describe()}, "
            f"{stages.operator_plan.describe()}, critical batch "
            f"{spectrum.critical_batch:.1f} -> {spectrum.critical_batch_preconditioned:.1f} with {n_components} "
            f"components, scaling rule {parameters.scaling_rule!r}, step size "
            f"{learning_rate_for(runtime.first_step, plan.batch_size, steps_per_epoch):.4g}"
        )
    loop = LoopSettings(
        batch_size=plan.batch_size,
        learning_rate_for=learning_rate_for,
        n_epochs=parameters.n_epochs,
        first_step=runtime.first_step,
        stopping=plan_stopping(
            parameters.tol, parameters.n_iter_no_change, validation=context.data.validation is not None
        ),
        log=runtime.log,
        events=dataclasses.replace(context.events, log=None),  # the loops log their own line
    )
    preconditioner = spectrum.preconditioner if n_components else None
    result = stages.solve(layout, plan, prepared, preconditioner, loop)
    del prepared  # the kernel cache, freed before the centers are copied out: one copy of X less at the peak
    outcome = PathOutcome(
        result, plan, spectrum, measured.throughputs, stages.centers_host(), stages.device_cache(result.coef)
    )
    return dataclasses.replace(outcome, operator=stages.operator_plan)


class _PathContext:
    """What every solver's run starts from: the data, runtime and settings, the device copier, the penalty's scale.

    And how its stages go on out of device memory (:meth:`shrinking`): every stage
    that allocates in proportion to a planned size runs through one
    :class:`~skgpu_kernel.out_of_memory.ShrinkingStage`, whose events the driver
    records after the attempt (``fit_attempts_``).  One per attempt; the solvers'
    runs read it, none extends it.
    """

    def __init__(self, data, runtime, settings, solver):
        self.data, self.runtime, self.settings = data, runtime, settings
        self.kernel, self.device = settings.kernel, runtime.devices[0]
        self.to_device = DeviceCopier(self.device, runtime.dtype, settings.offset)
        self.itemsize = runtime.itemsize
        self.events = MemoryEvents(runtime.memory_events, solver, runtime.log)

    def rows(self, indices):
        """The training rows ``indices`` on the device, centred in the fit's dtype, as ``to_device(X[indices])``."""
        return self.to_device(rows_taken(self.data.X, self.data.X_device, indices))

    def centers(self):
        """The centers on the device, centred in the fit's dtype: the training rows they are, or the user's."""
        data = self.data
        if data.center_rows is None or data.X_device is None:
            return self.to_device(data.centers)
        return self.rows(data.center_rows)

    def shrinking(self, stage, what, sizes):
        """The :class:`~skgpu_kernel.out_of_memory.ShrinkingStage` of a stage of this run.

        One rank of a process group cannot shrink alone (the others would wait in
        its collectives): there the planned size alone is tried.
        """
        sizes = iter(sizes)
        if self.runtime.group is not None:
            sizes = iter([next(sizes)])
        return ShrinkingStage(stage, what, sizes, self.device, self.events)

    def planning(self, subsample_size=None):
        """What the layout planners read: the estimator's settings, with another ``subsample_size`` if given."""
        planning = self.settings.parameters.planning
        return planning if subsample_size is None else dataclasses.replace(planning, subsample_size=subsample_size)

    def on_subsample(self, layout, layout_for, compute):
        """``(layout, compute(layout))`` on the layout's Nystrom subsample, halved where the device runs out of memory.

        A smaller subsample is a new layout (``layout_for(size)``: its memory plan
        and cache), down to :data:`SMALLEST_SUBSAMPLE` points.
        """
        planned = layout.subsample_size

        def run(size):
            sized = layout if size == planned else layout_for(size)
            return sized, compute(sized)

        sizes = halvings(planned, min(planned, SMALLEST_SUBSAMPLE))
        return self.shrinking("preconditioner subsample", "subsample_size", sizes)(run)

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
            raise _FallbackNeeded(Fallback(message, cache_kernel=False, warning=warning, category=RuntimeWarning))

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
        validation_score = self.settings.validation_score
        return lambda coef: validation_score(stage(lambda rows: predict(coef, rows)), targets)

    def problem_with(self, **sizes):
        """The :class:`KernelProblem` of the host data, with the run's own ``sizes``."""
        X, Y = self.data.X, self.data.Y
        held = self.runtime.held_bytes
        return KernelProblem(
            X.shape[0], X.shape[1], Y.shape[1], self.itemsize, self.kernel.extra_blocks, held_bytes=held, **sizes
        )

    def validation_tensors(self):
        """The held-out rows and targets on the device, or None."""
        if self.data.validation is None:
            return None
        held_out = self.data.validation
        X = held_out.X if held_out.X_device is None else held_out.X_device
        return HeldOut(self.to_device(X), self.to_device(held_out.Y, center=False))

    def weights_tensor(self, weights):
        """Normalised sample weights on the device, or None when all are equal."""
        if np.all(weights == weights[0]):
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
        return self.settings.alpha / float(self.data.weights.max())

    def starting_coef(self, n_coefficients):
        """The warm start's coefficients, or zeros, on the device."""
        coef = self.data.coef_init
        if coef is None:
            coef = torch.zeros(n_coefficients, self.data.Y.shape[1], dtype=self.runtime.dtype)
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
        batch_size = self.settings.parameters.planning.batch_size
        return None if batch_size == "auto" else min(batch_size, n_rows)

    def spectral_settings(self, n_rows, eigenvalue_shift, diagonal_shift):
        """What EigenPro's preconditioner is asked for: the user's components and damping, a penalty's shifts, ``n``."""
        parameters = self.settings.parameters
        return SpectralSettings(parameters.n_components, parameters.damping, eigenvalue_shift, diagonal_shift, n_rows)


class _EveryPointOperators:
    """``K(X, X)`` with a center at every training row (and ``K(X_val, X)``): what EigenPro 2 and CG there read.

    The training rows on the device in the fit's order, what the device measures of
    their operator (their grid, int8 products' speed), the problem's sizes, EigenPro
    2's layout (subsample, memory, cache) and the operators the operator plan asks
    for (:meth:`build`): the one place the cache and grid branches of ``K(X, X)``
    are taken.
    """

    def __init__(self, context, definite_penalty=None):
        self.context, self.definite_penalty = context, definite_penalty
        data = context.data
        n_validation = 0 if data.validation is None else data.validation.X.shape[0]
        problem = context.problem_with(n_validation=n_validation, unit_bounded_kernel=context.kernel.unit_bounded)
        self.X_dev = context.rows(data.order)
        self.centers_dev = context.kernel.prepare_centers(self.X_dev)
        self.measurements = measure_operator(context.kernel, self.X_dev, operator_probe_shape(problem))
        self.problem = operator_problem(problem, self.measurements)
        # The operator plan once the layout is known, and the rows' grid codes where it takes the grid.
        self.operator_plan, self.center_codes = None, None

    def centers_host(self):
        return self.context.data.X[self.context.data.order]

    def layout(self, subsample_size=None):
        context = self.context
        planning = context.planning(subsample_size)
        budget, device = context.runtime.budget, context.device
        return plan_eigenpro2_layout(self.problem, budget, device, planning, self.definite_penalty)

    def build(self, plan):
        """The operators of ``K(X, X)`` and ``K(X_val, X)`` the plan asks for, cached when it says so.

        A cache the device refuses is recorded and the fit planned again without it
        (:meth:`_PathContext.cached_or_planned_again`).
        """
        validation = self.context.validation_tensors()
        self.operator_plan = plan_operator(self.problem, self.measurements, plan.cache_itemsize)
        operators = self._evaluated_operators(plan, validation)
        if plan.cached:
            fill = lambda: self._caches(plan, operators)  # noqa: E731
            operators = self.context.cached_or_planned_again(fill, plan, "K(X, X)")
        return dataclasses.replace(operators, validation=validation)

    def device_cache(self, coef):
        return self.context.prediction_tensors(self.centers_dev, coef, self.operator_plan, self.center_codes)

    def held_out_score(self, operators):
        """``score(coef)`` of ``K(X_val, X) @ coef`` against the held-out targets (row blocks halved out of memory)."""
        held_out, n_rows = operators.held_out, operators.held_out.shape[0]

        def predict(coef, row_block):
            return in_row_blocks(lambda rows: held_out.matmul(coef, rows=rows), n_rows, row_block)

        return self.context.held_out_score(predict, n_rows, operators.validation.Y)

    def _evaluated_operators(self, plan, validation):
        """``K(X, X)`` and ``K(X_val, X)`` (or None) as operators that evaluate their blocks, on the grid or not.

        Held-out rows off the training rows' grid are evaluated in float blocks.
        """
        kernel, dtype = self.context.kernel, self.context.runtime.dtype
        blocks = OperatorBlocks(plan.batch_size, plan.column_block)
        grid = self.operator_plan.grid
        held_out_codes = None
        if grid is not None:
            self.center_codes = encode_on_grid(self.X_dev, grid, checked=True)  # measure_operator checked them
            train = GridOperator(kernel, self.center_codes, self.center_codes, dtype, blocks)
            held_out_codes = None if validation is None else encode_on_grid(validation.X, grid)
        else:
            train = EvaluatedOperator(kernel, self.X_dev, self.centers_dev, blocks)
        if validation is None:
            held_out = None
        elif held_out_codes is not None:
            held_out = GridOperator(kernel, held_out_codes, self.center_codes, dtype, blocks)
        else:
            held_out = EvaluatedOperator(kernel, validation.X, self.centers_dev, blocks)
        return _EveryPointOperatorPair(train, held_out)

    def _product_rate(self, entries, seconds, block_shape):
        """``entries`` kernel entries in ``seconds``: their products' GFLOP/s against ``torch.mm``'s at the blocks."""
        n_features, seconds = self.X_dev.shape[1], max(seconds, 1e-9)
        rate = 2.0 * entries * n_features / seconds / 1e9
        rows, columns = (min(size, self.problem.n_rows) for size in block_shape)
        achieved = f"{entries / seconds / 1e9:.2g} G entries/s, {rate:.3g} GFLOP/s"
        try:
            peak = matmul_gflops(self.context.device, self.context.runtime.dtype, rows, n_features, columns)
        except (torch.OutOfMemoryError, RuntimeError) as error:  # a report never stops the fit
            if not is_out_of_memory(error):
                raise
            return f"{achieved} (torch.mm not timed at these blocks: out of memory)"
        return f"{achieved} = {rate / peak:.0%} of torch.mm's {peak:.3g} at these blocks"

    def report_epochs(self, result, plan, operator):
        """``verbose``: the rate a typical epoch reached, so that a slow machine reads as such."""
        steady = result.history[1:] or result.history  # the first epoch of a fresh fit reads half the rows
        runtime = self.context.runtime
        if runtime.log is None or not steady:
            return
        seconds = float(np.median([record["seconds"] for record in steady]))
        if operator.kind == "cached":
            gigabytes = operator.nbytes / 1e9
            rate = f"read K(X, X) ({gigabytes:.3g} GB) at {gigabytes / max(seconds, 1e-9):.3g} GB/s"
        else:
            n = self.problem.n_rows
            # Out of memory halves the plan's batch; CG has none (its row blocks are the plan's).
            rows = plan.batch_size if result.batch_size is None else min(result.batch_size, plan.batch_size)
            rate = f"evaluated K(X, X): {self._product_rate(n * n, seconds, (rows, plan.column_block))}"
        runtime.log(f"[{self.context.settings.parameters.name}] a typical epoch ({seconds:.3g} s) {rate}")

    def _caches(self, plan, operators):
        """``K(X, X)`` and ``K(X_val, X)`` filled from ``operators`` into :class:`CachedOperator` objects."""
        tic = time.perf_counter()
        storage = getattr(torch, CACHE_DTYPE_NAMES[plan.cache_itemsize])
        blocks = (plan.row_block, CACHE_FILL_COLUMNS)
        train = CachedOperator.fill(operators.train, storage, *blocks, symmetric=True)
        held_out = None if operators.held_out is None else CachedOperator.fill(operators.held_out, storage, *blocks)
        synchronize(self.context.device)
        log = self.context.runtime.log
        if log is not None:
            seconds = time.perf_counter() - tic
            n_rows, n_columns = train.shape
            rows = n_rows + (0 if held_out is None else held_out.shape[0])
            entries = filled_entries(n_rows, n_columns, plan.row_block, symmetric=True)
            entries += 0 if held_out is None else held_out.values.numel()
            log(
                f"[{self.context.settings.parameters.name}] kernel cached: {rows} x {n_columns}, "
                f"{self.operator_plan.describe()}, {seconds:.1f} s, {self._product_rate(entries, seconds, blocks)}"
            )
        return _EveryPointOperatorPair(train, held_out)


@dataclass(frozen=True)
class _EveryPointOperatorPair:
    """The operators of a fit on every point: ``K(X, X)`` and, with held-out rows, ``K(X_val, X)`` and those rows."""

    train: object
    held_out: object = None
    validation: HeldOut | None = None


class _EigenPro2Stages:
    """EigenPro 2's stages for :func:`_run_eigenpro`: every training row a center, the loop :func:`fit_eigenpro`."""

    def __init__(self, context):
        self.context = context
        self.rows = _EveryPointOperators(context)

    @property
    def problem(self):
        return self.rows.problem

    @property
    def operator_plan(self):
        return self.rows.operator_plan

    def where(self):
        return f"device={self.context.device}"

    def centers_host(self):
        return self.rows.centers_host()

    def device_cache(self, coef):
        return self.rows.device_cache(coef)

    def layout(self, subsample_size=None):
        return self.rows.layout(subsample_size)

    def capacity(self, layout):
        return self.context.batch_capacity(layout, self.rows.X_dev, self.rows.centers_dev, self.problem)

    def spectrum(self, layout, capacity):
        # The iteration solves (K + alpha I) a = Y: every eigenvalue of K / n moves up
        # by alpha / n and every diagonal entry by alpha.
        context, n_rows = self.context, self.problem.n_rows
        ridge = context.ridge()
        spectral = context.spectral_settings(n_rows, ridge / n_rows, ridge)
        return plan_preconditioner(
            context.kernel, self.rows.X_dev, layout.subsample_size, capacity, spectral, layout.column_block(1024)
        )

    def plan(self, layout, capacity, critical_batch):
        return plan_eigenpro2(layout, capacity, critical_batch, self.context.settings.parameters.planning)

    def prepare(self, plan):
        """The operators of ``K(X, X)`` (and ``K(X_val, X)``) the plan asks for."""
        return self.rows.build(plan)

    def solve(self, layout, plan, operators, preconditioner, loop):
        context = self.context
        data = context.data
        Y_dev = context.to_device(data.Y[data.order], center=False)
        weights = context.weights_tensor(data.weights[data.order])
        tensors = KernelTrainingData(operators.train, Y_dev, weights, context.ridge())
        if operators.validation is not None:
            loop = dataclasses.replace(loop, validation=self.rows.held_out_score(operators))
        fresh = data.coef_init is None
        coef = context.starting_coef(self.problem.n_rows)
        generator, column_block = context.runtime.generator, layout.column_block
        result = fit_eigenpro(context.kernel, tensors, coef, preconditioner, loop, column_block, generator, fresh)
        self.rows.report_epochs(result, plan, operators.train)
        return result


def _run_eigenpro2(context, attempt):
    """EigenPro 2 (every training row a center): :func:`_run_eigenpro` on :class:`_EigenPro2Stages`."""
    return _run_eigenpro(_EigenPro2Stages(context))


def _run_every_point_cg(context, attempt):
    """Every training row a center, ``alpha > 0``: CG on ``K + alpha W^-1`` with a pivoted Cholesky preconditioner.

    It keeps (or evaluates) ``K(X, X)`` as EigenPro 2 does, in the same memory
    layout (:func:`~skgpu_kernel.planning.kernel.plan_every_point_cg`), and reads it
    once per iteration.  EigenPro's Nystrom subsample estimates the preconditioned
    system's condition (beyond :data:`CG_MAX_CONDITION` it asks the driver for
    EigenPro 2); the preconditioner is built from a randomly pivoted Cholesky
    factor of ``K`` (:func:`shifted_rpcholesky_preconditioner`).  Up to
    :data:`~skgpu_kernel.planning.kernel.FULL_KERNEL_CG_MAX_ROWS` rows the fit is
    solved directly instead.
    """
    runtime, parameters, data = context.runtime, context.settings.parameters, context.data
    # CG needs K + alpha W^-1 positive definite: a 16-bit cache only where its rounding is harmless.
    rows = _EveryPointOperators(context, definite_penalty=context.ridge())
    X_dev = rows.X_dev
    layout, eigensystem = context.on_subsample(
        rows.layout(), rows.layout, lambda sized: nystrom_eigensystem(context.kernel, X_dev[: sized.subsample_size])
    )
    cg_plan = plan_every_point_cg(layout)
    weights = context.weights_tensor(data.weights[data.order])
    penalised = PenalisedRows(rows.problem.n_rows, context.ridge(), weights, runtime.dtype)
    _check_cg_conditioned(context, shifted_condition(eigensystem[0], penalised, cg_plan.max_components))
    operators = rows.build(cg_plan.fit)

    def products(V):  # K(X, X[:k]) V for V of k rows
        return operators.train.matmul(V.to(runtime.dtype))

    Y = context.to_device(data.Y[data.order], center=False)
    tic = time.perf_counter()
    preconditioner = shifted_rpcholesky_preconditioner(
        context.kernel, X_dev, penalised, cg_plan.max_components, runtime.generator
    )
    if runtime.log is not None:
        runtime.log(
            f"[{parameters.name}] device={context.device}, dtype={runtime.dtype}, n={rows.problem.n_rows}, solver cg "
            f"on every training point, preconditioner flattening {preconditioner.n_components} directions of a "
            f"randomly pivoted Cholesky factor of K down to alpha ({time.perf_counter() - tic:.1f} s), "
            f"{cg_plan.fit.describe()}"
        )
    coef_init = None if data.coef_init is None else context.starting_coef(rows.problem.n_rows)
    # CG's residual on this square system is not monotone (CG lowers the error's
    # A-norm), so no stall rule reads it: its own objective stops it below float64.
    cg_settings = _cg_settings(parameters, runtime, square_system=True)
    solved = fit_full_kernel_cg(products, Y, weights, penalised.alpha, preconditioner, cg_settings, coef_init)
    if _broken_down(solved, runtime.dtype, parameters):
        residual = solved.history[-1]["relative_residual"]
        iterations = len(solved.history)
        why = f"CG on every point stopped ({solved.stop}) after {iterations} iterations (residual {residual:.3g})"
        fallback = _safer_attempt(attempt, PathOutcome(None, operator=rows.operator_plan), data, runtime.dtype, why)
        if fallback is not None:
            return PathOutcome(None, fallback=fallback)
    coef = solved.coef.to(runtime.dtype)
    _warn_if_unfinished(solved, runtime.dtype, parameters, "on every point")
    score = None if operators.validation is None else rows.held_out_score(operators)
    result = _cg_loop_result(solved, coef, score)
    rows.report_epochs(result, cg_plan.fit, operators.train)
    operators = None  # as in _run_eigenpro: the cache freed before the centers are copied out
    outcome = PathOutcome(result, cg_plan.fit, None, {}, rows.centers_host(), rows.device_cache(coef))
    return dataclasses.replace(outcome, operator=rows.operator_plan)


def _check_cg_conditioned(context, condition):
    """Ask the driver for EigenPro 2 where the preconditioned system's ``condition`` is beyond CG's bound."""
    if full_kernel_cg_conditioned(condition):
        return
    reason = (
        f"alpha {context.ridge():.3g} leaves CG's preconditioned system a condition of about {condition:.3g} "
        f"(> {CG_MAX_CONDITION:g}): EigenPro 2 fits it instead"
    )
    if context.runtime.log is not None:
        context.runtime.log(f"[{context.settings.parameters.name}] {reason}")
    raise _FallbackNeeded(Fallback(reason, solver="eigenpro"))


def _run_direct(context, attempt):
    """Every training row a center, ``alpha > 0``, ``n x n`` in the budget: one factorisation of ``K + alpha W^-1``.

    ``K(X, X)`` is evaluated once in float64 through an
    :class:`~skgpu_kernel.operators.EvaluatedOperator` and handed to
    :func:`~skgpu_kernel.solvers.direct.solve_kernel_ridge`.  Where rounding breaks
    the factorisation, or the device has no room for the ``n x n`` matrices, the
    driver is asked for CG on every point instead.
    """
    data, runtime, kernel, device = context.data, context.runtime, context.kernel, context.device
    centers = data.X[data.order]  # every training row, in the fit's order
    # One copy of the rows to the device, uncentred in float64: K is evaluated on them
    # centred in float64, and the prediction tensors hold them centred in the fit's dtype.
    uncentred = DeviceCopier(device, torch.float64, None)(rows_taken(data.X, data.X_device, data.order))
    rows = DeviceCopier(device, torch.float64, context.settings.offset).centred(uncentred)
    whole = OperatorBlocks.whole(rows.shape[0], rows.shape[0])
    operator = EvaluatedOperator(kernel, rows, kernel.prepare_centers(rows), whole)
    targets = torch.as_tensor(data.Y[data.order], dtype=torch.float64, device=device)
    weights = torch.as_tensor(data.weights[data.order], dtype=torch.float64, device=device)

    def factored(kind):
        if kind == "factored":
            return solve_kernel_ridge(operator, targets, attempt.alpha / weights)
        return None

    solved = context.shrinking("direct solve", "n x n factorisation", ("factored", "iterative"))(factored)
    operator = rows = None  # K(X, X) freed before the prediction tensors are made
    if solved is None:
        reason = (
            f"K + alpha W^-1 on {targets.shape[0]} rows could not be factored here (alpha {attempt.alpha:.3g} "
            "below the kernel's rounding, or no room for the n x n matrices): CG on every point fits it instead"
        )
        raise _FallbackNeeded(Fallback(reason, solver="cg"))
    coef = solved.to(runtime.dtype)
    if runtime.log is not None:
        where = f"device={device}, dtype={runtime.dtype}"
        runtime.log(
            f"[{context.settings.parameters.name}] {where}, solver direct: K + alpha W^-1 factored on "
            f"{targets.shape[0]} rows"
        )
    # The prediction tensors hold the rows as every path does: centred in the fit's dtype.
    device_cache = context.prediction_tensors(kernel.prepare_centers(context.to_device.centred(uncentred)), coef)
    return PathOutcome(KernelLoopResult.direct(coef), centers=centers, device_cache=device_cache)


class _EigenPro3Stages:
    """EigenPro 3's stages for :func:`_run_eigenpro`: ``p`` centers; the loop :func:`fit_eigenpro3`.

    The centers' shards, the projection and the batches (in memory or streamed);
    :meth:`prepare` and :meth:`solve` are the one place their cache and grid
    branches are taken.
    """

    def __init__(self, context):
        self.context = context
        data, runtime = context.data, context.runtime
        problem = context.problem_with(
            n_centers=data.centers.shape[0],
            n_shards=runtime.n_shards,
            centers_from_data=data.centers_from_data,
            streamed=data.streamed,
        )
        self.Z_dev = context.centers()
        self.centers_dev = context.kernel.prepare_centers(self.Z_dev)
        self.X_dev = None if problem.streamed else context.rows(data.order)
        self.measurements = self._measurements(problem)
        self.problem = operator_problem(problem, self.measurements)
        self.operator_plan, self.center_codes = None, None

    def _measurements(self, problem):
        """The operator's measurements (none for streamed rows); rank 0's on every rank, which must agree."""
        if self.X_dev is None:
            return OperatorMeasurements()
        centers = None if problem.centers_from_data else self.Z_dev
        measured = measure_operator(self.context.kernel, self.X_dev, operator_probe_shape(problem), centers)
        return agree_on_object(measured, self.context.runtime.group, self.context.device)

    def where(self):
        group = self.context.runtime.group
        rank = f" (rank {group.rank()} of {group.size()})" if group is not None else ""
        return f"devices={[str(device) for device in self.context.runtime.devices]}{rank}"

    def centers_host(self):
        return self.context.data.centers

    def device_cache(self, coef):
        return self.context.prediction_tensors(self.centers_dev, coef, self.operator_plan, self.center_codes)

    def layout(self, subsample_size=None):
        context = self.context
        runtime, planning, device = context.runtime, context.planning(subsample_size), context.device
        layout = plan_eigenpro3_layout(self.problem, runtime.budget, device, planning)
        # Ranks may see different free memory; they must take the same path.
        choices = agree(layout.choices, runtime.group, device)
        if tuple(choices) != layout.choices:
            layout = plan_eigenpro3_layout(self.problem, runtime.budget, device, planning, choices)
        return layout

    def capacity(self, layout):
        context = self.context
        probe_rows = self.Z_dev if self.X_dev is None else self.X_dev
        measured = context.batch_capacity(layout, probe_rows, self.centers_dev, self.problem)
        if context.given_batch(self.problem.n_rows) is None and not layout.cached:
            # Ranks time their own devices; they must agree on the batch to stay in step.
            (agreed,) = agree([measured.batch], context.runtime.group, context.device)
            measured = measured.bounded(agreed)
        return measured

    def spectrum(self, layout, capacity):
        # The spectrum is estimated on the first s centers (the Nystrom subsample), and
        # the preconditioned beta also on training rows outside it.
        context, data = self.context, self.context.data
        if self.X_dev is not None:
            probe_rows = self.X_dev[:BETA_PROBE_ROWS]
        else:
            probe_rows = context.rows(np.sort(data.order[:BETA_PROBE_ROWS]))
        # The penalty alpha ||f||^2 / n adds alpha / n to the operator and to one sample's curvature.
        shift = context.ridge() / self.problem.n_rows
        spectral = context.spectral_settings(self.problem.n_rows, shift, shift)
        spectrum = plan_preconditioner(
            context.kernel, self.Z_dev, layout.subsample_size, capacity, spectral, layout.column_block(1024), probe_rows
        )
        # Every rank estimates it; its eigensolver may round differently on each, and the
        # ranks' steps must be the same: rank 0's spectrum is everyone's.
        return agree_on_object(spectrum, context.runtime.group, context.device)

    def plan(self, layout, capacity, critical_batch):
        return plan_eigenpro3(layout, capacity, critical_batch, self.context.settings.parameters.planning)

    def prepare(self, plan):
        """The operator plan of ``K(X, Z)`` (the shards, cache and projection are built by :meth:`solve`)."""
        cache_itemsize = self.context.itemsize if plan.cached else 0
        self.operator_plan = plan_operator(self.problem, self.measurements, cache_itemsize)
        if self.operator_plan.on_grid:
            self.center_codes = encode_on_grid(self.Z_dev, self.operator_plan.grid, checked=True)

    def _shards(self, column_block):
        """The centers' shards, on the operator plan's grid where it takes one."""
        runtime, grid = self.context.runtime, self.operator_plan.grid
        kernel = self.context.kernel
        return CenterShards(kernel, self.Z_dev, runtime.devices, column_block, group=runtime.group, grid=grid)

    def solve(self, layout, plan, prepared, preconditioner, loop):
        context = self.context
        shards = self._shards(plan.column_block)
        if plan.cached:
            context.cached_or_planned_again(lambda: shards.cache(self.X_dev, plan.row_block), plan, "K(X, Z)")
        projection = self._projection(plan, shards, preconditioner)
        batches = self._batches(plan)
        validation = context.validation_tensors()
        if validation is not None:
            X_val = validation.X
            score = context.held_out_score(
                lambda coef, rows: shards.operator(X_val, rows).matmul(coef), plan.row_block, validation.Y
            )
            loop = dataclasses.replace(loop, validation=score)
        coef = context.starting_coef(self.problem.n_centers)
        return fit_eigenpro3(context.kernel, batches, shards, coef, preconditioner, projection, loop, plan.n_temporary)

    def _projection(self, plan, shards, preconditioner):
        context = self.context
        if plan.projection == "exact":
            jitter = max(PROJECTION_JITTER, 10 * torch.finfo(context.runtime.dtype).eps)
            return ExactProjection(context.kernel, self.Z_dev, jitter, context.runtime.dtype)
        if plan.cached and self.problem.centers_from_data:
            center_shards = shards  # K(Z, Z) is the first p rows of the K(X, Z) cache
        else:
            center_shards = self._shards(plan.column_block)
            if plan.cache_centers:  # else (or where the device refuses it) K(Z, Z) is evaluated per product
                context.cached_or_evaluated(lambda: center_shards.cache(self.Z_dev, plan.row_block), None, "K(Z, Z)")
        return IterativeProjection(
            center_shards, self.Z_dev, preconditioner, PROJECTION_MAX_ITERATIONS, PROJECTION_TOL, plan.row_block
        )

    def _batches(self, plan):
        context = self.context
        data, runtime = context.data, context.runtime
        if plan.streamed:
            sources = [as_row_source(data.X, "X"), as_row_source(data.Y, "y")]
            if not np.all(data.weights == data.weights[0]):
                sources.append(as_row_source(data.weights / data.weights.max(), "sample_weight"))
            seed = int(runtime.rng.randint(np.iinfo(np.int32).max)) + runtime.epochs_done
            offset = context.to_device.offset
            return StreamedBatches(sources, context.device, runtime.dtype, offset, plan.buffer_rows, seed)
        order = data.order
        Y_dev = context.to_device(data.Y[order], center=False)
        return InMemoryBatches(self.X_dev, Y_dev, context.weights_tensor(data.weights[order]), runtime.generator)


def _run_eigenpro3(context, attempt):
    """EigenPro 3 (``p`` centers): :func:`_run_eigenpro` on :class:`_EigenPro3Stages`."""
    return _run_eigenpro(_EigenPro3Stages(context))


def _run_centers_cg(context, attempt):
    """Penalised least squares on the centers by Falkon-preconditioned CG (no spectrum, no batches).

    Where rounding breaks CG down above its stated residual, it asks the driver to
    refit from where it ended with a penalty ten times larger (at most
    :data:`CG_FALLBACK_REFITS` times): the penalty the fit ends with is ``alpha_``.
    """
    data, runtime, settings, kernel = context.data, context.runtime, context.settings, context.kernel
    to_device = context.to_device
    centers = context.centers()
    X, Y = context.rows(data.order), to_device(data.Y[data.order], center=False)
    weights = None if np.all(data.weights == data.weights[0]) else to_device(data.weights[data.order], center=False)
    problem = context.problem_with(n_centers=centers.shape[0], centers_from_data=data.centers_from_data)
    centers_to_check = None if data.centers_from_data else centers
    measurements = measure_operator(kernel, X, operator_probe_shape(problem), centers_to_check)
    problem = operator_problem(problem, measurements)
    choice = plan_centers_solver(problem, runtime.budget, "cg")
    operator_plan = plan_operator(problem, measurements, context.itemsize if choice.stores_kernel else 0)
    operator = _CentersOperator.build(context, operator_plan, X, centers)
    rows = _centers_row_blocks(context, operator, Y, weights)
    if runtime.log is not None:
        runtime.log(
            f"[{settings.parameters.name}] device={context.device}, dtype={runtime.dtype}, n={X.shape[0]}, solver cg "
            f"on {centers.shape[0]} centers, K(X, Z): {operator.plan.describe()}, {choice.memory.describe()}"
        )
    coef_init = None if data.coef_init is None else data.coef_init.to(context.device)
    shares = None if data.center_shares is None else torch.as_tensor(data.center_shares)
    cg_settings = _cg_settings(settings.parameters, runtime)
    solved = fit_centers_cg(kernel, rows, centers, settings.alpha, cg_settings, coef_init, shares)
    if attempt.n_refits < CG_FALLBACK_REFITS:
        refit = _centers_cg_refit(context, solved)
        if refit is not None:
            return PathOutcome(None, fallback=refit)
    coef = solved.coef.to(runtime.dtype)
    _warn_if_unfinished(solved, runtime.dtype, settings.parameters, "on the centers")
    result = _cg_loop_result(solved, coef, _centers_held_out_score(context, centers))
    device_cache = context.prediction_tensors(kernel.prepare_centers(centers), coef, operator.plan, operator.codes)
    return PathOutcome(result, None, None, {}, data.centers, device_cache, operator=_stored_plan(operator, rows))


@dataclass(frozen=True)
class _CentersOperator:
    """``K(X, Z)`` in row blocks of CG's passes, from the grid where the operator plan takes it (``codes``: Z's)."""

    operator: object
    plan: object
    codes: torch.Tensor | None = None

    @classmethod
    def build(cls, context, plan, X, centers):
        if plan.grid is None:
            return cls(center_operator(context.kernel, X, centers, CG_ROW_BLOCK), plan)
        center_codes = encode_on_grid(centers, plan.grid, checked=True)
        row_codes = encode_on_grid(X, plan.grid, checked=True)
        blocks = OperatorBlocks.whole(CG_ROW_BLOCK, centers.shape[0])
        operator = GridOperator(context.kernel, row_codes, center_codes, context.runtime.dtype, blocks)
        return cls(operator, plan, center_codes)


def _centers_row_blocks(context, operator, Y, weights):
    """CG's source of ``K(X, Z)`` row blocks: stored where the operator plan caches it, else evaluated per pass.

    A cache the device refuses is recorded and evaluated per pass instead, the
    same blocks bit for bit (:meth:`_PathContext.cached_or_evaluated`).
    """
    evaluated = KernelRowBlocks(operator.operator, Y, weights, CG_ROW_BLOCK)
    if not operator.plan.cached:
        return evaluated
    fill = lambda: CachedRowBlocks.computed(operator.operator, Y, weights, CG_ROW_BLOCK)  # noqa: E731
    return context.cached_or_evaluated(fill, evaluated, "K(X, Z)")


def _stored_plan(operator, rows):
    """The operator plan as carried out: without its cache where the device refused the stored row blocks."""
    if operator.plan.cached and isinstance(rows, KernelRowBlocks):
        return dataclasses.replace(operator.plan, cache_dtype=None)
    return operator.plan


def _centers_held_out_score(context, centers):
    """``score(coef)`` of the held-out rows' ``K(X_val, Z) @ coef`` (row blocks halved on out of memory), or None."""
    validation = context.validation_tensors()
    if validation is None:
        return None
    X_val, n_rows, kernel = validation.X, validation.X.shape[0], context.kernel

    def predict(coef, row_block):
        return in_row_blocks(
            lambda rows: center_operator(kernel, X_val[rows], centers, row_block).block() @ coef, n_rows, row_block
        )

    return context.held_out_score(predict, n_rows, validation.Y)


def _centers_cg_refit(context, solved):
    """The refit with a larger penalty where rounding broke CG down above its stated residual, else None."""
    dtype, alpha, parameters = context.runtime.dtype, context.settings.alpha, context.settings.parameters
    residual = _unfinished_residual(solved, dtype, parameters)
    if residual is None or solved.stop not in _ROUNDING_STOPS:
        return None
    larger = _larger_penalty(alpha, dtype, context.data)
    reason = f"CG stopped ({solved.stop}) at a relative residual of {residual:.3g} in {dtype}"
    warning = (
        f"Conjugate gradients on the centers stopped ({solved.stop}) at a relative residual of "
        f"{residual:.3g}, above its tolerance {_cg_stopping(parameters, dtype).stated_tol:g} for "
        f"{dtype}: rounding limits the fit at "
        f"alpha={alpha:.3g}. Refitting from there with alpha={larger:.3g} (alpha_ holds the penalty used); "
        "set a larger alpha or dtype='float64' to keep the fit as asked."
    )
    return Fallback(reason, alpha=larger, coef_init=solved.coef, warning=warning)


# The solvers by (solver_, whether the model has centers): functions of the attempt's
# context and the attempt.  No class of this module inherits from another.
SOLVER_PATHS = {
    ("eigenpro", False): _run_eigenpro2,
    ("eigenpro", True): _run_eigenpro3,
    ("cg", False): _run_every_point_cg,
    ("cg", True): _run_centers_cg,
    ("direct", False): _run_direct,
}


def _cg_settings(parameters, runtime, square_system=False):
    """How a CG path iterates: the estimator's ``n_epochs`` as the bound, the stopping plan of its ``tol``."""
    stopping = _cg_stopping(parameters, runtime.dtype, square_system)
    return CGSettings(
        max_iterations=parameters.n_epochs,
        tol=stopping.residual_tol,
        log=runtime.log,
        n_iter_no_change=stopping.residual_patience,
        stopping=stopping.objective,
        objective_divergence=plan_divergence("objective") if square_system else None,
    )


def _cg_stopping(parameters, dtype, square_system=False):
    return plan_cg_stopping(parameters.tol, parameters.n_iter_no_change, dtype == torch.float64, square_system)


def _cg_loop_result(solved, coef, held_out_score=None):
    """A CG run as a :class:`KernelLoopResult`; ``held_out_score(coef)``, if given, scores the model it ends with.

    CG heads for the exact solution, so the validation score is not a stopping rule
    here: it is recorded on the last iteration's history entry.
    """
    history = solved.history
    if held_out_score is not None and history:
        history[-1] = {**history[-1], "validation_score": float(held_out_score(coef))}
    n = len(history)
    return KernelLoopResult(coef, n, n, None, None, history, converged=solved.converged)


def _warn_if_unfinished(solved, dtype, parameters, where):
    """A ``ConvergenceWarning`` when CG ``where`` (on the centers, on every point) ended unfinished.

    See :func:`_unfinished_residual`; growth of the objective has warned already.
    """
    residual = _unfinished_residual(solved, dtype, parameters)
    if residual is not None and solved.stop != "objective grew":
        warn_user(
            f"Conjugate gradients {where} stopped ({solved.stop}) after {len(solved.history)} iterations "
            f"with a relative residual of {residual:.3g}, above its tolerance "
            f"{_cg_stopping(parameters, dtype).stated_tol:g} for {dtype}: the model is not yet the penalised "
            "least-squares solution. Raise n_epochs (the iteration bound), or use a larger alpha, fewer centers or "
            "solver='eigenpro'.",
            ConvergenceWarning,
        )


def _unfinished_residual(solved, dtype, parameters):
    """The final relative residual where CG ended unfinished, else None.

    Finished: the residual met its tolerance, or (below float64) the objective rule
    ended the fit with the residual below its start
    (:meth:`~skgpu_kernel.planning.stopping.CGStoppingPlan.unfinished`), or
    ``tol=None`` asked for every iteration up to the bound.
    """
    if parameters.tol is None or not solved.history:
        return None
    residual = solved.history[-1]["relative_residual"]
    return residual if _cg_stopping(parameters, dtype).unfinished(solved.stop, residual) else None


def _broken_down(solved, dtype, parameters):
    """Whether CG ended unfinished by a breakdown (:data:`_BROKEN_STOPS`), or by its objective above its start."""
    residual = _unfinished_residual(solved, dtype, parameters)
    if residual is None:
        return False
    # A run cut by the iteration bound (n_epochs) may end above its start: CG's residual
    # on the square system is not monotone (3.6, 1.8, 0.87, ... where it converged).
    above_start = solved.stop == "objective" and residual > _cg_stopping(parameters, dtype).residual_ceiling
    return solved.stop in _BROKEN_STOPS or above_start


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
