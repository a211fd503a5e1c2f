"""The transport interface: what a transport does at the handshake, per frame, at release, when
a subscriber is dropped and at close, on each side of a topic (see :mod:`eglcuda.topics.transports`
for the built-in transports and how to add one).

On the publisher's side a :class:`PublisherTransport` (one per publisher) exports the pool and
accepts subscribers, each served by a :class:`PublisherLink`; on the subscriber's side a
:class:`SubscriberTransport` attaches, takes each announced frame and lets it go. Backends
(:class:`PublisherBackend`, :class:`SubscriberBackend`) are the GPU side of each end: the device,
the pool frames, the subscriber's stream, and the transports they offer. The publisher and
subscriber (publisher.py, subscriber.py) speak to transports only through these classes.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..._bind import cuda  # nothing is loaded at import: libcuda opens at first use
from ...cuda_device import CudaDevice
from ...frames.formats import ColorFormat, Layout, color_format, plane_geometry
from ...frames.interop import stream_handle
from .. import protocol

NO_UUID = bytes(16)
UNMAP_WAIT_S = 2.0  # how long a closing subscriber waits for its stream's work on mapped slots before unmapping

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
        if layout is Layout.PITCH:
            # Each plane after the one before, none overlapping it: the slot's size (the end of the
            # last plane, which SLOT messages are checked against) then covers every plane.
            end = 0
            for index, (offset, plane) in enumerate(zip(welcome.plane_offsets, planes)):
                if offset < end:
                    raise protocol.ProtocolError(f"plane {index} of a {fmt.name} frame starts at byte {offset}, inside "
                                                 f"the plane before it (which ends at byte {end})")
                end = offset + plane.nbytes
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

    def slot_fds(self, slot: Any) -> Sequence[int]:
        """Descriptors the SLOT message carries (``SCM_RIGHTS``; still the transport's: the
        kernel gives the subscriber its own copies)."""
        return ()

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

    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:
        """A pool frame in the memory this transport needs (None: any frame of the backend's
        does). At most one of a publisher's transports may need its own."""
        return None

    def add_slot(self, slot: Any) -> None:
        """A pool slot was made (on the publishing thread). An error raised here undoes the slot
        (``remove_slot`` of the transports that took it), and the pool stays as it was."""

    def remove_slot(self, slot: Any) -> None:
        """Undo :meth:`add_slot` of a slot that another transport could not take."""

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

    def not_offered(self, name: str) -> str:
        """What a subscriber asking for transport ``name``, which this publisher does not offer, is told."""
        return "not offered by this publisher"

    def stream_handle(self, cuda_stream: Any) -> int | None:
        """A raw stream from what the user passed (None stays None: the legacy default stream)."""
        if cuda_stream is None:
            return None

        return stream_handle(cuda_stream)

    def order_writes(self, frame: Any, stream: int | None) -> None:
        """Before ``frame`` is published on ``stream`` (None: the legacy default stream): make
        that stream wait for every other stream the frame was handed to while it was written
        (docs/ordering.md)."""

    def forget_writes(self, frame: Any) -> None:
        """``frame`` was discarded: wait on the host for every stream it was handed to in this
        cycle, and forget them (its next cycle starts with nothing of this one running)."""

    def close(self) -> None:
        """After every frame is freed."""


class SubscriberTransport(abc.ABC):
    """One subscriber's end of a transport."""

    name: str
    exclusive = False  # True: holds one frame at a time (an EGLStream consumer's rule)
    # The subscriber's frame ring, where there is one (set as it joins): the views it hands out
    # ask it whether the publisher dropped the subscriber, which frees their slots.
    ring: Any = None

    def attach(self) -> tuple[bytes, list[int]]:
        """Transport data and descriptors for ATTACH (the descriptors are closed by the caller
        once sent)."""
        return b"", []

    def ready(self, ready: protocol.Ready) -> None:
        """The publisher connected its side."""

    def on_slot(self, slot: protocol.Slot, fds: Sequence[int] = ()) -> None:
        """A SLOT message: a pool slot's transport data (before its first frame), and the
        descriptors it brought (the caller closes them after this call: keep a duplicate, or
        use them before returning)."""
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
    owns_stream = False  # cuda_stream is one this backend made (and destroys at its close), not the caller's

    @abc.abstractmethod
    def wishes(self, requested: str) -> tuple[str, ...]:
        """The transports to ask for, best first, given the user's ``transport=`` choice."""

    @abc.abstractmethod
    def transport(self, name: str, welcome: protocol.Welcome, qos: protocol.Qos, queue: int) -> SubscriberTransport:
        """The subscriber's end of transport ``name`` for the topic ``welcome`` describes."""

    def close(self) -> None:
        pass
