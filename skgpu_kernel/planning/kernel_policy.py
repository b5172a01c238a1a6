"""What kind of kernel fit to run: the solver, the penalty and the held-out split.

One pure planner, :func:`plan_kernel_fit`, turns the estimator's choices (each
``"auto"`` or a value) and the problem's sizes into the policy's part of the fit's
one plan, :class:`FitPlan`.  The policy is made in two stages because one decision depends on a measurement:
when the penalty is chosen by leave-one-out, the fit pipeline measures it and
calls :meth:`FitPlan.with_alpha`, which settles the rest (the solver with
every point a center, whether to hold out a validation split).  Both stages read
the same :class:`~skgpu_kernel.planning.kernel.KernelProblem` that the layout
planners then size the fit with.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from .kernel import KernelProblem
from .parameters import KernelFitParameters
from .solver import (
    full_kernel_cg_factors,
    plan_alpha,
    plan_centers_solver,
    plan_full_kernel_solver,
    solves_penalised_system,
)

__all__ = [
    "AUTO_VALIDATION_MIN_SAMPLES",
    "DIRECT_FACTORED",
    "DIRECT_FROM_TUNING",
    "PENALTY_CARRY_MAX_RATIO",
    "TUNING_FIELDS",
    "FitPlan",
    "carries_subsample_penalty",
    "direct_solve_bytes",
    "plan_direct_solve",
    "plan_kernel_fit",
]

# The penalty alpha that the exact leave-one-out criterion chose on s rows (the
# bandwidth search's, every row a feature) is carried over, as it is, to a fit of up
# to this many times s rows.  As it is, alpha is a per-sample penalty alpha / n that
# falls as 1 / n (the fastest usual rate of the best one, and the Gaussian process
# view's: alpha the noise over the signal variance); the slowest, a constant
# per-sample penalty, would keep alpha / s.  Up to this ratio the two differ by less
# than one step of the penalty grid (a quarter of a decade, regularization.PENALTY_GRID),
# whatever the rate; beyond, the choice is not carried.
PENALTY_CARRY_MAX_RATIO = 10.0**0.25
# early_stopping="auto" holds out a validation split from this many samples on
# (smaller fits stop on the training loss).
AUTO_VALIDATION_MIN_SAMPLES = 1000


# The fields the tune stage sets (skgpu_kernel.fit.tune.tune), which a tuned plan hands on
# to a fit of the same kernel on a subset of its rows.
TUNING_FIELDS = ("tuned", "bandwidth_selection", "alpha_selection", "by_rule", "n_rows", "scored_rows", "X")


@dataclass(frozen=True)
class FitPlan:
    """Every decision of one kernel fit, made stage by stage: resolved, tuned, then its solver chosen.

    :func:`plan_kernel_fit` makes the policy's part from the problem's sizes (the
    solver with every point a center, how ``alpha`` is resolved, the held-out
    split), as far as it is known before any measurement; where the penalty is
    chosen by leave-one-out the tune stage measures it and :meth:`with_alpha`
    settles the rest.  The resolve stage adds the kernel and the rows, the tune
    stage the bandwidth and penalty (``TUNING_FIELDS``), made once per kernel
    per fit and reused by every fit of that kernel on the same rows or on a subset
    of them (feature learning's candidates, the path's later steps, the final
    refit): never run again silently.  The plan stage adds ``direct``.

    Attributes
    ----------
    problem : KernelProblem
        The sizes of every training row (before any validation split); its
        ``streamed`` says whether EigenPro 3 reads the rows in buffers.
    budget : int
    parameters : KernelFitParameters
        The estimator's, as every stage reads them.
    solver : str
        The solver the driver starts with: with every point a center provisional
        until ``alpha`` is known; ``"direct"`` once the plan stage chose a
        factorisation.
    alpha_mode : {"given", "zero", "loo"}
    alpha : float or None
        None while the leave-one-out criterion is still to be measured.
    loo_min_coverage : float
        With ``alpha_mode="loo"``: the share of the kernel's trace the Nystrom
        features must capture for the criterion to be scored (0: always).
    early_stopping : bool or None
        Whether to hold out a validation split; None until ``alpha`` is known.
    kernel : Kernel or None
        Resolved: with its bandwidth by the scale rule (or the user's); tuned: with
        the chosen bandwidth (``kernels.bandwidth_of(kernel)``).
    data : KernelFitInput or None
        The rows, with ``n_centers="auto"`` counted.
    tuned : bool
        The tune stage has chosen the bandwidth and the penalty (the fields
        below, ``TUNING_FIELDS``).
    bandwidth_selection : BandwidthSelection or None
    alpha_selection : AlphaSelection or None
        None where ``alpha`` was given.
    by_rule : bool
        The bandwidth is the scale rule's (or the user's): a fit on other rows
        takes the rule's bandwidth on its own rows.
    n_rows : int
        The rows tuned on.
    scored_rows : ndarray or None
        The rows the penalty's criterion scored, in its order (None: not scored).
    X : array or None
        The host rows tuned on (the array itself, not a copy): the criterion's
        solution is a model of exactly these rows in these features.
    direct : str or None
        ``plan_direct_solve``'s decision (None: the solver iterates).
    run : KernelFitPlan or None
        The attempt's solver run, once planned
        (:func:`~skgpu_kernel.planning.run.plan_run`: layout, measured capacity
        and spectrum, batch, operator plan, stopping); None before, and for a
        solver that plans no run (the direct solve, a registered solver).
    """

    problem: KernelProblem
    budget: int
    parameters: KernelFitParameters
    solver: str
    alpha_mode: str
    alpha: float | None = None
    loo_min_coverage: float = 0.0
    early_stopping: bool | None = None
    kernel: object = None
    data: object = None
    tuned: bool = False
    bandwidth_selection: object = None
    alpha_selection: object = None
    by_rule: bool = True
    n_rows: int = 0
    scored_rows: np.ndarray | None = None
    X: object = dataclasses.field(default=None, repr=False, compare=False)
    direct: str | None = None
    run: object = None

    @property
    def uses_centers(self):
        return self.problem.n_centers is not None

    @property
    def streamed(self):
        """EigenPro 3 reads the rows in buffers (the problem says so)."""
        return self.problem.streamed

    @property
    def needs_penalty(self):
        """Whether the fit's solver solves the system ``(K + alpha W^-1) a = y``, which needs ``alpha > 0``.

        CG, or any solver the user named other than EigenPro
        (``planning.solver.solves_penalised_system``).  Where the
        criterion's coverage is below ``loo_min_coverage`` (a fit that early
        stopping would otherwise regularise), it takes the criterion's ``alpha`` all
        the same: on centers the bound is 0 anyway; on every point (``solver="cg"``
        asked for) a fit at ``alpha`` 0 would divide by it.
        """
        return self.solver == "cg" or solves_penalised_system(self.parameters.solver)

    @property
    def cg_on_every_row_as_centers(self):
        """CG with a center at every training row runs as CG on centers, every row one: it factors ``K(X, X)``.

        Up to ``planning.solver.FULL_KERNEL_CG_MAX_ROWS`` rows
        (``planning.solver.full_kernel_cg_factors``), Falkon's preconditioner on
        every row; beyond, CG on every point with a subsample preconditioner.
        """
        return self.solver == "cg" and not self.uses_centers and full_kernel_cg_factors(self.problem)

    def with_alpha(self, alpha):
        """The plan once ``alpha`` is known: the solver and the held-out split settled."""
        solver = self.solver
        if not self.uses_centers:
            solver = plan_full_kernel_solver(self.problem, self.budget, self.parameters.solver, alpha)
        early_stopping = self.parameters.early_stopping
        if early_stopping == "auto":
            # Without a penalty EigenPro heads for the interpolant, so held-out data
            # decides when to stop; a penalised loss, or CG's exact solve, converges by itself.
            exact_or_streamed = solver == "cg" or self.streamed
            early_stopping = not exact_or_streamed and alpha == 0 and self.problem.n_rows >= AUTO_VALIDATION_MIN_SAMPLES
        return dataclasses.replace(self, solver=solver, alpha=float(alpha), early_stopping=bool(early_stopping))

    def solves(self, X):
        """Whether the penalty criterion's solution is a model of the rows ``X``.

        Only where ``X`` is the very array tuned on and every row of it was scored.
        """
        selection = self.alpha_selection
        return (
            selection is not None
            and selection.solution is not None
            and selection.n_rows == self.n_rows
            and (X is self.X)
        )

    def pinned(self):
        """This plan with its tuned bandwidth kept on any rows, the rule's included (the learning path's).

        The path fits other features (``X L``) with it: the criterion's solution, a
        model of the rows tuned on, and its spectrum, of the kernel on them, are dropped.
        """
        selection = self.alpha_selection and self.alpha_selection.penalty_alone()
        return dataclasses.replace(self, by_rule=False, alpha_selection=selection, X=None)

    def finished(self):
        """This plan as a fitted model keeps it: without the rows tuned on or the criteria's solutions (memory)."""
        selection, search = self.alpha_selection, self.bandwidth_selection
        return dataclasses.replace(
            self,
            X=None,
            data=None,
            alpha_selection=selection and selection.without_solution(),
            bandwidth_selection=search and search.without_solution(),
        )


