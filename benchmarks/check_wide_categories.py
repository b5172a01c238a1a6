"""Check: a wide one-hot table (10 categories of 100 levels, 5 numeric columns, d = 1005) with feature learning.

Only ``x0`` and ``c0`` move the target; the noise variance is 0.09, the floor of the
test MSE.  Prints the default fit's seconds, the candidate feature learning kept,
the test MSE and the encoded width.  Run it with ``PYTHONPATH`` at another checkout
to compare code versions on the same table.

Usage::

    OPENBLAS_CORETYPE=Haswell python benchmarks/check_wide_categories.py
"""

import time

import numpy as np

N_ROWS, N_TRAIN = 20_000, 16_000


def wide_table(seed=0):
    """``(frame, y)``: 5 numeric columns, 10 categories of 100 levels; ``y = sin(x0) + effect(c0) + noise``."""
    import pandas as pd

    rng = np.random.RandomState(seed)
    frame = pd.DataFrame({f"x{k}": rng.randn(N_ROWS) for k in range(5)})
    for k in range(10):
        frame[f"c{k}"] = pd.Categorical(rng.randint(0, 100, N_ROWS).astype(str))
    effect = rng.randn(100)
    y = np.sin(frame["x0"].to_numpy()) + effect[frame["c0"].astype(int).to_numpy()] + 0.3 * rng.randn(N_ROWS)
    return frame, y


def main():
    from skgpu_kernel import AdaptiveKernelRegressor

    frame, y = wide_table()
    model = AdaptiveKernelRegressor(random_state=0)
    tic = time.perf_counter()
    model.fit(frame[:N_TRAIN], y[:N_TRAIN])
    seconds = time.perf_counter() - tic
    mse = float(np.mean((model.predict(frame[N_TRAIN:]) - y[N_TRAIN:]) ** 2))
    width = model.table_encoding_.n_features_out
    print(f"fit {seconds:.1f} s, candidate kept {model.feature_learning_iteration_}, test MSE {mse:.4f}, d {width}")


if __name__ == "__main__":
    main()
