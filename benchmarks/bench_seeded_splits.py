"""Benchmark: data sets over many seeded splits, ours against the baselines, paired by split.

On sets of 200-1500 rows one 80/20 split is too small a test set to rank models: on
Sonar (42 test rows) one error moves the error by 0.024, on Ionosphere (71) by 0.014;
on larger sets, differences of a fraction of a percent are within a split's noise.
Here every model of ``bench_real_data.py`` that is a target (our defaults, Nystroem +
ridge at the scale rule and with gamma tuned by a 3-fold grid, ``SVC()`` for
classification, linear ridge) is fitted on ``--splits`` 80/20 splits (stratified for
classification; the tuned search up to ``--tuned-max-train`` training rows, 20000 by
default as in ``bench_real_data.py``) (seeds 0, 1, ...; the same splits and
the same preprocessing for every model, ``bench_real_data.prepare``), and the table
gives each model's mean test error with its standard error, and our error minus the
best baseline's *paired by split*, with its standard error: a difference within about
two standard errors of 0 is not a difference these data can show.

Fits run in this process, one after the other (times are means over splits and
include the tuned model's search).  The default sets are the small classification
sets; any set of ``bench_real_data.py`` can be given (``--datasets HI --splits 5``).

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_seeded_splits.py [--splits 20] [--write benchmarks/RESULTS.md]
"""

import argparse
import time

import numpy as np
from _common import machine_description, publish
from bench_real_data import (
    _error,
    _task,
    build_linear,
    build_nystroem,
    build_nystroem_tuned,
    build_svc,
    our_estimator,
    prepare,
)

SMALL_SETS = ["Glass", "Sonar", "Ionosphere", "Vowel", "Vehicle", "DigitsImbalanced"]


def build_ours(X_train, task):
    """``AdaptiveKernelRegressor`` / ``AdaptiveKernelClassifier(random_state=0)``: the package defaults."""
    return our_estimator(task), lambda fitted: f"bandwidth_ {fitted.bandwidth_:.3g}, alpha_ {fitted.alpha_:.3g}"


OURS = "ours (defaults)"


def models(task, tuned):
    """The rows of a task: method name -> builder, ours first; ``tuned`` adds the gamma-tuned Nystroem."""
    ridge = "RidgeCV" if task == "regression" else "RidgeClassifierCV"
    rows = {OURS: build_ours, f"Nystroem(2000) + {ridge}": build_nystroem}
    if tuned:
        rows["Nystroem(2000) + ridge, gamma tuned (3-fold)"] = build_nystroem_tuned
    if task == "classification":
        rows["SVC()"] = build_svc
    rows[f"linear {ridge}"] = build_linear
    return rows


def split_errors(name, seed, tuned_max_train):
    """Every model's (test error, fit seconds) on one seeded split of ``name``."""
    X_train, y_train, X_test, y_test, info = prepare(name, seed=seed)
    task = _task(name)
    scores = {}
    for method, build in models(task, X_train.shape[0] <= tuned_max_train).items():
        model, _ = build(X_train, task)
        tic = time.perf_counter()
        model.fit(X_train, y_train)
        seconds = time.perf_counter() - tic
        scores[method] = (_error(task, y_test, model.predict(X_test)), seconds)
    return scores, info


def summarize(name, per_split, info):
    """Table rows of one set: each model's mean error and SE, and ours minus the best baseline, paired."""
    methods = list(per_split[0])
    errors = {method: np.array([split[method][0] for split in per_split]) for method in methods}
    seconds = {method: np.mean([split[method][1] for split in per_split]) for method in methods}
    k = len(per_split)
    best = min((method for method in methods if method != OURS), key=lambda method: errors[method].mean())
    difference = errors[OURS] - errors[best]
    difference_se = difference.std(ddof=1) / np.sqrt(k) if k > 1 else float("nan")
    size = f"{info['n']} ({info['n_train']} / {info['n_test']}, {info['n_features']})"
    lines = []
    for method in methods:
        se = errors[method].std(ddof=1) / np.sqrt(k) if k > 1 else float("nan")
        paired = f"{difference.mean():+.4g} ± {difference_se:.2g} vs {best}" if method == OURS else "-"
        ratio = errors[OURS].mean() / errors[best].mean() if method == OURS and errors[best].mean() > 0 else None
        lines.append(
            f"| {name} | {size} | {method} | {seconds[method]:.2f} | {errors[method].mean():.5g} ± {se:.2g} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} | {paired} |"
        )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=SMALL_SETS)
    parser.add_argument("--splits", type=int, default=20, help="seeded splits per data set (seeds 0, 1, ...)")
    parser.add_argument(
        "--tuned-max-train",
        type=int,
        default=20_000,
        help="largest training set for the gamma-tuned Nystroem search (as in bench_real_data.py)",
    )
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    tic = time.perf_counter()
    lines = [
        "| data set | n (train / test, features) | method | mean fit s | mean test error ± SE | "
        "ours / best baseline | ours - best baseline, paired ± SE |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for name in args.datasets:
        per_split = []
        for seed in range(args.splits):
            scores, info = split_errors(name, seed, args.tuned_max_train)
            per_split.append(scores)
            print(name, seed, {method: f"{error:.5g}" for method, (error, _) in scores.items()}, flush=True)
        lines += summarize(name, per_split, info)
    section = [
        f"### {', '.join(args.datasets)} over {args.splits} seeded splits — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description('cpu')}. Command: `OPENBLAS_CORETYPE=Haswell python "
        f"benchmarks/bench_seeded_splits.py --datasets {' '.join(args.datasets)} --splits {args.splits}`. 80/20 "
        f"splits (stratified for classification) with seeds 0..{args.splits - 1}, preprocessing as in "
        "`bench_real_data.py`; errors are 1 - accuracy or MSE, means over splits with their standard errors; the "
        "last column pairs our error with the best baseline's split by split.",
        "",
        *lines,
    ]
    text = "\n".join(section)
    publish(text, args.write)
    print(f"\nWhole benchmark: {time.perf_counter() - tic:.0f} s.")


if __name__ == "__main__":
    main()
