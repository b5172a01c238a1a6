"""Input checks shared by the estimator shells."""

import math

import numpy as np
import scipy.sparse
import torch
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.validation import _check_sample_weight


def check_sample_weight(sample_weight, n_samples):
    """``sample_weight`` as float64 of length ``n_samples``: non-negative and not all zero."""
    weights = _check_sample_weight(sample_weight, np.empty((n_samples, 0)), dtype=np.float64)
    if np.any(weights < 0):
        raise ValueError("sample_weight must be non-negative.")
    if not np.any(weights > 0):
        raise ValueError("sample_weight is zero for every sample; there is nothing to fit.")
    return weights


def unequal_weights(weights):
    """``weights`` where they differ; None where every row weighs the same (a fit then skips them).

    The one test of equal weights: a weighted statistic, solve or criterion with equal
    weights is the unweighted one, so every fit stage asks this before it carries them.
    """
    return None if np.all(weights == weights[0]) else weights


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


def output_dtype(dtype):
    """The dtype of results for input of ``dtype``: float32 stays float32, anything else gives float64."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def class_weighted(sample_weight, class_weight, classes, labels):
    """``sample_weight`` (None: ones) times the weight ``class_weight`` gives each sample's class.

    scikit-learn's semantics: a dict maps labels to weights (absent classes weigh 1;
    keys that are not classes raise as :func:`~sklearn.utils.class_weight.compute_class_weight`
    does), and ``"balanced"`` gives class ``c`` the weight ``n / (n_classes n_c)``, with
    ``n_c`` the (sample-weighted) count of its samples, as
    :class:`~sklearn.linear_model.LogisticRegression` computes it.  ``labels`` are
    indices into ``classes``; None for ``class_weight`` returns ``sample_weight`` unchanged.
    """
    if class_weight is None:
        return sample_weight
    weights = check_sample_weight(sample_weight, labels.shape[0])
    if isinstance(class_weight, str):  # "balanced", on the (weighted) counts of the training labels
        counts = np.bincount(labels, weights=weights, minlength=classes.shape[0])
        per_class = np.divide(counts.sum(), classes.shape[0] * counts, out=np.zeros_like(counts), where=counts > 0)
    else:
        per_class = compute_class_weight(class_weight, classes=classes, y=classes[labels])
        if np.any(np.asarray(per_class) < 0):
            raise ValueError(f"class_weight must be non-negative; got {class_weight!r}.")
    return weights * np.asarray(per_class, dtype=np.float64)[labels]
