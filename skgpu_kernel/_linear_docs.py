"""The linear models' docstrings: the parameters and attributes both share, each class's own.

Kept beside the shells (``linear_model.py``), which assign them to ``__doc__``:
the shells' code reads at once, the documentation stays whole.
"""

COMMON_PARAMETERS = """
    penalty : {"l2"} or None, default="l2"
        Adds ``alpha / 2 ||W||^2`` to the mean loss, which makes the square and Huber
        losses strongly convex (the Polyak-Lojasiewicz condition BMGD's analysis uses).
    alpha : float, default=1e-4
        Strength of the penalty.
    fit_intercept : bool, default=True
        Learn an unpenalised intercept.
    scaling_rule : {"optimal", "eigenpro", "constant", "linear", "sqrt", "legw"} or ScalingRule, \
default="optimal"
        Supplies the learning rate of each update from the batch size and the
        position in the schedule; see :mod:`skgpu_kernel.scaling`.  The default needs
        no tuning: EigenPro's analytic rule in its optimal form
        ``m / (beta + (m - 1) lambda_1)``, where ``beta`` bounds one sample's
        curvature and ``lambda_1`` is the top eigenvalue of the data's second-moment
        matrix (scaled by the loss's curvature bound, shifted by ``alpha``, estimated
        on up to 8192 sampled rows): linear in ``m`` below the critical batch
        ``m* = beta / lambda_1``, saturating at ``1 / lambda_1`` beyond.  A rule
        object is cloned, never modified; tune it with ``scaling_rule__base_lr`` in a
        grid search.
    batch_size : int or "auto", default="auto"
        Mini-batch ``m``.  ``"auto"`` measures the device's throughput-saturating
        batch ``m_G`` for this step and takes ``min(m_G, max(m*, n / 64))``: beyond
        the critical batch a larger batch gains throughput but nothing per sample, so
        it is used while a pass keeps at least 64 steps.  Larger than a buffer:
        clamped with a warning.
    buffer_size : int or "auto", default="auto"
        Rows per buffer ``n``.  ``"auto"`` fits two buffers (the one training and the
        one loading) in the memory budget; data that fits entirely is loaded once and
        stays resident.  Larger than the data: clamped with a warning.
    n_rounds : int, default=1
        Rounds ``R`` of mini-batch passes over each buffer before the next one.  R > 1
        reuses loaded data when reading is the bottleneck, at the price of a bias of
        order of the step size that vanishes with a decaying step.
    n_epochs : int, default=1000
        The most passes over the data by ``fit`` (the stopping rule, ``tol``, ends
        it sooner; a fit that runs them all before the rule is met warns with a
        ``ConvergenceWarning``), and the horizon of decaying schedules.
    shuffle : bool, default=True
        Shuffle the order of row chunks each pass and the rows of a buffer each round.
    prefetch : bool, default=True
        Load the next buffer in a background thread (on a CUDA side stream from pinned
        memory) while the current one trains.  False loads buffers on demand.
    tol : float or None, default=1e-3
        Stop when the validation score (with early stopping), else the training
        loss as a fraction of the first pass's, has not improved by more than
        ``tol`` for ``n_iter_no_change`` passes: the rule of every estimator of the
        package (:mod:`skgpu_kernel.planning.stopping`), free of the targets' scale.
        At EigenPro's analytic step (the default ``"optimal"`` and ``"eigenpro"``,
        without a decay of their own), each of the first 7 such plateaus halves the
        step instead, and the next one stops the fit (at 1/128 of the peak): at a
        constant step SGD on data the model cannot interpolate wanders around the
        optimum at a distance that grows with the step
        (``skgpu_kernel.planning.sgd.plateaus_to_anneal``).  Other rules keep
        their own schedule and stop at the first plateau.  Parallel workers judge
        it after every pass on the workers' mean loss (AdaptiveSGD: at the first
        merge of each pass) and halve the step together.  ``partial_fit`` never
        judges it (one pass per call): its step follows the rule alone.  None
        disables it.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows (random blocks of rows, so that
        reads stay sequential) and keep the coefficients of the best validation score
        (R^2 or accuracy, weighted by the held-out rows' ``sample_weight``, times
        ``class_weight`` for the classifier; held-out rows whose weights are all 0
        are refused).  ``fit`` only: ``partial_fit`` refuses it.
    validation_fraction : float in (0, 1), default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
        ``fit`` starts from the previous coefficients (its schedule restarts).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
    dtype : {"float32", "float64"}, default="float32"
        Training and prediction precision.  Results follow the input as in
        scikit-learn's linear models: ``coef_`` and ``intercept_`` are float32 when
        ``X`` is float32 and float64 otherwise, and so are the scores of
        ``predict``, ``decision_function`` and ``predict_proba`` (float64 when
        either ``X`` or the coefficients are float64).
    memory_budget : None, int or str, default=None
        Bytes (or e.g. ``"4GB"``) for the buffers on the device.  None takes 80% of
        free CUDA memory or 50% of the host's available memory.
    random_state : int, RandomState instance or None, default=None
        Seeds the chunk order, the shuffles, the sampled rows and the validation
        split.  Results are reproducible for a fixed integer, whatever the data
        source (array, memmap or ``.npy`` file).
    verbose : int, default=0
        Print the decisions taken and one line per pass with samples per second and
        I/O wait.
    parallel : DataParallel, Parle, AdaptiveSGD or None, default=None
        Train with several workers (torch.distributed processes: gloo on CPUs, NCCL
        between GPUs); see :mod:`skgpu_kernel.parallel`.  None trains in this
        process.  Inside an initialised process group (``torchrun``) the fit joins
        it instead of spawning, each rank reading its own shard.  ``tol`` applies
        to parallel fits too; early stopping (one held-out split) does not.
    polish : {"auto"} or None, default="auto"
        Finish ``fit`` with L-BFGS on the whole training set's penalised objective,
        from the SGD iterate, until its gradient certifies the objective within
        0.01% of the optimum's (``||g||^2 <= 2 alpha 10^-4 f``, by the penalty's
        strong convexity).  Near separation the log loss's curvature vanishes along
        the separating directions and stochastic steps crawl there; the polish
        reaches the optimum in tens to hundreds of iterations (two passes over the
        rows each).  The hinge's kink is rounded by smoothed copies of it, each
        narrower, in float64, until the rounding's gap is half the tolerance (the
        certificate adds it).  ``"auto"`` polishes where the schedule is the
        default's (``"optimal"`` or ``"eigenpro"`` without a decay), ``alpha > 0``,
        early stopping is off, the model is this process's (not ``parallel=``),
        and every row's scores fit the memory budget beside the buffers; the rows
        are read as SGD reads them, in memory or streamed from a file
        (``skgpu_kernel.planning.sgd.plan_polish``).  Never for ``partial_fit`` or
        another schedule.
        None: SGD alone.
"""

