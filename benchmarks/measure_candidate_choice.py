"""Measurement: which score picks the better of two kernels, the held-out split or the leave-one-out criterion.

Issue 51, item 5: feature learning keeps a candidate by its score on a held-out split
of the training rows (10%, a few hundred rows on small sets), and a split that small
cannot separate close candidates.  The package already computes another score for
two of them at no extra cost: the exact leave-one-out criterion its bandwidth search
minimises (``bandwidth_selection_.errors``, on up to 1500 rows, every row a center),
for the plain kernel and for the learning path's kernel with ``M = I``.

This script asks, over seeded splits, which of the two scores picks the kernel with
the lower test error.  For each set and split (``bench_real_data.prepare(name,
seed=split)``: the benchmark's features and an 80/20 split), it fits the plain
kernel (``kernel="gaussian"``) and the path's (``kernel="laplacian"``), both with
``feature_learning=None``:

- on every training row: the test error of each, and the leave-one-out criterion of
  each at its chosen bandwidth (the misclassification rate or the mean squared error
  of its search's rows);
- on 90% of the training rows (stratified for classification, seeded by the split):
  the error on the other 10%, the package's held-out score.

A score "picks" the kernel with the lower value; ties pick the plain kernel, as the
package does.  The table counts, per set, the splits where each score picks the
kernel with the lower test error, and gives the mean test-error gap between the two
kernels.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/measure_candidate_choice.py --datasets Sonar Vowel DNA --splits 5

Run it alone: a second process on the machine moves every time.
"""

import numpy as np
from _common import measurement_arguments, print_table_header
from bench_real_data import _task, our_estimator, prepare
from sklearn.model_selection import train_test_split

KERNELS = ("gaussian", "laplacian")
HELD_OUT_FRACTION = 0.1  # the package's default validation_fraction


def _error(task, y_true, y_pred):
    y_true = np.asarray(y_true)
    if task == "regression":
        return float(np.mean((y_true.astype(np.float64) - y_pred) ** 2))
    return float(np.mean(y_true != y_pred))


def _loo_criterion(model):
    """The bandwidth search's leave-one-out criterion at the bandwidth it chose."""
    errors = np.asarray(model.bandwidth_selection_.errors, dtype=np.float64)
    return float(np.nanmin(errors))


def _scores(name, split):
    """Per kernel: test error, leave-one-out criterion and held-out error, for one split."""
    task = _task(name)
    X, y, X_test, y_test, _ = prepare(name, seed=split)
    y = np.asarray(y)
    stratify = y if task == "classification" else None
    train, held_out = train_test_split(
        np.arange(len(y)), test_size=HELD_OUT_FRACTION, random_state=split, stratify=stratify
    )
    rows = {}
    for kernel in KERNELS:
        whole = our_estimator(task, kernel=kernel, feature_learning=None).fit(X, y)
        part = our_estimator(task, kernel=kernel, feature_learning=None).fit(X[train], y[train])
        rows[kernel] = {
            "test": _error(task, y_test, whole.predict(X_test)),
            "loo": _loo_criterion(whole),
            "held_out": _error(task, y[held_out], part.predict(X[held_out])),
        }
    return rows


def _picks(rows, score):
    """The kernel ``score`` picks: the lower value, the plain kernel on a tie."""
    return KERNELS[1] if rows[KERNELS[1]][score] < rows[KERNELS[0]][score] else KERNELS[0]


def main():
    args = measurement_arguments(__doc__)
    print_table_header(
        [
            "set",
            "splits",
            "test error, gaussian",
            "test error, laplacian",
            "held-out picks the better",
            "leave-one-out picks the better",
            "splits where the two scores disagree",
        ]
    )
    for name in args.datasets:
        per_split = [_scores(name, split) for split in range(args.splits)]
        tests = {kernel: np.array([rows[kernel]["test"] for rows in per_split]) for kernel in KERNELS}
        better = [_picks(rows, "test") for rows in per_split]
        held_out = [_picks(rows, "held_out") for rows in per_split]
        loo = [_picks(rows, "loo") for rows in per_split]
        # A split where both kernels have the same test error has no better kernel: either pick is right.
        tied = [rows[KERNELS[0]]["test"] == rows[KERNELS[1]]["test"] for rows in per_split]
        right_held_out = sum(t or h == b for t, h, b in zip(tied, held_out, better, strict=True))
        right_loo = sum(t or v == b for t, v, b in zip(tied, loo, better, strict=True))
        disagree = sum(h != v for h, v in zip(held_out, loo, strict=True))
        print(
            f"| {name} | {args.splits} | {tests['gaussian'].mean():.4g} | {tests['laplacian'].mean():.4g} | "
            f"{right_held_out} | {right_loo} | {disagree} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
