"""Issue 64 item 4: the dataclass types a default kernel fit creates, counted, and no mutable state shared.

``benchmarks/count_fit_types.py`` wraps the ``__init__`` of every dataclass of the
package and fits a default :class:`AdaptiveKernelRegressor` and
:class:`AdaptiveKernelClassifier` (``feature_learning="auto"``, 3000 rows).  The
issue's target is at most 15 types; the count may not grow beyond today's while the
types are merged.
"""

import dataclasses
import importlib.util
import pathlib

import numpy as np
import pytest

from skgpu_kernel.fit.request import KernelRuntime
from skgpu_kernel.out_of_memory import MemoryEvents

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET_TYPES = 15
# Today's counts (59 and 60 at the second part, 40 and 41 after the merges of
# its third): a type added to the default path must replace one.
MOST_TYPES = {"regressor": 40, "classifier": 41}


def _counter():
    spec = importlib.util.spec_from_file_location("count_fit_types", ROOT / "benchmarks" / "count_fit_types.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MOST_TYPES))
def test_a_default_fit_creates_no_more_dataclass_types_than_today(name):
    created = _counter().count_default_fit(name)
    assert "skgpu_kernel.solvers.solution.Solution" in created  # the instrumentation sees the fit
    assert len(created) <= MOST_TYPES[name], sorted(created)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 64 item 4: a default fit creates 40 dataclass types against the target of 15 "
    "(benchmarks/count_fit_types.py lists them); the remaining ones are each a concept of the glossary or a "
    "planner's input or output, whose merge waits on the issue's decision (see its closing note)",
)
def test_a_default_fit_creates_at_most_15_dataclass_types():
    assert len(_counter().count_default_fit("regressor")) <= TARGET_TYPES


def test_the_runtime_holds_its_events_as_an_immutable_record():
    """A stage hands its events on in a new runtime: copies never share a list that grows."""
    runtime = KernelRuntime([], None, 0, np.random.RandomState(0), None)
    assert runtime.memory_events == ()
    events = MemoryEvents(list(runtime.memory_events), "cg")
    events.shrank("agop", "AGOP row block", 64, 32, "out of memory")
    later = runtime.recorded(events.records)
    assert runtime.memory_events == () and len(later.memory_events) == 1
    assert isinstance(later.memory_events, tuple)
    assert dataclasses.replace(later).memory_events is later.memory_events  # a tuple: nothing to append to
