"""Scaling rules against hand-computed schedules, their contract check and grid search."""

import math
import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_regression
from sklearn.model_selection import GridSearchCV

from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor
from skgpu_kernel.scaling import (
    LEGW,
    ConstantRule,
    EigenProRule,
    LinearScaling,
    ScalingRule,
    ScheduleContext,
    SqrtScaling,
    eigenpro_step_size,
)
from skgpu_kernel.scaling_rules import SCALING_RULES, resolve_scaling_rule, warn_if_warmup_fills_run
from skgpu_kernel.testing import check_scaling_rule


def _at(rule, steps, batch_size, steps_per_epoch, n_epochs, **spectrum):
    """The rule's rates at ``steps``, read from one schedule."""
    schedule = rule.schedule(batch_size, max(steps) + 1, steps_per_epoch=steps_per_epoch, n_epochs=n_epochs, **spectrum)
    return [float(schedule[step]) for step in steps]


# --- each rule's formula ---------------------------------------------------------------


def test_constant_rule_ignores_the_batch_size():
    for batch_size in (1, 32, 4096):
        assert _at(ConstantRule(0.05), [0, 7, 99], batch_size, 10, 5) == [0.05, 0.05, 0.05]


def test_linear_scaling_warms_up_linearly_from_base_lr_to_k_times_base_lr():
    # k = 256 / 32 = 8: peak 0.8, reached after 2 epochs of 10 updates.
    rule = LinearScaling(base_lr=0.1, base_batch_size=32, warmup_epochs=2.0)
    rates = _at(rule, [0, 5, 10, 19, 20, 99], batch_size=256, steps_per_epoch=10, n_epochs=10)
    expected = [0.1, 0.1 + 0.7 * 0.25, 0.1 + 0.7 * 0.5, 0.1 + 0.7 * 0.95, 0.8, 0.8]
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    assert rule.peak_lr(ScheduleContext(256, 10, 10)) == pytest.approx(0.8)


def test_linear_scaling_warm_up_lasts_the_same_epochs_for_every_batch():
    rule = LinearScaling(base_lr=0.1, warmup_epochs=5.0)
    for batch_size, steps_per_epoch in [(64, 100), (1024, 7)]:
        schedule = rule.schedule(batch_size, 6 * steps_per_epoch, steps_per_epoch=steps_per_epoch, n_epochs=10)
        first_at_peak = int(np.argmax(schedule == schedule.max()))
        assert first_at_peak == 5 * steps_per_epoch


def test_linear_and_sqrt_peaks():
    context = ScheduleContext(batch_size=512, steps_per_epoch=10, n_epochs=1)  # k = 16
    linear = LinearScaling(base_lr=0.1, base_batch_size=32).peak_lr(context)
    sqrt = SqrtScaling(base_lr=0.1, base_batch_size=32).peak_lr(context)
    assert linear == pytest.approx(1.6) and sqrt == pytest.approx(0.4)
    # A batch below the base scales the rate down.
    small = ScheduleContext(batch_size=8, steps_per_epoch=10, n_epochs=1)
    assert LinearScaling(base_lr=0.1).peak_lr(small) == pytest.approx(0.025)
    assert SqrtScaling(base_lr=0.1).peak_lr(small) == pytest.approx(0.05)


def test_sqrt_scaling_has_no_warm_up_by_default_and_an_optional_one():
    assert _at(SqrtScaling(base_lr=0.1), [0, 50], 128, 10, 10) == [0.2, 0.2]
    warmed = SqrtScaling(base_lr=0.1, warmup_epochs=1.0)
    np.testing.assert_allclose(_at(warmed, [0, 2, 4], 128, 4, 10), [0.1, 0.15, 0.2], rtol=1e-12)


def test_legw_schedule_at_chosen_updates():
    # k = 512 / 32 = 16: peak sqrt(16) * 0.1 = 0.4, warm-up 16 * 0.25 = 4 epochs of
    # 128 updates = 512 updates, quadratic decay from epoch 4 to 0 at epoch 10.
    rule = LEGW(base_lr=0.1, base_batch_size=32)
    steps = [0, 255, 511, 512, 896, 1151, 1280, 2000]
    rates = _at(rule, steps, batch_size=512, steps_per_epoch=128, n_epochs=10)
    expected = [
        0.4 / 512,  # the first update counts as 1 of 512: not zero
        0.4 * 256 / 512,
        0.4,  # last warm-up update reaches the peak
        0.4,  # decay starts at the peak
        0.4 * (1 - 3 / 6) ** 2,  # epoch 7, half way through the decay
        0.4 * (1 - (1151 / 128 - 4) / 6) ** 2,
        0.0,  # end of the run: end_lr
        0.0,
    ]
    np.testing.assert_allclose(rates, expected, rtol=1e-12, atol=1e-15)


