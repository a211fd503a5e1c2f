"""The UNIX-socket hand-over of descriptors (eglcuda.streams.share), with real sockets, real
descriptors and a real second process. No EGL needed: any descriptor travels the same way.

Also the security properties of docs/security.md: peer uid checks on both sides (with a child
running as another uid, which needs root: CI runs as root, elsewhere those tests skip), socket
file mode, directory checks, hostile clients and servers, the description's schema, and the
wire format by property (Hypothesis)."""
from __future__ import annotations

import fcntl
import json
import math
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eglcuda
from eglcuda.streams import share as _share


@pytest.fixture
def sock_path():
    with tempfile.TemporaryDirectory(prefix="eglcuda-") as folder:
        yield os.path.join(folder, "stream.sock")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def serve_in_thread(path, fd, description, timeout=10.0):
    """offer_fd on a thread; the result (pid or exception) lands in the returned dict."""
    outcome: dict = {}

    def serve():
        try:
            outcome["pid"] = eglcuda.offer_fd(path, fd, description, timeout)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            outcome["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, outcome


CHILD = r"""
import os, sys
import eglcuda
fd, description, conn = eglcuda.receive_fd(sys.argv[1], timeout=20)
eglcuda.acknowledge(conn, True)
os.write(fd, bytes.fromhex(description["extra"]["payload"]))
os.close(fd)
"""


def test_descriptor_reaches_a_spawned_process(sock_path):
    """A pipe's write end goes to a fresh interpreter, which writes random bytes into it; the
    bytes come out of our read end, and the server learns the receiver's pid."""
    payload = np.random.default_rng().integers(0, 256, 4096, dtype=np.uint8).tobytes()
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, sock_path])
        pid = eglcuda.offer_fd(sock_path, write_end, {"extra": {"payload": payload.hex()}}, timeout=20)
        os.close(write_end)
        write_end = -1
        received = b""
        while chunk := os.read(read_end, 65536):
            received += chunk
        assert child.wait(20) == 0
        assert received == payload
        assert pid == child.pid
        assert not os.path.exists(sock_path)  # the server removes its socket file
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_stale_socket_file_is_replaced(sock_path):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock_path)  # a server that died without removing its file
    dead.close()
    assert os.path.exists(sock_path)
    read_end, write_end = os.pipe()
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {"extra": {"n": 1}})
        fd, description, conn = eglcuda.receive_fd(sock_path, timeout=10)
        eglcuda.acknowledge(conn, True)
        thread.join(10)
        assert "error" not in outcome and outcome["pid"] == os.getpid()
        assert description == {"extra": {"n": 1}}
        os.write(fd, b"through the replaced socket")
        os.close(fd)
        assert os.read(read_end, 100) == b"through the replaced socket"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_path_in_use_by_a_live_server(sock_path):
    read_end, write_end = os.pipe()
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {}, timeout=10)
        wait_for_socket(sock_path)
        with pytest.raises(eglcuda.UsageError, match="in use"):
            eglcuda.offer_fd(sock_path, write_end, {}, timeout=1)
        fd, _, conn = eglcuda.receive_fd(sock_path, timeout=5)  # the first server still works
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert "error" not in outcome
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_file_that_is_not_a_socket_is_left_alone(sock_path):
    with open(sock_path, "w") as f:
        f.write("user data")
    with pytest.raises(eglcuda.UsageError, match="not a socket"):
        eglcuda.offer_fd(sock_path, 0, {}, timeout=1)
    with open(sock_path) as f:
        assert f.read() == "user data"


def test_server_turns_away_strangers_and_times_out(sock_path):
    read_end, write_end = os.pipe()
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {}, timeout=1.5)
        wait_for_socket(sock_path)
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stranger.connect(sock_path)
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
        stranger.settimeout(5)
        assert stranger.recv(100) == b""  # nothing offered to a stranger: closed on it
        stranger.close()
        thread.join(10)
        assert isinstance(outcome.get("error"), eglcuda.Timeout)
        assert "turned away" in str(outcome["error"])
        assert not os.path.exists(sock_path)
    finally:
        os.close(read_end)
        os.close(write_end)


def fake_server(path, behaviour):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        conn.recv(100)
        behaviour(conn)
        conn.close()
        listener.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("behaviour, match", [
    (lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"), "not an eglcuda stream server"),
    (lambda conn: None, "closed the connection"),
    (lambda conn: conn.sendall(_share.OFFER + b'{"fifo_length": 4}\n'), "0 descriptors"),
    (lambda conn: socket.send_fds(conn, [_share.OFFER + b"{not json\n"], [0]), "malformed"),
])
def test_receiver_refuses_a_wrong_server(sock_path, behaviour, match):
    before = open_fds()
    thread = fake_server(sock_path, behaviour)
    with pytest.raises(eglcuda.PeerError, match=match):
        eglcuda.receive_fd(sock_path, timeout=5)
    thread.join(5)
    assert open_fds() == before  # a descriptor that came with a bad message is closed too


def test_server_reports_a_receiver_that_dies(sock_path):
    read_end, write_end = os.pipe()
    code = "import eglcuda, os, sys; eglcuda.receive_fd(sys.argv[1], timeout=20); os._exit(3)"
    try:
        child = subprocess.Popen([sys.executable, "-c", code, sock_path])
        with pytest.raises(eglcuda.PeerError, match="closed without opening"):
            eglcuda.offer_fd(sock_path, write_end, {}, timeout=20)
        assert child.wait(20) == 3
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_peer_that_half_closes_then_reads_the_offer_ends_the_serving(sock_path):
    """It greets, waits for the offer, shuts down its writing (the server's read ends) and then
    reads the offer, descriptor and all: it holds the stream, so the server must not offer it to
    anyone else (it raises PeerError, as for a receiver that read the offer and closed)."""
    read_end, write_end = os.pipe()
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {})
        wait_for_socket(sock_path)
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(sock_path)
        peer.sendall(_share.HELLO)
        select.select([peer], [], [], 5)
        peer.shutdown(socket.SHUT_WR)
        time.sleep(0.1)
        _, fds, _, _ = socket.recv_fds(peer, 65536, 4)
        assert len(fds) == 1  # it has the descriptor
        for fd in fds:
            os.close(fd)
        peer.close()
        thread.join(10)
        assert isinstance(outcome.get("error"), eglcuda.PeerError), outcome
    finally:
        os.close(read_end)
        os.close(write_end)


