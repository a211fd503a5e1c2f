"""EGLSync objects and their bridges to CUDA streams (section 4.3 of NVIDIA's EGL interop guide).

- :class:`Sync`: fence syncs (signaled when the GL commands before them complete) and reusable
  syncs (signaled and unsignaled by hand), with client waits (the calling thread waits, with a
  timeout), server waits (the current GL context's GPU work waits, the CPU does not) and status.
- :func:`sync_after_cuda`: a sync that becomes signaled when a CUDA stream reaches this point.
  Native with ``EGL_NV_cuda_event`` (an EGLSync made from a recorded CUDA event); elsewhere a
  reusable sync signaled by a host function queued on the stream.
- :func:`cuda_wait_sync`: make a CUDA stream wait for a sync without blocking the calling thread.
  Native with ``cuEventCreateFromEGLSync``; elsewhere the stream waits on a word of mapped pinned
  memory (``cuStreamWaitValue32``) that a waiter thread sets once the sync signals (the waiter
  sleeps in ``eglClientWaitSyncKHR``; no core spins).

:func:`sync_paths` says which path each direction takes on a display.
"""
from __future__ import annotations

import dataclasses
import enum
import threading
import weakref
from typing import Any

from ._cuda import CudaDevice, check, cuda_error
from ._display import Display
from ._egl import EGL_FOREVER, address, egl_error, pointer_attribs
from ._errors import ClosedError, EglCudaError, EGLError, Timeout, Unsupported, UsageError
from ._interop import stream_handle
from ._loader import is_bound
from ._native import ffi, lib
from ._timeline import bridge_for

NATIVE = "native"
EMULATED = "emulated"
# How a GL server wait on a CUDA sync is carried out (Sync.server_wait_path).
SERVER_WAIT_EGL = "egl"              # eglWaitSyncKHR, which the driver honours for this sync
SERVER_WAIT_SEMAPHORE = "semaphore"  # a Vulkan timeline semaphore CUDA signals and GL waits on
SERVER_WAIT_CLIENT = "client-wait"   # nothing GPU-side works: this thread waits (blocks)


class SyncKind(enum.Enum):
    FENCE = "fence"
    REUSABLE = "reusable"
    CUDA = "cuda"  # signaled by a CUDA stream (native CUDA-event sync, or emulated)


def _destroy_sync(display_address: int, sync_address: int, token_address: int) -> None:
    """Finalizer. With a queued host-function signal, the last of the two owners destroys."""
    try:
        if token_address and not lib.eglcuda_sync_signal_abandon(ffi.cast("void *", token_address)):
            return  # the host function has not run yet: it destroys the sync when it does
        lib.eglDestroySyncKHR(ffi.cast("EGLDisplay", display_address), ffi.cast("EGLSyncKHR", sync_address))
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return EGL_FOREVER
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < 1e9:
        raise UsageError(f"timeout is seconds >= 0 (or None: forever), got {timeout!r}")
    return int(timeout * 1e9)


