"""Benchmark: EigenPro 2 (ours) against scikit-learn kernel baselines on Fashion-MNIST.

One invocation runs, each in its own child process so that peak memory is its own:

* ours: ``AdaptiveKernelClassifier`` with defaults (Gaussian, bandwidth 5);
* sklearn ``KernelRidge`` (rbf, same kernel) on a 20k subsample;
* sklearn ``Nystroem(n_components=2000)`` + ``RidgeClassifier``;

and prints fit seconds, test accuracy, peak memory, ratios to ours, and our
kernel-block throughput as a fraction of ``torch.mm`` GFLOP/s at the same shapes.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/bench_kernel.py [--write benchmarks/RESULTS.md]

Options ``--device`` (default auto), ``--n-train`` (subsample the 60k training set
for a quick run) and ``--skip`` (baselines to leave out).
"""

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np
import torch
from _common import append_section, in_child, machine_description, peak_rss_gb

BANDWIDTH = 5.0
GAMMA = 1.0 / (2.0 * BANDWIDTH**2)  # the same Gaussian kernel in scikit-learn's convention


def _data(n_train):
    from skgpu_kernel.datasets import load_fashion_mnist

    X_train, y_train, X_test, y_test = load_fashion_mnist()
    return X_train[:n_train], y_train[:n_train], X_test, y_test


def run_ours(n_train, device):
    from skgpu_kernel import AdaptiveKernelClassifier

    X_train, y_train, X_test, y_test = _data(n_train)
    model = AdaptiveKernelClassifier(bandwidth=BANDWIDTH, device=device, random_state=0, verbose=1)
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    fit_seconds = time.perf_counter() - tic
    accuracy = model.score(X_test, y_test)
    before, after = model.critical_batch_size_
    notes = (
        f"{model.n_epochs_} epochs, m={model.batch_size_}, eta={model.learning_rate_:.4g}, "
        f"k={model.n_components_}, m*={before:.1f}->{after:.0f}, m_G={model.batch_capacity_}"
    )
    peak_device = torch.cuda.max_memory_allocated() / 1e9 if model.device_.startswith("cuda") else None
    return {
        "fit_seconds": fit_seconds,
        "accuracy": accuracy,
        "peak_gb": peak_rss_gb(),
        "peak_device_gb": peak_device,
        "notes": notes,
        "device": model.device_,
        "batch_size": model.batch_size_,
    }


def run_kernel_ridge(n_train, device):
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.preprocessing import LabelBinarizer

    X_train, y_train, X_test, y_test = _data(n_train)
    n_sub = min(20_000, X_train.shape[0])
    encoder = LabelBinarizer(neg_label=-1)
    Y = encoder.fit_transform(y_train[:n_sub])
    model = KernelRidge(alpha=1e-3, kernel="rbf", gamma=GAMMA)
    tic = time.perf_counter()
    model.fit(X_train[:n_sub].astype(np.float64), Y)
    fit_seconds = time.perf_counter() - tic
    accuracy = float(np.mean(encoder.classes_[model.predict(X_test).argmax(axis=1)] == y_test))
    return {"fit_seconds": fit_seconds, "accuracy": accuracy, "peak_gb": peak_rss_gb(), "notes": f"{n_sub} samples"}


def run_nystroem_ridge(n_train, device):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import RidgeClassifier
    from sklearn.pipeline import make_pipeline

    X_train, y_train, X_test, y_test = _data(n_train)
    model = make_pipeline(Nystroem(gamma=GAMMA, n_components=2000, random_state=0), RidgeClassifier(alpha=1e-3))
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    fit_seconds = time.perf_counter() - tic
    accuracy = model.score(X_test, y_test)
    return {"fit_seconds": fit_seconds, "accuracy": accuracy, "peak_gb": peak_rss_gb(), "notes": "2000 components"}


