"""The solve stage and the one fallback loop: run the plan's solver, then every fallback, then the last check.

:func:`solve` takes the model the tune stage already solved (``plan.direct ==
"from tuning"``) or prepares the fit (:func:`~skgpu_kernel.fit.prepare.prepare`)
and hands :func:`run_solver` the prepared fit.  The loop runs the
attempt the registry (:mod:`~skgpu_kernel.fit.registry`) names for the solver
and the data (centers or every point), then every
:class:`~skgpu_kernel.fit.attempts.Fallback` an attempt asks for, checks each
model against the trivial predictor, and records every attempt: the one place a
fit changes course, as scikit-learn's ``_ridge_regression`` reports the solver
that ran.  The finish stage (:mod:`~skgpu_kernel.fit.finish`) makes the result.
"""

import dataclasses

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from .._warnings import warn_user
from ..blockwise import DeviceCopier, PredictionTensors, rows_taken
from ..out_of_memory import MemoryEvents, record_with_events
from ..planning.kernel_policy import DIRECT_FROM_TUNING
from ..planning.solver import refit_with_penalty
from ..planning.stopping import held_out_check_limit
from ..solvers.fit_check import check_fit
from ..solvers.solution import Solution
from .attempts import Attempt, Fallback, FallbackNeeded, safer_attempt
from .context import AttemptContext
from .finish import KernelFitResult, finished_model, fit_result
from .prepare import kernel_offset, prepare, target_intercept
from .registry import solver_attempt
from .request import log_fit
from .tune import criterion_alpha


def solve(runtime, plan):
    """The solve stage: the model of ``plan`` (every decision made), as the shell stores it.

    Returns
    -------
    KernelFitResult
    """
    if plan.direct == DIRECT_FROM_TUNING:
        return _direct_model(runtime, plan)
    return _solved_model(runtime, plan)


def _solved_model(runtime, plan):
    """Prepare (split, centre, shuffle, draw the centers), run the plan's solver and its fallbacks, finish."""
    prepared = prepare(runtime, plan)
    outcome = run_solver(Attempt(prepared.plan), prepared, runtime)
    return finished_model(outcome, prepared, runtime)


def _direct_model(runtime, plan):
    """The tune stage's exact kernel ridge solution as the fit's model: no solver runs.

    The criterion scored every row as a feature, in the order of ``tuning.scored_rows``:
    those rows are the centers, its coefficients the model's.
    """
    data, parameters = plan.data, plan.parameters
    kernel, selection, order = plan.kernel, plan.alpha_selection, plan.scored_rows
    offset = kernel_offset(kernel, data.X)
    to_device = DeviceCopier(runtime.devices[0], runtime.dtype, offset)
    centers = np.asarray(data.X[order], dtype=np.float64)
    coef = selection.solution.coef.to(runtime.devices[0], runtime.dtype)
    intercept = target_intercept(True, data.Y, data.weights) + selection.solution.intercept.cpu().numpy()
    log_fit(runtime, parameters, f"solver direct: kernel ridge on {order.size} rows, alpha {selection.alpha:.4g}")
    attempt = Attempt(dataclasses.replace(plan, solver="direct", alpha=selection.alpha))
    device_cache = PredictionTensors.of_centers(
        kernel, to_device(rows_taken(data.X, data.X_device, order)), coef, to_device.offset
    )

    # The exact solution cannot diverge; its last check is recorded as every fit's is.
    def predict(indices):
        rows = to_device(rows_taken(data.X, data.X_device, indices))
        return device_cache.predict_on_device(kernel, rows, runtime.budget)

    check = check_fit(predict, data.Y - intercept, data.weights)
    outcome = KernelFitResult(
        Solution.direct(coef),
        centers=centers,
        device_cache=device_cache,
        attempt=attempt,
        attempts=[*runtime.memory_events, attempt.record()],
        check=check.record(),
    )
    return fit_result(outcome, offset=offset, intercept=intercept, order=order, center_rows=order)


def run_solver(attempt, prepared, runtime):
    """Run the planned ``attempt`` on the prepared fit, then every fallback it asks for: the one driver of the solvers.

    Each attempt runs the path the registry (:func:`~skgpu_kernel.fit.registry.solver_attempt`) gives for the
    solver and the data (centers or every point).  A path asks for a fallback by
    returning or raising one (:class:`Fallback`): CG broken down by rounding, refit
    with a larger penalty (at most :data:`CG_FALLBACK_REFITS` times); CG on every
    point that diverged, refit with a 32-bit kernel cache in place of a 16-bit one,
    else with a larger penalty; CG on every point whose preconditioned system is too
    ill-conditioned, fitted by EigenPro 2; a kernel cache the device refused,
    fitted without it.  Every model a path returns then meets the last check
    (:func:`~skgpu_kernel.solvers.fit_check.check_fit`): one worse than the trivial
    predictor beyond noise is refit by the same order of safe changes
    (:func:`safer_attempt`), and where none is left the fit keeps the trivial
    model with a ``ConvergenceWarning`` naming what was tried.  The driver warns,
    runs the new attempt from scratch and records every attempt in the outcome, as
    scikit-learn's ``_ridge_regression`` reports the solver that actually ran,
    with the out-of-memory events of each run after it (each attempt's own
    :class:`~skgpu_kernel.out_of_memory.MemoryEvents`, after the events earlier
    stages handed on in ``runtime.memory_events``).

    Returns
    -------
    KernelFitResult
        The last attempt's, with the ``attempt`` (its solver and penalty),
        ``attempts`` (the record) and ``check``.
    """
    attempts = []
    record = list(runtime.memory_events)  # what earlier stages of the fit shrank (feature learning's fits and AGOP)
    while True:
        attempts.append(attempt)
        record.append(attempt.record())
        events = MemoryEvents(log=runtime.log)
        outcome = _run_attempt(attempt, prepared, runtime, events)
        record = record_with_events(record, events, attempt.solver)
        fallback = outcome.fallback
        if fallback is None:
            check = _last_check(outcome, prepared, runtime)
            outcome = dataclasses.replace(outcome, check=None if check is None else check.record())
            if check is not None and refit_with_penalty(
                prepared.plan.parameters.alpha, attempt.alpha, attempt.solver, prepared.centers is not None, check
            ):
                fallback = _penalised_refit(attempt, prepared, runtime, check)
            elif check is None or check.passed:
                return _as_run(outcome, attempt, record)
            else:
                where = "held-out" if check.held_out else "training"
                why = (
                    f"the model's {check.score} on {check.n_rows} {where} rows, {check.model_loss:.4g}, is above the "
                    f"trivial predictor's, {check.trivial_loss:.4g}"
                )
                fallback = safer_attempt(attempt, outcome, prepared, runtime.dtype, why)
                if fallback is None:
                    return _as_run(_trivial_model(outcome, attempts), attempt, record)
        _warn_of(fallback, attempt, prepared.plan.parameters.solver)
        attempt = attempt.after(fallback)


