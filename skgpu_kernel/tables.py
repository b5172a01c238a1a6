"""Tables as users hold them: categories, strings and missing values in, one float matrix for the kernel out.

The kernel estimators take ``X`` as a numeric array, a sparse matrix or a pandas
DataFrame, and :func:`fit_table_encoding` learns on the training rows how each
input column becomes columns of the matrix the kernel sees; the fitted
:class:`TableEncoding` (``table_encoding_``) applies the same rule at ``predict``.

The rules:

- **Which columns are categorical** (``categorical_features``): ``"from_dtype"``
  takes a DataFrame's ``category``, boolean, string and object columns of strings,
  and a numpy object array's columns of strings; a boolean mask, indices, or names
  (with a DataFrame's column names) choose them; None takes none.
- **A category** is one 0/1 column per level observed in ``fit``, in sorted order
  (the rows one category apart are then at squared distance 2, as two
  standardized columns one standard deviation apart): the same matrix as
  scikit-learn's ``OneHotEncoder(drop="if_binary", handle_unknown="ignore")``.  A
  column with two levels and no missing value is one column, the second level's
  indicator.  Ordered categories are taken as unordered.  Missing values (None,
  NaN, ``pd.NA``) seen in ``fit`` are a level of their own.
- **An unknown level at predict** (never seen in ``fit``, or missing where ``fit``
  had no missing value) is zeros across a one-hot block, 0.5 in a two-level
  column: equidistant from every known level in the plain kernel (a learnt
  metric's block puts it at squared distance ``M_ll`` from level ``l``).
- **Many levels**: the ``MAX_CATEGORY_LEVELS`` most frequent keep a column each and
  the rest share one, so that an identifier with thousands of levels adds at most
  ``MAX_CATEGORY_LEVELS + 2`` columns.
- **Missing numeric values** take the column's training mean, and a column with
  missing values in ``fit`` gains a 0/1 indicator column after it, so that the
  kernel can tell an imputed value from an observed one.  A value missing at
  ``predict`` in a column that had none in ``fit`` takes the mean, without indicator.
- **Units**: the numeric columns are standardized, or kept, by
  :func:`skgpu_kernel.planning.columns.plan_column_scaling` (``column_scaling_``).
- **Sparse input** (CSR, CSC, COO) is made dense where its dense float64 form fits
  the memory budget, and refused with a message naming the sizes otherwise.  A
  memory-mapped array is read as it is (never copied): no standardizing, no missing
  values.

A numeric array without missing values whose columns are kept passes through
unchanged (no copy), so such fits are those of the estimators without this layer.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from .planning.columns import ColumnScaling, plan_column_scaling

__all__ = [
    "MAX_CATEGORY_LEVELS",
    "CategoricalColumn",
    "NumericColumn",
    "TableEncoding",
    "column_variances",
    "fit_table_encoding",
]

# Levels of a categorical column with a column of their own; the rest share one.
# HistGradientBoosting's limit on a category's levels.  A smaller cap pools levels that
# carry the signal: at 100, VietNamI's 194 communes (each about 140 rows) lost 94 to the
# shared column, and the test MSE rose from 0.177 to 0.255 (split 0).
MAX_CATEGORY_LEVELS = 255
_INFINITY = "Input X contains infinity or a value too large for dtype('float64')."
# Bytes of the float64 block of rows the column statistics read at once: a block of a
# few MB stays in cache (Fashion-MNIST's 60000 x 784 pixels: 0.1 s, against 5 s in
# blocks of 65536 rows).
_BLOCK_BYTES = 2**23


@dataclass(frozen=True)
class NumericColumn:
    """A numeric input column: ``(x - shift) / scale``, its missing values at ``fill``, and their indicator.

    ``fill`` is the training mean; ``shift`` and ``scale`` the mean and standard
    deviation where the columns are standardized, 0 and 1 where they are kept.
    """

    fill: float
    shift: float
    scale: float
    indicator: bool

    @property
    def width(self):
        return 1 + self.indicator


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical input column's levels (sorted string keys) and how they are encoded."""

    levels: np.ndarray
    pooled: np.ndarray  # the levels beyond MAX_CATEGORY_LEVELS, sharing one column
    missing_level: bool

    @property
    def binary(self):
        return len(self.levels) == 2 and not self.missing_level and not len(self.pooled)

    @property
    def width(self):
        return 1 if self.binary else len(self.levels) + self.missing_level + bool(len(self.pooled))

    def encode(self, values, out):
        """Write the block of ``values`` (a column) into ``out`` of shape ``(rows, width)``, zeroed."""
        keys, missing = _category_keys(values)
        index, found = _lookup(self.levels, keys, missing)
        rows = np.flatnonzero(found)
        if self.binary:
            out[:, 0] = np.where(found, index, 0.5)
            return
        out[rows, index[rows]] = 1.0
        if self.missing_level:
            out[missing, len(self.levels)] = 1.0
        if len(self.pooled):
            _, in_pool = _lookup(self.pooled, keys, missing | found)
            out[in_pool, self.width - 1] = 1.0


