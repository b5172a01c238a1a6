"""The ridge penalty of ``alpha="auto"`` and the bandwidth of ``bandwidth="auto"``: leave-one-out errors.

A kernel model regularised only by early stopping follows the path of gradient
descent, which on noisy targets can stay several percent above the best ridge
solution at every epoch (on the HI data set of the real-data benchmark the best
epoch was 4.8% above ``Nystroem(2000) + RidgeCV``; with that model's ``alpha``
EigenPro 2 converged to 0.05% of it).  ``alpha="auto"`` therefore chooses the
penalty as scikit-learn's ``RidgeCV`` does, by the exact leave-one-out error of a
linear smoother, on the Nystrom features the preconditioner's subsample defines:

    ``phi(x) = K(x, X_S) U_k Lambda_k^{-1/2}``   (``K_SS = U Lambda U^T``, the k
    eigenvalues above ``1e-10`` of the largest),

for which ``||beta||^2`` is the RKHS norm of ``f = phi^T beta``, so that the ridge
problem ``sum_i w_i (f(x_i) - y_i)^2 + alpha ||f||^2`` has the same ``alpha`` as
:class:`sklearn.kernel_ridge.KernelRidge` and as the estimators' ``alpha``.  The
leave-one-out residuals come from one eigendecomposition of the k x k Gram of the
(weighted, centred) features, for every candidate at once (the intercept's leverage
``w_i / sum(w)`` included, as ``RidgeCV(fit_intercept=True)``).  When every row
scored is in the subsample, the model is kernel ridge on those rows, and one
eigendecomposition of the centred kernel matrix replaces the two.

Everything here is float64 whatever the training dtype.  Features cut at float32's
resolution (a few hundred of 2000 on the benchmark's tabular sets) leave signal
that the model cannot fit, which the criterion then takes for noise: on Computers
that chose a penalty 5x too large (test error 1.040 of a tuned KernelRidge's against
0.999 with every resolvable feature in float64).

Rows are scored in blocks of ``ROW_BLOCK`` in two passes (the Gram, then the
residuals), so memory is ``O(s^2 + ROW_BLOCK s)`` whatever the number of rows; the
cost is about three ``rows x s x s`` products, well under one epoch of EigenPro 2
unless the features are few.  Candidates are per-sample penalties ``alpha /
sum(w)``, a quarter of a decade apart (half a decade apart cost Computers 1%).

A classifier's criterion (its codes' intercept given) is the weighted leave-one-out
misclassification rate of the class codes' scores: the squared error of the codes
also penalises confident correct scores, and on LetterRecognition it chose a
penalty with test error 0.026 where the misclassifications chose one with 0.024.
Rates within a standard error of the lowest, which it cannot tell apart, go to
the smaller squared error (:func:`best_classifier`).

:func:`select_bandwidth` scores a grid of bandwidths by the same criterion, for
every penalty at once per bandwidth, on a subsample small enough that each of its
rows is a feature (the criterion is then the exact leave-one-out error of the
kernel machine on those rows; see ``planning.kernel.BANDWIDTH_SEARCH_ROWS`` for why not a Nystrom
model of more rows).
"""

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import clone

from .operators import kernel_matrix, kernel_matrix_product, symmetrised_product
from .preconditioner import nystrom_eigensystem
from .solvers.solution import Solution

__all__ = [
    "BANDWIDTH_FACTORS",
    "PENALTY_GRID",
    "AlphaSelection",
    "BandwidthSelection",
    "best_classifier",
    "select_alpha",
    "select_bandwidth",
]

# Candidate per-sample penalties alpha / sum(w): from nearly interpolating to
# nearly the constant model, a quarter of a decade apart.
PENALTY_GRID = np.logspace(-9, 0, 37)
# bandwidth="auto": the candidates, as multiples of the scale rule, half an octave apart.
# Below the rule because that is where it misses (halving it cut the test error by
# 10% on a 5000-row and by half on a 46000-row multiclass set; doubling it cost 12%).
BANDWIDTH_FACTORS = 2.0 ** np.arange(-3.0, 1.5, 0.5)
# Rows of the float64 feature block (ROW_BLOCK x s) scored at once.
ROW_BLOCK = 4096
# Nystrom eigenvalues kept, relative to the largest: float64 resolves these, and the
# criterion's choice no longer changed below 1e-7 on the benchmark's data sets.
_RELATIVE_EIGENVALUE_FLOOR = 1e-10
# Directions of the centred features kept, relative to the largest: float64's
# eigendecomposition resolves eigenvalues to about n eps of the largest.
_RESOLVABLE = 1e-12

