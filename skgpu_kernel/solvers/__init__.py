"""Kernel solvers on an operator, ``solve_<name>(operator, targets, plan) -> Solution``; BMGD's loops.

No scikit-learn, no input validation, no cache, grid, device or process-group
branches: see :mod:`skgpu_kernel.solvers.solution`.
"""

from .centers_cg import solve_centers_cg
from .direct import solve_direct
from .eigenpro import solve_eigenpro2
from .eigenpro3 import solve_eigenpro3
from .full_kernel_cg import solve_full_kernel_cg
from .solution import Solution, Targets

__all__ = [
    "Solution",
    "Targets",
    "solve_centers_cg",
    "solve_direct",
    "solve_eigenpro2",
    "solve_eigenpro3",
    "solve_full_kernel_cg",
]
