"""Waiting on many topics in one thread: ``Subscriber.fileno()``, :class:`eglcuda.WaitSet` and
``receive_async`` / ``async for``, on the null transport: frames through the frame ring as
cuda-ipc and cuda-vmm hand them over ("ring"), or announced by socket as to an EGLStream
subscriber ("socket"). Remote subscribers: tests/gpu/test_waitset.py."""
from __future__ import annotations

import asyncio
import gc
import hashlib
import math
import os
import random
import resource
import select
import selectors
import signal
import socket
import threading
import time
import weakref
from fractions import Fraction

import pytest

import eglcuda
from eglcuda.topics import _ring, protocol
from eglcuda.topics.protocol import Reason

from .helpers import ENV, NullPublisherBackend, Peer, open_fds, pattern, subscriber, waiting_fds
from ...json_peer import JsonPeer

PEER = os.path.join(os.path.dirname(__file__), "waitset_peer.py")


@pytest.fixture(params=[True, False], ids=["ring", "socket"])
def ring(request):
    return request.param


def publisher(path, ring, name="t", **options):
    options.setdefault("_backend", NullPublisherBackend(message_only=ring))
    return eglcuda.Publisher(name, 64, 32, "Y", path=path, **options)


def put(pub, payload: bytes, timeout=5.0) -> int:
    frame = pub.next_frame(timeout)
    frame.data[:] = pattern(payload)
    return pub.publish(frame, payload=payload)


def exit_code_within(pid: int, seconds: float) -> int:
    """The child's exit code; a child still running after ``seconds`` is killed and fails the test."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child was still running after {seconds} s")


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def paths(folder, count):
    return [os.path.join(folder, f"t{i}.topic") for i in range(count)]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- fileno() and receive(timeout=0) ---------------------------------------------------------------

def test_fileno_is_readable_exactly_while_a_message_waits(path, ring):
    """Random publishes, receives with timeout=0 and releases: after each step the descriptor is
    readable if and only if a frame waits, and receive(timeout=0) hands it out at once (in order,
    with its bytes); a Timeout leaves the descriptor quiet."""
    rng = random.Random(5 + ring)
    with publisher(path, ring) as pub, subscriber(path, qos="every", queue=8) as sub:
        fd = sub.fileno()
        assert fd == sub.fileno() and not readable(fd)
        sent, held, got = [], [], []
        for step in range(600):
            action = rng.random()
            if action < 0.4 and len(sent) - len(got) + len(held) < 8:
                payload = rng.randbytes(rng.choice([0, 5, _ring.INLINE_PAYLOAD + 3]))
                sent.append((put(pub, payload), payload))
            elif action < 0.8 and len(held) < 8:
                started = time.monotonic()
                try:
                    message = sub.receive(0)
                except eglcuda.Timeout:
                    assert len(got) == len(sent), f"step {step}: a frame waited, receive(timeout=0) found none"
                else:
                    assert (message.seq, message.payload) == sent[len(got)]
                    assert message.frame.data == pattern(message.payload)
                    got.append(message.seq)
                    held.append(message)
                assert time.monotonic() - started < 0.5
            elif held:
                held.pop(rng.randrange(len(held))).release()
            assert readable(fd) == (len(got) < len(sent)), f"step {step}: {len(sent) - len(got)} waiting"
        assert len(got) > 100
        for message in held:
            message.release()


def test_receive_timeout_0_sees_a_frame_after_earlier_timeouts_and_the_end(path, ring):
    """receive(timeout=0) asks the connection every time: after timeouts, a frame that came is
    handed out and the publisher's close raises Dropped, each at once."""
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub:
        for _ in range(3):
            with pytest.raises(eglcuda.Timeout):
                sub.receive(0)
        seq = put(pub, b"x")
        with sub.receive(0) as message:
            assert message.seq == seq and message.frame.data == pattern(b"x")
        pub.close()
        started = time.monotonic()
        with pytest.raises(eglcuda.Dropped) as caught:
            sub.receive(0)
        assert caught.value.code == Reason.CLOSING and time.monotonic() - started < 0.5


def test_fileno_costs_nothing_until_asked_and_goes_with_the_subscriber(path):
    def settle(pub):  # (the publisher reads the goodbyes as it works)
        for _ in range(5):
            put(pub, b"")
            time.sleep(0.02)

    with publisher(path, True) as pub:
        subscriber(path).close()
        settle(pub)
        gc.collect()  # (first: what earlier tests left to the collector must not go while counted)
        before, waiting_before = open_fds(), waiting_fds()
        sub = subscriber(path)
        opened = waiting_fds() - waiting_before
        fd = sub.fileno()
        assert waiting_fds() - waiting_before == opened + 2  # (its epoll set and its eventfd)
        sub.close()
        assert readable(fd)  # a watcher sees the close
        with pytest.raises(eglcuda.ClosedError):
            sub.receive(0)
        del sub
        gc.collect()
        settle(pub)
        assert waiting_fds() == waiting_before and open_fds() <= before


def test_a_forked_child_cannot_wait_on_the_parents_subscriber(path):
    with publisher(path, True), subscriber(path) as sub:
        sub.fileno()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    sub.fileno()
                except eglcuda.UsageError:
                    code = 0
                sub.close()
            finally:
                os._exit(code)
        assert exit_code_within(pid, 10) == 0
        assert not readable(sub.fileno())


def test_a_forked_child_cannot_change_the_parents_wait_set(path):
    """A child made by fork() shares the set's epoll instance with its parent: the child's
    attach, detach and wait raise UsageError (its close() only lets go of its copy), and the
    parent's set goes on reporting each of its attachments."""
    left, right = socket.socketpair()
    with left, right, publisher(path, True) as pub, subscriber(path, qos="every") as sub, \
            eglcuda.WaitSet() as waits:
        attachments = [waits.attach(sub), waits.attach(left)]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                refused = 0
                for call in [lambda: waits.wait(0), lambda: waits.attach(right), lambda: waits.attach_interval(1)] + \
                        [lambda a=a: waits.detach(a) for a in attachments]:
                    try:
                        call()
                    except eglcuda.UsageError as exc:
                        refused += "forked child" in str(exc)
                waits.close()
                code = 0 if refused == 5 else 1
            finally:
                os._exit(code)
        assert exit_code_within(pid, 10) == 0
        put(pub, b"after")
        right.send(b"x")
        events = waits.wait(5)
        assert sorted(e.kind for e in events) == ["message", "readable"], events
        assert {e.attachment for e in events} == set(attachments)
        with sub.receive(0) as message:
            assert message.frame.data == pattern(b"after")


def test_a_forked_childs_close_lets_go_of_its_copies_and_leaves_the_parents_wait_asleep(path):
    """fork() while a thread of the parent waits on a set: the child's close() closes its copies
    of both of the set's descriptors (the epoll set and the eventfd a close writes) without
    writing to it, and the parent's wait sleeps on until its own timeout."""
    with publisher(path, True), subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        outcome = []
        waiter = threading.Thread(target=lambda: outcome.append(waits.wait(1.0)), daemon=True)
        waiter.start()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                count = open_fds()
                waits.close()
                code = 0 if count - open_fds() == 2 else 3
            finally:
                os._exit(code)
        assert exit_code_within(pid, 10) == 0
        waiter.join(5)
        assert outcome == [[]]  # (the child's close did not wake it: it ended at its timeout)
        assert not waits.closed


def test_a_childs_close_after_a_fork_made_from_c_leaves_the_parents_set_asleep(path):
    """A child made by fork() from C (no Python at-fork hook runs: ctypes, an extension) closes
    the set it inherited: that close must not wake the parent's set for good (it used to write
    the shared wake descriptor, and every wait of the parent returned at once, spinning)."""
    import ctypes

    with publisher(path, True), subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        # (PyDLL keeps the GIL through fork(): with CDLL the GIL is let go around the call, and
        # a child forked while another thread took it would wait for that thread for ever)
        pid = ctypes.PyDLL(None).fork()
        if pid == 0:
            try:
                waits.close()
            finally:
                os._exit(0)
        assert exit_code_within(pid, 10) == 0
        spent = cpu_seconds()
        started = time.monotonic()
        assert waits.wait(0.3) == []
        assert waits.wait(0.3) == []
        assert time.monotonic() - started >= 0.55
        assert cpu_seconds() - spent < 0.2, "the waits spun"
        assert not waits.closed


def test_attaching_the_parents_subscriber_in_a_forked_child_says_whose_it_is(path):
    with publisher(path, True), subscriber(path, qos="every") as sub:
        sub.fileno()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with eglcuda.WaitSet() as waits:
                    try:
                        waits.attach(sub)
                    except eglcuda.UsageError as exc:
                        code = 0 if "forked child" in str(exc) and "no open descriptor" not in str(exc) else 3
            finally:
                os._exit(code)
        assert exit_code_within(pid, 10) == 0


