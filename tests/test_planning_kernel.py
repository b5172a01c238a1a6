"""The kernel machines' planners, tested by tables of cases (as Falkon's dimension selectors are).

Each case gives the sizes, the budget and the user's parameters with the decisions
expected; every feasible case must also keep its memory account within the budget.
Sizes in the comments: n = 100k rows, p = 2000 centers, d = 10, one output, float32
and one extra kernel block give fixed costs of about 37 MB (32 MB of them the float64
eigensystem), a K(X, Z) cache of 800 MB, an exact factor of 40 MB and a K(Z, Z)
cache of 16 MB.
"""

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch

from skgpu_kernel import AdaptiveKernelRegressor
from skgpu_kernel.planning import MemoryAccount
from skgpu_kernel.planning.eigenpro import plan_eigenpro2, plan_eigenpro2_layout, plan_eigenpro3, plan_eigenpro3_layout
from skgpu_kernel.planning.kernel import (
    KernelProblem,
    TrainingMemoryPlan,
    cached_batch_limit,
    operating_batch,
    temporary_centers_for,
)
from skgpu_kernel.planning.kernel_policy import plan_kernel_fit
from skgpu_kernel.planning.parameters import KernelFitParameters
from skgpu_kernel.planning.solver import (
    FULL_KERNEL_CG_MAX_ROWS,
    plan_alpha,
    plan_auto_centers,
    plan_centers_cg,
    plan_centers_solver,
    plan_full_kernel_solver,
    refit_with_penalty,
)
from skgpu_kernel.solvers.fit_check import FitCheck

CPU = torch.device("cpu")
MB = 10**6


def _problem(**changes):
    sizes = {"n_rows": 100_000, "n_features": 10, "n_outputs": 1, "itemsize": 4, "extra_blocks": 1}
    sizes.update(n_centers=2000)
    sizes.update(changes)
    return KernelProblem(**sizes)


# (name, budget, problem changes, settings, expected (cached, exact, cache_centers))
EIGENPRO3_CASES = [
    ("everything fits", 2000 * MB, {}, {}, (True, True, False)),
    ("no room for the cache", 500 * MB, {}, {}, (False, True, False)),
    ("cache or factor: the factor wins", 850 * MB, {}, {}, (False, True, False)),
    ("iterative: the cache, K(Z, Z) read from it", 850 * MB, {}, {"projection": "iterative"}, (True, False, True)),
    # The centers' own cache must fit next to the K(X, Z) cache (it did not count it).
    (
        "given centers: no room for K(Z, Z) next to the cache",
        850 * MB,
        {"centers_from_data": False},
        {"projection": "iterative"},
        (True, False, False),
    ),
    (
        "given centers: K(Z, Z) cached when there is room",
        900 * MB,
        {"centers_from_data": False},
        {"projection": "iterative"},
        (True, False, True),
    ),
    ("cache refused", 2000 * MB, {}, {"cache_kernel": False}, (False, True, False)),
    ("streamed data is never cached", 2000 * MB, {"streamed": True}, {}, (False, True, False)),
    ("only the iterative projection fits", 60 * MB, {}, {}, (False, False, False)),
    ("the factor fits, not the cache", 100 * MB, {}, {}, (False, True, False)),
    ("two shards halve the cache", 500 * MB, {"n_shards": 2}, {}, (True, True, False)),
    ("float64", 2000 * MB, {"itemsize": 8}, {}, (True, True, False)),
    ("float64, cache too large", 1000 * MB, {"itemsize": 8}, {}, (False, True, False)),
    ("small problem", 50 * MB, {"n_rows": 5000, "n_centers": 500}, {}, (True, True, False)),
]


@pytest.mark.parametrize(
    ("budget", "changes", "settings", "expected"),
    [case[1:] for case in EIGENPRO3_CASES],
    ids=[case[0] for case in EIGENPRO3_CASES],
)
def test_eigenpro3_layout_decisions(budget, changes, settings, expected):
    layout = plan_eigenpro3_layout(_problem(**changes), budget, CPU, KernelFitParameters(**settings))
    assert layout.choices == expected


