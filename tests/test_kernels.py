"""Kernels against float64 naive references."""

import math

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.gaussian_process.kernels import Matern as SkMatern
from sklearn.metrics.pairwise import euclidean_distances, rbf_kernel
from sklearn.svm import SVC

from skgpu_kernel.kernels import (
    Cauchy,
    Gaussian,
    Kernel,
    Laplacian,
    Matern,
    auto_bandwidth,
    make_kernel,
)
from skgpu_kernel.testing import check_kernel

from .conftest import RTOL

PROFILES = {
    "gaussian": lambda d, s: np.exp(-(d**2) / (2 * s**2)),
    "laplacian": lambda d, s: np.exp(-d / s),
    "cauchy": lambda d, s: 1.0 / (1.0 + d**2 / s**2),
    "matern0.5": lambda d, s: np.exp(-d / s),
    "matern1.5": lambda d, s: (1 + math.sqrt(3) * d / s) * np.exp(-math.sqrt(3) * d / s),
    "matern2.5": lambda d, s: (1 + math.sqrt(5) * d / s + 5 * d**2 / (3 * s**2)) * np.exp(-math.sqrt(5) * d / s),
}
KERNELS = {
    "gaussian": lambda s: Gaussian(bandwidth=s),
    "laplacian": lambda s: Laplacian(bandwidth=s),
    "cauchy": lambda s: Cauchy(bandwidth=s),
    "matern0.5": lambda s: Matern(bandwidth=s, nu=0.5),
    "matern1.5": lambda s: Matern(bandwidth=s, nu=1.5),
    "matern2.5": lambda s: Matern(bandwidth=s, nu=2.5),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_matches_float64_reference(name, dtype, rng):
    X, Z = rng.randn(40, 7), rng.randn(30, 7)
    sigma = 2.5
    expected = PROFILES[name](euclidean_distances(X, Z), sigma)
    block = KERNELS[name](sigma)(
        torch.as_tensor(X, dtype=getattr(torch, dtype)), torch.as_tensor(Z, dtype=getattr(torch, dtype))
    )
    assert block.dtype == getattr(torch, dtype)
    np.testing.assert_allclose(block.numpy(), expected, rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_contract(name, dtype):
    check_kernel(KERNELS[name](1.7), dtype=getattr(torch, dtype))


def test_gaussian_is_sklearn_rbf_with_gamma_mapping(rng):
    X = rng.randn(20, 4)
    sigma = 1.3
    expected = rbf_kernel(X, X, gamma=1 / (2 * sigma**2))
    got = Gaussian(bandwidth=sigma)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_matches_sklearn(nu, rng):
    X = rng.randn(25, 3)
    expected = SkMatern(length_scale=0.8, nu=nu)(X)
    got = Matern(bandwidth=0.8, nu=nu)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["laplacian", "matern1.5"])
def test_identical_points_far_from_origin_have_exact_self_similarity(name):
    # Large norms make ||x||^2 + ||z||^2 - 2 x.z cancel badly; clamping and the
    # rounding allowance must keep the square root finite and k(x, x) exact.
    X = torch.full((5, 50), 1e3, dtype=torch.float32) + torch.arange(5.0)[:, None]
    block = KERNELS[name](1.0)(X, X)
    assert torch.isfinite(block).all()
    np.testing.assert_array_equal(torch.diagonal(block).numpy(), np.ones(5, dtype=np.float32))


def test_auto_bandwidth_equals_svc_gamma_scale(rng):
    X = rng.rand(50, 6) * 3
    sigma = auto_bandwidth(X)
    gamma_scale = 1.0 / (X.shape[1] * X.var())
    np.testing.assert_allclose(1.0 / (2 * sigma**2), gamma_scale, rtol=1e-12)
    assert SVC(gamma="scale").fit(X, rng.randint(0, 2, 50))._gamma == pytest.approx(gamma_scale)


def test_auto_bandwidth_of_constant_data_is_one():
    assert auto_bandwidth(np.ones((5, 3))) == 1.0


def test_make_kernel_resolves_names_and_auto(rng):
    X = rng.randn(30, 4)
    kernel, bandwidth = make_kernel("rbf", "auto", None, X)
    assert isinstance(kernel, Gaussian) and bandwidth == pytest.approx(auto_bandwidth(X))
    kernel, _ = make_kernel("matern", 2.0, {"nu": 2.5}, X)
    assert kernel.nu == 2.5 and kernel.bandwidth == 2.0


def test_make_kernel_never_modifies_the_users_kernel(rng):
    user_kernel = Laplacian()
    kernel, bandwidth = make_kernel(user_kernel, "auto", None, rng.randn(10, 2))
    assert user_kernel.bandwidth == "auto"
    assert kernel is not user_kernel and kernel.bandwidth == bandwidth


@pytest.mark.parametrize(
    ("kernel", "bandwidth", "params", "error", "match"),
    [
        ("sigmoid", 1.0, None, ValueError, "Unknown kernel 'sigmoid'"),
        ("gaussian", -1.0, None, ValueError, "bandwidth must be a positive"),
        ("gaussian", 0.0, None, ValueError, "bandwidth must be a positive"),
        ("gaussian", float("nan"), None, ValueError, "bandwidth must be a positive"),
        ("gaussian", "wide", None, ValueError, "bandwidth must be a positive float, 'auto' or 'scale'"),
        ("matern", 1.0, {"nu": 3.5}, ValueError, "Matern nu must be one of"),
        ("gaussian", 1.0, {"bandwidth": 2.0}, ValueError, "estimator's `bandwidth`"),
        ("cauchy", 1.0, {"power": 2}, ValueError, "Invalid kernel_params"),
        (42, 1.0, None, TypeError, "kernel must be a string"),
    ],
)
def test_make_kernel_rejects_bad_input(kernel, bandwidth, params, error, match):
    with pytest.raises(error, match=match):
        make_kernel(kernel, bandwidth, params, np.ones((3, 2)))


class Polynomial(Kernel):
    """A user-written kernel: (x.z + c)^degree."""

    extra_blocks = 0

    def __init__(self, degree=2, coef0=1.0):
        self.degree = degree
        self.coef0 = coef0

    def __call__(self, X, Z):
        return (X @ Z.T + self.coef0) ** self.degree


def test_user_kernel_subclass_passes_contract_and_clones():
    kernel = Polynomial(degree=3)
    check_kernel(kernel)
    assert clone(kernel).get_params() == {"degree": 3, "coef0": 1.0}


def test_callable_kernel_is_wrapped_and_checked(rng):
    kernel, bandwidth = make_kernel(lambda X, Z: X @ Z.T, "auto", None, rng.randn(5, 2))
    assert bandwidth is None
    X = torch.as_tensor(rng.randn(4, 2))
    np.testing.assert_allclose(kernel(X, X).numpy(), (X @ X.T).numpy())
    bad, _ = make_kernel(lambda X, Z: X, "auto", None, rng.randn(5, 2))
    with pytest.raises(ValueError, match="returned shape"):
        bad(X, X[:3])
    not_tensor, _ = make_kernel(lambda X, Z: 1.0, "auto", None, rng.randn(5, 2))
    with pytest.raises(TypeError, match=r"must return a torch\.Tensor"):
        not_tensor(X, X)


def test_check_kernel_catches_an_asymmetric_kernel():
    class Asymmetric(Kernel):
        def __call__(self, X, Z):
            return X[:, :1] + 2 * Z[:, :1].T

    with pytest.raises(AssertionError, match="not symmetric"):
        check_kernel(Asymmetric())
