"""EigenPro 3 iteration: projected preconditioned SGD on the coefficients of p centers.

The model ``f = sum_j alpha_j k(z_j, .)`` has centers ``Z`` that need not be training
points.  A step on a batch ``X_B`` of ``m`` rows with residual ``r = f(X_B) - y_B``
is EigenPro 2's functional step::

    f <- f - (eta / m) sum_{i in B} r_i k(x_i, .) + (eta / m) sum_{j in S} c_j k(z_j, .)

with the data-preconditioner correction ``c = Psi D Psi^T K(Z_S, X_B) r`` on the
Nystrom subsample ``Z_S``.  The subsample is taken among the centers (the first
``s``), so the correction lies in the span of the centers and is added to
``alpha`` directly; and because ``I - E_S Psi D Psi^T E_S^T`` is invertible, the
fixed point of the iteration is the least-squares solution on the centers
(``K(Z, X) r = 0``) whatever the centers.

As in the published method, the rows of a batch become *temporary centers* with
coefficients ``-(eta / m) r``: the following batches are evaluated against them,
so the steps between projections are exact functional SGD steps.  Their values at
the centers, ``h = K(Z, X_tmp) w_tmp``, are accumulated as the steps go (the same
``K(X_B, Z)`` block serves the prediction and this product), and every
``n_temporary`` rows the temporary function is projected onto the span of the
centers, ``alpha += K(Z, Z)^{-1} h``, which empties the temporary centers.  The
projection is amortised over many batches: exactly, by a Cholesky factor of
``K(Z, Z)`` (:class:`ExactProjection`), or inexactly, by a few EigenPro 2 epochs
on the centers solving ``K(Z, Z) theta = h`` (:class:`IterativeProjection`: memory
O(p) plus blocks, no p x p matrix unless its cache fits the budget).

The centers and their kernel blocks can be split across devices of one process or
across the ranks of a ``torch.distributed`` group
(:class:`~skgpu_kernel.operators.CenterShards`, one
:class:`~skgpu_kernel.operators.ShardedOperator` per set of rows): each
shard evaluates its own columns of ``K(X_B, Z)``, predictions are summed (an
all-reduce across ranks) and the coefficients are kept whole and identical on
every rank.

The loop only sees tensors; the caller validates, plans memory and decides
whether ``K(X, Z)`` is cached.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..buffer import BufferPrefetcher, plan_pass
from ..device import exact_gram_row_block
from ..operators import CenterOperators, OperatorBlocks
from .solution import Solution

__all__ = [
    "ExactProjection",
    "InMemoryBatches",
    "IterativeProjection",
    "RowBatch",
    "StreamedBatches",
    "solve_eigenpro3",
]


class ExactProjection:
    """``theta = (K(Z, Z) + jitter I)^{-1} h`` by a Cholesky factor computed once.

    The factorisation is done in float64 (``K(Z, Z)`` of a smooth kernel is
    ill-conditioned: a float32 Cholesky fails or loses the small directions).  The
    Gram matrix is written in row blocks into one p x p float64 matrix and factorised
    in place (the factorisation reads only its lower triangle), so the projection
    holds ``8 p^2`` bytes.  The jitter is relative to the mean diagonal; it grows
    tenfold (the matrix rebuilt) until the factorisation succeeds, and the value
    used is kept in ``jitter``.  The caller checks that the factor fits the memory
    budget.

    Parameters
    ----------
    kernel : Kernel
    centers : Tensor of shape (p, d)
        Raw centers on the device the solves run on.
    jitter : float
        Initial relative jitter.
    dtype : torch.dtype
        Dtype of the returned solutions (the training dtype).
    """

    kind = "exact"

    def __init__(self, kernel, centers, jitter, dtype):
        centers64 = centers.to(torch.float64)
        p = centers.shape[0]
        row_block = exact_gram_row_block(p)
        gram = CenterOperators.of(kernel, centers64).operator(centers64, OperatorBlocks.whole(p, p))
        factor = torch.empty(p, p, dtype=torch.float64, device=centers.device)
        info = torch.empty((), dtype=torch.int32, device=centers.device)
        for _ in range(8):
            gram.fill(factor, row_block)
            scale = float(factor.diagonal().mean()) if p else 1.0
            factor.diagonal().add_(jitter * scale)
            torch.linalg.cholesky_ex(factor, out=(factor, info))
            if int(info) == 0:
                break
            jitter *= 10.0
        else:
            raise ValueError("K(centers, centers) is not positive definite even with a jitter; check the kernel.")
        self.factor, self.jitter, self.dtype = factor, jitter, dtype

    def __call__(self, h):
        """``(theta, None)``: the solution, and no values left unresolved."""
        # Two triangular solves: torch.cholesky_solve took 4x longer on CPU for a
        # 10000 x 10000 factor and ten right-hand sides (0.39 s against 0.11 s).
        half = torch.linalg.solve_triangular(self.factor, h.to(torch.float64), upper=False)
        return torch.linalg.solve_triangular(self.factor.mT, half, upper=True).to(self.dtype), None


class IterativeProjection:
    """``theta ~ K(Z, Z)^{-1} h`` by full-batch EigenPro 2 iterations on the centers, from ``theta = 0``.

    Each iteration is one EigenPro 2 step whose batch is every center:
    ``R = K(Z, Z) theta - h`` (in row blocks), ``theta -= (R - E_S Psi D Psi^T
    K(Z_S, Z) R) / lambda_max``, with the preconditioner's correction on the first
    ``s`` centers.  Full batches keep the projection deterministic: started from
    zero, each eigencomponent of ``theta`` moves monotonically towards the exact
    solution, the flattened directions in one iteration and a direction of
    eigenvalue ``lambda`` by a factor ``1 - lambda / lambda_max`` per iteration, so
    the iteration acts as a spectral filter that leaves out only the smallest
    directions of ``K(Z, Z)``.  (Mini-batch EigenPro 2 epochs here inject SGD noise
    into every projection, which the training iteration then amplifies: it
    diverged in our tests.)

    ``lambda_max``, the top eigenvalue of the preconditioned ``K(Z, Z)``, is
    measured by power iteration when the projection is built.  The Nystrom estimate
    of the flattened spectrum is exact only on the subsample: with 20000 centers and
    a 12000-point subsample on Fashion-MNIST, a step taken from that estimate made
    the projection diverge (its residual grew by 1e12 in 100 iterations).

    ``K(Z, Z)`` is never formed unless :meth:`~skgpu_kernel.operators.CenterShards.cache` was called on the
    shards it receives (then its first ``p`` cached rows are read: the shards of
    the training data serve when the centers are its first ``p`` rows).  It stops
    when the residual at the centers falls to ``tol`` times ``||h||`` and returns
    ``(theta, h - K(Z, Z) theta)``: the caller carries the unresolved values over
    to the next projection.

    Parameters
    ----------
    shards : ~skgpu_kernel.operators.CenterShards
        The centers as the data of the regression (with or without their cache).
    centers : Tensor of shape (p, d)
        Raw centers on the main device.
    preconditioner : EigenProPreconditioner or None
        Built on the first ``s`` centers.
    max_iterations : int
    tol : float
    row_block : int
        Centers whose kernel rows are evaluated at once.
    seed : int
        Seed of the power iteration's start vector.
    """

    kind = "iterative"

    # Power iterations stop when the estimate moves by less than this fraction (or
    # after the maximum); the step 1 / lambda_max then keeps a margin of almost 2.
    _POWER_RTOL = 1e-2
    _POWER_MAX_ITERATIONS = 50

    def __init__(self, shards, centers, preconditioner, max_iterations, tol, row_block, seed=0):
        self.shards, self.centers, self.preconditioner = shards, centers, preconditioner
        self.max_iterations, self.tol, self.row_block = max_iterations, tol, row_block
        self.correct = preconditioner is not None and preconditioner.n_components > 0
        self.top_eigenvalue = self._power_iteration(seed)

    def _direction(self, theta, h):
        """``(R, R - E_S Psi D Psi^T K(Z_S, Z) R)`` for ``R = K(Z, Z) theta - h``."""
        shards = self.shards
        p = theta.shape[0]
        residual = torch.empty_like(theta)
        at_subsample = torch.zeros_like(theta) if self.correct else None
        for start in range(0, p, self.row_block):
            rows = slice(start, min(start + self.row_block, p))
            block = shards.rows_block(self.centers[rows], rows)
            residual[rows] = block.matmul(theta)
            if h is not None:
                residual[rows] -= h[rows]
            if self.correct:
                at_subsample += block.transpose_matmul(residual[rows])
        direction = residual.clone()
        if self.correct:
            direction[: self.preconditioner.subsample_size] -= _flatten(self.preconditioner, at_subsample)
        return residual, direction

    def _power_iteration(self, seed):
        generator = torch.Generator().manual_seed(seed)
        p = self.centers.shape[0]
        vector = torch.randn(p, 1, generator=generator, dtype=torch.float64).to(self.centers.device, self.centers.dtype)
        vector /= torch.linalg.vector_norm(vector)
        estimate = 0.0
        for _ in range(self._POWER_MAX_ITERATIONS):
            _, image = self._direction(vector, None)
            previous, estimate = estimate, float(torch.linalg.vector_norm(image))
            if estimate == 0.0:
                raise ValueError("K(centers, centers) is zero: the kernel or the centers are degenerate.")
            vector = image / estimate
            if abs(estimate - previous) <= self._POWER_RTOL * estimate:
                break
        return estimate

    def __call__(self, h):
        theta = torch.zeros_like(h)
        target = self.tol * float(torch.linalg.vector_norm(h))
        for iteration in range(self.max_iterations + 1):
            residual, direction = self._direction(theta, h)
            if iteration == self.max_iterations or float(torch.linalg.vector_norm(residual)) <= target:
                break
            theta.sub_(direction, alpha=1.0 / self.top_eigenvalue)
        return theta, residual.neg_()


def _flatten(preconditioner, values):
    """``Psi D Psi^T v_S`` for the values ``v`` of a gradient at the centers (first ``s`` rows used)."""
    subsample_values = values[: preconditioner.subsample_size]
    projected = preconditioner.eigenvectors.T @ subsample_values
    return preconditioner.eigenvectors @ (preconditioner.scales[:, None] * projected)


class RowBatch(NamedTuple):
    """One batch of training rows as EigenPro 3 reads it."""

    rows: torch.Tensor  # X_B on the device, centred
    targets: torch.Tensor  # Y_B
    weights: torch.Tensor | None  # w_B, or None for unit weights
    indices: torch.Tensor | None  # the rows' indices into a cached K(X, Z), or None (streamed)


class InMemoryBatches:
    """Batches of rows of device tensors in a fresh random order each epoch.

    Parameters
    ----------
    X : Tensor of shape (n, d)
    Y : Tensor of shape (n, l)
    weights : Tensor of shape (n,) or None
    generator : torch.Generator
    """

    def __init__(self, X, Y, weights, generator):
        self.X, self.Y, self.weights, self.generator = X, Y, weights, generator
        self.n_rows = X.shape[0]

    def epoch(self, batch_size):
        """Yield a :class:`RowBatch` (with its indices) at a time, for one pass."""
        order = torch.randperm(self.n_rows, generator=self.generator).to(self.X.device)
        for position in range(0, self.n_rows, batch_size):
            batch = order[position : position + batch_size]
            weights = None if self.weights is None else self.weights[batch]
            yield RowBatch(self.X[batch], self.Y[batch], weights, batch)


class StreamedBatches:
    """Batches read from row sources (memory-mapped files) through a prefetching buffer.

    Each epoch cuts the rows into shuffled contiguous chunks grouped into buffers
    (:func:`~skgpu_kernel.buffer.plan_pass`), reads the next buffer in a
    background thread while the current one is trained on, and shuffles the rows
    within each buffer.  Only two buffers are resident at a time.

    Parameters
    ----------
    sources : list of RowSource
        ``X``, ``Y`` and optionally the weights, all with ``n`` rows.
    device : torch.device
    dtype : torch.dtype
    offset : Tensor of shape (d,) or None
        Subtracted from the rows of ``X`` on the device.
    buffer_rows : int
    seed : int
        Seeds the chunk order of every epoch and the shuffles within buffers.
    """

    def __init__(self, sources, device, dtype, offset, buffer_rows, seed):
        self.sources, self.device, self.dtype, self.offset = sources, device, dtype, offset
        self.n_rows = sources[0].shape[0]
        self.buffer_rows = max(int(buffer_rows), 1)
        self.rng = np.random.RandomState(seed)
        self.generator = torch.Generator().manual_seed(seed)

    def epoch(self, batch_size):
        """Yield a :class:`RowBatch` (without indices) at a time, for one pass."""
        chunk = max(1, min(self.buffer_rows, math.ceil(self.buffer_rows / 16)))
        plan = plan_pass(self.n_rows, self.buffer_rows, chunk, self.rng)
        dtypes = [self.dtype] * len(self.sources)
        with BufferPrefetcher(self.sources, plan, self.device, dtypes) as prefetcher:
            for buffer in prefetcher:
                X, Y = buffer[0], buffer[1]
                if Y.ndim == 1:
                    Y = Y[:, None]
                weights = buffer[2] if len(buffer) > 2 else None
                if self.offset is not None:
                    X = X - self.offset
                order = torch.randperm(X.shape[0], generator=self.generator).to(self.device)
                for position in range(0, X.shape[0], batch_size):
                    batch = order[position : position + batch_size]
                    yield RowBatch(X[batch], Y[batch], None if weights is None else weights[batch], None)


class _TemporaryCenters:
    """Rows of recent batches with their coefficients, kept until the next projection."""

    def __init__(self, kernel, capacity, prepared_width, n_outputs, dtype, device):
        self.kernel, self.capacity = kernel, capacity
        self.prepared = torch.empty(capacity, prepared_width, dtype=dtype, device=device)
        self.coef = torch.empty(capacity, n_outputs, dtype=dtype, device=device)
        self.count = 0

    def room_for(self, rows):
        return self.count + rows <= self.capacity

    def predict(self, rows):
        if self.count == 0:
            return None
        blocks = OperatorBlocks.whole(rows.shape[0], self.count)
        operator = CenterOperators(self.kernel, self.prepared[: self.count]).operator(rows, blocks)
        return operator.block_matmul(self.coef[: self.count])

    def add(self, rows, coef):
        stop = self.count + rows.shape[0]
        self.prepared[self.count : stop] = self.kernel.prepare_centers(rows)
        self.coef[self.count : stop] = coef
        self.count = stop

    def clear(self):
        self.count = 0


class _Projector:
    """The temporary function between projections: its centers and its values at the centers."""

    def __init__(self, temporary, projection, coef):
        self.temporary, self.projection, self.coef = temporary, projection, coef
        self.accumulated = torch.zeros_like(coef)  # values at the centers of the temporary function
        self.n_projections = 0

    def make_room(self, rows):
        if not self.temporary.room_for(rows):
            self.project()

    def project(self):
        """``alpha += K(Z, Z)^{-1} h``, emptying the temporary centers."""
        if not self.temporary.count:
            return
        theta, remainder = self.projection(self.accumulated)
        self.coef.add_(theta)
        # Error feedback: values an inexact projection left unresolved join the next
        # projection instead of being dropped.  Dropping them made training diverge
        # (a 3% residual per projection compounded); carried over, a 1% tolerance
        # tracks the exact projection's losses within 0.5%.
        if remainder is None:
            self.accumulated.zero_()
        else:
            self.accumulated.copy_(remainder)
        self.temporary.clear()
        self.n_projections += 1


def _residual_and_gradient(shards, temporary, coef, batch):
    """``(r, w * r, K(Z, X_B) (w * r))`` of a :class:`RowBatch`; changes no state."""
    X_batch, Y_batch, w_batch, indices = batch
    block = shards.rows_block(X_batch, indices)
    predictions = block.matmul(coef)
    from_temporary = temporary.predict(X_batch)
    if from_temporary is not None:
        predictions += from_temporary
    residual = predictions.sub_(Y_batch)
    weighted = residual if w_batch is None else residual * w_batch[:, None]
    return residual, weighted, block.transpose_matmul(weighted)


def solve_eigenpro3(operator, targets, plan):
    """Run EigenPro 3 epochs on the centers.

    Parameters
    ----------
    operator : ~skgpu_kernel.operators.CenterShards
        ``K(., Z)`` of the centers (with their cached ``K(X, Z)`` after
        ``shards.cache``, looked up by a batch's ``indices``).
    targets : InMemoryBatches or StreamedBatches
        The training rows with their targets and weights; ``targets.epoch(m)``
        yields :class:`RowBatch` objects.
    plan : EigenProPlan
        Batch, step sizes, epochs and stopping, the data preconditioner on the first ``s``
        centers (None: plain projected SGD), the starting coefficients (on the
        main device, updated in place; required), the projection onto the centers
        and the number of temporary centers.

    Returns
    -------
    Solution
    """
    coef, preconditioner = plan.coef_init, plan.preconditioner
    n, n_outputs = targets.n_rows, coef.shape[1]
    batch_size, steps_per_epoch = plan.batch_size, math.ceil(n / plan.batch_size)
    correct = preconditioner is not None and preconditioner.n_components > 0
    width = operator.prepared[0].shape[1]  # every process holds at least one (possibly empty) shard
    temporary = _TemporaryCenters(
        operator.kernel, max(plan.n_temporary, batch_size), width, n_outputs, coef.dtype, operator.main
    )
    run = _EpochRun(
        operator, temporary, _Projector(temporary, plan.projection, coef), coef, preconditioner if correct else None
    )
    guard = plan.guard(coef)
    loss_of_zero_model = None

    def rate_at(step):
        return plan.learning_rate_for(step, batch_size, steps_per_epoch)

    def validation_score():
        return plan.validation(coef)

    while guard.epoch < plan.n_epochs:
        guard.begin_epoch()
        loss_sum, target_sum = _epoch(run, targets, steps_per_epoch, guard, plan)
        train_loss = float(loss_sum) / max(n * n_outputs, 1)
        if loss_of_zero_model is None:
            loss_of_zero_model = float(target_sum) / max(n * n_outputs, 1)
        if not guard.end_epoch(
            train_loss, loss_of_zero_model, rate_at, validation_score if plan.validation is not None else None
        ):
            break
        if guard.rolled_back:
            run.projector.accumulated.zero_()

    return Solution(
        coef=coef,
        batch_size=batch_size,
        n_projections=run.projector.n_projections,
        **guard.finish(rate_at, plan.first_step),
    )


@dataclass(frozen=True)
class _EpochRun:
    """What every step of EigenPro 3 updates: the centers' shards, the temporary centers, the coefficients.

    ``preconditioner`` is None where no direction is flattened.
    """

    shards: object
    temporary: object
    projector: object
    coef: torch.Tensor
    preconditioner: object


def _epoch(run, batches, steps_per_epoch, guard, plan):
    """One epoch of steps, then a projection: ``(sum of squared residuals, sum of squared targets)``, float64."""
    main, preconditioner = run.shards.main, run.preconditioner
    loss_sum = torch.zeros((), dtype=torch.float64, device=main)
    target_sum = torch.zeros((), dtype=torch.float64, device=main)
    for part in batches.epoch(plan.batch_size):
        rows = part.rows.shape[0]
        run.projector.make_room(rows)
        residual, weighted, gradient = _residual_and_gradient(run.shards, run.temporary, run.coef, part)
        # The last batch of an epoch may be smaller: its step follows its own size.
        scale = guard.rollback * plan.learning_rate_for(guard.step, rows, steps_per_epoch) / rows
        run.projector.accumulated.sub_(gradient, alpha=scale)
        run.temporary.add(part.rows, weighted * -scale)
        if preconditioner is not None:
            run.coef[: preconditioner.subsample_size].add_(_flatten(preconditioner, gradient), alpha=scale)
        loss_sum += (residual * residual).sum().double()
        target_sum += (part.targets * part.targets).sum().double()
        guard.step += 1
    run.projector.project()
    return loss_sum, target_sum
