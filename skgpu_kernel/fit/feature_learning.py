"""Kernel machines that learn their features: a metric from the average gradient outer product.

The method of Recursive Feature Machines (Radhakrishnan et al., Science 2024) and
xRFM (Beaglehole et al., 2025), around the package's one kernel fit
(:func:`~skgpu_kernel.fit.pipeline.fit_kernel_model`):

1. hold out ``validation_fraction`` of the rows (stratified for classifiers), drawn
   from a copy of the fit's random state, so the final fit draws what a fit without
   feature learning draws;
2. fit the plain model (the estimator's kernel, no metric: candidate 0) on the
   other rows and score it on the held-out rows;
3. the learning path: fit the path's kernel (:data:`LEARNING_KERNEL` for a named
   kernel, the user's own kernel instance otherwise) with ``M = I``, at the scale
   rule's bandwidth for ``"auto"`` (:func:`~skgpu_kernel.planning.agop.plan_path_bandwidth`:
   no search, the normalised metric sets the scale) and ``alpha`` chosen by its rule,
   both kept for the path's later fits (as xRFM keeps one bandwidth and one penalty);
   estimate the average gradient outer product of each fitted predictor on a
   planned subsample of the training rows
   (:func:`~skgpu_kernel.agop.average_gradient_outer_product`, through the kernel
   operator of the kernel's gradient weight), set ``M = G^p`` divided by its
   largest entry (:data:`AGOP_POWER`; :func:`~skgpu_kernel.agop.metric_from_agop`),
   full or diagonal, and fit again; stop after ``feature_learning_iter`` updates or
   :data:`FEATURE_LEARNING_PATIENCE` fits without a lower held-out loss;
4. keep the path's candidate of lowest held-out loss where its per-row losses are
   lower than the plain model's beyond their noise (paired, by
   :data:`LEARNING_MARGIN_SE` standard errors), else the plain model; fit the chosen
   one again on every row, with the parameters it was scored with.

Each kernel is tuned once (:func:`~skgpu_kernel.fit.tune.tune_kernel`:
bandwidth and ``alpha`` by their rules, on every row): the plain kernel's tuning
serves its candidate and its refit, the path kernel's (with ``M = I``, its penalty
only) every step of the path and its refit.  A per-sample penalty carries over to
the training rows' fits.  The plain kernel is tuned on every row as a fit without feature learning
tunes it, so that the final fit of a kept plain model is that fit.

The metric needs no kernel of its own: with ``M = L L^T`` (``L`` from
:func:`~skgpu_kernel.agop.metric_transform`), the kernel of ``||x - z||_M`` is the
plain kernel on the rows ``X L``, so every solver, cache and planner runs unchanged
on the transformed rows.  Where the plain model is kept, the final fit is exactly
the fit without feature learning: learning costs time, not accuracy.
"""

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.model_selection import KFold, StratifiedKFold

from ..agop import average_gradient_outer_product, block_diagonal, metric_from_agop, metric_transform
from ..blockwise import DeviceCopier, taken_on_device
from ..calibration import fit_temperature
from ..kernels import make_kernel
from ..out_of_memory import MemoryEvents, ShrinkingStage, halvings, record_with_events
from ..planning.agop import (
    CALIBRATION_FOLDS,
    CALIBRATION_HELD_OUT_ROWS,
    MODEL_SIZE_MARGIN_SE,
    learnt_metric_entries,
    lower_beyond_noise,
    plan_agop,
    plan_calibration,
    plan_feature_learning,
    plan_learning_rows,
    plan_path_bandwidth,
    plan_path_centers,
    plan_path_subsample,
    plan_smaller_model,
)
from ..planning.solver import auto_centers_target
from ..row_sources import is_out_of_core
from ..splits import holdout_split
from .pipeline import fit_kernel_model
from .prepare import rows_of, runtime_holding_rows, with_rows_on_device
from .request import log_fit
from .tune import tune_kernel, with_exact_penalty

