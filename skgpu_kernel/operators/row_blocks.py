"""``K(X, Z)`` in row blocks for CG on centers: the blocks (evaluated per pass, or cached) and the passes' products.

A pass of Falkon's CG reads ``K(X, Z)`` once, a block of rows at a time, and takes
every product it needs of each block before the next:
:func:`first_pass` (``K^T W Y`` and, for a warm start, ``K^T W K a``) and
:func:`iteration_pass` (``K^T W (K a - Y)`` and ``K^T W K v``).  The solver
(:mod:`skgpu_kernel.solvers.centers_cg`) sees only their results.
"""

from collections.abc import Iterator
from typing import NamedTuple, Protocol

import torch

from ..operator_facts import OperatorBlocks
from .core import EvaluatedOperator

__all__ = [
    "CachedRowBlocks",
    "KernelRowBlocks",
    "RowBlock",
    "RowBlocks",
    "as_matrix",
    "center_operator",
    "first_pass",
    "iteration_pass",
    "sliced_blocks",
]


class RowBlock(NamedTuple):
    """One block of training rows as CG on centers reads it."""

    kernel_rows: torch.Tensor  # K(X_rows, Z)
    targets: torch.Tensor  # Y_rows
    weights: torch.Tensor | None  # w_rows, or None for unit weights


class RowBlocks(Protocol):
    """The row-block source :func:`fit_centers_cg` reads (see the module's docstring)."""

    def blocks(self) -> Iterator[RowBlock]:
        """One pass over every row once."""
        ...


def center_operator(kernel, X, centers, row_block):
    """``K(X, Z)`` as an evaluated operator, its row blocks whole: the centers prepared once, in the rows' dtype.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
    centers : Tensor of shape (p, d)
        Raw centers on the rows' device.
    row_block : int
        Rows of a block.

    Returns
    -------
    EvaluatedOperator
    """
    prepared = kernel.prepare_centers(centers.to(X.dtype))
    return EvaluatedOperator(kernel, X, prepared, OperatorBlocks.whole(row_block, centers.shape[0]))


def as_matrix(Y):
    return Y[:, None] if Y.ndim == 1 else Y


class KernelRowBlocks:
    """Row blocks of a kernel operator ``K(X, Z)``, computed on each pass.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, Z)`` with ``n`` rows (:func:`center_operator`, or a
        :class:`~skgpu_kernel.operators.GridOperator` of data on a grid).
    Y : Tensor of shape (n, l) or (n,)
    weights : Tensor of shape (n,) or None
    row_block : int
        Rows per block.
    """

    def __init__(self, operator, Y, weights, row_block):
        self.operator, self.Y, self.weights = operator, as_matrix(Y), weights
        self.row_block = max(int(row_block), 1)

    def blocks(self):
        """Yield a :class:`RowBlock` of ``K(X_rows, Z)`` for consecutive rows."""
        return sliced_blocks(self.operator.block, self.Y, self.weights, self.row_block)


class CachedRowBlocks:
    """Row blocks sliced (as views) from a precomputed ``K(X, Z)``.

    Parameters
    ----------
    K : Tensor of shape (n, p)
    Y : Tensor of shape (n, l) or (n,)
    weights : Tensor of shape (n,) or None
    row_block : int
        Rows per block (bounds the temporaries of a pass, not the cache).
    """

    def __init__(self, K, Y, weights, row_block):
        self.K, self.Y, self.weights = K, as_matrix(Y), weights
        self.row_block = max(int(row_block), 1)

    @classmethod
    def computed(cls, operator, Y, weights, row_block):
        """``K(X, Z)`` evaluated once, block by block as :class:`KernelRowBlocks` would on every pass.

        The blocks have the rows and shapes of ``KernelRowBlocks(operator, Y,
        weights, row_block)``'s, so the stored entries, and the fit read from them,
        are those of that source, bit for bit.
        """
        row_block = max(int(row_block), 1)
        n_rows = operator.shape[0]
        first = operator.block(slice(0, row_block))
        K = torch.empty((n_rows, first.shape[1]), dtype=first.dtype, device=first.device)
        K[:row_block] = first
        for start in range(row_block, n_rows, row_block):
            K[start : start + row_block] = operator.block(slice(start, start + row_block))
        return cls(K, Y, weights, row_block)

    def blocks(self):
        """Yield a :class:`RowBlock` of ``K[rows]`` for consecutive rows."""
        return sliced_blocks(self.K.__getitem__, self.Y, self.weights, self.row_block)


def sliced_blocks(kernel_rows, Y, weights, row_block):
    """One pass of consecutive row slices, each a :class:`RowBlock` of ``kernel_rows(rows)``."""
    for start in range(0, Y.shape[0], row_block):
        rows = slice(start, start + row_block)
        yield RowBlock(kernel_rows(rows), Y[rows], None if weights is None else weights[rows])


def first_pass(row_blocks, coef):
    """``(K^T W Y, K^T W K coef or None, n_eff, dtype)`` in one pass."""
    target = fitted = None
    n_effective, dtype = 0.0, None
    for K_block, Y_block, w_block in row_blocks.blocks():
        Y_block = as_matrix(Y_block).to(torch.float64)
        if dtype is None:
            dtype = K_block.dtype
            target = torch.zeros(K_block.shape[1], Y_block.shape[1], dtype=torch.float64, device=K_block.device)
            fitted = None if coef is None else torch.zeros_like(target)
        w_column = None if w_block is None else w_block.to(torch.float64)[:, None]
        weighted_Y = Y_block if w_column is None else Y_block * w_column
        target += (K_block.mT @ weighted_Y.to(dtype)).to(torch.float64)
        if coef is not None:
            predictions = (K_block @ coef.to(dtype)).to(torch.float64)
            fitted += (K_block.mT @ (predictions if w_column is None else predictions * w_column).to(dtype)).double()
        n_effective += float(K_block.shape[0] if w_block is None else w_column.sum())
    if dtype is None:
        raise ValueError("The row blocks yielded no rows.")
    return target, fitted, n_effective, dtype


def iteration_pass(row_blocks, coef, direction, dtype):
    """One pass: ``(K^T W (K coef - Y), K^T W K direction, sum_i w_i ||K(x_i, Z) coef - y_i||^2)``."""
    n_outputs = coef.shape[1]
    both = torch.cat([coef, direction], dim=1).to(dtype)
    images = torch.zeros(coef.shape[0], 2 * n_outputs, dtype=torch.float64, device=coef.device)
    loss = torch.zeros((), dtype=torch.float64, device=coef.device)
    for K_block, Y_block, w_block in row_blocks.blocks():
        products = K_block @ both
        residual = products[:, :n_outputs].to(torch.float64) - as_matrix(Y_block).to(torch.float64)
        values = torch.cat([residual.to(dtype), products[:, n_outputs:]], dim=1)
        if w_block is None:
            loss += residual.square().sum()
        else:
            loss += (residual.square() * w_block.to(torch.float64)[:, None]).sum()
            values = values * w_block.to(dtype)[:, None]
        images += (K_block.mT @ values).to(torch.float64)
    return images[:, :n_outputs], images[:, n_outputs:], float(loss)
