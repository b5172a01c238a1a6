"""The kernel machines' one fit pipeline, in stages: resolve, tune, choose the solver, solve.

The estimator shell validates the input and hands over a :class:`FitRequest` (the
host arrays, :class:`KernelFitInput`, and its parameters,
:class:`KernelFitParameters`) and the resolved runtime (:class:`KernelRuntime`:
devices, dtype, budget, random state).  :func:`fit_kernel_model` then makes every
further decision once, each stage adding its own to one :class:`FitPlan`:

1. :func:`resolve`: the kernel by its rule, ``n_centers="auto"`` counted, and the
   policy (:func:`~skgpu_kernel.planning.kernel_policy.plan_kernel_fit`): the
   solver, how ``alpha`` is resolved, whether to hold out a validation split;
2. :func:`tune`: the bandwidth search and the leave-one-out ``alpha`` where the
   policy asks for them (measurements on the device), which settle the rest of
   the policy; or a tuned plan handed in (:func:`tune_kernel`'s, which feature
   learning reuses);
3. :func:`choose_solver`: the tune stage's solution, one factorisation, or the
   policy's iterative solver;
4. :func:`solve`: the validation split, the intercept, the kernel on the training
   rows, the shuffle, the centers and the warm start, then the driver of
   :mod:`skgpu_kernel.solvers.kernel_paths` (EigenPro 2, EigenPro 3, CG or a
   direct solve, and their fallbacks),

and returns one :class:`KernelFitResult` for the shell to store.  Random draws
happen in a fixed order (validation split, shuffle, then a streamed fit's seed),
so that a seed gives the same model whatever the path.
"""

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import clone

from .._warnings import warn_user
from ..blockwise import DeviceCopier, PredictionTensors, rows_taken, taken_on_device
from ..buffer import is_out_of_core
from ..kernels import make_kernel, searches_bandwidth
from ..out_of_memory import out_of_memory_reason, release_cached_memory
from ..planning.kernel import (
    KernelProblem,
    KernelSettings,
    auto_subsample_size,
    full_kernel_cg_factors,
    plan_auto_centers,
)
from ..planning.kernel_policy import (
    DIRECT_FACTORED,
    DIRECT_FROM_TUNING,
    KernelFitRequest,
    carries_subsample_penalty,
    plan_direct_solve,
    plan_kernel_fit,
)
from ..regularization import (
    BANDWIDTH_SEARCH_ROWS,
    LOO_MAX_ROWS,
    LOO_MIN_COVERAGE,
    PENALTY_GRID,
    ClassCodes,
    select_alpha,
    select_bandwidth,
)
from ..splits import holdout_split
from .eigenpro import KernelLoopResult
from .fit_check import check_fit
from .kernel_paths import Attempt, HeldOut, KernelFitSettings, KernelHostData, KernelRuntime, PathOutcome, run_solver

__all__ = [
    "FitPlan",
    "FitRequest",
    "KernelContinuation",
    "KernelFitInput",
    "KernelFitParameters",
    "KernelFitResult",
    "KernelRuntime",
    "KernelTuning",
    "LooRows",
    "choose_solver",
    "fit_kernel_model",
    "resolve",
    "solve",
    "tune",
    "tune_kernel",
]


@dataclass(frozen=True)
class KernelContinuation:
    """What a warm start continues from: the previous fit's coefficients, centers, shuffle and bandwidth.

    ``bandwidth`` (None for kernels without one) is kept instead of searched again:
    the coefficients belong to that kernel; so is ``transform``, the learnt features'
    ``L`` (None: the input's features), see
    ``skgpu_kernel.solvers.feature_learning``.
    """

    dual_coef: np.ndarray
    centers: np.ndarray
    training_order: np.ndarray
    bandwidth: float | None = None
    transform: np.ndarray | None = None


