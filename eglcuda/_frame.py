"""Frames: producer-side :class:`Frame` (memory eglcuda allocated or wraps) and consumer-side
:class:`AcquiredFrame` (a view the stream lends until release), each made of :class:`Plane`
objects that hand out zero-copy views through ``__cuda_array_interface__`` and DLPack."""
from __future__ import annotations

import enum
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ._cuda import CudaDevice, check, get_device
from ._errors import ClosedError, Unsupported, UsageError
from ._formats import (
    SAME_GEOMETRY,
    ColorFormat,
    Layout,
    PlaneGeometry,
    check_pitch,
    check_size,
    color_format,
    default_pitch,
    driver_extents,
    plane_geometry,
)
from ._hotpath import AcquiredCore
from ._interop import DL_CUDA, dlpack_stream, foreign_device_pointer, make_capsule, stream_handle
from ._native import ffi, lib

if TYPE_CHECKING:
    from ._stream import CudaConsumer

PLANE_ALIGNMENT = 256  # bytes between planes of one allocation, and the default pitch alignment


class MemoryKind(str, enum.Enum):
    """Where an allocated frame's bytes live (section 3 of NVIDIA's Tegra memory guide).

    - ``DEVICE``: GPU memory (``cuMemAlloc``). Fastest for kernels; the CPU reaches it only
      through copies. The default, and the only kind CUDA-array frames come in.
    - ``PINNED``: page-locked host memory mapped into the GPU's address space
      (``cuMemHostAlloc`` with ``DEVICEMAP``), "zero-copy": kernels read and write it across the
      bus (on Tegra: the same DRAM, but uncached on the GPU side), the CPU directly.
    - ``MANAGED``: unified memory (``cuMemAllocManaged``), one pointer valid on both sides, which
      the driver migrates (discrete GPUs) or keeps coherent by cache maintenance (Tegra). Pass a
      stream to :meth:`Frame.attach` to tell the driver who uses it next.
    """

    DEVICE = "device"
    PINNED = "pinned"
    MANAGED = "managed"


class Attach(str, enum.Enum):
    """Who may touch a managed frame (``cuStreamAttachMemAsync``): every stream and the CPU
    (``GLOBAL``), the CPU only (``HOST``), or one stream (``SINGLE``)."""

    GLOBAL = "global"
    HOST = "host"
    SINGLE = "single"


_ATTACH_FLAGS = {Attach.GLOBAL: lib.CU_MEM_ATTACH_GLOBAL, Attach.HOST: lib.CU_MEM_ATTACH_HOST,
                 Attach.SINGLE: lib.CU_MEM_ATTACH_SINGLE}


def _copy_2d(device: CudaDevice, stream: int, *, src=None, dst=None, width_bytes: int, height: int,
             wait: bool = True) -> None:
    """A stream-ordered 2D copy, then (``wait``) wait for it. ``src``/``dst``: ("device", ptr, pitch),
    ("array", handle, 0) or ("host", ndarray, pitch)."""
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
    device.make_current()
    cu_stream = ffi.cast("CUstream", stream)
    check(lib.cuMemcpy2DAsync(copy, cu_stream), "cuMemcpy2DAsync", "copying a plane")
    if wait:
        check(lib.cuStreamSynchronize(cu_stream), "cuStreamSynchronize", "waiting for a plane copy")


