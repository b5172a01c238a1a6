"""Local data sets for examples and benchmarks; nothing is downloaded at run time."""

import gzip
import os
from pathlib import Path

import numpy as np

__all__ = ["FASHION_MNIST_DIR", "load_fashion_mnist", "read_idx"]

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
        Folder with the four IDX files; defaults to :data:`FASHION_MNIST_DIR`.

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
