"""The ``cuda-ipc`` transport (discrete GPUs; the subscriber on the publisher's GPU or on a peer
GPU). Every pool slot is its own ``cuMemAlloc`` allocation with an interprocess event. A subscriber
opens a slot's memory and event handles once, before the slot's first frame reaches it (a SLOT
message). Per frame the publisher records the slot's event on the publish stream, after the
user's work (unless that work has finished already: :meth:`CudaIpcPublisher.on_publish`); the
subscriber's stream waits on it while it is pending (``cuStreamWaitEvent``: no host wait). When
the subscriber releases a frame while its stream, or a stream the frame was handed to, still has
work queued, it records its own interprocess "done" event for the slot (the event's handle travels
in the first RELEASE that records one for the slot), and the publisher writes the slot again only
once the done events of every subscriber that recorded one have completed (asked on the host: its
own stream never waits for another process). A release with nothing queued carries no event (an
interprocess record costs about 2.6 us). A dropped or dead subscriber's events are never waited on
again.

A legacy CUDA IPC handle is a bearer token: any process that learns its 64 bytes can open the
memory (docs/security.md). ``cuda-vmm`` passes a descriptor instead.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..._bind import cuda, cuda_ipc
from ..._resource import Resource
from ...cuda_device import CudaDevice, get_device
from ...errors import EglCudaError, PeerError, UsageError
from ...frames.formats import Layout
from .. import _wire, protocol
from .base import NO_UUID, UNMAP_WAIT_S, Geometry, PublisherLink, PublisherTransport, SubscriberTransport
from .registry import TransportSpec, register
from .views import SlotView, _ViewSpec, join_readers, unfit_for_cuda_views

if TYPE_CHECKING:
    from .backends import CudaPublisherBackend, CudaSubscriberBackend

log = logging.getLogger("eglcuda.topics")

CUDA_IPC = "cuda-ipc"
_IPC_SLOT = struct.Struct("<64s64sQ")  # memory handle, event handle, allocation size
# A cuda-ipc publisher whose stream was busy at a publish records the next frames' events without
# asking the stream first (one stream query saved per frame), this many, then asks again.
_ASK_AGAIN_AFTER = 16


def _destroy_event(ordinal: int, event: cuda_ipc.Event) -> None:
    """Finalizer of an event the publisher made or opened (Resource runs it quietly)."""
    get_device(ordinal).make_current()
    cuda_ipc.event_destroy(event)


class _OwnedEvent(Resource):
    """An event of the publisher's (a pool slot's, or a subscriber's done event opened here),
    destroyed at its transport's close or, for a publisher collected without close(), as it is
    collected (a Resource: never in a forked child, in order at exit)."""

    # At interpreter exit, with the frames, before the device (as a sync's event).
    _exit_rank = 2

    def __init__(self, device: CudaDevice, event: cuda_ipc.Event) -> None:
        self.event = event
        self._own(_destroy_event, device.ordinal, event)


class _IpcSlot:
    __slots__ = ("handle", "event", "owner", "event_handle", "size")

    def __init__(self, handle: bytes, owner: _OwnedEvent, event_handle: bytes, size: int) -> None:
        self.handle = handle
        self.event = owner.event  # (the per-frame record reads it)
        self.owner = owner
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
            # Owned at once: destroyed at close(), or as the publisher is collected without it.
            owner = _OwnedEvent(self.device, cuda_ipc.event_create_interprocess())
            try:
                event_handle = cuda_ipc.event_handle(owner.event)
            except BaseException:
                owner.close()
                raise
        except EglCudaError as exc:
            if self._slots:  # (a pool growing: the export of the frames before went through)
                raise
            self._unavailable = f"exporting the pool through CUDA IPC failed: {exc}"
            return
        self._slots[slot.index] = _IpcSlot(handle, owner, event_handle, where[1])

    def remove_slot(self, slot: Any) -> None:
        entry = self._slots.pop(slot.index, None)
        if entry is not None:
            entry.owner.close()

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
        for entry in slots.values():
            entry.owner.close()


class CudaIpcLink(PublisherLink):
    transport: CudaIpcPublisher
    message_only = True
    plain_release = True

    def __init__(self, transport: CudaIpcPublisher) -> None:
        self.transport = transport
        self._done: dict[int, _OwnedEvent] = {}  # slot -> the subscriber's done event, opened here
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
            device = self.transport.device
            device.make_current()
            try:
                event = _OwnedEvent(device, cuda_ipc.open_event_handle(release.extra))
            except EglCudaError as exc:
                raise PeerError(f"the subscriber's done event could not be opened: {exc}") from None
            old = self._done.pop(slot.index, None)
            if old is not None:
                old.close()
            self._done[slot.index] = event
        if release.flags & protocol.RELEASE_RECORDED:
            if slot.index not in self._done:
                raise PeerError("a release says its done event was recorded, but the event was never sent")
            self._recorded.add(slot.index)
        return True

    def reading_done(self, slot: Any) -> bool:
        if slot.index not in self._recorded:
            return True
        if not _wire.ipc_event_done(self.transport.device.context, self._done[slot.index].event.address):
            return False
        self._recorded.discard(slot.index)
        return True

    def close(self) -> None:
        done, self._done = self._done, {}
        self._recorded.clear()
        for event in done.values():
            event.close()


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

    def __init__(self, backend: "CudaSubscriberBackend", welcome: protocol.Welcome, qos: protocol.Qos | None = None,
                 queue: int = 1) -> None:
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

    def on_slot(self, slot: protocol.Slot, fds: Sequence[int] = ()) -> None:
        if fds:
            raise protocol.ProtocolError("a cuda-ipc SLOT carries no descriptors")
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
            # The size said is the publisher's word; the allocation the handle opened is the
            # driver's (None: it cannot say, and the word stands).
            extent = cuda.address_range(base)
            if extent is not None and extent[0] + extent[1] < base + self._slot_bytes:
                raise protocol.ProtocolError(f"slot {slot.slot} was said to be {size} bytes, its memory holds "
                                             f"{extent[0] + extent[1] - base}; its frame needs {self._slot_bytes}")
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
        return SlotView(self._spec, entry[1], self.device, self.stream, frame.slot, self.ring), None

    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        obj._released = True
        if self._closed:
            return 0, b""
        # Every stream that may read the frame joins the one the done event goes on: the query
        # below then sees their work too.
        stream = self.stream or 0
        if obj._handed_to is not None or cuda_stream is not None:  # (else join_readers has nothing to join)
            stream = join_readers(obj, stream, cuda_stream)
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
        # A frame released on a stream of the user's (release(cuda_stream=...)) is read there,
        # behind the slot's done event, not on this subscriber's stream: both are waited for.
        pending = list(self._done.values())
        while True:
            pending = [e for e in pending if not _wire.ipc_event_done(self._context, e.address)]
            if not pending and cuda_ipc.stream_done(self.stream or 0):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._slots and not self._done:
            return
        # Work queued on the slots (the user's kernels) must end before they are unmapped. The
        # wait is bounded: a stream waiting on the event of a publisher killed before its record
        # ran might never finish, and a subscriber must not hang on it; the mappings are then
        # left in place (the driver drops them at exit).
        finished = self.finish_reading(UNMAP_WAIT_S)
        slots, self._slots = self._slots, {}
        done, self._done = self._done, {}
        if not finished:
            log.warning("topic subscriber: GPU work reading its frames is still queued after %.1f s; leaving %d pool "
                        "slot(s) mapped", UNMAP_WAIT_S, len(slots))
            slots = {}
        for handle, _base, event in slots.values():
            cuda_ipc.event_destroy(event)
            _imports.close(handle, self.device)
        for event in done.values():
            cuda_ipc.event_destroy(event)


register(TransportSpec(
    CUDA_IPC, CudaIpcPublisher, CudaIpcSubscriber, rank=10, unfit=unfit_for_cuda_views, on_integrated=False,
    memory_note="the legacy CUDA IPC calls export cuMemAlloc memory only (cuIpcGetMemHandle refuses VMM memory)",
    layouts=frozenset({Layout.PITCH}),
    layout_note="CUDA-array frames cannot be shared through CUDA IPC (layout='array')"))
