"""Diagnostic: what the bandwidth search's cap costs and saves, and what the full data prefer.

Above ``BANDWIDTH_SEARCH_ROWS`` rows, ``bandwidth="auto"`` takes no bandwidth wider
than the scale rule: a subsample's leave-one-out criterion prefers wider bandwidths
than all rows need.  Two parts measure that choice on the real-data sets (issue 28):

``cap``: our defaults on ``--splits`` seeded splits (``bench_real_data.prepare``),
with the cap and without it (the search's ``widest=None``), test errors side by side.

``exact``: exact kernel ridge on every training row (float64 Cholesky, the training
mean as intercept) at ``--factors`` times the scale rule and ``--alphas``, test error
for each: the best the kernel machine can do at each bandwidth, whatever criterion
chooses it.  The ``n x n`` float64 matrix must fit in memory (HI: 17817 rows, 2.5 GB,
about a minute per alpha on 2 cores).

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/diagnose_bandwidth_cap.py cap --datasets HI BudgetFood --splits 3
    OPENBLAS_CORETYPE=Haswell python benchmarks/diagnose_bandwidth_cap.py exact --datasets HI --factors 0.707 1 1.41
"""

import argparse
import time

import numpy as np
import torch
from bench_real_data import _error, _task, our_estimator, prepare

import skgpu_kernel.fit.tune as tune
from skgpu_kernel.kernels import Gaussian, auto_bandwidth

_search = tune.select_bandwidth


def _fit(name, seed, capped):
    """Our defaults on one split, the search capped at the rule (as shipped) or not: a line of results."""
    X_train, y_train, X_test, y_test, _ = prepare(name, None, seed)
    task = _task(name)

    def search(*args, **kwargs):
        return _search(*args, **{**kwargs, "widest": kwargs["widest"] if capped else None})

    tune.select_bandwidth = search
    try:
        tic = time.perf_counter()
        model = our_estimator(task).fit(X_train, y_train)
        seconds = time.perf_counter() - tic
    finally:
        tune.select_bandwidth = _search
    selection = model.bandwidth_selection_
    error = _error(task, y_test, model.predict(X_test))
    return (
        f"factor {model.bandwidth_ / selection.scale:.3g}, alpha_ {model.alpha_:.3g}, "
        f"test error {error:.5g}, fit {seconds:.1f} s (search {selection.seconds:.1f} s)"
    )


def cap_part(args):
    for name in args.datasets:
        for seed in range(args.splits):
            capped, uncapped = _fit(name, seed, True), _fit(name, seed, False)
            print(f"{name} split {seed}: capped: {capped} | uncapped: {uncapped}", flush=True)


def exact_part(args):
    for name in args.datasets:
        if _task(name) != "regression":
            raise SystemExit(f"{name}: the exact part is for regression sets")
        X_train, y_train, X_test, y_test, _ = prepare(name, None, 0)
        scale = auto_bandwidth(X_train)
        X_train, X_test = (torch.as_tensor(X, dtype=torch.float64) for X in (X_train, X_test))
        intercept = float(np.mean(y_train))
        y = torch.as_tensor(y_train - intercept, dtype=torch.float64)[:, None]
        for factor in args.factors:
            kernel = Gaussian(bandwidth=scale * factor)
            gram, test_rows = kernel(X_train, X_train), kernel(X_test, X_train)
            errors = []
            for alpha in args.alphas:
                factor_l = torch.linalg.cholesky(gram + alpha * torch.eye(gram.shape[0], dtype=gram.dtype))
                predictions = (test_rows @ torch.cholesky_solve(y, factor_l))[:, 0].numpy() + intercept
                errors.append(_error("regression", y_test, predictions))
            scored = ", ".join(f"alpha {a:g}: {e:.5g}" for a, e in zip(args.alphas, errors, strict=True))
            print(f"{name} factor {factor:g} (bandwidth {scale * factor:.4g}): {scored}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["cap", "exact"])
    parser.add_argument("--datasets", nargs="+", default=["HI", "BudgetFood", "CPSSW8", "Fertility"])
    parser.add_argument("--splits", type=int, default=3, help="cap part: seeds 0, 1, ...")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.707, 0.841, 1.0, 1.19, 1.41])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.56, 1.0, 1.78, 3.16, 5.62])
    args = parser.parse_args()
    (cap_part if args.part == "cap" else exact_part)(args)


if __name__ == "__main__":
    main()