def plan_kernel_fit(problem, budget, parameters):
    """The policy of a kernel fit: solver, how ``alpha`` is resolved, the held-out split.

    Parameters
    ----------
    problem : KernelProblem
        Every training row; ``n_centers`` set when the model has centers, ``n_shards``
        the devices or ranks they would be split over, ``streamed`` when ``X`` is
        read from its file in buffers.
    budget : int
    parameters : KernelFitParameters

    Returns
    -------
    FitPlan
        The policy's fields (no kernel or rows yet: the resolve stage adds them).
        Complete (``alpha`` and ``early_stopping`` set) unless ``alpha_mode`` is
        ``"loo"``: then the caller measures ``alpha`` and calls ``with_alpha``.

    Raises
    ------
    ValueError
        Combinations that cannot run: a held-out split of streamed data, several
        devices without centers, a penalty that only CG takes where CG cannot run.
    """
    uses_centers = problem.n_centers is not None
    if problem.streamed and parameters.early_stopping is True:
        raise ValueError(
            "early_stopping needs a held-out split of X, which would copy the memory-mapped training data "
            "that does not fit memory_budget; hold out a validation set yourself, or raise memory_budget."
        )
    if not uses_centers and (problem.n_shards > 1 or parameters.distributed):
        raise ValueError(
            "A list of devices or distributed=True shards the centers of EigenPro 3: set n_centers or "
            "centers (with every training point a center, the model is trained on one device)."
        )
    solver = _centers_solver(problem, budget, parameters) if uses_centers else "eigenpro"
    asked = solver if uses_centers else parameters.solver
    alpha_mode, value = plan_alpha(parameters.alpha, uses_centers, asked, parameters.classifier, problem.weighted)
    plan = FitPlan(problem, budget, parameters, solver, alpha_mode)
    if alpha_mode == "loo":
        return dataclasses.replace(plan, loo_min_coverage=value)
    return plan.with_alpha(0.0 if alpha_mode == "zero" else value)


