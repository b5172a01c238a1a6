"""Iteration loops on tensors: no scikit-learn, no input validation."""

from .eigenpro import EigenProResult, fit_eigenpro
from .eigenpro3 import EigenPro3Result, fit_eigenpro3

__all__ = ["EigenPro3Result", "EigenProResult", "fit_eigenpro", "fit_eigenpro3"]
