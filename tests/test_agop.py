"""The average gradient outer product against forward-mode autograd on the kernels' own blocks.

The references differentiate ``kernel(X, Z)`` itself with ``torch.autograd.forward_ad``
(one pass per feature: each entry depends on its own row only, so the tangent along
feature ``k`` of every row gives ``d k(x_i, z_j) / d x_ik`` for all pairs).  Reverse mode
cannot be used: the kernels compute their profiles in place, which it refuses.
"""

import math

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from sklearn.base import clone
from sklearn.utils import check_random_state

from skgpu_kernel.agop import average_gradient_outer_product, metric_from_agop, metric_transform
from skgpu_kernel.kernels import (
    CallableKernel,
    Cauchy,
    Gaussian,
    GradientWeightKernel,
    Laplacian,
    Matern,
    RadialKernel,
)
from skgpu_kernel.planning.agop import AGOP_MAX_ROWS, AGOP_MIN_ROWS, AGOPPlan, agop_rows, plan_agop

# torch registers its forward-mode decompositions with torch.jit.script on first use.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

KERNELS = {
    "gaussian": lambda: Gaussian(bandwidth=1.7),
    "laplacian": lambda: Laplacian(bandwidth=1.7),
    "cauchy": lambda: Cauchy(bandwidth=1.7),
    "matern0.5": lambda: Matern(bandwidth=1.7, nu=0.5),
    "matern1.5": lambda: Matern(bandwidth=1.7, nu=1.5),
    "matern2.5": lambda: Matern(bandwidth=1.7, nu=2.5),
}
N_ROWS, N_CENTERS, N_FEATURES = 37, 23, 4


def small_blocks_plan(n_rows, row_block=10, column_block=7):
    """All rows, in blocks smaller than the rows and the centers (blocking exercised)."""
    return AGOPPlan(n_rows, row_block, column_block, plan_agop(n_rows, N_FEATURES, N_CENTERS, 3, 8, 10**8).memory)


def autograd_gradients(kernel, X, Z, coef):
    """``grad f_l(x_i)`` of ``f = kernel(X, Z) @ coef`` by forward-mode autograd, shape (n, l, d)."""
    columns = []
    with forward_ad.dual_level():
        for feature in range(X.shape[1]):
            tangent = torch.zeros_like(X)
            tangent[:, feature] = 1.0
            block = kernel(forward_ad.make_dual(X, tangent), Z)
            columns.append(forward_ad.unpack_dual(block).tangent @ coef)
    return torch.stack(columns, dim=2)


def reference_agop(gradients, weights):
    """``sum_i w_i sum_l g g^T / sum_i w_i`` of gradients of shape (n, l, d)."""
    return torch.einsum("i,ila,ilb->ab", weights, gradients, gradients) / weights.sum()


def relative_error(got, expected):
    return float((got - expected).abs().max() / expected.abs().max())


def problem(seed, n_outputs):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(N_ROWS, N_FEATURES, generator=generator, dtype=torch.float64)
    Z = torch.randn(N_CENTERS, N_FEATURES, generator=generator, dtype=torch.float64)
    coef = torch.randn(N_CENTERS, n_outputs, generator=generator, dtype=torch.float64)
    weights = torch.rand(N_ROWS, generator=generator, dtype=torch.float64) * 3.0
    return X, Z, coef, weights


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_agop_matches_autograd(name, n_outputs, weighted):
    kernel = KERNELS[name]()
    X, Z, coef, weights = problem(0, n_outputs)
    expected = reference_agop(autograd_gradients(kernel, X, Z, coef), weights if weighted else torch.ones(N_ROWS))

    got = average_gradient_outer_product(
        kernel, X, Z, coef, sample_weight=weights if weighted else None, plan=small_blocks_plan(N_ROWS)
    )

    assert got.dtype == torch.float64 and got.shape == (N_FEATURES, N_FEATURES)
    assert relative_error(got, expected) < 1e-8


