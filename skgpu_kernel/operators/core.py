"""The operators evaluated on one device: float blocks, grid blocks, the cache they fill, and their measurements."""

import copy

import numpy as np
import scipy.sparse
import torch

from ..device import integer_matmul_speedup, round_up_multiple
from ..grid import encode_on_grid, find_grid, integer_sq_distances
from ..operator_facts import (
    CPU_READ_ENTRIES,
    CPU_WIDE_COLUMNS,
    OperatorPlan,
    padded_features,
)

# Entries of K a CUDA product over a run of rows reads at once (a 16-bit cache's
# rows are converted through a buffer of this size: 256 MB in float32).
CUDA_READ_ENTRIES = 2**26

# Tiles of the cache mirrored at once.  Measured on a 2-core CPU, mirroring a whole cache:
# 1024 x 1024 tiles took 1.21 s at 60000 rows in float16 (256 x 256: 2.4-2.7 s), 0.46 s at
# 30000 in float32 (0.77 s) and 0.06 s at 12000 in float64 (0.09-0.11 s).  Smaller tiles
# pay a copy call per tile; whole kernel blocks transposed from float32 moved only 180 M
# entries/s.
_MIRROR_TILE = 1024


def measure_operator(kernel, rows, block_shape, centers=None):
    """The grid ``rows`` (and ``centers``) lie on and the speed of int8 products at ``block_shape``.

    Parameters
    ----------
    kernel : Kernel
    rows : Tensor of shape (m, d)
        The operator's rows on its device (centred as the fit's).
    block_shape : tuple of int
        ``(rows, columns)`` of the blocks the operator evaluates most
        (:func:`~skgpu_kernel.planning.operator.operator_probe_shape`).
    centers : Tensor of shape (n, d) or None
        Centers that are not rows of ``rows``; they must lie on the rows' grid too.

    Returns
    -------
    OperatorPlan
    """
    if not kernel.from_distances:
        return OperatorPlan()
    grid = find_grid(rows)
    if grid is None or (centers is not None and encode_on_grid(centers, grid) is None):
        return OperatorPlan()
    n_rows, n_columns = block_shape
    # The grid's alternative to int8 products is exact float32 products, whatever the training dtype.
    speedup = integer_matmul_speedup(rows.device, torch.float32, n_rows, padded_features(rows.shape[1]), n_columns)
    return OperatorPlan(grid, speedup)


def kernel_matrix(kernel, X, Z=None):
    """The whole ``K(X, Z)`` (``K(X, X)`` for ``Z`` None) in one evaluation of the kernel, in ``X``'s dtype.

    What reads a kernel matrix whole rather than its products with coefficients:
    the leave-one-out criteria's eigendecompositions and Nystrom features
    (:mod:`skgpu_kernel.regularization`) and the preconditioner's subsample
    (:func:`skgpu_kernel.preconditioner.nystrom_eigensystem`).  One evaluation of
    the kernel's own ``__call__`` on all the rows, so that these float64 matrices
    do not depend on any block size.
    """
    return kernel(X, X if Z is None else Z)


def kernel_matrix_product(kernel, X, Z, V):
    """``K(X, Z) @ V`` of the whole matrix (:func:`kernel_matrix`) in one product: Nystrom features' rows."""
    return kernel_matrix(kernel, X, Z) @ V


def symmetrised_product(gram, V):
    """``(G + G^T) @ V`` of a square kernel matrix ``G``: twice its symmetric part times ``V``."""
    return (gram + gram.T) @ V


