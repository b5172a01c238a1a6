"""The kernel machines' one fit pipeline: policy, penalty, split, kernel, centers, then a path.

The estimator shell validates the input and hands over host arrays
(:class:`KernelFitInput`), the resolved runtime (:class:`KernelRuntime`: devices,
dtype, budget, random state) and its parameters (:class:`KernelFitParameters`).
This module makes every further decision once, in order:

1. the policy (:func:`~skgpu_kernel.planning.kernel_policy.plan_kernel_fit`): the
   solver, how ``alpha`` is resolved, whether to hold out a validation split;
2. the leave-one-out ``alpha`` when the policy asks for it (a measurement on the
   device, :func:`choose_alpha`), which settles the rest of the policy;
3. the validation split, the intercept, the kernel on the training rows, the
   shuffle, the centers and the warm start;
4. one path of :mod:`skgpu_kernel.solvers.kernel_paths` (EigenPro 2, EigenPro 3
   or CG),

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

from .._warnings import warn_user
from ..blockwise import DeviceCopier
from ..buffer import is_out_of_core
from ..kernels import make_kernel
from ..planning.kernel import KernelProblem, KernelSettings, auto_subsample_size, plan_auto_centers
from ..planning.kernel_policy import KernelFitRequest, plan_kernel_fit
from ..regularization import LOO_MAX_ROWS, LOO_MIN_COVERAGE, select_alpha
from ..splits import holdout_split
from .eigenpro import KernelLoopResult
from .kernel_paths import KernelFitSettings, KernelHostData, KernelRuntime, run_path

__all__ = [
    "KernelContinuation",
    "KernelFitInput",
    "KernelFitParameters",
    "KernelFitResult",
    "KernelRuntime",
    "choose_alpha",
    "fit_kernel_model",
]


@dataclass(frozen=True)
class KernelContinuation:
    """What a warm start continues from: the previous fit's coefficients, centers and shuffle."""

    dual_coef: np.ndarray
    centers: np.ndarray
    training_order: np.ndarray


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
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    stratify: np.ndarray | None = None
    centers: np.ndarray | None = None
    n_centers: int | None = None
    continuation: KernelContinuation | None = None

    @property
    def uses_centers(self):
        return self.centers is not None or self.n_centers is not None


