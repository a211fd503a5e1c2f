"""The UNIX-socket machinery that streams (share.py: an EGLStream's descriptor handed to another
process) and topics (a publisher and its subscribers) share: deadlines and argument checks, who is
at the other end (``SO_PEERCRED``) and who may be (:class:`Policy`), directories another user
could write to, descriptors passed as ``SCM_RIGHTS``, and waits that another thread can cut short.

Every blocking call takes a deadline (``time.monotonic()`` seconds) and raises
:class:`eglcuda.Timeout` when it passes. Descriptors that arrive are always handed to the caller,
even with a message it refuses, so that it closes them.
"""
from __future__ import annotations

import array
import os
import select
import socket
import stat
import struct
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ._integers import as_int, check_flag
from .errors import ClosedError, PeerError, Timeout, UsageError, shown

_SEND_FLAGS = int(getattr(socket, "MSG_NOSIGNAL", 0))


# ---- deadlines and arguments ----------------------------------------------------------------------

_LONGEST_WAIT_S = 1e8  # about three years: socket timeouts and deadlines hold it


def deadline_in(timeout: float) -> float:
    """The ``time.monotonic()`` deadline ``timeout`` seconds from now (a positive number)."""
    return time.monotonic() + positive_seconds(timeout, "timeout")


def remaining(deadline: float, what: str) -> float:
    """Seconds left until ``deadline``; :class:`Timeout` with ``what`` once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout(what)
    return left


def check_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a UNIX socket path this library accepts, or :class:`UsageError` saying why not."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise UsageError(f"a socket path is a non-empty str, got {path!r}") from None
    if not isinstance(text, str) or not text:
        raise UsageError(f"a socket path is a non-empty str, got {path!r}")
    if text.startswith("\0"):
        # Linux's abstract names have no file, hence no permissions and no owner to check, and
        # anyone on the host (in the same network namespace) may bind one first: refused.
        raise UsageError(f"abstract socket names (starting with NUL) are not supported, got {text!r}: "
                         "use a path in a private directory")
    if "\0" in text:
        raise UsageError(f"a socket path cannot contain NUL, got {text!r}")
    if len(os.fsencode(text)) >= 108:  # sun_path holds 108 bytes with the terminating NUL
        raise UsageError(f"socket path is {len(os.fsencode(text))} bytes; UNIX sockets take at most 107: {text}")
    if not os.path.basename(text):
        raise UsageError(f"a socket path names a file, got the directory {text!r}")
    return text


def numeric_ids(value: Any, what: str, default: frozenset[int]) -> frozenset[int]:
    """A set of numeric uids or gids from an integer (a NumPy one too), an iterable of them, or
    None (``default``); the set holds plain ints."""
    if value is None:
        return default
    single = as_int(value)
    if single is not None:
        value = (single,)
    if isinstance(value, (str, bytes)):
        raise UsageError(f"{what} is a set of numeric ids, got {shown(value)}")
    try:
        items = list(value)
    except TypeError:
        raise UsageError(f"{what} is a set of numeric ids, got {shown(value)}") from None
    ids = []
    for item in items:
        number = as_int(item)
        if number is None or not 0 <= number < 2**32:
            raise UsageError(f"{what} holds numeric ids (0 .. 2**32-1), got {shown(item)}")
        ids.append(number)
    return frozenset(ids)


def positive_seconds(value: Any, what: str) -> float:
    """``value`` as a positive number of seconds, or :class:`UsageError` naming ``what``."""
    if value.__class__ is not float and value.__class__ is not int:
        import numbers  # (rare: numpy's numbers, taken as wait_seconds takes them)

        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise UsageError(f"{what} is a positive number of seconds (at most {_LONGEST_WAIT_S:.0e}), "
                             f"got {shown(value)}")
    if not 0 < value <= _LONGEST_WAIT_S:
        raise UsageError(f"{what} is a positive number of seconds (at most {_LONGEST_WAIT_S:.0e}), got {shown(value)}")
    return float(value)


def wait_seconds(value: Any, what: str = "timeout") -> float:
    """``value`` as a time to wait (``what`` names it in the error): a real number of seconds
    >= 0 (numpy's too, not a bool); inf, or an int beyond any float, waits forever (inf).
    Raises :class:`UsageError` for anything else."""
    if value.__class__ is not float and value.__class__ is not int:
        import numbers  # (rare: numpy's numbers, fractions)

        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise UsageError(f"{what} is a number of seconds >= 0, got {shown(value)}")
    if not value >= 0:
        raise UsageError(f"{what} is a number of seconds >= 0, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:  # (an int beyond any float: as good as forever)
        return float("inf")


# ---- who is at the other end, and who may be ------------------------------------------------------

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


class Policy:
    """Who may be at the other end of the socket, and which directories we trust.

    A peer is allowed when its uid is in ``uids`` or its gid in ``gids`` (the credentials the
    kernel recorded when it connected or listened: effective uid and primary gid). :meth:`allows`
    sees only those (the stream hand-over's check); :meth:`refusal` (the topics' check) also
    counts the peer's supplementary groups. Default: our own effective uid only, root included only when we are
    root. A directory (or socket file) is trusted when it belongs to us, to root, or to an
    allowed uid."""

    __slots__ = ("uids", "gids", "allow_shared_dir")

    def __init__(self, allowed_uids: Any, allowed_gids: Any, allow_shared_dir: Any) -> None:
        self.uids = numeric_ids(allowed_uids, "allowed_uids", frozenset((os.geteuid(),)))
        self.gids = numeric_ids(allowed_gids, "allowed_gids", frozenset())
        if not self.uids and not self.gids:
            raise UsageError("allowed_uids and allowed_gids are both empty: no peer could ever be accepted")
        self.allow_shared_dir = check_flag(allow_shared_dir, "allow_shared_dir")

    def allows(self, uid: int, gid: int) -> bool:
        return uid in self.uids or gid in self.gids

    def trusts_owner(self, uid: int) -> bool:
        return uid == os.geteuid() or uid == 0 or uid in self.uids

    def describe(self) -> str:
        text = f"allowed uids: {sorted(self.uids)}"
        if self.gids:
            text += f", allowed gids: {sorted(self.gids)}"
        return text

    def refusal(self, peer: Peer) -> str | None:
        """Why ``peer`` may not be at the other end (None: it may). Its supplementary groups
        (``/proc/<pid>/status``) count too."""
        if self.allows(peer.uid, peer.gid) or (self.gids and self.gids & peer_groups(peer.pid)):
            return None
        return f"uid {peer.uid} (gid {peer.gid}) is not allowed ({self.describe()})"


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the other end, as the kernel recorded them when it connected (the
    client) or listened (the server). Fails closed: no credentials, no hand-over."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        pid, uid, gid = struct.unpack("iII", raw)
    except (OSError, AttributeError, struct.error) as exc:
        raise PeerError(f"cannot tell which user is at the other end of the socket (SO_PEERCRED: {exc})") from None
    return pid, uid, gid


def _directory_problem(info: os.stat_result, policy: Policy) -> str | None:
    """Why a directory lets someone we do not trust replace what is in it, or None."""
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if not policy.trusts_owner(info.st_uid):
        return f"belongs to uid {info.st_uid} ({policy.describe()}, plus our own uid and root)"
    sticky = bool(info.st_mode & stat.S_ISVTX)  # others may add entries but not remove or rename ours
    if info.st_mode & stat.S_IWOTH and not sticky:
        return "is writable by every user (and has no sticky bit)"
    if info.st_mode & stat.S_IWGRP and not sticky and info.st_gid not in policy.gids:
        return f"is writable by group {info.st_gid} (and has no sticky bit)"
    return None


def _ancestors(directory: str) -> list[str]:
    chain = [directory]
    while True:
        parent = os.path.dirname(chain[-1])
        if parent == chain[-1]:
            return chain
        chain.append(parent)


def check_directories(path: str, policy: Policy, opened: int | None = None) -> None:
    """Refuse a socket path whose directory, or any directory above it (as written and as
    resolved), someone we do not trust could write to: they could replace the socket with their
    own. ``opened``: a descriptor of the parent directory, which must be the one checked.
    FileNotFoundError passes through (the receiver waits for the directory to appear)."""
    parent = os.path.dirname(os.path.abspath(path))
    seen: set[str] = set()
    for directory in _ancestors(parent) + _ancestors(os.path.realpath(parent)):
        if directory in seen:
            continue
        seen.add(directory)
        problem = _directory_problem(os.stat(directory), policy)
        if problem:
            raise UsageError(f"refusing socket path {path}: directory {directory} {problem}, so another user "
                             "could replace the socket; use a private directory (mode 0700, e.g. under "
                             "$XDG_RUNTIME_DIR), or pass allow_shared_dir=True to rely on the peer-uid check alone")
    if opened is not None:
        info, named = os.fstat(opened), os.stat(parent)
        if (info.st_dev, info.st_ino) != (named.st_dev, named.st_ino):
            raise UsageError(f"directory {parent} was replaced while it was being checked")
        problem = _directory_problem(info, policy)
        if problem:
            raise UsageError(f"refusing socket path {path}: directory {parent} {problem}")


def check_socket_file(path: str, policy: Policy) -> bool:
    """False while nothing is at ``path``; a socket of a trusted owner is fine; anything else
    raises. The receiver's check before connecting (SO_PEERCRED after connecting is the real one)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        raise UsageError(f"{path} is not a socket" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode) else ""))
    if not policy.trusts_owner(info.st_uid):
        raise PeerError(f"the socket {path} belongs to uid {info.st_uid}, which is not allowed ({policy.describe()}): "
                        "another user may have taken the path")
    return True


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the regular file at ``path``; None when it cannot be read or is no
    regular file (a link is not followed; a FIFO is not waited on: ``O_NONBLOCK`` opens it at once)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                return None
            return source.read(limit)
    except OSError:
        return None


# ---- descriptors (SCM_RIGHTS) -----------------------------------------------------------------------

def send(sock: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    """Send one message (and ``fds``) on a connected socket, in whatever blocking mode it is in.
    A peer that closed makes it raise ``BrokenPipeError`` (never SIGPIPE, whatever the program
    did with that signal): what it said before is still there to read."""
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))], _SEND_FLAGS)
    else:
        sock.send(data, _SEND_FLAGS)


