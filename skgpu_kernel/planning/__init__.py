"""Planning: every automatic decision of a fit, as pure functions that return frozen plans.

A planner takes the problem's sizes, the resolved device facts (memory budget,
measured capacity) and the user's parameters, and returns a frozen dataclass
that the solvers run and the estimator shells record.  Each plan carries a
:class:`MemoryAccount` whose items sum to what it uses on the device, and a
one-line ``describe()`` that ``verbose`` prints.
"""

from ._account import MemoryAccount, format_bytes

__all__ = ["MemoryAccount", "format_bytes"]
