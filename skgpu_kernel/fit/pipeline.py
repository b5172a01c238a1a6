"""A kernel fit, stage by stage: resolve, tune, plan, solve (prepare, operator, solver, fallbacks, finish)."""

import dataclasses

from .plan import choose_solver
from .resolve import resolve
from .solve import solve
from .tune import applied_tuning, tune


def fit_kernel_model(request, runtime, plan=None):
    """Resolve, tune, choose the solver, solve: EigenPro 2, EigenPro 3, CG, or the tune stage's direct solution.

    Parameters
    ----------
    request : FitRequest
    runtime : KernelRuntime
    plan : FitPlan or None, default=None
        A tuned plan (:func:`tune_kernel`'s) of the same parameters on these rows or
        on a superset of them, whose bandwidth and penalty feature learning's fits on
        its training rows reuse; None: tuned here.

    Returns
    -------
    KernelFitResult
    """
    resolved = resolve(request, runtime)
    if plan is not None:
        resolved = dataclasses.replace(resolved, tuning=applied_tuning(plan.tuning, resolved))
    return solve(request, runtime, choose_solver(request, tune(request, runtime, resolved)))
