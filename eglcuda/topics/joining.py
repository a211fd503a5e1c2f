"""A subscriber's way in: connecting to a topic's socket and the handshake (HELLO -> WELCOME ->
ATTACH -> READY), retried while the publisher is starting, dying or busy. What it yields is the
connection a :class:`eglcuda.Subscriber` then reads frames from (:class:`Joined`)."""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from ..errors import ClosedError, PeerError, Refused, Timeout, UsageError
from . import _ring, _wire, protocol, sockets
from .info import TopicInfo
from .protocol import Qos, Reason
from .transports import Geometry, SubscriberBackend, SubscriberTransport

_M = TypeVar("_M", bound=protocol.Message)


class _HandshakeLost(PeerError):
    """The connection ended before the publisher answered (it died, or was not serving yet)."""


@dataclass(frozen=True)
class Request:
    """What a subscriber asks a publisher for."""

    name: str
    path: str
    qos: Qos
    queue: int
    trusted: frozenset[int] | None  # the publisher's uids accepted (None: any)
    wishes: tuple[str, ...]  # transports, best first
    wake_fd: int  # readable: stop waiting (close() from another thread)
    busy_wait: float  # the inbox's, seconds


@dataclass
class Joined:
    """A connection after its handshake."""

    sock: socket.socket
    inbox: "_wire.Inbox | _ring.RingInbox"
    transport: SubscriberTransport
    info: TopicInfo
    limit: int  # messages the subscriber may hold at once
    ring: "_ring.Ring | None" = None  # frames announced and releases written through it (None: all by socket)


def join(request: Request, backend: SubscriberBackend, deadline: float, closing: Callable[[], bool],
         closed_error: Callable[[], ClosedError]) -> Joined:
    """Subscribe, waiting until ``deadline`` for a publisher that takes this subscriber. A
    connection that ends before the publisher answered (a publisher dying or still starting: its
    socket may take a connection it never serves) is tried again, and so is one the publisher
    turned away as busy (its handshakes were full for a moment)."""
    busy: Refused | None = None  # the last "busy" answer: what a wait that ends meanwhile says
    while True:
        try:
            return _handshake(request, backend, deadline)
        except _HandshakeLost as exc:
            if time.monotonic() + sockets.CONNECT_RETRY_S >= deadline:
                raise PeerError(str(exc)) from None
            time.sleep(sockets.CONNECT_RETRY_S)  # (a close() meanwhile: the next connect says so)
        except Refused as exc:
            if exc.code != int(Reason.BUSY) or time.monotonic() + sockets.CONNECT_RETRY_S >= deadline:
                raise
            busy = exc
            time.sleep(sockets.CONNECT_RETRY_S)
        except Timeout:
            if busy is not None:  # turned away as busy until the time ran out: that is the answer
                raise busy from None
            raise
        except ClosedError:
            if closing():  # woken by close() in another thread
                raise closed_error() from None
            raise


