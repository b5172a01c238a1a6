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

The operator reaches the solver as a *row-block source*: any object whose
``blocks()`` method yields, on each call, one pass over every training row exactly
once as pairs ``(rows, K_block)``: a slice of the rows and ``K_block = K(X_rows,
Z)`` of shape (rows, p) on the centers' device; the targets and weights of those
rows are read from the :class:`~skgpu_kernel.solvers.solution.Targets`.  The
block sizes may change between passes.
:class:`~skgpu_kernel.operators.row_blocks.KernelRowBlocks` computes the blocks
from a kernel operator (evaluated or on a grid);
:class:`~skgpu_kernel.operators.row_blocks.CachedRowBlocks` slices a precomputed
``K(X, Z)``.  The source also carries the kernel and the raw centers, from which
the penalty's ``K(Z, Z)`` is factored.

The loop only sees tensors; the caller validates, plans block sizes and memory and
decides whether ``K(X, Z)`` is cached.

References
----------
.. [1] A. Rudi, L. Carratino, L. Rosasco, "FALKON: An optimal large scale kernel
   method", NeurIPS 2017.
.. [2] G. Meanti, L. Carratino, L. Rosasco, A. Rudi, "Kernel methods through the
   roof: handling billions of points efficiently", NeurIPS 2020.
"""

import dataclasses
import math

import torch

from ..operators.row_blocks import as_matrix, first_pass, iteration_pass
from .conjugate_gradients import column_norms, conjugate_gradients
from .eigenpro3 import ExactProjection

__all__ = [
    "CentersPreconditioner",
    "default_jitter",
    "solve_centers_cg",
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


def solve_centers_cg(operator, targets, plan):
    """Fit the coefficients of the centers by preconditioned conjugate gradients.

    Minimises ``sum_i w_i ||K(x_i, Z) a - y_i||^2 + alpha trace(a^T K(Z, Z) a)``
    (see the module's docstring for the convention and the method).

    Parameters
    ----------
    operator : RowBlocks
        ``K(X, Z)`` in row blocks (:class:`~skgpu_kernel.operators.row_blocks.KernelRowBlocks`,
        :class:`~skgpu_kernel.operators.row_blocks.CachedRowBlocks`), with its kernel
        and raw centers (``K(Z, Z)``'s).
    targets : Targets
        ``Y`` of shape (n, l) or (n,); weights of shape (n,) or None.
    plan : CGPlan
        The penalty ``alpha >= 0`` against the sum of the weighted squared
        errors, the settings, the warm start and the centers' shares.

    Returns
    -------
    Solution
        ``coef`` in the dtype of the kernel blocks; ``history[k - 1]["train_loss"]``
        is the objective divided by ``n_eff l`` at the coefficients iteration
        ``k`` started from (measured in its pass, as the EigenPro loops measure
        each batch before its step).

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> from skgpu_kernel.operators.row_blocks import KernelRowBlocks, center_operator
    >>> from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings
    >>> from skgpu_kernel.solvers.solution import Targets
    >>> X = torch.linspace(0, 1, 40, dtype=torch.float64)[:, None]
    >>> kernel, Z = Gaussian(bandwidth=0.3), X[::4]
    >>> rows = KernelRowBlocks(center_operator(kernel, X, Z, row_block=16), Z, row_block=16)
    >>> result = solve_centers_cg(rows, Targets(torch.sin(6 * X)), CGPlan(1e-3, CGSettings(tol=1e-8)))
    >>> result.converged, result.coef.shape
    (True, torch.Size([10, 1]))
    """
    kernel, centers, alpha, settings = operator.kernel, operator.centers, plan.alpha, plan.settings
    coef = None if plan.coef_init is None else as_matrix(plan.coef_init).to(centers.device, torch.float64)
    target, fitted, n_effective, dtype = first_pass(operator, targets, coef)
    jitter = settings.jitter
    if jitter is None:
        mean_diagonal = float(kernel.diagonal(centers).mean())
        jitter = default_jitter(dtype, alpha / mean_diagonal, n_effective / centers.shape[0])
    projection = ExactProjection(kernel, centers, jitter, torch.float64)
    if plan.center_shares is None:
        masses = n_effective / max(centers.shape[0], 1)
    else:
        masses = n_effective * plan.center_shares.to(centers.device, torch.float64)
    preconditioner = CentersPreconditioner(projection, alpha, masses, jitter)
    if coef is None:
        coef, gradient = torch.zeros_like(target), target
    else:
        gradient = target - fitted - alpha * preconditioner.gram(coef)
    residual = preconditioner.solve_transpose(gradient)
    reference = torch.maximum(column_norms(preconditioner.solve_transpose(target)), column_norms(residual))
    loss_scale = max(n_effective * coef.shape[1], 1e-300)
    system = _CentersSystem(operator, targets, preconditioner, alpha, loss_scale, dtype, coef)
    solved = conjugate_gradients(system, coef, residual, reference, settings)
    return dataclasses.replace(solved, coef=coef.to(dtype), jitter=projection.jitter)


class _CentersSystem:
    """Falkon's normal equations ``H a = b`` on centers, with ``a = B beta`` (see :func:`conjugate_gradients`).

    Keeps ``T a`` next to the coefficients, so that ``K_ZZ a`` costs one product with
    the factor per iteration.
    """

    def __init__(self, row_blocks, targets, preconditioner, alpha, loss_scale, dtype, coef):
        self.row_blocks, self.targets, self.preconditioner, self.alpha = row_blocks, targets, preconditioner, alpha
        self.loss_scale, self.dtype = loss_scale, dtype  # loss_scale: n_eff * l
        self.coef_factor, self.step_factor = preconditioner.L.mT @ coef, None

    def step_coefficients(self, direction):
        """``B d``, remembering ``T B d``."""
        step_coef, self.step_factor = self.preconditioner.solve(direction)
        return step_coef

    def evaluate(self, coef, step_coef):
        """``([H a - b, H v], objective, merit)`` in one pass over the row blocks (the merit is the objective)."""
        gradient, image, data_loss = iteration_pass(self.row_blocks, self.targets, coef, step_coef, self.dtype)
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
