"""Input checks shared by the estimator shells."""

import numpy as np
from sklearn.utils.validation import _check_sample_weight


def check_sample_weight(sample_weight, n_samples):
    """``sample_weight`` as float64 of length ``n_samples``: non-negative and not all zero."""
    weights = _check_sample_weight(sample_weight, np.empty((n_samples, 0)), dtype=np.float64)
    if np.any(weights < 0):
        raise ValueError("sample_weight must be non-negative.")
    if not np.any(weights > 0):
        raise ValueError("sample_weight is zero for every sample; there is nothing to fit.")
    return weights
