"""Where a default kernel fit's time goes: a per-stage profile on the real-data benchmark's split.

Each data set is fitted once with the package defaults (``random_state=0``) under
``cProfile``, on the split and features of ``bench_real_data.py``.  The profile is
read per stage: the cumulative time of the functions that carry each stage out
(a stage's time includes the stages it calls, so rows overlap; "calls" is how often
the stage ran in the one fit).  Two counters go with it: passes over ``X`` (host
reads of every training row: copies to a device and row gathers) and transfers of
rows to the device.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/profile_fit_stages.py --datasets DNA Computers Vowel HI

Run it alone: a second process on the machine moves every time.
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real_data import _task, our_estimator, prepare

# (stage, module path fragment, function name): the functions whose cumulative time is the stage's.
STAGES = (
    ("whole fit", "kernel_machines.py", "fit"),
    ("kernel fits (fit_kernel_model)", "kernel_fit.py", "fit_kernel_model"),
    ("tune: bandwidth search", "regularization.py", "select_bandwidth"),
    ("tune: penalty (leave-one-out)", "regularization.py", "select_alpha"),
    ("tune: rows drawn for it", "kernel_fit.py", "draw"),
    ("solve (run_solver, every path)", "kernel_paths.py", "run_solver"),
    ("  EigenPro 2 loop", "eigenpro.py", "fit_eigenpro"),
    ("  CG on every point", "full_kernel_cg.py", "fit_full_kernel_cg"),
    ("  CG on centers", "centers_cg.py", "fit_centers_cg"),
    ("  preconditioner", "preconditioner.py", "plan_preconditioner"),
    ("  capacity measured", "blockwise.py", "measure_batch_capacity"),
    ("  operator measured", "operators.py", "measure_operator"),
    ("feature learning: AGOP", "feature_learning.py", "_input_space_agop"),
    ("feature learning: held-out scoring", "feature_learning.py", "candidate"),
    ("predict after fit (PredictionTensors)", "blockwise.py", "predict"),
    ("eigh (torch.linalg)", "~", "<built-in method torch._C._linalg.linalg_eigh>"),
    ("cholesky (torch.linalg)", "~", "<built-in method torch._C._linalg.linalg_cholesky_ex>"),
)


def stage_rows(stats):
    """``[(stage, calls, seconds)]`` from a ``pstats.Stats`` of one fit."""
    rows = []
    for stage, fragment, name in STAGES:
        calls, seconds = 0, 0.0
        for (filename, _, function), (_, primitive, _, cumulative, _) in stats.stats.items():
            if function == name and fragment in filename:
                calls += primitive
                seconds += cumulative
        rows.append((stage, calls, seconds))
    return rows


class TransferCounter:
    """Counts copies of rows of ``X`` to the device, and those of at least half its rows (passes over ``X``)."""

    def __init__(self, n_rows):
        self.n_rows, self.transfers, self.full_passes = n_rows, 0, 0

    def install(self):
        from skgpu_kernel import blockwise

        original = blockwise.DeviceCopier.__call__
        counter = self

        def counted(copier, array, center=True):
            if center:  # rows of X (targets and weights are copied with center=False)
                counter.transfers += 1
                counter.full_passes += array.shape[0] >= 0.5 * counter.n_rows
            return original(copier, array, center)

        blockwise.DeviceCopier.__call__ = counted
        return original


def profile(name, params):
    X_train, y_train, _, _, _ = prepare(name)
    model = our_estimator(_task(name), **params)
    counter = TransferCounter(X_train.shape[0])
    original = counter.install()
    profiler = cProfile.Profile()
    tic = time.perf_counter()
    try:
        profiler.runcall(model.fit, X_train, y_train)
    finally:
        from skgpu_kernel import blockwise

        blockwise.DeviceCopier.__call__ = original
    seconds = time.perf_counter() - tic
    return seconds, stage_rows(pstats.Stats(profiler)), counter, X_train.shape


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["DNA", "Computers", "Vowel", "HI"])
    parser.add_argument("--params", default="{}", help="estimator parameters as a Python dict literal")
    args = parser.parse_args()
    import ast

    params = ast.literal_eval(args.params)
    for name in args.datasets:
        seconds, rows, counter, shape = profile(name, params)
        print(f"\n### {name} ({shape[0]} training rows, {shape[1]} features): fit {seconds:.2f} s under cProfile")
        print(f"row transfers to the device: {counter.transfers}, of which passes over X: {counter.full_passes}")
        print("| stage | calls | seconds |\n|---|---:|---:|")
        for stage, calls, stage_seconds in rows:
            if calls:
                print(f"| {stage} | {calls} | {stage_seconds:.3f} |")
    np.set_printoptions()


if __name__ == "__main__":
    main()