def test_a_subscriber_holding_all_it_may_is_quiet_until_a_release(path, ring):
    """A ``latest`` subscriber that holds as many messages as it may (two) can be handed nothing:
    with a newer frame published, its descriptor is quiet and the set sleeps (it used to report
    a "message" at every wait, which receive(timeout=0) refused: a spin). A release makes it
    report the frame that waited, where the publisher announced it (the frame ring), and the
    next frame in any case, every byte. (An ``every`` subscriber that holds its queue has no frame
    waiting: its publisher waits for room, then drops it: the next test.)"""
    with publisher(path, ring) as pub, subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        held = []
        for key in (b"a", b"b"):
            put(pub, key)
            assert [e.kind for e in waits.wait(5)] == ["message"]
            held.append(sub.receive(0))
        put(pub, b"c")
        spent = cpu_seconds()
        started = time.monotonic()
        waits_made = 0
        while time.monotonic() - started < 0.5:
            assert waits.wait(0.5 - (time.monotonic() - started)) == []
            waits_made += 1
        assert waits_made <= 3 and cpu_seconds() - spent < 0.2, waits_made
        assert not readable(sub.fileno())
        with pytest.raises(eglcuda.UsageError, match="as many as it may"):
            sub.receive(0)
        held.pop(0).release()
        if ring:  # (the frame ring announced "c": the release alone makes it ready)
            assert [e.kind for e in waits.wait(5)] == ["message"]
        put(pub, b"d")
        assert [e.kind for e in waits.wait(5)] == ["message"]
        with sub.receive(0) as message:
            assert message.payload == b"d" and message.frame.data == pattern(b"d")
        held.pop().release()
        assert waits.wait(0) == []


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_a_selector_over_a_subscriber_holding_all_it_may_sleeps_until_a_release_or_the_end(path, ring, qos):
    """Watched by ``selectors`` alone (no wait set looks at it), a subscriber that holds all it may
    stays quiet while frames come: the publisher's NOTICE of frames skipped for a ``latest`` one
    used to make it readable for good (a watcher spun, and its receive(0) met the hold limit).
    A release makes the next frame show; the publisher's goodbye shows while it holds all it may."""
    with publisher(path, ring, every_timeout=30) as pub, subscriber(path, qos=qos, queue=2) as sub, \
            selectors.DefaultSelector() as selector:
        selector.register(sub.fileno(), selectors.EVENT_READ)
        held = []
        for key in (b"a", b"b"):
            put(pub, key)
            assert selector.select(5)
            held.append(sub.receive(0))
        if qos == "latest":
            for key in (b"c", b"d", b"e"):
                put(pub, key)
        else:  # (an 'every' publisher waits for room: from a thread)
            threading.Thread(target=put, args=(pub, b"c"), daemon=True).start()
        spent = cpu_seconds()
        started = time.monotonic()
        wakes = 0
        while time.monotonic() - started < 0.4:
            wakes += bool(selector.select(0.05))
        assert wakes == 0 and cpu_seconds() - spent < 0.2, wakes
        held.pop(0).release()
        if qos == "latest":
            put(pub, b"f")
        with _selected(selector, sub) as message:
            expected = b"f" if qos == "latest" else b"c"
            assert message.payload == expected and message.frame.data == pattern(expected)
            held.append(message)
            put(pub, b"g") if qos == "latest" else None
            assert not selector.select(0.2)
            closing = threading.Thread(target=pub.close, daemon=True)  # (it waits for the frames held)
            closing.start()
            assert selector.select(5), "the goodbye did not show"
            with pytest.raises(eglcuda.Dropped, match="closed the topic"):
                sub.receive(0)
            held.pop(0).release()
        closing.join(10)
        assert not closing.is_alive()


