"""The kernel machines' docstrings: the parameters and attributes both share, each class's own.

Kept beside the shells (``kernel_machines.py``), which assign them to ``__doc__``:
the shells' code reads at once, the documentation stays whole.
"""

import textwrap

from .fit import solver_docs


def _solver_parameter():
    """The ``solver`` parameter's entry, its values and their paragraphs read from the solvers' registry."""
    heading, paragraphs = solver_docs()
    indent = " " * 8
    body = "\n\n".join(
        textwrap.fill(text, width=88, initial_indent=indent, subsequent_indent=indent) for text in paragraphs
    )
    return f"    {heading}\n{body}"


COMMON_PARAMETERS = """
    Parameters
    ----------
    kernel : {"gaussian", "rbf", "laplacian", "cauchy", "matern"}, Kernel or callable, \
default="gaussian"
        The kernel.  A :class:`~skgpu_kernel.kernels.Kernel` instance is used with its
        own parameters (``kernel__bandwidth`` in a grid search); a callable
        ``f(X, Z) -> Tensor`` receives torch tensors.
    bandwidth : float, "auto" or "scale", default="auto"
        Length scale ``sigma`` of a named kernel (Gaussian:
        ``exp(-||x - z||^2 / (2 sigma^2))``, i.e. scikit-learn's ``gamma = 1 / (2
        sigma^2)``), or of a :class:`~skgpu_kernel.kernels.Kernel` instance whose own
        ``bandwidth`` is one of these strings.  ``"scale"`` uses ``sqrt(n_features *
        X.var() / 2)``, which is scikit-learn's ``gamma="scale"`` (see
        :func:`~skgpu_kernel.kernels.auto_bandwidth`).  ``"auto"`` chooses it with the
        penalty: the bandwidths ``scale * 2 ** (k / 2)`` for ``k`` from -6 to 2 are
        scored by the exact leave-one-out error of the kernel ridge model on a random
        subsample of at most ``bandwidth_search_size`` rows (every one a center; for every
        penalty at once, or at the given ``alpha``), starting at the rule and walking
        downhill an octave at a time, then half an octave (five or six of the nine);
        the criterion is the classifier's misclassification rate and the regressor's
        squared error.  With more rows than that, a bandwidth wider than the rule is
        not taken (the subsample's best bandwidth is at least as wide as all rows').
        It costs about 0.4 s per bandwidth on a 2-core CPU at 1500 rows (less below);
        ``bandwidth_selection_`` records the grid, the errors and the time.  On the
        classification sets of ``benchmarks/bench_real_data.py`` it chose half an
        octave below the rule on LetterRecognition (test error 0.027 instead of
        0.031) and an octave below on Glass.
    kernel_params : dict, default=None
        Further arguments of a named kernel, e.g. ``{"nu": 2.5}`` for Matern.
    bandwidth_search_size : int >= 2 or "auto", default="auto"
        Rows the search of ``bandwidth="auto"`` scores (a seeded random subsample,
        every row a center): ``"auto"`` takes 1500
        (:func:`~skgpu_kernel.planning.kernel.plan_bandwidth_search_rows`).  Each
        bandwidth scored costs an eigendecomposition of this size, so the search's
        time grows with its cube (a 1500-row eigendecomposition takes about 0.3 s
        in float64 on a 2-core CPU): more rows buy a search closer to the fit's
        own rows when a fit is worth the time, fewer a faster one.  With more
        training rows than this, no bandwidth wider than the scale rule is taken.
        Ignored where the bandwidth is given.
    alpha : float >= 0, "auto" or "loo", default="auto"
        Ridge penalty of the one model every solver converges to:
        ``f(x) = sum_j a_j k(z_j, x) + b`` minimising ``sum_i w_i (f(x_i) - y_i)^2 +
        alpha a^T K(Z, Z) a`` with the intercept ``b`` unpenalised (the penalty on the
        sum of squared errors, as in :class:`sklearn.kernel_ridge.KernelRidge`, whose
        model is this one without ``b``).  ``0`` keeps EigenPro's
        interpolating solution, regularised by early stopping instead.  The penalty
        shifts the preconditioner's spectrum (``alpha / n`` on the eigenvalues of
        ``K / n``), so step sizes stay analytic.  ``"loo"`` chooses it as
        :class:`sklearn.linear_model.RidgeCV` does, by the exact leave-one-out error of
        a ridge model, here on the float64 Nystrom features of a random subsample
        (2000 points; exact for fewer rows than that), scored on every row up to
        100000 (beyond that the chosen ``alpha`` is kept), over per-sample penalties
        ``alpha / n`` from 1e-9 to 1, four per decade (see
        :mod:`skgpu_kernel.regularization`).  ``"auto"``: with ``n_centers``, ``"loo"``
        for the conjugate gradients (an exact solver, which without a penalty fits the
        noise: 2.4 times the error of ``"loo"`` on the HI data set) and ``0`` for
        EigenPro 3, whose SGD has no penalty.  With every training point a center,
        ``"loo"`` where the Nystrom features capture at least 95% of the kernel's
        trace (``alpha_selection_.coverage``, measured on rows outside the subsample),
        ``0`` with early stopping otherwise: a Nystrom model that misses more of the
        kernel is not the model being fitted, and the criterion takes the signal it
        misses for noise (Fashion-MNIST: coverage 0.87, and its penalty cost 1.5
        points of accuracy; the tabular sets of ``benchmarks/bench_real_data.py``:
        0.97 to 0.998, where it beat early stopping by up to 7%).  Below that
        coverage, a fit of at most 1.78 times the rows that ``bandwidth="auto"``
        scored exactly takes the search's ``alpha`` as it is instead
        (``alpha_selection_.carried``; DNA, coverage 0.475: 9% lower test error).  The classifier's
        criterion is the leave-one-out misclassification rate (among the penalties
        within a standard error of the lowest rate, the smallest squared error of
        the codes wins), and with unequal sample weights
        (``class_weight`` included) its penalty is always scored: a model that
        interpolates, or stops early on the way there, fits every training label
        whatever its weight.  The value used is
        ``alpha_``.
    fit_intercept : bool, default=True
        Fit the unpenalised intercept ``b`` of the model (``intercept_``).  Adding a
        constant to ``y`` then shifts the predictions by that constant and changes
        nothing else.  With a penalty (``alpha_ > 0``) and no held-out split, ``b``
        is fitted with the kernel part by every solver, as the leave-one-out
        criterion scores it: the targets are solved for together with a column of
        ones, and ``b`` makes the weighted residuals sum to zero.  Without a penalty
        (an interpolating or early-stopped fit, where ``b`` is not determined), or
        where held-out rows score every epoch, ``b`` is the targets' (the
        classifier's codes') weighted mean.  With a narrow kernel the mean is a poor
        intercept far from the data (Ionosphere: test error 0.28 with the mean,
        0.070 fitted).
    n_epochs : int, default=100
        Upper bound on the passes over the training data; the fit stops earlier when
        it has converged (see ``early_stopping`` and ``tol``); ``n_epochs_`` and
        ``history_`` say when and why.
    batch_size : int or "auto", default="auto"
        ``"auto"`` takes the device's measured batch capacity ``m_G``, kept at most
        half the preconditioned critical batch ``m*(P)`` (a stability margin).  An
        integer fixes the batch (the step size still follows ``scaling_rule``),
        which also makes fits reproducible across machines.
    n_components : int or "auto", default="auto"
        Number ``k`` of top eigendirections the preconditioner flattens (the paper's
        ``q`` is ``k + 1``).  ``"auto"`` takes at least the smallest ``k`` whose
        preconditioned critical batch reaches twice the batch capacity, and flattens
        up to half the subsample's directions (all of them when the subsample is
        every training row; at most 1000, only those resolvable in ``dtype``),
        which costs little per step and improves accuracy per epoch,
        but never beyond the first ``k`` whose preconditioned critical batch reaches
        the training rows (past it the flattened directions converge by less than
        a factor e per epoch).
        ``0`` turns preconditioning off.
    subsample_size : int or "auto", default="auto"
        Nystrom subsample for the eigensystem: ``min(n, 2000)`` up to 100k samples,
        ``min(n, 5000)`` beyond.
    damping : float in (0, 1], default=0.95
        Exponent ``a`` of the spectral flattening.
    scaling_rule : {"eigenpro", "constant", "linear", "sqrt", "legw"} or ScalingRule, \
default="eigenpro"
        Step size of each update as a function of the batch size and of the update
        count; see :mod:`skgpu_kernel.scaling`.  The default is EigenPro's analytic
        step from the preconditioned spectrum, ``m / beta`` up to the critical batch
        and saturating near ``2 / lambda_1`` beyond, which needs no tuning.  A name
        takes the rule's defaults; a rule object is used (cloned) with its own
        parameters, e.g. ``EigenProRule(scale=0.5, decay="exponential")``, or
        ``ConstantRule(base_lr=...)`` searched as ``scaling_rule__base_lr``.  The
        schedule's horizon is ``n_epochs``; with ``warm_start`` the update count
        continues from the previous fit, so a decaying schedule resumes where it
        stopped.
    early_stopping : bool or "auto", default="auto"
        ``True`` holds out ``validation_fraction`` of the data (stratified for
        classifiers) and stops when the validation score (R^2 or accuracy) has not
        improved by more than ``tol`` for ``n_iter_no_change`` epochs, keeping the best
        coefficients.  ``False`` trains on all the data and stops when the training
        loss, as a fraction of the zero model's loss, has not fallen by more than
        ``tol`` for ``n_iter_no_change`` epochs (scikit-learn's ``SGDRegressor`` rule on
        a scale-free loss).  ``"auto"`` is ``True`` when ``alpha_ == 0`` and there are
        at least 1000 samples (then the iteration heads for the interpolant and
        held-out data decides when to stop), and ``False`` otherwise (a penalised
        loss converges by itself; small data are cheap to fit) or when a
        memory-mapped ``X`` is streamed.  The resolved choice is ``early_stopping_``.
    validation_fraction : float in (0, 1), default=0.1
    n_iter_no_change : int, default=3
    tol : float or None, default=1e-4
        Smallest gain that counts as progress (see ``early_stopping``).  ``None`` runs
        all ``n_epochs`` (with a validation split, the best coefficients are still
        kept).
    device : {"auto", "cpu", "cuda", "cuda:N"}, torch.device or list, default="auto"
        ``"auto"`` is CUDA when available.  A list of devices (EigenPro 3 only,
        e.g. ``["cuda:0", "cuda:1"]``) splits the centers in one shard per device;
        the first holds the coefficients and predicts.
    dtype : {"float32", "float64"}, default="float32"
        Training and prediction precision; the eigensystem is always float64.
        Results follow the input as in scikit-learn's linear models:
        ``dual_coef_`` and ``intercept_`` are float32 when ``X`` is float32 and
        float64 otherwise, and so are the predictions and ``decision_function``
        (float64 when either ``X`` or the coefficients are float64).
    memory_budget : None, int or str, default=None
        Bytes (or a string such as ``"4GB"``) the fit may use on the device.  None
        takes 80% of free CUDA memory (including torch's cached blocks) or 50% of the
        host's available memory.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffling, the Nystrom subsample and the validation split.
    verbose : int, default=0
        Print the decisions taken and one line per epoch.
    warm_start : bool, default=False
        Continue from the previous coefficients; ``X`` must be the same data (and,
        with ``n_centers`` or ``centers``, the centers the same).
    n_centers : "auto", int or None, default="auto"
        How many centers the model has.  ``"auto"`` keeps a center at every
        training point while EigenPro 2 can hold ``K(X, X)`` in ``memory_budget``
        (float16 entries allowed) or there are at most 20000 rows, and beyond that
        draws ``p = max(2000, 10 sqrt(n))`` centers (Falkon's ``sqrt(n)`` rule, ten
        times over, never fewer than the Nystroem baseline's 2000): lowered to the
        largest ``p`` whose ``K(X, Z)`` CG can store in the budget when that leaves
        at least 2000, otherwise kept and trained by EigenPro 3.  Where it keeps
        every point and ``feature_learning`` runs, the smaller model on ``max(2000,
        10 sqrt(n))`` centers is scored on the same held-out rows, and every point
        is kept only where it is more accurate there beyond one standard error of
        the paired differences: a model predicts in time proportional to its
        centers (:func:`~skgpu_kernel.planning.agop.plan_smaller_model`).  To buy
        the larger model whatever the held-out rows say, set None (or an integer).
        ``verbose`` says which and why; ``n_centers_`` holds the count.  None puts a center at
        every training point (EigenPro 2, or CG for small penalised problems).  An
        integer ``p`` takes a seeded uniform draw of ``p`` distinct training rows
        as centers (clamped to ``n`` with a warning; a repeated row adds nothing to
        the model but makes ``K(Z, Z)`` singular), fitted by CG (``solver``) or by
        EigenPro 3: batches take EigenPro 2 steps with their rows as temporary
        centers, which are projected onto the span of the centers every
        ``n_temporary_centers_`` rows, so memory grows with ``p``, not ``n``.  The
        Nystrom subsample is the first ``subsample_size`` centers.  See
        :ref:`large_kernel_models`.
    centers : array-like of shape (p, n_features), default=None
        Explicit centers for EigenPro 3 (finite; not together with ``n_centers``).
        The spectrum that sets the step size is estimated on them, so they should
        resemble the data.
    cache_kernel : bool or "auto", default="auto"
        Compute the kernel rows the steps read once and reuse them every epoch.
        EigenPro 2: ``K(X, X)``, with the validation rows' ``K(X_val, X)`` (n x
        (n + n_val) entries), filled in blocks on and below the diagonal and
        mirrored; an epoch then reads it instead of evaluating the kernel (60000
        Fashion-MNIST rows: seconds instead of tens of seconds per epoch on a
        2-core CPU).  ``"auto"`` caches in ``dtype`` when that fits
        ``memory_budget`` next to the fixed costs, else in float16 when ``dtype`` is
        float32 and that fits (measured to leave accuracy unchanged), else computes
        blocks per batch; the choice is ``kernel_cache_dtype_``.  EigenPro 3:
        ``K(X, centers)`` (n x p in ``dtype``, per device its shard's columns),
        cached by ``"auto"`` when it fits (unless only one of the cache and the
        exact projection fits: the projection is preferred).  ``True`` raises a
        ``ValueError`` when it does not fit (or when ``X`` is streamed); ``False``
        always recomputes.
    kernel_cache_dtype : {"auto", "float16", "float32", "float64"}, default="auto"
        How EigenPro 2's ``K(X, X)`` cache is stored.  ``"auto"``: in ``dtype``
        where that fits, else in float16 for a float32 fit of a kernel with values
        in [-1, 1] (the radial kernels), which on the real-data benchmark left test
        errors within 0.06% (regression) or within their spread over seeds
        (classification) and fitted 10-25% faster.  A named dtype stores it in that
        dtype only (at most as wide as ``dtype``; float16 for the radial kernels
        only), and the cache is otherwise not kept.  The choice made is
        ``kernel_cache_dtype_``.
    projection : {"auto", "exact", "iterative"}, default="auto"
        EigenPro 3's projection onto the span of the centers.  ``"exact"``
        factorises ``K(centers, centers)`` once (float64 Cholesky in place, about
        ``9 p^2`` bytes with the blocks that fill it); ``"iterative"`` runs
        full-batch EigenPro 2 iterations on the centers (step measured by power
        iteration) to a 1% residual and carries what is left into the next
        projection, with no ``p x p`` matrix unless ``K(centers, centers)`` fits
        the budget (then cached).  ``"auto"`` is exact when it fits
        ``memory_budget``, before the kernel cache: the iterative projection
        costs up to 100 passes over ``K(centers, centers)`` each time.
SOLVER_PARAMETER
    distributed : bool, default=False
        EigenPro 3 only: shard the centers over the ranks of the initialised
        default ``torch.distributed`` process group (torchrun).  Every rank must
        call ``fit`` with the same data and parameters; each computes its shard's
        kernel columns, predictions and gradients are all-reduced, and every rank
        ends with the whole model.  ``device`` is then this rank's device.
    feature_learning : {"auto", "diagonal", "full"} or None, default="auto"
        Learn a metric of the features from the average gradient outer product
        (AGOP) of the fitted predictor, as Recursive Feature Machines and xRFM do
        (see ``skgpu_kernel.fit.feature_learning`` and the user guide):
        ``"diagonal"`` learns one scale per feature (and, for a categorical
        column, a block over its levels), ``"full"`` a Mahalanobis metric.
        ``"auto"`` is ``"diagonal"`` from 2000 rows in memory, in one process, for
        a kernel that declares its gradient, and no learning
        otherwise: measured on the real-data benchmark, learning never paid
        below, where it cost 1.3-3x the fit time
        (:func:`~skgpu_kernel.planning.agop.plan_feature_learning`); the choice is
        ``feature_learning_``.  Above 30000 rows the candidates are fitted on a
        seeded subsample sized by their cost
        (:func:`~skgpu_kernel.planning.agop.plan_learning_rows`), and only the
        one kept on every row.  From 8000 training rows, with ``n_centers="auto"``,
        the candidates are models on ``max(2000, 10 sqrt(n))`` centers
        (:func:`~skgpu_kernel.planning.agop.plan_path_centers`), and the model's size
        is chosen after its metric (``n_centers``).  ``validation_fraction`` of the rows (stratified
        for the classifier) score the plain model (candidate 0) and the learning path's models (the
        Laplacian kernel for a named kernel, your own kernel instance otherwise,
        with ``M = I`` and then each learnt metric, at the bandwidth and ``alpha``
        its rules chose for the first); a learnt model is kept only where its
        held-out losses are lower beyond their noise, and the chosen one is fitted
        again on every row.  Each fit runs through any solver.  Needs a kernel that
        declares its gradient (the radial kernels).  None: no learning.
    feature_learning_iter : int, default=5
        The most metric updates; the path also stops after two fits without a lower
        held-out loss.
    categorical_features : "from_dtype", array-like of bool, int or str, or None, \
default="from_dtype"
        The categorical columns of ``X``, as in
        :class:`~sklearn.ensemble.HistGradientBoostingRegressor`.
        ``"from_dtype"``: a DataFrame's ``category``, boolean and string columns (and
        object columns of strings), and a numpy object array's columns of strings; a
        boolean mask, integer indices or column names choose them; None: none.  Each
        becomes one 0/1 column per level seen in ``fit`` (one column for two levels),
        the 255 most frequent levels keeping their own and the rest sharing one;
        missing values are a level of their own; a level unknown at ``predict`` is
        zeros across its block, equidistant from every known level in the plain
        kernel.  Numeric columns may hold NaN (imputed by
        the training mean, with an indicator column where ``fit`` saw any), and are
        standardized when they are in different units (``column_scaling``).  A
        column of dates or times, and under ``"from_dtype"`` an object column
        mixing numbers and strings, is refused by name.  See :ref:`tables` and
        ``skgpu_kernel.tables``.
    column_scaling : {"auto", "standardize", "none"}, default="auto"
        Whether the numeric columns are standardized (their weighted training mean
        and standard deviation): ``"auto"`` where they are in different units, by
        :func:`~skgpu_kernel.planning.columns.plan_column_scaling`, and kept where
        they are already scaled or share one range (images, counts); the other two
        decide it, for example so that the folds of a cross-validation near the
        rule's thresholds cannot differ.  A memory-mapped ``X`` is read as it is
        unless ``"standardize"`` (which copies it).  The result is
        ``column_scaling_``.
""".replace("SOLVER_PARAMETER", _solver_parameter())

