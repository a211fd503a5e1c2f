"""Handing an EGLStream to another process over a UNIX domain socket.

EGL exports a stream as a file descriptor (``EGL_KHR_stream_cross_process_fd``) and leaves the
transport to the application. This module is that transport: the consumer's process *serves*
the stream on a socket path, the producer's process *receives* it. The descriptor travels as
``SCM_RIGHTS`` ancillary data, so the kernel duplicates it into the receiver.

The exchange, one connection per hand-over:

1. the receiver connects, checks who the server is (``SO_PEERCRED``) and sends ``HELLO``;
2. the server, which checked who the receiver is when it accepted it, sends ``OFFER`` followed
   by one JSON line describing the stream (a fixed schema, see :func:`_description_problem`),
   with the descriptor attached;
3. the receiver checks the description, opens the stream from the descriptor and answers
   ``ACK`` (or closes, on failure).

A server turns away a peer of a uid/gid it does not allow (answering ``REFUSED``), and anyone
who does not greet properly within a short per-connection time, while it keeps listening for
the real receiver. A receiver refuses a server of a uid/gid it does not allow before sending
anything. Both sides refuse socket paths in directories that someone else could write to,
unless told otherwise. docs/security.md has the threat model.

A server that finds a socket file nobody listens on (left by a process that died) replaces it;
one that finds a live server, or a file that is not a socket, refuses.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import secrets
import select
import socket
import stat
import struct
import termios
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .._unix import (Policy, check_directories, check_path, check_socket_file, deadline_in, peer_credentials,
                     positive_seconds, recv_fds, remaining)
from ..errors import ClosedError, PeerError, Timeout, UsageError

from .stream import Stream, StreamState

if TYPE_CHECKING:
    from ..display import Display

HELLO = b"eglcuda-receive/1\n"
OFFER = b"eglcuda-stream/1\n"
ACK = b"eglcuda-ok/1\n"
REFUSED = b"eglcuda-refused/1\n"  # the server's answer to a peer whose uid/gid it does not allow
_MAX_MESSAGE = 4096  # the first read, which carries the descriptor
_RETRY_S = 0.02  # how often a receiver retries while the server is not up yet (or its queue is full)
_HANDSHAKE_S = 2.0  # default time a connection has to greet the server
_BACKLOG = 128
_MAX_PENDING = 256  # connections that have not greeted yet; beyond this the oldest is dropped

# The stream description: one JSON object on one line.
_MAX_DESCRIPTION = 64 * 1024  # bytes of the JSON line, newline included
_MAX_DEPTH = 8  # nesting of objects and arrays; the description itself is level 1, "extra" level 2
_MAX_EXTRA_ITEMS = 1024  # values inside "extra", all levels together
_MAX_KEY = 256  # characters of a key inside "extra"
_MAX_FIFO = 4096  # as Stream(fifo_length=...)
_MAX_PID = 2**31 - 1
_INT_BOUND = 2**63  # ints inside "extra" lie in -2**63 .. 2**63-1
_REQUIRED_FOR_STREAM = ("fifo_length", "reuse_last_frame", "pid")  # what serve_stream always sends


# --- the description -------------------------------------------------------------------------

def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _extra_problem(extra: Any) -> str | None:
    """Why ``extra`` is not a bounded JSON object, or None. Iterative, so no depth can overflow
    the interpreter's stack (and a cycle stops at the depth limit)."""
    count = 0
    stack: list[tuple[Any, int, str]] = [(extra, 2, "extra")]
    while stack:
        value, depth, where = stack.pop()
        count += 1
        if count > _MAX_EXTRA_ITEMS:
            return f"extra holds more than {_MAX_EXTRA_ITEMS} values"
        kind = type(value)
        if kind is dict or kind is list:
            if depth > _MAX_DEPTH:
                return f"{where} is nested deeper than {_MAX_DEPTH} levels"
            if kind is dict:
                for key, item in value.items():
                    if type(key) is not str:
                        return f"{where} has a key that is not a string: {key!r:.40}"
                    if len(key) > _MAX_KEY:
                        return f"{where} has a key longer than {_MAX_KEY} characters"
                    stack.append((item, depth + 1, f"{where}[{key!r:.40}]"))
            else:
                stack.extend((item, depth + 1, f"{where}[{index}]") for index, item in enumerate(value))
        elif kind is int:
            if not -_INT_BOUND <= value < _INT_BOUND:
                return f"{where} is an integer outside the 64-bit range"
        elif kind is float:
            if not math.isfinite(value):
                return f"{where} is not a finite number"
        elif not (value is None or kind is bool or kind is str):
            return f"{where} is a {kind.__name__}, which JSON does not carry"
    return None


