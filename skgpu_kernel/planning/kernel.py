"""The sizes of a kernel fit and what its memory holds: the problem, the memory models, the kernel cache.

:class:`KernelProblem` is what every planner of a kernel fit reads (rows,
features, outputs, centers, shards, the kernel's own blocks); the memory models
(:class:`TrainingMemoryPlan`, :class:`CentersMemoryPlan`) are linear in the batch,
as in Falkon's helpers; :func:`plan_kernel_cache` decides whether ``K(X, X)`` or
``K(X, Z)`` is stored and in which dtype; :class:`KernelLayout` is how a solver's
run holds its operands, on one of those memory models (or CG on centers',
:class:`~skgpu_kernel.planning.solver.CentersCGMemoryPlan`).  The EigenPro solvers'
layouts and plans build on them (:mod:`skgpu_kernel.planning.eigenpro`), and so do
CG's and the choice of the solver (:mod:`skgpu_kernel.planning.solver`).  Everything here is a pure
function of sizes, the memory budget and the user's parameters: nothing allocates
a tensor or reads a clock.
"""

import math
from dataclasses import dataclass

from ..device import batch_limit, column_block_size, exact_gram_row_block, rows_within_budget
from ..operator_facts import CPU_READ_ENTRIES, CPU_WIDE_COLUMNS, padded_features, shard_bounds
from ._account import MemoryAccount
from .parameters import planned_for_auto

__all__ = [
    "CRITERION_MAX_ROWS",
    "CRITICAL_BATCH_MARGIN",
    "HALF_ROUNDING",
    "HALF_ROUNDING_SHARE",
    "SHIFTED_MAX_COMPONENTS",
    "CentersMemoryPlan",
    "KernelLayout",
    "KernelProblem",
    "TrainingMemoryPlan",
    "auto_subsample_size",
    "cached_batch_limit",
    "half_cache_harmless",
    "operating_batch",
    "plan_criterion_rows",
    "plan_kernel_cache",
    "shard_bounds",
    "temporary_centers_for",
]

# Relative jitter on K(centers, centers) for the exact projection (at least ten rounding
# errors of the training dtype, below which the solve would amplify rounding noise).
PROJECTION_JITTER = 1e-10

# The inexact projection iterates until the residual at the centers is this fraction
# of the projected values (or for at most this many full-batch iterations); what is
# left joins the next projection.
PROJECTION_TOL = 1e-2
PROJECTION_MAX_ITERATIONS = 100

# Training rows on which EigenPro 3 evaluates the preconditioned beta.
BETA_PROBE_ROWS = 8192

# At most this many temporary centers per center.  With the inexact projection more
# than about p / 2 temporary centers made training unstable in our tests (the
# unresolved part of a projection grows with the function projected).
_TEMPORARY_PER_CENTER = {"exact": 1.0, "iterative": 0.5}

# Flops a device does in the time it reads one byte of its memory: 206 GFLOP/s of
# torch.mm against 15 GB/s read by two triangular solves with a 10000 x 10000 float64
# factor on the 2-core CPU we develop on; about 14 from an H200's published float32
# and memory-bandwidth figures.
_FLOPS_PER_BYTE = 16

# EigenPro 3 keeps room for two batches of this many rows next to its fixed costs.
MINIMAL_BATCH = 64


# Rows the bandwidth search of bandwidth="auto" scores, every one of them a feature,
# so that its criterion is the exact leave-one-out error of the kernel machine on
# those rows.  A Nystrom model on a subsample of many more rows favours wide
# bandwidths, whose functions its features can represent: on LetterRecognition
# (10000 rows, 2000 features) it ranked 1.41 worst of five bandwidths and 2.83 best,
# where the kernel machine on all 16000 rows had test error 0.0255 at 1.41 and 0.031
# at 2.83.  Each candidate costs one eigendecomposition of this size.
BANDWIDTH_SEARCH_ROWS = 1500


