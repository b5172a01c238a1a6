"""The estimator's parameters as a kernel fit reads them: one object for the planners, the policy and the stages.

The shells build it (:meth:`_fit_parameters`) from their own parameters, with the
kernel unresolved (``kernel``, ``bandwidth``, ``kernel_params`` as given) and the
scaling rule resolved; every planner reads the fields it needs from it (the layout
planners ``batch_size``, ``subsample_size``, ``cache_kernel``, ``projection`` and
``cache_dtype``; the policy ``solver``, ``alpha``, ``early_stopping``,
``classifier`` and ``distributed``).  The defaults are the estimators'.
"""

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KernelFitParameters", "planned_for_auto"]


@dataclass(frozen=True)
class KernelFitParameters:
    """The estimator's parameters, as the fit reads them (kernel unresolved, scaling rule resolved).

    ``classifier`` says which kind of estimator asks; ``validation_score`` is its
    score of held-out predictions; ``name`` names it in messages.  ``cache_dtype``
    is the estimators' ``kernel_cache_dtype``: the storage of EigenPro 2's ``K(X,
    X)`` cache.  ``"auto"`` lets a float32 fit store it in float16 (for kernels
    with values in [-1, 1]) when float32 does not fit.  The alternative is to
    evaluate every epoch's kernel, 20 times slower on Fashion-MNIST.  Measured on
    the real-data benchmark against a float32 cache (benchmarks/RESULTS.md): the
    regressors' test errors agree within 0.06%, the classifiers' within their
    spread over seeds (LetterRecognition, seeds 0-3: 0.0278-0.0338 in float16,
    0.0285-0.0328 in float32, the early-stopping epoch differing), and the fits were
    10-25% faster.  float32 is kept where it fits.
    """

    kernel: object = "gaussian"
    bandwidth: object = "auto"
    kernel_params: dict | None = None
    solver: str = "auto"
    alpha: object = "auto"
    early_stopping: object = "auto"
    classifier: bool = False
    distributed: bool = False
    batch_size: object = "auto"
    subsample_size: object = "auto"
    cache_kernel: object = "auto"
    projection: str = "auto"
    fit_intercept: bool = True
    validation_fraction: float = 0.1
    n_components: object = "auto"
    damping: float = 0.95
    scaling_rule: object = None
    n_epochs: int = 100
    tol: float | None = 1e-4
    n_iter_no_change: int = 3
    validation_score: Callable | None = None
    name: str = ""
    cache_dtype: str = "auto"
    feature_learning: str | None = None
    feature_learning_iter: int = 5
    bandwidth_search_size: object = "auto"


def planned_for_auto(value, planned):
    """``planned`` where the estimator's parameter ``value`` is ``"auto"``, else ``value`` as the user set it."""
    return planned if isinstance(value, str) and value == "auto" else value