# The Nystrom features of the scored rows are kept between the criterion's two passes
# up to this many bytes (float64), instead of being evaluated twice.
_KEPT_FEATURE_BYTES = 2**30


@dataclass(frozen=True)
class AlphaSelection:
    """The chosen penalty and the criterion behind it; its ``alpha`` (a property) is the penalty on the rows scored.

    Attributes
    ----------
    penalty : float
        The chosen per-sample penalty ``alpha / sum(w)``.
    penalties, loo_errors : ndarray
        The candidates and their weighted mean leave-one-out squared errors.
    n_rows : int
        Rows scored.
    weight_sum : float
        Their weights' sum, ``sum(w)`` (``n_rows`` unweighted).
    n_features : int
        Nystrom features used.
    coverage : float
        The share of the kernel's trace that the features capture on rows outside the
        subsample, ``sum_i w_i ||phi(x_i)||^2 / sum_i w_i k(x_i, x_i)`` (1 for an exact
        model): below ``min_coverage`` nothing was scored.
    loo_misclassification : ndarray or None
        The classifier's leave-one-out misclassification rate of each candidate.
    solution : Solution or None
        Kernel ridge with an unpenalised intercept on the rows scored, at the chosen
        penalty (an exact criterion only): ``f(x) = k(x, X_scored) coef +
        intercept`` minimises ``sum_i w_i (y_i - f(x_i))^2 + alpha coef^T K coef``,
        the package's one model, every row a center; ``coef`` is float64, in the
        order of the rows scored, ``intercept`` of the targets as scored (the
        caller's intercept already subtracted).
    carried : bool
        The exact criterion's ``alpha`` on ``n_rows`` rows, carried over as it is to a
        fit of more rows (``carried_to``); ``coverage`` is then that of the
        Nystrom features of every row, which was too low for their criterion.
    nystrom_eigenvalues : ndarray or None
        The eigenvalues of ``K_S / s`` on the criterion's Nystrom subsample (its
        first ``s`` rows scored), descending, float64, as
        ``preconditioner.nystrom_eigenvalues`` gives them: a fit
        of this kernel on these rows' features reads them instead of decomposing a
        subsample of its own (CG's condition estimate).  None where the criterion
        had no subsample (every row a feature) or did not reach its features.
    """

    penalty: float
    penalties: np.ndarray
    loo_errors: np.ndarray | None
    n_rows: int
    weight_sum: float
    n_features: int
    coverage: float = 1.0
    loo_misclassification: np.ndarray | None = None
    solution: Solution | None = None
    carried: bool = False
    nystrom_eigenvalues: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def alpha(self):
        """The chosen ``alpha`` for the rows scored, ``penalty * sum(w)`` (0 where nothing was scored).

        Derived, not stored: the fit's own ``alpha`` lives in its plan
        (:class:`~skgpu_kernel.planning.kernel_policy.FitPlan`), which may apply the
        penalty to another weight total (a tuning handed to a subset of its rows).
        """
        return self.penalty * self.weight_sum

    @property
    def scored(self):
        """Whether the criterion was evaluated (``alpha`` is 0 and ``loo_errors`` None when it was not)."""
        return self.loo_errors is not None

    @property
    def criterion(self):
        """The chosen candidate's ``(misclassification, squared error)``, or ``(squared error,)`` for a regressor."""
        best = int(np.flatnonzero(self.penalties == self.penalty)[0])
        if self.loo_misclassification is None:
            return (float(self.loo_errors[best]),)
        return float(self.loo_misclassification[best]), float(self.loo_errors[best])

    def gated(self, min_coverage):
        """This selection, or an unscored one (``alpha`` 0) when the features capture less than ``min_coverage``."""
        if self.coverage >= min_coverage:
            return self
        return AlphaSelection(0.0, self.penalties, None, self.n_rows, self.weight_sum, self.n_features, self.coverage)

    def carried_to(self, coverage):
        """This exact criterion's ``alpha``, as it is, for a fit of more rows than it scored.

        ``coverage`` is the one the Nystrom features of those rows reached; the
        solution (a model of the rows scored only) is dropped.
        """
        return dataclasses.replace(self, coverage=coverage, solution=None, carried=True)

    def without_solution(self):
        """This selection without its solution (what a fitted estimator keeps of it)."""
        return dataclasses.replace(self, solution=None)

    def penalty_alone(self):
        """This selection without the facts of the kernel on the rows scored: its solution and spectrum.

        What a fit of other features (or of a kernel with another bandwidth) keeps of it.
        """
        return dataclasses.replace(self, solution=None, nystrom_eigenvalues=None)


