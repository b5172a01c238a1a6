"""Benchmark: how fit and predict times grow with the rows, ours against CatBoost and HistGradientBoosting.

One real table (``--dataset``, default FertilityMorekids: 254,654 rows, 8 columns, 6
of them factors) is split 80/20 once (``bench_real_data.prepare``: seeded, stratified
for a classifier, numeric columns standardised and factors one-hot encoded on the
training rows).  Its training rows, in the split's random order, are cut at each of
``--sizes`` (5k, 10k, 20k, 50k, 100k, 200k; sizes above the training rows are left
out), so each size is a seeded subsample and holds the smaller ones.  At each size
every model is fitted on those rows and predicts the same test rows (all of the
split's, ``--max-test`` at most):

* ``ours``: ``AdaptiveKernelRegressor`` / ``AdaptiveKernelClassifier(random_state=0)``,
  the package's defaults;
* ``CatBoost``: ``bench_real_data.CatBoostBaseline`` (defaults, ``thread_count`` = the
  machine's cores; left out where ``import catboost`` fails);
* ``HistGradientBoosting``: ``random_state=0``, its defaults.

Each cell is the median of ``--repeats`` fits (fit and predict timed separately, the
error of the first).  The table gives, per size and model, fit seconds, predict
seconds, the test error and our times as ratios of CatBoost's; below it, per model,
the slope of ``log(seconds)`` against ``log(rows)`` fitted by least squares over the
sizes from 10k to 200k (1: time proportional to the rows), for fit and for predict,
and our error as a ratio of CatBoost's at each size.  Run it alone: other processes
beside it move the times.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_growth.py [--dataset FertilityMorekids]
        [--sizes 5000 10000 ...] [--repeats 1] [--max-test 50000] [--results benchmarks/RESULTS.md]
"""

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_description, publish, table_header
from bench_real_data import (
    DATASETS,
    CatBoostBaseline,
    _error,
    _task,
    catboost_unavailable,
    our_estimator,
    prepare,
)

SIZES = (5_000, 10_000, 20_000, 50_000, 100_000, 200_000)
# The slope is fitted over the sizes within these bounds (the 10k to 200k).
SLOPE_ROWS = (10_000, 200_000)


def _models(task):
    """``{label: build()}`` of the models compared, ours first."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    boosting = HistGradientBoostingRegressor if task == "regression" else HistGradientBoostingClassifier
    models = {"ours": lambda: our_estimator(task)}
    if catboost_unavailable() is None:
        models["CatBoost"] = lambda: CatBoostBaseline(task)
    models["HistGradientBoosting"] = lambda: boosting(random_state=0)
    return models


def measure(build, X_train, y_train, X_test, y_test, task, repeats):
    """``{"fit", "predict", "error"}``: median fit and predict seconds over ``repeats`` fits, the first's error."""
    fits, predicts, error = [], [], None
    for _ in range(repeats):
        model = build()
        tic = time.perf_counter()
        model.fit(X_train, y_train)
        fits.append(time.perf_counter() - tic)
        tic = time.perf_counter()
        predicted = model.predict(X_test)
        predicts.append(time.perf_counter() - tic)
        if error is None:
            error = _error(task, y_test, predicted)
    return {"fit": float(np.median(fits)), "predict": float(np.median(predicts)), "error": error}


def log_slope(sizes, seconds):
    """Least-squares slope of ``log(seconds)`` on ``log(rows)`` over the sizes within ``SLOPE_ROWS``; NaN under 2."""
    low, high = SLOPE_ROWS
    points = [(math.log(n), math.log(s)) for n, s in zip(sizes, seconds, strict=True) if low <= n <= high]
    if len(points) < 2:
        return float("nan")
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


def _ratio(value, reference):
    return f"{value / reference:.2f}x" if reference else "-"


def table(results, sizes, labels):
    """The per-size rows and the slopes, as printed lines."""
    columns = ["rows"]
    for label in labels:
        columns += [f"{label} fit s", f"{label} predict s", f"{label} error"]
    has_catboost = "CatBoost" in labels
    if has_catboost:
        columns += ["ours / CatBoost fit", "ours / CatBoost predict", "ours / CatBoost error"]
    lines = table_header(columns)
    for n in sizes:
        cells = [f"{n}"]
        for label in labels:
            cell = results[label][n]
            cells += [f"{cell['fit']:.2f}", f"{cell['predict']:.3f}", f"{cell['error']:.5g}"]
        if has_catboost:
            ours, catboost = results["ours"][n], results["CatBoost"][n]
            cells += [_ratio(ours[key], catboost[key]) for key in ("fit", "predict", "error")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lo, hi = SLOPE_ROWS
    for label in labels:
        fit = log_slope(sizes, [results[label][n]["fit"] for n in sizes])
        predict = log_slope(sizes, [results[label][n]["predict"] for n in sizes])
        lines.append(f"- {label}: slope of log(fit s) on log(rows), {lo}-{hi} rows: {fit:.2f}; predict: {predict:.2f}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="FertilityMorekids", choices=DATASETS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-test", type=int, default=50_000)
    parser.add_argument("--results", default=None, help="append the table to this markdown file")
    args = parser.parse_args()

    X_train, y_train, X_test, y_test, info = prepare(args.dataset)
    X_test, y_test = X_test[: args.max_test], y_test[: args.max_test]
    sizes = [n for n in sorted(args.sizes) if n <= X_train.shape[0]]
    task = _task(args.dataset)
    models = _models(task)
    print(machine_description("cpu"))
    n_test, n_features = X_test.shape
    print(f"{args.dataset}: {info['n_train']} training rows, {n_test} test rows, {n_features} features")
    results = {label: {} for label in models}
    for n in sizes:
        for label, build in models.items():
            cell = measure(build, X_train[:n], y_train[:n], X_test, y_test, task, args.repeats)
            results[label][n] = cell
            timing = f"fit {cell['fit']:.2f} s, predict {cell['predict']:.3f} s"
            print(f"{n} rows, {label}: {timing}, error {cell['error']:.5g}")
            sys.stdout.flush()
    header = (
        f"**Growth** (`bench_growth.py --dataset {args.dataset}`, medians of {args.repeats}; "
        f"{machine_description('cpu')}; {X_test.shape[0]} test rows)\n"
    )
    publish(header + "\n".join(table(results, sizes, list(models))), args.results)


if __name__ == "__main__":
    main()
