"""Tables without surprises (issue 63): each awkward input a real table brings, handled or refused by name.

Every case runs on both kernel estimators.  The references are exact: the same
data as a numpy array or with the zero-weight rows removed, a hand-made encoding,
scikit-learn's own contract (``sample_weight=0`` is the same as leaving the row
out).  The fits use a fixed kernel, bandwidth and penalty in float64 (the exact
direct solve), so equal matrices give equal models.
"""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.datasets import load_digits

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

pd = pytest.importorskip("pandas")

EXACT = {"bandwidth": 3.0, "alpha": 1e-2, "dtype": "float64", "feature_learning": None, "random_state": 0}
ESTIMATORS = [AdaptiveKernelRegressor, AdaptiveKernelClassifier]


def _scores(model, X):
    return model.predict(X) if isinstance(model, AdaptiveKernelRegressor) else model.decision_function(X)


def _targets(estimator, y):
    return y if estimator is AdaptiveKernelRegressor else np.where(y > np.median(y), "high", "low")


def _table(n=200, seed=0):
    """Raw units, an integer-coded category, a string category and a target using them."""
    rng = np.random.RandomState(seed)
    frame = pd.DataFrame(
        {
            "age": rng.uniform(18, 90, n),
            "income": rng.lognormal(10, 1, n),
            "grade": rng.randint(1, 12, n),  # integer codes 1..11, categorical
            "city": rng.choice(["paris", "oslo", "rome"], n),
        }
    )
    y = np.sin(frame["age"] / 12) + (frame["grade"] % 3) * 0.5 + (frame["city"] == "oslo") + 0.05 * rng.randn(n)
    return frame, y.to_numpy()