def _selected(selector, sub, seconds=5.0):
    """The next message, taken as the docs' selectors loop takes it (a wake whose receive(0) finds
    nothing yet, a Timeout, is waited past)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if selector.select(deadline - time.monotonic()):
            try:
                return sub.receive(0)
            except eglcuda.Timeout:
                pass
    pytest.fail(f"no message in {seconds} s")


def test_a_receive_async_beside_another_threads_join_sleeps(path):
    """receive_async() while another thread's wait_for_publisher() holds the subscriber, whose
    descriptor is readable (its publisher gone): it waits without spinning the loop (it used to
    add its reader again and again, a core's worth), and times out after its own time."""
    pub = publisher(path, True)
    sub = subscriber(path, qos="every")
    try:
        sub.fileno()
        pub.close()
        with pytest.raises(eglcuda.StreamDisconnected):
            sub.receive(1)
        joining = threading.Thread(target=lambda: pytest.raises(eglcuda.Timeout, sub.wait_for_publisher, 1.5))
        joining.start()
        time.sleep(0.2)

        async def main():
            turns = 0

            async def count():
                nonlocal turns
                while True:
                    turns += 1
                    await asyncio.sleep(0.01)

            counting = asyncio.ensure_future(count())
            spent, started = time.thread_time(), time.monotonic()
            with pytest.raises(eglcuda.Timeout):
                await sub.receive_async(0.5)
            counting.cancel()
            return time.thread_time() - spent, time.monotonic() - started, turns

        used, took, turns = asyncio.run(main())
        joining.join(5)
        assert 0.45 <= took < 1.5 and used < 0.15 and turns < 100, (used, took, turns)
    finally:
        sub.close()


def test_a_time_or_count_with_thousands_of_digits_is_refused_with_a_short_message(path):
    huge = 10 ** 5000
    with eglcuda.WaitSet() as waits:
        with pytest.raises(eglcuda.UsageError, match=r"got a negative int of 1661\d bits$"):
            waits.wait(-huge)
        with pytest.raises(eglcuda.UsageError, match=r"got an int of 1661\d bits$"):
            waits.attach_interval(huge)
    with pytest.raises(eglcuda.UsageError, match=r"got a negative int of 1661\d bits$"):
        eglcuda.Publisher("t", 64, 32, "Y", path=path, every_timeout=-huge)
    with pytest.raises(eglcuda.UsageError, match=r"queue is an int in 1\.\.\d+, got an int of"):
        eglcuda.Subscriber("t", path=path, queue=huge)
    with pytest.raises(eglcuda.UsageError, match=r"width must be an int in 1\.\.\d+, got an int of"):
        eglcuda.Publisher("t", huge, 32, "Y", path=path)


def test_a_subscriber_holding_all_it_may_still_reports_its_drop(path, ring):
    """Quiet while it holds all it may, an ``every`` subscriber the publisher drops for it (its
    ``every_timeout``) is reported at once, with the drop."""
    with publisher(path, ring, every_timeout=0.2) as pub, subscriber(path, qos="every", queue=2) as sub, \
            eglcuda.WaitSet() as waits:
        waits.attach(sub)
        held = []
        for key in (b"a", b"b"):
            put(pub, key)
            held.append(sub.receive(5))
        assert waits.wait(0.1) == []
        threading.Thread(target=put, args=(pub, b"c"), daemon=True).start()  # (waits 0.2 s, then drops it)
        events = waits.wait(5)
        assert [e.kind for e in events] == ["error"] and isinstance(events[0].error, eglcuda.Dropped), events
        for message in held:
            message.release()

# ---- WaitSet ----------------------------------------------------------------------------------

def test_a_wait_set_wakes_on_any_and_reports_each_ready_subscriber(folder, ring):
    rng = random.Random(11)
    topics = paths(folder, 5)
    pubs = [publisher(p, ring) for p in topics]
    subs = [subscriber(p, qos="every", queue=4) for p in topics]
    try:
        with eglcuda.WaitSet() as waits:
            attached = [waits.attach(sub) for sub in subs]
            assert len(waits) == 5 and waits.wait(0) == []
            for _ in range(60):
                chosen = rng.sample(range(5), rng.randint(1, 3))
                sent = {}
                for i in chosen:
                    payload = rng.randbytes(8)
                    sent[i] = (put(pubs[i], payload), payload)
                events = waits.wait(5)
                assert sorted(subs.index(e.source) for e in events) == sorted(chosen)
                for event in events:
                    assert event.kind == "message" and event.error is None
                    assert event.attachment is attached[subs.index(event.source)]
                    with event.source.receive(0) as message:
                        assert (message.seq, message.payload) == sent[subs.index(event.source)]
                        assert message.frame.data == pattern(message.payload)
                assert waits.wait(0) == []
            waits.detach(attached[0])
            put(pubs[0], b"gone")
            assert waits.wait(0.05) == [] and len(waits) == 4
    finally:
        for sub in subs:
            sub.close()
        for pub in pubs:
            pub.close()


def test_a_message_not_received_is_reported_again(path, ring):
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        put(pub, b"a")
        assert [e.kind for e in waits.wait(5)] == ["message"]
        assert [e.kind for e in waits.wait(0)] == ["message"]  # (level-triggered)
        with sub.receive(0) as message:
            assert message.payload == b"a"
        assert waits.wait(0) == []


def test_a_slow_latest_subscriber_gets_a_message_for_nearly_every_event(path, ring):
    """A ``latest`` subscriber four times slower than its publisher: the frames it cannot take
    turn stale while it works. A message event is one that a receive(timeout=0) answers with a
    frame (stale ones are passed over when the set asks, as receive would), and the frames come
    in order with their bytes."""
    with publisher(path, ring) as pub, subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        published = []

        def feed():
            for i in range(300):
                published.append(put(pub, b"%d" % i))
                time.sleep(0.001)

        feeder = threading.Thread(target=feed)
        feeder.start()
        got, empty = [], 0
        while True:
            events = waits.wait(1.0)
            if not events:
                break
            assert [e.kind for e in events] == ["message"]
            try:
                with sub.receive(0) as message:
                    assert message.frame.data == pattern(message.payload)
                    got.append(message.seq)
            except eglcuda.Timeout:
                empty += 1
            time.sleep(0.004)
        feeder.join()
        assert got == sorted(set(got)) and got[-1] > published[-1] - 20
        assert len(got) > 30 and empty <= 1, (len(got), empty)


def test_deadlines_say_missed_only_while_no_message_comes(folder):
    first, second = paths(folder, 2)
    with publisher(first, True) as pub, publisher(second, True, name="u"), \
            subscriber(first) as sub, subscriber(second, name="u") as other, eglcuda.WaitSet() as waits:
        watched = waits.attach(sub, deadline=0.2)
        waits.attach(other)  # (no deadline: never "missed")
        put(pub, b"1")
        assert [e.kind for e in waits.wait(5)] == ["message"]
        sub.receive(0).release()
        last = time.monotonic()
        for _ in range(2):
            events = waits.wait(5)
            now = time.monotonic()
            assert [(e.kind, e.attachment) for e in events] == [("missed", watched)]
            assert 0.18 <= now - last < 1.0
            last = now
        put(pub, b"2")
        assert [e.kind for e in waits.wait(5)] == ["message"]  # (a message, not a missed deadline)
        sub.receive(0).release()
        assert waits.wait(0.1) == []  # (the deadline counts from the message)


def test_intervals_tick_without_bunching(path):
    with publisher(path, True) as pub, subscriber(path) as sub, eglcuda.WaitSet() as waits:
        tick = waits.attach_interval(0.05)
        waits.attach(sub)
        started, ticks, messages = time.monotonic(), [], 0
        while time.monotonic() - started < 0.5:
            if messages < 3:
                put(pub, b"m")
            events = waits.wait(1)
            assert [e.kind for e in events].count("interval") <= 1  # (never bunched)
            for event in events:
                if event.kind == "interval":
                    assert event.attachment is tick and event.source is None
                    ticks.append(time.monotonic())
                else:
                    assert event.kind == "message"
                    sub.receive(0).release()
                    messages += 1
        assert 5 <= len(ticks) <= 11 and messages == 3  # (fewer on a loaded machine: a late wait skips)
        time.sleep(0.3)  # (six periods late: one event, the next a period on)
        assert [e.kind for e in waits.wait(0)] == ["interval"]
        assert waits.wait(0) == []


def test_other_descriptors_attach_and_bad_input_is_refused(path):
    numpy = pytest.importorskip("numpy")
    left, right = socket.socketpair()
    with left, right, publisher(path, True), subscriber(path) as sub, eglcuda.WaitSet() as waits:
        plain = waits.attach(left)
        assert waits.wait(0) == []
        right.send(b"x")
        (event,) = waits.wait(1)
        assert (event.kind, event.source, event.attachment) == ("readable", left, plain)
        with pytest.raises(eglcuda.UsageError):
            waits.attach(left)
        with pytest.raises(eglcuda.UsageError):
            waits.attach(object())
        with pytest.raises(eglcuda.UsageError, match="fileno"):  # (a fileno that is no method: TypeError)
            waits.attach(type("NotCallable", (), {"fileno": left.fileno()})())
        for fileno in (True, 2**40, -1, "3"):  # (what a broken fileno() may give)
            with pytest.raises(eglcuda.UsageError):
                waits.attach(type("Broken", (), {"fileno": lambda self, fileno=fileno: fileno})())
        for bad in (0, -1, float("nan"), "1", True):
            with pytest.raises(eglcuda.UsageError):
                waits.attach(sub, deadline=bad)
            with pytest.raises(eglcuda.UsageError):
                waits.attach_interval(bad)
        with pytest.raises(eglcuda.UsageError):
            waits.wait(-1)
        waits.detach(plain)
        with pytest.raises(eglcuda.UsageError):
            waits.detach(plain)
        assert len(waits) == 0
        numbered = waits.attach(type("Numbered", (), {"fileno": lambda self: numpy.int64(left.fileno())})())
        assert [(e.kind, e.attachment) for e in waits.wait(1)] == [("readable", numbered)]  # (the "x" above)
        # A descriptor number given as a NumPy integer is one as an int is.
        waits.detach(numbered)
        numbered = waits.attach(numpy.int32(left.fileno()))
        assert [(e.kind, e.source, e.attachment) for e in waits.wait(1)] == [("readable", numpy.int32(left.fileno()),
                                                                              numbered)]
    with pytest.raises(eglcuda.ClosedError):
        waits.wait(0)
    with pytest.raises(eglcuda.ClosedError):
        waits.detach(numbered)
    # A subscriber closed before it is attached is refused alike, asked for its fileno() or not.
    with publisher(path, True):
        for ask_fileno in (False, True):
            sub = subscriber(path)
            if ask_fileno:
                sub.fileno()
            sub.close()
            with eglcuda.WaitSet() as waits, pytest.raises(eglcuda.ClosedError):
                waits.attach(sub)


def test_a_wait_of_any_length_returns_what_comes(path):
    """wait() takes any timeout of 0 or more seconds, inf too, also beyond what one epoll_wait
    sleeps (2**31-1 ms), and deadlines and intervals of any length: it sleeps until something
    comes and returns it."""
    left, right = socket.socketpair()
    with left, right, publisher(path, True) as pub, subscriber(path, qos="every") as sub, \
            eglcuda.WaitSet() as waits:
        waits.attach(sub, deadline=1e300)
        waits.attach_interval(1e12)
        socket_end = waits.attach(left)
        for timeout in (math.inf, 1e300, 1e9, 2**63, 10**400):
            put(pub, b"x")
            (event,) = waits.wait(timeout)
            assert event.kind == "message"
            with sub.receive(0) as message:
                assert message.frame.data == pattern(b"x")
            timer = threading.Timer(0.05, right.send, (b"y",))
            timer.start()
            started = time.monotonic()
            (event,) = waits.wait(timeout)
            assert event.attachment is socket_end and time.monotonic() - started >= 0.04
            assert left.recv(1) == b"y"
            timer.join()


# ---- errors -----------------------------------------------------------------------------------

def test_a_subscriber_closed_by_another_thread_wakes_the_set_with_its_error(path, ring):
    with publisher(path, ring), subscriber(path) as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub, deadline=5)
        timer = threading.Timer(0.1, sub.close)
        timer.start()
        started = time.monotonic()
        (event,) = waits.wait(5)
        assert event.kind == "error" and isinstance(event.error, eglcuda.ClosedError)
        assert time.monotonic() - started < 2
        timer.join()
        assert [e.kind for e in waits.wait(0)] == ["error"]  # (until detached)


def test_a_close_from_another_thread_during_a_receive_that_drains_leaves_the_descriptor_readable(path, ring):
    """close() from another thread lands as this thread's receive(timeout=0) takes the last frame
    waiting and is about to make the descriptor quiet: once the close is done, the descriptor is
    readable (a watcher sees the close) and a wait set reports the ClosedError."""
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        put(pub, b"1")
        put(pub, b"2")
        sub.receive(0).release()  # (a frame is left: the descriptor stays readable)
        ready = sub._ready
        quiet = ready.clear
        closer = threading.Thread(target=sub.close)

        def clear():  # (the close() comes in just before the receive makes the descriptor quiet)
            closer.start()
            while not sub._closing:
                time.sleep(0.001)
            time.sleep(0.05)
            quiet()

        ready.clear = clear
        try:
            sub.receive(0).release()
        finally:
            del ready.clear
        closer.join(5)
        assert sub.closed and not closer.is_alive()
        assert readable(sub.fileno()), "closed, yet its descriptor is quiet: a watcher never hears of the close"
        (event,) = waits.wait(1)
        assert event.kind == "error" and isinstance(event.error, eglcuda.ClosedError)


