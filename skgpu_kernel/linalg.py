"""Symmetric eigendecompositions by the LAPACK that runs them faster on this processor.

torch's x86 CPU builds take their LAPACK from Intel's MKL, which picks its tuned
code paths by the processor's vendor.  On an AMD EPYC (AVX2 only, 2 cores) its
float64 divide-and-conquer eigensolver (``syevd``, behind ``torch.linalg.eigh``)
took 1.13-1.21x as long as the same routine in the LAPACK SciPy links
(``scipy.linalg.eigh(driver="evd")``, OpenBLAS's) at the sizes the penalty and
bandwidth searches decompose (800, 1500 and 2000 rows: 0.071, 0.383 and 0.854 s
against 0.062, 0.316 and 0.737 s, best of 3, alone); float32 ran at the same
speed in both (0.93-1.05x), products alike, and Cholesky factors ran faster in torch.
A float64 decomposition on such a CPU therefore goes through SciPy; every other
case stays with torch, so the result does not depend on a timing: the
choice is a fact of the processor and the build, the same in every process.
SciPy's LAPACK runs on its own thread pool (sized by ``OPENBLAS_NUM_THREADS`` or
``threadpoolctl``, not by ``torch.set_num_threads``).
"""

import functools

import scipy.linalg
import torch

from .device import cpu_vendor

__all__ = ["symmetric_eigh", "uses_scipy_lapack"]


def symmetric_eigh(matrix):
    """``torch.linalg.eigh(matrix)``: eigenvalues ascending and unit eigenvectors as columns.

    Parameters
    ----------
    matrix : Tensor of shape (n, n)
        Symmetric (its lower triangle is read).

    Returns
    -------
    eigenvalues : Tensor of shape (n,)
    eigenvectors : Tensor of shape (n, n)
        On ``matrix``'s device, in its dtype.
    """
    if not uses_scipy_lapack(matrix.device, matrix.dtype):
        return torch.linalg.eigh(matrix)
    values, vectors = scipy.linalg.eigh(matrix.numpy(), lower=True, driver="evd", check_finite=False, overwrite_a=False)
    return torch.from_numpy(values), torch.from_numpy(vectors)


def uses_scipy_lapack(device, dtype):
    """Whether :func:`symmetric_eigh` decomposes ``dtype`` matrices on ``device`` with SciPy's LAPACK.

    True for float64 on a CPU whose vendor is not Intel when torch's LAPACK is
    MKL's (the case measured slower; see the module's docstring).
    """
    return device.type == "cpu" and dtype == torch.float64 and _mkl_off_its_vendor()


@functools.cache
def _mkl_off_its_vendor():
    return torch.backends.mkl.is_available() and cpu_vendor() not in ("GenuineIntel", "")
