"""Contract checks for user-written pluggable objects: kernels and scaling rules.

Each check raises an ``AssertionError`` naming the first broken rule of the
contract, so it can be called from a user's own test suite.
"""

import math
import pickle

import joblib
import numpy as np
import torch
from sklearn.base import clone

from .scaling import ScalingRule, ScheduleContext

__all__ = ["check_kernel", "check_scaling_rule"]


def check_kernel(kernel, n_features=3, dtype=torch.float64, random_state=0):
    """Check that ``kernel`` honours the :class:`~skgpu_kernel.kernels.Kernel` contract.

    Checks that the block has the right shape, dtype and device, that the kernel is
    symmetric and positive semi-definite on a small sample, that ``diagonal`` agrees
    with the block's diagonal, that blocks do not depend on how rows are chunked,
    that prepared rows and centers give the same blocks (with and without an
    ``out`` buffer) and are prepared row by row, and that ``clone`` reproduces
    the kernel's parameters.

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
    rows = kernel.prepare_rows(X)
    assert torch.equal(rows[3:7], kernel.prepare_rows(X[3:7])), f"{kernel!r}: prepare_rows must act row by row"
    buffer = torch.full((17, 11), float("nan"), dtype=dtype, device=X.device)
    for out in (None, buffer):
        assert torch.allclose(kernel.prepared_block(rows, prepared, out=out), block, rtol=tolerance, atol=tolerance), (
            f"{kernel!r}: prepared_block(prepare_rows(X), prepare_centers(Z)) differs from K(X, Z) "
            f"({'without' if out is None else 'with'} an out buffer)"
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


def check_scaling_rule(rule, batch_sizes=(1, 32, 1000), n_steps=40, beta=1.0, top_eigenvalue=0.01):
    """Check that ``rule`` honours the :class:`~skgpu_kernel.scaling.ScalingRule` contract.

    For every batch size, over ``n_steps`` updates that run past the decay horizon
    (4 epochs of a 3-epoch run, plus one update far beyond), checks that the rule
    returns finite, non-negative Python floats, as does ``peak_lr``; that it is
    deterministic; that ``schedule`` equals the per-update calls with the right
    shape and dtype; that calling it changes neither ``get_params()`` nor any
    other attribute (rules hold no training state); and that ``clone`` and a
    pickle round trip reproduce the schedule.  A rule with ``requires_spectrum``
    receives ``beta`` and ``top_eigenvalue``; any other rule gets no spectrum.

    Parameters
    ----------
    rule : ScalingRule
    batch_sizes : sequence of int, default=(1, 32, 1000)
    n_steps : int, default=40
    beta, top_eigenvalue : float, default=1.0, 0.01
        The spectrum given to rules that require it.

    Raises
    ------
    AssertionError
        Naming the first broken rule.

    Examples
    --------
    >>> from skgpu_kernel.scaling import LEGW
    >>> from skgpu_kernel.testing import check_scaling_rule
    >>> check_scaling_rule(LEGW(base_lr=0.1, decay="exponential"))
    """
    assert isinstance(rule, ScalingRule), f"{rule!r} is a {type(rule).__name__}, not a ScalingRule"
    state_before = joblib.hash(vars(rule))
    params_before = joblib.hash(rule.get_params())
    spectrum = (beta, top_eigenvalue) if rule.requires_spectrum else (None, None)
    n_epochs, steps_per_epoch = 3.0, n_steps / 4.0
    twins = {"clone": clone(rule), "pickle": pickle.loads(pickle.dumps(rule))}

    for batch_size in batch_sizes:
        context = ScheduleContext(batch_size, steps_per_epoch, n_epochs, beta=spectrum[0], top_eigenvalue=spectrum[1])
        where = f"{rule!r} at batch size {batch_size}"
        rates = [rule(step, context) for step in range(n_steps)] + [rule(10**9, context)]
        for step, rate in zip([*range(n_steps), 10**9], rates, strict=True):
            _assert_rate(rate, f"{where}, update {step}")
        _assert_rate(rule.peak_lr(context), f"{where}: peak_lr")
        again = [rule(step, context) for step in range(n_steps)] + [rule(10**9, context)]
        assert again == rates, f"{where} is not deterministic: a second pass gave other learning rates"

        schedule = rule.schedule(
            batch_size,
            n_steps,
            steps_per_epoch=steps_per_epoch,
            n_epochs=n_epochs,
            beta=spectrum[0],
            top_eigenvalue=spectrum[1],
        )
        assert isinstance(schedule, np.ndarray) and schedule.dtype == np.float64, (
            f"{where}: schedule() must return a float64 ndarray, got {type(schedule).__name__}"
            f" of {getattr(schedule, 'dtype', None)}"
        )
        assert schedule.shape == (n_steps,), f"{where}: schedule() has shape {schedule.shape}, expected ({n_steps},)"
        assert np.array_equal(schedule, rates[:n_steps]), f"{where}: schedule() differs from the per-update calls"
        for how, twin in twins.items():
            assert [twin(step, context) for step in range(n_steps)] == rates[:n_steps], (
                f"{where}: the {how}d rule computes another schedule"
            )

    assert joblib.hash(rule.get_params()) == params_before, (
        f"{rule!r}: computing learning rates changed get_params(); rules must hold no training state"
    )
    assert joblib.hash(vars(rule)) == state_before, (
        f"{rule!r}: computing learning rates changed its attributes; rules must hold no training state "
        "(the update count comes in as the step argument)"
    )
    assert joblib.hash(twins["clone"].get_params()) == params_before, f"clone({rule!r}) changed its parameters"


def _assert_rate(rate, where):
    assert type(rate) is float, f"{where}: returned {type(rate).__name__}, not a Python float (use float(...))"
    assert math.isfinite(rate) and rate >= 0, f"{where}: the learning rate {rate!r} is not finite and >= 0"
