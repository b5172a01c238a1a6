"""
Growing the batch without re-tuning: linear, sqrt and LEGW scaling
==================================================================

A learning rate tuned for one batch size ``B0`` is rarely right for another.
A *scaling rule* turns the tuned ``base_lr`` into a schedule for any batch
``B = k B0``, so that the batch can grow (to use a larger device, or more
devices) without tuning again.  This example compares three rules of
:mod:`skgpu_kernel.scaling` on multinomial logistic regression of
Fashion-MNIST with :class:`~skgpu_kernel.BufferedSGDClassifier`:

* :class:`~skgpu_kernel.scaling.LinearScaling` (Goyal et al. [1]_): peak
  learning rate ``k base_lr``, reached by a linear warm-up of a fixed number of
  epochs;
* :class:`~skgpu_kernel.scaling.SqrtScaling`: peak ``sqrt(k) base_lr``, which
  keeps the variance of an update constant;
* :class:`~skgpu_kernel.scaling.LEGW` (You et al. [2]_): peak
  ``sqrt(k) base_lr`` after a warm-up of ``k w0`` epochs, that is the same
  number of *updates* as the base run's warm-up.

``base_lr`` is tuned once at ``B0 = 32``; then every rule trains with batches
of ``B0``, ``4 B0``, ``16 B0`` and ``64 B0`` for the same budget of 5 epochs.
"""

# %%
# Data
# ----
# 20,000 training images drawn at random from Fashion-MNIST's 60,000 (pixels
# scaled to [0, 1] by the loader, then standardised), and the official test
# set of 10,000 images.  5,000 other training images serve as a validation set
# for tuning ``base_lr``.  Without Fashion-MNIST installed, the example falls
# back on scikit-learn's small digits data set, with a smaller base batch.
import math
import os
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.metrics import log_loss
from sklearn.preprocessing import StandardScaler

from skgpu_kernel import BufferedSGDClassifier
from skgpu_kernel.datasets import load_fashion_mnist
from skgpu_kernel.scaling import LEGW, ConstantRule, LinearScaling, SqrtScaling

started = time.perf_counter()
rng = np.random.RandomState(0)
try:
    X_all, y_all, X_test, y_test = load_fashion_mnist()
    order = rng.permutation(X_all.shape[0])
    train, validation = order[:20_000], order[20_000:25_000]
    BASE_BATCH = 32
    data_name = "Fashion-MNIST"
except FileNotFoundError as error:
    print(f"Fashion-MNIST is not available ({error}); using scikit-learn's digits instead.")
    X_digits, y_digits = load_digits(return_X_y=True)
    X_digits = X_digits.astype(np.float32) / 16.0
    order = rng.permutation(X_digits.shape[0])
    X_all, y_all = X_digits[order[:1300]], y_digits[order[:1300]]
    X_test, y_test = X_digits[order[1300:]], y_digits[order[1300:]]
    train, validation = np.arange(1000), np.arange(1000, 1300)
    BASE_BATCH = 4
    data_name = "digits"

scaler = StandardScaler().fit(X_all[train])
X_train, y_train = scaler.transform(X_all[train]), y_all[train]
X_val, y_val = scaler.transform(X_all[validation]), y_all[validation]
X_test = scaler.transform(X_test)
print(f"{data_name}: {X_train.shape[0]} training, {X_val.shape[0]} validation, {X_test.shape[0]} test rows")

N_EPOCHS = 5
FACTORS = [1, 4, 16, 64]
batch_sizes = [k * BASE_BATCH for k in FACTORS]
DECAY = dict(decay="polynomial", decay_power=2.0)


def fit_and_score(rule, batch_size, X_eval, y_eval):
    """(accuracy, log loss) on (X_eval, y_eval) after N_EPOCHS passes; NaNs when the training diverges."""
    model = BufferedSGDClassifier(
        loss="log_loss", scaling_rule=rule, batch_size=batch_size, n_epochs=N_EPOCHS, tol=None, random_state=0
    )
    try:
        model.fit(X_train, y_train)
    except ValueError as error:  # the loss became non-finite: the step was too large
        print(f"    {type(rule).__name__} at batch {batch_size} diverged: {str(error)[:70]}...")
        return math.nan, math.nan
    return model.score(X_eval, y_eval), log_loss(y_eval, model.predict_proba(X_eval), labels=model.classes_)


