"""GL server waits on CUDA work through a timeline semaphore that CUDA signals and GL waits on.

Where ``EGL_NV_cuda_event`` is missing, a CUDA stream point reaches EGL as a reusable sync
signaled by a host function, and NVIDIA's driver ignores ``eglWaitSyncKHR`` on such a sync.
(CUDA-GL interop's map/unmap of a registered buffer also orders GL after CUDA on the GPU, but
costs about 0.3 ms of CPU per map+unmap pair and cannot name an exact event without a second
stream: ``research/probes/gl_order_probe.py``. The semaphore path below costs about 0.1 ms.)

What both CUDA and GL can wait on and signal on the GPU is an external semaphore, and neither
creates an exportable one: Vulkan does. So, once per CUDA device, a :class:`TimelineBridge` makes
a small Vulkan device on the same GPU (matched by UUID), an exportable timeline semaphore, and
hands one fd of it to CUDA (``cuImportExternalSemaphore``) and one to each GL context that waits
(``glImportSemaphoreFdEXT``, ``GL_NV_timeline_semaphore``). A wait of GL on a CUDA event then is:

1. a private CUDA stream waits for the event (``cuStreamWaitEvent``) and signals value N;
2. GL waits for value N (``glWaitSemaphoreEXT``): later GL commands wait on the GPU.

Signals come from one stream in issue order, so the timeline only grows.
"""
from __future__ import annotations

import os
import threading

from .._bind import cuda, egl, vulkan
from .._bind import gl as _gl
from .._bind.loader import bind_egl_extensions, is_bound, require_cuda_entry
from .._resource import Resource
from ..context import on_context_destroyed
from ..cuda_device import CudaDevice
from ..errors import CUDAError, EglCudaError, Unsupported

GL_EXTENSIONS = ("GL_EXT_semaphore", "GL_EXT_semaphore_fd", "GL_NV_timeline_semaphore")
_CUDA_ENTRIES = ("cuImportExternalSemaphore", "cuSignalExternalSemaphoresAsync", "cuDestroyExternalSemaphore",
                 "cuDeviceGetUuid")
_GL_ENTRIES = ("glCreateSemaphoresNV", "glSemaphoreParameterivNV", "glImportSemaphoreFdEXT",
               "glSemaphoreParameterui64vEXT", "glWaitSemaphoreEXT", "glIsSemaphoreEXT")


def _close_bridge(parts: dict) -> None:
    """Release of a bridge: the CUDA side, then Vulkan (GL semaphores go with their contexts)."""
    if parts.get("stream"):
        cuda.stream_destroy(parts["stream"])
    if parts.get("cuda_semaphore"):
        cuda.external_semaphore_destroy(parts["cuda_semaphore"])
    if parts.get("vk_instance"):
        vulkan.destroy(parts["vk_instance"], parts.get("vk_device", 0), parts.get("vk_semaphore", 0))


class TimelineBridge(Resource):
    """One CUDA device's timeline semaphore shared with GL (see the module docstring).

    Get it with :func:`bridge_for`; :meth:`gl_wait_for_event` is the one per-sync call. It lives as
    long as its device (registered with it, so it is released before the device's context)."""

    def __init__(self, device: CudaDevice) -> None:
        for name in _CUDA_ENTRIES:
            require_cuda_entry(name)
        device.make_current()
        uuid = cuda.device_uuid(device.handle)
        self.device = device
        self._parts: dict[str, int] = {}  # what is made so far, for the release
        self._own(_close_bridge, self._parts, parent=device)
        try:
            self._build(uuid)
        except BaseException:
            self.close()
            raise
        self._value = 0  # the last value signaled: the timeline only grows
        self._gl: dict[int, int] = {}  # EGL context address -> GL semaphore name there
        self._lock = threading.Lock()

    def _build(self, uuid: bytes) -> None:
        parts = self._parts
        parts["vk_instance"] = vulkan.create_instance()
        parts["vk_device"] = vulkan.create_device(parts["vk_instance"], uuid)
        parts["vk_semaphore"] = vulkan.create_timeline_semaphore(parts["vk_instance"], parts["vk_device"])
        fd = self._export_fd()
        try:
            parts["cuda_semaphore"] = cuda.import_timeline_semaphore(fd)
        except CUDAError:
            os.close(fd)  # CUDA owns the fd only after a successful import
            raise
        parts["stream"] = cuda.stream_create(non_blocking=True)
        self._semaphore = parts["cuda_semaphore"]
        self._stream = parts["stream"]

    def _export_fd(self) -> int:
        """A new fd of the Vulkan semaphore; whoever imports it owns it."""
        parts = self._parts
        return vulkan.export_semaphore_fd(parts["vk_instance"], parts["vk_device"], parts["vk_semaphore"])

    def gl_semaphore(self) -> int:
        """The semaphore's name in the GL context current on this thread (imported once)."""
        context = egl.current_context()
        if not context:
            raise Unsupported("a GL server wait", where="this thread", hint="no GL context is current")
        name = self._gl.get(context)
        if name is not None and _gl.is_semaphore(name):
            return name
        bind_egl_extensions(frozenset(GL_EXTENSIONS))
        for entry in _GL_ENTRIES:
            if not is_bound(entry):
                raise Unsupported(entry, where="this GL driver")
        created = _gl.create_timeline_semaphore()
        if not created:
            raise Unsupported("glCreateSemaphoresNV", where="the current GL context", hint="it made no semaphore")
        fd = self._export_fd()
        _gl.import_semaphore_fd(created, fd)
        if not _gl.is_semaphore(created):
            os.close(fd)
            raise Unsupported("glImportSemaphoreFdEXT", where="the current GL context", hint="the import failed")
        self._gl[context] = created
        return created

    def gl_wait_for_event(self, event: int) -> None:
        """Make the commands issued next in the current GL context wait, on the GPU, until
        ``event`` (a recorded CUDA event of this device, as an address) has completed. Returns at
        once."""
        with self._lock:
            name = self.gl_semaphore()
            self.device.make_current()
            self._value += 1
            value = self._value
            cuda.stream_wait_event(self._stream, event, "making the semaphore's stream wait for the CUDA event")
            try:
                cuda.signal_timeline_semaphore(self._semaphore, value, self._stream)
            except CUDAError:
                self._value -= 1
                raise
            _gl.wait_semaphore(name, value)

    def forget_context(self, context_address: int) -> None:
        """Drop the GL semaphore of a context that is being destroyed (GL deletes it with the
        context)."""
        self._gl.pop(context_address, None)


_bridges: dict[int, TimelineBridge | Exception] = {}
_bridges_lock = threading.Lock()


def bridge_for(device: CudaDevice) -> TimelineBridge:
    """The device's bridge, built on first use. A failure is remembered and raised again (as
    :class:`Unsupported` or the driver's error), so a missing piece costs one attempt."""
    with _bridges_lock:
        found = _bridges.get(device.ordinal)
        if found is None:
            try:
                found = TimelineBridge(device)
            except EglCudaError as exc:
                found = exc
            _bridges[device.ordinal] = found
    if isinstance(found, Exception):
        raise found
    return found


def forget_context(context_address: int) -> None:
    """Called when an eglcuda GL context is destroyed: its GL semaphores go with it."""
    for bridge in list(_bridges.values()):
        if isinstance(bridge, TimelineBridge):
            bridge.forget_context(context_address)


on_context_destroyed(forget_context)
