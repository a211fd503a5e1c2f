"""The remote end of a topic: :class:`RemoteFeed`, what an :class:`eglcuda.Subscriber` made with
``remote="HOST:PORT"`` receives through (the topics layer makes it, importing this module only
then), and :class:`RemoteSubscriber`, the name for such a subscriber.

A feed joins through a relay (relay.py) over UCX and owns a :class:`~.receiver.Receiver` for
each joined connection, a pool of frames on its own GPU, and the messages it handed out.

Threads: the shared UCX engine (_ucx.py; its side is receiver.py) receives each frame into a
page-locked host buffer of the window (the relay sends only as many frames as this side gave
credit for) and, on its own thread, queues the frame's copy host -> device into a free pool slot
(:meth:`RemoteFeed.copy_in`) on a copy stream that first waits for the slot's release event
(recorded on the releasing thread after every reader of the slot, docs/ordering.md) and records
the slot's event and the window buffer's after it; the host buffer goes back to the relay, with
its credit, as soon as its event says the copy is done. :meth:`RemoteFeed.receive` (the user's
thread) takes the next frame, waits for its copy (a frame that found no free slot on arrival is
copied now) and hands out a :class:`eglcuda.topics.SlotView` of the slot.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import ipaddress
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Iterable, NoReturn


from .._bind import cuda
from ..errors import ClosedError, EglCudaError, Refused, StreamDisconnected, Timeout, UsageError
from ..frames.formats import Layout
from ..cuda_device import CudaDevice
from ..frames.frame import Frame
from ..frames.interop import stream_handle
from ..topics import protocol, sockets
from ..topics.info import TopicInfo
from ..topics.message import Message, let_go
from ..topics.protocol import Qos
from ..topics.readiness import Readiness
from ..topics.subscriber import LOOK_WAIT_S, Subscriber, _acquire, closed_error, forked_error, hold_limit_error, take_turn
from ..topics.transports import CudaSubscriberBackend
from ..topics.transports.base import UNMAP_WAIT_S, Geometry
from ..topics.transports.views import SlotView, _ViewSpec, join_readers
from . import _ucx, keys, session, wire
from .buffers import Pinned
from .receiver import LONGEST_WAIT_S, NO_SLOT, Receiver, Terms, join
from .session import frame_mode
from .wire import NO_PUBLISHER, parse_address

log = logging.getLogger("eglcuda.remote")
_RETRY_S = 0.1  # between attempts to join a relay that has no publisher yet


class _NoFreeSlot(Exception):
    """No pool slot is free for a frame that arrived (exceptions interrupted receives halfway)."""


class RemoteSubscriber(Subscriber):
    """A subscriber of topic ``name`` through the relay at ``remote`` (``"HOST:PORT"``), on
    another host or this one: ``eglcuda.Subscriber(name, remote=...)``, with ``remote`` required.

    Everything is as for a local subscriber (:meth:`receive`, iteration, ``qos``, ``queue``,
    :meth:`wait_for_publisher`, :meth:`fileno`, :meth:`close`), and frames are
    :class:`eglcuda.topics.SlotView` views of this subscriber's own pool on ``device``
    (``info.transport`` is ``"remote"``). Each frame is copied into that pool as it arrives, and
    the relay hears at once that its buffer came free: a ``latest`` subscriber takes the topic's
    frames as fast as its link allows whether or not :meth:`receive` is called, and a receive
    returns the newest. ``frames``: the least frame protection accepted
    (``"plain"``, ``"integrity"`` or ``"encrypted"``: a relay that sends less is refused; the
    relay decides, docs/security.md). ``key``: the relay's pre-shared key (None: from
    ``EGLCUDA_REMOTE_KEY_FILE`` or ``EGLCUDA_REMOTE_KEY``). Raises :class:`eglcuda.Refused` when
    the relay refused it (a wrong key, another topic), :class:`eglcuda.Timeout` when no relay
    with a publisher answered in ``timeout`` seconds, :class:`eglcuda.Unsupported` without
    ucxx. ``path``, ``transport`` and ``trusted_uids`` are the relay's business and are
    ignored; ``gl_context`` is refused."""

    def __init__(self, name: str, qos: str = "latest", queue: int = 4, device: Any = 0, timeout: float = 5.0,
                 path: Any = None, transport: str = "auto", gl_context: Any = None, *,
                 cuda_stream: Any = None, trusted_uids: int | Iterable[int] | str | None = None,
                 busy_wait: float = 20e-6, remote: str | None = None, key: bytes | None = None,
                 frames: str | None = None) -> None:
        if remote is None:
            raise UsageError("a RemoteSubscriber needs remote='HOST:PORT' (the relay's address)")
        super().__init__(name, qos, queue, device, timeout, path, transport, gl_context, cuda_stream=cuda_stream,
                         trusted_uids=trusted_uids, busy_wait=busy_wait, remote=remote, key=key, frames=frames)


class RemoteFeed:
    """The frames of topic ``name`` through the relay at ``remote``, for the
    :class:`eglcuda.Subscriber` that holds it (its arguments checked there; see
    :class:`RemoteSubscriber` for what they mean here)."""

    def __init__(self, name: str, qos: Qos, queue: int, device: Any, timeout: float, gl_context: Any,
                 cuda_stream: Any, remote: str, key: bytes | None, frames: str | None) -> None:
        self.name = name
        mode = frame_mode("plain" if frames is None else frames)
        if gl_context is not None:
            raise UsageError("a remote subscriber receives into CUDA memory: gl_context is not possible with remote=")
        self.remote = parse_address(remote, "remote")
        if ":" in self.remote[0]:
            raise UsageError(f"remote: {self.remote[0]!r} is an IPv6 address, and a relay takes IPv4 connections only "
                             "(UCXX's listener binds 0.0.0.0): give the relay's IPv4 address or host name")
        self.qos = qos
        self.timeout = timeout
        _ucx.require()  # (what to install is the first thing to say)
        session.require()
        _ucx.check_fork()
        self._terms = Terms(name, qos, queue, timeout, self.remote, mode, keys.load_key(key))
        self.path = f"ucx://{remote}"
        self._closed = False
        self._closing = False
        self._wake = threading.Event()  # set by close(): ends a wait to join again
        self._joining: concurrent.futures.Future[Any] | None = None  # a handshake in progress
        self._pid = os.getpid()
        self._busy = threading.RLock()
        self._close_put_off = False  # a close() from a signal handler on a thread holding _busy: see close()
        self._state = threading.RLock()
        self._held: set[Message] = set()
        self._last_seq: int | None = None
        self._lost: BaseException | None = None
        self._link: Receiver | None = None
        self._pool: list[Frame] = []
        self._views: list[SlotView] = []
        self._free_slots: collections.deque[int] = collections.deque()
        self._spec: _ViewSpec | None = None
        self._copy_stream: int | None = None
        self._slot_events: list[int] = []  # one per pool slot: recorded after the H2D copy into it
        self._released_events: list[int] = []  # one per pool slot: recorded at its release, after its readers
        self._window_events: list[int] = []  # one per window buffer: recorded after the H2D copy from it
        # Each window buffer's H2D copy parameters per plane, made at its first frame (under
        # _state): a frame fills in only the pool slot it lands in. For one window (one link).
        self._plans: dict[int, list[Any]] = {}
        self._plans_window: Any = None
        self._copy_arg: Any = None
        self._hold_limit = 0  # messages the user may hold at once
        self._orphaned = False  # its Subscriber was collected: closed once no message is held
        self.info: TopicInfo | None = None
        self._backend = CudaSubscriberBackend(device, None, cuda_stream)
        if self._backend.device is None:  # pragma: no cover - a CUDA subscriber always has one
            raise UsageError("a remote subscriber needs a CUDA device")
        self._device: CudaDevice = self._backend.device
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: Readiness | None = None  # fileno()'s eventfd, made by its first call
        try:
            self._loop = _ucx.acquire()
            self._device.make_current()
            self._copy_stream = cuda.stream_create(non_blocking=True)
            self._copy_arg = cuda.stream_arg(self._copy_stream)
            # (The join's time counts from here: the first remote subscriber of a process also
            # imports UCXX and starts its engine, a once-a-process cost that would leave a short
            # timeout, one meant for the relay's silence, no time to join at all.)
            self._connect(time.monotonic() + timeout, timeout)
        except BaseException:
            self._closed = True
            self._teardown()
            raise
        _ucx.track(self)

    # ---- joining ----------------------------------------------------------------------------------
    def _connect(self, deadline: float, waited: float) -> None:
        """Join through the relay by ``deadline``, retrying while it has no publisher (``waited``:
        the whole time given, for the Timeout's words)."""
        # The relay's IPv4 address, looked up here, not on the engine's thread (where UCXX would
        # look a name up, holding every other link of the process meanwhile, and take an IPv6
        # address the relay does not listen on); again at each join, as a name may move.
        # (None only past the deadline, or once close() woke the lookup)
        address = _ipv4_address(self.remote[0], deadline, self._wake)
        last = "no answer" if address is not None else f"the host name {self.remote[0]!r} did not resolve in time"
        while True:
            if self._closing:
                raise self._closed_error()
            left = deadline - time.monotonic()
            if left <= 0 or address is None:
                raise Timeout(f"no relay of topic {self.name!r} with a publisher answered at "
                              f"{self._terms.where} within {waited:.3g} s ({last}; a relay of "
                              f"another protocol version does not answer either)")
            loop = self._loop
            assert loop is not None
            joining = asyncio.run_coroutine_threadsafe(join(self._terms, address), loop)
            self._joining = joining
            if self._closing:  # (close() came between its check and this join: it may not have seen it)
                joining.cancel()
            try:
                ep, welcome = joining.result(min(left, LONGEST_WAIT_S))
            except concurrent.futures.TimeoutError:
                joining.cancel()
                last = "no answer"
                continue
            except concurrent.futures.CancelledError:  # close() from another thread
                raise self._closed_error() from None
            except Refused as exc:
                # (a relay without a publisher, or closing, may have one, or a successor, within the deadline)
                if exc.code not in (NO_PUBLISHER, protocol.Reason.CLOSING):
                    raise
                last = exc.reason
                self._wake.wait(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
                continue
            except StreamDisconnected as exc:  # the connection failed: retry until the deadline
                last = str(exc)
                self._wake.wait(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
                continue
            finally:
                self._joining = None
            if self._closing:  # (joined as close() came)
                loop.call_soon_threadsafe(ep.abort)
                raise self._closed_error()
            break
        try:
            self._attach(ep, welcome)
        except BaseException:
            loop.call_soon_threadsafe(ep.abort)  # (UCX calls on the engine's thread only)
            raise

    def _attach(self, ep: Any, welcome: wire.Welcome) -> None:
        """Make the pool and the window's host buffers for ``welcome``'s frames; start reading."""
        # (A 'latest' pool has a slot more than it may hold: the frame arriving next lands in
        # it while the newest that arrived waits to be taken.)
        self._hold_limit = self._terms.queue if self.qos is Qos.EVERY else protocol.LATEST_HOLD
        limit = self._hold_limit + (1 if self.qos is Qos.LATEST else 0)
        spec_key = (welcome.width, welcome.height, welcome.format)
        if self._spec is None or (self._spec.geometry.width, self._spec.geometry.height,
                                  self._spec.geometry.format) != spec_key or len(self._pool) != limit:
            self._free_pool()
            for _ in range(limit):
                self._pool.append(Frame.allocate(welcome.width, welcome.height, welcome.format, Layout.PITCH,
                                                 self._device))
            first = self._pool[0]
            base = first.planes[0].pointer
            offsets = tuple(plane.pointer - base for plane in first.planes)
            self._spec = _ViewSpec(Geometry(first.width, first.height, first.format, Layout.PITCH, first.pitch,
                                            offsets))
        self._free_slots = collections.deque(range(len(self._pool)))
        window = Pinned(self._device, welcome.window, wire.message_bytes(welcome.frame_bytes),
                        "a remote subscriber's receive window")
        loop = self._loop
        assert loop is not None
        link = Receiver(ep, window, self._terms, loop, self)
        link.watch(self._ready)
        self._link = link
        self._lost = None
        self._last_seq = None
        geometry = self._spec.geometry
        self.info = TopicInfo(self.name, self.path, geometry.width, geometry.height, geometry.format, Layout.PITCH,
                              geometry.pitch, welcome.fps, welcome.pool, welcome.publisher_pid, welcome.instance,
                              "remote", welcome.next_seq)
        asyncio.run_coroutine_threadsafe(link.start(), loop).result(5)

    # ---- receiving --------------------------------------------------------------------------------
    def receive(self, timeout: float | None = None) -> Message:
        """As :meth:`eglcuda.Subscriber.receive`; the frame was copied into this subscriber's
        pool before it returns. A relay that lost its publisher, closed, or was cut off raises
        :class:`eglcuda.StreamDisconnected` (:class:`eglcuda.Dropped` with the reason when it
        said why); :meth:`wait_for_publisher` joins again."""
        if os.getpid() != self._pid:
            raise self._forked_error()
        wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)
        if self._closing or self._closed:  # (a close() on another thread holds the lock meanwhile)
            raise self._closed_error()
        # (another thread inside receive() or wait_for_publisher() is waited for within this
        # call's own time, not as long as that call waits: an event loop's receive(0) too)
        left = take_turn(self._busy, wait, self.name)
        message: Message | None = None
        try:
            message = self._receive_locked(left)
        finally:
            try:
                try:
                    if self._ready is not None:
                        self._refresh_ready()
                finally:
                    self._turn_over()
            except BaseException:
                # (a KeyboardInterrupt on the way out, say: the caller never gets the message, so
                # it is not held, and its slot goes back)
                if message is not None:
                    message.release()
                raise
        if self._closed:  # (closed on the way out: a close() a signal handler put off, which let go of it)
            raise self._closed_error()
        return message

    def _receive_locked(self, wait: float) -> Message:
        if self._closing or self._closed:
            raise self._closed_error()
        link = self._link
        if link is None or self._lost is not None:
            if self._lost is not None:  # (the same exception each time: without the traceback it gathered)
                raise self._lost.with_traceback(None)
            raise StreamDisconnected(f"not connected to topic {self.name!r}")
        if len(self._held) >= self._hold_limit:
            raise hold_limit_error(len(self._held))
        arrival = link.take(time.monotonic() + wait, wait, lambda: self._closing)
        if arrival is None:
            raise self._closed_error()
        if isinstance(arrival, BaseException):
            self._lose(arrival)
        seq, timestamp_ns, payload, index, slot = arrival
        try:
            return self._deliver(link, seq, timestamp_ns, payload, index, slot)
        except _NoFreeSlot:
            # (only after exceptions interrupted receives halfway: the join is over, and
            # wait_for_publisher makes a new one, with every slot free)
            self._lose(StreamDisconnected(f"topic {self.name!r}: no pool slot is free for the next frame; join "
                                          "again (wait_for_publisher)"))

    def _deliver(self, link: Receiver, seq: int, timestamp_ns: int, payload: bytes, index: int,
                 slot: int) -> Message:
        if slot == NO_SLOT:  # (not copied on arrival: copied now, into a slot free by then, see Receiver)
            try:
                with self._state:
                    if not self._free_slots:  # (only after an exception interrupted a receive halfway)
                        raise _NoFreeSlot()
                    slot = self._free_slots.popleft()
                    try:
                        event, read = self._copy_into(link, index, slot)
                    except BaseException:
                        self._free_slots.appendleft(slot)
                        raise
            except BaseException:
                link.give_back(index)  # (outside the lock: the receiver's is never taken inside it)
                raise
            finally:
                link.landed()
            # The engine gives the buffer back (its credit to the relay) once the copy is done, not
            # after this thread woke from its wait and handed it over.
            link.give_back_when(index, lambda: self._copied(read))
        else:
            event = self._slot_events[slot]
        view = self._views_of(slot)
        try:
            self._device.make_current()  # (this thread may never have touched the device: a reader thread's first receive)
            cuda.event_synchronize(event, "copying a remote frame into the subscriber's pool")
        except BaseException:
            with self._state:
                self._free_slots.appendleft(slot)
            raise
        skipped = 0 if self._last_seq is None else max(0, seq - self._last_seq - 1)
        self._last_seq = seq
        message = Message(self, view, protocol.Frame(seq, slot, timestamp_ns, 0, payload), skipped, None)
        with self._state:
            self._held.add(message)
        return message

    def _copy_into(self, link: Receiver, index: int, slot: int) -> tuple[int, int]:
        """Queue the copy of ``link``'s window buffer ``index`` into pool ``slot`` on the copy
        stream, after the slot's readers; the slot's event and the window buffer's, recorded
        after it (under _state; on any thread)."""
        copy = self._copy_stream
        spec = self._spec
        assert copy is not None and spec is not None
        base = self._pool[slot].planes[0].pointer
        self._device.make_current()
        # The slot's readers were joined, at its release, into an event recorded on the thread
        # that released it (a per-thread default stream names that thread's; docs/ordering.md).
        # Never recorded (a slot not read since the pool was made): no wait.
        released = self._event(self._released_events, slot)
        cuda.stream_wait_event(copy, released, "ordering a remote frame's copy after the slot's readers")
        window = link.window
        if window is not self._plans_window:
            self._plans, self._plans_window = {}, window
        plans = self._plans.get(index)
        if plans is None:
            plans = self._plans[index] = []
            at = window.address(index) + wire.DATA_AT
            for g in spec.planes:
                plans.append(cuda.host_copy_plan(at, g.row_bytes, g.height, to_host=False))
                at += g.row_bytes * g.height
        copy_arg = self._copy_arg
        for plan, g, offset in zip(plans, spec.planes, spec.geometry.plane_offsets):
            cuda.copy_host_planned(copy_arg, plan, base + offset, g.pitch)
        landed = self._event(self._slot_events, slot)
        cuda.event_record(landed, copy, "marking a remote frame's copy into the subscriber's pool")
        read = self._event(self._window_events, index)
        cuda.event_record(read, copy, "marking a remote frame's copy from the window")
        return landed, read

    @staticmethod
    def _event(events: list[int], index: int) -> int:
        """``events[index]``, made when first asked for (under _state)."""
        while len(events) <= index:
            events.append(cuda.event_create())
        return events[index]

    def copy_in(self, link: Receiver, index: int) -> tuple[int, Callable[[], bool]] | None:
        """(:class:`~.receiver.Landing`, on the engine's thread) Queue the copy of a frame that
        just arrived into a free slot: the slot and what says the copy ended, or None."""
        with self._state:
            if self._closing or self._link is not link or not self._free_slots:
                return None
            slot = self._free_slots.popleft()
            try:
                _, read = self._copy_into(link, index, slot)
            except EglCudaError as exc:  # (the user's thread copies it when it takes it, and hears why)
                self._free_slots.appendleft(slot)
                log.debug("remote topic %s: a frame's copy on arrival failed: %s", self.name, exc)
                return None
        return slot, lambda: self._copied(read)

    def unused(self, link: Receiver, slots: list[int]) -> None:
        """(:class:`~.receiver.Landing`) Slots copied into from ``link`` whose frames a 'latest'
        subscriber will not take: free again (their next copy is queued after this one on the
        copy stream)."""
        with self._state:
            if self._link is link:  # (a new link starts with every slot free)
                self._free_slots.extend(slots)

    def _copied(self, event: int) -> bool:
        """Whether the H2D copy from a window buffer before ``event`` is done (asked on the
        engine's thread, and on the user's when the link stops; a closed feed's copies ended
        before its events did)."""
        with self._state:
            if event not in self._window_events:
                return True
            self._device.make_current()
            return cuda.event_done(event, "asking whether a remote frame's copy is done")

    def _views_of(self, slot: int) -> SlotView:
        spec = self._spec
        assert spec is not None
        while len(self._views) <= slot:
            index = len(self._views)
            self._views.append(SlotView(spec, self._pool[index].planes[0].pointer, self._device,
                                        self._backend.cuda_stream, index))
        view = self._views[slot]
        # A new view object per message: a user's old reference must stay released.
        fresh = SlotView(spec, view._base, self._device, self._backend.cuda_stream, slot)
        self._views[slot] = fresh
        return fresh

    def _release(self, message: Message, cuda_stream: Any) -> None:
        """A message's release (:meth:`eglcuda.topics.Message.release`)."""
        if os.getpid() != self._pid:  # (a forked child's copy of the parent's: its lock may stay held)
            let_go(message)
            return
        stream = None if cuda_stream is None else stream_handle(cuda_stream)
        with self._state:
            if message._released:
                return
            message._released = True
            if self._ready is not None and len(self._held) >= self._hold_limit:
                self._ready.set()  # (quiet while all were held: the watcher looks again, and says what is there)
            self._held.discard(message)
            view = message._frame
            own = self._backend.cuda_stream
            if not self._closed and self._link is not None and own is not None:
                readers = view._handed_to
                try:
                    used = join_readers(view, own, stream)
                    self._mark_released(view.slot, used)
                except EglCudaError:
                    if not self._closing:
                        # The driver refused to order the release after the frame's readers
                        # (cuda_stream destroyed, say): freed, the slot would take the next frame's
                        # copy under them. As a local subscriber's: the message stays held, its
                        # view usable, and the error is the caller's. (A close lets go regardless.)
                        view._handed_to = readers
                        message._released = False
                        self._held.add(message)
                        raise
            view._released = True
            if self._link is not None and view.slot < len(self._pool):
                self._free_slots.append(view.slot)
            last = self._orphaned and not self._held
        if last:
            self._close_in_background()

    def _mark_released(self, slot: int, stream: int) -> None:
        """Record slot ``slot``'s release event on ``stream`` (where its readers were joined),
        on the releasing thread; its next copy waits for it (under _state)."""
        self._device.make_current()
        cuda.event_record(self._event(self._released_events, slot), stream, "marking a remote slot's release")

    def _lose(self, error: BaseException) -> NoReturn:
        self._lost = error
        self._let_go_held()
        self._drop_link()
        raise error

    def _let_go_held(self) -> None:
        """Make held messages unusable; their readers' streams join the subscriber's first: the
        pool outlives the link, and a slot's next copy waits only for the subscriber's stream."""
        own = self._backend.cuda_stream
        with self._state:
            for message in list(self._held):
                if own is not None and not message._released:
                    try:
                        self._mark_released(message._frame.slot, join_readers(message._frame, own, None))
                    except EglCudaError:  # (a failing driver: the pool goes with the next join)
                        pass
                let_go(message)
            self._held.clear()

    def _drop_link(self) -> None:
        with self._state:  # (copy_in refuses a link that is not this feed's any more)
            link, self._link = self._link, None
        if link is not None and not link.stop():
            log.warning("remote topic %s: a receive or a copy from the window did not end in 5 s: its window "
                        "buffers stay allocated", self.name)

    # ---- the publisher coming back ------------------------------------------------------------------
    def wait_for_publisher(self, timeout: float | None = None) -> TopicInfo:
        """As :meth:`eglcuda.Subscriber.wait_for_publisher`: join through the relay again (it
        waits for the topic's publisher itself) within ``timeout`` seconds."""
        wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)
        if os.getpid() != self._pid:
            raise self._forked_error()
        started = time.monotonic()
        if not _acquire(self._busy, wait):
            # Another thread's receive() held the subscriber all this time: it is connected.
            info = self.info
            if self.connected and info is not None:
                return info
            raise Timeout(f"no relay of topic {self.name!r} with a publisher answered at {self._terms.where} in time "
                          "(another thread was receiving)")
        try:
            if self._closed or self._closing:
                raise self._closed_error()
            try:
                if self._link is None or self._lost is not None or self._link.lost is not None:
                    self._let_go_held()
                    self._settle()
                    self._drop_link()
                    self._connect(started + wait, wait)
            finally:
                if self._ready is not None:
                    self._refresh_ready()
        finally:
            self._turn_over()
        info = self.info
        if info is None:  # pragma: no cover - every join sets it
            raise StreamDisconnected(f"not connected to topic {self.name!r}")
        return info

    # ---- waiting on many ------------------------------------------------------------------------
    def fileno(self, wait: float) -> int | None:
        """As :meth:`eglcuda.Subscriber.fileno`: an ``eventfd`` that the UCX engine's thread
        makes readable when a frame arrived or the link ended, and a receive that takes the last
        frame makes quiet. Made at the first call, waiting up to ``wait`` seconds for a receive
        of another thread to end first; None when it did not."""
        if os.getpid() != self._pid:
            raise self._forked_error()
        ready = self._ready
        if ready is not None:
            return ready.fileno()
        if not _acquire(self._busy, wait):
            return None
        try:
            if self._closed:
                raise self._closed_error()
            if self._ready is None:
                # Frames come on the engine's thread, not a socket of ours: the eventfd alone.
                ready = Readiness(combine=False)
                weakref.finalize(self, ready.close)
                self._ready = ready
                link = self._link
                if link is not None:
                    link.watch(ready)
                self._refresh_ready()
            return self._ready.fileno()
        finally:
            self._turn_over()

    def _refresh_ready(self) -> None:
        ready = self._ready
        if ready is None:
            return
        link = self._link
        if link is None or self._lost is not None or self._closed or self._closing:
            ready.set()
        else:
            link.show(ready, len(self._held) >= self._hold_limit)

    def wait_ready(self) -> "bool | BaseException":
        """For :class:`eglcuda.WaitSet`, as :meth:`eglcuda.Subscriber._wait_ready`."""
        if os.getpid() != self._pid:
            return self._forked_error()
        if not _acquire(self._busy, LOOK_WAIT_S):
            return False  # (another thread receives or joins again: what it finds, it says)
        try:
            if self._closed or self._closing:
                return self._closed_error()
            if self._lost is not None:
                return self._lost
            link = self._link
            if link is None:
                return StreamDisconnected(f"not connected to topic {self.name!r}")
            state = link.state()
            if state is True and len(self._held) >= self._hold_limit:
                return False  # (holding all it may, it can be handed nothing: quiet until a release)
            return state
        finally:
            try:
                self._refresh_ready()
            finally:
                self._turn_over()

    @property
    def connected(self) -> bool:
        link = self._link
        return link is not None and link.lost is None and self._lost is None and not self._closed

    @property
    def cuda_stream(self) -> int | None:
        return self._backend.cuda_stream

    @property
    def owns_stream(self) -> bool:
        """Whether :attr:`cuda_stream` is one this feed made (and destroys at its close)."""
        return self._backend.owns_stream

    @property
    def device(self) -> CudaDevice:
        """The CUDA device of the pool."""
        return self._device

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ending(self) -> bool:
        """Closed, or closing on another thread."""
        return self._closing or self._closed

    # ---- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Say goodbye to the relay and let go of everything (held messages become unusable; the
        pool is freed once the GPU work queued on it ended, up to 2 s). Safe to call twice and
        from another thread (a waiting :meth:`receive` ends with :class:`eglcuda.ClosedError`)."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._closed = True
            if self._ready is not None:
                self._ready.close()  # (this process's copies of the parent's descriptors)
            _ucx.untrack(self)
            return
        self._closing = True
        self._wake.set()  # (a wait_for_publisher() between two attempts to join ends now)
        if self._ready is not None:
            self._ready.set()  # (a watcher hears of the close)
        joining = self._joining
        if joining is not None:  # (and one in the middle of a handshake)
            joining.cancel()
        link = self._link
        if link is not None:
            link.wake()
        if self._busy._is_owned():  # type: ignore[attr-defined]
            # A signal handler on a thread inside receive(), wait_for_publisher() or a wait set's
            # look: tearing down here would wait for the link's locks that call holds. It ends
            # with ClosedError, and closes on its way out.
            self._close_put_off = True
            return
        with self._busy:
            if self._closed:
                return
            self._closed = True
            self._let_go_held()
            link = self._link
            if link is not None:
                link.say_bye()
            self._teardown()
        _ucx.untrack(self)

    def _turn_over(self) -> None:
        """Give up this thread's turn (``_busy``), then :meth:`finish_put_off_close`."""
        self._busy.release()
        self.finish_put_off_close()

    def finish_put_off_close(self) -> None:
        """A close() a signal handler put off is done once no call of this thread holds the turn
        (also after a hold of the turn outside these calls: a Batcher's pass)."""
        if self._close_put_off and not self._busy._is_owned():  # type: ignore[attr-defined]
            self._close_put_off = False
            self.close()

    def orphaned(self) -> None:
        """Its :class:`eglcuda.Subscriber` was collected without close(): close it once no
        message it handed out is held (they may alias its pool), on a thread of its own (a
        collection may run on any thread, inside any lock), or leave it to the exit hook when
        none can start (the interpreter is ending)."""
        if self._closed or self._closing or os.getpid() != self._pid:
            return
        self._orphaned = True  # (before the look at _held: a release that empties it sees the flag)
        if not self._held:
            self._close_in_background()

    def _close_in_background(self) -> None:
        try:
            threading.Thread(target=self.close, name=f"eglcuda-remote-close-{self.name}", daemon=True).start()
        except RuntimeError:
            pass

    def _settle(self) -> None:
        """Wait (bounded) for GPU work queued on the pool (its readers' and its copies') before
        it is written or freed."""
        own = self._backend.cuda_stream
        if own is None or self._device is None:
            return
        self._device.make_current()
        deadline = time.monotonic() + UNMAP_WAIT_S
        with self._state:
            released = list(self._released_events)  # (recorded on the releasing threads' streams)
        try:
            for stream in (own, self._copy_stream):
                while stream is not None and not cuda.stream_idle(stream) and time.monotonic() < deadline:
                    time.sleep(0.001)
            for event in released:
                while not cuda.event_done(event) and time.monotonic() < deadline:
                    time.sleep(0.001)
        except EglCudaError:
            pass

    def _free_pool(self) -> None:
        for view in self._views:
            view._released = True
        self._views = []
        pool, self._pool = self._pool, []
        for frame in pool:
            try:
                frame.close()
            except EglCudaError as exc:  # pragma: no cover - teardown goes on
                log.warning("remote topic %s: freeing a pool frame failed: %s", self.name, exc)
        self._spec = None

    def _teardown(self) -> None:
        try:
            self._drop_link()
            self._settle()
            self._free_pool()
            if self._copy_stream is not None:
                self._device.make_current()
                cuda.stream_destroy(self._copy_stream)
                self._copy_stream = self._copy_arg = None
            with self._state:
                self._plans, self._plans_window = {}, None
                events = self._slot_events + self._released_events + self._window_events
                self._slot_events, self._released_events, self._window_events = [], [], []
            for event in events:
                cuda.event_destroy(event)
        finally:
            self._backend.close()
            self._lost = None  # (its traceback holds the frames of the call it ended, and their locals)
            if self._loop is not None:
                self._loop = None
                _ucx.release()

    def _closed_error(self) -> ClosedError:
        return closed_error(self.name)

    def _forked_error(self) -> UsageError:
        return forked_error(self.name, self._pid)

    def describe(self) -> str:
        """What ``repr()`` of its subscriber says of its state."""
        if self._closed:
            return "closed"
        if self.connected:
            return f"remote {self.remote[0]}:{self.remote[1]}, {len(self._held)} held"
        return f"disconnected ({self._lost})"


