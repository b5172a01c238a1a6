"""The tune stage: bandwidth and penalty per kernel, once; never run again silently."""

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import clone

from .._validation import unequal_weights
from ..blockwise import DeviceCopier, rows_taken
from ..kernels import bandwidth_of, searches_bandwidth
from ..planning.kernel import auto_subsample_size, plan_bandwidth_search_rows, plan_criterion_rows
from ..planning.kernel_policy import PENALISED_REFIT_ROWS, TUNING_FIELDS, carries_subsample_penalty
from ..regularization import PENALTY_GRID, select_alpha, select_bandwidth
from .prepare import kernel_offset, target_intercept
from .request import log_fit
from .resolve import resolve


def tune(runtime, plan):
    """The tune stage: ``plan`` with its bandwidth and penalty, chosen here unless it holds them already.

    The rows and the parameters are the resolved plan's.

    Returns
    -------
    FitPlan
    """
    if plan.tuned:
        return plan
    return _tuned(runtime, plan)


def tune_kernel(data, parameters, runtime):
    """The bandwidth ("auto") and the penalty (leave-one-out) of the kernel of ``parameters`` on the rows ``data``.

    Draws from a copy of ``runtime``'s random state: a fit handed the plan
    draws what it would draw choosing them itself, and gives the same model.

    Returns
    -------
    FitPlan
        Tuned, for :func:`fit_kernel_model` to reuse on these rows or a subset.
    """
    return tune(runtime, resolve(data, parameters, runtime))


def applied_tuning(tuned, resolved):
    """``resolved`` with the tuning of the plan ``tuned`` (of a superset of its rows), or None where it does not apply.

    The penalty chosen by the rule is a per-sample penalty: it is applied to the
    fit's weight total, as the rule would choose it there (``alpha`` as it is where
    the rule scored only part of the rows, as :class:`LooRows` keeps it).  A policy
    that asks for no leave-one-out penalty, or one the tuning did not score, is
    not this tuning's.
    """
    selection = tuned.alpha_selection
    if (resolved.alpha is None) != (selection is not None):
        return None
    if selection is not None:
        alpha = selection.alpha
        if selection.alpha > 0 and selection.n_rows >= tuned.n_rows:
            alpha = selection.penalty * float(np.sum(resolved.data.weights))
        resolved = resolved.with_alpha(alpha)
    kernel = resolved.kernel if tuned.by_rule else tuned.kernel
    tuning = {name: getattr(tuned, name) for name in TUNING_FIELDS}
    if selection is not None and tuned.by_rule and bandwidth_of(resolved.kernel) != bandwidth_of(tuned.kernel):
        # The rule's bandwidth on these rows is another kernel than the one the criterion scored.
        tuning["alpha_selection"] = selection.penalty_alone()
    return dataclasses.replace(resolved, kernel=kernel, **tuning)


def _tuned(runtime, plan):
    """Search the bandwidth ("auto") and score the penalty where the policy asks; a warm start keeps its bandwidth."""
    parameters, data, kernel = plan.parameters, plan.data, plan.kernel
    searched = searches_bandwidth(parameters.kernel, parameters.bandwidth)
    continued = data.continuation.bandwidth if searched and data.continuation is not None else None
    if continued is not None:
        kernel = clone(kernel).set_params(bandwidth=continued)
    search, selection, scored_rows = None, None, None
    if (searched and continued is None) or plan.alpha is None:
        search_rows = plan_bandwidth_search_rows(parameters.bandwidth_search_size)
        criterion_rows = plan_criterion_rows(data.X.shape[0]) if plan.alpha is None else 0
        scored = LooRows.draw(data, kernel, runtime, parameters, max(criterion_rows, search_rows))
        if searched and continued is None:
            search = scored.search_bandwidth(kernel, _search_penalties(plan, data), data.X.shape[0], search_rows)
            kernel = clone(kernel).set_params(bandwidth=search.bandwidth)
            log_fit(runtime, parameters, search.describe())
        if plan.alpha is None:
            scored = scored.head(criterion_rows)
            # Where the search scored every row, each of them a feature, its own selection is the criterion's.
            exact = search is not None and search.selection.n_rows == scored.n_rows <= auto_subsample_size(
                scored.n_rows
            )
            min_coverage = 0.0 if plan.needs_penalty else plan.loo_min_coverage
            selection = search.selection if exact else scored.select_alpha(kernel, min_coverage)
            selection = _gated(selection, search, plan, data)
            plan = plan.with_alpha(selection.alpha)
            scored_rows = scored.indices
    return dataclasses.replace(
        plan,
        kernel=kernel,
        tuned=True,
        bandwidth_selection=search,
        alpha_selection=selection,
        by_rule=not searched,
        n_rows=data.X.shape[0],
        scored_rows=scored_rows,
        X=data.X,
    )


