"""Issue 51: each solver is a function on an operator, called here as one, on every operator kind it plans for.

The solvers (:func:`solve_eigenpro2`, :func:`solve_eigenpro3`,
:func:`solve_full_kernel_cg`, :func:`solve_centers_cg`, :func:`solve_direct`), each
``solve_<name>(operator, targets, plan)`` (issue 64), are
handed ``K`` as each kind of operator the planner may choose for them (evaluated
float blocks, a cache of them, exact distances from a grid's int8 products, a cache
of those) and must give the evaluated operator's solution: in float64 the kinds
differ by the rounding of ``K``'s entries only, far below 1e-10 after a few epochs.
"""

import numpy as np
import pytest
import torch

from skgpu_kernel.cg_preconditioner import PenalisedRows, shifted_nystrom_preconditioner
from skgpu_kernel.grid import encode_on_grid, find_grid
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.operators import CachedOperator, CenterShards, EvaluatedOperator, GridOperator, OperatorBlocks
from skgpu_kernel.operators.row_blocks import CachedRowBlocks, KernelRowBlocks
from skgpu_kernel.planning.kernel import SHIFTED_MAX_COMPONENTS
from skgpu_kernel.preconditioner import nystrom_eigensystem
from skgpu_kernel.solvers.centers_cg import solve_centers_cg
from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings
from skgpu_kernel.solvers.direct import solve_direct
from skgpu_kernel.solvers.eigenpro import EigenProPlan, solve_eigenpro2
from skgpu_kernel.solvers.eigenpro3 import ExactProjection, InMemoryBatches, solve_eigenpro3
from skgpu_kernel.solvers.full_kernel_cg import solve_full_kernel_cg
from skgpu_kernel.solvers.solution import Targets

N_ROWS, N_CENTERS, ROW_BLOCK, COLUMN_BLOCK = 240, 60, 64, 96
TOLERANCE = 1e-10
KERNEL = Gaussian(bandwidth=3.0)


def _on_grid(seed=0):
    """Integer features in 0..7 (a grid of step 1) and two smooth targets, float64."""
    rng = np.random.RandomState(seed)
    X = torch.as_tensor(rng.randint(0, 8, size=(N_ROWS, 4)).astype(np.float64))
    Y = torch.stack([torch.sin(X[:, 0] / 2) + torch.cos(X[:, 1] / 3), X[:, 2] / 7 - X[:, 3] / 9], dim=1)
    return X, Y


def _operators(X, Z):
    """``K(X, Z)`` as every kind of operator: evaluated, cached, from the grid, the grid's cached."""
    blocks = OperatorBlocks(ROW_BLOCK, COLUMN_BLOCK)
    grid = find_grid(X)
    assert grid is not None
    evaluated = EvaluatedOperator(KERNEL, X, KERNEL.prepare_centers(Z), blocks)
    on_grid = GridOperator(KERNEL, encode_on_grid(X, grid), encode_on_grid(Z, grid), torch.float64, blocks)
    symmetric = Z is X
    return {
        "evaluated": evaluated,
        "cached": CachedOperator.fill(evaluated, torch.float64, ROW_BLOCK, COLUMN_BLOCK, symmetric=symmetric),
        "grid": on_grid,
        "grid cached": CachedOperator.fill(on_grid, torch.float64, ROW_BLOCK, COLUMN_BLOCK, symmetric=symmetric),
    }


def _assert_same_as_evaluated(solutions):
    reference = solutions.pop("evaluated")
    scale = float(reference.abs().max())
    assert scale > 0
    for kind, solution in solutions.items():
        torch.testing.assert_close(solution, reference, rtol=0, atol=TOLERANCE * scale, msg=kind)


def test_the_operator_kinds_differ_by_rounding_only():
    X, _ = _on_grid()
    blocks = {kind: operator.block() for kind, operator in _operators(X, X).items()}
    _assert_same_as_evaluated(blocks)


def _plan(n_epochs, **fields):
    rate = lambda step, batch_size, steps: 0.5  # noqa: E731
    return EigenProPlan(batch_size=32, learning_rate_for=rate, n_epochs=n_epochs, **fields)


