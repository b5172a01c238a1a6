"""Input checks shared by the estimator shells."""

import math

import numpy as np
import scipy.sparse
import torch
from sklearn.utils.validation import _check_sample_weight


def check_sample_weight(sample_weight, n_samples):
    """``sample_weight`` as float64 of length ``n_samples``: non-negative and not all zero."""
    weights = _check_sample_weight(sample_weight, np.empty((n_samples, 0)), dtype=np.float64)
    if np.any(weights < 0):
        raise ValueError("sample_weight must be non-negative.")
    if not np.any(weights > 0):
        raise ValueError("sample_weight is zero for every sample; there is nothing to fit.")
    return weights


def check_representable(array, dtype, name):
    """Raise ``ValueError`` when ``array``'s values are too large for training in ``dtype``.

    Training squares the inputs (kernel distances, step sizes from row norms, square
    losses), summed over the columns: values beyond ``sqrt(max / n_columns)`` of the
    torch ``dtype`` overflow to inf there, and the fit would fail later with a message
    that does not name the cause (NaN losses, a NaN step size).
    """
    values = array.data if scipy.sparse.issparse(array) else np.asarray(array)
    if values.size == 0:
        return
    n_columns = array.shape[1] if len(array.shape) > 1 else 1
    limit = math.sqrt(torch.finfo(dtype).max / max(n_columns, 1))
    largest = float(np.max(np.abs(values)))
    if largest > limit:
        dtype_name = str(dtype).replace("torch.", "")
        raise ValueError(
            f"{name} holds values up to {largest:.3g} in absolute value: training in {dtype_name} squares them "
            f"(sums of squares over its {n_columns} column{'s' if n_columns != 1 else ''}), which overflows beyond "
            f"{limit:.3g}. Rescale {name} "
            "(for example with StandardScaler)" + (" or use dtype='float64'." if dtype != torch.float64 else ".")
        )