@dataclass(frozen=True)
class BandwidthSelection:
    """The bandwidth ``bandwidth="auto"`` chose, and the criterion behind it.

    Attributes
    ----------
    bandwidth : float
        The chosen bandwidth.
    scale : float
        The scale rule's bandwidth (``bandwidth="scale"``), which the grid multiplies.
    bandwidths : ndarray
        The grid, ``scale * BANDWIDTH_FACTORS``.
    errors : ndarray
        The leave-one-out criterion at each bandwidth's best penalty: the weighted
        misclassification rate for a classifier, the weighted mean squared error for a
        regressor; NaN where the search did not score it.
    selection : AlphaSelection
        The penalties scored at the chosen bandwidth, on the rows searched.
    seconds : float
        Time the search took.
    """

    bandwidth: float
    scale: float
    bandwidths: np.ndarray
    errors: np.ndarray
    selection: AlphaSelection
    seconds: float = 0.0

    def without_solution(self):
        """This search without its selection's solution (what a fitted estimator keeps of it).

        The solution's tensors stay on the fit's device: kept, they would hold device
        memory after the fit and stop a CUDA model from loading where there is no GPU.
        """
        return dataclasses.replace(self, selection=self.selection.without_solution())

    def describe(self):
        """One line for ``verbose``: the scored grid and the choice."""
        scored = [f"{b:.3g}: {e:.4g}" for b, e in zip(self.bandwidths, self.errors, strict=True) if np.isfinite(e)]
        return (
            f"bandwidth {self.bandwidth:.4g} ({self.bandwidth / self.scale:.3g} x the scale rule {self.scale:.4g}), "
            f"alpha {self.selection.alpha:.3g}; leave-one-out error by bandwidth {{{', '.join(scored)}}} "
            f"on {self.selection.n_rows} rows, {self.seconds:.2f} s"
        )


def select_alpha(
    kernel, X, Y, weights, subsample_size, min_coverage=0.0, *, code_intercept=None, penalties=PENALTY_GRID
):
    """Choose the ridge penalty by the leave-one-out error of a Nystrom ridge model.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
        Rows in random order, on the compute device (features as the kernel sees
        them), every one scored; the first ``subsample_size`` are the Nystrom
        subsample.
    Y : Tensor of shape (n, l)
        Targets in the same order.
    weights : Tensor of shape (n,) or None
    subsample_size : int
    min_coverage : float, default=0.0
        Score only if the features capture at least this share of the kernel's trace
        (measured first, on one block of rows outside the subsample): a model that
        misses more of it is not the model being fitted, and the criterion would
        take the signal it misses for noise.
    code_intercept : Tensor of shape (l,) or None, default=None
        A classifier's: ``Y`` are its class codes (one column of ``+-1`` codes, or
        one column per class) less this intercept.  Given, the penalty of
        :func:`best_classifier` (the fewest weighted leave-one-out
        misclassifications, up to a standard error, then the smallest squared error
        of the codes), a row's class being the one its codes name; None: the
        smallest squared error.
    penalties : array-like, default=PENALTY_GRID
        The candidate per-sample penalties ``alpha / sum(w)``.

    Returns
    -------
    AlphaSelection
    """
    rows = X.shape[0]
    penalties = np.asarray(penalties, dtype=np.float64)
    w = torch.ones(rows, dtype=torch.float64, device=X.device) if weights is None else weights.double()
    total = float(w.sum())
    eigenvalues = None
    if subsample_size >= rows:
        basis, coverage = _CentredBasis.of_kernel(kernel, X, Y, w), 1.0
    else:
        # Measured before the features, whose eigendecomposition a failed gate does not need.
        coverage = _nystrom_coverage(kernel, X, subsample_size, w)
        if coverage < min_coverage:
            return AlphaSelection(0.0, penalties, None, rows, total, 0, coverage)
        features = _NystromFeatures(kernel, X, subsample_size)
        basis, eigenvalues = _CentredBasis.of_features(features, Y, w), features.eigenvalues
    errors, misclassified = _loo_errors(basis, Y, w, penalties * total, code_intercept)
    if misclassified is None:
        best = int(np.argmin(errors))
    else:
        best = best_classifier(misclassified / total, errors, _effective_rows(w))
    penalty = float(penalties[best])
    return AlphaSelection(
        penalty,
        penalties,
        errors / total,
        rows,
        total,
        basis.n_features,
        coverage,
        None if misclassified is None else misclassified / total,
        solution=basis.solution(penalty * total),
        nystrom_eigenvalues=eigenvalues,
    )


