"""What each worker process runs: the strategies' loops on tensors.

The BMGD pipeline resolves everything once (batch size, spectrum, scaling rule,
buffer size, stopping plan) and its runner (:mod:`skgpu_kernel.parallel.runner`)
sends a :class:`TrainingJob`; :func:`train_worker` opens the data sources again in
the worker (memmaps and ``.npy`` files are re-opened, arrays arrive as
shared-memory tensors), trains and returns a :class:`WorkerOutcome`, whose model
is the same on every rank.

Every strategy runs on one epoch driver (``_drive``): a run is a sequence of
periods (passes over the rank's shard for DataParallel and Parle, the samples
between two merges for AdaptiveSGD), and the driver owns the step count, the
periods' losses, the history records, the stopping rule and the typed result.  A
strategy provides its periods' batches, its step (one update with its
communication) and how a period closes (its record), in the steps it names
(``strategy.worker_steps``: :class:`DataParallelSteps`, :class:`ParleSteps`,
:class:`AdaptiveSteps`), so that the driver never asks which strategy it runs.  A
worker out of device memory keeps its batch and its step and sums the gradients of
smaller row pieces (:class:`~skgpu_kernel.solvers.sgd.GradientPieces`), since it
cannot take smaller steps alone.  No input validation here.
"""

import contextlib
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from ..buffer import BufferPrefetcher, RangeMap, map_ranges, plan_pass, plan_passes
from ..row_sources import as_row_source
from ..solvers.epochs import EpochClock, Stopping, epoch_record
from ..solvers.sgd import (
    GradientPieces,
    SGDResult,
    apply_gradient,
    buffer_batches,
    check_finite_loss,
    penalised_loss,
)

__all__ = [
    "AdaptiveSteps",
    "DataParallelSteps",
    "ParleSteps",
    "TrainingJob",
    "WorkerOutcome",
    "open_source",
    "source_spec",
    "train_worker",
]


@dataclass
class TrainingJob:
    """Everything a worker needs, resolved by the estimator (picklable).

    Attributes
    ----------
    run : SGDRun
        Loss, scaling rule and schedule context, rounds, passes, penalty, stopping.
    sources : list
        :func:`source_spec` of X, the targets and (optionally) the weights.
    dtypes : list of str
        Torch dtype names the sources are read in.
    coef : ndarray of shape (n_features, n_outputs)
    intercept : ndarray of shape (n_outputs,)
        Starting coefficients, in the training dtype.
    buffer_size : int
    prefetch : bool
    seed : int
    first_pass : int
        Passes made by earlier calls (the chunk orders continue from there).
    segments : list of (int, int)
        Training rows.
    strategy : ParallelStrategy
    """

    run: object
    sources: list
    dtypes: list
    coef: np.ndarray
    intercept: np.ndarray
    buffer_size: int
    prefetch: bool
    seed: int
    first_pass: int
    segments: list
    strategy: object


def source_spec(data, share):
    """A picklable description of a data source (array, memmap, path, CSR) that workers open without copying it.

    ``share(array) -> tensor`` puts in-memory arrays in shared memory.  Paths and
    memory maps travel as file names and are opened again by each worker; scipy CSR
    matrices travel as three shared arrays.

    Raises
    ------
    ValueError
        For sources that cannot be opened in another process (h5py-style objects,
        iterators), before any process starts.
    """
    import os

    import scipy.sparse

    if isinstance(data, (str, os.PathLike)):
        return ("path", os.fspath(data))
    if isinstance(data, np.memmap) and isinstance(getattr(data, "filename", None), str):
        base = data
        while isinstance(base.base, np.memmap):
            base = base.base
        if data.flags.c_contiguous and base.flags.c_contiguous:
            start = data.ctypes.data - base.ctypes.data + base.offset
            return ("memmap", data.filename, data.dtype.str, data.shape, int(start))
        return ("shared", share(np.ascontiguousarray(data)))
    if scipy.sparse.issparse(data):
        matrix = scipy.sparse.csr_matrix(data)
        return ("csr", share(matrix.data), share(matrix.indices), share(matrix.indptr), matrix.shape)
    if isinstance(data, np.ndarray):
        return ("shared", share(np.ascontiguousarray(data)))
    raise ValueError(
        f"A parallel fit cannot hand a {type(data).__name__} to worker processes: pass an array, a memory map, "
        "the path of a .npy file or a scipy sparse matrix (an h5py/zarr dataset: save it as .npy, or use "
        "parallel=None)."
    )


