"""Same data, parameters and seed on one machine: bitwise the same model in another process."""

import os
import subprocess
import sys
import textwrap

import pytest

# Fits whose batch comes from the throughput probe (the kernel matrix is not cached),
# for the kernel machine and for BMGD.  Prints each model's batch and a digest of its
# predictions.  The kernel machine's bandwidth, solver, subsample and no feature
# learning are given: the default fit's eigendecompositions (bandwidth search, learning
# path) are not what this checks, and under this load (three processes' threads on two
# cores, each spinning while it waits) one eigh of 1500 x 1500 took 0.5 to 11 s against
# 0.22 s alone, so that the default fit took 75 to 135 s here and over 240 s on CI.
# As given, both processes see the probe's batch (512 or 1024 from one run to the
# next); with SKGPU_KERNEL_PROBE_DIR="" (each process measures) 1 run in 6 differed.
_FIT = textwrap.dedent(
    """
    import hashlib
    import numpy as np
    from skgpu_kernel import AdaptiveKernelRegressor, BufferedSGDRegressor

    rng = np.random.RandomState(0)
    X = rng.randn(4000, 20).astype(np.float32)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(4000)
    for model in (
        AdaptiveKernelRegressor(
            solver="eigenpro",
            bandwidth=3.0,
            feature_learning=None,
            subsample_size=500,
            cache_kernel=False,
            n_epochs=1,
            random_state=0,
        ),
        BufferedSGDRegressor(n_epochs=1, random_state=0),
    ):
        predictions = np.ascontiguousarray(model.fit(X, y).predict(X[:500]))
        print(type(model).__name__, model.batch_size_, hashlib.sha256(predictions.tobytes()).hexdigest())
    """
)

# Keeps both cores busy while the fits probe: the timings the probe sees are noisy.
_LOAD = "import numpy as np\na = np.random.rand(400, 400)\nwhile True:\n    a = np.tanh(a @ a)\n"


@pytest.mark.slow
def test_two_processes_fit_the_same_model_while_the_machine_is_loaded(tmp_path):
    env = dict(os.environ, SKGPU_KERNEL_PROBE_DIR=str(tmp_path), OPENBLAS_CORETYPE="Haswell")
    load = subprocess.Popen([sys.executable, "-c", _LOAD], env=dict(env, OPENBLAS_NUM_THREADS="2"))
    try:
        # Started together: both find no stored probe, one measures, the other waits and reads.
        fits = [
            subprocess.Popen([sys.executable, "-c", _FIT], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
        ]
        outputs = [fit.communicate(timeout=240)[0] for fit in fits]
    finally:
        load.kill()
        load.wait()
    assert all(fit.returncode == 0 for fit in fits), outputs
    assert len(outputs[0].splitlines()) == 2
    assert outputs[0] == outputs[1]
    assert (tmp_path / "throughput_probes.json").exists()
