"""Worker processes: run one function on several devices as the ranks of a torch.distributed group.

The parallel strategies (``ALGORITHMS.md`` sections 4 and 5) need one process per
device, a process group for the collectives (all-reduce, broadcast) and a key-value
store for dynamic scheduling (atomic counters).  This module provides

* :func:`run_distributed`: spawn one process per device, set up the group over a
  local ``TCPStore``, run ``worker(context, payload)`` in each, and return the
  results in rank order; or, under ``torchrun`` (a group already exists), run the
  worker in the calling process as its rank;
* :class:`WorkerContext`: what a worker knows about its place in the group;
* :func:`resolve_backend`: NCCL for distinct GPUs, gloo otherwise;
* :func:`share_for_workers`: copy an array once into shared memory so that every
  spawned worker reads the same pages.

Every transfer between workers goes through ``torch.distributed``; the parent only
receives each worker's final (pickled) return value, or its traceback.  Nothing here
knows about models or losses.
"""

import contextlib
import inspect
import itertools
import math
import multiprocessing.process
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from .supervise import ORPHAN_EXIT_CODE, collect_results, shutdown_workers

__all__ = ["WorkerContext", "resolve_backend", "run_distributed", "share_for_workers"]

# Seconds between two checks of a spawned worker for its parent's death: orphans are
# noticed within this delay, at no measurable cost.
_ORPHAN_POLL_SECONDS = 1.0

_LOCALHOST = "127.0.0.1"

# init_process_group(device_id=...) exists from torch 2.3 on.
_ACCEPTS_DEVICE_ID = dist.is_available() and "device_id" in inspect.signature(dist.init_process_group).parameters

# Spawned workers are all on this machine, and every run gets a fresh store: a short
# fixed prefix only keeps the worker's keys apart from the group's own.
_SPAWNED_PREFIX = "skgpu_kernel/"

# Calls of run_distributed in an existing group, counted per process.  Every rank
# calls run_distributed in the same order (as with any collective), so the n-th call
# gets the same store prefix on every rank, without communicating, and never sees
# the keys of an earlier call.
_JOINED_CALLS = itertools.count()


@dataclass
class WorkerContext:
    """Where a worker runs: its rank, its device and the group's shared store.

    Parameters
    ----------
    rank : int
        This worker's rank in ``[0, world_size)``.
    world_size : int
        Number of workers in the group.
    device : torch.device
        This worker's device; for a GPU, ``torch.cuda.set_device`` was called.
    backend : str
        ``"gloo"`` or ``"nccl"``: the default process group's backend for this device.
    store : torch.distributed.Store
        Key-value store shared by all ranks, private to this run (keys of earlier
        runs are not visible).  ``store.add(key, n)`` is an atomic counter, e.g. to
        hand out batches dynamically.
    spawned : bool
        True when :func:`run_distributed` spawned this process; False when it joined
        an existing group (``torchrun``), in the caller's own process.
    """

    rank: int
    world_size: int
    device: torch.device
    backend: str
    store: "dist.Store"
    spawned: bool


def _check_devices(devices):
    """``devices`` as a list of ``torch.device`` (CPU or CUDA with an index), or raise."""
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"devices must be a list of devices (e.g. ['cpu', 'cpu'] or ['cuda:0', 'cuda:1']), got {devices!r}."
        )
    if len(devices) == 0:
        raise ValueError("devices must hold at least one device, got an empty list.")
    checked = []
    for i, entry in enumerate(devices):
        if not isinstance(entry, (str, torch.device)):
            raise TypeError(f"devices[{i}] must be a str or torch.device, got {entry!r}.")
        try:
            device = torch.device(entry)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"devices[{i}] = {entry!r} is not a device: {exc}") from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"devices[{i}] = {entry!r}: workers run on 'cpu' or 'cuda' devices only.")
        if device.type == "cuda" and device.index is None:
            # A fresh process's current device is cuda:0; naming it lets two
            # entries "cuda" and "cuda:0" be recognised as the same GPU.
            device = torch.device("cuda", 0)
        checked.append(device)
    return checked


