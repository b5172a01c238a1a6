"""Size limits of the package's code (issue 11): short functions with few parameters.

A function longer than 60 lines of code (docstring, comments and blank lines
excluded; 80 until issue 51) or with more than 8 parameters (``self``/``cls``
excluded) is a sign of an orchestrator that should hand decisions to a planner or
pass a dataclass.  Estimator constructors are exempt from both: as in
scikit-learn, they take each public parameter and store it, one line each.
"""

import ast
import io
import pathlib
import tokenize

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "skgpu_kernel"
MAX_CODE_LINES = 60
MAX_PARAMETERS = 8
MAX_SHELL_LINES = {"_BaseAdaptiveKernel": 300, "BaseBufferedSGD": 300}
# Whole shell modules (issue 26): validation, the call of the family's fit function and
# storing; docstrings, the shared documentation strings and constructors not counted.
SHELL_MODULES = ("kernel_machines.py", "linear_model.py", "_linear_base.py")
MAX_SHELL_MODULE_LINES = 400


def _code_lines(source):
    """Line numbers that hold code: not blank, not only a comment."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def _docstring_lines(node):
    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            return set(range(body[0].lineno, body[0].end_lineno + 1))
    return set()


def _definitions():
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        code = _code_lines(source)
        tree = ast.parse(source)
        docstrings = set()
        for node in ast.walk(tree):
            docstrings |= _docstring_lines(node)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                span = set(range(node.lineno, node.end_lineno + 1))
                yield path.relative_to(PACKAGE.parent), node, len((span & code) - docstrings)


def _parameters(function):
    arguments = function.args
    names = [arg.arg for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return [name for name in names if name not in ("self", "cls")]


def test_functions_are_short():
    long = [
        f"{path}:{node.lineno} {node.name} ({lines} lines)"
        for path, node, lines in _definitions()
        if not isinstance(node, ast.ClassDef) and lines > MAX_CODE_LINES and not _stores_parameters(node)
    ]
    assert not long, f"functions over {MAX_CODE_LINES} lines of code:\n" + "\n".join(long)


def _stores_parameters(function):
    """An ``__init__`` whose body only stores its arguments (``self.name = name``), a docstring aside."""
    if function.name != "__init__":
        return False
    body = [node for node in function.body if not isinstance(node, ast.Expr)]
    return all(
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.targets[0].attr == node.value.id
        for node in body
    )


def test_functions_take_few_parameters():
    many = [
        f"{path}:{node.lineno} {node.name} ({len(_parameters(node))} parameters)"
        for path, node, _ in _definitions()
        if not isinstance(node, ast.ClassDef)
        and len(_parameters(node)) > MAX_PARAMETERS
        # Estimator constructors mirror their public parameters, as in scikit-learn.
        and node.name != "__init__"
    ]
    assert not many, "functions with more than 8 parameters:\n" + "\n".join(many)


@pytest.mark.parametrize("name", sorted(MAX_SHELL_LINES))
def test_estimator_shells_are_thin(name):
    sizes = {node.name: lines for _, node, lines in _definitions() if isinstance(node, ast.ClassDef)}
    assert sizes[name] <= MAX_SHELL_LINES[name], f"{name} has {sizes[name]} lines of code"


def _documentation_lines(node):
    """Lines of the estimators' shared documentation strings (``__doc__`` pieces) and of ``__init__``."""
    span = set(range(node.lineno, node.end_lineno + 1))
    if isinstance(node, ast.FunctionDef) and node.name == "__init__":
        return span
    documentation = ("__doc__", "_DATA_SOURCES")
    if isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and (target.id.startswith("_COMMON") or target.id in documentation)
        for target in node.targets
    ):
        return span
    if isinstance(node, ast.AugAssign) and getattr(node.target, "attr", None) == "__doc__":
        return span
    return set()


def _shell_code_lines(source):
    """Code lines of a shell module, without docstrings, documentation strings and ``__init__``."""
    excluded = set()
    for node in ast.walk(ast.parse(source)):
        excluded |= _docstring_lines(node)
        if isinstance(node, (ast.FunctionDef, ast.Assign, ast.AugAssign)):
            excluded |= _documentation_lines(node)
    return len(_code_lines(source) - excluded)


@pytest.mark.parametrize("shell", SHELL_MODULES)
def test_shell_modules_are_short(shell):
    lines = _shell_code_lines((PACKAGE / shell).read_text())
    assert lines <= MAX_SHELL_MODULE_LINES, f"{shell} has {lines} lines of code"


# Every module of the package, lines of the file (issue 64 item 6 for the kernel path,
# issue 79 item 6 for the rest): a module longer than this holds separate concepts.
MAX_MODULE_LINES = 700