def run_throughput(n_train, device, batch_size):
    """GFLOP/s of our training kernel blocks vs torch.mm at the same shapes."""
    from skgpu_kernel.blockwise import kernel_matmul
    from skgpu_kernel.device import column_block_size, resolve_device, resolve_memory_budget, synchronize
    from skgpu_kernel.kernels import Gaussian

    X_train, *_ = _data(n_train)
    dev = resolve_device(device)
    X = torch.as_tensor(X_train).to(dev)
    X = X - X.mean(dim=0)
    kernel = Gaussian(bandwidth=BANDWIDTH)
    centers = kernel.prepare_centers(X)
    values = torch.ones(X.shape[0], 10, device=dev)
    block = column_block_size(dev, batch_size, X.shape[0], 4, resolve_memory_budget(None, dev) // 2)
    n, d = X.shape

    def timed(function, repeats=3):
        function()
        best = float("inf")
        for _ in range(repeats):
            synchronize(dev)
            tic = time.perf_counter()
            function()
            synchronize(dev)
            best = min(best, time.perf_counter() - tic)
        return best

    batch = X[:batch_size]

    def kernel_blocks():
        kernel_matmul(kernel, batch, centers, values, block)

    def plain_products():
        for start in range(0, n, block):
            batch @ X[start : start + block].T

    flops = 2.0 * batch_size * n * d
    kernel_gflops = flops / timed(kernel_blocks) / 1e9
    mm_gflops = flops / timed(plain_products) / 1e9
    return {"kernel_gflops": kernel_gflops, "mm_gflops": mm_gflops, "column_block": block}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--n-train", type=int, default=60_000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["kernel_ridge", "nystroem"])
    parser.add_argument("--write", help="append the table to this markdown file")
    args = parser.parse_args()

    rows = {}
    print("== ours (AdaptiveKernelClassifier, defaults, bandwidth 5)", flush=True)
    rows["ours: AdaptiveKernelClassifier"] = in_child(run_ours, args.n_train, args.device)
    print(rows["ours: AdaptiveKernelClassifier"], flush=True)
    if "kernel_ridge" not in args.skip:
        print("== sklearn KernelRidge on 20k", flush=True)
        rows["sklearn KernelRidge (20k subsample)"] = in_child(run_kernel_ridge, args.n_train, args.device)
        print(rows["sklearn KernelRidge (20k subsample)"], flush=True)
    if "nystroem" not in args.skip:
        print("== sklearn Nystroem(2000) + RidgeClassifier", flush=True)
        rows["sklearn Nystroem(2000) + RidgeClassifier"] = in_child(run_nystroem_ridge, args.n_train, args.device)
        print(rows["sklearn Nystroem(2000) + RidgeClassifier"], flush=True)
    ours = rows["ours: AdaptiveKernelClassifier"]
    throughput = in_child(run_throughput, args.n_train, args.device, ours["batch_size"])

    lines = [
        f"### Fashion-MNIST ({args.n_train} train / 10000 test), Gaussian bandwidth 5 — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {machine_description(args.device)}; ours ran on `{ours['device']}`.",
        "",
        "| method | fit s | test accuracy | peak RSS GB | fit time / ours | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['fit_seconds']:.1f} | {row['accuracy']:.4f} | {row['peak_gb']:.2f} | "
            f"{row['fit_seconds'] / ours['fit_seconds']:.2f} | {row['notes']} |"
        )
    fraction = throughput["kernel_gflops"] / throughput["mm_gflops"]
    lines += [
        "",
        f"Kernel-block throughput (batch {ours['batch_size']} x {args.n_train} centers x 784 features, "
        f"column block {throughput['column_block']}): {throughput['kernel_gflops']:.0f} GFLOP/s = "
        f"{fraction:.0%} of torch.mm at the same shapes ({throughput['mm_gflops']:.0f} GFLOP/s).",
    ]
    if ours.get("peak_device_gb") is not None:
        lines.append(f"Peak device memory (ours): {ours['peak_device_gb']:.2f} GB.")
    table = "\n".join(lines)
    print()
    print(table)
    if args.write:
        append_section(args.write, table)


if __name__ == "__main__":
    main()
