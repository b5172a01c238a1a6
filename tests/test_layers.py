"""The shape of a fit (issue 26): shells validate, call their family's fit function and store.

A walk from an estimator's ``fit`` must not climb back into the shell module to make
the next decision: the shells import nothing from ``planning`` and, from
``solvers``, only their family's pipeline; no function of a shell module takes the
estimator; the layers import downwards only (the solvers nothing from
``parallel``) and no two parts of the package import each other; and a warning
raised deep in a fit names the user's line.
"""

import ast
import pathlib
import warnings

import numpy as np
import pytest

from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "skgpu_kernel"
# The kernel family's pipeline: the ``fit`` package (its request types, the one fit
# function and feature learning around it, exported by its ``__init__``).
SHELLS = {
    "kernel_machines.py": {"fit"},
    "linear_model.py": {"_linear_base"},
    "_linear_base.py": {"bmgd_fit"},
}
# What a shell may import from the package besides its family's pipeline: input
# checks, prediction blocks, the probabilities of decision values (the temperature
# itself is fitted in the pipeline), opening sources (``row_sources``), resolving the runtime, names of
# kernels, scaling rules and strategies (parameter types), the process group, the
# encoding of tables (categories, missing values, units: input checks that are fitted), and
# the runner of a strategy's workers: the pipeline imports nothing from
# ``parallel``, so the shell resolves where a fit trains (as it resolves the
# device) and hands the runner down.
SHELL_IMPORTS = {
    "_kernel_docs",
    "_linear_docs",
    "_validation",
    "blockwise",
    "buffer",
    "row_sources",
    "calibration",
    "device",
    "kernels",
    "scaling",
    "tables",
    "parallel.runner",
    "parallel.strategies",
    "scaling_rules",
    "process_group",
}
# Loop modules: iterations on tensors, below the pipelines and the parallel workers.
LOOPS = ("eigenpro", "eigenpro3", "centers_cg", "sgd", "epochs", "losses")
PIPELINES = ("fit", "bmgd_fit")


def _internal_imports(path):
    """Package modules ``path`` imports, as dotted names relative to the package."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {
                alias.name.removeprefix("skgpu_kernel.")
                for alias in node.names
                if alias.name.startswith("skgpu_kernel.")
            }
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module is None:  # ``from . import module``: the modules are the names
                names |= {".".join([*base, alias.name]) for alias in node.names}
            else:
                names.add(".".join([*base, *node.module.split(".")]))
        elif node.module and node.module.startswith("skgpu_kernel."):
            names.add(node.module.removeprefix("skgpu_kernel."))
    return names


def _part(module):
    """The part of the package a module belongs to: its top-level subpackage, or the top-level module itself."""
    return module.split(".")[0]


def _import_graph():
    """``{part: parts it imports}`` over the package's parts (top-level subpackages and modules)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _part(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        graph.setdefault(part, set()).update(_part(name) for name in _internal_imports(path) if _part(name) != part)
    return graph


def _import_cycle(graph):
    """One cycle of ``graph`` as a list of parts (the first repeated at the end), or None."""
    finished, path = set(), []

    def visit(part):
        if part in path:
            return [*path[path.index(part) :], part]
        if part in finished:
            return None
        path.append(part)
        for imported in sorted(graph.get(part, ())):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        finished.add(part)
        return None

    return next(filter(None, map(visit, sorted(graph))), None)


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_shells_import_only_their_pipeline_from_solvers_and_nothing_from_planning(shell):
    imports = _internal_imports(PACKAGE / shell)
    assert SHELLS[shell] <= imports
    unexpected = imports - SHELL_IMPORTS - SHELLS[shell]
    assert not unexpected, f"{shell} imports {sorted(unexpected)}"


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_no_shell_function_takes_the_estimator(shell):
    tree = ast.parse((PACKAGE / shell).read_text())
    module_functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    passed_self = []
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for call in (node for node in ast.walk(cls) if isinstance(node, ast.Call)):
            name = getattr(call.func, "id", None)
            arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
            if name in module_functions and any(isinstance(arg, ast.Name) and arg.id == "self" for arg in arguments):
                passed_self.append(f"{cls.name}: {name}(self, ...)")
    estimator_parameters = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(arg.arg in ("estimator", "model") for arg in node.args.args)
    ]
    assert not passed_self and not estimator_parameters, passed_self + estimator_parameters