@pytest.mark.parametrize("name", ["gaussian", "laplacian", "matern2.5"])
def test_diagonal_agop_is_the_diagonal_of_the_full_one(name):
    kernel = KERNELS[name]()
    X, Z, coef, weights = problem(1, 3)
    plan = small_blocks_plan(N_ROWS)
    full = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=plan)
    diagonal = average_gradient_outer_product(kernel, X, Z, coef, weights, diagonal=True, plan=plan)
    assert diagonal.shape == (N_FEATURES,)
    np.testing.assert_allclose(diagonal.numpy(), torch.diagonal(full).numpy(), rtol=1e-12)


def test_float32_rows_give_a_float64_agop_near_float64_rows():
    X, Z, coef, weights = problem(13, 3)
    kernel = Laplacian(bandwidth=1.7)
    plan = small_blocks_plan(N_ROWS)
    expected = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=plan)
    got = average_gradient_outer_product(kernel, X.float(), Z, coef, weights, plan=plan)
    assert got.dtype == torch.float64
    assert relative_error(got, expected) < 1e-4


def test_a_vector_of_coefficients_is_one_output():
    X, Z, coef, _ = problem(2, 1)
    kernel = Gaussian(bandwidth=1.7)
    plan = small_blocks_plan(N_ROWS)
    one_column = average_gradient_outer_product(kernel, X, Z, coef, plan=plan)
    vector = average_gradient_outer_product(kernel, X, Z, coef[:, 0], plan=plan)
    np.testing.assert_array_equal(vector.numpy(), one_column.numpy())


def test_integer_weights_count_repeated_rows():
    X, Z, coef, _ = problem(3, 2)
    counts = torch.tensor([1, 2, 0, 3] * 9 + [1], dtype=torch.float64)
    kernel = Cauchy(bandwidth=1.7)
    weighted = average_gradient_outer_product(kernel, X, Z, coef, counts, plan=small_blocks_plan(N_ROWS))
    repeated = X.repeat_interleave(counts.long(), dim=0)
    expected = average_gradient_outer_product(kernel, repeated, Z, coef, plan=small_blocks_plan(repeated.shape[0]))
    assert relative_error(weighted, expected) < 1e-12


def test_the_result_does_not_depend_on_the_blocks():
    X, Z, coef, weights = problem(4, 3)
    kernel = Matern(bandwidth=1.7, nu=1.5)
    whole = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=small_blocks_plan(N_ROWS, N_ROWS, 64))
    blocked = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=small_blocks_plan(N_ROWS, 4, 5))
    assert relative_error(blocked, whole) < 1e-12


@pytest.mark.parametrize("name", ["laplacian", "matern0.5"])
def test_a_center_equal_to_the_row_adds_nothing(name):
    kernel = KERNELS[name]()
    _, Z, coef, _ = problem(5, 2)
    # Far from the origin the distance expansion cancels badly; the rounding allowance must
    # still make the row's distance to its own center exactly zero.
    Z = Z + 10.0
    row = Z[3:4].clone()
    others = torch.cat([Z[:3], Z[4:]]), torch.cat([coef[:3], coef[4:]])
    expected = reference_agop(autograd_gradients(kernel, row, *others), torch.ones(1, dtype=torch.float64))

    got = average_gradient_outer_product(kernel, row, Z, coef, plan=small_blocks_plan(1))

    assert torch.isfinite(got).all()
    assert relative_error(got, expected) < 1e-8
    assert torch.all(kernel.gradient_kernel()(Z, Z).diagonal() == 0.0)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_gradient_kernel_is_a_cloneable_radial_kernel(name):
    kernel = KERNELS[name]()
    gradient_kernel = kernel.gradient_kernel()
    assert isinstance(gradient_kernel, GradientWeightKernel)
    assert gradient_kernel.bandwidth == kernel.bandwidth
    assert gradient_kernel.get_params()["kernel"] is kernel
    X, Z, _, _ = problem(6, 1)
    torch.testing.assert_close(clone(gradient_kernel)(X, Z), gradient_kernel(X, Z), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["gaussian", "laplacian", "matern2.5"])
