"""IDX reading, the Fashion-MNIST loader and the main job's script."""

import gzip

import numpy as np
import pytest

from skgpu_kernel import demo
from skgpu_kernel.datasets import FASHION_MNIST_DIR, load_fashion_mnist, read_idx


def _write_idx(path, array, code=0x08):
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as stream:
        stream.write(header + array.astype(array.dtype.newbyteorder(">")).tobytes())


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_round_trip(tmp_path, suffix):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / f"images{suffix}", images)
    np.testing.assert_array_equal(read_idx(tmp_path / f"images{suffix}"), images)


def test_read_idx_rejects_bad_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    truncated = bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 3
    (tmp_path / "short").write_bytes(truncated)
    with pytest.raises(ValueError, match="header announces"):
        read_idx(tmp_path / "short")


def test_loader_scales_pixels_and_reports_missing_files(tmp_path):
    for split, n in (("train", 6), ("t10k", 4)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", np.full((n, 2, 2), 255, dtype=np.uint8))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte", np.arange(n, dtype=np.uint8))
    X_train, _, X_test, y_test = load_fashion_mnist(tmp_path)
    assert X_train.shape == (6, 4) and X_test.shape == (4, 4)
    assert X_train.dtype == np.float32 and X_train.max() == 1.0
    np.testing.assert_array_equal(y_test, np.arange(4))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")


@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_has_the_official_split():
    X_train, y_train, X_test, y_test = load_fashion_mnist()
    assert X_train.shape == (60000, 784) and X_test.shape == (10000, 784)
    assert y_test.shape == (10000,)
    assert 0.0 <= X_train.min() and X_train.max() <= 1.0
    assert set(np.unique(y_train)) == set(range(10))


def test_demo_falls_back_to_digits_with_a_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("skgpu_kernel.datasets.FASHION_MNIST_DIR", tmp_path)
    monkeypatch.setattr(demo, "load_fashion_mnist", lambda: load_fashion_mnist(tmp_path))
    model, accuracy, _ = demo.main(["--n-epochs", "3", "--verbose", "0"])
    captured = capsys.readouterr()
    assert "falling back to scikit-learn's digits" in captured.err
    assert "test accuracy" in captured.out and "batch capacity m_G" in captured.out
    assert accuracy > 0.95 and model.n_epochs_ == 3
