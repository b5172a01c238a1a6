"""Host rows that never sit on the device whole, moved there in fixed-size blocks, each with its own operator."""

import dataclasses

import torch

from .core import KernelOperator, map_row_blocks


class StreamedOperator(KernelOperator):
    """``K(X, Z)`` for host rows ``X`` that never sit on the device whole (an array, a memory map, a CSR matrix).

    Rows go to the device in blocks of exactly ``row_block`` rows (:func:`map_row_blocks`:
    the last one padded), and each block is multiplied by its own device operator
    ``on_device(rows)``, row by row (``OperatorBlocks.rowwise``), so that a row's
    result does not depend on which or how many rows come with it.  Products are
    host tensors.

    Parameters
    ----------
    X : ndarray, row-sliceable array-like or scipy CSR matrix of shape (m, d)
    on_device : callable
        ``on_device(rows) -> KernelOperator`` of a device block of rows; it may raise
        to refuse a block (a grid operator for rows off the grid).
    n_centers : int
    row_block : int
    device : torch.device
    dtype : torch.dtype
    offset : Tensor of shape (d,) or None
        Subtracted from each row on the device (the training centring).
    pad : Tensor of shape (d,) or None
        The padding rows of the last block (None: zeros).
    """

    kind = "streamed"

    def __init__(self, X, on_device, n_centers, row_block, device, dtype, offset=None, pad=None):
        self.X, self.on_device, self.row_block = X, on_device, row_block
        self.device, self.dtype, self.offset, self.pad = device, dtype, offset, pad
        self.shape = (X.shape[0], n_centers)

    def matmul(self, V, rows=None, leading=0):
        if rows is not None or leading:
            raise NotImplementedError("a streamed operator multiplies all its rows, in order")
        scores = map_row_blocks(
            self.X,
            lambda block: _rowwise(self.on_device(block)).matmul(V),
            V.shape[1],
            self.row_block,
            self.device,
            self.dtype,
            offset=self.offset,
            pad=self.pad,
        )
        return torch.from_numpy(scores)

    def block(self, rows=None):
        raise NotImplementedError("a streamed operator's rows are not held: multiply them with matmul")


def _rowwise(operator):
    """``operator`` (evaluated or on a grid, the kinds ``on_device`` gives) multiplying row by row."""
    blocks = getattr(operator, "blocks", None)
    if blocks is None or blocks.rowwise:
        return operator
    return operator.with_blocks(dataclasses.replace(blocks, rowwise=True))
