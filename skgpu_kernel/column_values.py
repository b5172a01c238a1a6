"""What one input column's values are: their kind (numbers, strings, categories, dates), missing entries, levels.

:mod:`skgpu_kernel.tables` encodes a table column by column; the rules for reading
one column's values are here: which kind a column is (``pandas.api.types.infer_dtype``
for object columns), which entries are missing, and the levels of a categorical
column keyed by value (numbers as numbers, strings as strings).
"""

import numbers

import numpy as np

__all__ = [
    "checked_kind",
    "column_of",
    "first_string",
    "from_dtype",
    "keys_like",
    "level_keys",
    "lookup",
    "missing_entries",
    "value_kind",
]

# Classes of single values, for an object column pandas does not name (see _classified_kind).
_MISSING, _BOOL, _NUMBER, _STRING, _DATETIME, _OTHER = range(6)


# pandas.api.types.infer_dtype's answers for an object column, by what the encoding does with them.
_INFERRED_KINDS = {
    "string": "string",
    "bytes": "string",
    "boolean": "bool",
    "integer": "number",
    "floating": "number",
    "mixed-integer-float": "number",
    "decimal": "number",
    "empty": "number",  # every value missing: a numeric column that never varies
    "datetime64": "datetime",
    "datetime": "datetime",
    "date": "datetime",
    "timedelta64": "datetime",
    "timedelta": "datetime",
    "time": "datetime",
    "period": "datetime",
}


def column_of(X, j):
    return X.iloc[:, j] if hasattr(X, "iloc") else X[:, j]


def from_dtype(values, label):
    """``"from_dtype"``: a category, boolean or string column, or an object column of strings (and booleans)."""
    kind = checked_kind(values, label)
    if kind == "mixed":
        raise ValueError(
            f"{label} mixes numbers and strings (for example {first_string(values)!r}): name it in "
            "categorical_features to take each value as a level, or convert it to numbers."
        )
    return kind in ("category", "bool", "string")


def checked_kind(values, label):
    """:func:`value_kind`, refusing a column of dates or times by name."""
    kind = value_kind(values)
    if kind == "datetime":
        raise ValueError(
            f"{label} holds dates or times ({values.dtype}), which the kernel cannot measure distances in: convert "
            "it to numbers (for example days since a reference date, or year, month and day columns), or to "
            "strings to take each value as a level, or drop it."
        )
    return kind


def value_kind(values):
    """What a column holds: category, bool, number, string, mixed (numbers and strings), datetime or other."""
    dtype = values.dtype
    name = str(getattr(dtype, "name", dtype)).lower()
    if name == "category":
        return "category"
    if name.startswith("string") or name == "str" or dtype.kind in "US":
        return "string"
    if dtype.kind == "b":
        return "bool"
    if dtype.kind in "fiu":
        return "number"
    if dtype.kind in "mM" or name.startswith("period"):
        return "datetime"
    if dtype.kind != "O":
        return "other"
    values = _object_array(values)
    try:
        import pandas as pd
    except ImportError:
        return _classified_kind(values)
    return _INFERRED_KINDS.get(pd.api.types.infer_dtype(values, skipna=True)) or _classified_kind(values)


def _classified_kind(values):
    """:func:`value_kind` of an object array, from the classes of its values."""
    present = set(np.unique(np.frompyfunc(_value_class, 1, 1)(values).astype(np.int8)).tolist()) - {_MISSING}
    if _OTHER in present:
        return "other"
    if _DATETIME in present:
        return "datetime"
    if _STRING in present:
        return "mixed" if _NUMBER in present else "string"
    return "bool" if present == {_BOOL} else "number"


def _value_class(value):
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return _MISSING
    if isinstance(value, (bool, np.bool_)):
        return _BOOL
    if isinstance(value, numbers.Real) or (
        isinstance(value, numbers.Number) and not isinstance(value, numbers.Complex)
    ):
        return _NUMBER if value == value else _MISSING  # a real number (Decimal included), or NaN
    if isinstance(value, (str, bytes)):
        return _STRING
    if isinstance(value, (np.datetime64, np.timedelta64)) or type(value).__module__ == "datetime":
        return _DATETIME
    return _OTHER


def _object_array(values):
    return values.to_numpy(dtype=object) if hasattr(values, "to_numpy") else np.asarray(values, dtype=object)


def first_string(values):
    return next((value for value in _object_array(values) if isinstance(value, str)), "")


def missing_entries(values):
    """Elementwise: None, NaN, ``pd.NA`` or ``pd.NaT`` (an object array)."""
    try:
        import pandas as pd
    except ImportError:
        return np.frompyfunc(lambda value: _value_class(value) == _MISSING, 1, 1)(values).astype(bool)
    return np.asarray(pd.isna(values), dtype=bool)


def level_keys(values, label="the column"):
    """``(keys, missing)``: each value's level (float64 for numbers, str otherwise), and where it is missing."""
    kind = checked_kind(values, label)
    if kind == "category":
        codes = values.cat.codes.to_numpy()
        names, _ = level_keys(values.cat.categories, label)
        missing = codes < 0
        if len(names) == 0:
            return np.full(codes.shape[0], np.nan), missing
        return names[np.where(missing, 0, codes)], missing
    if kind in ("number", "bool"):
        if hasattr(values, "to_numpy"):
            keys = values.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            array = np.asarray(values)
            keys = np.where(missing_entries(array), np.nan, array) if array.dtype == object else array
            keys = keys.astype(np.float64)
        return keys, np.isnan(keys)
    array = _object_array(values)
    missing = missing_entries(array)
    keys = np.where(missing, "", array)
    if kind != "string":  # numbers among strings: a whole number without its ".0"
        keys = np.frompyfunc(_level_name, 1, 1)(keys)
    return keys.astype(str), missing


def _level_name(value):
    """A level's string: a whole number without its ``.0``, so that 1 and 1.0 are one level."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    return str(value)


def keys_like(levels, keys, missing, label):
    """``keys`` as the fitted ``levels``' kind: numbers named for string levels; strings refused for numbers."""
    if len(levels) == 0 or (levels.dtype.kind == "f") == (keys.dtype.kind == "f"):
        return keys, missing
    if levels.dtype.kind == "f":
        example = next((key for key, absent in zip(keys, missing, strict=True) if not absent), "")
        raise ValueError(
            f"{label} was fitted on numeric levels and holds strings at predict (for example {example!r}): "
            "give it as numbers, as in fit."
        )
    return np.frompyfunc(_level_name, 1, 1)(keys).astype(str), missing


def lookup(levels, keys, missing):
    """``(index, found)``: each key's position in the sorted ``levels``, and whether it is one of them."""
    if len(levels) == 0:
        return np.zeros(len(keys), dtype=np.intp), np.zeros(len(keys), dtype=bool)
    index = np.minimum(np.searchsorted(levels, keys), len(levels) - 1)
    return index, (levels[index] == keys) & ~missing
