"""Planning a buffered mini-batch SGD (BMGD) fit: buffers, batch, resident or streamed data, step context.

Two pure calls, because measuring needs a first decision:

1. :func:`plan_buffers` sizes the buffers from the problem's sizes, the memory
   budget and the device type, and says how large a batch the throughput probe
   may try (the probe runs on a sample of the training rows);
2. :func:`plan_bmgd` takes what was measured on that sample (the spectrum, from
   :func:`step_spectrum`, and the probe's :class:`ThroughputProbe`) and chooses
   the batch and the scaling rule's :class:`~skgpu_kernel.scaling.ScheduleContext`.

Then how the schedule ends: :func:`plateaus_to_anneal` (the plateaus that halve
the step) and :func:`plan_polish` (whether a full-batch L-BFGS finish follows, its
:class:`PolishPlan`).

Nothing here allocates a tensor, times anything, draws a random number or warns:
the warnings a decision needs (a size clamped to the data) are returned in the
plans for the caller to issue, and the rows a fit samples or holds out are drawn
by :mod:`skgpu_kernel.splits`.
"""

import math
from dataclasses import dataclass, field

from ..device import rows_within_budget
from ..scaling import EigenProRule, ScheduleContext
from ._account import MemoryAccount

__all__ = [
    "CPU_BUFFER_BYTES",
    "MIN_STEPS_PER_PASS",
    "POLISHED_LOSSES",
    "POLISH_HISTORY",
    "POLISH_MAX_ITER",
    "POLISH_SMOOTHING",
    "POLISH_SMOOTHING_SHRINK",
    "POLISH_TOLERANCE",
    "PROBE_MAX_BATCH",
    "SAMPLE_ROWS",
    "SMOOTHED_LOSSES",
    "BMGDPlan",
    "BufferPlan",
    "PolishPlan",
    "SGDProblem",
    "ThroughputProbe",
    "plan_bmgd",
    "plan_buffers",
    "plan_polish",
    "plateaus_to_anneal",
    "step_spectrum",
]

# Rows read to estimate the spectrum and to probe the device's batch capacity.
SAMPLE_ROWS = 8192
# Batches above the critical batch are used for throughput only while a pass keeps at
# least this many steps, so that each pass still makes optimisation progress.
MIN_STEPS_PER_PASS = 64
# On the CPU, buffers beyond a few tens of MB only add cache and TLB misses to the
# random gathers of mini-batches: a pass over 5M x 100 float32 rows took 2.2 s with
# the data resident as one buffer and 0.6 s in buffers of 26 MB.
CPU_BUFFER_BYTES = 64 * 2**20
# The probe's largest batch: throughput saturates far below on every device seen.
PROBE_MAX_BATCH = 2**16
# Plateaus of the stopping rule at which a fit at EigenPro's analytic step halves its
# step (ANNEAL_FACTOR) before the next one stops it: 1/128 of the peak.  Measured on
# noisy least squares, log and hinge losses at 100 to 100,000 rows (issue 78,
# RESULTS.md): dividing by 5 at 3 plateaus left the hinge on 100 rows 1.08% above its
# optimum, halving at 7 plateaus 0.73%; halving at 10 or 14 changed nothing more.
ANNEALED_PLATEAUS = 7
# The losses the full-batch polish finishes: twice differentiable, so that
# quasi-Newton steps converge fast (the hinge and the Huber loss have kinks).
POLISHED_LOSSES = frozenset({"squared_error", "huber", "log_loss", "hinge"})
# Losses with a kink, polished through smoothed copies of themselves: the first one
# rounds the kink over a margin of 1 (the hinge's own scale), each next one over a
# tenth of the last, until the smoothing's gap is within half the tolerance.
SMOOTHED_LOSSES = frozenset({"hinge"})
POLISH_SMOOTHING = 1.0
POLISH_SMOOTHING_SHRINK = 10.0
# The polish stops when its gradient certifies an excess objective of at most this
# share of the objective (a hundredth of the 1% the optimum tests allow): near
# separation the log loss's optimum is flat, and test predictions only settle on
# the optimum's once the objective is that close (issue 78, RESULTS.md).
POLISH_TOLERANCE = 1e-4
# L-BFGS iterations of the polish (two products with the rows each) and curvature
# pairs it keeps.  With 10 pairs, 0-183 iterations reached the tolerance on every real
# table measured but Fashion-MNIST (60000 x 784, 10 classes: 712 iterations, 67 s);
# with 30 pairs it took 436 (40 s), and the pairs' memory stays small beside the
# scores of every row (2 x 30 coefficient matrices).
POLISH_MAX_ITER = 1000
POLISH_HISTORY = 30


