"""Helpers shared by the benchmark scripts: child processes, machine reports, memory, means and standard errors."""

import argparse
import multiprocessing
import os
import platform
import queue as queue_module
import resource
import signal

import numpy as np
import torch


def peak_rss_gb():
    """Peak resident memory of this process in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _child(target, args, queue):
    try:
        queue.put(("ok", target(*args)))
    except Exception as error:  # reported, not hidden
        queue.put(("error", f"{type(error).__name__}: {error}"))


# How often the parent checks that its child is still alive while it waits for the result.
_CHILD_POLL_SECONDS = 5.0


def in_child(target, *args):
    """Run ``target(*args)`` in a fresh spawned process (its own peak memory) and return its result.

    Raises RuntimeError with the child's error, or with its exit code where it died
    without a result (killed by the out-of-memory killer, say): the parent never waits
    for a result that cannot come.
    """
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(target, args, queue))
    process.start()
    status, payload = _result_of(process, queue)
    process.join()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def _result_of(process, queue):
    """The child's ``(status, payload)``; ``("died", why)`` where it exited without putting one."""
    while True:
        try:
            return queue.get(timeout=_CHILD_POLL_SECONDS)
        except queue_module.Empty:
            if process.is_alive():
                continue
        try:  # a result put just before the exit is still in the pipe
            return queue.get(timeout=_CHILD_POLL_SECONDS)
        except queue_module.Empty:
            process.join()
            return "died", _death(process.exitcode)


def _death(exitcode):
    """Why a child gave no result, from its exit code."""
    if exitcode == -signal.SIGKILL:
        return "the child process was killed (SIGKILL: on Linux, often the out-of-memory killer; see dmesg)"
    return f"the child process exited without a result (exit code {exitcode})"


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


def measurement_arguments(doc):
    """``--datasets`` and ``--splits`` of a seeded-split measurement script, after printing the machine."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--splits", type=int, default=5)
    args = parser.parse_args()
    print(machine_description("cpu"))
    print()
    return args


def table_header(columns):
    """A markdown table's two header lines: the first column left-aligned, the others right-aligned."""
    return ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]


def print_table_header(columns):
    """Print :func:`table_header`'s lines."""
    print("\n".join(table_header(columns)))


def mean_and_standard_error(values):
    """``(mean, standard error)`` of ``values`` (NaN error for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
    return values.mean(), se


class FitCheckClock:
    """The seconds a fit spends in the package's last checks (issue 62), every one of its fits counted.

    A context manager that wraps ``check_fit`` where the driver and the direct model
    call it; on a package without it (an older checkout), it counts nothing.
    """

    _MODULES = ("skgpu_kernel.fit.solve",)

    def __enter__(self):
        import importlib
        import time

        self.seconds, self.count, self._restore = 0.0, 0, []
        for name in self._MODULES:
            module = importlib.import_module(name)
            original = getattr(module, "check_fit", None)
            if original is None:
                continue

            def timed(*args, _original=original, **kwargs):
                tic = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - tic
                    self.count += 1

            module.check_fit = timed
            self._restore.append((module, original))
        return self

    def __exit__(self, *exc):
        for module, original in self._restore:
            module.check_fit = original
        return False

    def describe(self, fit_seconds):
        """``"last checks: 3 in 0.012 s (0.4% of the fit)"``."""
        share = self.seconds / max(fit_seconds, 1e-9)
        return f"last checks: {self.count} in {self.seconds:.3g} s ({share:.1%} of the fit)"


def margin_over_trivial(task, y_train, y_test, predicted):
    """The trivial model's test error less the model's, paired row by row, with its standard error.

    The trivial model is the training rows' majority class (classification: the
    misclassification rate) or their mean (regression: the squared error).
    Positive: the model is better than predicting without ``X``.
    """
    y_train, y_test, predicted = np.asarray(y_train), np.asarray(y_test), np.asarray(predicted)
    if task == "regression":
        trivial = np.square(y_test - np.mean(y_train))
        model = np.square(y_test - predicted)
    else:
        values, counts = np.unique(y_train, return_counts=True)
        trivial = (y_test != values[np.argmax(counts)]).astype(np.float64)
        model = (y_test != predicted).astype(np.float64)
    margin, standard_error = mean_and_standard_error(trivial - model)
    return {"margin": float(margin), "standard_error": float(standard_error)}


def describe_margin(margin, check):
    """``"+0.0123 ± 0.0021; own check: held-out misclassification +0.011 ± 0.003"`` for a benchmark's column.

    ``margin``: :func:`margin_over_trivial`'s dict; ``check``: the fitted model's
    ``fit_check_`` (None where the package has none or the check did not run).
    """
    text = f"{margin['margin']:+.4g} ± {margin['standard_error']:.2g}"
    if check:
        where = "held-out" if check.get("held_out") else "training"
        own = check["trivial_loss"] - check["model_loss"]
        score = check.get("score", "squared error")
        text += f"; own check: {where} {score} {own:+.4g} ± {check['standard_error']:.2g}"
    return text
