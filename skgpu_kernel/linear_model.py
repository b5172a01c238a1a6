"""Buffered mini-batch SGD (BMGD) linear models: thin scikit-learn shells.

fit = validate (or open an out-of-core source) -> resolve runtime (device, dtype,
memory budget) -> plan buffers -> sample rows for the spectrum and the batch
capacity -> resolve the scaling rule -> run the solver on prefetched buffers ->
store numpy fitted attributes.
"""

import dataclasses
import math
import warnings
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, _fit_context, clone
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ._validation import check_sample_weight
from .blockwise import PREDICT_ROWS, map_row_blocks
from .buffer import (
    BufferPrefetcher,
    as_row_source,
    default_chunk_size,
    is_out_of_core,
    map_ranges,
    plan_pass,
    plan_passes,
)
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget, rows_within_budget
from .parallel.launch import run_distributed, share_for_workers
from .parallel.strategies import AdaptiveSGD, ParallelStrategy
from .parallel.worker import TrainingJob, source_spec, train_worker
from .scaling import SCALING_RULES, ScalingRule, ScheduleContext, resolve_scaling_rule, warn_if_warmup_fills_run
from .solvers.losses import make_loss
from .solvers.sgd import SGDResult, fit_buffered_sgd, linear_scores, linear_spectrum, measure_sgd_capacity

__all__ = ["BufferedSGDClassifier", "BufferedSGDRegressor"]

# Rows read to estimate the spectrum and to probe the device's batch capacity.
_SAMPLE_ROWS = 8192
# Batches above the critical batch are used for throughput only while a pass keeps at
# least this many steps, so that each pass still makes optimisation progress.
_MIN_STEPS_PER_PASS = 64
# On the CPU, buffers beyond a few tens of MB only add cache and TLB misses to the
# random gathers of mini-batches: a pass over 5M x 100 float32 rows took 2.2 s with
# the data resident as one buffer and 0.6 s in buffers of 26 MB.
_CPU_BUFFER_BYTES = 64 * 2**20


class _RowSlices:
    """Row slicing ``X[start:stop]`` over a :class:`~skgpu_kernel.buffer.RowSource`."""

    def __init__(self, source):
        self.source = source
        self.shape = source.shape

    def __getitem__(self, rows):
        return self.source.read([(rows.start, min(rows.stop, self.source.n_rows))])


def _complement(ranges, n_rows):
    """Sorted ranges of the rows of ``range(n_rows)`` not in ``ranges``."""
    kept, position = [], 0
    for start, stop in sorted(ranges):
        if start > position:
            kept.append((position, start))
        position = max(position, stop)
    if position < n_rows:
        kept.append((position, n_rows))
    return kept


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


class _ResidentPass:
    """A pass over data that fits in one buffer, loaded once for all passes."""

    io_wait_seconds = 0.0

    def __init__(self, tensors):
        self.tensors = tensors

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def __iter__(self):
        yield self.tensors


