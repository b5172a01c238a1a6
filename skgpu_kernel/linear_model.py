"""Buffered mini-batch SGD (BMGD) linear models: thin scikit-learn shells.

fit = validate (or open an out-of-core source) and encode the targets -> resolve
the runtime (device, dtype, memory budget, seed, parallel workers) -> call
:func:`~skgpu_kernel.solvers.bmgd_fit.fit_bmgd_model`, which splits, measures,
plans and runs BMGD in this process or on the workers -> store its result as numpy
fitted attributes.
"""

import dataclasses
import warnings
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, _fit_context, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._tags import TransformerTags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ._validation import check_representable, check_sample_weight, class_weighted, output_dtype
from .blockwise import linear_predict
from .buffer import as_row_source, is_out_of_core
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget
from .parallel.runner import worker_runner
from .parallel.strategies import ParallelStrategy
from .scaling import ScalingRule
from .scaling_rules import SCALING_RULES, resolve_scaling_rule
from .solvers.bmgd_fit import (
    BMGDContinuation,
    BMGDInput,
    BMGDRuntime,
    BMGDSettings,
    InProcessRunner,
    fit_bmgd_model,
)

__all__ = ["BufferedSGDClassifier", "BufferedSGDRegressor"]


@dataclass(frozen=True)
class _Input:
    """The user's data, opened: the row source of X, the targets, the weights (None when all 1)."""

    source: object
    y: np.ndarray
    weights: np.ndarray | None
    # Sources not validated in memory: buffers are checked for NaN as they arrive.
    out_of_core: bool
    nonzeros_per_row: float | None


@dataclass(frozen=True)
class _Targets:
    """Encoded targets: float (n, l) values or int64 class indices, and what the stored model needs."""

    values: np.ndarray
    n_outputs: int
    classes: np.ndarray | None = None
    single: bool = False


