"""The BMGD linear models' one fit pipeline: measure, plan, solve, one result.

The estimator shell validates the input (or opens an out-of-core source), encodes
the targets and hands over :class:`BMGDInput`, the resolved :class:`BMGDRuntime`
(device, dtype, budget, seed, parallel workers), its :class:`BMGDSettings` and,
for ``warm_start`` and ``partial_fit``, a :class:`BMGDContinuation`.
:func:`fit_bmgd_model` then

1. splits off the validation rows and opens the row sources;
2. measures what the plan needs on sampled rows (the spectrum of the loss's
   Hessian, the device's throughput) and plans buffers and batch
   (:mod:`skgpu_kernel.planning.sgd`), or keeps the plan of an earlier
   ``partial_fit`` call;
3. runs BMGD in this process (:func:`~skgpu_kernel.solvers.sgd.fit_buffered_sgd`)
   or on the strategy's workers (:mod:`skgpu_kernel.parallel`);

and returns one :class:`BMGDFit`.  No scikit-learn and no input validation here.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .._warnings import warn_user
from ..blockwise import linear_scores
from ..buffer import as_row_source, map_ranges
from ..parallel.launch import run_distributed, share_for_workers
from ..parallel.strategies import AdaptiveSGD
from ..parallel.worker import TrainingJob, source_spec, train_worker
from ..passes import PassLayout, open_passes, read_rows
from ..planning.sgd import (
    SGDProblem,
    ThroughputProbe,
    plan_bmgd,
    plan_buffers,
    sample_ranges,
    step_spectrum,
    validation_split,
)
from ..planning.stopping import plan_stopping
from ..scaling import warn_if_warmup_fills_run
from .losses import make_loss
from .sgd import SGDResult, SGDRun, fit_buffered_sgd, linear_spectrum, measure_sgd_capacity

__all__ = ["BMGDContinuation", "BMGDFit", "BMGDInput", "BMGDRuntime", "BMGDSettings", "ParallelFacts", "fit_bmgd_model"]


@dataclass(frozen=True)
class BMGDInput:
    """The opened data of a BMGD fit.

    Parameters
    ----------
    source : RowSource
        The rows of X.
    targets : ndarray
        Float targets of shape (n, l), or int64 class indices of shape (n,).
    n_outputs : int
        Score columns of the model.
    weights : ndarray of shape (n,) or None
        None when every weight is 1.
    check_finite : bool
        X was not validated in memory: buffers are checked for NaN as they arrive.
    nonzeros_per_row : float or None
        Sparse X only.
    """

    source: object
    targets: np.ndarray
    n_outputs: int
    weights: np.ndarray | None
    check_finite: bool
    nonzeros_per_row: float | None


@dataclass(frozen=True)
class BMGDRuntime:
    """Resolved facts of the run: device, precision, memory, seed, parallel workers, progress output."""

    device: torch.device
    dtype: torch.dtype
    budget: int
    seed: int
    prefetch: bool
    strategy: object = None
    worker_devices: list | None = None
    log: Callable | None = None


@dataclass(frozen=True)
class BMGDSettings:
    """The estimator's parameters that the pipeline reads (the scaling rule resolved)."""

    loss: str
    epsilon: float
    alpha: float
    fit_intercept: bool
    scaling_rule: object
    batch_size: object
    buffer_size: object
    n_rounds: int
    n_epochs: int
    shuffle: bool
    tol: float | None
    early_stopping: bool
    validation_fraction: float
    n_iter_no_change: int
    validation_score: Callable
    name: str
    incremental: bool = False


@dataclass(frozen=True)
class BMGDContinuation:
    """What a warm start or a later ``partial_fit`` call continues from.

    ``plan`` and ``start_step`` are those of earlier ``partial_fit`` calls (their
    sizes, spectrum and schedule are kept); None and 0 for ``warm_start``, which
    plans anew from the previous coefficients.
    """

    coef_matrix: np.ndarray
    intercept: np.ndarray
    seed: int
    passes_done: int
    plan: object = None
    start_step: int = 0


@dataclass(frozen=True)
class ParallelFacts:
    """What only parallel fits report; the merge records are AdaptiveSGD's (one row per merge)."""

    n_workers: int
    communication_bytes: int
    merge_weights: np.ndarray | None = None
    worker_batch_sizes: np.ndarray | None = None


@dataclass(frozen=True)
class BMGDFit:
    """What a BMGD fit decided and produced, for the shell to store.

    Attributes
    ----------
    result : SGDResult
    coef : Tensor of shape (d, l)
    intercept : Tensor of shape (l,)
    plan : BMGDPlan
    passes_done : int
        Passes over the data since the first call (chunk orders continue from here).
    n_steps_total : int
        Updates since the first call (the schedule continues from here).
    parallel : ParallelFacts or None
    """

    result: SGDResult
    coef: torch.Tensor
    intercept: torch.Tensor
    plan: object
    passes_done: int
    n_steps_total: int
    parallel: ParallelFacts | None = None