COMMON_ATTRIBUTES = """
    n_iter_ : int
        SGD passes run by the last call to ``fit`` (1 for ``partial_fit``).
    polish_ : PolishResult or None
        The full-batch polish of the last call (see ``polish``): ``n_iter``
        (L-BFGS iterations), ``converged``, ``excess_bound`` (the certified
        relative excess objective), ``objective`` and ``seconds``; None where it
        did not run.
    t_ : int
        Updates taken; ``partial_fit`` continues the schedule from here.
    batch_size_ : int
        Mini-batch of the last update: the planned one, halved once per
        out-of-memory error of the device.
    buffer_size_ : int
    learning_rate_ : float
        Learning rate of the last update.
    io_wait_fraction_ : float
        Fraction of the last call's time spent waiting for data.
    history_ : list of dict
        One record per pass (per merge for AdaptiveSGD) with the keys the records of
        every estimator of the package share: ``epoch``, ``n_steps`` (updates so
        far), ``train_loss`` (mean loss over the pass, each batch measured before
        its step, plus the penalty ``alpha / 2 ||W||^2`` of the coefficients at the
        end of the pass, with and without ``parallel=``), ``learning_rate`` (of the
        pass's last update), ``validation_score`` (None without early stopping) and
        ``seconds``.  Then the loop's own: ``io_wait_seconds`` and
        ``samples_per_second`` in one process, ``samples_per_second`` and
        ``bytes_all_reduced`` for DataParallel and Parle (Parle with ``tol``:
        ``workers_train_loss``, the workers' mean that ``tol`` judges; each
        worker's ``train_loss`` is its own shard's), the merge's weights and
        per-worker figures for AdaptiveSGD.
    scaling_rule_ : ScalingRule
        The resolved rule.
    spectrum_ : tuple of float
        ``(beta, lambda_1)`` the step rule saw.
    critical_batch_size_ : float
        ``beta / lambda_1``.
    batch_capacity_ : int or None
        Largest probed batch when ``batch_size="auto"``.
    throughput_probe_ : dict
        Samples per second of one SGD step by probed batch size.
    device_ : str
    dtype_ : numpy.dtype
    memory_budget_ : int
    parallel_ : ParallelStrategy or None
        The strategy used (a copy).  Parallel fits also set ``n_workers_``,
        ``communication_bytes_`` (bytes all-reduced by each worker) and, for
        :class:`~skgpu_kernel.parallel.AdaptiveSGD`, ``merge_weights_`` and
        ``worker_batch_sizes_`` (one row per merge, one column per worker); their
        ``history_`` has one record per merge with each worker's samples per second.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape ``(n_features_in_,)``
        Defined when ``X`` has string feature names.
"""

