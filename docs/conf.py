"""Sphinx configuration: the user guide (Markdown, through MyST) and the API reference generated
from the docstrings of the installed eglcuda (autodoc imports it, compiled modules included).

    pip install -e '.[docs]'
    sphinx-build -W -b html docs docs/_build/html

The build fails (with -W) when a name in ``eglcuda.__all__`` has no entry in api.rst.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable

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


# ---- every public name has an entry in api.rst --------------------------------------------------

API_PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api.rst")
# An entry is an autodoc or py directive naming the object, e.g. ".. autoclass:: Publisher",
# ".. automodule:: eglcuda.mps", ".. py:data:: __version__".
_ENTRY = re.compile(r"^\.\. (?:auto\w+|py:\w+)::\s+(?:eglcuda\.)?([\w.]+)", re.M)


def undocumented(text: str, names: Iterable[str] = tuple(eglcuda.__all__)) -> list[str]:
    """The names (of ``eglcuda.__all__`` by default) that ``text`` (api.rst) has no entry for."""
    entries = set(_ENTRY.findall(text))
    return [name for name in names if name not in entries]


def _check_api_page(app: Any) -> None:
    with open(API_PAGE, encoding="utf-8") as page:
        missing = undocumented(page.read())
    if missing:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "api.rst has no entry for %s (in eglcuda.__all__): add one where it belongs",
            ", ".join(f"eglcuda.{name}" for name in missing), location="api")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _check_api_page)
    return {"parallel_read_safe": True}
