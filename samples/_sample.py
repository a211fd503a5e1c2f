"""What every sample does before it starts, and when it fails: one line, never a traceback.

- ``require(program, *capabilities, modules=...)``: what the sample needs, checked first. The
  platform through :func:`eglcuda.available` (names such as ``"cuda-stream"``), then the Python
  packages. When something is missing it prints one line naming it and how to get it, and exits
  with status 2.
- ``mps_session(program, enabled, *capabilities, modules=..., children_only=False)``: ``--mps``
  and ``require`` in the right order: eglcuda first, then the MPS session (before this process
  starts CUDA, which the platform check does), then the platform and packages; the session's
  "MPS: ..." line comes only once they are there, so that what is missing is the one line.
- ``run(main, program)``: runs the sample; an error ends it with one line and status 1, or status
  2 for :class:`eglcuda.Unsupported` (something this machine lacks, such as
  nvidia-cuda-mps-control for ``--mps``); ``EGLCUDA_TRACEBACK=1`` shows the traceback instead.
- ``names(parser, option, text, kind)``: the comma-separated names of an eglcuda enumeration
  (``"ColorFormat"``, ``"Layout"``) an option takes, checked as the command line is read: a bad
  one is argparse's usage error (status 2), not an error once the GPU work has begun.
- ``at_least(parser, args, {"--width": 2, ...})``: the same for a number below the least the
  sample can run with (a width of 0, no frames, a negative device ordinal).
- ``frame_size(parser, args, formats)``: the same for a ``--width`` and ``--height`` that a frame
  of one of the formats cannot have (an odd width of NV12).
- ``cupy_stream(cp, handle)``: CuPy's stream object for a raw stream handle (a consumer's
  ``cuda_stream``), through ``Stream.from_external`` where CuPy has it (``ExternalStream`` is
  deprecated there).
- ``lazy(name)``: a module imported at first use, so that ``--help`` works and ``require`` speaks
  before a missing package would.

Why CuPy: the samples compile their kernels with CuPy (NVRTC in three lines, and arrays that take
eglcuda's planes zero-copy through ``__cuda_array_interface__``). cuda.core would do without a
package per CUDA version, but its kernel-launch API still changes between releases. CuPy wheels
are built for one CUDA major version: the extra ``samples-cuda13`` for a CUDA 13 driver (580 and
later), ``samples-cuda12`` for CUDA 12; ``nvidia-smi`` shows the version.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

CUPY_HINT = ("pip install -e '.[samples-cuda13]' in the eglcuda checkout for a CUDA 13 driver, or "
             "'.[samples-cuda12]' for CUDA 12 (nvidia-smi shows the version)")
# (module to import, what it is for, how to get it)
CUPY = ("cupy", "CuPy for its kernels", CUPY_HINT)
PYOPENGL = ("OpenGL.GL", "PyOpenGL for its GL calls", "pip install PyOpenGL")
# the remote extras bring it beside ucxx: a relay and its remotes seal every message with it
CRYPTOGRAPHY = ("cryptography", "pyca/cryptography", "pip install -e '.[remote-cu12]' in a checkout (or remote-cu13)")


class _StreamHandle:
    """A raw CUDA stream handle as the CUDA stream protocol hands it over (``__cuda_stream__``)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def cupy_stream(cp: Any, handle: int) -> Any:
    """CuPy's stream for ``handle`` (not owned: CuPy never destroys it)."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is None:  # (CuPy before 14)
        return cp.cuda.ExternalStream(handle)
    return from_external(_StreamHandle(handle))


def fail(program: str, message: str, status: int) -> None:
    print(f"{program}: {message}", file=sys.stderr)
    raise SystemExit(status)


def names(parser: argparse.ArgumentParser, option: str, text: str, kind: str) -> list[str]:
    """The comma-separated names in ``text``, each a member of ``eglcuda.<kind>`` (a ColorFormat
    by its name in any case, a Layout by its value: ``pitch``); otherwise argparse's usage error."""
    items = [item.strip() for item in text.split(",")]
    try:
        import eglcuda
    except ImportError:
        return items  # require() names what is missing
    enumeration = getattr(eglcuda, kind)
    known = ([member.value for member in enumeration] if kind == "Layout"
             else list(enumeration.__members__))
    for item in items:
        if (item if kind == "Layout" else item.upper()) not in known:
            parser.error(f"{option} takes {kind} names from {','.join(known)}, got {item!r}")
    return items


