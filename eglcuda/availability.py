"""One call that tells a script whether this machine can do something: :func:`available`.

::

    import eglcuda

    if not eglcuda.available("cuda-stream"):
        raise SystemExit("needs an NVIDIA GPU with EGL streams")
    ok, why = eglcuda.available("cuda-stream", reason=True)

Like ``torch.cuda.is_available()``: it answers for this process, never raises for a platform
reason, and is fast (each probe runs once per process; later calls read the cached answer). The
reason says what was found when the answer is yes, and what is missing and how to get it when it
is no.

The names, from the most basic up:

========================  ==========================================================================
``"egl"``                 an EGL display opens (an EGL device's, or Mesa's surfaceless one)
``"gl"``                  GL calls in eglcuda's contexts: that display, a desktop GL library
                          (``libOpenGL.so.0``) and PyOpenGL
``"sync"``                EGLSync fences and reusable syncs on that display (Mesa has them)
``"cuda"``                the CUDA driver loads and sees at least one device
``"cuda-egl"``            CUDA device 0 has an EGL display (NVIDIA's EGL, ``EGL_NV_device_cuda``)
``"cuda-stream"``         EGLStreams between CUDA producers and consumers on CUDA device 0's display
``"cross-process"``       those streams between processes (``EGL_KHR_stream_cross_process_fd``)
``"gl-stream"``           GL texture consumers and GL surface producers on those streams
``"eglimage-cuda"``       EGLImages of GL textures registered with CUDA (a path is then chosen by the
                          coherence self-test, :func:`eglcuda.image_path`)
``"cuda-sync"``           the bridges between CUDA streams and EGLSyncs on CUDA device 0's display
``"cuda-ipc"``            CUDA IPC (a discrete GPU; Tegra has none), for comparisons in the benchmarks
``"two-gpus"``            two CUDA devices, each with its own EGL display and streams
========================  ==========================================================================

Probing CUDA initializes the driver in this process (``cuInit``), as any CUDA call does; start
other processes with ``spawn``, not ``fork``, after that. The ``egl``, ``gl`` and ``sync`` probes
leave CUDA alone (``gl`` imports PyOpenGL).

In a script, :func:`require` is the one-line form: it returns when everything named is here, and
otherwise prints what is missing and how to get it and exits with status 2.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Literal, overload

from ._bind import cuda as _driver
from ._bind import loader as _loader
from .cuda_device import device_info
from .display import Device, Display, client_extensions, devices
from ._integers import check_flag
from .errors import EglCudaError, UsageError
from ._bind.gl import gl

__all__ = ["CAPABILITIES", "NEEDS", "available", "explain", "require"]

NVIDIA_DRIVER = "it comes with the NVIDIA driver"
MESA_EGL = _loader.MESA_HINT


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ---- the probes: each returns (ok, reason) and may raise; available() catches ------------------

@dataclass(frozen=True)
class _DisplayFacts:
    """What the probes read of a display, which they open and close again at once: no display
    stays initialized on account of a probe."""

    description: str
    vendor: str
    version: tuple[int, int]
    extensions: frozenset[str]

    @classmethod
    def read(cls, display: Display) -> "_DisplayFacts":
        with display:
            return cls(display.description, display.vendor, display.version,
                       display.extensions | display.client_extensions)

    def supports(self, name: str) -> bool:
        return name in self.extensions


_displays: dict[str, _DisplayFacts] = {}
_egl_error = ["not probed"]


def _not_loaded(which: str, name: str, hint: str) -> str:
    """Why a driver library did not load: not there (and how to get it), or there but broken (the
    loader's words: a dependency missing, not a library at all)."""
    broken = _loader.load_failure(which)
    if broken is not None:
        return f"{name} is there but does not load ({broken})"
    return f"no {name} on this machine ({hint})"


def _egl() -> tuple[bool, str]:
    ok, _ = _loader.egl_available()
    if not ok:
        return False, _not_loaded("egl", _loader.EGL_LIBRARY, MESA_EGL)
    display = _egl_display()
    if display is None:
        return False, f"{_loader.EGL_LIBRARY} loads but no EGL display opens ({_egl_error[0]})"
    return True, f"{display.description}: EGL {display.version[0]}.{display.version[1]}, {display.vendor}"


def _egl_display() -> _DisplayFacts | None:
    """The display the EGL-only probes ask: the first EGL device's, else Mesa's surfaceless."""
    if "egl" in _displays:
        return _displays["egl"]
    errors = []
    try:
        found = devices()
    except EglCudaError as exc:
        found = []
        errors.append(_one_line(exc))
    for device in found:
        try:
            _displays["egl"] = _DisplayFacts.read(Display.for_device(device))
            return _displays["egl"]
        except EglCudaError as exc:
            errors.append(f"{device}: {_one_line(exc)}")
    try:
        if "EGL_MESA_platform_surfaceless" in client_extensions():
            _displays["egl"] = _DisplayFacts.read(Display.surfaceless())
            return _displays["egl"]
    except EglCudaError as exc:
        errors.append(f"surfaceless: {_one_line(exc)}")
    _egl_error[0] = "; ".join(errors) or "no EGL device and no surfaceless platform"
    return None


def _sync() -> tuple[bool, str]:
    ok, why = _probe("egl")
    if not ok:
        return False, why
    display = _displays["egl"]
    missing = [name for name in ("EGL_KHR_fence_sync", "EGL_KHR_reusable_sync") if not display.supports(name)]
    if missing:
        return False, f"{' and '.join(missing)} missing on {display.description} ({display.vendor})"
    return True, f"fence and reusable EGLSyncs on {display.description} ({display.vendor})"


def _cuda() -> tuple[bool, str]:
    ok, _ = _loader.cuda_available()
    if not ok:
        return False, _not_loaded("cuda", _loader.CUDA_LIBRARY, NVIDIA_DRIVER)
    try:
        count = _driver.device_count()
    except EglCudaError as exc:
        return False, f"the CUDA driver loads but does not start: {_one_line(exc)}"
    if count < 1:
        return False, "the CUDA driver sees no device"
    version = _driver.driver_version()
    names = ", ".join(device_info(i).name for i in range(count))
    return True, f"CUDA driver API {version // 1000}.{version % 1000 // 10}: {names}"


def _cuda_display(ordinal: int = 0) -> tuple[_DisplayFacts | None, str]:
    """What CUDA device ``ordinal``'s EGL display offers, or why there is none."""
    key = f"cuda{ordinal}"
    if key in _displays:
        return _displays[key], ""
    ok, why = _probe("cuda")
    if not ok:
        return None, why
    ok, _ = _loader.egl_available()
    if not ok:
        return None, _not_loaded("egl", _loader.EGL_LIBRARY, "NVIDIA's EGL comes with the NVIDIA driver; in a "
                                 "container, add graphics to NVIDIA_DRIVER_CAPABILITIES")
    found: list[Device] = devices()
    for device in found:
        if device.cuda_ordinal == ordinal:
            _displays[key] = _DisplayFacts.read(Display.for_device(device))
            return _displays[key], ""
    listed = "; ".join(str(d) for d in found) or "none"
    return None, (f"no EGL device reports CUDA device {ordinal} (EGL_NV_device_cuda): NVIDIA's EGL is not "
                  f"installed or not found by the glvnd loader (EGL devices: {listed})")


def _cuda_egl() -> tuple[bool, str]:
    display, why = _cuda_display(0)
    if display is None:
        return False, why
    return True, f"{display.description}: EGL {display.version[0]}.{display.version[1]}, {display.vendor}"


def _need_on_cuda_display(what: str, extensions: tuple[str, ...], entries: tuple[str, ...] = ()) -> tuple[bool, str]:
    display, why = _cuda_display(0)
    if display is None:
        return False, why
    missing = [name for name in extensions if not display.supports(name)]
    if missing:
        return False, f"{', '.join(missing)} missing on {display.description} ({display.vendor})"
    unbound = [name for name in entries if not _loader.is_bound(name)]
    if unbound:
        return False, f"{_loader.CUDA_LIBRARY} does not export {', '.join(unbound)}"
    return True, f"{what} on {display.description} ({display.vendor})"


STREAM_EXTENSIONS = ("EGL_KHR_stream", "EGL_KHR_stream_fifo")
STREAM_ENTRIES = ("cuEGLStreamProducerConnect", "cuEGLStreamConsumerConnectWithFlags",
                  "cuEGLStreamProducerPresentFrame", "cuEGLStreamConsumerAcquireFrame")


def _cuda_stream() -> tuple[bool, str]:
    return _need_on_cuda_display("CUDA -> CUDA EGLStreams", STREAM_EXTENSIONS, STREAM_ENTRIES)


def _cross_process() -> tuple[bool, str]:
    ok, why = _probe("cuda-stream")
    if not ok:
        return False, why
    return _need_on_cuda_display("EGLStreams between processes", ("EGL_KHR_stream_cross_process_fd",))


def _gl() -> tuple[bool, str]:
    ok, why = _probe("egl")
    if not ok:
        return False, why
    ok, why = _loader.opengl_available()
    if not ok:
        return False, why
    try:
        GL = gl()
    except EglCudaError as exc:
        return False, _one_line(exc)
    except Exception as exc:  # never raise
        return False, f"PyOpenGL does not import: {_one_line(exc)}"
    version = getattr(sys.modules.get("OpenGL"), "__version__", "?")
    return True, f"PyOpenGL {version} ({GL.__name__}) with {_loader.opengl_available()[1]}"


def _gl_stream() -> tuple[bool, str]:
    ok, why = _probe("cuda-stream")
    if not ok:
        return False, why
    ok, why = _probe("gl")
    if not ok:
        return False, why
    return _need_on_cuda_display("GL texture consumers and GL surface producers",
                                 ("EGL_KHR_stream_consumer_gltexture", "EGL_KHR_stream_producer_eglsurface"))


def _eglimage_cuda() -> tuple[bool, str]:
    display, why = _cuda_display(0)
    if display is None:
        return False, why
    ok, why = _probe("gl")
    if not ok:
        return False, why
    if not (_loader.is_bound("cuGraphicsEGLRegisterImage") or _loader.is_bound("cuGraphicsGLRegisterImage")):
        return False, f"{_loader.CUDA_LIBRARY} exports neither cuGraphicsEGLRegisterImage nor cuGraphicsGLRegisterImage"
    return _need_on_cuda_display("EGLImages of GL textures with CUDA", ("EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image"))


def _cuda_sync() -> tuple[bool, str]:
    display, why = _cuda_display(0)
    if display is None:
        return False, why
    to_egl = display.supports("EGL_NV_cuda_event") or (display.supports("EGL_KHR_reusable_sync")
                                                        and _loader.is_bound("cuLaunchHostFunc"))
    to_cuda = _loader.is_bound("cuEventCreateFromEGLSync") or (_loader.is_bound("cuStreamWaitValue32")
                                                               and _loader.is_bound("cuMemHostAlloc"))
    if not to_egl:
        return False, "CUDA -> EGLSync needs EGL_NV_cuda_event, or EGL_KHR_reusable_sync and cuLaunchHostFunc"
    if not to_cuda:
        return False, "EGLSync -> CUDA needs cuEventCreateFromEGLSync, or cuStreamWaitValue32 and cuMemHostAlloc"
    return _need_on_cuda_display("CUDA <-> EGLSync bridges", ("EGL_KHR_fence_sync",))


def _cuda_ipc() -> tuple[bool, str]:
    ok, why = _probe("cuda")
    if not ok:
        return False, why
    info = device_info(0)
    if info.integrated:
        return False, f"CUDA device 0 ({info.name}) is integrated (Tegra): no CUDA IPC there"
    for name in ("cuIpcGetMemHandle", "cuIpcOpenMemHandle"):
        if not _loader.is_bound(name):
            return False, f"{_loader.CUDA_LIBRARY} does not export {name}"
    return True, f"CUDA IPC on {info.name} (discrete)"


def _two_gpus() -> tuple[bool, str]:
    ok, why = _probe("cuda")
    if not ok:
        return False, why
    count = _driver.device_count()
    if count < 2:
        return False, f"needs two CUDA devices: this machine has {count}"
    for ordinal in (0, 1):
        display, why = _cuda_display(ordinal)
        if display is None:
            return False, why
        if not display.supports("EGL_KHR_stream"):
            return False, f"EGL_KHR_stream missing on {display.description}"
    return True, f"{count} CUDA devices, EGL streams on CUDA devices 0 and 1"


# What each capability means to someone who lacks it: "needs ..." in one line.
NEEDS: dict[str, str] = {
    "egl": "EGL (Mesa is enough)",
    "gl": "OpenGL through PyOpenGL on EGL (Mesa is enough)",
    "sync": "EGLSync fences and reusable syncs (Mesa has them)",
    "cuda": "an NVIDIA GPU and its driver",
    "cuda-egl": "an NVIDIA GPU with NVIDIA's EGL",
    "cuda-stream": "an NVIDIA GPU with EGL streams",
    "cross-process": "an NVIDIA GPU with EGL streams between processes",
    "gl-stream": "an NVIDIA GPU with EGL streams to and from GL",
    "eglimage-cuda": "an NVIDIA GPU with EGLImage interop",
    "cuda-sync": "an NVIDIA GPU with EGLSync interop",
    "cuda-ipc": "a discrete NVIDIA GPU (CUDA IPC)",
    "two-gpus": "two NVIDIA GPUs with EGL streams",
}

CAPABILITIES: dict[str, Callable[[], tuple[bool, str]]] = {
    "egl": _egl,
    "gl": _gl,
    "sync": _sync,
    "cuda": _cuda,
    "cuda-egl": _cuda_egl,
    "cuda-stream": _cuda_stream,
    "cross-process": _cross_process,
    "gl-stream": _gl_stream,
    "eglimage-cuda": _eglimage_cuda,
    "cuda-sync": _cuda_sync,
    "cuda-ipc": _cuda_ipc,
    "two-gpus": _two_gpus,
}

_answers: dict[str, tuple[bool, str]] = {}
_lock = threading.RLock()


def _fresh_lock_in_child() -> None:
    """In a child made by ``fork()``: a lock of its own. The parent's may have been held by a thread
    inside a probe (one that does not exist in the child), and every available() there would wait
    for it forever. Answers that thread had not finished are probed again in the child."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def _probe(what: str) -> tuple[bool, str]:
    with _lock:
        if what not in _answers:
            try:
                _answers[what] = CAPABILITIES[what]()
            except Exception as exc:  # a probe never raises out of available()
                _answers[what] = (False, f"probing failed: {type(exc).__name__}: {_one_line(exc)}")
        return _answers[what]


@overload
def available(what: str, reason: Literal[False] = False) -> bool: ...


@overload
def available(what: str, reason: Literal[True]) -> tuple[bool, str]: ...


def available(what: str, reason: bool = False) -> bool | tuple[bool, str]:
    """Whether this machine can do ``what`` (one of :data:`CAPABILITIES`: ``"egl"``, ``"gl"``,
    ``"sync"``, ``"cuda"``, ``"cuda-egl"``, ``"cuda-stream"``, ``"cross-process"``, ``"gl-stream"``, ``"eglimage-cuda"``,
    ``"cuda-sync"``, ``"cuda-ipc"``, ``"two-gpus"``).

    With ``reason=True``, returns ``(ok, reason)``: what was found, or what is missing and how to
    get it, in one line. Never raises for a platform reason (a probe that fails counts as "no",
    with the failure as the reason); each probe runs once per process. An unknown name raises
    :class:`UsageError`: a typo must not read as "this machine cannot"; so does a ``reason``
    that is not True or False (a second name, whose tuple would always read as "yes")."""
    if not isinstance(what, str) or what not in CAPABILITIES:
        raise UsageError(f"unknown capability {what!r}; known: {', '.join(CAPABILITIES)}")
    if isinstance(reason, str):
        raise UsageError(f"available() asks about one name, and reason is True or False, got {reason!r}: "
                         f"for several names, eglcuda.require({what!r}, {reason!r}, ...) or "
                         "eglcuda.availability.explain(...)")
    reason = check_flag(reason, "reason")
    answer = _probe(what)
    return answer if reason else answer[0]


def explain(*names: str) -> str | None:
    """What the first of ``names`` that is not available needs, in one line ("needs an NVIDIA GPU
    with EGL streams: no libcuda.so.1 on this machine (...)"), or None when all are available."""
    for name in names:
        ok, why = available(name, reason=True)
        if not ok:
            return f"needs {NEEDS[name]}: {why}"
    return None


def require(*names: str) -> None:
    """Return if this machine has every capability named (see :func:`available`); otherwise print
    one line to stderr, ``eglcuda: needs ...: what is missing (how to get it)``, and exit with
    status 2. For scripts and the first lines of a program: ``eglcuda.require("gl")`` before
    ``from OpenGL import GL`` turns PyOpenGL's traceback on a machine without EGL or GL into that
    line. (In a library, use :func:`available` or :func:`explain` and decide there.)"""
    for name in names:
        if not isinstance(name, str) or name not in CAPABILITIES:
            raise UsageError(f"unknown capability {name!r}; known: {', '.join(CAPABILITIES)}")
    why = explain(*names)
    if why:
        print(f"eglcuda: {why}", file=sys.stderr, flush=True)
        raise SystemExit(2)


def _forget() -> None:
    """Drop the cached answers (tests)."""
    with _lock:
        _answers.clear()
        _displays.clear()