# %%
# Tuning ``base_lr`` once, at the base batch
# ------------------------------------------
# Every rule is a decaying schedule here: polynomial decay of power 2 down to
# zero at the end of the 5 epochs (LEGW's default decay, given to all rules so
# that only the scaling differs).  At ``B = B0`` the square-root rule has
# ``k = 1`` and no warm-up, so it is simply the decayed ``base_lr``: we tune
# with it, trying three values and scoring on the validation set.
candidates = [0.03, 0.1, 0.3]
scores = {lr: fit_and_score(SqrtScaling(lr, BASE_BATCH, **DECAY), BASE_BATCH, X_val, y_val)[0] for lr in candidates}
for lr, score in scores.items():
    print(f"base_lr = {lr:<5}: validation accuracy {score:.4f} at batch {BASE_BATCH}")
base_lr = max(scores, key=lambda lr: np.nan_to_num(scores[lr], nan=-1.0))
print(f"picked base_lr = {base_lr}")

# %%
# The rules
# ---------
# All rules share ``base_lr``, ``base_batch_size = B0`` and the decay.  The
# warm-ups are set for a 5-epoch run:
#
# * linear scaling warms up over 1 epoch (Goyal et al. use 5 epochs of a
#   90-epoch run; the default of :class:`~skgpu_kernel.scaling.LinearScaling`,
#   5 epochs, would fill our whole budget);
# * LEGW warms up over ``k w0`` epochs with ``w0 = 1/32`` epoch (about 20
#   updates at ``B0``, 2 epochs at ``64 B0``).  Its default ``w0 = 1/4`` epoch
#   would make the warm-up 16 epochs long at ``64 B0``, more than the run;
# * square-root scaling has no warm-up.
#
# For reference, the constant rule keeps the peak at ``base_lr`` whatever the
# batch, and the two dashed lines show linear scaling and LEGW with their
# default warm-ups.
rules = {
    "constant (no scaling)": ConstantRule(base_lr, **DECAY),
    "linear": LinearScaling(base_lr, BASE_BATCH, warmup_epochs=1.0, **DECAY),
    "sqrt": SqrtScaling(base_lr, BASE_BATCH, **DECAY),
    "LEGW": LEGW(base_lr, BASE_BATCH, base_warmup_epochs=1 / 32, **DECAY),
    "linear, default warm-up (5 epochs)": LinearScaling(base_lr, BASE_BATCH, **DECAY),
    "LEGW, default warm-up (w0 = 1/4)": LEGW(base_lr, BASE_BATCH, **DECAY),
}
styles = {
    "constant (no scaling)": ("gray", "-"),
    "linear": ("tab:blue", "-"),
    "sqrt": ("tab:orange", "-"),
    "LEGW": ("tab:green", "-"),
    "linear, default warm-up (5 epochs)": ("tab:blue", "--"),
    "LEGW, default warm-up (w0 = 1/4)": ("tab:green", "--"),
}
# The estimator warns when a warm-up lasts the whole run, as the dashed
# configurations' do; here that is the point being shown, so the warning is
# silenced.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*never reaches its peak")
    results = {
        name: np.array([fit_and_score(rule, B, X_test, y_test) for B in batch_sizes]) for name, rule in rules.items()
    }
accuracy = {name: values[:, 0] for name, values in results.items()}
test_log_loss = {name: values[:, 1] for name, values in results.items()}

header = f"{'rule':36s}" + "".join(f"{f'B = {B}':>10s}" for B in batch_sizes)
for title, table in [("test accuracy", accuracy), ("test log loss", test_log_loss)]:
    print(f"\n{title} after {N_EPOCHS} epochs, base_lr = {base_lr}, B0 = {BASE_BATCH}")
    print(header)
    for name, row in table.items():
        print(f"{name:36s}" + "".join(f"{value:10.4f}" for value in row))
print(f"\n{'updates per run':36s}" + "".join(f"{N_EPOCHS * math.ceil(X_train.shape[0] / B):10d}" for B in batch_sizes))

# %%
# Accuracy against batch size, and the schedules at ``16 B0``
# -----------------------------------------------------------
# :meth:`~skgpu_kernel.scaling.ScalingRule.schedule` computes a rule's learning
# rates without training, from the batch size and the number of updates per
# epoch (``ceil(n / B)``, as the estimator counts them when the data fits in
# one buffer).
fig, (ax_acc, ax_loss, ax_lr) = plt.subplots(1, 3, figsize=(15, 4.8))
for ax, table, label in [(ax_acc, accuracy, "test accuracy"), (ax_loss, test_log_loss, "test log loss")]:
    for name, row in table.items():
        color, linestyle = styles[name]
        ax.plot(batch_sizes, row, "o", color=color, linestyle=linestyle, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batch_sizes, labels=[f"{B}\n({k} B0)" for B, k in zip(batch_sizes, FACTORS, strict=True)])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"{label} after {N_EPOCHS} epochs")
    ax.grid(True, alpha=0.3)
