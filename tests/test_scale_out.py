"""Scale-out as users do it: two torchrun "nodes" on this machine, and a grid search on a dask cluster.

What "equal" means here.  Every fit below is deterministic given its seed, its
data and the number of intra-op threads of each process: torch's float
reductions (matrix products, the eigensolver) split their sums by thread, so one
thread and two threads differ in the last bits (measured: 4e-11 relative on the
EigenPro 3 predictions, about 1e-3 on a float32 cross-validation score whose
throughput probe then picks another batch).  So every process here runs one
intra-op thread, the in-process references included, and the results are compared
bitwise, except for EigenPro 3 against the unsharded model: summing the kernel
product over two shards of the centers rounds differently than one product, so
that comparison has a tolerance (the sharded in-process model is the bitwise one).
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV, KFold

from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor
from skgpu_kernel.scaling import ConstantRule

from ._scale_out_fit import estimator, fitted_arrays

FIT_SCRIPT = Path(__file__).with_name("_scale_out_fit.py")
# Both torchrun runs together: two rendezvous, two fits each (about 25 s on 2 cores).
TORCHRUN_TIMEOUT = 240


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _one_thread():
    """This process's torch on one intra-op thread, as the torchrun ranks and the workers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _problem(seed=1, n=2000, d=5):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X @ rng.randn(d)) + 0.1 * rng.randn(n)
    return X, y, rng.randn(300, d)


def _torchrun_command(port, kind, data, out):
    """What a user types on each of the two nodes (here both on 127.0.0.1)."""
    launcher = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` entry point
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", "127.0.0.1"]
    return [*launcher, "--nnodes", "2", "--nproc-per-node", "1", *rendezvous, str(FIT_SCRIPT), kind, data, out]


def _run_two_nodes(kind, data, out):
    """Start both "nodes" and wait for them, killing both after TORCHRUN_TIMEOUT seconds."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = _free_port()
    nodes = [
        subprocess.Popen(
            _torchrun_command(port, kind, str(data), str(out)),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own: the timeout kills the agent and its worker
        )
        for _ in range(2)
    ]
    logs = []
    try:
        for node in nodes:
            logs.append(node.communicate(timeout=TORCHRUN_TIMEOUT)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun {kind} did not finish within {TORCHRUN_TIMEOUT} s")
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(2)]


@pytest.fixture(scope="module")
def problem_file(tmp_path_factory):
    X, y, X_test = _problem()
    path = tmp_path_factory.mktemp("scale_out") / "data.npz"
    np.savez(path, X=X, y=y, X_test=X_test)
    return path


def _two_node_fit(kind, problem_file, tmp_path):
    ranks = _run_two_nodes(kind, problem_file, tmp_path)
    for key in ranks[0]:
        np.testing.assert_array_equal(ranks[1][key], ranks[0][key], err_msg=key)  # every rank holds the model
    return ranks[0]


@pytest.mark.slow
def test_two_torchrun_nodes_train_the_single_process_sharded_eigenpro3_model(problem_file, tmp_path):
    got = _two_node_fit("eigenpro3", problem_file, tmp_path)
    X, y, X_test = _problem()
    with _one_thread():
        # The same two shards of the centers, on two "devices" of one process: the
        # all-reduce of two partial sums is the in-process sum, bit for bit.
        two_shards = estimator("eigenpro3", distributed=False).set_params(device=["cpu", "cpu"]).fit(X, y)
        unsharded = estimator("eigenpro3", distributed=False).set_params(device="cpu").fit(X, y)
    np.testing.assert_array_equal(got["predictions"], two_shards.predict(X_test))
    expected = unsharded.predict(X_test)
    assert not np.array_equal(got["predictions"], expected)  # the rounding the tolerance is for
    np.testing.assert_allclose(got["predictions"], expected, rtol=0, atol=1e-10 * np.abs(expected).max())


@pytest.mark.slow
def test_two_torchrun_nodes_train_the_spawned_parle_model(problem_file, tmp_path):
    got = _two_node_fit("parle", problem_file, tmp_path)
    X, y, X_test = _problem()
    with _one_thread():  # the parent plans the run (learning rate) before spawning the workers
        spawned = estimator("parle", distributed=False).fit(X, y)
    assert spawned.n_workers_ == 2
    expected = fitted_arrays(spawned, X_test)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def _searches():
    """Two searches over our estimators: a kernel model's grid, and a scaling rule's learning rate."""
    cv = KFold(3, shuffle=True, random_state=0)
    kernel = AdaptiveKernelRegressor(n_epochs=3, early_stopping=False, random_state=0)
    sgd = BufferedSGDRegressor(scaling_rule=ConstantRule(), n_epochs=3, tol=None, random_state=0)
    return [
        GridSearchCV(kernel, {"bandwidth": [1.0, 3.0], "alpha": [0.0, 1e-3]}, cv=cv, n_jobs=2),
        GridSearchCV(sgd, {"scaling_rule__base_lr": [1e-3, 1e-2, 1e-1]}, cv=cv, n_jobs=2),
    ]


@pytest.mark.slow
def test_grid_search_on_a_dask_cluster_equals_the_local_search():
    distributed = pytest.importorskip("distributed")  # the test extra has it; a bare GPU image may not
    rng = np.random.RandomState(0)
    X = rng.randn(600, 5)
    y = np.sin(X @ rng.randn(5)) + X[:, 0] + 0.1 * rng.randn(600)
    # loky's workers, like the dask workers below, run one intra-op thread each.
    with joblib.parallel_backend("loky", inner_max_num_threads=1):
        local = [search.fit(X, y) for search in _searches()]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client, joblib.parallel_backend("dask"):
            assert sorted(client.run(torch.get_num_threads).values()) == [1, 1]
            on_cluster = [search.fit(X, y) for search in _searches()]
    for searched, reference in zip(on_cluster, local, strict=True):
        assert searched.best_params_ == reference.best_params_
        np.testing.assert_array_equal(searched.cv_results_["mean_test_score"], reference.cv_results_["mean_test_score"])
    # The searches chose something: the scores differ across the grid.
    assert local[0].best_params_ == {"alpha": 0.001, "bandwidth": 1.0}
    assert np.ptp(local[1].cv_results_["mean_test_score"]) > 0.05
