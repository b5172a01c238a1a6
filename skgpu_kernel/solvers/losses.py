"""Losses of the linear SGD models: value and gradient with respect to the scores.

Each loss maps scores ``S = X W + b`` of shape (m, l) and targets to the loss of
each sample, shape (m,), and ``dL/dS``, shape (m, l).  Regression targets are float (m, l);
classification targets are class indices (m,) in int64, turned into what the loss
needs on the device.  ``curvature`` bounds the second derivative of the loss in the
scores, which scales the spectrum that analytic step rules see.
"""

import torch
import torch.nn.functional as F

__all__ = ["LOSSES", "HingeLoss", "HuberLoss", "LogLoss", "SmoothedHingeLoss", "SquaredLoss", "make_loss"]


class SquaredLoss:
    """``(s - y)^2 / 2``."""

    curvature = 1.0

    def __call__(self, scores, targets):
        residual = scores - targets
        return 0.5 * (residual * residual).sum(dim=1), residual


class HuberLoss:
    """Squared within ``epsilon`` of the target, linear beyond."""

    curvature = 1.0

    def __init__(self, epsilon):
        self.epsilon = float(epsilon)

    def __call__(self, scores, targets):
        residual = scores - targets
        gradient = residual.clamp(-self.epsilon, self.epsilon)
        # The same closed form covers both branches: r g - g^2 / 2.
        return (residual * gradient - 0.5 * gradient * gradient).sum(dim=1), gradient


class LogLoss:
    """Multinomial logistic loss; one logit (the sigmoid) for two classes."""

    def __init__(self, n_outputs):
        self.n_outputs = n_outputs
        # Largest eigenvalue of the softmax Hessian diag(p) - p p^T is at most 1/2;
        # the sigmoid's second derivative is at most 1/4.
        self.curvature = 0.25 if n_outputs == 1 else 0.5

    def __call__(self, scores, labels):
        if self.n_outputs == 1:
            positive = labels.to(scores.dtype)[:, None]
            value = (F.softplus(scores) - positive * scores)[:, 0]
            return value, torch.sigmoid(scores) - positive
        log_probabilities = torch.log_softmax(scores, dim=1)
        value = -log_probabilities.gather(1, labels[:, None])[:, 0]
        gradient = log_probabilities.exp_()
        gradient[torch.arange(labels.shape[0], device=labels.device), labels] -= 1.0
        return value, gradient


def _hinge_signs(labels, n_outputs, dtype):
    """``y`` in {-1, +1}: one column for two classes, one per class (one-vs-rest) beyond."""
    if n_outputs == 1:
        return labels.to(dtype)[:, None] * 2.0 - 1.0
    return F.one_hot(labels, n_outputs).to(dtype) * 2.0 - 1.0


class HingeLoss:
    """One-vs-rest hinge ``max(0, 1 - y s)`` with ``y`` in {-1, +1} per column."""

    # Not smooth; analytic step rules use the square loss's scale.
    curvature = 1.0

    def __init__(self, n_outputs):
        self.n_outputs = n_outputs

    def __call__(self, scores, labels):
        signs = _hinge_signs(labels, self.n_outputs, scores.dtype)
        margins = 1.0 - signs * scores
        active = margins > 0
        return margins.clamp_min(0.0).sum(dim=1), -signs * active

    def smoothed(self, width):
        """The hinge with its kink rounded over ``width`` (:class:`SmoothedHingeLoss`)."""
        return SmoothedHingeLoss(self.n_outputs, width)


class SmoothedHingeLoss:
    """The hinge with its kink rounded: ``u^2 / (2 width)`` for ``0 < u < width``, ``u - width / 2`` beyond.

    Here ``u = 1 - y s``.  Huber's smoothing of the hinge: differentiable, its gradient
    Lipschitz with constant ``1 / width``, and below the hinge by at most ``width / 2``
    per column.  So a row's loss is within ``gap`` of the hinge's, and an objective
    within ``e`` of the smoothed optimum is within ``e + mean(w) gap`` of the hinge's
    (what the full-batch polish certifies).  Only the polish reads it: SGD's step
    rules never see it (it has no ``curvature``).
    """

    def __init__(self, n_outputs, width):
        self.n_outputs, self.width = n_outputs, float(width)
        self.gap = 0.5 * self.width * n_outputs

    def __call__(self, scores, labels):
        signs = _hinge_signs(labels, self.n_outputs, scores.dtype)
        margins = 1.0 - signs * scores
        slope = (margins / self.width).clamp_(0.0, 1.0)
        return (slope * (margins - 0.5 * self.width * slope)).sum(dim=1), -signs * slope


LOSSES = {"squared_error": SquaredLoss, "huber": HuberLoss, "log_loss": LogLoss, "hinge": HingeLoss}


def make_loss(name, n_outputs, epsilon=0.1):
    """The loss object for ``name`` with ``n_outputs`` score columns."""
    if name == "squared_error":
        return SquaredLoss()
    if name == "huber":
        return HuberLoss(epsilon)
    return LOSSES[name](n_outputs)