def _check_finite(X):
    values = X.coalesce().values() if X.is_sparse else X
    if values.numel() == 0:
        return
    # Extremes propagate NaN and show infinities; on the CPU this is far faster
    # than an element-wise isfinite over the whole buffer.
    low, high = torch.aminmax(values)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        raise ValueError("Input X contains NaN or infinity.")


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

    # --- input ----------------------------------------------------------------------

    def _open_data(self, X, y, sample_weight, reset):
        """Row sources for X, the targets and the weights, plus the encoded target info."""
        if is_out_of_core(X):
            source = as_row_source(X, "X")
            if len(source.shape) != 2:
                raise ValueError(f"Expected a 2-D X, got an array of shape {source.shape}.")
            self._check_n_features_out_of_core(source.shape[1], reset)
            y = check_array(y, ensure_2d=False, dtype=None, input_name="y")
            if y.shape[0] != source.n_rows:
                raise ValueError(f"X has {source.n_rows} rows but y has {y.shape[0]}.")
            check_finite = True
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
            source = as_row_source(X, "X")
            check_finite = False
        nonzeros_per_row = X.nnz / max(X.shape[0], 1) if scipy.sparse.issparse(X) else None
        n_rows = source.n_rows
        weights = None
        if sample_weight is not None:
            weights = check_sample_weight(sample_weight, n_rows)
            if np.all(weights == 1.0):
                weights = None
        return source, y, weights, check_finite, nonzeros_per_row

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

    # --- fitting --------------------------------------------------------------------

    def _fit(self, X, y, sample_weight, *, incremental, classes=None):
        continuing = incremental and hasattr(self, "coef_")
        source, y, weights, check_finite, nonzeros_per_row = self._open_data(X, y, sample_weight, reset=not continuing)
        try:
            return self._fit_source(
                source, nonzeros_per_row, y, weights, check_finite, incremental, continuing, classes
            )
        finally:
            source.close()

    def _fit_source(self, source, nonzeros_per_row, y, weights, check_finite, incremental, continuing, classes):
        targets, n_outputs = self._encode_targets(y, incremental, classes)
        loss = make_loss(self.loss, n_outputs, getattr(self, "epsilon", 0.1))
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype)
        budget = resolve_memory_budget(self.memory_budget, device)
        alpha = float(self.alpha) if self.penalty == "l2" else 0.0
        strategy = worker_devices = None
        if self.parallel is not None:
            if self.early_stopping:
                raise ValueError(
                    "early_stopping needs one validation split seen by one process; it is not available with "
                    "parallel=. Set early_stopping=False (tol does not apply to parallel fits either)."
                )
            strategy = clone(self.parallel)
            worker_devices = strategy.resolve_devices(device)
        n_rows, n_features = source.shape
        warm = continuing or (self.warm_start and hasattr(self, "coef_"))
        if warm and self._coef_matrix().shape != (n_outputs, n_features):
            raise ValueError(
                f"warm_start continues from coefficients of shape {self._coef_matrix().shape}, but the data "
                f"needs {(n_outputs, n_features)}. Set warm_start=False to fit new data."
            )
        if not warm:
            self._seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
            self._passes_done = 0
        rng = np.random.RandomState([self._seed, self._passes_done, 0])
        generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))

        train_segments, validation_ranges = [(0, n_rows)], None
        if self.early_stopping and not incremental:
            train_segments, validation_ranges = self._split_validation(n_rows, rng)
        n_train = sum(stop - start for start, stop in train_segments)
        sources = [source, as_row_source(targets, "y")]
        dtypes = [dtype, dtype if targets.dtype.kind == "f" else torch.int64]
        if weights is not None:
            sources.append(as_row_source(weights, "sample_weight"))
            dtypes.append(dtype)

        # The rule is resolved on every call, so that set_params between partial_fit
        # calls takes effect; sizes and spectrum stay those of the first call.
        rule = resolve_scaling_rule(self.scaling_rule)
        if continuing:
            buffer_size, batch_size, context = self.buffer_size_, self.batch_size_, self._schedule_context
        else:
            buffer_size = self._resolve_buffer_size(
                source, nonzeros_per_row, n_train, n_outputs, weights is not None, device, dtype, budget
            )
            sample = self._read(sources, dtypes, map_ranges(train_segments, self._sample_plan(n_train, rng)), device)
            if check_finite:
                _check_finite(sample[0])
            beta, top = linear_spectrum(
                sample[0], sample[2] if weights is not None else None, self.fit_intercept, generator
            )
            beta, top = loss.curvature * beta + alpha, loss.curvature * top + alpha
            critical = beta / top if top > 0 else math.inf
            batch_size, self.throughput_probe_ = self._resolve_batch_size(
                sample[0], n_outputs, loss, n_train, buffer_size, critical, device, dtype
            )
            self.batch_capacity_ = max(self.throughput_probe_, default=batch_size) if self.throughput_probe_ else None
            self.critical_batch_size_ = critical
            self.spectrum_ = (beta, top)
            context = ScheduleContext(
                batch_size=batch_size,
                steps_per_epoch=self.n_rounds * math.ceil(n_train / batch_size),
                n_epochs=self.n_epochs,
                beta=beta,
                top_eigenvalue=top,
            )

        if not continuing:
            warn_if_warmup_fills_run(rule, context)

        def learning_rate(step, size):
            return rule(step, context if size == batch_size else dataclasses.replace(context, batch_size=size))

        n_passes = 1 if incremental else self.n_epochs
        if warm:
            coef = torch.as_tensor(self._coef_matrix().T.copy(), dtype=dtype).to(device)
            intercept = torch.as_tensor(np.asarray(self.intercept_, dtype=np.float64), dtype=dtype).to(device)
        else:
            coef = torch.zeros(n_features, n_outputs, dtype=dtype, device=device)
            intercept = torch.zeros(n_outputs, dtype=dtype, device=device)
        start_step = self.t_ if continuing else 0
        if self.parallel is not None:
            job = TrainingJob(
                sources=[source_spec(source_.data, share_for_workers) for source_ in sources],
                dtypes=[str(dtype_).removeprefix("torch.") for dtype_ in dtypes],
                loss=(self.loss, n_outputs, getattr(self, "epsilon", 0.1)),
                coef=coef.cpu().numpy(),
                intercept=intercept.cpu().numpy(),
                rule=rule,
                context=context,
                batch_size=batch_size,
                buffer_size=buffer_size,
                n_rounds=self.n_rounds,
                n_epochs=n_passes,
                shuffle=self.shuffle,
                prefetch=self.prefetch,
                alpha=alpha,
                fit_intercept=self.fit_intercept,
                seed=self._seed,
                first_pass=self._passes_done,
                start_step=start_step,
                segments=train_segments,
                strategy=strategy,
                dtype=self.dtype,
            )
            if self.verbose:
                print(
                    f"[{type(self).__name__}] {type(strategy).__name__} on {[str(d) for d in worker_devices]}, "
                    f"n={n_train}, batch {batch_size}, first learning rate {learning_rate(start_step, batch_size):.4g}"
                )
            result, coef, intercept = self._run_parallel(job, worker_devices, strategy)
        else:
            result = self._run_single(
                loss,
                coef,
                intercept,
                sources,
                dtypes,
                device,
                train_segments,
                validation_ranges,
                n_train,
                buffer_size,
                batch_size,
                n_passes,
                check_finite,
                learning_rate,
                alpha,
                generator,
                start_step,
                incremental,
                context,
            )

        self.device_ = str(device)
        self.dtype_ = np.dtype(self.dtype)
        self.memory_budget_ = budget
        self.scaling_rule_ = rule
        self.batch_size_ = batch_size
        self.buffer_size_ = buffer_size
        self._schedule_context = context
        self._passes_done += result.n_epochs
        self.n_iter_ = result.n_epochs
        self.t_ = start_step + result.n_steps
        self.learning_rate_ = result.learning_rate
        self.io_wait_fraction_ = result.io_wait_seconds / max(result.seconds, 1e-12)
        self.history_ = [*self.history_, *result.history] if continuing else result.history
        self.parallel_ = None if self.parallel is None else strategy
        self._store_coef(coef.T.cpu().numpy(), intercept.cpu().numpy())
        return self

    def _run_single(
        self,
        loss,
        coef,
        intercept,
        sources,
        dtypes,
        device,
        train_segments,
        validation_ranges,
        n_train,
        buffer_size,
        batch_size,
        n_passes,
        check_finite,
        learning_rate,
        alpha,
        generator,
        start_step,
        incremental,
        context,
    ):
        """BMGD in this process: resident data or one prefetcher streaming every pass."""
        if buffer_size >= n_train:
            resident = self._read(sources, dtypes, train_segments, device)
            if check_finite:
                _check_finite(resident[0])
            resident_pass = _ResidentPass((*resident[:2], resident[2] if len(resident) > 2 else None))
            stream = None
        else:
            stream = self._stream(sources, dtypes, device, train_segments, buffer_size, n_passes, check_finite)

        def open_pass(epoch):
            return resident_pass if stream is None else stream.open(epoch)

        validation = None
        if validation_ranges is not None:
            X_val, T_val = self._read(sources[:2], dtypes[:2], validation_ranges, device)
            if check_finite:
                _check_finite(X_val)

            def validation(coef, intercept):
                return self._validation_score(linear_scores(X_val, coef, intercept), T_val)

        if self.verbose:
            print(
                f"[{type(self).__name__}] device={device}, dtype={self.dtype}, n={n_train}, "
                f"buffer {buffer_size} rows ({math.ceil(n_train / buffer_size)} per pass, "
                f"{'resident' if stream is None else 'prefetched' if self.prefetch else 'loaded on demand'}), "
                f"batch {batch_size} (critical batch {context.beta / context.top_eigenvalue:.1f}), "
                f"R={self.n_rounds}, first learning rate {learning_rate(start_step, batch_size):.4g}"
            )
        try:
            return fit_buffered_sgd(
                loss,
                coef,
                intercept,
                open_pass,
                batch_size=batch_size,
                n_rounds=self.n_rounds,
                learning_rate=learning_rate,
                alpha=alpha,
                fit_intercept=self.fit_intercept,
                n_epochs=n_passes,
                generator=generator,
                shuffle=self.shuffle,
                start_step=start_step,
                validation=validation,
                tol=None if incremental else self.tol,
                n_iter_no_change=self.n_iter_no_change,
                log=print if self.verbose else None,
            )
        finally:
            if stream is not None:
                stream.close()

    def _run_parallel(self, job, devices, strategy):
        """Train with ``strategy`` on worker processes (or this rank of a torchrun group)."""
        results = run_distributed(train_worker, job, [str(device) for device in devices], timeout=strategy.timeout)
        outcome = results[0]
        self.n_workers_ = torch.distributed.get_world_size() if torch.distributed.is_initialized() else len(devices)
        self.communication_bytes_ = int(outcome["bytes"])
        if isinstance(strategy, AdaptiveSGD):
            self.merge_weights_ = np.array([record["merge_weights"] for record in outcome["history"]])
            self.worker_batch_sizes_ = np.array([record["worker_batch_sizes"] for record in outcome["history"]])
        history = outcome["history"]
        seconds = sum(record.get("seconds", 0.0) for record in history)
        result = SGDResult(
            n_epochs=job.n_epochs,
            n_steps=int(outcome["n_steps"]),
            learning_rate=float(outcome["learning_rate"]),
            io_wait_seconds=0.0,
            seconds=seconds,
            history=history,
        )
        return result, torch.as_tensor(outcome["coef"]), torch.as_tensor(outcome["intercept"])

    def _stream(self, sources, dtypes, device, train_segments, buffer_size, n_passes, check_finite):
        """One prefetcher over the buffers of ``n_passes`` passes (chunk order reshuffled per pass)."""
        plans = plan_passes(train_segments, buffer_size, self._seed, self._passes_done, n_passes, self.shuffle)
        prefetcher = BufferPrefetcher(
            sources, [buffer for plan in plans for buffer in plan], device, dtypes, self.prefetch
        )
        return _StreamedPasses(prefetcher, len(plans[0]), check_finite)

    def _split_validation(self, n_rows, rng):
        """Training segments and validation ranges: random blocks of rows.

        Blocks keep the validation reads sequential on disk; for small data they
        are single rows.
        """
        n_validation = max(math.ceil(self.validation_fraction * n_rows), 1)
        if n_rows - n_validation < 1:
            raise ValueError(
                f"early_stopping needs at least 2 samples; got {n_rows} with "
                f"validation_fraction={self.validation_fraction}."
            )
        block = max(1, min(1024, n_validation // 8))
        n_blocks = math.ceil(n_rows / block)
        chosen = np.sort(rng.choice(n_blocks, size=math.ceil(n_validation / block), replace=False))
        validation = [(int(b * block), int(min((b + 1) * block, n_rows))) for b in chosen]
        return _complement(validation, n_rows), validation

    def _sample_plan(self, n_train, rng):
        """Random chunks of up to ``_SAMPLE_ROWS`` rows (as virtual training ranges)."""
        size = min(n_train, _SAMPLE_ROWS)
        return plan_pass(n_train, size, default_chunk_size(size, n_train), rng, shuffle=True)[0]

    @staticmethod
    def _read(sources, dtypes, ranges, device):
        with BufferPrefetcher(sources, [ranges], device, dtypes, prefetch=False) as buffers:
            return next(iter(buffers))

    def _resolve_buffer_size(self, source, nonzeros_per_row, n_train, n_outputs, weighted, device, dtype, budget):
        itemsize = torch.finfo(dtype).bits // 8
        if source.is_sparse:
            row_bytes = nonzeros_per_row * (16 + itemsize) + 16
        else:
            row_bytes = source.shape[1] * itemsize
        row_bytes += 8 * n_outputs + 8 * weighted
        # Two buffers are resident (training and loading), plus a batch gather.
        rows = rows_within_budget(budget, 0, 3 * row_bytes)
        if device.type == "cpu":
            rows = min(rows, max(int(_CPU_BUFFER_BYTES // row_bytes), 1))
        if self.buffer_size == "auto":
            return min(rows, n_train)
        if self.buffer_size > n_train:
            _warn_clamped("buffer_size", self.buffer_size, n_train, "rows of training data")
            return n_train
        return self.buffer_size

    def _resolve_batch_size(self, sample, n_outputs, loss, n_train, buffer_size, critical, device, dtype):
        if self.batch_size != "auto":
            if self.batch_size > buffer_size:
                _warn_clamped("batch_size", self.batch_size, buffer_size, "rows in a buffer")
            return min(self.batch_size, buffer_size), {}
        key = ("sgd", device.type, device.index, dtype, sample.shape[1], n_outputs, sample.is_sparse, type(loss))
        capacity, throughputs = measure_sgd_capacity(sample, n_outputs, loss, min(buffer_size, 2**16), key)
        # Beyond the critical batch a step gains nothing per sample over a smaller one, only
        # throughput: larger batches are taken while a pass still has _MIN_STEPS_PER_PASS steps.
        useful = max(min(critical, buffer_size), n_train / _MIN_STEPS_PER_PASS, 1)
        return int(max(min(capacity, math.ceil(useful), buffer_size), 1)), throughputs

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
        try:
            device = prediction_device(self.device)
            dtype = resolve_dtype(self.dtype_)
            coef_matrix = self._coef_matrix()
            coef = torch.as_tensor(coef_matrix.T.copy(), dtype=dtype).to(device)
            intercept = torch.as_tensor(np.atleast_1d(self.intercept_), dtype=dtype).to(device)
            scores = map_row_blocks(
                rows,
                lambda block: linear_scores(block, coef, intercept),
                coef_matrix.shape[0],
                PREDICT_ROWS[device.type],
                device,
                dtype,
            )
        finally:
            if source is not None:
                source.close()
        # Computed in dtype_, returned in float64 as scikit-learn's linear models do.
        return scores.astype(np.float64)

    def _coef_matrix(self):
        return np.atleast_2d(self.coef_)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


def _warn_clamped(name, value, limit, what):
    warnings.warn(f"{name}={value} is larger than the {limit} {what}; using {limit}.", UserWarning, stacklevel=5)


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
        not improved by ``tol`` for ``n_iter_no_change`` passes.  None disables.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows (random blocks of rows, so that
        reads stay sequential) and keep the coefficients of the best validation score.
    validation_fraction : float in (0, 1), default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
        ``fit`` starts from the previous coefficients (its schedule restarts).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
    dtype : {"float32", "float64"}, default="float32"
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
    buffer_size_ : int
    learning_rate_ : float
        Learning rate of the last update.
    io_wait_fraction_ : float
        Fraction of the last call's time spent waiting for data.
    history_ : list of dict
        Per pass: ``epoch``, ``train_loss`` (mean loss before each step, plus the
        penalty), ``learning_rate``, ``n_steps``, ``seconds``, ``io_wait_seconds``,
        ``samples_per_second`` and ``validation_score`` with early stopping.
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
        self._single_target = single
        targets = y.reshape(y.shape[0], -1)
        return targets, targets.shape[1]

    def _store_coef(self, coef, intercept):
        self.coef_ = coef[0] if self._single_target else coef
        self.intercept_ = intercept

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
        + """
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
            elif classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            else:
                self.classes_ = np.unique(classes)
        else:
            self.classes_ = np.unique(y)
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise ValueError(f"y contains labels not in classes: {unknown!r}.")
        if self.classes_.shape[0] < 2:
            raise ValueError(f"The number of classes has to be greater than one; got {self.classes_.shape[0]} class.")
        labels = np.searchsorted(self.classes_, y).astype(np.int64)
        n_outputs = 1 if self.classes_.shape[0] == 2 else self.classes_.shape[0]
        return labels, n_outputs

    def _store_coef(self, coef, intercept):
        self.coef_ = coef
        self.intercept_ = intercept

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
