"""Topics on the CPU, delivery by quality of service: 'every' subscribers get every frame in
order, 'latest' ones the newest without slowing the publisher; skips, credit, queues, joining and
leaving, iteration."""
from __future__ import annotations

import os
import threading
import time

import pytest

import eglcuda
from eglcuda.topics import naming, protocol
from eglcuda.topics.protocol import Reason

from .helpers import NullPublisherBackend, NullSubscriberBackend, pattern, publisher, put, subscriber


def count_reads(pub) -> list[str]:
    """The publisher's reads of its subscribers' messages from now on (all of them, or one's), in order."""
    reads: list[str] = []
    for name in ("poll", "_read"):
        def counting(*args, _original=getattr(pub._delivery, name), _name=name):
            reads.append(_name)
            return _original(*args)
        setattr(pub._delivery, name, counting)
    return reads


def test_every_subscriber_gets_every_frame_in_order(path):
    """Two 'every' subscribers on threads of this process each get all 300 frames, in order, with
    intact bytes, payloads and timestamps; the publisher's stats agree."""
    with publisher(path, pool=5) as pub:  # the deeper queue holds 4, one more is being written
        subs = [subscriber(path, qos="every", queue=q) for q in (1, 4)]
        results: dict[int, list] = {0: [], 1: []}

        def consume(index, sub):
            for _ in range(300):
                with sub.receive(5) as message:
                    assert message.frame.data == pattern(message.payload)
                    results[index].append((message.seq, message.payload, message.skipped, message.timestamp_ns))

        threads = [threading.Thread(target=consume, args=(i, s)) for i, s in enumerate(subs)]
        for thread in threads:
            thread.start()
        started = time.monotonic_ns()
        for i in range(300):
            assert put(pub, b"frame %d" % i) == i
        for thread in threads:
            thread.join(20)
        for got in results.values():
            assert [seq for seq, *_ in got] == list(range(300))
            assert [payload for _, payload, *_ in got] == [b"frame %d" % i for i in range(300)]
            assert all(skipped == 0 for _, _, skipped, _ in got)
            assert all(started <= ts <= time.monotonic_ns() for *_, ts in got)
        infos = pub.subscribers
        assert [(i.qos, i.delivered, i.skipped) for i in infos] == [("every", 300, 0), ("every", 300, 0)]
        assert pub.pool_size == 5  # the pool never grew
        for sub in subs:
            sub.close()


def test_held_frames_are_never_written_again(path):
    """Frames a subscriber holds keep their bytes however many frames are published meanwhile;
    the pool grows for 'latest' holders instead of reusing their frames."""
    with publisher(path, pool=2, max_pool=16) as pub:
        every = subscriber(path, qos="every", queue=3)
        latest = subscriber(path, qos="latest")
        put(pub, b"first")
        kept_latest = latest.receive(1)
        kept_every = [every.receive(1)]
        for i in range(40):
            put(pub, b"n%d" % i, timeout=2)
            kept_every.append(every.receive(1))
            if len(kept_every) == 3:
                oldest = kept_every.pop(0)
                assert oldest.frame.data == pattern(oldest.payload)
                oldest.release()
        assert kept_latest.payload == b"first" and kept_latest.frame.data == pattern(b"first")
        assert all(m.frame.data == pattern(m.payload) for m in kept_every)
        assert pub.pool_size <= 2 + 2 + 3  # latest holds 2, every 3, one being written
        every.close()
        latest.close()


def test_latest_never_slows_the_publisher_and_then_sees_fresh_frames(path):
    with publisher(path, pool=4, every_timeout=0.2) as pub:
        sleeper = subscriber(path, qos="latest")  # never reads while the publisher runs
        started = time.monotonic()
        for i in range(500):
            put(pub, b"%d" % i)
        assert time.monotonic() - started < 2.0
        (info,) = pub.subscribers
        assert (info.delivered, info.skipped, info.outstanding) == (2, 498, 2)
        assert pub.pool_size == 4 and not pub.dropped
        # Its two frames are stale now: receive gives them back and waits for a fresh one.
        with pytest.raises(eglcuda.Timeout):
            sleeper.receive(0.05)
        put(pub, b"fresh")
        with sleeper.receive(1) as message:
            assert message.payload == b"fresh" and message.frame.data == pattern(b"fresh")
            assert message.seq == 500
        sleeper.close()