def _centers_solver(problem, budget, parameters):
    """CG or EigenPro 3 for a model on centers; a given ``alpha > 0`` must get CG."""
    solver = plan_centers_solver(problem, budget, parameters.solver)
    alpha = parameters.alpha
    if solver == "eigenpro" and not isinstance(alpha, str) and alpha > 0:
        sharded_or_streamed = problem.n_shards > 1 or problem.streamed
        where = "sharded centers or streamed data" if sharded_or_streamed else "its p x p factors do not fit"
        raise ValueError(
            f"alpha={alpha} with centers is solved by solver='cg', which cannot run here ({where} "
            "memory_budget); EigenPro 3's SGD has no penalty. Use alpha=0, fewer centers or a larger budget."
        )
    return solver


# The rows the leave-one-out criterion scores, every one a feature, for the penalty of
# the refit that replaces an unpenalised fit whose held-out rows showed that
# interpolation did not pay (skgpu_kernel.planning.solver.refit_with_penalty).  The tune
# stage's criterion on up to CRITERION_MAX_ROWS rows cost 1.9 s a refit on a 3000-row
# noisy-label table (6 refits along feature learning's path: 11.5 s of a 17.9 s fit);
# 1500 exact rows are the bandwidth search's size.
PENALISED_REFIT_ROWS = 1500
# How a fit without an iterative solver gets its model (plan_direct_solve's answers).
DIRECT_FROM_TUNING = "tuning"
DIRECT_FACTORED = "factored"
# n x n float64 matrices a factored direct solve holds at once: K + alpha W^-1, its
# Cholesky factor, and the kernel's distance block while K is evaluated.
_DIRECT_MATRICES = 3


def direct_solve_bytes(n_rows):
    """Device bytes of the factored direct solve on ``n_rows`` rows (``n x n`` float64 matrices)."""
    return _DIRECT_MATRICES * 8 * int(n_rows) ** 2


