"""The BMGD planner against a table of cases, and its memory account against the budget.

In the style of Falkon's ``tests/test_dim_selectors.py``: each row gives the
problem, the device facts and the user's overrides, and the decisions the plan
must make; every row also checks that the plan's memory account fits the budget.
"""

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from skgpu_kernel.planning.sgd import (
    POLISH_HISTORY,
    POLISH_SMOOTHING,
    POLISH_TOLERANCE,
    PROBE_MAX_BATCH,
    SAMPLE_ROWS,
    PolishPlan,
    SGDProblem,
    ThroughputProbe,
    plan_bmgd,
    plan_buffers,
    plan_polish,
    step_spectrum,
)
from skgpu_kernel.scaling import ConstantRule, EigenProRule
from skgpu_kernel.splits import sample_ranges, validation_split

MB = 10**6


@dataclasses.dataclass(frozen=True)
class Case:
    """One planning problem and the decisions expected of it."""

    name: str
    budget: int
    n: int
    d: int
    outputs: int = 1
    itemsize: int = 4
    nonzeros_per_row: float | None = None
    weighted: bool = False
    device: str = "cuda"
    capacity: int = 4096
    spectrum: tuple = (50.0, 1.0)
    buffer_size: object = "auto"
    batch_size: object = "auto"
    n_rounds: int = 1
    # Expected decisions.
    expected_buffer: int = 0
    expected_resident: bool = False
    expected_batch: int = 0
    expected_warnings: tuple = ()


# fmt: off
CASES = [
    # Row bytes 10 * 4 + 8 = 48: all 10000 rows fit; the batch is max(m*, n / 64) = 157 < m_G.
    Case("resident on a large budget", 10**9, 10_000, 10, expected_buffer=10_000, expected_resident=True,
         expected_batch=157),
    # 150000 // (3 * 48) = 1041 rows per buffer.
    Case("buffer bound by the budget", 150_000, 10_000, 10, expected_buffer=1041, expected_batch=157),
    # The CPU caps a buffer at 64 MiB: 67108864 // 408 rows of 100 float32 and a target; m_G is the limit.
    Case("cpu buffer cap", 10 * 10**9, 10_000_000, 100, device="cpu", capacity=512, spectrum=(20.0, 1.0),
         expected_buffer=164_482, expected_batch=512),
    # The same problem on a GPU: only the budget limits the buffer.
    Case("no cap on a gpu", 10 * 10**9, 10_000_000, 100, device="cuda", capacity=512, spectrum=(20.0, 1.0),
         expected_buffer=8_169_934, expected_batch=512),
    Case("capacity below the critical batch", 10**9, 100_000, 10, capacity=1024, spectrum=(5000.0, 1.0),
         expected_buffer=100_000, expected_resident=True, expected_batch=1024),
    # m* = 10^6 is cut to the 200-row buffer.
    Case("critical batch above a buffer", 3 * 48 * 200, 10_000, 10, spectrum=(1e6, 1.0), expected_buffer=200,
         expected_batch=200),
    # lambda_1 = 0: m* is infinite and the buffer (all the data) bounds the useful batch.
    Case("flat spectrum", 10**9, 1000, 10, capacity=64, spectrum=(1.0, 0.0), expected_buffer=1000,
         expected_resident=True, expected_batch=64),
    # Sparse row: 10 * (16 + 8) + 16 bytes plus the target, 264; 10^6 // 792 = 1262 rows.
    Case("sparse rows", MB, 50_000, 100_000, itemsize=8, nonzeros_per_row=10.0, capacity=2048,
         spectrum=(30.0, 1.0), expected_buffer=1262, expected_batch=782),
    # 20 float64 + 3 targets + a weight: 192 bytes; 10^5 // 576 = 173 rows; m* = 5, n / 64 = 78.1.
    Case("weighted, three outputs, float64", 100_000, 5000, 20, outputs=3, itemsize=8, weighted=True,
         capacity=256, spectrum=(10.0, 2.0), expected_buffer=173, expected_batch=79),
    Case("user sizes", 10**9, 10_000, 10, buffer_size=2000, batch_size=100, expected_buffer=2000,
         expected_batch=100),
    Case("user sizes clamped", 10**9, 10_000, 10, buffer_size=20_000, batch_size=50_000, expected_buffer=10_000,
         expected_resident=True, expected_batch=10_000,
         expected_warnings=("buffer_size=20000 is larger than the 10000 rows of training data; using 10000.",
                            "batch_size=50000 is larger than the 10000 rows in a buffer; using 10000.")),
    Case("user batch clamped to the planned buffer", 150_000, 10_000, 10, batch_size=4096, expected_buffer=1041,
         expected_batch=1041,
         expected_warnings=("batch_size=4096 is larger than the 1041 rows in a buffer; using 1041.",)),
    Case("tiny data on the cpu", 10**9, 100, 5, device="cpu", capacity=32, spectrum=(2.0, 1.0),
         expected_buffer=100, expected_resident=True, expected_batch=2),
    Case("two rounds per buffer", 10**9, 10_000, 10, n_rounds=2, expected_buffer=10_000, expected_resident=True,
         expected_batch=157),
]
# fmt: on