REFERENCES = """    References
    ----------
    .. [1] S. Ma and M. Belkin, "Kernel machines that adapt to GPUs for effective
       large batch training", SysML 2019. arXiv:1806.06144.
"""

COMMON_ATTRIBUTES = """
    device_ : str
        Device the model was trained on.
    dtype_ : numpy.dtype
        Training precision.
    memory_budget_ : int
        Bytes the fit planned with.
    kernel_ : Kernel
        The kernel with its resolved bandwidth.
    bandwidth_ : float or None
        Resolved bandwidth (None for kernels without one).
    X_offset_ : ndarray of shape (n_features,) or None
        Feature means subtracted before evaluating translation-invariant kernels.
    subsample_size_ : int
        Size ``s`` of the Nystrom subsample.
    top_eigenvalues_ : ndarray of shape ``(n_components_ + 1,)``
        Top eigenvalues of ``K / n`` estimated on the subsample, down to the level.
    n_components_ : int
        Number of flattened eigendirections.
    batch_capacity_ : int
        Measured batch capacity ``m_G`` of the device (or the given batch size).
    throughput_probe_ : dict
        Samples per second of kernel-block products by probed batch size.
    critical_batch_size_ : tuple of float
        ``(beta / lambda_1, beta / lambda_1')``: before and after preconditioning.
    batch_size_ : int
        Batch size used (after any halving on out-of-memory).
    scaling_rule_ : ScalingRule
        The resolved scaling rule (a copy of ``scaling_rule``).
    learning_rate_ : float
        Step size ``eta`` of the last update, at ``batch_size_``: the scaling rule's,
        halved once per divergence rollback.
    n_epochs_ : int
        Epochs run by the last call to ``fit`` (fewer than ``n_epochs`` when it
        stopped on convergence).
    intercept_ : float or ndarray of shape (n_outputs,)
        The unpenalised intercept added to the kernel model's output (see
        ``fit_intercept``; zero without it); an array for the classifier and for
        2-D targets.  In
        ``X``'s precision, as ``dual_coef_`` (see ``dtype``).
    alpha_ : float
        The ridge penalty used (``alpha`` resolved).  Where float rounding stops
        ``solver="cg"`` above its stated residual, the fit is redone from where it
        ended with ten times the penalty (at most three times, each with a
        ``ConvergenceWarning``), and ``alpha_`` is the penalty it ended with.
    fit_attempts_ : list of dict
        The record of what the last ``fit`` tried, in order.  Every solver run, the
        one that made the model last: ``{"solver": ..., "alpha": ..., "reason":
        ...}``, the reason being ``"planned"`` for the first and, for each later
        one, why the one before gave way (CG broken down by rounding and refitted
        with a larger penalty; CG on every point that diverged, refitted with its
        16-bit kernel cache in the training dtype or a larger penalty; EigenPro
        refitted with fewer preconditioner components; a model worse than the
        trivial predictor at the last check, refitted by the same changes; CG on
        every point too ill-conditioned and fitted by EigenPro 2, with a warning
        where the user named ``solver="cg"``; a kernel cache the device refused,
        fitted without it).  Where every attempt failed the last check, the fit
        keeps the trivial model (the intercept) with a ``ConvergenceWarning``.
        ``solver_`` and ``alpha_`` are the last run's.  Entries with an ``"event"``
        key are not solver runs: each time a stage ran out of device memory and
        went on smaller, ``{"event": "out_of_memory", "stage": ..., "solver": ...,
        "shrank": ..., "from": ..., "to": ..., "reason": ...}``, after the run it
        happened in (before the first run for the fits and AGOP of feature
        learning).  ``stage`` is ``"cache fill"`` (``shrank`` names the cache;
        ``"cached"`` to ``"evaluated"``: its blocks computed per product, or the fit
        planned again without it, the next entry), ``"preconditioner subsample"``
        (``subsample_size`` halved), ``"agop"`` (its row block halved),
        ``"validation"`` (the held-out rows' row block halved), ``"epoch batch"``
        (``batch_size`` halved); ``reason`` is the error's first line.  A block
        halved keeps the model, up to rounding; a smaller subsample or batch
        changes the fit's path.  Each halving of an EigenPro loop's step after a
        divergence is ``{"event": "diverged", "stage": "epoch", "solver": ...,
        "changed": "step size factor", "from": ..., "to": ..., "reason": ...}``.  A
        feature-learning fit whose handed tuning did not apply tuned again:
        ``{"event": "ran_again", "stage": "tune", "solver": None, "reason": ...}``.
        (Out of memory while predicting, the row block is halved too and a
        ``RuntimeWarning`` says so: predicting changes no fitted attribute.)
    fit_check_ : dict or None
        The last check of the fitted model against the trivial predictor: on at
        most 4096 evenly spaced rows of the early-stopping split where the fit has
        one (``"held_out"``; a classifier's ``"score"`` is then its
        misclassification, with the squared error of its codes in
        ``"squared_error"``), else the weighted squared error on at most 1024
        training rows; ``{"n_rows", "held_out", "score", "model_loss",
        "trivial_loss", "standard_error", "seconds", "passed", "better"}``.  A
        model worse than the trivial one by more than two standard errors is
        refitted (``fit_attempts_``), and so is an unpenalised ``alpha="auto"``
        model not better than it beyond noise (with the criterion's penalty).
        None under a process group (``distributed=True``).
    alpha_selection_ : AlphaSelection or None
        With ``alpha="auto"`` or ``"loo"`` and a solver that takes a penalty: the
        leave-one-out errors of the candidate penalties behind ``alpha_`` and the
        features' coverage of the kernel; where ``"auto"`` found the coverage too
        low, the bandwidth search's exact criterion carried over (``carried=True``,
        with that coverage) or that coverage alone (``scored=False``)
        (:class:`skgpu_kernel.regularization.AlphaSelection`); None otherwise.
    bandwidth_selection_ : BandwidthSelection or None
        With ``bandwidth="auto"`` on a radial kernel: the bandwidths scored, their
        leave-one-out errors (NaN where not scored), the choice and the search's
        seconds (:class:`skgpu_kernel.regularization.BandwidthSelection`); None
        otherwise.
    early_stopping_ : bool
        Whether the fit held out a validation split (``early_stopping`` resolved;
        ``"auto"`` never holds one out for the CG solver, which converges to its
        exact solution).
    solver_ : str
        The solver used (``solver`` resolved: ``"eigenpro"``, ``"cg"``,
        ``"direct"`` or another registered solver's name).  ``"direct"`` (named,
        or from ``solver="auto"`` with every training point a center and ``alpha_
        > 0``): the exact kernel ridge solution, from the leave-one-out criterion's
        eigendecomposition where it scored every training row (at most 2000), else
        from one Cholesky factorisation of ``K + alpha W^-1`` (at most 10000 rows
        whose ``n x n`` float64 matrices fit ``memory_budget``); no iterative
        solver ran (``n_epochs_`` 0, an empty ``history_``; ``n_epochs``, an
        iteration bound, does not apply).  With ``"cg"`` the EigenPro decisions
        (``subsample_size_``, ``top_eigenvalues_``, ``n_components_``,
        ``batch_capacity_``, ``critical_batch_size_``, ``batch_size_``,
        ``learning_rate_``, ``projection_``) are None, and each ``history_`` record
        is a CG iteration (one pass over the data).  CG with every point a center
        beyond 10000 rows keeps EigenPro 2's subsample (for its preconditioner) and
        kernel cache: ``subsample_size_``, ``kernel_cached_`` and
        ``kernel_cache_dtype_`` are set.
    n_epochs_total_ : int
        Epochs run since the last fit without ``warm_start``.
    n_steps_total_ : int
        Updates made since the last fit without ``warm_start``: the count the
        scaling rule's schedule continues from.
    history_ : list of dict
        One record per epoch with the keys every estimator of the package shares
        (``skgpu_kernel.solvers.epochs.CORE_KEYS``): ``epoch``, ``n_steps``
        (updates made so far), ``train_loss`` (the mean squared residual of the
        centred targets over the epoch's batches, each measured before its step,
        plus the batches' shares of the penalty ``alpha a^T K a`` per sample), ``learning_rate`` (step
        size of the epoch's last update, at the epoch's batch size),
        ``validation_score`` (R^2 or accuracy on the held-out split; None without
        early stopping) and ``seconds``.
    centers_ : ndarray of shape ``(n_centers_, n_features)``
        Centers: the training points in the order of the internal shuffle
        (EigenPro 2), or the drawn or given centers (EigenPro 3).
    dual_coef_ : ndarray of shape ``(n_centers_, n_outputs)``
        Coefficients ``alpha`` of ``f(x) = sum_j alpha_j k(c_j, x)``.
    n_centers_ : int
        Number of centers ``p``.
    projection_ : {"exact", "iterative"} or None
        How EigenPro 3 projected onto the centers (None for EigenPro 2).
    kernel_cached_ : bool
        Whether the kernel rows the solver read (``K(X, X)`` for EigenPro 2 and CG on
        every point, with the validation rows' ``K(X_val, X)``; ``K(X, centers_)``
        for EigenPro 3 and CG on centers) were computed once and reused, see
        ``cache_kernel`` (the operator plan's storage, whatever the solver).
    kernel_cache_dtype_ : {"float64", "float32", "float16"} or None
        How the cached kernel was stored (None when not cached).
    kernel_grid_step_ : float or None
        When the fit's kernel blocks (EigenPro 2's and 3's caches or steps, CG's
        passes) came from exact squared distances because every feature of the rows
        and centers lies on a common grid of at most 256 levels (8-bit images,
        counts, codes), that grid's step; None otherwise (see
        :mod:`skgpu_kernel.grid` and
        :func:`skgpu_kernel.planning.operator.plan_operator`).  The distances are
        the same to the bit whether the device multiplies the codes in int8 or in
        float32, whichever is faster.  Predictions then take exact distances too,
        for rows that lie on the same grid (the test rows of 8-bit images); other
        rows take float blocks.
    streamed_ : bool
        Whether the memory-mapped ``X`` was streamed in buffers (EigenPro 3 only).
    n_temporary_centers_ : int
        Rows kept as temporary centers between projections (0 for EigenPro 2),
        from a cost model that balances their kernel work against the
        projection's cost.
    n_projections_ : int
        Projections made by the last fit (0 for EigenPro 2).
    feature_learning_ : {"diagonal", "full"} or None
        The feature learning the fit ran (``"auto"`` resolved); None: none.
    metric_ : ndarray of shape (n_encoded, n_encoded) or None
        The learnt metric ``M`` of the kernel ``k(||x - z||_M)`` on the encoded
        columns (``table_encoding_``; a categorical column's levels one block, with
        no entries to the other columns), the identity where a model without a
        learnt metric was kept; None where no learning ran.
    metric_transform_ : ndarray of shape (n_features,) or (n_features, n_features), or None
        ``L`` with ``M = L L^T`` (a vector for a diagonal ``L``): the model is the
        plain kernel machine on the rows ``X L``, in which ``centers_``,
        ``X_offset_`` and ``dual_coef_`` are expressed; None where no metric is
        applied.
    feature_importances_ : ndarray of shape (n_features,)
        Each input column's share of the learnt squared distances: ``M_jj`` times the
        variance of the column the kernel sees, ``tr(M_BB Cov_BB)`` over the block
        ``B`` of columns a category becomes, normalised to sum to 1 (for ``SelectFromModel``); it does not depend
        on a column's units.  Defined only where feature learning ran
        (``feature_learning_`` not None).
    table_encoding_ : TableEncoding
        How each input column became columns of the matrix the kernel sees (the
        encoded matrix of ``centers_``, ``metric_`` and ``dual_coef_``; see
        :class:`skgpu_kernel.tables.TableEncoding`).
    is_categorical_ : ndarray of shape (n_features,), bool
        The input columns taken as categorical (``categorical_features`` resolved).
    column_scaling_ : {"standardize", "none"}
        Whether the numeric columns were standardized on the training rows, or kept
        in their units (already scaled, or sharing one range: see
        :func:`skgpu_kernel.planning.columns.plan_column_scaling`).
    feature_learning_scores_ : list of float or None
        The held-out score (R^2 or accuracy) of each candidate: 0 the plain model,
        then the learning path's (its kernel with ``M = I``, then each learnt metric).
    feature_learning_iteration_ : int or None
        The candidate kept (0: the plain model).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape ``(n_features,)``
        Defined when ``X`` has string feature names.
"""

