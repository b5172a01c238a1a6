"""Planners of the EigenPro solvers: the layout before any tensor exists, the plan once capacity and spectrum are known.

A fit is planned in two stages because two facts are measured in between:

1. the *layout* (:func:`plan_eigenpro2_layout`, :func:`plan_eigenpro3_layout`: a
   :class:`~skgpu_kernel.planning.kernel.KernelLayout`, the type every solver's
   layout has), before any tensor exists: the Nystrom subsample, the memory
   model, whether ``X`` is streamed, whether the kernel is cached, which
   projection, and the largest batch the memory allows (the throughput probe's
   upper bound);
2. the *plan* (:func:`plan_eigenpro2`, :func:`plan_eigenpro3`), once the device's
   batch capacity is measured and the preconditioner's spectrum is known: the
   batch, the temporary centers, the blocks and the memory account.

Pure functions of sizes, the memory budget and the user's parameters
(:mod:`skgpu_kernel.planning.kernel` holds the problem, the memory models, the
layout and the kernel cache's rule).
"""

import dataclasses
from dataclasses import dataclass

from ..device import batch_limit
from ._account import MemoryAccount
from .kernel import (
    CACHE_FILL_ROWS,
    MINIMAL_BATCH,
    CentersMemoryPlan,
    KernelLayout,
    TrainingMemoryPlan,
    auto_subsample_size,
    cached_batch_limit,
    operating_batch,
    plan_kernel_cache,
    temporary_centers_for,
)

__all__ = [
    "KernelFitPlan",
    "every_point_account",
    "fill_rows",
    "fit_plan",
    "plan_eigenpro2",
    "plan_eigenpro2_layout",
    "plan_eigenpro3",
    "plan_eigenpro3_layout",
]


def plan_eigenpro2_layout(problem, budget, device, parameters, definite_penalty=None):
    """Stage 1 of an EigenPro 2 fit (every training row a center), and of CG on every point.

    Parameters
    ----------
    problem : KernelProblem
    budget : int
    device : torch.device
    parameters : KernelFitParameters
        ``parameters.cache_dtype`` is the cache's storage (see
        :func:`~skgpu_kernel.planning.kernel.plan_kernel_cache`).
    definite_penalty : float or None, default=None
        The smallest diagonal shift of the system a solver needs positive definite
        (CG on every point: the penalty on the normalised weights); None for
        EigenPro 2 (see :func:`~skgpu_kernel.planning.kernel.plan_kernel_cache`).

    Returns
    -------
    KernelLayout
        On a ``TrainingMemoryPlan``: the subsample, the ``K(X, X)`` cache's
        entries and the memory limit.
    """
    n = problem.n_rows
    subsample_size = (
        auto_subsample_size(n) if parameters.subsample_size == "auto" else min(parameters.subsample_size, n)
    )
    memory = TrainingMemoryPlan(problem, budget, device, subsample_size)
    cache_itemsize = plan_kernel_cache(
        problem, memory, parameters.cache_kernel, parameters.cache_dtype, definite_penalty
    )
    return _with_memory_limit(KernelLayout(problem, memory, subsample_size, cache_itemsize))


def _with_memory_limit(layout):
    """``layout`` with its ``memory_limit``: the largest batch next to its fixed costs and reserved parts."""
    limit = batch_limit(layout.memory.budget, layout.account.total, layout.batch_bytes, layout.problem.n_rows)
    return dataclasses.replace(layout, memory_limit=limit)


