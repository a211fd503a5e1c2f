"""GL server waits on CUDA work through a timeline semaphore that CUDA signals and GL waits on.

Where ``EGL_NV_cuda_event`` is missing, a CUDA stream point reaches EGL as a reusable sync
signaled by a host function, and NVIDIA's driver ignores ``eglWaitSyncKHR`` on such a sync.
(CUDA-GL interop's map/unmap of a registered buffer also orders GL after CUDA on the GPU, but
costs about 0.3 ms of CPU per map+unmap pair and cannot name an exact event without a second
stream: ``scripts/probes/gl_order_probe.py``. The semaphore path below costs about 0.1 ms.)

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
import weakref

from ._cuda import CudaDevice, check, cuda_error
from ._egl import address
from ._errors import EglCudaError, Unsupported
from ._loader import bind_egl_extensions, is_bound, vulkan
from ._native import ffi, lib

GL_EXTENSIONS = ("GL_EXT_semaphore", "GL_EXT_semaphore_fd", "GL_NV_timeline_semaphore")
_CUDA_ENTRIES = ("cuImportExternalSemaphore", "cuSignalExternalSemaphoresAsync", "cuDestroyExternalSemaphore",
                 "cuDeviceGetUuid")


class VulkanError(EglCudaError):
    """A Vulkan call made to build the CUDA -> GL semaphore failed."""

    def __init__(self, call: str, code: int) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed with VkResult {code}")


def _vk(call: str, result: int) -> None:
    if result != lib.VK_SUCCESS:
        raise VulkanError(call, result)


class _Vulkan:
    """The Vulkan objects behind a bridge: instance, device, exportable timeline semaphore."""

    def __init__(self, uuid: bytes) -> None:
        vulkan()
        get = lib.vkGetInstanceProcAddr
        create_instance = ffi.cast("PFN_vkCreateInstance", get(ffi.NULL, b"vkCreateInstance"))
        if create_instance == ffi.NULL:
            raise Unsupported("vkCreateInstance", where="the Vulkan loader")
        app = ffi.new("VkApplicationInfo *", {"sType": lib.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                               "apiVersion": lib.VK_API_VERSION_1_2})
        info = ffi.new("VkInstanceCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                                  "pApplicationInfo": app})
        instance = ffi.new("VkInstance *")
        _vk("vkCreateInstance", create_instance(info, ffi.NULL, instance))
        self.instance = instance[0]
        self.device = ffi.NULL
        self.semaphore = 0
        try:
            self._open_device(uuid)
        except BaseException:
            self.close()
            raise

    def _instance_call(self, name: str, kind: str):
        pointer = lib.vkGetInstanceProcAddr(self.instance, name.encode())
        if pointer == ffi.NULL:
            raise Unsupported(name, where="this Vulkan instance")
        return ffi.cast(kind, pointer)

    def _device_call(self, name: str, kind: str):
        pointer = self.get_device_proc(self.device, name.encode())
        if pointer == ffi.NULL:
            raise Unsupported(name, where="this Vulkan device")
        return ffi.cast(kind, pointer)

    def _open_device(self, uuid: bytes) -> None:
        enumerate_devices = self._instance_call("vkEnumeratePhysicalDevices", "PFN_vkEnumeratePhysicalDevices")
        properties2 = self._instance_call("vkGetPhysicalDeviceProperties2", "PFN_vkGetPhysicalDeviceProperties2")
        count = ffi.new("uint32_t *")
        _vk("vkEnumeratePhysicalDevices", enumerate_devices(self.instance, count, ffi.NULL))
        devices = ffi.new("VkPhysicalDevice[]", count[0])
        _vk("vkEnumeratePhysicalDevices", enumerate_devices(self.instance, count, devices))
        physical = None
        for index in range(count[0]):
            ids = ffi.new("VkPhysicalDeviceIDProperties *", {"sType": lib.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES})
            props = ffi.new("VkPhysicalDeviceProperties2 *", {"sType": lib.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                                               "pNext": ids})
            properties2(devices[index], props)
            if bytes(ffi.buffer(ids.deviceUUID, 16)) == uuid:
                physical = devices[index]
                break
        if physical is None:
            raise Unsupported("a Vulkan device for this CUDA device", where=f"{count[0]} Vulkan device(s) (no UUID match)")
        self.get_device_proc = self._instance_call("vkGetDeviceProcAddr", "PFN_vkGetDeviceProcAddr")
        priority = ffi.new("float *", 1.0)
        queue = ffi.new("VkDeviceQueueCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                                      "queueFamilyIndex": 0, "queueCount": 1,
                                                      "pQueuePriorities": priority})
        timeline = ffi.new("VkPhysicalDeviceTimelineSemaphoreFeatures *",
                           {"sType": lib.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES,
                            "timelineSemaphore": 1})
        names = [ffi.new("char[]", b"VK_KHR_external_semaphore_fd")]
        extensions = ffi.new("const char *[]", names)
        info = ffi.new("VkDeviceCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": timeline,
                                                "queueCreateInfoCount": 1, "pQueueCreateInfos": queue,
                                                "enabledExtensionCount": 1, "ppEnabledExtensionNames": extensions})
        create_device = self._instance_call("vkCreateDevice", "PFN_vkCreateDevice")
        device = ffi.new("VkDevice *")
        _vk("vkCreateDevice", create_device(physical, info, ffi.NULL, device))
        self.device = device[0]
        kind = ffi.new("VkSemaphoreTypeCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                                       "semaphoreType": lib.VK_SEMAPHORE_TYPE_TIMELINE,
                                                       "initialValue": 0})
        export = ffi.new("VkExportSemaphoreCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO,
                                                           "pNext": kind,
                                                           "handleTypes": lib.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT})
        create = ffi.new("VkSemaphoreCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO,
                                                     "pNext": export})
        semaphore = ffi.new("VkSemaphore *")
        _vk("vkCreateSemaphore", self._device_call("vkCreateSemaphore", "PFN_vkCreateSemaphore")(
            self.device, create, ffi.NULL, semaphore))
        self.semaphore = semaphore[0]
        self._get_fd = self._device_call("vkGetSemaphoreFdKHR", "PFN_vkGetSemaphoreFdKHR")

    def export_fd(self) -> int:
        """A new fd of the semaphore; whoever imports it owns it."""
        info = ffi.new("VkSemaphoreGetFdInfoKHR *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR,
                                                     "semaphore": self.semaphore,
                                                     "handleType": lib.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT})
        fd = ffi.new("int *", -1)
        _vk("vkGetSemaphoreFdKHR", self._get_fd(self.device, info, fd))
        return fd[0]

    def close(self) -> None:
        if self.device != ffi.NULL:
            if self.semaphore:
                self._device_call("vkDestroySemaphore", "PFN_vkDestroySemaphore")(self.device, self.semaphore, ffi.NULL)
                self.semaphore = 0
            self._instance_call("vkDestroyDevice", "PFN_vkDestroyDevice")(self.device, ffi.NULL)
            self.device = ffi.NULL
        if self.instance != ffi.NULL:
            self._instance_call("vkDestroyInstance", "PFN_vkDestroyInstance")(self.instance, ffi.NULL)
            self.instance = ffi.NULL


def _close_bridge(parts: dict) -> None:
    """Finalizer: CUDA side, GL semaphores are left to their contexts, then Vulkan. Never raises."""
    try:
        if parts.get("stream") is not None:
            lib.cuStreamDestroy(parts["stream"])
        if parts.get("cuda_semaphore") is not None:
            lib.cuDestroyExternalSemaphore(parts["cuda_semaphore"])
        if parts.get("vulkan") is not None:
            parts["vulkan"].close()
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class TimelineBridge:
    """One CUDA device's timeline semaphore shared with GL (see the module docstring).

    Get it with :func:`bridge_for`; :meth:`gl_wait_for_event` is the one per-sync call."""

    def __init__(self, device: CudaDevice) -> None:
        for name in _CUDA_ENTRIES:
            if not is_bound(name):
                raise Unsupported(name, where="this CUDA driver")
        device.make_current()
        uuid = ffi.new("CUuuid *")
        check(lib.cuDeviceGetUuid(uuid, device.handle), "cuDeviceGetUuid")
        self.device = device
        self._parts: dict = {}
        self._finalizer = weakref.finalize(self, _close_bridge, self._parts)
        self._parts["vulkan"] = _Vulkan(bytes(ffi.buffer(uuid.bytes, 16)))
        fd = self._parts["vulkan"].export_fd()
        desc = ffi.new("CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC *")
        desc.type = lib.CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
        desc.handle.fd = fd
        semaphore = ffi.new("CUexternalSemaphore *")
        status = lib.cuImportExternalSemaphore(semaphore, desc)
        if status:
            os.close(fd)  # CUDA owns the fd only after a successful import
            raise cuda_error(status, "cuImportExternalSemaphore", "importing the Vulkan timeline semaphore")
        self._parts["cuda_semaphore"] = semaphore[0]
        self._semaphores = ffi.new("CUexternalSemaphore[1]", [semaphore[0]])
        stream = ffi.new("CUstream *")
        check(lib.cuStreamCreate(stream, lib.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._parts["stream"] = stream[0]
        self._stream = stream[0]
        self._signal = ffi.new("CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS *")
        self._value = ffi.new("uint64_t *", 0)
        self._gl: dict[int, int] = {}  # EGL context address -> GL semaphore name there
        self._lock = threading.Lock()

    def gl_semaphore(self) -> int:
        """The semaphore's name in the GL context current on this thread (imported once)."""
        context = address(lib.eglGetCurrentContext())
        if not context:
            raise Unsupported("a GL server wait", where="this thread", hint="no GL context is current")
        name = self._gl.get(context)
        if name is not None and lib.glIsSemaphoreEXT(name):
            return name
        bind_egl_extensions(frozenset(GL_EXTENSIONS))
        for entry in ("glCreateSemaphoresNV", "glSemaphoreParameterivNV", "glImportSemaphoreFdEXT",
                      "glSemaphoreParameterui64vEXT", "glWaitSemaphoreEXT", "glIsSemaphoreEXT"):
            if not is_bound(entry):
                raise Unsupported(entry, where="this GL driver")
        created = ffi.new("unsigned int *")
        lib.glCreateSemaphoresNV(1, created)
        if not created[0]:
            raise Unsupported("glCreateSemaphoresNV", where="the current GL context", hint="it made no semaphore")
        lib.glSemaphoreParameterivNV(created[0], lib.GL_SEMAPHORE_TYPE_NV, ffi.new("int *", lib.GL_SEMAPHORE_TYPE_TIMELINE_NV))
        fd = self._parts["vulkan"].export_fd()
        lib.glImportSemaphoreFdEXT(created[0], lib.GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd)
        if not lib.glIsSemaphoreEXT(created[0]):
            os.close(fd)
            raise Unsupported("glImportSemaphoreFdEXT", where="the current GL context", hint="the import failed")
        self._gl[context] = created[0]
        return created[0]

    def gl_wait_for_event(self, event) -> None:
        """Make the commands issued next in the current GL context wait, on the GPU, until
        ``event`` (a recorded CUDA event of this device) has completed. Returns at once."""
        with self._lock:
            name = self.gl_semaphore()
            self.device.make_current()
            self._value[0] += 1
            value = self._value[0]
            check(lib.cuStreamWaitEvent(self._stream, event, 0), "cuStreamWaitEvent",
                  "making the semaphore's stream wait for the CUDA event")
            self._signal.params.fence.value = value
            status = lib.cuSignalExternalSemaphoresAsync(self._semaphores, self._signal, 1, self._stream)
            if status:
                self._value[0] -= 1
                raise cuda_error(status, "cuSignalExternalSemaphoresAsync", "signaling the timeline semaphore")
            lib.glSemaphoreParameterui64vEXT(name, lib.GL_TIMELINE_SEMAPHORE_VALUE_NV, self._value)
            lib.glWaitSemaphoreEXT(name, 0, ffi.NULL, 0, ffi.NULL, ffi.NULL)

    def forget_context(self, context_address: int) -> None:
        """Drop the GL semaphore of a context that is being destroyed (GL deletes it with the
        context)."""
        self._gl.pop(context_address, None)

    def close(self) -> None:
        self._finalizer()


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