def best_classifier(misclassification, squared_errors, n_effective):
    """The candidate a classifier's criterion picks: the smallest squared error of those that classify as well.

    Candidates whose leave-one-out misclassification rate is within one standard
    error of the lowest, ``sqrt(p (1 - p) / n_effective)``, cannot be told apart
    by it, and among them the squared error of the codes, a criterion of much lower
    variance, decides.  The lowest rate alone chose a penalty of 1e-4 on
    FertilityMorekids (203723 rows, error 0.366 either way) where the squared error
    chose 31.6; the CG solve then took 13 iterations instead of 6.

    Parameters
    ----------
    misclassification, squared_errors : ndarray
        Per candidate (NaN: not scored).
    n_effective : float
        ``(sum w)^2 / sum w^2``: the rows the rates are means over.

    Returns
    -------
    int
    """
    lowest = np.nanmin(misclassification)
    band = lowest + math.sqrt(lowest * (1.0 - lowest) / n_effective)
    tied = np.flatnonzero(misclassification <= band)
    return int(tied[np.argmin(squared_errors[tied])])


def select_bandwidth(
    kernel, X, Y, weights, subsample_size, *, code_intercept=None, penalties=PENALTY_GRID, widest=None
):
    """Choose the bandwidth of a radial kernel with its penalty, by the criterion of :func:`select_alpha`.

    The candidates are ``kernel.bandwidth * BANDWIDTH_FACTORS``; each scored one
    costs a :func:`select_alpha` (every penalty at once).  Rather than scoring the
    whole grid, the search starts at the scale rule and its octaves either side,
    walks an octave at a time while the error falls, and then scores the
    half-octave neighbour of the best octave on the side of its better octave
    neighbour: three to five of the nine candidates where the error has one minimum.

    Parameters
    ----------
    kernel : RadialKernel
        With the scale rule's bandwidth.
    X, Y, weights, subsample_size, code_intercept, penalties
        As for :func:`select_alpha` (scored without a coverage gate).
    widest : float or None, default=None
        The largest factor of the scale rule scored (None: the whole grid).

    Returns
    -------
    BandwidthSelection
    """
    tic = time.perf_counter()
    scale = float(kernel.bandwidth)
    factors = BANDWIDTH_FACTORS if widest is None else BANDWIDTH_FACTORS[BANDWIDTH_FACTORS <= widest]
    bandwidths = scale * factors
    scored = {}

    def score(index):
        if index not in scored:
            candidate = clone(kernel).set_params(bandwidth=float(bandwidths[index]))
            scored[index] = select_alpha(
                candidate, X, Y, weights, subsample_size, code_intercept=code_intercept, penalties=penalties
            )
        return scored[index].criterion

    best = _walk_octaves(score, int(np.argmin(np.abs(np.log(factors)))), len(bandwidths))
    score(_half_octave_towards_the_better_octave(score, best, len(bandwidths)))
    errors = np.full(len(bandwidths), np.nan)
    squared = np.full(len(bandwidths), np.nan)
    for index, selection in scored.items():
        errors[index] = selection.criterion[0]
        squared[index] = selection.criterion[-1]
    if code_intercept is None:
        best = int(np.nanargmin(errors))
    else:
        n_effective = X.shape[0] if weights is None else _effective_rows(weights)
        best = best_classifier(errors, np.where(np.isnan(squared), np.inf, squared), n_effective)
    return BandwidthSelection(
        float(bandwidths[best]), scale, bandwidths, errors, scored[best], time.perf_counter() - tic
    )


def _effective_rows(weights):
    """``(sum w)^2 / sum w^2``: the rows a weighted mean is worth."""
    return float(weights.sum() ** 2 / (weights * weights).sum())