def test_gradient_kernel_blocks_agree_however_computed(name):
    # The kernel contract (skgpu_kernel.testing.check_kernel) but positive definiteness.
    gradient_kernel = KERNELS[name]().gradient_kernel()
    X, Z, _, _ = problem(14, 1)
    X[5] = Z[2]  # a zero distance: the Laplacian's 0 must come out of every path
    block = gradient_kernel(X, Z)
    rows, centers = gradient_kernel.prepare_rows(X), gradient_kernel.prepare_centers(Z)
    buffer = torch.full(block.shape, math.nan, dtype=torch.float64)
    sq_dists = torch.cdist(X, Z) ** 2
    for other in (
        torch.cat([gradient_kernel(X[:5], Z), gradient_kernel(X[5:], Z)]),
        gradient_kernel.prepared_block(rows, centers, out=buffer),
        gradient_kernel.block_from_sq_distances(sq_dists, 1.0, torch.empty_like(block)),
    ):
        torch.testing.assert_close(other, block, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gradient_kernel.diagonal(X), torch.diagonal(gradient_kernel(X, X)), rtol=1e-9, atol=0)


def test_agop_in_transformed_coordinates_maps_back_by_the_transform():
    # f(x) = h(x L): the AGOP of f is L AGOP_h L^T, AGOP_h computed on the rows X L.
    X, Z, coef, _ = problem(7, 2)
    generator = torch.Generator().manual_seed(7)
    root = torch.randn(N_FEATURES, N_FEATURES, generator=generator, dtype=torch.float64)
    L = metric_transform(root @ root.T / N_FEATURES)
    kernel = Laplacian(bandwidth=1.7)
    mahalanobis = CallableKernel(lambda A, B: kernel(A @ L, B @ L))
    expected = reference_agop(autograd_gradients(mahalanobis, X, Z, coef), torch.ones(N_ROWS, dtype=torch.float64))

    transformed = average_gradient_outer_product(kernel, X @ L, Z @ L, coef, plan=small_blocks_plan(N_ROWS))

    assert relative_error(L @ transformed @ L.T, expected) < 1e-8


def test_subsample_is_drawn_by_the_random_state():
    X, Z, coef, weights = problem(8, 1)
    kernel = Gaussian(bandwidth=1.7)
    plan = AGOPPlan(11, 10, 7, small_blocks_plan(N_ROWS).memory)
    chosen = np.sort(check_random_state(3).choice(N_ROWS, 11, replace=False))
    expected = average_gradient_outer_product(kernel, X[chosen], Z, coef, weights[chosen], plan=small_blocks_plan(11))

    got = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=plan, random_state=3)

    assert relative_error(got, expected) < 1e-12
    full = average_gradient_outer_product(kernel, X, Z, coef, weights, plan=small_blocks_plan(N_ROWS))
    assert relative_error(got, full) > 1e-6


def test_the_default_plan_runs_every_row():
    X, Z, coef, _ = problem(9, 1)
    kernel = Gaussian(bandwidth=1.7)
    got = average_gradient_outer_product(kernel, X, Z, coef)
    assert (
        relative_error(got, average_gradient_outer_product(kernel, X, Z, coef, plan=small_blocks_plan(N_ROWS))) < 1e-12
    )


# -- kernels that cannot learn features ------------------------------------------------


class _RowScaledGaussian(Gaussian):
    """A radial kernel that transforms its rows itself: its gradient is not 2 phi'(s) (x - z)."""

    def prepare_rows(self, X):
        return super().prepare_rows(2.0 * X)


class _NewProfile(RadialKernel):
    """A radial kernel with a profile of its own and no declared derivative."""

    def _profile_from_sq_dists(self, scaled_sq_dists):
        return scaled_sq_dists.add_(1.0).rsqrt_()


class _ChangedGaussianProfile(Gaussian):
    """A Gaussian subclass whose new profile would inherit the Gaussian's derivative."""

    def _profile_from_scaled(self, exponent):
        return exponent.clamp_max_(0.0).mul_(2.0).exp_()


