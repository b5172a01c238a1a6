"""The last check of a kernel fit: the model against the trivial predictor, on rows it did not fit where it has some.

Every model a solver returns is scored against the trivial predictor.  Where the fit
held rows out (its early-stopping split), the check scores at most
:func:`~skgpu_kernel.planning.stopping.held_out_check_limit` of them with the task's
own score: a classifier's misclassifications against the class prior's (the majority
class), and the squared error of its codes against the prior's codes; a regressor's
squared error against the training rows' weighted mean.  An unpenalised kernel model
fits its own rows, so on those the check could not see it fail.  Elsewhere (a
penalised fit, which has no split) it scores at most
:data:`~skgpu_kernel.planning.stopping.FIT_CHECK_ROWS` of the training rows' squared
errors against their weighted mean.  Rows are evenly spaced: no random draw, so the
fit's random stream is untouched.  A model worse than the trivial one beyond noise
(:func:`~skgpu_kernel.planning.stopping.worse_than_trivial`) is a fit that went
wrong, whatever its solver reported: the driver then tries the next safe change
(:func:`~skgpu_kernel.fit.solve.run_solver`).  ``better`` says whether it is better
beyond noise (:func:`~skgpu_kernel.planning.stopping.better_than_trivial`): where an
unpenalised fit is not, interpolation did not pay and the driver refits with a
penalty.  The cost is one prediction of those rows against the model's centers.
"""

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..planning.stopping import (
    FIT_CHECK_ROWS,
    HELD_OUT_CHECK_ROWS,
    better_than_trivial,
    fit_check_rows,
    worse_than_trivial,
)

__all__ = ["FitCheck", "check_fit"]


@dataclass(frozen=True)
class FitCheck:
    """What the last check measured (``fit_check_``).

    Attributes
    ----------
    n_rows : int
        Rows scored.
    model_loss, trivial_loss : float
        The model's and the trivial predictor's weighted mean errors in ``score``
        (squared errors summed over the outputs).
    standard_error : float
        Of the mean paired difference of the two.
    seconds : float
    passed : bool
        The model is not worse than the trivial predictor beyond noise (in
        ``score``, and for a classifier in the squared error of its codes too).
    held_out : bool, default=False
        The rows scored are rows the model did not fit.
    score : {"squared error", "misclassification"}, default="squared error"
    better : bool, default=False
        The model is better than the trivial predictor beyond noise (for a
        classifier, in misclassifications or in the squared error of its codes).
    squared_error : tuple of float or None, default=None
        A classifier's ``(model, trivial, standard error)`` squared errors of its codes.
    """

    n_rows: int
    model_loss: float
    trivial_loss: float
    standard_error: float
    seconds: float
    passed: bool
    held_out: bool = False
    score: str = "squared error"
    better: bool = False
    squared_error: tuple | None = None

    @property
    def margin(self):
        """The trivial predictor's error less the model's, in ``score`` (positive: the model is better)."""
        return self.trivial_loss - self.model_loss

    def record(self):
        """As ``fit_check_`` holds it."""
        record = {
            "n_rows": self.n_rows,
            "held_out": self.held_out,
            "score": self.score,
            "model_loss": self.model_loss,
            "trivial_loss": self.trivial_loss,
            "standard_error": self.standard_error,
            "seconds": self.seconds,
            "passed": self.passed,
            "better": self.better,
        }
        if self.squared_error is not None:
            record["squared_error"] = dict(zip(("model", "trivial", "standard_error"), self.squared_error, strict=True))
        return record

    def describe(self):
        """One line for ``verbose``."""
        where = "held-out" if self.held_out else "training"
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"last check {verdict}: {self.score} {self.model_loss:.4g} against the trivial predictor's "
            f"{self.trivial_loss:.4g} (standard error {self.standard_error:.2g}) on {self.n_rows} {where} rows "
            f"({self.seconds:.2f} s)"
        )


