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
"""

from dataclasses import dataclass

__all__ = ["MONITORS", "NEVER", "StoppingPlan", "plan_stopping"]

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