def test_legw_warm_up_takes_as_many_updates_as_the_base_run():
    # 65536 samples: 2048 updates per epoch at the base batch 32, 128 at 512.
    rule = LEGW(base_lr=0.1, base_batch_size=32, base_warmup_epochs=0.25)
    base = rule.schedule(32, 3000, steps_per_epoch=65536 / 32, n_epochs=10)
    large = rule.schedule(512, 3000, steps_per_epoch=65536 / 512, n_epochs=10)
    # Both climb for 511 updates and reach their peak at update 511 (the 512th).
    for schedule in (base, large):
        assert int(np.argmax(schedule)) == 511
        assert np.all(np.diff(schedule[:512]) > 0)
    # The same shape, scaled by the peak: 0.1 at k = 1, 0.4 at k = 16.
    np.testing.assert_allclose(large[:512] / 0.4, base[:512] / 0.1, rtol=1e-12)


def test_legw_without_room_for_decay_stays_at_the_peak():
    # k = 64: a 16-epoch warm-up fills a 10-epoch run.
    rule = LEGW(base_lr=0.1, base_batch_size=32)
    rates = _at(rule, [31, 63, 64, 100], batch_size=2048, steps_per_epoch=4, n_epochs=10)
    np.testing.assert_allclose(rates, [0.8 * 32 / 64, 0.8, 0.8, 0.8], rtol=1e-12)


@pytest.mark.parametrize(
    ("decay_params", "steps", "expected"),
    [
        ({"decay": None}, [0, 49, 500], [1.0, 1.0, 1.0]),
        ({"decay": "polynomial", "end_lr": 0.1}, [0, 25, 50, 70], [1.0, 0.55, 0.1, 0.1]),
        ({"decay": "polynomial", "end_lr": 0.1, "decay_power": 2.0}, [25, 40], [0.325, 0.9 * 0.2**2 + 0.1]),
        ({"decay": "exponential", "decay_rate": 0.5, "decay_every": 2.0}, [0, 20, 30], [1.0, 0.5, 0.5**1.5]),
        ({"decay": "step", "decay_rate": 0.5, "decay_every": 2.0}, [0, 19, 20, 39, 40], [1.0, 1.0, 0.5, 0.5, 0.25]),
    ],
)
def test_decay_variants(decay_params, steps, expected):
    # 10 updates per epoch, a 5-epoch run, no warm-up.
    rates = _at(ConstantRule(1.0, **decay_params), steps, batch_size=32, steps_per_epoch=10, n_epochs=5)
    np.testing.assert_allclose(rates, expected, rtol=1e-12)


def test_decay_starts_at_the_end_of_the_warm_up():
    rule = LinearScaling(base_lr=0.1, base_batch_size=32, warmup_epochs=1.0, decay="step", decay_rate=0.5)
    np.testing.assert_allclose(_at(rule, [5, 10, 19, 20, 30], 64, 10, 5), [0.15, 0.2, 0.2, 0.1, 0.05], rtol=1e-12)
    polynomial = LinearScaling(base_lr=0.1, base_batch_size=32, warmup_epochs=1.0, decay="polynomial")
    np.testing.assert_allclose(_at(polynomial, [10, 30, 50], 64, 10, 5), [0.2, 0.1, 0.0], rtol=1e-12)


def test_end_lr_above_the_peak_is_allowed():
    rule = ConstantRule(0.1, decay="polynomial", end_lr=0.3)
    np.testing.assert_allclose(_at(rule, [0, 1, 2], 1, 1, 2), [0.1, 0.2, 0.3], rtol=1e-12)


def test_eigenpro_rule_is_the_analytic_step_times_scale():
    # beta = 2, lambda_1 = 0.01: critical batch 200.
    spectrum = dict(beta=2.0, top_eigenvalue=0.01)
    assert _at(EigenProRule(), [0], 100, 1, 1, **spectrum) == [50.0]
    assert _at(EigenProRule(scale=0.5), [0, 9], 100, 1, 1, **spectrum) == [25.0, 25.0]
    above = _at(EigenProRule(), [0], 1000, 1, 1, **spectrum)[0]
    assert above == pytest.approx(0.99 * 2 * 1000 / (2 + 999 * 0.01))
    for batch_size in (1, 200, 201, 10**5):
        context = ScheduleContext(batch_size, 1, 1, **spectrum)
        assert EigenProRule().peak_lr(context) == eigenpro_step_size(batch_size, 2.0, 0.01)
    decaying = EigenProRule(decay="exponential", decay_rate=0.5)
    assert _at(decaying, [0, 4, 8], 100, 4, 10, **spectrum) == [50.0, 25.0, 12.5]


