"""The resolve stage: every choice that needs no tuning (kernel by rule, ``n_centers="auto"``, policy)."""

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..kernels import make_kernel
from ..planning.kernel import KernelProblem
from ..planning.kernel_policy import DIRECT_FACTORED, plan_kernel_fit
from ..planning.solver import plan_auto_centers
from ..row_sources import is_out_of_core
from .registry import AUTO, solver_attempt
from .request import KernelFitInput, log_fit

# The fields the tune stage sets (:func:`~skgpu_kernel.fit.tune.tune`), which a tuned plan
# hands on to a fit of the same kernel on a subset of its rows.
TUNING_FIELDS = ("tuned", "bandwidth_selection", "alpha_selection", "by_rule", "n_rows", "scored_rows", "X")


@dataclass(frozen=True)
class FitPlan:
    """Every decision of one kernel fit, made stage by stage: resolved, tuned, then its solver chosen.

    The tune stage's bandwidth and penalty are made once per kernel per fit by
    :func:`~skgpu_kernel.fit.tune.tune_kernel` and reused by every fit of that
    kernel on the same rows or on a subset of them (feature learning's candidates
    on its training rows, the path's later steps, the final refit): never run
    again silently.

    Attributes
    ----------
    kernel : Kernel
        Resolved: with its bandwidth by the scale rule (or the user's); tuned: with
        the chosen bandwidth.
    bandwidth : float or None
        The scale rule's bandwidth (or the user's) on these rows.
    data : KernelFitInput
        The request's rows with ``n_centers="auto"`` counted.
    policy : KernelFitPolicy
        The policy of :func:`~skgpu_kernel.planning.kernel_policy.plan_kernel_fit`;
        tuned: ``alpha`` settled.  Its problem says whether EigenPro 3 reads the
        rows in buffers (:attr:`streamed`).
    tuned : bool
        The tune stage has chosen the bandwidth and the penalty (the fields
        below, :data:`TUNING_FIELDS`).
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
    direct : str or None
        :func:`~skgpu_kernel.planning.kernel_policy.plan_direct_solve`'s decision
        (None: the policy's solver iterates).
    """

    kernel: object
    bandwidth: float | None
    data: KernelFitInput
    policy: object
    tuned: bool = False
    bandwidth_selection: object = None
    alpha_selection: object = None
    by_rule: bool = True
    n_rows: int = 0
    scored_rows: np.ndarray | None = None
    X: object = dataclasses.field(default=None, repr=False, compare=False)
    direct: str | None = None

    @property
    def solver(self):
        """The solver the driver starts with: "direct" for a factored solve, else the tuned policy's."""
        return "direct" if self.direct == DIRECT_FACTORED else self.policy.solver

    @property
    def every_row_a_center(self):
        """The plan runs CG on centers with every training row one (the policy's decision; not a direct solve)."""
        return self.solver == "cg" and self.policy.cg_on_every_row_as_centers

    @property
    def streamed(self):
        """EigenPro 3 reads the rows in buffers (the policy's problem says so)."""
        return self.policy.streamed

    def solves(self, X):
        """Whether the penalty criterion's solution is a model of the rows ``X``.

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
        """This plan with its tuned bandwidth kept on any rows, the rule's included (the learning path's).

        The path fits other features (``X L``) with it: the criterion's solution, a
        model of the rows tuned on, and its spectrum, of the kernel on them, are dropped.
        """
        selection = self.alpha_selection and self.alpha_selection.penalty_alone()
        return dataclasses.replace(self, by_rule=False, alpha_selection=selection, X=None)


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
    if parameters.solver != AUTO:  # a solver named for a layout it has no attempt for is refused before tuning
        solver_attempt(parameters.solver, data.uses_centers)
    streamed = data.uses_centers and streams_rows(data.X, data.Y.shape[1], runtime)
    policy = plan_kernel_fit(policy_problem(data, runtime, kernel, streamed), runtime.budget, parameters)
    return FitPlan(kernel, bandwidth, data, policy)


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