@dataclass(frozen=True)
class SGDProblem:
    """The sizes of a BMGD fit that its plan depends on.

    Parameters
    ----------
    n_train : int
        Training rows (without the validation rows).
    n_features : int
    n_outputs : int
        Score columns (targets, or classes beyond two).
    itemsize : int
        Bytes of one value in the training dtype.
    nonzeros_per_row : float or None, default=None
        Mean stored values per row of a sparse ``X``; None for dense data.
    weighted : bool, default=False
        Whether sample weights travel with the rows.
    """

    n_train: int
    n_features: int
    n_outputs: int
    itemsize: int
    nonzeros_per_row: float | None = None
    weighted: bool = False

    @property
    def row_bytes(self):
        """Device bytes of one row with its targets and weight (a sparse row: values, indices, row pointer)."""
        if self.nonzeros_per_row is not None:
            row = self.nonzeros_per_row * (16 + self.itemsize) + 16
        else:
            row = self.n_features * self.itemsize
        return row + (8 * self.n_outputs + 8 * self.weighted)


@dataclass(frozen=True)
class BufferPlan:
    """Buffers of a BMGD fit: the first of its two plans (see :func:`plan_buffers`).

    Attributes
    ----------
    n_train : int
    buffer_size : int
        Rows per buffer.
    resident : bool
        The training data fits in one buffer: it is loaded once for all passes.
    sample_rows : int
        Rows sampled for the spectrum and the throughput probe.
    probe_max_batch : int or None
        Largest batch the throughput probe tries; None when the batch is the user's.
    memory : MemoryAccount
        Two buffers (the one training and the one loading) and a batch gather,
        reserved at a buffer's size since the batch is chosen later and never
        exceeds a buffer.
    warnings : tuple of str
        Sizes clamped to the data, for the caller to issue.
    """

    n_train: int
    buffer_size: int
    resident: bool
    sample_rows: int
    probe_max_batch: int | None
    memory: MemoryAccount
    warnings: tuple = ()

    @property
    def buffers_per_pass(self):
        """Buffers a pass over the training rows reads."""
        return math.ceil(self.n_train / self.buffer_size)

    def describe(self):
        """One line: rows per buffer, buffers per pass, resident or streamed, memory."""
        how = "resident" if self.resident else "streamed"
        return (
            f"n={self.n_train}, buffer {self.buffer_size} rows ({self.buffers_per_pass} per pass, {how}), "
            f"{self.memory.describe()}"
        )


@dataclass(frozen=True)
class ThroughputProbe:
    """What the throughput probe measured on the sampled rows (an input to :func:`plan_bmgd`).

    Parameters
    ----------
    capacity : int
        Smallest batch at which samples per second stop growing.
    throughputs : dict
        Samples per second by probed batch size.
    """

    capacity: int
    throughputs: dict = field(default_factory=dict)

    @property
    def largest_batch(self):
        """Largest probed batch (None when nothing was probed)."""
        return max(self.throughputs) if self.throughputs else None


@dataclass(frozen=True)
class BMGDPlan:
    """Every automatic decision of a BMGD fit (see :func:`plan_bmgd`).

    Attributes
    ----------
    buffers : BufferPlan
    batch_size : int
    n_rounds : int
    spectrum : tuple of float
        ``(beta, lambda_1)`` of the penalised loss, as the step rule sees them.
    critical_batch_size : float
        ``beta / lambda_1`` (infinite when ``lambda_1`` is 0).
    context : ScheduleContext
        What the scaling rule is called with.
    probe : ThroughputProbe or None
        The measurement the batch came from; None when the batch is the user's.
    warnings : tuple of str
        Sizes clamped to the data (the buffers' included), for the caller to issue.
    """

    buffers: BufferPlan
    batch_size: int
    n_rounds: int
    spectrum: tuple
    critical_batch_size: float
    context: ScheduleContext
    probe: ThroughputProbe | None = None
    warnings: tuple = ()

    @property
    def buffer_size(self):
        return self.buffers.buffer_size

    @property
    def resident(self):
        return self.buffers.resident

    @property
    def memory(self):
        return self.buffers.memory

    def describe(self):
        """One line: buffers, batch, critical batch, rounds and memory."""
        return (
            f"n={self.buffers.n_train}, buffer {self.buffer_size} rows ({self.buffers.buffers_per_pass} per pass, "
            f"{'resident' if self.resident else 'streamed'}), batch {self.batch_size} "
            f"(critical batch {self.critical_batch_size:.1f}), R={self.n_rounds}, {self.memory.describe()}"
        )