def resolve_backend(devices):
    """The torch.distributed backend for workers on ``devices``.

    Parameters
    ----------
    devices : list of str or torch.device
        One entry per worker.

    Returns
    -------
    {"nccl", "gloo"}
        ``"nccl"`` when every device is a distinct GPU and NCCL is available (Linux
        builds with CUDA); ``"gloo"`` otherwise: CPU workers, a mix such as
        ``["cuda:0", "cpu"]``, or two workers sharing one GPU (which NCCL refuses).

    Notes
    -----
    gloo reduces CPU tensors; a worker on a GPU in a gloo group moves the tensors of
    its collectives to the CPU (or relies on gloo's CUDA support, which covers only
    some collectives).

    Examples
    --------
    >>> from skgpu_kernel.parallel.launch import resolve_backend
    >>> resolve_backend(["cpu", "cpu"])
    'gloo'
    >>> resolve_backend(["cuda:0", "cpu"])
    'gloo'
    """
    devices = _check_devices(devices)
    all_gpus = all(device.type == "cuda" for device in devices)
    distinct = len(set(devices)) == len(devices)
    if all_gpus and distinct and dist.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _check_worker(worker):
    if not callable(worker):
        raise TypeError(f"worker must be a callable worker(context, payload), got {worker!r}.")
    try:
        # Spawned processes receive the function by reference (module and name):
        # lambdas, nested functions and bound methods of local objects fail here,
        # with a clear message, instead of inside Process.start().
        pickle.dumps(worker)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(
            f"worker must be picklable, i.e. a function defined at module level (not a lambda or a nested "
            f"function), so that spawned processes can import it; pickling {worker!r} failed: {exc}"
        ) from None


class _Discard:
    """A file that forgets what is written to it."""

    def write(self, data):
        return len(data)


class _MainReferenceFinder(pickle.Pickler):
    """Pickles an object into nothing, noting what in it a worker would look up in ``__main__``.

    Array and tensor contents are skipped: only the names that unpickling resolves
    matter, and the training data may be large.
    """

    def __init__(self):
        super().__init__(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        self.found = []

    def reducer_override(self, obj):
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            return (tuple, ())
        owner = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
        if getattr(owner, "__module__", None) == "__main__":
            self.found.append(getattr(owner, "__qualname__", repr(owner)))
            return (tuple, ())
        return NotImplemented


def _main_references(obj):
    """Qualified names of the ``__main__`` functions and classes that pickling ``obj`` refers to."""
    finder = _MainReferenceFinder()
    with contextlib.suppress(Exception):  # what cannot be pickled is reported when the workers start
        finder.dump(obj)
    return sorted(set(finder.found))


def _main_script():
    """What spawned workers do with the main module: ``(runs_it, description)``.

    Spawned workers are fresh interpreters that import the main module again (by
    module name, or by running its file) before they unpickle their work.  That is
    impossible for a script piped on standard input (its ``__file__`` is
    ``"<stdin>"``); a ``python -c`` command or an interactive session has no file,
    and the workers run no main module at all.
    """
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True, "the main module"  # python -m package.module: imported by name
    path = getattr(main, "__file__", None)
    if path is None:
        source = "a `python -c` command" if sys.argv[:1] == ["-c"] else "an interactive session"
        return False, source
    if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:
        path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)  # as multiprocessing resolves it
    if os.path.isfile(path):
        return True, "the main module"
    return False, "standard input" if path.endswith("<stdin>") else f"{path!r}, which is not a file"


# Serialises the moments in which __main__.__file__ is hidden from multiprocessing.
_MAIN_FILE_LOCK = threading.Lock()