def check_fit(predict, Y, weights, trivial=None, labels=None, limit=None):
    """Score the model ``predict(indices) -> predictions`` on a bounded sample of the rows of ``(Y, weights)``.

    Parameters
    ----------
    predict : callable
        ``predict(indices)`` gives the model's predictions of ``Y[indices]`` (a
        tensor or array of shape (m, l)) for an ndarray of row indices.
    Y : ndarray of shape (n, l)
        The targets of the rows scored: the training rows the model was fitted to,
        or rows it did not fit (``trivial`` given).
    weights : ndarray of shape (n,)
    trivial : ndarray of shape (l,) or None, default=None
        Given, the rows are held out and this is the trivial prediction (the
        training rows' weighted mean, a classifier's prior codes), not the rows' own
        mean.  None: training rows, whose weighted mean is the trivial prediction.
    labels : ndarray of shape (n,) or None, default=None
        A classifier's class indices of the rows (its codes: ``+-1`` in one column,
        1 the positive class, else one-hot): misclassifications are scored first.
    limit : int or None, default=None
        The most rows scored (evenly spaced).  None: ``FIT_CHECK_ROWS`` for training
        rows, ``HELD_OUT_CHECK_ROWS`` for held-out ones; a fit passes
        :func:`~skgpu_kernel.planning.stopping.held_out_check_limit` of its training rows.

    Returns
    -------
    FitCheck

    Examples
    --------
    >>> import numpy as np
    >>> Y = np.arange(10.0)[:, None]
    >>> check_fit(lambda rows: Y[rows], Y, np.ones(10)).passed
    True
    >>> check_fit(lambda rows: -10 * Y[rows], Y, np.ones(10)).passed
    False
    >>> codes = np.where(np.arange(10) < 3, 1.0, -1.0)[:, None]
    >>> labels = (codes[:, 0] > 0).astype(int)
    >>> check = check_fit(lambda rows: codes[rows], codes, np.ones(10), np.array([-0.4]), labels)
    >>> check.score, check.model_loss, round(check.trivial_loss, 6), check.better
    ('misclassification', 0.0, 0.3, True)
    """
    tic = time.perf_counter()
    held_out = trivial is not None
    if limit is None:
        limit = HELD_OUT_CHECK_ROWS if held_out else FIT_CHECK_ROWS
    rows = fit_check_rows(Y.shape[0], limit)
    predictions = predict(rows)
    if isinstance(predictions, torch.Tensor):
        predictions = predictions.detach().cpu().double().numpy()
    targets = np.asarray(Y[rows], dtype=np.float64).reshape(rows.size, -1)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(targets.shape)
    w = np.asarray(weights[rows], dtype=np.float64)
    w = w / max(w.sum(), 1e-300)
    trivial = np.asarray(trivial, dtype=np.float64) if held_out else w @ targets
    scored = {"n_rows": int(rows.size), "held_out": held_out}
    check = _paired_check(
        np.square(predictions - targets).sum(axis=1), np.square(trivial - targets).sum(axis=1), w, **scored
    )
    if labels is not None:
        taken = np.asarray(labels)[rows]
        misclassified = _paired_check(
            (_classes(predictions) != taken).astype(np.float64),
            (_classes(trivial[None, :]) != taken).astype(np.float64),
            w,
            score="misclassification",
            **scored,
        )
        check = dataclasses.replace(
            misclassified,
            passed=misclassified.passed and check.passed,
            better=misclassified.better or check.better,
            squared_error=(check.model_loss, check.trivial_loss, check.standard_error),
        )
    return dataclasses.replace(check, seconds=time.perf_counter() - tic)


def _paired_check(model_errors, trivial_errors, w, **scored):
    """The check of two errors row by row: their weighted means, and the standard error of their mean difference."""
    if not np.all(np.isfinite(model_errors)):
        return FitCheck(
            model_loss=math.inf,
            trivial_loss=float(w @ trivial_errors),
            standard_error=0.0,
            seconds=0.0,
            passed=False,
            **scored,
        )
    differences = model_errors - trivial_errors
    mean_difference = float(w @ differences)
    # The weighted mean's standard error with Kish's effective number of rows.
    effective = 1.0 / max(float(np.square(w).sum()), 1e-300)
    spread = float(w @ np.square(differences - mean_difference))
    standard_error = math.sqrt(spread / max(effective - 1.0, 1.0))
    return FitCheck(
        model_loss=float(w @ model_errors),
        trivial_loss=float(w @ trivial_errors),
        standard_error=standard_error,
        seconds=0.0,
        passed=not worse_than_trivial(mean_difference, standard_error),
        better=better_than_trivial(mean_difference, standard_error),
        **scored,
    )


def _classes(codes):
    """The class indices of a classifier's codes: ``+-1`` in one column (1 is the positive class), else one-hot."""
    if codes.shape[1] == 1:
        return (codes[:, 0] > 0).astype(np.int64)
    return np.argmax(codes, axis=1)
