"""Data on a common grid: exact squared distances from 8-bit integer products.

Many data sets keep every feature on a grid of one common step: 8-bit images scaled
by 1/255, counts, one-hot and ordinal codes.  When each feature spans at most 255
steps, its values are ``origin_j + step * c`` with integers ``c`` in 0..255, which fit
in int8 once shifted by 128.  A squared distance is then ``step**2`` times the
integer ``||a||^2 + ||b||^2 - 2 a.b``, computed exactly by an int8 product summed in
int32, where the float expansion loses digits to cancellation; and processors with
8-bit dot-product instructions (AVX-512 VNNI, tensor cores) run that product several
times faster than a float32 one.  On the 2-core AMD EPYC we develop on,
``torch._int_mm`` at a cache fill's blocks (2048 x 784 by 784 x 512) ran at 710-840
G multiply-adds x 2 per second against ``torch.mm``'s 160-200 GFLOP/s in float32.

Data found on a grid always take its exact distances, whatever the device, so that
a model does not depend on a speed measurement: the integer product of the codes is
computed either by ``torch._int_mm`` or by float32 products of the codes in chunks
of at most ``FLOAT_EXACT_INNER`` features, where every partial sum is an integer
below ``2**24`` and so exact (:func:`integer_sq_distances`).  Both give the same
int32 distances to the bit; which runs is a matter of speed only, measured on the
device (``skgpu_kernel.device.integer_matmul_speedup``, through
``skgpu_kernel.operators.measure_operator``) at the blocks a product evaluates, and
:func:`integer_products_pay` is the one rule that reads it (the fit through
``skgpu_kernel.planning.operator.plan_operator``, ``predict`` directly).  Processors
without 8-bit dot-product instructions (AVX2 only) take the float32 products.
"""

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch

from .device import cuda_int8_shape
from .operator_facts import INTEGER_PRODUCTS_MIN_SPEEDUP, Grid, integer_products_pay, padded_features

__all__ = [
    "FLOAT_EXACT_INNER",
    "INTEGER_PRODUCTS_MIN_SPEEDUP",
    "Grid",
    "GridCodes",
    "encode_on_grid",
    "find_grid",
    "integer_products_pay",
    "integer_sq_distances",
    "padded_features",
]


# Codes of at most this many features multiply exactly in float32: every partial sum
# of products of codes in -128..127 stays within 1024 * 128**2 = 2**24, float32's
# last exact integer, in any summation order (TF32 and bf16 inputs hold the codes too).
FLOAT_EXACT_INNER = 1024

# Codes c - 128 of the values origin + step * c, c in 0..CODE_LEVELS - 1, fill int8.
CODE_LEVELS = 256
_CODE_SHIFT = 128
# Rows of the sample whose sorted values propose the step, and rows checked at once.
_STEP_SAMPLE_ROWS = 2048
_CHECK_ROWS = 8192


@dataclass(frozen=True)
class GridCodes:
    """Rows of data on a grid: ``X = origin + step * (codes + 128)``, exactly.

    Attributes
    ----------
    codes_t : Tensor of shape (d', m) and dtype int8
        The codes, transposed: the int8 product reads its right-hand side fastest
        contiguous, and a block of rows for the left-hand side is a small copy
        (:meth:`row_block`).  The features are zero-padded to a multiple of 8, which
        leaves distances as they are.
    sq_norms : Tensor of shape (m,) and dtype int32
        Each row's sum of squared codes.
    step : float
    integer_products : bool, default=True
        Products of the codes by ``torch._int_mm`` (else by exact float32 products:
        the same bits, see :func:`integer_sq_distances`); the grid's choice.
    """

    codes_t: torch.Tensor
    sq_norms: torch.Tensor
    step: float
    integer_products: bool = True

    def __len__(self):
        return self.codes_t.shape[1]

    def row_block(self, start, stop):
        """``(codes, sq_norms)`` of rows ``start:stop``, the codes as a contiguous (rows, d') tensor."""
        rows = self.take(slice(start, stop))
        return rows.codes_t.T.contiguous(), rows.sq_norms

    def take(self, rows):
        """The ``GridCodes`` of ``rows`` (a slice, or a tensor of indices gathered once)."""
        if isinstance(rows, slice):
            return dataclasses.replace(self, codes_t=self.codes_t[:, rows], sq_norms=self.sq_norms[rows])
        # Gathered into (rows, d') order: the transposed view's row blocks are then free.
        codes = self.codes_t.index_select(1, rows).T.contiguous()
        return dataclasses.replace(self, codes_t=codes.T, sq_norms=self.sq_norms.index_select(0, rows))


