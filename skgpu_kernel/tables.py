"""Tables as users hold them: categories, strings and missing values in, one float matrix for the kernel out.

The kernel estimators take ``X`` as a numeric array, a sparse matrix or a table (a
pandas DataFrame; a polars or pyarrow table is read through its ``to_pandas``), and
:func:`fit_table_encoding` learns on the training rows of positive weight how each
input column becomes columns of the matrix the kernel sees; the fitted
:class:`TableEncoding` (``table_encoding_``) applies the same rule at ``predict``,
a block of rows at a time.

The rules:

- **Which columns are categorical** (``categorical_features``): ``"from_dtype"``
  takes a table's ``category``, boolean and string columns, object columns of
  strings (or of strings and booleans), and a numpy array's boolean, string and
  object-of-strings columns; a boolean mask, indices, or names (with a table's
  column names) choose them; None or an empty list takes none.
- **A category** is one 0/1 column per level observed in ``fit``, in sorted order
  (the rows one category apart are then at squared distance 2, as two
  standardized columns one standard deviation apart): the same matrix as
  scikit-learn's ``OneHotEncoder(drop="if_binary", handle_unknown="ignore")``.  A
  column with two levels and no missing value is one column, the second level's
  indicator.  Ordered categories are taken as unordered.  Missing values (None,
  NaN, ``pd.NA``, ``pd.NaT``) seen in ``fit`` are a level of their own.
- **Levels are values**: a column of numbers (integer codes, floats, booleans)
  has numeric levels, sorted as numbers, so that the code 1 is the level 1.0 of a
  batch that pandas made float by a missing value; a column of strings has string
  levels, sorted as strings (``OneHotEncoder``'s orders).  A column the user names
  categorical that mixes numbers and strings takes every value as a string, a
  whole number written without its ``.0`` (1 and 1.0 are ``"1"``).  A column
  fitted on numbers that holds strings at ``predict`` is refused by name.
- **Refused by name**: a column of dates or times (convert it to numbers, for
  example days since a reference date, or to year, month and day columns; or to
  strings to take it as a category), and, under ``"from_dtype"``, an object column
  mixing numbers and strings (name it in ``categorical_features``, or convert it).
- **An unknown level at predict** (never seen in ``fit``, or missing where ``fit``
  had no missing value) is zeros across a one-hot block, 0.5 in a two-level
  column: equidistant from every known level in the plain kernel (a learnt
  metric's block puts it at squared distance ``M_ll`` from level ``l``).
- **Many levels**: the ``MAX_CATEGORY_LEVELS`` most frequent (by total weight) keep
  a column each and the rest share one, so that an identifier with thousands of
  levels adds at most ``MAX_CATEGORY_LEVELS + 2`` columns.
- **Missing numeric values** take the column's training mean, and a column with
  missing values in ``fit`` gains a 0/1 indicator column after it, so that the
  kernel can tell an imputed value from an observed one.  A value missing at
  ``predict`` in a column that had none in ``fit`` takes the mean, without indicator.
- **Units** (``column_scaling``): ``"auto"`` standardizes the numeric columns, or
  keeps them, by :func:`skgpu_kernel.planning.columns.plan_column_scaling`;
  ``"standardize"`` and ``"none"`` decide it (so that folds of a cross-validation
  near the rule's thresholds cannot differ).  The result is ``column_scaling_``.
- **Weights**: the statistics (means, standard deviations, the levels' counts)
  are weighted by ``sample_weight``, and rows of weight 0 are absent: the
  estimators drop them before the encoding is fitted.
- **Sparse input** (CSR, CSC, COO) is made dense where its dense float64 form fits
  the memory budget, and refused with a message naming the sizes otherwise.  An
  array backed by a memory-mapped file is read as it is (never copied, an integer
  file included) under ``column_scaling="auto"`` or ``"none"``: no standardizing,
  no missing values.

A numeric array without missing values whose columns are kept passes through
unchanged (no copy where it is C-ordered), so such fits are those of the
estimators without this layer; a table of the same numbers gives the same matrix,
and so the same model, bit for bit.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from ._validation import check_sample_weight, unequal_weights
from .column_values import (
    checked_kind,
    column_of,
    first_string,
    from_dtype,
    keys_like,
    level_keys,
    lookup,
    missing_entries,
    value_kind,
)
from .planning.columns import COLUMN_SCALINGS, ColumnScaling, plan_column_scaling
from .row_sources import _backing_memmap

__all__ = [
    "COLUMN_SCALINGS",
    "ENCODED_BLOCK_SHARE",
    "MAX_CATEGORY_LEVELS",
    "CategoricalColumn",
    "TableEncoding",
    "as_pandas",
    "column_variances",
    "fit_table_encoding",
    "is_table",
    "rows_of_positive_weight",
    "table_choice",
    "table_rows",
]

# Levels of a categorical column with a column of their own; the rest share one.
# HistGradientBoosting's limit on a category's levels.  A smaller cap pools levels that
# carry the signal: at 100, VietNamI's 194 communes (each about 140 rows) lost 94 to the
# shared column, and the test MSE rose from 0.177 to 0.255 (split 0).
MAX_CATEGORY_LEVELS = 255
# The share of the memory budget one block of encoded rows may take at predict: the
# prediction's own blocks (kernel rows, scores) take the rest.
ENCODED_BLOCK_SHARE = 0.25
_INFINITY = "Input X contains infinity or a value too large for dtype('float64')."
# Bytes of the float64 block of rows the column statistics read at once: a block of a
# few MB stays in cache (Fashion-MNIST's 60000 x 784 pixels: 0.1 s, against 5 s in
# blocks of 65536 rows).
_BLOCK_BYTES = 2**23


def table_choice(categorical_features="from_dtype", column_scaling="auto"):
    """The user's choices an encoding is fitted with, comparable: a warm start must be asked the same."""
    if categorical_features is not None and not isinstance(categorical_features, str):
        categorical_features = tuple(np.asarray(categorical_features).tolist())
    return categorical_features, column_scaling


