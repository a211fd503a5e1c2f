"""Small helpers for the topic sockets: ``SOCK_SEQPACKET`` UNIX sockets, one datagram per
message, descriptors as ``SCM_RIGHTS``, peer credentials (``SO_PEERCRED``) and deadlines.

Every blocking call takes a deadline (``time.monotonic()`` seconds) and raises
:class:`eglcuda.Timeout` when it passes; descriptors that arrive with a message this side does not
want, or more of them than asked for, are closed at once."""
from __future__ import annotations

import array
import errno
import os
import select
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import ClosedError, Timeout, UsageError
from ..streams.share import peer_credentials
from . import protocol
from .protocol import MAX_MESSAGE, ProtocolError

_MAX_FDS = 2  # room for one more than any message may carry, to notice extras
_CMSG_SPACE = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
_RECV_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
CONNECT_RETRY_S = 0.02
_SEND_FLAGS = int(getattr(socket, "MSG_NOSIGNAL", 0))


@dataclass(frozen=True)
class Peer:
    """Who is at the other end of a connected UNIX socket, as the kernel says (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


def seqpacket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)


def peer_of(sock: socket.socket) -> Peer:
    """The process at the other end of ``sock``; :class:`PeerError` when the kernel does not say."""
    return Peer(*peer_credentials(sock))


def peer_groups(pid: int) -> set[int]:
    """The supplementary groups of process ``pid`` (``/proc/<pid>/status``); empty if unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def close_quietly(sock: socket.socket) -> None:
    """Close ``sock`` after reading what its peer sent: a UNIX socket closed with unread messages
    resets the connection, and the peer's next read fails with ECONNRESET instead of returning
    what was sent to it last (a REFUSE or DROP with its reason)."""
    try:
        sock.setblocking(False)
        for _ in range(4096):
            data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE + 1, _CMSG_SPACE, _RECV_FLAGS)
            close_fds(_descriptors(ancillary))
            if not data:
                break
    except OSError:
        pass
    sock.close()


def wait_seconds(value: Any, what: str = "timeout") -> float:
    """``value`` as a time to wait (``what`` names it in the error): a number of seconds >= 0.
    Raises :class:`UsageError` for anything else."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise UsageError(f"{what} is a number of seconds >= 0, got {value!r}")
    return float(value)


def close_fds(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def send(sock: socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send one message (and ``fds``) on a connected socket, in whatever blocking mode it is in.
    A peer that closed makes it raise ``BrokenPipeError`` (never SIGPIPE, whatever the program
    did with that signal): see :func:`parting_words` for what the peer said before."""
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))], _SEND_FLAGS)
    else:
        sock.send(data, _SEND_FLAGS)


def parting_words(sock: socket.socket) -> protocol.Refuse | protocol.Drop | protocol.Bye | None:
    """After a write to ``sock`` failed because the peer closed its end (EPIPE, ECONNRESET): the
    REFUSE, DROP or BYE it sent before closing, which is still waiting to be read (a refusal is
    often sent and the connection closed before this side wrote its greeting); None when it
    said none of them. Reads what is waiting, without waiting; the socket is left non-blocking."""
    try:
        sock.setblocking(False)
        for _ in range(64):
            got = receive_now(sock)
            if got is None:
                return None
            data, fds = got
            close_fds(fds)
            if not data:
                return None
            message = protocol.decode(data, len(fds))
            if isinstance(message, (protocol.Refuse, protocol.Drop, protocol.Bye)):
                return message
    except (OSError, ProtocolError):
        pass
    return None


def receive_now(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """One message from a non-blocking socket: ``(data, fds)``; ``(b"", [])`` at end of stream;
    None when nothing is waiting. Raises :class:`ProtocolError` for a message that was cut
    (longer than any valid one) or came with more descriptors than fit. A peer that closed with
    messages of ours unread makes the kernel report ECONNRESET once, ahead of what the peer sent
    last (still queued): that is read next, then the end of stream."""
    try:
        data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, _CMSG_SPACE, _RECV_FLAGS)
    except (BlockingIOError, InterruptedError):
        return None
    except (ConnectionResetError, BrokenPipeError):
        try:
            data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, _CMSG_SPACE, _RECV_FLAGS)
        except OSError:
            return b"", []
    fds = _descriptors(ancillary)
    if flags & _TRUNCATED or len(data) > MAX_MESSAGE:
        close_fds(fds)
        raise ProtocolError(f"a message longer than {MAX_MESSAGE} bytes or with too many descriptors")
    return data, fds


def receive(sock: socket.socket, deadline: float, what: str, wake_fd: int = -1) -> tuple[bytes, list[int]]:
    """One message, waiting until ``deadline`` (:class:`Timeout` with ``what`` after it;
    :class:`eglcuda.ClosedError` once ``wake_fd`` is readable). The socket is left non-blocking."""
    sock.setblocking(False)
    while True:
        got = receive_now(sock)
        if got is not None:
            return got
        wait_readable(sock, deadline, what, wake_fd)


