"""Class probabilities of AdaptiveKernelClassifier: temperature scaling on held-out decision values."""

import numpy as np
import pytest
from scipy.special import softmax
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.ensemble import StackingClassifier, VotingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skgpu_kernel import AdaptiveKernelClassifier
from skgpu_kernel.calibration import fit_temperature, log_probabilities
from skgpu_kernel.fit import feature_learning
from skgpu_kernel.planning import agop as planning_agop


def _sampled(n, n_classes, temperature, seed=0):
    """Decision values and labels drawn from ``softmax(S / temperature)`` (a sigmoid for one column)."""
    rng = np.random.RandomState(seed)
    columns = 1 if n_classes == 2 else n_classes
    decisions = rng.randn(n, columns)
    probabilities = np.exp(log_probabilities(decisions, temperature))
    labels = np.array([rng.choice(probabilities.shape[1], p=row) for row in probabilities])
    targets = np.where(labels == 1, 1.0, -1.0)[:, None] if n_classes == 2 else np.eye(n_classes)[labels]
    return decisions, targets, labels


@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("temperature", [0.3, 2.0])
def test_the_temperature_of_decision_values_drawn_at_it_is_found(n_classes, temperature):
    decisions, targets, _ = _sampled(20000, n_classes, temperature)
    found = fit_temperature(decisions, targets, np.ones(len(targets)))
    assert found == pytest.approx(temperature, rel=0.05)


def test_log_probabilities_are_the_sigmoid_and_the_softmax():
    scores = np.array([[-2.0], [0.0], [3.0]])
    expected = 1.0 / (1.0 + np.exp(-scores[:, 0] / 0.5))
    np.testing.assert_allclose(np.exp(log_probabilities(scores, 0.5))[:, 1], expected, rtol=1e-12)
    many = np.array([[1.0, 2.0, -1.0], [0.0, 0.0, 5.0]])
    np.testing.assert_allclose(np.exp(log_probabilities(many, 2.0)), softmax(many / 2.0, axis=1), rtol=1e-12)
    # Far from the boundary the logarithms stay finite where the probabilities underflow.
    assert np.isfinite(log_probabilities(np.array([[-1e4], [1e4]]), 1.0)).all()


def test_weights_count_as_repeated_rows_and_zero_weights_as_absent_ones():
    decisions, targets, _ = _sampled(600, 3, 0.7, seed=1)
    weights = np.random.RandomState(2).randint(0, 4, size=600).astype(float)
    weighted = fit_temperature(decisions, targets, weights)
    repeated = np.repeat(np.arange(600), weights.astype(int))
    plain = fit_temperature(decisions[repeated], targets[repeated], np.ones(len(repeated)))
    assert weighted == pytest.approx(plain, rel=0.01)  # the smoothing counts rows, not weights
    # Rows of weight 0 drawn at another temperature leave the fit as it is without them.
    sharp, sharp_targets, _ = _sampled(3000, 3, 0.3, seed=3)
    flat, flat_targets, _ = _sampled(3000, 3, 3.0, seed=4)
    both = np.vstack([sharp, flat]), np.vstack([sharp_targets, flat_targets])
    alone = fit_temperature(sharp, sharp_targets, np.ones(3000))
    assert fit_temperature(*both, np.repeat([1.0, 0.0], 3000)) == pytest.approx(alone, rel=0.01)
    assert fit_temperature(*both, np.ones(6000)) > 1.5 * alone


def test_held_out_rows_that_cannot_set_a_temperature_leave_it_at_one():
    decisions, targets, _ = _sampled(50, 2, 1.0)
    one_class = np.ones_like(targets)
    assert fit_temperature(decisions, one_class, np.ones(50)) == 1.0
    assert fit_temperature(decisions[:1], targets[:1], np.ones(1)) == 1.0


def test_separated_held_out_rows_set_a_finite_temperature():
    """Without smoothing the log loss of separated rows falls towards T = 0 and probabilities of 0 and 1."""
    decisions = np.concatenate([np.linspace(-1.5, -0.5, 50), np.linspace(0.5, 1.5, 50)])[:, None]
    targets = np.sign(decisions)
    temperature = fit_temperature(decisions, targets, np.ones(100))
    assert 0.01 < temperature < 1.0
    assert np.exp(log_probabilities(decisions, temperature)).max() < 1.0


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    return train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)


@pytest.mark.parametrize("feature_learning_mode", [None, "diagonal"])
def test_probabilities_follow_the_decision_function_and_improve_its_log_loss(cancer, feature_learning_mode):
    X, X_test, y, y_test = cancer
    model = AdaptiveKernelClassifier(feature_learning=feature_learning_mode, random_state=0).fit(X, y)
    probabilities = model.predict_proba(X_test)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(model.classes_[probabilities.argmax(axis=1)], model.predict(X_test))
    np.testing.assert_allclose(model.predict_log_proba(X_test), np.log(probabilities), rtol=1e-12)
    scores = model.decision_function(X_test)
    assert (np.diff(probabilities[np.argsort(scores), 1]) >= 0).all()
    # The fitted temperature against T = 1 (the codes' scale) on the test rows.
    untempered = np.exp(log_probabilities(scores, 1.0))
    assert log_loss(y_test, probabilities) < 0.75 * log_loss(y_test, untempered)


