"""Throughput probes measured once per machine and shared by every process on it.

A probe times a step for a few batch sizes, and timings on a shared machine are
noisy: two processes that probe for themselves can pick different batches and so
train different models from the same seed.  Like FFTW's "wisdom" or Triton's
autotuning cache, the first measurement for a device, a torch version and an
operation is stored in a small JSON file, under an exclusive file lock, and later
fits read it back, so that fits on one machine do not depend on what else was
running when they started.

The file is ``$SKGPU_KERNEL_PROBE_DIR/throughput_probes.json`` (by default under
``$XDG_CACHE_HOME/skgpu_kernel`` or ``~/.cache/skgpu_kernel``).  Setting
``SKGPU_KERNEL_PROBE_DIR`` to an empty string keeps measurements in the process
only.  Deleting the file makes the next fit measure again.
"""

import contextlib
import json
import os
import platform
import tempfile

import torch

try:  # POSIX; elsewhere the store is used without a lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["device_identity", "locked_probe_store", "probe_store_path"]

_FILE_NAME = "throughput_probes.json"


def probe_store_path():
    """Path of the machine's probe file, or None when persistence is switched off."""
    directory = os.environ.get("SKGPU_KERNEL_PROBE_DIR")
    if directory == "":
        return None
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "skgpu_kernel")
    return os.path.join(directory, _FILE_NAME)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_identity(device):
    """What a measured throughput depends on besides the operation: hardware, threads, torch."""
    if device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = f"{_cpu_model()} x{os.cpu_count()}, {torch.get_num_threads()} threads"
    return f"{device.type}: {hardware}; torch {torch.__version__}"


def _read(path):
    try:
        with open(path) as stored:
            records = json.load(stored)
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _write(path, records):
    # Written next to the file and renamed over it: a reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".probes-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as stored:
            json.dump(records, stored, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


@contextlib.contextmanager
def locked_probe_store():
    """The machine's stored probes as a dict, held under an exclusive lock; changes are saved.

    Yields None when there is no store (switched off, or the directory cannot be
    created): the caller then measures for this process only.
    """
    path = probe_store_path()
    lock = None
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            lock = open(path + ".lock", "a")  # held across the yield
        except OSError:
            path = None
    if path is None:
        yield None
        return
    try:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        records = _read(path)
        before = json.dumps(records, sort_keys=True)
        yield records
        if json.dumps(records, sort_keys=True) != before:
            _write(path, records)
    finally:
        lock.close()  # closing releases the lock