def test_receiver_times_out_without_a_server(sock_path):
    started = time.monotonic()
    with pytest.raises(eglcuda.Timeout, match="no eglcuda stream server"):
        eglcuda.receive_fd(sock_path, timeout=0.3)
    assert time.monotonic() - started < 2


def test_bad_arguments_are_refused_before_any_socket(sock_path):
    read_end, write_end = os.pipe()
    os.close(write_end)
    with pytest.raises(eglcuda.UsageError, match="not open"):
        eglcuda.offer_fd(sock_path, write_end, {}, timeout=1)
    os.close(read_end)
    with pytest.raises(eglcuda.UsageError, match="positive"):
        eglcuda.offer_fd(sock_path, 0, {}, timeout=0)
    with pytest.raises(eglcuda.UsageError, match="at most 107"):
        eglcuda.receive_fd("/tmp/" + "x" * 200, timeout=1)
    assert not os.path.exists(sock_path)


def test_two_hundred_hand_overs_leak_nothing(sock_path):
    read_end, write_end = os.pipe()
    try:
        before = open_fds()
        for i in range(200):
            thread, outcome = serve_in_thread(sock_path, write_end, {"pid": i + 1})
            fd, description, conn = eglcuda.receive_fd(sock_path, timeout=10)
            eglcuda.acknowledge(conn, True)
            thread.join(10)
            assert "error" not in outcome and description == {"pid": i + 1}
            os.write(fd, i.to_bytes(2, "little"))
            os.close(fd)
            assert int.from_bytes(os.read(read_end, 2), "little") == i
        assert open_fds() == before
    finally:
        os.close(read_end)
        os.close(write_end)


# --- security: who may take the stream, and where ----------------------------------------------
#
# The "other uid" tests fork a child that drops to uid/gid 65534 (nobody); that needs root, which
# CI has. The child runs a function of this module (already imported: it needs no file access
# beyond the socket's directory) and reports its result as JSON through a pipe.

NOBODY = 65534


