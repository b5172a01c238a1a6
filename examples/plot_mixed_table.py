"""
A mixed-type table as it comes: mortgage denials with categories and raw units
===============================================================================

AER's ``HMDA`` table (Boston mortgage applications, 2380 rows) mixes numeric
columns in their own units (payment-to-income and housing-expense ratios,
loan-to-value, the unemployment rate of the applicant's industry) with factors
held as pandas categories (credit histories, self-employment, insurance denial,
condominium, race, marital status, education).
:class:`~skgpu_kernel.AdaptiveKernelClassifier` takes the DataFrame as it is: it
encodes each category as one 0/1 column per level, standardizes the numeric columns
because they are in different units (``column_scaling_``), and calibrates its
probabilities on rows it holds out.  No ``ColumnTransformer`` is needed; see
:ref:`tables`.

The figure shows which input columns each model relies on (the permutation
importance of each column of the DataFrame: the rise in test log loss when the
column's values are shuffled, so a category counts once however many levels it
has) and how well the probabilities are calibrated against HistGradientBoosting's
on the same split (a reliability diagram: the observed rate of denials among test
rows binned by predicted probability).
"""

# %%
# Data and fits
# -------------
# The table is read from the Debian package ``r-cran-aer`` (no download).  Without
# it (or without the ``rdata`` reader), the example says so and takes scikit-learn's
# bundled diabetes table in its raw units instead, its ``sex`` column a category and
# the target whether the disease progressed beyond the median.
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from sklearn.calibration import calibration_curve
from sklearn.datasets import load_diabetes
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.inspection import permutation_importance
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split

from skgpu_kernel import AdaptiveKernelClassifier
from skgpu_kernel.datasets import load_aer


def mixed_table():
    """AER's HMDA, or scikit-learn's diabetes table with a category, saying why."""
    try:
        bunch = load_aer("HMDA", target="deny", dropna=False)
    except (FileNotFoundError, ImportError) as error:
        print(f"{error}\nFalling back to scikit-learn's diabetes table (sex as a category).")
        frame = load_diabetes(as_frame=True, scaled=False).frame
        frame["sex"] = pd.Categorical(frame["sex"].map({1.0: "level 1", 2.0: "level 2"}))
        target = frame.pop("target")
        return frame, np.where(target > target.median(), "progressed", "stable")
    return bunch.data, np.asarray(bunch.target.astype(str))


X, y = mixed_table()
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)

model = AdaptiveKernelClassifier(random_state=0).fit(X_train, y_train)
boosting = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0).fit(X_train, y_train)
print(f"columns: {list(X.columns)}")
print(f"categorical: {model.is_categorical_.sum()} of {X.shape[1]}; numeric columns: {model.column_scaling_}")
for name, fitted in (("ours", model), ("HistGradientBoosting", boosting)):
    proba = fitted.predict_proba(X_test)
    print(f"{name:>20}: accuracy {fitted.score(X_test, y_test):.3f}, log loss {log_loss(y_test, proba):.3f}")

# %%
# Importances per input column, and a reliability diagram
# --------------------------------------------------------
fig, (ax_importance, ax_reliability) = plt.subplots(1, 2, figsize=(11, 4.4))
importances = {
    name: permutation_importance(fitted, X_test, y_test, scoring="neg_log_loss", n_repeats=5, random_state=0)
    for name, fitted in (("ours", model), ("HistGradientBoosting", boosting))
}
order = np.argsort(importances["ours"].importances_mean)
positions = np.arange(X.shape[1])
COLORS = {"ours": "tab:blue", "HistGradientBoosting": "tab:orange"}
for offset, (name, color) in zip((-0.2, 0.2), COLORS.items(), strict=True):
    ax_importance.barh(positions + offset, importances[name].importances_mean[order], 0.4, color=color, label=name)
ax_importance.set_yticks(positions, np.asarray(X.columns)[order])
ax_importance.set_xlabel("rise in test log loss when the column is shuffled")
ax_importance.set_title("Permutation importance per input column")
ax_importance.legend(frameon=False)
positive = model.classes_[1]
for name, fitted, color in (("ours", model, "tab:blue"), ("HistGradientBoosting", boosting, "tab:orange")):
    proba = fitted.predict_proba(X_test)[:, list(fitted.classes_).index(positive)]
    observed, predicted = calibration_curve(y_test == positive, proba, n_bins=8, strategy="quantile")
    ax_reliability.plot(predicted, observed, "o-", color=color, label=name)
ax_reliability.plot([0, 1], [0, 1], color="0.6", linestyle=":", label="calibrated")
ax_reliability.set_xlabel(f"predicted P({positive})")
ax_reliability.set_ylabel("observed rate")
ax_reliability.set_title("Reliability on the test rows")
ax_reliability.legend(frameon=False)
fig.tight_layout()

# Set SKGPU_EXAMPLE_OUT to a ``.png`` path or to a directory to keep the figure.
out = os.environ.get("SKGPU_EXAMPLE_OUT")
if out:
    if not out.lower().endswith(".png"):
        os.makedirs(out, exist_ok=True)
        out = os.path.join(out, "plot_mixed_table.png")
    fig.savefig(out, dpi=100)

# %%
# Reading the picture
# -------------------
# Both models lean on the same columns: the denial of mortgage insurance, the
# payment-to-income ratio and the credit histories, as the econometric studies of
# this table do; each category counts once, however many levels it has.  The
# kernel classifier's temperature (``calibration_temperature_``) was chosen on rows
# the fit held out, so its probabilities need no ``CalibratedClassifierCV``: its
# points follow the diagonal where most test rows are (low predicted
# probabilities), and its log loss is the lower of the two on this split.  In the
# top bin, the few rows most likely to be denied, it is under-confident: one
# temperature scales every score alike.
