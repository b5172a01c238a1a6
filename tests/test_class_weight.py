"""``class_weight`` on both classifiers: the same model as the equivalent ``sample_weight``.

scikit-learn's semantics: a dict ``{label: weight}`` (absent classes weigh 1), or
``"balanced"``, ``n / (n_classes * n_c)`` on the (sample-weighted) label counts,
multiplied into the user's ``sample_weight``.  The references below compute those
weights by hand; every fit uses fixed batch, buffer and memory settings, so the
class-weighted fit and the sample-weighted fit take the same path and must agree
to rounding, while the unweighted fit must differ.
"""

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

from skgpu_kernel import AdaptiveKernelClassifier, BufferedSGDClassifier

# The two fits compute the same thing in the same order: only rounding may differ.
TIGHT = {"float32": 1e-6, "float64": 1e-12}

CLASSIFIERS = {
    "eigenpro2": lambda **kw: AdaptiveKernelClassifier(
        bandwidth=1.5, n_epochs=4, batch_size=64, memory_budget="1GB", device="cpu", random_state=0, **kw
    ),
    "eigenpro3": lambda **kw: AdaptiveKernelClassifier(
        bandwidth=1.5,
        n_centers=60,
        solver="eigenpro",
        n_epochs=4,
        batch_size=64,
        memory_budget="1GB",
        device="cpu",
        random_state=0,
        **kw,
    ),
    "cg": lambda **kw: AdaptiveKernelClassifier(
        bandwidth=1.5,
        n_centers=60,
        alpha=1e-3,
        solver="cg",
        n_epochs=10,
        memory_budget="1GB",
        device="cpu",
        random_state=0,
        **kw,
    ),
    "bmgd": lambda **kw: BufferedSGDClassifier(
        n_epochs=3, batch_size=32, buffer_size=64, memory_budget="1GB", device="cpu", random_state=0, **kw
    ),
}


def _data(n_classes, n=240, seed=0):
    """Imbalanced classes (about 60%, 30%, 10% for three) that overlap, with string labels."""
    rng = np.random.RandomState(seed)
    shares = [0.6, 0.3, 0.1][:n_classes] if n_classes == 3 else [0.75, 0.25]
    labels = rng.choice(n_classes, size=n, p=np.array(shares) / sum(shares))
    X = rng.randn(n, 4) + 0.8 * labels[:, None]
    names = np.array(["cat", "dog", "eel"])[:n_classes]
    return X, names[labels], labels


def _balanced(labels, n_classes, sample_weight=None):
    """The balanced weight of each sample, by hand: n / (n_classes * n_c) on weighted counts."""
    weights = np.ones(labels.shape[0]) if sample_weight is None else sample_weight
    counts = np.bincount(labels, weights=weights, minlength=n_classes)
    return weights.sum() / (n_classes * counts[labels])


def _assert_same_model(a, b, X, dtype):
    scores_a, scores_b = a.decision_function(X), b.decision_function(X)
    scale = np.abs(scores_b).max()
    np.testing.assert_allclose(scores_a, scores_b, rtol=TIGHT[dtype], atol=TIGHT[dtype] * scale)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def _assert_different_model(a, b, X):
    scores_a, scores_b = a.decision_function(X), b.decision_function(X)
    assert np.abs(scores_a - scores_b).max() > 1e-2 * np.abs(scores_b).max()


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
@pytest.mark.parametrize("n_classes", [2, 3])
def test_balanced_is_the_balanced_sample_weight(name, n_classes, dtype):
    X, y, labels = _data(n_classes)
    make = CLASSIFIERS[name]
    weighted = make(class_weight="balanced", dtype=dtype).fit(X, y)
    reference = make(dtype=dtype).fit(X, y, sample_weight=_balanced(labels, n_classes))
    _assert_same_model(weighted, reference, X, dtype)
    _assert_different_model(weighted, make(dtype=dtype).fit(X, y), X)


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_dict_is_multiplied_into_sample_weight(name, dtype):
    X, y, labels = _data(3)
    sample_weight = np.random.RandomState(1).uniform(0.5, 2.0, size=y.shape[0])
    class_weight = {"cat": 0.5, "eel": 4.0}  # "dog" is absent: weight 1
    per_class = np.array([0.5, 1.0, 4.0])
    make = CLASSIFIERS[name]
    weighted = make(class_weight=class_weight, dtype=dtype).fit(X, y, sample_weight=sample_weight)
    reference = make(dtype=dtype).fit(X, y, sample_weight=sample_weight * per_class[labels])
    _assert_same_model(weighted, reference, X, dtype)
    _assert_different_model(weighted, make(dtype=dtype).fit(X, y, sample_weight=sample_weight), X)


