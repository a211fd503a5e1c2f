"""docs/api.rst has an entry for every name in eglcuda.__all__ (the docs build checks the same,
through docs/conf.py, and fails with -W)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

import eglcuda

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def conf():
    if not (DOCS / "conf.py").exists() or not (DOCS / "api.rst").exists():
        pytest.skip("docs/ is not in this tree (an installed package without its sources)")
    spec = importlib.util.spec_from_file_location("eglcuda_docs_conf", DOCS / "conf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_an_entry(conf):
    missing = conf.undocumented((DOCS / "api.rst").read_text())
    assert missing == [], f"docs/api.rst has no entry for {', '.join(missing)}"


def test_a_name_without_an_entry_is_found(conf):
    text = (DOCS / "api.rst").read_text().replace(".. autoclass:: Publisher\n", "")
    assert conf.undocumented(text) == ["Publisher"]
    assert conf.undocumented(".. automodule:: eglcuda.mps\n.. py:data:: __version__\n",
                             ["mps", "__version__", "require"]) == ["require"]


def test_the_public_names_exist():
    for name in eglcuda.__all__:
        assert hasattr(eglcuda, name), name
