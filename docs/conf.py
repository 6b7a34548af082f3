"""Sphinx configuration of the openreg integration guide (Markdown pages, read by MyST).

Built by `nox -s docs`: `sphinx-build -W --keep-going -b html docs docs/_build/html`. The build
needs no network: no intersphinx, no remote images, no extensions beyond myst_parser.
"""

project = "openreg"
author = "the openreg developers"
copyright = "the openreg developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings up to level 3 get anchors, so pages can link to `page.md#a-section`.
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "openreg integration guide"
