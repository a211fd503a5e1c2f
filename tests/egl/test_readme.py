"""The "first look" of README.md and docs/index.md runs as written on any EGL (Mesa in CI)."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from ..conftest import gl_module

ROOT = pathlib.Path(__file__).resolve().parents[2]


def first_look(document: pathlib.Path) -> str:
    """The Python block of the section whose title starts with "A first look"."""
    text = document.read_text()
    section = re.search(r"^##+ (?:\d+\. )?A first look.*?$(.*?)^##", text, re.M | re.S)
    assert section, f"no 'A first look' section in {document.name}"
    block = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert block, f"no Python block in the first look of {document.name}"
    return block.group(1)


@pytest.mark.parametrize("document", ["README.md", "docs/index.md"])
def test_first_look_runs_as_written(egl_device, document, tmp_path):
    gl_module()
    if not (ROOT / document).exists():
        pytest.skip(f"{document} is not in this tree")
    code = first_look(ROOT / document)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the sibling shows the texels: True" in result.stdout
    assert "fence signaled: True" in result.stdout
