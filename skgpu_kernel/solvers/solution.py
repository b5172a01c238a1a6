"""What every kernel solver takes and returns: ``solve_<name>(operator, targets, plan) -> Solution``.

Each solver module (:mod:`~skgpu_kernel.solvers.eigenpro`,
:mod:`~skgpu_kernel.solvers.eigenpro3`, :mod:`~skgpu_kernel.solvers.full_kernel_cg`,
:mod:`~skgpu_kernel.solvers.centers_cg`, :mod:`~skgpu_kernel.solvers.direct`) has
one entry point of that shape:

``operator``
    How ``K @ V`` is computed (a :class:`~skgpu_kernel.operators.KernelOperator`,
    the centers' :class:`~skgpu_kernel.operators.CenterShards`, or CG on centers'
    row blocks): evaluated, cached, on a grid or sharded, which the solver never
    asks.
``targets``
    What the model is fitted to: :class:`Targets` (or, for EigenPro 3, the batches
    of rows that carry their targets).
``plan``
    How: the solver's plan (step sizes, preconditioner, penalty, starting
    coefficients), which also says when the solver stops and where it reports
    (EigenPro's :class:`~skgpu_kernel.solvers.eigenpro.EigenProPlan`, CG's
    settings).

Every solver returns a :class:`Solution`.
"""

from dataclasses import dataclass, field

import torch

__all__ = ["Solution", "Targets"]


@dataclass(frozen=True)
class Targets:
    """The values a kernel model is fitted to, with their weights.

    Parameters
    ----------
    Y : Tensor of shape (n, l)
        On the operator's device.
    weights : Tensor of shape (n,) or None
        Per-row factors in (0, 1] (normalised sample weights); None for unit weights.
    """

    Y: torch.Tensor
    weights: torch.Tensor | None = None


@dataclass
class Solution:
    """What a kernel solver (EigenPro 2 or 3, conjugate gradients, a direct solve) found.

    Attributes
    ----------
    coef : Tensor of shape (p, l)
    n_epochs : int
        Epochs (CG: iterations, one pass over the data each) run.
    n_steps : int
        Updates made (CG: iterations).
    batch_size : int or None
        The batch the loop ended with (after any out-of-memory halving); None for
        CG and direct solves.
    learning_rate : float or None
        Step size of the last update; None for CG and direct solves.
    history : list of dict
        One :func:`~skgpu_kernel.solvers.epochs.epoch_record` per epoch (CG: per
        iteration, with the key ``relative_residual`` after the core keys).
    n_projections : int
        Projections onto the centers (EigenPro 3; 0 otherwise).
    stop : str or None
        Why the solver ended, for those that stop on a tolerance (None for the
        EigenPro loops): ``"converged"`` (a direct solve's; for CG: (every output met ``tol``; an output that met
        it is not updated again while the others iterate), ``"objective"`` (the
        ``stopping`` plan), ``"residual stalled"`` (``n_iter_no_change``),
        ``"objective grew"`` (rounding; the best coefficients kept),
        ``"diverged"`` (the training objective broke ``objective_divergence``; the
        best coefficients kept), ``"curvature"`` (a column's curvature was not
        positive) or ``"iterations"`` (``max_iterations``)), or ``"trivial model"``
        where the driver replaced every attempt's model by the trivial one.
    jitter : float
        The relative jitter CG on centers' factorisation of ``K(Z, Z)`` used (0 otherwise).
    intercept : Tensor of shape (l,) or None
        The unpenalised intercept solved with the coefficients (the tune stage's
        exact kernel ridge); None where the finish stage fits it.
    warnings : tuple of (str, type)
        What the solver reports to the user, with the warning's category: a
        divergence rolled back, rounding that stopped CG.  A solver never warns;
        the fit raises these (``AttemptContext.reported``).
    """

    coef: torch.Tensor
    n_epochs: int
    n_steps: int
    batch_size: int | None = None
    learning_rate: float | None = None
    history: list = field(default_factory=list)
    n_projections: int = 0
    stop: str | None = None
    jitter: float = 0.0
    intercept: torch.Tensor | None = None
    warnings: tuple = ()

    @property
    def converged(self):
        """Whether the solver met its tolerance (None for the EigenPro loops, which have none)."""
        return None if self.stop is None else self.stop == "converged"

    @classmethod
    def direct(cls, coef, intercept=None):
        """The record of a direct solve: the exact solution, no epochs, no steps, no history."""
        return cls(coef, 0, 0, stop="converged", intercept=intercept)

    @classmethod
    def of_cg(cls, coef, history, stop, jitter=0.0, warnings=()):
        """A CG run's: one epoch and one step per iteration."""
        n = len(history)
        return cls(coef, n, n, history=history, stop=stop, jitter=jitter, warnings=warnings)