@pytest.mark.parametrize(
    ("budget", "changes", "settings"),
    [case[1:4] for case in EIGENPRO3_CASES],
    ids=[case[0] for case in EIGENPRO3_CASES],
)
@pytest.mark.parametrize("capacity", [1, 256, "memory limit", 10**7])
@pytest.mark.parametrize("critical_batch", [3.0, 1e4, math.inf])
def test_eigenpro3_plan_stays_within_the_budget(budget, changes, settings, capacity, critical_batch):
    problem = _problem(**changes)
    layout = plan_eigenpro3_layout(problem, budget, CPU, KernelFitParameters(**settings))
    capacity = min(layout.memory_limit if capacity == "memory limit" else capacity, problem.n_rows)
    plan = plan_eigenpro3(layout, capacity, critical_batch, KernelFitParameters(**settings))
    assert plan.memory.total <= budget, plan.memory.describe()
    assert 1 <= plan.batch_size <= min(capacity, layout.memory_limit)
    assert plan.n_temporary >= plan.batch_size
    assert plan.memory["batch"] == plan.batch_size * layout.memory.row_bytes
    assert ("K(X, Z) cache" in dict(plan.memory.items)) == plan.cached
    assert ("exact projection" in dict(plan.memory.items)) == (plan.projection == "exact")


def test_a_given_batch_that_does_not_fit_is_clamped_with_a_warning_the_plan_holds():
    """Planning warns no one: the plan holds the warning, which the fit stage issues (issue 79 item 5)."""
    problem = _problem()
    settings = KernelFitParameters(batch_size=50_000)
    layout = plan_eigenpro3_layout(problem, 100 * MB, CPU, settings)
    assert layout.memory_limit < 50_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_eigenpro3(layout, 50_000, math.inf, settings)
    assert plan.batch_size == layout.memory_limit
    assert plan.memory.fits()
    assert len(plan.warnings) == 1 and "batch_size=50000 does not fit" in plan.warnings[0]
    assert plan_eigenpro3(layout, 64, math.inf, settings).warnings == ()


def test_the_fit_issues_the_warning_of_a_clamped_batch():
    X = np.random.RandomState(0).randn(20_000, 3)
    parameters = {"bandwidth": 1.0, "alpha": 0.0, "n_centers": 500, "solver": "eigenpro", "n_epochs": 1}
    model = AdaptiveKernelRegressor(**parameters, batch_size=20_000, memory_budget="8MB", random_state=0)
    with pytest.warns(UserWarning, match="does not fit memory_budget next to the fixed costs; using"):
        model.fit(X, X[:, 0])
    assert model.batch_size_ < 1000


@pytest.mark.parametrize(
    ("budget", "changes", "settings", "message"),
    [
        (500 * MB, {}, {"cache_kernel": True}, "cache_kernel=True"),
        (2000 * MB, {"streamed": True}, {"cache_kernel": True}, "streamed"),
        (70 * MB, {}, {"projection": "exact"}, "projection='exact'"),
        (30 * MB, {}, {}, "too small for EigenPro 3"),
    ],
)
def test_eigenpro3_requests_that_do_not_fit_are_refused(budget, changes, settings, message):
    with pytest.raises(ValueError, match=message):
        plan_eigenpro3_layout(_problem(**changes), budget, CPU, KernelFitParameters(**settings))


@pytest.mark.parametrize(
    ("budget", "settings"),
    [(500 * MB, {"cache_kernel": True}), (70 * MB, {"projection": "exact"}), (30 * MB, {})],
    ids=["cache", "exact projection", "minimal batch"],
)
def test_a_refused_budget_is_named_as_the_user_set_it_with_the_rows_held_on_the_device(budget, settings):
    """The planners get what the rows held on the device leave; the message names ``memory_budget`` itself."""
    held = 7 * MB
    with pytest.raises(ValueError) as refused:
        plan_eigenpro3_layout(_problem(held_bytes=held), budget - held, CPU, KernelFitParameters(**settings))
    message = str(refused.value)
    assert f"memory_budget={budget} bytes" in message
    assert message.endswith(f"The training rows the fit holds on the device take {held} bytes of it.")


def test_choices_decided_elsewhere_are_followed():
    problem = _problem()
    layout = plan_eigenpro3_layout(problem, 2000 * MB, CPU, KernelFitParameters(), choices=(False, False, True))
    assert layout.choices == (False, False, True)
    assert dict(layout.reserved) == {"K(Z, Z) cache": layout.memory.center_cache_bytes}


