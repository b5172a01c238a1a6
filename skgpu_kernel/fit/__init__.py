"""The kernel machines' fit, in stages: resolve, tune, plan, prepare, operator, solve, finish.

The shell validates and hands :func:`~skgpu_kernel.fit.pipeline.fit_kernel_model`
(or :func:`~skgpu_kernel.fit.feature_learning.fit_with_feature_learning`, the
same fit with learnt features around it) the rows, the parameters and a runtime;
each stage is one module:

========================  ==========================================================
``request``               what the shell hands over with the parameters: rows, runtime
``resolve``               every choice that needs no tuning (kernel, centers, policy)
``tune``                  bandwidth and penalty per kernel, once
``plan``                  the solver the driver starts with
``registry``              the solvers by name: ``solver``'s values, docs, attempts
``prepare``               rows to the device once, split, intercept, shuffle, centers
``operator``              the operators the plan asks for: cache and grid branches
``solve``                 the one fallback loop; the attempts of ``eigenpro``, ``cg``
                          and ``planned`` run on an attempt's ``context``
``finish``                the joint intercept and the result the shell stores
``feature_learning``      the loop of learnt metrics around the kernel fit
========================  ==========================================================

The numerical algorithms are in :mod:`skgpu_kernel.solvers`; the decisions in
:mod:`skgpu_kernel.planning`.  See the user guide's "How a fit runs".
"""

from ..planning.parameters import KernelFitParameters
from .feature_learning import FEATURE_LEARNING_MODES, fit_with_feature_learning, transformed_rows
from .finish import KernelFitResult
from .pipeline import fit_kernel_model
from .registry import SolverNames, register_solver, solver_docs, unregister_solver
from .request import KernelContinuation, KernelFitInput, KernelRuntime

__all__ = [
    "FEATURE_LEARNING_MODES",
    "KernelContinuation",
    "KernelFitInput",
    "KernelFitParameters",
    "KernelFitResult",
    "KernelRuntime",
    "SolverNames",
    "fit_kernel_model",
    "fit_with_feature_learning",
    "register_solver",
    "solver_docs",
    "transformed_rows",
    "unregister_solver",
]
