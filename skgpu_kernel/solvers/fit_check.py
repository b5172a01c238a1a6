"""The last check of a kernel fit: the model against the trivial predictor on rows it can score cheaply.

Every model a solver returns is scored on at most
:data:`~skgpu_kernel.planning.stopping.FIT_CHECK_ROWS` of its own training rows
(evenly spaced: no random draw, so the fit's random stream is untouched) against
the trivial predictor, the weighted mean of those rows' targets (the class prior of
a classifier's one-hot targets).  A model worse than it beyond noise
(:func:`~skgpu_kernel.planning.stopping.worse_than_trivial`) is a fit that went
wrong, whatever its solver reported: the driver then tries the next safe change
(:func:`~skgpu_kernel.fit.solve.run_solver`).  The cost is one
prediction of those rows against the model's centers: ``1024 x p`` kernel entries,
at most one epoch's ``1024 / n``.
"""

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..planning.stopping import fit_check_rows, worse_than_trivial

__all__ = ["FitCheck", "check_fit"]


@dataclass(frozen=True)
class FitCheck:
    """What the last check measured (``fit_check_``).

    Attributes
    ----------
    n_rows : int
        Training rows scored.
    model_loss, trivial_loss : float
        Weighted mean squared errors of the model and of the trivial predictor,
        summed over the outputs.
    standard_error : float
        Of the mean paired difference of the two.
    seconds : float
    passed : bool
        The model is not worse than the trivial predictor beyond noise.
    """

    n_rows: int
    model_loss: float
    trivial_loss: float
    standard_error: float
    seconds: float
    passed: bool

    def record(self):
        """As ``fit_check_`` holds it."""
        return {
            "n_rows": self.n_rows,
            "model_loss": self.model_loss,
            "trivial_loss": self.trivial_loss,
            "standard_error": self.standard_error,
            "seconds": self.seconds,
            "passed": self.passed,
        }


def check_fit(predict, Y, weights):
    """Score the model ``predict(indices) -> predictions`` on a bounded sample of the rows of ``(Y, weights)``.

    Parameters
    ----------
    predict : callable
        ``predict(indices)`` gives the model's predictions of ``Y[indices]`` (a
        tensor or array of shape (m, l)) for an ndarray of row indices.
    Y : ndarray of shape (n, l)
        The targets the model was fitted to.
    weights : ndarray of shape (n,)

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
    """
    tic = time.perf_counter()
    rows = fit_check_rows(Y.shape[0])
    predictions = predict(rows)
    if isinstance(predictions, torch.Tensor):
        predictions = predictions.detach().cpu().double().numpy()
    targets = np.asarray(Y[rows], dtype=np.float64).reshape(rows.size, -1)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(targets.shape)
    w = np.asarray(weights[rows], dtype=np.float64)
    w = w / max(w.sum(), 1e-300)
    trivial = w @ targets
    model_errors = np.square(predictions - targets).sum(axis=1)
    trivial_errors = np.square(trivial - targets).sum(axis=1)
    differences = model_errors - trivial_errors
    mean_difference = float(w @ differences)
    if not np.all(np.isfinite(predictions)):
        mean_difference, standard_error = math.inf, 0.0
    else:
        # The weighted mean's standard error with Kish's effective number of rows.
        effective = 1.0 / max(float(np.square(w).sum()), 1e-300)
        spread = float(w @ np.square(differences - mean_difference))
        standard_error = math.sqrt(spread / max(effective - 1.0, 1.0))
    return FitCheck(
        n_rows=int(rows.size),
        model_loss=float(w @ model_errors) if math.isfinite(mean_difference) else math.inf,
        trivial_loss=float(w @ trivial_errors),
        standard_error=standard_error,
        seconds=time.perf_counter() - tic,
        passed=not worse_than_trivial(mean_difference, standard_error),
    )