# (name, budget, n, d, outputs, itemsize, settings, expected subsample size)
EIGENPRO2_CASES = [
    ("auto subsample", 1000 * MB, 20_000, 20, 1, 4, {}, 2000),
    ("large n", 4000 * MB, 200_000, 10, 1, 4, {}, 5000),
    ("tiny n", 100 * MB, 300, 5, 3, 8, {}, 300),
    ("given subsample", 1000 * MB, 20_000, 20, 10, 4, {"subsample_size": 500}, 500),
    ("tight budget", 160 * MB, 20_000, 784, 10, 4, {}, 2000),
]


@pytest.mark.parametrize(
    ("budget", "n", "d", "outputs", "itemsize", "settings", "subsample"),
    [case[1:] for case in EIGENPRO2_CASES],
    ids=[case[0] for case in EIGENPRO2_CASES],
)
@pytest.mark.parametrize("capacity", [1, 256, "memory limit"])
def test_eigenpro2_plan(budget, n, d, outputs, itemsize, settings, subsample, capacity):
    problem = KernelProblem(n, d, outputs, itemsize, extra_blocks=1)
    layout = plan_eigenpro2_layout(problem, budget, CPU, KernelFitParameters(**settings))
    assert layout.subsample_size == subsample
    capacity = min(layout.memory_limit if capacity == "memory limit" else capacity, n)
    plan = plan_eigenpro2(layout, capacity, 1e6, KernelFitParameters(**settings))
    # Steps that read a cached kernel keep 32 updates per epoch.
    expected = min(capacity, cached_batch_limit(n)) if layout.cached else capacity
    assert plan.batch_size == expected
    assert plan.memory.total <= budget, plan.memory.describe()
    # The operating batch keeps half the preconditioned critical batch.
    assert plan_eigenpro2(layout, capacity, 10.0, KernelFitParameters(**settings)).batch_size == min(expected, 5)


def test_cached_batch_limit_keeps_32_updates_per_epoch():
    assert cached_batch_limit(54_000) == 1688
    assert cached_batch_limit(2293) == 72
    assert cached_batch_limit(20) == 1
    problem = _eigenpro2_problem()
    cached = plan_eigenpro2_layout(problem, 2000 * MB, CPU, KernelFitParameters())
    plan = plan_eigenpro2(cached, cached.memory_limit, 1e6, KernelFitParameters())
    assert cached.cached and plan.capacity == problem.n_rows and plan.batch_size == 625
    # A given batch is the user's.
    assert plan_eigenpro2(cached, 4096, 1e6, KernelFitParameters(batch_size=4096)).batch_size == 4096


def test_operating_batch():
    assert operating_batch(256, 1e4, 10**6) == 256
    assert operating_batch(256, 100.0, 10**6) == 50
    assert operating_batch(256, 1e4, 100) == 100
    assert operating_batch(256, 0.5, 100) == 1
    assert operating_batch(256, math.inf, 100) == 100


def test_training_memory_plan_keeps_blocks_within_the_budget():
    n, d, n_outputs, s, itemsize = 10_000, 50, 3, 500, 4
    budget = 64 * 2**20
    plan = TrainingMemoryPlan(KernelProblem(n, d, n_outputs, itemsize, extra_blocks=1), budget, CPU, s)
    batch = plan.max_batch()
    assert 1 <= batch <= n
    assert plan.fixed_bytes + plan.batch_bytes(batch) <= budget
    if batch + 1 <= n:
        assert plan.fixed_bytes + plan.batch_bytes(batch + 1) > budget
    roomy = TrainingMemoryPlan(KernelProblem(n, d, n_outputs, itemsize, extra_blocks=0), 10**12, CPU, s)
    assert roomy.max_batch() == n
    assert roomy.column_block(256) == 2048  # cache-sized on the CPU


def test_temporary_center_count_balances_kernel_work_and_projection_cost():
    def problem(p, d, outputs):
        return KernelProblem(10**6, d, outputs, 4, n_centers=p)

    # Exact: two reads of the 8 p^2-byte factor at 16 flops per byte, 2 (d + l) flops
    # per row and temporary center: t = sqrt(256 p^2 / (d + l)) = p sqrt(256 / 794).
    assert temporary_centers_for(problem(10_000, 784, 10), "exact", False) == int(10_000 * math.sqrt(256 / 794))
    # Few features: the projection is dear next to a kernel row, t is capped at p.
    assert temporary_centers_for(problem(20_000, 16, 1), "exact", False) == 20_000
    # Inexact: 100 passes over K(Z, Z), capped at p / 2.
    assert temporary_centers_for(problem(1_000, 784, 10), "iterative", True) == 500