def plan_buffers(problem, budget, device_type, buffer_size="auto", batch_size="auto"):
    """Rows per buffer: two buffers and a batch gather within ``budget``.

    Parameters
    ----------
    problem : SGDProblem
    budget : int
        Bytes the fit may use on the device.
    device_type : str
        ``"cpu"`` caps buffers at :data:`CPU_BUFFER_BYTES`.
    buffer_size : int or "auto", default="auto"
        The user's; larger than the training rows, it is clamped with a warning.
    batch_size : int or "auto", default="auto"
        The user's: ``"auto"`` asks for a throughput probe.

    Returns
    -------
    BufferPlan

    Examples
    --------
    >>> plan = plan_buffers(SGDProblem(10_000, 10, 1, 4), budget=150_000, device_type="cuda")
    >>> plan.buffer_size, plan.resident, plan.probe_max_batch, plan.memory.total <= 150_000
    (1041, False, 1041, True)
    """
    row_bytes = problem.row_bytes
    rows = rows_within_budget(budget, 0, 3 * row_bytes)
    if device_type == "cpu":
        rows = min(rows, max(int(CPU_BUFFER_BYTES // row_bytes), 1))
    warnings = ()
    if buffer_size == "auto":
        size = min(rows, problem.n_train)
    elif buffer_size > problem.n_train:
        warnings = (_clamped("buffer_size", buffer_size, problem.n_train, "rows of training data"),)
        size = problem.n_train
    else:
        size = buffer_size
    resident = size >= problem.n_train
    buffer_bytes = int(size * row_bytes)
    items = (("buffer", buffer_bytes), ("next buffer", 0 if resident else buffer_bytes), ("batch gather", buffer_bytes))
    memory = MemoryAccount(budget, items)
    return BufferPlan(
        n_train=problem.n_train,
        buffer_size=size,
        resident=resident,
        sample_rows=min(problem.n_train, SAMPLE_ROWS),
        probe_max_batch=min(size, PROBE_MAX_BATCH) if batch_size == "auto" else None,
        memory=memory,
        warnings=warnings,
    )


def step_spectrum(beta, top_eigenvalue, curvature, alpha):
    """``(beta, lambda_1)`` of the penalised loss from those of the sampled rows' second moment.

    ``curvature`` bounds the loss's second derivative in the scores (1 for the square
    loss) and the L2 penalty ``alpha`` shifts every eigenvalue.

    Examples
    --------
    >>> step_spectrum(10.0, 2.0, 0.5, 0.1)
    (5.1, 1.1)
    """
    return curvature * beta + alpha, curvature * top_eigenvalue + alpha


def plan_bmgd(buffers, spectrum, probe=None, *, batch_size="auto", n_rounds=1, n_epochs=10):
    """The batch and the schedule context of a BMGD fit, given what was measured.

    With ``batch_size="auto"`` the batch is the probe's capacity ``m_G``, but no
    larger than is useful: beyond the critical batch ``m* = beta / lambda_1`` a
    step gains nothing per sample over a smaller one, only throughput, so larger
    batches are taken while a pass keeps :data:`MIN_STEPS_PER_PASS` steps.  A
    user's batch larger than a buffer is clamped with a warning.

    Parameters
    ----------
    buffers : BufferPlan
    spectrum : tuple of float
        ``(beta, lambda_1)`` from :func:`step_spectrum`.
    probe : ThroughputProbe or None
        Required when ``batch_size="auto"``.
    batch_size : int or "auto", default="auto"
    n_rounds : int, default=1
    n_epochs : int, default=10

    Returns
    -------
    BMGDPlan

    Examples
    --------
    >>> buffers = plan_buffers(SGDProblem(10_000, 10, 1, 4), budget=10**9, device_type="cuda")
    >>> plan = plan_bmgd(buffers, (50.0, 1.0), ThroughputProbe(4096, {4096: 1e6}))
    >>> plan.batch_size, plan.context.steps_per_epoch
    (157, 64)
    """
    beta, top = spectrum
    critical = beta / top if top > 0 else math.inf
    warnings = buffers.warnings
    size = buffers.buffer_size
    if batch_size != "auto":
        if batch_size > size:
            warnings += (_clamped("batch_size", batch_size, size, "rows in a buffer"),)
        chosen, probe = min(batch_size, size), None
    else:
        useful = max(min(critical, size), buffers.n_train / MIN_STEPS_PER_PASS, 1)
        chosen = int(max(min(probe.capacity, math.ceil(useful), size), 1))
    context = ScheduleContext(
        batch_size=chosen,
        steps_per_epoch=n_rounds * math.ceil(buffers.n_train / chosen),
        n_epochs=n_epochs,
        beta=beta,
        top_eigenvalue=top,
    )
    return BMGDPlan(buffers, chosen, n_rounds, (beta, top), critical, context, probe, warnings)


def _clamped(name, value, limit, what):
    return f"{name}={value} is larger than the {limit} {what}; using {limit}."


def plateaus_to_anneal(rule):
    """Plateaus of the stopping rule that divide a linear SGD fit's step instead of stopping it.

    At a constant step, SGD on data the model cannot interpolate does not reach the
    optimum: its iterate wanders at a distance that grows with the step (a noisy
    least-squares fit at EigenPro's optimal mini-batch step ended with R^2 0.14
    where the optimum's was 0.65).  Where the step is the analytic peak with no
    decay of its own (:class:`~skgpu_kernel.scaling.EigenProRule`, the default
    ``"optimal"`` and ``"eigenpro"``), each of the first :data:`ANNEALED_PLATEAUS`
    plateaus of the training loss (or validation score) halves the step
    (``ANNEAL_FACTOR``), as scikit-learn's ``learning_rate="adaptive"`` divides it; the
    next plateau stops the fit.  On interpolable data the peak step runs until the
    loss has no gain left, so its speed is kept.  Every other rule's schedule is
    the user's own: a plateau stops it as before.

    Parameters
    ----------
    rule : ScalingRule

    Returns
    -------
    int

    Examples
    --------
    >>> from skgpu_kernel.scaling import ConstantRule, EigenProRule
    >>> plateaus_to_anneal(EigenProRule(step="optimal")), plateaus_to_anneal(EigenProRule(decay="polynomial"))
    (7, 0)
    >>> plateaus_to_anneal(ConstantRule(0.01))
    0
    """
    return ANNEALED_PLATEAUS if isinstance(rule, EigenProRule) and rule.decay is None else 0


@dataclass(frozen=True)
class PolishPlan:
    """A full-batch L-BFGS finish of a linear SGD fit on the penalised training objective.

    Attributes
    ----------
    alpha : float
        The L2 penalty (positive: it makes the optimum unique and certifies the stop).
    fit_intercept : bool
    tolerance : float
        Stop once ``||g||^2 <= 2 alpha tolerance f``: by the penalty's strong
        convexity, the objective ``f`` is then within ``tolerance f`` of the optimum.
    max_iter : int
        L-BFGS iterations in all.
    history : int
        Curvature pairs kept.
    smoothing : float or None
        For a loss with a kink (:data:`SMOOTHED_LOSSES`), the width of its first
        smoothed copy; None for a smooth loss.
    smoothing_shrink : float
        Each next smoothed copy's width is the last one's divided by this.
    in_float64 : bool
        Scores, gradients and the iterate in float64 whatever the rows' dtype: a
        smoothed kink narrower than float32's resolution of the scores leaves no
        descent the line search can see (measured: float32 stalls at a certified
        excess of 0.5-13 on the hinge, float64 reaches 1e-4).
    rows_resident : bool
        Every training row read once and kept for the polish's passes, where they
        fit the budget beside the rest; else the SGD's buffers, read again each pass.
    """

    alpha: float
    fit_intercept: bool
    tolerance: float = POLISH_TOLERANCE
    max_iter: int = POLISH_MAX_ITER
    history: int = POLISH_HISTORY
    smoothing: float | None = None
    smoothing_shrink: float = POLISH_SMOOTHING_SHRINK
    in_float64: bool = False
    rows_resident: bool = False


def plan_polish(problem, plan, settings, in_process):
    """Whether a linear SGD fit ends with a full-batch polish, and how.

    SGD at a decaying step reaches the optimum of a well-conditioned problem, but
    near separation the log loss's curvature vanishes along the directions that
    separate, and the steps a stochastic gradient can take (bounded by the top
    eigenvalue) crawl there: on nearly separable tables the annealed default ended
    1.2-7.8x above the optimum's objective, its test error up to 1.8x the optimum's
    (issue 78, RESULTS.md).  L-BFGS on the whole training set, from SGD's iterate,
    reaches the optimum in tens to hundreds of iterations of two passes each.  It
    runs (``polish="auto"``) where

    * the schedule is the default's (the analytic step that the stopping rule
      anneals, :func:`plateaus_to_anneal`): another rule is a schedule the user chose;
    * the loss is in :data:`POLISHED_LOSSES` and ``alpha > 0`` (a unique optimum
      and a certified stop); the hinge's kink is rounded, ever less, by smoothed
      copies of it (:data:`SMOOTHED_LOSSES`), whose gap enters the certificate;
    * the fit is a ``fit`` call without early stopping (``partial_fit`` takes one
      pass; early stopping chooses its model by the held-out score, not the objective);
    * the model is this process's fit of every row (not a parallel strategy's);
    * three score matrices of every row fit the budget beside the buffers.  The
      rows are kept in memory for the polish's passes where they fit too
      (``rows_resident``); else they are read as the SGD passes read them.

    Parameters
    ----------
    problem : SGDProblem
    plan : BMGDPlan
        The fit's buffers and their memory within the budget.
    settings : object
        The fit's settings: ``polish``, ``loss``, ``alpha``, ``fit_intercept``,
        ``scaling_rule``, ``early_stopping``, ``incremental``.
    in_process : bool
        The runner's model is this process's fit of every row.

    Returns
    -------
    PolishPlan or None

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from skgpu_kernel.scaling import EigenProRule
    >>> settings = SimpleNamespace(polish="auto", loss="log_loss", alpha=1e-4, fit_intercept=True,
    ...     scaling_rule=EigenProRule(step="optimal"), early_stopping=False, incremental=False)
    >>> problem = SGDProblem(1000, 10, 1, 4)
    >>> plan = plan_buffers(problem, 2**30, "cpu")
    >>> plan_polish(problem, plan, settings, in_process=True).tolerance
    0.0001
    >>> plan_polish(problem, plan, settings, in_process=False) is None
    True
    """
    wanted = (
        settings.polish == "auto"
        and plateaus_to_anneal(settings.scaling_rule) > 0
        and settings.loss in POLISHED_LOSSES
        and settings.alpha > 0
        and not (settings.early_stopping or settings.incremental)
        and in_process
    )
    if not wanted:
        return None
    smoothed = settings.loss in SMOOTHED_LOSSES
    itemsize = 8 if smoothed else problem.itemsize
    # Scores, the direction's scores and their gradient, plus the targets and weights.
    fixed = problem.n_train * (3 * problem.n_outputs * itemsize + 8 * problem.n_outputs + 8 * problem.weighted)
    # The curvature pairs: two coefficient matrices (with the intercepts) each.
    fixed += 2 * POLISH_HISTORY * (problem.n_features + 1) * problem.n_outputs * itemsize

    def needed(buffer_rows, resident):
        """Bytes beside the SGD's: the rows kept (resident), a buffer converted to float64 where the rows are not."""
        converted = buffer_rows * problem.row_bytes * 2 if itemsize != problem.itemsize else 0
        return fixed + resident * problem.n_train * problem.row_bytes + converted

    # Resident rows turn each pass into one product; streamed, each pass reads and
    # converts every buffer again (Fashion-MNIST: 0.45 s an iteration streamed, 0.09 s resident).
    free = plan.memory.budget - plan.memory.total
    # Rows the SGD held in one buffer are the polish's after the SGD is done.
    resident = plan.resident or needed(problem.n_train, True) <= free
    if not resident and needed(plan.buffer_size, False) > free:
        return None
    return PolishPlan(
        alpha=float(settings.alpha),
        fit_intercept=bool(settings.fit_intercept),
        smoothing=POLISH_SMOOTHING if smoothed else None,
        in_float64=smoothed,
        rows_resident=resident,
    )
