"""Planners of the kernel machines: every automatic decision of an EigenPro 2 or EigenPro 3 fit.

A fit is planned in two stages because two facts are measured in between:

1. the *layout* (:func:`plan_eigenpro2_layout`, :func:`plan_eigenpro3_layout`),
   before any tensor exists: the Nystrom subsample, the memory model, whether
   ``X`` is streamed, whether ``K(X, Z)`` is cached, which projection, and the
   largest batch the memory allows (the throughput probe's upper bound);
2. the *plan* (:func:`plan_eigenpro2`, :func:`plan_eigenpro3`), once the device's
   batch capacity is measured and the preconditioner's spectrum is known: the
   batch, the temporary centers, the blocks and the memory account.

Everything here is a pure function of sizes, the memory budget and the user's
parameters; the memory models are linear in the batch, as in Falkon's helpers.
Nothing allocates a tensor or reads a clock.
"""

import dataclasses
import math
from dataclasses import dataclass

from .._warnings import warn_user
from ..device import batch_limit, column_block_size, exact_gram_row_block, rows_within_budget
from ..operator_facts import CPU_READ_ENTRIES, CPU_WIDE_COLUMNS, padded_features, shard_bounds
from ..preconditioner import CRITICAL_BATCH_MARGIN, SHIFTED_MAX_COMPONENTS
from ._account import MemoryAccount

