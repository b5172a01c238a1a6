"""
Parallel replicas: DataParallel, Parle and AdaptiveSGD against one worker
=========================================================================

:class:`~skgpu_kernel.BufferedSGDRegressor` trains on several worker processes
when given a strategy as ``parallel=`` (:mod:`skgpu_kernel.parallel`):

* :class:`~skgpu_kernel.parallel.DataParallel` splits every mini-batch between
  the workers and all-reduces the gradients at every step: the same updates as
  one worker, one collective per step;
* :class:`~skgpu_kernel.parallel.Parle` (Chaudhari et al. [1]_) lets each
  worker train its own replica on its share of the data and couples the
  replicas elastically, with one all-reduce every ``sync_every`` steps;
* :class:`~skgpu_kernel.parallel.AdaptiveSGD` (Ma et al. [2]_) hands out the
  batches dynamically to whichever worker asks, merges the replicas every few
  thousand samples with weights equal to each worker's share of the work, and
  gives faster workers larger batches.

This example trains a linear regression with one worker and with two workers
under each strategy, first with two equal workers, then with one worker made
twice slower, and plots the test error against the wall-clock time.

Each parallel fit starts two fresh Python processes that import torch and join a
``torch.distributed`` group: about two to three seconds before the first
update on a small machine.  On a problem this small, that start-up is most of
the time a parallel fit takes (one worker needs a fraction of a second), so the
picture is about what the strategies cost and how they cope with a slow worker,
not about a speed-up.

.. note::

   The workers are *spawned*: they import this script again, as a module.
   Everything that must not run in them (data, fits, plots) is therefore under
   ``if __name__ == "__main__":``, and the callback that slows a worker down,
   :class:`~skgpu_kernel.parallel.SlowWorker`, comes from the package, so that
   the workers can unpickle it whatever runs this script.  In your own code,
   define such callbacks in a module.
"""

# %%
# Data, strategies and a slowed worker
# ------------------------------------
# 200,000 training rows with 30 standard normal features, targets linear in the
# features plus Gaussian noise of variance 1, and 50,000 test rows: the best
# possible test MSE (the *Bayes* MSE) is the noise variance, about 1.
#
# Every model uses the same settings: EigenPro's step-size rule with a
# polynomial decay over the passes of the fit, batches of 512 rows (with
# DataParallel, 256 on each worker), ``random_state=0``; the strategies keep
# their defaults.
#
# The slowed worker is made by the strategies' ``callback(rank, step)``, which
# every worker calls after each of its updates: worker 1 then sleeps as long as
# the CPU time its main thread spent since its previous update, so that it
# computes at half speed (communication is not slowed).
import os
import time

import numpy as np

from skgpu_kernel import BufferedSGDRegressor
from skgpu_kernel.parallel import AdaptiveSGD, DataParallel, Parle, SlowWorker
from skgpu_kernel.scaling import EigenProRule

N_TRAIN, N_TEST, N_FEATURES, NOISE = 200_000, 50_000, 30, 1.0
PASSES = [1, 2, 3]
COMMON = dict(batch_size=512, tol=None, random_state=0, device="cpu")


def make_regression(n_rows, seed):
    """Rows of the linear model (the same coefficients for every seed) with noise."""
    coef = np.random.RandomState(42).randn(N_FEATURES) / np.sqrt(N_FEATURES)
    rng = np.random.RandomState(seed)
    X = rng.randn(n_rows, N_FEATURES).astype(np.float32)
    return X, X @ coef + 0.5 + NOISE * rng.randn(n_rows)


def strategies(callback=None):
    return {
        "DataParallel": DataParallel(n_workers=2, callback=callback),
        "Parle": Parle(n_workers=2, callback=callback),
        "AdaptiveSGD": AdaptiveSGD(n_workers=2, callback=callback),
    }


def fit_curve(strategy):
    """Test MSE and wall-clock seconds of whole fits of 1, 2, 3 passes, and the last model."""
    points = []
    for passes in PASSES:
        model = BufferedSGDRegressor(
            scaling_rule=EigenProRule(step="optimal", decay="polynomial"), n_epochs=passes, parallel=strategy, **COMMON
        )
        tic = time.perf_counter()
        model.fit(X, y)
        seconds = time.perf_counter() - tic
        points.append((seconds, float(np.mean((model.predict(X_test) - y_test) ** 2))))
    return np.array(points), model


def report(title, curves):
    print(title)
    for name, (points, _) in curves.items():
        cells = ", ".join(f"{p} passes: {s:4.2f} s, MSE {mse:.4f}" for p, (s, mse) in zip(PASSES, points, strict=True))
        print(f"  {name:12s} {cells}")
    for name, (_, model) in curves.items():
        if model.parallel_ is not None:
            print(f"  {name:12s} all-reduced {model.communication_bytes_:>7,d} bytes per worker in 3 passes")


if __name__ == "__main__":
    started = time.perf_counter()
    X, y = make_regression(N_TRAIN, seed=0)
    X_test, y_test = make_regression(N_TEST, seed=1)
    coef = np.random.RandomState(42).randn(N_FEATURES) / np.sqrt(N_FEATURES)
    bayes_mse = float(np.mean((X_test @ coef + 0.5 - y_test) ** 2))
    print(f"Bayes MSE on the test set: {bayes_mse:.4f}")

# %%
# Process start-up
# ----------------
# A parallel fit on 1,000 rows does almost no training: its wall time is the
# cost of starting the workers, building the group, sharing the data and
# stopping the workers again.
if __name__ == "__main__":
    tic = time.perf_counter()
    BufferedSGDRegressor(n_epochs=1, parallel=DataParallel(n_workers=2), **COMMON).fit(X[:1000], y[:1000])
    startup = time.perf_counter() - tic
    print(f"Start-up of two workers: {startup:.2f} s")