def test_optimal_step_saturates_at_half_the_edge():
    spectrum = {"beta": 2.0, "top_eigenvalue": 0.01}  # m* = 200
    optimal = EigenProRule(step="optimal")
    for batch_size in (1, 50, 200, 1000, 10**6):
        expected = batch_size / (2.0 + (batch_size - 1) * 0.01)
        assert optimal.peak_lr(ScheduleContext(batch_size, 1, 1, **spectrum)) == pytest.approx(expected, rel=1e-12)
    assert optimal.peak_lr(ScheduleContext(1, 1, 1, **spectrum)) == 0.5, "m = 1: 1 / beta, as the maximal rule"
    huge = ScheduleContext(10**9, 1, 1, **spectrum)
    assert optimal.peak_lr(huge) == pytest.approx(1 / 0.01, rel=1e-6)
    assert EigenProRule().peak_lr(huge) == pytest.approx(0.99 * 2 / 0.01, rel=1e-6)
    assert resolve_scaling_rule("optimal").get_params() == optimal.get_params()


def test_eigenpro_rule_without_the_spectrum_says_so():
    assert EigenProRule.requires_spectrum
    assert not any(
        rule.requires_spectrum for name, rule in SCALING_RULES.items() if name not in ("eigenpro", "optimal")
    )
    with pytest.raises(ValueError, match="EigenProRule needs the spectrum"):
        EigenProRule()(0, ScheduleContext(32, 10, 1))
    with pytest.raises(ValueError, match="EigenProRule needs the spectrum"):
        EigenProRule().schedule(32, 3, steps_per_epoch=10, n_epochs=1, beta=1.0)


def test_rates_are_python_floats():
    context = ScheduleContext(64, np.float64(10.0), 5, beta=np.float64(1.0), top_eigenvalue=np.float64(0.1))
    for name, cls in SCALING_RULES.items():
        rule = cls()
        assert type(rule(3, context)) is float, name
        assert type(rule.peak_lr(context)) is float, name


def test_a_subclass_implementing_peak_lr_only_is_constant_in_time():
    class InverseBatch(ScalingRule):
        def __init__(self, numerator=1.0):
            self.numerator = numerator

        def peak_lr(self, context):
            return self.numerator / context.batch_size

    np.testing.assert_array_equal(InverseBatch(2.0).schedule(8, 5, steps_per_epoch=2, n_epochs=1), np.full(5, 0.25))
    with pytest.raises(NotImplementedError, match="peak_lr"):
        ScalingRule()(0, ScheduleContext(8, 2, 1))


# --- names, validation, cloning --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCALING_RULES))
def test_aliases_resolve_to_new_default_rules(name):
    first, second = resolve_scaling_rule(name), resolve_scaling_rule(name)
    assert type(first) is SCALING_RULES[name] and first is not second
    expected = SCALING_RULES[name](step="optimal") if name == "optimal" else SCALING_RULES[name]()
    assert first.get_params() == expected.get_params()


@pytest.mark.parametrize("spec", ["adam", "EigenPro", 0.1, None, LEGW])
def test_unknown_scaling_rules_list_the_aliases(spec):
    with pytest.raises(ValueError, match=r"constant.*eigenpro.*legw.*linear.*sqrt"):
        resolve_scaling_rule(spec)


def test_resolve_clones_an_instance_and_leaves_it_alone():
    rule = LEGW(base_lr=0.3, decay="step")
    resolved = resolve_scaling_rule(rule)
    assert resolved is not rule and resolved.get_params() == rule.get_params()
    resolved.set_params(base_lr=1.0)
    assert rule.base_lr == 0.3