class Sync:
    """An EGLSync on a display. Make one with :meth:`fence`, :meth:`reusable` or
    :func:`sync_after_cuda`; :meth:`close` (or garbage collection) destroys it."""

    def __init__(self, display: Display, handle, kind: SyncKind, path: str | None = None, token=None,
                 keep: Any = None, device: CudaDevice | None = None) -> None:
        self.display = display
        self.kind = kind
        self.path = path  # for CUDA syncs: NATIVE or EMULATED
        self.server_wait_path: str | None = None  # set by server_wait: SERVER_WAIT_*
        self._device = device
        self._address = address(handle)
        self._token = token
        self._keep = keep  # what the native CUDA-event sync must outlive (the event)
        token_address = int(ffi.cast("uintptr_t", token)) if token is not None else 0
        self._finalizer = weakref.finalize(self, _destroy_sync, display._address, self._address, token_address)
        display._adopt(self)

    @classmethod
    def fence(cls, display: Display) -> "Sync":
        """A fence: signaled once the GL commands issued before it (in the context current on this
        thread, which must belong to ``display``) have completed."""
        display.require("EGL_KHR_fence_sync")
        handle = lib.eglCreateSyncKHR(display.handle, lib.EGL_SYNC_FENCE_KHR, ffi.NULL)
        if handle == ffi.NULL:
            raise egl_error("eglCreateSyncKHR", "creating a fence sync (is a GL context of this display current?)")
        return cls(display, handle, SyncKind.FENCE)

    @classmethod
    def reusable(cls, display: Display, signaled: bool = False) -> "Sync":
        """A reusable sync, signaled and unsignaled with :meth:`signal` / :meth:`unsignal`."""
        display.require("EGL_KHR_reusable_sync")
        handle = lib.eglCreateSyncKHR(display.handle, lib.EGL_SYNC_REUSABLE_KHR, ffi.NULL)
        if handle == ffi.NULL:
            raise egl_error("eglCreateSyncKHR", "creating a reusable sync")
        sync = cls(display, handle, SyncKind.REUSABLE)
        if signaled:
            sync.signal()
        return sync

    # ---- state ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.display.closed

    @property
    def handle(self):
        """The raw ``EGLSyncKHR``."""
        if self.closed:
            raise ClosedError("the sync is closed (or its display is)")
        return ffi.cast("EGLSyncKHR", self._address)

    @property
    def signaled(self) -> bool:
        """Whether the sync is signaled now (``EGL_SYNC_STATUS_KHR``)."""
        value = ffi.new("EGLint *")
        if not lib.eglGetSyncAttribKHR(self.display.handle, self.handle, lib.EGL_SYNC_STATUS_KHR, value):
            raise egl_error("eglGetSyncAttribKHR", "reading the sync's status")
        return value[0] == lib.EGL_SIGNALED_KHR

    # ---- waits and signals ---------------------------------------------------------------------
    def wait(self, timeout: float | None = None, flush: bool = True) -> bool:
        """Client wait: block this thread (GIL released) until the sync is signaled (True) or
        ``timeout`` seconds pass (False). ``flush`` flushes the current context first, so a fence
        made there can signal. ``timeout=None`` waits forever; 0 only tests."""
        ns = _timeout_ns(timeout)
        flags = lib.EGL_SYNC_FLUSH_COMMANDS_BIT_KHR if flush else 0
        result = lib.eglClientWaitSyncKHR(self.display.handle, self.handle, flags, ns)
        if result == lib.EGL_CONDITION_SATISFIED_KHR:
            return True
        if result == lib.EGL_TIMEOUT_EXPIRED_KHR:
            return False
        code = lib.eglGetError()
        if code == lib.EGL_SUCCESS:
            # Mesa 22 answers EGL_FALSE without an error when a reusable sync is signaled during a
            # finite wait: the status says what happened.
            return self.signaled
        raise EGLError(code, "eglClientWaitSyncKHR", "waiting for the sync")

    def server_wait(self, timeout: float | None = None) -> bool:
        """Server wait: GL commands issued after this in the current context wait on the GPU until
        the sync is signaled, and this thread does not wait. Returns whether this thread waited
        (False for a real server wait); :attr:`server_wait_path` says how it was done.

        - ``"egl"``: ``eglWaitSyncKHR``, for fences, native CUDA-event syncs, and reusable syncs
          on drivers that honour it.
        - ``"semaphore"``: an emulated CUDA sync on a driver that ignores ``eglWaitSyncKHR`` on
          reusable syncs (measured: NVIDIA 580). The CUDA event behind the sync signals a
          timeline semaphore that GL waits on (:mod:`eglcuda._timeline`; needs Vulkan and
          ``GL_EXT_semaphore_fd`` + ``GL_NV_timeline_semaphore``).
        - ``"client-wait"``: where neither works (or for a reusable sync signaled by hand on such
          a driver), this thread waits for the sync, up to ``timeout`` seconds (:class:`Timeout`
          past it). GL stays ordered after the sync, at the cost of blocking: returns True."""
        self.display.require("EGL_KHR_wait_sync")
        handle = self.handle
        if self.kind is not SyncKind.FENCE and self.path != NATIVE and not server_waits_reusable(self.display):
            if self.kind is SyncKind.CUDA and self._keep is not None:
                try:
                    bridge = bridge_for(self._device)
                except EglCudaError:
                    bridge = None  # no GPU-side path on this machine: the client wait below
                if bridge is not None:
                    try:
                        bridge.gl_wait_for_event(self._keep.handle)
                        self.server_wait_path = SERVER_WAIT_SEMAPHORE
                        return False
                    except Unsupported:
                        pass  # this GL context lacks the semaphore extensions
            self.server_wait_path = SERVER_WAIT_CLIENT
            if not self.wait(timeout):
                raise Timeout(f"the sync was not signaled within {timeout} s")
            return True
        if not lib.eglWaitSyncKHR(self.display.handle, handle, 0):
            raise egl_error("eglWaitSyncKHR", "queuing a server wait on the sync (is a GL context current?)")
        self.server_wait_path = SERVER_WAIT_EGL
        return False

    def signal(self) -> None:
        """Signal a reusable sync (wakes every waiter)."""
        self._signal(lib.EGL_SIGNALED_KHR)

    def unsignal(self) -> None:
        """Unsignal a reusable sync, so it can be waited for again."""
        self._signal(lib.EGL_UNSIGNALED_KHR)

    def _signal(self, mode: int) -> None:
        if self.kind is not SyncKind.REUSABLE:
            raise UsageError(f"only reusable syncs are signaled by hand; this one is a {self.kind.value} sync")
        if not lib.eglSignalSyncKHR(self.display.handle, self.handle, mode):
            raise egl_error("eglSignalSyncKHR", "signaling the sync")

    def close(self) -> None:
        """Destroy the sync (a CUDA sync whose stream has not reached it yet is destroyed when it
        does). Safe to call twice."""
        self._finalizer()

    def __enter__(self) -> "Sync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        path = f" {self.path}" if self.path else ""
        return f"<Sync {self.kind.value}{path}{' closed' if self.closed else ''}>"


