"""What every sample does before it starts, and when it fails: one line, never a traceback.

- ``require(program, *capabilities, modules=...)``: what the sample needs, checked first. The
  platform through :func:`eglcuda.available` (names such as ``"cuda-stream"``), then the Python
  packages. When something is missing it prints one line naming it and how to get it, and exits
  with status 2.
- ``run(main, program)``: runs the sample; an error ends it with one line and status 1
  (``EGLCUDA_TRACEBACK=1`` shows the traceback instead).
- ``lazy(name)``: a module imported at first use, so that ``--help`` works and ``require`` speaks
  before a missing package would.

Why CuPy: the samples compile their kernels with CuPy (NVRTC in three lines, and arrays that take
eglcuda's planes zero-copy through ``__cuda_array_interface__``). cuda.core would do without a
package per CUDA version, but its kernel-launch API still changes between releases. CuPy wheels
are built for one CUDA major version: ``eglcuda[samples-cuda13]`` for a CUDA 13 driver (our GPU
machine: driver 580), ``eglcuda[samples-cuda12]`` for CUDA 12; ``nvidia-smi`` shows the version.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Callable, Sequence

CUPY_HINT = ("pip install 'eglcuda[samples-cuda13]' for a CUDA 13 driver, or 'eglcuda[samples-cuda12]' for "
             "CUDA 12 (nvidia-smi shows the version)")
# (module to import, what it is for, how to get it)
CUPY = ("cupy", "CuPy for its kernels", CUPY_HINT)
PYOPENGL = ("OpenGL.GL", "PyOpenGL for its GL calls", "pip install 'eglcuda[gl]'")


def fail(program: str, message: str, status: int) -> None:
    print(f"{program}: {message}", file=sys.stderr)
    raise SystemExit(status)


def require(program: str, *capabilities: str, modules: Sequence[tuple[str, str, str]] = ()) -> None:
    """Exit with status 2 and one line unless this machine has ``capabilities`` and Python has
    ``modules`` (see the module notes)."""
    try:
        import eglcuda
    except ImportError as exc:
        fail(program, f"needs eglcuda ({exc}): pip install eglcuda, or pip install -e . in a checkout", 2)
    why = eglcuda.availability.explain(*capabilities)
    if why:
        fail(program, why, 2)
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    for module, purpose, hint in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            fail(program, f"needs {purpose}: {hint}", 2)


class lazy:  # noqa: N801 - used like a module
    """``cp = lazy("cupy")``: imports the module at the first attribute read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> object:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run(main: Callable[[], int], program: str) -> int:
    """``sys.exit(run(main, PROGRAM))``: the sample's exit status, and one line for an error."""
    try:
        return main()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("EGLCUDA_TRACEBACK") == "1":
            raise
        hint = ""
        if type(exc).__module__.startswith("cupy"):
            hint = f" (is CuPy's wheel the one for this driver's CUDA version? {CUPY_HINT})"
        print(f"{program}: {one_line(exc)}{hint}", file=sys.stderr)
        return 1
