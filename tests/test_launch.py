"""Tests of the process layer: spawned and joined groups, shared memory, failures and cleanup.

Spawned workers import this module by name (``tests.test_launch``) to find their
function, so the workers are module-level functions.  Every spawn costs a few
seconds (fresh interpreters import torch), hence few, small runs.
"""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from skgpu_kernel.parallel import launch, supervise
from skgpu_kernel.parallel.launch import WorkerContext, resolve_backend, run_distributed, share_for_workers

from ._processes import child_processes, session_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Upper bound on any one run in these tests: spawning two interpreters that import
# torch takes a few seconds here, more on a loaded machine.
BOUND_SECONDS = 60.0

CLAIMS_PER_WORKER = 5


# ----------------------------------------------------------------------------------
# Workers (module level: spawned processes import them)


def _sum_worker(context, payload):
    """all_reduce of rank + 1, atomic claims from the store, reads and writes of shared data."""
    value = torch.tensor([float(context.rank + 1)])
    dist.all_reduce(value)
    # Both ranks claim at the same time, so that the counter is really contended.
    dist.barrier()
    claims = [int(context.store.add("claims", 1)) for _ in range(payload["claims"])]
    data = payload.get("data")
    seen = None
    if data is not None:
        seen = data[0].tolist()
        data[2 + context.rank] = -(context.rank + 1.0)
    return {
        "rank": context.rank,
        "world_size": context.world_size,
        "sum": value.item(),
        "claims": claims,
        "seen": seen,
        "shared": None if data is None else bool(data.is_shared()),
        "backend": context.backend,
        "device": str(context.device),
        "spawned": context.spawned,
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def _fail_worker(context, payload):
    if context.rank == 1:
        raise ValueError("boom")
    dist.barrier()  # waits for rank 1, which never comes
    return context.rank


def _exit_worker(context, payload):
    if context.rank == 1:
        os._exit(3)
    dist.barrier()
    return context.rank


def _sleep_worker(context, payload):
    """Record this worker's pid in the directory ``payload``, then sleep."""
    if payload is not None:
        path = os.path.join(payload, f"{context.rank}.pid")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # readers never see a partial file
    time.sleep(60)


def _raise_worker(context, payload):
    raise ValueError("boom")


def _cuda_worker(context, payload):
    value = torch.ones(1, device=context.device) * (context.rank + 1)
    if context.backend == "gloo":
        value = value.cpu()
    dist.all_reduce(value)
    return value.item(), str(context.device), torch.cuda.current_device() if context.device.type == "cuda" else None


def _torchrun_like_main(index, port, out_dir):
    """One of two processes that form their own gloo group, as torchrun would, then call run_distributed."""
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=BOUND_SECONDS))
    dist.init_process_group("gloo", store=store, rank=index, world_size=2, timeout=timedelta(seconds=BOUND_SECONDS))
    try:
        # One device per rank, then fewer entries than ranks (each rank falls back to
        # the CPU); the second call must not see the first call's counter.
        first = run_distributed(_sum_worker, {"claims": 2}, ["cpu", "cpu"])
        second = run_distributed(_sum_worker, {"claims": 2}, ["cpu"])
        with open(os.path.join(out_dir, f"{index}.json"), "w") as handle:
            json.dump({"pid": os.getpid(), "first": first, "second": second}, handle)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------
# Helpers


