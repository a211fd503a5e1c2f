"""The publishing end of a topic: :class:`Publisher`, a facade over its parts.

- :class:`~eglcuda.topics.pool.Pool`: the pool frames and which are free;
- :class:`~eglcuda.topics.delivery.Delivery`: the subscribers on the publishing thread (their
  messages, handing frames out and taking them back, waits, drops), over the compiled books of
  ``_delivery.pyx``;
- :mod:`~eglcuda.topics.handshake`: a service thread that accepts connections, checks who they come
  from (``SO_PEERCRED``), answers status requests and runs each subscriber's handshake with a
  deadline, asking the publisher only what :class:`~eglcuda.topics.handshake.Admission` offers; a
  subscriber that completed it is handed to the publishing thread, which adopts it at its next
  call, so a late joiner starts at the next frame;
- :mod:`~eglcuda.topics.transports`: how frames reach each subscriber.

A subscriber that dies costs the publishing thread nothing but the bookkeeping of its end of
stream; one that stops reading costs at most ``every_timeout`` (``every``) or nothing (``latest``).
"""
from __future__ import annotations

import functools
import logging
import numbers
import os
import secrets
import select
import socket
import threading
import time
import weakref
from dataclasses import asdict
from typing import Any, Sequence

from .._integers import as_int
from .._lifecycle import Deferral, Tracked, stay_if_ended_by_exit
from ..errors import ClosedError, EglCudaError, UsageError, shown
from ..frames.formats import ColorFormat, Layout, color_format, check_size, layout_of
from .._unix import Policy, positive_seconds
from . import handshake, naming, protocol, registry, sockets
from .copying import copy_into
from .delivery import Delivery, new_member
from .files import TopicFiles
from .info import DropRecord, SubscriberInfo, TopicInfo
from .pool import Pool
from .transports import CudaPublisherBackend, PublisherBackend, PublisherLink, PublisherTransport
from .transports import offer as offer_transports

log = logging.getLogger("eglcuda.topics")

