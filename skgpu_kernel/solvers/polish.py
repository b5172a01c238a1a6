"""The full-batch polish of a linear SGD fit: L-BFGS on the penalised training objective.

The objective is SGD's own, ``f(W, b) = mean_i w_i L(x_i W + b, y_i) + alpha / 2 ||W||^2``
(the intercept unpenalised), over resident training rows.  Each iteration takes
two passes of products with the rows: the direction's scores ``X dW + db``, then the
gradient ``X^T G`` at the point the line search accepted.  The line search itself
moves along the scores, ``S + t (X dW + db)``, so its trials cost no product.

The stop is certified: ``f`` is ``alpha``-strongly convex in ``W``, so
``f - f* <= ||g||^2 / (2 alpha)`` (with the intercept at its optimum, which its
gradient, held to the same bound, says); the polish stops once that bound is at
most ``tolerance f``.  Where rounding leaves no descent before that, it stops and
says it did not converge; its iterate is never worse than the one it started from.
"""

import math
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..blockwise import linear_scores
from .sgd import transposed_product

__all__ = ["PolishResult", "polish_linear"]

# Strong Wolfe constants of quasi-Newton line searches (Nocedal & Wright, 3.1).
_ARMIJO = 1e-4
_CURVATURE = 0.9
_LINE_SEARCH_TRIALS = 30


@dataclass(frozen=True)
class PolishResult:
    """What the polish did.

    Attributes
    ----------
    n_iter : int
        L-BFGS iterations.
    converged : bool
        The certificate was met: the objective is within ``tolerance`` of the optimum's.
    excess_bound : float
        ``||g||^2 / (2 alpha f)`` at the returned iterate: a bound on its relative excess objective.
    objective : float
        ``f`` at the returned iterate.
    seconds : float
    """

    n_iter: int
    converged: bool
    excess_bound: float
    objective: float
    seconds: float


@dataclass
class _Point:
    """An iterate with its scores, objective and gradient."""

    coef: torch.Tensor
    intercept: torch.Tensor
    scores: torch.Tensor
    objective: float
    coef_gradient: torch.Tensor
    intercept_gradient: torch.Tensor


class _Objective:
    """``f`` and its gradient over the training rows, read by passes in a fixed order.

    The targets and weights are kept whole (one value per row); ``X`` is read by
    :class:`~skgpu_kernel.passes.OrderedPasses`, resident or streamed.
    """

    def __init__(self, loss, passes, plan):
        self.loss, self.passes, self.plan = loss, passes, plan
        self.targets = self.weights = None
        self.n_rows = 0
        # How far below the loss it stands for this objective may lie (a smoothed copy's, by with_loss).
        self.smoothing_gap = 0.0
        self._converted = None  # resident rows in float64, converted once

    def blocks(self):
        """The passes' ``(X, targets, weights)``, ``X`` in float64 where the plan says (resident rows once)."""
        if not self.plan.in_float64:
            yield from self.passes
            return
        if self._converted is not None:
            yield self._converted
            return
        for X, targets, weights in self.passes:
            block = (X.to(torch.float64), targets, weights)
            if self.passes.resident is not None:
                self._converted = block
            yield block

    def with_loss(self, loss):
        """The same rows' objective with a smoothed copy of the loss: ``gap`` a row, ``mean(w) gap`` in all."""
        other = _Objective(loss, self.passes, self.plan)
        other.targets, other.weights, other.n_rows = self.targets, self.weights, self.n_rows
        other._converted = self._converted
        other.smoothing_gap = loss.gap if self.weights is None else loss.gap * float(self.weights.mean())
        return other

    def scores(self, coef, intercept):
        """``X W + b`` of every row (the first pass also gathers the targets and weights)."""
        blocks, targets, weights = [], [], []
        for X, block_targets, block_weights in self.blocks():
            blocks.append(linear_scores(X, coef, intercept))
            if self.targets is None:
                # Copies: a streamed pass may read its next buffer into the same memory.
                targets.append(block_targets.clone())
                weights.append(None if block_weights is None else block_weights.clone())
        if self.targets is None:
            self.targets = torch.cat(targets)
            self.weights = None if weights[0] is None else torch.cat(weights)
            self.n_rows = self.targets.shape[0]
        return torch.cat(blocks)

    def in_scores(self, scores, coef):
        """``(f, dF/dS)`` at ``scores`` and ``coef`` (``dF/dS`` already weighted and divided by n)."""
        values, gradient = self.loss(scores, self.targets)
        if self.weights is not None:
            values, gradient = values * self.weights, gradient * self.weights[:, None]
        penalty = 0.5 * self.plan.alpha * float((coef * coef).sum())
        return float(values.sum(dtype=torch.float64)) / self.n_rows + penalty, gradient / self.n_rows

    def point(self, coef, intercept, scores, score_gradient, objective):
        """The :class:`_Point` at ``(coef, intercept)``: one pass for the gradient ``X^T G``."""
        product, start = None, 0
        for X, _, _ in self.blocks():
            rows = score_gradient[start : start + X.shape[0]]
            start += X.shape[0]
            block = transposed_product(X, rows)
            product = block if product is None else product.add_(block)
        intercept_gradient = score_gradient.sum(dim=0)
        if not self.plan.fit_intercept:
            intercept_gradient = torch.zeros_like(intercept_gradient)
        coef_gradient = product + self.plan.alpha * coef
        return _Point(coef, intercept, scores, objective, coef_gradient, intercept_gradient)

    def start(self, coef, intercept):
        scores = self.scores(coef, intercept)
        objective, score_gradient = self.in_scores(scores, coef)
        return self.point(coef, intercept, scores, score_gradient, objective)


