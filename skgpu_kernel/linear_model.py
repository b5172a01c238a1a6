"""Buffered mini-batch SGD (BMGD) linear models: thin scikit-learn shells.

fit = validate (or open an out-of-core source) -> resolve runtime (device, dtype,
memory budget, seeds, validation split) -> plan (:mod:`skgpu_kernel.planning.sgd`:
buffers, then the batch from the spectrum and the throughput measured on sampled
rows) -> run the solver (:func:`~skgpu_kernel.solvers.sgd.fit_buffered_sgd` on
prefetched buffers, or the parallel workers) -> store numpy fitted attributes.
"""

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, _fit_context, clone
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._tags import TransformerTags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ._validation import check_representable, check_sample_weight, class_weighted, output_dtype
from ._warnings import warn_user
from .blockwise import PREDICT_ROWS, map_row_blocks
from .buffer import BufferPrefetcher, as_row_source, is_out_of_core, map_ranges, plan_passes
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget
from .parallel.launch import run_distributed, share_for_workers
from .parallel.strategies import AdaptiveSGD, ParallelStrategy
from .parallel.worker import TrainingJob, source_spec, train_worker
from .planning.sgd import (
    SGDProblem,
    ThroughputProbe,
    plan_bmgd,
    plan_buffers,
    sample_ranges,
    step_spectrum,
    validation_split,
)
from .scaling import SCALING_RULES, ScalingRule, resolve_scaling_rule, warn_if_warmup_fills_run
from .solvers.losses import make_loss
from .solvers.sgd import SGDResult, SGDRun, fit_buffered_sgd, linear_scores, linear_spectrum, measure_sgd_capacity

__all__ = ["BufferedSGDClassifier", "BufferedSGDRegressor"]


@dataclass(frozen=True)
class _Input:
    """The user's data, opened: the row source of X, the targets, the weights (None when all 1)."""

    source: object
    y: np.ndarray
    weights: np.ndarray | None
    # Sources not validated in memory: buffers are checked for NaN as they arrive.
    check_finite: bool
    nonzeros_per_row: float | None


@dataclass(frozen=True)
class _Targets:
    """Encoded targets: float (n, l) values or int64 class indices, and what the stored model needs."""

    values: np.ndarray
    n_outputs: int
    classes: np.ndarray | None = None
    single: bool = False


@dataclass(frozen=True)
class _Setup:
    """A fit's runtime, resolved once: device facts, row sources and split, seeds and starting point."""

    targets: _Targets
    loss: object
    device: torch.device
    dtype: torch.dtype
    budget: int
    alpha: float
    strategy: ParallelStrategy | None
    worker_devices: list | None
    sources: list
    dtypes: list
    train_segments: list
    validation_ranges: list | None
    check_finite: bool
    problem: SGDProblem
    seed: int
    passes_done: int
    rng: np.random.RandomState
    generator: torch.Generator
    warm: bool
    continuing: bool
    incremental: bool
    start_step: int
    prefetch: bool
    # The precision of the stored coefficients: float32 for float32 X, else float64.
    output_dtype: np.dtype


@dataclass(frozen=True)
class _ParallelFacts:
    """What only parallel fits report; the merge records are AdaptiveSGD's (one row per merge)."""

    n_workers: int
    communication_bytes: int
    merge_weights: np.ndarray | None = None
    worker_batch_sizes: np.ndarray | None = None


@dataclass(frozen=True)
class _Outcome:
    """What a solver run gave back; ``parallel`` only for parallel fits."""

    result: SGDResult
    coef: torch.Tensor
    intercept: torch.Tensor
    parallel: _ParallelFacts | None = None


class _RowSlices:
    """Row slicing ``X[start:stop]`` over a :class:`~skgpu_kernel.buffer.RowSource`."""

    def __init__(self, source):
        self.source = source
        self.shape = source.shape

    def __getitem__(self, rows):
        return self.source.read([(rows.start, min(rows.stop, self.source.n_rows))])


class _StreamedPasses:
    """Every pass of a fit read by one prefetcher, buffer after buffer.

    The first buffer of a pass then loads while the last buffer of the previous pass
    trains, instead of each pass starting with a wait.  Features are checked for
    NaN and infinity as buffers arrive (sources not validated in memory).
    """

    def __init__(self, prefetcher, buffers_per_pass, check_finite):
        self.prefetcher = prefetcher
        self.buffers = iter(prefetcher)
        self.buffers_per_pass = buffers_per_pass
        self.check_finite = check_finite

    def open(self, epoch):
        return _PassView(self)

    def close(self):
        self.prefetcher.close()


class _PassView:
    """The buffers of one pass out of :class:`_StreamedPasses`, with its own I/O wait."""

    def __init__(self, stream):
        self.stream = stream
        self.wait_before = stream.prefetcher.io_wait_seconds

    @property
    def io_wait_seconds(self):
        return self.stream.prefetcher.io_wait_seconds - self.wait_before

    def __enter__(self):
        return self

    def __exit__(self, error_type, *exc_info):
        if error_type is not None:
            self.stream.close()

    def __iter__(self):
        for _ in range(self.stream.buffers_per_pass):
            X, targets, *weights = next(self.stream.buffers)
            if self.stream.check_finite:
                _check_finite(X)
            yield X, targets, weights[0] if weights else None


