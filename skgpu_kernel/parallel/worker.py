"""What each worker process runs: DataParallel, Parle and AdaptiveSGD loops on tensors.

The estimator shell resolves everything once (batch size, spectrum, scaling rule,
buffer size) and sends a :class:`TrainingJob`; :func:`train_worker` opens the data
sources again in the worker (memmaps and ``.npy`` files are re-opened, arrays
arrive as shared-memory tensors), trains with the strategy's loop and returns the
model, which is the same on every rank at the end.  No input validation here.
"""

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.distributed as dist

from ..buffer import BufferPrefetcher, RangeMap, as_row_source, map_ranges, plan_pass, plan_passes
from ..device import synchronize
from ..solvers.losses import make_loss
from ..solvers.sgd import apply_gradient, batch_gradient, buffer_batches, check_finite_loss
from .strategies import AdaptiveSGD, DataParallel, Parle

__all__ = ["TrainingJob", "open_source", "source_spec", "train_worker"]


@dataclass
class TrainingJob:
    """Everything a worker needs, resolved by the estimator (picklable)."""

    sources: list
    dtypes: list
    loss: tuple
    coef: np.ndarray
    intercept: np.ndarray
    rule: object
    context: object
    batch_size: int
    buffer_size: int
    n_rounds: int
    n_epochs: int
    shuffle: bool
    prefetch: bool
    alpha: float
    fit_intercept: bool
    seed: int
    first_pass: int
    start_step: int
    segments: list
    strategy: object
    dtype: str
    extra: dict = field(default_factory=dict)


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
    """The :class:`~skgpu_kernel.buffer.RowSource` for a :func:`source_spec`."""
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


def train_worker(context, job):
    """Entry point of a worker: train with ``job.strategy`` and return the model and records."""
    device = context.device
    dtype = getattr(torch, job.dtype)
    sources = [open_source(spec) for spec in job.sources]
    try:
        loss = make_loss(*job.loss)
        coef = torch.as_tensor(job.coef, dtype=dtype).to(device)
        intercept = torch.as_tensor(job.intercept, dtype=dtype).to(device)
        dtypes = [getattr(torch, name) for name in job.dtypes]
        generator = torch.Generator().manual_seed(
            int(np.random.RandomState([job.seed, context.rank, 2]).randint(2**31))
        )
        run = {DataParallel: _data_parallel, Parle: _parle, AdaptiveSGD: _adaptive}[type(job.strategy)]
        result = run(context, job, sources, dtypes, loss, coef, intercept, generator)
        result["coef"] = coef.cpu().numpy()
        result["intercept"] = intercept.cpu().numpy()
        return result
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
    plans = plan_passes(segments, buffer_size, job.seed, job.first_pass, job.n_epochs, job.shuffle)
    flat = [buffer for plan in plans for buffer in plan]
    prefetcher = BufferPrefetcher(sources, flat, context.device, dtypes, prefetch=job.prefetch)
    return prefetcher, len(plans[0]), share


def _shard_epochs(context, job, sources, dtypes, batch_size, generator):
    """This rank's prefetcher, its shard's size, and per pass ``(epoch, iterator over its mini-batches)``."""
    prefetcher, buffers_per_pass, share = _shard_passes(context, job, sources, dtypes)

    def pass_batches(buffers):
        for _ in range(buffers_per_pass):
            X, targets, *weights = next(buffers)
            for _ in range(job.n_rounds):
                yield from buffer_batches(
                    X, targets, weights[0] if weights else None, batch_size, job.shuffle, generator
                )

    def passes():
        buffers = iter(prefetcher)
        for epoch in range(job.n_epochs):
            yield epoch, pass_batches(buffers)

    return prefetcher, share, passes()