_server_wait_verdicts: dict[int, bool] = {}


def server_waits_reusable(display: Display) -> bool:
    """Whether a GL server wait on an unsignaled reusable sync holds back later GL work on this
    display: tested once (cached, needs a current GL context of the display) by queuing a server
    wait, then a fence, and checking the fence stays unsignaled until the sync is signaled."""
    if display._address not in _server_wait_verdicts:
        blocker = Sync.reusable(display)
        try:
            if not lib.eglWaitSyncKHR(display.handle, blocker.handle, 0):
                raise egl_error("eglWaitSyncKHR", "testing server waits on reusable syncs (is a GL context current?)")
            fence = Sync.fence(display)
            held_back = not fence.wait(timeout=0.05)
            blocker.signal()
            fence.wait(timeout=5)
            fence.close()
        finally:
            if not blocker.closed and not blocker.signaled:
                blocker.signal()
            blocker.close()
        _server_wait_verdicts[display._address] = held_back
    return _server_wait_verdicts[display._address]


# ---- which path each direction takes ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SyncPaths:
    cuda_to_egl: str | None  # NATIVE, EMULATED, or None when neither works
    cuda_to_egl_reason: str
    egl_to_cuda: str | None
    egl_to_cuda_reason: str


def sync_paths(display: Display) -> SyncPaths:
    """How :func:`sync_after_cuda` and :func:`cuda_wait_sync` work on this display, and why."""
    from ._loader import cuda

    cuda()
    if display.supports("EGL_NV_cuda_event"):
        to_egl, to_egl_why = NATIVE, "EGL_NV_cuda_event: an EGLSync made from a CUDA event"
    elif display.supports("EGL_KHR_reusable_sync") and is_bound("cuLaunchHostFunc"):
        to_egl, to_egl_why = EMULATED, ("EGL_NV_cuda_event missing: a reusable EGLSync signaled by a host "
                                        "function queued on the CUDA stream")
    else:
        to_egl, to_egl_why = None, "needs EGL_NV_cuda_event, or EGL_KHR_reusable_sync and cuLaunchHostFunc"
    if is_bound("cuEventCreateFromEGLSync"):
        to_cuda, to_cuda_why = NATIVE, "cuEventCreateFromEGLSync: a CUDA event made from the EGLSync"
    elif is_bound("cuStreamWaitValue32") and is_bound("cuMemHostAlloc"):
        to_cuda, to_cuda_why = EMULATED, ("cuEventCreateFromEGLSync missing: the stream waits on mapped pinned "
                                          "memory (cuStreamWaitValue32) set by a waiter thread when the sync signals")
    else:
        to_cuda, to_cuda_why = None, "needs cuEventCreateFromEGLSync, or cuStreamWaitValue32 and cuMemHostAlloc"
    return SyncPaths(to_egl, to_egl_why, to_cuda, to_cuda_why)