def test_memory_account_sums_its_items():
    account = MemoryAccount(100, (("data", 30), ("cache", 50))).with_item("batch", 10)
    assert account.total == 90 and account.fits() and account["cache"] == 50 and account["missing"] == 0
    assert not account.with_item("more", 11).fits()
    assert account.describe() == "memory data 30 B + cache 50 B + batch 10 B = 90 B of 100 B"


@pytest.mark.parametrize(
    ("case", "problem", "budget", "solver", "expected"),
    [
        ("factors fit", KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000), 10**8, "auto", "cg"),
        ("factors do not fit", KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000), 10**7, "auto", "eigenpro"),
        ("sharded centers", KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000, n_shards=2), 10**9, "auto", "eigenpro"),
        ("streamed data", KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000, streamed=True), 10**9, "auto", "eigenpro"),
        ("asked for", KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000), 10**7, "eigenpro", "eigenpro"),
    ],
)
def test_centers_solver_table(case, problem, budget, solver, expected):
    assert plan_centers_solver(problem, budget, solver) == expected, case
    layout = plan_centers_cg(problem, budget)
    assert layout.account["K(Z, Z) factors (float64)"] == 16 * 1000**2
    # CG stores K(X, Z) (10000 x 1000 float32, 40 MB) whenever it is chosen here.
    assert layout.cached == (expected == "cg")
    assert layout.account["K(X, Z) stored"] == (40_000_000 if expected == "cg" else 0)
    assert layout.account.fits() or expected == "eigenpro"


def test_centers_solver_stores_k_xz_only_where_it_fits():
    # 10000 rows x 1000 centers: data 0.48 MB + factors 16 MB + row block 16.4 MB = 32.9 MB
    # without K(X, Z), 72.9 MB with it (40 MB in float32).
    problem = KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000)
    assert plan_centers_solver(problem, 50_000_000, "auto") == "eigenpro"
    assert plan_centers_solver(problem, 50_000_000, "cg") == "cg"
    asked = plan_centers_cg(problem, 50_000_000, required=True)
    assert not asked.cached and asked.account.fits()
    assert asked.account.total == 480_000 + 16_000_000 + 2048 * 1000 * 8
    assert plan_centers_solver(problem, 73_000_000, "auto") == "cg"
    stored = plan_centers_cg(problem, 73_000_000, required=True)
    assert stored.cached
    assert stored.account.total == asked.account.total + 40_000_000 <= 73_000_000


def test_centers_solver_cg_that_cannot_run_is_an_error():
    problem = KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000)
    with pytest.raises(ValueError, match=r"solver='cg' needs memory .* more than memory_budget"):
        plan_centers_solver(problem, 10**7, "cg")
    with pytest.raises(ValueError, match="one device with the data in memory"):
        plan_centers_solver(KernelProblem(10_000, 10, 1, 4, 1, n_centers=1000, n_shards=2), 10**9, "cg")


@pytest.mark.parametrize(
    "case, n_rows, budget, solver, alpha, expected",
    [
        ("penalised, small, fits: CG with K's own factor", 5000, 10**9, "auto", 0.1, "cg"),
        ("no penalty: EigenPro 2's early-stopped iterates", 5000, 10**9, "auto", 0.0, "eigenpro"),
        (
            "above the row limit: CG with a subsample preconditioner",
            FULL_KERNEL_CG_MAX_ROWS + 1,
            10**10,
            "auto",
            0.1,
            "cg",
        ),
        ("above the row limit, no penalty", FULL_KERNEL_CG_MAX_ROWS + 1, 10**10, "auto", 0.0, "eigenpro"),
        ("16 n^2 bytes do not fit", 5000, 10**8, "auto", 0.1, "eigenpro"),
        ("asked for CG without a penalty: the interpolant", 5000, 10**9, "cg", 0.0, "cg"),
        ("asked for CG above the row limit", FULL_KERNEL_CG_MAX_ROWS + 1, 10**10, "cg", 0.1, "cg"),
        ("asked for EigenPro", 5000, 10**9, "eigenpro", 0.1, "eigenpro"),
    ],
)
def test_full_kernel_solver_table(case, n_rows, budget, solver, alpha, expected):
    problem = KernelProblem(n_rows, 10, 1, 4, 1)
    assert plan_full_kernel_solver(problem, budget, solver, alpha) == expected, case


