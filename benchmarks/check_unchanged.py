"""Check that a refactor left the fitted models bitwise unchanged.

Runs a fixed set of small seeded fits (EigenPro 2 and 3 kernel machines, buffered
SGD linear models, in memory, memory-mapped, sparse, incremental and on two worker
processes) and records a fingerprint per fit: the sha1 of the fitted coefficients,
the scalar decisions the fit took (batch size, components, step size, ...) and the
per-epoch history without its timings.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/check_unchanged.py [--write FILE]

``--write FILE`` writes the fingerprints as JSON, with the machine they were made on.
Without it they are compared with ``unchanged_baseline.json`` next to this script:
one line per fit (``OK name`` or ``DIFF name: what differs``), exit status 1 if any
fit differs, 0 otherwise.  The lines above them name the ``skgpu_kernel`` that was
imported and, when the baseline comes from another machine, both machines: another
CPU (AVX-512 against AVX2 kernels, say) rounds the same products differently, so
there every fit differs in the last bits and only a baseline made here can tell.

Make the baseline from a clean checkout of the commit the refactor starts from, such
as a worktree ``git worktree add --detach /work/base HEAD``, with ``PYTHONPATH``
pointing at it (it wins over an editable install), from outside the repository::

    cd /tmp && OPENBLAS_CORETYPE=Haswell PYTHONPATH=/work/base \
        python /work/base/benchmarks/check_unchanged.py --write unchanged_baseline.json

Every fit is deterministic: integer batch sizes (``"auto"`` times a throughput
probe), an explicit ``memory_budget``, fixed random states and torch threads.  The
whole run takes 10 to 20 s on 2 CPU cores.  The grid fits (``ep2_grid_*``,
``cg_grid_centers``) take the grid's exact distances whether the device's int8
products are timed faster or not (issue 50: both products give the same bits).
"""

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse
import torch

import skgpu_kernel
from skgpu_kernel import (
    AdaptiveKernelClassifier,
    AdaptiveKernelRegressor,
    BufferedSGDClassifier,
    BufferedSGDRegressor,
)
from skgpu_kernel._probe_store import device_identity
from skgpu_kernel.parallel import AdaptiveSGD, DataParallel, Parle

# History keys a fit may change on purpose, per fit name.  An earlier refactor made
# parallel fits add the L2 penalty to train_loss as the single-process loop does;
# issue 26's stopping rule all-reduces Parle's mean training loss after every pass
# (8 more bytes per pass in bytes_all_reduced; the model is unchanged).
ALLOWED_TO_CHANGE = {"sgd_parallel_parle": {"train_loss", "bytes_all_reduced"}}

# Fits whose every figure may change, each for a stated reason (a fix on purpose), against a
# baseline made from the commit before the change.
# (None now: the baseline was made after issue 78's changes to the linear models, at
# the code of issue 79's start, and every fit is compared with it.)
CHANGED_ON_PURPOSE = {}

# Fitted attributes whose value changed on purpose in every fit, with the reason; their
# differences are printed beside an OK.
ATTRIBUTES_CHANGED_ON_PURPOSE = {
    "kernel_cached_": "issue 42 item 5 (39dd921): the operator plan's decision, true where CG stores K(X, X) "
    "or K(X, Z), which the old attribute, inferred from the solver that ran, called false",
}

# History keys renamed by the refactor: compared under their new name.
RENAMED_HISTORY_KEYS = {"train_mse": "train_loss"}

BASELINE = Path(__file__).with_name("unchanged_baseline.json")
# The baseline's entry naming the machine it was made on (every other entry is a fit).
MACHINE_KEY = "_machine"

# Fitted attributes recorded (and compared exactly) when the estimator has them.
SCALAR_ATTRIBUTES = (
    "batch_size_",
    "n_components_",
    "learning_rate_",
    "subsample_size_",
    "projection_",
    "kernel_cached_",
    "streamed_",
    "n_temporary_centers_",
    "n_projections_",
    "n_epochs_",
    "n_iter_",
    "buffer_size_",
    "t_",
    "n_centers_",
    "critical_batch_size_",
    "alpha_",
    "bandwidth_",
    "solver_",
    "calibration_temperature_",
)

