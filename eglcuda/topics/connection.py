"""A subscriber's connection to its publisher after the handshake: the publisher's messages read
in order (each FRAME handed back; SLOT and NOTICE handled on the way; a DROP or BYE raised as
:class:`eglcuda.Dropped` with its reason), and the subscriber's releases written without ever
blocking (queued while the publisher's socket is full)."""
from __future__ import annotations

import collections
from typing import Any, Callable, NoReturn, cast, overload

from ..errors import ClosedError, Dropped, EglCudaError, PeerError, StreamDisconnected, Timeout
from . import _wire, protocol, sockets
from .joining import Joined
from .protocol import Reason

# Messages a subscriber reads past, looking for its drop, when one before it cannot be used: more
# than a publisher sends before a drop (a SLOT and a FRAME per frame of the queue, NOTICEs).
_READ_AHEAD = 4 * protocol.MAX_POOL + 4 * protocol.MAX_QUEUE
# Frames announced and not taken, and releases the publisher's full socket did not take, at most:
# a publisher announces a frame only within the subscriber's credit (at most MAX_QUEUE frames it has
# not read the release of), so more than this is a publisher that lies or announces without reading.
_AHEAD_MAX = 4 * protocol.MAX_QUEUE
_Frame = protocol.Frame


class Lost(Exception):
    """The connection is over, for ``error``: the subscriber lets go of everything and raises it.
    ``goodbye``: the publisher closed the topic (a BYE), after every frame it announced before."""

    def __init__(self, error: BaseException, goodbye: bool = False) -> None:
        super().__init__(error)
        self.error = error
        self.goodbye = goodbye


