"""The one epoch record and stopping component: the rule, the record, and one history_ schema everywhere."""

import os

import numpy as np
import pytest
import torch

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor, BufferedSGDClassifier, BufferedSGDRegressor
from skgpu_kernel.parallel import AdaptiveSGD, DataParallel, Parle
from skgpu_kernel.solvers.epochs import CORE_KEYS, EarlyStopping, epoch_record, format_record

needs_two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU workers need two cores")


# --- the stopping rule -----------------------------------------------------------------


def test_stops_after_n_iter_no_change_epochs_without_a_gain_above_tol():
    rule = EarlyStopping(tol=0.1, n_iter_no_change=3)
    # 1.0 gains on -inf; 1.05 and 1.1 do not gain more than 0.1 (a gain of exactly tol is no gain);
    # 1.25 gains on the best 1.1 and resets the count; then three epochs without a gain stop.
    decisions = [rule.should_stop(score) for score in (1.0, 1.05, 1.1, 1.25, 1.3, 1.2, 1.34)]
    assert decisions == [False, False, False, False, False, False, True]
    assert rule.best_score == 1.34


def test_a_gain_resets_the_count():
    rule = EarlyStopping(tol=0.0, n_iter_no_change=2)
    assert [rule.should_stop(score) for score in (1.0, 1.0, 2.0, 1.5, 1.5)] == [False, False, False, False, True]


def test_keeps_and_restores_the_best_state():
    rule = EarlyStopping(tol=0.0, n_iter_no_change=10)
    coef, intercept = torch.zeros(3, 1), torch.zeros(1)
    for score, value in ((0.5, 1.0), (0.9, 2.0), (0.7, 3.0)):
        coef.fill_(value)
        intercept.fill_(-value)
        rule.should_stop(score, (coef, intercept))
    rule.restore_best((coef, intercept))
    assert torch.all(coef == 2.0) and torch.all(intercept == -2.0)
    single = torch.full((2,), 7.0)
    rule = EarlyStopping(tol=0.0, n_iter_no_change=1)
    rule.should_stop(1.0, single)
    single.fill_(0.0)
    rule.restore_best(single)
    assert torch.all(single == 7.0)


def test_without_a_state_nothing_is_kept_or_restored():
    rule = EarlyStopping(tol=0.0, n_iter_no_change=1)
    rule.should_stop(-1.0)
    coef = torch.ones(2)
    rule.restore_best(coef)
    assert rule.best_state is None and torch.all(coef == 1.0)


def test_the_stop_is_logged():
    lines = []
    rule = EarlyStopping(tol=0.5, n_iter_no_change=1)
    rule.should_stop(1.0, log=lines.append)
    assert rule.should_stop(1.2, log=lines.append)
    assert lines == ["early stopping: no gain above tol=0.5 for 1 epochs"]


# --- the record ------------------------------------------------------------------------


def test_a_record_has_the_core_keys_first_then_the_extras():
    record = epoch_record(3, 120, 0.25, 0.01, 1.5, samples_per_second=80.0, bytes_all_reduced=64)
    assert tuple(record)[: len(CORE_KEYS)] == CORE_KEYS
    assert record["validation_score"] is None and record["bytes_all_reduced"] == 64
    line = format_record(record, 10)
    assert line.startswith("epoch 3/10: train loss 0.25, learning rate 0.01") and "80 samples/s" in line
    assert "validation" not in line and "\n" not in line
    scored = format_record(epoch_record(1, 5, 0.5, 0.1, 0.2, 0.75, io_wait_seconds=0.05), 2)
    assert "validation score 0.75" in scored and "I/O wait 0.05 of 0.20 s" in scored


# --- one history_ schema ---------------------------------------------------------------


