"""Nystrom eigensystem, level choice and EigenPro's step-size rule."""

import numpy as np
import pytest
import torch

from skgpu_kernel.kernels import Gaussian
from skgpu_kernel.planning.kernel import operating_batch, preconditioner_target
from skgpu_kernel.preconditioner import (
    EigenProPreconditioner,
    Spectrum,
    choose_n_components,
    flattening_scales,
    max_usable_components,
    nystrom_eigensystem,
    plan_preconditioner,
    preconditioned_diagonal,
    preconditioned_top_eigenvalue,
)
from skgpu_kernel.scaling import eigenpro_step_size


@pytest.fixture
def data(rng):
    return torch.as_tensor(rng.randn(120, 4))


def test_nystrom_eigensystem_on_the_full_set_is_the_exact_spectrum(data):
    kernel = Gaussian(bandwidth=1.5)
    values, vectors = nystrom_eigensystem(kernel, data.float())
    gram = kernel(data, data).numpy() / data.shape[0]
    expected = np.sort(np.linalg.eigvalsh(gram))[::-1]
    np.testing.assert_allclose(values, np.clip(expected, 0, None), rtol=1e-4, atol=1e-6)
    assert vectors.dtype == torch.float64, "the eigensystem is float64 whatever the training dtype"
    # psi_i = u_i / sqrt(s): orthogonal with squared norm 1/s
    np.testing.assert_allclose((vectors.T @ vectors).numpy(), np.eye(120) / 120, atol=1e-10)


def test_a_float32_fit_decomposes_its_subsample_in_float32_within_float32_rounding(rng, monkeypatch):
    X = torch.as_tensor(rng.randn(400, 6), dtype=torch.float32)
    kernel = Gaussian(bandwidth=2.0)
    exact, _ = nystrom_eigensystem(kernel, X)
    values, vectors = nystrom_eigensystem(kernel, X, torch.float32)
    assert vectors.dtype == torch.float64
    # The eigenvalues to tens of float32 rounding errors of lambda_1 (measured: up to 9),
    # inside the 1e3 below which max_usable_components drops a direction.
    np.testing.assert_allclose(values, exact, rtol=0, atol=50 * np.finfo(np.float32).eps * exact[0])
    k = max_usable_components(exact, torch.float32)
    assert max_usable_components(values, torch.float32) == k
    # Each vector an eigenvector of K_S / s to float32's rounding: G u = lambda u.
    gram = kernel(X.double(), X.double()).numpy() / X.shape[0]
    units = vectors.numpy() * np.sqrt(X.shape[0])
    residual = gram @ units - units * values
    assert np.abs(residual).max() <= 50 * np.finfo(np.float32).eps * exact[0]
    assert np.abs(residual).max() > 1e-3 * np.finfo(np.float32).eps * exact[0], "decomposed in float32"

    # plan_preconditioner decomposes in the fit's dtype: float32 here, float64 for float64 rows.
    asked = []
    original = nystrom_eigensystem

    def recorded(kernel, rows, precision=torch.float64):
        asked.append(precision)
        return original(kernel, rows, precision)

    monkeypatch.setattr("skgpu_kernel.preconditioner.nystrom_eigensystem", recorded)
    for rows in (X, X.double()):
        plan_preconditioner(kernel, rows, 100, preconditioner_target(30), Spectrum("auto", 0.95), column_block=64)
    assert asked == [torch.float32, torch.float64]


def test_preconditioned_top_eigenvalue_formula():
    values = np.array([1.0, 0.5, 0.1, 0.01])
    assert preconditioned_top_eigenvalue(values, 0, 0.95) == 1.0
    assert preconditioned_top_eigenvalue(values, 2, 0.95) == pytest.approx(0.1**0.95)
    assert preconditioned_top_eigenvalue(values, 2, 1.0) == pytest.approx(0.1)


def test_flattening_brings_each_direction_to_the_damped_level():
    values = np.array([1.0, 0.5, 0.1, 0.01])
    scales = flattening_scales(values, 2, 1.0)
    # With damping 1 each flattened eigenvalue becomes exactly the level.
    np.testing.assert_allclose(values[:2] * (1 - values[:2] * scales), [0.1, 0.1])