DATA_SOURCES = """
        Training data: an array, a scipy CSR matrix, an ``np.memmap``, the path of
        a ``.npy`` file (opened read-only with ``mmap_mode="r"``) or an h5py/zarr
        style dataset with ``shape`` and row slicing.  Sources other than arrays are
        read in buffers and never loaded whole."""

REGRESSOR_DOC = (
    """Linear regression by buffered mini-batch SGD (BMGD), for data larger than the device.

    Buffers of rows are loaded from memory or disk onto the device while the previous
    buffer trains for ``n_rounds`` rounds of mini-batch steps; the learning rate
    comes from a scaling rule, so that changing the batch size needs no re-tuning.

    Parameters
    ----------
    loss : {"squared_error", "huber"}, default="squared_error"
        ``(y - p)^2 / 2`` or the Huber loss, linear beyond ``epsilon``.
    epsilon : float, default=0.1
        Huber threshold.
"""
    + COMMON_PARAMETERS
    + """
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : ndarray of shape (1,) or (n_targets,)
"""
    + COMMON_ATTRIBUTES
    + """
    See Also
    --------
    BufferedSGDClassifier : The classifier.
    sklearn.linear_model.SGDRegressor : Per-sample SGD on the CPU.

    References
    ----------
    Qi, Huang, Zhu, Huang, Wang, "Mini-batch gradient descent with buffer",
    arXiv:2312.08728.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel import BufferedSGDRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(2000, 5)
    >>> y = X @ np.arange(1.0, 6.0) + 0.5
    >>> model = BufferedSGDRegressor(n_epochs=20, alpha=0.0, random_state=0).fit(X, y)
    >>> np.round(model.coef_, 2)
    array([1., 2., 3., 4., 5.]...)
"""
)

CLASSIFIER_DOC = (
    """Linear classification by buffered mini-batch SGD (BMGD), for data larger than the device.

    Multinomial logistic regression (``"log_loss"``, with :meth:`predict_proba`) or a
    one-vs-rest linear SVM (``"hinge"``), trained as :class:`BufferedSGDRegressor` is:
    buffers load while the previous one trains, and a scaling rule supplies the
    learning rate.

    Parameters
    ----------
    loss : {"log_loss", "hinge"}, default="log_loss"
        Two classes use one score column (sigmoid or a single hinge).
"""
    + COMMON_PARAMETERS
    + """    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (scikit-learn's
        semantics): a dict ``{label: weight}`` (classes not in it weigh 1), or
        ``"balanced"``, which weighs class ``c`` by ``n / (n_classes * n_c)`` with
        ``n_c`` its number of training samples (their total ``sample_weight`` when
        given).  ``fit`` reads ``y`` whole into memory whatever the source of ``X``
        (array, memmap, ``.npy`` file or dataset), so ``"balanced"`` counts every
        label; ``partial_fit`` refuses it, as scikit-learn's ``SGDClassifier``
        does: pass the weights as a dict instead.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) for two classes, else (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
"""
    + COMMON_ATTRIBUTES
    + """
    See Also
    --------
    BufferedSGDRegressor : The regressor.
    sklearn.linear_model.SGDClassifier : Per-sample SGD on the CPU (one-vs-rest).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from skgpu_kernel import BufferedSGDClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> model = make_pipeline(StandardScaler(), BufferedSGDClassifier(random_state=0))
    >>> model.fit(X[:1500], y[:1500]).score(X[1500:], y[1500:]) > 0.85
    True
"""
)
