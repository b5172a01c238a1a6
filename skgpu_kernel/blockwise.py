"""Blockwise kernel operations: ``K(X, Z) @ V`` without forming ``K`` whole.

Column blocks bound the memory of one kernel block; row blocks bound what is moved
to the device at a time.  Each row of the result depends only on that row and on the
column blocking, which is fixed by the caller, so results do not depend on the row
block size.
"""

import numpy as np
import scipy.sparse
import torch

from .device import column_block_size, rows_within_budget, throughput_saturation_batch
from .grid import integer_sq_distances

# Rows per prediction block: small on the CPU (single-row predictions stay cheap),
# large on CUDA (the device needs wide products to be busy).
PREDICT_ROWS = {"cpu": 256, "cuda": 4096}

__all__ = [
    "CPU_READ_ENTRIES",
    "CPU_WIDE_COLUMNS",
    "DeviceCopier",
    "KernelCache",
    "cache_kernel_rows",
    "csr_to_torch",
    "filled_entries",
    "kernel_diagonal_max",
    "kernel_matmul",
    "kernel_matmul_rows",
    "kernel_predict",
    "linear_predict",
    "linear_scores",
    "map_row_blocks",
    "measure_batch_capacity",
    "widened",
]


def kernel_matmul(kernel, X, centers, V, column_block, leading=0, codes=None):
    """Compute ``K(X, Z) @ V`` summing over blocks of ``column_block`` columns.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (m, d)
    centers : Tensor with n rows
        ``kernel.prepare_centers(Z)``.
    V : Tensor of shape (n, l)
    column_block : int
        Columns of ``K`` evaluated at once.
    leading : int, default=0
        When positive, the first block is exactly ``centers[:leading]`` and its kernel
        block ``K(X, Z[:leading])`` is returned as well, for callers that need it
        (the EigenPro correction on the Nystrom subsample).
    codes : tuple of two :class:`~skgpu_kernel.grid.GridCodes` or None
        ``X`` and ``Z`` on a common grid: blocks from their exact squared distances,
        as in :func:`cache_kernel_rows`.

    Returns
    -------
    out : Tensor of shape (m, l)
    leading_block : Tensor of shape (m, leading), only when ``leading > 0``
    """
    n = centers.shape[0]
    out = torch.zeros(X.shape[0], V.shape[1], dtype=X.dtype, device=X.device)
    starts = [0, *list(range(leading, n, column_block))] if leading > 0 else list(range(0, n, column_block))
    blocks = _PreparedBlocks(kernel, X, centers) if codes is None else _GridBlocks(kernel, *codes, X.dtype)
    rows = blocks.rows(0, X.shape[0])
    leading_block = None
    for start, stop in zip(starts, [*starts[1:], n], strict=False):
        if stop <= start:
            continue
        # The leading block is returned to the caller: it gets memory of its own.
        keeps_block = leading > 0 and start == 0
        block = blocks.block(rows, start, stop, fresh=keeps_block)
        out.addmm_(block, V[start:stop])
        if keeps_block:
            leading_block = block
    if leading > 0:
        if leading_block is None:
            leading_block = torch.zeros(X.shape[0], 0, dtype=X.dtype, device=X.device)
        return out, leading_block
    return out


class BlockBuffer:
    """One reused buffer for kernel blocks of any shape up to the largest asked.

    ``buffer(rows, n_columns)`` is a contiguous ``(len(rows), n_columns)`` tensor on
    the rows' device and dtype, or ``None`` for a kernel that computes its blocks in
    memory of its own (``uses_block_buffer`` false), which would then hold one block
    more than the memory planner counts.  A loop over kernel blocks that allocated each
    anew paid fresh memory (page faults) per block: on the 2-core CPU, filling a
    2048-row band of Fashion-MNIST's cache ran at 137 GFLOP/s that way against
    167 with prepared rows and one buffer (``torch.mm`` alone: 182).
    """

    def __init__(self, kernel):
        self.enabled, self.storage = kernel.uses_block_buffer, None

    def __call__(self, rows, n_columns):
        if not self.enabled:
            return None
        return self.take(rows.shape[0], n_columns, rows.dtype, rows.device)

    def take(self, n_rows, n_columns, dtype, device):
        """A contiguous ``(n_rows, n_columns)`` view of the buffer, grown when needed."""
        size, storage = n_rows * n_columns, self.storage
        if storage is None or storage.numel() < size or storage.dtype != dtype or storage.device != device:
            self.storage = storage = torch.empty(size, dtype=dtype, device=device)
        return storage[:size].view(n_rows, n_columns)


