"""Kernel functions: what to compute, never where or in which block sizes.

A kernel maps two tensors ``X`` (m, d) and ``Z`` (n, d) to the block ``K(X, Z)``
(m, n).  Each kernel also reports how many temporary (m, n) blocks it needs besides
its output (``extra_blocks``), so that the device planner can size blocks without
knowing any formula.

Radial kernels depend on ``d = ||x - z||`` only.  They compute the squared distance
with one matrix product on inputs augmented by two columns (the squared norms and a
column of ones), which fuses the norm terms into the product and leaves only the
kernel profile as element-wise work.  Squared distances that round to a negative
number are clamped at zero before any square root or exponential.

Centers that are used again and again (the training points of a kernel machine)
are put once into the form the kernel evaluates fastest with
:meth:`Kernel.prepare_centers`, and blocks are computed by :meth:`Kernel.block`.

Feature learning (:mod:`skgpu_kernel.agop`) needs the kernels' gradients: a radial
kernel ``k(x, z) = phi(||x - z||^2)`` has ``grad_x k(x, z) = 2 phi'(||x - z||^2) (x - z)``,
and :meth:`Kernel.gradient_kernel` returns the weight ``2 phi'`` as a kernel of its own
(:class:`GradientWeightKernel`), so that gradients are kernel products too.
"""

import math
import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, clone

__all__ = [
    "KERNEL_NAMES",
    "CallableKernel",
    "Cauchy",
    "Gaussian",
    "GradientWeightKernel",
    "Kernel",
    "Laplacian",
    "Matern",
    "RadialKernel",
    "auto_bandwidth",
    "make_kernel",
    "searches_bandwidth",
]