__all__ = [
    "AGOP_POWER",
    "FEATURE_LEARNING_MODES",
    "FEATURE_LEARNING_PATIENCE",
    "LEARNING_KERNEL",
    "LEARNING_MARGIN_SE",
    "fit_with_feature_learning",
    "transformed_rows",
]

FEATURE_LEARNING_MODES = ("diagonal", "full")
# M = G normalised, the metric of xRFM's default kernel (its Laplace kernel reads M
# itself; RFM's kernels on M^(1/2) read G^(1/2)).  Measured on the real-data benchmark
# (benchmarks/RESULTS.md): with the square root the learnt metric stayed near the
# identity (Computers MSE 3.12e4 against 3.14e4 without learning); with G itself
# Computers fell to 2.45e4 and VietNamI from 0.247 to 0.196.
AGOP_POWER = 1.0
# The learning path's kernel for a named kernel: the Laplacian, xRFM's.  Measured on the
# real-data benchmark: with the Gaussian (M = G, the first fit's bandwidth and alpha
# kept) every regression set kept the plain model; with the Laplacian, Computers and
# VietNamI gained 22% and 21% (the figures above), and the plain Gaussian scored better
# on the held-out rows wherever the path did not help.
LEARNING_KERNEL = "laplacian"
# Iterations without a lower held-out loss after which the path stops.
FEATURE_LEARNING_PATIENCE = 2
# A learnt model is kept where its held-out loss is lower than the plain model's by
# more than this many standard errors of the per-row differences: on Sonar (17
# held-out rows) a learnt metric scored 0.12 better on them and 0.17 worse on the
# test rows.
LEARNING_MARGIN_SE = 2.0


def transformed_rows(X, transform):
    """The rows ``X L`` in ``X``'s dtype (``transform`` a vector: a diagonal ``L``; None: ``X``)."""
    if transform is None:
        return X
    scaled = X * transform if transform.ndim == 1 else X @ transform
    return np.asarray(scaled, dtype=X.dtype)


def transformed_on_device(X, transform):
    """:func:`transformed_rows` of a tensor, on its device: for a diagonal ``L`` the same values to the bit.

    A full ``L`` is a float64 product of torch's, which may round differently
    from numpy's: a fit's host rows are then read back from these
    (:func:`_transformed_input`), so that host and device hold the same rows.
    """
    if transform is None:
        return X
    factor = torch.as_tensor(transform, dtype=torch.float64, device=X.device)
    scaled = X * factor if factor.ndim == 1 else X.double() @ factor
    return scaled.to(X.dtype)


def fit_with_feature_learning(data, parameters, runtime):
    """The kernel fit, with the metric learnt from its AGOP where ``parameters.feature_learning`` asks.

    ``"auto"`` is resolved by :func:`~skgpu_kernel.planning.agop.plan_feature_learning`
    from the number of rows.  A warm start (``data.continuation``) continues in the features the fit it
    continues was fitted in (``continuation.transform``) and learns nothing new: the
    coefficients belong to those features.

    Parameters
    ----------
    data : KernelFitInput
        The validated rows.
    parameters : KernelFitParameters
        The estimator's.
    runtime : KernelRuntime

    Returns
    -------
    KernelFitResult
        The final fit, with what feature learning chose (``feature_learning``,
        ``transform``, ``metric``, ``scores``, ``iteration``) and a classifier's
        ``temperature`` and ``calibration``.
    """
    data = with_rows_on_device(data, runtime)
    runtime = runtime_holding_rows(runtime, data)
    requested = parameters.feature_learning
    in_memory, distributed, n_samples = not is_out_of_core(data.X), runtime.group is not None, data.X.shape[0]
    if data.continuation is not None:
        calibration = plan_calibration(parameters.classifier, None, n_samples, in_memory, distributed)
        continued = data
        if calibration == "final-held-out":  # the rows the continued fit was fitted on
            training = _rows_left_out(data, runtime).training
            continued = dataclasses.replace(training, continuation=data.continuation)
        return fit_kernel_model(_transformed_input(continued, data.continuation.transform), parameters, runtime)
    if requested in FEATURE_LEARNING_MODES:
        _check_learnable(data, parameters)  # an explicit request fails before any fit
    learnable = requested != "auto" or _learnable(data, parameters)
    mode = plan_feature_learning(requested, n_samples, learnable, in_memory, distributed)
    calibration = plan_calibration(parameters.classifier, mode, n_samples, in_memory, distributed)
    if mode is not None and n_samples < 2:
        raise ValueError(
            "feature_learning chooses the metric on held-out rows and needs at least 2 samples; got "
            f"n_samples={n_samples}. Set feature_learning=None to fit one sample."
        )
    if calibration == "final-held-out":
        return _calibrated_on_rows_left_out(data, parameters, runtime, mode)
    return _fitted(data, parameters, runtime, mode, calibration)


