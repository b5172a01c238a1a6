"""EigenPro kernel machines that adapt to the device: thin scikit-learn shells.

fit = validate (the data, the weights, the user's centers) -> resolve the runtime
(devices, dtype, memory budget, random state) -> call
:func:`~skgpu_kernel.fit.pipeline.fit_kernel_model`, which makes every
further decision (solver, penalty, validation split, kernel, centers, plan) and runs
EigenPro 2, EigenPro 3 or CG -> store its result as numpy fitted attributes.
"""

import warnings
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, _fit_context, is_classifier
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._tags import TransformerTags
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_y, check_array, check_consistent_length, check_is_fitted, validate_data

from ._kernel_docs import CLASSIFIER_DOC, REGRESSOR_DOC
from ._validation import check_representable, check_sample_weight, class_weighted, output_dtype
from .blockwise import DeviceCopier, PredictionTensors
from .calibration import log_probabilities
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget
from .fit import (
    FEATURE_LEARNING_MODES,
    KernelContinuation,
    KernelFitInput,
    KernelFitParameters,
    KernelRuntime,
    SolverNames,
    fit_with_feature_learning,
    transformed_rows,
)
from .kernels import KERNEL_NAMES
from .process_group import default_process_group
from .scaling import ScalingRule
from .scaling_rules import SCALING_RULES, resolve_scaling_rule
from .tables import COLUMN_SCALINGS, as_pandas, fit_table_encoding, is_table, rows_of_positive_weight, table_choice

__all__ = ["AdaptiveKernelClassifier", "AdaptiveKernelRegressor"]

# The estimators' parameters the fit reads as they are, under their own names
# (fields of KernelFitParameters; the others are resolved or renamed in _fit_parameters).
_FIT_READS = (
    "kernel",
    "bandwidth",
    "kernel_params",
    "bandwidth_search_size",
    "solver",
    "alpha",
    "early_stopping",
    "distributed",
    "batch_size",
    "subsample_size",
    "cache_kernel",
    "projection",
    "fit_intercept",
    "validation_fraction",
    "n_components",
    "damping",
    "n_epochs",
    "tol",
    "n_iter_no_change",
    "feature_learning",
    "feature_learning_iter",
)