def _alive(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _assert_no_workers_left():
    if os.path.isdir("/proc"):
        assert child_processes() == []


# ----------------------------------------------------------------------------------
# Spawned runs


@pytest.fixture(scope="module")
def sum_run():
    """One spawned run of two gloo workers, shared by the tests that inspect it."""
    data = share_for_workers(np.arange(12.0).reshape(4, 3))
    start = time.monotonic()
    results = run_distributed(_sum_worker, {"claims": CLAIMS_PER_WORKER, "data": data}, ["cpu", "cpu"], timeout=120)
    return results, data, time.monotonic() - start


def test_all_reduce_in_rank_order(sum_run):
    results, _, elapsed = sum_run
    assert [(r["rank"], r["world_size"], r["sum"]) for r in results] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert elapsed < BOUND_SECONDS
    for result in results:
        assert result["backend"] == "gloo"
        assert result["device"] == "cpu"
        assert result["spawned"] is True
        assert result["pid"] != os.getpid()
        # The cores are split between the workers.
        assert result["threads"] == launch._cpu_threads(2)
    assert results[0]["pid"] != results[1]["pid"]
    _assert_no_workers_left()


def test_store_add_is_an_atomic_counter(sum_run):
    results, _, _ = sum_run
    claims = [claim for result in results for claim in result["claims"]]
    assert sorted(claims) == list(range(1, 2 * CLAIMS_PER_WORKER + 1))
    for result in results:
        assert result["claims"] == sorted(result["claims"])


def test_shared_tensor_reaches_workers_without_copy(sum_run):
    results, data, _ = sum_run
    for result in results:
        assert result["shared"] is True
        assert result["seen"] == [0.0, 1.0, 2.0]
    # Each worker wrote its row into the shared pages: the parent sees the writes.
    np.testing.assert_array_equal(data[2:].numpy(), [[-1.0] * 3, [-2.0] * 3])
    np.testing.assert_array_equal(data[:2].numpy(), np.arange(6.0).reshape(2, 3))


def test_failing_worker_raises_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1 failed") as info:
        run_distributed(_fail_worker, None, ["cpu", "cpu"], timeout=BOUND_SECONDS)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "ValueError: boom" in message
    assert "Traceback" in message
    assert 'raise ValueError("boom")' in message
    # Rank 0 was blocked in a barrier: it was terminated, not waited for.
    assert elapsed < BOUND_SECONDS - 10
    _assert_no_workers_left()


def test_worker_dying_without_report():
    with pytest.raises(RuntimeError, match="worker 1 failed") as info:
        run_distributed(_exit_worker, None, ["cpu", "cpu"], timeout=BOUND_SECONDS)
    assert "exit code 3" in str(info.value)
    _assert_no_workers_left()


def test_timeout_terminates_workers():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout=3"):
        run_distributed(_sleep_worker, None, ["cpu", "cpu"], timeout=3)
    assert time.monotonic() - start < 3 + 2 * supervise.KILL_GRACE_SECONDS + 5
    _assert_no_workers_left()


# Makes the parent linger right after the second worker's start(), once that worker
# came to life: the moment a heavily loaded machine can stretch, where Ctrl-C once left
# a worker unknown to the cleanup (and the parent waiting for it at exit).  Inside
# start() a Ctrl-C is held back until start() returns (tested below), so the stretch
# follows it.
_SLOW_SECOND_START = """
import contextlib, time
from skgpu_kernel.parallel import launch
original_held_back, starts = launch._interrupt_held_back, []
@contextlib.contextmanager
def _held_back_then_slow():
    with original_held_back():
        yield
    starts.append(None)
    if len(starts) == 2:
        time.sleep(120)
launch._interrupt_held_back = _held_back_then_slow
"""


def _launch_sleeping_run(directory, prelude="", new_session=False):
    """A Python process that runs two sleeping workers (which write their pids to ``directory``)."""
    # Ctrl-C in a terminal raises KeyboardInterrupt; a shell started in the background
    # (nohup ... &, some CI runners) passes SIGINT on as ignored, so restore Python's handler.
    script = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + prelude
    script += textwrap.dedent(
        f"""
        from skgpu_kernel.parallel.launch import run_distributed
        from tests.test_launch import _sleep_worker
        run_distributed(_sleep_worker, {str(directory)!r}, ["cpu", "cpu"], timeout=300)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def _worker_pids(process, directory):
    """The pids that the two workers of ``process`` wrote to ``directory``, once both did."""
    paths = [directory / f"{rank}.pid" for rank in range(2)]
    deadline = time.monotonic() + BOUND_SECONDS
    try:
        while not all(path.exists() for path in paths):
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return [int(path.read_text()) for path in paths]


def _start_sleeping_run(directory, prelude=""):
    """A Python process running two sleeping workers, and the workers' pids once they run."""
    process = _launch_sleeping_run(directory, prelude)
    pids = _worker_pids(process, directory)
    assert all(_alive(pid) for pid in pids)
    return process, pids


@pytest.mark.parametrize("prelude", ["", _SLOW_SECOND_START], ids=["running", "while-starting"])
def test_keyboard_interrupt_stops_workers(tmp_path, prelude):
    process, pids = _start_sleeping_run(tmp_path, prelude)
    try:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=BOUND_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode != 0
    assert "KeyboardInterrupt" in stderr
    # Terminated and reaped by the interrupted process before it exited.
    assert not any(_alive(pid) for pid in pids)


# A helper thread of the parent takes the SIGINT once both workers run, as the kernel
# may choose any thread of a process for a signal sent to it (here the store's or
# torch's): Python's handler then only sets a flag, and the main thread's wait for
# its workers is not interrupted (the rare 20 s hang of the random-moments test).
_INTERRUPT_ON_ANOTHER_THREAD = """
import os, threading, time
def _interrupt_this_thread_once_workers_run(directory={directory!r}):
    while sum(name.endswith(".pid") for name in os.listdir(directory)) < 2:
        time.sleep(0.05)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
threading.Thread(target=_interrupt_this_thread_once_workers_run, daemon=True).start()
"""


def test_keyboard_interrupt_taken_by_another_thread_stops_workers(tmp_path):
    process = _launch_sleeping_run(tmp_path, _INTERRUPT_ON_ANOTHER_THREAD.format(directory=str(tmp_path)))
    try:
        pids = _worker_pids(process, tmp_path)  # the interrupt follows at once
        # The workers sleep 60 s: a parent that waits for them misses this bound.
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "KeyboardInterrupt" in stderr
    assert not any(_alive(pid) for pid in pids)


# Ctrl-C inside the second worker's start(), after that worker received its work but
# before multiprocessing gave its Process object the pid: without care the cleanup
# does not know the worker, which runs on until it notices its parent is gone.
_INTERRUPT_INSIDE_SECOND_START = """
from multiprocessing import popen_spawn_posix
original_launch, launched = popen_spawn_posix.Popen._launch, []
def _launch(self, process_obj):
    original_launch(self, process_obj)
    launched.append(self)
    if len(launched) == 2:
        signal.raise_signal(signal.SIGINT)
popen_spawn_posix.Popen._launch = _launch
"""


def test_keyboard_interrupt_inside_start_leaves_no_worker(tmp_path):
    process = _launch_sleeping_run(tmp_path, _INTERRUPT_INSIDE_SECOND_START, new_session=True)
    try:
        process.wait(timeout=BOUND_SECONDS)
        # At the parent's exit: its workers were stopped and reaped before it ended.
        left = session_processes(process.pid)
        _, stderr = process.communicate(timeout=BOUND_SECONDS)
    finally:
        if process.poll() is None or session_processes(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert "KeyboardInterrupt" in stderr
    assert left == []


@pytest.mark.slow
def test_keyboard_interrupt_at_random_moments_under_load(tmp_path):
    # Ctrl-C while Python imports, while the store starts, while workers spawn, while
    # they run: the fit ends within seconds every time and leaves no process behind.
    # A terminal sends SIGINT to the whole process group (workers included); `kill -INT`
    # to the parent alone.  Two busy processes load the cores, as other jobs would.
    moments = random.Random(0)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for run in range(12):
            directory = tmp_path / str(run)
            directory.mkdir()
            process = _launch_sleeping_run(directory, new_session=True)
            time.sleep(moments.uniform(0.2, 12.0))
            started = sorted(path.name for path in directory.iterdir())
            if run % 2:
                process.send_signal(signal.SIGINT)
            else:
                os.killpg(process.pid, signal.SIGINT)
            try:
                _, stderr = process.communicate(timeout=20)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.communicate()
            assert "KeyboardInterrupt" in stderr, (run, started, stderr[-2000:])
            # A worker interrupted before the parent registered it (inside start()) ends
            # by itself once its parent is gone: allow the orphan watch's delay.
            deadline = time.monotonic() + 2 * launch._ORPHAN_POLL_SECONDS + 1
            while session_processes(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not session_processes(process.pid), (run, started)
    finally:
        for busy in load:
            busy.kill()
            busy.wait()


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    process, pids = _start_sleeping_run(tmp_path)
    process.kill()  # no cleanup runs in the parent
    process.communicate()
    deadline = time.monotonic() + 5 * launch._ORPHAN_POLL_SECONDS + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_unpicklable_payload():
    with pytest.raises(TypeError, match="payload cannot be sent"):
        run_distributed(_raise_worker, {"f": lambda: None}, ["cpu", "cpu"])
    _assert_no_workers_left()


# ----------------------------------------------------------------------------------
# Main modules that spawned workers cannot import

# A parallel fit as a user writes it in a script: definitions, then the fit, which
# prints the coefficients (bitwise) and whether __main__.__file__ is as before the fit.
_SCRIPT_DEFINITIONS = """
import sys
import numpy as np
from skgpu_kernel import BufferedSGDRegressor
from skgpu_kernel.parallel import DataParallel
from skgpu_kernel.scaling import ConstantRule

class MyRule(ConstantRule):
    pass
"""
_SCRIPT_FIT = """
file_before = getattr(sys.modules["__main__"], "__file__", None)
rng = np.random.default_rng(0)
X = rng.normal(size=(600, 4))
y = X @ np.arange(1.0, 5.0) + 0.1 * rng.normal(size=600)
rule = MyRule() if "main-rule" in sys.argv else ConstantRule()
model = BufferedSGDRegressor(parallel=DataParallel(n_workers=2), scaling_rule=rule, n_epochs=2, random_state=0)
model.fit(X, y)
print(model.coef_.tobytes().hex(), getattr(sys.modules["__main__"], "__file__", None) == file_before)
"""


def _run_script(how, *args, tmp_path):
    """Run the parallel fit script piped on stdin, as ``python -c``, or from a file."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    options = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 4 * BOUND_SECONDS}
    if how == "stdin":
        return subprocess.run([sys.executable, "-", *args], input=_SCRIPT_DEFINITIONS + _SCRIPT_FIT, **options)
    if how == "-c":
        return subprocess.run([sys.executable, "-c", _SCRIPT_DEFINITIONS + _SCRIPT_FIT, *args], **options)
    # A file needs the guard: the workers run it again, as __mp_main__.
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT_DEFINITIONS + "if __name__ == '__main__':\n" + textwrap.indent(_SCRIPT_FIT, "    "))
    return subprocess.run([sys.executable, str(script), *args], **options)


@pytest.fixture(scope="module")
def coefficients_from_a_file(tmp_path_factory):
    completed = _run_script("file", tmp_path=tmp_path_factory.mktemp("file"))
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.split()[0]


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_parallel_fit_from_a_script_without_a_file(how, tmp_path, coefficients_from_a_file):
    # Spawned workers would run the main module's file again: "<stdin>" is none.
    completed = _run_script(how, tmp_path=tmp_path)
    assert completed.returncode == 0, completed.stderr
    coefficients, file_restored = completed.stdout.split()
    assert coefficients == coefficients_from_a_file
    assert file_restored == "True"


@pytest.mark.parametrize(("how", "source"), [("stdin", "standard input"), ("-c", "a `python -c` command")])
def test_objects_of_an_unimportable_main_module_fail_at_once(how, source, tmp_path):
    completed = _run_script(how, "main-rule", tmp_path=tmp_path)
    assert completed.returncode != 0
    error = completed.stderr.strip().splitlines()[-1]
    assert error.startswith("TypeError: the worker processes need MyRule, defined in the main module"), error
    assert f"it was read from {source}" in error
    assert "python script.py" in error  # what to do
    assert "worker 0 failed" not in completed.stderr  # raised before any worker started


def test_objects_of_a_main_script_file_reach_the_workers(tmp_path, coefficients_from_a_file):
    # From a file, the workers run the script (as __mp_main__) and find MyRule in it.
    completed = _run_script("file", "main-rule", tmp_path=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split()[0] == coefficients_from_a_file  # MyRule is a ConstantRule


# ----------------------------------------------------------------------------------
# Joining an existing group


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_existing_group_runs_in_this_process(one_rank_group):
    first = run_distributed(_sum_worker, {"claims": 3}, ["cpu"])
    second = run_distributed(_sum_worker, {"claims": 3}, ["cpu"])
    assert len(first) == 1
    result = first[0]
    assert result["pid"] == os.getpid()
    assert result["spawned"] is False
    assert (result["rank"], result["world_size"], result["sum"], result["backend"]) == (0, 1, 1.0, "gloo")
    # Each call gets a fresh store prefix: no stale counter.
    assert first[0]["claims"] == second[0]["claims"] == [1, 2, 3]
    # The worker's exception propagates unchanged.
    with pytest.raises(ValueError, match="boom"):
        run_distributed(_raise_worker, None, ["cpu"])
    assert dist.is_initialized()
    _assert_no_workers_left()


def test_existing_two_process_group(tmp_path):
    # The equivalent of `torchrun --nproc-per-node 2`: two processes form a group,
    # then each calls run_distributed, which must use that group, not spawn.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        torch_mp.spawn(_torchrun_like_main, args=(store.port, str(tmp_path)), nprocs=2, join=True)
    finally:
        del store
    for rank in range(2):
        report = json.loads((tmp_path / f"{rank}.json").read_text())
        for name in ("first", "second"):
            assert len(report[name]) == 1
            result = report[name][0]
            assert (result["rank"], result["world_size"], result["sum"]) == (rank, 2, 3.0)
            assert result["pid"] == report["pid"]
            assert result["spawned"] is False
            assert result["device"] == "cpu"
    reports = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    for name in ("first", "second"):
        claims = [claim for report in reports for claim in report[name][0]["claims"]]
        assert sorted(claims) == [1, 2, 3, 4]
    _assert_no_workers_left()


def test_joined_device():
    assert launch._joined_device(["cuda:0", "cuda:1"], 1, 2) == torch.device("cuda", 1)
    assert launch._joined_device(["cpu", "cuda:0"], 1, 2) == torch.device("cuda", 0)
    assert launch._joined_device(["cpu"], 1, 2) == torch.device("cpu")
    assert launch._joined_device(["cuda:0", "cpu"], 3, 4) == torch.device("cpu")


def test_joined_device_uses_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launch._joined_device(["cuda"], 5, 8) == torch.device("cuda", 1)


# ----------------------------------------------------------------------------------
# Validation, backend choice, shared memory


@pytest.mark.parametrize(
    ("devices", "error", "match"),
    [
        ([], ValueError, "at least one device"),
        ("cpu", TypeError, "must be a list"),
        (None, TypeError, "must be a list"),
        ([0], TypeError, r"devices\[0\]"),
        (["cpu", "tpu"], ValueError, r"devices\[1\]"),
        (["mps"], ValueError, "'cpu' or 'cuda'"),
    ],
)
def test_invalid_devices(devices, error, match):
    start = time.monotonic()
    with pytest.raises(error, match=match):
        run_distributed(_raise_worker, None, devices)
    assert time.monotonic() - start < 1  # nothing was spawned
    _assert_no_workers_left()


def _local_worker():
    def worker(context, payload):
        return None

    return worker


@pytest.mark.parametrize("worker", [lambda context, payload: None, _local_worker(), "not callable"])
def test_unpicklable_worker(worker):
    with pytest.raises(TypeError, match="worker must be"):
        run_distributed(worker, None, ["cpu", "cpu"])
    _assert_no_workers_left()


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf")])
def test_invalid_timeout(timeout):
    with pytest.raises((TypeError, ValueError), match="timeout"):
        run_distributed(_raise_worker, None, ["cpu"], timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_device_without_cuda():
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_distributed(_raise_worker, None, ["cuda:0"])


def test_resolve_backend(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert resolve_backend(["cuda:0", "cuda:1"]) == "nccl"
    assert resolve_backend([torch.device("cuda", 0)]) == "nccl"
    assert resolve_backend(["cuda:0", "cpu"]) == "gloo"
    assert resolve_backend(["cpu", "cpu"]) == "gloo"
    # Two ranks on one GPU: NCCL refuses them.
    assert resolve_backend(["cuda", "cuda:0"]) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert resolve_backend(["cuda:0", "cuda:1"]) == "gloo"


def test_worker_context_fields():
    context = WorkerContext(0, 1, torch.device("cpu"), "gloo", dist.HashStore(), spawned=True)
    assert context.store.add("n", 2) == 2
    assert (context.rank, context.world_size, context.backend, context.spawned) == (0, 1, "gloo", True)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12.0).reshape(3, 4),
        np.arange(12.0).reshape(3, 4)[:, ::2],  # not contiguous
        np.arange(12, dtype=">f4").reshape(3, 4),  # big-endian
        np.arange(6, dtype=np.int64),
        np.zeros((0, 3), dtype=np.float32),
    ],
)
def test_share_for_workers_copies_into_shared_memory(array):
    original = array.copy()
    shared = share_for_workers(array)
    assert shared.is_shared()
    assert shared.is_contiguous()
    assert tuple(shared.shape) == array.shape
    np.testing.assert_array_equal(shared.numpy(), original)
    if shared.numel():
        shared.view(-1)[0] = 99
        # A copy: the caller's array is untouched.
        np.testing.assert_array_equal(array, original)


def test_share_for_workers_read_only_memmap(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(10.0).reshape(5, 2))
    mapped = np.load(path, mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "array is not writable" warning from torch
        shared = share_for_workers(mapped)
    assert shared.is_shared()
    np.testing.assert_array_equal(shared.numpy(), np.arange(10.0).reshape(5, 2))


def test_share_for_workers_rejects_objects():
    with pytest.raises(TypeError, match="cannot share"):
        share_for_workers(np.array(["a", "b"]))


# ----------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_cuda_workers():
    results = run_distributed(_cuda_worker, None, ["cuda:0"], timeout=BOUND_SECONDS)
    assert results == [(1.0, "cuda:0", 0)]
    # A mixed group talks over gloo; the GPU rank's current device was set.
    results = run_distributed(_cuda_worker, None, ["cpu", "cuda:0"], timeout=BOUND_SECONDS)
    assert results == [(3.0, "cpu", None), (3.0, "cuda:0", 0)]
