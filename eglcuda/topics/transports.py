"""How a topic's frames reach a subscriber: two transports behind one interface.

- ``cuda-ipc`` (discrete GPUs, the subscriber on the publisher's GPU or on a peer GPU): every pool
  slot is its own ``cuMemAlloc`` allocation with an interprocess event. A subscriber opens a slot's
  memory and event handles once, before the slot's first frame reaches it (a SLOT message). Per
  frame the publisher records the slot's event on the publish stream, after the user's work
  (unless that work has finished already: ``CudaIpcPublisher.on_publish``); the subscriber's
  stream waits on it while it is pending (``cuStreamWaitEvent``: no host wait). When the subscriber
  releases a frame while its stream still has work queued (a kernel reading the frame), it
  records its own interprocess "done" event for the slot on that stream (the event's handle
  travels in the first RELEASE that records one for the slot), and the publisher writes the slot
  again only once the done events of every subscriber that recorded one have completed (asked on
  the host: its own stream never waits for another process). A release from a stream with nothing
  queued carries no event (an interprocess record costs about 2.6 us). A dropped or dead
  subscriber's events are never waited on again.
- ``eglstream`` (Jetson, GL subscribers, a subscriber in the publisher's own process, and
  wherever CUDA IPC is refused): the subscriber makes an EGLStream on its own display (mailbox
  for ``latest``, a FIFO of its queue length for ``every``), connects its consumer (CUDA or GL),
  and sends the stream's descriptor in ATTACH; the publisher opens it on its own display, connects
  a :class:`eglcuda.CudaProducer` and presents each pool frame on every such subscriber's producer.
  A pool frame is free again once every producer gave it back (``return_frame``).

The publisher and subscriber (publisher.py, subscriber.py) speak to transports only through the
abstract classes here, and get them from a *backend*: :class:`CudaPublisherBackend` and
:class:`CudaSubscriberBackend` for real GPUs; the CPU tests inject a backend whose transport moves
no GPU memory (tests/topics_null.py).
"""
from __future__ import annotations

import abc
import collections
import logging
import os
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._bind import cuda, cuda_egl, cuda_ipc  # nothing is loaded at import: libcuda opens at first use
from ..errors import ClosedError, EglCudaError, PeerError, Timeout, UsageError
from ..frames.formats import ColorFormat, Layout, color_format, plane_geometry
from ..frames.frame import Frame, FrameBase, Plane
from . import _wire, protocol
from ..context import GLContext
from ..cuda_device import CudaDevice, get_device
from ..frames.interop import stream_handle
from ..display import Display
from ..streams.stream import Stream

if TYPE_CHECKING:
    from ..streams.cuda import CudaConsumer, CudaProducer
    from ..streams.gl import GLTextureConsumer

log = logging.getLogger("eglcuda.topics")

CUDA_IPC = "cuda-ipc"
EGLSTREAM = "eglstream"
TRANSPORT_NAMES = (CUDA_IPC, EGLSTREAM)
NO_UUID = bytes(16)
ACQUIRE_STEP_US = 200_000
UNMAP_WAIT_S = 2.0  # how long a closing cuda-ipc subscriber waits for its stream before unmapping


@dataclass(frozen=True)
class DeviceIdentity:
    """A GPU as the other process can recognise it: ``uuid`` is the same in every process."""

    ordinal: int  # this process's CUDA ordinal (-1: none)
    uuid: bytes = NO_UUID
    integrated: bool = False

    @classmethod
    def of(cls, device: CudaDevice) -> "DeviceIdentity":
        """The identity of ``device`` (its UUID as MIG-aware ``cuDeviceGetUuid_v2`` gives it)."""
        return cls(device.ordinal, cuda.instance_uuid(device.handle), device.info.integrated)


@dataclass(frozen=True)
class Geometry:
    """A topic's frames: what WELCOME tells every subscriber."""

    width: int
    height: int
    format: ColorFormat
    layout: Layout
    pitch: int  # plane 0's, bytes (0 for CUDA-array frames)
    plane_offsets: tuple[int, ...]  # bytes from a slot's base to each plane

    @classmethod
    def from_welcome(cls, welcome: protocol.Welcome) -> "Geometry":

        fmt = color_format(welcome.format)
        layout = Layout.ARRAY if welcome.layout else Layout.PITCH
        planes = plane_geometry(fmt, welcome.width, welcome.height, welcome.pitch if layout is Layout.PITCH else 0)
        if len(planes) != len(welcome.plane_offsets):
            raise protocol.ProtocolError(f"a {fmt.name} topic has {len(planes)} planes, the publisher described "
                                         f"{len(welcome.plane_offsets)}")
        return cls(welcome.width, welcome.height, fmt, layout, welcome.pitch, tuple(welcome.plane_offsets))


# ==== the interface ===============================================================================

