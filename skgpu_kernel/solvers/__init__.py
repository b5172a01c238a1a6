"""Iteration loops on tensors: no scikit-learn, no input validation."""

from .eigenpro import KernelLoopResult, fit_eigenpro
from .eigenpro3 import fit_eigenpro3

__all__ = ["KernelLoopResult", "fit_eigenpro", "fit_eigenpro3"]