@contextlib.contextmanager
def _workers_skip_unreadable_main():
    """Start workers as for a ``python -c`` command when the main module's file cannot be read.

    multiprocessing would have every spawned worker run the main module's
    ``__file__`` (``"<stdin>"`` for a piped script), and each would die at once.  The
    workers need nothing from the main module (:func:`_check_main_references` made
    sure of it), so they are told of none.
    """
    main = sys.modules.get("__main__")
    runs_main, _ = _main_script()
    if runs_main or getattr(main, "__file__", None) is None:
        yield
        return
    with _MAIN_FILE_LOCK:
        path = main.__file__
        del main.__file__
        try:
            yield
        finally:
            main.__file__ = path


def _check_main_references(group):
    """Raise at once if spawned workers would need objects from a main module they cannot import."""
    runs_main, source = _main_script()
    if runs_main:
        return
    names = _main_references(group)
    if names:
        raise TypeError(
            f"the worker processes need {', '.join(names)}, defined in the main module, which they cannot "
            f"import: it was read from {source}, and spawned workers are fresh interpreters that import "
            "whatever they run by name. Move these definitions to a module of their own and import it, or "
            "save the script to a file and run it as `python script.py` (with the fit under "
            '`if __name__ == "__main__":`).'
        )


def _check_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        raise TypeError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
    return float(timeout)


def _group_timeout(timeout):
    # None keeps torch's default collective timeout (10 minutes for gloo and NCCL).
    return None if timeout is None else timedelta(seconds=timeout)


