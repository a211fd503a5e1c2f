"""CUDA driver calls eglcuda makes outside the per-frame path, and the CUDA error funnel."""
from __future__ import annotations

import os
import threading
from typing import Any

from . import loader as _loader
from ..errors import CUDAError, UsageError, cuda_error_name
from ._native import ffi, lib

# Re-entrant: the garbage collector may run a finalizer that needs it (a frame's free looks
# up its device) on a thread that holds it, at any allocation.
_init_lock = threading.RLock()
_initialized = False
_initializing = False  # a thread is inside cuInit (which can take seconds)
# True in a child made by fork() after this process initialized the driver: the driver cannot be
# used there (its calls fail with CUDA_ERROR_INITIALIZATION_ERROR or worse).
_forked_after_init = False

FORKED_CHILD = ("this process was forked from one that had initialized CUDA, and the CUDA driver cannot "
                "be used in such a child: start the process with multiprocessing's 'spawn' or "
                "'forkserver' method (or fork before the parent uses CUDA)")


def _after_fork_in_child() -> None:
    # A cuInit under way in another thread of the parent counts as made: the child must not call
    # it after a half-finished one. The lock is the child's own (that thread does not exist here).
    global _forked_after_init, _init_lock
    _forked_after_init = _forked_after_init or _initialized or _initializing
    _init_lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)

# The driver's answer for a launch that timed out, and for an EGLStream acquire or return that
# waited in vain.
ERROR_LAUNCH_TIMEOUT = lib.CUDA_ERROR_LAUNCH_TIMEOUT


def cuda_error(code: int, call: str, doing: str = "") -> CUDAError:
    """Build a :class:`CUDAError`, naming the code through the driver where it can."""
    name = None
    description = ""
    if _loader.is_bound("cuGetErrorName"):
        text = ffi.new("const char **")
        if lib.cuGetErrorName(code, text) == 0 and text[0] != ffi.NULL:
            name = ffi.string(text[0]).decode()
        if lib.cuGetErrorString(code, text) == 0 and text[0] != ffi.NULL:
            description = ffi.string(text[0]).decode()
    if _forked_after_init:
        doing = f"{doing} ({FORKED_CHILD})" if doing else FORKED_CHILD
    return CUDAError(code, call, name=name or cuda_error_name(code), description=description, doing=doing)


def check(code: int, call: str, doing: str = "") -> None:
    """Raise :class:`CUDAError` unless ``code`` is CUDA_SUCCESS."""
    if code:
        raise cuda_error(code, call, doing)


def init() -> None:
    """Load libcuda and call ``cuInit`` once per process. In a child forked after that, raise
    :class:`~eglcuda.UsageError` saying why the driver cannot be used there."""
    global _initialized, _initializing
    if _forked_after_init:
        raise UsageError(FORKED_CHILD)
    if _initialized:
        return
    _loader.cuda()
    with _init_lock:
        if not _initialized:
            _initializing = True
            try:
                check(lib.cuInit(0), "cuInit", "initializing the CUDA driver")
            finally:
                _initializing = False
            _initialized = True


def driver_version() -> int:
    """The CUDA driver API version (e.g. 13000 for 13.0)."""
    init()
    out = ffi.new("int *")
    check(lib.cuDriverGetVersion(out), "cuDriverGetVersion")
    return out[0]


def device_count() -> int:
    """How many CUDA devices this process sees."""
    init()
    out = ffi.new("int *")
    check(lib.cuDeviceGetCount(out), "cuDeviceGetCount")
    return out[0]


def forked_after_init() -> bool:
    """Whether this process is a child forked after its parent initialized the driver."""
    return _forked_after_init


def initialized() -> bool:
    """Whether eglcuda has called ``cuInit`` in this process (MPS settings only count before it)."""
    return _initialized


def mps_enabled(ordinal: int = 0) -> bool | None:
    """Whether contexts this process creates on device ``ordinal`` are shared through an MPS
    server (``CU_DEVICE_ATTRIBUTE_MPS_ENABLED``); None when the driver does not know the
    attribute (drivers before CUDA 12.x answer CUDA_ERROR_INVALID_VALUE). Initializes CUDA."""
    init()
    device = ffi.new("CUdevice *")
    check(lib.cuDeviceGet(device, ordinal), "cuDeviceGet", f"looking up CUDA device {ordinal}")
    out = ffi.new("int *")
    status = lib.cuDeviceGetAttribute(out, lib.CU_DEVICE_ATTRIBUTE_MPS_ENABLED, device[0])
    if status == lib.CUDA_ERROR_INVALID_VALUE:
        return None
    check(status, "cuDeviceGetAttribute", "reading CU_DEVICE_ATTRIBUTE_MPS_ENABLED")
    return bool(out[0])




