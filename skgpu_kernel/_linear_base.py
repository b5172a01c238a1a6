"""The linear models' shared shell: validate the data, resolve the runtime, call the pipeline, store.

:class:`~skgpu_kernel.BufferedSGDRegressor` and
:class:`~skgpu_kernel.BufferedSGDClassifier` (``linear_model.py``) differ in their
targets, losses and predictions; the rest of a fit is theirs in common here:
validate (or open an out-of-core source) -> resolve the runtime (device, dtype,
memory budget, seed, parallel workers) -> call
:func:`~skgpu_kernel.bmgd_fit.fit_bmgd_model` -> store its result as numpy
fitted attributes.
"""

import warnings
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import scipy.sparse
import torch
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._tags import TransformerTags
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ._validation import check_representable, check_sample_weight, output_dtype
from .blockwise import linear_predict
from .bmgd_fit import (
    BMGDContinuation,
    BMGDInput,
    BMGDRuntime,
    BMGDSettings,
    InProcessRunner,
    fit_bmgd_model,
)
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget
from .parallel.runner import worker_runner
from .parallel.strategies import ParallelStrategy
from .row_sources import as_row_source, is_out_of_core
from .scaling import ScalingRule
from .scaling_rules import SCALING_RULES, resolve_scaling_rule

__all__ = ["BaseBufferedSGD", "LinearTargets"]


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
class LinearTargets:
    """Encoded targets: float (n, l) values or int64 class indices, and what the stored model needs."""

    values: np.ndarray
    n_outputs: int
    classes: np.ndarray | None = None
    single: bool = False


class _RowSlices:
    """Row slicing ``X[start:stop]`` over a :class:`~skgpu_kernel.row_sources.RowSource`."""

    def __init__(self, source):
        self.source = source
        self.shape = source.shape

    def __getitem__(self, rows):
        return self.source.read([(rows.start, min(rows.stop, self.source.n_rows))])


class BaseBufferedSGD(BaseEstimator):
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
