"""A test double for the topic transports: the "null" transport moves no GPU memory.

The publisher's pool lives in one shared-memory file (``memfd``) that subscribers map read-only
(through ``/proc/<pid>/fd/<n>``): a test writes bytes into a pool frame before publishing and a
subscriber compares what it reads with what it expected, so a slot written again while a
subscriber still holds it shows up as wrong bytes, in this process or another one. Everything
else (sockets, handshakes, QoS, drops, pool accounting) is the real topic code.

    pub = eglcuda.Publisher("t", 64, 32, "Y", path=..., _backend=NullPublisherBackend())
    sub = eglcuda.Subscriber("t", path=..., _backend=NullSubscriberBackend())
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import weakref
from typing import Any, Callable, Sequence

from eglcuda.frames.formats import ColorFormat, Layout, default_pitch, plane_geometry
from eglcuda.errors import ClosedError, Timeout
from eglcuda.topics import protocol
from eglcuda.topics.transports import (DeviceIdentity, Geometry, PublisherBackend, PublisherLink, PublisherTransport,
                                       SubscriberBackend, SubscriberTransport)

NULL = "null"
SLOT_BYTES = 256
_WELCOME = struct.Struct("<I")  # slot size; the memfd path follows


def pattern(key: bytes, size: int = SLOT_BYTES) -> bytes:
    """The bytes a frame with payload ``key`` holds."""
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.blake2b(key + counter.to_bytes(4, "little"), digest_size=64).digest()
        counter += 1
    return out[:size]


class NullFrame:
    """A pool frame: ``data`` is its writable slot of shared memory."""

    def __init__(self, index: int, data: memoryview) -> None:
        self.index = index
        self.data = data
        self.freed = False


class NullView:
    """What a subscriber reads: ``data`` is a read-only copy-free view of the slot."""

    def __init__(self, slot: int, data: memoryview) -> None:
        self.slot = slot
        self._data = data
        self._released = False

    @property
    def data(self) -> bytes:
        if self._released:
            raise RuntimeError("read after release")
        return bytes(self._data)


class NullLink(PublisherLink):
    def __init__(self, transport: "NullPublisherTransport") -> None:
        self.transport = transport
        self.delivered = 0
        self.closed = False

    def slot_extra(self, slot: Any) -> bytes | None:
        return struct.pack("<H", slot.index)

    def deliver(self, slot: Any, cuda_stream: int | None) -> None:
        if self.transport.fail_deliver:
            from eglcuda.errors import EglCudaError

            raise EglCudaError("null transport told to fail")
        self.delivered += 1

    def close(self) -> None:
        self.closed = True


class NullPublisherTransport(PublisherTransport):
    def __init__(self, backend: "NullPublisherBackend", name: str = NULL) -> None:
        self.name = name
        self.backend = backend
        self.refuse: str | None = None
        self.fail_deliver = False
        self.published = 0
        self.publish_delay = 0.0  # seconds each publish's hand-out takes
        self.links: list[NullLink] = []

    def refusal(self, hello: protocol.Hello, peer_pid: int) -> str | None:
        return self.refuse

    def welcome_extra(self, hello: protocol.Hello) -> bytes:
        return _WELCOME.pack(SLOT_BYTES) + self.backend.memfd_path.encode()

    def attach(self, hello: protocol.Hello, attach: protocol.Attach, fds: list[int], peer_pid: int) -> PublisherLink:
        if fds or attach.extra != b"null-attach":
            from eglcuda.errors import PeerError

            raise PeerError("a null subscriber attaches with b'null-attach' and no descriptors")
        link = NullLink(self)
        link.message_only = self.backend.message_only  # (deliver() is then not called, as for CUDA IPC)
        self.links.append(link)
        return link

    def on_publish(self, slot: Any, cuda_stream: int | None) -> None:
        if self.publish_delay:
            time.sleep(self.publish_delay)
            if self.backend.closed:
                raise AssertionError("the publisher's backend was closed while a publish was under way")
        self.published += 1


class NullPublisherBackend(PublisherBackend):
    def __init__(self, max_pool: int = protocol.MAX_POOL, names: Sequence[str] = (NULL,),
                 message_only: bool = False) -> None:
        self.message_only = message_only  # links that hand frames over by the FRAME message alone
        self.identity = DeviceIdentity(0, b"N" * 16, False)
        self.fd = os.memfd_create("eglcuda-null-pool", os.MFD_CLOEXEC)
        self._fd_closer = weakref.finalize(self, os.close, self.fd)
        os.ftruncate(self.fd, max_pool * SLOT_BYTES)
        self.memory = mmap.mmap(self.fd, max_pool * SLOT_BYTES)
        self.memfd_path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.allocated = 0
        self.frames: list[NullFrame] = []
        self._transports = [NullPublisherTransport(self, name) for name in names]
        self.closed = False

    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:
        index = self.allocated
        self.allocated += 1
        frame = NullFrame(index, memoryview(self.memory)[index * SLOT_BYTES:(index + 1) * SLOT_BYTES])
        self.frames.append(frame)
        return frame

    def geometry(self, frame: Any) -> Geometry:
        width, height, fmt = 64, 32, ColorFormat.Y
        pitch = default_pitch(fmt, width)
        planes = plane_geometry(fmt, width, height, pitch)
        offsets, at = [], 0
        for g in planes:
            offsets.append(at)
            at += g.pitch * g.height
        return Geometry(width, height, fmt, Layout.PITCH, pitch, tuple(offsets))

    def free(self, frame: Any) -> None:
        frame.data.release()
        frame.freed = True

    def transports(self) -> Sequence[PublisherTransport]:
        return self._transports

    def stream_handle(self, cuda_stream: Any) -> int | None:
        return cuda_stream

    def close(self) -> None:
        self.closed = True
        try:
            self.memory.close()
        except BufferError:  # a view still exported (a test kept one): let the GC unmap it
            pass
        self._fd_closer()


class NullSubscriberTransport(SubscriberTransport):
    def __init__(self, welcome: protocol.Welcome, name: str, exclusive: bool = False) -> None:
        self.name = name
        self.exclusive = exclusive
        (size,) = _WELCOME.unpack_from(welcome.extra)
        path = welcome.extra[_WELCOME.size:].decode()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.memory = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.size = size
        self.slots: set[int] = set()
        self.taken = 0
        self.releases: list[int] = []  # the seq of every release, in order
        self.stalled = False  # True: announced frames do not arrive (take waits for stop or the deadline)
        self.release_delay = 0.0  # seconds each release takes
        self.fail_with: BaseException | None = None  # the next take raises it (a transport failing)
        self.closed = False

    def attach(self) -> tuple[bytes, list[int]]:
        return b"null-attach", []

    def on_slot(self, slot: protocol.Slot, fds: Sequence[int] = ()) -> None:
        if slot.extra != struct.pack("<H", slot.slot) or slot.slot in self.slots:
            raise protocol.ProtocolError("bad null SLOT")
        self.slots.add(slot.slot)

    def take(self, frame: protocol.Frame, deadline: float,
             stop: Callable[[], bool] | None = None) -> tuple[Any, int | None]:
        if frame.slot not in self.slots:
            raise protocol.ProtocolError(f"slot {frame.slot} never described")
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        while self.stalled:  # like an EGLStream frame announced but not arrived: wait in steps
            if stop is not None and stop():
                raise ClosedError("stopped waiting for a frame: closed")
            if time.monotonic() >= deadline:
                raise Timeout("the announced frame did not arrive")
            time.sleep(0.01)
        self.taken += 1
        view = memoryview(self.memory)[frame.slot * self.size:(frame.slot + 1) * self.size]
        return NullView(frame.slot, view), None

    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        if self.closed:
            raise AssertionError("a release through a closed transport")
        if self.release_delay:
            time.sleep(self.release_delay)  # (a CUDA IPC release's driver calls take this long)
            if self.closed:
                raise AssertionError("the transport was closed while a release was under way")
        self.releases.append(frame.seq)
        obj._released = True
        obj._data.release()
        return protocol.RELEASE_TAKEN, b""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.memory.close()
            except BufferError:
                pass


class NullSubscriberBackend(SubscriberBackend):
    def __init__(self, exclusive: bool = False) -> None:
        self.identity = DeviceIdentity(0, b"N" * 16, False)
        self.consumer = protocol.ConsumerKind.CUDA
        self.cuda_stream = None
        self.exclusive = exclusive
        self.transports: list[NullSubscriberTransport] = []

    def wishes(self, requested: str) -> tuple[str, ...]:
        return (NULL,) if requested == "auto" else (requested,)

    def transport(self, name: str, welcome: protocol.Welcome, qos: protocol.Qos, queue: int) -> SubscriberTransport:
        transport = NullSubscriberTransport(welcome, name, self.exclusive)
        self.transports.append(transport)
        return transport
