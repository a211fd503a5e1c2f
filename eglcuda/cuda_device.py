"""The few CUDA driver services eglcuda needs itself: devices and their primary contexts.

eglcuda works in each device's *primary* context, the one the CUDA runtime, CuPy and PyTorch use,
so memory and streams pass between them and eglcuda without conversion.
"""
from __future__ import annotations

from dataclasses import dataclass

from ._bind import cuda
from ._bind.cuda import driver_version
from ._integers import as_int
from ._resource import Resource, exiting
from .errors import Unsupported, UsageError

__all__ = ["CudaDevice", "DeviceInfo", "device_info", "driver_version", "get_device"]


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver says of one CUDA device."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    integrated: bool
    total_memory: int  # bytes


class CudaDevice(Resource):
    """A CUDA device with its retained primary context. Get one with :func:`get_device`.

    ``handle`` is the ``CUdevice`` and ``context`` the primary ``CUcontext`` (an address). The
    process-wide registry keeps every device open; the retain is released at interpreter exit,
    after the displays and frames that may still use the context, and after what was made on the
    device and registered with it."""

    # At interpreter exit, after displays (0) and frames (1): they may still use the context.
    _exit_rank = 2

    def __init__(self, ordinal: int) -> None:
        _not_negative(ordinal)
        cuda.init()
        count = cuda.device_count()
        if not 0 <= ordinal < count:
            raise Unsupported(f"CUDA device {ordinal}", where=f"this machine ({count} CUDA device(s))")
        self.ordinal = ordinal
        self.handle: int = cuda.device_get(ordinal)
        self.context: int = cuda.primary_context_retain(self.handle)
        self._own(cuda.primary_context_release, self.handle)
        self.info = _read_info(ordinal, self.handle)

    def close(self) -> None:
        """Nothing while the interpreter runs: the device is the whole process's (every frame,
        stream and display on it uses its context), released at interpreter exit. (Releasing it
        here, as ``with get_device(0):`` did, destroyed the context under every frame on the
        device, and every later CUDA call of eglcuda failed.)"""
        if exiting():
            super().close()

    def _attribute(self, attribute: int) -> int:
        return cuda.device_attribute(self.handle, attribute)

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread (cheap if it is)."""
        cuda.make_current(self.context)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        self.make_current()
        return cuda.mem_get_info()

    def __repr__(self) -> str:
        return f"<CudaDevice {self.ordinal}: {self.info.name}>"


def _read_info(ordinal: int, handle: int) -> DeviceInfo:
    def attribute(which: int) -> int:
        return cuda.device_attribute(handle, which)

    return DeviceInfo(
        ordinal=ordinal,
        name=cuda.device_name(handle),
        compute_capability=(attribute(cuda.ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            attribute(cuda.ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        integrated=bool(attribute(cuda.ATTRIBUTE_INTEGRATED)),
        total_memory=cuda.device_total_memory(handle),
    )


def device_info(ordinal: int) -> DeviceInfo:
    """What the driver says of CUDA device ``ordinal``, without making a context on it (which
    :func:`get_device` does: memory on the GPU, and an MPS client under MPS)."""
    device = _devices.get(ordinal)
    if device is not None:
        return device.info
    number = as_int(ordinal)  # (a NumPy integer too)
    if number is not None:
        _not_negative(number)
    cuda.init()
    count = cuda.device_count()
    if not isinstance(ordinal, int) or not 0 <= ordinal < count:
        raise Unsupported(f"CUDA device {ordinal}", where=f"this machine ({count} CUDA device(s))")
    return _read_info(ordinal, cuda.device_get(ordinal))


_devices: dict[int, CudaDevice] = {}


def _not_negative(ordinal: int) -> None:
    """A negative ordinal is a bug of the caller's, not a device this machine lacks: UsageError,
    before the driver is asked (a program may take Unsupported for "no GPU here")."""
    if ordinal < 0:
        raise UsageError(f"a CUDA device ordinal is 0 or more, got {ordinal}")


def _ordinal(value: object) -> int:
    """A device ordinal from any integer (a NumPy one too), never a bool or a float."""
    ordinal = as_int(value)
    if ordinal is not None:
        return ordinal
    raise UsageError(f"a CUDA device is an int ordinal or an eglcuda.CudaDevice, got {type(value).__name__}")


def get_device(ordinal: "int | CudaDevice" = 0) -> CudaDevice:
    """The process-wide :class:`CudaDevice` for a CUDA ordinal (created once, then shared); a
    :class:`CudaDevice` is returned as it is."""
    if isinstance(ordinal, CudaDevice):
        return ordinal
    if type(ordinal) is not int:
        ordinal = _ordinal(ordinal)
    device = _devices.get(ordinal)  # one dict read is atomic; finalizers take this path
    if device is None or cuda.forked_after_init():
        # (in a forked child the parent's devices are closed: init() raises the reason)
        created = CudaDevice(ordinal)
        device = _devices.setdefault(ordinal, created)  # atomic: the first one made wins
    return device
