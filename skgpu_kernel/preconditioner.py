"""EigenPro preconditioner: a Nystrom estimate of the kernel's top eigensystem.

Notation (see ``ALGORITHMS.md`` section 1): ``lambda_1 >= lambda_2 >= ...`` are the
eigenvalues of the normalised kernel matrix ``K / n``, estimated by those of
``K_S / s`` on a uniform subsample ``S`` of size ``s``; ``beta = max_i k(x_i, x_i)``.
The preconditioner flattens the top ``k`` eigendirections down to the level
``lambda_{k+1}`` with damping exponent ``a``::

    D_i = (1 - (lambda_{k+1} / lambda_i) ** a) / lambda_i,   i = 1..k

so the top eigenvalue becomes ``lambda_1' = lambda_1 (lambda_{k+1} / lambda_1) ** a``
and the critical batch size grows from ``beta / lambda_1`` to ``beta_P / lambda_1'``,
where ``beta_P = max_x k_P(x, x) <= beta`` is the largest diagonal entry of the
preconditioned kernel (as in the reference code): the step size that interpolates
one sample under preconditioning is ``1 / k_P(x, x)``.  In the paper's notation
``q = k + 1`` eigenpairs are kept.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._warnings import warn_user
from .blockwise import kernel_diagonal_max
from .operators import EvaluatedOperator, OperatorBlocks, kernel_matrix, widened

__all__ = [
    "SHIFTED_MAX_COMPONENTS",
    "DiagonalShares",
    "EigenProPreconditioner",
    "PenalisedRows",
    "PreconditionedDiagonal",
    "ShiftedNystromPreconditioner",
    "SpectralSettings",
    "choose_n_components",
    "eigenpro_step_size",
    "flattening_scales",
    "max_usable_components",
    "nystrom_eigensystem",
    "plan_preconditioner",
    "preconditioned_diagonal",
    "preconditioned_top_eigenvalue",
    "rpcholesky_factor",
    "shifted_condition",
    "shifted_nystrom_preconditioner",
    "shifted_rpcholesky_preconditioner",
]

# Most Nystrom directions the subsample-preconditioned CG flattens: each costs O(n)
# memory and work per iteration and O(n s) once to extend to every row.
SHIFTED_MAX_COMPONENTS = 1000

# Preconditioner levels beyond this cost more per step than they save.
_MAX_AUTO_COMPONENTS = 1000

# Randomly pivoted Cholesky draws this many pivots at once, fewer where that is more
# than an eighth of the largest rank (the pivots adapt between blocks only) or where
# ``n`` x the block float64 columns would exceed 64 MB; at least 16.
_RPCHOLESKY_BLOCK = 200
_RPCHOLESKY_BLOCK_ENTRIES = 2**23
# A block's residual eigenvalues below this many float64 rounding errors of K's
# largest diagonal entry, or this fraction of the block's largest, are dropped.
_RPCHOLESKY_NOISE = 1e3
_RPCHOLESKY_RELATIVE_NOISE = 1e-10

# An eigendirection is flattened only if its eigenvalue stands this many rounding
# errors of the training dtype above zero (relative to lambda_1); below that the
# correction would amplify rounding noise.
_RELATIVE_RESOLUTION = 1e3


def nystrom_eigensystem(kernel, X_subsample, precision=torch.float64):
    """Eigenvalues and eigenfunction values of ``K_S / s``, returned in float64.

    Parameters
    ----------
    kernel : Kernel
    X_subsample : Tensor of shape (s, d)
    precision : torch.dtype, default=torch.float64
        The dtype ``K_S`` (evaluated in float64) is decomposed in.  The EigenPro
        preconditioner of a float32 fit asks for float32: it applies the vectors in
        float32 and uses only directions above ``1e3`` float32 rounding errors of
        ``lambda_1`` (:func:`max_usable_components`), far above float32's error in
        the eigenvalues, and the decomposition then takes half the time (2000
        points on the 2-core CPU: 0.24 s against 0.50 s).

    Returns
    -------
    eigenvalues : ndarray of shape (s,)
        Descending; negative values (rounding) are clipped to zero.
    eigenvectors : Tensor of shape (s, s), float64
        Column ``i`` holds ``psi_i = u_i / sqrt(s)`` for the unit eigenvector ``u_i``.
    """
    sample = X_subsample.to(torch.float64)
    s = sample.shape[0]
    gram = kernel_matrix(kernel, sample)
    kernel.require_finite(gram, X_subsample.dtype)
    gram = (gram + gram.T) / (2.0 * s)
    values, vectors = torch.linalg.eigh(gram.to(precision))
    values = torch.flip(values, dims=[0]).to(torch.float64).clamp_min_(0.0)
    vectors = torch.flip(vectors, dims=[1]).to(torch.float64) / math.sqrt(s)
    return values.cpu().numpy(), vectors


def max_usable_components(eigenvalues, dtype):
    """Largest ``k`` whose level ``lambda_{k+1}`` is resolvable in ``dtype``."""
    if eigenvalues.size == 0 or eigenvalues[0] <= 0:
        return 0
    threshold = _RELATIVE_RESOLUTION * torch.finfo(dtype).eps * eigenvalues[0]
    resolvable = int(np.sum(eigenvalues > threshold))
    return max(min(resolvable, eigenvalues.size) - 1, 0)


def preconditioned_top_eigenvalue(eigenvalues, n_components, damping):
    """``lambda_1 (lambda_{k+1} / lambda_1) ** a`` (``lambda_1`` itself for ``k = 0``)."""
    top = float(eigenvalues[0])
    if n_components == 0 or top <= 0:
        return top
    return top * (float(eigenvalues[n_components]) / top) ** damping


def flattening_scales(eigenvalues, n_components, damping):
    """``D_i = (1 - (lambda_{k+1} / lambda_i) ** a) / lambda_i`` for ``i = 1..k``."""
    top = np.asarray(eigenvalues[:n_components], dtype=np.float64)
    if n_components == 0:
        return top
    return (1.0 - (eigenvalues[n_components] / top) ** damping) / top


def _flattening_ratios(eigenvalues, n_components, damping):
    """``r_i = (mu_{k+1} / mu_i) ** a`` for the ``k`` flattened directions, ``1`` beyond: what each keeps."""
    ratios = np.ones(eigenvalues.size)
    if n_components:
        ratios[:n_components] = (eigenvalues[n_components] / eigenvalues[:n_components]) ** damping
    return ratios


@dataclass(frozen=True)
class DiagonalShares:
    """Rows' ``k_P(x, x) = fixed(x) + sum_i shares(x, i) r_i``, positive terms (:class:`PreconditionedDiagonal`)."""

    fixed: np.ndarray
    shares: np.ndarray

    def maximum(self, ratios):
        """The largest ``k_P(x, x)`` of the rows, or ``-inf`` without rows."""
        if self.fixed.size == 0:
            return -math.inf
        return float(np.max(self.fixed + self.shares @ ratios[: self.shares.shape[1]]))