def _pass_record(epoch, loss_sum, rows, seconds, rate, step, traffic):
    return {
        "epoch": epoch + 1,
        "train_loss": float(loss_sum) / max(rows, 1),
        "learning_rate": rate,
        "n_steps": step,
        "seconds": seconds,
        "samples_per_second": rows / max(seconds, 1e-12),
        "bytes_all_reduced": traffic.bytes,
    }


def _data_parallel(context, job, sources, dtypes, loss, coef, intercept, generator):
    """Every step: local gradients on ``ceil(m / workers)`` rows, one all-reduce, the same step everywhere."""
    traffic = _Traffic()
    local_batch = max(math.ceil(job.batch_size / context.world_size), 1)
    prefetcher, _, passes = _shard_epochs(context, job, sources, dtypes, local_batch, generator)
    step, rate, history = job.start_step, math.nan, []
    callback = job.strategy.callback
    with prefetcher:
        for epoch, batches in passes:
            tic = time.perf_counter()
            loss_total = torch.zeros((), dtype=coef.dtype, device=coef.device)
            rows_total = 0
            for X_batch, target_batch, weight_batch in batches:
                loss_sum, coef_gradient, intercept_gradient = batch_gradient(
                    loss, coef, intercept, X_batch, target_batch, weight_batch
                )
                count = torch.full((1,), float(X_batch.shape[0]), dtype=coef.dtype, device=coef.device)
                flat = traffic.all_reduce(_pack(coef_gradient, intercept_gradient, loss_sum, count))
                coef_gradient, intercept_gradient, loss_sum, count = _unpack(
                    flat, coef_gradient, intercept_gradient, loss_sum, count
                )
                global_batch = round(float(count))
                rate = job.rule(step, replace(job.context, batch_size=global_batch))
                apply_gradient(
                    coef, intercept, coef_gradient, intercept_gradient, global_batch, rate, job.alpha, job.fit_intercept
                )
                loss_total += loss_sum
                rows_total += global_batch
                step += 1
                if callback is not None:
                    callback(context.rank, step)
            check_finite_loss(loss_total, step, rate)
            synchronize(coef.device)
            history.append(_pass_record(epoch, loss_total, rows_total, time.perf_counter() - tic, rate, step, traffic))
    return {"history": history, "n_steps": step - job.start_step, "learning_rate": rate, "bytes": traffic.bytes}


