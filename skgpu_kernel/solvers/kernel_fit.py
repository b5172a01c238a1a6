"""One fit pipeline for both EigenPro paths: layout, measure, plan, solve.

The estimator shell validates the input, shuffles the rows, chooses the centers
and hands over host arrays with the resolved runtime (devices, dtype, budget).
This module copies the data to the device, asks the planners of
:mod:`skgpu_kernel.planning.kernel` for every decision, measures what those need
(the device's batch capacity and the kernel's spectrum), runs the EigenPro 2 or
EigenPro 3 loop and returns what the shell stores.  The two paths share every
step and differ only in their layout, plan and loop (:class:`_EigenPro2Path`,
:class:`_EigenPro3Path`).  No scikit-learn and no input validation here.
"""

import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..blockwise import KernelCache, cache_kernel_rows, kernel_matmul_rows, measure_batch_capacity
from ..buffer import as_row_source
from ..device import is_out_of_memory, synchronize
from ..parallel.distributed import agree
from ..planning import kernel as kernel_plans
from ..planning.kernel import (
    BETA_PROBE_ROWS,
    CACHE_FILL_COLUMNS,
    CG_ROW_BLOCK,
    PROJECTION_JITTER,
    PROJECTION_MAX_ITERATIONS,
    PROJECTION_TOL,
    KernelProblem,
    KernelSettings,
    auto_subsample_size,
    plan_eigenpro2,
    plan_eigenpro2_layout,
    plan_eigenpro3,
    plan_eigenpro3_layout,
)
from ..preconditioner import SpectralSettings, max_usable_components, plan_preconditioner
from ..regularization import LOO_MAX_ROWS, select_alpha
from ..scaling import ScheduleContext, warn_if_warmup_fills_run
from .centers_cg import CGSettings, KernelRowBlocks, center_kernel_block, fit_centers_cg
from .eigenpro import KernelTrainingData, LoopSettings, fit_eigenpro
from .eigenpro3 import (
    CenterShards,
    ExactProjection,
    InMemoryBatches,
    IterativeProjection,
    StreamedBatches,
    fit_eigenpro3,
)

# Relative residual of the preconditioned normal equations at which CG stops: far
# below the statistical error of any model it fits, near float32's resolution.
CG_TOL = 1e-6

__all__ = ["DeviceCopier", "KernelFit", "KernelFitSettings", "KernelHostData", "KernelRuntime", "fit_kernel_model"]


@dataclass(frozen=True)
class KernelHostData:
    """Host arrays of a kernel fit, validated and split by the shell.

    Parameters
    ----------
    X : ndarray or memory map of shape (n, d)
        Training rows (unshuffled; ``order`` is the shuffle).
    Y : ndarray of shape (n, l)
    weights : ndarray of shape (n,)
    order : ndarray of shape (n,)
        The seeded permutation of the rows.
    validation : tuple (X_val, Y_val) or None
    centers : ndarray of shape (p, d) or None
        EigenPro 3's centers (float64); None puts a center at every training row.
    coef_init : Tensor or None
        Warm-start coefficients in the order of the centers.
    centers_from_data : bool
        The centers are the first ``p`` shuffled training rows.
    streamed : bool
        ``X`` is a memory-mapped file read in buffers.
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    order: np.ndarray
    validation: tuple | None
    centers: np.ndarray | None
    coef_init: torch.Tensor | None
    centers_from_data: bool = True
    streamed: bool = False


@dataclass(frozen=True)
class KernelRuntime:
    """Resolved facts of the run: devices, precision, memory, randomness, process group.

    ``rng`` is the fit's ``RandomState``, read once more when streamed data needs a
    seed; ``generator`` seeds the epoch permutations; ``group`` is the
    ``torch.distributed`` group the centers are sharded over (or None).
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


@dataclass(frozen=True)
class KernelFitSettings:
    """The estimator's parameters that the pipeline uses, resolved (kernel and scaling rule as objects)."""

    kernel: object
    bandwidth: float | None
    offset: np.ndarray | None
    planning: KernelSettings
    n_components: object
    damping: float
    scaling_rule: object
    n_epochs: int
    tol: float | None
    n_iter_no_change: int
    validation_score: Callable
    name: str
    alpha: float = 0.0
    stop_on_train_loss: bool = False
    solver: str = "eigenpro"


