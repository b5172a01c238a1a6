"""The main job: fit AdaptiveKernelClassifier on Fashion-MNIST and report.

Run ``python -m skgpu_kernel.demo``.  Uses the official 60k/10k split from Debian's
``dataset-fashion-mnist`` package (pixels scaled to [0, 1], Gaussian bandwidth 5 as
in the EigenPro papers); without it, says so and falls back to scikit-learn's
digits.  Prints test accuracy, fit time and every decision the estimator took.
"""

import argparse
import sys
import time

from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from .datasets import FASHION_MNIST_DIR, load_fashion_mnist
from .kernel_machines import AdaptiveKernelClassifier


def load_data(dataset):
    """Return ``(name, X_train, y_train, X_test, y_test, bandwidth)``."""
    if dataset == "fashion-mnist":
        try:
            return ("Fashion-MNIST", *load_fashion_mnist(), 5.0)
        except FileNotFoundError as error:
            print(
                f"Fashion-MNIST not found ({error}).\n"
                f"Install it with 'apt-get install dataset-fashion-mnist' (files under {FASHION_MNIST_DIR}); "
                "falling back to scikit-learn's digits.",
                file=sys.stderr,
            )
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.25, random_state=0, stratify=y)
    return "digits", X_train, y_train, X_test, y_test, "auto"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["fashion-mnist", "digits"], default="fashion-mnist")
    parser.add_argument("--n-epochs", type=int, default=None, help="default: the estimator's default")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--verbose", type=int, default=1)
    args = parser.parse_args(argv)

    name, X_train, y_train, X_test, y_test, bandwidth = load_data(args.dataset)
    params = {"bandwidth": bandwidth, "device": args.device, "random_state": 0, "verbose": args.verbose}
    if args.n_epochs is not None:
        params["n_epochs"] = args.n_epochs
    model = AdaptiveKernelClassifier(**params)
    print(f"{name}: {X_train.shape[0]} training and {X_test.shape[0]} test samples, {X_train.shape[1]} features")
    tic = time.perf_counter()
    model.fit(X_train, y_train)
    fit_seconds = time.perf_counter() - tic
    tic = time.perf_counter()
    accuracy = model.score(X_test, y_test)
    predict_seconds = time.perf_counter() - tic

    print(f"test accuracy      {accuracy:.4f}")
    iterations = "direct solve" if model.solver_ == "direct" else f"{model.n_epochs_} epochs"
    print(f"fit time           {fit_seconds:.1f} s ({iterations}), predict {predict_seconds:.1f} s")
    print(f"device             {model.device_} ({model.dtype_}), memory budget {model.memory_budget_ / 1e9:.1f} GB")
    print(f"bandwidth          {model.bandwidth_:.4g}, alpha {model.alpha_:.3g}, solver {model.solver_}")
    if model.solver_ == "eigenpro":
        _print_eigenpro_decisions(model)
    return model, accuracy, fit_seconds


def _print_eigenpro_decisions(model):
    """EigenPro 2's decisions: the kernel cache, the batch capacity and critical batch, the step."""
    if model.kernel_cached_:
        print(f"kernel cache       K(X, X) in {model.kernel_cache_dtype_}, read every epoch")
        if model.kernel_grid_step_ is not None:
            step = model.kernel_grid_step_
            print(f"                   filled from exact int8 products (pixels on a grid of step {step:.4g})")
        print(f"batch capacity m_G {model.batch_capacity_} (the memory limit: steps read their kernel rows)")
    else:
        print("kernel cache       none (K(X, X) does not fit the budget: blocks computed per batch)")
        print(f"batch capacity m_G {model.batch_capacity_} (measured)")
    before, after = model.critical_batch_size_
    print(f"critical batch     {before:.1f} -> {after:.1f} with preconditioning")
    print(f"preconditioner     {model.n_components_} components on a subsample of {model.subsample_size_}")
    print(f"batch size         {model.batch_size_}")
    print(f"step size          {model.learning_rate_:.4g}")


if __name__ == "__main__":
    main()