def test_full_kernel_cg_that_does_not_fit_is_an_error():
    with pytest.raises(ValueError, match=r"solver='cg' needs memory .* more than memory_budget"):
        plan_full_kernel_solver(KernelProblem(5000, 10, 1, 4, 1), 10**8, "cg", 0.1)


ALPHA_CASES = [
    # (alpha, uses_centers, solver resolved so far, classifier, weighted) -> plan
    (0.3, False, "eigenpro", False, False, ("given", 0.3)),
    (0.0, True, "cg", True, True, ("given", 0.0)),
    ("auto", True, "eigenpro", False, False, ("zero", None)),  # EigenPro 3 has no penalty
    ("loo", True, "eigenpro", False, False, ("zero", None)),
    ("auto", True, "cg", True, False, ("loo", 0.0)),  # CG needs a penalty: always scored
    ("loo", False, "eigenpro", True, False, ("loo", 0.0)),  # asked for: always scored
    # Where the features cover the kernel, by misclassifications for the classifier.
    ("auto", False, "eigenpro", True, False, ("loo", 0.95)),
    ("auto", False, "eigenpro", False, False, ("loo", 0.95)),
    # Weights act only through a penalty: the classifier's is always scored.
    ("auto", False, "eigenpro", True, True, ("loo", 0.0)),
    ("auto", False, "eigenpro", False, True, ("loo", 0.95)),
    # CG on every point (asked for) is planned as the default; the policy's
    # needs_penalty takes the criterion's alpha below the coverage bound.
    ("auto", False, "cg", False, False, ("loo", 0.95)),
    ("auto", False, "auto", False, False, ("loo", 0.95)),
    (0.5, False, "cg", False, False, ("given", 0.5)),
]


@pytest.mark.parametrize("alpha", [0, 0.0, -1.0])
def test_cg_on_every_point_without_a_penalty_is_refused(alpha):
    with pytest.raises(ValueError, match=r"solver='cg' .* needs alpha > 0; got alpha="):
        plan_alpha(alpha, False, "cg")


@pytest.mark.parametrize(("alpha", "uses_centers", "solver", "classifier", "weighted", "expected"), ALPHA_CASES)
def test_alpha_plan_table(alpha, uses_centers, solver, classifier, weighted, expected):
    assert plan_alpha(alpha, uses_centers, solver, classifier, weighted) == expected


# (n_centers, solver asked, alpha) -> the policy's alpha mode, its coverage bound, needs_penalty
PENALTY_NEED_CASES = [
    (None, "auto", "auto", ("loo", 0.95, False)),  # early stopping regularises below the bound
    (None, "eigenpro", "auto", ("loo", 0.95, False)),
    (None, "cg", "auto", ("loo", 0.95, True)),  # CG on every point: the criterion's alpha below it too
    (None, "cg", 0.5, ("given", 0.0, True)),
    (500, "cg", "auto", ("loo", 0.0, True)),  # CG on centers: always scored
    (500, "eigenpro", "auto", ("zero", 0.0, False)),
]


@pytest.mark.parametrize(("n_centers", "solver", "alpha", "expected"), PENALTY_NEED_CASES)
def test_which_fits_need_a_penalty_whatever_the_criterion_coverage(n_centers, solver, alpha, expected):
    problem = KernelProblem(5_000, 8, 1, 4, 0, n_centers=n_centers)
    policy = plan_kernel_fit(problem, 10**10, KernelFitParameters(solver=solver, alpha=alpha))
    assert (policy.alpha_mode, policy.loo_min_coverage, policy.needs_penalty) == expected


# (alpha asked, the attempt's alpha and solver, on centers, held-out check, better beyond noise) -> refit
PENALISED_REFIT_CASES = [
    ("auto", 0.0, "eigenpro", False, True, False, True),  # interpolation did not pay
    ("auto", 0.0, "eigenpro", False, True, True, False),  # it paid
    ("auto", 0.0, "eigenpro", False, False, False, False),  # training rows cannot tell
    ("loo", 0.0, "eigenpro", False, True, False, True),
    (0.0, 0.0, "eigenpro", False, True, False, False),  # the user's alpha=0
    ("auto", 0.5, "eigenpro", False, True, False, False),  # already penalised
    ("auto", 0.0, "eigenpro", True, True, False, False),  # EigenPro 3 on centers has no penalty
    ("auto", 0.0, "cg", False, True, False, False),
]