def plan_direct_solve(plan, exact_solution, fit_intercept, warm_start, every_iteration=False):
    """How ``solver="auto"`` solves kernel ridge without iterating (``solver_ = "direct"``), or None.

    Kernel ridge with a penalty and a center at every row has one model, the one
    every solver converges to.  It is computed directly:

    - :data:`DIRECT_FROM_TUNING`: where the leave-one-out criterion scored every
      training row as a feature (``exact_solution``: up to the Nystrom subsample's
      2000 rows), its eigendecomposition of the centred kernel solves kernel ridge
      with an unpenalised intercept at the chosen penalty in a few products
      (``AlphaSelection.solution``); it needs the
      intercept (the criterion's model has one);
    - :data:`DIRECT_FACTORED`: else, up to
      :data:`~skgpu_kernel.planning.solver.FULL_KERNEL_CG_MAX_ROWS` rows whose
      ``n x n`` float64 matrices fit the budget (:func:`direct_solve_bytes`), one
      Cholesky factorisation of ``K + alpha W^-1``
      (:func:`~skgpu_kernel.solvers.direct.solve_direct`): in that range CG
      on every point factors ``n x n`` matrices three times for its preconditioner
      (on Computers, 4506 rows: 2.9 s against one factorisation's 0.6 s).

    Either needs ``solver="auto"``, a positive penalty with a center at every row, no
    held-out split, no warm start (its coefficients start an iterative solver), one
    process, and ``tol`` not None (``tol=None`` asks for every iteration up to
    ``n_epochs``).

    Parameters
    ----------
    plan : FitPlan
        With ``alpha`` settled.
    exact_solution : bool
        The tune stage holds the solution on exactly the rows fitted.
    fit_intercept, warm_start : bool
    every_iteration : bool, default=False
        ``tol=None``: the solver is to run its ``n_epochs`` iterations.

    Returns
    -------
    {DIRECT_FROM_TUNING, DIRECT_FACTORED} or None
    """
    parameters = plan.parameters
    solvable = (
        parameters.solver == "auto"
        and not parameters.distributed
        and not plan.uses_centers
        and plan.alpha is not None
        and plan.alpha > 0
        and not plan.early_stopping
        and not warm_start
        and not every_iteration
    )
    if not solvable:
        return None
    if exact_solution and fit_intercept:
        return DIRECT_FROM_TUNING
    n_rows = plan.problem.n_rows
    if full_kernel_cg_factors(plan.problem) and direct_solve_bytes(n_rows) <= plan.budget:
        return DIRECT_FACTORED
    return None


def plan_direct(problem, budget, alpha):
    """The direct solve's planning rule: its penalty, where its ``n x n`` matrices fit the budget.

    Parameters
    ----------
    problem : KernelProblem
        Every training row a center.
    budget : int
        Bytes.
    alpha : float

    Returns
    -------
    float
        ``alpha``: the one setting of :func:`~skgpu_kernel.solvers.direct.solve_direct`.

    Raises
    ------
    ValueError
        ``alpha <= 0``, or the three ``n x n`` float64 matrices above ``budget``.

    Examples
    --------
    >>> from skgpu_kernel.planning.kernel import KernelProblem
    >>> plan_direct(KernelProblem(1000, 5, 1, 4), budget=10**9, alpha=0.5)
    0.5
    """
    if not alpha > 0:
        raise ValueError(f"solver='direct' solves K + alpha W^-1, which needs alpha > 0; got alpha={alpha}.")
    needed = direct_solve_bytes(problem.n_rows)
    if needed > budget:
        raise ValueError(
            f"solver='direct' on {problem.n_rows} rows holds three n x n float64 matrices ({needed} bytes), more "
            f"than memory_budget ({budget} bytes); use solver='auto' or 'cg'."
        )
    return float(alpha)


def carries_subsample_penalty(scored_rows, n_rows):
    """Whether a fit of ``n_rows`` takes the penalty the exact criterion chose on ``scored_rows`` of its rows.

    Asked where ``alpha="auto"`` found that the Nystrom features of every row capture
    too little of the kernel for their criterion (``LOO_MIN_COVERAGE``): the fit is
    then penalised by the bandwidth search's exact ``alpha``, up to
    ``PENALTY_CARRY_MAX_RATIO`` times the rows it scored, rather than regularised
    by early stopping.  Measured on DNA (2548 rows, coverage 0.475, the search on
    1500), over 10 seeded splits: test error 0.0433 → 0.0395 (-0.0038 ± 0.0011), and
    its fits, penalised, are solved directly (7.5 s → 4.7 s); carried as a per-sample
    penalty instead, 0.0406.  On Computers' learning path (5007 rows, 3.3 times the
    rows scored), carrying it cost 10% (``benchmarks/RESULTS.md``).

    Parameters
    ----------
    scored_rows : int
        Rows the exact criterion scored.
    n_rows : int
        Rows of the fit.

    Returns
    -------
    bool
    """
    return n_rows <= PENALTY_CARRY_MAX_RATIO * scored_rows
