"""The gallery examples run end to end (slow: CI runs them, plain `-m "not slow"` skips)."""

import os
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))
# A documentation build that executed the gallery (.ci/run sets this after its docs
# step): the examples ran there, so the tests check the figures they left instead of
# running them a second time.
BUILT_DOCS = os.environ.get("SKGPU_EXAMPLES_BUILT")


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_runs_and_saves_its_figure(path, tmp_path, monkeypatch, check_html):
    if BUILT_DOCS:
        figure = check_html.first_figure(BUILT_DOCS, path)
        assert figure.is_file() and figure.stat().st_size > 0, f"the docs build in {BUILT_DOCS} has no {figure.name}"
        return
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    monkeypatch.setenv("SKGPU_EXAMPLE_OUT", str(tmp_path))
    runpy.run_path(str(path), run_name="__main__")
    assert any(tmp_path.glob("*.png")), f"{path.name} saved no figure"