def _ipv4_address(host: str, deadline: float, woken: threading.Event) -> str | None:
    """The relay host's IPv4 address: ``host`` itself when it is one, else the first IPv4 address
    the resolver gives for the name. :class:`UsageError` at once for a name no resolver knows (a
    mistyped name would otherwise be retried until the timeout). None when the resolver gave no
    answer by ``deadline`` (or could not answer now, ``EAI_AGAIN``, then again after a moment):
    the lookup runs on a thread of its own, so a slow resolver holds nobody past the deadline."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    while True:
        answer: list[Any] = []

        def look_up() -> None:
            try:
                answer.append(socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM))
            except OSError as exc:
                answer.append(exc)

        looking = threading.Thread(target=look_up, name="eglcuda-remote-resolve", daemon=True)
        looking.start()
        while looking.is_alive() and not woken.is_set():  # (close() ends the wait: woken)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            looking.join(min(left, 0.05))
        if not answer:
            return None  # (not in time, or closed: the thread ends on its own)
        found = answer[0]
        if not isinstance(found, OSError):
            if found:
                return str(found[0][4][0])
        elif isinstance(found, socket.gaierror) and found.errno in _UNKNOWN_NAME:
            raise UsageError(f"remote: the relay host {host!r} is not known ({found.strerror}): give its IPv4 "
                             "address or a name that resolves")
        if woken.wait(min(_RETRY_S, max(0.0, deadline - time.monotonic()))) or time.monotonic() >= deadline:
            return None


_UNKNOWN_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME),
                 getattr(socket, "EAI_ADDRFAMILY", socket.EAI_NONAME)}
