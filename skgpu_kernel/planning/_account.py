"""The memory account every plan carries: named byte counts and the budget they fit."""

from dataclasses import dataclass

__all__ = ["MemoryAccount", "format_bytes"]


def format_bytes(count):
    """``count`` bytes as a short human-readable string (decimal units, as memory_budget's)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"


@dataclass(frozen=True)
class MemoryAccount:
    """What a plan holds on one device: named items in bytes, and the budget they must fit.

    Parameters
    ----------
    budget : int
        Bytes the fit may use on the device.
    items : tuple of (str, int)
        Named parts of the plan's peak use (data, caches, factors, one batch's
        blocks, ...); they add up to :attr:`total`.
    """

    budget: int
    items: tuple = ()

    @property
    def total(self):
        """Bytes of all items together."""
        return sum(count for _, count in self.items)

    def fits(self):
        """Whether the items fit the budget."""
        return self.total <= self.budget

    def __getitem__(self, name):
        """Bytes of the item ``name`` (0 when the plan has no such item)."""
        return sum(count for item, count in self.items if item == name)

    def with_item(self, name, count):
        """A copy with one more item."""
        return MemoryAccount(self.budget, (*self.items, (name, int(count))))

    def describe(self):
        """One line: each item, the total and the budget."""
        parts = " + ".join(f"{name} {format_bytes(count)}" for name, count in self.items if count)
        return f"memory {parts or 'nothing'} = {format_bytes(self.total)} of {format_bytes(self.budget)}"
