"""Frames: :class:`Frame`, the memory a producer presents (allocated by eglcuda or wrapped), made
of :class:`Plane` objects that hand out zero-copy views through ``__cuda_array_interface__`` and
DLPack. A consumer's frames (:class:`eglcuda.AcquiredFrame`, in the streams layer) share
:class:`FrameBase` and :class:`Plane`."""
from __future__ import annotations

import abc
import enum
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .._bind import cuda
from .._integers import as_int
from .._resource import exiting
from ..cuda_device import CudaDevice, get_device
from ..errors import ClosedError, Unsupported, UsageError
from .formats import (
    MAX_PITCH,
    PLANE_ALIGNMENT,
    ColorFormat,
    Layout,
    PlaneGeometry,
    check_pitch,
    check_size,
    default_pitch,
    _plane_geometry,
    driver_extents,
    layout_of,
    linear_layout,
    producer_format,
)
from ._core import FrameCore, make_capsule
from .interop import (DL_CUDA, cai_reader_streams, cai_stream, dlpack_stream, foreign_device_pointer, row_pitch,
                      stream_handle)



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


_ATTACH_FLAGS = {Attach.GLOBAL: cuda.MANAGED_ATTACH_GLOBAL, Attach.HOST: cuda.MANAGED_ATTACH_HOST,
                 Attach.SINGLE: cuda.MANAGED_ATTACH_SINGLE}


