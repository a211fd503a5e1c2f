"""Topics on the CPU, closing: close() from another thread ends every wait of a subscriber or a
publisher (receive, iteration, handshake, announced frames, pool frames, full queues), releases
racing a close, goodbyes heard, a close interrupted and finished by the next; a receive beside another
thread's keeps its timeout."""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import types

import pytest

import eglcuda
from eglcuda.topics import protocol

from .helpers import Peer, assert_everyone_left, open_fds, pattern, publisher, put, subscriber


def test_close_from_another_thread_ends_a_waiting_receive(path):
    """A worker waits in receive() (no frame comes); the main thread closes the subscriber: the
    receive ends at once with ClosedError, the publisher hears a goodbye, not a drop."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        fds = open_fds()
        outcome: list = []

        def wait():
            started = time.monotonic()
            try:
                sub.receive(30)
                outcome.append("a frame")
            except eglcuda.ClosedError:
                outcome.append(time.monotonic() - started)

        worker = threading.Thread(target=wait)
        worker.start()
        time.sleep(0.2)  # the worker is in its wait by now
        started = time.monotonic()
        sub.close()
        closed_in = time.monotonic() - started
        worker.join(5)
        assert not worker.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], float), outcome
        assert outcome[0] < 5 and closed_in < 2
        with pytest.raises(eglcuda.ClosedError):
            sub.receive(0.1)
        assert_everyone_left(pub)
        assert open_fds() < fds  # the socket and the wake-up descriptor are gone


def test_close_from_another_thread_ends_an_iteration(path):
    """for message in subscriber: ... in a worker ends, without an error, when the main thread
    closes the subscriber, after the frames it got were intact."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=4)
        seen: list = []
        failed: list = []

        def read():
            try:
                for message in sub:
                    assert message.frame.data == pattern(message.payload)
                    seen.append(message.seq)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        worker = threading.Thread(target=read)
        worker.start()
        for i in range(20):
            put(pub, b"%d" % i, timeout=5)
        deadline = time.monotonic() + 10
        while len(seen) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        sub.close()
        worker.join(5)
        assert not worker.is_alive() and failed == []
        assert seen == list(range(20))


def test_close_from_another_thread_ends_a_wait_for_the_publisher(path):
    pub = publisher(path)
    sub = subscriber(path)
    pub.close()
    with pytest.raises(eglcuda.StreamDisconnected):
        sub.receive(2)
    outcome: list = []

    def wait():
        try:
            sub.wait_for_publisher(60)
            outcome.append("connected")
        except eglcuda.ClosedError:
            outcome.append("closed")

    worker = threading.Thread(target=wait)
    worker.start()
    time.sleep(0.2)
    started = time.monotonic()
    sub.close()
    worker.join(5)
    assert outcome == ["closed"] and time.monotonic() - started < 2


def _wait_in_thread(call) -> tuple[threading.Thread, list]:
    """Run ``call`` in a worker; the list gets ("closed", seconds) for a ClosedError, else what
    happened."""
    outcome: list = []

    def run():
        started = time.monotonic()
        try:
            outcome.append(("returned", call()))
        except eglcuda.ClosedError:
            outcome.append(("closed", time.monotonic() - started))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(("raised", exc))

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)  # the worker is in its wait by now
    return worker, outcome


def _close_ends_the_wait(call, close) -> None:
    """``call`` waits in a worker; ``close()`` here ends it with ClosedError within 2 s."""
    worker, outcome = _wait_in_thread(call)
    started = time.monotonic()
    close()
    worker.join(5)
    assert not worker.is_alive()
    assert outcome and outcome[0][0] == "closed", outcome
    assert time.monotonic() - started < 2


