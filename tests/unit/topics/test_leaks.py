"""Topics on the CPU, leaks: join/leave cycles, publishers and subscribers collected without
close(), the GPU backends without CUDA, and descriptor numbers above 1024."""
from __future__ import annotations

import gc
import os
import resource
import threading
import time
import weakref

import pytest

import eglcuda

from .helpers import open_fds, pattern, publisher, put, subscriber


def test_a_thousand_join_leave_cycles_leak_nothing(path, folder):
    with publisher(path) as pub:
        backend = pub._backend


        def cycle(i):
            sub = subscriber(path, qos="every" if i % 2 else "latest")
            put(pub, b"%d" % i)
            with sub.receive(2) as message:
                assert message.payload == b"%d" % i
            if i % 3:
                sub.close()
            else:
                sub._conn.sock.close()  # leaves without a goodbye, like a crash
                sub.close()

        for i in range(20):  # warm-up: whatever is made once per process
            cycle(i)
        put(pub, b"warm")
        gc.collect()
        threads, fds = threading.active_count(), open_fds()
        for i in range(1000):
            cycle(i)
        put(pub, b"end")
        gc.collect()
        assert pub.subscribers == [] and pub.pool_size == 8
        assert threading.active_count() == threads and open_fds() == fds
        assert sorted(os.listdir(folder)) == ["t.topic", "t.topic.lock"]
        links = backend.transports()[0].links
        assert len(links) == 1020 and all(link.closed for link in links)
    assert os.listdir(folder) == []
    assert backend.closed and all(f.freed for f in backend.frames)


def test_subscribers_killed_beside_an_idle_publisher_leave_nothing_behind(path):
    """An idle publisher (no frame call after its first) and forty subscriber processes that join
    and are killed: each one's connection, ring and link go as the next subscriber joins, not at
    the publisher's next call, so that such deaths do not pile up descriptors until joins fail."""
    import signal

    with publisher(path) as pub:
        put(pub, b"first")
        backend = pub._backend

        def join_and_die():
            sub = subscriber(path, qos="every")
            sub.wait_for_publisher(5)
            os.kill(os.getpid(), signal.SIGKILL)

        def killed_child():
            pid = os.fork()
            if pid == 0:
                try:
                    join_and_die()
                finally:
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL

        killed_child()
        time.sleep(0.05)
        fds = open_fds()
        for _ in range(40):
            killed_child()
        time.sleep(0.05)
        assert open_fds() <= fds + 2, (fds, open_fds())  # (the last one's connection, until a join or a call)
        status = pub.status()
        assert status["subscribers_total"] == 0 and status["dropped"] == 41, status
        links = backend.transports()[0].links
        assert len(links) == 41 and all(link.closed for link in links)
        with subscriber(path, qos="every") as alive:  # a live one still joins, and gets frames
            put(pub, b"after")
            with alive.receive(2) as message:
                assert message.payload == b"after"


def test_without_cuda_the_gpu_backends_say_so_and_leave_nothing(folder):
    from eglcuda._bind import loader

    ok, _ = loader.cuda_available()
    if ok:
        pytest.skip("this machine has CUDA")
    path = os.path.join(folder, "t.topic")
    with pytest.raises(eglcuda.Unsupported, match="libcuda"):
        eglcuda.Publisher("t", 64, 32, "NV12", path=path)
    assert os.listdir(folder) == []
    with pytest.raises(eglcuda.Unsupported, match="libcuda"):
        eglcuda.Subscriber("t", path=path, timeout=0.1)


def test_a_publisher_collected_without_close_leaves_nothing(folder):
    path = os.path.join(folder, "t.topic")
    threads, fds = threading.active_count(), open_fds()
    pub = publisher(path)
    put(pub, b"x")
    del pub
    gc.collect()
    deadline = time.monotonic() + 5
    while (threading.active_count() > threads or open_fds() > fds) and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert threading.active_count() == threads and open_fds() <= fds
    assert os.listdir(folder) == []


def test_a_publisher_collected_without_close_ends_every_subscription_at_once(path):
    """Every subscriber hears its end as the publisher is collected, the last one to join too:
    the handshake service kept that one's connection open until its next wake-up (up to a
    second), so a receive there timed out where the others said the publisher was gone."""
    pub = publisher(path)
    subs = [subscriber(path, qos="every") for _ in range(3)]
    try:
        key = os.urandom(8)
        put(pub, key)
        for sub in subs:
            with sub.receive(5) as message:
                assert message.frame.data == pattern(key)
        collected = weakref.ref(pub)
        del pub
        gc.collect()
        assert collected() is None
        for sub in subs:
            with pytest.raises(eglcuda.StreamDisconnected, match="without a goodbye"):
                sub.receive(0)
    finally:
        for sub in subs:
            sub.close()


def test_a_subscriber_collected_without_close_leaves_no_wake_up_descriptor(path):
    """The eventfd that wakes a waiting receive is closed when the subscriber is collected
    unclosed, not only by close()."""
    def eventfds() -> int:
        count = 0
        for name in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventfd]"
            except OSError:  # (the listing's own descriptor)
                pass
        return count

    with publisher(path):
        before = eventfds()
        for _ in range(5):
            sub = subscriber(path)
            assert eventfds() == before + 1
            sub._disconnect()  # its socket goes; the subscriber itself is left unclosed
            del sub
            gc.collect()
        assert eventfds() == before
        sub = subscriber(path)
        sub.close()
        assert eventfds() == before


def test_a_closed_subscriber_keeps_nothing_of_the_call_its_publisher_ended(path):
    """The error that ended a subscription (its publisher closed) is raised with the frames of the
    caller's chain: once the subscriber is closed, it keeps none of them (a caller's buffer, a
    GPU tensor, goes with its function, the subscriber still referenced)."""
    class Buffer:  # (stands for what the caller held: a tensor, a large host buffer)
        pass

    def step(sub, kept: list) -> None:
        work = Buffer()
        kept.append(weakref.ref(work))
        with sub.receive(2):
            pass

    for qos in ("every", "latest"):
        pub = publisher(path)
        sub = subscriber(path, qos=qos)
        pub.close()
        kept: list = []
        raised = None
        try:
            step(sub, kept)
        except eglcuda.Dropped:  # (the caller's except clause lets go of it at its end)
            raised = "Dropped"
        assert raised == "Dropped", qos
        sub.close()
        gc.collect()  # (the error and the frames it passed through refer to each other)
        assert kept[0]() is None, qos
        with pytest.raises(eglcuda.ClosedError):  # (closed is what it says from now on)
            sub.receive(0)


def test_a_subscriber_works_with_descriptor_numbers_above_1024(path):
    """A program with many files open (a recorder, a server) gets descriptor numbers above
    1024, where select() cannot go: subscribing, receiving and closing still work."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1300
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the descriptor limit is {hard}, below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    filler: list[int] = []
    try:
        with publisher(path) as pub:
            while not filler or filler[-1] < 1100:
                filler.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            sub = subscriber(path, qos="every", queue=2)
            assert sub._wake_fd > 1024 and sub._conn.sock.fileno() > 1024
            put(pub, b"high", timeout=5)
            with sub.receive(5) as message:
                assert message.frame.data == pattern(b"high")
            sub.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
