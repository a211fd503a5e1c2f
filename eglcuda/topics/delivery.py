"""A publisher's subscribers, on the publishing thread: reading their messages, handing frames
out, taking them back, waiting for room or a free slot, dropping them.

The books (who holds which slot, whose GPU work still reads one) and the common per-frame steps are
the compiled core's (``_delivery.pyx``); this module calls it for every entry it makes and does
what the core leaves: SLOT messages, transports that present frames (EGLStream), releases with a
done event, full sockets, drops and their reasons, and every wait.
"""
from __future__ import annotations

import collections
import logging
import select
import socket
import threading
import time
from typing import Any, Callable, Sequence

from ..errors import ClosedError, EglCudaError, PeerError, Timeout
from . import _delivery, _ring, _wire, protocol, sockets
from ._delivery import Member, Slot
from .info import DropRecord
from .pool import Pool
from .protocol import Qos, Reason

log = logging.getLogger("eglcuda.topics")

RECV_LIMIT = 4096  # longer than any message a subscriber sends after its handshake
READ_BATCH = 8  # messages one read takes from a subscriber's socket (its releases since the last read)
_READ_INTERVAL = 0.001  # seconds: the longest a publishing publisher leaves its subscribers' messages unread
_SETTLE_POLL = 0.001  # seconds between the questions of a publisher waiting for subscribers' GPU reading
CLOSE_CHECK_S = 0.05  # seconds: the longest a wait goes on after close() in another thread
_READ_LIMIT = protocol.MAX_QUEUE + 2  # messages read from one subscriber per poll (the rest: next poll)
_KIND_BYE = int(protocol.Kind.BYE)
_KIND_RELEASE = int(protocol.Kind.RELEASE)
_WAKE = bytes([int(protocol.Kind.WAKE)])  # what _wire.Inbox hands out of a subscriber's WAKEs (every WAKE_CHECK-th)
_OWN_READER_IDLE = 0.25  # seconds a closing publisher waits for a subscriber of its own process to take a frame
_LEAVING_GRACE = 0.05  # seconds a subscriber whose frames could not be taken back has to say goodbye
_MESSAGE_OVERHEAD = 4096  # bytes a message costs a socket's send buffer beyond its data (generous)