def test_close_from_another_thread_ends_a_handshake_waiting_for_an_answer(path):
    """wait_for_publisher() connected to a socket whose owner never answers the greeting: a
    close() from another thread ends it at once, not at its 60 s deadline."""
    pub = publisher(path)
    sub = subscriber(path)
    pub.close()
    with pytest.raises(eglcuda.StreamDisconnected):
        sub.receive(2)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    silent.bind(path)
    silent.listen(4)  # takes the connection into its backlog, never accepts nor answers
    try:
        _close_ends_the_wait(lambda: sub.wait_for_publisher(60), sub.close)
    finally:
        silent.close()


def test_close_from_another_thread_ends_a_wait_for_an_announced_frame(path):
    """A frame was announced but its transport has not delivered it (an EGLStream frame still
    on its way): a receive waiting for it ends at once on close() from another thread, and the
    publisher hears a goodbye."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        sub._backend.transports[-1].stalled = True
        put(pub, b"0", timeout=5)
        _close_ends_the_wait(lambda: sub.receive(60), sub.close)
        assert_everyone_left(pub)


def test_releases_from_another_thread_while_closing_are_each_sent_once(path):
    """One thread releases its messages while another closes the subscriber, in every
    interleaving the scheduler gives: no error in either, every message ends released, the
    transport lets go of each frame at most once and never after it was closed."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # many more interleavings
    try:
        with publisher(path, pool=8, max_pool=8) as pub:
            for round_ in range(40):
                sub = subscriber(path, qos="every", queue=6)
                for i in range(6):
                    put(pub, b"%d-%d" % (round_, i), timeout=5)
                messages = [sub.receive(5) for _ in range(6)]
                sub._backend.transports[-1].release_delay = 0.001 * (round_ % 3)
                failed: list = []
                go = threading.Barrier(2)

                def release_all():
                    try:
                        go.wait(5)
                        for message in messages:
                            message.release()
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        failed.append(exc)

                worker = threading.Thread(target=release_all)
                worker.start()
                go.wait(5)
                sub.close()
                worker.join(5)
                assert not worker.is_alive() and failed == []
                assert all(message.released for message in messages)
                releases = sub._backend.transports[-1].releases
                assert len(releases) == len(set(releases)) <= 6
                assert set(releases) <= {message.seq for message in messages}
    finally:
        sys.setswitchinterval(switch)


def test_a_mailbox_handing_back_its_old_frame_still_sees_a_close():
    """An EGLStream mailbox hands its last frame back at once when no new one came (no Timeout):
    a wait for an announced frame there still ends once stop() says so, not at its deadline."""
    from eglcuda.topics.transports.eglstream import EglStreamSubscriber

    class OldFrame:
        number = 3
        released = False

        def release(self):
            self.released = True

    class Mailbox:
        handed = 0

        def acquire(self, timeout_us):
            self.handed += 1
            time.sleep(0.001)
            return OldFrame()

    transport = EglStreamSubscriber(None, types.SimpleNamespace(publisher_pid=0), protocol.Qos.LATEST, 1)
    transport.consumer = Mailbox()
    stopping = threading.Event()
    worker, outcome = _wait_in_thread(
        lambda: transport.take(protocol.Frame(seq=9, slot=0, timestamp_ns=0, number=4, payload=b""),
                               time.monotonic() + 60, stopping.is_set))
    started = time.monotonic()
    stopping.set()
    worker.join(5)
    assert not worker.is_alive()
    assert outcome and outcome[0][0] == "closed", outcome
    assert time.monotonic() - started < 1
    assert transport.consumer.handed > 10  # it did spin on the old frame meanwhile


def test_an_eglstream_consumer_without_frame_numbers_takes_the_frame_it_gets():
    """Where the stream gives no frame numbers, the frame acquired is the one taken (it cannot
    be told apart from an old one), not waited past until the deadline."""
    from eglcuda.topics.transports.eglstream import EglStreamSubscriber

    class Unnumbered:
        number = None
        released = False

    class Consumer:
        def acquire(self, timeout_us):
            return Unnumbered()

    transport = EglStreamSubscriber(None, types.SimpleNamespace(publisher_pid=0), protocol.Qos.EVERY, 2)
    transport.consumer = Consumer()
    started = time.monotonic()
    got, number = transport.take(protocol.Frame(seq=1, slot=0, timestamp_ns=0, number=5, payload=b""),
                                 time.monotonic() + 5)
    assert isinstance(got, Unnumbered) and number is None and time.monotonic() - started < 1