@dataclass(frozen=True)
class KernelFitInput:
    """The validated host data of a kernel fit.

    Parameters
    ----------
    X : ndarray or memory map of shape (n, d)
    Y : ndarray of shape (n, l)
        Float targets (the classifier's class codes), not centred.
    weights : ndarray of shape (n,)
        Positive sample weights (zero-weight rows already dropped).
    stratify : ndarray of shape (n,) or None
        Class indices the validation split is stratified by.
    centers : ndarray of shape (p, d) or None
        The user's validated centers (float64).
    n_centers : int, "auto" or None
        Centers to draw from the shuffled training rows; ``"auto"``: as many as
        :func:`~skgpu_kernel.planning.kernel.plan_auto_centers` says (None: every point).
    continuation : KernelContinuation or None
        The previous fit, when ``warm_start`` continues it.
    X_device : Tensor of shape (n, d) or None
        The same rows on the compute device, in ``X``'s dtype: the fit's one copy
        of them (:func:`with_rows_on_device`), which every stage takes its rows
        from; None: each stage copies its rows from ``X``.
    column_blocks : tuple of ndarray
        The columns of ``X`` that encode one categorical input column each (its
        levels' indicators, at least two): one block of a learnt metric
        (:func:`~skgpu_kernel.agop.block_diagonal`).
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    stratify: np.ndarray | None = None
    centers: np.ndarray | None = None
    n_centers: int | None = None
    continuation: KernelContinuation | None = None
    X_device: torch.Tensor | None = None
    column_blocks: tuple = ()

    @property
    def uses_centers(self):
        return self.centers is not None or self.n_centers is not None

    @property
    def equal_weights(self):
        """Every sample weight the same (the criteria then skip the weights)."""
        return bool(np.all(self.weights == self.weights[0]))


@dataclass(frozen=True)
class KernelFitParameters:
    """The estimator's parameters, as the pipeline reads them (kernel unresolved, scaling rule resolved).

    ``classifier`` says which kind of estimator asks; ``cache_dtype`` is the
    estimator's ``kernel_cache_dtype`` (see
    :class:`~skgpu_kernel.planning.kernel.KernelSettings`).
    """

    kernel: object
    bandwidth: object
    kernel_params: dict | None
    solver: str
    alpha: object
    early_stopping: object
    classifier: bool
    distributed: bool
    batch_size: object
    subsample_size: object
    cache_kernel: object
    projection: str
    fit_intercept: bool
    validation_fraction: float
    n_components: object
    damping: float
    scaling_rule: object
    n_epochs: int
    tol: float | None
    n_iter_no_change: int
    validation_score: Callable
    name: str
    cache_dtype: str = "auto"
    feature_learning: str | None = None
    feature_learning_iter: int = 5

    def request(self, weighted):
        """What the policy planner reads; ``weighted``: the sample weights are not all equal."""
        return KernelFitRequest(
            self.solver, self.alpha, self.early_stopping, self.classifier, self.distributed, LOO_MIN_COVERAGE, weighted
        )

    @property
    def planning(self):
        """What the layout planners read."""
        sizes = (self.batch_size, self.subsample_size)
        return KernelSettings(*sizes, self.cache_kernel, self.projection, self.cache_dtype)


@dataclass(frozen=True)
class KernelFitResult:
    """Everything a kernel fit decided and produced, for the shell to store.

    Attributes
    ----------
    loop : KernelLoopResult
        The coefficients (in the order of ``centers``), epochs, steps, history.
    solver : {"eigenpro", "cg", "direct"}
    alpha : float
    alpha_selection : AlphaSelection or None
    bandwidth_selection : BandwidthSelection or None
    early_stopping : bool
    kernel : Kernel
    bandwidth : float or None
    offset : ndarray or None
    intercept : ndarray of shape (l,)
    order : ndarray
        The shuffle of the training rows.
    centers : ndarray
    center_rows : ndarray or None
        The rows of the fit's data the centers are (None: the user's centers).
    plan : KernelFitPlan or None
        None for CG, which plans no batch.
    spectrum : PreconditionerPlan or None
    operator : OperatorPlan or None
        How the products were computed (grid, cache, shards, streaming).
    throughputs : dict
    device_cache : PredictionTensors
        The tensors of predictions after fit.
    attempts : list of dict
        The fit's record of what was tried, in order: every solver run the driver
        made, the one that produced the model last, as ``{"solver", "alpha",
        "reason"}`` (see :func:`~skgpu_kernel.solvers.kernel_paths.run_solver`),
        and every stage that went on with less memory after the device ran out, as
        ``{"event": "out_of_memory", "stage", "solver", "shrank", "from", "to",
        "reason"}`` (see :mod:`skgpu_kernel.out_of_memory`).
    """

    loop: KernelLoopResult
    solver: str
    alpha: float
    alpha_selection: object
    bandwidth_selection: object
    early_stopping: bool
    kernel: object
    bandwidth: float | None
    offset: np.ndarray | None
    intercept: np.ndarray
    order: np.ndarray
    centers: np.ndarray
    center_rows: np.ndarray | None
    plan: object
    spectrum: object
    operator: object
    throughputs: dict
    device_cache: object
    attempts: list
    check: dict | None = None

    @property
    def decisions(self):
        """The fitted attributes of what the fit decided: its operator, layout and spectrum.

        Stated by what each solver produced, not inferred from which solver ran: the
        operator plan (every solver) gives the cache and the grid, a batch plan
        (EigenPro, and CG on every point's subsample and cache) the layout, a
        spectrum (EigenPro) the preconditioner; None (or 0) where the solver has no
        such decision.
        """
        operator, plan, spectrum = self.operator, self.plan, self.spectrum
        decisions = {
            "kernel_cached_": operator is not None and operator.cached,
            "kernel_cache_dtype_": None if operator is None else operator.cache_dtype,
            "kernel_grid_step_": None if operator is None else operator.grid_step,
            "subsample_size_": None if plan is None else plan.subsample_size,
            "projection_": None if plan is None else plan.projection,
            "streamed_": plan is not None and plan.streamed,
            "n_temporary_centers_": 0 if plan is None else plan.n_temporary,
            "batch_capacity_": None,
            "top_eigenvalues_": None,
            "n_components_": None,
            "critical_batch_size_": None,
        }
        if spectrum is not None:
            n_components = spectrum.preconditioner.n_components
            decisions.update(
                batch_capacity_=plan.capacity,
                top_eigenvalues_=spectrum.eigenvalues[: n_components + 1].copy(),
                n_components_=n_components,
                critical_batch_size_=(spectrum.critical_batch, spectrum.critical_batch_preconditioned),
            )
        return decisions


@dataclass(frozen=True)
class FitRequest:
    """What one kernel fit is asked: the validated rows and the estimator's parameters.

    One of the four objects that cross the stages of a fit, with the runtime
    (:class:`KernelRuntime`), the plan (:class:`FitPlan`) and the result
    (:class:`KernelFitResult`).
    """

    data: KernelFitInput
    parameters: KernelFitParameters

    def on(self, data):
        """The same request on other rows (a subset, or the rows seen through a metric)."""
        return dataclasses.replace(self, data=data)

    def with_parameters(self, parameters):
        """The same rows asked with other parameters (the learning path's kernel)."""
        return dataclasses.replace(self, parameters=parameters)


@dataclass(frozen=True)
class FitPlan:
    """Every decision of one kernel fit, made stage by stage: resolved, tuned, then its solver chosen.

    Attributes
    ----------
    kernel : Kernel
        The kernel with its bandwidth by the scale rule (or the user's).
    bandwidth : float or None
        That bandwidth.
    data : KernelFitInput
        The request's rows with ``n_centers="auto"`` counted.
    policy : KernelFitPolicy
        The policy of :func:`~skgpu_kernel.planning.kernel_policy.plan_kernel_fit`.
    streamed : bool
        EigenPro 3 reads the rows in buffers.
    tuning : KernelTuning or None
        The tune stage's bandwidth and penalty (None before it).
    direct : str or None
        :func:`~skgpu_kernel.planning.kernel_policy.plan_direct_solve`'s decision
        (None: the policy's solver iterates).
    """

    kernel: object
    bandwidth: float | None
    data: KernelFitInput
    policy: object
    streamed: bool
    tuning: object = None
    direct: str | None = None

    @property
    def solver(self):
        """The solver the driver starts with: "direct" for a factored solve, else the tuned policy's."""
        return "direct" if self.direct == DIRECT_FACTORED else self.tuning.policy.solver

    @property
    def fitted_bandwidth(self):
        """The bandwidth fitted with: the rule's where no search chose it."""
        return self.bandwidth if self.tuning.by_rule else self.tuning.kernel.bandwidth

    def pinned(self):
        """This plan with its tuning's bandwidth kept on any rows (:meth:`KernelTuning.pinned`)."""
        return dataclasses.replace(self, tuning=self.tuning.pinned())


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
        resolved = dataclasses.replace(resolved, tuning=_applied(plan.tuning, resolved))
    return solve(request, runtime, choose_solver(request, tune(request, runtime, resolved)))


def resolve(request, runtime):
    """The resolve stage: the kernel (its bandwidth by rule), ``n_centers="auto"`` counted, streaming, the policy.

    Returns
    -------
    FitPlan
        Untuned.
    """
    parameters = request.parameters
    kernel, bandwidth = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, request.data.X)
    data = _resolve_auto_centers(request.data, runtime, parameters, kernel)
    streamed = data.uses_centers and _streams(data.X, data.Y.shape[1], runtime)
    policy_request = parameters.request(weighted=not data.equal_weights)
    policy = plan_kernel_fit(_problem(data, runtime, kernel, streamed), runtime.budget, policy_request)
    return FitPlan(kernel, bandwidth, data, policy, streamed)


def tune(request, runtime, plan):
    """The tune stage: ``plan`` with its bandwidth and penalty, chosen here unless it holds them already.

    Returns
    -------
    FitPlan
    """
    if plan.tuning is not None:
        return plan
    return dataclasses.replace(plan, tuning=_tuned(request, runtime, plan))


def tune_kernel(request, runtime):
    """The bandwidth ("auto") and the penalty (leave-one-out) of the request's kernel on its rows.

    Draws from a copy of ``runtime``'s random state: a fit handed the plan
    draws what it would draw choosing them itself, and gives the same model.

    Returns
    -------
    FitPlan
        Tuned, for :func:`fit_kernel_model` to reuse on these rows or a subset.
    """
    return tune(request, runtime, resolve(request, runtime))


def choose_solver(request, plan):
    """The solver stage's choice: the tune stage's solution, one factorisation, or the policy's solver.

    Returns
    -------
    FitPlan
        With ``direct`` (:func:`~skgpu_kernel.planning.kernel_policy.plan_direct_solve`).
    """
    parameters, tuning = request.parameters, plan.tuning
    warm_start, every_iteration = plan.data.continuation is not None, parameters.tol is None
    exact = tuning.solves(plan.data.X)
    direct = plan_direct_solve(tuning.policy, exact, parameters.fit_intercept, warm_start, every_iteration)
    return dataclasses.replace(plan, direct=direct)


def solve(request, runtime, plan):
    """The solve stage: the model of ``plan`` (every decision made), as the shell stores it.

    Returns
    -------
    KernelFitResult
    """
    if plan.direct == DIRECT_FROM_TUNING:
        model = _direct_model(request, runtime, plan)
    else:
        model = _solved_model(request, runtime, plan)
    outcome, tuning = model.outcome, plan.tuning
    selection, search = tuning.alpha_selection, tuning.bandwidth_selection
    return KernelFitResult(
        loop=outcome.result,
        solver=outcome.attempts[-1].solver,
        alpha=outcome.attempts[-1].alpha,
        attempts=list(outcome.record),
        alpha_selection=selection and selection.without_solution(),
        bandwidth_selection=search and search.without_solution(),
        early_stopping=model.early_stopping,
        kernel=model.kernel,
        bandwidth=model.bandwidth,
        offset=model.offset,
        intercept=model.intercept,
        order=model.order,
        centers=outcome.centers,
        center_rows=model.center_rows,
        plan=outcome.plan,
        spectrum=outcome.spectrum,
        operator=outcome.operator,
        throughputs=outcome.throughputs,
        device_cache=outcome.device_cache,
        check=outcome.check,
    )


@dataclass(frozen=True)
class _Model:
    """What a solve produced and the kernel, offset, intercept and shuffle it was fitted with."""

    outcome: PathOutcome
    kernel: object
    bandwidth: float | None
    offset: np.ndarray | None
    intercept: np.ndarray
    order: np.ndarray
    early_stopping: bool
    center_rows: np.ndarray | None  # the rows of the fit's data the centers are; None: the user's centers


def _solved_model(request, runtime, plan):
    """Split, centre, shuffle, draw the centers, then run the plan's solver and its fallbacks."""
    parameters, data, kernel, policy = request.parameters, plan.data, plan.tuning.kernel, plan.tuning.policy
    bandwidth, solver = plan.fitted_bandwidth, plan.solver
    split = _split(data, policy.early_stopping, parameters.validation_fraction, runtime.rng)
    X, Y, weights, validation = split.training.X, split.training.Y, split.training.weights, split.validation
    intercept = _intercept(parameters.fit_intercept, Y, weights)
    if validation is not None and plan.tuning.by_rule:  # the bandwidth rule reads the rows the model is fitted on
        kernel, bandwidth = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, X)
    offset = _kernel_offset(kernel, X)
    order = runtime.rng.permutation(X.shape[0])
    factored_cg = solver == "cg" and not data.uses_centers and full_kernel_cg_factors(policy.problem)
    centers = _Centers.of(data, X, order, every_point=factored_cg)
    if centers is not None:
        coef_init = _continued_center_coef(data.continuation, centers.rows)
    else:
        coef_init = _continued_coef(data.continuation, X, order)
    joint = _fits_joint_intercept(parameters.fit_intercept, policy.alpha, validation)
    targets = np.hstack([Y - intercept, np.ones((Y.shape[0], 1))]) if joint else Y - intercept
    if joint and coef_init is not None:  # the ones column starts from zero
        coef_init = torch.cat([coef_init, torch.zeros_like(coef_init[:, :1])], dim=1)
    host = KernelHostData(
        X=X,
        Y=targets,
        weights=weights,
        order=order,
        validation=validation,
        centers=None if centers is None else centers.rows,
        coef_init=coef_init,
        centers_from_data=data.centers is None,
        streamed=plan.streamed,
        center_shares=None if centers is None else centers.shares,
        X_device=split.training.X_device,
        center_rows=None if centers is None else centers.indices,
        joint_intercept=joint,
    )
    settings = _path_settings(parameters, kernel, bandwidth, offset, intercept, policy.alpha)
    outcome = run_solver(solver, policy.alpha, host, runtime, settings)
    if joint:
        rows = X if split.training.X_device is None else split.training.X_device
        residuals = None if not data.uses_centers else _JointResiduals(rows, host.Y, weights, kernel, runtime.budget)
        outcome, shift = _with_joint_intercept(outcome, residuals)
        intercept = intercept + shift
    center_rows = order if centers is None else centers.indices
    center_rows = None if center_rows is None else split.of_data(center_rows)
    return _Model(outcome, kernel, bandwidth, offset, intercept, order, policy.early_stopping, center_rows)