@dataclass
class KernelFit:
    """What a fit decided and produced, for the shell to store."""

    plan: object
    spectrum: object
    throughputs: dict
    result: object
    centers: np.ndarray
    device_cache: tuple
    solver: str = "eigenpro"


def fit_kernel_model(data, runtime, settings):
    """Plan and run an EigenPro 2 (``data.centers`` None) or EigenPro 3 fit.

    Parameters
    ----------
    data : KernelHostData
    runtime : KernelRuntime
    settings : KernelFitSettings

    Returns
    -------
    KernelFit
    """
    if data.centers is not None and settings.solver == "cg":
        return _fit_centers_by_cg(data, runtime, settings)
    path = (_EigenPro2Path if data.centers is None else _EigenPro3Path)(data, runtime, settings)
    layout = path.layout()
    capacity, throughputs = path.capacity(layout)
    spectrum = path.spectrum(layout, capacity)
    n_components = spectrum.preconditioner.n_components
    _warn_if_degenerate_kernel(spectrum, layout.subsample_size, runtime.dtype, settings.bandwidth)
    plan = path.prepare(path.plan(layout, capacity, spectrum.critical_batch_preconditioned, settings.planning))
    n = path.problem.n_rows
    steps_per_epoch = math.ceil(n / plan.batch_size)
    learning_rate_for = _learning_rate_function(settings.scaling_rule, spectrum, settings.n_epochs)
    warn_if_warmup_fills_run(
        settings.scaling_rule, _schedule_context(spectrum, plan.batch_size, steps_per_epoch, settings.n_epochs)
    )
    if runtime.log is not None:
        runtime.log(
            f"[{settings.name}] {path.where()}, dtype={runtime.dtype}, n={n}, {plan.describe()}, critical batch "
            f"{spectrum.critical_batch:.1f} -> {spectrum.critical_batch_preconditioned:.1f} with {n_components} "
            f"components, scaling rule {settings.scaling_rule!r}, step size "
            f"{learning_rate_for(runtime.first_step, plan.batch_size, steps_per_epoch):.4g}"
        )
    loop = LoopSettings(
        batch_size=plan.batch_size,
        learning_rate_for=learning_rate_for,
        n_epochs=settings.n_epochs,
        first_step=runtime.first_step,
        tol=settings.tol,
        n_iter_no_change=settings.n_iter_no_change,
        log=runtime.log,
        stop_on_train_loss=settings.stop_on_train_loss,
    )
    preconditioner = spectrum.preconditioner if n_components else None
    result = path.solve(layout, plan, preconditioner, loop)
    return KernelFit(plan, spectrum, throughputs, result, path.centers_host, path.device_cache(result.coef))


class _Path:
    """Steps shared by the two paths: the device copier, the problem, the probe's fallbacks."""

    def __init__(self, data, runtime, settings):
        self.data, self.runtime, self.settings = data, runtime, settings
        self.kernel, self.device = settings.kernel, runtime.devices[0]
        self.to_device = DeviceCopier(self.device, runtime.dtype, settings.offset)
        self.itemsize = torch.finfo(runtime.dtype).bits // 8

    def prepare(self, plan):
        """Allocate what the plan keeps for the whole fit; returns the plan as carried out."""
        return plan

    def problem_with(self, **sizes):
        """The :class:`KernelProblem` of the host data, with the path's own ``sizes``."""
        X, Y = self.data.X, self.data.Y
        return KernelProblem(X.shape[0], X.shape[1], Y.shape[1], self.itemsize, self.kernel.extra_blocks, **sizes)

    def device_cache(self, coef):
        """``(device, prepared centers, coefficients, offset)``: what predictions after fit reuse."""
        return (self.device, self.centers_dev, coef, self.to_device.offset)

    def given_capacity(self):
        """The user's batch (bounded by n), or None when it is to be measured."""
        batch_size = self.settings.planning.batch_size
        return None if batch_size == "auto" else min(batch_size, self.problem.n_rows)

    def validation_tensors(self):
        if self.data.validation is None:
            return None
        X_val, Y_val = self.data.validation
        return self.to_device(X_val), self.to_device(Y_val, center=False)

    def ridge(self):
        """``alpha`` on the scale of the normalised weights (``weights / weights.max()``) the loops see."""
        return self.settings.alpha / float(self.data.weights.max())

    def spectral_settings(self, eigenvalue_shift, diagonal_shift):
        """What the preconditioner is asked for: the user's components and damping, a penalty's shifts, ``n``."""
        settings = self.settings
        return SpectralSettings(
            settings.n_components, settings.damping, eigenvalue_shift, diagonal_shift, self.problem.n_rows
        )

    def weights_tensor(self, weights):
        """Normalised sample weights on the device, or None when all are equal."""
        if np.all(weights == weights[0]):
            return None
        return self.to_device(weights / weights.max(), center=False)