def test_a_stalled_latest_subscriber_is_not_read_before_every_frame(path):
    """A 'latest' subscriber that holds its two frames and reads nothing more is read with the
    others (at least every millisecond), not before each frame it cannot take: a stalled
    subscriber costs the publisher no read per frame."""
    with publisher(path, pool=4) as pub:
        stalled = subscriber(path, qos="latest")
        put(pub, b"0")
        put(pub, b"1")  # its credit: it holds two frames now
        reads = count_reads(pub)
        time.sleep(0.005)  # the frames it holds are older than the read interval now
        started = time.monotonic()
        for i in range(2, 302):
            put(pub, b"%d" % i)
        elapsed = time.monotonic() - started
        assert elapsed < 0.1, f"300 publishes took {elapsed:.3f} s: too slow a machine for this test to tell"
        # At most a read per millisecond from next_frame, and one more from publish when it ran
        # a millisecond after that read: far fewer than one per frame.
        assert len(reads) <= 2 * elapsed / 0.001 + 4, (len(reads), elapsed)
        (info,) = pub.subscribers
        assert (info.delivered, info.outstanding) == (2, 2)
        stalled.close()


def test_a_latest_subscriber_taking_a_few_frames_of_a_fast_topic_costs_no_read_per_frame(path):
    """A publisher flat out and a 'latest' subscriber (frames through its ring) that takes a frame
    every millisecond: the publisher reads its subscribers' messages when one released a frame (or
    every millisecond), not before each frame, as it did while that subscriber's frames were young;
    every frame the subscriber gets was published after it asked, intact."""
    backend = NullPublisherBackend(message_only=True)
    with publisher(path, pool=8, _backend=backend) as pub:
        sub = subscriber(path, qos="latest")
        put(pub, b"0")
        reads = count_reads(pub)
        newest = [0]
        stop = threading.Event()
        taken: list[tuple[int, int]] = []

        def take():
            while not stop.is_set():
                asked = newest[0]
                try:
                    with sub.receive(0.5) as message:
                        assert message.frame.data == pattern(message.payload)
                        taken.append((asked, message.seq))
                except eglcuda.Timeout:
                    continue
                time.sleep(0.001)

        thread = threading.Thread(target=take)
        thread.start()
        try:
            started = time.monotonic()
            for i in range(1, 3001):
                newest[0] = put(pub, b"%d" % i)
                time.sleep(0)  # (the subscriber's thread gets the GIL)
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            thread.join(5)
        assert len(taken) >= 5, "the subscriber took too few frames for this test to tell"
        assert all(seq >= asked for asked, seq in taken)
        # A read each millisecond, and one or two for each frame it took (its release of that frame
        # and of those it let go as stale), where before it was one a frame while its frames were
        # young (measured: 1,651 reads for 250 frames taken in 0.30 s before, 323
        # for 273 in 0.34 s after).
        assert len(reads) <= elapsed / 0.001 + 2 * len(taken) + 10, (len(reads), elapsed, len(taken))
        (info,) = pub.subscribers
        assert info.delivered + info.skipped == 3001  # (each frame handed to it or skipped, once)
        sub.close()