REGRESSOR_DOC = (
    """Kernel regression by EigenPro 2: preconditioned SGD sized for the device.

    The model ``f(x) = sum_j alpha_j k(x_j, x)`` has a center at every training
    point and is trained on the square loss by mini-batch SGD with the EigenPro
    preconditioner.  Batch size and step size are derived from the kernel spectrum
    and from the device's measured capacity (memory and throughput); every decision
    is recorded in a fitted attribute.
"""
    + COMMON_PARAMETERS
    + """
    Attributes
    ----------"""
    + COMMON_ATTRIBUTES
    + """
    See Also
    --------
    AdaptiveKernelClassifier : The same machine for classification.
    sklearn.kernel_ridge.KernelRidge : Exact solve in O(n^3) time and O(n^2) memory.

"""
    + REFERENCES
    + """
    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel import AdaptiveKernelRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(200, 2))
    >>> y = np.sin(3 * X[:, 0]) + X[:, 1] ** 2
    >>> model = AdaptiveKernelRegressor(bandwidth=0.5, n_epochs=20, random_state=0).fit(X, y)
    >>> bool(model.score(X, y) > 0.99)
    True
    """
)

CLASSIFIER_DOC = (
    """Kernel classification by EigenPro 2: preconditioned SGD sized for the device.

    Regression on the square loss with targets ``+-1`` (binary) or one-hot columns
    (multiclass); ``predict`` takes the sign or the argmax of the scores returned by
    ``decision_function``.  The scores are not probabilities: ``predict_proba``
    scales them by a temperature fitted on rows a model of the same kernel did not
    train on (``calibration_temperature_``; the user guide's "Class probabilities").
"""
    + COMMON_PARAMETERS
    + """    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (scikit-learn's
        semantics): a dict ``{label: weight}`` (classes not in it weigh 1), or
        ``"balanced"``, which weighs class ``c`` by ``n / (n_classes * n_c)`` with
        ``n_c`` its number of training samples (their total ``sample_weight`` when
        given), so that every class carries the same weight in the square loss.
        The weights also enter the intercept.
        With ``alpha="auto"`` they get a penalty chosen by the weighted
        leave-one-out misclassification rate, whatever the features' coverage:
        without one the model fits every training label and the weights change
        little (on digits with two classes cut to a tenth and 20% of the labels
        noisy, ``"balanced"`` raised those classes' recall by 0.21 on average over
        three splits; see ``tests/test_bandwidth_selection.py``).  They weigh the
        probabilities' calibration too: ``predict_proba`` is then calibrated to the
        reweighted population (with ``"balanced"``, one where every class is as
        frequent), not to the class frequencies of the data.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    calibration_temperature_ : float
        ``T`` of :meth:`predict_proba` (``sigmoid(s / T)``, ``softmax(S / T)``): the
        temperature of least weighted log loss on decision values of rows that a
        model of the final kernel and metric did not train on (``calibration_``).
        See the user guide's "Class probabilities".
    calibration_ : {"held-out", "final-held-out", "cross-fitted", "none"}
        Where those decision values came from
        (:func:`~skgpu_kernel.planning.agop.plan_calibration`): up to 30000 rows,
        ``validation_fraction`` of the rows held out from the chosen candidate of
        feature learning or from one extra fit of the plain model (the model itself
        is the fit on every row); above, 2000 rows the final model is fitted
        without; under 100 rows, five folds cross-fitted; ``"none"`` (``T = 1``, and
        ``predict_proba`` warns) for data streamed from a file and over a process
        group.  With ``class_weight`` or ``sample_weight`` the temperature is
        calibrated to the reweighted population.
        A warm start keeps the temperature and ``calibration_`` of the fit it continues."""
    + COMMON_ATTRIBUTES
    + """
    See Also
    --------
    AdaptiveKernelRegressor : The same machine for regression.
    sklearn.calibration.CalibratedClassifierCV : Other calibrations of the scores.

"""
    + REFERENCES
    + """
    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from skgpu_kernel import AdaptiveKernelClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> model = AdaptiveKernelClassifier(random_state=0).fit(X[:1000] / 16, y[:1000])
    >>> bool(model.score(X[1000:] / 16, y[1000:]) > 0.95)
    True
    """
)
