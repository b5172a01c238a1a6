"""When a training loop stops before its last epoch: one rule for every loop.

Every loop of the package (EigenPro 2 and 3, conjugate gradients on centers, BMGD
and the parallel workers) receives a :class:`StoppingPlan` from
:func:`plan_stopping` and runs it with
``skgpu_kernel.solvers.epochs.Stopping``.  ``tol`` means the same everywhere:
the smallest gain of a scale-free monitored quantity that counts as progress,

* with held-out rows, the validation score (R^2 or accuracy), larger is better;
  the coefficients of the best epoch are kept;
* otherwise the training loss as a fraction of a reference loss: the zero
  model's where the loop measures it (the kernel machines), else the loss of the
  first epoch (conjugate gradients, whose first iteration starts from the zero
  model on a fresh fit, BMGD and the parallel workers);

and the loop stops when the quantity has not gained more than ``tol`` for
``n_iter_no_change`` epochs.  ``tol=None`` runs every epoch (held-out rows still
choose the best epoch).  Dividing by a reference makes ``tol`` independent of the
targets' scale, as scikit-learn's ``SGDRegressor(tol=...)`` is on normalised data.

Conjugate gradients (:func:`plan_cg_stopping`) head for an exact solution, so
their rule adds a test of the residual to the one above.  A CG run stops when
every output's relative residual of the preconditioned normal equations is at most
``CG_TOL`` (1e-6: far below the statistical error of any model, near float32's
resolution); below float64 the residual has a rounding floor above it, so the
relative training loss judges progress by the rule above (``tol``,
``n_iter_no_change``); and on centers a residual that makes no new low for
``CG_RESIDUAL_PATIENCE`` iterations has hit its floor (CG's residual on the
square system of every point is not monotone, so there no stall is read).  A run
that ends by none of these above ``CG_TOL`` in float64, or above
``CG_ROUNDING_TOL`` below it, is unfinished (a ``ConvergenceWarning``).
``tol=None`` runs every iteration up to ``n_epochs``.

Divergence has one rule too (:class:`DivergenceRule`, :func:`plan_divergence`):
each iterative solver watches one measure per iteration (EigenPro's epoch loss,
CG's merit, CG on every point's penalised training objective), and that measure
diverged when it is not finite, when it exceeds ``ceiling`` times its reference
(the zero model's value), or when it stays above ``growth`` times its lowest
value (or a floor) for ``window`` iterations in a row.  A solver that diverged
returns its best iterate by that measure, and the driver decides what to try
next (``skgpu_kernel.fit.solve.run_solver``).
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ANNEAL_FACTOR",
    "BEST_ITERATE_SLACK",
    "CG_RESIDUAL_CEILING",
    "CG_RESIDUAL_PATIENCE",
    "CG_ROUNDING_TOL",
    "CG_TOL",
    "FIT_CHECK_ROWS",
    "FIT_CHECK_STANDARD_ERRORS",
    "HELD_OUT_CHECK_ROWS",
    "HELD_OUT_CHECK_SHARE",
    "MONITORS",
    "NEVER",
    "CGStoppingPlan",
    "DivergenceRule",
    "StoppingPlan",
    "better_than_trivial",
    "exceeds_noise",
    "fit_check_rows",
    "held_out_check_limit",
    "plan_cg_stopping",
    "plan_divergence",
    "plan_stopping",
    "worse_than_trivial",
]

MONITORS = ("validation_score", "train_loss", "none")


@dataclass(frozen=True)
class StoppingPlan:
    """What a loop monitors and how long it waits for a gain.

    Attributes
    ----------
    monitor : {"validation_score", "train_loss", "none"}
    tol : float or None
        None never stops early (a validation score still picks the best epoch).
    n_iter_no_change : int
    anneal : int, default=0
        Plateaus (``n_iter_no_change`` epochs without a gain above ``tol``) at which
        the loop divides its step by ``ANNEAL_FACTOR`` and goes on, before the next
        plateau stops it: at a constant step SGD on data it cannot interpolate
        reaches a noise floor that scales with the step, not the optimum.
    """

    monitor: str
    tol: float | None
    n_iter_no_change: int
    anneal: int = 0

    @property
    def judges(self):
        """Whether the rule can stop the loop at all: a monitored quantity and a ``tol``."""
        return self.monitor != "none" and self.tol is not None

    def describe(self):
        """One line for ``verbose``."""
        if not self.judges:
            return "no early stop" + (", best validation score kept" if self.monitor == "validation_score" else "")
        quantity = "validation score" if self.monitor == "validation_score" else "relative training loss"
        line = f"stop when the {quantity} gains no more than {self.tol:g} in {self.n_iter_no_change} epochs"
        if self.anneal:
            line += f" after the step has been divided by {ANNEAL_FACTOR:g} at each of {self.anneal} such plateaus"
        return line


# A plateau of a loop whose plan anneals divides its step by this factor: halving at 7
# plateaus reached the hinge's optimum closer than dividing by 5 at 3 (issue 78;
# scikit-learn's learning_rate="adaptive" divides by 5).
ANNEAL_FACTOR = 2.0


def plan_stopping(tol, n_iter_no_change, validation, on_train_loss=True, anneal=0):
    """The stopping plan of a loop.

    Parameters
    ----------
    tol : float or None
    n_iter_no_change : int
    validation : bool
        The loop scores held-out rows every epoch.
    on_train_loss : bool, default=True
        Without held-out rows, stop on the relative training loss (False: only
        the loop's own convergence test stops it, as for conjugate gradients on
        float64 blocks, whose residual reaches its tolerance).
    anneal : int, default=0
        Plateaus that divide the loop's step instead of stopping it
        (``StoppingPlan.anneal``; the linear SGD models' rule:
        ``skgpu_kernel.planning.sgd.plateaus_to_anneal``).

    Returns
    -------
    StoppingPlan

    Examples
    --------
    >>> plan_stopping(1e-3, 5, validation=False)
    StoppingPlan(monitor='train_loss', tol=0.001, n_iter_no_change=5, anneal=0)
    >>> plan_stopping(1e-3, 5, validation=False, anneal=7).anneal, plan_stopping(None, 5, False, anneal=7).anneal
    (7, 0)
    >>> plan_stopping(None, 5, validation=False).monitor
    'none'
    """
    if validation:
        monitor = "validation_score"
    elif on_train_loss and tol is not None:
        monitor = "train_loss"
    else:
        monitor = "none"
    plan = StoppingPlan(monitor, tol, n_iter_no_change)
    return dataclasses.replace(plan, anneal=anneal) if plan.judges else plan


# The plan of a loop that runs every epoch (the loops' default).
NEVER = StoppingPlan("none", None, 1)


# Relative residual of the preconditioned normal equations at which CG stops: far
# below the statistical error of any model it fits, near float32's resolution.
CG_TOL = 1e-6

# The residual a CG fit may end with, unless the objective rule ended it, before it
# warns: CG_TOL in float64; with float32 kernel blocks the residual stalls at their
# rounding floor, 1e-5 to 1e-2 on the real-data sets (LetterRecognition, Computers)
# with the training loss within 0.2% of float64's, so above 1e-2 means unfinished.
CG_ROUNDING_TOL = 1e-2

# A CG run whose relative residual ends above this (its value at a cold start, 1) made
# no progress on its system, whatever stopped it: the training objective's rule
# included (issue 62: a 16-bit cache at a small penalty left the residual at 5.05 while
# the objective, measured on the same rounded products, had stopped changing).
CG_RESIDUAL_CEILING = 1.0

# Iterations without a new low of the residual after which CG on centers has hit the
# rounding floor of its kernel blocks: float32 blocks stall between 1e-5 and 1e-2
# (LetterRecognition, p = 2000 and 10000) while making small new lows now and then.
CG_RESIDUAL_PATIENCE = 10


@dataclass(frozen=True)
class CGStoppingPlan:
    """When a conjugate-gradient run stops, and what counts as finished (see the module's docstring).

    Attributes
    ----------
    residual_tol : float
        Stop when every output's relative residual is at most this (0: never).
    stated_tol : float
        A run that ends above it, by no other rule, is unfinished.
    residual_patience : int or None
        Stop after this many iterations without a new low of the residual (None: never).
    objective : StoppingPlan
        The package's rule on the relative training loss.
    residual_ceiling : float
        A run that ends with its residual above this is unfinished whatever
        stopped it, the objective's rule included (``CG_RESIDUAL_CEILING``).
    objective_divergence : DivergenceRule or None
        The training objective's divergence rule, watched on CG on every point's
        square system (whose merit is not the objective); None on centers.
    """

    residual_tol: float
    stated_tol: float
    residual_patience: int | None
    objective: StoppingPlan
    residual_ceiling: float = CG_RESIDUAL_CEILING
    objective_divergence: object = None

    def unfinished(self, stop, residual):
        """Whether a run that ended by ``stop`` with the relative ``residual`` is unfinished (it warns).

        Finished: the residual met its tolerance, or the objective's rule ended the
        run below ``residual_ceiling``, or the residual is within ``stated_tol``.

        Examples
        --------
        >>> plan = plan_cg_stopping(1e-4, 3, float64=False)
        >>> plan.unfinished("objective", 0.5), plan.unfinished("objective", 5.0), plan.unfinished("iterations", 0.5)
        (False, True, True)
        """
        if stop == "converged" or (stop == "objective" and residual <= self.residual_ceiling):
            return False
        return residual > self.stated_tol


def plan_cg_stopping(tol, n_iter_no_change, float64, square_system=False):
    """The stopping plan of a CG run.

    Parameters
    ----------
    tol : float or None
        The estimator's ``tol`` (None: every iteration up to the bound).
    n_iter_no_change : int
    float64 : bool
        The kernel blocks are float64: the residual reaches ``CG_TOL``, and the
        objective rule is not needed.
    square_system : bool, default=False
        CG on every point's ``K + alpha W^-1``, whose residual is not monotone (no
        stall is read) and whose training objective has a divergence rule of its own.

    Returns
    -------
    CGStoppingPlan

    Examples
    --------
    >>> plan = plan_cg_stopping(1e-4, 3, float64=False)
    >>> plan.residual_tol, plan.stated_tol, plan.residual_patience, plan.objective.monitor
    (1e-06, 0.01, 10, 'train_loss')
    """
    # Held-out rows score the solution CG ends with, not each iteration.
    objective = plan_stopping(tol, n_iter_no_change, validation=False, on_train_loss=not float64)
    return CGStoppingPlan(
        residual_tol=0.0 if tol is None else CG_TOL,
        stated_tol=CG_TOL if float64 else CG_ROUNDING_TOL,
        residual_patience=None if square_system else CG_RESIDUAL_PATIENCE,
        objective=objective,
        objective_divergence=plan_divergence("objective") if square_system else None,
    )


@dataclass(frozen=True)
class DivergenceRule:
    """When an iterative solver's measure (lower is better) says the iteration diverged.

    Attributes
    ----------
    ceiling : float or None
        Diverged at once above ``ceiling`` times the reference (the zero model's
        value of the measure); None: no ceiling.
    growth : float
        Diverged when the measure exceeds its lowest value so far (or ``floor``,
        where larger) by ``growth - 1`` times that value's size ...
    window : int
        ... for this many iterations in a row.
    best_slack : float
        A run that ends unconverged returns its best measured iterate when its last
        measured one is above it by more than ``best_slack`` times the reference
        (else its last iterate, which carries the last step's progress).

    Examples
    --------
    >>> rule = DivergenceRule(ceiling=10.0, growth=1.5, window=1)
    >>> rule.exceeded(2.0, lowest=1.0, reference=3.0), rule.exceeded(1.4, lowest=1.0, reference=3.0)
    ('grew', None)
    >>> rule.exceeded(31.0, lowest=math.inf, reference=3.0), rule.exceeded(math.nan, 1.0, 3.0)
    ('above the zero model', 'not finite')
    """

    ceiling: float | None
    growth: float
    window: int
    best_slack: float = 0.0

    def exceeded(self, value, lowest, reference=None, floor=-math.inf):
        """Why one ``value`` breaks the rule (``"not finite"``, ``"above the zero model"``, ``"grew"``), or None.

        ``lowest`` is the lowest value measured before; ``floor`` the level below
        which values are not judged by their growth (the noise of the measure).
        The caller counts ``"grew"`` over ``window`` iterations.
        """
        if not math.isfinite(value):
            return "not finite"
        if self.ceiling is not None and reference is not None and value > self.ceiling * max(reference, 1e-30):
            return "above the zero model"
        base = max(lowest, floor)
        if value > base + (self.growth - 1.0) * abs(base):
            return "grew"
        return None

    def keeps_best(self, last, best, reference):
        """Whether an unconverged run returns its best measured iterate rather than its last one."""
        return not math.isfinite(last) or last > best + self.best_slack * abs(reference)


# EigenPro's epoch loss (mean loss over the epoch, each batch before its step): above
# 1e4 times the zero model's it diverged, and so did an epoch whose loss grew 1.5
# times over the lowest epoch loss (above a noise floor): in the interpolation regime
# a stable step decreases the loss epoch after epoch.
EIGENPRO_DIVERGENCE = DivergenceRule(ceiling=1e4, growth=1.5, window=1)

# CG's merit (what exact CG lowers at every step: the objective on centers, the
# A-norm quadratic on every point): the exact line search cannot make it grow, so
# growth by half its size means rounding has taken over.
CG_MERIT_DIVERGENCE = DivergenceRule(ceiling=None, growth=1.5, window=1)

# CG on every point's penalised training objective, measured with the same products
# (a kernel cache in 16 bits included).  Exact CG lowers the A-norm of the error, not
# this objective, so single iterations may raise it; a model ten times worse than the
# zero model on its own training rows, or an objective ten times its lowest for three
# iterations in a row, is an operator that is no longer positive definite (a 16-bit
# cache at a small penalty: 1.7 -> 198 -> ... -> 720, issue 62), not CG's path.  A run
# that ends unconverged above its best objective by 0.1% of the zero model's returns
# the best iterate.
BEST_ITERATE_SLACK = 1e-3
CG_OBJECTIVE_DIVERGENCE = DivergenceRule(ceiling=10.0, growth=10.0, window=3, best_slack=BEST_ITERATE_SLACK)

_DIVERGENCE_RULES = {
    "epoch loss": EIGENPRO_DIVERGENCE,
    "merit": CG_MERIT_DIVERGENCE,
    "objective": CG_OBJECTIVE_DIVERGENCE,
}


def plan_divergence(measure):
    """The divergence rule of a solver's ``measure``: ``"epoch loss"``, ``"merit"`` or ``"objective"``.

    Examples
    --------
    >>> plan_divergence("objective").window
    3
    """
    return _DIVERGENCE_RULES[measure]


# The last check of a fit: the model's weighted squared error on at most this many of
# its training rows (evenly spaced, no random draw) against the trivial predictor's
# (the rows' weighted mean: the class prior for a classifier's one-hot targets).  2048
# rows took 3.7% of DNA's fit (8 checks of 34 ms in 7.4 s, its feature-learning path
# included); 1024 halve that, and the mean of 1024 paired differences still tells a
# model worse than the mean from one no better than it.
FIT_CHECK_ROWS = 1024
# Where the fit holds rows out (its early-stopping split), the last check scores at most
# this many of them instead: an unpenalised model fits its own rows, so only rows it did
# not fit can show it worse than the trivial one.  A paired difference of
# misclassifications between model and prior has a standard error of about
# sqrt(share of rows they disagree on / rows scored): under 0.01 at 4096 rows and 40%
# disagreement.
HELD_OUT_CHECK_ROWS = 4096
# ... and at most one in this many of the fit's training rows (never fewer than
# FIT_CHECK_ROWS): the check evaluates the kernel of each row it scores afresh, while
# the fit evaluates each training row's kernel row at least once (the cache's fill or
# an epoch's blocks), so the check costs at most 1/32 (3%) of that one pass.  4096
# held-out rows took 2.76 s of Fashion-MNIST's 47 s fit (52,200 rows; 5.9%, its epochs
# reading the cache in 1.44 s); 52,200 / 32 = 1631 rows, about 1.1 s.
HELD_OUT_CHECK_SHARE = 32
# Worse (or better) than the trivial predictor "beyond noise": the mean of the paired
# differences of the two errors is above (below minus) this many of its standard errors.
FIT_CHECK_STANDARD_ERRORS = 2.0


def fit_check_rows(n_rows, limit=FIT_CHECK_ROWS):
    """The rows the last check scores: at most ``limit``, evenly spaced.

    ``limit`` is ``FIT_CHECK_ROWS`` for training rows, :func:`held_out_check_limit`
    for held-out ones.

    Examples
    --------
    >>> fit_check_rows(5).tolist(), fit_check_rows(10_000).size, fit_check_rows(10_000, HELD_OUT_CHECK_ROWS).size
    ([0, 1, 2, 3, 4], 1024, 4096)
    """
    if n_rows <= limit:
        return np.arange(n_rows)
    return np.linspace(0, n_rows - 1, limit).astype(np.int64)


def held_out_check_limit(n_fitted):
    """The most held-out rows the last check of a fit on ``n_fitted`` training rows scores.

    One in ``HELD_OUT_CHECK_SHARE`` (32) of the training rows, at least
    ``FIT_CHECK_ROWS`` (1024) and at most ``HELD_OUT_CHECK_ROWS`` (4096).

    Examples
    --------
    >>> held_out_check_limit(2_700), held_out_check_limit(52_200), held_out_check_limit(500_000)
    (1024, 1631, 4096)
    """
    return min(HELD_OUT_CHECK_ROWS, max(FIT_CHECK_ROWS, n_fitted // HELD_OUT_CHECK_SHARE))


def exceeds_noise(mean_gain, standard_error, margin_se):
    """Whether a mean paired gain is positive and larger than ``margin_se`` standard errors of the differences.

    The one test behind every paired comparison of a fit's decisions: the last check
    against the trivial model, a learnt metric and a model's size
    (:func:`~skgpu_kernel.planning.agop.lower_beyond_noise`).

    Examples
    --------
    >>> exceeds_noise(1.0, 0.4, 2.0), exceeds_noise(1.0, 0.6, 2.0), exceeds_noise(0.0, 0.0, 0.0)
    (True, False, False)
    """
    return mean_gain > 0 and mean_gain > margin_se * standard_error


def worse_than_trivial(mean_difference, standard_error):
    """Whether paired differences (model's squared error minus the trivial one's) say the model is worse.

    Examples
    --------
    >>> worse_than_trivial(1.0, 0.4), worse_than_trivial(1.0, 0.6), worse_than_trivial(-1.0, 0.0)
    (True, False, False)
    """
    return exceeds_noise(mean_difference, standard_error, FIT_CHECK_STANDARD_ERRORS)


def better_than_trivial(mean_difference, standard_error):
    """Whether paired differences (model's error minus the trivial one's) say the model is better beyond noise.

    Examples
    --------
    >>> better_than_trivial(-1.0, 0.4), better_than_trivial(-1.0, 0.6), better_than_trivial(0.0, 0.0)
    (True, False, False)
    """
    return exceeds_noise(-mean_difference, standard_error, FIT_CHECK_STANDARD_ERRORS)
