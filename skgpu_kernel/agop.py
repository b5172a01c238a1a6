"""Feature learning: the average gradient outer product (AGOP) of a kernel predictor, and the metric it gives.

Recursive Feature Machines (Radhakrishnan et al., Science 2024) and xRFM (Beaglehole
et al., 2025) alternate two steps: fit a kernel predictor ``f(x) = sum_j a_j k(x, z_j)``
with a Mahalanobis kernel ``k_M(x, z) = phi(||x - z||_M)``, then replace ``M`` by a
power of the AGOP of ``f``,

    ``G = (1/n) sum_i sum_l grad f_l(x_i) grad f_l(x_i)^T``,

over (a subsample of) the training rows.  For a radial kernel,
``grad_x k(x, z) = g(x, z) (x - z)`` with the gradient weight kernel ``g``
(:meth:`~skgpu_kernel.kernels.RadialKernel.gradient_kernel`), so

    ``grad f_l(x_i) = x_i (g(X, Z) a_l)_i - (g(X, Z) (a_l * Z))_i``:

the gradients of a block of rows are one product of the kernel operator of ``g``
with the columns ``[a, a_1 * Z, ..., a_l * Z]``, computed as every kernel product
of the package is (:class:`~skgpu_kernel.operators.EvaluatedOperator`).

The Mahalanobis kernel needs no kernel of its own: with ``M = L L^T``
(:func:`metric_transform`), ``||x - z||_M = ||x L - z L||``, so the kernels of
:mod:`skgpu_kernel.kernels` on the rows ``X @ L`` are ``k_M`` on ``X``.  The AGOP of
``f(x) = h(x L)`` in the original coordinates is then ``L AGOP_h L^T``
(``grad f(x) = L grad h(x L)``), where ``AGOP_h`` is the AGOP of ``h`` on the
transformed rows and centers.
"""

import torch
from sklearn.utils import check_random_state

from .device import resolve_memory_budget
from .operators import CenterOperators
from .planning.agop import plan_agop

__all__ = ["average_gradient_outer_product", "block_diagonal", "metric_from_agop", "metric_transform"]


def average_gradient_outer_product(
    kernel, rows, centers, coef, sample_weight=None, *, diagonal=False, plan=None, random_state=None
):
    """The AGOP ``G = (1/n) sum_i sum_l grad f_l(x_i) grad f_l(x_i)^T`` of ``f(x) = sum_j coef_j k(x, z_j)``.

    Computed blockwise over the rows: each block's gradients come from one product
    of the operator of ``kernel.gradient_kernel()`` with ``[coef, coef_l * Z, ...]``,
    and their outer products are summed in float64.

    Parameters
    ----------
    kernel : Kernel
        A kernel that declares its gradient (:meth:`~skgpu_kernel.kernels.Kernel.gradient_kernel`:
        Gaussian, Laplacian, Cauchy, Matern).
    rows : Tensor of shape (n, d)
        The rows the gradients are averaged over, on the device of the computation
        (the training rows, as the fit saw them: centred if it centred them).
    centers : Tensor of shape (p, d)
        The predictor's centers ``Z`` (raw, not prepared); moved to the rows'
        device and dtype.
    coef : Tensor of shape (p, l) or (p,)
        The predictor's coefficients ``a``.
    sample_weight : Tensor of shape (n,) or None, default=None
        Non-negative weights of the rows: ``G`` is then their weighted mean.
    diagonal : bool, default=False
        Return only ``diag(G)``, without the ``d x d`` products.
    plan : AGOPPlan or None, default=None
        Rows and blocks (:func:`~skgpu_kernel.planning.agop.plan_agop`); None plans
        them for the rows' device and a safe fraction of its free memory
        (``skgpu_kernel.device.resolve_memory_budget``).  With ``plan.n_rows``
        below ``n``, ``G`` is estimated on ``plan.n_rows`` rows drawn without
        replacement (``random_state.choice(n, plan.n_rows, replace=False)``, in
        increasing order) and their weights.
    random_state : int, RandomState instance or None, default=None
        Draws the subsample.

    Returns
    -------
    Tensor of shape (d, d), or (d,) with ``diagonal``
        In float64, on the rows' device.

    Raises
    ------
    ValueError
        For a kernel without a known gradient, inconsistent shapes, or weights
        that are negative or sum to zero.

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> Z = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    >>> X = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    >>> # f(x) = exp(-||x||^2 / 2): its gradient at (1, 0) is (-exp(-1/2), 0).
    >>> average_gradient_outer_product(Gaussian(bandwidth=1.0), X, Z, torch.ones(1, dtype=torch.float64))
    tensor([[0.3679, 0.0000],
            [0.0000, 0.0000]], dtype=torch.float64)
    """
    gradient_kernel = kernel.gradient_kernel()
    centers, coef, weights = _checked_inputs(rows, centers, coef, sample_weight)
    n, d = rows.shape
    if plan is None:
        budget = resolve_memory_budget(None, rows.device)
        plan = plan_agop(n, d, centers.shape[0], coef.shape[1], rows.element_size(), budget, rows.device.type)
    if plan.n_rows < n:
        chosen = check_random_state(random_state).choice(n, plan.n_rows, replace=False)
        chosen = torch.as_tensor(sorted(chosen), device=rows.device)
        rows, weights = rows[chosen], weights[chosen]
        if not weights.sum() > 0:
            raise ValueError("Every row of the subsample has zero weight; draw it again or pass more weighted rows.")
    with torch.no_grad():
        return _weighted_agop(gradient_kernel, rows, centers, coef, weights, diagonal, plan)


