"""The prepare stage: rows to the device once, the split, the intercept, the shuffle, the centers, the warm start."""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .._warnings import warn_user
from ..blockwise import taken_on_device
from ..kernels import make_kernel
from ..out_of_memory import out_of_memory_reason, release_cached_memory
from ..row_sources import is_out_of_core
from ..splits import holdout_split
from .request import KernelFitInput


def split_rows(data, early_stopping, validation_fraction, rng):
    """``(train, held_out)``: the indices of the training rows and of the held-out rows; None, None without a split."""
    if not early_stopping:
        return None, None
    return holdout_split(data.X.shape[0], validation_fraction, rng, data.stratify)


def with_rows_on_device(data, runtime):
    """``data`` with its rows' one copy on the compute device (``X_device``), where the fit can hold one.

    Every stage of the fit (the criteria's rows, the split, the shuffle, the
    centers, the held-out scoring, feature learning's metrics) takes its rows
    from this copy instead of copying them from the host again.  The copy keeps
    the rows' dtype, so what a stage converts from it is what it converted from
    the host, to the bit.  On the CPU a C-contiguous array is shared, not copied.
    None is made for rows read in buffers, for a fit over a process group (its
    ranks copy their own shares), or for rows over half of the memory budget;
    where the device has no room for the copy, each stage copies its own rows,
    as without one.  See :func:`runtime_holding_rows` for the budget.
    """
    if runtime.group is not None or is_out_of_core(data.X) or not isinstance(data.X, np.ndarray):
        return data
    if data.X.nbytes > runtime.budget // 2:
        return data
    try:
        on_device = _copy_rows_to(data.X, runtime.devices[0])
    except RuntimeError as error:  # out of device memory: every stage copies its own rows
        out_of_memory_reason(error)
        release_cached_memory(runtime.devices[0])
        return data
    return dataclasses.replace(data, X_device=on_device)


def _copy_rows_to(X, device):
    """``X`` on ``device`` in its own dtype (on the CPU, a C-contiguous array's own memory)."""
    return torch.as_tensor(np.ascontiguousarray(X)).to(device)


def runtime_holding_rows(runtime, data):
    """``runtime`` with the device copy of ``data``'s rows taken off the budget the planners divide.

    A copy on the CPU shares the host's memory, or stands for the copies each
    stage made: the budget is the same as without it.
    """
    if data.X_device is None or data.X_device.device.type == "cpu":
        return runtime
    held = data.X_device.nbytes
    return dataclasses.replace(runtime, budget=runtime.budget - held, held_bytes=runtime.held_bytes + held)


def rows_of(data, indices):
    """``data`` restricted to the rows ``indices``, its device copy too (a fresh fit: no warm start)."""
    stratify = None if data.stratify is None else data.stratify[indices]
    return dataclasses.replace(
        data,
        X=np.asarray(data.X[indices]),
        Y=data.Y[indices],
        weights=data.weights[indices],
        stratify=stratify,
        continuation=None,
        X_device=taken_on_device(data.X_device, indices),
    )


def target_intercept(fit_intercept, Y, weights):
    return np.average(Y, axis=0, weights=weights) if fit_intercept else np.zeros(Y.shape[1])


def kernel_offset(kernel, X):
    """The feature means subtracted before a translation-invariant kernel (rounding of distances), or None."""
    return X.mean(axis=0, dtype=np.float64) if kernel.translation_invariant else None


@dataclass(frozen=True)
class Centers:
    """The centers of a fit on centers: float64 host rows, the training rows they are, their shares.

    ``indices`` (into the training rows; None for the user's centers) let the
    solvers take them from the rows' device copy; ``shares`` (see
    :func:`_distinct_rows`) is None for the user's centers and for a uniform draw.
    """

    rows: np.ndarray
    indices: np.ndarray | None = None
    shares: np.ndarray | None = None

    @classmethod
    def of(cls, data, X, order, every_point=False):
        """The user's centers, distinct shuffled training rows, or every one (``every_point``: Falkon's CG); None."""
        if every_point and not data.uses_centers:
            return cls(X[order].astype(np.float64), order)
        if not data.uses_centers:
            return None
        if data.centers is not None:
            return cls(data.centers)
        n, n_centers = X.shape[0], data.n_centers
        if n_centers > n:
            warn_user(f"n_centers={n_centers} is larger than the {n} training samples; using {n} centers.")
            n_centers = n
        indices, shares = _distinct_rows(X, order, n_centers)
        return cls(np.asarray(X[indices], dtype=np.float64), indices, shares)


