"""Tables as users hold them (issue 52, items 1-3): categories, strings, missing values, units, sparse input.

The references are exact: the hand-built scikit-learn pipeline the encoding
replaces (``StandardScaler`` on the numeric columns, ``OneHotEncoder(drop="if_binary",
handle_unknown="ignore")`` on the categories), the same table with its categories
as strings, a missing value filled by hand, a dense copy of a sparse matrix.  The
fits use a fixed kernel, bandwidth and penalty in float64 (the exact direct solve)
so that two equal matrices give equal models whatever the order of their columns.
"""

import numpy as np
import pytest
import scipy.sparse
import torch
from numpy.testing import assert_allclose, assert_array_equal

from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from skgpu_kernel.agop import block_diagonal
from skgpu_kernel.planning.columns import plan_column_scaling
from skgpu_kernel.tables import MAX_CATEGORY_LEVELS, fit_table_encoding

pd = pytest.importorskip("pandas")

EXACT = {"bandwidth": 3.0, "alpha": 1e-2, "dtype": "float64", "feature_learning": None, "random_state": 0}


def _table(n=240, seed=0):
    """A mixed-type table in raw units, and a target that uses every column."""
    rng = np.random.RandomState(seed)
    frame = pd.DataFrame(
        {
            "age": rng.uniform(18, 90, n),
            "income": rng.lognormal(10, 1, n),
            "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], n)),
            "smoker": rng.choice(["yes", "no"], n),
            "rooms": rng.randint(1, 8, n),
        }
    )
    y = (
        np.sin(frame["age"] / 12)
        + (frame["region"] == "north") * 1.0
        + np.log(frame["income"]) / 4
        + (frame["smoker"] == "yes") * 0.5
        + 0.05 * rng.randn(n)
    ).to_numpy()
    return frame, y


def _hand_built(frame):
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    categorical = ["region", "smoker"]
    numeric = [column for column in frame.columns if column not in categorical]
    return ColumnTransformer(
        [
            ("numeric", StandardScaler(), numeric),
            ("categorical", OneHotEncoder(drop="if_binary", handle_unknown="ignore", sparse_output=False), categorical),
        ]
    )


@pytest.mark.parametrize("estimator", [AdaptiveKernelRegressor, AdaptiveKernelClassifier])
def test_a_raw_dataframe_fits_the_model_of_the_hand_built_pipeline(estimator):
    frame, y = _table()
    y = y if estimator is AdaptiveKernelRegressor else y > np.median(y)
    train, test = frame[:200], frame[200:]
    model = estimator(**EXACT).fit(train, y[:200])
    encoder = _hand_built(frame).fit(train)
    reference = estimator(**EXACT).fit(encoder.transform(train), y[:200])
    assert model.column_scaling_ == "standardize"
    assert_array_equal(model.is_categorical_, [False, False, True, True, False])
    assert model.table_encoding_.n_features_out == encoder.transform(train).shape[1] == 8
    method = "predict" if estimator is AdaptiveKernelRegressor else "decision_function"
    assert_allclose(getattr(model, method)(test), getattr(reference, method)(encoder.transform(test)), atol=1e-8)


def test_categories_as_pandas_categories_or_as_strings_give_the_same_model():
    frame, y = _table()
    strings = frame.assign(region=frame["region"].astype(str))
    as_object = np.asarray(frame[["region", "smoker"]].astype(str), dtype=object)
    model = AdaptiveKernelRegressor(**EXACT).fit(frame, y)
    assert_array_equal(model.predict(frame), AdaptiveKernelRegressor(**EXACT).fit(strings, y).predict(strings))
    # A numpy object array of strings is categorical by its values ("from_dtype").
    on_object = AdaptiveKernelRegressor(**EXACT).fit(as_object, y)
    assert_array_equal(on_object.is_categorical_, [True, True])
    assert on_object.table_encoding_.n_features_out == 5