@dataclass(frozen=True)
class PreconditionedDiagonal:
    """``k_P(x, x)`` on the Nystrom subsample and on rows outside it, for any number of flattened directions.

    The preconditioned kernel's diagonal is ``k(x, x) - sum_{i <= k} (1 - r_i)
    p_i(x)^2 / mu_i`` with ``p_i = K(x, X_S) psi_i``, ``mu_i = lambda_i + sigma``
    (``sigma`` the penalty's shift) and ``r_i = (mu_{k+1} / mu_i) ** a``.  Written
    that way it is a difference of nearly equal numbers once most directions are
    flattened (1000 of 1080: ``8e-4`` against ``k(x, x) = 1``), and its rounding,
    relative to ``k(x, x)``, moved EigenPro's step size by ``6e-7`` between two
    fits of the same data.  Here it is ``fixed(x) + sum_i p_i(x)^2 / mu_i r_i``
    (``r_i = 1`` beyond ``k``), a sum of positive terms whose rounding is relative
    to the result itself:

    * on the subsample, ``p_i(x_j) = sqrt(s) lambda_i u_i(x_j)`` exactly (``u_i``
      the unit eigenvectors of ``K_S / s``) and ``k(x_j, x_j) = s sum_i lambda_i
      u_i(x_j)^2``, so that ``fixed(x_j) = s sum_i sigma lambda_i u_i(x_j)^2 /
      mu_i`` and the shares ``s lambda_i^2 u_i(x_j)^2 / mu_i`` come from the
      eigensystem alone, over every direction;
    * outside the subsample, ``fixed(x) = e(x) = k(x, x) - sum_{i <= q} p_i^2 /
      mu_i``, the Nystrom residual over the ``q`` directions that can be
      flattened.  It is a difference, but one that depends neither on ``k`` nor
      on the damping (computed once, clipped at zero, its exact value's bound),
      and it is small only where the subsample already covers ``x``; rows equal to
      a subsample row take the subsample's exact form instead.

    Attributes
    ----------
    eigenvalues : ndarray of shape (s,)
        ``mu``, the shifted eigenvalues of ``K_S / s``.
    subsample, outside : DiagonalShares
    diagonal_shift : float
        Added to every ``k(x, x)`` (the penalty's share of one sample's curvature).
    """

    eigenvalues: np.ndarray
    subsample: DiagonalShares
    outside: DiagonalShares
    diagonal_shift: float = 0.0

    def maximum(self, n_components, damping):
        """``max_x k_P(x, x)`` with ``n_components`` directions flattened at ``damping``, shifts included."""
        ratios = _flattening_ratios(self.eigenvalues, n_components, damping)
        return max(self.subsample.maximum(ratios), self.outside.maximum(ratios)) + self.diagonal_shift


