"""Problems made to break the kernel solvers (issue 62): every fit is checked, none is worse than the trivial one.

About 20 s on 2 CPU cores.  Generated, seeded problems (near-duplicate rows, many
0/1 columns, a tiny penalty, a target offset of 1e6, a column scaled by 1e6, constant columns, a kernel matrix
of numerical rank 10, a 1% minority class) are fitted by every solver that applies
(EigenPro 2 and CG on every point with a 16-bit cache forced or not, CG on
centers, EigenPro 3, the direct solve) in float32 and float64.  Each model is
compared with the exact penalised least-squares solution of the same model
(``f(x) = K(x, Z) a + b``, ``b`` unpenalised, on the model's own centers, solved
densely in float64) where its solver claims it, and with the trivial predictor
(the training targets' mean) on held-out rows always.  Faults are injected too: a
non-finite value in one kernel block, and a step made 100 times too large.

``FULL_KERNEL_CG_MAX_ROWS`` is lowered for the fits of CG on every point, as
``tests/test_full_kernel_cg.py`` does, so that a few hundred rows take the path
large data takes.
"""

import warnings

import numpy as np
import pytest
import torch

import skgpu_kernel.operators as operators
import skgpu_kernel.planning.kernel as planning_kernel
import skgpu_kernel.planning.solver as planning_solver
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.fit import tune
from skgpu_kernel.scaling import EigenProRule

N_TRAIN, N_TEST = 400, 400
BANDWIDTH, ALPHA = 2.0, 1e-2


def _smooth(X):
    return np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, -1]


def _plain(rng, n):
    X = rng.randn(n, 4)
    return X, _smooth(X) + 0.1 * rng.randn(n)


def _near_duplicates(rng, n):
    base = rng.randn(n // 2, 4)
    X = np.vstack([base, base + 1e-7 * rng.randn(*base.shape)])
    return X, _smooth(X) + 0.1 * rng.randn(n)


def _binary_columns(rng, n):
    X = rng.randint(0, 2, size=(n, 30)).astype(np.float64)
    return X, X[:, :5].sum(axis=1) - 2 * X[:, 5] * X[:, 6] + 0.1 * rng.randn(n)


def _offset_targets(rng, n):
    X = rng.randn(n, 4)
    return X, _smooth(X) + 1e6 + 0.1 * rng.randn(n)


def _scaled_column(rng, n):
    X = rng.randn(n, 4)
    y = _smooth(X) + 0.1 * rng.randn(n)
    X[:, 2] *= 1e6
    return X, y


def _constant_columns(rng, n):
    X = rng.randn(n, 6)
    X[:, 3:] = 5.0
    return X, np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)


def _rank_ten(rng, n):
    X = rng.randint(0, 10, size=(n, 1)).astype(np.float64) / 3.0
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.randn(n)


# name -> (rows maker, penalty): each draws training and test rows from one seed.
PROBLEMS = {
    "near duplicates": (_near_duplicates, ALPHA),
    "binary columns": (_binary_columns, ALPHA),
    "tiny penalty": (_plain, 1e-6),
    "target offset 1e6": (_offset_targets, ALPHA),
    "column scaled 1e6": (_scaled_column, ALPHA),
    "constant columns": (_constant_columns, ALPHA),
    "rank 10": (_rank_ten, ALPHA),
}


def _problem(name, seed=0):
    make, alpha = PROBLEMS[name]
    X, y = make(np.random.RandomState(seed), N_TRAIN + N_TEST)
    return X[:N_TRAIN], y[:N_TRAIN], X[N_TRAIN:], y[N_TRAIN:], alpha


# solver name -> estimator parameters (every point, unless n_centers is given)
SOLVERS = {
    "eigenpro2": {"solver": "eigenpro"},
    "cg every point": {"solver": "cg"},
    "cg centers": {"solver": "cg", "n_centers": 100},
    "eigenpro3": {"solver": "eigenpro", "n_centers": 100, "alpha": 0.0},  # EigenPro 3's SGD has no penalty
    "direct": {"solver": "auto"},
}
EVERY_POINT = ("eigenpro2", "cg every point")


