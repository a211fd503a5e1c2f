"""CUDA virtual memory management (csrc/cuda_vmm.h): device memory shared between processes as a
file descriptor, for the ``cuda-vmm`` topic transport.

The exporter makes a physical allocation with :func:`create` (POSIX file descriptor handle type),
turns it into a descriptor with :func:`export_fd` and sends that with SCM_RIGHTS; the importer
maps it with :func:`map_import` and unmaps it with :func:`unmap_release`. Unlike a CUDA IPC handle
(64 bytes anyone who learns them can open), the descriptor is a capability: only a process it
was sent to can map the memory.

Sizes and addresses are bytes; handles (``CUmemGenericAllocationHandle``) and addresses
(``CUdeviceptr``) are ints. Every driver refusal raises :class:`eglcuda.CUDAError`; bad input is a
:class:`eglcuda.UsageError` before any driver call. The calls work in the current context (the
caller makes the device's primary context current first), except :func:`supported` and
:func:`granularity`, which need none.
"""
from __future__ import annotations

from ..errors import EglCudaError, UsageError
from . import cuda as _cuda
from . import loader as _loader
from ._native import ffi, lib
from .cuda import check

HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = lib.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = lib.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = lib.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
ENTRY_POINTS = ("cuMemGetAllocationGranularity", "cuMemCreate", "cuMemRelease", "cuMemExportToShareableHandle",
                "cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap",
                "cuMemUnmap", "cuMemSetAccess")

_granularity: dict[int, int] = {}  # device ordinal -> bytes; a device's granularity never changes


def _allocation_prop(device_ordinal: int):
    prop = ffi.new("CUmemAllocationProp *")  # zeroed: no compression, no RDMA flag, no usage hints
    prop.type = lib.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = lib.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_ordinal
    return prop


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{name} must be a positive int (bytes), got {value!r}")


def _ordinal(device_ordinal: int) -> None:
    if not isinstance(device_ordinal, int) or isinstance(device_ordinal, bool) or device_ordinal < 0:
        raise UsageError(f"a CUDA device ordinal is an int >= 0, got {device_ordinal!r}")


def _descriptor(fd: int) -> None:
    if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
        raise UsageError(f"a file descriptor is an int >= 0, got {fd!r}")


def _multiple(size: int, device_ordinal: int) -> int:
    """Check that ``size`` is a whole number of the device's granularity; returns the granularity."""
    _positive("size", size)
    step = granularity(device_ordinal)
    if size % step:
        raise UsageError(f"a VMM allocation's size must be a multiple of device {device_ordinal}'s granularity "
                         f"({step} bytes), got {size}: round it up to {-(-size // step) * step}")
    return step


def require() -> None:
    """Raise :class:`eglcuda.Unsupported` unless libcuda exports every call of this module."""
    for name in ENTRY_POINTS:
        _loader.require_cuda_entry(name)


def supported(device: int) -> str | None:
    """None when device ordinal ``device`` can share VMM allocations as file descriptors, else
    why not (libcuda or an entry point missing, attribute 102 or 103 off, no such device).
    Never raises."""
    try:
        _cuda.init()
        require()
        handle = _cuda.device_get(device)
        if not _cuda.device_attribute(handle, ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED):
            return f"CUDA device {device} does not support virtual memory management"
        if not _cuda.device_attribute(handle, ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED):
            return f"CUDA device {device} cannot export memory as POSIX file descriptors"
    except (EglCudaError, TypeError, OverflowError) as exc:
        return str(exc)
    return None


