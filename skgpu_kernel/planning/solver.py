"""Planners of the solver: which one runs (CG on centers or every point, EigenPro, direct), how many centers, alpha.

Pure functions of sizes, the memory budget and the user's parameters.
"""

import dataclasses
import math
from dataclasses import dataclass

from .eigenpro import every_point_account, fill_rows, fit_plan
from .kernel import (
    SHIFTED_MAX_COMPONENTS,
    KernelLayout,
    TrainingMemoryPlan,
    auto_subsample_size,
    cached_batch_limit,
    plan_kernel_cache,
)

__all__ = [
    "AUTO_CENTERS_MIN",
    "AUTO_CENTERS_PER_ROOT",
    "AUTO_EVERY_POINT_MAX_ROWS",
    "CG_FACTOR_BYTES",
    "CG_MAX_CONDITION",
    "CG_ROW_BLOCK",
    "FULL_KERNEL_CG_MAX_ROWS",
    "LOO_MIN_COVERAGE",
    "CentersCGMemoryPlan",
    "CentersPlan",
    "auto_centers_target",
    "full_kernel_cg_conditioned",
    "full_kernel_cg_factors",
    "plan_alpha",
    "plan_auto_centers",
    "plan_centers_cg",
    "plan_centers_solver",
    "plan_every_point_cg",
    "plan_full_kernel_solver",
    "refit_with_penalty",
    "solves_penalised_system",
]

# The conjugate-gradient solver for centers keeps two p x p float64 factors (the
# Cholesky factor of K(Z, Z) and that of the preconditioner's inner matrix) and
# evaluates K(X, Z) in blocks of this many rows per pass.
CG_FACTOR_BYTES = 2 * 8


CG_ROW_BLOCK = 2048


# alpha="auto" with every point a center trusts the criterion only when the
# features capture this share of the kernel's trace.  Measured on the real-data
# benchmark (2000-point subsample): Computers 0.998, BudgetFood 0.997, VietNamI
# 0.982, LetterRecognition 0.977, HI 0.974, where the criterion's penalty matched
# or beat early stopping; Fashion-MNIST 0.87, where it cost 1.5 points of
# accuracy (0.8958 after 3 epochs at alpha=0.19 against 0.9049 unpenalised), and
# DNA 0.475.
LOO_MIN_COVERAGE = 0.95


@dataclass(frozen=True)
class CentersPlan:
    """How many centers ``n_centers="auto"`` takes, and why (:func:`plan_auto_centers`).

    Attributes
    ----------
    n_centers : int or None
        The centers (None: every training point).
    reason : str
        Why, in words.
    """

    n_centers: int | None
    reason: str


class CentersCGMemoryPlan:
    """Memory model of CG on ``p`` centers (:func:`plan_centers_cg`): what its layout reads.

    The layout (:class:`~skgpu_kernel.planning.kernel.KernelLayout`) asks every
    solver's model the same questions.

    Fixed: the training rows, targets and weights; the two ``p x p`` float64
    factors (``CG_FACTOR_BYTES`` per entry); one block of ``min(n,
    CG_ROW_BLOCK)`` rows of ``K(X, Z)``, each entry counted ``1 + extra_blocks``
    times, in which a pass reads the kernel, stored or evaluated.  Optional: the
    stored ``K(X, Z)`` in the training dtype.  CG has no batch: what a batch
    is to the other models, a row block is here (:meth:`batch_bytes`), with
    every center's column; and it projects nothing.

    Parameters
    ----------
    problem : KernelProblem
        With ``n_centers`` set.
    budget : int
        Bytes available.
    """

    def __init__(self, problem, budget):
        self.budget, self.n_rows, self.n_centers = budget, problem.n_rows, problem.n_centers
        self.entry_bytes, p = problem.entry_bytes, problem.n_centers
        self.items = (
            ("training data", problem.n_rows * (problem.n_features + problem.n_outputs + 1) * problem.itemsize),
            ("K(Z, Z) factors (float64)", CG_FACTOR_BYTES * p * p),
            ("kernel row block", self.batch_bytes(min(problem.n_rows, CG_ROW_BLOCK))),
        )
        self.fixed_bytes = sum(count for _, count in self.items)

    def cache_item(self, itemsize):
        """The stored ``K(X, Z)`` at ``itemsize`` bytes per entry, as a named item of a memory account."""
        return "K(X, Z) stored", self.n_rows * self.n_centers * itemsize

    def projection_items(self, projection, center_cache):
        """Nothing: CG solves for the coefficients of the centers themselves, with no temporary centers."""
        return ()

    def column_block(self, batch_size, reserved=0):
        """Every center: a pass reads whole rows of ``K(X, Z)``, whatever the layout reserves."""
        return self.n_centers

    def batch_bytes(self, batch_size, cached=False):
        """A block of ``batch_size`` rows of ``K(X, Z)``, stored (``cached``) or evaluated alike."""
        return batch_size * self.n_centers * self.entry_bytes