class _EigenPro2Path(_Path):
    """Every training row is a center; the loop is :func:`fit_eigenpro`."""

    def __init__(self, data, runtime, settings):
        super().__init__(data, runtime, settings)
        X = data.X
        n_validation = 0 if data.validation is None else data.validation[0].shape[0]
        self.problem = self.problem_with(n_validation=n_validation, unit_bounded_kernel=self.kernel.unit_bounded)
        self.X_dev = self.to_device(X[data.order])
        self.centers_dev = self.kernel.prepare_centers(self.X_dev)
        self.centers_host = None

    def where(self):
        return f"device={self.device}"

    def layout(self):
        planning = self.settings.planning
        return plan_eigenpro2_layout(self.problem, self.runtime.budget, self.device, planning, kernel_plans.CACHE_16BIT)

    def capacity(self, layout):
        given = self.given_capacity()
        if given is not None:
            return given, {}
        if layout.cached:
            # Steps read their kernel rows: an epoch reads the cache once whatever the
            # batch, so no throughput is probed (see planning.kernel.cached_batch_limit).
            return layout.memory_limit, {}
        return measure_batch_capacity(
            self.kernel,
            self.X_dev,
            self.centers_dev,
            self.problem.n_outputs,
            layout.memory_limit,
            layout.column_block,
            layout.subsample_size,
        )

    def spectrum(self, layout, capacity):
        # The iteration solves (K + alpha I) a = Y: every eigenvalue of K / n moves up
        # by alpha / n and every diagonal entry by alpha.
        ridge = self.ridge()
        spectral = self.spectral_settings(ridge / self.problem.n_rows, ridge)
        return plan_preconditioner(
            self.kernel, self.X_dev, layout.subsample_size, capacity, spectral, layout.column_block(1024)
        )

    def plan(self, layout, capacity, critical_batch, planning):
        return plan_eigenpro2(layout, capacity, critical_batch, planning)

    def solve(self, layout, plan, preconditioner, loop):
        data, runtime = self.data, self.runtime
        Y_dev = self.to_device(data.Y[data.order], center=False)
        weights = self.weights_tensor(data.weights[data.order])
        validation, caches = self.validation, self.caches
        tensors = KernelTrainingData(self.X_dev, self.centers_dev, Y_dev, weights, self.ridge(), caches[0])
        if validation is not None:
            X_val, Y_val = validation

            def score(coef):
                if caches[1] is not None:
                    predictions = caches[1].matmul(slice(None), coef)
                else:
                    predictions = kernel_matmul_rows(
                        self.kernel, X_val, self.centers_dev, coef, plan.batch_size, plan.column_block
                    )
                return self.settings.validation_score(predictions, Y_val)

            loop = _with_validation(loop, score)
        coef = data.coef_init
        fresh = coef is None
        coef = torch.zeros(self.problem.n_rows, self.problem.n_outputs, dtype=runtime.dtype) if fresh else coef
        coef = coef.to(self.device, runtime.dtype)
        generator = runtime.generator
        result = fit_eigenpro(self.kernel, tensors, coef, preconditioner, loop, layout.column_block, generator, fresh)
        self.centers_host = data.X[data.order]
        return result

    def prepare(self, plan):
        """Fill the kernel cache the plan asks for; without device memory for it, compute blocks per batch.

        The budget is planned from the memory free when the fit starts; a device that
        is shared (or fragmented) may still refuse the allocation, which is then
        reported and the fit goes on without the cache.
        """
        self.validation, self.caches = self.validation_tensors(), (None, None)
        if not plan.cached:
            return plan
        try:
            self.caches = self._caches(plan, self.validation)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            warnings.warn(
                f"The kernel cache ({plan.memory.describe()}) did not fit the memory free on {self.device}: "
                "kernel blocks are computed per batch instead. Lower memory_budget or set cache_kernel=False.",
                RuntimeWarning,
                stacklevel=5,
            )
            return dataclasses.replace(plan, cached=False, cache_itemsize=0)
        return plan

    def _caches(self, plan, validation):
        """``K(X, X)`` and ``K(X_val, X)`` as :class:`KernelCache` objects."""
        tic = time.perf_counter()
        storage = self.runtime.dtype if plan.cache_itemsize == self.itemsize else torch.float16
        blocks = (plan.row_block, CACHE_FILL_COLUMNS)
        train = cache_kernel_rows(self.kernel, self.X_dev, self.centers_dev, storage, *blocks, symmetric=True)
        held_out = None
        if validation is not None:
            held_out = cache_kernel_rows(self.kernel, validation[0], self.centers_dev, storage, *blocks)
        synchronize(self.device)
        if self.runtime.log is not None:
            rows = train.shape[0] + (0 if held_out is None else held_out.shape[0])
            self.runtime.log(
                f"[{self.settings.name}] kernel cached: {rows} x {train.shape[1]} in {storage}, "
                f"{time.perf_counter() - tic:.1f} s"
            )
        return KernelCache(train, self.runtime.dtype), (
            None if held_out is None else KernelCache(held_out, self.runtime.dtype)
        )


