"""The gallery examples run end to end (slow: CI runs them, plain `-m "not slow"` skips)."""

import runpy
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("plot_*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_runs_and_saves_its_figure(path, tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    monkeypatch.setenv("SKGPU_EXAMPLE_OUT", str(tmp_path))
    runpy.run_path(str(path), run_name="__main__")
    assert any(tmp_path.glob("*.png")), f"{path.name} saved no figure"
