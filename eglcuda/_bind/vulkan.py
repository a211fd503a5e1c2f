"""The Vulkan calls eglcuda makes (csrc/interop_semaphore.h) and the Vulkan error funnel: an
instance, a device on a given GPU, and an exportable timeline semaphore, the one object both CUDA
and GL can signal and wait on (see :mod:`eglcuda.syncs.timeline`).

Only ``vkGetInstanceProcAddr`` comes from the loader; everything else is reached through it.
Instances, devices and semaphores are taken and returned as ints."""
from __future__ import annotations

from typing import Any

from ..errors import Unsupported, VulkanError
from . import loader as _loader
from ._native import ffi, lib


def check(call: str, result: int) -> None:
    """Raise :class:`VulkanError` unless ``result`` is VK_SUCCESS."""
    if result != lib.VK_SUCCESS:
        raise VulkanError(call, result)


def _instance_call(instance: int, name: str, kind: str) -> Any:
    pointer = lib.vkGetInstanceProcAddr(ffi.cast("VkInstance", instance), name.encode())
    if pointer == ffi.NULL:
        raise Unsupported(name, where="this Vulkan instance")
    return ffi.cast(kind, pointer)


def _device_call(instance: int, device: int, name: str, kind: str) -> Any:
    get_device_proc = _instance_call(instance, "vkGetDeviceProcAddr", "PFN_vkGetDeviceProcAddr")
    pointer = get_device_proc(ffi.cast("VkDevice", device), name.encode())
    if pointer == ffi.NULL:
        raise Unsupported(name, where="this Vulkan device")
    return ffi.cast(kind, pointer)


def create_instance() -> int:
    """A Vulkan 1.2 instance with no layers or extensions (loads the Vulkan loader first)."""
    _loader.vulkan()
    create = ffi.cast("PFN_vkCreateInstance", lib.vkGetInstanceProcAddr(ffi.NULL, b"vkCreateInstance"))
    if create == ffi.NULL:
        raise Unsupported("vkCreateInstance", where="the Vulkan loader")
    app = ffi.new("VkApplicationInfo *", {"sType": lib.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                           "apiVersion": lib.VK_API_VERSION_1_2})
    info = ffi.new("VkInstanceCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                              "pApplicationInfo": app})
    instance = ffi.new("VkInstance *")
    check("vkCreateInstance", create(info, ffi.NULL, instance))
    return int(ffi.cast("uintptr_t", instance[0]))


def create_device(instance: int, uuid: bytes) -> int:
    """A device with one queue, timeline semaphores and ``VK_KHR_external_semaphore_fd``, on the
    physical device whose UUID is ``uuid`` (16 bytes: the GPU a CUDA device runs on)."""
    enumerate_devices = _instance_call(instance, "vkEnumeratePhysicalDevices", "PFN_vkEnumeratePhysicalDevices")
    properties2 = _instance_call(instance, "vkGetPhysicalDeviceProperties2", "PFN_vkGetPhysicalDeviceProperties2")
    handle = ffi.cast("VkInstance", instance)
    count = ffi.new("uint32_t *")
    check("vkEnumeratePhysicalDevices", enumerate_devices(handle, count, ffi.NULL))
    devices = ffi.new("VkPhysicalDevice[]", count[0])
    check("vkEnumeratePhysicalDevices", enumerate_devices(handle, count, devices))
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
    # Resolved before the device is made: a driver without it fails here, leaving nothing to undo.
    _instance_call(instance, "vkGetDeviceProcAddr", "PFN_vkGetDeviceProcAddr")
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
    create_device_call = _instance_call(instance, "vkCreateDevice", "PFN_vkCreateDevice")
    device = ffi.new("VkDevice *")
    check("vkCreateDevice", create_device_call(physical, info, ffi.NULL, device))
    return int(ffi.cast("uintptr_t", device[0]))


def create_timeline_semaphore(instance: int, device: int) -> int:
    """A timeline semaphore (initial value 0) exportable as an opaque fd."""
    kind = ffi.new("VkSemaphoreTypeCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                                   "semaphoreType": lib.VK_SEMAPHORE_TYPE_TIMELINE,
                                                   "initialValue": 0})
    export = ffi.new("VkExportSemaphoreCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO,
                                                       "pNext": kind,
                                                       "handleTypes": lib.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT})
    create = ffi.new("VkSemaphoreCreateInfo *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO,
                                                 "pNext": export})
    semaphore = ffi.new("VkSemaphore *")
    create_semaphore = _device_call(instance, device, "vkCreateSemaphore", "PFN_vkCreateSemaphore")
    check("vkCreateSemaphore", create_semaphore(ffi.cast("VkDevice", device), create, ffi.NULL, semaphore))
    return int(semaphore[0])


def export_semaphore_fd(instance: int, device: int, semaphore: int) -> int:
    """A new fd of the semaphore (``vkGetSemaphoreFdKHR``); whoever imports it owns it."""
    get_fd = _device_call(instance, device, "vkGetSemaphoreFdKHR", "PFN_vkGetSemaphoreFdKHR")
    info = ffi.new("VkSemaphoreGetFdInfoKHR *", {"sType": lib.VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR,
                                                 "semaphore": semaphore,
                                                 "handleType": lib.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT})
    fd = ffi.new("int *", -1)
    check("vkGetSemaphoreFdKHR", get_fd(ffi.cast("VkDevice", device), info, fd))
    return fd[0]


def destroy(instance: int, device: int = 0, semaphore: int = 0) -> None:
    """Destroy what :func:`create_instance`, :func:`create_device` and
    :func:`create_timeline_semaphore` made (0: not made), semaphore first."""
    if device:
        if semaphore:
            _device_call(instance, device, "vkDestroySemaphore", "PFN_vkDestroySemaphore")(
                ffi.cast("VkDevice", device), semaphore, ffi.NULL)
        _instance_call(instance, "vkDestroyDevice", "PFN_vkDestroyDevice")(ffi.cast("VkDevice", device), ffi.NULL)
    if instance:
        _instance_call(instance, "vkDestroyInstance", "PFN_vkDestroyInstance")(ffi.cast("VkInstance", instance),
                                                                               ffi.NULL)
