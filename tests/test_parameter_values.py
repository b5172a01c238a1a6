"""Every documented value of every parameter of the kernel estimators, fitted once on a path that uses it.

The values come from the estimators' ``_parameter_constraints`` (each string option,
both booleans, None where allowed) and one number per interval; a value that only
acts on some path is fitted there (``CONTEXT``).  Each fit runs with ``verbose=1``
(the progress lines of every path are printed at least once), predicts finite
values and passes its last check (``fit_check_``).  A value added to the
constraints without a case here fails :func:`test_every_option_of_the_constraints_has_a_case`.
"""

import numpy as np
import pytest
import torch
from sklearn.utils._param_validation import StrOptions

import skgpu_kernel.planning.solver as planning_solver
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.scaling import LinearScaling

EVERY_POINT_EIGENPRO = {"solver": "eigenpro", "alpha": 0.0, "bandwidth": 2.0, "feature_learning": None}
CENTERS_EIGENPRO = {**EVERY_POINT_EIGENPRO, "n_centers": 60}

# (parameter, value) -> the other parameters its path needs (none: the defaults).
CONTEXT = {
    ("kernel", "gaussian"): {},
    ("kernel", "rbf"): {},
    ("kernel", "laplacian"): {},
    ("kernel", "cauchy"): {},
    ("kernel", "matern"): {},
    ("kernel", "instance"): {},
    ("bandwidth", "auto"): {},
    ("bandwidth", "scale"): {},
    ("bandwidth", "number"): {},
    ("kernel_params", None): {},
    ("kernel_params", "dict"): {"kernel": "matern"},
    ("bandwidth_search_size", "auto"): {},
    ("bandwidth_search_size", "number"): {},
    ("alpha", "auto"): {},
    ("alpha", "loo"): {},
    ("alpha", "number"): {"alpha": 0.1},
    ("fit_intercept", True): {},
    ("fit_intercept", False): {},
    ("batch_size", "auto"): EVERY_POINT_EIGENPRO,
    ("batch_size", "number"): EVERY_POINT_EIGENPRO,
    ("n_components", "auto"): EVERY_POINT_EIGENPRO,
    ("n_components", "number"): EVERY_POINT_EIGENPRO,
    ("subsample_size", "auto"): EVERY_POINT_EIGENPRO,
    ("subsample_size", "number"): EVERY_POINT_EIGENPRO,
    **{("scaling_rule", name): EVERY_POINT_EIGENPRO for name in ("constant", "linear", "sqrt", "legw", "eigenpro")},
    ("scaling_rule", "optimal"): EVERY_POINT_EIGENPRO,
    ("scaling_rule", "instance"): EVERY_POINT_EIGENPRO,
    ("early_stopping", True): EVERY_POINT_EIGENPRO,
    ("early_stopping", False): EVERY_POINT_EIGENPRO,
    ("early_stopping", "auto"): EVERY_POINT_EIGENPRO,
    ("tol", None): EVERY_POINT_EIGENPRO,
    ("tol", "number"): EVERY_POINT_EIGENPRO,
    ("device", "str"): {},
    ("device", "torch.device"): {},
    ("device", "list"): CENTERS_EIGENPRO,
    ("device", "tuple"): CENTERS_EIGENPRO,
    ("dtype", "float32"): {},
    ("dtype", "float64"): {},
    ("memory_budget", None): {},
    ("memory_budget", "number"): {},
    ("memory_budget", "str"): {},
    ("warm_start", True): EVERY_POINT_EIGENPRO,
    ("warm_start", False): {},
    ("n_centers", None): EVERY_POINT_EIGENPRO,
    ("n_centers", "auto"): {},
    ("n_centers", "number"): {},
    ("centers", None): {},
    ("centers", "array"): {"feature_learning": None},
    ("cache_kernel", True): EVERY_POINT_EIGENPRO,
    ("cache_kernel", False): EVERY_POINT_EIGENPRO,
    ("cache_kernel", "auto"): EVERY_POINT_EIGENPRO,
    ("kernel_cache_dtype", "auto"): EVERY_POINT_EIGENPRO,
    ("kernel_cache_dtype", "float16"): EVERY_POINT_EIGENPRO,
    ("kernel_cache_dtype", "float32"): EVERY_POINT_EIGENPRO,
    ("kernel_cache_dtype", "float64"): {**EVERY_POINT_EIGENPRO, "dtype": "float64"},
    ("projection", "auto"): CENTERS_EIGENPRO,
    ("projection", "exact"): CENTERS_EIGENPRO,
    ("projection", "iterative"): CENTERS_EIGENPRO,
    ("solver", "auto"): {},
    ("solver", "cg"): {"alpha": 0.1, "feature_learning": None},
    ("solver", "direct"): {"alpha": 0.1, "feature_learning": None},
    ("solver", "eigenpro"): {"alpha": 0.1, "feature_learning": None},
    ("distributed", False): {},
    ("feature_learning", None): {},
    ("feature_learning", "auto"): {},
    ("feature_learning", "diagonal"): {},
    ("feature_learning", "full"): {},
    ("feature_learning_iter", "number"): {"feature_learning": "diagonal"},
    ("categorical_features", "from_dtype"): {},
    ("categorical_features", "array"): {},
    ("categorical_features", None): {},
    ("column_scaling", "auto"): {},
    ("column_scaling", "standardize"): {},
    ("column_scaling", "none"): {},
    ("class_weight", "balanced"): {},
    ("class_weight", "dict"): {},
    ("class_weight", None): {},
}
# Fitted elsewhere, with the reason.
ELSEWHERE = {
    ("distributed", True): "needs a torch.distributed process group: tests/test_scale_out.py and test_parallel.py",
}
# Parameters whose values are any number of a range (one number is fitted, or none where every fit
# sets them): no string option, boolean or None among them.
NUMBERS = {
    "n_epochs": 5,
    "damping": 0.5,
    "validation_fraction": 0.2,
    "n_iter_no_change": 2,
    "random_state": 0,
    "verbose": 1,
}
NUMBER = {
    "bandwidth": 2.0,
    "alpha": 0.1,
    "batch_size": 32,
    "n_components": 20,
    "subsample_size": 100,
    "bandwidth_search_size": 120,
    "tol": 1e-3,
    "memory_budget": 2**28,
    "n_centers": 60,
    "feature_learning_iter": 2,
}