# %%
# Two equal workers
# -----------------
# Each point is a whole fit: the learning rate decays over the fit's passes, so a
# fit of 2 passes is not the first 2 passes of a fit of 3.
if __name__ == "__main__":
    equal = {"one worker": fit_curve(None)}
    equal.update({name: fit_curve(strategy) for name, strategy in strategies().items()})
    report("Two equal workers", equal)

# %%
# Worker 1 twice slower
# ---------------------
# DataParallel and Parle wait for the slow worker at every collective.
# AdaptiveSGD lets the fast worker claim more batches, weighs its replica more
# at each merge (``merge_weights_``) and grows its batch (``worker_batch_sizes_``):
# both have one row per merge and one column per worker.
if __name__ == "__main__":
    slowed = {name: fit_curve(strategy) for name, strategy in strategies(SlowWorker(rank=1, factor=2.0)).items()}
    report("Worker 1 twice slower", slowed)
    for title, curves in (("equal workers", equal), ("worker 1 slowed", slowed)):
        model = curves["AdaptiveSGD"][1]
        speeds = np.array([record["worker_samples_per_second"] for record in model.history_])
        print(
            f"AdaptiveSGD, {title}: {len(model.history_)} merges, mean merge weights "
            f"{model.merge_weights_.mean(axis=0).round(2).tolist()}, final batch sizes "
            f"{model.worker_batch_sizes_[-1].astype(int).tolist()}, mean samples/s per worker "
            f"{[f'{speed / 1e3:.0f}k' for speed in speeds.mean(axis=0)]}"
        )

# %%
# The picture
# -----------
# Test MSE against the wall-clock time of each fit; the dashed line marks the
# measured start-up of two workers, the dotted one the Bayes MSE.
if __name__ == "__main__":
    import matplotlib.pyplot as plt

    colors = {"one worker": "black", "DataParallel": "tab:blue", "Parle": "tab:orange", "AdaptiveSGD": "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True, sharey=True)
    panels = (("Two equal workers", equal), ("Worker 1 twice slower", slowed))
    for ax, (title, curves) in zip(axes, panels, strict=True):
        for name, (points, _) in curves.items():
            ax.plot(points[:, 0], points[:, 1], "o-", color=colors[name], label=name)
            for passes, (seconds, mse) in zip(PASSES, points, strict=True):
                ax.annotate(str(passes), (seconds, mse), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axvline(startup, color="gray", linestyle="--", linewidth=1, label="start-up of two workers")
        ax.axhline(bayes_mse, color="gray", linestyle=":", linewidth=1, label="Bayes MSE")
        ax.set_title(title)
        ax.set_xlabel("wall-clock seconds of the fit")
        ax.set_xlim(0, 1.05 * max(points[:, 0].max() for c in panels for points, _ in c[1].values()))
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test MSE")
    axes[0].legend(title="numbers: passes of the fit", fontsize=8)
    fig.tight_layout()

    # Set SKGPU_EXAMPLE_OUT to a ``.png`` path or to a directory to keep the figure.
    out = os.environ.get("SKGPU_EXAMPLE_OUT")
    if out:
        if not out.lower().endswith(".png"):
            os.makedirs(out, exist_ok=True)
            out = os.path.join(out, "plot_parallel_strategies.png")
        fig.savefig(out, dpi=100)
    print(f"Whole example: {time.perf_counter() - started:.0f} s")

# %%
# Reading the picture
# -------------------
# The figures quoted here come from a run on a 2-core CPU, where both workers
# share the two cores with the parent process; they vary from run to run.
#
# **Start-up.**  One worker fits the 200,000 rows in about 0.05 s, whatever the
# number of passes; every parallel fit first pays a start-up of 2.5 to 4 s.
# Two CPU workers pay off only when a pass takes much longer than that (far more
# data, costlier models), or when the workers are separate devices.
#
# **Two equal workers.**  DataParallel takes the updates one worker would take
# with the whole batch and reaches the same test MSE, but every step waits for an
# all-reduce of the gradient; with gloo between two processes on this machine
# that costs about a millisecond, more than the step's computation.  Parle
# communicates ``sync_every`` times less (one all-reduce of the model every 25
# steps) and each worker passes over half the data per epoch; its learning-rate
# schedule counts the worker's own steps, so the decay ends with the fit.
# AdaptiveSGD reaches one worker's test MSE with a handful of merges; each of its
# updates claims rows from a shared counter (a round trip to the key-value
# store), which the printed bytes do not count.
#
# **Worker 1 twice slower.**  DataParallel runs at the pace of the slower worker
# at every step.  Parle waits for it at every synchronisation only.  AdaptiveSGD
# moves the work to the fast worker: the slow worker's merge weight and batch
# shrink and the fast worker's grow, as printed above, and its fit takes about as
# long as with equal workers.  ``benchmarks/bench_parallel.py`` times the same
# strategies on a 1,000,000 x 50 problem.
#
# References
# ----------
# .. [1] P. Chaudhari, C. Baldassi, R. Zecchina, S. Soatto, A. Talwalkar and A.
#    Oberman, "Parle: parallelizing stochastic gradient descent",
#    arXiv:1707.00424.
# .. [2] Y. Ma, F. Rusu, K. Wu and A. Sim, "Adaptive stochastic gradient descent
#    for deep learning on heterogeneous CPU+GPU architectures", arXiv:2110.07029.

if __name__ == "__main__":
    plt.show()
