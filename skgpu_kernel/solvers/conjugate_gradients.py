"""Conjugate gradients on a split-preconditioned symmetric system: the loop CG on centers and on every point share.

:func:`conjugate_gradients` iterates on a ``system`` object (Falkon's normal
equations on centers, :mod:`skgpu_kernel.solvers.centers_cg`; ``K + alpha W^-1``
with every training row a center, :mod:`skgpu_kernel.solvers.full_kernel_cg`),
with the exact line search, a rollback to the best measured coefficients where
rounding takes over, and the stopping rules of :class:`CGSettings`.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..planning.stopping import CG_MERIT_DIVERGENCE, NEVER, DivergenceRule, StoppingPlan
from .epochs import EpochClock, Stopping, epoch_record, format_record
from .solution import Solution

__all__ = [
    "CGPlan",
    "CGSettings",
    "conjugate_gradients",
]


@dataclass(frozen=True)
class CGSettings:
    """How CG iterates (on centers and on every point): when it stops and where it reports.

    Parameters
    ----------
    max_iterations : int, default=100
        CG iterations at most (each one pass over the row blocks).
    tol : float, default=1e-6
        Stop when every output's residual of the preconditioned system,
        ``||B^T (b - H a)||``, is at most ``tol`` times ``||B^T b||`` (or times its
        value at the warm start, when that is larger: a zero target column).
    jitter : float or None, default=None
        Relative jitter (times the mean diagonal) of the Cholesky factorisations of
        ``K(Z, Z)`` and of ``A``'s matrix.  It shapes the preconditioner only, not
        the solution.  None: :func:`default_jitter` of the kernel blocks' dtype,
        the problem's ``alpha`` and its mass per center.
    log : callable or None, default=None
        Called with one progress line per iteration.
    n_iter_no_change : int or None, default=10
        Stop (unconverged) when the largest relative residual has not reached a new
        low for this many iterations: the residual has hit the rounding floor of
        the kernel blocks' dtype above ``tol``.  None: run up to ``max_iterations``.
        Float32 blocks stall between 1e-5 and 1e-2 (LetterRecognition, p = 2000 and
        10000) while their training loss is within 0.2% of float64's, and the
        residual keeps making small new lows: with float32 pass ``tol`` ~1e-3, or
        a ``stopping`` plan.
    stopping : StoppingPlan, default: never
        The package's stopping rule on the objective (the training loss as a
        fraction of its value at the first iteration, the zero model's from a cold
        start), on top of the residual test: the estimators' ``tol``.  On
        Computers (5007 rows, every row a center, float32 blocks) the residual
        stalled at 1.3e-3 after 3 iterations and kept making new lows for 24 more,
        with the objective flat to 1e-4.
    objective_divergence : DivergenceRule or None, default=None
        The divergence rule of the training objective, for systems whose merit is
        not the objective (CG on every point, whose merit is the A-norm quadratic):
        a run that breaks it stops (``"diverged"``) with its best iterate by the
        objective, and an unconverged run returns that iterate where its last
        measured objective is worse (:meth:`DivergenceRule.keeps_best`).  None: the
        merit's rule alone (on centers the merit is the objective).
    """

    max_iterations: int = 100
    tol: float = 1e-6
    jitter: float | None = None
    log: Callable[[str], None] | None = None
    n_iter_no_change: int | None = 10
    stopping: StoppingPlan = NEVER
    objective_divergence: DivergenceRule | None = None


@dataclass(frozen=True)
class CGPlan:
    """What CG solves and from where: the penalty, the preconditioner, the warm start, the settings.

    Parameters
    ----------
    alpha : float
        The penalty: against the sum of the weighted squared errors on centers
        (``>= 0``); on the scale of the normalised weights on every point (``> 0``).
    settings : CGSettings
        When CG stops and where it reports.
    preconditioner : ShiftedNystromPreconditioner or None
        CG on every point's (required there); CG on centers builds Falkon's.
    coef_init : Tensor of shape (p, l) or None
        Warm start.
    center_shares : Tensor of shape (p,) or None
        CG on centers: the share of the training rows each center stands for
        (summing to 1), for centers that are the distinct values of repeated rows;
        None: ``1 / p`` each, a uniform draw.  It shapes the preconditioner only.
    """

    alpha: float
    settings: CGSettings = CGSettings()
    preconditioner: object = None
    coef_init: torch.Tensor | None = None
    center_shares: torch.Tensor | None = None


def column_norms(matrix):
    return torch.linalg.vector_norm(matrix, dim=0)


def _relative(residual, reference):
    norms = column_norms(residual)
    return torch.where(reference > 0, norms / reference.clamp_min(1e-300), torch.zeros_like(norms))


def conjugate_gradients(system, coef, residual, reference, settings):
    """CG on ``C^T A C beta = C^T b`` tracking ``a = C beta`` in ``coef`` (in place): its :class:`Solution`.

    ``system`` holds the symmetric operator ``A`` (Falkon's ``H`` on centers, or
    ``K + alpha W^-1`` with every training row a center) and the split
    preconditioner ``C`` (Falkon's ``B``): ``system.step_coefficients(d)`` is ``C d``,
    ``system.evaluate(a, v)`` is ``([A a - b, A v], training objective, merit)``
    from one pass over the data (the merit is what exact CG lowers at every step,
    up to a constant: its growth means rounding), ``system.transposed(M)`` is ``C^T M`` and ``system.moved(step)``
    hears that ``a`` moved by ``step`` times the last ``C d``.  ``residual`` is
    ``C^T (b - A a)`` at the start and ``reference`` the norms the relative
    residual divides by.

    Each pass also yields the gradient at the current coefficients, so every
    iteration starts from the true residual ``B^T (b - H a)`` rather than the one
    the recurrence carries: the step is the exact line search along the direction
    (the objective cannot grow) and the direction follows Polak-Ribiere, which is
    plain CG in exact arithmetic.  Without this, rounding in ``B`` (whose condition
    number grows as the jitter and ``alpha`` shrink) let the recurrence drift from
    the true residual and the objective grew again after ~10 iterations on
    numerically singular problems.  The stopping test reads the residual one step
    after the true one.  The solution's ``warnings`` say where rounding stopped it.
    """
    monitor = _Monitor(coef, settings)
    history, stop = _iterations(system, coef, residual, reference, settings, monitor)
    return Solution.of_cg(coef, history, stop, warnings=tuple(monitor.warnings))


def _iterations(system, coef, residual, reference, settings, monitor):
    """:func:`conjugate_gradients`' loop: ``(history, stop)``, ``coef`` updated in place."""
    history = []
    relative = _relative(residual, reference)
    met = relative <= settings.tol  # columns that met the tolerance: frozen from then on
    broken = torch.zeros_like(met)  # columns whose curvature was not positive (rounding): stopped unconverged
    direction = residual.clone()
    n_outputs = coef.shape[1]
    clock = EpochClock(coef.device)
    for iteration in range(1, settings.max_iterations + 1):
        active = ~(met | broken)
        if not bool(active.any()):
            break
        clock.start()
        step_coef = system.step_coefficients(direction)
        images, train_loss, merit = system.evaluate(coef, step_coef)
        if monitor.diverged(merit, coef):
            return history, "objective grew"
        if monitor.objective_diverged(train_loss, coef, settings.log):
            return history, "diverged"
        both = system.transposed(images)
        residual, image = both[:, :n_outputs].neg(), both[:, n_outputs:]
        curvature = (direction * image).sum(dim=0)
        broken |= active & ~(curvature > 0)
        active &= ~broken
        step = torch.where(active, (residual * direction).sum(dim=0) / curvature.clamp_min(1e-300), 0.0)
        coef.add_(step_coef * step)
        system.moved(step)
        new_residual = residual - image * step
        relative = _relative(new_residual, reference)
        ratio = (new_residual * (new_residual - residual)).sum(dim=0) / column_norms(residual).square()
        direction = new_residual + direction * ratio.nan_to_num(0.0).clamp_min(0.0)
        met |= active & (relative <= settings.tol)
        history.append(_record(iteration, train_loss, step, clock.seconds(), relative, settings))
        active &= ~met
        if bool(active.any()):
            stop = monitor.stagnated(float(relative[active].max()), merit, settings.log)
            if stop:
                return history, monitor.unconverged(stop, coef)
    if bool(met.all()):
        return history, "converged"
    return history, monitor.unconverged("iterations" if bool(active.any()) else "curvature", coef)


class _Monitor:
    """Rollback to the best measured coefficients when the merit or the objective diverges; residual stagnation.

    The merit and the objective are measured in the kernel blocks' dtype at the
    coefficients an iteration starts from (rounded to that dtype, as they will be
    returned).  The exact line search cannot make the merit grow, so its growth
    (:data:`~skgpu_kernel.planning.stopping.CG_MERIT_DIVERGENCE`) means rounding has
    taken over: with float32 blocks and a tiny ``alpha`` the exact solution can have
    coefficients so large that float32 cannot evaluate it.  Where the settings carry
    the objective's own rule, its best iterate is kept too.
    """

    def __init__(self, coef, settings):
        self.n_iter_no_change = settings.n_iter_no_change
        self.warnings = []  # (message, category): the fit raises them, CG never warns
        self.merit_rule = CG_MERIT_DIVERGENCE
        self.best_loss, self.best_coef = math.inf, coef.clone()
        self.lowest_residual, self.without_new_low = math.inf, 0
        self.objective = Stopping(settings.stopping)
        self.objective_rule = settings.objective_divergence
        if self.objective_rule is not None:
            self.best_objective, self.best_objective_coef = math.inf, coef.clone()
            self.reference, self.last_objective, self.growths = None, math.inf, 0

    def diverged(self, merit, coef):
        """Record CG's merit at ``coef``; on growth put the best coefficients back (a warning) and say so.

        Growth is by ``growth - 1`` times the best merit's size (which may be
        negative: CG's quadratic on the square system).
        """
        if self.merit_rule.exceeded(merit, self.best_loss) is None:
            if merit < self.best_loss:
                self.best_loss = merit
                self.best_coef.copy_(coef)
            return False
        coef.copy_(self.best_coef)
        self.warnings.append(
            (
                f"Conjugate gradients stopped: the objective grew to {merit:.4g} from "
                f"{self.best_loss:.4g}, rounding in the kernel blocks' dtype dominates; keeping the best "
                "coefficients. Use float64 or a larger alpha.",
                RuntimeWarning,
            )
        )
        return True

    def objective_diverged(self, objective, coef, log):
        """Record the training objective at ``coef``; where it broke its rule, the best iterate put back and True."""
        rule = self.objective_rule
        if rule is None:
            return False
        if self.reference is None:
            self.reference = objective  # the zero model's, from a cold start
        why = rule.exceeded(objective, self.best_objective, self.reference)
        self.growths = self.growths + 1 if why == "grew" else 0
        self.last_objective = objective
        if why is None or (why == "grew" and self.growths < rule.window):
            if objective < self.best_objective:
                self.best_objective = objective
                self.best_objective_coef.copy_(coef)
            return False
        coef.copy_(self.best_objective_coef)
        if log is not None:
            log(
                f"stopping: the training objective diverged ({why}: {objective:.4g}, lowest "
                f"{self.best_objective:.4g}, the start's {self.reference:.4g}); keeping the best iterate"
            )
        return True

    def unconverged(self, stop, coef):
        """``stop``, with the best iterate by the objective put back where the last measured one is worse."""
        rule = self.objective_rule
        if rule is not None and self.reference is not None:
            if rule.keeps_best(self.last_objective, self.best_objective, self.reference):
                coef.copy_(self.best_objective_coef)
        return stop

    def stagnated(self, residual, train_loss, log):
        """Record the largest relative residual and the objective; which has stopped improving, or None."""
        if self.objective.should_stop({"train_loss": train_loss}, None, log):
            return "objective"
        if residual < self.lowest_residual:
            self.lowest_residual, self.without_new_low = residual, 0
            return None
        self.without_new_low += 1
        if self.n_iter_no_change is None or self.without_new_low < self.n_iter_no_change:
            return None
        if log is not None:
            log(
                f"stopping: the relative residual has not fallen below {self.lowest_residual:.3g} for "
                f"{self.n_iter_no_change} iterations"
            )
        return "residual stalled"


def _record(iteration, train_loss, step, seconds, relative, settings):
    """The iteration's record (learning rate: the mean CG step of the columns that moved), logged."""
    moved = step[step != 0]
    learning_rate = float(moved.mean()) if moved.numel() else 0.0
    record = epoch_record(
        iteration, iteration, train_loss, learning_rate, seconds, relative_residual=float(relative.max())
    )
    if settings.log is not None:
        line = format_record(record, settings.max_iterations)
        settings.log(f"{line}, relative residual {record['relative_residual']:.3g}")
    return record
