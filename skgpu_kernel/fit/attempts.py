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


# What a fallback may change of the attempt before it: the plan's solver and penalty, the
# parameters the fit plans with, and the coefficients the attempt starts from.
PLAN_CHANGES = ("solver", "alpha")
PARAMETER_CHANGES = ("cache_kernel", "cache_dtype", "n_components", "batch_size", "subsample_size")
FALLBACK_CHANGES = (*PLAN_CHANGES, *PARAMETER_CHANGES, "coef_init")


@dataclass(frozen=True)
class Fallback:
    """A new attempt a path asks the driver to run instead of, or after, its own: what changes and why.

    Made by :meth:`of`.  The next attempt runs a new plan, the last one with
    ``changes`` (:meth:`Attempt.after`): the solver, the penalty, the cache or its
    dtype the fit plans with, EigenPro's preconditioner components, batch or subsample, the
    coefficients to start from (None unless given: the fit's warm start).

    Attributes
    ----------
    reason : str
        Why, in a few words (recorded in ``fit_attempts_``).
    changes : dict
        What changes, by name (:data:`FALLBACK_CHANGES`).
    warning : str or None
        Raised as a ``ConvergenceWarning`` (or ``category``) when the driver takes it.
    category : type
    """

    reason: str
    changes: dict
    warning: str | None = None
    category: type = ConvergenceWarning

    @classmethod
    def of(cls, reason, warning=None, category=ConvergenceWarning, **changes):
        """The fallback that changes ``changes`` (names of :data:`FALLBACK_CHANGES`) for ``reason``."""
        unknown = set(changes) - set(FALLBACK_CHANGES)
        if unknown:
            raise TypeError(f"a fallback changes {FALLBACK_CHANGES}, not {sorted(unknown)}")
        return cls(reason, changes, warning, category)

    @property
    def solver(self):
        """The solver it asks for (None: the same)."""
        return self.changes.get("solver")


@dataclass(frozen=True)
class Attempt:
    """One run of a solver by the driver: the plan it runs, why it was made, where it starts.

    Attributes
    ----------
    plan : FitPlan
        Every decision the run reads: the fit's plan (``solver``, ``alpha``, the
        parameters it plans with), or a fallback's new plan.
    reason : str
        Why (recorded in ``fit_attempts_``).
    coef_init : Tensor or None
        The coefficients a refit starts from (None: the fit's warm start, or zeros).
    n_refits : int
        Penalised refits of the same solver so far (at most :data:`CG_FALLBACK_REFITS`).
    """

    plan: object
    reason: str = "planned"
    coef_init: torch.Tensor | None = None
    n_refits: int = 0

    @property
    def solver(self):
        return self.plan.solver

    @property
    def alpha(self):
        return self.plan.alpha

    def record(self):
        """What ``fit_attempts_`` keeps of it."""
        return {"solver": self.solver, "alpha": self.alpha, "reason": self.reason}

    def after(self, fallback):
        """The attempt ``fallback`` asks for after this one: a new plan, this one's with the changes, for its reason."""
        changes = fallback.changes
        plan_changes = {name: changes[name] for name in PLAN_CHANGES if name in changes}
        parameter_changes = {name: changes[name] for name in PARAMETER_CHANGES if name in changes}
        plan = self.plan
        if parameter_changes:
            plan = dataclasses.replace(plan, parameters=dataclasses.replace(plan.parameters, **parameter_changes))
        penalised_refit = plan_changes.get("solver", self.solver) == self.solver and "alpha" in plan_changes
        n_refits = self.n_refits + 1 if penalised_refit else self.n_refits
        # A refit starts from where it is told, else afresh.
        coef_init = changes.get("coef_init")
        return Attempt(dataclasses.replace(plan, **plan_changes), fallback.reason, coef_init, n_refits)

    def ran(self, run):
        """This attempt with its solver ``run`` planned (:func:`~skgpu_kernel.planning.run.plan_run`) on its plan."""
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, run=run))

    def finished(self):
        """This attempt as the result keeps it: its plan without the rows tuned on or the criteria's solutions."""
        return dataclasses.replace(self, plan=self.plan.finished(), coef_init=None)


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
    operator_plan, spectrum = outcome.operator, outcome.spectrum  # None where the run planned none
    if operator_plan is not None and operator_plan.cache_dtype == "float16":
        wider = str(dtype).removeprefix("torch.")
        reason = f"{why}: the 16-bit kernel cache's rounding; refit with the cache in {wider}"
        warning = f"{reason[0].upper()}{reason[1:]} (or computed per product where it does not fit)."
        return Fallback.of(reason, cache_dtype=wider, warning=warning)
    n_components = 0 if spectrum is None else spectrum.preconditioner.n_components
    if attempt.solver == "eigenpro" and n_components > 0:
        reason = f"{why}: refit with {n_components // 2} preconditioner components (was {n_components})"
        return Fallback.of(reason, n_components=n_components // 2, warning=f"{reason[0].upper()}{reason[1:]}.")
    if attempt.n_refits >= CG_FALLBACK_REFITS or (attempt.solver == "eigenpro" and data.centers is not None):
        return None
    larger = larger_penalty(attempt.alpha, dtype, data)
    reason = f"{why}: refit with alpha {larger:.3g} (was {attempt.alpha:.3g})"
    warning = f"{reason[0].upper()}{reason[1:]}; alpha_ holds the penalty used. Set a larger alpha or dtype='float64'."
    return Fallback.of(reason, alpha=larger, warning=warning)


def larger_penalty(alpha, dtype, data):
    """Ten times ``alpha``, at least the smallest penalty that resolves the errors to ``dtype``'s precision."""
    return max(10.0 * alpha, torch.finfo(dtype).eps * float(data.weights.sum()))
