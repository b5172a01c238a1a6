"""Helpers shared by the benchmark scripts: child processes, machine and memory reports."""

import multiprocessing
import os
import platform
import resource

import torch


def peak_rss_gb():
    """Peak resident memory of this process in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _child(target, args, queue):
    try:
        queue.put(("ok", target(*args)))
    except Exception as error:  # reported, not hidden
        queue.put(("error", f"{type(error).__name__}: {error}"))


def in_child(target, *args):
    """Run ``target(*args)`` in a fresh spawned process (its own peak memory) and return its result."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(target, args, queue))
    process.start()
    status, payload = queue.get()
    process.join()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def machine_description(device):
    """CPU model, cores, torch version and threads, and the GPU when used."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if torch.cuda.is_available() and device != "cpu":
        text += f", GPU {torch.cuda.get_device_name()}"
    return text


def append_section(path, text):
    """Append a results section to the markdown file at ``path``."""
    with open(path, "a") as results:
        results.write("\n" + text + "\n")


def publish(text, path=None):
    """Print a results section after a blank line, and append it to the markdown file ``path`` when given."""
    print()
    print(text)
    if path:
        append_section(path, text)


def matmul_peak_gflops(device):
    """torch.mm GFLOP/s on large square float32 products: the device's matmul throughput."""
    from skgpu_kernel.device import matmul_gflops

    device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else device.replace("auto", "cpu"))
    size = 4096 if device.type == "cuda" else 2048
    return matmul_gflops(device, torch.float32, size, size, size)
