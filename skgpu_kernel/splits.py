"""Held-out rows for early stopping (data layer: no estimator, no device)."""

import math

import numpy as np
from sklearn.model_selection import train_test_split

__all__ = ["holdout_split"]


def holdout_split(n_samples, validation_fraction, rng, stratify=None):
    """``(train, held_out)`` row indices: ``ceil(validation_fraction * n)`` rows held out, at least one.

    Stratified by ``stratify`` (class indices) when given, unless a class is too
    small to stratify.  One seed is drawn from ``rng``.

    Raises
    ------
    ValueError
        When no row would be left to train on.
    """
    n_validation = max(math.ceil(validation_fraction * n_samples), 1)
    if n_samples - n_validation < 1:
        raise ValueError(
            f"early_stopping needs at least 2 samples; got {n_samples} with validation_fraction={validation_fraction}."
        )
    indices = np.arange(n_samples)
    seed = rng.randint(np.iinfo(np.int32).max)
    try:
        return train_test_split(indices, test_size=n_validation, random_state=seed, stratify=stratify)
    except ValueError:  # a class too small to stratify
        return train_test_split(indices, test_size=n_validation, random_state=seed)
