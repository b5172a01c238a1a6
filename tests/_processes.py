"""Process facts read from /proc: the child processes a test left behind, and memory counters."""

import os
import time

# Helpers that outlive any one test by design, not workers of ours: multiprocessing's
# resource tracker (one per process) and joblib's reusable loky pool (started by the
# tests that fit with n_jobs=2).
_PERSISTENT_HELPERS = (b"resource_tracker", b"loky")


def _process_table():
    """``(pid, state, parent, session, cmdline)`` of every process, read from /proc."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue  # ended meanwhile
        # The command name (in parentheses) may contain spaces: fields start after it.
        state, parent, _, session = stat[stat.rindex(")") + 2 :].split()[:4]
        yield int(entry), state, int(parent), int(session), cmdline


def _ours(cmdline):
    return not any(helper in cmdline for helper in _PERSISTENT_HELPERS)


def child_processes(pid=None):
    """``(pid, state)`` of the processes whose parent is ``pid`` (default: this process), zombies included."""
    pid = os.getpid() if pid is None else pid
    return [(child, state) for child, state, parent, _, cmdline in _process_table() if parent == pid and _ours(cmdline)]


def session_processes(session):
    """Pids of the live processes of ``session`` (zombies, exiting processes and persistent helpers left out)."""
    table = _process_table()
    # A process that is exiting releases its memory, and with it its command line,
    # before it becomes a zombie: multiprocessing's resource tracker does so as the
    # parent that owns it exits, exactly when a test looks for leftovers.
    return [
        pid for pid, state, _, sid, cmdline in table if sid == session and state != "Z" and cmdline and _ours(cmdline)
    ]


def wait_for_no_children(seconds=10.0):
    """The children still there after waiting up to ``seconds`` for them to go."""
    deadline = time.monotonic() + seconds
    while child_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return child_processes()


def status_bytes(field):
    """A memory counter of this process from /proc/self/status (``VmRSS``, ``VmHWM``, ...), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)
