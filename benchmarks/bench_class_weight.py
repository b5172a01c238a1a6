"""Benchmark: what ``class_weight`` and ``alpha`` do to rare classes.

Data: scikit-learn's bundled digits (pixels / 16) with 90% of classes 3 and 8 dropped
and, optionally, a share of the training labels replaced by random ones (``--noise``,
default 0.2); stratified 70/30 split; seeds 0, 1, 2 draw the dropped rows, the split
and the noise.  ``AdaptiveKernelClassifier(random_state=0)`` is fitted with
``class_weight`` None and ``"balanced"``, each with ``alpha="auto"`` (the default),
``alpha=0`` (interpolation regularised by early stopping) and ``alpha="loo"``.

Printed per setting: the recall of the two rare classes (macro mean), the accuracy
and the ``alpha_`` chosen, each a mean over the three seeds (no timings: they are
not what this measures, and the script may run beside other work).  The
same data as ``tests/test_bandwidth_selection.py``'s class-weight test.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_class_weight.py [--noise 0.2] [--write benchmarks/RESULTS.md]
"""

import argparse
import time

import numpy as np
from _common import machine_description, publish

RARE_CLASSES, RARE_SHARE, SEEDS = (3, 8), 0.1, (0, 1, 2)
SETTINGS = [(weight, alpha) for alpha in ("auto", 0.0, "loo") for weight in (None, "balanced")]


def imbalanced_digits(seed, noise):
    """Digits with 90% of the rare classes dropped, split 70/30, ``noise`` of the training labels random."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    rng = np.random.RandomState(seed)
    keep = ~np.isin(y, RARE_CLASSES) | (rng.uniform(size=y.size) < RARE_SHARE)
    X_train, X_test, y_train, y_test = train_test_split(
        X[keep] / 16, y[keep], test_size=0.3, random_state=seed, stratify=y[keep]
    )
    noisy = rng.uniform(size=y_train.size) < noise
    y_train = np.where(noisy, rng.randint(0, 10, y_train.size), y_train)
    return X_train, y_train, X_test, y_test


def measure(noise):
    """Mean (rare recall, accuracy, alpha_) over the seeds, per (class_weight, alpha) setting."""
    from sklearn.metrics import recall_score

    from skgpu_kernel import AdaptiveKernelClassifier

    rows = {setting: [] for setting in SETTINGS}
    for seed in SEEDS:
        X_train, y_train, X_test, y_test = imbalanced_digits(seed, noise)
        for class_weight, alpha in SETTINGS:
            model = AdaptiveKernelClassifier(class_weight=class_weight, alpha=alpha, random_state=0)
            model.fit(X_train, y_train)
            predicted = model.predict(X_test)
            recall = recall_score(y_test, predicted, labels=list(RARE_CLASSES), average="macro")
            rows[(class_weight, alpha)].append((recall, np.mean(predicted == y_test), model.alpha_))
    return {setting: np.mean(values, axis=0) for setting, values in rows.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.2, help="share of training labels made random")
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    results = measure(args.noise)
    lines = [
        "| class_weight | alpha | recall of classes 3 and 8 | accuracy | alpha_ (mean) |",
        "|---|---|---:|---:|---:|",
    ]
    for (class_weight, alpha), (recall, accuracy, alpha_) in results.items():
        lines.append(f"| {class_weight} | {alpha!r} | {recall:.3f} | {accuracy:.4f} | {alpha_:.3g} |")
    section = [
        f"### class_weight and alpha on imbalanced digits, {args.noise:.0%} noisy labels — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description('cpu')}. Command: `OPENBLAS_CORETYPE=Haswell python "
        f"benchmarks/bench_class_weight.py --noise {args.noise}`. Digits with 90% of classes 3 and 8 dropped, "
        f"stratified 70/30 split, {args.noise:.0%} of training labels random; means over seeds 0, 1, 2.",
        "",
        *lines,
    ]
    text = "\n".join(section)
    publish(text, args.write)


if __name__ == "__main__":
    main()