def test_a_value_missing_at_predict_in_a_column_complete_in_fit_takes_the_training_mean():
    frame, y = _table()
    model = AdaptiveKernelRegressor(**EXACT).fit(frame, y)
    holed = frame[:20].copy()
    holed.loc[holed.index[::3], "age"] = np.nan
    filled = holed.fillna({"age": frame["age"].mean()})
    assert_allclose(model.predict(holed), model.predict(filled), rtol=1e-12)


def test_missing_values_in_fit_are_imputed_with_an_indicator_and_a_level_of_their_own():
    frame, y = _table()
    holed = frame.copy()
    holed.loc[holed.index[::7], "income"] = np.nan
    holed["region"] = holed["region"].cat.add_categories([]).where(np.arange(len(frame)) % 11 != 0)
    model = AdaptiveKernelRegressor(**EXACT).fit(holed, y)
    encoding = model.table_encoding_
    assert encoding.indicator[1] and not encoding.indicator[0]  # the numeric columns age and income
    assert encoding.columns[2].missing_level
    encoded = encoding.transform(holed)
    assert not np.isnan(encoded).any()
    assert_array_equal(encoded[:, 2], np.isnan(holed["income"]))  # the indicator after income
    income = holed["income"]
    assert_allclose(encoded[::7, 1], 0.0, atol=1e-12)  # the mean, standardized
    assert_allclose(encoded[1, 1], (income.iloc[1] - income.mean()) / income.std(ddof=0), rtol=1e-12)
    assert np.isfinite(model.predict(holed)).all()
    assert model.score(holed, y) > 0.9


def test_unknown_levels_are_equidistant_from_every_known_level():
    frame, y = _table()
    encoding = AdaptiveKernelRegressor(**EXACT).fit(frame, y).table_encoding_
    unseen = frame[:3].assign(region=["mars", "north", None], smoker=["maybe", "yes", "no"])
    encoded = encoding.transform(unseen)
    region, smoker = encoded[:, 2:6], encoded[:, 6]  # after age and income
    assert_array_equal(region[0], 0.0)  # one-hot block: zeros, at squared distance 1 from each level
    assert_array_equal(region[1], [0, 1, 0, 0])  # levels in sorted order: east, north, south, west
    assert_array_equal(region[2], 0.0)  # missing, and fit saw no missing region
    assert_array_equal(smoker, [0.5, 1.0, 0.0])  # two levels: one column; unknown halfway


def test_a_column_of_many_levels_adds_a_bounded_number_of_columns():
    rng = np.random.RandomState(1)
    n = 3000
    ids = np.array([f"id{k:04d}" for k in rng.zipf(1.3, n) % 2000])
    frame = pd.DataFrame({"x": rng.randn(n), "id": ids})
    encoding = fit_table_encoding(frame)
    column = encoding.columns[1]
    assert len(column.levels) == MAX_CATEGORY_LEVELS and len(column.pooled) == len(np.unique(ids)) - MAX_CATEGORY_LEVELS
    assert encoding.n_features_out == 1 + MAX_CATEGORY_LEVELS + 1
    # The most frequent keep a column, ties to the first in sorted order.
    counts = pd.Series(ids).value_counts().sort_index().sort_values(ascending=False, kind="stable")
    assert set(column.levels) == set(counts.index[:MAX_CATEGORY_LEVELS])
    pooled_row = int(np.flatnonzero(np.isin(ids, column.pooled))[0])
    encoded = encoding.transform(frame[pooled_row : pooled_row + 1].assign(x=0.0))
    assert encoded[0, -1] == 1.0 and encoded[0, 1:-1].sum() == 0.0
    assert encoding.transform(frame[:1].assign(id="never-seen"))[0, 1:].sum() == 0.0


def test_columns_already_on_one_scale_pass_through_unchanged():
    rng = np.random.RandomState(0)
    pixels = rng.randint(0, 256, size=(300, 16)).astype(np.float32) / 255  # images: [0, 1]
    y = pixels[:, :4].sum(axis=1)
    model = AdaptiveKernelRegressor(random_state=0, feature_learning=None, alpha=0, n_epochs=2).fit(pixels, y)
    assert model.column_scaling_ == "none" and model.table_encoding_.passthrough
    assert model.table_encoding_.transform(pixels) is pixels  # no copy
    assert model.kernel_grid_step_ is not None  # the exact int8 path is kept


