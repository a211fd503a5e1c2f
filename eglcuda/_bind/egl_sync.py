"""The EGLSync calls (EGL_KHR_fence_sync, EGL_KHR_reusable_sync, EGL_KHR_wait_sync,
EGL_NV_cuda_event; csrc/egl_sync.h) and the two CUDA <-> EGLSync bridges the driver offers
(``cuEventCreateFromEGLSync``) or eglcuda builds (a reusable sync signaled by a host function
queued on a CUDA stream, csrc/helpers.c).

Displays, syncs, CUDA events and streams are addresses (ints)."""
from __future__ import annotations

from ..errors import EGLError
from ._native import ffi, lib
from .cuda import check, cuda_error
from .egl import address, egl_error, pointer_attribs

FENCE = lib.EGL_SYNC_FENCE_KHR
REUSABLE = lib.EGL_SYNC_REUSABLE_KHR


def create(display: int, kind: int, doing: str) -> int:
    """A sync of ``kind`` (:data:`FENCE` or :data:`REUSABLE`; ``eglCreateSyncKHR``)."""
    handle = lib.eglCreateSyncKHR(ffi.cast("EGLDisplay", display), kind, ffi.NULL)
    if handle == ffi.NULL:
        raise egl_error("eglCreateSyncKHR", doing)
    return address(handle)


def create_from_cuda_event(display: int, event: int) -> int:
    """A sync signaled when a recorded CUDA event completes (``eglCreateSync`` with
    ``EGL_SYNC_CUDA_EVENT_NV``: EGL 1.5's pointer-sized attributes carry the ``CUevent``)."""
    attributes = pointer_attribs([(lib.EGL_CUDA_EVENT_HANDLE_NV, event)])
    handle = lib.eglCreateSync(ffi.cast("EGLDisplay", display), lib.EGL_SYNC_CUDA_EVENT_NV, attributes)
    if handle == ffi.NULL:
        raise egl_error("eglCreateSync", "making an EGLSync from a CUDA event (EGL_SYNC_CUDA_EVENT_NV)")
    return address(handle)


def destroy(display: int, sync: int, token: int = 0) -> None:
    """Destroy a sync (finalizers: the driver's answer is not reported). With the ``token`` of a
    queued host-function signal (:func:`queue_signal`), the last of the two owners destroys it:
    if the host function has not run yet, it destroys the sync when it does."""
    if token and not lib.eglcuda_sync_signal_abandon(ffi.cast("void *", token)):
        return
    lib.eglDestroySyncKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync))


def is_signaled(display: int, sync: int) -> bool:
    """Whether the sync is signaled now (``EGL_SYNC_STATUS_KHR``)."""
    value = ffi.new("EGLint *")
    if not lib.eglGetSyncAttribKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync),
                                   lib.EGL_SYNC_STATUS_KHR, value):
        raise egl_error("eglGetSyncAttribKHR", "reading the sync's status")
    return value[0] == lib.EGL_SIGNALED_KHR


def client_wait(display: int, sync: int, flush: bool, timeout_ns: int, doing: str = "waiting for the sync") -> bool:
    """``eglClientWaitSyncKHR`` (GIL released): True once signaled, False when ``timeout_ns``
    passed. ``flush`` flushes the current context first. Failures raise :class:`EGLError`."""
    flags = lib.EGL_SYNC_FLUSH_COMMANDS_BIT_KHR if flush else 0
    result = lib.eglClientWaitSyncKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync), flags,
                                      timeout_ns)
    if result == lib.EGL_CONDITION_SATISFIED_KHR:
        return True
    if result == lib.EGL_TIMEOUT_EXPIRED_KHR:
        return False
    code = lib.eglGetError()
    if code == lib.EGL_SUCCESS:
        # EGL_FALSE with no error: Mesa 22 answers so when a reusable sync is signaled during a
        # finite wait. The status says what happened.
        return is_signaled(display, sync)
    raise EGLError(code, "eglClientWaitSyncKHR", doing)


def server_wait(display: int, sync: int, doing: str) -> None:
    """``eglWaitSyncKHR``: GL commands issued next in the current context wait on the GPU."""
    if not lib.eglWaitSyncKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync), 0):
        raise egl_error("eglWaitSyncKHR", doing)


def signal(display: int, sync: int, signaled: bool) -> None:
    """Signal (or unsignal) a reusable sync (``eglSignalSyncKHR``)."""
    mode = lib.EGL_SIGNALED_KHR if signaled else lib.EGL_UNSIGNALED_KHR
    if not lib.eglSignalSyncKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync), mode):
        raise egl_error("eglSignalSyncKHR", "signaling the sync")


# ---- CUDA <-> EGLSync ----------------------------------------------------------------------------

def queue_signal(display: int, sync: int, stream: int) -> int:
    """Queue on CUDA ``stream`` a host function that signals the reusable ``sync`` when the stream
    reaches it (``cuLaunchHostFunc``, csrc/helpers.c). Returns the token :func:`destroy` takes:
    the sync is then owned by the token's holder and the host function together."""
    status = ffi.new("CUresult *")
    token = lib.eglcuda_sync_signal_queue(ffi.cast("EGLDisplay", display), ffi.cast("EGLSyncKHR", sync),
                                          ffi.cast("CUstream", stream), status)
    if token == ffi.NULL:
        raise cuda_error(status[0], "cuLaunchHostFunc", "queuing the sync's signal on the CUDA stream")
    return address(token)


def cuda_event_from_sync(sync: int) -> int:
    """A CUDA event (current context) that completes when ``sync`` is signaled
    (``cuEventCreateFromEGLSync``); the caller destroys it."""
    event = ffi.new("CUevent *")
    check(lib.cuEventCreateFromEGLSync(event, ffi.cast("void *", sync), 0), "cuEventCreateFromEGLSync")
    return address(event[0])