def _fitted(data, parameters, runtime, mode, calibration):
    """The fit: with feature learning (``mode``), or the plain model calibrated as ``calibration`` plans."""
    if mode is not None:
        return _learnt(data, dataclasses.replace(parameters, feature_learning=mode), runtime)
    if calibration == "held-out":
        return _held_out_plain(data, parameters, runtime)
    if calibration == "cross-fitted":
        return _cross_fitted_plain(data, parameters, runtime)
    return dataclasses.replace(fit_kernel_model(data, parameters, runtime), calibration=calibration)


def _calibrated_on_rows_left_out(data, parameters, runtime, mode):
    """Above ``LEARNING_PATH_MAX_ROWS``: the fit without ``CALIBRATION_HELD_OUT_ROWS`` rows, which calibrate it.

    The rows are drawn first, from a copy of the fit's random state (stratified),
    and used for nothing else: the rest is the fit, feature learning included.
    """
    split = _rows_left_out(data, runtime)
    result = _fitted(split.training, parameters, runtime, mode, None)
    events = MemoryEvents()
    decisions = _held_out_decisions(result, split.held_out, result.transform, runtime.budget, events)
    temperature = fit_temperature(decisions, split.held_out.Y, split.held_out.weights)
    attempts = record_with_events(result.attempts, events, result.solver)  # its decisions' events join the record
    return dataclasses.replace(result, attempts=attempts, temperature=temperature, calibration="final-held-out")


def _rows_left_out(data, runtime):
    """The rows the final model is fitted on (``training``, in their order) and the calibration rows (``held_out``)."""
    n_rows = data.X.shape[0]
    train, held_out = holdout_split(
        n_rows, CALIBRATION_HELD_OUT_ROWS / n_rows, copy.deepcopy(runtime.rng), data.stratify
    )
    return _CandidateRows(data, rows_of(data, np.sort(train)), rows_of(data, np.sort(held_out)))


def _cross_fitted_plain(data, parameters, runtime):
    """Under ``CALIBRATION_MIN_ROWS`` rows: the fit, and a temperature from cross-fitted decision values.

    Each of ``CALIBRATION_FOLDS`` folds (stratified where every class has as many
    rows, from a copy of the fit's random state) is predicted by the plain model
    fitted on the others with the kernel tuned on every row, the final fit's own.
    """
    plan = tune_kernel(data, parameters, runtime)
    decisions = np.zeros_like(data.Y, dtype=np.float64)
    for train, held_out in _folds(data, runtime):
        fit = fit_kernel_model(rows_of(data, train), parameters, _fresh(runtime), plan)
        events = MemoryEvents()
        decisions[held_out] = _held_out_decisions(fit, rows_of(data, held_out), None, runtime.budget, events)
        runtime = runtime.recorded(record_with_events(_events_of(fit), events, fit.solver))
    temperature = fit_temperature(decisions, data.Y, data.weights)
    final = fit_kernel_model(data, parameters, runtime, plan)
    return dataclasses.replace(final, temperature=temperature, calibration="cross-fitted")


def _folds(data, runtime):
    """``CALIBRATION_FOLDS`` (at most one per row) train and held-out index pairs, stratified where they can be."""
    n_folds = min(CALIBRATION_FOLDS, data.X.shape[0])
    if n_folds < 2:
        return []
    seed = int(copy.deepcopy(runtime.rng).randint(np.iinfo(np.int32).max))
    counts = np.bincount(data.stratify) if data.stratify is not None else np.zeros(1)
    stratified = counts[counts > 0].min() >= n_folds
    folds = (StratifiedKFold if stratified else KFold)(n_folds, shuffle=True, random_state=seed)
    return list(folds.split(data.X, data.stratify if stratified else None))


