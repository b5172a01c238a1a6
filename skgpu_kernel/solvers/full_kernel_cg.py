"""Penalised kernel regression with a center at every training row, by preconditioned CG.

The coefficients ``a`` (n x l) of ``f(x) = sum_i a_i k(x_i, x)`` minimise

    ``sum_i w_i ||f(x_i) - y_i||^2 + alpha trace(a^T K a)``,

whose minimiser solves ``(K + alpha W^-1) a = Y`` (the system EigenPro 2 iterates
on).  That system is symmetric positive definite, so conjugate gradients solve it
with no step size; each iteration reads ``K`` once, as an EigenPro epoch does.
Where ``alpha`` is small against ``K``'s top eigenvalues the system is ill
conditioned, and SGD's progress on the directions below the preconditioner's level
is ``alpha / beta_P`` e-folds per epoch (VietNamI: 0.066, 31 epochs).  CG with a
preconditioner that brings the top of the spectrum down to the shift
(:class:`~skgpu_kernel.cg_preconditioner.ShiftedNystromPreconditioner`) needs about
the square root of the remaining condition number.

The loop is :func:`~skgpu_kernel.solvers.conjugate_gradients.conjugate_gradients` (exact
line search from the true residual every iteration, the package's stopping rule
on the objective); coefficients and CG vectors are float64, products with ``K``
run in the training dtype.
"""

import torch

from .conjugate_gradients import conjugate_gradients

__all__ = ["solve_full_kernel_cg"]


class _FullKernelSystem:
    """``A = K + alpha W^-1`` with the split preconditioner ``C`` (see :func:`conjugate_gradients`)."""

    def __init__(self, operator, Y, weights, alpha, preconditioner):
        self.operator, self.Y, self.alpha, self.preconditioner = operator, Y, alpha, preconditioner
        self.weights = None if weights is None else weights.to(torch.float64)[:, None]
        n_effective = Y.shape[0] if weights is None else float(weights.sum())
        self.loss_scale = max(n_effective * Y.shape[1], 1e-300)
        self.zero_loss = float(self._weighted(Y.square()).sum())

    def step_coefficients(self, direction):
        return self.preconditioner.apply(direction)

    def evaluate(self, coef, step_coef):
        """``([A a - Y, A v], objective, merit)`` from one product of ``K`` with ``[a, v]``.

        The objective is the training loss the package reports everywhere; CG lowers
        ``a^T A a - 2 a^T Y`` instead (the ``A``-norm of the error, up to a
        constant), which is the merit, offset to equal the objective at ``a = 0``.
        """
        both = torch.cat([coef, step_coef], 1)
        images = self.operator.matmul(both.to(self.operator.dtype)).to(torch.float64)
        n_outputs = coef.shape[1]
        fitted = images[:, :n_outputs]
        residual = fitted - self.Y
        penalty = self.alpha * float((coef * fitted).sum())
        loss = float(self._weighted(residual.square()).sum()) + penalty
        shifted = both if self.weights is None else both / self.weights
        quadratic = float((coef * fitted).sum()) + self.alpha * float((coef * shifted[:, :n_outputs]).sum())
        merit = quadratic - 2.0 * float((coef * self.Y).sum()) + self.zero_loss
        images[:, :n_outputs] = residual
        return images.add_(shifted, alpha=self.alpha), loss / self.loss_scale, merit / self.loss_scale

    def _weighted(self, values):
        return values if self.weights is None else values * self.weights

    def transposed(self, matrix):
        return self.preconditioner.apply_transpose(matrix)

    def moved(self, step):
        pass


def solve_full_kernel_cg(operator, targets, plan):
    """Solve ``(K + alpha W^-1) a = Y`` by preconditioned conjugate gradients.

    Parameters
    ----------
    operator : KernelOperator
        ``K(X, X)`` (products in its dtype; the coefficients and CG's vectors are float64).
    targets : Targets
        ``Y`` of shape (n, l); normalised sample weights in (0, 1], or None for unit weights.
    plan : CGPlan
        ``alpha`` positive, on the scale of the normalised weights; the
        preconditioner (a :class:`~skgpu_kernel.cg_preconditioner.ShiftedNystromPreconditioner`);
        the warm start, if any.

    Returns
    -------
    Solution
        ``coef`` in float64; ``history[k - 1]["train_loss"]`` is the objective
        divided by ``n_eff l`` at the coefficients iteration ``k`` started from.

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> from skgpu_kernel.cg_preconditioner import PenalisedRows, shifted_nystrom_preconditioner
    >>> from skgpu_kernel.operators import CachedOperator
    >>> from skgpu_kernel.preconditioner import nystrom_eigensystem
    >>> from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings
    >>> from skgpu_kernel.solvers.solution import Targets
    >>> X = torch.linspace(0, 1, 60, dtype=torch.float64)[:, None]
    >>> K = Gaussian(bandwidth=0.3)(X, X)
    >>> rows = PenalisedRows(60, 1e-3, None, torch.float64)
    >>> preconditioner = shifted_nystrom_preconditioner(
    ...     nystrom_eigensystem(Gaussian(bandwidth=0.3), X[:20]), lambda V: K[:, :20] @ V, rows, max_components=19)
    >>> Y = torch.sin(6 * X)
    >>> plan = CGPlan(1e-3, CGSettings(tol=1e-10), preconditioner)
    >>> result = solve_full_kernel_cg(CachedOperator(K, torch.float64), Targets(Y), plan)
    >>> exact = torch.linalg.solve(K + 1e-3 * torch.eye(60, dtype=torch.float64), Y)
    >>> result.converged, bool(torch.allclose(result.coef, exact, atol=1e-7))
    (True, True)
    """
    Y = targets.Y.to(torch.float64)
    system = _FullKernelSystem(operator, Y, targets.weights, plan.alpha, plan.preconditioner)
    if plan.coef_init is None:
        coef, gradient = torch.zeros_like(Y), Y
    else:
        coef = plan.coef_init.to(device=Y.device, dtype=torch.float64).clone()
        images, _, _ = system.evaluate(coef, torch.zeros_like(coef[:, :0]))
        gradient = -images[:, : Y.shape[1]]
    residual = system.transposed(gradient)
    reference = torch.maximum(
        torch.linalg.vector_norm(system.transposed(Y), dim=0), torch.linalg.vector_norm(residual, dim=0)
    )
    return conjugate_gradients(system, coef, residual, reference, plan.settings)
