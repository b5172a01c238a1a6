"""The scaling rules by name, and how an estimator's ``scaling_rule`` parameter resolves to one.

The rules themselves (:class:`~skgpu_kernel.scaling.LinearScaling`,
:class:`~skgpu_kernel.scaling.SqrtScaling`, :class:`~skgpu_kernel.scaling.LEGW`,
:class:`~skgpu_kernel.scaling.ConstantRule`, :class:`~skgpu_kernel.scaling.EigenProRule`)
are in :mod:`skgpu_kernel.scaling`.
"""

from sklearn.base import clone

from ._warnings import warn_user
from .scaling import LEGW, ConstantRule, EigenProRule, LinearScaling, ScalingRule, SqrtScaling, WarmupDecayRule

__all__ = [
    "SCALING_RULES",
    "resolve_scaling_rule",
    "warn_if_warmup_fills_run",
]


SCALING_RULES = {
    "constant": ConstantRule,
    "linear": LinearScaling,
    "sqrt": SqrtScaling,
    "legw": LEGW,
    "eigenpro": EigenProRule,
    "optimal": EigenProRule,
}


# Aliases that name a rule with parameters other than its defaults.
_ALIAS_PARAMS = {"optimal": {"step": "optimal"}}


def resolve_scaling_rule(spec):
    """Turn an estimator's ``scaling_rule`` parameter into a validated rule of its own.

    Parameters
    ----------
    spec : str or ScalingRule
        A name from ``SCALING_RULES`` (a rule with default parameters;
        ``"optimal"`` is ``EigenProRule(step="optimal")``) or a rule instance, whose
        parameters are validated.

    Returns
    -------
    ScalingRule
        A new object: an instance passed in is cloned, never modified.

    Raises
    ------
    ValueError
        For an unknown name or another type of object; for an instance with an
        invalid parameter (``InvalidParameterError``, also a ``TypeError``, naming
        the parameter).

    Examples
    --------
    >>> from skgpu_kernel.scaling import LEGW
    >>> from skgpu_kernel.scaling_rules import resolve_scaling_rule
    >>> resolve_scaling_rule("sqrt")
    SqrtScaling()
    >>> rule = LEGW(base_lr=0.1)
    >>> resolved = resolve_scaling_rule(rule)
    >>> resolved, resolved is rule
    (LEGW(base_lr=0.1), False)
    """
    if isinstance(spec, str) and spec in SCALING_RULES:
        return SCALING_RULES[spec](**_ALIAS_PARAMS.get(spec, {}))
    if isinstance(spec, ScalingRule):
        rule = clone(spec)
        rule._validate_params()
        return rule
    hint = f" (pass an instance, {spec.__name__}(...))" if isinstance(spec, type) else ""
    raise ValueError(
        f"scaling_rule must be one of {sorted(SCALING_RULES)} or a ScalingRule instance, got {spec!r}{hint}."
    )


def warn_if_warmup_fills_run(rule, context):
    """Warn when ``rule``'s warm-up lasts the whole run, so its rate never reaches the peak.

    Warm-ups are counted in epochs (LEGW's grows with the batch), so a short run or
    a large batch can end inside them; the estimators call this before training.
    Rules without a warm-up, and user rules, never warn.

    Parameters
    ----------
    rule : ScalingRule
    context : ScheduleContext
        The run's operating batch, steps per epoch and epoch count.

    Examples
    --------
    >>> import warnings
    >>> from skgpu_kernel.scaling import LinearScaling, ScheduleContext
    >>> from skgpu_kernel.scaling_rules import warn_if_warmup_fills_run
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_warmup_fills_run(LinearScaling(), ScheduleContext(256, 100, n_epochs=3))
    >>> len(caught)
    1
    """
    if not isinstance(rule, WarmupDecayRule):
        return
    warmup_epochs = rule._warmup(context)[0]
    if warmup_epochs >= context.n_epochs:
        warn_user(
            f"{rule!r} warms up over {warmup_epochs:.3g} epochs at batch size {context.batch_size}, no shorter "
            f"than the {context.n_epochs:g}-epoch run: the learning rate never reaches its peak"
            + (" and never decays" if rule.decay is not None else "")
            + ". Shorten the warm-up or train for more epochs.",
            UserWarning,
        )