def test_a_dropped_subscriber_reports_the_frames_still_valid_then_the_drop(path, ring):
    """Through a socket (EGLStream) the frames announced before the drop come first; through a
    ring (cuda-ipc, cuda-vmm) none does: the publisher freed their slots, to write them again."""
    with publisher(path, ring, pool=8, every_timeout=0.2) as pub, subscriber(path, qos="every", queue=2) as sub, \
            eglcuda.WaitSet() as waits:
        waits.attach(sub)
        for i in range(4):
            put(pub, b"%d" % i)  # (the third waits every_timeout, then drops it)
        assert [d.code for d in pub.dropped] == ["QUEUE_FULL"]
        got = []
        for _ in range(10):
            (event,) = waits.wait(5)
            if event.kind == "error":
                break
            with sub.receive(0) as message:
                got.append(message.payload)
        assert got == ([] if ring else [b"0", b"1"])
        assert isinstance(event.error, eglcuda.Dropped) and event.error.code == Reason.QUEUE_FULL
        with pytest.raises(eglcuda.Dropped):
            sub.receive(0)


def test_a_disconnected_subscriber_reported_again_and_again_does_not_grow_its_errors_traceback(path, ring):
    """A failed subscriber is reported at every wait until it is detached (or joined again), and
    each receive raises the same error: its traceback is that receive's, not every one's before
    it (which grew, holding their frames, for as long as the publisher stayed away)."""
    import traceback

    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        pub.close()
        lengths = []
        for _ in range(50):
            (event,) = waits.wait(5)
            assert event.kind == "error"
            with pytest.raises(eglcuda.Dropped) as caught:
                sub.receive(0)
            assert caught.value is event.error
            lengths.append(len(traceback.extract_tb(caught.value.__traceback__)))
        assert lengths[-1] == lengths[1] <= 10, lengths


def test_a_killed_publisher_shows_as_an_error_and_a_restarted_one_on_the_same_descriptor(path):
    first = Peer("publish", "--path", path, "--frames", "1", "--ring")
    try:
        first.wait_for(lambda m: m["event"] == "ready")
        with subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
            fd = sub.fileno()
            waits.attach(sub)
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(10)
            (event,) = waits.wait(5)
            assert event.kind == "error" and isinstance(event.error, eglcuda.StreamDisconnected)
            assert "gone" in str(event.error)
            second = Peer("publish", "--path", path, "--rate", "100", "--ring")
            try:
                second.wait_for(lambda m: m["event"] == "ready")
                sub.wait_for_publisher(10)
                assert sub.fileno() == fd
                got = []
                while len(got) < 3:
                    for event in waits.wait(5) or pytest.fail("no frame of the restarted publisher"):
                        assert event.kind == "message", event
                        with sub.receive(0) as message:
                            assert message.frame.data == pattern(message.payload)
                            got.append(message.payload)
                instance = sub.info.instance
                assert all(payload.startswith(f"{instance}:".encode()) for payload in got)
            finally:
                second.stop()
    finally:
        first.stop()


def test_a_wait_keeps_its_timeout_and_other_sources_while_another_thread_joins_one_again(folder):
    """One subscriber's publisher ended, and another thread waits in its wait_for_publisher() (no
    publisher comes back): a set of it and a second source still ends a wait at its timeout,
    reports the second source's frame at once, and a close() from a third thread ends a wait at
    once (the look at the first used to wait for the lock the join holds, all its 3 s)."""
    first, second = paths(folder, 2)
    gone = publisher(first, True)
    with publisher(second, True) as other, subscriber(first, qos="every") as joining, \
            subscriber(second, qos="every") as sub, eglcuda.WaitSet() as waits:
        waits.attach(joining)
        watched = waits.attach(sub)
        gone.close()
        (event,) = waits.wait(5)
        assert event.kind == "error", event
        outcome: list[BaseException] = []

        def join_again():
            try:
                joining.wait_for_publisher(3)
            except eglcuda.EglCudaError as exc:
                outcome.append(exc)

        joiner = threading.Thread(target=join_again)
        joiner.start()
        try:
            time.sleep(0.2)  # (it is inside wait_for_publisher() now)
            started = time.monotonic()
            assert waits.wait(0.3) == []
            assert time.monotonic() - started < 1.0
            put(other, b"other")
            started = time.monotonic()
            events = waits.wait(5)
            assert [(e.kind, e.attachment) for e in events] == [("message", watched)], events
            assert time.monotonic() - started < 1.0
            with sub.receive(0) as message:
                assert message.frame.data == pattern(b"other")
            closer = threading.Timer(0.2, waits.close)
            closer.start()
            started = time.monotonic()
            with pytest.raises(eglcuda.ClosedError):
                waits.wait(10)
            assert time.monotonic() - started < 1.0
            closer.join(5)
        finally:
            joiner.join(10)
        assert not joiner.is_alive() and len(outcome) == 1 and isinstance(outcome[0], eglcuda.Timeout), outcome


def test_a_deadline_counts_again_once_wait_for_publisher_joined_a_restarted_publisher(path, ring):
    """A publisher process killed: the attachment reports its error, and no "missed" while the
    error stands. Once wait_for_publisher() joined a restarted publisher that sends nothing, the
    deadline counts again: "missed" a deadline later, and again each deadline after."""
    flag = ["--ring"] if ring else []
    first = Peer("publish", "--path", path, "--frames", "1", *flag)
    try:
        first.wait_for(lambda m: m["event"] == "done")
        with subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
            watched = waits.attach(sub, deadline=0.3)
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(10)
            for _ in range(10):
                (event,) = waits.wait(5)
                if event.kind == "error":
                    break
            assert event.kind == "error" and isinstance(event.error, eglcuda.StreamDisconnected)
            assert [e.kind for e in waits.wait(0.5)] == ["error"]  # (its error, no "missed")
            second = Peer("publish", "--path", path, "--frames", "1", *flag)  # (silent once joined)
            try:
                second.wait_for(lambda m: m["event"] == "done")
                sub.wait_for_publisher(10)
                last = time.monotonic()
                for _ in range(2):
                    events = waits.wait(5)
                    now = time.monotonic()
                    assert [(e.kind, e.attachment) for e in events] == [("missed", watched)]
                    assert 0.28 <= now - last < 1.5, now - last
                    last = now
                with pytest.raises(eglcuda.Timeout):  # (connected, nothing sent)
                    sub.receive(0)
            finally:
                second.stop()
    finally:
        first.stop()


def test_a_wait_set_closed_by_a_signal_handler_ends_the_wait_with_closed_error(path, ring):
    """close() from a signal handler that interrupts wait() (sleeping in epoll, with a timeout,
    deadlines and intervals, or with none): the wait raises ClosedError at once, the set is
    closed and its subscriber stays open."""
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub:
        for timeout, timed in ((5, True), (None, False)):
            waits = eglcuda.WaitSet()
            waits.attach(sub, deadline=5 if timed else None)
            if timed:
                waits.attach_interval(10)
            previous = signal.signal(signal.SIGUSR1, lambda *_: waits.close())
            timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
            try:
                timer.start()
                started = time.monotonic()
                with pytest.raises(eglcuda.ClosedError):
                    waits.wait(timeout)
                assert time.monotonic() - started < 2 and waits.closed
                with pytest.raises(eglcuda.ClosedError):
                    waits.wait(0)
            finally:
                timer.join()
                signal.signal(signal.SIGUSR1, previous)
        put(pub, b"after")
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after")


def test_a_wait_set_closed_while_the_wait_looks_at_a_ready_subscriber_raises_closed_error(path, ring):
    """A signal handler (or another thread) that closes the set while the wait looks at a
    subscriber its descriptor reported (after the sleep, before the wait returns) ends the wait
    with ClosedError, as a close during the sleep does: it returned the events of the closed set."""
    with publisher(path, ring) as pub, subscriber(path, qos="latest") as sub:
        for deadline in (None, 5.0):
            waits = eglcuda.WaitSet()
            attachment = waits.attach(sub, deadline=deadline)
            put(pub, b"x")
            look = attachment._probe

            def closing_look():
                waits.close()  # (as a handler run at this moment does)
                return look()

            attachment._probe = closing_look
            with pytest.raises(eglcuda.ClosedError):
                waits.wait(5)
            assert waits.closed
            with sub.receive(0) as message:  # (the subscriber stays open, its frame with it)
                assert message.frame.data == pattern(b"x")


