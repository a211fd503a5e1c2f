"""The EGL core calls (csrc/egl_core.h) and the EGL error funnel: every failed EGL call becomes an
:class:`EGLError` through :func:`egl_error`, read right after it.

Displays, devices, configs, contexts and surfaces are taken and returned as addresses (ints).
The helpers at the top (attribute lists, extension strings) serve the other binding modules."""
from __future__ import annotations

from typing import Iterable

from ..errors import EGLError
from ._native import ffi, lib

EGL_FOREVER = 0xFFFFFFFFFFFFFFFF  # EGL_FOREVER_KHR (see csrc/egl_sync.h)


def egl_error(call: str, doing: str = "") -> EGLError:
    """The :class:`EGLError` for a call that just failed (reads ``eglGetError`` now)."""
    return EGLError(lib.eglGetError(), call, doing)


def clear_error() -> None:
    """Read and drop EGL's error flag (after a failure that is not reported)."""
    lib.eglGetError()


def address(handle) -> int:
    """An EGL handle (a cdata pointer) as an int, for hashing and display."""
    return int(ffi.cast("uintptr_t", handle))


def split_extensions(text) -> frozenset[str]:
    """A NULL-safe split of an extension string."""
    if text == ffi.NULL:
        return frozenset()
    return frozenset(ffi.string(text).decode().split())


def int_attribs(pairs: Iterable[tuple[int, int]]):
    """An ``EGLint`` attribute list ending in EGL_NONE."""
    flat = [value for pair in pairs for value in pair]
    return ffi.new("EGLint[]", flat + [lib.EGL_NONE])


def pointer_attribs(pairs: Iterable[tuple[int, int]]):
    """An ``EGLAttrib`` (pointer-sized) attribute list ending in EGL_NONE."""
    flat = [value for pair in pairs for value in pair]
    return ffi.new("EGLAttrib[]", flat + [lib.EGL_NONE])


# ---- strings, devices, displays (EGL 1.5 core, EGL_EXT_device_*) ---------------------------------

VENDOR = lib.EGL_VENDOR
EXTENSIONS = lib.EGL_EXTENSIONS
CLIENT_APIS = lib.EGL_CLIENT_APIS
DRM_DEVICE_FILE = lib.EGL_DRM_DEVICE_FILE_EXT
DRM_RENDER_NODE_FILE = lib.EGL_DRM_RENDER_NODE_FILE_EXT
CUDA_DEVICE_NV = lib.EGL_CUDA_DEVICE_NV
PLATFORM_DEVICE = lib.EGL_PLATFORM_DEVICE_EXT
PLATFORM_SURFACELESS = lib.EGL_PLATFORM_SURFACELESS_MESA


def client_extensions() -> frozenset[str]:
    """The client extension string of the EGL library, split (empty where it has none)."""
    extensions = split_extensions(lib.eglQueryString(ffi.NULL, lib.EGL_EXTENSIONS))
    if not extensions:
        lib.eglGetError()  # EGL_BAD_DISPLAY where client extensions are unsupported: clear it
    return extensions


def query_string(display: int, name: int, doing: str) -> str:
    """A string of an initialized display (``eglQueryString``)."""
    text = lib.eglQueryString(ffi.cast("EGLDisplay", display), name)
    if text == ffi.NULL:
        raise egl_error("eglQueryString", doing)
    return ffi.string(text).decode()


def query_devices() -> list[int]:
    """The EGL devices of this machine, in EGL's order (``eglQueryDevicesEXT``)."""
    count = ffi.new("EGLint *")
    if not lib.eglQueryDevicesEXT(0, ffi.NULL, count):
        raise egl_error("eglQueryDevicesEXT", "counting EGL devices")
    handles = ffi.new("EGLDeviceEXT[]", max(count[0], 1))
    if not lib.eglQueryDevicesEXT(count[0], handles, count):
        raise egl_error("eglQueryDevicesEXT", "listing EGL devices")
    return [address(handles[index]) for index in range(count[0])]


def query_device_string(device: int, name: int) -> str | None:
    """A string of an EGL device, or None where the device has none (the error is cleared)."""
    text = lib.eglQueryDeviceStringEXT(ffi.cast("EGLDeviceEXT", device), name)
    if text == ffi.NULL:
        lib.eglGetError()
        return None
    return ffi.string(text).decode()


def query_device_attrib(device: int, attribute: int) -> int | None:
    """An attribute of an EGL device, or None where the device refuses it (the error is cleared)."""
    value = ffi.new("EGLAttrib *")
    if not lib.eglQueryDeviceAttribEXT(ffi.cast("EGLDeviceEXT", device), attribute, value):
        lib.eglGetError()
        return None
    return int(value[0])


def platform_display(platform: int, native: int, doing: str) -> int:
    """``eglGetPlatformDisplay`` with no attributes (``native``: the device, or 0)."""
    handle = lib.eglGetPlatformDisplay(platform, ffi.cast("void *", native), pointer_attribs([]))
    if handle == ffi.NULL:
        raise egl_error("eglGetPlatformDisplay", doing)
    return address(handle)


