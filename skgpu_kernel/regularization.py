"""The ridge penalty of ``alpha="auto"``: leave-one-out error of a Nystrom ridge model.

A kernel model regularised only by early stopping follows the path of gradient
descent, which on noisy targets can stay several percent above the best ridge
solution at every epoch (on the HI data set of the real-data benchmark the best
epoch was 4.8% above ``Nystroem(2000) + RidgeCV``; with that model's ``alpha``
EigenPro 2 converged to 0.05% of it).  ``alpha="auto"`` therefore chooses the
penalty as scikit-learn's ``RidgeCV`` does, by the exact leave-one-out error of a
linear smoother, on the Nystrom features the preconditioner's subsample defines:

    ``phi(x) = K(x, X_S) U_k Lambda_k^{-1/2}``   (``K_SS = U Lambda U^T``, k resolvable
    eigenvalues),

for which ``||beta||^2`` is the RKHS norm of ``f = phi^T beta``, so that the ridge
problem ``sum_i w_i (f(x_i) - y_i)^2 + alpha ||f||^2`` has the same ``alpha`` as
:class:`sklearn.kernel_ridge.KernelRidge` and as the estimators' ``alpha``.  The
leave-one-out residuals come from one eigendecomposition of the k x k Gram of the
(weighted, centred) features, for every candidate at once (the intercept's leverage
``w_i / sum(w)`` included, as ``RidgeCV(fit_intercept=True)``).

Candidates are per-sample penalties ``alpha / sum(w)`` on a log grid; at most
``GCV_MAX_ROWS`` rows are scored and the chosen per-sample penalty is scaled to the
whole training set.  Cost: ``K(rows, X_S)`` (rows x s kernel entries), a rows x k^2
product and an s x s and a k x k eigendecomposition, well under one epoch of
EigenPro 2.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from .blockwise import kernel_matmul
from .preconditioner import max_usable_components, nystrom_eigensystem

__all__ = ["GCV_MAX_ROWS", "PENALTY_GRID", "AlphaSelection", "select_alpha"]

# Rows scored by the leave-one-out criterion (a rows x s float64 feature matrix).
GCV_MAX_ROWS = 20_000
# Candidate per-sample penalties alpha / sum(w): from nearly interpolating to
# nearly the constant model, half a decade apart.
PENALTY_GRID = np.logspace(-9, 0, 19)
_COLUMN_BLOCK = 2048


@dataclass(frozen=True)
class AlphaSelection:
    """The chosen ``alpha`` and the criterion behind it.

    Attributes
    ----------
    alpha : float
        For the rows scored (``penalty * sum(w)``).
    penalty : float
        The chosen per-sample penalty ``alpha / sum(w)``.
    penalties, loo_errors : ndarray
        The candidates and their weighted mean leave-one-out squared errors.
    n_rows, n_features : int
        Rows scored and Nystrom features used.
    """

    alpha: float
    penalty: float
    penalties: np.ndarray
    loo_errors: np.ndarray
    n_rows: int
    n_features: int


def select_alpha(kernel, X, Y, weights, subsample_size):
    """Choose the ridge penalty by the leave-one-out error of a Nystrom ridge model.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
        Rows in random order, on the compute device (features as the kernel sees
        them), every one scored (callers pass at most ``GCV_MAX_ROWS``); the first
        ``subsample_size`` are the Nystrom subsample.  The caller scales the chosen
        ``penalty`` to a larger training set.
    Y : Tensor of shape (n, l)
        Targets in the same order.
    weights : Tensor of shape (n,) or None
    subsample_size : int

    Returns
    -------
    AlphaSelection
    """
    rows, Y = X.shape[0], Y.double()
    w = torch.ones(rows, dtype=torch.float64, device=X.device) if weights is None else weights.double()
    features = _nystrom_features(kernel, X, min(subsample_size, rows))
    sqrt_w = w.sqrt()[:, None]
    mean = lambda values: (w[:, None] * values).sum(dim=0) / w.sum()  # noqa: E731
    features = sqrt_w * (features - mean(features))
    targets = sqrt_w * (Y - mean(Y))
    errors = _loo_errors(features, targets, w / w.sum(), PENALTY_GRID * float(w.sum()))
    best = int(np.argmin(errors))
    penalty = float(PENALTY_GRID[best])
    total = float(w.sum())
    return AlphaSelection(penalty * total, penalty, PENALTY_GRID, errors / total, rows, features.shape[1])


def _nystrom_features(kernel, X, subsample_size):
    """``K(X, X_S) U_k Lambda_k^{-1/2}`` in float64 for the resolvable eigenvalues of ``K_SS``."""
    eigenvalues, eigenvectors = nystrom_eigensystem(kernel, X[:subsample_size])
    k = max(max_usable_components(eigenvalues, X.dtype), 1)
    vectors = eigenvectors[:, :k].to(X.dtype)
    centers = kernel.prepare_centers(X[:subsample_size])
    projected = kernel_matmul(kernel, X, centers, vectors, _COLUMN_BLOCK).double()
    # eigenvectors are U / sqrt(s) and eigenvalues those of K_SS / s: U Lambda^{-1/2} is their ratio.
    scale = torch.as_tensor(eigenvalues[:k], dtype=torch.float64, device=X.device).clamp_min(1e-300).rsqrt()
    return projected * scale


def _loo_errors(features, targets, leverage_of_intercept, alphas):
    """Weighted sum of squared leave-one-out residuals of ridge on ``features`` for each alpha.

    With ``features = Q S V^T``, the hat matrix is ``Q diag(s^2 / (s^2 + alpha)) Q^T``
    plus the intercept's ``w_i / sum(w)``; residual ``i`` left out is the fitted
    residual over ``1 - h_ii``.
    """
    gram = features.T @ features
    squares, vectors = torch.linalg.eigh(gram)
    keep = squares > squares.max() * 1e-12
    squares, vectors = squares[keep], vectors[:, keep]
    basis = (features @ vectors) * squares.rsqrt()
    coordinates = basis.T @ targets
    basis_squared = basis**2
    errors = []
    for alpha in alphas:
        shrink = squares / (squares + alpha)
        fitted = basis @ (shrink[:, None] * coordinates)
        leverage = basis_squared @ shrink + leverage_of_intercept
        residuals = (targets - fitted) / (1.0 - leverage).clamp_min(1e-12)[:, None]
        errors.append(float((residuals**2).sum()))
    errors = np.asarray(errors)
    return np.where(np.isfinite(errors), errors, math.inf)
