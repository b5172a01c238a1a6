"""EigenPro 3 iteration: projected preconditioned SGD on the coefficients of p centers.

The model ``f = sum_j alpha_j k(z_j, .)`` has centers ``Z`` that need not be training
points.  For a batch ``X_B`` of ``m`` rows with residual ``r = f(X_B) - y_B``, the
data-preconditioned functional gradient evaluated at the centers is::

    h = K(Z, X_B) r - K(Z, X_S) Psi D Psi^T K(X_S, X_B) r

(``X_S``: the Nystrom subsample of the data, with the EigenPro 2 data
preconditioner), and its projection onto the span of the centers solves
``K(Z, Z) theta = h``; then ``alpha -= (eta / m) theta``.  The projection here is
exact, by a Cholesky factor of ``K(Z, Z)`` computed once by the caller.

One departure from the published algorithm: the correction evaluates at ``X_S``
the gradient's projection onto the span of the centers,
``K(X_S, Z) K(Z, Z)^{-1} K(Z, X_B) r``, instead of the gradient itself,
``K(X_S, X_B) r``.  The two agree when ``X_S`` is among the centers (the estimators
draw it so when the centers are drawn from the data).  Otherwise the published
step's fixed point is not the least-squares solution on the centers: it solves
``(K(Z, X) - K(Z, X_S) Psi D Psi^T K(X_S, X)) r = 0`` rather than
``K(Z, X) r = 0``, and on a 2000 x 5 problem with 200 random centers its
predictions stayed 50% away from the least-squares ones; with the projected
gradient the step is ``G K(Z, X_B) r`` for a fixed invertible ``G`` and the fixed
point is the least-squares solution.

The loop only sees tensors; the caller validates, plans memory and decides whether
``K(X, Z)`` is cached.
"""

import math
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..blockwise import kernel_matmul_rows
from ..device import synchronize
from .eigenpro import _MAX_STEP_HALVINGS, EarlyStopping, _diverged, _format_record

__all__ = ["CenterProjection", "EigenPro3Result", "fit_eigenpro3", "kernel_block_rows"]


@dataclass
class EigenPro3Result:
    """What a run of :func:`fit_eigenpro3` decided and measured."""

    coef: torch.Tensor
    n_epochs: int
    n_steps: int
    batch_size: int
    learning_rate: float
    history: list = field(default_factory=list)


class CenterProjection:
    """Exact projection onto the span of the centers: ``theta = (K(Z, Z) + jitter I)^{-1} h``.

    The factorisation is done once in float64 (``K(Z, Z)`` of a smooth kernel is
    ill-conditioned: a float32 Cholesky fails or loses the small directions).  The
    jitter is relative to the mean diagonal; it grows tenfold until the factorisation
    succeeds, and the value used is kept in ``jitter``.

    Parameters
    ----------
    kernel : Kernel
    centers : Tensor of shape (p, d)
        Raw (not prepared) centers.
    jitter : float
        Initial relative jitter.
    dtype : torch.dtype
        Dtype of the returned solutions (the training dtype).
    """

    def __init__(self, kernel, centers, jitter, dtype):
        centers64 = centers.to(torch.float64)
        gram = kernel(centers64, centers64)
        gram = (gram + gram.T) / 2.0
        scale = float(gram.diagonal().mean()) if gram.shape[0] else 1.0
        identity = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
        for _ in range(8):
            factor, info = torch.linalg.cholesky_ex(gram + (jitter * scale) * identity)
            if int(info) == 0:
                break
            jitter *= 10.0
        else:
            raise ValueError("K(centers, centers) is not positive definite even with a jitter; check the kernel.")
        self.factor, self.jitter, self.dtype = factor, jitter, dtype

    def __call__(self, h):
        return torch.cholesky_solve(h.to(torch.float64), self.factor).to(self.dtype)


def kernel_block_rows(kernel, X, prepared_centers, row_block, column_block, out=None):
    """Dense ``K(X, Z)`` computed in row and column blocks (the cached kernel matrix)."""
    n, p = X.shape[0], prepared_centers.shape[0]
    if out is None:
        out = torch.empty(n, p, dtype=X.dtype, device=X.device)
    for start in range(0, n, row_block):
        rows = X[start : start + row_block]
        for column in range(0, p, column_block):
            out[start : start + rows.shape[0], column : column + column_block] = kernel.block(
                rows, prepared_centers[column : column + column_block]
            )
    return out