def preconditioned_diagonal(kernel, subsample, eigensystem, outside_rows, spectral, column_block, n_outside=None):
    """The :class:`PreconditionedDiagonal` of ``subsample`` (behind ``eigensystem``) and ``outside_rows``.

    Parameters
    ----------
    kernel : Kernel
    subsample : Tensor of shape (s, d)
        The Nystrom subsample's rows.
    eigensystem : tuple
        ``(eigenvalues, eigenvectors)`` of the subsample, as :func:`nystrom_eigensystem`
        returns them (unshifted).
    outside_rows : Tensor of shape (r, d)
        Rows outside the subsample (none equal to a subsample row).
    spectral : SpectralSettings
    column_block : int
    n_outside : int or None, default=None
        ``q``, the directions the rows outside are projected on (None: all); no
        more than ``q`` can then be flattened.

    Returns
    -------
    PreconditionedDiagonal
    """
    eigenvalues, eigenvectors = eigensystem
    s, sigma = eigenvectors.shape[0], spectral.eigenvalue_shift
    shifted = eigenvalues + sigma
    positive = np.maximum(shifted, np.finfo(np.float64).tiny)
    # s lambda_i u_i(x_j)^2 = s^2 lambda_i psi_i(x_j)^2 (psi_i = u_i / sqrt(s)).
    weights = (eigenvectors.cpu().double().square() * float(s * s)).numpy() * eigenvalues[None, :]
    inside = DiagonalShares((weights * (sigma / positive)).sum(axis=1), weights * (eigenvalues / positive))
    q = (s if n_outside is None else n_outside) if outside_rows.shape[0] else 0
    if q:
        blocks = OperatorBlocks.whole(outside_rows.shape[0], column_block)
        # prepare_centers acts row by row: the subsample's prepared rows are those of the fit's.
        operator = EvaluatedOperator(kernel, outside_rows, kernel.prepare_centers(subsample), blocks)
        projections = operator.matmul(eigenvectors[:, :q].to(outside_rows.dtype)).double().cpu().numpy()
        shares = projections**2 / positive[None, :q]
        residual = kernel.diagonal(outside_rows).double().cpu().numpy() - shares.sum(axis=1)
        outside = DiagonalShares(np.maximum(residual, 0.0), shares)
    else:
        outside = DiagonalShares(np.zeros(0), np.zeros((0, 0)))
    return PreconditionedDiagonal(shifted, inside, outside, spectral.diagonal_shift)


def _rows_outside(rows, subsample):
    """``rows`` less those equal to a row of ``subsample`` (there the subsample's exact form holds)."""
    if rows.shape[0] == 0:
        return rows
    inside = {row.tobytes() for row in subsample.cpu().numpy()}
    keep = [index for index, row in enumerate(rows.cpu().numpy()) if row.tobytes() not in inside]
    if len(keep) == rows.shape[0]:
        return rows
    return rows[torch.as_tensor(keep, dtype=torch.long, device=rows.device)]


def choose_n_components(eigenvalues, beta_at, target_batch, damping, max_components):
    """Smallest ``k`` whose preconditioned critical batch ``beta_P(k) / lambda_1'(k)`` reaches ``target_batch``.

    Found by bisection (the critical batch grows with ``k``); returns
    ``max_components`` when even that does not reach the target.
    """

    def reaches(k):
        top = preconditioned_top_eigenvalue(eigenvalues, k, damping)
        return top <= 0 or beta_at(k) / top >= target_batch

    if reaches(0):
        return 0
    if not reaches(max_components):
        return max_components
    low, high = 0, max_components  # reaches(low) is False, reaches(high) is True
    while high - low > 1:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high


