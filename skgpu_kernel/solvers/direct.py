"""Kernel ridge by one Cholesky factorisation: the direct solver on every training point.

With a center at every training row and a penalty ``alpha > 0``, the package's one
model (``sum_i w_i (y_i - f(x_i))^2 + alpha a^T K a``) has coefficients solving
``(K + alpha W^-1) a = y``.  Where the ``n x n`` system fits the device, one
factorisation solves it exactly, for every target column at once (the fit's
column of ones for the unpenalised intercept included).  No sklearn, no device or
cache branches: the kernel matrix comes from the operator it is handed.
"""

import torch

from .solution import Solution

__all__ = ["solve_direct"]


def solve_direct(operator, targets, plan):
    """The coefficients ``a`` of ``(K + alpha W^-1) a = Y``, or None where rounding breaks the factorisation.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, X)`` in float64 (:meth:`~skgpu_kernel.operators.KernelOperator.block`
        gives the whole matrix).
    targets : Targets
        ``Y`` of shape (n, l), float64, on the operator's device; the weights
        ``w`` (n,), positive, or None for unit weights.
    plan : float
        The penalty ``alpha > 0`` (a direct solve has nothing else to plan).

    Returns
    -------
    Solution or None
        ``coef`` in float64.  None where ``K + alpha W^-1`` is not positive
        definite to float64's precision (a penalty below the kernel matrix's
        rounding).
    """
    weights = targets.weights
    penalties = plan / weights if weights is not None else torch.full_like(targets.Y[:, 0], plan)
    gram = operator.block()
    # Out of place: a cached operator's block() may be its cache itself, which the fit reads again.
    system = torch.diagonal_scatter(gram, gram.diagonal() + penalties)
    del gram  # an evaluated block goes back before the factor is made: at most the planned three n x n
    factor, info = torch.linalg.cholesky_ex(system)
    del system  # the factor is a new matrix: the system's memory goes back before the solve
    if int(info) != 0:
        return None
    return Solution.direct(torch.cholesky_solve(targets.Y, factor))