def test_a_wait_set_closed_by_another_thread_ends_the_wait_at_once(path, ring):
    """close() from another thread while wait() sleeps (no timeout, or a long one with a
    deadline and an interval, nothing ever coming): the wait raises ClosedError at once, the
    set leaves no descriptor, and its subscriber stays open and receives."""
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub:
        sub.fileno()
        for timeout in (None, 30):
            gc.collect()  # (first: what earlier tests left to the collector must not go while counted)
            before, waiting_before = open_fds(), waiting_fds()
            waits = eglcuda.WaitSet()
            waits.attach(sub, deadline=None if timeout is None else 20)
            if timeout is not None:
                waits.attach_interval(20)
            outcome = []

            def wait():
                try:
                    outcome.append(waits.wait(timeout))
                except BaseException as exc:
                    outcome.append(exc)

            waiter = threading.Thread(target=wait, daemon=True)  # (daemon: a wait never woken fails, not hangs)
            waiter.start()
            time.sleep(0.2)
            started = time.monotonic()
            waits.close()
            waiter.join(5)
            assert not waiter.is_alive() and len(outcome) == 1, "a close() of another thread left the wait asleep"
            assert isinstance(outcome[0], eglcuda.ClosedError), outcome
            assert time.monotonic() - started < 1
            del waits
            # (the set's own descriptors are gone; the count of all of them may have fallen, the
            # publisher's threads letting go of a connection as ``before`` was read)
            assert waiting_fds() == waiting_before and open_fds() <= before
        put(pub, b"after")
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after")


def test_a_wait_set_dropped_unclosed_lets_its_subscribers_go_at_once(path, ring):
    """With the cycle collector off: a set dropped without close(), holding a subscriber with a
    deadline, goes at once, and the subscriber dropped with it too (no reference cycle): its
    publisher goes on at once without it (its hang-up seen), and no descriptor is left."""
    def settle(pub):  # (the publisher reads the goodbyes as it works)
        for _ in range(5):
            put(pub, b"")
            time.sleep(0.02)

    with publisher(path, ring, every_timeout=1.0) as pub:
        subscriber(path).close()
        settle(pub)
        gc.collect()  # (first: what earlier tests left to the collector must not go while counted)
        before, waiting_before = open_fds(), waiting_fds()
        gc.disable()
        try:
            sub = subscriber(path, qos="every")
            waits = eglcuda.WaitSet()
            waits.attach(sub, deadline=5)
            waits.attach_interval(10)
            put(pub, b"a")
            assert [e.kind for e in waits.wait(5)] == ["message"]
            sub.receive(0).release()
            subscribed, waiting = weakref.ref(sub), weakref.ref(waits)
            del sub, waits
            assert waiting() is None and subscribed() is None
            started = time.monotonic()
            settle(pub)  # (an ``every`` subscriber kept alive would stall these, its queue full)
            assert time.monotonic() - started < 0.8
            # (<=: the publisher may still be letting go of the earlier subscriber's connection as
            # ``before`` is read; what this subscriber and set opened must all be gone)
            assert open_fds() <= before and waiting_fds() == waiting_before and pub.subscribers == []
        finally:
            gc.enable()


def test_a_period_or_deadline_below_the_clocks_resolution_falls_due_at_every_wait(path):
    """A subnormal period or deadline is taken, and each wait reports it (no overflow as the
    set works out how many periods it skipped), beside a subscriber's messages."""
    with publisher(path, True) as pub, subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        tiny = waits.attach_interval(1e-320)
        tinier = waits.attach_interval(5e-324)
        watched = waits.attach(sub, deadline=5e-324)
        time.sleep(0.02)
        for _ in range(3):
            events = waits.wait(0)
            assert {e.attachment: e.kind for e in events} == {tiny: "interval", tinier: "interval", watched: "missed"}
            time.sleep(0.005)
        put(pub, b"m")
        events = waits.wait(5)
        assert {e.attachment: e.kind for e in events}[tiny] == "interval"
        assert ("message", watched) in [(e.kind, e.attachment) for e in events]
        with sub.receive(0) as message:
            assert message.frame.data == pattern(b"m")


def test_a_deadline_or_period_beyond_any_float_is_refused_as_not_finite(path):
    """inf, and an int beyond any float, are no deadline or period (a deadline that never falls
    due is no deadline: leave it out): refused with UsageError saying it must be finite, not
    "more than 0" (which they are); the set is left as it was."""
    with publisher(path, True), subscriber(path) as sub, eglcuda.WaitSet() as waits:
        for bad in (math.inf, 10**400):
            with pytest.raises(eglcuda.UsageError, match="finite"):
                waits.attach(sub, deadline=bad)
            with pytest.raises(eglcuda.UsageError, match="finite"):
                waits.attach_interval(bad)
        assert len(waits) == 0
        with pytest.raises(eglcuda.UsageError, match="0 or more"):
            waits.wait(-1)

def test_an_object_whose_fileno_raises_oserror_is_refused_with_usage_error():
    """A closed multiprocessing Connection's fileno() raises OSError ("handle is closed"), not
    ValueError as a closed file's does: attaching it is a UsageError too, and the set is left as it
    was; an open one attaches and is reported readable."""
    import multiprocessing

    closed, other = multiprocessing.Pipe()
    closed.close()
    reader, writer = multiprocessing.Pipe(duplex=False)
    with eglcuda.WaitSet() as waits:
        with pytest.raises(eglcuda.UsageError, match="no open descriptor"):
            waits.attach(closed)
        assert len(waits) == 0
        attachment = waits.attach(reader)
        writer.send(1)
        assert [(e.kind, e.attachment) for e in waits.wait(5)] == [("readable", attachment)]
    for end in (other, reader, writer):
        end.close()


def test_any_real_number_is_a_time_and_a_closed_file_is_refused(path, ring):
    """numpy's integers and floats and fractions are seconds as ints and floats are (wait,
    deadline, period, receive); a timeout beyond any float waits as inf does, in receive as in
    wait; a closed file cannot be attached (UsageError)."""
    numpy = pytest.importorskip("numpy")
    with publisher(path, ring) as pub, subscriber(path, qos="every") as sub, eglcuda.WaitSet() as waits:
        watched = waits.attach(sub, deadline=numpy.int64(2))
        tick = waits.attach_interval(Fraction(1, 10))
        assert watched.deadline == 2.0 and tick.period == 0.1
        assert waits.wait(numpy.int64(0)) == []
        started = time.monotonic()
        assert [(e.kind, e.attachment) for e in waits.wait(numpy.int32(5))] == [("interval", tick)]
        assert 0.08 <= time.monotonic() - started < 1
        for timeout in (numpy.float32(5), Fraction(5), 10**400):
            put(pub, b"x")
            assert ("message", watched) in [(e.kind, e.attachment) for e in waits.wait(timeout)]
            with sub.receive(0) as message:
                assert message.frame.data == pattern(b"x")
        for timeout in (10**400, numpy.int64(5), numpy.uint8(5), Fraction(5, 2)):
            put(pub, b"y")
            with sub.receive(timeout) as message:
                assert message.frame.data == pattern(b"y")
        put(pub, b"z")
        message = asyncio.run(sub.receive_async(10**400))
        assert message.frame.data == pattern(b"z")
        message.release()
        with pytest.raises(eglcuda.Timeout):
            sub.receive(numpy.int64(0))
        for bad in (-10**400, numpy.int64(-1), numpy.float64("nan"), True, "1"):
            with pytest.raises(eglcuda.UsageError):
                sub.receive(bad)
            with pytest.raises(eglcuda.UsageError):
                waits.wait(bad)
            with pytest.raises(eglcuda.UsageError):
                waits.attach_interval(bad)
        with open(__file__) as closed:
            pass
        gone = socket.socket()
        gone.close()
        for source in (closed, gone):
            with pytest.raises(eglcuda.UsageError, match="no open descriptor"):
                waits.attach(source)
        assert len(waits) == 2