def _gated(selection, search, plan, data):
    """``selection`` where its features cover the kernel; else the search's exact penalty carried over, or none.

    Below the policy's coverage the Nystrom criterion is not trusted; the bandwidth
    search's exact ``alpha`` on a subsample is carried over, as it is, to every row where
    :func:`~skgpu_kernel.planning.kernel_policy.carries_subsample_penalty` says so,
    and otherwise the fit has no penalty (early stopping regularises), unless CG
    solves it (:attr:`~skgpu_kernel.planning.kernel_policy.FitPlan.needs_penalty`):
    then the criterion's own ``alpha``, scored whatever its coverage.
    """
    gated = selection.gated(plan.loo_min_coverage)
    if gated.scored:
        return gated
    if search is not None and carries_subsample_penalty(search.selection.n_rows, data.X.shape[0]):
        return search.selection.carried_to(gated.coverage)
    # CG's system needs a penalty: the criterion's own, below the coverage it is trusted at.
    return selection if plan.needs_penalty else gated


def _search_penalties(plan, data):
    """The penalties each bandwidth is scored at: a given ``alpha``'s alone, else the whole grid.

    Where early stopping regularises (``alpha`` 0), the bandwidth is the one whose
    best penalty scores best: early stopping follows a path much like the ridge
    path's.
    """
    if plan.alpha_mode == "given" and plan.alpha > 0:
        return np.array([plan.alpha / float(np.sum(data.weights))])
    return PENALTY_GRID


@dataclass(frozen=True)
class LooRows:
    """The rows the leave-one-out criteria score, on the device in float64, in their seeded random order.

    At most :func:`~skgpu_kernel.planning.kernel.plan_criterion_rows` rows are
    scored.  Beyond that the chosen ``alpha`` is kept as it is rather than scaled
    with the number of rows: on the real-data benchmark the leave-one-out
    ``alpha`` stayed within a factor 1.5 from 5000 to
    60000 rows of Fashion-MNIST and from 4000 to 17817 rows of HI (and fell on
    VietNamI), where a constant per-sample penalty would have grown it 4 to 12 times.

    Attributes
    ----------
    X, Y : Tensor
        Rows and targets (the codes less the intercept for a classifier).
    weights : Tensor or None
        None when every weight is equal.
    code_intercept : Tensor or None
        A classifier's intercept of its codes: its criterion counts the
        misclassifications of the classes the codes name.
    indices : ndarray or None
        The rows of the fit's data these are, in their order.
    """

    X: torch.Tensor
    Y: torch.Tensor
    weights: torch.Tensor | None
    code_intercept: torch.Tensor | None
    indices: np.ndarray | None = None

    @classmethod
    def draw(cls, data, kernel, runtime, parameters, count):
        """``count`` seeded random rows of ``data``, or all (the first s: the subsample)."""
        device = runtime.devices[0]
        intercept = target_intercept(parameters.fit_intercept, data.Y, data.weights)
        to_device = DeviceCopier(device, torch.float64, kernel_offset(kernel, data.X))
        # Drawn from a copy of the fit's generator, so that choosing alpha leaves the fit's own
        # draws (validation split, epoch orders) as they would be with alpha given.
        rows = copy.deepcopy(runtime.rng).permutation(data.X.shape[0])[:count]
        w = None if data.equal_weights else torch.as_tensor(data.weights[rows], dtype=torch.float64, device=device)
        code_intercept = None
        if parameters.classifier:
            code_intercept = torch.as_tensor(intercept, dtype=torch.float64, device=device)
        X = to_device(rows_taken(data.X, data.X_device, rows))
        return cls(X, to_device(data.Y[rows] - intercept, center=False), w, code_intercept, rows)

    @property
    def n_rows(self):
        return self.X.shape[0]

    def head(self, count):
        """The first ``count`` rows."""
        weights = None if self.weights is None else self.weights[:count]
        return LooRows(self.X[:count], self.Y[:count], weights, self.code_intercept, self.indices[:count])

    def select_alpha(self, kernel, min_coverage=0.0):
        """:func:`~skgpu_kernel.regularization.select_alpha` on these rows."""
        subsample = auto_subsample_size(self.n_rows)
        return select_alpha(
            kernel, self.X, self.Y, self.weights, subsample, min_coverage, code_intercept=self.code_intercept
        )

    def search_bandwidth(self, kernel, penalties, n_rows, search_rows):
        """:func:`~skgpu_kernel.regularization.select_bandwidth` on the first ``search_rows`` rows.

        Every row searched is a feature, so the criterion is exact for a kernel
        machine on those rows.  Of ``n_rows`` rows in all, the bandwidth best for
        a subsample is at least as wide as the one best for every row (a model of
        more rows resolves finer detail), so a subsample's preference for a bandwidth
        wider than the scale rule is not followed.
        """
        count = min(self.n_rows, search_rows)
        searched = self.head(count)
        widest = None if count >= n_rows else 1.0
        return select_bandwidth(
            kernel,
            searched.X,
            searched.Y,
            searched.weights,
            count,
            code_intercept=searched.code_intercept,
            penalties=penalties,
            widest=widest,
        )