def plan_centers_solver(problem, budget, solver):
    """Which solver fits the model on ``p`` centers: ``"cg"`` where it stores ``K(X, Z)``, else ``"eigenpro"``.

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
    ``K(X, Z)`` when it fits and evaluates it every iteration otherwise
    (:func:`plan_centers_cg`).

    Parameters
    ----------
    problem : KernelProblem
        With ``n_centers`` set.
    budget : int
    solver : str
        ``"auto"``, ``"cg"``, ``"eigenpro"``, or another registered solver's name,
        which runs as named.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        ``solver="cg"`` where it cannot run: sharded centers, streamed data, or
        factors that do not fit the budget.
    """
    if solver == "auto":
        return "cg" if plan_centers_cg(problem, budget).cached else "eigenpro"
    if solver == "cg":
        plan_centers_cg(problem, budget, required=True)
    return solver


def plan_centers_cg(problem, budget, required=False):
    """CG on ``p`` centers: whether it stores ``K(X, Z)`` (where that fits the budget), and the memory it takes.

    Parameters
    ----------
    problem : KernelProblem
        With ``n_centers`` set.
    budget : int
    required : bool, default=False
        CG is to run (``solver="cg"``): refuse where it cannot.

    Returns
    -------
    KernelLayout
        On a :class:`CentersCGMemoryPlan`: ``cached`` where CG stores ``K(X, Z)``;
        no subsample, projection or memory limit (CG has no batch); ``account``,
        what CG holds.

    Raises
    ------
    ValueError
        With ``required``: sharded centers, streamed data, or factors that do not
        fit the budget.
    """
    evaluated = KernelLayout(problem, CentersCGMemoryPlan(problem, budget))
    stored = dataclasses.replace(evaluated, cache_itemsize=problem.itemsize)
    possible = problem.n_shards == 1 and not problem.streamed
    if required and not possible:
        raise ValueError("solver='cg' runs on one device with the data in memory; use solver='eigenpro' here.")
    if required and not evaluated.account.fits():
        raise ValueError(
            f"solver='cg' needs {evaluated.account.describe()}: more than memory_budget. Use solver='auto' or a "
            "larger budget."
        )
    return stored if possible and stored.account.fits() else evaluated


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


def auto_centers_target(n_rows):
    """``max(AUTO_CENTERS_MIN, AUTO_CENTERS_PER_ROOT sqrt(n))`` centers, at most ``n``: the size of a model on centers.

    Examples
    --------
    >>> auto_centers_target(1500), auto_centers_target(22_524), auto_centers_target(100_000)
    (1500, 2000, 3163)
    """
    return min(n_rows, max(AUTO_CENTERS_MIN, math.ceil(AUTO_CENTERS_PER_ROOT * math.sqrt(n_rows))))