def _direct_model(request, runtime, plan):
    """The tune stage's exact kernel ridge solution as the fit's model: no solver runs.

    The criterion scored every row as a feature, in the order of ``tuning.scored_rows``:
    those rows are the centers, its coefficients the model's.
    """
    data, tuning, parameters, bandwidth = plan.data, plan.tuning, request.parameters, plan.fitted_bandwidth
    kernel, selection, order = tuning.kernel, tuning.alpha_selection, tuning.scored_rows
    offset = _kernel_offset(kernel, data.X)
    to_device = DeviceCopier(runtime.devices[0], runtime.dtype, offset)
    centers = np.asarray(data.X[order], dtype=np.float64)
    coef = selection.solution.coef.to(runtime.devices[0], runtime.dtype)
    intercept = _intercept(True, data.Y, data.weights) + selection.solution.intercept.cpu().numpy()
    log_fit(runtime, parameters, f"solver direct: kernel ridge on {order.size} rows, alpha {selection.alpha:.4g}")
    attempt = Attempt("direct", selection.alpha)
    device_cache = PredictionTensors.of_centers(
        kernel, to_device(rows_taken(data.X, data.X_device, order)), coef, to_device.offset
    )

    # The exact solution cannot diverge; its last check is recorded as every fit's is.
    def predict(indices):
        rows = to_device(rows_taken(data.X, data.X_device, indices))
        return device_cache.predict_on_device(kernel, rows, runtime.budget)

    check = check_fit(predict, data.Y - intercept, data.weights)
    outcome = PathOutcome(
        KernelLoopResult.direct(coef),
        centers=centers,
        device_cache=device_cache,
        attempts=(attempt,),
        record=(*runtime.memory_events, attempt.record()),
        check=check.record(),
    )
    return _Model(outcome, kernel, bandwidth, offset, intercept, order, False, order)