def test_layers_import_downwards():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        imports = _internal_imports(path)
        if module.startswith("planning."):
            upward += [f"{module} -> {name}" for name in imports if name.startswith(("solvers", "parallel"))]
        if module.startswith("solvers.") and module.split(".")[1] in LOOPS:
            upward += [f"{module} -> {name}" for name in imports if name.startswith("parallel")]
        if module.startswith("parallel."):
            upward += [f"{module} -> {name}" for name in imports if name.startswith(PIPELINES)]
    assert not upward, upward


# The stages of a kernel fit (issue 64 item 1), one module each in ``skgpu_kernel/fit/``,
# and the functions that run them, which ``solvers/`` (algorithms only) never defines.
FIT_STAGE_MODULES = ("request", "resolve", "tune", "plan", "prepare", "operator", "solve", "finish", "feature_learning")
STAGE_FUNCTIONS = {
    "resolve",
    "tune",
    "tune_kernel",
    "choose_solver",
    "prepare",
    "solve",
    "run_solver",
    "fit_kernel_model",
    "fit_with_feature_learning",
}


def test_the_fit_stages_are_modules_of_the_fit_package_and_solvers_hold_algorithms_only():
    missing = [stage for stage in FIT_STAGE_MODULES if not (PACKAGE / "fit" / f"{stage}.py").exists()]
    in_solvers = sorted(
        f"solvers/{path.name}: {node.name}"
        for path in (PACKAGE / "solvers").glob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name in STAGE_FUNCTIONS
    )
    assert not missing and not in_solvers, (missing, in_solvers)


def _imports_of(directory, parts):
    """``module -> imported`` for each import of the modules under ``directory`` from one of ``parts``."""
    return [
        f"{path.relative_to(PACKAGE)} -> {name}"
        for path in sorted((PACKAGE / directory).rglob("*.py"))
        for name in _internal_imports(path)
        if _part(name) in parts
    ]


def test_solvers_import_nothing_from_the_fit_pipeline():
    # Issue 64: ``solvers/`` holds the algorithms, the ``fit`` package the stages that
    # run them; an algorithm never reaches back into the pipeline that calls it.
    upward = _imports_of("solvers", ("fit",))
    assert not upward, upward


# What planning reads is facts (device facts, measured speeds, grid facts as plain
# data): never the operators that compute products, the grid's encoders, nor a stage
# or solver that runs the plan (issue 64 item 5).
PLANNING_MAY_NOT_IMPORT = ("operators", "grid", "fit", "solvers", "parallel", "regularization")


def test_planning_reads_facts_not_operators_grids_or_stages():
    found = _imports_of("planning", PLANNING_MAY_NOT_IMPORT)
    assert not found, found