class KernelOperator:
    """``K(X, Z)`` for fixed rows ``X`` (m) and centers ``Z`` (n): products and row blocks.

    Attributes
    ----------
    kind : str
        ``"evaluated"``, ``"grid"``, ``"cached"``, ``"sharded"`` or ``"streamed"``.
    shape : tuple of int
        ``(m, n)``.
    dtype : torch.dtype
        The dtype of the products.
    kernel : Kernel or None
        The kernel the values come from (a cache keeps its source's); None for a
        cache made from given values.
    """

    kind = None
    kernel = None

    def matmul(self, V, rows=None, leading=0):
        """``K[rows, :k] @ V`` for ``V`` of ``k <= n`` rows; with ``leading``, also ``K[rows, :leading]``.

        Parameters
        ----------
        V : Tensor of shape (k, l)
        rows : None, slice or Tensor of indices
            The rows of the operator (None: all).
        leading : int, default=0
            When positive, the first ``leading`` columns of ``K[rows]`` are returned
            too (the EigenPro correction on the Nystrom subsample reads them).

        Returns
        -------
        out : Tensor of shape (len(rows), l)
        leading_block : Tensor of shape (len(rows), leading), only when ``leading > 0``
        """
        raise NotImplementedError

    def block(self, rows=None):
        """``K[rows, :]`` as a tensor of its own (a row block of the operator)."""
        raise NotImplementedError

    def block_matmul(self, V, rows=None):
        """``K[rows, :] @ V`` in one product of the whole row block (no column blocks, ``V`` as it is).

        Where a product must be one dense product of the block: the held-out rows'
        predictions of CG on centers and EigenPro 3's temporary centers, whose bits
        the fitted models' records keep.
        """
        return self.block(rows) @ V

    def fill(self, out, row_block):
        """``out[:] = K`` written a block of ``row_block`` rows at a time (``out`` of the operator's shape)."""
        for start in range(0, self.shape[0], row_block):
            out[start : start + row_block] = self.block(slice(start, start + row_block))
        return out

    def with_blocks(self, blocks):
        """The operator with other block sizes (after an out-of-memory halving); a cache has none."""
        return self

    def require_finite(self, dtype, n_rows=256):
        """Raise ``ValueError`` where the first ``n_rows`` rows hold inf or NaN: no step size fixes such a kernel."""
        block = self.block(slice(0, min(self.shape[0], n_rows)))
        if self.kernel is not None:
            self.kernel.require_finite(block, dtype)
        elif not torch.isfinite(block).all():
            raise ValueError(f"The kernel operator returned non-finite values (inf or NaN) in {dtype}.")

    @property
    def nbytes(self):
        """Bytes the operator holds beyond its inputs (a cache's entries; 0 for evaluated blocks)."""
        return 0


