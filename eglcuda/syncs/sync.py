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

:func:`sync_paths` (:mod:`eglcuda.syncs.paths`) says which path each direction takes on a display.
"""
from __future__ import annotations

import enum
import threading
from typing import Any

from .._bind import cuda, egl_sync
from .._bind.egl import EGL_FOREVER
from .._integers import check_flag
from .._unix import wait_seconds
from .._resource import Resource
from ..cuda_device import CudaDevice
from ..display import Display, check_display
from ..errors import ClosedError, CUDAError, EglCudaError, EGLError, Timeout, Unsupported, UsageError
from ..frames.interop import stream_handle
from .paths import ServerWaitPath, SyncPath, server_waits_reusable, sync_paths
from .timeline import bridge_for


class SyncKind(enum.Enum):
    FENCE = "fence"
    REUSABLE = "reusable"
    CUDA = "cuda"  # signaled by a CUDA stream (native CUDA-event sync, or emulated)


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return EGL_FOREVER
    seconds = wait_seconds(timeout, "timeout (seconds >= 0, or None: forever)")
    if not seconds * 1e9 < 2**63:  # (inf too: as good as forever)
        return EGL_FOREVER
    return int(seconds * 1e9)


class Sync(Resource):
    """An EGLSync on a display. Make one with :meth:`fence`, :meth:`reusable` or
    :func:`sync_after_cuda`; :meth:`close` (or garbage collection, or closing the display)
    destroys it. A CUDA sync whose stream has not reached it yet when closed is destroyed when the
    stream does."""

    def __init__(self, display: Display, handle: int, kind: SyncKind, path: SyncPath | None = None, token: int = 0,
                 keep: Any = None, device: CudaDevice | None = None) -> None:
        self.display = display
        self.kind = kind
        self.path = path  # for CUDA syncs: SyncPath.NATIVE or SyncPath.EMULATED
        self.server_wait_path: ServerWaitPath | None = None  # set by server_wait
        self._device = device
        self._address = handle
        self._keep = keep  # what the native CUDA-event sync must outlive (the event)
        self._own(egl_sync.destroy, display._address, handle, token, parent=display)

    @classmethod
    def fence(cls, display: Display) -> "Sync":
        """A fence: signaled once the GL commands issued before it (in the context current on this
        thread, which must belong to ``display``) have completed."""
        check_display(display, "Sync.fence")
        display.require("EGL_KHR_fence_sync")
        handle = egl_sync.create(display.handle, egl_sync.FENCE,
                                 "creating a fence sync (is a GL context of this display current?)")
        return cls(display, handle, SyncKind.FENCE)

    @classmethod
    def reusable(cls, display: Display, signaled: bool = False) -> "Sync":
        """A reusable sync, signaled and unsignaled with :meth:`signal` / :meth:`unsignal`."""
        check_display(display, "Sync.reusable")
        signaled = check_flag(signaled, "signaled")
        display.require("EGL_KHR_reusable_sync")
        handle = egl_sync.create(display.handle, egl_sync.REUSABLE, "creating a reusable sync")
        sync = cls(display, handle, SyncKind.REUSABLE)
        if signaled:
            sync.signal()
        return sync

    # ---- state ---------------------------------------------------------------------------------
    @property
    def handle(self) -> int:
        """The raw ``EGLSyncKHR``, as an address."""
        self._check_open()  # (in a forked child: says the sync is the parent's)
        return self._address

    @property
    def signaled(self) -> bool:
        """Whether the sync is signaled now (``EGL_SYNC_STATUS_KHR``)."""
        handle = self.handle  # before the display's: its error names a fork
        return egl_sync.is_signaled(self.display.handle, handle)

    # ---- waits and signals ---------------------------------------------------------------------
    def wait(self, timeout: float | None = None, flush: bool = True) -> bool:
        """Client wait: block this thread (GIL released) until the sync is signaled (True) or
        ``timeout`` seconds pass (False). ``flush`` flushes the current context first, so a fence
        made there can signal. ``timeout=None`` waits forever; 0 only tests. Raises
        :class:`ClosedError` if another thread closes the sync (or its display) meanwhile."""
        ns = _timeout_ns(timeout)
        flush = check_flag(flush, "flush")
        handle = self.handle  # before the display's: its error names a fork
        try:
            signaled = egl_sync.client_wait(self.display.handle, handle, flush, ns)
        except EGLError:
            if self.closed:  # Mesa: the wait fails once another thread destroyed the sync
                raise ClosedError("the sync was closed while this thread waited for it") from None
            raise
        if self.closed:
            # EGL wakes the waiters of a destroyed sync as if it were signaled (NVIDIA does): it
            # was not, and the sync is gone.
            raise ClosedError("the sync was closed while this thread waited for it")
        return signaled

    def server_wait(self, timeout: float | None = None) -> bool:
        """Server wait: GL commands issued after this in the current context wait on the GPU until
        the sync is signaled, and this thread does not wait. Returns whether this thread waited
        (False for a real server wait); :attr:`server_wait_path` says how it was done.

        - ``"egl"``: ``eglWaitSyncKHR``, for fences, native CUDA-event syncs, and reusable syncs
          on drivers that honour it.
        - ``"semaphore"``: an emulated CUDA sync on a driver that ignores ``eglWaitSyncKHR`` on
          reusable syncs (measured: NVIDIA 580). The CUDA event behind the sync signals a
          timeline semaphore that GL waits on (:mod:`eglcuda.syncs.timeline`; needs Vulkan and
          ``GL_EXT_semaphore_fd`` + ``GL_NV_timeline_semaphore``).
        - ``"client-wait"``: where neither works (or for a reusable sync signaled by hand on such
          a driver), this thread waits for the sync, up to ``timeout`` seconds (:class:`Timeout`
          past it). GL stays ordered after the sync, at the cost of blocking: returns True."""
        _timeout_ns(timeout)  # checked whichever path is taken: a bad one is refused on every driver
        handle = self.handle  # before the display's: its error names a fork
        self.display.require("EGL_KHR_wait_sync")
        if self.kind is not SyncKind.FENCE and self.path != SyncPath.NATIVE and not server_waits_reusable(self.display):
            if self.kind is SyncKind.CUDA and self._keep is not None:
                try:
                    bridge = bridge_for(self._device)
                except EglCudaError:
                    bridge = None  # no GPU-side path on this machine: the client wait below
                if bridge is not None:
                    try:
                        bridge.gl_wait_for_event(self._keep.handle)
                        self.server_wait_path = ServerWaitPath.SEMAPHORE
                        return False
                    except Unsupported:
                        pass  # this GL context lacks the semaphore extensions
            self.server_wait_path = ServerWaitPath.CLIENT_WAIT
            if not self.wait(timeout):
                raise Timeout(f"the sync was not signaled within {timeout} s")
            return True
        egl_sync.server_wait(self.display.handle, handle, "queuing a server wait on the sync (is a GL context current?)")
        self.server_wait_path = ServerWaitPath.EGL
        return False

    def signal(self) -> None:
        """Signal a reusable sync (wakes every waiter)."""
        self._signal(True)

    def unsignal(self) -> None:
        """Unsignal a reusable sync, so it can be waited for again."""
        self._signal(False)

    def _signal(self, signaled: bool) -> None:
        if self.kind is not SyncKind.REUSABLE:
            raise UsageError(f"only reusable syncs are signaled by hand; this one is a {self.kind.value} sync")
        handle = self.handle  # before the display's: its error names a fork
        egl_sync.signal(self.display.handle, handle, signaled)

    def __repr__(self) -> str:
        path = f" {self.path}" if self.path else ""
        return f"<Sync {self.kind.value}{path}{' closed' if self.closed else ''}>"


# ---- CUDA -> EGL ---------------------------------------------------------------------------------

def sync_after_cuda(display: Display, cuda_stream: Any = None, device: int | CudaDevice | None = None,
                    path: str = "auto") -> Sync:
    """A sync that becomes signaled when ``cuda_stream`` (default: the legacy stream) reaches the
    work queued so far. Returns at once; GL waits on it with :meth:`Sync.wait` or
    :meth:`Sync.server_wait`. ``path``: "auto", "native" or "emulated" (or a :class:`SyncPath`)."""
    check_display(display, "sync_after_cuda")
    if path not in ("auto", *SyncPath):
        raise UsageError(f"path is 'auto', 'native' or 'emulated', got {path!r}")
    paths = sync_paths(display)
    chosen = paths.cuda_to_egl if path == "auto" else path
    if chosen is None:
        raise Unsupported("CUDA -> EGLSync", where=display.description, hint=paths.cuda_to_egl_reason)
    cuda_device = display.cuda_device(device)
    cuda_device.make_current()
    stream = stream_handle(cuda_stream)
    if chosen == SyncPath.NATIVE:
        display.require("EGL_NV_cuda_event")
        keep = _Event.recorded(stream)
        handle = egl_sync.create_from_cuda_event(display.handle, keep.handle)
        return Sync(display, handle, SyncKind.CUDA, SyncPath.NATIVE, keep=keep, device=cuda_device)
    display.require("EGL_KHR_reusable_sync")
    keep = _Event.recorded(stream)  # the same stream point, for GL server waits (Sync.server_wait)
    handle = egl_sync.create(display.handle, egl_sync.REUSABLE, "creating the reusable sync a CUDA stream signals")
    try:
        token = egl_sync.queue_signal(display.handle, handle, stream)
    except CUDAError:
        egl_sync.destroy(display.handle, handle)
        raise
    return Sync(display, handle, SyncKind.CUDA, SyncPath.EMULATED, token=token, keep=keep, device=cuda_device)


class _Event(Resource):
    """A CUDA event (an address) destroyed with its owner: a sync keeps the event it was made from
    (or stands for) alive, so the sync goes first."""

    # A root: at interpreter exit, after the displays (and the syncs they close) and frames,
    # before its device (made before it: newest first within a rank).
    _exit_rank = 2

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self._own(cuda.event_destroy, handle)

    @classmethod
    def recorded(cls, stream: int) -> "_Event":
        """A timing-free event recorded on ``stream`` now (the current context's device)."""
        owned = cls(cuda.event_create())
        cuda.event_record(owned.handle, stream, "recording the event the sync follows")
        return owned


# ---- EGL -> CUDA ---------------------------------------------------------------------------------

class _FlagPool:
    """Words of mapped pinned memory for stream waits, one per pending wait. Each word only grows:
    a wait for value v+1 is satisfied once the waiter stores v+1, and a word is handed out again
    only after that store, so a stream still waiting on it cannot be released by a later wait.

    The memory is never freed: a stream may still be polling a word after its waiter stored it,
    until the process ends. (Hence no :class:`Resource` here: it has no release.)"""

    SLOTS = 4096

    def __init__(self, device: CudaDevice) -> None:
        self.device = device
        device.make_current()
        self.host, self.device_base = cuda.host_alloc_mapped(4 * self.SLOTS, "allocating the flags CUDA streams wait on")
        cuda.zero_host(self.host, 4 * self.SLOTS)
        self.free = list(range(self.SLOTS))
        self.lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        with self.lock:
            if not self.free:
                raise UsageError(f"{self.SLOTS} EGLSync waits are pending on CUDA streams; let some finish")
            slot = self.free.pop()
        # (32 bits that wrap: a stream's wait for "at least" compares cyclically, so the wait
        # after 2**32 - 1 on one word asks for 0, which holds at the next store)
        return slot, (cuda.flag_load(self.host + 4 * slot) + 1) & 0xFFFFFFFF

    def release(self, slot: int, value: int) -> None:
        """Store ``value`` into the slot's word (releasing the stream waiting on it), then hand
        the slot out again."""
        cuda.flag_store(self.host + 4 * slot, value)
        self.give_back(slot)

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

    ``path`` is a :class:`SyncPath`. For the emulation, :meth:`done` says whether the sync has
    released the stream, and :meth:`cancel` releases the stream without the sync (for teardown:
    the stream then runs on unordered). A stream released without the sync signaling says why:
    :attr:`timed_out` (the ``timeout`` passed) or :attr:`error` (the sync could not be waited on:
    closed while the stream waited, or its display gone; an :class:`eglcuda.ClosedError` or
    :class:`eglcuda.EGLError`). Either way the work queued after the wait ran unordered."""

    def __init__(self, path: SyncPath) -> None:
        self.path = path
        self._released = threading.Event()
        self._cancel = threading.Event()
        self.timed_out = False
        self.error: EglCudaError | None = None

    def done(self) -> bool:
        return self._released.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the stream has been released (emulation), up to ``timeout`` seconds (None:
        until it is); True when it has."""
        if timeout is None:
            return self._released.wait()
        seconds = wait_seconds(timeout, "timeout (seconds >= 0, or None: until released)")
        return self._released.wait(None if seconds == float("inf") else seconds)

    def cancel(self) -> None:
        self._cancel.set()


def cuda_wait_sync(sync: Sync, cuda_stream: Any = None, device: int | CudaDevice | None = None,
                   path: str = "auto", timeout: float | None = None) -> CudaWait:
    """Make ``cuda_stream`` (default: the legacy stream) wait until ``sync`` is signaled; returns
    at once. Work queued on the stream afterwards runs after the sync signals. ``path``: "auto",
    "native" or "emulated" (or a :class:`SyncPath`).

    The emulation's waiter thread gives up after ``timeout`` seconds (None: never) and then
    releases the stream anyway, setting :attr:`CudaWait.timed_out`, so a sync that never signals
    cannot hang the stream forever."""
    if not isinstance(sync, Sync):
        raise UsageError(f"cuda_wait_sync takes an eglcuda.Sync, got {type(sync).__name__}")
    if path not in ("auto", *SyncPath):
        raise UsageError(f"path is 'auto', 'native' or 'emulated', got {path!r}")
    deadline_ns = _timeout_ns(timeout)
    sync._check_open()  # (ClosedError once closed, before asking which path there is)
    display = sync.display
    paths = sync_paths(display)
    chosen = paths.egl_to_cuda if path == "auto" else path
    if chosen is None:
        raise Unsupported("EGLSync -> CUDA", where=display.description, hint=paths.egl_to_cuda_reason)
    cuda_device = display.cuda_device(device)
    cuda_device.make_current()
    stream = stream_handle(cuda_stream)
    handle = sync.handle
    if chosen == SyncPath.NATIVE:
        event = egl_sync.cuda_event_from_sync(handle)
        try:
            cuda.stream_wait_event(stream, event)
        finally:
            cuda.event_destroy(event)
        wait = CudaWait(SyncPath.NATIVE)
        wait._released.set()
        return wait
    pool = _pool(cuda_device)
    slot, value = pool.take()
    try:
        cuda.stream_wait_value_geq(stream, pool.device_base + 4 * slot, value,
                                   "making the CUDA stream wait on the sync's flag")
    except CUDAError:
        pool.give_back(slot)
        raise
    wait = CudaWait(SyncPath.EMULATED)
    dpy = display.handle

    def waiter() -> None:
        waited = 0
        try:
            while not wait._cancel.is_set():
                step = _WAIT_SLICE_NS if deadline_ns == EGL_FOREVER else max(0, min(_WAIT_SLICE_NS, deadline_ns - waited))
                try:
                    result = egl_sync.client_wait(dpy, handle, False, step)
                except EGLError as exc:
                    # A broken or destroyed sync releases the stream rather than hang it, and says so.
                    wait.error = _unwaitable(sync) or exc
                    break
                if result:
                    # (EGL wakes a wait on a sync destroyed meanwhile as if it were signaled)
                    wait.error = _unwaitable(sync)
                    break
                waited += step
                if deadline_ns != EGL_FOREVER and waited >= deadline_ns:
                    wait.timed_out = True
                    break
        finally:
            try:
                pool.release(slot, value)
            finally:
                wait._released.set()  # (also when the store failed: join() must not wait for good)
                _waiters.discard(threading.current_thread())

    thread = threading.Thread(target=waiter, name="eglcuda-sync-waiter", daemon=True)
    wait._keep = sync  # the sync must outlive the waiter's EGL calls
    _waiters.add(thread)
    thread.start()
    return wait


def _unwaitable(sync: Sync) -> ClosedError | None:
    """Why a sync no longer orders the stream that waits on it: closed (by its owner or with its
    display) while the stream waited."""
    if not sync.closed:
        return None
    return ClosedError("the sync was closed while a CUDA stream waited on it: the stream was released "
                       "without it, and the work queued after the wait ran unordered")


def pending_waiters() -> int:
    """Waiter threads still running (for tests and teardown checks)."""
    return sum(1 for thread in list(_waiters) if thread.is_alive())