def plan_eigenpro3_layout(problem, budget, device, parameters, choices=None):
    """Stage 1 of an EigenPro 3 fit on ``problem.n_centers`` centers.

    ``"auto"`` caches ``K(X, Z)`` when it fits next to the fixed costs and two
    minimal batches, unless only one of the cache and the exact projection fits
    (the projection is preferred: the iterative one makes up to
    ``PROJECTION_MAX_ITERATIONS`` passes over ``K(Z, Z)`` per projection, which
    cost more than the cache saves: Fashion-MNIST, 20000 centers, 56 s per
    projection against 10 s per epoch to evaluate ``K(X, Z)``).  The projection is
    exact when its factor fits next to the cache; the iterative one caches
    ``K(Z, Z)`` when it is in the ``K(X, Z)`` cache already or fits in half of
    what is left.

    Parameters
    ----------
    problem : KernelProblem
    budget : int
    device : torch.device
    parameters : KernelFitParameters
    choices : tuple of bool, optional
        ``(cached, exact, cache_centers)`` decided elsewhere (by rank 0 of a
        distributed fit); the layout then follows them.

    Returns
    -------
    KernelLayout
        On a ``CentersMemoryPlan``: the subsample, the cache, the projection,
        the stream buffers and the memory limit (with one batch of temporary
        centers).

    Raises
    ------
    ValueError
        When the budget is too small for a minimal batch, or a forced cache or
        exact projection does not fit.
    """
    n, p = problem.n_rows, problem.n_centers
    requested = auto_subsample_size(n) if parameters.subsample_size == "auto" else parameters.subsample_size
    subsample_size = min(requested, p)
    buffer_rows = _buffer_rows(problem, budget) if problem.streamed else 0
    memory = CentersMemoryPlan(problem, budget, device, subsample_size, 2 * buffer_rows if problem.streamed else n)
    _check_minimal_batch(problem, memory, subsample_size)
    if choices is None:
        choices = _choose_cache_and_projection(problem, memory, parameters)
    cached, exact, cache_centers = (bool(choice) for choice in choices)
    projection = "exact" if exact else "iterative"
    cache_itemsize = problem.itemsize if cached else 0
    layout = KernelLayout(problem, memory, subsample_size, cache_itemsize, projection, cache_centers, buffer_rows)
    return _with_memory_limit(layout)


