"""Every stage of a fit survives out of device memory (issue 50), and the fit's record says what shrank.

Each case injects ``torch.OutOfMemoryError`` at the k-th call of the operator or
function one stage calls (the kernel cache fills of EigenPro 2, EigenPro 3 and CG on
centers, the preconditioner's Nystrom subsample, the AGOP of feature learning, the
validation scores, ``predict`` and an EigenPro step), as a CUDA device that is
shared or fragmented refuses an allocation the plan counted on.  The fit completes,
``fit_attempts_`` holds the event, and:

* where the stage keeps the plan (a block shrunk, a cache evaluated instead), the
  predictions are the undisturbed fit's up to float64 rounding: each row's
  prediction does not depend on the row block, and an evaluated block has the
  entries the cache would have held;
* where it changes a decision (a halved batch, a smaller subsample), the test error
  is within 2% of the undisturbed fit's and the record says what changed.

``benchmarks/oom_injection_table.py`` runs the same cases for the table in
``benchmarks/oom_injection_table.md``.
"""

import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import skgpu_kernel.fit.eigenpro as eigenpro_attempts
import skgpu_kernel.fit.feature_learning as feature_learning
import skgpu_kernel.operators as operators
import skgpu_kernel.operators.row_blocks as row_blocks
import skgpu_kernel.solvers.eigenpro as eigenpro
import skgpu_kernel.solvers.eigenpro3 as eigenpro3
from skgpu_kernel import AdaptiveKernelRegressor

# Predictions of a kept plan match within this (float64: rounding only).
KEPT_RTOL = 1e-10
# A changed decision keeps the test error within this fraction of the undisturbed fit's.
CHANGED_ERROR = 0.02


def smooth_problem(n, seed=0, d=5):
    """Rows uniform on [-1, 1]^d and a smooth target with noise; test rows from the same law."""
    rng = np.random.RandomState(seed)
    X, X_test = rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, (1000, d))

    def target(rows):
        return np.sin(3 * rows[:, 0]) + rows[:, 1] * rows[:, 2]

    return X, target(X) + 0.1 * rng.randn(n), X_test, target(X_test)


@dataclass(frozen=True)
class Case:
    """A stage, the fit that runs it, and where its k-th large product is refused.

    ``target.name`` is replaced by a wrapper whose ``k``-th call for which
    ``when(undisturbed_model, *args)`` holds raises the error; ``at_predict``: only
    while predicting (the fit undisturbed).  ``event`` is the record expected
    (``from`` and ``to`` as given, or checked by ``halved``: ``to == from // 2``).
    """

    stage: str
    params: dict
    target: object
    name: str
    k: int
    event: dict
    keeps_plan: bool
    n: int = 600
    at_predict: bool = False
    when: object = None
    extra: dict = field(default_factory=dict)


def _held_out(model, operator, *args, **kwargs):
    """Products of K(X_val, X): the held-out rows against every training row (EigenPro 2's centers)."""
    return operator.shape[1] == model.n_centers_ and operator.shape[0] < operator.shape[1]


