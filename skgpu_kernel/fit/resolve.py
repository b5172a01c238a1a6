"""The resolve stage: every choice that needs no tuning (kernel by rule, ``n_centers="auto"``, policy)."""

import dataclasses

from ..kernels import make_kernel
from ..planning.kernel import KernelProblem
from ..planning.kernel_policy import plan_kernel_fit
from ..planning.solver import plan_auto_centers
from ..row_sources import is_out_of_core
from .registry import AUTO, solver_attempt
from .request import log_fit


def resolve(data, parameters, runtime):
    """The resolve stage: the kernel (its bandwidth by rule), ``n_centers="auto"`` counted, streaming, the policy.

    Parameters
    ----------
    data : KernelFitInput
    parameters : KernelFitParameters
    runtime : KernelRuntime

    Returns
    -------
    FitPlan
        Untuned, holding ``parameters`` and the rows (``n_centers="auto"``
        counted), which every later stage reads from it.
    """
    kernel, _ = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, data.X)
    data = _resolve_auto_centers(data, runtime, parameters, kernel)
    if parameters.solver != AUTO:  # a solver named for a layout it has no attempt for is refused before tuning
        solver_attempt(parameters.solver, data.uses_centers)
    streamed = data.uses_centers and streams_rows(data.X, data.Y.shape[1], runtime)
    plan = plan_kernel_fit(policy_problem(data, runtime, kernel, streamed), runtime.budget, parameters)
    return dataclasses.replace(plan, kernel=kernel, data=data)


def policy_problem(data, runtime, kernel, streamed):
    """The sizes the policy plans with: every row, the kernel's own blocks and bound, the centers' shards."""
    n_rows, n_features = data.X.shape
    n_centers = None
    if data.uses_centers:
        n_centers = min(data.n_centers, n_rows) if data.centers is None else data.centers.shape[0]
    return KernelProblem(
        n_rows,
        n_features,
        data.Y.shape[1],
        runtime.itemsize,
        kernel.extra_blocks,
        n_centers=n_centers,
        n_shards=runtime.n_shards,
        streamed=streamed,
        unit_bounded_kernel=kernel.unit_bounded,
        held_bytes=runtime.held_bytes,
        weighted=not data.equal_weights,
    )


def _resolve_auto_centers(data, runtime, parameters, kernel):
    """``data`` with ``n_centers="auto"`` replaced by :func:`plan_auto_centers`'s count (None: every point)."""
    if data.n_centers != "auto":
        return data
    if data.centers is not None:  # the user's centers: nothing to count
        return dataclasses.replace(data, n_centers=None)
    streamed = streams_rows(data.X, data.Y.shape[1], runtime)
    problem = policy_problem(dataclasses.replace(data, n_centers=None), runtime, kernel, streamed)
    count = plan_auto_centers(problem, runtime.budget, runtime.devices[0], parameters)
    chosen = "every training point" if count.n_centers is None else str(count.n_centers)
    log_fit(runtime, parameters, f"n_centers='auto' on {problem.n_rows} rows: {chosen} ({count.reason})")
    return dataclasses.replace(data, n_centers=count.n_centers)


def streams_rows(X, n_outputs, runtime):
    """Whether EigenPro 3 streams ``X``: a memory-mapped file whose device copy would take over half the budget."""
    return is_out_of_core(X, runtime.itemsize * X.shape[0] * (X.shape[1] + n_outputs + 1), runtime.budget)