def _column_label(feature_names, j):
    """How messages name input column ``j``."""
    if feature_names is None:
        return f"column {j}"
    return f"column {j} ({feature_names[j]!r})"


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical input column's levels (sorted keys: float64 numbers or strings) and how they are encoded."""

    levels: np.ndarray
    pooled: np.ndarray  # the levels beyond MAX_CATEGORY_LEVELS, sharing one column
    missing_level: bool

    @property
    def binary(self):
        return len(self.levels) == 2 and not self.missing_level and not len(self.pooled)

    @property
    def width(self):
        return 1 if self.binary else len(self.levels) + self.missing_level + bool(len(self.pooled))

    def encode(self, values, out, label="the column"):
        """Write the block of ``values`` (a column) into ``out`` of shape ``(rows, width)``, zeroed."""
        keys, missing = keys_like(self.levels, *level_keys(values), label)
        index, found = lookup(self.levels, keys, missing)
        rows = np.flatnonzero(found)
        if self.binary:
            out[:, 0] = np.where(found, index, 0.5)
            return
        out[rows, index[rows]] = 1.0
        if self.missing_level:
            out[missing, len(self.levels)] = 1.0
        if len(self.pooled):
            _, in_pool = lookup(self.pooled, keys, missing | found)
            out[in_pool, self.width - 1] = 1.0


