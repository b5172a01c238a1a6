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

xRFM (PyPI ``xrfm``, optional: ``pip install --no-deps xrfm tqdm``; where ``import
xrfm`` fails the script says why and leaves it out) runs on every split under
``bench_real_data.py``'s protocol (``bench_real_data.XRFMBaseline``: its defaults on the
CPU, fitted on the first 80% of the split's training rows with the last 20% as its
validation set, the same features, Fashion-MNIST's standardised on the training rows),
up to ``--xrfm-max-rows`` training rows (default 45000; on 2 cores it needs >25
minutes at 40k rows), not with ``--no-xrfm``.  It runs in a child process: where it
dies (on LetterRecognition the out-of-memory killer stopped it at 24 GB), its row says
why and the run goes on without it for that set.  Like HistGradientBoosting in
``bench_real_data.py`` it is reported, not a baseline: it is not among the models of
"best baseline"; a last column gives our error minus xRFM's, paired by split, with its
standard error.

Fits run in this process, one after the other (times are means over splits and
include the tuned model's search).  The default sets are the small classification
sets; any set of ``bench_real_data.py`` can be given (``--datasets HI --splits 5``).

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_seeded_splits.py [--splits 20] [--write benchmarks/RESULTS.md]

Other options: ``--datasets``, ``--tuned-max-train``, ``--no-xrfm`` (no xRFM row nor
column: the table of before), ``--xrfm-max-rows``.
"""

import argparse
import functools
import json
import time

import numpy as np
from _common import in_child, machine_description, publish
from bench_real_data import (
    XRFM,
    XRFM_MAX_ROWS,
    XRFM_TOO_SLOW,
    XRFM_VALIDATION_FRACTION,
    _task,
    build_linear,
    build_nystroem,
    build_nystroem_tuned,
    build_svc,
    build_xrfm,
    fit_and_score,
    our_estimator,
    prepare,
    set_measured_constants,
    xrfm_standardizes,
    xrfm_unavailable,
)

SMALL_SETS = ["Glass", "Sonar", "Ionosphere", "Vowel", "Vehicle", "DigitsImbalanced"]


def build_ours(X_train, task, params=None):
    """``AdaptiveKernelRegressor`` / ``AdaptiveKernelClassifier(random_state=0)``: the defaults, or with ``params``."""
    model = our_estimator(task, **set_measured_constants(params or {}))
    return model, lambda fitted: f"bandwidth_ {fitted.bandwidth_:.3g}, alpha_ {fitted.alpha_:.3g}"


OURS = "ours (defaults)"


def models(task, tuned, variant=None):
    """The rows of a task: method name -> builder, ours first; ``tuned`` adds the gamma-tuned Nystroem.

    ``variant``: parameters of a second row of ours (``--ours-params``), reported beside
    the defaults, not a baseline.
    """
    ridge = "RidgeCV" if task == "regression" else "RidgeClassifierCV"
    rows = {OURS: build_ours}
    if variant:
        rows[_variant_name(variant)] = functools.partial(build_ours, params=variant)
    rows[f"Nystroem(2000) + {ridge}"] = build_nystroem
    if tuned:
        rows["Nystroem(2000) + ridge, gamma tuned (3-fold)"] = build_nystroem_tuned
    if task == "classification":
        rows["SVC()"] = build_svc
    rows[f"linear {ridge}"] = build_linear
    return rows


def _variant_name(params):
    return "ours " + ", ".join(f"{key}={value!r}" for key, value in params.items())


def split_errors(name, seed, tuned_max_train, xrfm_max_rows=None, variant=None):
    """Every model's (test error, fit seconds) on one seeded split of ``name``; xRFM last, up to ``xrfm_max_rows``.

    xRFM runs in a child process: where it dies (on LetterRecognition's 16000 rows the
    out-of-memory killer stopped it at 24 GB), ``info["xrfm_failed"]`` says why and
    its entry is missing, rather than the whole run being killed with it.
    """
    X_train, y_train, X_test, y_test, info = prepare(name, seed=seed)
    task = _task(name)
    split = (X_train, y_train, X_test, y_test, task)
    scores = {
        method: _fit_scored(build, *split)
        for method, build in models(task, X_train.shape[0] <= tuned_max_train, variant).items()
    }
    if xrfm_max_rows is not None and X_train.shape[0] <= xrfm_max_rows:
        build = functools.partial(build_xrfm, standardize=xrfm_standardizes(name))
        try:
            scores[XRFM] = in_child(_fit_scored, build, *split)
        except RuntimeError as error:
            info["xrfm_failed"] = str(error)
    return scores, info


def _fit_scored(build, X_train, y_train, X_test, y_test, task):
    """``(test error, fit seconds)`` of the model ``build`` makes (a module-level function: a child can run it)."""
    model, _ = build(X_train, task)
    return fit_and_score(model, X_train, y_train, X_test, y_test, task)


def _paired(difference):
    """Mean ± standard error of per-split differences, as the table writes them."""
    k = len(difference)
    se = difference.std(ddof=1) / np.sqrt(k) if k > 1 else float("nan")
    return f"{difference.mean():+.4g} ± {se:.2g}"


def summarize(name, per_split, info, xrfm_skipped=False):
    """Table rows of one set: each model's mean error and SE, and ours minus the best baseline, paired.

    ``xrfm_skipped``: False without the xRFM column (``--no-xrfm``); else the column is
    there and this is None where xRFM ran, or why it did not (its row says so).
    """
    methods = list(per_split[0])
    errors = {method: np.array([split[method][0] for split in per_split]) for method in methods}
    seconds = {method: np.mean([split[method][1] for split in per_split]) for method in methods}
    k = len(per_split)
    ours = [method for method in methods if method.startswith("ours")]
    baselines = [method for method in methods if method not in (*ours, XRFM)]  # xRFM is reported, not a baseline
    best = min(baselines, key=lambda method: errors[method].mean())
    difference = errors[OURS] - errors[best]
    size = f"{info['n']} ({info['n_train']} / {info['n_test']}, {info['n_features']})"
    lines = []
    for method in methods:
        se = errors[method].std(ddof=1) / np.sqrt(k) if k > 1 else float("nan")
        paired = f"{_paired(difference)} vs {best}" if method == OURS else "-"
        if method in ours and method != OURS:  # a variant of ours: against the defaults, paired
            paired = f"{_paired(errors[method] - errors[OURS])} vs {OURS}"
        ratio = errors[OURS].mean() / errors[best].mean() if method == OURS and errors[best].mean() > 0 else None
        versus_xrfm = ""
        if xrfm_skipped is not False:
            versus_xrfm = " - |"
            if method in ours:
                versus_xrfm = f" {_paired(errors[method] - errors[XRFM]) if XRFM in errors else '-'} |"
        lines.append(
            f"| {name} | {size} | {method} | {seconds[method]:.2f} | {errors[method].mean():.5g} ± {se:.2g} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} | {paired} |{versus_xrfm}"
        )
    if xrfm_skipped:
        lines.append(f"| {name} | {size} | {XRFM} | - | - | - | - | {xrfm_skipped} |")
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
    parser.add_argument("--no-xrfm", action="store_true", help="leave out xRFM and its column")
    parser.add_argument(
        "--xrfm-max-rows",
        type=int,
        default=XRFM_MAX_ROWS,
        help=f"largest training set for xRFM, skipped above ({XRFM_TOO_SLOW})",
    )
    parser.add_argument(
        "--ours-params",
        type=json.loads,
        default=None,
        help='JSON of a second row of ours, e.g. \'{"feature_learning": "diagonal"}\' (paired with the defaults)',
    )
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    unavailable = None if args.no_xrfm else xrfm_unavailable()
    if unavailable:
        print(f"The xRFM column is skipped: {unavailable}.", flush=True)
    xrfm = not args.no_xrfm and unavailable is None
    tic = time.perf_counter()
    lines = [
        "| data set | n (train / test, features) | method | mean fit s | mean test error ± SE | "
        "ours / best baseline | ours - best baseline, paired ± SE |" + (" ours - xRFM, paired ± SE |" if xrfm else ""),
        "|---|---|---|---:|---:|---:|---|" + ("---|" if xrfm else ""),
    ]
    for name in args.datasets:
        per_split, xrfm_failed = [], None
        for seed in range(args.splits):
            xrfm_rows = args.xrfm_max_rows if xrfm and xrfm_failed is None else None
            scores, info = split_errors(name, seed, args.tuned_max_train, xrfm_rows, args.ours_params)
            xrfm_failed = xrfm_failed or info.get("xrfm_failed")
            per_split.append(scores)
            print(name, seed, {method: f"{error:.5g}" for method, (error, _) in scores.items()}, flush=True)
        xrfm_skipped = False
        if xrfm:
            xrfm_skipped = None
            if info["n_train"] > args.xrfm_max_rows:
                xrfm_skipped = (
                    f"skipped: {info['n_train']} training rows > --xrfm-max-rows {args.xrfm_max_rows} ({XRFM_TOO_SLOW})"
                )
            elif xrfm_failed is not None:  # one split's failure leaves no pairing for the set: no column
                xrfm_skipped = f"failed: {xrfm_failed}"
                for scores in per_split:
                    scores.pop(XRFM, None)
            if xrfm_skipped:
                print(f"{name}: {XRFM} {xrfm_skipped}", flush=True)
        lines += summarize(name, per_split, info, xrfm_skipped)
    options = ""
    if args.no_xrfm:
        options = " --no-xrfm"
    elif args.xrfm_max_rows != XRFM_MAX_ROWS:
        options = f" --xrfm-max-rows {args.xrfm_max_rows}"
    if args.ours_params:
        options += f" --ours-params '{json.dumps(args.ours_params)}'"
    if xrfm:
        import xrfm as xrfm_package

        about_xrfm = (
            f" xRFM (`xrfm` {xrfm_package.__version__}, its defaults on the CPU) fits on the first "
            f"{1 - XRFM_VALIDATION_FRACTION:.0%} of each split's training rows with the last "
            f"{XRFM_VALIDATION_FRACTION:.0%} as its validation set, up to "
            f"{args.xrfm_max_rows} training rows; it is reported, not a baseline; the last column pairs our error "
            "with xRFM's split by split."
        )
    else:
        about_xrfm = f" xRFM skipped: {unavailable}." if unavailable else ""
    section = [
        f"### {', '.join(args.datasets)} over {args.splits} seeded splits — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description('cpu')}. Command: `OPENBLAS_CORETYPE=Haswell python "
        f"benchmarks/bench_seeded_splits.py --datasets {' '.join(args.datasets)} --splits {args.splits}{options}`. "
        f"80/20 splits (stratified for classification) with seeds 0..{args.splits - 1}, preprocessing as in "
        "`bench_real_data.py`; errors are 1 - accuracy or MSE, means over splits with their standard errors; the "
        f"{'ours - best baseline' if xrfm else 'last'} column pairs our error with the best baseline's split by "
        f"split.{about_xrfm}",
        "",
        *lines,
    ]
    text = "\n".join(section)
    publish(text, args.write)
    print(f"\nWhole benchmark: {time.perf_counter() - tic:.0f} s.")


if __name__ == "__main__":
    main()
