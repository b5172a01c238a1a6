"""The benchmarks' child-process helper: a result, an error, or why the child gave none, never a hang."""

import importlib
import os
import pathlib
import signal
import threading

import pytest

_BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark_module(monkeypatch, name):
    """``benchmarks/<name>.py`` imported as the scripts import each other (by bare name, from that folder)."""
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    return importlib.import_module(name)


@pytest.fixture
def common(monkeypatch):
    """``benchmarks/_common.py`` imported as the scripts import it (the spawned child imports it by that name)."""
    module = _benchmark_module(monkeypatch, "_common")
    monkeypatch.setattr(module, "_CHILD_POLL_SECONDS", 0.2)
    return module


def _add_one(value):
    return value + 1


def _raise():
    raise ValueError("boom")


def _kill_itself():
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_without_result():
    os._exit(3)


def test_a_child_returns_its_result_or_its_error(common):
    assert common.in_child(_add_one, 1) == 2
    with pytest.raises(RuntimeError, match="ValueError: boom"):
        common.in_child(_raise)


def _outcome(call, timeout=120):
    """What ``call()`` raised, from a daemon thread: a regression fails the test instead of hanging the suite."""
    outcome = {}

    def run():
        try:
            call()
        except RuntimeError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"in_child still waiting after {timeout} s"
    return outcome.get("error", "")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_child_that_dies_without_a_result_is_reported_not_waited_for(common):
    # xRFM on LetterRecognition (24 GB) was killed by the out-of-memory killer, and the
    # parent then waited for its result for 30 minutes.
    assert "killed (SIGKILL" in _outcome(lambda: common.in_child(_kill_itself))
    assert "exit code 3" in _outcome(lambda: common.in_child(_exit_without_result))


@pytest.fixture
def real_data(monkeypatch):
    """``benchmarks/bench_real_data.py`` imported as the script runs (beside ``_common``)."""
    return _benchmark_module(monkeypatch, "bench_real_data")


def _row(error, seconds):
    return {"error": error, "fit_seconds": seconds, "diverged": 0, "peak_gb": 1.0, "notes": ""}


def test_a_target_whose_baseline_did_not_run_is_not_judged_rather_than_missed(real_data):
    against = real_data._Comparators
    ours = _row(0.1, 10.0)
    # --skip nystroem linear ...: neither target can be judged, and neither is a miss.
    assert real_data._missed_targets("HI", 30_000, ours, against(None, None, None)) == (
        [],
        ["error (no target baseline ran)", "time (Nystroem did not run)"],
    )
    assert real_data._missed_targets("HI", 30_000, ours, against(0.09, _row(0.2, 4.0), None)) == (
        ["error > 1.00 x best baseline", "time > 2 x Nystroem"],
        [],
    )
    assert real_data._missed_targets("HI", 30_000, ours, against(0.1, _row(0.2, 5.0), None)) == ([], [])
    # A perfect baseline is matched only by a perfect model.
    assert real_data._missed_targets("Glass", 200, _row(0.0, 1.0), against(0.0, None, None)) == ([], [])
    assert real_data._missed_targets("Glass", 200, ours, against(0.0, None, None))[0] == [
        "error > 1.00 x best baseline"
    ]
