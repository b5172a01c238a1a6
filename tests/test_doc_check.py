"""doc/check_html.py, the CI step that fails a built site loading scripts from the network."""

import pytest


@pytest.mark.parametrize(
    "tag",
    [
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>',
        '<script defer src="//code.jquery.com/jquery.js"></script>',
        '<SCRIPT SRC="HTTP://example.org/a.js"></SCRIPT>',
        '<link rel="stylesheet" href="https://cdn.datatables.net/x.css">',
    ],
)
def test_a_remote_script_or_stylesheet_is_reported(check_html, tag):
    assert len(check_html.remote_assets(f"<html><head>{tag}</head><body></body></html>")) == 1


def test_local_assets_and_links_to_remote_pages_pass(check_html):
    html = (
        '<script src="../_static/mathjax/tex-chtml.js"></script><script>var x = "https://a.b";</script>'
        '<link rel="stylesheet" href="_static/styles/theme.css"><link rel="canonical" href="https://a.b/">'
        '<a href="https://scikit-learn.org">scikit-learn</a>'
    )
    assert check_html.remote_assets(html) == []


def test_the_site_check_names_the_page_and_each_example_without_a_figure(check_html, tmp_path):
    site, examples = tmp_path / "html", tmp_path / "examples"
    (site / "_images").mkdir(parents=True)
    examples.mkdir()
    (site / "index.html").write_text('<script src="_static/local.js"></script>')
    (site / "guide.html").write_text('<script src="https://cdn.example.org/math.js"></script>')
    for name in ("plot_a.py", "plot_b.py"):
        (examples / name).write_text("")
    (site / "_images" / "sphx_glr_plot_a_001.png").write_bytes(b"")

    found = check_html.problems(site, examples)

    assert found == [
        "guide.html: loads <script> https://cdn.example.org/math.js from the network",
        "plot_b.py: no figure in _images (gallery not run?)",
    ]
    assert check_html.main([str(site)]) == 1
    (site / "guide.html").write_text("<p>offline</p>")
    assert check_html.main([str(site), "--examples", str(examples)]) == 1
    (site / "_images" / "sphx_glr_plot_b_001.png").write_bytes(b"")
    assert check_html.main([str(site), "--examples", str(examples)]) == 0