def criterion_alpha(prepared, runtime):
    """The leave-one-out criterion's ``alpha`` on the prepared fit's own training rows, whatever its coverage.

    The penalty of the refit that replaces an unpenalised fit whose held-out rows
    showed that interpolation did not pay (:func:`~skgpu_kernel.fit.solve.run_solver`).
    Its gate had found the Nystrom features too far from the kernel to trust the
    criterion over early stopping; once early stopping has failed, the criterion's
    penalty is the one left.  It scores the first
    :data:`~skgpu_kernel.planning.kernel_policy.PENALISED_REFIT_ROWS` rows of the fit's
    shuffle (already seeded: no draw), every one a feature (the exact criterion), with
    their centred targets, and returns ``alpha`` for those rows, kept as it is for
    the fit's rows, as the tune stage keeps its own (:class:`LooRows`).
    """
    rows = prepared.order[:PENALISED_REFIT_ROWS]
    device = runtime.devices[0]
    to_device = DeviceCopier(device, torch.float64, prepared.offset)
    X = to_device(rows_taken(prepared.X, prepared.X_device, rows))
    n_targets = prepared.Y.shape[1] - prepared.joint_intercept
    Y = to_device(prepared.Y[rows, :n_targets], center=False)
    weights = prepared.weights[rows]
    w = None if unequal_weights(weights) is None else torch.as_tensor(weights, dtype=torch.float64, device=device)
    code_intercept = None
    if prepared.plan.parameters.classifier:
        code_intercept = torch.as_tensor(prepared.intercept, dtype=torch.float64, device=device)
    return LooRows(X, Y, w, code_intercept, rows).select_alpha(prepared.plan.kernel).alpha


def with_exact_penalty(plan, data, runtime):
    """``plan`` with the exact leave-one-out criterion's ``alpha`` on a few rows of ``data``, carried as it is.

    The penalty of a model on centers whose kernel's tuning for a model on every
    row left ``alpha`` unscored (its Nystrom features below the gate's coverage:
    early stopping regularises that model, where CG on centers needs a penalty).
    The criterion scores :data:`~skgpu_kernel.planning.kernel_policy.PENALISED_REFIT_ROWS`
    seeded rows, every one a feature (as the bandwidth search and the penalised
    refit score theirs), and its ``alpha`` is kept as it is for the fit's rows
    (:meth:`~skgpu_kernel.regularization.AlphaSelection.carried_to`), as the tune
    stage keeps its own (:class:`LooRows`).
    """
    scored = LooRows.draw(data, plan.kernel, runtime, plan.parameters, PENALISED_REFIT_ROWS)
    selection = scored.select_alpha(plan.kernel)
    return dataclasses.replace(plan, alpha_selection=selection.carried_to(selection.coverage))
