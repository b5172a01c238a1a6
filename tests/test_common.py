"""scikit-learn's estimator checks over every public estimator and its main parameter variants."""

import pytest
from sklearn.utils.estimator_checks import (
    check_estimators_pickle,
    check_fit_idempotent,
    check_fit_score_takes_y,
    check_n_features_in,
    check_param_validation,
    check_regressors_train,
    parametrize_with_checks,
)

from skgpu_kernel import (
    AdaptiveKernelClassifier,
    AdaptiveKernelRegressor,
    BufferedSGDClassifier,
    BufferedSGDRegressor,
)
from skgpu_kernel.parallel import DataParallel, Parle

# Default parameters: the checks' data sets are tiny, so the batch is bounded by the
# number of samples and the fits do not depend on the timing-based capacity probe.
# Each variant takes a different path through the planner and the solvers (as
# imbalanced-learn checks its estimators under several parameter sets): EigenPro 3
# with the exact and the iterative projection, cached or recomputed kernel columns,
# and the conjugate-gradient solver for centers (what solver="auto" picks when its
# p x p factors fit, as they do here) with a ridge penalty.
# A streamed fit needs a memory-mapped X, which the checks never pass, and a budget
# under the size of their tiny data sets, which no EigenPro 3 fit fits in: it is
# checked against the in-memory fit in tests/test_eigenpro3.py instead.
ESTIMATORS = [
    AdaptiveKernelRegressor(random_state=0),
    AdaptiveKernelClassifier(random_state=0),
    AdaptiveKernelRegressor(n_centers=50, solver="eigenpro", projection="exact", random_state=0),
    AdaptiveKernelRegressor(
        n_centers=50, solver="eigenpro", projection="iterative", cache_kernel=False, random_state=0
    ),
    AdaptiveKernelClassifier(n_centers=50, solver="eigenpro", random_state=0),
    AdaptiveKernelRegressor(n_centers=50, alpha=1e-3, random_state=0),
    AdaptiveKernelClassifier(n_centers=50, random_state=0),
    # alpha="loo": the leave-one-out penalty, then CG with every training point a center.
    AdaptiveKernelRegressor(alpha="loo", random_state=0),
    AdaptiveKernelClassifier(alpha="loo", random_state=0),
    # Feature learning: a metric from the AGOP, chosen on held-out rows (issue 43).
    AdaptiveKernelRegressor(feature_learning="diagonal", feature_learning_iter=2, random_state=0),
    AdaptiveKernelClassifier(feature_learning="full", feature_learning_iter=2, random_state=0),
    BufferedSGDRegressor(random_state=0),
    BufferedSGDClassifier(random_state=0),
]

# A parallel fit starts worker processes (about a second each fit on 2 cores): the
# checks that exercise the fit itself, not the full suite.
PARALLEL_ESTIMATORS = [
    BufferedSGDRegressor(parallel=DataParallel(n_workers=2), n_epochs=2, random_state=0),
    BufferedSGDRegressor(parallel=Parle(n_workers=2), n_epochs=2, random_state=0),
]
PARALLEL_CHECKS = [
    check_fit_score_takes_y,
    check_regressors_train,
    check_fit_idempotent,
    check_estimators_pickle,
    check_n_features_in,
]

