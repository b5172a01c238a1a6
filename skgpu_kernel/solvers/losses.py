"""Losses of the linear SGD models: value and gradient with respect to the scores.

Each loss maps scores ``S = X W + b`` of shape (m, l) and targets to the loss of
each sample, shape (m,), and ``dL/dS``, shape (m, l).  Regression targets are float (m, l);
classification targets are class indices (m,) in int64, turned into what the loss
needs on the device.  ``curvature`` bounds the second derivative of the loss in the
scores, which scales the spectrum that analytic step rules see.
"""

import torch
import torch.nn.functional as F

__all__ = ["LOSSES", "HingeLoss", "HuberLoss", "LogLoss", "SquaredLoss", "make_loss"]


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


class HingeLoss:
    """One-vs-rest hinge ``max(0, 1 - y s)`` with ``y`` in {-1, +1} per column."""

    # Not smooth; analytic step rules use the square loss's scale.
    curvature = 1.0

    def __init__(self, n_outputs):
        self.n_outputs = n_outputs

    def __call__(self, scores, labels):
        if self.n_outputs == 1:
            signs = labels.to(scores.dtype)[:, None] * 2.0 - 1.0
        else:
            signs = F.one_hot(labels, self.n_outputs).to(scores.dtype) * 2.0 - 1.0
        margins = 1.0 - signs * scores
        active = margins > 0
        return margins.clamp_min(0.0).sum(dim=1), -signs * active


LOSSES = {"squared_error": SquaredLoss, "huber": HuberLoss, "log_loss": LogLoss, "hinge": HingeLoss}


def make_loss(name, n_outputs, epsilon=0.1):
    """The loss object for ``name`` with ``n_outputs`` score columns."""
    if name == "squared_error":
        return SquaredLoss()
    if name == "huber":
        return HuberLoss(epsilon)
    return LOSSES[name](n_outputs)