def _checked_inputs(rows, centers, coef, sample_weight):
    """Centers and coefficients (p, l) on the rows' device and dtype, and float64 weights (all ones without them)."""
    if rows.ndim != 2 or centers.ndim != 2 or rows.shape[1] != centers.shape[1]:
        raise ValueError(
            f"rows and centers must be matrices with the same number of columns, got shapes "
            f"{tuple(rows.shape)} and {tuple(centers.shape)}."
        )
    coef = coef.reshape(-1, 1) if coef.ndim == 1 else coef
    if coef.ndim != 2 or coef.shape[0] != centers.shape[0]:
        raise ValueError(f"coef must have one row per center ({centers.shape[0]}), got shape {tuple(coef.shape)}.")
    if rows.shape[0] == 0:
        raise ValueError("The AGOP is a mean over rows: at least one row is needed.")
    device, dtype = rows.device, rows.dtype
    if sample_weight is None:
        weights = torch.ones(rows.shape[0], dtype=torch.float64, device=device)
    else:
        weights = torch.as_tensor(sample_weight).to(device=device, dtype=torch.float64).reshape(-1)
        if weights.shape[0] != rows.shape[0] or not (weights >= 0).all() or not weights.sum() > 0:
            raise ValueError("sample_weight must hold one non-negative weight per row, with a positive sum.")
    return centers.to(device=device, dtype=dtype), coef.to(device=device, dtype=dtype), weights


def _weighted_agop(gradient_kernel, rows, centers, coef, weights, diagonal, plan):
    """``sum_i w_i sum_l grad f_l(x_i) grad f_l(x_i)^T / sum_i w_i``, in blocks of ``plan.row_block`` rows."""
    (n, d), n_outputs = rows.shape, coef.shape[1]
    # The kernel is translation invariant: shifting the rows and the centers by their
    # mean in x (G a) - G (a * Z) changes nothing but the cancellation between the two
    # terms, which is smallest about the centers' mean.
    offset = centers.mean(dim=0)
    shifted = centers - offset
    columns = torch.cat([coef, (coef[:, :, None] * shifted[:, None, :]).reshape(-1, n_outputs * d)], dim=1)
    operator = CenterOperators.of(gradient_kernel, centers).operator(rows, plan.blocks)
    total = torch.zeros(d if diagonal else (d, d), dtype=torch.float64, device=rows.device)
    for top in range(0, n, plan.row_block):
        block = slice(top, min(top + plan.row_block, n))
        products = operator.matmul(columns, rows=block).to(torch.float64)
        # grad f_l(x_i) = (x_i - offset) (G a_l)_i - (G (a_l * (Z - offset)))_i, shape (m, l, d).
        row_offsets = (rows[block] - offset).to(torch.float64)
        gradients = row_offsets[:, None, :] * products[:, :n_outputs, None]
        gradients -= products[:, n_outputs:].reshape(-1, n_outputs, d)
        weighted = gradients * weights[block, None, None]
        if diagonal:
            total += (weighted * gradients).sum(dim=(0, 1))
        else:
            total.addmm_(weighted.reshape(-1, d).T, gradients.reshape(-1, d))
    return total / weights.sum()


