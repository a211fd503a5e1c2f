"""Topics on the CPU, fork() and exit: a forked child's copies of a subscriber or publisher
refuse to work and leave the parent's topic alone, and a subscriber open at exit says goodbye."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import eglcuda

from eglcuda.topics import protocol

from .helpers import ENV, HERE, _in_child, answer, pattern, publisher, put, raw, subscriber, waiting_fds


def test_a_forked_child_closes_a_subscriber_whose_locks_another_thread_held(path):
    """Another thread of the parent held the subscriber's locks at the fork: the child's copy
    of the subscriber still closes (it gets new locks), and the parent's goes on unharmed."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        holding, done = threading.Event(), threading.Event()

        def hold():
            with sub._busy, sub._state, sub._wake_lock:
                holding.set()
                done.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        holding.wait(5)

        def child() -> bool:
            signal.alarm(5)  # (a hang ends the child: the test then fails)
            sub.close()
            return sub.closed

        try:
            assert _in_child(child) == 0
        finally:
            done.set()
            holder.join(5)
        put(pub, b"after", timeout=5)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after")
        sub.close()


def _all_refused_as_forked(*calls) -> bool:
    """Whether each call raised UsageError saying the object belongs to the parent (forked)."""
    for call in calls:
        try:
            call()
            return False
        except eglcuda.UsageError as exc:
            if "forked" not in str(exc):
                return False
    return True


def test_a_forked_child_cannot_receive_on_its_parent_s_subscriber(path):
    """A child made by fork() gets a clear error from receive() and wait_for_publisher() (the
    connection is the parent's); the parent's subscription goes on unharmed."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)

        assert _in_child(lambda: _all_refused_as_forked(lambda: sub.receive(1), lambda: sub.wait_for_publisher(1))) == 0
        put(pub, b"after the child", timeout=5)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after the child")
        sub.close()


def test_a_forked_child_cannot_publish_on_its_parent_s_topic(path):
    """In a child made by fork(), the publisher's frame calls and its subscriber list refuse
    with a clear error (they would write and read the parent's subscriber connections: the
    parent's subscriber was dropped for a release of a frame it never got); the child's exit
    leaves the topic alone, and the parent goes on publishing to the same subscriber."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"before", timeout=5)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"before")
        held = pub.next_frame(5)

        def child() -> bool:
            refused = _all_refused_as_forked(
                lambda: pub.next_frame(1), lambda: pub.publish(held), lambda: pub.discard(held),
                lambda: pub.publish_from(np.zeros(len(held.data), np.uint8)), lambda: pub.subscribers)
            pub.close()
            return refused

        assert _in_child(child) == 0
        pub.discard(held)
        assert [s.pid for s in pub.subscribers] == [os.getpid()]
        put(pub, b"after the child", timeout=5)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after the child")
        assert not pub.dropped
        sub.close()


def test_a_forked_child_s_exit_hook_leaves_the_parent_s_put_off_close_alone(path):
    """A fork while a close is put off (the handler's thread still inside publish()): the
    child's exit hook lets go of its copies only; the parent's topic stays until it closes."""
    from eglcuda.topics import publisher as publisher_module

    pub = publisher(path)
    with pub._lock:  # as in a publish() that a handler's close() interrupted
        pub.close()

        def child() -> bool:
            publisher_module._open._exit()  # what the child's interpreter runs as it exits
            return True

        assert _in_child(child) == 0
        assert os.path.exists(path)  # the parent's socket is still there
    pub._finish_deferred_close()
    assert not os.path.exists(path)


_FORKS_A_WORKER = """
import os, sys, time; sys.path.insert(0, {here!r}); import eglcuda
from topics_null import NullPublisherBackend, NullSubscriberBackend
if {role!r} == "publish":
    held = eglcuda.Publisher("t", 64, 32, "Y", path={path!r}, _backend=NullPublisherBackend())
else:
    held = eglcuda.Subscriber("t", path={path!r}, qos="latest", timeout=5, _backend=NullSubscriberBackend())
worker = os.fork()
if worker == 0:  # a worker (multiprocessing's fork start) that never touches the topic
    time.sleep(60)
    os._exit(0)
print(worker, flush=True)
time.sleep(60)
"""


def _forking(path, role: str) -> tuple[subprocess.Popen, int]:
    """A process holding a publisher or a subscriber of ``path`` that forked a worker: (process, worker pid)."""
    code = _FORKS_A_WORKER.format(here=str(HERE), role=role, path=path)
    process = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def test_a_killed_publisher_whose_forked_worker_lives_is_seen_gone_and_can_start_again(path):
    """The worker's copies of the topic's lock, listening socket and connections used to keep
    the topic alive: its subscriber waited in vain (Timeout, not StreamDisconnected) and a new
    publisher of the name was refused ("already has a live publisher") until the worker ended."""
    process, worker = _forking(path, "publish")
    try:
        sub = subscriber(path, qos="every", queue=2)
        process.kill()
        process.wait(10)
        started = time.monotonic()
        with pytest.raises(eglcuda.StreamDisconnected):
            sub.receive(5)
        assert time.monotonic() - started < 2
        with publisher(path) as pub:
            sub.wait_for_publisher(5)
            put(pub, b"again", timeout=5)
            with sub.receive(5) as message:
                assert message.frame.data == pattern(b"again")
        sub.close()
    finally:
        process.kill()
        os.kill(worker, signal.SIGKILL)
        process.wait(10)


def test_a_killed_subscriber_whose_forked_worker_lives_is_dropped_at_once(path):
    """The worker's copy of the connection used to keep it open: the publisher kept a killed
    'latest' subscriber (and the pool frames it held) for as long as the worker lived."""
    with publisher(path) as pub:
        process, worker = _forking(path, "subscribe")
        try:
            put(pub, b"0", timeout=5)
            process.kill()
            process.wait(10)
            deadline = time.monotonic() + 2
            while pub.subscribers and time.monotonic() < deadline:
                put(pub, b"1", timeout=5)
                time.sleep(0.01)
            assert pub.subscribers == []
            (record,) = pub.dropped
            assert "exited or was killed" in record.reason
        finally:
            process.kill()
            os.kill(worker, signal.SIGKILL)
            process.wait(10)


def test_a_forked_worker_keeps_no_connection_in_its_handshake_open(path):
    """A connection the publisher's service thread was taking through its handshake at the fork
    (no thread runs it in the child) stayed open in the worker: the peer saw no end of its
    connection once the publisher ended it (or was killed) while the worker lived."""
    pub = publisher(path, handshake_timeout=30)
    client = raw(path)  # says nothing: in its handshake
    time.sleep(0.2)  # (the service thread accepts it meanwhile)
    worker = os.fork()
    if worker == 0:
        time.sleep(3)
        os._exit(0)
    try:
        pub.close()
        assert isinstance(answer(client), protocol.Refuse)
        client.settimeout(1)
        assert client.recv(100) == b""  # the end: the worker holds no copy
    finally:
        client.close()
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)