def _learnt(data, parameters, runtime):
    """The plain candidate and the learning path on a held-out split, then the one kept refitted on every row.

    Where ``n_centers="auto"`` keeps every point, the model's size is chosen after
    its metric (:func:`_sized`), and the candidates may be the smaller model
    themselves (:func:`~skgpu_kernel.planning.agop.plan_path_centers`).
    """
    plan = tune_kernel(data, parameters, runtime)
    rows = _CandidateRows.drawn(data, runtime, plan)
    every_point = data.n_centers == "auto" and data.centers is None and plan.data.n_centers is None
    n_training = rows.training.X.shape[0]
    block_sizes = [len(block) for block in data.column_blocks]
    entries = learnt_metric_entries(data.X.shape[1], block_sizes, parameters.feature_learning)
    smaller, centers = plan_smaller_model(every_point, n_training), plan_path_centers(every_point, n_training, entries)
    plain = _scored(rows, None, _sized_plan(plan, rows.learning, runtime, centers), centers, runtime)
    log_fit(runtime, parameters, f"feature learning: the plain model's held-out score {plain.score:.6g}")
    path_plan = _path_plan(rows.learning, parameters, runtime)
    path = _learning_path(rows, path_plan, runtime.recorded(plain.events), centers)
    learnt = min(path, key=lambda candidate: candidate.losses.mean())  # the first of equal losses
    chosen = learnt if _learning_pays(learnt.losses, plain.losses) else plain
    candidates = [plain, *path]
    iteration = candidates.index(chosen)
    log_fit(runtime, parameters, f"feature learning keeps candidate {iteration} of {len(path)}")
    events = path[-1].events
    if smaller is not None:
        chosen = _sized(chosen, rows, plan if chosen is plain else path_plan, smaller, runtime.recorded(events))
        events = chosen.events
    final = _final_fit(chosen, data, parameters, runtime.recorded(events))
    scores = tuple(candidate.score for candidate in candidates)
    metric = _metric(chosen.transform, data.X.shape[1])
    mode = parameters.feature_learning
    # The chosen candidate is the final model's kernel and metric fitted without the held-out rows: its
    # decision values set the temperature.  Those rows also chose it, by 0/1 loss among a few candidates;
    # a second split would cost every candidate's fit again, for one number fitted on the log loss.
    temperature = _temperature(chosen, rows, parameters)
    calibration = "held-out" if parameters.classifier else None
    return dataclasses.replace(
        final,
        feature_learning=mode,
        transform=chosen.transform,
        metric=metric,
        scores=scores,
        iteration=iteration,
        temperature=temperature,
        calibration=calibration,
    )


def _sized(chosen, rows, plan, smaller, runtime):
    """``chosen``'s kernel and metric on every point or on ``smaller`` centers, as the held-out rows say.

    The size ``chosen`` lacks is fitted on the same training rows: on every point with
    ``plan`` (its kernel tuned for that model: the plain kernel's on every row, the
    path kernel's with ``M = I`` on ``rows.learning``), or on the centers with
    :func:`_sized_plan`'s.  The larger model is kept only where its held-out losses
    are lower beyond their noise
    (:data:`~skgpu_kernel.planning.agop.MODEL_SIZE_MARGIN_SE` standard errors); else the
    smaller one predicts as well, faster.  The kept candidate's ``events`` include
    the second fit's.
    """
    if chosen.n_centers is None:
        small_plan = _sized_plan(plan, rows.learning, runtime, smaller)
        other = _scored(rows, chosen.transform, small_plan, smaller, runtime)
        larger, small = chosen, other
    else:
        other = _scored(rows, chosen.transform, plan, None, runtime)
        larger, small = other, chosen
    keeps_larger = lower_beyond_noise(larger.losses, small.losses, MODEL_SIZE_MARGIN_SE)
    kept = "every point" if keeps_larger else f"{smaller} centers"
    log = f"feature learning: held-out scores {larger.score:.6g} on every point, {small.score:.6g} on {smaller} centers"
    log_fit(runtime, plan.parameters, f"{log}: keeps the model on {kept}")
    return dataclasses.replace(larger if keeps_larger else small, events=other.events)


