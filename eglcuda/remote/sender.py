"""One remote subscriber as its relay serves it: :class:`Sender` owns that connection's window
and credits, the staging buffers queued for it and its sends in flight (a few at a time), its
beats and GONE note, its credit reader, the watchdog's verdict on it, and its end.

Everything here runs on the UCX engine's thread (_ucx.py). What a sender needs of its relay is
handed to it: the staging ring (buffers to send, references to give back) and two calls, one
when the frames it can take changed and one when it left.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..topics.protocol import Qos, Reason
from . import _ucx, wire
from .session import AuthenticationFailed
from .staging import Staging
from .wire import BEAT_S, SEND_AHEAD

log = logging.getLogger("eglcuda.remote")
EVERY_ROOM = 1 << 30  # an 'every' remote subscriber of an 'every' relay takes every frame (the relay waits instead)
# Staging buffers one remote subscriber may hold (frames queued for it and sends in flight): a
# stopped or deaf remote holds at most this many of the ring, whatever its window.
QUOTA = SEND_AHEAD + 1
# A send still in flight this long while its remote subscriber speaks (beats, credits) means it
# does not receive: it is dropped, and its staging buffers come back. (A silent one is the
# relay's ``timeout``'s business: a stopped process that wakes within it goes on.)
SEND_DEADLINE_S = 2.0
# A 'latest' remote that keeps up has one frame staged ahead of its credit (its next frame is
# copied while the credit is on the way, and goes out as the credit comes); a staged-ahead frame
# older than this is let go instead of sent (a fresh one is staged), and none is staged again
# until a credit came: a stopped remote holds no buffer for it, and a woken one gets a fresh frame.
AHEAD_FRESH_S = 0.01
# A 'latest' remote subscriber silent this long (three beats) whose sends hold staging buffers
# while the ring had none free for a frame lately is dropped then, not at the relay's ``timeout``:
# a few remotes stopped one after another would hold the whole ring, and every other remote would
# get nothing until then. (An 'every' one is its every_timeout's business.)
SILENT_HOLDING_S = 3 * BEAT_S
# Silence, or a send in flight, this long while the relay needs every staging buffer back (its
# publisher came back with frames of another size) means that remote does not receive: it is
# ended then, not waited for.
STUCK_S = 2 * BEAT_S
# A remote subscriber beats once each BEAT_S (receiver.py). It may beat ahead of that pace by this
# many, plus the beats of two silences (a stalled link delivers them together; a longer stall is
# the silence limit's business): more opened beats than that are a flood from a key holder, each
# costing the relay's loop a decrypt while UCX keeps in memory what the loop has not read yet. It
# is dropped.
BEATS_AHEAD = 8


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


@dataclass(frozen=True)
class Limits:
    """A relay's limits on each of its remote subscribers: ``timeout`` of silence (and of the
    welcome), ``every_timeout`` without progress; ``topic`` names the relay in the log."""

    topic: str
    timeout: float
    every_timeout: float

    @property
    def silence(self) -> float:
        """How long a remote subscriber may say nothing before it is dropped: ``timeout``, and
        never less than two of its beats (wire.SILENCE_LEAST_S)."""
        return max(self.timeout, wire.SILENCE_LEAST_S)


class Sender:
    """The relay's side of one connected remote subscriber (see the module's docstring).

    :param changed: called when the frames this sender can take changed (a credit came, its end
        was decided), for the relay's count of the room its local thread may fill.
    :param left: called once, when the connection ended and this sender let go of its buffers.
    """

    def __init__(self, ep: Any, peer: str, qos: Qos, queue: int, window: int, welcome: wire.Welcome,
                 staging: Staging, limits: Limits, changed: Callable[[], None],
                 left: Callable[["Sender"], None]) -> None:
        self.ep = ep
        self.peer = peer
        self.qos = qos
        self.queue = queue
        self._welcome = welcome
        self._window = window
        self._staging = staging
        self._limits = limits
        self._changed = changed
        self._left = left
        self._credits = window
        self._pending: collections.deque[tuple[int, float]] = collections.deque()  # (staging buffer, staged at) to send
        self._ahead = 1 if qos is Qos.LATEST else 0  # frames it may have staged beyond its credits ('latest': 0 or 1)
        self._started = False  # it took its welcome: frames may go out (they wait in _pending until then)
        self._closing = False  # it is saying GONE: no frame goes out after that
        self._last_sent = 0.0  # time.monotonic() of its last frame sent (beats only when idle)
        self._inflight = 0  # frames posted to UCX and not yet sent
        self._posted: collections.deque[float] = collections.deque()  # time.monotonic() of each send in flight
        self._failure: BaseException | None = None  # a send failed: the connection ends
        self._wake = asyncio.Event()  # run() looks again (an end decided, a failure, the last send)
        self._sent = 0
        self._skipped = 0
        self._last_seq: int | None = None  # of the last frame queued for it
        self._first_after = -1  # it takes no frame up to this one (start_after)
        self._dropped: str | None = None
        self._gone: tuple[int, str] | None = None  # (code, reason) to send, then close
        # It said BYE: served no more, though its connection lasts until it is gone. The relay's
        # count of remotes skips it, so that a subscriber made as this one closed is not refused.
        self.left = False
        # After the publisher closed the topic: the frames still pending go out first, until then
        # (time.monotonic(); each credit it returns moves that every_timeout on: it keeps pace), as a
        # local subscriber gets every frame published before the close.
        self._flush_until = 0.0
        self._since = time.time()
        self._heard = time.monotonic()
        self._beats_most = BEATS_AHEAD + 2 * limits.silence / BEAT_S
        self._beats_left = self._beats_most  # beats it may send ahead of its pace (BEATS_AHEAD)
        self._beat_at = self._heard
        self._starved_since: float | None = None  # an 'every' remote that could not take a frame since
        self._connected = True

    # ---- what the relay asks -------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Connected, and its end not decided: it takes frames."""
        return self._connected and self._gone is None

    @property
    def held(self) -> int:
        """Staging buffers this remote holds: frames queued for it and sends in flight."""
        return len(self._pending) + self._inflight

    def stuck(self, now: float) -> bool:
        """Whether it holds staging buffers and either said nothing, or has had a send in flight,
        for more than STUCK_S before ``now`` (a remote that receives beats, and its sends end)."""
        if not self.held:
            return False
        return now - self._heard > STUCK_S or (bool(self._posted) and now - self._posted[0] > STUCK_S)

    def info(self) -> RemoteInfo:
        return RemoteInfo(self.peer, self.qos.name.lower(), self.queue, self._sent, self._skipped, self._dropped,
                          self._since, self._connected)

    def room(self, every_relay: bool) -> int:
        """How many more frames it can take now (0 once its end was decided)."""
        if not self.active:
            return 0
        if self.qos is Qos.LATEST:
            return min(self._credits + self._ahead - len(self._pending), QUOTA - self.held)
        return EVERY_ROOM if every_relay else QUOTA - self.held

    def start_after(self, seq: int) -> None:
        """Take no frame up to ``seq`` (its first frame is a later one)."""
        self._first_after = seq

    def offer(self, index: int, seq: int, every_relay: bool) -> bool:
        """Queue staged frame ``seq`` (staging buffer ``index``) for it, if it has room (True);
        the relay counts a reference to the buffer for each taker, then calls :meth:`pump`."""
        if not self.active or seq <= self._first_after:
            return False
        if self.qos is Qos.LATEST:
            if self._credits + self._ahead - len(self._pending) <= 0 or self.held >= QUOTA:
                return False
        elif self.held >= QUOTA:  # an 'every' remote that keeps no pace (the watchdog's clock runs)
            if self._starved_since is None:
                self._starved_since = time.monotonic()
            if not every_relay:
                return False  # (a 'latest' relay skips it: its share of the ring stays its quota)
        if self._last_seq is not None:  # (what it missed: frames it had no room for, or never staged)
            self._skipped += max(0, seq - self._last_seq - 1)
        self._last_seq = seq
        self._pending.append((index, time.monotonic()))
        return True

    def end(self, code: int, reason: str, dropped: bool, flush_until: float = 0.0) -> None:
        """Tell it why it ends (:meth:`run` sends GONE between frames, then closes). With
        ``flush_until`` (the publisher closed the topic), the frames pending go out first."""
        if self._gone is not None:
            return
        self._flush_until = flush_until
        self._gone = (code, reason)
        if dropped:
            self._dropped = reason
            self._let_go_pending()  # (a dropped remote gets no more frames: its share of the ring comes back)
        self._wake.set()
        self._changed()

    def check(self, now: float) -> None:
        """The watchdog's look (every 0.1 s): drop it when silent, deaf or (``every``) slow."""
        limits = self._limits
        if self._gone is not None:
            if self._dropped is not None and now - self._heard > limits.silence + 2.0:
                self.abort()  # a stalled peer does not even take the GONE
            return
        if self.qos is Qos.LATEST and self._let_go_stale(now):
            self._changed()
        deadline = min(SEND_DEADLINE_S, limits.timeout)
        if now - self._heard > limits.silence:
            self.end(Reason.TIMEOUT, f"the remote subscriber said nothing for {limits.silence:.3g} s", dropped=True)
            asyncio.get_running_loop().call_later(1.0, self.abort)
        elif (self.qos is Qos.LATEST and now - self._heard > SILENT_HOLDING_S and self.held
              and self._staging.refused_since(now - BEAT_S)):
            self.end(Reason.TIMEOUT, f"the remote subscriber said nothing for {now - self._heard:.3g} s while its "
                     "frames held staging buffers the relay's other remote subscribers needed", dropped=True)
            asyncio.get_running_loop().call_later(0.25, self.abort)
        elif self._posted and self._heard - self._posted[0] > deadline:
            self.end(Reason.QUEUE_FULL, f"a frame sent to the remote subscriber was not received within "
                     f"{deadline:.3g} s while it spoke", dropped=True)
        elif self.qos is Qos.EVERY and self._starving():
            if self._starved_since is None:
                self._starved_since = now
            elif now - self._starved_since > limits.every_timeout:
                self.end(Reason.QUEUE_FULL, f"the remote subscriber did not release a frame within "
                         f"every_timeout ({limits.every_timeout:.3g} s)", dropped=True)
        else:
            self._starved_since = None

    def abort(self) -> None:
        """End the connection now (bounded: a dead peer must not hold the engine); the sends
        still in flight end, and their buffers come back."""
        self.ep.abort()

    # ---- the connection's life -----------------------------------------------------------------
    async def run(self) -> None:
        """Serve it from its welcome to its end, then let go of its buffers and tell the relay."""
        reader: asyncio.Future[Any] | None = None
        limits = self._limits
        try:
            try:
                await asyncio.wait_for(self.ep.stream_send(wire.encode_welcome(self.ep.session, self._welcome)),
                                       limits.timeout)
            except Exception as exc:  # noqa: BLE001 - it left, or said nothing in time
                log.info("relay %s: remote subscriber %s did not take its welcome: %s", limits.topic, self.peer, exc)
                return
            log.info("relay %s: remote subscriber %s joined (%s)", limits.topic, self.peer, self.qos.name.lower())
            reader = asyncio.ensure_future(self._read_credits())
            self._started = True  # (frames queued since the handshake go out now, after the welcome)
            await self._send_frames()
        finally:
            if reader is not None:
                reader.cancel()
            self._connected = False
            self.abort()
            self._let_go_pending()
            self._left(self)
            log.info("relay %s: remote subscriber %s left%s", limits.topic, self.peer,
                     f" (dropped: {self._dropped})" if self._dropped else "")

    def pump(self) -> None:
        """Post the queued frames while it has credit, up to SEND_AHEAD in flight (called when a
        frame was queued, a credit came, a send ended). Each send ends in :meth:`_sent`."""
        if self._failure is not None or not self._connected or not self._started:
            return
        if self._closing or (self._gone is not None and not self._flushing()):
            self._wake.set()  # (run() says GONE)
            return
        if not self._pending:
            return
        if self.qos is Qos.LATEST and self._credits > 0 and self._let_go_stale(time.monotonic()):
            self._changed()  # (a fresh frame is staged for the credit instead)
        buffers = self._staging.for_ucx()
        while self._pending and self._credits > 0 and self._inflight < SEND_AHEAD:
            index = self._pending.popleft()[0]
            self._credits -= 1
            self._inflight += 1
            self._posted.append(time.monotonic())
            try:
                self.ep.send_now(buffers[index], wire.FRAME_TAG, lambda error, i=index: self._sent_one(i, error))
            except _ucx.LinkError as exc:
                self._inflight -= 1
                self._posted.pop()
                self._staging.unref(index)
                self._fail(exc)
                return

    def _sent_one(self, index: int, error: BaseException | None) -> None:
        self._inflight -= 1
        if self._posted:
            self._posted.popleft()  # (sends on one endpoint end in order: the oldest is the one that ended)
        self._staging.unref(index)
        if error is not None:
            self._fail(error)
            return
        self._sent += 1
        self._starved_since = None  # (it keeps pace)
        self._last_sent = time.monotonic()
        self.pump()
        if self._gone is not None and not self._inflight:
            self._wake.set()  # (the goodbye waits for the frames before it)

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._wake.set()

    def _let_go_pending(self) -> None:
        while self._pending:
            self._staging.unref(self._pending.popleft()[0])

    def _let_go_stale(self, now: float) -> bool:
        """A 'latest' remote's frames staged more than AHEAD_FRESH_S ago, not sent: let go (they
        count as skipped), and nothing staged ahead of its credit until the next one came."""
        stale = False
        while self._pending and now - self._pending[0][1] > AHEAD_FRESH_S:
            self._staging.unref(self._pending.popleft()[0])
            self._skipped += 1
            stale = True
        if stale:
            self._ahead = 0
        return stale

    def _flushing(self) -> bool:
        """Whether it, whose end is decided, still gets its pending frames first (the publisher
        closed the topic: what it published before reaches everyone still keeping up)."""
        if not self._connected or time.monotonic() >= self._flush_until:
            return False
        return bool(self._pending)

    def _starving(self) -> bool:
        """Whether an 'every' remote cannot take the frames the relay has for it now."""
        if self.held >= QUOTA:
            return True
        return bool(self._pending) and (self._credits <= 0 or self._inflight >= SEND_AHEAD)

    async def _send_frames(self) -> None:
        """Frames go out through :meth:`pump`; this sends the beats when idle, and the GONE note
        when its end was decided (after the frames in flight), then returns; a failed send ends
        it at once."""
        ep = self.ep
        limits = self._limits
        try:
            while True:
                if self._failure is not None:
                    log.info("relay %s: sending to %s failed: %s", limits.topic, self.peer, self._failure)
                    return
                if self._gone is not None and not self._flushing():
                    await self._say_gone()
                    return
                self.pump()
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), BEAT_S)
                except (asyncio.TimeoutError, TimeoutError):
                    if not self._inflight and time.monotonic() - self._last_sent >= BEAT_S:
                        try:
                            await self._send_note(wire.Head.BEAT)  # (idle: frames say it is alive otherwise)
                        except _ucx.LinkError as exc:  # (it left meanwhile: ended above, not by the task's traceback)
                            self._fail(exc)
        finally:
            self.abort()  # (ends the sends still in flight: their buffers come back in _sent_one)

    async def _say_gone(self) -> None:
        """The GONE note, after the frames in flight (a small message would overtake them); then
        the endpoint stays a while for the subscriber to read it."""
        assert self._gone is not None
        limits = self._limits
        self._closing = True  # (a late credit must not send frames after the GONE says how many)
        self._let_go_pending()  # (never sent now: their buffers back at once, not when it has gone)
        wait = 0.0 if self._dropped is not None else max(1.0, limits.every_timeout)
        deadline = time.monotonic() + wait  # (a dropped one's sends may never end: the reason goes now)
        while self._inflight and self._failure is None and time.monotonic() < deadline:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - time.monotonic()))
            except (asyncio.TimeoutError, TimeoutError):
                break
        code, reason = self._gone
        try:
            await asyncio.wait_for(self._send_note(wire.Head.GONE, code, reason, self._sent), 2.0)
        except Exception as exc:  # noqa: BLE001 - it may be gone or stalled
            log.debug("relay %s: the goodbye to %s failed: %r", limits.topic, self.peer, exc)
            return
        # The endpoint stays until the subscriber took its last frames and the reason and left:
        # a stopped one reads them when it wakes (closing the connection under it would lose
        # them), up to the relay's timeout; its sends in flight keep their staging buffers
        # meanwhile (QUOTA at most). One that speaks but does not receive is cut off soon: its
        # buffers come back.
        silent = time.monotonic() - self._heard > BEAT_S * 2
        linger = limits.timeout if self._dropped is not None and (silent or not self._inflight) else 1.5
        try:
            await asyncio.wait_for(self.ep.lost.wait(), linger)
        except (asyncio.TimeoutError, TimeoutError):
            pass

    async def _send_note(self, kind: wire.Head, code: int = 0, reason: str = "", sent: int = 0) -> None:
        await self.ep.send(wire.encode_note(self.ep.session, kind, code, reason, sent), wire.NOTE_TAG)  # (sealed)

    def credit(self, count: int) -> None:
        """``count`` frames' credit came back: the frames queued go out (:class:`wire.WireError`
        for credit beyond the window)."""
        self._credits += count
        if self._credits > self._window:
            raise wire.WireError(f"credit beyond the window of {self._window}")
        if self.qos is Qos.LATEST:
            self._ahead = 1  # (it keeps up: its next frame may be staged before its credit)
        self._starved_since = None
        if self._flush_until:  # (flushing after the publisher closed: it keeps pace, go on)
            self._flush_until = time.monotonic() + self._limits.every_timeout
        self.pump()
        self._changed()

    def control(self, kind: wire.Control, count: int) -> bool:
        """Act on a control message of the remote subscriber's that opened under its session:
        True when it said BYE (it reads no more). :class:`wire.WireError` for one the protocol
        never sends: a credit of no frame, credit beyond the window, beats faster than it beats."""
        now = time.monotonic()
        self._heard = now
        if kind is wire.Control.CREDIT:
            if count <= 0:
                raise wire.WireError("a credit of no frame")
            self.credit(count)
        elif kind is wire.Control.BEAT:
            self._beats_left = min(self._beats_most, self._beats_left + (now - self._beat_at) / BEAT_S) - 1
            self._beat_at = now
            if self._beats_left < 0:
                raise wire.WireError(f"beats faster than one each {BEAT_S} s (a flood)")
        elif kind is wire.Control.BYE:
            self.left = True
            self._let_go_pending()  # (a leaving subscriber takes no more frames: their buffers back)
            self.end(Reason.CLOSING, "the subscriber closed", dropped=False)
            return True
        return False

    async def _read_credits(self) -> None:
        ep = self.ep
        buf = np.zeros(wire.CONTROL, np.uint8)
        try:
            while True:
                try:
                    await ep.recv(buf, wire.CONTROL_TAG)
                except _ucx.Truncated:  # (longer than any control message: anyone's who saw the tags)
                    log.info("relay %s: an oversized control message for %s: ignored", self._limits.topic, self.peer)
                    continue
                try:
                    kind, count = wire.decode_control(ep.session, buf.tobytes())  # (sealed)
                except AuthenticationFailed:  # (forged or replayed: it changes nothing, not even 'heard')
                    log.info("relay %s: a control message for %s did not open: ignored", self._limits.topic,
                             self.peer)
                    continue
                if self.control(kind, count):
                    return
        except asyncio.CancelledError:
            raise
        except wire.WireError as exc:
            self.end(Reason.PROTOCOL, str(exc), dropped=True)
            self.ep.forget_tags()  # (nothing more is read from it: a flood goes on being dropped)
        except Exception as exc:  # noqa: BLE001 - the endpoint failed: the remote is gone
            self._gone = self._gone or (Reason.TRANSPORT, f"the connection failed: {exc}")
            self._connected = False
            self.abort()  # (ends a send in progress)
            self._wake.set()
