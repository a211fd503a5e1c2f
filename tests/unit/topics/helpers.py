"""What the topic tests of this package share: the publisher and subscriber on the "null"
transport (tests/topics_null.py, put on sys.path here), the spawned peer (tests/topics_peer.py),
raw sockets for hostile peers, and running a body in a forked child."""
from __future__ import annotations

import os
import pathlib
import socket
import sys
import time

import eglcuda
from eglcuda.topics import protocol

HERE = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from topics_null import NullPublisherBackend, NullSubscriberBackend, pattern  # noqa: E402
from ...json_peer import JsonPeer  # noqa: E402

PEER = HERE / "topics_peer.py"
ENV = dict(os.environ)  # tests/conftest.py has made children import this eglcuda


def publisher(path, name="t", **options):
    options.setdefault("_backend", NullPublisherBackend())
    return eglcuda.Publisher(name, 64, 32, "Y", path=path, **options)


def subscriber(path, name="t", **options):
    options.setdefault("_backend", NullSubscriberBackend())
    options.setdefault("timeout", 5)
    return eglcuda.Subscriber(name, path=path, **options)


def put(pub, key: bytes, timeout=None) -> int:
    frame = pub.next_frame(timeout)
    frame.data[:] = pattern(key)
    return pub.publish(frame, payload=key)


def assert_everyone_left(pub) -> None:
    """Every subscriber is gone within 5 s, each with a goodbye (none dropped). The publisher
    reads its sockets as it works: it is kept working meanwhile."""
    deadline = time.monotonic() + 5
    while pub.subscribers and time.monotonic() < deadline:
        pub.discard(pub.next_frame(1))
        time.sleep(0.01)
    assert pub.subscribers == [] and pub.dropped == []


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def waiting_fds() -> int:
    """How many ``epoll`` sets and ``eventfd``s this process holds: what a wait set and a
    subscriber's readiness open, and what the in-process publisher's connections, coming and
    going on its own threads, never do."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # (closed since listed)
            continue
        count += target in ("anon_inode:[eventpoll]", "anon_inode:[eventfd]")
    return count


class Peer(JsonPeer):
    """A spawned tests/topics_peer.py."""

    wait_timeout = 20.0

    def __init__(self, *args: str) -> None:
        super().__init__([str(PEER), *args], env=ENV)


def raw(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def answer(sock) -> protocol.Message | None:
    data = sock.recv(70000)
    return protocol.decode(data) if data else None


def hello(topic="t", wishes=("null",)) -> bytes:
    return protocol.encode(protocol.Hello(os.getpid(), protocol.Qos.EVERY, 2, protocol.ConsumerKind.CUDA, 0,
                                          bytes(16), False, tuple(wishes), topic))


def _in_child(body) -> int:
    """Run ``body`` in a forked child; its exit status (0: body returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if body() else 3
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
