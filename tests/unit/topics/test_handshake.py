"""Topics on the CPU, the handshake: junk and hostile peers turned away, refusals that reach the
subscriber with their reason, a pool too small for an EGLStream subscriber, and the
peer's uid checked against the topic's access."""
from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda.topics import protocol
from eglcuda.topics.protocol import Reason

from .helpers import (
    NullPublisherBackend,
    NullSubscriberBackend,
    answer,
    hello,
    _in_child,
    pattern,
    publisher,
    put,
    raw,
    subscriber,
)


def test_junk_peers_are_turned_away_without_disturbing_a_subscriber(path):
    with publisher(path, handshake_timeout=0.3) as pub:
        sub = subscriber(path, qos="every", queue=8)
        put(pub, b"before")

        garbage = raw(path)
        garbage.send(b"GET / HTTP/1.0\r\n\r\n")
        refused = answer(garbage)
        assert isinstance(refused, protocol.Refuse) and refused.code == Reason.PROTOCOL

        wrong_topic = raw(path)
        wrong_topic.send(hello(topic="other"))
        refused = answer(wrong_topic)
        assert isinstance(refused, protocol.Refuse) and "not 'other'" in refused.reason

        no_transport = raw(path)
        no_transport.send(hello(wishes=("cuda-ipc", "teleport")))
        refused = answer(no_transport)
        assert isinstance(refused, protocol.Refuse) and refused.code == Reason.UNSUPPORTED
        assert "teleport: not offered" in refused.reason

        silent = raw(path)  # connects and says nothing
        half = raw(path)
        half.send(hello())  # greets, never attaches
        assert isinstance(answer(half), protocol.Welcome)
        bad_attach = raw(path)
        bad_attach.send(hello())
        answer(bad_attach)
        bad_attach.send(protocol.encode(protocol.Attach(b"not-null")))
        refused = answer(bad_attach)
        assert isinstance(refused, protocol.Refuse) and refused.code == Reason.TRANSPORT

        stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with pytest.raises(OSError):
            stream.connect(path)  # another socket type: the kernel refuses it
        stream.close()

        for i in range(20):  # the subscriber carries on meanwhile
            put(pub, b"%d" % i)
            with sub.receive(1) as message:
                assert message.frame.data == pattern(message.payload)
        for sock in (silent, half):
            refused = answer(sock)  # after handshake_timeout
            assert isinstance(refused, protocol.Refuse) and refused.code == Reason.TIMEOUT
        for sock in (garbage, wrong_topic, no_transport, silent, half, bad_attach):
            sock.close()
        assert [s.qos for s in pub.subscribers] == ["every"] and not pub.dropped
        sub.close()


