"""CG attempts: on every point (pivoted Cholesky preconditioner) and on centers (Falkon's)."""

import dataclasses
import functools
import time

import torch
from sklearn.exceptions import ConvergenceWarning

from .._validation import unequal_weights
from .._warnings import warn_user
from ..cg_preconditioner import PenalisedRows, shifted_condition, shifted_rpcholesky_preconditioner
from ..operators.row_blocks import center_operator
from ..out_of_memory import in_row_blocks
from ..planning.run import plan_run
from ..preconditioner import nystrom_eigenvalues
from ..solvers.centers_cg import solve_centers_cg
from ..solvers.conjugate_gradients import CGPlan, CGSettings
from ..solvers.full_kernel_cg import solve_full_kernel_cg
from ..solvers.solution import Targets
from .attempts import CG_FALLBACK_REFITS, Fallback, FallbackNeeded, larger_penalty, safer_attempt
from .context import MeasuringStep
from .finish import KernelFitResult
from .operator import CentersOperator, EveryPointOperators, centers_row_blocks, stored_plan

_ROUNDING_STOPS = ("curvature", "objective grew")


# CG on every point that ended by one of these stops above its stated residual is refit
# by the driver's safe changes (safer_attempt): its operator was not positive definite
# to the digits its penalty needs, or rounding took over.
_BROKEN_STOPS = ("curvature", "objective grew", "diverged")


def run_every_point_cg(context, attempt):
    """Every training row a center, ``alpha > 0``: CG on ``K + alpha W^-1`` with a pivoted Cholesky preconditioner.

    It keeps (or evaluates) ``K(X, X)`` as EigenPro 2 does, in the same memory
    layout (:func:`~skgpu_kernel.planning.solver.plan_every_point_cg`), and reads it
    once per iteration.  The run is planned in one call
    (:func:`~skgpu_kernel.planning.run.plan_run`), whose measuring step estimates the
    preconditioned system's condition from a Nystrom subsample's spectrum, the tune
    stage's where it has one of this kernel (:func:`_subsample_spectrum`); beyond
    :data:`~skgpu_kernel.planning.solver.CG_MAX_CONDITION` the attempt asks the driver for EigenPro 2.  The
    preconditioner is built from a randomly pivoted Cholesky factor of ``K``
    (:func:`shifted_rpcholesky_preconditioner`).  Up to
    :data:`~skgpu_kernel.planning.solver.FULL_KERNEL_CG_MAX_ROWS` rows the fit is
    solved directly instead.
    """
    runtime, parameters, data = context.runtime, context.parameters, context.prepared
    rows = EveryPointOperators(context)
    weights = context.weights_tensor(data.weights[data.order])
    penalised = PenalisedRows(rows.problem.n_rows, context.ridge(), weights, runtime.dtype)
    condition = functools.partial(_condition, context, rows.X_dev, penalised)
    plan = plan_run("cg", rows.problem, context.plan, MeasuringStep(context, rows.X_dev, condition=condition))
    _check_cg_conditioned(context, plan)
    rows.build(plan)
    Y = context.to_device(data.Y[data.order], center=False)
    tic = time.perf_counter()
    preconditioner = shifted_rpcholesky_preconditioner(
        context.kernel, rows.X_dev, penalised, plan.max_components, runtime.generator
    )
    if runtime.log is not None:
        runtime.log(
            f"[{parameters.name}] device={context.device}, dtype={runtime.dtype}, n={rows.problem.n_rows}, solver cg "
            f"on every training point, preconditioner flattening {preconditioner.n_components} directions of a "
            f"randomly pivoted Cholesky factor of K down to alpha ({time.perf_counter() - tic:.1f} s), "
            f"{plan.describe()}"
        )
    coef_init = None if context.coef_init is None else context.starting_coef(rows.problem.n_rows)
    cg_plan = CGPlan(penalised.alpha, _cg_settings(parameters, runtime, plan), preconditioner, coef_init)
    solved = context.reported(solve_full_kernel_cg(rows.train, Targets(Y, weights), cg_plan))
    if _broken_down(solved, plan.stopping, parameters):
        residual = solved.history[-1]["relative_residual"]
        iterations = len(solved.history)
        why = f"CG on every point stopped ({solved.stop}) after {iterations} iterations (residual {residual:.3g})"
        fallback = safer_attempt(attempt, KernelFitResult(None, attempt=attempt.ran(plan)), data, runtime.dtype, why)
        if fallback is not None:
            return KernelFitResult(None, fallback=fallback)
    coef = solved.coef.to(runtime.dtype)
    _warn_if_unfinished(solved, runtime.dtype, plan.stopping, parameters, "on every point")
    result = _cg_loop_result(solved, coef, rows.held_out_score())
    rows.report_epochs(result, plan, rows.train)
    rows.release()  # as in _run_eigenpro: the cache freed before the centers are copied out
    device_cache = rows.device_cache(coef)
    return KernelFitResult(result, centers=rows.centers_host(), device_cache=device_cache, attempt=attempt.ran(plan))