def test_a_signal_handler_closing_a_subscriber_while_the_set_looks_at_it_closes_it(path, ring):
    """A handler's close() that lands while the set holds the subscriber's lock, in its first
    fileno() (the attach) or in the look at what it holds (a ``latest`` subscriber's wake), is
    put off and finished as that call returns: the subscriber is closed, the wait reports
    ClosedError and the publisher no longer counts it."""
    with publisher(path, ring) as pub:
        for where in ("_new_readiness", "_refresh_ready"):
            sub = subscriber(path, qos="latest")
            previous = signal.signal(signal.SIGUSR1, lambda *_: sub.close())
            try:
                inner, fired = getattr(sub, where), []

                def landing(*args):  # (the signal lands here, the subscriber's lock held)
                    if not fired:
                        fired.append(True)
                        signal.raise_signal(signal.SIGUSR1)
                    return inner(*args)

                if where == "_new_readiness":
                    sub._new_readiness = landing
                with eglcuda.WaitSet() as waits:
                    waits.attach(sub)
                    if where == "_refresh_ready":
                        sub._refresh_ready = landing
                        put(pub, b"x")
                    events = waits.wait(5)
                    assert fired and sub.closed
                    assert [(e.kind, type(e.error)) for e in events] == [("error", eglcuda.ClosedError)]
                deadline = time.monotonic() + 5
                while pub.subscribers and time.monotonic() < deadline:
                    pub.discard(pub.next_frame(1))
                    time.sleep(0.01)
                assert pub.subscribers == [] and pub.dropped == []
            finally:
                signal.signal(signal.SIGUSR1, previous)
                sub.close()


# ---- selectors and asyncio ------------------------------------------------------------------------

def test_selectors_and_asyncio_readers_over_fileno(folder, ring):
    topics = paths(folder, 3)
    pubs = [publisher(p, ring) for p in topics]
    subs = [subscriber(p, qos="every", queue=4) for p in topics]
    try:
        with selectors.DefaultSelector() as selector:
            for sub in subs:
                selector.register(sub, selectors.EVENT_READ)
            put(pubs[1], b"s")
            (key, _), = selector.select(5)
            assert key.fileobj is subs[1]
            subs[1].receive(0).release()
            assert selector.select(0) == []

        async def take(sub, count):
            out = []
            for _ in range(count):
                async with _released(await sub.receive_async(5)) as message:
                    assert message.frame.data == pattern(message.payload)
                    out.append(message.payload)
            return out

        async def main():
            loop = asyncio.get_running_loop()
            for i, pub in enumerate(pubs):
                for k in range(3):
                    loop.call_later(0.01 * (k + 1) + 0.003 * i, put, pub, b"%d:%d" % (i, k))
            return await asyncio.gather(*(take(sub, 3) for sub in subs))

        assert asyncio.run(main()) == [[b"%d:%d" % (i, k) for k in range(3)] for i in range(3)]
    finally:
        for sub in subs:
            sub.close()
        for pub in pubs:
            pub.close()


class _released:
    def __init__(self, message):
        self.message = message

    async def __aenter__(self):
        return self.message

    async def __aexit__(self, *exc):
        self.message.release()


def test_receive_async_times_out_and_refuses_a_second_waiter(path):
    with publisher(path, True), subscriber(path) as sub:
        async def main():
            started = time.monotonic()
            with pytest.raises(eglcuda.Timeout):
                await sub.receive_async(0.1)
            assert 0.09 <= time.monotonic() - started < 1
            waiting = asyncio.ensure_future(sub.receive_async(1))
            await asyncio.sleep(0.01)
            with pytest.raises(eglcuda.UsageError, match="one at a time"):
                await sub.receive_async(1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            with pytest.raises(eglcuda.Timeout):  # (the cancelled one let go of the descriptor)
                await sub.receive_async(0.01)

        asyncio.run(main())


def test_receive_async_right_after_cancelling_the_waiting_one(path):
    """task.cancel() on a waiting receive_async(), then at once (the cancelled task not yet run)
    another receive_async(): it waits and receives, it is not refused as a second waiter, and no
    reader of either is left on the loop (a reader left behind would spin the loop)."""
    with publisher(path, True) as pub, subscriber(path) as sub:
        async def main():
            loop = asyncio.get_running_loop()
            fd = sub.fileno()
            for frame_first in (False, True):
                waiting = asyncio.ensure_future(sub.receive_async(5))
                await asyncio.sleep(0.02)  # (it sleeps on the descriptor)
                waiting.cancel()
                key = b"after-%d" % frame_first
                if frame_first:  # (the new one then takes the frame without waiting)
                    put(pub, key)
                    await asyncio.sleep(0)
                else:
                    loop.call_later(0.05, put, pub, key)
                message = await sub.receive_async(5)
                try:
                    assert message.payload == key and message.frame.data == pattern(key)
                finally:
                    message.release()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                assert loop.remove_reader(fd) is False, "a reader was left on the loop"
            with pytest.raises(eglcuda.Timeout):
                await sub.receive_async(0.01)

        asyncio.run(main())


def test_a_waiter_that_caught_its_cancel_and_waits_again_is_still_the_one_waiting(path):
    """A task whose receive_async() was cancelled catches the CancelledError (without
    uncancel(), as much code does) and awaits receive_async() again: it is the waiter. Another
    task's receive_async() is refused as a second waiter (it used to take over and take the
    first one's reader off the loop), and the frame that comes wakes the first at once."""
    with publisher(path, True) as pub, subscriber(path, qos="every") as sub:
        async def main():
            got = []

            async def first():
                try:
                    await sub.receive_async(5)
                except asyncio.CancelledError:
                    pass
                started = time.monotonic()
                message = await sub.receive_async(5)
                got.append((message.payload, time.monotonic() - started))
                message.release()

            task = asyncio.ensure_future(first())
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.sleep(0.05)
            with pytest.raises(eglcuda.UsageError, match="one at a time"):
                await sub.receive_async(0.2)
            await asyncio.sleep(0.1)
            put(pub, b"x")
            await asyncio.wait_for(task, 5)
            assert got[0][0] == b"x" and got[0][1] < 1.0, got

        asyncio.run(main())


def test_receive_async_right_after_cancelling_a_waiter_whose_descriptor_fired(path):
    """A frame arrives and wakes the waiting receive_async() (its reader ran), then task.cancel()
    before that task has run again (its cancel pending, not delivered), then at once another
    receive_async(): it is not refused as a second waiter, it receives that frame, the cancelled
    one ends with CancelledError and no reader is left on the loop (on every Python: 3.10 has no
    Task.cancelling())."""
    with publisher(path, True) as pub, subscriber(path) as sub:
        async def main():
            loop = asyncio.get_running_loop()
            fd = sub.fileno()
            waiting = asyncio.ensure_future(sub.receive_async(5))
            await asyncio.sleep(0.02)  # (it sleeps on the descriptor)
            put(pub, b"woken")
            for _ in range(20):  # (until its reader ran: the frame is there, the task not yet run)
                await asyncio.sleep(0)
                if sub._async_woken is not None and sub._async_woken.done():
                    break
            assert sub._async_woken is not None and sub._async_woken.done() and not waiting.done()
            waiting.cancel()
            message = await sub.receive_async(5)
            try:
                assert message.payload == b"woken" and message.frame.data == pattern(b"woken")
            finally:
                message.release()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert loop.remove_reader(fd) is False, "a reader was left on the loop"

        asyncio.run(main())


def _interrupt() -> None:
    raise KeyboardInterrupt


def test_receive_async_after_its_loop_was_closed_with_a_waiter_in_it(path):
    """A KeyboardInterrupt out of run_until_complete() leaves a receive_async() waiting in a
    loop that is then closed (nothing cancels it, it never runs again): a receive_async() in a
    new loop is not refused as a second waiter, and receives."""
    with publisher(path, True) as pub, subscriber(path) as sub:
        loop = asyncio.new_event_loop()
        try:
            waiting = loop.create_task(sub.receive_async(5))
            # (what Python's SIGINT handler does, raised by the loop's own callback: a real
            # signal's handler may run inside a finalizer that the garbage collector calls, which
            # swallows the KeyboardInterrupt, and the receive would run on to its timeout)
            loop.call_later(0.05, _interrupt)
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(waiting)
            assert not waiting.done()
        finally:
            loop.close()
        put(pub, b"after")

        async def after():
            async with _released(await sub.receive_async(5)) as message:
                return message.payload

        assert asyncio.run(after()) == b"after"


def test_receive_async_beside_another_threads_receive_keeps_its_timeout_and_the_loop_running(path):
    """Another thread in a blocking receive (3 s) as receive_async is first awaited: the
    descriptor cannot be made until that receive ends, yet the loop runs on (no stall of more
    than a few ticks) and receive_async raises Timeout after its own 0.3 s; once the other
    thread is done, receive_async gets the next frame."""
    with publisher(path, True) as pub, subscriber(path) as sub:
        other = threading.Thread(target=lambda: pytest.raises(eglcuda.Timeout, sub.receive, 3))
        other.start()
        time.sleep(0.1)

        async def main():
            ticks: list[float] = []

            async def ticker():
                while True:
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.02)

            ticking = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            started = time.monotonic()
            with pytest.raises(eglcuda.Timeout):
                await sub.receive_async(0.3)
            took = time.monotonic() - started
            ticking.cancel()
            return took, max(b - a for a, b in zip(ticks, ticks[1:]))

        took, stall = asyncio.run(main())
        assert 0.29 <= took < 1.0 and stall < 0.2, (took, stall)
        other.join(10)
        put(pub, b"after")

        async def after():
            async with _released(await sub.receive_async(5)) as message:
                return message.payload

        assert asyncio.run(after()) == b"after"


