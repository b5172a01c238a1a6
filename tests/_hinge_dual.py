"""Lower bounds of the penalised hinge's optimum by weak duality: references the tests do not take from the package.

The one-vs-rest hinge ``mean_i w_i sum_c max(0, 1 - y_ic s_ic) + alpha / 2 ||W||^2``
(the intercepts unpenalised) separates by column; each column's dual is
``max sum(a) - ||X^T (a y)||^2 / (2 alpha)`` over ``0 <= a_i <= w_i / n`` with
``sum(a_i y_i) = 0``.  Every feasible ``a`` bounds the column's optimum from below.
"""

import numpy as np
from sklearn.svm import SVC


def _column_bound(X, y, dual, alpha):
    """The dual objective at ``dual`` (in its box), its larger class scaled down to meet the equality."""
    dual = dual.copy()
    positive, negative = dual[y > 0].sum(), dual[y < 0].sum()
    dual[y > 0] *= min(1.0, negative / positive) if positive > 0 else 0.0
    dual[y < 0] *= min(1.0, positive / negative) if negative > 0 else 0.0
    direction = X.T @ (dual * y)
    return max(0.0, float(dual.sum() - direction @ direction / (2.0 * alpha)))


def hinge_dual_bound(X, signs, weights, scores, alpha, width):
    """The bound at the dual point of the hinge smoothed over ``width``, read at ``scores``.

    That point is the smoothed optimum's own dual where ``scores`` are that optimum's.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    signs : ndarray of shape (n, l), entries -1 or +1
    weights : ndarray of shape (n,)
    scores : ndarray of shape (n, l)
    alpha : float
    width : float
    """
    n = X.shape[0]
    total = 0.0
    for column in range(signs.shape[1]):
        y = signs[:, column]
        dual = np.clip((1.0 - y * scores[:, column]) / width, 0.0, 1.0) * weights / n
        total += _column_bound(X, y, dual, alpha)
    return total


def libsvm_dual_bound(X, signs, weights, alpha, tol=1e-8):
    """The bound at libsvm's dual solution of each column (``C = 1 / (alpha n)``): tight to ``tol``."""
    n = X.shape[0]
    total = 0.0
    for column in range(signs.shape[1]):
        y = signs[:, column]
        svm = SVC(kernel="linear", C=1.0 / (alpha * n), tol=tol).fit(X, y, sample_weight=weights)
        dual = np.zeros(n)
        # libsvm's dual variables of 0.5 ||w||^2 + C sum(w_i hinge_i), divided by C n: this problem's.
        dual[svm.support_] = np.abs(svm.dual_coef_[0]) * alpha
        total += _column_bound(X, y, np.minimum(dual, weights / n), alpha)
    return total