def _description_problem(description: Any) -> str | None:
    """Why ``description`` does not follow the schema, or None. The schema: an object with only
    these keys, all optional, exact types (``serve_stream`` sends the first three)::

        fifo_length       int, 0 .. 4096
        reuse_last_frame  bool
        pid               int, 1 .. 2**31-1
        extra             object: JSON values, at most 1024 in all, nested at most 8 levels
                          (counting the description), keys of at most 256 characters

    The whole line is at most 64 KiB."""
    if type(description) is not dict:
        return f"it is a JSON {_json_kind(description)}, not an object"
    for key, value in description.items():
        if key == "fifo_length":
            if type(value) is not int or not 0 <= value <= _MAX_FIFO:
                return f"fifo_length is an integer in 0..{_MAX_FIFO}, got {value!r:.40}"
        elif key == "reuse_last_frame":
            if type(value) is not bool:
                return f"reuse_last_frame is true or false, got {value!r:.40}"
        elif key == "pid":
            if type(value) is not int or not 0 < value <= _MAX_PID:
                return f"pid is a positive integer, got {value!r:.40}"
        elif key == "extra":
            if type(value) is not dict:
                return f"extra is an object, got a JSON {_json_kind(value)}"
            problem = _extra_problem(value)
            if problem:
                return problem
        else:
            return f"unknown key {key!r:.60} (known: fifo_length, reuse_last_frame, pid, extra)"
    return None


