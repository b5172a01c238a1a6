"""Buffered mini-batch SGD (BMGD) linear models: thin scikit-learn shells.

fit = validate (or open an out-of-core source) and encode the targets -> resolve
the runtime (device, dtype, memory budget, seed, parallel workers) -> call
:func:`~skgpu_kernel.bmgd_fit.fit_bmgd_model`, which splits, measures,
plans and runs BMGD in this process or on the workers -> store its result as numpy
fitted attributes.  What the two estimators share is in ``_linear_base.py``; here
are their targets, losses and predictions; their docstrings are in ``_linear_docs.py``.
"""

import dataclasses
from numbers import Real
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import ClassifierMixin, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets

from ._linear_base import BaseBufferedSGD, LinearTargets
from ._linear_docs import CLASSIFIER_DOC, DATA_SOURCES, REGRESSOR_DOC
from ._validation import class_weighted

__all__ = ["BufferedSGDClassifier", "BufferedSGDRegressor"]


class BufferedSGDRegressor(RegressorMixin, BaseBufferedSGD):
    __doc__ = REGRESSOR_DOC

    _parameter_constraints: ClassVar[dict] = {
        **BaseBufferedSGD._parameter_constraints,
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
        DATA_SOURCES
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
        return LinearTargets(targets, targets.shape[1], single=single)

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


class BufferedSGDClassifier(ClassifierMixin, BaseBufferedSGD):
    __doc__ = CLASSIFIER_DOC

    _parameter_constraints: ClassVar[dict] = {
        **BaseBufferedSGD._parameter_constraints,
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
        DATA_SOURCES
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
        return LinearTargets(labels, 1 if known.shape[0] == 2 else known.shape[0], classes=known)

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