@dataclass(frozen=True)
class _Rows:
    """The fit's rows, opened: the pass layout, the validation ranges, the problem's sizes, the loss."""

    layout: PassLayout
    validation_ranges: list | None
    problem: SGDProblem
    loss: object


def fit_bmgd_model(data, runtime, settings, continuation=None):
    """Plan and run a BMGD fit (one process, or the workers of ``runtime.strategy``).

    Parameters
    ----------
    data : BMGDInput
    runtime : BMGDRuntime
    settings : BMGDSettings
    continuation : BMGDContinuation or None

    Returns
    -------
    BMGDFit
    """
    _check_request(data, runtime, settings, continuation)
    passes_done = 0 if continuation is None else continuation.passes_done
    rng = np.random.RandomState([runtime.seed, passes_done, 0])
    generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
    rows = _open_rows(data, runtime, settings, rng)
    if continuation is not None and continuation.plan is not None:
        plan, start_step = continuation.plan, continuation.start_step
    else:
        plan, start_step = _plan(rows, runtime, settings, (rng, generator)), 0
        warn_if_warmup_fills_run(settings.scaling_rule, plan.context)
    run = _sgd_run(rows, plan, settings, start_step)
    coef, intercept = _starting_coefficients(rows.problem, runtime, continuation)
    if runtime.log is not None:
        runtime.log(f"[{settings.name}] {_describe(runtime, plan, run)}")
    parallel = None
    if runtime.strategy is not None:
        job = _job(rows, runtime, plan, run, (coef, intercept, passes_done))
        result, coef, intercept, parallel = _run_parallel(job, runtime)
    else:
        schedule = (runtime.seed, passes_done, run.n_epochs, run.shuffle)
        result = _run_single(rows, (plan, schedule), run, (coef, intercept, generator), settings, runtime.log)
    return BMGDFit(result, coef, intercept, plan, passes_done + result.n_epochs, start_step + result.n_steps, parallel)


def _check_request(data, runtime, settings, continuation):
    """Combinations that cannot run: early stopping across workers, a warm start of another shape."""
    if runtime.strategy is not None and settings.early_stopping:
        raise ValueError(
            "early_stopping needs one validation split seen by one process; it is not available with "
            "parallel=. Set early_stopping=False (tol does not apply to parallel fits either)."
        )
    if continuation is None:
        return
    needed = (data.n_outputs, data.source.shape[1])
    if continuation.coef_matrix.shape != needed:
        raise ValueError(
            f"warm_start continues from coefficients of shape {continuation.coef_matrix.shape}, but the data "
            f"needs {needed}. Set warm_start=False to fit new data."
        )


def _open_rows(data, runtime, settings, rng):
    """Row sources of X, the targets and the weights, split into training segments and validation ranges."""
    n_rows, n_features = data.source.shape
    segments, validation_ranges = [(0, n_rows)], None
    if settings.early_stopping and not settings.incremental:
        segments, validation_ranges = validation_split(n_rows, settings.validation_fraction, rng)
    dtype = runtime.dtype
    sources = [data.source, as_row_source(data.targets, "y")]
    dtypes = [dtype, dtype if data.targets.dtype.kind == "f" else torch.int64]
    if data.weights is not None:
        sources.append(as_row_source(data.weights, "sample_weight"))
        dtypes.append(dtype)
    problem = SGDProblem(
        n_train=sum(stop - start for start, stop in segments),
        n_features=n_features,
        n_outputs=data.n_outputs,
        itemsize=torch.finfo(dtype).bits // 8,
        nonzeros_per_row=data.nonzeros_per_row,
        weighted=data.weights is not None,
    )
    layout = PassLayout(sources, dtypes, runtime.device, segments, data.check_finite, runtime.prefetch)
    return _Rows(layout, validation_ranges, problem, make_loss(settings.loss, data.n_outputs, settings.epsilon))


def _plan(rows, runtime, settings, randomness):
    """Buffers, then the spectrum and throughput measured on sampled rows, then the batch."""
    rng, generator = randomness
    problem, device = rows.problem, runtime.device
    buffers = plan_buffers(problem, runtime.budget, device.type, settings.buffer_size, settings.batch_size)
    ranges = map_ranges(rows.layout.segments, sample_ranges(problem.n_train, rng))
    sample = read_rows(rows.layout, ranges)
    weights = sample[2] if problem.weighted else None
    raw = linear_spectrum(sample[0], weights, settings.fit_intercept, generator)
    spectrum = step_spectrum(*raw, rows.loss.curvature, settings.alpha)
    probe = None
    if buffers.probe_max_batch is not None:
        key = ("sgd", device.type, device.index, runtime.dtype, problem.n_features, problem.n_outputs)
        key += (sample[0].is_sparse, type(rows.loss))
        capacity = measure_sgd_capacity(sample[0], problem.n_outputs, rows.loss, buffers.probe_max_batch, key)
        probe = ThroughputProbe(*capacity)
    plan = plan_bmgd(
        buffers,
        spectrum,
        probe,
        batch_size=settings.batch_size,
        n_rounds=settings.n_rounds,
        n_epochs=settings.n_epochs,
    )
    for message in plan.warnings:
        warn_user(message, UserWarning)
    return plan