def open_source(spec):
    """The :class:`~skgpu_kernel.row_sources.RowSource` for a :func:`source_spec`."""
    kind = spec[0]
    if kind == "path":
        return as_row_source(spec[1])
    if kind == "memmap":
        _, filename, dtype, shape, offset = spec
        return as_row_source(np.memmap(filename, dtype=np.dtype(dtype), mode="r", shape=tuple(shape), offset=offset))
    if kind == "csr":
        import scipy.sparse

        _, data, indices, indptr, shape = spec
        return as_row_source(scipy.sparse.csr_matrix((data.numpy(), indices.numpy(), indptr.numpy()), shape=shape))
    return as_row_source(spec[1].numpy())


@dataclass
class WorkerOutcome:
    """What a worker returns: its run (records, steps, last learning rate), the model, its traffic."""

    result: SGDResult
    coef: np.ndarray
    intercept: np.ndarray
    bytes_all_reduced: int


def train_worker(context, job):
    """Entry point of a worker: train with ``job.strategy`` and return a :class:`WorkerOutcome`."""
    device = context.device
    sources = [open_source(spec) for spec in job.sources]
    try:
        coef = torch.as_tensor(job.coef).to(device)
        intercept = torch.as_tensor(job.intercept).to(device)
        dtypes = [getattr(torch, name) for name in job.dtypes]
        steps = job.strategy.worker_steps(context, job, coef, intercept, (sources, dtypes))
        result, traffic = _drive(context, job, steps), steps.traffic
        return WorkerOutcome(result, coef.cpu().numpy(), intercept.cpu().numpy(), traffic.bytes)
    finally:
        for source in sources:
            source.close()


class _Traffic:
    """Counts the bytes this worker all-reduces."""

    def __init__(self):
        self.bytes = 0

    def all_reduce(self, tensor):
        dist.all_reduce(tensor)
        self.bytes += tensor.numel() * tensor.element_size()
        return tensor


def _pack(*tensors):
    return torch.cat([tensor.reshape(-1) for tensor in tensors])


def _unpack(flat, *like):
    parts, start = [], 0
    for tensor in like:
        parts.append(flat[start : start + tensor.numel()].view_as(tensor))
        start += tensor.numel()
    return parts


def _shard(job, rank, world_size):
    """This rank's equal share of the training rows (the last ``n mod world_size`` rows are left out)."""
    n_train = sum(stop - start for start, stop in job.segments)
    share = n_train // world_size
    if share < 1:
        raise ValueError(f"{n_train} training rows cannot be shared among {world_size} workers.")
    return map_ranges(job.segments, [(rank * share, (rank + 1) * share)]), share


def _shard_passes(context, job, sources, dtypes):
    """Buffers of this rank's shard for every pass, and the number of buffers per pass."""
    segments, share = _shard(job, context.rank, context.world_size)
    buffer_size = min(job.buffer_size, share)
    plans = plan_passes(segments, buffer_size, job.seed, job.first_pass, job.run.n_epochs, job.run.shuffle)
    flat = [buffer for plan in plans for buffer in plan]
    prefetcher = BufferPrefetcher(sources, flat, context.device, dtypes, prefetch=job.prefetch)
    return prefetcher, len(plans[0]), share


def _pass_batches(buffers, buffers_per_pass, run, batch_size, generator):
    """The mini-batches ``(X, targets, weights)`` of one pass: ``n_rounds`` rounds over each of its buffers."""
    for _ in range(buffers_per_pass):
        X, targets, *weights = next(buffers)
        for _ in range(run.n_rounds):
            yield from buffer_batches(X, targets, weights[0] if weights else None, batch_size, run.shuffle, generator)


@dataclass
class _Period:
    """What the steps of one period (a pass, or the samples between two merges) added up to."""

    loss_total: torch.Tensor
    rows: int = 0
    updates: int = 0

    def add(self, loss_sum, rows):
        self.loss_total += loss_sum
        self.rows += rows
        self.updates += 1


