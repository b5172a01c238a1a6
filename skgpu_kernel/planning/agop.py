"""Planning feature learning: whether a fit learns a metric, and on how many rows its AGOP is estimated.

:func:`plan_feature_learning` resolves ``feature_learning="auto"`` from the number
of rows; :func:`plan_agop` is a pure function of the problem's sizes, the memory
budget and the device type; :func:`skgpu_kernel.agop.average_gradient_outer_product`
runs the plan it returns.  Nothing here allocates a tensor or reads a clock.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..device import column_block_size, rows_within_budget
from ..operator_facts import OperatorBlocks
from ._account import MemoryAccount
from .parameters import planned_for_auto
from .solver import auto_centers_target
from .stopping import exceeds_noise

__all__ = [
    "AGOP_MAX_ROWS",
    "AGOP_MIN_ROWS",
    "AUTO_LEARNING_MIN_ROWS",
    "CALIBRATION_FOLDS",
    "CALIBRATION_HELD_OUT_ROWS",
    "CALIBRATION_MIN_ROWS",
    "LEARNING_COST_SHARE",
    "LEARNING_PATH_MAX_ROWS",
    "MODEL_SIZE_MARGIN_SE",
    "PATH_BANDWIDTH",
    "PATH_CENTERS_MAX_SHARE",
    "PATH_SUBSAMPLE_SIZE",
    "SMALLER_MODEL_MAX_SHARE",
    "AGOPPlan",
    "agop_rows",
    "learnt_metric_entries",
    "lower_beyond_noise",
    "plan_agop",
    "plan_calibration",
    "plan_feature_learning",
    "plan_learning_rows",
    "plan_path_bandwidth",
    "plan_path_centers",
    "plan_path_subsample",
    "plan_smaller_model",
]

# feature_learning="auto" learns a diagonal metric from this many rows on
# (benchmarks/RESULTS.md, "The auto rule of feature learning").  Below: a tenth
# held out is under 200 rows, and the paired test that keeps a learnt model has the
# power to see only large gains; over 5 seeded splits of the 6 sets below (214 to
# 1475 rows) it never kept one, so learning cost 1.3-3x the time for nothing.
AUTO_LEARNING_MIN_ROWS = 2_000
# A classifier fitted without feature learning holds rows out for its probabilities'
# temperature from this many rows on (10 held-out rows at the default fraction); below,
# its temperature comes from decision values cross-fitted on CALIBRATION_FOLDS folds.
CALIBRATION_MIN_ROWS = 100
CALIBRATION_FOLDS = 5
# Above LEARNING_PATH_MAX_ROWS the final model leaves this many rows out, which calibrate
# it: a temperature is one number, which 2000 rows set to within a few percent.
CALIBRATION_HELD_OUT_ROWS = 2_000
# Up to this many rows the learning path's candidates are fitted on every training
# row: there the learnt metric was kept on Computers (-25% MSE), VietNamI (-20%) and
# LetterRecognition (-5% error).  Above, on all 4 sets measured (CPSSW8, 61k rows;
# Fashion-MNIST, 70k; Fertility and FertilityMorekids, 254k) the candidates on every
# row cost 2.1-6.6x the plain fit (Fashion-MNIST 30 s -> 200 s): there they are
# fitted on a seeded subsample (plan_learning_rows), and the one kept on every row.
LEARNING_PATH_MAX_ROWS = 30_000
# Beyond LEARNING_PATH_MAX_ROWS, the candidates' predicted cost as a share of the
# final fit's (plan_learning_rows).  Measured (benchmarks/RESULTS.md, "Issue 51,
# fourth part"): at 0.3 the candidates took 0.4-2.5 times the plain fit on the four
# sets above 30000 rows (Fertility's 9343 rows solved directly, a factorisation
# each, against a final CG on centers of 7.5 s).
LEARNING_COST_SHARE = 0.1

# The learning path's kernel takes the scale rule's bandwidth where the fit's is "auto",
# with no search of its own: every step divides the metric by its largest entry, so the
# metric, not the bandwidth, sets the path's scale (xRFM fixes its bandwidth likewise).
# Paired over the seeded splits of the 16 benchmark sets and 8 tables (benchmarks/
# RESULTS.md, "Issue 65"): 23 of 24 gave the same errors to the bit (the search had
# chosen the scale rule, or the plain model was kept), DNA moved within its noise,
# and the path's search (3 eigendecompositions of 1500 rows) is gone: ResumeNames'
# fit 8.9 -> 6.1 s, PSID7682's 12.7 -> 10.5 s.
PATH_BANDWIDTH = "scale"
# The Nystrom subsample of the preconditioner of each fit on the learning path, where
# the fit's is "auto" (2000 rows up to 100000): its eigendecomposition, rebuilt at every
# step because the metric changes the kernel, costs an eighth of 2000 rows' (float32 on
# the 2-core CPU: 0.05 s against 0.37 s, seven times on PSID7682's path, where the
# epochs of each fit took 0.2 s).  The path's early-stopped fits need few flattened
# directions (their cached batch is n / 32 rows); the kept candidate's final fit on
# every row takes the fit's own subsample again.
PATH_SUBSAMPLE_SIZE = 1000

# Where n_centers="auto" keeps every point, feature learning also tries the smaller
# model on auto_centers_target(n) centers (2000 up to 40000 rows) where that is at most
# this share of its training rows: both are scored on the held-out rows, and the larger
# is kept only where it is measurably more accurate (MODEL_SIZE_MARGIN_SE).  A model on
# more than half the rows would predict less than twice as fast.
SMALLER_MODEL_MAX_SHARE = 0.5
# The learning path's candidates are themselves the smaller model where it is at most this
# share of their training rows (8000 rows and more): there a candidate's fit and its AGOP
# cost a share of a model on every row.  At half the rows (Computers, 4506 training
# rows) the path on 2000 centers raised the held-out R^2 0.895 -> 0.907, short of the
# paired test that keeps a learnt metric, where the path on every row gains 25% of the
# squared error.
# Nor where the metric has more entries than the model has centers: on the VietNamI
# table (a block over its 194 communes: 18927 entries) the metric learnt on 2000
# centers left the test error 3.8% above the path on every point (paired, 5 splits),
# where the same rows one-hot encoded (a diagonal metric) gained 5.9%.
PATH_CENTERS_MAX_SHARE = 0.25
# The larger model is kept over the smaller one where its held-out losses are lower by
# more than this many standard errors of the paired differences: within their noise,
# the smaller one predicts as well, faster.
MODEL_SIZE_MARGIN_SE = 1.0

# At most this many rows estimate the AGOP: xRFM's default sample for it
# (``total_points_to_sample``), enough for the d x d matrix of tabular data.
AGOP_MAX_ROWS = 20_000

# Below this many rows the cost rule does not subsample: an estimate of a d x d matrix
# from fewer rows is noisy, and every solver makes several passes of K(X, Z) anyway.
AGOP_MIN_ROWS = 2_000

# Rows of a block evaluated at once: on the CPU few enough that a kernel block of a few
# hundred columns stays in the cache (device.column_block_size), on CUDA enough to keep
# the device busy.
_NOMINAL_ROW_BLOCK = {"cpu": 512, "cuda": 8192}

# The gradient weight kernels keep two blocks (GradientWeightKernel.extra_blocks = 1).
_BLOCKS_PER_KERNEL_ENTRY = 2


@dataclass(frozen=True)
class AGOPPlan:
    """Rows and blocks of an AGOP estimate (see :func:`plan_agop`).

    Attributes
    ----------
    n_rows : int
        Rows the AGOP is estimated on: all rows given, or a random subsample of
        this many.
    row_block : int
        Rows whose gradients are computed at once.
    column_block : int
        Centers of a kernel block evaluated at once.
    memory : MemoryAccount
        The subsample, the prepared centers, the coefficient columns, the
        accumulators and one row block's tensors.
    """

    n_rows: int
    row_block: int
    column_block: int
    memory: MemoryAccount

    @property
    def blocks(self):
        """The blocks of the gradient weight kernel's operator."""
        return OperatorBlocks(self.row_block, self.column_block)

    def describe(self):
        """One line for ``verbose``: rows, blocks and memory."""
        return (
            f"AGOP on {self.n_rows} rows in blocks of {self.row_block} rows x {self.column_block} centers, "
            f"{self.memory.describe()}"
        )