def _is_address(value: Any) -> bool:
    """A non-null 64-bit address."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 64


def _planes_fit(addresses: Sequence[Any], geometry: Sequence[PlaneGeometry]) -> bool:
    """Whether each plane starts at a non-null 64-bit address and ends below 2**64 (every plane:
    one that wraps around would reach the driver)."""
    return all(_is_address(a) and _is_address(a + g.pitch * g.height - 1) for a, g in zip(addresses, geometry))


def _copy_2d(device: CudaDevice, stream: int, *, src: Any = None, dst: Any = None, width_bytes: int, height: int,
             wait: bool = True) -> None:
    """A stream-ordered 2D copy, then (``wait``) wait for it. ``src``/``dst``: ("device", ptr, pitch),
    ("array", handle, 0) or ("host", ndarray, pitch)."""
    device.make_current()
    cuda.copy_2d(stream, src, dst, width_bytes, height, wait)


class Plane:
    """One plane of a frame: ``height`` rows of ``width`` elements of ``channels`` bytes.

    For pitch-linear frames it is a zero-copy array view: ``cupy.asarray(plane)`` and
    ``torch.from_dlpack(plane)`` share its memory (shape ``(height, width, channels)``, or
    ``(height, width)`` for one channel; uint8). Planes of CUDA-array frames expose ``array``
    (a ``CUarray`` handle) instead. A plane is valid while its frame is (an acquired frame until it
    is released); after that every access raises :class:`ClosedError`.
    """

    __slots__ = ("_frame", "index", "geometry", "_address", "__weakref__")

    def __init__(self, frame: "FrameBase", index: int, geometry: PlaneGeometry, address: int) -> None:
        self._frame = frame
        self.index = index
        self.geometry = geometry
        self._address = address

    # ---- geometry ----------------------------------------------------------------------------
    @property
    def width(self) -> int:
        """Columns of this plane (in elements of :attr:`channels` bytes)."""
        return self.geometry.width

    @property
    def height(self) -> int:
        """Rows of this plane."""
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
        """``(height, width)``, or ``(height, width, channels)`` for interleaved planes: the
        shape DLPack and ``__cuda_array_interface__`` export."""
        g = self.geometry
        return (g.height, g.width, g.channels) if g.channels > 1 else (g.height, g.width)

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides of :attr:`shape`."""
        g = self.geometry
        return (g.pitch, g.channels, 1) if g.channels > 1 else (g.pitch, 1)

    @property
    def read_only(self) -> bool:
        """Whether the plane is only to be read (an acquired frame, a subscriber's message): its
        exports say so and eglcuda's copies refuse to write into it."""
        return self._frame.read_only

    @property
    def _in_array(self) -> bool:
        """Whether the plane is a CUDA array (no device pointer, no linear memory to export)."""
        # (A pitch-linear plane has a pitch: the layout is asked only where it has none.)
        return not self.geometry.pitch and self._frame.layout is not Layout.PITCH

    @property
    def pointer(self) -> int:
        """The device address of the plane's first byte (pitch-linear frames only)."""
        self._frame._check_usable()
        if self._in_array:
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
        frame = self._frame
        if self._in_array:
            # (AttributeError: hasattr() and the probes of CuPy and Numba read a CUDA-array plane
            # as one with no such interface, which it is)
            raise AttributeError("a CUDA-array plane has no __cuda_array_interface__ (no linear memory); use .array")
        pointer = self.pointer  # (checks the frame is usable before anything is remembered)
        stream = frame.cuda_stream
        # The consumer never says which stream it reads on: the streams it most likely uses count
        # as the frame's users (docs/ordering.md), after the frame's other writers.
        readers = cai_reader_streams(frame.device.ordinal)
        if not frame.read_only:  # (an acquired frame or a message is only read: nothing to wait for)
            frame._order_after_writers(readers)
        frame._note_users(readers)
        return {
            "shape": self.shape,
            "strides": self.strides,
            "typestr": "|u1",
            "data": (pointer, self.read_only),
            "version": 3,
            # v3: None = nothing to wait for; the legacy default stream is spelled 1.
            "stream": None if stream is None else (stream or 1),
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, self._frame.device.ordinal)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule sharing this plane's memory. The consumer's ``stream`` (None: the
        legacy default stream, as the protocol says) is made to wait for the frame's work first,
        without a host wait, and is remembered: the frame's release, present or publish is ordered
        after it (docs/ordering.md). ``stream=-1`` asks for neither."""
        if self._in_array:
            raise BufferError("a CUDA-array plane cannot be exported through DLPack (no linear memory); use .array")
        pointer = self.pointer
        if copy:
            raise BufferError("eglcuda planes export without copying only (copy=True refused)")
        if dl_device is not None and _pair(dl_device, "dl_device") != self.__dlpack_device__():
            raise BufferError(f"plane lives on {self.__dlpack_device__()}, not {dl_device}")
        if max_version is not None:
            max_version = _pair(max_version, "max_version")
        consumer_stream = dlpack_stream(stream)
        if consumer_stream is not None:
            self._frame._hand_to(consumer_stream)
        # Only a 1.0 capsule can say read-only; with an unversioned one, consumers of acquired
        # frames must still only read (EGLStream's rule).
        versioned = max_version is not None and max_version >= (1, 0)
        # The capsule keeps this plane (and through it the frame) alive: Frame.close() then sees
        # the tensor as a live view and leaves the memory to it.
        return make_capsule(self, pointer, self._frame.device.ordinal, self.shape, self.strides,
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
        stream = frame.cuda_stream or 0
        if not frame.read_only:  # (a copy written on another stream lands first)
            frame._order_after_writers((stream,))
        _copy_2d(frame.device, stream, src=source, dst=("host", out, g.row_bytes),
                 width_bytes=g.row_bytes, height=g.height)
        return out

    def copy_from(self, data: np.ndarray) -> None:
        """Upload host data of this plane's :attr:`shape` (uint8) into the plane."""
        target = self._location(writing=True)
        frame = self._frame
        data = np.ascontiguousarray(data)
        # (height, row_bytes) is the same bytes as a one-row-per-line view; anything else would
        # land scrambled (a transposed image has the right size and the wrong rows).
        if data.dtype != np.uint8 or data.shape not in (self.shape, (self.height, self.geometry.row_bytes)):
            raise UsageError(f"expected uint8 data of shape {self.shape}, got {data.dtype} {data.shape}")
        g = self.geometry
        stream = frame.cuda_stream or 0
        frame._order_after_writers((stream,))  # (work of other streams on the plane ends first)
        _copy_2d(frame.device, stream, src=("host", data, g.row_bytes), dst=target,
                 width_bytes=g.row_bytes, height=g.height)

    def copy_to_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy of the plane into linear device memory (``pitch`` bytes per row) on
        ``cuda_stream`` (default: the frame's stream); does not wait. Another stream is ordered
        after the frame's and counts as one of its readers (docs/ordering.md)."""
        source = self._location()
        pointer, pitch = _check_linear(pointer, pitch, self.geometry)
        self._queue_copy_out(source, ("device", pointer, pitch), cuda_stream)

    def _copy_to_plane(self, target: "Plane", cuda_stream: Any = None) -> None:
        """As :meth:`copy_to_device`, into ``target``, a plane of the same shape, pitch-linear or
        a CUDA array (either side): ``publish_from(frame)``'s copy into a pool frame."""
        self._queue_copy_out(self._location(), target._location(writing=True), cuda_stream)

    def _queue_copy_out(self, source: Any, into: Any, cuda_stream: Any) -> None:
        """Queue the copy of the plane (``source``, its location) to ``into`` on ``cuda_stream``
        (None: the frame's stream; another is ordered after it and counts as a reader)."""
        frame = self._frame
        if cuda_stream is None:
            stream = frame.cuda_stream or 0
            if not frame.read_only:
                frame._order_after_writers((stream,))
        else:
            stream = stream_handle(cuda_stream)
            frame._hand_to(stream)
        g = self.geometry
        _copy_2d(frame.device, stream, src=source, dst=into, width_bytes=g.row_bytes, height=g.height, wait=False)

    def copy_from_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy from linear device memory (``pitch`` bytes per row) into the plane on
        ``cuda_stream`` (default: the legacy default stream); does not wait. The stream counts as
        one of the frame's users: its present or publish is ordered after it."""
        target = self._location(writing=True)
        frame = self._frame
        g = self.geometry
        pointer, pitch = _check_linear(pointer, pitch, g)
        stream = stream_handle(cuda_stream)
        frame._order_after_writers((stream,))  # (another stream's work on the plane ends first)
        frame._note_users((stream,))
        _copy_2d(frame.device, stream, src=("device", pointer, pitch), dst=target,
                 width_bytes=g.row_bytes, height=g.height, wait=False)

    def __copy__(self) -> "Plane":
        """The plane itself: a view does not change, and a second view object would be one the
        frame's :meth:`~Frame.close` does not know of (it would free the memory under it)."""
        return self

    def __reduce__(self) -> Any:
        raise TypeError("a plane cannot be pickled or deep-copied: it is a view of its frame's memory; copy its "
                        "data (to_numpy, copy_to_device) instead")

    def __repr__(self) -> str:
        return f"<Plane {self.index} {self.width}x{self.height}x{self.channels} pitch {self.pitch}>"


def _pair(value: Any, name: str) -> tuple[int, int]:
    """A DLPack (int, int) argument, or a clear error."""
    try:
        first, second = value
        device_or_major, number = as_int(first), as_int(second)  # (NumPy integers too)
        if device_or_major is not None and number is not None:
            return (device_or_major, number)
    except (TypeError, ValueError):
        pass
    raise UsageError(f"{name} is a pair of ints, got {value!r}")


def _check_linear(pointer: Any, pitch: Any, geometry: PlaneGeometry) -> tuple[int, int]:
    """Linear device memory a plane is copied to or from: a device address and a pitch that
    holds the plane's rows, as plain ints."""
    address = as_int(pointer)
    if address is None or not _is_address(address):
        raise UsageError(f"pointer is a device address (a non-null int below 2**64), got {pointer!r}")
    checked = as_int(pitch)
    if checked is None or not geometry.row_bytes <= checked <= MAX_PITCH:
        raise UsageError(f"pitch is an int of {geometry.row_bytes}..{MAX_PITCH} bytes (a row of this plane), "
                         f"got {pitch!r}")
    return address, checked


def note_users(users: list[int] | None, streams: Sequence[int]) -> list[int]:
    """``users`` (a frame's list of the streams it was handed to, or None) with ``streams`` added
    once each."""
    if users is None:
        return list(dict.fromkeys(streams))
    for stream in streams:
        if stream not in users:
            users.append(stream)
    return users


def order_after(device: CudaDevice, own_stream: int | None, consumer_stream: int) -> None:
    """Make ``consumer_stream`` wait for the work queued so far on ``own_stream`` (a frame's
    stream), without blocking the host."""
    if own_stream is None or own_stream == consumer_stream:
        return
    device.make_current()
    cuda.order_streams(own_stream, consumer_stream)


class FrameBase(abc.ABC):
    """What producer and consumer frames share: geometry, planes, usability checks.
    (:class:`eglcuda.AcquiredFrame` is registered as one.) A frame is a sequence of its planes
    (``len``, indexing) while usable, and always true (``if frame:``), closed or not."""

    __slots__ = ()

    width: int
    height: int
    format: ColorFormat
    layout: Layout
    pitch: int
    device: CudaDevice
    read_only: bool = False
    _planes: tuple["Plane", ...]
    # The CUDA streams the frame was handed to since it came to its holder (DLPack consumers,
    # copies, __cuda_array_interface__'s likely readers): what its release, present or publish is
    # ordered after (docs/ordering.md). None: none.
    _handed_to: list[int] | None = None

    @property
    def cuda_stream(self) -> int | None:
        """The ``CUstream`` the frame's data is ordered on (None: no ordering needed)."""
        return None

    @property
    def planes(self) -> tuple[Plane, ...]:
        self._check_usable()
        return self._planes

    @abc.abstractmethod
    def _check_usable(self) -> None:
        """Raise :class:`ClosedError` unless the frame's memory may be used."""

    def _hand_to(self, consumer_stream: int) -> None:
        """Make ``consumer_stream`` wait for the frame's stream (and, for a frame one may write, the
        other streams it was handed to), without blocking the host, and remember it as one of the
        frame's users."""
        order_after(self.device, self.cuda_stream, consumer_stream)
        self._order_after_writers((consumer_stream,))
        self._note_users((consumer_stream,))

    def _order_after_writers(self, streams: Sequence[int]) -> None:
        """A writable frame (a producer's): make each of ``streams`` wait, on the GPU, for the
        streams the frame was handed to before that are not among them (a DLPack consumer or a
        copy that wrote it), so that a new user sees what they wrote. (A read-only frame's users
        only read it: nothing to wait for.)"""
        users = self._handed_to
        if users is None or self.read_only:
            return
        writers = [stream for stream in users if stream not in streams]
        if writers:
            self.device.make_current()
            for stream in streams:
                cuda.join_streams(stream, writers, "ordering a new user of a frame after the streams that wrote it")

    def _note_users(self, streams: Sequence[int]) -> None:
        """Remember ``streams`` as users of the frame (work there may read or write it)."""
        # (The field is each subclass's: a slot of SlotView, a field of Frame's FrameCore.)
        self._handed_to = note_users(self._handed_to, streams)  # type: ignore[misc]

    def to_numpy(self) -> list[np.ndarray]:
        """Host copies of every plane (debugging)."""
        return [plane.to_numpy() for plane in self.planes]

    def __getitem__(self, index: int) -> Plane:
        return self.planes[index]

    def __len__(self) -> int:
        """The number of planes (raises :class:`ClosedError` once the frame is closed or released)."""
        return len(self.planes)

    def __reduce__(self) -> Any:
        # copy.copy, deepcopy and pickle would make a second frame object over the same memory
        # that its release or close does not reach: it would read a slot the publisher writes again,
        # or memory unmapped since.
        raise TypeError(f"a {type(self).__name__} cannot be copied or pickled: it is a view of memory it lends "
                        "until its release or close; copy its planes' data (to_numpy, copy_to_device) instead")

    def __bool__(self) -> bool:
        """Always True, open or closed, as for any object: ``if frame:`` tells a frame from None.
        (Without it truth would go through :meth:`__len__`, which raises on a closed frame; test
        ``frame.closed`` or ``frame.released`` for that.)"""
        return True


class _HostView:
    """Hands NumPy a host address through ``__array_interface__`` while keeping the frame alive
    as long as the array (NumPy keeps this object as the array's base)."""

    __slots__ = ("frame", "__array_interface__", "__weakref__")

    def __init__(self, frame: "Frame", interface: dict[str, Any]) -> None:
        self.frame = frame
        self.__array_interface__ = interface
        frame._host_views.add(self)
        # Told when this view goes: a frame closed meanwhile frees its memory then.
        frame._host_watch = [ref for ref in frame._host_watch if ref() is not None]
        frame._host_watch.append(weakref.ref(self, frame._view_gone))


def _view_callback(frame: "weakref.ReferenceType[Frame]") -> Callable[[Any], None]:
    """The weak reference callback of each view of ``frame`` (planes, host views): once the frame
    is closed and its last view is gone, its memory is freed (the frame object may live on)."""
    def gone(_view: Any) -> None:
        alive = frame()
        if alive is not None and alive._closed_early and not alive._viewed():
            alive._closed_early = False
            alive.close()

    return gone


def _allocate_linear(device: CudaDevice, memory: MemoryKind, size: int, what: str) -> tuple[int, int | None, int]:
    """``size`` bytes of ``memory``: (device address, host address or None, the address to free)."""
    if memory is MemoryKind.DEVICE:
        pointer = cuda.mem_alloc(size, f"allocating {what} in device memory")
        return pointer, None, pointer
    if memory is MemoryKind.PINNED:
        if not device._attribute(cuda.ATTRIBUTE_CAN_MAP_HOST_MEMORY):
            raise Unsupported("mapped pinned host memory", where=f"CUDA device {device.ordinal}")
        host, pointer = cuda.host_alloc_mapped(size, f"allocating {what} in pinned host memory")
        return pointer, host, host
    if not device._attribute(cuda.ATTRIBUTE_MANAGED_MEMORY):
        raise Unsupported("managed (unified) memory", where=f"CUDA device {device.ordinal}")
    pointer = cuda.mem_alloc_managed(size, f"allocating {what} in managed memory")
    return pointer, pointer, pointer


def _check_device(device: CudaDevice, addresses: Sequence[int]) -> None:
    """Raise :class:`UsageError` when wrapped memory is another device's: the frame, its planes'
    DLPack device and its ``__cuda_array_interface__`` would name ``device``, and a present would
    hand the driver another GPU's memory. (``__cuda_array_interface__`` names no device: the
    driver says where each plane is; memory it cannot place is left to it.)"""
    device.make_current()
    for index, address in enumerate(addresses):
        found = cuda.pointer_device(address)
        if found is not None and found != device.ordinal:
            raise UsageError(f"plane {index} is memory of CUDA device {found}, and this frame would be device "
                             f"{device.ordinal}'s: pass device={found}")


def _check_driver_extents(device: CudaDevice, fmt: ColorFormat, width: int, height: int, pitch: int,
                          addresses: Sequence[int]) -> None:
    """Raise :class:`UsageError` when wrapped memory ends before what the driver reads of a plane.

    Only planes the driver reads past (the half-pitch chroma planes of YUV420_PLANAR, see
    :func:`driver_extents`) are checked; left alone, such a frame works or fails at acquire
    depending on what the allocator put after it. Memory the driver cannot place (not from a
    CUDA allocation call) is left to the driver."""
    geometry = _plane_geometry(fmt, width, height, pitch)
    extents = driver_extents(fmt, width, height, pitch)
    if all(e <= g.nbytes for e, g in zip(extents, geometry)):
        return
    device.make_current()
    for index, (address, extent, g) in enumerate(zip(addresses, extents, geometry)):
        allocation = None if extent <= g.nbytes else cuda.address_range(address)
        if allocation is None:
            continue
        available = allocation[0] + allocation[1] - address
        if available < extent:
            raise UsageError(
                f"plane {index} of this {fmt.name} frame needs {extent} bytes of its allocation from its start "
                f"(the CUDA driver reads every plane as rows {pitch} bytes apart), but the allocation ends "
                f"{available} bytes after it: allocate {extent - available} more bytes after that plane "
                f"(Frame.allocate does)")


def _free_frame(ordinal: int, layout: Layout, addresses: tuple[int, ...], wrapped: Any,
                memory: MemoryKind = MemoryKind.DEVICE) -> None:
    """Finalizer: free what eglcuda allocated. Wrapped memory is its owner's: ``wrapped`` (the
    objects kept alive with the frame) is only let go of here. Never raises."""
    try:
        if wrapped is not None:
            return
        device = get_device(ordinal)
        device.make_current()
        if layout is Layout.ARRAY:
            for handle in addresses:
                cuda.array_destroy(handle)
        elif memory is MemoryKind.PINNED:
            cuda.host_free(addresses[0])
        else:
            cuda.mem_free(addresses[0])
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class Frame(FrameCore, FrameBase):
    """A frame a CUDA producer presents: device memory of a size, color format and layout.

    Make one with :meth:`allocate` (eglcuda owns the memory and frees it on :meth:`close` or
    garbage collection) or wrap memory allocated elsewhere, without copying, with
    :meth:`from_arrays` (objects with ``__cuda_array_interface__``: CuPy, PyTorch, Numba) or
    :meth:`from_pointer` (a raw device pointer and its geometry). Wrapped memory is never freed by
    eglcuda; the wrapped objects are kept alive as long as the frame.

    Once presented on a stream the frame belongs to the stream until the producer disconnects
    (the driver's rule): it cannot be closed before.
    """

    __reduce__ = FrameBase.__reduce__  # (its own words, not those of Resource, before it in the bases)

    def __init__(self, *, width: int, height: int, format: ColorFormat, layout: Layout, pitch: int,
                 device: CudaDevice, addresses: tuple[int, ...], plane_addresses: tuple[int, ...],
                 owned: bool, keep: Any = None, memory: MemoryKind = MemoryKind.DEVICE,
                 host_address: int | None = None) -> None:
        self.width = width
        self.memory = memory
        self._host_address = host_address  # where the CPU sees plane 0 (pinned and managed frames)
        self._host_views: weakref.WeakSet[_HostView] = weakref.WeakSet()
        self._host_watch: list[weakref.ReferenceType[_HostView]] = []
        self._closed_early = False  # closed by the user while views lived: freed when they die
        # Who lends the frame out (a publisher's pool, which set it): close() is refused meanwhile,
        # as the frame's memory is exported to other processes, which read it after a publish.
        self.held_by: str | None = None
        self._view_gone = _view_callback(weakref.ref(self))
        self.height = height
        self.format = format
        self.layout = layout
        self.pitch = pitch
        self.device = device
        self.owned = owned
        self._keep = keep
        geometry = _plane_geometry(format, width, height, pitch if layout is Layout.PITCH else 0)
        # (geometry, address) of each plane. The Plane objects are made when asked for and kept
        # only weakly: a plane keeps its frame alive, so a frame holding its planes would be a
        # reference cycle, and the frame's device memory would wait for the cycle collector.
        self._plane_specs = tuple(zip(geometry, plane_addresses))
        self._plane_refs: tuple[weakref.ReferenceType[Plane], ...] = ()
        # Owned first: should the description fail, the memory goes with this half-made frame.
        self._own(_free_frame, device.ordinal, layout, addresses if owned else (), None if owned else keep, memory)
        # The driver's description, built once: present passes it without allocating.
        self._describe(layout is Layout.ARRAY, tuple(plane_addresses), width, height,
                       pitch if layout is Layout.PITCH else 0, geometry[0].channels, int(format))

    @property
    def _planes(self) -> tuple[Plane, ...]:  # type: ignore[override]
        # (Written for speed: a loop's frame.planes[0].pointer makes its plane again each frame.)
        held = tuple([ref() for ref in self._plane_refs])
        if held and None not in held:
            return held  # type: ignore[return-value]  # None was ruled out just above
        # Only the planes that died are made again: one still alive (a tensor's capsule holds it)
        # stays the one close() watches.
        specs = self._plane_specs
        planes = tuple([plane if plane is not None else Plane(self, i, g, a)
                        for i, (plane, (g, a)) in enumerate(zip(held or (None,) * len(specs), specs))])
        gone = self._view_gone
        self._plane_refs = tuple([weakref.ref(plane, gone) for plane in planes])
        return planes

    def _viewed(self) -> bool:
        """Whether anything still points into the memory: a Plane object (held by the program, a
        CuPy array, a DLPack capsule) or a host view."""
        # (Iterated, not len(): while a view's weak reference callbacks run, the WeakSet may
        # still count it, but yields only live members.)
        return any(True for _ in self._host_views) or any(ref() is not None for ref in self._plane_refs)

    __reduce__ = FrameBase.__reduce__  # (FrameCore's comes first, with Cython's words for it)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def allocate(cls, width: int, height: int, format: ColorFormat | str = ColorFormat.ARGB,
                 layout: Layout | str = Layout.PITCH, device: int | CudaDevice = 0,
                 pitch_alignment: int = PLANE_ALIGNMENT, memory: MemoryKind | str = MemoryKind.DEVICE) -> "Frame":
        """Allocate a frame. Pitch-linear frames get one allocation with the planes
        ``pitch_alignment`` bytes aligned, in the ``memory`` kind asked for (see
        :class:`MemoryKind`); CUDA-array frames get one array per plane, in device memory."""
        try:
            memory = MemoryKind(memory.lower() if isinstance(memory, str) else memory)
        except ValueError:
            raise UsageError(f"memory is one of {[m.value for m in MemoryKind]}, got {memory!r}") from None
        fmt = producer_format(format)
        width, height = check_size(width, height, fmt)
        layout = layout_of(layout)
        alignment = as_int(pitch_alignment)
        if alignment is None or alignment < 1 or alignment & (alignment - 1) or alignment > MAX_PITCH:
            raise UsageError(f"pitch_alignment is a power of two (an int) of at most {MAX_PITCH}, got {pitch_alignment!r}")
        pitch_alignment = alignment
        if layout is Layout.ARRAY and memory is not MemoryKind.DEVICE:
            raise UsageError(f"CUDA-array frames live in device memory; {memory.value} memory needs layout='pitch'")
        device = get_device(device)
        device.make_current()
        if layout is Layout.ARRAY:
            handles = []
            try:
                for g in _plane_geometry(fmt, width, height, 0):
                    handles.append(cuda.array_create(g.width, g.height, g.channels, f"allocating a {fmt.name} plane"))
            except BaseException:
                for h in handles:
                    cuda.array_destroy(h)
                raise
            return cls(width=width, height=height, format=fmt, layout=layout, pitch=0, device=device,
                       addresses=tuple(handles), plane_addresses=tuple(handles), owned=True)
        pitch = default_pitch(fmt, width, pitch_alignment)
        offsets, total = linear_layout(fmt, width, height, pitch)
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
        fmt = producer_format(format)
        width, height = check_size(width, height, fmt)
        pitch = check_pitch(fmt, width, pitch)
        geometry = _plane_geometry(fmt, width, height, pitch)
        single = as_int(pointer)
        if single is not None:
            addresses, at = [], single
            for g in geometry:
                addresses.append(at)
                at += g.pitch * g.height
        elif isinstance(pointer, (list, tuple)):
            addresses = [address if as_int(address) is None else int(address) for address in pointer]
        else:
            raise UsageError(f"pointer is a device address (int) or one per plane, got {type(pointer).__name__}")
        if len(addresses) != len(geometry) or not _planes_fit(addresses, geometry):
            raise UsageError(f"a {fmt.name} frame needs {len(geometry)} non-null 64-bit plane address(es) whose "
                             f"planes end below 2**64, got {pointer!r}")
        device = get_device(device)
        _check_device(device, addresses)
        _check_driver_extents(device, fmt, width, height, pitch, addresses)
        return cls(width=width, height=height, format=fmt, layout=Layout.PITCH, pitch=pitch, device=device,
                   addresses=(), plane_addresses=tuple(addresses), owned=False, keep=owner)

    @classmethod
    def from_arrays(cls, arrays: Any, width: int | None = None, height: int | None = None,
                    format: ColorFormat | str = ColorFormat.ARGB, device: int | CudaDevice = 0) -> "Frame":
        """Wrap one CUDA array per plane (``__cuda_array_interface__``: CuPy, PyTorch, Numba)
        without copying. Each must be uint8, shaped ``(height, width[, channels])`` for its plane,
        with contiguous rows; plane 0's row stride is the frame's pitch and the others must follow
        the pitch convention of :mod:`eglcuda._formats`. Work still queued on the stream each
        array's interface names (CuPy's and PyTorch's current stream) is waited for here, on the
        host, so the frame holds what was written before it was wrapped (docs/ordering.md)."""
        fmt = producer_format(format)
        if not isinstance(arrays, (list, tuple)):
            arrays = [arrays]
        if not arrays:
            raise UsageError("from_arrays needs one array per plane, got none")
        described = [foreign_device_pointer(a) for a in arrays]
        # The streams the exporters say their data is ordered on (CuPy's and PyTorch's current
        # stream), read before the frame is made: a malformed one is refused.
        written_on = [stream for stream in dict.fromkeys(cai_stream(d[4]) for d in described) if stream is not None]
        pointer0, shape0, strides0, _, _, _ = described[0]
        if len(shape0) not in (2, 3):
            raise UsageError(f"plane 0 must be (height, width) or (height, width, channels), got shape {shape0}")
        height = height if height is not None else shape0[0]
        width = width if width is not None else shape0[1]
        width, height = check_size(width, height, fmt)
        pitch = strides0[0] if strides0 else int(np.prod(shape0[1:]))
        pitch = check_pitch(fmt, width, pitch)
        geometry = _plane_geometry(fmt, width, height, pitch)
        if len(described) != len(geometry):
            raise UsageError(f"a {fmt.name} frame has {len(geometry)} plane(s), got {len(described)} array(s)")
        for i, ((pointer, shape, strides, typestr, _, _), g) in enumerate(zip(described, geometry)):
            expected = (g.height, g.width, g.channels) if g.channels > 1 else (g.height, g.width)
            # (height, width, 1) is how some libraries describe one-channel planes (PyNvVideoCodec's Y).
            accepted = (expected, (g.height, g.row_bytes), (g.height, g.width, g.channels))
            if typestr not in ("|u1", "<u1") or tuple(shape) not in accepted:
                raise UsageError(f"plane {i} must be uint8 of shape {expected}, got {typestr} {tuple(shape)}")
            if not _planes_fit((pointer,), (g,)):
                raise UsageError(f"plane {i} has no usable device address ({pointer!r}): a non-null 64-bit address "
                                 "whose plane ends below 2**64")
            # Each row's bytes one after the other (anything else overlaps or spreads the pixels),
            # the rows the frame's pitch apart.
            row_pitch(shape, strides, typestr, g.height, g.row_bytes, f"plane {i} is uint8 of shape {expected}")
            row = strides[0] if strides else g.row_bytes
            if row != g.pitch:
                raise UsageError(f"plane {i} rows must be {g.pitch} bytes apart, got strides {strides}")
        device = get_device(device)
        _check_device(device, [d[0] for d in described])
        _check_driver_extents(device, fmt, width, height, pitch, [d[0] for d in described])
        frame = cls(width=width, height=height, format=fmt, layout=Layout.PITCH, pitch=pitch, device=device,
                    addresses=(), plane_addresses=tuple(d[0] for d in described), owned=False, keep=list(arrays))
        if any(read_only for *_, read_only in described):
            frame.read_only = True  # eglcuda writes none of it, and its views say so
        # Planes of frames eglcuda only lends (an acquired frame until its release, a message):
        # their memory is this frame's only as long as that frame is usable. A Frame's plane keeps
        # its own memory alive (see Frame.close), but one that wraps lent planes passes them on.
        lent: list[FrameBase] = []
        for array in arrays:
            if isinstance(array, Plane):
                owner = array._frame
                lent.extend(owner._sources if isinstance(owner, Frame) else (owner,))
        frame._sources = tuple(dict.fromkeys(lent))
        if written_on:
            # The protocol leaves the wait to its consumer, where it consumes: here, as the frame
            # may be presented much later, once that stream is gone (a `with cupy.cuda.Stream():`
            # block ended). Only a stream with work still queued is waited for.
            device.make_current()
            for stream in written_on:
                if not cuda.stream_idle(stream, "asking whether a wrapped array's stream is done"):
                    cuda.stream_synchronize(stream, "waiting for the stream a wrapped array is written on")
        return frame

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
        index = as_int(plane)
        if index is None or not 0 <= index < len(self._plane_specs):
            raise UsageError(f"plane is an index in 0..{len(self._plane_specs) - 1}, got {plane!r}")
        chosen = self.planes[index]
        interface = {"shape": chosen.shape, "strides": chosen.strides, "typestr": "|u1", "version": 3,
                     "data": (self._host_address + chosen._address - self.key, False)}
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
        cuda.attach_managed(stream, self.key, _ATTACH_FLAGS[to])

    def _is_managed(self) -> bool:
        """Whether plane 0 is managed memory: allocated so here, or wrapped memory the driver
        reports as managed (CuPy's or PyTorch's managed allocations, a raw managed pointer)."""
        if self.memory is MemoryKind.MANAGED:
            return True
        if self.layout is not Layout.PITCH or self.owned:
            return False
        self.device.make_current()
        return cuda.pointer_is_managed(self.key)

    # ---- state -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed_early or super().closed

    def _check_usable(self) -> None:
        if self.closed:
            raise ClosedError("the frame is closed")
        for source in self._sources:
            try:
                source._check_usable()
            except ClosedError as exc:
                raise ClosedError(f"the frame wraps the plane of a frame that can no longer be used ({exc})") from None

    def close(self) -> None:
        """Free the frame's memory (if eglcuda allocated it). Safe to call twice. Raises
        :class:`UsageError` while the frame belongs to a connected producer.

        The frame is unusable at once. Its memory is freed now unless something still points
        into it: a :class:`Plane` object held anywhere (a CuPy array made through
        ``__cuda_array_interface__`` holds its plane), a DLPack tensor (PyTorch's holds the
        plane), a :meth:`host_array` view, a frame that the consumer in this process holds
        after the producer disconnected. Then it is freed when the last of them is gone."""
        if self.presented:
            raise UsageError("the frame was presented on a producer that is still connected; "
                             "the driver may still use it: disconnect the producer first")
        if self.held_by is not None and not exiting():
            raise UsageError(f"the frame belongs to {self.held_by}, whose subscribers read its memory: publish() or "
                             "discard() it; the publisher frees it at its close()")
        if self._viewed() and not exiting():
            # Arrays still point into the memory: free it when the last one goes (a weak
            # reference callback of each view), not now, which would leave them dangling. (At
            # exit it is freed now: later would be after its CUDA context is gone.)
            self._closed_early = True
            return
        super().close()
        self._keep = None  # (what owned wrapped memory goes with it: a closed frame keeps it alive no more)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        memory = "" if self.memory is MemoryKind.DEVICE else f" {self.memory.value}"
        return f"<Frame {self.width}x{self.height} {self.format.name} {self.layout.value}{memory}{state}>"
