"""Benchmark: package defaults on a large continuous tabular regression against scikit-learn baselines.

The real large sets of ``bench_real_data.py`` (Fertility) have few distinct rows;
this one has none repeated: ``n`` rows (default 262144) of ``d`` (default 30)
standardised Gaussian features, a smooth target (a sum of sines of random
projections plus a linear part) and Student-t noise with 3 degrees of freedom
(heavy tails, variance 3 x ``noise``^2), 80/20 split with seed 0.  Rows, each fitted in
its own child process: ``AdaptiveKernelRegressor(random_state=0)`` with package
defaults (``n_centers="auto"``), ``Nystroem(2000) + RidgeCV`` over 10 alphas with
``gamma="scale"``, linear ``RidgeCV`` and ``HistGradientBoostingRegressor``.  Printed:
fit seconds, test MSE, MSE / the best of Nystroem+RidgeCV and linear RidgeCV, fit
time / Nystroem+RidgeCV's, the Bayes MSE (the noise variance), and ours' chosen
``n_centers_``, solver, iterations and residual.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_large_tabular.py [--rows 262144] [--skip ...] [--write ...]
"""

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np
from _common import in_child, machine_description, peak_rss_gb, publish

RIDGE_ALPHAS = np.logspace(-6, 3, 10)
METHODS = ["ours (defaults)", "Nystroem(2000) + RidgeCV", "linear RidgeCV", "HistGradientBoostingRegressor"]
REFERENCES = ("Nystroem(2000) + RidgeCV", "linear RidgeCV")  # the error ratio's baselines (those that ran)
DEGREES_OF_FREEDOM = 3


def make_data(n_rows, n_features, noise, seed=0):
    """``(X_train, y_train, X_test, y_test)`` of the synthetic regression described in the module docstring."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n_rows, n_features).astype(np.float32)
    projections = rng.randn(n_features, 6) / np.sqrt(n_features)
    signal = np.sin(2.0 * X @ projections).sum(1) + X @ (rng.randn(n_features) / np.sqrt(n_features))
    y = signal + noise * rng.standard_t(DEGREES_OF_FREEDOM, n_rows)
    split = int(0.8 * n_rows)
    return X[:split], y[:split], X[split:], y[split:]


def run(method, args):
    """Fit one method on the split; ``{fit_seconds, mse, peak_gb, notes}``."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline

    from skgpu_kernel import AdaptiveKernelRegressor

    X_train, y_train, X_test, y_test = make_data(args.rows, args.features, args.noise)
    gamma = 1.0 / (X_train.shape[1] * float(np.var(X_train, dtype=np.float64)))
    model = {
        "ours (defaults)": lambda: AdaptiveKernelRegressor(random_state=0),
        "Nystroem(2000) + RidgeCV": lambda: make_pipeline(
            Nystroem(gamma=gamma, n_components=2000, random_state=0), RidgeCV(alphas=RIDGE_ALPHAS)
        ),
        "linear RidgeCV": lambda: RidgeCV(alphas=RIDGE_ALPHAS),
        "HistGradientBoostingRegressor": lambda: HistGradientBoostingRegressor(random_state=0),
    }[method]()
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    seconds = time.perf_counter() - tic
    mse = float(np.mean((model.predict(X_test) - y_test) ** 2))
    notes = ""
    if method.startswith("ours"):
        last = model.history_[-1] if model.history_ else {}
        per_iteration = np.mean([record["seconds"] for record in model.history_]) if model.history_ else 0.0
        notes = (
            f"n_centers_ {model.n_centers_}, solver_ {model.solver_}, {model.n_epochs_} iterations "
            f"({per_iteration:.2f} s each), relative residual {last.get('relative_residual', float('nan')):.3g}, "
            f"alpha_ {model.alpha_:.3g}, bandwidth {model.bandwidth_:.3g}"
        )
    return {"fit_seconds": seconds, "mse": mse, "peak_gb": peak_rss_gb(), "notes": notes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--features", type=int, default=30)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--skip", nargs="*", default=[], choices=METHODS, help="methods to leave out")
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    methods = [method for method in METHODS if method not in args.skip]
    rows = {}
    for method in methods:
        print(f"== {method}", flush=True)
        rows[method] = in_child(run, method, args)
        print(rows[method], flush=True)
    best = min((rows[name]["mse"] for name in REFERENCES if name in rows), default=None)
    nystroem = rows.get("Nystroem(2000) + RidgeCV", {}).get("fit_seconds")
    bayes = DEGREES_OF_FREEDOM / (DEGREES_OF_FREEDOM - 2) * args.noise**2
    lines = [
        f"### Large continuous tabular regression: {args.rows} x {args.features} synthetic — "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description('auto')}. Data: standard Gaussian features, target a sum of six sines of "
        f"random projections plus a linear part, Student-t({DEGREES_OF_FREEDOM}) noise of scale {args.noise} "
        f"(Bayes MSE {bayes:.4g}); 80/20 split. Command: "
        f"`python benchmarks/bench_large_tabular.py --rows {args.rows} --features {args.features}`"
        + (f" (left out: {', '.join(args.skip)})." if args.skip else "."),
        "",
        "| method | fit s | test MSE | MSE / best of Nystroem and linear | fit / Nystroem | peak RSS GB | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for method, row in rows.items():
        error_ratio = f"{row['mse'] / best:.3f}" if best else "-"
        time_ratio = f"{row['fit_seconds'] / nystroem:.2f}" if nystroem else "-"
        lines.append(
            f"| {method} | {row['fit_seconds']:.1f} | {row['mse']:.4f} | {error_ratio} | {time_ratio} | "
            f"{row['peak_gb']:.2f} | {row['notes']} |"
        )
    text = "\n".join(lines)
    publish(text, args.write)


if __name__ == "__main__":
    main()
