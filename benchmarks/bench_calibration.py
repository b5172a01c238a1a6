"""Calibration of ``predict_proba`` above 30000 rows: expected calibration error on the test rows.

Above ``LEARNING_PATH_MAX_ROWS`` (30000) training rows the classifier's temperature
comes from 2000 rows the final model is fitted without (``calibration_ ==
"final-held-out"``, issue 63); before, from a feature-learning candidate fitted on
a subsample of about 6000 rows.  This script fits our classifier with its defaults
on the real-data benchmark's large classification sets (the raw table: the
estimator encodes it) and HistGradientBoosting on the same split, and prints the
test accuracy, log loss and expected calibration error (top label, 15 bins of equal
width), the temperature and the fit time.  Run it on two checkouts to compare
(``PYTHONPATH=<checkout>``); it reads ``calibration_`` where the estimator has it.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_calibration.py [--sets FashionMNIST FertilityMorekids]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

ECE_BINS = 15


def expected_calibration_error(labels, probabilities, classes, n_bins=ECE_BINS):
    """Top-label ECE: the mean over bins of the top probability of |accuracy - confidence|, weighted by rows."""
    confidence = probabilities.max(axis=1)
    correct = classes[probabilities.argmax(axis=1)] == labels
    bins = np.minimum((confidence * n_bins).astype(int), n_bins - 1)
    error = 0.0
    for b in range(n_bins):
        rows = bins == b
        if rows.any():
            error += rows.mean() * abs(correct[rows].mean() - confidence[rows].mean())
    return error


def _scores(model, X_test, y_test):
    from sklearn.metrics import log_loss

    probabilities = model.predict_proba(X_test)
    accuracy = float(np.mean(model.classes_[probabilities.argmax(axis=1)] == y_test))
    loss = log_loss(y_test, probabilities, labels=model.classes_)
    return accuracy, loss, expected_calibration_error(y_test, probabilities, model.classes_)


def run(name):
    from bench_real_data import _load
    from sklearn.ensemble import HistGradientBoostingClassifier

    from skgpu_kernel import AdaptiveKernelClassifier

    X_train, y_train, X_test, y_test, _ = _load(name)
    start = time.perf_counter()
    ours = AdaptiveKernelClassifier(random_state=0).fit(X_train, y_train)
    ours_time = time.perf_counter() - start
    start = time.perf_counter()
    boosting = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0).fit(X_train, y_train)
    boosting_time = time.perf_counter() - start
    rows = []
    for label, model, seconds in (("ours", ours, ours_time), ("HistGradientBoosting", boosting, boosting_time)):
        accuracy, loss, ece = _scores(model, X_test, y_test)
        temperature = getattr(model, "calibration_temperature_", float("nan"))
        calibration = getattr(model, "calibration_", "-") if model is ours else "-"
        rows.append((label, accuracy, loss, ece, temperature, calibration, seconds))
    print(f"\n{name}: {X_train.shape[0]} training rows, {X_test.shape[0]} test rows")
    print("| model | accuracy | log loss | ECE | temperature | calibration_ | fit (s) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for label, accuracy, loss, ece, temperature, calibration, seconds in rows:
        figures = f"{accuracy:.4f} | {loss:.4f} | {ece:.4f} | {temperature:.4g}"
        print(f"| {label} | {figures} | {calibration} | {seconds:.1f} |")
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["FashionMNIST", "FertilityMorekids"])
    args = parser.parse_args(argv)
    import skgpu_kernel

    print(f"skgpu_kernel from {Path(skgpu_kernel.__file__).parent}")
    for name in args.sets:
        run(name)


if __name__ == "__main__":
    main()