def at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, bounds: dict[str, float]) -> None:
    """argparse's usage error for an option (``"--frames"``) whose value is below its bound."""
    for option, least in bounds.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        if value is not None and value < least:
            parser.error(f"{option} is at least {least:g}, got {value:g}")


# What a frame needs: NV12's chroma is subsampled 2x2.
FRAME = {"--width": 2, "--height": 2}


def frame_size(parser: argparse.ArgumentParser, args: argparse.Namespace, formats: Sequence[str]) -> None:
    """argparse's usage error for a ``--width`` and ``--height`` that no frame of one of ``formats``
    (ColorFormat names, as ``names`` checked them) can have: NV12's are even, for instance."""
    try:
        import eglcuda
        from eglcuda.frames.formats import check_size, color_format
    except ImportError:
        return  # require() names what is missing
    for fmt in formats:
        try:
            check_size(args.width, args.height, color_format(fmt))
        except eglcuda.UsageError as exc:
            parser.error(f"--width and --height: {exc}")


def require(program: str, *capabilities: str, modules: Sequence[tuple[str, str, str]] = ()) -> None:
    """Exit with status 2 and one line unless this machine has ``capabilities`` and Python has
    ``modules`` (see the module notes)."""
    try:
        import eglcuda
    except ImportError as exc:
        fail(program, f"needs eglcuda ({exc}): pip install -e . in the eglcuda checkout", 2)
    why = eglcuda.availability.explain(*capabilities)
    if why:
        fail(program, why, 2)
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    for module, purpose, hint in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            fail(program, f"needs {purpose}: {hint}", 2)


@contextlib.contextmanager
def mps_session(program: str, enabled: bool, *capabilities: str, modules: Sequence[tuple[str, str, str]] = (),
                children_only: bool = False) -> Iterator[Any]:
    """``with mps_session(PROGRAM, args.mps, ...):`` the sample's ``--mps`` (see the module notes);
    yields the daemon, or None without ``enabled``."""
    require(program)
    import eglcuda

    with eglcuda.mps.session(enabled, children_only=children_only, quiet=True) as daemon:
        require(program, *capabilities, modules=modules)
        if daemon is not None:
            print(f"MPS: {daemon.describe()}", file=sys.stderr, flush=True)
        yield daemon


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


def missing(exc: BaseException) -> str | None:
    """The line "needs X: ..." when ``exc`` is :class:`eglcuda.Unsupported` (X is not on this
    machine), else None."""
    eglcuda = sys.modules.get("eglcuda")  # an eglcuda exception means eglcuda is imported
    if eglcuda is None or not isinstance(exc, eglcuda.Unsupported):
        return None
    return f"needs {exc.missing}: {' '.join(str(exc).split())}"


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(main: Callable[[], int], program: str) -> int:
    """``sys.exit(run(main, PROGRAM))``: the sample's exit status, and one line for an error.
    SIGTERM (``timeout``, systemd, a CI runner) ends it as Ctrl-C does: its ``with`` blocks run,
    so its temporary folders, topics and child processes go too."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
        sys.stdout.flush()  # (here: a reader gone, `| head`, is the BrokenPipeError below, not one at exit)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # (its output's reader stopped early: quiet, as `python -m eglcuda` is)
        try:  # (Python flushes stdout again at exit: it goes to /dev/null then)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as exc:
        if os.environ.get("EGLCUDA_TRACEBACK") == "1":
            raise
        needs = missing(exc)
        if needs:
            print(f"{program}: {needs}", file=sys.stderr)
            return 2
        hint = ""
        if type(exc).__module__.startswith("cupy"):
            hint = f" (is CuPy's wheel the one for this driver's CUDA version? {CUPY_HINT})"
        print(f"{program}: {one_line(exc)}{hint}", file=sys.stderr)
        return 1
