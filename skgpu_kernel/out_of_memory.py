"""Out of device memory in a stage of a fit: the stage runs again smaller, and the fit's record says so.

The memory plan is made from the memory free when a fit starts; a device that is
shared (or fragmented) may still refuse an allocation.  Every stage that allocates in
proportion to a planned size and keeps the plan's decisions (the AGOP's row blocks,
the validation scores, ``predict``, a cache whose entries are evaluated instead) runs
through :class:`ShrinkingStage`, the one place that retries in place: out of device memory,
CUDA's cached blocks are released, the stage's size goes to the next smaller one
(halved, or from a cache to blocks evaluated per product) and the stage runs again.
Where the smaller size changes a decision of the plan, the fit's one fallback loop
runs a new attempt planned with it instead: a kernel solver's loop refit with half
its batch (``AttemptContext.solved_or_halved``, stage ``"epoch batch"``), EigenPro's
preconditioner, and CG on every point's condition estimate, with half the Nystrom
subsample (``AttemptContext.on_subsample``, stage ``"preconditioner subsample"``);
the linear models' SGD loop halves its batch in place (``skgpu_kernel.solvers.sgd``).
All report through the same :class:`MemoryEvents`.

Each step is appended to the fit's record of what was tried (``fit_attempts_``; for
``predict``, which changes no fitted attribute, to a list the estimator turns into a
warning) as

``{"event": "out_of_memory", "stage": ..., "solver": ..., "shrank": ..., "from": ..., "to": ..., "reason": ...}``

``stage`` is one of :data:`STAGES`, ``shrank`` names the size that changed (a block's
rows, ``subsample_size``, ``batch_size``, a cache), ``from`` and ``to`` are its values
(``"cached"`` and ``"evaluated"`` for a cache) and ``reason`` is the error's first line.

The same record takes the step halvings of an EigenPro loop that diverged
(``skgpu_kernel.solvers.epochs.EpochGuard``) as
``{"event": "diverged", "stage": "epoch", "solver": ..., "changed": "step size factor",
"from": ..., "to": ..., "reason": ...}``, and a stage run again where the result it
was handed did not apply (a tuning handed to a fit whose policy it does not
match) as ``{"event": "ran_again", "stage": "tune", "solver": None, "reason": ...}``.

:class:`MemoryEvents` records what happened and where; the ``"solver"`` of each event
is the fit's fact, not the recorder's: :func:`record_with_events` stamps it where a
stage's events join the fit's record, the one place that knows whose run they
happened in.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .device import is_out_of_memory

__all__ = [
    "STAGES",
    "MemoryEvents",
    "ShrinkingStage",
    "halvings",
    "in_row_blocks",
    "out_of_memory_reason",
    "record_with_events",
    "release_cached_memory",
]

# The stages that shrink on out of memory, as the records name them.
STAGES = ("cache fill", "preconditioner subsample", "agop", "validation", "predict", "epoch batch")

# Characters of the error's message a record keeps.
_REASON_CHARACTERS = 200


@dataclass
class MemoryEvents:
    """Where the out-of-memory events of a stage go, in order, until they join the fit's record (``fit_attempts_``).

    Parameters
    ----------
    records : list
        The events of a stage, each appended to it as a dict (see the module's
        docstring), without the solver: :func:`record_with_events` adds them to the
        fit's record with it.
    log : callable or None
        Receives a line per event (``verbose``).
    """

    records: list = dataclasses.field(default_factory=list)
    log: Callable | None = None

    def shrank(self, stage, what, old, new, reason):
        """Record that ``stage`` went on with ``what`` shrunk from ``old`` to ``new`` because of ``reason``."""
        record = {
            "event": "out_of_memory",
            "stage": stage,
            "shrank": what,
            "from": old,
            "to": new,
            "reason": reason,
        }
        self.records.append(record)
        if self.log is not None:
            self.log(f"out of memory in the {stage}: {what} {old} -> {new} ({reason})")

    def changed(self, stage, what, old, new, reason):
        """Record that ``stage`` went on with ``what`` changed from ``old`` to ``new`` after a divergence."""
        record = {"event": "diverged", "stage": stage, "changed": what}
        self.records.append({**record, "from": old, "to": new, "reason": reason})
        if self.log is not None:
            self.log(f"diverged in the {stage}: {what} {old:g} -> {new:g} ({reason})")

    def ran_again(self, stage, reason):
        """Record that ``stage`` ran again where its handed result did not apply, because of ``reason``."""
        self.records.append({"event": "ran_again", "stage": stage, "reason": reason})
        if self.log is not None:
            self.log(f"the {stage} stage ran again: {reason}")


def record_with_events(record, events, solver):
    """The fit's ``record`` followed by the records of ``events``, each stamped with ``solver``.

    The one place a stage's events join the fit's record (``fit_attempts_``): the
    caller knows whose run (or model) they happened in, the recorder does not.
    Each event keeps its keys in the record's order, ``"solver"`` after ``"stage"``.

    Parameters
    ----------
    record : iterable of dict
        The fit's record so far (earlier events and attempts); not changed.
    events : MemoryEvents
        The events of a stage run after it.
    solver : str or None
        The solver whose run (or whose model) the events happened in; None for a
        stage before any solver (the tune stage run again).

    Returns
    -------
    list of dict
        A new list: ``record``'s entries, then each event with its ``"solver"``.

    Examples
    --------
    >>> events = MemoryEvents()
    >>> events.ran_again("tune", "the tuning handed in did not apply")
    >>> record_with_events([], events, None)
    [{'event': 'ran_again', 'stage': 'tune', 'solver': None, 'reason': 'the tuning handed in did not apply'}]
    """
    # Unpacked after the leading keys, an event's own "event" and "stage" keep their places.
    stamped = [
        {"event": event["event"], "stage": event["stage"], "solver": solver, **event} for event in events.records
    ]
    return [*record, *stamped]


def out_of_memory_reason(error):
    """The first line of ``error``'s message when it is a device out-of-memory error; any other is raised again."""
    if not is_out_of_memory(error):
        raise error
    lines = str(error).strip().splitlines()
    return lines[0][:_REASON_CHARACTERS] if lines else type(error).__name__