def _handshake(request: Request, backend: SubscriberBackend, deadline: float) -> Joined:
    waited = f"no publisher of topic {request.name!r} answered at {request.path} in time"
    sock = sockets.connect(request.path, deadline, waited, wake_fd=request.wake_fd)
    transport = None
    try:
        peer = sockets.peer_of(sock)
        if request.trusted is not None and peer.uid not in request.trusted:
            raise Refused(f"the publisher at {request.path} runs as uid {peer.uid}, which this subscriber does not "
                          f"trust (trusted_uids: {sorted(request.trusted)})", int(Reason.ACCESS))
        hello = protocol.Hello(pid=os.getpid(), qos=request.qos, queue=request.queue, consumer=backend.consumer,
                               device=backend.identity.ordinal, gpu_uuid=backend.identity.uuid,
                               integrated=backend.identity.integrated, wishes=request.wishes, topic=request.name)
        _send_now(request, sock, protocol.encode(hello), deadline)
        welcome = _expect(request, sock, deadline, protocol.Welcome, waited)
        if welcome.topic != request.name:
            raise Refused(f"the publisher at {request.path} serves topic {welcome.topic!r}", int(Reason.VERSION))
        if welcome.transport not in request.wishes:
            raise PeerError(f"the publisher chose transport {welcome.transport!r}, not one of {request.wishes}")
        try:
            geometry = Geometry.from_welcome(welcome)
        except UsageError as exc:
            raise protocol.ProtocolError(f"the publisher at {request.path} describes frames this side cannot "
                                         f"take: {exc}") from None
        transport = backend.transport(welcome.transport, welcome, request.qos, request.queue)
        extra, fds = transport.attach()
        try:
            _send_now(request, sock, protocol.encode(protocol.Attach(extra)), deadline, fds)
        finally:
            sockets.close_fds(fds)
        ready, fds = _expect_carrying(request, sock, deadline, protocol.Ready, waited)
        try:  # (READY's descriptor: the publisher's ring for this subscriber, mapped, then closed)
            ring = _ring.attach(fds[0]) if fds else None
        finally:
            sockets.close_fds(fds)
        transport.ready(ready)
    except BaseException:
        if transport is not None:
            transport.close()
        sockets.close_quietly(sock)
        raise
    info = TopicInfo(name=request.name, path=request.path, width=geometry.width, height=geometry.height,
                     format=geometry.format, layout=geometry.layout, pitch=geometry.pitch, fps=welcome.fps or None,
                     pool=welcome.pool, publisher_pid=welcome.publisher_pid, instance=welcome.instance,
                     transport=welcome.transport, next_seq=welcome.next_seq)
    inbox = (_wire.Inbox(sock.fileno(), wake_fd=request.wake_fd, busy_wait=request.busy_wait) if ring is None else
             _ring.RingInbox(sock.fileno(), ring, request.wake_fd, request.busy_wait))
    return Joined(sock, inbox, transport, info, 1 if transport.exclusive else protocol.hold_limit(request.qos,
                                                                                                 request.queue), ring)


def _send_now(request: Request, sock: socket.socket, data: bytes, deadline: float,
              fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send a handshake message. A publisher that ended the connection (it turned this subscriber
    away, and may have closed before this side wrote) makes the write fail: what it said is read
    then, and raised as :class:`eglcuda.Refused` with its reason."""
    while True:
        try:
            sockets.send(sock, data, fds)
            return
        except BlockingIOError:
            if not sockets.wait_writable(sock, deadline, request.wake_fd):
                raise Timeout(f"the publisher at {request.path} does not read its socket") from None
        except OSError as exc:  # EPIPE, ECONNRESET: the publisher closed its end
            said = sockets.parting_words(sock)
            if said is not None:
                raise refusal(request.name, said) from None
            raise _HandshakeLost(f"the publisher at {request.path} closed the connection during the handshake "
                                 f"({exc.strerror or exc})") from None


def refusal(name: str, message: protocol.Refuse | protocol.Drop | protocol.Bye) -> Refused:
    if isinstance(message, protocol.Refuse):
        return Refused(f"the publisher of topic {name!r} turned this subscriber away: {message.reason}", message.code)
    return Refused(f"the publisher of topic {name!r} ended the handshake: {message.reason}", message.code)


def _expect(request: Request, sock: socket.socket, deadline: float, kind: type[_M], waited: str) -> _M:
    message, fds = _expect_carrying(request, sock, deadline, kind, waited)
    sockets.close_fds(fds)
    if fds:
        raise protocol.ProtocolError(f"{kind.__name__} came with a descriptor")
    return message


def _expect_carrying(request: Request, sock: socket.socket, deadline: float, kind: type[_M],
                     waited: str) -> tuple[_M, list[int]]:
    """The next handshake message, of ``kind``, and the descriptors it brought (the caller's)."""
    data, fds = sockets.receive(sock, deadline, waited, request.wake_fd)
    try:
        if not data:
            raise _HandshakeLost(f"the publisher at {request.path} closed the connection during the handshake")
        message = protocol.decode(data, len(fds))
        if isinstance(message, (protocol.Refuse, protocol.Drop, protocol.Bye)):
            raise refusal(request.name, message)
        if not isinstance(message, kind):
            raise protocol.ProtocolError(f"expected {kind.__name__}, got {type(message).__name__}")
    except BaseException:
        sockets.close_fds(fds)
        raise
    return message, fds