def block_diagonal(agop, blocks, diagonal=False):
    """The AGOP with each block of features (a category's one-hot columns) one block of the metric, as xRFM's.

    A block's columns are the levels of one categorical input column: the metric
    keeps the AGOP's entries among them, which learn how far apart the levels are
    (a full block can place them on a line, as a tree sorts levels by their
    effect), and drops their entries with every other feature.  A diagonal metric
    keeps one scale per other feature, its diagonal entry; a full one keeps the
    other features' entries among themselves.  Every kept block is a principal
    submatrix of the positive semi-definite AGOP, so the result is positive
    semi-definite too and the metric's power stays defined.

    Parameters
    ----------
    agop : Tensor of shape (d, d), or (d,) for its diagonal without blocks
        From :func:`average_gradient_outer_product`; with blocks it must be the
        full matrix.
    blocks : sequence of index arrays
        The features of each block (at least two each; disjoint).
    diagonal : bool, default=False
        Whether the features outside the blocks keep one scale each.

    Returns
    -------
    Tensor of shape (d, d), or (d,) for a diagonal metric without blocks
        ``agop`` itself where it stays as it is: no blocks and a full metric, or
        no blocks and a diagonal one given as its diagonal (a matrix ``agop`` with
        ``diagonal`` and no blocks becomes its diagonal).
    """
    if not len(blocks):
        return agop.diagonal() if diagonal and agop.ndim == 2 else agop
    if agop.ndim != 2:
        raise ValueError(f"Blocks of features need the (d, d) AGOP, got shape {tuple(agop.shape)}.")
    kept = torch.diag(agop.diagonal()) if diagonal else agop.clone()
    indices = [torch.as_tensor(block, device=agop.device) for block in blocks]
    for index in indices:
        kept[index, :] = 0.0
        kept[:, index] = 0.0
    for index in indices:
        square = (index.unsqueeze(1), index.unsqueeze(0))
        kept[square] = agop[square]
    return kept


def metric_from_agop(agop, diagonal=False, power=0.5):
    """The metric ``M`` of the next feature-learning step: ``agop ** power``, divided by its largest entry.

    As xRFM: the matrix power of the symmetric positive semi-definite ``agop``
    (eigenvalues below zero, rounding errors, clipped at zero), or with
    ``diagonal`` the power of its diagonal alone, normalised so that the largest
    entry is 1.

    Parameters
    ----------
    agop : Tensor of shape (d, d), or (d,) for its diagonal
        From :func:`average_gradient_outer_product`.
    diagonal : bool, default=False
        Keep one scale per feature: ``M = diag(agop) ** power``, returned as a vector.
    power : float, default=0.5
        Positive; xRFM's default is 1/2.

    Returns
    -------
    Tensor of shape (d, d), or (d,) with ``diagonal``

    Raises
    ------
    ValueError
        For a power that is not positive, a vector ``agop`` without ``diagonal``,
        or an AGOP that is zero (a constant predictor ranks no feature).

    Examples
    --------
    >>> import torch
    >>> metric_from_agop(torch.tensor([[4.0, 0.0], [0.0, 1.0]]))
    tensor([[1.0000, 0.0000],
            [0.0000, 0.5000]])
    >>> metric_from_agop(torch.tensor([16.0, 4.0]), diagonal=True)
    tensor([1.0000, 0.5000])
    """
    agop = torch.as_tensor(agop)
    if not power > 0:
        raise ValueError(f"power must be positive, got {power!r}.")
    if diagonal:
        metric = (agop.diagonal() if agop.ndim == 2 else agop).clamp_min(0.0).pow(power)
    elif agop.ndim != 2:
        raise ValueError(f"A full metric needs the (d, d) AGOP, got shape {tuple(agop.shape)}; pass diagonal=True.")
    else:
        metric = _symmetric_power(agop, power)
    largest = metric.max()
    if not largest > 0:
        raise ValueError("The AGOP is zero: the predictor is constant on the rows, so it ranks no feature.")
    return metric / largest


def metric_transform(metric):
    """``L`` with ``metric = L L^T``, so that ``||x - z||_M = ||x L - z L||``.

    The kernels of :mod:`skgpu_kernel.kernels` on the rows ``X @ L`` (``X * L`` for a
    diagonal metric) are then the Mahalanobis kernels ``phi(||x - z||_M)`` on ``X``.

    Parameters
    ----------
    metric : Tensor of shape (d, d), or (d,) for a diagonal metric
        Symmetric positive semi-definite (eigenvalues below zero are clipped).

    Returns
    -------
    Tensor of shape (d, d), or (d,) for a diagonal metric
        The symmetric square root of ``metric`` (the square roots of its entries
        for a diagonal one).

    Examples
    --------
    >>> import torch
    >>> metric_transform(torch.tensor([4.0, 1.0]))
    tensor([2., 1.])
    """
    metric = torch.as_tensor(metric)
    if metric.ndim == 1:
        return metric.clamp_min(0.0).sqrt()
    return _symmetric_power(metric, 0.5)


def _symmetric_power(matrix, power):
    """``matrix ** power`` of the symmetric part of ``matrix``, its negative eigenvalues clipped at zero."""
    eigenvalues, eigenvectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    return (eigenvectors * eigenvalues.clamp_min(0.0).pow(power)) @ eigenvectors.T
