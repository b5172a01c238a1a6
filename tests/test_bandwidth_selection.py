"""bandwidth="auto": the leave-one-out search of the bandwidth with the penalty, and the classifier's criterion."""

import numpy as np
import pytest
import torch
from sklearn.metrics import recall_score

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.kernels import Gaussian, Laplacian, auto_bandwidth
from skgpu_kernel.regularization import (
    BANDWIDTH_FACTORS,
    PENALTY_GRID,
    _half_octave_towards_the_better_octave,
    select_bandwidth,
)

from .test_regularization import kernel_features


def _kernel_expansion(factor, seed, n=1000, n_features=3):
    """A target drawn from the Gaussian kernel of bandwidth ``factor`` x the scale rule, plus 10% noise."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n, n_features)
    sigma = factor * auto_bandwidth(X)
    bumps = Gaussian(bandwidth=sigma)(torch.as_tensor(X), torch.as_tensor(rng.randn(60, n_features))).numpy()
    f = bumps @ rng.randn(60)
    return X, f + 0.1 * f.std() * rng.randn(n), sigma


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_auto_lands_within_one_grid_step_of_the_bandwidth_the_data_were_drawn_with(factor, seed):
    X, y, sigma = _kernel_expansion(factor, seed)
    model = AdaptiveKernelRegressor(random_state=0).fit(X, y)
    assert abs(np.log2(model.bandwidth_ / sigma)) <= 0.5 + 1e-9
    selection = model.bandwidth_selection_
    assert selection.bandwidth == model.bandwidth_ == model.kernel_.bandwidth
    assert selection.scale == pytest.approx(auto_bandwidth(X))
    np.testing.assert_allclose(selection.bandwidths, selection.scale * BANDWIDTH_FACTORS)
    assert selection.errors[np.argmin(np.abs(selection.bandwidths - model.bandwidth_))] == np.nanmin(selection.errors)


@pytest.mark.parametrize(
    "best, size, octave_scores, expected",
    [
        (4, 9, {2: (0.1,), 6: (0.2,)}, 3),  # the narrower octave scores lower: the narrower half-octave
        (4, 9, {2: (0.2,), 6: (0.1,)}, 5),
        (4, 9, {2: (0.1, 0.5), 6: (0.1, 0.4)}, 5),  # a classifier's tie on errors goes to the squared error
        (4, 9, {2: (0.1,), 6: (0.1,)}, 3),  # an exact tie: the narrower
        (0, 9, {}, 1),  # the narrowest end: its one neighbour
        (8, 9, {}, 7),  # the widest end
        (6, 7, {4: (0.1,)}, 5),  # capped at the rule (``widest=1``): the rule is the end
        (6, 8, {4: (0.1,)}, 5),  # a grid cut half an octave past best: its octave neighbour is beyond it
    ],
)
def test_the_half_octave_step_goes_towards_the_better_octave_neighbour(best, size, octave_scores, expected):
    assert _half_octave_towards_the_better_octave(octave_scores.__getitem__, best, size) == expected


@pytest.mark.parametrize("factor", [0.25, 0.5])
def test_the_search_scores_one_half_octave_neighbour_of_an_interior_best(factor):
    X, y, _ = _kernel_expansion(factor, seed=2, n=600)
    kernel = Gaussian(bandwidth=auto_bandwidth(X))
    Y = torch.as_tensor(y - y.mean())[:, None]
    search = select_bandwidth(kernel, torch.as_tensor(X), Y, None, 600)
    octaves = np.arange(0, len(BANDWIDTH_FACTORS), 2)
    best_octave = int(octaves[np.nanargmin(search.errors[octaves])])
    assert 0 < best_octave < len(BANDWIDTH_FACTORS) - 1  # interior: both octave neighbours scored
    lower, upper = search.errors[best_octave - 2], search.errors[best_octave + 2]
    towards, away = (best_octave - 1, best_octave + 1) if lower <= upper else (best_octave + 1, best_octave - 1)
    assert np.isfinite(search.errors[towards]) and np.isnan(search.errors[away])


def _brute_force_leave_one_out(phi, codes, weights, penalty, labels=None):
    """Weighted mean squared error (and misclassification) of ridge with an intercept refitted without each row."""
    n, k = phi.shape
    design = np.hstack([np.ones((n, 1)), phi])
    shrink = penalty * weights.sum() * np.diag([0.0] + [1.0] * k)  # the intercept is not penalised
    squared, wrong = 0.0, 0.0
    for i in range(n):
        rest = np.arange(n) != i
        weighted = design[rest] * weights[rest, None]
        coef = np.linalg.solve(weighted.T @ design[rest] + shrink, weighted.T @ codes[rest])
        predicted = design[i] @ coef
        squared += weights[i] * np.sum((codes[i] - predicted) ** 2)
        if labels is not None:
            guess = int(predicted[0] > 0) if codes.shape[1] == 1 else int(np.argmax(predicted))
            wrong += weights[i] * (guess != labels[i])
    return squared / weights.sum(), wrong / weights.sum()


@pytest.mark.parametrize("n_classes", [2, 3])
def test_the_search_scores_a_brute_force_leave_one_out(n_classes):
    rng = np.random.RandomState(n_classes)
    X = rng.randn(90, 2)
    labels = np.digitize(X[:, 0] + 0.5 * np.sin(3 * X[:, 1]) + 0.3 * rng.randn(90), [-0.4, 0.4][: n_classes - 1])
    codes = np.where(labels == 1, 1.0, -1.0)[:, None] if n_classes == 2 else np.eye(n_classes)[labels]
    intercept = codes.mean(axis=0)
    weights = rng.uniform(0.5, 2.0, size=90)
    kernel, X_t = Gaussian(bandwidth=auto_bandwidth(X)), torch.as_tensor(X)
    search = select_bandwidth(
        kernel,
        X_t,
        torch.as_tensor(codes - intercept),
        torch.as_tensor(weights),
        90,
        code_intercept=torch.as_tensor(intercept),
    )
    chosen = search.selection
    phi = kernel_features(Gaussian(bandwidth=search.bandwidth), X_t)  # every row a feature: kernel ridge
    # Away from interpolation, where the brute force's normal equations stay well conditioned.
    for index in np.flatnonzero(PENALTY_GRID >= 1e-5):
        squared, wrong = _brute_force_leave_one_out(phi, codes, weights, PENALTY_GRID[index], labels)
        assert chosen.loo_errors[index] == pytest.approx(squared, rel=1e-8)
        assert chosen.loo_misclassification[index] == pytest.approx(wrong, rel=1e-8, abs=1e-12)
    # Of the penalties within a standard error of the fewest misclassifications, the smallest squared error.
    n_effective = weights.sum() ** 2 / (weights**2).sum()
    fewest = chosen.loo_misclassification.min()
    band = fewest + np.sqrt(fewest * (1 - fewest) / n_effective)
    tied = np.flatnonzero(chosen.loo_misclassification <= band)
    assert len(tied) > 1  # the band is not empty of alternatives here: the rule is exercised
    assert chosen.penalty == PENALTY_GRID[tied[np.argmin(chosen.loo_errors[tied])]]
    scored = np.isfinite(search.errors)
    lowest = search.errors[scored].min()
    assert search.errors[np.flatnonzero(search.bandwidths == search.bandwidth)[0]] <= lowest + np.sqrt(
        lowest * (1 - lowest) / n_effective
    )


def test_scale_is_the_rule_and_a_fixed_bandwidth_is_not_searched():
    X, y, _ = _kernel_expansion(0.5, seed=3, n=600)
    rule = auto_bandwidth(X)
    scale = AdaptiveKernelRegressor(bandwidth="scale", random_state=0).fit(X, y)
    fixed = AdaptiveKernelRegressor(bandwidth=rule, random_state=0).fit(X, y)
    assert scale.bandwidth_ == rule and scale.bandwidth_selection_ is None and fixed.bandwidth_selection_ is None
    np.testing.assert_array_equal(scale.dual_coef_, fixed.dual_coef_)
    searched = AdaptiveKernelRegressor(random_state=0).fit(X, y)
    assert searched.bandwidth_ < rule  # the data's bandwidth is half the rule's
    assert searched.score(X, y) > scale.score(X, y)


def test_a_kernel_instance_with_an_auto_bandwidth_is_searched_and_one_with_scale_is_not():
    X, y, _ = _kernel_expansion(0.5, seed=4, n=500)
    searched = AdaptiveKernelRegressor(kernel=Laplacian(), random_state=0).fit(X, y)
    assert searched.bandwidth_selection_ is not None
    assert searched.kernel_.bandwidth == searched.bandwidth_selection_.bandwidth
    ruled = AdaptiveKernelRegressor(kernel=Laplacian(bandwidth="scale"), random_state=0).fit(X, y)
    assert ruled.bandwidth_selection_ is None and ruled.bandwidth_ == pytest.approx(auto_bandwidth(X))


def test_a_given_alpha_is_the_only_penalty_the_search_scores():
    X, y, _ = _kernel_expansion(0.5, seed=5, n=400)
    model = AdaptiveKernelRegressor(alpha=0.5, random_state=0).fit(X, y)
    assert model.alpha_ == 0.5 and model.alpha_selection_ is None
    np.testing.assert_allclose(model.bandwidth_selection_.selection.penalties, [0.5 / 400])


def test_beyond_the_searched_rows_no_bandwidth_wider_than_the_rule_is_taken():
    X, y, _ = _kernel_expansion(4.0, seed=6, n=600)  # smooth data: the searched rows prefer a wide kernel
    model = AdaptiveKernelRegressor(bandwidth_search_size=200, random_state=0).fit(X, y)
    selection = model.bandwidth_selection_
    assert selection.selection.n_rows == 200 and selection.bandwidth == selection.scale
    assert np.all(selection.bandwidths <= selection.scale)
    every_row = AdaptiveKernelRegressor(random_state=0).fit(X[:200], y[:200])
    assert every_row.bandwidth_ > every_row.bandwidth_selection_.scale


@pytest.mark.parametrize(
    ("bandwidth_search_size", "n_rows", "searched"),
    [("auto", 1000, 1000), ("auto", 1600, 1500), (300, 1000, 300), (2000, 1600, 1600)],
)
def test_the_search_scores_bandwidth_search_size_rows_or_every_row(bandwidth_search_size, n_rows, searched):
    X, y, _ = _kernel_expansion(1.0, seed=8, n=n_rows)
    model = AdaptiveKernelRegressor(
        bandwidth_search_size=bandwidth_search_size, solver="cg", feature_learning=None, random_state=0
    )
    model.fit(X, y)
    assert model.bandwidth_selection_.selection.n_rows == searched
    if searched == n_rows:  # every row searched, each a feature: the search's penalty is the criterion's
        assert model.alpha_ == model.bandwidth_selection_.selection.alpha


def test_bandwidth_search_size_is_ignored_where_the_bandwidth_is_given():
    X, y, _ = _kernel_expansion(1.0, seed=9, n=300)
    given = AdaptiveKernelRegressor(bandwidth=1.0, bandwidth_search_size=50, random_state=0).fit(X, y)
    plain = AdaptiveKernelRegressor(bandwidth=1.0, random_state=0).fit(X, y)
    assert given.bandwidth_selection_ is None
    np.testing.assert_array_equal(given.predict(X), plain.predict(X))


def test_verbose_prints_the_search(capsys):
    X, y, _ = _kernel_expansion(1.0, seed=7, n=300)
    AdaptiveKernelRegressor(verbose=1, random_state=0).fit(X, y)
    assert "leave-one-out error by bandwidth" in capsys.readouterr().out


def _noisy_imbalanced_digits(seed):
    """Digits with 90% of classes 3 and 8 dropped and 20% of the training labels replaced at random.

    The data of ``benchmarks/bench_class_weight.py``, whose table the user guide quotes.
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_class_weight import imbalanced_digits

    return imbalanced_digits(seed, noise=0.2)


