"""Draw "How a fit runs": the stages of a kernel fit, each with the module that holds it.

Run by ``doc/conf.py`` at every build (offline: matplotlib only), or by hand::

    python doc/fit_stages_figure.py doc/_generated/fit_stages.png

The figure is 1280 px wide, its smallest text 13 px high, so that it reads as it
is on a laptop screen.  Each row is one stage: its name, what it decides, and the
module (or modules) where that happens; the arrow on the right is the one fallback
loop of the solve stage.
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

# (stage, what it does, modules): top to bottom, in the order a fit runs them.
STAGES = (
    ("fit(X, y)", "validate, encode a table,\nresolve device, dtype and budget", "kernel_machines.py"),
    (
        "feature learning",
        "plain candidate, learning path, refit,\ncalibration: each a kernel fit below",
        "fit/feature_learning.py",
    ),
    (
        "resolve",
        "kernel by its rule, n_centers,\npolicy (solver, alpha mode, split)",
        "fit/resolve.py\nplanning/solver.py",
    ),
    ("tune", "bandwidth search, leave-one-out alpha:\nonce per kernel", "fit/tune.py\nregularization.py"),
    ("plan", "the solver the driver starts with\n(direct, CG, EigenPro)", "fit/plan.py\nplanning/kernel_policy.py"),
    ("prepare", "rows to the device once, split,\nintercept, shuffle, centers", "fit/prepare.py"),
    ("solve", "the one fallback loop: run an attempt,\ncheck its model, record it", "fit/solve.py\nfit/attempts.py"),
    (
        "attempt",
        "layout, measured capacity, spectrum,\nthe plan of the solver it runs",
        "fit/registry.py: fit/eigenpro.py,\ncg.py, planned.py; planning/",
    ),
    (
        "operator",
        "K @ V: float or grid blocks, cache,\nshards, streamed rows",
        "fit/operator.py, operators/\nplanning/operator.py",
    ),
    (
        "solver",
        "the algorithm on the operator:\nEigenPro 2 / 3, CG, Cholesky",
        "solvers/eigenpro.py, eigenpro3.py\ncenters_cg.py, full_kernel_cg.py",
    ),
    ("finish", "joint intercept, what ran and why\n(fit_attempts_)", "fit/finish.py"),
)
WIDTH_PX, ROW_PX, DPI = 1280, 72, 100
COLUMNS = (0.012, 0.175, 0.52)  # left edges of the stage, what it does, modules (figure fractions)


def draw(path):
    """Write the figure to ``path`` (its suffix gives the format)."""
    height_px = ROW_PX * (len(STAGES) + 1)
    figure = plt.figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, 1)
    axes.set_ylim(0, len(STAGES) + 1)
    axes.axis("off")
    axes.text(COLUMNS[0], len(STAGES) + 0.45, "stage", fontsize=13, color="0.35")
    axes.text(COLUMNS[1], len(STAGES) + 0.45, "what it decides or does", fontsize=13, color="0.35")
    axes.text(COLUMNS[2], len(STAGES) + 0.45, "where (skgpu_kernel/...)", fontsize=13, color="0.35")
    for row, (stage, what, modules) in enumerate(STAGES):
        y = len(STAGES) - row - 0.5
        color = "#dbe9f6" if stage in ("solve", "attempt", "operator", "solver") else "#eef3e2"
        box = FancyBboxPatch((0.005, y - 0.4), 0.86, 0.8, boxstyle="round,pad=0.0,rounding_size=0.02", color=color)
        axes.add_patch(box)
        axes.text(COLUMNS[0], y, stage, fontsize=15, fontweight="bold", va="center")
        axes.text(COLUMNS[1], y, what, fontsize=13, va="center")
        axes.text(COLUMNS[2], y, modules, fontsize=13, va="center", family="monospace")
        if row:
            axes.annotate("", (0.08, y + 0.4), (0.08, y + 0.6), arrowprops={"arrowstyle": "-|>", "color": "0.3"})
    solve_y, attempt_y = len(STAGES) - 6.5, len(STAGES) - 7.5
    loop = FancyArrowPatch(
        (0.866, attempt_y),
        (0.866, solve_y),
        connectionstyle="arc3,rad=0.9",
        arrowstyle="-|>",
        mutation_scale=18,
        color="#b03a2e",
        linewidth=2,
    )
    axes.add_patch(loop)
    axes.text(0.9, (solve_y + attempt_y) / 2, "fallback:\na new plan", fontsize=13, color="#b03a2e", va="center")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


if __name__ == "__main__":
    draw(sys.argv[1] if len(sys.argv) > 1 else "fit_stages.png")