def agop_rows(n_rows, n_features, n_centers, n_outputs):
    """Rows the AGOP is estimated on: the cost of one pass of the fit's ``K(X, Z)`` product, within bounds.

    An AGOP row costs ``n_centers * (n_features + 2 + w) + n_outputs * n_features ** 2``
    multiply-adds (its kernel row, its product with the ``w = n_outputs *
    (n_features + 1)`` coefficient columns, its outer products); a row of the fit's
    ``K(X, Z) @ coef`` costs ``n_centers * (n_features + 2 + n_outputs)``.  The rows
    are as many as cost one such pass over the ``n_rows`` training rows, at least
    ``AGOP_MIN_ROWS`` and at most ``AGOP_MAX_ROWS``, and never more than
    ``n_rows``.

    Examples
    --------
    >>> agop_rows(1_000_000, 20, 5_000, 1), agop_rows(500, 20, 500, 1)
    (20000, 500)
    """
    columns = n_outputs * (n_features + 1)
    fit_row = n_centers * (n_features + 2 + n_outputs)
    agop_row = n_centers * (n_features + 2 + columns) + n_outputs * n_features**2
    affordable = math.floor(n_rows * fit_row / max(agop_row, 1))
    return min(n_rows, AGOP_MAX_ROWS, max(affordable, AGOP_MIN_ROWS))