def find_grid(X):
    """The grid every feature of ``X`` lies on within rounding, or None.

    The step is proposed by the smallest gap between distinct values of one feature
    in a sample of rows, and set to the widest feature's span over its number of
    such gaps; it qualifies when every feature spans at most 255 steps and every value
    is within rounding (a few units in the last place of the data's magnitude) of
    its feature's minimum plus a whole number of steps.  Continuous data fails at
    once (its smallest gap is tiny against its span).

    Parameters
    ----------
    X : Tensor of shape (n, d), float

    Returns
    -------
    Grid or None
    """
    if X.shape[0] == 0 or X.shape[1] == 0 or not _sums_fit_int32(X.shape[1]):
        return None
    low, high = X.amin(dim=0), X.amax(dim=0)
    tolerance = _tolerance(X, low, high)
    step = _proposed_step(X[:_STEP_SAMPLE_ROWS], tolerance)
    widest = float((high - low).max())
    if step is None or not math.isfinite(widest / step) or round(widest / step) > CODE_LEVELS - 1:
        return None
    # The widest feature's span over its number of steps: a gap of two rounded values
    # is off by their rounding, which 255 steps would multiply.
    grid = Grid(widest / round(widest / step), low)
    if not _squares_are_normal(grid.step, X.shape[1]):
        return None
    for start in range(0, X.shape[0], _CHECK_ROWS):
        if _off_grid(X[start : start + _CHECK_ROWS], grid, tolerance):
            return None
    return grid


def encode_on_grid(X, grid, checked=False):
    """``GridCodes`` of ``X`` on ``grid``, or None when a value lies off it or outside its 256 levels.

    ``checked``: ``X`` is the data :func:`find_grid` found ``grid`` on, whose values it
    has already checked, so they are not checked a second time.
    """
    tolerance = _tolerance(X, X.amin(dim=0), X.amax(dim=0)) if X.shape[0] and not checked else 0.0
    n_features = X.shape[1]
    codes_t = torch.zeros(padded_features(n_features), X.shape[0], dtype=torch.int8, device=X.device)
    sq_norms = torch.empty(X.shape[0], dtype=torch.int32, device=X.device)
    for start in range(0, X.shape[0], _CHECK_ROWS):
        rows = X[start : start + _CHECK_ROWS]
        levels = _levels(rows, grid)
        if not checked and (
            _off_grid(rows, grid, tolerance, levels) or levels.min() < 0 or levels.max() > CODE_LEVELS - 1
        ):
            return None
        codes = (levels - _CODE_SHIFT).to(torch.int32)
        sq_norms[start : start + rows.shape[0]] = (codes * codes).sum(dim=1, dtype=torch.int32)
        codes_t[:n_features, start : start + rows.shape[0]] = codes.T
    return GridCodes(codes_t, sq_norms, grid.step, grid.integer_products)