def _final_fit(chosen, data, parameters, runtime):
    """The kept candidate refitted on every row: its kernel, bandwidth and penalty, the fit's preconditioner subsample.

    A smaller model takes :func:`~skgpu_kernel.planning.solver.auto_centers_target` of
    every row's count; a plan tuned on a subsample of the rows is tuned again on
    every row (the path kernel's with ``M = I``).
    """
    log_fit(runtime, parameters, "feature learning: the kept candidate refitted on every row")
    final_parameters = dataclasses.replace(chosen.plan.parameters, subsample_size=parameters.subsample_size)
    if chosen.n_centers is not None:
        data = dataclasses.replace(data, n_centers=auto_centers_target(data.X.shape[0]))
    final_plan = chosen.plan
    if chosen.plan.n_rows != data.X.shape[0]:  # tuned on a subsample: the kernel tuned on every row, now
        final_plan = tune_kernel(data, final_parameters, runtime).pinned()
    return fit_kernel_model(_transformed_input(data, chosen.transform), final_parameters, runtime, final_plan)


def _held_out_plain(data, parameters, runtime):
    """A classifier's fit without feature learning, and its plain model's decision values on held-out rows.

    The plain candidate of :func:`_learnt` alone: fitted on the held-out split's
    other rows with the kernel tuned on every row, which the final fit reuses (it
    is the fit without the held-out model, bit for bit).  Its decision values on the
    held-out rows calibrate the classifier's probabilities.
    """
    plan = tune_kernel(data, parameters, runtime)
    rows = _CandidateRows.drawn(data, runtime, plan)
    plain = _scored(rows, None, plan, None, runtime)
    temperature = _temperature(plain, rows, parameters)
    final = fit_kernel_model(data, parameters, runtime.recorded(plain.events), plain.plan)
    return dataclasses.replace(final, temperature=temperature, calibration="held-out")


def _temperature(candidate, rows, parameters):
    """A classifier's probability temperature from ``candidate``'s held-out decision values; None for a regressor."""
    if not parameters.classifier:
        return None
    return fit_temperature(candidate.decisions, rows.held_out.Y, rows.held_out.weights)


def _scored(rows, transform, plan, centers, runtime):
    """The model of ``plan`` fitted on ``rows.training`` seen through ``transform``, on ``centers`` centers, scored.

    ``centers`` None: the size ``plan``'s rows resolve to (the estimator's).
    """
    fitted_on = _transformed_input(_with_centers(rows.training, centers), transform)
    fit = fit_kernel_model(fitted_on, plan.parameters, _fresh(runtime), plan)
    return dataclasses.replace(rows.candidate(fit, transform, plan, runtime.budget), n_centers=centers)


def _sized_plan(plan, data, runtime, centers):
    """``plan``, a kernel tuned for a model on every row of ``data``, for a model on ``centers`` centers (None: itself).

    Where the leave-one-out criterion scored the penalty, the model on centers takes it
    as it is: the criterion's model is a Nystrom model on as many centers
    (:func:`~skgpu_kernel.planning.kernel.auto_subsample_size`).  Where the gate left it
    unscored (early stopping regularises a model on every row), CG on centers needs a
    penalty: the exact criterion's on a few rows (:func:`~skgpu_kernel.fit.tune.with_exact_penalty`).
    """
    selection = plan.alpha_selection
    if centers is None or selection is None or selection.scored:
        return plan
    return with_exact_penalty(plan, data, runtime)


def _with_centers(data, centers):
    """``data`` fitted on ``centers`` centers drawn from its rows (None: as the estimator asks)."""
    return data if centers is None else dataclasses.replace(data, n_centers=centers)


