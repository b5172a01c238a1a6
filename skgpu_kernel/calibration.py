"""Class probabilities from a kernel classifier's decision values, by temperature scaling.

The classifiers regress codes (``+-1`` for two classes, one-hot columns for more),
so their decision values are not probabilities.  One positive scalar ``T`` turns
them into probabilities: ``sigmoid(s / T)`` for two classes and ``softmax(S / T)``
for more (temperature scaling, Guo et al., 2017).  ``T`` minimises the weighted
log loss of decision values the package holds out itself (see
``skgpu_kernel.fit.feature_learning``).  One
positive scale keeps the order of the decision values: the most probable class is
the one ``predict`` returns, and a binary ``predict_proba`` ranks rows as
``decision_function`` does.
"""

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_expit, log_softmax

__all__ = ["fit_temperature", "log_probabilities"]

# log T is searched in [-LOG_TEMPERATURE_BOUND, LOG_TEMPERATURE_BOUND]: decision values
# are on the codes' scale (about 1), so the optimum lies far inside.
LOG_TEMPERATURE_BOUND = 10.0


def log_probabilities(decisions, temperature):
    """Log class probabilities of decision values at ``temperature``: shape (n, 2) or (n, l).

    Parameters
    ----------
    decisions : ndarray of shape (n,) or (n, l)
        One column (two classes) or one per class.
    temperature : float
        Positive.

    Returns
    -------
    ndarray of shape (n, max(l, 2))
        Computed in float64, returned in the decision values' dtype (float32 in,
        float32 out, as the estimators' other outputs).
    """
    decisions = np.asarray(decisions)
    scaled = decisions.astype(np.float64) / temperature
    if scaled.ndim == 1 or scaled.shape[1] == 1:
        scaled = scaled.reshape(-1)
        logs = np.column_stack([log_expit(-scaled), log_expit(scaled)])
    else:
        logs = log_softmax(scaled, axis=1)
    return logs.astype(np.result_type(decisions.dtype, np.float32), copy=False)


def fit_temperature(decisions, targets, weights):
    """The temperature of least weighted log loss of held-out rows' decision values, or 1.0.

    The loss is taken against smoothed targets, Platt's rule over the ``n``
    held-out rows: ``(n + 1) / (n + 2)`` on a row's class and the rest evenly on the
    others.  Held-out rows that the decision values separate without error
    then set a finite temperature, where the plain log loss falls towards ``T =
    0`` and probabilities of exactly 0 and 1.  1.0 where the held-out rows cannot
    set it: fewer than two rows, a single class among them, or no positive weight.

    Parameters
    ----------
    decisions : ndarray of shape (n, l)
        Decision values of rows the fit did not train on: ``l = 1`` (two classes,
        positive means the second) or one column per class.
    targets : ndarray of shape (n, l)
        The codes the classifier regressed (``+-1``, or one-hot).
    weights : ndarray of shape (n,)
        Sample weights, class weights included.

    Returns
    -------
    float
    """
    labels = (targets[:, 0] > 0).astype(int) if targets.shape[1] == 1 else targets.argmax(axis=1)
    weights = np.asarray(weights, dtype=np.float64)
    if labels.shape[0] < 2 or np.unique(labels).shape[0] < 2 or weights.sum() <= 0:
        return 1.0
    smoothed = _smoothed_targets(labels, max(targets.shape[1], 2))

    def loss(log_temperature):
        log_p = log_probabilities(decisions, np.exp(log_temperature))
        return -float(np.dot(weights, (smoothed * log_p).sum(axis=1))) / float(weights.sum())

    bound = LOG_TEMPERATURE_BOUND
    best = minimize_scalar(loss, bounds=(-bound, bound), method="bounded", options={"xatol": 1e-6})
    return float(np.exp(best.x))


def _smoothed_targets(labels, n_classes):
    """Platt's targets over every held-out row: ``(n + 1) / (n + 2)`` on a row's class, the rest evenly elsewhere."""
    own = (labels.shape[0] + 1.0) / (labels.shape[0] + 2.0)
    smoothed = np.full((labels.shape[0], n_classes), (1.0 - own) / (n_classes - 1))
    smoothed[np.arange(labels.shape[0]), labels] = own
    return smoothed
