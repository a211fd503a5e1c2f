"""The publishing end of a topic: :class:`Publisher`.

Two threads share a publisher:

- the user's thread calls :meth:`Publisher.next_frame` and :meth:`Publisher.publish`; it owns
  the pool, the subscribers that finished their handshake, and their messages (releases and
  goodbyes). :meth:`Publisher.next_frame` reads them all without blocking (one ``epoll`` poll),
  before any slot is written again; :meth:`Publisher.publish` reads those of subscribers whose
  queue is full, and waits only when it must (a full ``every`` queue, no free pool slot);
- a service thread accepts connections, checks who they come from (``SO_PEERCRED``), answers
  status requests and runs each subscriber's handshake (HELLO, WELCOME, ATTACH, READY) with a
  deadline; a subscriber that completed it is handed to the user's thread, which adopts it at its
  next call, so a late joiner starts at the next frame.

A subscriber that dies costs the user's thread nothing but the bookkeeping of its end of stream;
one that stops reading costs at most ``every_timeout`` (``every``) or nothing (``latest``).
"""
from __future__ import annotations

import atexit
import collections
import enum
import logging
import os
import secrets
import select
import socket
import threading
import time
import weakref
from dataclasses import asdict
from typing import Any, Sequence

from ..errors import ClosedError, EglCudaError, PeerError, Timeout, UsageError
from ..frames.formats import ColorFormat, Layout, color_format, check_size, layout_of
from ..streams.share import positive_seconds
from . import _wire, naming, protocol, registry, sockets
from .info import DropRecord, SubscriberInfo, TopicInfo
from .protocol import Qos, Reason
from .transports import CUDA_IPC, CudaPublisherBackend, PublisherBackend, PublisherLink, PublisherTransport
from ..frames.interop import foreign_device_pointer

log = logging.getLogger("eglcuda.topics")

_RECV_LIMIT = 4096  # longer than any message a subscriber sends after its handshake
_READ_BATCH = 8  # messages one read takes from a subscriber's socket (its releases since the last read)
_READ_INTERVAL = 0.001  # seconds: the longest a publishing publisher leaves its subscribers' messages unread
_SETTLE_POLL = 0.001  # seconds between the questions of a publisher waiting for subscribers' GPU reading
_CLOSE_CHECK_S = 0.05  # seconds: the longest a wait in next_frame/publish goes on after close() in another thread
_READ_LIMIT = protocol.MAX_QUEUE + 2  # messages read from one subscriber per poll (the rest: next poll)
_KIND_BYE = int(protocol.Kind.BYE)
MAX_PENDING_HANDSHAKES = 32
SEND_BUFFER = 1 << 20
ACCESS_MODES = {"user": 0o600, "group": 0o660, "all": 0o666}
_MEASURE_ALPHA = 0.05  # smoothing of the measured frame rate

_open_publishers: "weakref.WeakSet[Publisher]" = weakref.WeakSet()


class SlotState(enum.Enum):
    FREE = "free"
    WRITING = "writing"  # handed out by next_frame, not published yet
    PUBLISHED = "published"  # subscribers may hold it


class _Slot:
    """One pool frame and who holds it."""

    __slots__ = ("index", "frame", "state", "holders", "waiters", "seq", "published_at")

    def __init__(self, index: int, frame: Any) -> None:
        self.index = index
        self.frame = frame
        self.state = SlotState.FREE
        self.holders: set[_Subscriber] = set()  # links whose transport still holds the memory
        # Subscribers that released it with a done event (their GPU work may still read it), and
        # when (time.monotonic()).
        self.waiters: dict[_Subscriber, float] = {}
        self.seq = -1
        self.published_at = 0.0


class _Subscriber:
    """A subscriber after its handshake, as the user's thread tracks it."""

    __slots__ = ("id", "sock", "fd", "inbox", "peer", "qos", "queue", "credit", "link", "transport", "outstanding",
                 "seen_slots", "delivered", "skipped", "noticed", "since", "alive", "leaving", "__weakref__")

    def __init__(self, ident: int, sock: socket.socket, peer: sockets.Peer, hello: protocol.Hello,
                 link: PublisherLink, transport: str) -> None:
        self.id = ident
        self.sock = sock
        self.fd = sock.fileno()
        self.inbox = _wire.Inbox(self.fd, _RECV_LIMIT, _READ_BATCH)  # its messages, read by the user's thread
        self.peer = peer
        self.qos = hello.qos
        self.queue = hello.queue
        self.credit = protocol.credit(hello.qos, hello.queue, link.message_only)  # frames it may have outstanding
        self.link = link
        self.transport = transport
        self.outstanding: dict[int, _Slot] = {}  # seq -> slot: delivered, not released
        self.seen_slots: set[int] = set()
        self.delivered = 0
        self.skipped = 0
        self.noticed = False  # a NOTICE went out since its last frame
        self.since = time.time()
        self.alive = True
        self.leaving = False  # its goodbye or end of connection was read, not handled yet

    def info(self) -> SubscriberInfo:
        return SubscriberInfo(id=self.id, pid=self.peer.pid, uid=self.peer.uid, qos=self.qos.name.lower(),
                              queue=self.queue, transport=self.transport, delivered=self.delivered,
                              skipped=self.skipped, outstanding=len(self.outstanding), since=self.since)


class _Files:
    """The lock and socket files of a publisher: released once, at close or when the publisher is
    collected without being closed."""

    def __init__(self, lock_path: str, socket_path: str) -> None:
        self.pid = os.getpid()
        self.lock_path = lock_path
        self.socket_path = socket_path
        self.lock_fd: int | None = None
        self.bound: os.stat_result | None = None
        self.wake = (-1, -1)  # the pipe that wakes the service thread

    def release(self) -> None:
        bound, self.bound = self.bound, None
        fd, self.lock_fd = self.lock_fd, None
        mine: list[int] = list(self.wake)
        self.wake = (-1, -1)
        if os.getpid() != self.pid:
            # A forked child: the files and the lock are the parent's; only the copies of the
            # descriptors are this process's to close.
            mine.append(-1 if fd is None else fd)
        else:
            sockets.remove_if_same(self.socket_path, bound)
            if fd is not None:
                naming.release_lock(self.lock_path, fd)
        for end in mine:
            if end >= 0:
                try:
                    os.close(end)
                except OSError:
                    pass


class _Handshake:
    __slots__ = ("sock", "peer", "deadline", "hello", "transport", "refusal")

    def __init__(self, sock: socket.socket, peer: sockets.Peer, deadline: float, refusal: str | None) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.hello: protocol.Hello | None = None
        self.transport: PublisherTransport | None = None
        self.refusal = refusal  # the peer may not subscribe: told so once it greets