def test_a_forked_child_s_close_leaves_none_of_the_publisher_s_poll_sets_open(path):
    """A publisher with a subscriber: in a forked child, close() lets go of the child's copies of
    every epoll set the publisher made, its service thread's too (no thread runs it there)."""
    before = waiting_fds()
    with publisher(path) as pub, subscriber(path, qos="every") as sub:
        put(pub, b"x")
        sub.receive(5).release()
        assert waiting_fds() > before  # (what the child must let go of)

        def child() -> bool:
            signal.alarm(5)
            sub.close()
            pub.close()
            left = waiting_fds() - before
            if left > 0:
                print("left open in the child:", left, flush=True)
            return left <= 0

        assert _in_child(child) == 0
        put(pub, b"after")  # (the parent's topic goes on)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after")


def test_a_subscriber_open_at_exit_says_goodbye(path):
    """A program that ends without closing its subscriber: the exit hook closes it, and the
    publisher counts it as having left, not as dropped."""
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import eglcuda\n"
            "from topics_null import NullSubscriberBackend\n"
            f"sub = eglcuda.Subscriber('t', path={path!r}, timeout=5, _backend=NullSubscriberBackend())\n"
            "message = sub.receive(5)\n"
            "print('got', message.seq, flush=True)\n")
    with publisher(path) as pub:
        child = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not pub.subscribers and time.monotonic() < deadline:
            time.sleep(0.01)
        put(pub, b"0")
        assert child.communicate(timeout=30)[0].strip() == "got 0"
        assert child.returncode == 0
        while pub.subscribers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.subscribers == [] and pub.dropped == []