def eigenpro_step_size(batch_size, beta, top_eigenvalue):
    """EigenPro's analytic step size for batch ``m``.

    ``eta = m / beta`` up to the critical batch ``m* = beta / lambda_1'``, then
    ``0.99 * 2 m / (beta + (m - 1) lambda_1')``, which saturates near
    ``2 / lambda_1'``.  With ``m = 1`` one step interpolates the sampled point.
    """
    critical = beta / top_eigenvalue if top_eigenvalue > 0 else math.inf
    if batch_size <= critical:
        return batch_size / beta
    return 0.99 * 2.0 * batch_size / (beta + (batch_size - 1) * top_eigenvalue)


class EigenProPreconditioner:
    """The EigenPro correction on the coefficients of the Nystrom subsample.

    Parameters
    ----------
    eigenvalues : ndarray
        Descending eigenvalues of ``K_S / s`` (at least ``n_components + 1``).
    eigenvectors : Tensor of shape (s, >= n_components)
        ``psi_i`` as returned by :func:`nystrom_eigensystem`.
    n_components : int
        Number of flattened directions ``k``.
    damping : float
        Exponent ``a`` in (0, 1].
    dtype, device
        Where the correction is computed.
    """

    def __init__(self, eigenvalues, eigenvectors, n_components, damping, dtype, device):
        self.subsample_size = int(eigenvectors.shape[0])
        self.n_components = int(n_components)
        self.top_eigenvalue = preconditioned_top_eigenvalue(eigenvalues, n_components, damping)
        scales = flattening_scales(eigenvalues, self.n_components, damping)
        self.eigenvectors = eigenvectors[:, : self.n_components].to(device=device, dtype=dtype)
        self.scales = torch.as_tensor(scales, dtype=dtype, device=device)

    def correction(self, subsample_block, residual):
        """``Psi diag(D) Psi^T K(X_S, X_B) r`` for the block ``K(X_B, X_S)``.

        Parameters
        ----------
        subsample_block : Tensor of shape (m, s)
        residual : Tensor of shape (m, l)

        Returns
        -------
        Tensor of shape (s, l)
        """
        wide = widened(residual)
        projected = self.eigenvectors.T @ (subsample_block.T @ wide)
        return (self.eigenvectors @ (self.scales[:, None] * projected))[:, : residual.shape[1]]


def warn_if_reduced(requested, usable):
    """Warn when fewer components than requested can be flattened."""
    if requested > usable:
        warn_user(
            f"n_components={requested} reduced to {usable}: the remaining eigenvalues of the "
            "subsample kernel matrix are too small to resolve in the training dtype.",
            RuntimeWarning,
        )


# An explicit n_components whose critical batch m*(P) exceeds this many epochs of rows
# is flattened as asked, with a warning: an epoch then contracts the flattened
# directions by under a quarter e-fold (see plan_preconditioner).
_EPOCHS_TO_WARN = 4.0


def warn_if_beyond_epoch(n_components, critical_batch, rows_per_epoch):
    """Warn when an explicit ``n_components`` puts ``m*(P)`` far beyond the rows of an epoch."""
    if rows_per_epoch is None or critical_batch <= _EPOCHS_TO_WARN * rows_per_epoch:
        return
    warn_user(
        f"n_components={n_components} puts the preconditioned critical batch at {critical_batch:.0f}, "
        f"{critical_batch / rows_per_epoch:.0f} times the {rows_per_epoch} training rows: an epoch contracts "
        f"the flattened directions by about {rows_per_epoch / critical_batch:.2g} e-folds, so they converge "
        "slowly. n_components='auto' flattens no further than a critical batch of the training rows.",
        RuntimeWarning,
    )


# At the critical batch m*(P) the linear step m / beta_P puts the top preconditioned
# direction at the edge of stability (the batch operator's top eigenvalue is about
# beta_P + (m - 1) lambda_1' = 2 beta_P), and the Nystrom estimate of lambda_1' is
# optimistic for points outside the subsample.  Batches are kept this factor below
# m*(P): the top direction then contracts by at least a third per step.
CRITICAL_BATCH_MARGIN = 2.0