class PublisherLink(abc.ABC):
    """One subscriber, as the publisher's transport serves it."""

    transport: "PublisherTransport"
    returns_later = False  # frames come back through reclaim(), which has no descriptor to wait on
    message_only = False  # True: the FRAME message is the whole hand-over (number() is 0, deliver() does nothing)
    plain_release = False  # True: a RELEASE without a done event frees its slot (released() would return True)

    def ready_extra(self) -> bytes:
        """Transport data for the READY message."""
        return b""

    def slot_extra(self, slot: Any) -> bytes | None:
        """Transport data of a SLOT message to send before ``slot``'s first frame on this link,
        or None when the transport needs none."""
        return None

    def number(self) -> int:
        """The stream frame number the next :meth:`deliver` will give its frame (0: none)."""
        return 0

    def reading_done(self, slot: Any) -> bool:
        """Whether the subscriber's GPU work on ``slot`` (released with its done event recorded)
        has finished; asked on the host, without waiting. True: the slot may be written, and the
        link forgets that work."""
        return True

    @abc.abstractmethod
    def deliver(self, slot: Any, cuda_stream: int | None) -> None:
        """Hand ``slot``'s frame over, after its FRAME message went out."""

    def released(self, slot: Any, release: protocol.Release) -> bool:
        """The subscriber released the frame it got in ``slot``: whether this link has now let go
        of the slot's memory (False: it comes back later through :meth:`reclaim`). Raises
        :class:`PeerError` for transport data that is not valid."""
        return True

    def reclaim(self) -> list[Any]:
        """Pool frames the transport gave back since the last call (EGLStream returns)."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of everything this link holds. Never waits on the subscriber."""


class PublisherTransport(abc.ABC):
    """One way of moving the pool's frames to subscribers, on the publisher's side."""

    name: str
    # Pool frames a subscriber's end keeps however soon it releases: the publisher needs more than
    # this (max_pool) to ever get one back, and refuses the transport at the handshake otherwise.
    keeps_frames = 0

    @abc.abstractmethod
    def refusal(self, hello: protocol.Hello, peer_pid: int) -> str | None:
        """Why this transport cannot serve the subscriber that sent ``hello`` (None: it can)."""

    def welcome_extra(self, hello: protocol.Hello) -> bytes:
        return b""

    @abc.abstractmethod
    def attach(self, hello: protocol.Hello, attach: protocol.Attach, fds: list[int], peer_pid: int) -> PublisherLink:
        """Connect a subscriber (on the publisher's service thread). ``fds`` are the caller's to
        close afterwards. Raises :class:`PeerError` or :class:`EglCudaError` with the reason."""

    def add_slot(self, slot: Any) -> None:
        """A pool slot was made (on the publishing thread)."""

    def on_publish(self, slot: Any, cuda_stream: int | None) -> None:
        """Once per published frame, before its first delivery on this transport."""

    def close(self) -> None:
        """Release the transport's own resources (after every link is closed)."""


class PublisherBackend(abc.ABC):
    """The GPU side of a publisher: its device, its pool frames and its transports."""

    identity: DeviceIdentity

    @abc.abstractmethod
    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:
        """A new pool frame."""

    @abc.abstractmethod
    def geometry(self, frame: Any) -> Geometry:
        """What subscribers are told about frames like ``frame``."""

    @abc.abstractmethod
    def free(self, frame: Any) -> None:
        """Free a pool frame (after every link let go of it)."""

    @abc.abstractmethod
    def transports(self) -> Sequence[PublisherTransport]:
        """The transports this publisher offers."""

    def stream_handle(self, cuda_stream: Any) -> int | None:
        """A raw stream from what the user passed (None stays None: the legacy default stream)."""
        if cuda_stream is None:
            return None

        return stream_handle(cuda_stream)

    def order_writes(self, frame: Any, stream: int | None) -> None:
        """Before ``frame`` is published on ``stream`` (None: the legacy default stream): make
        that stream wait for every other stream the frame was handed to while it was written
        (docs/ordering.md)."""

    def close(self) -> None:
        """After every frame is freed."""


