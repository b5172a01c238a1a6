"""The stress problems of ``tests/test_solver_stress.py``: what each solver did, for a before/after table.

Usage (alone; about a minute)::

    OPENBLAS_CORETYPE=Haswell python benchmarks/stress_table.py
    cd /tmp && OPENBLAS_CORETYPE=Haswell PYTHONPATH=/work/base python /work/main/benchmarks/stress_table.py

The second form runs the same problems on another checkout of the package (the
problems come from this checkout's tests).  One Markdown row per fit: the solver
asked for and the one that made the model, the attempts and divergence events
recorded, the test error against the trivial predictor's (the training mean), the
relative distance to the exact penalised solution where the solver claims it, and
the verdict: ``converged`` (one attempt, nothing recorded, no worse than the trivial
predictor, within the claimed tolerance of the exact solution), ``fallback taken``
(the same with attempts or divergence events recorded), ``bad model`` (worse than
the trivial predictor, or off the exact solution it claims), or ``error``.
"""

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_solver_stress as stress

import skgpu_kernel
import skgpu_kernel.planning.solver as planning_solver

FACTORED_ROWS = planning_solver.FULL_KERNEL_CG_MAX_ROWS


def _row(problem, solver, dtype, cache):
    planning_solver.FULL_KERNEL_CG_MAX_ROWS = 200 if solver == "cg every point" else FACTORED_ROWS
    label = f"| {problem} | {solver} | {dtype} | {cache} |"
    try:
        model, X, y, X_test, y_test = stress._fit(problem, solver, dtype, cache)
    except Exception as error:  # a row records what the old code raised
        return f"{label} | | | | | error: {type(error).__name__}: {str(error)[:80]} |"
    predictions = model.predict(X_test)
    trivial = np.mean((y.mean() - y_test) ** 2)
    ratio = np.mean((predictions - y_test) ** 2) / trivial
    runs = [attempt for attempt in model.fit_attempts_ if "alpha" in attempt]
    events = [attempt for attempt in model.fit_attempts_ if attempt.get("event") == "diverged"]
    tolerance = stress._exact_tolerance(model, problem, dtype)
    distance = ""
    off = False
    if tolerance is not None:
        exact = stress._exact_predictions(model, X, y, X_test)
        relative = np.linalg.norm(predictions - exact) / np.linalg.norm(exact - exact.mean())
        distance, off = f"{relative:.1e}", relative > tolerance
    if not np.all(np.isfinite(predictions)) or not stress._not_worse_than_trivial(predictions, y_test, y) or off:
        verdict = "bad model"
    elif len(runs) > 1 or events:
        verdict = "fallback taken"
    else:
        verdict = "converged"
    return f"{label} {model.solver_} | {len(runs)} | {len(events)} | {ratio:.3g} | {distance} | {verdict} |"


def main():
    print(f"skgpu_kernel from {Path(skgpu_kernel.__file__).parent}\n")
    print(
        "| problem | asked | dtype | cache | ran | attempts | step halvings | test MSE / trivial | to exact | verdict |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|---|")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in stress._cases():
            print(_row(*case.values), flush=True)


if __name__ == "__main__":
    main()
