"""A remote subscriber's side on the UCX engine (_ucx.py): joining a relay (the handshake), then
one link: a frame receive posted into every free buffer of the window, the relay's notes, beats
and credits. :class:`Joining` is a part of :class:`eglcuda.RemoteSubscriber` (subscriber.py),
which owns the state it uses: ``name``, ``qos``, ``queue``, ``timeout``, ``remote``, ``frames``, ``_key``,
``_loop``. The coroutines run on the engine's thread; :meth:`Joining._credit` is called from the
user's thread.
"""
from __future__ import annotations

import asyncio
import collections
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from ..errors import Dropped, Refused, StreamDisconnected
from ..topics.protocol import Qos, Reason
from ..topics.readiness import Readiness
from . import _ucx, keys, wire
from .buffers import Pinned
from .session import AuthenticationFailed, FrameMode, Handshake
from .wire import BEAT_S, DISCONNECTED, LATEST_WINDOW


class _Link:
    """One connection to the relay (state shared by the UCX engine and the user's thread)."""

    def __init__(self, ep: Any, welcome: wire.Welcome, host: Pinned) -> None:
        self.ep = ep
        self.welcome = welcome
        self.host = host
        self.cond = threading.Condition()
        self.ready: collections.deque[tuple[int, int, bytes, int]] = collections.deque()  # seq, time, payload, buffer
        self.free: collections.deque[int] = collections.deque(range(len(host)))
        self.lost: BaseException | None = None
        self.heard = time.monotonic()
        self.tasks: list[asyncio.Future[Any]] = []
        self.receiving = 0  # frame receives posted and not finished (UCX may write their buffers)
        self.drained = asyncio.Event()  # (used on the loop only) every frame the relay said it sent arrived
        self.arrived = 0  # frames received on this link
        self.expected = 0  # frames the relay's goodbye said it sent
        self.posted = 0  # frame receives posted so far (their order is the relay's)
        self.next_out = 0  # the next of them to hand out
        self.done: dict[int, tuple[int, int, bytes, int]] = {}  # finished out of order, by posting order
        self.counters: dict[int, int] = {}  # their frame seals' counters, by posting order
        self.last_counter = 0  # of the last frame handed out (each must be higher: no replay)
        self.ended = threading.Event()  # every receive ended: nothing writes the host buffers any more
        # How old a frame is, on this host's clock, without knowing the publisher's: the least
        # (arrival - publisher's timestamp) seen is the way's own delay; a frame later than that
        # by more than two frame periods (FRESH_NS at least) waited somewhere (this process was
        # stopped, say): a 'latest' subscriber does not take it (subscriber.py).
        self.lag_ns: int | None = None
        self.period_ns = 0  # the publisher's frame period, as the timestamps of the frames received say
        self.last_ts = 0


FIRST_WORD_S = 1.0  # how long a new connection waits for the relay's first message before another is made
FRESH_NS = 50_000_000  # a frame this much later than the way's delay is old whatever the frame period


def stale_frames(link: _Link) -> int:
    """In a 'latest' subscriber's window: move the frames ready to be taken back to the free
    buffers when even the newest of them is old (see _Link.lag_ns); how many (under link.cond)."""
    if not link.ready or link.lag_ns is None:
        return 0
    timestamp = link.ready[-1][1]
    if not timestamp or time.monotonic_ns() - timestamp - link.lag_ns <= max(FRESH_NS, 2 * link.period_ns):
        return 0
    count = len(link.ready)
    while link.ready:
        link.free.append(link.ready.popleft()[3])
    return count


