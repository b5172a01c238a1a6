"""The plan stage: the solver the driver starts with (the tune stage's solution, a factorisation, or the policy's)."""

import dataclasses

from ..planning.kernel_policy import DIRECT_FACTORED, plan_direct_solve


def choose_solver(plan):
    """The solver stage's choice: the tune stage's solution, one factorisation, or the policy's solver.

    Returns
    -------
    FitPlan
        With ``direct`` (:func:`~skgpu_kernel.planning.kernel_policy.plan_direct_solve`), and ``solver``
        ``"direct"`` where it is a factorisation.
    """
    parameters = plan.parameters
    warm_start, every_iteration = plan.data.continuation is not None, parameters.tol is None
    exact = plan.solves(plan.data.X)
    direct = plan_direct_solve(plan, exact, parameters.fit_intercept, warm_start, every_iteration)
    solver = "direct" if direct == DIRECT_FACTORED else plan.solver
    return dataclasses.replace(plan, direct=direct, solver=solver)
