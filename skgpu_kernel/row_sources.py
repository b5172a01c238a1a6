"""Row sources: one read-only interface over the data a fit reads in buffers.

:func:`as_row_source` opens numpy arrays, memory maps, ``.npy`` files, scipy sparse
matrices and h5py/zarr-like datasets as a :class:`RowSource`, which reads lists of
contiguous row ranges (what a pass plan of :mod:`skgpu_kernel.buffer` asks for)
and knows its size in memory; :func:`is_out_of_core` tells which inputs are read
that way rather than held whole.  Nothing here knows about models or losses.
"""

import mmap
import os

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["RowSource", "as_row_source", "is_out_of_core"]

_NPY_MAGIC = b"\x93NUMPY"

try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds  # noqa: NPY201


def _backing_memmap(array):
    """The ``np.memmap`` of a file that ``array`` is a view of, or None."""
    obj = array
    while isinstance(obj, np.ndarray):
        if isinstance(obj, np.memmap) and getattr(obj, "_mmap", None) is not None and obj.filename:
            return obj
        obj = obj.base
    return None


def is_out_of_core(X, device_bytes=None, budget=None):
    """Whether ``X`` is read in buffers rather than held whole in memory.

    Paths, iterators and h5py/zarr-style datasets (shape, dtype and row slicing,
    but not data frames) always are.  An array backed by a memory-mapped file is
    when no ``budget`` is given, and otherwise when its device copy,
    ``device_bytes``, would take more than half of ``budget``.  In-memory arrays,
    lists, tensors and sparse matrices never are.

    Parameters
    ----------
    X : object
        Training data as the user passed it (or as validated).
    device_bytes : int, default=None
        Bytes ``X`` (with what travels with it) would take on the device.
    budget : int, default=None
        The fit's memory budget in bytes.

    Returns
    -------
    bool
    """
    if isinstance(X, (str, os.PathLike)) or hasattr(X, "__next__"):
        return True  # iterators go to the source layer, which names what it accepts
    if isinstance(X, np.ndarray):
        if not (isinstance(X, np.memmap) or _backing_memmap(X) is not None):
            return False
        return budget is None or device_bytes > budget // 2
    if isinstance(X, (list, tuple, torch.Tensor)) or sp.issparse(X):
        return False
    return all(hasattr(X, name) for name in ("shape", "dtype", "__getitem__")) and not hasattr(X, "columns")


def _file_extent(array, mapped):
    """Bytes the file behind ``mapped`` must hold so that every element of ``array`` is backed."""
    try:
        # Position of the array's last byte inside the mapping, plus the file offset
        # at which the mapping starts (np.memmap aligns it to the allocation granularity).
        mapping_start = np.frombuffer(mapped._mmap, dtype=np.uint8).ctypes.data
        _low, high = _byte_bounds(array)
        file_start = mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY
        return int(file_start + (high - mapping_start))
    except (AttributeError, BufferError, TypeError, ValueError):
        return int(getattr(mapped, "offset", 0) + array.nbytes)


def _check_numeric(dtype, name):
    if dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers (bool, integer or float), got dtype {dtype}.")


def _check_ndim(shape, name, allowed=(1, 2)):
    if len(shape) not in allowed:
        expected = " or ".join(f"{n}-D" for n in allowed)
        raise ValueError(f"{name} must be {expected}, got an array of shape {tuple(shape)}.")