@dataclass(frozen=True)
class KernelFitParameters:
    """The estimator's parameters, as the pipeline reads them (kernel unresolved, scaling rule resolved).

    ``classifier`` says which kind of estimator asks; ``cache_16bit`` is the
    storage policy of EigenPro 2's cache (see
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
    cache_16bit: bool = True

    @property
    def request(self):
        """What the policy planner reads."""
        return KernelFitRequest(
            self.solver, self.alpha, self.early_stopping, self.classifier, self.distributed, LOO_MIN_COVERAGE
        )

    @property
    def planning(self):
        """What the layout planners read."""
        sizes = (self.batch_size, self.subsample_size)
        return KernelSettings(*sizes, self.cache_kernel, self.projection, self.cache_16bit)


@dataclass(frozen=True)
class KernelFitResult:
    """Everything a kernel fit decided and produced, for the shell to store.

    Attributes
    ----------
    loop : KernelLoopResult
        The coefficients (in the order of ``centers``), epochs, steps, history.
    solver : {"eigenpro", "cg"}
    alpha : float
    alpha_selection : AlphaSelection or None
    early_stopping : bool
    kernel : Kernel
    bandwidth : float or None
    offset : ndarray or None
    intercept : ndarray of shape (l,)
    order : ndarray
        The shuffle of the training rows.
    centers : ndarray
    plan : KernelFitPlan or None
        None for CG, which plans no batch.
    spectrum : PreconditionerPlan or None
    throughputs : dict
    device_cache : tuple
        ``(device, prepared centers, coefficients, offset)`` for predictions after fit.
    """

    loop: KernelLoopResult
    solver: str
    alpha: float
    alpha_selection: object
    early_stopping: bool
    kernel: object
    bandwidth: float | None
    offset: np.ndarray | None
    intercept: np.ndarray
    order: np.ndarray
    centers: np.ndarray
    plan: object
    spectrum: object
    throughputs: dict
    device_cache: tuple


def fit_kernel_model(data, runtime, parameters):
    """Resolve and run a kernel fit: EigenPro 2, EigenPro 3 or CG.

    Parameters
    ----------
    data : KernelFitInput
    runtime : KernelRuntime
    parameters : KernelFitParameters

    Returns
    -------
    KernelFitResult
    """
    kernel, bandwidth = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, data.X)
    data = _resolve_auto_centers(data, runtime, parameters, kernel)
    streamed = data.uses_centers and _streams(data.X, data.Y.shape[1], runtime)
    policy = plan_kernel_fit(_problem(data, runtime, kernel, streamed), runtime.budget, parameters.request)
    selection = None
    if policy.alpha is None:
        centred = data.Y - _intercept(parameters.fit_intercept, data.Y, data.weights)
        offset = _kernel_offset(kernel, data.X)
        selection = choose_alpha(data.X, centred, data.weights, kernel, offset, runtime, policy.loo_min_coverage)
        policy = policy.with_alpha(selection.alpha)
    X, Y, weights, validation = _split(data, policy.early_stopping, parameters.validation_fraction, runtime.rng)
    intercept = _intercept(parameters.fit_intercept, Y, weights)
    if validation is not None:  # the bandwidth rule reads the rows the model is fitted on
        kernel, bandwidth = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, X)
    offset = _kernel_offset(kernel, X)
    order = runtime.rng.permutation(X.shape[0])
    if data.uses_centers or policy.solver == "cg":  # CG takes every training point as a center
        centers, shares = _centers(data, X, order) if data.uses_centers else (X[order].astype(np.float64), None)
        coef_init = _continued_center_coef(data.continuation, centers)
    else:
        centers, shares, coef_init = None, None, _continued_coef(data.continuation, X, order)
    host = KernelHostData(
        X, Y - intercept, weights, order, validation, centers, coef_init, data.centers is None, streamed, shares
    )
    settings = _path_settings(parameters, kernel, bandwidth, offset, intercept, policy.alpha)
    outcome = run_path(policy.solver, host, runtime, settings)
    return KernelFitResult(
        loop=outcome.result,
        solver=policy.solver,
        alpha=policy.alpha if outcome.alpha is None else outcome.alpha,
        alpha_selection=selection,
        early_stopping=policy.early_stopping,
        kernel=kernel,
        bandwidth=bandwidth,
        offset=offset,
        intercept=intercept,
        order=order,
        centers=outcome.centers,
        plan=outcome.plan,
        spectrum=outcome.spectrum,
        throughputs=outcome.throughputs,
        device_cache=outcome.device_cache,
    )


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
    if runtime.log is not None:
        chosen = "every training point" if count.n_centers is None else str(count.n_centers)
        runtime.log(f"[{parameters.name}] n_centers='auto' on {problem.n_rows} rows: {chosen} ({count.reason})")
    return dataclasses.replace(data, n_centers=count.n_centers)


def _path_settings(parameters, kernel, bandwidth, offset, intercept, alpha):
    score = _with_intercept(parameters.validation_score, intercept)
    return KernelFitSettings(kernel, bandwidth, offset, alpha, score, parameters)


def _split(data, early_stopping, validation_fraction, rng):
    """``(X, Y, weights, validation)``: the training rows and the held-out ``(X_val, Y_val)`` (or None)."""
    if not early_stopping:
        return data.X, data.Y, data.weights, None
    train, held_out = holdout_split(data.X.shape[0], validation_fraction, rng, data.stratify)
    return data.X[train], data.Y[train], data.weights[train], (data.X[held_out], data.Y[held_out])


def _intercept(fit_intercept, Y, weights):
    return np.average(Y, axis=0, weights=weights) if fit_intercept else np.zeros(Y.shape[1])


def _kernel_offset(kernel, X):
    """The feature means subtracted before a translation-invariant kernel (rounding of distances), or None."""
    return X.mean(axis=0, dtype=np.float64) if kernel.translation_invariant else None


def _streams(X, n_outputs, runtime):
    """Whether EigenPro 3 streams ``X``: a memory-mapped file whose device copy would take over half the budget."""
    return is_out_of_core(X, runtime.itemsize * X.shape[0] * (X.shape[1] + n_outputs + 1), runtime.budget)


def _centers(data, X, order):
    """``(centers, shares)``: the p centers as a float64 host array, the user's or distinct shuffled training rows.

    ``shares`` (see :func:`_distinct_rows`) is None for the user's centers.
    """
    if data.centers is not None:
        return data.centers, None
    n, n_centers = X.shape[0], data.n_centers
    if n_centers > n:
        warn_user(f"n_centers={n_centers} is larger than the {n} training samples; using {n} centers.")
        n_centers = n
    return _distinct_rows(X, order, n_centers)


def _distinct_rows(X, order, count):
    """``(rows, shares)``: the first ``count`` distinct rows of ``X[order]`` (fewer if ``X`` has fewer), float64.

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
    centers = np.asarray(X[order[taken[:count]]], dtype=np.float64)
    if taken.size == drawn:
        return centers, None
    # Beyond p distinct values, the rows of the values left out are shared in proportion.
    return centers, counts[:count] / counts[:count].sum()


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


def choose_alpha(X, Y, weights, kernel, offset, runtime, min_coverage=0.0):
    """The leave-one-out ``alpha``: :func:`~skgpu_kernel.regularization.select_alpha` on seeded random rows.

    At most ``LOO_MAX_ROWS`` rows are scored.  Beyond that the chosen ``alpha`` is
    kept as it is rather than scaled with the number of rows: on the real-data
    benchmark the leave-one-out ``alpha`` stayed within a factor 1.5 from 5000 to
    60000 rows of Fashion-MNIST and from 4000 to 17817 rows of HI (and fell on
    VietNamI), where a constant per-sample penalty would have grown it 4 to 12 times.

    Parameters
    ----------
    X, Y, weights : ndarray
        Host training rows, centred targets and weights.
    kernel : Kernel
    offset : ndarray or None
    runtime : KernelRuntime
    min_coverage : float, default=0.0
        Passed to :func:`~skgpu_kernel.regularization.select_alpha`.

    Returns
    -------
    AlphaSelection
    """
    to_device = DeviceCopier(runtime.devices[0], torch.float64, offset)  # the criterion is float64 throughout
    # Drawn from a copy of the fit's generator, so that choosing alpha leaves the fit's own
    # draws (validation split, epoch orders) as they would be with alpha given.
    rows = copy.deepcopy(runtime.rng).permutation(X.shape[0])[:LOO_MAX_ROWS]  # the first s: the Nystrom subsample
    unit = np.all(weights == weights[0])
    w = None if unit else torch.as_tensor(weights[rows], dtype=torch.float64, device=runtime.devices[0])
    return select_alpha(
        kernel,
        to_device(X[rows]),
        to_device(Y[rows], center=False),
        w,
        auto_subsample_size(len(rows)),
        min_coverage,
    )
