"""The one factory of kernel operators: ``K(rows, Z)`` for fixed centers, from the grid or in float blocks.

Every operator a fit, a prediction or a shard of centers uses is made here
(:class:`CenterOperators`): the centers are prepared for the kernel once and, where
the operator plan takes the grid, encoded on it once; :meth:`CenterOperators.operator`
then gives ``K(rows, Z)`` for any rows: exact distances from the rows' grid codes
(:class:`~skgpu_kernel.operators.GridOperator`) where the caller has them, else
float blocks (:class:`~skgpu_kernel.operators.EvaluatedOperator`).  Whether the
rows lie on the grid is the caller's question, asked through
:meth:`CenterOperators.encode`: training rows the plan found on the grid are
encoded without a second check, other rows are checked.
"""

from ..grid import encode_on_grid
from .core import EvaluatedOperator, GridOperator
from .streamed import StreamedOperator

__all__ = ["CenterOperators", "center_codes"]


def center_codes(centers, grid):
    """The codes of ``centers`` on ``grid``, one the plan found them on (encoded unchecked).

    The one encoding of centers: the factories' and the predictions' codes are these.
    """
    return encode_on_grid(centers, grid, checked=True)


class CenterOperators:
    """Centers prepared once (and encoded on the plan's grid), and the operators ``K(rows, Z)`` on them.

    Parameters
    ----------
    kernel : Kernel
    prepared : Tensor of shape (p, d')
        The centers as the kernel prepares them (``kernel.prepare_centers(Z)``).
    dtype : torch.dtype or None, default=None
        The dtype of a grid operator's products (the training dtype); None: the
        prepared centers'.
    grid : Grid or None, default=None
        The operator plan's grid; None: float blocks only.
    codes : GridCodes or None, default=None
        The centers' codes on ``grid``.

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> from skgpu_kernel.operators import OperatorBlocks
    >>> Z = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    >>> factory = CenterOperators.of(Gaussian(bandwidth=1.0), Z)
    >>> factory.operator(Z, OperatorBlocks.whole(3, 3)).block().shape
    torch.Size([3, 3])
    """

    def __init__(self, kernel, prepared, dtype=None, grid=None, codes=None):
        self.kernel, self.prepared = kernel, prepared
        self.dtype = prepared.dtype if dtype is None else dtype
        self.grid, self.codes = grid, codes

    @classmethod
    def of(cls, kernel, centers, grid=None, prepared=None):
        """The factory of raw ``centers`` (on their device): prepared (unless given) and encoded on ``grid``.

        ``grid`` is one the plan found the centers on: they are encoded unchecked.
        """
        prepared = kernel.prepare_centers(centers) if prepared is None else prepared
        codes = None if grid is None else center_codes(centers, grid)
        return cls(kernel, prepared, centers.dtype, grid, codes)

    def encode(self, rows, on_grid=False):
        """The codes of ``rows`` on the plan's grid, or None (no grid, or a row off it).

        ``on_grid``: training rows the plan found on the grid, not checked a second time.
        """
        if self.grid is None:
            return None
        return encode_on_grid(rows, self.grid, checked=on_grid)

    def operator(self, rows, blocks, row_codes=None):
        """``K(rows, Z)``: from ``row_codes`` (exact grid distances) where given, else evaluated float blocks.

        Parameters
        ----------
        rows : Tensor of shape (m, d)
            On the centers' device, centred as the centers are.
        blocks : OperatorBlocks
        row_codes : GridCodes or None
            The rows' codes (:meth:`encode`); the factory must have the grid's codes too.
        """
        if row_codes is not None:
            return GridOperator(self.kernel, row_codes, self.codes, self.dtype, blocks)
        return EvaluatedOperator(self.kernel, rows, self.prepared, blocks)

    def streamed(self, X, blocks, offset=None, pad=None, row_codes=None):
        """``K(X, Z)`` of host rows ``X`` moved to the centers' device in blocks of ``blocks.rows`` rows.

        Parameters
        ----------
        X : ndarray, row-sliceable array-like or scipy CSR matrix of shape (m, d)
        blocks : OperatorBlocks
        offset, pad : Tensor of shape (d,) or None
            See :class:`~skgpu_kernel.operators.StreamedOperator`.
        row_codes : callable or None
            ``row_codes(rows)``: a device block's codes on the grid (it may raise to
            refuse a block); None: float blocks.

        Returns
        -------
        StreamedOperator
        """

        def on_device(rows):
            return self.operator(rows, blocks, None if row_codes is None else row_codes(rows))

        device, n_centers = self.prepared.device, self.prepared.shape[0]
        return StreamedOperator(X, on_device, n_centers, blocks.rows, device, self.dtype, offset=offset, pad=pad)