@dataclass(frozen=True)
class KernelTuning:
    """A kernel's bandwidth and penalty once chosen, the criteria behind them, and the policy they settled.

    Made once per kernel per fit by :func:`tune_kernel` and reused by every fit of
    that kernel on the same rows or on a subset of them (feature learning's
    candidates on its training rows, the path's later steps, the final refit).

    Attributes
    ----------
    kernel : Kernel
        With the chosen bandwidth.
    policy : KernelFitPolicy
        The policy of the rows tuned on, ``alpha`` settled.
    bandwidth_selection : BandwidthSelection or None
    alpha_selection : AlphaSelection or None
        None where ``alpha`` was given.
    by_rule : bool
        The bandwidth is the scale rule's (or the user's): a fit on other rows
        takes the rule's bandwidth on its own rows.
    n_rows : int
        The rows tuned on.
    scored_rows : ndarray or None
        The rows the penalty's criterion scored, in its order (None: not scored).
    X : array or None
        The host rows tuned on (the array itself, not a copy): the criterion's
        solution is a model of exactly these rows in these features.
    """

    kernel: object
    policy: object
    bandwidth_selection: object = None
    alpha_selection: object = None
    by_rule: bool = True
    n_rows: int = 0
    scored_rows: np.ndarray | None = None
    X: object = dataclasses.field(default=None, repr=False, compare=False)

    def solves(self, X):
        """Whether the criterion's solution is a model of the rows ``X``.

        Only where ``X`` is the very array tuned on and every row of it was scored.
        """
        selection = self.alpha_selection
        return (
            selection is not None
            and selection.solution is not None
            and selection.n_rows == self.n_rows
            and (X is self.X)
        )

    def pinned(self):
        """This tuning with its bandwidth kept on any rows, the rule's included (the learning path's).

        The path fits other features (``X L``) with it: the criterion's solution, a
        model of the rows tuned on, is dropped.
        """
        selection = self.alpha_selection and self.alpha_selection.without_solution()
        return dataclasses.replace(self, by_rule=False, alpha_selection=selection, X=None)