@dataclass(frozen=True)
class TableEncoding:
    """How each input column becomes columns of the kernel's matrix (:func:`fit_table_encoding`).

    A numeric input column ``x`` becomes ``(x - shift) / scale``, its missing values
    at ``fill``, followed by their 0/1 indicator where it has one.  ``fill`` is the
    training mean; ``shift`` and ``scale`` the mean and standard deviation where the
    columns are standardized, 0 and 1 where they are kept.

    Attributes
    ----------
    columns : tuple of CategoricalColumn or None
        One per input column, in order: a categorical column's levels, None for a
        numeric column.
    fill, shift, scale : ndarray of shape (n_numeric,)
        The numeric columns' (those None in ``columns``, in order) rule above.
    indicator : ndarray of bool, shape (n_numeric,)
        Each numeric column's indicator of missing values (it had some in ``fit``).
    scaling : ColumnScaling
        The units rule's decision.
    passthrough : bool
        A numeric array whose columns are kept and had no missing value: used as given.
    labels : tuple of str
        How messages name each input column (its index, and its name in a table).
    choice : tuple
        The user's choices it was fitted with (:func:`table_choice`).
    """

    columns: tuple
    fill: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    indicator: np.ndarray
    scaling: ColumnScaling
    passthrough: bool
    labels: tuple = ()
    choice: tuple = ()

    def check_choice(self, choice):
        """Refuse to continue (a warm start) in this encoding where ``choice`` (:func:`table_choice`) is another."""
        if self.choice != choice:
            raise ValueError(
                "warm_start continues the previous fit in the table encoding it learnt, but categorical_features "
                "or column_scaling changed since: set warm_start=False to fit a new encoding."
            )

    @property
    def is_categorical(self):
        """Boolean mask of the categorical input columns."""
        return np.array([column is not None for column in self.columns], dtype=bool)

    @property
    def numeric_columns(self):
        """The numeric input columns' indices: those of ``fill``, ``shift``, ``scale`` and ``indicator``, in order."""
        return np.flatnonzero(~self.is_categorical)

    @property
    def widths(self):
        """How many encoded columns each input column becomes."""
        widths = np.array([0 if column is None else column.width for column in self.columns], dtype=np.int64)
        widths[self.numeric_columns] = 1 + self.indicator
        return widths

    @property
    def n_features_out(self):
        return int(self.widths.sum())

    @property
    def column_starts(self):
        """Where each input column's encoded columns start, and the total at the end."""
        return np.concatenate([[0], np.cumsum(self.widths)])

    @property
    def categorical_blocks(self):
        """The encoded columns of each categorical input column of more than one column: one block of a metric."""
        starts = self.column_starts
        return tuple(
            np.arange(starts[j], starts[j + 1])
            for j, column in enumerate(self.columns)
            if column is not None and column.width > 1
        )

    @property
    def input_column(self):
        """For each encoded column, the input column it comes from (``feature_importances_`` sums over them)."""
        return np.repeat(np.arange(len(self.columns)), self.widths)

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
        """The kernel's float matrix for ``X`` (validated as in ``fit``).

        A pass-through array comes back as it is where it can (C-ordered, no
        missing value; a memory-mapped file always), otherwise as a C-ordered float
        copy: a table and its own array give the same matrix.
        """
        X = _dense(X, memory_budget)
        if self.passthrough:
            if isinstance(X, np.ndarray) and _backing_memmap(X) is not None:
                return X  # read as it is: never copied
            block = _numeric_block(X, np.arange(X.shape[1]), self._label)
            return np.ascontiguousarray(_with_missing_filled(_as_float_array(block), self.fill))
        numeric = self.numeric_columns
        block = _numeric_block(X, numeric, self._label)
        dtype = np.float32 if block is not None and block.dtype == np.float32 else np.float64
        out = np.zeros((X.shape[0], self.n_features_out), dtype=dtype)
        starts = self.column_starts
        for position, j in enumerate(numeric):
            self._encode_numeric(position, block[:, position], out[:, starts[j] : starts[j + 1]])
        for j, column in enumerate(self.columns):
            if column is not None:
                column.encode(column_of(X, j), out[:, starts[j] : starts[j + 1]], self._label(j))
        return out

    def _encode_numeric(self, position, values, out):
        """Write the block of ``values`` of the numeric column ``position`` (in ``fill``'s order) into ``out``."""
        missing = np.isnan(values)
        if np.isinf(values).any():
            raise ValueError(_INFINITY)
        # Python floats: a float32 column is encoded in float32 arithmetic, as a scalar of its own.
        fill, shift, scale = (float(field[position]) for field in (self.fill, self.shift, self.scale))
        out[:, 0] = (np.where(missing, fill, values) - shift) / scale
        if self.indicator[position]:
            out[:, 1] = missing

    def row_block(self, n_rows, memory_budget):
        """Rows encoded at once at predict: their float64 matrix within ``ENCODED_BLOCK_SHARE`` of the budget.

        Every row where the encoding passes ``X`` through (nothing is built) or no
        budget is given.
        """
        if self.passthrough or memory_budget is None:
            return max(n_rows, 1)
        per_row = 8 * max(self.n_features_out, 1)
        return int(min(max(n_rows, 1), max(1, ENCODED_BLOCK_SHARE * memory_budget // per_row)))

    def encoded_blocks(self, X, memory_budget):
        """The encoded rows of ``X`` (validated as in ``fit``), :meth:`row_block` rows at a time."""
        rows = self.row_block(X.shape[0], memory_budget)
        for start in range(0, X.shape[0], rows):
            yield self.transform(table_rows(X, start, start + rows), memory_budget)

    def _label(self, j):
        return self.labels[j] if j < len(self.labels) else f"column {j}"


def is_table(X):
    """A pandas, polars or pyarrow table (by the dataframe interchange or Arrow stream protocols)."""
    return hasattr(X, "iloc") or hasattr(X, "__dataframe__") or hasattr(X, "__arrow_c_stream__")


def as_pandas(X):
    """A table as a pandas DataFrame (a polars or pyarrow table through its ``to_pandas``), checked non-empty."""
    X = X if hasattr(X, "iloc") else X.to_pandas()
    if min(X.shape) < 1:
        raise ValueError(f"Found array with shape {X.shape}; the estimator needs at least 1 sample and 1 feature.")
    return X


def rows_of_positive_weight(X, y, sample_weight):
    """``(X, y, sample_weight)`` without the rows of weight 0: absent, as scikit-learn's contract has it.

    ``X`` an array, a sparse matrix or a DataFrame; ``sample_weight`` None keeps every row.
    """
    if sample_weight is None:
        return X, y, None
    weights = check_sample_weight(sample_weight, X.shape[0])
    present = np.flatnonzero(weights > 0)
    if present.shape[0] == X.shape[0]:
        return X, y, sample_weight
    if hasattr(X, "iloc"):
        return X.iloc[present], y[present], weights[present]
    if scipy.sparse.issparse(X):
        X = X.tocsr()
    return X[present], y[present], weights[present]


def table_rows(X, start, stop):
    """Rows ``start:stop`` of ``X`` (an array, a sparse matrix or a DataFrame), without copying where it can."""
    if hasattr(X, "iloc"):
        return X.iloc[start:stop]
    if scipy.sparse.issparse(X) and X.format not in ("csr", "csc"):
        X = X.tocsr()
    return X[start:stop]


def fit_table_encoding(
    X,
    *,
    categorical_features="from_dtype",
    column_scaling="auto",
    feature_names=None,
    sample_weight=None,
    memory_budget=None,
):
    """Learn the encoding of ``X``'s columns on the training rows.

    Parameters
    ----------
    X : ndarray, sparse matrix or pandas DataFrame of shape (n_samples, n_features)
        Checked for shape (2-D, non-empty) by the caller; rows of weight 0 already dropped.
    categorical_features : "from_dtype", array-like or None, default="from_dtype"
        See the module's rules (the estimators' parameter).
    column_scaling : {"auto", "standardize", "none"}, default="auto"
        See the module's rules (the estimators' parameter).
    feature_names : ndarray of str or None, default=None
        The table's column names (``feature_names_in_``), for names in
        ``categorical_features`` and in messages.
    sample_weight : ndarray of shape (n_samples,), default=None
        Positive weights of the statistics (None, or all equal: unweighted).
    memory_budget : int, default=None
        Bytes a sparse ``X`` may take made dense (None: no bound).

    Returns
    -------
    TableEncoding
    """
    if column_scaling not in COLUMN_SCALINGS:
        raise ValueError(f"column_scaling={column_scaling!r}: use one of {COLUMN_SCALINGS}.")
    X = _dense(X, memory_budget)
    labels = tuple(_column_label(feature_names, j) for j in range(X.shape[1]))
    weights = _unequal(sample_weight)
    categorical = categorical_mask(X, categorical_features, feature_names, labels)
    numeric = np.flatnonzero(~categorical)
    block = _numeric_block(X, numeric, labels.__getitem__)
    statistics = _column_statistics(np.zeros((X.shape[0], 0)) if block is None else block, weights)
    levels = {j: _fit_levels(column_of(X, j), weights, labels[j]) for j in np.flatnonzero(categorical)}
    n_indicators = sum(column.width for column in levels.values()) + int(np.count_nonzero(statistics.missing))
    scaling = _scaling(X, statistics, n_indicators, column_scaling)
    columns = tuple(levels.get(j) for j in range(X.shape[1]))
    mean = np.where(np.isfinite(statistics.mean), statistics.mean, 0.0)
    std = statistics.std
    standardized = scaling.standardize & (std > 0)
    shift, scale = np.where(standardized, mean, 0.0), np.where(standardized, std, 1.0)
    passthrough = (
        not categorical.any()
        and not scaling.standardize
        and not statistics.missing.any()
        and isinstance(X, np.ndarray)
        and X.dtype.kind in "fiu"
    )
    choice = table_choice(categorical_features, column_scaling)
    return TableEncoding(columns, mean, shift, scale, statistics.missing, scaling, passthrough, labels, choice)


def _unequal(sample_weight):
    """The weights where they differ; None where every row weighs the same (the unweighted statistics)."""
    if sample_weight is None:
        return None
    return unequal_weights(np.asarray(sample_weight, dtype=np.float64))


def _scaling(X, statistics, n_indicators, column_scaling):
    """Whether the numeric columns are standardized: a memory-mapped file is read as it is, unless asked."""
    memory_mapped = isinstance(X, np.ndarray) and _backing_memmap(X) is not None
    if memory_mapped and column_scaling != "standardize":
        if statistics.missing.any():
            raise ValueError("X is memory-mapped and has missing values: impute them in the file first.")
        return ColumnScaling(False, "a memory-mapped X is read as it is")
    if not statistics.missing.size:
        return ColumnScaling(False, "no numeric column")
    if column_scaling != "auto":
        return ColumnScaling(column_scaling == "standardize", f"column_scaling={column_scaling!r}")
    return plan_column_scaling(statistics.low, statistics.high, statistics.mean, statistics.std, n_indicators)


def categorical_mask(X, categorical_features, feature_names=None, labels=None):
    """Boolean mask of ``X``'s categorical columns under ``categorical_features``.

    ``"from_dtype"`` refuses, by name, a column of dates or times and an object
    column mixing numbers and strings.
    """
    n_features = X.shape[1]
    if categorical_features is None:
        return np.zeros(n_features, dtype=bool)
    if isinstance(categorical_features, str):
        if categorical_features != "from_dtype":
            raise ValueError(
                f"categorical_features={categorical_features!r}: use 'from_dtype', a mask, indices or names."
            )
        labels = labels or tuple(f"column {j}" for j in range(n_features))
        return np.array([from_dtype(column_of(X, j), labels[j]) for j in range(n_features)], dtype=bool)
    chosen = np.asarray(categorical_features)
    mask = np.zeros(n_features, dtype=bool)
    if chosen.size == 0:  # as HistGradientBoosting: none
        return mask
    if chosen.dtype == bool:
        if chosen.shape != (n_features,):
            raise ValueError(
                f"categorical_features is a mask of {chosen.shape[0]} entries; X has {n_features} columns."
            )
        return chosen.copy()
    if chosen.dtype.kind in "iu":
        if chosen.min() < -n_features or chosen.max() >= n_features:
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


def _column_statistics(block, weights=None):
    """Per-column smallest, largest, mean and standard deviation of the observed values, in row blocks.

    Weighted by ``weights`` where given (None: every row alike).
    """
    columns = block.shape[1]
    count, mean, squares = np.zeros(columns), np.zeros(columns), np.zeros(columns)
    low, high = np.full(columns, np.inf), np.full(columns, -np.inf)
    missing = np.zeros(columns, dtype=bool)
    rows = max(1, _BLOCK_BYTES // (8 * max(columns, 1)))
    for start in range(0, block.shape[0], rows):
        # C-ordered whatever the layout of X: a table and its own (Fortran-ordered) array sum alike.
        part = np.ascontiguousarray(block[start : start + rows], dtype=np.float64)
        part = _ColumnStatistics.of(part, None if weights is None else weights[start : start + rows])
        # Chan et al.'s pairwise update: no cancellation of large means.
        total = count + part.count
        delta = part.mean - mean
        share = np.divide(part.count, total, out=np.zeros(columns), where=total > 0)
        squares += part.squares + delta**2 * count * share
        mean += delta * share
        count = total
        low, high = np.minimum(low, part.low), np.maximum(high, part.high)
        missing |= part.missing
    if (high == np.inf).any() or (low == -np.inf).any():  # an all-missing column has low inf, high -inf
        raise ValueError(_INFINITY)
    if not np.isfinite(squares).all():
        largest = float(np.max(np.maximum(np.abs(low), np.abs(high))))
        raise ValueError(
            f"X holds values up to {largest:.3g} in absolute value: the squares of its columns' deviations overflow "
            "float64, so their spread cannot be measured. Rescale X."
        )
    return _ColumnStatistics(count, np.where(count > 0, mean, np.nan), squares, low, high, missing)


@dataclass(frozen=True)
class _ColumnStatistics:
    """Per-column statistics of the observed values of a block of rows, or of every row (:func:`_column_statistics`)."""

    count: np.ndarray  # the observed rows' total weight
    mean: np.ndarray  # NaN for a column without an observed value
    squares: np.ndarray  # weighted sum of squared deviations from the mean
    low: np.ndarray
    high: np.ndarray
    missing: np.ndarray  # bool: the column has a missing value

    @property
    def std(self):
        count = self.count
        return np.sqrt(np.divide(self.squares, count, out=np.zeros(count.shape[0]), where=count > 0))

    @classmethod
    def of(cls, part, weights=None):
        observed = ~np.isnan(part)
        missing = ~observed.all(axis=0)
        if weights is None and not missing.any():  # the common case: no masked reductions
            mean = part.mean(axis=0)
            squares = ((part - mean) ** 2).sum(axis=0)
            count = np.full(part.shape[1], float(part.shape[0]))
            return cls(count, mean, squares, part.min(axis=0), part.max(axis=0), missing)
        if weights is None:
            count = observed.sum(axis=0).astype(np.float64)
            mean = np.where(observed, part, 0.0).sum(axis=0) / np.maximum(count, 1)
            squares = (np.where(observed, part - mean, 0.0) ** 2).sum(axis=0)
        else:
            mass = np.where(observed, weights[:, None], 0.0)
            count = mass.sum(axis=0)
            mean = (mass * np.where(observed, part, 0.0)).sum(axis=0) / np.where(count > 0, count, 1.0)
            squares = (mass * np.where(observed, part - mean, 0.0) ** 2).sum(axis=0)
        low = np.where(observed, part, np.inf).min(axis=0)
        high = np.where(observed, part, -np.inf).max(axis=0)
        return cls(count, mean, squares, low, high, missing)


def _with_missing_filled(X, fill):
    """``X`` itself, or a copy with its missing values at their column's ``fill`` where it has any (pass-through)."""
    missing = np.isnan(X) if X.dtype.kind == "f" else None
    if missing is None or not missing.any():
        return X
    if np.isinf(X).any():
        raise ValueError(_INFINITY)
    return np.where(missing, np.asarray(fill, dtype=X.dtype), X)


def _as_float_array(X):
    if X.dtype.kind == "f":
        return X
    return X.astype(np.float64)


def _numeric_block(X, numeric, label):
    """The numeric columns as an array (a numeric array's own dtype; float32 kept), or None without any.

    ``label(j)`` names column ``j`` in messages.
    """
    if len(numeric) == 0:
        return None
    if isinstance(X, np.ndarray) and X.dtype.kind in "fiub":
        return X if len(numeric) == X.shape[1] else X[:, numeric]
    return np.column_stack([_as_float(column_of(X, j), label(j)) for j in numeric])


def _as_float(values, label):
    """A numeric column as float64 (float32 kept), missing values (None, NaN, ``pd.NA``) as NaN."""
    kind = checked_kind(values, label)
    if kind in ("string", "mixed") or (kind == "category" and value_kind(values.cat.categories) != "number"):
        raise ValueError(
            f"{label} holds strings (for example {first_string(values)!r}) but is not taken as categorical: "
            "name it in categorical_features, or convert it to numbers."
        )
    try:
        if hasattr(values, "to_numpy"):  # a pandas Series, nullable dtypes included
            single = str(values.dtype).lower() == "float32"
            return values.to_numpy(dtype=np.float32 if single else np.float64, na_value=np.nan)
        values = np.asarray(values)
        if values.dtype == object:
            values = np.where(missing_entries(values), np.nan, values)
        return values.astype(np.float64)
    except TypeError as error:  # a value neither a number nor a string
        raise TypeError(f"{label}: {error}") from error


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


def _fit_levels(values, weights, label):
    """The :class:`CategoricalColumn` of a training column (its levels counted by weight)."""
    keys, missing = level_keys(values, label)
    observed = ~missing
    levels, inverse = np.unique(keys[observed], return_inverse=True)
    counts = np.bincount(inverse.reshape(-1), None if weights is None else weights[observed], minlength=len(levels))
    pooled = levels[:0]
    if len(levels) > MAX_CATEGORY_LEVELS:
        # The most frequent keep their columns (ties to the first in sorted order).
        order = np.argsort(-counts, kind="stable")
        pooled = np.sort(levels[order[MAX_CATEGORY_LEVELS:]])
        levels = np.sort(levels[order[:MAX_CATEGORY_LEVELS]])
    return CategoricalColumn(levels, pooled, bool(missing.any()))
