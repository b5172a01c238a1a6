"""CG's preconditioners: ``K + alpha W^-1`` with its top directions flattened down to ``alpha``.

The Nystrom directions of a subsample (:func:`shifted_nystrom_preconditioner`) or
of a randomly pivoted Cholesky factor of ``K`` (:func:`rpcholesky_factor`,
:func:`shifted_rpcholesky_preconditioner`) give a low-rank ``U diag(s) U^T``; the
preconditioner divides those directions by their eigenvalue plus the penalty, so
that CG on every point sees a system whose condition is about
:func:`shifted_condition`.  EigenPro's own preconditioner is in
:mod:`skgpu_kernel.preconditioner`.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .operators import CenterOperators, OperatorBlocks
from .preconditioner import RELATIVE_RESOLUTION, max_usable_components

__all__ = [
    "PenalisedRows",
    "ShiftedNystromPreconditioner",
    "rpcholesky_factor",
    "shifted_condition",
    "shifted_nystrom_preconditioner",
    "shifted_rpcholesky_preconditioner",
]


# Randomly pivoted Cholesky draws this many pivots at once, fewer where that is more
# than an eighth of the largest rank (the pivots adapt between blocks only) or where
# ``n`` x the block float64 columns would exceed 64 MB; at least 16.
_RPCHOLESKY_BLOCK = 200


_RPCHOLESKY_BLOCK_ENTRIES = 2**23


# A block's residual eigenvalues below this many float64 rounding errors of K's
# largest diagonal entry, or this fraction of the block's largest, are dropped.
_RPCHOLESKY_NOISE = 1e3


_RPCHOLESKY_RELATIVE_NOISE = 1e-10


class ShiftedNystromPreconditioner:
    """Split preconditioner ``C`` of ``K + alpha W^-1`` from a Nystrom estimate of ``K``.

    With ``W^(1/2) K W^(1/2) ~ U diag(lambda) U^T`` (``U`` orthonormal, n x q) and
    the shift ``alpha``, ``C = W^(1/2) (I + U diag(c - 1) U^T)`` with ``c_i =
    sqrt((lambda_q + alpha) / (lambda_i + alpha))``: ``C^T (K + alpha W^-1) C``
    has its top ``q`` directions brought down to about ``lambda_q + alpha`` and the
    rest untouched, so conjugate gradients converge at a rate set by ``(lambda_q +
    ||E|| + alpha) / alpha``, ``E`` the part of ``K`` the estimate misses (Frangella,
    Tropp and Udell, "Randomized Nystrom preconditioning", SIAM J. Matrix Anal.
    Appl. 2023, with column sampling in place of their Gaussian sketch).

    Parameters
    ----------
    basis : Tensor of shape (n, q)
        ``U``.
    eigenvalues : Tensor of shape (q,)
        ``lambda``, descending, on the scale of ``K`` (not ``K / n``).
    shift : float
        ``alpha``.
    root_weights : Tensor of shape (n,) or None
        ``W^(1/2)``; None for unit weights.
    """

    def __init__(self, basis, eigenvalues, shift, root_weights=None):
        self.basis, self.root_weights = basis, root_weights
        floor = eigenvalues[-1] if eigenvalues.numel() else eigenvalues.new_zeros(())
        self.scales = ((floor + shift) / (eigenvalues + shift)).sqrt() - 1.0

    @property
    def n_components(self):
        """``q``."""
        return int(self.scales.shape[0])

    def _flatten(self, V):
        if not self.n_components:
            return V
        projected = (self.basis.mT @ V.to(self.basis.dtype)).to(V.dtype)
        return V + (self.basis @ (self.scales[:, None] * projected).to(self.basis.dtype)).to(V.dtype)

    def apply(self, V):
        """``C V``."""
        flat = self._flatten(V)
        return flat if self.root_weights is None else flat * self.root_weights[:, None]

    def apply_transpose(self, V):
        """``C^T V``."""
        return self._flatten(V if self.root_weights is None else V * self.root_weights[:, None])


@dataclass(frozen=True)
class PenalisedRows:
    """The rows a penalised system ``K + alpha W^-1`` is solved on.

    Parameters
    ----------
    n_rows : int
    alpha : float
        On the scale of the normalised weights.
    weights : Tensor of shape (n_rows,) or None
        Normalised sample weights in (0, 1]; None for unit weights.
    dtype : torch.dtype
        The training dtype.
    """

    n_rows: int
    alpha: float
    weights: torch.Tensor | None
    dtype: torch.dtype


def _shifted_count(eigenvalues, rows, max_components):
    """Directions the shifted preconditioner flattens: those above ``alpha``, resolvable, at most ``max_components``."""
    usable = min(max_usable_components(eigenvalues, rows.dtype) + 1, max_components)
    return int(np.sum(rows.n_rows * eigenvalues[:usable] > rows.alpha))


def shifted_condition(eigenvalues, rows, max_components):
    """Estimated condition number of ``C^T (K + alpha W^-1) C`` for the shifted Nystrom preconditioner.

    ``(n lambda + alpha) / alpha`` at the first direction it leaves unflattened
    (1 when it flattens every direction above ``alpha``).  The part of ``K`` the
    subsample misses is not counted, so this is a lower bound.

    Parameters
    ----------
    eigenvalues : ndarray
        Descending eigenvalues of ``K_S / s``.
    rows : PenalisedRows
    max_components : int
        Most directions flattened (the plan's).

    Returns
    -------
    float
    """
    count = _shifted_count(eigenvalues, rows, max_components)
    if count >= len(eigenvalues) or rows.n_rows * eigenvalues[count] <= rows.alpha:
        return 1.0
    return (rows.n_rows * float(eigenvalues[count]) + rows.alpha) / rows.alpha


def shifted_nystrom_preconditioner(eigensystem, subsample_products, rows, max_components):
    """The :class:`ShiftedNystromPreconditioner` of ``K + alpha W^-1`` from a subsample's eigensystem.

    The Nystrom estimate of ``K`` from the subsample ``S`` is ``B B^T`` with ``B =
    K(X, X_S) psi diag(lambda)^(-1/2)`` (``lambda``, ``psi`` of ``K_S / s``);
    ``U`` and its eigenvalues come from the Gram matrix of ``W^(1/2) B`` (float64).
    Only directions whose eigenvalue on the scale of ``K`` (``n lambda``) exceeds
    ``alpha`` are kept, at most ``max_components`` and those resolvable in the training dtype:
    below ``alpha`` a direction is already within a factor two of the flattened level.

    Parameters
    ----------
    eigensystem : tuple
        ``(eigenvalues, eigenvectors)`` as :func:`nystrom_eigensystem` returns them.
    subsample_products : callable
        ``subsample_products(V) -> K(X, X_S) V`` for ``V`` of shape (s, k) in the
        training dtype.
    rows : PenalisedRows
    max_components : int
        The memory plan's bound (0: no preconditioning but the weights').

    Returns
    -------
    ShiftedNystromPreconditioner
    """
    eigenvalues, eigenvectors = eigensystem
    count = _shifted_count(eigenvalues, rows, max_components)
    if count == 0:
        return _shifted_from_factor(torch.zeros(rows.n_rows, 0, dtype=torch.float64, device=eigenvectors.device), rows)
    scale = torch.as_tensor(eigenvalues[:count], dtype=torch.float64, device=eigenvectors.device)
    sketch = subsample_products(eigenvectors[:, :count].to(rows.dtype)).to(torch.float64)
    sketch *= scale.clamp_min(1e-300).rsqrt()
    return _shifted_from_factor(sketch, rows)


def shifted_rpcholesky_preconditioner(kernel, X, rows, max_components, generator):
    """The :class:`ShiftedNystromPreconditioner` of ``K + alpha W^-1`` from a randomly pivoted Cholesky factor.

    The factor ``F`` (:func:`rpcholesky_factor`, ``K ~ F F^T``) picks its columns
    where what it has not yet captured of ``K`` is largest, instead of uniformly,
    and stops once nothing above ``alpha`` is left to capture, so that CG's rate,
    set by the part of ``K`` the estimate misses against ``alpha``, improves for
    the same rank (Diaz, Epperly, Frangella, Tropp and Webber, "Robust, randomized
    preconditioning for kernel ridge regression", 2023).  On VietNamI (22212 rows,
    alpha 0.07) CG needed 13 iterations with it against 22 with the
    :func:`shifted_nystrom_preconditioner` of a uniform 2000-row subsample.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
        The training rows, in the order of the system's rows.
    rows : PenalisedRows
    max_components : int
        The memory plan's bound on the factor's rank.
    generator : torch.Generator
        On the CPU; draws the pivots.

    Returns
    -------
    ShiftedNystromPreconditioner
    """
    X64 = X.to(torch.float64)
    columns = CenterOperators.of(kernel, X64).operator(X64, OperatorBlocks.whole(X.shape[0], X.shape[0]))
    factor = rpcholesky_factor(
        columns.columns,
        kernel.diagonal(X64),
        max_components,
        rows.alpha,
        generator,
    )
    return _shifted_from_factor(factor, rows)


def _shifted_from_factor(factor, rows):
    """The preconditioner flattening the directions of ``W^(1/2) F F^T W^(1/2)`` above ``alpha`` (F float64)."""
    root_weights = None if rows.weights is None else rows.weights.to(torch.float64).sqrt()
    if root_weights is not None:
        factor.mul_(root_weights[:, None])  # in place: the callers' factors are their own
    if factor.shape[1] == 0:
        empty = factor.to(rows.dtype)
        return ShiftedNystromPreconditioner(empty, factor.new_zeros(0), rows.alpha, root_weights)
    squares, rotation = torch.linalg.eigh(factor.mT @ factor)
    squares, rotation = squares.flip(0), rotation.flip(1)
    # Directions at or below the shift are left to CG.
    kept = (squares > rows.alpha) & (squares > squares[0] * RELATIVE_RESOLUTION * torch.finfo(rows.dtype).eps)
    squares, rotation = squares[kept], rotation[:, kept]
    basis = (factor @ (rotation * squares.rsqrt())).to(rows.dtype)
    return ShiftedNystromPreconditioner(basis, squares, rows.alpha, root_weights)


def rpcholesky_factor(columns, diagonal, max_rank, stop_level, generator):
    """Block randomly pivoted Cholesky: ``F`` (n x r, float64) with ``F F^T`` approximating ``K``.

    Each block draws pivots with probability proportional to the diagonal of the
    residual ``K - F F^T`` (without replacement) and appends the residual's
    Cholesky columns at them (Chen, Epperly, Tropp and Webber, "Randomly pivoted
    Cholesky", Comm. Pure Appl. Math. 2024, block variant).  It stops at
    ``max_rank`` columns, or once what it adds or leaves is at most ``stop_level``:
    the largest eigenvalue of a block's new columns' Gram matrix (the largest
    direction the block captured, on the scale of ``K``), or the residual's trace.

    Parameters
    ----------
    columns : callable
        ``columns(pivots) -> K[:, pivots]`` in float64 for a tensor of indices.
    diagonal : Tensor of shape (n,)
        ``K``'s diagonal, float64.
    max_rank : int
    stop_level : float
    generator : torch.Generator
        On the CPU.

    Returns
    -------
    Tensor of shape (n, r), r <= max_rank
    """
    n = diagonal.shape[0]
    factor = torch.zeros(n, max_rank, dtype=torch.float64, device=diagonal.device)
    residual = diagonal.clamp_min(0.0)
    # Below this an eigenvalue of a block's residual is rounding: its direction would be noise.
    noise = _RPCHOLESKY_NOISE * torch.finfo(torch.float64).eps * float(diagonal.max()) if n else 0.0
    block = int(max(min(_RPCHOLESKY_BLOCK, max_rank // 8, _RPCHOLESKY_BLOCK_ENTRIES // max(n, 1)), 16))
    rank = 0
    while rank < max_rank and float(residual.sum()) > stop_level:
        size = min(block, max_rank - rank, int((residual > 0).sum()))
        pivots = torch.multinomial(residual.cpu(), size, replacement=False, generator=generator).to(diagonal.device)
        block_columns = columns(pivots) - factor[:, :rank] @ factor[pivots, :rank].mT
        values, vectors = torch.linalg.eigh((block_columns[pivots] + block_columns[pivots].mT) / 2)
        kept = values > max(noise, float(values[-1]) * _RPCHOLESKY_RELATIVE_NOISE)
        if not bool(kept.any()):  # what is left is rounding
            break
        new = block_columns @ (vectors[:, kept] * values[kept].rsqrt())
        factor[:, rank : rank + new.shape[1]] = new
        residual = (residual - new.square().sum(1)).clamp_min_(0.0)
        rank += new.shape[1]
        # The block's largest direction on K's scale: once it is below the level, so
        # are (in expectation) the later blocks', which draw from a smaller residual.
        if float(torch.linalg.eigvalsh(new.mT @ new)[-1]) <= stop_level:
            break
    return factor[:, :rank]