def _cases():
    for problem in PROBLEMS:
        for solver in SOLVERS:
            for dtype in ("float32", "float64"):
                caches = ("auto", "float16") if solver in EVERY_POINT else ("auto",)
                for cache in caches:
                    yield pytest.param(problem, solver, dtype, cache, id=f"{problem}-{solver}-{dtype}-{cache}")


def _exact_predictions(model, X, y, X_test):
    """The exact minimiser of ``sum_i (y_i - K(x_i, Z) a - b)^2 + alpha a^T K(Z, Z) a`` on the model's centers.

    Solved as the least-squares problem ``[K_XZ 1; sqrt(alpha) S 0] [a; b] ~ [y; 0]``
    with ``S^T S = K_ZZ`` (from its eigendecomposition), by a QR-based solver in
    float64: no normal equations, whose squared condition number would cost the
    reference its digits.
    """
    encoding = model.table_encoding_
    rows = torch.as_tensor(encoding.transform(X), dtype=torch.float64)
    test = torch.as_tensor(encoding.transform(X_test), dtype=torch.float64)
    centers = torch.as_tensor(model.centers_, dtype=torch.float64)
    kernel = model.kernel_
    eigenvalues, eigenvectors = torch.linalg.eigh(kernel(centers, centers))
    root = eigenvalues.clamp_min(0.0).sqrt()[:, None] * eigenvectors.T  # root.T @ root = K(Z, Z)
    data_rows = torch.cat([kernel(rows, centers), torch.ones(rows.shape[0], 1, dtype=torch.float64)], 1)
    penalty_rows = torch.cat([np.sqrt(model.alpha_) * root, torch.zeros(root.shape[0], 1, dtype=torch.float64)], 1)
    targets = torch.cat([torch.as_tensor(y, dtype=torch.float64), torch.zeros(root.shape[0], dtype=torch.float64)])
    design = torch.cat([data_rows, penalty_rows]).numpy()
    solution = np.linalg.lstsq(design, targets.numpy(), rcond=None)[0]
    test_design = torch.cat([kernel(test, centers), torch.ones(test.shape[0], 1, dtype=torch.float64)], 1)
    return test_design.numpy() @ solution


def _not_worse(differences):
    """Paired differences of squared errors (model minus trivial): not above zero by two standard errors."""
    return differences.mean() <= 2.0 * differences.std(ddof=1) / np.sqrt(differences.size)


def _not_worse_than_trivial(predictions, y_test, y_train):
    return _not_worse((predictions - y_test) ** 2 - (y_train.mean() - y_test) ** 2)


@pytest.fixture
def cg_on_every_point(monkeypatch):
    """Fits of more than 200 rows with every point a center take CG on every point (not its factors)."""
    monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)


def _fit(problem, solver, dtype, cache, quiet=True, **extra):
    X, y, X_test, y_test, alpha = _problem(problem)
    params = dict(
        bandwidth=BANDWIDTH,
        alpha=alpha,
        dtype=dtype,
        kernel_cache_dtype=cache,
        early_stopping=False,
        feature_learning=None,
        random_state=0,
    )
    params.update(SOLVERS[solver])
    params.update(extra)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")  # fallbacks warn; their record is asserted instead
        model = AdaptiveKernelRegressor(**params).fit(X, y)
    return model, X, y, X_test, y_test


def _exact_tolerance(model, problem, dtype):
    """The relative prediction error against the exact solution the fit claims, or None where it claims none.

    Only CG and the direct solve claim the penalised solution, CG where its
    residual met the tolerance stated for the dtype (1e-6 in float64, the rounding
    floor 1e-2 below; ``planning.stopping``).  Float32 CG on centers stops at that
    floor, a few percent from the exact predictions (measured up to 8.5e-2); a
    16-bit cache the user named beyond its bound perturbs the system by its
    rounding (measured up to 1.3e-2); float32 cannot resolve the solution at the
    penalty 1e-6, whose coefficients cancel to 7 digits.
    """
    if model.solver_ not in ("cg", "direct") or (problem == "tiny penalty" and dtype == "float32"):
        return None
    residual = model.history_[-1]["relative_residual"] if model.history_ else 0.0
    if residual > (1e-6 if dtype == "float64" else 1e-2):
        return None
    if model.kernel_cache_dtype_ == "float16":
        return 5e-2
    if dtype == "float64":
        return 1e-4
    return 0.15 if model.n_centers_ < N_TRAIN else 1e-3