def fit_eigenpro3(
    kernel,
    X,
    Y,
    centers,
    coef,
    preconditioner,
    from_subsample,
    projection,
    batch_size,
    learning_rate_for,
    column_block,
    n_epochs,
    generator,
    cached_block=None,
    weights=None,
    validation=None,
    n_iter_no_change=3,
    tol=1e-4,
    first_step=0,
    log=None,
):
    """Run EigenPro 3 epochs, updating ``coef`` in place.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
        Training rows.
    Y : Tensor of shape (n, l)
    centers : Tensor with p rows
        ``kernel.prepare_centers(Z)``.
    coef : Tensor of shape (p, l)
        Initial coefficients, updated in place.
    preconditioner : EigenProPreconditioner or None
        The data preconditioner on ``subsample`` (None: plain projected SGD).
    from_subsample : callable
        ``c -> K(Z, X_S) @ c`` for the Nystrom subsample ``X_S`` (used once, with a
        preconditioner, to build the correction's ``p x k`` factors).
    projection : callable
        ``projection(h) -> theta`` solving ``K(Z, Z) theta = h``.
    batch_size : int
    learning_rate_for : callable
        ``learning_rate_for(step, batch_size, steps_per_epoch) -> float``.
    column_block : int
        Columns of a streamed kernel block.
    n_epochs : int
    generator : torch.Generator
        Seeds the per-epoch permutations (on the CPU).
    cached_block : Tensor of shape (n, p) or None
        ``K(X, Z)`` computed once; None computes ``K(X_B, Z)`` per batch.
    weights : Tensor of shape (n,) or None
        Per-row factors on the residual.
    validation : tuple (X_val, Y_val, score) or None
        Enables early stopping as in :func:`~skgpu_kernel.solvers.fit_eigenpro`.
    first_step : int
        Updates made by earlier runs (warm starts).
    log : callable or None

    Returns
    -------
    EigenPro3Result
    """
    n = X.shape[0]
    device = X.device
    steps_per_epoch = math.ceil(n / batch_size)
    step = first_step
    rollback = 1.0
    loss_of_zero_model = float((Y * Y).mean()) if Y.numel() else 0.0
    correct = preconditioner is not None and preconditioner.n_components > 0
    if correct:
        # The correction is linear in the projected gradient: with N = K(Z, X_S) Psi
        # (p x k) and M = K(Z, Z)^{-1} N, computed once, a step needs N^T and M
        # products instead of a second projection (a solve with the p x p factor)
        # and two products with K(Z, X_S) (p x s).
        flattening = from_subsample(preconditioner.eigenvectors)
        lifting = projection(flattening)

    history = []
    early_stopping = EarlyStopping(tol, n_iter_no_change)
    anchor_coef, anchor_epoch, anchor_step, anchor_loss = coef.clone(), 0, step, math.inf
    epoch = halvings = 0
    while epoch < n_epochs:
        synchronize(device)
        tic = time.perf_counter()
        epoch_start, epoch_start_step = coef.clone(), step
        order = torch.randperm(n, generator=generator).to(device)
        loss_sum = torch.zeros((), dtype=X.dtype, device=device)
        for position in range(0, n, batch_size):
            batch = order[position : position + batch_size]
            X_batch = X[batch]
            if cached_block is not None:
                block = cached_block[batch]
            else:
                block = torch.cat(
                    [
                        kernel.block(X_batch, centers[start : start + column_block])
                        for start in range(0, centers.shape[0], column_block)
                    ],
                    dim=1,
                )
            residual = (block @ coef).sub_(Y[batch])
            weighted = residual if weights is None else residual * weights[batch, None]
            direction = projection(block.T @ weighted)
            if correct:
                # Psi D Psi^T applied to the projected gradient's values at X_S (see the module notes).
                values = flattening.T @ direction
                direction -= lifting @ (preconditioner.scales[:, None] * values)
            # The last batch of an epoch may be smaller: its step follows its own size.
            scale = rollback * learning_rate_for(step, batch.shape[0], steps_per_epoch) / batch.shape[0]
            coef.sub_(direction, alpha=scale)
            loss_sum += (residual * residual).sum()
            step += 1

        train_loss = float(loss_sum) / max(n * Y.shape[1], 1)
        if _diverged(train_loss, loss_of_zero_model, anchor_loss, X.dtype):
            coef.copy_(anchor_coef)
            step = anchor_step
            del history[anchor_epoch:]
            if halvings >= _MAX_STEP_HALVINGS:
                warnings.warn(
                    f"EigenPro 3 iteration kept diverging after {_MAX_STEP_HALVINGS} step-size halvings; "
                    "stopping with the last stable coefficients.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                break
            halvings += 1
            rollback *= 0.5
            warnings.warn(
                f"Training diverged in epoch {epoch + 1} (mean loss {train_loss:.3g}); resuming from the "
                f"start of epoch {anchor_epoch + 1} with the scaling rule's step size halved "
                f"({rollback:g} times the rule's).",
                RuntimeWarning,
                stacklevel=2,
            )
            epoch, anchor_loss = anchor_epoch, math.inf
            continue
        if train_loss < anchor_loss:
            anchor_coef, anchor_epoch, anchor_step, anchor_loss = epoch_start, epoch, epoch_start_step, train_loss

        last_rate = rollback * learning_rate_for(step - 1, batch_size, steps_per_epoch)
        record = {"epoch": epoch + 1, "train_mse": train_loss, "learning_rate": last_rate}
        if validation is not None:
            X_val, Y_val, score = validation
            record["validation_score"] = float(
                score(kernel_matmul_rows(kernel, X_val, centers, coef, batch_size, column_block), Y_val)
            )
        synchronize(device)
        record["seconds"] = time.perf_counter() - tic
        history.append(record)
        epoch += 1
        if log is not None:
            log(_format_record(record, n_epochs))
        if validation is not None and early_stopping.should_stop(record["validation_score"], coef, log):
            break

    early_stopping.restore_best(coef)
    return EigenPro3Result(
        coef=coef,
        n_epochs=len(history),
        n_steps=step - first_step,
        batch_size=batch_size,
        learning_rate=rollback * learning_rate_for(max(step - 1, first_step), batch_size, steps_per_epoch),
        history=history,
    )
