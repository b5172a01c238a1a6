"""Issue 64 item 4: the dataclass types a default kernel fit creates, counted, and no mutable state shared.

``benchmarks/count_fit_types.py`` wraps the ``__init__`` of every dataclass of the
package and fits a default :class:`AdaptiveKernelRegressor` and
:class:`AdaptiveKernelClassifier` (``feature_learning="auto"``, 3000 rows).  Issue 79's
bound is at most 24 types (it replaced issue 64's target of 15); the count may not
grow beyond today's while the types are merged.
"""

import dataclasses
import importlib
import importlib.util
import pathlib

import numpy as np
import pytest

from skgpu_kernel.fit.request import KernelRuntime
from skgpu_kernel.out_of_memory import MemoryEvents, record_with_events

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET_TYPES = 24
# Today's counts (59 and 60 at the second part, 40 and 41 after the merges of
# its third, 36 and 36 at its fourth; one layout type for every solver and the rows and
# parameters passed as they are lowered them to 34): a type added to the default path
# must replace one.
MOST_TYPES = {"regressor": 34, "classifier": 34}


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


GLOSSARY = ROOT / "doc" / "user_guide" / "how_a_fit_runs.rst"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MOST_TYPES))
def test_every_type_a_default_fit_creates_is_named_in_the_glossary(name):
    """Issue 79 item 3: each type is named (``Name``) in "How a fit runs"'s glossary, the one list of concepts."""
    text = GLOSSARY.read_text()
    glossary = text[text.index("Glossary\n") : text.index("The tune stage, once per kernel")]
    created = _counter().count_default_fit(name)
    unnamed = [qualified for qualified in created if f"``{qualified.rpartition('.')[2]}``" not in glossary]
    assert not unnamed, unnamed


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 79 item 3: a default fit creates 34 dataclass types against the bound of 24 "
    "(benchmarks/count_fit_types.py lists them); what is left are distinct records of one stage each "
    "(the run plan and the EigenPro loop's plan with its hooks, the rows as given, prepared and as the "
    "criteria's tensors; the issue is blocked on the bound): benchmarks/RESULTS.md, issue 79 fifth part",
)
def test_a_default_fit_creates_at_most_24_dataclass_types():
    assert len(_counter().count_default_fit("regressor")) <= TARGET_TYPES


# Issue 79 item 3: each fact in at most two of the types a default fit creates (the
# parameters as given, KernelFitParameters, and the one type holding the value the fit
# uses, FitPlan).  Today's counts (at the start 7, 6, 5, 4 and 5): a type may not
# take up a fact again.  The criterion's record derives its alpha (AlphaSelection.alpha,
# a property: its penalty times the weight of the rows it scored), and each event's
# "solver" in fit_attempts_ is stamped where the events join the record
# (out_of_memory.record_with_events), not kept by the recorder.
FACTS = ("alpha", "solver", "bandwidth", "kernel", "streamed")
MOST_HOLDERS = {"alpha": 2, "solver": 2, "bandwidth": 2, "kernel": 2, "streamed": 2}
TARGET_HOLDERS = 2


def _holders(created):
    """``{fact: sorted names of the created dataclass types with a field of that name}``."""
    holders = {fact: [] for fact in FACTS}
    for name in created:
        module_name, _, class_name = name.rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        fields = {field.name for field in dataclasses.fields(cls)}
        for fact in FACTS:
            if fact in fields:
                holders[fact].append(name)
    return {fact: sorted(names) for fact, names in holders.items()}


@pytest.mark.slow
def test_no_fact_of_a_default_fit_has_more_homes_than_today():
    holders = _holders(_counter().count_default_fit("regressor"))
    assert "skgpu_kernel.planning.parameters.KernelFitParameters" in holders["alpha"]  # the parameters are seen
    for fact, most in MOST_HOLDERS.items():
        assert len(holders[fact]) <= most, (fact, holders[fact])


@pytest.mark.slow
def test_each_fact_of_a_default_fit_has_at_most_two_homes():
    holders = _holders(_counter().count_default_fit("regressor"))
    assert all(len(names) <= TARGET_HOLDERS for names in holders.values()), holders


def test_the_runtime_holds_its_events_as_an_immutable_record():
    """A stage hands its events on in a new runtime: copies never share a list that grows."""
    runtime = KernelRuntime([], None, 0, np.random.RandomState(0), None)
    assert runtime.memory_events == ()
    events = MemoryEvents()
    events.shrank("agop", "AGOP row block", 64, 32, "out of memory")
    later = runtime.recorded(record_with_events(runtime.memory_events, events, "cg"))
    assert runtime.memory_events == () and len(later.memory_events) == 1
    assert isinstance(later.memory_events, tuple)
    assert dataclasses.replace(later).memory_events is later.memory_events  # a tuple: nothing to append to
