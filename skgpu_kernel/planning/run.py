"""The plan of one solver run: every decision of an attempt, made by one call before any operator is built.

:func:`plan_run` turns an attempt's problem (its sizes), the fit's plan (the
memory budget, the parameters, the penalty) and the run's measuring step into one
frozen :class:`~skgpu_kernel.planning.eigenpro.KernelFitPlan`: the layout, the
batch and blocks, the operator plan, EigenPro's spectrum, the stopping rule and
the memory account.  Four runs are planned here: EigenPro 2 and CG with a center
at every training point, EigenPro 3 and CG on centers.

What only the device can tell is measured by the run's measuring step,
``measure``, which this call asks, each once, for the layout chosen:

1. ``measure.operator(problem)``: the operator's facts, the grid the rows lie on
   and the speed of int8 products (every run);
2. ``measure.agreed(choices)``: the layout's choices every rank of a process group
   takes (EigenPro 3);
3. ``measure.capacity(layout)``: the batch capacity
   (:class:`~skgpu_kernel.device.SaturationBatch`) of the layout (EigenPro);
4. ``measure.spectrum(layout, capacity)``: the preconditioner's spectrum on the
   layout's Nystrom subsample (EigenPro);
5. ``measure.condition(layout, max_components)``: the preconditioned system's
   estimated condition number (CG on every point).

Each answer is recorded on the plan.  A registered solver's run is planned by its
own rule, called here too (:func:`plan_registered_run`).  The step also tells the rows' facts the
plan reads: ``measure.device``, ``measure.held_out`` (held-out rows score each
epoch) and ``measure.ridge`` (the penalty on the scale of the normalised weights).
Planning computes nothing on tensors, draws nothing and warns of nothing: a
decision the user must hear of is in the plan's ``warnings``.  A fallback (half
the subsample or the batch, a 32-bit cache, a larger penalty) is a new attempt
planned by this same call with its changed parameters.
"""

import dataclasses

from .eigenpro import (
    fit_plan,
    plan_eigenpro2,
    plan_eigenpro2_layout,
    plan_eigenpro3,
    plan_eigenpro3_layout,
)
from .operator import operator_problem, plan_operator
from .solver import CG_MAX_CONDITION, CG_ROW_BLOCK, full_kernel_cg_conditioned, plan_centers_cg, plan_every_point_cg
from .stopping import plan_cg_stopping, plan_stopping

__all__ = ["RUNS", "plan_registered_run", "plan_run"]


def plan_run(run, problem, attempt_plan, measure):
    """Every decision of one solver run, in one frozen plan.

    Parameters
    ----------
    run : {"eigenpro2", "eigenpro3", "cg", "centers_cg"}
        EigenPro 2 or CG (``"cg"``) with a center at every training point, EigenPro 3
        or CG on centers.
    problem : KernelProblem
        The attempt's sizes (its training rows, centers, shards), before the
        operator's facts are known.
    attempt_plan : FitPlan
        The attempt's plan: the memory budget and the parameters it plans with.
    measure : object
        The run's measuring step (see the module's docstring).

    Returns
    -------
    KernelFitPlan
    """
    measurements = measure.operator(problem)
    problem = operator_problem(problem, measurements)
    plan = RUNS[run](problem, attempt_plan, measure)
    operator = plan_operator(problem, measurements, plan.cache_itemsize)
    return dataclasses.replace(plan, operator=operator)


def _plan_eigenpro(layout, plan_batch, attempt_plan, measure):
    """An EigenPro run on ``layout``: the capacity and spectrum measured for it, then its batch and blocks."""
    capacity = measure.capacity(layout)
    spectrum = measure.spectrum(layout, capacity.batch)
    parameters = attempt_plan.parameters
    plan = plan_batch(layout, capacity.batch, spectrum.critical_batch_preconditioned, parameters)
    stopping = plan_stopping(parameters.tol, parameters.n_iter_no_change, validation=measure.held_out)
    return dataclasses.replace(plan, spectrum=spectrum, throughputs=capacity.throughputs, stopping=stopping)


def _plan_eigenpro2(problem, attempt_plan, measure):
    layout = plan_eigenpro2_layout(problem, attempt_plan.budget, measure.device, attempt_plan.parameters)
    return _plan_eigenpro(layout, plan_eigenpro2, attempt_plan, measure)


def _plan_eigenpro3(problem, attempt_plan, measure):
    """EigenPro 3's run, on the layout choices every rank takes (ranks may see different free memory)."""
    budget, parameters = attempt_plan.budget, attempt_plan.parameters
    layout = plan_eigenpro3_layout(problem, budget, measure.device, parameters)
    choices = measure.agreed(layout.choices)
    if tuple(choices) != layout.choices:
        layout = plan_eigenpro3_layout(problem, budget, measure.device, parameters, choices)
    return _plan_eigenpro(layout, plan_eigenpro3, attempt_plan, measure)


def _cg_stopping(problem, parameters, square_system=False):
    """CG's stopping rule for the run's ``tol`` in its dtype (float64: 8-byte entries)."""
    float64 = problem.itemsize == 8
    return plan_cg_stopping(parameters.tol, parameters.n_iter_no_change, float64, square_system)


def _plan_every_point_cg(problem, attempt_plan, measure):
    """CG on every point: EigenPro 2's layout (a 16-bit cache only where its rounding is harmless), its condition."""
    parameters = attempt_plan.parameters
    layout = plan_eigenpro2_layout(problem, attempt_plan.budget, measure.device, parameters, measure.ridge)
    plan = plan_every_point_cg(layout)
    condition = measure.condition(layout, plan.max_components)
    declined = None
    if not full_kernel_cg_conditioned(condition):
        declined = (
            f"alpha {measure.ridge:.3g} leaves CG's preconditioned system a condition of about {condition:.3g} "
            f"(> {CG_MAX_CONDITION:g}): EigenPro 2 fits it instead"
        )
    # CG's residual on this square system is not monotone (CG lowers the error's
    # A-norm), so no stall rule reads it: its own objective stops it below float64.
    stopping = _cg_stopping(problem, parameters, square_system=True)
    return dataclasses.replace(plan, condition=condition, declined=declined, stopping=stopping)


def _plan_centers_cg(problem, attempt_plan, measure):
    """CG on centers: ``K(X, Z)`` stored where it fits, read in row blocks of ``CG_ROW_BLOCK`` (no capacity: 0)."""
    layout = plan_centers_cg(problem, attempt_plan.budget, required=True)
    stopping = _cg_stopping(problem, attempt_plan.parameters)
    return fit_plan("centers_cg", (layout, 0, CG_ROW_BLOCK, layout.account), row_block=CG_ROW_BLOCK, stopping=stopping)


def plan_registered_run(rule, problem, attempt_plan):
    """A registered solver's run: its own planning rule on the attempt's sizes, memory budget and penalty.

    Parameters
    ----------
    rule : callable
        ``plan_<name>(problem, budget, alpha) -> plan`` (``fit.registry``).
    problem : KernelProblem
    attempt_plan : FitPlan

    Returns
    -------
    object
        What the rule returns: the plan its ``solve_<name>`` reads.
    """
    return rule(problem, attempt_plan.budget, attempt_plan.alpha)


# The planning rule of each run.
RUNS = {
    "eigenpro2": _plan_eigenpro2,
    "eigenpro3": _plan_eigenpro3,
    "cg": _plan_every_point_cg,
    "centers_cg": _plan_centers_cg,
}
