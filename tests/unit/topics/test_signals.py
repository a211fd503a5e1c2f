"""Topics on the CPU, close() from a signal handler (SIGALRM standing in for SIGINT/SIGTERM): a
close on the thread inside a receive, release, publish, next_frame or close is put off until
that call is done, and the topic still closes with its goodbyes."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

import eglcuda

from .helpers import NullPublisherBackend, assert_everyone_left, pattern, publisher, put, subscriber


@contextlib.contextmanager
def _on_alarm(handler, after: float):
    """``handler`` runs on SIGALRM ``after`` seconds into the block (main thread only)."""
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, after)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_close_from_a_signal_handler_during_a_release_waits_for_the_release(path):
    """A signal handler calling close() on the thread that is inside a release: the release
    finishes through the open transport, then the subscriber closes (the publisher hears a
    goodbye, not a dropped connection)."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        transport = sub._backend.transports[-1]
        put(pub, b"0", timeout=5)
        message = sub.receive(5)
        transport.release_delay = 0.3
        with _on_alarm(lambda *_: sub.close(), 0.05):
            message.release()  # the handler runs in its sleep
        assert sub.closed and message.released
        assert transport.releases == [message.seq]
        assert_everyone_left(pub)


class _Shutdown(Exception):
    pass


def _closing_then_raising(sub):
    """A SIGTERM handler's usual shape: close the subscriber, then raise to leave the main loop."""
    def handler(*_):
        sub.close()
        raise _Shutdown
    return handler


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_signal_handler_that_closes_then_raises_during_a_release_still_closes(path):
    """The usual SIGTERM handler: close(), then raise to leave the main loop. Raised inside a
    release, the close still happens as the release unwinds: goodbye said, nothing held."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"0", timeout=5)
        put(pub, b"1", timeout=5)
        first, second = sub.receive(5), sub.receive(5)
        sub._backend.transports[-1].release_delay = 0.3
        with _on_alarm(_closing_then_raising(sub), 0.05):
            with pytest.raises(_Shutdown):
                first.release()
        assert sub.closed and first.released and second.released
        assert_everyone_left(pub)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_release_on_another_thread_does_not_wait_for_a_close_deferred_by_a_signal_handler(path):
    """A handler closes the subscriber while this thread is in receive(), then waits for a worker
    that releases a message (an executor's shutdown): the worker's release returns at once."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"0", timeout=5)
        held = sub.receive(5)
        go = threading.Event()
        worker = threading.Thread(target=lambda: (go.wait(5), held.release()), daemon=True)
        worker.start()
        blocked: list[bool] = []

        def handler(*_):
            sub.close()  # put off: this thread is inside receive()
            go.set()
            worker.join(2)
            blocked.append(worker.is_alive())

        with _on_alarm(handler, 0.05):
            with pytest.raises(eglcuda.ClosedError):
                sub.receive(30)
        worker.join(5)
        assert blocked == [False] and held.released and sub.closed
        assert_everyone_left(pub)


def test_a_receive_that_fails_after_a_close_it_put_off_says_closed(path):
    """close() on the thread inside receive() (what a signal handler does), after which the
    receive fails another way (its frame does not come): the caller hears ClosedError, what
    happened first, and the subscriber is closed."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"0", timeout=5)
        transport = sub._backend.transports[-1]

        def take(frame, deadline, stop=None):
            sub.close()  # put off: this thread holds the subscriber's locks
            assert not sub.closed
            raise eglcuda.Timeout("the announced frame did not arrive")

        transport.take = take
        with pytest.raises(eglcuda.ClosedError):
            sub.receive(5)
        assert sub.closed and transport.closed
        assert_everyone_left(pub)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_handler_that_raises_during_close_s_own_releases_still_says_goodbye(path):
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"0", timeout=5)
        held = sub.receive(5)
        sub._backend.transports[-1].release_delay = 0.3
        with _on_alarm(_closing_then_raising(sub), 0.05):
            with pytest.raises(_Shutdown):
                sub.close()  # interrupted in the release of the held message
        assert sub.closed and held.released
        assert_everyone_left(pub)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_close_from_a_signal_handler_ends_a_waiting_receive_and_closes(path):
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        started = time.monotonic()
        with _on_alarm(lambda *_: sub.close(), 0.1):
            with pytest.raises(eglcuda.ClosedError):
                sub.receive(30)
        assert time.monotonic() - started < 2
        assert sub.closed and sub._backend.transports[-1].closed
        assert_everyone_left(pub)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_publisher_close_from_a_signal_handler_during_a_publish_waits_for_the_publish(path):
    """A SIGINT/SIGTERM handler calling Publisher.close() while this thread is inside publish():
    the publish finishes on the open publisher (the subscriber gets the frame, intact), then
    the topic closes (the subscriber hears it closed, the socket file is gone)."""
    backend = NullPublisherBackend()
    pub = publisher(path, _backend=backend)
    sub = subscriber(path, qos="every", queue=2)
    frame = pub.next_frame(5)
    frame.data[:] = pattern(b"last")
    backend.transports()[0].publish_delay = 0.3
    with _on_alarm(lambda *_: pub.close(), 0.05):
        seq = pub.publish(frame, payload=b"last")
    assert pub.closed and not os.path.exists(path)
    with sub.receive(5) as message:
        assert message.seq == seq and message.frame.data == pattern(b"last")
    with pytest.raises(eglcuda.Dropped, match="closed the topic"):
        sub.receive(5)
    sub.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_publisher_close_from_a_signal_handler_ends_a_waiting_next_frame_and_closes(path):
    """next_frame() waits for a pool frame (all held by an 'every' subscriber); a handler's
    close() ends it with ClosedError at once and the topic is closed when it returns."""
    pub = publisher(path, pool=2, max_pool=2, every_timeout=60)
    sub = subscriber(path, qos="every", queue=2)
    put(pub, b"0", timeout=5)
    put(pub, b"1", timeout=5)
    started = time.monotonic()
    with _on_alarm(lambda *_: pub.close(), 0.1):
        with pytest.raises(eglcuda.ClosedError):
            pub.next_frame(30)
    assert time.monotonic() - started < 2
    assert pub.closed and not os.path.exists(path) and pub.subscribers == []
    sub.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_publisher_close_from_a_signal_handler_before_next_frame_takes_a_slot(path):
    """The handler's close() comes while next_frame() is inside its lock with a free slot
    waiting: next_frame() raises ClosedError, never hands out a frame the close then frees."""
    backend = NullPublisherBackend()
    pub = publisher(path, _backend=backend)
    checked = backend.stream_handle

    def slow_check(cuda_stream):
        time.sleep(0.3)  # (the handler runs here, inside next_frame)
        return checked(cuda_stream)

    backend.stream_handle = slow_check
    with _on_alarm(lambda *_: pub.close(), 0.05):
        with pytest.raises(eglcuda.ClosedError):
            pub.next_frame(5)
    assert pub.closed and not os.path.exists(path)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_close_on_another_thread_returns_once_a_put_off_close_is_done(path):
    """While a close put off by a handler waits for the interrupted publish(), a close() from
    another thread returns once the topic is closed (its socket gone), as a close() does."""
    backend = NullPublisherBackend()
    pub = publisher(path, _backend=backend)
    sub = subscriber(path, qos="every", queue=2)
    frame = pub.next_frame(5)
    backend.transports()[0].publish_delay = 0.5
    socket_there_after_close: list[bool] = []

    def close_elsewhere():
        pub.close()
        socket_there_after_close.append(os.path.exists(path))

    other = threading.Timer(0.05, close_elsewhere)

    def handler(*_):
        pub.close()
        other.start()

    with _on_alarm(handler, 0.05):
        pub.publish(frame)
    other.join(5)
    assert socket_there_after_close == [False]
    sub.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_handler_s_close_during_this_thread_s_own_close_does_not_wait_for_it(path):
    """This thread's close() waits for a publish() in a worker; a handler's close() on this
    thread meanwhile returns at once (it cannot wait for its own thread), and the close ends."""
    backend = NullPublisherBackend()
    pub = publisher(path, _backend=backend)
    sub = subscriber(path, qos="every", queue=2)
    frame = pub.next_frame(5)
    backend.transports()[0].publish_delay = 0.5
    worker = threading.Thread(target=lambda: pub.publish(frame))
    worker.start()
    time.sleep(0.1)  # the worker is inside publish(), holding the publisher's lock
    handler_took: list[float] = []

    def handler(*_):
        started = time.monotonic()
        pub.close()
        handler_took.append(time.monotonic() - started)

    with _on_alarm(handler, 0.1):
        pub.close()
    worker.join(5)
    assert handler_took and handler_took[0] < 0.5
    assert pub.closed and not os.path.exists(path)
    sub.close()