class _EigenPro3Path(_Path):
    """``p`` centers; the loop is :func:`fit_eigenpro3`, with shards, a projection and batches."""

    def __init__(self, data, runtime, settings):
        super().__init__(data, runtime, settings)
        X, group = data.X, runtime.group
        n_shards = group.size() if group is not None else len(runtime.devices)
        self.problem = self.problem_with(
            n_centers=data.centers.shape[0],
            n_shards=n_shards,
            centers_from_data=data.centers_from_data,
            streamed=data.streamed,
        )
        self.centers_host = data.centers
        self.Z_dev = self.to_device(data.centers)
        self.centers_dev = self.kernel.prepare_centers(self.Z_dev)
        self.X_dev = None if self.problem.streamed else self.to_device(X[data.order])

    def where(self):
        group = self.runtime.group
        rank = f" (rank {group.rank()} of {group.size()})" if group is not None else ""
        return f"devices={[str(device) for device in self.runtime.devices]}{rank}"

    def layout(self):
        runtime, planning = self.runtime, self.settings.planning
        layout = plan_eigenpro3_layout(self.problem, runtime.budget, self.device, planning)
        # Ranks may see different free memory; they must take the same path.
        choices = agree(layout.choices, runtime.group, self.device)
        if tuple(choices) != layout.choices:
            layout = plan_eigenpro3_layout(self.problem, runtime.budget, self.device, planning, choices)
        return layout

    def capacity(self, layout):
        given = self.given_capacity()
        if given is not None:
            return given, {}
        if layout.cached:
            # A step on cached K(X, Z) reads its rows instead of evaluating the kernel,
            # so a larger batch costs no more per row: the batch is limited by memory
            # (and by the critical batch), not by a throughput probe.
            return layout.memory_limit, {}
        probe_rows = self.Z_dev if self.X_dev is None else self.X_dev
        capacity, throughputs = measure_batch_capacity(
            self.kernel,
            probe_rows,
            self.centers_dev,
            self.problem.n_outputs,
            layout.memory_limit,
            layout.column_block,
            layout.subsample_size,
        )
        # Ranks time their own devices; they must agree on the batch to stay in step.
        (capacity,) = agree([capacity], self.runtime.group, self.device)
        return capacity, throughputs

    def spectrum(self, layout, capacity):
        # The spectrum is estimated on the first s centers (the Nystrom subsample), and
        # the preconditioned beta also on training rows outside it.
        data = self.data
        if self.X_dev is not None:
            probe_rows = self.X_dev[:BETA_PROBE_ROWS]
        else:
            probe_rows = self.to_device(data.X[np.sort(data.order[:BETA_PROBE_ROWS])])
        # The penalty alpha ||f||^2 / n adds alpha / n to the operator and to one sample's curvature.
        shift = self.ridge() / self.problem.n_rows
        spectral = self.spectral_settings(shift, shift)
        return plan_preconditioner(
            self.kernel, self.Z_dev, layout.subsample_size, capacity, spectral, layout.column_block(1024), probe_rows
        )

    def plan(self, layout, capacity, critical_batch, planning):
        return plan_eigenpro3(layout, capacity, critical_batch, planning)

    def solve(self, layout, plan, preconditioner, loop):
        runtime = self.runtime
        shards = CenterShards(self.kernel, self.Z_dev, runtime.devices, plan.column_block, group=runtime.group)
        if plan.cached:
            shards.cache(self.X_dev, plan.row_block)
        projection = self._projection(plan, shards, preconditioner)
        batches = self._batches(plan)
        validation = self.validation_tensors()
        if validation is not None:
            X_val, Y_val = validation

            def score(coef):
                predictions = torch.cat(
                    [
                        shards.apply(shards.blocks(X_val[start : start + plan.row_block]), coef)
                        for start in range(0, X_val.shape[0], plan.row_block)
                    ]
                )
                return self.settings.validation_score(predictions, Y_val)

            loop = _with_validation(loop, score)
        coef_init = self.data.coef_init
        shape = (self.problem.n_centers, self.problem.n_outputs)
        coef = torch.zeros(shape, dtype=runtime.dtype) if coef_init is None else coef_init
        coef = coef.to(self.device, runtime.dtype)
        return fit_eigenpro3(self.kernel, batches, shards, coef, preconditioner, projection, loop, plan.n_temporary)

    def _projection(self, plan, shards, preconditioner):
        runtime = self.runtime
        if plan.projection == "exact":
            jitter = max(PROJECTION_JITTER, 10 * torch.finfo(runtime.dtype).eps)
            return ExactProjection(self.kernel, self.Z_dev, jitter, runtime.dtype)
        if plan.cached and self.problem.centers_from_data:
            center_shards = shards  # K(Z, Z) is the first p rows of the K(X, Z) cache
        else:
            center_shards = CenterShards(self.kernel, self.Z_dev, runtime.devices, plan.column_block, runtime.group)
            if plan.cache_centers:
                center_shards.cache(self.Z_dev, plan.row_block)
        return IterativeProjection(
            center_shards, self.Z_dev, preconditioner, PROJECTION_MAX_ITERATIONS, PROJECTION_TOL, plan.row_block
        )

    def _batches(self, plan):
        data, runtime = self.data, self.runtime
        if plan.streamed:
            sources = [as_row_source(data.X, "X"), as_row_source(data.Y, "y")]
            if not np.all(data.weights == data.weights[0]):
                sources.append(as_row_source(data.weights / data.weights.max(), "sample_weight"))
            seed = int(runtime.rng.randint(np.iinfo(np.int32).max)) + runtime.epochs_done
            offset = self.to_device.offset
            return StreamedBatches(sources, self.device, runtime.dtype, offset, plan.buffer_rows, seed)
        order = data.order
        Y_dev = self.to_device(data.Y[order], center=False)
        return InMemoryBatches(self.X_dev, Y_dev, self.weights_tensor(data.weights[order]), runtime.generator)


