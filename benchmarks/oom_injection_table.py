"""Out of memory injected in each stage of a fit (issue 50): what shrank, the record, the predictions.

Runs the cases of ``tests/test_out_of_memory.py`` (each refuses the k-th large
product of one stage with ``torch.OutOfMemoryError``) on the CPU in float64 and
writes ``benchmarks/oom_injection_table.md``: the stage, the solver, what shrank,
the ``fit_attempts_`` entry, and the largest difference of the test predictions
from the undisturbed fit's (and the test MSE of both, for the stages whose
fallback changes a decision).

Run from the repository root: ``OMP_NUM_THREADS=1 python benchmarks/oom_injection_table.py``.
"""

import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_out_of_memory import CASES, run_case  # noqa: E402

HEADER = (
    "| stage | solver | what shrank | `fit_attempts_` entry | max abs. prediction difference "
    "(relative to max abs. prediction) | test MSE undisturbed -> disturbed (change) |\n"
    "|---|---|---|---|---|---|\n"
)


def row(name, outcome):
    """One line of the table for a case's outcome."""
    (event,) = outcome.events
    shown = {key: value for key, value in event.items() if key != "event"}
    difference = float(np.max(np.abs(outcome.predicted - outcome.expected)))
    relative = difference / float(np.max(np.abs(outcome.expected)))
    before, after = outcome.test_mse
    return (
        f"| {name} | {event['solver']} | {event['shrank']}: {event['from']} -> {event['to']} | "
        f"`{json.dumps(shown)}` | {difference:.2e} ({relative:.1e}) | {before:.4g} -> {after:.4g} "
        f"({(after - before) / before:+.3%}) |\n"
    )


def main():
    lines = [row(name, run_case(case)) for name, case in CASES.items()]
    text = (
        "# Out of memory injected in each stage of a fit\n\n"
        "Measured by `benchmarks/oom_injection_table.py` (the cases of `tests/test_out_of_memory.py`): "
        "CPU, float64, `torch.OutOfMemoryError` raised at the k-th large product of one stage; "
        "1000 test rows of the same smooth target.  A block shrunk or a cache evaluated keeps the model "
        "(differences at float64 rounding); a smaller subsample or batch changes the fit's path.\n\n"
        + HEADER
        + "".join(lines)
    )
    (ROOT / "benchmarks" / "oom_injection_table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