ACCESS_MODES = {"user": 0o600, "group": 0o660, "all": 0o666}
_MEASURE_ALPHA = 0.05  # smoothing of the measured frame rate


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
        host). ``max_pool`` bounds the memory (a 4K ARGB frame is 33 MB); it must leave room
        for what the subscribers may keep (4 frames for a ``latest`` subscriber through cuda-ipc or cuda-vmm,
        ``queue`` for an ``every`` one) and one frame to write, or a stalled subscriber can keep
        the whole pool (docs/topics.md, QoS).
    :param device: the CUDA device of the pool.
    :param every_timeout: seconds the publisher waits for an ``every`` subscriber that holds a
        full queue (or the pool frame the publisher needs), or for any subscriber's GPU work still
        reading a frame it released when the publisher needs that frame, before dropping it.
    :param access: who may subscribe: ``"user"`` (this uid only, the default), ``"group"`` (also
        members of this process's group) or ``"all"``. Checked on every connection with
        ``SO_PEERCRED``; the socket's mode follows. Other than ``"user"`` needs ``path`` in a
        directory those users can reach (the default directory is private).
    :param path: an explicit socket path instead of the topic directory.
    :param handshake_timeout: seconds a connecting subscriber has for its handshake. A
        connection with nothing to read is turned away sooner when others need its place (at
        most 8 handshakes per process, 32 in all: see "Admission under a flood" in docs/topics.md).
    :param transports: the transports offered (names; None: ``cuda-ipc`` and ``eglstream``, those
        of them that can serve this pool). A pool is one kind of memory, and a publisher offers only
        transports that can serve it: ``cuda-vmm`` makes the pool memory shared by file descriptor
        (docs/security.md), which neither ``cuda-ipc`` nor ``eglstream`` can serve, so it is offered
        alone; ``cuda-ipc`` needs ``layout="pitch"`` and a discrete GPU; ``eglstream`` needs
        ``max_pool >= 2``.
        Transports named that break this raise :class:`eglcuda.UsageError` saying which to name
        instead; a subscriber asking for a transport not offered is refused with the reason.

    One thread at a time calls :meth:`next_frame` / :meth:`publish` (they take a lock).
    """

    def __init__(self, name: str, width: int, height: int, format: ColorFormat | str = "NV12",
                 layout: Layout | str = "pitch", fps: float | None = None, pool: int = 8, device: Any = 0,
                 every_timeout: float = 1.0, access: str = "user", path: str | os.PathLike[str] | None = None, *,
                 max_pool: int = protocol.MAX_POOL, handshake_timeout: float = 5.0,
                 transports: Sequence[str] | None = None, _backend: PublisherBackend | None = None) -> None:
        self.name = naming.check_name(name)
        fmt = color_format(format)
        width, height = check_size(width, height, fmt)
        layout = layout_of(layout)
        if fps is not None and (not isinstance(fps, numbers.Real) or isinstance(fps, bool) or not 0 < fps <= 1e6):
            raise UsageError(f"fps is a positive number (or None), got {shown(fps)}")
        counts = []
        for label, value in (("pool", pool), ("max_pool", max_pool)):
            count = as_int(value)
            if count is None or not 1 <= count <= protocol.MAX_POOL:
                raise UsageError(f"{label} is an int in 1..{protocol.MAX_POOL}, got {shown(value)}")
            counts.append(count)
        pool, max_pool = counts
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
        # Who may subscribe (None: anyone): this user, and with 'group' this process's group (a
        # peer's supplementary groups count too).
        self._policy = None if access == "all" else Policy(None, (os.getegid(),) if access == "group" else (), False)
        self.fps = None if fps is None else float(fps)
        self.max_pool = max_pool
        # What a real publisher offers (the transports registry's rule), before anything is made.
        offer = offer_transports(transports, layout, max_pool) if _backend is None else None
        self.path = naming.socket_path(self.name, path, create=path is None)
        if not os.path.isdir(os.path.dirname(self.path) or "."):
            raise UsageError(f"the directory of {self.path} does not exist (a publisher makes its socket there)")
        self.instance = secrets.randbits(64)

        self._lock = threading.RLock()  # the publishing thread's: next_frame, publish, discard, close
        # Set once closed (close() began, or the teardown ran); the delivery's waits ask it.
        self._stop_flag = threading.Event()
        self._close_lock = threading.Lock()  # _close_started is set once
        self._forked = False  # set in a child made by fork() (see _forked)
        self._close_started = False  # _close_now ran (once: the exit hook and a put-off close may race)
        self._closer = 0  # the thread whose close() set _closed, while that call runs
        self._torn_down = threading.Event()  # set once everything is released (see close())
        self._files = TopicFiles(naming.lock_path(self.path), self.path)
        weakref.finalize(self, self._files.release)
        self._listener: socket.socket | None = None
        self._handshakes: dict[int, handshake.Handshake] = {}  # the service thread's (a forked child closes them)
        self._thread: threading.Thread | None = None
        self._service_poller: select.epoll | None = None  # the service thread's (it closes it as it ends)
        self._backend: PublisherBackend | None = None
        self._transports: dict[str, PublisherTransport] = {}
        self._pool: Pool | None = None
        self._delivery: Delivery | None = None
        self._stopping = False
        # A close() put off because its thread was inside a call holding _lock (a signal
        # handler): that call finishes it on its way out (value: its timeout).
        self._deferral = Deferral()
        self._next_id = 1
        self._id_lock = threading.Lock()
        self._seq = 0  # the next frame's sequence number: also how many were published
        self.refused = 0  # connections turned away by the access check (the handshake service counts)
        self._measured_fps: float | None = None
        self._last_publish = 0.0
        self._started = time.monotonic()
        try:
            self._files.claim(self.name)
            if _backend is None:
                assert offer is not None  # (made above whenever no backend was given)
                _backend = CudaPublisherBackend(device, offer)
            self._backend = _backend
            self._transports = {t.name: t for t in _backend.transports()}
            self._pool = Pool(_backend, (width, height, fmt, layout), max_pool, list(self._transports.values()),
                              owner=f"the pool of publisher {self.name!r}")
            for _ in range(pool):
                self._pool.grow()
            self.geometry = _backend.geometry(self._pool.slots[0].frame)
            # (No reference back to the publisher: a publisher dropped without close() is
            # collected, and its files released, as soon as the user lets go of it.)
            self._delivery = Delivery(self.name, self._pool, self.every_timeout, self._stop_flag.is_set,
                                      functools.partial(_closed_error, self.name))
            # What a frame call uses (None once closed, and in a forked child).
            self._hot: tuple[PublisherBackend, Pool, Delivery] | None = (_backend, self._pool, self._delivery)
            self._files.wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self._listener, self._files.bound = sockets.bind_listener(self.path, ACCESS_MODES[access])
            self._service_poller = select.epoll()
            self._thread = threading.Thread(target=handshake.serve,
                                            args=(weakref.ref(self), self._listener, self._files.wake[0],
                                                  self._handshakes, self._service_poller),
                                            name=f"eglcuda-topic-{self.name}", daemon=True)
            self._thread.start()
        except BaseException:
            self._teardown()
            raise
        _open.add(self)

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
                backend, pool, delivery = self._hot or self._parts()
                backend.stream_handle(cuda_stream)  # (a bad value fails here, before a slot is taken)
                # The subscribers' messages are read at least every millisecond, and whenever no
                # settled slot is free (publish reads a full queue's).
                delivery.poll_if_due()
                slot = delivery.free_slot(limit)
                if self._hot is None:  # closed by a signal handler during this call: the pool goes as it returns
                    pool.free.appendleft(slot)
                    raise self._closed_error()
                return pool.start_writing(slot)
        except BaseException as exc:
            stay_if_ended_by_exit(exc)  # (only for an object the exit hooks closed: nothing put off is left)
            raise
        finally:
            if self._deferral.thread:  # (a close put off: see close())
                self._finish_deferred_close()

    def discard(self, frame: Any) -> None:
        """Give back a frame from :meth:`next_frame` without publishing it. Streams it was handed to
        in this cycle (a DLPack consumer writing it, say) are waited for on the host first: the
        frame's next cycle starts with nothing of this one still running, or remembered."""
        try:
            with self._lock:
                backend, pool, _ = self._parts()
                slot = pool.take_written(
                    frame, "discard takes a frame from this publisher's next_frame() that was not published")
                try:
                    backend.forget_writes(frame)
                except BaseException:
                    pool.write_again(slot)  # (still the caller's: the discard may be tried again)
                    raise
                pool.published(slot)
        finally:
            if self._deferral.thread:  # (a close put off: see close())
                self._finish_deferred_close()

    def publish(self, frame: Any, cuda_stream: Any = None, payload: bytes = b"", timestamp_ns: int | None = None) -> int:
        """Publish ``frame`` (from :meth:`next_frame`) to every subscriber; returns its sequence
        number. ``cuda_stream`` is where the work writing it was queued (None: the legacy default
        stream): subscribers read after that work, and after the work of every stream the frame
        was handed to while written (a DLPack consumer's: docs/ordering.md), without a host wait
        here (CUDA IPC) or with the driver's wait (EGLStream). ``payload`` (at most 16 KiB) and
        ``timestamp_ns`` (default: now, ``CLOCK_MONOTONIC``, comparable across the host's
        processes) travel with the frame.

        An ``every`` subscriber whose queue is full is waited for up to ``every_timeout``, then
        dropped; a ``latest`` subscriber at its credit is skipped (and told so). A ``cuda_stream``
        the driver refuses (destroyed, or another GPU's) raises its :class:`eglcuda.CUDAError`
        here, and the subscribers that had not got the frame do not get it; none is dropped. An
        error raised before the frame is handed out (bad arguments) leaves it yours, to publish or
        :meth:`discard`; once the hand-out began, the frame goes back to the pool by itself."""
        payload, timestamp_ns = _frame_metadata(payload, timestamp_ns)
        try:
            with self._lock:
                backend, pool, delivery = self._hot or self._parts()
                slot = pool.take_written(frame, "publish takes a frame from this publisher's next_frame(), once")
                try:
                    stream = None if cuda_stream is None else backend.stream_handle(cuda_stream)
                    # Streams the frame was handed to while written (a DLPack consumer's) join the
                    # publish stream: subscribers read after their work too (docs/ordering.md).
                    backend.order_writes(frame, stream)
                    # next_frame() read the subscribers' messages; what came since is read where it
                    # matters: for a full 'every' queue (wait_for_room) or 'latest' one (deliver).
                    if delivery.joined:
                        delivery.adopt()  # a late joiner starts at this frame
                    delivery.wait_for_room()
                except BaseException:
                    pool.write_again(slot)
                    raise
                seq = self._seq
                self._seq += 1
                slot.seq = seq
                slot.published_at = time.monotonic()
                # The slot stays WRITING while it is handed out: a subscriber dropped meanwhile
                # frees what it held, and must not free this slot before the others got it.
                try:
                    delivery.deliver(slot, seq, timestamp_ns, payload, stream)
                except BaseException:
                    if not slot.holders:
                        # Nobody got it (the driver refused the stream before the first hand-out,
                        # say): the number stays free, or each subscriber would count a frame
                        # that never was as skipped.
                        self._seq = seq
                    raise
                finally:
                    # (also when the delivery was cut short, by a KeyboardInterrupt say: those
                    # that got the frame hold the slot, and it is free once they let it go)
                    pool.published(slot)
                self._measure(slot.published_at)
                return seq
        except BaseException as exc:
            stay_if_ended_by_exit(exc)  # (only for an object the exit hooks closed: nothing put off is left)
            raise
        finally:
            if self._deferral.thread:  # (a close put off: see close())
                self._finish_deferred_close()

    def publish_from(self, source: Any, cuda_stream: Any = None, payload: bytes = b"",
                     timestamp_ns: int | None = None, timeout: float | None = None) -> int:
        """Copy ``source`` into a pool frame and publish it; returns the sequence number.

        ``source``: a frame (anything with ``planes``, e.g. an :class:`eglcuda.Frame` or an
        acquired frame), one array per plane with ``__cuda_array_interface__`` (CuPy, PyTorch,
        Numba) or NumPy (host) arrays, or for formats whose planes have equal row sizes (NV12) a
        single array of all planes' rows one after the other (a decoder's ``(H*3/2, W)``
        output). Device copies are queued on ``cuda_stream``; host arrays are copied before this
        returns. A source of another size or color format than the topic's is refused."""
        payload, stamp = _frame_metadata(payload, timestamp_ns)  # (checked before a pool frame is taken)
        if timestamp_ns is not None:
            timestamp_ns = stamp  # (None stays None: the stamp is taken as publish() starts)
        fmt = getattr(source, "format", None)
        if isinstance(fmt, ColorFormat) and fmt is not self.geometry.format:
            raise UsageError(f"the source is {fmt.name}, the topic's frames {self.geometry.format.name}: "
                             "publish_from copies bytes, it does not convert colors")
        frame = self.next_frame(timeout, cuda_stream)
        try:
            copy_into(frame, source, cuda_stream)
        except BaseException:
            self.discard(frame)
            raise
        try:
            return self.publish(frame, cuda_stream, payload, timestamp_ns)
        except BaseException:
            # Refused before its hand-out (a bad payload, say), the frame is still taken from the
            # pool, by nobody the caller knows: it goes back. (Once the hand-out began it went back
            # by itself, and discard says so.)
            try:
                self.discard(frame)
            except (UsageError, ClosedError):
                pass
            raise

    def _measure(self, now: float) -> None:
        interval = now - self._last_publish
        if self._last_publish and interval > 0:
            rate = 1.0 / interval
            self._measured_fps = rate if self._measured_fps is None else (
                self._measured_fps + _MEASURE_ALPHA * (rate - self._measured_fps))
        self._last_publish = now

    # ---- admission: what the handshake service asks (handshake.Admission) ----------------------
    @property
    def stopping(self) -> bool:
        return self._stopping

    def access_refusal(self, peer: sockets.Peer) -> str | None:
        why = None if self._policy is None else self._policy.refusal(peer)
        return None if why is None else f"{why}, access={self.access!r}"

    def choose_transport(self, hello: protocol.Hello, peer_pid: int) -> tuple[PublisherTransport | None, list[str]]:
        reasons: list[str] = []
        pool, backend = self._pool, self._backend
        if pool is None or backend is None:  # pragma: no cover - the service starts once the pool is made
            return None, ["the publisher is closing"]
        for wish in hello.wishes:
            transport = self._transports.get(wish)
            if transport is None:
                reasons.append(f"{wish}: {backend.not_offered(wish)}")
                continue
            try:
                why = transport.refusal(hello, peer_pid) or pool.refusal(transport)
            except EglCudaError as exc:
                why = str(exc)
            if why is None:
                return transport, reasons
            reasons.append(f"{wish}: {why}")
        return None, reasons

    def welcome(self, hello: protocol.Hello, transport: PublisherTransport) -> protocol.Welcome:
        g = self.geometry
        fps = self.fps if self.fps is not None else (self._measured_fps or 0.0)
        return protocol.Welcome(publisher_pid=os.getpid(), instance=self.instance, width=g.width, height=g.height,
                                format=int(g.format), layout=0 if g.layout is Layout.PITCH else 1, pitch=g.pitch,
                                plane_offsets=g.plane_offsets, fps=min(float(fps), 1e6), pool=self.pool_size,
                                next_seq=self._seq, transport=transport.name, topic=self.name,
                                extra=transport.welcome_extra(hello))

    def status(self) -> dict[str, Any]:
        delivery = self._delivery
        if delivery is not None:
            delivery.reap_joined()
        subs = [] if delivery is None else [s for s in list(delivery.subs) if s.alive] + list(delivery.joined)
        g = self.geometry
        return {
            "version": registry.STATUS_VERSION, "name": self.name, "pid": os.getpid(), "uid": os.geteuid(),
            "instance": f"{self.instance:016x}", "width": g.width, "height": g.height, "format": g.format.name,
            "layout": g.layout.value, "pitch": g.pitch, "fps": self.fps, "measured_fps": self._measured_fps,
            "pool": self.pool_size, "max_pool": self.max_pool, "published": self.published, "access": self.access,
            "transports": sorted(self._transports), "subscribers_total": len(subs),
            "dropped": 0 if delivery is None else delivery.drop_count,
            "subscribers": [asdict(s.info()) for s in subs[: registry.MAX_LISTED]],
            "uptime_s": time.monotonic() - self._started,
        }

    def admit(self, sock: socket.socket, peer: sockets.Peer, hello: protocol.Hello, link: PublisherLink,
              transport: PublisherTransport) -> None:
        delivery = self._delivery
        with self._id_lock:
            ident = self._next_id
            self._next_id += 1
        sub, fds = new_member(ident, sock, peer, hello, link, transport.name)  # (fds: READY's, closed below)
        if delivery is None:  # pragma: no cover - the service stops before the delivery goes
            link.close()
            sock.close()
            return sockets.close_fds(fds)
        delivery.reap_joined()  # (those that died waiting for an idle publisher to take them in)
        # READY goes out while the subscriber is handed over, under the lock the publishing thread
        # adopts with: once the subscriber reads READY the next publish includes it, and no frame can
        # reach it before READY.
        with delivery.join_lock:
            delivery.joined.append(sub)  # first: the publishing thread looks at the list without the lock
            try:
                sockets.send(sock, protocol.encode(protocol.Ready(link.ready_extra())), fds)
            except OSError:
                delivery.joined.remove(sub)
                link.close()
                sock.close()
            finally:
                sockets.close_fds(fds)

    # ---- state -----------------------------------------------------------------------------------
    @property
    def info(self) -> TopicInfo:
        """The topic as a subscriber's WELCOME describes it (size, format, layout, pitch, fps or
        the rate measured so far, pool size, this publisher's pid and instance, the next seq)."""
        g = self.geometry
        return TopicInfo(name=self.name, path=self.path, width=g.width, height=g.height, format=g.format,
                         layout=g.layout, pitch=g.pitch, fps=self.fps if self.fps is not None else self._measured_fps,
                         pool=self.pool_size, publisher_pid=os.getpid(), instance=self.instance, transport=None,
                         next_seq=self._seq)

    @property
    def subscribers(self) -> list[SubscriberInfo]:
        """The subscribers connected now (those whose handshake just finished are adopted at the
        next :meth:`next_frame` / :meth:`publish`, and listed from then on). Asked on another
        thread while one of those waits (for a pool frame, or for an ``every`` subscriber), it
        answers at once with what is known, as the status of ``python -m eglcuda topics`` does."""
        if self._forked:
            raise self._forked_error()  # (a read here would take the parent's messages)
        if not self._lock.acquire(blocking=False):
            # The publishing thread is in a frame call, which may wait every_timeout: waiting for
            # its lock would stall a monitoring thread that long. Its sockets are its to read.
            delivery = self._delivery
            return [] if delivery is None or self._closed else [s.info() for s in list(delivery.subs) if s.alive]
        try:
            try:
                delivery = self._delivery
                if delivery is None:
                    return []
                if not self._closed:
                    if delivery.joined:
                        delivery.adopt()
                    if delivery.subs:
                        delivery.poll(0.0)  # what they sent since: goodbyes, ended connections
                return [s.info() for s in delivery.subs if s.alive]
            finally:
                self._lock.release()
        finally:
            if self._deferral.thread:  # (a close put off: see close())
                self._finish_deferred_close()

    @property
    def dropped(self) -> list[DropRecord]:
        """The latest (up to 256) subscribers this publisher dropped or lost, with the reasons."""
        return [] if self._delivery is None else list(self._delivery.dropped)

    @property
    def published(self) -> int:
        """How many frames were published (the next frame's sequence number)."""
        return self._seq

    @property
    def pool_size(self) -> int:
        """Pool frames made so far: ``pool`` at start, grown up to ``max_pool`` when none was free."""
        return 0 if self._pool is None else len(self._pool)

    @property
    def measured_fps(self) -> float | None:
        """The publish rate measured so far (frames/s, smoothed); None before the second publish."""
        return self._measured_fps

    @property
    def closed(self) -> bool:
        return self._stop_flag.is_set()

    @property
    def _closed(self) -> bool:
        return self._stop_flag.is_set()

    def _parts(self) -> tuple[PublisherBackend, Pool, Delivery]:
        """The parts, for a frame call of an open publisher (``_hot``), else the error saying why not."""
        if self._forked and not self._closed:
            raise self._forked_error()
        if self._hot is None or self._closed:
            raise self._closed_error()
        return self._hot

    def _forked_error(self) -> UsageError:
        return UsageError(f"the publisher of topic {self.name!r} belongs to the process that made it: in a forked "
                          "child it may only be closed (its subscribers' connections are the parent's)")

    def _closed_error(self) -> ClosedError:
        return _closed_error(self.name)

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
            if not self._deferral and not self._close_started:
                self._close_now(wait)  # a close interrupted before its work began: done here
            # Another thread's close is under way, or one put off by a signal handler on the
            # thread in next_frame()/publish() (its call ends within about 50 ms).
            _wait_for(self._torn_down, wait + 1.0)
            return
        self._hot = None  # (first: a frame call in a signal handler's thread sees it at once)
        self._stop_flag.set()
        self._closer = me  # (while this call runs: a handler's close() on this thread returns at once)
        try:
            if os.getpid() != self._files.pid:
                _open.discard(self)
                self._forget_in_child()
                return
            if self._lock._is_owned():  # type: ignore[attr-defined]
                # Called on a thread that is inside next_frame(), publish() or discard() (a signal
                # handler): closing here would free the pool and the subscribers under that call.
                # It goes on (a wait in it ends with ClosedError), and closes the topic as it returns.
                self._deferral.put_off(wait)
                return
            self._close_now(wait)
            _wait_for(self._torn_down, wait + 1.0)  # (at once, unless another thread's close() began it first)
        finally:
            self._closer = 0

    def _finish_deferred_close(self) -> None:
        """Finish a close() this thread put off, once it holds the lock no more (a nested call
        leaves it to the outer one). Other threads leave it alone: the lock is this thread's."""
        if self._deferral.mine() and not self._lock._is_owned():  # type: ignore[attr-defined]
            try:
                self._close_now(self._deferral.value)  # type: ignore[arg-type]
            finally:
                self._deferral.take()

    def _close_now(self, wait: float) -> None:
        """close()'s work, once (see _close_started)."""
        if os.getpid() != self._files.pid:  # (the exit hook of a forked child: the topic is the parent's)
            _open.discard(self)
            self._forget_in_child()
            return
        with self._close_lock:
            if self._close_started:
                return
            self._close_started = True
        try:
            _open.discard(self)
            with self._lock:
                try:
                    if self._delivery is not None:
                        self._delivery.closing = True  # (before the service stops: a leaving subscriber has left)
                    self._stop_service()
                    if self._delivery is not None:
                        self._delivery.say_goodbye(wait, os.getpid())
                finally:
                    # (also when the goodbye or the service's stop was cut short, by Ctrl-C say:
                    # else the topic's connections, lock, socket and pool stayed held while the
                    # process lived, and no later close() would let them go)
                    if self._delivery is not None:
                        self._delivery.drop_all()
                    self._teardown()
        finally:
            self._torn_down.set()

    def _forget_in_child(self) -> None:
        """close() in a child made by fork(): the topic, its subscribers and its pool are the
        parent's. Close this process's copies of the descriptors; say nothing to anyone, remove no
        file, free no memory (nor call CUDA, which a forked child must not)."""
        # Closed without reading or shutting down: these connections are the parent's (a read
        # here would take its messages, a change of flags would change its sockets).
        if self._delivery is not None:
            self._delivery.forget()
        if self._listener is not None:
            self._listener.close()
        handshake.forget(self._handshakes)
        if self._service_poller is not None:  # (the parent's thread has its own copy)
            self._service_poller.close()
        if self._pool is not None:
            self._pool.forget()
        self._listener, self._backend = None, None
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
        """Release everything in reverse order of __init__ (also after a failed construction)."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        sockets.remove_if_same(self.path, self._files.bound)
        self._files.bound = None
        if self._pool is not None:  # (its frames come from the backend, still open here)
            self._pool.free_all(self.name)
        if self._backend is not None:
            try:
                self._backend.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("topic %s: closing the transports failed: %s", self.name, exc)
        if self._delivery is not None:
            self._delivery.close_epoll()
        if self._service_poller is not None and (self._thread is None or not self._thread.is_alive()):
            self._service_poller.close()  # (a thread that never started; closing twice is fine)
        self._files.release()
        self._hot = None
        self._stop_flag.set()
        self._torn_down.set()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        subs = 0 if self._delivery is None else len(self._delivery.subs)
        state = "closed" if self._closed else f"{subs} subscriber(s), {self.published} published"
        return f"<Publisher {self.name!r}: {state}>"


def _frame_metadata(payload: Any, timestamp_ns: Any) -> tuple[bytes, int]:
    """``publish``'s payload and time stamp, checked (the time stamp: now when None)."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise UsageError(f"payload is bytes, got {type(payload).__name__}")
    try:
        payload = bytes(payload)
    except ValueError as exc:  # (a released memoryview)
        raise UsageError(f"payload cannot be read: {exc}") from None
    if len(payload) > protocol.MAX_PAYLOAD:
        raise UsageError(f"payload is at most {protocol.MAX_PAYLOAD} bytes, got {len(payload)}")
    if timestamp_ns is None:
        return payload, time.monotonic_ns()
    stamp = as_int(timestamp_ns)  # (a NumPy integer too, read from an array of timestamps)
    if stamp is None or not 0 <= stamp < 2**64:
        raise UsageError(f"timestamp_ns is an int in 0..2**64-1, got {shown(timestamp_ns)}")
    return payload, stamp


def _closed_error(name: str) -> ClosedError:
    return ClosedError(f"the publisher of topic {name!r} is closed")


def _wait_for(event: threading.Event, seconds: float) -> None:
    """Wait for ``event`` up to ``seconds`` (any number >= 0, inf included: beyond what a
    thread's wait takes, without limit)."""
    event.wait(seconds if seconds < threading.TIMEOUT_MAX else None)


# ---- fork and exit ------------------------------------------------------------------------------------

def _forked(publisher: Publisher) -> None:
    # In a child made by fork(), every publisher is the parent's: its frame calls refuse (they
    # would read and write the parent's subscriber connections), close() lets go of the child's
    # copies only. Its locks are new: another thread of the parent may have held one at the fork.
    publisher._forked = True
    publisher._hot = None
    publisher._lock = threading.RLock()
    publisher._id_lock = threading.Lock()
    publisher._close_lock = threading.Lock()
    if publisher._delivery is not None:
        publisher._delivery.join_lock = threading.Lock()
    # The child's copies of the lock, the listening socket and the subscribers' connections go
    # now, not at its close(): a child that outlives the parent (a worker) would keep the topic
    # locked and the connections open, so a SIGKILLed publisher could be neither seen gone by
    # its subscribers nor started again.
    publisher._forget_in_child()


def _close_at_exit(publisher: Publisher) -> None:
    if publisher._closed:  # a close put off, whose thread never returned to finish it
        publisher._close_now(0.2)
    else:
        publisher.close(timeout=0.2)


_open: Tracked[Publisher] = Tracked(_forked, _close_at_exit)