def test_a_goodbye_is_heard_from_a_subscriber_closing_with_an_announcement_unread(path, monkeypatch):
    """A frame announced just after the subscriber's last read is unread when its socket closes,
    which resets the connection ahead of the goodbye: the publisher still reads the goodbye (a
    leave, not a drop). (Closing without the final read here makes the race certain.)"""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=4)
        put(pub, b"0", timeout=5)
        with sub.receive(5):
            pass
        put(pub, b"1", timeout=5)  # announced, never read
        monkeypatch.setattr(eglcuda.topics.sockets, "close_quietly", lambda sock: sock.close())
        sub.close()
        monkeypatch.undo()
        assert_everyone_left(pub)


def test_iterating_a_closed_subscriber_says_it_is_closed(path):
    with publisher(path):
        sub = subscriber(path)
        sub.close()
        with pytest.raises(eglcuda.ClosedError):
            for _ in sub:
                pass


def test_publisher_close_from_another_thread_ends_a_wait_for_a_pool_frame(path):
    """Every pool frame is held by an 'every' subscriber: next_frame() waits. close() from
    another thread ends that wait at once (not at its 60 s timeout), and the topic closes."""
    pub = publisher(path, pool=2, max_pool=2, every_timeout=60)
    sub = subscriber(path, qos="every", queue=2)
    put(pub, b"0", timeout=5)
    put(pub, b"1", timeout=5)
    held = [sub.receive(5), sub.receive(5)]
    _close_ends_the_wait(lambda: pub.next_frame(60), lambda: pub.close(timeout=0.5))
    assert pub.closed and not os.path.exists(path)
    with pytest.raises(eglcuda.Dropped, match="closed the topic"):
        sub.receive(2)  # the goodbye reached the subscriber
    assert all(message.released for message in held)
    sub.close()


def test_publisher_close_from_another_thread_ends_a_wait_for_a_full_queue(path):
    """An 'every' subscriber's queue is full: publish() waits for room. close() from another
    thread ends it at once, with ClosedError, and the frame is not published."""
    pub = publisher(path, pool=4, max_pool=4, every_timeout=60)
    sub = subscriber(path, qos="every", queue=1)
    put(pub, b"0", timeout=5)
    frame = pub.next_frame(5)
    _close_ends_the_wait(lambda: pub.publish(frame, payload=b"1"), lambda: pub.close(timeout=0.5))
    assert pub.published == 1
    sub.close()