def gl_server_wait_path(display: Display, device: int | CudaDevice | None = None) -> tuple[str, str]:
    """How :meth:`Sync.server_wait` on a sync from :func:`sync_after_cuda` works for the GL
    context current on this thread: (``"egl"``, ``"semaphore"`` or ``"client-wait"``, why).
    Builds what the semaphore path needs, so the first call can take tens of milliseconds."""
    if display.supports("EGL_NV_cuda_event"):
        return SERVER_WAIT_EGL, "eglWaitSyncKHR on an EGL_NV_cuda_event sync"
    if server_waits_reusable(display):
        return SERVER_WAIT_EGL, "this driver honours eglWaitSyncKHR on reusable syncs"
    try:
        bridge_for(display.cuda_device(device)).gl_semaphore()
    except EglCudaError as exc:
        return SERVER_WAIT_CLIENT, f"eglWaitSyncKHR is ignored on reusable syncs and no semaphore path: {exc}"
    return SERVER_WAIT_SEMAPHORE, ("eglWaitSyncKHR is ignored on reusable syncs: the CUDA event signals a Vulkan "
                                   "timeline semaphore that GL waits on (GL_EXT_semaphore_fd, GL_NV_timeline_semaphore)")


# ---- CUDA -> EGL ---------------------------------------------------------------------------------

def sync_after_cuda(display: Display, cuda_stream: Any = None, device: int | CudaDevice | None = None,
                    path: str = "auto") -> Sync:
    """A sync that becomes signaled when ``cuda_stream`` (default: the legacy stream) reaches the
    work queued so far. Returns at once; GL waits on it with :meth:`Sync.wait` or
    :meth:`Sync.server_wait`. ``path``: "auto", "native" or "emulated"."""
    paths = sync_paths(display)
    chosen = paths.cuda_to_egl if path == "auto" else path
    if path not in ("auto", NATIVE, EMULATED):
        raise UsageError(f"path is 'auto', 'native' or 'emulated', got {path!r}")
    if chosen is None:
        raise Unsupported("CUDA -> EGLSync", where=display.description, hint=paths.cuda_to_egl_reason)
    cuda_device = display.cuda_device(device)
    cuda_device.make_current()
    stream = ffi.cast("CUstream", stream_handle(cuda_stream))
    if chosen == NATIVE:
        display.require("EGL_NV_cuda_event")
        keep = _Event.recorded(stream)
        attribs = pointer_attribs([(lib.EGL_CUDA_EVENT_HANDLE_NV, int(ffi.cast("uintptr_t", keep.handle)))])
        handle = lib.eglCreateSync(display.handle, lib.EGL_SYNC_CUDA_EVENT_NV, attribs)
        if handle == ffi.NULL:
            raise egl_error("eglCreateSync", "making an EGLSync from a CUDA event (EGL_SYNC_CUDA_EVENT_NV)")
        return Sync(display, handle, SyncKind.CUDA, NATIVE, keep=keep, device=cuda_device)
    display.require("EGL_KHR_reusable_sync")
    keep = _Event.recorded(stream)  # the same stream point, for GL server waits (Sync.server_wait)
    handle = lib.eglCreateSyncKHR(display.handle, lib.EGL_SYNC_REUSABLE_KHR, ffi.NULL)
    if handle == ffi.NULL:
        raise egl_error("eglCreateSyncKHR", "creating the reusable sync a CUDA stream signals")
    queued = ffi.new("CUresult *")
    token = lib.eglcuda_sync_signal_queue(display.handle, handle, stream, queued)
    if token == ffi.NULL:
        lib.eglDestroySyncKHR(display.handle, handle)
        raise cuda_error(queued[0], "cuLaunchHostFunc", "queuing the sync's signal on the CUDA stream")
    return Sync(display, handle, SyncKind.CUDA, EMULATED, token=token, keep=keep, device=cuda_device)