@pytest.mark.parametrize(
    ("rule", "name"),
    [
        (LinearScaling(base_lr=0.0), "base_lr"),
        (ConstantRule(base_lr=-1.0), "base_lr"),
        (ConstantRule(base_lr="0.1"), "base_lr"),
        (LinearScaling(base_batch_size=0), "base_batch_size"),
        (SqrtScaling(base_batch_size=2.5), "base_batch_size"),
        (LinearScaling(warmup_epochs=-1.0), "warmup_epochs"),
        (LEGW(base_warmup_epochs=-0.25), "base_warmup_epochs"),
        (ConstantRule(decay="cosine"), "decay"),
        (LEGW(decay_power=0.0), "decay_power"),
        (ConstantRule(end_lr=-0.1), "end_lr"),
        (ConstantRule(decay_rate=0.0), "decay_rate"),
        (ConstantRule(decay_rate=1.5), "decay_rate"),
        (SqrtScaling(decay_every=0.0), "decay_every"),
        (EigenProRule(scale=0.0), "scale"),
        (EigenProRule(scale=-2), "scale"),
    ],
)
def test_invalid_parameters_are_named(rule, name):
    pattern = f"'{name}' parameter of {type(rule).__name__}"
    with pytest.raises(ValueError, match=pattern):
        resolve_scaling_rule(rule)
    with pytest.raises((ValueError, TypeError), match=pattern):
        rule.schedule(32, 3, steps_per_epoch=10, n_epochs=1, beta=1.0, top_eigenvalue=0.1)


def test_boundary_parameters_are_valid():
    for rule in [
        ConstantRule(1e-9, end_lr=5.0),  # end_lr above base_lr is allowed
        LinearScaling(warmup_epochs=0),
        LEGW(base_warmup_epochs=0.0, base_batch_size=1),
        ConstantRule(decay="step", decay_rate=1.0),
    ]:
        resolve_scaling_rule(rule)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"steps_per_epoch": 0}, "steps_per_epoch"),
        ({"steps_per_epoch": math.inf}, "steps_per_epoch"),
        ({"n_epochs": 0.0}, "n_epochs"),
        ({"n_epochs": math.nan}, "n_epochs"),
    ],
)
def test_schedule_context_rejects_bad_fields(fields, name):
    with pytest.raises(ValueError, match=f"ScheduleContext.{name}"):
        ScheduleContext(**{"batch_size": 32, "steps_per_epoch": 10, "n_epochs": 1, **fields})


def test_schedule_rejects_a_negative_length_and_allows_zero():
    with pytest.raises(ValueError, match="n_steps"):
        ConstantRule().schedule(32, -1, steps_per_epoch=10, n_epochs=1)
    empty = ConstantRule().schedule(32, 0, steps_per_epoch=10, n_epochs=1)
    assert empty.shape == (0,) and empty.dtype == np.float64


@pytest.mark.parametrize("name", sorted(SCALING_RULES))
def test_rules_hold_no_state_and_survive_clone_and_pickle(name):
    rule = SCALING_RULES[name](decay="exponential")
    params = rule.get_params()
    spectrum = dict(beta=1.0, top_eigenvalue=0.05)
    schedule = rule.schedule(256, 50, steps_per_epoch=10, n_epochs=5, **spectrum)
    for step in range(20):
        rule(step, ScheduleContext(256, 10, 5, **spectrum))
    assert rule.get_params() == params
    for twin in (clone(rule), pickle.loads(pickle.dumps(rule))):
        assert twin.get_params() == params
        np.testing.assert_array_equal(twin.schedule(256, 50, steps_per_epoch=10, n_epochs=5, **spectrum), schedule)


# --- the contract check -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCALING_RULES))
@pytest.mark.parametrize("decay", [None, "polynomial", "exponential", "step"])
def test_check_scaling_rule_passes_for_the_built_in_rules(name, decay):
    check_scaling_rule(SCALING_RULES[name](decay=decay))


class _CountsItsCalls(ConstantRule):
    def __call__(self, step, context):
        self.n_calls_ = getattr(self, "n_calls_", 0) + 1
        return super().__call__(step, context)


class _DecaysWithItsCalls(ConstantRule):
    """Keeps its own step counter instead of using ``step``: training state in the rule."""

    def __call__(self, step, context):
        self.base_lr *= 0.99
        return float(self.base_lr)


class _ReturnsNaN(ConstantRule):
    def __call__(self, step, context):
        return math.nan if step == 7 else super().__call__(step, context)


class _ReturnsNumpy(ConstantRule):
    def __call__(self, step, context):
        return np.float64(super().__call__(step, context))


class _BrokenSchedule(ConstantRule):
    def schedule(self, batch_size, n_steps, **kwargs):
        return super().schedule(batch_size, n_steps, **kwargs).astype(np.float32)