class _RowSlices:
    """Row slicing ``X[start:stop]`` over a :class:`~skgpu_kernel.buffer.RowSource`."""

    def __init__(self, source):
        self.source = source
        self.shape = source.shape

    def __getitem__(self, rows):
        return self.source.read([(rows.start, min(rows.stop, self.source.n_rows))])


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
        "polish": [StrOptions({"auto"}), None],
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
        n_epochs=1000,
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
        polish="auto",
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
        self.polish = polish

    # --- fit: validate -> fit_bmgd_model -> store -----------------------------------

    def _fit(self, X, y, sample_weight, *, incremental, classes=None):
        if incremental and self.early_stopping:
            raise ValueError(
                "partial_fit does not support early_stopping=True: each call is one pass, with no epochs to "
                "stop and no rows to hold out. Set early_stopping=False, or call fit."
            )
        continuing = incremental and hasattr(self, "coef_")
        data = self._open_data(X, y, sample_weight, reset=not continuing)
        try:
            targets = self._encode_targets(data.y, incremental, classes)
            data = self._with_class_weights(data, targets, incremental)
            bmgd_input = BMGDInput(
                data.source, targets.values, targets.n_outputs, data.weights, data.out_of_core, data.nonzeros_per_row
            )
            continuation = self._continuation(continuing)
            runtime = self._resolve_runtime(continuation)
            # The rule is resolved on every call, so that set_params between partial_fit
            # calls takes effect; sizes and spectrum stay those of the first call.
            settings = self._fit_settings(incremental)
            fit = fit_bmgd_model(bmgd_input, runtime, settings, continuation)
        finally:
            data.source.close()
        if not fit.converged:
            # stacklevel 4: the user's line, above fit's _fit_context wrapper, fit and _fit.
            warnings.warn(self._not_converged_message(fit.polish), ConvergenceWarning, stacklevel=4)
        self._store_fit(runtime, settings.scaling_rule, fit, (targets, output_dtype(data.source.dtype), continuing))
        return self

    def _not_converged_message(self, polish):
        name = type(self).__name__
        if polish is None:
            return (
                f"{name} ran its n_epochs={self.n_epochs} passes before the stopping rule was met "
                f"(tol={self.tol}, n_iter_no_change={self.n_iter_no_change}): the model may not have converged. "
                "Increase n_epochs."
            )
        return (
            f"{name}'s full-batch polish stopped after {polish.n_iter} L-BFGS iterations with its objective "
            f"certified within {polish.excess_bound:.1e} of the optimum's, above the tolerance: the training "
            "rows' precision (dtype) or the iteration limit stopped it. Try dtype='float64'."
        )

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

    def _continuation(self, continuing):
        """The previous fit when ``warm_start`` or a later ``partial_fit`` call continues it, else None."""
        if not (continuing or (self.warm_start and hasattr(self, "coef_"))):
            return None
        return BMGDContinuation(
            self._coef_matrix(),
            self.intercept_,
            self._seed,
            self._passes_done,
            plan=self._bmgd_plan if continuing else None,
            start_step=self.t_ if continuing else 0,
        )

    def _resolve_runtime(self, continuation):
        """Device facts, where the fit trains (this process or a copy of ``parallel``'s workers) and the seed."""
        device = resolve_device(self.device)
        budget = resolve_memory_budget(self.memory_budget, device)
        runner = InProcessRunner() if self.parallel is None else worker_runner(clone(self.parallel), device)
        if continuation is not None:
            seed = continuation.seed
        else:
            seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        return BMGDRuntime(
            device=device,
            dtype=resolve_dtype(self.dtype),
            budget=budget,
            seed=seed,
            prefetch=self.prefetch,
            runner=runner,
            log=print if self.verbose else None,
        )

    def _fit_settings(self, incremental):
        return BMGDSettings(
            loss=self.loss,
            epsilon=getattr(self, "epsilon", 0.1),
            alpha=float(self.alpha) if self.penalty == "l2" else 0.0,
            fit_intercept=self.fit_intercept,
            scaling_rule=resolve_scaling_rule(self.scaling_rule),
            batch_size=self.batch_size,
            buffer_size=self.buffer_size,
            n_rounds=self.n_rounds,
            n_epochs=self.n_epochs,
            shuffle=self.shuffle,
            tol=self.tol,
            early_stopping=self.early_stopping,
            validation_fraction=self.validation_fraction,
            n_iter_no_change=self.n_iter_no_change,
            validation_score=self._validation_score,
            name=type(self).__name__,
            incremental=incremental,
            polish=self.polish,
        )

    def _store_fit(self, runtime, scaling_rule, fit, stored):
        """Every fitted attribute of a fit or partial_fit call, in one place."""
        targets, out, continuing = stored
        result, plan = fit.result, fit.plan
        self.device_ = str(runtime.device)
        self.dtype_ = np.dtype(self.dtype)
        self.memory_budget_ = runtime.budget
        self.scaling_rule_ = scaling_rule
        self._bmgd_plan = plan
        self.batch_size_ = result.batch_size
        self.buffer_size_ = plan.buffer_size
        self.critical_batch_size_ = plan.critical_batch_size
        self.spectrum_ = plan.spectrum
        self.throughput_probe_ = {} if plan.probe is None else plan.probe.throughputs
        self.batch_capacity_ = None if plan.probe is None else plan.probe.largest_batch
        self._seed = runtime.seed
        self._passes_done = fit.passes_done
        self.n_iter_ = result.n_epochs
        self.polish_ = fit.polish
        self.t_ = fit.n_steps_total
        self.learning_rate_ = result.learning_rate
        self.io_wait_fraction_ = result.io_wait_seconds / max(result.seconds, 1e-12)
        self.history_ = [*self.history_, *result.history] if continuing else result.history
        # parallel_, and the workers' figures of a parallel fit.
        for name, value in fit.runner_facts.items():
            setattr(self, name, value)
        if targets.classes is not None:
            self.classes_ = targets.classes
        self._single_target = targets.single
        # Computed in dtype, stored in the input's precision as scikit-learn's linear models do.
        coef = fit.coef.T.cpu().numpy().astype(out, copy=False)
        self.coef_ = coef[0] if targets.single else coef
        self.intercept_ = fit.intercept.cpu().numpy().astype(out, copy=False)

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
            device, dtype = prediction_device(self.device), resolve_dtype(self.dtype_)
            return linear_predict(rows, self._coef_matrix(), self.intercept_, device, dtype).astype(out)
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
    n_epochs : int, default=1000
        The most passes over the data by ``fit`` (the stopping rule, ``tol``, ends
        it sooner; a fit that runs them all before the rule is met warns with a
        ``ConvergenceWarning``), and the horizon of decaying schedules.
    shuffle : bool, default=True
        Shuffle the order of row chunks each pass and the rows of a buffer each round.
    prefetch : bool, default=True
        Load the next buffer in a background thread (on a CUDA side stream from pinned
        memory) while the current one trains.  False loads buffers on demand.
    tol : float or None, default=1e-3
        Stop when the validation score (with early stopping), else the training
        loss as a fraction of the first pass's, has not improved by more than
        ``tol`` for ``n_iter_no_change`` passes: the rule of every estimator of the
        package (:mod:`skgpu_kernel.planning.stopping`), free of the targets' scale.
        At EigenPro's analytic step (the default ``"optimal"`` and ``"eigenpro"``,
        without a decay of their own), each of the first 7 such plateaus halves the
        step instead, and the next one stops the fit (at 1/128 of the peak): at a
        constant step SGD on data the model cannot interpolate wanders around the
        optimum at a distance that grows with the step
        (``skgpu_kernel.planning.sgd.plateaus_to_anneal``).  Other rules keep
        their own schedule and stop at the first plateau.  Parallel workers judge
        it after every pass on the workers' mean loss (AdaptiveSGD: at the first
        merge of each pass) and halve the step together.  ``partial_fit`` never
        judges it (one pass per call): its step follows the rule alone.  None
        disables it.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows (random blocks of rows, so that
        reads stay sequential) and keep the coefficients of the best validation score
        (R^2 or accuracy, weighted by the held-out rows' ``sample_weight``, times
        ``class_weight`` for the classifier; held-out rows whose weights are all 0
        are refused).  ``fit`` only: ``partial_fit`` refuses it.
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
        it instead of spawning, each rank reading its own shard.  ``tol`` applies
        to parallel fits too; early stopping (one held-out split) does not.
    polish : {"auto"} or None, default="auto"
        Finish ``fit`` with L-BFGS on the whole training set's penalised objective,
        from the SGD iterate, until its gradient certifies the objective within
        0.01% of the optimum's (``||g||^2 <= 2 alpha 10^-4 f``, by the penalty's
        strong convexity).  Near separation the log loss's curvature vanishes along
        the separating directions and stochastic steps crawl there; the polish
        reaches the optimum in tens to hundreds of iterations (two passes over the
        rows each).  The hinge's kink is rounded by smoothed copies of it, each
        narrower, in float64, until the rounding's gap is half the tolerance (the
        certificate adds it).  ``"auto"`` polishes where the schedule is the
        default's (``"optimal"`` or ``"eigenpro"`` without a decay), ``alpha > 0``,
        early stopping is off, the model is this process's (not ``parallel=``),
        and every row's scores fit the memory budget beside the buffers; the rows
        are read as SGD reads them, in memory or streamed from a file
        (``skgpu_kernel.planning.sgd.plan_polish``).  Never for ``partial_fit`` or
        another schedule.
        None: SGD alone.
