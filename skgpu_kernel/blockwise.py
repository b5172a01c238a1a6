"""Predictions of host rows, linear scores, the batch capacity probe.

The kernel products themselves are :mod:`skgpu_kernel.operators`': host rows (dense,
memory-mapped or sparse) reach the device through a
:class:`~skgpu_kernel.operators.StreamedOperator` (or, for linear scores,
:func:`~skgpu_kernel.operators.map_row_blocks`) in fixed-size blocks, so that a
row's result does not depend on how many rows come with it.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ._warnings import warn_user
from .device import column_block_size, integer_matmul_speedup, rows_within_budget, throughput_saturation_batch
from .grid import Grid, GridCodes, find_grid, integer_products_pay, padded_features
from .operators import CenterOperators, OperatorBlocks, center_codes, map_row_blocks
from .out_of_memory import MemoryEvents, ShrinkingStage, halvings

# Rows per prediction block: small on the CPU (single-row predictions stay cheap),
# large on CUDA (the device needs wide products to be busy).
PREDICT_ROWS = {"cpu": 256, "cuda": 4096}

__all__ = [
    "DeviceCopier",
    "PredictionTensors",
    "kernel_diagonal_max",
    "kernel_predict",
    "linear_predict",
    "linear_scores",
    "measure_batch_capacity",
    "prediction_blocks",
]


@dataclass(frozen=True)
class PredictionTensors:
    """What a fitted kernel model predicts from on its device: prepared centers, coefficients, feature offset.

    Attributes
    ----------
    device : torch.device
    centers : Tensor with p rows
        ``kernel.prepare_centers`` of the (centred) centers.
    coef : Tensor of shape (p, l)
    offset : Tensor of shape (d,) or None
        Subtracted from each row before a translation-invariant kernel.
    grid : Grid or None
        The (centred) centers' common grid, when the fit's kernel blocks came from
        exact int8 products on it: predictions of rows on the same grid then do too.
    center_codes : GridCodes or None
        The centers' codes on ``grid``.
    """

    device: torch.device
    centers: torch.Tensor
    coef: torch.Tensor
    offset: torch.Tensor | None
    grid: Grid | None = None
    center_codes: GridCodes | None = None

    @classmethod
    def of_centers(cls, kernel, centers, coef, offset, on_grid=False):
        """The tensors of raw (centred) ``centers`` on their device; ``on_grid``: find their grid again.

        A model whose fit took the grid (``kernel_grid_step_``) predicts from it
        again after pickling: the grid of the same rows is found the same way.
        """
        grid = find_grid(centers) if on_grid and kernel.from_distances else None
        codes = None if grid is None else center_codes(centers, grid)
        return cls(centers.device, kernel.prepare_centers(centers), coef, offset, grid, codes)

    def with_coef(self, coef):
        """The same centers with ``coef`` (moved to this device and dtype)."""
        return dataclasses.replace(self, coef=coef.to(self.coef.device, self.coef.dtype))

    def predict_on_device(self, kernel, rows, budget):
        """``K(rows, centers) @ coef`` of rows already on this device (centred), in planned float blocks.

        For a fit's own rows, taken from its one copy on the device
        (:func:`rows_taken`): nothing is copied from the host again.  Float blocks
        whatever the fit's products were: the grid's exact distances round the
        same values differently in the last bits only.
        """
        blocks = prediction_blocks(kernel, self.centers, self.coef, rows.shape[1], budget)
        return CenterOperators(kernel, self.centers).operator(rows, blocks).matmul(self.coef)

    def predict(self, kernel, X, budget, events=None):
        """``K(X, centers) @ coef`` of host rows ``X`` (:func:`kernel_predict`).

        From the grid's exact distances where the fit took them and every row of ``X``
        lies on the centers' grid (after the offset), else from float blocks.  The
        distances' products are int8 ones where these pay at the prediction blocks
        (:func:`~skgpu_kernel.operator_facts.integer_products_pay`, measured: a fit's wide
        blocks may gain where 256-row blocks do not), else exact float32 ones: the
        same predictions to the bit either way.

        Out of device memory, the row block is halved (the predictions are those of
        the planned blocks), each time recorded in ``events`` (a
        :class:`~skgpu_kernel.out_of_memory.MemoryEvents`: a fit's record, when a
        fit predicts) or, without it, told in a ``RuntimeWarning``: a fitted model's
        ``predict`` changes no fitted attribute, so its events are not added to
        ``fit_attempts_``.
        """
        warns = events is None
        events = MemoryEvents() if warns else events
        scores = None
        if self.center_codes is not None:
            blocks = prediction_blocks(kernel, self.centers, self.coef, X.shape[1], budget)
            inner = padded_features(X.shape[1])
            speedup = integer_matmul_speedup(self.device, torch.float32, blocks.rows, inner, blocks.columns)
            pays = integer_products_pay(speedup)
            on_grid = dataclasses.replace(
                self,
                grid=dataclasses.replace(self.grid, integer_products=pays),
                center_codes=dataclasses.replace(self.center_codes, integer_products=pays),
            )
            scores = kernel_predict(
                kernel, X, self.centers, self.coef, budget, offset=self.offset, on_grid=on_grid, events=events
            )
        if scores is None:
            scores = kernel_predict(kernel, X, self.centers, self.coef, budget, offset=self.offset, events=events)
        if warns:
            _warn_of_shrinking(events, self.device)
        return scores


def _warn_of_shrinking(events, device):
    """The ``RuntimeWarning`` of a prediction whose row block shrank out of memory, if it did."""
    if not events.records:
        return
    halvings = ", ".join(f"{event['from']} -> {event['to']}" for event in events.records)
    warn_user(
        f"Out of memory on {device} while predicting ({events.records[0]['reason']}): the prediction row "
        f"block went {halvings} rows; the predictions are those of the planned blocks.",
        RuntimeWarning,
    )


def prediction_blocks(kernel, centers, coef, n_features, budget):
    """The row and column blocks :func:`kernel_predict` evaluates, within half of ``budget`` each."""
    device, itemsize = centers.device, torch.finfo(centers.dtype).bits // 8
    nominal_rows = PREDICT_ROWS[device.type]
    entry_bytes = itemsize * (1 + kernel.extra_blocks)
    column_block = column_block_size(device, nominal_rows, centers.shape[0], entry_bytes, budget // 2)
    bytes_per_row = itemsize * (n_features + 2 + column_block * (1 + kernel.extra_blocks) + coef.shape[1])
    return OperatorBlocks(min(rows_within_budget(budget // 2, 0, bytes_per_row), nominal_rows), column_block)


def kernel_predict(kernel, X, centers, coef, budget, offset=None, on_grid=None, events=None):
    """``K(X, centers) @ coef`` for a host array ``X``, in memory-planned blocks.

    Rows go to the device in blocks of a fixed size, the last one padded with
    zeros: every product then has the same shape, so a row's result does not
    depend on which or how many rows are predicted with it (BLAS libraries pick
    different summation orders for different shapes).  Where the device runs out
    of memory, the prediction starts again with half the rows per block (each
    halving recorded in ``events``), down to one.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n_samples, n_features)
    centers : Tensor with n_centers rows, on the compute device
        ``kernel.prepare_centers`` of the (centred) centers.
    coef : Tensor of shape (n_centers, n_outputs), on the compute device
    budget : int
        Bytes available for row blocks and kernel blocks.
    offset : Tensor of shape (n_features,) or None
        Subtracted from each row of ``X`` (the training centring).
    on_grid : PredictionTensors or None
        Blocks from the exact squared distances of rows and centers on
        ``on_grid.grid`` (padding rows at the grid's origin, also on it).
    events : MemoryEvents or None
        Where each halving of the row block is recorded.

    Returns
    -------
    ndarray of shape (n_samples, n_outputs), in the dtype of ``centers``, or None
        None with ``on_grid`` when a row of ``X`` lies off the grid.
    """
    planned = prediction_blocks(kernel, centers, coef, X.shape[1], budget)

    def predict(row_block):
        blocks = dataclasses.replace(planned, rows=row_block)
        return _streamed_operator(kernel, X, centers, blocks, offset, on_grid).matmul(coef).numpy()

    stage = ShrinkingStage("predict", "prediction row block", halvings(planned.rows), centers.device, events)
    try:
        return stage(predict)
    except _OffGrid:  # only the grid's operator refuses a block
        return None


def _streamed_operator(kernel, X, centers, blocks, offset, on_grid):
    """The :class:`StreamedOperator` of :func:`kernel_predict` at ``blocks``."""
    if on_grid is None:
        return CenterOperators(kernel, centers).streamed(X, blocks, offset)
    factory = CenterOperators(kernel, centers, grid=on_grid.grid, codes=on_grid.center_codes)
    return factory.streamed(X, blocks, offset, on_grid.grid.origin, lambda rows: _on_grid_codes(factory, rows))


class _OffGrid(Exception):
    """A row to predict lies off the centers' grid."""


def _on_grid_codes(factory, rows):
    """The codes of rows to predict on the centers' grid; :class:`_OffGrid` where one lies off it."""
    codes = factory.encode(rows)
    if codes is None:
        raise _OffGrid
    return codes


def linear_scores(X, coef, intercept):
    """``X W + b`` for a dense or sparse (COO) ``X``."""
    if X.is_sparse:
        return torch.sparse.mm(X, coef) + intercept
    return torch.addmm(intercept, X, coef)


def linear_predict(rows, coef_matrix, intercept, device, dtype):
    """Scores ``X W + b`` of host ``rows`` in planned row blocks, in ``dtype``.

    Parameters
    ----------
    rows : ndarray, scipy CSR matrix or anything sliced by row ranges, of shape (n, d)
    coef_matrix : ndarray of shape (l, d)
    intercept : ndarray of shape (l,) or scalar
    device : torch.device
    dtype : torch.dtype

    Returns
    -------
    ndarray of shape (n, l)
    """
    coef = torch.as_tensor(coef_matrix.T.copy(), dtype=dtype).to(device)
    intercept = torch.as_tensor(np.atleast_1d(intercept), dtype=dtype).to(device)
    return map_row_blocks(
        rows,
        lambda block: linear_scores(block, coef, intercept),
        coef_matrix.shape[0],
        PREDICT_ROWS[device.type],
        device,
        dtype,
    )


def kernel_diagonal_max(kernel, X, block=4096):
    """``max_i k(x_i, x_i)`` over the rows of ``X`` (the constant beta of EigenPro)."""
    return max(float(kernel.diagonal(X[start : start + block]).max()) for start in range(0, X.shape[0], block))


def measure_batch_capacity(kernel, X, centers, n_outputs, max_batch, column_block_for, subsample_size=0):
    """Measured batch capacity ``m_G``: the batch at which whole EigenPro steps stop gaining speed.

    Times a step's work on ``X``'s device for growing batches: ``K(X_B, X_ref) @ V``
    with ``X_ref`` the first ``PROBE_COLUMNS`` of the prepared ``centers`` (blocked by
    ``column_block_for(batch_size)``), the preconditioner's correction on its leading
    ``subsample_size`` columns (with half as many components) and the coefficient
    update.  The kernel blocks alone saturate at smaller batches than whole steps,
    whose fixed costs larger batches share: on 20000 Fashion-MNIST rows they chose
    256 where 512 ran an epoch 20% faster.  Returns the smallest batch at which rows
    per second stop growing (:func:`~skgpu_kernel.device.throughput_saturation_batch`),
    cached in-process per device, dtype, kernel type and shape.

    Returns
    -------
    SaturationBatch
        The batch, and the rows per second of each probed batch size.
    """
    reference = centers[: min(centers.shape[0], PROBE_COLUMNS)]
    dtype, device = X.dtype, X.device
    values = torch.ones(reference.shape[0], n_outputs, dtype=dtype, device=device)
    leading = min(int(subsample_size), reference.shape[0])
    components = torch.ones(leading, max(leading // 2, 1), dtype=dtype, device=device)
    updated = torch.zeros(X.shape[0], n_outputs, dtype=dtype, device=device)
    max_batch = min(int(max_batch), X.shape[0])

    def run_batch(batch_size):
        rows = torch.arange(batch_size, device=device)
        blocks = OperatorBlocks.whole(batch_size, column_block_for(batch_size))
        operator = CenterOperators(kernel, reference).operator(X, blocks)
        products = operator.matmul(values, rows=rows, leading=leading)
        if leading:
            predictions, block = products
            correction = components @ (components.T @ (block.T @ predictions))
            updated[:leading].add_(correction)
        else:
            predictions = products
        updated.index_add_(0, rows, predictions)

    cache_key = (str(device), str(dtype), type(kernel).__name__, X.shape[1], reference.shape[0], n_outputs, leading)
    return throughput_saturation_batch(run_batch, max_batch, device, cache_key=cache_key)


# Columns of K a capacity probe evaluates per row.
PROBE_COLUMNS = 8192


class DeviceCopier:
    """Copies host arrays to the compute device and dtype, centring features if asked.

    Given a tensor already on the device (rows the fit copied there once:
    :func:`rows_taken`), only the conversion to this dtype and the centring are
    done, in the order they are for host rows: the same values to the bit.
    """

    def __init__(self, device, dtype, offset):
        self.device, self.dtype = device, dtype
        self.offset = None if offset is None else torch.as_tensor(offset, dtype=dtype).to(device)

    def __call__(self, array, center=True):
        if torch.is_tensor(array):
            tensor = array.to(self.device, self.dtype)
        else:
            tensor = torch.as_tensor(np.ascontiguousarray(array), dtype=self.dtype).to(self.device)
        return self.centred(tensor) if center else tensor

    def centred(self, rows):
        """Rows already on the device (uncentred, float64 or this dtype) as ``self(host rows)`` gives them.

        The same values to the bit, without a second copy from the host: the
        conversion to this dtype comes first, then the offset, as for host rows.
        """
        rows = rows.to(self.dtype)
        return rows if self.offset is None else rows - self.offset


def rows_taken(host, on_device, indices):
    """``host[indices]``, taken from the rows' copy on the device where the fit holds one (None: from ``host``).

    The one copy of a fit's rows is made when the fit starts
    (:func:`~skgpu_kernel.fit.prepare.with_rows_on_device`); every subset a
    stage needs on the device (a split, a shuffle, the rows a criterion scores) is
    gathered there instead of copied from the host again.
    """
    return host[indices] if on_device is None else taken_on_device(on_device, indices)


def taken_on_device(on_device, indices):
    """``on_device[indices]`` for host ``indices``, gathered on the device (None without a device copy)."""
    if on_device is None:
        return None
    return on_device[torch.as_tensor(indices, device=on_device.device)]
