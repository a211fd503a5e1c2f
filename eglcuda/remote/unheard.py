"""Connections accepted on a relay's port that never became a UCX connection request.

UCX's TCP connection manager accepts every TCP connection to a listening port and waits for the
peer's connection request without a limit of time: a peer that connects and says nothing (or a
few bytes) holds a descriptor of this process for as long as it likes, out of sight of the
listener's caps on handshakes. Enough of them (the process's RLIMIT_NOFILE: 1024 by default)
leave UCX's accept failing in a loop, a core busy and a log line each time, and no remote
subscriber can join. :class:`Unheard` finds such connections among this process's descriptors
and shuts them down (UCX then sees the connection end and closes its descriptor itself): those
unheard for the relay's ``timeout``, those whose bytes UCX left unread at two looks in a row
(what a peer sent was no connection request, and UCX's thread would spin on the readable socket
until then), and at once those beyond ``per_address`` from one address or ``most`` in all. Everything here runs on the UCX engine's thread, about twice a second.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import resource
import socket
import stat
import struct
import sys
import termios
import time
from typing import Any, Iterable, Iterator

FD_FOLDER = "/proc/self/fd"


def address_text(family: int, address: Any) -> str:
    """``IP:PORT`` (``[v6]:PORT``) of a socket address as Python gives it, written as the UCX
    engine writes a connection request's (``_ucx.client_address``)."""
    if family == socket.AF_INET:
        return f"{ipaddress.IPv4Address(address[0])}:{address[1]}"
    return f"[{ipaddress.IPv6Address(str(address[0]).split('%')[0])}]:{address[1]}"


def host_of(address: str) -> str:
    """The host of ``HOST:PORT`` (``[v6]`` kept in brackets)."""
    return address.rsplit(":", 1)[0]


class Unheard:
    """The connections to port ``port`` of this process not (yet) heard as connection requests."""

    def __init__(self, port: int, per_address: int, most: int) -> None:
        self.port = port
        self.per_address = per_address
        self.most = most
        self.heard: dict[str, float] = {}  # the peer address of each connection request -> when it came
        self.shut = 0  # connections shut down (counted for tests and logs)
        self.blind = False  # a request came whose address UCX could not tell: its connection is not known
        self._accepted: dict[int, tuple[int, str, float]] = {}  # socket inode -> (fd, peer, first seen)
        self._other: set[int] = set()  # socket inodes of this process that are no connection to the port
        self._unread: set[int] = set()  # unheard connections that had bytes unread at the last look

    def hear(self, peer: str) -> None:
        """A connection request came from ``peer`` (``IP:PORT``): its connection is UCX's now."""
        if peer == "?":
            self.blind = True  # (from now on nothing is shut down: it could be that connection)
        else:
            self.heard[peer] = time.monotonic()

    def look(self, limit: float) -> list[str]:
        """Shut down the unheard connections (see the module's docstring); their peers."""
        if self.blind:
            return []
        now = time.monotonic()
        present: set[int] = set()
        for fd, inode in _sockets():
            present.add(inode)
            if inode in self._other or inode in self._accepted:
                continue
            peer = self._peer_on_port(fd, inode)
            if peer is None:
                self._other.add(inode)
            else:
                self._accepted[inode] = (fd, peer, now)
        self._other &= present
        for inode in [inode for inode in self._accepted if inode not in present]:
            del self._accepted[inode]
        peers = {peer for _, peer, _ in self._accepted.values()}
        for peer in [peer for peer, when in self.heard.items() if peer not in peers and now - when > limit]:
            del self.heard[peer]
        # Unheard ones, newest first: the oldest are shut down by age, the newest beyond the caps.
        unheard = sorted(((since, inode, fd, peer) for inode, (fd, peer, since) in self._accepted.items()
                          if peer not in self.heard), reverse=True)
        per_host: dict[str, int] = {}
        kept = 0
        shut: list[str] = []
        unread = self._unread
        self._unread = set()
        for since, inode, fd, peer in unheard:
            host = host_of(peer)
            per_host[host] = per_host.get(host, 0) + 1
            if now - since < limit and per_host[host] <= self.per_address and kept < self.most:
                # Bytes UCX left unread at two looks in a row: no connection request came of them
                # (UCX reads a request at once), and UCX's thread spins on the readable socket.
                if not _has_unread(fd, inode):
                    kept += 1
                    continue
                if inode not in unread:
                    self._unread.add(inode)
                    kept += 1
                    continue
            if _end_connection(fd, inode, drain=True):
                shut.append(peer)
            del self._accepted[inode]
        self.shut += len(shut)
        return shut

    def seal(self, settle_s: float = 1.0) -> None:
        """Make this port's UCX listener safe to destroy (those reset count in ``shut``).

        UCX's TCP connection manager (1.21) gives each connection it accepts a pointer to the
        listener and reads it when that connection's request arrives: a listener destroyed in
        between leaves the pointer dangling, and UCX's async thread crashes the process on it (a
        client joining while a relay closes). So, before: the listening socket stops completing
        connections (a filter drops every segment to it: a client joining now is refused once the
        listener is gone), the connections completed before are left to UCX to accept (up to
        ``settle_s``), and every accepted one whose request was not heard is reset (its unread
        bytes go with it: no request can come of it). Those heard are endpoints, left as they are."""
        listening = [(fd, inode) for fd, inode in _sockets() if _listening_on(fd, inode, self.port)]
        for fd, inode in listening:
            _drop_everything(fd, inode)
        deadline = time.monotonic() + settle_s
        while any(_backlog(fd, inode) for fd, inode in listening) and time.monotonic() < deadline:
            time.sleep(0.002)
        if self.blind:  # (which connection is which cannot be told: those heard must stay)
            return
        for fd, inode in _sockets():
            peer = self._peer_on_port(fd, inode)
            if peer is None or peer in self.heard:
                continue
            if _end_connection(fd, inode):
                self.shut += 1

    def reset(self, peers: set[str]) -> None:
        """Reset the connections to this port from ``peers`` (``IP:PORT``, heard ones: endpoints
        whose handshake is not over), as a peer that died would. UCX then fails their
        endpoints, and the receives posted on them end with an error: an endpoint closed from
        this side with a receive still posted keeps the listener's port bound for good (UCXX
        0.52; research/probes/ucx_pending_recv_probe.py)."""
        for fd, inode in _sockets():
            if self._peer_on_port(fd, inode) in peers:
                _end_connection(fd, inode)

    def _peer_on_port(self, fd: int, inode: int) -> str | None:
        """The peer of descriptor ``fd`` when it is a TCP connection accepted on this port (still
        socket ``inode``); None otherwise."""
        with _borrowed(fd, inode) as sock:
            if sock is None or sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                                       socket.AF_INET6):
                return None
            try:
                if sock.getsockname()[1] != self.port:
                    return None
                return address_text(sock.family, sock.getpeername())
            except (OSError, ValueError):  # (ENOTCONN: the listening socket itself)
                return None