@pytest.mark.parametrize(
    "kernel, named",
    [
        (CallableKernel(lambda X, Z: X @ Z.T), "CallableKernel"),
        (_RowScaledGaussian(bandwidth=1.0), "_RowScaledGaussian"),
        (_NewProfile(bandwidth=1.0), "_NewProfile"),
        (_ChangedGaussianProfile(bandwidth=1.0), "_ChangedGaussianProfile"),
        (Gaussian(bandwidth=1.0).gradient_kernel(), "GradientWeightKernel"),
    ],
    ids=["callable", "row-transform", "new-profile", "changed-profile", "second-derivative"],
)
def test_a_kernel_without_a_known_gradient_cannot_learn_features(kernel, named):
    X, Z, coef, _ = problem(10, 1)
    with pytest.raises(ValueError, match=rf"{named}.*cannot learn features"):
        kernel.gradient_kernel()
    with pytest.raises(ValueError, match="cannot learn features"):
        average_gradient_outer_product(kernel, X, Z, coef)


def test_row_transform_error_names_the_overridden_method():
    with pytest.raises(ValueError, match="prepare_rows"):
        _RowScaledGaussian(bandwidth=1.0).gradient_kernel()


def test_unresolved_bandwidth_and_unsupported_nu_fail_early():
    with pytest.raises(ValueError, match="auto_bandwidth"):
        Gaussian().gradient_kernel()
    with pytest.raises(ValueError, match="nu"):
        Matern(bandwidth=1.0, nu=3.5).gradient_kernel()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sample_weight": -torch.ones(N_ROWS)}, "non-negative"),
        ({"sample_weight": torch.zeros(N_ROWS)}, "positive sum"),
        ({"sample_weight": torch.ones(3)}, "one non-negative weight per row"),
    ],
)
def test_invalid_weights(kwargs, match):
    X, Z, coef, _ = problem(11, 1)
    with pytest.raises(ValueError, match=match):
        average_gradient_outer_product(Gaussian(bandwidth=1.0), X, Z, coef, **kwargs)


def test_invalid_shapes():
    X, Z, coef, _ = problem(12, 1)
    with pytest.raises(ValueError, match="same number of columns"):
        average_gradient_outer_product(Gaussian(bandwidth=1.0), X[:, :2], Z, coef)
    with pytest.raises(ValueError, match="one row per center"):
        average_gradient_outer_product(Gaussian(bandwidth=1.0), X, Z, coef[:5])


# -- metric helpers -------------------------------------------------------------------


def spectral_agop(eigenvalues, seed=0):
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(
        torch.randn(len(eigenvalues), len(eigenvalues), generator=generator, dtype=torch.float64)
    )
    return basis, (basis * torch.tensor(eigenvalues, dtype=torch.float64)) @ basis.T


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_metric_is_the_normalised_matrix_power(power):
    eigenvalues = [9.0, 4.0, 0.25, -1e-13]  # the negative one is rounding: clipped to 0
    basis, agop = spectral_agop(eigenvalues)
    powered = (basis * torch.tensor([max(v, 0.0) ** power for v in eigenvalues], dtype=torch.float64)) @ basis.T
    metric = metric_from_agop(agop, power=power)
    torch.testing.assert_close(metric, powered / powered.max(), rtol=1e-10, atol=1e-12)
    assert float(metric.max()) == 1.0
    assert float(torch.linalg.eigvalsh(metric).min()) > -1e-12