def test_a_release_sent_by_socket_is_counted_in_the_ring_the_publisher_reads(path):
    """A release that goes by socket (one with transport data, as a CUDA IPC release with its done
    event) moves the ring's count of such releases, which the publisher asks before reading that
    subscriber's socket; a release into the ring does not. Every frame comes back to the pool."""
    backend = NullPublisherBackend(message_only=True)
    with publisher(path, pool=4, _backend=backend) as pub:
        sub = subscriber(path, qos="latest")
        put(pub, b"0")
        (member,) = pub._delivery.subs
        transport = sub._conn.transport
        plain = transport.release

        def with_data(obj, frame, cuda_stream):
            flags, _ = plain(obj, frame, cuda_stream)
            return flags, b"\x01"  # (transport data: the release goes by socket)

        counts = []
        for i, by_socket in enumerate([True, False, True, True, False]):
            transport.release = with_data if by_socket else plain
            with sub.receive(2) as message:
                assert message.frame.data == pattern(message.payload)
            counts.append(member.ring.u32(448))
            put(pub, b"%d" % (i + 1))
        assert counts == [1, 1, 2, 3, 3]
        deadline = time.monotonic() + 2
        while pub.subscribers[0].outstanding > 1 and time.monotonic() < deadline:
            pub.discard(pub.next_frame(1))
        assert pub.subscribers[0].outstanding <= 1  # (each release was read: only the newest frame is held)
        sub.close()


def test_a_slow_latest_subscriber_gets_the_newest_frames(path):
    """A publisher at ~2 kHz and a subscriber that takes 10 ms per frame: every frame it gets
    was published after it asked (or is the newest at that moment), and it skips the rest."""
    with publisher(path, pool=4) as pub:
        sub = subscriber(path, qos="latest")
        stop = threading.Event()
        newest = [-1]

        def run():
            while not stop.is_set():
                newest[0] = put(pub, b"%d" % (newest[0] + 1))
                time.sleep(0.0005)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            seqs = []
            for _ in range(10):
                asked = newest[0]
                with sub.receive(2) as message:
                    assert message.frame.data == pattern(message.payload)
                    assert message.seq >= asked
                    seqs.append(message.seq)
                time.sleep(0.01)
        finally:
            stop.set()
            thread.join(10)
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert seqs[-1] - seqs[0] > 20  # it skipped frames rather than fall behind
        sub.close()


def test_every_full_queue_drops_the_subscriber_with_a_reason_on_both_sides(path):
    with publisher(path, pool=8, every_timeout=0.2) as pub:
        stuck = subscriber(path, qos="every", queue=2)
        healthy = subscriber(path, qos="every", queue=8)
        durations = []
        for i in range(6):
            started = time.monotonic()
            put(pub, b"%d" % i)
            durations.append(time.monotonic() - started)
            with healthy.receive(1) as message:
                assert message.seq == i
        assert max(durations) >= 0.18 and sum(durations) < 1.0  # waited once, for every_timeout
        (record,) = pub.dropped
        assert record.code == "QUEUE_FULL" and "every_timeout" in record.reason
        assert [s.qos for s in pub.subscribers] == ["every"]
        got = [stuck.receive(1).seq, stuck.receive(1).seq]
        assert got == [0, 1]  # what it had is still readable
        with pytest.raises(eglcuda.Dropped, match="every_timeout") as caught:
            stuck.receive(1)
        assert caught.value.code == Reason.QUEUE_FULL
        with pytest.raises(eglcuda.Dropped):  # and it stays disconnected
            stuck.receive(1)
        stuck.close()
        healthy.close()


def test_late_join_leave_and_rejoin(path):
    with publisher(path, fps=30.0) as pub:
        for i in range(5):
            put(pub, b"%d" % i)
        sub = subscriber(path, qos="every")
        info = sub.info
        assert (info.width, info.height, info.format, info.layout, info.fps, info.transport) == \
            (64, 32, eglcuda.ColorFormat.Y, eglcuda.Layout.PITCH, 30.0, "null")
        assert info.next_seq == 5 and info.publisher_pid == os.getpid() and info.instance == pub.instance
        put(pub, b"5")
        with sub.receive(1) as message:
            assert message.seq == 5
        sub.close()
        put(pub, b"6")
        assert pub.subscribers == [] and pub.dropped == []  # leaving is not a drop
        again = subscriber(path, qos="every")
        put(pub, b"7")
        assert again.receive(1).seq == 7
        again.close()