@dataclass(frozen=True)
class TableEncoding:
    """How each input column becomes columns of the kernel's matrix (:func:`fit_table_encoding`).

    Attributes
    ----------
    columns : tuple of NumericColumn or CategoricalColumn
        One per input column, in order.
    scaling : ColumnScaling
        The units rule's decision.
    passthrough : bool
        A numeric array whose columns are kept and had no missing value: used as given.
    """

    columns: tuple
    scaling: ColumnScaling
    passthrough: bool

    @property
    def is_categorical(self):
        """Boolean mask of the categorical input columns."""
        return np.array([isinstance(column, CategoricalColumn) for column in self.columns], dtype=bool)

    @property
    def n_features_out(self):
        return sum(column.width for column in self.columns)

    @property
    def column_starts(self):
        """Where each input column's encoded columns start, and the total at the end."""
        return np.concatenate([[0], np.cumsum([column.width for column in self.columns])])

    @property
    def categorical_blocks(self):
        """The encoded columns of each categorical input column of more than one column: one block of a metric."""
        starts = self.column_starts
        return tuple(
            np.arange(starts[j], starts[j + 1])
            for j, column in enumerate(self.columns)
            if isinstance(column, CategoricalColumn) and column.width > 1
        )

    @property
    def input_column(self):
        """For each encoded column, the input column it comes from (``feature_importances_`` sums over them)."""
        return np.repeat(np.arange(len(self.columns)), [column.width for column in self.columns])

    def squared_distance_shares(self, X, metric):
        """Each input column's part of the mean squared distance under ``metric``, on the encoded rows ``X``.

        ``tr(M_BB Cov_BB)``, ``B`` the encoded columns of the input column: ``M_jj``
        times the variance for a column kept as one, the block's levels together
        for a category (the squared distance between two rows drawn at random is
        twice the sum over the blocks, where ``M`` has no entries between them).

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features_out)
            Encoded rows (:meth:`transform`).
        metric : ndarray of shape (n_features_out, n_features_out)

        Returns
        -------
        ndarray of shape (n_columns,)
        """
        shares = np.bincount(
            self.input_column, weights=np.diag(metric) * column_variances(X), minlength=len(self.columns)
        )
        for block in self.categorical_blocks:
            square = np.ix_(block, block)
            shares[self.input_column[block[0]]] = float(np.sum(metric[square] * _covariance(X, block)))
        return shares

    def transform(self, X, memory_budget=None):
        """The kernel's float matrix for ``X`` (validated as in ``fit``)."""
        X = _dense(X, memory_budget)
        if self.passthrough:
            return _with_missing_filled(_as_float_array(X), self.columns)
        numeric = [j for j, column in enumerate(self.columns) if isinstance(column, NumericColumn)]
        block = _numeric_block(X, numeric)
        dtype = np.float32 if block is not None and block.dtype == np.float32 else np.float64
        out = np.zeros((X.shape[0], self.n_features_out), dtype=dtype)
        starts = self.column_starts
        for position, j in enumerate(numeric):
            _encode_numeric(block[:, position], self.columns[j], out[:, starts[j] : starts[j + 1]])
        for j, column in enumerate(self.columns):
            if isinstance(column, CategoricalColumn):
                column.encode(_column(X, j), out[:, starts[j] : starts[j + 1]])
        return out


