"""The attempts of the one fallback loop: what a fallback changes, what an attempt ran, what it produced."""

import dataclasses
from dataclasses import dataclass

import torch
from sklearn.exceptions import ConvergenceWarning

# CG that rounding breaks down above its stated residual (a curvature was not
# positive, the objective grew) is refit from where it ended with the penalty raised
# tenfold, at most this many times; the penalty it ends with becomes alpha_.  A stalled
# residual is not a breakdown: CG's residual is not monotone, and on tiny penalties it
# stalled at 1e-3 while the objective had settled to six digits.
CG_FALLBACK_REFITS = 3


@dataclass(frozen=True)
class Fallback:
    """A new attempt a path asks the driver to run instead of, or after, its own: what changes and why.

    Attributes
    ----------
    reason : str
        Why, in a few words (recorded in ``fit_attempts_``).
    solver : str or None
        The solver to run (None: the same).
    alpha : float or None
        The penalty to run with (None: the same).
    cache_kernel : bool or None
        ``cache_kernel`` to plan with (None: the estimator's).
    cache_dtype : str or None
        ``kernel_cache_dtype`` to plan with (None: the estimator's).
    n_components : int or None
        EigenPro's preconditioner components (None: the estimator's).
    batch_size : int or None
        EigenPro's batch (None: the estimator's ``batch_size``).
    coef_init : Tensor or None
        Coefficients to start from (None: the fit's warm start, if any).
    warning : str or None
        Raised as a ``ConvergenceWarning`` (or ``category``) when the driver takes it.
    category : type
    """

    reason: str
    solver: str | None = None
    alpha: float | None = None
    cache_kernel: object = None
    cache_dtype: str | None = None
    n_components: int | None = None
    batch_size: int | None = None
    coef_init: torch.Tensor | None = None
    warning: str | None = None
    category: type = ConvergenceWarning


@dataclass(frozen=True)
class Attempt:
    """One run of a solver by the driver: its solver, penalty and planning, and why it was made."""

    solver: str
    alpha: float
    reason: str = "planned"
    cache_kernel: object = None
    cache_dtype: str | None = None
    n_components: int | None = None
    batch_size: int | None = None
    coef_init: torch.Tensor | None = None
    n_refits: int = 0

    def planning(self, parameters):
        """``parameters`` as this attempt plans with them: a fallback's cache, components and batch in place."""
        changes = {
            "cache_kernel": self.cache_kernel,
            "cache_dtype": self.cache_dtype,
            "n_components": self.n_components,
            "batch_size": self.batch_size,
        }
        changed = {name: value for name, value in changes.items() if value is not None}
        return dataclasses.replace(parameters, **changed) if changed else parameters

    def record(self):
        """What ``fit_attempts_`` keeps of it."""
        return {"solver": self.solver, "alpha": self.alpha, "reason": self.reason}

    def after(self, fallback):
        """The attempt ``fallback`` asks for after this one."""
        refit = fallback.solver in (None, self.solver)
        return Attempt(
            solver=fallback.solver or self.solver,
            alpha=self.alpha if fallback.alpha is None else fallback.alpha,
            reason=fallback.reason,
            cache_kernel=self.cache_kernel if fallback.cache_kernel is None else fallback.cache_kernel,
            cache_dtype=self.cache_dtype if fallback.cache_dtype is None else fallback.cache_dtype,
            n_components=self.n_components if fallback.n_components is None else fallback.n_components,
            batch_size=self.batch_size if fallback.batch_size is None else fallback.batch_size,
            coef_init=fallback.coef_init,
            n_refits=self.n_refits + 1 if refit and fallback.alpha is not None else self.n_refits,
        )


class FallbackNeeded(Exception):
    """Raised by a stage of a path that cannot go on as planned; the driver runs ``fallback`` instead."""

    def __init__(self, fallback):
        super().__init__(fallback.reason)
        self.fallback = fallback


def safer_attempt(attempt, outcome, data, dtype, why):
    """The next safe change after ``attempt``'s model (``outcome``) went wrong (``why``); None when none is left.

    In this order, the cheapest first:

    1. a 16-bit kernel cache stored in the training dtype (its products exact
       where that does not fit the budget): it changes only rounding;
    2. EigenPro with half its preconditioner's components: its analytic step,
       ``1 / lambda_{k+1}``, shrinks with them (the loop has halved its own step
       already, each halving recorded);
    3. the penalty ten times larger (at least the dtype's resolution of the rows'
       weight), at most :data:`CG_FALLBACK_REFITS` times, EigenPro 3 excepted (its
       SGD has no penalty): the last resort, it changes the model.
    """
    operator_plan, spectrum = outcome.operator, outcome.spectrum
    if operator_plan is not None and operator_plan.cache_dtype == "float16":
        wider = str(dtype).removeprefix("torch.")
        reason = f"{why}: the 16-bit kernel cache's rounding; refit with the cache in {wider}"
        warning = f"{reason[0].upper()}{reason[1:]} (or computed per product where it does not fit)."
        return Fallback(reason, cache_dtype=wider, warning=warning)
    n_components = 0 if spectrum is None else spectrum.preconditioner.n_components
    if attempt.solver == "eigenpro" and n_components > 0:
        reason = f"{why}: refit with {n_components // 2} preconditioner components (was {n_components})"
        return Fallback(reason, n_components=n_components // 2, warning=f"{reason[0].upper()}{reason[1:]}.")
    if attempt.n_refits >= CG_FALLBACK_REFITS or (attempt.solver == "eigenpro" and data.centers is not None):
        return None
    larger = larger_penalty(attempt.alpha, dtype, data)
    reason = f"{why}: refit with alpha {larger:.3g} (was {attempt.alpha:.3g})"
    warning = f"{reason[0].upper()}{reason[1:]}; alpha_ holds the penalty used. Set a larger alpha or dtype='float64'."
    return Fallback(reason, alpha=larger, warning=warning)


def larger_penalty(alpha, dtype, data):
    """Ten times ``alpha``, at least the smallest penalty that resolves the errors to ``dtype``'s precision."""
    return max(10.0 * alpha, torch.finfo(dtype).eps * float(data.weights.sum()))