@pytest.mark.slow
def test_balanced_class_weight_raises_minority_recall_with_the_defaults():
    # With noisy labels an interpolating classifier fits the majority's mislabelled
    # copies of the minority; weights act through the penalty they get by default.
    gains = []
    for seed in range(3):
        X_train, y_train, X_test, y_test = _noisy_imbalanced_digits(seed)
        recalls = []
        for class_weight in (None, "balanced"):
            model = AdaptiveKernelClassifier(class_weight=class_weight, random_state=0).fit(X_train, y_train)
            recalls.append(recall_score(y_test, model.predict(X_test), labels=[3, 8], average="macro"))
            assert model.alpha_ > 0 and model.alpha_selection_.loo_misclassification is not None
        gains.append(recalls[1] - recalls[0])
    assert np.mean(gains) >= 0.1


def test_a_warm_start_keeps_its_bandwidth_instead_of_searching_again():
    X, y, _ = _kernel_expansion(0.5, seed=8, n=400)
    model = AdaptiveKernelRegressor(alpha=0.0, n_epochs=2, warm_start=True, random_state=0).fit(X, y)
    first = model.bandwidth_
    model.set_params(random_state=1)  # a search would score other rows
    model.fit(X, y)
    assert model.bandwidth_ == first == model.kernel_.bandwidth and model.bandwidth_selection_ is None
    assert model.n_epochs_total_ == 4