def _module_sizes():
    """``{relative path: lines}`` of every module of the package."""
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_of_the_package_is_over_700_lines():
    sizes = _module_sizes()
    assert {"fit/solve.py", "buffer.py", "linear_model.py", "parallel/launch.py", "solvers/sgd.py"} <= set(sizes)
    too_long = {module: lines for module, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_long, too_long


# Modules that may evaluate a kernel themselves: the kernels, the operators (the
# ``operators`` package), and the checker of a user's kernel against the Kernel
# protocol (it calls the kernel it checks); paths relative to the package.
KERNEL_CALLERS = ("kernels.py", "operators/", "testing.py")


def _may_evaluate_kernels(path):
    """Whether the package module at ``path`` is one of :data:`KERNEL_CALLERS`."""
    relative = path.relative_to(PACKAGE).as_posix()
    return any(relative == caller or relative.startswith(caller) for caller in KERNEL_CALLERS)


_KERNEL_PRODUCTS = ("block", "prepared_block")


# The package's names of kernel objects (functions such as make_kernel are not kernels).
KERNEL_NAMES = ("kernel", "gradient_kernel")


def _is_kernel(node):
    """An expression naming a kernel: ``kernel``, ``self.kernel``, ``fit.kernel``, ``gradient_kernel``."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in KERNEL_NAMES


def _kernel_evaluations(tree):
    """Line numbers of calls that evaluate a kernel: ``kernel(X, Z)``, ``kernel.block(...)``, ``prepared_block``.

    A call of a name in :data:`KERNEL_NAMES` or of an attribute ``.kernel`` is a
    kernel's ``__call__`` (``kernel.gradient_kernel()`` is a method that returns a
    kernel: it evaluates none); a ``block`` or ``prepared_block`` method of such a
    name is a kernel's block.  Methods that read no matrix (``diagonal``,
    ``prepare_centers``, ``require_finite``) are not evaluations of ``K``.
    """
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        called = isinstance(function, ast.Name) and _is_kernel(function)
        called |= isinstance(function, ast.Attribute) and function.attr == "kernel"
        product = isinstance(function, ast.Attribute) and function.attr in _KERNEL_PRODUCTS
        if called or (product and _is_kernel(function.value)):
            yield node.lineno


def test_no_kernel_is_evaluated_outside_the_operators_and_the_kernels():
    """Every kernel matrix of the package comes from the ``operators`` package (issues 51, 64)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _may_evaluate_kernels(path):
            continue
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}" for line in _kernel_evaluations(tree)]
    assert not found, found


def test_the_kernel_evaluation_rule_finds_what_it_names():
    source = "kernel(X, Z)\nself.kernel(X)\ngradient_kernel(a, b)\nfit.kernel.block(X, Z)\nkernel.gradient_kernel()\n"
    source += "make_kernel('gaussian', 1.0, None, X)\nkernel.diagonal(X)\n"
    assert list(_kernel_evaluations(ast.parse(source))) == [1, 2, 3, 4]


def _operator_classes():
    """The names of every operator class of the package: :class:`KernelOperator` and its subclasses, in any module."""
    import importlib
    import inspect
    import pkgutil

    import skgpu_kernel
    from skgpu_kernel.operators import KernelOperator

    names = set()
    for module_info in pkgutil.walk_packages(skgpu_kernel.__path__, "skgpu_kernel."):
        module = importlib.import_module(module_info.name)
        names |= {
            value.__name__
            for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, KernelOperator)
        }
    return names


