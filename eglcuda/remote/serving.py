"""The relay's side on the UCX engine (_ucx.py): the handshake with each remote subscriber, its
sender (frames while there is credit, a few in flight; beats; the GONE note), its credit reader,
and the watchdog that drops the silent and the slow. :class:`Serving` is a part of
:class:`eglcuda.Relay` (relay.py), which owns the state it uses: ``name``, ``timeout``,
``every_timeout``, ``max_remotes``, ``qos``, ``_key``, ``_frames``, ``_sub``, ``_welcome``, ``_live``, ``_closing``,
``_remotes``, ``_history``, ``_wanted``, ``_room_lock``, ``_room``, ``_staged``, ``_staging``, ``_refs``, ``_free``, ``_listener``,
``_listen_ip``.
Everything here runs on the engine's thread.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import queue as _queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np

from ..topics.protocol import Qos, Reason
from . import _ucx, keys, wire
from .session import AuthenticationFailed, FrameSeal, Handshake, Session
from .wire import BEAT_S, LATEST_WINDOW, NO_PUBLISHER, SEND_AHEAD

if TYPE_CHECKING:
    from ..topics.subscriber import Subscriber
    from .buffers import Pinned

log = logging.getLogger("eglcuda.remote")
EVERY_ROOM = 1 << 30  # an 'every' remote subscriber of an 'every' relay takes every frame (the relay waits instead)
# Staging buffers one remote subscriber may hold (frames queued for it and sends in flight): a
# stopped or deaf remote holds at most this many of the ring, whatever its window.
QUOTA = SEND_AHEAD + 1
# A send still in flight this long while its remote subscriber speaks (beats, credits) means it
# does not receive: it is dropped, and its staging buffers come back. (A silent one is the
# relay's ``timeout``'s business: a stopped process that wakes within it goes on.)
SEND_DEADLINE_S = 2.0
T = TypeVar("T")


@dataclass(frozen=True)
class RemoteInfo:
    """One remote subscriber as its relay sees it: ``peer`` its address, ``sent`` frames sent
    to it, ``skipped`` frames of the topic it did not get between those ('latest'), ``dropped``
    why the relay dropped it (None: it is connected, or it left by itself), ``since`` when it
    joined (``time.time()``)."""

    peer: str
    qos: str
    queue: int
    sent: int
    skipped: int
    dropped: str | None
    since: float
    connected: bool


class _Remote:
    """A connected remote subscriber (state of the UCX engine only)."""

    def __init__(self, ep: Any, peer: str, qos: Qos, queue: int, window: int, welcome: wire.Welcome) -> None:
        self.ep = ep
        self.welcome = welcome
        self.peer = peer
        self.qos = qos
        self.queue = queue
        self.window = window
        self.credits = window
        self.pending: collections.deque[int] = collections.deque()  # staging buffers to send
        self.started = False  # it took its welcome: frames may go out (they wait in pending until then)
        self.closing = False  # its sender is saying GONE: no frame goes out after that
        self.last_sent = 0.0  # time.monotonic() of its last frame sent (beats only when idle)
        self.inflight = 0  # frames posted to UCX and not yet sent
        self.posted: collections.deque[float] = collections.deque()  # time.monotonic() of each send in flight
        self.failure: BaseException | None = None  # a send failed: the connection ends
        self.wake = asyncio.Event()  # its sender coroutine looks again (an end decided, a failure, the last send)
        self.sent = 0
        self.skipped = 0
        self.last_seq: int | None = None  # of the last frame queued for it
        self.dropped: str | None = None
        self.gone: tuple[int, str] | None = None  # (code, reason) to send, then close
        # After the publisher closed the topic: the frames still pending go out first, until then
        # (time.monotonic(); each credit it returns moves that every_timeout on: it keeps pace), as a
        # local subscriber gets every frame published before the close.
        self.flush_until = 0.0
        self.since = time.time()
        self.heard = time.monotonic()
        self.starved_since: float | None = None  # an 'every' remote that could not take a frame since
        self.connected = True
        self.tasks: list[asyncio.Task[Any]] = []

    @property
    def held(self) -> int:
        """Staging buffers this remote holds: frames queued for it and sends in flight."""
        return len(self.pending) + self.inflight

    def info(self) -> RemoteInfo:
        return RemoteInfo(self.peer, self.qos.name.lower(), self.queue, self.sent, self.skipped, self.dropped,
                          self.since, self.connected)


class _FailedProofs:
    """Failed key proofs, logged with the peer's address: one line a minute per address at most,
    with the count since the last line (a peer guessing keys must not flood the log either)."""

    EVERY_S = 60.0
    ADDRESSES = 1024  # the addresses remembered (the oldest forgotten first)

    def __init__(self) -> None:
        self._seen: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def note(self, address: str) -> int:
        """Count a failure from ``address``; the count to log now, or 0 (logged within a minute)."""
        now = time.monotonic()
        logged, count = self._seen.pop(address, (-self.EVERY_S, 0))
        count += 1
        if now - logged >= self.EVERY_S:
            self._seen[address] = (now, 0)
        else:
            self._seen[address] = (logged, count)
            count = 0
        while len(self._seen) > self.ADDRESSES:
            self._seen.popitem(last=False)
        return count


_failed_proofs = _FailedProofs()


class Serving:
    """The relay's connections (see the module's docstring)."""

    # The relay's state this part uses (Relay.__init__ sets it).
    name: str
    qos: Qos
    timeout: float
    every_timeout: float
    max_remotes: int
    _key: bytes
    _frames: FrameSeal
    _sub: "Subscriber"
    _welcome: wire.Welcome | None
    _live: bool
    _closing: bool
    _remotes: list[_Remote]
    _history: collections.deque[RemoteInfo]
    _wanted: threading.Event
    _room_lock: threading.Lock
    _room: int
    _staged: int
    _staging: "Pinned | None"
    _refs: dict[int, int]
    _free: _queue.Queue[int]
    _listener: Any
    _listen_ip: str | None

    def _write_status(self) -> None:
        raise NotImplementedError  # (the relay's)

    async def _listen(self, host: str, port: int) -> Any:
        return _ucx.engine().listen(port, self._serve, self._listen_ip)

    def _set_live(self, live: bool) -> None:
        self._live = live

    def _unref(self, index: int) -> None:
        left = self._refs.get(index, 0) - 1
        if left <= 0:
            self._refs.pop(index, None)
            self._free.put(index)
        else:
            self._refs[index] = left

    def _dispatch(self, index: int, seq: int) -> None:
        """A staged frame: queue it for each remote subscriber that has room for it."""
        takers = []
        for remote in self._remotes:
            if not remote.connected or remote.gone is not None:
                continue
            if remote.qos is Qos.LATEST:
                if remote.credits - len(remote.pending) <= 0:
                    continue
            elif remote.held >= QUOTA:  # an 'every' remote that keeps no pace (the watchdog's clock runs)
                if remote.starved_since is None:
                    remote.starved_since = time.monotonic()
                if self.qos is Qos.LATEST:
                    continue  # (a 'latest' relay skips it: its share of the ring stays its quota)
            if remote.last_seq is not None:  # (what it missed: frames it had no room for, or never staged)
                remote.skipped += max(0, seq - remote.last_seq - 1)
            remote.last_seq = seq
            remote.pending.append(index)
            takers.append(remote)
        try:
            if takers:
                self._refs[index] = len(takers)
                for remote in takers:
                    self._pump(remote)
            else:
                self._free.put(index)
        finally:
            self._want(dispatched=1)

    def _want(self, dispatched: int = 0) -> None:
        """Tell the local thread how many frames some remote subscriber can take now (with
        ``dispatched``, that many of the frames it reserved were dispatched: counted in the same
        step, so that the room it sees is never one too many)."""
        room = 0
        for remote in self._remotes:
            if remote.connected and remote.gone is None:
                if remote.qos is Qos.LATEST:
                    room = max(room, remote.credits - len(remote.pending))
                else:
                    room = max(room, EVERY_ROOM if self.qos is Qos.EVERY else QUOTA - remote.held)
        with self._room_lock:
            self._staged -= dispatched
            self._room = room
            if room - self._staged > 0:
                self._wanted.set()
            else:
                self._wanted.clear()

    def _all_gone(self, code: int, reason: str) -> None:
        self._live = False
        flush_until = time.monotonic() + self.every_timeout if code == Reason.CLOSING else 0.0
        for remote in self._remotes:
            if remote.gone is None:
                remote.flush_until = flush_until
            self._end(remote, code, reason, dropped=False)

    def _end(self, remote: _Remote, code: int, reason: str, dropped: bool) -> None:
        """Tell ``remote`` why it ends (its sender sends GONE between frames, then closes)."""
        if remote.gone is None:
            remote.gone = (code, reason)
            if dropped:
                remote.dropped = reason
                while remote.pending:  # (a dropped remote gets no more frames: its share of the ring comes back)
                    self._unref(remote.pending.popleft())
            remote.wake.set()
            self._want()

    async def _serve(self, ep: Any) -> None:
        """A new connection (the listener's): handshake, then serve it."""
        peer = ep.peer
        try:
            remote = await self._handshake(ep, time.monotonic() + self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            log.info("relay %s: a peer at %s did not finish its handshake in %.3g s", self.name, peer, self.timeout)
            self._abort(ep)
            return
        except Exception as exc:  # noqa: BLE001 - a broken peer is refused, nothing else changes
            log.info("relay %s: a peer at %s was refused: %s", self.name, peer, exc)
            self._abort(ep)
            return
        finally:
            ep.handshaking = False  # (out of the listener's count of pending handshakes)
        if remote is None:
            return
        if peer != "?":  # (the address the connection came from; the HELLO's host and pid are the peer's word)
            log.info("relay %s: %s says it is %s", self.name, peer, remote.peer)
            remote.peer = peer
        peer = remote.peer
        reader: asyncio.Future[Any] | None = None
        try:  # (the remote counts among the relay's from its handshake's last check on: this ends it)
            try:
                await asyncio.wait_for(ep.stream_send(wire.encode_welcome(ep.session, remote.welcome)), self.timeout)
            except Exception as exc:  # noqa: BLE001 - it left, or said nothing in time
                log.info("relay %s: remote subscriber %s did not take its welcome: %s", self.name, peer, exc)
                return
            log.info("relay %s: remote subscriber %s joined (%s)", self.name, peer, remote.qos.name.lower())
            reader = asyncio.ensure_future(self._read_credits(remote))
            remote.tasks.append(reader)
            remote.started = True  # (frames queued since the handshake go out now, after the welcome)
            await self._send_frames(remote)
        finally:
            if reader is not None:
                reader.cancel()
            remote.connected = False
            self._abort(ep)
            while remote.pending:
                self._unref(remote.pending.popleft())
            if remote in self._remotes:
                self._remotes.remove(remote)
            self._want()
            self._history.append(remote.info())
            log.info("relay %s: remote subscriber %s left%s", self.name, peer,
                     f" (dropped: {remote.dropped})" if remote.dropped else "")

    async def _refuse(self, ep: Any, code: int, reason: str, session: Session | None = None) -> None:
        """Refuse the peer with ``reason``: in the clear before the session, sealed after it."""
        try:
            message = wire.encode_refuse(code, reason) if session is None else wire.encode_refused(session, code, reason)
            await asyncio.wait_for(ep.stream_send(message), 1.0)
            await asyncio.sleep(0.05)  # (let it leave before the endpoint goes)
        except Exception:  # noqa: BLE001 - the peer may be gone already
            pass
        self._abort(ep)

    async def _read_step(self, ep: Any, deadline: float, want: wire.Kind, decode: Callable[[memoryview], T]) -> T | None:
        """The peer's next handshake message, of kind ``want``, decoded (None: it was not one, or
        it did not open, and the peer was refused with the reason, in the clear)."""
        buf = np.zeros(wire.HANDSHAKE, np.uint8)
        await _before(ep.stream_recv(buf), deadline)
        try:
            return decode(wire.expect(buf.tobytes(), want))
        except AuthenticationFailed:
            count = _failed_proofs.note(ep.peer)
            if count:
                log.warning("relay of topic %r: %d failed key proof(s) from %s (a peer without the relay's key)",
                            self.name, count, ep.peer)
            await self._refuse(ep, Reason.ACCESS, "authentication failed: the subscriber does not hold the relay's key")
            return None
        except wire.WireError as exc:
            await self._refuse(ep, Reason.PROTOCOL, str(exc))
            return None

    async def _handshake(self, ep: Any, deadline: float) -> _Remote | None:
        """Check the peer (the Noise handshake: its HELLO opens under the key, it confirms the
        session; then it asks for this topic); on success the remote subscriber is one of the
        relay's at once (a slot taken, its sealed welcome still to send). Nothing keyed goes to
        a peer whose HELLO did not open."""
        first = wire.encode_relay()
        await _before(ep.stream_send(first), deadline)
        handshake = Handshake.responder(keys.noise_psk(self._key), wire.prologue(first))
        hello = await self._read_step(ep, deadline, wire.Kind.HELLO, lambda body: wire.decode_hello(handshake, body))
        if hello is None:
            return None
        await _before(ep.stream_send(wire.encode_accept(handshake)), deadline)
        session = handshake.split()
        confirmed = await self._read_step(ep, deadline, wire.Kind.CONFIRM,
                                          lambda body: wire.decode_confirm(session, body))
        if confirmed is None:
            return None
        if hello.name != self.name:
            await self._refuse(ep, Reason.VERSION, f"this relay serves topic {self.name!r}, not {hello.name!r}", session)
            return None
        if self._closing:
            await self._refuse(ep, Reason.CLOSING, "the relay is closing", session)
            return None
        if len(self._remotes) >= self.max_remotes:
            await self._refuse(ep, Reason.BUSY, f"the relay serves {self.max_remotes} remote subscribers already",
                               session)
            return None
        welcome = self._welcome
        if not self._live or welcome is None:
            await self._refuse(ep, NO_PUBLISHER, f"topic {self.name!r} has no publisher at the relay now", session)
            return None
        engine = _ucx.engine()
        mine_tags = session.tag_prefix(receiving=True)
        if not engine.claim_prefix(mine_tags):  # (another connection of this process has it: 2**-56)
            await self._refuse(ep, Reason.BUSY, "a tag collision: connect again", session)
            return None
        # From here on nothing waits: the deadline and the slot are decided together, so a
        # handshake that ends as its time runs out either took a slot (and _serve frees it) or not.
        if time.monotonic() >= deadline:
            engine.forget_prefix(mine_tags)
            raise TimeoutError
        ep.session = session
        ep.use_tags(mine_tags, session.tag_prefix(receiving=False))
        window = LATEST_WINDOW if hello.qos is Qos.LATEST else min(hello.queue, wire.MAX_WINDOW)
        info = self._sub.info
        next_seq = info.next_seq if info is not None else 0
        frames = self._frames
        reply = wire.Welcome(welcome.width, welcome.height, welcome.format, window, welcome.pool,
                             welcome.publisher_pid, welcome.instance, next_seq, welcome.fps, welcome.frame_bytes,
                             frames.mode, frames.key)
        peer = f"{hello.client or '?'} pid {hello.pid}"
        remote = _Remote(ep, peer, hello.qos, hello.queue, window, reply)
        self._remotes.append(remote)
        self._want()
        return remote

    def _pump(self, remote: _Remote) -> None:
        """Post ``remote``'s queued frames while it has credit, up to SEND_AHEAD in flight (called
        when a frame was queued, a credit came, a send ended). Each send ends in :meth:`_sent`."""
        if remote.failure is not None or not remote.connected or not remote.started:
            return
        if remote.closing or (remote.gone is not None and not self._flushing(remote)):
            remote.wake.set()  # (its sender says GONE)
            return
        if not remote.pending:
            return
        staging = self._staging
        assert staging is not None
        buffers = staging.for_ucx()
        while remote.pending and remote.credits > 0 and remote.inflight < SEND_AHEAD:
            index = remote.pending.popleft()
            remote.credits -= 1
            remote.inflight += 1
            remote.posted.append(time.monotonic())
            try:
                remote.ep.send_now(buffers[index], wire.FRAME_TAG, lambda error, i=index: self._sent(remote, i, error))
            except _ucx.LinkError as exc:
                remote.inflight -= 1
                remote.posted.pop()
                self._unref(index)
                self._send_failed(remote, exc)
                return

    def _sent(self, remote: _Remote, index: int, error: BaseException | None) -> None:
        remote.inflight -= 1
        if remote.posted:
            remote.posted.popleft()  # (sends on one endpoint end in order: the oldest is the one that ended)
        self._unref(index)
        if error is not None:
            self._send_failed(remote, error)
            return
        remote.sent += 1
        remote.starved_since = None  # (it keeps pace)
        remote.last_sent = time.monotonic()
        self._pump(remote)
        if remote.gone is not None and not remote.inflight:
            remote.wake.set()  # (the goodbye waits for the frames before it)

    @staticmethod
    def _send_failed(remote: _Remote, error: BaseException) -> None:
        if remote.failure is None:
            remote.failure = error
        remote.wake.set()

    async def _send_frames(self, remote: _Remote) -> None:
        """The sender of one remote subscriber: frames go out through :meth:`_pump`; this sends
        the beats when idle, and the GONE note when the remote subscriber's end was decided (after
        the frames in flight), then returns; a failed send ends it at once."""
        ep = remote.ep
        try:
            while True:
                if remote.failure is not None:
                    log.info("relay %s: sending to %s failed: %s", self.name, remote.peer, remote.failure)
                    return
                if remote.gone is not None and not self._flushing(remote):
                    remote.closing = True  # (a late credit must not send frames after the GONE says how many)
                    # (the goodbye after the frames: a small message would overtake them)
                    wait = 0.0 if remote.dropped is not None else max(1.0, self.every_timeout)
                    deadline = time.monotonic() + wait  # (a dropped one's sends may never end: the reason goes now)
                    while remote.inflight and remote.failure is None and time.monotonic() < deadline:
                        remote.wake.clear()
                        try:
                            await asyncio.wait_for(remote.wake.wait(), max(0.0, deadline - time.monotonic()))
                        except (asyncio.TimeoutError, TimeoutError):
                            break
                    code, reason = remote.gone
                    try:
                        await asyncio.wait_for(self._send_note(ep, wire.Head.GONE, code, reason, remote.sent), 2.0)
                    except Exception as exc:  # noqa: BLE001 - it may be gone or stalled
                        log.debug("relay %s: the goodbye to %s failed: %r", self.name, remote.peer, exc)
                    else:
                        # The endpoint stays until the subscriber took its last frames and the
                        # reason and left: a stopped one reads them when it wakes (closing the
                        # connection under it would lose them), up to the relay's timeout; its
                        # sends in flight keep their staging buffers meanwhile (QUOTA at most).
                        # One that speaks but does not receive is cut off soon: its buffers
                        # come back.
                        silent = time.monotonic() - remote.heard > BEAT_S * 2
                        linger = self.timeout if remote.dropped is not None and (silent or not remote.inflight) else 1.5
                        try:
                            await asyncio.wait_for(ep.lost.wait(), linger)
                        except (asyncio.TimeoutError, TimeoutError):
                            pass
                    return
                self._pump(remote)
                remote.wake.clear()
                try:
                    await asyncio.wait_for(remote.wake.wait(), BEAT_S)
                except (asyncio.TimeoutError, TimeoutError):
                    if not remote.inflight and time.monotonic() - remote.last_sent >= BEAT_S:
                        await self._send_note(ep, wire.Head.BEAT)  # (idle: frames say it is alive otherwise)
        finally:
            self._abort(ep)  # (ends the sends still in flight: their buffers come back in _sent)

    @staticmethod
    def _flushing(remote: _Remote) -> bool:
        """Whether ``remote``, whose end is decided, still gets its pending frames first (the
        publisher closed the topic: what it published before reaches everyone still keeping up)."""
        if not remote.connected or time.monotonic() >= remote.flush_until:
            return False
        return bool(remote.pending)

    async def _send_note(self, ep: Any, kind: wire.Head, code: int = 0, reason: str = "", sent: int = 0) -> None:
        await ep.send(wire.encode_note(ep.session, kind, code, reason, sent), wire.NOTE_TAG)  # (sealed)

    async def _read_credits(self, remote: _Remote) -> None:
        buf = np.zeros(wire.CONTROL, np.uint8)
        try:
            while True:
                await remote.ep.recv(buf, wire.CONTROL_TAG)
                try:
                    kind, count = wire.decode_control(remote.ep.session, buf.tobytes())  # (sealed)
                except AuthenticationFailed:  # (forged or replayed: it changes nothing, not even 'heard')
                    log.info("relay %s: a control message for %s did not open: ignored", self.name, remote.peer)
                    continue
                remote.heard = time.monotonic()
                if kind is wire.Control.CREDIT:
                    remote.credits += count
                    if remote.credits > remote.window:
                        raise wire.WireError(f"credit beyond the window of {remote.window}")
                    remote.starved_since = None
                    if remote.flush_until:  # (flushing after the publisher closed: it keeps pace, go on)
                        remote.flush_until = time.monotonic() + self.every_timeout
                    self._pump(remote)
                    self._want()
                elif kind is wire.Control.BYE:
                    self._end(remote, Reason.CLOSING, "the subscriber closed", dropped=False)
                    return
        except asyncio.CancelledError:
            raise
        except wire.WireError as exc:
            self._end(remote, Reason.PROTOCOL, str(exc), dropped=True)
        except Exception as exc:  # noqa: BLE001 - the endpoint failed: the remote is gone
            remote.gone = remote.gone or (Reason.TRANSPORT, f"the connection failed: {exc}")
            remote.connected = False
            self._abort(remote.ep)  # (ends a send in progress)
            remote.wake.set()

    async def _watch(self) -> None:
        """Drop silent (stalled) remote subscribers and 'every' ones that keep no pace."""
        rounds = 0
        while True:
            await asyncio.sleep(0.1)
            rounds += 1
            if rounds % 10 == 0:
                self._write_status()  # (each second: what `python -m eglcuda topics` shows)
            now = time.monotonic()
            for remote in list(self._remotes):
                if remote.gone is not None:
                    if remote.dropped is not None and now - remote.heard > self.timeout + 2.0:
                        self._abort(remote.ep)  # a stalled peer does not even take the GONE
                    continue
                if now - remote.heard > self.timeout:
                    self._end(remote, Reason.TIMEOUT, f"the remote subscriber said nothing for {self.timeout:.3g} s",
                              dropped=True)
                    asyncio.get_running_loop().call_later(1.0, self._abort, remote.ep)
                elif remote.posted and remote.heard - remote.posted[0] > min(SEND_DEADLINE_S, self.timeout):
                    self._end(remote, Reason.QUEUE_FULL, f"a frame sent to the remote subscriber was not received within "
                              f"{min(SEND_DEADLINE_S, self.timeout):.3g} s while it spoke", dropped=True)
                elif remote.qos is Qos.EVERY and self._starving(remote):
                    if remote.starved_since is None:
                        remote.starved_since = now
                    elif now - remote.starved_since > self.every_timeout:
                        self._end(remote, Reason.QUEUE_FULL, f"the remote subscriber did not release a frame within "
                                  f"every_timeout ({self.every_timeout:.3g} s)", dropped=True)
                else:
                    remote.starved_since = None

    @staticmethod
    def _starving(remote: _Remote) -> bool:
        """Whether an 'every' remote cannot take the frames the relay has for it now."""
        if remote.held >= QUOTA:
            return True
        return bool(remote.pending) and (remote.credits <= 0 or remote.inflight >= SEND_AHEAD)

    def _abort(self, ep: Any) -> None:
        ep.abort()  # (bounded: a dead peer must not hold the engine)

    async def _shut_down(self) -> None:
        watchdog = getattr(self, "_watchdog", None)
        for remote in list(self._remotes):
            self._end(remote, Reason.CLOSING, f"the relay of topic {self.name!r} closed", dropped=False)
        deadline = time.monotonic() + 2.0
        while self._remotes and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for remote in list(self._remotes):
            self._abort(remote.ep)
        await asyncio.sleep(0.05)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if watchdog is not None:
            watchdog.cancel()


async def _before(step: Any, deadline: float) -> Any:
    """``step`` awaited until ``deadline`` (``time.monotonic()``; TimeoutError then)."""
    return await asyncio.wait_for(step, max(0.0, deadline - time.monotonic()))

