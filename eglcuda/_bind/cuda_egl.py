"""The CUDA driver's EGLStream endpoints outside the per-frame path: connecting, disconnecting,
and the CUDA streams the endpoints own. (The per-frame calls go through csrc/hot_api.h.)"""
from __future__ import annotations

from typing import Any

from ._native import ffi, lib
from .cuda import check, cuda_error
from .egl import address


class Connection:
    """A ``CUeglStreamConnection`` in memory of its own: the driver takes its address in every
    endpoint call, so it must not move for the connection's life (the endpoint and its finalizer
    both keep this object)."""

    __slots__ = ("box",)

    def __init__(self) -> None:
        self.box = ffi.new("CUeglStreamConnection *")


def connection_address(connection: Connection) -> int:
    """The address the per-frame helpers take (a ``CUeglStreamConnection *``)."""
    return address(connection.box)


def _stream(stream: Any):
    return ffi.cast("EGLStreamKHR", stream) if isinstance(stream, int) else stream


def consumer_connect(stream: Any, location: int | None) -> Connection:
    """Connect the current CUDA context as the consumer of ``stream`` (an ``EGLStreamKHR``);
    ``location`` is a ``CUeglResourceLocationFlags`` value or None for the driver's choice."""
    connection = Connection()
    stream = _stream(stream)
    if location is None:
        status, call = lib.cuEGLStreamConsumerConnect(connection.box, stream), "cuEGLStreamConsumerConnect"
    else:
        status = lib.cuEGLStreamConsumerConnectWithFlags(connection.box, stream, int(location))
        call = "cuEGLStreamConsumerConnectWithFlags"
    check(status, call, "connecting the CUDA consumer")
    return connection


def producer_connect(stream: Any, width: int, height: int) -> Connection:
    """Connect the current CUDA context as the producer of ``width`` x ``height`` frames."""
    connection = Connection()
    check(lib.cuEGLStreamProducerConnect(connection.box, _stream(stream), width, height), "cuEGLStreamProducerConnect",
          "connecting the CUDA producer")
    return connection


def disconnect(context: int, which: str, connection: Connection, own_stream: int) -> None:
    """Disconnect an endpoint in ``context`` (its device's primary context) and destroy the CUDA
    stream it made (``own_stream``, 0 for none). Returns without raising when the driver refuses
    (called from finalizers, also at interpreter exit)."""
    lib.eglcuda_ensure_current(ffi.cast("CUcontext", context))
    if which == "consumer":
        lib.cuEGLStreamConsumerDisconnect(connection.box)
    else:
        lib.cuEGLStreamProducerDisconnect(connection.box)
    if own_stream:
        lib.cuStreamDestroy(ffi.cast("CUstream", own_stream))


def stream_create() -> int:
    """A new blocking CUDA stream (flags 0: ordered with the legacy default stream, where many
    users' kernels run) in the current context, as an address."""
    created = ffi.new("CUstream *")
    check(lib.cuStreamCreate(created, 0), "cuStreamCreate", "creating a CUDA stream")
    return address(created[0])


def stream_destroy(stream: int) -> None:
    status = lib.cuStreamDestroy(ffi.cast("CUstream", stream))
    if status:
        raise cuda_error(status, "cuStreamDestroy")


# ---- frame descriptions --------------------------------------------------------------------------
# CUeglColorFormat values of the formats eglcuda allocates (cudaEGL.h).
COLOR_FORMAT_ARGB = lib.CU_EGL_COLOR_FORMAT_ARGB
COLOR_FORMAT_ABGR = lib.CU_EGL_COLOR_FORMAT_ABGR
COLOR_FORMAT_RGBA = lib.CU_EGL_COLOR_FORMAT_RGBA
COLOR_FORMAT_BGRA = lib.CU_EGL_COLOR_FORMAT_BGRA
COLOR_FORMAT_A = lib.CU_EGL_COLOR_FORMAT_A
COLOR_FORMAT_YUV420_PLANAR = lib.CU_EGL_COLOR_FORMAT_YUV420_PLANAR
COLOR_FORMAT_YUV420_SEMIPLANAR = lib.CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR
COLOR_FORMAT_YUV444_PLANAR = lib.CU_EGL_COLOR_FORMAT_YUV444_PLANAR
# CUeglResourceLocationFlags
RESOURCE_LOCATION_SYSMEM = lib.CU_EGL_RESOURCE_LOCATION_SYSMEM
RESOURCE_LOCATION_VIDMEM = lib.CU_EGL_RESOURCE_LOCATION_VIDMEM
