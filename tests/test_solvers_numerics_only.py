"""Issue 79 item 5: the kernel solvers are numerics only.

No out-of-memory handling, no process-group branch and no warnings in any module of
a kernel solver: those belong to the fit's solve stage (the one fallback loop,
``AttemptContext.solved_or_halved`` and ``reported``) and to the operators.  The
solvers are found by what they are, over the whole package: every function
``solve_<name>(operator, targets, plan)``, its module, and every module beside it
that it imports, directly or not.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "skgpu_kernel"
SOLVER_SIGNATURE = ["operator", "targets", "plan"]
MEMORY_ERRORS = {"OutOfMemoryError", "RuntimeError", "Exception", "BaseException"}
WARNING_CALLS = {"warn", "warn_user", "warn_explicit"}
GROUP_NAMES = {"group", "process_group", "distributed", "may_halve_batch"}


def _modules():
    return {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}


def _solver_modules(modules):
    """Modules defining ``solve_<name>(operator, targets, plan)``, with the sibling modules they import (closure)."""
    found = {
        path
        for path, tree in modules.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("solve_")
        and [argument.arg for argument in node.args.args] == SOLVER_SIGNATURE
    }
    pending = list(found)
    while pending:
        path = pending.pop()
        for node in ast.walk(modules[path]):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                sibling = path.parent / f"{node.module.replace('.', '/')}.py"
                if sibling in modules and sibling not in found:
                    found.add(sibling)
                    pending.append(sibling)
    return found


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _violations(tree):
    """What a solver module may not do: catch memory errors, warn, read a process group."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            names = {_name(kind) for kind in caught if kind is not None}
            if node.type is None or names & MEMORY_ERRORS:
                found.append(f"line {node.lineno}: catches {sorted(names) or 'everything'}")
        elif isinstance(node, ast.Call) and _name(node.func) in WARNING_CALLS:
            found.append(f"line {node.lineno}: warns ({_name(node.func)})")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):
                imported.append(node.module or "")
            if any(name.split(".")[-1] in {"warnings", "_warnings", "process_group"} for name in imported):
                found.append(f"line {node.lineno}: imports {imported}")
        elif isinstance(node, ast.Name | ast.Attribute) and _name(node) in GROUP_NAMES:
            found.append(f"line {node.lineno}: reads {_name(node)}")
    return found


def test_the_kernel_solvers_are_found_where_they_are():
    """The finder sees every solver the registry runs (a check that the test can fail)."""
    solvers = {path.name for path in _solver_modules(_modules())}
    assert {"direct.py", "eigenpro.py", "eigenpro3.py", "full_kernel_cg.py", "centers_cg.py"} <= solvers
    assert {"epochs.py", "conjugate_gradients.py", "solution.py"} <= solvers  # what they import beside them


def test_no_kernel_solver_handles_memory_warns_or_reads_a_process_group():
    modules = _modules()
    found = {
        str(path.relative_to(PACKAGE)): problems
        for path in sorted(_solver_modules(modules))
        if (problems := _violations(modules[path]))
    }
    assert not found, found


def test_the_rules_flag_each_kind_of_violation():
    source = """
import warnings
try:
    pass
except (torch.OutOfMemoryError, RuntimeError):
    pass
warn_user("x")
if shards.group is None:
    pass
"""
    problems = _violations(ast.parse(source))
    assert [problem.split(": ")[1].split(" ")[0] for problem in problems] == ["imports", "catches", "warns", "reads"]
