"""Kernel machines that learn their features: a metric from the average gradient outer product.

The method of Recursive Feature Machines (Radhakrishnan et al., Science 2024) and
xRFM (Beaglehole et al., 2025), around the package's one kernel fit
(:func:`~skgpu_kernel.solvers.kernel_fit.fit_kernel_model`):

1. hold out ``validation_fraction`` of the rows (stratified for classifiers), drawn
   from a copy of the fit's random state, so the final fit draws what a fit without
   feature learning draws;
2. iteration ``t = 0, 1, ...``: fit the kernel machine on the training rows seen
   through the metric ``M_t`` (``M_0 = I``: iteration 0 is the model without feature
   learning), each fit a full one through the existing solvers (bandwidth and
   ``alpha`` chosen again by their rules, EigenPro 2 with its cache, CG, EigenPro 3
   on centers); score it on the held-out rows; then estimate the average gradient
   outer product of its predictor on a planned subsample of the training rows
   (:func:`~skgpu_kernel.agop.average_gradient_outer_product`, through the kernel
   operator of the kernel's gradient weight) and set ``M_{t+1} = G^(1/2)`` divided
   by its largest entry (:func:`~skgpu_kernel.agop.metric_from_agop`), full or
   diagonal;
3. stop after ``n_iter`` updates, or after :data:`FEATURE_LEARNING_PATIENCE`
   iterations without a better held-out score; keep the iteration with the best
   score (iteration 0 unless a learnt metric beats it strictly), and fit it again on
   every row.

The metric needs no kernel of its own: with ``M = L L^T`` (``L`` from
:func:`~skgpu_kernel.agop.metric_transform`), the kernel of ``||x - z||_M`` is the
plain kernel on the rows ``X L``, so every solver, cache and planner runs unchanged
on the transformed rows.  Where iteration 0 wins, the final fit is exactly the fit
without feature learning: learning costs time, not accuracy.
"""

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..agop import average_gradient_outer_product, metric_from_agop, metric_transform
from ..kernels import make_kernel
from ..planning.agop import plan_agop
from ..splits import holdout_split
from .kernel_fit import fit_kernel_model

__all__ = [
    "AGOP_POWER",
    "FEATURE_LEARNING_MODES",
    "FEATURE_LEARNING_PATIENCE",
    "FeatureLearningResult",
    "fit_with_feature_learning",
    "transformed_rows",
]

FEATURE_LEARNING_MODES = ("diagonal", "full")
# M = AGOP^(1/2), xRFM's power (RFM's original paper used the AGOP itself).
AGOP_POWER = 0.5
# Iterations without a better held-out score after which the loop stops.
FEATURE_LEARNING_PATIENCE = 2
# Whether the iterations after the first keep the bandwidth and alpha the rules chose
# for it (xRFM keeps one bandwidth and one penalty for every iteration) instead of
# choosing them again for each metric.
KEEP_FIRST_TUNING = False


@dataclass(frozen=True)
class FeatureLearningResult:
    """The final fit and what feature learning chose.

    Attributes
    ----------
    fit : KernelFitResult
        The model on every row, in the learnt features ``X L``.
    transform : ndarray of shape (d,) or (d, d), or None
        ``L`` (a diagonal as a vector); None without learning.
    metric : ndarray of shape (d, d) or None
        ``M = L L^T`` of the chosen iteration (the identity for iteration 0).
    scores : list of float
        The held-out score of each iteration (R^2 or accuracy).
    iteration : int
        The iteration chosen (0: no learnt metric beat the plain kernel).
    """

    fit: object
    transform: np.ndarray | None = None
    metric: np.ndarray | None = None
    scores: tuple = ()
    iteration: int = 0


def transformed_rows(X, transform):
    """The rows ``X L`` in ``X``'s dtype (``transform`` a vector: a diagonal ``L``; None: ``X``)."""
    if transform is None:
        return X
    scaled = X * transform if transform.ndim == 1 else X @ transform
    return np.asarray(scaled, dtype=X.dtype)