# Torch threads of every fit: reductions split over threads round differently.
N_THREADS = 2

EP2 = {"bandwidth": 3.0, "batch_size": 256, "n_epochs": 3, "memory_budget": "2GB", "random_state": 0}
EP3 = {**EP2, "n_centers": 300}
SGD = {"batch_size": 64, "buffer_size": 500, "n_epochs": 3, "memory_budget": "1GB", "random_state": 0}


# --- data -----------------------------------------------------------------------------


def regression(n=2000, n_features=8, seed=0):
    """A smooth target of the first features plus noise."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n, n_features)
    y = np.sin(X[:, 0]) + np.cos(X[:, 1]) + 0.5 * X[:, 2] * X[:, 3] + 0.1 * rng.randn(n)
    return X, y


def classification(n=2000, n_features=8, seed=1):
    """Three classes cut from the smooth regression target."""
    X, y = regression(n, n_features, seed)
    return X, np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))


def memmap(directory, X, name):
    """``X`` saved as float32 ``.npy`` in ``directory`` and opened memory-mapped."""
    path = Path(directory) / f"{name}.npy"
    np.save(path, X.astype(np.float32))
    return np.load(path, mmap_mode="r")


# --- the fits -------------------------------------------------------------------------


def ep2_plain(tmp):
    return AdaptiveKernelRegressor(**EP2).fit(*regression())


def ep2_early_stopping(tmp):
    return AdaptiveKernelRegressor(**{**EP2, "n_epochs": 6}, early_stopping=True).fit(*regression())


def ep2_warm_start(tmp):
    X, y = regression()
    model = AdaptiveKernelRegressor(**EP2, warm_start=True).fit(X, y)
    return model.fit(X, y)


def ep2_classifier(tmp):
    return AdaptiveKernelClassifier(**EP2).fit(*classification())


def ep3_exact(tmp):
    return AdaptiveKernelRegressor(**EP3, projection="exact").fit(*regression())


def ep3_iterative(tmp):
    # Diverges twice in the first epoch: also covers the rollback with halved steps.
    return AdaptiveKernelRegressor(**EP3, projection="iterative").fit(*regression())


def ep3_cached(tmp):
    return AdaptiveKernelRegressor(**EP3, cache_kernel=True).fit(*regression())


def ep3_uncached(tmp):
    # cache_kernel="auto" caches K(Z, Z) in the fits above; this one evaluates it.
    return AdaptiveKernelRegressor(**EP3, cache_kernel=False).fit(*regression())


def ep3_streamed(tmp):
    # 20000 x 8 float32 rows take 800 kB on the device with the target and weights,
    # more than half of the 1 MB budget: X is streamed from its file.
    X, y = regression(n=20_000)
    return AdaptiveKernelRegressor(**{**EP3, "memory_budget": "1MB"}).fit(memmap(tmp, X, "ep3_X"), y)


def ep3_streamed_small_batch(tmp):
    # Streamed as above, with a batch whose temporary centers fit the budget.
    X, y = regression(n=20_000)
    parameters = {**EP3, "memory_budget": "1.5MB", "batch_size": 64}
    return AdaptiveKernelRegressor(**parameters).fit(memmap(tmp, X, "ep3_X_small_batch"), y)


def ep3_sharded(tmp):
    return AdaptiveKernelRegressor(**EP3, device=["cpu", "cpu"]).fit(*regression())


def sgd_in_memory(tmp):
    return BufferedSGDRegressor(**SGD).fit(*regression())


def sgd_memmap(tmp):
    X, y = regression()
    return BufferedSGDRegressor(**SGD).fit(memmap(tmp, X, "sgd_X"), y)


def sgd_sparse(tmp):
    X, y = regression()
    X[np.abs(X) < 0.5] = 0.0
    return BufferedSGDRegressor(**SGD).fit(scipy.sparse.csr_matrix(X), y)


def sgd_partial_fit(tmp):
    X, y = regression()
    model = BufferedSGDRegressor(**SGD)
    for rows in np.array_split(np.arange(X.shape[0]), 3):
        model.partial_fit(X[rows], y[rows])
    return model


def sgd_classifier(tmp):
    return BufferedSGDClassifier(loss="log_loss", **SGD).fit(*classification())


def sgd_parallel_parle(tmp):
    return BufferedSGDRegressor(parallel=Parle(n_workers=2), **SGD).fit(*regression())


def ep2_loo(tmp):
    # alpha="auto" on a regressor: the leave-one-out penalty, then EigenPro 2 on (K + alpha I).
    return AdaptiveKernelRegressor(**{**EP2, "alpha": "auto"}).fit(*regression())


def cg_full_kernel(tmp):
    # A positive alpha with every point a center on few rows: CG with K(X, X)'s own factor.
    return AdaptiveKernelRegressor(**{**EP2, "alpha": 1.0, "n_epochs": 20}).fit(*regression(n=600))


def cg_centers(tmp):
    return AdaptiveKernelRegressor(**{**EP3, "n_epochs": 20}, solver="cg", alpha=0.1).fit(*regression())


def cg_centers_loo(tmp):
    # solver="auto" with centers picks CG, and alpha="auto" the leave-one-out penalty.
    return AdaptiveKernelRegressor(**{**EP3, "n_epochs": 20, "alpha": "auto"}).fit(*regression())


def cg_centers_early_stopping(tmp):
    parameters = {**EP3, "n_epochs": 20}
    return AdaptiveKernelClassifier(**parameters, solver="cg", alpha=0.1, early_stopping=True).fit(*classification())


def sgd_early_stopping(tmp):
    return BufferedSGDRegressor(**{**SGD, "n_epochs": 8}, early_stopping=True).fit(*regression())


def sgd_tol(tmp):
    # tol on the training loss stops before n_epochs.
    return BufferedSGDRegressor(**{**SGD, "n_epochs": 30}, tol=1e-2).fit(*regression())


def sgd_parallel_data(tmp):
    return BufferedSGDRegressor(parallel=DataParallel(n_workers=2), **SGD).fit(*regression())


def sgd_parallel_adaptive(tmp):
    # AdaptiveSGD's merges depend on the workers' timing; one worker keeps the fit deterministic.
    return BufferedSGDRegressor(parallel=AdaptiveSGD(n_workers=1), **SGD).fit(*regression())


def on_grid(n=2000, n_features=8, seed=2):
    """Integer features in 0..15 (every feature on the grid of step 1) and a smooth target of them."""
    rng = np.random.RandomState(seed)
    X = rng.randint(0, 16, size=(n, n_features)).astype(np.float64)
    y = np.sin(X[:, 0] / 4) + np.cos(X[:, 1] / 5) + 0.05 * X[:, 2] * X[:, 3] / 16 + 0.1 * rng.randn(n)
    return X, y


# EigenPro 2 itself: alpha="auto" takes CG on every point above, so these fix alpha.
EP2_ITERATION = {**EP2, "alpha": 0.0, "solver": "eigenpro"}


def ep2_cached_unpenalised(tmp):
    return AdaptiveKernelRegressor(**EP2_ITERATION, cache_kernel=True).fit(*regression())


def ep2_uncached_unpenalised(tmp):
    return AdaptiveKernelRegressor(**EP2_ITERATION, cache_kernel=False).fit(*regression())


def ep2_penalised(tmp):
    return AdaptiveKernelRegressor(**{**EP2_ITERATION, "alpha": 1.0}).fit(*regression())


def ep2_grid_cached(tmp):
    # Integer data: blocks from exact int8 products where the device's int8 product is fast.
    return AdaptiveKernelRegressor(**EP2_ITERATION, cache_kernel=True).fit(*on_grid())


def ep2_grid_uncached_validation(tmp):
    parameters = {**EP2_ITERATION, "n_epochs": 4}
    return AdaptiveKernelRegressor(**parameters, cache_kernel=False, early_stopping=True).fit(*on_grid())


def ep3_eigenpro_exact(tmp):
    # EigenPro 3 itself: solver="auto" takes CG on the centers in the ep3_* fits above.
    return AdaptiveKernelRegressor(**EP3, solver="eigenpro", projection="exact").fit(*regression())


def ep3_eigenpro_iterative_cached(tmp):
    parameters = {**EP3, "solver": "eigenpro", "projection": "iterative", "cache_kernel": True}
    return AdaptiveKernelRegressor(**parameters).fit(*regression())


def cg_grid_centers(tmp):
    return AdaptiveKernelRegressor(**{**EP3, "n_epochs": 20}, solver="cg", alpha=0.1).fit(*on_grid())


# The default path (issue 64): every parameter at its default but the seed and the budget,
# 3000 rows; feature learning "auto", the tune stage, the direct solve and the
# classifier's calibration all run.
DEFAULT = {"random_state": 0, "memory_budget": 2**30}


def default_regressor(tmp):
    return AdaptiveKernelRegressor(**DEFAULT).fit(*regression(n=3000))


def default_classifier(tmp):
    return AdaptiveKernelClassifier(**DEFAULT).fit(*classification(n=3000))


FITS = (
    ep2_plain,
    ep2_early_stopping,
    ep2_warm_start,
    ep2_classifier,
    ep3_exact,
    ep3_iterative,
    ep3_cached,
    ep3_uncached,
    ep3_streamed,
    ep3_streamed_small_batch,
    ep3_sharded,
    sgd_in_memory,
    sgd_memmap,
    sgd_sparse,
    sgd_partial_fit,
    sgd_classifier,
    sgd_parallel_parle,
    ep2_loo,
    cg_full_kernel,
    cg_centers,
    cg_centers_loo,
    cg_centers_early_stopping,
    sgd_early_stopping,
    sgd_tol,
    sgd_parallel_data,
    sgd_parallel_adaptive,
    ep2_cached_unpenalised,
    ep2_uncached_unpenalised,
    ep2_penalised,
    ep2_grid_cached,
    ep2_grid_uncached_validation,
    ep3_eigenpro_exact,
    ep3_eigenpro_iterative_cached,
    cg_grid_centers,
    default_regressor,
    default_classifier,
)


# --- fingerprints ---------------------------------------------------------------------


def array_digest(values):
    """sha1 of an array's bytes, with its dtype and shape."""
    values = np.ascontiguousarray(values)
    return {"sha1": hashlib.sha1(values.tobytes()).hexdigest(), "dtype": str(values.dtype), "shape": list(values.shape)}