def _plans(case):
    problem = SGDProblem(case.n, case.d, case.outputs, case.itemsize, case.nonzeros_per_row, case.weighted)
    buffers = plan_buffers(problem, case.budget, case.device, case.buffer_size, case.batch_size)
    probe = ThroughputProbe(case.capacity, {32: 1.0, case.capacity: 2.0}) if buffers.probe_max_batch else None
    plan = plan_bmgd(buffers, case.spectrum, probe, batch_size=case.batch_size, n_rounds=case.n_rounds, n_epochs=10)
    return buffers, plan


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_planner_decisions(case):
    buffers, plan = _plans(case)
    assert buffers.buffer_size == plan.buffer_size == case.expected_buffer
    assert plan.resident is case.expected_resident
    assert plan.batch_size == case.expected_batch
    assert plan.warnings == case.expected_warnings
    assert buffers.probe_max_batch == (
        min(case.expected_buffer, PROBE_MAX_BATCH) if case.batch_size == "auto" else None
    )
    assert (plan.probe is None) is (case.batch_size != "auto")
    assert plan.context.batch_size == plan.batch_size
    assert plan.context.steps_per_epoch == case.n_rounds * math.ceil(case.n / plan.batch_size)
    assert (plan.context.beta, plan.context.top_eigenvalue) == plan.spectrum == case.spectrum
    beta, top = case.spectrum
    assert plan.critical_batch_size == (beta / top if top > 0 else math.inf)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_memory_account_never_exceeds_the_budget(case):
    buffers, plan = _plans(case)
    assert plan.memory is buffers.memory
    assert plan.memory.budget == case.budget
    assert plan.memory.fits() and plan.memory.total <= case.budget
    # Two buffers and a batch gather, each a buffer's worth of rows (one buffer when resident).
    problem = SGDProblem(case.n, case.d, case.outputs, case.itemsize, case.nonzeros_per_row, case.weighted)
    assert plan.memory["buffer"] == int(plan.buffer_size * problem.row_bytes)
    assert plan.memory["batch gather"] == plan.memory["buffer"]
    assert plan.memory["next buffer"] == (0 if plan.resident else plan.memory["buffer"])
    assert plan.batch_size <= plan.buffer_size


def test_a_user_buffer_beyond_the_budget_is_honoured_and_shows_in_the_account():
    """An explicit buffer_size is used as given (only clamped to the data); the account says it does not fit."""
    problem = SGDProblem(10_000, 10, 1, 4)
    plan = plan_buffers(problem, budget=10_000, device_type="cuda", buffer_size=5000)
    assert plan.buffer_size == 5000 and not plan.memory.fits()


def test_a_budget_below_one_row_still_plans_one_row():
    plan = plan_buffers(SGDProblem(10_000, 10, 1, 4), budget=100, device_type="cuda")
    assert plan.buffer_size == 1 and plan.memory.total == 3 * 48