@pytest.mark.parametrize(
    ("alpha", "attempt_alpha", "solver", "on_centers", "held_out", "better", "refit"), PENALISED_REFIT_CASES
)
def test_an_unpenalised_fit_not_better_than_trivial_on_held_out_rows_is_refit_with_a_penalty(
    alpha, attempt_alpha, solver, on_centers, held_out, better, refit
):
    check = FitCheck(300, 0.24, 0.24, 0.01, 0.0, True, held_out=held_out, better=better)
    assert refit_with_penalty(alpha, attempt_alpha, solver, on_centers, check) is refit


# EigenPro 2's kernel cache.  n = 20000, d = 20, one output: K(X, X) is 800 MB in
# float16, 1.6 GB in float32 and 3.2 GB in float64; the fixed costs and the blocks
# that fill the cache take under 100 MB.  float32 where it fits, float16 where only
# it fits (a float32 fit of a kernel bounded by 1), else blocks per batch.
# (name, budget, problem changes, settings, allow_16bit, expected bytes per cached entry)
EIGENPRO2_CACHE_CASES = [
    ("float32 where it fits", 2000 * MB, {}, {}, "auto", 4),
    ("float16 where only it fits", 1500 * MB, {}, {}, "auto", 2),
    ("float32 asked: blocks per batch", 1500 * MB, {}, {}, "float32", 0),
    ("float16 asked where float32 fits", 2000 * MB, {}, {}, "float16", 2),
    ("a kernel of unknown range is not halved", 1500 * MB, {"unit_bounded_kernel": False}, {}, "auto", 0),
    ("float64 fits keep float64", 4000 * MB, {"itemsize": 8}, {}, "auto", 8),
    ("float64 is not halved", 1500 * MB, {"itemsize": 8}, {}, "auto", 0),
    ("float64 fit, float32 cache asked", 2000 * MB, {"itemsize": 8}, {}, "float32", 4),
    ("too small: blocks per batch", 500 * MB, {}, {}, "auto", 0),
    ("validation rows counted", 900 * MB, {"n_validation": 5000}, {}, "auto", 0),
    ("without them float16 fits", 900 * MB, {}, {}, "auto", 2),
    ("cache_kernel=False", 2000 * MB, {}, {"cache_kernel": False}, "auto", 0),
    ("cache_kernel=True that fits", 2000 * MB, {}, {"cache_kernel": True}, "auto", 4),
]


def _eigenpro2_problem(**changes):
    sizes = {"n_rows": 20_000, "n_features": 20, "n_outputs": 1, "itemsize": 4, "extra_blocks": 1}
    sizes.update(unit_bounded_kernel=True)
    sizes.update(changes)
    return KernelProblem(**sizes)


@pytest.mark.parametrize(
    ("budget", "changes", "settings", "cache_dtype", "expected"),
    [case[1:] for case in EIGENPRO2_CACHE_CASES],
    ids=[case[0] for case in EIGENPRO2_CACHE_CASES],
)
def test_eigenpro2_cache_decisions(budget, changes, settings, cache_dtype, expected):
    problem = _eigenpro2_problem(**changes)
    layout = plan_eigenpro2_layout(problem, budget, CPU, KernelFitParameters(**settings, cache_dtype=cache_dtype))
    assert layout.cache_itemsize == expected
    assert layout.cached == (expected > 0)
    n_cached = problem.n_rows + problem.n_validation
    assert layout.cache_bytes == expected * n_cached * problem.n_rows
    for capacity in (64, layout.memory_limit):
        plan = plan_eigenpro2(layout, capacity, 1e6, KernelFitParameters(**settings, cache_dtype=cache_dtype))
        assert plan.cached == layout.cached and plan.cache_itemsize == expected
        assert plan.memory.total <= budget, plan.memory.describe()


@pytest.mark.parametrize(
    ("changes", "cache_dtype", "message"),
    [
        ({"itemsize": 4}, "float64", "wider than the training dtype"),
        ({"unit_bounded_kernel": False}, "float16", "values in"),
    ],
)
def test_a_cache_storage_that_cannot_hold_the_kernel_is_refused(changes, cache_dtype, message):
    settings = KernelFitParameters(cache_dtype=cache_dtype)
    with pytest.raises(ValueError, match=message):
        plan_eigenpro2_layout(_eigenpro2_problem(**changes), 2000 * MB, CPU, settings)