@contextlib.contextmanager
def refusing_server(path, code=Reason.BUSY, reason="32 connections are already in their handshake"):
    """A stand-in publisher at ``path`` that answers each connection with REFUSE and closes it at
    once, reading nothing. Yields an event set once it has closed the first connection."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(8)
    closed = threading.Event()

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                conn.send(protocol.encode(protocol.Refuse(int(code), reason)))
            except OSError:  # (a subscriber that gave up already: its retry's connection is gone)
                pass
            conn.close()
            closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield closed
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def test_a_fault_in_one_handshake_ends_that_handshake_and_not_the_service(path, caplog):
    """An unexpected exception inside the publisher while it answers one subscriber's greeting
    (a bug met by that peer's message) turns that subscriber away with the fault named; the
    service thread goes on, and the next subscriber joins and receives."""
    backend = NullPublisherBackend()
    transport = backend.transports()[0]
    faults = ["once"]

    def refusal(hello, peer_pid):
        if faults:
            faults.pop()
            raise RuntimeError("a fault in the publisher")
        return None

    transport.refusal = refusal
    with publisher(path, _backend=backend) as pub:
        with pytest.raises(eglcuda.Refused, match="RuntimeError: a fault in the publisher") as refused:
            subscriber(path, timeout=3)
        assert refused.value.code == Reason.UNSPECIFIED
        assert "handshake of pid" in caplog.text
        with subscriber(path, timeout=3) as sub:
            put(pub, b"after")
            with sub.receive(5) as message:
                assert message.frame.data == pattern(b"after")


def test_a_refusal_before_the_greeting_is_written_raises_refused(path, monkeypatch):
    """The publisher turned the subscriber away (REFUSE, then close) before the subscriber wrote
    its HELLO: the write fails (EPIPE); Subscriber() reads the refusal and raises Refused with
    its reason and code, not BrokenPipeError."""
    from eglcuda.topics import sockets

    with refusing_server(path) as closed:
        real = sockets.peer_of

        def greet_late(sock):  # the subscriber writes its HELLO only after the publisher closed
            peer = real(sock)
            assert closed.wait(5)
            return peer

        monkeypatch.setattr(sockets, "peer_of", greet_late)
        started = time.monotonic()
        with pytest.raises(eglcuda.Refused, match="already in their handshake") as raised:
            subscriber(path, timeout=0.5)
        assert raised.value.code == Reason.BUSY
        assert time.monotonic() - started >= 0.4  # (busy: tried again until its timeout)


def test_a_status_query_refused_before_it_is_written_raises_peer_error(path, monkeypatch):
    from eglcuda.topics import registry, sockets

    with refusing_server(path, Reason.ACCESS, "uid 1234 may not subscribe") as closed:
        real = sockets.peer_of

        def ask_late(sock):
            peer = real(sock)
            assert closed.wait(5)
            return peer

        monkeypatch.setattr(sockets, "peer_of", ask_late)
        with pytest.raises(eglcuda.PeerError, match="uid 1234 may not subscribe"):
            registry.query(path, 2)


class _SlowAttach(NullSubscriberBackend):
    """A subscriber backend whose transport takes ``delay`` seconds to make its ATTACH."""

    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def transport(self, name, welcome, qos, queue):
        transport = super().transport(name, welcome, qos, queue)
        attach = transport.attach

        def slow():
            time.sleep(self.delay)
            return attach()

        transport.attach = slow
        return transport


def test_a_handshake_ended_before_the_attach_is_written_raises_refused(path):
    """The publisher ends a handshake that outlasts handshake_timeout (REFUSE, then close) while
    the subscriber makes its ATTACH: writing the ATTACH fails (EPIPE), and Subscriber() raises
    Refused with the publisher's reason."""
    with publisher(path, handshake_timeout=0.3):
        with pytest.raises(eglcuda.Refused, match="did not finish within 0.3 s") as raised:
            subscriber(path, timeout=5, _backend=_SlowAttach(1.0))
        assert raised.value.code == Reason.TIMEOUT


def eglstream_like_backend(max_pool=protocol.MAX_POOL):
    """A null publisher backend offering a transport named "eglstream" whose ends keep one pool
    frame (as an EGLStream keeps its newest), beside the plain "null" one."""
    backend = NullPublisherBackend(max_pool=max_pool, names=("eglstream", "null"))
    backend.transports()[0].keeps_frames = 1
    return backend


def test_an_eglstream_subscriber_is_refused_by_a_publisher_of_one_pool_frame(path):
    """With pool=1, max_pool=1, an eglstream subscriber would get one frame and the publisher
    then wait every_timeout for good ("no pool frame came free ... held by subscriber"): the
    stream keeps its newest frame. The handshake refuses that transport, saying what to set; a
    subscriber that can take another transport gets it; max_pool=2 serves eglstream."""
    from eglcuda.topics.transports.eglstream import EglStreamPublisher

    assert EglStreamPublisher.keeps_frames == 1
    with publisher(path, pool=1, max_pool=1, _backend=eglstream_like_backend()) as pub:
        with pytest.raises(eglcuda.Refused, match=r"max_pool=1.*max_pool >= 2") as raised:
            subscriber(path, transport="eglstream")
        assert raised.value.code == Reason.UNSUPPORTED and "eglstream:" in raised.value.reason
        backend = NullSubscriberBackend()
        backend.wishes = lambda requested: ("eglstream", "null")
        other = subscriber(path, _backend=backend)
        assert other.info.transport == "null"
        other.close()
        del pub
    with publisher(path, pool=1, max_pool=2, _backend=eglstream_like_backend()) as pub:
        sub = subscriber(path, transport="eglstream")
        assert sub.info.transport == "eglstream"
        sub.close()
        del pub


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid in a child needs root (CI runs as root)")


@needs_root
@pytest.mark.parametrize("access, uid, gid, allowed", [
    ("user", 65534, 65534, False), ("group", 65534, 65534, False), ("group", 65534, os.getegid(), True),
    ("all", 65534, 65534, True),
])
def test_peer_uid_is_checked(access, uid, gid, allowed):
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)  # the other user must reach the socket for SO_PEERCRED to matter
        path = os.path.join(folder, "t.topic")
        with publisher(path, access=access) as pub:
            os.chmod(path, 0o666)  # let the kernel pass it; the publisher checks the uid itself

            def child():
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                sock = raw(path)
                sock.send(hello())
                got = answer(sock)
                if allowed:
                    return isinstance(got, protocol.Welcome)
                return isinstance(got, protocol.Refuse) and got.code == Reason.ACCESS and f"uid {uid}" in got.reason

            assert _in_child(child) == 0
            assert pub.refused == (0 if allowed else 1)


