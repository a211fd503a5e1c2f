"""Fixtures shared by the CPU tests that run child processes on the stand-in libcuda
(tests/fakes/driver/): built once a session."""
from __future__ import annotations

import os
import tempfile
from typing import Iterator

import pytest

from ..fakes import build as fake_build


@pytest.fixture(scope="session")
def fake_libcuda() -> Iterator[str]:
    """A folder holding the stand-in libcuda.so.1 (skips without a C compiler to build it)."""
    if fake_build.compiler() is None:
        pytest.skip("no C compiler for the fake libcuda")
    with tempfile.TemporaryDirectory(prefix="eglcuda-fakecuda-") as folder:
        fake_build.build_libcuda(folder)
        yield folder


@pytest.fixture(scope="session")
def fake_env(fake_libcuda: str) -> dict[str, str]:
    """The environment of a child process on the stand-in libcuda, with no EGL vendor (CUDA
    IPC and VMM only)."""
    return {**os.environ, "LD_LIBRARY_PATH": fake_libcuda, "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent.json"}