class _BaseAdaptiveKernel(BaseEstimator):
    """Shared parameters, fit and decision function of the EigenPro estimators."""

    _parameter_constraints: ClassVar[dict] = {
        "kernel": [StrOptions(set(KERNEL_NAMES)), callable],
        "bandwidth": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto", "scale"})],
        "kernel_params": [dict, None],
        "alpha": [Interval(Real, 0, None, closed="left"), StrOptions({"auto", "loo"})],
        "fit_intercept": ["boolean"],
        "n_epochs": [Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "n_components": [Interval(Integral, 0, None, closed="left"), StrOptions({"auto"})],
        "subsample_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "bandwidth_search_size": [Interval(Integral, 2, None, closed="left"), StrOptions({"auto"})],
        "damping": [Interval(Real, 0, 1, closed="right")],
        "scaling_rule": [StrOptions(set(SCALING_RULES)), ScalingRule],
        "early_stopping": ["boolean", StrOptions({"auto"})],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left"), None],
        "device": [str, torch.device, list, tuple],
        "dtype": [StrOptions({"float32", "float64"})],
        "memory_budget": [None, Interval(Integral, 1, None, closed="left"), str],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "n_centers": [None, StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "centers": [None, "array-like"],
        "cache_kernel": ["boolean", StrOptions({"auto"})],
        "kernel_cache_dtype": [StrOptions({"auto", "float16", "float32", "float64"})],
        "projection": [StrOptions({"auto", "exact", "iterative"})],
        "solver": [StrOptions(SolverNames())],
        "distributed": ["boolean"],
        "feature_learning": [None, StrOptions({"auto", *FEATURE_LEARNING_MODES})],
        "feature_learning_iter": [Interval(Integral, 1, None, closed="left")],
        "categorical_features": [StrOptions({"from_dtype"}), "array-like", None],
        "column_scaling": [StrOptions(set(COLUMN_SCALINGS))],
    }

    def __init__(
        self,
        kernel="gaussian",
        bandwidth="auto",
        *,
        kernel_params=None,
        bandwidth_search_size="auto",
        alpha="auto",
        fit_intercept=True,
        n_epochs=100,
        batch_size="auto",
        n_components="auto",
        subsample_size="auto",
        damping=0.95,
        scaling_rule="eigenpro",
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=3,
        tol=1e-4,
        device="auto",
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
        warm_start=False,
        n_centers="auto",
        centers=None,
        cache_kernel="auto",
        kernel_cache_dtype="auto",
        projection="auto",
        solver="auto",
        distributed=False,
        feature_learning="auto",
        feature_learning_iter=5,
        categorical_features="from_dtype",
        column_scaling="auto",
    ):
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.kernel_params = kernel_params
        self.bandwidth_search_size = bandwidth_search_size
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.n_components = n_components
        self.subsample_size = subsample_size
        self.damping = damping
        self.scaling_rule = scaling_rule
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.device = device
        self.dtype = dtype
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.n_centers = n_centers
        self.centers = centers
        self.cache_kernel = cache_kernel
        self.kernel_cache_dtype = kernel_cache_dtype
        self.projection = projection
        self.solver = solver
        self.distributed = distributed
        self.feature_learning = feature_learning
        self.feature_learning_iter = feature_learning_iter
        self.categorical_features = categorical_features
        self.column_scaling = column_scaling

    # --- fitting: validate -> fit_kernel_model -> store ----------------------------

    def _checked_table(self, X, *, reset):
        """``X`` checked, its feature names read (a polars or pyarrow table's before it becomes pandas)."""
        table = is_table(X)
        X = X if table else check_array(X, accept_sparse=("csr", "csc", "coo"), dtype=None, ensure_all_finite=False)
        validate_data(self, X, skip_check_array=True, reset=reset)
        return as_pandas(X) if table else X

    def _present_rows(self, X, y, sample_weight, **y_checks):
        """``(X, y, sample_weight)``: the rows of positive weight, ``X`` encoded by the encoding fitted on them."""
        keeps = self._keeps_encoding()
        X = self._checked_table(X, reset=not keeps)
        y = self._checked_targets(X, y, **y_checks)
        X, y, sample_weight = rows_of_positive_weight(X, y, sample_weight)
        budget = resolve_memory_budget(self.memory_budget, torch.device("cpu"))
        if not keeps:
            options = {"categorical_features": self.categorical_features, "column_scaling": self.column_scaling}
            options["feature_names"] = getattr(self, "feature_names_in_", None)
            self.table_encoding_ = fit_table_encoding(X, sample_weight=sample_weight, memory_budget=budget, **options)
            self.is_categorical_ = self.table_encoding_.is_categorical
            self.column_scaling_ = self.table_encoding_.scaling.name
            if self.verbose:
                print(self.table_encoding_.scaling.describe())
        return self.table_encoding_.transform(X, budget), y, sample_weight

    def _keeps_encoding(self):
        """Whether this fit keeps the encoding of the fit it continues (a warm start), which must be asked the same."""
        if not (self.warm_start and hasattr(self, "table_encoding_")):
            return False
        self.table_encoding_.check_choice(table_choice(self.categorical_features, self.column_scaling))
        return True

    def _checked_targets(self, X, y, **checks):
        """``y`` checked as scikit-learn's ``validate_data`` does, against the encoded ``X``."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        y = _check_y(y, estimator=self, **checks)
        check_consistent_length(X, y)
        return y

    def _fit_targets(self, X, Y, sample_weight, stratify):
        """Fit on encoded ``X`` and 2-D float targets ``Y``; shared by both shells."""
        X, Y, weights, stratify = _drop_zero_weights(X, Y, sample_weight, stratify)  # a class weight of 0
        check_representable(X, resolve_dtype(self.dtype), "X")
        check_representable(Y, resolve_dtype(self.dtype), "y")
        data = KernelFitInput(
            X,
            Y,
            weights,
            stratify,
            *self._validated_centers(X),
            self._continuation(),
            column_blocks=self.table_encoding_.categorical_blocks,
        )
        runtime = self._resolve_runtime(data.uses_centers)
        parameters = self._fit_parameters()
        learnt = fit_with_feature_learning(data, parameters, runtime)
        self._store_fit(runtime, parameters.scaling_rule, learnt, output_dtype(X.dtype))
        if data.continuation is None:  # a warm start keeps the features, and the record, of the fit that learnt them
            self._store_features(learnt, X)
            self._store_calibration(learnt)
        return self

    def _store_calibration(self, learnt):
        """The classifier's probability temperature and where it came from; nothing for a regressor."""

    def _store_features(self, learnt, X):
        """The learnt metric's attributes (None, and no ``feature_importances_``, without feature learning).

        A feature's importance is its share of the learnt squared distances
        (:meth:`~skgpu_kernel.tables.TableEncoding.squared_distance_shares`: ``M_jj``
        times the variance of the column the kernel sees, so that it does not depend
        on the column's units; a category's block of levels together).
        """
        learning = learnt.metric is not None
        self.feature_learning_ = learnt.feature_learning
        self.metric_transform_ = learnt.transform
        self.metric_ = learnt.metric
        self.feature_learning_scores_ = list(learnt.scores) if learning else None
        self.feature_learning_iteration_ = learnt.iteration if learning else None
        if learning:
            per_column = self.table_encoding_.squared_distance_shares(X, learnt.metric)
            self.feature_importances_ = per_column / max(per_column.sum(), np.finfo(np.float64).tiny)
        else:
            self.__dict__.pop("feature_importances_", None)

    def _validated_centers(self, X):
        """``(centers, n_centers)``: the user's centers checked against ``X``, or the number to draw."""
        if self.n_centers not in (None, "auto") and self.centers is not None:
            raise ValueError("Give either n_centers or centers, not both.")
        if self.centers is None:
            return None, self.n_centers
        centers = self.centers
        if hasattr(centers, "iloc"):
            if centers.isna().to_numpy().any():
                raise ValueError("Input centers contains NaN: a center is a point of the input space.")
        else:
            centers = check_array(centers, dtype=None, ensure_all_finite=True, input_name="centers")
        if centers.shape[1] != self.n_features_in_:
            raise ValueError(f"centers has {centers.shape[1]} features, but X has {self.n_features_in_} features.")
        encoded = self.table_encoding_.transform(centers)
        return check_array(encoded, dtype=np.float64, ensure_all_finite=True, input_name="centers"), None

    def _continuation(self):
        """The previous fit when ``warm_start`` continues it, else None."""
        if not (self.warm_start and hasattr(self, "dual_coef_")):
            return None
        transform = getattr(self, "metric_transform_", None)
        return KernelContinuation(self.dual_coef_, self.centers_, self._training_order, self.bandwidth_, transform)

    def _resolve_runtime(self, uses_centers):
        """Devices, dtype, memory budget, random state and process group of this fit."""
        devices = self._resolve_devices()
        rng = check_random_state(self.random_state)
        # A warm start continues the sequence of epoch permutations instead of
        # repeating the first one, and the scaling rule's count of updates.
        epochs_done = getattr(self, "n_epochs_total_", 0) if self.warm_start else 0
        steps_done = getattr(self, "n_steps_total_", 0) if self.warm_start else 0
        generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)) + epochs_done)
        return KernelRuntime(
            devices=devices,
            dtype=resolve_dtype(self.dtype),
            budget=resolve_memory_budget(self.memory_budget, devices[0]),
            rng=rng,
            generator=generator,
            group=default_process_group() if self.distributed and uses_centers else None,
            first_step=steps_done,
            epochs_done=epochs_done,
            log=print if self.verbose else None,
        )

    def _fit_parameters(self):
        return KernelFitParameters(
            **{name: getattr(self, name) for name in _FIT_READS},
            classifier=is_classifier(self),
            scaling_rule=resolve_scaling_rule(self.scaling_rule),
            validation_score=self._validation_score,
            name=type(self).__name__,
            cache_dtype=self.kernel_cache_dtype,
        )

    def _resolve_devices(self):
        """The training devices: one, or several when ``device`` is a list (the first is the main one)."""
        specs = list(self.device) if isinstance(self.device, (list, tuple)) else [self.device]
        if not specs:
            raise ValueError("device is an empty list; give at least one device.")
        return [resolve_device(spec) for spec in specs]

    def _store_fit(self, runtime, scaling_rule, fit, out):
        """Every fitted attribute of the kernel estimators; coefficients in the input's precision ``out``."""
        loop, devices = fit.loop, runtime.devices
        self.device_ = [str(each) for each in devices] if len(devices) > 1 else str(devices[0])
        self.dtype_ = np.dtype(self.dtype)
        self.memory_budget_ = runtime.budget
        self.solver_, self.alpha_, self.alpha_selection_ = fit.solver, fit.alpha, fit.alpha_selection
        self.fit_attempts_ = fit.attempts
        self.fit_check_ = fit.check
        self.bandwidth_selection_ = fit.bandwidth_selection
        self.early_stopping_ = fit.early_stopping
        self.kernel_, self.bandwidth_, self.X_offset_ = fit.kernel, fit.bandwidth, fit.offset
        self.throughput_probe_ = fit.throughputs
        self.scaling_rule_ = scaling_rule
        self.batch_size_ = loop.batch_size
        self.learning_rate_ = loop.learning_rate
        self.n_epochs_ = loop.n_epochs
        self.n_epochs_total_ = runtime.epochs_done + loop.n_epochs
        self.n_steps_total_ = runtime.first_step + loop.n_steps
        self.history_ = loop.history
        self.centers_ = fit.centers.astype(self.dtype_, copy=False)
        self.n_centers_ = fit.centers.shape[0]
        self.n_projections_ = loop.n_projections
        for name, value in fit.decisions.items():
            setattr(self, name, value)
        self._training_order = fit.order
        self._device_cache = fit.device_cache
        # Computed in dtype, stored in the input's precision, as scikit-learn's linear models do.
        self.dual_coef_ = loop.coef.cpu().numpy().astype(out, copy=False)
        intercept = fit.intercept.astype(out)
        self.intercept_ = intercept[0] if getattr(self, "_single_output", False) else intercept

    # --- prediction ----------------------------------------------------------------

    def _decision(self, X):
        """The scores of ``X``, its rows encoded a block at a time within the memory budget."""
        check_is_fitted(self)
        X, tensors = self._checked_table(X, reset=False), self._prediction_tensors()
        budget = resolve_memory_budget(self.memory_budget, torch.device("cpu"))
        scores = [self._scores(block, tensors) for block in self.table_encoding_.encoded_blocks(X, budget)]
        return scores[0] if len(scores) == 1 else np.concatenate(scores)

    def _scores(self, X, tensors):
        """The scores of encoded rows ``X``, in the learnt features where there are."""
        X = transformed_rows(X, getattr(self, "metric_transform_", None))  # the learnt features, if any
        scores = tensors.predict(self.kernel_, X, resolve_memory_budget(self.memory_budget, tensors.device))
        # Computed in dtype_, returned as scikit-learn's linear models do: float32 when both X
        # and the fitted coefficients are (a float32 fit), float64 otherwise.
        out = np.promote_types(output_dtype(X.dtype), self.dual_coef_.dtype)
        return scores.astype(out, copy=False) + np.atleast_1d(self.intercept_).astype(out)

    def _prediction_tensors(self):
        cache = getattr(self, "_device_cache", None)
        if cache is not None:
            return cache
        device = prediction_device(self.device[0] if isinstance(self.device, (list, tuple)) else self.device)
        dtype = resolve_dtype(self.dtype_)
        to_device = DeviceCopier(device, dtype, self.X_offset_)
        offset = None if self.X_offset_ is None else to_device.offset
        coef = to_device(self.dual_coef_, center=False)
        on_grid = getattr(self, "kernel_grid_step_", None) is not None
        return PredictionTensors.of_centers(self.kernel_, to_device(self.centers_), coef, offset, on_grid)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_device_cache", None)
        return state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.allow_nan = True
        # Tables with category columns are taken (skgpu_kernel.tables).  The string tag stays
        # False: scikit-learn reads it as "any object is kept without conversion", while a
        # value that is neither a number nor a string is refused (check_dtype_object).
        tags.input_tags.categorical = True
        # float32 in, float32 out.  scikit-learn reads this tag of transformers only, so
        # check_estimator does not exercise it here: tests/test_dtype.py does.
        tags.transformer_tags = TransformerTags(preserves_dtype=["float64", "float32"])
        return tags