@dataclass
class CentersCGResult:
    """What the conjugate-gradient solve of the centers produced, in the loops' result fields."""

    coef: torch.Tensor
    n_epochs: int
    n_steps: int
    history: list
    converged: bool
    batch_size: None = None
    learning_rate: None = None


def _fit_centers_by_cg(data, runtime, settings):
    """Penalised least squares on the centers by Falkon-preconditioned CG (no spectrum, no batches)."""
    device, kernel = runtime.devices[0], settings.kernel
    to_device = DeviceCopier(device, runtime.dtype, settings.offset)
    centers = to_device(data.centers)
    X, Y = to_device(data.X[data.order]), to_device(data.Y[data.order], center=False)
    weights = None if np.all(data.weights == data.weights[0]) else to_device(data.weights[data.order], center=False)
    rows = KernelRowBlocks(X, Y, weights, center_kernel_block(kernel, centers), CG_ROW_BLOCK)
    # tol=None asks for every iteration up to the bound, as it asks for every epoch.
    cg = CGSettings(
        max_iterations=settings.n_epochs,
        tol=0.0 if settings.tol is None else CG_TOL,
        log=runtime.log,
        # float64 blocks reach CG_TOL; below float64 the residual has a rounding floor
        # above it, and the objective judges progress (as the EigenPro loops' tol does).
        objective_tol=None if runtime.dtype == torch.float64 else settings.tol,
        objective_patience=settings.n_iter_no_change,
    )
    if runtime.log is not None:
        runtime.log(f"[{settings.name}] device={device}, dtype={runtime.dtype}, n={X.shape[0]}, solver cg")
    coef_init = None if data.coef_init is None else data.coef_init.to(device)
    solved = fit_centers_cg(kernel, rows, centers, settings.alpha, cg, coef_init)
    coef = solved.coef.to(runtime.dtype)
    if data.validation is not None and solved.history:
        X_val, Y_val = to_device(data.validation[0]), to_device(data.validation[1], center=False)
        predictions = center_kernel_block(kernel, centers)(X_val) @ coef
        solved.history[-1]["validation_score"] = float(settings.validation_score(predictions, Y_val))
    n = len(solved.history)
    result = CentersCGResult(coef, n, n, solved.history, solved.converged)
    prepared = kernel.prepare_centers(centers)
    return KernelFit(None, None, {}, result, data.centers, (device, prepared, coef, to_device.offset), "cg")


