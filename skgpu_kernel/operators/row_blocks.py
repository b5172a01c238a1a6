"""``K(X, Z)`` in row blocks for CG on centers: the blocks (evaluated per pass, or cached) and the passes' products.

A pass of Falkon's CG reads ``K(X, Z)`` once, a block of rows at a time, and takes
every product it needs of each block before the next:
:func:`first_pass` (``K^T W Y`` and, for a warm start, ``K^T W K a``) and
:func:`iteration_pass` (``K^T W (K a - Y)`` and ``K^T W K v``).  The solver
(:mod:`skgpu_kernel.solvers.centers_cg`) sees only their results.  A row-block
source also knows its kernel and raw centers, from which the solver's penalty
factors ``K(Z, Z)``.
"""

from collections.abc import Iterator
from typing import NamedTuple, Protocol

import torch

from ..operator_facts import OperatorBlocks
from .factory import CenterOperators

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

    rows: slice  # the block's rows
    kernel_rows: torch.Tensor  # K(X_rows, Z)


class RowBlocks(Protocol):
    """The row-block source :func:`~skgpu_kernel.solvers.centers_cg.solve_centers_cg` reads.

    Attributes ``kernel`` and ``centers`` (raw, on the blocks' device) give ``K(Z, Z)``.
    """

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
    factory = CenterOperators.of(kernel, centers.to(X.dtype))
    return factory.operator(X, OperatorBlocks.whole(row_block, centers.shape[0]))


def as_matrix(Y):
    return Y[:, None] if Y.ndim == 1 else Y


class KernelRowBlocks:
    """Row blocks of a kernel operator ``K(X, Z)``, computed on each pass.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, Z)`` with ``n`` rows (:func:`center_operator`, or a
        :class:`~skgpu_kernel.operators.GridOperator` of data on a grid).
    centers : Tensor of shape (p, d)
        The raw centers ``Z`` the operator was made against, on its device.
    row_block : int
        Rows per block.
    """

    def __init__(self, operator, centers, row_block):
        self.operator, self.kernel, self.centers = operator, operator.kernel, centers
        self.row_block = max(int(row_block), 1)

    def blocks(self):
        """Yield a :class:`RowBlock` of ``K(X_rows, Z)`` for consecutive rows."""
        return sliced_blocks(self.operator.block, self.operator.shape[0], self.row_block)


class CachedRowBlocks:
    """Row blocks sliced (as views) from a precomputed ``K(X, Z)``.

    Parameters
    ----------
    K : Tensor of shape (n, p)
    kernel : Kernel
    centers : Tensor of shape (p, d)
        The raw centers ``Z`` of ``K``'s columns.
    row_block : int
        Rows per block (bounds the temporaries of a pass, not the cache).
    """

    def __init__(self, K, kernel, centers, row_block):
        self.K, self.kernel, self.centers = K, kernel, centers
        self.row_block = max(int(row_block), 1)

    @classmethod
    def computed(cls, evaluated):
        """``K(X, Z)`` of a :class:`KernelRowBlocks`, evaluated once, block by block as it would on every pass.

        The blocks have the rows and shapes of ``evaluated``'s, so the stored
        entries, and the fit read from them, are those of that source, bit for bit.
        """
        operator, row_block = evaluated.operator, evaluated.row_block
        n_rows = operator.shape[0]
        first = operator.block(slice(0, row_block))
        K = torch.empty((n_rows, first.shape[1]), dtype=first.dtype, device=first.device)
        K[:row_block] = first
        for start in range(row_block, n_rows, row_block):
            K[start : start + row_block] = operator.block(slice(start, start + row_block))
        return cls(K, evaluated.kernel, evaluated.centers, row_block)

    def blocks(self):
        """Yield a :class:`RowBlock` of ``K[rows]`` for consecutive rows."""
        return sliced_blocks(self.K.__getitem__, self.K.shape[0], self.row_block)


def sliced_blocks(kernel_rows, n_rows, row_block):
    """One pass of consecutive row slices, each a :class:`RowBlock` of ``kernel_rows(rows)``."""
    for start in range(0, n_rows, row_block):
        rows = slice(start, start + row_block)
        yield RowBlock(rows, kernel_rows(rows))


def _targets_of(targets, rows):
    """``(Y[rows], w[rows] or None)`` of a :class:`~skgpu_kernel.solvers.solution.Targets`."""
    weights = targets.weights
    return as_matrix(targets.Y)[rows], None if weights is None else weights[rows]


def first_pass(row_blocks, targets, coef):
    """``(K^T W Y, K^T W K coef or None, n_eff, dtype)`` in one pass."""
    target = fitted = None
    n_effective, dtype = 0.0, None
    for rows, K_block in row_blocks.blocks():
        Y_block, w_block = _targets_of(targets, rows)
        Y_block = Y_block.to(torch.float64)
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


def iteration_pass(row_blocks, targets, coef, direction, dtype):
    """One pass: ``(K^T W (K coef - Y), K^T W K direction, sum_i w_i ||K(x_i, Z) coef - y_i||^2)``."""
    n_outputs = coef.shape[1]
    both = torch.cat([coef, direction], dim=1).to(dtype)
    images = torch.zeros(coef.shape[0], 2 * n_outputs, dtype=torch.float64, device=coef.device)
    loss = torch.zeros((), dtype=torch.float64, device=coef.device)
    for rows, K_block in row_blocks.blocks():
        Y_block, w_block = _targets_of(targets, rows)
        products = K_block @ both
        residual = products[:, :n_outputs].to(torch.float64) - Y_block.to(torch.float64)
        values = torch.cat([residual.to(dtype), products[:, n_outputs:]], dim=1)
        if w_block is None:
            loss += residual.square().sum()
        else:
            loss += (residual.square() * w_block.to(torch.float64)[:, None]).sum()
            values = values * w_block.to(dtype)[:, None]
        images += (K_block.mT @ values).to(torch.float64)
    return images[:, :n_outputs], images[:, n_outputs:], float(loss)
