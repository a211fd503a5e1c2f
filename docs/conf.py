"""Sphinx configuration: the user guide (Markdown, through MyST) and the API reference generated
from the docstrings of the installed eglcuda (autodoc imports it, compiled modules included).

    pip install -e '.[docs]'
    sphinx-build -W -b html docs docs/_build/html
"""
from __future__ import annotations

import os

import eglcuda

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

project = "eglcuda"
author = "The eglcuda authors"
copyright = "the eglcuda authors, Apache License 2.0"
release = eglcuda.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
# A page nobody has linked from a toctree yet is built all the same (and found by the search);
# every other warning fails the build (CI runs sphinx-build -W). Link new pages from index.md.
suppress_warnings = ["toc.not_included"]

# The docstrings are reST with :param: fields; napoleon leaves those alone and reads the odd
# Google-style section.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}

html_theme = "alabaster"
html_title = f"eglcuda {release}"
html_theme_options = {"description": "Zero-copy frames between CUDA, OpenGL and processes through EGL"}
