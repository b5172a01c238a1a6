"""Our default fit's test error on seeded splits of every benchmark set, recorded, and two records paired.

Issue 65's accuracy bound compares a new version of the package with today's, set
by set and split by split.  ``run`` fits ours (``AdaptiveKernelRegressor`` /
``AdaptiveKernelClassifier(random_state=0)``, the defaults) on seeded 80/20 splits
and writes each split's test error and fit seconds to a JSON file, set by set (a
run stopped part way keeps the sets it finished; ``--resume`` goes on from them):

- the sets of ``bench_real_data.py``, on its features (``bench_real_data.prepare``):
  10 splits for sets under 3000 rows, 3 for sets over 100000 rows, 5 otherwise;
  Fashion-MNIST has its official split only (one fit);
- the tables of ``bench_tables.py``, the raw DataFrame with its factors as pandas
  categories, as that benchmark's "ours, categories" row: 5 splits.

``compare BEFORE AFTER`` pairs two records split by split and prints, per set, the
mean errors, their paired difference with its standard error and the ratio of the
means, and whether the set keeps the bound: no set's mean error worse by more than 2
standard errors of the paired difference *and* by more than 1%, and the geometric
mean of the per-set ratios at most 1.005; Fashion-MNIST's accuracy at least 0.905.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/paired_splits.py run --out F [--sets DNA] [--tables HMDA] [--resume]
        [--params "{'subsample_size': 1000}"]
    python benchmarks/paired_splits.py compare before.json after.json [--write benchmarks/RESULTS.md]

Errors do not depend on the machine's load (the fits are deterministic); the
seconds do: run it alone where they are read.
"""

import argparse
import ast
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import FitCheckClock, machine_description, margin_over_trivial, publish

# The split counts of issue 65's bound: sets under SMALL_ROWS rows get SMALL_SPLITS, sets over
# LARGE_ROWS rows LARGE_SPLITS, the others and the tables SPLITS.
SMALL_ROWS, LARGE_ROWS = 3000, 100_000
SMALL_SPLITS, SPLITS, LARGE_SPLITS = 10, 5, 3
# The bound: a set is worse where its paired difference exceeds both; the geometric mean of the ratios.
WORSE_STANDARD_ERRORS, WORSE_SHARE, GEOMETRIC_MEAN_BOUND = 2.0, 0.01, 1.005
FASHION_MIN_ACCURACY = 0.905


def split_count(name, n_rows):
    """The seeded splits of a benchmark set of ``n_rows`` rows (Fashion-MNIST: its one official split)."""
    if name == "FashionMNIST":
        return 1
    if n_rows < SMALL_ROWS:
        return SMALL_SPLITS
    return LARGE_SPLITS if n_rows > LARGE_ROWS else SPLITS


def real_set_errors(name, splits=None, params=None):
    """The :class:`SplitRecord` of ours on ``name``'s seeded splits (``bench_real_data.prepare``'s features).

    ``params``: estimator parameters added to the defaults.
    """
    from bench_real_data import _task, fit_and_score, our_estimator, prepare

    splits_run = SplitRecord()
    count = splits
    seed = 0
    while count is None or seed < count:
        X_train, y_train, X_test, y_test, info = prepare(name, seed=seed)
        if count is None:
            count = split_count(name, info["n"])
        task = _task(name)
        model = our_estimator(task, **(params or {}))
        with FitCheckClock() as checks:
            error, fit_seconds = fit_and_score(model, X_train, y_train, X_test, y_test, task)
        margin = margin_over_trivial(task, y_train, y_test, model.predict(X_test))
        splits_run.add(error, fit_seconds, _check_facts(model, margin, checks.seconds / fit_seconds))
        print(f"{name} split {seed}: error {error:.6g}, fit {fit_seconds:.1f} s", flush=True)
        seed += 1
    return splits_run