def _buffer_rows(problem, budget):
    """Rows of each buffer a streamed ``X`` is read in: a sixteenth of the budget, in rows, targets and weights."""
    return min(
        problem.n_rows,
        max(int(budget // 16 // (problem.itemsize * (problem.n_features + problem.n_outputs + 1))), 1),
    )


def _minimal_batch(memory):
    return min(memory.n_rows, MINIMAL_BATCH)


def _check_minimal_batch(problem, memory, subsample_size):
    minimal = _minimal_batch(memory)
    if memory.free_bytes() < memory.row_bytes * minimal:
        raise ValueError(
            f"{problem.named_budget(memory.budget)} is too small for EigenPro 3 on {memory.n_centers} centers: the "
            f"data, centers, coefficients and the {subsample_size}-point Nystrom eigensystem take "
            f"{memory.fixed_bytes} bytes, and a batch of {minimal} rows needs {memory.row_bytes * minimal} more. "
            "Use a larger memory_budget, fewer centers or a smaller subsample_size." + problem.held_note()
        )


def _choose_cache_and_projection(problem, memory, parameters):
    """``(cached, exact, cache_centers)`` from the budget and ``cache_kernel`` / ``projection``."""
    minimal = _minimal_batch(memory)

    def room(*parts):
        """Bytes left after the fixed costs, ``parts`` and two minimal batches."""
        return memory.free_bytes(*parts) - 2 * memory.row_bytes * minimal

    cache_fits = not problem.streamed and memory.cache_bytes <= room()
    if parameters.cache_kernel is True and not cache_fits:
        raise ValueError(
            f"cache_kernel=True: K(X, centers) for {problem.n_rows} rows and {problem.n_local_centers} centers per "
            f"device needs {memory.cache_bytes} bytes, but {problem.named_budget(memory.budget)} leaves "
            f"{max(memory.free_bytes(), 0)} bytes next to the other fixed costs"
            + (" (X is streamed from its memory-mapped file)" if problem.streamed else "")
            + ". Use cache_kernel='auto' or a larger memory_budget."
            + problem.held_note()
        )
    exact_bytes = memory.exact_projection_bytes
    if parameters.cache_kernel == "auto":
        exact_alone, exact_with_cache = exact_bytes <= room(), exact_bytes <= room(memory.cache_bytes)
        cached = cache_fits and (exact_with_cache or not exact_alone or parameters.projection == "iterative")
    else:
        cached = bool(parameters.cache_kernel)
    cache = memory.cache_bytes if cached else 0
    exact_fits = exact_bytes <= room(cache)
    if parameters.projection == "exact" and not exact_fits:
        raise ValueError(
            f"projection='exact' factorises K(centers, centers): {exact_bytes} bytes for {problem.n_centers} "
            f"centers, which do not fit {problem.named_budget(memory.budget)} next to the other fixed costs "
            f"({memory.fixed_bytes + cache} bytes). Use projection='auto' or 'iterative'." + problem.held_note()
        )
    exact = exact_fits if parameters.projection == "auto" else parameters.projection == "exact"
    # Centers drawn from the training rows are the first p rows of the cached K(X, Z):
    # the iterative projection reads K(Z, Z) there at no extra cost.  Otherwise its
    # own cache must fit in half of what the K(X, Z) cache leaves.
    cache_centers = not exact and (
        (cached and problem.centers_from_data)
        or memory.center_cache_bytes <= (memory.free_bytes(cache) - memory.row_bytes * minimal) // 2
    )
    return cached, exact, cache_centers


@dataclass(frozen=True)
class KernelFitPlan:
    """Every decision of a kernel fit, with the memory it takes on the main device: its layout, sized.

    The layout's decisions (subsample, cache, the memory's batch limit, EigenPro
    3's projection and buffers) are read from it, not copied.

    Attributes
    ----------
    method : {"eigenpro2", "eigenpro3", "cg", "centers_cg"}
        ``"cg"``: CG on every point (:func:`~skgpu_kernel.planning.solver.plan_every_point_cg`);
        ``"centers_cg"``: CG on centers (:func:`~skgpu_kernel.planning.solver.plan_centers_cg`).
    layout : KernelLayout
        What was decided before measuring.
    capacity : int
        Measured batch capacity ``m_G`` (or the given batch size; 0 for CG on centers).
    batch_size : int
    column_block : int
        Columns of a kernel block at ``batch_size``.
    memory : MemoryAccount
    n_temporary : int
        Temporary centers between projections (0 for EigenPro 2).
    row_block : int
        Rows of a kernel block when caching, projecting or validating.
    warnings : tuple of str
        What the caller must tell the user about a decision (a clamped batch):
        planning decides, the fit stage that runs the plan warns.
    operator : OperatorPlan or None
        How every product of the run is computed (grid, cache, shards, streaming),
        from the operator's measured facts (:func:`~skgpu_kernel.planning.run.plan_run`).
    spectrum : Spectrum or None
        EigenPro's preconditioner and the spectrum measured for this layout; None for CG.
    throughputs : dict
        The batch capacity probe's timings (empty where none ran).
    stopping : StoppingPlan or CGStoppingPlan or None
        When the run's loop stops.
    max_components : int
        CG on every point: the most columns of the preconditioner's basis the
        budget leaves room for next to the kernel's items and CG's vectors.
    condition : float or None
        CG on every point: the preconditioned system's estimated condition number,
        from the layout's Nystrom subsample.
    declined : str or None
        Why the run should not run as planned (CG on every point beyond its
        condition bound: the attempt asks the driver for EigenPro 2), in words;
        None: it runs.
    """

    method: str
    layout: object
    capacity: int
    batch_size: int
    column_block: int
    memory: MemoryAccount
    n_temporary: int = 0
    row_block: int = 0
    warnings: tuple = ()
    operator: object = None
    spectrum: object = None
    throughputs: dict = dataclasses.field(default_factory=dict)
    stopping: object = None
    max_components: int = 0
    condition: float | None = None
    declined: str | None = None

    @property
    def subsample_size(self):
        return self.layout.subsample_size

    @property
    def memory_limit(self):
        """Largest batch the memory allows (None: the solver has no batch)."""
        return self.layout.memory_limit

    @property
    def projection(self):
        """EigenPro 3's projection, ``"exact"`` or ``"iterative"`` (None: nothing projected)."""
        return self.layout.projection

    @property
    def cached(self):
        return self.layout.cached

    @property
    def cache_itemsize(self):
        """Bytes per entry of the kernel cache (0 when not cached)."""
        return self.layout.cache_itemsize

    def describe(self):
        """One line for ``verbose``."""
        if self.method == "centers_cg":
            return self.memory.describe()
        cached = f"cached ({8 * self.cache_itemsize}-bit)"
        if self.method == "cg":
            read = cached if self.cached else f"computed {self.batch_size} rows at a time"
            return f"CG on every point, kernel {read}, {self.memory.describe()}"
        if self.method == "eigenpro2":
            layout = "EigenPro 2, kernel " + (cached if self.cached else "computed per batch")
        else:
            layout = (
                f"EigenPro 3, {self.projection} projection, kernel "
                f"{'cached' if self.cached else 'computed per batch'}, {self.n_temporary} temporary centers"
            )
        return (
            f"{layout}, batch capacity m_G={self.capacity} (memory limit {self.memory_limit}), batch size "
            f"{self.batch_size}, {self.memory.describe()}"
        )


def _requested_batch(parameters, capacity, critical_batch_preconditioned, problem, memory_limit):
    """``(batch, warnings)``: ``operating_batch`` when auto, else the user's (clamped to the memory, with a warning)."""
    if parameters.batch_size == "auto":
        return min(operating_batch(capacity, critical_batch_preconditioned, problem.n_rows), memory_limit), ()
    if capacity > memory_limit:
        return memory_limit, (
            f"batch_size={capacity} does not fit memory_budget next to the fixed costs; using {memory_limit}.",
        )
    return capacity, ()


def fit_plan(method, sized, **decisions):
    """The :class:`KernelFitPlan` of ``sized = (layout, capacity, batch_size, account)`` and a path's own decisions."""
    layout, capacity, batch_size, account = sized
    return KernelFitPlan(
        method=method,
        layout=layout,
        capacity=capacity,
        batch_size=batch_size,
        column_block=layout.column_block(batch_size),
        memory=account,
        **decisions,
    )


def plan_eigenpro2(layout, capacity, critical_batch_preconditioned, parameters):
    """Stage 2 of an EigenPro 2 fit: the batch and the memory account.

    Parameters
    ----------
    layout : KernelLayout
        :func:`plan_eigenpro2_layout`'s.
    capacity : int
        Measured batch capacity, or ``min(batch_size, n)`` when given.
    critical_batch_preconditioned : float
    parameters : KernelFitParameters

    Returns
    -------
    KernelFitPlan
    """
    problem = layout.problem
    batch_size, warnings = _requested_batch(
        parameters, capacity, critical_batch_preconditioned, problem, layout.memory_limit
    )
    if layout.cached and parameters.batch_size == "auto":
        batch_size = min(batch_size, cached_batch_limit(problem.n_rows))
    sized = (layout, capacity, batch_size, every_point_account(layout, batch_size))
    return fit_plan("eigenpro2", sized, row_block=fill_rows(layout), warnings=warnings)


def every_point_account(layout, batch_size):
    """The memory of ``K(X, X)`` read ``batch_size`` rows at a time: EigenPro 2's layout, its cache and blocks."""
    account = layout.account
    if not layout.cached:
        return account.with_item("batch", layout.batch_bytes(batch_size))
    working = max(layout.memory.fill_bytes(), layout.batch_bytes(batch_size))
    return account.with_item("batch (or the blocks filling the cache)", working)


def fill_rows(layout):
    """Rows of a block filling the kernel cache (0: nothing cached)."""
    return CACHE_FILL_ROWS if layout.cached else 0


def plan_eigenpro3(layout, capacity, critical_batch_preconditioned, parameters):
    """Stage 2 of an EigenPro 3 fit: the batch, the temporary centers, the blocks and the memory account.

    Temporary centers trade per-step kernel work against fewer projections
    (:func:`~skgpu_kernel.planning.kernel.temporary_centers_for`); their count is halved until they fit in
    half the free memory and next to the batch, and is at least one batch.

    Parameters
    ----------
    layout : KernelLayout
        :func:`plan_eigenpro3_layout`'s.
    capacity : int
    critical_batch_preconditioned : float
    parameters : KernelFitParameters

    Returns
    -------
    KernelFitPlan
    """
    problem, memory = layout.problem, layout.memory
    batch_size, warnings = _requested_batch(
        parameters, capacity, critical_batch_preconditioned, problem, layout.memory_limit
    )
    temporary = temporary_centers_for(problem, layout.projection, layout.cache_centers)
    n_temporary = max(min(temporary, problem.n_rows), batch_size)
    room = min(layout.free // 2, layout.free - batch_size * memory.row_bytes)
    while n_temporary > batch_size and memory.temporary_bytes(n_temporary, batch_size) > room:
        n_temporary //= 2
    n_temporary = max(n_temporary, batch_size)
    account = layout.account.with_item("temporary centers", memory.temporary_bytes(n_temporary, batch_size))
    account = account.with_item("batch", batch_size * memory.row_bytes)
    return fit_plan(
        "eigenpro3",
        (layout, capacity, batch_size, account),
        n_temporary=n_temporary,
        row_block=max(min(batch_size, 4096), 1),
        warnings=warnings,
    )