def test_choose_n_components_is_the_smallest_reaching_the_target():
    values = 1.0 / np.arange(1, 101) ** 2
    beta = 1.0
    for target in [1, 5, 50, 400]:
        k = choose_n_components(values, lambda _: beta, target, 0.95, 99)
        reached = beta / preconditioned_top_eigenvalue(values, k, 0.95)
        assert reached >= target
        if k > 0:
            assert beta / preconditioned_top_eigenvalue(values, k - 1, 0.95) < target
    assert choose_n_components(values, lambda _: beta, 1e12, 0.95, 30) == 30


def test_max_usable_components_drops_unresolvable_eigenvalues():
    # Resolution: 1e3 rounding errors of the dtype relative to lambda_1.
    values = np.array([1.0, 1e-2, 1e-5, 1e-14, 0.0])
    assert max_usable_components(values, torch.float64) == 2
    assert max_usable_components(values, torch.float32) == 1


def test_step_size_rule():
    beta, top = 1.0, 0.01  # critical batch 100
    assert eigenpro_step_size(1, beta, top) == 1.0
    assert eigenpro_step_size(50, beta, top) == 50.0
    assert eigenpro_step_size(100, beta, top) == 100.0
    just_above = eigenpro_step_size(101, beta, top)
    assert just_above == pytest.approx(0.99 * 2 * 101 / (1 + 100 * 0.01))
    assert abs(just_above - 101) / 101 < 0.02, "continuous at the critical batch"
    assert eigenpro_step_size(10**6, beta, top) == pytest.approx(0.99 * 2 / top, rel=1e-3), "saturates at 2/lambda"


def test_correction_matches_the_dense_formula(data, rng):
    kernel = Gaussian(bandwidth=1.0)
    values, vectors = nystrom_eigensystem(kernel, data[:50])
    preconditioner = EigenProPreconditioner(values, vectors, 10, 0.95, torch.float64, torch.device("cpu"))
    block = kernel(data[50:70], data[:50])
    residual = torch.as_tensor(rng.randn(20, 3))
    psi = vectors[:, :10].numpy()
    expected = psi @ np.diag(flattening_scales(values, 10, 0.95)) @ psi.T @ block.numpy().T @ residual.numpy()
    np.testing.assert_allclose(preconditioner.correction(block, residual).numpy(), expected, rtol=1e-10)


@pytest.mark.parametrize("shift", [0.0, 1e-3])
def test_preconditioned_diagonal_is_that_of_the_preconditioned_kernel(data, shift):
    kernel = Gaussian(bandwidth=1.0)
    s, k, damping, diagonal_shift = 60, 8, 0.95, 0.5
    values, vectors = nystrom_eigensystem(kernel, data[:s])
    spectrum = Spectrum(k, damping, shift, diagonal_shift, eigenvalues=values + shift)  # measured on data[:s]
    diagonal = preconditioned_diagonal(kernel, data[:s], (values, vectors), data[s:], spectrum, 16, n_outside=20)
    # k_P = K + shift I - K(., S) Psi diag(D) Psi^T K(S, .) with D from the shifted eigenvalues, densely.
    psi = vectors[:, :k].numpy()
    block = kernel(data, data[:s]).numpy()
    scales = flattening_scales(values + shift, k, damping)
    dense = 1.0 + diagonal_shift - (((block @ psi) ** 2) * scales).sum(axis=1)
    assert diagonal.maximum(spectrum, k) == pytest.approx(dense.max(), rel=1e-9)
    assert diagonal.maximum(spectrum, 0) == pytest.approx(1.0 + diagonal_shift, rel=1e-12)
    subsample_only = preconditioned_diagonal(kernel, data[:s], (values, vectors), data[:0], spectrum, 16)
    assert subsample_only.maximum(spectrum, k) == pytest.approx(dense[:s].max(), rel=1e-9)


def _fit_like_problem(n=1080, d=5, seed=0):
    """The rows of ``test_accuracy_defaults``'s 1200-row fit less its validation split: 1000 of 1080 flattened."""
    rng = np.random.RandomState(seed)
    return torch.as_tensor(rng.randn(n, d))


