"""The finish stage: the joint intercept, the centers' rows, the result the shell stores."""

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels import bandwidth_of
from ..solvers.solution import Solution


@dataclass(frozen=True)
class KernelFitResult:
    """What a kernel fit decided and produced: a solver's path fills the first part, the driver and finish the rest.

    Attributes
    ----------
    loop : Solution or None
        The coefficients (in the order of ``centers``), epochs, steps, history;
        None where a path gave up before solving (``fallback`` set).
    centers : ndarray
    device_cache : PredictionTensors
        The tensors of predictions after fit.
    fallback : Fallback or None
        The attempt a path asks the driver to run next (:func:`~skgpu_kernel.fit.solve.run_solver`).
    attempt : Attempt or None
        The attempt that produced the model (a path sets it with its run planned,
        the driver where the path planned none), whose plan holds every decision
        it ran with: its ``solver`` (``solver_``: a registered solver's name),
        ``alpha`` (``alpha_``), kernel, held-out split, the tune stage's
        selections and the solver's run (:attr:`run`) (read by the properties of
        the same names; the finish stage keeps it without the rows tuned on or
        the criteria's solutions).
    attempts : list of dict
        The fit's record of what was tried, in order (set by the driver): the
        events earlier stages reported, then every solver run the driver made, the
        one that produced the model last, as ``{"solver", "alpha", "reason"}``,
        each followed by the events of its run, such as a stage that went on with
        less memory after the device ran out, as ``{"event": "out_of_memory",
        "stage", "solver", "shrank", "from", "to", "reason"}`` (see
        :mod:`skgpu_kernel.out_of_memory`).
    check : dict or None
        The last check of the model (:class:`~skgpu_kernel.solvers.fit_check.FitCheck`'s
        record, ``fit_check_``), or None where none ran.
    offset : ndarray or None
    intercept : ndarray of shape (l,)
    order : ndarray
        The shuffle of the training rows.
    center_rows : ndarray or None
        The rows of the fit's data the centers are (None: the user's centers).
    feature_learning : {"diagonal", "full"} or None
        The feature learning that ran (``"auto"`` resolved); None: none ran
        (:func:`~skgpu_kernel.fit.feature_learning.fit_with_feature_learning`
        sets this field and the next six).
    transform : ndarray of shape (d,) or (d, d), or None
        ``L`` (a diagonal as a vector): the model is one on the learnt features
        ``X L``; None without learning.
    metric : ndarray of shape (d, d) or None
        ``M = L L^T`` of the chosen candidate (the identity without a learnt metric).
    scores : tuple of float
        The held-out score (R^2 or accuracy) of each candidate: 0 the plain model,
        then the learning path's (its kernel with ``M = I``, then each learnt metric).
    iteration : int
        The candidate chosen (0: the plain model).
    temperature : float or None
        A classifier's probability temperature
        (:func:`~skgpu_kernel.calibration.fit_temperature`) from decision values of
        rows a model of the final kernel and metric did not train on; None for a
        regressor, or where no rows could be held out.
    calibration : str or None
        Where the temperature's decision values came from
        (:func:`~skgpu_kernel.planning.agop.plan_calibration`); None for a regressor.
    """

    loop: Solution | None
    centers: np.ndarray | None = None
    device_cache: object = None
    fallback: object = None
    attempt: object = None
    attempts: list = dataclasses.field(default_factory=list)
    check: dict | None = None
    offset: np.ndarray | None = None
    intercept: np.ndarray | None = None
    order: np.ndarray | None = None
    center_rows: np.ndarray | None = None
    feature_learning: str | None = None
    transform: np.ndarray | None = None
    metric: np.ndarray | None = None
    scores: tuple = ()
    iteration: int = 0
    temperature: float | None = None
    calibration: str | None = None

    @property
    def run(self):
        """The solver run's plan (a :class:`~skgpu_kernel.planning.eigenpro.KernelFitPlan`); None where none ran.

        Its layout, batch, operator plan (as carried out: without a cache the
        device refused), spectrum and the capacity probe's timings.
        """
        return None if self.attempt is None else self.attempt.plan.run

    @property
    def operator(self):
        """How the products were computed (grid, cache, shards, streaming): the run's; None without one."""
        return None if self.run is None else self.run.operator

    @property
    def spectrum(self):
        """EigenPro's spectrum and preconditioner (the run's); None for CG, which has none."""
        return None if self.run is None else self.run.spectrum

    @property
    def throughputs(self):
        """The batch capacity probe's timings (empty where none ran)."""
        return {} if self.run is None else self.run.throughputs

    @property
    def kernel(self):
        """The kernel fitted with (its bandwidth is :attr:`bandwidth`)."""
        return self.attempt.plan.kernel

    @property
    def bandwidth(self):
        """The bandwidth fitted with: the kernel's own (None for a kernel without one)."""
        return bandwidth_of(self.kernel)

    @property
    def solver(self):
        """The solver of the attempt that produced the model."""
        return None if self.attempt is None else self.attempt.solver

    @property
    def alpha(self):
        """The penalty of the attempt that produced the model."""
        return None if self.attempt is None else self.attempt.alpha

    @property
    def early_stopping(self):
        """Whether the fit held out a validation split."""
        return bool(self.attempt.plan.early_stopping)

    @property
    def alpha_selection(self):
        """The penalty's criterion (:class:`~skgpu_kernel.regularization.AlphaSelection`) or None."""
        return self.attempt.plan.alpha_selection

    @property
    def bandwidth_selection(self):
        """The bandwidth search (:class:`~skgpu_kernel.regularization.BandwidthSelection`) or None."""
        return self.attempt.plan.bandwidth_selection

    @property
    def decisions(self):
        """The fitted attributes of what the fit decided: its operator, layout and spectrum.

        Stated by what each solver produced, not inferred from which solver ran: the
        operator plan (every solver) gives the cache and the grid, a batch plan
        (EigenPro, and CG on every point's subsample and cache) the layout, a
        spectrum (EigenPro) the preconditioner; None (or 0) where the solver has no
        such decision.
        """
        operator, plan, spectrum = self.operator, self.run, self.spectrum
        decisions = {
            "kernel_cached_": operator is not None and operator.cached,
            "kernel_cache_dtype_": None if operator is None else operator.cache_dtype,
            "kernel_grid_step_": None if operator is None else operator.grid_step,
            "subsample_size_": None if plan is None else plan.subsample_size,
            "projection_": None if plan is None else plan.projection,
            "streamed_": operator is not None and operator.streamed,
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
class JointResiduals:
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


def with_joint_intercept(outcome, residuals=None):
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
    coef = outcome.loop.coef
    for_targets, for_ones = coef[:, :-1], coef[:, -1:]
    if residuals is None:
        shift = for_targets.sum(dim=0) / for_ones.sum()
    else:
        for_targets_sums, for_ones_sum = residuals.sums(outcome.device_cache)
        shift = torch.as_tensor(for_targets_sums / for_ones_sum, dtype=coef.dtype, device=coef.device)
    combined = for_targets - for_ones * shift
    loop = dataclasses.replace(outcome.loop, coef=combined)
    outcome = dataclasses.replace(outcome, loop=loop, device_cache=outcome.device_cache.with_coef(combined))
    return outcome, shift.double().cpu().numpy()


def finished_model(outcome, prepared, runtime):
    """The result of a solve: the joint intercept combined, the centers' rows as rows of the fit's data."""
    intercept = prepared.intercept
    uses_centers = prepared.plan.data.uses_centers
    if prepared.joint_intercept:
        rows = prepared.X if prepared.X_device is None else prepared.X_device
        residuals = None
        if uses_centers:
            residuals = JointResiduals(rows, prepared.Y, prepared.weights, prepared.plan.kernel, runtime.budget)
        outcome, shift = with_joint_intercept(outcome, residuals)
        intercept = intercept + shift
    center_rows = prepared.order if prepared.centers is None else prepared.center_rows
    center_rows = None if center_rows is None else prepared.of_data(center_rows)
    return fit_result(
        outcome, offset=prepared.offset, intercept=intercept, order=prepared.order, center_rows=center_rows
    )


def fit_result(outcome, **model):
    """What the shell stores: the driver's result, its attempt's plan without the rows or the criteria's solutions.

    ``model``: what the model was fitted with beyond the plan, by name:
    ``offset``, ``intercept``, ``order`` (the shuffle) and ``center_rows`` (the
    rows of the fit's data the centers are; None: the user's).
    """
    return dataclasses.replace(outcome, attempt=outcome.attempt.finished(), **model)