def table_errors(name, splits=None, params=None):
    """The :class:`SplitRecord` of ours on the raw DataFrame of ``bench_tables``'s table ``name``, seeded splits.

    ``params``: estimator parameters added to the defaults.
    """
    from bench_real_data import our_estimator
    from bench_tables import TABLES, _scored, load, split_indices

    table = TABLES[name]
    frame, y = load(table)
    splits_run = SplitRecord()
    for seed in range(SPLITS if splits is None else splits):
        train, test = split_indices(table, y, seed)
        model = our_estimator(table.task, **(params or {}))
        scores = _scored(model, frame.iloc[train], y[train], frame.iloc[test], y[test], table.task, probabilities=False)
        facts = _check_facts(model, scores.margin, scores.check_seconds / scores.seconds)
        splits_run.add(scores.error, scores.seconds, facts)
        print(f"{name} split {seed}: error {scores.error:.6g}, fit {scores.seconds:.1f} s", flush=True)
    return splits_run


class SplitRecord:
    """What a set's splits recorded: test errors, fit seconds, and each split's last-check facts."""

    def __init__(self):
        self.errors, self.seconds, self.checks = [], [], []

    def add(self, error, seconds, check):
        self.errors.append(float(error))
        self.seconds.append(float(seconds))
        self.checks.append(check)


def _check_facts(model, margin, share):
    """A split's margin over the trivial model on its test rows, the fit's own last check and its share of the fit."""
    check = getattr(model, "fit_check_", None) or {}
    kept = ("held_out", "score", "model_loss", "trivial_loss", "standard_error")
    own = {key: check[key] for key in kept if key in check}
    attempts = [[entry["solver"], float(entry["alpha"])] for entry in getattr(model, "fit_attempts_", None) or []]
    return {"test_margin": margin, "own_check": own, "check_share": float(share), "attempts": attempts}


def _commit():
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def record_key(name, kind):
    """A record's key of a set: its name, or ``table:<name>`` for a table (VietNamI is both)."""
    return f"table:{name}" if kind == "table" else name


def run(args):
    from bench_real_data import DATASETS
    from bench_tables import TABLES

    record = {"sets": {}}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as file:
            record = json.load(file)
    params = ast.literal_eval(args.params)
    record.update(commit=_commit(), machine=machine_description("cpu"))
    if params:
        record["params"] = params
    unknown = sorted(set(args.sets or ()) - set(DATASETS)) + sorted(set(args.tables or ()) - set(TABLES))
    if unknown:
        raise SystemExit(f"unknown sets or tables {unknown}: choose from {', '.join(DATASETS)}; {', '.join(TABLES)}")
    wanted = [(name, "real") for name in (DATASETS if args.sets is None else args.sets)]
    wanted += [(name, "table") for name in (TABLES if args.tables is None else args.tables)]
    for name, kind in wanted:
        key = record_key(name, kind)
        if key in record["sets"]:
            continue
        tic = time.perf_counter()
        errors_of = table_errors if kind == "table" else real_set_errors
        splits_run = errors_of(name, args.splits, params)
        record["sets"][key] = {
            "kind": kind,
            "errors": splits_run.errors,
            "seconds": splits_run.seconds,
            "checks": splits_run.checks,
        }
        with open(args.out, "w") as file:  # after every set: a stopped run keeps what it finished
            json.dump(record, file, indent=1)
        print(f"== {name}: {len(splits_run.errors)} splits in {time.perf_counter() - tic:.0f} s", flush=True)


def paired(before, after):
    """Per-set comparison of two records: mean errors, paired difference and its SE, ratio, whether it is worse."""
    rows = []
    for name, old in before["sets"].items():
        new = after["sets"].get(name)
        if new is None:
            continue
        k = min(len(old["errors"]), len(new["errors"]))
        old_errors, new_errors = np.array(old["errors"][:k]), np.array(new["errors"][:k])
        difference = new_errors - old_errors
        se = difference.std(ddof=1) / math.sqrt(k) if k > 1 else 0.0
        ratio = new_errors.mean() / old_errors.mean() if old_errors.mean() > 0 else 1.0
        worse = difference.mean() > WORSE_STANDARD_ERRORS * se and ratio > 1.0 + WORSE_SHARE
        seconds = (float(np.median(old["seconds"][:k])), float(np.median(new["seconds"][:k])))
        rows.append((name, k, old_errors.mean(), new_errors.mean(), difference.mean(), se, ratio, worse, seconds))
    return rows


