"""The UNIX-socket hand-over of descriptors (eglcuda._share), with real sockets, real
descriptors and a real second process. No EGL needed: any descriptor travels the same way."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import _share


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
os.write(fd, bytes.fromhex(description["payload"]))
os.close(fd)
"""


def test_descriptor_reaches_a_spawned_process(sock_path):
    """A pipe's write end goes to a fresh interpreter, which writes random bytes into it; the
    bytes come out of our read end, and the server learns the receiver's pid."""
    payload = np.random.default_rng().integers(0, 256, 4096, dtype=np.uint8).tobytes()
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, sock_path])
        pid = eglcuda.offer_fd(sock_path, write_end, {"payload": payload.hex()}, timeout=20)
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
        thread, outcome = serve_in_thread(sock_path, write_end, {"n": 1})
        fd, description, conn = eglcuda.receive_fd(sock_path, timeout=10)
        eglcuda.acknowledge(conn, True)
        thread.join(10)
        assert "error" not in outcome and outcome["pid"] == os.getpid()
        assert description == {"n": 1}
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
        deadline = time.monotonic() + 5
        while not os.path.exists(sock_path) and time.monotonic() < deadline:
            time.sleep(0.01)
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
        deadline = time.monotonic() + 5
        while not os.path.exists(sock_path) and time.monotonic() < deadline:
            time.sleep(0.01)
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
            thread, outcome = serve_in_thread(sock_path, write_end, {"i": i})
            fd, description, conn = eglcuda.receive_fd(sock_path, timeout=10)
            eglcuda.acknowledge(conn, True)
            thread.join(10)
            assert "error" not in outcome and description == {"i": i}
            os.write(fd, i.to_bytes(2, "little"))
            os.close(fd)
            assert int.from_bytes(os.read(read_end, 2), "little") == i
        assert open_fds() == before
    finally:
        os.close(read_end)
        os.close(write_end)