def fit_table_encoding(X, categorical_features="from_dtype", feature_names=None, memory_budget=None):
    """Learn the encoding of ``X``'s columns on the training rows.

    Parameters
    ----------
    X : ndarray, sparse matrix or pandas DataFrame of shape (n_samples, n_features)
        Checked for shape (2-D, non-empty) by the caller.
    categorical_features : "from_dtype", array-like or None, default="from_dtype"
        See the module's rules.
    feature_names : ndarray of str or None
        The DataFrame's column names (``feature_names_in_``), for names in
        ``categorical_features``.
    memory_budget : int or None
        Bytes a sparse ``X`` may take made dense (None: no bound).

    Returns
    -------
    TableEncoding
    """
    X = _dense(X, memory_budget)
    categorical = categorical_mask(X, categorical_features, feature_names)
    numeric = np.flatnonzero(~categorical)
    block = _numeric_block(X, numeric)
    statistics = _column_statistics(block) if block is not None else None
    levels = {j: _fit_levels(_column(X, j)) for j in np.flatnonzero(categorical)}
    n_indicators = sum(column.width for column in levels.values())
    if statistics is not None:
        n_indicators += int(np.count_nonzero(statistics.missing))
    if isinstance(X, np.memmap):
        scaling = ColumnScaling(False, "a memory-mapped X is read as it is")
        if statistics is not None and statistics.missing.any():
            raise ValueError("X is memory-mapped and has missing values: impute them in the file first.")
    elif statistics is None:
        scaling = ColumnScaling(False, "no numeric column")
    else:
        scaling = plan_column_scaling(statistics.low, statistics.high, statistics.mean, statistics.std, n_indicators)
    columns = list(levels.get(j) for j in range(X.shape[1]))
    for position, j in enumerate(numeric):
        mean = float(statistics.mean[position]) if np.isfinite(statistics.mean[position]) else 0.0
        std = float(statistics.std[position])
        standardized = scaling.standardize and std > 0
        columns[j] = NumericColumn(
            mean, mean if standardized else 0.0, std if standardized else 1.0, bool(statistics.missing[position])
        )
    passthrough = (
        not categorical.any()
        and not scaling.standardize
        and not (statistics is not None and statistics.missing.any())
        and isinstance(X, np.ndarray)
        and X.dtype.kind in "fiub"
    )
    return TableEncoding(tuple(columns), scaling, passthrough)


def categorical_mask(X, categorical_features, feature_names=None):
    """Boolean mask of ``X``'s categorical columns under ``categorical_features``."""
    n_features = X.shape[1]
    if categorical_features is None:
        return np.zeros(n_features, dtype=bool)
    if isinstance(categorical_features, str):
        if categorical_features != "from_dtype":
            raise ValueError(
                f"categorical_features={categorical_features!r}: use 'from_dtype', a mask, indices or names."
            )
        return np.array([_categorical_dtype(_column(X, j)) for j in range(n_features)], dtype=bool)
    chosen = np.asarray(categorical_features)
    if chosen.dtype == bool:
        if chosen.shape != (n_features,):
            raise ValueError(
                f"categorical_features is a mask of {chosen.shape[0]} entries; X has {n_features} columns."
            )
        return chosen.copy()
    mask = np.zeros(n_features, dtype=bool)
    if chosen.dtype.kind in "iu":
        if chosen.size and (chosen.min() < -n_features or chosen.max() >= n_features):
            raise ValueError(f"categorical_features holds indices outside the {n_features} columns of X.")
        mask[chosen] = True
        return mask
    if chosen.dtype.kind in "UO":
        if feature_names is None:
            raise ValueError("categorical_features names columns, but X has no column names (pass a DataFrame).")
        names = list(feature_names)
        unknown = [name for name in chosen if name not in names]
        if unknown:
            raise ValueError(f"categorical_features names columns that X does not have: {unknown}.")
        mask[[names.index(name) for name in chosen]] = True
        return mask
    raise ValueError("categorical_features must be 'from_dtype', a boolean mask, integer indices or column names.")


def column_variances(X):
    """Each column's variance (float64, population), read in row blocks."""
    return _column_statistics(X).std ** 2