def test_kernel_cache_dtype_is_a_parameter_that_clone_keeps_and_the_fit_follows():
    from sklearn.base import clone

    from skgpu_kernel import AdaptiveKernelRegressor

    rng = np.random.RandomState(0)
    X, y = rng.randn(300, 3), rng.randn(300)
    model = clone(AdaptiveKernelRegressor(kernel_cache_dtype="float16", alpha=0.0, solver="eigenpro", n_epochs=1))
    assert model.kernel_cache_dtype == "float16"
    assert model.fit(X, y).kernel_cache_dtype_ == "float16"
    assert AdaptiveKernelRegressor(alpha=0.0, solver="eigenpro", n_epochs=1).fit(X, y).kernel_cache_dtype_ == "float32"


def test_eigenpro2_cache_that_does_not_fit_is_refused_when_required():
    with pytest.raises(ValueError, match=r"cache_kernel=True: K\(X, X\) for 20000 training rows and 5000 validation"):
        plan_eigenpro2_layout(
            _eigenpro2_problem(n_validation=5000), 900 * MB, CPU, KernelFitParameters(cache_kernel=True)
        )


@pytest.mark.parametrize(
    ("case", "n_rows", "budget", "sizes", "expected", "reason"),
    [
        ("K(X, X) fits", 1000, 10**9, {}, None, "K(X, X) fits memory_budget in 32-bit"),
        ("K(X, X) fits in float16 only", 20_000, 10**9, {}, None, "in 16-bit entries"),
        ("small enough to evaluate", 15_000, 10**7, {}, None, "n <= 20000"),
        ("lowered for CG to store K(X, Z)", 100_000, 10**9, {}, 2232, "= 3163, lowered to 2232 for CG"),
        ("10 sqrt(n), stored", 254_654, 12 * 10**9, {}, 5047, "= 5047"),
        ("too large to store: EigenPro 3", 1_000_000, 8 * 10**9, {}, 10_000, "of 2000 centers does not fit"),
        ("streamed", 5_000_000, 8 * 10**9, {"streamed": True}, 22_361, "X is streamed"),
        ("sharded", 100_000, 10**9, {"n_shards": 2}, 3163, "sharded over 2 devices"),
        ("at least 2000 centers", 30_000, 10**8, {}, 2000, "max(2000, 10 sqrt(n)) = 2000;"),
    ],
)
def test_auto_centers_table(case, n_rows, budget, sizes, expected, reason):
    problem = KernelProblem(n_rows, 20, 1, 4, 0, unit_bounded_kernel=True, **sizes)
    count = plan_auto_centers(problem, budget, torch.device("cpu"), KernelFitParameters())
    assert count.n_centers == expected, case
    assert reason in count.reason, case
    if expected is None:
        return
    choice = plan_centers_cg(dataclasses.replace(problem, n_centers=expected), budget)
    assert choice.cached == ("lowered" in reason or reason == "= 5047"), case
    if choice.cached:  # the memory account of what CG will hold is within the budget
        assert choice.account.fits() and choice.account["K(X, Z) stored"] == 4 * n_rows * expected
    if "lowered" in reason:  # the largest p that stores
        assert not plan_centers_cg(dataclasses.replace(problem, n_centers=expected + 1), budget).cached


def test_training_memory_plan_counts_the_grid_codes_and_their_int32_block():
    """Rows on a grid keep int8 codes (features padded to 8) and one int32 block per kernel block."""
    n, d, n_outputs, s, itemsize, n_validation = 10_000, 50, 3, 500, 4, 1_000
    plain = KernelProblem(n, d, n_outputs, itemsize, n_validation=n_validation)
    grid = KernelProblem(n, d, n_outputs, itemsize, extra_blocks=1, n_validation=n_validation, grid_codes=True)
    plans = [TrainingMemoryPlan(problem, 64 * 2**20, CPU, s) for problem in (plain, grid)]
    assert plans[1].fixed_bytes - plans[0].fixed_bytes == (n + n_validation) * 56
    assert plans[1].entry_bytes == 2 * plans[0].entry_bytes
    assert "grid codes" in dict(plans[1].items)
