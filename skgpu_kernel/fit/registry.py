"""The kernel solvers by name: the one registry that the ``solver`` parameter, its docs and the driver read.

A solver is an algorithm on an operator, ``solve_<name>(operator, targets, plan)
-> Solution`` (:mod:`skgpu_kernel.solvers`), and its planning rule,
``plan_<name>(problem, budget, alpha) -> plan`` (:mod:`skgpu_kernel.planning`).
:func:`register_solver` adds one: the estimators then accept ``solver="<name>"``
and the driver (:func:`~skgpu_kernel.fit.solve.run_solver`) runs it on every
training point through :func:`~skgpu_kernel.fit.planned.run_planned`, its
fallbacks and last check included.  The user guide's "Adding a solver" walks
through it.

EigenPro and CG are registered with their attempts (``fit/eigenpro.py``,
``fit/cg.py``): each plans its run in one call
(:func:`~skgpu_kernel.planning.run.plan_run`), which asks the attempt's
measuring step for the operator's speed, the batch capacity and the spectrum,
before any operator is built.
"""

import collections.abc
import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..planning.kernel_policy import plan_direct
from ..solvers.direct import solve_direct
from .cg import run_centers_cg, run_every_point_cg
from .eigenpro import run_eigenpro2, run_eigenpro3
from .planned import run_planned

__all__ = ["AUTO", "RegisteredSolver", "SolverNames", "register_solver", "registered_solver", "unregister_solver"]

# The value of the solver parameter that leaves the choice to the fit's planning.
AUTO = "auto"
AUTO_DESCRIPTION = (
    '``"auto"`` takes, with centers, CG when its factors, the data and the stored ``K(X, Z)`` fit '
    "``memory_budget`` on one device with the data in memory, and EigenPro 3 otherwise (sharded centers, "
    "streamed data, large ``n p``: an iteration that evaluates ``K(X, Z)`` costs an EigenPro 3 epoch, and CG "
    "needs tens of them).  With every training point a center it solves kernel ridge directly where "
    '``alpha_ > 0`` and the exact solution is at hand (``solver_ = "direct"``: see ``solver_``), else takes '
    "CG whenever ``alpha_ > 0`` (up to 10000 rows only when the factors fit): a small penalty needs tens of "
    "EigenPro epochs and fewer CG iterations (VietNamI, ``alpha_`` 0.07: 22 against 31), except where the "
    "preconditioned system's estimated condition number exceeds 100 (a tiny ``alpha``): there EigenPro 2 "
    "fits.  Without a penalty it takes EigenPro 2, whose early stopping regularises.  The choice is "
    "``solver_``.  ``alpha > 0`` with centers needs CG."
)


@dataclass(frozen=True)
class RegisteredSolver:
    """A solver the kernel machines run by name.

    Attributes
    ----------
    name : str
        The ``solver`` parameter's value (and ``solver_``'s).
    description : str
        Its paragraph in the ``solver`` parameter's docs (reStructuredText).
    rule : callable or None
        The planning rule ``plan_<name>(problem, budget, alpha) -> plan``: a pure
        function of the fit's :class:`~skgpu_kernel.planning.kernel.KernelProblem`,
        its memory budget in bytes and the penalty, raising ``ValueError`` where
        the solver cannot run.
    solve : callable or None
        ``solve_<name>(operator, targets, plan) -> Solution`` (None where it finds
        none): the algorithm on ``K(X, X)``.
    every_point, centers : callable or None
        The attempt ``(context, attempt) -> KernelFitResult`` of a solver that
        plans a measured run (EigenPro's and CG's), for a model with a center at
        every training point and one on centers; None where it has none.  A
        solver with a ``rule`` and a ``solve`` runs on every point through
        :func:`~skgpu_kernel.fit.planned.run_planned`.
    """

    name: str
    description: str
    rule: Callable | None = None
    solve: Callable | None = None
    every_point: Callable | None = None
    centers: Callable | None = None

    def attempt(self, on_centers):
        """The attempt that fits this solver's model: on centers or on every training point; None where none."""
        if on_centers:
            return self.centers
        if self.every_point is None and self.solve is not None:
            return functools.partial(run_planned, solver=self)
        return self.every_point


_SOLVERS = {}


