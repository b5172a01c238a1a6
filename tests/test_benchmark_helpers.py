"""The benchmarks' child-process helper: a result, an error, or why the child gave none, never a hang."""

import importlib
import os
import pathlib
import signal
import threading

import numpy as np
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


@pytest.mark.parametrize(
    ("name", "n_rows", "splits"),
    [
        ("FashionMNIST", 70_000, 1),
        ("Glass", 214, 10),
        ("DNA", 2_999, 10),
        ("DNA", 3_000, 5),
        ("HI", 100_000, 5),
        ("Fertility", 100_001, 3),
    ],
)
def test_the_paired_splits_follow_the_issues_counts(monkeypatch, name, n_rows, splits):
    assert _benchmark_module(monkeypatch, "paired_splits").split_count(name, n_rows) == splits


def test_a_set_is_worse_only_beyond_two_standard_errors_and_one_percent(monkeypatch):
    module = _benchmark_module(monkeypatch, "paired_splits")

    def record(**sets):
        return {
            "sets": {name: {"errors": list(errors), "seconds": [1.0] * len(errors)} for name, errors in sets.items()}
        }

    before = record(noisy=[0.10, 0.20, 0.10, 0.20], steady=[0.10, 0.10, 0.10, 0.10], small=[0.10] * 4)
    after = record(
        noisy=[0.13, 0.16, 0.14, 0.19],  # 2.5% worse on the mean, within its noise
        steady=[0.12, 0.121, 0.119, 0.12],  # 20% worse, far beyond two standard errors
        small=[0.1005, 0.1004, 0.1006, 0.1005],  # beyond two standard errors, but by 0.5%
    )
    rows = module.paired(before, after)
    assert {row[0]: row[7] for row in rows} == {"noisy": False, "steady": True, "small": False}
    geometric, worse = module.verdict(rows)
    assert worse == ["steady"]
    ratios = [0.155 / 0.15, 0.12 / 0.10, 0.1005 / 0.10]
    assert geometric == pytest.approx(np.exp(np.mean(np.log(ratios))))


def test_growth_slope_over_the_issue_sizes_only(monkeypatch):
    """The growth benchmark's slope: time ~ rows^1.3 over 10k-200k gives 1.3; sizes outside do not count."""
    growth = _benchmark_module(monkeypatch, "bench_growth")
    sizes = [5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 400_000]
    seconds = [(n / 1000) ** 1.3 for n in sizes]
    seconds[0] = seconds[-1] = 1.0  # outside the bounds: must not move the slope
    assert growth.log_slope(sizes, seconds) == pytest.approx(1.3, rel=1e-12)
    assert np.isnan(growth.log_slope([5_000, 10_000], [1.0, 2.0]))


def test_growth_table_ratios_against_catboost(monkeypatch):
    """Each size's row gives our fit, predict and error as ratios of CatBoost's."""
    growth = _benchmark_module(monkeypatch, "bench_growth")
    cell = {"fit": 4.0, "predict": 0.5, "error": 0.3}
    results = {"ours": {10_000: cell}, "CatBoost": {10_000: {"fit": 2.0, "predict": 0.05, "error": 0.25}}}
    row = growth.table(results, [10_000], ["ours", "CatBoost"])[2]
    assert row.endswith("| 2.00x | 10.00x | 1.20x |")


def test_pace_row_ratios_and_bounds(monkeypatch):
    """The pace benchmark's row: ours over CatBoost's fit, predict and error, and whether both bounds hold."""
    pace = _benchmark_module(monkeypatch, "bench_pace")
    catboost = {"fit": 2.0, "predict": 0.01, "error": 0.2}
    within = {"rows": 5000, "ours": {"fit": 4.0, "predict": 0.1, "error": 0.2}, "CatBoost": catboost}
    assert pace.line("DNA", within).endswith("| 2.00x | 10.0x | 1.000x | yes |")
    slow_predict = {**within, "ours": {"fit": 1.0, "predict": 0.11, "error": 0.2}}
    assert pace.line("DNA", slow_predict).endswith("| no |")
