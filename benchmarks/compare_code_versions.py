"""Our defaults' test error and fit time on seeded splits, for comparing two checkouts paired by split.

Fits ``AdaptiveKernelRegressor`` / ``AdaptiveKernelClassifier(random_state=0)`` with
package defaults on the splits ``bench_real_data.prepare(name, seed=s)`` gives (seeds
0 to ``--splits`` - 1) and writes one JSON line per fit.  Run it once per checkout
(``PYTHONPATH`` pointing at it: it wins over an editable install), then ``--compare``
the two files: the mean error of each, their difference paired by split with its
standard error, and the mean fit times.

Usage::

    cd /tmp && OPENBLAS_CORETYPE=Haswell PYTHONPATH=/work/base python /work/main/benchmarks/compare_code_versions.py \\
        --datasets DNA Computers --splits 5 --out before.jsonl
    ... PYTHONPATH=/work/main ... --out after.jsonl
    python /work/main/benchmarks/compare_code_versions.py --compare before.jsonl after.jsonl

Run it alone: the times are wall-clock.
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real_data import _error, _task, our_estimator, prepare


def run(datasets, splits, out):
    import skgpu_kernel

    with open(out, "a") as handle:
        for name in datasets:
            for seed in range(splits):
                X_train, y_train, X_test, y_test, _ = prepare(name, seed=seed)
                model = our_estimator(_task(name))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tic = time.perf_counter()
                    model.fit(X_train, y_train)
                    seconds = time.perf_counter() - tic
                error = _error(_task(name), y_test, model.predict(X_test))
                row = {"set": name, "seed": seed, "error": error, "fit_seconds": seconds, "solver": model.solver_}
                row["code"] = str(Path(skgpu_kernel.__file__).parent)
                print(json.dumps(row), flush=True)
                handle.write(json.dumps(row) + "\n")


def compare(before_path, after_path):
    def read(path):
        return {(row["set"], row["seed"]): row for row in map(json.loads, Path(path).read_text().splitlines())}

    before, after = read(before_path), read(after_path)
    print("| set | splits | error before | error after | after - before (paired) | fit s before | fit s after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(key[0] for key in before):
        keys = [key for key in before if key[0] == name and key in after]
        old = np.array([before[key]["error"] for key in keys])
        new = np.array([after[key]["error"] for key in keys])
        difference = new - old
        se = difference.std(ddof=1) / np.sqrt(len(keys)) if len(keys) > 1 else float("nan")
        times = [np.mean([rows[key]["fit_seconds"] for key in keys]) for rows in (before, after)]
        print(
            f"| {name} | {len(keys)} | {old.mean():.5g} | {new.mean():.5g} | {difference.mean():+.3g} ± {se:.2g} | "
            f"{times[0]:.2f} | {times[1]:.2f} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["DNA", "Computers"])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--out", default="fits.jsonl")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        run(args.datasets, args.splits, args.out)


if __name__ == "__main__":
    main()