def test_the_step_size_does_not_move_when_the_subsample_kernel_is_perturbed_at_rounding(monkeypatch):
    X = _fit_like_problem()
    kernel, spectrum = Gaussian(bandwidth=1.0), Spectrum("auto", 0.95, rows_per_epoch=X.shape[0])
    reference = plan_preconditioner(
        kernel, X, X.shape[0], preconditioner_target(X.shape[0]), spectrum, column_block=1024
    )
    assert reference.preconditioner.n_components == 1000
    eigh = torch.linalg.eigh

    def perturbed_eigh(gram):  # K_S / s with every entry moved by a few units in the last place
        noise = torch.as_tensor(np.random.RandomState(1).uniform(-4, 4, gram.shape), dtype=gram.dtype)
        noise = (noise + noise.T) * torch.finfo(gram.dtype).eps / 2
        return eigh(gram * (1 + noise))

    monkeypatch.setattr(torch.linalg, "eigh", perturbed_eigh)
    perturbed = plan_preconditioner(
        kernel, X, X.shape[0], preconditioner_target(X.shape[0]), spectrum, column_block=1024
    )
    assert perturbed.preconditioner.n_components == reference.preconditioner.n_components
    for batch in (34, 256):

        def step(plan, batch=batch):
            return eigenpro_step_size(batch, plan.beta_preconditioned, plan.top_eigenvalue_preconditioned)

        assert step(perturbed) == pytest.approx(step(reference), rel=1e-10, abs=0)
    assert perturbed.beta_preconditioned == pytest.approx(reference.beta_preconditioned, rel=1e-10, abs=0)


def test_plan_widens_the_critical_batch_to_the_target(data):
    kernel = Gaussian(bandwidth=2.0)
    plan = plan_preconditioner(kernel, data, 100, preconditioner_target(30), Spectrum("auto", 0.95), column_block=64)
    assert plan.critical_batch_preconditioned >= 2 * 30 > plan.critical_batch
    assert operating_batch(30, plan.critical_batch_preconditioned, 120) == 30
    assert plan.beta == pytest.approx(1.0)
    assert plan.beta_preconditioned <= plan.beta
    assert plan.critical_batch_preconditioned == pytest.approx(
        plan.beta_preconditioned / plan.top_eigenvalue_preconditioned
    )
    # One sample is below the critical batch: the analytic step 1 / beta_P interpolates it.
    step = eigenpro_step_size(1, plan.beta_preconditioned, plan.top_eigenvalue_preconditioned)
    assert step == pytest.approx(1 / plan.beta_preconditioned)


def test_auto_flattening_stops_where_the_critical_batch_reaches_an_epoch(rng):
    # float64 resolves the whole spectrum of a smooth kernel: without the epoch limit
    # "auto" flattens half the subsample, and m*(P) then exceeds the rows many times.
    data = torch.as_tensor(rng.uniform(-1, 1, (600, 3)))
    kernel, rows = Gaussian(bandwidth=2.0), 600
    unlimited = plan_preconditioner(
        kernel, data, 400, preconditioner_target(30), Spectrum("auto", 0.95), column_block=64
    )
    flattened = unlimited.preconditioner.n_components
    assert flattened == min(max_usable_components(unlimited.eigenvalues, torch.float64), 200)
    assert unlimited.critical_batch_preconditioned > 10 * rows

    spectrum = Spectrum("auto", 0.95, rows_per_epoch=rows)
    limited = plan_preconditioner(kernel, data, 400, preconditioner_target(30), spectrum, column_block=64)
    k = limited.preconditioner.n_components
    assert 0 < k < flattened
    assert limited.critical_batch_preconditioned >= rows
    one_fewer = Spectrum(k - 1, 0.95, rows_per_epoch=rows)
    assert (
        plan_preconditioner(
            kernel, data, 400, preconditioner_target(30), one_fewer, column_block=64
        ).critical_batch_preconditioned
        < rows
    )
    # An explicit n_components is flattened as asked, with a warning that says why it is slow.
    explicit = Spectrum(flattened, 0.95, rows_per_epoch=rows)
    with pytest.warns(RuntimeWarning, match=rf"n_components={flattened} puts the preconditioned critical batch"):
        as_asked = plan_preconditioner(kernel, data, 400, preconditioner_target(30), explicit, column_block=64)
    assert as_asked.preconditioner.n_components == flattened