BASE = {"bandwidth": 1.0, "dtype": "float64", "random_state": 0}
CASES = {
    "cache fill (EigenPro 2)": Case(
        "cache fill",
        {**BASE, "solver": "eigenpro", "alpha": 0.0, "batch_size": 64, "n_epochs": 4, "cache_kernel": True},
        operators.CachedOperator,
        "fill",
        1,
        {"solver": "eigenpro", "shrank": "K(X, X)", "from": "cached", "to": "evaluated"},
        keeps_plan=True,
    ),
    "cache fill (EigenPro 3)": Case(
        "cache fill",
        {**BASE, "solver": "eigenpro", "n_centers": 150, "batch_size": 64, "n_epochs": 3, "cache_kernel": True},
        operators.CenterShards,
        "cache",
        1,
        {"solver": "eigenpro", "shrank": "K(X, Z)", "from": "cached", "to": "evaluated"},
        keeps_plan=True,
    ),
    "cache fill (CG on centers)": Case(
        "cache fill",
        {**BASE, "solver": "cg", "alpha": 0.5, "n_centers": 150, "n_epochs": 60},
        row_blocks.CachedRowBlocks,
        "computed",
        1,
        {"solver": "cg", "shrank": "K(X, Z)", "from": "cached", "to": "evaluated"},
        keeps_plan=True,
    ),
    "direct solve": Case(
        "direct solve",
        {**BASE, "alpha": 0.1},
        torch.linalg,
        "cholesky_ex",
        1,
        {"solver": "direct", "shrank": "n x n system", "from": "in memory", "to": "iterative"},
        keeps_plan=False,
        when=lambda model, system, *args, **kwargs: system.shape == (model.n_centers_, model.n_centers_),
    ),
    "preconditioner subsample": Case(
        "preconditioner subsample",
        {**BASE, "solver": "eigenpro", "alpha": 0.1, "batch_size": 64, "n_epochs": 20, "subsample_size": 400},
        eigenpro_attempts,
        "plan_preconditioner",
        1,
        {"solver": "eigenpro", "shrank": "subsample_size", "from": 400, "to": 200},
        keeps_plan=False,
        n=1200,
    ),
    "agop": Case(
        "agop",
        {**BASE, "solver": "eigenpro", "alpha": 1e-3, "n_epochs": 6, "feature_learning": "diagonal"},
        feature_learning,
        "average_gradient_outer_product",
        1,
        {"solver": "eigenpro", "shrank": "AGOP row block"},
        keeps_plan=True,
        extra={"feature_learning_iter": 1},
    ),
    "validation": Case(
        "validation",
        {**BASE, "solver": "eigenpro", "alpha": 0.0, "batch_size": 64, "n_epochs": 5, "cache_kernel": False},
        operators.EvaluatedOperator,
        "matmul",
        2,
        {"solver": "eigenpro", "shrank": "validation row block"},
        keeps_plan=True,
        when=_held_out,
        extra={"early_stopping": True, "validation_fraction": 0.2},
    ),
    "predict": Case(
        "predict",
        {**BASE, "solver": "eigenpro", "alpha": 0.0, "batch_size": 64, "n_epochs": 3, "cache_kernel": False},
        operators.EvaluatedOperator,
        "matmul",
        1,  # the first block: on CUDA the 1000 rows are one block, so there is no second
        {"solver": "eigenpro", "shrank": "prediction row block"},
        keeps_plan=True,
        at_predict=True,
    ),
    "epoch batch (EigenPro 2)": Case(
        "epoch batch",
        {**BASE, "solver": "eigenpro", "alpha": 1e-2, "batch_size": 64, "n_epochs": 60},
        eigenpro,
        "_step",
        5,
        {"solver": "eigenpro", "shrank": "batch_size", "from": 64, "to": 32},
        keeps_plan=False,
        n=1200,
    ),
    "epoch batch (EigenPro 3)": Case(
        "epoch batch",
        {**BASE, "solver": "eigenpro", "alpha": 0.0, "n_centers": 300, "batch_size": 64, "n_epochs": 40},
        eigenpro3,
        "_residual_and_gradient",
        5,
        {"solver": "eigenpro", "shrank": "batch_size", "from": 64, "to": 32},
        keeps_plan=False,
        n=1200,
    ),
}


