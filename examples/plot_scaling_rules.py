"""
Learning-rate scaling rules for large batches
=============================================

When the batch grows ``k`` times, an SGD run makes ``k`` times fewer updates per
epoch, and the learning rate that was tuned for the small batch is no longer the
right one.  A *scaling rule* turns the tuned ``base_lr`` (for the base batch
``B0``) into a rate for any batch ``B``, and a schedule over the updates of the
run: a warm-up towards the peak, then a decay.

This example draws the schedules of the built-in rules of
:mod:`skgpu_kernel.scaling` with :meth:`~skgpu_kernel.scaling.ScalingRule.schedule`,
which computes them without any training:

* :class:`~skgpu_kernel.scaling.ConstantRule`: ``base_lr`` whatever the batch;
* :class:`~skgpu_kernel.scaling.LinearScaling` (Goyal et al. [1]_): peak ``k
  base_lr`` after a 5-epoch warm-up;
* :class:`~skgpu_kernel.scaling.SqrtScaling`: peak ``sqrt(k) base_lr``;
* :class:`~skgpu_kernel.scaling.LEGW` (You et al. [2]_): peak ``sqrt(k) base_lr``
  after a warm-up of ``k`` times the base run's epochs, then polynomial decay;
* :class:`~skgpu_kernel.scaling.EigenProRule` (Ma and Belkin [3]_): the analytic
  step from the spectrum of the problem, linear in the batch up to the critical
  batch ``beta / lambda_1`` and saturating beyond.
"""

# %%
# The setting
# -----------
# A base rate of 0.1 tuned with batches of 32, a run of 10 epochs over 60,000
# samples with batches of 512 (``k = 16``, 118 updates per epoch).  EigenPro's
# rule needs the spectrum of the problem: we take ``beta = 400`` (the largest
# diagonal entry of the operator, e.g. the largest squared norm of a sample for a
# linear model) and top eigenvalue ``lambda_1 = 4``, so the critical batch is 100.
import math
import os

import matplotlib.pyplot as plt
import numpy as np

from skgpu_kernel.scaling import LEGW, ConstantRule, EigenProRule, LinearScaling, SqrtScaling

BASE_LR, BASE_BATCH = 0.1, 32
N_SAMPLES, BATCH, N_EPOCHS = 60_000, 512, 10
SPECTRUM = {"beta": 400.0, "top_eigenvalue": 4.0}
steps_per_epoch = math.ceil(N_SAMPLES / BATCH)
n_steps = N_EPOCHS * steps_per_epoch

rules = {
    "ConstantRule, step decay": ConstantRule(BASE_LR, decay="step", decay_rate=0.5, decay_every=3.0),
    "LinearScaling, linear decay": LinearScaling(BASE_LR, BASE_BATCH, decay="polynomial"),
    "SqrtScaling, exponential decay": SqrtScaling(BASE_LR, BASE_BATCH, decay="exponential", decay_rate=0.7),
    "LEGW": LEGW(BASE_LR, BASE_BATCH),
    "EigenProRule": EigenProRule(),
}
schedules = {
    name: rule.schedule(
        BATCH,
        n_steps,
        steps_per_epoch=steps_per_epoch,
        n_epochs=N_EPOCHS,
        **(SPECTRUM if rule.requires_spectrum else {}),
    )
    for name, rule in rules.items()
}
for name, schedule in schedules.items():
    print(f"{name:32s} first {schedule[0]:.4f}, peak {schedule.max():.4f} at update {schedule.argmax()}")

# %%
# LEGW keeps the number of warm-up updates
# ----------------------------------------
# The base run warms up for a quarter epoch: 469 updates of 32 samples.  With
# batches 16 times larger LEGW warms up for 4 epochs, which is again about as
# many updates (472 here, with the last batch of each epoch rounded up).
legw = rules["LEGW"]
for batch in (BASE_BATCH, BATCH):
    per_epoch = math.ceil(N_SAMPLES / batch)
    schedule = legw.schedule(batch, 5 * per_epoch, steps_per_epoch=per_epoch, n_epochs=N_EPOCHS)
    print(f"LEGW at batch {batch:4d}: peak {schedule.max():.3f} reached after {schedule.argmax() + 1} updates")

