"""The BMGD linear models' one fit pipeline: measure, plan, solve, one result.

The estimator shell validates the input (or opens an out-of-core source), encodes
the targets and hands over :class:`BMGDInput`, the resolved :class:`BMGDRuntime`
(device, dtype, budget, seed, the runner), its :class:`BMGDSettings` and, for
``warm_start`` and ``partial_fit``, a :class:`BMGDContinuation`.
:func:`fit_bmgd_model` then

1. splits off the validation rows and opens the row sources;
2. measures what the plan needs on sampled rows (the spectrum of the loss's
   Hessian, the device's throughput) and plans buffers and batch
   (:mod:`skgpu_kernel.planning.sgd`), or keeps the plan of an earlier
   ``partial_fit`` call;
3. hands the planned :class:`BMGDTraining` to the runner;

and returns one :class:`BMGDFit`.  No scikit-learn and no input validation here.

The shell hands in the runner: :class:`InProcessRunner` trains in this process
(:func:`~skgpu_kernel.solvers.sgd.fit_buffered_sgd`), a parallel strategy's
:class:`~skgpu_kernel.parallel.runner.WorkerRunner` on its workers.  The pipeline
never asks which runner it holds (and imports nothing from
:mod:`skgpu_kernel.parallel`); a runner has

* ``check_settings(settings)``: raises for settings it cannot run;
* ``description``: what the ``verbose`` line says about it (None: nothing);
* ``trains_in_process``: whether its model is this process's own fit of every
  row, which the full-batch polish may finish here;
* ``train(training)``: the :class:`~skgpu_kernel.solvers.sgd.SGDOutcome` of a
  :class:`BMGDTraining`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ._warnings import warn_user
from .blockwise import linear_scores
from .buffer import map_ranges
from .passes import OrderedPasses, PassLayout, open_passes, read_rows
from .planning.sgd import (
    SGDProblem,
    ThroughputProbe,
    plan_bmgd,
    plan_buffers,
    plan_polish,
    plateaus_to_anneal,
    step_spectrum,
)
from .planning.stopping import plan_stopping
from .row_sources import as_row_source
from .scaling_rules import warn_if_warmup_fills_run
from .solvers.losses import make_loss
from .solvers.polish import PolishResult, polish_linear
from .solvers.sgd import SGDOutcome, SGDResult, SGDRun, fit_buffered_sgd, linear_spectrum, measure_sgd_capacity
from .splits import sample_ranges, validation_split

__all__ = [
    "BMGDContinuation",
    "BMGDFit",
    "BMGDInput",
    "BMGDRuntime",
    "BMGDSettings",
    "BMGDTraining",
    "InProcessRunner",
    "fit_bmgd_model",
]


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
    out_of_core : bool
        X is an out-of-core source, not validated in memory: buffers are checked
        for NaN as they arrive, and the rows are never read whole.
    nonzeros_per_row : float or None
        Sparse X only.
    """

    source: object
    targets: np.ndarray
    n_outputs: int
    weights: np.ndarray | None
    out_of_core: bool
    nonzeros_per_row: float | None