def test_a_close_interrupted_before_its_work_is_done_by_the_next_close(path, monkeypatch):
    """close() interrupted (KeyboardInterrupt) after it marked the publisher closed, before its
    work began: the next close() does that work, at once."""
    pub = publisher(path)
    close_now = type(pub)._close_now
    interrupted: list[bool] = []

    def interrupt_once(self, wait):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return close_now(self, wait)

    monkeypatch.setattr(type(pub), "_close_now", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        pub.close()
    assert os.path.exists(path)
    started = time.monotonic()
    pub.close()
    assert time.monotonic() - started < 0.5 and not os.path.exists(path)


def test_a_close_interrupted_while_it_waits_for_a_goodbye_still_lets_everything_go(path):
    """Ctrl-C (a KeyboardInterrupt from a signal handler) while close() waits for a stopped
    subscriber to let go: the interrupt reaches the caller, and the topic's socket, lock, pool,
    connections and descriptors are gone all the same, so the topic can be published again in
    this process at once."""
    before = open_fds()
    pub = publisher(path)
    peer = Peer("subscribe", "--path", path)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        peer.wait_for(lambda m: m.get("event") == "ready")
        pub.discard(pub.next_frame(5))  # (the subscriber is adopted)
        os.kill(peer.process.pid, signal.SIGSTOP)

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            pub.close(5)
        assert time.monotonic() - started < 2
        assert pub.closed and os.listdir(os.path.dirname(path)) == []
        assert open_fds() <= before + 3  # (the peer's three pipes; a collection may close others meanwhile)
        again = publisher(path)
        again.close()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.kill(peer.process.pid, signal.SIGCONT)
        peer.stop()


@pytest.mark.parametrize("timeout", [float("inf"), 1e10], ids=["inf", "1e10"])
def test_a_close_without_limit_beside_another_thread_s_close_waits_for_it(path, timeout):
    """A subscriber in another process is stopped (SIGSTOP): one thread's close(0.5) waits for
    its goodbye. A close() of another thread meanwhile, with no limit (inf) or a limit beyond
    what a thread's wait takes, returns once the topic is closed, as a close(1) does, instead of
    raising OverflowError."""
    pub = publisher(path)
    peer = Peer("subscribe", "--path", path)
    try:
        peer.wait_for(lambda m: m.get("event") == "ready")
        pub.discard(pub.next_frame(5))  # (the subscriber is adopted)
        os.kill(peer.process.pid, signal.SIGSTOP)
        first = threading.Thread(target=pub.close, args=(0.5,))
        first.start()
        time.sleep(0.1)  # (the first close waits for the stopped subscriber)
        started = time.monotonic()
        pub.close(timeout)
        assert time.monotonic() - started < 2 and pub.closed and not os.path.exists(path)
        first.join(5)
        assert not first.is_alive()
    finally:
        os.kill(peer.process.pid, signal.SIGCONT)
        peer.kill()


def test_a_receive_behind_another_thread_s_wait_keeps_its_own_timeout(path):
    """One thread waits in receive(3) for a frame that does not come; another's receive(0.2) and
    wait_for_publisher(0.2) end within their own time (Timeout; the info while connected), not
    once the first wait is over (it took the subscriber's lock for 3 s). A frame published
    meanwhile reaches one of them."""
    with publisher(path) as pub, subscriber(path, qos="every", queue=2) as sub:
        first = threading.Thread(target=lambda: pytest.raises(eglcuda.Timeout, sub.receive, 3))
        first.start()
        time.sleep(0.2)  # the first thread waits by now
        started = time.monotonic()
        with pytest.raises(eglcuda.Timeout):
            sub.receive(0.2)
        assert time.monotonic() - started < 1.5
        started = time.monotonic()
        try:
            sub.wait_for_publisher(0.2)
        except eglcuda.Timeout:
            pass
        assert time.monotonic() - started < 1.5
        first.join(5)
        put(pub, b"x")
        with sub.receive(2) as message:
            assert message.payload == b"x"


def test_subscribers_asked_on_another_thread_while_publish_waits_answer_at_once(path):
    """publish() waits for room in an 'every' subscriber's full queue (every_timeout 60 s): a
    monitoring thread asking pub.subscribers meanwhile is answered at once, not after the wait."""
    pub = publisher(path, pool=4, max_pool=4, every_timeout=60)
    sub = subscriber(path, qos="every", queue=1)
    put(pub, b"0", timeout=5)
    frame = pub.next_frame(5)
    waiting = threading.Thread(target=lambda: pytest.raises(eglcuda.ClosedError, pub.publish, frame, payload=b"1"))
    waiting.start()
    try:
        time.sleep(0.3)  # (publish is waiting for room)
        assert waiting.is_alive()
        started = time.monotonic()
        listed = pub.subscribers
        assert time.monotonic() - started < 1.0
        assert [(s.qos, s.outstanding) for s in listed] == [("every", 1)]
    finally:
        pub.close(timeout=0.5)
        waiting.join(5)
        sub.close()
    assert not waiting.is_alive()