def _cpu_threads(world_size):
    """Intra-op threads for one of ``world_size`` CPU workers on this machine."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // world_size)


def run_distributed(worker, payload, devices, timeout=600.0):
    """Run ``worker(context, payload)`` as the ranks of a torch.distributed group.

    Outside ``torchrun``, spawns one process per entry of ``devices`` (the ranks, in
    that order), connects them through a ``TCPStore`` served by the calling process
    on ``127.0.0.1`` (a free port chosen by the OS), and returns every worker's
    return value.  Inside ``torchrun`` (``torch.distributed`` already initialised in
    the calling process, on one node or several), spawns nothing: the worker runs in
    the calling process as its rank of the default group.

    Parameters
    ----------
    worker : callable
        ``worker(context, payload)`` with a :class:`WorkerContext`; a function defined
        at module level (spawned processes import it by name).  Its return value must
        be picklable; return CPU tensors or arrays (a CUDA tensor would be unpickled
        onto a GPU of the calling process).
    payload : object
        Passed to every worker.  Spawned workers receive a pickled copy, except for
        CPU tensors (at any depth), which they map without copying: torch moves a
        tensor into shared memory (in place) the first time it is sent.  Turn numpy
        training data into such a tensor with :func:`share_for_workers`.
    devices : list of str or torch.device
        One entry per worker, ``"cpu"`` or ``"cuda:i"``.  The backend follows from
        them (:func:`resolve_backend`).
    timeout : float or None, default=600.0
        Seconds the whole run may take (spawning included), and the limit on any one
        collective (``init_process_group(timeout=...)``).  None: no limit on the run,
        torch's default for collectives.  Ignored inside ``torchrun``, whose group
        has its own timeout.

    Returns
    -------
    list
        The workers' return values in rank order; inside ``torchrun``, a list with
        this rank's value only.

    Raises
    ------
    TypeError
        ``devices`` is not a list, ``worker`` is not a picklable function,
        ``payload`` cannot be pickled for spawned workers, or either refers to a
        function or class of a main module that the workers cannot import.
    ValueError
        ``devices`` is empty or names something other than a CPU or an available GPU.
    RuntimeError
        A worker raised (the message holds its formatted traceback: ``"worker 1
        failed:\\n Traceback ..."``), or died without reporting (killed, crashed,
        ``os._exit``: the message names its rank and exit code).
    TimeoutError
        The workers did not all finish within ``timeout`` seconds.

    Notes
    -----
    Spawned workers use torch.multiprocessing's ``"spawn"`` start method (fresh
    interpreters: safe with CUDA and threads, and shared tensors travel as file
    descriptors).  Each CPU worker limits itself to ``cores // len(devices)``
    intra-op threads, so that workers do not oversubscribe the cores; a GPU worker
    calls ``torch.cuda.set_device`` before joining the group.  As with any spawned
    process, a script that calls ``run_distributed`` must do so under
    ``if __name__ == "__main__":`` (the workers import the script's module).  A main
    module without a file (a script piped on standard input, ``python -c``, an
    interactive session) is not imported by the workers: ``worker`` and ``payload``
    must then come from importable modules.

    Whatever happens (success, a failing worker, a timeout, ``KeyboardInterrupt``),
    no worker process outlives the call: workers still running are sent SIGTERM,
    then SIGKILL after a short grace period, and are joined; the store and the
    result channels are closed.  A Ctrl-C while a worker is being started takes
    effect once its ``start()`` returns, so that the cleanup knows that worker.  A
    spawned worker whose parent dies (SIGKILL) exits by itself within a second.

    Inside ``torchrun``, every rank must call ``run_distributed`` the same number of
    times in the same order (as for any collective): the n-th call gets the same
    fresh store prefix on every rank.  A worker raising there propagates its
    exception unchanged; the existing group is left initialised.

    Examples
    --------
    ``worker`` must live in an importable module, e.g. ``mymodule.py``::

        import torch
        import torch.distributed as dist

        def total(context, payload):
            value = torch.tensor([payload[context.rank]])
            dist.all_reduce(value)
            return value.item()

    then ``run_distributed(total, [1.0, 2.0], ["cpu", "cpu"])`` returns ``[3.0, 3.0]``.
    """
    if not dist.is_available():
        raise RuntimeError("run_distributed needs torch.distributed, which this build of torch lacks.")
    checked = _check_devices(devices)
    _check_worker(worker)
    timeout = _check_timeout(timeout)
    if dist.is_initialized():
        return [_run_joined(worker, payload, devices)]
    for i, device in enumerate(checked):
        if device.type != "cuda":
            continue
        if not torch.cuda.is_available():
            raise ValueError(f"devices[{i}] = {devices[i]!r}, but CUDA is not available.")
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"devices[{i}] = {devices[i]!r}, but only {torch.cuda.device_count()} GPUs are visible.")
    return _run_spawned(worker, payload, checked, resolve_backend(checked), timeout)


# ----------------------------------------------------------------------------------
# Joining an existing group (torchrun)


def _joined_device(devices, rank, world_size):
    """This rank's device inside an existing group.

    ``devices[rank]`` when ``devices`` has one entry per rank; otherwise (e.g. one
    entry per local GPU, or a single ``"cuda"``) the GPU of this node's local rank
    when ``devices`` are all GPUs, else the CPU.
    """
    checked = _check_devices(devices)
    if len(checked) == world_size:
        return checked[rank]
    if all(device.type == "cuda" for device in checked):
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _group_backend(device):
    """The default group's backend for tensors on ``device``."""
    backend = str(dist.get_backend())
    if ":" not in backend:
        return backend
    # A group built for several device types reports e.g. "cpu:gloo,cuda:nccl".
    mapping = dict(item.split(":", 1) for item in backend.split(","))
    return mapping.get(device.type, backend)


def _run_joined(worker, payload, devices):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = _joined_device(devices, rank, world_size)
    try:
        base_store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError) as exc:  # pragma: no cover - private API moved
        raise RuntimeError(f"cannot reach the store of the existing process group: {exc}") from exc
    store = dist.PrefixStore(f"skgpu_kernel/run_distributed/{next(_JOINED_CALLS)}/", base_store)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    context = WorkerContext(rank, world_size, device, _group_backend(device), store, spawned=False)
    return worker(context, payload)


# ----------------------------------------------------------------------------------
# Spawned workers: the child side