_SGD_WEIGHT_REASON = (
    "EigenPro and BMGD are mini-batch SGD stopped after n_epochs. Repeating a sample k times puts "
    "k copies into the shuffled batches, which changes the batch composition, the number "
    "of steps per epoch and the random path, whereas a weight scales one copy's residual. "
    "Both runs converge to the same solution, but their finite-epoch iterates differ "
    "far beyond the check's rtol=1e-7 (scikit-learn exempts its SGD estimators for the "
    "same reason). tests/test_kernel_machines.py and tests/test_linear_model.py check the "
    "exact parts instead: unit weights equal no weights, and weights scale each sample's "
    "loss as documented. The kernel machines' CG solver for centers is exact, but "
    "bandwidth='auto' follows the variance of X, which repeated rows change and weights do "
    "not, and the centers are drawn from the rows; with the same kernel and centers, "
    "tests/test_accuracy_defaults.py checks that weights reach the exact weighted solution. "
    "alpha='loo' scores leave-one-out errors, and leaving one of k repeated rows out is "
    "not leaving out a weighted row (the copies stay); tests/test_regularization.py checks "
    "its weighted criterion against RidgeCV's."
)
_KERNEL_WEIGHT_REASON = (
    "The kernel machines meet it where the fit makes no choice from the data: with a fixed bandwidth and "
    "alpha the regressor passes this very check (tests/test_table_contract.py runs it), a weight of 0 being "
    "absent everywhere and the table encoding's statistics weighted as repeated rows. What still differs by "
    "default: bandwidth='auto' follows the spread of X, which repeated rows change and weights do not; "
    "alpha='auto' scores leave-one-out errors, and leaving one of k repeated rows out is not leaving out a "
    "weighted row (the copies stay; tests/test_regularization.py checks the weighted criterion against "
    "RidgeCV's); the classifier's probabilities are calibrated on held-out rows, where the copies of a "
    "repeated row fall on both sides of the split and a weighted row on one; and EigenPro's mini-batches "
    "(solver='eigenpro') hold k copies where a weight scales one (see the SGD estimators' reason)."
)
EXPECTED_FAILED_CHECKS = {
    "AdaptiveKernelRegressor": {
        "check_sample_weight_equivalence_on_dense_data": _KERNEL_WEIGHT_REASON,
        "check_sample_weight_equivalence_on_sparse_data": _KERNEL_WEIGHT_REASON,
    },
    "AdaptiveKernelClassifier": {
        "check_sample_weight_equivalence_on_dense_data": _KERNEL_WEIGHT_REASON,
        "check_sample_weight_equivalence_on_sparse_data": _KERNEL_WEIGHT_REASON,
    },
    "BufferedSGDRegressor": {
        "check_sample_weight_equivalence_on_dense_data": _SGD_WEIGHT_REASON,
        "check_sample_weight_equivalence_on_sparse_data": _SGD_WEIGHT_REASON,
    },
    "BufferedSGDClassifier": {
        "check_sample_weight_equivalence_on_dense_data": _SGD_WEIGHT_REASON,
        "check_sample_weight_equivalence_on_sparse_data": _SGD_WEIGHT_REASON,
    },
}


def _id(estimator):
    changed = estimator.get_params(deep=False)
    defaults = type(estimator)().get_params(deep=False)
    shown = {name: value for name, value in changed.items() if name != "random_state" and value != defaults[name]}
    return type(estimator).__name__ + "".join(f"-{name}={value!r}" for name, value in shown.items())


_EIGENPRO3_PENALTY_REASON = (
    "check_regressors_train sets alpha=0.01 on any estimator with an alpha parameter. "
    "With solver='eigenpro' and centers, EigenPro 3's projected SGD has no penalty term, "
    "so alpha > 0 is refused with a ValueError naming solver='cg' instead of being "
    "silently ignored; the same variant without alpha passes every other check, and the "
    "penalised model on centers is checked through the CG variant."
)


def _expected_failed_checks(estimator):
    expected = dict(EXPECTED_FAILED_CHECKS.get(type(estimator).__name__, {}))
    if isinstance(estimator, AdaptiveKernelRegressor) and estimator.solver == "eigenpro":
        expected["check_regressors_train"] = _EIGENPRO3_PENALTY_REASON
    return expected


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda est: type(est).__name__)
def test_no_expected_failures_without_reason(estimator):
    for reason in _expected_failed_checks(estimator).values():
        assert len(reason) > 40, "each expected failure needs a written, principled reason"


@pytest.mark.parametrize(
    "estimator", [type(estimator)() for estimator in ESTIMATORS[:2] + ESTIMATORS[-2:]], ids=lambda est: _id(est)
)
def test_every_parameter_has_a_constraint(estimator):
    check_param_validation(type(estimator).__name__, estimator)


@pytest.mark.slow
@pytest.mark.parametrize("check", PARALLEL_CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("estimator", PARALLEL_ESTIMATORS, ids=_id)
def test_parallel_estimators_pass_the_fit_checks(estimator, check):
    check(type(estimator).__name__, estimator)