def _data(n=600, d=5, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    return X, X @ np.array([2.0, -1.0, 1.5, 0.5, -2.0])[:d] + 0.1 * rng.randn(n)


ESTIMATORS = {
    "sgd regressor": lambda: BufferedSGDRegressor(batch_size=32, n_epochs=2, random_state=0),
    "sgd regressor, early stopping": lambda: BufferedSGDRegressor(
        batch_size=32, n_epochs=2, early_stopping=True, random_state=0
    ),
    "sgd classifier": lambda: BufferedSGDClassifier(batch_size=32, n_epochs=2, random_state=0),
    # alpha=0.0: the EigenPro 2 loop (alpha="auto" solves these small data by CG, which has no epochs to score)
    "kernel regressor": lambda: AdaptiveKernelRegressor(alpha=0.0, n_epochs=2, random_state=0),
    "kernel regressor, early stopping": lambda: AdaptiveKernelRegressor(
        alpha=0.0, n_epochs=2, early_stopping=True, random_state=0
    ),
    # solver="cg": "auto" solves these small data directly (no iterations, an empty history_).
    "kernel classifier": lambda: AdaptiveKernelClassifier(n_epochs=2, solver="cg", random_state=0),
    "kernel regressor, centers": lambda: AdaptiveKernelRegressor(n_centers=100, n_epochs=2, random_state=0),
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_reports_the_core_keys(name):
    X, y = _data()
    if "classifier" in name:
        y = (y > 0).astype(int)
    model = ESTIMATORS[name]().fit(X, y)
    assert model.history_
    validating = "early stopping" in name
    for epoch, record in enumerate(model.history_, start=1):
        assert set(CORE_KEYS) <= set(record)
        assert record["epoch"] == epoch and record["n_steps"] > 0 and record["seconds"] >= 0
        assert np.isfinite(record["train_loss"]) and np.isfinite(record["learning_rate"])
        assert (record["validation_score"] is not None) is validating
    assert model.history_[-1]["n_steps"] == getattr(model, "t_", model.history_[-1]["n_steps"])


def _ridge_optimum(X, y, alpha):
    """The least penalised training objective, and its penalty, in closed form (unpenalised intercept)."""
    n, d = X.shape
    centred, offset = X - X.mean(axis=0), y - y.mean()
    coef = np.linalg.solve(centred.T @ centred / n + alpha * np.eye(d), centred.T @ offset / n)
    residual = centred @ coef - offset
    return 0.5 * np.mean(residual**2) + 0.5 * alpha * coef @ coef, 0.5 * alpha * coef @ coef


@needs_two_cores
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [None, DataParallel(n_workers=2), Parle(n_workers=2), AdaptiveSGD(n_workers=2)], ids=str
)
def test_train_loss_includes_the_penalty_with_and_without_parallel(strategy):
    """With alpha = 1 the penalty is half of the optimum's objective: a train_loss without it would be far off.

    The last records' train_loss (losses measured before each step, around the optimum)
    is compared with the optimal objective, the same for every way of training.
    """
    X, y = _data(n=4000)
    optimum, penalty = _ridge_optimum(X, y, alpha=1.0)
    assert penalty > 0.4 * optimum
    params = {"alpha": 1.0, "batch_size": 64, "n_epochs": 15, "tol": None, "random_state": 0}
    model = BufferedSGDRegressor(parallel=strategy, **params).fit(X, y)
    late = np.mean([record["train_loss"] for record in model.history_[-5:]])
    assert optimum <= 1.1 * late and late <= 1.1 * optimum


@needs_two_cores
@pytest.mark.slow
def test_the_same_core_keys_with_and_without_parallel():
    X, y = _data(n=2000)
    params = {"batch_size": 64, "n_epochs": 2, "tol": None, "random_state": 0}
    single = BufferedSGDRegressor(**params).fit(X, y)
    for strategy in (DataParallel(n_workers=2), Parle(n_workers=2), AdaptiveSGD(n_workers=2)):
        parallel = BufferedSGDRegressor(parallel=strategy, **params).fit(X, y)
        for record in [*single.history_, *parallel.history_]:
            assert set(CORE_KEYS) <= set(record) and record["validation_score"] is None
        assert parallel.history_[-1]["n_steps"] == parallel.t_