def _covariance(X, columns):
    """The (population) covariance matrix of ``X[:, columns]``, read in row blocks.

    For 0/1 indicator columns: their moments about zero do not cancel.
    """
    width = len(columns)
    products, sums = np.zeros((width, width)), np.zeros(width)
    rows = max(1, _BLOCK_BYTES // (8 * max(width, 1)))
    for start in range(0, X.shape[0], rows):
        part = np.asarray(X[start : start + rows, columns], dtype=np.float64)
        products += part.T @ part
        sums += part.sum(axis=0)
    n_rows = max(X.shape[0], 1)
    mean = sums / n_rows
    return products / n_rows - np.outer(mean, mean)


@dataclass(frozen=True)
class _ColumnStatistics:
    low: np.ndarray
    high: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    missing: np.ndarray  # bool: the column has a missing value


def _column_statistics(block):
    """Per-column smallest, largest, mean and standard deviation of the observed values, in row blocks."""
    columns = block.shape[1]
    count, mean, squares = np.zeros(columns), np.zeros(columns), np.zeros(columns)
    low, high = np.full(columns, np.inf), np.full(columns, -np.inf)
    rows = max(1, _BLOCK_BYTES // (8 * max(columns, 1)))
    for start in range(0, block.shape[0], rows):
        part = _BlockStatistics.of(np.asarray(block[start : start + rows], dtype=np.float64))
        # Chan et al.'s pairwise update: no cancellation of large means.
        total = count + part.count
        delta = part.mean - mean
        share = np.divide(part.count, total, out=np.zeros(columns), where=total > 0)
        squares += part.squares + delta**2 * count * share
        mean += delta * share
        count = total
        low, high = np.minimum(low, part.low), np.maximum(high, part.high)
    if (high == np.inf).any() or (low == -np.inf).any():  # an all-missing column has low inf, high -inf
        raise ValueError(_INFINITY)
    if not np.isfinite(squares).all():
        largest = float(np.max(np.maximum(np.abs(low), np.abs(high))))
        raise ValueError(
            f"X holds values up to {largest:.3g} in absolute value: the squares of its columns' deviations overflow "
            "float64, so their spread cannot be measured. Rescale X."
        )
    std = np.sqrt(np.divide(squares, count, out=np.zeros(columns), where=count > 0))
    mean = np.where(count > 0, mean, np.nan)
    return _ColumnStatistics(low, high, mean, std, count < block.shape[0])


@dataclass(frozen=True)
class _BlockStatistics:
    count: np.ndarray
    mean: np.ndarray
    squares: np.ndarray  # sum of squared deviations from the block's mean
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, part):
        observed = ~np.isnan(part)
        if observed.all():  # the common case: no masked reductions
            mean = part.mean(axis=0)
            squares = ((part - mean) ** 2).sum(axis=0)
            return cls(np.full(part.shape[1], float(part.shape[0])), mean, squares, part.min(axis=0), part.max(axis=0))
        count = observed.sum(axis=0).astype(np.float64)
        mean = np.where(observed, part, 0.0).sum(axis=0) / np.maximum(count, 1)
        squares = (np.where(observed, part - mean, 0.0) ** 2).sum(axis=0)
        low = np.where(observed, part, np.inf).min(axis=0)
        high = np.where(observed, part, -np.inf).max(axis=0)
        return cls(count, mean, squares, low, high)


def _encode_numeric(values, column, out):
    missing = np.isnan(values)
    if np.isinf(values).any():
        raise ValueError(_INFINITY)
    out[:, 0] = (np.where(missing, column.fill, values) - column.shift) / column.scale
    if column.indicator:
        out[:, 1] = missing


def _with_missing_filled(X, columns):
    """``X`` itself, or a copy with its missing values at their column's mean where it has any (pass-through)."""
    missing = np.isnan(X) if X.dtype.kind == "f" else None
    if missing is None or not missing.any():
        return X
    if np.isinf(X).any():
        raise ValueError(_INFINITY)
    means = np.array([column.fill for column in columns], dtype=X.dtype)
    return np.where(missing, means, X)


def _as_float_array(X):
    if X.dtype.kind == "f":
        return X
    return X.astype(np.float64)


def _numeric_block(X, numeric):
    """The numeric columns as a float array (float32 kept), or None without any."""
    if len(numeric) == 0:
        return None
    if isinstance(X, np.ndarray) and X.dtype.kind in "fiub":
        block = X if len(numeric) == X.shape[1] else X[:, numeric]
        return _as_float_array(block)
    return np.column_stack([_as_float(_column(X, j)) for j in numeric])


def _as_float(values):
    """A numeric column as float64 (float32 kept), missing values (None, NaN, ``pd.NA``) as NaN."""
    if hasattr(values, "to_numpy"):  # a pandas Series, nullable dtypes included
        single = str(values.dtype).lower() == "float32"
        return values.to_numpy(dtype=np.float32 if single else np.float64, na_value=np.nan)
    values = np.asarray(values)
    if values.dtype == object:
        values = np.where(_missing(values), np.nan, values)
    return values.astype(np.float64)


def _column(X, j):
    return X.iloc[:, j] if hasattr(X, "iloc") else X[:, j]


def _categorical_dtype(values):
    """``"from_dtype"``: a pandas category, boolean or string column, or an object column of strings."""
    dtype = values.dtype
    name = getattr(dtype, "name", "")
    if name in ("category", "boolean", "string", "str") or (name == "bool" and hasattr(values, "iloc")):
        return True
    if dtype.kind in "US":
        return True
    if dtype.kind != "O":
        return False
    observed = np.asarray(values, dtype=object)
    observed = observed[~_missing(observed)]
    return observed.size > 0 and all(isinstance(value, (str, bool, np.str_, np.bool_)) for value in observed)


def _missing(values):
    """Elementwise: None, a float NaN or ``pd.NA`` (an object array)."""
    return np.fromiter(
        (
            value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and value != value)
            for value in values
        ),
        dtype=bool,
        count=len(values),
    )


