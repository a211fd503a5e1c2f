"""Topics on the CPU, the publisher's pool: growth up to max_pool, frames coming free, timeouts
that say who holds them, and next_frame/publish/discard/release misuse that must not lose a
slot."""
from __future__ import annotations

import time

import numpy as np
import pytest

import eglcuda

from .helpers import NullPublisherBackend, Peer, pattern, publisher, put, subscriber


def test_pool_grows_for_latest_holders_up_to_max_pool(path):
    with publisher(path, pool=1, max_pool=3) as pub:
        subs = [subscriber(path, qos="latest") for _ in range(2)]
        put(pub, b"a")
        held = [s.receive(1) for s in subs]
        put(pub, b"b")
        held += [s.receive(1) for s in subs]  # each holds a and b: two pool frames
        assert pub.pool_size == 2
        frame = pub.next_frame()  # a third frame: the pool grows to max_pool
        assert pub.pool_size == 3
        pub.discard(frame)
        frame = pub.next_frame()
        pub.publish(frame, payload=b"c")  # both subscribers are full: skipped, still one free frame
        frame = pub.next_frame()
        pub.discard(frame)
        for message in held:
            assert message.frame.data == pattern(message.payload)
        held[0].release()
        for s in subs:
            s.close()


def test_a_killed_every_subscriber_s_frames_come_free_at_once(path):
    """With the pool at max_pool and every frame held by an 'every' subscriber that is then
    killed, next_frame returns as soon as the kernel reports its end, not after every_timeout."""
    with publisher(path, pool=2, max_pool=2, every_timeout=5.0) as pub:
        peer = Peer("subscribe", "--path", path, "--qos", "every", "--queue", "2", "--hold", "2")
        try:
            peer.wait_for(lambda m: m["event"] == "ready")
            put(pub, b"0")
            put(pub, b"1")
            peer.wait_for(lambda m: m.get("seq") == 1)
            peer.kill()
            started = time.monotonic()
            pub.discard(pub.next_frame(timeout=4))
            assert time.monotonic() - started < 1.0
        finally:
            peer.stop()


def test_pool_exhausted_by_latest_holders_at_max_pool_times_out(path):
    with publisher(path, pool=2, max_pool=2) as pub:
        sub = subscriber(path, qos="latest")
        put(pub, b"a")
        put(pub, b"b")  # both delivered and unread: both pool frames are held
        started = time.monotonic()
        with pytest.raises(eglcuda.Timeout, match="held"):
            pub.next_frame(timeout=0.1)
        assert time.monotonic() - started < 1.0
        sub.close()
        frame = pub.next_frame(timeout=1)  # its goodbye freed them
        pub.discard(frame)


def test_a_subscriber_leaving_during_publish_does_not_cost_a_pool_frame(path):
    """A full 'latest' subscriber that leaves between next_frame() and publish() is read (and
    dropped) while the frame is handed out: the frame must still come free once the others
    release it, so every pool frame keeps being used."""
    with publisher(path, pool=3, max_pool=3, every_timeout=2.0) as pub:
        latest = subscriber(path, qos="latest")  # first in the publisher's list: handed frames first
        every = subscriber(path, qos="every")
        put(pub, b"0")
        put(pub, b"1")  # latest holds its two: full
        for _ in range(2):
            every.receive().release()
        frame = pub.next_frame()
        latest.close()
        time.sleep(0.05)  # its goodbye is waiting when publish() reads it
        frame.data[:] = pattern(b"2")
        pub.publish(frame, payload=b"2")
        held = every.receive()  # frame 2's slot stays held while the next frames go out
        for key in (b"3", b"4", b"5"):
            put(pub, key)
            every.receive().release()
        assert held.frame.data == pattern(b"2")
        held.release()
        used = set()
        for i in range(12):
            frame = pub.next_frame()
            used.add(pub._pool.writing[id(frame)].index)
            frame.data[:] = pattern(b"%d" % i)
            pub.publish(frame, payload=b"%d" % i)
            with every.receive() as message:
                assert message.frame.data == pattern(b"%d" % i)
        assert used == {0, 1, 2} and pub.pool_size == 3 and not pub.dropped
        every.close()


