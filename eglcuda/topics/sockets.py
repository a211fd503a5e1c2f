"""The topic sockets' own steps: ``SOCK_SEQPACKET`` UNIX sockets, one datagram per message of
:mod:`.protocol`, connecting, binding and cleaning up topic sockets. The machinery the streams'
hand-over shares (credentials, access policy, descriptors, deadlines, waits) is
:mod:`eglcuda._unix`, re-exported here for the topic modules.

Every blocking call takes a deadline (``time.monotonic()`` seconds) and raises
:class:`eglcuda.Timeout` when it passes; descriptors that arrive with a message this side does not
want, or more of them than asked for, are closed at once."""
from __future__ import annotations

import errno
import os
import socket
import stat
import time

from .._unix import (Peer, Policy, close_fds, pause, peer_of, readable_now, recv_fds, send, seqpacket, wait_readable,
                     wait_seconds, wait_writable)
from ..errors import ClosedError, Timeout, UsageError
from . import protocol
from .protocol import MAX_MESSAGE, ProtocolError

_MAX_FDS = 2  # room for one more than any message may carry, to notice extras
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
CONNECT_RETRY_S = 0.02

__all__ = ["Peer", "Policy", "close_fds", "peer_of", "readable_now", "send", "seqpacket", "wait_readable",
           "wait_seconds", "wait_writable"]


def close_quietly(sock: socket.socket) -> None:
    """Close ``sock`` after reading what its peer sent: a UNIX socket closed with unread messages
    resets the connection, and the peer's next read fails with ECONNRESET instead of returning
    what was sent to it last (a REFUSE or DROP with its reason)."""
    try:
        sock.setblocking(False)
        for _ in range(4096):
            data, fds, _ = recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
            close_fds(fds)
            if not data:
                break
    except OSError:
        pass
    sock.close()


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
        data, fds, flags = recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
    except (BlockingIOError, InterruptedError):
        return None
    except (ConnectionResetError, BrokenPipeError):
        try:
            data, fds, flags = recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
        except OSError:
            return b"", []
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


def connect(path: str, deadline: float, what: str, wait: bool = True, wake_fd: int = -1) -> socket.socket:
    """A non-blocking socket connected to ``path``. With ``wait``, retries until ``deadline``
    (then :class:`Timeout` with ``what``) while nothing listens there yet (the publisher may not
    have started) or its backlog is full; :class:`eglcuda.ClosedError` once ``wake_fd`` (see
    :func:`wait_readable`) is readable; :class:`UsageError` naming ``path`` when this user may
    not connect to it."""
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
            if isinstance(exc, PermissionError):  # (a socket of another user's access="user" topic, a private folder)
                raise UsageError(f"no permission to connect to {path} ({exc.strerror}): the topic's access= or "
                                 "its folder's mode keeps this user out") from None
            if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG):  # (a path no topic can be at)
                raise UsageError(f"cannot connect to {path}: {exc.strerror}") from None
            raise
        except BaseException:
            sock.close()
            raise
        if time.monotonic() >= deadline:
            raise Timeout(what)
        pause(min(deadline, time.monotonic() + CONNECT_RETRY_S), wake_fd)


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
    ``mode``. Returns the socket and the file's stat (to recognise it at removal).

    The mode is set through a descriptor of the file found at ``path`` without following a
    symbolic link, once it is checked to be a socket of this user's: in a folder others may
    write to, another user could replace the new socket with a link to a file of ours between
    the bind and the chmod, and a chmod by name would open that file to them."""
    sock = seqpacket()
    try:
        sock.bind(path)
        try:
            found = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"the socket {path} was removed as the publisher made it ({exc.strerror})") from None
        try:
            info = os.fstat(found)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
                raise UsageError(f"the socket {path} was replaced by another file as the publisher made it: is its "
                                 "folder open to other users' writes?")
            try:
                os.chmod(f"/proc/self/fd/{found}", mode)  # (that very file: an O_PATH descriptor takes no fchmod)
            except FileNotFoundError:  # (no /proc mounted: by name, just after the check)
                os.chmod(path, mode)
        finally:
            os.close(found)
        sock.listen(backlog)
        sock.setblocking(False)
        return sock, info
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