def _parle(context, job, sources, dtypes, loss, coef, intercept, generator):
    """Parle's inner loop, elastic synchronisation every ``sync_every`` steps; ``coef`` ends as ``xbar``."""
    strategy = job.strategy
    traffic = _Traffic()
    prefetcher, share, passes = _shard_epochs(context, job, sources, dtypes, job.batch_size, generator)
    steps_per_epoch = job.n_rounds * math.ceil(share / job.batch_size)
    # A worker passes over its shard only: its schedule counts its own steps per epoch.
    schedule = replace(job.context, steps_per_epoch=steps_per_epoch)
    growth = 1.0 + strategy.coupling_growth / max(steps_per_epoch, 1)
    coupling = strategy.coupling
    # Replica x (coef, intercept), inner variable y, running average z, momentum v.
    reference = [coef.clone(), intercept.clone()]
    inner = [coef.clone(), intercept.clone()]
    averaged = [coef.clone(), intercept.clone()]
    velocity = [torch.zeros_like(coef), torch.zeros_like(intercept)]
    step, rate, history, local_steps = job.start_step, math.nan, [], 0
    callback = strategy.callback

    def synchronise():
        nonlocal coupling
        for replica, average, ref in zip((coef, intercept), averaged, reference, strict=True):
            replica.copy_(average - coupling * (average - ref))
        flat = traffic.all_reduce(_pack(coef, intercept)) / context.world_size
        new_coef, new_intercept = _unpack(flat, coef, intercept)
        reference[0].copy_(new_coef)
        reference[1].copy_(new_intercept)
        for state in (inner, averaged):
            state[0].copy_(coef)
            state[1].copy_(intercept)
        coupling = min(coupling * growth, strategy.max_coupling)

    with prefetcher:
        for epoch, batches in passes:
            tic = time.perf_counter()
            loss_total = torch.zeros((), dtype=coef.dtype, device=coef.device)
            rows_total = 0
            for X_batch, target_batch, weight_batch in batches:
                m = X_batch.shape[0]
                loss_sum, coef_gradient, intercept_gradient = batch_gradient(
                    loss, inner[0], inner[1], X_batch, target_batch, weight_batch
                )
                # Averaging the replicas' steps is one step on the samples of all workers:
                # the rule sees that combined batch, as DataParallel's does.
                rate = job.rule(step, replace(schedule, batch_size=m * context.world_size))
                gradients = [coef_gradient / m + job.alpha * inner[0], intercept_gradient / m]
                if not job.fit_intercept:
                    gradients[1] = torch.zeros_like(gradients[1])
                for y, x, v, g, z in zip(inner, (coef, intercept), velocity, gradients, averaged, strict=True):
                    v.mul_(strategy.momentum).add_(g, alpha=1.0 - strategy.momentum)
                    y.sub_(v, alpha=rate)
                    y.sub_(y - x, alpha=coupling)
                    z.mul_(strategy.average).add_(y, alpha=1.0 - strategy.average)
                loss_total += loss_sum
                rows_total += m
                step += 1
                local_steps += 1
                if local_steps % strategy.sync_every == 0:
                    synchronise()
                if callback is not None:
                    callback(context.rank, step)
            check_finite_loss(loss_total, step, rate)
            synchronize(coef.device)
            history.append(_pass_record(epoch, loss_total, rows_total, time.perf_counter() - tic, rate, step, traffic))
    if local_steps % strategy.sync_every:
        synchronise()  # every rank has taken the same number of steps, so all reach this together
    coef.copy_(reference[0])
    intercept.copy_(reference[1])
    return {"history": history, "n_steps": step - job.start_step, "learning_rate": rate, "bytes": traffic.bytes}