def register_solver(name, rule, solve, description):
    """Register ``solve`` and its planning ``rule`` under ``name``: ``solver=name`` then fits with them.

    Parameters
    ----------
    name : str
        The ``solver`` parameter's new value; not one registered already, nor ``"auto"``.
    rule : callable
        ``plan_<name>(problem, budget, alpha) -> plan`` (see :class:`RegisteredSolver`).
    solve : callable
        ``solve_<name>(operator, targets, plan) -> Solution or None``.
    description : str
        One paragraph for the parameter's docs.

    Returns
    -------
    RegisteredSolver
    """
    if not isinstance(name, str) or not name or name == AUTO or name in _SOLVERS:
        raise ValueError(f"A solver's name must be a new non-empty string other than {AUTO!r}; got {name!r}.")
    if not callable(rule) or not callable(solve):
        raise TypeError(f"solver {name!r}: rule and solve must be callables, got {rule!r} and {solve!r}.")
    return _add(RegisteredSolver(name, description, rule=rule, solve=solve))


def unregister_solver(name):
    """Remove a solver :func:`register_solver` added (the package's own stay)."""
    if name in _BUILT_IN:
        raise ValueError(f"solver {name!r} is one of the package's own: it cannot be removed.")
    del _SOLVERS[name]


def registered_solver(name):
    """The :class:`RegisteredSolver` of ``name``; ``KeyError`` naming the registered ones where none."""
    if name not in _SOLVERS:
        raise KeyError(f"No solver {name!r} is registered; the registered ones are {sorted(_SOLVERS)}.")
    return _SOLVERS[name]


def solver_attempt(name, on_centers):
    """The attempt of solver ``name`` for the model's layout; ``ValueError`` where the solver has none for it."""
    attempt = registered_solver(name).attempt(on_centers)
    if attempt is None:
        layout = "on centers" if on_centers else "with a center at every training point"
        others = sorted(known for known, solver in _SOLVERS.items() if solver.attempt(on_centers) is not None)
        raise ValueError(f"solver={name!r} cannot fit a model {layout}; use 'auto' or one of {others}.")
    return attempt


def solver_docs():
    """The ``solver`` parameter's heading (the registry's values) and each value's paragraph, ``"auto"``'s last."""
    names = ", ".join(f'"{name}"' for name in [AUTO, *sorted(_SOLVERS)])
    paragraphs = [f'``"{solver.name}"``: {solver.description}' for _, solver in sorted(_SOLVERS.items())]
    return f'solver : {{{names}}}, default="auto"', [*paragraphs, AUTO_DESCRIPTION]


class SolverNames(collections.abc.Set):
    """The ``solver`` parameter's allowed values as the registry holds them now: ``"auto"`` and each solver's name.

    A live view (a ``StrOptions`` constraint reads it at each ``fit``), so a solver
    registered after import is accepted.
    """

    def __contains__(self, value):
        return value == AUTO or value in _SOLVERS

    def __iter__(self):
        return iter([AUTO, *sorted(_SOLVERS)])

    def __len__(self):
        return 1 + len(_SOLVERS)

    @classmethod
    def _from_iterable(cls, values):
        return frozenset(values)  # set operations give a plain set of the names


def _add(solver):
    _SOLVERS[solver.name] = solver
    return solver


_add(
    RegisteredSolver(
        "cg",
        "conjugate gradients.  On ``n_centers`` or ``centers``: on the penalised normal equations, "
        "preconditioned with the ``K(centers, centers)`` Cholesky factor (Falkon's preconditioner), to the "
        "exact penalised least-squares solution on the centers, one pass over the data per iteration "
        "(``n_epochs`` bounds the iterations; two ``p x p`` float64 factors, ``16 p^2`` bytes; ``K(X, Z)`` is "
        "computed once and stored when it fits ``memory_budget``, else evaluated every iteration).  With every "
        "training point a center (``n_centers=None``), on ``K + alpha W^-1`` (the KernelRidge solution): up to "
        "10000 rows preconditioned with ``K(X, X)``'s own factor, which makes CG exact in a few iterations at "
        "``O(n^3)`` cost; beyond, with a Nystrom preconditioner from the ``subsample_size`` rows that flattens "
        "the directions above ``alpha`` (``O(n q)`` memory, ``q <= 1000``), reading ``K(X, X)`` once per "
        "iteration from EigenPro 2's cache (or evaluating it).",
        every_point=run_every_point_cg,
        centers=run_centers_cg,
    )
)
_add(
    RegisteredSolver(
        "direct",
        "kernel ridge by one Cholesky factorisation of ``K + alpha W^-1`` in float64, with every training "
        "point a center and ``alpha > 0`` (three ``n x n`` float64 matrices, which must fit ``memory_budget``).",
        rule=plan_direct,
        solve=solve_direct,
    )
)
_add(
    RegisteredSolver(
        "eigenpro",
        "EigenPro's preconditioned SGD: EigenPro 2 with every training point a center, EigenPro 3's projected "
        "SGD on ``n_centers`` or ``centers`` (no ``p x p`` matrix).",
        every_point=run_eigenpro2,
        centers=run_eigenpro3,
    )
)
_BUILT_IN = frozenset(_SOLVERS)