@pytest.mark.parametrize("name", ["eigenpro2", "bmgd"])
def test_balanced_counts_are_weighted_by_sample_weight(name):
    """As scikit-learn's compute_class_weight with sample_weight (and LogisticRegression)."""
    X, y, labels = _data(3)
    sample_weight = np.random.RandomState(2).uniform(0.0, 3.0, size=y.shape[0])
    make = CLASSIFIERS[name]
    weighted = make(class_weight="balanced", dtype="float64").fit(X, y, sample_weight=sample_weight)
    expected = sample_weight * _balanced(labels, 3, sample_weight)
    reference = make(dtype="float64").fit(X, y, sample_weight=expected)
    _assert_same_model(weighted, reference, X, "float64")
    unweighted_counts = sample_weight * _balanced(labels, 3)
    _assert_different_model(weighted, make(dtype="float64").fit(X, y, sample_weight=unweighted_counts), X)


def test_balanced_weights_are_scikit_learns():
    """The hand-computed reference is scikit-learn's compute_class_weight."""
    from sklearn.utils.class_weight import compute_class_weight

    _, y, labels = _data(3)
    sklearn_weights = compute_class_weight("balanced", classes=np.unique(y), y=y)
    np.testing.assert_allclose(_balanced(labels, 3), sklearn_weights[labels], rtol=1e-15)
    np.testing.assert_allclose(sklearn_weights, [240 / (3 * np.sum(labels == c)) for c in range(3)], rtol=1e-15)


def test_zero_class_weight_drops_the_class_rows():
    """A zero weight drops the rows, as sample_weight=0 does (kernel machine: those centers go)."""
    X, y, labels = _data(3)
    weighted = CLASSIFIERS["eigenpro2"](class_weight={"eel": 0.0}, dtype="float64").fit(X, y)
    dropped = CLASSIFIERS["eigenpro2"](dtype="float64").fit(X, y, sample_weight=(labels != 2).astype(float))
    assert weighted.n_centers_ == np.sum(labels != 2)
    _assert_same_model(weighted, dropped, X, "float64")


@pytest.mark.parametrize("name", ["eigenpro2", "bmgd"])
def test_unknown_dict_labels_raise_as_in_scikit_learn(name):
    X, y, _ = _data(3)
    make = CLASSIFIERS[name]
    # A key that is no class while a class has no weight: scikit-learn's error.
    with pytest.raises(ValueError, match=r"The classes, \['dog', 'eel'\], are not in class_weight"):
        make(class_weight={"cat": 2.0, "cow": 3.0}).fit(X, y)
    # Extra keys with every class weighted are accepted, as scikit-learn does.
    extra = make(class_weight={"cat": 2.0, "dog": 1.0, "eel": 1.0, "cow": 3.0}, dtype="float64").fit(X, y)
    reference = make(class_weight={"cat": 2.0}, dtype="float64").fit(X, y)
    _assert_same_model(extra, reference, X, "float64")


@pytest.mark.parametrize("make", [AdaptiveKernelClassifier, BufferedSGDClassifier])
def test_invalid_class_weight_is_refused(make):
    X, y, _ = _data(2)
    with pytest.raises(InvalidParameterError, match="class_weight"):
        make(class_weight="auto").fit(X, y)
    with pytest.raises(ValueError, match="class_weight must be non-negative"):
        make(class_weight={"cat": -1.0}).fit(X, y)


def test_partial_fit_takes_a_dict_and_refuses_balanced():
    X, y, labels = _data(3)
    classes = np.unique(y)
    make = CLASSIFIERS["bmgd"]
    with pytest.raises(ValueError, match="class_weight='balanced' is not supported by partial_fit"):
        make(class_weight="balanced").partial_fit(X, y, classes=classes)
    weighted, reference = make(class_weight={"eel": 5.0}, dtype="float64"), make(dtype="float64")
    for part in (slice(0, 120), slice(120, None)):
        weighted.partial_fit(X[part], y[part], classes=classes)
        reference.partial_fit(X[part], y[part], classes=classes, sample_weight=np.where(labels[part] == 2, 5.0, 1.0))
    _assert_same_model(weighted, reference, X, "float64")


def test_balanced_on_an_npy_file(tmp_path):
    """An out-of-core X: y is read whole, so "balanced" counts every label."""
    X, y, labels = _data(3)
    path = tmp_path / "X.npy"
    np.save(path, X.astype(np.float32))
    make = CLASSIFIERS["bmgd"]
    weighted = make(class_weight="balanced").fit(str(path), y)
    reference = make().fit(str(path), y, sample_weight=_balanced(labels, 3))
    _assert_same_model(weighted, reference, X.astype(np.float32), "float32")
    _assert_different_model(weighted, make().fit(str(path), y), X.astype(np.float32))


def test_scikit_learns_class_weight_check_with_its_epoch_budget():
    """scikit-learn's check with its budget of 1000 passes, every one run (tol=None); test_common.py: the defaults."""
    from sklearn.utils.estimator_checks import check_class_weight_classifiers

    check_class_weight_classifiers(
        "BufferedSGDClassifier", BufferedSGDClassifier(n_epochs=1000, tol=None, random_state=0)
    )