def _drive(context, job, steps):
    """The epoch driver of every strategy; returns the worker's :class:`~skgpu_kernel.solvers.sgd.SGDResult`.

    A run is a sequence of periods: passes over the rank's shard for DataParallel
    and Parle, the samples between two merges for AdaptiveSGD.  The strategy
    provides each period's batches, its step (one update with its communication)
    and how a period closes (its record, with the strategy's communication); the
    driver owns the step count, the period's loss, the records, the stopping rule
    and the typed result.  Out of device memory, a strategy's step takes its
    gradient in pieces (:class:`~skgpu_kernel.solvers.sgd.GradientPieces`).
    """
    run, coef = job.run, steps.coef
    stopping, clock, history = Stopping(run.stopping), EpochClock(coef.device), []
    step, rate, callback = run.start_step, math.nan, job.strategy.callback
    with steps.opened():
        for batches in steps.periods():
            clock.start()
            period = _Period(torch.zeros((), dtype=coef.dtype, device=coef.device))
            for batch in batches:
                loss_sum, rows, rate = steps.step(batch, step)
                period.add(loss_sum, rows)
                step += 1
                if callback is not None:
                    callback(context.rank, step)
            check_finite_loss(period.loss_total, step, rate, run.alpha)
            history.append(steps.close(period, step, rate, clock.seconds()))
            if steps.stops(stopping, history[-1]):
                break
            steps.step_factor = stopping.step_factor
    steps.finish()
    return SGDResult(
        n_epochs=steps.passes_run(history),
        n_steps=step - run.start_step,
        batch_size=run.batch_size,
        learning_rate=rate,
        io_wait_seconds=0.0,
        seconds=sum(record["seconds"] for record in history),
        history=history,
        converged=stopping.converged,
    )


class _PassSteps:
    """What DataParallel and Parle share: passes over this rank's shard, one record per pass."""

    def __init__(self, context, job, coef, intercept, data):
        self.context, self.job, self.run = context, job, job.run
        self.coef, self.intercept = coef, intercept
        self.data, self.traffic = data, _Traffic()
        self.gradient = GradientPieces(job.run.loss)
        self.generator = torch.Generator().manual_seed(
            int(np.random.RandomState([job.seed, context.rank, 2]).randint(2**31))
        )
        self.prefetcher, self.buffers_per_pass, self.share = _shard_passes(context, job, *data)
        self.passes_closed = 0
        self.step_factor = 1.0  # the stopping rule's annealing (every rank judges the same records)

    def opened(self):
        return self.prefetcher

    def periods(self):
        buffers = iter(self.prefetcher)
        for _ in range(self.run.n_epochs):
            yield _pass_batches(buffers, self.buffers_per_pass, self.run, self.batch_size, self.generator)

    def close(self, period, step, rate, seconds):
        self.passes_closed += 1
        return epoch_record(
            self.passes_closed,
            step,
            self.pass_loss(period.loss_total, period.rows),
            rate,
            seconds,
            samples_per_second=period.rows / max(seconds, 1e-12),
            bytes_all_reduced=self.traffic.bytes,
        )

    def passes_run(self, history):
        return len(history)

    def finish(self):
        return None


class DataParallelSteps(_PassSteps):
    """Every step: local gradients on ``ceil(m / workers)`` rows, one all-reduce, the same step everywhere."""

    def __init__(self, context, job, coef, intercept, data):
        super().__init__(context, job, coef, intercept, data)
        self.batch_size = max(math.ceil(job.run.batch_size / context.world_size), 1)

    def step(self, batch, step):
        run, coef = self.run, self.coef
        loss_sum, coef_gradient, intercept_gradient = self.gradient(coef, self.intercept, batch)
        count = torch.full((1,), float(batch[0].shape[0]), dtype=coef.dtype, device=coef.device)
        flat = self.traffic.all_reduce(_pack(coef_gradient, intercept_gradient, loss_sum, count))
        coef_gradient, intercept_gradient, loss_sum, count = _unpack(
            flat, coef_gradient, intercept_gradient, loss_sum, count
        )
        global_batch = round(float(count))
        rate = self.step_factor * run.rule(step, replace(run.context, batch_size=global_batch))
        apply_gradient(
            coef, self.intercept, coef_gradient, intercept_gradient, global_batch, rate, run.alpha, run.fit_intercept
        )
        return loss_sum, global_batch, rate

    def pass_loss(self, loss_total, rows_total):
        return penalised_loss(loss_total, rows_total, self.coef, self.run.alpha)

    def stops(self, stopping, record):
        # The all-reduced loss of the shared model: every rank judges the same record.
        return stopping.should_stop(record)