def plan_bandwidth_search_rows(bandwidth_search_size):
    """Rows the bandwidth search scores: ``BANDWIDTH_SEARCH_ROWS`` for ``"auto"``, else the estimator's value.

    Parameters
    ----------
    bandwidth_search_size : int or str
        The estimator's ``bandwidth_search_size``.

    Returns
    -------
    int
        At most this many rows are scored (all of them where the fit has fewer).

    Examples
    --------
    >>> plan_bandwidth_search_rows("auto"), plan_bandwidth_search_rows(4000)
    (1500, 4000)
    """
    return planned_for_auto(bandwidth_search_size, BANDWIDTH_SEARCH_ROWS)


# Rows the penalty's leave-one-out criterion scores at most (each row a pass over the
# subsample's features: the cost grows as rows x s^2), twice the Nystrom subsample.
# Beyond, the alpha chosen on them is kept as it is (fit.tune.LooRows).  Paired over the
# seeded splits of the 10 benchmark records with more than 8000 training rows
# (benchmarks/RESULTS.md, issue 65's probe and issue 80), 8000 rows kept every error
# within 0.06% of scoring up to 100000; 4000 then kept every one within 0.03% of
# 8000 (geometric mean of the ratios 1.0000 over the 11 records above 4000 rows) and
# took 0.5-1.8 s off each of their fits (HI's criterion: 4.0 s -> 2.7 s).
CRITERION_MAX_ROWS = 4_000


def plan_criterion_rows(n_rows):
    """Rows the penalty's leave-one-out criterion scores: every row up to ``CRITERION_MAX_ROWS``.

    Parameters
    ----------
    n_rows : int
        The fit's training rows.

    Returns
    -------
    int

    Examples
    --------
    >>> plan_criterion_rows(3000), plan_criterion_rows(60000)
    (3000, 4000)
    """
    return min(int(n_rows), CRITERION_MAX_ROWS)


def auto_subsample_size(n_samples):
    """Nystrom subsample of ``subsample_size="auto"``: 2000 points up to 100k samples, 5000 beyond."""
    return min(n_samples, 2000 if n_samples <= 100_000 else 5000)


# With the kernel cached, an epoch costs one read of the cache whatever the batch, so
# the capacity is the memory limit (which also sets how many directions the
# preconditioner flattens) and the automatic batch is kept small enough for this many
# updates per epoch: at equal epochs, larger batches fitted worse (DNA, 2293 rows, early
# stopped: test error 0.0549 at batch 955 = m*(P) / 2, 0.0502 at 64 and 128;
# LetterRecognition, 14400 rows: 0.0325 and a divergence rollback at 9194, 0.030 to
# 0.034 from 512 to 4096), while an update's fixed cost, about 1.6 ms on the 2-core
# CPU, keeps 32 updates per epoch a small share of the epoch's read.
CACHED_UPDATES_PER_EPOCH = 32


def cached_batch_limit(n_rows):
    """The largest automatic batch of steps that read their kernel rows (``CACHED_UPDATES_PER_EPOCH`` per epoch)."""
    return max(math.ceil(n_rows / CACHED_UPDATES_PER_EPOCH), 1)


# At the critical batch m*(P) the linear step m / beta_P puts the top preconditioned
# direction at the edge of stability (the batch operator's top eigenvalue is about
# beta_P + (m - 1) lambda_1' = 2 beta_P), and the Nystrom estimate of lambda_1' is
# optimistic for points outside the subsample.  Batches are kept this factor below
# m*(P): the top direction then contracts by at least a third per step.
CRITICAL_BATCH_MARGIN = 2.0

# Most Nystrom directions the subsample-preconditioned CG flattens: each costs O(n)
# memory and work per iteration and O(n s) once to extend to every row.
SHIFTED_MAX_COMPONENTS = 1000


def preconditioner_target(capacity):
    """The batch EigenPro's preconditioned critical batch must reach: ``CRITICAL_BATCH_MARGIN`` times ``capacity``.

    Batches of the device's ``capacity`` then run at the linear step ``m / beta_P``
    with the margin (:func:`operating_batch` keeps them below ``m*(P)`` by it);
    :func:`~skgpu_kernel.preconditioner.plan_preconditioner` flattens directions until then.
    """
    return CRITICAL_BATCH_MARGIN * capacity


