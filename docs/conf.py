"""Sphinx configuration: Markdown pages (myst-parser) and an API reference from docstrings.

Build: ``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``tests/test_docs.py`` runs the same build and fails on any warning).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, even when it is not installed

project = "torch_spdl"
author = "torch_spdl contributors"
copyright = "torch_spdl contributors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autoclass_content = "both"
autodoc_inherit_docstrings = False  # Lightning's docstrings use roles of its own site
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Type hints name third-party and private classes that the reference does not document.
nitpicky = False

html_theme = "alabaster"
html_static_path = ["_static"]
html_title = "torch_spdl"
html_theme_options = {
    "description": "Fast staged data loading for PyTorch",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "240px",
}
