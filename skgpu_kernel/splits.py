"""Rows drawn at random: held out for early stopping, sampled for a measurement (data layer: no estimator, no device).

The draws of a fit, with the caller's random state; planning (pure) says how many.
"""

import math

import numpy as np
from sklearn.model_selection import train_test_split

from .buffer import default_chunk_size, plan_pass

__all__ = ["holdout_split", "sample_ranges", "validation_split"]

# Blocks of validation rows are at most this long, so that reading them stays
# sequential on disk without making the split coarse.
_VALIDATION_BLOCK = 1024


def _held_out_count(n_rows, fraction):
    """``ceil(fraction * n)`` rows held out, at least one; a ValueError where no row would be left to train on."""
    n_validation = max(math.ceil(fraction * n_rows), 1)
    if n_rows - n_validation < 1:
        raise ValueError(f"early_stopping needs at least 2 samples; got {n_rows} with validation_fraction={fraction}.")
    return n_validation


def holdout_split(n_samples, validation_fraction, rng, stratify=None):
    """``(train, held_out)`` row indices: ``ceil(validation_fraction * n)`` rows held out, at least one.

    Stratified by ``stratify`` (class indices) when given, unless a class is too
    small to stratify.  One seed is drawn from ``rng``.

    Raises
    ------
    ValueError
        When no row would be left to train on.
    """
    n_validation = _held_out_count(n_samples, validation_fraction)
    indices = np.arange(n_samples)
    seed = rng.randint(np.iinfo(np.int32).max)
    try:
        return train_test_split(indices, test_size=n_validation, random_state=seed, stratify=stratify)
    except ValueError:  # a class too small to stratify
        return train_test_split(indices, test_size=n_validation, random_state=seed)


def sample_ranges(n_train, size, rng):
    """Random chunks of ``size`` of the ``n_train`` training rows (as virtual training ranges).

    Parameters
    ----------
    n_train : int
    size : int
        Rows sampled, at most ``n_train`` (the plan's ``sample_rows``).
    rng : numpy.random.RandomState
        Draws the chunks.

    Returns
    -------
    list of (int, int)
    """
    return plan_pass(n_train, size, default_chunk_size(size, n_train), rng, shuffle=True)[0]


def validation_split(n_rows, fraction, rng):
    """Training segments and validation ranges: random blocks of rows.

    Blocks keep the validation reads sequential on disk; for small data they are
    single rows.

    Parameters
    ----------
    n_rows : int
    fraction : float
        Share of the rows held out (at least one row).
    rng : numpy.random.RandomState
        Draws the blocks.

    Returns
    -------
    train_segments, validation_ranges : list of (int, int)

    Raises
    ------
    ValueError
        When no training row would be left.
    """
    n_validation = _held_out_count(n_rows, fraction)
    block = max(1, min(_VALIDATION_BLOCK, n_validation // 8))
    n_blocks = math.ceil(n_rows / block)
    chosen = np.sort(rng.choice(n_blocks, size=math.ceil(n_validation / block), replace=False))
    validation = [(int(b * block), int(min((b + 1) * block, n_rows))) for b in chosen]
    return _complement(validation, n_rows), validation


def _complement(ranges, n_rows):
    """Sorted ranges of the rows of ``range(n_rows)`` not in ``ranges``."""
    kept, position = [], 0
    for start, stop in sorted(ranges):
        if start > position:
            kept.append((position, start))
        position = max(position, stop)
    if position < n_rows:
        kept.append((position, n_rows))
    return kept