def test_fileno_beside_another_threads_endless_receive_raises_timeout_after_the_subscribers_timeout(path):
    """Another thread sits in a receive with no practical limit when fileno() is first asked
    for (a WaitSet attaching it): fileno() waits up to the subscriber's timeout for that receive
    to end, then raises Timeout naming it, instead of waiting for good; once the receive ended,
    fileno() works and the descriptor wakes for the next frame."""
    with publisher(path, True) as pub, subscriber(path, qos="every", timeout=0.4) as sub:
        got = []
        other = threading.Thread(target=lambda: got.append(sub.receive(1e9)), daemon=True)
        other.start()
        time.sleep(0.1)
        started = time.monotonic()
        with eglcuda.WaitSet() as waits, pytest.raises(eglcuda.Timeout, match="another thread's receive"):
            waits.attach(sub)
        assert 0.35 <= time.monotonic() - started < 2.0
        put(pub, b"first")
        other.join(5)
        assert not other.is_alive() and got[0].payload == b"first"
        got[0].release()
        fd = sub.fileno()
        assert not readable(fd)
        put(pub, b"second")
        assert select.select([fd], [], [], 5)[0] == [fd]
        with sub.receive(0) as message:
            assert message.payload == b"second" and message.frame.data == pattern(b"second")


def test_async_for_ends_when_the_publisher_closes(path, ring):
    pub = publisher(path, ring)
    with subscriber(path, qos="every", queue=8) as sub:
        async def main():
            loop = asyncio.get_running_loop()
            for k in range(5):
                loop.call_later(0.01 * (k + 1), put, pub, b"%d" % k)
            loop.call_later(0.1, pub.close)
            got = []
            async for message in sub:
                assert message.frame.data == pattern(message.payload)
                got.append(message.payload)
            return got

        assert asyncio.run(main()) == [b"%d" % k for k in range(5)]
        assert sub.held == 0


def test_async_for_left_early_releases_its_message_at_once(path):
    """An ``async for`` left by break (the next receive at once, of a subscriber that holds one
    message at a time), or by return in a loop's last step, the loop then closed (no step of it
    left to run an async generator's cleanup): the message it held is released as the loop is
    left, as a ``for`` loop's is; it is not held until the subscriber closes."""
    with publisher(path, True) as pub, subscriber(path, qos="every", queue=1) as sub:
        async def leave_by_break():
            put(pub, b"a")
            async for message in sub:
                assert message.payload == b"a"
                break
            assert sub.held == 0
            put(pub, b"b")
            with sub.receive(0) as message:
                return message.payload

        assert asyncio.run(leave_by_break()) == b"b"

        async def leave_by_return():
            async for message in sub:
                return message.payload

        put(pub, b"c")
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(leave_by_return()) == b"c"
        finally:
            loop.close()
        assert sub.held == 0
        put(pub, b"d")
        with sub.receive(5) as message:
            assert message.payload == b"d"


# ---- waiting costs nothing; no wake-up is lost --------------------------------------------------------

def test_idle_waits_cost_no_cpu(folder):
    """Idle publishers in other processes; in this one, for 10 s: a WaitSet of four idle
    subscribers, a blocking receive and an asyncio loop awaiting three more. The process uses
    almost no CPU (no timer, no polling)."""
    topics = paths(folder, 8)
    peers = [Peer("publish", "--path", p, "--frames", "1", *(["--ring"] if i % 2 else [])) for i, p in enumerate(topics)]
    subs = []
    try:
        for peer in peers:
            peer.wait_for(lambda m: m["event"] == "done")
        subs = [subscriber(p, qos="every") for p in topics]
        for sub in subs:
            sub.fileno()
        waits = eglcuda.WaitSet()
        for sub in subs[:4]:
            waits.attach(sub, deadline=60)
        waits.attach_interval(60)

        def blocking():
            with pytest.raises(eglcuda.Timeout):
                subs[4].receive(10)

        async def idle(sub):
            with pytest.raises(eglcuda.Timeout):
                await sub.receive_async(10)

        async def loop_body():
            await asyncio.gather(*(idle(sub) for sub in subs[5:]))

        threads = [threading.Thread(target=blocking), threading.Thread(target=lambda: asyncio.run(loop_body()))]
        before, started = cpu_seconds(), time.monotonic()
        for thread in threads:
            thread.start()
        assert waits.wait(10) == []
        for thread in threads:
            thread.join(15)
        used, elapsed = cpu_seconds() - before, time.monotonic() - started
        assert elapsed >= 9.9
        assert used < 0.1, f"{used:.3f} s of CPU in {elapsed:.1f} s of waiting"
        waits.close()
    finally:
        for sub in subs:
            sub.close()
        for peer in peers:
            peer.stop()


def spin(rng: random.Random) -> None:
    until = time.perf_counter() + rng.random() * 60e-6
    while time.perf_counter() < until:
        pass


@pytest.mark.parametrize("mode, ring, topics", [("waitset", True, 1), ("waitset", True, 3), ("waitset", False, 3),
                                                ("selectors", True, 1), ("async", True, 2)])
def test_no_wake_up_is_lost(folder, mode, ring, topics):
    """Lost wake-up race, as tests/unit/topics/test_ring.py's for a blocking receive: a subscriber
    process waits on its topics at once (a WaitSet, selectors or asyncio), sleeping in every wait,
    and receives with timeout=0 after a random moment of work. The publishers here send bursts of
    one to three frames, a random moment apart, so that a frame lands anywhere in the moment the
    subscriber declares itself asleep, then wait until every frame was received and released: a
    frame whose wake-up was lost is never received (no later frame comes to wake it), and the
    burst times out. Random payloads, some past a ring entry. Every frame of every topic arrives,
    in order, with its bytes."""
    count, rng = 4500 // topics, random.Random(hash((mode, ring, topics)) & 0xFFFF)
    where = paths(folder, topics)
    pubs = [publisher(p, ring, every_timeout=10.0) for p in where]
    peer = JsonPeer([PEER, mode, str(count), "3", *where], env=ENV)
    try:
        assert peer.wait_for(lambda m: m["event"] == "ready")["ring"] == [ring] * topics
        deadline = time.monotonic() + 10
        while not all(pub.subscribers for pub in pubs) and time.monotonic() < deadline:
            for pub in pubs:
                pub.discard(pub.next_frame(1))
        digests, firsts, sent = [hashlib.sha256() for _ in pubs], [None] * topics, [0] * topics
        while min(sent) < count:
            for i in rng.sample(range(topics), topics):
                for _ in range(min(rng.randint(1, 3), count - sent[i])):
                    spin(rng)
                    payload = rng.randbytes(rng.choice([0, 9, 100, 300, _ring.INLINE_PAYLOAD + 1]))
                    seq = put(pubs[i], payload, timeout=10)
                    firsts[i] = seq if firsts[i] is None else firsts[i]
                    digests[i].update(len(payload).to_bytes(4, "little") + payload)
                    sent[i] += 1
            deadline = time.monotonic() + 5
            while any(s.outstanding for pub in pubs for s in pub.subscribers):
                assert time.monotonic() < deadline, f"a frame was never received (a lost wake-up), {peer.messages[-2:]}"
                time.sleep(0.0001)
        result = peer.wait_for(lambda m: m["event"] in ("done", "failed"), timeout=60)
        assert result["event"] == "done", result
        assert result["seqs"] == [list(range(f, f + count)) for f in firsts]
        assert result["sha256"] == [d.hexdigest() for d in digests] and result["wrong"] == 0
        assert all(pub.dropped == [] for pub in pubs)
    finally:
        peer.stop()
        for pub in pubs:
            pub.close()


# ---- the benchmark, on the stand-in libcuda ---------------------------------------------------------