def release_cached_memory(device):
    """Give CUDA's cached blocks back, so that a smaller retry finds them (a no-op elsewhere)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class ShrinkingStage:
    """A stage run at the largest of its sizes the device has memory for; once shrunk, it stays so.

    Parameters
    ----------
    stage : str
        One of :data:`STAGES`.
    what : str
        The size that shrinks, as the record names it.
    sizes : iterable
        The sizes to try, the planned one first (:func:`halvings`, or
        ``("cached", "evaluated")``).
    device : torch.device
    events : MemoryEvents or None
        Where each shrinking is recorded (None: nowhere).

    Examples
    --------
    >>> import torch
    >>> def needs_small_blocks(rows):
    ...     if rows > 100:
    ...         raise torch.OutOfMemoryError("CUDA out of memory (example)")
    ...     return rows
    >>> events = MemoryEvents()
    >>> ShrinkingStage("predict", "row block", halvings(256), torch.device("cpu"), events)(needs_small_blocks)
    64
    >>> [(event["from"], event["to"]) for event in events.records]
    [(256, 128), (128, 64)]
    """

    def __init__(self, stage, what, sizes, device, events=None):
        self.stage, self.what, self.device = stage, what, device
        self.events = MemoryEvents() if events is None else events
        self._sizes = iter(sizes)
        self.size = next(self._sizes)

    def __call__(self, run):
        """``run(size)`` at the current size, then at each smaller one while the device is out of memory.

        Any other error, or running out of memory at the smallest size, is raised.
        The retry happens after the failed call's frames are gone, so that their
        tensors are freed first.
        """
        while True:
            try:
                return run(self.size)
            except (torch.OutOfMemoryError, RuntimeError) as error:
                reason = out_of_memory_reason(error)
                smaller = next(self._sizes, None)
                if smaller is None:
                    raise
            release_cached_memory(self.device)
            self.events.shrank(self.stage, self.what, self.size, smaller, reason)
            self.size = smaller


def halvings(size, smallest=1):
    """``size``, then half of it, and so on down to ``smallest`` (``size`` alone when it is not larger).

    Examples
    --------
    >>> list(halvings(1000, 100))
    [1000, 500, 250, 125, 100]
    """
    size = int(size)
    yield size
    while size > smallest:
        size = max(size // 2, smallest)
        yield size


def in_row_blocks(product, n_rows, row_block):
    """``product(rows)`` over consecutive slices of ``row_block`` rows, concatenated (one call when they all fit)."""
    if row_block >= n_rows:
        return product(slice(0, n_rows))
    pieces = [product(slice(start, min(start + row_block, n_rows))) for start in range(0, n_rows, row_block)]
    return torch.cat(pieces)