"""

_COMMON_ATTRIBUTES = """
    n_iter_ : int
        SGD passes run by the last call to ``fit`` (1 for ``partial_fit``).
    polish_ : PolishResult or None
        The full-batch polish of the last call (see ``polish``): ``n_iter``
        (L-BFGS iterations), ``converged``, ``excess_bound`` (the certified
        relative excess objective), ``objective`` and ``seconds``; None where it
        did not run.
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
        ``bytes_all_reduced`` for DataParallel and Parle (Parle with ``tol``:
        ``workers_train_loss``, the workers' mean that ``tol`` judges; each
        worker's ``train_loss`` is its own shard's), the merge's weights and
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
        n_epochs=1000,
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
        polish="auto",
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
            polish=polish,
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
        first call.  ``tol`` does not apply (the step follows the rule alone), and
        ``early_stopping=True`` is refused (a ``ValueError``), as scikit-learn's
        ``SGDRegressor.partial_fit`` refuses it: one pass has no epochs to stop.

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
    def _validation_score(scores, targets, weights=None):
        """The held-out rows' R^2 (weighted by their ``sample_weight``, as ``r2_score``'s)."""
        weights = torch.ones_like(targets[:, 0]) if weights is None else weights
        weights = weights[:, None]
        mean = (weights * targets).sum(dim=0) / weights.sum()
        residual = (weights * (scores - targets) ** 2).sum()
        total = (weights * (targets - mean) ** 2).sum()
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
        n_epochs=1000,
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
        polish="auto",
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
            polish=polish,
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
    def _validation_score(scores, labels, weights=None):
        """The held-out rows' accuracy (weighted by their ``sample_weight``, as ``accuracy_score``'s)."""
        predicted = (scores[:, 0] > 0).long() if scores.shape[1] == 1 else scores.argmax(dim=1)
        correct = (predicted == labels).double()
        if weights is None:
            return float(correct.mean())
        weights = weights.double()
        return float((weights * correct).sum() / weights.sum())

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