def _drop_zero_weights(X, Y, sample_weight, stratify):
    """Validated weights, and the rows with a positive one (a class weight of 0), as ``rows_of_positive_weight``."""
    weights = check_sample_weight(sample_weight, X.shape[0])
    X, Y, kept = rows_of_positive_weight(X, Y, weights)
    if stratify is not None and kept.shape[0] < weights.shape[0]:
        stratify = stratify[weights > 0]
    return X, Y, kept, stratify


def _r2_score(predictions, targets):
    residual = ((predictions - targets) ** 2).sum()
    total = ((targets - targets.mean(dim=0)) ** 2).sum()
    return float(1.0 - residual / total) if float(total) > 0 else -float(residual)


def _accuracy_score(predictions, targets):
    if targets.shape[1] == 1:
        return float(((predictions > 0) == (targets > 0)).float().mean())
    return float((predictions.argmax(dim=1) == targets.argmax(dim=1)).float().mean())


class AdaptiveKernelRegressor(RegressorMixin, _BaseAdaptiveKernel):
    __doc__ = REGRESSOR_DOC

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights on the square loss; samples with zero weight are
            dropped.

        Returns
        -------
        self : object
        """
        X, y, sample_weight = self._present_rows(X, y, sample_weight, multi_output=True, y_numeric=True)
        self._single_output = y.ndim == 1
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        return self._fit_targets(X, Y.astype(np.float64), sample_weight, stratify=None)

    def _validation_score(self, predictions, targets):
        return _r2_score(predictions, targets)

    def predict(self, X):
        """Predict with the kernel model, in memory-planned blocks.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
        """
        scores = self._decision(X)
        return scores[:, 0] if self._single_output else scores


class AdaptiveKernelClassifier(ClassifierMixin, _BaseAdaptiveKernel):
    __doc__ = CLASSIFIER_DOC

    _parameter_constraints: ClassVar[dict] = {
        **_BaseAdaptiveKernel._parameter_constraints,
        "class_weight": [StrOptions({"balanced"}), dict, None],
    }

    def __init__(
        self,
        kernel="gaussian",
        bandwidth="auto",
        *,
        kernel_params=None,
        bandwidth_search_size="auto",
        alpha="auto",
        fit_intercept=True,
        n_epochs=100,
        batch_size="auto",
        n_components="auto",
        subsample_size="auto",
        damping=0.95,
        scaling_rule="eigenpro",
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=3,
        tol=1e-4,
        device="auto",
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
        warm_start=False,
        n_centers="auto",
        centers=None,
        cache_kernel="auto",
        kernel_cache_dtype="auto",
        projection="auto",
        solver="auto",
        distributed=False,
        feature_learning="auto",
        feature_learning_iter=5,
        categorical_features="from_dtype",
        column_scaling="auto",
        class_weight=None,
    ):
        super().__init__(
            kernel,
            bandwidth,
            kernel_params=kernel_params,
            bandwidth_search_size=bandwidth_search_size,
            alpha=alpha,
            fit_intercept=fit_intercept,
            n_epochs=n_epochs,
            batch_size=batch_size,
            n_components=n_components,
            subsample_size=subsample_size,
            damping=damping,
            scaling_rule=scaling_rule,
            early_stopping=early_stopping,
            validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change,
            tol=tol,
            device=device,
            dtype=dtype,
            memory_budget=memory_budget,
            random_state=random_state,
            verbose=verbose,
            warm_start=warm_start,
            n_centers=n_centers,
            centers=centers,
            cache_kernel=cache_kernel,
            kernel_cache_dtype=kernel_cache_dtype,
            projection=projection,
            solver=solver,
            distributed=distributed,
            feature_learning=feature_learning,
            feature_learning_iter=feature_learning_iter,
            categorical_features=categorical_features,
            column_scaling=column_scaling,
        )
        self.class_weight = class_weight

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Class labels of any type.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights on the square loss, multiplied by the weights of
            ``class_weight``; samples with zero weight are dropped.

        Returns
        -------
        self : object
        """
        classes = None if y is None else np.unique(_check_y(y))  # scikit-learn's classes_: every label of y
        X, y, sample_weight = self._present_rows(X, y, sample_weight)
        check_classification_targets(y)
        self.classes_, encoded = classes, np.searchsorted(classes, y)
        if self.classes_.shape[0] < 2:
            raise ValueError(
                f"The classifier needs samples of at least 2 classes; got one class only ({self.classes_[0]!r})."
            )
        if self.classes_.shape[0] == 2:
            Y = np.where(encoded == 1, 1.0, -1.0)[:, None]
        else:
            Y = np.eye(self.classes_.shape[0])[encoded]
        sample_weight = class_weighted(sample_weight, self.class_weight, self.classes_, encoded)
        return self._fit_targets(X, Y, sample_weight, stratify=encoded)

    def _validation_score(self, predictions, targets):
        return _accuracy_score(predictions, targets)

    def _store_calibration(self, learnt):
        self.calibration_temperature_ = 1.0 if learnt.temperature is None else learnt.temperature
        self.calibration_ = learnt.calibration

    def predict_proba(self, X):
        """Class probabilities: the decision values scaled by ``calibration_temperature_``.

        ``sigmoid(s / T)`` for two classes, ``softmax(S / T)`` for more, with ``T``
        chosen on rows the fit held out (temperature scaling; see the attribute).
        The most probable class is the one ``predict`` returns.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``.
        """
        return np.exp(self.predict_log_proba(X))

    def predict_log_proba(self, X):
        """Logarithms of :meth:`predict_proba`'s probabilities, computed without underflow.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        if getattr(self, "calibration_", None) == "none":
            warnings.warn(
                "The probabilities are the scores' softmax at temperature 1, not calibrated: this fit could not "
                "hold rows out (data read from a file in buffers, or over a process group). Wrap the estimator in "
                "CalibratedClassifierCV for calibrated probabilities.",
                UserWarning,
                stacklevel=2,
            )
        scores = self.decision_function(X)
        return log_probabilities(scores, self.calibration_temperature_)

    def decision_function(self, X):
        """Raw scores: shape (n_samples,) for two classes (positive means ``classes_[1]``),
        else (n_samples, n_classes).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray
        """
        scores = self._decision(X)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        scores = self.decision_function(X)
        indices = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[indices]