def test_diagonal_metric_uses_the_diagonal_only():
    agop = torch.tensor([[16.0, 3.0, 1.0], [3.0, 4.0, 2.0], [1.0, 2.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    torch.testing.assert_close(metric_from_agop(agop, diagonal=True), expected)
    torch.testing.assert_close(metric_from_agop(torch.diagonal(agop), diagonal=True), expected)
    torch.testing.assert_close(metric_from_agop(torch.diagonal(agop), diagonal=True, power=1.0), expected**2)


def test_metric_rejects_a_zero_agop_and_a_bad_power():
    with pytest.raises(ValueError, match="constant"):
        metric_from_agop(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="constant"):
        metric_from_agop(torch.zeros(3), diagonal=True)
    with pytest.raises(ValueError, match="power"):
        metric_from_agop(torch.eye(3), power=0.0)
    with pytest.raises(ValueError, match="diagonal=True"):
        metric_from_agop(torch.ones(3))


def test_metric_transform_factors_the_metric():
    _, metric = spectral_agop([3.0, 1.0, 0.5, 0.0], seed=1)
    L = metric_transform(metric)
    torch.testing.assert_close(L @ L.T, metric, rtol=1e-10, atol=1e-12)
    generator = torch.Generator().manual_seed(2)
    x, z = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(torch.sum((x @ L - z @ L) ** 2), (x - z) @ metric @ (x - z))


def test_diagonal_metric_transform_is_the_square_root():
    metric = torch.tensor([1.0, 0.25, 0.0], dtype=torch.float64)
    L = metric_transform(metric)
    torch.testing.assert_close(L, torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64))
    x, z = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([0.0, -2.0, 7.0], dtype=torch.float64)
    torch.testing.assert_close(torch.sum((x * L - z * L) ** 2), torch.sum(metric * (x - z) ** 2))


# -- planning ---------------------------------------------------------------------------


# fmt: off
ROW_CASES = [
    # (n_rows, n_features, n_centers, n_outputs, expected rows)
    (500, 20, 500, 1, 500),                 # fewer rows than the floor: all of them
    (1_000_000, 20, 20_000, 1, AGOP_MAX_ROWS),  # the cap
    (3_000, 100, 3_000, 10, AGOP_MIN_ROWS),   # the cost bound (about 300 rows) is below the floor
    # 10^5 * 1000 * 112 / (1000 * 1112 + 10 * 10^4) = 9240 rows cost one pass of K(X, Z) @ coef.
    (100_000, 100, 1_000, 10, 9240),
]
# fmt: on


@pytest.mark.parametrize("n_rows, n_features, n_centers, n_outputs, expected", ROW_CASES)
def test_agop_rows(n_rows, n_features, n_centers, n_outputs, expected):
    rows = agop_rows(n_rows, n_features, n_centers, n_outputs)
    assert rows == expected
    assert rows <= min(n_rows, AGOP_MAX_ROWS)
    if AGOP_MIN_ROWS < rows < min(n_rows, AGOP_MAX_ROWS):
        # Bound by cost: no more than one pass of the fit's product, and one row more would exceed it.
        columns = n_outputs * (n_features + 1)
        agop_row = n_centers * (n_features + 2 + columns) + n_outputs * n_features**2
        fit_pass = n_rows * n_centers * (n_features + 2 + n_outputs)
        assert rows * agop_row <= fit_pass < (rows + 1) * agop_row


@pytest.mark.parametrize("device_type, nominal", [("cpu", 512), ("cuda", 8192)])
def test_plan_agop_blocks_fit_the_budget(device_type, nominal):
    large = plan_agop(200_000, 50, 20_000, 3, itemsize=4, budget=10**10, device_type=device_type)
    assert large.n_rows == agop_rows(200_000, 50, 20_000, 3)
    assert large.row_block == nominal
    assert large.memory.fits() and large.memory["subsample"] > 0
    assert 1 <= large.column_block <= 20_000

    tight = plan_agop(200_000, 50, 20_000, 3, itemsize=4, budget=25 * 10**6, device_type=device_type)
    assert 1 <= tight.row_block < nominal
    assert tight.memory.fits()
    # As many rows as fit: one more row would exceed the budget.
    assert tight.memory.total + tight.memory["row block"] // tight.row_block > tight.memory.budget
    assert "AGOP on" in tight.describe()


def test_plan_agop_small_problem():
    plan = plan_agop(37, 4, 23, 1, itemsize=8, budget=10**9)
    assert plan.n_rows == 37 and plan.row_block == 37 and plan.column_block == 23
    assert plan.memory["subsample"] == 0
    assert plan.blocks.rows == 37 and plan.blocks.columns == 23
    assert math.isclose(plan.memory.total, sum(count for _, count in plan.memory.items))