class ParleSteps(_PassSteps):
    """Parle's inner loop, elastic synchronisation every ``sync_every`` steps; ``coef`` ends as ``xbar``."""

    def __init__(self, context, job, coef, intercept, data):
        super().__init__(context, job, coef, intercept, data)
        run, self.strategy, self.world = job.run, job.strategy, context.world_size
        self.batch_size = run.batch_size
        steps_per_epoch = run.n_rounds * math.ceil(self.share / run.batch_size)
        # A worker passes over its shard only: its schedule counts its own steps per epoch.
        self.schedule = replace(run.context, steps_per_epoch=steps_per_epoch)
        self.growth = 1.0 + self.strategy.coupling_growth / max(steps_per_epoch, 1)
        # Replica x (coef, intercept), inner variable y, running average z, momentum v.
        self.reference = [coef.clone(), intercept.clone()]
        self.inner = [coef.clone(), intercept.clone()]
        self.averaged = [coef.clone(), intercept.clone()]
        self.velocity = [torch.zeros_like(coef), torch.zeros_like(intercept)]
        self.coupling, self.local_steps = self.strategy.coupling, 0

    def step(self, batch, step):
        run, strategy, inner = self.run, self.strategy, self.inner
        m = batch[0].shape[0]
        loss_sum, coef_gradient, intercept_gradient = self.gradient(inner[0], inner[1], batch)
        # Averaging the replicas' steps is one step on the samples of all workers:
        # the rule sees that combined batch, as DataParallel's does.
        rate = self.step_factor * run.rule(step, replace(self.schedule, batch_size=m * self.world))
        gradients = [coef_gradient / m + run.alpha * inner[0], intercept_gradient / m]
        if not run.fit_intercept:
            gradients[1] = torch.zeros_like(gradients[1])
        replicas = (self.coef, self.intercept)
        for y, x, v, g, z in zip(inner, replicas, self.velocity, gradients, self.averaged, strict=True):
            v.mul_(strategy.momentum).add_(g, alpha=1.0 - strategy.momentum)
            y.sub_(v, alpha=rate)
            y.sub_(y - x, alpha=self.coupling)
            z.mul_(strategy.average).add_(y, alpha=1.0 - strategy.average)
        self.local_steps += 1
        if self.local_steps % strategy.sync_every == 0:
            self._synchronise()
        return loss_sum, m, rate

    def _synchronise(self):
        for replica, average, ref in zip((self.coef, self.intercept), self.averaged, self.reference, strict=True):
            replica.copy_(average - self.coupling * (average - ref))
        flat = self.traffic.all_reduce(_pack(self.coef, self.intercept)) / self.world
        new_coef, new_intercept = _unpack(flat, self.coef, self.intercept)
        self.reference[0].copy_(new_coef)
        self.reference[1].copy_(new_intercept)
        for state in (self.inner, self.averaged):
            state[0].copy_(self.coef)
            state[1].copy_(self.intercept)
        self.coupling = min(self.coupling * self.growth, self.strategy.max_coupling)

    def pass_loss(self, loss_total, rows_total):
        # The penalty of the inner iterate, where this worker measured its losses.
        return penalised_loss(loss_total, rows_total, self.inner[0], self.run.alpha)

    def stops(self, stopping, record):
        """The stopping rule on the workers' mean training loss of a pass (each measured its own shard).

        The mean is recorded as ``workers_train_loss``.
        """
        if stopping.plan.monitor == "none":
            return False
        losses = torch.tensor([record["train_loss"]], dtype=torch.float64)
        record["workers_train_loss"] = float(self.traffic.all_reduce(losses)[0]) / self.world
        return stopping.should_stop({**record, "train_loss": record["workers_train_loss"]})

    def finish(self):
        if self.local_steps % self.strategy.sync_every:
            self._synchronise()  # every rank has taken the same number of steps, so all reach this together
        self.coef.copy_(self.reference[0])
        self.intercept.copy_(self.reference[1])