def _applied(tuning, resolved):
    """``tuning`` for the fit ``resolved`` plans (rows a subset of those tuned on), or None where it does not apply.

    The penalty chosen by the rule is a per-sample penalty: it is applied to the
    fit's weight total, as the rule would choose it there (``alpha`` as it is where
    the rule scored only part of the rows, as :class:`LooRows` keeps it).  A policy
    that asks for no leave-one-out penalty, or one the tuning did not score, is
    not this tuning's.
    """
    policy, selection = resolved.policy, tuning.alpha_selection
    if (policy.alpha is None) != (selection is not None):
        return None
    if selection is not None:
        alpha = selection.alpha
        if selection.alpha > 0 and selection.n_rows >= tuning.n_rows:
            alpha = selection.penalty * float(np.sum(resolved.data.weights))
        policy = policy.with_alpha(alpha)
    kernel = resolved.kernel if tuning.by_rule else tuning.kernel
    return dataclasses.replace(tuning, kernel=kernel, policy=policy)


def _tuned(request, runtime, plan):
    """Search the bandwidth ("auto") and score the penalty where the policy asks; a warm start keeps its bandwidth."""
    parameters, data, kernel, policy = request.parameters, plan.data, plan.kernel, plan.policy
    searched = searches_bandwidth(parameters.kernel, parameters.bandwidth)
    continued = data.continuation.bandwidth if searched and data.continuation is not None else None
    if continued is not None:
        kernel = clone(kernel).set_params(bandwidth=continued)
    search, selection, scored_rows = None, None, None
    if (searched and continued is None) or policy.alpha is None:
        scored = LooRows.draw(data, kernel, runtime, parameters, LOO_MAX_ROWS if policy.alpha is None else 0)
        if searched and continued is None:
            search = scored.search_bandwidth(kernel, _search_penalties(policy, data), data.X.shape[0])
            kernel = clone(kernel).set_params(bandwidth=search.bandwidth)
            log_fit(runtime, parameters, search.describe())
        if policy.alpha is None:
            scored = scored.head(LOO_MAX_ROWS)
            # Where the search scored every row, each of them a feature, its own selection is the criterion's.
            exact = search is not None and search.selection.n_rows == scored.n_rows <= auto_subsample_size(
                scored.n_rows
            )
            selection = search.selection if exact else scored.select_alpha(kernel, policy.loo_min_coverage)
            selection = _gated(selection, search, policy, data)
            policy = policy.with_alpha(selection.alpha)
            scored_rows = scored.indices
    return KernelTuning(kernel, policy, search, selection, not searched, data.X.shape[0], scored_rows, data.X)


def _gated(selection, search, policy, data):
    """``selection`` where its features cover the kernel; else the search's exact penalty carried over, or none.

    Below the policy's coverage the Nystrom criterion is not trusted; the bandwidth
    search's exact ``alpha`` on a subsample is carried over, as it is, to every row where
    :func:`~skgpu_kernel.planning.kernel_policy.carries_subsample_penalty` says so,
    and otherwise the fit has no penalty (early stopping regularises).
    """
    gated = selection.gated(policy.loo_min_coverage)
    if gated.scored or search is None or not carries_subsample_penalty(search.selection.n_rows, data.X.shape[0]):
        return gated
    return search.selection.carried_to(gated.coverage)


def _problem(data, runtime, kernel, streamed):
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
    )


def _resolve_auto_centers(data, runtime, parameters, kernel):
    """``data`` with ``n_centers="auto"`` replaced by :func:`plan_auto_centers`'s count (None: every point)."""
    if data.n_centers != "auto":
        return data
    if data.centers is not None:  # the user's centers: nothing to count
        return dataclasses.replace(data, n_centers=None)
    streamed = _streams(data.X, data.Y.shape[1], runtime)
    problem = _problem(dataclasses.replace(data, n_centers=None), runtime, kernel, streamed)
    count = plan_auto_centers(problem, runtime.budget, runtime.devices[0], parameters.planning)
    chosen = "every training point" if count.n_centers is None else str(count.n_centers)
    log_fit(runtime, parameters, f"n_centers='auto' on {problem.n_rows} rows: {chosen} ({count.reason})")
    return dataclasses.replace(data, n_centers=count.n_centers)


