"""One rank of the two-node torchrun fits of ``tests/test_scale_out.py``.

Run by ``torchrun``: ``python _scale_out_fit.py KIND DATA.npz OUT_DIR`` fits the
model named by KIND (``eigenpro3`` or ``parle``, parameters from
:func:`estimator`) on the data, inside the process group torchrun set up, and saves
this rank's predictions (and coefficients) to ``OUT_DIR/rank<RANK>.npz``.
"""

import sys

import numpy as np
import torch.distributed as dist

from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor
from skgpu_kernel.parallel import Parle

# Fixed epochs and batch: the runs compare the same iteration in two layouts.
EIGENPRO3 = dict(
    bandwidth=2.0,
    n_centers=301,
    feature_learning=None,  # these fits compare layouts of one iteration
    n_epochs=2,
    batch_size=100,
    early_stopping=False,
    solver="eigenpro",
    projection="exact",
    cache_kernel=False,
    dtype="float64",
    random_state=0,
)
PARLE = dict(batch_size=64, n_epochs=2, tol=None, random_state=0)


def estimator(kind, distributed):
    """The estimator of ``kind``; ``distributed`` shards EigenPro 3's centers over the group."""
    if kind == "eigenpro3":
        return AdaptiveKernelRegressor(distributed=distributed, **EIGENPRO3)
    if kind == "parle":
        # Inside a process group the group's world size counts, not n_workers.
        return BufferedSGDRegressor(parallel=Parle(n_workers=2, sync_every=10), **PARLE)
    raise ValueError(f"unknown kind {kind!r}")


def fitted_arrays(model, X_test):
    """What the test compares: predictions, plus the linear model's coefficients."""
    arrays = {"predictions": model.predict(X_test)}
    if hasattr(model, "coef_"):
        arrays.update(coef=model.coef_, intercept=np.asarray(model.intercept_))
    return arrays


def main(kind, data_path, out_dir):
    dist.init_process_group("gloo")  # rank, world size and store from torchrun's environment
    try:
        data = np.load(data_path)
        model = estimator(kind, distributed=True).fit(data["X"], data["y"])
        np.savez(f"{out_dir}/rank{dist.get_rank()}.npz", **fitted_arrays(model, data["X_test"]))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
