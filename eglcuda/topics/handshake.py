"""A publisher's handshake service: a thread that accepts connections on the topic's socket,
answers status requests, and takes each subscriber through its handshake (HELLO -> WELCOME ->
ATTACH -> READY) before handing it to the publishing thread. It asks its publisher only what the
narrow :class:`Admission` interface offers, and holds it weakly between events.

Admission under a flood: connections that say nothing (a stuck or hostile process of an allowed
user) must not lock real subscribers out (see :func:`accept` and docs/topics.md).
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import select
import socket
import time
import weakref
from typing import Any, Protocol

from ..errors import EglCudaError, PeerError, UsageError
from . import protocol, sockets
from .protocol import Reason
from .transports import PublisherLink, PublisherTransport

log = logging.getLogger("eglcuda.topics")

MAX_PENDING_HANDSHAKES = 32  # connections in their handshake at once (a flood makes room: see _make_room)
MAX_PENDING_PER_PEER = 8  # of them from one process: its older idle ones make room for its new one
_ACCEPT_PAUSE_S = 0.05  # seconds the listener rests when this process is out of descriptors
SEND_BUFFER = 1 << 20


class Admission(Protocol):
    """What the handshake service asks of its publisher (:class:`eglcuda.Publisher` provides it)."""

    name: str
    handshake_timeout: float
    refused: int  # connections turned away by the access check

    @property
    def stopping(self) -> bool:
        """The publisher is closing: the service ends."""

    def access_refusal(self, peer: sockets.Peer) -> str | None:
        """Why the peer may not subscribe (None: it may)."""

    def choose_transport(self, hello: protocol.Hello, peer_pid: int) -> tuple[PublisherTransport | None, list[str]]:
        """The first of the subscriber's wishes the publisher can serve it through, or None and
        why each was refused."""

    def welcome(self, hello: protocol.Hello, transport: PublisherTransport) -> protocol.Welcome:
        """The WELCOME for a subscriber served through ``transport``."""

    def status(self) -> dict[str, Any]:
        """The body of a STATUS answer."""

    def admit(self, sock: socket.socket, peer: sockets.Peer, hello: protocol.Hello, link: PublisherLink,
              transport: PublisherTransport) -> None:
        """The subscriber finished its handshake: hand it to the publishing thread and say READY
        (the connection is the publisher's from here on, also when READY cannot be sent)."""


class Handshake:
    __slots__ = ("sock", "peer", "deadline", "hello", "transport", "refusal")

    def __init__(self, sock: socket.socket, peer: sockets.Peer, deadline: float, refusal: str | None) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.hello: protocol.Hello | None = None
        self.transport: PublisherTransport | None = None
        self.refusal = refusal  # the peer may not subscribe: told so once it greets



def serve(ref: "weakref.ref[Admission]", listener: socket.socket, wake: int,
          pending: dict[int, "Handshake"], poller: select.epoll) -> None:
    """The service thread's body: accept connections, answer status requests and run handshakes
    until the publisher stops. Holds the publisher only weakly between events. ``pending``: the
    connections in their handshake, by descriptor, oldest first (a dict keeps insertion order);
    ``poller``: the thread's epoll set, which it closes as it ends. Both are the publisher's too,
    whose copies a forked child closes (see :func:`forget`)."""
    paused_until = 0.0  # the listener is not watched until then (no descriptor to accept with)
    try:
        try:
            poller.register(listener.fileno(), select.EPOLLIN)
            poller.register(wake, select.EPOLLIN)
        except OSError:
            return  # the publisher was collected (its wake pipe closed) before this thread ran
        while True:
            publisher = ref()
            if publisher is None or publisher.stopping:
                break
            # At most a second: a publisher collected without close() is noticed (its weak
            # reference dies) and the thread ends.
            timeout = 1.0
            if pending:
                timeout = min(timeout, max(0.0, min(h.deadline for h in pending.values()) - time.monotonic()))
            if paused_until:
                left = paused_until - time.monotonic()
                if left <= 0:
                    paused_until = 0.0
                    poller.modify(listener.fileno(), select.EPOLLIN)
                else:
                    timeout = min(timeout, left)
            del publisher
            events = poller.poll(timeout)
            publisher = ref()
            if publisher is None or publisher.stopping:
                break
            for fd, _ in events:
                if fd == wake:
                    try:
                        os.read(wake, 64)
                    except OSError:
                        pass
                elif fd == listener.fileno():
                    if not accept(publisher, listener, poller, pending):
                        # Out of descriptors, and no idle handshake to end for one: rest the listener
                        # (level-triggered, it would wake this thread at once, again and again).
                        paused_until = time.monotonic() + _ACCEPT_PAUSE_S
                        poller.modify(listener.fileno(), 0)
                else:
                    handshake = pending.get(fd)
                    if handshake is not None:
                        try:
                            _advance(publisher, poller, pending, handshake)
                        except Exception as exc:  # noqa: BLE001 - one handshake's failure is its own
                            # (a fault met in one peer's handshake ends that handshake; the thread
                            # goes on serving the others and every later join)
                            log.exception("topic %s: the handshake of pid %d failed", publisher.name,
                                          handshake.peer.pid)
                            _end(poller, pending, handshake, Reason.UNSPECIFIED,
                                 f"the publisher failed in this handshake: {type(exc).__name__}: {exc}")
            now = time.monotonic()
            for handshake in [h for h in pending.values() if h.deadline <= now]:
                _end(poller, pending, handshake, Reason.ACCESS if handshake.refusal else Reason.TIMEOUT,
                     handshake.refusal or f"the handshake did not finish within {publisher.handshake_timeout} s")
            # Nor the last handshake between events: an admitted subscriber's connection is the
            # publishing thread's, and it closes as a publisher collected without close() goes,
            # not at this thread's next wake-up (up to a second later).
            handshake = None
            del publisher
    except Exception:  # noqa: BLE001 - the thread must not die silently
        log.exception("the topic service thread failed")
    finally:
        for handshake in list(pending.values()):
            _end(poller, pending, handshake, Reason.CLOSING, "the publisher closed the topic")
        poller.close()
        listener.close()  # also when the publisher was collected without close(); closing twice is fine


def forget(pending: dict[int, Handshake]) -> None:
    """In a child made by fork(): close this process's copies of the connections in their
    handshake (the parent's service thread runs them; no thread here does). Nothing is read or
    sent: a child that outlives its parent would otherwise keep them open, and a subscriber
    joining a SIGKILLed publisher would not see its connection end."""
    for handshake in list(pending.values()):
        handshake.sock.close()
    pending.clear()


def accept(publisher: Admission, listener: socket.socket, poller: select.epoll,
            pending: dict[int, Handshake]) -> bool:
    """Take every connection waiting. False when this process is out of descriptors and no idle
    handshake could be ended to make one free (the caller rests the listener a moment).

    A flood of connections that say nothing (a stuck or hostile process of an allowed user)
    must not lock real subscribers out: a new connection is never turned away while an idle one
    waits in its handshake. One process keeps at most MAX_PENDING_PER_PEER handshakes (its
    oldest idle one is ended for its new one), and at MAX_PENDING_HANDSHAKES the oldest idle
    handshake of the process with the most is ended. Idle: nothing waiting on its socket. A
    subscriber sends its greeting as soon as it connects, so a slow subscriber that does greet
    keeps its whole handshake_timeout unless a flood needs its place while it sends nothing."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                if _make_room(poller, pending, None):
                    continue  # a descriptor came free
                log.warning("topic %s: accept failed: %s", publisher.name, exc)
                return False
            log.warning("topic %s: accept failed: %s", publisher.name, exc)
            return True
        conn.setblocking(False)
        try:
            peer = sockets.peer_of(conn)
        except PeerError:
            conn.close()
            continue
        why = publisher.access_refusal(peer)
        if why is not None:
            publisher.refused += 1
            log.warning("topic %s: turning away pid %d: %s", publisher.name, peer.pid, why)
        if sum(1 for h in pending.values() if h.peer.pid == peer.pid) >= MAX_PENDING_PER_PEER:
            _make_room(poller, pending, peer.pid)
        if len(pending) >= MAX_PENDING_HANDSHAKES and not _make_room(poller, pending, None):
            # Every handshake has something waiting to be read: they move on at this round.
            try:
                sockets.send(conn, protocol.encode(protocol.Refuse(int(Reason.BUSY), f"{MAX_PENDING_HANDSHAKES} "
                                                                   "connections are already in their handshake")))
            except OSError:
                pass
            sockets.close_quietly(conn)
            continue
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        except OSError:
            pass
        # A peer that may not subscribe is told why after its greeting (read first: closing a
        # socket with its greeting unread would reset the connection before it reads the reason).
        deadline = time.monotonic() + (min(publisher.handshake_timeout, 1.0) if why else publisher.handshake_timeout)
        handshake = Handshake(conn, peer, deadline, why)
        pending[conn.fileno()] = handshake
        poller.register(conn.fileno(), select.EPOLLIN)


def _make_room(poller: select.epoll, pending: dict[int, Handshake], pid: int | None) -> bool:
    """End one idle handshake (nothing waiting on its socket) to make room for a new connection:
    the oldest of process ``pid``'s, or (None) of the process with the most handshakes; one that
    said nothing yet goes before one that greeted. False when there is none."""
    if pid is None:
        counts = collections.Counter(h.peer.pid for h in pending.values())
        order = sorted(counts, key=counts.__getitem__, reverse=True)
    else:
        order = [pid]
    for candidate in order:
        mine = [h for h in pending.values() if h.peer.pid == candidate]  # (oldest first)
        for handshake in sorted(mine, key=lambda h: h.hello is not None):  # (stable: still oldest first)
            if sockets.readable_now(handshake.sock.fileno()):
                continue  # its greeting (or its end) is waiting: this round reads it
            said = "said nothing" if handshake.hello is None else "did not attach"
            _end(poller, pending, handshake, Reason.BUSY,
                 f"it {said} while {len(pending)} connections waited for their handshake ({len(mine)} of them from "
                 f"its process): the oldest idle one makes room for a new one")
            return True
    return False


def _stop_watching(poller: select.epoll, pending: dict[int, Handshake], handshake: Handshake) -> None:
    """The service thread stops polling this handshake's socket (it is ending or handed over)."""
    fd = handshake.sock.fileno()
    pending.pop(fd, None)
    try:
        poller.unregister(fd)
    except (OSError, ValueError):
        pass


def _end(poller: select.epoll, pending: dict[int, Handshake], handshake: Handshake, code: Reason | None,
         reason: str) -> None:
    _stop_watching(poller, pending, handshake)
    if code is not None:
        try:
            sockets.send(handshake.sock, protocol.encode(protocol.Refuse(int(code), reason)))
        except OSError:
            pass
    sockets.close_quietly(handshake.sock)


def _advance(publisher: Admission, poller: select.epoll, pending: dict[int, Handshake], handshake: Handshake) -> None:
    try:
        got = sockets.receive_now(handshake.sock)
    except protocol.ProtocolError as exc:
        _end(poller, pending, handshake, Reason.PROTOCOL, str(exc))
        return
    if got is None:
        return
    data, fds = got
    try:
        if not data:
            _end(poller, pending, handshake, None, "")
            return
        try:
            message = protocol.decode(data, len(fds))
        except protocol.ProtocolError as exc:
            code = Reason.VERSION if isinstance(exc, protocol.VersionError) else Reason.PROTOCOL
            _end(poller, pending, handshake, code, f"not a valid topic message: {exc}")
            return
        if handshake.hello is None:
            _on_hello(publisher, poller, pending, handshake, message)
        else:
            _on_attach(publisher, poller, pending, handshake, message, fds)
    finally:
        sockets.close_fds(fds)


def _on_hello(publisher: Admission, poller: select.epoll, pending: dict[int, Handshake], handshake: Handshake,
              message: protocol.Message) -> None:
    if handshake.refusal is not None:
        _end(poller, pending, handshake, Reason.ACCESS, handshake.refusal)
        return
    if isinstance(message, protocol.StatusRequest):
        try:
            sockets.send(handshake.sock, protocol.encode(protocol.Status(publisher.status())))
        except (OSError, ValueError):
            pass
        _end(poller, pending, handshake, None, "")
        return
    if not isinstance(message, protocol.Hello):
        _end(poller, pending, handshake, Reason.PROTOCOL, f"expected HELLO, got {type(message).__name__}")
        return
    if message.topic != publisher.name:
        _end(poller, pending, handshake, Reason.VERSION,
             f"this socket serves topic {publisher.name!r}, not {message.topic!r}")
        return
    chosen, reasons = publisher.choose_transport(message, handshake.peer.pid)
    if chosen is None:
        _end(poller, pending, handshake, Reason.UNSUPPORTED,
             "no transport both sides can use (" + "; ".join(reasons) + ")")
        return
    try:
        sockets.send(handshake.sock, protocol.encode(publisher.welcome(message, chosen)))
    except OSError:
        _end(poller, pending, handshake, None, "")
        return
    handshake.hello = message
    handshake.transport = chosen


def _on_attach(publisher: Admission, poller: select.epoll, pending: dict[int, Handshake], handshake: Handshake,
               message: protocol.Message, fds: list[int]) -> None:
    if not isinstance(message, protocol.Attach):
        _end(poller, pending, handshake, Reason.PROTOCOL, f"expected ATTACH, got {type(message).__name__}")
        return
    hello, transport = handshake.hello, handshake.transport
    if hello is None or transport is None:  # pragma: no cover - _advance comes here only after HELLO set both
        raise UsageError("a handshake reached ATTACH before its HELLO chose a transport")
    try:
        link = transport.attach(hello, message, fds, handshake.peer.pid)
    except (EglCudaError, OSError) as exc:
        _end(poller, pending, handshake, Reason.TRANSPORT, f"connecting its {transport.name} end failed: {exc}")
        return
    _stop_watching(poller, pending, handshake)
    publisher.admit(handshake.sock, handshake.peer, hello, link, transport)