class RowSource:
    """Read-only access to the rows of a data set, in ranges.

    Build one with :func:`as_row_source`, which validates the input; the
    constructor assumes validated arguments.

    Parameters
    ----------
    data : ndarray, scipy.sparse.csr_matrix or array-like
        Dense array (possibly a memory map), CSR matrix, or an object with ``shape``
        and row slicing (h5py/zarr style).
    name : str
        Used in error messages.
    kind : {"dense", "sparse", "lazy"}
    dtype : numpy.dtype
    path : str or None
        The file behind a memory map.
    owned : bool
        Whether this source opened ``data`` itself (then :meth:`close` releases it).

    Attributes
    ----------
    shape : tuple
    n_rows : int
    dtype : numpy.dtype
    is_sparse : bool
    path : str or None
        The file behind a memory map or ``.npy`` source, else None.
    name : str
    """

    def __init__(self, data, name, kind, dtype, path=None, owned=False):
        self._data = data
        self.name = name
        self._kind = kind
        self.shape = tuple(int(n) for n in data.shape)
        self.n_rows = self.shape[0]
        self.dtype = np.dtype(dtype)
        self.is_sparse = kind == "sparse"
        self.path = path
        self._owned = owned
        self._file_id = None
        self._needed_bytes = 0
        if path is not None:
            status = os.stat(path)
            self._file_id = (status.st_dev, status.st_ino)
            self._needed_bytes = _file_extent(data, _backing_memmap(data))

    def __repr__(self):
        where = f", path={self.path!r}" if self.path is not None else ""
        return f"RowSource(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, kind={self._kind!r}{where})"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    @property
    def closed(self):
        """Whether :meth:`close` was called."""
        return self._data is None

    @property
    def data(self):
        """The underlying array, memory map, CSR matrix or dataset (to read, never to write)."""
        return self._live_data()

    def _live_data(self):
        data = self._data
        if data is None:
            raise ValueError(f"{self.name}: the row source is closed.")
        return data

    def check_alive(self):
        """Raise if the file behind a memory-mapped source vanished, was replaced or shrank.

        Touching a page of a memory map beyond the end of its (truncated) file
        kills the process with SIGBUS, which no ``except`` can catch; this check
        compares the file's size with the bytes the mapping needs *before* any page
        is read.  A no-op for in-memory sources.

        Raises
        ------
        FileNotFoundError
            The file was deleted.
        OSError
            The file was replaced by another one or is now too short.
        """
        if self._file_id is None:
            return
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{self.name}: the file {self.path!r} behind the memory-mapped data was deleted while reading it."
            ) from None
        if (status.st_dev, status.st_ino) != self._file_id:
            raise OSError(f"{self.name}: the file {self.path!r} behind the memory-mapped data was replaced.")
        if status.st_size < self._needed_bytes:
            raise OSError(
                f"{self.name}: the file {self.path!r} behind the memory-mapped data shrank to "
                f"{status.st_size} bytes; its rows need {self._needed_bytes} bytes."
            )

    def _check_ranges(self, ranges):
        checked = []
        for start, stop in ranges:
            start, stop = int(start), int(stop)
            if not 0 <= start <= stop <= self.n_rows:
                raise ValueError(f"{self.name}: row range ({start}, {stop}) is outside [0, {self.n_rows}].")
            checked.append((start, stop))
        return checked

    def read(self, ranges):
        """The rows of ``ranges``, concatenated in that order, as a new array.

        Parameters
        ----------
        ranges : sequence of (int, int)
            ``(start, stop)`` row ranges.

        Returns
        -------
        ndarray or scipy.sparse.csr_matrix
            A C-contiguous array of the source dtype (dense sources) or a CSR
            matrix (sparse sources); never a view of the source.

        Examples
        --------
        >>> import numpy as np
        >>> from skgpu_kernel.row_sources import as_row_source
        >>> as_row_source(np.arange(6)).read([(4, 6), (0, 2)])
        array([4, 5, 0, 1])
        """
        ranges = self._check_ranges(ranges)
        data = self._live_data()
        if self.is_sparse:
            self.check_alive()
            parts = [data[start:stop] for start, stop in ranges]
            if not parts:
                return sp.csr_matrix((0, self.shape[1]), dtype=self.dtype)
            if len(parts) > 1:
                return sp.vstack(parts, format="csr")
            # A full-range slice may share the source's arrays; the caller must never
            # be able to modify the source through the result.
            part = parts[0]
            return part.copy() if np.may_share_memory(part.data, data.data) else part
        out = np.empty((sum(stop - start for start, stop in ranges), *self.shape[1:]), dtype=self.dtype)
        self.read_into(ranges, out)
        return out

    def read_into(self, ranges, out):
        """Copy the rows of ``ranges`` into the first rows of the host array ``out``.

        Used to fill (pinned) staging buffers without an intermediate copy.  Dense
        sources only.

        Parameters
        ----------
        ranges : sequence of (int, int)
            ``(start, stop)`` row ranges, concatenated in that order.
        out : ndarray of shape ``(>= total rows, *shape[1:])``
            Values are cast with ``casting="same_kind"``.

        Returns
        -------
        int
            Rows written.

        Examples
        --------
        >>> import numpy as np
        >>> from skgpu_kernel.row_sources import as_row_source
        >>> out = np.zeros(5)
        >>> as_row_source(np.arange(4.0)).read_into([(2, 4), (0, 1)], out)
        3
        >>> out
        array([2., 3., 0., 0., 0.])
        """
        if self.is_sparse:
            raise TypeError(f"{self.name}: read_into supports dense sources only; use read for sparse data.")
        ranges = self._check_ranges(ranges)
        data = self._live_data()
        total = sum(stop - start for start, stop in ranges)
        if out.shape[1:] != self.shape[1:] or out.shape[0] < total:
            raise ValueError(
                f"{self.name}: out of shape {out.shape} cannot hold {total} rows of shape {self.shape[1:]}."
            )
        position = 0
        for start, stop in ranges:
            count = stop - start
            # Checked per range: each range may start on pages that a shrunk file no longer backs.
            self.check_alive()
            if self._kind == "lazy":
                rows = np.asarray(data[start:stop])
                if rows.shape != (count, *self.shape[1:]):
                    raise ValueError(
                        f"{self.name}: rows [{start}:{stop}] came back with shape {rows.shape}, "
                        f"expected {(count, *self.shape[1:])}."
                    )
            else:
                rows = data[start:stop]
            np.copyto(out[position : position + count], rows, casting="same_kind")
            position += count
        return position

    def close(self):
        """Release what this source opened itself (the memory map of a ``.npy`` path).

        Objects passed in by the user are never closed, only dereferenced.  Reads
        after ``close`` raise ``ValueError``.
        """
        data, self._data = self._data, None
        if data is None or not self._owned:
            return
        mapped = _backing_memmap(data)
        handle = getattr(mapped, "_mmap", None)
        del data, mapped
        if handle is not None:
            try:
                handle.close()
            except BufferError:
                # Views that someone still holds keep the mapping alive; it is
                # unmapped when the last of them is garbage collected.
                pass