@pytest.mark.parametrize(("problem", "solver", "dtype", "cache"), list(_cases()))
def test_every_solver_on_every_stress_problem(monkeypatch, problem, solver, dtype, cache):
    if cache == "float16" and dtype == "float64" and solver == "eigenpro2":
        pytest.skip("a 16-bit cache of a float64 EigenPro fit is the float32 case's rounding")
    if solver == "cg every point":
        monkeypatch.setattr(planning_solver, "FULL_KERNEL_CG_MAX_ROWS", 200)
    model, X, y, X_test, y_test = _fit(problem, solver, dtype, cache)
    assert solver != "direct" or model.solver_ == "direct"
    predictions = model.predict(X_test)
    assert np.all(np.isfinite(predictions))
    assert model.fit_check_["passed"], model.fit_check_
    assert _not_worse_than_trivial(predictions, y_test, y)
    tolerance = _exact_tolerance(model, problem, dtype)
    if tolerance is not None:
        exact = _exact_predictions(model, X, y, X_test)
        spread = np.linalg.norm(exact - exact.mean())
        assert np.linalg.norm(predictions - exact) <= tolerance * spread


def test_a_forced_16_bit_cache_at_a_tiny_penalty_falls_back_to_32_bits(cg_on_every_point):
    """CG on every point with a 16-bit ``K`` whose rounding exceeds the penalty: the divergence is caught.

    On 3000 rows in 2 dimensions the rounding's spectral norm is about 0.014,
    above the penalty 0.003 (whose preconditioned condition, about 80, keeps CG):
    before issue 62 this fit returned a model with test MSE 583 against the
    targets' variance of 2.5, with no fallback.
    """
    rng = np.random.RandomState(0)
    X = rng.randn(3500, 2)
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, -1] + 0.3 * rng.randn(3500) + 5
    params = dict(alpha=3e-3, bandwidth=2.0, solver="cg", kernel_cache_dtype="float16", feature_learning=None)
    with pytest.warns(Warning, match="16-bit kernel cache"):
        model = AdaptiveKernelRegressor(random_state=0, **params).fit(X[:3000], y[:3000])
    reasons = [attempt.get("reason", "") for attempt in model.fit_attempts_]
    assert [attempt["solver"] for attempt in model.fit_attempts_] == ["cg", "cg"]
    assert "16-bit kernel cache" in reasons[1] and model.kernel_cache_dtype_ == "float32"
    test_error = np.mean((model.predict(X[3000:]) - y[3000:]) ** 2)
    assert test_error < 0.2 * np.var(y[3000:]) and model.fit_check_["passed"]


def test_auto_never_gives_cg_a_16_bit_cache_its_penalty_cannot_absorb(cg_on_every_point, monkeypatch):
    """With only 16 bits fitting the budget, ``"auto"`` keeps CG's products exact rather than round them."""
    monkeypatch.setattr(planning_kernel, "_cache_itemsizes", lambda problem, cache_dtype: [2])
    model, *_ = _fit("near duplicates", "cg every point", "float32", "auto")
    assert model.solver_ == "cg" and not model.kernel_cached_


def test_cg_without_a_cache_and_with_progress_fits(cg_on_every_point, capsys):
    """``cache_kernel=False`` with CG on every point and ``verbose=1`` (it crashed in the epochs' report)."""
    model, X, y, *_ = _fit("near duplicates", "cg every point", "float32", "auto", cache_kernel=False)
    model.set_params(verbose=1).fit(X, y)
    out = capsys.readouterr().out
    assert model.solver_ == "cg" and not model.kernel_cached_
    assert "a typical epoch" in out and "evaluated K(X, X)" in out and "last check passed" in out


