"""Contract checks for user-written pluggable objects (kernels)."""

import numpy as np
import torch
from sklearn.base import clone

__all__ = ["check_kernel"]


def check_kernel(kernel, n_features=3, dtype=torch.float64, random_state=0):
    """Check that ``kernel`` honours the :class:`~skgpu_kernel.kernels.Kernel` contract.

    Checks that the block has the right shape, dtype and device, that the kernel is
    symmetric and positive semi-definite on a small sample, that ``diagonal`` agrees
    with the block's diagonal, that blocks do not depend on how rows are chunked,
    that prepared centers give the same blocks and are prepared row by row, and
    that ``clone`` reproduces the kernel's parameters.

    Parameters
    ----------
    kernel : Kernel
        The kernel, with every parameter resolved (no ``"auto"`` bandwidth).
    n_features : int, default=3
    dtype : torch.dtype, default=torch.float64
    random_state : int, default=0

    Raises
    ------
    AssertionError
        Naming the first broken rule.

    Examples
    --------
    >>> from skgpu_kernel.kernels import Laplacian
    >>> from skgpu_kernel.testing import check_kernel
    >>> check_kernel(Laplacian(bandwidth=2.0))
    """
    rng = np.random.RandomState(random_state)
    X = torch.as_tensor(rng.randn(17, n_features), dtype=dtype)
    Z = torch.as_tensor(rng.randn(11, n_features), dtype=dtype)
    tolerance = 1e3 * torch.finfo(dtype).eps

    block = kernel(X, Z)
    assert isinstance(block, torch.Tensor), f"{kernel!r} returned {type(block).__name__}, not a torch.Tensor"
    assert tuple(block.shape) == (17, 11), f"{kernel!r} returned shape {tuple(block.shape)}, expected (17, 11)"
    assert block.dtype == dtype, f"{kernel!r} returned dtype {block.dtype} for {dtype} inputs"
    assert block.device == X.device, f"{kernel!r} returned a block on {block.device}, inputs on {X.device}"
    assert torch.isfinite(block).all(), f"{kernel!r} returned non-finite values"

    chunked = torch.cat([kernel(X[:5], Z), kernel(X[5:], Z)])
    assert torch.allclose(block, chunked, rtol=tolerance, atol=tolerance), (
        f"{kernel!r}: rows of K(X, Z) depend on how X is chunked"
    )
    prepared = kernel.prepare_centers(Z)
    assert torch.allclose(kernel.block(X, prepared), block, rtol=tolerance, atol=tolerance), (
        f"{kernel!r}: block(X, prepare_centers(Z)) differs from K(X, Z)"
    )
    assert torch.equal(prepared[3:7], kernel.prepare_centers(Z[3:7])), (
        f"{kernel!r}: prepare_centers must act row by row"
    )
    gram = kernel(X, X)
    assert torch.allclose(gram, gram.T, rtol=tolerance, atol=tolerance), f"{kernel!r} is not symmetric"
    smallest = torch.linalg.eigvalsh((gram + gram.T) / 2).min()
    assert smallest >= -tolerance * gram.abs().max(), (
        f"{kernel!r} is not positive semi-definite (eigenvalue {float(smallest):.3g})"
    )
    diagonal = kernel.diagonal(X)
    assert torch.allclose(diagonal, torch.diagonal(gram), rtol=tolerance, atol=tolerance), (
        f"{kernel!r}: diagonal(X) disagrees with the diagonal of K(X, X)"
    )
    twin = clone(kernel)
    assert twin.get_params() == kernel.get_params(), f"clone({kernel!r}) changed its parameters"
    assert torch.allclose(twin(X, Z), block), f"clone({kernel!r}) computes a different kernel"
    assert isinstance(kernel.extra_blocks, int) and kernel.extra_blocks >= 0, "extra_blocks must be an int >= 0"