def log_fit(runtime, parameters, message):
    """``verbose``: ``message`` with the estimator's name, where the runtime logs."""
    if runtime.log is not None:
        runtime.log(f"[{parameters.name}] {message}")


def _search_penalties(policy, data):
    """The penalties each bandwidth is scored at: a given ``alpha``'s alone, else the whole grid.

    Where early stopping regularises (``alpha`` 0), the bandwidth is the one whose
    best penalty scores best: early stopping follows a path much like the ridge
    path's.
    """
    if policy.alpha_mode == "given" and policy.alpha > 0:
        return np.array([policy.alpha / float(np.sum(data.weights))])
    return PENALTY_GRID


def _fits_joint_intercept(fit_intercept, alpha, validation):
    """Whether the intercept is fitted with the kernel part: penalised (``alpha > 0``), no held-out split.

    The package's one model is ``f(x) = sum_j a_j k(z_j, x) + b`` minimising
    ``sum_i w_i (y_i - f(x_i))^2 + alpha a^T K(Z, Z) a`` with ``b`` unpenalised,
    whatever the solver.  Every solver solves for the coefficients of given
    targets, so the fit solves for the centred targets and a column of ones
    together and combines them (:func:`_with_joint_intercept`).  Without a penalty
    (an interpolating or early-stopped fit, where ``b`` is not determined), and
    where held-out rows score every epoch, ``b`` is the weighted mean of the
    targets.  The joint intercept was measured to matter: the leave-one-out
    criterion scores ridge with an unpenalised intercept (centred features, as
    ``RidgeCV(fit_intercept=True)``); the weighted mean of the targets is that
    intercept only where the kernel part averages to zero over the rows, which a
    narrow kernel's does not: on Ionosphere (280 rows) the mean intercept gave test
    error 0.28 where ridge on the same kernel's features with its own intercept gave
    0.056.
    """
    return fit_intercept and validation is None and alpha > 0


@dataclass(frozen=True)
class _JointResiduals:
    """What the joint intercept of a model on centers reads: the training rows, targets (ones last), weights."""

    X: object
    targets: np.ndarray
    weights: np.ndarray
    kernel: object
    budget: int

    def sums(self, device_cache):
        """``(sum_i w_i r_i for each target column, the same for the ones column)`` of the fitted columns."""
        fitted = device_cache.predict(self.kernel, self.X, self.budget)
        weighted = self.weights[:, None] * (self.targets - fitted.astype(np.float64))
        sums = weighted.sum(axis=0)
        return sums[:-1], sums[-1]


def _with_joint_intercept(outcome, residuals=None):
    """The outcome of a solve with a column of ones appended, as a model with an unpenalised intercept.

    The solver returns ``a_t`` for the targets and ``a_1`` for the ones; the model
    ``a = a_t - b a_1`` fits the targets less ``b``, and the intercept's normal
    equation ``1^T W (y - K a - b 1) = 0`` gives ``b = s_t / s_1``, the weighted
    residual sums ``s = 1^T W (t - K a_t)`` of the two solved columns.  With a center
    at every training point (``residuals`` None) these need no product:
    ``W (t - K a_t) = alpha a_t``, so ``b`` is the ratio of the coefficients' sums.
    On centers they take one pass of ``K(X, Z)`` over the training rows.  Returns the
    outcome with ``a`` and ``b`` (one per output).
    """
    coef = outcome.result.coef
    for_targets, for_ones = coef[:, :-1], coef[:, -1:]
    if residuals is None:
        shift = for_targets.sum(dim=0) / for_ones.sum()
    else:
        for_targets_sums, for_ones_sum = residuals.sums(outcome.device_cache)
        shift = torch.as_tensor(for_targets_sums / for_ones_sum, dtype=coef.dtype, device=coef.device)
    combined = for_targets - for_ones * shift
    result = dataclasses.replace(outcome.result, coef=combined)
    outcome = dataclasses.replace(outcome, result=result, device_cache=outcome.device_cache.with_coef(combined))
    return outcome, shift.double().cpu().numpy()


def _path_settings(parameters, kernel, bandwidth, offset, intercept, alpha):
    score = _with_intercept(parameters.validation_score, intercept)
    return KernelFitSettings(kernel, bandwidth, offset, alpha, score, parameters)


@dataclass(frozen=True)
class _Split:
    """The rows a solver fits (``training``: ``data`` restricted to them) and those it scores (or None).

    ``train``: which of ``data``'s rows ``training`` holds (None: every one).
    """

    training: KernelFitInput
    validation: HeldOut | None
    train: np.ndarray | None = None

    def of_data(self, indices):
        """``indices`` into the training rows as indices into ``data``'s rows."""
        return indices if self.train is None else self.train[indices]


def _split(data, early_stopping, validation_fraction, rng):
    """The training rows and the held-out rows (:class:`HeldOut`, or None without early stopping)."""
    if not early_stopping:
        return _Split(data, None)
    train, held_out = holdout_split(data.X.shape[0], validation_fraction, rng, data.stratify)
    validation = HeldOut(data.X[held_out], data.Y[held_out], taken_on_device(data.X_device, held_out))
    return _Split(rows_of(data, train), validation, train)