def _value(parameter, value, X):
    """The estimator's value of a case: the value itself, or one of the kind the case names."""
    if value == "number":
        return NUMBER[parameter]
    made = {
        ("kernel", "instance"): Gaussian(bandwidth=2.0),
        ("kernel_params", "dict"): {"nu": 1.5},
        ("scaling_rule", "instance"): LinearScaling(base_lr=0.5),
        ("device", "str"): "cpu",
        ("device", "torch.device"): torch.device("cpu"),
        ("device", "list"): ["cpu"],
        ("device", "tuple"): ("cpu",),
        ("memory_budget", "str"): "256MB",
        ("centers", "array"): X[::5],
        ("categorical_features", "array"): [3],
        ("class_weight", "dict"): {0: 1.0, 1: 2.0},
    }
    return made.get((parameter, value), value)


def _data(classifier):
    rng = np.random.RandomState(0)
    X = rng.randn(240, 4)
    X[:, 3] = rng.randint(0, 3, 240)  # a small integer column (a category where asked)
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(240)
    return X, (y > 0).astype(int) if classifier else y


def _estimators_for(parameter):
    return [AdaptiveKernelClassifier] if parameter == "class_weight" else [AdaptiveKernelRegressor]


CASES = [
    pytest.param(estimator, parameter, value, id=f"{estimator.__name__}-{parameter}={value}")
    for (parameter, value) in CONTEXT
    for estimator in _estimators_for(parameter)
]


def _options(constraints):
    """The named values of a parameter's constraints: string options, booleans, None, and the kinds taken."""
    options = set()
    for constraint in constraints:
        if isinstance(constraint, StrOptions):
            options |= set(constraint.options)
        elif constraint == "boolean":
            options |= {True, False}
        elif constraint is None:
            options.add(None)
    return options


def test_every_option_of_the_constraints_has_a_case():
    for estimator in (AdaptiveKernelRegressor, AdaptiveKernelClassifier):
        for parameter, constraints in estimator._parameter_constraints.items():
            if parameter in NUMBERS:
                continue
            named = {value for (name, value) in (*CONTEXT, *ELSEWHERE) if name == parameter}
            missing = _options(constraints) - named
            assert not missing, (estimator.__name__, parameter, missing)
            assert named, (estimator.__name__, parameter)


@pytest.mark.slow
@pytest.mark.parametrize(("estimator", "parameter", "value"), CASES)
def test_every_documented_value_fits(monkeypatch, capsys, estimator, parameter, value):
    # A few hundred rows take the paths of large data (CG on every point beyond Falkon's factors).
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 150)
    classifier = estimator is AdaptiveKernelClassifier
    X, y = _data(classifier)
    params = {"random_state": 0, "verbose": 1, "n_epochs": 20, **CONTEXT[parameter, value]}
    params[parameter] = _value(parameter, value, X)
    model = estimator(**params).fit(X, y)
    if parameter == "warm_start" and value is True:
        model.fit(X, y)
    assert capsys.readouterr().out  # verbose printed the path's decisions
    assert np.all(np.isfinite(model.predict(X)))
    assert model.fit_check_ is not None and model.fit_check_["passed"], model.fit_check_


def test_the_fit_reads_every_parameter_it_has_a_field_for():
    # A field of KernelFitParameters that the shell does not fill would silently keep its default.
    import dataclasses

    from skgpu_kernel.kernel_machines import _FIT_READS
    from skgpu_kernel.planning.parameters import KernelFitParameters

    resolved_or_renamed = {"classifier", "scaling_rule", "validation_score", "name", "cache_dtype"}
    fields = {field.name for field in dataclasses.fields(KernelFitParameters)}
    assert set(_FIT_READS) | resolved_or_renamed == fields
    for estimator in (AdaptiveKernelRegressor, AdaptiveKernelClassifier):
        assert set(_FIT_READS) <= set(estimator().get_params())
    parameters = AdaptiveKernelRegressor(bandwidth_search_size=321, feature_learning_iter=3)._fit_parameters()
    assert parameters.bandwidth_search_size == 321 and parameters.feature_learning_iter == 3