def _condition(context, rows, penalised, layout, max_components):
    """CG's estimated condition with ``max_components`` directions flattened, on ``layout``'s Nystrom subsample."""
    size = layout.subsample_size
    eigenvalues = context.on_subsample(lambda: _subsample_spectrum(context, rows, size), size)
    return shifted_condition(eigenvalues, penalised, max_components)


def _subsample_spectrum(context, X_dev, size):
    """The eigenvalues of ``K_S / s`` on ``size`` rows, for the condition estimate alone (no eigenvectors).

    The tune stage's where it decomposed as many rows of this kernel (another seeded
    draw of the rows, an estimate of the same spectrum), else those of the first
    ``size`` rows here.
    """
    tuned = context.prepared.nystrom_eigenvalues
    if tuned is not None and tuned.shape[0] == size:
        return tuned
    return nystrom_eigenvalues(context.kernel, X_dev[:size])


def _check_cg_conditioned(context, plan):
    """Ask the driver for EigenPro 2 where the plan declined CG (its system's condition beyond CG's bound)."""
    if plan.declined is None:
        return
    if context.runtime.log is not None:
        context.runtime.log(f"[{context.parameters.name}] {plan.declined}")
    raise FallbackNeeded(Fallback.of(plan.declined, solver="eigenpro"))


def run_centers_cg(context, attempt):
    """Penalised least squares on the centers by Falkon-preconditioned CG (no spectrum, no batches).

    Where rounding breaks CG down above its stated residual, it asks the driver to
    refit from where it ended with a penalty ten times larger (at most
    :data:`CG_FALLBACK_REFITS` times): the penalty the fit ends with is ``alpha_``.
    """
    prepared, runtime, kernel = context.prepared, context.runtime, context.kernel
    to_device = context.to_device
    centers = context.centers()
    X, Y = context.rows(prepared.order), to_device(prepared.Y[prepared.order], center=False)
    weights = prepared.weights
    weights = None if unequal_weights(weights) is None else to_device(weights[prepared.order], center=False)
    problem = context.problem_with(n_centers=centers.shape[0], centers_from_data=prepared.centers_from_data)
    step = MeasuringStep(context, X, None if prepared.centers_from_data else centers)
    plan = plan_run("centers_cg", problem, context.plan, step)
    operator = CentersOperator.build(context, plan.operator, X, centers)
    rows = centers_row_blocks(context, operator, centers)
    if runtime.log is not None:
        runtime.log(
            f"[{context.parameters.name}] device={context.device}, dtype={runtime.dtype}, n={X.shape[0]}, solver cg "
            f"on {centers.shape[0]} centers, K(X, Z): {operator.plan.describe()}, {plan.describe()}"
        )
    coef_init = None if context.coef_init is None else context.coef_init.to(context.device)
    shares = None if prepared.center_shares is None else torch.as_tensor(prepared.center_shares)
    cg_settings = _cg_settings(context.parameters, runtime, plan)
    cg_plan = CGPlan(context.alpha, cg_settings, coef_init=coef_init, center_shares=shares)
    solved = context.reported(solve_centers_cg(rows, Targets(Y, weights), cg_plan))
    if attempt.n_refits < CG_FALLBACK_REFITS:
        refit = _centers_cg_refit(context, solved, plan.stopping)
        if refit is not None:
            return KernelFitResult(None, fallback=refit)
    coef = solved.coef.to(runtime.dtype)
    _warn_if_unfinished(solved, runtime.dtype, plan.stopping, context.parameters, "on the centers")
    result = _cg_loop_result(solved, coef, _centers_held_out_score(context, centers))
    device_cache = context.prediction_tensors(kernel.prepare_centers(centers), coef, operator.plan, operator.codes)
    plan = dataclasses.replace(plan, operator=stored_plan(operator, rows))  # as carried out
    return KernelFitResult(result, centers=prepared.centers, device_cache=device_cache, attempt=attempt.ran(plan))