def wait_for_socket(path, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    raise AssertionError(f"no socket appeared at {path}")


class Child:
    """A forked child running as uid/gid 65534; ``result()`` is what its function returned
    ({"value": ...}) or raised ({"error": class name, "message": ...})."""

    def __init__(self, fn, *args, close=()):
        if os.geteuid() != 0:
            pytest.skip("needs root, to run a child as another uid (uid 65534); CI runs the tests as root")
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(read_end)
                for fd in close:  # the parent's ends of pipes the child waits on
                    os.close(fd)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                try:
                    out = {"value": fn(*args)}
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    out = {"error": type(exc).__name__, "message": str(exc)}
                os.write(write_end, json.dumps(out).encode())
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(write_end)
        self.pid, self._read = pid, read_end

    def result(self, timeout=20.0) -> dict:
        data = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    os.kill(self.pid, 9)
                    raise AssertionError("the child did not finish in time")
                chunk = os.read(self._read, 65536)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(self._read)
            _, status = os.waitpid(self.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return json.loads(data)


_MADE: list[str] = []


@pytest.fixture(autouse=True)
def _remove_made_dirs():
    yield
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


def private_dir(mode=0o700, owner=None):
    """A fresh directory under /tmp (sticky, root's) with ``mode`` and, as root, ``owner``;
    removed after the test, whatever happened."""
    folder = tempfile.mkdtemp(prefix="eglcuda-sec-")
    _MADE.append(folder)
    if owner is not None:
        os.chown(folder, owner, owner)
    os.chmod(folder, mode)
    return folder


@pytest.fixture
def shared_dir():
    """A directory a uid-65534 child can reach (0755, root's); removed afterwards."""
    folder = private_dir(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _receive_and_write(path, allowed_uids, data):
    fd, description, conn = eglcuda.receive_fd(path, timeout=10, allowed_uids=allowed_uids)
    eglcuda.acknowledge(conn, True)
    os.write(fd, bytes.fromhex(data))
    os.close(fd)
    return description


def _offer(path, fd, allowed_uids, timeout):
    return eglcuda.offer_fd(path, fd, {"pid": os.getpid()}, timeout=timeout, allowed_uids=allowed_uids,
                            handshake_timeout=0.5)


def test_server_refuses_a_receiver_of_another_uid(shared_dir):
    """The socket file is opened to everyone here (socket_mode 0o666), so only the SO_PEERCRED
    check stands between the uid-65534 receiver and the descriptor: it is refused, the server
    says whom it refused, and the receiver is told."""
    path = os.path.join(shared_dir, "s")
    read_end, write_end = os.pipe()
    try:
        child = Child(_receive_and_write, path, [0], "aa")
        with pytest.raises(eglcuda.Timeout, match=r"uid\(s\) \[65534\] were refused \(allowed uids: \[0\]\)"):
            eglcuda.offer_fd(path, write_end, {}, timeout=2, socket_mode=0o666)
        got = child.result()
        assert got["error"] == "PeerError" and "refused this process (uid 65534" in got["message"]
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 10)  # nothing written: the descriptor never reached it
    finally:
        os.close(read_end)
        os.close(write_end)


def test_server_gives_the_stream_to_a_listed_other_uid(shared_dir):
    path = os.path.join(shared_dir, "s")
    read_end, write_end = os.pipe()
    try:
        child = Child(_receive_and_write, path, [0], "c0ffee")
        pid = eglcuda.offer_fd(path, write_end, {"extra": {"k": 1}}, timeout=10, allowed_uids=[NOBODY],
                               socket_mode=0o666)
        got = child.result()
        assert got == {"value": {"extra": {"k": 1}}}
        assert pid == child.pid
        assert os.read(read_end, 10) == bytes.fromhex("c0ffee")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_default_socket_mode_keeps_other_uids_out(shared_dir):
    """With the default 0600 a listed uid still cannot connect: the mode is a second lock."""
    path = os.path.join(shared_dir, "s")
    read_end, write_end = os.pipe()
    try:
        child = Child(_receive_and_write, path, [0], "aa")
        with pytest.raises(eglcuda.Timeout):
            eglcuda.offer_fd(path, write_end, {}, timeout=1.5, allowed_uids=[NOBODY])
        got = child.result()
        assert got["error"] == "UsageError" and "no permission to connect" in got["message"]
    finally:
        os.close(read_end)
        os.close(write_end)


def test_receiver_refuses_a_server_of_another_uid():
    """A server running as uid 65534 in its own directory: the root receiver refuses the
    directory (another user's) by default; told to trust shared directories it connects, reads
    SO_PEERCRED and refuses before greeting (the server sees a silent connection); with the uid
    listed it takes the stream."""
    folder = private_dir(0o755, owner=NOBODY) if os.geteuid() == 0 else None
    if folder is None:
        pytest.skip("needs root, to run a child as another uid (uid 65534); CI runs the tests as root")
    path = os.path.join(folder, "s")
    read_end, write_end = os.pipe()
    try:
        child = Child(_offer, path, write_end, [0], 10)
        with pytest.raises(eglcuda.UsageError, match=f"directory {folder} belongs to uid 65534"):
            eglcuda.receive_fd(path, timeout=5)
        with pytest.raises(eglcuda.PeerError, match=r"runs as uid 65534 .* not allowed \(allowed uids: \[0\]\): "
                                                    r"nothing was sent"):
            eglcuda.receive_fd(path, timeout=5, allow_shared_dir=True)
        fd, description, conn = eglcuda.receive_fd(path, timeout=5, allowed_uids=[NOBODY])
        eglcuda.acknowledge(conn, True)
        assert description == {"pid": child.pid}
        os.write(fd, b"ok")
        os.close(fd)
        assert child.result() == {"value": os.getpid()}
        assert os.read(read_end, 10) == b"ok"
    finally:
        os.close(read_end)
        os.close(write_end)
        shutil.rmtree(folder, ignore_errors=True)


def test_root_is_not_allowed_by_a_server_of_another_uid():
    """A uid-65534 server with the default policy turns away a root receiver."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a child as another uid (uid 65534); CI runs the tests as root")
    folder = private_dir(0o755, owner=NOBODY)
    path = os.path.join(folder, "s")
    read_end, write_end = os.pipe()
    try:
        child = Child(_offer, path, write_end, None, 2)
        with pytest.raises(eglcuda.PeerError, match="refused this process"):
            eglcuda.receive_fd(path, timeout=5, allowed_uids=[NOBODY])
        got = child.result()
        assert got["error"] == "Timeout" and "uid(s) [0] were refused" in got["message"]
    finally:
        os.close(read_end)
        os.close(write_end)
        shutil.rmtree(folder, ignore_errors=True)


def _squat(path, ready_fd, go_fd):
    """Bind ``path`` first (a local user in a shared directory), then report what reached us."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(8)
    os.write(ready_fd, b"r")
    select.select([go_fd], [], [], 15)  # the parent's word, or give up (never hang the test run)
    listener.setblocking(False)
    got = []
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            break
        conn.settimeout(0.2)
        try:
            got.append(conn.recv(100).decode("latin-1"))
        except OSError:
            got.append("")
        conn.close()
    listener.close()
    return got


def test_a_squatter_in_a_shared_directory_gets_nothing():
    """The attack of the review: in a /tmp-like directory (world-writable, sticky) another user
    binds the path first. The receiver refuses the file (someone else's), and with shared
    directories allowed it refuses the server's uid without greeting it; a real server refuses
    the taken path."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a child as another uid (uid 65534); CI runs the tests as root")
    folder = private_dir(0o1777)
    path = os.path.join(folder, "s")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        child = Child(_squat, path, ready_w, go_r, close=(ready_r, go_w))
        assert os.read(ready_r, 1) == b"r"
        with pytest.raises(eglcuda.PeerError, match="belongs to uid 65534"):
            eglcuda.receive_fd(path, timeout=2)
        with pytest.raises(eglcuda.PeerError, match="runs as uid 65534"):
            eglcuda.receive_fd(path, timeout=2, allow_shared_dir=True)
        with pytest.raises(eglcuda.UsageError, match="in use by a live server"):
            eglcuda.offer_fd(path, 0, {}, timeout=2)
        os.write(go_w, b"g")
        got = child.result()["value"]
        assert got == ["", ""]  # two connections (the receiver's and the server's probe), no greeting
    finally:
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o777])
def test_socket_file_is_0600_whatever_the_umask(umask):
    folder = private_dir()
    path = os.path.join(folder, "s")
    read_end, write_end = os.pipe()
    old = os.umask(umask)
    try:
        thread, outcome = serve_in_thread(path, write_end, {})
        wait_for_socket(path)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert os.lstat(path).st_uid == os.geteuid()
        fd, _, conn = eglcuda.receive_fd(path, timeout=5)
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert "error" not in outcome
        assert os.listdir(folder) == []  # no socket, no private bind directory left behind
    finally:
        os.umask(old)
        os.close(read_end)
        os.close(write_end)
        os.rmdir(folder)


def test_socket_mode_option(sock_path):
    read_end, write_end = os.pipe()
    old = os.umask(0o077)
    try:
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(
            pid=eglcuda.offer_fd(sock_path, write_end, {}, timeout=10, socket_mode=0o660)))
        thread.start()
        wait_for_socket(sock_path)
        assert stat.S_IMODE(os.lstat(sock_path).st_mode) == 0o660
        fd, _, conn = eglcuda.receive_fd(sock_path, timeout=5)
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert outcome["pid"] == os.getpid()
    finally:
        os.umask(old)
        os.close(read_end)
        os.close(write_end)
    for bad in (0o1000, -1, "0600", True):
        with pytest.raises(eglcuda.UsageError, match="socket_mode"):
            eglcuda.offer_fd(sock_path, 0, {}, timeout=1, socket_mode=bad)


@pytest.mark.parametrize("mode, problem", [(0o777, "writable by every user"), (0o770, "writable by group"),
                                           (0o757, "writable by every user")])
def test_shared_parent_directory_is_refused_unless_opted_in(mode, problem):
    folder = private_dir(mode)
    path = os.path.join(folder, "s")
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(eglcuda.UsageError, match=problem + ".*allow_shared_dir=True"):
            eglcuda.offer_fd(path, write_end, {}, timeout=1)
        with pytest.raises(eglcuda.UsageError, match=problem):
            eglcuda.receive_fd(path, timeout=1)
        assert os.listdir(folder) == []
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(
            pid=eglcuda.offer_fd(path, write_end, {}, timeout=10, allow_shared_dir=True)))
        thread.start()
        fd, _, conn = eglcuda.receive_fd(path, timeout=5, allow_shared_dir=np.bool_(True))
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert outcome["pid"] == os.getpid()  # the uid check still ran (and passed: our own)
    finally:
        os.close(read_end)
        os.close(write_end)
        os.rmdir(folder)


def test_a_group_listed_in_allowed_gids_may_share_the_directory():
    folder = private_dir(0o770)
    os.chown(folder, -1, os.getegid())
    path = os.path.join(folder, "s")
    try:
        with pytest.raises(eglcuda.UsageError, match="writable by group"):
            eglcuda.receive_fd(path, timeout=0.2)
        with pytest.raises(eglcuda.Timeout):  # the directory passes; nobody serves
            eglcuda.receive_fd(path, timeout=0.2, allowed_gids=[os.getegid()])
    finally:
        os.rmdir(folder)


def test_sticky_shared_directory_is_accepted_and_a_nested_shared_one_is_not():
    sticky = private_dir(0o1777)  # like /tmp
    try:
        read_end, write_end = os.pipe()
        path = os.path.join(sticky, "s")
        thread, outcome = serve_in_thread(path, write_end, {})
        fd, _, conn = eglcuda.receive_fd(path, timeout=5)
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert "error" not in outcome
        os.close(read_end)
        os.close(write_end)
        # A private directory inside a world-writable, non-sticky one: the outer one could be
        # renamed away and replaced, so it is refused too.
        os.chmod(sticky, 0o777)
        inner = os.path.join(sticky, "inner")
        os.mkdir(inner, 0o700)
        with pytest.raises(eglcuda.UsageError, match=f"directory {sticky} is writable by every user"):
            eglcuda.offer_fd(os.path.join(inner, "s"), 0, {}, timeout=1)
        os.rmdir(inner)
    finally:
        os.rmdir(sticky)


def test_a_directory_of_another_user_is_refused():
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to uid 65534; CI runs the tests as root")
    folder = private_dir(0o700, owner=NOBODY)
    try:
        with pytest.raises(eglcuda.UsageError, match="belongs to uid 65534"):
            eglcuda.offer_fd(os.path.join(folder, "s"), 0, {}, timeout=1)
        with pytest.raises(eglcuda.UsageError, match="belongs to uid 65534"):
            eglcuda.receive_fd(os.path.join(folder, "s"), timeout=1)
        assert os.listdir(folder) == []
    finally:
        os.rmdir(folder)


def test_a_socket_file_of_another_user_is_refused_by_the_receiver(sock_path):
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a socket file to uid 65534; CI runs the tests as root")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(1)
    os.chown(sock_path, NOBODY, NOBODY)
    try:
        with pytest.raises(eglcuda.PeerError, match="belongs to uid 65534"):
            eglcuda.receive_fd(sock_path, timeout=1)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # it did not even connect
    finally:
        listener.close()


def test_bad_policy_arguments(sock_path):
    for kwargs, match in [({"allowed_uids": "0"}, "allowed_uids"), ({"allowed_uids": [-1]}, "allowed_uids"),
                          ({"allowed_gids": [True]}, "allowed_gids"), ({"allowed_uids": 1.5}, "allowed_uids"),
                          ({"allowed_uids": []}, "both empty"), ({"allow_shared_dir": 1}, "allow_shared_dir"),
                          ({"allow_shared_dir": "no"}, "allow_shared_dir")]:
        with pytest.raises(eglcuda.UsageError, match=match):
            eglcuda.offer_fd(sock_path, 0, {}, timeout=1, **kwargs)
        with pytest.raises(eglcuda.UsageError, match=match):
            eglcuda.receive_fd(sock_path, timeout=1, **kwargs)
    for bad in (0, -1, float("nan"), "2"):
        with pytest.raises(eglcuda.UsageError, match="handshake_timeout"):
            eglcuda.offer_fd(sock_path, 0, {}, timeout=1, handshake_timeout=bad)
    assert not os.path.exists(sock_path)


def test_abstract_names_are_refused_on_both_sides():
    name = f"\0eglcuda-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)  # an abstract server is there: the receiver must not even connect
    listener.listen(1)
    try:
        with pytest.raises(eglcuda.UsageError, match="abstract"):
            eglcuda.receive_fd(name, timeout=1)
        with pytest.raises(eglcuda.UsageError, match="abstract"):
            eglcuda.receive_fd(name, timeout=1, allow_shared_dir=True)
        with pytest.raises(eglcuda.UsageError, match="abstract"):
            eglcuda.offer_fd(name, 0, {}, timeout=1)
        with pytest.raises(eglcuda.UsageError, match="abstract"):
            eglcuda.offer_fd("\0other", 0, {}, timeout=1, allow_shared_dir=True)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    with pytest.raises(eglcuda.UsageError, match="NUL"):
        eglcuda.receive_fd("/tmp/a\0b", timeout=1)


# --- hostile or broken clients while the real receiver waits ------------------------------------

def junk_client(path, kind, outcome, stop):
    """A client that is not a receiver (none reads after completing a greeting: one that did would
    be a receiver that took the stream). Records what it was sent: it must never see an offer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(path)
        if kind == "silent":
            pass
        elif kind == "half":
            sock.sendall(_share.HELLO[:7])
        elif kind == "garbage":
            sock.sendall(b"\x00\xff" * 9)
        elif kind == "greet-close":
            sock.sendall(_share.HELLO)
            sock.close()
            outcome.append(b"")
            return
        elif kind == "greet-close-late":  # closes after the offer was sent, without reading it
            sock.sendall(_share.HELLO)
            time.sleep(0.2)
            sock.close()
            outcome.append(b"")
            return
        elif kind == "greet-shutdown":  # half-closes after greeting, then goes (without reading:
            sock.sendall(_share.HELLO)    # a peer that greets and reads the offer is a receiver)
            sock.shutdown(socket.SHUT_WR)
            sock.close()
            outcome.append(b"")
            return
        elif kind == "greet-shutdown-late":  # half-closes once the offer is there, unread, then goes
            sock.sendall(_share.HELLO)
            select.select([sock], [], [], 5)
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.2)
            sock.close()
            outcome.append(b"")
            return
        elif kind == "greet-more":
            sock.sendall(_share.HELLO + b"x")
        elif kind == "slow":
            for byte in _share.HELLO:
                if stop.wait(0.3):
                    break
                sock.sendall(bytes([byte]))
        received = b""
        while True:
            try:
                chunk = sock.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        outcome.append(received)
    except OSError as exc:
        outcome.append(repr(exc).encode())
    finally:
        sock.close()


def serve_with_junk(path, kinds, settle=0.05, handshake_timeout=2.0):
    """Start a server, connect junk clients of ``kinds``, then the real receiver; returns the
    receiver's time from connecting to holding the descriptor, and the junk outcomes."""
    read_end, write_end = os.pipe()
    stop = threading.Event()
    outcome: dict = {}
    junk_out: list = []

    def serve():
        try:
            outcome["pid"] = eglcuda.offer_fd(path, write_end, {"pid": 7}, timeout=15,
                                              handshake_timeout=handshake_timeout)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    server = threading.Thread(target=serve)
    server.start()
    threads = []
    try:
        wait_for_socket(path)
        for kind in kinds:
            thread = threading.Thread(target=junk_client, args=(path, kind, junk_out, stop), daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(settle)
        started = time.monotonic()
        fd, description, conn = eglcuda.receive_fd(path, timeout=10)
        took = time.monotonic() - started
        eglcuda.acknowledge(conn, True)
        server.join(10)
        assert outcome == {"pid": os.getpid()}, outcome
        assert description == {"pid": 7}
        os.write(fd, b"real")
        os.close(fd)
        assert os.read(read_end, 10) == b"real"
        stop.set()
        for thread in threads:
            thread.join(15)
        assert len(junk_out) == len(kinds)
        assert not any(_share.OFFER in got for got in junk_out), junk_out  # no junk saw the stream
        return took, junk_out
    finally:
        stop.set()
        server.join(15)
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("kind", ["silent", "half", "garbage", "slow", "greet-close", "greet-close-late",
                                  "greet-shutdown", "greet-shutdown-late", "greet-more"])
def test_real_receiver_is_served_while_a_bad_client_hangs_on(sock_path, kind):
    # Let the server send the late ones the offer first (greet-shutdown-late then half-closes
    # with it unread: the server's read ends before the close, which it took for a receiver
    # that read the offer and left, and stopped serving).
    settle = 0.5 if kind in ("greet-close-late", "greet-shutdown-late") else 0.05
    took, _ = serve_with_junk(sock_path, [kind], settle=settle)
    assert took < 1.0, f"the real receiver waited {took:.2f} s behind a {kind} client"


def test_fifty_concurrent_junk_clients(sock_path):
    kinds = ["silent", "half", "garbage", "slow", "greet-close", "greet-shutdown", "greet-more",
             "greet-close-late"] * 6 + ["silent", "half"]
    assert len(kinds) == 50
    took, _ = serve_with_junk(sock_path, kinds, settle=0.3)
    assert took < 1.0, f"the real receiver waited {took:.2f} s behind 50 junk clients"


def test_greet_and_close_clients_do_not_abort_the_server(sock_path):
    """Twenty clients greet and close at once, racing the server's offer; the server survives
    every one and the real receiver gets the stream."""
    took, _ = serve_with_junk(sock_path, ["greet-close"] * 20, settle=0.2)
    assert took < 1.0


def test_a_silent_client_is_dropped_after_the_handshake_timeout(sock_path):
    read_end, write_end = os.pipe()
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {}, timeout=5)
        outcome_handshake = {}
        wait_for_socket(sock_path)
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(sock_path)
        silent.settimeout(4)
        started = time.monotonic()
        assert silent.recv(10) == b""  # closed on it
        outcome_handshake["after"] = time.monotonic() - started
        silent.close()
        assert 1.5 < outcome_handshake["after"] < 3.0  # the default handshake_timeout, 2 s
        fd, _, conn = eglcuda.receive_fd(sock_path, timeout=5)
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert "error" not in outcome
    finally:
        os.close(read_end)
        os.close(write_end)


def test_handshake_timeout_option(sock_path):
    read_end, write_end = os.pipe()
    try:
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(
            error=pytest.raises(eglcuda.Timeout, eglcuda.offer_fd, sock_path, write_end, {}, timeout=1.5,
                                handshake_timeout=0.2)))
        thread.start()
        wait_for_socket(sock_path)
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(sock_path)
        silent.settimeout(3)
        started = time.monotonic()
        assert silent.recv(10) == b""
        assert time.monotonic() - started < 0.6
        silent.close()
        thread.join(10)
        assert "turned away" in str(outcome["error"].value)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_full_backlog_is_a_timeout(sock_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(0)  # and never accepts
    queued = []
    before = open_fds()
    try:
        while True:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            try:
                client.connect(sock_path)
            except BlockingIOError:
                client.close()
                break
            queued.append(client)
            assert len(queued) < 100
        before = open_fds()
        started = time.monotonic()
        with pytest.raises(eglcuda.Timeout, match="queue of connections stayed full"):
            eglcuda.receive_fd(sock_path, timeout=0.5)
        assert time.monotonic() - started < 1.5
        assert open_fds() == before
    finally:
        for client in queued:
            client.close()
        listener.close()


# --- what the receiver accepts from a server ----------------------------------------------------

def offering_server(path, line, fds=(0,), prefix=_share.OFFER):
    """A fake server that sends ``prefix + line`` with ``fds`` attached to whoever greets, then
    records what it hears back until the receiver closes (an ACK must never come)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    heard: list = []

    def run():
        try:
            listener.settimeout(10)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                conn.recv(len(_share.HELLO))
                try:
                    if fds:
                        socket.send_fds(conn, [prefix + line], list(fds))
                    else:
                        conn.sendall(prefix + line)
                    conn.shutdown(socket.SHUT_WR)  # all said: the receiver sees the end
                except OSError:
                    pass  # a receiver that refused early (e.g. a line too long) may have closed
                back = b""
                while True:
                    try:
                        chunk = conn.recv(100)
                    except OSError:
                        break
                    if not chunk:
                        break
                    back += chunk
                heard.append(back)
        finally:
            listener.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, heard


def nested(levels):
    return b'{"extra":' + b'{"a":' * (levels - 1) + b"1" + b"}" * (levels - 1) + b"}\n"


MALFORMED = {
    "list": b'[{"fifo_length": 4}]\n',
    "string": b'"fifo_length"\n',
    "deep-10000": b'{"extra":' + b"[" * 10000 + b"]" * 10000 + b"}\n",
    "deep-objects-10000": nested(10000),
    "deep-9": b'{"extra":' + b"[" * 8 + b"]" * 8 + b"}\n",
    "unknown-key": b'{"fifo_length":4,"evil":1}\n',
    "fifo-as-string": b'{"fifo_length":"4"}\n',
    "fifo-as-bool": b'{"fifo_length":true}\n',
    "fifo-too-long": b'{"fifo_length":4097}\n',
    "fifo-negative": b'{"fifo_length":-1}\n',
    "fifo-float": b'{"fifo_length":4.0}\n',
    "reuse-as-int": b'{"reuse_last_frame":1}\n',
    "pid-zero": b'{"pid":0}\n',
    "pid-huge": b'{"pid":99999999999}\n',
    "extra-list": b'{"extra":[1]}\n',
    "extra-huge-int": b'{"extra":{"n":9223372036854775808}}\n',
    "extra-inf": b'{"extra":{"n":1e999}}\n',
    "nan": b'{"extra":{"n":NaN}}\n',
    "duplicate-key": b'{"pid":1,"pid":2}\n',
    "two-lines": b'{"pid":1}\n{"pid":2}\n',
    "not-utf8": b'{"extra":{"s":"\xff"}}\n',
    "oversized": b'{"extra":{"s":"' + b"a" * 70000 + b'"}}\n',
    "oversized-no-newline": b'{"extra":{"s":"' + b"a" * 200000,
    "too-many-items": b'{"extra":{"a":[' + b",".join([b"1"] * 1100) + b"]}}\n",
    "long-key": b'{"extra":{"' + b"k" * 300 + b'":1}}\n',
    "truncated": b'{"pid":1',
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_description_is_refused_before_acknowledging(sock_path, name):
    before = open_fds()
    thread, heard = offering_server(sock_path, MALFORMED[name])
    with pytest.raises(eglcuda.PeerError, match="malformed stream description"):
        eglcuda.receive_fd(sock_path, timeout=5)
    thread.join(10)
    assert heard == [b""]  # the server saw the receiver close, never an ACK
    assert open_fds() == before  # the descriptor that came with it is closed


def test_deep_nesting_error_names_the_limit(sock_path):
    thread, _ = offering_server(sock_path, MALFORMED["deep-10000"])
    with pytest.raises(eglcuda.PeerError, match="nested deeper than 8 levels"):
        eglcuda.receive_fd(sock_path, timeout=5)
    thread.join(10)


def test_receive_stream_checks_the_description_before_opening_the_stream(sock_path, monkeypatch):
    """receive_stream needs the three keys serve_stream sends, and checks the description
    before it opens the stream (Stream.from_fd is never called) and without acknowledging."""
    opened = []
    monkeypatch.setattr(_share.Stream, "from_fd", classmethod(lambda cls, display, fd: opened.append(fd)))

    class FakeDisplay:
        closed = False

        def require(self, *names):
            pass

    for line, match in [(b'[{"fifo_length":4,"reuse_last_frame":true,"pid":1}]\n', "not an object"),
                        (b'{"fifo_length":4}\n', "lacks reuse_last_frame, pid"),
                        (b'{"fifo_length":4,"reuse_last_frame":true,"pid":1,"x":1}\n', "unknown key")]:
        thread, heard = offering_server(sock_path, line)
        with pytest.raises(eglcuda.PeerError, match=match):
            eglcuda.receive_stream(FakeDisplay(), sock_path, timeout=5)
        thread.join(10)
        os.unlink(sock_path)
        assert heard == [b""] and opened == []


def test_serve_stream_and_receive_stream_on_cpu(sock_path, monkeypatch):
    """The stream-level pair with stand-ins for the EGL objects: serve_stream sends the three
    keys, receive_stream opens the stream only after checking them, acknowledges, and takes the
    FIFO length from the description; the keyword options pass through."""
    import types
    from eglcuda.streams.stream import StreamState

    read_end, write_end = os.pipe()
    opened = []

    def from_fd(cls, display, fd):
        opened.append(os.fstat(fd).st_ino)
        return types.SimpleNamespace(fifo_length=0)

    monkeypatch.setattr(_share.Stream, "from_fd", classmethod(from_fd))
    served = types.SimpleNamespace(closed=False, imported=False, _fd_box=[write_end], state=StreamState.CONNECTING,
                                   fifo_length=4, reuse_last_frame=True)
    display = types.SimpleNamespace(closed=False, require=lambda *names: None)
    outcome: dict = {}
    try:
        thread = threading.Thread(target=lambda: outcome.update(pid=eglcuda.serve_stream(
            served, sock_path, timeout=10, allowed_uids=[os.geteuid()], handshake_timeout=1.0, socket_mode=0o600)))
        thread.start()
        stream = eglcuda.receive_stream(display, sock_path, timeout=10, allowed_uids=[os.geteuid()])
        thread.join(10)
        assert outcome == {"pid": os.getpid()}  # the server saw the ACK
        assert opened == [os.fstat(write_end).st_ino]
        assert stream.fifo_length == 4
    finally:
        os.close(read_end)
        os.close(write_end)


def test_server_refuses_a_description_off_the_schema(sock_path):
    for bad, match in [([1], "not an object"), ({"fifo": 4}, "unknown key"), ({"pid": True}, "pid"),
                       ({"extra": {"t": (1, 2)}}, "tuple"), ({"extra": {"s": "x" * 70000}}, "at most 65536"),
                       ({"extra": {1: 2}}, "not a string"), ({"extra": {"f": float("nan")}}, "finite")]:
        with pytest.raises(eglcuda.UsageError, match=match):
            eglcuda.offer_fd(sock_path, 0, bad, timeout=1)
    cyclic: dict = {}
    cyclic["a"] = cyclic
    with pytest.raises(eglcuda.UsageError, match="nested deeper"):
        eglcuda.offer_fd(sock_path, 0, {"extra": cyclic}, timeout=1)
    assert not os.path.exists(sock_path)


def test_received_descriptor_is_close_on_exec(sock_path):
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)  # even a descriptor the server may pass on to children
    try:
        thread, outcome = serve_in_thread(sock_path, write_end, {})
        fd, _, conn = eglcuda.receive_fd(sock_path, timeout=5)
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            assert not os.get_inheritable(fd)
            assert not os.get_inheritable(conn.fileno())
        finally:
            eglcuda.acknowledge(conn, True)
            os.close(fd)
        thread.join(10)
        assert "error" not in outcome
    finally:
        os.close(read_end)
        os.close(write_end)


def test_two_servers_racing_on_one_path(sock_path):
    """200 times: two servers start together on one path, half the time with a stale socket
    file there that both want to replace. Exactly one serves, the other gets UsageError (never a
    raw OSError, never both)."""
    read_end, write_end = os.pipe()
    folder = os.path.dirname(sock_path)
    try:
        for round_ in range(200):
            if round_ % 2:
                dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                dead.bind(sock_path)  # a server that died without removing its file
                dead.close()
            barrier = threading.Barrier(2)
            results: list = [None, None]

            def serve(index):
                barrier.wait()
                try:
                    results[index] = eglcuda.offer_fd(sock_path, write_end, {"pid": index + 1}, timeout=5)
                except BaseException as exc:  # noqa: BLE001
                    results[index] = exc

            threads = [threading.Thread(target=serve, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 5
            while not any(isinstance(r, BaseException) for r in results) and time.monotonic() < deadline:
                time.sleep(0.001)
            losers = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
            assert len(losers) == 1, f"round {round_}: {results}"
            assert type(results[losers[0]]) is eglcuda.UsageError, f"round {round_}: {results[losers[0]]!r}"
            fd, description, conn = eglcuda.receive_fd(sock_path, timeout=5)
            eglcuda.acknowledge(conn, True)
            os.close(fd)
            for thread in threads:
                thread.join(10)
            winner = 1 - losers[0]
            assert results[winner] == os.getpid() and description == {"pid": winner + 1}
            assert os.listdir(folder) == []
    finally:
        os.close(read_end)
        os.close(write_end)


def test_servers_claim_the_path_under_the_directory_lock(sock_path):
    """Claiming the path (stale check, removal, link) happens under an exclusive flock on the
    directory: while someone holds it a server waits (Timeout at its deadline), and it goes on
    as soon as the lock is free."""
    folder = os.open(os.path.dirname(sock_path), os.O_RDONLY | os.O_DIRECTORY)
    read_end, write_end = os.pipe()
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        with pytest.raises(eglcuda.Timeout, match="stayed locked"):
            eglcuda.offer_fd(sock_path, write_end, {}, timeout=0.3)
        assert os.listdir(os.path.dirname(sock_path)) == []
        thread, outcome = serve_in_thread(sock_path, write_end, {}, timeout=5)
        time.sleep(0.3)
        assert not os.path.exists(sock_path)  # still waiting for the lock
        fcntl.flock(folder, fcntl.LOCK_UN)
        fd, _, conn = eglcuda.receive_fd(sock_path, timeout=5)
        eglcuda.acknowledge(conn, True)
        os.close(fd)
        thread.join(10)
        assert "error" not in outcome
    finally:
        os.close(folder)
        os.close(read_end)
        os.close(write_end)


# --- the wire format, by property ---------------------------------------------------------------

SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]  # a loaded CI machine is not a bug
JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**64, max_value=2**64)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)
VALID_EXTRA = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**63 - 1)
                           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                      max_size=4),
                           max_leaves=40)
VALID = st.fixed_dictionaries({}, optional={
    "fifo_length": st.integers(0, 4096), "reuse_last_frame": st.booleans(), "pid": st.integers(1, 2**31 - 1),
    "extra": st.dictionaries(st.text(max_size=10), VALID_EXTRA, max_size=5)})
KEYS = st.sampled_from(["fifo_length", "reuse_last_frame", "pid", "extra"]) | st.text(max_size=12)
ANY_DESCRIPTION = st.dictionaries(KEYS, JSON_VALUES, max_size=5) | JSON_VALUES


def depth(value):
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def count(value):
    if isinstance(value, dict):
        return 1 + sum(count(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(count(v) for v in value)
    return 1


def extra_ok(value):
    if isinstance(value, dict):
        return all(len(k) <= 256 and extra_ok(v) for k, v in value.items())
    if isinstance(value, list):
        return all(extra_ok(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -2**63 <= value < 2**63
    return True


def valid(description):
    """The schema, written again independently of the implementation."""
    if not isinstance(description, dict):
        return False
    for key, value in description.items():
        if key == "fifo_length":
            ok = type(value) is int and 0 <= value <= 4096
        elif key == "reuse_last_frame":
            ok = type(value) is bool
        elif key == "pid":
            ok = type(value) is int and 1 <= value <= 2**31 - 1
        elif key == "extra":
            ok = isinstance(value, dict) and extra_ok(value) and depth(value) <= 7 and count(value) <= 1024
        else:
            ok = False
        if not ok:
            return False
    return len(json.dumps(description, separators=(",", ":"))) + 1 <= 64 * 1024


@settings(max_examples=400, deadline=None, suppress_health_check=SLOW_OK)
@given(VALID)
def test_valid_descriptions_round_trip_exactly(description):
    assert valid(description)
    line = _share._encode_description(description)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    assert _share._decode_description(line) == description


@settings(max_examples=600, deadline=None, suppress_health_check=SLOW_OK)
@given(ANY_DESCRIPTION)
def test_any_description_is_either_kept_exactly_or_refused(description):
    try:
        line = json.dumps(description).encode() + b"\n"  # NaN and Infinity included: JSON's extension
    except ValueError:
        return
    if valid(description):
        assert _share._decode_description(line) == description
        assert _share._encode_description(description)  # and the server side agrees
    else:
        with pytest.raises(eglcuda.PeerError):
            _share._decode_description(line)
        with pytest.raises(eglcuda.UsageError):
            _share._encode_description(description)


@settings(max_examples=600, deadline=None, suppress_health_check=SLOW_OK)
@given(st.binary(max_size=300) | st.builds(lambda b: b + b"\n", st.binary(max_size=300)))
def test_random_bytes_are_refused_or_valid(data):
    try:
        description = _share._decode_description(data)
    except eglcuda.PeerError:
        return
    assert valid(description)


@pytest.fixture(scope="module")
def server_dir():
    with tempfile.TemporaryDirectory(prefix="eglcuda-hyp-") as folder:
        yield folder


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.binary(max_size=600) | ANY_DESCRIPTION.map(lambda d: json.dumps(d).encode()),
       prefix=st.sampled_from([b"", _share.OFFER, _share.OFFER, _share.REFUSED]),
       fds=st.sampled_from([0, 1, 1, 2, 5]), newline=st.booleans())
def test_a_fake_server_sending_random_bytes_gives_only_peer_errors(server_dir, data, prefix, fds, newline):
    """Random bytes, or any JSON (lists, unknown keys, wrong types...) after an offer, with 0..5
    descriptors: the receiver raises PeerError or Timeout, or returns a description that follows
    the schema; no descriptor leaks either way."""
    path = os.path.join(server_dir, "s")
    if os.path.exists(path):
        os.unlink(path)
    before = open_fds()
    payload = data + (b"\n" if newline else b"")
    if not prefix and not payload:
        payload = b"\n"
    thread, heard = offering_server(path, payload, fds=(0,) * fds, prefix=prefix)
    try:
        fd, description, conn = eglcuda.receive_fd(path, timeout=2)
    except (eglcuda.PeerError, eglcuda.Timeout):
        pass
    else:  # only an offer with one descriptor and a valid line gets here
        assert prefix == _share.OFFER and fds == 1 and valid(description)
        os.close(fd)
        conn.close()
    thread.join(10)
    assert open_fds() == before
