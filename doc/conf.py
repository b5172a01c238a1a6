"""Sphinx configuration for the skgpu_kernel documentation.

Build (from the repository root)::

    python -m sphinx -W --keep-going -b html doc doc/_build/html

(CI runs it with ``SKGPU_DOC_RUN_EXAMPLES=1``, then ``python doc/check_html.py
doc/_build/html --examples examples``; ``-D plot_gallery=0`` gives a quick build
without the examples' output).

Environment variables:

``SKGPU_DOC_RUN_EXAMPLES=1``
    Execute the gallery examples and show their plots (about 4 minutes on a 2-core
    CPU; CI does).  Off by default: a plain build only renders their source.  One
    example uses Fashion-MNIST when it is installed and scikit-learn's digits
    otherwise.  ``-D plot_gallery=1`` or ``-D plot_gallery=0`` on the command
    line overrides it.
``SKGPU_DOC_INTERSPHINX=1``
    Link to the Python, NumPy, SciPy, scikit-learn and PyTorch docs.  Off by default
    because fetching the inventories needs network access.
"""

import os
import sys
from pathlib import Path

import skgpu_kernel

# "How a fit runs" shows the stages of a fit as a figure drawn here at every build
# (matplotlib only, offline), so that it names the modules of the code it documents.
sys.path.insert(0, str(Path(__file__).parent))
from fit_stages_figure import draw as draw_fit_stages

draw_fit_stages(Path(__file__).parent / "_generated" / "fit_stages.png")

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
    # MathJax's files copied into the built site (``_static/mathjax``) from the
    # sphinx-mathjax-offline package of the doc extra, so formulas render without
    # network access; sphinx.ext.mathjax alone loads MathJax from a CDN at view time.
    "sphinx-mathjax-offline",
    "sphinx_gallery.gen_gallery",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"
default_role = "literal"
# Every cross reference must resolve: with ``-W`` a broken one fails the build.
nitpicky = True

# -- autodoc / autosummary / numpydoc --------------------------------------------

autosummary_generate = [
    "api/estimators.rst",
    "api/kernels.rst",
    "api/scaling_rules.rst",
    "api/parallel.rst",
    "api/data.rst",
    "api/planning.rst",
]
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
    # Without the inventories, references to these projects cannot resolve: they are
    # rendered as unlinked code, and only they are exempt from the nitpicky check.
    nitpick_ignore_regex = [(r"py:.*", r"(sklearn|numpy|scipy|torch|tracemalloc)(\..*)?")]

# -- sphinx-gallery --------------------------------------------------------------

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": "/plot_",
    # A string, as sphinx-gallery's own default ("True"): ``-D plot_gallery=0`` on the
    # command line gives a string too, and Sphinx warns when the two types differ.
    "plot_gallery": str(os.environ.get("SKGPU_DOC_RUN_EXAMPLES", "0") == "1"),
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    # The summary pages of execution times load jQuery and DataTables from CDNs
    # (sphinx-gallery writes those tags itself), so they would not work offline; each
    # example's page still gives its own running time.
    "write_computation_times": False,
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
    # The installation page has no subpages: without this its left sidebar would be an
    # empty "Section Navigation" box.
    html_sidebars = {"install": []}

html_title = f"skgpu_kernel {release}"
html_static_path = []
html_show_sourcelink = False
