"""The few CUDA driver services eglcuda needs itself: errors, devices, primary contexts.

eglcuda works in each device's *primary* context, the one the CUDA runtime, CuPy and PyTorch use,
so memory and streams pass between them and eglcuda without conversion.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from . import _loader
from ._errors import CUDAError, Unsupported, cuda_error_name
from ._native import ffi, lib

# Re-entrant: the garbage collector may run a finalizer that needs it (a frame's free looks
# up its device) on a thread that holds it, at any allocation.
_init_lock = threading.RLock()
_initialized = False


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
    return CUDAError(code, call, name=name or cuda_error_name(code), description=description, doing=doing)


def check(code: int, call: str, doing: str = "") -> None:
    """Raise :class:`CUDAError` unless ``code`` is CUDA_SUCCESS."""
    if code:
        raise cuda_error(code, call, doing)


def init() -> None:
    """Load libcuda and call ``cuInit`` once per process."""
    global _initialized
    if _initialized:
        return
    _loader.cuda()
    with _init_lock:
        if not _initialized:
            check(lib.cuInit(0), "cuInit", "initializing the CUDA driver")
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


def _release_primary(device: int) -> None:
    # Finalizer: never raises; the driver may already be torn down at interpreter exit.
    try:
        lib.cuDevicePrimaryCtxRelease(device)
    except Exception:  # pragma: no cover
        pass


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver says of one CUDA device."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    integrated: bool
    total_memory: int  # bytes


class CudaDevice:
    """A CUDA device with its retained primary context. Get one with :func:`get_device`."""

    def __init__(self, ordinal: int) -> None:
        init()
        count = device_count()
        if not 0 <= ordinal < count:
            raise Unsupported(f"CUDA device {ordinal}", where=f"this machine ({count} CUDA device(s))")
        handle = ffi.new("CUdevice *")
        check(lib.cuDeviceGet(handle, ordinal), "cuDeviceGet")
        self.ordinal = ordinal
        self.handle: int = handle[0]
        context = ffi.new("CUcontext *")
        check(lib.cuDevicePrimaryCtxRetain(context, self.handle), "cuDevicePrimaryCtxRetain")
        self.context = context[0]
        self._finalizer = weakref.finalize(self, _release_primary, self.handle)
        self.info = self._query_info()

    def _attribute(self, attribute: int) -> int:
        out = ffi.new("int *")
        check(lib.cuDeviceGetAttribute(out, attribute, self.handle), "cuDeviceGetAttribute")
        return out[0]

    def _query_info(self) -> DeviceInfo:
        name = ffi.new("char[256]")
        check(lib.cuDeviceGetName(name, 256, self.handle), "cuDeviceGetName")
        total = ffi.new("size_t *")
        check(lib.cuDeviceTotalMem(total, self.handle), "cuDeviceTotalMem")
        return DeviceInfo(
            ordinal=self.ordinal,
            name=ffi.string(name).decode(),
            compute_capability=(
                self._attribute(lib.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                self._attribute(lib.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            integrated=bool(self._attribute(lib.CU_DEVICE_ATTRIBUTE_INTEGRATED)),
            total_memory=total[0],
        )

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread (cheap if it is)."""
        check(lib.eglcuda_ensure_current(self.context), "cuCtxSetCurrent")

    def memory_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        self.make_current()
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.cuMemGetInfo(free, total), "cuMemGetInfo")
        return free[0], total[0]

    def __repr__(self) -> str:
        return f"<CudaDevice {self.ordinal}: {self.info.name}>"


_devices: dict[int, CudaDevice] = {}


def get_device(ordinal: int = 0) -> CudaDevice:
    """The process-wide :class:`CudaDevice` for a CUDA ordinal (created once, then shared)."""
    device = _devices.get(ordinal)  # one dict read is atomic; finalizers take this path
    if device is None:
        created = CudaDevice(ordinal)
        with _init_lock:
            device = _devices.setdefault(ordinal, created)
    return device
