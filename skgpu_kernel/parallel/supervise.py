"""The parent's side of spawned workers: wait for their reports, name the failure that caused the others, stop them.

:func:`~skgpu_kernel.parallel.launch.run_distributed` starts one process per
device, each with a one-way pipe for its single report; here the parent waits on
the pipes and the process sentinels together (:func:`collect_results`) and leaves
no process or pipe behind whatever happened (:func:`shutdown_workers`).
"""

import pickle
import signal
import time
from multiprocessing.connection import wait as _wait_for

from .._warnings import warn_user

__all__ = ["KILL_GRACE_SECONDS", "ORPHAN_EXIT_CODE", "collect_results", "shutdown_workers", "stop_processes"]

# Seconds a worker gets to exit on its own after reporting its result (tearing down
# the process group, flushing output) before it is terminated.
EXIT_SECONDS = 10.0

# Seconds between SIGTERM and SIGKILL when stopping workers: enough for a process
# to die from SIGTERM's default action, short enough that a failed fit (or Ctrl-C)
# returns promptly even if a worker ignores SIGTERM.
KILL_GRACE_SECONDS = 3.0

# Longest single wait of the parent for its workers' reports.  The kernel may hand a
# SIGINT sent to this process to any of its threads (the store's, torch's); Python's
# handler then only sets a flag, which the main thread acts on once its wait returns
# (a Ctrl-C sent to the parent alone once waited for the workers to end).  Five
# wake-ups a second cost nothing measurable.
SIGNAL_CHECK_SECONDS = 0.2

# Exit code of a worker that stops because its parent died.
ORPHAN_EXIT_CODE = 70


def _exit_description(exitcode):
    if exitcode is None:
        return "closed its result channel without reporting a result"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode}) before reporting a result"
    if exitcode == ORPHAN_EXIT_CODE:
        return f"stopped with exit code {exitcode} (it lost its parent process) before reporting a result"
    # Typically 1: an error before the worker function ran (e.g. importing it failed),
    # whose traceback the process printed to its standard error.
    return f"ended with exit code {exitcode} before reporting a result (its error output may say why)"


def _receive(rank, process, reader):
    """The report of worker ``rank`` if one is available now, else None.

    Returns ``("ok", value)``, ``("error", time, text)`` or ``("died", exitcode)``.
    """
    if reader.poll():
        try:
            data = reader.recv_bytes()
        except (EOFError, OSError):
            # The process ended (or closed the channel) without a message; wait
            # briefly for its exit code, which is set only once it is reaped.
            process.join(KILL_GRACE_SECONDS)
            return ("died", process.exitcode)
        try:
            return pickle.loads(data)
        except Exception as exc:  # any failure to rebuild the result
            return ("error", time.time(), f"its result could not be unpickled in the calling process: {exc!r}\n")
    if process.exitcode is not None:
        return ("died", process.exitcode)
    return None


def _failure(rank, report):
    if report[0] == "died":
        return RuntimeError(f"worker {rank} failed: the process {_exit_description(report[1])}.")
    return RuntimeError(f"worker {rank} failed:\n{report[2]}")


def _first_failure(failures):
    """The exception for the failure that most likely caused the others.

    A rank that died without a word is the likeliest cause (its peers then fail on
    the broken connection); otherwise the earliest reported error.
    """
    died = sorted(rank for rank, report in failures.items() if report[0] == "died")
    if died:
        cause = died[0]
    else:
        cause = min(failures, key=lambda rank: (failures[rank][1], rank))
    error = _failure(cause, failures[cause])
    others = sorted(rank for rank in failures if rank != cause)
    if others:
        # Appended to the message (not add_note, Python >= 3.11) so that it shows everywhere.
        note = f"\n(worker(s) {', '.join(map(str, others))} failed as well, probably as a consequence.)"
        error = RuntimeError(error.args[0] + note)
    return error


def collect_results(processes, readers, deadline, timeout):
    """Wait for every worker's report; raise on the first failure or at the deadline."""
    results = [None] * len(processes)
    pending = set(range(len(processes)))
    while pending:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(
                f"run_distributed: the workers did not finish within timeout={timeout:g} s "
                f"(rank(s) {', '.join(map(str, sorted(pending)))} still running); all were terminated."
            )
        # Waiting on each result channel and each process sentinel together: a report
        # or a death wakes the parent at once (no polling), even from a crashed worker.
        owners = {}
        for rank in pending:
            owners[readers[rank]] = rank
            owners[processes[rank].sentinel] = rank
        wait_seconds = SIGNAL_CHECK_SECONDS if remaining is None else min(remaining, SIGNAL_CHECK_SECONDS)
        ready = {owners[obj] for obj in _wait_for(list(owners), wait_seconds)}
        failures = {}
        for rank in sorted(ready):
            report = _receive(rank, processes[rank], readers[rank])
            if report is None:
                continue
            if report[0] == "ok":
                results[rank] = report[1]
                pending.discard(rank)
            else:
                failures[rank] = report
        if failures:
            # Gather whatever the other ranks reported meanwhile, to name the cause.
            for rank in sorted(pending - set(failures)):
                report = _receive(rank, processes[rank], readers[rank])
                if report is not None and report[0] != "ok":
                    failures[rank] = report
            raise _first_failure(failures)
    return results


def stop_processes(processes, grace):
    """Terminate and join ``processes``: SIGTERM, SIGKILL after ``grace`` seconds.

    A second KeyboardInterrupt while waiting skips to SIGKILL; it is re-raised once
    every process is reaped.
    """
    interrupt = None
    processes = [process for process in processes if process.pid is not None]  # those that started
    try:
        for process in processes:
            if process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + grace
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt as exc:
        interrupt = exc
    for process in processes:
        if process.exitcode is None:
            process.kill()
    for process in processes:
        while True:
            try:
                process.join()  # SIGKILL cannot be caught: returns promptly
                break
            except KeyboardInterrupt as exc:
                interrupt = exc
        process.close()
    if interrupt is not None:
        raise interrupt


def shutdown_workers(processes, readers, graceful):
    """Leave no worker process and no open result channel behind, whatever happened.

    ``graceful``: every worker reported and is tearing its group down; give them a
    moment to exit by themselves before terminating stragglers.
    """
    try:
        if graceful:
            end = time.monotonic() + EXIT_SECONDS
            for process in processes:
                process.join(max(0.0, end - time.monotonic()))
            stuck = [rank for rank, process in enumerate(processes) if process.exitcode is None]
            if stuck:
                warn_user(
                    f"worker(s) {stuck} reported their result but did not exit within {EXIT_SECONDS:g} s; "
                    "terminated them.",
                    RuntimeWarning,
                )
    finally:
        # Also after a KeyboardInterrupt during the graceful wait.
        try:
            stop_processes(processes, KILL_GRACE_SECONDS)
        finally:
            for reader in readers:
                reader.close()
