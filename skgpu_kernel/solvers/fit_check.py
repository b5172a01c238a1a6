"""The last check of a kernel fit: the model against the trivial predictor, on rows it did not fit where it has some.

Every model a solver returns is scored against the trivial predictor.  Where the fit
held rows out (its early-stopping split), the check scores at most
:data:`~skgpu_kernel.planning.stopping.HELD_OUT_CHECK_ROWS` of them with the task's
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

__all__ = ["FitCheck", "HeldOutRows", "check_fit"]


@dataclass(frozen=True)
class HeldOutRows:
    """What the check compares on rows the model did not fit.

    Attributes
    ----------
    trivial : ndarray of shape (l,)
        The trivial prediction of the targets as scored (the training rows' weighted
        mean, the class prior of a classifier's codes), not the held-out rows' own.
    labels : ndarray of shape (m,) or None
        A classifier's class indices of the rows: the check then scores
        misclassifications first.
    shift : ndarray of shape (l,) or None
        Added to predictions (and to ``trivial``) before their classes are read: the
        intercept the targets as scored are centred by.
    """

    trivial: np.ndarray
    labels: np.ndarray | None = None
    shift: np.ndarray | None = None


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


@dataclass(frozen=True)
class _Paired:
    """Weighted means of two errors row by row, and the standard error of their mean difference."""

    model: float
    trivial: float
    difference: float
    standard_error: float

    @classmethod
    def of(cls, model_errors, trivial_errors, w):
        differences = model_errors - trivial_errors
        mean_difference = float(w @ differences)
        if not np.all(np.isfinite(model_errors)):
            return cls(math.inf, float(w @ trivial_errors), math.inf, 0.0)
        # The weighted mean's standard error with Kish's effective number of rows.
        effective = 1.0 / max(float(np.square(w).sum()), 1e-300)
        spread = float(w @ np.square(differences - mean_difference))
        standard_error = math.sqrt(spread / max(effective - 1.0, 1.0))
        return cls(float(w @ model_errors), float(w @ trivial_errors), mean_difference, standard_error)

    @property
    def worse(self):
        return worse_than_trivial(self.difference, self.standard_error)

    @property
    def better(self):
        return better_than_trivial(self.difference, self.standard_error)


def check_fit(predict, Y, weights, held_out=None):
    """Score the model ``predict(indices) -> predictions`` on a bounded sample of the rows of ``(Y, weights)``.

    Parameters
    ----------
    predict : callable
        ``predict(indices)`` gives the model's predictions of ``Y[indices]`` (a
        tensor or array of shape (m, l)) for an ndarray of row indices.
    Y : ndarray of shape (n, l)
        The targets of the rows scored: the training rows the model was fitted to,
        or rows it did not fit (``held_out``).
    weights : ndarray of shape (n,)
    held_out : HeldOutRows or None, default=None
        Given, the rows are held out: the trivial prediction is the one it names,
        and a classifier's misclassifications are scored.  None: training rows, whose
        weighted mean is the trivial prediction.

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
    >>> prior = HeldOutRows(np.array([-0.4]), labels=(codes[:, 0] > 0).astype(int))
    >>> check = check_fit(lambda rows: codes[rows], codes, np.ones(10), prior)
    >>> check.score, check.model_loss, round(check.trivial_loss, 6), check.better
    ('misclassification', 0.0, 0.3, True)
    """
    tic = time.perf_counter()
    rows = fit_check_rows(Y.shape[0], FIT_CHECK_ROWS if held_out is None else HELD_OUT_CHECK_ROWS)
    predictions = predict(rows)
    if isinstance(predictions, torch.Tensor):
        predictions = predictions.detach().cpu().double().numpy()
    targets = np.asarray(Y[rows], dtype=np.float64).reshape(rows.size, -1)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(targets.shape)
    w = np.asarray(weights[rows], dtype=np.float64)
    w = w / max(w.sum(), 1e-300)
    trivial = w @ targets if held_out is None else np.asarray(held_out.trivial, dtype=np.float64)
    squared = _Paired.of(np.square(predictions - targets).sum(axis=1), np.square(trivial - targets).sum(axis=1), w)
    if held_out is None or held_out.labels is None:
        return FitCheck(
            n_rows=int(rows.size),
            model_loss=squared.model,
            trivial_loss=squared.trivial,
            standard_error=squared.standard_error,
            seconds=time.perf_counter() - tic,
            passed=not squared.worse,
            held_out=held_out is not None,
            better=squared.better,
        )
    labels = np.asarray(held_out.labels)[rows]
    shift = 0.0 if held_out.shift is None else np.asarray(held_out.shift, dtype=np.float64)
    misclassified = _Paired.of(
        (_classes(predictions + shift) != labels).astype(np.float64),
        (_classes((trivial + shift)[None, :]) != labels).astype(np.float64),
        w,
    )
    return FitCheck(
        n_rows=int(rows.size),
        model_loss=misclassified.model,
        trivial_loss=misclassified.trivial,
        standard_error=misclassified.standard_error,
        seconds=time.perf_counter() - tic,
        passed=not (misclassified.worse or squared.worse),
        held_out=True,
        score="misclassification",
        better=misclassified.better or squared.better,
        squared_error=(squared.model, squared.trivial, squared.standard_error),
    )


def _classes(codes):
    """The class indices of a classifier's codes: ``+-1`` in one column (1 is the positive class), else one-hot."""
    if codes.shape[1] == 1:
        return (codes[:, 0] > 0).astype(np.int64)
    return np.argmax(codes, axis=1)
