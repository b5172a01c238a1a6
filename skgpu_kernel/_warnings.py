"""Warnings attributed to the user's line, wherever in the package they are raised."""

import sys
import warnings
from pathlib import Path

__all__ = ["warn_user"]

_PACKAGE = str(Path(__file__).resolve().parent)


def _internal(frame):
    """Frames of this package, and scikit-learn's ``_fit_context`` wrapper around ``fit``."""
    filename = frame.f_code.co_filename
    if filename.startswith(_PACKAGE):
        return True
    return frame.f_code.co_name == "wrapper" and filename.endswith(str(Path("sklearn", "base.py")))


def warn_user(message, category=UserWarning):
    """``warnings.warn`` with the stack level of the first frame outside this package.

    The warning then names the user's call (``model.fit(X, y)``, or the line of a
    meta-estimator that called it) however deep in the package it was raised, as
    Python 3.12's ``skip_file_prefixes`` does.
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and _internal(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
