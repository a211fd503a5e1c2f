"""The ``eglstream`` transport (Jetson, GL subscribers, a subscriber in the publisher's own
process, and wherever CUDA IPC is refused): the subscriber makes an EGLStream on its own display
(mailbox for ``latest``, a FIFO of its queue length for ``every``), connects its consumer (CUDA or
GL), and sends the stream's descriptor in ATTACH; the publisher opens it on its own display,
connects a :class:`eglcuda.CudaProducer` and presents each pool frame on every such subscriber's
producer. A pool frame is free again once every producer gave it back (``return_frame``).
"""
from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from ...display import Display
from ...errors import ClosedError, EglCudaError, PeerError, Timeout, UsageError
from ...streams.stream import Stream
from .. import protocol
from .base import PublisherLink, PublisherTransport, SubscriberTransport
from .registry import TransportSpec, register

if TYPE_CHECKING:
    from ...streams.cuda import CudaConsumer, CudaProducer
    from ...streams.gl import GLTextureConsumer
    from .backends import CudaPublisherBackend, CudaSubscriberBackend

EGLSTREAM = "eglstream"
ACQUIRE_STEP_US = 200_000
# An announced frame is on its way through the driver's cross-process stream: a receive whose
# deadline has passed (receive(timeout=0), a wait set's "message") waits this long for it, so
# that "announced" means "received" without a Timeout from the hand-over's latency.
ANNOUNCED_GRACE_S = 0.05
_LOCAL = b"local:"
_local_streams: "weakref.WeakValueDictionary[bytes, Any]" = weakref.WeakValueDictionary()


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
        tried = False
        deadline = max(deadline, time.monotonic() + ANNOUNCED_GRACE_S)
        while True:
            left = (deadline - time.monotonic()) * 1e6
            left_us = ACQUIRE_STEP_US if left > ACQUIRE_STEP_US else int(left)  # (an infinite deadline too)
            if left_us <= 0 and tried:
                raise Timeout(f"frame {frame.seq} was announced but did not arrive on the EGLStream in time")
            tried = True
            try:
                # In steps of at most 200 ms: a GL consumer sets the stream's timeout attribute
                # whenever the value changes, so a steady value saves an EGL call per frame.
                got = consumer.acquire(timeout_us=max(0, min(left_us, ACQUIRE_STEP_US)))
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


# Measured on driver 580 (H200): cuEGLStreamProducerPresentFrame refuses a frame in a cuMemCreate
# allocation with CUDA_ERROR_INVALID_HANDLE: an EGLStream serves cuMemAlloc pools only.
register(TransportSpec(
    EGLSTREAM, EglStreamPublisher, EglStreamSubscriber, rank=30,
    memory_note="an EGLStream producer cannot present VMM memory (cuEGLStreamProducerPresentFrame refuses it)"))
