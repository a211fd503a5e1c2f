"""Test tiers and their gates.

- tests/unit: no EGL needed.
- tests/egl: any EGL (Mesa's llvmpipe on CI). Marked ``egl``.
- tests/gpu: NVIDIA EGL + CUDA. Marked ``gpu``.
- tests/fake: the stream path against the fake driver of tests/fakes/ (a C compiler is
  enough), each test in a child interpreter. Marked ``fake``.

A tier whose platform is missing is skipped with the exact reason, which comes from
:func:`eglcuda.available` (the same answer scripts get). Where a tier must run (CI for the EGL
tier, a machine with a GPU for the GPU tier), set EGLCUDA_REQUIRE_EGL=1 or EGLCUDA_REQUIRE_GPU=1: a
missing platform then fails the tests instead of skipping them.

The tests run against the eglcuda that Python imports: the installed package, or the checkout
with an editable install (pytest's importlib import mode puts no folder of the checkout on
sys.path; see pyproject.toml).
"""
from __future__ import annotations

import os
import pathlib
import site

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # before anything imports OpenGL

import importlib.util

import pytest


def _check_eglcuda_is_built() -> None:
    """Say what to do, instead of an import traceback, when the eglcuda found first is a source
    tree without its compiled modules (a checkout that was neither built in place nor installed
    editable, or one that shadows an installed package because ``python -m`` put it first)."""
    spec = importlib.util.find_spec("eglcuda")
    if spec is None or spec.origin is None:
        raise pytest.UsageError("eglcuda is not installed: pip install -e '.[test]' (see README.md)")
    package = pathlib.Path(spec.origin).parent
    if not any(package.glob("_bind/_native*.so")):
        raise pytest.UsageError(
            f"{package} has no compiled modules. Install the checkout with pip install -e '.[test]' (or build it in "
            "place: python setup.py build_ext --inplace); with eglcuda installed from a wheel or sdist, run "
            "`pytest tests` (or python -P -m pytest): `python -m pytest` puts the working folder first.")


_check_eglcuda_is_built()

import eglcuda  # noqa: E402
from eglcuda._bind import loader as _loader  # noqa: E402

HERE = pathlib.Path(__file__).parent



def _children_import_this_eglcuda() -> None:
    """Interpreters the tests start (python -c ..., scripts) must import the same eglcuda as this
    one. Two things could make them find another: the working folder, which comes first on their
    sys.path (run from a checkout against an installed, non-editable package, its eglcuda/ has no
    compiled modules), and a tree this process imports from that is not on their default path.
    Safe paths (Python 3.11+) leave the working folder out; PYTHONPATH names the tree."""
    imported = pathlib.Path(eglcuda.__file__).resolve().parent
    # The working folder, and the checkout itself: some tests start children with cwd set to it.
    for candidate in (pathlib.Path.cwd() / "eglcuda", HERE.parent / "eglcuda"):
        if candidate.is_dir() and candidate.resolve() != imported:
            os.environ.setdefault("PYTHONSAFEPATH", "1")
    root = str(imported.parent)
    if root not in {*site.getsitepackages(), site.getusersitepackages()}:
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


_children_import_this_eglcuda()


# Tests that make a process fault on the GPU run last: after such a fault (driver 580, H100),
# cross-process EGLStreams into GL texture consumers delivered wrong texels and then failed with
# EGL_BAD_STATE_KHR for the rest of the machine's session (docs/mps.md, "Fault containment").
GPU_FAULT_TESTS = HERE / "gpu" / "test_mps_faults.py"


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.fspath))
        if HERE / "egl" in path.parents:
            item.add_marker(pytest.mark.egl)
        elif HERE / "gpu" in path.parents:
            item.add_marker(pytest.mark.gpu)
        elif HERE / "fake" in path.parents:
            item.add_marker(pytest.mark.fake)
    items.sort(key=lambda item: pathlib.Path(str(item.fspath)) == GPU_FAULT_TESTS)  # stable: the rest keep their order


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
            names = [eglcuda.get_device(i).info.name for i in range(eglcuda._bind.cuda.device_count())]
            lines.append(f"eglcuda: CUDA driver API {version}; devices: {', '.join(names) or 'none'}")
        except eglcuda.EglCudaError as exc:
            lines.append(f"eglcuda: CUDA: {exc}")
    else:
        lines.append(f"eglcuda: CUDA: {why}")
    return lines


def _missing(reason: str, required_by: str, module_level: bool = False) -> None:
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason} (and {required_by}=1 says this tier must run)")
    pytest.skip(reason, allow_module_level=module_level)


def gl_module(module_level: bool = False):
    """PyOpenGL's ``OpenGL.GL`` for eglcuda's EGL contexts, or a skip naming what is missing
    (``eglcuda.available("gl")``: libEGL, a desktop GL library, PyOpenGL). Not
    ``pytest.importorskip("OpenGL.GL")``: without libEGL or libOpenGL PyOpenGL raises
    AttributeError or NullFunctionError, which importorskip lets through. ``module_level=True``
    at a module's top skips the whole module."""
    ok, why = eglcuda.available("gl", reason=True)
    if not ok:
        _missing(f"needs {eglcuda.availability.NEEDS['gl']}: {why}", "EGLCUDA_REQUIRE_EGL", module_level)
    from OpenGL import GL

    return GL


@pytest.fixture(scope="session")
def egl_device() -> eglcuda.Device:
    """The EGL device the EGL tier runs on (the first one)."""
    ok, why = eglcuda.available("egl", reason=True)
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
    """A current desktop-GL context for PyOpenGL's calls; released and destroyed after the test."""
    gl_module()
    with display.create_context() as context:
        yield context


@pytest.fixture(scope="session")
def cuda_ordinal() -> int:
    """CUDA device 0, with an NVIDIA EGL device that reports it (skips with the reason)."""
    why = eglcuda.availability.explain("cuda", "cuda-egl")
    if why:
        _missing(why, "EGLCUDA_REQUIRE_GPU")
    return 0


@pytest.fixture
def cuda_display(cuda_ordinal):
    with eglcuda.Display.for_cuda_device(cuda_ordinal) as display:
        yield display


def require_extension(display: eglcuda.Display, *names: str) -> None:
    """Skip (or fail, where the GPU tier must run) unless the display lists every extension."""
    for name in names:
        if not display.supports(name):
            _missing(f"{name} missing on {display.description} ({display.vendor})", "EGLCUDA_REQUIRE_GPU")