# Rows outside the subsample on which the preconditioned diagonal is evaluated, so
# that its maximum also covers points where the Nystrom estimate is not exact.
_BETA_PROBE_ROWS = 8192


@dataclass(frozen=True)
class SpectralSettings:
    """What the preconditioner is asked for: components, damping and a ridge shift.

    Parameters
    ----------
    n_components : int or "auto"
    damping : float
        Exponent ``a`` in (0, 1].
    eigenvalue_shift : float, default=0.0
        Added to every eigenvalue of ``K / n``: the penalty's share of the operator
        the iteration solves with (``alpha / n`` for a ridge penalty ``alpha``).
    diagonal_shift : float, default=0.0
        Added to every diagonal entry ``k(x, x)``: the penalty's share of one
        sample's curvature (``alpha`` for EigenPro 2, whose system is ``K + alpha I``).
    rows_per_epoch : int or None, default=None
        Training rows one epoch visits.  ``n_components="auto"`` flattens no further
        than the first ``k`` whose preconditioned critical batch reaches it (see
        ``plan_preconditioner``); None sets no such limit.
    """

    n_components: object = "auto"
    damping: float = 0.95
    eigenvalue_shift: float = 0.0
    diagonal_shift: float = 0.0
    rows_per_epoch: int | None = None


@dataclass
class PreconditionerPlan:
    """Everything the EigenPro setup decided from the spectrum."""

    preconditioner: EigenProPreconditioner
    eigenvalues: np.ndarray
    beta: float
    beta_preconditioned: float
    critical_batch: float
    critical_batch_preconditioned: float

    @property
    def top_eigenvalue_preconditioned(self):
        """``lambda_1'``, the top eigenvalue after flattening (``lambda_1`` with no component)."""
        return self.preconditioner.top_eigenvalue


