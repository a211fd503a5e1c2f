"""Test tiers and their gates.

- tests/unit: no EGL needed.
- tests/egl: any EGL (Mesa's llvmpipe on CI). Marked ``egl``.
- tests/gpu: NVIDIA EGL + CUDA. Marked ``gpu``.

A tier whose platform is missing is skipped with the exact reason. Where a tier must run
(CI for the EGL tier, the GPU machine for the GPU tier), set EGLCUDA_REQUIRE_EGL=1 or
EGLCUDA_REQUIRE_GPU=1: a missing platform then fails the tests instead of skipping them.
"""
from __future__ import annotations

import os
import pathlib

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # before anything imports OpenGL

import pytest

import eglcuda
from eglcuda import _loader

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.fspath))
        if HERE / "egl" in path.parents:
            item.add_marker(pytest.mark.egl)
        elif HERE / "gpu" in path.parents:
            item.add_marker(pytest.mark.gpu)


def pytest_report_header(config):
    lines = []
    ok, why = _loader.egl_available()
    if not ok:
        return [f"eglcuda: EGL: {why}"]
    try:
        for device in eglcuda.devices():
            try:
                with eglcuda.Display.for_device(device) as display:
                    stream = sorted(e for e in display.extensions if "stream" in e)
                    lines.append(f"eglcuda: {device}: EGL {display.version[0]}.{display.version[1]} {display.vendor}; "
                                 f"{len(display.extensions)} extensions; streams: {' '.join(stream) or 'none'}")
            except eglcuda.EglCudaError as exc:
                lines.append(f"eglcuda: {device}: {exc}")
    except eglcuda.EglCudaError as exc:
        lines.append(f"eglcuda: EGL devices: {exc}")
    ok, why = _loader.cuda_available()
    if ok:
        try:
            version = eglcuda.driver_version()
            names = [eglcuda.get_device(i).info.name for i in range(eglcuda._cuda.device_count())]
            lines.append(f"eglcuda: CUDA driver API {version}; devices: {', '.join(names) or 'none'}")
        except eglcuda.EglCudaError as exc:
            lines.append(f"eglcuda: CUDA: {exc}")
    else:
        lines.append(f"eglcuda: CUDA: {why}")
    return lines


def _missing(reason: str, required_by: str) -> None:
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason} (and {required_by}=1 says this tier must run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def egl_device() -> eglcuda.Device:
    """The EGL device the EGL tier runs on (the first one)."""
    ok, why = _loader.egl_available()
    if not ok:
        _missing(f"no EGL: {why}", "EGLCUDA_REQUIRE_EGL")
    try:
        found = eglcuda.devices()
    except eglcuda.Unsupported as exc:
        _missing(f"no EGL device enumeration: {exc}", "EGLCUDA_REQUIRE_EGL")
    if not found:
        _missing("EGL lists no devices", "EGLCUDA_REQUIRE_EGL")
    return found[0]


@pytest.fixture
def display(egl_device):
    with eglcuda.Display.for_device(egl_device) as display:
        yield display


@pytest.fixture
def gl_context(display):
    """A current desktop-GL context; released and destroyed after the test."""
    with display.create_context() as context:
        yield context


@pytest.fixture(scope="session")
def cuda_ordinal() -> int:
    """CUDA device 0, with an NVIDIA EGL device that reports it (skips with the reason)."""
    ok, why = _loader.cuda_available()
    if not ok:
        _missing(f"no CUDA driver: {why}", "EGLCUDA_REQUIRE_GPU")
    try:
        if eglcuda._cuda.device_count() < 1:
            _missing("no CUDA device", "EGLCUDA_REQUIRE_GPU")
    except eglcuda.CUDAError as exc:
        _missing(f"no CUDA device: {exc}", "EGLCUDA_REQUIRE_GPU")
    ok, why = _loader.egl_available()
    if not ok:
        _missing(f"no EGL: {why}", "EGLCUDA_REQUIRE_GPU")
    try:
        if not any(d.cuda_ordinal == 0 for d in eglcuda.devices()):
            _missing("no NVIDIA EGL device reports CUDA device 0 (EGL_NV_device_cuda)", "EGLCUDA_REQUIRE_GPU")
    except eglcuda.Unsupported as exc:
        _missing(f"no EGL device enumeration: {exc}", "EGLCUDA_REQUIRE_GPU")
    return 0


@pytest.fixture
def cuda_display(cuda_ordinal):
    with eglcuda.Display.for_cuda_device(cuda_ordinal) as display:
        yield display


def require_extension(display: eglcuda.Display, *names: str) -> None:
    """Skip (or fail, on the GPU machine) unless the display lists every extension."""
    for name in names:
        if not display.supports(name):
            _missing(f"{name} missing on {display.description} ({display.vendor})", "EGLCUDA_REQUIRE_GPU")