def _distinct_rows(X, order, count):
    """``(indices, shares)``: the first ``count`` distinct rows of ``X[order]`` (fewer if ``X`` has fewer).

    A repeated center adds nothing to the model's span but makes ``K(Z, Z)``
    singular, which slows CG and EigenPro 3's projection: on Fertility (254654 rows,
    7 categorical or integer features) a uniform draw of 10000 rows holds only a few
    hundred distinct ones.  Continuous data draw ``count`` distinct rows at once.
    ``shares`` is the share of the rows examined that each center's value stands
    for (CG's preconditioner weighs the centers by it), or None when no examined
    row repeats (``1 / p`` each, a uniform draw).
    """
    taken = counts = np.empty(0, dtype=np.int64)
    drawn = 0
    while taken.size < count and drawn < order.size:
        drawn = min(order.size, max(2 * drawn, count + count // 8 + 1))
        rows = np.ascontiguousarray(X[order[:drawn]])
        keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        by_position = np.argsort(first)  # first occurrences, in shuffled order
        taken, counts = first[by_position], counts[by_position]
    indices = order[taken[:count]]
    if taken.size == drawn:
        return indices, None
    # Beyond p distinct values, the rows of the values left out are shared in proportion.
    return indices, counts[:count] / counts[:count].sum()


def continued_center_coef(continuation, centers):
    """Previous coefficients when warm starting on the same centers, or None for a fresh fit."""
    if continuation is None:
        return None
    previous = continuation.centers
    if previous.shape != centers.shape or not np.array_equal(centers.astype(previous.dtype, copy=False), previous):
        raise ValueError(
            "warm_start=True continues from the previous coefficients, which belong to the previous "
            "centers: fit must be called with the same centers (same X, n_centers and random_state, or "
            "the same centers array). Set warm_start=False to fit new centers."
        )
    return torch.as_tensor(continuation.dual_coef)


def continued_coef(continuation, X, order):
    """Previous coefficients rearranged to ``order`` (every training row a center), or None for a fresh fit."""
    if continuation is None:
        return None
    previous = continuation.training_order
    if previous.shape[0] != X.shape[0] or not np.array_equal(
        X[previous].astype(continuation.centers.dtype, copy=False), continuation.centers
    ):
        raise ValueError(
            "warm_start=True continues from the previous centers, which are the previous "
            "training points: fit must be called with the same X (and the same "
            "early-stopping split). Set warm_start=False to fit new data."
        )
    position_in_previous = np.empty_like(previous)
    position_in_previous[previous] = np.arange(previous.shape[0])
    return torch.as_tensor(continuation.dual_coef[position_in_previous[order]])


def _with_intercept(validation_score, intercept):
    """The validation score of predictions made without the intercept (the loops fit centred targets)."""

    def score(predictions, targets):
        shift = torch.as_tensor(intercept, dtype=predictions.dtype, device=predictions.device)
        return validation_score(predictions + shift, targets)

    return score


def fits_joint_intercept(fit_intercept, alpha, validation):
    """Whether the intercept is fitted with the kernel part: penalised (``alpha > 0``), no held-out split.

    The package's one model is ``f(x) = sum_j a_j k(z_j, x) + b`` minimising
    ``sum_i w_i (y_i - f(x_i))^2 + alpha a^T K(Z, Z) a`` with ``b`` unpenalised,
    whatever the solver.  Every solver solves for the coefficients of given
    targets, so the fit solves for the centred targets and a column of ones
    together and the finish stage combines them
    (:func:`~skgpu_kernel.fit.finish.with_joint_intercept`).  Without a penalty
    (an interpolating or early-stopped fit, where ``b`` is not determined), and
    where held-out rows score every epoch, ``b`` is the weighted mean of the
    targets.  The joint intercept was measured to matter: the leave-one-out
    criterion scores ridge with an unpenalised intercept (centred features, as
    ``RidgeCV(fit_intercept=True)``); the weighted mean of the targets is that
    intercept only where the kernel part averages to zero over the rows, which a
    narrow kernel's does not: on Ionosphere (280 rows) the mean intercept gave test
    error 0.28 where ridge on the same kernel's features with its own intercept gave
    0.056.
    """
    return fit_intercept and validation is None and alpha > 0


@dataclass(frozen=True)
class PreparedFit:
    """The prepare stage's output: the host rows and settings every solver's run reads.

    Every attempt reads it as prepared: what an attempt changes (its penalty, the
    parameters a fallback plans with, its starting coefficients) is the attempt's
    own plan (:class:`~skgpu_kernel.fit.attempts.Attempt`).

    Attributes
    ----------
    X : ndarray or memory map of shape (n, d)
        Training rows (unshuffled; ``order`` is the shuffle).
    Y : ndarray of shape (n, l)
        Centred targets (with the joint intercept's column of ones last).
    weights : ndarray of shape (n,)
    order : ndarray of shape (n,)
        The seeded permutation of the rows.
    validation : KernelFitInput or None
        The held-out rows (early stopping).
    centers : ndarray of shape (p, d) or None
        The centers of EigenPro 3 and CG (float64); None puts a center at every
        training row (EigenPro 2).
    coef_init : Tensor or None
        Warm-start coefficients in the order of the centers.
    centers_from_data : bool
        The centers are the first ``p`` shuffled training rows.
    center_shares : ndarray of shape (p,) or None
        The share of the training rows each center's value stands for, when
        centers were drawn from repeated rows (CG's preconditioner reads it).
    X_device : Tensor of shape (n, d) or None
        ``X`` on the device, in its dtype (the fit's one copy of its rows, taken
        there): every stage takes its rows from it; None: from ``X``.
    center_rows : ndarray of shape (p,) or None
        The training rows the centers are (None: the user's centers).
    joint_intercept : bool
        ``Y``'s last column is the column of ones of the joint intercept, not a
        target of the model (the last check leaves it out).
    train : ndarray or None
        Which of the fit's rows the training rows are (None: every one).
    intercept : ndarray
        The weighted mean subtracted from the targets (the finish stage adds the
        joint intercept's shift to it).
    plan : FitPlan
        The fit's plan as the attempts start from it: its kernel the one fitted
        with (the scale rule's on the training rows where the held-out split
        changed them; its bandwidth ``kernels.bandwidth_of(kernel)``), its
        parameters the estimator's, its problem's ``streamed`` whether ``X`` is a
        memory-mapped file read in buffers.
    offset : ndarray or None
        Feature means subtracted before a translation-invariant kernel.
    validation_score : callable
        ``validation_score(predictions, targets)`` of predictions of the centred
        targets, the intercept added back.
    nystrom_eigenvalues : ndarray or None
        The tune stage's spectrum of ``kernel`` (``K_S / s`` on ``s`` of the rows it
        scored, of which these rows are all or a subset:
        :attr:`~skgpu_kernel.regularization.AlphaSelection.nystrom_eigenvalues`),
        for a solver that reads a spectrum alone; None where the tune stage had none
        of this kernel.
    """

    X: object
    Y: np.ndarray
    weights: np.ndarray
    order: np.ndarray
    validation: KernelFitInput | None
    centers: np.ndarray | None
    coef_init: torch.Tensor | None
    centers_from_data: bool
    center_shares: np.ndarray | None
    X_device: torch.Tensor | None
    center_rows: np.ndarray | None
    joint_intercept: bool
    train: np.ndarray | None
    intercept: np.ndarray
    plan: object
    offset: np.ndarray | None
    validation_score: Callable
    nystrom_eigenvalues: np.ndarray | None = dataclasses.field(default=None, repr=False)

    def of_data(self, indices):
        """``indices`` into the training rows as indices into the fit's rows."""
        return indices if self.train is None else self.train[indices]


def prepare(runtime, plan):
    """The prepare stage: split, centre, shuffle, draw the centers, the warm start, the joint intercept's column.

    Random draws in a fixed order: the validation split, then the shuffle.
    """
    parameters, data, kernel = plan.parameters, plan.data, plan.kernel
    train, held_out = split_rows(data, plan.early_stopping, parameters.validation_fraction, runtime.rng)
    training = data if train is None else rows_of(data, train)
    validation = None if held_out is None else rows_of(data, held_out)
    X, Y, weights = training.X, training.Y, training.weights
    intercept = target_intercept(parameters.fit_intercept, Y, weights)
    if validation is not None and plan.by_rule:  # the bandwidth rule reads the rows the model is fitted on
        kernel, _ = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, X)
    fitted_with = plan if kernel is plan.kernel else dataclasses.replace(plan, kernel=kernel)
    order = runtime.rng.permutation(X.shape[0])
    centers = Centers.of(data, X, order, every_point=plan.cg_on_every_row_as_centers)
    if centers is not None:
        coef_init = continued_center_coef(data.continuation, centers.rows)
    else:
        coef_init = continued_coef(data.continuation, X, order)
    joint = fits_joint_intercept(parameters.fit_intercept, plan.alpha, validation)
    targets = np.hstack([Y - intercept, np.ones((Y.shape[0], 1))]) if joint else Y - intercept
    if joint and coef_init is not None:  # the ones column starts from zero
        coef_init = torch.cat([coef_init, torch.zeros_like(coef_init[:, :1])], dim=1)
    return PreparedFit(
        X=X,
        Y=targets,
        weights=weights,
        order=order,
        validation=validation,
        centers=None if centers is None else centers.rows,
        coef_init=coef_init,
        centers_from_data=data.centers is None,
        center_shares=None if centers is None else centers.shares,
        X_device=training.X_device,
        center_rows=None if centers is None else centers.indices,
        joint_intercept=joint,
        train=train,
        intercept=intercept,
        plan=fitted_with,
        offset=kernel_offset(kernel, X),
        validation_score=_with_intercept(parameters.validation_score, intercept),
        nystrom_eigenvalues=_tuned_spectrum(plan, kernel),
    )


def _tuned_spectrum(plan, kernel):
    """The tune stage's Nystrom eigenvalues where ``kernel`` is the one it scored, else None."""
    selection = plan.alpha_selection
    if selection is None or kernel is not plan.kernel:  # the rule's bandwidth on the training rows
        return None
    return selection.nystrom_eigenvalues