def _operator_constructions(tree, classes):
    """Line numbers of calls that make an operator: ``Cls(...)``, ``module.Cls(...)`` or ``Cls.constructor(...)``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Attribute) and isinstance(function.value, (ast.Name, ast.Attribute)):
            receiver = function.value.id if isinstance(function.value, ast.Name) else function.value.attr
            if receiver in classes:
                yield node.lineno
                continue
        name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
        if name in classes:
            yield node.lineno


def test_no_operator_is_made_outside_the_operators():
    """Every kernel operator of the package is made in the ``operators`` package (its factory), issue 79 item 4.

    The classes are found, not listed: every subclass of ``KernelOperator`` that any
    module of the package defines or imports; every module outside the operators
    and the kernels is scanned.
    """
    classes = _operator_classes()
    assert {"EvaluatedOperator", "GridOperator", "CachedOperator", "ShardedOperator", "StreamedOperator"} <= classes
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _may_evaluate_kernels(path):
            continue
        lines = _operator_constructions(ast.parse(path.read_text()), classes)
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}" for line in lines]
    assert not found, found


def test_the_operator_rule_finds_what_it_names():
    source = "EvaluatedOperator(k, X, Z, b)\noperators.GridOperator(k, c, c, d, b)\nCachedOperator.fill(s, t, 1, 2)\n"
    source += "factory.operator(X, b)\nisinstance(a, CachedOperator)\nsource.cached(t, 1, 2)\n"
    classes = {"EvaluatedOperator", "GridOperator", "CachedOperator"}
    assert list(_operator_constructions(ast.parse(source), classes)) == [1, 2, 3]


# Calls that return kernel entries: a block of an operator or a kernel (``.block``,
# ``.prepared_block``), a whole kernel matrix (``kernel_matrix``), a kernel itself, and
# the row blocks of ``K(X, Z)`` a CG pass reads (``.blocks()``).
_BLOCK_SOURCES = ("block", "prepared_block", "kernel_matrix", "blocks")
# Functions and methods that multiply matrices (besides the ``@`` operator).
_MATRIX_PRODUCTS = ("mm", "matmul", "addmm", "addmm_", "bmm", "einsum", "tensordot", "mv", "dot")


def _is_block_source(node):
    """Whether ``node`` is a call that returns kernel entries (see :data:`_BLOCK_SOURCES`), whatever its receiver."""
    if not isinstance(node, ast.Call):
        return False
    function = node.func
    name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
    return name in _BLOCK_SOURCES or _is_kernel(function)


def _kernel_block_names(function):
    """Names ``function`` binds to kernel entries: assigned from, or iterated over, a block source.

    Followed one step through slices, transposes and dtype conversions (``K[rows]``,
    ``K.mT``, ``K.to(dtype)``), as a name bound to the whole expression.
    """
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.For):
            value = node.iter if isinstance(node, ast.For) else node.value
            if value is None or not any(_is_block_source(inner) for inner in ast.walk(value)):
                continue
            targets = [node.target] if isinstance(node, ast.For | ast.AnnAssign) else node.targets
            for target in targets:
                # ``for K_block, Y, w in row_blocks.blocks()``: the first element is the block.
                first = target.elts[0] if isinstance(target, ast.Tuple) and isinstance(node, ast.For) else target
                names |= {leaf.id for leaf in ast.walk(first) if isinstance(leaf, ast.Name)}
    return names


def _holds_kernel_entries(node, block_names):
    """Whether the expression ``node`` contains a block source or a name bound to one."""
    return any(
        _is_block_source(inner) or (isinstance(inner, ast.Name) and inner.id in block_names) for inner in ast.walk(node)
    )


def _kernel_products(tree):
    """Line numbers of matrix products with kernel entries: ``K @ V``, ``torch.mm(K, V)``, ``K.matmul(V)``."""
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    # The module's own statements are a scope too, without the bodies of its functions and classes.
    module = ast.Module(
        body=[node for node in tree.body if not isinstance(node, ast.FunctionDef | ast.ClassDef)], type_ignores=[]
    )
    found = set()
    for scope in [module, *functions]:
        block_names = _kernel_block_names(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                operands = (node.left, node.right)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in _MATRIX_PRODUCTS:
                operands = (node.func.value, *node.args)
            else:
                continue
            if any(_holds_kernel_entries(operand, block_names) for operand in operands):
                found.add(node.lineno)
    return sorted(found)


def test_no_kernel_product_outside_the_operators():
    """Issue 64: every product of kernel entries with a matrix is taken in the ``operators`` package.

    Whatever the names: a product with a block an operator returned, a kernel matrix,
    a kernel's own block or a CG pass's row block is a product of the operators'.
    """
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _may_evaluate_kernels(path):
            continue
        lines = _kernel_products(ast.parse(path.read_text()))
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}" for line in lines]
    assert not found, found


def test_the_kernel_product_rule_finds_products_whatever_the_names():
    source = (
        "def f(operator, kernel, X, Z, V, rows, W):\n"
        "    G = kernel_matrix(kernel, X)\n"  # a whole matrix, multiplied by @ (line 3)
        "    a = (G + G.T) @ V\n"
        "    b = center_operator(kernel, X, Z, 64).block() @ V\n"  # a block, no name (line 4)
        "    for K_part, Y, w in rows.blocks():\n"
        "        c = K_part.mT @ (w * Y)\n"  # a CG pass's row block (line 6)
        "        d = torch.mm(W, K_part)\n"  # the other operand, torch.mm (line 7)
        "    e = operator.matmul(V)\n"  # through the operator: allowed
        "    f = W @ V\n"  # no kernel entries
        "    g = Y.matmul(operator.block(rows))\n"  # a method product (line 10)
        "    return a, b, c, d, e, f, g\n"
    )
    assert _kernel_products(ast.parse(source)) == [3, 4, 6, 7, 10]


def _package_classes():
    """The names of every class the package defines."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        names |= {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    return names