def verdict(rows):
    """``(geometric mean of the ratios, the sets worse beyond the bound)`` of :func:`paired`'s rows."""
    ratios = np.array([row[6] for row in rows])
    geometric = float(np.exp(np.log(ratios).mean())) if len(ratios) else float("nan")
    return geometric, [row[0] for row in rows if row[7]]


def compare(args):
    with open(args.before) as file:
        before = json.load(file)
    with open(args.after) as file:
        after = json.load(file)
    rows = paired(before, after)
    lines = [
        f"Before: {before.get('commit')} ({before.get('machine')}); after: {after.get('commit')} "
        f"({after.get('machine')}).",
        "",
        "| set | splits | error before | error after | after - before, paired ± SE | after / before | worse "
        "(> 2 SE and > 1%) | median fit s before | after |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for name, k, old, new, difference, se, ratio, worse, seconds in rows:
        lines.append(
            f"| {name} | {k} | {old:.5g} | {new:.5g} | {difference:+.4g} ± {se:.2g} | {ratio:.4f} | "
            f"{'WORSE' if worse else 'no'} | {seconds[0]:.2f} | {seconds[1]:.2f} |"
        )
    geometric, worse = verdict(rows)
    lines.append("")
    lines.append(
        f"Geometric mean of the ratios: {geometric:.4f} (bound {GEOMETRIC_MEAN_BOUND}); sets worse beyond the bound: "
        + (", ".join(worse) if worse else "none")
        + "."
    )
    lines += check_lines(after)
    fashion = after["sets"].get("FashionMNIST")
    if fashion is not None:
        accuracy = 1.0 - fashion["errors"][0]
        lines.append(f"Fashion-MNIST test accuracy after: {accuracy:.4f} (bound {FASHION_MIN_ACCURACY}).")
    publish("\n".join(lines), args.write)


def check_lines(record):
    """Per set of ``record``: the smallest test-row margin over the trivial model, the fit's own check, its cost."""
    rows = [(name, entry["checks"]) for name, entry in record["sets"].items() if entry.get("checks")]
    if not rows:
        return []
    lines = [
        "",
        "| set | smallest margin over trivial, test rows (± SE) | splits below trivial beyond 2 SE | own check "
        "(rows, score, smallest margin) | check / fit (largest split) |",
        "|---|---|---:|---|---:|",
    ]
    below_sets = []
    for name, checks in rows:
        smallest = min(checks, key=lambda check: check["test_margin"]["margin"])["test_margin"]
        below = sum(check["test_margin"]["margin"] < -2 * check["test_margin"]["standard_error"] for check in checks)
        if below:
            below_sets.append(name)
        own = [check["own_check"] for check in checks if check["own_check"]]
        where = sorted({("held-out" if o["held_out"] else "training") + " " + o["score"] for o in own})
        own_margin = min((o["trivial_loss"] - o["model_loss"] for o in own), default=float("nan"))
        share = max(check["check_share"] for check in checks)
        lines.append(
            f"| {name} | {smallest['margin']:+.4g} ± {smallest['standard_error']:.2g} | {below} | "
            f"{', '.join(where) or '-'}; {own_margin:+.4g} | {share:.2%} |"
        )
    lines += ["", "Sets with a split below the trivial model beyond noise: " + (", ".join(below_sets) or "none") + "."]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run", help="fit ours on every set's seeded splits and record the errors")
    running.add_argument("--out", required=True, help="the JSON record (written after every set)")
    running.add_argument("--sets", nargs="*", help="bench_real_data.py's sets (default: every one)")
    running.add_argument("--tables", nargs="*", help="bench_tables.py's tables (default: every one)")
    running.add_argument("--splits", type=int, default=None, help="splits per set (default: the issue's counts)")
    running.add_argument("--resume", action="store_true", help="keep the sets --out already holds")
    running.add_argument("--params", default="{}", help="estimator parameters for every fit (dict literal)")
    comparing = commands.add_parser("compare", help="pair two records split by split")
    comparing.add_argument("before")
    comparing.add_argument("after")
    comparing.add_argument("--write", help="append the comparison to this markdown file")
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
