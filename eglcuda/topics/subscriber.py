"""The receiving end of a topic: :class:`Subscriber`, which hands out :class:`Message` objects
(message.py), joins through joining.py, and reads each frame through its transport."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref
from typing import Any, AsyncIterator, Iterable, Iterator, NoReturn, Protocol

from .._integers import as_int
from .._lifecycle import Deferral, Tracked, stay_if_ended_by_exit
from ..errors import ClosedError, Dropped, EglCudaError, PeerError, StreamDisconnected, Timeout, UsageError, shown
from ..cuda_device import CudaDevice
from ..frames.interop import stream_handle
from .._unix import numeric_ids, positive_seconds
from . import joining, naming, protocol, sockets, transports
from .connection import Connection, Lost
from .info import TopicInfo
from .message import Message, let_go
from .readiness import Readiness
from .protocol import Qos, Reason
from .transports import CudaSubscriberBackend, SubscriberBackend
from .transports.base import UNMAP_WAIT_S
from .transports.views import SlotView

log = logging.getLogger("eglcuda.topics")
_MAX_BUSY_WAIT = 0.01  # seconds: longer asking without sleeping is a CPU burner, not a shorter wake-up
# How long a wait set's look at a subscriber waits for another thread's receive() or
# wait_for_publisher() to let go of it; then it says nothing is there yet (the wait set looks again
# at its next turn), so that the set's own timeout, its close() and its other sources go on.
LOOK_WAIT_S = 0.002
# How often a receive_async() looks again while another thread holds the subscriber.
_ASYNC_LOOK_S = 0.002
_SECONDS = (float, int)  # the types of a timeout that needs no conversion (a bool is neither)

class Subscriber:
    """A subscriber of topic ``name``, in this or any other process of the host.

    :param qos: ``"latest"`` never slows the publisher: it holds at most two messages (one in
        use, the newest waiting); while it is behind (through CUDA IPC: four of its frames held,
        announced and not received, or released a moment ago; through an EGLStream: two), newer
        frames are skipped, and :meth:`receive` then returns the next frame published after it
        asked. ``"every"``: lossless, with a queue of ``queue``
        frames; when it is full the publisher waits up to its ``every_timeout``, then drops this
        subscriber (:meth:`receive` raises :class:`eglcuda.Dropped` with the reason).
    :param queue: frames an ``every`` subscriber may hold or have unread (1..64).
    :param device: the CUDA device frames are read on (another GPU than the publisher's works:
        through CUDA IPC with peer access, or an EGLStream between the two GPUs' displays).
    :param timeout: seconds to wait for the publisher to appear and finish the handshake, and
        the default of :meth:`receive`.
    :param path: an explicit socket path instead of the topic directory.
    :param transport: ``"auto"`` (the first the publisher offers and can serve this subscriber
        through, in the order ``"cuda-ipc"``, ``"cuda-vmm"``, ``"eglstream"``; on Tegra
        ``"cuda-vmm"``, then ``"eglstream"``; a GL subscriber only ``"eglstream"``), or one of those
        three. A transport the publisher does not offer or cannot serve this subscriber through is
        refused (:class:`eglcuda.Refused`) with the publisher's reason.
    :param gl_context: receive frames in a GL texture (:class:`eglcuda.GLFrame`) through an
        EGLStream; the context must be current on this thread.
    :param cuda_stream: the CUDA stream frames are ordered on: None (a stream made for this
        subscriber, and destroyed with it), an int ``CUstream`` handle (0: the legacy default
        stream), or a stream object: CuPy (``.ptr``), PyTorch (``.cuda_stream``), cuda.core
        (``__cuda_stream__``), cuda-python's ``CUstream``. Only its handle is kept: the stream
        must outlive the subscriber.
    :param trusted_uids: the users whose publishers are accepted: a numeric uid or a set of them
        (None: this process's own uid; ``"any"``: everyone). Checked with ``SO_PEERCRED``.
    :param remote: ``"HOST:PORT"`` of a relay (:class:`eglcuda.Relay`) of the topic, on this or
        another host: the subscriber joins through it over UCX (docs/remote.md; what differs:
        :class:`eglcuda.RemoteSubscriber`); ``key`` is the relay's pre-shared key (None: from the
        environment, docs/security.md), ``frames`` the least frame protection it accepts
        (``"plain"``, the default, ``"integrity"`` or ``"encrypted"``).
    :param busy_wait: seconds a wait for the publisher's next message asks for it without
        sleeping before it sleeps (0 to 0.01; 0: sleep at once). A frame that
        comes within it is taken without a wake-up: lower latency, and a faster publisher at high
        frame rates, for about this much CPU time per wait at most (20 us at 60 frames/s is 0.1 %
        of a core). On the main thread a signal that comes meanwhile has its handler run when
        the asking ends.

    Raises :class:`eglcuda.Timeout` when no publisher answered in ``timeout`` seconds,
    :class:`eglcuda.Refused` when the publisher turned this subscriber away, and
    :class:`eglcuda.UsageError` naming the socket when this user may not connect to it (a
    topic of another user's with ``access="user"``, a folder it may not enter).
    """

    def __init__(self, name: str, qos: str = "latest", queue: int = 4, device: Any = 0, timeout: float = 5.0,
                 path: str | os.PathLike[str] | None = None, transport: str = "auto", gl_context: Any = None, *,
                 cuda_stream: Any = None, trusted_uids: int | Iterable[int] | str | None = None,
                 busy_wait: float = 20e-6, remote: str | None = None, key: bytes | None = None,
                 frames: str | None = None, _backend: SubscriberBackend | None = None) -> None:
        if remote is None and (key is not None or frames is not None):
            raise UsageError("remote= and key= make a remote subscriber (eglcuda.RemoteSubscriber): key needs remote"
                             if key is not None else "frames= is the frame protection of a remote subscriber: it "
                             "needs remote='HOST:PORT'")
        self.name = naming.check_name(name)
        try:
            if not isinstance(qos, (str, Qos)):
                raise ValueError(qos)  # (a number would convert, but is surely not meant as one)
            self.qos = Qos[qos.upper()] if isinstance(qos, str) else qos
        except (KeyError, ValueError):
            raise UsageError(f"qos is 'latest' or 'every' (or an eglcuda.topics.Qos), got {qos!r}") from None
        self._every = self.qos is Qos.EVERY  # (asked on every receive and wake-up)
        depth = as_int(queue)
        if depth is None or not 1 <= depth <= protocol.MAX_QUEUE:
            raise UsageError(f"queue is an int in 1..{protocol.MAX_QUEUE}, got {shown(queue)}")
        self.queue = depth
        self.timeout = positive_seconds(timeout, "timeout")
        self._busy_wait = sockets.wait_seconds(busy_wait, "busy_wait")
        if self._busy_wait > _MAX_BUSY_WAIT:
            raise UsageError(f"busy_wait is at most {_MAX_BUSY_WAIT} seconds, got {shown(busy_wait)}")
        # The task of the receive_async() waiting (one at a time), the future it sleeps on and the
        # descriptor it watches on its loop: a new one may take over from a waiter that was
        # cancelled but has not run since (and then takes its reader off the loop).
        self._async_waiter: asyncio.Task[Any] | None = None
        self._async_cancels = 0  # the waiter's count of cancels not taken back (uncancel) as it began
        self._async_woken: asyncio.Future[None] | None = None
        self._async_reader: int | None = None
        self._remote: RemoteFeed | None = None  # the frames come through a relay (remote=): see remote_feed
        if remote is not None:
            # path, transport and trusted_uids are the relay's business: ignored here.
            try:
                self._remote = remote_feed(self.name, self.qos, self.queue, device, self.timeout, gl_context,
                                           cuda_stream, remote, key, frames)
            except BaseException as exc:
                # (a daemon thread joining as the interpreter exits: the exit stops the engine under
                # its handshake; it stays to be stopped, as a receive does, without a traceback)
                stay_if_ended_by_exit(exc)
                raise
            self.path = self._remote.path
            # (Its link lives on the UCX engine, not in this object: collected unclosed, it is
            # closed in the background; at exit the engine's exit hook closes it.)
            weakref.finalize(self, self._remote.orphaned).atexit = False
            return
        if _backend is None and transport not in ("auto",) + transports.names():
            raise UsageError(f"transport is 'auto' or one of {transports.names()}, got {transport!r}")
        self.path = naming.socket_path(self.name, path)
        self._trusted: frozenset[int] | None = None  # None: any uid
        if isinstance(trusted_uids, str):
            if trusted_uids != "any":
                raise UsageError(f"trusted_uids is None, 'any' or a set of numeric uids, got {trusted_uids!r}")
        else:
            self._trusted = numeric_ids(trusted_uids, "trusted_uids", frozenset((os.geteuid(),)))
        self._closed = False
        # close() from another thread: it sets _closing and makes _wake_fd readable, which ends a
        # receive() or wait_for_publisher() waiting, then takes _busy once that call has left.
        self._closing = False
        self._busy = threading.RLock()  # held by receive() and wait_for_publisher()
        # Held briefly while the connection's state changes (a release, a disconnect, the close):
        # Message.release() may come from any thread, also while another one closes.
        self._state = threading.RLock()
        self._wake_fd = -1
        self._wake_lock = threading.RLock()  # the descriptor is written and closed under it (RLock: a
        # signal handler may close the subscriber while this thread holds it)
        self._wake_finalizer: weakref.finalize[[int], Subscriber] | None = None  # closes it if collected unclosed
        self._pid = os.getpid()  # a forked child's close() leaves the parent's subscription alone
        self._forked = False  # set in a forked child (see _forked)
        # A close() on a thread that is inside receive() or a release (a signal handler) only
        # wakes that call; the outer call closes once it has left its locks (that thread alone).
        self._deferral = Deferral()
        self._stop_event = threading.Event()  # set with _closing; its is_set() is the transport's stop()
        self._stop = self._stop_event.is_set  # (no reference to self: no cycle)
        self._conn: Connection | None = None  # the connection to the publisher (None: not connected)
        self._lost: BaseException | None = None
        self._held: set[Message] = set()
        self._last_seq: int | None = None  # the last frame received
        self._promised = False  # a wait set's "message" promised this ('latest') subscriber a frame (_take)
        self._info: TopicInfo | None = None
        self._ready: Readiness | None = None  # fileno()'s descriptor, made by its first call
        if _backend is None:

            _backend = CudaSubscriberBackend(device, gl_context, cuda_stream)
        self._backend = _backend
        try:
            self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self._wake_finalizer = weakref.finalize(self, os.close, self._wake_fd)
            self._request = joining.Request(self.name, self.path, self.qos, self.queue, self._trusted,
                                            _backend.wishes(transport), self._wake_fd, self._busy_wait)
            self._connect(time.monotonic() + self.timeout)
        except BaseException:
            self._closed = True
            self._close_wake_fd()
            _backend.close()
            raise
        # (Not closed when collected: a collection may run inside another subscriber's transport,
        # holding its locks, or after its stream was finalized. At exit it is closed, in order.)
        _open.add(self)

    def _connect(self, deadline: float) -> None:
        """Subscribe (joining.py): a publisher that takes this subscriber, by ``deadline``."""
        closed = functools.partial(closed_error, self.name)
        joined = joining.join(self._request, self._backend, deadline, self._stop, closed)
        # (No reference back to the subscriber: one dropped without close() is collected at once.)
        self._conn = Connection(self.name, joined, self._stop, closed)
        if self._ready is not None:
            self._ready.watch(self._conn.fd)
        self._info = joined.info
        self._lost = None
        self._last_seq = None
        self._promised = False

    # ---- the handshake ----------------------------------------------------------------------------
    # ---- receiving --------------------------------------------------------------------------------
    def receive(self, timeout: float | None = None) -> Message:
        """The next frame (``every``) or the newest one (``latest``), waiting up to ``timeout``
        seconds (None: the subscriber's ``timeout``). Raises :class:`eglcuda.Timeout` when none
        came, :class:`eglcuda.StreamDisconnected` once the publisher is gone
        (:class:`eglcuda.Dropped`, a kind of it, when the publisher dropped this subscriber or
        closed the topic, with the reason); :meth:`wait_for_publisher` reconnects.

        An EGLStream subscriber holds one message at a time; a CUDA IPC one up to its queue
        (``every``) or two (``latest``).

        :meth:`close` from another thread ends a waiting receive with
        :class:`eglcuda.ClosedError`. A receive on another thread meanwhile is waited for within
        this call's ``timeout``."""
        if self._remote is not None:
            try:
                return self._remote.receive(timeout)
            except BaseException as exc:
                self._stay_if_ended_by_exit(exc)
                raise
        if self._forked:
            raise self._forked_error()
        if not self._busy.acquire(False):
            timeout = self._wait_for_receiver(timeout)
        try:
            try:
                if self._closing:
                    raise self._closed_error()
                try:
                    conn = self._conn
                    if conn is None or self._lost is not None or self._closed:
                        self._check_connected()
                        raise self._not_connected()  # pragma: no cover - _check_connected raised
                    error = None
                    try:
                        message = self._take(conn, timeout)
                    except Lost as lost:
                        error = lost.error
                    if error is not None:
                        self._lose(error)  # (outside the handler: the error raised has no Lost chained to it)
                finally:
                    if self._ready is not None:  # (watched: readable again only when something is there)
                        self._refresh_ready()
            finally:
                self._busy.release()
        except BaseException as exc:
            if self._deferral.thread:  # (a close put off)
                self._close_put_off_during_call(exc)
            self._stay_if_ended_by_exit(exc)
            raise
        if self._deferral.thread:  # (a close put off)
            self._close_put_off_during_call(None)  # (the message was let go if it closed)
        return message

    def _stay_if_ended_by_exit(self, error: BaseException) -> None:
        """receive()'s end at interpreter exit (see stay_if_ended_by_exit), unless its caller
        still holds the receive turn (a Batcher's pass): the exit's close() waits for that lock,
        so the caller stays once it let go."""
        if not self._receive_turn()._is_owned():  # type: ignore[attr-defined]
            stay_if_ended_by_exit(error)

    def _wait_for_receiver(self, timeout: float | None) -> float:
        """Another thread is inside receive() or wait_for_publisher(): take the lock within this
        receive's own time, not as long as that call waits; the time left (Timeout when none)."""
        return take_turn(self._busy, self.timeout if timeout is None else sockets.wait_seconds(timeout), self.name)

    def _take(self, conn: Connection, timeout: float | None) -> Message:
        """receive()'s work on an open connection; its end is raised as :class:`Lost`."""
        # A wait set's "message" for this 'latest' subscriber (_look_locked) promised a frame: one
        # made stale since by a NOTICE is kept until the deadline, and comes if nothing newer did.
        promised, self._promised = self._promised, False
        if len(self._held) >= conn.limit:
            while True:  # a drop or goodbye already waiting says more than this usage error
                header = conn.read(None)
                if header is None:
                    break
                conn.hold_back(header)
            raise hold_limit_error(len(self._held))
        if timeout is None:
            timeout = self.timeout
        elif not (timeout.__class__ in _SECONDS and 0 <= timeout < 1e15):  # (checked as wait_seconds would, quicker)
            timeout = sockets.wait_seconds(timeout)
        deadline = time.monotonic() + timeout
        if conn.unsent:
            self._flush()
        transport = conn.transport
        ring = conn.ring
        latest = not self._every
        stale: protocol.Frame | None = None
        while True:
            try:
                header = conn.next_frame(deadline)
                if latest:
                    header = conn.newest(header, self._skip)
            except Timeout:
                if stale is None:
                    raise
                header, stale = stale, None  # (nothing newer came in time)
            except Lost as lost:
                if stale is None or not lost.goodbye:  # (a drop: the publisher let go of its frames)
                    raise
                conn.ended = lost  # (nothing newer will come: this frame, then the goodbye at the next receive)
                header, stale = stale, None
            except BaseException:
                if stale is not None:  # (kept for the next receive, as announced)
                    conn.pending.appendleft(stale)
                raise
            else:
                if latest:
                    if stale is not None:  # (a newer one came)
                        older, stale = stale, None
                        self._skip(older)
                    if header.seq < conn.notice:
                        # A newer frame was published while this subscriber could take no more:
                        # this one is stale. Give it back; the next frame published comes
                        # instead (unless a "message" promised this one: kept, as above).
                        if promised:
                            stale = header
                        else:
                            self._skip(header)
                        continue
            try:
                frame, number = transport.take(header, deadline, self._stop)
            except Timeout:
                conn.pending.appendleft(header)
                raise
            except ClosedError as exc:
                if self._closing:  # close() in another thread: it lets go of the announced frame
                    raise self._closed_error() from None
                raise Lost(conn.drop_waiting() or StreamDisconnected(f"receiving from topic {self.name!r} failed: {exc}"))
            except StreamDisconnected as exc:
                raise Lost(conn.drop_waiting() or StreamDisconnected(f"the publisher of topic {self.name!r} is gone ({exc})"))
            except EglCudaError as exc:
                dropped = conn.drop_waiting()
                if dropped is None:  # (this end failed, not the publisher: it hears why, not of a killed process)
                    conn.say_goodbye(int(Reason.TRANSPORT), f"receiving failed: {exc}")
                raise Lost(dropped or StreamDisconnected(f"receiving from topic {self.name!r} failed: {exc}"))
            if ring is not None and ring.dropped():
                # The publisher dropped this subscriber after announcing the frame and freed its
                # slot, which it may be writing again: the drop is raised, not a frame gone bad.
                transport.release(frame, header, None)
                conn.lose_to_the_drop()
            if number is not None and number != header.number:
                header = self._match(conn, header, number, frame, deadline)
            skipped = 0 if self._last_seq is None else header.seq - self._last_seq - 1
            self._last_seq = header.seq
            message = Message(self, frame, header, skipped, number)
            self._held.add(message)
            return message

    def _check_connected(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._lost is not None:
            # (the same exception each time: without its earlier traceback, which would grow by
            # this call's frames, and hold them, at every receive of a subscriber left disconnected)
            raise self._lost.with_traceback(None)
        if self._conn is None:  # pragma: no cover - _lost is set whenever the connection goes
            raise self._not_connected()

    def _not_connected(self) -> StreamDisconnected:
        return StreamDisconnected(f"not connected to topic {self.name!r}")

    def _match(self, conn: Connection, header: protocol.Frame, number: int, frame: Any,
               deadline: float) -> protocol.Frame:
        """The EGLStream handed over frame ``number``, newer than ``header`` announced: a mailbox
        replaced the announced frames with a newer one, whose announcement is on its way."""
        if self.qos is Qos.EVERY or number < header.number:
            conn.transport.release(frame, header, None)
            raise Lost(PeerError(f"topic {self.name!r}: the EGLStream handed over frame {number} where frame "
                                 f"{header.number} was announced"))
        while header.number < number:
            self._skip(header)
            header = conn.next_frame(deadline)
        if header.number != number:
            conn.transport.release(frame, header, None)
            raise Lost(PeerError(f"topic {self.name!r}: no announcement for EGLStream frame {number}"))
        return header

    def _skip(self, header: protocol.Frame) -> None:
        conn = self._conn
        if conn is None:  # pragma: no cover - only called while connected
            raise self._not_connected()
        flags, extra = conn.transport.skip(header)
        with self._state:
            conn.send_release(header.seq, flags, extra)

    def _release(self, message: Message, cuda_stream: Any) -> None:
        stream = None if cuda_stream is None else stream_handle(cuda_stream)  # (bad input: nothing changed)
        if self._forked:
            let_go(message)  # a forked child: the mappings and the connection are the parent's
            return
        try:
            with self._state:  # once, also when two threads release it, or one closes meanwhile
                if message._released:
                    return
                message._released = True
                conn = self._conn
                full = self._ready is not None and conn is not None and len(self._held) >= conn.limit
                self._held.discard(message)
                if self._lost is not None or self._closed or conn is None:
                    let_go(message)  # nobody to tell; its view must still stop working before the unmap
                else:
                    try:
                        flags, extra = conn.transport.release(message._frame, message._header, stream)
                    except EglCudaError:
                        frame = message._frame
                        if isinstance(frame, SlotView) and not self._closing:
                            # The driver refused a step of ordering the release after the frame's
                            # readers (cuda_stream destroyed, say): the publisher would never hear
                            # of the release and keep the frame for good. The message stays held,
                            # its view usable (every step is one to take again), and the error is
                            # the caller's. (A close lets go regardless.)
                            frame._released = False
                            message._released = False
                            self._held.add(message)
                            raise
                        # the transport could not let go (its publisher may be gone): the next receive says so
                    else:
                        conn.send_release(message.seq, flags, extra)
                if full:
                    self._wake_watcher()
        finally:
            if self._deferral.thread:  # (a close put off)
                self._finish_deferred_close()

    def _wake_watcher(self) -> None:
        """A release made room in a subscriber that held all it may, whose descriptor was quiet:
        it says again what is there (under ``_state``)."""
        if self._busy.acquire(False):
            try:
                self._refresh_ready()
            finally:
                self._busy.release()
        elif self._ready is not None:
            self._ready.set()  # (a receive of another thread meanwhile: it may have looked before this release)

    def _flush(self) -> None:
        """Send queued releases; if the publisher's socket is full, they wait for the next call."""
        with self._state:
            if self._conn is not None:
                self._conn.send_queued()

    def _lose(self, error: BaseException) -> NoReturn:
        """The connection is over: make held frames unusable, close the transport, raise ``error``."""
        self._lost = error
        self._disconnect()
        raise error

    def _disconnect(self) -> None:
        with self._state:
            self._drop_connection()

    def _drop_connection(self) -> None:
        held, self._held = self._held, set()
        for message in held:
            let_go(message)
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._ready is not None:
                self._ready.unwatch()  # (before the socket closes: its number may be reused)
            conn.close()

    # ---- the publisher coming back ------------------------------------------------------------------
    def wait_for_publisher(self, timeout: float | None = None) -> TopicInfo:
        """Once the publisher is gone (:meth:`receive` raised :class:`eglcuda.StreamDisconnected`),
        wait up to ``timeout`` seconds (None: the subscriber's ``timeout``) for a publisher of the
        topic to be there again (a restarted one) and subscribe to it; returns its
        :class:`TopicInfo` (a new ``instance``). While still connected, returns the current info.
        :meth:`close` from another thread ends the wait with :class:`eglcuda.ClosedError`."""
        if self._remote is not None:
            try:
                return self._remote.wait_for_publisher(timeout)
            except BaseException as exc:
                stay_if_ended_by_exit(exc)
                raise
        wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)
        if self._forked:
            raise self._forked_error()
        started = time.monotonic()
        if not _acquire(self._busy, wait):
            # Another thread's receive() held the subscriber all this time: it is connected.
            info = self.info
            if self.connected and info is not None:
                return info
            raise Timeout(f"no publisher of topic {self.name!r} answered at {self.path} in time")
        try:
            try:
                if self._closed or self._closing:
                    raise self._closed_error()
                try:
                    if self._conn is None or self._lost is not None:
                        self._disconnect()
                        self._connect(started + wait)
                finally:
                    if self._ready is not None:
                        self._refresh_ready()
            finally:
                self._busy.release()
        except BaseException as exc:
            if self._deferral:
                self._close_put_off_during_call(exc)
            stay_if_ended_by_exit(exc)
            raise
        if self._deferral:
            self._close_put_off_during_call(None)
        if self._closed:  # (by another thread since this call left)
            error = self._closed_error()
            stay_if_ended_by_exit(error)
            raise error
        info = self.info
        if info is None:  # pragma: no cover - every handshake sets it
            raise self._not_connected()
        return info

    @property
    def info(self) -> TopicInfo | None:
        """The topic as the publisher (or the relay) described it when this subscriber joined."""
        return self._remote.info if self._remote is not None else self._info

    @property
    def connected(self) -> bool:
        """Joined to a live publisher (or relay): False before the join, after the publisher's
        goodbye or loss, and once closed."""
        if self._remote is not None:
            return self._remote.connected
        return self._conn is not None and self._lost is None and not self._closed

    @property
    def transport(self) -> str | None:
        """The transport frames arrive through (None while not connected)."""
        return self.info.transport if self.connected and self.info is not None else None

    @property
    def busy_wait(self) -> float:
        """Seconds a wait for the next message asks without sleeping first (set at construction)."""
        return self._busy_wait

    @property
    def cuda_stream(self) -> int | None:
        """The CUDA stream received frames are ordered on."""
        if self._remote is not None:
            return self._remote.cuda_stream
        return self._backend.cuda_stream

    def _made_its_stream(self) -> bool:
        """Whether :attr:`cuda_stream` is one this subscriber made (and destroys at its close),
        not the caller's."""
        return self._backend.owns_stream if self._remote is None else self._remote.owns_stream

    def _cuda_device(self) -> CudaDevice | None:
        """The CUDA device frames are read on (None: a GL subscriber's frames are textures)."""
        if self._remote is not None:
            return self._remote.device
        backend = self._backend
        if getattr(backend, "gl_context", None) is not None:
            return None
        device: CudaDevice | None = getattr(backend, "device", None)
        return device

    @property
    def held(self) -> int:
        """Messages received and not released."""
        if self._remote is not None:
            return self._remote.held
        return len(self._held)

    @property
    def closed(self) -> bool:
        if self._remote is not None:
            return self._remote.closed
        return self._closed

    def _receive_turn(self) -> "threading.RLock":
        """The lock a receive holds (a remote subscriber's is its feed's): held by another
        thread, a receive of this one waits; a close() from another thread waits for it. Who
        takes it outside :meth:`receive` calls :meth:`_turn_ended` once it let go."""
        return self._busy if self._remote is None else self._remote._busy

    def _turn_ended(self) -> None:
        """After a hold of :meth:`_receive_turn` outside :meth:`receive`: a close() put off
        meanwhile (a signal handler's, on this thread) goes on now, as at a receive's end."""
        if self._remote is not None:
            self._remote.finish_put_off_close()
        elif self._deferral.thread:
            self._finish_deferred_close()

    def _ending(self) -> bool:
        """Closed, or closing on another thread."""
        if self._remote is not None:
            return self._remote.ending
        return self._closing or self._closed

    def __iter__(self) -> Iterator[Message]:
        """Messages until the publisher closes the topic; each step releases the previous message
        if it is still held. Drops and crashes raise as in :meth:`receive`, and so does a wait
        longer than the subscriber's ``timeout`` for the next message (:class:`eglcuda.Timeout`:
        a publisher that goes quiet for longer needs a longer ``timeout``)."""
        if self._ending():
            raise self._closed_error()  # (a close() later, from another thread, just ends the loop)
        previous = None
        try:
            while True:
                if previous is not None:
                    previous.release()
                try:
                    previous = self.receive()
                except Dropped as exc:
                    if exc.code == Reason.CLOSING:
                        return
                    raise
                except ClosedError:
                    if self._ending():
                        return  # closed, by another thread too
                    raise  # pragma: no cover - only a closed subscriber raises it
                yield previous
        finally:
            if previous is not None:
                previous.release()

    # ---- waiting on many: fileno(), WaitSet, asyncio ---------------------------------------------
    def fileno(self) -> int:
        """A descriptor that is readable whenever :meth:`receive` with ``timeout=0`` would hand
        out a message or raise (the subscriber closed, dropped or disconnected), for
        ``selectors``, ``select``, asyncio's ``loop.add_reader`` and :class:`eglcuda.WaitSet`. It
        is the same descriptor for the subscriber's life (also after
        :meth:`wait_for_publisher` joined a restarted publisher) and stays open after
        :meth:`close` (readable: the watcher sees the close) until the subscriber is collected.

        Level-triggered: after it said readable, receive with ``timeout=0`` until
        :class:`eglcuda.Timeout`, or at least once; a message left unreceived keeps it readable.
        While the subscriber holds as many messages as it may, it stays quiet until one is
        released (a drop or the publisher's end still makes it readable).
        Now and then it is readable with nothing to receive (a ``latest`` frame that turned
        stale, a message the publisher sent that is not a frame): ``receive(timeout=0)`` then
        raises :class:`eglcuda.Timeout`, and the descriptor is quiet again. The first call
        makes it; from then on each receive leaves the subscriber declared asleep when nothing
        is left, so that the publisher's next frame wakes the descriptor (one system call a
        frame on each side, as a blocking :meth:`receive` that sleeps pays). Receive on one
        thread at a time: the first call waits for a receive of another thread to end, up to the
        subscriber's ``timeout``, then raises :class:`eglcuda.Timeout`."""
        fd = self._readiness_fd(self.timeout)
        if fd is None:
            raise Timeout(f"fileno() of the subscriber of topic {self.name!r} waited {self.timeout:g} s for "
                          "another thread's receive to end: ask for it before receiving on another thread, "
                          "or on the receiving thread")
        return fd

    def _readiness_fd(self, wait: float) -> int | None:
        """fileno()'s descriptor, made at the first call, waiting up to ``wait`` seconds for a
        receive of another thread to end first; None when it did not."""
        if self._remote is not None:
            return self._remote.fileno(wait)
        if self._forked:
            raise self._forked_error()
        ready = self._ready
        if ready is not None:
            return ready.fileno()
        if not _acquire(self._busy, wait):
            return None
        try:
            try:
                if self._closed:
                    raise self._closed_error()
                if self._ready is None:
                    ready = self._new_readiness()
                    weakref.finalize(self, ready.close)
                    self._ready = ready
                    self._refresh_ready()
                fd = self._ready.fileno()
            finally:
                self._busy.release()
        finally:
            if self._deferral.thread:  # (a close put off meanwhile, a signal handler's: it goes on now)
                self._finish_deferred_close()
        return fd  # (also after that close: the descriptor stays, readable, as fileno() says)

    def _new_readiness(self) -> Readiness:
        """fileno()'s descriptor, made at its first call: the due ``eventfd`` and the
        connection's socket in one ``epoll`` set."""
        ready = Readiness(combine=True)
        conn = self._conn
        if conn is not None:
            ready.watch(conn.fd)
        return ready

    def _refresh_ready(self) -> None:
        """Make fileno()'s descriptor say whether something is there now (under ``_busy``):
        readable when it is, else quiet with the ring armed so that the next frame wakes it."""
        ready = self._ready
        if ready is None:
            return
        conn = self._conn
        if conn is None or self._lost is not None or self._closed or self._closing:
            ready.set()
        elif len(self._held) >= conn.limit:
            # Nothing to hand out until a release (which looks again): not armed, so the
            # publisher's frames send no WAKE meanwhile, and the socket is watched for its end
            # only, so that a NOTICE of frames skipped does not wake a watcher that can take
            # nothing; a drop (the connection closed) or a goodbye (its sending half shut) shows.
            if conn.inbox.quiet() and any(kind not in _ANNOUNCEMENTS for kind in conn.inbox.queued_kinds()):
                ready.set()  # (read already: the connection's end, a drop or a goodbye, which receive raises)
            else:
                ready.watch_end_only(True)
                if ready.due:
                    ready.clear()
        else:
            if ready.end_only:  # (only after the subscriber held all it may)
                ready.watch_end_only(False)
            if conn.pending or conn.inbox.arm():
                ready.set()
            elif ready.due:  # (the usual case, a frame taken and none behind it: nothing to clear)
                ready.clear()

    def _wait_ready(self) -> "bool | BaseException":
        """For :class:`eglcuda.WaitSet`, once fileno() said readable: True when
        ``receive(timeout=0)`` hands out a message now, the exception it raises when it would
        raise, False when nothing is there (then the descriptor is quiet until something comes).
        A frame read here waits for that receive (up to LOOK_WAIT_S: then False)."""
        if self._remote is not None:
            return self._remote.wait_ready()
        conn = self._conn
        if (conn is not None and self._every and not self._closing and self._lost is None and not self._forked
                and len(self._held) < conn.limit
                and ((conn.pending and not conn.dropped_meanwhile()) or conn.inbox.frame_next())):
            # The usual case of an ``every`` subscriber, a look without the lock (the compiled look
            # holds the GIL: a close on another thread cannot unmap the ring meanwhile): a frame's
            # entry next in the ring, or a frame read earlier. Nothing is read, so what made the
            # descriptor readable (the WAKE on the socket, or the due eventfd) stays so until a
            # receive takes the frame. (A ``latest`` frame may be stale: the read below says.)
            return True
        if self._forked:
            return self._forked_error()
        try:
            state = self._look_locked()
        finally:
            if self._deferral.thread:  # (a close put off meanwhile, a signal handler's: it goes on now)
                self._finish_deferred_close()
        if self._closed:
            return self._closed_error()
        return state

    def _look_locked(self) -> "bool | BaseException":
        """_wait_ready's look under the lock."""
        if not _acquire(self._busy, LOOK_WAIT_S):
            return False  # (another thread receives or joins again: what it finds, it says)
        try:
            if self._closed or self._closing:
                return self._closed_error()
            if self._lost is not None:
                return self._lost
            conn = self._conn
            if conn is None:  # pragma: no cover - _lost is set whenever the connection goes
                return self._not_connected()
            self._promised = False  # (each look answers anew: only a "message" promises)
            try:
                if conn.dropped_meanwhile():  # (as receive says: the drop, not a frame announced before it)
                    conn.lose_to_the_drop()
                if len(self._held) >= conn.limit:
                    # Holding all it may, it can be handed nothing: quiet (not a "message" at every
                    # wait) until a release says so. What is waiting is read, as receive would, so
                    # that a drop or the publisher's end among it is reported now.
                    while True:
                        header = conn.read(None)
                        if header is None:
                            return False
                        conn.hold_back(header)
                if conn.pending and self.qos is Qos.EVERY:
                    return True
                header = conn.pending.popleft() if conn.pending else conn.read(None)
                if header is None:
                    return False
                if self.qos is Qos.LATEST:  # (as receive does: a frame already stale is passed over)
                    header = conn.newest(header, self._skip)
                    if header.seq < conn.notice:
                        self._skip(header)
                        return False
                    # The "message" it reports is a promise: a NOTICE read by the receive that
                    # follows may make this frame stale, and then the newest announced comes
                    # rather than a Timeout (_take).
                    self._promised = True
                conn.hold_back(header)
                return True
            except ClosedError as exc:
                return exc
            except Lost as lost:
                self._lost = lost.error
                self._disconnect()
                return lost.error
            finally:
                self._refresh_ready()
        finally:
            self._busy.release()

    async def receive_async(self, timeout: float | None = None) -> Message:
        """As :meth:`receive`, awaited in an asyncio event loop, which runs meanwhile (the wait
        is ``loop.add_reader`` on :meth:`fileno`: no thread, no polling). ``timeout`` as
        :meth:`receive` (None: the subscriber's ``timeout``). One ``receive_async`` of a
        subscriber at a time; a waiting one that was cancelled (``task.cancel()``), or whose
        event loop was closed while it waited, counts as gone at once, before it has run to its end."""
        wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if self._async_waiter is not None:
            if not self._async_waiter_leaving(loop):
                raise UsageError(f"another receive_async() of topic {self.name!r} is waiting: await one at a time")
            self._stop_async_reader(loop)
        deadline = loop.time() + wait
        self._async_waiter, self._async_woken = task, None
        cancelling = getattr(task, "cancelling", None)  # (Python 3.11 on)
        # (a task that caught an earlier cancel without uncancel() waits here with its count above 0)
        self._async_cancels = cancelling() if cancelling is not None else 0
        try:
            # (The descriptor is made once; while another thread's receive holds the subscriber
            # as it is first asked for, the loop runs on: asked again every few milliseconds.)
            fd = self._readiness_fd(0)
            while fd is None:
                if loop.time() >= deadline:
                    raise Timeout(f"no frame of topic {self.name!r} arrived in time (another thread was receiving)")
                await asyncio.sleep(0.005)
                fd = self._readiness_fd(0)
            busy = self._busy if self._remote is None else self._remote._busy  # (the feed's receive lock)
            while True:
                if not busy.acquire(False):
                    # Another thread receives, joins again or closes, within its own call's time.
                    # The descriptor may stay readable meanwhile (what made it so is that thread's to
                    # take): a reader would fire again at once, so look again in a moment instead.
                    left = deadline - loop.time()
                    if left <= 0:
                        raise Timeout(f"no frame of topic {self.name!r} arrived in time (another thread was receiving)")
                    await asyncio.sleep(min(_ASYNC_LOOK_S, left))
                    continue
                busy.release()
                try:
                    return self.receive(0)
                except Timeout:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise
                woken: asyncio.Future[None] = loop.create_future()
                self._async_woken = woken
                loop.add_reader(fd, _settle, woken)
                self._async_reader = fd
                timer = loop.call_later(left, _settle, woken)
                try:
                    await woken
                finally:
                    timer.cancel()
                    if self._async_waiter is task:  # (else a newer waiter took the reader off)
                        self._stop_async_reader(loop)
        finally:
            if self._async_waiter is task:
                self._async_waiter = self._async_woken = None

    def _async_waiter_leaving(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The waiting receive_async(), on ``loop``, ended or was cancelled: it will not wait
        again, and its reader may be taken off the loop."""
        waiter = self._async_waiter
        if waiter is None or waiter.done():
            return True
        if waiter.get_loop().is_closed():
            return True  # (its loop was closed while it waited, after a KeyboardInterrupt say: it never runs again)
        if waiter.get_loop() is not loop:
            return False
        if self._async_woken is not None and self._async_woken.cancelled():
            return True
        cancelling = getattr(waiter, "cancelling", None)  # (Python 3.11 on)
        if cancelling is not None:
            return bool(cancelling() > self._async_cancels)  # (cancelled since it began to wait)
        # (Python 3.10: a cancel that came after its future was settled, its reader having run,
        # waits for the task's next step in _must_cancel)
        return bool(getattr(waiter, "_must_cancel", False))

    def _stop_async_reader(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._async_reader is not None:
            loop.remove_reader(self._async_reader)
            self._async_reader = None

    def __aiter__(self) -> AsyncIterator[Message]:
        """``async for message in subscriber``: messages until the publisher closes the topic,
        through :meth:`receive_async`; each step releases the previous message if it is still
        held (as iteration does), and so does leaving the loop (break, return, an exception).
        Drops, crashes and timeouts raise as in :meth:`receive`."""
        return _AsyncMessages(self)

    def close(self) -> None:
        """Say goodbye to the publisher and let go of everything (held messages become
        unusable). The goodbye waits, up to 2 s, for the GPU work queued on this subscriber's
        frames (CUDA IPC): the publisher writes them again once it has read it. Safe to call
        twice, and from another thread: a :meth:`receive` waiting there for a frame ends with
        :class:`eglcuda.ClosedError` (an iteration ends), and this call returns once it has.
        Called on a thread that is itself inside :meth:`receive`, :meth:`wait_for_publisher` or
        a release (from a signal handler), it returns at once: that call ends with
        :class:`eglcuda.ClosedError` and the subscriber is closed as it returns, on that thread.
        Meanwhile releases from other threads go through, but a ``close()`` from another thread
        waits for it (a handler must not wait for a thread that closes the subscriber).
        After a ``fork()`` made outside Python (from C, with no at-fork hooks), only ``close()``
        is safe in the child."""
        if self._remote is not None:
            self._remote.close()
            return
        if self._closed:
            return
        if self._forked or os.getpid() != self._pid:  # (getpid too: a fork from C runs no Python hook)
            _open.discard(self)
            self._forget_in_child()
            return
        self._closing = True
        self._stop_event.set()
        if self._ready is not None:
            self._ready.set()  # (a watcher hears of the close: receive() raises ClosedError now)
        with self._wake_lock:
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)
        if self._busy._is_owned() or self._state._is_owned():  # type: ignore[attr-defined]
            # Called on a thread that is inside receive(), wait_for_publisher() or a release (a
            # signal handler, a finalizer): closing here would pull the connection from under
            # that call. It ends woken (ClosedError) and closes on its way out.
            self._deferral.put_off()
            return
        with self._busy:  # a receive in another thread leaves (woken at once), then this goes on
            try:
                if not self._closed:
                    self._close()
            finally:
                if self._ready is not None:
                    # Again, now that no receive runs: one that was ending as this close began may
                    # have made the descriptor quiet after the set() above; a watcher must see the close.
                    self._ready.set()
        # (Only now: a close() interrupted while waiting above stays for the exit hook to finish.)
        _open.discard(self)

    def _finish_deferred_close(self) -> None:
        """A close() deferred by this thread (see close()) goes on now, unless this thread is still
        inside another call that holds the locks (then the outer call finishes it). Other threads
        leave it alone: they could wait for locks that the deferring thread holds."""
        if self._deferral.mine():
            self._deferral.take()  # (close() puts it off again if this thread still holds the locks)
            self.close()

    def _close_put_off_during_call(self, error: BaseException | None) -> None:
        """At the end of receive() or wait_for_publisher(), which ``error`` ended (None: it
        succeeded): finish a close() put off during it; if that closed the subscriber, the call
        ends with ClosedError, unless it ended with another kind of exception (a signal
        handler's own, say)."""
        self._finish_deferred_close()
        if self._closed and (error is None or isinstance(error, EglCudaError)):
            raise self._closed_error() from error

    def _close(self) -> None:
        with self._state:
            self._say_goodbye()

    def _say_goodbye(self) -> None:
        try:
            if self._conn is not None and self._lost is None:
                # Released through the transport (their views stop working, the publisher hears
                # of them) before this subscriber counts as closed, which would only mark them.
                for message in list(self._held):
                    message.release()
        finally:
            # (Also when a release above raised, a signal handler's exception say: the
            # publisher still hears a goodbye, and nothing stays mapped.)
            self._closed = True
            try:
                conn = self._conn
                if conn is not None and self._lost is None:
                    self._flush()
                    # The publisher writes the frames again as soon as it reads the goodbye: the
                    # GPU work queued on them ends first (bounded: see UNMAP_WAIT_S).
                    try:
                        conn.transport.finish_reading(UNMAP_WAIT_S)
                    except EglCudaError as exc:
                        log.warning("topic %s: waiting for the subscriber's GPU work failed: %s", self.name, exc)
                    conn.say_goodbye(int(Reason.CLOSING), "the subscriber closed")
            finally:
                try:
                    self._disconnect()
                finally:
                    self._close_wake_fd()
                    self._backend.close()
                    # (The error that ended the connection holds, through its traceback, the
                    # frames of the call that first raised it and their locals: the caller's
                    # exception keeps them if it wants; a closed subscriber keeps none.)
                    self._lost = None

    def _closed_error(self) -> ClosedError:
        return closed_error(self.name)

    def _forked_error(self) -> UsageError:
        return forked_error(self.name, self._pid)

    def _close_wake_fd(self) -> None:
        with self._wake_lock:
            self._wake_fd = -1
            finalizer, self._wake_finalizer = self._wake_finalizer, None
            if finalizer is not None:
                finalizer()  # closes the descriptor, once

    def _forget_in_child(self) -> None:
        """close() in a child made by fork(): the subscription is the parent's. Its messages stop
        working here, this process's copy of the connection is closed without a word or a read
        (either would reach the parent's publisher as the parent's), and no CUDA call is made
        (the transport's mappings and stream are the parent's, and a forked child must not)."""
        self._closed = True
        held, self._held = self._held, set()
        for message in held:
            let_go(message)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.inbox.close()
            conn.sock.close()
        self._close_wake_fd()
        if self._ready is not None:
            self._ready.close()  # (this process's copies of the parent's descriptors)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._remote is not None:
            state = self._remote.describe()
        elif self._closed:
            state = "closed"
        elif self.connected:
            state = f"{self.transport}, {len(self._held)} held"
        else:
            state = f"disconnected ({self._lost})"
        return f"<{type(self).__name__} {self.name!r} {self.qos.name.lower()}: {state}>"


class _AsyncMessages:
    """``async for`` over a subscriber. An iterator object, not an async generator: a loop left
    early (break, return, an exception) drops it, and the message it held is released then, as a
    ``for`` loop's generator does; an async generator's cleanup waits for its event loop to run
    it, which a loop stopped and closed first never does (the message stayed held)."""

    __slots__ = ("_subscriber", "_previous", "_started", "_done")

    def __init__(self, subscriber: Subscriber) -> None:
        self._subscriber = subscriber
        self._previous: Message | None = None
        self._started = False
        self._done = False

    def __aiter__(self) -> "_AsyncMessages":
        return self

    async def __anext__(self) -> Message:
        self._let_go()
        if self._done:
            raise StopAsyncIteration
        subscriber = self._subscriber
        if not self._started:
            self._started = True
            if subscriber._ending():
                self._done = True
                raise subscriber._closed_error()
        try:
            self._previous = await subscriber.receive_async()
        except Dropped as exc:
            self._done = True
            if exc.code == Reason.CLOSING:
                raise StopAsyncIteration from None
            raise
        except ClosedError:
            self._done = True
            if subscriber._ending():
                raise StopAsyncIteration from None
            raise  # pragma: no cover - only a closed subscriber raises it
        except BaseException:
            self._done = True  # (as an async generator that raised: the iteration is over)
            raise
        return self._previous

    async def aclose(self) -> None:
        self._done = True
        self._let_go()

    def _let_go(self) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            previous.release()

    def __del__(self) -> None:
        try:
            self._let_go()
        except Exception:  # pragma: no cover - a finalizer must not raise
            pass


# Messages that announce frames (an EGLStream's come this way) or say some were skipped: nothing a
# subscriber that holds all it may can take or raise.
_ANNOUNCEMENTS = frozenset((int(protocol.Kind.FRAME), int(protocol.Kind.NOTICE)))


def take_turn(lock: "threading.RLock", wait: float, name: str) -> float:
    """A receive's turn on a subscriber of topic ``name`` (``lock``, held by another thread's
    receive meanwhile) within the receive's own ``wait`` seconds: the time left, or
    :class:`Timeout` (a remote feed's too)."""
    started = time.monotonic()
    if not _acquire(lock, wait):
        raise Timeout(f"no frame of topic {name!r} arrived in time (another thread was receiving)")
    return max(0.0, wait - (time.monotonic() - started))


def _acquire(lock: "threading.RLock", seconds: float) -> bool:
    """Take ``lock`` within ``seconds`` (any number >= 0: beyond what the lock takes, no limit)."""
    return lock.acquire(timeout=seconds if seconds < threading.TIMEOUT_MAX else -1)


def _settle(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def closed_error(name: str) -> ClosedError:
    """What a closed subscriber of topic ``name`` raises (a remote feed's too)."""
    return ClosedError(f"the subscriber of topic {name!r} is closed")


def hold_limit_error(held: int) -> UsageError:
    """What a subscriber holding ``held`` messages, as many as it may, raises at a receive (a
    remote feed's too)."""
    return UsageError(f"this subscriber holds {held} message(s), as many as it may: release one before receiving "
                      "another (a message dropped without release() stays held until close(): receive with "
                      "`with sub.receive() as message:`)")


def forked_error(name: str, pid: int) -> UsageError:
    """What a subscriber of topic ``name`` made in process ``pid`` raises in a forked child."""
    return UsageError(f"this subscriber of topic {name!r} belongs to process {pid}, not to this forked child: make "
                      "a new Subscriber here (close() here only lets go of its copy)")


class RemoteFeed(Protocol):
    """What a subscriber made with ``remote=`` receives through (eglcuda.remote's, a layer above:
    :func:`remote_feed`); the subscriber hands each of these calls to it."""

    info: TopicInfo | None
    path: str
    _busy: "threading.RLock"  # held by a receive (and by close(), which waits for one)

    @property
    def device(self) -> CudaDevice: ...
    @property
    def connected(self) -> bool: ...
    @property
    def cuda_stream(self) -> int | None: ...
    @property
    def owns_stream(self) -> bool: ...
    @property
    def held(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def ending(self) -> bool: ...
    def receive(self, timeout: float | None) -> Message: ...
    def wait_for_publisher(self, timeout: float | None) -> TopicInfo: ...
    def fileno(self, wait: float) -> int | None: ...
    def wait_ready(self) -> "bool | BaseException": ...
    def close(self) -> None: ...
    def finish_put_off_close(self) -> None: ...
    def orphaned(self) -> None: ...
    def describe(self) -> str: ...


def remote_feed(name: str, qos: Qos, queue: int, device: Any, timeout: float, gl_context: Any, cuda_stream: Any,
                remote: str, key: bytes | None, frames: str | None) -> RemoteFeed:
    """The feed of a subscriber made with ``remote=``: frames through the relay at ``remote``."""
    # The remote wing is a layer above this one (it uses the topics wing, not the reverse):
    # imported here, where a remote subscriber is asked for.
    from ..remote.subscriber import RemoteFeed as Feed
    return Feed(name, qos, queue, device, timeout, gl_context, cuda_stream, remote, key, frames)


def _forked(subscriber: Subscriber) -> None:
    # In a child made by fork(), every subscriber is the parent's: a flag set once here spares
    # the per-frame calls an os.getpid() each. Its locks are new: another thread of the parent
    # may have held one at the fork, and nothing in the child would let it go.
    subscriber._forked = True
    subscriber._busy = threading.RLock()
    subscriber._state = threading.RLock()
    subscriber._wake_lock = threading.RLock()
    # Its messages stop working here at once: their views are the parent's mappings, and exporting
    # them (DLPack orders a stream: driver calls) is no more the child's to do than a receive.
    for message in subscriber._held:
        let_go(message)
    # The child's copy of the connection goes now, not at its close(): a child that outlives the
    # parent (a worker) would keep it open, and the publisher would not see the parent die.
    conn, subscriber._conn = subscriber._conn, None
    if conn is not None:
        conn.inbox.close()  # (unmaps the child's copy of the ring; nothing is read or sent)
        conn.sock.close()


# Open subscribers, closed at interpreter exit (before eglcuda's own resources go) if the program
# did not: the publisher then hears a goodbye, not a dropped connection.
_open: Tracked[Subscriber] = Tracked(_forked, Subscriber.close)
