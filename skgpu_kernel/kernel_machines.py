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

from ._validation import check_representable, check_sample_weight, class_weighted, output_dtype
from .blockwise import DeviceCopier, PredictionTensors
from .calibration import log_probabilities
from .device import prediction_device, resolve_device, resolve_dtype, resolve_memory_budget
from .fit import (
    FEATURE_LEARNING_MODES,
    FitRequest,
    KernelContinuation,
    KernelFitInput,
    KernelFitParameters,
    KernelRuntime,
    fit_with_feature_learning,
    transformed_rows,
)
from .kernels import KERNEL_NAMES
from .process_group import default_process_group
from .scaling import SCALING_RULES, ScalingRule, resolve_scaling_rule
from .tables import COLUMN_SCALINGS, TableOptions, as_pandas, fit_table_encoding, is_table, rows_of_positive_weight

__all__ = ["AdaptiveKernelClassifier", "AdaptiveKernelRegressor"]


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
        "solver": [StrOptions({"auto", "cg", "eigenpro"})],
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
            names = getattr(self, "feature_names_in_", None)
            options = TableOptions(self.categorical_features, self.column_scaling, names)
            self.table_encoding_ = fit_table_encoding(X, options, sample_weight=sample_weight, memory_budget=budget)
            self.is_categorical_ = self.table_encoding_.is_categorical
            self.column_scaling_ = self.table_encoding_.scaling.name
            if self.verbose:
                print(self.table_encoding_.scaling.describe())
        return self.table_encoding_.transform(X, budget), y, sample_weight

    def _keeps_encoding(self):
        """Whether this fit keeps the encoding of the fit it continues (a warm start), which must be asked the same."""
        if not (self.warm_start and hasattr(self, "table_encoding_")):
            return False
        self.table_encoding_.check_choice(TableOptions(self.categorical_features, self.column_scaling))
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
        learnt = fit_with_feature_learning(FitRequest(data, parameters), runtime)
        self._store_fit(runtime, parameters.scaling_rule, learnt.fit, output_dtype(X.dtype))
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
        self.feature_learning_ = learnt.mode
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
            kernel=self.kernel,
            bandwidth=self.bandwidth,
            kernel_params=self.kernel_params,
            solver=self.solver,
            alpha=self.alpha,
            early_stopping=self.early_stopping,
            classifier=is_classifier(self),
            distributed=self.distributed,
            batch_size=self.batch_size,
            subsample_size=self.subsample_size,
            cache_kernel=self.cache_kernel,
            projection=self.projection,
            fit_intercept=self.fit_intercept,
            validation_fraction=self.validation_fraction,
            n_components=self.n_components,
            damping=self.damping,
            scaling_rule=resolve_scaling_rule(self.scaling_rule),
            n_epochs=self.n_epochs,
            tol=self.tol,
            n_iter_no_change=self.n_iter_no_change,
            validation_score=self._validation_score,
            name=type(self).__name__,
            cache_dtype=self.kernel_cache_dtype,
            feature_learning=self.feature_learning,
            feature_learning_iter=self.feature_learning_iter,
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