class Plane:
    """One plane of a frame: ``height`` rows of ``width`` elements of ``channels`` bytes.

    For pitch-linear frames it is a zero-copy array view: ``cupy.asarray(plane)`` and
    ``torch.from_dlpack(plane)`` share its memory (shape ``(height, width, channels)``, or
    ``(height, width)`` for one channel; uint8). Planes of CUDA-array frames expose ``array``
    (a ``CUarray`` handle) instead. A plane is valid while its frame is (an acquired frame until it
    is released); after that every access raises :class:`ClosedError`.
    """

    __slots__ = ("_frame", "index", "geometry", "_address", "__weakref__")

    def __init__(self, frame: "_FrameBase", index: int, geometry: PlaneGeometry, address: int) -> None:
        self._frame = frame
        self.index = index
        self.geometry = geometry
        self._address = address

    # ---- geometry ----------------------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.geometry.width

    @property
    def height(self) -> int:
        return self.geometry.height

    @property
    def channels(self) -> int:
        return self.geometry.channels

    @property
    def pitch(self) -> int:
        """Bytes between rows (0 for CUDA-array planes)."""
        return self.geometry.pitch

    @property
    def shape(self) -> tuple[int, ...]:
        g = self.geometry
        return (g.height, g.width, g.channels) if g.channels > 1 else (g.height, g.width)

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides of :attr:`shape`."""
        g = self.geometry
        return (g.pitch, g.channels, 1) if g.channels > 1 else (g.pitch, 1)

    @property
    def read_only(self) -> bool:
        return self._frame.read_only

    @property
    def pointer(self) -> int:
        """The device address of the plane's first byte (pitch-linear frames only)."""
        self._frame._check_usable()
        if self._frame.layout is not Layout.PITCH:
            raise UsageError("a CUDA-array plane has no device pointer; use .array")
        return self._address

    @property
    def array(self) -> int:
        """The plane's ``CUarray`` handle (CUDA-array frames only)."""
        self._frame._check_usable()
        if self._frame.layout is not Layout.ARRAY:
            raise UsageError("a pitch-linear plane has no CUDA array; use .pointer")
        return self._address

    # ---- zero-copy protocols -----------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        stream = self._frame.cuda_stream
        return {
            "shape": self.shape,
            "strides": self.strides,
            "typestr": "|u1",
            "data": (self.pointer, self.read_only),
            "version": 3,
            # v3: None = nothing to wait for; the legacy default stream is spelled 1.
            "stream": None if stream is None else (stream or 1),
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, self._frame.device.ordinal)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule sharing this plane's memory. If the consumer names a ``stream``,
        that stream is made to wait for the frame's work first (no host wait)."""
        pointer = self.pointer
        if copy:
            raise BufferError("eglcuda planes export without copying only (copy=True refused)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"plane lives on {self.__dlpack_device__()}, not {dl_device}")
        consumer_stream = dlpack_stream(stream)
        if consumer_stream is not None:
            self._frame._order_before(consumer_stream)
        # Only a 1.0 capsule can say read-only; with an unversioned one, consumers of acquired
        # frames must still only read (EGLStream's rule).
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return make_capsule(self._frame, pointer, self._frame.device.ordinal, self.shape, self.strides,
                            self.read_only, versioned)

    # ---- copies --------------------------------------------------------------------------------
    def _location(self, writing: bool = False) -> tuple[str, int, int]:
        """The plane as a copy endpoint for :func:`_copy_2d` (checks it is usable first)."""
        frame = self._frame
        frame._check_usable()
        if writing and self.read_only:
            raise UsageError("this plane is read-only (a consumer must not write into an acquired frame)")
        if frame.layout is Layout.ARRAY:
            return ("array", self._address, 0)
        return ("device", self._address, self.geometry.pitch)

    def to_numpy(self) -> np.ndarray:
        """A host copy of the plane (for debugging and tests), shaped like :attr:`shape`."""
        source = self._location()
        frame = self._frame
        out = np.empty(self.shape, np.uint8)
        g = self.geometry
        _copy_2d(frame.device, frame.cuda_stream or 0, src=source, dst=("host", out, g.row_bytes),
                 width_bytes=g.row_bytes, height=g.height)
        return out

    def copy_from(self, data: np.ndarray) -> None:
        """Upload host data of this plane's :attr:`shape` (uint8) into the plane."""
        target = self._location(writing=True)
        frame = self._frame
        data = np.ascontiguousarray(data)
        if data.dtype != np.uint8 or data.size != self.height * self.geometry.row_bytes:
            raise UsageError(f"expected uint8 data of shape {self.shape}, got {data.dtype} {data.shape}")
        g = self.geometry
        _copy_2d(frame.device, frame.cuda_stream or 0, src=("host", data, g.row_bytes), dst=target,
                 width_bytes=g.row_bytes, height=g.height)

    def copy_to_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy of the plane into linear device memory (``pitch`` bytes per row) on
        ``cuda_stream`` (default: the frame's stream); does not wait."""
        source = self._location()
        frame = self._frame
        g = self.geometry
        stream = (frame.cuda_stream or 0) if cuda_stream is None else stream_handle(cuda_stream)
        _copy_2d(frame.device, stream, src=source, dst=("device", pointer, pitch), width_bytes=g.row_bytes,
                 height=g.height, wait=False)

    def copy_from_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy from linear device memory (``pitch`` bytes per row) into the plane on
        ``cuda_stream`` (default: the legacy default stream); does not wait."""
        target = self._location(writing=True)
        frame = self._frame
        g = self.geometry
        _copy_2d(frame.device, stream_handle(cuda_stream), src=("device", pointer, pitch), dst=target,
                 width_bytes=g.row_bytes, height=g.height, wait=False)

    def __repr__(self) -> str:
        return f"<Plane {self.index} {self.width}x{self.height}x{self.channels} pitch {self.pitch}>"


class _FrameBase:
    """What producer and consumer frames share: geometry, planes, usability checks."""

    # No instance dict here: an AcquiredFrame has none (the consumer reuses the object once the
    # caller drops it, csrc/hotpath.c), while Frame, which declares no slots, keeps its own.
    __slots__ = ()

    width: int
    height: int
    format: ColorFormat
    layout: Layout
    pitch: int
    device: CudaDevice
    read_only: bool = False

    @property
    def cuda_stream(self) -> int | None:
        """The ``CUstream`` the frame's data is ordered on (None: no ordering needed)."""
        return None

    @property
    def planes(self) -> tuple[Plane, ...]:
        self._check_usable()
        return self._planes

    def _check_usable(self) -> None:
        raise NotImplementedError

    def _order_before(self, consumer_stream: int) -> None:
        """Make ``consumer_stream`` wait for the frame's stream, without blocking the host."""
        own = self.cuda_stream
        if own is None or own == consumer_stream:
            return
        self.device.make_current()
        event = ffi.new("CUevent *")
        check(lib.cuEventCreate(event, lib.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        try:
            check(lib.cuEventRecord(event[0], ffi.cast("CUstream", own)), "cuEventRecord")
            check(lib.cuStreamWaitEvent(ffi.cast("CUstream", consumer_stream), event[0], 0), "cuStreamWaitEvent")
        finally:
            lib.cuEventDestroy(event[0])

    def to_numpy(self) -> list[np.ndarray]:
        """Host copies of every plane (debugging)."""
        return [plane.to_numpy() for plane in self.planes]

    def __getitem__(self, index: int) -> Plane:
        return self.planes[index]

    def __len__(self) -> int:
        return len(self.planes)


class _HostView:
    """Hands NumPy a host address through ``__array_interface__`` while keeping the frame alive
    as long as the array (NumPy keeps this object as the array's base)."""

    __slots__ = ("frame", "__array_interface__", "__weakref__")

    def __init__(self, frame: "Frame", interface: dict[str, Any]) -> None:
        self.frame = frame
        self.__array_interface__ = interface
        frame._host_views.add(self)


def _allocate_linear(device: CudaDevice, memory: MemoryKind, size: int, what: str) -> tuple[int, int | None, int]:
    """``size`` bytes of ``memory``: (device address, host address or None, the address to free)."""
    if memory is MemoryKind.DEVICE:
        pointer = ffi.new("CUdeviceptr *")
        check(lib.cuMemAlloc(pointer, size), "cuMemAlloc", f"allocating {what} in device memory")
        return int(pointer[0]), None, int(pointer[0])
    if memory is MemoryKind.PINNED:
        if not device._attribute(lib.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY):
            raise Unsupported("mapped pinned host memory", where=f"CUDA device {device.ordinal}")
        host = ffi.new("void **")
        check(lib.cuMemHostAlloc(host, size, lib.CU_MEMHOSTALLOC_PORTABLE | lib.CU_MEMHOSTALLOC_DEVICEMAP),
              "cuMemHostAlloc", f"allocating {what} in pinned host memory")
        host_address = int(ffi.cast("uintptr_t", host[0]))
        pointer = ffi.new("CUdeviceptr *")
        status = lib.cuMemHostGetDevicePointer(pointer, host[0], 0)
        if status:
            lib.cuMemFreeHost(host[0])
            check(status, "cuMemHostGetDevicePointer", f"mapping {what} for the GPU")
        return int(pointer[0]), host_address, host_address
    if not device._attribute(lib.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY):
        raise Unsupported("managed (unified) memory", where=f"CUDA device {device.ordinal}")
    pointer = ffi.new("CUdeviceptr *")
    check(lib.cuMemAllocManaged(pointer, size, lib.CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged",
          f"allocating {what} in managed memory")
    return int(pointer[0]), int(pointer[0]), int(pointer[0])


def _check_driver_extents(device: CudaDevice, fmt: ColorFormat, width: int, height: int, pitch: int,
                          addresses: Sequence[int]) -> None:
    """Raise :class:`UsageError` when wrapped memory ends before what the driver reads of a plane.

    Only planes the driver reads past (the half-pitch chroma planes of YUV420_PLANAR, see
    :func:`driver_extents`) are checked; left alone, such a frame works or fails at acquire
    depending on what the allocator put after it. Memory the driver cannot place (not from a
    CUDA allocation call) is left to the driver."""
    geometry = plane_geometry(fmt, width, height, pitch)
    extents = driver_extents(fmt, width, height, pitch)
    if all(e <= g.nbytes for e, g in zip(extents, geometry)):
        return
    device.make_current()
    base, size = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
    for index, (address, extent, g) in enumerate(zip(addresses, extents, geometry)):
        if extent <= g.nbytes or lib.cuMemGetAddressRange(base, size, address) != lib.CUDA_SUCCESS:
            continue
        available = int(base[0]) + int(size[0]) - address
        if available < extent:
            raise UsageError(
                f"plane {index} of this {fmt.name} frame needs {extent} bytes of its allocation from its start "
                f"(the CUDA driver reads every plane as rows {pitch} bytes apart), but the allocation ends "
                f"{available} bytes after it: allocate {extent - available} more bytes after that plane "
                f"(Frame.allocate does)")


def _free_frame(ordinal: int, layout: Layout, addresses: tuple[int, ...], wrapped: Any,
                memory: MemoryKind = MemoryKind.DEVICE) -> None:
    """Finalizer: free what eglcuda allocated (nothing for wrapped memory). Never raises."""
    try:
        if wrapped is not None:
            release = getattr(wrapped, "release", None)
            if callable(release):
                release()
            return
        device = get_device(ordinal)
        device.make_current()
        if layout is Layout.ARRAY:
            for handle in addresses:
                lib.cuArrayDestroy(ffi.cast("CUarray", handle))
        elif memory is MemoryKind.PINNED:
            lib.cuMemFreeHost(ffi.cast("void *", addresses[0]))
        else:
            lib.cuMemFree(addresses[0])
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class Frame(_FrameBase):
    """A frame a CUDA producer presents: device memory of a size, color format and layout.

    Make one with :meth:`allocate` (eglcuda owns the memory and frees it on :meth:`close` or
    garbage collection) or wrap memory allocated elsewhere, without copying, with
    :meth:`from_arrays` (objects with ``__cuda_array_interface__``: CuPy, PyTorch, Numba) or
    :meth:`from_pointer` (a raw device pointer and its geometry). Wrapped memory is never freed by
    eglcuda; the wrapped objects are kept alive as long as the frame.

    Once presented on a stream the frame belongs to the stream until the producer disconnects
    (the driver's rule): it cannot be closed before.
    """

    def __init__(self, *, width: int, height: int, format: ColorFormat, layout: Layout, pitch: int,
                 device: CudaDevice, addresses: tuple[int, ...], plane_addresses: tuple[int, ...],
                 owned: bool, keep: Any = None, memory: MemoryKind = MemoryKind.DEVICE,
                 host_address: int | None = None) -> None:
        self.width = width
        self.memory = memory
        self._host_address = host_address  # where the CPU sees plane 0 (pinned and managed frames)
        self._host_views: weakref.WeakSet[_HostView] = weakref.WeakSet()
        self._closed_early = False  # closed by the user while host views lived: freed when they die
        self.height = height
        self.format = format
        self.layout = layout
        self.pitch = pitch
        self.device = device
        self.owned = owned
        self._keep = keep
        geometry = plane_geometry(format, width, height, pitch if layout is Layout.PITCH else 0)
        self._planes = tuple(Plane(self, i, g, a) for i, (g, a) in enumerate(zip(geometry, plane_addresses)))
        self._producer: weakref.ReferenceType | None = None  # set while presented on a producer
        # The driver's description, built once: present passes it without allocating.
        egl = ffi.new("CUeglFrame *")
        for i, address in enumerate(plane_addresses):
            if layout is Layout.ARRAY:
                egl.frame.pArray[i] = ffi.cast("CUarray", address)
            else:
                egl.frame.pPitch[i] = ffi.cast("void *", address)
        egl.width, egl.height, egl.depth = width, height, 1
        egl.pitch = pitch if layout is Layout.PITCH else 0
        egl.planeCount = len(plane_addresses)
        egl.numChannels = geometry[0].channels
        egl.frameType = lib.CU_EGL_FRAME_TYPE_ARRAY if layout is Layout.ARRAY else lib.CU_EGL_FRAME_TYPE_PITCH
        egl.eglColorFormat = int(format)
        egl.cuFormat = lib.CU_AD_FORMAT_UNSIGNED_INT8
        self._egl = egl
        self._egl_address = int(ffi.cast("uintptr_t", egl))  # what the producer's C present passes
        self.key = plane_addresses[0]  # how a returned CUeglFrame is matched to this object
        self._finalizer = weakref.finalize(self, _free_frame, device.ordinal, layout,
                                           addresses if owned else (), None if owned else keep, memory)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def allocate(cls, width: int, height: int, format: ColorFormat | str = ColorFormat.ARGB,
                 layout: Layout | str = Layout.PITCH, device: int | CudaDevice = 0,
                 pitch_alignment: int = PLANE_ALIGNMENT, memory: MemoryKind | str = MemoryKind.DEVICE) -> "Frame":
        """Allocate a frame. Pitch-linear frames get one allocation with the planes
        ``pitch_alignment`` bytes aligned, in the ``memory`` kind asked for (see
        :class:`MemoryKind`); CUDA-array frames get one array per plane, in device memory."""
        try:
            memory = MemoryKind(memory)
        except ValueError:
            raise UsageError(f"memory is one of {[m.value for m in MemoryKind]}, got {memory!r}") from None
        fmt = color_format(format)
        if fmt in SAME_GEOMETRY:
            fmt = SAME_GEOMETRY[fmt]
        check_size(width, height, fmt)
        layout = Layout(layout)
        if pitch_alignment < 1 or pitch_alignment & (pitch_alignment - 1):
            raise UsageError(f"pitch_alignment must be a power of two, got {pitch_alignment}")
        if layout is Layout.ARRAY and memory is not MemoryKind.DEVICE:
            raise UsageError(f"CUDA-array frames live in device memory; {memory.value} memory needs layout='pitch'")
        device = device if isinstance(device, CudaDevice) else get_device(device)
        device.make_current()
        if layout is Layout.ARRAY:
            handles = []
            try:
                for g in plane_geometry(fmt, width, height, 0):
                    descriptor = ffi.new("CUDA_ARRAY_DESCRIPTOR *", {
                        "Width": g.width, "Height": g.height,
                        "Format": lib.CU_AD_FORMAT_UNSIGNED_INT8, "NumChannels": g.channels})
                    handle = ffi.new("CUarray *")
                    check(lib.cuArrayCreate(handle, descriptor), "cuArrayCreate", f"allocating a {fmt.name} plane")
                    handles.append(int(ffi.cast("uintptr_t", handle[0])))
            except BaseException:
                for h in handles:
                    lib.cuArrayDestroy(ffi.cast("CUarray", h))
                raise
            return cls(width=width, height=height, format=fmt, layout=layout, pitch=0, device=device,
                       addresses=tuple(handles), plane_addresses=tuple(handles), owned=True)
        pitch = default_pitch(fmt, width, pitch_alignment)
        offsets, total = [], 0
        for g in plane_geometry(fmt, width, height, pitch):
            offsets.append(total)
            total += -(-g.pitch * g.height // PLANE_ALIGNMENT) * PLANE_ALIGNMENT
        # Room for what the driver reads past a half-pitch plane (see driver_extents).
        total = max(total, *(o + e for o, e in zip(offsets, driver_extents(fmt, width, height, pitch))))
        base, host, owned_address = _allocate_linear(device, memory, total, f"a {width}x{height} {fmt.name} frame")
        return cls(width=width, height=height, format=fmt, layout=layout, pitch=pitch, device=device,
                   addresses=(owned_address,), plane_addresses=tuple(base + o for o in offsets), owned=True,
                   memory=memory, host_address=host)

    @classmethod
    def from_pointer(cls, pointer: int | Sequence[int], width: int, height: int, pitch: int,
                     format: ColorFormat | str = ColorFormat.ARGB, device: int | CudaDevice = 0,
                     owner: Any = None) -> "Frame":
        """Wrap device memory at ``pointer`` without copying. ``pointer`` is one address (planes
        follow each other, each ``pitch_i * height_i`` bytes) or one address per plane. ``owner``
        is kept alive as long as the frame."""
        fmt = color_format(format)
        check_size(width, height, fmt)
        check_pitch(fmt, width, pitch)
        geometry = plane_geometry(fmt, width, height, pitch)
        if isinstance(pointer, int):
            addresses, at = [], pointer
            for g in geometry:
                addresses.append(at)
                at += g.pitch * g.height
        else:
            addresses = [int(p) for p in pointer]
        if len(addresses) != len(geometry) or any(a <= 0 for a in addresses):
            raise UsageError(f"a {fmt.name} frame needs {len(geometry)} non-null plane pointer(s), got {pointer!r}")
        device = device if isinstance(device, CudaDevice) else get_device(device)
        _check_driver_extents(device, fmt, width, height, pitch, addresses)
        return cls(width=width, height=height, format=fmt, layout=Layout.PITCH, pitch=pitch, device=device,
                   addresses=(), plane_addresses=tuple(addresses), owned=False, keep=owner)

    @classmethod
    def from_arrays(cls, arrays: Any, width: int | None = None, height: int | None = None,
                    format: ColorFormat | str = ColorFormat.ARGB, device: int | CudaDevice = 0) -> "Frame":
        """Wrap one CUDA array per plane (``__cuda_array_interface__``: CuPy, PyTorch, Numba)
        without copying. Each must be uint8, shaped ``(height, width[, channels])`` for its plane,
        with contiguous rows; plane 0's row stride is the frame's pitch and the others must follow
        the pitch convention of :mod:`eglcuda._formats`."""
        fmt = color_format(format)
        if not isinstance(arrays, (list, tuple)):
            arrays = [arrays]
        described = [foreign_device_pointer(a) for a in arrays]
        pointer0, shape0, strides0, _, _ = described[0]
        height = height if height is not None else shape0[0]
        width = width if width is not None else shape0[1]
        check_size(width, height, fmt)
        pitch = strides0[0] if strides0 else int(np.prod(shape0[1:]))
        check_pitch(fmt, width, pitch)
        geometry = plane_geometry(fmt, width, height, pitch)
        if len(described) != len(geometry):
            raise UsageError(f"a {fmt.name} frame has {len(geometry)} plane(s), got {len(described)} array(s)")
        for i, ((pointer, shape, strides, typestr, _), g) in enumerate(zip(described, geometry)):
            expected = (g.height, g.width, g.channels) if g.channels > 1 else (g.height, g.width)
            flat = (g.height, g.row_bytes)
            if typestr not in ("|u1", "<u1") or tuple(shape) not in (expected, flat):
                raise UsageError(f"plane {i} must be uint8 of shape {expected}, got {typestr} {tuple(shape)}")
            row = strides[0] if strides else g.row_bytes
            inner_ok = strides is None or tuple(strides[1:]) in ((g.channels, 1), (1,))
            if row != g.pitch or not inner_ok:
                raise UsageError(f"plane {i} rows must be {g.pitch} bytes apart with contiguous pixels, got strides {strides}")
        device = device if isinstance(device, CudaDevice) else get_device(device)
        _check_driver_extents(device, fmt, width, height, pitch, [d[0] for d in described])
        return cls(width=width, height=height, format=fmt, layout=Layout.PITCH, pitch=pitch, device=device,
                   addresses=(), plane_addresses=tuple(d[0] for d in described), owned=False, keep=list(arrays))

    # ---- memory kinds ------------------------------------------------------------------------
    def host_array(self, plane: int = 0) -> np.ndarray:
        """A NumPy view of a pinned or managed frame's plane in place: the CPU reads and writes
        the frame's own bytes, no copy. Order it with the GPU yourself (synchronize the stream
        that last wrote the frame before reading; for managed frames see :meth:`attach`).

        The view keeps the memory alive: closing the frame while views exist makes the frame
        unusable at once but frees its memory only when the last view is gone."""
        self._check_usable()
        if self._host_address is None:
            raise UsageError(f"a {self.memory.value}-memory frame has no host view; allocate it with "
                             "memory='pinned' or 'managed' (or use to_numpy() for a copy)")
        chosen = self._planes[plane]
        interface = {"shape": chosen.shape, "strides": chosen.strides, "typestr": "|u1", "version": 3,
                     "data": (self._host_address + chosen._address - self._planes[0]._address, False)}
        return np.asarray(_HostView(self, interface))

    def attach(self, to: Attach | str, cuda_stream: Any = None) -> None:
        """Tell the driver who touches this managed frame next (``cuStreamAttachMemAsync``,
        queued on ``cuda_stream``): ``"host"`` before CPU work, ``"global"`` before GPU work on
        any stream, ``"single"`` for work on ``cuda_stream`` only. This is the guide's tool on
        Tegra, where ``cudaMemPrefetchAsync`` is not available; it takes effect in stream order."""
        self._check_usable()
        try:
            to = Attach(to)
        except ValueError:
            raise UsageError(f"attach to one of {[a.value for a in Attach]}, got {to!r}") from None
        if self.memory is not MemoryKind.MANAGED:
            raise UsageError(f"only managed frames can be attached, this one is {self.memory.value} memory")
        stream = stream_handle(cuda_stream)
        if to is Attach.SINGLE and stream == 0:
            raise UsageError("attach('single') needs the stream it attaches to, not the default stream")
        self.device.make_current()
        check(lib.cuStreamAttachMemAsync(ffi.cast("CUstream", stream), self._planes[0]._address, 0, _ATTACH_FLAGS[to]),
              "cuStreamAttachMemAsync", f"attaching a managed frame to {to.value}")

    def _is_managed(self) -> bool:
        """Whether plane 0 is managed memory: allocated so here, or wrapped memory the driver
        reports as managed (CuPy's or PyTorch's managed allocations, a raw managed pointer)."""
        if self.memory is MemoryKind.MANAGED:
            return True
        if self.layout is not Layout.PITCH or self.owned:
            return False
        flag = ffi.new("unsigned int *")
        self.device.make_current()
        status = lib.cuPointerGetAttribute(flag, lib.CU_POINTER_ATTRIBUTE_IS_MANAGED, self._planes[0]._address)
        return status == 0 and bool(flag[0])

    # ---- state -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed_early or not self._finalizer.alive

    @property
    def presented(self) -> bool:
        """Whether the frame is associated with a connected producer (see the class notes)."""
        producer = self._producer() if self._producer else None
        return producer is not None and not producer.closed

    def _check_usable(self) -> None:
        if self._closed_early or not self._finalizer.alive:
            raise ClosedError("the frame is closed")

    def close(self) -> None:
        """Free the frame's memory (if eglcuda allocated it). Safe to call twice. Raises
        :class:`UsageError` while the frame belongs to a connected producer."""
        if self.presented:
            raise UsageError("the frame was presented on a producer that is still connected; "
                             "the driver may still use it: disconnect the producer first")
        if len(self._host_views):
            # NumPy arrays still point into the memory: free it when the last one goes (they
            # hold this frame), not now, which would leave them dangling.
            self._closed_early = True
            return
        self._finalizer()

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        memory = "" if self.memory is MemoryKind.DEVICE else f" {self.memory.value}"
        return f"<Frame {self.width}x{self.height} {self.format.name} {self.layout.value}{memory}{state}>"


class AcquiredFrame(AcquiredCore, _FrameBase):
    """A frame the CUDA consumer acquired: a read-only view of the producer's data, valid until
    :meth:`release` (or the end of a ``with`` block). After release every access raises.

    ``number`` is the stream's consumer frame counter for this frame and ``is_new`` tells whether
    it is a frame not seen before: when no new frame arrives within the acquire timeout, the driver
    hands back the previous one again (``is_new`` False). Both are None when the consumer was
    connected with ``frame_numbers=False``.

    Only the consumer makes these (its C acquire fills the base class's fields, see
    csrc/hotpath.c); ``release`` is the base class's C method. Once nothing but the consumer
    refers to a released frame (no reference, weak reference or plane of it left), the consumer
    may reuse the object for a later frame, so the per-frame path allocates nothing. For the same
    reason these objects take no attributes of their own.
    """

    read_only = True
    __slots__ = ()
    _consumer: CudaConsumer  # the base class's field

    @property
    def _egl(self):
        # The consumer's CUeglFrame buffer stays valid while this frame is held (one frame at a
        # time), so fields are read when asked for.
        return self._consumer._egl_frame

    @property
    def device(self) -> CudaDevice:  # type: ignore[override]
        return self._consumer.device

    @property
    def width(self) -> int:  # type: ignore[override]
        self._check_usable()
        return self._egl.width

    @property
    def height(self) -> int:  # type: ignore[override]
        self._check_usable()
        return self._egl.height

    @property
    def format(self) -> ColorFormat:  # type: ignore[override]
        self._check_usable()
        return color_format(self._egl.eglColorFormat)

    @property
    def layout(self) -> Layout:  # type: ignore[override]
        self._check_usable()
        return Layout.ARRAY if self._egl.frameType == lib.CU_EGL_FRAME_TYPE_ARRAY else Layout.PITCH

    @property
    def pitch(self) -> int:  # type: ignore[override]
        return self._egl.pitch if self.layout is Layout.PITCH else 0

    @property
    def _planes(self) -> tuple[Plane, ...]:  # type: ignore[override]
        if self._planes_cache is None:
            egl = self._egl
            geometry = plane_geometry(self.format, egl.width, egl.height, self.pitch)
            addresses = [int(ffi.cast("uintptr_t", egl.frame.pPitch[i])) for i in range(egl.planeCount)]
            self._planes_cache = tuple(Plane(self, i, g, a) for i, (g, a) in enumerate(zip(geometry, addresses)))
        return self._planes_cache

    @property
    def cuda_stream(self) -> int:
        """The consumer's ``CUstream``: work on the frame must be ordered after it."""
        return self._consumer.cuda_stream

    @property
    def released(self) -> bool:
        return self._released

    def _check_usable(self) -> None:
        if self._released:
            raise ClosedError("the frame was released back to the stream; acquire a new one")

    def __enter__(self) -> "AcquiredFrame":
        return self

    def __exit__(self, *exc) -> None:
        if not self._released:
            self.release()

    def __repr__(self) -> str:
        if self._released:
            return f"<AcquiredFrame #{self.number} released>"
        state = {True: "new", False: "old", None: "unnumbered"}[self.is_new]
        return f"<AcquiredFrame #{self.number} {self.width}x{self.height} {self.format.name} {self.layout.value} {state}>"