def test_the_planning_import_rule_finds_an_operator_import(tmp_path, monkeypatch):
    # The rule must be able to fail: a planning module that imports the operators and the grid.
    planning = tmp_path / "skgpu_kernel" / "planning"
    planning.mkdir(parents=True)
    (planning / "operator.py").write_text("from ..operators import OperatorMeasurements\nfrom ..device import x\n")
    (planning / "kernel.py").write_text("from .. import grid\nfrom ._account import MemoryAccount\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "skgpu_kernel")
    assert _imports_of("planning", PLANNING_MAY_NOT_IMPORT) == [
        "planning/kernel.py -> grid",
        "planning/operator.py -> operators",
    ]


def _module_path(module):
    """The file of a package module given as a dotted name relative to the package (a package: its ``__init__``)."""
    path = PACKAGE.joinpath(*module.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"


def _reached(modules):
    """Every package module ``modules`` import, directly or through others, with ``modules`` themselves."""
    seen, pending = set(), list(modules)
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending += sorted(_internal_imports(_module_path(module)))
    return seen


# What planning may reach (issue 79 item 5): the device facts, what they import, and
# modules that import nothing of the package (the scaling rules' formulas).
PLANNING_FACTS = ("device", "operator_facts")


def test_planning_reaches_no_module_below_the_device_facts_even_through_others():
    planning = {f"planning.{path.stem}" for path in (PACKAGE / "planning").glob("*.py")}
    allowed = _reached(PLANNING_FACTS)
    below = sorted(
        module
        for module in _reached(planning) - planning - allowed
        if _internal_imports(_module_path(module))  # a module of the package's own formulas only
    )
    assert not below, below


def test_the_reach_of_imports_follows_every_module_on_the_way():
    # The walk must be able to fail: the fit's solve stage reaches the operators through others.
    assert {"operators", "operators.core", "grid"} <= _reached({"fit.solve"})
    assert _reached({"operator_facts"}) >= {"device", "_probe_store", "_warnings"}


def _calls_in(path):
    """``name`` or ``receiver.name`` of every call in the module at ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name):
                yield function.id
            elif isinstance(function, ast.Attribute):
                receiver = function.value
                owner = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
                yield f"{owner}.{function.attr}"


# Calls that warn or draw random numbers (numpy's, torch's, Python's, a RandomState's).
_WARNING_CALLS = ("warn_user", "warnings.warn")
_RANDOM_CALLS = ("random.", "rng.", "generator.", "torch.rand", "torch.randn", "torch.randint", "torch.randperm")


def test_planning_neither_warns_nor_draws_random_numbers():
    """Planning decides; the stage that runs its plan warns and draws (issue 79 item 5)."""
    found = [
        f"{path.relative_to(PACKAGE)}: {call}"
        for path in sorted((PACKAGE / "planning").glob("*.py"))
        for call in _calls_in(path)
        if call in _WARNING_CALLS or call.startswith(_RANDOM_CALLS)
    ]
    assert not found, found


def test_the_warning_and_randomness_rule_finds_what_it_names(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("warn_user('x')\nnp.random.choice(3)\nrng.permutation(4)\ntorch.randn(2)\nmath.ceil(2.5)\n")
    calls = [call for call in _calls_in(module) if call in _WARNING_CALLS or call.startswith(_RANDOM_CALLS)]
    assert calls == ["warn_user", "random.choice", "rng.permutation", "torch.randn"]


def test_solvers_import_nothing_from_parallel():
    # The BMGD pipeline receives its runner (this process, or a strategy's workers)
    # from the shell: the loops and pipelines never reach up into ``parallel``.
    upward = _imports_of("solvers", ("parallel",))
    assert not upward, upward


def test_no_parts_of_the_package_import_each_other():
    cycle = _import_cycle(_import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_import_cycles_are_found():
    # The check above must be able to fail: a pair, a longer loop, and none.
    assert _import_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_are_read_as_written():
    # The helper above must see what it checks: the kernel shell's pipeline, the
    # workers' launcher and every form of import.
    assert "fit" in _internal_imports(PACKAGE / "kernel_machines.py")
    assert "planning.kernel_policy" in _internal_imports(PACKAGE / "fit" / "resolve.py")
    assert "parallel.launch" in _internal_imports(PACKAGE / "parallel" / "runner.py")
    assert "planning.stopping" in _internal_imports(PACKAGE / "solvers" / "sgd.py")
    assert {"bmgd_fit", "parallel", "row_sources"} <= _import_graph()["_linear_base"]


def _warning_sites(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [(pathlib.Path(w.filename).name, str(w.message)) for w in caught if issubclass(w.category, UserWarning)]


def test_warnings_raised_deep_in_a_fit_name_the_callers_line():
    rng = np.random.RandomState(0)
    X, y = rng.randn(60, 3), rng.randn(60)
    kernel = AdaptiveKernelRegressor(n_centers=100, n_epochs=2, random_state=0)
    linear = BufferedSGDRegressor(batch_size=500, buffer_size=50, n_epochs=1, random_state=0)
    sites = _warning_sites(lambda: kernel.fit(X, y)) + _warning_sites(lambda: linear.fit(X, y))
    messages = {message.split(" ")[0]: filename for filename, message in sites}
    # n_centers above n (the kernel pipeline) and a batch above the buffer (the BMGD planner).
    assert messages["n_centers=100"] == "test_layers.py"
    assert messages["batch_size=500"] == "test_layers.py"


# Issue 79 item 1, in part: what planning needs measured of a kernel fit's operator (its
# grid and int8 speed) and of the device (the batch capacity) is measured by the fit's
# one step, AttemptContext's, whatever the solver.
MEASUREMENTS = ("measure_operator", "measure_batch_capacity")


def _callers(names):
    """``{name: {"module:function", ...}}``: every function of the package that calls ``name``."""
    found = {name: set() for name in names}
    for path in PACKAGE.rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in found:
                        found[name].add(f"{path.relative_to(PACKAGE)}:{function.name}")
    return found


def test_the_kernel_fit_measures_the_operator_and_the_batch_in_one_place():
    assert _callers(MEASUREMENTS) == {
        "measure_operator": {"fit/context.py:measured"},
        "measure_batch_capacity": {"fit/context.py:batch_capacity"},
    }