@pytest.mark.parametrize("n_rows", [None, 60])  # the held-out fit; under CALIBRATION_MIN_ROWS, the folds
def test_the_calibration_fits_leave_the_model_as_it_is_without_them(cancer, monkeypatch, n_rows):
    X, _, y, _ = cancer
    X, y = X[:n_rows], y[:n_rows]
    params = {"feature_learning": None, "random_state": 0}
    calibrated = AdaptiveKernelClassifier(**params).fit(X, y)
    monkeypatch.setattr(feature_learning, "plan_calibration", lambda *args: "none")
    plain = AdaptiveKernelClassifier(**params).fit(X, y)
    assert calibrated.calibration_ == ("held-out" if n_rows is None else "cross-fitted")
    assert plain.calibration_temperature_ == 1.0 and calibrated.calibration_temperature_ != 1.0
    np.testing.assert_array_equal(calibrated.dual_coef_, plain.dual_coef_)
    np.testing.assert_array_equal(calibrated.intercept_, plain.intercept_)
    with pytest.warns(UserWarning, match="not calibrated"):
        plain.predict_proba(X[:3])


def test_a_warm_start_keeps_the_temperature_of_the_fit_it_continues(cancer):
    X, _, y, _ = cancer
    model = AdaptiveKernelClassifier(feature_learning=None, warm_start=True, n_epochs=2, random_state=0).fit(X, y)
    first = model.calibration_temperature_
    assert model.fit(X, y).calibration_temperature_ == first


def test_probabilities_in_scikit_learns_meta_estimators():
    X, y = load_iris(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    ours = make_pipeline(StandardScaler(), AdaptiveKernelClassifier(random_state=0))
    search = GridSearchCV(ours, {"adaptivekernelclassifier__alpha": ["auto", 1e-3]}, scoring="neg_log_loss", cv=3)
    assert np.isfinite(search.fit(X_train, y_train).best_score_)
    logistic = make_pipeline(StandardScaler(), LogisticRegression())
    voting = VotingClassifier([("ours", ours), ("logistic", logistic)], voting="soft").fit(X_train, y_train)
    stacking = StackingClassifier([("ours", ours)], final_estimator=LogisticRegression(), cv=3).fit(X_train, y_train)
    calibrated = CalibratedClassifierCV(ours, cv=3).fit(X_train, y_train)
    uniform = log_loss(y_test, np.full((len(y_test), 3), 1 / 3))
    for model in (search, voting, stacking, calibrated):
        assert log_loss(y_test, model.predict_proba(X_test)) < 0.5 * uniform


@pytest.mark.parametrize(
    ("classifier", "learning", "n_samples", "in_memory", "distributed", "calibration"),
    [
        (True, None, 100, True, False, "held-out"),  # from CALIBRATION_MIN_ROWS on
        (True, None, 99, True, False, "cross-fitted"),
        (True, "diagonal", 99, True, False, "held-out"),  # feature learning's split calibrates
        (True, "diagonal", 30_000, True, False, "held-out"),
        (True, "diagonal", 30_001, True, False, "final-held-out"),  # the final fit leaves rows out
        (True, None, 30_001, True, False, "final-held-out"),
        (False, None, 10_000, True, False, None),  # a regressor has no probabilities
        (True, None, 10_000, False, False, "none"),  # a memory map would be copied
        (True, None, 10_000, True, True, "none"),  # a process group's rows
    ],
)
def test_the_calibration_rule(classifier, learning, n_samples, in_memory, distributed, calibration):
    assert planning_agop.plan_calibration(classifier, learning, n_samples, in_memory, distributed) == calibration


def test_a_small_fit_is_calibrated_on_cross_fitted_decision_values():
    X, y = load_iris(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, train_size=60, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), AdaptiveKernelClassifier(random_state=0)).fit(X_train, y_train)
    classifier = model[-1]
    assert classifier.calibration_ == "cross-fitted" and classifier.calibration_temperature_ != 1.0
    scores = model.decision_function(X_test)
    untempered = np.exp(log_probabilities(scores, 1.0))  # T = 1: the codes' scale, far from the labels' rates
    assert log_loss(y_test, model.predict_proba(X_test)) < 0.6 * log_loss(y_test, untempered)


def test_above_the_learning_path_rows_the_final_model_leaves_out_the_rows_that_calibrate_it(cancer, monkeypatch):
    X, X_test, y, _ = cancer
    monkeypatch.setattr(planning_agop, "LEARNING_PATH_MAX_ROWS", 300)
    monkeypatch.setattr(feature_learning, "CALIBRATION_HELD_OUT_ROWS", 60)
    drawn = []
    draw = feature_learning._rows_left_out
    monkeypatch.setattr(feature_learning, "_rows_left_out", lambda *args: drawn.append(draw(*args)) or drawn[-1])
    params = {"feature_learning": None, "random_state": 0, "dtype": "float64"}
    model = AdaptiveKernelClassifier(**params, warm_start=True).fit(X, y)
    assert model.calibration_ == "final-held-out" and model.calibration_temperature_ != 1.0
    held_out, temperature, scores = drawn[0].held_out, model.calibration_temperature_, model.decision_function(X_test)
    assert held_out.X.shape[0] == 60 and drawn[0].training.X.shape[0] == X.shape[0] - 60
    # A warm start continues the model on the same rows (the same draw), and keeps its temperature.
    model.fit(X, y)
    np.testing.assert_array_equal(drawn[1].held_out.X, held_out.X)
    assert model.calibration_temperature_ == temperature
    # The final model is the fit without those rows, and its own decision values on them set the temperature.
    left_out = (X[:, None, :] == held_out.X[None]).all(axis=2).any(axis=1)
    monkeypatch.setattr(feature_learning, "plan_calibration", lambda *args: "none")
    without = AdaptiveKernelClassifier(**params).fit(X[~left_out], y[~left_out])
    np.testing.assert_array_equal(scores, without.decision_function(X_test))
    targets = np.where(y[left_out] == model.classes_[1], 1.0, -1.0)[:, None]
    decisions = without.decision_function(X[left_out])[:, None]
    assert temperature == pytest.approx(fit_temperature(decisions, targets, np.ones(60)), rel=1e-9)
