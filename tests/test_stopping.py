"""One stopping rule for every loop (issue 26), checked against its documented condition.

Each fit below is stopped by the plan of :func:`skgpu_kernel.planning.stopping.plan_stopping`
for the same ``tol`` and ``n_iter_no_change``; the epoch it stops at must be the
first at which the documented condition holds, recomputed here from ``history_``
by an independent implementation: the training loss divided by the reference loss
(the zero model's for EigenPro, the first epoch's elsewhere) has not gained more
than ``tol`` for ``n_iter_no_change`` epochs.
"""

import math

import numpy as np
import pytest

from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor, bmgd_fit
from skgpu_kernel.parallel import Parle
from skgpu_kernel.planning import run as run_planning
from skgpu_kernel.planning import sgd as planning_sgd
from skgpu_kernel.planning import stopping
from skgpu_kernel.planning.sgd import plateaus_to_anneal
from skgpu_kernel.planning.stopping import StoppingPlan, plan_stopping
from skgpu_kernel.scaling import ConstantRule, EigenProRule
from skgpu_kernel.scaling_rules import resolve_scaling_rule

TOL, PATIENCE, MAX_EPOCHS = 2e-3, 2, 60


def _problem(n=800, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, size=(n, 4))
    y = np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.3 * rng.randn(n)
    return X, y


def _documented_stop(losses, reference, anneal=0):
    """The epoch (from 1) closing plateau ``anneal + 1``: ``PATIENCE`` epochs without a relative gain above ``TOL``.

    Each of the first ``anneal`` plateaus starts the count again (the loop halved its step).
    """
    best, without, plateaus = -math.inf, 0, 0
    for epoch, loss in enumerate(losses, start=1):
        value = -loss / max(reference, 1e-300)
        without = 0 if value > best + TOL else without + 1
        best = max(best, value)
        if without >= PATIENCE:
            if plateaus == anneal:
                return epoch
            plateaus, without = plateaus + 1, 0
    return None


