"""Sphinx configuration for the skgpu_kernel documentation.

Build (from the repository root)::

    python -m sphinx -b html doc doc/_build/html -W --keep-going

Environment variables:

``SKGPU_DOC_RUN_EXAMPLES=1``
    Execute the gallery examples (off by default: a plain build only renders their
    source, so it needs neither a GPU nor the data sets the examples load).
``SKGPU_DOC_INTERSPHINX=1``
    Link to the Python, NumPy, SciPy, scikit-learn and PyTorch docs.  Off by default
    because fetching the inventories needs network access.
"""

import importlib
import os
import shutil
from pathlib import Path

import skgpu_kernel

DOC_DIR = Path(__file__).resolve().parent
REPO_DIR = DOC_DIR.parent

# -- Project information ---------------------------------------------------------

project = "skgpu_kernel"
author = "skgpu_kernel developers"
copyright = "skgpu_kernel developers"
release = skgpu_kernel.__version__
version = ".".join(release.split(".")[:2])

# -- General configuration -------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "_api_*.rst", "Thumbs.db", ".DS_Store"]
root_doc = "index"
default_role = "literal"
nitpicky = False

# -- Optional API modules --------------------------------------------------------
#
# skgpu_kernel.testing is documented only when it can be imported, so that the build
# passes with -W whether or not the module exists yet.  Its autosummary lives in
# _api_testing.rst, which is excluded as a standalone page and appended to api.rst
# by the source-read hook in setup() below.


def _importable(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


HAS_TESTING = _importable("skgpu_kernel.testing") and hasattr(
    importlib.import_module("skgpu_kernel.testing"), "check_kernel"
)
if not HAS_TESTING:
    # Stale stubs from an earlier build would fail to import.
    exclude_patterns.append("generated/skgpu_kernel.testing.*")

# -- autodoc / autosummary / numpydoc --------------------------------------------

autosummary_generate = ["api.rst"] + (["_api_testing.rst"] if HAS_TESTING else [])
autosummary_imported_members = False
autodoc_default_options = {"member-order": "groupwise"}
autodoc_typehints = "none"

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# -- intersphinx -----------------------------------------------------------------

if os.environ.get("SKGPU_DOC_INTERSPHINX", "0") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "scipy": ("https://docs.scipy.org/doc/scipy", None),
        "sklearn": ("https://scikit-learn.org/stable", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
    }
else:
    intersphinx_mapping = {}

# -- sphinx-gallery --------------------------------------------------------------
#
# sphinx-gallery requires a header file (GALLERY_HEADER.rst or README.txt) in the
# examples folder.  When ../examples has none (or does not exist yet), its scripts
# are copied into a staging folder under _build together with gallery_header.txt,
# so that the build works either way.

_GALLERY_HEADERS = ("GALLERY_HEADER.rst", "GALLERY_HEADER.txt", "README.rst", "README.txt", "readme.rst", "readme.txt")


def _examples_dir():
    examples = REPO_DIR / "examples"
    if examples.is_dir() and any((examples / name).is_file() for name in _GALLERY_HEADERS):
        return "../examples"
    staged = DOC_DIR / "_build" / "gallery_src"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    if examples.is_dir():
        for path in examples.iterdir():
            if path.is_file() and not path.name.startswith("."):
                shutil.copy2(path, staged / path.name)
    shutil.copy2(DOC_DIR / "gallery_header.txt", staged / "README.txt")
    return os.path.relpath(staged, DOC_DIR)


sphinx_gallery_conf = {
    "examples_dirs": _examples_dir(),
    "gallery_dirs": "auto_examples",
    "filename_pattern": "/plot_",
    "plot_gallery": os.environ.get("SKGPU_DOC_RUN_EXAMPLES", "0") == "1",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
}

# -- HTML output -----------------------------------------------------------------

try:
    import pydata_sphinx_theme  # noqa: F401
except ImportError:
    html_theme = "alabaster"
    html_theme_options = {}
else:
    html_theme = "pydata_sphinx_theme"
    html_theme_options = {
        "navigation_with_keys": False,
        "show_toc_level": 2,
    }

html_title = f"skgpu_kernel {release}"
html_static_path = []
html_show_sourcelink = False


def _append_testing_api(app, docname, source):
    if docname == "api" and HAS_TESTING:
        source[0] += "\n\n.. include:: _api_testing.rst\n"


def setup(app):
    app.connect("source-read", _append_testing_api)
