"""A kernel fit, stage by stage: resolve, tune, plan, solve (prepare, operator, solver, fallbacks, finish).

:func:`fit_kernel_model` is the one fit function of the kernel machines: each
stage is a module of this package and adds its decisions to one
:class:`~skgpu_kernel.planning.kernel_policy.FitPlan`.  Random draws happen in a fixed order
(validation split, shuffle, then a streamed fit's seed), so that a seed gives the
same model whatever the path.
"""

from ..out_of_memory import MemoryEvents, record_with_events
from .plan import choose_solver
from .request import log_fit
from .resolve import resolve
from .solve import solve
from .tune import applied_tuning, tune


def fit_kernel_model(data, parameters, runtime, plan=None):
    """Resolve, tune, choose the solver, solve: EigenPro 2, EigenPro 3, CG, or the tune stage's direct solution.

    Parameters
    ----------
    data : KernelFitInput
        The validated rows.
    parameters : KernelFitParameters
        The estimator's.
    runtime : KernelRuntime
    plan : FitPlan or None, default=None
        A tuned plan (:func:`tune_kernel`'s) of the same parameters on these rows or
        on a superset of them, whose bandwidth and penalty feature learning's fits on
        its training rows reuse; None: tuned here.  Where the handed tuning does not
        apply to these rows' policy, the tune stage runs again and the fit's record
        (``fit_attempts_``) says so (event ``"ran_again"``, stage ``"tune"``).

    Returns
    -------
    KernelFitResult
    """
    resolved = resolve(data, parameters, runtime)
    if plan is not None:
        applied = applied_tuning(plan, resolved)
        if applied is None:  # the tune stage runs again, and says so in the record
            reason = "the tuning handed in scored no alpha where these rows' policy asks for one, or one where it "
            rerun = MemoryEvents()
            rerun.ran_again("tune", reason + "asks for none")
            runtime = runtime.recorded(record_with_events(runtime.memory_events, rerun, None))  # before any solver
            log_fit(runtime, parameters, f"{reason}asks for none: tuned again")
        else:
            resolved = applied
    return solve(runtime, choose_solver(tune(runtime, resolved)))