class AdaptiveSteps:
    """Dynamic batches from a shared cursor, weighted merges, batch sizes following worker speed.

    A period is the samples between two merges.  A claim is a range of positions in
    the concatenated passes; one that starts beyond the period's boundary belongs to
    a later period, so the period closes (the workers merge) before it is used.
    """

    def __init__(self, context, job, coef, intercept, data):
        self.context, self.job, self.run = context, job, job.run
        self.coef, self.intercept, self.data = coef, intercept, data
        self.gradient = GradientPieces(job.run.loss)
        world = context.world_size
        low, high = job.strategy.batch_bounds(job.run.batch_size)
        self.claims = _Claims(job, low, world)
        self.merges = _Merges(context, job, coef, intercept, (low, high))
        self.traffic = self.merges.traffic
        # Earlier updates (partial_fit) count in this worker's updates, about world * batch samples each.
        self.epochs_before = job.run.start_step * world * job.run.batch_size / self.claims.n_train
        self.cursor = f"adaptive_sgd_cursor_{job.seed}_{job.first_pass}"
        self.pending, self.epochs_judged = None, 0
        self.step_factor = 1.0  # the stopping rule's annealing (every rank judges the same records)

    def opened(self):
        return contextlib.nullcontext()

    def periods(self):
        while self.merges.done < self.claims.n_merges:
            yield self._claims_until(self.claims.boundary(self.merges.done + 1))

    def _claims_until(self, boundary):
        """The claims of the period that ends at position ``boundary``, read: ``((X, targets, weights), start)``."""
        while True:
            if self.pending is None:
                end = int(self.context.store.add(self.cursor, self.merges.batch))
                self.pending = (end - self.merges.batch, end)
            start, end = self.pending
            if start >= boundary:
                return  # this claim belongs to a later period: merge with the others first
            self.pending = None
            stop = min(end, self.claims.total)
            sources, dtypes = self.data
            X, targets, *weights = _read(sources, dtypes, self.claims.rows_of(start, stop), self.context.device)
            yield (X, targets, weights[0] if weights else None), start
            if stop >= boundary:
                return  # this claim crossed the boundary: the others merge on their next claim

    def step(self, claim, step):
        run, (batch, start) = self.run, claim
        m = batch[0].shape[0]
        # The schedule sees the claim's position in epochs (continuing earlier calls),
        # counted in this worker's own updates.
        steps_per_epoch = self.claims.n_train / (self.context.world_size * self.merges.batch)
        schedule = replace(run.context, batch_size=m, steps_per_epoch=steps_per_epoch)
        position = int((self.epochs_before + start / self.claims.n_train) * steps_per_epoch)
        rate = self.step_factor * run.rule(position, schedule)
        loss_sum, coef_gradient, intercept_gradient = self.gradient(self.coef, self.intercept, batch)
        apply_gradient(
            self.coef, self.intercept, coef_gradient, intercept_gradient, m, rate, run.alpha, run.fit_intercept
        )
        return loss_sum, m, rate

    def close(self, period, step, rate, seconds):
        return self.merges.merge(self.claims, period, (step, rate, seconds))

    def stops(self, stopping, record):
        """The stopping rule, at the first merge of each pass (merges are in step on every rank)."""
        if math.floor(record["epoch"]) <= self.epochs_judged:
            return False
        self.epochs_judged = math.floor(record["epoch"])
        return stopping.should_stop(record)

    def passes_run(self, history):
        # Passes begun: the last merge closes a pass, or falls in the pass where the rule stopped.
        return math.ceil(history[-1]["epoch"]) if history else 0

    def finish(self):
        return None


def _read(sources, dtypes, ranges, device):
    """The rows ``ranges`` of every source, as tensors on ``device``."""
    tensors = []
    for source, dtype in zip(sources, dtypes, strict=True):
        values = source.read(ranges)
        tensors.append(torch.as_tensor(np.ascontiguousarray(values)).to(device, dtype))
    return tensors