@dataclass(frozen=True)
class _CandidateRows:
    """The rows feature learning fits its candidates on (``training``), and scores them on (``held_out``).

    ``learning`` holds both: every row, or the subsample they were split from.
    """

    learning: object
    training: object
    held_out: object

    @classmethod
    def drawn(cls, data, runtime, plan):
        """A held-out split of the rows ``data``, or beyond ``LEARNING_PATH_MAX_ROWS`` of a seeded subsample.

        The subsample's size is :func:`~skgpu_kernel.planning.agop.plan_learning_rows`'s,
        from the final fit's rows and centers (``plan``, the plain kernel's tuned on
        every row, with the fit's parameters).
        Both are drawn from a copy of the fit's random state: the final fit draws
        what it would draw without feature learning.
        """
        parameters = plan.parameters
        n_rows = data.X.shape[0]
        rng = copy.deepcopy(runtime.rng)
        learning = plan_learning_rows(n_rows, plan.data.n_centers, parameters.feature_learning_iter)
        if learning < n_rows:
            log_fit(runtime, parameters, f"feature learning: candidates on {learning} of the {n_rows} rows")
            data = rows_of(data, np.sort(rng.permutation(n_rows)[:learning]))
        train, held_out = holdout_split(data.X.shape[0], parameters.validation_fraction, rng, data.stratify)
        return cls(data, rows_of(data, train), rows_of(data, held_out))

    def candidate(self, fit, transform, plan, budget):
        """``fit`` (in the features ``X L``) as a candidate: its per-row losses and its validation score.

        ``plan`` is the tuned plan ``fit`` ran with, whose parameters score it; its
        held-out predictions may take ``budget`` bytes of device memory.
        """
        events = MemoryEvents()
        predictions = _held_out_decisions(fit, self.held_out, transform, budget, events)
        Y, parameters = self.held_out.Y, plan.parameters
        score = float(parameters.validation_score(torch.as_tensor(predictions), torch.as_tensor(Y)))
        losses = _row_losses(predictions, Y, parameters.classifier)
        record = tuple(record_with_events(_events_of(fit), events, fit.solver))
        return _Candidate(transform, plan, losses, score, predictions, record)


@dataclass(frozen=True, eq=False)
class _Candidate:
    """A model the held-out rows scored: its features ``X L``, what it is refitted with, its losses.

    ``plan``: the tuned ``FitPlan`` it was fitted with and is refitted with (its
    parameters included); ``events``: the fit's record of events up to and
    including the candidate's fit and scoring (earlier ones first; for a kept
    smaller model, the larger one's it was compared with), which the next stage is
    handed; ``n_centers``: the centers of a model smaller than the fit's own.
    """

    transform: np.ndarray | None
    plan: object
    losses: np.ndarray
    score: float
    decisions: np.ndarray  # on the held-out rows, intercept included
    events: tuple = ()
    n_centers: int | None = None  # a model on fewer centers than the fit's own (plan_path_centers)


def _held_out_decisions(fit, data, transform, budget, events):
    """``fit``'s decision values (intercept included) on the rows of ``data``, seen through ``transform``.

    Only predicted: rows held on the device are transformed there, and no host copy is read back.  A row
    block halved out of memory is recorded in ``events``.
    """
    if data.X_device is None:
        X = transformed_rows(np.asarray(data.X), transform)
    else:
        X = transformed_on_device(data.X_device, transform)
    return fit.device_cache.predict(fit.kernel, X, budget, events) + fit.intercept


def _events_of(fit):
    """The events of ``fit``'s record (earlier stages' first), for a later stage's own to follow."""
    return [entry for entry in fit.attempts if "event" in entry]


def _row_losses(predictions, Y, classifier):
    """Each held-out row's loss: 0/1 for a classifier (sign or arg max), the squared error otherwise."""
    if not classifier:
        return ((predictions - Y) ** 2).sum(axis=1)
    if Y.shape[1] == 1:
        return ((predictions[:, 0] > 0) != (Y[:, 0] > 0)).astype(np.float64)
    return (predictions.argmax(axis=1) != Y.argmax(axis=1)).astype(np.float64)


