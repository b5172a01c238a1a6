"""The GPU suite script, run end to end in its dry mode (CPU, toy sizes, GPU-only steps skipped)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _suite(tmp_path, *arguments, timeout):
    return subprocess.run(
        ["bash", "benchmarks/gpu_suite.sh", *arguments],
        cwd=ROOT,
        env=dict(os.environ, OUT=str(tmp_path), PY=sys.executable),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_suite_dry_run_writes_every_table(tmp_path):
    result = _suite(tmp_path, "--dry-run", "all", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "dry run" in (tmp_path / "device.txt").read_text()
    tables = (tmp_path / "RESULTS_gpu.md").read_text()
    for title in ("### Fashion-MNIST", "Parallel strategies"):
        assert title in tables
    assert tables.count("|---") >= 5, "the kernel (Fashion-MNIST, large, centers), BMGD and parallel tables"
    assert tables.count("### Large synthetic regression") == 2, "the 5M-row stream and the 1M-row row on 100k centers"
    assert "skipped" in (tmp_path / "pytest_gpu.log").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_suite_refuses_an_unknown_part(tmp_path):
    result = _suite(tmp_path, "--dry-run", "tset", timeout=60)
    assert result.returncode == 2 and "unknown part 'tset'" in result.stderr