class SubscriberTransport(abc.ABC):
    """One subscriber's end of a transport."""

    name: str
    exclusive = False  # True: holds one frame at a time (an EGLStream consumer's rule)

    def attach(self) -> tuple[bytes, list[int]]:
        """Transport data and descriptors for ATTACH (the descriptors are closed by the caller
        once sent)."""
        return b"", []

    def ready(self, ready: protocol.Ready) -> None:
        """The publisher connected its side."""

    def on_slot(self, slot: protocol.Slot) -> None:
        """A SLOT message: a pool slot's transport data (before its first frame)."""
        raise protocol.ProtocolError(f"the {self.name} transport takes no SLOT messages")

    @abc.abstractmethod
    def take(self, frame: protocol.Frame, deadline: float,
             stop: Callable[[], bool] | None = None) -> tuple[Any, int | None]:
        """The frame ``frame`` announces, ready to be read on the subscriber's stream, and the
        stream frame number it arrived with (None: the transport has no numbers, the frame is
        the announced one). Raises :class:`Timeout` when it does not arrive before ``deadline``,
        :class:`ClosedError` when a wait for it sees ``stop()`` true (another thread closing)."""

    @abc.abstractmethod
    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        """Let go of a taken frame; returns the RELEASE flags and transport data."""

    def skip(self, frame: protocol.Frame) -> tuple[int, bytes]:
        """A frame announced but never taken (a 'latest' subscriber skipped it)."""
        return 0, b""

    def lost(self) -> None:
        """The publisher is gone: make held frames unusable before :meth:`close`."""

    def finish_reading(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the GPU work this subscriber queued on its frames to
        end (before its goodbye: the publisher does not wait for a subscriber that left). Returns
        whether it ended."""
        return True

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything; held frames become unusable."""


class SubscriberBackend(abc.ABC):
    """The GPU side of a subscriber: its device, stream, consumer kind and transports."""

    identity: DeviceIdentity
    consumer: protocol.ConsumerKind
    cuda_stream: int | None = None

    @abc.abstractmethod
    def wishes(self, requested: str) -> tuple[str, ...]:
        """The transports to ask for, best first, given the user's ``transport=`` choice."""

    @abc.abstractmethod
    def transport(self, name: str, welcome: protocol.Welcome, qos: protocol.Qos, queue: int) -> SubscriberTransport:
        """The subscriber's end of transport ``name`` for the topic ``welcome`` describes."""

    def close(self) -> None:
        pass


# ==== frames a subscriber reads through CUDA IPC =====================================================

class _ViewSpec:
    """What every view of one topic's slots shares (made once per subscription)."""

    __slots__ = ("geometry", "planes")

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.planes = plane_geometry(geometry.format, geometry.width, geometry.height, geometry.pitch)


class SlotView(FrameBase):
    """A read-only view of a publisher's pool slot, as a ``cuda-ipc`` subscriber receives it: the
    same plane interface as :class:`eglcuda.AcquiredFrame` (DLPack, ``__cuda_array_interface__``,
    ``to_numpy``), ordered on the subscriber's CUDA stream. Unusable once its message is released:
    the publisher may then write the slot again."""

    __slots__ = ("_spec", "_base", "device", "_stream", "_released", "slot", "_plane_cache", "_handed_to",
                 "__weakref__")

    read_only = True

    def __init__(self, spec: _ViewSpec, base: int, device: "CudaDevice", stream: int | None, slot: int) -> None:
        self._spec = spec
        self._base = base
        self.device = device
        self.slot = slot
        self._stream = stream
        self._released = False
        # Made when first asked for: most frames' planes are read once or never.
        self._plane_cache: tuple[Plane, ...] | None = None
        self._handed_to: list[int] | None = None

    width = property(lambda self: self._spec.geometry.width)
    height = property(lambda self: self._spec.geometry.height)
    format = property(lambda self: self._spec.geometry.format)
    layout = property(lambda self: self._spec.geometry.layout)
    pitch = property(lambda self: self._spec.geometry.pitch)

    # FrameBase declares _planes as an attribute; a view computes it, read-only (as Frame does).
    @property
    def _planes(self) -> tuple[Plane, ...]:  # type: ignore[override]
        planes = self._plane_cache
        if planes is None:
            base = self._base
            planes = self._plane_cache = tuple(
                Plane(self, i, g, base + offset)
                for i, (g, offset) in enumerate(zip(self._spec.planes, self._spec.geometry.plane_offsets)))
        return planes

    @property
    def cuda_stream(self) -> int | None:
        """The subscriber's ``CUstream``: it waits for the publisher's work on this frame."""
        return self._stream

    @property
    def released(self) -> bool:
        return self._released

    def _check_usable(self) -> None:
        if self._released:
            raise ClosedError("the message was released (or the subscriber lost its publisher): the publisher may "
                              "have written this slot again; receive a new message")

    def __repr__(self) -> str:
        state = " released" if self._released else ""
        return f"<SlotView slot {self.slot} {self.width}x{self.height} {self.format.name}{state}>"


# ==== cuda-ipc: the publisher's side ===============================================================

_IPC_SLOT = struct.Struct("<64s64sQ")  # memory handle, event handle, allocation size
# A cuda-ipc publisher whose stream was busy at a publish records the next frames' events without
# asking the stream first (one stream query saved per frame), this many, then asks again.
_ASK_AGAIN_AFTER = 16
_LOCAL = b"local:"
_local_streams: "weakref.WeakValueDictionary[bytes, Any]" = weakref.WeakValueDictionary()


class _IpcSlot:
    __slots__ = ("handle", "event", "event_handle", "size")

    def __init__(self, handle: bytes, event: Any, event_handle: bytes, size: int) -> None:
        self.handle = handle
        self.event = event
        self.event_handle = event_handle
        self.size = size


class CudaIpcPublisher(PublisherTransport):
    name = CUDA_IPC

    def __init__(self, backend: "CudaPublisherBackend") -> None:
        self.backend = backend
        self.device = backend.device
        self._slots: dict[int, _IpcSlot] = {}
        self._unavailable: str | None = None
        self._checked = False
        self._record_unasked = 0  # frames left to record without asking the stream first

    def _check_platform(self) -> str | None:
        if self.device.info.integrated:
            return "the publisher's GPU is integrated (Tegra): CUDA IPC is not available there"
        try:
            cuda_ipc.require()
        except EglCudaError as exc:
            return str(exc)
        try:
            if not self.device._attribute(cuda_ipc.ATTRIBUTE_IPC_EVENT_SUPPORTED):
                return f"CUDA device {self.device.ordinal} does not support interprocess events"
        except EglCudaError:
            pass  # drivers older than the attribute: interprocess events exist on Linux there
        return None

    def add_slot(self, slot: Any) -> None:

        if not self._checked:
            self._checked = True
            self._unavailable = self._check_platform()
        if self._unavailable is not None:
            return
        frame = slot.frame
        if frame.layout is not Layout.PITCH:
            self._unavailable = "CUDA-array frames cannot be shared through CUDA IPC (layout='array')"
            return
        self.device.make_current()
        base = frame.planes[0].pointer
        where = cuda.address_range(base)
        try:
            if where is None or where[0] != base:
                raise UsageError("a pool frame does not start its own allocation")
            handle = cuda_ipc.mem_handle(base)
            event = cuda_ipc.event_create_interprocess()
            try:
                event_handle = cuda_ipc.event_handle(event)
            except BaseException:
                cuda_ipc.event_destroy(event)
                raise
        except EglCudaError as exc:
            self._unavailable = f"exporting the pool through CUDA IPC failed: {exc}"
            return
        self._slots[slot.index] = _IpcSlot(handle, event, event_handle, where[1])

    def refusal(self, hello: protocol.Hello, peer_pid: int) -> str | None:
        if not self._checked:
            return "the pool is not exported yet"
        if self._unavailable is not None:
            return self._unavailable
        if hello.consumer is not protocol.ConsumerKind.CUDA:
            return "a GL subscriber takes frames through an EGLStream"
        if peer_pid == os.getpid():
            return "a subscriber in the publisher's own process cannot open the publisher's IPC handles"
        if hello.integrated:
            return "the subscriber's GPU is integrated (Tegra)"
        if hello.gpu_uuid == NO_UUID:
            return "the subscriber did not say which GPU it is on"
        own = self.backend.identity.uuid
        if hello.gpu_uuid != own:
            other = self.backend.ordinal_of(hello.gpu_uuid)
            if other is None:
                return "the subscriber's GPU is not visible to the publisher (CUDA_VISIBLE_DEVICES?): peer access unknown"
            if not self.backend.can_access_peer(other, self.device.ordinal):
                return f"the subscriber's GPU (CUDA {other} here) cannot map the publisher's GPU's memory (no peer access)"
        return None

    def welcome_extra(self, hello: protocol.Hello) -> bytes:
        return self.backend.identity.uuid

    def attach(self, hello: protocol.Hello, attach: protocol.Attach, fds: list[int], peer_pid: int) -> PublisherLink:
        if fds or attach.extra:
            raise PeerError("a cuda-ipc subscriber attaches without data or descriptors")
        return CudaIpcLink(self)

    def _slot(self, slot: Any) -> _IpcSlot:
        entry = self._slots.get(slot.index)
        if entry is None:
            raise UsageError(f"pool slot {slot.index} could not be exported through CUDA IPC ({self._unavailable})")
        return entry

    def on_publish(self, slot: Any, cuda_stream: int | None) -> None:
        entry = self._slot(slot)
        # A frame written and finished before its publish needs no event (see _wire.ipc_record):
        # the stream is asked first. A publisher whose stream was busy is likely to be busy for the
        # next frames too (its kernels write each frame): it then records without asking, and
        # asks again after _ASK_AGAIN_AFTER frames.
        asking = self._record_unasked == 0
        recorded = _wire.ipc_record(self.device.context, entry.event.address, cuda_stream or 0, asking)
        if asking:
            self._record_unasked = _ASK_AGAIN_AFTER if recorded else 0
        else:
            self._record_unasked -= 1

    def close(self) -> None:
        slots, self._slots = self._slots, {}
        if slots:
            self.device.make_current()
        for entry in slots.values():
            cuda_ipc.event_destroy(entry.event)


class CudaIpcLink(PublisherLink):
    transport: CudaIpcPublisher
    message_only = True
    plain_release = True

    def __init__(self, transport: CudaIpcPublisher) -> None:
        self.transport = transport
        self._done: dict[int, Any] = {}  # slot -> the subscriber's done event, opened here
        self._recorded: set[int] = set()

    def slot_extra(self, slot: Any) -> bytes | None:
        entry = self.transport._slot(slot)
        return _IPC_SLOT.pack(entry.handle, entry.event_handle, entry.size)

    def deliver(self, slot: Any, cuda_stream: int | None) -> None:
        pass  # the FRAME message is the hand-over; the slot's event was recorded in on_publish

    def released(self, slot: Any, release: protocol.Release) -> bool:
        if release.extra:
            if len(release.extra) != cuda_ipc.HANDLE_SIZE:
                raise PeerError(f"a done-event handle is {cuda_ipc.HANDLE_SIZE} bytes, got {len(release.extra)}")
            self.transport.device.make_current()
            try:
                event = cuda_ipc.open_event_handle(release.extra)
            except EglCudaError as exc:
                raise PeerError(f"the subscriber's done event could not be opened: {exc}") from None
            old = self._done.pop(slot.index, None)
            if old is not None:
                cuda_ipc.event_destroy(old)
            self._done[slot.index] = event
        if release.flags & protocol.RELEASE_RECORDED:
            if slot.index not in self._done:
                raise PeerError("a release says its done event was recorded, but the event was never sent")
            self._recorded.add(slot.index)
        return True

    def reading_done(self, slot: Any) -> bool:
        if slot.index not in self._recorded:
            return True
        if not _wire.ipc_event_done(self.transport.device.context, self._done[slot.index].address):
            return False
        self._recorded.discard(slot.index)
        return True

    def close(self) -> None:
        done, self._done = self._done, {}
        self._recorded.clear()
        if done:
            self.transport.device.make_current()
        for event in done.values():
            cuda_ipc.event_destroy(event)


# ==== cuda-ipc: the subscriber's side ==============================================================

class _Imports:
    """Memory handles this process has mapped, shared by its subscribers: the driver maps a
    handle once per device and process, so two subscribers of one topic in one process share the
    mapping (reference counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: dict[tuple[bytes, int], list[int]] = {}  # (handle, ordinal) -> [count, base]

    def open(self, handle: bytes, device: "CudaDevice") -> int:
        key = (handle, device.ordinal)
        with self._lock:
            entry = self._mapped.get(key)
            if entry is None:
                device.make_current()
                entry = self._mapped[key] = [0, cuda_ipc.open_mem_handle(handle)]
            entry[0] += 1
            return entry[1]

    def close(self, handle: bytes, device: "CudaDevice") -> None:
        key = (handle, device.ordinal)
        with self._lock:
            entry = self._mapped.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] <= 0:
                del self._mapped[key]
                device.make_current()
                cuda_ipc.close_mem_handle(entry[1])


_imports = _Imports()


class CudaIpcSubscriber(SubscriberTransport):
    name = CUDA_IPC

    def __init__(self, backend: "CudaSubscriberBackend", welcome: protocol.Welcome) -> None:
        if len(welcome.extra) != 16:
            raise protocol.ProtocolError("a cuda-ipc WELCOME carries the publisher's 16-byte GPU UUID")
        self.geometry = Geometry.from_welcome(welcome)
        if self.geometry.layout is not Layout.PITCH:
            raise protocol.ProtocolError("a cuda-ipc topic must be pitch-linear")
        self._spec = _ViewSpec(self.geometry)
        self.backend = backend
        if backend.device is None:  # (the backend offers cuda-ipc only with a device)
            raise protocol.ProtocolError("cuda-ipc offered to a subscriber without a CUDA device")
        self.device: CudaDevice = backend.device
        self.stream = backend.cuda_stream
        self._context: int = self.device.context
        # The bytes a slot's allocation must hold: up to the end of the last plane.
        self._slot_bytes = self.geometry.plane_offsets[-1] + self._spec.planes[-1].nbytes
        self._slots: dict[int, tuple[bytes, int, Any]] = {}  # slot -> (memory handle, base, the publisher's event)
        self._done: dict[int, Any] = {}
        self._closed = False

    def on_slot(self, slot: protocol.Slot) -> None:
        if len(slot.extra) != _IPC_SLOT.size:
            raise protocol.ProtocolError(f"a cuda-ipc SLOT carries {_IPC_SLOT.size} bytes, got {len(slot.extra)}")
        handle, event_handle, size = _IPC_SLOT.unpack(slot.extra)
        if size < self._slot_bytes:
            raise protocol.ProtocolError(f"slot {slot.slot} is {size} bytes, its frame needs {self._slot_bytes}")
        if slot.slot in self._slots:
            raise protocol.ProtocolError(f"slot {slot.slot} described twice")
        base = _imports.open(handle, self.device)
        try:
            self.device.make_current()
            event = cuda_ipc.open_event_handle(event_handle)
        except BaseException:
            _imports.close(handle, self.device)
            raise
        self._slots[slot.slot] = (handle, base, event)

    def take(self, frame: protocol.Frame, deadline: float,
             stop: Callable[[], bool] | None = None) -> tuple[Any, int | None]:
        entry = self._slots.get(frame.slot)
        if entry is None:
            raise protocol.ProtocolError(f"frame {frame.seq} is in slot {frame.slot}, which was never described")
        # When the frame's writing has finished, the stream is left idle: then the release
        # needs no done event either (see _wire.ipc_release).
        _wire.ipc_order_after(self._context, self.stream or 0, entry[2].address,
                              "ordering the subscriber's stream after the frame's event")
        return SlotView(self._spec, entry[1], self.device, self.stream, frame.slot), None

    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        obj._released = True
        if self._closed:
            return 0, b""
        own = self.stream or 0
        stream = cuda_stream if cuda_stream is not None else own
        readers = obj._handed_to
        if readers is not None or stream != own:
            # Every stream the frame was handed to, and the subscriber's own, join the stream the
            # done event goes on: the query below then sees their work too (docs/ordering.md).
            obj._handed_to = None
            self.device.make_current()
            cuda.join_streams(stream, (own, *(readers or ())), "ordering a release after the streams that read the frame")
        done = self._done.get(frame.slot)
        # When every read of the slot queued on the stream has finished, the publisher may write
        # it without waiting: no "done" event is recorded (or waited on and queried there).
        state = _wire.ipc_release(self._context, stream, 0 if done is None else done.address)
        if state == 0:
            return protocol.RELEASE_TAKEN, b""
        extra = b""
        if state == 2:  # the slot's first busy release: its event is made and sent once
            self.device.make_current()
            done = cuda_ipc.event_create_interprocess()
            try:
                extra = cuda_ipc.event_handle(done)
                state = _wire.ipc_release(self._context, stream, done.address)
            except BaseException:
                cuda_ipc.event_destroy(done)  # never sent: a later release makes another
                raise
            self._done[frame.slot] = done
            if state == 0:
                return protocol.RELEASE_TAKEN, extra  # finished meanwhile: the event goes along unrecorded
        return protocol.RELEASE_RECORDED | protocol.RELEASE_TAKEN, extra

    def finish_reading(self, timeout: float) -> bool:
        self.device.make_current()
        deadline = time.monotonic() + timeout
        while not cuda_ipc.stream_done(self.stream or 0):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        slots, self._slots = self._slots, {}
        done, self._done = self._done, {}
        if not slots and not done:
            return
        # Work queued on the slots (the user's kernels) must end before they are unmapped. The
        # wait is bounded: a stream waiting on the event of a publisher killed before its record
        # ran might never finish, and a subscriber must not hang on it; the mappings are then
        # left in place (the driver drops them at exit).
        if not self.finish_reading(UNMAP_WAIT_S):
            log.warning("topic subscriber: its CUDA stream is still busy after %.1f s; leaving %d pool "
                        "slot(s) mapped", UNMAP_WAIT_S, len(slots))
            slots = {}
        for handle, _base, event in slots.values():
            cuda_ipc.event_destroy(event)
            _imports.close(handle, self.device)
        for event in done.values():
            cuda_ipc.event_destroy(event)


# ==== eglstream: the publisher's side ==============================================================

class EglStreamPublisher(PublisherTransport):
    name = EGLSTREAM
    # The stream holds the newest frame presented to it until a newer one replaces it (the
    # consumer may acquire it again): that pool frame comes back only after the next present.
    keeps_frames = 1

    def __init__(self, backend: "CudaPublisherBackend") -> None:
        self.backend = backend
        self.device = backend.device
        self._display: Display | None = None
        self._unavailable: str | None = None
        self._lock = threading.Lock()

    def _open_display(self) -> Display | None:
        with self._lock:
            if self._display is None and self._unavailable is None:

                try:
                    display = Display.for_cuda_device(self.device.ordinal)
                    display.require("EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
                except EglCudaError as exc:
                    self._unavailable = f"no EGLStreams on the publisher's GPU: {exc}"
                else:
                    self._display = display
            return self._display

    def refusal(self, hello: protocol.Hello, peer_pid: int) -> str | None:
        self._open_display()
        return self._unavailable

    def attach(self, hello: protocol.Hello, attach: protocol.Attach, fds: list[int], peer_pid: int) -> PublisherLink:

        want = 0 if hello.qos is protocol.Qos.LATEST else hello.queue
        geometry = self.backend.geometry_spec
        if geometry is None:  # set with the pool, before the publisher serves anyone
            raise UsageError("the publisher's pool is not made yet: no frame geometry to connect a producer with")
        if attach.extra.startswith(_LOCAL):
            # A subscriber in this process: its Stream object itself, found by the token it sent.
            stream = _local_streams.get(attach.extra[len(_LOCAL):]) if peer_pid == os.getpid() else None
            if stream is None or fds:
                raise PeerError("a local eglstream subscriber attaches with the token of a stream of this process")
            if stream.fifo_length != want:
                raise PeerError(f"the subscriber's stream has FIFO length {stream.fifo_length}, its qos needs {want}")
            producer = stream.connect_cuda_producer(geometry.width, geometry.height, device=self.device,
                                                    format=geometry.format, layout=geometry.layout)
            return EglStreamLink(self, None, producer, mailbox=want == 0)
        if len(fds) != 1 or attach.extra:
            raise PeerError(f"an eglstream subscriber attaches with one stream descriptor, got {len(fds)}")
        display = self._open_display()
        if display is None:
            raise PeerError(self._unavailable or "no display")
        stream = Stream.from_fd(display, fds[0])
        try:
            if stream.fifo_length != want:
                raise PeerError(f"the subscriber's stream has FIFO length {stream.fifo_length}, its qos needs {want}")
            producer = stream.connect_cuda_producer(geometry.width, geometry.height, device=self.device,
                                                    format=geometry.format, layout=geometry.layout)
        except BaseException:
            stream.close()
            raise
        return EglStreamLink(self, stream, producer, mailbox=want == 0)

    def close(self) -> None:
        with self._lock:
            display, self._display = self._display, None
        if display is not None:
            display.close()


class EglStreamLink(PublisherLink):
    transport: EglStreamPublisher
    returns_later = True

    # How often a mailbox link asks the driver blindly for frames its subscriber passed over
    # without releasing anything (a stalled 'latest' subscriber): each such try may wait ~1 ms.
    BLIND_RETURN_S = 0.01

    def __init__(self, transport: EglStreamPublisher, stream: Stream | None, producer: CudaProducer,
                 mailbox: bool = False) -> None:
        self.transport = transport
        self.stream = stream  # the stream opened from the subscriber's descriptor (None: a local subscriber's own)
        self.producer = producer
        self.mailbox = mailbox
        # The frames in flight (sequence number, frame), in present order, and how many of the
        # oldest the subscriber is done with (released, or skipped: it released a later one).
        self.in_flight: collections.deque[tuple[int, Any]] = collections.deque()
        self.done = 0
        self.blind_at = 0.0

    def number(self) -> int:
        # The consumer's frame counter of the n-th present on a new stream is n (measured on driver
        # 580, tests/gpu/test_crossprocess.py); the subscriber checks each frame against it.
        return self.producer.frames_presented + 1

    def deliver(self, slot: Any, cuda_stream: int | None) -> None:
        self.producer.present(slot.frame, cuda_stream)
        self.in_flight.append((slot.seq, slot.frame))

    def released(self, slot: Any, release: protocol.Release) -> bool:
        if release.extra or release.flags & protocol.RELEASE_RECORDED:
            raise PeerError("an eglstream release carries no transport data")
        # Everything presented up to this frame is done with: released, or passed over (mailbox).
        done = 0
        for seq, _ in self.in_flight:
            if seq > release.seq:
                break
            done += 1
        self.done = max(self.done, done)
        return False  # the frame comes back through return_frame (reclaim)

    def reclaim(self) -> list[Any]:
        """Take back the frames the driver can hand back now. The stream keeps its newest frame
        (reuse), and a return with nothing to give waits about a millisecond inside the driver:
        so only the frames known to be done with, and not the newest, are asked for."""
        back = []
        while self.done > 0 and len(self.in_flight) > 1:
            frame = self.producer.return_frame(0)
            if frame is None:
                break
            self._forget(frame)
            back.append(frame)
        # A 'latest' subscriber that holds one frame and is sent newer ones passes them over
        # without a word: the driver can give those back; ask now and then.
        now = time.monotonic()
        if self.mailbox and len(self.in_flight) > 2 and now - self.blind_at > self.BLIND_RETURN_S:
            self.blind_at = now
            frame = self.producer.return_frame(0)
            if frame is not None:
                self._forget(frame)
                back.append(frame)
        return back

    def _forget(self, frame: Any) -> None:
        for index, (_, held) in enumerate(self.in_flight):
            if held is frame:
                del self.in_flight[index]
                if index < self.done:
                    self.done -= 1
                return

    def close(self) -> None:
        try:
            self.producer.close()
        finally:
            if self.stream is not None:
                self.stream.close()


# ==== eglstream: the subscriber's side =============================================================

class EglStreamSubscriber(SubscriberTransport):
    name = EGLSTREAM
    exclusive = True

    def __init__(self, backend: "CudaSubscriberBackend", welcome: protocol.Welcome, qos: protocol.Qos,
                 queue: int) -> None:
        self.backend = backend
        self.qos = qos
        self.fifo_length = 0 if qos is protocol.Qos.LATEST else queue
        self.local = welcome.publisher_pid == os.getpid()
        self.stream: Stream | None = None
        self.consumer: CudaConsumer | GLTextureConsumer | None = None

    def attach(self) -> tuple[bytes, list[int]]:
        display = self.backend.display()
        # A publisher in this process connects to this very stream object: no descriptor (measured
        # on driver 580: a producer connecting in-process to a stream that exported its descriptor
        # fails with CUDA_ERROR_UNKNOWN).
        stream = display.create_stream(fifo_length=self.fifo_length, cross_process=not self.local)
        try:
            if self.backend.gl_context is not None:
                self.consumer = stream.connect_gl_consumer(self.backend.gl_context)
            else:
                self.consumer = stream.connect_cuda_consumer(self.backend.device, cuda_stream=self.backend.cuda_stream)
            if self.local:
                # The publisher is in this process: it connects to this very Stream object (one
                # stream handle, the driver's in-process path), found by a token.
                token = os.urandom(16)
                _local_streams[token] = stream
                self.stream = stream
                return _LOCAL + token, []
            fd = stream.export_fd()
        except BaseException:
            stream.close()
            raise
        self.stream = stream
        return b"", [fd]

    def take(self, frame: protocol.Frame, deadline: float,
             stop: Callable[[], bool] | None = None) -> tuple[Any, int | None]:
        consumer = self.consumer
        if consumer is None:
            raise ClosedError("the subscriber's EGLStream consumer is not connected (attach() not done, or closed)")
        while True:
            left_us = int((deadline - time.monotonic()) * 1e6)
            if left_us <= 0:
                raise Timeout(f"frame {frame.seq} was announced but did not arrive on the EGLStream in time")
            try:
                # In steps of at most 200 ms: a GL consumer sets the stream's timeout attribute
                # whenever the value changes, so a steady value saves an EGL call per frame.
                got = consumer.acquire(timeout_us=min(left_us, ACQUIRE_STEP_US))
            except Timeout:
                if stop is not None and stop():
                    raise ClosedError(f"stopped waiting for frame {frame.seq}: closed by another thread") from None
                continue
            number = got.number
            if number is None or number >= frame.number:  # (no frame numbers: it cannot be told apart)
                return got, number
            # An older frame handed back again (a mailbox keeps its last frame): wait for the new
            # one. Such an acquire returns at once, not with Timeout: stop() is asked here too.
            got.release()
            if stop is not None and stop():
                raise ClosedError(f"stopped waiting for frame {frame.seq}: closed by another thread")

    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        if not obj.released:
            if cuda_stream is not None and hasattr(obj, "_note_users"):  # (a GL frame is read by GL)
                obj._note_users((cuda_stream,))  # the consumer's release waits for it too
            obj.release()
        return protocol.RELEASE_TAKEN, b""

    def close(self) -> None:
        stream, self.stream = self.stream, None
        self.consumer = None
        if stream is not None:
            stream.close()


# ==== the real backends ============================================================================

class CudaPublisherBackend(PublisherBackend):
    """A publisher on a CUDA device: pool frames from :meth:`eglcuda.Frame.allocate`, the
    ``cuda-ipc`` and ``eglstream`` transports."""

    def __init__(self, device: "int | CudaDevice") -> None:
        self.device = get_device(device)
        self.identity = DeviceIdentity.of(self.device)
        self.geometry_spec: Geometry | None = None
        self._uuids: dict[bytes, int] | None = None
        self._transports = [CudaIpcPublisher(self), EglStreamPublisher(self)]

    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:

        return Frame.allocate(width, height, format, layout, self.device)

    def geometry(self, frame: Any) -> Geometry:
        if frame.layout is Layout.PITCH:
            base = frame.planes[0].pointer
            offsets = tuple(plane.pointer - base for plane in frame.planes)
        else:
            offsets = tuple(0 for _ in frame.planes)
        self.geometry_spec = Geometry(frame.width, frame.height, frame.format, frame.layout, frame.pitch, offsets)
        return self.geometry_spec

    def order_writes(self, frame: Any, stream: int | None) -> None:
        writers = frame._handed_to
        if writers is not None:
            frame._handed_to = None
            self.device.make_current()
            cuda.join_streams(stream or 0, writers, "ordering a publish after the streams that wrote the frame")

    def free(self, frame: Any) -> None:
        frame.close()

    def transports(self) -> Sequence[PublisherTransport]:
        return self._transports

    def ordinal_of(self, uuid: bytes) -> int | None:
        """This process's CUDA ordinal of the GPU with ``uuid`` (None: not visible here)."""

        if self._uuids is None:
            found = {}
            for ordinal in range(cuda.device_count()):
                found[cuda.instance_uuid(cuda.device_get(ordinal))] = ordinal
            self._uuids = found
        return self._uuids.get(uuid)

    def can_access_peer(self, ordinal: int, peer: int) -> bool:
        return cuda_ipc.can_access_peer(cuda.device_get(ordinal), cuda.device_get(peer))

    def close(self) -> None:
        for transport in self._transports:
            transport.close()


class CudaSubscriberBackend(SubscriberBackend):
    """A subscriber on a CUDA device (or a GL subscriber, with ``gl_context``)."""

    def __init__(self, device: "int | CudaDevice", gl_context: "GLContext | None" = None,
                 cuda_stream: Any = None) -> None:

        self.gl_context = gl_context
        self._display: Display | None = None
        self.device: CudaDevice | None
        if gl_context is not None:

            if not isinstance(gl_context, GLContext):
                raise UsageError(f"gl_context must be an eglcuda.GLContext, got {type(gl_context).__name__}")
            ordinal = gl_context.display.cuda_ordinal
            self.consumer = protocol.ConsumerKind.GL
            if ordinal is None:
                self.device = None
                self.identity = DeviceIdentity(-1)
                self.cuda_stream = None
                self._own_stream = False
                return
            device = ordinal
        else:
            self.consumer = protocol.ConsumerKind.CUDA
        self.device = get_device(device)
        self.identity = DeviceIdentity.of(self.device)
        self.device.make_current()
        self._own_stream = cuda_stream is None and gl_context is None
        if self._own_stream:
            self.cuda_stream = cuda_egl.stream_create()
        else:
            self.cuda_stream = None if cuda_stream is None else stream_handle(cuda_stream)

    def wishes(self, requested: str) -> tuple[str, ...]:
        if requested == "auto":
            if self.consumer is protocol.ConsumerKind.GL or self.identity.integrated:
                return (EGLSTREAM,)
            return (CUDA_IPC, EGLSTREAM)
        if requested == CUDA_IPC and self.consumer is protocol.ConsumerKind.GL:
            raise UsageError("a GL subscriber receives frames through an EGLStream: transport='cuda-ipc' is not "
                             "possible with gl_context")
        return (requested,)

    def display(self) -> Display:
        if self.gl_context is not None:
            return self.gl_context.display
        if self._display is None:
            if self.device is None:  # (only a GL subscriber is without a device)
                raise UsageError("a subscriber without a CUDA device has no display of its own")
            self._display = Display.for_cuda_device(self.device.ordinal)
        return self._display

    def transport(self, name: str, welcome: protocol.Welcome, qos: protocol.Qos, queue: int) -> SubscriberTransport:
        if name == CUDA_IPC:
            if self.device is None:
                raise protocol.ProtocolError("cuda-ipc offered to a subscriber without a CUDA device")
            return CudaIpcSubscriber(self, welcome)
        if name == EGLSTREAM:
            return EglStreamSubscriber(self, welcome, qos, queue)
        raise protocol.ProtocolError(f"the publisher chose transport {name!r}, which this subscriber did not ask for")

    def close(self) -> None:

        if self._own_stream and self.cuda_stream and self.device is not None:  # (an own stream has a device)
            self.device.make_current()
            try:
                cuda_egl.stream_destroy(self.cuda_stream)
            except EglCudaError:  # pragma: no cover - teardown goes on
                pass
            self.cuda_stream = None
        display, self._display = self._display, None
        if display is not None:
            display.close()