# ---- memory, copies and ordering (frames layer) -------------------------------------------------

MANAGED_ATTACH_GLOBAL = lib.CU_MEM_ATTACH_GLOBAL
MANAGED_ATTACH_HOST = lib.CU_MEM_ATTACH_HOST
MANAGED_ATTACH_SINGLE = lib.CU_MEM_ATTACH_SINGLE
ATTRIBUTE_CAN_MAP_HOST_MEMORY = lib.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
ATTRIBUTE_MANAGED_MEMORY = lib.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY


def make_current(context: int) -> None:
    """Make ``context`` (a ``CUcontext`` address) current on this thread; cheap when it is."""
    check(lib.eglcuda_ensure_current(ffi.cast("CUcontext", context)), "cuCtxSetCurrent")


def mem_alloc(size: int, doing: str) -> int:
    """``size`` bytes of device memory in the current context (``cuMemAlloc``)."""
    pointer = ffi.new("CUdeviceptr *")
    check(lib.cuMemAlloc(pointer, size), "cuMemAlloc", doing)
    return int(pointer[0])


def mem_alloc_managed(size: int, doing: str) -> int:
    """``size`` bytes of managed memory, attached globally (``cuMemAllocManaged``)."""
    pointer = ffi.new("CUdeviceptr *")
    check(lib.cuMemAllocManaged(pointer, size, lib.CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged", doing)
    return int(pointer[0])


def host_alloc_mapped(size: int, doing: str) -> tuple[int, int]:
    """``size`` bytes of page-locked host memory mapped into the GPU's address space (portable):
    (host address, device address)."""
    host = ffi.new("void **")
    check(lib.cuMemHostAlloc(host, size, lib.CU_MEMHOSTALLOC_PORTABLE | lib.CU_MEMHOSTALLOC_DEVICEMAP),
          "cuMemHostAlloc", doing)
    pointer = ffi.new("CUdeviceptr *")
    status = lib.cuMemHostGetDevicePointer(pointer, host[0], 0)
    if status:
        lib.cuMemFreeHost(host[0])
        check(status, "cuMemHostGetDevicePointer", doing)
    return int(ffi.cast("uintptr_t", host[0])), int(pointer[0])


def mem_free(pointer: int) -> int:
    """Free device or managed memory; returns the driver's status (finalizers ignore it)."""
    return lib.cuMemFree(pointer)


def host_free(host: int) -> int:
    """Free page-locked host memory; returns the driver's status."""
    return lib.cuMemFreeHost(ffi.cast("void *", host))


def array_create(width: int, height: int, channels: int, doing: str) -> int:
    """A CUDA array of ``width`` x ``height`` elements of ``channels`` uint8 channels."""
    descriptor = ffi.new("CUDA_ARRAY_DESCRIPTOR *", {"Width": width, "Height": height,
                                                     "Format": lib.CU_AD_FORMAT_UNSIGNED_INT8,
                                                     "NumChannels": channels})
    handle = ffi.new("CUarray *")
    check(lib.cuArrayCreate(handle, descriptor), "cuArrayCreate", doing)
    return int(ffi.cast("uintptr_t", handle[0]))


def array_destroy(handle: int) -> int:
    return lib.cuArrayDestroy(ffi.cast("CUarray", handle))


def address_range(pointer: int) -> tuple[int, int] | None:
    """(base, size) of the allocation holding device address ``pointer``, or None when the
    driver cannot place it (not from a CUDA allocation call)."""
    base, size = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
    if lib.cuMemGetAddressRange(base, size, pointer) != lib.CUDA_SUCCESS:
        return None
    return int(base[0]), int(size[0])


def pointer_is_managed(pointer: int) -> bool:
    """Whether the driver reports ``pointer`` as managed memory (False when it cannot say)."""
    flag = ffi.new("unsigned int *")
    status = lib.cuPointerGetAttribute(flag, lib.CU_POINTER_ATTRIBUTE_IS_MANAGED, pointer)
    return status == 0 and bool(flag[0])


def pointer_device(pointer: int) -> int | None:
    """The ordinal of the device whose memory ``pointer`` points into; None for memory that is not
    one device's (host, managed) or that the driver cannot place (in the current context)."""
    kind = ffi.new("unsigned int *")
    if lib.cuPointerGetAttribute(kind, lib.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pointer) != 0:
        return None
    if kind[0] != lib.CU_MEMORYTYPE_DEVICE or pointer_is_managed(pointer):
        return None
    ordinal = ffi.new("int *")
    if lib.cuPointerGetAttribute(ordinal, lib.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer) != 0:
        return None
    return int(ordinal[0])


def attach_managed(stream: int, pointer: int, flag: int) -> None:
    """Queue ``cuStreamAttachMemAsync`` of the managed allocation at ``pointer`` on ``stream``."""
    check(lib.cuStreamAttachMemAsync(ffi.cast("CUstream", stream), pointer, 0, flag), "cuStreamAttachMemAsync",
          "attaching managed memory")


def copy_2d(stream: int, src: tuple, dst: tuple, width_bytes: int, height: int, wait: bool) -> None:
    """A stream-ordered 2D copy in the current context, then (``wait``) wait for the stream.
    ``src``/``dst``: ("device", address, pitch), ("array", handle, 0) or ("host", buffer, pitch)
    with a buffer-protocol object (written into when it is ``dst``)."""
    copy = ffi.new("CUDA_MEMCPY2D *")
    keep = []
    for side, (kind, where, pitch) in (("src", src), ("dst", dst)):
        if kind == "host":
            buffer = ffi.from_buffer(where, require_writable=(side == "dst"))
            keep.append(buffer)
            setattr(copy, f"{side}MemoryType", lib.CU_MEMORYTYPE_HOST)
            setattr(copy, f"{side}Host", buffer)
        elif kind == "array":
            setattr(copy, f"{side}MemoryType", lib.CU_MEMORYTYPE_ARRAY)
            setattr(copy, f"{side}Array", ffi.cast("CUarray", where))
        else:
            setattr(copy, f"{side}MemoryType", lib.CU_MEMORYTYPE_DEVICE)
            setattr(copy, f"{side}Device", where)
        setattr(copy, f"{side}Pitch", pitch)
    copy.WidthInBytes = width_bytes
    copy.Height = height
    cu_stream = ffi.cast("CUstream", stream)
    check(lib.cuMemcpy2DAsync(copy, cu_stream), "cuMemcpy2DAsync", "copying a plane")
    if wait:
        check(lib.cuStreamSynchronize(cu_stream), "cuStreamSynchronize", "waiting for a plane copy")


def copy_plan(width_bytes: int, height: int, dst_pitch: int) -> Any:
    """The parameters of a device-to-device 2D copy of ``height`` rows of ``width_bytes``, for
    :func:`copy_planned` to fill in the addresses: a hot path's copies of one shape, again and
    again, without building the parameters each time."""
    plan = ffi.new("CUDA_MEMCPY2D *")
    plan.srcMemoryType = lib.CU_MEMORYTYPE_DEVICE
    plan.dstMemoryType = lib.CU_MEMORYTYPE_DEVICE
    plan.dstPitch = dst_pitch
    plan.WidthInBytes = width_bytes
    plan.Height = height
    return plan


def copy_planned(stream: int, plan: Any, src: int, src_pitch: int, dst: int) -> None:
    """Queue :func:`copy_plan`'s copy from device address ``src`` (rows ``src_pitch`` apart)
    to ``dst`` on ``stream``, in the current context (the driver reads ``plan`` at the call)."""
    plan.srcDevice = src
    plan.srcPitch = src_pitch
    plan.dstDevice = dst
    check(lib.cuMemcpy2DAsync(plan, ffi.cast("CUstream", stream)), "cuMemcpy2DAsync", "copying a plane")


def host_copy_plan(host: int, width_bytes: int, height: int, to_host: bool) -> Any:
    """The parameters of a 2D copy of ``height`` rows of ``width_bytes`` between device memory and
    page-locked host address ``host`` (rows packed), device to host when ``to_host``, else host to
    device: a hot path's copies into or out of the same host buffer, again and again, with only the
    device side filled in each time (:func:`copy_host_planned`)."""
    plan = ffi.new("CUDA_MEMCPY2D *")
    where = ffi.cast("void *", host)
    if to_host:
        plan.srcMemoryType = lib.CU_MEMORYTYPE_DEVICE
        plan.dstMemoryType = lib.CU_MEMORYTYPE_HOST
        plan.dstHost = where
        plan.dstPitch = width_bytes
    else:
        plan.srcMemoryType = lib.CU_MEMORYTYPE_HOST
        plan.srcHost = where
        plan.srcPitch = width_bytes
        plan.dstMemoryType = lib.CU_MEMORYTYPE_DEVICE
    plan.WidthInBytes = width_bytes
    plan.Height = height
    return plan


def copy_host_planned(stream: Any, plan: Any, device: int, pitch: int) -> None:
    """Queue :func:`host_copy_plan`'s copy with device address ``device`` (rows ``pitch`` apart)
    as its device side, source or destination, on ``stream`` (from :func:`stream_arg`), in the
    current context (the driver reads ``plan`` at the call)."""
    if plan.dstMemoryType == lib.CU_MEMORYTYPE_HOST:
        plan.srcDevice = device
        plan.srcPitch = pitch
    else:
        plan.dstDevice = device
        plan.dstPitch = pitch
    code = lib.cuMemcpy2DAsync(plan, stream)
    if code:
        raise cuda_error(code, "cuMemcpy2DAsync", "copying a plane between host and device")


def stream_arg(stream: int) -> Any:
    """``stream`` as the ``CUstream`` argument of the calls below, made once for many calls."""
    return ffi.cast("CUstream", stream)


def copy_planned_all(stream: Any, steps: "tuple[tuple[Any, int, int, int, int], ...]", src: int, dst: int,
                     index: int) -> None:
    """Queue one :func:`copy_plan` copy per step ``(plan, src_offset, src_pitch, dst_offset,
    dst_step)`` on ``stream`` (from :func:`stream_arg`), in the current context: from ``src +
    src_offset`` (rows ``src_pitch`` apart) to ``dst + dst_offset + index * dst_step``. A
    frame's planes into image ``index`` of a batch, in one call."""
    for plan, src_offset, src_pitch, dst_offset, dst_step in steps:
        plan.srcDevice = src + src_offset
        plan.srcPitch = src_pitch
        plan.dstDevice = dst + dst_offset + index * dst_step
        code = lib.cuMemcpy2DAsync(plan, stream)
        if code:
            raise cuda_error(code, "cuMemcpy2DAsync", "copying a plane")


def order_streams(first: int, then: int) -> None:
    """Make stream ``then`` wait for the work queued so far on stream ``first`` (an event
    recorded on one and waited on by the other; no host wait), in the current context."""
    event = ffi.new("CUevent *")
    check(lib.cuEventCreate(event, lib.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        check(lib.cuEventRecord(event[0], ffi.cast("CUstream", first)), "cuEventRecord")
        check(lib.cuStreamWaitEvent(ffi.cast("CUstream", then), event[0], 0), "cuStreamWaitEvent")
    finally:
        lib.cuEventDestroy(event[0])


def join_streams(target: int, streams: "list[int] | tuple[int, ...]", doing: str = "") -> bool:
    """Make stream ``target`` wait, on the GPU, for the work queued so far on each of ``streams``
    that still has any (``cuStreamQuery`` says not ready); idle streams cost only that query.
    Returns whether any was busy. In the current context. (A stream that is ``target`` itself is
    skipped: its own order holds.)"""
    busy = False
    for stream in streams:
        if stream == target:
            continue
        status = lib.cuStreamQuery(ffi.cast("CUstream", stream))
        if status == 0:
            continue
        if status != lib.CUDA_ERROR_NOT_READY:
            raise cuda_error(status, "cuStreamQuery", doing or "asking whether a stream that read a frame is done")
        order_streams(stream, target)
        busy = True
    return busy


# ---- devices and their primary contexts (eglcuda.cuda_device) -----------------------------------

ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = lib.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = lib.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
ATTRIBUTE_INTEGRATED = lib.CU_DEVICE_ATTRIBUTE_INTEGRATED


def device_get(ordinal: int) -> int:
    """The ``CUdevice`` of a CUDA ordinal."""
    out = ffi.new("CUdevice *")
    check(lib.cuDeviceGet(out, ordinal), "cuDeviceGet")
    return int(out[0])


def primary_context_retain(device: int) -> int:
    """Retain the device's primary context; its address (``cuDevicePrimaryCtxRetain``)."""
    out = ffi.new("CUcontext *")
    check(lib.cuDevicePrimaryCtxRetain(out, device), "cuDevicePrimaryCtxRetain")
    return int(ffi.cast("uintptr_t", out[0]))


def primary_context_release(device: int) -> int:
    """Release one retain of the primary context; returns the driver's status (finalizers ignore it)."""
    return lib.cuDevicePrimaryCtxRelease(device)


def device_attribute(device: int, attribute: int) -> int:
    """``cuDeviceGetAttribute``."""
    out = ffi.new("int *")
    check(lib.cuDeviceGetAttribute(out, attribute, device), "cuDeviceGetAttribute")
    return out[0]


def device_name(device: int) -> str:
    name = ffi.new("char[256]")
    check(lib.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
    return ffi.string(name).decode()


def device_total_memory(device: int) -> int:
    """The device's memory in bytes."""
    total = ffi.new("size_t *")
    check(lib.cuDeviceTotalMem(total, device), "cuDeviceTotalMem")
    return int(total[0])


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device (``cuMemGetInfo``)."""
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    check(lib.cuMemGetInfo(free, total), "cuMemGetInfo")
    return int(free[0]), int(total[0])


# ---- used by images and syncs --------------------------------------------------------------------
# Handles (streams, events, arrays, surface objects, semaphores) are addresses or ints.

def stream_idle(stream: int, doing: str = "") -> bool:
    """Whether ``stream`` has nothing queued (``cuStreamQuery``), in the current context; other
    answers than "not ready" raise."""
    status = lib.cuStreamQuery(ffi.cast("CUstream", stream))
    if status == lib.CUDA_ERROR_NOT_READY:
        return False
    check(status, "cuStreamQuery", doing)
    return True


def stream_synchronize(stream: int, doing: str = "") -> None:
    """Wait until the work queued on ``stream`` so far is done."""
    check(lib.cuStreamSynchronize(ffi.cast("CUstream", stream)), "cuStreamSynchronize", doing)


def stream_create(non_blocking: bool = False) -> int:
    """A new stream of the current context, as an address. Blocking (the default: ordered with the
    legacy default stream, where many users' kernels run) or not."""
    created = ffi.new("CUstream *")
    flags = lib.CU_STREAM_NON_BLOCKING if non_blocking else 0
    check(lib.cuStreamCreate(created, flags), "cuStreamCreate", "creating a CUDA stream")
    return int(ffi.cast("uintptr_t", created[0]))


def stream_destroy(stream: int) -> int:
    """``cuStreamDestroy``; returns the driver's status (finalizers ignore it)."""
    return lib.cuStreamDestroy(ffi.cast("CUstream", stream))


def event_create() -> int:
    """A timing-free event of the current context."""
    event = ffi.new("CUevent *")
    check(lib.cuEventCreate(event, lib.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    return int(ffi.cast("uintptr_t", event[0]))


def event_record(event: int, stream: int, doing: str = "") -> None:
    check(lib.cuEventRecord(ffi.cast("CUevent", event), ffi.cast("CUstream", stream)), "cuEventRecord", doing)


def event_done(event: int, doing: str = "") -> bool:
    """Whether the work before ``event``'s last record is done (``cuEventQuery``), in the current
    context; other answers than "not ready" raise."""
    status = lib.cuEventQuery(ffi.cast("CUevent", event))
    if status == lib.CUDA_ERROR_NOT_READY:
        return False
    check(status, "cuEventQuery", doing)
    return True


def event_synchronize(event: int, doing: str = "") -> None:
    """Wait until the work before ``event``'s last record is done (``cuEventSynchronize``; the
    GIL is released meanwhile)."""
    check(lib.cuEventSynchronize(ffi.cast("CUevent", event)), "cuEventSynchronize", doing)


def event_destroy(event: int) -> int:
    """``cuEventDestroy``; returns the driver's status (finalizers ignore it)."""
    return lib.cuEventDestroy(ffi.cast("CUevent", event))


def stream_wait_event(stream: int, event: int, doing: str = "") -> None:
    """Work queued on ``stream`` after this waits for ``event`` (no host wait)."""
    check(lib.cuStreamWaitEvent(ffi.cast("CUstream", stream), ffi.cast("CUevent", event), 0), "cuStreamWaitEvent",
          doing)


def stream_wait_value_geq(stream: int, pointer: int, value: int, doing: str = "") -> None:
    """Work queued on ``stream`` after this waits until the 32-bit word at device address
    ``pointer`` is >= ``value`` (``cuStreamWaitValue32``)."""
    check(lib.cuStreamWaitValue32(ffi.cast("CUstream", stream), pointer, value, lib.CU_STREAM_WAIT_VALUE_GEQ),
          "cuStreamWaitValue32", doing)


def zero_host(host: int, size: int) -> None:
    """Set ``size`` bytes of host memory at ``host`` to zero."""
    ffi.memmove(ffi.cast("void *", host), bytes(size), size)


def flag_load(host: int) -> int:
    """The 32-bit word at host address ``host`` (a flag a stream waits on)."""
    return int(ffi.cast("uint32_t *", host)[0])


def flag_store(host: int, value: int) -> None:
    """Store ``value`` into the 32-bit word at ``host`` with release ordering (csrc/helpers.c),
    for a stream waiting on it with :func:`stream_wait_value_geq`."""
    lib.eglcuda_store_flag(ffi.cast("uint32_t *", host), value)


def surface_create(array: int, doing: str = "") -> int:
    """A surface object (``CUsurfObject``) over a CUDA array, for ``surf2Dread``/``surf2Dwrite``."""
    desc = ffi.new("CUDA_RESOURCE_DESC *")
    desc.resType = lib.CU_RESOURCE_TYPE_ARRAY
    desc.res.array.hArray = ffi.cast("CUarray", array)
    handle = ffi.new("CUsurfObject *")
    check(lib.cuSurfObjectCreate(handle, desc), "cuSurfObjectCreate", doing)
    return int(handle[0])


def surface_destroy(surface: int) -> int:
    """``cuSurfObjectDestroy``; returns the driver's status."""
    return lib.cuSurfObjectDestroy(surface)


def device_uuid(device: int) -> bytes:
    """The 16-byte UUID of a device as ``cuDeviceGetUuid`` gives it: the physical GPU's, which
    matches Vulkan's ``deviceUUID`` (also for a MIG instance). See :func:`instance_uuid`."""
    uuid = ffi.new("CUuuid *")
    check(lib.cuDeviceGetUuid(uuid, device), "cuDeviceGetUuid")
    return bytes(ffi.buffer(uuid.bytes, 16))


def instance_uuid(device: int) -> bytes:
    """The 16-byte UUID that names device handle ``device`` in every process, whatever
    ``CUDA_VISIBLE_DEVICES`` makes its ordinal: ``cuDeviceGetUuid_v2``, which gives each MIG
    instance its own UUID (the topics' transports match devices across processes with it), else
    :func:`device_uuid` on drivers without it."""
    if not _loader.is_bound("cuDeviceGetUuid_v2"):
        return device_uuid(device)
    uuid = ffi.new("CUuuid *")
    check(lib.cuDeviceGetUuid_v2(uuid, device), "cuDeviceGetUuid_v2", "reading the GPU's UUID")
    return bytes(ffi.buffer(uuid.bytes, 16))


def import_timeline_semaphore(fd: int) -> int:
    """Import a timeline semaphore's opaque fd (``cuImportExternalSemaphore``); CUDA owns the fd
    only once this returns (on failure it stays the caller's to close)."""
    desc = ffi.new("CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC *")
    desc.type = lib.CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
    desc.handle.fd = fd
    semaphore = ffi.new("CUexternalSemaphore *")
    check(lib.cuImportExternalSemaphore(semaphore, desc), "cuImportExternalSemaphore",
          "importing the Vulkan timeline semaphore")
    return int(ffi.cast("uintptr_t", semaphore[0]))


def signal_timeline_semaphore(semaphore: int, value: int, stream: int) -> None:
    """Queue on ``stream`` the signal of an imported timeline semaphore to ``value``."""
    semaphores = ffi.new("CUexternalSemaphore[1]", [ffi.cast("CUexternalSemaphore", semaphore)])
    params = ffi.new("CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS *")
    params.params.fence.value = value
    check(lib.cuSignalExternalSemaphoresAsync(semaphores, params, 1, ffi.cast("CUstream", stream)),
          "cuSignalExternalSemaphoresAsync", "signaling the timeline semaphore")


def external_semaphore_destroy(semaphore: int) -> int:
    """``cuDestroyExternalSemaphore``; returns the driver's status (finalizers ignore it)."""
    return lib.cuDestroyExternalSemaphore(ffi.cast("CUexternalSemaphore", semaphore))