def integer_sq_distances(rows, row_sq_norms, centers_t, center_sq_norms, out, float_products=None):
    """Exact squared distances, in grid steps squared, of rows to centers, into ``out``.

    The product of the codes is exact either way, so the distances are the same to
    the bit: by ``torch._int_mm`` summed in int32, or, given ``float_products``, by
    float32 products over chunks of at most ``FLOAT_EXACT_INNER`` (1024) features.

    Parameters
    ----------
    rows : Tensor of shape (m, d'), int8
        Codes of the rows (:meth:`GridCodes.row_block`).
    row_sq_norms : Tensor of shape (m,), int32
    centers_t : Tensor of shape (d', n), int8
        The centers' codes, transposed (``codes_t`` of :class:`GridCodes`).
    center_sq_norms : Tensor of shape (n,), int32
    out : Tensor of shape (m, n), int32
    float_products : Tensor of shape (m, n), float32, or None
        Memory for the float32 products; None: ``torch._int_mm``.

    Returns
    -------
    Tensor
        ``out``.
    """
    if float_products is None:
        _int8_product(rows, centers_t, out)
    else:
        _exact_float_product(rows, centers_t, out, float_products)
    return out.mul_(-2).add_(row_sq_norms[:, None]).add_(center_sq_norms[None, :])


def _exact_float_product(left, right, out, products):
    """``left @ right`` of int8 codes, exactly, into the int32 ``out``, through float32 ``products``."""
    inner = left.shape[1]
    for start in range(0, inner, FLOAT_EXACT_INNER):
        stop = min(start + FLOAT_EXACT_INNER, inner)
        torch.mm(left[:, start:stop].float(), right[start:stop].float(), out=products)
        if start == 0:
            out.copy_(products)
        else:
            out.add_(products.to(torch.int32))
    if inner == 0:
        out.zero_()
    return out


def _int8_product(left, right, out, pad=None):
    """``left @ right`` summed exactly in int32, into ``out``.

    ``pad`` (by default on CUDA) pads the outer sizes to the shapes CUDA's
    ``torch._int_mm`` takes and copies ``right`` column-major: cuBLASLt's int8
    product reads its right factor transposed, and refuses a row-major one
    (CUBLAS_STATUS_NOT_SUPPORTED on an H200 at 1400 x 64 by 64 x 56, for one).
    The inner size is a multiple of 8 already (:class:`GridCodes`).
    """
    m, n = left.shape[0], right.shape[1]
    if not (left.device.type == "cuda" if pad is None else pad):
        return torch._int_mm(left, right, out=out)
    rows, columns = cuda_int8_shape(m, n)
    padded_left = torch.nn.functional.pad(left, (0, 0, 0, rows - m)) if rows > m else left
    right_t = right.new_zeros(columns, right.shape[0])  # row-major right.T: right column-major
    right_t[:n] = right.T
    out.copy_(torch._int_mm(padded_left, right_t.T)[:m, :n])
    return out


def _largest_sum(n_features):
    """A bound on ``||a||^2 + ||b||^2 - 2 a.b`` (and each term) for codes in -128..127."""
    return 4 * n_features * _CODE_SHIFT**2


def _sums_fit_int32(n_features):
    """The squared distances and their terms stay below 2**31."""
    return _largest_sum(n_features) < 2**31


def _squares_are_normal(step, n_features):
    """``step**2`` times any squared distance in codes is a normal float64 (neither 0 nor inf)."""
    unit = step * step
    return sys.float_info.min <= unit and unit * _largest_sum(n_features) <= sys.float_info.max


def _tolerance(X, low, high):
    """How far from the grid rounding may put a value: a few units in the last place of the data's size."""
    magnitude = max(float(low.abs().max()), float(high.abs().max())) if low.numel() else 0.0
    return 16.0 * torch.finfo(X.dtype).eps * magnitude


def _proposed_step(sample, tolerance):
    """The smallest gap above ``tolerance`` between sorted values of one feature of ``sample``."""
    gaps = torch.diff(torch.sort(sample, dim=0).values, dim=0)
    gaps = gaps[gaps > tolerance]
    if gaps.numel() == 0:
        return None
    return float(gaps.min())


def _levels(X, grid):
    return torch.round((X - grid.origin) / grid.step)


def _off_grid(X, grid, tolerance, levels=None):
    levels = _levels(X, grid) if levels is None else levels
    return bool(((grid.origin + levels * grid.step - X).abs() > tolerance).any())