def _polars_or_skip():
    return pytest.importorskip("polars")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_fit_on_an_array_then_predict_on_a_dataframe_warns_about_names_and_predicts_the_same(estimator):
    rng = np.random.RandomState(0)
    X = rng.rand(150, 3)  # within [0, 1]: the encoding passes the array through
    y = _targets(estimator, X[:, 0] + np.sin(4 * X[:, 1]))
    model = estimator(**EXACT).fit(X, y)
    assert model.table_encoding_.passthrough
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    with pytest.warns(UserWarning, match="X has feature names"):
        from_frame = _scores(model, frame)
    assert_array_equal(from_frame, _scores(model, X))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_integer_coded_category_keeps_its_levels_when_a_missing_value_makes_the_batch_float(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    model = estimator(**EXACT, categorical_features=["grade", "city"]).fit(frame, y)
    assert model.table_encoding_.columns[2].levels.dtype.kind == "f"  # levels are values, not str(value)
    batch = frame[:20].copy()
    holed = batch.assign(grade=batch["grade"].astype(float).where(np.arange(20) != 5))  # 1 -> 1.0, one NaN
    assert holed["grade"].dtype == np.float64
    kept = np.arange(20) != 5
    assert_array_equal(_scores(model, holed)[kept], _scores(model, batch)[kept])
    # The same codes as strings of floats are another column kind: refused by name, not silently unknown.
    with pytest.raises(ValueError, match=r"column 2 \('grade'\) was fitted on numeric levels and holds strings"):
        _scores(model, batch.assign(grade=batch["grade"].astype(float).astype(str)))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_numeric_levels_sort_as_numbers_as_onehotencoder_does(estimator):
    frame, y = _table()
    model = estimator(**EXACT, categorical_features=["grade", "city"]).fit(frame, _targets(estimator, y))
    assert_array_equal(model.table_encoding_.columns[2].levels, np.arange(1, 12))  # 9 before 10


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kind", ["datetime", "timedelta", "numpy datetime64"])
def test_a_column_of_dates_or_times_is_refused_by_name_with_a_hint(estimator, kind):
    frame, y = _table()
    dates = pd.Timestamp("2020-01-01") + pd.to_timedelta(np.arange(len(frame)), unit="D")
    column = {"datetime": dates, "timedelta": dates - dates[0], "numpy datetime64": np.asarray(dates)}[kind]
    frame = frame.assign(when=column)
    with pytest.raises(ValueError, match=r"column 4 \('when'\) holds dates or times .* days since a reference date"):
        estimator(**EXACT).fit(frame, _targets(estimator, y))
    array = np.asarray(dates).reshape(-1, 1)
    with pytest.raises(ValueError, match=r"column 0 holds dates or times"):
        estimator(**EXACT).fit(array, _targets(estimator, y))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_object_column_mixing_numbers_and_strings_is_refused_by_name_or_taken_as_levels(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    codes = np.where(np.arange(len(frame)) % 4 == 0, "A7", frame["grade"].to_numpy().astype(object))
    mixed = frame.assign(grade=pd.Series(codes, dtype=object))
    with pytest.raises(ValueError, match=r"column 2 \('grade'\) mixes numbers and strings \(for example 'A7'\)"):
        estimator(**EXACT).fit(mixed, y)
    model = estimator(**EXACT, categorical_features=["grade", "city"]).fit(mixed, y)
    assert "A7" in model.table_encoding_.columns[2].levels and "3" in model.table_encoding_.columns[2].levels
    # 3 and 3.0 are one level.
    as_float = mixed.assign(grade=mixed["grade"].map(lambda value: float(value) if value != "A7" else value))
    assert_array_equal(_scores(model, as_float), _scores(model, mixed))
    # A numpy object array: the same refusal, by index.
    with pytest.raises(ValueError, match=r"column 0 mixes numbers and strings"):
        estimator(**EXACT).fit(codes.reshape(-1, 1), y)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_zero_weight_rows_are_absent_even_with_extreme_values_and_unseen_levels(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    rng = np.random.RandomState(1)
    extra = frame[:30].assign(income=rng.lognormal(25, 1, 30), city="lima", grade=99)  # extreme, unseen
    joined = pd.concat([frame, extra], ignore_index=True)
    weights = np.r_[np.ones(len(frame)), np.zeros(len(extra))]
    with_zeros = estimator(**EXACT).fit(joined, np.r_[y, y[:30]], sample_weight=weights)
    without = estimator(**EXACT).fit(frame, y)
    assert with_zeros.column_scaling_ == without.column_scaling_
    assert "lima" not in with_zeros.table_encoding_.columns[3].levels
    assert_array_equal(_scores(with_zeros, frame), _scores(without, frame))


def test_a_classifier_with_every_fourth_row_at_weight_zero_is_the_classifier_without_those_rows():
    X, y = load_digits(return_X_y=True)
    X, y = X[:600], y[:600]
    X = X * np.r_[np.ones(32), np.full(32, 40.0)]  # two units: the rule standardizes
    weights = np.ones(len(y))
    weights[::4] = 0.0
    with_zeros = AdaptiveKernelClassifier(random_state=0).fit(X, y, sample_weight=weights)
    without = AdaptiveKernelClassifier(random_state=0).fit(X[weights > 0], y[weights > 0])
    assert with_zeros.column_scaling_ == "standardize"
    assert_array_equal(with_zeros.decision_function(X), without.decision_function(X))
    assert_array_equal(with_zeros.predict_proba(X), without.predict_proba(X))


def test_a_class_present_only_in_zero_weight_rows_keeps_its_label_but_not_its_rows():
    frame, y = _table()
    labels = np.where(y > np.median(y), "high", "low").astype(object)
    labels[:5] = "ghost"
    weights = np.r_[np.zeros(5), np.ones(len(y) - 5)]
    model = AdaptiveKernelClassifier(**EXACT).fit(frame, labels, sample_weight=weights)
    assert_array_equal(model.classes_, ["ghost", "high", "low"])  # scikit-learn's classes_: the labels of y
    assert model.n_centers_ == len(y) - 5 and "ghost" not in model.predict(frame)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_encoding_statistics_are_weighted_as_repeated_rows(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    weights = np.where(np.arange(len(frame)) % 3 == 0, 2.0, 1.0)
    repeated = np.repeat(np.arange(len(frame)), weights.astype(int))
    weighted = estimator(**EXACT).fit(frame, y, sample_weight=weights).table_encoding_
    copies = estimator(**EXACT).fit(frame.iloc[repeated], y[repeated]).table_encoding_
    for field in ("shift", "scale", "fill", "indicator"):
        assert_allclose(getattr(weighted, field), getattr(copies, field), rtol=1e-12)
    for mine, theirs in zip(weighted.columns, copies.columns, strict=True):
        if mine is not None:
            assert_array_equal(mine.levels, theirs.levels)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_dataframe_and_its_own_array_give_the_same_model_to_the_bit(estimator):
    frame, y = _table()
    numeric = frame[["age", "income", "grade"]]
    array = numeric.to_numpy()  # Fortran-ordered: pandas' own block, transposed
    assert array.flags["F_CONTIGUOUS"]
    y = _targets(estimator, y)
    from_frame = estimator(random_state=0).fit(numeric, y)
    from_array = estimator(random_state=0).fit(array, y)
    assert from_frame.column_scaling_ == "standardize"
    assert_array_equal(from_frame.dual_coef_, from_array.dual_coef_)
    assert_array_equal(_scores(from_frame, numeric), _scores(from_array, array))


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("dtype", [np.uint8, np.float64])
def test_a_memory_mapped_array_is_read_as_it_is_never_copied(estimator, dtype, tmp_path):
    rng = np.random.RandomState(0)
    values = np.column_stack([rng.randint(0, 256, 200), rng.randint(0, 3, 200) * 100])  # two units
    np.save(tmp_path / "X.npy", values.astype(dtype))
    X = np.load(tmp_path / "X.npy", mmap_mode="r")
    y = _targets(estimator, values[:, 0] / 255.0 + values[:, 1] / 200.0)
    model = estimator(**EXACT).fit(X, y)
    assert model.column_scaling_ == "none" and model.table_encoding_.passthrough
    checked = model._checked_table(X, reset=False)  # check_array's view of the file
    assert model.table_encoding_.transform(checked) is checked  # no copy, no conversion to float64
    in_memory = estimator(**EXACT, column_scaling="none").fit(values.astype(np.float64), y)
    assert_allclose(_scores(model, X), _scores(in_memory, values.astype(np.float64)), rtol=1e-10, atol=1e-10)
    standardized = estimator(**EXACT, column_scaling="standardize").fit(X, y)  # asked: a standardized copy
    assert standardized.column_scaling_ == "standardize"


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("library", ["polars", "pyarrow"])
def test_polars_and_pyarrow_tables_keep_their_feature_names_and_categories(estimator, library):
    module = pytest.importorskip(library)
    if library == "polars":
        pytest.importorskip("pyarrow")  # polars' to_pandas
    frame, y = _table()
    y = _targets(estimator, y)
    table = module.from_pandas(frame) if library == "polars" else module.Table.from_pandas(frame)
    model = estimator(**EXACT, categorical_features=["grade", "city"]).fit(table, y)
    assert_array_equal(model.feature_names_in_, frame.columns)
    reference = estimator(**EXACT, categorical_features=["grade", "city"]).fit(frame, y)
    assert_array_equal(model.is_categorical_, reference.is_categorical_)
    assert_array_equal(_scores(model, table), _scores(reference, frame))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_predict_encodes_rows_a_block_at_a_time_within_the_memory_budget(estimator):
    frame, y = _table(n=400)
    y = _targets(estimator, y)
    model = estimator(**EXACT).fit(frame, y)
    whole = _scores(model, frame)
    encoding = model.table_encoding_
    budget = 64 * 8 * encoding.n_features_out  # 16 rows of encoded float64 at a quarter of the budget
    assert encoding.row_block(len(frame), budget) == 16
    model.set_params(memory_budget=budget)
    assert_allclose(_scores(model, frame), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_warm_start_refuses_a_changed_encoding_choice(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    model = estimator(**EXACT, warm_start=True, categorical_features=["city"]).fit(frame, y)
    model.fit(frame, y)  # the same choice: continues
    model.set_params(categorical_features=["grade", "city"])
    with pytest.raises(ValueError, match="categorical_features or column_scaling changed"):
        model.fit(frame, y)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_empty_list_of_categorical_features_takes_none_as_histgradientboosting_does(estimator):
    frame, y = _table()
    numeric = frame[["age", "income", "grade"]]
    model = estimator(**EXACT, categorical_features=[]).fit(numeric, _targets(estimator, y))
    assert_array_equal(model.is_categorical_, False)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_numpy_bool_column_and_a_pandas_bool_column_are_both_categorical(estimator):
    rng = np.random.RandomState(0)
    flags = rng.rand(150, 2) > 0.5
    y = _targets(estimator, flags[:, 0] * 1.0 + rng.randn(150) * 0.1)
    on_array = estimator(**EXACT).fit(flags, y)
    on_frame = estimator(**EXACT).fit(pd.DataFrame(flags, columns=["a", "b"]), y)
    assert_array_equal(on_array.is_categorical_, [True, True])
    assert_array_equal(on_frame.is_categorical_, [True, True])
    assert_array_equal(_scores(on_array, flags), _scores(on_frame, pd.DataFrame(flags, columns=["a", "b"])))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_nat_in_a_categorical_column_is_missing(estimator):
    frame, y = _table()
    y = _targets(estimator, y)
    days = pd.Series(pd.to_datetime(["2020-01-01", "2021-06-01"])[np.arange(len(frame)) % 2]).astype(object)
    days[::5] = pd.NaT
    labelled = frame.assign(day=days.map(lambda value: value if value is pd.NaT else str(value.date())))
    model = estimator(**EXACT, categorical_features=["grade", "city", "day"]).fit(labelled, y)
    column = model.table_encoding_.columns[4]
    assert column.missing_level and len(column.levels) == 2


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_column_scaling_decides_the_units_rule(estimator):
    frame, y = _table()
    numeric = frame[["age", "income"]]
    y = _targets(estimator, y)
    auto = estimator(**EXACT).fit(numeric, y)
    kept = estimator(**EXACT, column_scaling="none").fit(numeric, y)
    assert auto.column_scaling_ == "standardize" and kept.column_scaling_ == "none"
    assert_array_equal(kept.table_encoding_.transform(numeric), numeric.to_numpy())
    scaled = np.asarray([[0.1, 0.2], [0.5, 0.9], [0.3, 0.4], [0.8, 0.1]] * 40)
    forced = estimator(**EXACT, column_scaling="standardize").fit(scaled, _targets(estimator, scaled[:, 0]))
    assert forced.column_scaling_ == "standardize"
    with pytest.raises(ValueError, match="column_scaling"):
        estimator(column_scaling="robust").fit(numeric, y)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_tags_declare_categorical_input(estimator):
    assert estimator().__sklearn_tags__().input_tags.categorical


def test_a_value_neither_number_nor_string_is_refused_with_its_column():
    X = np.ones((20, 2), dtype=object)
    X[3, 1] = {"foo": "bar"}
    with pytest.raises(TypeError, match=r"column 1: float\(\) argument must be a string or a"):
        AdaptiveKernelRegressor(**EXACT).fit(X, np.arange(20.0))


def test_no_warning_is_raised_by_a_plain_table_fit():
    frame, y = _table()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdaptiveKernelRegressor(**EXACT).fit(frame, y).predict(frame)


@pytest.mark.parametrize("check_name", ["dense", "sparse"])
def test_a_fixed_kernel_regressor_passes_scikit_learns_sample_weight_equivalence(check_name):
    from sklearn.utils import estimator_checks

    check = getattr(estimator_checks, f"check_sample_weight_equivalence_on_{check_name}_data")
    check("AdaptiveKernelRegressor", AdaptiveKernelRegressor(**EXACT))