def plan_agop(n_rows, n_features, n_centers, n_outputs, itemsize, budget, device_type="cpu"):
    """The plan of an AGOP estimate of a kernel predictor with ``n_centers`` centers.

    The rule:

    * rows: :func:`agop_rows`, the number of rows whose gradients cost one pass
      of the fit's ``K(X, Z) @ coef`` over its ``n_rows`` training rows, between
      ``AGOP_MIN_ROWS`` and ``AGOP_MAX_ROWS`` (xRFM's sample), and at
      most ``n_rows``;
    * blocks: the column block of a kernel block (``column_block_size``: near
      the cache's size on the CPU, as wide as half the budget allows on CUDA) for a
      nominal row block (512 rows on the CPU, 8192 on CUDA); then as many rows, up
      to the nominal block, as fit the budget next to the fixed items.

    Parameters
    ----------
    n_rows : int
        Training rows of the fit (the rows the AGOP could be estimated on).
    n_features : int
    n_centers : int
    n_outputs : int
    itemsize : int
        Bytes of one value in the dtype of the rows.
    budget : int
        Bytes the estimate may use on the device.
    device_type : {"cpu", "cuda"}, default="cpu"

    Returns
    -------
    AGOPPlan

    Examples
    --------
    >>> plan = plan_agop(100_000, 20, 10_000, 1, itemsize=4, budget=10**9)
    >>> plan.n_rows, plan.row_block, plan.column_block, plan.memory.fits()
    (20000, 512, 1024, True)
    """
    n_sample = agop_rows(n_rows, n_features, n_centers, n_outputs)
    d, columns = n_features, n_outputs * (n_features + 1)
    nominal = _NOMINAL_ROW_BLOCK[device_type]
    entry_bytes = itemsize * _BLOCKS_PER_KERNEL_ENTRY
    column_block = column_block_size(torch.device(device_type), nominal, n_centers, entry_bytes, budget // 2)
    fixed = (
        ("subsample", n_sample * (d * itemsize + 8) if n_sample < n_rows else 0),
        ("prepared centers", n_centers * (d + 2) * itemsize),
        ("coefficient columns", n_centers * columns * itemsize),
        ("accumulators", 2 * d * d * 8),
    )
    # A row's prepared copy and products in the rows' dtype, its kernel blocks, and its
    # products, shifted row and gradients (with their weighted copy) in float64.
    row_bytes = itemsize * (d + 2 + columns) + entry_bytes * column_block + 8 * (columns + d + 2 * n_outputs * d)
    fixed_bytes = sum(count for _, count in fixed)
    row_block = min(rows_within_budget(budget, fixed_bytes, row_bytes), nominal, max(n_sample, 1))
    memory = MemoryAccount(budget, (*fixed, ("row block", row_block * row_bytes)))
    return AGOPPlan(n_sample, row_block, column_block, memory)


def plan_feature_learning(requested, n_samples, learnable, in_memory=True, distributed=False):
    """The feature learning a fit runs: ``requested`` itself, or what ``"auto"`` resolves to.

    Parameters
    ----------
    requested : {"auto", "diagonal", "full"} or None
        The estimator's ``feature_learning``.
    n_samples : int
        Rows of the fit (after rows of zero weight are dropped).
    learnable : bool
        Whether the kernel declares its gradient (a kernel that does not cannot
        learn features; an explicit request then fails where it is checked).
    in_memory : bool, default=True
        Whether the rows are an array in memory.  Memory-mapped rows are the user's
        way of saying they need not fit: the held-out split and the path's
        transformed rows would copy them.
    distributed : bool, default=False
        Whether the fit runs over the ranks of a process group (data that one
        process is not meant to hold); ``"auto"`` then does not learn.

    Returns
    -------
    {"diagonal", "full"} or None
        ``"auto"``: ``"diagonal"`` for a learnable kernel on at least
        ``AUTO_LEARNING_MIN_ROWS`` rows in memory, in one process, else None.  No
        size is too large: above ``LEARNING_PATH_MAX_ROWS`` rows the candidates are
        fitted on a subsample (:func:`plan_learning_rows`).
    """
    if requested != "auto":
        return requested
    if learnable and in_memory and not distributed and n_samples >= AUTO_LEARNING_MIN_ROWS:
        return "diagonal"
    return None


def plan_calibration(classifier, learning, n_samples, in_memory=True, distributed=False):
    """Where a classifier's probability temperature comes from: decision values of rows a model did not train on.

    The model those rows calibrate has the final model's kernel and metric:

    - ``"held-out"``, up to ``LEARNING_PATH_MAX_ROWS`` rows: ``validation_fraction``
      of the rows held out from a fit of the final model's parameters on the others
      (feature learning's chosen candidate, which is that fit; without learning, one
      extra fit of the plain model).  The final model is the fit on every row.
    - ``"final-held-out"``, above: the final model itself is fitted without
      ``CALIBRATION_HELD_OUT_ROWS`` rows drawn first (stratified), which calibrate
      it and nothing else.  A second fit of that size would double the fit's cost;
      the rows left out are at most 1/15 of them (as HistGradientBoosting leaves
      out a validation set above 10000 rows).
    - ``"cross-fitted"``, under ``CALIBRATION_MIN_ROWS`` rows without feature
      learning: each row's decision value from a fit on the other folds
      (``CALIBRATION_FOLDS``, stratified where the classes allow), every fold with
      the final fit's kernel; a held-out tenth would be under 10 rows.
    - ``"none"``: data read from a file in buffers or over a process group, where
      no rows can be held out: ``T = 1``, and ``predict_proba`` warns.

    Parameters
    ----------
    classifier : bool
    learning : {"diagonal", "full"} or None
        The feature learning the fit runs (:func:`plan_feature_learning`).
    n_samples : int
    in_memory, distributed : bool
        As for :func:`plan_feature_learning`: a split would copy memory-mapped
        rows, and a process group's data is not one process's to hold out.

    Returns
    -------
    {"held-out", "final-held-out", "cross-fitted", "none"} or None
        None for a regressor.
    """
    if not classifier:
        return None
    if not in_memory or distributed:
        return "none"
    if n_samples > LEARNING_PATH_MAX_ROWS:
        return "final-held-out"
    if n_samples < CALIBRATION_MIN_ROWS and learning is None:
        return "cross-fitted"
    return "held-out"


def plan_learning_rows(n_samples, n_centers, n_iter):
    """The rows feature learning fits and scores its candidates on (the rest only in the final fit).

    Every row up to ``LEARNING_PATH_MAX_ROWS`` (30000).  Beyond, a seeded subsample whose
    candidates' predicted cost is ``LEARNING_COST_SHARE`` (0.1) of the final fit's:
    a kernel fit's products grow as its rows times its centers, ``n p`` for the
    final fit (``p = n`` with a center at every row) and ``m^2`` for each of the
    ``n_iter + 2`` candidates on ``m`` rows (the plain model, the path's kernel with
    ``M = I``, each learnt metric), so ``m = sqrt(share n p / (n_iter + 2))``,
    within ``[AUTO_LEARNING_MIN_ROWS, LEARNING_PATH_MAX_ROWS]``.

    Parameters
    ----------
    n_samples : int
        Rows of the fit.
    n_centers : int or None
        The final fit's centers (None: every row).
    n_iter : int
        ``feature_learning_iter``.

    Returns
    -------
    int

    Examples
    --------
    >>> plan_learning_rows(20_000, None, 5), plan_learning_rows(60_000, None, 5)
    (20000, 7171)
    >>> plan_learning_rows(254_654, 10_000, 5)
    6031
    """
    if n_samples <= LEARNING_PATH_MAX_ROWS:
        return n_samples
    centers = n_samples if n_centers is None else min(n_centers, n_samples)
    rows = math.sqrt(LEARNING_COST_SHARE * n_samples * centers / (n_iter + 2))
    return int(min(max(rows, AUTO_LEARNING_MIN_ROWS), LEARNING_PATH_MAX_ROWS))


def plan_path_bandwidth(bandwidth):
    """The bandwidth of the learning path's kernel: ``PATH_BANDWIDTH`` for ``"auto"``, else the user's.

    A bandwidth the user chose (a number or ``"scale"``) is kept: only the
    search of ``"auto"`` is left out (its scale is the normalised metric's).

    Parameters
    ----------
    bandwidth : float or str
        The estimator's ``bandwidth``.

    Returns
    -------
    float or str

    Examples
    --------
    >>> plan_path_bandwidth("auto"), plan_path_bandwidth("scale"), plan_path_bandwidth(2.0)
    ('scale', 'scale', 2.0)
    """
    return planned_for_auto(bandwidth, PATH_BANDWIDTH)


def plan_path_subsample(subsample_size):
    """The preconditioner subsample of the learning path's fits: ``PATH_SUBSAMPLE_SIZE`` for ``"auto"``, else yours.

    Parameters
    ----------
    subsample_size : int or str
        The estimator's ``subsample_size``.

    Returns
    -------
    int

    Examples
    --------
    >>> plan_path_subsample("auto"), plan_path_subsample(3000)
    (1000, 3000)
    """
    return planned_for_auto(subsample_size, PATH_SUBSAMPLE_SIZE)


def plan_smaller_model(every_point, n_training, max_share=SMALLER_MODEL_MAX_SHARE):
    """The centers of the smaller model feature learning tries on ``n_training`` rows; None: no smaller model.

    Where ``n_centers="auto"`` keeps every point (``every_point``: no size the user
    set), :func:`~skgpu_kernel.planning.solver.auto_centers_target` of the rows, where
    that is at most ``max_share`` of them (``SMALLER_MODEL_MAX_SHARE``; the learning
    path's own candidates: ``PATH_CENTERS_MAX_SHARE``, :func:`plan_path_centers`).

    Parameters
    ----------
    every_point : bool
        ``n_centers="auto"``, no ``centers`` given, and every training point a
        center (:func:`~skgpu_kernel.planning.solver.plan_auto_centers`).
    n_training : int
        Rows the candidates are fitted on.
    max_share : float, default=SMALLER_MODEL_MAX_SHARE

    Returns
    -------
    int or None

    Examples
    --------
    >>> plan_smaller_model(True, 3999), plan_smaller_model(True, 4000), plan_smaller_model(False, 4000)
    (None, 2000, None)
    """
    if not every_point:
        return None
    count = auto_centers_target(n_training)
    return count if count <= max_share * n_training else None


def learnt_metric_entries(n_features, block_sizes, mode):
    """The entries of the metric the learning path learns: one per feature, and those among a category's levels.

    ``"diagonal"``: one per feature, plus the off-diagonal entries of each
    block (a categorical column's levels, :func:`~skgpu_kernel.agop.block_diagonal`);
    ``"full"``: ``d (d + 1) / 2``, every entry.

    Examples
    --------
    >>> learnt_metric_entries(205, (2, 194), "diagonal"), learnt_metric_entries(11, (), "full")
    (18927, 66)
    """
    if mode == "full":
        return n_features * (n_features + 1) // 2
    return n_features + sum(size * (size - 1) // 2 for size in block_sizes)


def plan_path_centers(every_point, n_training, metric_entries):
    """The centers of the learning path's candidates (the smaller model); None: every point.

    :func:`plan_smaller_model` at ``PATH_CENTERS_MAX_SHARE``, where the model's
    centers are at least the ``metric_entries`` the path learns
    (:func:`learnt_metric_entries`): a category of many levels keeps a block of the
    metric among them, which the AGOP of a model on fewer centers than its entries
    set worse than a model on every point.

    Examples
    --------
    >>> plan_path_centers(True, 7999, 10), plan_path_centers(True, 8000, 10), plan_path_centers(True, 27_000, 10)
    (None, 2000, 2000)
    >>> plan_path_centers(True, 27_000, 2000), plan_path_centers(True, 27_000, 2001)
    (2000, None)
    """
    count = plan_smaller_model(every_point, n_training, PATH_CENTERS_MAX_SHARE)
    return count if count is not None and metric_entries <= count else None


def lower_beyond_noise(losses, baseline, margin_se):
    """Whether the per-row ``losses`` are lower than ``baseline``'s (the same rows) by more than their noise.

    Paired by row: the mean of ``baseline - losses`` must be positive and exceed
    ``margin_se`` standard errors of the differences
    (:func:`~skgpu_kernel.planning.stopping.exceeds_noise`; never with fewer than 2 rows).

    Examples
    --------
    >>> lower_beyond_noise(np.array([0.0, 1.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0]), 1.0)
    True
    >>> lower_beyond_noise(np.array([0.0, 1.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0]), 2.0)
    False
    """
    difference = np.asarray(baseline, dtype=np.float64) - np.asarray(losses, dtype=np.float64)
    if difference.shape[0] < 2:
        return False
    standard_error = difference.std(ddof=1) / np.sqrt(difference.shape[0])
    return bool(exceeds_noise(difference.mean(), standard_error, margin_se))
