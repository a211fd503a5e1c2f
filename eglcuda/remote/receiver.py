"""A remote subscriber's connection to its relay: :func:`join` (the handshake, on the UCX
engine) and :class:`Receiver`, which owns one joined connection: a window of page-locked
buffers with a frame receive posted in each free one (the relay sends only as many frames as
this side gave credit for), the frames that arrived in the relay's order, the relay's notes
(beats, GONE), this side's beats and credits, and the link's end.

Threads: the coroutines and the receives' callbacks run on the engine's thread (_ucx.py). A
frame that arrives is handed at once, on that thread, to the subscriber's :class:`Landing` (its
pool: a copy into a free slot queued there), and its buffer goes back to the relay, with its
credit, as soon as that copy is done: the frame path of a subscriber that keeps up never waits
for the subscriber's thread. The subscriber's thread takes frames (:meth:`Receiver.take`); one
that found no free slot on arrival is copied then, from the window, and its buffer given back
the same way (:meth:`Receiver.give_back_when`). The two threads meet under the receiver's
condition.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import Dropped, Refused, StreamDisconnected, Timeout
from ..topics.protocol import Qos, Reason
from ..topics.readiness import Readiness
from . import _ucx, keys, wire
from .buffers import Pinned
from .session import AuthenticationFailed, FrameMode, Handshake
from .wire import BEAT_S, DISCONNECTED

log = logging.getLogger("eglcuda.remote")

FIRST_WORD_S = 1.0  # how long a new connection waits for the relay's first message before another is made
FRESH_NS = 50_000_000  # a frame this much later than the way's delay is old whatever the frame period
# A frame that arrived: seq, timestamp_ns, payload, window buffer, pool slot it was copied into (-1: not yet)
Arrival = tuple[int, int, bytes, int, int]
NO_SLOT = -1
LONGEST_WAIT_S = 3600.0  # one wait at most (threading refuses a wait past TIMEOUT_MAX: receive(inf)); then again


class Landing(Protocol):
    """Where a receiver's frames land: the subscriber's pool (subscriber.py)."""

    def copy_in(self, link: "Receiver", index: int) -> tuple[int, Callable[[], bool]] | None:
        """On the engine's thread: queue the copy of window buffer ``index`` into a free slot;
        the slot and what says the copy ended, or None (no free slot, or the link is not the
        subscriber's any more: the subscriber's thread copies it when it takes it)."""

    def unused(self, link: "Receiver", slots: list[int]) -> None:
        """``slots`` were copied into from ``link`` and will never be handed out (a 'latest'
        subscriber's older frames): they are free again."""


@dataclass(frozen=True)
class Terms:
    """What a remote subscriber asks of the relay at ``remote`` and holds it to: topic ``name``,
    ``qos`` and ``queue``, ``timeout`` (of the relay's silence), ``frames`` (the least frame
    protection accepted), the pre-shared ``key``."""

    name: str
    qos: Qos
    queue: int
    timeout: float
    remote: tuple[str, int]
    frames: FrameMode
    key: bytes

    @property
    def where(self) -> str:
        return f"{self.remote[0]}:{self.remote[1]}"


async def join(terms: Terms, address: str) -> tuple[Any, wire.Welcome]:
    """Connect to the relay at IPv4 ``address`` (``terms.remote``'s host, looked up) and run the
    handshake (on the engine): the endpoint and the welcome. Raises :class:`eglcuda.Refused`
    (refused, or not a relay this subscriber can use) or :class:`eglcuda.StreamDisconnected` (the
    connection failed)."""
    port = terms.remote[1]
    try:
        ep = _ucx.engine().connect(address, port)
    except Exception as exc:  # noqa: BLE001 - any failure to connect
        raise StreamDisconnected(f"connecting to the relay at {terms.where} failed: {exc}") from None
    try:
        return ep, await _greet(ep, terms)
    except BaseException:
        ep.abort()
        raise


async def _greet(ep: Any, terms: Terms) -> wire.Welcome:
    """The Noise handshake as its initiator (session.py), then the relay's sealed WELCOME; the
    session goes on ``ep.session``, with the frames' seal on it."""
    buf = np.zeros(wire.HANDSHAKE, np.uint8)
    try:
        # (The relay speaks first: wire.encode_relay. A connection to a port nobody listened
        # on when it was made may never say it failed (UCXX's progress thread): a bounded wait,
        # then a fresh connection, so a relay that comes back is joined within a second.)
        await asyncio.wait_for(ep.stream_recv(buf), min(FIRST_WORD_S, terms.timeout))
        first = buf.tobytes()
        wire.expect(first, wire.Kind.RELAY, refusal=True)
        handshake = Handshake.initiator(keys.noise_psk(terms.key), wire.prologue(first))
        hello = wire.Hello(terms.qos, terms.queue, terms.name, os.getpid(), socket.gethostname())
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
        # (False: another connection of this process has it, 2**-56)
        if not _ucx.engine().claim_prefix(tags, (wire.FRAME_TAG, wire.NOTE_TAG)):
            raise StreamDisconnected("a tag collision with another connection: join again")
        ep.recv_prefix = tags  # (given back when the endpoint ends)
        await ep.stream_send(wire.encode_confirm(session))
        buf[:] = 0
        await ep.stream_recv(buf)
        welcome = wire.decode_welcome(session, wire.expect(buf.tobytes(), wire.Kind.WELCOME, refusal=True,
                                                           session=session))
        # (The window is pinned host memory here: never more than this side's QoS asks for.)
        most = wire.latest_window(welcome.frame_bytes) if terms.qos is Qos.LATEST else min(terms.queue, wire.MAX_WINDOW)
        if welcome.window > most:
            raise wire.WireError(f"a window of {welcome.window} frames for a subscriber that takes {most}")
        if welcome.frame_mode < terms.frames:
            raise Refused(f"the relay sends {welcome.frame_mode.name.lower()} frames; this subscriber requires "
                          f"{terms.frames.name.lower()} (Relay(frames=...))", int(Reason.ACCESS))
        session.frames = wire.frame_seal(welcome.frame_key, welcome.frame_mode)
        ep.session = session
        ep.use_tags(tags, session.tag_prefix(receiving=False))
        return welcome
    except (wire.WireError, AuthenticationFailed) as exc:
        raise Refused(f"the peer at {terms.where} is not a relay this subscriber can use: {exc}",
                      int(Reason.PROTOCOL)) from None
    except (Refused, StreamDisconnected, asyncio.CancelledError):
        raise
    except Exception as exc:  # noqa: BLE001 - the endpoint failed mid-handshake
        raise StreamDisconnected(f"the relay at {terms.where} closed the connection during the handshake "
                                 f"({exc})") from None


class Receiver:
    """One joined connection to the relay (see the module's docstring): endpoint ``ep`` after
    :func:`join`, receiving into ``window`` (its own from now on: freed by :meth:`free`)."""

    def __init__(self, ep: Any, window: Pinned, terms: Terms, loop: asyncio.AbstractEventLoop,
                 landing: Landing) -> None:
        self.ep = ep
        self.window = window
        self._terms = terms
        self._loop = loop
        self._landing = landing
        self._readiness: Readiness | None = None  # fileno()'s descriptor, set as frames arrive or the link ends
        self._full = False  # the subscriber holds all it may: arrivals leave the descriptor quiet
        self._cond = threading.Condition()
        self._ready: collections.deque[Arrival] = collections.deque()  # in the relay's order
        self._free: collections.deque[int] = collections.deque(range(len(window)))
        # Credit owed to the relay for buffers that came free, not yet handed to the engine's
        # thread (under _cond); _crediting: a hand-over is queued (it takes all owed by then).
        self._owed = 0
        self._crediting = False
        # Buffers an H2D copy still reads, each with what says it ended, in the copies' order
        # (under _cond); _watching: the engine looks at them (a look is queued or will be).
        self._copying: collections.deque[tuple[int, Callable[[], bool]]] = collections.deque()
        self._watching = False
        # Frames not copied on arrival and not yet given a slot by the subscriber's thread (under
        # _cond): while there are any, no frame is copied on arrival, so that the frames copied
        # on arrival always come before those not (in the relay's order) and a frame taken
        # without a slot always finds one free (the subscriber holds fewer than its pool).
        self._unlanded = 0
        self._copy_since = 0.0  # (engine) when it first found the oldest copy still running
        self.lost: BaseException | None = None  # what ended the link
        self._heard = time.monotonic()
        self._tasks: list[asyncio.Future[Any]] = []
        self._receiving = 0  # frame receives posted and not finished (UCX may write their buffers)
        self._drained = asyncio.Event()  # (used on the loop only) every frame the relay said it sent arrived
        self._arrived = 0  # frames received on this link
        self._expected = 0  # frames the relay's goodbye said it sent
        self._posted = 0  # frame receives posted so far (their order is the relay's)
        self._next_out = 0  # the next of them to hand out
        self._done: dict[int, Arrival] = {}  # finished out of order, by posting order
        self._counters: dict[int, int] = {}  # their frame seals' counters, by posting order
        self._last_counter = 0  # of the last frame handed out (each must be higher: no replay)
        self._ended = threading.Event()  # every receive ended: nothing writes the window any more
        # How old a frame is, on this host's clock, without knowing the publisher's: the least
        # (arrival - publisher's timestamp) seen is the way's own delay; a frame later than that
        # by more than two frame periods (FRESH_NS at least) waited somewhere (this process was
        # stopped, say): a 'latest' subscriber does not take it (_stale_frames).
        self._lag_ns: int | None = None
        self._period_ns = 0  # the publisher's frame period, as the timestamps of the frames received say
        self._last_ts = 0

    # ---- the subscriber's thread ------------------------------------------------------------------
    def watch(self, readiness: Readiness | None) -> None:
        """Set ``readiness`` whenever a frame arrives or the link ends (fileno()'s watchers)."""
        with self._cond:
            self._readiness = readiness

    def take(self, deadline: float, wait: float, closing: Callable[[], bool]) -> Arrival | BaseException | None:
        """The next frame to hand out, waiting until ``deadline`` (``wait`` seconds: for the
        message of :class:`eglcuda.Timeout`); a 'latest' subscriber gets the newest, and the
        frames that waited in the window come free. When no frame is left: the error that ended
        the link; None once ``closing()`` says so (a close from another thread, which wakes it)."""
        latest = self._terms.qos is Qos.LATEST
        unused: list[int] = []
        with self._cond:
            while True:
                while not self._ready and self.lost is None and not closing():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Timeout(f"no frame of topic {self._terms.name!r} within {wait:.3g} s")
                    self._cond.wait(min(left, LONGEST_WAIT_S))
                if closing():
                    return None
                if not latest or not self._stale_frames(unused):
                    break
                self._hand_back(unused)  # (the relay sends the next frame published instead)
            if not self._ready:
                assert self.lost is not None
                return self.lost
            if latest:
                self._let_go_older(len(self._ready) - 1, unused)
            arrival = self._ready.popleft()
            self._hand_back(unused)
        return arrival

    def _stale_frames(self, unused: list[int]) -> bool:
        """In a 'latest' subscriber's window: let go of the frames ready to be taken when even
        the newest of them is old (see _lag_ns); whether it did (under _cond)."""
        if not self._ready or self._lag_ns is None:
            return False
        timestamp = self._ready[-1][1]
        if not timestamp or time.monotonic_ns() - timestamp - self._lag_ns <= max(FRESH_NS, 2 * self._period_ns):
            return False
        self._let_go_older(len(self._ready), unused)
        return True

    def _let_go_older(self, count: int, unused: list[int]) -> None:
        """Let go of the ``count`` oldest frames ready to be taken (under _cond): a buffer not
        copied from yet is free at once and owed to the relay as credit; the slot of a frame
        copied on arrival goes to ``unused`` (its buffer comes free when the copy is done)."""
        for _ in range(count):
            _, _, _, index, slot = self._ready.popleft()
            if slot == NO_SLOT:
                self._free.append(index)
                self._owed += 1
                self._unlanded -= 1
            else:
                unused.append(slot)

    def landed(self) -> None:
        """The subscriber's thread gave a frame taken without a slot one (or failed to)."""
        with self._cond:
            self._unlanded -= 1

    def _hand_back(self, unused: list[int]) -> None:
        """What :meth:`_let_go_older` let go of: the slots to the landing, the credit owed to
        the engine's thread (under _cond: the landing's lock is only ever taken after it)."""
        if unused:
            self._landing.unused(self, unused)
        unused.clear()
        if self._owed and self._owe(0):
            self._hand_credit()

    def give_back(self, index: int) -> None:
        """Window buffer ``index`` was read: a receive goes into it again, the relay gets its credit."""
        with self._cond:
            self._free.append(index)
            hop = self._owe(1)
        if hop:
            self._hand_credit()

    def give_back_when(self, index: int, copied: Callable[[], bool]) -> None:
        """As :meth:`give_back` once ``copied()`` says the copy reading buffer ``index`` ended:
        the engine's thread asks, and credits the relay as soon as it did."""
        with self._cond:
            self._copying.append((index, copied))
            hop = not self._watching
            self._watching = True
        if hop:
            try:
                self._loop.call_soon_threadsafe(self._watch_copies)
            except RuntimeError:  # (the engine stopped: the process is exiting)
                pass

    def state(self) -> bool | BaseException:
        """Whether a frame is there to take (True), else the error that ended the link, else False."""
        with self._cond:
            if self._ready:
                return True
            return self.lost if self.lost is not None else False

    def show(self, readiness: Readiness, full: bool = False) -> None:
        """Make ``readiness`` say whether a frame is there or the link ended (set or cleared under
        the lock the engine's thread sets it under: a frame that arrives meanwhile is not missed).
        ``full``: the subscriber holds all it may, so only the link's end sets it, until the next
        call says otherwise."""
        with self._cond:
            self._full = full
            if self.lost is not None or (self._ready and not full):
                readiness.set()
            else:
                readiness.clear()

    def wake(self) -> None:
        """Wake a :meth:`take` waiting (a close from another thread)."""
        with self._cond:
            self._cond.notify_all()

    def say_bye(self) -> None:
        """Tell the relay this subscriber leaves (bounded: a stalled relay does not hold the close)."""
        if self.lost is None:
            try:
                _ucx.run(self._loop, self._send_control(wire.Control.BYE, 0), 1.0)
            except Exception:  # noqa: BLE001 - a stalled relay: the endpoint is aborted anyway
                pass

    def stop(self) -> bool:
        """End the link and free the window once no receive may write it and no copy reads it
        (False: one did not end in 5 s; the window is left allocated rather than freed under UCX
        or the GPU)."""
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(5)
        except Exception:  # noqa: BLE001 - teardown goes on
            pass
        if not self._ended.wait(5) or not self._copies_ended(time.monotonic() + 5):
            return False
        self.window.close()
        return True

    def _copies_ended(self, deadline: float) -> bool:
        """Wait until every copy from the window ended (a failed query counts as ended), up to
        ``deadline``."""
        with self._cond:
            copies = [copied for _, copied in self._copying]
        for copied in copies:
            while True:
                try:
                    if copied():
                        break
                except Exception:  # noqa: BLE001 - a failing driver: nothing more to wait for
                    break
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.0005)
        return True

    def _owe(self, count: int) -> bool:
        """Count credit owed (under _cond); whether the engine's thread must be woken for it
        (else a hand-over already queued takes it along)."""
        self._owed += count
        if self._crediting:
            return False
        self._crediting = True
        return True

    def _hand_credit(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._give_owed)
        except RuntimeError:  # (the engine stopped: the process is exiting)
            pass

    # ---- the engine's thread ------------------------------------------------------------------------
    async def start(self) -> None:
        self._post_receives()
        self._tasks = [asyncio.ensure_future(self._notes()), asyncio.ensure_future(self._beat())]

    def _post_receives(self) -> None:
        """Post a frame receive into every free buffer of the window (the relay sends only as many
        frames as there are: its credits). Each ends in :meth:`_on_frame`: no task per frame."""
        buffers = self.window.for_ucx()
        while self.lost is None:
            with self._cond:
                index = self._free.popleft() if self._free else None
            if index is None:
                return
            order = self._posted
            try:
                self.ep.recv_now(buffers[index], wire.FRAME_TAG,
                                 lambda error, i=index, o=order: self._on_frame(i, o, error))
            except _ucx.LinkError as exc:
                with self._cond:
                    self._free.appendleft(index)
                self._failed(exc)
                return
            self._receiving += 1
            self._posted += 1

    def _on_frame(self, index: int, order: int, error: BaseException | None) -> None:
        self._receiving -= 1
        try:
            if error is not None:
                raise error
            buffer = self.window.arrays[index]
            # (the frame's seal: its header always, its bytes too in the integrity and encrypted
            # modes, decrypted here in place; AuthenticationFailed if forged or altered)
            self._counters[order] = self.ep.session.frames.open(buffer)
            self._heard = time.monotonic()
            kind, seq, timestamp_ns, length, _, _ = wire.decode_header(buffer[:wire.HEADER].tobytes())
            if kind is not wire.Head.FRAME:
                raise wire.WireError(f"{kind.name} where a frame was expected")
            payload = buffer[wire.HEADER:wire.HEADER + length].tobytes() if length else b""
            if timestamp_ns:
                lag = time.monotonic_ns() - timestamp_ns
                if self._lag_ns is None or lag < self._lag_ns:
                    self._lag_ns = lag
                if self._last_ts and timestamp_ns > self._last_ts:
                    step = timestamp_ns - self._last_ts
                    self._period_ns = step if not self._period_ns else (7 * self._period_ns + step) // 8
                self._last_ts = timestamp_ns
            slot = self._land(index, order)
            unused: list[int] = []
            with self._cond:
                # UCX matches posted receives with the relay's sends in order: handing frames out
                # in posting order keeps the relay's order when receives finish out of order.
                self._done[order] = (seq, timestamp_ns, payload, index, slot)
                while self._next_out in self._done:
                    counter = self._counters.pop(self._next_out)
                    if counter <= self._last_counter:  # (the relay's counter grows: a frame played again)
                        raise AuthenticationFailed(f"a frame came again or out of order (counter {counter} after "
                                                   f"{self._last_counter})")
                    self._last_counter = counter
                    self._ready.append(self._done.pop(self._next_out))
                    self._next_out += 1
                if self._terms.qos is Qos.LATEST and len(self._ready) > 1:
                    # (the newest is the one a 'latest' subscriber takes: the others go now, in the
                    # same step as it came, so that a frame is always there to take meanwhile)
                    self._let_go_older(len(self._ready) - 1, unused)
                owed = self._owed
                self._cond.notify_all()
                if self._readiness is not None and self._ready and not self._full:
                    self._readiness.set()  # (fileno()'s watchers; a write only when it was quiet)
            if unused:
                self._landing.unused(self, unused)
            if owed:
                self._give_owed()  # (on this thread: at once)
            self._arrived += 1
            if self._arrived >= self._expected:
                self._drained.set()
        except Exception as exc:  # noqa: BLE001 - a protocol breach or a failed endpoint
            self._failed(exc)
        finally:
            if not self._receiving and self.lost is not None:
                self._ended.set()

    def _land(self, index: int, order: int) -> int:
        """Hand the frame in window buffer ``index`` (the ``order``-th receive) to the landing:
        the pool slot its copy was queued into (its buffer is given back once that copy is
        done), or NO_SLOT. Only a frame that completed in the relay's order, with none before it
        waiting for a slot, is copied on arrival (see _unlanded)."""
        with self._cond:
            blocked = order != self._next_out or self._unlanded > 0
        landed = None if blocked else self._landing.copy_in(self, index)
        if landed is None:
            with self._cond:
                self._unlanded += 1
            return NO_SLOT
        slot, copied = landed
        with self._cond:
            self._copying.append((index, copied))
            start = not self._watching
            self._watching = True
        if start:
            self._loop.call_soon(self._watch_copies)
        return slot

    def _failed(self, exc: Exception) -> None:
        """End the link on a receive's failure: the relay broke the protocol, or the endpoint failed."""
        name = self._terms.name
        if isinstance(exc, (wire.WireError, AuthenticationFailed)):
            self._end(StreamDisconnected(f"the relay of topic {name!r} broke the protocol: {exc}"))
            self.ep.abort()
        else:
            self._end(StreamDisconnected(f"the relay of topic {name!r} at {self._terms.where} is gone "
                                         f"({type(exc).__name__}: {exc})"))

    async def _notes(self) -> None:
        note = np.zeros(wire.NOTE, np.uint8)
        try:
            while True:
                try:
                    await self.ep.recv(note, wire.NOTE_TAG)
                except _ucx.Truncated:  # (longer than any note: anyone's who saw the tags; it changes nothing)
                    continue
                try:
                    kind, sent, code, reason = wire.decode_note(self.ep.session, note.tobytes())  # (sealed)
                except AuthenticationFailed:  # (forged or replayed: it changes nothing, not even 'heard')
                    continue
                self._heard = time.monotonic()
                if kind is wire.Head.BEAT:
                    continue
                if kind is not wire.Head.GONE:
                    raise wire.WireError(f"{kind.name} as a note")
                if self._arrived < sent:  # (the note overtook frames the relay sent before it: they come first)
                    self._expected = sent
                    self._drained.clear()
                    try:
                        await asyncio.wait_for(self._drained.wait(), self._terms.timeout)
                    except (asyncio.TimeoutError, TimeoutError):
                        pass
                self._end(StreamDisconnected(reason) if code == DISCONNECTED else Dropped(reason, code))
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a protocol breach or a failed endpoint
            self._failed(exc)

    async def _beat(self) -> None:
        timeout = max(self._terms.timeout, wire.SILENCE_LEAST_S)  # (the relay beats every BEAT_S when idle)
        while self.lost is None:
            await asyncio.sleep(BEAT_S)
            if time.monotonic() - self._heard > timeout:
                self._end(StreamDisconnected(
                    f"the relay of topic {self._terms.name!r} said nothing for {timeout:.3g} s (a stalled relay or a "
                    f"cut link)"))
                self.ep.abort()
                return
            try:
                await asyncio.wait_for(self._send_control(wire.Control.BEAT, 0), BEAT_S)
            except (asyncio.TimeoutError, TimeoutError):
                pass
            except Exception:  # noqa: BLE001 - the reader hears of it too
                pass

    def _end(self, error: BaseException) -> None:
        with self._cond:
            if self.lost is None:
                self.lost = error
            self._cond.notify_all()
            if self._readiness is not None:
                self._readiness.set()
        if not self._receiving:
            self._ended.set()  # (else the last receive to end says it)

    async def _send_control(self, kind: wire.Control, count: int) -> None:
        if self.lost is not None:
            return
        try:  # (sealed just before it is posted, in the same step: its nonce is the next of its channel)
            await self.ep.send(wire.encode_control(self.ep.session, kind, count), wire.CONTROL_TAG)
        except Exception:  # noqa: BLE001 - the reader hears of it
            pass

    def _watch_copies(self) -> None:
        """Give back the buffers whose copies ended, in order, and credit the relay for them.
        While one runs (an H2D copy takes 0.01-0.2 ms) the loop looks again at its next turn,
        after what else is ready; after 2 ms of one, every millisecond."""
        freed = 0
        while True:
            with self._cond:
                if not self._copying:
                    self._watching = False
                    break
                index, copied = self._copying[0]
            try:
                done = copied()
            except Exception as exc:  # noqa: BLE001 - the user's thread hears of a failed copy itself
                log.debug("remote topic %s: a copy's end unknown: %s", self._terms.name, exc)
                done = True
            if not done:
                now = time.monotonic()
                if not self._copy_since:
                    self._copy_since = now
                if now - self._copy_since < 0.002:
                    self._loop.call_soon(self._watch_copies)
                else:
                    self._loop.call_later(0.001, self._watch_copies)
                break
            self._copy_since = 0.0
            with self._cond:
                self._copying.popleft()
                self._free.append(index)
            freed += 1
        if freed:
            self._give_credit(freed)

    def _give_owed(self) -> None:
        with self._cond:
            count, self._owed = self._owed, 0
            self._crediting = False
        if count:
            self._give_credit(count)

    def _give_credit(self, count: int) -> None:
        self._post_receives()  # (the receives are posted before the relay hears of the credit)
        if self.lost is not None:
            return
        sealed = wire.encode_control(self.ep.session, wire.Control.CREDIT, count)  # (sealed, just before it is posted)
        message = _ucx.engine().arr(np.frombuffer(sealed, np.uint8))
        try:  # (the callback keeps the message alive until UCX sent it; a failure: the reader hears of it)
            self.ep.send_now(message, wire.CONTROL_TAG, lambda error, keep=message: None)
        except _ucx.LinkError:
            pass

    async def _stop(self) -> None:
        self._end(StreamDisconnected("the link was closed"))
        self.ep.abort()  # (cancels the receives still posted: they end in the engine's next pass)
        if not self._receiving:
            self._ended.set()
        for task in list(self._tasks):  # (not the receives: they end by themselves, and only then is a buffer free)
            task.cancel()