_COMMON_PARAMETERS = """
    Parameters
    ----------
    kernel : {"gaussian", "rbf", "laplacian", "cauchy", "matern"}, Kernel or callable, \
default="gaussian"
        The kernel.  A :class:`~skgpu_kernel.kernels.Kernel` instance is used with its
        own parameters (``kernel__bandwidth`` in a grid search); a callable
        ``f(X, Z) -> Tensor`` receives torch tensors.
    bandwidth : float, "auto" or "scale", default="auto"
        Length scale ``sigma`` of a named kernel (Gaussian:
        ``exp(-||x - z||^2 / (2 sigma^2))``, i.e. scikit-learn's ``gamma = 1 / (2
        sigma^2)``), or of a :class:`~skgpu_kernel.kernels.Kernel` instance whose own
        ``bandwidth`` is one of these strings.  ``"scale"`` uses ``sqrt(n_features *
        X.var() / 2)``, which is scikit-learn's ``gamma="scale"`` (see
        :func:`~skgpu_kernel.kernels.auto_bandwidth`).  ``"auto"`` chooses it with the
        penalty: the bandwidths ``scale * 2 ** (k / 2)`` for ``k`` from -6 to 2 are
        scored by the exact leave-one-out error of the kernel ridge model on a random
        subsample of at most 1500 rows (every one of them a center; for every
        penalty at once, or at the given ``alpha``), starting at the rule and walking
        downhill an octave at a time, then half an octave (five or six of the nine);
        the criterion is the classifier's misclassification rate and the regressor's
        squared error.  With more rows than that, a bandwidth wider than the rule is
        not taken (the subsample's best bandwidth is at least as wide as all rows').
        It costs about 1 s per bandwidth on a 2-core CPU at 1500 rows (less below);
        ``bandwidth_selection_`` records the grid, the errors and the time.  On the
        classification sets of ``benchmarks/bench_real_data.py`` it chose half an
        octave below the rule on LetterRecognition (test error 0.027 instead of
        0.031) and an octave below on Glass.
    kernel_params : dict, default=None
        Further arguments of a named kernel, e.g. ``{"nu": 2.5}`` for Matern.
    alpha : float >= 0, "auto" or "loo", default="auto"
        Ridge penalty of the one model every solver converges to:
        ``f(x) = sum_j a_j k(z_j, x) + b`` minimising ``sum_i w_i (f(x_i) - y_i)^2 +
        alpha a^T K(Z, Z) a`` with the intercept ``b`` unpenalised (the penalty on the
        sum of squared errors, as in :class:`sklearn.kernel_ridge.KernelRidge`, whose
        model is this one without ``b``).  ``0`` keeps EigenPro's
        interpolating solution, regularised by early stopping instead.  The penalty
        shifts the preconditioner's spectrum (``alpha / n`` on the eigenvalues of
        ``K / n``), so step sizes stay analytic.  ``"loo"`` chooses it as
        :class:`sklearn.linear_model.RidgeCV` does, by the exact leave-one-out error of
        a ridge model, here on the float64 Nystrom features of a random subsample
        (2000 points; exact for fewer rows than that), scored on every row up to
        100000 (beyond that the chosen ``alpha`` is kept), over per-sample penalties
        ``alpha / n`` from 1e-9 to 1, four per decade (see
        :mod:`skgpu_kernel.regularization`).  ``"auto"``: with ``n_centers``, ``"loo"``
        for the conjugate gradients (an exact solver, which without a penalty fits the
        noise: 2.4 times the error of ``"loo"`` on the HI data set) and ``0`` for
        EigenPro 3, whose SGD has no penalty.  With every training point a center,
        ``"loo"`` where the Nystrom features capture at least 95% of the kernel's
        trace (``alpha_selection_.coverage``, measured on rows outside the subsample),
        ``0`` with early stopping otherwise: a Nystrom model that misses more of the
        kernel is not the model being fitted, and the criterion takes the signal it
        misses for noise (Fashion-MNIST: coverage 0.87, and its penalty cost 1.5
        points of accuracy; the tabular sets of ``benchmarks/bench_real_data.py``:
        0.97 to 0.998, where it beat early stopping by up to 7%).  Below that
        coverage, a fit of at most 1.78 times the 1500 rows that ``bandwidth="auto"``
        scored exactly takes the search's ``alpha`` as it is instead
        (``alpha_selection_.carried``; DNA, coverage 0.475: 9% lower test error).  The classifier's
        criterion is the leave-one-out misclassification rate (among the penalties
        within a standard error of the lowest rate, the smallest squared error of
        the codes wins), and with unequal sample weights
        (``class_weight`` included) its penalty is always scored: a model that
        interpolates, or stops early on the way there, fits every training label
        whatever its weight.  The value used is
        ``alpha_``.
    fit_intercept : bool, default=True
        Fit the unpenalised intercept ``b`` of the model (``intercept_``).  Adding a
        constant to ``y`` then shifts the predictions by that constant and changes
        nothing else.  With a penalty (``alpha_ > 0``) and no held-out split, ``b``
        is fitted with the kernel part by every solver, as the leave-one-out
        criterion scores it: the targets are solved for together with a column of
        ones, and ``b`` makes the weighted residuals sum to zero.  Without a penalty
        (an interpolating or early-stopped fit, where ``b`` is not determined), or
        where held-out rows score every epoch, ``b`` is the targets' (the
        classifier's codes') weighted mean.  With a narrow kernel the mean is a poor
        intercept far from the data (Ionosphere: test error 0.28 with the mean,
        0.070 fitted).
    n_epochs : int, default=100
        Upper bound on the passes over the training data; the fit stops earlier when
        it has converged (see ``early_stopping`` and ``tol``); ``n_epochs_`` and
        ``history_`` say when and why.
    batch_size : int or "auto", default="auto"
        ``"auto"`` takes the device's measured batch capacity ``m_G``, kept at most
        half the preconditioned critical batch ``m*(P)`` (a stability margin).  An
        integer fixes the batch (the step size still follows ``scaling_rule``),
        which also makes fits reproducible across machines.
    n_components : int or "auto", default="auto"
        Number ``k`` of top eigendirections the preconditioner flattens (the paper's
        ``q`` is ``k + 1``).  ``"auto"`` takes at least the smallest ``k`` whose
        preconditioned critical batch reaches twice the batch capacity, and flattens
        up to half the subsample's directions (all of them when the subsample is
        every training row; at most 1000, only those resolvable in ``dtype``),
        which costs little per step and improves accuracy per epoch,
        but never beyond the first ``k`` whose preconditioned critical batch reaches
        the training rows (past it the flattened directions converge by less than
        a factor e per epoch).
        ``0`` turns preconditioning off.
    subsample_size : int or "auto", default="auto"
        Nystrom subsample for the eigensystem: ``min(n, 2000)`` up to 100k samples,
        ``min(n, 5000)`` beyond.
    damping : float in (0, 1], default=0.95
        Exponent ``a`` of the spectral flattening.
    scaling_rule : {"eigenpro", "constant", "linear", "sqrt", "legw"} or ScalingRule, \
default="eigenpro"
        Step size of each update as a function of the batch size and of the update
        count; see :mod:`skgpu_kernel.scaling`.  The default is EigenPro's analytic
        step from the preconditioned spectrum, ``m / beta`` up to the critical batch
        and saturating near ``2 / lambda_1`` beyond, which needs no tuning.  A name
        takes the rule's defaults; a rule object is used (cloned) with its own
        parameters, e.g. ``EigenProRule(scale=0.5, decay="exponential")``, or
        ``ConstantRule(base_lr=...)`` searched as ``scaling_rule__base_lr``.  The
        schedule's horizon is ``n_epochs``; with ``warm_start`` the update count
        continues from the previous fit, so a decaying schedule resumes where it
        stopped.
    early_stopping : bool or "auto", default="auto"
        ``True`` holds out ``validation_fraction`` of the data (stratified for
        classifiers) and stops when the validation score (R^2 or accuracy) has not
        improved by more than ``tol`` for ``n_iter_no_change`` epochs, keeping the best
        coefficients.  ``False`` trains on all the data and stops when the training
        loss, as a fraction of the zero model's loss, has not fallen by more than
        ``tol`` for ``n_iter_no_change`` epochs (scikit-learn's ``SGDRegressor`` rule on
        a scale-free loss).  ``"auto"`` is ``True`` when ``alpha_ == 0`` and there are
        at least 1000 samples (then the iteration heads for the interpolant and
        held-out data decides when to stop), and ``False`` otherwise (a penalised
        loss converges by itself; small data are cheap to fit) or when a
        memory-mapped ``X`` is streamed.  The resolved choice is ``early_stopping_``.
    validation_fraction : float in (0, 1), default=0.1
    n_iter_no_change : int, default=3
    tol : float or None, default=1e-4
        Smallest gain that counts as progress (see ``early_stopping``).  ``None`` runs
        all ``n_epochs`` (with a validation split, the best coefficients are still
        kept).
    device : {"auto", "cpu", "cuda", "cuda:N"}, torch.device or list, default="auto"
        ``"auto"`` is CUDA when available.  A list of devices (EigenPro 3 only,
        e.g. ``["cuda:0", "cuda:1"]``) splits the centers in one shard per device;
        the first holds the coefficients and predicts.
    dtype : {"float32", "float64"}, default="float32"
        Training and prediction precision; the eigensystem is always float64.
        Results follow the input as in scikit-learn's linear models:
        ``dual_coef_`` and ``intercept_`` are float32 when ``X`` is float32 and
        float64 otherwise, and so are the predictions and ``decision_function``
        (float64 when either ``X`` or the coefficients are float64).
    memory_budget : None, int or str, default=None
        Bytes (or a string such as ``"4GB"``) the fit may use on the device.  None
        takes 80% of free CUDA memory (including torch's cached blocks) or 50% of the
        host's available memory.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffling, the Nystrom subsample and the validation split.
    verbose : int, default=0
        Print the decisions taken and one line per epoch.
    warm_start : bool, default=False
        Continue from the previous coefficients; ``X`` must be the same data (and,
        with ``n_centers`` or ``centers``, the centers the same).
    n_centers : "auto", int or None, default="auto"
        How many centers the model has.  ``"auto"`` keeps a center at every
        training point while EigenPro 2 can hold ``K(X, X)`` in ``memory_budget``
        (float16 entries allowed) or there are at most 20000 rows, and beyond that
        draws ``p = max(2000, 10 sqrt(n))`` centers (Falkon's ``sqrt(n)`` rule, ten
        times over, never fewer than the Nystroem baseline's 2000): lowered to the
        largest ``p`` whose ``K(X, Z)`` CG can store in the budget when that leaves
        at least 2000, otherwise kept and trained by EigenPro 3.  ``verbose`` says
        which and why; ``n_centers_`` holds the count.  None puts a center at
        every training point (EigenPro 2, or CG for small penalised problems).  An
        integer ``p`` takes a seeded uniform draw of ``p`` distinct training rows
        as centers (clamped to ``n`` with a warning; a repeated row adds nothing to
        the model but makes ``K(Z, Z)`` singular), fitted by CG (``solver``) or by
        EigenPro 3: batches take EigenPro 2 steps with their rows as temporary
        centers, which are projected onto the span of the centers every
        ``n_temporary_centers_`` rows, so memory grows with ``p``, not ``n``.  The
        Nystrom subsample is the first ``subsample_size`` centers.  See
        :ref:`large_kernel_models`.
    centers : array-like of shape (p, n_features), default=None
        Explicit centers for EigenPro 3 (finite; not together with ``n_centers``).
        The spectrum that sets the step size is estimated on them, so they should
        resemble the data.
    cache_kernel : bool or "auto", default="auto"
        Compute the kernel rows the steps read once and reuse them every epoch.
        EigenPro 2: ``K(X, X)``, with the validation rows' ``K(X_val, X)`` (n x
        (n + n_val) entries), filled in blocks on and below the diagonal and
        mirrored; an epoch then reads it instead of evaluating the kernel (60000
        Fashion-MNIST rows: seconds instead of tens of seconds per epoch on a
        2-core CPU).  ``"auto"`` caches in ``dtype`` when that fits
        ``memory_budget`` next to the fixed costs, else in float16 when ``dtype`` is
        float32 and that fits (measured to leave accuracy unchanged), else computes
        blocks per batch; the choice is ``kernel_cache_dtype_``.  EigenPro 3:
        ``K(X, centers)`` (n x p in ``dtype``, per device its shard's columns),
        cached by ``"auto"`` when it fits (unless only one of the cache and the
        exact projection fits: the projection is preferred).  ``True`` raises a
        ``ValueError`` when it does not fit (or when ``X`` is streamed); ``False``
        always recomputes.
    kernel_cache_dtype : {"auto", "float16", "float32", "float64"}, default="auto"
        How EigenPro 2's ``K(X, X)`` cache is stored.  ``"auto"``: in ``dtype``
        where that fits, else in float16 for a float32 fit of a kernel with values
        in [-1, 1] (the radial kernels), which on the real-data benchmark left test
        errors within 0.06% (regression) or within their spread over seeds
        (classification) and fitted 10-25% faster.  A named dtype stores it in that
        dtype only (at most as wide as ``dtype``; float16 for the radial kernels
        only), and the cache is otherwise not kept.  The choice made is
        ``kernel_cache_dtype_``.
    projection : {"auto", "exact", "iterative"}, default="auto"
        EigenPro 3's projection onto the span of the centers.  ``"exact"``
        factorises ``K(centers, centers)`` once (float64 Cholesky in place, about
        ``9 p^2`` bytes with the blocks that fill it); ``"iterative"`` runs
        full-batch EigenPro 2 iterations on the centers (step measured by power
        iteration) to a 1% residual and carries what is left into the next
        projection, with no ``p x p`` matrix unless ``K(centers, centers)`` fits
        the budget (then cached).  ``"auto"`` is exact when it fits
        ``memory_budget``, before the kernel cache: the iterative projection
        costs up to 100 passes over ``K(centers, centers)`` each time.
    solver : {"auto", "cg", "eigenpro"}, default="auto"
        How the model on ``n_centers`` or ``centers`` is fitted.  ``"cg"``: conjugate
        gradients on the penalised normal equations, preconditioned with the
        ``K(centers, centers)`` Cholesky factor (Falkon's preconditioner), to the
        exact penalised least-squares solution on the centers, one pass over the data
        per iteration (``n_epochs`` bounds the iterations; two ``p x p`` float64
        factors, ``16 p^2`` bytes; ``K(X, Z)`` is computed once and stored when it fits
        ``memory_budget``, else evaluated every iteration).  ``"eigenpro"``:
        EigenPro 3's projected SGD, which needs no ``p x p`` matrix.  ``"auto"`` takes
        CG when its factors, the data and the stored ``K(X, Z)`` fit ``memory_budget``
        on one device with the data in memory, and EigenPro 3 otherwise (sharded
        centers, streamed data, large ``n p``: an iteration that evaluates
        ``K(X, Z)`` costs an EigenPro 3 epoch, and CG needs tens of them).  With every
        training point a center (``n_centers=None``), ``"cg"`` solves ``K + alpha
        W^-1`` (the KernelRidge solution): up to 10000 rows preconditioned with
        ``K(X, X)``'s own factor, which makes CG exact in a few iterations at
        ``O(n^3)`` cost; beyond, with a Nystrom preconditioner from the
        ``subsample_size`` rows that flattens the directions above ``alpha`` (``O(n
        q)`` memory, ``q <= 1000``), reading ``K(X, X)`` once per iteration from
        EigenPro 2's cache (or evaluating it).  ``"auto"`` takes CG whenever
        ``alpha_ > 0`` (up to 10000 rows only when the factors fit): a small
        penalty needs tens of EigenPro epochs and fewer CG iterations (VietNamI,
        ``alpha_`` 0.07: 22 against 31), except where the preconditioned system's
        estimated condition number exceeds 100 (a tiny ``alpha``): there EigenPro
        2 fits.  Without a penalty it takes EigenPro 2,
        whose early stopping regularises.  The choice is ``solver_``.  ``alpha >
        0`` with centers needs CG.
    distributed : bool, default=False
        EigenPro 3 only: shard the centers over the ranks of the initialised
        default ``torch.distributed`` process group (torchrun).  Every rank must
        call ``fit`` with the same data and parameters; each computes its shard's
        kernel columns, predictions and gradients are all-reduced, and every rank
        ends with the whole model.  ``device`` is then this rank's device.
    feature_learning : {"auto", "diagonal", "full"} or None, default="auto"
        Learn a metric of the features from the average gradient outer product
        (AGOP) of the fitted predictor, as Recursive Feature Machines and xRFM do
        (see ``skgpu_kernel.fit.feature_learning`` and the user guide):
        ``"diagonal"`` learns one scale per feature (and, for a categorical
        column, a block over its levels), ``"full"`` a Mahalanobis metric.
        ``"auto"`` is ``"diagonal"`` from 2000 rows in memory, in one process, for
        a kernel that declares its gradient, and no learning
        otherwise: measured on the real-data benchmark, learning never paid
        below, where it cost 1.3-3x the fit time
        (:func:`~skgpu_kernel.planning.agop.plan_feature_learning`); the choice is
        ``feature_learning_``.  Above 30000 rows the candidates are fitted on a
        seeded subsample sized by their cost
        (:func:`~skgpu_kernel.planning.agop.plan_learning_rows`), and only the
        one kept on every row.  ``validation_fraction`` of the rows (stratified
        for the classifier) score the plain model (candidate 0) and the learning path's models (the
        Laplacian kernel for a named kernel, your own kernel instance otherwise,
        with ``M = I`` and then each learnt metric, at the bandwidth and ``alpha``
        its rules chose for the first); a learnt model is kept only where its
        held-out losses are lower beyond their noise, and the chosen one is fitted
        again on every row.  Each fit runs through any solver.  Needs a kernel that
        declares its gradient (the radial kernels).  None: no learning.
    feature_learning_iter : int, default=5
        The most metric updates; the path also stops after two fits without a lower
        held-out loss.
    categorical_features : "from_dtype", array-like of bool, int or str, or None, \
default="from_dtype"
        The categorical columns of ``X``, as in
        :class:`~sklearn.ensemble.HistGradientBoostingRegressor`.
        ``"from_dtype"``: a DataFrame's ``category``, boolean and string columns (and
        object columns of strings), and a numpy object array's columns of strings; a
        boolean mask, integer indices or column names choose them; None: none.  Each
        becomes one 0/1 column per level seen in ``fit`` (one column for two levels),
        the 255 most frequent levels keeping their own and the rest sharing one;
        missing values are a level of their own; a level unknown at ``predict`` is
        zeros across its block, equidistant from every known level in the plain
        kernel.  Numeric columns may hold NaN (imputed by
        the training mean, with an indicator column where ``fit`` saw any), and are
        standardized when they are in different units (``column_scaling``).  A
        column of dates or times, and under ``"from_dtype"`` an object column
        mixing numbers and strings, is refused by name.  See :ref:`tables` and
        ``skgpu_kernel.tables``.
    column_scaling : {"auto", "standardize", "none"}, default="auto"
        Whether the numeric columns are standardized (their weighted training mean
        and standard deviation): ``"auto"`` where they are in different units, by
        :func:`~skgpu_kernel.planning.columns.plan_column_scaling`, and kept where
        they are already scaled or share one range (images, counts); the other two
        decide it, for example so that the folds of a cross-validation near the
        rule's thresholds cannot differ.  A memory-mapped ``X`` is read as it is
        unless ``"standardize"`` (which copies it).  The result is
        ``column_scaling_``.
"""