def _half_octave_towards_the_better_octave(score, best, size):
    """The half-octave neighbour of the octave point ``best`` on the side of its better octave neighbour.

    Both octave neighbours of an interior ``best`` were scored by the walk.  Where
    the error is a smooth bowl in the log bandwidth around ``best``, its minimum lies
    towards the neighbour that scores lower, so the half-octave point on the other
    side scores worse than ``best`` itself and is not worth its eigendecomposition.
    At an end of the grid the one neighbour inside it is taken; an octave
    neighbour beyond the grid counts as worse, as in :func:`_walk_octaves`.
    """
    inside = [side for side in (-1, 1) if 0 <= best + side < size]
    if len(inside) == 1:
        return best + inside[0]
    octave = _worst_beyond_the_grid(score, size)
    return best - 1 if octave(best - 2) <= octave(best + 2) else best + 1


def _worst_beyond_the_grid(score, size):
    """``score`` on the grid's indices ``0 .. size - 1``, and worse than every score beyond them (none computed)."""
    return lambda index: score(index) if 0 <= index < size else (math.inf,)


def _walk_octaves(score, start, size):
    """The index of the best octave point (steps of 2 from ``start``), walking downhill from ``start``."""
    score = _worst_beyond_the_grid(score, size)
    best = min((start - 2, start, start + 2), key=score)
    step = best - start
    while step and score(best + step) < score(best):
        best += step
    return best


class _NystromFeatures:
    """``phi(x) = K(x, X_S) U_k Lambda_k^{-1/2}`` in float64, evaluated a block of rows at a time."""

    def __init__(self, kernel, X, subsample_size):
        eigenvalues, eigenvectors = nystrom_eigensystem(kernel, X[:subsample_size])
        k = max(int(np.sum(eigenvalues > _RELATIVE_EIGENVALUE_FLOOR * eigenvalues[0])), 1)
        # eigenvectors are U / sqrt(s) and eigenvalues those of K_SS / s: U Lambda^{-1/2} is their ratio.
        scale = torch.as_tensor(eigenvalues[:k], dtype=torch.float64, device=X.device).clamp_min(1e-300).rsqrt()
        self.kernel, self.X = kernel, X
        self.centers = X[:subsample_size].double()
        self.projection = eigenvectors[:, :k] * scale
        self.n_features = k
        self.eigenvalues = eigenvalues

    def feature_blocks(self):
        """``(start, stop, phi(X[start:stop]))`` over the rows."""
        for start in range(0, self.X.shape[0], ROW_BLOCK):
            stop = min(start + ROW_BLOCK, self.X.shape[0])
            yield start, stop, self.of(self.X[start:stop].double())

    def of(self, rows):
        """``phi(rows)`` for float64 rows."""
        return kernel_matrix_product(self.kernel, rows, self.centers, self.projection)


def _nystrom_coverage(kernel, X, subsample_size, w):
    """Weighted share of ``k(x, x)`` that the Nystrom features capture on one block past the subsample.

    ``||phi(x)||^2 = k_S(x)^T K_SS^+ k_S(x)``, evaluated with a Cholesky factor of
    ``K_SS`` plus ``_RELATIVE_EIGENVALUE_FLOOR`` of a bound on its largest
    eigenvalue, the level below which the features drop eigendirections; a tenth
    of the cost of their eigendecomposition.
    """
    centers = X[:subsample_size].double()
    rows = X[subsample_size : subsample_size + ROW_BLOCK].double()
    gram = kernel_matrix(kernel, centers)
    kernel.require_finite(gram, X.dtype)
    jitter = _RELATIVE_EIGENVALUE_FLOOR * float(gram.abs().sum(dim=1).max())  # >= lambda_1 (Gershgorin)
    factor, failed = torch.linalg.cholesky_ex(
        (gram + gram.T) / 2.0 + jitter * torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    )
    if failed:  # not numerically positive definite even so: the features' own count
        features = _NystromFeatures(kernel, X, subsample_size)
        captured = features.of(rows).pow(2).sum(dim=1)
    else:
        captured = (
            torch.linalg.solve_triangular(factor, kernel_matrix(kernel, centers, rows), upper=False).pow(2).sum(dim=0)
        )
    weights = w[subsample_size : subsample_size + rows.shape[0]]
    return float((weights * captured).sum() / (weights * kernel.diagonal(rows)).sum())


