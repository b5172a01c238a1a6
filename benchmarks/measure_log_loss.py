"""Measurement: the test log loss of ``AdaptiveKernelClassifier.predict_proba`` against HistGradientBoosting's.

On the classification sets of ``bench_real_data.py``, over seeded splits
(``bench_real_data.prepare(name, seed=split)``: its features and an 80/20 split),
our defaults and ``HistGradientBoostingClassifier(random_state=0)`` are fitted on
the same training rows.  The table gives each one's mean test log loss (with the
classes of the training rows; a test class absent there counts as probability 0,
clipped by scikit-learn), the mean paired difference with its standard error, the
ROC AUC (one-vs-rest, macro, for more than two classes) and the error rate of each.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/measure_log_loss.py --datasets Sonar Vowel DNA --splits 5

Run it alone: a second process on the machine moves every time.
"""

import numpy as np
from _common import measurement_arguments, print_table_header
from bench_real_data import our_estimator, prepare
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import log_loss, roc_auc_score

MODELS = ("ours", "HistGradientBoosting")


def _build(model):
    if model == "ours":
        return our_estimator("classification")
    return HistGradientBoostingClassifier(random_state=0)


def _scores(model, X, y, X_test, y_test):
    """Log loss, ROC AUC and error rate of ``model`` fitted on ``(X, y)``, on the test rows."""
    fitted = model.fit(X, y)
    probabilities = fitted.predict_proba(X_test)
    classes = fitted.classes_
    auc_probabilities = probabilities[:, 1] if len(classes) == 2 else probabilities
    try:
        auc = roc_auc_score(y_test, auc_probabilities, multi_class="ovr", labels=classes)
    except ValueError:  # a class of the training rows absent from the test rows
        auc = np.nan
    return {
        "log_loss": log_loss(y_test, probabilities, labels=classes),
        "auc": auc,
        "error": float(np.mean(classes[probabilities.argmax(axis=1)] != np.asarray(y_test))),
    }


def _row(name, splits):
    per_split = []
    for split in range(splits):
        X, y, X_test, y_test, _ = prepare(name, seed=split)
        per_split.append({model: _scores(_build(model), X, y, X_test, y_test) for model in MODELS})
    keys = per_split[0]["ours"]
    mean = {model: {key: np.nanmean([s[model][key] for s in per_split]) for key in keys} for model in MODELS}
    differences = np.array([s["ours"]["log_loss"] - s["HistGradientBoosting"]["log_loss"] for s in per_split])
    standard_error = differences.std(ddof=1) / np.sqrt(splits) if splits > 1 else np.nan
    ours, hgb = mean["ours"], mean["HistGradientBoosting"]
    return (
        f"| {name} | {splits} | {ours['log_loss']:.4f} | {hgb['log_loss']:.4f} | "
        f"{differences.mean():+.4f} ± {standard_error:.4f} | {ours['log_loss'] / hgb['log_loss']:.2f} | "
        f"{ours['auc']:.4f} / {hgb['auc']:.4f} | {ours['error']:.4f} / {hgb['error']:.4f} |"
    )


def main():
    args = measurement_arguments(__doc__)
    print_table_header(
        [
            "set",
            "splits",
            "log loss, ours",
            "log loss, HistGradientBoosting",
            "ours - HistGB (paired)",
            "ratio",
            "ROC AUC, ours / HistGB",
            "error, ours / HistGB",
        ]
    )
    for name in args.datasets:
        print(_row(name, args.splits), flush=True)


if __name__ == "__main__":
    main()