def _watch_parent(parent_pid):
    """Exit this process when its parent is gone (reparented: ``getppid`` changes).

    A parent killed by SIGKILL (or the OOM killer) runs no cleanup; without this
    watch its workers would wait in a collective until the group's timeout, or run
    a long worker loop to its end, holding cores, memory and GPUs.
    """
    while True:
        time.sleep(_ORPHAN_POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(ORPHAN_EXIT_CODE)


def _report(conn, message):
    try:
        conn.send_bytes(message)
    except OSError:
        pass  # the parent stopped listening (it is shutting the run down)


@dataclass(frozen=True)
class _SpawnedGroup:
    """What every spawned worker is told about its group and its work (picklable)."""

    world_size: int
    backend: str
    port: int
    timeout: float | None
    parent_pid: int
    worker: object
    payload: object


def _worker_main(rank, device, group, conn):
    """Body of spawned worker ``rank`` on ``device`` in ``group`` (module level: spawn imports it by name).

    Reports exactly one message on ``conn``: ``pickle.dumps(("ok", result))`` or
    ``pickle.dumps(("error", time.time(), traceback_text))``.  The message is sent
    before the group is torn down, so the parent learns of a failure before the
    other ranks notice the broken connections, and the time stamp lets it tell the
    first failure (the cause) from the failures it triggered.
    """
    watch = threading.Thread(target=_watch_parent, args=(group.parent_pid,), name="skgpu_kernel-orphan-watch")
    watch.daemon = True
    watch.start()
    try:
        if device.type == "cpu":
            # Every worker would otherwise start one intra-op thread per core of the
            # machine: n workers x all cores threads fight for the cores and each
            # collective waits for the slowest, descheduled one.
            torch.set_num_threads(_cpu_threads(group.world_size))
        else:
            # Before the group exists, so that NCCL binds this rank to its GPU (and
            # nothing allocates on cuda:0 by default).
            torch.cuda.set_device(device)
        group_timeout = _group_timeout(group.timeout)
        client = dist.TCPStore(
            _LOCALHOST, group.port, group.world_size, is_master=False, timeout=group_timeout or timedelta(minutes=10)
        )
        # device_id binds the NCCL communicator to this rank's GPU at once.
        options = {"device_id": device} if group.backend == "nccl" and _ACCEPTS_DEVICE_ID else {}
        dist.init_process_group(
            group.backend, store=client, rank=rank, world_size=group.world_size, timeout=group_timeout, **options
        )
        store = dist.PrefixStore(_SPAWNED_PREFIX, client)
        context = WorkerContext(rank, group.world_size, device, group.backend, store, True)
        result = group.worker(context, group.payload)
        # Pickled here (with the standard pickler: tensors by value) so that an
        # unpicklable result is reported as this worker's failure, and so that the
        # parent never depends on this process staying alive to map shared memory.
        message = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # KeyboardInterrupt and SystemExit are reported too
        message = pickle.dumps(("error", time.time(), traceback.format_exc()))
    try:
        _report(conn, message)
    finally:
        conn.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _interrupt_held_back():
    """Raise a Ctrl-C that arrives inside the block only once the block has ended.

    ``Process.start()`` learns its child's pid only when the child already runs with
    its work: a KeyboardInterrupt in between would lose the pid, and the cleanup could
    not stop that worker.  ``start()`` takes milliseconds (longer only while a large
    pickled payload is written to the child).  Python runs signal handlers in the
    main thread only, so elsewhere, and where SIGINT is ignored or left to the
    system, nothing is changed.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    received = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(*received[0])


def _start_workers(context, devices, group, processes, readers):
    """Start one worker per device, appending each process and its result channel as it goes.

    The caller's cleanup sees every worker that may have come to life, even when this
    is interrupted half-way.
    """
    with _workers_skip_unreadable_main():
        for rank, device in enumerate(devices):
            # One one-way pipe per worker for its single report: the parent can wait on
            # the pipes and the process sentinels at once, and a message is never left
            # half-written in a channel shared with a worker that was killed.
            reader, writer = context.Pipe(duplex=False)
            readers.append(reader)
            process = context.Process(
                target=_worker_main,
                args=(rank, device, group, writer),
                name=f"skgpu_kernel-worker-{rank}",
            )
            # Registered before it starts: the Ctrl-C held back during start() is
            # raised as start() returns, and a start() that fails after the child came
            # to life raises too; a worker not yet in the list would escape _shutdown,
            # and multiprocessing's exit handler would wait for it to finish on its own.
            processes.append(process)
            try:
                with _interrupt_held_back():
                    process.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                # The arguments are pickled before the child exists: nothing started.
                raise TypeError(
                    f"payload cannot be sent to the worker processes (it must be picklable): {exc}"
                ) from exc
            finally:
                # Only the child may hold the writing end: then a child that dies
                # leaves the pipe at end-of-file, which wakes the parent.
                writer.close()


def _run_spawned(worker, payload, devices, backend, timeout):
    _check_main_references((worker, payload))
    context = torch_mp.get_context("spawn")
    world_size = len(devices)
    deadline = None if timeout is None else time.monotonic() + timeout
    processes, readers = [], []
    store = None
    succeeded = False
    try:
        # The parent serves the store (a thread of this process); port 0 lets the OS
        # pick a free port, so concurrent runs and other programs never collide.
        store = dist.TCPStore(
            _LOCALHOST,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=_group_timeout(timeout) or timedelta(minutes=10),
        )
        group = _SpawnedGroup(world_size, backend, store.port, timeout, os.getpid(), worker, payload)
        _start_workers(context, devices, group, processes, readers)
        results = collect_results(processes, readers, deadline, timeout)
        succeeded = True
        return results
    finally:
        try:
            shutdown_workers(processes, readers, graceful=succeeded)
        finally:
            # Dropping the last reference to the master shuts its server down.
            del store


# ----------------------------------------------------------------------------------
# Shared memory


def share_for_workers(array):
    """Copy ``array`` once into shared memory, for workers spawned by :func:`run_distributed`.

    Parameters
    ----------
    array : array-like
        Numeric data (e.g. the training matrix), any layout, including memory maps.

    Returns
    -------
    torch.Tensor
        A C-contiguous CPU tensor in shared memory with the array's shape and dtype
        (in native byte order).  Placed in ``run_distributed``'s ``payload`` (at any
        depth), it reaches every spawned worker as a file descriptor: the workers map
        the same pages, without copying, and writes by any process are visible to all.

    Raises
    ------
    TypeError
        The dtype has no torch equivalent (strings, objects, unsigned ints that
        torch lacks).

    Notes
    -----
    torch's default sharing strategy on Linux, ``"file_descriptor"``, keeps the
    segment alive as long as one process (this one or a worker) holds a reference,
    and releases it when the last reference goes: there is no file to delete, even
    after a crash.  Each shared tensor holds one file descriptor open in each process
    that has it; share a few large tensors, not many small ones.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel.parallel.launch import share_for_workers
    >>> shared = share_for_workers(np.arange(6.0).reshape(2, 3))
    >>> shared.is_shared(), tuple(shared.shape)
    (True, (2, 3))
    """
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    try:
        dtype = torch.from_numpy(np.empty(0, dtype=native)).dtype
    except TypeError:
        raise TypeError(f"cannot share an array of dtype {array.dtype} with torch workers.") from None
    if array.flags.c_contiguous and array.dtype.isnative:
        with warnings.catch_warnings():
            # from_numpy warns about read-only arrays (memory maps opened with
            # mode="r"); nothing writes to them: share_memory_ copies the data into a
            # new shared segment and the tensor no longer refers to the array.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array).share_memory_()
    # Other layouts: allocate the shared tensor first and copy into it.  The fresh
    # allocation is never touched before share_memory_ moves it, so it costs no
    # physical memory.
    shared = torch.empty(array.shape, dtype=dtype).share_memory_()
    shared.numpy()[...] = array
    return shared
