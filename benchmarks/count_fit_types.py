"""Count the dataclass types a default kernel fit creates (issue 64 item 4), and how often each.

Every dataclass the package defines has its ``__init__`` wrapped (``dataclasses.replace``
goes through it too); then a default ``AdaptiveKernelRegressor`` and a default
``AdaptiveKernelClassifier`` (``feature_learning="auto"``, ``random_state=0``) fit
3000 rows of a smooth target.  Prints one line per type (instances, module and
name) and the number of types, per estimator.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/count_fit_types.py [--estimator regressor classifier]
"""

import argparse
import collections
import contextlib
import dataclasses
import importlib
import pkgutil

import numpy as np

import skgpu_kernel
from skgpu_kernel import AdaptiveKernelClassifier, AdaptiveKernelRegressor

ESTIMATORS = {"regressor": AdaptiveKernelRegressor, "classifier": AdaptiveKernelClassifier}
N_ROWS = 3000


def package_dataclasses():
    """Every dataclass defined by a module of the package (the parallel workers' excepted: a default fit has none)."""
    found = set()
    for info in pkgutil.walk_packages(skgpu_kernel.__path__, "skgpu_kernel."):
        if info.name.startswith("skgpu_kernel.parallel"):
            continue
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == info.name:
                found.add(value)
    return found


@contextlib.contextmanager
def instrumented(classes):
    """A counter of instances, filled by the wrapped ``__init__`` of each class in ``classes`` (restored on exit)."""
    created, originals = collections.Counter(), {cls: cls.__init__ for cls in classes}
    for cls in classes:

        def init(self, *args, _original=cls.__init__, _name=f"{cls.__module__}.{cls.__qualname__}", **kwargs):
            created[_name] += 1
            _original(self, *args, **kwargs)

        cls.__init__ = init
    try:
        yield created
    finally:
        for cls, original in originals.items():
            cls.__init__ = original


def count_default_fit(name, seed=0):
    """``{type name: instances}`` of the dataclasses a default fit of estimator ``name`` creates."""
    X, y = data(seed)
    targets = y if name == "regressor" else y > np.median(y)
    with instrumented(package_dataclasses()) as created:
        ESTIMATORS[name](random_state=0).fit(X, targets)
    return dict(created)


def data(seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, (N_ROWS, 6))
    return X, np.sin(3 * X[:, 0]) + X[:, 1] + 0.1 * rng.randn(N_ROWS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator", nargs="+", choices=sorted(ESTIMATORS), default=sorted(ESTIMATORS))
    arguments = parser.parse_args()
    for name in arguments.estimator:
        created = count_default_fit(name)
        print(f"== default {name}, {N_ROWS} rows")
        for type_name, count in sorted(created.items()):
            print(f"{count:6d}  {type_name}")
        print(f"{len(created)} dataclass types")


if __name__ == "__main__":
    main()