def test_a_publish_refused_for_its_stream_keeps_the_frame(path):
    """A bad cuda_stream is a UsageError; the frame stays the caller's to publish or discard."""
    from eglcuda.frames.interop import stream_handle

    class Checking(NullPublisherBackend):  # takes the stream as the CUDA backends do
        def stream_handle(self, cuda_stream):
            return None if cuda_stream is None else stream_handle(cuda_stream)

    with publisher(path, pool=1, max_pool=1, _backend=Checking()) as pub:
        frame = pub.next_frame(1)
        with pytest.raises(eglcuda.UsageError, match="CUDA stream"):
            pub.publish(frame, cuda_stream="not a stream")
        # Values that only looked like a handle: floats (cut to another stream's number before),
        # negative or too large ones, also as NumPy scalars or from a stream object.
        for bad in (True, -1.0, 1.0, 2.0**64, np.float32(1), np.int64(-5), b"1", -1, 2**64, _NegativeStream()):
            with pytest.raises(eglcuda.UsageError, match="CUDA stream"):
                pub.publish(frame, cuda_stream=bad)
        pub.discard(frame)
        frame = pub.next_frame(1)  # the pool's only frame came back
        assert pub.publish(frame, cuda_stream=np.uint64(0)) == 0
    assert stream_handle(np.int64(7)) == 7 and stream_handle(_NegativeStream.Good()) == 99


@pytest.mark.parametrize("message_only", [False, True])
def test_a_publish_the_driver_refuses_uses_no_sequence_number(path, message_only):
    """The driver refusing the publish stream (destroyed, or another GPU's) raises from publish
    before anyone got the frame: the next frame takes its number, so no subscriber counts a frame
    that never was as skipped."""
    from eglcuda.errors import CUDAError

    backend = NullPublisherBackend(message_only=message_only)
    transport = backend.transports()[0]
    counted = transport.on_publish

    def on_publish(slot, cuda_stream):
        if cuda_stream == 13:
            raise CUDAError(400, "cuEventRecord", name="CUDA_ERROR_INVALID_HANDLE")
        counted(slot, cuda_stream)

    transport.on_publish = on_publish
    with publisher(path, pool=2, max_pool=2, _backend=backend) as pub:
        subs = [subscriber(path, qos="every", queue=2), subscriber(path, qos="latest")]
        assert put(pub, b"a") == 0
        frame = pub.next_frame(1)
        with pytest.raises(CUDAError, match="INVALID_HANDLE"):
            pub.publish(frame, cuda_stream=13, payload=b"x")
        with pytest.raises(eglcuda.UsageError):  # (the frame went back to the pool with it)
            pub.discard(frame)
        for sub in subs:
            with sub.receive(1) as first:
                assert (first.seq, first.skipped, first.payload) == (0, 0, b"a")
        assert put(pub, b"b") == 1
        for sub in subs:
            with sub.receive(1) as second:
                assert (second.seq, second.skipped, second.payload) == (1, 0, b"b")
                assert second.frame.data == pattern(b"b")
            sub.close()


class _NegativeStream:
    def __cuda_stream__(self):
        return (0, -3)

    class Good:
        def __cuda_stream__(self):
            return (0, 99)


def test_a_release_refused_for_its_stream_keeps_the_message(path):
    """A bad cuda_stream for Message.release() is a UsageError before anything changed: the
    message is still held and its release afterwards reaches the publisher (an 'every' queue of
    one would stay full for good otherwise)."""
    with publisher(path, every_timeout=30) as pub:
        sub = subscriber(path, qos="every", queue=1)
        put(pub, b"one", timeout=5)
        message = sub.receive(5)
        for bad in (-1.0, np.int64(-5), True):
            with pytest.raises(eglcuda.UsageError, match="CUDA stream"):
                message.release(cuda_stream=bad)
            assert not message.released
        message.release()
        put(pub, b"two", timeout=5)  # (the queue of one had room again)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"two")
        sub.close()


def test_a_publish_interrupted_while_handing_out_does_not_lose_the_slot(path, monkeypatch):
    """A KeyboardInterrupt (or any error) in the middle of publish()'s hand-out leaves the slot
    published: those that got the frame hold it, and it comes free once they let it go."""
    with publisher(path, pool=1, max_pool=1, every_timeout=30) as pub:
        sub = subscriber(path, qos="every", queue=2)
        put(pub, b"warm", timeout=5)
        sub.receive(5).release()

        def interrupted(*args):
            raise KeyboardInterrupt

        frame = pub.next_frame(5)
        with monkeypatch.context() as patch:
            patch.setattr(pub._delivery, "deliver", interrupted)
            with pytest.raises(KeyboardInterrupt):
                pub.publish(frame)
        frame = pub.next_frame(5)  # the pool's only frame came back
        frame.data[:] = pattern(b"after")
        pub.publish(frame)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"after")
        sub.close()


def test_a_pool_timeout_counts_the_frames_the_publisher_took_itself(path):
    with publisher(path, pool=2, max_pool=2) as pub:
        taken = [pub.next_frame(1), pub.next_frame(1)]
        with pytest.raises(eglcuda.Timeout, match="2 taken with next_frame"):
            pub.next_frame(0.05)
        for frame in taken:
            pub.discard(frame)


def test_discarding_after_close_says_the_publisher_is_closed(path):
    pub = publisher(path)
    frame = pub.next_frame(1)
    pub.close()
    with pytest.raises(eglcuda.ClosedError, match="closed"):
        pub.discard(frame)