def refusing(original, k, when):
    """``original`` that raises a CUDA out-of-memory error at its ``k``-th call for which ``when(*args)`` holds."""
    calls = []

    def wrapper(*args, **kwargs):
        if when(*args, **kwargs):
            calls.append(None)
            if len(calls) == k:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return original(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Outcome:
    """The undisturbed and the disturbed model of a case, their test predictions and the disturbed record."""

    undisturbed: object
    disturbed: object
    predicted: np.ndarray
    expected: np.ndarray
    events: list
    test_mse: tuple


def _predict_event(message):
    """The event a prediction's warning tells: its first halving of the row block and the error."""
    first = re.search(r"went (\d+) -> (\d+)", message)
    reason = re.search(r"while predicting \((.*)\): the prediction row block", message)
    return {
        "stage": "predict",
        "solver": "eigenpro",
        "shrank": "prediction row block",
        "from": int(first.group(1)),
        "to": int(first.group(2)),
        "reason": reason.group(1),
    }


def run_case(case):
    """Fit (and predict) a case without and with the injected error."""
    X, y, X_test, y_test = smooth_problem(case.n)
    params = {**case.params, **case.extra}
    undisturbed = AdaptiveKernelRegressor(**params).fit(X, y)
    expected = undisturbed.predict(X_test)
    when = (lambda *args, **kwargs: True) if case.when is None else (lambda *a, **kw: case.when(undisturbed, *a, **kw))
    wrapper = refusing(getattr(case.target, case.name), case.k, when)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a refused EigenPro cache warns that the fit is planned again
        with pytest.MonkeyPatch.context() as patch:
            if not case.at_predict:
                patch.setattr(case.target, case.name, wrapper)
            disturbed = AdaptiveKernelRegressor(**params).fit(X, y)
            patch.setattr(case.target, case.name, wrapper)
            with warnings.catch_warnings(record=True) as told:
                warnings.simplefilter("always", RuntimeWarning)
                predicted = disturbed.predict(X_test)
    events = [entry for entry in disturbed.fit_attempts_ if entry.get("event") == "out_of_memory"]
    if case.at_predict:  # predicting changes no fitted attribute: a warning tells it instead
        assert not events, disturbed.fit_attempts_
        events = [
            _predict_event(str(warning.message)) for warning in told if "while predicting" in str(warning.message)
        ]
    mse = tuple(float(np.mean((values - y_test) ** 2)) for values in (expected, predicted))
    return Outcome(undisturbed, disturbed, predicted, expected, events, mse)


@pytest.mark.parametrize("name", CASES)
def test_each_stage_goes_on_smaller_after_out_of_memory_and_records_it(name):
    case = CASES[name]
    outcome = run_case(case)
    assert len(outcome.events) == 1, outcome.disturbed.fit_attempts_
    event = outcome.events[0]
    assert event["stage"] == case.stage
    assert {key: event[key] for key in case.event} == case.event
    assert "injected" in event["reason"]
    if "to" not in case.event:  # a block halved
        assert event["to"] == event["from"] // 2 and event["to"] >= 1
    if case.stage == "agop":  # the model compared is one in learnt features
        assert outcome.disturbed.feature_learning_iteration_ > 0
    if case.keeps_plan:
        expected = outcome.expected
        np.testing.assert_allclose(outcome.predicted, expected, rtol=KEPT_RTOL, atol=KEPT_RTOL * np.abs(expected).max())
    else:
        undisturbed_mse, disturbed_mse = outcome.test_mse
        assert abs(disturbed_mse - undisturbed_mse) <= CHANGED_ERROR * undisturbed_mse, outcome.test_mse


def test_the_record_places_each_event_after_the_run_it_happened_in():
    """A refused EigenPro 2 cache: the planned run, the event, then the run planned again without the cache."""
    outcome = run_case(CASES["cache fill (EigenPro 2)"])
    record = outcome.disturbed.fit_attempts_
    assert [entry.get("event") for entry in record] == [None, "out_of_memory", None]
    assert record[0]["reason"] == "planned" and record[2]["reason"].startswith("the kernel cache")
    # The solver is stamped where the events join the record, in the record's order of keys.
    assert list(record[1]) == ["event", "stage", "solver", "shrank", "from", "to", "reason"]
    assert record[1]["solver"] == record[0]["solver"] == "eigenpro"
    assert not outcome.disturbed.kernel_cached_ and outcome.disturbed.batch_size_ == 64


def test_a_smaller_subsample_is_a_new_attempt_planned_with_it():
    """Out of memory in the preconditioner's subsample: the model is the one planned with half of it, recorded."""
    case = CASES["preconditioner subsample"]
    outcome = run_case(case)
    record = outcome.disturbed.fit_attempts_
    assert [entry.get("event") for entry in record] == [None, "out_of_memory", None]
    assert record[2]["reason"].endswith("refit with subsample_size 200")
    X, y, X_test, _ = smooth_problem(case.n)
    planned = AdaptiveKernelRegressor(**{**case.params, **case.extra, "subsample_size": 200}).fit(X, y)
    np.testing.assert_array_equal(outcome.predicted, planned.predict(X_test))


def test_changed_decisions_show_in_the_fitted_attributes():
    subsample = run_case(CASES["preconditioner subsample"])
    assert subsample.undisturbed.subsample_size_ == 400 and subsample.disturbed.subsample_size_ == 200
    batch = run_case(CASES["epoch batch (EigenPro 2)"])
    assert batch.disturbed.batch_size_ == 32
    cg = run_case(CASES["cache fill (CG on centers)"])
    assert cg.undisturbed.kernel_cached_ and not cg.disturbed.kernel_cached_