def plan_auto_centers(problem, budget, device, parameters):
    """The number of centers of ``n_centers="auto"``.

    Every training point is a center while EigenPro 2 can keep ``K(X, X)`` in the
    budget (:func:`~skgpu_kernel.planning.kernel.plan_kernel_cache`, float16 storage included where allowed) or
    there are at most ``AUTO_EVERY_POINT_MAX_ROWS`` rows.  Beyond, ``p =
    max(AUTO_CENTERS_MIN, AUTO_CENTERS_PER_ROOT sqrt(n))`` training rows, lowered to
    the largest ``p`` whose ``K(X, Z)`` CG can store next to its factors (each CG
    iteration then costs one read of it, :func:`plan_centers_cg`) as long as
    that leaves at least ``AUTO_CENTERS_MIN``; otherwise ``p`` stays and EigenPro 3
    evaluates ``K(X, Z)`` every epoch.

    Parameters
    ----------
    problem : KernelProblem
        Every training row, ``n_centers`` None.
    budget : int
    device : torch.device
    parameters : KernelFitParameters

    Returns
    -------
    CentersPlan
        The count and why (``solver`` None).
    """
    n = problem.n_rows
    if not problem.streamed:
        memory = TrainingMemoryPlan(problem, budget, device, auto_subsample_size(n))
        cache_itemsize = plan_kernel_cache(problem, memory, "auto", parameters.cache_dtype)
        if cache_itemsize:
            return CentersPlan(None, f"K(X, X) fits memory_budget in {8 * cache_itemsize}-bit entries")
        if n <= AUTO_EVERY_POINT_MAX_ROWS:
            return CentersPlan(None, f"n <= {AUTO_EVERY_POINT_MAX_ROWS}: EigenPro 2 evaluates K(X, X) every epoch")
    target = auto_centers_target(n)
    rule = f"max({AUTO_CENTERS_MIN}, {AUTO_CENTERS_PER_ROOT} sqrt(n)) = {target}"

    def stores(p):
        return plan_centers_cg(dataclasses.replace(problem, n_centers=p), budget).cached

    low, high = 0, target  # the largest p <= target whose K(X, Z) CG stores (0: none)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if stores(middle) else (low, middle - 1)
    if low >= min(AUTO_CENTERS_MIN, target):
        lowered = "" if low == target else f", lowered to {low} for CG to store K(X, Z)"
        return CentersPlan(low, f"{rule}{lowered}")
    if problem.streamed or problem.n_shards > 1:
        why = "X is streamed" if problem.streamed else f"the centers are sharded over {problem.n_shards} devices"
    else:
        why = f"K(X, Z) of {min(AUTO_CENTERS_MIN, target)} centers does not fit memory_budget"
    return CentersPlan(target, f"{rule}; {why}: EigenPro 3 evaluates K(X, Z) every epoch")


# With every training point a center, CG's p x p factors are n x n: three O(n^3)
# factorisations that take seconds up to this many rows on the 2-core CPU we develop
# on (5007 rows: see benchmarks/RESULTS.md), where EigenPro 2 on ill-conditioned,
# low-dimensional data needs tens of epochs to reach the penalised solution.
FULL_KERNEL_CG_MAX_ROWS = 10_000


def plan_full_kernel_solver(problem, budget, solver, alpha):
    """Which solver fits a model with a center at every training point: ``"cg"`` or ``"eigenpro"``.

    ``"auto"`` takes CG for a positive ``alpha``: up to
    ``FULL_KERNEL_CG_MAX_ROWS`` rows with Falkon's preconditioner built on
    ``K(X, X)``'s own factor (the exact penalised solution in a few passes) when
    the factors fit the budget, EigenPro 2 when they do not; beyond, with a
    preconditioner from the Nystrom subsample (``full_kernel_cg_factors``),
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
    solver : str
        ``"auto"``, ``"cg"``, ``"eigenpro"``, or another registered solver's name
        (``skgpu_kernel.fit.registry``), which runs as named.
    alpha : float

    Returns
    -------
    str
    """
    if solver == "eigenpro" or (solver == "auto" and alpha <= 0):
        return "eigenpro"
    if solver not in ("auto", "cg"):  # a solver the user named (skgpu_kernel.fit.registry) runs as named
        return solver
    if not full_kernel_cg_factors(problem):
        return "cg"
    as_centers = dataclasses.replace(problem, n_centers=problem.n_rows)
    return plan_centers_solver(as_centers, budget, solver)


