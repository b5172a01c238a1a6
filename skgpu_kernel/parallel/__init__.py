"""Several workers training one model: strategies, worker loops and the process layer.

Pass a strategy as ``parallel=`` to :class:`~skgpu_kernel.BufferedSGDRegressor` or
:class:`~skgpu_kernel.BufferedSGDClassifier`:

* :class:`DataParallel`: gradients all-reduced every step (the baseline);
* :class:`Parle`: replicas coupled elastically, communicating every ``sync_every`` steps;
* :class:`AdaptiveSGD`: dynamic batches for heterogeneous workers, merges weighted by work done.

Workers are torch.distributed processes (:mod:`skgpu_kernel.parallel.launch`).
"""

from .strategies import AdaptiveSGD, DataParallel, ParallelStrategy, Parle, SlowWorker

__all__ = ["AdaptiveSGD", "DataParallel", "ParallelStrategy", "Parle", "SlowWorker"]
