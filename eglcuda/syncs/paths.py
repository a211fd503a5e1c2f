"""Which path each direction between CUDA and EGLSync takes on a display, and the one-time probe
of GL server waits on reusable syncs that decides how :meth:`eglcuda.Sync.server_wait` works.

The probe tests the driver, not eglcuda's classes: it makes its two syncs through the binding
layer and destroys them before it returns, so this module sits below :mod:`eglcuda.syncs.sync`.
"""
from __future__ import annotations

import dataclasses
import enum

from .._bind import egl_sync
from .._bind.loader import cuda, is_bound
from ..cuda_device import CudaDevice
from ..display import Display, check_display
from ..errors import EglCudaError
from .timeline import bridge_for


class SyncPath(str, enum.Enum):
    """How a direction between CUDA and EGLSync is carried out. Compares equal to its value
    (``SyncPath.NATIVE == "native"``)."""

    NATIVE = "native"  # what the driver offers: EGL_NV_cuda_event, cuEventCreateFromEGLSync
    EMULATED = "emulated"  # eglcuda's stand-in: a host function, or a waiter thread and a flag

    def __str__(self) -> str:
        return self.value


class ServerWaitPath(str, enum.Enum):
    """How a GL server wait on a CUDA sync is carried out (:attr:`eglcuda.Sync.server_wait_path`)."""

    EGL = "egl"  # eglWaitSyncKHR, which the driver honours for this sync
    SEMAPHORE = "semaphore"  # a Vulkan timeline semaphore CUDA signals and GL waits on
    CLIENT_WAIT = "client-wait"  # nothing GPU-side works: this thread waits (blocks)

    def __str__(self) -> str:
        return self.value


_server_wait_verdicts: dict[int, bool] = {}
_EARLIER_WORK_NS = 10_000_000_000  # how long the probe waits for the context's earlier GL work


def server_waits_reusable(display: Display) -> bool:
    """Whether a GL server wait on an unsignaled reusable sync holds back later GL work on this
    display: tested once (cached, needs a current GL context of the display) by queuing a server
    wait, then a fence, and checking the fence stays unsignaled until the sync is signaled."""
    if display._address not in _server_wait_verdicts:
        _server_wait_verdicts[display._address] = _probe_server_wait(display)
    return _server_wait_verdicts[display._address]


def _probe_server_wait(display: Display) -> bool:
    display.require("EGL_KHR_reusable_sync")
    display.require("EGL_KHR_fence_sync")
    dpy = display.handle
    # The context's earlier GL work finishes first: a fence queued behind it would otherwise be
    # late for that alone, and a driver that ignores the wait would pass for one that honours it
    # (later server waits would then order nothing). Work that does not finish in time leaves
    # the verdict at "ignored", whose paths are right on any driver.
    earlier = egl_sync.create(dpy, egl_sync.FENCE, "creating a fence sync (is a GL context of this display current?)")
    try:
        if not _wait(dpy, earlier, _EARLIER_WORK_NS):
            return False
    finally:
        egl_sync.destroy(dpy, earlier)
    blocker = egl_sync.create(dpy, egl_sync.REUSABLE, "creating a reusable sync")
    try:
        egl_sync.server_wait(dpy, blocker, "testing server waits on reusable syncs (is a GL context current?)")
        fence = egl_sync.create(dpy, egl_sync.FENCE, "creating a fence sync (is a GL context of this display current?)")
        try:
            held_back = not _wait(dpy, fence, 50_000_000)
            egl_sync.signal(dpy, blocker, True)
            _wait(dpy, fence, 5_000_000_000)
        finally:
            egl_sync.destroy(dpy, fence)
    finally:
        try:
            if not egl_sync.is_signaled(dpy, blocker):
                egl_sync.signal(dpy, blocker, True)  # GL must not be left waiting on it
        finally:
            egl_sync.destroy(dpy, blocker)
    return held_back


def _wait(dpy: int, sync: int, timeout_ns: int) -> bool:
    """A client wait (flushing the current context first), as :meth:`eglcuda.Sync.wait` does it."""
    return egl_sync.client_wait(dpy, sync, True, timeout_ns)


# ---- which path each direction takes ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SyncPaths:
    cuda_to_egl: SyncPath | None  # None when neither works
    cuda_to_egl_reason: str
    egl_to_cuda: SyncPath | None
    egl_to_cuda_reason: str


def sync_paths(display: Display) -> SyncPaths:
    """How :func:`sync_after_cuda` and :func:`cuda_wait_sync` work on this display, and why."""
    check_display(display, "sync_paths")
    display.require()  # (ClosedError once closed: a closed display supports nothing)
    cuda()
    if display.supports("EGL_NV_cuda_event"):
        to_egl, to_egl_why = SyncPath.NATIVE, "EGL_NV_cuda_event: an EGLSync made from a CUDA event"
    elif display.supports("EGL_KHR_reusable_sync") and is_bound("cuLaunchHostFunc"):
        to_egl, to_egl_why = SyncPath.EMULATED, ("EGL_NV_cuda_event missing: a reusable EGLSync signaled by a host "
                                                 "function queued on the CUDA stream")
    else:
        to_egl, to_egl_why = None, "needs EGL_NV_cuda_event, or EGL_KHR_reusable_sync and cuLaunchHostFunc"
    if is_bound("cuEventCreateFromEGLSync"):
        to_cuda, to_cuda_why = SyncPath.NATIVE, "cuEventCreateFromEGLSync: a CUDA event made from the EGLSync"
    elif is_bound("cuStreamWaitValue32") and is_bound("cuMemHostAlloc"):
        to_cuda, to_cuda_why = SyncPath.EMULATED, ("cuEventCreateFromEGLSync missing: the stream waits on mapped "
                                                   "pinned memory (cuStreamWaitValue32) set by a waiter thread when "
                                                   "the sync signals")
    else:
        to_cuda, to_cuda_why = None, "needs cuEventCreateFromEGLSync, or cuStreamWaitValue32 and cuMemHostAlloc"
    return SyncPaths(to_egl, to_egl_why, to_cuda, to_cuda_why)


def gl_server_wait_path(display: Display, device: int | CudaDevice | None = None) -> tuple[ServerWaitPath, str]:
    """How :meth:`Sync.server_wait` on a sync from :func:`sync_after_cuda` works for the GL
    context current on this thread: (:class:`ServerWaitPath`, why). Builds what the semaphore
    path needs, so the first call can take tens of milliseconds."""
    check_display(display, "gl_server_wait_path")
    display.require()  # (ClosedError once closed)
    if display.supports("EGL_NV_cuda_event"):
        return ServerWaitPath.EGL, "eglWaitSyncKHR on an EGL_NV_cuda_event sync"
    if server_waits_reusable(display):
        return ServerWaitPath.EGL, "this driver honours eglWaitSyncKHR on reusable syncs"
    try:
        bridge_for(display.cuda_device(device)).gl_semaphore()
    except EglCudaError as exc:
        return ServerWaitPath.CLIENT_WAIT, f"eglWaitSyncKHR is ignored on reusable syncs and no semaphore path: {exc}"
    return ServerWaitPath.SEMAPHORE, ("eglWaitSyncKHR is ignored on reusable syncs: the CUDA event signals a Vulkan "
                                      "timeline semaphore that GL waits on (GL_EXT_semaphore_fd, "
                                      "GL_NV_timeline_semaphore)")