__all__ = [
    "CG_MAX_CONDITION",
    "HALF_ROUNDING",
    "HALF_ROUNDING_SHARE",
    "SHIFTED_MAX_COMPONENTS",
    "CentersCount",
    "CentersMemoryPlan",
    "CentersSolverChoice",
    "EigenPro2Layout",
    "EigenPro3Layout",
    "EveryPointCGPlan",
    "KernelFitPlan",
    "KernelProblem",
    "KernelSettings",
    "TrainingMemoryPlan",
    "auto_subsample_size",
    "cached_batch_limit",
    "full_kernel_cg_conditioned",
    "full_kernel_cg_factors",
    "half_cache_harmless",
    "operating_batch",
    "plan_alpha",
    "plan_auto_centers",
    "plan_centers_solver",
    "plan_eigenpro2",
    "plan_eigenpro2_layout",
    "plan_eigenpro3",
    "plan_eigenpro3_layout",
    "plan_every_point_cg",
    "plan_full_kernel_solver",
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
_MINIMAL_BATCH = 64


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


@dataclass(frozen=True)
class KernelSettings:
    """The user's parameters that the planners read (``"auto"`` or a value each).

    ``cache_dtype`` is the estimators' ``kernel_cache_dtype``: the storage of EigenPro
    2's ``K(X, X)`` cache.  ``"auto"`` lets a float32 fit store it in float16 (for
    kernels with values in [-1, 1]) when float32 does not fit.  The alternative is to
    evaluate every epoch's kernel, 20 times slower on Fashion-MNIST.  Measured on
    the real-data benchmark against a float32 cache (benchmarks/RESULTS.md): the
    regressors' test errors agree within 0.06%, the classifiers' within their
    spread over seeds (LetterRecognition, seeds 0-3: 0.0278-0.0338 in float16,
    0.0285-0.0328 in float32, the early-stopping epoch differing), and the fits were
    10-25% faster.  float32 is kept where it fits.
    """

    batch_size: object = "auto"
    subsample_size: object = "auto"
    cache_kernel: object = "auto"
    projection: str = "auto"
    cache_dtype: str = "auto"


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

    def column_block(self, batch_size):
        """Columns of a kernel block for ``batch_size`` rows (half the free budget at most)."""
        free = max(self.budget - self.fixed_bytes, 0) // 2
        return column_block_size(self.device, batch_size, self.n_rows, self.entry_bytes, free)

    def batch_bytes(self, batch_size):
        """A batch's rows, buffers and kernel block."""
        return batch_size * (self.row_bytes + self.column_block(batch_size) * self.entry_bytes)

    def max_batch(self):
        """Largest batch whose blocks fit next to the fixed costs (at least 1)."""
        return batch_limit(self.budget, self.fixed_bytes, self.batch_bytes, self.n_rows)

    def cache_bytes(self, storage_itemsize):
        """``K(X, X)`` and the validation rows' ``K(X_val, X)`` at ``storage_itemsize`` bytes per entry."""
        return storage_itemsize * self.n_cached_rows * self.n_rows

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
    subsample_size : int
    resident_rows : int
        Training rows held on the device (``n_rows``, or two buffers when streamed).
    copies_of_outputs : int, default=6
    """

    def __init__(self, problem, budget, subsample_size, resident_rows, copies_of_outputs=6):
        self.budget, self.n_rows, self.n_centers = budget, problem.n_rows, problem.n_centers
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
        self.cache_bytes = itemsize * problem.n_rows * p_local
        self.exact_projection_bytes = 8 * p * (p + exact_gram_row_block(p) * (1 + problem.extra_blocks))
        self.center_cache_bytes = itemsize * p * p_local
        self.row_bytes = itemsize * (d + 4 * outputs) + p_local * self.entry_bytes

    def temporary_bytes(self, n_temporary, batch_size):
        """Temporary centers with their coefficients, and their block for one batch."""
        return self.itemsize * n_temporary * (self.n_features + 1 + self.n_outputs) + (
            self.entry_bytes * batch_size * n_temporary
        )

    def free_bytes(self, *extras):
        """Budget left after the fixed costs and the given optional parts."""
        return self.budget - self.fixed_bytes - sum(extras)

    def max_batch(self, *extras):
        """Largest batch that fits next to the fixed costs and ``extras`` (at least 1)."""
        return min(rows_within_budget(self.budget, self.fixed_bytes + sum(extras), self.row_bytes), self.n_rows)


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


@dataclass(frozen=True)
class EigenPro2Layout:
    """What an EigenPro 2 fit decides before measuring: subsample, memory model, cache, batch limit.

    ``cache_itemsize`` is the bytes per entry of the ``K(X, X)`` cache (the training
    dtype's, or 2 for float16 storage), 0 when kernel blocks are computed per batch.
    """

    problem: KernelProblem
    subsample_size: int
    memory: TrainingMemoryPlan
    memory_limit: int
    cache_itemsize: int = 0

    @property
    def cached(self):
        return self.cache_itemsize > 0

    @property
    def cache_bytes(self):
        return self.memory.cache_bytes(self.cache_itemsize) if self.cached else 0

    def column_block(self, batch_size):
        """Columns of a kernel block for ``batch_size`` rows."""
        return self.memory.column_block(batch_size)

    def batch_bytes(self, batch_size):
        """What a batch adds to the fixed costs (and the cache)."""
        memory = self.memory
        return memory.cached_batch_bytes(batch_size) if self.cached else memory.batch_bytes(batch_size)


def plan_eigenpro2_layout(problem, budget, device, settings, definite_penalty=None):
    """Stage 1 of an EigenPro 2 fit (every training row a center), and of CG on every point.

    Parameters
    ----------
    problem : KernelProblem
    budget : int
    device : torch.device
    settings : KernelSettings
        ``settings.cache_dtype`` is the cache's storage (see
        :func:`plan_kernel_cache`).
    definite_penalty : float or None, default=None
        The smallest diagonal shift of the system a solver needs positive definite
        (CG on every point: the penalty on the normalised weights); None for
        EigenPro 2 (see :func:`plan_kernel_cache`).

    Returns
    -------
    EigenPro2Layout
    """
    n = problem.n_rows
    subsample_size = auto_subsample_size(n) if settings.subsample_size == "auto" else min(settings.subsample_size, n)
    memory = TrainingMemoryPlan(problem, budget, device, subsample_size)
    cache_itemsize = plan_kernel_cache(problem, memory, settings.cache_kernel, settings.cache_dtype, definite_penalty)
    layout = EigenPro2Layout(problem, subsample_size, memory, 1, cache_itemsize)
    limit = batch_limit(budget, memory.fixed_bytes + layout.cache_bytes, layout.batch_bytes, n)
    return dataclasses.replace(layout, memory_limit=limit)


def plan_kernel_cache(problem, memory, cache_kernel, cache_dtype="auto", definite_penalty=None):
    """Bytes per entry of EigenPro 2's ``K(X, X)`` cache, or 0 to compute kernel blocks per batch.

    The cache is kept when it fits the budget next to the fixed costs, the blocks
    that fill it and a batch of ``_MINIMAL_BATCH`` rows.  ``cache_dtype="auto"``
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
    minimal = min(problem.n_rows, _MINIMAL_BATCH)
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


@dataclass(frozen=True)
class EigenPro3Layout:
    """What an EigenPro 3 fit decides before measuring: memory model, cache, projection, batch limit.

    ``cached``: ``K(X, Z)`` is computed once; ``exact``: the projection factorises
    ``K(Z, Z)``; ``cache_centers``: the iterative projection reads a cached
    ``K(Z, Z)`` (``centers_in_cache``: the first ``p`` rows of the ``K(X, Z)``
    cache, at no extra memory).  ``free`` is the budget left after the fixed
    costs and those parts; ``memory_limit`` the largest batch that fits there
    with one batch of temporary centers.
    """

    problem: KernelProblem
    budget: int
    device: object
    subsample_size: int
    memory: CentersMemoryPlan
    buffer_rows: int
    cached: bool
    exact: bool
    cache_centers: bool
    memory_limit: int

    @property
    def centers_in_cache(self):
        return self.cached and self.problem.centers_from_data

    @property
    def choices(self):
        """The three decisions that every rank of a distributed fit must share."""
        return (self.cached, self.exact, self.cache_centers)

    @property
    def reserved(self):
        """Named optional parts this layout keeps on the device."""
        memory, parts = self.memory, []
        if self.cached:
            parts.append(("K(X, Z) cache", memory.cache_bytes))
        if self.exact:
            parts.append(("exact projection", memory.exact_projection_bytes))
        elif self.cache_centers and not self.centers_in_cache:
            parts.append(("K(Z, Z) cache", memory.center_cache_bytes))
        return tuple(parts)

    @property
    def free(self):
        return max(self.memory.free_bytes(*(count for _, count in self.reserved)), 0)

    def column_block(self, batch_size):
        """Columns of a kernel block for ``batch_size`` rows (half the free memory at most)."""
        return column_block_size(
            self.device, batch_size, self.problem.n_local_centers, self.memory.entry_bytes, self.free // 2
        )


def plan_eigenpro3_layout(problem, budget, device, settings, choices=None):
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
    settings : KernelSettings
    choices : tuple of bool, optional
        ``(cached, exact, cache_centers)`` decided elsewhere (by rank 0 of a
        distributed fit); the layout then follows them.

    Returns
    -------
    EigenPro3Layout

    Raises
    ------
    ValueError
        When the budget is too small for a minimal batch, or a forced cache or
        exact projection does not fit.
    """
    n, p = problem.n_rows, problem.n_centers
    requested = auto_subsample_size(n) if settings.subsample_size == "auto" else settings.subsample_size
    subsample_size = min(requested, p)
    buffer_rows = min(n, max(int(budget // 16 // (problem.itemsize * (problem.n_features + problem.n_outputs + 1))), 1))
    memory = CentersMemoryPlan(problem, budget, subsample_size, 2 * buffer_rows if problem.streamed else n)
    _check_minimal_batch(problem, memory, subsample_size)
    if choices is None:
        choices = _choose_cache_and_projection(problem, memory, settings)
    cached, exact, cache_centers = (bool(choice) for choice in choices)
    layout = EigenPro3Layout(
        problem, budget, device, subsample_size, memory, buffer_rows, cached, exact, cache_centers, memory_limit=1
    )
    reserved = sum(count for _, count in layout.reserved)

    def batch_bytes(batch):
        return batch * memory.row_bytes + memory.temporary_bytes(batch, batch)

    limit = batch_limit(budget, memory.fixed_bytes + reserved, batch_bytes, n)
    return dataclasses.replace(layout, memory_limit=limit)


def _minimal_batch(memory):
    return min(memory.n_rows, _MINIMAL_BATCH)


def _check_minimal_batch(problem, memory, subsample_size):
    minimal = _minimal_batch(memory)
    if memory.free_bytes() < memory.row_bytes * minimal:
        raise ValueError(
            f"{problem.named_budget(memory.budget)} is too small for EigenPro 3 on {memory.n_centers} centers: the "
            f"data, centers, coefficients and the {subsample_size}-point Nystrom eigensystem take "
            f"{memory.fixed_bytes} bytes, and a batch of {minimal} rows needs {memory.row_bytes * minimal} more. "
            "Use a larger memory_budget, fewer centers or a smaller subsample_size." + problem.held_note()
        )


def _choose_cache_and_projection(problem, memory, settings):
    """``(cached, exact, cache_centers)`` from the budget and ``cache_kernel`` / ``projection``."""
    minimal = _minimal_batch(memory)

    def room(*parts):
        """Bytes left after the fixed costs, ``parts`` and two minimal batches."""
        return memory.free_bytes(*parts) - 2 * memory.row_bytes * minimal

    cache_fits = not problem.streamed and memory.cache_bytes <= room()
    if settings.cache_kernel is True and not cache_fits:
        raise ValueError(
            f"cache_kernel=True: K(X, centers) for {problem.n_rows} rows and {problem.n_local_centers} centers per "
            f"device needs {memory.cache_bytes} bytes, but {problem.named_budget(memory.budget)} leaves "
            f"{max(memory.free_bytes(), 0)} bytes next to the other fixed costs"
            + (" (X is streamed from its memory-mapped file)" if problem.streamed else "")
            + ". Use cache_kernel='auto' or a larger memory_budget."
            + problem.held_note()
        )
    exact_bytes = memory.exact_projection_bytes
    if settings.cache_kernel == "auto":
        exact_alone, exact_with_cache = exact_bytes <= room(), exact_bytes <= room(memory.cache_bytes)
        cached = cache_fits and (exact_with_cache or not exact_alone or settings.projection == "iterative")
    else:
        cached = bool(settings.cache_kernel)
    cache = memory.cache_bytes if cached else 0
    exact_fits = exact_bytes <= room(cache)
    if settings.projection == "exact" and not exact_fits:
        raise ValueError(
            f"projection='exact' factorises K(centers, centers): {exact_bytes} bytes for {problem.n_centers} "
            f"centers, which do not fit {problem.named_budget(memory.budget)} next to the other fixed costs "
            f"({memory.fixed_bytes + cache} bytes). Use projection='auto' or 'iterative'." + problem.held_note()
        )
    exact = exact_fits if settings.projection == "auto" else settings.projection == "exact"
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
    """Every decision of a kernel fit, with the memory it takes on the main device.

    Attributes
    ----------
    method : {"eigenpro2", "eigenpro3", "cg"}
        ``"cg"``: CG on every point (:func:`plan_every_point_cg`).
    subsample_size : int
    capacity : int
        Measured batch capacity ``m_G`` (or the given batch size).
    memory_limit : int
        Largest batch the memory allows.
    batch_size : int
    column_block : int
        Columns of a kernel block at ``batch_size``.
    streamed, cached : bool
    projection : {"exact", "iterative"} or None
    cache_centers : bool
    n_temporary : int
        Temporary centers between projections (0 for EigenPro 2).
    row_block : int
        Rows of a kernel block when caching, projecting or validating.
    buffer_rows : int
    cache_itemsize : int
        Bytes per entry of the kernel cache (0 when not cached).
    memory : MemoryAccount
    """

    method: str
    subsample_size: int
    capacity: int
    memory_limit: int
    batch_size: int
    column_block: int
    memory: MemoryAccount
    streamed: bool = False
    cached: bool = False
    projection: str | None = None
    cache_centers: bool = False
    n_temporary: int = 0
    row_block: int = 0
    buffer_rows: int = 0
    cache_itemsize: int = 0

    def describe(self):
        """One line for ``verbose``."""
        cached = f"cached ({8 * self.cache_itemsize}-bit)"
        if self.method == "cg":
            read = cached if self.cached else f"computed {self.batch_size} rows at a time"
            return f"CG on every point, kernel {read}, {self.memory.describe()}"
        if self.method == "eigenpro2":
            layout = "EigenPro 2, kernel " + (cached if self.cached else "computed per batch")
        else:
            layout = (
                f"EigenPro 3{' streamed' if self.streamed else ''}, {self.projection} projection, kernel "
                f"{'cached' if self.cached else 'computed per batch'}, {self.n_temporary} temporary centers"
            )
        return (
            f"{layout}, batch capacity m_G={self.capacity} (memory limit {self.memory_limit}), batch size "
            f"{self.batch_size}, {self.memory.describe()}"
        )


def _requested_batch(settings, capacity, critical_batch_preconditioned, problem, memory_limit):
    """The batch: ``operating_batch`` when auto, else the user's (clamped to the memory with a warning)."""
    if settings.batch_size == "auto":
        return min(operating_batch(capacity, critical_batch_preconditioned, problem.n_rows), memory_limit)
    if capacity > memory_limit:
        warn_user(
            f"batch_size={capacity} does not fit memory_budget next to the fixed costs; using {memory_limit}.",
            UserWarning,
        )
        return memory_limit
    return capacity


def _fit_plan(method, sized, **decisions):
    """The :class:`KernelFitPlan` of ``sized = (layout, capacity, batch_size, account)`` and a path's own decisions."""
    layout, capacity, batch_size, account = sized
    return KernelFitPlan(
        method=method,
        subsample_size=layout.subsample_size,
        capacity=capacity,
        memory_limit=layout.memory_limit,
        batch_size=batch_size,
        column_block=layout.column_block(batch_size),
        memory=account,
        cached=layout.cached,
        **decisions,
    )


def plan_eigenpro2(layout, capacity, critical_batch_preconditioned, settings):
    """Stage 2 of an EigenPro 2 fit: the batch and the memory account.

    Parameters
    ----------
    layout : EigenPro2Layout
    capacity : int
        Measured batch capacity, or ``min(batch_size, n)`` when given.
    critical_batch_preconditioned : float
    settings : KernelSettings

    Returns
    -------
    KernelFitPlan
    """
    problem = layout.problem
    batch_size = _requested_batch(settings, capacity, critical_batch_preconditioned, problem, layout.memory_limit)
    if layout.cached and settings.batch_size == "auto":
        batch_size = min(batch_size, cached_batch_limit(problem.n_rows))
    sized = (layout, capacity, batch_size, _every_point_account(layout, batch_size))
    return _fit_plan("eigenpro2", sized, cache_itemsize=layout.cache_itemsize, row_block=_fill_rows(layout))


def _every_point_account(layout, batch_size):
    """The memory of ``K(X, X)`` read ``batch_size`` rows at a time: EigenPro 2's layout, its cache and blocks."""
    memory = layout.memory
    account = MemoryAccount(memory.budget, memory.items)
    if not layout.cached:
        return account.with_item("batch", layout.batch_bytes(batch_size))
    account = account.with_item(f"K(X, X) cache ({layout.cache_itemsize}-byte entries)", layout.cache_bytes)
    working = max(memory.fill_bytes(), layout.batch_bytes(batch_size))
    return account.with_item("batch (or the blocks filling the cache)", working)


def _fill_rows(layout):
    """Rows of a block filling the kernel cache (0: nothing cached)."""
    return CACHE_FILL_ROWS if layout.cached else 0


def plan_eigenpro3(layout, capacity, critical_batch_preconditioned, settings):
    """Stage 2 of an EigenPro 3 fit: the batch, the temporary centers, the blocks and the memory account.

    Temporary centers trade per-step kernel work against fewer projections
    (:func:`temporary_centers_for`); their count is halved until they fit in
    half the free memory and next to the batch, and is at least one batch.

    Parameters
    ----------
    layout : EigenPro3Layout
    capacity : int
    critical_batch_preconditioned : float
    settings : KernelSettings

    Returns
    -------
    KernelFitPlan
    """
    problem, memory = layout.problem, layout.memory
    batch_size = _requested_batch(settings, capacity, critical_batch_preconditioned, problem, layout.memory_limit)
    projection = "exact" if layout.exact else "iterative"
    n_temporary = max(min(temporary_centers_for(problem, projection, layout.cache_centers), problem.n_rows), batch_size)
    room = min(layout.free // 2, layout.free - batch_size * memory.row_bytes)
    while n_temporary > batch_size and memory.temporary_bytes(n_temporary, batch_size) > room:
        n_temporary //= 2
    n_temporary = max(n_temporary, batch_size)
    account = MemoryAccount(memory.budget, (*memory.items, *layout.reserved))
    account = account.with_item("temporary centers", memory.temporary_bytes(n_temporary, batch_size))
    account = account.with_item("batch", batch_size * memory.row_bytes)
    return _fit_plan(
        "eigenpro3",
        (layout, capacity, batch_size, account),
        streamed=problem.streamed,
        cache_itemsize=problem.itemsize if layout.cached else 0,
        projection=projection,
        cache_centers=layout.cache_centers,
        n_temporary=n_temporary,
        row_block=max(min(batch_size, 4096), 1),
        buffer_rows=layout.buffer_rows,
    )


# The conjugate-gradient solver for centers keeps two p x p float64 factors (the
# Cholesky factor of K(Z, Z) and that of the preconditioner's inner matrix) and
# evaluates K(X, Z) in blocks of this many rows per pass.
CG_FACTOR_BYTES = 2 * 8
CG_ROW_BLOCK = 2048


@dataclass(frozen=True)
class CentersSolverChoice:
    """How a model on ``p`` centers is fitted: the solver and, for CG, whether ``K(X, Z)`` is stored.

    Attributes
    ----------
    solver : {"cg", "eigenpro"}
    memory : MemoryAccount
        What CG uses (with the stored ``K(X, Z)`` when ``stores_kernel``).
    stores_kernel : bool
        CG computes ``K(X, Z)`` once and reads it on every iteration; otherwise
        every iteration evaluates it again, block by block.
    """

    solver: str
    memory: MemoryAccount
    stores_kernel: bool


def plan_centers_solver(problem, budget, solver):
    """Which solver fits the model on ``p`` centers, ``"cg"`` or ``"eigenpro"``, and whether CG stores ``K(X, Z)``.

    Conjugate gradients on the penalised normal equations, preconditioned with the
    ``K(centers, centers)`` factor (Falkon's), reach the exact solution in tens of
    passes over the data, whatever the conditioning; EigenPro 3's SGD needs no
    ``p x p`` matrix and reaches a good model in a few passes.  Every CG iteration
    reads ``K(X, Z)``: stored (``n p`` entries in the training dtype), an iteration
    costs one read of it; evaluated again, it costs an EigenPro 3 epoch's kernel
    work, and tens of such passes lose to EigenPro 3 (5M rows, 20000 centers, one
    pass on an H100: test R^2 0.52 by CG, 0.97 by EigenPro 3).  So ``"auto"``
    takes CG when its factors, the training data and the stored ``K(X, Z)`` fit
    the budget on one device with the data in memory (as scikit-learn's
    ``Ridge(solver="auto")`` picks a direct solver when it can), and EigenPro 3
    otherwise: for centers sharded over devices or ranks, for streamed data, or
    when ``K(X, Z)`` or the ``p x p`` factors do not fit.  ``solver="cg"`` stores
    ``K(X, Z)`` when it fits and evaluates it every iteration otherwise.

    Parameters
    ----------
    problem : KernelProblem
        With ``n_centers`` set.
    budget : int
    solver : {"auto", "cg", "eigenpro"}

    Returns
    -------
    CentersSolverChoice

    Raises
    ------
    ValueError
        ``solver="cg"`` where it cannot run: sharded centers, streamed data, or
        factors that do not fit the budget.
    """
    p, rows = problem.n_centers, min(problem.n_rows, CG_ROW_BLOCK)
    memory = MemoryAccount(
        budget,
        (
            ("training data", problem.n_rows * (problem.n_features + problem.n_outputs + 1) * problem.itemsize),
            ("K(Z, Z) factors (float64)", CG_FACTOR_BYTES * p * p),
            ("kernel row block", rows * p * problem.entry_bytes),
        ),
    )
    stored = memory.with_item("K(X, Z) stored", problem.n_rows * p * problem.itemsize)
    possible = problem.n_shards == 1 and not problem.streamed
    if solver == "cg" and not possible:
        raise ValueError("solver='cg' runs on one device with the data in memory; use solver='eigenpro' here.")
    if solver == "cg" and not memory.fits():
        raise ValueError(
            f"solver='cg' needs {memory.describe()}: more than memory_budget. Use solver='auto' or a larger budget."
        )
    stores_kernel = possible and stored.fits()
    if solver == "auto":
        solver = "cg" if stores_kernel else "eigenpro"
    return CentersSolverChoice(solver, stored if stores_kernel else memory, stores_kernel and solver == "cg")


# n_centers="auto": Falkon's analysis (Rudi, Carratino and Rosasco 2017) reaches the
# optimal learning rate with p ~ sqrt(n) centers; we take ten times that, and never
# fewer than the 2000 components of the Nystroem + RidgeCV baseline users compare with
# (100k rows: 3163 centers, 254k: 5047, 1M: 10000, 5M: 22361).
AUTO_CENTERS_PER_ROOT = 10
AUTO_CENTERS_MIN = 2000

# Up to this many rows n_centers="auto" keeps a center at every point even when K(X, X)
# does not fit the budget: an EigenPro 2 epoch then evaluates n^2 kernel entries
# (4e8, seconds on the 2-core CPU), and the real-data sets up to 20000 rows
# (LetterRecognition, HI) fitted well so.
AUTO_EVERY_POINT_MAX_ROWS = 20_000


@dataclass(frozen=True)
class CentersCount:
    """What ``n_centers="auto"`` chose: ``n_centers`` (None: every training point) and why, in words."""

    n_centers: int | None
    reason: str


def plan_auto_centers(problem, budget, device, settings):
    """The number of centers of ``n_centers="auto"``.

    Every training point is a center while EigenPro 2 can keep ``K(X, X)`` in the
    budget (:func:`plan_kernel_cache`, float16 storage included where allowed) or
    there are at most :data:`AUTO_EVERY_POINT_MAX_ROWS` rows.  Beyond, ``p =
    max(AUTO_CENTERS_MIN, AUTO_CENTERS_PER_ROOT sqrt(n))`` training rows, lowered to
    the largest ``p`` whose ``K(X, Z)`` CG can store next to its factors (each CG
    iteration then costs one read of it, :func:`plan_centers_solver`) as long as
    that leaves at least ``AUTO_CENTERS_MIN``; otherwise ``p`` stays and EigenPro 3
    evaluates ``K(X, Z)`` every epoch.

    Parameters
    ----------
    problem : KernelProblem
        Every training row, ``n_centers`` None.
    budget : int
    device : torch.device
    settings : KernelSettings

    Returns
    -------
    CentersCount
    """
    n = problem.n_rows
    if not problem.streamed:
        memory = TrainingMemoryPlan(problem, budget, device, auto_subsample_size(n))
        cache_itemsize = plan_kernel_cache(problem, memory, "auto", settings.cache_dtype)
        if cache_itemsize:
            return CentersCount(None, f"K(X, X) fits memory_budget in {8 * cache_itemsize}-bit entries")
        if n <= AUTO_EVERY_POINT_MAX_ROWS:
            return CentersCount(None, f"n <= {AUTO_EVERY_POINT_MAX_ROWS}: EigenPro 2 evaluates K(X, X) every epoch")
    target = min(n, max(AUTO_CENTERS_MIN, math.ceil(AUTO_CENTERS_PER_ROOT * math.sqrt(n))))
    rule = f"max({AUTO_CENTERS_MIN}, {AUTO_CENTERS_PER_ROOT} sqrt(n)) = {target}"

    def stores(p):
        return plan_centers_solver(dataclasses.replace(problem, n_centers=p), budget, "auto").stores_kernel

    low, high = 0, target  # the largest p <= target whose K(X, Z) CG stores (0: none)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if stores(middle) else (low, middle - 1)
    if low >= min(AUTO_CENTERS_MIN, target):
        lowered = "" if low == target else f", lowered to {low} for CG to store K(X, Z)"
        return CentersCount(low, f"{rule}{lowered}")
    if problem.streamed or problem.n_shards > 1:
        why = "X is streamed" if problem.streamed else f"the centers are sharded over {problem.n_shards} devices"
    else:
        why = f"K(X, Z) of {min(AUTO_CENTERS_MIN, target)} centers does not fit memory_budget"
    return CentersCount(target, f"{rule}; {why}: EigenPro 3 evaluates K(X, Z) every epoch")


# With every training point a center, CG's p x p factors are n x n: three O(n^3)
# factorisations that take seconds up to this many rows on the 2-core CPU we develop
# on (5007 rows: see benchmarks/RESULTS.md), where EigenPro 2 on ill-conditioned,
# low-dimensional data needs tens of epochs to reach the penalised solution.
FULL_KERNEL_CG_MAX_ROWS = 10_000


def plan_full_kernel_solver(problem, budget, solver, alpha):
    """Which solver fits a model with a center at every training point: ``"cg"`` or ``"eigenpro"``.

    ``"auto"`` takes CG for a positive ``alpha``: up to
    :data:`FULL_KERNEL_CG_MAX_ROWS` rows with Falkon's preconditioner built on
    ``K(X, X)``'s own factor (the exact penalised solution in a few passes) when
    the factors fit the budget, EigenPro 2 when they do not; beyond, with a
    preconditioner from the Nystrom subsample (:func:`full_kernel_cg_factors`),
    in the memory EigenPro 2 would use: each iteration reads ``K(X, X)`` once,
    as an epoch does, and a small ``alpha`` needs far fewer of them than SGD's
    epochs (VietNamI, alpha 0.07: 17 against 31).  Without a penalty EigenPro 2 is
    kept: its early-stopped iterates regularise, where CG would return the
    interpolant.

    Parameters
    ----------
    problem : KernelProblem
        With ``n_centers`` None.
    budget : int
    solver : {"auto", "cg", "eigenpro"}
    alpha : float

    Returns
    -------
    str
    """
    if solver == "eigenpro" or (solver == "auto" and alpha <= 0):
        return "eigenpro"
    if not full_kernel_cg_factors(problem):
        return "cg"
    as_centers = dataclasses.replace(problem, n_centers=problem.n_rows)
    return plan_centers_solver(as_centers, budget, solver).solver


# n x l float64 vectors the square system's CG holds at once (coefficients, residual,
# direction, step, and the images of the coefficients and of the step, doubled while
# they are concatenated).
_CG_VECTORS = 8


@dataclass(frozen=True)
class EveryPointCGPlan:
    """CG on every point: how ``K(X, X)`` is read, and the preconditioner's size.

    Attributes
    ----------
    fit : KernelFitPlan
        ``method="cg"`` on EigenPro 2's layout (the same subsample, cache and
        blocks): CG has no batch, and ``batch_size`` is the row block an uncached
        pass evaluates at once.  Its ``memory`` holds CG's vectors and the
        preconditioner's basis too.
    max_components : int
        The most columns of the preconditioner's basis the budget leaves room for
        (at most ``SHIFTED_MAX_COMPONENTS``).
    """

    fit: KernelFitPlan
    max_components: int


def plan_every_point_cg(layout):
    """The plan of CG on every point on EigenPro 2's ``layout``: row blocks, memory, preconditioner basis.

    A pass reads ``CG_ROW_BLOCK`` rows at a time (fewer where the memory
    allows fewer, or where a cached kernel is read in EigenPro 2's row blocks).
    The preconditioner's basis is ``n x q`` in the training dtype, built from a
    float64 factor (the sketch) of at most the same shape; ``q`` is as many as the
    budget leaves room for next to the kernel's items and CG's vectors.

    Parameters
    ----------
    layout : EigenPro2Layout

    Returns
    -------
    EveryPointCGPlan
    """
    problem = layout.problem
    n = problem.n_rows
    capacity = min(CG_ROW_BLOCK, layout.memory_limit)
    row_block = min(max(min(capacity, n), 1), layout.memory_limit)
    if layout.cached:
        row_block = min(row_block, cached_batch_limit(n))
    account = _every_point_account(layout, row_block)
    account = account.with_item("CG vectors (float64)", _CG_VECTORS * n * problem.n_outputs * 8)
    per_component = n * (8 + problem.itemsize)
    components = int(min(SHIFTED_MAX_COMPONENTS, max(account.budget - account.total, 0) // max(per_component, 1)))
    account = account.with_item("preconditioner basis (and its float64 sketch)", components * per_component)
    sized = (layout, capacity, row_block, account)
    fit = _fit_plan("cg", sized, cache_itemsize=layout.cache_itemsize, row_block=_fill_rows(layout))
    return EveryPointCGPlan(fit, components)


# CG on every point beyond Falkon's factors runs where its preconditioned system's
# estimated condition number, (n lambda + alpha) / alpha at the first direction the
# preconditioner cannot flatten, is at most this: CG then needs about
# sqrt(100) ln(2 / 1e-4) / 2 ~ 50 iterations at worst, the epochs EigenPro 2's
# penalised SGD needed on the benchmark.  Beyond, EigenPro 2 fits: on 12000 rows in 5
# dimensions with alpha 1e-3 (condition ~600) CG ran 63 iterations (test MSE 0.0042)
# against EigenPro's 21 epochs (0.0033), and with alpha 1e-6 CG ended unconverged after
# 100 (0.23) against 34 epochs (0.025).  VietNamI's alpha 0.07 is at about 10.
CG_MAX_CONDITION = 100.0


def full_kernel_cg_conditioned(condition):
    """Whether subsample-preconditioned CG fits a system of estimated condition number ``condition``.

    ``condition`` is :func:`~skgpu_kernel.preconditioner.shifted_condition` of the
    eigensystem the fit measured; above :data:`CG_MAX_CONDITION` EigenPro 2's
    penalised SGD fits instead.

    Parameters
    ----------
    condition : float

    Returns
    -------
    bool
    """
    return condition <= CG_MAX_CONDITION


def full_kernel_cg_factors(problem):
    """Whether CG with a center at every training point factors ``K(X, X)`` (else: a subsample preconditioner).

    Up to :data:`FULL_KERNEL_CG_MAX_ROWS` rows the ``n x n`` factors of Falkon's
    preconditioner are affordable and make CG exact in a few iterations; beyond,
    the preconditioner is :func:`~skgpu_kernel.preconditioner.shifted_rpcholesky_preconditioner`,
    a randomly pivoted Cholesky factor of rank ``q``, ``O(n q)`` memory.
    """
    return problem.n_rows <= FULL_KERNEL_CG_MAX_ROWS


def plan_alpha(alpha, uses_centers, solver, request):
    """How ``alpha`` is resolved: ``("given", alpha)``, ``("zero", None)`` or ``("loo", min_coverage)``.

    ``"loo"`` asks for the leave-one-out criterion, scored only where the Nystrom
    features capture at least the returned share of the kernel's trace (0: always).

    Parameters
    ----------
    alpha : float, "auto" or "loo"
        The estimator's parameter.
    uses_centers : bool
        ``n_centers`` or ``centers`` given.
    solver : str
        The solver resolved so far (with centers: ``"cg"`` or ``"eigenpro"``).
    request : KernelFitRequest
        Reads ``classifier``, ``weighted`` and ``min_coverage`` (the coverage
        ``"auto"`` asks of a model with every point a center).

    Returns
    -------
    tuple
    """
    if not isinstance(alpha, str):
        return "given", float(alpha)
    if uses_centers:
        # EigenPro 3's SGD has no penalty (early stopping regularises); CG needs one.
        return ("loo", 0.0) if solver == "cg" else ("zero", None)
    if alpha == "loo" or (request.classifier and request.weighted):
        # An interpolating (or early-stopped) classifier fits every training label
        # whatever its weight: class weights act through a penalty (on an imbalanced
        # digits task, minority recall 0.31 -> 0.38 at alpha 0, 0.26 -> 0.65 with it).
        return "loo", 0.0
    # Elsewhere the criterion is trusted only where its Nystrom model is close to the
    # kernel; below that coverage EigenPro 2's early stopping regularises.
    return "loo", request.min_coverage