# %%
# Peak learning rate against the batch size
# -----------------------------------------
# Without warm-up and decay a rule's schedule is flat at its peak, so the first
# rate of a one-update schedule is the peak.  The linear rule keeps growing with
# the batch and the square-root rule grows more slowly.  EigenPro's rule follows
# the linear slope ``m / beta`` up to the critical batch ``beta / lambda_1`` and
# then saturates near ``2 / lambda_1``: beyond it a larger step would be unstable
# along the top eigendirection, so a larger batch buys little.
batch_sizes = np.unique(np.logspace(0, 16, 49, base=2).round().astype(int))
flat_rules = {
    "LinearScaling": LinearScaling(BASE_LR, BASE_BATCH, warmup_epochs=0.0),
    "SqrtScaling": SqrtScaling(BASE_LR, BASE_BATCH),
    "EigenProRule": EigenProRule(),
}
peaks = {
    name: np.array(
        [
            rule.schedule(int(batch), 1, steps_per_epoch=1, n_epochs=1, **(SPECTRUM if rule.requires_spectrum else {}))[
                0
            ]
            for batch in batch_sizes
        ]
    )
    for name, rule in flat_rules.items()
}
critical_batch = SPECTRUM["beta"] / SPECTRUM["top_eigenvalue"]
print(f"critical batch {critical_batch:.0f}; EigenPro's step at 2**16: {peaks['EigenProRule'][-1]:.4f}")

# %%
# The picture
# -----------
fig, (ax_time, ax_batch) = plt.subplots(1, 2, figsize=(12, 4.8))
epochs = np.arange(n_steps) / steps_per_epoch
# One colour per rule in both panels.
colors = {name.split(",")[0]: f"C{i}" for i, name in enumerate(rules)}
for name, schedule in schedules.items():
    ax_time.plot(epochs, schedule, label=name, color=colors[name.split(",")[0]])
ax_time.set_xlabel("epoch (update / updates per epoch)")
ax_time.set_ylabel("learning rate")
ax_time.set_title(f"Schedules at batch {BATCH} (base batch {BASE_BATCH}, base_lr {BASE_LR})")
ax_time.legend(fontsize="small")
ax_time.grid(True, alpha=0.3)

for name, values in peaks.items():
    ax_batch.loglog(batch_sizes, values, label=name, color=colors[name])
ax_batch.axvline(critical_batch, color="gray", linestyle="--", linewidth=1, label="critical batch beta / lambda_1")
ax_batch.axhline(2 / SPECTRUM["top_eigenvalue"], color="gray", linestyle=":", linewidth=1, label="2 / lambda_1")
ax_batch.set_xlabel("batch size")
ax_batch.set_ylabel("peak learning rate")
ax_batch.set_title("Peak learning rate against the batch size")
ax_batch.legend(fontsize="small")
ax_batch.grid(True, which="major", alpha=0.3)
fig.tight_layout()

# Set SKGPU_EXAMPLE_OUT to a ``.png`` path or to a directory to keep the figure.
out = os.environ.get("SKGPU_EXAMPLE_OUT")
if out:
    if not out.lower().endswith(".png"):
        os.makedirs(out, exist_ok=True)
        out = os.path.join(out, "plot_scaling_rules.png")
    fig.savefig(out, dpi=100)

# %%
# Using a rule
# ------------
# The estimators take the rule as ``scaling_rule``, by name or as an object whose
# parameters a grid search reaches, e.g. ``scaling_rule__base_lr``::
#
#     from sklearn.model_selection import GridSearchCV
#     from skgpu_kernel import AdaptiveKernelRegressor
#     from skgpu_kernel.scaling import ConstantRule
#
#     search = GridSearchCV(
#         AdaptiveKernelRegressor(scaling_rule=ConstantRule()),
#         {"scaling_rule__base_lr": [1.0, 10.0, 100.0]},
#     )
#
# References
# ----------
# .. [1] P. Goyal et al., "Accurate, large minibatch SGD: training ImageNet in 1
#    hour", 2017. arXiv:1706.02677.
# .. [2] Y. You, J. Hseu, C. Ying, J. Demmel, K. Keutzer and C.-J. Hsieh,
#    "Large-batch training for LSTM and beyond", SC 2019. arXiv:1901.08256.
# .. [3] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
#    large batch training", SysML 2019. arXiv:1806.06144.

plt.show()
