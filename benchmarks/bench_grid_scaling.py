"""Benchmark: tables on a grid, kept in their units (the planned rule) or standardized per column (issue 52, item 3).

``plan_column_scaling`` keeps a table's columns as they are when they share one
range, as images and integer scores do; per-column standardization would give every
column its own step, and the exact int8 kernel path needs one common step.  This
measures what keeping costs or saves against standardizing, on three tables whose
values lie on a grid:

- scikit-learn's digits (1797 x 64, integers 0-16), 5 seeded stratified 80/20 splits;
- mlbench's LetterRecognition (20000 x 16, integers 0-15), 3 seeded splits;
- Fashion-MNIST (60000 x 784, pixels / 255), its official 60k/10k split, once.

Each split fits ``AdaptiveKernelClassifier(random_state=0)`` with its defaults twice on
the same rows: on the table as it is (the rule keeps it) and behind a
``StandardScaler`` (the columns standardized; the rule then keeps those).  Printed
per table: test error ± standard error of each, their paired difference, the fit
seconds (median), and how the kernel was evaluated (``kernel_cache_dtype_``,
``kernel_grid_step_``: a step means the exact int8 path on the grid).

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_grid_scaling.py \\
        [--tables digits LetterRecognition FashionMNIST] [--write F]

Run it alone: a second process on the machine moves every time.
"""

import argparse
import time

import numpy as np
from _common import machine_description, mean_and_standard_error, publish

SPLITS = {"digits": 5, "LetterRecognition": 3, "FashionMNIST": 1}
KEPT, STANDARDIZED = "kept (the rule)", "standardized"


def load(name):
    """``(X, y, official split or None)`` of one grid table."""
    from sklearn.datasets import load_digits

    from skgpu_kernel.datasets import load_fashion_mnist, load_mlbench

    if name == "digits":
        X, y = load_digits(return_X_y=True)
        return X, y, None
    if name == "LetterRecognition":
        bunch = load_mlbench("LetterRecognition", target="lettr")
        return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target).astype(str), None
    X_train, y_train, X_test, y_test = load_fashion_mnist()
    X = np.concatenate([X_train, X_test])
    return X, np.concatenate([y_train, y_test]), np.arange(len(y_train))


def splits(name, y, official_train):
    """``[(train, test)]`` row indices for ``name``."""
    from sklearn.model_selection import train_test_split

    if official_train is not None:
        return [(official_train, np.arange(len(official_train), len(y)))]
    rows = np.arange(len(y))
    return [train_test_split(rows, test_size=0.2, random_state=seed, stratify=y) for seed in range(SPLITS[name])]


def fitted(variant, X_train, y_train):
    """``(model, fit seconds)`` for one variant: the estimator, or the scaler and the estimator."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from skgpu_kernel import AdaptiveKernelClassifier

    estimator = AdaptiveKernelClassifier(random_state=0)
    model = estimator if variant == KEPT else make_pipeline(StandardScaler(), estimator)
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    return model, time.perf_counter() - tic


def measure(name):
    """Per variant: errors, fit seconds and the kernel's evaluation, over the splits."""
    X, y, official_train = load(name)
    results = {variant: {"errors": [], "seconds": [], "how": set()} for variant in (KEPT, STANDARDIZED)}
    for train, test in splits(name, y, official_train):
        for variant, record in results.items():
            model, seconds = fitted(variant, X[train], y[train])
            estimator = model if variant == KEPT else model[-1]
            record["errors"].append(float(np.mean(model.predict(X[test]) != y[test])))
            record["seconds"].append(seconds)
            step = estimator.kernel_grid_step_
            record["how"].add(
                f"{estimator.solver_}, cache {estimator.kernel_cache_dtype_}, grid step "
                f"{'none' if step is None else f'{step:.3g}'}, scaling {estimator.column_scaling_}"
            )
            print(f"{name} {variant}: error {record['errors'][-1]:.4f}, fit {seconds:.1f} s", flush=True)
    return X.shape, results


def report(tables):
    lines = [
        "| table | shape | variant | test error ± SE | fit s (median) | kernel evaluated |",
        "|---|---|---|---|---:|---|",
    ]
    summary = ["", "| table | standardized - kept (paired) | fit time standardized / kept |", "|---|---|---:|"]
    for name, (shape, results) in tables.items():
        for variant, record in results.items():
            mean, se = mean_and_standard_error(record["errors"])
            how = "; ".join(sorted(record["how"]))
            lines.append(
                f"| {name} | {shape[0]} x {shape[1]} (all rows) | {variant} | {mean:.4f} ± {se:.4f} | "
                f"{np.median(record['seconds']):.2f} | {how} |"
            )
        difference = np.subtract(results[STANDARDIZED]["errors"], results[KEPT]["errors"])
        mean, se = mean_and_standard_error(difference)
        ratio = np.median(results[STANDARDIZED]["seconds"]) / np.median(results[KEPT]["seconds"])
        summary.append(f"| {name} | {mean:+.4f} ± {se:.4f} | {ratio:.2f} |")
    return "\n".join(lines + summary)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--write", default=None, help="also write the report to this file")
    args = parser.parse_args()
    tables = {name: measure(name) for name in args.tables}
    text = f"{machine_description('cpu')}\n\n{report(tables)}"
    publish(text, args.write)


if __name__ == "__main__":
    main()
