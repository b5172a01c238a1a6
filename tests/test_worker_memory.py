"""Parallel workers that run out of device memory take their gradients in pieces and go on.

A worker cannot halve its batch alone (its steps are in step with the other
workers'), so it keeps the batch and sums the gradients of smaller row pieces.
The workers run here in this process, as one rank of a single-rank gloo group
(how ``torchrun`` runs them), so that the out-of-memory error can be simulated.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from skgpu_kernel import BufferedSGDRegressor
from skgpu_kernel.parallel import AdaptiveSGD, DataParallel, Parle
from skgpu_kernel.solvers import sgd as sgd_solver
from skgpu_kernel.solvers.losses import make_loss
from skgpu_kernel.solvers.sgd import GradientPieces, batch_gradient

PIECE_ROWS = 16


def _out_of_memory_above(monkeypatch, rows, seen):
    """Every gradient of more than ``rows`` rows fails as a device out of memory would; ``seen`` gets the sizes."""
    real = sgd_solver.batch_gradient

    def gradient(loss, coef, intercept, X, *args):
        seen.append(X.shape[0])
        if X.shape[0] > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(loss, coef, intercept, X, *args)

    monkeypatch.setattr(sgd_solver, "batch_gradient", gradient)


def test_gradient_pieces_sum_to_the_batch_gradient(monkeypatch):
    rng = np.random.RandomState(0)
    X, Y = torch.as_tensor(rng.randn(100, 5)), torch.as_tensor(rng.randn(100, 2))
    coef, intercept = torch.as_tensor(rng.randn(5, 2)), torch.zeros(2, dtype=torch.float64)
    loss = make_loss("squared_error", 2)
    whole = batch_gradient(loss, coef, intercept, X, Y)
    pieces = GradientPieces(loss)
    assert all(torch.equal(a, b) for a, b in zip(pieces(coef, intercept, (X, Y, None)), whole, strict=True))
    seen, lines = [], []
    _out_of_memory_above(monkeypatch, 30, seen)
    pieces = GradientPieces(loss, log=lines.append)
    summed = pieces(coef, intercept, (X, Y, None))
    for a, b in zip(summed, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert pieces.rows == 25
    assert lines == [f"out of memory: gradients taken in pieces of {rows} rows" for rows in (50, 25)]
    assert seen == [100, 50, 25, 25, 25, 25]


def test_gradient_pieces_re_raise_other_errors_and_a_piece_of_one(monkeypatch):
    X, Y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    coef, intercept = torch.zeros(3, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    _out_of_memory_above(monkeypatch, 0, [])
    with pytest.raises(torch.OutOfMemoryError):
        GradientPieces(make_loss("squared_error", 1))(coef, intercept, (X, Y, None))

    def broken(*args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(sgd_solver, "batch_gradient", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        GradientPieces(make_loss("squared_error", 1))(coef, intercept, (X, Y, None))


@pytest.fixture
def single_rank_group(tmp_path):
    """This process as the only rank of a gloo group, as torchrun would start it."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "strategy", [DataParallel(1), Parle(1, sync_every=7), AdaptiveSGD(1)], ids=lambda strategy: type(strategy).__name__
)
def test_a_worker_out_of_memory_takes_its_gradients_in_pieces(strategy, single_rank_group, monkeypatch):
    rng = np.random.RandomState(0)
    X = rng.randn(2000, 6)
    y = X @ rng.randn(6) + 0.1 * rng.randn(2000)
    settings = dict(batch_size=64, n_epochs=2, tol=None, dtype="float64", random_state=0, parallel=strategy)
    planned = BufferedSGDRegressor(**settings).fit(X, y)
    seen = []
    _out_of_memory_above(monkeypatch, PIECE_ROWS, seen)
    pieces = BufferedSGDRegressor(**settings).fit(X, y)
    # The same steps (count and batch), each gradient summed over pieces of at most 16 rows.
    assert pieces.t_ == planned.t_ and pieces.batch_size_ == planned.batch_size_
    assert max(seen[seen.index(PIECE_ROWS) :]) <= PIECE_ROWS
    np.testing.assert_allclose(pieces.coef_, planned.coef_, rtol=1e-10)
    np.testing.assert_allclose(pieces.intercept_, planned.intercept_, rtol=1e-10, atol=1e-12)