def _default_components(candidates, subsample_size, rows_per_epoch):
    """The directions flattened beyond the batch's need: half the subsample's, or all of them when it is exact.

    With every training row in the subsample (``subsample_size == rows_per_epoch``)
    its eigensystem is that of the whole problem, and a direction left unflattened
    converges at its own eigenvalue's rate: on 300 points in 5 dimensions (float64,
    bandwidth 2) the interpolant was still 0.6 away (relative) after 200 epochs with
    the 150 directions of a given batch of 113, and 3e-10 away after 30 with all 299.
    """
    if rows_per_epoch is not None and subsample_size >= rows_per_epoch:
        return candidates
    return min(candidates, subsample_size // 2)


def plan_preconditioner(kernel, X, subsample_size, capacity, spectral, column_block, probe_rows=None):
    """Build the EigenPro preconditioner for ``X`` (device tensor, random row order).

    The first ``subsample_size`` rows are the Nystrom subsample.  The preconditioned
    ``beta`` is evaluated on the subsample and on ``probe_rows`` (default: up to
    8192 further rows of ``X``), which must include points outside the subsample:
    there the Nystrom estimate is not exact and the flattened diagonal is larger.
    With ``n_components="auto"`` the preconditioned critical batch must reach
    ``CRITICAL_BATCH_MARGIN`` times the device's batch ``capacity``, so that batches
    of the capacity run with the linear step ``m / beta_P`` and keep a margin for
    the error of the Nystrom estimate; beyond that, up to half the subsample's
    directions are flattened (every one when the subsample is every training row;
    at most 1000, and only resolvable ones; ``spectral``
    gives ``n_components``, the damping and the shifts of a ridge penalty, under which
    the eigenvalues and the diagonal are those of the penalised operator).  Each costs
    O(s l) per step, negligible next to the kernel block, and flattening more of
    the spectrum damps the SGD noise along the top directions: after three epochs
    on Fashion-MNIST, 20k points, test accuracy rose from 87.9% with the 63
    directions the batch needed to 88.4% with 940 (mean of two seeds, batch 256).

    Flattening stops, whatever the capacity asks, at the first ``k`` whose
    preconditioned critical batch ``m*(P)`` reaches ``spectral.rows_per_epoch``
    (``n``).  Below ``m*(P)`` the step is ``m / beta_P``, so a step contracts the
    flattened directions by ``m / m*(P)`` and an epoch of ``n / m`` steps by about
    ``n / m*(P)`` e-folds, whatever the batch: beyond ``m*(P) = n`` the top of the
    spectrum no longer converges within an epoch.  float32's resolution rarely
    allows that far; float64's does (2700 rows in 5 dimensions, 5 epochs: R^2 0.982
    at ``m*(P) = 2125``, 0.918 at 7648 and 0.06 at 400402 with 1000 directions).

    Returns
    -------
    PreconditionerPlan
    """
    n_components, damping = spectral.n_components, spectral.damping
    raw_eigenvalues, eigenvectors = nystrom_eigensystem(kernel, X[:subsample_size], X.dtype)  # the training dtype
    usable = min(max_usable_components(raw_eigenvalues, X.dtype), subsample_size - 1)
    eigenvalues = raw_eigenvalues + spectral.eigenvalue_shift
    if n_components == "auto":
        candidates = min(usable, _MAX_AUTO_COMPONENTS)
    else:
        warn_if_reduced(n_components, usable)
        candidates = min(n_components, usable)

    if probe_rows is None:
        beta = kernel_diagonal_max(kernel, X)
        outside = X[subsample_size : subsample_size + _BETA_PROBE_ROWS]
    else:
        beta = max(kernel_diagonal_max(kernel, X), kernel_diagonal_max(kernel, probe_rows))
        outside = probe_rows[:_BETA_PROBE_ROWS]
    beta += spectral.diagonal_shift
    subsample = X[:subsample_size]
    outside = _rows_outside(outside, subsample)
    eigensystem = (raw_eigenvalues, eigenvectors)
    diagonal = preconditioned_diagonal(kernel, subsample, eigensystem, outside, spectral, column_block, candidates)

    def beta_at(k):
        return min(diagonal.maximum(k, damping), beta) if k else beta

    if n_components == "auto":
        target = CRITICAL_BATCH_MARGIN * capacity
        needed = choose_n_components(eigenvalues, beta_at, target, damping, candidates)
        n_components = max(needed, _default_components(candidates, subsample_size, spectral.rows_per_epoch))
        if spectral.rows_per_epoch is not None:
            within_epoch = choose_n_components(eigenvalues, beta_at, spectral.rows_per_epoch, damping, candidates)
            n_components = min(n_components, within_epoch)
    else:
        n_components = candidates
    preconditioner = EigenProPreconditioner(eigenvalues, eigenvectors, n_components, damping, X.dtype, X.device)
    beta_preconditioned = beta_at(n_components)
    top = preconditioner.top_eigenvalue
    critical_batch_preconditioned = beta_preconditioned / top if top > 0 else math.inf
    if spectral.n_components != "auto":
        warn_if_beyond_epoch(n_components, critical_batch_preconditioned, spectral.rows_per_epoch)
    return PreconditionerPlan(
        preconditioner=preconditioner,
        eigenvalues=eigenvalues,
        beta=beta,
        beta_preconditioned=beta_preconditioned,
        critical_batch=beta / eigenvalues[0] if eigenvalues[0] > 0 else math.inf,
        critical_batch_preconditioned=critical_batch_preconditioned,
    )


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


def shifted_condition(eigenvalues, rows, max_components=SHIFTED_MAX_COMPONENTS):
    """Estimated condition number of ``C^T (K + alpha W^-1) C`` for the shifted Nystrom preconditioner.

    ``(n lambda + alpha) / alpha`` at the first direction it leaves unflattened
    (1 when it flattens every direction above ``alpha``).  The part of ``K`` the
    subsample misses is not counted, so this is a lower bound.

    Parameters
    ----------
    eigenvalues : ndarray
        Descending eigenvalues of ``K_S / s``.
    rows : PenalisedRows
    max_components : int, default=SHIFTED_MAX_COMPONENTS

    Returns
    -------
    float
    """
    count = _shifted_count(eigenvalues, rows, max_components)
    if count >= len(eigenvalues) or rows.n_rows * eigenvalues[count] <= rows.alpha:
        return 1.0
    return (rows.n_rows * float(eigenvalues[count]) + rows.alpha) / rows.alpha


def shifted_nystrom_preconditioner(eigensystem, subsample_products, rows, max_components=SHIFTED_MAX_COMPONENTS):
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
    max_components : int, default=SHIFTED_MAX_COMPONENTS
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
    columns = EvaluatedOperator(kernel, X64, kernel.prepare_centers(X64), OperatorBlocks.whole(X.shape[0], X.shape[0]))
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
    kept = (squares > rows.alpha) & (squares > squares[0] * _RELATIVE_RESOLUTION * torch.finfo(rows.dtype).eps)
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