def with_rows_on_device(data, runtime):
    """``data`` with its rows' one copy on the compute device (``X_device``), where the fit can hold one.

    Every stage of the fit (the criteria's rows, the split, the shuffle, the
    centers, the held-out scoring, feature learning's metrics) takes its rows
    from this copy instead of copying them from the host again.  The copy keeps
    the rows' dtype, so what a stage converts from it is what it converted from
    the host, to the bit.  On the CPU a C-contiguous array is shared, not copied.
    None is made for rows read in buffers, for a fit over a process group (its
    ranks copy their own shares), or for rows over half of the memory budget;
    where the device has no room for the copy, each stage copies its own rows,
    as without one.  See :func:`runtime_holding_rows` for the budget.
    """
    if runtime.group is not None or is_out_of_core(data.X) or not isinstance(data.X, np.ndarray):
        return data
    if data.X.nbytes > runtime.budget // 2:
        return data
    try:
        on_device = _copy_rows_to(data.X, runtime.devices[0])
    except RuntimeError as error:  # out of device memory: every stage copies its own rows
        out_of_memory_reason(error)
        release_cached_memory(runtime.devices[0])
        return data
    return dataclasses.replace(data, X_device=on_device)


def _copy_rows_to(X, device):
    """``X`` on ``device`` in its own dtype (on the CPU, a C-contiguous array's own memory)."""
    return torch.as_tensor(np.ascontiguousarray(X)).to(device)


def runtime_holding_rows(runtime, data):
    """``runtime`` with the device copy of ``data``'s rows taken off the budget the planners divide.

    A copy on the CPU shares the host's memory, or stands for the copies each
    stage made: the budget is the same as without it.
    """
    if data.X_device is None or data.X_device.device.type == "cpu":
        return runtime
    held = data.X_device.nbytes
    return dataclasses.replace(runtime, budget=runtime.budget - held, held_bytes=runtime.held_bytes + held)


def rows_of(data, indices):
    """``data`` restricted to the rows ``indices``, its device copy too (a fresh fit: no warm start)."""
    stratify = None if data.stratify is None else data.stratify[indices]
    return dataclasses.replace(
        data,
        X=np.asarray(data.X[indices]),
        Y=data.Y[indices],
        weights=data.weights[indices],
        stratify=stratify,
        continuation=None,
        X_device=taken_on_device(data.X_device, indices),
    )


def _intercept(fit_intercept, Y, weights):
    return np.average(Y, axis=0, weights=weights) if fit_intercept else np.zeros(Y.shape[1])


def _kernel_offset(kernel, X):
    """The feature means subtracted before a translation-invariant kernel (rounding of distances), or None."""
    return X.mean(axis=0, dtype=np.float64) if kernel.translation_invariant else None


def _streams(X, n_outputs, runtime):
    """Whether EigenPro 3 streams ``X``: a memory-mapped file whose device copy would take over half the budget."""
    return is_out_of_core(X, runtime.itemsize * X.shape[0] * (X.shape[1] + n_outputs + 1), runtime.budget)


@dataclass(frozen=True)
class _Centers:
    """The centers of a fit on centers: float64 host rows, the training rows they are, their shares.

    ``indices`` (into the training rows; None for the user's centers) let the
    solvers take them from the rows' device copy; ``shares`` (see
    :func:`_distinct_rows`) is None for the user's centers and for a uniform draw.
    """

    rows: np.ndarray
    indices: np.ndarray | None = None
    shares: np.ndarray | None = None

    @classmethod
    def of(cls, data, X, order, every_point=False):
        """The user's centers, distinct shuffled training rows, or every one (``every_point``: Falkon's CG); None."""
        if every_point and not data.uses_centers:
            return cls(X[order].astype(np.float64), order)
        if not data.uses_centers:
            return None
        if data.centers is not None:
            return cls(data.centers)
        n, n_centers = X.shape[0], data.n_centers
        if n_centers > n:
            warn_user(f"n_centers={n_centers} is larger than the {n} training samples; using {n} centers.")
            n_centers = n
        indices, shares = _distinct_rows(X, order, n_centers)
        return cls(np.asarray(X[indices], dtype=np.float64), indices, shares)


