"""The resolve stage: every choice that needs no tuning (kernel by rule, ``n_centers="auto"``, policy)."""

import dataclasses
from dataclasses import dataclass

from ..buffer import is_out_of_core
from ..kernels import make_kernel
from ..planning.kernel import KernelProblem
from ..planning.kernel_policy import DIRECT_FACTORED, plan_kernel_fit
from ..planning.solver import plan_auto_centers
from .request import KernelFitInput, log_fit


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
    streamed = data.uses_centers and streams_rows(data.X, data.Y.shape[1], runtime)
    policy = plan_kernel_fit(policy_problem(data, runtime, kernel, streamed), runtime.budget, parameters)
    return FitPlan(kernel, bandwidth, data, policy, streamed)


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