class _Event:
    """A CUDA event destroyed with its owner."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self._finalizer = weakref.finalize(self, lib.cuEventDestroy, handle)

    @classmethod
    def recorded(cls, stream) -> "_Event":
        """A timing-free event recorded on ``stream`` now (the current context's device)."""
        event = ffi.new("CUevent *")
        check(lib.cuEventCreate(event, lib.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        owned = cls(event[0])
        check(lib.cuEventRecord(event[0], stream), "cuEventRecord", "recording the event the sync follows")
        return owned


# ---- EGL -> CUDA ---------------------------------------------------------------------------------

class _FlagPool:
    """Words of mapped pinned memory for stream waits, one per pending wait. Each word only grows:
    a wait for value v+1 is satisfied once the waiter stores v+1, and a word is handed out again
    only after that store, so a stream still waiting on it cannot be released by a later wait."""

    SLOTS = 4096

    def __init__(self, device: CudaDevice) -> None:
        self.device = device
        device.make_current()
        host = ffi.new("void **")
        check(lib.cuMemHostAlloc(host, 4 * self.SLOTS, lib.CU_MEMHOSTALLOC_DEVICEMAP | lib.CU_MEMHOSTALLOC_PORTABLE),
              "cuMemHostAlloc", "allocating the flags CUDA streams wait on")
        self.host = ffi.cast("uint32_t *", host[0])
        device_pointer = ffi.new("CUdeviceptr *")
        check(lib.cuMemHostGetDevicePointer(device_pointer, host[0], 0), "cuMemHostGetDevicePointer")
        self.device_base = int(device_pointer[0])
        for i in range(self.SLOTS):
            self.host[i] = 0
        self.free = list(range(self.SLOTS))
        self.lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        with self.lock:
            if not self.free:
                raise UsageError(f"{self.SLOTS} EGLSync waits are pending on CUDA streams; let some finish")
            slot = self.free.pop()
        return slot, int(self.host[slot]) + 1

    def give_back(self, slot: int) -> None:
        with self.lock:
            self.free.append(slot)


_pools: dict[int, _FlagPool] = {}
_pools_lock = threading.Lock()
_waiters: set[threading.Thread] = set()
_WAIT_SLICE_NS = 100_000_000  # waiter threads look for cancellation every 0.1 s


def _pool(device: CudaDevice) -> _FlagPool:
    with _pools_lock:
        if device.ordinal not in _pools:
            _pools[device.ordinal] = _FlagPool(device)
        return _pools[device.ordinal]


class CudaWait:
    """A pending wait of a CUDA stream on an EGLSync (what :func:`cuda_wait_sync` returns).

    ``path`` is NATIVE or EMULATED. For the emulation, :meth:`done` says whether the sync has
    released the stream, and :meth:`cancel` releases the stream without the sync (for teardown:
    the stream then runs on unordered)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._released = threading.Event()
        self._cancel = threading.Event()
        self.timed_out = False

    def done(self) -> bool:
        return self._released.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the stream has been released (emulation); True when it has."""
        return self._released.wait(timeout)

    def cancel(self) -> None:
        self._cancel.set()


def cuda_wait_sync(sync: Sync, cuda_stream: Any = None, device: int | CudaDevice | None = None,
                   path: str = "auto", timeout: float | None = None) -> CudaWait:
    """Make ``cuda_stream`` (default: the legacy stream) wait until ``sync`` is signaled; returns
    at once. Work queued on the stream afterwards runs after the sync signals.

    The emulation's waiter thread gives up after ``timeout`` seconds (None: never) and then
    releases the stream anyway, setting :attr:`CudaWait.timed_out`, so a sync that never signals
    cannot hang the stream forever."""
    if path not in ("auto", NATIVE, EMULATED):
        raise UsageError(f"path is 'auto', 'native' or 'emulated', got {path!r}")
    display = sync.display
    paths = sync_paths(display)
    chosen = paths.egl_to_cuda if path == "auto" else path
    if chosen is None:
        raise Unsupported("EGLSync -> CUDA", where=display.description, hint=paths.egl_to_cuda_reason)
    deadline_ns = _timeout_ns(timeout)
    cuda_device = display.cuda_device(device)
    cuda_device.make_current()
    stream = ffi.cast("CUstream", stream_handle(cuda_stream))
    handle = sync.handle
    if chosen == NATIVE:
        event = ffi.new("CUevent *")
        check(lib.cuEventCreateFromEGLSync(event, handle, 0), "cuEventCreateFromEGLSync")
        try:
            check(lib.cuStreamWaitEvent(stream, event[0], 0), "cuStreamWaitEvent")
        finally:
            lib.cuEventDestroy(event[0])
        wait = CudaWait(NATIVE)
        wait._released.set()
        return wait
    pool = _pool(cuda_device)
    slot, value = pool.take()
    status = lib.cuStreamWaitValue32(stream, pool.device_base + 4 * slot, value, lib.CU_STREAM_WAIT_VALUE_GEQ)
    if status:
        pool.give_back(slot)
        raise cuda_error(status, "cuStreamWaitValue32", "making the CUDA stream wait on the sync's flag")
    wait = CudaWait(EMULATED)
    dpy = display.handle

    def waiter() -> None:
        waited = 0
        try:
            while not wait._cancel.is_set():
                step = _WAIT_SLICE_NS if deadline_ns == EGL_FOREVER else max(0, min(_WAIT_SLICE_NS, deadline_ns - waited))
                result = lib.eglClientWaitSyncKHR(dpy, handle, 0, step)
                if result == lib.EGL_CONDITION_SATISFIED_KHR:
                    break
                if result != lib.EGL_TIMEOUT_EXPIRED_KHR:
                    # EGL_FALSE: a broken or destroyed sync releases the stream rather than hang
                    # it; Mesa also answers EGL_FALSE, with no error, for a signal during the wait.
                    if lib.eglGetError() != lib.EGL_SUCCESS or sync.closed or sync.signaled:
                        break
                waited += step
                if deadline_ns != EGL_FOREVER and waited >= deadline_ns:
                    wait.timed_out = True
                    break
        finally:
            lib.eglcuda_store_flag(pool.host + slot, value)
            pool.give_back(slot)
            wait._released.set()
            _waiters.discard(threading.current_thread())

    thread = threading.Thread(target=waiter, name="eglcuda-sync-waiter", daemon=True)
    wait._keep = sync  # the sync must outlive the waiter's EGL calls
    _waiters.add(thread)
    thread.start()
    return wait


def pending_waiters() -> int:
    """Waiter threads still running (for tests and teardown checks)."""
    return sum(1 for thread in list(_waiters) if thread.is_alive())