class _ResidentPasses:
    """Passes over data that fits in one buffer, loaded once for all passes."""

    io_wait_seconds = 0.0

    def __init__(self, tensors):
        self.tensors = tensors

    def open(self, epoch):
        return self

    def close(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def __iter__(self):
        yield self.tensors


def _open_passes(setup, plan, run):
    """The passes of a single-process fit: the data resident in one buffer, or one prefetcher streaming them all."""
    segments = setup.train_segments
    if plan.resident:
        X, targets, *weights = _read(setup.sources, setup.dtypes, segments, setup.device, setup.check_finite)
        return _ResidentPasses((X, targets, weights[0] if weights else None))
    # Chunk order reshuffled per pass, continuing the passes of earlier calls.
    plans = plan_passes(segments, plan.buffer_size, setup.seed, setup.passes_done, run.n_epochs, run.shuffle)
    buffers = [buffer for plan_ in plans for buffer in plan_]
    prefetcher = BufferPrefetcher(setup.sources, buffers, setup.device, setup.dtypes, setup.prefetch)
    return _StreamedPasses(prefetcher, len(plans[0]), setup.check_finite)


def _read(sources, dtypes, ranges, device, check_finite=False):
    """The rows ``ranges`` of every source, as tensors on ``device``."""
    with BufferPrefetcher(sources, [ranges], device, dtypes, prefetch=False) as buffers:
        tensors = next(iter(buffers))
    if check_finite:
        _check_finite(tensors[0])
    return tensors


def _row_sources(data, targets, dtype):
    """Row sources of X, the targets and the weights, with the dtype each is read in."""
    sources = [data.source, as_row_source(targets.values, "y")]
    dtypes = [dtype, dtype if targets.values.dtype.kind == "f" else torch.int64]
    if data.weights is not None:
        sources.append(as_row_source(data.weights, "sample_weight"))
        dtypes.append(dtype)
    return sources, dtypes


def _check_finite(X):
    values = X.coalesce().values() if X.is_sparse else X
    if values.numel() == 0:
        return
    # Extremes propagate NaN and show infinities; on the CPU this is far faster
    # than an element-wise isfinite over the whole buffer.
    low, high = torch.aminmax(values)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        raise ValueError("Input X contains NaN or infinity.")


def _parallel_facts(outcome, strategy, n_workers):
    """What the workers reported beyond the model and its history."""
    if not isinstance(strategy, AdaptiveSGD):
        return _ParallelFacts(n_workers, int(outcome["bytes"]))
    history = outcome["history"]
    return _ParallelFacts(
        n_workers,
        int(outcome["bytes"]),
        merge_weights=np.array([record["merge_weights"] for record in history]),
        worker_batch_sizes=np.array([record["worker_batch_sizes"] for record in history]),
    )


def _starting_coefficients(setup, fitted):
    """``(coef, intercept)`` on the device: the fitted ``(coef_matrix, intercept_)`` when warm, else zeros."""
    if fitted is None:
        shape = (setup.problem.n_features, setup.problem.n_outputs)
        coef = torch.zeros(shape, dtype=setup.dtype, device=setup.device)
        return coef, torch.zeros(shape[1], dtype=setup.dtype, device=setup.device)
    coef = torch.as_tensor(fitted[0].T.copy(), dtype=setup.dtype).to(setup.device)
    return coef, torch.as_tensor(np.asarray(fitted[1], dtype=np.float64), dtype=setup.dtype).to(setup.device)


def _linear_decision(rows, coef_matrix, intercept, device, dtype):
    """Scores ``X W + b`` of ``rows`` (anything sliced by row ranges) in planned row blocks, in ``dtype``."""
    device = prediction_device(device)
    dtype = resolve_dtype(dtype)
    coef = torch.as_tensor(coef_matrix.T.copy(), dtype=dtype).to(device)
    intercept = torch.as_tensor(np.atleast_1d(intercept), dtype=dtype).to(device)
    scores = map_row_blocks(
        rows,
        lambda block: linear_scores(block, coef, intercept),
        coef_matrix.shape[0],
        PREDICT_ROWS[device.type],
        device,
        dtype,
    )
    return scores


def _describe(setup, plan, run):
    """The decisions line ``verbose`` prints before training."""
    where = f"device={setup.device}, dtype={str(setup.dtype).removeprefix('torch.')}"
    if setup.strategy is not None:
        where += f", {type(setup.strategy).__name__} on {[str(device) for device in setup.worker_devices]}"
    return f"{where}, {plan.describe()}, first learning rate {run.learning_rate(run.start_step, run.batch_size):.4g}"


def _run_single(setup, plan, run, coefficients, score, log):
    """BMGD in this process on resident or streamed passes; ``score(scores, targets)`` on the validation rows."""
    coef, intercept = coefficients
    passes = _open_passes(setup, plan, run)
    try:
        validation = None
        if score is not None:
            X_val, T_val = _read(
                setup.sources[:2], setup.dtypes[:2], setup.validation_ranges, setup.device, setup.check_finite
            )

            def validation(coef, intercept):
                return score(linear_scores(X_val, coef, intercept), T_val)

        result = fit_buffered_sgd(coef, intercept, passes.open, run, setup.generator, validation, log)
    finally:
        passes.close()
    return _Outcome(result, coef, intercept)


def _run_parallel(setup, plan, run, coefficients):
    """Train on the strategy's worker processes (or as this rank of a torchrun group)."""
    job = TrainingJob(
        run=run,
        sources=[source_spec(source.data, share_for_workers) for source in setup.sources],
        dtypes=[str(dtype).removeprefix("torch.") for dtype in setup.dtypes],
        coef=coefficients[0].cpu().numpy(),
        intercept=coefficients[1].cpu().numpy(),
        buffer_size=plan.buffer_size,
        prefetch=setup.prefetch,
        seed=setup.seed,
        first_pass=setup.passes_done,
        segments=setup.train_segments,
        strategy=setup.strategy,
    )
    devices = [str(device) for device in setup.worker_devices]
    outcome = run_distributed(train_worker, job, devices, timeout=setup.strategy.timeout)[0]
    distributed = torch.distributed.is_initialized()
    n_workers = torch.distributed.get_world_size() if distributed else len(devices)
    history = outcome["history"]
    result = SGDResult(
        n_epochs=run.n_epochs,
        n_steps=int(outcome["n_steps"]),
        batch_size=run.batch_size,
        learning_rate=float(outcome["learning_rate"]),
        io_wait_seconds=0.0,
        seconds=sum(record["seconds"] for record in history),
        history=history,
    )
    parallel = _parallel_facts(outcome, setup.strategy, n_workers)
    return _Outcome(result, torch.as_tensor(outcome["coef"]), torch.as_tensor(outcome["intercept"]), parallel)


class _BaseBufferedSGD(BaseEstimator):
    """Shared parameters, buffering and fit of the BMGD linear models."""

    _parameter_constraints: ClassVar[dict] = {
        "penalty": [StrOptions({"l2"}), None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "scaling_rule": [StrOptions(set(SCALING_RULES)), ScalingRule],
        "batch_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "buffer_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "n_rounds": [Interval(Integral, 1, None, closed="left")],
        "n_epochs": [Interval(Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "prefetch": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left"), None],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "warm_start": ["boolean"],
        "device": [str, torch.device],
        "dtype": [StrOptions({"float32", "float64"})],
        "memory_budget": [None, Interval(Integral, 1, None, closed="left"), str],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "parallel": [ParallelStrategy, None],
    }

    def __init__(
        self,
        loss,
        *,
        penalty="l2",
        alpha=1e-4,
        fit_intercept=True,
        scaling_rule="optimal",
        batch_size="auto",
        buffer_size="auto",
        n_rounds=1,
        n_epochs=10,
        shuffle=True,
        prefetch=True,
        tol=1e-3,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        warm_start=False,
        device="auto",
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
        parallel=None,
    ):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.scaling_rule = scaling_rule
        self.batch_size = batch_size
        self.buffer_size = buffer_size
        self.n_rounds = n_rounds
        self.n_epochs = n_epochs
        self.shuffle = shuffle
        self.prefetch = prefetch
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.device = device
        self.dtype = dtype
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.verbose = verbose
        self.parallel = parallel

    # --- fit: validate -> resolve runtime -> plan -> solve -> store -----------------

    def _fit(self, X, y, sample_weight, *, incremental, classes=None):
        continuing = incremental and hasattr(self, "coef_")
        data = self._open_data(X, y, sample_weight, reset=not continuing)
        try:
            setup = self._resolve_runtime(data, incremental, continuing, classes)
            # The rule is resolved on every call, so that set_params between partial_fit
            # calls takes effect; sizes and spectrum stay those of the first call.
            rule = resolve_scaling_rule(self.scaling_rule)
            plan = self._bmgd_plan if continuing else self._plan(setup)
            if not continuing:
                warn_if_warmup_fills_run(rule, plan.context)
            outcome = self._solve(setup, plan, rule)
        finally:
            data.source.close()
        self._store_fit(setup, plan, rule, outcome)
        return self

    def _open_data(self, X, y, sample_weight, reset):
        """Validate in-memory data (or open an out-of-core source) and the weights."""
        out_of_core = is_out_of_core(X)
        if out_of_core:
            source = as_row_source(X, "X")
            if len(source.shape) != 2:
                raise ValueError(f"Expected a 2-D X, got an array of shape {source.shape}.")
            self._check_n_features_out_of_core(source.shape[1], reset)
            y = check_array(y, ensure_2d=False, dtype=None, input_name="y")
            if y.shape[0] != source.n_rows:
                raise ValueError(f"X has {source.n_rows} rows but y has {y.shape[0]}.")
        else:
            X, y = validate_data(
                self,
                X,
                y,
                reset=reset,
                accept_sparse="csr",
                dtype=[np.float64, np.float32],
                multi_output=self._multi_output,
                y_numeric=not self._is_classifier,
            )
            check_representable(X, resolve_dtype(self.dtype), "X")
            if not self._is_classifier:
                check_representable(y, resolve_dtype(self.dtype), "y")
            source = as_row_source(X, "X")
        nonzeros_per_row = X.nnz / max(X.shape[0], 1) if scipy.sparse.issparse(X) else None
        weights = None
        if sample_weight is not None:
            weights = check_sample_weight(sample_weight, source.n_rows)
            if np.all(weights == 1.0):
                weights = None
        return _Input(source, y, weights, out_of_core, nonzeros_per_row)

    def _check_n_features_out_of_core(self, n_features, reset):
        if reset:
            self.n_features_in_ = n_features
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        elif n_features != self.n_features_in_:
            raise ValueError(
                f"X has {n_features} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )

    def _resolve_runtime(self, data, incremental, continuing, classes):
        """Targets, loss, device facts, parallel workers, seeds, validation split and row sources."""
        targets = self._encode_targets(data.y, incremental, classes)
        data = self._with_class_weights(data, targets, incremental)
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype)
        budget = resolve_memory_budget(self.memory_budget, device)
        strategy = worker_devices = None
        if self.parallel is not None:
            if self.early_stopping:
                raise ValueError(
                    "early_stopping needs one validation split seen by one process; it is not available with "
                    "parallel=. Set early_stopping=False (tol does not apply to parallel fits either)."
                )
            strategy = clone(self.parallel)
            worker_devices = strategy.resolve_devices(device)
        n_rows, n_features = data.source.shape
        warm = continuing or (self.warm_start and hasattr(self, "coef_"))
        if warm and self._coef_matrix().shape != (targets.n_outputs, n_features):
            raise ValueError(
                f"warm_start continues from coefficients of shape {self._coef_matrix().shape}, but the data "
                f"needs {(targets.n_outputs, n_features)}. Set warm_start=False to fit new data."
            )
        seed = self._seed if warm else int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        passes_done = self._passes_done if warm else 0
        rng = np.random.RandomState([seed, passes_done, 0])
        generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
        train_segments, validation_ranges = [(0, n_rows)], None
        if self.early_stopping and not incremental:
            train_segments, validation_ranges = validation_split(n_rows, self.validation_fraction, rng)
        sources, dtypes = _row_sources(data, targets, dtype)
        problem = SGDProblem(
            n_train=sum(stop - start for start, stop in train_segments),
            n_features=n_features,
            n_outputs=targets.n_outputs,
            itemsize=torch.finfo(dtype).bits // 8,
            nonzeros_per_row=data.nonzeros_per_row,
            weighted=data.weights is not None,
        )
        return _Setup(
            targets=targets,
            loss=make_loss(self.loss, targets.n_outputs, getattr(self, "epsilon", 0.1)),
            device=device,
            dtype=dtype,
            budget=budget,
            alpha=float(self.alpha) if self.penalty == "l2" else 0.0,
            strategy=strategy,
            worker_devices=worker_devices,
            sources=sources,
            dtypes=dtypes,
            train_segments=train_segments,
            validation_ranges=validation_ranges,
            check_finite=data.check_finite,
            problem=problem,
            seed=seed,
            passes_done=passes_done,
            rng=rng,
            generator=generator,
            warm=warm,
            continuing=continuing,
            incremental=incremental,
            start_step=self.t_ if continuing else 0,
            prefetch=self.prefetch,
            output_dtype=output_dtype(data.source.dtype),
        )

    def _plan(self, setup):
        """Buffers, then the spectrum and throughput measured on sampled rows, then the batch."""
        problem, device = setup.problem, setup.device
        buffers = plan_buffers(problem, setup.budget, device.type, self.buffer_size, self.batch_size)
        ranges = map_ranges(setup.train_segments, sample_ranges(problem.n_train, setup.rng))
        sample = _read(setup.sources, setup.dtypes, ranges, device, setup.check_finite)
        raw = linear_spectrum(sample[0], sample[2] if problem.weighted else None, self.fit_intercept, setup.generator)
        spectrum = step_spectrum(*raw, setup.loss.curvature, setup.alpha)
        probe = None
        if buffers.probe_max_batch is not None:
            key = ("sgd", device.type, device.index, setup.dtype, problem.n_features, problem.n_outputs)
            key += (sample[0].is_sparse, type(setup.loss))
            capacity = measure_sgd_capacity(sample[0], problem.n_outputs, setup.loss, buffers.probe_max_batch, key)
            probe = ThroughputProbe(*capacity)
        plan = plan_bmgd(
            buffers, spectrum, probe, batch_size=self.batch_size, n_rounds=self.n_rounds, n_epochs=self.n_epochs
        )
        for message in plan.warnings:
            warn_user(message, UserWarning)
        return plan

    def _solve(self, setup, plan, rule):
        """Run the plan: in this process, or on the parallel strategy's workers."""
        run = SGDRun(
            loss=setup.loss,
            rule=rule,
            context=plan.context,
            n_rounds=self.n_rounds,
            n_epochs=1 if setup.incremental else self.n_epochs,
            alpha=setup.alpha,
            fit_intercept=self.fit_intercept,
            shuffle=self.shuffle,
            start_step=setup.start_step,
            tol=None if setup.incremental else self.tol,
            n_iter_no_change=self.n_iter_no_change,
        )
        coefficients = _starting_coefficients(setup, (self._coef_matrix(), self.intercept_) if setup.warm else None)
        if self.verbose:
            print(f"[{type(self).__name__}] {_describe(setup, plan, run)}")
        if setup.strategy is not None:
            return _run_parallel(setup, plan, run, coefficients)
        score = None if setup.validation_ranges is None else self._validation_score
        return _run_single(setup, plan, run, coefficients, score, print if self.verbose else None)

    def _store_fit(self, setup, plan, rule, outcome):
        """Every fitted attribute of a fit or partial_fit call, in one place."""
        result = outcome.result
        self.device_ = str(setup.device)
        self.dtype_ = np.dtype(self.dtype)
        self.memory_budget_ = setup.budget
        self.scaling_rule_ = rule
        self._bmgd_plan = plan
        self.batch_size_ = result.batch_size
        self.buffer_size_ = plan.buffer_size
        self.critical_batch_size_ = plan.critical_batch_size
        self.spectrum_ = plan.spectrum
        self.throughput_probe_ = {} if plan.probe is None else plan.probe.throughputs
        self.batch_capacity_ = None if plan.probe is None else plan.probe.largest_batch
        self._seed = setup.seed
        self._passes_done = setup.passes_done + result.n_epochs
        self.n_iter_ = result.n_epochs
        self.t_ = setup.start_step + result.n_steps
        self.learning_rate_ = result.learning_rate
        self.io_wait_fraction_ = result.io_wait_seconds / max(result.seconds, 1e-12)
        self.history_ = [*self.history_, *result.history] if setup.continuing else result.history
        self.parallel_ = setup.strategy
        if outcome.parallel is not None:
            self.n_workers_ = outcome.parallel.n_workers
            self.communication_bytes_ = outcome.parallel.communication_bytes
            if outcome.parallel.merge_weights is not None:
                self.merge_weights_ = outcome.parallel.merge_weights
                self.worker_batch_sizes_ = outcome.parallel.worker_batch_sizes
        if setup.targets.classes is not None:
            self.classes_ = setup.targets.classes
        self._single_target = setup.targets.single
        # Computed in dtype, stored in the input's precision as scikit-learn's linear models do.
        coef = outcome.coef.T.cpu().numpy().astype(setup.output_dtype, copy=False)
        self.coef_ = coef[0] if setup.targets.single else coef
        self.intercept_ = outcome.intercept.cpu().numpy().astype(setup.output_dtype, copy=False)

    # --- prediction -----------------------------------------------------------------

    def _decision(self, X):
        check_is_fitted(self)
        if is_out_of_core(X):
            source = as_row_source(X, "X")
            self._check_n_features_out_of_core(source.shape[1], reset=False)
            rows = _RowSlices(source)
        else:
            source = None
            rows = validate_data(self, X, reset=False, accept_sparse="csr", dtype=[np.float64, np.float32])
        # Computed in dtype_, returned as scikit-learn's linear models do: float32 when both X
        # and the coefficients are (a float32 fit), float64 otherwise.
        out = np.promote_types(output_dtype((rows if source is None else source).dtype), self.coef_.dtype)
        try:
            return _linear_decision(rows, self._coef_matrix(), self.intercept_, self.device, self.dtype_).astype(out)
        finally:
            if source is not None:
                source.close()

    def _with_class_weights(self, data, targets, incremental):
        """``data`` with its weights multiplied by the class weights (the classifier's ``class_weight``)."""
        return data

    def _coef_matrix(self):
        return np.atleast_2d(self.coef_)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        # float32 in, float32 out.  scikit-learn reads this tag of transformers only, so
        # check_estimator does not exercise it here: tests/test_dtype.py does.
        tags.transformer_tags = TransformerTags(preserves_dtype=["float64", "float32"])
        return tags


_COMMON_PARAMETERS = """
    penalty : {"l2"} or None, default="l2"
        Adds ``alpha / 2 ||W||^2`` to the mean loss, which makes the square and Huber
        losses strongly convex (the Polyak-Lojasiewicz condition BMGD's analysis uses).
    alpha : float, default=1e-4
        Strength of the penalty.
    fit_intercept : bool, default=True
        Learn an unpenalised intercept.
    scaling_rule : {"optimal", "eigenpro", "constant", "linear", "sqrt", "legw"} or ScalingRule, \
default="optimal"
        Supplies the learning rate of each update from the batch size and the
        position in the schedule; see :mod:`skgpu_kernel.scaling`.  The default needs
        no tuning: EigenPro's analytic rule in its optimal form
        ``m / (beta + (m - 1) lambda_1)``, where ``beta`` bounds one sample's
        curvature and ``lambda_1`` is the top eigenvalue of the data's second-moment
        matrix (scaled by the loss's curvature bound, shifted by ``alpha``, estimated
        on up to 8192 sampled rows): linear in ``m`` below the critical batch
        ``m* = beta / lambda_1``, saturating at ``1 / lambda_1`` beyond.  A rule
        object is cloned, never modified; tune it with ``scaling_rule__base_lr`` in a
        grid search.
    batch_size : int or "auto", default="auto"
        Mini-batch ``m``.  ``"auto"`` measures the device's throughput-saturating
        batch ``m_G`` for this step and takes ``min(m_G, max(m*, n / 64))``: beyond
        the critical batch a larger batch gains throughput but nothing per sample, so
        it is used while a pass keeps at least 64 steps.  Larger than a buffer:
        clamped with a warning.
    buffer_size : int or "auto", default="auto"
        Rows per buffer ``n``.  ``"auto"`` fits two buffers (the one training and the
        one loading) in the memory budget; data that fits entirely is loaded once and
        stays resident.  Larger than the data: clamped with a warning.
    n_rounds : int, default=1
        Rounds ``R`` of mini-batch passes over each buffer before the next one.  R > 1
        reuses loaded data when reading is the bottleneck, at the price of a bias of
        order of the step size that vanishes with a decaying step.
    n_epochs : int, default=10
        Passes over the data by ``fit``, and the horizon of decaying schedules.
    shuffle : bool, default=True
        Shuffle the order of row chunks each pass and the rows of a buffer each round.
    prefetch : bool, default=True
        Load the next buffer in a background thread (on a CUDA side stream from pinned
        memory) while the current one trains.  False loads buffers on demand.
    tol : float or None, default=1e-3
        Stop when the training loss (or the validation score with early stopping) has
        not improved by more than ``tol`` for ``n_iter_no_change`` passes, the rule
        of every estimator of the package.  None disables.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows (random blocks of rows, so that
        reads stay sequential) and keep the coefficients of the best validation score.
    validation_fraction : float in (0, 1), default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
        ``fit`` starts from the previous coefficients (its schedule restarts).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
    dtype : {"float32", "float64"}, default="float32"
        Training and prediction precision.  Results follow the input as in
        scikit-learn's linear models: ``coef_`` and ``intercept_`` are float32 when
        ``X`` is float32 and float64 otherwise, and so are the scores of
        ``predict``, ``decision_function`` and ``predict_proba`` (float64 when
        either ``X`` or the coefficients are float64).
    memory_budget : None, int or str, default=None
        Bytes (or e.g. ``"4GB"``) for the buffers on the device.  None takes 80% of
        free CUDA memory or 50% of the host's available memory.
    random_state : int, RandomState instance or None, default=None
        Seeds the chunk order, the shuffles, the sampled rows and the validation
        split.  Results are reproducible for a fixed integer, whatever the data
        source (array, memmap or ``.npy`` file).
    verbose : int, default=0
        Print the decisions taken and one line per pass with samples per second and
        I/O wait.
    parallel : DataParallel, Parle, AdaptiveSGD or None, default=None
        Train with several workers (torch.distributed processes: gloo on CPUs, NCCL
        between GPUs); see :mod:`skgpu_kernel.parallel`.  None trains in this
        process.  Inside an initialised process group (``torchrun``) the fit joins
        it instead of spawning, each rank reading its own shard.  Early stopping
        and ``tol`` apply to single-worker fits only.
"""

_COMMON_ATTRIBUTES = """
    n_iter_ : int
        Passes run by the last call to ``fit`` (1 for ``partial_fit``).
    t_ : int
        Updates taken; ``partial_fit`` continues the schedule from here.
    batch_size_ : int
        Mini-batch of the last update: the planned one, halved once per
        out-of-memory error of the device.
    buffer_size_ : int
    learning_rate_ : float
        Learning rate of the last update.
    io_wait_fraction_ : float
        Fraction of the last call's time spent waiting for data.
    history_ : list of dict
        One record per pass (per merge for AdaptiveSGD) with the keys the records of
        every estimator of the package share: ``epoch``, ``n_steps`` (updates so
        far), ``train_loss`` (mean loss over the pass, each batch measured before
        its step, plus the penalty ``alpha / 2 ||W||^2`` of the coefficients at the
        end of the pass, with and without ``parallel=``), ``learning_rate`` (of the
        pass's last update), ``validation_score`` (None without early stopping) and
        ``seconds``.  Then the loop's own: ``io_wait_seconds`` and
        ``samples_per_second`` in one process, ``samples_per_second`` and
        ``bytes_all_reduced`` for DataParallel and Parle, the merge's weights and
        per-worker figures for AdaptiveSGD.
    scaling_rule_ : ScalingRule
        The resolved rule.
    spectrum_ : tuple of float
        ``(beta, lambda_1)`` the step rule saw.
    critical_batch_size_ : float
        ``beta / lambda_1``.
    batch_capacity_ : int or None
        Largest probed batch when ``batch_size="auto"``.
    throughput_probe_ : dict
        Samples per second of one SGD step by probed batch size.
    device_ : str
    dtype_ : numpy.dtype
    memory_budget_ : int
    parallel_ : ParallelStrategy or None
        The strategy used (a copy).  Parallel fits also set ``n_workers_``,
        ``communication_bytes_`` (bytes all-reduced by each worker) and, for
        :class:`~skgpu_kernel.parallel.AdaptiveSGD`, ``merge_weights_`` and
        ``worker_batch_sizes_`` (one row per merge, one column per worker); their
        ``history_`` has one record per merge with each worker's samples per second.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape ``(n_features_in_,)``
        Defined when ``X`` has string feature names.
"""

_DATA_SOURCES = """
        Training data: an array, a scipy CSR matrix, an ``np.memmap``, the path of
        a ``.npy`` file (opened read-only with ``mmap_mode="r"``) or an h5py/zarr
        style dataset with ``shape`` and row slicing.  Sources other than arrays are
        read in buffers and never loaded whole."""


class BufferedSGDRegressor(RegressorMixin, _BaseBufferedSGD):
    __doc__ = (
        """Linear regression by buffered mini-batch SGD (BMGD), for data larger than the device.

    Buffers of rows are loaded from memory or disk onto the device while the previous
    buffer trains for ``n_rounds`` rounds of mini-batch steps; the learning rate
    comes from a scaling rule, so that changing the batch size needs no re-tuning.

    Parameters
    ----------
    loss : {"squared_error", "huber"}, default="squared_error"
        ``(y - p)^2 / 2`` or the Huber loss, linear beyond ``epsilon``.
    epsilon : float, default=0.1
        Huber threshold.
"""
        + _COMMON_PARAMETERS
        + """
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : ndarray of shape (1,) or (n_targets,)
"""
        + _COMMON_ATTRIBUTES
        + """
    See Also
    --------
    BufferedSGDClassifier : The classifier.
    sklearn.linear_model.SGDRegressor : Per-sample SGD on the CPU.

    References
    ----------
    Qi, Huang, Zhu, Huang, Wang, "Mini-batch gradient descent with buffer",
    arXiv:2312.08728.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel import BufferedSGDRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(2000, 5)
    >>> y = X @ np.arange(1.0, 6.0) + 0.5
    >>> model = BufferedSGDRegressor(n_epochs=20, alpha=0.0, random_state=0).fit(X, y)
    >>> np.round(model.coef_, 2)
    array([1., 2., 3., 4., 5.]...)
"""
    )

    _parameter_constraints: ClassVar[dict] = {
        **_BaseBufferedSGD._parameter_constraints,
        "loss": [StrOptions({"squared_error", "huber"})],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
    }
    _multi_output = True
    _is_classifier = False

    def __init__(
        self,
        loss="squared_error",
        *,
        epsilon=0.1,
        penalty="l2",
        alpha=1e-4,
        fit_intercept=True,
        scaling_rule="optimal",
        batch_size="auto",
        buffer_size="auto",
        n_rounds=1,
        n_epochs=10,
        shuffle=True,
        prefetch=True,
        tol=1e-3,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        warm_start=False,
        device="auto",
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
        parallel=None,
    ):
        super().__init__(
            loss,
            penalty=penalty,
            alpha=alpha,
            fit_intercept=fit_intercept,
            scaling_rule=scaling_rule,
            batch_size=batch_size,
            buffer_size=buffer_size,
            n_rounds=n_rounds,
            n_epochs=n_epochs,
            shuffle=shuffle,
            prefetch=prefetch,
            tol=tol,
            early_stopping=early_stopping,
            validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change,
            warm_start=warm_start,
            device=device,
            dtype=dtype,
            memory_budget=memory_budget,
            random_state=random_state,
            verbose=verbose,
            parallel=parallel,
        )
        self.epsilon = epsilon

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit by ``n_epochs`` passes of buffered mini-batch SGD.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)"""
        return self._fit(X, y, sample_weight, incremental=False)

    fit.__doc__ += (
        _DATA_SOURCES
        + """
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None
            Multiplies each sample's loss.

        Returns
        -------
        self : BufferedSGDRegressor
        """
    )

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """One pass over ``X`` that continues the learning-rate schedule of earlier calls.

        The first call resolves the batch size, buffer size and spectrum; later calls
        keep them, and one epoch of the schedule is the number of updates of the
        first call.  Early stopping and ``tol`` do not apply.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : BufferedSGDRegressor
        """
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X):
        """Predict targets.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_targets)
        """
        scores = self._decision(X)
        return scores[:, 0] if self._single_target else scores

    def _encode_targets(self, y, incremental, classes):
        y = np.asarray(y, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise ValueError("Input y contains NaN or infinity.")
        if y.ndim > 2:
            raise ValueError(f"y must be 1-D or 2-D, got shape {y.shape}.")
        single = y.ndim == 1
        if incremental and hasattr(self, "coef_") and single != self._single_target:
            raise ValueError("partial_fit got y with a different number of targets than before.")
        targets = y.reshape(y.shape[0], -1)
        return _Targets(targets, targets.shape[1], single=single)

    @staticmethod
    def _validation_score(scores, targets):
        residual = ((scores - targets) ** 2).sum()
        total = ((targets - targets.mean(dim=0)) ** 2).sum()
        return float(1.0 - residual / total) if float(total) > 0 else -float(residual)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


class BufferedSGDClassifier(ClassifierMixin, _BaseBufferedSGD):
    __doc__ = (
        """Linear classification by buffered mini-batch SGD (BMGD), for data larger than the device.

    Multinomial logistic regression (``"log_loss"``, with :meth:`predict_proba`) or a
    one-vs-rest linear SVM (``"hinge"``), trained as :class:`BufferedSGDRegressor` is:
    buffers load while the previous one trains, and a scaling rule supplies the
    learning rate.

    Parameters
    ----------
    loss : {"log_loss", "hinge"}, default="log_loss"
        Two classes use one score column (sigmoid or a single hinge).
"""
        + _COMMON_PARAMETERS
        + """    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (scikit-learn's
        semantics): a dict ``{label: weight}`` (classes not in it weigh 1), or
        ``"balanced"``, which weighs class ``c`` by ``n / (n_classes * n_c)`` with
        ``n_c`` its number of training samples (their total ``sample_weight`` when
        given).  ``fit`` reads ``y`` whole into memory whatever the source of ``X``
        (array, memmap, ``.npy`` file or dataset), so ``"balanced"`` counts every
        label; ``partial_fit`` refuses it, as scikit-learn's ``SGDClassifier``
        does: pass the weights as a dict instead.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) for two classes, else (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
"""
        + _COMMON_ATTRIBUTES
        + """
    See Also
    --------
    BufferedSGDRegressor : The regressor.
    sklearn.linear_model.SGDClassifier : Per-sample SGD on the CPU (one-vs-rest).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from skgpu_kernel import BufferedSGDClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), BufferedSGDClassifier(random_state=0))
    >>> model.fit(X[:1500], y[:1500]).score(X[1500:], y[1500:]) > 0.85
    True