class Connection:
    """``closing()`` says a close() from another thread woke a wait (then ``closed_error()`` is
    raised). The end of the subscription is raised as :class:`Lost`."""

    def __init__(self, name: str, joined: Joined, closing: Callable[[], bool],
                 closed_error: Callable[[], ClosedError]) -> None:
        self.name = name
        self.sock = joined.sock
        self.fd = self.sock.fileno()  # (releases are sent on it by _wire.send_release)
        self.inbox = joined.inbox
        self.ring = joined.ring  # plain releases go into it (no system call), the others by socket
        self.transport = joined.transport
        if self.ring is not None:  # (its views ask it whether the publisher dropped this subscriber)
            self.transport.ring = self.ring
        self.limit = joined.limit  # messages the subscriber may hold at once
        self.pending: collections.deque[protocol.Frame] = collections.deque()  # announced, not taken yet
        self.unsent: collections.deque[bytes] = collections.deque()  # releases the full socket did not take
        self.notice = -1  # the newest frame the publisher skipped this subscriber for
        self.last_seen: int | None = None  # the last frame announced
        # The publisher's goodbye, read past the newest frame announced before it ('latest'): it
        # ends the subscription at the next read, once that frame was taken.
        self.ended: Lost | None = None
        self._closing = closing
        self._closed_error = closed_error

    def _lose(self, error: BaseException) -> NoReturn:
        raise Lost(error)

    # ---- reading ---------------------------------------------------------------------------------
    def next_frame(self, deadline: float) -> protocol.Frame:
        if self.pending:
            return self.pending.popleft()
        if self.ended is not None:
            raise self.ended
        received = self.inbox.next(deadline)
        if received.__class__ is _Frame:  # (the usual case, without read()'s loop)
            last = self.last_seen
            if last is None or received.seq > last:
                self.last_seen = received.seq
                return received
        return cast(protocol.Frame, self._handle(received, deadline))

    @overload
    def read(self, deadline: float) -> protocol.Frame: ...
    @overload
    def read(self, deadline: None, rest: bool = False) -> protocol.Frame | None: ...
    def read(self, deadline: float | None, rest: bool = False) -> protocol.Frame | None:
        """The next FRAME, handling the other messages on the way. With ``deadline`` None, only
        what is already waiting: None when no FRAME is (``rest``: what the last read found
        waiting, without asking the socket again when that read emptied it)."""
        if self.ended is not None:
            raise self.ended
        return self._handle(self.inbox.rest() if rest else self.inbox.next(deadline), deadline)

    def _handle(self, received: Any, deadline: float | None) -> protocol.Frame | None:
        """read()'s work from its first message on, ``received``."""
        inbox = self.inbox
        while True:
            kind = received.__class__
            if kind is protocol.Frame:
                frame: protocol.Frame = received
                last = self.last_seen
                if last is not None and frame.seq <= last:
                    self._lose(PeerError(f"topic {self.name!r}: frame {frame.seq} came after frame {last}"))
                self.last_seen = frame.seq
                return frame
            if received is None:
                if deadline is None:
                    return None
                raise Timeout(f"no frame of topic {self.name!r} arrived in time")
            if kind is bytes and not received:
                if self._closing():  # woken by close() in another thread: the connection is fine
                    raise self._closed_error()
                self._lose(StreamDisconnected(f"the publisher of topic {self.name!r} is gone: its connection closed "
                                              "without a goodbye (its process exited or was killed)"))
            message: protocol.Message = received
            fds: list[int] = []
            if kind is protocol.Carried:  # (a SLOT of a transport that passes descriptors)
                received, fds = received
                kind = bytes
            try:
                if kind is bytes:  # not a FRAME (nor a RELEASE): the generic decoder checks it
                    try:
                        message = protocol.decode(received, len(fds))
                    except protocol.ProtocolError as exc:
                        self._lose(PeerError(f"the publisher of topic {self.name!r} sent a malformed message: {exc}"))
                if isinstance(message, protocol.Slot):
                    try:
                        self.transport.on_slot(message, fds)
                    except (EglCudaError, protocol.ProtocolError) as exc:
                        self._lose(self.drop_waiting() or StreamDisconnected(
                            f"topic {self.name!r}: opening pool slot {message.slot} failed: {exc}"))
            finally:
                sockets.close_fds(fds)
            if isinstance(message, protocol.Notice):
                self.notice = max(self.notice, message.seq)
            elif isinstance(message, (protocol.Drop, protocol.Bye)):
                raise Lost(self.dropped(message), goodbye=isinstance(message, protocol.Bye))
            elif not isinstance(message, protocol.Slot):  # (a SLOT was opened above)
                self._lose(PeerError(f"the publisher of topic {self.name!r} sent {type(message).__name__} mid-stream"))
            received = inbox.rest() if deadline is None else inbox.next(deadline)

    def hold_back(self, header: protocol.Frame) -> None:
        """Keep an announced frame for a later receive (this subscriber holds all it may now)."""
        if len(self.pending) >= _AHEAD_MAX:
            self._lose(PeerError(f"the publisher of topic {self.name!r} announced more than {_AHEAD_MAX} frames "
                                 "beyond this subscriber's credit"))
        self.pending.append(header)

    def newest(self, header: protocol.Frame, skip: Callable[[protocol.Frame], None]) -> protocol.Frame:
        """The newest frame already announced (older ones go to ``skip``, unread). A goodbye
        read past it ends the subscription at the next read: the frames announced before the
        publisher closed the topic are still its to read (it waits for its subscribers to leave
        before it frees them). A drop does not wait: the publisher let go of this subscriber's
        frames."""
        while True:
            newer: protocol.Frame | None
            if self.pending:
                newer = self.pending.popleft()
            else:
                try:
                    newer = self.read(None, rest=True)  # (what came with it; a newer one is for the next receive)
                except Lost as lost:
                    if not lost.goodbye:
                        raise
                    self.ended = lost
                    return header
                if newer is None:
                    return header
            skip(header)
            header = newer

    def dropped(self, message: protocol.Drop | protocol.Bye) -> Dropped:
        if isinstance(message, protocol.Drop):
            return Dropped(f"the publisher of topic {self.name!r} dropped this subscriber: {message.reason}",
                           message.code)
        return Dropped(f"the publisher of topic {self.name!r} closed the topic: {message.reason}",
                       message.code or int(Reason.CLOSING))

    def drop_waiting(self) -> Dropped | None:
        """The drop (or the topic's close) already waiting on the connection behind the messages
        before it, as the error to raise; None when none is waiting. Called when a message sent
        before the drop cannot be used any more (its slot cannot be mapped: the publisher, having
        dropped this subscriber, may have exited since): the drop says why, not that failure. The
        messages read past are lost with the connection."""
        if self.ended is not None:
            return cast(Dropped, self.ended.error)
        for _ in range(_READ_AHEAD):  # (a live publisher may go on sending: read what is there, no more)
            received = self.inbox.next(None)
            if received is None or received.__class__ is not bytes:
                if received is None:
                    return None
                if received.__class__ is protocol.Carried:  # (a SLOT passing a descriptor: not opened now)
                    sockets.close_fds(received.fds)
                continue  # a FRAME, a SLOT
            if not received:
                return None  # the end of the connection: no drop came before it
            try:
                message = protocol.decode(received)
            except protocol.ProtocolError:
                return None
            if isinstance(message, (protocol.Drop, protocol.Bye)):
                return self.dropped(message)
        return None

    def dropped_meanwhile(self) -> bool:
        """Whether the publisher dropped this subscriber, as its ring says (a load, no system
        call): the frames announced before, not taken yet, may be written again already."""
        ring = self.ring
        return ring is not None and ring.dropped()

    def lose_to_the_drop(self) -> NoReturn:
        """The end once :meth:`dropped_meanwhile`: the drop with its reason, read ahead for."""
        raise Lost(self.drop_waiting() or Dropped(f"the publisher of topic {self.name!r} dropped this subscriber",
                                                  int(Reason.UNSPECIFIED)))

    # ---- writing (under the subscriber's state lock) ------------------------------------------------
    def say_goodbye(self, code: int, reason: str) -> None:
        """Tell the publisher this subscriber leaves, and why (nothing when the socket is gone)."""
        try:
            self.sock.send(protocol.encode(protocol.Bye(code, reason)))
        except OSError:
            pass

    def send_release(self, seq: int, flags: int, extra: bytes) -> None:
        """Send the RELEASE of frame ``seq`` (encoded and sent in one compiled call), or queue it
        behind the releases waiting for room. A failed connection drops it: the next read says so."""
        if not self.unsent:
            ring = self.ring
            if ring is not None and not extra and not flags & protocol.RELEASE_RECORDED and ring.release(self.fd, seq,
                                                                                                    flags):
                return
            sent = _wire.send_release(self.fd, seq, flags, extra)
            if sent != 1:
                if sent == 0 and ring is not None:
                    ring.sent_on_socket()  # (the publisher reads its socket when this count moves)
                return
        if len(self.unsent) >= _AHEAD_MAX:  # (it goes on announcing frames without reading releases)
            if self.ended is None:  # (a release raises nothing: the next read says it)
                self.ended = Lost(PeerError(f"the publisher of topic {self.name!r} stopped reading this "
                                            f"subscriber's releases ({_AHEAD_MAX} wait) while it announced frames"))
            return
        self.unsent.append(protocol.encode_release(seq, flags, extra))
        self.send_queued()

    def send_queued(self) -> None:
        """Send queued releases; if the publisher's socket is full, they wait for the next call."""
        ring = self.ring
        while self.unsent:
            try:
                self.sock.send(self.unsent[0])
            except BlockingIOError:
                return
            except OSError:
                self.unsent.clear()
                return
            self.unsent.popleft()
            if ring is not None:
                ring.sent_on_socket()

    def close(self) -> None:
        """Close the transport and the socket (held frames were let go of first)."""
        try:
            self.transport.lost()
            self.transport.close()
        except EglCudaError:  # pragma: no cover - the publisher is gone; nothing else to do
            pass
        self.inbox.close()  # before the descriptor is closed (and its number reused)
        sockets.close_quietly(self.sock)  # unread messages would reset the connection: the goodbye would be lost
        self.pending.clear()
        self.unsent.clear()
