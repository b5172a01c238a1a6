"""Probe (not a default): the learning path's candidates on at most M rows, the kept model refitted on every row.

Issue 80 item 1's question: how few rows the learning path's candidates can be fitted
and compared on before the accuracy bound breaks.  ``plan_learning_rows`` (as
feature learning imports it) is capped at ``M``; everything else is the default fit.
Prints, per set, the training rows, M, fit and predict seconds and the test error
on ``bench_pace.py``'s seed-0 split (one fit each).  Run it alone.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/probe_learning_rows.py 5000 [--sets HI ...] [--tables CPS1988 ...]
"""

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_growth import measure
from bench_pace import set_rows, table_rows
from bench_real_data import our_estimator

import skgpu_kernel.fit.feature_learning as feature_learning


def capped_learning_rows(cap):
    """Make feature learning fit its candidates on at most ``cap`` rows (the rest only in the final fit)."""
    planned = feature_learning.plan_learning_rows

    def plan_learning_rows(n_samples, n_centers, n_iter):
        return min(planned(n_samples, n_centers, n_iter), cap)

    feature_learning.plan_learning_rows = plan_learning_rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cap", type=int)
    parser.add_argument("--sets", nargs="*", default=["HI", "BudgetFood", "VietNamI"])
    parser.add_argument("--tables", nargs="*", default=["CPS1988", "VietNamI", "PSID7682"])
    args = parser.parse_args()
    capped_learning_rows(args.cap)
    work = [(name, set_rows) for name in args.sets] + [(f"table:{name}", table_rows) for name in args.tables]
    for label, rows_of in work:
        X_train, y_train, X_test, y_test, task, _ = rows_of(label.removeprefix("table:"))
        cell = measure(functools.partial(our_estimator, task), X_train, y_train, X_test, y_test, task, 1)
        seconds = f"{cell['fit']:.2f} | {cell['predict']:.3f}"
        print(f"| {label} | {len(y_train)} | {args.cap} | {seconds} | {cell['error']:.5g} |", flush=True)


if __name__ == "__main__":
    main()