def test_leaving_with_unread_messages_is_still_a_goodbye(path):
    """A subscriber that closes with frames and notices unread (a latest one that fell behind)
    reads them away first: closing a UNIX socket with unread messages would reset the connection
    and lose its goodbye."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="latest")
        for i in range(5):
            put(pub, b"%d" % i)
        sub.close()
        put(pub, b"5")
        assert pub.subscribers == [] and pub.dropped == []


def test_an_exclusive_transport_holds_one_message(path):
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", _backend=NullSubscriberBackend(exclusive=True))
        put(pub, b"a")
        put(pub, b"b")
        first = sub.receive(1)
        with pytest.raises(eglcuda.UsageError, match="release"):
            sub.receive(1)
        first.release()
        first.release()  # twice is fine
        assert sub.receive(1).seq == 1
        sub.close()


def test_iteration_ends_when_the_publisher_closes(path):
    pub = publisher(path)
    sub = subscriber(path, qos="every", queue=8)
    for i in range(5):
        put(pub, b"%d" % i)
    pub.close(timeout=0.1)
    assert [m.seq for m in sub] == [0, 1, 2, 3, 4]
    with pytest.raises(eglcuda.Dropped, match="closed"):
        sub.receive(0.1)
    assert not os.path.exists(path) and not os.path.exists(naming.lock_path(path))
    sub.close()


def test_a_latest_subscriber_of_a_message_only_transport_keeps_up_to_four_frames(path):
    """Through a transport whose FRAME message is the whole hand-over (CUDA IPC), the publisher
    lets a 'latest' subscriber have four frames outstanding (it still holds at most two): a
    stalled one keeps four, is skipped after that and told so; once it reads again it gets a
    frame published after it asked, intact."""
    backend = NullPublisherBackend(message_only=True)
    with publisher(path, pool=8, _backend=backend) as pub:
        sub = subscriber(path, qos="latest")
        for i in range(7):
            put(pub, b"%d" % i)
        (info,) = pub.subscribers
        assert (info.delivered, info.outstanding, info.skipped) == (4, 4, 3)
        assert pub.pool_size <= 8  # four kept, the others written again
        stop = threading.Event()

        def keep_publishing():
            i = 7
            while not stop.is_set():
                put(pub, b"%d" % i)
                i += 1
                time.sleep(0.005)

        worker = threading.Thread(target=keep_publishing)
        worker.start()
        try:
            # Frame 3 is the newest announced to it, but it was told of a newer one: not stale.
            with sub.receive(5) as message:
                assert message.seq >= 7 and message.frame.data == pattern(message.payload)
        finally:
            stop.set()
            worker.join(5)
        sub.close()


@pytest.mark.parametrize("message_only", [False, True], ids=["socket", "ring"])
def test_a_latest_subscriber_gets_the_last_frame_announced_before_the_close(path, message_only):
    """Frames are announced to a 'latest' subscriber that has not read yet (as many as its
    credit: none skipped), then the publisher closes: its goodbye waits behind them. The next
    receive takes the newest (the last frame published, intact), reading past it to the goodbye
    without losing it; the receive after that says the topic closed."""
    backend = NullPublisherBackend(message_only=message_only)
    pub = publisher(path, _backend=backend)
    sub = subscriber(path, qos="latest")
    frames = protocol.credit(protocol.Qos.LATEST, 1, message_only)
    for i in range(frames):
        put(pub, b"%d" % i)
    (info,) = pub.subscribers
    assert (info.delivered, info.skipped) == (frames, 0)
    pub.close(timeout=0.1)
    with sub.receive(1) as message:
        assert message.seq == frames - 1
        assert message.frame.data == pattern(b"%d" % (frames - 1))
    with pytest.raises(eglcuda.Dropped, match="closed") as raised:
        sub.receive(0.1)
    assert raised.value.code == protocol.Reason.CLOSING
    sub.close()
