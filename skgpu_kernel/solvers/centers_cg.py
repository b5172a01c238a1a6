"""Falkon-style preconditioned conjugate gradients on the coefficients of p centers.

The model ``f(x) = sum_j a_j k(z_j, x)`` on centers ``Z`` (p rows) is fitted to the
exact minimiser of the penalised, weighted least-squares objective

    ``sum_i w_i ||K(x_i, Z) a - y_i||^2 + alpha trace(a^T K(Z, Z) a)``

over ``a`` (p x l, the l outputs solved together).  ``alpha >= 0`` multiplies the
penalty against the *sum* of squared errors, as in
:class:`sklearn.kernel_ridge.KernelRidge`: with ``Z = X`` and unit weights the
solution is KernelRidge's ``dual_coef_`` (when ``K(X, X)`` is invertible).  The
minimiser solves the normal equations

    ``H a = b``,  ``H = K_XZ^T W K_XZ + alpha K_ZZ``,  ``b = K_XZ^T W Y``.

They are solved by conjugate gradients with Falkon's preconditioner (Rudi,
Carratino and Rosasco 2017; Meanti et al. 2020): with the Cholesky factors

    ``K_ZZ + j I = T^T T``  and  ``A^T A = (n_eff / p) T T^T + alpha I (+ delta I)``

(``T``, ``A`` upper triangular, ``n_eff`` the sum of the weights), ``B = T^{-1}
A^{-1}`` makes ``B^T H B`` close to the identity when ``K_XZ^T W K_XZ`` is close to
its Nystrom estimate ``(n_eff / p) K_ZZ^2``, so CG on ``B^T H B beta = B^T b``
(``a = B beta``) needs few iterations even where ``H`` is very ill-conditioned
(smooth kernels, tiny ``alpha``), where EigenPro's SGD iterations are slow.

Unlike Falkon, the penalty uses ``K_ZZ`` itself, recovered from the factor as
``T^T T - j I``: the jitter ``j`` only shapes the preconditioner and the solution
is the one of the stated objective, not of a problem regularised by the jitter.
The factor of ``K_ZZ`` is :class:`~skgpu_kernel.solvers.eigenpro3.ExactProjection`'s
(float64, a jitter relative to the mean diagonal, grown tenfold until the
factorisation succeeds).  With ``alpha = 0`` (plain least squares) ``(n_eff / p) T
T^T`` can be numerically singular, so ``A``'s matrix always gets a jitter of
``jitter`` times its mean diagonal as well (grown likewise); it changes the
preconditioner only.

The p x p factors, the coefficients and the CG vectors are float64; the kernel
blocks ``K(X_rows, Z)`` stay in the training dtype (float32 by default).  Each
iteration is one pass over the row blocks computing ``K_b [a, v]`` and ``K_b^T W_b
[K_b a - Y_b, K_b v]`` for the current coefficients ``a`` and the search direction
``v``: the same pass yields the training loss and the true gradient at ``a``, with
no extra kernel work and no n-sized state.  Starting every iteration from the true
residual (an exact line search, Polak-Ribiere directions: plain CG in exact
arithmetic) keeps the objective from growing when rounding, amplified by ``B``,
would make the recurrence drift (see :func:`_conjugate_gradients`).  Memory: two p
x p float64 matrices (``16 p^2`` bytes; ``K_ZZ``'s factor and ``A``'s, plus the
blocks :class:`ExactProjection` fills), a few p x l float64 vectors, and what the
row blocks hold.

Float32 blocks bound the attainable accuracy: a relative residual of 1e-5 to 1e-2
where float64 reaches 1e-6 and below, and on nearly singular problems (tiny
``alpha``, large bandwidths) the exact solution's coefficients are so large that
float32 cannot evaluate them.  The default jitter is larger for float32
(:func:`default_jitter`), which keeps CG out of the directions float32 cannot
resolve; a run that stalls stops after ``n_iter_no_change`` iterations, and one
whose measured objective grows returns its best coefficients with a warning.

The rows reach the solver through a *row-block source*: any object whose
``blocks()`` method yields, on each call, one pass over every training row exactly
once as tuples ``(K_block, Y_block, w_block)``: ``K_block = K(X_rows, Z)`` of shape
(rows, p) on the centers' device, ``Y_block`` of shape (rows, l) (or (rows,) for one
output) and ``w_block`` of shape (rows,) or None for unit weights.  The order and
the block sizes may change between passes.  :class:`KernelRowBlocks` computes the
blocks from a kernel operator (evaluated or on a grid); :class:`CachedRowBlocks` slices a precomputed
``K(X, Z)``.

The loop only sees tensors; the caller validates, plans block sizes and memory and
decides whether ``K(X, Z)`` is cached.

References
----------
.. [1] A. Rudi, L. Carratino, L. Rosasco, "FALKON: An optimal large scale kernel
   method", NeurIPS 2017.
.. [2] G. Meanti, L. Carratino, L. Rosasco, A. Rudi, "Kernel methods through the
   roof: handling billions of points efficiently", NeurIPS 2020.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from .._warnings import warn_user
from ..operators import EvaluatedOperator, OperatorBlocks
from ..planning.stopping import NEVER, DivergenceRule, StoppingPlan, plan_divergence
from .eigenpro3 import ExactProjection
from .epochs import EpochClock, Stopping, epoch_record, format_record

__all__ = [
    "CGSettings",
    "CachedRowBlocks",
    "CentersPreconditioner",
    "CentersSolveResult",
    "KernelRowBlocks",
    "RowBlock",
    "RowBlocks",
    "center_operator",
    "conjugate_gradients",
    "default_jitter",
    "fit_centers_cg",
]

# A factorisation that fails with the jitter is retried with ten times more, this
# many times at most (as ExactProjection does for K(Z, Z)).
_MAX_JITTER_GROWTHS = 8

# Rows of L^T M L computed at once (see _lower_gram).
_GRAM_BLOCK = 512

# Float64 blocks: the jitter j is the smallest (from 2500 eps) for which B stretches no
# direction by more than 1 / sqrt(_FLOAT64_STRETCH_BOUND): with masses M and alpha both
# relative to the mean diagonal, B's stretch along a direction of K(Z, Z) below j is
# about 1 / sqrt(j (M j + alpha)).
_FLOAT64_STRETCH_BOUND = 1e-18


def default_jitter(dtype, alpha, mass):
    """Relative jitter of the preconditioner's factorisations for kernel blocks in ``dtype``.

    ``2500 eps`` (3e-4 for float32, 5.6e-13 for float64), raised for float64 where
    ``alpha`` (relative to the mean diagonal of ``K(Z, Z)``) is too small to bound
    ``B``'s stretch with the training ``mass`` per center (see
    ``_FLOAT64_STRETCH_BOUND``).  With float32 blocks, ``K_b @ (B d)`` is rounding
    noise along the directions ``B`` stretches the most, so the jitter caps that
    stretch: on Gaussian kernels with ``alpha`` down to 1e-8, float32 runs with a
    jitter of 1e-10 or 1e-6 diverged at the first step, while 1e-4 to 1e-3 reached
    the float64 fit's predictions within 1e-2 (3e-4 the best of 1e-4, 3e-4, 1e-3,
    1e-2).  A float64 jitter too large hides every direction of ``K(Z, Z)`` below
    it, which CG must then resolve itself: on 300 Gaussian centers with
    eigenvalues down to 5e-14, CG needed 74 iterations to 1e-6 with a jitter of
    1e-10 and 11 with 5.6e-13; fixed jitters of 1e-13 and 1e-14 met a non-positive
    curvature on two of twelve problems, which this rule passed.

    Examples
    --------
    >>> import torch
    >>> round(default_jitter(torch.float32, 1.0, 10.0), 6), round(default_jitter(torch.float64, 1.0, 10.0), 15)
    (0.000298, 5.55e-13)
    """
    floor = 2500.0 * torch.finfo(dtype).eps
    if dtype != torch.float64:
        return floor
    # The smallest j with j (mass j + alpha) >= the bound: the positive root.
    root = (-alpha + math.sqrt(alpha * alpha + 4.0 * mass * _FLOAT64_STRETCH_BOUND)) / (2.0 * mass)
    return max(floor, root)


@dataclass(frozen=True)
class CGSettings:
    """How :func:`fit_centers_cg` iterates.

    Parameters
    ----------
    max_iterations : int, default=100
        CG iterations at most (each one pass over the row blocks).
    tol : float, default=1e-6
        Stop when every output's residual of the preconditioned system,
        ``||B^T (b - H a)||``, is at most ``tol`` times ``||B^T b||`` (or times its
        value at the warm start, when that is larger: a zero target column).
    jitter : float or None, default=None
        Relative jitter (times the mean diagonal) of the Cholesky factorisations of
        ``K(Z, Z)`` and of ``A``'s matrix.  It shapes the preconditioner only, not
        the solution.  None: :func:`default_jitter` of the kernel blocks' dtype,
        the problem's ``alpha`` and its mass per center.
    log : callable or None, default=None
        Called with one progress line per iteration.
    n_iter_no_change : int or None, default=10
        Stop (unconverged) when the largest relative residual has not reached a new
        low for this many iterations: the residual has hit the rounding floor of
        the kernel blocks' dtype above ``tol``.  None: run up to ``max_iterations``.
        Float32 blocks stall between 1e-5 and 1e-2 (LetterRecognition, p = 2000 and
        10000) while their training loss is within 0.2% of float64's, and the
        residual keeps making small new lows: with float32 pass ``tol`` ~1e-3, or
        a ``stopping`` plan.
    stopping : StoppingPlan, default: never
        The package's stopping rule on the objective (the training loss as a
        fraction of its value at the first iteration, the zero model's from a cold
        start), on top of the residual test: the estimators' ``tol``.  On
        Computers (5007 rows, every row a center, float32 blocks) the residual
        stalled at 1.3e-3 after 3 iterations and kept making new lows for 24 more,
        with the objective flat to 1e-4.
    objective_divergence : DivergenceRule or None, default=None
        The divergence rule of the training objective, for systems whose merit is
        not the objective (CG on every point, whose merit is the A-norm quadratic):
        a run that breaks it stops (``"diverged"``) with its best iterate by the
        objective, and an unconverged run returns that iterate where its last
        measured objective is worse (:meth:`DivergenceRule.keeps_best`).  None: the
        merit's rule alone (on centers the merit is the objective).
    """

    max_iterations: int = 100
    tol: float = 1e-6
    jitter: float | None = None
    log: Callable[[str], None] | None = None
    n_iter_no_change: int | None = 10
    stopping: StoppingPlan = NEVER
    objective_divergence: DivergenceRule | None = None


@dataclass
class CentersSolveResult:
    """What a run of :func:`fit_centers_cg` found.

    Attributes
    ----------
    coef : Tensor of shape (p, l)
        The coefficients, in the dtype of the kernel blocks.
    n_iterations : int
        CG iterations run (0 when the warm start already met the tolerance).
    history : list of dict
        One :func:`~skgpu_kernel.solvers.epochs.epoch_record` per iteration, with
        the key ``relative_residual`` (the largest over the outputs, after the
        iteration) after the core keys.
    jitter : float
        The relative jitter ``K(Z, Z)``'s factorisation used.
    stop : str
        Why the run ended: ``"converged"`` (every output met ``tol``; an output
        that met it is not updated again while the others iterate),
        ``"objective"`` (the ``stopping`` plan), ``"residual stalled"``
        (``n_iter_no_change``), ``"objective grew"`` (rounding; the best
        coefficients kept), ``"diverged"`` (the training objective broke
        ``objective_divergence``; the best coefficients kept), ``"curvature"`` (a
        column's curvature was not positive) or ``"iterations"``
        (``max_iterations``).
    """

    coef: torch.Tensor
    n_iterations: int
    history: list = field(default_factory=list)
    jitter: float = 0.0
    stop: str = "converged"

    @property
    def converged(self):
        """Whether every output met ``tol``."""
        return self.stop == "converged"


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


def _as_matrix(Y):
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
        self.operator, self.Y, self.weights = operator, _as_matrix(Y), weights
        self.row_block = max(int(row_block), 1)

    def blocks(self):
        """Yield a :class:`RowBlock` of ``K(X_rows, Z)`` for consecutive rows."""
        return _sliced_blocks(self.operator.block, self.Y, self.weights, self.row_block)


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
        self.K, self.Y, self.weights = K, _as_matrix(Y), weights
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
        return _sliced_blocks(self.K.__getitem__, self.Y, self.weights, self.row_block)


def _sliced_blocks(kernel_rows, Y, weights, row_block):
    """One pass of consecutive row slices, each a :class:`RowBlock` of ``kernel_rows(rows)``."""
    for start in range(0, Y.shape[0], row_block):
        rows = slice(start, start + row_block)
        yield RowBlock(kernel_rows(rows), Y[rows], None if weights is None else weights[rows])


class CentersPreconditioner:
    """Falkon's ``B = T^{-1} A^{-1}`` and ``K(Z, Z)`` from its factor, all float64.

    ``K_ZZ + j I = T^T T`` is ``projection``'s factor (``T = L^T``) and ``A^T A =
    T M T^T + alpha I + delta I`` with ``delta`` a jitter of ``A``'s matrix and ``M``
    the training mass each center stands for: ``n_eff / p`` each for a uniform draw
    (Falkon's ``(n_eff / p) T T^T``, see the module's docstring).  Where the centers
    are the distinct values of rows that repeat, ``M`` holds their weights: when
    every row is a center, ``K_XZ^T W K_XZ = K_ZZ M K_ZZ`` and the preconditioner is
    exact up to the jitter.

    Parameters
    ----------
    projection : ExactProjection
        Holds the lower factor ``L`` of ``K_ZZ + j I`` (``j`` relative to the mean
        diagonal of ``K_ZZ``).
    alpha : float
    masses : float or Tensor of shape (p,)
        The training mass per center, ``n_eff / p`` for all, or one per center.
    jitter : float
        Initial relative jitter of ``A``'s matrix.
    """

    def __init__(self, projection, alpha, masses, jitter):
        L = projection.factor
        p = L.shape[0]
        # The rows of L hold K_ii + j_abs with j_abs = jitter * mean(K_ii).
        mean_diagonal = float(torch.linalg.vector_norm(L, dim=1).square().mean()) if p else 1.0
        self.shift = projection.jitter * mean_diagonal / (1.0 + projection.jitter)
        self.L, self.C = L, _factor_a(L, alpha, masses, jitter)  # C C^T = A^T A: A = C^T

    def solve(self, d):
        """``(B d, A^{-1} d)``: coefficients of a preconditioned vector, and ``T`` times them."""
        u = torch.linalg.solve_triangular(self.C.mT, d, upper=True)
        return torch.linalg.solve_triangular(self.L.mT, u, upper=True), u

    def solve_transpose(self, g):
        """``B^T g = A^{-T} T^{-T} g``."""
        half = torch.linalg.solve_triangular(self.L, g, upper=False)
        return torch.linalg.solve_triangular(self.C, half, upper=False)

    def gram(self, coef, times_factor=None):
        """``K_ZZ coef = T^T (T coef) - j coef``; ``times_factor`` is ``T coef`` when known."""
        if times_factor is None:
            times_factor = self.L.mT @ coef
        return self.L @ times_factor - self.shift * coef


def _factor_a(L, alpha, masses, jitter):
    """Lower ``C``, ``C C^T = L^T M L + (alpha + delta) I``, ``delta`` a jitter times the mean diagonal."""
    p = L.shape[0]
    info = torch.empty((), dtype=torch.int32, device=L.device)
    for _ in range(_MAX_JITTER_GROWTHS):
        matrix = _lower_gram(L, masses)
        scale = float(matrix.diagonal().mean()) if p else 1.0
        matrix.diagonal().add_(alpha + jitter * scale)
        torch.linalg.cholesky_ex(matrix, out=(matrix, info))
        if int(info) == 0:
            return matrix
        jitter *= 10.0
    raise ValueError("The preconditioner's matrix is not positive definite even with a jitter; check the kernel.")


def _lower_gram(L, masses):
    """The lower triangle (what a Cholesky reads) of ``L^T M L`` for lower ``L``; zeros above the diagonal blocks.

    Block row ``[a, b)`` is ``(M L)[a:, a:b]^T L[a:, :b]``: ``L``'s rows above ``a``
    are zero in those columns, so the products skip them, a sixth of the flops of
    the full product (4.3x faster on 2 CPU cores at p = 10000: 5.1 s against 22 s),
    and the temporaries are one block column instead of a scaled copy of ``L``.
    """
    p = L.shape[0]
    gram = torch.zeros_like(L)
    for top in range(0, p, _GRAM_BLOCK):
        bottom = min(top + _GRAM_BLOCK, p)
        left = L[top:, top:bottom]
        left = left * (masses[top:, None] if isinstance(masses, torch.Tensor) else masses)
        gram[top:bottom, :bottom] = left.mT @ L[top:, :bottom]
    return gram


def _first_pass(row_blocks, coef):
    """``(K^T W Y, K^T W K coef or None, n_eff, dtype)`` in one pass."""
    target = fitted = None
    n_effective, dtype = 0.0, None
    for K_block, Y_block, w_block in row_blocks.blocks():
        Y_block = _as_matrix(Y_block).to(torch.float64)
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


def _iteration_pass(row_blocks, coef, direction, dtype):
    """One pass: ``(K^T W (K coef - Y), K^T W K direction, sum_i w_i ||K(x_i, Z) coef - y_i||^2)``."""
    n_outputs = coef.shape[1]
    both = torch.cat([coef, direction], dim=1).to(dtype)
    images = torch.zeros(coef.shape[0], 2 * n_outputs, dtype=torch.float64, device=coef.device)
    loss = torch.zeros((), dtype=torch.float64, device=coef.device)
    for K_block, Y_block, w_block in row_blocks.blocks():
        products = K_block @ both
        residual = products[:, :n_outputs].to(torch.float64) - _as_matrix(Y_block).to(torch.float64)
        values = torch.cat([residual.to(dtype), products[:, n_outputs:]], dim=1)
        if w_block is None:
            loss += residual.square().sum()
        else:
            loss += (residual.square() * w_block.to(torch.float64)[:, None]).sum()
            values = values * w_block.to(dtype)[:, None]
        images += (K_block.mT @ values).to(torch.float64)
    return images[:, :n_outputs], images[:, n_outputs:], float(loss)


def _column_norms(matrix):
    return torch.linalg.vector_norm(matrix, dim=0)


def fit_centers_cg(kernel, row_blocks, centers, alpha, settings, coef_init=None, center_shares=None):
    """Fit the coefficients of the centers by preconditioned conjugate gradients.

    Minimises ``sum_i w_i ||K(x_i, Z) a - y_i||^2 + alpha trace(a^T K(Z, Z) a)``
    (see the module's docstring for the convention and the method).

    Parameters
    ----------
    kernel : Kernel
    row_blocks : RowBlocks
        The training rows as blocks ``(K(X_rows, Z), Y_rows, w_rows or None)``:
        :class:`KernelRowBlocks`, :class:`CachedRowBlocks` or any object with such
        a ``blocks()`` method.
    centers : Tensor of shape (p, d)
        Raw centers (``kernel(centers, centers)`` is ``K(Z, Z)``) on the device of
        the kernel blocks, the same rows the blocks were computed against.
    alpha : float
        Penalty (``>= 0``) against the sum of the weighted squared errors.
    settings : CGSettings
    coef_init : Tensor of shape (p, l) or None, default=None
        Warm start.
    center_shares : Tensor of shape (p,) or None, default=None
        The share of the training rows each center stands for (summing to 1), for
        centers that are the distinct values of repeated rows; None: ``1 / p``
        each, a uniform draw.  It shapes the preconditioner only.

    Returns
    -------
    CentersSolveResult
        ``history[k - 1]["train_loss"]`` is the objective divided by ``n_eff l`` at
        the coefficients iteration ``k`` started from (measured in its pass, as
        the EigenPro loops measure each batch before its step).

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> X = torch.linspace(0, 1, 40, dtype=torch.float64)[:, None]
    >>> kernel, Z = Gaussian(bandwidth=0.3), X[::4]
    >>> rows = KernelRowBlocks(center_operator(kernel, X, Z, row_block=16), torch.sin(6 * X), None, row_block=16)
    >>> result = fit_centers_cg(kernel, rows, Z, 1e-3, CGSettings(tol=1e-8))
    >>> result.converged, result.coef.shape
    (True, torch.Size([10, 1]))
    """
    coef = None if coef_init is None else _as_matrix(coef_init).to(centers.device, torch.float64)
    target, fitted, n_effective, dtype = _first_pass(row_blocks, coef)
    jitter = settings.jitter
    if jitter is None:
        mean_diagonal = float(kernel.diagonal(centers).mean())
        jitter = default_jitter(dtype, alpha / mean_diagonal, n_effective / centers.shape[0])
    projection = ExactProjection(kernel, centers, jitter, torch.float64)
    if center_shares is None:
        masses = n_effective / max(centers.shape[0], 1)
    else:
        masses = n_effective * center_shares.to(centers.device, torch.float64)
    preconditioner = CentersPreconditioner(projection, alpha, masses, jitter)
    if coef is None:
        coef, gradient = torch.zeros_like(target), target
    else:
        gradient = target - fitted - alpha * preconditioner.gram(coef)
    residual = preconditioner.solve_transpose(gradient)
    reference = torch.maximum(_column_norms(preconditioner.solve_transpose(target)), _column_norms(residual))
    system = _CentersSystem(row_blocks, preconditioner, alpha, max(n_effective * coef.shape[1], 1e-300), dtype, coef)
    history, stop = conjugate_gradients(system, coef, residual, reference, settings)
    return CentersSolveResult(coef.to(dtype), len(history), history, projection.jitter, stop)


class _CentersSystem:
    """Falkon's normal equations ``H a = b`` on centers, with ``a = B beta`` (see :func:`conjugate_gradients`).

    Keeps ``T a`` next to the coefficients, so that ``K_ZZ a`` costs one product with
    the factor per iteration.
    """

    def __init__(self, row_blocks, preconditioner, alpha, loss_scale, dtype, coef):
        self.row_blocks, self.preconditioner, self.alpha = row_blocks, preconditioner, alpha
        self.loss_scale, self.dtype = loss_scale, dtype  # loss_scale: n_eff * l
        self.coef_factor, self.step_factor = preconditioner.L.mT @ coef, None

    def step_coefficients(self, direction):
        """``B d``, remembering ``T B d``."""
        step_coef, self.step_factor = self.preconditioner.solve(direction)
        return step_coef

    def evaluate(self, coef, step_coef):
        """``([H a - b, H v], objective, merit)`` in one pass over the row blocks (the merit is the objective)."""
        gradient, image, data_loss = _iteration_pass(self.row_blocks, coef, step_coef, self.dtype)
        # K_ZZ [a, v] in one product with T's factor, B^T of both in one pair of solves:
        # each reads a p x p matrix, which dominates the p-space work when p is large.
        both_factors = torch.cat([self.coef_factor, self.step_factor], 1)
        at_centers = self.preconditioner.gram(torch.cat([coef, step_coef], 1), both_factors)
        n_outputs = coef.shape[1]
        train_loss = (data_loss + self.alpha * float((coef * at_centers[:, :n_outputs]).sum())) / self.loss_scale
        # The objective is CG's own here: its growth is what the monitor watches.
        return torch.cat([gradient, image], 1).add_(at_centers, alpha=self.alpha), train_loss, train_loss

    def transposed(self, matrix):
        """``B^T matrix``."""
        return self.preconditioner.solve_transpose(matrix)

    def moved(self, step):
        """``a`` moved by ``step`` times the last step's coefficients: ``T a`` follows."""
        self.coef_factor.add_(self.step_factor * step)


def _relative(residual, reference):
    norms = _column_norms(residual)
    return torch.where(reference > 0, norms / reference.clamp_min(1e-300), torch.zeros_like(norms))


def conjugate_gradients(system, coef, residual, reference, settings):
    """CG on ``C^T A C beta = C^T b`` tracking ``a = C beta`` in ``coef`` (in place); ``(history, stop)``.

    ``system`` holds the symmetric operator ``A`` (Falkon's ``H`` on centers, or
    ``K + alpha W^-1`` with every training row a center) and the split
    preconditioner ``C`` (Falkon's ``B``): ``system.step_coefficients(d)`` is ``C d``,
    ``system.evaluate(a, v)`` is ``([A a - b, A v], training objective, merit)``
    from one pass over the data (the merit is what exact CG lowers at every step,
    up to a constant: its growth means rounding), ``system.transposed(M)`` is ``C^T M`` and ``system.moved(step)``
    hears that ``a`` moved by ``step`` times the last ``C d``.  ``residual`` is
    ``C^T (b - A a)`` at the start and ``reference`` the norms the relative
    residual divides by.

    Each pass also yields the gradient at the current coefficients, so every
    iteration starts from the true residual ``B^T (b - H a)`` rather than the one
    the recurrence carries: the step is the exact line search along the direction
    (the objective cannot grow) and the direction follows Polak-Ribiere, which is
    plain CG in exact arithmetic.  Without this, rounding in ``B`` (whose condition
    number grows as the jitter and ``alpha`` shrink) let the recurrence drift from
    the true residual and the objective grew again after ~10 iterations on
    numerically singular problems.  The stopping test reads the residual one step
    after the true one.
    """
    history = []
    relative = _relative(residual, reference)
    met = relative <= settings.tol  # columns that met the tolerance: frozen from then on
    broken = torch.zeros_like(met)  # columns whose curvature was not positive (rounding): stopped unconverged
    direction, monitor = residual.clone(), _Monitor(coef, settings)
    n_outputs = coef.shape[1]
    clock = EpochClock(coef.device)
    for iteration in range(1, settings.max_iterations + 1):
        active = ~(met | broken)
        if not bool(active.any()):
            break
        clock.start()
        step_coef = system.step_coefficients(direction)
        images, train_loss, merit = system.evaluate(coef, step_coef)
        if monitor.diverged(merit, coef):
            return history, "objective grew"
        if monitor.objective_diverged(train_loss, coef, settings.log):
            return history, "diverged"
        both = system.transposed(images)
        residual, image = both[:, :n_outputs].neg(), both[:, n_outputs:]
        curvature = (direction * image).sum(dim=0)
        broken |= active & ~(curvature > 0)
        active &= ~broken
        step = torch.where(active, (residual * direction).sum(dim=0) / curvature.clamp_min(1e-300), 0.0)
        coef.add_(step_coef * step)
        system.moved(step)
        new_residual = residual - image * step
        relative = _relative(new_residual, reference)
        ratio = (new_residual * (new_residual - residual)).sum(dim=0) / _column_norms(residual).square()
        direction = new_residual + direction * ratio.nan_to_num(0.0).clamp_min(0.0)
        met |= active & (relative <= settings.tol)
        history.append(_record(iteration, train_loss, step, clock.seconds(), relative, settings))
        active &= ~met
        if bool(active.any()):
            stop = monitor.stagnated(float(relative[active].max()), merit, settings.log)
            if stop:
                return history, monitor.unconverged(stop, coef)
    if bool(met.all()):
        return history, "converged"
    return history, monitor.unconverged("iterations" if bool(active.any()) else "curvature", coef)


class _Monitor:
    """Rollback to the best measured coefficients when the merit or the objective diverges; residual stagnation.

    The merit and the objective are measured in the kernel blocks' dtype at the
    coefficients an iteration starts from (rounded to that dtype, as they will be
    returned).  The exact line search cannot make the merit grow, so its growth
    (:data:`~skgpu_kernel.planning.stopping.CG_MERIT_DIVERGENCE`) means rounding has
    taken over: with float32 blocks and a tiny ``alpha`` the exact solution can have
    coefficients so large that float32 cannot evaluate it.  Where the settings carry
    the objective's own rule, its best iterate is kept too.
    """

    def __init__(self, coef, settings):
        self.n_iter_no_change = settings.n_iter_no_change
        self.merit_rule = plan_divergence("merit")
        self.best_loss, self.best_coef = math.inf, coef.clone()
        self.lowest_residual, self.without_new_low = math.inf, 0
        self.objective = Stopping(settings.stopping)
        self.objective_rule = settings.objective_divergence
        if self.objective_rule is not None:
            self.best_objective, self.best_objective_coef = math.inf, coef.clone()
            self.reference, self.last_objective, self.growths = None, math.inf, 0

    def diverged(self, merit, coef):
        """Record CG's merit at ``coef``; on growth put the best coefficients back (a warning) and say so.

        Growth is by ``growth - 1`` times the best merit's size (which may be
        negative: CG's quadratic on the square system).
        """
        if self.merit_rule.exceeded(merit, self.best_loss) is None:
            if merit < self.best_loss:
                self.best_loss = merit
                self.best_coef.copy_(coef)
            return False
        coef.copy_(self.best_coef)
        warn_user(
            f"Conjugate gradients stopped: the objective grew to {merit:.4g} from "
            f"{self.best_loss:.4g}, rounding in the kernel blocks' dtype dominates; keeping the best coefficients. "
            "Use float64 or a larger alpha.",
            RuntimeWarning,
        )
        return True

    def objective_diverged(self, objective, coef, log):
        """Record the training objective at ``coef``; where it broke its rule, the best iterate put back and True."""
        rule = self.objective_rule
        if rule is None:
            return False
        if self.reference is None:
            self.reference = objective  # the zero model's, from a cold start
        why = rule.exceeded(objective, self.best_objective, self.reference)
        self.growths = self.growths + 1 if why == "grew" else 0
        self.last_objective = objective
        if why is None or (why == "grew" and self.growths < rule.window):
            if objective < self.best_objective:
                self.best_objective = objective
                self.best_objective_coef.copy_(coef)
            return False
        coef.copy_(self.best_objective_coef)
        if log is not None:
            log(
                f"stopping: the training objective diverged ({why}: {objective:.4g}, lowest "
                f"{self.best_objective:.4g}, the start's {self.reference:.4g}); keeping the best iterate"
            )
        return True

    def unconverged(self, stop, coef):
        """``stop``, with the best iterate by the objective put back where the last measured one is worse."""
        rule = self.objective_rule
        if rule is not None and self.reference is not None:
            if rule.keeps_best(self.last_objective, self.best_objective, self.reference):
                coef.copy_(self.best_objective_coef)
        return stop

    def stagnated(self, residual, train_loss, log):
        """Record the largest relative residual and the objective; which has stopped improving, or None."""
        if self.objective.should_stop({"train_loss": train_loss}, None, log):
            return "objective"
        if residual < self.lowest_residual:
            self.lowest_residual, self.without_new_low = residual, 0
            return None
        self.without_new_low += 1
        if self.n_iter_no_change is None or self.without_new_low < self.n_iter_no_change:
            return None
        if log is not None:
            log(
                f"stopping: the relative residual has not fallen below {self.lowest_residual:.3g} for "
                f"{self.n_iter_no_change} iterations"
            )
        return "residual stalled"


def _record(iteration, train_loss, step, seconds, relative, settings):
    """The iteration's record (learning rate: the mean CG step of the columns that moved), logged."""
    moved = step[step != 0]
    learning_rate = float(moved.mean()) if moved.numel() else 0.0
    record = epoch_record(
        iteration, iteration, train_loss, learning_rate, seconds, relative_residual=float(relative.max())
    )
    if settings.log is not None:
        line = format_record(record, settings.max_iterations)
        settings.log(f"{line}, relative residual {record['relative_residual']:.3g}")
    return record