def wait_readable(sock: socket.socket, deadline: float, what: str, wake_fd: int = -1) -> None:
    """Wait until ``sock`` has something to read: :class:`Timeout` with ``what`` at ``deadline``,
    :class:`eglcuda.ClosedError` once ``wake_fd`` (an eventfd another thread writes to stop the
    wait; -1: none) is readable."""
    if not _wait(sock, select.POLLIN, deadline, wake_fd):
        raise Timeout(what)


def wait_writable(sock: socket.socket, deadline: float, wake_fd: int = -1) -> bool:
    """Whether ``sock`` can take a message before ``deadline``; :class:`eglcuda.ClosedError` once
    ``wake_fd`` is readable."""
    return _wait(sock, select.POLLOUT, deadline, wake_fd)


def _wait(sock: socket.socket | None, events: int, deadline: float, wake_fd: int) -> bool:
    """Poll ``sock`` (None: nothing, just wait) for ``events`` and ``wake_fd`` for input until
    ``deadline``: True when the socket is ready, False at the deadline, ClosedError when woken."""
    poller = select.poll()
    if sock is not None:
        poller.register(sock, events)
    if wake_fd >= 0:
        poller.register(wake_fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready = poller.poll(min(left, 3600.0) * 1000.0 + 0.5)  # (PEP 475: retried after a signal)
        if any(fd == wake_fd for fd, _ in ready):
            raise ClosedError("stopped waiting: closed by another thread")
        if ready:
            return True


def readable_now(fd: int) -> bool:
    """Whether ``fd`` has something to read now (poll, not select: any descriptor number)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    return fds


def connect(path: str, deadline: float, what: str, wait: bool = True, wake_fd: int = -1) -> socket.socket:
    """A non-blocking socket connected to ``path``. With ``wait``, retries until ``deadline``
    (then :class:`Timeout` with ``what``) while nothing listens there yet (the publisher may not
    have started) or its backlog is full; :class:`eglcuda.ClosedError` once ``wake_fd`` (see
    :func:`wait_readable`) is readable."""
    while True:
        if wake_fd >= 0 and readable_now(wake_fd):
            raise ClosedError(f"stopped waiting for a publisher at {path}: closed by another thread")
        sock = seqpacket()
        try:
            # A non-blocking UNIX connect answers at once: connected, nobody there, or EAGAIN for
            # a full backlog (a publisher busy accepting), which is worth another try like the rest.
            sock.setblocking(False)
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as exc:
            sock.close()
            if not wait:
                raise
            if isinstance(exc, ConnectionRefusedError):
                _refuse_unless_socket(path)  # (a file or directory there will never answer)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EPROTOTYPE:
                raise UsageError(f"{path} is a socket of another kind (not an eglcuda topic)") from None
            raise
        except BaseException:
            sock.close()
            raise
        if time.monotonic() >= deadline:
            raise Timeout(what)
        _wait(None, 0, min(deadline, time.monotonic() + CONNECT_RETRY_S), wake_fd)


def _refuse_unless_socket(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # (gone meanwhile: wait for a publisher as before)
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a socket"
        raise UsageError(f"{path} is {kind}: a topic's path is its publisher's socket")


def bind_listener(path: str, mode: int, backlog: int = 64) -> tuple[socket.socket, os.stat_result]:
    """A non-blocking listening socket at ``path`` (which must not exist), its file given
    ``mode``. Returns the socket and the file's stat (to recognise it at removal)."""
    sock = seqpacket()
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(backlog)
        sock.setblocking(False)
        return sock, os.lstat(path)
    except BaseException:
        sock.close()
        raise


def remove_if_same(path: str, bound: os.stat_result | None) -> None:
    """Remove ``path`` if it is still the file ``bound`` describes (another process may have
    replaced it since)."""
    if bound is None:
        return
    try:
        now = os.lstat(path)
        if (now.st_ino, now.st_dev) == (bound.st_ino, bound.st_dev):
            os.unlink(path)
    except FileNotFoundError:
        pass


def remove_dead_socket(path: str, owner: int | None = None) -> None:
    """Remove the socket file at ``path`` that a dead publisher left (the caller holds the topic's
    lock, so no eglcuda publisher is starting there); nothing to do when there is no file.
    Raises :class:`UsageError`, removing nothing, when the file is not a socket, belongs to
    another uid than ``owner`` (None: any) or something listens on it; ``OSError`` when it
    cannot be read or removed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise UsageError(f"{path} exists and is not a socket: not removing it")
    if owner is not None and info.st_uid != owner:
        raise UsageError(f"socket {path} belongs to uid {info.st_uid}, not {owner}: not removing it")
    if listening(path):
        raise UsageError(f"socket {path} is in use by a live server (not an eglcuda publisher holding the "
                         "topic's lock)")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def listening(path: str) -> bool:
    """Whether something accepts connections at ``path`` now."""
    probe = seqpacket()
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        if exc.errno == errno.EPROTOTYPE:
            raise UsageError(f"{path} is a socket of another kind (not an eglcuda topic)") from None
        return True  # it exists and refuses us otherwise (EACCES, EAGAIN): treat as alive
    finally:
        probe.close()