def test_the_sources_bench_measures_each_variant():
    """bench/sources.py on the stand-in libcuda (tests/fakes): publisher processes through
    cuda-ipc, one row per variant, each with frames received at about the publishers' rate.
    Checks that the measurement runs and reports what it says, not any figure."""
    import json
    import pathlib
    import subprocess
    import sys
    import tempfile

    from ...fakes import build as fake_build

    if fake_build.compiler() is None:
        pytest.skip("no C compiler for the fake libcuda")
    root = pathlib.Path(__file__).resolve().parents[3]
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-sources-") as folder:
        fake_build.build_libcuda(folder)
        env = {**ENV, "LD_LIBRARY_PATH": folder, "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent.json"}
        out = os.path.join(folder, "rows.json")
        done = subprocess.run([sys.executable, str(root / "bench" / "sources.py"), "--sources", "2", "--rates", "30",
                               "--seconds", "1", "--warmup", "0.5", "--size", "64x48:NV12", "--json", out],
                              env=env, cwd=str(root), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        rows = json.loads(pathlib.Path(out).read_text())
    # (the floors, c and python-floor, run beside each paced row, for as many sources)
    assert [r["variant"] for r in rows] == ["waitset", "threads", "selectors", "asyncio", "c", "python-floor"]
    for row in rows:
        assert row["sources"] == 2 and 40 <= row["fps"] <= 75, row
        assert row["p50_us"] <= row["p99_us"]
        assert row["thread_us"] > 0, row
        assert row["variant"] in ("c", "python-floor") or row["cpu_us"] >= row["thread_us"], row
    assert "| 2 x 30 fps | waitset |" in done.stdout


def test_after_a_message_event_a_latest_subscriber_gets_one_at_once(path, ring):
    """Random bursts of publishes, some between a wait set's "message" and the receive, while a
    'latest' subscriber holds one frame or none: every "message" is followed by a frame from
    receive(timeout=0), never a Timeout (frames published meanwhile may have made the announced
    one stale: with nothing newer announced it still comes), newer than the last, bytes right."""
    rng = random.Random(11 + ring)
    with publisher(path, ring) as pub, subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
        waits.attach(sub)
        last, held, got = -1, [], 0
        for step in range(400):
            for _ in range(rng.choice([0, 1, 1, 2])):
                put(pub, rng.randbytes(rng.choice([0, 7])))
            events = waits.wait(0.05)
            for _ in range(rng.choice([0, 0, 1, 2, 3])):  # (published after the look, before the receive)
                put(pub, rng.randbytes(rng.choice([0, 7])))
            if any(event.kind == "message" for event in events):
                message = sub.receive(0)
                assert message.seq > last, f"step {step}: frame {message.seq} after {last}"
                assert message.frame.data == pattern(message.payload)
                last = message.seq
                held.append(message)
                got += 1
            while len(held) > rng.choice([0, 1]):
                held.pop(0).release()
        assert got > 150
        for message in held:
            message.release()


def test_a_frame_a_message_event_promised_comes_though_stale_and_before_the_goodbye(path):
    """A wait set reports a 'latest' subscriber's announced frame (socket announcements); frames
    published before it receives are skipped for it (it holds its credit): the announced one is
    stale now, yet the receive gets it (nothing newer comes) rather than a Timeout, also after
    the publisher's close, before the goodbye (Dropped, code CLOSING). Without the wait set's
    promise, a stale frame is given back and receive waits for a fresh one."""
    for closing in (False, True, None):  # (None: no wait set)
        pub = publisher(path, False)
        try:
            with subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
                sent = [put(pub, bytes([i])) for i in range(2)]
                first = sub.receive(1.0)  # (the newest: holds it)
                assert first.seq == sent[1]
                sent.append(put(pub, b"2"))  # (announced: at its credit now)
                if closing is not None:
                    waits.attach(sub)
                    assert [event.kind for event in waits.wait(1.0)] == ["message"]
                sent += [put(pub, bytes([i])) for i in range(3, 5)]  # (skipped for it, and a NOTICE)
                first.release()
                closer = threading.Thread(target=pub.close, args=(5.0,))
                if closing:
                    closer.start()
                    time.sleep(0.2)
                if closing is None:
                    with pytest.raises(eglcuda.Timeout):
                        sub.receive(0.1)
                    continue
                started = time.monotonic()
                with sub.receive(0.3) as message:
                    assert message.seq == sent[2] and message.frame.data == pattern(message.payload)
                assert time.monotonic() - started < (0.1 if closing else 1.0)
                if closing:
                    with pytest.raises(eglcuda.Dropped) as ended:
                        sub.receive(1.0)
                    assert ended.value.code == Reason.CLOSING
                    closer.join(10)
        finally:
            pub.close()


def test_a_close_from_a_signal_handler_during_attach_or_detach_is_a_closed_error():
    """close() from a signal handler that lands anywhere inside attach() or detach() (a timer
    every 0.3 ms over a loop of both): every failure is eglcuda.ClosedError, and a closed set
    keeps nothing attached."""
    reader, writer = os.pipe()
    others = []
    current = [eglcuda.WaitSet()]
    previous = signal.signal(signal.SIGALRM, lambda *_: current[0].close())
    errors: dict[str, int] = {}
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
        ended = time.monotonic() + 2.0
        while time.monotonic() < ended:
            waits = current[0]
            try:
                attachment = waits.attach(reader)
                waits.attach_interval(0.5)
                waits.detach(attachment)
            except eglcuda.ClosedError:
                errors["ClosedError"] = errors.get("ClosedError", 0) + 1
            except Exception as exc:  # noqa: BLE001 - counted: the assertion names it
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            if waits.closed:
                assert len(waits) == 0 and not waits._by_fd, waits
                others.append(waits)
                current[0] = eglcuda.WaitSet()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
        current[0].close()
        os.close(reader)
        os.close(writer)
    assert list(errors) == ["ClosedError"] and errors["ClosedError"] > 20, errors


def test_an_attachments_fields_are_read_only():
    """The set's schedule is made from an attachment's period and deadline: they cannot be
    changed behind it (a period of 0 made wait() divide by zero)."""
    reader, writer = os.pipe()
    try:
        with eglcuda.WaitSet() as waits:
            interval = waits.attach_interval(0.5)
            timed = waits.attach(reader, deadline=1.0)
            for attachment, name in ((interval, "period"), (timed, "deadline"), (timed, "source")):
                with pytest.raises(AttributeError):
                    setattr(attachment, name, 0)
            assert (interval.period, timed.deadline, timed.source) == (0.5, 1.0, reader)
            assert waits.wait(0) == []
    finally:
        os.close(reader)
        os.close(writer)


def test_a_promise_lasts_until_the_next_look_and_an_interrupt_keeps_the_frame(path):
    """A "message" promises a 'latest' subscriber's frame to the receive that follows, not to a
    receive after a later look that found nothing: then a stale frame is given back as without a
    wait set (Timeout). And a KeyboardInterrupt in the receive's wait for a newer frame, with a
    promised one kept, gives nothing up: the frames published next all come."""
    with publisher(path, False) as pub, subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
        for i in range(2):
            put(pub, bytes([i]))
        first = sub.receive(1.0)  # (the newest: holds it)
        put(pub, b"2")  # (announced: at its credit)
        attachment = waits.attach(sub)
        assert [event.kind for event in waits.wait(1.0)] == ["message"]
        put(pub, b"3")  # (skipped for it: a NOTICE)
        time.sleep(0.1)
        assert waits.wait(0.2) == []  # (this look read the NOTICE: frame 2 is stale, given back)
        first.release()
        for payload in (b"4", b"5", b"6"):  # (two announced, the third skipped: a NOTICE)
            put(pub, payload)
        time.sleep(0.1)
        waits.detach(attachment)
        with pytest.raises(eglcuda.Timeout):
            sub.receive(0.3)

    with publisher(path, False) as pub, subscriber(path, qos="latest") as sub, eglcuda.WaitSet() as waits:
        for i in range(2):
            put(pub, bytes([i]))
        first = sub.receive(1.0)  # (the newest: holds it)
        put(pub, b"2")
        waits.attach(sub)
        assert [event.kind for event in waits.wait(1.0)] == ["message"]
        for payload in (b"3", b"4"):  # (skipped: frame 2 is stale, but promised)
            put(pub, payload)
        first.release()
        conn = sub._conn
        next_frame, calls = conn.next_frame, []

        def interrupted(deadline):
            calls.append(deadline)
            if len(calls) == 2:  # (Ctrl-C in the wait for a newer frame, the promised one kept)
                raise KeyboardInterrupt
            return next_frame(deadline)

        conn.next_frame = interrupted
        try:
            with pytest.raises(KeyboardInterrupt):
                sub.receive(1.0)
        finally:
            conn.next_frame = next_frame
        got = []
        for payload in (b"6", b"7", b"8", b"9"):
            put(pub, payload)
            with sub.receive(1.0) as message:
                got.append(message.payload)
                assert message.frame.data == pattern(message.payload)
        assert got[-3:] == [b"7", b"8", b"9"], got  # (nothing of its credit was lost)
