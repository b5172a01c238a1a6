"""Issue 79 item 1: a solver run is planned once, by one call, before its solver runs, and never planned again.

Every function of every module of ``skgpu_kernel.planning`` is watched (a profile
hook on the package's planning files, so that no module or name is left out)
while fits on each solver path run.  Inside an attempt of the one fallback loop
(``fit.solve._run_attempt``), a planning function may run only under the run's one
planning call (``planning.run.plan_run``, or a registered solver's rule through
``planning.run.plan_registered_run``), and none may run once the solver has
started: a measurement, a layout or a batch decided inside an attempt outside that
call, or a plan changed while the solver runs, fails the test with its name.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

import skgpu_kernel
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

PLANNING = str(Path(skgpu_kernel.__file__).resolve().parent / "planning")
FIT = str(Path(skgpu_kernel.__file__).resolve().parent / "fit")
SOLVERS = str(Path(skgpu_kernel.__file__).resolve().parent / "solvers")
RUN_PLANNING = str(Path(PLANNING) / "run.py")


def _planning_calls_in_attempts(fit):
    """``[(planning function, why it is out of place)]`` for each planning call in an attempt outside ``plan_run``.

    Module-level planning functions only (a plan's own methods read the plan);
    nested functions count as their enclosing function's.
    """
    misplaced = []

    def stack_names(frame):
        names = []
        while frame is not None:
            names.append((frame.f_code.co_filename, frame.f_code.co_qualname))
            frame = frame.f_back
        return names

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PLANNING) or "." in code.co_qualname:
            return
        stack = stack_names(frame.f_back)
        in_attempt = any(path.startswith(FIT) and name == "_run_attempt" for path, name in stack)
        if not in_attempt or any(path.startswith(PLANNING) and "." not in name for path, name in stack):
            return  # outside an attempt, or called by a planning function (counted as that one's call)
        name = f"{Path(code.co_filename).stem}.{code.co_qualname}"
        if any(path.startswith(SOLVERS) and name.startswith("solve_") for path, name in stack):
            misplaced.append((name, "called while the solver runs"))
        elif not code.co_filename.startswith(RUN_PLANNING):
            misplaced.append((name, "called in an attempt outside the run's planning call (planning.run)"))

    sys.setprofile(profile)
    try:
        fit()
    finally:
        sys.setprofile(None)
    return misplaced


def _data(n_rows, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, (n_rows, 3))
    return X, np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.randn(n_rows)


FITS = {
    "eigenpro 2": dict(solver="eigenpro", alpha=0.0),
    "eigenpro 2, penalised, uncached": dict(solver="eigenpro", alpha=1e-2, cache_kernel=False),
    "cg on every point": dict(solver="cg", alpha=1e-2),
    "eigenpro 3": dict(solver="eigenpro", n_centers=100),
    "cg on centers": dict(solver="cg", n_centers=100, alpha=1e-3),
    "default": dict(),
}


@pytest.mark.parametrize("name", sorted(FITS))
def test_no_planning_in_an_attempt_outside_its_one_planning_call(name, monkeypatch):
    from skgpu_kernel.planning import solver as planning_solver

    # CG on every point beyond its factors' size: the subsample-preconditioned run, planned as the others are.
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)
    X, y = _data(600)
    parameters = dict(FITS[name], feature_learning=None, random_state=0, n_epochs=3, memory_budget=2**28)
    misplaced = _planning_calls_in_attempts(lambda: AdaptiveKernelRegressor(**parameters).fit(X, y))
    assert not misplaced, misplaced


def test_a_default_classifier_plans_each_run_once():
    X, y = _data(600, seed=1)
    labels = (y > np.median(y)).astype(int)
    misplaced = _planning_calls_in_attempts(lambda: AdaptiveKernelClassifier(random_state=0).fit(X, labels))
    assert not misplaced, misplaced


def test_the_fitted_run_is_the_attempts_plan():
    """The result's run plan is the one on the attempt that produced the model: one home for its decisions."""
    from skgpu_kernel.fit import solve as solve_stage

    X, y = _data(400)
    kept = []
    original = solve_stage.finished_model

    def finished(outcome, prepared, runtime):
        kept.append(outcome)
        return original(outcome, prepared, runtime)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solve_stage, "finished_model", finished)
        model = AdaptiveKernelRegressor(solver="eigenpro", alpha=0.0, feature_learning=None, random_state=0).fit(X, y)
    (outcome,) = kept
    run = outcome.attempt.plan.run
    assert run is not None and outcome.run is run and outcome.spectrum is run.spectrum
    assert model.batch_size_ == run.batch_size and model.subsample_size_ == run.layout.subsample_size