@dataclass(frozen=True)
class BMGDRuntime:
    """Resolved facts of the run: device, precision, memory, seed, where it trains, progress output.

    ``runner`` is :class:`InProcessRunner`, or the runner of a parallel strategy's
    workers (see the module's description of a runner).
    """

    device: torch.device
    dtype: torch.dtype
    budget: int
    seed: int
    prefetch: bool
    runner: object
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
    polish: str | None = "auto"


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
    runner_facts : dict
        Fitted attributes only the runner reports, by name
        (:attr:`~skgpu_kernel.solvers.sgd.SGDOutcome.facts`).
    polish : PolishResult or None
        The full-batch finish, where it was planned (:func:`~skgpu_kernel.planning.sgd.plan_polish`).
    """

    result: SGDResult
    coef: torch.Tensor
    intercept: torch.Tensor
    plan: object
    passes_done: int
    n_steps_total: int
    runner_facts: dict
    polish: PolishResult | None = None

    @property
    def converged(self):
        """The polish's certificate where it ran, else the SGD loop's stopping rule."""
        return self.result.converged if self.polish is None else self.polish.converged


@dataclass(frozen=True)
class BMGDTraining:
    """What a runner trains: the planned run on the opened rows, from its starting point.

    Attributes
    ----------
    layout : PassLayout
        The row sources, their dtypes, the training segments, prefetching.
    validation_ranges : list of (int, int) or None
        Rows held out for early stopping.
    plan : BMGDPlan
    run : SGDRun
    coef : Tensor of shape (d, l)
    intercept : Tensor of shape (l,)
        Starting coefficients on the device.
    generator : torch.Generator
        Seeds the shuffles within buffers.
    seed : int
        Seeds the chunk orders of every pass.
    passes_done : int
        Passes of earlier calls (the chunk orders continue from there).
    validation_score : callable
        ``validation_score(scores, targets, weights) -> float``, larger is better
        (``weights``: the held-out rows' ``sample_weight``, or None).
    log : callable or None
        Receives progress lines.
    """

    layout: PassLayout
    validation_ranges: list | None
    plan: object
    run: SGDRun
    coef: torch.Tensor
    intercept: torch.Tensor
    generator: torch.Generator
    seed: int
    passes_done: int
    validation_score: Callable
    log: Callable | None


class InProcessRunner:
    """The runner of a fit in this process, on resident or streamed passes.

    It runs :func:`~skgpu_kernel.solvers.sgd.fit_buffered_sgd` and scores the
    held-out rows when early stopping asks for them.  A fit without ``parallel=``
    hands it to :func:`fit_bmgd_model`; the strategies' workers have their own
    runner (:class:`~skgpu_kernel.parallel.runner.WorkerRunner`).
    """

    description = None
    # The model it returns is this process's, on every row: the pipeline may polish it here.
    trains_in_process = True

    def check_settings(self, settings):
        """Accept every setting: one process runs them all.

        Parameters
        ----------
        settings : BMGDSettings
        """

    def train(self, training):
        """Train ``training.coef`` and ``training.intercept`` in place.

        Parameters
        ----------
        training : BMGDTraining

        Returns
        -------
        SGDOutcome
            Its facts say that no parallel strategy ran (``parallel_`` is None).
        """
        run = training.run
        schedule = (training.seed, training.passes_done, run.n_epochs, run.shuffle)
        opened = open_passes(training.layout, training.plan, schedule)
        try:
            validation = None
            if training.validation_ranges is not None:
                X_val, T_val, *W_val = read_rows(training.layout, training.validation_ranges)
                weights = W_val[0] if W_val else None

                def validation(coef, intercept):
                    return training.validation_score(linear_scores(X_val, coef, intercept), T_val, weights)

            coef, intercept = training.coef, training.intercept
            result = fit_buffered_sgd(coef, intercept, opened.open, run, training.generator, validation, training.log)
        finally:
            opened.close()
        return SGDOutcome(result, coef, intercept, {"parallel_": None})


@dataclass(frozen=True)
class _Rows:
    """The fit's rows, opened: the pass layout, the validation ranges, the problem's sizes, the loss."""

    layout: PassLayout
    validation_ranges: list | None
    problem: SGDProblem
    loss: object


def fit_bmgd_model(data, runtime, settings, continuation=None):
    """Plan a BMGD fit and train it with ``runtime.runner`` (this process, or a strategy's workers).

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
    training = BMGDTraining(
        layout=rows.layout,
        validation_ranges=rows.validation_ranges,
        plan=plan,
        run=run,
        coef=coef,
        intercept=intercept,
        generator=generator,
        seed=runtime.seed,
        passes_done=passes_done,
        validation_score=settings.validation_score,
        log=runtime.log,
    )
    outcome = runtime.runner.train(training)
    polish_plan = plan_polish(rows.problem, plan, settings, runtime.runner.trains_in_process)
    polished = None
    if polish_plan is not None:
        resident = polish_plan.rows_resident
        passes = OrderedPasses(rows.layout, rows.problem.n_train if resident else plan.buffer_size, resident)
        polished = polish_linear(outcome.coef, outcome.intercept, passes, rows.loss, polish_plan, runtime.log)
    result = outcome.result
    return BMGDFit(
        result,
        outcome.coef,
        outcome.intercept,
        plan,
        passes_done + result.n_epochs,
        start_step + result.n_steps,
        outcome.facts,
        polished,
    )


def _check_request(data, runtime, settings, continuation):
    """Combinations that cannot run: settings the runner cannot run, a warm start of another shape."""
    runtime.runner.check_settings(settings)
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
        _check_validation_weights(data.weights, validation_ranges)
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
    layout = PassLayout(sources, dtypes, runtime.device, segments, data.out_of_core, runtime.prefetch)
    return _Rows(layout, validation_ranges, problem, make_loss(settings.loss, data.n_outputs, settings.epsilon))


def _check_validation_weights(weights, validation_ranges):
    """Refuse held-out rows whose ``sample_weight`` are all zero (their validation score is undefined)."""
    if weights is None:
        return
    if not sum(float(weights[start:stop].sum()) for start, stop in validation_ranges) > 0:
        raise ValueError(
            "Every row early_stopping held out for validation has sample_weight 0, so its validation score is "
            "undefined. Give those rows weight, set another random_state or validation_fraction, or set "
            "early_stopping=False."
        )


def _plan(rows, runtime, settings, randomness):
    """Buffers, then the spectrum and throughput measured on sampled rows, then the batch."""
    rng, generator = randomness
    problem, device = rows.problem, runtime.device
    buffers = plan_buffers(problem, runtime.budget, device.type, settings.buffer_size, settings.batch_size)
    ranges = map_ranges(rows.layout.segments, sample_ranges(problem.n_train, buffers.sample_rows, rng))
    sample = read_rows(rows.layout, ranges)
    weights = sample[2] if problem.weighted else None
    raw = linear_spectrum(sample[0], weights, settings.fit_intercept, generator)
    spectrum = step_spectrum(*raw, rows.loss.curvature, settings.alpha)
    probe = None
    if buffers.probe_max_batch is not None:
        key = ("sgd", device.type, device.index, runtime.dtype, problem.n_features, problem.n_outputs)
        key += (sample[0].is_sparse, type(rows.loss))
        measured = measure_sgd_capacity(sample[0], problem.n_outputs, rows.loss, buffers.probe_max_batch, key)
        probe = ThroughputProbe(measured.batch, measured.throughputs)
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
    anneal = plateaus_to_anneal(settings.scaling_rule)
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
        stopping=plan_stopping(tol, settings.n_iter_no_change, validation, anneal=anneal),
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
    if runtime.runner.description:
        where += f", {runtime.runner.description}"
    return f"{where}, {plan.describe()}, first learning rate {run.learning_rate(run.start_step, run.batch_size):.4g}"