@dataclass(frozen=True)
class _CentredBasis:
    """The weighted, centred features ``W^{1/2} (Phi - 1 m^T) = Q S V^T`` as the residuals need them.

    ``m`` is the features' weighted mean (the unpenalised intercept); ``Q``, whose
    rows :attr:`basis_blocks` yields, is an orthonormal basis of their span.  With
    every row a feature (:meth:`of_kernel`), ``basis`` holds ``Q`` whole and the
    basis also solves kernel ridge at a penalty (:meth:`solution`).
    """

    squares: torch.Tensor  # S^2, the directions kept
    coordinates: torch.Tensor  # Q^T W^{1/2} (Y - target_mean)
    target_mean: torch.Tensor
    basis_blocks: Callable[[], Iterator[tuple[int, int, torch.Tensor]]]
    basis: torch.Tensor | None = None  # Q, every row a feature; None for Nystrom features
    targets: torch.Tensor | None = None  # W^{1/2} C y
    sqrt_w: torch.Tensor | None = None
    row_means: torch.Tensor | None = None  # the kernel's weighted row means

    @property
    def n_features(self):
        return self.squares.shape[0]

    @classmethod
    def of_features(cls, features, Y, w):
        """From the eigendecomposition of the features' k x k weighted, centred Gram."""
        total = w.sum()
        gram = torch.zeros(features.n_features, features.n_features, dtype=torch.float64, device=w.device)
        cross = torch.zeros(features.n_features, Y.shape[1], dtype=torch.float64, device=w.device)
        feature_sum = torch.zeros(features.n_features, dtype=torch.float64, device=w.device)
        # The second pass (the residuals) reads the same blocks: kept where they are small
        # enough, they are not evaluated again (VietNamI, 22212 rows x 2000 features: 355 MB).
        keep = features.X.shape[0] * features.n_features * 8 <= _KEPT_FEATURE_BYTES
        kept = []
        for start, stop, phi in features.feature_blocks():
            if keep:
                kept.append((start, stop, phi))
            weighted = w[start:stop, None] * phi
            gram += weighted.T @ phi
            cross += weighted.T @ Y[start:stop].double()
            feature_sum += weighted.sum(dim=0)
        feature_mean = feature_sum / total
        target_mean = (w[:, None] * Y.double()).sum(dim=0) / total
        gram -= total * torch.outer(feature_mean, feature_mean)
        cross -= total * torch.outer(feature_mean, target_mean)
        squares, vectors = _leading(*torch.linalg.eigh(gram), _RESOLVABLE)
        to_basis = vectors * squares.rsqrt()  # Q = W^{1/2} (Phi - 1 m^T) V S^-1

        def basis_blocks():
            for start, stop, phi in kept or features.feature_blocks():
                yield start, stop, (w[start:stop, None].sqrt() * (phi - feature_mean)) @ to_basis

        return cls(squares, to_basis.T @ cross, target_mean, basis_blocks)

    @classmethod
    def of_kernel(cls, kernel, X, Y, w):
        """Every row a feature: one eigendecomposition of the weighted, centred ``K(X, X)``.

        ``Phi Phi^T = K``, so ``Q`` and ``S^2`` are the eigenvectors and eigenvalues of
        ``W^{1/2} (I - 1 w^T / sum(w)) K (I - w 1^T / sum(w)) W^{1/2}``: half the work of
        the Nystrom features' two eigendecompositions, which the bandwidth search
        pays at every candidate.  Only directions below float64's resolution are
        dropped (no Nystrom floor): the errors are those of kernel ridge on these rows
        (to 7e-7 of a brute-force refit at the smallest penalty, 1e-11 at 1e-4).
        """
        X = X.double()
        gram = kernel_matrix(kernel, X)
        kernel.require_finite(gram, X.dtype)
        total = w.sum()
        row_means = symmetrised_product(gram, w / (2.0 * total))
        centred = gram - row_means[:, None] - row_means[None, :] + (w @ row_means) / total
        sqrt_w = w.sqrt()
        centred = sqrt_w[:, None] * centred * sqrt_w[None, :]
        squares, basis = _leading(*torch.linalg.eigh((centred + centred.T) / 2.0), _RESOLVABLE)
        target_mean = (w[:, None] * Y.double()).sum(dim=0) / total
        coordinates = basis.T @ (sqrt_w[:, None] * (Y.double() - target_mean))

        def basis_blocks():
            for start in range(0, basis.shape[0], ROW_BLOCK):
                yield start, min(start + ROW_BLOCK, basis.shape[0]), basis[start : start + ROW_BLOCK]

        targets = sqrt_w[:, None] * (Y.double() - target_mean)
        return cls(squares, coordinates, target_mean, basis_blocks, basis, targets, sqrt_w, row_means)

    def solution(self, alpha):
        """Every row a feature: kernel ridge's :class:`Solution` at penalty ``alpha > 0``; None for Nystrom features.

        With ``C = I - 1 w^T / sum(w)`` and ``A = W^{1/2} C K C^T W^{1/2} = Q S^2 Q^T``,
        the normal equations ``(P K + alpha I) a = P y`` (``P = W - w w^T / sum(w)``,
        the intercept eliminated) are solved by ``a = C^T W^{1/2} u`` with ``u = (A +
        alpha I)^{-1} W^{1/2} C y``: ``Q (S^2 + alpha)^{-1} Q^T`` on the directions kept,
        ``1 / alpha`` on those below float64's resolution.  The intercept is ``b = ybar
        - m^T a`` with ``m = K w / sum(w)``, the kernel's weighted row means (``1^T W
        K a / sum(w)``, since ``W^{1/2} 1`` is in ``A``'s null space).
        """
        if self.basis is None:
            return None
        basis, coordinates = self.basis, self.coordinates
        unresolved = self.targets - basis @ coordinates
        u = basis @ (coordinates / (self.squares + alpha)[:, None]) + unresolved / alpha
        scaled = self.sqrt_w[:, None] * u
        w = self.sqrt_w**2
        coef = scaled - w[:, None] * (scaled.sum(dim=0) / w.sum())
        return Solution.direct(coef, self.target_mean - self.row_means @ coef)