def _category_keys(values):
    """``(keys, missing)``: each value's level as a string, and where it is missing."""
    if getattr(values.dtype, "name", "") == "category":
        codes = values.cat.codes.to_numpy()
        names = np.array([str(level) for level in values.cat.categories] + [""], dtype=object)
        return names[codes].astype(str), codes < 0
    values = values.to_numpy(dtype=object) if hasattr(values, "to_numpy") else np.asarray(values, dtype=object)
    missing = _missing(values)
    keys = np.where(missing, "", values).astype(str)
    return keys, missing


def _lookup(levels, keys, missing):
    """``(index, found)``: each key's position in the sorted ``levels``, and whether it is one of them."""
    if len(levels) == 0:
        return np.zeros(len(keys), dtype=np.intp), np.zeros(len(keys), dtype=bool)
    index = np.minimum(np.searchsorted(levels, keys), len(levels) - 1)
    return index, (levels[index] == keys) & ~missing


def _fit_levels(values):
    """The :class:`CategoricalColumn` of a training column."""
    keys, missing = _category_keys(values)
    levels, counts = np.unique(keys[~missing], return_counts=True)
    pooled = levels[:0]
    if len(levels) > MAX_CATEGORY_LEVELS:
        # The most frequent keep their columns (ties to the first in sorted order).
        order = np.argsort(-counts, kind="stable")
        pooled = np.sort(levels[order[MAX_CATEGORY_LEVELS:]])
        levels = np.sort(levels[order[:MAX_CATEGORY_LEVELS]])
    return CategoricalColumn(levels, pooled, bool(missing.any()))


def _dense(X, memory_budget):
    """``X`` with a sparse matrix made dense, where its float64 form fits ``memory_budget``."""
    if not scipy.sparse.issparse(X):
        return X
    needed = X.shape[0] * X.shape[1] * 8
    if memory_budget is not None and needed > memory_budget:
        raise ValueError(
            f"X is a sparse matrix of shape {X.shape}; the kernel estimators need it dense, which takes "
            f"{needed / 2**30:.2f} GiB, over the memory budget of {memory_budget / 2**30:.2f} GiB. Raise "
            "memory_budget, or reduce the columns (for example with TruncatedSVD)."
        )
    return X.toarray()