def granularity(device_ordinal: int) -> int:
    """The minimum granularity, in bytes, of a VMM allocation on the device (sizes, offsets and
    reservations are multiples of it; 2 MiB on current NVIDIA GPUs). Cached per device."""
    _ordinal(device_ordinal)
    known = _granularity.get(device_ordinal)
    if known is not None:
        return known
    _cuda.init()
    out = ffi.new("size_t *")
    check(lib.cuMemGetAllocationGranularity(out, _allocation_prop(device_ordinal), lib.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity", f"reading device {device_ordinal}'s VMM allocation granularity")
    _granularity[device_ordinal] = int(out[0])
    return int(out[0])


def create(size: int, device_ordinal: int) -> int:
    """A new physical allocation of ``size`` bytes (a multiple of :func:`granularity`) on the
    device, exportable as a POSIX file descriptor (``cuMemCreate``). The caller owns the handle
    and gives it back with :func:`release`."""
    _ordinal(device_ordinal)
    _multiple(size, device_ordinal)
    handle = ffi.new("CUmemGenericAllocationHandle *")
    check(lib.cuMemCreate(handle, size, _allocation_prop(device_ordinal), 0), "cuMemCreate",
          f"allocating {size} bytes of shareable memory on CUDA device {device_ordinal}")
    return int(handle[0])


def export_fd(handle: int) -> int:
    """A new file descriptor for the allocation ``handle`` (``cuMemExportToShareableHandle``).
    The caller owns the descriptor: send it with SCM_RIGHTS, then close it."""
    fd = ffi.new("int *", -1)
    check(lib.cuMemExportToShareableHandle(fd, handle, HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle", "exporting a VMM allocation as a file descriptor")
    return int(fd[0])


def import_fd(fd: int) -> int:
    """The allocation handle of a descriptor another process exported (``cuMemImportFromShareableHandle``).
    The descriptor stays the caller's (close it when done); the handle is given back with :func:`release`."""
    _descriptor(fd)
    handle = ffi.new("CUmemGenericAllocationHandle *")
    check(lib.cuMemImportFromShareableHandle(handle, ffi.cast("void *", fd), HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle", "importing another process's VMM allocation from its file descriptor")
    return int(handle[0])


def reserve(size: int, alignment: int = 0) -> int:
    """Reserve ``size`` bytes of virtual address space (``cuMemAddressReserve``); ``alignment`` in
    bytes, 0 for the driver's default. Returns the start address; free it with :func:`address_free`."""
    _positive("size", size)
    if not isinstance(alignment, int) or alignment < 0 or alignment & (alignment - 1):
        raise UsageError(f"alignment must be 0 or a power of two (bytes), got {alignment!r}")
    address = ffi.new("CUdeviceptr *")
    check(lib.cuMemAddressReserve(address, size, alignment, 0, 0), "cuMemAddressReserve",
          f"reserving {size} bytes of device address space")
    return int(address[0])


def map(address: int, size: int, handle: int) -> None:  # noqa: A001 - the driver's name, module-qualified
    """Map the whole allocation ``handle`` (``size`` bytes) at ``address``, inside a reservation
    (``cuMemMap``). Not accessible until :func:`set_access`."""
    _positive("address", address)
    _positive("size", size)
    check(lib.cuMemMap(address, size, 0, handle, 0), "cuMemMap", f"mapping {size} bytes of a VMM allocation")


def set_access(address: int, size: int, device_ordinal: int) -> None:
    """Let the device read and write the mapped range (``cuMemSetAccess``, PROT_READWRITE)."""
    _positive("address", address)
    _positive("size", size)
    _ordinal(device_ordinal)
    desc = ffi.new("CUmemAccessDesc *")
    desc.location.type = lib.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device_ordinal
    desc.flags = lib.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(lib.cuMemSetAccess(address, size, desc, 1), "cuMemSetAccess",
          f"granting device {device_ordinal} read/write access to a mapped VMM range")


def unmap(address: int, size: int) -> None:
    """Unmap the range (``cuMemUnmap``); the reservation stays."""
    _positive("address", address)
    _positive("size", size)
    check(lib.cuMemUnmap(address, size), "cuMemUnmap", f"unmapping {size} bytes of a VMM allocation")


def release(handle: int) -> None:
    """Give back an allocation handle (``cuMemRelease``). The memory itself is freed once no
    mapping and no handle (in any process) refers to it."""
    check(lib.cuMemRelease(handle), "cuMemRelease", "releasing a VMM allocation handle")


def address_free(address: int, size: int) -> None:
    """Give back a reservation made with :func:`reserve` (``cuMemAddressFree``; unmap first)."""
    _positive("address", address)
    _positive("size", size)
    check(lib.cuMemAddressFree(address, size), "cuMemAddressFree", f"freeing {size} bytes of device address space")


def map_import(fd: int, size: int, device_ordinal: int) -> int:
    """Map another process's allocation, received as descriptor ``fd`` (``size`` bytes, a multiple
    of :func:`granularity`), readable and writable by the device: import, reserve, map, set access.
    Returns the address; undo with ``unmap_release(address, size)``. The imported handle is
    released once mapped (the mapping keeps the memory); ``fd`` stays the caller's. On failure,
    what was done is undone before the error is raised."""
    _descriptor(fd)
    _ordinal(device_ordinal)
    step = _multiple(size, device_ordinal)
    handle = import_fd(fd)
    address = mapped = None
    try:
        address = reserve(size, step)
        map(address, size, handle)
        mapped = address
        set_access(address, size, device_ordinal)
    except BaseException:
        if mapped is not None:
            lib.cuMemUnmap(mapped, size)
        if address is not None:
            lib.cuMemAddressFree(address, size)
        lib.cuMemRelease(handle)
        raise
    release(handle)
    return address


def unmap_release(address: int, size: int, handle: int | None = None) -> None:
    """Undo a mapping: unmap, free the reservation and, when given, release ``handle`` (the
    exporter's own mapping of an allocation it made). Every step is tried; the first failure is
    raised after the others ran."""
    _positive("address", address)
    _positive("size", size)
    steps = [(lambda: lib.cuMemUnmap(address, size), "cuMemUnmap", "unmapping a VMM range"),
             (lambda: lib.cuMemAddressFree(address, size), "cuMemAddressFree", "freeing a VMM reservation")]
    if handle is not None:
        steps.append((lambda: lib.cuMemRelease(handle), "cuMemRelease", "releasing a VMM allocation handle"))
    first = None
    for call, name, doing in steps:
        status = call()
        if status and first is None:
            first = _cuda.cuda_error(status, name, doing)
    if first is not None:
        raise first

