"""Iteration loops on tensors: no scikit-learn, no input validation."""

from .eigenpro import EigenProResult, fit_eigenpro

__all__ = ["EigenProResult", "fit_eigenpro"]