@pytest.fixture
def plans(monkeypatch):
    """Every stopping plan the pipelines make during the test."""
    made = []

    def recording(*args, **kwargs):
        made.append(plan_stopping(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(run_planning, "plan_stopping", recording)  # an EigenPro run's plan
    monkeypatch.setattr(stopping, "plan_stopping", recording)  # inside CG's plan_cg_stopping
    monkeypatch.setattr(bmgd_fit, "plan_stopping", recording)
    return made


def _eigenpro2(X, y):
    model = AdaptiveKernelRegressor(bandwidth=0.5, alpha=0.0, early_stopping=False, batch_size=64, random_state=0)
    model.set_params(tol=TOL, n_iter_no_change=PATIENCE, n_epochs=MAX_EPOCHS).fit(X, y)
    # EigenPro's reference: the zero model's mean squared residual of the centred targets.
    return model.n_epochs_, [r["train_loss"] for r in model.history_], float(np.mean((y - y.mean()) ** 2))


def _cg(X, y):
    model = AdaptiveKernelRegressor(bandwidth=0.5, n_centers=200, solver="cg", alpha=1e-6, random_state=0)
    model.set_params(tol=TOL, n_iter_no_change=PATIENCE, n_epochs=MAX_EPOCHS).fit(X, y)
    losses = [r["train_loss"] for r in model.history_]
    return model.n_epochs_, losses, losses[0]


def _bmgd(X, y, parallel=None):
    model = BufferedSGDRegressor(alpha=0.0, batch_size=32, random_state=0, parallel=parallel)
    model.set_params(tol=TOL, n_iter_no_change=PATIENCE, n_epochs=MAX_EPOCHS).fit(X, y)
    key = "workers_train_loss" if isinstance(parallel, Parle) else "train_loss"
    losses = [r[key] for r in model.history_]
    return model.n_iter_, losses, losses[0]


FITS = [
    pytest.param(_eigenpro2, id="eigenpro2"),
    pytest.param(_cg, id="cg"),
    pytest.param(_bmgd, id="bmgd"),
    pytest.param(lambda X, y: _bmgd(X, y, Parle(n_workers=2)), id="parle", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("fit", FITS)
def test_every_loop_stops_where_the_documented_rule_says(fit, plans):
    """The kernel loops stop at the first plateau; BMGD at EigenPro's step halves it at each of the first 7."""
    X, y = _problem()
    n_epochs, losses, reference = fit(X, y)
    anneal = plans[0].anneal if plans else None
    assert anneal in (0, planning_sgd.ANNEALED_PLATEAUS)
    assert plans and all(plan == StoppingPlan("train_loss", TOL, PATIENCE, anneal) for plan in plans), plans
    expected = _documented_stop(losses, reference, anneal)
    assert expected is not None and expected < MAX_EPOCHS, "the rule should stop this fit early"
    assert n_epochs == expected == len(losses)


@pytest.mark.parametrize("parallel", [None, pytest.param(Parle(n_workers=2), marks=pytest.mark.slow)])
def test_bmgd_at_the_analytic_step_halves_it_at_each_plateau_then_stops(parallel):
    """Issue 78: at a constant step the iterate wanders around the optimum; each plateau halves the step."""
    X, y = _problem()
    model = BufferedSGDRegressor(alpha=0.0, batch_size=32, random_state=0, parallel=parallel)
    model.set_params(tol=TOL, n_iter_no_change=PATIENCE, n_epochs=MAX_EPOCHS).fit(X, y)
    key = "workers_train_loss" if parallel is not None else "train_loss"
    losses = [record[key] for record in model.history_]
    rates = np.array([record["learning_rate"] for record in model.history_])
    plateau_ends = [_documented_stop(losses, losses[0], k) for k in range(planning_sgd.ANNEALED_PLATEAUS)]
    assert None not in plateau_ends
    assert model.n_iter_ == _documented_stop(losses, losses[0], planning_sgd.ANNEALED_PLATEAUS) < MAX_EPOCHS
    # The epoch after each plateau runs at half the step of the one before (the rule's own step is constant).
    for end in plateau_ends:
        assert rates[end] == pytest.approx(rates[end - 1] / stopping.ANNEAL_FACTOR, rel=1e-9)
    assert rates[-1] == pytest.approx(rates[0] / stopping.ANNEAL_FACTOR**planning_sgd.ANNEALED_PLATEAUS, rel=1e-9)


def test_tol_does_not_depend_on_the_scale_of_the_targets():
    # The training loss is judged relative to the first pass's: a fit on 1000 y stops
    # when the fit on y does (the raw loss would stop it at once or never).
    X, y = _problem()
    fits = [
        BufferedSGDRegressor(alpha=0.0, batch_size=32, tol=TOL, n_iter_no_change=PATIENCE, random_state=0)
        .set_params(n_epochs=MAX_EPOCHS)
        .fit(X, scale * y)
        for scale in (1.0, 1000.0)
    ]
    assert fits[0].n_iter_ < MAX_EPOCHS
    assert fits[0].n_iter_ == fits[1].n_iter_
    np.testing.assert_allclose(fits[1].coef_, 1000.0 * fits[0].coef_, rtol=1e-3)


@pytest.mark.slow
def test_data_parallel_and_adaptive_sgd_stop_on_tol():
    from skgpu_kernel.parallel import AdaptiveSGD, DataParallel

    X, y = _problem()
    n_epochs, losses, reference = _bmgd(X, y, DataParallel(n_workers=2))
    # The workers' losses are all-reduced: the record is the shared model's.
    assert n_epochs == _documented_stop(losses, reference, planning_sgd.ANNEALED_PLATEAUS) < MAX_EPOCHS
    adaptive = BufferedSGDRegressor(alpha=0.0, batch_size=32, tol=TOL, n_iter_no_change=PATIENCE, random_state=0)
    adaptive.set_params(n_epochs=MAX_EPOCHS, parallel=AdaptiveSGD(n_workers=2)).fit(X, y)
    assert adaptive.n_iter_ < MAX_EPOCHS
    assert math.ceil(adaptive.history_[-1]["epoch"]) == adaptive.n_iter_


# (scaling rule, plateaus that halve the step before one stops the fit)
ANNEAL_CASES = [
    ("optimal", planning_sgd.ANNEALED_PLATEAUS),  # the default: EigenPro's optimal step, no decay
    ("eigenpro", planning_sgd.ANNEALED_PLATEAUS),
    (EigenProRule(step="optimal", scale=0.5), planning_sgd.ANNEALED_PLATEAUS),
    (EigenProRule(step="optimal", decay="polynomial"), 0),  # the user's decay
    (EigenProRule(decay="step"), 0),
    ("constant", 0),  # the user's schedules
    (ConstantRule(0.01), 0),
    ("linear", 0),
    ("sqrt", 0),
    ("legw", 0),
]


@pytest.mark.parametrize(("rule", "anneal"), ANNEAL_CASES)
def test_only_the_analytic_step_without_a_decay_is_halved_at_plateaus(rule, anneal):
    assert plateaus_to_anneal(resolve_scaling_rule(rule)) == anneal


@pytest.mark.parametrize(
    ("tol", "validation", "anneal"), [(1e-3, False, 7), (1e-3, True, 7), (None, False, 0), (None, True, 0)]
)
def test_a_plan_that_cannot_stop_has_nothing_to_anneal(tol, validation, anneal):
    assert plan_stopping(tol, 5, validation, anneal=7).anneal == anneal