def operating_batch(capacity, critical_batch_preconditioned, n_samples):
    """The device capacity, kept ``CRITICAL_BATCH_MARGIN`` below the preconditioned critical batch."""
    if not math.isfinite(critical_batch_preconditioned):  # a flat spectrum bounds no batch
        return max(min(capacity, n_samples), 1)
    stable = max(int(critical_batch_preconditioned / CRITICAL_BATCH_MARGIN), 1)
    return max(min(capacity, stable, n_samples), 1)


@dataclass(frozen=True)
class KernelProblem:
    """The sizes of a kernel fit, as the planners see them.

    Parameters
    ----------
    n_rows, n_features, n_outputs : int
        Training rows (after the validation split), features and target columns.
    itemsize : int
        Bytes per value of the training dtype.
    extra_blocks : int
        The kernel's temporary blocks (``Kernel.extra_blocks``).
    n_centers : int or None
        ``p`` for EigenPro 3; None when every training row is a center.
    n_shards : int
        Devices (or ranks) the centers are split over.
    centers_from_data : bool
        The centers are the first ``p`` shuffled training rows (not given by the user).
    streamed : bool
        ``X`` is read from its memory-mapped file in buffers.
    n_validation : int
        Held-out rows scored after every epoch (EigenPro 2 caches their kernel rows
        with the training rows').
    unit_bounded_kernel : bool
        The kernel's values lie in [-1, 1] (``Kernel.unit_bounded``).
    grid_codes : bool
        The kernel blocks come from exact int8 distances on a grid
        (:func:`skgpu_kernel.planning.operator.plan_operator`): the rows (EigenPro 2)
        or the centers (EigenPro 3) are also kept as int8 codes, one byte per feature
        padded to a multiple of 8.
    held_bytes : int
        Bytes of ``memory_budget`` that the fit's rows held on the device already
        take (off the budget the planners are given); messages name the budget as
        the user set it.
    weighted : bool
        The sample weights (``class_weight`` included) are not all equal.
    """

    n_rows: int
    n_features: int
    n_outputs: int
    itemsize: int
    extra_blocks: int = 0
    n_centers: int | None = None
    n_shards: int = 1
    centers_from_data: bool = True
    streamed: bool = False
    n_validation: int = 0
    unit_bounded_kernel: bool = False
    grid_codes: bool = False
    held_bytes: int = 0
    weighted: bool = False

    def named_budget(self, budget):
        """``memory_budget`` as the user set it, in a message about the ``budget`` a planner was given."""
        return f"memory_budget={budget + self.held_bytes} bytes"

    def held_note(self):
        """The sentence a budget message ends with where the fit's rows held on the device took part of it."""
        if not self.held_bytes:
            return ""
        return f" The training rows the fit holds on the device take {self.held_bytes} bytes of it."

    @property
    def entry_bytes(self):
        """Bytes of one kernel entry with the kernel's temporary copies."""
        return self.itemsize * (1 + self.extra_blocks)

    @property
    def n_local_centers(self):
        """Centers of the largest shard."""
        return max(stop - start for start, stop in shard_bounds(self.n_centers, self.n_shards))