def recv_fds(conn: socket.socket, size: int, most: int, flags: int = 0) -> tuple[bytes, list[int], int]:
    """socket.recv_fds, with the descriptors close-on-exec from the start (MSG_CMSG_CLOEXEC: the
    kernel sets the flag as it installs them, so no fork/exec in another thread can inherit
    them). socket.recv_fds itself cannot do this: it accepts a flags argument but does not pass
    it on to recvmsg (Python 3.11 at least). Every descriptor received is in the list, even from
    a message that is otherwise refused, so that the caller closes them. Returns (data,
    descriptors, the message's flags: MSG_TRUNC / MSG_CTRUNC say it was cut)."""
    fds: list[int] = []
    data, ancillary, flags, _ = conn.recvmsg(size, socket.CMSG_SPACE(most * _INT_SIZE), flags | socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _INT_SIZE
            fds.extend(struct.unpack(f"{usable // _INT_SIZE}i", payload[:usable]))
    return data, fds, flags


_INT_SIZE = struct.calcsize("i")


def close_fds(fds: Iterable[int]) -> None:
    """Close each descriptor, ignoring ones already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass




# ---- waits another thread can cut short -------------------------------------------------------------

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


def pause(until: float, wake_fd: int = -1) -> None:
    """Sleep until ``until`` (``time.monotonic()``); :class:`eglcuda.ClosedError` once ``wake_fd``
    is readable."""
    _wait(None, 0, until, wake_fd)


def readable_now(fd: int) -> bool:
    """Whether ``fd`` has something to read now (poll, not select: any descriptor number)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