def _leading(values, vectors, relative_floor):
    """The eigenpairs of ``torch.linalg.eigh`` whose value exceeds ``relative_floor`` of the largest."""
    keep = values > values.max() * relative_floor
    return values[keep], vectors[:, keep]


def _loo_errors(basis, Y, w, alphas, code_intercept=None):
    """Weighted sums of squared leave-one-out residuals and of misclassifications, for each alpha.

    With the centred, weighted features ``Q S V^T`` (a :class:`_CentredBasis`), the
    hat matrix is ``Q diag(s^2 / (s^2 + alpha)) Q^T`` plus the intercept's ``w_i /
    sum(w)``; residual ``i`` left out is the fitted residual over ``1 - h_ii``, and
    the prediction left out the target minus it.  A row's class is the one its codes
    (``Y`` plus ``code_intercept``) name, as a prediction's is; the misclassifications
    are None without ``code_intercept`` (a regressor).
    """
    squares = basis.squares
    alphas = torch.as_tensor(alphas, dtype=torch.float64, device=squares.device)
    shrink = squares[:, None] / (squares[:, None] + alphas[None, :])  # (k, candidates)
    shrunk = (basis.coordinates[:, None, :] * shrink[:, :, None]).flatten(1)  # (k, candidates * l)
    total, errors = w.sum(), torch.zeros(len(alphas), dtype=torch.float64, device=squares.device)
    misclassified = None if code_intercept is None else torch.zeros_like(errors)
    for start, stop, rows in basis.basis_blocks():
        sqrt_w = w[start:stop, None].sqrt()
        targets = sqrt_w * (Y[start:stop].double() - basis.target_mean)
        fitted = (rows @ shrunk).unflatten(1, (len(alphas), -1))
        leverage = rows**2 @ shrink + (w[start:stop] / total)[:, None]
        residuals = (targets[:, None, :] - fitted) / (1.0 - leverage).clamp_min(1e-12)[:, :, None]
        errors += (residuals**2).sum(dim=(0, 2))
        if code_intercept is not None:
            codes = Y[start:stop].double() + code_intercept
            left_out = codes[:, None, :] - residuals / sqrt_w[:, :, None]  # (rows, candidates, l)
            wrong = _predicted_class(left_out) != _predicted_class(codes)[:, None]
            misclassified += (w[start:stop, None] * wrong).sum(dim=0)
    errors = errors.cpu().numpy()
    errors = np.where(np.isfinite(errors), errors, math.inf)
    return errors, None if misclassified is None else misclassified.cpu().numpy()


def _predicted_class(scores):
    """The class a score vector predicts: its sign for one column of +-1 codes, else its largest entry."""
    if scores.shape[-1] == 1:
        return (scores[..., 0] > 0).long()
    return scores.argmax(dim=-1)