class TrainingMemoryPlan:
    """Linear memory model of EigenPro 2 (a center at every training row), in the spirit of Falkon's helpers.

    Fixed: the training rows and their prepared copy, targets, coefficients and their
    snapshots (``copies_of_outputs`` arrays of n x l), and the s x s eigenvectors.
    Per batch row: the row and its augmented copy, residual-sized buffers, one row of
    ``K(X_B, X_S)`` and one row of the current kernel block, each kernel entry
    counted ``1 + extra_blocks`` times.

    Parameters
    ----------
    problem : KernelProblem
    budget : int
        Bytes available.
    device : torch.device
    subsample_size : int
    copies_of_outputs : int, default=5
    """

    def __init__(self, problem, budget, device, subsample_size, copies_of_outputs=5):
        self.device, self.budget, self.n_rows = device, budget, problem.n_rows
        itemsize, n_outputs = problem.itemsize, problem.n_outputs
        self.entry_bytes = problem.entry_bytes
        self.items = (
            ("training data", itemsize * problem.n_rows * (2 * problem.n_features + 2)),
            ("coefficients", itemsize * problem.n_rows * copies_of_outputs * n_outputs),
            ("eigensystem", itemsize * subsample_size**2),
        )
        if problem.grid_codes:
            codes = (problem.n_rows + problem.n_validation) * padded_features(problem.n_features)
            self.items = (*self.items, ("grid codes", codes))
        self.fixed_bytes = sum(count for _, count in self.items)
        self.row_bytes = itemsize * (2 * (problem.n_features + 2) + 4 * n_outputs) + subsample_size * self.entry_bytes

        self.n_cached_rows = problem.n_rows + problem.n_validation
        self.itemsize, self.n_outputs, self.subsample_size = itemsize, n_outputs, subsample_size

    def column_block(self, batch_size, reserved=0):
        """Columns of a kernel block for ``batch_size`` rows (half of what the fixed costs leave, at most).

        ``reserved`` (the bytes a layout keeps beside the fixed costs: here the
        kernel cache alone) takes none of it: EigenPro 2's kernel blocks are
        evaluated only where no cache is held, in a fit computing them per batch,
        or for the spectrum, measured before the cache is filled.
        """
        free = max(self.budget - self.fixed_bytes, 0) // 2
        return column_block_size(self.device, batch_size, self.n_rows, self.entry_bytes, free)

    def batch_bytes(self, batch_size, cached=False):
        """A batch's rows, buffers and kernel block; read from the cache (``cached``): :meth:`cached_batch_bytes`."""
        if cached:
            return self.cached_batch_bytes(batch_size)
        return batch_size * (self.row_bytes + self.column_block(batch_size) * self.entry_bytes)

    def max_batch(self):
        """Largest batch whose blocks fit next to the fixed costs (at least 1)."""
        return batch_limit(self.budget, self.fixed_bytes, self.batch_bytes, self.n_rows)

    def cache_bytes(self, storage_itemsize):
        """``K(X, X)`` and the validation rows' ``K(X_val, X)`` at ``storage_itemsize`` bytes per entry."""
        return storage_itemsize * self.n_cached_rows * self.n_rows

    def cache_item(self, storage_itemsize):
        """The cache of :meth:`cache_bytes` as a named item of a memory account."""
        return f"K(X, X) cache ({storage_itemsize}-byte entries)", self.cache_bytes(storage_itemsize)

    def projection_items(self, projection, center_cache):
        """Nothing: with a center at every training row no temporary centers are projected."""
        return ()

    def cached_batch_bytes(self, batch_size):
        """A batch read from the cache: buffers, its ``K(X_B, X_S)`` and the rows gathered at once.

        A read takes at most ``CPU_READ_ENTRIES`` entries (in the storage and the
        training dtype), against coefficients widened to ``CPU_WIDE_COLUMNS``.
        """
        per_row = self.itemsize * (4 * self.n_outputs + self.subsample_size + CPU_WIDE_COLUMNS)
        return batch_size * per_row + 2 * self.itemsize * min(batch_size * self.n_rows, CPU_READ_ENTRIES)

    def fill_bytes(self):
        """The kernel blocks that fill the cache (and the widest read after it)."""
        rows, columns = min(CACHE_FILL_ROWS, self.n_cached_rows), min(CACHE_FILL_COLUMNS, self.n_rows)
        return rows * columns * self.entry_bytes