def initialize(display: int, doing: str) -> tuple[int, int]:
    """``eglInitialize``: the display's EGL version (major, minor)."""
    major, minor = ffi.new("EGLint *"), ffi.new("EGLint *")
    if not lib.eglInitialize(ffi.cast("EGLDisplay", display), major, minor):
        raise egl_error("eglInitialize", doing)
    return major[0], minor[0]


def terminate(display: int) -> None:
    """``eglTerminate`` (finalizers: the driver's answer is not reported)."""
    lib.eglTerminate(ffi.cast("EGLDisplay", display))


# ---- configs, contexts, pbuffers, current state (EGL 1.5 core) -----------------------------------

SURFACE_TYPE = lib.EGL_SURFACE_TYPE
RENDERABLE_TYPE = lib.EGL_RENDERABLE_TYPE
PBUFFER_BIT = lib.EGL_PBUFFER_BIT
RED_SIZE = lib.EGL_RED_SIZE
GREEN_SIZE = lib.EGL_GREEN_SIZE
BLUE_SIZE = lib.EGL_BLUE_SIZE
ALPHA_SIZE = lib.EGL_ALPHA_SIZE
OPENGL_API = lib.EGL_OPENGL_API
OPENGL_BIT = lib.EGL_OPENGL_BIT
OPENGL_ES_API = lib.EGL_OPENGL_ES_API
OPENGL_ES3_BIT = lib.EGL_OPENGL_ES3_BIT
CONTEXT_MAJOR_VERSION = lib.EGL_CONTEXT_MAJOR_VERSION
CONTEXT_MINOR_VERSION = lib.EGL_CONTEXT_MINOR_VERSION
CONTEXT_OPENGL_PROFILE_MASK = lib.EGL_CONTEXT_OPENGL_PROFILE_MASK
CONTEXT_OPENGL_CORE_PROFILE_BIT = lib.EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT
CONTEXT_OPENGL_COMPATIBILITY_PROFILE_BIT = lib.EGL_CONTEXT_OPENGL_COMPATIBILITY_PROFILE_BIT


def choose_config(display: int, attributes: list[tuple[int, int]], doing: str) -> int | None:
    """The first config matching ``(attribute, value)`` pairs, or None when none does."""
    config = ffi.new("EGLConfig *")
    count = ffi.new("EGLint *")
    if not lib.eglChooseConfig(ffi.cast("EGLDisplay", display), int_attribs(attributes), config, 1, count):
        raise egl_error("eglChooseConfig", doing)
    if count[0] < 1:
        return None
    return address(config[0])


def bind_api(api: int) -> bool:
    """``eglBindAPI`` for this thread; False when EGL refused (read the error with
    :func:`egl_error` at once, before any other EGL call)."""
    return bool(lib.eglBindAPI(api))


def create_context(display: int, config: int, attributes: list[tuple[int, int]], doing: str) -> int:
    """A context sharing with none (``eglCreateContext``)."""
    context = lib.eglCreateContext(ffi.cast("EGLDisplay", display), ffi.cast("EGLConfig", config), ffi.NULL,
                                   int_attribs(attributes))
    if context == ffi.NULL:
        raise egl_error("eglCreateContext", doing)
    return address(context)


def destroy_context(display: int, context: int) -> None:
    """``eglDestroyContext`` (finalizers and error paths: the driver's answer is not reported)."""
    lib.eglDestroyContext(ffi.cast("EGLDisplay", display), ffi.cast("EGLContext", context))


def create_pbuffer_surface(display: int, config: int, width: int, height: int, doing: str) -> int:
    """A ``width`` x ``height`` pbuffer (``eglCreatePbufferSurface``)."""
    size = int_attribs([(lib.EGL_WIDTH, width), (lib.EGL_HEIGHT, height)])
    surface = lib.eglCreatePbufferSurface(ffi.cast("EGLDisplay", display), ffi.cast("EGLConfig", config), size)
    if surface == ffi.NULL:
        raise egl_error("eglCreatePbufferSurface", doing)
    return address(surface)


def destroy_surface(display: int, surface: int) -> None:
    """``eglDestroySurface`` (finalizers: the driver's answer is not reported)."""
    lib.eglDestroySurface(ffi.cast("EGLDisplay", display), ffi.cast("EGLSurface", surface))


def make_current(display: int, draw: int, read: int, context: int) -> bool:
    """``eglMakeCurrent`` with handles as addresses (0: none); False when EGL refused (read the
    error with :func:`egl_error` at once, before any other EGL call)."""
    return bool(lib.eglMakeCurrent(ffi.cast("EGLDisplay", display), ffi.cast("EGLSurface", draw),
                                   ffi.cast("EGLSurface", read), ffi.cast("EGLContext", context)))


def current_context() -> int:
    """The context current on the calling thread (0 for none)."""
    return address(lib.eglGetCurrentContext())


def current() -> tuple[int, int, int, int]:
    """What is current on the calling thread: (display, draw surface, read surface, context),
    0 for none; :func:`make_current` takes it back as is."""
    return (address(lib.eglGetCurrentDisplay()), address(lib.eglGetCurrentSurface(lib.EGL_DRAW)),
            address(lib.eglGetCurrentSurface(lib.EGL_READ)), address(lib.eglGetCurrentContext()))