@needs_root
def test_subscriber_refuses_a_publisher_of_another_user():
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o777)
        path = os.path.join(folder, "t.topic")
        ready, done = os.pipe(), os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setgid(65534)
                os.setuid(65534)
                pub = publisher(path, access="all")
                os.write(ready[1], b"r")
                os.read(done[0], 1)
                pub.close(timeout=0)
            finally:
                os._exit(0)
        try:
            assert os.read(ready[0], 1) == b"r"
            with pytest.raises(eglcuda.Refused, match="uid 65534"):
                subscriber(path, timeout=2)
            trusting = subscriber(path, timeout=2, trusted_uids=[65534])
            assert trusting.info.publisher_pid == pid
            trusting.close()
        finally:
            os.write(done[1], b"d")
            os.waitpid(pid, 0)
            for fd in (*ready, *done):
                os.close(fd)


def test_trusted_uids_may_be_numpy_integers(path):
    """uids read from an array or a table are NumPy integers: one, or several, are trusted as
    ints are (the publisher of this user is joined), and a set without this user's uid refuses
    it, naming the uids as plain numbers."""
    uid = os.geteuid()
    other = 65534 if uid != 65534 else 65533
    with publisher(path):
        for trusted in (np.int64(uid), np.uint32(uid), np.array([other, uid], dtype=np.uint32)):
            with subscriber(path, trusted_uids=trusted) as sub:
                assert sub.connected
        with pytest.raises(eglcuda.Refused, match=rf"trusted_uids: \[{other}\]"):
            subscriber(path, timeout=2, trusted_uids=np.array([other]))
    for bad in (np.float64(uid), [np.int64(-1)], [np.bool_(True)], np.int64(2**32)):
        with pytest.raises(eglcuda.UsageError, match="trusted_uids"):
            subscriber(path, trusted_uids=bad)


@needs_root
@pytest.mark.parametrize("folder_mode", [0o755, 0o700], ids=["socket-of-its-owner", "folder-of-its-owner"])
def test_a_subscriber_the_kernel_lets_not_connect_is_told_so_naming_the_path(folder_mode):
    """Another user subscribes to a topic of access 'user' (its socket is 0600), or to one in a
    folder it may not enter: the kernel refuses the connection. The Subscriber raises
    eglcuda.UsageError naming the socket and the lack of permission, not a bare PermissionError."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, folder_mode)
        path = os.path.join(folder, "t.topic")
        with publisher(path):

            def child():
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    subscriber(path, timeout=2)
                except eglcuda.UsageError as exc:
                    return path in str(exc) and "permission" in str(exc)
                return False

            assert _in_child(child) == 0


@pytest.mark.parametrize("access, mode", [("user", 0o600), ("group", 0o660), ("all", 0o666)], ids=["user", "group", "all"])
def test_the_socket_s_mode_never_reaches_a_file_put_in_its_place(path, monkeypatch, access, mode):
    """Another user who may write to the socket's folder replaces the new socket with a link to a
    file of ours between the bind and the chmod: the file keeps its mode, and the publisher
    refuses to start there (a chmod by name gave the file the socket's mode, 0666 for "all")."""
    from eglcuda.topics import sockets

    with publisher(path, access=access):
        assert stat.S_IMODE(os.lstat(path).st_mode) == mode  # (the usual case)
    secret = os.path.join(os.path.dirname(path), "secret")
    with open(secret, "w") as f:
        f.write("ours")
    os.chmod(secret, 0o600)

    class Raced(socket.socket):
        def bind(self, where):
            super().bind(where)
            os.unlink(where)
            os.symlink(secret, where)

    monkeypatch.setattr(sockets, "seqpacket", lambda: Raced(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    with pytest.raises(eglcuda.UsageError, match="replaced by another file"):
        publisher(path, access=access)
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert os.path.islink(path)  # (not ours: left alone)
