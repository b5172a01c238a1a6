"""Benchmark: two workers with DataParallel, Parle and AdaptiveSGD against one worker.

One invocation, each method in its own child process: seconds to a target test MSE
(``--target`` times the Bayes MSE, i.e. the noise variance measured with the true
coefficients) on a synthetic linear regression (default 1M x 50 float32, noise 1),
for

* one worker (``parallel=None``, the estimator in the calling process);
* ``DataParallel(2)``, ``Parle(2)`` and ``AdaptiveSGD(2)`` with CPU workers,

first with two equal workers, then with worker 1 made twice slower through the
strategies' ``callback``: after each of its updates it sleeps as long as the CPU
time its main thread spent since its previous update (the computation runs at half
speed; communication and the helper threads are not slowed).

The data are generated in memory in each child from fixed seeds (not timed); a
parallel fit copies them once into shared memory, which is timed.  Every method uses
the same estimator settings (EigenPro rule, polynomial decay over the fit's passes,
``--batch-size``); each row is the first whole fit of 1, 2, ... passes that reaches
the target, its wall time the median of ``--repeats`` fits.  The time includes what
a user waits for (spawning the workers, importing torch in them, building the
process group, sharing the data, tearing down); the start-up is also measured on its
own, as the wall time of a one-pass fit of the same strategy on 2000 rows.

Reported per method: seconds, start-up, passes, communication rounds, test MSE,
bytes all-reduced per worker, and the ratios AdaptiveSGD / DataParallel time with
the slowed worker (target <= 0.75) and DataParallel / Parle bytes when both reach
the target (target >= 10).  A ``["cuda:0", "cpu"]`` pair of workers is measured
when a GPU is visible.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_parallel.py [--write benchmarks/RESULTS.md]

Options: ``--rows``/``--features`` (smaller for a quick run), ``--batch-size``,
``--target``, ``--max-passes``, ``--repeats``.
"""

import argparse
import math
import os
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np
import torch
from _common import in_child, machine_description, publish

NOISE = 1.0
TEST_ROWS = 100_000
STARTUP_ROWS = 2000
SLOW_WORKER = 1
SLOW_FACTOR = 2.0


def _true_model(n_features):
    rng = np.random.RandomState(1)
    return rng.randn(n_features) / math.sqrt(n_features), 0.5


def _rows(seed, n_rows, n_features):
    coef, intercept = _true_model(n_features)
    rng = np.random.RandomState(seed)
    X = rng.randn(n_rows, n_features).astype(np.float32)
    y = X.astype(np.float64) @ coef + intercept + NOISE * rng.randn(n_rows)
    return X, y


def _bayes_mse(X, y):
    coef, intercept = _true_model(X.shape[1])
    return float(np.mean((X.astype(np.float64) @ coef + intercept - y) ** 2))


def _strategy(name, slow, batch_size, devices=None):
    """The strategy called ``name`` (built in the child), worker 1 slowed when ``slow``."""
    from skgpu_kernel.parallel import AdaptiveSGD, DataParallel, Parle, SlowWorker

    callback = SlowWorker(rank=SLOW_WORKER, factor=SLOW_FACTOR) if slow else None
    placement = {"devices": devices} if devices else {"n_workers": 2}
    return {
        "single": lambda: None,
        "DataParallel": lambda: DataParallel(callback=callback, **placement),
        "Parle": lambda: Parle(callback=callback, **placement),
        "AdaptiveSGD": lambda: AdaptiveSGD(callback=callback, **placement),
    }[name]()


STRATEGY_NOTES = {
    "single": "parallel=None",
    "DataParallel": "defaults",
    "Parle": "defaults (sync_every=25, no momentum)",
    "AdaptiveSGD": "defaults (batch step 32 within [batch/4, 4 x batch], merge every 16 x batch x 2 samples)",
}


def _params(batch_size, device, n_epochs):
    from skgpu_kernel.scaling import EigenProRule

    return {
        "scaling_rule": EigenProRule(step="optimal", decay="polynomial"),
        "batch_size": batch_size,
        "n_epochs": n_epochs,
        "tol": None,
        "random_state": 0,
        "device": device,
    }


def allreduce_seconds(context, n_floats):
    """Worker of :func:`run_latency`: mean seconds of one gloo all-reduce of ``n_floats`` float32."""
    import torch.distributed as dist

    tensor = torch.zeros(n_floats)
    for _ in range(50):
        dist.all_reduce(tensor)
    tic = time.perf_counter()
    for _ in range(2000):
        dist.all_reduce(tensor)
    return (time.perf_counter() - tic) / 2000


def run_latency(n_floats):
    """Latency of the all-reduce DataParallel makes at every step, between two CPU workers."""
    from skgpu_kernel.parallel.launch import run_distributed

    return max(run_distributed(allreduce_seconds, n_floats, ["cpu", "cpu"]))