def _distinct_rows(X, order, count):
    """``(indices, shares)``: the first ``count`` distinct rows of ``X[order]`` (fewer if ``X`` has fewer).

    A repeated center adds nothing to the model's span but makes ``K(Z, Z)``
    singular, which slows CG and EigenPro 3's projection: on Fertility (254654 rows,
    7 categorical or integer features) a uniform draw of 10000 rows holds only a few
    hundred distinct ones.  Continuous data draw ``count`` distinct rows at once.
    ``shares`` is the share of the rows examined that each center's value stands
    for (CG's preconditioner weighs the centers by it), or None when no examined
    row repeats (``1 / p`` each, a uniform draw).
    """
    taken = counts = np.empty(0, dtype=np.int64)
    drawn = 0
    while taken.size < count and drawn < order.size:
        drawn = min(order.size, max(2 * drawn, count + count // 8 + 1))
        rows = np.ascontiguousarray(X[order[:drawn]])
        keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        by_position = np.argsort(first)  # first occurrences, in shuffled order
        taken, counts = first[by_position], counts[by_position]
    indices = order[taken[:count]]
    if taken.size == drawn:
        return indices, None
    # Beyond p distinct values, the rows of the values left out are shared in proportion.
    return indices, counts[:count] / counts[:count].sum()


def _continued_center_coef(continuation, centers):
    """Previous coefficients when warm starting on the same centers, or None for a fresh fit."""
    if continuation is None:
        return None
    previous = continuation.centers
    if previous.shape != centers.shape or not np.array_equal(centers.astype(previous.dtype, copy=False), previous):
        raise ValueError(
            "warm_start=True continues from the previous coefficients, which belong to the previous "
            "centers: fit must be called with the same centers (same X, n_centers and random_state, or "
            "the same centers array). Set warm_start=False to fit new centers."
        )
    return torch.as_tensor(continuation.dual_coef)


def _continued_coef(continuation, X, order):
    """Previous coefficients rearranged to ``order`` (every training row a center), or None for a fresh fit."""
    if continuation is None:
        return None
    previous = continuation.training_order
    if previous.shape[0] != X.shape[0] or not np.array_equal(
        X[previous].astype(continuation.centers.dtype, copy=False), continuation.centers
    ):
        raise ValueError(
            "warm_start=True continues from the previous centers, which are the previous "
            "training points: fit must be called with the same X (and the same "
            "early-stopping split). Set warm_start=False to fit new data."
        )
    position_in_previous = np.empty_like(previous)
    position_in_previous[previous] = np.arange(previous.shape[0])
    return torch.as_tensor(continuation.dual_coef[position_in_previous[order]])


def _with_intercept(validation_score, intercept):
    """The validation score of predictions made without the intercept (the loops fit centred targets)."""

    def score(predictions, targets):
        shift = torch.as_tensor(intercept, dtype=predictions.dtype, device=predictions.device)
        return validation_score(predictions + shift, targets)

    return score


@dataclass(frozen=True)
class LooRows:
    """The rows the leave-one-out criteria score, on the device in float64, in their seeded random order.

    At most ``LOO_MAX_ROWS`` rows are scored.  Beyond that the chosen ``alpha`` is
    kept as it is rather than scaled with the number of rows: on the real-data
    benchmark the leave-one-out ``alpha`` stayed within a factor 1.5 from 5000 to
    60000 rows of Fashion-MNIST and from 4000 to 17817 rows of HI (and fell on
    VietNamI), where a constant per-sample penalty would have grown it 4 to 12 times.

    Attributes
    ----------
    X, Y : Tensor
        Rows and targets (the codes less the intercept for a classifier).
    weights : Tensor or None
        None when every weight is equal.
    classes : ClassCodes or None
        A classifier's labels: its criterion counts misclassifications.
    """

    X: torch.Tensor
    Y: torch.Tensor
    weights: torch.Tensor | None
    classes: ClassCodes | None
    indices: np.ndarray | None = None

    @classmethod
    def draw(cls, data, kernel, runtime, parameters, count):
        """``max(count, BANDWIDTH_SEARCH_ROWS)`` seeded random rows of ``data``, or all (the first s: the subsample)."""
        device = runtime.devices[0]
        intercept = _intercept(parameters.fit_intercept, data.Y, data.weights)
        to_device = DeviceCopier(device, torch.float64, _kernel_offset(kernel, data.X))
        # Drawn from a copy of the fit's generator, so that choosing alpha leaves the fit's own
        # draws (validation split, epoch orders) as they would be with alpha given.
        rows = copy.deepcopy(runtime.rng).permutation(data.X.shape[0])[: max(count, BANDWIDTH_SEARCH_ROWS)]
        w = None if data.equal_weights else torch.as_tensor(data.weights[rows], dtype=torch.float64, device=device)
        classes = None
        if parameters.classifier:
            # The class indices are the code columns, and for +-1 codes 1 is the positive class.
            labels = torch.as_tensor(np.asarray(data.stratify[rows], dtype=np.int64), device=device)
            classes = ClassCodes(labels, torch.as_tensor(intercept, dtype=torch.float64, device=device))
        X = to_device(rows_taken(data.X, data.X_device, rows))
        return cls(X, to_device(data.Y[rows] - intercept, center=False), w, classes, rows)

    @property
    def n_rows(self):
        return self.X.shape[0]

    def head(self, count):
        """The first ``count`` rows."""
        weights = None if self.weights is None else self.weights[:count]
        classes = self.classes and dataclasses.replace(self.classes, labels=self.classes.labels[:count])
        return LooRows(self.X[:count], self.Y[:count], weights, classes, self.indices[:count])

    def select_alpha(self, kernel, min_coverage=0.0):
        """:func:`~skgpu_kernel.regularization.select_alpha` on these rows."""
        subsample = auto_subsample_size(self.n_rows)
        return select_alpha(kernel, self.X, self.Y, self.weights, subsample, min_coverage, classes=self.classes)

    def search_bandwidth(self, kernel, penalties, n_rows):
        """:func:`~skgpu_kernel.regularization.select_bandwidth` on the first ``BANDWIDTH_SEARCH_ROWS`` rows.

        Every row searched is a feature, so the criterion is exact for a kernel
        machine on those rows.  Of ``n_rows`` rows in all, the bandwidth best for
        a subsample is at least as wide as the one best for every row (a model of
        more rows resolves finer detail), so a subsample's preference for a bandwidth
        wider than the scale rule is not followed.
        """
        count = min(self.n_rows, BANDWIDTH_SEARCH_ROWS)
        searched = self.head(count)
        widest = None if count >= n_rows else 1.0
        return select_bandwidth(
            kernel,
            searched.X,
            searched.Y,
            searched.weights,
            count,
            classes=searched.classes,
            penalties=penalties,
            widest=widest,
        )
