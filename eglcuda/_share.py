"""Handing an EGLStream to another process over a UNIX domain socket.

EGL exports a stream as a file descriptor (``EGL_KHR_stream_cross_process_fd``) and leaves the
transport to the application. This module is that transport: the consumer's process *serves*
the stream on a socket path, the producer's process *receives* it. The descriptor travels as
``SCM_RIGHTS`` ancillary data, so the kernel duplicates it into the receiver.

The exchange, one connection per hand-over:

1. the receiver connects and sends ``HELLO`` (a server ignores anyone who does not);
2. the server sends ``OFFER`` followed by one JSON line describing the stream, with the
   descriptor attached;
3. the receiver opens the stream from the descriptor and answers ``ACK`` (or closes, on failure).

A server that finds a socket file nobody listens on (left by a process that died) replaces it;
one that finds a live server, or a file that is not a socket, refuses.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import struct
import time
from typing import TYPE_CHECKING, Any

from ._errors import ClosedError, PeerError, Timeout, UsageError

if TYPE_CHECKING:
    from ._display import Display
    from ._stream import Stream

HELLO = b"eglcuda-receive/1\n"
OFFER = b"eglcuda-stream/1\n"
ACK = b"eglcuda-ok/1\n"
_MAX_MESSAGE = 4096  # the first read, which carries the descriptor
_MAX_DESCRIPTION = 1 << 20
_RETRY_S = 0.02  # how often a receiver retries while the server is not up yet


def _deadline(timeout: float) -> float:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise UsageError(f"timeout is a positive number of seconds, got {timeout!r}")
    return time.monotonic() + timeout


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout(what)
    return left


def _check_path(path: str | os.PathLike) -> str:
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise UsageError(f"a socket path is a non-empty str, got {path!r}")
    if len(os.fsencode(text)) >= 108:  # sun_path holds 108 bytes with the terminating NUL
        raise UsageError(f"socket path is {len(os.fsencode(text))} bytes; UNIX sockets take at most 107: {text}")
    return text


def _read_line(conn: socket.socket, limit: int, deadline: float, what: str) -> bytes:
    """Bytes up to and including the first newline (at most ``limit``); b"" if the peer closed."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        conn.settimeout(_remaining(deadline, what))
        try:
            chunk = conn.recv(limit - len(data))
        except socket.timeout:
            raise Timeout(what) from None
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk
    return data