def _dot(first, second):
    return float((first[0] * second[0]).sum() + (first[1] * second[1]).sum())


def _direction(point, pairs):
    """``-H g`` by L-BFGS's two-loop recursion over the kept ``(s, y, 1 / s.y)`` pairs."""
    q = [point.coef_gradient.clone(), point.intercept_gradient.clone()]
    factors = []
    for s, y, rho in reversed(pairs):
        a = rho * _dot(s, q)
        factors.append(a)
        q[0].sub_(y[0], alpha=a)
        q[1].sub_(y[1], alpha=a)
    if pairs:
        s, y, _ = pairs[-1]
        gamma = _dot(s, y) / _dot(y, y)
        q[0].mul_(gamma)
        q[1].mul_(gamma)
    for (s, y, rho), a in zip(pairs, reversed(factors), strict=True):
        b = rho * _dot(y, q)
        q[0].add_(s[0], alpha=a - b)
        q[1].add_(s[1], alpha=a - b)
    return -q[0], -q[1]


def _line_search(objective, point, direction):
    """A step ``t`` along ``direction`` meeting the strong Wolfe conditions, found on the scores.

    ``f`` along the line is convex: a bracket of its slope's root is narrowed by
    secant steps (exact in one step for the square loss), widened by doubling.
    Returns ``(t, scores, f, dF/dS)`` at the accepted step, or None where no trial
    decreased ``f`` (rounding: the iterate is as good as the rows' precision lets it be).
    """
    step_scores = objective.scores(direction[0], direction[1])
    slope0 = _dot((point.coef_gradient, point.intercept_gradient), direction)
    if not slope0 < 0:
        return None
    low, high = (0.0, slope0), None
    t, best = 1.0, None
    for _ in range(_LINE_SEARCH_TRIALS):
        scores = point.scores + t * step_scores
        coef = point.coef + t * direction[0]
        value, score_gradient = objective.in_scores(scores, coef)
        slope = float((score_gradient * step_scores).sum()) + objective.plan.alpha * float((coef * direction[0]).sum())
        decreased = math.isfinite(value) and value <= point.objective + _ARMIJO * t * slope0
        if decreased and (best is None or value < best[2]):
            best = (t, scores, value, score_gradient)
        if decreased and abs(slope) <= _CURVATURE * abs(slope0):
            return t, scores, value, score_gradient
        if decreased and slope < 0:
            low = (t, slope)
        else:
            high = (t, slope if math.isfinite(value) and math.isfinite(slope) else None)
        t = _next_trial(low, high)
    return best  # Armijo with a negative slope: every kept trial is below the start


def _next_trial(low, high):
    """The next step: doubled without an upper end, else the slope's secant root kept inside the bracket."""
    if high is None:
        return 2.0 * low[0]
    (t_low, slope_low), (t_high, slope_high) = low, high
    width = t_high - t_low
    if slope_high is None or not slope_high > slope_low:
        return t_low + 0.1 * width
    root = t_low - slope_low * width / (slope_high - slope_low)
    return min(max(root, t_low + 0.01 * width), t_high - 0.01 * width)


def _excess(point, objective):
    """``||g||^2 / (2 alpha) + gap``: a certified bound on the excess objective at ``point``.

    ``gap`` is the smoothed loss's distance below the loss it stands for (zero for a
    smooth loss): the bound is on the excess over the optimum of the loss itself.
    """
    squared = _dot((point.coef_gradient, point.intercept_gradient), (point.coef_gradient, point.intercept_gradient))
    return squared / (2.0 * objective.plan.alpha) + objective.smoothing_gap


def _relative(excess, point):
    return excess / max(point.objective, 1e-300)