def run_startup(name, n_features, batch_size, devices, repeats):
    """Median wall time of a one-pass fit on a few rows: spawning, imports, group, teardown."""
    from skgpu_kernel import BufferedSGDRegressor

    X, y = _rows(3, STARTUP_ROWS, n_features)
    timings = []
    for _ in range(repeats):
        strategy = _strategy(name, False, batch_size, devices)
        model = BufferedSGDRegressor(parallel=strategy, **_params(batch_size, "cpu", 1))
        tic = time.perf_counter()
        model.fit(X, y)
        timings.append(time.perf_counter() - tic)
    return float(np.median(timings))


def run_method(name, slow, args, devices=None):
    """Whole fits with 1, 2, ... passes until one reaches the target; its median wall time."""
    from skgpu_kernel import BufferedSGDRegressor
    from skgpu_kernel.parallel import AdaptiveSGD

    X, y = _rows(0, args.rows, args.features)
    X_test, y_test = _rows(2, TEST_ROWS, args.features)
    bayes = _bayes_mse(X_test, y_test)
    device = "cpu" if devices is None else devices[0]
    attempts = []
    for passes in range(1, args.max_passes + 1):
        timings = []
        for _ in range(args.repeats):
            strategy = _strategy(name, slow, args.batch_size, devices)
            model = BufferedSGDRegressor(parallel=strategy, **_params(args.batch_size, device, passes))
            tic = time.perf_counter()
            model.fit(X, y)
            timings.append(time.perf_counter() - tic)
        mse = float(np.mean((model.predict(X_test) - y_test) ** 2))
        attempts.append((passes, float(np.median(timings)), mse, model))
        print(
            f"   {name}{' (slowed)' if slow else ''}: {passes} passes, {attempts[-1][1]:.2f} s, "
            f"test MSE {mse:.4f} (target {args.target * bayes:.4f})",
            flush=True,
        )
        if mse <= args.target * bayes:
            break
    passes, seconds, mse, model = attempts[-1]
    row = {
        "seconds": seconds,
        "passes": passes,
        "mse": mse,
        "bayes": bayes,
        "reached": mse <= args.target * bayes,
        "bytes": getattr(model, "communication_bytes_", 0),
        "rounds": "-",
    }
    strategy = model.parallel_
    if isinstance(strategy, AdaptiveSGD):
        merges = len(model.history_)
        weights, batches = model.merge_weights_, model.worker_batch_sizes_
        speeds = np.array([record["worker_samples_per_second"] for record in model.history_])
        row["rounds"] = f"{merges} merges"
        row["speeds"] = speeds.mean(axis=0).tolist()
        row["final_batches"] = batches[-1].astype(int).tolist()
        row["detail"] = (
            f"mean merge weights {np.round(weights.mean(axis=0), 2).tolist()}, final batches "
            f"{batches[-1].astype(int).tolist()}, mean samples/s per worker "
            f"{[f'{speed / 1e3:.0f}k' for speed in speeds.mean(axis=0)]}"
        )
    elif strategy is not None and type(strategy).__name__ == "Parle":
        row["rounds"] = f"{row['bytes'] // (4 * (args.features + 1))} syncs"
    elif strategy is not None:
        row["rounds"] = f"{model.t_} steps"
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--target", type=float, default=1.01)
    parser.add_argument("--max-passes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--startup-repeats", type=int, default=5, help="start-up: the median of this many fits")
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()
    wall = time.perf_counter()
    print(f"== {args.rows} x {args.features}, batch {args.batch_size}, target {args.target} x Bayes MSE", flush=True)

    startup = {}
    for name in ("DataParallel", "Parle", "AdaptiveSGD"):
        startup[name] = in_child(run_startup, name, args.features, args.batch_size, None, args.startup_repeats)
        print(f"   start-up of {name}: {startup[name]:.2f} s", flush=True)
    # DataParallel's message per step: gradient (d), intercept, loss sum, row count.
    latency = in_child(run_latency, args.features + 3)
    print(f"   gloo all-reduce of {args.features + 3} floats: {1e3 * latency:.2f} ms", flush=True)

    cases = {
        "equal workers": ["single", "DataParallel", "Parle", "AdaptiveSGD"],
        "worker 1 2x slower": ["DataParallel", "Parle", "AdaptiveSGD"],
    }
    rows = {}
    for case, names in cases.items():
        for name in names:
            rows[case, name] = in_child(run_method, name, case != "equal workers", args)
    gpu_rows = {}
    if torch.cuda.is_available():
        for name in ("DataParallel", "AdaptiveSGD"):
            gpu_rows[name] = in_child(run_method, name, False, args, ["cuda:0", "cpu"])

    single = rows["equal workers", "single"]
    lines = [
        f"### Parallel strategies, 2 workers: {args.rows} x {args.features} float32 regression — "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description('cpu')}; workers on the CPU, gloo, one intra-op thread each; the "
        "single worker runs in one process with all threads. Target: test MSE <= "
        f"{args.target} x Bayes MSE ({single['bayes']:.4f}) on {TEST_ROWS} held-out rows. Every method: "
        f"EigenPro rule (step 'optimal', polynomial decay over the fit's passes), batch {args.batch_size} "
        "(DataParallel: half per worker, one gradient all-reduce per step); data in memory (generated, not "
        "timed; a parallel fit copies them into shared memory, timed). Each row is the first whole fit "
        f"(1, 2, ... passes, median of {args.repeats}) that reaches the target, wall time of `fit` including "
        f"the process start-up; start-up alone = one-pass fit of the same strategy on {STARTUP_ROWS} rows "
        f"(median of {args.startup_repeats}: spawn 2 interpreters that import torch, process group, teardown). "
        "Slowed worker: `callback` that sleeps, after each update of worker 1, as long as its main thread's CPU "
        "time since its previous update (its computation at half speed; communication not slowed).",
        "",
        "| case | method | strategy parameters | seconds to target | start-up s | seconds - start-up | passes "
        "| communication rounds per worker | test MSE | reached | bytes all-reduced per worker | time / single |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|",
    ]

    def line(case, name, row):
        start = startup.get(name.split(" on ")[0], 0.0) if name != "single" else 0.0
        return (
            f"| {case} | {name} | {STRATEGY_NOTES[name.split(' on ')[0]]} | {row['seconds']:.2f} | "
            f"{start:.2f} | {row['seconds'] - start:.2f} | {row['passes']} | {row['rounds']} | {row['mse']:.4f} | "
            f"{'yes' if row['reached'] else 'no'} | {row['bytes']:,} | {row['seconds'] / single['seconds']:.1f} |"
        )

    for (case, name), row in rows.items():
        lines.append(line(case, name, row))
    for name, row in gpu_rows.items():
        lines.append(line("cuda:0 + cpu", f"{name} on cuda:0 + cpu", row))

    slow_dp, slow_ada = rows["worker 1 2x slower", "DataParallel"], rows["worker 1 2x slower", "AdaptiveSGD"]
    equal_dp, equal_ada = rows["equal workers", "DataParallel"], rows["equal workers", "AdaptiveSGD"]
    dp, parle = rows["equal workers", "DataParallel"], rows["equal workers", "Parle"]
    hetero_ratio = slow_ada["seconds"] / slow_dp["seconds"]
    hetero_train_ratio = (slow_ada["seconds"] - startup["AdaptiveSGD"]) / (slow_dp["seconds"] - startup["DataParallel"])
    bytes_ratio = dp["bytes"] / max(parle["bytes"], 1)
    equal = dp["reached"] and parle["reached"]
    lines += [
        "",
        f"AdaptiveSGD / DataParallel time with worker 1 slowed: {hetero_ratio:.2f} with start-up, "
        f"{hetero_train_ratio:.2f} without (target <= 0.75; with equal workers "
        f"{equal_ada['seconds'] / equal_dp['seconds']:.2f}). DataParallel / Parle bytes: {bytes_ratio:.0f}x "
        + ("at equal accuracy (both reach the target)" if equal else "(NOT at equal accuracy: one missed the target)")
        + " (target >= 10).",
    ]
    for (case, name), row in rows.items():
        if "detail" in row:
            lines.append(f"{name}, {case}: {row['detail']}.")
    for name, row in gpu_rows.items():
        if "detail" in row:
            lines.append(f"{name} on cuda:0 + cpu: {row['detail']}.")
    steps = int(dp["rounds"].split()[0])
    ada_slow = rows["worker 1 2x slower", "AdaptiveSGD"]
    lines += [
        f"Where the time goes: one gloo all-reduce of DataParallel's {4 * (args.features + 3)}-byte message takes "
        f"{1e3 * latency:.2f} ms between two worker processes here, so its {steps} steps spend about "
        f"{steps * latency:.1f} s communicating, of its {dp['seconds'] - startup['DataParallel']:.1f} s after "
        f"start-up; slowing worker 1 changes its time by {slow_dp['seconds'] - dp['seconds']:+.1f} s. With worker 1 "
        f"slowed, AdaptiveSGD's batches end at {ada_slow['final_batches']} and the workers process "
        f"{[f'{speed / 1e3:.0f}k' for speed in ada_slow['speeds']]} rows per second.",
    ]
    if not gpu_rows:
        lines.append(
            'The `devices=["cuda:0", "cpu"]` rows (a GPU worker with a CPU worker) are not measured: no GPU on '
            "this machine."
        )
    lines.append(f"Whole benchmark: {time.perf_counter() - wall:.0f} s.")
    text = "\n".join(lines)
    publish(text, args.write)


if __name__ == "__main__":
    main()
