"""Parallel training strategies: parameter objects passed as ``parallel=`` to the SGD models.

A strategy says how several workers train one linear model; the loops live in
:mod:`skgpu_kernel.parallel.worker` and the processes in
:mod:`skgpu_kernel.parallel.launch`.  Like the scaling rules, strategies hold
parameters only (``clone`` and ``GridSearchCV`` reach ``parallel__sync_every``);
each names its steps in a worker (:meth:`ParallelStrategy.worker_steps`) and the
fitted facts it adds to the model (:meth:`ParallelStrategy.fitted_facts`), so that
no other code asks which strategy it holds.
"""

import os
import time
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from ..device import resolve_device
from .worker import AdaptiveSteps, DataParallelSteps, ParleSteps

__all__ = ["AdaptiveSGD", "DataParallel", "ParallelStrategy", "Parle", "SlowWorker"]

_COMMON_CONSTRAINTS = {
    "n_workers": [Interval(Integral, 1, None, closed="left")],
    "devices": [list, tuple, None],
    "callback": [callable, None],
    "timeout": [Interval(Real, 0, None, closed="neither")],
}

_N_WORKERS_DOC = """
    n_workers : int, default=2
        Worker processes on this machine (ignored when ``devices`` is given).  CPU
        workers are limited to the number of cores: each gets at least one."""

_PLACEMENT_DOC = """
    devices : list of str or torch.device, default=None
        One entry per worker, e.g. ``["cuda:0", "cuda:1"]`` or ``["cuda:0", "cpu"]``;
        None puts ``n_workers`` workers on the default device.  Workers talk over
        NCCL when every device is a distinct GPU, over gloo otherwise.
    callback : callable, default=None
        ``callback(rank, step)``, called by every worker after each of its updates
        (e.g. to log, or to slow a worker down in an experiment).  It must be
        picklable (a module-level function) to reach spawned workers.
    timeout : float, default=600.0
        Seconds a collective may wait for a peer, and the limit on the whole run;
        beyond it the fit raises instead of hanging.
"""


class ParallelStrategy(BaseEstimator):
    """Base class: worker placement and validation shared by the strategies."""

    _parameter_constraints: ClassVar[dict] = dict(_COMMON_CONSTRAINTS)
    # What a worker runs for this strategy (:mod:`skgpu_kernel.parallel.worker`), set by each.
    _steps_class: ClassVar[type]

    def resolve_devices(self, default_device):
        """The device of each worker, validated before any process starts.

        Parameters
        ----------
        default_device : torch.device
            Where workers go when ``devices`` is None.

        Returns
        -------
        list of torch.device
        """
        self._validate_params()
        if self.devices is not None:
            if len(self.devices) == 0:
                raise ValueError("devices must name at least one device.")
            devices = [resolve_device(str(device)) for device in self.devices]
        else:
            devices = [default_device] * self.n_workers
        cpu_workers = sum(device.type == "cpu" for device in devices)
        cores = os.cpu_count() or 1
        if cpu_workers > cores:
            raise ValueError(
                f"{cpu_workers} CPU workers on a machine with {cores} cores: each worker needs a core of its own. "
                f"Use at most {cores} (n_workers or devices)."
            )
        # Workers sharing a GPU are allowed: they then talk over gloo, as NCCL needs one GPU each.
        return devices

    def worker_steps(self, context, job, coef, intercept, data):
        """This strategy's steps in one worker, driven by ``skgpu_kernel.parallel.worker.train_worker``.

        Parameters
        ----------
        context : WorkerContext
            The worker's rank, world size, device and store.
        job : TrainingJob
        coef : Tensor of shape (n_features, n_outputs)
        intercept : Tensor of shape (n_outputs,)
            The worker's model, trained in place.
        data : tuple (sources, dtypes)
            The opened row sources and the dtypes they are read in.

        Returns
        -------
        DataParallelSteps, ParleSteps or AdaptiveSteps
        """
        return self._steps_class(context, job, coef, intercept, data)

    def fitted_facts(self, history):
        """Fitted attributes this strategy adds to the model, by name, from the workers' history.

        Parameters
        ----------
        history : list of dict
            The records of the fit.

        Returns
        -------
        dict
            Empty: the figures every strategy reports are the runner's.
        """
        return {}


class DataParallel(ParallelStrategy):
    _steps_class = DataParallelSteps
    __doc__ = (
        """Synchronous data parallelism: the gradients of all workers are averaged every step.

    Each step splits the mini-batch across the workers (``ceil(batch_size /
    n_workers)`` rows each, from their own shard of the data); one all-reduce sums
    the gradients, so every replica takes the same step as a single worker with the
    whole batch.  The baseline for :class:`Parle` and :class:`AdaptiveSGD`.

    Parameters
    ----------"""
        + _N_WORKERS_DOC
        + _PLACEMENT_DOC
        + """
    Examples
    --------
    >>> from skgpu_kernel.parallel import DataParallel
    >>> DataParallel(n_workers=2)
    DataParallel()
    """
    )

    def __init__(self, n_workers=2, *, devices=None, callback=None, timeout=600.0):
        self.n_workers = n_workers
        self.devices = devices
        self.callback = callback
        self.timeout = timeout