def _inheriting_classes(source, package_classes):
    """``(class, base)`` for each class of ``source`` whose base is a class of the package (by name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if name in package_classes:
                    found.append((node.name, name))
    return found


def test_the_rule_finds_a_solver_class_built_on_another():
    source = "class _Path:\n    pass\n\n\nclass _EigenPro2Path(_Rows, kernel_paths._Path):\n    pass\n"
    assert _inheriting_classes(source, {"_Path", "_Rows"}) == [("_EigenPro2Path", "_Rows"), ("_EigenPro2Path", "_Path")]
    assert _inheriting_classes("class Stop(Exception):\n    pass\n", {"_Path"}) == []


def test_no_solver_class_inherits_from_another():
    """Issue 51: the solvers are functions on an operator; what they share is composed, not inherited.

    A class in ``skgpu_kernel/solvers/`` may derive from Python's or torch's classes
    (an exception, a protocol), never from a class of the package.
    """
    package_classes = _package_classes()
    found = {}
    # The algorithms (solvers/) and the attempts that run them (fit/, issue 64).
    for path in sorted([*(PACKAGE / "solvers").glob("*.py"), *(PACKAGE / "fit").glob("*.py")]):
        inheriting = _inheriting_classes(path.read_text(), package_classes)
        if inheriting:
            found[path.name] = inheriting
    assert not found, found


# The stages of a kernel fit (issue 51) and the objects that may cross them: the rows,
# the parameters, the runtime and the plan in, the plan or a result out.
STAGE_PARAMETERS = ("data", "parameters", "runtime", "plan")


def _fit_stages():
    from skgpu_kernel.fit import feature_learning, pipeline, plan, resolve, solve, tune

    return {
        "resolve": resolve,
        "tune": tune,
        "tune_kernel": tune,
        "choose_solver": plan,
        "solve": solve,
        "fit_kernel_model": pipeline,
        "fit_with_feature_learning": feature_learning,
    }


def _foreign_parameters(function):
    """The parameters of ``function`` that are not one of the stage objects."""
    import inspect

    return [name for name in inspect.signature(function).parameters if name not in STAGE_PARAMETERS]


def test_the_stage_rule_finds_a_stage_taking_anything_else():
    def stage(request, runtime, parameters, tuning=None):
        return None

    assert _foreign_parameters(stage) == ["request", "tuning"]
    assert _foreign_parameters(lambda data, parameters, runtime, plan=None: None) == []


def test_a_fits_stages_take_only_the_rows_the_parameters_the_runtime_and_the_plan():
    found = {name: _foreign_parameters(getattr(module, name)) for name, module in _fit_stages().items()}
    assert not any(found.values()), found


@pytest.mark.slow
def test_only_the_stage_objects_cross_a_fits_stages(monkeypatch):
    """A default fit, each stage wrapped: its arguments and results are the stage objects alone.

    The rows, the parameters, the runtime and the plan in; the plan or the result out.
    """
    import importlib
    import pkgutil

    import numpy as np

    from skgpu_kernel import AdaptiveKernelClassifier, fit, kernel_machines
    from skgpu_kernel.fit import KernelFitInput, KernelFitParameters, KernelFitResult, KernelRuntime
    from skgpu_kernel.planning.agop import AUTO_LEARNING_MIN_ROWS
    from skgpu_kernel.planning.kernel_policy import FitPlan

    allowed_in = (KernelFitInput, KernelFitParameters, KernelRuntime, FitPlan, type(None))
    allowed_out = (FitPlan, KernelFitResult)
    modules = [importlib.import_module(f"skgpu_kernel.fit.{info.name}") for info in pkgutil.iter_modules(fit.__path__)]
    crossed = {}

    def wrapped(name, stage):
        def run(*args, **kwargs):
            result = stage(*args, **kwargs)
            crossed.setdefault(name, set()).update(type(value) for value in (*args, *kwargs.values(), result))
            assert all(isinstance(value, allowed_in) for value in (*args, *kwargs.values())), (name, args)
            assert isinstance(result, allowed_out), (name, type(result))
            return result

        return run

    for name, module in _fit_stages().items():
        stage = wrapped(name, getattr(module, name))
        for holder in (*modules, fit, kernel_machines):  # every module that calls it by name
            if hasattr(holder, name):
                monkeypatch.setattr(holder, name, stage)
    rng = np.random.RandomState(0)
    # The default path (issue 64): every parameter at its default, feature learning
    # "auto" learning at AUTO_LEARNING_MIN_ROWS rows, the classifier's calibration too.
    X = rng.uniform(-1, 1, (AUTO_LEARNING_MIN_ROWS, 4))
    y = np.sin(3 * X[:, 0]) + X[:, 1] > 0.5
    model = AdaptiveKernelClassifier(random_state=0).fit(X, y)
    assert model.feature_learning_ is not None and model.calibration_ == "held-out"
    assert set(crossed) == set(_fit_stages())  # every stage ran
