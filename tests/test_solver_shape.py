"""Issue 64: one module per kernel solver, one signature ``solve_<name>(operator, targets, plan) -> Solution``.

The solver modules hold algorithms on an operator: no branch on a cache, a grid,
a device or a process group (the operator hides them), and each has exactly one
entry point of the shared shape, which returns a :class:`Solution`.
"""

import ast
import importlib
import inspect
import pathlib

import pytest
import torch

from skgpu_kernel.cg_preconditioner import PenalisedRows, shifted_nystrom_preconditioner
from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.operators import CenterShards, EvaluatedOperator, OperatorBlocks
from skgpu_kernel.operators.row_blocks import KernelRowBlocks, center_operator
from skgpu_kernel.planning.kernel import SHIFTED_MAX_COMPONENTS
from skgpu_kernel.preconditioner import nystrom_eigensystem
from skgpu_kernel.solvers.conjugate_gradients import CGPlan, CGSettings
from skgpu_kernel.solvers.eigenpro import EigenProPlan
from skgpu_kernel.solvers.eigenpro3 import ExactProjection, InMemoryBatches
from skgpu_kernel.solvers.solution import Solution, Targets

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "skgpu_kernel"

# Each solver module and its one entry point.
SOLVERS = {
    "eigenpro": "solve_eigenpro2",
    "eigenpro3": "solve_eigenpro3",
    "full_kernel_cg": "solve_full_kernel_cg",
    "centers_cg": "solve_centers_cg",
    "direct": "solve_direct",
}
SIGNATURE = ["operator", "targets", "plan"]

# Names a solver's condition may not read: the operator's kind, cache or grid, the
# device, the process group.  Those branches belong to the operators and the fit's stages.
FORBIDDEN_IN_CONDITIONS = {"cache", "cached", "grid", "on_grid", "kind", "device", "is_cuda", "group", "rank"}


def _entry_points(module):
    """The public functions of a solver module named ``solve_*`` or ``fit_*``."""
    return sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and name.startswith(("solve_", "fit_"))
    )


@pytest.mark.parametrize("module_name", sorted(SOLVERS))
def test_every_solver_module_has_one_entry_point_of_the_shared_signature(module_name):
    module = importlib.import_module(f"skgpu_kernel.solvers.{module_name}")
    assert _entry_points(module) == [SOLVERS[module_name]]
    entry = getattr(module, SOLVERS[module_name])
    assert list(inspect.signature(entry).parameters) == SIGNATURE
    assert SOLVERS[module_name] in module.__all__


def _condition_names(tree):
    """``(line, name)`` of every attribute or name read by a condition (if, while, conditional expression)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            for sub in ast.walk(node.test):
                name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", None)
                if name in FORBIDDEN_IN_CONDITIONS:
                    found.append((node.lineno, name))
    return found


@pytest.mark.parametrize("module_name", sorted(SOLVERS))
def test_no_solver_branches_on_a_cache_grid_device_or_process_group(module_name):
    tree = ast.parse((PACKAGE / "solvers" / f"{module_name}.py").read_text())
    assert _condition_names(tree) == []


def test_the_branch_rule_finds_what_it_names():
    source = "if shards.group:\n    raise\ny = 1 if operator.kind == 'cached' else 2\nwhile device:\n    pass"
    assert sorted(name for _, name in _condition_names(ast.parse(source))) == ["device", "group", "kind"]


def _problem(n=60, p=12):
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(n, 3, generator=generator, dtype=torch.float64)
    Y = torch.sin(3 * X[:, :1]) + X[:, 1:2]
    return Gaussian(bandwidth=0.5), X, Y, X[:p]


def _calls():
    """Each solver called through its signature on a small float64 problem: ``{module: (operator, targets, plan)}``."""
    kernel, X, Y, Z = _problem()
    n, p = X.shape[0], Z.shape[0]
    evaluated = EvaluatedOperator(kernel, X, kernel.prepare_centers(X), OperatorBlocks.whole(n, n))
    rate = lambda step, batch_size, steps: 0.5  # noqa: E731
    shards = CenterShards(kernel, Z, [X.device], p)
    projection = ExactProjection(kernel, Z, 1e-10, torch.float64)
    ep3_plan = EigenProPlan(
        16, rate, 2, coef_init=torch.zeros(p, 1, dtype=torch.float64), projection=projection, n_temporary=32
    )
    generator = torch.Generator().manual_seed(0)
    ep2_plan = EigenProPlan(16, rate, 2, column_block_for=lambda batch: n, generator=generator)
    rows = PenalisedRows(n, 1e-2, None, torch.float64)
    preconditioner = shifted_nystrom_preconditioner(
        nystrom_eigensystem(kernel, X[:p]), evaluated.matmul, rows, SHIFTED_MAX_COMPONENTS
    )
    return {
        "eigenpro": (evaluated, Targets(Y), ep2_plan),
        "eigenpro3": (shards, InMemoryBatches(X, Y, None, torch.Generator().manual_seed(0)), ep3_plan),
        "full_kernel_cg": (evaluated, Targets(Y), CGPlan(1e-2, CGSettings(tol=1e-8), preconditioner)),
        "centers_cg": (KernelRowBlocks(center_operator(kernel, X, Z, 32), Z, 32), Targets(Y), CGPlan(1e-2)),
        "direct": (evaluated, Targets(Y), 1e-2),
    }


def test_every_solver_returns_a_solution_that_fits_its_targets():
    Y = _problem()[2]
    zero_model_loss = float((Y * Y).mean())
    for module_name, (operator, targets, plan) in _calls().items():
        module = importlib.import_module(f"skgpu_kernel.solvers.{module_name}")
        solution = getattr(module, SOLVERS[module_name])(operator, targets, plan)
        assert isinstance(solution, Solution), module_name
        assert torch.isfinite(solution.coef).all(), module_name
        if solution.history:
            assert solution.history[-1]["train_loss"] < 0.5 * zero_model_loss, module_name
        assert solution.converged in (None, True), module_name