class Parle(ParallelStrategy):
    _steps_class = ParleSteps
    __doc__ = (
        """Parle: replicas coupled elastically that communicate every ``sync_every`` steps.

    Each worker trains its own replica on its shard (Chaudhari et al. 2017).  Between
    synchronisations it takes ``sync_every`` momentum steps on an inner variable
    ``y`` pulled towards its replica ``x`` (strength ``coupling`` per step), keeping a
    running average ``z = average z + (1 - average) y``.  At a synchronisation the
    replica moves to ``z``, then a fraction ``coupling`` of the way back towards the
    reference ``xbar`` of the previous synchronisation; ``xbar`` becomes the mean of
    the replicas (one all-reduce) and the inner loop restarts from the replica.  The
    coupling grows by a factor ``1 + coupling_growth / B`` per synchronisation
    (``B`` steps per epoch), up to ``max_coupling``, so the replicas tighten as
    training proceeds.  The fitted model is the final reference ``xbar``.  An inner
    step takes the scaling rule's learning rate for the combined batch of all
    workers (``batch_size * n_workers``), counted in the worker's own steps per
    epoch: averaging the replicas' steps amounts to one step on every worker's
    samples, as in :class:`DataParallel`.

    With one worker, no coupling and ``average=0`` this is the single worker's SGD;
    with ``sync_every=1`` it is elastic averaging SGD.  Parle adds no optimiser of its
    own to the base one (the paper runs it on the same SGD, learning rate and momentum
    as its baseline): the inner steps are plain steps at the scaling rule's rate, like
    the single worker's, unless ``momentum`` is set.

    Parameters
    ----------"""
        + _N_WORKERS_DOC
        + """
    sync_every : int, default=25
        Steps ``L`` between synchronisations.
    momentum : float in [0, 1), default=0.0
        Momentum of the inner steps, with dampening ``1 - momentum`` (the velocity
        is an average of gradients), so that the scaling rule's learning rate keeps
        its meaning: without it the effective step would be ``1 / (1 - momentum)``
        times larger and analytic rules would overshoot.  Off by default: the rules
        give the best step of plain SGD (``"optimal"``: about ``1 / lambda_1`` for
        large batches), at which heavy-ball momentum ``mu`` only slows convergence,
        to a factor ``sqrt(mu)`` per step at best (0.95 for 0.9), so at equal epochs
        the model ended further from the optimum than the single worker's (5.5%
        above its test MSE with momentum 0.9 on 100k x 30, noise 0.1, 2 epochs;
        1.5% below without).
    average : float in [0, 1), default=0.75
        Weight ``alpha`` of the running average ``z``.
    coupling : float in [0, 1), default=0.01
        Initial strength of the pull of ``y`` towards ``x`` (per step) and of ``x``
        towards ``xbar`` (per synchronisation).
    coupling_growth : float >= 0, default=0.5
    max_coupling : float in [0, 1], default=0.5"""
        + _PLACEMENT_DOC
        + """
    References
    ----------
    P. Chaudhari, C. Baldassi, R. Zecchina, S. Soatto, A. Talwalkar and A. Oberman,
    "Parle: parallelizing stochastic gradient descent", arXiv:1707.00424.
    """
    )

    _parameter_constraints: ClassVar[dict] = {
        **_COMMON_CONSTRAINTS,
        "sync_every": [Interval(Integral, 1, None, closed="left")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "average": [Interval(Real, 0, 1, closed="left")],
        "coupling": [Interval(Real, 0, 1, closed="left")],
        "coupling_growth": [Interval(Real, 0, None, closed="left")],
        "max_coupling": [Interval(Real, 0, 1, closed="both")],
    }

    def __init__(
        self,
        n_workers=2,
        *,
        sync_every=25,
        momentum=0.0,
        average=0.75,
        coupling=0.01,
        coupling_growth=0.5,
        max_coupling=0.5,
        devices=None,
        callback=None,
        timeout=600.0,
    ):
        self.n_workers = n_workers
        self.sync_every = sync_every
        self.momentum = momentum
        self.average = average
        self.coupling = coupling
        self.coupling_growth = coupling_growth
        self.max_coupling = max_coupling
        self.devices = devices
        self.callback = callback
        self.timeout = timeout


class AdaptiveSGD(ParallelStrategy):
    _steps_class = AdaptiveSteps
    __doc__ = (
        """Adaptive SGD for heterogeneous workers: dynamic batches, speed-scaled batch sizes, weighted merges.

    Every worker holds a full replica (Ma, Rusu, Wu and Sim, 2021).  There is no
    static partition: a shared cursor (an atomic counter in torch.distributed's
    key-value store) hands the next rows of the pass to whichever worker asks.
    Every ``merge_every`` samples the replicas are merged, ``W = sum_i w_i W_i``,
    with ``w_i`` the share of the samples worker ``i`` processed since the last
    merge (the weights sum to 1), and the merged model replaces every replica.
    Then a worker that made more updates than the average since the last merge
    grows its batch by ``batch_step`` and the others shrink it, within
    ``[min_batch, max_batch]``: fast workers take larger batches, and in steady
    state all make about the same number of updates.  (Steering by the sample
    shares instead would feed back on itself: on most devices a larger batch alone
    raises the samples per second.)  Each worker's learning rate follows its own batch size through the
    estimator's scaling rule.

    Parameters
    ----------"""
        + _N_WORKERS_DOC
        + """
    merge_every : int or "auto", default="auto"
        Samples between merges; ``"auto"`` is ``16 * batch_size * n_workers``.
    batch_step : int, default=32
    min_batch : int or None, default=None
        None: ``max(batch_step, batch_size // 4)``.
    max_batch : int or None, default=None
        None: ``4 * batch_size``."""
        + _PLACEMENT_DOC
        + """
    References
    ----------
    Y. Ma, F. Rusu, K. Wu and A. Sim, "Adaptive stochastic gradient descent for deep
    learning on heterogeneous CPU+GPU architectures", arXiv:2110.07029.
    """
    )

    _parameter_constraints: ClassVar[dict] = {
        **_COMMON_CONSTRAINTS,
        "merge_every": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "batch_step": [Interval(Integral, 1, None, closed="left")],
        "min_batch": [Interval(Integral, 1, None, closed="left"), None],
        "max_batch": [Interval(Integral, 1, None, closed="left"), None],
    }

    def __init__(
        self,
        n_workers=2,
        *,
        merge_every="auto",
        batch_step=32,
        min_batch=None,
        max_batch=None,
        devices=None,
        callback=None,
        timeout=600.0,
    ):
        self.n_workers = n_workers
        self.merge_every = merge_every
        self.batch_step = batch_step
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.devices = devices
        self.callback = callback
        self.timeout = timeout

    def batch_bounds(self, batch_size):
        """``(min_batch, max_batch)`` resolved for the estimator's batch size."""
        low = self.min_batch if self.min_batch is not None else max(self.batch_step, batch_size // 4)
        high = self.max_batch if self.max_batch is not None else 4 * batch_size
        if low > high:
            raise ValueError(f"min_batch={low} is larger than max_batch={high}.")
        return low, high

    def samples_between_merges(self, batch_size, n_workers):
        """``merge_every`` resolved."""
        return 16 * batch_size * n_workers if self.merge_every == "auto" else self.merge_every

    def fitted_facts(self, history):
        """The merge records: one row per merge, one column per worker.

        Parameters
        ----------
        history : list of dict
            The records of the fit, one per merge.

        Returns
        -------
        dict
            ``merge_weights_`` (each worker's share of the samples since the previous
            merge) and ``worker_batch_sizes_`` (the batch each worker took).
        """
        return {
            "merge_weights_": np.array([record["merge_weights"] for record in history]),
            "worker_batch_sizes_": np.array([record["worker_batch_sizes"] for record in history]),
        }


class SlowWorker:
    """A ``callback`` that makes one worker compute ``factor`` times slower, for experiments.

    After each update of worker ``rank`` it sleeps ``factor - 1`` times the CPU time
    that worker's thread used since its previous update, so its computation, not its
    communication, slows down.  Sleeps below a millisecond are carried over to a later
    update (``time.sleep`` overshoots them), so the slow-down is right on average.  A
    class of the package, so that spawned workers can unpickle it from any script,
    notebook or documentation build.

    Parameters
    ----------
    rank : int, default=1
    factor : float, default=2.0

    Examples
    --------
    >>> from skgpu_kernel.parallel import AdaptiveSGD, SlowWorker
    >>> AdaptiveSGD(n_workers=2, callback=SlowWorker(rank=1, factor=2.0)).callback.factor
    2.0
    """

    def __init__(self, rank=1, factor=2.0):
        self.rank = rank
        self.factor = factor
        self._cpu = None
        self._owed = 0.0

    def __repr__(self):
        return f"SlowWorker(rank={self.rank}, factor={self.factor})"

    def __call__(self, rank, step):
        if rank != self.rank:
            return
        cpu = time.thread_time()
        if self._cpu is not None:
            self._owed += (self.factor - 1.0) * (cpu - self._cpu)
        if self._owed >= 1e-3:
            tic = time.perf_counter()
            time.sleep(self._owed)
            self._owed -= time.perf_counter() - tic
        self._cpu = time.thread_time()
