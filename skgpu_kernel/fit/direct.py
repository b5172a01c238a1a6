"""The direct attempt: one factorisation of ``K + alpha W^-1``."""

import dataclasses

import torch

from ..blockwise import DeviceCopier, rows_taken
from ..operators import CenterOperators, OperatorBlocks
from ..solvers.direct import solve_direct
from ..solvers.solution import Targets
from .attempts import Fallback, FallbackNeeded
from .finish import KernelFitResult


def run_direct(context, attempt):
    """Every training row a center, ``alpha > 0``, ``n x n`` in the budget: one factorisation of ``K + alpha W^-1``.

    ``K(X, X)`` is evaluated once in float64 through an operator of
    :class:`~skgpu_kernel.operators.CenterOperators` and handed to
    :func:`~skgpu_kernel.solvers.direct.solve_direct`.  Where rounding breaks
    the factorisation, or the device has no room for the ``n x n`` matrices, the
    driver is asked for CG on every point instead.
    """
    data, runtime, kernel, device = context.prepared, context.runtime, context.kernel, context.device
    centers = data.X[data.order]  # every training row, in the fit's order
    # One copy of the rows to the device, uncentred in float64: K is evaluated on them
    # centred in float64, and the prediction tensors hold them centred in the fit's dtype.
    uncentred = DeviceCopier(device, torch.float64, None)(rows_taken(data.X, data.X_device, data.order))
    rows = DeviceCopier(device, torch.float64, context.prepared.offset).centred(uncentred)
    whole = OperatorBlocks.whole(rows.shape[0], rows.shape[0])
    operator = CenterOperators.of(kernel, rows).operator(rows, whole)
    targets = torch.as_tensor(data.Y[data.order], dtype=torch.float64, device=device)
    weights = torch.as_tensor(data.weights[data.order], dtype=torch.float64, device=device)

    def factored(kind):
        if kind == "factored":
            return solve_direct(operator, Targets(targets, weights), attempt.alpha)
        return None

    solved = context.shrinking("direct solve", "n x n factorisation", ("factored", "iterative"))(factored)
    operator = rows = None  # K(X, X) freed before the prediction tensors are made
    if solved is None:
        reason = (
            f"K + alpha W^-1 on {targets.shape[0]} rows could not be factored here (alpha {attempt.alpha:.3g} "
            "below the kernel's rounding, or no room for the n x n matrices): CG on every point fits it instead"
        )
        raise FallbackNeeded(Fallback(reason, solver="cg"))
    coef = solved.coef.to(runtime.dtype)
    if runtime.log is not None:
        where = f"device={device}, dtype={runtime.dtype}"
        runtime.log(
            f"[{context.prepared.parameters.name}] {where}, solver direct: K + alpha W^-1 factored on "
            f"{targets.shape[0]} rows"
        )
    # The prediction tensors hold the rows as every path does: centred in the fit's dtype.
    device_cache = context.prediction_tensors(kernel.prepare_centers(context.to_device.centred(uncentred)), coef)
    return KernelFitResult(dataclasses.replace(solved, coef=coef), centers=centers, device_cache=device_cache)