class Joining:
    """The engine's side of a remote subscriber (see the module's docstring)."""

    # The subscriber's state this part uses (RemoteSubscriber.__init__ sets it).
    name: str
    qos: Qos
    queue: int
    timeout: float
    remote: tuple[str, int]
    frames: FrameMode  # the least frame protection this subscriber accepts
    _key: bytes
    _loop: asyncio.AbstractEventLoop | None
    _ready: Readiness | None  # fileno()'s descriptor (None until asked for)

    async def _handshake(self) -> tuple[Any, wire.Welcome]:
        host, port = self.remote
        try:
            ep = _ucx.engine().connect(host, port)
        except Exception as exc:  # noqa: BLE001 - any failure to connect
            raise StreamDisconnected(f"connecting to the relay at {host}:{port} failed: {exc}") from None
        try:
            return ep, await self._greet(ep)
        except BaseException:
            _abort(ep)
            raise

    async def _greet(self, ep: Any) -> wire.Welcome:
        """The Noise handshake as its initiator (session.py), then the relay's sealed WELCOME; the
        session goes on ``ep.session``, with the frames' seal on it."""
        buf = np.zeros(wire.HANDSHAKE, np.uint8)
        try:
            # (The relay speaks first: wire.encode_relay. A connection to a port nobody listened
            # on when it was made may never say it failed (UCXX's progress thread): a bounded wait,
            # then a fresh connection, so a relay that comes back is joined within a second.)
            await asyncio.wait_for(ep.stream_recv(buf), min(FIRST_WORD_S, self.timeout))
            first = buf.tobytes()
            wire.expect(first, wire.Kind.RELAY, refusal=True)
            handshake = Handshake.initiator(keys.noise_psk(self._key), wire.prologue(first))
            hello = wire.Hello(self.qos, self.queue, self.name, os.getpid(), socket.gethostname())
            await ep.stream_send(wire.encode_hello(handshake, hello))
            buf[:] = 0
            await ep.stream_recv(buf)
            try:
                wire.decode_accept(handshake, wire.expect(buf.tobytes(), wire.Kind.ACCEPT, refusal=True))
            except AuthenticationFailed:
                raise Refused("the relay did not prove it holds the key: wrong key, or not an eglcuda relay",
                              int(Reason.ACCESS)) from None
            session = handshake.split()
            # (The receiving prefix is claimed before the CONFIRM: the relay's first frames may
            # come before the WELCOME is read, and the engine's sweep drops messages on prefixes
            # that are nobody's.)
            tags = session.tag_prefix(receiving=True)
            if not _ucx.engine().claim_prefix(tags):  # (another connection of this process has it: 2**-56)
                raise StreamDisconnected("a tag collision with another connection: join again")
            ep.recv_prefix = tags  # (given back when the endpoint ends)
            await ep.stream_send(wire.encode_confirm(session))
            buf[:] = 0
            await ep.stream_recv(buf)
            welcome = wire.decode_welcome(session, wire.expect(buf.tobytes(), wire.Kind.WELCOME, refusal=True,
                                                               session=session))
            # (The window is pinned host memory here: never more than this side's QoS asks for.)
            most = LATEST_WINDOW if self.qos is Qos.LATEST else min(self.queue, wire.MAX_WINDOW)
            if welcome.window > most:
                raise wire.WireError(f"a window of {welcome.window} frames for a subscriber that takes {most}")
            if welcome.frame_mode < self.frames:
                raise Refused(f"the relay sends {welcome.frame_mode.name.lower()} frames; this subscriber requires "
                              f"{self.frames.name.lower()} (Relay(frames=...))", int(Reason.ACCESS))
            session.frames = wire.frame_seal(welcome.frame_key, welcome.frame_mode)
            ep.session = session
            ep.use_tags(tags, session.tag_prefix(receiving=False))
            return welcome
        except (wire.WireError, AuthenticationFailed) as exc:
            raise Refused(f"the peer at {self.remote[0]}:{self.remote[1]} is not a relay this subscriber can use: "
                          f"{exc}", int(Reason.PROTOCOL)) from None
        except (Refused, StreamDisconnected, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the endpoint failed mid-handshake
            raise StreamDisconnected(f"the relay at {self.remote[0]}:{self.remote[1]} closed the connection during "
                                     f"the handshake ({exc})") from None

    async def _start(self, link: _Link) -> None:
        self._post_receives(link)
        link.tasks = [asyncio.ensure_future(self._notes(link)), asyncio.ensure_future(self._beat(link))]

    # ---- on the UCX engine --------------------------------------------------------------------------------
    def _post_receives(self, link: _Link) -> None:
        """Post a frame receive into every free buffer of the window (the relay sends only as many
        frames as there are: its credits). Each ends in :meth:`_on_frame`: no task per frame."""
        buffers = link.host.for_ucx()
        while link.lost is None:
            with link.cond:
                index = link.free.popleft() if link.free else None
            if index is None:
                return
            order = link.posted
            try:
                link.ep.recv_now(buffers[index], wire.FRAME_TAG,
                                 lambda error, i=index, o=order: self._on_frame(link, i, o, error))
            except _ucx.LinkError as exc:
                with link.cond:
                    link.free.appendleft(index)
                self._link_failed(link, exc)
                return
            link.receiving += 1
            link.posted += 1

    def _on_frame(self, link: _Link, index: int, order: int, error: BaseException | None) -> None:
        link.receiving -= 1
        try:
            if error is not None:
                raise error
            buffer = link.host.arrays[index]
            # (the frame's seal: its header always, its bytes too in the integrity and encrypted
            # modes, decrypted here in place; AuthenticationFailed if forged or altered)
            link.counters[order] = link.ep.session.frames.open(buffer)
            link.heard = time.monotonic()
            kind, seq, timestamp_ns, length, _, _ = wire.decode_header(buffer[:wire.HEADER].tobytes())
            if kind is not wire.Head.FRAME:
                raise wire.WireError(f"{kind.name} where a frame was expected")
            payload = buffer[wire.HEADER:wire.HEADER + length].tobytes() if length else b""
            if timestamp_ns:
                lag = time.monotonic_ns() - timestamp_ns
                if link.lag_ns is None or lag < link.lag_ns:
                    link.lag_ns = lag
                if link.last_ts and timestamp_ns > link.last_ts:
                    step = timestamp_ns - link.last_ts
                    link.period_ns = step if not link.period_ns else (7 * link.period_ns + step) // 8
                link.last_ts = timestamp_ns
            with link.cond:
                # UCX matches posted receives with the relay's sends in order: handing frames out
                # in posting order keeps the relay's order when receives finish out of order.
                link.done[order] = (seq, timestamp_ns, payload, index)
                while link.next_out in link.done:
                    counter = link.counters.pop(link.next_out)
                    if counter <= link.last_counter:  # (the relay's counter grows: a frame played again)
                        raise AuthenticationFailed(f"a frame came again or out of order (counter {counter} after "
                                                   f"{link.last_counter})")
                    link.last_counter = counter
                    link.ready.append(link.done.pop(link.next_out))
                    link.next_out += 1
                link.cond.notify_all()
                if self._ready is not None and link.ready:
                    self._ready.set()  # (fileno()'s watchers; a write only when it was quiet)
            link.arrived += 1
            if link.arrived >= link.expected:
                link.drained.set()
        except Exception as exc:  # noqa: BLE001 - a protocol breach or a failed endpoint
            self._link_failed(link, exc)
        finally:
            if not link.receiving and link.lost is not None:
                link.ended.set()

    def _link_failed(self, link: _Link, exc: Exception) -> None:
        """End ``link`` on a receive's failure: the relay broke the protocol, or the endpoint failed."""
        if isinstance(exc, (wire.WireError, AuthenticationFailed)):
            self._end(link, StreamDisconnected(f"the relay of topic {self.name!r} broke the protocol: {exc}"))
            _abort(link.ep)
        else:
            self._end(link, StreamDisconnected(f"the relay of topic {self.name!r} at {self.remote[0]}:{self.remote[1]} "
                                               f"is gone ({type(exc).__name__}: {exc})"))

    async def _notes(self, link: _Link) -> None:
        note = np.zeros(wire.NOTE, np.uint8)
        try:
            while True:
                await link.ep.recv(note, wire.NOTE_TAG)
                try:
                    kind, sent, code, reason = wire.decode_note(link.ep.session, note.tobytes())  # (sealed)
                except AuthenticationFailed:  # (forged or replayed: it changes nothing, not even 'heard')
                    continue
                link.heard = time.monotonic()
                if kind is wire.Head.BEAT:
                    continue
                if kind is not wire.Head.GONE:
                    raise wire.WireError(f"{kind.name} as a note")
                if link.arrived < sent:  # (the note overtook frames the relay sent before it: they come first)
                    link.expected = sent
                    link.drained.clear()
                    try:
                        await asyncio.wait_for(link.drained.wait(), self.timeout)
                    except (asyncio.TimeoutError, TimeoutError):
                        pass
                self._end(link, StreamDisconnected(reason) if code == DISCONNECTED else Dropped(reason, code))
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a protocol breach or a failed endpoint
            self._link_failed(link, exc)

    async def _beat(self, link: _Link) -> None:
        while link.lost is None:
            await asyncio.sleep(BEAT_S)
            if time.monotonic() - link.heard > self.timeout:
                self._end(link, StreamDisconnected(
                    f"the relay of topic {self.name!r} said nothing for {self.timeout:.3g} s (a stalled relay or a cut "
                    f"link)"))
                _abort(link.ep)
                return
            try:
                await asyncio.wait_for(self._send_control(link, wire.Control.BEAT, 0), BEAT_S)
            except (asyncio.TimeoutError, TimeoutError):
                pass
            except Exception:  # noqa: BLE001 - the reader hears of it too
                pass

    def _end(self, link: _Link, error: BaseException) -> None:
        with link.cond:
            if link.lost is None:
                link.lost = error
            link.cond.notify_all()
            if self._ready is not None:
                self._ready.set()
        if not link.receiving:
            link.ended.set()  # (else the last receive to end says it)

    async def _send_control(self, link: _Link, kind: wire.Control, count: int) -> None:
        if link.lost is not None:
            return
        try:  # (sealed just before it is posted, in the same step: its nonce is the next of its channel)
            await link.ep.send(wire.encode_control(link.ep.session, kind, count), wire.CONTROL_TAG)
        except Exception:  # noqa: BLE001 - the reader hears of it
            pass

    def _credit(self, link: _Link, count: int) -> None:
        """``count`` buffers of the window came free (the user's thread): post receives, tell the relay."""
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._give_credit, link, count)
            except RuntimeError:  # (the engine stopped: the process is exiting)
                pass

    def _give_credit(self, link: _Link, count: int) -> None:
        self._post_receives(link)  # (the receives are posted before the relay hears of the credit)
        if link.lost is not None:
            return
        sealed = wire.encode_control(link.ep.session, wire.Control.CREDIT, count)  # (sealed, just before it is posted)
        message = _ucx.engine().arr(np.frombuffer(sealed, np.uint8))
        try:  # (the callback keeps the message alive until UCX sent it; a failure: the reader hears of it)
            link.ep.send_now(message, wire.CONTROL_TAG, lambda error, keep=message: None)
        except _ucx.LinkError:
            pass

    async def _stop_link(self, link: _Link) -> None:
        self._end(link, StreamDisconnected("the link was closed"))
        _abort(link.ep)  # (cancels the receives still posted: they end in the engine's next pass)
        if not link.receiving:
            link.ended.set()
        for task in list(link.tasks):  # (not the receives: they end by themselves, and only then is a buffer free)
            task.cancel()


def _abort(ep: Any) -> None:
    ep.abort()  # (bounded: a dead peer must not hold the engine)