def test_daemon_threads_inside_receive_publish_and_rejoin_at_exit_end_without_a_traceback(path):
    """The common shape of a program: a daemon thread that receives in a loop, one that
    publishes, one that waits for a publisher; the main thread ends. The exit hooks close the
    topic's objects under those calls: the threads stop with the interpreter, silently, as Python
    stops daemon threads (not with an exception whose traceback finalization cuts short)."""
    code = (f"import sys, threading, time; sys.path.insert(0, {str(HERE)!r}); import eglcuda\n"
            "from topics_null import NullPublisherBackend, NullSubscriberBackend\n"
            f"pub = eglcuda.Publisher('t', 64, 32, 'Y', path={path!r}, _backend=NullPublisherBackend())\n"
            f"subs = [eglcuda.Subscriber('t', path={path!r}, qos=qos, timeout=5, _backend=NullSubscriberBackend())\n"
            "        for qos in ('every', 'latest')]\n"
            f"other = eglcuda.Subscriber('t', path={path!r}, timeout=5, _backend=NullSubscriberBackend())\n"
            "def receiving(sub):\n"
            "    for message in sub:\n"
            "        time.sleep(0.0005)\n"
            "        message.release()\n"
            "def publishing():\n"
            "    while True:\n"
            "        pub.publish(pub.next_frame())\n"
            "def rejoining():\n"
            "    while True:\n"
            "        try:\n"
            "            other.receive(0.01).release()\n"
            "        except eglcuda.Timeout:\n"
            "            pass\n"
            "        except eglcuda.StreamDisconnected:\n"
            "            other.wait_for_publisher(30)\n"
            "for target, args in [(receiving, (subs[0],)), (receiving, (subs[1],)), (publishing, ()), (rejoining, ())]:\n"
            "    threading.Thread(target=target, args=args, daemon=True).start()\n"
            "time.sleep(0.3)\n"
            "print('ending', flush=True)\n")
    for _ in range(4):
        child = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
        assert (child.returncode, child.stdout.strip(), child.stderr) == (0, "ending", "")


def test_a_daemon_thread_reading_a_message_as_the_exit_closes_its_subscriber_ends_without_a_traceback(path):
    """A daemon thread holds a message and reads its frame just after the exit hooks closed its
    subscriber (a hook of the program's, run after eglcuda's, gives it the time): the read waits
    to be stopped with the interpreter, as a receive() there does, not die with a traceback. (The
    planes' own reads are the CUDA transports': tests/unit/remote/test_lifecycle.py.)"""
    code = (f"import atexit, sys, threading, time; sys.path.insert(0, {str(HERE)!r})\n"
            "atexit.register(time.sleep, 0.5)  # (registered first: runs after eglcuda's hooks)\n"
            "import eglcuda\n"
            "from topics_null import NullPublisherBackend, NullSubscriberBackend\n"
            f"pub = eglcuda.Publisher('t', 64, 32, 'Y', path={path!r}, _backend=NullPublisherBackend())\n"
            f"sub = eglcuda.Subscriber('t', path={path!r}, timeout=5, _backend=NullSubscriberBackend())\n"
            "frame = pub.next_frame(); frame.data[:] = b'x' * len(frame.data); pub.publish(frame)\n"
            "message = sub.receive(5)\n"
            "def reading():\n"
            "    while not sub.closed:\n"
            "        time.sleep(0.001)\n"
            "    message.frame\n"
            "threading.Thread(target=reading, daemon=True).start()\n"
            "print(message.frame.data == b'x' * len(message.frame.data), flush=True)\n")
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
        assert (child.returncode, child.stdout.strip(), child.stderr) == (0, "True", "")


def test_at_exit_only_a_program_s_own_threads_stay_eglcuda_s_end_by_themselves(monkeypatch):
    """A relay's local thread (eglcuda's own, named eglcuda-...) ends on the ClosedError its
    owner's close joins it by, also at exit; a thread of the program's stays until the process
    ends. Before exit, or for another error, neither waits."""
    from eglcuda import _lifecycle

    def ended(name: str, error: BaseException) -> bool:
        thread = threading.Thread(target=_lifecycle.stay_if_ended_by_exit, args=(error,), name=name, daemon=True)
        thread.start()
        thread.join(0.3)
        return not thread.is_alive()

    closed = eglcuda.ClosedError("closed")
    assert ended("reader", closed)  # (not exiting)
    monkeypatch.setattr(_lifecycle, "_exit_thread", threading.get_ident())
    assert ended("eglcuda-relay-t", closed) and ended("eglcuda-relay-t", eglcuda.Dropped("gone", 3))
    assert ended("reader", eglcuda.Timeout("no frame")) and ended("reader", eglcuda.UsageError("bad"))
    assert not ended("reader", closed) and not ended("reader", eglcuda.Dropped("gone", 3))