def test_numeric_columns_in_different_units_are_standardized_to_the_scaled_model():
    rng = np.random.RandomState(0)
    X = rng.randn(250, 4)
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2]
    raw = X * np.array([1.0, 1000.0, 0.001, 50.0]) + np.array([0.0, 5e4, 2.0, -30.0])
    model = AdaptiveKernelRegressor(**EXACT).fit(raw, y)
    reference = AdaptiveKernelRegressor(**EXACT).fit((raw - raw.mean(axis=0)) / raw.std(axis=0), y)
    assert model.column_scaling_ == "standardize"
    assert_allclose(model.predict(raw), reference.predict((raw - raw.mean(axis=0)) / raw.std(axis=0)), atol=1e-8)


def test_importances_are_per_input_column_and_do_not_depend_on_its_units():
    frame, y = _table(n=400)
    fits = [
        AdaptiveKernelRegressor(random_state=0, feature_learning="diagonal", dtype="float64").fit(table, y)
        for table in (frame, frame.assign(age=frame["age"] * 1000.0))
    ]
    assert fits[0].feature_importances_.shape == (5,)
    assert_allclose(fits[0].feature_importances_.sum(), 1.0)
    assert_allclose(fits[0].feature_importances_, fits[1].feature_importances_, rtol=1e-6)


def test_a_sparse_matrix_fits_the_model_of_its_dense_copy_within_the_budget():
    rng = np.random.RandomState(0)
    dense = rng.randn(200, 6) * (rng.rand(200, 6) < 0.3)
    y = dense[:, 0] - dense[:, 1] ** 2
    model = AdaptiveKernelRegressor(**EXACT).fit(scipy.sparse.csr_matrix(dense), y)
    reference = AdaptiveKernelRegressor(**EXACT).fit(dense, y)
    assert_array_equal(model.predict(scipy.sparse.csc_matrix(dense)), reference.predict(dense))
    with pytest.raises(ValueError, match=r"sparse matrix of shape \(200, 6\).*over the memory budget"):
        AdaptiveKernelRegressor(memory_budget=4096).fit(scipy.sparse.csr_matrix(dense), y)


def test_categorical_features_by_mask_indices_or_names():
    frame, y = _table()
    codes = frame.assign(region=frame["region"].cat.codes, smoker=(frame["smoker"] == "yes").astype(int))
    masks = [[False, False, True, True, False], [2, 3], ["region", "smoker"]]
    for chosen in masks:
        model = AdaptiveKernelRegressor(**EXACT, categorical_features=chosen).fit(codes, y)
        assert_array_equal(model.is_categorical_, masks[0])
    assert_array_equal(AdaptiveKernelRegressor(**EXACT, categorical_features=None).fit(codes, y).is_categorical_, False)
    with pytest.raises(ValueError, match="names columns, but X has no column names"):
        AdaptiveKernelRegressor(categorical_features=["region"]).fit(codes.to_numpy(), y)
    with pytest.raises(ValueError, match="columns that X does not have"):
        AdaptiveKernelRegressor(categorical_features=["colour"]).fit(codes, y)
    with pytest.raises(ValueError, match="mask of 2 entries; X has 5 columns"):
        AdaptiveKernelRegressor(categorical_features=[True, False]).fit(codes, y)


def test_strings_in_a_column_not_taken_as_categorical_are_refused_by_name():
    frame, y = _table()
    with pytest.raises(ValueError, match=r"column 2 \('region'\) holds strings \(for example 'north'\)"):
        AdaptiveKernelRegressor(categorical_features=None).fit(frame, y)