ax_loss.set_yscale("log")
ax_loss.set_yticks([0.5, 1, 2, 4, 8], labels=["0.5", "1", "2", "4", "8"])
ax_loss.minorticks_off()
ax_acc.set_title(f"{data_name}, base_lr = {base_lr} tuned at B0 = {BASE_BATCH}")
ax_loss.set_title("Test log loss (log scale)")
ax_acc.legend(fontsize=8)

batch = 16 * BASE_BATCH
steps_per_epoch = math.ceil(X_train.shape[0] / batch)
epochs = np.arange(N_EPOCHS * steps_per_epoch) / steps_per_epoch
for name, rule in rules.items():
    color, linestyle = styles[name]
    rates = rule.schedule(batch, len(epochs), steps_per_epoch=steps_per_epoch, n_epochs=N_EPOCHS)
    ax_lr.plot(epochs, rates, color=color, linestyle=linestyle, label=name)
ax_lr.set_xlabel("epoch")
ax_lr.set_ylabel("learning rate")
ax_lr.set_title(f"Schedules at B = 16 B0 = {batch}")
ax_lr.grid(True, alpha=0.3)
fig.tight_layout()

# Set SKGPU_EXAMPLE_OUT to a ``.png`` path or to a directory to keep the figure.
out = os.environ.get("SKGPU_EXAMPLE_OUT")
if out:
    if not out.lower().endswith(".png"):
        os.makedirs(out, exist_ok=True)
        out = os.path.join(out, "plot_legw_batch_scaling.png")
    fig.savefig(out, dpi=100)
print(f"\n{time.perf_counter() - started:.1f} s in all")

# %%
# Reading the picture
# -------------------
# **Tuning.**  The three candidate rates are close at ``B0 = 32`` (validation
# accuracies of about 0.853, 0.854 and 0.845): ``base_lr = 0.1`` was picked,
# and no rule was tuned again afterwards.
#
# **What a larger batch costs.**  The budget is fixed in epochs, so a batch
# ``k`` times larger makes ``k`` times fewer updates: 3125 at ``B0``, only 50
# at ``64 B0``.  A scaling rule makes each update larger to compensate.  Up to
# ``4 B0`` every scaled rule stays within half a point of the base accuracy
# (0.839); at ``64 B0`` the best rule here, square-root scaling, loses about
# 2 points (0.821).  The constant rule, which does not scale at all, loses
# more than twice as much (0.795): growing the batch without growing the step
# wastes the budget.  On this convex problem nothing fully recovers the base
# accuracy in 50 updates; You et al. report no loss at ``64 B0`` for LSTMs
# trained for many more epochs.
#
# **Linear scaling and the log loss.**  Linear scaling reaches about the same
# accuracy as the square-root rules, but its log loss on the test set tells
# another story: 2.1 at ``64 B0`` against 0.6.  Its peak there is
# ``64 x 0.1 = 6.4``, and the weights grow large enough to make the predicted
# probabilities grossly overconfident, which the accuracy does not see.  The
# logistic loss has bounded gradients, so SGD does not blow up; with the
# squared loss a step that large would make the training diverge (the
# estimator then raises an error that names the learning rate).  Linear scaling
# rests on the assumption that a batch of ``k B0`` is worth ``k`` small steps,
# which stops being true beyond the critical batch size.
#
# **Warm-up.**  LEGW has the same peak as square-root scaling and differs only
# by its warm-up of ``k w0`` epochs: at ``64 B0`` it spends 2 of the 5 epochs
# (20 of the 50 updates) below the peak, which costs a little here.  Warm-up
# protects the first updates of deep networks, whose early loss landscape is
# steep; logistic regression started from zero has nothing to protect.  The
# dashed lines show that warm-up lengths are in *epochs* and must be set for
# the length of the run: the default warm-up of linear scaling (5 epochs)
# fills our whole budget, so its rate climbs until the end of the run and never
# decays (right panel; at ``B0`` it is a constant ``base_lr``), the worst
# schedule at every batch size; LEGW's default ``w0 = 1/4`` epoch gives a
# 16-epoch warm-up at ``64 B0``, so the rate only reaches 5/16 of its peak and
# accuracy drops to 0.72.
#
# References
# ----------
# .. [1] P. Goyal et al., "Accurate, large minibatch SGD: training ImageNet in
#    1 hour", 2017. arXiv:1706.02677.
# .. [2] Y. You, J. Hseu, C. Ying, J. Demmel, K. Keutzer and C.-J. Hsieh,
#    "Large-batch training for LSTM and beyond", SC 2019. arXiv:1901.08256.

plt.show()