_COMMON_ATTRIBUTES = """
    device_ : str
        Device the model was trained on.
    dtype_ : numpy.dtype
        Training precision.
    memory_budget_ : int
        Bytes the fit planned with.
    kernel_ : Kernel
        The kernel with its resolved bandwidth.
    bandwidth_ : float or None
        Resolved bandwidth (None for kernels without one).
    X_offset_ : ndarray of shape (n_features,) or None
        Feature means subtracted before evaluating translation-invariant kernels.
    subsample_size_ : int
        Size ``s`` of the Nystrom subsample.
    top_eigenvalues_ : ndarray of shape ``(n_components_ + 1,)``
        Top eigenvalues of ``K / n`` estimated on the subsample, down to the level.
    n_components_ : int
        Number of flattened eigendirections.
    batch_capacity_ : int
        Measured batch capacity ``m_G`` of the device (or the given batch size).
    throughput_probe_ : dict
        Samples per second of kernel-block products by probed batch size.
    critical_batch_size_ : tuple of float
        ``(beta / lambda_1, beta / lambda_1')``: before and after preconditioning.
    batch_size_ : int
        Batch size used (after any halving on out-of-memory).
    scaling_rule_ : ScalingRule
        The resolved scaling rule (a copy of ``scaling_rule``).
    learning_rate_ : float
        Step size ``eta`` of the last update, at ``batch_size_``: the scaling rule's,
        halved once per divergence rollback.
    n_epochs_ : int
        Epochs run by the last call to ``fit`` (fewer than ``n_epochs`` when it
        stopped on convergence).
    intercept_ : float or ndarray of shape (n_outputs,)
        The unpenalised intercept added to the kernel model's output (see
        ``fit_intercept``; zero without it); an array for the classifier and for
        2-D targets.  In
        ``X``'s precision, as ``dual_coef_`` (see ``dtype``).
    alpha_ : float
        The ridge penalty used (``alpha`` resolved).  Where float rounding stops
        ``solver="cg"`` above its stated residual, the fit is redone from where it
        ended with ten times the penalty (at most three times, each with a
        ``ConvergenceWarning``), and ``alpha_`` is the penalty it ended with.
    fit_attempts_ : list of dict
        The record of what the last ``fit`` tried, in order.  Every solver run, the
        one that made the model last: ``{"solver": ..., "alpha": ..., "reason":
        ...}``, the reason being ``"planned"`` for the first and, for each later
        one, why the one before gave way (CG broken down by rounding and refitted
        with a larger penalty; CG on every point that diverged, refitted with its
        16-bit kernel cache in the training dtype or a larger penalty; EigenPro
        refitted with fewer preconditioner components; a model worse than the
        trivial predictor at the last check, refitted by the same changes; CG on
        every point too ill-conditioned and fitted by EigenPro 2, with a warning
        where the user named ``solver="cg"``; a kernel cache the device refused,
        fitted without it).  Where every attempt failed the last check, the fit
        keeps the trivial model (the intercept) with a ``ConvergenceWarning``.
        ``solver_`` and ``alpha_`` are the last run's.  Entries with an ``"event"``
        key are not solver runs: each time a stage ran out of device memory and
        went on smaller, ``{"event": "out_of_memory", "stage": ..., "solver": ...,
        "shrank": ..., "from": ..., "to": ..., "reason": ...}``, after the run it
        happened in (before the first run for the fits and AGOP of feature
        learning).  ``stage`` is ``"cache fill"`` (``shrank`` names the cache;
        ``"cached"`` to ``"evaluated"``: its blocks computed per product, or the fit
        planned again without it, the next entry), ``"preconditioner subsample"``
        (``subsample_size`` halved), ``"agop"`` (its row block halved),
        ``"validation"`` (the held-out rows' row block halved), ``"epoch batch"``
        (``batch_size`` halved); ``reason`` is the error's first line.  A block
        halved keeps the model, up to rounding; a smaller subsample or batch
        changes the fit's path.  Each halving of an EigenPro loop's step after a
        divergence is ``{"event": "diverged", "stage": "epoch", "solver": ...,
        "changed": "step size factor", "from": ..., "to": ..., "reason": ...}``.
        (Out of memory while predicting, the row block is halved too and a
        ``RuntimeWarning`` says so: predicting changes no fitted attribute.)
    fit_check_ : dict or None
        The last check of the fitted model: its weighted squared error on at most
        1024 evenly spaced training rows against the trivial predictor's (the
        rows' weighted mean), ``{"n_rows", "model_loss", "trivial_loss",
        "standard_error", "seconds", "passed"}``; a model worse than the trivial
        one by more than two standard errors is refitted (``fit_attempts_``).  None
        under a process group (``distributed=True``).
    alpha_selection_ : AlphaSelection or None
        With ``alpha="auto"`` or ``"loo"`` and a solver that takes a penalty: the
        leave-one-out errors of the candidate penalties behind ``alpha_`` and the
        features' coverage of the kernel; where ``"auto"`` found the coverage too
        low, the bandwidth search's exact criterion carried over (``carried=True``,
        with that coverage) or that coverage alone (``scored=False``)
        (:class:`skgpu_kernel.regularization.AlphaSelection`); None otherwise.
    bandwidth_selection_ : BandwidthSelection or None
        With ``bandwidth="auto"`` on a radial kernel: the bandwidths scored, their
        leave-one-out errors (NaN where not scored), the choice and the search's
        seconds (:class:`skgpu_kernel.regularization.BandwidthSelection`); None
        otherwise.
    early_stopping_ : bool
        Whether the fit held out a validation split (``early_stopping`` resolved;
        ``"auto"`` never holds one out for the CG solver, which converges to its
        exact solution).
    solver_ : {"eigenpro", "cg", "direct"}
        The solver used (``solver`` resolved).  ``"direct"`` (only from
        ``solver="auto"``, every training point a center, ``alpha_ > 0``): the
        exact kernel ridge solution, from the leave-one-out criterion's
        eigendecomposition where it scored every training row (at most 2000), else
        from one Cholesky factorisation of ``K + alpha W^-1`` (at most 10000 rows
        whose ``n x n`` float64 matrices fit ``memory_budget``); no iterative
        solver ran (``n_epochs_`` 0, an empty ``history_``; ``n_epochs``, an
        iteration bound, does not apply).  With ``"cg"`` the EigenPro decisions
        (``subsample_size_``, ``top_eigenvalues_``, ``n_components_``,
        ``batch_capacity_``, ``critical_batch_size_``, ``batch_size_``,
        ``learning_rate_``, ``projection_``) are None, and each ``history_`` record
        is a CG iteration (one pass over the data).  CG with every point a center
        beyond 10000 rows keeps EigenPro 2's subsample (for its preconditioner) and
        kernel cache: ``subsample_size_``, ``kernel_cached_`` and
        ``kernel_cache_dtype_`` are set.
    n_epochs_total_ : int
        Epochs run since the last fit without ``warm_start``.
    n_steps_total_ : int
        Updates made since the last fit without ``warm_start``: the count the
        scaling rule's schedule continues from.
    history_ : list of dict
        One record per epoch with the keys every estimator of the package shares
        (``skgpu_kernel.solvers.epochs.CORE_KEYS``): ``epoch``, ``n_steps``
        (updates made so far), ``train_loss`` (the mean squared residual of the
        centred targets over the epoch's batches, each measured before its step,
        plus the batches' shares of the penalty ``alpha a^T K a`` per sample), ``learning_rate`` (step
        size of the epoch's last update, at the epoch's batch size),
        ``validation_score`` (R^2 or accuracy on the held-out split; None without
        early stopping) and ``seconds``.
    centers_ : ndarray of shape ``(n_centers_, n_features)``
        Centers: the training points in the order of the internal shuffle
        (EigenPro 2), or the drawn or given centers (EigenPro 3).
    dual_coef_ : ndarray of shape ``(n_centers_, n_outputs)``
        Coefficients ``alpha`` of ``f(x) = sum_j alpha_j k(c_j, x)``.
    n_centers_ : int
        Number of centers ``p``.
    projection_ : {"exact", "iterative"} or None
        How EigenPro 3 projected onto the centers (None for EigenPro 2).
    kernel_cached_ : bool
        Whether the kernel rows the solver read (``K(X, X)`` for EigenPro 2 and CG on
        every point, with the validation rows' ``K(X_val, X)``; ``K(X, centers_)``
        for EigenPro 3 and CG on centers) were computed once and reused, see
        ``cache_kernel`` (the operator plan's storage, whatever the solver).
    kernel_cache_dtype_ : {"float64", "float32", "float16"} or None
        How the cached kernel was stored (None when not cached).
    kernel_grid_step_ : float or None
        When the fit's kernel blocks (EigenPro 2's and 3's caches or steps, CG's
        passes) came from exact squared distances because every feature of the rows
        and centers lies on a common grid of at most 256 levels (8-bit images,
        counts, codes), that grid's step; None otherwise (see
        :mod:`skgpu_kernel.grid` and
        :func:`skgpu_kernel.planning.operator.plan_operator`).  The distances are
        the same to the bit whether the device multiplies the codes in int8 or in
        float32, whichever is faster.  Predictions then take exact distances too,
        for rows that lie on the same grid (the test rows of 8-bit images); other
        rows take float blocks.
    streamed_ : bool
        Whether the memory-mapped ``X`` was streamed in buffers (EigenPro 3 only).
    n_temporary_centers_ : int
        Rows kept as temporary centers between projections (0 for EigenPro 2),
        from a cost model that balances their kernel work against the
        projection's cost.
    n_projections_ : int
        Projections made by the last fit (0 for EigenPro 2).
    feature_learning_ : {"diagonal", "full"} or None
        The feature learning the fit ran (``"auto"`` resolved); None: none.
    metric_ : ndarray of shape (n_encoded, n_encoded) or None
        The learnt metric ``M`` of the kernel ``k(||x - z||_M)`` on the encoded
        columns (``table_encoding_``; a categorical column's levels one block, with
        no entries to the other columns), the identity where a model without a
        learnt metric was kept; None where no learning ran.
    metric_transform_ : ndarray of shape (n_features,) or (n_features, n_features), or None
        ``L`` with ``M = L L^T`` (a vector for a diagonal ``L``): the model is the
        plain kernel machine on the rows ``X L``, in which ``centers_``,
        ``X_offset_`` and ``dual_coef_`` are expressed; None where no metric is
        applied.
    feature_importances_ : ndarray of shape (n_features,)
        Each input column's share of the learnt squared distances: ``M_jj`` times the
        variance of the column the kernel sees, ``tr(M_BB Cov_BB)`` over the block
        ``B`` of columns a category becomes, normalised to sum to 1 (for ``SelectFromModel``); it does not depend
        on a column's units.  Defined only where feature learning ran
        (``feature_learning_`` not None).
    table_encoding_ : TableEncoding
        How each input column became columns of the matrix the kernel sees (the
        encoded matrix of ``centers_``, ``metric_`` and ``dual_coef_``; see
        :class:`skgpu_kernel.tables.TableEncoding`).
    is_categorical_ : ndarray of shape (n_features,), bool
        The input columns taken as categorical (``categorical_features`` resolved).
    column_scaling_ : {"standardize", "none"}
        Whether the numeric columns were standardized on the training rows, or kept
        in their units (already scaled, or sharing one range: see
        :func:`skgpu_kernel.planning.columns.plan_column_scaling`).
    feature_learning_scores_ : list of float or None
        The held-out score (R^2 or accuracy) of each candidate: 0 the plain model,
        then the learning path's (its kernel with ``M = I``, then each learnt metric).
    feature_learning_iteration_ : int or None
        The candidate kept (0: the plain model).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape ``(n_features,)``
        Defined when ``X`` has string feature names.
"""