@pytest.mark.parametrize(
    ("low", "high", "mean", "std", "indicators", "standardize"),
    [
        ([-2.1, -3.0], [2.5, 3.2], [0.0, 0.0], [1.0, 1.0], 0, False),  # StandardScaler's output
        ([0.0, 0.0, 0.0], [1.0, 1.0, 0.6], [0.3, 0.5, 0.1], [0.3, 0.01, 0.05], 0, False),  # pixels in [0, 1]
        ([0.0, 0.0, 0.0], [255.0, 255.0, 190.0], [80.0, 120.0, 3.0], [60.0, 90.0, 10.0], 0, False),  # 0..255
        ([18.0, 0.0, 1.0], [90.0, 4e5, 7.0], [50.0, 3e4, 3.0], [20.0, 2e4, 2.0], 0, True),  # raw table
        ([0.0, -4.0], [18.0, 63.0], [13.0, 18.0], [3.0, 13.0], 20, True),  # CPS1988: two numbers, many levels
        ([-1.0, -1.0], [1.0, 1.0], [0.6, 0.1], [0.4, 0.5], 0, False),  # one range: Ionosphere
        ([5.0], [5.0], [5.0], [0.0], 3, False),  # nothing varies
    ],
)
def test_the_units_rule(low, high, mean, std, indicators, standardize):
    assert plan_column_scaling(low, high, mean, std, indicators).standardize is standardize


def test_block_diagonal_keeps_each_category_one_positive_semidefinite_block():
    rng = np.random.RandomState(0)
    root = torch.as_tensor(rng.randn(6, 6))
    agop = root @ root.T
    inside, outside = np.array([1, 2, 3]), np.array([0, 4, 5])
    full = block_diagonal(agop, (inside,))
    assert_array_equal(full[np.ix_(inside, inside)].numpy(), agop[np.ix_(inside, inside)].numpy())
    assert_array_equal(full[np.ix_(inside, outside)].numpy(), 0.0)
    assert_array_equal(full[np.ix_(outside, outside)].numpy(), agop[np.ix_(outside, outside)].numpy())
    diagonal = block_diagonal(agop, (inside,), diagonal=True)
    assert_array_equal(diagonal[np.ix_(inside, inside)].numpy(), agop[np.ix_(inside, inside)].numpy())
    assert_array_equal(diagonal[np.ix_(outside, outside)].numpy(), np.diag(agop.diagonal()[outside].numpy()))
    assert_array_equal(diagonal[np.ix_(inside, outside)].numpy(), 0.0)
    for kept in (full, diagonal):
        assert torch.linalg.eigvalsh(kept).min() >= -1e-12
    assert block_diagonal(agop, ()) is agop
    assert_array_equal(block_diagonal(agop, (), diagonal=True).numpy(), agop.diagonal().numpy())
    with pytest.raises(ValueError, match="the \\(d, d\\) AGOP"):
        block_diagonal(agop.diagonal(), (inside,), diagonal=True)


def _region_table(n=400):
    """Age and a region of four levels, of which only "north" moves the target, and eight noise columns."""
    rng = np.random.RandomState(0)
    frame = pd.DataFrame({f"noise{k}": rng.randn(n) for k in range(8)})  # columns a metric should shrink
    frame.insert(0, "age", rng.uniform(18, 90, n))
    frame.insert(1, "region", pd.Categorical(rng.choice(["east", "north", "south", "west"], n)))
    y = np.sin(frame["age"].to_numpy() / 8) + (frame["region"] == "north").to_numpy() + 0.05 * rng.randn(n)
    return frame, y


@pytest.mark.parametrize("mode", ["diagonal", "full"])
def test_a_learnt_metric_keeps_each_categorical_column_one_block_that_tells_its_levels_apart(mode):
    frame, y = _region_table()
    model = AdaptiveKernelRegressor(random_state=0, feature_learning=mode, dtype="float64").fit(frame, y)
    assert model.feature_learning_iteration_ > 0  # a learnt metric was kept
    region = np.arange(1, 5)  # after age: east, north, south, west
    others = np.setdiff1d(np.arange(model.metric_.shape[0]), region)
    # zero up to the rounding of the metric's matrix power (its largest entry is 1)
    assert_allclose(model.metric_[np.ix_(region, others)], 0.0, atol=1e-12)
    if mode == "diagonal":
        noise = others[others > 0]
        assert_allclose(model.metric_[np.ix_(noise, noise)], np.diag(np.diag(model.metric_)[noise]), atol=1e-12)
    block = model.metric_[np.ix_(region, region)]
    levels = np.eye(4)

    def squared_distance(a, b):
        return (levels[a] - levels[b]) @ block @ (levels[a] - levels[b])

    # only "north" moves the target: the block sets it apart from the three levels that do not
    for other in (0, 2, 3):
        assert squared_distance(1, other) > 4 * squared_distance(0, 2)
    assert model.feature_importances_.shape == (10,)
    assert model.feature_importances_[0] > 0.5 and model.feature_importances_[2:].max() < 0.01


