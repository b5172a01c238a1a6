"""The benchmarks' child-process helper: a result, an error, or why the child gave none, never a hang."""

import importlib
import os
import pathlib
import signal
import threading

import pytest

_BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def common(monkeypatch):
    """``benchmarks/_common.py`` imported as the scripts import it (the spawned child imports it by that name)."""
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    module = importlib.import_module("_common")
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