def _minimise(objective, point, relative, absolute, max_iter, log):
    """L-BFGS from ``point`` until :func:`_excess` is at most ``max(relative f, absolute)`` or ``max_iter`` iterations.

    Returns ``(point, n_iter, excess)``; ``point`` is never worse than the start.
    """

    def met(excess, point):
        return excess <= max(relative * point.objective, absolute)

    pairs = deque(maxlen=objective.plan.history)
    n_iter, excess = 0, _excess(point, objective)
    while n_iter < max_iter:
        if met(excess, point):
            # The scores were carried along the line searches: check the certificate
            # on the iterate's own scores and gradient before returning it.
            point = objective.start(point.coef, point.intercept)
            excess = _excess(point, objective)
            if met(excess, point):
                break
        direction = _direction(point, pairs)
        accepted = _line_search(objective, point, direction)
        if accepted is None and pairs:
            # A stale curvature memory: retry along the gradient once.
            pairs.clear()
            direction = (-point.coef_gradient, -point.intercept_gradient)
            accepted = _line_search(objective, point, direction)
        if accepted is None:
            break
        t, scores, value, score_gradient = accepted
        new = objective.point(
            point.coef + t * direction[0], point.intercept + t * direction[1], scores, score_gradient, value
        )
        s = (t * direction[0], t * direction[1])
        y = (new.coef_gradient - point.coef_gradient, new.intercept_gradient - point.intercept_gradient)
        curvature = _dot(s, y)
        if curvature > 1e-12 * _dot(y, y) ** 0.5 * _dot(s, s) ** 0.5:
            pairs.append((s, y, 1.0 / curvature))
        point, n_iter = new, n_iter + 1
        excess = _excess(point, objective)
        if log is not None and n_iter % 50 == 0:
            bound = _relative(excess, point)
            log(f"polish: iteration {n_iter}, objective {point.objective:.6g}, excess bound {bound:.2e}")
    return point, n_iter, excess


def polish_linear(coef, intercept, passes, loss, plan, log=None):
    """Polish ``coef`` and ``intercept`` in place by L-BFGS on the full-batch objective.

    A loss with a kink (the hinge) is minimised through smoothed copies of it
    (``loss.smoothed(width)``), from ``plan.smoothing`` down by
    ``plan.smoothing_shrink`` at a time: each is minimised until its gradient's
    share of the certificate is at most its smoothing gap, the last one (whose gap
    is at most half the tolerance) until the whole certificate is met.

    Parameters
    ----------
    coef : Tensor of shape (d, l)
    intercept : Tensor of shape (l,)
    passes : OrderedPasses
        The training rows ``(X, targets, weights)``, read in the same order every pass.
    loss : callable
        ``loss(scores, targets) -> (values, dL/dS)`` (:mod:`~skgpu_kernel.solvers.losses`).
    plan : PolishPlan
    log : callable or None
        Receives a line every 50 iterations and one at the end.

    Returns
    -------
    PolishResult
    """
    started = time.perf_counter()
    exact = _Objective(loss, passes, plan)
    dtype = torch.float64 if plan.in_float64 else coef.dtype
    point = exact.start(coef.to(dtype), intercept.to(dtype))
    objective, width, n_iter = exact, plan.smoothing, 0
    while True:
        if width is not None:
            objective = exact.with_loss(loss.smoothed(width))
            point = objective.start(point.coef, point.intercept)
            # The width whose gap is half the tolerance ends the shrinking (a tenth
            # more is taken as it: the objective moved a little since it was set).
            last_width = width * 0.5 * plan.tolerance * point.objective / objective.smoothing_gap
        final = width is None or width <= 1.1 * last_width
        # A copy before the last is minimised until its gradient's share is its gap: no further.
        relative, absolute = (plan.tolerance, 0.0) if final else (0.0, 2.0 * objective.smoothing_gap)
        point, stage_iter, excess = _minimise(objective, point, relative, absolute, plan.max_iter - n_iter, log)
        bound = _relative(excess, point)
        n_iter += stage_iter
        if final or n_iter >= plan.max_iter:
            break
        width = max(width / plan.smoothing_shrink, last_width)
    coef.copy_(point.coef)
    intercept.copy_(point.intercept)
    value = exact.in_scores(point.scores, point.coef)[0] if width is not None else point.objective
    if dtype != coef.dtype:
        # The model keeps the iterate rounded to its dtype: its objective, checked, bounds what rounding cost.
        rounded = exact.in_scores(exact.scores(coef.to(dtype), intercept.to(dtype)), coef.to(dtype))[0]
        bound += max(rounded - value, 0.0) / max(value, 1e-300)
        value = rounded
    result = PolishResult(n_iter, bound <= plan.tolerance, bound, value, time.perf_counter() - started)
    if log is not None:
        state = "converged" if result.converged else "stopped above the tolerance"
        log(f"polish: L-BFGS {n_iter} iterations, objective {value:.6g}, excess bound {bound:.2e}, {state}")
    return result
