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
"""

from dataclasses import dataclass

__all__ = [
    "CG_RESIDUAL_PATIENCE",
    "CG_ROUNDING_TOL",
    "CG_TOL",
    "MONITORS",
    "NEVER",
    "CGStoppingPlan",
    "StoppingPlan",
    "plan_cg_stopping",
    "plan_stopping",
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
    """

    monitor: str
    tol: float | None
    n_iter_no_change: int

    def describe(self):
        """One line for ``verbose``."""
        if self.monitor == "none" or self.tol is None:
            return "no early stop" + (", best validation score kept" if self.monitor == "validation_score" else "")
        quantity = "validation score" if self.monitor == "validation_score" else "relative training loss"
        return f"stop when the {quantity} gains no more than {self.tol:g} in {self.n_iter_no_change} epochs"


def plan_stopping(tol, n_iter_no_change, validation, on_train_loss=True):
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

    Returns
    -------
    StoppingPlan

    Examples
    --------
    >>> plan_stopping(1e-3, 5, validation=False)
    StoppingPlan(monitor='train_loss', tol=0.001, n_iter_no_change=5)
    >>> plan_stopping(None, 5, validation=False).monitor
    'none'
    """
    if validation:
        monitor = "validation_score"
    elif on_train_loss and tol is not None:
        monitor = "train_loss"
    else:
        monitor = "none"
    return StoppingPlan(monitor, tol, n_iter_no_change)


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
    """

    residual_tol: float
    stated_tol: float
    residual_patience: int | None
    objective: StoppingPlan


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
        stall is read).

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
    )