class EvaluatedOperator(KernelOperator):
    """Float blocks of ``K(X, Z)`` from the kernel's prepared rows and centers.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (m, d)
        Rows, on any device: each row block moves to the centers' device.
    centers : Tensor with n rows
        ``kernel.prepare_centers(Z)``.
    blocks : OperatorBlocks
    """

    kind = "evaluated"

    def __init__(self, kernel, X, centers, blocks):
        self.kernel, self.X, self.centers, self.blocks = kernel, X, centers, blocks
        self.dtype, self.device = X.dtype, centers.device
        self.shape = (X.shape[0], centers.shape[0])

    def with_blocks(self, blocks):
        """The same operator with other block sizes (after an out-of-memory halving)."""
        operator = copy.copy(self)
        operator.blocks = blocks
        return operator

    def matmul(self, V, rows=None, leading=0):
        selected = self._select(rows)
        n_rows = self._count(selected)
        outputs, leading_blocks = [], []
        for start in range(0, n_rows, self.blocks.rows):
            source = self._source(self._slice(selected, start, start + self.blocks.rows))
            out, leading_block = _blocked_matmul(source, V, self.blocks, leading)
            outputs.append(out)
            leading_blocks.append(leading_block)
        if len(outputs) == 1:
            return (outputs[0], leading_blocks[0]) if leading else outputs[0]
        out = torch.cat(outputs) if outputs else self._empty(0, V.shape[1])
        if not leading:
            return out
        return out, torch.cat(leading_blocks) if leading_blocks else self._empty(0, leading)

    def block(self, rows=None):
        source = self._source(self._select(rows))
        prepared = source.rows(0, source.n_rows)
        n = self.shape[1]
        if n == 0:
            return self._empty(source.n_rows, 0)
        pieces = [
            source.block(prepared, left, min(left + self.blocks.columns, n), fresh=True)
            for left in range(0, n, self.blocks.columns)
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def columns(self, indices):
        """``K[:, indices]`` (centers picked by index), all rows at once."""
        return self.kernel.block(self.X, self.centers[indices])

    def cached(self, storage_dtype, row_block, column_block, symmetric=False):
        """This operator's ``K(X, Z)`` computed once into a :class:`CachedOperator` (:meth:`CachedOperator.fill`)."""
        return CachedOperator.fill(self, storage_dtype, row_block, column_block, symmetric=symmetric)

    def _select(self, rows):
        return self.X if rows is None else self.X[rows]

    def _count(self, selected):
        return selected.shape[0]

    def _slice(self, selected, start, stop):
        return selected[start:stop]

    def _source(self, selected):
        return _PreparedBlocks(self.kernel, selected, self.centers)

    def _empty(self, n_rows, n_columns):
        return torch.zeros(n_rows, n_columns, dtype=self.dtype, device=self.device)


class GridOperator(EvaluatedOperator):
    """Blocks of ``K(X, Z)`` from the exact squared distances of rows and centers on a common grid.

    Parameters
    ----------
    kernel : Kernel
        Must declare ``from_distances``: a function of the raw rows' squared
        Euclidean distances (a kernel that transforms its rows first computes other
        distances, which the grid's do not give).
    row_codes, center_codes : GridCodes
    dtype : torch.dtype
        The dtype of the blocks and products.
    blocks : OperatorBlocks

    Raises
    ------
    ValueError
        For a kernel that does not declare ``from_distances``.
    """

    kind = "grid"

    def __init__(self, kernel, row_codes, center_codes, dtype, blocks):
        if not kernel.from_distances:
            raise ValueError(
                f"{kernel!r} does not declare from_distances: its blocks are not a function of the raw rows' "
                "squared Euclidean distances, so they cannot come from a grid's exact distances."
            )
        self.kernel, self.X, self.centers, self.blocks = kernel, row_codes, center_codes, blocks
        self.dtype, self.device = dtype, center_codes.codes_t.device
        self.shape = (len(row_codes), len(center_codes))

    def columns(self, indices):
        raise NotImplementedError("a grid operator evaluates contiguous blocks of centers only")

    def _select(self, rows):
        return self.X if rows is None else self.X.take(rows)

    def _count(self, selected):
        return len(selected)

    def _slice(self, selected, start, stop):
        return selected.take(slice(start, stop))

    def _source(self, selected):
        return _GridBlocks(self.kernel, selected, self.centers, self.dtype)


def _blocked_matmul(source, V, blocks, leading):
    """``(K(rows, Z[:k]) @ V, K(rows, Z[:leading]) or None)`` summed over blocks of ``blocks.columns`` columns.

    With ``leading``, the first block is exactly ``Z[:leading]``, kept in memory of its own.
    """
    n, column_block, n_outputs = V.shape[0], blocks.columns, V.shape[1]
    if blocks.rowwise:  # each row's bits whatever rows come with it (see OperatorBlocks)
        V = widened_to_multiple(V)
    out = torch.zeros(source.n_rows, V.shape[1], dtype=source.dtype, device=source.device)
    starts = [0, *list(range(leading, n, column_block))] if leading > 0 else list(range(0, n, column_block))
    rows = source.rows(0, source.n_rows)
    leading_block = None
    for start, stop in zip(starts, [*starts[1:], n], strict=False):
        if stop <= start:
            continue
        # The leading block is returned to the caller: it gets memory of its own.
        keeps_block = leading > 0 and start == 0
        block = source.block(rows, start, stop, fresh=keeps_block)
        out.addmm_(block, V[start:stop])
        if keeps_block:
            leading_block = block
    if leading > 0 and leading_block is None:
        leading_block = torch.zeros(source.n_rows, 0, dtype=source.dtype, device=source.device)
    return out[:, :n_outputs], leading_block


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


class _PreparedBlocks:
    """Blocks of ``K(X, Z)`` from the kernel's prepared rows and centers, in one reused buffer."""

    def __init__(self, kernel, X, centers):
        self.kernel, self.X, self.centers, self.buffer = kernel, X, centers, BlockBuffer(kernel)
        self.n_rows, self.dtype, self.device = X.shape[0], X.dtype, X.device

    def rows(self, top, bottom):
        return self.kernel.prepare_rows(self.X[top:bottom].to(self.centers.device))

    def block(self, rows, left, right, fresh=False):
        """The block of columns ``left:right``; ``fresh``: in new memory, not the reused buffer."""
        out = None if fresh else self.buffer(rows, right - left)
        return self.kernel.prepared_block(rows, self.centers[left:right], out=out)


class _GridBlocks:
    """Blocks of ``K(X, Z)`` from the exact squared distances of rows and centers on a grid.

    Where the grid's products are float32 ones, they are computed into the block's
    own memory (a float32 fit) or into a float32 buffer beside the int32 distances
    (a float64 fit: the two together take one float64 block, as the planner counts).
    """

    def __init__(self, kernel, row_codes, center_codes, dtype):
        self.kernel, self.row_codes, self.centers, self.dtype = kernel, row_codes, center_codes, dtype
        self.distances, self.values, self.products = BlockBuffer(kernel), BlockBuffer(kernel), BlockBuffer(kernel)
        self.n_rows, self.device = len(row_codes), center_codes.codes_t.device

    def rows(self, top, bottom):
        return self.row_codes.row_block(top, bottom)

    def block(self, rows, left, right, fresh=False):
        centers = self.centers
        shape, device = (rows[0].shape[0], right - left), centers.codes_t.device
        if fresh:
            out = torch.empty(shape, dtype=self.dtype, device=device)
        else:
            out = self.values.take(*shape, self.dtype, device)
        float_products = None
        if not centers.integer_products:
            float32 = self.dtype == torch.float32
            float_products = out if float32 else self.products.take(*shape, torch.float32, device)
        sq_dists = integer_sq_distances(
            *rows,
            centers.codes_t[:, left:right],
            centers.sq_norms[left:right],
            self.distances.take(*shape, torch.int32, device),
            float_products,
        )
        return self.kernel.block_from_sq_distances(sq_dists, centers.step * centers.step, out)


class CachedOperator(KernelOperator):
    """Rows of ``K(X, Z)`` computed once (``CachedOperator.fill``), read by every later product.

    On the CPU a product reads runs of consecutive rows as views, a few rows at a
    time (copied to the training dtype through one buffer when the storage is
    16-bit), so that each piece stays in the processor's cache; isolated rows are
    gathered.  On the 2-core CPU we develop on, ``K[rows] @ V`` over 8192 rows of a
    54000-column cache read 2.5 G entries/s from contiguous float32 rows and 3.1 G
    from float16 rows (32 at a time), against 1.0-1.3 G when gathering random rows.
    The right-hand side is also widened to 16 columns there (``widened``).  On
    CUDA a batch is read in one gather.

    Parameters
    ----------
    values : Tensor of shape (m, n)
        The cached rows, in the storage dtype (the training dtype or float16).
    dtype : torch.dtype
        The training dtype the products are computed in.
    kernel : Kernel or None, default=None
        The kernel the values come from.
    """

    kind = "cached"

    def __init__(self, values, dtype, kernel=None):
        self.values, self.dtype, self.shape, self.kernel = values, dtype, tuple(values.shape), kernel
        device, n_columns = values.device, max(values.shape[1], 1)
        self.read_rows = None if device.type == "cuda" else max(CPU_READ_ENTRIES // n_columns, 16)

    @classmethod
    def fill(cls, source, storage_dtype, row_block, column_block, symmetric=False):
        """``K(X, Z)`` of an evaluated or grid operator, computed in blocks into a new ``storage_dtype`` tensor.

        Parameters
        ----------
        source : EvaluatedOperator or GridOperator
            Its rows move to the centers' device one row block at a time; the
            cache is kept there.
        storage_dtype : torch.dtype
        row_block, column_block : int
            Rows and columns of a kernel block evaluated at once.
        symmetric : bool, default=False
            The rows and the centers are the same points (``m == n``): each band
            of ``row_block`` rows is evaluated up to its diagonal square only, and
            the blocks below the squares are then copied transposed above them,
            which halves the work.

        Returns
        -------
        CachedOperator
            Products in ``source.dtype``.
        """
        m, n = source.shape
        # Zeroed (paged in) in one sequential pass: on the 2-core CPU, the page faults of
        # fresh memory cost 1.6-1.7 s more when the block stores take them (a 30000-row
        # float16 fill: 6.75-6.88 s into fresh memory, 5.10-5.19 s zeroed first).
        cache = torch.zeros(m, n, dtype=storage_dtype, device=source.device)
        blocks = source._source(source.X)
        for top in range(0, m, row_block):
            bottom = min(top + row_block, m)
            rows = blocks.rows(top, bottom)
            width = bottom if symmetric else n
            for left in range(0, width, column_block):
                right = min(left + column_block, width)
                cache[top:bottom, left:right] = blocks.block(rows, left, right)
        if symmetric:
            _mirror_below_bands(cache, row_block)
        return cls(cache, source.dtype, source.kernel)

    @property
    def nbytes(self):
        return self.values.nbytes

    def block(self, rows=None):
        values = self.values if rows is None else self.values[rows]
        return values.to(self.dtype)

    def matmul(self, V, rows=None, leading=0):
        columns = self.values[:, : V.shape[0]]
        if rows is None:
            rows = slice(None)
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


def map_row_blocks(X, function, n_outputs, row_block, device, dtype, offset=None, pad=None):
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
    pad : Tensor of shape (d,) or None
        The padding rows of the last block (None: zeros).

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
        if torch.is_tensor(X):  # rows the fit holds on the device
            rows = X[start : start + row_block].to(device, dtype)
        else:  # a copy: the rows may come from a read-only memory map, which torch cannot share
            rows = torch.tensor(np.asarray(X[start : start + row_block]), dtype=dtype).to(device)
        if pad is None:
            padded.zero_()
        else:
            padded.copy_(pad.expand_as(padded))
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


def widened(V):
    """``V`` with zero columns added up to 16 on the CPU when it has 2 to 15 (else ``V`` itself).

    The CPU BLAS multiplies a matrix by 2 to 15 columns several times slower than by
    16 (``K[rows] @ V``: 4.9 against 10.7 GB/s for 10 columns; the preconditioner's
    correction on 1688 x 2000 blocks: 15.3 against 2.1 ms), so callers multiply by
    the widened ``V`` and keep the first columns of the product.
    """
    if V.device.type != "cpu" or V.shape[1] == 1 or V.shape[1] >= CPU_WIDE_COLUMNS:
        return V
    return _with_zero_columns(V, CPU_WIDE_COLUMNS)


def widened_to_multiple(V):
    """``V`` with zero columns added up to a multiple of 16 on the CPU (else ``V`` itself).

    Unlike ``widened``, also for one column and beyond 16: what
    ``OperatorBlocks.rowwise`` multiplies by.
    """
    width = round_up_multiple(V.shape[1], CPU_WIDE_COLUMNS)
    if V.device.type != "cpu" or width == V.shape[1]:
        return V
    return _with_zero_columns(V, width)


def _with_zero_columns(V, width):
    """``V`` followed by zero columns up to ``width`` columns."""
    wide = torch.zeros(V.shape[0], width, dtype=V.dtype, device=V.device)
    wide[:, : V.shape[1]] = V
    return wide


def filled_entries(m, n, row_block, symmetric=False):
    """Entries of K :meth:`CachedOperator.fill` evaluates for an ``m x n`` cache (a symmetric fill mirrors the rest)."""
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