class _Claims:
    """Where AdaptiveSGD's claims fall: rows of the shared pass orders, and the merge boundaries.

    A claim is a range of positions in the concatenated passes (``n_epochs`` times
    the training rows); every worker derives the same pass orders from the seed.
    """

    def __init__(self, job, low, world):
        self.job = job
        self.n_train = sum(stop - start for start, stop in job.segments)
        self.total = self.n_train * job.run.n_epochs
        self.between = job.strategy.samples_between_merges(job.run.batch_size, world)
        self.n_merges = math.ceil(self.total / self.between)
        # Small chunks keep the rows of one claim from different places of the data.
        self.chunk = max(1, low // 8)
        self.training_rows = RangeMap(job.segments)
        self.pass_orders = {}

    def boundary(self, index):
        """Position of merge ``index`` (from 1) in the concatenated passes."""
        return min(index * self.between, self.total)

    def rows_of(self, start, stop):
        """Row ranges of the positions ``start:stop``."""
        ranges = []
        while start < stop:
            index, offset = divmod(start, self.n_train)
            if index not in self.pass_orders:
                self.pass_orders.clear()
                rng = np.random.RandomState([self.job.seed, self.job.first_pass + index, 1])
                order = plan_pass(self.n_train, self.n_train, self.chunk, rng, shuffle=self.job.run.shuffle)[0]
                self.pass_orders[index] = RangeMap(order)
            take = min(stop - start, self.n_train - offset)
            ranges += self.training_rows(self.pass_orders[index]([(offset, offset + take)]))
            start += take
        return ranges


class _Merges:
    """AdaptiveSGD's weighted merges, their history records, and the batch that follows the worker's speed."""

    def __init__(self, context, job, coef, intercept, bounds):
        self.context, self.job, self.coef, self.intercept = context, job, coef, intercept
        self.low, self.high = bounds
        self.batch = min(max(job.run.batch_size, self.low), self.high)
        self.traffic = _Traffic()
        self.done = 0

    def merge(self, claims, period, at):
        """``W = sum_i w_i W_i`` with ``w_i`` the share of samples since the last merge; then adapt the batch.

        ``period`` holds this worker's samples, updates and summed loss since the last
        merge; ``at`` is ``(step, rate, seconds)``.  Returns the merge's record.
        """
        step, rate, elapsed = at
        rank, world = self.context.rank, self.context.world_size
        shares = torch.zeros(4 * world + 1, dtype=torch.float64)
        shares[rank] = period.rows
        shares[world + rank] = self.batch
        shares[2 * world + rank] = period.rows / max(elapsed, 1e-12)
        shares[3 * world + rank] = period.updates
        shares[4 * world] = float(period.loss_total)
        shares = self.traffic.all_reduce(shares.to(self.coef.device)).cpu()
        counts = shares[:world]
        weights = counts / counts.sum() if counts.sum() > 0 else torch.full((world,), 1.0 / world, dtype=torch.float64)
        merged = self.traffic.all_reduce(_pack(self.coef, self.intercept) * float(weights[rank]))
        new_coef, new_intercept = _unpack(merged, self.coef, self.intercept)
        self.coef.copy_(new_coef)
        self.intercept.copy_(new_intercept)
        record = epoch_record(
            claims.boundary(self.done + 1) / claims.n_train,
            step,
            penalised_loss(shares[4 * world], float(counts.sum()), self.coef, self.job.run.alpha),
            rate,
            elapsed,
            merge=self.done + 1,
            merge_weights=weights.tolist(),
            worker_batch_sizes=shares[world : 2 * world].tolist(),
            worker_samples_per_second=shares[2 * world : 3 * world].tolist(),
            worker_updates=shares[3 * world : 4 * world].tolist(),
            bytes_all_reduced=self.traffic.bytes,
        )
        # Towards equal update counts: a worker that updated more often than the
        # average is fast, and takes larger batches (and so fewer updates).
        updates = shares[3 * world : 4 * world]
        if updates[rank] > updates.mean():
            self.batch = min(self.batch + self.job.strategy.batch_step, self.high)
        elif updates[rank] < updates.mean():
            self.batch = max(self.batch - self.job.strategy.batch_step, self.low)
        self.done += 1
        return record