def _learning_path(rows, plan, runtime, centers):
    """The candidates of the learning path: the path's kernel with ``M = I``, then each learnt metric.

    ``plan`` is the path's kernel (:func:`_path_plan`) with its penalty tuned once, on
    every row of ``rows.learning`` (every row, or the subsample beyond
    ``LEARNING_PATH_MAX_ROWS``) with ``M = I``; its bandwidth and ``alpha`` are
    kept for every metric (as xRFM keeps one bandwidth and one penalty) and for the
    final refit.  Each candidate is fitted on ``rows.training`` and scored on
    ``rows.held_out``, on ``centers`` centers where that is not None
    (:func:`_sized_plan`).  The path stops after ``feature_learning_iter`` updates or
    :data:`FEATURE_LEARNING_PATIENCE` without a lower held-out loss.
    """
    parameters = plan.parameters
    mode, n_iter = parameters.feature_learning, parameters.feature_learning_iter
    transform, path = None, []
    # A category's block of the metric needs the AGOP's entries among its levels: the
    # AGOP, the metric and L are vectors only for a diagonal mode without blocks.
    blocks = rows.learning.column_blocks
    diagonal_agop = mode == "diagonal" and not len(blocks)
    plan = _sized_plan(plan, rows.learning, runtime, centers)
    training = _with_centers(rows.training, centers)
    for step in range(n_iter + 1):
        fitted_on = _transformed_input(training, transform)
        fit = fit_kernel_model(fitted_on, plan.parameters, _fresh(runtime), plan)
        path.append(dataclasses.replace(rows.candidate(fit, transform, plan, runtime.budget), n_centers=centers))
        runtime = runtime.recorded(path[-1].events)
        log_fit(runtime, parameters, f"feature learning step {step}: held-out score {path[-1].score:.6g}")
        best = int(np.argmin([candidate.losses.mean() for candidate in path]))
        if step == n_iter or step - best >= FEATURE_LEARNING_PATIENCE:
            break
        events = MemoryEvents(log=runtime.log)
        agop = torch.as_tensor(_input_space_agop(fit, fitted_on, transform, diagonal_agop, runtime, events))
        runtime = runtime.recorded(record_with_events(runtime.memory_events, events, fit.solver))
        del fit  # its kernel cache is freed before the next fit allocates its own
        if not bool(agop.any()):
            log_fit(runtime, parameters, "the predictor is constant on the rows: its AGOP ranks no feature")
            path[-1] = dataclasses.replace(path[-1], events=runtime.memory_events)  # the final fit's record has them
            break
        agop = block_diagonal(agop, blocks, mode == "diagonal")
        metric = metric_from_agop(agop, diagonal_agop, AGOP_POWER)
        transform = np.asarray(metric_transform(torch.as_tensor(metric)))
    return path


def _path_plan(data, parameters, runtime):
    """The path's kernel (:func:`_path_parameters`) with ``M = I`` tuned on the rows ``data``, its bandwidth pinned."""
    return tune_kernel(data, _path_parameters(parameters), runtime).pinned()


def _path_parameters(parameters):
    """The learning path's parameters: :data:`LEARNING_KERNEL` for a named kernel, the user's own kernel otherwise.

    A named kernel's bandwidth is :func:`~skgpu_kernel.planning.agop.plan_path_bandwidth`'s
    (the scale rule for ``"auto"``: no search of the path's own), and the path's
    preconditioner subsample :func:`~skgpu_kernel.planning.agop.plan_path_subsample`'s
    (the final refit takes the fit's own again).
    """
    if not isinstance(parameters.kernel, str):
        return parameters
    return dataclasses.replace(
        parameters,
        kernel=LEARNING_KERNEL,
        kernel_params=None,
        bandwidth=plan_path_bandwidth(parameters.bandwidth),
        subsample_size=plan_path_subsample(parameters.subsample_size),
    )


def _learning_pays(learnt, plain):
    """Whether the learnt candidate's held-out losses are lower than the plain model's, beyond their noise.

    Paired by row: the mean of ``plain - learnt`` must exceed :data:`LEARNING_MARGIN_SE`
    standard errors of the differences
    (:func:`~skgpu_kernel.planning.agop.lower_beyond_noise`).
    """
    return lower_beyond_noise(learnt, plain, LEARNING_MARGIN_SE)


