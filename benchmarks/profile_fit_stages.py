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
    ("kernel fits (fit_kernel_model)", "fit/pipeline.py", "fit_kernel_model"),
    ("tune: bandwidth search", "regularization.py", "select_bandwidth"),
    ("tune: penalty (leave-one-out)", "regularization.py", "select_alpha"),
    ("tune: rows drawn for it", "fit/tune.py", "draw"),
    ("solve (run_solver, every path)", "fit/solve.py", "run_solver"),
    ("  EigenPro 2 loop", "eigenpro.py", "solve_eigenpro2"),
    ("  CG on every point", "full_kernel_cg.py", "solve_full_kernel_cg"),
    ("  CG on centers", "centers_cg.py", "solve_centers_cg"),
    ("  preconditioner", "preconditioner.py", "plan_preconditioner"),
    ("  capacity measured", "blockwise.py", "measure_batch_capacity"),
    ("  operator measured", "operators/core.py", "measure_operator"),
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
    """Counts host rows turned into tensors (every copy of rows to a device starts so), and passes over ``X``.

    A transfer is a numpy array with ``X``'s columns and more rows than columns
    given to ``torch.as_tensor``, ``torch.tensor``, ``torch.from_numpy`` or
    ``torch.asarray`` (the ``d x d`` metric and AGOP are not rows); a pass over
    ``X`` is one of at least half its rows.
    """

    NAMES = ("as_tensor", "tensor", "from_numpy", "asarray")

    def __init__(self, n_rows, n_features):
        self.n_rows, self.n_features, self.transfers, self.full_passes = n_rows, n_features, 0, 0

    def install(self):
        import torch

        originals = {name: getattr(torch, name) for name in self.NAMES}
        for name, convert in originals.items():
            setattr(torch, name, self._counted(convert))
        return originals

    def _counted(self, convert):
        def counted(data, *args, **kwargs):
            if isinstance(data, np.ndarray) and data.ndim == 2 and data.shape[1] == self.n_features:
                if data.shape[0] > self.n_features:
                    self.transfers += 1
                    self.full_passes += data.shape[0] >= 0.5 * self.n_rows
            return convert(data, *args, **kwargs)

        return counted

    @staticmethod
    def remove(originals):
        import torch

        for name, convert in originals.items():
            setattr(torch, name, convert)


def profile(name, params):
    X_train, y_train, _, _, _ = prepare(name)
    model = our_estimator(_task(name), **params)
    counter = TransferCounter(*X_train.shape)
    originals = counter.install()
    profiler = cProfile.Profile()
    tic = time.perf_counter()
    try:
        profiler.runcall(model.fit, X_train, y_train)
    finally:
        counter.remove(originals)
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