"""
    )

    _parameter_constraints: ClassVar[dict] = {
        **_BaseBufferedSGD._parameter_constraints,
        "loss": [StrOptions({"log_loss", "hinge"})],
        "class_weight": [StrOptions({"balanced"}), dict, None],
    }
    _multi_output = False
    _is_classifier = True

    def __init__(
        self,
        loss="log_loss",
        *,
        penalty="l2",
        alpha=1e-4,
        fit_intercept=True,
        scaling_rule="optimal",
        batch_size="auto",
        buffer_size="auto",
        n_rounds=1,
        n_epochs=10,
        shuffle=True,
        prefetch=True,
        tol=1e-3,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        warm_start=False,
        device="auto",
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
        parallel=None,
        class_weight=None,
    ):
        super().__init__(
            loss,
            penalty=penalty,
            alpha=alpha,
            fit_intercept=fit_intercept,
            scaling_rule=scaling_rule,
            batch_size=batch_size,
            buffer_size=buffer_size,
            n_rounds=n_rounds,
            n_epochs=n_epochs,
            shuffle=shuffle,
            prefetch=prefetch,
            tol=tol,
            early_stopping=early_stopping,
            validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change,
            warm_start=warm_start,
            device=device,
            dtype=dtype,
            memory_budget=memory_budget,
            random_state=random_state,
            verbose=verbose,
            parallel=parallel,
        )
        self.class_weight = class_weight

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit by ``n_epochs`` passes of buffered mini-batch SGD.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)"""
        return self._fit(X, y, sample_weight, incremental=False)

    fit.__doc__ += (
        _DATA_SOURCES
        + """
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Multiplies each sample's loss, and is multiplied by the weights of
            ``class_weight``.

        Returns
        -------
        self : BufferedSGDClassifier
        """
    )

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One pass over ``X`` that continues the learning-rate schedule of earlier calls.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            Every class of the problem; required on the first call, as in
            scikit-learn, and must match ``classes_`` afterwards.
        sample_weight : array-like of shape (n_samples,), default=None
            Multiplied by the weights of a dict ``class_weight`` (``"balanced"``
            is refused: one call sees only part of the labels).

        Returns
        -------
        self : BufferedSGDClassifier
        """
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    def _encode_targets(self, y, incremental, classes):
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D for {type(self).__name__}, got shape {y.shape}.")
        check_classification_targets(y)
        if incremental:
            if hasattr(self, "classes_"):
                if classes is not None and not np.array_equal(np.unique(classes), self.classes_):
                    raise ValueError(f"classes={classes!r} is not the same as on the first call ({self.classes_!r}).")
                known = self.classes_
            elif classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            else:
                known = np.unique(classes)
        else:
            known = np.unique(y)
        unknown = np.setdiff1d(np.unique(y), known)
        if unknown.size:
            raise ValueError(f"y contains labels not in classes: {unknown!r}.")
        if known.shape[0] < 2:
            raise ValueError(f"The number of classes has to be greater than one; got {known.shape[0]} class.")
        labels = np.searchsorted(known, y).astype(np.int64)
        return _Targets(labels, 1 if known.shape[0] == 2 else known.shape[0], classes=known)

    def _with_class_weights(self, data, targets, incremental):
        if self.class_weight is None:
            return data
        if incremental and self.class_weight == "balanced":
            # As scikit-learn's SGDClassifier: one call sees only part of the labels.
            raise ValueError(
                "class_weight='balanced' is not supported by partial_fit, whose calls each see part of the labels. "
                "Compute the weights once with sklearn.utils.class_weight.compute_class_weight('balanced', "
                "classes=classes, y=y) on all the labels (or a large sample of them) and pass them as a dict "
                "class_weight."
            )
        weights = class_weighted(data.weights, self.class_weight, targets.classes, targets.values)
        return dataclasses.replace(data, weights=None if np.all(weights == 1.0) else weights)

    @staticmethod
    def _validation_score(scores, labels):
        predicted = (scores[:, 0] > 0).long() if scores.shape[1] == 1 else scores.argmax(dim=1)
        return float((predicted == labels).double().mean())

    def decision_function(self, X):
        """Scores: shape (n_samples,) for two classes (positive means ``classes_[1]``), else per class.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        scores = self._decision(X)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        scores = self.decision_function(X)
        indices = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[indices]

    def _has_log_loss(self):
        return self.loss == "log_loss"

    @available_if(_has_log_loss)
    def predict_proba(self, X):
        """Class probabilities (sigmoid or softmax of the scores); ``loss="log_loss"`` only.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        scores = torch.as_tensor(self._decision(X))
        if scores.shape[1] == 1:
            positive = torch.sigmoid(scores[:, 0])
            return torch.stack([1.0 - positive, positive], dim=1).numpy()
        return torch.softmax(scores, dim=1).numpy()

    @available_if(_has_log_loss)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like, sparse matrix, memmap, path or dataset of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        scores = torch.as_tensor(self._decision(X))
        if scores.shape[1] == 1:
            logit = scores[:, 0]
            return torch.stack([F.logsigmoid(-logit), F.logsigmoid(logit)], dim=1).numpy()
        return torch.log_softmax(scores, dim=1).numpy()
