import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

# numpy's bundled OpenBLAS misdetects some CPUs and crashes on large products.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
# Throughput probes are stored per machine (skgpu_kernel._probe_store); the tests, and
# the processes they start, keep theirs in a directory of their own.
if "SKGPU_KERNEL_PROBE_DIR" not in os.environ:
    os.environ["SKGPU_KERNEL_PROBE_DIR"] = tempfile.mkdtemp(prefix="skgpu_kernel_probes_")
    atexit.register(shutil.rmtree, os.environ["SKGPU_KERNEL_PROBE_DIR"], ignore_errors=True)

#: Relative tolerances for comparisons against float64 references, per dtype.
RTOL = {"float32": 2e-4, "float64": 1e-9}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def rng():
    return np.random.RandomState(0)


@pytest.fixture
def without_cg_basis(monkeypatch):
    """CG on every point planned with no room for its preconditioner's basis."""
    import dataclasses

    from skgpu_kernel.planning import run

    planned = run.plan_every_point_cg
    monkeypatch.setattr(
        run, "plan_every_point_cg", lambda layout: dataclasses.replace(planned(layout), max_components=0)
    )


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="session")
def check_html():
    """``doc/check_html.py``, the CI step that checks the built documentation (not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "check_html", Path(__file__).resolve().parents[1] / "doc" / "check_html.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
