"""Where a default kernel fit's time goes: a per-stage profile on the real-data benchmark's split.

Each data set is fitted once with the package defaults (``random_state=0``) under
``cProfile``, on the split and features of ``bench_real_data.py``.  The profile is
read per stage: the cumulative time of the functions that carry each stage out
(a stage's time includes the stages it calls, so rows overlap; "calls" is how often
the stage ran in the one fit).  Counters go with it: passes over ``X`` (host reads
of every training row: copies to a device and row gathers), transfers of rows to
the device, and the sizes and dtypes of the fit's eigendecompositions and Cholesky
factorisations (``torch.linalg.eigh`` / ``eigvalsh`` / ``cholesky_ex``), with their seconds.

``--tables`` profiles ``bench_tables.py``'s tables instead: the raw DataFrame
(factors as pandas categories) of split 0's training rows, as that benchmark's
"ours, categories" row fits it.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/profile_fit_stages.py --datasets DNA Computers Vowel HI
    OPENBLAS_CORETYPE=Haswell python benchmarks/profile_fit_stages.py --datasets DNA --tables HMDA CPS1988

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

# The torch.linalg decompositions whose calls, sizes and seconds the profile counts.
DECOMPOSITIONS = ("eigh", "eigvalsh", "cholesky_ex")

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
    ("  kernel cache filled (K(X, X))", "fit/operator.py", "_caches"),
    ("  last check", "solvers/fit_check.py", "check_fit"),
    ("  operator measured", "operators/core.py", "measure_operator"),
    ("feature learning: AGOP", "feature_learning.py", "_input_space_agop"),
    ("feature learning: held-out scoring", "feature_learning.py", "candidate"),
    ("predict after fit (PredictionTensors)", "blockwise.py", "predict"),
    *(
        (f"{name.removesuffix('_ex')} (torch.linalg)", "~", f"<built-in method torch._C._linalg.linalg_{name}>")
        for name in DECOMPOSITIONS
    ),
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


class FactorizationSizes:
    """The ``(kind, rows, dtype)`` of every ``torch.linalg`` decomposition a fit makes, and their seconds."""

    NAMES = DECOMPOSITIONS

    def __init__(self):
        self.seconds = {}

    def install(self):
        import torch

        originals = {name: getattr(torch.linalg, name) for name in self.NAMES}
        for name, factor in originals.items():
            setattr(torch.linalg, name, self._timed(name, factor))
        return originals

    def _timed(self, name, factor):
        def timed(matrix, *args, **kwargs):
            tic = time.perf_counter()
            result = factor(matrix, *args, **kwargs)
            key = (name, matrix.shape[-1], str(matrix.dtype).removeprefix("torch."))
            self.seconds.setdefault(key, []).append(time.perf_counter() - tic)
            return result

        return timed

    @staticmethod
    def remove(originals):
        import torch

        for name, factor in originals.items():
            setattr(torch.linalg, name, factor)

    def lines(self):
        """One line per (kind, size, dtype), the largest first."""
        lines = []
        for key in sorted(self.seconds, key=lambda key: (-key[1], key)):
            kind, size, dtype = key
            lines.append(f"{kind} {size} x {size} {dtype}: {len(self.seconds[key])} x, {sum(self.seconds[key]):.3f} s")
        return lines


def training_rows(name, tables=False):
    """``(X_train, y_train, task)``: the benchmark's prepared split, or ``bench_tables``'s raw frame of split 0."""
    if not tables:
        X_train, y_train, _, _, _ = prepare(name)
        return X_train, y_train, _task(name)
    from bench_tables import TABLES, load, split_indices

    table = TABLES[name]
    frame, y = load(table)
    train, _ = split_indices(table, y, 0)
    return frame.iloc[train], y[train], table.task


def profile(name, params, tables=False):
    X_train, y_train, task = training_rows(name, tables)
    model = our_estimator(task, **params)
    n_features = X_train.shape[1]
    if tables:  # the rows copied to the device are the encoded table's
        from skgpu_kernel.tables import fit_table_encoding

        n_features = fit_table_encoding(X_train).n_features_out
    counter = TransferCounter(X_train.shape[0], n_features)
    factorizations = FactorizationSizes()
    originals, factor_originals = counter.install(), factorizations.install()
    profiler = cProfile.Profile()
    tic = time.perf_counter()
    try:
        profiler.runcall(model.fit, X_train, y_train)
    finally:
        counter.remove(originals)
        factorizations.remove(factor_originals)
    seconds = time.perf_counter() - tic
    return seconds, stage_rows(pstats.Stats(profiler)), counter, X_train.shape, factorizations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="*", default=["DNA", "Computers", "Vowel", "HI"])
    parser.add_argument("--tables", nargs="*", default=[], help="bench_tables.py's tables to profile as well")
    parser.add_argument("--params", default="{}", help="estimator parameters as a Python dict literal")
    args = parser.parse_args()
    import ast

    params = ast.literal_eval(args.params)
    for name, tables in [(name, False) for name in args.datasets] + [(name, True) for name in args.tables]:
        seconds, rows, counter, shape, factorizations = profile(name, params, tables)
        kind = "table, raw DataFrame" if tables else "features"
        print(f"\n### {name} ({shape[0]} training rows, {shape[1]} {kind}): fit {seconds:.2f} s under cProfile")
        print(f"row transfers to the device: {counter.transfers}, of which passes over X: {counter.full_passes}")
        print("| stage | calls | seconds |\n|---|---:|---:|")
        for stage, calls, stage_seconds in rows:
            if calls:
                print(f"| {stage} | {calls} | {stage_seconds:.3f} |")
        print("factorisations (size, dtype: count, seconds):")
        for line in factorizations.lines():
            print(f"- {line}")


if __name__ == "__main__":
    main()
