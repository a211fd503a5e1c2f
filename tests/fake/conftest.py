"""The fake-driver tier: eglcuda's stream path on the CPU, against the fake libEGL and libcuda of
tests/fakes/ (built here once per session with the C compiler; the tier is skipped, with the
reason, where there is none). Every test runs in a child interpreter (tests/fake/harness.py).

A test tool, not a substitute for the GPU tier: the fake follows what is known of NVIDIA's
EGLStream (fake_egl.c says what it models), not the driver itself."""
from __future__ import annotations

import os

import pytest

from ..fakes import build as fake_build
from . import harness


@pytest.fixture(scope="session")
def fake_libraries(tmp_path_factory) -> tuple[str, str]:
    if fake_build.compiler() is None:
        pytest.skip("no C compiler (gcc or cc) to build the fake driver (tests/fakes/)")
    try:
        # EGLCUDA_FAKE_ASAN=1: built with AddressSanitizer (run_under_valgrind.sh --asan -- -m pytest
        # tests/fake preloads its runtime).
        egl, cuda = fake_build.build(tmp_path_factory.mktemp("fakes"),
                                     asan=os.environ.get("EGLCUDA_FAKE_ASAN") == "1")
    except fake_build.BuildError as exc:
        pytest.fail(f"the fake driver does not build:\n{exc}")
    return str(egl), str(cuda)


@pytest.fixture(scope="session")
def _fake_session(fake_libraries):
    harness.LIBRARIES = fake_libraries
    yield
    harness.stop_fork_server()


@pytest.fixture(autouse=True)
def _fake_driver(_fake_session) -> None:
    """Every test of this tier needs the built libraries (and skips where they cannot be built)."""