def test_importances_count_a_category_block_with_its_covariance():
    frame, y = _region_table()
    model = AdaptiveKernelRegressor(random_state=0, feature_learning="full", dtype="float64").fit(frame, y)
    region = np.flatnonzero(model.table_encoding_.input_column == 1)
    block = model.metric_[np.ix_(region, region)]
    assert np.abs(block - np.diag(np.diag(block))).max() > 0.01  # the block's entries between levels count
    encoded = model.table_encoding_.transform(frame)
    covariance = np.cov(encoded, rowvar=False, bias=True)
    shares = []
    for column in range(frame.shape[1]):
        block = np.flatnonzero(model.table_encoding_.input_column == column)
        shares.append(np.sum(model.metric_[np.ix_(block, block)] * covariance[np.ix_(block, block)]))
    assert_allclose(model.feature_importances_, np.array(shares) / np.sum(shares), rtol=1e-10)


def _every_kind_of_column(n=240, seed=0):
    """A DataFrame with numeric, string, category and boolean columns and missing values in each kind."""
    frame, y = _table(n, seed)
    rng = np.random.RandomState(seed + 1)
    frame["insured"] = rng.rand(n) > 0.4  # boolean
    frame["plan"] = pd.Series(rng.choice(["basic", "plus", "gold"], n), dtype=object)  # strings
    frame.loc[frame.index[::9], "age"] = np.nan
    frame.loc[frame.index[::13], "plan"] = None
    frame["region"] = frame["region"].where(np.arange(n) % 17 != 0)
    return frame, y


@pytest.mark.parametrize("estimator", [AdaptiveKernelRegressor, AdaptiveKernelClassifier])
def test_a_dataframe_of_every_column_kind_fits_predicts_pickles_and_keeps_float32(estimator):
    import pickle

    frame, y = _every_kind_of_column()
    frame = frame.astype({"age": np.float32, "income": np.float32, "rooms": np.float32})
    y = y if estimator is AdaptiveKernelRegressor else np.where(y > np.median(y), "high", "low")
    model = estimator(random_state=0, feature_learning=None).fit(frame[:200], y[:200])
    assert_array_equal(model.is_categorical_, [False, False, True, True, False, True, True])
    test = frame[200:]
    predicted = model.predict(test)
    assert predicted.shape == (40,)
    decisions = model.decision_function(test) if estimator is AdaptiveKernelClassifier else predicted
    assert np.isfinite(decisions).all()
    assert model.table_encoding_.transform(test).dtype == np.float32  # float32 columns stay float32
    if estimator is AdaptiveKernelRegressor:
        assert predicted.dtype == np.float32
    restored = pickle.loads(pickle.dumps(model))
    assert_array_equal(restored.table_encoding_.transform(test), model.table_encoding_.transform(test))
    assert_array_equal(restored.predict(test), predicted)


def test_a_column_scaled_by_1e4_reaches_the_standardized_fit_error_within_5_percent():
    rng = np.random.RandomState(0)
    X = rng.randn(600, 4)
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.randn(600)
    raw = X.copy()
    raw[:, 1] *= 1e4
    train, test = slice(0, 500), slice(500, None)
    model = AdaptiveKernelRegressor(random_state=0).fit(raw[train], y[train])
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    scaled = AdaptiveKernelRegressor(random_state=0).fit((X[train] - mean) / std, y[train])
    raw_error = np.mean((model.predict(raw[test]) - y[test]) ** 2)
    scaled_error = np.mean((scaled.predict((X[test] - mean) / std) - y[test]) ** 2)
    assert raw_error <= 1.05 * scaled_error