def _claim(path: str) -> None:
    """Make ``path`` free for a new server: remove a stale socket, refuse anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise UsageError(f"{path} exists and is not a socket: not removing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            os.unlink(path)  # stale: its server died without cleaning up
        except FileNotFoundError:
            pass
        return
    except OSError as exc:
        raise UsageError(f"cannot tell whether socket {path} is in use: {exc}") from None
    finally:
        probe.close()
    raise UsageError(f"socket path {path} is in use by a live server")


def _peer_pid(conn: socket.socket) -> int:
    """The process id at the other end (``SO_PEERCRED``), or -1 where the OS does not say."""
    try:
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
        return pid
    except (OSError, AttributeError):
        return -1


def offer_fd(path: str | os.PathLike, fd: int, description: dict[str, Any], timeout: float = 30.0) -> int:
    """Serve ``fd`` once on the UNIX socket ``path``: wait up to ``timeout`` seconds for a
    receiver (:func:`receive_fd`), send it the descriptor with ``description`` (JSON), and wait
    for its acknowledgement. Returns the receiver's pid. The socket file is removed afterwards.

    The low-level half of :func:`serve_stream`, for any descriptor."""
    deadline = _deadline(timeout)
    path = _check_path(path)
    try:
        os.fstat(fd)
    except (OSError, TypeError):
        raise UsageError(f"file descriptor {fd!r} is not open") from None
    _claim(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refused = 0
    bound: os.stat_result | None = None
    try:
        listener.bind(path)
        bound = os.lstat(path)
        listener.listen(4)
        while True:
            waited = f"no receiver took the stream at {path} within {timeout} s" + (
                f" ({refused} connection(s) that were not eglcuda receivers were turned away)" if refused else "")
            listener.settimeout(_remaining(deadline, waited))
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                raise Timeout(waited) from None
            with conn:
                greeting = _read_line(conn, len(HELLO), deadline, waited)
                if greeting != HELLO:
                    refused += 1
                    continue
                payload = OFFER + json.dumps(description).encode() + b"\n"
                conn.settimeout(_remaining(deadline, waited))
                try:
                    socket.send_fds(conn, [payload], [fd])
                except (BrokenPipeError, ConnectionResetError):
                    raise PeerError(f"the receiver at {path} went away before the stream was sent") from None
                answer = _read_line(conn, len(ACK), deadline, f"the receiver at {path} did not confirm within {timeout} s")
                if answer != ACK:
                    raise PeerError(f"the receiver at {path} closed without opening the stream"
                                    + (f" (it answered {answer!r})" if answer else ""))
                return _peer_pid(conn)
    finally:
        listener.close()
        try:
            now = os.lstat(path)
            if bound is not None and (now.st_ino, now.st_dev) == (bound.st_ino, bound.st_dev):
                os.unlink(path)  # ours: a later server may have replaced it, leave that one alone
        except FileNotFoundError:
            pass


def receive_fd(path: str | os.PathLike, timeout: float = 30.0) -> tuple[int, dict[str, Any], socket.socket]:
    """Connect to a server at ``path`` (waiting up to ``timeout`` seconds for it to appear) and
    take the descriptor it offers. Returns the descriptor (yours to close), the description and
    the connection, on which :func:`acknowledge` must answer once the descriptor is used."""
    deadline = _deadline(timeout)
    path = _check_path(path)
    waited = f"no eglcuda stream server at {path} within {timeout} s"
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(_remaining(deadline, waited))
            conn.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            time.sleep(min(_RETRY_S, max(deadline - time.monotonic(), 0)))
        except socket.timeout:
            conn.close()
            raise Timeout(waited) from None
        except BaseException:
            conn.close()
            raise
    fds: list[int] = []
    try:
        conn.sendall(HELLO)
        conn.settimeout(_remaining(deadline, waited))
        try:
            data, fds, flags, _ = socket.recv_fds(conn, _MAX_MESSAGE, 4)
        except socket.timeout:
            raise Timeout(f"the server at {path} sent no stream within {timeout} s") from None
        except (ConnectionResetError, BrokenPipeError):
            data, flags = b"", 0
        if not data:
            raise PeerError(f"the server at {path} closed the connection without sending a stream")
        if not data.startswith(OFFER):
            raise PeerError(f"the server at {path} is not an eglcuda stream server (it sent {data[:32]!r})")
        if len(fds) != 1 or flags & getattr(socket, "MSG_CTRUNC", 0):
            raise PeerError(f"the server at {path} sent {len(fds)} descriptors instead of one")
        # The JSON line may arrive in more than one read.
        rest = data[len(OFFER):]
        if not rest.endswith(b"\n"):
            rest += _read_line(conn, _MAX_DESCRIPTION, deadline, waited)
        try:
            description = json.loads(rest)
        except ValueError:
            raise PeerError(f"the server at {path} sent a malformed stream description") from None
        fd = fds.pop()
        return fd, description, conn
    except BaseException:
        for extra in fds:
            os.close(extra)
        conn.close()
        raise


def acknowledge(conn: socket.socket, ok: bool) -> None:
    """Tell the server whether the descriptor was used, and close the connection."""
    try:
        if ok:
            conn.sendall(ACK)
    except OSError:
        pass
    finally:
        conn.close()


def serve_stream(stream: "Stream", path: str | os.PathLike, timeout: float = 30.0) -> int:
    """Hand ``stream`` to one other process that calls :func:`receive_stream` on ``path``.

    Call it in the consumer's process after the consumer connected (EGL's order: the producer
    process may connect as soon as it holds the stream). The stream must have been created with
    ``cross_process=True``. Blocks until the receiver has opened the stream, up to ``timeout``
    seconds (:class:`Timeout`); a receiver that dies midway raises :class:`PeerError`. Returns
    the receiver's process id. The socket file exists only during the call."""
    from ._stream import StreamState

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
    description = {"fifo_length": stream.fifo_length, "reuse_last_frame": stream.reuse_last_frame,
                   "pid": os.getpid()}
    return offer_fd(path, stream._fd_box[0], description, timeout)


def receive_stream(display: "Display", path: str | os.PathLike, timeout: float = 30.0) -> "Stream":
    """Open the stream another process serves on ``path`` (:func:`serve_stream`), on
    ``display``. Waits up to ``timeout`` seconds for the server to appear and answer. Connect the
    producer to the returned stream as in one process."""
    from ._stream import Stream

    if display.closed:
        raise ClosedError(f"{display.description} is closed")
    display.require("EGL_KHR_stream", "EGL_KHR_stream_cross_process_fd")
    fd, description, conn = receive_fd(path, timeout)
    opened = False
    try:
        stream = Stream.from_fd(display, fd)
        opened = True
    finally:
        os.close(fd)  # the stream keeps a duplicate open as long as it lives
        acknowledge(conn, opened)
    if not stream.fifo_length and isinstance(description.get("fifo_length"), int):
        stream.fifo_length = description["fifo_length"]
    return stream
