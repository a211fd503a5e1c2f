"""CUDA interprocess memory and events (csrc/cuda_ipc.h), and the peer-access query the topic
layer chooses transports with (a device's UUID is :func:`eglcuda._bind.cuda.instance_uuid`).

Handles cross the process boundary as 64 raw bytes; events stay inside this module as
:class:`Event` boxes (upper layers never see a cffi object). ``record`` and ``wait`` are on the
per-frame path of the ``cuda-ipc`` topic transport: they take the stream as an int and cache its
cast, so a call costs one dictionary lookup and the driver call.
"""
from __future__ import annotations

from . import loader as _loader
from ._native import ffi, lib
from .cuda import check, cuda_error

HANDLE_SIZE = 64
EVENT_INTERPROCESS = lib.CU_EVENT_INTERPROCESS
LAZY_ENABLE_PEER_ACCESS = lib.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
ATTRIBUTE_IPC_EVENT_SUPPORTED = lib.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED

_streams: dict[int, object] = {}  # int -> CUstream cdata; a stream address is never reused by us before exit


def _stream(stream: int):
    cast = _streams.get(stream)
    if cast is None:
        if len(_streams) > 4096:  # streams come and go in long runs: keep the cache small
            _streams.clear()
        cast = _streams[stream] = ffi.cast("CUstream", stream)
    return cast


class Event:
    """A ``CUevent`` this process created or opened from another process's handle. Destroyed
    by :func:`event_destroy` (the owner calls it; an opened event is closed the same way)."""

    __slots__ = ("handle", "address", "__weakref__")

    def __init__(self, handle) -> None:
        self.handle = handle
        self.address = int(ffi.cast("uintptr_t", handle))  # for the compiled per-frame steps


def require() -> None:
    """Raise :class:`eglcuda.Unsupported` unless libcuda exports the interprocess calls."""
    for name in ("cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle", "cuIpcGetEventHandle",
                 "cuIpcOpenEventHandle"):
        _loader.require_cuda_entry(name)


# ---- memory -------------------------------------------------------------------------------------

def mem_handle(pointer: int, doing: str = "exporting device memory to other processes") -> bytes:
    """The interprocess handle of the allocation starting at ``pointer`` (``cuIpcGetMemHandle``;
    ``pointer`` must be the base of a ``cuMemAlloc`` allocation), in the current context."""
    handle = ffi.new("CUipcMemHandle *")
    check(lib.cuIpcGetMemHandle(handle, pointer), "cuIpcGetMemHandle", doing)
    return bytes(ffi.buffer(handle.reserved, HANDLE_SIZE))


def open_mem_handle(handle: bytes, doing: str = "mapping another process's device memory") -> int:
    """Map another process's allocation into the current context (``cuIpcOpenMemHandle`` with
    lazy peer access, so a GPU other than the exporter's maps it through peer access)."""
    if len(handle) != HANDLE_SIZE:
        raise ValueError(f"an interprocess memory handle is {HANDLE_SIZE} bytes, got {len(handle)}")
    box = ffi.new("CUipcMemHandle *")
    ffi.memmove(box.reserved, handle, HANDLE_SIZE)
    pointer = ffi.new("CUdeviceptr *")
    check(lib.cuIpcOpenMemHandle(pointer, box[0], LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle", doing)
    return int(pointer[0])


def close_mem_handle(pointer: int) -> int:
    """Unmap memory opened with :func:`open_mem_handle`; returns the driver's status (finalizers
    and teardown ignore it)."""
    return lib.cuIpcCloseMemHandle(pointer)


# ---- events -------------------------------------------------------------------------------------

def event_create_interprocess(doing: str = "creating an interprocess event") -> Event:
    """A new event that other processes can open (interprocess events must not record timing)."""
    event = ffi.new("CUevent *")
    check(lib.cuEventCreate(event, EVENT_INTERPROCESS | lib.CU_EVENT_DISABLE_TIMING), "cuEventCreate", doing)
    return Event(event[0])


def event_handle(event: Event, doing: str = "exporting an event to other processes") -> bytes:
    handle = ffi.new("CUipcEventHandle *")
    check(lib.cuIpcGetEventHandle(handle, event.handle), "cuIpcGetEventHandle", doing)
    return bytes(ffi.buffer(handle.reserved, HANDLE_SIZE))


def open_event_handle(handle: bytes, doing: str = "opening another process's event") -> Event:
    if len(handle) != HANDLE_SIZE:
        raise ValueError(f"an interprocess event handle is {HANDLE_SIZE} bytes, got {len(handle)}")
    box = ffi.new("CUipcEventHandle *")
    ffi.memmove(box.reserved, handle, HANDLE_SIZE)
    event = ffi.new("CUevent *")
    check(lib.cuIpcOpenEventHandle(event, box[0]), "cuIpcOpenEventHandle", doing)
    return Event(event[0])


def event_destroy(event: Event) -> int:
    """Destroy an event (made here or opened); returns the driver's status."""
    return lib.cuEventDestroy(event.handle)


def record(event: Event, stream: int) -> None:
    """``cuEventRecord(event, stream)`` in the current context: the per-frame call."""
    status = lib.cuEventRecord(event.handle, _stream(stream))
    if status:
        raise cuda_error(status, "cuEventRecord", "recording a frame's event")


def wait(stream: int, event: Event) -> None:
    """Make ``stream`` wait for the last record of ``event`` (``cuStreamWaitEvent``): no host wait."""
    status = lib.cuStreamWaitEvent(_stream(stream), event.handle, 0)
    if status:
        raise cuda_error(status, "cuStreamWaitEvent", "ordering a stream after a frame's event")


def event_done(event: Event) -> bool:
    """Whether the work before the event's last record is done (``cuEventQuery``; an event never
    recorded counts as done). Raises on errors other than "not ready"."""
    status = lib.cuEventQuery(event.handle)
    if status == lib.CUDA_ERROR_NOT_READY:
        return False
    if status:
        raise cuda_error(status, "cuEventQuery", "asking whether an event completed")
    return True


def stream_done(stream: int) -> bool:
    """Whether ``stream``'s queued work is done (``cuStreamQuery``); False also on errors."""
    return lib.cuStreamQuery(_stream(stream)) == 0


# ---- peer access --------------------------------------------------------------------------------

def can_access_peer(device: int, peer: int) -> bool:
    """Whether contexts on ``device`` can map memory of ``peer`` (both CUdevice handles)."""
    out = ffi.new("int *")
    check(lib.cuDeviceCanAccessPeer(out, device, peer), "cuDeviceCanAccessPeer")
    return bool(out[0])
