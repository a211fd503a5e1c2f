"""The EGLStream calls (EGL_KHR_stream and its companions, csrc/egl_stream.h) outside the
per-frame path: create, open from a descriptor, query, set attributes, export, destroy.

Displays and streams are taken as addresses (ints) or cffi pointers alike."""
from __future__ import annotations

from typing import Any

from ._native import ffi, lib
from .egl import address, egl_error, int_attribs

STATE = lib.EGL_STREAM_STATE_KHR
STATE_CREATED = lib.EGL_STREAM_STATE_CREATED_KHR
STATE_CONNECTING = lib.EGL_STREAM_STATE_CONNECTING_KHR
STATE_EMPTY = lib.EGL_STREAM_STATE_EMPTY_KHR
STATE_NEW_FRAME = lib.EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR
STATE_OLD_FRAME = lib.EGL_STREAM_STATE_OLD_FRAME_AVAILABLE_KHR
STATE_DISCONNECTED = lib.EGL_STREAM_STATE_DISCONNECTED_KHR
FIFO_LENGTH = lib.EGL_STREAM_FIFO_LENGTH_KHR
CONSUMER_LATENCY_USEC = lib.EGL_CONSUMER_LATENCY_USEC_KHR
CONSUMER_ACQUIRE_TIMEOUT_USEC = lib.EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR
SUPPORT_REUSE = lib.EGL_SUPPORT_REUSE_NV
PRODUCER_FRAME = lib.EGL_PRODUCER_FRAME_KHR
CONSUMER_FRAME = lib.EGL_CONSUMER_FRAME_KHR


def _display(display: Any):
    return ffi.cast("EGLDisplay", display) if isinstance(display, int) else display


def _stream(stream: Any):
    return ffi.cast("EGLStreamKHR", stream) if isinstance(stream, int) else stream


def create(display: Any, attributes: list[tuple[int, int]]) -> int:
    """A new stream on ``display`` with ``(attribute, value)`` pairs (``eglCreateStreamKHR``)."""
    handle = lib.eglCreateStreamKHR(_display(display), int_attribs(attributes))
    if handle == ffi.NULL:
        raise egl_error("eglCreateStreamKHR", "creating an EGLStream")
    return address(handle)


def create_from_fd(display: Any, fd: int, doing: str) -> int:
    """Open a stream another process exported (``eglCreateStreamFromFileDescriptorKHR``)."""
    handle = lib.eglCreateStreamFromFileDescriptorKHR(_display(display), fd)
    if handle == ffi.NULL:
        raise egl_error("eglCreateStreamFromFileDescriptorKHR", doing)
    return address(handle)


def destroy(display: Any, stream: Any) -> None:
    """Destroy a stream (finalizers: the driver's answer is not reported)."""
    lib.eglDestroyStreamKHR(_display(display), _stream(stream))


def query(display: Any, stream: Any, attribute: int) -> int:
    """An ``EGLint`` attribute of the stream (``eglQueryStreamKHR``)."""
    value = ffi.new("EGLint *")
    if not lib.eglQueryStreamKHR(_display(display), _stream(stream), attribute, value):
        raise egl_error("eglQueryStreamKHR", "querying the stream")
    return value[0]


def query_u64(display: Any, stream: Any, attribute: int) -> int:
    """A 64-bit attribute of the stream (``eglQueryStreamu64KHR``: the frame counters)."""
    value = ffi.new("EGLuint64KHR *")
    if not lib.eglQueryStreamu64KHR(_display(display), _stream(stream), attribute, value):
        raise egl_error("eglQueryStreamu64KHR", "querying the stream's frame counters")
    return int(value[0])


def set_attribute(display: Any, stream: Any, attribute: int, value: int, doing: str) -> None:
    """``eglStreamAttribKHR``."""
    if not lib.eglStreamAttribKHR(_display(display), _stream(stream), attribute, value):
        raise egl_error("eglStreamAttribKHR", doing)


def export_fd(display: Any, stream: Any) -> int:
    """The stream's file descriptor (``eglGetStreamFileDescriptorKHR``; EGL gives it out once)."""
    fd = lib.eglGetStreamFileDescriptorKHR(_display(display), _stream(stream))
    if fd < 0:
        raise egl_error("eglGetStreamFileDescriptorKHR", "exporting the stream")
    return fd


# ---- GL endpoints (EGL_KHR_stream_consumer_gltexture, EGL_KHR_stream_producer_eglsurface) ------

SURFACE_TYPE_STREAM = lib.EGL_STREAM_BIT_KHR


def _pointer(kind: str, handle: Any):
    return ffi.cast(kind, handle) if isinstance(handle, int) else handle


def gl_consumer_connect(display: Any, stream: Any) -> None:
    """Connect the external texture bound in the current GL context as the stream's consumer."""
    if not lib.eglStreamConsumerGLTextureExternalKHR(_display(display), _stream(stream)):
        raise egl_error("eglStreamConsumerGLTextureExternalKHR", "connecting the GL texture consumer")


def gl_consumer_acquire(display: Any, stream: Any) -> bool:
    """Latch the next frame into the consumer's texture; False when EGL refused (the caller reads
    the error with ``egl_error`` at once, before any other EGL call)."""
    return bool(lib.eglStreamConsumerAcquireKHR(_display(display), _stream(stream)))


def gl_consumer_release(display: Any, stream: Any, quiet: bool = False) -> None:
    """Release the latched frame; ``quiet`` drops a refusal (closing)."""
    if not lib.eglStreamConsumerReleaseKHR(_display(display), _stream(stream)):
        if quiet:
            lib.eglGetError()
            return
        raise egl_error("eglStreamConsumerReleaseKHR", "releasing a frame")


def producer_surface_create(display: Any, config: Any, stream: Any, width: int, height: int) -> int:
    """An EGL surface whose buffer swaps present frames into ``stream``."""
    attributes = int_attribs([(lib.EGL_WIDTH, width), (lib.EGL_HEIGHT, height)])
    surface = lib.eglCreateStreamProducerSurfaceKHR(_display(display), _pointer("EGLConfig", config), _stream(stream),
                                                    attributes)
    if surface == ffi.NULL:
        raise egl_error("eglCreateStreamProducerSurfaceKHR", "connecting the GL surface producer")
    return address(surface)


def producer_surface_destroy(display: Any, surface: int) -> None:
    """Destroy a producer surface (making nothing current first if it is current here)."""
    dpy = _display(display)
    if address(lib.eglGetCurrentSurface(lib.EGL_DRAW)) == surface:
        lib.eglMakeCurrent(dpy, ffi.NULL, ffi.NULL, ffi.NULL)
    lib.eglDestroySurface(dpy, ffi.cast("EGLSurface", surface))


def producer_surface_make_current(display: Any, surface: int, context: Any, gles: bool) -> None:
    lib.eglBindAPI(lib.EGL_OPENGL_ES_API if gles else lib.EGL_OPENGL_API)
    pointer = ffi.cast("EGLSurface", surface)
    if not lib.eglMakeCurrent(_display(display), pointer, pointer, _pointer("EGLContext", context)):
        raise egl_error("eglMakeCurrent", "making the producer surface current")


def current_draw_surface() -> int:
    """The surface the calling thread draws into (0 for none)."""
    return address(lib.eglGetCurrentSurface(lib.EGL_DRAW))


def swap_buffers(display: Any, surface: int) -> None:
    if not lib.eglSwapBuffers(_display(display), ffi.cast("EGLSurface", surface)):
        raise egl_error("eglSwapBuffers", "presenting a frame")
