"""Symmetric eigendecompositions through the LAPACK the processor runs faster."""

import pytest
import torch

from skgpu_kernel import linalg
from skgpu_kernel.linalg import symmetric_eigh, uses_scipy_lapack

# Float64 reconstructions agree to a few hundred rounding errors of the largest eigenvalue.
TOLERANCE = {torch.float64: 1e-11, torch.float32: 1e-4}


@pytest.fixture
def processor(monkeypatch):
    """Set the CPU vendor and whether torch's LAPACK is MKL's; the rule is read afresh."""

    def set_processor(vendor, mkl):
        monkeypatch.setattr(linalg, "cpu_vendor", lambda: vendor)
        monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
        linalg._mkl_off_its_vendor.cache_clear()

    yield set_processor
    linalg._mkl_off_its_vendor.cache_clear()


@pytest.mark.parametrize(
    ("vendor", "mkl", "device", "dtype", "scipy"),
    [
        ("AuthenticAMD", True, "cpu", torch.float64, True),
        ("AuthenticAMD", True, "cpu", torch.float32, False),  # measured as fast in both
        ("AuthenticAMD", False, "cpu", torch.float64, False),  # torch's LAPACK is not MKL's
        ("GenuineIntel", True, "cpu", torch.float64, False),  # MKL on its own vendor's CPU
        ("", True, "cpu", torch.float64, False),  # vendor unknown: torch's
        ("AuthenticAMD", True, "cuda", torch.float64, False),
    ],
)
def test_scipy_lapack_serves_float64_where_torch_runs_mkl_on_another_vendors_cpu(
    processor, vendor, mkl, device, dtype, scipy
):
    processor(vendor, mkl)
    assert uses_scipy_lapack(torch.device(device), dtype) is scipy


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_symmetric_eigh_matches_torch_eigh_whichever_lapack_runs(processor, vendor, dtype):
    processor(vendor, True)
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(300, 5, generator=generator, dtype=torch.float64)
    matrix = torch.exp(-torch.cdist(X, X)).to(dtype)
    values, vectors = symmetric_eigh(matrix)
    expected_values, _ = torch.linalg.eigh(matrix)
    assert values.dtype == dtype and vectors.dtype == dtype and values.device == matrix.device
    assert torch.all(values[1:] >= values[:-1]), "ascending, as torch.linalg.eigh"
    scale = float(expected_values.abs().max())
    tolerance = TOLERANCE[dtype] * scale
    assert torch.allclose(values, expected_values, rtol=0, atol=tolerance)
    assert torch.allclose((vectors * values) @ vectors.T, matrix, rtol=0, atol=tolerance)
    assert torch.allclose(vectors.T @ vectors, torch.eye(300, dtype=dtype), rtol=0, atol=TOLERANCE[dtype] * 300)


def test_only_the_lower_triangle_is_read(processor):
    processor("AuthenticAMD", True)
    generator = torch.Generator().manual_seed(1)
    A = torch.randn(50, 50, generator=generator, dtype=torch.float64)
    symmetric = A + A.T
    lower_only = torch.tril(symmetric) + torch.triu(torch.full_like(A, 1e6), diagonal=1)
    values, _ = symmetric_eigh(lower_only)
    assert torch.allclose(values, torch.linalg.eigvalsh(symmetric), rtol=0, atol=1e-10)