class KernelCache:
    """Rows of ``K(X, Z)`` computed once, read by every later product.

    On the CPU a product reads runs of consecutive rows as views, a few rows at a
    time (copied to the training dtype through one buffer when the storage is
    16-bit), so that each piece stays in the processor's cache; isolated rows are
    gathered.  On the 2-core CPU we develop on, ``K[rows] @ V`` over 8192 rows of a
    54000-column cache read 2.5 G entries/s from contiguous float32 rows and 3.1 G
    from float16 rows (32 at a time), against 1.0-1.3 G when gathering random rows.
    The right-hand side is also widened to 16 columns there (:func:`widened`).  On
    CUDA a batch is read in one gather.

    Parameters
    ----------
    values : Tensor of shape (m, n)
        The cached rows, in the storage dtype (the training dtype or float16).
    dtype : torch.dtype
        The training dtype the products are computed in.
    """

    def __init__(self, values, dtype):
        self.values, self.dtype = values, dtype
        device, n_columns = values.device, max(values.shape[1], 1)
        self.read_rows = None if device.type == "cuda" else max(CPU_READ_ENTRIES // n_columns, 16)

    def matmul(self, rows, V, leading=0):
        """``K[rows, :k] @ V`` for ``V`` of k rows; with ``leading``, also ``K[rows, :leading]``.

        Parameters
        ----------
        rows : Tensor of indices or slice
        V : Tensor of shape (k, l)
        leading : int, default=0

        Returns
        -------
        out : Tensor of shape (len(rows), l)
        leading_block : Tensor of shape (len(rows), leading), only when ``leading > 0``
        """
        columns = self.values[:, : V.shape[0]]
        if isinstance(rows, slice):
            rows = range(self.values.shape[0])[rows]
            pieces = self._slice_pieces(columns, rows)
        else:
            pieces = self._pieces(columns, rows)
        m, width = len(rows), V.shape[1]
        wide = widened(V)
        out = torch.empty(m, wide.shape[1], dtype=self.dtype, device=V.device)
        leading_block = torch.empty(m, leading, dtype=self.dtype, device=V.device) if leading else None
        converted = None
        for start, block in pieces:
            if block.dtype != self.dtype:
                if converted is None or converted.shape[0] < block.shape[0]:
                    converted = torch.empty(block.shape, dtype=self.dtype, device=block.device)
                block = converted[: block.shape[0]].copy_(block)
            torch.mm(block, wide, out=out[start : start + block.shape[0]])
            if leading:
                leading_block[start : start + block.shape[0]] = block[:, :leading]
        out = out[:, :width]
        return (out, leading_block) if leading else out

    def _slice_pieces(self, columns, rows):
        """``(position, view)`` of the consecutive rows of a ``range`` with step 1 (else gathered).

        On CUDA too: a whole-cache product (conjugate gradients, validation scores)
        must not gather a copy of the cache.
        """
        if rows.step != 1:
            yield from self._pieces(columns, torch.tensor(rows, device=columns.device))
            return
        read_rows = self.read_rows or max(CUDA_READ_ENTRIES // max(columns.shape[1], 1), 1)
        for start in range(0, len(rows), read_rows):
            first = rows.start + start
            yield start, columns[first : min(first + read_rows, rows.stop)]

    def _pieces(self, columns, rows):
        """``(position in rows, block of cached rows)``: views of consecutive runs, gathers otherwise."""
        if self.read_rows is None:
            yield 0, columns.index_select(0, rows)
            return
        indices = rows.cpu().numpy()
        breaks = np.flatnonzero(np.diff(indices) != 1) + 1
        for run_start, run_stop in zip(np.r_[0, breaks], np.r_[breaks, len(indices)], strict=True):
            for start in range(int(run_start), int(run_stop), self.read_rows):
                stop = min(start + self.read_rows, int(run_stop))
                first = int(indices[start])
                yield start, columns[first : first + stop - start]


# Entries of K a CPU read takes at once (a few MB), and the width the BLAS reads
# fastest: see KernelCache and widened (the memory planner counts both).
CPU_READ_ENTRIES = 2**21

# Entries of K a CUDA product over a run of rows reads at once (a 16-bit cache's
# rows are converted through a buffer of this size: 256 MB in float32).
CUDA_READ_ENTRIES = 2**26
CPU_WIDE_COLUMNS = 16

# Tiles of the cache mirrored at once.  Measured on a 2-core CPU, mirroring a whole cache:
# 1024 x 1024 tiles took 1.21 s at 60000 rows in float16 (256 x 256: 2.4-2.7 s), 0.46 s at
# 30000 in float32 (0.77 s) and 0.06 s at 12000 in float64 (0.09-0.11 s).  Smaller tiles
# pay a copy call per tile; whole kernel blocks transposed from float32 moved only 180 M
# entries/s.
_MIRROR_TILE = 1024


def widened(V):
    """``V`` with zero columns added up to 16 on the CPU when it has 2 to 15 (else ``V`` itself).

    The CPU BLAS multiplies a matrix by 2 to 15 columns several times slower than by
    16 (``K[rows] @ V``: 4.9 against 10.7 GB/s for 10 columns; the preconditioner's
    correction on 1688 x 2000 blocks: 15.3 against 2.1 ms), so callers multiply by
    the widened ``V`` and keep the first columns of the product.
    """
    if V.device.type != "cpu" or V.shape[1] == 1 or V.shape[1] >= CPU_WIDE_COLUMNS:
        return V
    wide = torch.zeros(V.shape[0], CPU_WIDE_COLUMNS, dtype=V.dtype, device=V.device)
    wide[:, : V.shape[1]] = V
    return wide


def cache_kernel_rows(kernel, X, centers, storage_dtype, row_block, column_block, symmetric=False, codes=None):
    """``K(X, Z)`` computed in blocks into a new ``storage_dtype`` tensor.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (m, d)
        On any device: each row block moves to the centers' device, where the
        result is kept.
    centers : Tensor with n rows
        ``kernel.prepare_centers(Z)``.
    storage_dtype : torch.dtype
    row_block, column_block : int
        Rows and columns of a kernel block evaluated at once.
    symmetric : bool, default=False
        ``X`` and ``Z`` are the same points (``m == n``): each band of
        ``row_block`` rows is evaluated up to its diagonal square only, and the
        blocks below the squares are then copied transposed above them, which
        halves the work.
    codes : tuple of two :class:`~skgpu_kernel.grid.GridCodes` or None
        ``X`` and ``Z`` on a common grid: blocks then come from their exact
        squared distances (int8 products, :func:`~skgpu_kernel.grid.integer_sq_distances`)
        and the kernel's :meth:`~skgpu_kernel.kernels.Kernel.block_from_sq_distances`.

    Returns
    -------
    Tensor of shape (m, n)
    """
    m, n = X.shape[0], centers.shape[0]
    # Zeroed (paged in) in one sequential pass: on the 2-core CPU, the page faults of
    # fresh memory cost 1.6-1.7 s more when the block stores take them (a 30000-row
    # float16 fill: 6.75-6.88 s into fresh memory, 5.10-5.19 s zeroed first).
    cache = torch.zeros(m, n, dtype=storage_dtype, device=centers.device)
    blocks = _PreparedBlocks(kernel, X, centers) if codes is None else _GridBlocks(kernel, *codes, X.dtype)
    for top in range(0, m, row_block):
        bottom = min(top + row_block, m)
        rows = blocks.rows(top, bottom)
        width = bottom if symmetric else n
        for left in range(0, width, column_block):
            right = min(left + column_block, width)
            cache[top:bottom, left:right] = blocks.block(rows, left, right)
    if symmetric:
        _mirror_below_bands(cache, row_block)
    return cache


class _PreparedBlocks:
    """Blocks of ``K(X, Z)`` from the kernel's prepared rows and centers, in one reused buffer."""

    def __init__(self, kernel, X, centers):
        self.kernel, self.X, self.centers, self.buffer = kernel, X, centers, BlockBuffer(kernel)

    def rows(self, top, bottom):
        return self.kernel.prepare_rows(self.X[top:bottom].to(self.centers.device))

    def block(self, rows, left, right, fresh=False):
        """The block of columns ``left:right``; ``fresh``: in new memory, not the reused buffer."""
        out = None if fresh else self.buffer(rows, right - left)
        return self.kernel.prepared_block(rows, self.centers[left:right], out=out)


class _GridBlocks:
    """Blocks of ``K(X, Z)`` from the exact squared distances of rows and centers on a grid."""

    def __init__(self, kernel, row_codes, center_codes, dtype):
        self.kernel, self.row_codes, self.centers, self.dtype = kernel, row_codes, center_codes, dtype
        self.distances, self.values = BlockBuffer(kernel), BlockBuffer(kernel)

    def rows(self, top, bottom):
        return self.row_codes.row_block(top, bottom)

    def block(self, rows, left, right, fresh=False):
        centers = self.centers
        shape, device = (rows[0].shape[0], right - left), centers.codes_t.device
        sq_dists = integer_sq_distances(
            *rows,
            centers.codes_t[:, left:right],
            centers.sq_norms[left:right],
            self.distances.take(*shape, torch.int32, device),
        )
        if fresh:
            out = torch.empty(shape, dtype=self.dtype, device=device)
        else:
            out = self.values.take(*shape, self.dtype, device)
        return self.kernel.block_from_sq_distances(sq_dists, centers.step * centers.step, out)


def filled_entries(m, n, row_block, symmetric=False):
    """Kernel entries :func:`cache_kernel_rows` evaluates for an ``m x n`` cache (the rest a symmetric fill mirrors)."""
    if not symmetric:
        return m * n
    return sum(min(top + row_block, m) * (min(top + row_block, m) - top) for top in range(0, m, row_block))


def _mirror_below_bands(cache, row_block):
    """Copy what lies left of each band's diagonal square to above it, in tiles."""
    n = cache.shape[0]
    for band in range(row_block, n, row_block):
        for top in range(band, min(band + row_block, n), _MIRROR_TILE):
            bottom = min(top + _MIRROR_TILE, band + row_block, n)
            for left in range(0, band, _MIRROR_TILE):
                right = min(left + _MIRROR_TILE, band)
                cache[left:right, top:bottom] = cache[top:bottom, left:right].T


def kernel_matmul_rows(kernel, X, centers, V, row_block, column_block, codes=None):
    """:func:`kernel_matmul` for a device tensor ``X`` of any length, ``row_block`` rows at a time."""
    pieces = []
    for start in range(0, X.shape[0], row_block):
        rows = slice(start, start + row_block)
        pair = None if codes is None else (codes[0].take(rows), codes[1])
        pieces.append(kernel_matmul(kernel, X[rows], centers, V, column_block, codes=pair))
    return torch.cat(pieces)


def kernel_predict(kernel, X, centers, coef, budget, offset=None):
    """``K(X, centers) @ coef`` for a host array ``X``, in memory-planned blocks.

    Rows go to the device in blocks of a fixed size, the last one padded with
    zeros: every product then has the same shape, so a row's result does not
    depend on which or how many rows are predicted with it (BLAS libraries pick
    different summation orders for different shapes).

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

    Returns
    -------
    ndarray of shape (n_samples, n_outputs), in the dtype of ``centers``
    """
    device, dtype = centers.device, centers.dtype
    itemsize = torch.finfo(dtype).bits // 8
    n_centers, n_features = centers.shape[0], X.shape[1]
    nominal_rows = PREDICT_ROWS[device.type]
    column_block = column_block_size(device, nominal_rows, n_centers, itemsize * (1 + kernel.extra_blocks), budget // 2)
    bytes_per_row = itemsize * (n_features + 2 + column_block * (1 + kernel.extra_blocks) + coef.shape[1])
    row_block = min(rows_within_budget(budget // 2, 0, bytes_per_row), nominal_rows)
    return map_row_blocks(
        X,
        lambda rows: kernel_matmul(kernel, rows, centers, coef, column_block),
        coef.shape[1],
        row_block,
        device,
        dtype,
        offset=offset,
    )


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


def map_row_blocks(X, function, n_outputs, row_block, device, dtype, offset=None):
    """Apply ``function`` to host rows moved to the device in fixed-size blocks.

    Dense rows go in blocks of exactly ``row_block`` rows, the last one padded with
    zeros: every product then has the same shape, so a row's result does not depend
    on which or how many rows come with it (BLAS libraries pick different summation
    orders for different shapes).  Sparse rows (scipy CSR) become torch sparse COO
    blocks, whose products are row by row anyway.

    Parameters
    ----------
    X : ndarray, row-sliceable array-like or scipy CSR matrix of shape (n, d)
    function : callable
        ``function(rows) -> Tensor of shape (len(rows), n_outputs)``.
    n_outputs : int
    row_block : int
    device : torch.device
    dtype : torch.dtype
    offset : Tensor of shape (d,) or None
        Subtracted from each dense row first.

    Returns
    -------
    ndarray of shape (n, n_outputs), in ``dtype``
    """
    sparse = scipy.sparse.issparse(X)
    padded = None if sparse else torch.zeros(row_block, X.shape[1], dtype=dtype, device=device)
    outputs = []
    for start in range(0, X.shape[0], row_block):
        if sparse:
            outputs.append(function(csr_to_torch(X[start : start + row_block], dtype, device)).cpu())
            continue
        # A copy: the rows may come from a read-only memory map, which torch cannot share.
        rows = torch.tensor(np.asarray(X[start : start + row_block]), dtype=dtype).to(device)
        padded.zero_()
        padded[: rows.shape[0]] = rows if offset is None else rows - offset
        outputs.append(function(padded)[: rows.shape[0]].cpu())
    if not outputs:
        return torch.zeros(0, n_outputs, dtype=dtype).numpy()
    return torch.cat(outputs).numpy()


def csr_to_torch(matrix, dtype, device):
    """A scipy sparse matrix as a coalesced torch sparse COO tensor on ``device``."""
    coo = scipy.sparse.coo_matrix(matrix)
    indices = torch.as_tensor(np.vstack([coo.row, coo.col]).astype(np.int64))
    values = torch.as_tensor(coo.data, dtype=dtype)
    return torch.sparse_coo_tensor(indices, values, coo.shape, check_invariants=False).coalesce().to(device)


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
    batch : int
    throughputs : dict
        Rows per second for each probed batch size.
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
        if leading:
            predictions, block = kernel_matmul(
                kernel, X[rows], reference, values, column_block_for(batch_size), leading
            )
            correction = components @ (components.T @ (block.T @ predictions))
            updated[:leading].add_(correction)
        else:
            predictions = kernel_matmul(kernel, X[rows], reference, values, column_block_for(batch_size))
        updated.index_add_(0, rows, predictions)

    cache_key = (str(device), str(dtype), type(kernel).__name__, X.shape[1], reference.shape[0], n_outputs, leading)
    return throughput_saturation_batch(run_batch, max_batch, device, cache_key=cache_key)


# Columns of K a capacity probe evaluates per row.
PROBE_COLUMNS = 8192


class DeviceCopier:
    """Copies host arrays to the compute device and dtype, centring features if asked."""

    def __init__(self, device, dtype, offset):
        self.device, self.dtype = device, dtype
        self.offset = None if offset is None else torch.as_tensor(offset, dtype=dtype).to(device)

    def __call__(self, array, center=True):
        tensor = torch.as_tensor(np.ascontiguousarray(array), dtype=self.dtype).to(self.device)
        if center and self.offset is not None:
            tensor = tensor - self.offset
        return tensor