def _encode_description(description: Any) -> bytes:
    """The JSON line for ``description`` (ASCII, newline-terminated); UsageError if it does not
    follow the schema, so a bad description is found in the serving process, not its peer."""
    problem = _description_problem(description)
    if problem:
        raise UsageError(f"the stream description does not follow the schema: {problem}")
    line = json.dumps(description, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii") + b"\n"
    if len(line) > _MAX_DESCRIPTION:
        raise UsageError(f"the stream description is {len(line)} bytes as JSON; at most {_MAX_DESCRIPTION}")
    return line


# A JSON string (terminated or not) or one bracket: a linear scan, whatever the input.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _too_deep(text: str) -> bool:
    """Whether ``text`` nests arrays/objects deeper than the limit (strings are skipped), so
    json.loads never recurses into a hostile depth."""
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_description(line: bytes) -> dict[str, Any]:
    """The description in a received JSON line (newline included); PeerError unless it is one
    line of UTF-8 JSON, not too long, not too deep, no duplicate keys, following the schema."""
    if len(line) > _MAX_DESCRIPTION:
        raise PeerError(f"the description is longer than {_MAX_DESCRIPTION} bytes")
    if not line.endswith(b"\n"):
        raise PeerError("the description is not a complete line")
    if b"\n" in line[:-1]:
        raise PeerError("the description is more than one line")
    try:
        text = line[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise PeerError("the description is not UTF-8") from None
    if _too_deep(text):
        raise PeerError(f"the description is nested deeper than {_MAX_DEPTH} levels")
    try:
        description = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PeerError(f"the description is not valid JSON ({str(exc)[:80]})") from None
    problem = _description_problem(description)
    if problem:
        raise PeerError(f"the description does not follow the schema: {problem}")
    return description


# --- the server ------------------------------------------------------------------------------

def _lock(directory_fd: int, deadline: float, what: str) -> bool:
    """Take the exclusive flock on the directory (True), or find the filesystem has none (False)."""
    while True:
        try:
            fcntl.flock(directory_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Timeout(what) from None
            time.sleep(0.002)
        except OSError:
            return False  # e.g. some network filesystems: link() below still refuses a taken name


def _bind_private(parent_fd: int, parent: str, mode: int) -> tuple[socket.socket, str, int, os.stat_result]:
    """A listening socket whose file has ``mode`` from the start, in a fresh private directory
    inside ``parent``: (listener, the directory's name, its descriptor, the socket file's stat).

    Why this way: bind() creates the socket file with 0777 & ~umask, and nothing can set the mode
    before that (fchmod on a socket descriptor changes the socket's own inode, not the file), so
    for a moment the file has whatever the process umask allows. Setting the umask around bind
    would be a race of its own: the umask is process-wide, and another thread creating files
    meanwhile would get ours. Instead the socket is bound in a 0700 directory of ours, where
    nobody else can reach it, chmod-ed there, and only then linked to its real name (_publish).
    The private directory is reached through /proc/self/fd, so neither its path length nor a
    swap of its name matters."""
    while True:
        name = f".eglcuda-{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            break
        except FileExistsError:
            continue
    private_fd = -1
    listener = None
    try:
        # mkdir's mode went through the umask (it can only have lost bits): open it without
        # following a symlink, set the mode exactly, and check that it is our own directory.
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            private_fd = os.open(name, flags, dir_fd=parent_fd)
        except PermissionError:  # a umask that took our own read bit: restore it by name first
            os.chmod(name, 0o700, dir_fd=parent_fd)
            private_fd = os.open(name, flags, dir_fd=parent_fd)
        os.fchmod(private_fd, 0o700)
        info = os.fstat(private_fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700:
            raise UsageError(f"the private directory {os.path.join(parent, name)} is not ours alone")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        through_proc = f"/proc/self/fd/{private_fd}/s"
        listener.bind(through_proc if os.path.isdir(f"/proc/self/fd/{private_fd}")
                      else os.path.join(parent, name, "s"))
        os.chmod("s", mode, dir_fd=private_fd)
        listener.listen(_BACKLOG)
        return listener, name, private_fd, os.lstat("s", dir_fd=private_fd)
    except BaseException:
        if listener is not None:
            listener.close()
        _remove_private(parent_fd, name, private_fd)
        raise


def _remove_private(parent_fd: int, name: str, private_fd: int) -> None:
    if private_fd >= 0:
        try:
            os.unlink("s", dir_fd=private_fd)
        except FileNotFoundError:
            pass
        os.close(private_fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError:
        pass


def _publish(path: str, parent_fd: int, private_fd: int, deadline: float, timeout: float) -> None:
    """Give the socket bound in the private directory its real name, atomically with respect to
    other eglcuda servers: under an exclusive flock on the parent directory, a stale socket is
    removed, and the name is created by link(), which fails if the name exists by then. Two
    servers on one path: exactly one gets it, the other UsageError."""
    name = os.path.basename(path)
    locked = _lock(parent_fd, deadline, f"the directory of {path} stayed locked by another process for {timeout} s")
    try:
        try:
            found = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            found = None
        if found is not None:
            if not stat.S_ISSOCK(found.st_mode):
                raise UsageError(f"{path} exists and is not a socket: not removing it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
            try:
                probe.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                pass  # stale: its server died without cleaning up
            except OSError as exc:
                raise UsageError(f"cannot tell whether socket {path} is in use: {exc}") from None
            else:
                raise UsageError(f"socket path {path} is in use by a live server")
            finally:
                probe.close()
            try:
                again = os.lstat(name, dir_fd=parent_fd)
            except FileNotFoundError:
                again = None
            if again is not None:
                if (again.st_dev, again.st_ino) != (found.st_dev, found.st_ino):
                    raise UsageError(f"socket path {path} was taken by another process meanwhile")
                try:
                    os.unlink(name, dir_fd=parent_fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise UsageError(f"cannot remove the stale socket {path} (uid {found.st_uid}): {exc}") from None
        try:
            os.link("s", name, src_dir_fd=private_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
        except FileExistsError:
            raise UsageError(f"socket path {path} was taken by another process meanwhile") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
                raise UsageError(f"cannot create socket {path}: {exc}") from None
            # A filesystem without hard links: rename instead (we hold the lock and saw no socket).
            try:
                os.rename("s", name, src_dir_fd=private_fd, dst_dir_fd=parent_fd)
            except OSError as again:
                raise UsageError(f"cannot create socket {path}: {again}") from None
    finally:
        if locked:
            fcntl.flock(parent_fd, fcntl.LOCK_UN)


class _Greeting:
    """A connection of an allowed peer that has not greeted yet."""

    __slots__ = ("conn", "expires", "data", "pid")

    def __init__(self, conn: socket.socket, expires: float, pid: int) -> None:
        self.conn, self.expires, self.data, self.pid = conn, expires, b"", pid

    def advance(self) -> str:
        """Read what arrived: "wait" for more, "drop" the connection, or "ready" for the offer."""
        try:
            chunk = self.conn.recv(len(HELLO) - len(self.data))
        except BlockingIOError:
            return "wait"
        except OSError:
            return "drop"
        if not chunk:
            return "drop"
        self.data += chunk
        if not HELLO.startswith(self.data):
            return "drop"
        if len(self.data) < len(HELLO):
            return "wait"
        # A receiver sends nothing after its greeting and keeps its end open until it answers:
        # a peer that already closed (or talks on) would only waste the descriptor.
        try:
            self.conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return "ready"
        except OSError:
            return "drop"
        return "drop"  # it closed already (b"") or sent more than the greeting


class _Tally:
    """What the server turned away, for the message of its Timeout."""

    def __init__(self, path: str, timeout: float, policy: Policy) -> None:
        self.path, self.timeout, self.policy = path, timeout, policy
        self.turned_away = 0
        self.refused_uids: set[int] = set()
        self.refused = 0
        self.vanished = 0

    def message(self) -> str:
        notes = []
        if self.turned_away:
            notes.append(f"{self.turned_away} connection(s) that were not eglcuda receivers were turned away")
        if self.refused:
            notes.append(f"{self.refused} connection(s) from uid(s) {sorted(self.refused_uids)} were refused "
                         f"({self.policy.describe()})")
        if self.vanished:
            notes.append(f"{self.vanished} receiver(s) went away before taking it")
        return (f"no receiver took the stream at {self.path} within {self.timeout} s"
                + (f" ({'; '.join(notes)})" if notes else ""))


def _accept_all(listener: socket.socket, policy: Policy, handshake: float, tally: _Tally,
                pending: dict[int, _Greeting], poller: select.poll) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionAbortedError:
            continue
        except OSError:
            # Out of descriptors (EMFILE/ENFILE): make room by dropping the oldest greeting.
            if pending:
                oldest = next(iter(pending))
                poller.unregister(oldest)
                pending.pop(oldest).conn.close()
                tally.turned_away += 1
            else:
                time.sleep(_RETRY_S)
            return
        conn.setblocking(False)
        try:
            pid, uid, gid = peer_credentials(conn)
        except PeerError:
            conn.close()
            tally.turned_away += 1
            continue
        if not policy.allows(uid, gid):
            tally.refused += 1
            tally.refused_uids.add(uid)
            try:
                conn.send(REFUSED)
            except OSError:
                pass
            conn.close()
            continue
        if len(pending) >= _MAX_PENDING:
            oldest = next(iter(pending))
            poller.unregister(oldest)
            pending.pop(oldest).conn.close()
            tally.turned_away += 1
        pending[conn.fileno()] = _Greeting(conn, time.monotonic() + handshake, pid)
        poller.register(conn.fileno(), select.POLLIN)


def _hand_over(conn: socket.socket, payload: bytes, fd: int, deadline: float, path: str, pid: int,
               tally: _Tally) -> bool:
    """Send the offer to a receiver that greeted and wait for its answer. False when the
    descriptor did not reach it (it was gone, or closed without reading the offer: the kernel
    then reports ECONNRESET): the server goes on serving. True on ACK; PeerError when it read
    the offer and closed without confirming (or answered something else)."""
    conn.settimeout(remaining(deadline, tally.message()))
    try:
        sent = socket.send_fds(conn, [payload], [fd])
        if sent < len(payload):
            conn.sendall(payload[sent:])
    except socket.timeout:
        raise Timeout(f"the receiver at {path} (pid {pid}) did not read the stream within {tally.timeout} s") from None
    except OSError:  # EPIPE, ECONNRESET: it closed after greeting
        return False
    answer = b""
    waited = f"the receiver at {path} (pid {pid}) did not confirm within {tally.timeout} s"
    while len(answer) < len(ACK):
        conn.settimeout(remaining(deadline, waited))
        try:
            chunk = conn.recv(len(ACK) - len(answer))
        except socket.timeout:
            raise Timeout(waited) from None
        except ConnectionResetError:
            return False  # it closed with our offer unread: the descriptor never reached it
        except OSError:
            chunk = b""
        if not chunk:
            break
        answer += chunk
    if not answer and _dropped_unread(conn, min(deadline, time.monotonic() + _HANDSHAKE_S)):
        return False  # it closed with the offer still queued: the descriptor never reached it
    if answer != ACK:
        raise PeerError(f"the receiver at {path} (pid {pid}) closed without opening the stream"
                        + (f" (it answered {answer!r})" if answer else ""))
    return True


def _dropped_unread(conn: socket.socket, until: float) -> bool:
    """After a peer ended its side without answering the offer (a close, or only a shutdown of
    its writing, which it can still follow with a read): True once it is known to have closed
    with the offer unread (the kernel then drops the offer and its descriptor, and reports
    ECONNRESET here); False if it read the offer, or has done neither by ``until``."""
    while _unread(conn):
        if time.monotonic() >= until:
            return False
        time.sleep(0.002)
    return conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET


def _unread(conn: socket.socket) -> int:
    """Bytes this end sent that its peer has not read yet (``SIOCOUTQ``; 0 if unknown)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])
    except OSError:
        return 0


def offer_fd(path: str | os.PathLike, fd: int, description: dict[str, Any], timeout: float = 30.0, *,
             allowed_uids: Iterable[int] | int | None = None, allowed_gids: Iterable[int] | int | None = None,
             allow_shared_dir: bool = False, handshake_timeout: float = _HANDSHAKE_S,
             socket_mode: int = 0o600) -> int:
    """Serve ``fd`` once on the UNIX socket ``path``: wait up to ``timeout`` seconds for a
    receiver (:func:`receive_fd`), send it the descriptor with ``description`` (JSON), and wait
    for its acknowledgement. Returns the receiver's pid. The socket file is removed afterwards.

    ``description`` follows a fixed schema (keys ``fifo_length``, ``reuse_last_frame``, ``pid``
    and ``extra``, an object for anything else; see :func:`_description_problem`): anything else
    raises UsageError here, and the receiver would refuse it.

    Security (docs/security.md): the socket file has mode ``socket_mode`` (0600) whatever the
    umask; only peers whose uid is in ``allowed_uids`` (default: our own effective uid) or whose
    gid is in ``allowed_gids`` get the descriptor, checked with SO_PEERCRED before anything is
    sent; a peer has ``handshake_timeout`` seconds to greet while the server goes on accepting
    others; the directory of ``path`` (and every one above it) must not be writable by anyone
    we do not trust unless ``allow_shared_dir=True``. Widen ``socket_mode`` (e.g. 0o666) when
    other uids are allowed, or they cannot connect at all.

    The low-level half of :func:`serve_stream`, for any descriptor."""
    return _offer(path, fd, description, timeout, allowed_uids, allowed_gids, allow_shared_dir, handshake_timeout,
                  socket_mode, None)


def _offer(path: str | os.PathLike, fd: int, description: dict[str, Any], timeout: float,
           allowed_uids: Iterable[int] | int | None, allowed_gids: Iterable[int] | int | None,
           allow_shared_dir: bool, handshake_timeout: float, socket_mode: int,
           gone: Callable[[], str | None] | None) -> int:
    """:func:`offer_fd`; ``gone`` (None: never) says why what ``fd`` stands for went meanwhile
    (its stream closed by another thread, say): the serving then stops with ClosedError, before
    anything more is handed over."""
    deadline = deadline_in(timeout)
    path = check_path(path)
    policy = Policy(allowed_uids, allowed_gids, allow_shared_dir)
    handshake = positive_seconds(handshake_timeout, "handshake_timeout")
    if not isinstance(socket_mode, int) or isinstance(socket_mode, bool) or not 0 <= socket_mode <= 0o777:
        raise UsageError(f"socket_mode is a permission mode in 0 .. 0o777, got {socket_mode!r}")
    try:
        os.fstat(fd)
    except (OSError, TypeError, ValueError, OverflowError):
        raise UsageError(f"file descriptor {fd!r} is not open") from None
    payload = OFFER + _encode_description(description)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"the directory of socket path {path} does not exist") from None
    except PermissionError:
        raise UsageError(f"no permission to use the directory of socket path {path}") from None
    listener: socket.socket | None = None
    published: os.stat_result | None = None
    try:
        if not policy.allow_shared_dir:
            try:
                check_directories(path, policy, parent_fd)
            except PermissionError as exc:
                raise UsageError(f"cannot check the directories of socket path {path}: {exc}") from None
        try:
            listener, private, private_fd, published = _bind_private(parent_fd, parent, socket_mode)
        except OSError as exc:
            raise UsageError(f"cannot create a socket in {parent}: {exc}") from None
        try:
            _publish(path, parent_fd, private_fd, deadline, timeout)
        except BaseException:
            published = None
            raise
        finally:
            _remove_private(parent_fd, private, private_fd)
        listener.setblocking(False)
        return _serve(listener, path, fd, payload, deadline, timeout, policy, handshake, gone)
    finally:
        # Remove the file while the listener is still open: as long as it is, any other server
        # probing the path finds it live and leaves it alone, so the file we see is ours.
        if published is not None:
            try:
                now = os.lstat(os.path.basename(path), dir_fd=parent_fd)
                if (now.st_ino, now.st_dev) == (published.st_ino, published.st_dev):
                    os.unlink(os.path.basename(path), dir_fd=parent_fd)
            except OSError:
                pass
        if listener is not None:
            listener.close()
        os.close(parent_fd)


_GONE_LOOK_S = 0.1  # how often a server with something that may go (``gone``) looks at it while it waits


def _serve(listener: socket.socket, path: str, fd: int, payload: bytes, deadline: float, timeout: float,
           policy: Policy, handshake: float, gone: Callable[[], str | None] | None = None) -> int:
    """Accept and greet connections concurrently (poll), each with its own handshake deadline,
    until one allowed receiver greets and takes the descriptor, or ``deadline`` passes."""
    tally = _Tally(path, timeout, policy)
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    pending: dict[int, _Greeting] = {}

    def drop(fileno: int) -> _Greeting:
        poller.unregister(fileno)
        greeting = pending.pop(fileno)
        greeting.conn.close()
        return greeting

    try:
        while True:
            now = time.monotonic()
            for fileno in [f for f, g in pending.items() if g.expires <= now]:
                drop(fileno)
                tally.turned_away += 1
            if now >= deadline:
                raise Timeout(tally.message())
            why = gone() if gone is not None else None
            if why:
                raise ClosedError(f"stopped serving at {path}: {why}")
            wake = min([deadline] + [g.expires for g in pending.values()]
                       + ([now + _GONE_LOOK_S] if gone is not None else []))
            for fileno, _mask in poller.poll(max(1, math.ceil((wake - now) * 1000))):
                if fileno == listener.fileno():
                    _accept_all(listener, policy, handshake, tally, pending, poller)
                    continue
                greeting = pending.get(fileno)
                if greeting is None:
                    continue
                state = greeting.advance()
                if state == "drop":
                    drop(fileno)
                    tally.turned_away += 1
                elif state == "ready":
                    poller.unregister(fileno)
                    del pending[fileno]
                    why = gone() if gone is not None else None
                    if why:
                        greeting.conn.close()
                        raise ClosedError(f"stopped serving at {path}: {why}")
                    with greeting.conn:
                        if _hand_over(greeting.conn, payload, fd, deadline, path, greeting.pid, tally):
                            return greeting.pid
                    tally.vanished += 1
    finally:
        for greeting in pending.values():
            greeting.conn.close()


# --- the receiver ----------------------------------------------------------------------------

def _read_line(conn: socket.socket, limit: int, deadline: float, what: str) -> bytes:
    """Bytes up to and including the first newline (at most ``limit``); b"" if the peer closed."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        conn.settimeout(remaining(deadline, what))
        try:
            chunk = conn.recv(limit - len(data))
        except socket.timeout:
            raise Timeout(what) from None
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


_FULL = " (its queue of connections stayed full)"


def _connect(path: str, policy: Policy, deadline: float, timeout: float) -> socket.socket:
    """A connection to the server at ``path``, retried while nothing listens there yet (or its
    queue is full) until ``deadline``; the path's directories and file checked before each try."""
    waited = f"no eglcuda stream server at {path} within {timeout} s"
    busy = False
    pause = 0.001  # doubling up to _RETRY_S: quick when the server is about to appear
    while True:
        present = True
        if not policy.allow_shared_dir:
            try:
                check_directories(path, policy)
                present = check_socket_file(path, policy)
            except (FileNotFoundError, NotADirectoryError):
                present = False
            except PermissionError as exc:
                raise UsageError(f"no permission to reach socket path {path}: {exc}") from None
        if present:
            left = remaining(deadline, waited + (_FULL if busy else ""))
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec, as Python makes them
            try:
                conn.settimeout(left)
                conn.connect(path)
                return conn
            except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
                conn.close()
            except BlockingIOError:  # EAGAIN: the server's queue of connections is full
                conn.close()
                busy = True
            except socket.timeout:  # (eglcuda's Timeout is a TimeoutError too: nothing in here raises one)
                conn.close()
                raise Timeout(waited) from None
            except PermissionError as exc:
                conn.close()
                raise UsageError(f"no permission to connect to {path}: {exc.strerror}") from None
            except OSError as exc:
                conn.close()
                if exc.errno == errno.EPROTOTYPE:
                    raise PeerError(f"{path} is not an eglcuda stream server (not a stream socket)") from None
                raise UsageError(f"cannot connect to {path}: {exc}") from None
            except BaseException:
                conn.close()
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(waited + (_FULL if busy else ""))
        time.sleep(min(pause, left))
        pause = min(pause * 2, _RETRY_S)


def _receive(path: str | os.PathLike, timeout: float, policy_args: tuple[Any, Any, Any],
             required: tuple[str, ...]) -> tuple[int, dict[str, Any], socket.socket]:
    deadline = deadline_in(timeout)
    path = check_path(path)
    policy = Policy(*policy_args)
    conn = _connect(path, policy, deadline, timeout)
    fds: list[int] = []
    try:
        pid, uid, gid = peer_credentials(conn)
        if not policy.allows(uid, gid):
            raise PeerError(f"the server at {path} runs as uid {uid} (gid {gid}, pid {pid}), which is not allowed "
                            f"({policy.describe()}): nothing was sent to it")
        waited = f"the server at {path} sent no stream within {timeout} s"
        try:
            conn.settimeout(remaining(deadline, waited))
            conn.sendall(HELLO)
        except socket.timeout:
            raise Timeout(waited) from None
        except OSError:
            pass  # it closed at once; what it said before that (REFUSED) is still there to read
        conn.settimeout(remaining(deadline, waited))
        try:
            data, fds, flags = recv_fds(conn, _MAX_MESSAGE, 4)
        except socket.timeout:
            raise Timeout(waited) from None
        except OSError:
            data, flags = b"", 0
        if data.startswith(REFUSED):
            raise PeerError(f"the server at {path} refused this process (uid {os.geteuid()}, gid {os.getegid()}): "
                            "it does not list it in its allowed_uids/allowed_gids")
        if not data:
            raise PeerError(f"the server at {path} closed the connection without sending a stream")
        if not data.startswith(OFFER):
            raise PeerError(f"the server at {path} is not an eglcuda stream server (it sent {data[:32]!r})")
        if len(fds) != 1 or flags & getattr(socket, "MSG_CTRUNC", 0):
            raise PeerError(f"the server at {path} sent {len(fds)} descriptors instead of one")
        # The JSON line may arrive in more than one read.
        line = data[len(OFFER):]
        if b"\n" not in line:
            line += _read_line(conn, _MAX_DESCRIPTION + 1 - len(line), deadline, waited)
        try:
            description = _decode_description(line)
        except PeerError as exc:
            raise PeerError(f"the server at {path} sent a malformed stream description: {exc}") from None
        missing = [key for key in required if key not in description]
        if missing:
            raise PeerError(f"the server at {path} sent a malformed stream description: it lacks {', '.join(missing)}")
        fd = fds.pop()
        return fd, description, conn
    except BaseException:
        for extra in fds:
            os.close(extra)
        conn.close()
        raise


def receive_fd(path: str | os.PathLike, timeout: float = 30.0, *,
               allowed_uids: Iterable[int] | int | None = None, allowed_gids: Iterable[int] | int | None = None,
               allow_shared_dir: bool = False) -> tuple[int, dict[str, Any], socket.socket]:
    """Connect to a server at ``path`` (waiting up to ``timeout`` seconds for it to appear) and
    take the descriptor it offers. Returns the descriptor (yours to close; close-on-exec), the
    description and the connection, on which :func:`acknowledge` must answer once the
    descriptor is used.

    Security (docs/security.md): before connecting, the socket file and its directories are
    checked as :func:`offer_fd` checks its directories (socket and directories owned by us, root
    or an allowed uid; no directory writable by others without the sticky bit), unless
    ``allow_shared_dir=True``. Right after connecting, before anything is sent, the server's
    uid/gid (SO_PEERCRED) must be allowed: ``allowed_uids`` (default: our own effective uid),
    ``allowed_gids``. Anything else raises PeerError. The description is checked against the
    schema before this returns: a malformed one raises PeerError (the caller never answers)."""
    return _receive(path, timeout, (allowed_uids, allowed_gids, allow_shared_dir), ())


def acknowledge(conn: socket.socket, ok: bool) -> None:
    """Tell the server whether the descriptor was used, and close the connection."""
    try:
        if ok:
            conn.sendall(ACK)
    except OSError:
        pass
    finally:
        conn.close()


def serve_stream(stream: "Stream", path: str | os.PathLike, timeout: float = 30.0, *,
                 allowed_uids: Iterable[int] | int | None = None, allowed_gids: Iterable[int] | int | None = None,
                 allow_shared_dir: bool = False, handshake_timeout: float = _HANDSHAKE_S,
                 socket_mode: int = 0o600) -> int:
    """Hand ``stream`` to one other process that calls :func:`receive_stream` on ``path``.

    Call it in the consumer's process after the consumer connected (EGL's order: the producer
    process may connect as soon as it holds the stream). The stream must have been created with
    ``cross_process=True``. Blocks until the receiver has opened the stream, up to ``timeout``
    seconds (:class:`Timeout`); a receiver that dies midway raises :class:`PeerError`. Returns
    the receiver's process id. The socket file exists only during the call.

    By default only a process of our own effective uid gets the stream, the socket file is 0600
    and its directory must be private; the keyword options are :func:`offer_fd`'s."""
    if not all(hasattr(stream, name) for name in ("closed", "imported", "_fd_box", "state")):
        raise UsageError(f"serve_stream takes an eglcuda.Stream, got {type(stream).__name__}")
    if stream.closed:
        raise ClosedError("the stream is closed (or its display is)")
    if stream.imported:
        raise UsageError("this stream was opened from another process's descriptor: only its creator can serve it")
    if not stream._fd_box:
        raise UsageError("the stream has no descriptor to share: create it with cross_process=True")
    state = stream.state
    if state is not StreamState.CONNECTING:
        if state is StreamState.CREATED:
            raise UsageError("connect the consumer before serving the stream: the other process may connect "
                             "its producer as soon as it receives it")
        raise UsageError(f"the stream cannot take a producer from another process now (state {state.name})")
    description = {"fifo_length": stream.fifo_length, "reuse_last_frame": bool(stream.reuse_last_frame),
                   "pid": os.getpid()}
    # A duplicate of the stream's descriptor, ours until the serving ends: a close() of the stream
    # by another thread meanwhile closes the stream's own, whose number the process may reuse at
    # once (the receiver would get whatever file took it); serving then stops with ClosedError.
    try:
        fd = os.dup(stream._fd_box[0])
    except (IndexError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.EBADF:
            raise  # (out of descriptors, say: not a closed stream)
        raise ClosedError("the stream is closed (or its display is)") from None
    try:
        return _offer(path, fd, description, timeout, allowed_uids, allowed_gids, allow_shared_dir,
                      handshake_timeout, socket_mode,
                      lambda: "the stream was closed (or its display was)" if stream.closed else None)
    finally:
        os.close(fd)


def receive_stream(display: "Display", path: str | os.PathLike, timeout: float = 30.0, *,
                   allowed_uids: Iterable[int] | int | None = None, allowed_gids: Iterable[int] | int | None = None,
                   allow_shared_dir: bool = False) -> "Stream":
    """Open the stream another process serves on ``path`` (:func:`serve_stream`), on
    ``display``. Waits up to ``timeout`` seconds for the server to appear and answer. Connect the
    producer to the returned stream as in one process.

    The server must run as our own effective uid unless ``allowed_uids``/``allowed_gids`` say
    otherwise, and its description must be complete and well-formed: both are checked before
    the stream is opened (:class:`PeerError`). The other keyword options are :func:`receive_fd`'s."""
    if not all(hasattr(display, name) for name in ("closed", "require")):
        raise UsageError(f"receive_stream takes an eglcuda.Display, got {type(display).__name__}")
    if display.closed:
        raise ClosedError(f"{display.description} is closed")
    display.require("EGL_KHR_stream", "EGL_KHR_stream_cross_process_fd")
    fd, description, conn = _receive(path, timeout, (allowed_uids, allowed_gids, allow_shared_dir),
                                     _REQUIRED_FOR_STREAM)
    opened = False
    try:
        stream = Stream.from_fd(display, fd)
        opened = True
    finally:
        os.close(fd)  # the stream keeps a duplicate open as long as it lives
        acknowledge(conn, opened)
    if not stream.fifo_length:
        stream.fifo_length = description["fifo_length"]
    return stream