class CentersMemoryPlan:
    """Linear memory model of EigenPro 3 on one device: ``n`` rows, ``p`` centers, ``p_local`` of them here.

    Fixed: the training rows, targets and weights when they are resident (not when
    they are streamed: then two buffers of ``buffer_rows``); the raw centers and
    the prepared local shard; ``copies_of_outputs`` coefficient-sized arrays of
    p x l; the prepared subsample and its s x s float64 eigenvectors.  Optional
    fixed parts, each decided by the planner: the cached ``K(X, Z_local)``
    (:attr:`cache_bytes`), the float64 Cholesky factor of the exact projection and
    the kernel blocks that fill it (:attr:`exact_projection_bytes`), the cached
    ``K(Z, Z_local)`` of the iterative projection (:attr:`center_cache_bytes`) and
    ``t`` temporary centers (:meth:`temporary_bytes`).  Per batch row: the row,
    residual-sized buffers and one row of ``K(X_B, Z_local)``, each kernel entry
    counted ``1 + extra_blocks`` times.

    Parameters
    ----------
    problem : KernelProblem
    budget : int
        Bytes available.
    device : torch.device
    subsample_size : int
    resident_rows : int
        Training rows held on the device (``n_rows``, or two buffers when streamed).
    copies_of_outputs : int, default=6
    """

    def __init__(self, problem, budget, device, subsample_size, resident_rows, copies_of_outputs=6):
        self.device, self.budget, self.n_rows, self.n_centers = device, budget, problem.n_rows, problem.n_centers
        self.n_local_centers = problem.n_local_centers
        self.n_features, self.n_outputs = problem.n_features, problem.n_outputs
        itemsize, p, p_local = problem.itemsize, problem.n_centers, problem.n_local_centers
        d, outputs = problem.n_features, problem.n_outputs
        self.itemsize, self.entry_bytes = itemsize, problem.entry_bytes
        self.items = (
            ("stream buffers" if problem.streamed else "training data", itemsize * resident_rows * (d + outputs + 1)),
            ("centers and coefficients", itemsize * (p * (d + copies_of_outputs * outputs) + p_local * d)),
            ("eigensystem", itemsize * subsample_size * d + 8 * subsample_size**2),
        )
        if problem.grid_codes:
            self.items = (*self.items, ("grid codes", p * padded_features(d)))
        self.fixed_bytes = sum(count for _, count in self.items)
        _, self.cache_bytes = self.cache_item(itemsize)  # in the training dtype, EigenPro 3's only storage
        self.exact_projection_bytes = 8 * p * (p + exact_gram_row_block(p) * (1 + problem.extra_blocks))
        self.center_cache_bytes = itemsize * p * p_local
        self.row_bytes = itemsize * (d + 4 * outputs) + p_local * self.entry_bytes

    def temporary_bytes(self, n_temporary, batch_size):
        """Temporary centers with their coefficients, and their block for one batch."""
        return self.itemsize * n_temporary * (self.n_features + 1 + self.n_outputs) + (
            self.entry_bytes * batch_size * n_temporary
        )

    def cache_item(self, itemsize):
        """The ``K(X, Z_local)`` cache at ``itemsize`` bytes per entry, as a named item of a memory account."""
        return "K(X, Z) cache", itemsize * self.n_rows * self.n_local_centers

    def projection_items(self, projection, center_cache):
        """The named parts a projection keeps: the exact one's factor, or the iterative one's own ``K(Z, Z)`` cache.

        ``center_cache``: the iterative projection caches ``K(Z, Z_local)`` apart
        from the ``K(X, Z)`` cache (where it is not the first ``p`` rows of it).
        """
        if projection == "exact":
            return (("exact projection", self.exact_projection_bytes),)
        if center_cache:
            return (("K(Z, Z) cache", self.center_cache_bytes),)
        return ()

    def column_block(self, batch_size, reserved=0):
        """Columns of a kernel block for ``batch_size`` rows: half of what the fixed costs and ``reserved`` leave."""
        free = max(self.free_bytes(reserved), 0)
        return column_block_size(self.device, batch_size, self.n_local_centers, self.entry_bytes, free // 2)

    def batch_bytes(self, batch_size, cached=False):
        """A batch with one batch of temporary centers, the fewest a step keeps.

        Its rows of ``K(X_B, Z_local)`` take the same memory gathered from the
        cache or evaluated: ``cached`` changes nothing.
        """
        return batch_size * self.row_bytes + self.temporary_bytes(batch_size, batch_size)

    def free_bytes(self, *extras):
        """Budget left after the fixed costs and the given optional parts."""
        return self.budget - self.fixed_bytes - sum(extras)

    def max_batch(self, *extras):
        """Largest batch that fits next to the fixed costs and ``extras`` (at least 1)."""
        return min(rows_within_budget(self.budget, self.fixed_bytes + sum(extras), self.row_bytes), self.n_rows)


@dataclass(frozen=True)
class KernelLayout:
    """How a kernel solver's run holds its operands on the device, decided before any tensor exists.

    One type for every solver on a kernel operator: EigenPro 2 and CG with a center
    at every training row (:func:`~skgpu_kernel.planning.eigenpro.plan_eigenpro2_layout`),
    EigenPro 3 (:func:`~skgpu_kernel.planning.eigenpro.plan_eigenpro3_layout`) and CG
    on centers (:func:`~skgpu_kernel.planning.solver.plan_centers_cg`).  Where the
    solvers' memory differs, its model says how (``memory``); every property and
    method here reads it, so each means the same for every layout.

    Parameters
    ----------
    problem : KernelProblem
        The sizes the layout is planned for.
    memory : TrainingMemoryPlan or CentersMemoryPlan or CentersCGMemoryPlan
        The solver's memory model: its fixed costs (``items``), its kernel cache
        (``cache_item``), a projection's parts (``projection_items``), a batch's
        bytes and its kernel blocks' columns.  ``TrainingMemoryPlan`` with a
        center at every training row (EigenPro 2, CG on every point),
        ``CentersMemoryPlan`` for EigenPro 3,
        :class:`~skgpu_kernel.planning.solver.CentersCGMemoryPlan` for CG on centers.
    subsample_size : int or None, default=None
        Points of the Nystrom subsample EigenPro's preconditioner (or CG on every
        point's condition estimate) is built on; None: no subsample (CG on
        centers, whose preconditioner factorises ``K(Z, Z)``).
    cache_itemsize : int, default=0
        Bytes per entry of the stored kernel: with a center at every row,
        ``K(X, X)`` and the held-out rows' ``K(X_val, X)`` in the training dtype
        or 2 for float16 storage; on centers, ``K(X, Z)`` in the training dtype.
        0: every product evaluates its kernel blocks.
    projection : {"exact", "iterative"} or None, default=None
        How EigenPro 3 projects its temporary centers on the centers: through the
        factor of ``K(Z, Z)``, or by iterating on it.  None: the solver keeps no
        temporary centers (EigenPro 2, CG).
    cache_centers : bool, default=False
        The iterative projection reads a cached ``K(Z, Z)`` (at no extra memory
        where it is the first ``p`` rows of the ``K(X, Z)`` cache:
        :attr:`centers_in_cache`); False wherever nothing is projected iteratively.
    buffer_rows : int, default=0
        Rows of each of the two buffers EigenPro 3 streams a memory-mapped ``X``
        in; 0 where the rows are held on the device.
    memory_limit : int or None, default=None
        The largest batch that fits next to the fixed costs and the
        :attr:`reserved` parts (the throughput probe's upper bound); None for a
        solver without a batch (CG on centers reads ``K(X, Z)`` in row blocks of
        a fixed size, one of its model's fixed costs).
    """

    problem: KernelProblem
    memory: object
    subsample_size: int | None = None
    cache_itemsize: int = 0
    projection: str | None = None
    cache_centers: bool = False
    buffer_rows: int = 0
    memory_limit: int | None = None

    @property
    def cached(self):
        """The kernel is stored once and read by every product."""
        return self.cache_itemsize > 0

    @property
    def cache_bytes(self):
        """Bytes of the stored kernel (0 where it is evaluated)."""
        return self.memory.cache_item(self.cache_itemsize)[1] if self.cached else 0

    @property
    def centers_in_cache(self):
        """``K(Z, Z)`` is part of the kernel cache: the centers are its first rows (every row, with no centers)."""
        return self.cached and self.problem.centers_from_data

    @property
    def choices(self):
        """``(cached, exact projection, cache_centers)``: the decisions every rank of a distributed fit must share."""
        return (self.cached, self.projection == "exact", self.cache_centers)

    @property
    def reserved(self):
        """Named optional parts this layout keeps on the device next to the fixed costs: its cache, a projection's."""
        cache = (self.memory.cache_item(self.cache_itemsize),) if self.cached else ()
        center_cache = self.cache_centers and not self.centers_in_cache
        return (*cache, *self.memory.projection_items(self.projection, center_cache))

    @property
    def account(self):
        """The :class:`~skgpu_kernel.planning.MemoryAccount` of the fixed costs and the :attr:`reserved` parts."""
        return MemoryAccount(self.memory.budget, (*self.memory.items, *self.reserved))

    @property
    def free(self):
        """The budget left after the fixed costs and the :attr:`reserved` parts (at least 0)."""
        account = self.account
        return max(account.budget - account.total, 0)

    def column_block(self, batch_size):
        """Columns of a kernel block for ``batch_size`` rows, by the memory model's rule."""
        return self.memory.column_block(batch_size, sum(count for _, count in self.reserved))

    def batch_bytes(self, batch_size):
        """What a batch of ``batch_size`` rows adds to the fixed costs and the reserved parts."""
        return self.memory.batch_bytes(batch_size, self.cached)


def temporary_centers_for(problem, projection, centers_cached):
    """Temporary centers that minimise EigenPro 3's work per training row.

    Every row of a batch is evaluated against the temporary centers, about ``t / 2``
    of them on average, at ``2 (d + l)`` flops each; a projection, made once every
    ``t`` rows, costs ``C`` flops (memory reads counted at ``_FLOPS_PER_BYTE``):
    two triangular solves with the ``p x p`` float64 factor when exact, or
    ``PROJECTION_MAX_ITERATIONS`` (which the iteration usually reaches) full
    passes over ``K(Z, Z)``, read from its cache or evaluated, when inexact.
    ``t / 2 * 2 (d + l) + C / t`` is smallest at ``t = sqrt(C / (d + l))``.  The
    result is clipped to ``_TEMPORARY_PER_CENTER`` times ``p``; the planner clips
    it to its memory and to at least one batch.
    """
    p, d, outputs = problem.n_centers, problem.n_features, problem.n_outputs
    products = 4.0 * p**2 * outputs
    if projection == "exact":
        projection_flops = max(products, _FLOPS_PER_BYTE * 2 * 8 * p**2)
    else:
        if centers_cached:
            per_iteration = max(products, _FLOPS_PER_BYTE * 2 * problem.itemsize * p**2)
        else:
            per_iteration = products + 2.0 * p**2 * d
        projection_flops = PROJECTION_MAX_ITERATIONS * per_iteration
    best = math.sqrt(projection_flops / (d + outputs))
    return int(min(best, _TEMPORARY_PER_CENTER[projection] * p))


# EigenPro 2's cache is filled by kernel blocks of this many rows and columns (on the
# 2-core CPU, Gaussian blocks of 2048 Fashion-MNIST rows ran at 178 GFLOP/s with 2048
# columns, 159 with 4096 and 150 with 8192; whole rows filled a 20000-row cache in
# 3.5 s against 2.4-2.6 s).
CACHE_FILL_ROWS = 2048


CACHE_FILL_COLUMNS = 2048


def plan_kernel_cache(problem, memory, cache_kernel, cache_dtype="auto", definite_penalty=None):
    """Bytes per entry of EigenPro 2's ``K(X, X)`` cache, or 0 to compute kernel blocks per batch.

    The cache is kept when it fits the budget next to the fixed costs, the blocks
    that fill it and a batch of ``MINIMAL_BATCH`` rows.  ``cache_dtype="auto"``
    stores it in the training dtype, or else, for a float32 fit of a kernel with
    values in [-1, 1], in float16 where the solver tolerates its rounding
    (:func:`half_cache_harmless`); a named dtype stores it in that dtype only.
    ``cache_kernel=True`` raises when none fits; ``False`` never caches.

    Parameters
    ----------
    problem : KernelProblem
    memory : TrainingMemoryPlan
    cache_kernel : bool or "auto"
    cache_dtype : {"auto", "float16", "float32", "float64"}, default="auto"
    definite_penalty : float or None, default=None
        The smallest diagonal shift of the system the solver needs positive
        definite (CG on every point); None for EigenPro 2, which needs none.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        A named storage wider than the training dtype, or float16 for a kernel not
        bounded by 1 (its values could overflow).
    """
    if cache_kernel is False:
        return 0
    candidates = _cache_itemsizes(problem, cache_dtype)
    if cache_dtype == "auto" and not half_cache_harmless(problem.n_rows, definite_penalty):
        candidates = [itemsize for itemsize in candidates if itemsize != 2]
    minimal = min(problem.n_rows, MINIMAL_BATCH)
    working = max(memory.fill_bytes(), memory.cached_batch_bytes(minimal))
    for itemsize in candidates:
        if memory.fixed_bytes + memory.cache_bytes(itemsize) + working <= memory.budget:
            return itemsize
    if cache_kernel is True:
        raise ValueError(
            f"cache_kernel=True: K(X, X) for {problem.n_rows} training rows"
            + (f" and {problem.n_validation} validation rows" if problem.n_validation else "")
            + f" needs {memory.cache_bytes(itemsize)} bytes, but {problem.named_budget(memory.budget)} leaves "
            f"{max(memory.budget - memory.fixed_bytes - working, 0)} bytes next to the other fixed costs. "
            "Use cache_kernel='auto' or a larger memory_budget." + problem.held_note()
        )
    return 0


# float16's unit roundoff: a kernel value in [-1, 1] stored in 16 bits is off by at most
# this times its size.
HALF_ROUNDING = 2.0**-11

# The share of the penalty that the 16-bit cache's rounding may take (see
# half_cache_harmless): CG's stated tolerance below float64 (CG_ROUNDING_TOL).
HALF_ROUNDING_SHARE = 1e-2


def half_cache_harmless(n_rows, definite_penalty):
    """Whether a 16-bit ``K(X, X)`` cache is provably harmless to the solver that reads it.

    The stored matrix is ``K + E`` with ``|E_ij| <= u |K_ij| <= u`` (``u`` =
    ``HALF_ROUNDING``, kernels with values in [-1, 1]), so ``||E||_2 <= n u``
    (Gershgorin).  A solver that needs ``K + alpha W^-1`` positive definite (CG on
    every point, ``W^-1 >= 1`` on normalised weights) keeps it so, with the
    solution moved by at most ``n u / (alpha - n u)`` relatively, when ``n u <=
    HALF_ROUNDING_SHARE alpha``: a 1% perturbation, CG's own tolerance below
    float64.  On 47030 rows at ``alpha`` 0.026 the bound is 23 against 2.6e-4, and
    CG diverged there (issue 62).  EigenPro 2 (``definite_penalty`` None) needs no
    definiteness: its early-stopped gradient steps see the rounding as a
    perturbation of each step's gradient by at most ``u`` times the kernel's scale,
    each epoch is judged by the divergence rule (rolled back, the step halved and
    recorded), held-out rows pick the epoch and the last check compares the model
    with the trivial one; the 16-bit cache stays allowed there.

    Parameters
    ----------
    n_rows : int
    definite_penalty : float or None

    Returns
    -------
    bool

    Examples
    --------
    >>> half_cache_harmless(2048, None), half_cache_harmless(2048, 100.0), half_cache_harmless(2048, 1.0)
    (True, True, False)
    """
    if definite_penalty is None:
        return True
    return n_rows * HALF_ROUNDING <= HALF_ROUNDING_SHARE * definite_penalty


# The kernel cache's storage by bytes per entry (a plan's cache_itemsize), and back.
CACHE_DTYPE_NAMES = {2: "float16", 4: "float32", 8: "float64"}
_CACHE_ITEMSIZES = {name: itemsize for itemsize, name in CACHE_DTYPE_NAMES.items()}


def _cache_itemsizes(problem, cache_dtype):
    """The cache's storage sizes to try, in order of preference (see :func:`plan_kernel_cache`)."""
    if cache_dtype == "auto":
        half = problem.itemsize == 4 and problem.unit_bounded_kernel
        return [problem.itemsize] + ([2] if half else [])
    itemsize = _CACHE_ITEMSIZES[cache_dtype]
    if itemsize > problem.itemsize:
        raise ValueError(
            f"kernel_cache_dtype={cache_dtype!r} is wider than the training dtype; the products are computed in "
            "the training dtype. Use kernel_cache_dtype='auto' or a dtype at most as wide."
        )
    if itemsize == 2 and not problem.unit_bounded_kernel:
        raise ValueError(
            "kernel_cache_dtype='float16' needs a kernel with values in [-1, 1] (the radial kernels): float16 "
            "overflows above 65504. Use kernel_cache_dtype='auto'."
        )
    return [itemsize]