def choose_alpha(X, Y, weights, kernel, offset, runtime, min_coverage=0.0):
    """``alpha="auto"``: :func:`~skgpu_kernel.regularization.select_alpha` on seeded random rows.

    At most ``LOO_MAX_ROWS`` rows are scored.  Beyond that the chosen ``alpha`` is
    kept as it is rather than scaled with the number of rows: on the real-data
    benchmark the leave-one-out ``alpha`` stayed within a factor 1.5 from 5000 to
    60000 rows of Fashion-MNIST and from 4000 to 17817 rows of HI (and fell on
    VietNamI), where a constant per-sample penalty would have grown it 4 to 12 times.

    Parameters
    ----------
    X, Y, weights : ndarray
        Host training rows, centred targets and weights.
    kernel : Kernel
    offset : ndarray or None
    runtime : KernelRuntime
    min_coverage : float, default=0.0
        Passed to :func:`~skgpu_kernel.regularization.select_alpha`.

    Returns
    -------
    AlphaSelection
    """
    to_device = DeviceCopier(runtime.devices[0], torch.float64, offset)  # the criterion is float64 throughout
    # Drawn from a copy of the fit's generator, so that choosing alpha leaves the fit's own
    # draws (validation split, epoch orders) as they would be with alpha given.
    rows = copy.deepcopy(runtime.rng).permutation(X.shape[0])[:LOO_MAX_ROWS]  # the first s: the Nystrom subsample
    unit = np.all(weights == weights[0])
    w = None if unit else torch.as_tensor(weights[rows], dtype=torch.float64, device=runtime.devices[0])
    return select_alpha(
        kernel,
        to_device(X[rows]),
        to_device(Y[rows], center=False),
        w,
        auto_subsample_size(len(rows)),
        min_coverage,
    )


def _with_validation(loop, score):
    return dataclasses.replace(loop, validation=score)


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
        warnings.warn(
            f"{described} matrix is numerically the identity: samples do not see each other, and "
            "predictions away from the training points are close to zero. The bandwidth is "
            "probably too small for the distances in the data.",
            UserWarning,
            stacklevel=6,
        )
    elif max_usable_components(eigenvalues, dtype) == 0:
        warnings.warn(
            f"{described} is numerically constant on the data in {dtype}: the model can fit "
            "little more than a constant. The bandwidth is probably too large for the "
            "distances in the data.",
            UserWarning,
            stacklevel=6,
        )


class DeviceCopier:
    """Copies host arrays to the compute device and dtype, centring features if asked."""

    def __init__(self, device, dtype, offset):
        self.device, self.dtype = device, dtype
        self.offset = None if offset is None else torch.as_tensor(offset, dtype=dtype).to(device)

    def __call__(self, array, center=True):
        tensor = torch.as_tensor(np.ascontiguousarray(array), dtype=self.dtype).to(self.device)
        if center and self.offset is not None:
            tensor = tensor - self.offset
        return tensor