class AdaptiveKernelRegressor(RegressorMixin, _BaseAdaptiveKernel):
    __doc__ = (
        """Kernel regression by EigenPro 2: preconditioned SGD sized for the device.

    The model ``f(x) = sum_j alpha_j k(x_j, x)`` has a center at every training
    point and is trained on the square loss by mini-batch SGD with the EigenPro
    preconditioner.  Batch size and step size are derived from the kernel spectrum
    and from the device's measured capacity (memory and throughput); every decision
    is recorded in a fitted attribute.
"""
        + _COMMON_PARAMETERS
        + """
    Attributes
    ----------"""
        + _COMMON_ATTRIBUTES
        + """
    See Also
    --------
    AdaptiveKernelClassifier : The same machine for classification.
    sklearn.kernel_ridge.KernelRidge : Exact solve in O(n^3) time and O(n^2) memory.

    References
    ----------
    .. [1] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
       large batch training", SysML 2019. arXiv:1806.06144.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel import AdaptiveKernelRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(200, 2))
    >>> y = np.sin(3 * X[:, 0]) + X[:, 1] ** 2
    >>> model = AdaptiveKernelRegressor(bandwidth=0.5, n_epochs=20, random_state=0).fit(X, y)
    >>> bool(model.score(X, y) > 0.99)
    True
    """
    )

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
    __doc__ = (
        """Kernel classification by EigenPro 2: preconditioned SGD sized for the device.

    Regression on the square loss with targets ``+-1`` (binary) or one-hot columns
    (multiclass); ``predict`` takes the sign or the argmax of the scores returned by
    ``decision_function``.  The scores are not probabilities: ``predict_proba``
    scales them by a temperature fitted on rows a model of the same kernel did not
    train on (``calibration_temperature_``; the user guide's "Class probabilities").
"""
        + _COMMON_PARAMETERS
        + """    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (scikit-learn's
        semantics): a dict ``{label: weight}`` (classes not in it weigh 1), or
        ``"balanced"``, which weighs class ``c`` by ``n / (n_classes * n_c)`` with
        ``n_c`` its number of training samples (their total ``sample_weight`` when
        given), so that every class carries the same weight in the square loss.
        The weights also enter the intercept.
        With ``alpha="auto"`` they get a penalty chosen by the weighted
        leave-one-out misclassification rate, whatever the features' coverage:
        without one the model fits every training label and the weights change
        little (on digits with two classes cut to a tenth and 20% of the labels
        noisy, ``"balanced"`` raised those classes' recall by 0.21 on average over
        three splits; see ``tests/test_bandwidth_selection.py``).  They weigh the
        probabilities' calibration too: ``predict_proba`` is then calibrated to the
        reweighted population (with ``"balanced"``, one where every class is as
        frequent), not to the class frequencies of the data.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    calibration_temperature_ : float
        ``T`` of :meth:`predict_proba` (``sigmoid(s / T)``, ``softmax(S / T)``): the
        temperature of least weighted log loss on decision values of rows that a
        model of the final kernel and metric did not train on (``calibration_``).
        See the user guide's "Class probabilities".
    calibration_ : {"held-out", "final-held-out", "cross-fitted", "none"}
        Where those decision values came from
        (:func:`~skgpu_kernel.planning.agop.plan_calibration`): up to 30000 rows,
        ``validation_fraction`` of the rows held out from the chosen candidate of
        feature learning or from one extra fit of the plain model (the model itself
        is the fit on every row); above, 2000 rows the final model is fitted
        without; under 100 rows, five folds cross-fitted; ``"none"`` (``T = 1``, and
        ``predict_proba`` warns) for data streamed from a file and over a process
        group.  With ``class_weight`` or ``sample_weight`` the temperature is
        calibrated to the reweighted population.
        A warm start keeps the temperature and ``calibration_`` of the fit it continues."""
        + _COMMON_ATTRIBUTES
        + """
    See Also
    --------
    AdaptiveKernelRegressor : The same machine for regression.
    sklearn.calibration.CalibratedClassifierCV : Other calibrations of the scores.

    References
    ----------
    .. [1] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
       large batch training", SysML 2019. arXiv:1806.06144.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from skgpu_kernel import AdaptiveKernelClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> model = AdaptiveKernelClassifier(random_state=0).fit(X[:1000] / 16, y[:1000])
    >>> bool(model.score(X[1000:] / 16, y[1000:]) > 0.95)
    True
    """
    )

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
