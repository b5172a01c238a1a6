"""Benchmark: our defaults' fit and predict times against CatBoost's on every set of 2000 training rows or more.

Issue 80's acceptance: on each set of ``bench_real_data.py`` and table of
``bench_tables.py`` with 2000 training rows or more (and the smaller tables it
names: HMDA), our fit time at most 2x CatBoost's and our predict time on the test
rows at most 10x CatBoost's, both medians of ``--repeats`` fits on one seeded 80/20
split (seed 0).  The sets take ``bench_real_data.prepare``'s features (numeric
columns standardised, factors one-hot) for both models, as that benchmark's
CatBoost row; the tables take the raw DataFrame, ours with its factors as pandas
categories and CatBoost with them as its own categorical features, as
``bench_tables.py``'s rows.  CatBoost: ``bench_real_data.CatBoostBaseline``
(defaults, ``thread_count`` = the machine's cores).

Printed per set: rows, each model's median fit and predict seconds and test error,
and ours over CatBoost's for each; then whether each set keeps the two bounds.
Run it alone: other processes beside it move the times.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_pace.py [--sets DNA ...] [--tables HMDA ...]
        [--repeats 3] [--params "{'n_centers': 2000}"] [--results benchmarks/RESULTS.md]
"""

import argparse
import ast
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_description, publish, table_header
from bench_growth import measure
from bench_real_data import CatBoostBaseline, _task, catboost_unavailable, our_estimator, prepare
from bench_tables import TABLES, load, split_indices

# Issue 80's sets: bench_real_data's of 2000 training rows or more, and bench_tables' tables it names.
# Fashion-MNIST keeps its own rule (no slower than before: bench_real_data.py), not CatBoost's pace.
SETS = (
    "DNA",
    "Computers",
    "LetterRecognition",
    "HI",
    "BudgetFood",
    "VietNamI",
    "CPSSW8",
    "Fertility",
    "FertilityMorekids",
)
PACE_TABLES = ("HMDA", "PSID7682", "ResumeNames", "CPS1988", "VietNamI")
# The bounds: our fit and predict seconds over CatBoost's at most.
FIT_RATIO_BOUND, PREDICT_RATIO_BOUND = 2.0, 10.0


def set_rows(name):
    """``(X_train, y_train, X_test, y_test, task, categorical columns)`` of a ``bench_real_data`` set."""
    X_train, y_train, X_test, y_test, _ = prepare(name)
    return X_train, y_train, X_test, y_test, _task(name), ()


def table_rows(name):
    """The same of a ``bench_tables`` table: its raw DataFrame split with seed 0."""
    table = TABLES[name]
    frame, y = load(table)
    train, test = split_indices(table, y, 0)
    factors = [column for column in frame.columns if frame[column].dtype.name in ("category", "object")]
    return frame.iloc[train], y[train], frame.iloc[test], y[test], table.task, factors


def pace(rows, repeats, params):
    """``{"rows", "ours", "CatBoost"}``: each model's :func:`bench_growth.measure` on ``rows``, ours with ``params``."""
    X_train, y_train, X_test, y_test, task, factors = rows
    cells = {"rows": len(y_train)}
    cells["ours"] = measure(lambda: our_estimator(task, **params), X_train, y_train, X_test, y_test, task, repeats)
    cells["CatBoost"] = measure(
        lambda: CatBoostBaseline(task, factors), X_train, y_train, X_test, y_test, task, repeats
    )
    return cells


def ratios_of(cells):
    """Ours over CatBoost's fit seconds, predict seconds and error."""
    return {key: cells["ours"][key] / cells["CatBoost"][key] for key in ("fit", "predict", "error")}


def line(label, cells):
    """One markdown row: rows, both models' fit, predict and error, the ratios, and the bounds kept."""
    ours, catboost, ratios = cells["ours"], cells["CatBoost"], ratios_of(cells)
    kept = ratios["fit"] <= FIT_RATIO_BOUND and ratios["predict"] <= PREDICT_RATIO_BOUND
    values = [label, f"{cells['rows']}"]
    for cell in (ours, catboost):
        values += [f"{cell['fit']:.2f}", f"{cell['predict']:.3f}", f"{cell['error']:.5g}"]
    values += [f"{ratios['fit']:.2f}x", f"{ratios['predict']:.1f}x", f"{ratios['error']:.3f}x", "yes" if kept else "no"]
    return "| " + " | ".join(values) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=list(SETS))
    parser.add_argument("--tables", nargs="*", default=list(PACE_TABLES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", default="{}", help="our estimator's parameters beyond the defaults (a dict)")
    parser.add_argument("--results", default=None, help="append the table to this markdown file")
    args = parser.parse_args()
    missing = catboost_unavailable()
    if missing:
        raise SystemExit(f"bench_pace.py compares with CatBoost: {missing}")
    machine = machine_description("cpu")
    print(machine)
    columns = ["set", "training rows", "ours fit s", "ours predict s", "ours error"]
    columns += ["CatBoost fit s", "CatBoost predict s", "CatBoost error"]
    columns += ["fit ratio", "predict ratio", "error ratio", f"<= {FIT_RATIO_BOUND}x / {PREDICT_RATIO_BOUND}x"]
    lines = table_header(columns)
    work = [(name, set_rows) for name in args.sets] + [(f"table:{name}", table_rows) for name in args.tables]
    fit_ratios = []
    for label, rows_of in work:
        cells = pace(rows_of(label.removeprefix("table:")), args.repeats, ast.literal_eval(args.params))
        lines.append(line(label, cells))
        fit_ratios.append(ratios_of(cells)["fit"])
        print(lines[-1])
        sys.stdout.flush()
    header = (
        f'**Pace** (`bench_pace.py --params "{args.params}"`, medians of {args.repeats} fits, seed-0 split; {machine}; '
        f"median fit ratio {float(np.median(fit_ratios)):.2f}x)\n"
    )
    publish(header + "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