class _NegativeAfterHorizon(ConstantRule):
    def __call__(self, step, context):
        return -0.1 if step / context.steps_per_epoch >= context.n_epochs else super().__call__(step, context)


@pytest.mark.parametrize(
    ("rule", "match"),
    [
        (_CountsItsCalls(), "changed its attributes"),
        (_DecaysWithItsCalls(), "not deterministic"),
        (_ReturnsNaN(), r"update 7: the learning rate nan is not finite"),
        (_ReturnsNumpy(), "not a Python float"),
        (_BrokenSchedule(), "float64 ndarray"),
        (_NegativeAfterHorizon(), "not finite and >= 0"),
        (ConstantRule, "not a ScalingRule"),
    ],
)
def test_check_scaling_rule_fails_for_broken_rules(rule, match):
    with pytest.raises(AssertionError, match=match):
        check_scaling_rule(rule)


def test_check_scaling_rule_names_the_rule():
    with pytest.raises(AssertionError, match=r"_ReturnsNaN\(\) at batch size 1"):
        check_scaling_rule(_ReturnsNaN())


# --- grid search through an estimator ----------------------------------------------------------


def _tiny_regression(n=80):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 3)
    return X, np.sin(X @ np.array([1.0, -0.5, 0.3]))


def test_grid_search_over_the_eigenpro_scale_leaves_the_user_rule_unchanged():
    X, y = _tiny_regression()
    rule = EigenProRule(scale=1.0, decay="exponential", decay_rate=0.5)
    params_before = rule.get_params()
    ids_before = {key: id(value) for key, value in params_before.items()}
    model = AdaptiveKernelRegressor(
        alpha=0.0, bandwidth=1.0, scaling_rule=rule, n_epochs=2, batch_size=16, random_state=0
    )
    search = GridSearchCV(model, {"scaling_rule__scale": [0.25, 1.0]}, cv=2).fit(X, y)
    assert search.best_params_ == {"scaling_rule__scale": 1.0}, "the larger stable step fits more in 2 epochs"
    best = search.best_estimator_
    assert best.scaling_rule is not rule and best.scaling_rule_.scale == 1.0
    assert best.scaling_rule_.decay == "exponential"
    assert rule.get_params() == params_before
    assert {key: id(value) for key, value in rule.get_params().items()} == ids_before
    assert model.scaling_rule is rule


def test_grid_search_over_base_lr_of_a_constant_rule():
    X, y = _tiny_regression()
    rule = ConstantRule()
    model = AdaptiveKernelRegressor(
        alpha=0.0, bandwidth=1.0, scaling_rule=rule, n_epochs=2, batch_size=16, n_components=0, random_state=0
    )
    search = GridSearchCV(model, {"scaling_rule__base_lr": [1e-3, 1.0]}, cv=2).fit(X, y)
    assert search.best_params_ == {"scaling_rule__base_lr": 1.0}
    assert search.best_estimator_.learning_rate_ == 1.0
    assert rule.get_params() == ConstantRule().get_params()


@pytest.mark.parametrize(
    ("rule", "batch_size", "n_epochs", "warns"),
    [
        (LinearScaling(), 256, 5, True),  # Goyal's 5-epoch warm-up fills a 5-epoch run
        (LinearScaling(), 256, 6, False),
        (LEGW(base_batch_size=32, base_warmup_epochs=0.25), 32 * 64, 10, True),  # 16 epochs
        (LEGW(base_batch_size=32, base_warmup_epochs=0.25), 32 * 16, 10, False),  # 4 epochs
        (ConstantRule(), 256, 1, False),
    ],
)
def test_a_warm_up_that_fills_the_run_is_reported(rule, batch_size, n_epochs, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_warmup_fills_run(rule, ScheduleContext(batch_size, 10, n_epochs))
    assert len(caught) == int(warns)
    if warns:
        assert "never reaches its peak" in str(caught[0].message)


def test_estimators_report_a_warm_up_that_fills_the_run():
    X, y = make_regression(n_samples=200, n_features=4, random_state=0)
    with pytest.warns(UserWarning, match="never reaches its peak"):
        BufferedSGDRegressor(scaling_rule=LinearScaling(base_lr=1e-3), n_epochs=2, batch_size=32).fit(X, y)
    with pytest.warns(UserWarning, match="never reaches its peak"):
        AdaptiveKernelRegressor(alpha=0.0, scaling_rule=LinearScaling(base_lr=1e-3), n_epochs=2, batch_size=32).fit(
            X, y
        )
