"""Check a built HTML site: no page loads a script or stylesheet from the network, and
the gallery's figures are there.

Usage (from the repository root, after the build)::

    python doc/check_html.py doc/_build/html [--examples examples]

Exits with status 1 and one line per problem when:

* a page has a ``<script src=...>`` or a ``<link rel="stylesheet" href=...>`` whose
  address is remote (``http:``, ``https:`` or protocol-relative ``//``): such a page
  renders differently without network access (MathJax from a CDN showed formulas as
  raw ``\\(...\\)`` source);
* with ``--examples``, an example ``plot_*.py`` of that directory has no figure
  ``_images/sphx_glr_plot_*_001.png`` in the build (the gallery did not run, or the
  example drew nothing).
"""

import argparse
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)


class _RemoteAssets(HTMLParser):
    """Collects the remote addresses of a page's scripts and stylesheets."""

    def __init__(self):
        super().__init__()
        self.remote = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script":
            address = attributes.get("src")
        elif tag == "link" and "stylesheet" in (attributes.get("rel") or "").lower().split():
            address = attributes.get("href")
        else:
            return
        if address and REMOTE.match(address.strip()):
            self.remote.append(f"<{tag}> {address}")


def remote_assets(html):
    """The remote scripts and stylesheets a page's HTML text loads."""
    parser = _RemoteAssets()
    parser.feed(html)
    return parser.remote


def first_figure(build_dir, example):
    """Where sphinx-gallery puts the first figure of the example script ``example`` in the built site."""
    return Path(build_dir) / "_images" / f"sphx_glr_{Path(example).stem}_001.png"


def missing_figures(build_dir, examples_dir):
    """The examples of ``examples_dir`` without a gallery figure in ``build_dir/_images``."""
    examples = sorted(Path(examples_dir).glob("plot_*.py"))
    return [example.name for example in examples if not first_figure(build_dir, example).is_file()]


def problems(build_dir, examples_dir=None):
    """Every problem of the built site, one line each; empty when it passes."""
    pages = sorted(Path(build_dir).rglob("*.html"))
    found = [] if pages else [f"{build_dir}: no HTML page (was the site built?)"]
    for page in pages:
        for asset in remote_assets(page.read_text(encoding="utf-8", errors="replace")):
            found.append(f"{page.relative_to(build_dir)}: loads {asset} from the network")
    if examples_dir is not None:
        found += [
            f"{name}: no figure in _images (gallery not run?)" for name in missing_figures(build_dir, examples_dir)
        ]
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--examples", help="the gallery's source directory; require a figure for each example")
    args = parser.parse_args(argv)
    found = problems(args.build_dir, args.examples)
    for line in found:
        print(line)
    pages = len(list(Path(args.build_dir).rglob("*.html")))
    print(f"{pages} pages checked: {'ok' if not found else f'{len(found)} problems'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