class Publisher:
    """The publisher of topic ``name``: a pool of frames of one size, format and layout, handed
    to any number of :class:`eglcuda.Subscriber` objects in this and other processes without
    copying.

    :param name: the topic's name (letters, digits, ``_ . -``); its socket is
        ``$XDG_RUNTIME_DIR/eglcuda/<name>.topic`` (see :mod:`eglcuda.topics.naming`) or ``path``.
    :param width: with ``height``, ``format`` and ``layout``, what every frame is (any format and layout
        :meth:`eglcuda.Frame.allocate` makes; CUDA IPC needs ``layout="pitch"``).
    :param fps: the nominal frame rate subscribers are told (None: the rate measured so far).
    :param pool: pool frames made at start. The pool grows, up to ``max_pool``, when no frame is
        free: ``latest`` subscribers never slow the publisher down, and an ``every`` subscriber may
        hold its whole queue while the next frame is written (its backpressure is the queue: see
        :meth:`publish`). It also grows when every free frame is still read by a subscriber's
        GPU work (CUDA IPC), rather than wait for that work (then :meth:`next_frame` waits on the
        host). ``max_pool`` bounds the memory (a 4K ARGB frame is 33 MB).
    :param device: the CUDA device of the pool.
    :param every_timeout: seconds the publisher waits for an ``every`` subscriber that holds a
        full queue (or the pool frame the publisher needs), or for any subscriber's GPU work still
        reading a frame it released when the publisher needs that frame, before dropping it.
    :param access: who may subscribe: ``"user"`` (this uid only, the default), ``"group"`` (also
        members of this process's group) or ``"all"``. Checked on every connection with
        ``SO_PEERCRED``; the socket's mode follows. Other than ``"user"`` needs ``path`` in a
        directory those users can reach (the default directory is private).
    :param path: an explicit socket path instead of the topic directory.
    :param handshake_timeout: seconds a connecting subscriber has for its handshake.

    One thread at a time calls :meth:`next_frame` / :meth:`publish` (they take a lock).
    """

    def __init__(self, name: str, width: int, height: int, format: ColorFormat | str = "NV12",
                 layout: Layout | str = "pitch", fps: float | None = None, pool: int = 8, device: Any = 0,
                 every_timeout: float = 1.0, access: str = "user", path: str | os.PathLike[str] | None = None, *,
                 max_pool: int = protocol.MAX_POOL, handshake_timeout: float = 5.0,
                 _backend: PublisherBackend | None = None) -> None:
        self.name = naming.check_name(name)
        fmt = color_format(format)
        check_size(width, height, fmt)
        layout = layout_of(layout)
        if fps is not None and (not isinstance(fps, (int, float)) or isinstance(fps, bool) or not 0 < fps <= 1e6):
            raise UsageError(f"fps is a positive number (or None), got {fps!r}")
        for label, value, low in (("pool", pool, 1), ("max_pool", max_pool, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= protocol.MAX_POOL:
                raise UsageError(f"{label} is an int in 1..{protocol.MAX_POOL}, got {value!r}")
        if max_pool < pool:
            raise UsageError(f"max_pool ({max_pool}) is smaller than pool ({pool})")
        self.every_timeout = positive_seconds(every_timeout, "every_timeout")
        self.handshake_timeout = positive_seconds(handshake_timeout, "handshake_timeout")
        if not isinstance(access, str) or access not in ACCESS_MODES:
            raise UsageError(f"access is one of {sorted(ACCESS_MODES)}, got {access!r}")
        if access != "user" and path is None:
            raise UsageError(f"access={access!r} lets other users subscribe, but the default topic directory is "
                             "private to this user: pass path= in a directory they can reach")
        self.access = access
        self.fps = None if fps is None else float(fps)
        self.max_pool = max_pool
        self.path = naming.socket_path(self.name, path, create=path is None)
        if not os.path.isdir(os.path.dirname(self.path) or "."):
            raise UsageError(f"the directory of {self.path} does not exist (a publisher makes its socket there)")
        self.instance = secrets.randbits(64)
        self._spec = (width, height, fmt, layout)

        self._lock = threading.RLock()
        self._closed = False
        self._forked = False  # set in a child made by fork() (see _mark_forked)
        self._close_started = False  # _close_now ran (once: the exit hook and a put-off close may race)
        self._closer = 0  # the thread whose close() set _closed, while that call runs
        self._torn_down = threading.Event()  # set once everything is released (see close())
        self._files = _Files(naming.lock_path(self.path), self.path)
        weakref.finalize(self, self._files.release)
        self._listener: socket.socket | None = None
        self._epoll: select.epoll | None = None
        self._thread: threading.Thread | None = None
        self._backend: PublisherBackend | None = None
        self._pool: list[_Slot] = []
        self._free: collections.deque[_Slot] = collections.deque()
        self._writing: dict[int, _Slot] = {}
        self._by_frame: dict[int, _Slot] = {}
        self._subs: list[_Subscriber] = []
        self._inboxes: dict[int, tuple[_wire.Inbox, _Subscriber]] = {}  # fd -> what _wire.drain reads
        self._read_at = 0.0  # time.monotonic() of the last read of the subscribers' messages
        self._joined: list[_Subscriber] = []
        self._join_lock = threading.Lock()
        self._stopping = False
        self._closing = False  # close() said goodbye: a subscriber closing its end now has left
        # (thread, timeout) of a close() put off because its thread was inside a call holding
        # _lock (a signal handler): that call finishes it on its way out.
        self._deferred_close: tuple[int, float] | None = None
        self._next_id = 1
        self._seq = 0  # the next frame's sequence number: also how many were published
        self._dropped: collections.deque[DropRecord] = collections.deque(maxlen=256)
        self._drop_count = 0
        self._refused = 0
        self._measured_fps: float | None = None
        self._last_publish = 0.0
        self._started = time.monotonic()
        try:
            self._claim()
            if _backend is None:

                _backend = CudaPublisherBackend(device)
            self._backend = _backend
            self._transports: dict[str, PublisherTransport] = {t.name: t for t in _backend.transports()}
            # The transport whose subscribers _wire.hand_out serves (its links take the FRAME message alone).
            self._fast_transport = self._transports.get(CUDA_IPC)
            for _ in range(pool):
                self._grow()
            self.geometry = _backend.geometry(self._pool[0].frame)
            self._epoll = select.epoll()
            self._files.wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self._listener, self._files.bound = sockets.bind_listener(self.path, ACCESS_MODES[access])
            self._thread = threading.Thread(target=_serve, args=(weakref.ref(self), self._listener, self._files.wake[0]),
                                            name=f"eglcuda-topic-{self.name}", daemon=True)
            self._thread.start()
        except BaseException:
            self._teardown()
            raise
        _open_publishers.add(self)

    # ---- the socket path --------------------------------------------------------------------
    def _claim(self) -> None:
        """Take the topic's lock and make its socket path free (a dead publisher's is stale)."""
        deadline = time.monotonic() + 1.0
        while True:
            self._files.lock_fd = naming.take_lock(self._files.lock_path)
            if self._files.lock_fd is not None:
                break
            # Held: by a live publisher, or for a moment by a registry checking for stale sockets.
            if sockets.is_socket(self.path) and sockets.listening(self.path):
                raise UsageError(f"topic {self.name!r} already has a live publisher{_pid_at(self.path)} at {self.path}")
            if time.monotonic() > deadline:
                raise UsageError(f"topic {self.name!r} is locked by another process ({self._files.lock_path}) although "
                                 "nothing listens at its socket: a publisher is starting or stopping there")
            time.sleep(0.01)
        sockets.remove_dead_socket(self.path)  # a dead publisher's, if any

    # ---- pool -------------------------------------------------------------------------------
    def _grow(self) -> _Slot:
        width, height, fmt, layout = self._spec
        backend = self._backend
        if backend is None:  # pragma: no cover - set before the first slot is made
            raise self._closed_error()
        slot = _Slot(len(self._pool), backend.allocate(width, height, fmt, layout))
        self._pool.append(slot)
        self._by_frame[id(slot.frame)] = slot
        for transport in self._transports.values():
            transport.add_slot(slot)
        self._free.append(slot)
        return slot

    # ---- the frame path ---------------------------------------------------------------------
    def next_frame(self, timeout: float | None = None, cuda_stream: Any = None) -> Any:
        """A free pool frame to write the next frame into: no subscriber holds it, and the GPU
        work of every subscriber that read it before has finished, so it may be written at once
        on any stream. Write it, then :meth:`publish` it with the stream the writing was queued
        on. ``cuda_stream`` (None: the legacy default stream) is checked here and otherwise
        unused: the frame needs no ordering on it.

        Waits while every pool frame is held, or still read by a subscriber's GPU work after its
        release (on the host: the publisher's stream never waits for another process), up to
        ``timeout`` seconds (None: ``every_timeout`` plus one second). An ``every`` subscriber
        that keeps a frame, or any subscriber whose GPU work still reads one it released, longer
        than ``every_timeout`` meanwhile is dropped. Raises :class:`Timeout` when no frame came
        free."""
        limit = self.every_timeout + 1.0 if timeout is None else positive_seconds(timeout, "timeout")
        try:
            with self._lock:
                self._check_open()
                backend = self._backend
                if backend is None:  # pragma: no cover - set for as long as the publisher is open
                    raise self._closed_error()
                backend.stream_handle(cuda_stream)  # (a bad value fails here, before a slot is taken)
                if self._joined:
                    self._adopt()
                # The subscribers' messages are read at least every _READ_INTERVAL, and whenever no
                # settled slot is free (publish reads a full queue's): a fast publisher then takes
                # several releases from each socket with one read, where reading every frame cost a
                # read and an empty read per subscriber per frame (measured on an H100: about 1.8 us
                # each). At camera rates every frame still reads them.
                if self._subs and time.monotonic() - self._read_at >= _READ_INTERVAL:
                    self._poll(0.0)
                # A slot no subscriber's GPU work still reads first; then a new slot, while the pool
                # may grow; then the wait (_wait_for_slot), on the host. The publisher's stream never
                # waits for another process's event: without MPS such a wait ties the two processes'
                # GPU time slices together (measured on an H100: 26k frames/s to one subscriber with
                # such waits, 64-69k without), and a subscriber that dies before its queued work ran
                # could leave it waiting for good.
                slot = self._take_free()
                if slot is None:
                    if self._subs:
                        self._poll(0.0)
                    self._reclaim_all()
                    slot = self._take_free()
                if slot is None and len(self._pool) < self.max_pool:
                    try:
                        self._grow()
                    except EglCudaError as exc:
                        if not self._free:
                            raise  # nothing free at all: the pool had to grow
                        # Free slots are still read on the GPU: one is written once that reading ends.
                        log.info("topic %s: growing the pool failed (%s); waiting for a slot's readers", self.name, exc)
                    slot = self._take_free()
                if slot is None:
                    slot = self._wait_for_slot(limit)
                if self._closed:  # by a signal handler during this call: the pool goes as it returns
                    self._free.appendleft(slot)
                    raise self._closed_error()
                slot.state = SlotState.WRITING
                self._writing[id(slot.frame)] = slot
                return slot.frame
        finally:
            if self._deferred_close is not None:
                self._finish_deferred_close()

    def discard(self, frame: Any) -> None:
        """Give back a frame from :meth:`next_frame` without publishing it."""
        try:
            with self._lock:
                self._check_open()
                slot = self._writing.pop(id(frame), None)
                if slot is None or slot.frame is not frame:
                    raise UsageError("discard takes a frame from this publisher's next_frame() that was not published")
                slot.state = SlotState.PUBLISHED
                self._maybe_free(slot)
        finally:
            if self._deferred_close is not None:
                self._finish_deferred_close()

    def publish(self, frame: Any, cuda_stream: Any = None, payload: bytes = b"", timestamp_ns: int | None = None) -> int:
        """Publish ``frame`` (from :meth:`next_frame`) to every subscriber; returns its sequence
        number. ``cuda_stream`` is where the work writing it was queued (None: the legacy default
        stream): subscribers read after that work, without a host wait here (CUDA IPC) or with
        the driver's wait (EGLStream). ``payload`` (at most 16 KiB) and ``timestamp_ns`` (default:
        now, ``CLOCK_MONOTONIC``, comparable across the host's processes) travel with the frame.

        An ``every`` subscriber whose queue is full is waited for up to ``every_timeout``, then
        dropped; a ``latest`` subscriber at its credit is skipped (and told so)."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise UsageError(f"payload is bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        if len(payload) > protocol.MAX_PAYLOAD:
            raise UsageError(f"payload is at most {protocol.MAX_PAYLOAD} bytes, got {len(payload)}")
        if timestamp_ns is None:
            timestamp_ns = time.monotonic_ns()
        elif not isinstance(timestamp_ns, int) or isinstance(timestamp_ns, bool) or not 0 <= timestamp_ns < 2**64:
            raise UsageError(f"timestamp_ns is an int in 0..2**64-1, got {timestamp_ns!r}")
        try:
            with self._lock:
                self._check_open()
                slot = self._writing.pop(id(frame), None)
                if slot is None or slot.frame is not frame:
                    raise UsageError("publish takes a frame from this publisher's next_frame(), once")
                backend = self._backend
                if backend is None:  # pragma: no cover - set for as long as the publisher is open
                    raise self._closed_error()
                try:
                    stream = backend.stream_handle(cuda_stream)
                    # next_frame() read the subscribers' messages; what came since is read where it
                    # matters: for a full 'every' queue (_wait_for_room) or 'latest' one (_deliver).
                    if self._joined:
                        self._adopt()  # a late joiner starts at this frame
                    self._wait_for_room()
                except BaseException:
                    self._writing[id(frame)] = slot
                    raise
                seq = self._seq
                self._seq += 1
                slot.seq = seq
                slot.published_at = time.monotonic()
                # The slot stays WRITING while it is handed out: a subscriber dropped meanwhile
                # frees what it held, and must not free this slot before the others got it.
                try:
                    self._deliver(slot, seq, timestamp_ns, payload, stream)
                finally:
                    # (also when the delivery was cut short, by a KeyboardInterrupt say: those
                    # that got the frame hold the slot, and it is free once they let it go)
                    slot.state = SlotState.PUBLISHED
                    self._maybe_free(slot)
                self._measure(slot.published_at)
                return seq
        finally:
            if self._deferred_close is not None:
                self._finish_deferred_close()

    def publish_from(self, source: Any, cuda_stream: Any = None, payload: bytes = b"",
                     timestamp_ns: int | None = None, timeout: float | None = None) -> int:
        """Copy ``source`` into a pool frame and publish it; returns the sequence number.

        ``source``: a frame (anything with ``planes``, e.g. an :class:`eglcuda.Frame` or an
        acquired frame), one array per plane with ``__cuda_array_interface__`` (CuPy, PyTorch,
        Numba) or NumPy (host) arrays, or for formats whose planes have equal row sizes (NV12) a
        single array of all planes' rows one after the other (a decoder's ``(H*3/2, W)``
        output). Device copies are queued on ``cuda_stream``; host arrays are copied before this
        returns."""
        frame = self.next_frame(timeout, cuda_stream)
        try:
            _copy_into(frame, source, cuda_stream)
        except BaseException:
            self.discard(frame)
            raise
        return self.publish(frame, cuda_stream, payload, timestamp_ns)

    # ---- the user's thread: messages ----------------------------------------------------------
    def _poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for subscribers' messages and handle them."""
        if self._joined:
            self._adopt()
        epoll = self._epoll
        if epoll is None:  # pragma: no cover - set for as long as the publisher is open
            raise self._closed_error()
        batch = _wire.drain(epoll.fileno(), timeout, self._inboxes, _READ_LIMIT)
        self._read_at = time.monotonic()
        for sub, message in batch:
            if message.__class__ is bytes and (not message or message[0] == _KIND_BYE):
                # Its goodbye (or its end) is in this batch, read off its socket already: a
                # release before it that fails to take frames back is its leaving (_is_leaving).
                sub.leaving = True
        for sub, message in _wire.settle(batch, self._free, SlotState.PUBLISHED, SlotState.FREE):
            if sub.alive:  # (the plain releases were handled in _wire.settle, as _on_release would)
                self._handle(sub, message)

    def _adopt(self) -> None:
        epoll = self._epoll
        if epoll is None:  # pragma: no cover - set before the service thread hands anyone over
            raise self._closed_error()
        with self._join_lock:
            joined, self._joined = self._joined, []
        for sub in joined:
            epoll.register(sub.fd, select.EPOLLIN)
            self._inboxes[sub.fd] = (sub.inbox, sub)
            self._subs.append(sub)
            log.info("topic %s: subscriber %d joined (pid %d, %s, %s)", self.name, sub.id, sub.peer.pid,
                     sub.qos.name.lower(), sub.transport)

    def _read(self, sub: _Subscriber) -> None:
        """Handle what one subscriber sent, up to what is waiting now."""
        inbox = sub.inbox
        message = inbox.next()
        while message is not None and sub.alive:
            self._handle(sub, message)
            message = inbox.rest()  # the rest of what that read found (no empty read to end it)

    def _handle(self, sub: _Subscriber, message: Any) -> None:
        """One message from a subscriber, as _wire reads it (a Release, other bytes, b"": the end)."""
        kind = message.__class__
        if kind is protocol.Release:
            self._on_release(sub, message)
            return
        if kind is not bytes:  # a FRAME: a publisher's message
            self._drop(sub, Reason.PROTOCOL, "it sent Frame after its handshake")
            return
        if not message:
            self._drop(sub, Reason.TRANSPORT, "its connection closed without a goodbye (its process exited or "
                       "was killed)", notify=False, left=self._closing)
            return
        # After its handshake a subscriber sends no descriptors (the kernel drops any that come),
        # and a message longer than any valid one arrives cut, then fails to decode.
        try:
            decoded = protocol.decode(message)
        except protocol.ProtocolError as exc:
            self._drop(sub, Reason.PROTOCOL, f"it sent a malformed message: {exc}")
            return
        if isinstance(decoded, protocol.Bye):  # (every well-formed RELEASE came decoded from _wire)
            self._drop(sub, Reason.CLOSING, f"it left ({decoded.reason})", notify=False, left=True)
        else:
            self._drop(sub, Reason.PROTOCOL, f"it sent {type(decoded).__name__} after its handshake")

    def _on_release(self, sub: _Subscriber, release: protocol.Release) -> None:
        slot = sub.outstanding.pop(release.seq, None)
        if slot is None:
            self._drop(sub, Reason.PROTOCOL, f"it released frame {release.seq}, which it does not hold")
            return
        try:
            freed = sub.link.released(slot, release)
        except (PeerError, EglCudaError) as exc:
            self._drop(sub, Reason.PROTOCOL, str(exc))
            return
        if freed:
            slot.holders.discard(sub)
            if release.flags & protocol.RELEASE_RECORDED:
                slot.waiters[sub] = time.monotonic()
            self._maybe_free(slot)
        else:
            self._reclaim(sub)

    def _reclaim(self, sub: _Subscriber) -> None:
        try:
            frames = sub.link.reclaim()
        except EglCudaError as exc:
            if self._is_leaving(sub):
                # It said goodbye (or its connection closed) while its end was coming down: the
                # driver's refusal is its leaving, not a failure (measured: EGLStream returns
                # CUDA_ERROR_UNKNOWN to a producer whose consumer process is disconnecting).
                self._drop(sub, Reason.CLOSING, "it left", notify=False, left=True)
            else:
                self._drop(sub, Reason.TRANSPORT, f"taking frames back failed: {exc}")
            return
        for frame in frames:
            slot = self._by_frame.get(id(frame))
            if slot is not None:
                slot.holders.discard(sub)
                self._maybe_free(slot)

    def _reclaim_all(self) -> None:
        for sub in list(self._subs):
            if sub.alive and any(sub in slot.holders for slot in self._pool if slot.state is SlotState.PUBLISHED):
                self._reclaim(sub)

    def _is_leaving(self, sub: _Subscriber, within: float = 0.05) -> bool:
        """Whether a goodbye or the end of the connection is (or within ``within`` seconds comes)
        next on the subscriber's socket, or was read with its last messages. Reads nothing: the
        message stays for _read."""
        if sub.leaving or any(kind in (0, _KIND_BYE) for kind in sub.inbox.queued_kinds()):
            return True  # (a goodbye or the end read already, waiting in its inbox's batch)
        deadline = time.monotonic() + within
        while True:
            try:
                data = sub.sock.recv(_RECV_LIMIT, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                return True
            if data is not None:
                if not data:
                    return True
                try:
                    return isinstance(protocol.decode(data), protocol.Bye)
                except protocol.ProtocolError:
                    return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def _gone_meanwhile(self, sub: _Subscriber) -> bool:
        """After its transport or its connection failed: whether the failure is the subscriber
        going away since this call read the sockets. Its waiting messages are read: releases, then a goodbye (it left) or
        the end of its connection without one (dropped: its process exited or was killed). When
        neither is there yet, either may come within 50 ms (a closing subscriber says goodbye
        before its consumer disconnects; a killed process's connection closes a moment after)."""
        self._read(sub)
        if sub.alive:
            poller = select.poll()
            poller.register(sub.fd, select.POLLIN)
            if poller.poll(50):
                self._read(sub)
        return not sub.alive

    def _maybe_free(self, slot: _Slot) -> None:
        if slot.state is SlotState.PUBLISHED and not slot.holders:
            slot.state = SlotState.FREE
            self._free.append(slot)

    def _take_free(self) -> _Slot | None:
        """The oldest free slot whose former readers' GPU work has all finished, so that writing
        it needs no wait (the others stay free, in order)."""
        free = self._free
        unsettled: list[_Slot] | None = None  # (made only when needed: this runs every frame)
        found = None
        try:
            while free:
                slot = free.popleft()
                if slot.state is not SlotState.FREE:
                    continue  # a stale entry: the slot was taken or published since
                if slot.holders:  # (not expected: a free slot nobody holds) held again: free once released
                    slot.state = SlotState.PUBLISHED
                    continue
                if slot.waiters:
                    if unsettled is None:
                        unsettled = []
                    unsettled.append(slot)  # (put back below, also when the question raises)
                    if not self._settled(slot):
                        continue
                    unsettled.pop()
                found = slot
                break
        finally:
            if unsettled:
                free.extendleft(reversed(unsettled))
        return found

    def _settled(self, slot: _Slot) -> bool:
        """Whether every reader that released ``slot`` with a done event has finished with it
        (then it may be written). Each one asked is forgotten once it has finished; a dropped one
        is not waited for, and one the question fails for is dropped (unless it was leaving)."""
        waiters = slot.waiters
        for sub in list(waiters):
            if sub.alive:
                try:
                    if not sub.link.reading_done(slot):
                        continue  # still reading
                except EglCudaError as exc:
                    if not self._gone_meanwhile(sub):
                        self._drop(sub, Reason.TRANSPORT, f"asking whether its GPU reading of a frame ended failed: {exc}")
            waiters.pop(sub, None)  # (a drop took it out already)
        return not waiters

    # ---- the user's thread: waiting -------------------------------------------------------------
    def _wait_for_room(self) -> None:
        """Wait until every 'every' subscriber has room for one more frame; drop those that do not
        release one within every_timeout."""
        full = [s for s in self._subs if s.alive and s.qos is Qos.EVERY and len(s.outstanding) >= s.credit]
        if not full:
            return
        deadline = time.monotonic() + self.every_timeout
        while full:
            if self._closed:  # close() in another thread waits for this call: end it
                raise self._closed_error()
            left = deadline - time.monotonic()
            if left <= 0:
                for sub in full:
                    self._drop(sub, Reason.QUEUE_FULL, f"its queue of {sub.queue} frame(s) stayed full for "
                               f"{self.every_timeout} s (every_timeout): it did not release a frame in time")
                return
            self._poll(min(left, _CLOSE_CHECK_S))
            full = [s for s in full if s.alive and len(s.outstanding) >= s.credit]

    def _wait_for_slot(self, limit: float) -> _Slot:
        """A free slot no subscriber's GPU work still reads, waiting up to ``limit`` seconds
        (Timeout after that). While the free slots are still read on the GPU (released with a
        done event not yet completed), the wait is on the host, asking every _SETTLE_POLL; a
        subscriber still reading one every_timeout after its release is dropped, as is an
        'every' subscriber that holds a frame that long."""
        deadline = time.monotonic() + limit
        while True:
            slot = self._take_free()
            if slot is not None:
                return slot
            if self._closed:  # close() in another thread waits for this call: end it
                raise self._closed_error()
            now = time.monotonic()
            # When each 'every' subscriber that holds frames got the oldest of them.
            oldest = [(s, min(x.published_at for x in s.outstanding.values())) for s in self._subs
                      if s.alive and s.qos is Qos.EVERY and s.outstanding]
            stale = [s for s, since in oldest if now - since >= self.every_timeout]
            for sub in stale:
                self._drop(sub, Reason.QUEUE_FULL, f"it held frames for more than {self.every_timeout} s "
                           "(every_timeout) while the publisher needed a pool frame")
            if stale:
                continue  # (the slots they held came free, and their readers were not asked yet)
            # Free slots still read on the GPU (_take_free asked each of their waiters just now: those
            # left are still reading), and the subscribers reading one every_timeout after releasing it.
            unsettled = [slot for slot in self._free if slot.state is SlotState.FREE and slot.waiters]
            slow = {sub for slot in unsettled for sub, since in slot.waiters.items()
                    if sub.alive and now - since >= self.every_timeout}
            for sub in slow:
                self._drop(sub, Reason.QUEUE_FULL, f"its GPU work still read a frame {self.every_timeout} s "
                           "(every_timeout) after it released it, while the publisher needed a pool frame")
            if slow:
                continue
            if now >= deadline:
                holders = sorted({f"{s.peer.pid} ({s.qos.name.lower()})" for slot in self._pool for s in slot.holders})
                readers = sorted({f"{s.peer.pid} ({s.qos.name.lower()})" for slot in unsettled for s in slot.waiters})
                mine = len(self._writing)
                yours = (f"; {mine} taken with next_frame() and not yet published or discarded (by this "
                         "process)" if mine else "")
                if not readers:
                    raise Timeout(f"no pool frame came free within {limit} s: all {len(self._pool)} are held (max_pool "
                                  f"{self.max_pool}) by subscriber process(es) {', '.join(holders) or 'none'}{yours}")
                raise Timeout(f"no pool frame came free within {limit} s (pool {len(self._pool)}, max_pool "
                              f"{self.max_pool}): {len(unsettled)} released but still read on the GPU by subscriber "
                              f"process(es) {', '.join(readers)}, the others held by {', '.join(holders) or 'none'}"
                              f"{yours}")
            wait = min(deadline - now, _CLOSE_CHECK_S)
            if oldest:
                wait = min(wait, min(since for _, since in oldest) + self.every_timeout - now)
            if any(s.alive and s.link.returns_later for s in self._subs):
                # EGLStream frames come back through the driver, which has no descriptor to wait on.
                wait = min(wait, 0.002)
            if unsettled:  # nor does the end of a subscriber's GPU work
                first = min(since for slot in unsettled for since in slot.waiters.values())
                wait = min(wait, _SETTLE_POLL, first + self.every_timeout - now)
            self._poll(max(wait, 0.0))
            self._reclaim_all()

    # ---- the user's thread: delivery ------------------------------------------------------------
    def _deliver(self, slot: _Slot, seq: int, timestamp_ns: int, payload: bytes, stream: int | None) -> None:
        shared = protocol.encode_frame(seq, slot.index, timestamp_ns, 0, payload)  # (links that number no frames)
        recorded: set[str] = set()
        index = slot.index
        others = self._subs
        fresh = False  # whether every subscriber's messages were read for this frame
        fast = self._fast_transport
        if fast is not None:
            # The common case compiled: a CUDA IPC subscriber that may take the frame now. The
            # rest (and any failure) comes back here.
            others, done = _wire.hand_out(self._subs, slot, seq, shared, fast, stream, Qos.LATEST)
            if others and self._worth_a_read([sub for sub in others
                                              if sub.qos is Qos.LATEST and len(sub.outstanding) >= sub.credit]):
                # 'latest' ones at their credit may have released a frame since the last read:
                # one read of every socket (and its releases handled in _wire) instead of one
                # Python read per such subscriber; then the compiled step again for them.
                self._poll(0.0)
                fresh = True
                others, again = _wire.hand_out(others, slot, seq, shared, fast, stream, Qos.LATEST, done)
                done = done or again
            if done:
                recorded.add(fast.name)
        for sub in list(others):
            if not sub.alive:
                continue
            if sub.qos is Qos.LATEST and len(sub.outstanding) >= sub.credit:
                if not fresh and self._worth_a_read([sub]):
                    self._read(sub)  # a release may have come since the last read
                if not sub.alive:
                    continue
                if len(sub.outstanding) >= sub.credit:
                    sub.skipped += 1
                    if not sub.noticed and self._send(sub, protocol.encode(protocol.Notice(seq))):
                        sub.noticed = True
                    continue
            link = sub.link
            try:
                name = link.transport.name
                if name not in recorded:
                    link.transport.on_publish(slot, stream)
                    recorded.add(name)
                if index not in sub.seen_slots:
                    extra = link.slot_extra(slot)
                    if extra is not None and not self._send(sub, protocol.encode(protocol.Slot(index, extra))):
                        sub.skipped += 1
                        continue
                    sub.seen_slots.add(index)
                if link.message_only:
                    try:
                        sub.sock.send(shared)
                    except OSError:
                        if not self._send(sub, shared):  # (retries, waits or drops as the QoS says)
                            sub.skipped += 1
                            continue
                else:
                    number = link.number()
                    data = protocol.encode_frame(seq, index, timestamp_ns, number, payload)
                    if not self._send(sub, data):
                        sub.skipped += 1
                        continue
                    link.deliver(slot, stream)
            except EglCudaError as exc:
                if not self._gone_meanwhile(sub):
                    self._drop(sub, Reason.TRANSPORT, f"delivering frame {seq} failed: {exc}")
                continue
            sub.outstanding[seq] = slot
            slot.holders.add(sub)
            sub.delivered += 1
            sub.noticed = False

    def _worth_a_read(self, at_credit: list[_Subscriber]) -> bool:
        """Whether the messages of these 'latest' subscribers at their credit are worth reading
        before a frame is handed out: when the last read is _READ_INTERVAL old, or when one of them
        keeps up (the oldest frame it holds is younger than that: its release may be on the way).
        One that holds its frames longer (a slow or stalled subscriber) is read with the others,
        at least every _READ_INTERVAL (next_frame), not once per frame: a stalled subscriber then
        costs the publisher no read a frame."""
        if not at_credit:
            return False
        now = time.monotonic()
        if now - self._read_at >= _READ_INTERVAL:
            return True
        return any(now - next(iter(sub.outstanding.values())).published_at < _READ_INTERVAL for sub in at_credit)

    def _send(self, sub: _Subscriber, data: bytes) -> bool:
        """Send one message without blocking the publisher on a subscriber that stopped reading:
        'latest' ones miss it (False); 'every' ones get every_timeout, then are dropped."""
        try:
            sub.sock.send(data)
            return True
        except BlockingIOError:
            if sub.qos is Qos.LATEST:
                return False
        except OSError as exc:
            # The connection broke: what it sent before (a goodbye?) says whether it left or died.
            if not self._gone_meanwhile(sub):
                self._drop(sub, Reason.TRANSPORT, f"its connection failed ({exc.strerror or exc})", notify=False)
            return False
        deadline = time.monotonic() + self.every_timeout
        while not self._closed:  # (close() in another thread waits for this publish: cut it short)
            if sockets.wait_writable(sub.sock, min(deadline, time.monotonic() + _CLOSE_CHECK_S)):
                try:
                    sub.sock.send(data)
                    return True
                except OSError:
                    break
            if time.monotonic() >= deadline:
                break
        else:
            return False
        self._drop(sub, Reason.QUEUE_FULL, f"its socket stayed full for {self.every_timeout} s (every_timeout)")
        return False

    def _drop(self, sub: _Subscriber, code: Reason, reason: str, notify: bool = True, left: bool = False) -> None:
        """Forget a subscriber: tell it why (``notify``), close its connection and link, free what
        it held. Its transport's events are never waited on again."""
        if not sub.alive:
            return
        sub.alive = False
        if notify:
            try:
                sub.sock.send(protocol.encode(protocol.Drop(int(code), reason)))
            except OSError:
                pass
        if self._epoll is not None:  # (always: a subscriber is adopted into it)
            try:
                self._epoll.unregister(sub.fd)
            except (OSError, ValueError):
                pass
        self._inboxes.pop(sub.fd, None)
        sub.inbox.close()  # before its descriptor is closed (and its number reused)
        sockets.close_quietly(sub.sock)
        sub.outstanding.clear()
        for slot in self._pool:
            slot.holders.discard(sub)
            slot.waiters.pop(sub, None)
        try:
            sub.link.close()
        except Exception as exc:  # noqa: BLE001 - the subscriber is gone either way
            log.warning("topic %s: closing subscriber %d's %s link failed: %s", self.name, sub.id, sub.transport, exc)
        if sub in self._subs:
            self._subs.remove(sub)
        for slot in self._pool:
            self._maybe_free(slot)
        if left:
            log.info("topic %s: subscriber %d (pid %d) left", self.name, sub.id, sub.peer.pid)
            return
        self._drop_count += 1
        self._dropped.append(DropRecord(id=sub.id, pid=sub.peer.pid, qos=sub.qos.name.lower(), transport=sub.transport,
                                        code=Reason(code).name if code in Reason._value2member_map_ else str(code),
                                        reason=reason, at=time.time()))
        if code is not Reason.CLOSING:
            log.warning("topic %s: dropped subscriber %d (pid %d, %s): %s", self.name, sub.id, sub.peer.pid,
                        sub.qos.name.lower(), reason)

    def _measure(self, now: float) -> None:
        if self._last_publish:
            interval = now - self._last_publish
            if interval > 0:
                rate = 1.0 / interval
                self._measured_fps = rate if self._measured_fps is None else (
                    self._measured_fps + _MEASURE_ALPHA * (rate - self._measured_fps))
        self._last_publish = now

    # ---- the service thread's side --------------------------------------------------------------
    def _access_refusal(self, peer: sockets.Peer) -> str | None:
        if peer.uid == os.geteuid() or self.access == "all":
            return None
        if self.access == "group":
            gid = os.getegid()
            if peer.gid == gid or gid in sockets.peer_groups(peer.pid):
                return None
            return (f"uid {peer.uid} (gid {peer.gid}) is neither this publisher's user ({os.geteuid()}) nor in its "
                    f"group {gid} (access='group')")
        return f"uid {peer.uid} is not this publisher's uid {os.geteuid()} (access='user')"

    def _welcome(self, hello: protocol.Hello, transport: PublisherTransport) -> protocol.Welcome:
        g = self.geometry
        fps = self.fps if self.fps is not None else (self._measured_fps or 0.0)
        return protocol.Welcome(publisher_pid=os.getpid(), instance=self.instance, width=g.width, height=g.height,
                                format=int(g.format), layout=0 if g.layout is Layout.PITCH else 1, pitch=g.pitch,
                                plane_offsets=g.plane_offsets, fps=min(float(fps), 1e6), pool=len(self._pool),
                                next_seq=self._seq, transport=transport.name, topic=self.name,
                                extra=transport.welcome_extra(hello))

    def _status(self) -> dict[str, Any]:
        subs = [s for s in list(self._subs) if s.alive] + list(self._joined)
        g = self.geometry
        return {
            "version": registry.STATUS_VERSION, "name": self.name, "pid": os.getpid(), "uid": os.geteuid(),
            "instance": f"{self.instance:016x}", "width": g.width, "height": g.height, "format": g.format.name,
            "layout": g.layout.value, "pitch": g.pitch, "fps": self.fps, "measured_fps": self._measured_fps,
            "pool": len(self._pool), "max_pool": self.max_pool, "published": self.published, "access": self.access,
            "transports": sorted(self._transports), "subscribers_total": len(subs), "dropped": self._drop_count,
            "subscribers": [asdict(s.info()) for s in subs[: registry.MAX_LISTED]],
            "uptime_s": time.monotonic() - self._started,
        }

    def _new_id(self) -> int:
        with self._join_lock:
            ident = self._next_id
            self._next_id += 1
            return ident

    # ---- state -----------------------------------------------------------------------------------
    @property
    def info(self) -> TopicInfo:
        g = self.geometry
        return TopicInfo(name=self.name, path=self.path, width=g.width, height=g.height, format=g.format,
                         layout=g.layout, pitch=g.pitch, fps=self.fps if self.fps is not None else self._measured_fps,
                         pool=len(self._pool), publisher_pid=os.getpid(), instance=self.instance, transport=None,
                         next_seq=self._seq)

    @property
    def subscribers(self) -> list[SubscriberInfo]:
        """The subscribers connected now (those whose handshake just finished are adopted at the
        next :meth:`next_frame` / :meth:`publish`, and listed from then on)."""
        if self._forked:
            raise self._forked_error()  # (a read here would take the parent's messages)
        try:
            with self._lock:
                if self._joined and not self._closed:
                    self._adopt()
                if self._subs and not self._closed:
                    self._poll(0.0)  # what they sent since: goodbyes, ended connections
                return [s.info() for s in self._subs if s.alive]
        finally:
            if self._deferred_close is not None:
                self._finish_deferred_close()

    @property
    def dropped(self) -> list[DropRecord]:
        """The latest (up to 256) subscribers this publisher dropped or lost, with the reasons."""
        return list(self._dropped)

    @property
    def published(self) -> int:
        """How many frames were published (the next frame's sequence number)."""
        return self._seq

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    @property
    def measured_fps(self) -> float | None:
        return self._measured_fps

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._forked:
            raise self._forked_error()

    def _forked_error(self) -> UsageError:
        return UsageError(f"the publisher of topic {self.name!r} belongs to the process that made it: in a forked "
                          "child it may only be closed (its subscribers' connections are the parent's)")

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"the publisher of topic {self.name!r} is closed")

    def close(self, timeout: float = 1.0) -> None:
        """Tell every subscriber goodbye, wait up to ``timeout`` seconds for them to let go (so no
        pool memory is freed under a subscriber still mapping it), free the pool, remove the
        socket. Safe to call twice, and from another thread: a :meth:`next_frame` or
        :meth:`publish` waiting there (for a pool frame, or for room in an ``every`` subscriber's
        queue) ends within 50 ms with :class:`eglcuda.ClosedError`, then this call goes on.
        Called on a thread that is itself inside one of those calls (from a signal handler), it
        returns at once: that call goes on (a wait in it ends with ClosedError) and the topic is
        closed as it returns. A ``close()`` from another thread meanwhile returns once the topic
        is closed (at most ``timeout`` + 1 s later): a handler should not wait for a thread that
        closes the publisher too."""
        wait = sockets.wait_seconds(timeout)
        me = threading.get_ident()
        if self._closed:
            mine = me == self._closer or self._lock._is_owned()  # type: ignore[attr-defined]
            if mine or os.getpid() != self._files.pid:
                return  # (this thread's own close, under way or put off: it cannot wait for itself)
            if self._deferred_close is None and not self._close_started:
                self._close_now(wait)  # a close interrupted before its work began: done here
            # Another thread's close is under way, or one put off by a signal handler on the
            # thread in next_frame()/publish() (its call ends within about 50 ms).
            self._torn_down.wait(wait + 1.0)
            return
        self._closed = True
        self._closer = me  # (while this call runs: a handler's close() on this thread returns at once)
        try:
            if os.getpid() != self._files.pid:
                _open_publishers.discard(self)
                self._forget_in_child()
                return
            if self._lock._is_owned():  # type: ignore[attr-defined]
                # Called on a thread that is inside next_frame(), publish() or discard() (a signal
                # handler): closing here would free the pool and the subscribers under that call.
                # It goes on (a wait in it ends with ClosedError), and closes the topic as it returns.
                self._deferred_close = (me, wait)
                return
            self._close_now(wait)
            self._torn_down.wait(wait + 1.0)  # (at once, unless another thread's close() began it first)
        finally:
            self._closer = 0

    def _finish_deferred_close(self) -> None:
        """Finish a close() this thread put off, once it holds the lock no more (a nested call
        leaves it to the outer one). Other threads leave it alone: the lock is this thread's."""
        deferred = self._deferred_close
        if deferred is None or deferred[0] != threading.get_ident():
            return
        if not self._lock._is_owned():  # type: ignore[attr-defined]
            try:
                self._close_now(deferred[1])
            finally:
                self._deferred_close = None

    def _close_now(self, wait: float) -> None:
        """close()'s work, once (see _close_started)."""
        if os.getpid() != self._files.pid:  # (the exit hook of a forked child: the topic is the parent's)
            _open_publishers.discard(self)
            self._forget_in_child()
            return
        with self._join_lock:
            if self._close_started:
                return
            self._close_started = True
        try:
            _open_publishers.discard(self)
            self._close_locked(wait)
        finally:
            self._torn_down.set()

    def _close_locked(self, wait: float) -> None:
        with self._lock:
            self._closing = True
            self._stop_service()
            if self._joined:
                self._adopt()
            deadline = time.monotonic() + wait
            waiting = []
            for sub in list(self._subs):
                try:
                    sub.sock.send(protocol.encode(protocol.Bye(int(Reason.CLOSING), "the publisher closed the topic")))
                    if sub.peer.pid != os.getpid():  # one in this process may be this very thread
                        waiting.append(sub)
                except OSError:
                    pass
            # Wait for each to close its end (it unmaps the pool first), up to the deadline.
            while waiting and time.monotonic() < deadline:
                self._poll(deadline - time.monotonic())
                waiting = [s for s in waiting if s.alive]
            for sub in list(self._subs):
                self._drop(sub, Reason.CLOSING, "the publisher closed the topic", notify=False)
            self._teardown()

    def _forget_in_child(self) -> None:
        """close() in a child made by fork(): the topic, its subscribers and its pool are the
        parent's. Close this process's copies of the descriptors; say nothing to anyone, remove no
        file, free no memory (nor call CUDA, which a forked child must not)."""
        # Closed without reading or shutting down: these connections are the parent's (a read
        # here would take its messages, a change of flags would change its sockets).
        for sock in [sub.sock for sub in self._subs] + ([self._listener] if self._listener is not None else []):
            sock.close()
        if self._epoll is not None:
            self._epoll.close()
        self._subs, self._pool, self._listener, self._epoll, self._backend = [], [], None, None, None
        self._free.clear()
        self._by_frame.clear()
        self._writing.clear()
        self._files.release()

    def _stop_service(self) -> None:
        self._stopping = True
        if self._files.wake[1] >= 0:
            try:
                os.write(self._files.wake[1], b"x")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _teardown(self) -> None:
        """Release everything in reverse order of _init (also after a failed construction)."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        sockets.remove_if_same(self.path, self._files.bound)
        self._files.bound = None
        backend = self._backend
        if backend is not None:  # (always when there is a pool: its frames come from the backend)
            for slot in self._pool:
                try:
                    backend.free(slot.frame)
                except Exception as exc:  # noqa: BLE001 - teardown goes on
                    log.warning("topic %s: freeing pool frame %d failed: %s", self.name, slot.index, exc)
        self._pool = []
        self._free.clear()
        self._by_frame.clear()
        self._writing.clear()
        if self._backend is not None:
            try:
                self._backend.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("topic %s: closing the transports failed: %s", self.name, exc)
        if self._epoll is not None:
            self._epoll.close()
        self._files.release()
        self._closed = True
        self._torn_down.set()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._subs)} subscriber(s), {self.published} published"
        return f"<Publisher {self.name!r}: {state}>"


def _pid_at(path: str) -> str:
    try:
        return f" (pid {registry.query(path, 0.5).pid})"
    except Exception:  # noqa: BLE001 - only a detail of the message
        return ""


# ---- the service thread ------------------------------------------------------------------------------

def _serve(ref: "weakref.ref[Publisher]", listener: socket.socket, wake: int) -> None:
    """Accept connections, answer status requests and run handshakes until the publisher stops.
    Holds the publisher only weakly between events."""
    poller = select.epoll()
    pending: dict[int, _Handshake] = {}
    try:
        try:
            poller.register(listener.fileno(), select.EPOLLIN)
            poller.register(wake, select.EPOLLIN)
        except OSError:
            return  # the publisher was collected (its wake pipe closed) before this thread ran
        while True:
            publisher = ref()
            if publisher is None or publisher._stopping:
                break
            # At most a second: a publisher collected without close() is noticed (its weak
            # reference dies) and the thread ends.
            timeout = 1.0
            if pending:
                timeout = min(timeout, max(0.0, min(h.deadline for h in pending.values()) - time.monotonic()))
            del publisher
            events = poller.poll(timeout)
            publisher = ref()
            if publisher is None or publisher._stopping:
                break
            for fd, _ in events:
                if fd == wake:
                    try:
                        os.read(wake, 64)
                    except OSError:
                        pass
                elif fd == listener.fileno():
                    _accept(publisher, listener, poller, pending)
                else:
                    handshake = pending.get(fd)
                    if handshake is not None:
                        _advance(publisher, poller, pending, handshake)
            now = time.monotonic()
            for handshake in [h for h in pending.values() if h.deadline <= now]:
                _end(poller, pending, handshake, Reason.ACCESS if handshake.refusal else Reason.TIMEOUT,
                     handshake.refusal or f"the handshake did not finish within {publisher.handshake_timeout} s")
            del publisher
    except Exception:  # noqa: BLE001 - the thread must not die silently
        log.exception("the topic service thread failed")
    finally:
        for handshake in list(pending.values()):
            _end(poller, pending, handshake, Reason.CLOSING, "the publisher closed the topic")
        poller.close()
        listener.close()  # also when the publisher was collected without close(); closing twice is fine


def _accept(publisher: Publisher, listener: socket.socket, poller: select.epoll,
            pending: dict[int, _Handshake]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. EMFILE: leave it for the next round
            log.warning("topic %s: accept failed: %s", publisher.name, exc)
            return
        conn.setblocking(False)
        try:
            peer = sockets.peer_of(conn)
        except PeerError:
            conn.close()
            continue
        why = publisher._access_refusal(peer)
        if why is not None:
            publisher._refused += 1
            log.warning("topic %s: turning away pid %d: %s", publisher.name, peer.pid, why)
        if len(pending) >= MAX_PENDING_HANDSHAKES:
            try:
                conn.send(protocol.encode(protocol.Refuse(int(Reason.BUSY), f"{MAX_PENDING_HANDSHAKES} connections are "
                                                          "already in their handshake")))
            except OSError:
                pass
            sockets.close_quietly(conn)
            continue
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        except OSError:
            pass
        # A peer that may not subscribe is told why after its greeting (read first: closing a
        # socket with its greeting unread would reset the connection before it reads the reason).
        deadline = time.monotonic() + (min(publisher.handshake_timeout, 1.0) if why else publisher.handshake_timeout)
        handshake = _Handshake(conn, peer, deadline, why)
        pending[conn.fileno()] = handshake
        poller.register(conn.fileno(), select.EPOLLIN)


def _stop_watching(poller: select.epoll, pending: dict[int, _Handshake], handshake: _Handshake) -> None:
    """The service thread stops polling this handshake's socket (it is ending or handed over)."""
    fd = handshake.sock.fileno()
    pending.pop(fd, None)
    try:
        poller.unregister(fd)
    except (OSError, ValueError):
        pass


def _end(poller: select.epoll, pending: dict[int, _Handshake], handshake: _Handshake, code: Reason | None,
         reason: str) -> None:
    _stop_watching(poller, pending, handshake)
    if code is not None:
        try:
            handshake.sock.send(protocol.encode(protocol.Refuse(int(code), reason)))
        except OSError:
            pass
    sockets.close_quietly(handshake.sock)


def _advance(publisher: Publisher, poller: select.epoll, pending: dict[int, _Handshake], handshake: _Handshake) -> None:
    try:
        got = sockets.receive_now(handshake.sock)
    except protocol.ProtocolError as exc:
        _end(poller, pending, handshake, Reason.PROTOCOL, str(exc))
        return
    if got is None:
        return
    data, fds = got
    try:
        if not data:
            _end(poller, pending, handshake, None, "")
            return
        try:
            message = protocol.decode(data, len(fds))
        except protocol.ProtocolError as exc:
            _end(poller, pending, handshake, Reason.PROTOCOL, f"not a valid topic message: {exc}")
            return
        if handshake.hello is None:
            _on_hello(publisher, poller, pending, handshake, message)
        else:
            _on_attach(publisher, poller, pending, handshake, message, fds)
    finally:
        sockets.close_fds(fds)


def _on_hello(publisher: Publisher, poller: select.epoll, pending: dict[int, _Handshake], handshake: _Handshake,
              message: protocol.Message) -> None:
    if handshake.refusal is not None:
        _end(poller, pending, handshake, Reason.ACCESS, handshake.refusal)
        return
    if isinstance(message, protocol.StatusRequest):
        try:
            handshake.sock.send(protocol.encode(protocol.Status(publisher._status())))
        except (OSError, ValueError):
            pass
        _end(poller, pending, handshake, None, "")
        return
    if not isinstance(message, protocol.Hello):
        _end(poller, pending, handshake, Reason.PROTOCOL, f"expected HELLO, got {type(message).__name__}")
        return
    if message.topic != publisher.name:
        _end(poller, pending, handshake, Reason.VERSION,
             f"this socket serves topic {publisher.name!r}, not {message.topic!r}")
        return
    reasons = []
    chosen = None
    for wish in message.wishes:
        transport = publisher._transports.get(wish)
        if transport is None:
            reasons.append(f"{wish}: not offered by this publisher")
            continue
        try:
            why = transport.refusal(message, handshake.peer.pid)
        except EglCudaError as exc:
            why = str(exc)
        if why is None:
            chosen = transport
            break
        reasons.append(f"{wish}: {why}")
    if chosen is None:
        _end(poller, pending, handshake, Reason.UNSUPPORTED,
             "no transport both sides can use (" + "; ".join(reasons) + ")")
        return
    try:
        handshake.sock.send(protocol.encode(publisher._welcome(message, chosen)))
    except OSError:
        _end(poller, pending, handshake, None, "")
        return
    handshake.hello = message
    handshake.transport = chosen


def _on_attach(publisher: Publisher, poller: select.epoll, pending: dict[int, _Handshake], handshake: _Handshake,
               message: protocol.Message, fds: list[int]) -> None:
    if not isinstance(message, protocol.Attach):
        _end(poller, pending, handshake, Reason.PROTOCOL, f"expected ATTACH, got {type(message).__name__}")
        return
    hello, transport = handshake.hello, handshake.transport
    if hello is None or transport is None:  # pragma: no cover - _advance comes here only after HELLO set both
        raise UsageError("a handshake reached ATTACH before its HELLO chose a transport")
    try:
        link = transport.attach(hello, message, fds, handshake.peer.pid)
    except (EglCudaError, OSError) as exc:
        _end(poller, pending, handshake, Reason.TRANSPORT, f"connecting its {transport.name} end failed: {exc}")
        return
    _stop_watching(poller, pending, handshake)
    sub = _Subscriber(publisher._new_id(), handshake.sock, handshake.peer, hello, link, transport.name)
    # READY goes out while the subscriber is handed over, under the lock the publishing thread
    # adopts with: once the subscriber reads READY the next publish includes it, and no frame can
    # reach it before READY.
    with publisher._join_lock:
        publisher._joined.append(sub)  # first: the publishing thread looks at the list without the lock
        try:
            handshake.sock.send(protocol.encode(protocol.Ready(link.ready_extra())))
        except OSError:
            publisher._joined.remove(sub)
            link.close()
            handshake.sock.close()


def _copy_into(frame: Any, source: Any, cuda_stream: Any) -> None:
    """publish_from's copy of ``source`` into pool frame ``frame``."""
    import numpy as np


    planes = frame.planes
    if hasattr(source, "planes"):
        sources = list(source.planes)
        if len(sources) != len(planes):
            raise UsageError(f"the source has {len(sources)} planes, the topic's frames {len(planes)}")
        for target, plane in zip(planes, sources):
            if (plane.width, plane.height, plane.channels) != (target.width, target.height, target.channels):
                raise UsageError(f"source plane {plane.index} is {plane.shape}, the topic's {target.shape}")
            plane.copy_to_device(target.pointer, target.pitch, cuda_stream)
        return
    arrays = list(source) if isinstance(source, (list, tuple)) else [source]
    if len(arrays) == 1 and len(planes) > 1:
        arrays = _split_stacked(arrays[0], planes)
    if len(arrays) != len(planes):
        raise UsageError(f"publish_from takes one array per plane ({len(planes)}), got {len(arrays)}")
    for target, array in zip(planes, arrays):
        if isinstance(array, np.ndarray):
            target.copy_from(array)
            continue
        pointer, shape, strides, typestr, _, _ = foreign_device_pointer(array)
        rows = target.height
        row_bytes = target.geometry.row_bytes
        if typestr not in ("|u1", "<u1") or shape[0] != rows or int(np.prod(shape[1:])) != row_bytes:
            raise UsageError(f"plane {target.index} takes uint8 data of shape {target.shape}, got {typestr} {shape}")
        pitch = strides[0] if strides else row_bytes
        target.copy_from_device(pointer, pitch, cuda_stream)


class _Rows:
    """A window of rows of a foreign CUDA array (for a stacked multi-plane array)."""

    def __init__(self, pointer: int, rows: int, row_bytes: int, pitch: int) -> None:
        self.__cuda_array_interface__ = {"shape": (rows, row_bytes), "strides": (pitch, 1), "typestr": "|u1",
                                         "data": (pointer, True), "version": 3}


def _split_stacked(array: Any, planes: Sequence[Any]) -> list[Any]:
    import numpy as np


    row_bytes = {p.geometry.row_bytes for p in planes}
    total = sum(p.height for p in planes)
    if len(row_bytes) != 1:
        raise UsageError("a single source array covers only formats whose planes have equal row sizes (NV12); "
                         "pass one array per plane")
    (width_bytes,) = row_bytes
    if isinstance(array, np.ndarray):
        flat = array.reshape(array.shape[0], -1)
        if flat.shape != (total, width_bytes):
            raise UsageError(f"a stacked source is ({total}, {width_bytes}) uint8, got {array.shape}")
        out, at = [], 0
        for plane in planes:
            out.append(flat[at: at + plane.height].reshape(plane.shape))
            at += plane.height
        return out
    pointer, shape, strides, typestr, _, _ = foreign_device_pointer(array)
    if typestr not in ("|u1", "<u1") or shape[0] != total or int(np.prod(shape[1:])) != width_bytes:
        raise UsageError(f"a stacked source is ({total}, {width_bytes}) uint8, got {typestr} {shape}")
    pitch = strides[0] if strides else width_bytes
    out, at = [], 0
    for plane in planes:
        out.append(_Rows(pointer + at * pitch, plane.height, width_bytes, pitch))
        at += plane.height
    return out


def _mark_forked() -> None:
    # In a child made by fork(), every publisher is the parent's: its frame calls refuse (they
    # would read and write the parent's subscriber connections), close() lets go of the child's
    # copies only. Its locks are new: another thread of the parent may have held one at the fork.
    for publisher in list(_open_publishers):
        publisher._forked = True
        publisher._lock = threading.RLock()
        publisher._join_lock = threading.Lock()


os.register_at_fork(after_in_child=_mark_forked)


@atexit.register
def _close_at_exit() -> None:
    for publisher in list(_open_publishers):
        try:
            if publisher._closed:  # a close put off, whose thread never returned to finish it
                publisher._close_now(0.2)
            else:
                publisher.close(timeout=0.2)
        except Exception:  # noqa: BLE001 - exit goes on
            pass
