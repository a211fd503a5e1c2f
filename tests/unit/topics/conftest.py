"""Fixtures of the topic tests: a private temporary folder and a topic path in it."""
from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture
def folder():
    with tempfile.TemporaryDirectory(prefix="eglcuda-topics-") as path:
        os.chmod(path, 0o700)
        yield path


@pytest.fixture
def path(folder):
    return os.path.join(folder, "t.topic")