def _end_connection(fd: int, inode: int, drain: bool = False) -> bool:
    """Shut down and reset the connection on descriptor ``fd`` (still socket ``inode``): UCX's
    thread reads its end and closes it. ``drain``: read away what it holds first (see _drain).
    Whether it was shut down."""
    with _borrowed(fd, inode) as sock:
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # (ended by UCX meanwhile)
            return False
        if drain:
            _drain(sock)
        _reset(sock)
        return True


def _drain(sock: socket.socket) -> None:
    """Read away what a shut connection still holds (a socket's receive buffer at most): UCX,
    which stopped reading garbage, then reads the end of the connection and closes it, instead
    of finding it readable for ever."""
    for _ in range(256):
        try:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return
        except OSError:  # (EAGAIN: nothing left; or UCX closed it meanwhile)
            return


_libc = ctypes.CDLL(None, use_errno=True)


def _reset(sock: socket.socket) -> None:
    """End the connection at once (a reset to the peer, the socket closed for UCX's reads), not
    only half: connect() to an AF_UNSPEC address disconnects a TCP socket (Linux). A peer that
    never answers the shutdown's FIN would otherwise keep it, and UCX's thread spinning on it."""
    unspec = (ctypes.c_ushort * 8)(socket.AF_UNSPEC)
    _libc.connect(sock.fileno(), ctypes.byref(unspec), ctypes.sizeof(unspec))


_SO_ATTACH_FILTER = 26  # (asm-generic/socket.h)


class _SockFilter(ctypes.Structure):  # struct sock_filter (linux/filter.h): one classic BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_DROP_EVERYTHING = (_SockFilter * 1)(_SockFilter(0x06, 0, 0, 0))  # BPF_RET | BPF_K with k = 0: keep no byte


def _drop_everything(fd: int, inode: int) -> None:
    """Give listening socket ``fd`` a filter that drops every segment: no connection completes
    on it any more (a SYN, or the last ACK of a handshake under way, goes unanswered: the
    kernel filters both on the listener). Those it completed already stay to be accepted."""
    program = _SockFprog(len(_DROP_EVERYTHING), _DROP_EVERYTHING)
    with _borrowed(fd, inode) as sock:
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(program))
            except OSError:  # (a kernel without socket filters: the listener goes as before)
                pass


def _listening_on(fd: int, inode: int, port: int) -> bool:
    """Whether descriptor ``fd`` (still socket ``inode``) is a TCP socket listening on ``port``."""
    with _borrowed(fd, inode) as sock:
        if sock is None or sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        try:
            return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)) and sock.getsockname()[1] == port
        except OSError:
            return False


def _backlog(fd: int, inode: int) -> int:
    """How many connections listening socket ``fd`` (still ``inode``) completed that nobody
    accepted yet (0 once it is gone): ``tcpi_unacked`` of its ``TCP_INFO`` (linux/tcp.h), which
    a listening socket fills so."""
    with _borrowed(fd, inode) as sock:
        if sock is None:
            return 0
        try:
            return int(struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 24)[0])
        except (OSError, struct.error):
            return 0


def _has_unread(fd: int, inode: int) -> bool:
    """Whether socket ``fd`` (still ``inode``) holds received bytes nobody read yet."""
    with _borrowed(fd, inode) as sock:
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(waiting, sys.byteorder) > 0


def _sockets() -> Iterator[tuple[int, int]]:
    """This process's sockets: (descriptor, inode)."""
    for fd in _descriptors():
        try:
            info = os.fstat(fd)
        except OSError:  # (not open, or closed meanwhile)
            continue
        if stat.S_ISSOCK(info.st_mode):
            yield fd, info.st_ino


def _descriptors() -> Iterable[int]:
    """This process's open descriptors (a superset where they cannot be listed)."""
    try:
        return [int(name) for name in os.listdir(FD_FOLDER)]
    except OSError:  # (EMFILE: every descriptor is taken, and listing them takes one more)
        return range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 20))


@contextlib.contextmanager
def _borrowed(fd: int, inode: int) -> Iterator[socket.socket | None]:
    """A socket object on descriptor ``fd`` itself, when it is still socket ``inode`` (its number
    may have gone to another descriptor meanwhile), handed back (not closed) after. No new
    descriptor: where these connections are the trouble, there may be none to take."""
    try:
        if os.fstat(fd).st_ino != inode:
            sock = None
        else:
            sock = socket.socket(fileno=fd)
    except OSError:
        sock = None
    try:
        yield sock
    finally:
        if sock is not None:
            sock.detach()