class Kernel(BaseEstimator):
    """Base class for kernels; subclass it to write your own.

    A subclass implements :meth:`__call__` returning the block ``K(X, Z)`` as a
    tensor on the inputs' device and dtype.  It may override :meth:`diagonal`
    (the default evaluates the kernel on pairs of equal rows) and set the class
    attributes below.  Parameters are constructor arguments stored under the same
    name, as for scikit-learn estimators, so ``get_params``, ``set_params`` and
    :func:`sklearn.base.clone` work and ``GridSearchCV`` reaches
    ``kernel__<param>``.  :func:`skgpu_kernel.testing.check_kernel` checks a
    user-written kernel against this contract.

    Attributes
    ----------
    translation_invariant : bool
        ``True`` when ``k(x + c, z + c) = k(x, z)`` for every shift ``c``; the
        estimators then centre the data, which makes squared distances in
        floating point more accurate.
    extra_blocks : int
        Number of temporary blocks of the output's size the kernel allocates while
        computing one block, used by the memory planner.
    unit_bounded : bool
        ``True`` when every value lies in [-1, 1] (the radial kernels here, which
        are 1 at distance zero and decrease): a cached kernel matrix may then be
        stored in float16 without overflow.
    uses_block_buffer : bool
        ``True`` when :meth:`prepared_block` computes the block in the ``out``
        buffer it is given; blocked loops then allocate one buffer for all blocks.
    from_distances : bool
        ``True`` when the kernel declares that its blocks are a function of the raw
        rows' squared Euclidean distances and implements
        :meth:`block_from_sq_distances`, so that blocks can be computed from squared
        distances found another way (exactly, on data on a grid:
        :mod:`skgpu_kernel.grid`).  Only a kernel that declares it reaches the grid
        operator (:class:`~skgpu_kernel.operators.GridOperator`).
    """

    translation_invariant = False
    extra_blocks = 1
    unit_bounded = False
    uses_block_buffer = False
    from_distances = False

    def __call__(self, X, Z):
        """Return the block ``K(X, Z)`` of shape (m, n) on ``X``'s device and dtype."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(X, Z).")

    def prepare_centers(self, Z):
        """Return ``Z`` in the form :meth:`block` takes, computed once per fit.

        Must act row by row (``prepare_centers(Z)[i:j]`` equals
        ``prepare_centers(Z[i:j])``) so that blocks of centers can be sliced from
        it.  The default returns ``Z``.
        """
        return Z

    def block(self, X, prepared_centers):
        """``K(X, Z)`` from centers returned by :meth:`prepare_centers`."""
        return self(X, prepared_centers)

    def prepare_rows(self, X):
        """Return rows ``X`` in the form :meth:`prepared_block` takes.

        Loops that evaluate the same rows against many blocks of centers (a cache
        fill, a kernel-vector product) prepare them once.  Must act row by row, as
        :meth:`prepare_centers` does.  The default returns ``X``.
        """
        return X

    def prepared_block(self, prepared_rows, prepared_centers, out=None):
        """``K(X, Z)`` from rows returned by :meth:`prepare_rows` and centers by :meth:`prepare_centers`.

        Parameters
        ----------
        prepared_rows : Tensor of shape (m, ...)
        prepared_centers : Tensor of shape (n, ...)
        out : Tensor of shape (m, n) or None
            A contiguous buffer the kernel may compute the block in, so that a loop
            over blocks does not allocate (and page in) fresh memory for each.
            Kernels that cannot use it ignore it.

        Returns
        -------
        Tensor of shape (m, n)
            ``out`` itself when the kernel used it.
        """
        return self.block(prepared_rows, prepared_centers)

    def block_from_sq_distances(self, sq_dists, unit, out):
        """The block of squared distances ``sq_dists * unit``, computed in ``out``.

        Parameters
        ----------
        sq_dists : Tensor of shape (m, n)
            Non-negative squared distances in units of ``unit`` (exact integers on
            data on a grid).
        unit : float
        out : Tensor of shape (m, n)
            The block's dtype and memory.
        """
        raise NotImplementedError(f"{type(self).__name__} does not compute blocks from distances.")

    def diagonal(self, X):
        """Return ``k(x_i, x_i)`` for every row of ``X`` as a 1-D tensor."""
        return torch.cat([torch.diagonal(self(chunk, chunk)) for chunk in torch.split(X, 256)])

    def require_finite(self, block, dtype):
        """Raise ``ValueError`` if ``block`` (computed by this kernel) holds inf or NaN.

        No step size can fix a kernel that overflows, and some solvers fail on such
        input with a message that does not name the cause (CUDA's ``eigh`` does).
        """
        if not torch.isfinite(block).all():
            raise ValueError(
                f"The kernel {self!r} returned non-finite values (inf or NaN) on the training data "
                f"in {dtype}; check its parameters and the scale of the data."
            )

    def gradient_kernel(self):
        """The kernel ``g`` with ``grad_x k(x, z) = g(x, z) (x - z)``, which feature learning needs.

        Only kernels that declare the derivative of their profile have one (the
        radial kernels of this module, see :meth:`RadialKernel.gradient_kernel`).

        Raises
        ------
        ValueError
            Always, for this base class: its gradient is not known.
        """
        raise ValueError(_cannot_learn_features(self, "it does not declare the derivative of its profile"))


# The methods through which a radial kernel's blocks are its profile of the raw rows'
# squared distances (see RadialKernel.from_distances).
_DISTANCE_TRANSFORMS = ("__call__", "block", "prepare_rows", "prepare_centers", "prepared_block")

# The methods that define a radial kernel's profile and its scale: a derivative
# (``_profile_derivative``) inherited from above a class that redefines one of them is
# the derivative of another function (see RadialKernel.gradient_kernel).
_PROFILE_DEFINITIONS = ("_profile_from_sq_dists", "_profile_from_scaled", "_distance_scale", "_sigma")


def _overridden_transforms(cls):
    """The distance transforms that the radial kernel class ``cls`` overrides (none: its blocks are raw distances')."""
    return [name for name in _DISTANCE_TRANSFORMS if getattr(cls, name) is not getattr(RadialKernel, name)]


def _defining_class(cls, name):
    """The class of ``cls``'s method resolution order whose body defines the attribute ``name``."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def _cannot_learn_features(kernel, reason):
    """The message of the ``ValueError`` that a kernel without a known gradient raises."""
    return (
        f"The kernel {kernel!r} cannot learn features: {reason}.  The average gradient outer product needs "
        "grad_x k(x, z) = g(x, z) (x - z), which Gaussian, Laplacian, Cauchy and Matern declare "
        "(a radial kernel of your own declares it by implementing _profile_derivative)."
    )


def _rounding_allowance(n_features, dtype):
    """Relative size of the rounding error of ``||x||^2 + ||z||^2 - 2 x.z``."""
    return 4.0 * math.sqrt(n_features + 1) * torch.finfo(dtype).eps


class RadialKernel(Kernel):
    """Base class for kernels of the distance alone, ``k(x, z) = phi(||x - z||)``.

    Squared distances come from one matrix product of augmented rows: centers are
    prepared once as ``[z, 1, c ||z||^2]`` and rows become
    ``[-2 t x, c t ||x||^2, t]`` with the kernel's distance scale ``t``, so the
    product is ``t (||x - z||^2 - allowance (||x||^2 + ||z||^2))``
    (``c = 1 - allowance``).  The allowance is the size of the expansion's rounding
    error: after clamping, distances within rounding error of zero are exactly zero
    (``k(x, x)`` is exact even for the Laplacian's square root), and each entry
    depends on its own pair of rows only.

    Subclasses implement ``_profile_from_sq_dists(self, scaled_sq_dists)``, applied in
    place to a block of squared distances divided by ``bandwidth ** 2`` (clamped at
    zero), which returns the kernel's values on that block.  Those that learn
    features (:meth:`gradient_kernel`) also implement
    ``_profile_derivative(self, scaled_sq_dists)``, the derivative of that profile
    with respect to its argument, on the same blocks and also in place.

    Parameters
    ----------
    bandwidth : float, "auto" or "scale", default="auto"
        Length scale ``sigma`` (positive).  The estimators resolve the strings from
        the data: ``"scale"`` by the rule of :func:`auto_bandwidth`, ``"auto"`` by a
        leave-one-out search around it (see the estimators' ``bandwidth``).
    """

    translation_invariant = True
    extra_blocks = 0
    unit_bounded = True
    uses_block_buffer = True

    @property
    def from_distances(self):
        """Whether the blocks are the profile of the raw rows' squared distances (see :class:`Kernel`).

        True for a subclass that keeps this class's row and center transforms: one
        that transforms its rows itself (a metric, a feature map) computes other
        distances than the grid's, and would get wrong blocks from them.  Such a
        subclass may still declare ``from_distances = True`` if its
        :meth:`block_from_sq_distances` accounts for its transform.
        """
        return not _overridden_transforms(type(self))

    def __init__(self, bandwidth="auto"):
        self.bandwidth = bandwidth

    def _sigma(self):
        bandwidth = self.bandwidth
        if isinstance(bandwidth, str):
            raise ValueError(
                f"{type(self).__name__}.bandwidth is {bandwidth!r}; resolve it with "
                "auto_bandwidth(X) or pass a positive float."
            )
        return validate_bandwidth(bandwidth)

    def __call__(self, X, Z):
        return self.block(X, self.prepare_centers(Z))

    def prepare_centers(self, Z):
        keep = 1.0 - _rounding_allowance(Z.shape[1], Z.dtype)
        z_sq = (Z * Z).sum(dim=1, keepdim=True) * keep
        return torch.cat([Z, torch.ones_like(z_sq), z_sq], dim=1)

    def block(self, X, prepared_centers):
        return self.prepared_block(self.prepare_rows(X), prepared_centers)

    def prepare_rows(self, X):
        scale = self._distance_scale()
        keep = 1.0 - _rounding_allowance(X.shape[1], X.dtype)
        x_sq = (X * X).sum(dim=1, keepdim=True) * (keep * scale)
        return torch.cat([X * (-2.0 * scale), x_sq, torch.full_like(x_sq, scale)], dim=1)

    def prepared_block(self, prepared_rows, prepared_centers, out=None):
        return self._profile_from_scaled(torch.mm(prepared_rows, prepared_centers.T, out=out))

    def block_from_sq_distances(self, sq_dists, unit, out):
        # Into out's dtype first: an integer tensor times a Python float is computed in
        # float32 (torch's default dtype), which rounded a float64 fit's entries to float32.
        return self._profile_from_scaled(out.copy_(sq_dists).mul_(self._distance_scale() * unit))

    def diagonal(self, X):
        zero = torch.zeros(1, dtype=X.dtype, device=X.device)
        return self._profile_from_sq_dists(zero).expand(X.shape[0]).clone()

    def _distance_scale(self):
        return 1.0 / self._sigma() ** 2

    def _profile_from_scaled(self, scaled_sq_dists):
        return self._profile_from_sq_dists(scaled_sq_dists.clamp_min_(0.0))

    def _profile_from_sq_dists(self, scaled_sq_dists):
        raise NotImplementedError

    def _profile_derivative(self, scaled_sq_dists):
        raise NotImplementedError

    def gradient_kernel(self):
        """The weight ``g(x, z) = 2 phi'(s)`` of the kernel's gradient, as a kernel.

        With ``k(x, z) = phi(s)``, ``s = ||x - z||^2``, the gradient in ``x`` is
        ``grad_x k(x, z) = 2 phi'(s) (x - z) = g(x, z) (x - z)``.  The gradient of
        ``f(x) = sum_j a_j k(x, z_j)`` at the rows ``X`` is then two products
        with ``G = g(X, Z)``: ``grad f(x_i) = x_i (G a)_i - (G (a * Z))_i``
        (see :func:`skgpu_kernel.agop.average_gradient_outer_product`).

        Returns
        -------
        GradientWeightKernel
            Evaluated on the same prepared rows and centers as this kernel.

        Raises
        ------
        ValueError
            For a subclass that cannot learn features: one that transforms its
            rows itself (it overrides one of ``__call__``, ``block``,
            ``prepare_rows``, ``prepare_centers``, ``prepared_block``: its gradient
            is not ``2 phi'(s) (x - z)``), or one whose profile has no declared
            derivative (``_profile_derivative``, defined by the class that defines
            the profile or by a subclass of it).

        Notes
        -----
        Where ``phi`` has no derivative at ``s = 0`` (the Laplacian, Matern with
        ``nu=0.5``: ``phi'(s)`` grows as ``s ** -0.5``), ``g`` is defined as 0
        there: a center equal to the row adds nothing to the gradient (the
        subgradient 0, as in the Recursive Feature Machines' code).
        """
        cls = type(self)
        overridden = _overridden_transforms(cls)
        if overridden:
            reason = f"it transforms its rows itself (it overrides {', '.join(overridden)}), so its gradient is unknown"
            raise ValueError(_cannot_learn_features(self, reason))
        derivative = _defining_class(cls, "_profile_derivative")
        profile = [_defining_class(cls, name) for name in _PROFILE_DEFINITIONS]
        if derivative is RadialKernel or not all(issubclass(derivative, owner) for owner in profile):
            raise ValueError(_cannot_learn_features(self, "it does not declare the derivative of its profile"))
        self._sigma()  # an unresolved bandwidth fails here rather than at the first block
        return GradientWeightKernel(self)


class GradientWeightKernel(RadialKernel):
    """The weight ``g(x, z) = 2 phi'(||x - z||^2)`` of a radial kernel's gradient, as a kernel.

    ``grad_x k(x, z) = g(x, z) (x - z)`` for the radial kernel ``k(x, z) =
    phi(||x - z||^2)`` it is made from (:meth:`RadialKernel.gradient_kernel`).
    It is a radial kernel itself, on the same prepared rows and centers, so kernel
    operators (:class:`~skgpu_kernel.operators.EvaluatedOperator`) evaluate it
    block by block like any other and the gradients of a kernel predictor are
    kernel products.  It is not a kernel to fit a model with: its values scale as
    ``1 / bandwidth ** 2`` and are negative for the kernels here, which decrease
    with the distance, and its matrices are not positive semi-definite.

    Parameters
    ----------
    kernel : RadialKernel
        The kernel differentiated; its bandwidth is this kernel's.

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> X = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    >>> Gaussian(bandwidth=1.0).gradient_kernel()(X, X)  # -exp(-s / 2): grad_x k = -k (x - z)
    tensor([[-1.0000, -0.6065],
            [-0.6065, -1.0000]], dtype=torch.float64)
    """

    unit_bounded = False
    # The Laplacian's and Matern's derivatives keep the distances and the exponential in
    # two blocks.
    extra_blocks = 1

    def __init__(self, kernel):
        self.kernel = kernel

    @property
    def bandwidth(self):
        """The differentiated kernel's bandwidth."""
        return self.kernel.bandwidth

    def _sigma(self):
        return self.kernel._sigma()

    def _profile_from_sq_dists(self, scaled_sq_dists):
        # k = psi(s / sigma^2) with psi the kernel's profile: 2 dk/ds = 2 psi'(s / sigma^2) / sigma^2.
        return self.kernel._profile_derivative(scaled_sq_dists).mul_(2.0 * self._distance_scale())


def _exp_neg_root_derivative(scaled_sq_dists):
    """``d/du exp(-sqrt(u)) = -exp(-sqrt(u)) / (2 sqrt(u))`` in place, defined as 0 at ``u = 0``.

    At ``u = 0`` the quotient is infinite (``1 / -0.0`` or ``1 / +0.0``); those
    entries, and only those, are set to 0 (the subgradient), without a mask.
    """
    root = scaled_sq_dists.sqrt_()
    derivative = torch.neg(root).exp_().div_(root.mul_(-2.0))
    return derivative.nan_to_num_(nan=math.nan, posinf=0.0, neginf=0.0)


class Gaussian(RadialKernel):
    """Gaussian kernel ``exp(-||x - z||^2 / (2 sigma^2))``.

    scikit-learn's ``rbf`` kernel ``exp(-gamma ||x - z||^2)`` is the same function
    with ``gamma = 1 / (2 sigma^2)``, i.e. ``sigma = sqrt(1 / (2 gamma))``.

    Parameters
    ----------
    bandwidth : float, "auto" or "scale", default="auto"
        The length scale ``sigma``.

    Examples
    --------
    >>> import torch
    >>> from skgpu_kernel.kernels import Gaussian
    >>> X = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> Gaussian(bandwidth=1.0)(X, X)
    tensor([[1.0000, 0.3679],
            [0.3679, 1.0000]], dtype=torch.float64)
    """

    # The product yields the exponent directly (scale -1/(2 sigma^2)), leaving two
    # element-wise passes: the clamp and the exponential.
    def _distance_scale(self):
        return -0.5 / self._sigma() ** 2

    def _profile_from_scaled(self, exponent):
        return exponent.clamp_max_(0.0).exp_()

    def _profile_from_sq_dists(self, scaled_sq_dists):
        return scaled_sq_dists.mul_(-0.5).exp_()

    def _profile_derivative(self, scaled_sq_dists):
        # d/du exp(-u / 2) = -exp(-u / 2) / 2
        return scaled_sq_dists.mul_(-0.5).exp_().mul_(-0.5)


class Laplacian(RadialKernel):
    """Laplacian kernel ``exp(-||x - z|| / sigma)``.

    It has no gradient where ``x = z``: its :meth:`~RadialKernel.gradient_kernel`
    is 0 there (the subgradient).

    Parameters
    ----------
    bandwidth : float, "auto" or "scale", default="auto"
        The length scale ``sigma``.
    """

    def _profile_from_sq_dists(self, scaled_sq_dists):
        return scaled_sq_dists.sqrt_().neg_().exp_()

    def _profile_derivative(self, scaled_sq_dists):
        return _exp_neg_root_derivative(scaled_sq_dists)


class Cauchy(RadialKernel):
    """Cauchy kernel ``1 / (1 + ||x - z||^2 / sigma^2)``.

    Parameters
    ----------
    bandwidth : float, "auto" or "scale", default="auto"
        The length scale ``sigma``.
    """

    def _profile_from_sq_dists(self, scaled_sq_dists):
        return scaled_sq_dists.add_(1.0).reciprocal_()

    def _profile_derivative(self, scaled_sq_dists):
        # d/du 1 / (1 + u) = -1 / (1 + u)^2
        return scaled_sq_dists.add_(1.0).reciprocal_().square_().neg_()


class Matern(RadialKernel):
    """Matern kernel with smoothness ``nu`` in {0.5, 1.5, 2.5}.

    With ``r = ||x - z|| / sigma``:

    * ``nu=0.5``: ``exp(-r)`` (the Laplacian kernel),
    * ``nu=1.5``: ``(1 + sqrt(3) r) exp(-sqrt(3) r)``,
    * ``nu=2.5``: ``(1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``.

    These agree with scikit-learn's ``gaussian_process.kernels.Matern`` with
    ``length_scale = sigma``.  With ``nu=0.5`` the kernel has no gradient where
    ``x = z``: its :meth:`~RadialKernel.gradient_kernel` is 0 there (the
    subgradient).

    Parameters
    ----------
    bandwidth : float, "auto" or "scale", default="auto"
        The length scale ``sigma``.
    nu : {0.5, 1.5, 2.5}, default=1.5
        Smoothness.
    """

    extra_blocks = 1
    _SUPPORTED_NU = (0.5, 1.5, 2.5)

    def __init__(self, bandwidth="auto", nu=1.5):
        super().__init__(bandwidth=bandwidth)
        self.nu = nu

    def check_nu(self):
        """Raise ``ValueError`` unless ``nu`` is one of the supported smoothness values."""
        if self.nu not in self._SUPPORTED_NU:
            raise ValueError(f"Matern nu must be one of {self._SUPPORTED_NU}, got {self.nu!r}.")

    def _profile_from_sq_dists(self, scaled_sq_dists):
        self.check_nu()
        r = scaled_sq_dists.sqrt_()
        if self.nu == 0.5:
            return r.neg_().exp_()
        root = math.sqrt(3.0) if self.nu == 1.5 else math.sqrt(5.0)
        r.mul_(root)  # r now holds sqrt(2 nu) * distance / sigma
        polynomial = 1.0 + r if self.nu == 1.5 else 1.0 + r + r * r / 3.0
        return polynomial.mul_(r.neg_().exp_())

    def _profile_derivative(self, scaled_sq_dists):
        # With r = sqrt(2 nu u), dr/du = nu / r, which cancels the factor r of each
        # polynomial's derivative: the derivatives are finite at u = 0 for nu > 0.5.
        self.check_nu()
        if self.nu == 0.5:
            return _exp_neg_root_derivative(scaled_sq_dists)
        root = math.sqrt(3.0) if self.nu == 1.5 else math.sqrt(5.0)
        r = scaled_sq_dists.sqrt_().mul_(root)
        decay = torch.neg(r).exp_()
        if self.nu == 1.5:
            # d/du (1 + r) exp(-r) = -(3/2) exp(-r)
            return decay.mul_(-1.5)
        # d/du (1 + r + r^2 / 3) exp(-r) = -(5/6) (1 + r) exp(-r)
        return decay.mul_(r.add_(1.0)).mul_(-5.0 / 6.0)

    def gradient_kernel(self):
        self.check_nu()
        return super().gradient_kernel()


class CallableKernel(Kernel):
    """Wrap a function ``func(X, Z) -> Tensor`` of two torch tensors as a kernel.

    Parameters
    ----------
    func : callable
        Returns the (m, n) block for inputs of shapes (m, d) and (n, d), on their
        device and dtype.
    """

    extra_blocks = 2

    def __init__(self, func):
        self.func = func

    def __call__(self, X, Z):
        block = self.func(X, Z)
        if not isinstance(block, torch.Tensor):
            raise TypeError(
                f"The kernel function {self.func!r} returned {type(block).__name__}; it must return a torch.Tensor."
            )
        expected = (X.shape[0], Z.shape[0])
        if tuple(block.shape) != expected:
            raise ValueError(
                f"The kernel function {self.func!r} returned shape {tuple(block.shape)} "
                f"for inputs of {X.shape[0]} and {Z.shape[0]} rows; expected {expected}."
            )
        return block.to(dtype=X.dtype)


# The bandwidths resolved from the data: "scale" by auto_bandwidth's rule, "auto" searched from it.
BANDWIDTH_RULES = ("auto", "scale")

KERNEL_NAMES = {
    "gaussian": Gaussian,
    "rbf": Gaussian,
    "laplacian": Laplacian,
    "cauchy": Cauchy,
    "matern": Matern,
}


def validate_bandwidth(bandwidth):
    """Return ``bandwidth`` as a float, or raise ``ValueError`` if not positive finite."""
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, numbers.Real):
        raise TypeError(f"bandwidth must be a positive float, 'auto' or 'scale', got {bandwidth!r}.")
    bandwidth = float(bandwidth)
    if not (math.isfinite(bandwidth) and bandwidth > 0):
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}.")
    return bandwidth


def auto_bandwidth(X):
    """Data-driven bandwidth: ``sigma = sqrt(n_features * X.var() / 2)``.

    For the Gaussian kernel this equals scikit-learn's ``gamma="scale"``
    (``gamma = 1 / (n_features * X.var())``, as in :class:`sklearn.svm.SVC`), since
    ``gamma = 1 / (2 sigma^2)``.  The typical squared distance between two points,
    ``2 n_features X.var()``, then sits at ``4 sigma^2``.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)

    Returns
    -------
    float
        The bandwidth; ``1.0`` when the data have zero variance.
    """
    variance = float(np.var(X, dtype=np.float64))
    if not variance > 0:
        return 1.0
    return math.sqrt(X.shape[1] * variance / 2.0)


def searches_bandwidth(kernel, bandwidth):
    """Whether an estimator's ``kernel`` and ``bandwidth`` ask for ``bandwidth="auto"``'s search.

    ``make_kernel`` resolves ``"auto"`` and ``"scale"`` alike, by the scale rule;
    ``"auto"`` then goes on to the leave-one-out search, which starts from it.
    """
    if isinstance(kernel, str):
        named = KERNEL_NAMES.get(kernel.lower())
        return named is not None and issubclass(named, RadialKernel) and bandwidth == "auto"
    return isinstance(kernel, RadialKernel) and kernel.bandwidth == "auto"


def bandwidth_of(kernel):
    """A resolved kernel's bandwidth: its own for a radial kernel, None for one without (as :func:`make_kernel`)."""
    return kernel.bandwidth if isinstance(kernel, RadialKernel) else None


def make_kernel(kernel, bandwidth, kernel_params, X):
    """Resolve an estimator's ``kernel`` parameter into a :class:`Kernel` instance.

    Parameters
    ----------
    kernel : str, Kernel or callable
        A name from ``KERNEL_NAMES``, a :class:`Kernel` (used as given, with its own
        parameters; an ``"auto"`` bandwidth on a radial kernel is resolved from
        ``X``), or a function of two tensors.
    bandwidth : float, "auto" or "scale"
        Used for named kernels; both strings are resolved by :func:`auto_bandwidth`.
    kernel_params : dict or None
        Extra constructor arguments for named kernels (e.g. ``{"nu": 2.5}``).
    X : ndarray
        Training data, for ``"auto"`` bandwidths.

    Returns
    -------
    kernel : Kernel
        A new object; the parameter passed in is never modified.
    bandwidth : float or None
        The resolved bandwidth, ``None`` when the kernel has none.
    """
    if isinstance(kernel, str):
        name = kernel.lower()
        if name not in KERNEL_NAMES:
            raise ValueError(
                f"Unknown kernel {kernel!r}; expected one of {sorted(KERNEL_NAMES)}, a Kernel instance or a callable."
            )
        params = dict(kernel_params or {})
        if "bandwidth" in params:
            raise ValueError("Pass the bandwidth as the estimator's `bandwidth`, not in kernel_params.")
        try:
            resolved = KERNEL_NAMES[name](bandwidth=bandwidth, **params)
        except TypeError as exc:
            raise ValueError(f"Invalid kernel_params {kernel_params!r} for kernel {kernel!r}: {exc}") from exc
    elif isinstance(kernel, Kernel):
        resolved = clone(kernel)
    elif callable(kernel):
        return CallableKernel(kernel), None
    else:
        raise TypeError(f"kernel must be a string, a Kernel or a callable, got {type(kernel).__name__}.")

    if not isinstance(resolved, RadialKernel):
        return resolved, None
    if isinstance(resolved.bandwidth, str):
        if resolved.bandwidth not in BANDWIDTH_RULES:
            raise ValueError(f"bandwidth must be a positive float, 'auto' or 'scale', got {resolved.bandwidth!r}.")
        resolved.set_params(bandwidth=auto_bandwidth(X))
    resolved.set_params(bandwidth=validate_bandwidth(resolved.bandwidth))
    if isinstance(resolved, Matern):
        resolved.check_nu()
    return resolved, resolved.bandwidth