def _check_learnable(data, parameters):
    """Fail before any fit when the kernel declares no gradient (it cannot learn features)."""
    kernel, _ = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, data.X[:256])
    kernel.gradient_kernel()


def _learnable(data, parameters):
    """Whether the kernel declares its gradient (:meth:`~skgpu_kernel.kernels.RadialKernel.gradient_kernel`)."""
    try:
        _check_learnable(data, parameters)
    except ValueError:  # Kernel.gradient_kernel's refusal
        return False
    return True


def _transformed_input(data, transform):
    """``data`` seen through ``L``: the rows and the user's centers transformed.

    Rows held on the device are transformed there, and the host's read back from
    them (on the CPU the same memory): no rows are copied to the device again.
    """
    if transform is None:
        return data
    centers = None if data.centers is None else transformed_rows(data.centers, transform)
    if data.X_device is None:
        return dataclasses.replace(data, X=transformed_rows(np.asarray(data.X), transform), centers=centers)
    on_device = transformed_on_device(data.X_device, transform)
    return dataclasses.replace(data, X=on_device.cpu().numpy(), centers=centers, X_device=on_device)


def _fresh(runtime):
    """``runtime`` with copies of its random state and generator: an iteration's fit leaves them untouched."""
    generator = torch.Generator().manual_seed(0)
    generator.set_state(runtime.generator.get_state())
    return dataclasses.replace(runtime, rng=copy.deepcopy(runtime.rng), generator=generator)


def _input_space_agop(fit, fitted_on, transform, diagonal, runtime, events):
    """The AGOP of ``fit``'s predictor in the input coordinates: ``L G L^T`` of its AGOP ``G`` in ``X L``.

    ``fitted_on`` is the data ``fit`` was fitted on (the rows ``X L``): the rows and
    the centers are taken from its device copy where it has one.

    With ``diagonal`` only the diagonal is computed (``L`` is then diagonal too,
    and ``diag(L G L) = L^2 diag(G)``).  Where the device runs out of memory, the
    AGOP is computed again with half the rows per block (the same subsample), each
    halving recorded in ``events`` (which the fit's ``fit_attempts_`` come to hold).
    """
    device, dtype = runtime.devices[0], runtime.dtype
    to_device = DeviceCopier(device, dtype, None)
    on_device = fitted_on.X_device
    rows = to_device(fitted_on.X if on_device is None else on_device)
    from_rows = on_device is not None and fit.center_rows is not None
    centers = to_device(taken_on_device(on_device, fit.center_rows) if from_rows else fit.centers)
    coef = fit.loop.coef.to(device, dtype)
    n_rows, n_features = rows.shape
    itemsize = torch.finfo(dtype).bits // 8
    plan = plan_agop(n_rows, n_features, centers.shape[0], coef.shape[1], itemsize, runtime.budget, device.type)
    weights = torch.as_tensor(fitted_on.weights, dtype=torch.float64, device=device)

    def agop_in_blocks(row_block):
        blocks = dataclasses.replace(plan, row_block=row_block)
        return average_gradient_outer_product(
            fit.kernel, rows, centers, coef, weights, diagonal=diagonal, plan=blocks, random_state=_seed(runtime)
        )

    agop = ShrinkingStage("agop", "AGOP row block", halvings(plan.row_block), device, events)(agop_in_blocks)
    agop = agop.cpu().numpy()
    if transform is None:
        return agop
    if diagonal:
        return transform**2 * agop
    return transform @ agop @ transform.T


def _seed(runtime):
    """A seed for the AGOP's subsample from a copy of the fit's random state (left untouched)."""
    return int(copy.deepcopy(runtime.rng).randint(np.iinfo(np.int32).max))


def _metric(transform, n_features=None):
    """``M = L L^T`` as a (d, d) matrix (the identity for no transform)."""
    if transform is None:
        return np.eye(n_features)
    return np.diag(transform**2) if transform.ndim == 1 else transform @ transform.T