def fit_with_feature_learning(data, runtime, parameters):
    """The kernel fit, with the metric learnt from its AGOP where ``parameters.feature_learning`` asks.

    A warm start (``data.continuation``) continues in the features the fit it
    continues was fitted in (``continuation.transform``) and learns nothing new: the
    coefficients belong to those features.

    Parameters
    ----------
    data : KernelFitInput
    runtime : KernelRuntime
    parameters : KernelFitParameters

    Returns
    -------
    FeatureLearningResult
    """
    if data.continuation is not None:
        transform = data.continuation.transform
        return FeatureLearningResult(fit_kernel_model(_transformed_input(data, transform), runtime, parameters))
    mode, n_iter = parameters.feature_learning, parameters.feature_learning_iter
    if mode is None:
        return FeatureLearningResult(fit_kernel_model(data, runtime, parameters))
    _check_learnable(data, parameters)
    if data.X.shape[0] < 2:
        raise ValueError(
            "feature_learning chooses the metric on held-out rows and needs at least 2 samples; got "
            f"n_samples={data.X.shape[0]}. Set feature_learning=None to fit one sample."
        )
    train, held_out = holdout_split(
        data.X.shape[0], parameters.validation_fraction, copy.deepcopy(runtime.rng), data.stratify
    )
    training = _rows(data, train)
    X_val, Y_val = np.asarray(data.X[held_out]), data.Y[held_out]
    transforms, scores, tuned = [None], [], parameters
    for iteration in range(n_iter + 1):
        transform = transforms[iteration]
        fit = fit_kernel_model(_transformed_input(training, transform), _fresh(runtime), tuned)
        if KEEP_FIRST_TUNING and iteration == 0 and fit.bandwidth is not None:
            tuned = dataclasses.replace(parameters, bandwidth=fit.bandwidth, alpha=fit.alpha)
        scores.append(_held_out_score(fit, transformed_rows(X_val, transform), Y_val, parameters, runtime))
        best = int(np.argmax(scores))  # the first of equal scores: a learnt metric must beat iteration 0
        _log(runtime, parameters, f"feature learning iteration {iteration}: held-out score {scores[-1]:.6g}")
        if iteration == n_iter or iteration - best >= FEATURE_LEARNING_PATIENCE:
            break
        agop = torch.as_tensor(_input_space_agop(fit, training, transform, mode, runtime))
        if not bool(agop.any()):
            _log(runtime, parameters, "the predictor is constant on the rows: its AGOP ranks no feature")
            break
        metric = metric_from_agop(agop, mode == "diagonal", AGOP_POWER)
        transforms.append(np.asarray(metric_transform(torch.as_tensor(metric))))
    chosen = transforms[best]
    _log(runtime, parameters, f"feature learning keeps iteration {best} of {len(scores) - 1}; refit on every row")
    # The chosen metric is fitted as it was scored; iteration 0 as the plain fit is.
    final = fit_kernel_model(_transformed_input(data, chosen), runtime, tuned if best > 0 else parameters)
    return FeatureLearningResult(final, chosen, _metric(chosen, data.X.shape[1]), tuple(scores), best)


def _check_learnable(data, parameters):
    """Fail before any fit when the kernel declares no gradient (it cannot learn features)."""
    kernel, _ = make_kernel(parameters.kernel, parameters.bandwidth, parameters.kernel_params, data.X[:256])
    kernel.gradient_kernel()


def _rows(data, indices):
    """``data`` restricted to the rows ``indices`` (a fresh fit: no warm start)."""
    stratify = None if data.stratify is None else data.stratify[indices]
    return dataclasses.replace(
        data,
        X=np.asarray(data.X[indices]),
        Y=data.Y[indices],
        weights=data.weights[indices],
        stratify=stratify,
        continuation=None,
    )


def _transformed_input(data, transform):
    """``data`` seen through ``L``: the rows and the user's centers transformed."""
    if transform is None:
        return data
    centers = None if data.centers is None else transformed_rows(data.centers, transform)
    return dataclasses.replace(data, X=transformed_rows(np.asarray(data.X), transform), centers=centers)


def _fresh(runtime):
    """``runtime`` with copies of its random state and generator: an iteration's fit leaves them untouched."""
    generator = torch.Generator().manual_seed(0)
    generator.set_state(runtime.generator.get_state())
    return dataclasses.replace(runtime, rng=copy.deepcopy(runtime.rng), generator=generator)


def _held_out_score(fit, X_val, Y_val, parameters, runtime):
    """The estimator's validation score (R^2 or accuracy) of ``fit`` on the held-out rows."""
    predictions = fit.device_cache.predict(fit.kernel, X_val, runtime.budget) + fit.intercept
    return float(parameters.validation_score(torch.as_tensor(predictions), torch.as_tensor(Y_val)))


def _input_space_agop(fit, training, transform, mode, runtime):
    """The AGOP of ``fit``'s predictor in the input coordinates: ``L G L^T`` of its AGOP ``G`` in ``X L``.

    For a diagonal mode only the diagonal is computed (``L`` is then diagonal too,
    and ``diag(L G L) = L^2 diag(G)``).
    """
    device, dtype = runtime.devices[0], runtime.dtype
    X = transformed_rows(np.asarray(training.X), transform)
    rows = torch.as_tensor(X, dtype=dtype, device=device)
    centers = torch.as_tensor(fit.centers, dtype=dtype, device=device)
    coef = fit.loop.coef.to(device, dtype)
    n_rows, n_features = X.shape
    itemsize = torch.finfo(dtype).bits // 8
    plan = plan_agop(n_rows, n_features, centers.shape[0], coef.shape[1], itemsize, runtime.budget, device.type)
    weights = torch.as_tensor(training.weights, dtype=torch.float64, device=device)
    diagonal = mode == "diagonal"
    agop = average_gradient_outer_product(
        fit.kernel, rows, centers, coef, weights, diagonal=diagonal, plan=plan, random_state=_seed(runtime)
    )
    agop = agop.cpu().numpy()
    if transform is None:
        return agop
    if diagonal:
        return transform**2 * agop
    return transform @ agop @ transform.T


def _seed(runtime):
    """A seed for the AGOP's subsample from a copy of the fit's random state (left untouched)."""
    return int(copy.deepcopy(runtime.rng).randint(np.iinfo(np.int32).max))


def _metric(transform, n_features=None):
    """``M = L L^T`` as a (d, d) matrix (the identity for no transform)."""
    if transform is None:
        return np.eye(n_features)
    return np.diag(transform**2) if transform.ndim == 1 else transform @ transform.T


def _log(runtime, parameters, message):
    if runtime.log is not None:
        runtime.log(f"[{parameters.name}] {message}")
