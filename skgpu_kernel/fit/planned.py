"""A registered solver's attempt on every training point: its planning rule, the operator of ``K(X, X)``, its solve.

The path every solver written as ``plan_<name>(problem, budget, alpha)`` plus
``solve_<name>(operator, targets, plan)`` runs by (the direct solve's, and any a
contributor registers: :mod:`skgpu_kernel.fit.registry`): nothing here knows
which solver it runs.
"""

import dataclasses

import torch

from ..blockwise import DeviceCopier, rows_taken
from ..operators import CenterOperators, OperatorBlocks
from ..planning.run import plan_registered_run
from ..solvers.solution import Targets
from .attempts import Fallback, FallbackNeeded
from .finish import KernelFitResult


def run_planned(context, attempt, solver):
    """Every training row a center: ``solver.solve(K(X, X), targets, solver.rule(problem, budget, alpha))``.

    The rule plans from the fit's sizes, its memory budget and the attempt's
    penalty (it raises ``ValueError`` where the solver cannot run).  ``K(X, X)``
    is an operator of :class:`~skgpu_kernel.operators.CenterOperators` on the
    rows centred in float64, the targets ``Y`` and the normalised weights in
    float64 on the device; the coefficients are kept in the fit's dtype.  Where
    the solver finds no solution (it returns None), or the device has no room for
    it, the driver is asked for CG on every point instead.

    Parameters
    ----------
    context : AttemptContext
    attempt : Attempt
    solver : RegisteredSolver

    Returns
    -------
    KernelFitResult
    """
    data, runtime, kernel, device = context.prepared, context.runtime, context.kernel, context.device
    plan = plan_registered_run(solver.rule, context.problem_with(), attempt.plan)
    centers = data.X[data.order]  # every training row, in the fit's order
    # One copy of the rows to the device, uncentred in float64: K is evaluated on them
    # centred in float64, and the prediction tensors hold them centred in the fit's dtype.
    uncentred = DeviceCopier(device, torch.float64, None)(rows_taken(data.X, data.X_device, data.order))
    rows = DeviceCopier(device, torch.float64, data.offset).centred(uncentred)
    whole = OperatorBlocks.whole(rows.shape[0], rows.shape[0])
    operator = CenterOperators.of(kernel, rows).operator(rows, whole)
    targets = torch.as_tensor(data.Y[data.order], dtype=torch.float64, device=device)
    weights = torch.as_tensor(data.weights[data.order], dtype=torch.float64, device=device)

    def solved_in(kind):
        if kind != "in memory":
            return None
        solution = solver.solve(operator, Targets(targets, weights), plan)
        return None if solution is None else context.reported(solution)

    solved = context.shrinking(f"{solver.name} solve", "n x n system", ("in memory", "iterative"))(solved_in)
    operator = rows = None  # K(X, X) freed before the prediction tensors are made
    if solved is None:
        reason = (
            f"{solver.name} found no solution of K + alpha W^-1 on {targets.shape[0]} rows here (alpha "
            f"{attempt.alpha:.3g} below the kernel's rounding, or no room for its n x n matrices): CG on every "
            "point fits it instead"
        )
        raise FallbackNeeded(Fallback.of(reason, solver="cg"))
    coef = solved.coef.to(runtime.dtype)
    if runtime.log is not None:
        where = f"[{context.parameters.name}] device={device}, dtype={runtime.dtype}"
        runtime.log(f"{where}, solver {solver.name}: K + alpha W^-1 solved on {targets.shape[0]} rows")
    # The prediction tensors hold the rows as every path does: centred in the fit's dtype.
    device_cache = context.prediction_tensors(kernel.prepare_centers(context.to_device.centred(uncentred)), coef)
    return KernelFitResult(dataclasses.replace(solved, coef=coef), centers=centers, device_cache=device_cache)