def test_plans_are_frozen_and_describe_themselves_in_one_line():
    buffers, plan = _plans(CASES[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch_size = 1
    line = plan.describe()
    assert "\n" not in line
    for fact in ("n=10000", "buffer 1041 rows", "10 per pass", "streamed", "batch 157", "critical batch 50.0", "R=1"):
        assert fact in line
    assert plan.memory.describe() in line and buffers.memory.describe() in buffers.describe()


def test_step_spectrum_scales_by_the_curvature_and_shifts_by_the_penalty():
    assert step_spectrum(10.0, 2.0, 1.0, 0.0) == (10.0, 2.0)
    assert step_spectrum(10.0, 2.0, 0.25, 1e-4) == (0.25 * 10.0 + 1e-4, 0.25 * 2.0 + 1e-4)


def test_throughput_probe_reports_its_largest_batch():
    assert ThroughputProbe(64, {32: 1.0, 64: 2.0, 128: 2.1}).largest_batch == 128
    assert ThroughputProbe(64).largest_batch is None


@pytest.mark.parametrize("n_train", [10, SAMPLE_ROWS, 5 * SAMPLE_ROWS + 3])
def test_sample_ranges_cover_up_to_sample_rows_distinct_rows(n_train):
    size = plan_buffers(SGDProblem(n_train, 10, 1, 4), 2**30, "cpu").sample_rows
    ranges = sample_ranges(n_train, size, np.random.RandomState(0))
    rows = np.concatenate([np.arange(start, stop) for start, stop in ranges])
    assert len(rows) == min(n_train, SAMPLE_ROWS) == len(np.unique(rows))
    assert rows.min() >= 0 and rows.max() < n_train


@pytest.mark.parametrize(("n_rows", "fraction"), [(10, 0.1), (1000, 0.1), (100_000, 0.25)])
def test_validation_split_partitions_the_rows(n_rows, fraction):
    train, validation = validation_split(n_rows, fraction, np.random.RandomState(0))
    held = sum(stop - start for start, stop in validation)
    assert math.ceil(fraction * n_rows) <= held < math.ceil(fraction * n_rows) + 1024
    covered = np.zeros(n_rows, dtype=int)
    for start, stop in [*train, *validation]:
        covered[start:stop] += 1
    assert np.all(covered == 1)


def test_validation_split_needs_a_training_row():
    with pytest.raises(ValueError, match="at least 2 samples"):
        validation_split(1, 0.5, np.random.RandomState(0))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("nonzeros_per_row", [None, 3.5])
@pytest.mark.parametrize("budget", [10**4, 10**6, 10**8, 10**10])
@pytest.mark.parametrize("n", [1, 999, 10**6])
def test_automatic_sizes_fit_any_budget_of_at_least_three_rows(device, nonzeros_per_row, budget, n):
    problem = SGDProblem(n, 300, 2, 4, nonzeros_per_row, weighted=True)
    assert budget >= 3 * problem.row_bytes
    buffers = plan_buffers(problem, budget, device)
    plan = plan_bmgd(buffers, (100.0, 3.0), ThroughputProbe(buffers.probe_max_batch, {}))
    assert plan.memory.total <= budget and 1 <= plan.batch_size <= plan.buffer_size <= n


# --- the full-batch polish (issue 78) ------------------------------------------------

_POLISHED = {
    "polish": "auto",
    "loss": "log_loss",
    "alpha": 1e-4,
    "fit_intercept": True,
    "scaling_rule": EigenProRule(step="optimal"),
    "early_stopping": False,
    "incremental": False,
}

# (what differs from a default fit of 1000 x 10 rows with a 1 GiB budget, polished)
PLAN_POLISH_CASES = [
    ({}, True),
    ({"loss": "squared_error"}, True),
    ({"scaling_rule": EigenProRule(step="eigenpro")}, True),
    ({"polish": None}, False),
    ({"scaling_rule": EigenProRule(step="optimal", decay="polynomial")}, False),  # the user's schedule
    ({"scaling_rule": ConstantRule(0.01)}, False),
    ({"loss": "hinge"}, True),  # through smoothed copies, in float64
    ({"loss": "huber"}, True),
    ({"alpha": 0.0}, False),  # no unique optimum, no certificate
    ({"early_stopping": True}, False),  # the model is chosen by the held-out score
    ({"incremental": True}, False),  # partial_fit: one pass
    ({"in_process": False}, False),  # a parallel strategy's model
    ({"n_train": 10**9}, False),  # three score matrices beyond the budget
]


@pytest.mark.parametrize(("change", "polished"), PLAN_POLISH_CASES, ids=[str(c[0]) for c in PLAN_POLISH_CASES])
def test_plan_polish_decisions(change, polished):
    change = dict(change)
    in_process = change.pop("in_process", True)
    n_train = change.pop("n_train", 1000)
    settings = SimpleNamespace(**{**_POLISHED, **change})
    problem = SGDProblem(n_train, 10, 1, 4)
    result = plan_polish(problem, plan_buffers(problem, 2**30, "cpu"), settings, in_process)
    assert (result is not None) is polished
    if polished:
        hinge = settings.loss == "hinge"
        smoothing = POLISH_SMOOTHING if hinge else None
        expected = PolishPlan(
            settings.alpha, True, POLISH_TOLERANCE, smoothing=smoothing, in_float64=hinge, rows_resident=True
        )
        assert result == expected


@pytest.mark.parametrize(("loss", "itemsize", "converted"), [("log_loss", 4, False), ("hinge", 8, True)])
def test_plan_polish_budget_boundaries(loss, itemsize, converted):
    """Beside the buffers: every row's scores and the rows kept (resident); a byte less, the SGD's buffers; less, none.

    The hinge's scores are float64, and a buffer of rows is converted to float64 at a time.
    """
    settings = SimpleNamespace(**{**_POLISHED, "loss": loss})
    n, problem = 10_000, SGDProblem(10_000, 10, 3, 4, weighted=True)
    buffers = plan_buffers(problem, 2**20, "cpu")  # streamed: a buffer below the rows
    scores = n * (3 * 3 * itemsize + 8 * 3 + 8) + 2 * POLISH_HISTORY * (10 + 1) * 3 * itemsize
    resident = scores + n * problem.row_bytes + converted * n * problem.row_bytes * 2
    streamed = scores + converted * buffers.buffer_size * problem.row_bytes * 2

    def planned(extra):
        budget = dataclasses.replace(buffers.memory, budget=buffers.memory.total + extra)
        return plan_polish(problem, dataclasses.replace(buffers, memory=budget), settings, True)

    assert buffers.buffer_size < n
    assert planned(resident).rows_resident
    assert not planned(resident - 1).rows_resident
    assert not planned(streamed).rows_resident
    assert planned(streamed - 1) is None