class Delivery:
    """The subscribers of one publisher and everything the publishing thread does with them.

    ``stopped()`` says the publisher is closing (a wait then ends with ``closed_error()``)."""

    def __init__(self, name: str, pool: Pool, every_timeout: float, stopped: Callable[[], bool],
                 closed_error: Callable[[], ClosedError]) -> None:
        self.name = name
        self.pool = pool
        self.every_timeout = every_timeout
        self._stopped = stopped
        self._closed_error = closed_error
        self.epoll: select.epoll | None = select.epoll()
        self.subs: list[Member] = []
        self._inboxes: dict[int, tuple[_wire.Inbox, Member]] = {}  # fd -> what _wire.drain reads
        self.read_at = 0.0  # time.monotonic() of the last read of the subscribers' messages
        # Handed over by the handshake service, adopted by the publishing thread (join_lock).
        self.joined: list[Member] = []
        self.join_lock = threading.Lock()
        self.closing = False  # the publisher said goodbye: a subscriber closing its end now has left
        self.dropped: collections.deque[DropRecord] = collections.deque(maxlen=256)
        self.drop_count = 0
        # Subscribers whose frames could not be taken back while their later messages (releases,
        # then perhaps a goodbye) were still unread: by when each must have left, and the failure
        self._unreclaimed: dict[Member, tuple[float, str]] = {}

    # ---- subscribers coming and reading ------------------------------------------------------------
    def adopt(self) -> None:
        epoll = self.epoll
        if epoll is None:  # pragma: no cover - set for as long as the publisher is open
            raise self._closed_error()
        with self.join_lock:
            joined, self.joined = self.joined, []
        for sub in joined:
            epoll.register(sub.fd, select.EPOLLIN)
            self._inboxes[sub.fd] = (sub.inbox, sub)
            self.subs.append(sub)
            log.info("topic %s: subscriber %d joined (pid %d, %s, %s)", self.name, sub.id, sub.peer.pid,
                     sub.qos.name.lower(), sub.transport)

    def reap_joined(self) -> None:
        """Close the subscribers handed over whose connection ended before the publishing thread
        took them in (it does at its next call, which an idle publisher may not make for long):
        their descriptors and rings go now, on the caller's thread (the handshake service's), so
        that subscribers that join and die beside an idle publisher do not pile up. One that said
        something first (its goodbye) has left; one that said nothing was dropped."""
        with self.join_lock:
            ended = [(sub, said) for sub in self.joined for said in (_ended(sub.sock),) if said is not None]
            if not ended:
                return
            gone = {id(sub) for sub, _ in ended}
            self.joined = [sub for sub in self.joined if id(sub) not in gone]
        for sub, said in ended:
            sub.alive = False
            self._close_member(sub)
            if said:
                log.info("topic %s: subscriber %d (pid %d) left before its first frame", self.name, sub.id,
                         sub.peer.pid)
                continue
            self._note_drop(sub, Reason.TRANSPORT, "its connection closed without a goodbye before its first frame "
                            "(its process exited or was killed)")

    def poll(self, timeout: float, awaited: list[Member] | None = None) -> None:
        """Wait up to ``timeout`` seconds for subscribers' messages and handle them; a release in a
        ring wakes the wait when it comes from ``awaited`` (None: any subscriber)."""
        if self.joined:
            self.adopt()
        epoll = self.epoll
        if epoll is None:  # pragma: no cover - set for as long as the publisher is open
            raise self._closed_error()
        sleepers = self.subs if awaited is None else awaited
        # Releases written into rings: taken without a system call. Before a wait, the rings of
        # those awaited say the publisher sleeps (a release there then wakes it with a WAKE).
        if timeout > 0 and _delivery.sleeping(sleepers, True):
            timeout = 0.0  # (one came meanwhile)
        _delivery.note_sockets(self.subs)  # (before the read: a release sent after it is news again)
        batch = _wire.drain(epoll.fileno(), timeout, self._inboxes, _READ_LIMIT)
        if timeout > 0:
            _delivery.sleeping(sleepers, False)
        for sub, reason in _delivery.collect(self.subs, self.pool.free):  # (a malformed ring: dropped)
            self.drop(sub, Reason.PROTOCOL, reason)
        self.read_at = time.monotonic()
        # (settle also marks a subscriber whose goodbye or end is in this batch, read off its
        # socket already, as leaving: a release before it that fails to take frames back is its
        # leaving, _is_leaving)
        for sub, message in _delivery.settle(batch, self.pool.free):
            if sub.alive:  # (the plain releases were handled by the core)
                self._handle(sub, message)
            elif message.__class__ is protocol.Carried:  # (of a subscriber dropped: nobody else closes them)
                sockets.close_fds(message.fds)
        if self._unreclaimed:
            self._drop_unreclaimed()

    def poll_if_due(self) -> None:
        """Read the subscribers' messages when the last read is _READ_INTERVAL old. A fast
        publisher then takes several releases from each socket with one read, where reading every
        frame cost a read and an empty read per subscriber per frame (measured on an H100: about
        1.8 us each). At camera rates every frame still reads them."""
        if self.joined:
            self.adopt()
        if self.subs and time.monotonic() - self.read_at >= _READ_INTERVAL:
            self.poll(0.0)

    def _read(self, sub: Member) -> None:
        """Handle what one subscriber sent, up to what is waiting now."""
        inbox = sub.inbox
        if sub.ring is not None:
            sub.ring.note_socket()
        message = inbox.next()
        while message is not None and sub.alive:
            self._handle(sub, message)
            message = inbox.rest()  # the rest of what that read found (no empty read to end it)

    def _handle(self, sub: Member, message: Any) -> None:
        """One message from a subscriber, as _wire reads it (a Release, other bytes, b"": the end)."""
        kind = message.__class__
        if kind is protocol.Release:
            self._on_release(sub, message)
            return
        if kind is protocol.Carried:
            sockets.close_fds(message.fds)
            self.drop(sub, Reason.PROTOCOL, "it sent descriptors after its handshake")
            return
        if kind is not bytes:  # a FRAME: a publisher's message
            self.drop(sub, Reason.PROTOCOL, "it sent Frame after its handshake")
            return
        if not message:
            self.drop(sub, Reason.TRANSPORT, "its connection closed without a goodbye (its process exited or "
                      "was killed)", notify=False, left=self.closing)
            return
        if message == _WAKE:  # (_wire hands out every WAKE_CHECK-th WAKE of a subscriber: held against its releases)
            if _delivery.wakes_past_releases(sub):
                self.drop(sub, Reason.PROTOCOL, "it flooded WAKE messages (more than the releases it wrote into its "
                          "ring)")
            return
        # After its handshake a subscriber sends no descriptors (the kernel drops any that come),
        # and a message longer than any valid one arrives cut, then fails to decode.
        try:
            decoded = protocol.decode(message)
        except protocol.ProtocolError as exc:
            self.drop(sub, Reason.PROTOCOL, f"it sent a malformed message: {exc}")
            return
        if isinstance(decoded, protocol.Bye):  # (every well-formed RELEASE came decoded from _wire)
            self.drop(sub, Reason.CLOSING, f"it left ({decoded.reason})", notify=False, left=True)
        else:
            self.drop(sub, Reason.PROTOCOL, f"it sent {type(decoded).__name__} after its handshake")

    def _on_release(self, sub: Member, release: protocol.Release) -> None:
        slot = sub.outstanding.pop(release.seq, None)
        if slot is None:
            self.drop(sub, Reason.PROTOCOL, f"it released frame {release.seq}, which it does not hold")
            return
        try:
            freed = sub.link.released(slot, release)
        except (PeerError, EglCudaError) as exc:
            self.drop(sub, Reason.PROTOCOL, str(exc))
            return
        if freed:
            _delivery.released(sub, slot, bool(release.flags & protocol.RELEASE_RECORDED), time.monotonic(),
                               self.pool.free)
        else:
            self._reclaim(sub)

    def _reclaim(self, sub: Member) -> None:
        if sub in self._unreclaimed:
            return  # (it failed already: its goodbye, or the deadline, decides)
        try:
            frames = sub.link.reclaim()
        except EglCudaError as exc:
            leaving = self._is_leaving(sub)
            if leaving:
                # It said goodbye (or its connection closed) while its end was coming down: the
                # driver's refusal is its leaving, not a failure (measured: EGLStream returns
                # CUDA_ERROR_UNKNOWN to a producer whose consumer process is disconnecting).
                self.drop(sub, Reason.CLOSING, "it left", notify=False, left=True)
            elif leaving is None:
                # Releases come first: a closing subscriber releases what it holds, then says
                # goodbye. Those are read before the goodbye, which decides.
                self._unreclaimed[sub] = (time.monotonic() + _LEAVING_GRACE, f"taking frames back failed: {exc}")
            else:
                self.drop(sub, Reason.TRANSPORT, f"taking frames back failed: {exc}")
            return
        for frame in frames:
            slot = self.pool.slot_of(frame)
            if slot is not None:
                _delivery.released(sub, slot, False, 0.0, self.pool.free)

    def _drop_unreclaimed(self) -> None:
        """Drop the subscribers whose frames could not be taken back and that did not say goodbye
        by their deadline: their transport failed."""
        now = time.monotonic()
        for sub, (deadline, reason) in list(self._unreclaimed.items()):
            if not sub.alive:
                del self._unreclaimed[sub]
            elif now >= deadline:
                self.drop(sub, Reason.TRANSPORT, reason)

    def reclaim_all(self) -> None:
        if self._unreclaimed:
            self._drop_unreclaimed()
        for sub in list(self.subs):
            if sub.alive and self.pool.held(sub):
                self._reclaim(sub)

    def _is_leaving(self, sub: Member, within: float = _LEAVING_GRACE) -> bool | None:
        """Whether a goodbye or the end of the connection is (or within ``within`` seconds comes)
        next on the subscriber's socket, or was read with its last messages; None when a release
        comes next (what follows it is not seen without reading it). Reads nothing: the message
        stays for _read."""
        queued = sub.inbox.queued_kinds()
        if sub.leaving or any(kind in (0, _KIND_BYE) for kind in queued):
            return True  # (a goodbye or the end read already, waiting in its inbox's batch)
        if _KIND_RELEASE in queued:
            return None
        deadline = time.monotonic() + within
        while True:
            try:
                data = sub.sock.recv(RECV_LIMIT, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                return True
            if data is not None:
                if not data:
                    return True
                if data[0] == _KIND_RELEASE:
                    return None
                try:
                    return isinstance(protocol.decode(data), protocol.Bye)
                except protocol.ProtocolError:
                    return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def _gone_meanwhile(self, sub: Member) -> bool:
        """After its transport or its connection failed: whether the failure is the subscriber
        going away since this call read the sockets. Its waiting messages are read: releases, then
        a goodbye (it left) or the end of its connection without one (dropped: its process exited
        or was killed). When neither is there yet, either may come within 50 ms (a closing
        subscriber says goodbye before its consumer disconnects; a killed process's connection
        closes a moment after)."""
        self._read(sub)
        if sub.alive:
            poller = select.poll()
            poller.register(sub.fd, select.POLLIN)
            if poller.poll(50):
                self._read(sub)
        return not sub.alive

    def _settled(self, slot: Slot) -> bool:
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
                        self.drop(sub, Reason.TRANSPORT, f"asking whether its GPU reading of a frame ended failed: {exc}")
            waiters.pop(sub, None)  # (a drop took it out already)
        return not waiters

    # ---- waiting ------------------------------------------------------------------------------------
    def free_slot(self, limit: float) -> Slot:
        """A free slot no subscriber's GPU work still reads: a settled free one first; then a new
        one, while the pool may grow; then the wait (:meth:`_wait_for_slot`), on the host. The
        publisher's stream never waits for another process's event: without MPS such a wait ties
        the two processes' GPU time slices together (measured on an H100: 26k frames/s to one
        subscriber with such waits, 64-69k without), and a subscriber that dies before its queued
        work ran could leave it waiting for good."""
        pool = self.pool
        slot = pool.take_free(self._settled)
        if slot is None:
            if self.subs:
                self.poll(0.0)
            self.reclaim_all()
            slot = pool.take_free(self._settled)
        if slot is None and pool.can_grow():
            try:
                pool.grow()
            except EglCudaError as exc:
                if not pool.free:
                    raise  # nothing free at all: the pool had to grow
                # Free slots are still read on the GPU: one is written once that reading ends.
                log.info("topic %s: growing the pool failed (%s); waiting for a slot's readers", self.name, exc)
            slot = pool.take_free(self._settled)
        if slot is None:
            slot = self._wait_for_slot(limit)
        return slot

    def wait_for_room(self) -> None:
        """Wait until every 'every' subscriber has room for one more frame; drop those that do not
        release one within every_timeout."""
        for sub, reason in _delivery.collect(self.subs, self.pool.free):  # releases in rings (compiled)
            self.drop(sub, Reason.PROTOCOL, reason)
        full = _delivery.full_every(self.subs)
        if not full:
            return
        deadline = time.monotonic() + self.every_timeout
        while full:
            if self._stopped():  # close() in another thread waits for this call: end it
                raise self._closed_error()
            left = deadline - time.monotonic()
            if left <= 0:
                for sub in full:
                    self.drop(sub, Reason.QUEUE_FULL, f"its queue of {sub.queue} frame(s) stayed full for "
                              f"{self.every_timeout} s (every_timeout): it did not release a frame in time")
                return
            self.poll(min(left, CLOSE_CHECK_S), full)  # (a release of the others wakes no one)
            full = [s for s in full if s.alive and len(s.outstanding) >= s.credit]

    def _wait_for_slot(self, limit: float) -> Slot:
        """A free slot no subscriber's GPU work still reads, waiting up to ``limit`` seconds
        (Timeout after that). While the free slots are still read on the GPU (released with a
        done event not yet completed), the wait is on the host, asking every _SETTLE_POLL; a
        subscriber still reading one every_timeout after its release is dropped, as is an
        'every' subscriber that holds a frame that long."""
        pool = self.pool
        deadline = time.monotonic() + limit
        while True:
            slot = pool.take_free(self._settled)
            if slot is not None:
                return slot
            if self._stopped():  # close() in another thread waits for this call: end it
                raise self._closed_error()
            now = time.monotonic()
            # When each 'every' subscriber that holds frames got the oldest of them.
            oldest = [(s, min(x.published_at for x in s.outstanding.values())) for s in self.subs
                      if s.alive and s.qos is Qos.EVERY and s.outstanding]
            stale = [s for s, since in oldest if now - since >= self.every_timeout]
            for sub in stale:
                self.drop(sub, Reason.QUEUE_FULL, f"it held frames for more than {self.every_timeout} s "
                          "(every_timeout) while the publisher needed a pool frame")
            if stale:
                continue  # (the slots they held came free, and their readers were not asked yet)
            # Free slots still read on the GPU (take_free asked each of their waiters just now: those
            # left are still reading), and the subscribers reading one every_timeout after releasing it.
            unsettled = pool.unsettled()
            slow = {sub for slot in unsettled for sub, since in slot.waiters.items()
                    if sub.alive and now - since >= self.every_timeout}
            for sub in slow:
                self.drop(sub, Reason.QUEUE_FULL, f"its GPU work still read a frame {self.every_timeout} s "
                          "(every_timeout) after it released it, while the publisher needed a pool frame")
            if slow:
                continue
            if now >= deadline:
                raise self._no_slot(limit, unsettled)
            wait = min(deadline - now, CLOSE_CHECK_S)
            if oldest:
                wait = min(wait, min(since for _, since in oldest) + self.every_timeout - now)
            if any(s.alive and s.link.returns_later for s in self.subs):
                # EGLStream frames come back through the driver, which has no descriptor to wait on.
                wait = min(wait, 0.002)
            if unsettled:  # nor does the end of a subscriber's GPU work
                first = min(since for slot in unsettled for since in slot.waiters.values())
                wait = min(wait, _SETTLE_POLL, first + self.every_timeout - now)
            self.poll(max(wait, 0.0))
            self.reclaim_all()

    def _no_slot(self, limit: float, unsettled: list[Slot]) -> Timeout:
        pool = self.pool
        holders = sorted({f"{s.peer.pid} ({s.qos.name.lower()})" for slot in pool.slots for s in slot.holders})
        readers = sorted({f"{s.peer.pid} ({s.qos.name.lower()})" for slot in unsettled for s in slot.waiters})
        mine = len(pool.writing)
        yours = (f"; {mine} taken with next_frame() and not yet published or discarded (by this "
                 "process)" if mine else "")
        if not readers:
            return Timeout(f"no pool frame came free within {limit} s: all {len(pool)} are held (max_pool "
                           f"{pool.max_pool}) by subscriber process(es) {', '.join(holders) or 'none'}{yours}")
        return Timeout(f"no pool frame came free within {limit} s (pool {len(pool)}, max_pool "
                       f"{pool.max_pool}): {len(unsettled)} released but still read on the GPU by subscriber "
                       f"process(es) {', '.join(readers)}, the others held by {', '.join(holders) or 'none'}{yours}")

    # ---- handing frames out ---------------------------------------------------------------------------
    def deliver(self, slot: Slot, seq: int, timestamp_ns: int, payload: bytes, stream: int | None) -> None:
        shared = protocol.encode_frame(seq, slot.index, timestamp_ns, 0, payload)  # (links that number no frames)
        recorded: set[Any] = set()  # the transports whose on_publish ran for this frame
        index = slot.index
        # The common case compiled: a message-only subscriber that may take the frame now. The
        # rest (and any failure) comes back here.
        others = _delivery.hand_out(self.subs, slot, seq, shared, stream, recorded, timestamp_ns, payload,
                                    time.monotonic(), self.read_at, _READ_INTERVAL)
        if not others:
            return
        fresh = False  # whether every subscriber's messages were read for this frame
        if self._worth_a_read(others):
            # 'latest' ones at their credit may have released a frame since the last read: one
            # read of every socket (and its releases handled by the core) instead of one Python
            # read per such subscriber; then the compiled step again for them.
            self.poll(0.0)
            fresh = True
            others = _delivery.hand_out(others, slot, seq, shared, stream, recorded, timestamp_ns, payload)
        if fresh or time.monotonic() - self.read_at < _READ_INTERVAL:
            # No read is due for those still at their credit (_worth_a_read said so, or they were
            # read just now): each skips this frame, compiled; a NOTICE tells it once.
            others, notify = _delivery.skip_full(others)
            for sub in notify:
                if sub.alive and self._send(sub, protocol.encode(protocol.Notice(seq))):
                    sub.noticed = True
        for sub in list(others):
            if not sub.alive:
                continue
            if sub.latest and len(sub.outstanding) >= sub.credit:
                if not fresh and self._worth_a_read([sub]):
                    self._read(sub)  # a release may have come since the last read
                    for bad, reason in _delivery.collect([sub], self.pool.free):  # (and into its ring)
                        self.drop(bad, Reason.PROTOCOL, reason)
                if not sub.alive:
                    continue
                if len(sub.outstanding) >= sub.credit:
                    sub.skipped += 1
                    if not sub.noticed and self._send(sub, protocol.encode(protocol.Notice(seq))):
                        sub.noticed = True
                    continue
            link = sub.link
            if link.transport not in recorded:
                # The publisher's own step (the frame's event recorded, or its writes finished, on
                # the publish stream): its failure (a stream of another device, or one destroyed)
                # is the caller's, raised from publish(), not the subscribers' to be dropped for.
                link.transport.on_publish(slot, stream)
                recorded.add(link.transport)
            try:
                if index not in sub.seen_slots:
                    extra = link.slot_extra(slot)
                    if extra is not None and not self._send(sub, protocol.encode(protocol.Slot(index, extra)),
                                                            link.slot_fds(slot)):
                        sub.skipped += 1
                        continue
                    sub.seen_slots.add(index)
                if link.message_only:
                    ring = sub.ring  # (a payload too long for its ring goes by socket, in order)
                    announced = ring is not None and ring.frame(sub.fd, seq, index, timestamp_ns, payload) == 0
                    if not announced and not self._send(sub, shared):  # (retries, waits or drops as the QoS says)
                        sub.skipped += 1
                        continue
                else:
                    data = protocol.encode_frame(seq, index, timestamp_ns, link.number(), payload)
                    if not self._send(sub, data):
                        sub.skipped += 1
                        continue
                    link.deliver(slot, stream)
            except EglCudaError as exc:
                if not self._gone_meanwhile(sub):
                    self.drop(sub, Reason.TRANSPORT, f"delivering frame {seq} failed: {exc}")
                continue
            _delivery.delivered(sub, slot, seq)

    def _worth_a_read(self, subs: list[Member]) -> bool:
        """Whether the messages of the 'latest' subscribers of ``subs`` at their credit are worth
        reading before a frame is handed out: when the last read is _READ_INTERVAL old, or when one
        of them released a frame since (its ring has the release, or counts one it sent by socket);
        one without a ring, when it keeps up (the oldest frame it holds is younger than that: its
        release may be on the way). A slow or stalled subscriber is read with the others, at least
        every _READ_INTERVAL (next_frame), not once per frame: it costs the publisher no read a
        frame (compiled: _delivery.worth_a_read)."""
        return _delivery.worth_a_read(subs, time.monotonic(), self.read_at, _READ_INTERVAL)

    def _send(self, sub: Member, data: bytes, fds: Sequence[int] = ()) -> bool:
        """Send one message (with ``fds``) without blocking the publisher on a subscriber that
        stopped reading: 'latest' ones miss it (False); 'every' ones get every_timeout, then are
        dropped."""
        try:
            sockets.send(sub.sock, data, fds)
            return self._mark(sub)
        except BlockingIOError:
            if sub.latest:
                return False
        except OSError as exc:
            # The connection broke: what it sent before (a goodbye?) says whether it left or died.
            if not self._gone_meanwhile(sub):
                self.drop(sub, Reason.TRANSPORT, f"its connection failed ({exc.strerror or exc})", notify=False)
            return False
        deadline = time.monotonic() + self.every_timeout
        while not self._stopped():  # (close() in another thread waits for this publish: cut it short)
            if sockets.wait_writable(sub.sock, min(deadline, time.monotonic() + CLOSE_CHECK_S)):
                try:
                    sockets.send(sub.sock, data, fds)
                    return self._mark(sub)
                except OSError:
                    break
            if time.monotonic() >= deadline:
                break
        else:
            return False
        self.drop(sub, Reason.QUEUE_FULL, f"its socket stayed full for {self.every_timeout} s (every_timeout)")
        return False

    def _mark(self, sub: Member) -> bool:
        """A message went out on the socket: its place in the subscriber's ring (if it has one)."""
        if sub.ring is None or sub.ring.mark(sub.fd):
            return True
        self.drop(sub, Reason.PROTOCOL, "its frame ring stayed full (it does not read its ring, or wrote a bad "
                  "read count)", notify=False)
        return False

    # ---- leaving ------------------------------------------------------------------------------------------
    def drop(self, sub: Member, code: Reason, reason: str, notify: bool = True, left: bool = False) -> None:
        """Forget a subscriber: tell it why (``notify``), close its connection and link, free what
        it held. Its transport's events are never waited on again."""
        if not sub.alive:
            return
        sub.alive = False
        ring = sub.ring
        if ring is not None and not self.closing:
            # (Before its frames are freed below, to be written again: it must not hand out one
            # announced unread. A closing topic writes none: those stay its to read.)
            ring.drop()
        if notify and _tell(sub.sock, protocol.encode(protocol.Drop(int(code), reason))) and ring is not None:
            ring.mark(sub.fd)  # (in a full ring it is not read: the connection's end says it is over)
        if self.epoll is not None:  # (always: a subscriber is adopted into it)
            try:
                self.epoll.unregister(sub.fd)
            except (OSError, ValueError):
                pass
        self._inboxes.pop(sub.fd, None)
        if sub in self.subs:
            self.subs.remove(sub)
        self._close_member(sub)
        _delivery.forget(sub, self.pool.slots, self.pool.free)
        self._unreclaimed.pop(sub, None)
        if left:
            log.info("topic %s: subscriber %d (pid %d) left", self.name, sub.id, sub.peer.pid)
            return
        self._note_drop(sub, code, reason)

    def _close_member(self, sub: Member) -> None:
        """Close what this process holds of a subscriber that is gone: its ring (it keeps its own
        mapping), its inbox, its connection and its transport's link."""
        if sub.ring is not None:
            sub.ring.close()
        sub.inbox.close()  # before its descriptor is closed (and its number reused)
        sockets.close_quietly(sub.sock)
        try:
            sub.link.close()
        except Exception as exc:  # noqa: BLE001 - the subscriber is gone either way
            log.warning("topic %s: closing subscriber %d's %s link failed: %s", self.name, sub.id, sub.transport, exc)

    def _note_drop(self, sub: Member, code: Reason, reason: str) -> None:
        """Count and record a dropped subscriber (the topic's status lists the last 256)."""
        self.drop_count += 1
        self.dropped.append(DropRecord(id=sub.id, pid=sub.peer.pid, qos=sub.qos.name.lower(), transport=sub.transport,
                                       code=Reason(code).name if code in Reason._value2member_map_ else str(code),
                                       reason=reason, at=time.time()))
        if code is not Reason.CLOSING:
            log.warning("topic %s: dropped subscriber %d (pid %d, %s): %s", self.name, sub.id, sub.peer.pid,
                        sub.qos.name.lower(), reason)

    def say_goodbye(self, wait: float, own_pid: int) -> None:
        """The publisher is closing: say so to every subscriber, wait up to ``wait`` seconds for
        each to close its end (it unmaps the pool first), then drop them all."""
        self.closing = True
        if self.joined:
            self.adopt()
        deadline = time.monotonic() + wait
        waiting = []
        # Subscribers in this process may be read by this very thread, which cannot read while it
        # waits here: they are waited for only while they take frames announced to them that
        # tearing down their link would lose (an EGLStream's), each within _OWN_READER_IDLE.
        own: dict[Member, tuple[int, float]] = {}
        for sub in list(self.subs):
            try:
                sockets.send(sub.sock, protocol.encode(protocol.Bye(int(Reason.CLOSING), "the publisher closed the topic")))
                self._mark(sub)
                if sub.peer.pid != own_pid:
                    waiting.append(sub)
                elif sub.outstanding and not sub.link.message_only:
                    own[sub] = (len(sub.outstanding), time.monotonic() + _OWN_READER_IDLE)
                # Nothing follows the goodbye: its sending half shut, the end shows to a subscriber
                # that watches its connection for that only (it holds all it may). Its releases
                # still come in.
                sub.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        while (waiting or own) and time.monotonic() < deadline:
            self.poll(min(deadline - time.monotonic(), _OWN_READER_IDLE) if own else deadline - time.monotonic())
            waiting = [s for s in waiting if s.alive]
            now = time.monotonic()
            for sub, (held, idle_at) in list(own.items()):
                if not sub.alive or not sub.outstanding:
                    del own[sub]
                elif len(sub.outstanding) < held:
                    own[sub] = (len(sub.outstanding), now + _OWN_READER_IDLE)
                elif now >= idle_at:
                    del own[sub]  # (not read meanwhile: by this thread, or by none)
        self.drop_all()

    def drop_all(self) -> None:
        """The topic closes: let go of every subscriber, saying nothing more (also what the
        publisher's close does when its goodbye was cut short)."""
        for sub in list(self.subs):
            self.drop(sub, Reason.CLOSING, "the publisher closed the topic", notify=False)

    def forget(self) -> None:
        """A forked child: close this process's copies of the subscribers' sockets, say nothing
        (a read here would take the parent's messages). Those handed over and not adopted yet too."""
        for sub in self.subs + self.joined:
            sub.sock.close()
            if sub.ring is not None:
                sub.ring.close()  # (this process's mapping only: the parent's stays)
        self.subs, self.joined = [], []
        self.close_epoll()

    def close_epoll(self) -> None:
        if self.epoll is not None:
            self.epoll.close()
            self.epoll = None


def new_member(ident: int, sock: socket.socket, peer: Any, hello: protocol.Hello, link: Any,
               transport: str) -> tuple[Member, list[int]]:
    """A subscriber after its handshake, and the descriptors its READY carries (the caller closes
    them): a link whose FRAME message is the whole hand-over gets a ring (_ring.pyx), its memfd."""
    ring, fd = _ring.create() if link.message_only else (None, -1)
    return Member(ident, sock, peer, hello, link, transport, RECV_LIMIT, READ_BATCH, ring), [fd] if fd >= 0 else []


def _ended(sock: socket.socket) -> bool | None:
    """Whether the peer of ``sock`` closed its end: None while it has not; else whether a message
    of its still waits to be read (its goodbye, most likely) before the end."""
    waiter = select.poll()
    waiter.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
    ready = waiter.poll(0)
    if not ready or not ready[0][1] & (select.POLLHUP | select.POLLRDHUP | select.POLLERR):
        return None
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False


def _tell(sock: socket.socket, data: bytes) -> bool:
    """Send a last message (a DROP) on a connection about to be closed, also when the messages
    queued before it filled the socket (a subscriber that stopped reading): its send buffer then
    grows by what the message needs, so that after reading those the peer learns why, rather
    than only that the connection ended. Best effort: the kernel caps the buffer (wmem_max).
    Returns whether it was sent."""
    try:
        sockets.send(sock, data)
        return True
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)  # (twice what was set: the kernel's books)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size // 2 + len(data) + _MESSAGE_OVERHEAD)
        sockets.send(sock, data)
        return True
    except OSError:
        return False