def test_a_non_finite_kernel_block_is_caught(cg_on_every_point, monkeypatch):
    """One kernel block made NaN in the middle of the fit: the model is finite and better than the trivial one.

    EigenPro rolls the epoch back and halves its step (recorded); CG stops at the
    non-finite merit with its best iterate (a warning), or the driver refits.
    """
    calls = {"n": 0, "poison": None}
    block = operators.core._PreparedBlocks.block

    def counted(self, rows, left, right, fresh=False):
        out = block(self, rows, left, right, fresh)
        calls["n"] += 1
        if calls["n"] == calls["poison"]:
            out = out.clone()
            out[0, 0] = float("nan")
        return out

    monkeypatch.setattr(operators.core._PreparedBlocks, "block", counted)
    for solver in ("eigenpro2", "cg every point"):
        calls.update(n=0, poison=None)
        _fit("constant columns", solver, "float32", "auto", cache_kernel=False)
        calls.update(poison=calls["n"] // 2, n=0)
        with pytest.warns(RuntimeWarning, match="diverged|grew to nan"):
            model, _, y, X_test, y_test = _fit("constant columns", solver, "float32", "auto", False, cache_kernel=False)
        assert calls["n"] > calls["poison"], solver  # the fault happened
        predictions = model.predict(X_test)
        assert np.all(np.isfinite(predictions)) and _not_worse_than_trivial(predictions, y_test, y), solver
        assert model.fit_check_["passed"], solver
        if solver == "eigenpro2":
            assert [attempt["stage"] for attempt in model.fit_attempts_ if attempt.get("event")] == ["epoch"]


def test_a_step_100_times_too_large_is_halved_and_recorded():
    """EigenPro with a step 100x its analytic rule's: rolled back and halved, each halving in ``fit_attempts_``."""
    X, y, X_test, y_test, _ = _problem("binary columns")
    params = dict(bandwidth=BANDWIDTH, alpha=0.0, solver="eigenpro", feature_learning=None, random_state=0)
    params.update(early_stopping=False, n_epochs=30)
    with pytest.warns(RuntimeWarning, match="diverged"):
        model = AdaptiveKernelRegressor(scaling_rule=EigenProRule(scale=100.0), **params).fit(X, y)
    halvings = [attempt for attempt in model.fit_attempts_ if attempt.get("event") == "diverged"]
    assert len(halvings) >= 5 and all(event["changed"] == "step size factor" for event in halvings)
    assert halvings[-1]["to"] <= 1 / 64 and [
        attempt["solver"] for attempt in model.fit_attempts_ if "alpha" in attempt
    ] == ["eigenpro"]
    assert model.fit_check_["passed"] and model.fit_check_["model_loss"] < 0.01 * model.fit_check_["trivial_loss"]
    predictions = model.predict(X_test)
    assert np.all(np.isfinite(predictions)) and _not_worse_than_trivial(predictions, y_test, y)


def test_a_1_percent_minority_class_is_no_worse_than_the_prior():
    rng = np.random.RandomState(0)
    X = rng.randn(2000, 5)
    y = (X[:, 0] + 0.5 * X[:, 1] > 2.4).astype(int)  # about 1% positive
    model = AdaptiveKernelClassifier(feature_learning=None, random_state=0).fit(X[:1000], y[:1000])
    probabilities = model.predict_proba(X[1000:])[:, 1]
    prior = y[:1000].mean()
    assert _not_worse((probabilities - y[1000:]) ** 2 - (prior - y[1000:]) ** 2)
    assert model.fit_check_["passed"] and 0.002 < y[:1000].mean() < 0.03


def _noisy_label_table(n_rows, seed):
    """A table whose best classifier errs on 20% of rows and whose majority class errs on about 24%.

    Six numeric columns (two of them informative) and a categorical column of 100
    levels with an effect of its own; the true class is a threshold of a smooth
    score (7% positive), and each label is flipped with probability 0.2.  An
    interpolating model errs on about ``2 x 0.2 x 0.8 = 32%`` of new rows.
    """
    import pandas as pd
    from scipy.stats import norm

    rng = np.random.RandomState(seed)
    X = rng.randn(n_rows, 6)
    level = rng.randint(0, 100, n_rows)
    effect = 0.5 * np.random.RandomState(12345).randn(100)
    score = X[:, 0] + 0.5 * X[:, 1] + effect[level]
    truth = score > norm.ppf(1 - 0.07) * np.sqrt(1.25 + 0.25)
    y = (truth ^ (rng.rand(n_rows) < 0.2)).astype(int)
    table = pd.DataFrame(X, columns=[f"x{i}" for i in range(6)])
    table["level"] = pd.Categorical([f"L{value}" for value in level])
    return table, y


NOISY_TRAIN, NOISY_TEST = 3000, 8000


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_classifier_on_noisy_labels_beats_the_majority_class(seed):
    """Every point a center, the criterion's coverage below its bound: the default fit beats the majority class.

    Issue 77: unpenalised (the criterion not trusted), early stopping did not
    regularise enough, and the last check on training rows passed a model worse than
    the majority class on new rows.  The held-out check sees it and the fit is
    refit with the criterion's penalty.
    """
    table, y = _noisy_label_table(NOISY_TRAIN + NOISY_TEST, seed)
    train, test = slice(0, NOISY_TRAIN), slice(NOISY_TRAIN, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AdaptiveKernelClassifier(random_state=0).fit(table.iloc[train], y[train])
    majority = np.bincount(y[train]).argmax()
    differences = (model.predict(table.iloc[test]) != y[test]).astype(float) - (majority != y[test])
    assert model.n_centers_ == 0.9 * NOISY_TRAIN and model.alpha_selection_.coverage < planning_solver.LOO_MIN_COVERAGE
    assert differences.mean() < -2.0 * differences.std(ddof=1) / np.sqrt(differences.size), differences.mean()
    check = model.fit_check_
    # The refit's own check needs only to pass: 300 held-out rows cannot show it better beyond noise.
    assert check["held_out"] and check["score"] == "misclassification" and check["passed"]
    assert model.alpha_ > 0 and model.solver_ == "eigenpro"
    assert [attempt["alpha"] > 0 for attempt in model.fit_attempts_ if "alpha" in attempt] == [False, True]


@pytest.mark.parametrize("solver", ["auto", "cg", "eigenpro"])
@pytest.mark.parametrize("alpha", ["auto", "loo", 0.0, 0.05])
def test_every_solver_with_every_alpha_mode_on_every_point(cg_on_every_point, monkeypatch, solver, alpha):
    """Every solver value x every alpha mode, with the criterion's coverage below its bound (issue 77).

    CG on every point needs a penalty: ``alpha="auto"`` gets the criterion's (it
    divided by zero in ``shifted_condition`` with the gated alpha 0), ``alpha=0`` is
    refused with a message naming ``alpha``.  Every other pair fits a model no worse
    than the trivial one on new rows.  The criterion's Nystrom subsample is cut to
    150 rows, as ``tests/test_full_kernel_cg.py`` does, so that its coverage is
    below the bound on 1200 rows.
    """
    monkeypatch.setattr(tune, "auto_subsample_size", lambda n_rows: min(n_rows, 150))
    rng = np.random.RandomState(0)
    X = rng.randn(1600, 10)
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.randn(1600)
    model = AdaptiveKernelRegressor(solver=solver, alpha=alpha, bandwidth=2.0, feature_learning=None, random_state=0)
    if solver == "cg" and alpha == 0.0:
        with pytest.raises(ValueError, match=r"solver='cg' .* needs alpha > 0; got alpha=0.0"):
            model.fit(X[:1200], y[:1200])
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X[:1200], y[:1200])
    assert model.alpha_selection_ is None or model.alpha_selection_.coverage < planning_solver.LOO_MIN_COVERAGE
    if solver == "cg" or alpha != 0.0:
        assert model.alpha_ > 0 or (alpha == "auto" and solver != "cg")
    predictions = model.predict(X[1200:])
    assert np.all(np.isfinite(predictions)) and model.fit_check_["passed"], model.fit_check_
    assert _not_worse_than_trivial(predictions, y[1200:], y[:1200])
    assert np.mean((predictions - y[1200:]) ** 2) < 0.5 * np.var(y[1200:])
