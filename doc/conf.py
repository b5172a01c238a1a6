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

import os

import skgpu_kernel

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
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"
default_role = "literal"
nitpicky = False

# -- autodoc / autosummary / numpydoc --------------------------------------------

autosummary_generate = ["api.rst"]
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

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
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