def _open_npy(path, name):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name}: no such file {path!r}.")
    if not os.path.isfile(path):
        raise ValueError(f"{name}: {path!r} is not a regular file; expected a .npy file.")
    with open(path, "rb") as handle:
        magic = handle.read(len(_NPY_MAGIC))
    if magic != _NPY_MAGIC:
        raise ValueError(f"{name}: {path!r} is not a .npy file (use numpy.save to write one).")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{name}: cannot memory-map {path!r}: {exc}") from exc
    return array


def as_row_source(data, name="X"):
    """Wrap training data in a read-only :class:`RowSource`.

    Parameters
    ----------
    data : ndarray, str, os.PathLike, scipy.sparse matrix, array-like or RowSource
        * a numpy array, including an ``np.memmap`` (its file is watched by
          :meth:`RowSource.check_alive`);
        * the path of a ``.npy`` file, opened with ``np.load(mmap_mode="r")``;
        * a scipy sparse matrix or array (CSR is kept, other formats are
          converted with ``tocsr``);
        * an object with a ``shape`` and row slicing ``data[start:stop]`` that
          returns something ``np.asarray`` accepts (h5py, zarr, ...), read lazily;
        * a list or tuple, converted with ``np.asarray``;
        * a :class:`RowSource`, returned unchanged.

        1-D or 2-D (sparse: 2-D), with a bool, integer or float dtype.
    name : str, default="X"
        Used in error messages.

    Returns
    -------
    RowSource

    Raises
    ------
    TypeError
        ``data`` is none of the above (a generator, for instance).
    FileNotFoundError
        The path does not exist.
    ValueError
        The path is not a ``.npy`` file, or the data is not 1-D/2-D or not numeric.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpu_kernel.row_sources import as_row_source
    >>> source = as_row_source(np.arange(12.0).reshape(6, 2))
    >>> source.shape, source.dtype, source.is_sparse
    ((6, 2), dtype('float64'), False)
    >>> source.read([(4, 6)])
    array([[ 8.,  9.],
           [10., 11.]])
    """
    if isinstance(data, RowSource):
        return data
    if isinstance(data, (str, os.PathLike)):
        array = _open_npy(data, name)
        _check_ndim(array.shape, name)
        _check_numeric(array.dtype, name)
        return RowSource(array, name, "dense", array.dtype, path=array.filename, owned=True)
    if sp.issparse(data):
        if data.ndim != 2:
            raise ValueError(f"{name}: sparse data must be 2-D, got shape {data.shape}.")
        _check_numeric(data.dtype, name)
        csr = data if data.format == "csr" else data.tocsr()
        return RowSource(csr, name, "sparse", csr.dtype)
    if isinstance(data, (list, tuple)):
        data = np.asarray(data)
    if isinstance(data, np.ndarray):
        _check_ndim(data.shape, name)
        _check_numeric(data.dtype, name)
        mapped = _backing_memmap(data)
        path = None if mapped is None else os.fspath(mapped.filename)
        return RowSource(data, name, "dense", data.dtype, path=path)
    if hasattr(data, "shape") and hasattr(data, "__getitem__"):
        shape = tuple(data.shape)
        _check_ndim(shape, name)
        try:
            dtype = np.dtype(data.dtype)
        except (AttributeError, TypeError):
            # No numpy dtype (a torch tensor, a DataFrame): take the one of a first slice.
            dtype = np.asarray(data[0 : min(1, shape[0])]).dtype
        _check_numeric(dtype, name)
        return RowSource(data, name, "lazy", dtype)
    raise TypeError(
        f"{name} must be a numpy array, a path to a .npy file, a scipy sparse matrix or an array-like "
        f"with `shape` and row slicing; got {type(data).__name__}."
    )