def plain(value):
    """``value`` as JSON types: numpy scalars and arrays to Python numbers and lists."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def is_timing(key):
    return "seconds" in key or key.endswith("samples_per_second")


def fingerprint(model):
    """The coefficients' digests, scalar decisions and timing-free history of a fitted model."""
    if hasattr(model, "dual_coef_"):
        coefficients = {"dual_coef_": array_digest(model.dual_coef_)}
    else:
        coefficients = {name: array_digest(getattr(model, name)) for name in ("coef_", "intercept_")}
    scalars = {}
    for name in SCALAR_ATTRIBUTES:
        if hasattr(model, name):
            value = getattr(model, name)
            if value is None:  # e.g. a conjugate-gradient solve has no step size or critical batch
                pass
            elif name == "learning_rate_":
                value = repr(float(value))
            elif name == "critical_batch_size_":
                value = [float(each) for each in np.atleast_1d(value)]
            scalars[name] = plain(value)
    history = [{key: plain(item) for key, item in record.items() if not is_timing(key)} for record in model.history_]
    return {"coefficients": coefficients, "scalars": scalars, "history": history}


def machine():
    """What the fingerprints depend on besides the code: CPU, its vector kernels, threads, library versions."""
    torch.set_num_threads(N_THREADS)  # the fits' thread count, whichever runs first
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{device_identity(torch.device('cpu'))}, {capability} kernels, numpy {np.__version__}"