def test_eigenpro2_on_every_operator_kind():
    X, Y = _on_grid()
    solutions = {}
    for kind, operator in _operators(X, X).items():
        generator = torch.Generator().manual_seed(0)
        plan = _plan(4, ridge=0.1, column_block_for=lambda batch: COLUMN_BLOCK, generator=generator)
        result = solve_eigenpro2(operator, Targets(Y), plan)
        assert result.history[-1]["train_loss"] < 0.5 * result.history[0]["train_loss"], kind
        solutions[kind] = result.coef
    _assert_same_as_evaluated(solutions)


def test_eigenpro3_on_every_center_operator_kind():
    """The centers' shards evaluated or on the grid, ``K(X, Z)`` cached or not."""
    X, Y = _on_grid()
    Z = X[:N_CENTERS]
    grid = find_grid(X)
    solutions = {}
    for kind, (on_grid, cached) in {
        "evaluated": (False, False),
        "cached": (False, True),
        "grid": (True, False),
        "grid cached": (True, True),
    }.items():
        shards = CenterShards(KERNEL, Z, [X.device], COLUMN_BLOCK, grid=grid if on_grid else None)
        if cached:
            shards.cache(X, ROW_BLOCK)
        batches = InMemoryBatches(X, Y, None, torch.Generator().manual_seed(0))
        projection = ExactProjection(KERNEL, Z, 1e-10, torch.float64)
        coef = torch.zeros(N_CENTERS, Y.shape[1], dtype=torch.float64)
        result = solve_eigenpro3(shards, batches, _plan(3, coef_init=coef, projection=projection, n_temporary=64))
        assert result.history[-1]["train_loss"] < result.history[0]["train_loss"], kind
        solutions[kind] = coef
    _assert_same_as_evaluated(solutions)


def test_cg_on_every_point_on_every_operator_kind():
    X, Y = _on_grid()
    alpha = 1e-2
    eigensystem = nystrom_eigensystem(KERNEL, X[:80])
    operators = _operators(X, X)
    evaluated = operators["evaluated"]
    rows = PenalisedRows(N_ROWS, alpha, None, torch.float64)
    preconditioner = shifted_nystrom_preconditioner(
        eigensystem, lambda V: evaluated.matmul(V), rows, SHIFTED_MAX_COMPONENTS
    )
    settings = CGSettings(tol=1e-12, max_iterations=200, n_iter_no_change=None)
    solutions = {}
    for kind, operator in operators.items():
        solved = solve_full_kernel_cg(operator, Targets(Y), CGPlan(alpha, settings, preconditioner))
        solutions[kind] = solved.coef
    _assert_same_as_evaluated(solutions)


def test_cg_on_centers_on_every_operator_kind():
    """``K(X, Z)`` row blocks evaluated, from the grid, and stored (each computed once)."""
    X, Y = _on_grid()
    Z = X[:N_CENTERS]
    settings = CGSettings(tol=1e-12, max_iterations=200, n_iter_no_change=None)
    solutions = {}
    for kind, operator in _operators(X, Z).items():
        if kind.endswith("cached"):
            source = operator if kind == "cached" else _operators(X, Z)["grid"]
            row_blocks = CachedRowBlocks.computed(KernelRowBlocks(source, Z, ROW_BLOCK))
        else:
            row_blocks = KernelRowBlocks(operator, Z, ROW_BLOCK)
        solutions[kind] = solve_centers_cg(row_blocks, Targets(Y), CGPlan(0.5, settings)).coef
    _assert_same_as_evaluated(solutions)


@pytest.mark.parametrize("alpha", [1e-4, 0.3])
def test_the_direct_solve_on_every_operator_kind_leaves_the_operator_unchanged(alpha):
    """One factorisation of ``K + alpha I`` from each operator's ``block()``; a cached ``K`` is not written to."""
    X, Y = _on_grid()
    solutions = {}
    for kind, operator in _operators(X, X).items():
        before = operator.block().clone()
        solutions[kind] = solve_direct(operator, Targets(Y), alpha).coef
        torch.testing.assert_close(operator.block(), before, rtol=0, atol=0, msg=kind)
    _assert_same_as_evaluated(solutions)
    reference = torch.linalg.solve(KERNEL(X, X) + alpha * torch.eye(N_ROWS, dtype=torch.float64), Y)
    torch.testing.assert_close(solutions.get("grid"), reference, rtol=0, atol=1e-6 * float(reference.abs().max()))