# n x l float64 vectors the square system's CG holds at once (coefficients, residual,
# direction, step, and the images of the coefficients and of the step, doubled while
# they are concatenated).
_CG_VECTORS = 8


def plan_every_point_cg(layout):
    """The plan of CG on every point on EigenPro 2's ``layout``: row blocks, memory, preconditioner basis.

    A pass reads ``CG_ROW_BLOCK`` rows at a time (fewer where the memory
    allows fewer, or where a cached kernel is read in EigenPro 2's row blocks).
    The preconditioner's basis is ``n x q`` in the training dtype, built from a
    float64 factor (the sketch) of at most the same shape; ``q`` is as many as the
    budget leaves room for next to the kernel's items and CG's vectors.

    Parameters
    ----------
    layout : KernelLayout
        :func:`~skgpu_kernel.planning.eigenpro.plan_eigenpro2_layout`'s.

    Returns
    -------
    KernelFitPlan
        ``method="cg"`` on EigenPro 2's layout (the same subsample, cache and
        blocks): CG has no batch, and ``batch_size`` is the row block an uncached
        pass evaluates at once.  Its ``memory`` holds CG's vectors and the
        preconditioner's basis too, of ``max_components`` columns at most.
    """
    problem = layout.problem
    n = problem.n_rows
    capacity = min(CG_ROW_BLOCK, layout.memory_limit)
    row_block = min(max(min(capacity, n), 1), layout.memory_limit)
    if layout.cached:
        row_block = min(row_block, cached_batch_limit(n))
    account = every_point_account(layout, row_block)
    account = account.with_item("CG vectors (float64)", _CG_VECTORS * n * problem.n_outputs * 8)
    per_component = n * (8 + problem.itemsize)
    components = int(min(SHIFTED_MAX_COMPONENTS, max(account.budget - account.total, 0) // max(per_component, 1)))
    account = account.with_item("preconditioner basis (and its float64 sketch)", components * per_component)
    sized = (layout, capacity, row_block, account)
    return fit_plan("cg", sized, row_block=fill_rows(layout), max_components=components)


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

    ``condition`` is :func:`~skgpu_kernel.cg_preconditioner.shifted_condition` of the
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


def solves_penalised_system(solver):
    """Whether the solver the user named solves ``(K + alpha W^-1) a = y`` (so needs ``alpha > 0``).

    Every one but EigenPro, whose early-stopped iterates regularise an
    unpenalised fit (``"auto"`` decides later, by the penalty).

    Examples
    --------
    >>> [solves_penalised_system(name) for name in ("auto", "eigenpro", "cg", "direct")]
    [False, False, True, True]
    """
    return solver not in ("auto", "eigenpro")


def full_kernel_cg_factors(problem):
    """Whether CG with a center at every training point factors ``K(X, X)`` (else: a subsample preconditioner).

    Up to ``FULL_KERNEL_CG_MAX_ROWS`` rows the ``n x n`` factors of Falkon's
    preconditioner are affordable and make CG exact in a few iterations; beyond,
    the preconditioner is :func:`~skgpu_kernel.cg_preconditioner.shifted_rpcholesky_preconditioner`,
    a randomly pivoted Cholesky factor of rank ``q``, ``O(n q)`` memory.
    """
    return problem.n_rows <= FULL_KERNEL_CG_MAX_ROWS


def plan_alpha(alpha, uses_centers, solver, classifier=False, weighted=False):
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
        The solver resolved so far (with centers: ``"cg"`` or ``"eigenpro"``); with a
        center at every point, the one the user asked for (``"auto"`` or a registered
        solver's name).
    classifier : bool, default=False
        A classifier asks.
    weighted : bool, default=False
        The sample weights (``class_weight`` included) are not all equal.

    Returns
    -------
    tuple

    Raises
    ------
    ValueError
        A solver that solves the penalised system (CG, or any named one but
        EigenPro: :func:`solves_penalised_system`) with a center at every point and
        ``alpha <= 0``: ``(K + alpha W^-1) a = y`` needs a penalty.
    """
    if not isinstance(alpha, str):
        if not uses_centers and solves_penalised_system(solver) and alpha <= 0:
            raise ValueError(
                f"solver={solver!r} with a center at every training point solves the penalised system "
                f"(K + alpha W^-1) a = y, which needs alpha > 0; got alpha={alpha}. Set alpha='auto' (the "
                "leave-one-out criterion chooses it), a positive alpha, or solver='eigenpro' (an unpenalised "
                "fit regularised by early stopping)."
            )
        return "given", float(alpha)
    if uses_centers:
        # EigenPro 3's SGD has no penalty (early stopping regularises); CG needs one.
        # (CG on every point too: FitPlan.needs_penalty.)
        return ("loo", 0.0) if solver == "cg" else ("zero", None)
    if alpha == "loo" or (classifier and weighted):
        # An interpolating (or early-stopped) classifier fits every training label
        # whatever its weight: class weights act through a penalty (on an imbalanced
        # digits task, minority recall 0.31 -> 0.38 at alpha 0, 0.26 -> 0.65 with it).
        return "loo", 0.0
    # Elsewhere the criterion is trusted only where its Nystrom model is close to the
    # kernel; below that coverage EigenPro 2's early stopping regularises.
    return "loo", LOO_MIN_COVERAGE


def refit_with_penalty(alpha, attempt_alpha, attempt_solver, on_centers, check):
    """Whether an unpenalised fit's last check says that interpolation did not pay: refit with a penalty.

    Where ``alpha="auto"`` resolved to 0 (``plan_alpha``'s gate did not trust
    the criterion's Nystrom features), EigenPro 2's early stopping was to
    regularise.  On noisy labels it does not: an unpenalised kernel model heads
    for the interpolant, and a flight table of 48,000 rows (24% positives) was
    worse than the majority class at every epoch.  The model must then be better
    than the trivial one beyond noise on its held-out rows, else it is refit at
    the exact leave-one-out criterion's ``alpha`` on every point (the same
    centers, cache and solver; issue 77 measured fewer centers with the
    criterion's ``alpha`` instead, on generated noisy-label tables: not better
    beyond noise, and a new operator to build).  Not for a given ``alpha`` (0
    included: the user's model) nor for a model on centers (EigenPro 3's SGD has
    no penalty).

    Parameters
    ----------
    alpha : float, "auto" or "loo"
        The estimator's parameter.
    attempt_alpha : float
        The penalty the attempt ran with.
    attempt_solver : str
    on_centers : bool
        The model is on centers (not every training point).
    check : FitCheck
        The attempt's last check (``skgpu_kernel.solvers.fit_check.check_fit``):
        its ``held_out`` and ``better``.

    Returns
    -------
    bool

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> not_better = SimpleNamespace(held_out=True, better=False)
    >>> refit_with_penalty("auto", 0.0, "eigenpro", False, not_better)
    True
    >>> refit_with_penalty(0.0, 0.0, "eigenpro", False, not_better)  # the user's alpha=0
    False
    """
    if not isinstance(alpha, str) or attempt_alpha != 0 or attempt_solver != "eigenpro" or on_centers:
        return False
    return check.held_out and not check.better