def _as_run(outcome, attempt, record):
    """``outcome`` with the attempt that produced it (the path's, with its run planned) and the fit's record."""
    ran = attempt if outcome.attempt is None else outcome.attempt
    return dataclasses.replace(outcome, attempt=ran, attempts=list(record))


def _warn_of(fallback, attempt, requested):
    """The fallback's warning; a plain one where it leaves a solver the user named and has none of its own."""
    if fallback.warning is not None:
        warn_user(fallback.warning, fallback.category)
    elif fallback.solver not in (None, attempt.solver) and requested == attempt.solver:
        warn_user(f"solver={requested!r} was not kept: {fallback.reason} (fit_attempts_ records it).", UserWarning)


def _last_check(outcome, prepared, runtime):
    """The last check of the attempt's model, on the fit's held-out rows where it has some, or None where not run.

    Held-out rows (the early-stopping split) are scored with the task's score
    against the training rows' trivial predictor; without them, the training
    rows.  The rows are taken from the fit's one copy on the device where it holds
    one.  Not under a process group: the ranks would have to agree on a fallback,
    and each holds the same model (its coefficients agreed every epoch).
    """
    if runtime.group is not None or outcome.device_cache is None or prepared.X.shape[0] < 2:
        return None
    tensors, to_device = outcome.device_cache, DeviceCopier(runtime.devices[0], runtime.dtype, prepared.offset)
    n_targets = prepared.Y.shape[1] - prepared.joint_intercept  # the ones column is no target
    held_out = prepared.validation is not None and prepared.validation.X.shape[0] > 0
    rows = prepared.validation if held_out else prepared
    # Held out, targets and predictions are scored with the intercept, whose codes a classifier's classes are read from.
    shift = prepared.intercept[:n_targets] if held_out else 0.0

    def predict(indices):
        taken = to_device(rows_taken(rows.X, rows.X_device, indices))
        predictions = tensors.predict_on_device(prepared.plan.kernel, taken, runtime.budget)[:, :n_targets]
        return predictions.detach().cpu().double().numpy() + shift

    if held_out:
        labels = rows.stratify if prepared.plan.parameters.classifier else None
        limit = held_out_check_limit(prepared.X.shape[0])
        check = check_fit(predict, rows.Y, rows.weights, trivial=shift, labels=labels, limit=limit)
    else:
        check = check_fit(predict, prepared.Y[:, :n_targets], prepared.weights)
    log_fit(runtime, prepared.plan.parameters, check.describe())
    return check


def _penalised_refit(attempt, prepared, runtime, check):
    """The fallback :func:`~skgpu_kernel.planning.solver.refit_with_penalty` asks for: the criterion's ``alpha``."""
    alpha = criterion_alpha(prepared, runtime)
    reason = (
        f"unpenalised, the model's {check.score} on {check.n_rows} held-out rows ({check.model_loss:.4g}) is not "
        f"better than the trivial predictor's ({check.trivial_loss:.4g}) beyond noise: refit with the criterion's "
        f"alpha {alpha:.3g}"
    )
    log_fit(runtime, prepared.plan.parameters, reason)
    return Fallback.of(reason, alpha=alpha)


def _trivial_model(outcome, attempts):
    """The trivial model (zero coefficients: the intercept, the targets' weighted mean) after every attempt failed."""
    tried = "; ".join(f"{attempt.solver} at alpha {attempt.alpha:.3g} ({attempt.reason})" for attempt in attempts)
    warn_user(
        f"Every attempt of the fit gave a model worse than the trivial predictor (the targets' weighted mean) on "
        f"its training rows: {tried}. The fit keeps the trivial model; check the bandwidth and the scale of the "
        "data, or set a larger alpha or dtype='float64'.",
        ConvergenceWarning,
    )
    coef = torch.zeros_like(outcome.loop.coef)
    loop = dataclasses.replace(outcome.loop, coef=coef, stop="trivial model")
    return dataclasses.replace(outcome, loop=loop, device_cache=outcome.device_cache.with_coef(coef))


def _run_attempt(attempt, prepared, runtime, events):
    """One attempt: its path run on the prepared fit with what the attempt changes; a raised fallback returned."""
    run = solver_attempt(attempt.solver, prepared.centers is not None)
    try:
        return run(AttemptContext(prepared, runtime, events, attempt), attempt)
    except FallbackNeeded as needed:
        return KernelFitResult(None, fallback=needed.fallback)