def _centers_held_out_score(context, centers):
    """``score(coef)`` of the held-out rows' ``K(X_val, Z) @ coef`` (row blocks halved on out of memory), or None."""
    validation = context.validation_tensors()
    if validation is None:
        return None
    X_val, n_rows, kernel = validation.X, validation.X.shape[0], context.kernel

    def predict(coef, row_block):
        return in_row_blocks(
            lambda rows: center_operator(kernel, X_val[rows], centers, row_block).block_matmul(coef), n_rows, row_block
        )

    return context.held_out_score(predict, n_rows, validation.Y)


def _centers_cg_refit(context, solved, stopping):
    """The refit with a larger penalty where rounding broke CG down above its stated residual, else None."""
    dtype, alpha, parameters = context.runtime.dtype, context.alpha, context.parameters
    residual = _unfinished_residual(solved, stopping, parameters)
    if residual is None or solved.stop not in _ROUNDING_STOPS:
        return None
    larger = larger_penalty(alpha, dtype, context.prepared)
    reason = f"CG stopped ({solved.stop}) at a relative residual of {residual:.3g} in {dtype}"
    warning = (
        f"Conjugate gradients on the centers stopped ({solved.stop}) at a relative residual of "
        f"{residual:.3g}, above its tolerance {stopping.stated_tol:g} for "
        f"{dtype}: rounding limits the fit at "
        f"alpha={alpha:.3g}. Refitting from there with alpha={larger:.3g} (alpha_ holds the penalty used); "
        "set a larger alpha or dtype='float64' to keep the fit as asked."
    )
    return Fallback.of(reason, alpha=larger, coef_init=solved.coef, warning=warning)


def _cg_settings(parameters, runtime, plan):
    """How a CG run iterates: the estimator's ``n_epochs`` as the bound, the ``plan``'s stopping rule."""
    stopping = plan.stopping
    return CGSettings(
        max_iterations=parameters.n_epochs,
        tol=stopping.residual_tol,
        log=runtime.log,
        n_iter_no_change=stopping.residual_patience,
        stopping=stopping.objective,
        objective_divergence=stopping.objective_divergence,
    )


def _cg_loop_result(solved, coef, held_out_score=None):
    """A CG run's :class:`Solution` with ``coef``; ``held_out_score(coef)``, if given, scores the model it ends with.

    CG heads for the exact solution, so the validation score is not a stopping rule
    here: it is recorded on the last iteration's history entry.
    """
    history = solved.history
    if held_out_score is not None and history:
        history[-1] = {**history[-1], "validation_score": float(held_out_score(coef))}
    return dataclasses.replace(solved, coef=coef, history=history)


def _warn_if_unfinished(solved, dtype, stopping, parameters, where):
    """A ``ConvergenceWarning`` when CG ``where`` (on the centers, on every point) ended unfinished.

    See :func:`_unfinished_residual`; growth of the objective has warned already.
    """
    residual = _unfinished_residual(solved, stopping, parameters)
    if residual is not None and solved.stop != "objective grew":
        warn_user(
            f"Conjugate gradients {where} stopped ({solved.stop}) after {len(solved.history)} iterations "
            f"with a relative residual of {residual:.3g}, above its tolerance "
            f"{stopping.stated_tol:g} for {dtype}: the model is not yet the penalised "
            "least-squares solution. Raise n_epochs (the iteration bound), or use a larger alpha, fewer centers or "
            "solver='eigenpro'.",
            ConvergenceWarning,
        )


def _unfinished_residual(solved, stopping, parameters):
    """The final relative residual where CG ended unfinished, else None.

    Finished: the residual met its tolerance, or (below float64) the objective rule
    ended the fit with the residual below its start
    (:meth:`~skgpu_kernel.planning.stopping.CGStoppingPlan.unfinished`), or
    ``tol=None`` asked for every iteration up to the bound.
    """
    if parameters.tol is None or not solved.history:
        return None
    residual = solved.history[-1]["relative_residual"]
    return residual if stopping.unfinished(solved.stop, residual) else None


def _broken_down(solved, stopping, parameters):
    """Whether CG ended unfinished by a breakdown (:data:`_BROKEN_STOPS`), or by its objective above its start."""
    residual = _unfinished_residual(solved, stopping, parameters)
    if residual is None:
        return False
    # A run cut by the iteration bound (n_epochs) may end above its start: CG's residual
    # on the square system is not monotone (3.6, 1.8, 0.87, ... where it converged).
    above_start = solved.stop == "objective" and residual > stopping.residual_ceiling
    return solved.stop in _BROKEN_STOPS or above_start