def run_fits(prefix=""):
    """Fingerprints of every fit whose name starts with ``prefix``, by name, with torch's threads fixed."""
    torch.set_num_threads(N_THREADS)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fit in (fit for fit in FITS if fit.__name__.startswith(prefix)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. the divergence of ep3_iterative
                results[fit.__name__] = fingerprint(fit(tmp))
    return results


# --- comparison -----------------------------------------------------------------------


def same(a, b):
    """Exact equality of JSON values, types included (1 is not 1.0, True is not 1); NaN equals NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def renamed(record):
    return {RENAMED_HISTORY_KEYS.get(key, key): value for key, value in record.items()}


def history_differences(baseline, current, allowed):
    """What differs between two histories: every baseline key must keep its value."""
    if len(baseline) != len(current):
        return [f"history has {len(current)} epochs, baseline {len(baseline)}"]
    differences = []
    for epoch, (old, new) in enumerate(zip(baseline, current, strict=True), start=1):
        old, new = renamed(old), renamed(new)
        for key, value in old.items():
            if key in allowed:
                continue
            if key not in new:
                differences.append(f"history epoch {epoch}: {key} missing")
            elif not same(value, new[key]):
                differences.append(f"history epoch {epoch}: {key} {new[key]!r} != baseline {value!r}")
    return differences


def differences(name, baseline, current):
    """Human-readable differences between the baseline and current fingerprint of a fit.

    Attributes and history keys new in the current run are allowed (the refactor adds
    a common schema); every one in the baseline must keep its value.
    """
    found = []
    for section in ("coefficients", "scalars"):
        old, new = baseline[section], current[section]
        for key in old:
            if key not in new:
                found.append(f"{key} missing")
            elif not same(old[key], new[key]):
                what = "bytes" if section == "coefficients" else "value"
                found.append(f"{key} {what} {new[key]!r} != baseline {old[key]!r}")
    found += history_differences(baseline["history"], current["history"], ALLOWED_TO_CHANGE.get(name, set()))
    return found


def compare(baseline, current):
    """Print one line per fit; return whether every fit matches its baseline."""
    all_same = True
    for name in current:
        if name not in baseline:
            found = ["no baseline"]
        elif name in CHANGED_ON_PURPOSE:
            print(f"CHANGED {name}: {CHANGED_ON_PURPOSE[name]}", flush=True)
            continue
        else:
            found = differences(name, baseline[name], current[name])
        on_purpose = [line for line in found if line.split(" ")[0] in ATTRIBUTES_CHANGED_ON_PURPOSE]
        found = [line for line in found if line not in on_purpose]
        all_same = all_same and not found
        note = "".join(f" ({line}: on purpose)" for line in on_purpose)
        print(f"OK {name}{note}" if not found else f"DIFF {name}: " + "; ".join(found), flush=True)
    return all_same


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", help="write the fingerprints to FILE instead of comparing")
    parser.add_argument("--only", metavar="PREFIX", default="", help="run only the fits whose name starts so")
    args = parser.parse_args()
    if os.environ.get("OPENBLAS_CORETYPE") != "Haswell":
        print("warning: OPENBLAS_CORETYPE=Haswell is not set; the baseline was made with it", file=sys.stderr)
    print(f"skgpu_kernel from {Path(skgpu_kernel.__file__).parent}", flush=True)
    current = run_fits(args.only)
    if args.write:
        Path(args.write).write_text(json.dumps({MACHINE_KEY: machine(), **current}, indent=1) + "\n")
        print(f"wrote {len(current)} fingerprints to {args.write}")
        return 0
    baseline = json.loads(BASELINE.read_text())
    made_on, here = baseline.pop(MACHINE_KEY, "an unrecorded machine"), machine()
    if made_on != here:
        print(f"note: the baseline was made on {made_on}; this is {here}", flush=True)
    missing = [name for name in baseline if name.startswith(args.only) and name not in current]
    for name in missing:
        print(f"DIFF {name}: not run")
    return 0 if compare(baseline, current) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