def _sgd_run(rows, plan, settings, start_step):
    """How the loop steps and stops: ``partial_fit`` takes one pass and never stops early."""
    validation = rows.validation_ranges is not None
    tol = None if settings.incremental else settings.tol
    return SGDRun(
        loss=rows.loss,
        rule=settings.scaling_rule,
        context=plan.context,
        n_rounds=settings.n_rounds,
        n_epochs=1 if settings.incremental else settings.n_epochs,
        alpha=settings.alpha,
        fit_intercept=settings.fit_intercept,
        shuffle=settings.shuffle,
        start_step=start_step,
        stopping=plan_stopping(tol, settings.n_iter_no_change, validation),
    )


def _starting_coefficients(problem, runtime, continuation):
    """``(coef, intercept)`` on the device: the previous ones when continuing, else zeros."""
    dtype, device = runtime.dtype, runtime.device
    if continuation is None:
        shape = (problem.n_features, problem.n_outputs)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape[1], dtype=dtype, device=device)
    coef = torch.as_tensor(continuation.coef_matrix.T.copy(), dtype=dtype).to(device)
    intercept = torch.as_tensor(np.asarray(continuation.intercept, dtype=np.float64), dtype=dtype).to(device)
    return coef, intercept


def _describe(runtime, plan, run):
    """The decisions line ``verbose`` prints before training."""
    where = f"device={runtime.device}, dtype={str(runtime.dtype).removeprefix('torch.')}"
    if runtime.strategy is not None:
        devices = [str(device) for device in runtime.worker_devices]
        where += f", {type(runtime.strategy).__name__} on {devices}"
    return f"{where}, {plan.describe()}, first learning rate {run.learning_rate(run.start_step, run.batch_size):.4g}"


def _run_single(rows, passes, run, state, settings, log):
    """BMGD in this process on resident or streamed passes, scored on the validation rows when held out."""
    plan, schedule = passes
    coef, intercept, generator = state
    opened = open_passes(rows.layout, plan, schedule)
    try:
        validation = None
        if rows.validation_ranges is not None:
            X_val, T_val = read_rows(rows.layout, rows.validation_ranges, n_sources=2)

            def validation(coef, intercept):
                return settings.validation_score(linear_scores(X_val, coef, intercept), T_val)

        result = fit_buffered_sgd(coef, intercept, opened.open, run, generator, validation, log)
    finally:
        opened.close()
    return result


def _job(rows, runtime, plan, run, start):
    """What every worker receives: the run, the sources as specs, the starting point and the strategy."""
    coef, intercept, passes_done = start
    layout = rows.layout
    return TrainingJob(
        run=run,
        sources=[source_spec(source.data, share_for_workers) for source in layout.sources],
        dtypes=[str(dtype).removeprefix("torch.") for dtype in layout.dtypes],
        coef=coef.cpu().numpy(),
        intercept=intercept.cpu().numpy(),
        buffer_size=plan.buffer_size,
        prefetch=layout.prefetch,
        seed=runtime.seed,
        first_pass=passes_done,
        segments=layout.segments,
        strategy=runtime.strategy,
    )


def _run_parallel(job, runtime):
    """Train on the strategy's worker processes (or as this rank of a torchrun group)."""
    devices = [str(device) for device in runtime.worker_devices]
    outcome = run_distributed(train_worker, job, devices, timeout=runtime.strategy.timeout)[0]
    distributed = torch.distributed.is_initialized()
    n_workers = torch.distributed.get_world_size() if distributed else len(devices)
    facts = _parallel_facts(outcome, runtime.strategy, n_workers)
    return outcome.result, torch.as_tensor(outcome.coef), torch.as_tensor(outcome.intercept), facts


def _parallel_facts(outcome, strategy, n_workers):
    """What the workers reported beyond the model and its history."""
    if not isinstance(strategy, AdaptiveSGD):
        return ParallelFacts(n_workers, outcome.bytes_all_reduced)
    history = outcome.result.history
    return ParallelFacts(
        n_workers,
        outcome.bytes_all_reduced,
        merge_weights=np.array([record["merge_weights"] for record in history]),
        worker_batch_sizes=np.array([record["worker_batch_sizes"] for record in history]),
    )