def _adaptive(context, job, sources, dtypes, loss, coef, intercept, generator):
    """Dynamic batches from a shared cursor, weighted merges, batch sizes following worker speed."""
    strategy = job.strategy
    rank, world = context.rank, context.world_size
    traffic = _Traffic()
    n_train = sum(stop - start for start, stop in job.segments)
    total = n_train * job.n_epochs
    low, high = strategy.batch_bounds(job.batch_size)
    batch = min(max(job.batch_size, low), high)
    between = strategy.samples_between_merges(job.batch_size, world)
    # Earlier updates (partial_fit) count in this worker's updates, about world * batch samples each.
    epochs_before = job.start_step * world * job.batch_size / n_train
    n_merges = math.ceil(total / between)
    # Small chunks keep the rows of one claim from different places of the data.
    chunk = max(1, low // 8)
    training_rows = RangeMap(job.segments)
    pass_orders = {}

    def rows_of(start, stop):
        ranges = []
        while start < stop:
            index, offset = divmod(start, n_train)
            if index not in pass_orders:
                pass_orders.clear()
                rng = np.random.RandomState([job.seed, job.first_pass + index, 1])
                pass_orders[index] = RangeMap(plan_pass(n_train, n_train, chunk, rng, shuffle=job.shuffle)[0])
            take = min(stop - start, n_train - offset)
            ranges += training_rows(pass_orders[index]([(offset, offset + take)]))
            start += take
        return ranges

    def read(ranges):
        tensors = []
        for source, dtype in zip(sources, dtypes, strict=True):
            values = source.read(ranges)
            tensors.append(torch.as_tensor(np.ascontiguousarray(values)).to(context.device, dtype))
        return tensors

    cursor = f"adaptive_sgd_cursor_{job.seed}_{job.first_pass}"
    samples_since, updates_since, merges_done = 0, 0, 0
    tic = time.perf_counter()
    step, rate, history = 0, math.nan, []
    loss_total = torch.zeros((), dtype=coef.dtype, device=coef.device)
    callback = strategy.callback

    def boundary(index):
        return min(index * between, total)

    def merge():
        nonlocal samples_since, updates_since, merges_done, batch, tic, loss_total
        elapsed = time.perf_counter() - tic
        shares = torch.zeros(4 * world + 1, dtype=torch.float64)
        shares[rank] = samples_since
        shares[world + rank] = batch
        shares[2 * world + rank] = samples_since / max(elapsed, 1e-12)
        shares[3 * world + rank] = updates_since
        shares[4 * world] = float(loss_total)
        shares = traffic.all_reduce(shares.to(coef.device)).cpu()
        counts = shares[:world]
        weights = counts / counts.sum() if counts.sum() > 0 else torch.full((world,), 1.0 / world, dtype=torch.float64)
        weight = float(weights[rank])
        merged = traffic.all_reduce(_pack(coef, intercept) * weight)
        new_coef, new_intercept = _unpack(merged, coef, intercept)
        coef.copy_(new_coef)
        intercept.copy_(new_intercept)
        history.append(
            {
                "merge": merges_done + 1,
                "epoch": boundary(merges_done + 1) / n_train,
                "seconds": elapsed,
                "merge_weights": weights.tolist(),
                "worker_batch_sizes": shares[world : 2 * world].tolist(),
                "worker_samples_per_second": shares[2 * world : 3 * world].tolist(),
                "worker_updates": shares[3 * world : 4 * world].tolist(),
                "train_loss": float(shares[4 * world]) / max(float(counts.sum()), 1.0),
                "bytes_all_reduced": traffic.bytes,
            }
        )
        # Towards equal update counts: a worker that updated more often than the
        # average is fast, and takes larger batches (and so fewer updates).
        updates = shares[3 * world : 4 * world]
        if updates[rank] > updates.mean():
            batch = min(batch + strategy.batch_step, high)
        elif updates[rank] < updates.mean():
            batch = max(batch - strategy.batch_step, low)
        samples_since, updates_since, merges_done = 0, 0, merges_done + 1
        loss_total = torch.zeros((), dtype=coef.dtype, device=coef.device)
        tic = time.perf_counter()

    while merges_done < n_merges:
        end = int(context.store.add(cursor, batch))
        start = end - batch
        while merges_done < n_merges and start >= boundary(merges_done + 1):
            merge()  # this claim belongs to a later period: merge with the others first
        if merges_done >= n_merges:
            break
        stop = min(end, total)
        X_batch, target_batch, *weights = read(rows_of(start, stop))
        m = X_batch.shape[0]
        # The schedule sees the global position of this claim, in this worker's own updates.
        # The schedule sees the claim's position in epochs (continuing earlier calls),
        # counted in this worker's own updates.
        steps_per_epoch = n_train / (world * batch)
        schedule = replace(job.context, batch_size=m, steps_per_epoch=steps_per_epoch)
        rate = job.rule(int((epochs_before + start / n_train) * steps_per_epoch), schedule)
        loss_sum, coef_gradient, intercept_gradient = batch_gradient(
            loss, coef, intercept, X_batch, target_batch, weights[0] if weights else None
        )
        apply_gradient(coef, intercept, coef_gradient, intercept_gradient, m, rate, job.alpha, job.fit_intercept)
        loss_total += loss_sum
        check_finite_loss(loss_total, step, rate)
        samples_since += m
        updates_since += 1
        step += 1
        if callback is not None:
            callback(rank, step)
        if stop >= boundary(merges_done + 1):
            merge()  # this claim crossed the boundary: the others will merge on their next claim
    return {
        "history": history,
        "n_steps": step,
        "learning_rate": rate,
        "bytes": traffic.bytes,
        "final_batch_size": batch,
    }
