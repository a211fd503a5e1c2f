"""Topics on the CPU, frames released while GPU work still reads them (a done event recorded with
the release): the publisher asks whether the reading ended before writing a frame again, grows
or waits for it, and drops a subscriber whose reading never ends."""
from __future__ import annotations

import os
import threading
import time

import pytest

import eglcuda
from eglcuda.topics import protocol
from eglcuda.topics.protocol import Reason

from .helpers import NullPublisherBackend, pattern, publisher, put, subscriber


def _recording_subscribers(monkeypatch, reading_done):
    """Null subscribers whose every release says its done event was recorded (its GPU work may
    still read the frame), with ``reading_done(link, slot)`` answering the publisher's question."""
    import topics_null

    class Recorded(topics_null.NullSubscriberTransport):
        def release(self, obj, frame, cuda_stream):
            super().release(obj, frame, cuda_stream)
            return protocol.RELEASE_TAKEN | protocol.RELEASE_RECORDED, b""

    monkeypatch.setattr(topics_null, "NullSubscriberTransport", Recorded)
    monkeypatch.setattr(topics_null.NullLink, "reading_done", reading_done, raising=False)


class _TwoFrames(NullPublisherBackend):
    def allocate(self, *args):
        if self.allocated >= 2:
            from eglcuda.errors import CUDAError
            raise CUDAError(2, "cuMemAlloc", name="CUDA_ERROR_OUT_OF_MEMORY")
        return super().allocate(*args)


def test_growing_for_unsettled_frames_falls_back_when_memory_runs_out(path, monkeypatch):
    """When every free frame is still read on the GPU (a done event pending) the pool grows; an
    allocation that fails then is no error: the publisher waits, on the host, until the reading
    of one has ended, and writes that one."""
    asked: dict[int, int] = {}
    ended: list[int] = []

    def reading_done(link, slot):  # each frame's reading ends at the third question
        asked[slot.index] = asked.get(slot.index, 0) + 1
        if asked[slot.index] < 3:
            return False
        del asked[slot.index]
        ended.append(slot.index)
        return True

    _recording_subscribers(monkeypatch, reading_done)
    with publisher(path, pool=2, _backend=_TwoFrames()) as pub, subscriber(path, qos="every") as sub:
        for i in range(5):
            put(pub, b"%d" % i)
            with sub.receive() as message:
                assert message.frame.data == pattern(b"%d" % i)
        assert pub.pool_size == 2 and not pub.dropped
        assert len(ended) >= 3, ended  # frames 2-4 each waited for a slot's reading to end


def test_a_subscriber_whose_gpu_reading_never_ends_is_dropped(path, monkeypatch):
    """A subscriber released the only pool frame with a done event that never completes (its
    process hung on the GPU, say): the publisher waits for it on the host for every_timeout, then
    drops it with the reason on both sides, and goes on with the frame."""
    _recording_subscribers(monkeypatch, lambda link, slot: False)
    with publisher(path, pool=1, max_pool=1, every_timeout=0.3) as pub, subscriber(path, qos="every") as sub:
        put(pub, b"0")
        with sub.receive() as message:
            assert message.frame.data == pattern(b"0")
        started = time.monotonic()
        put(pub, b"1")
        assert 0.25 < time.monotonic() - started < 3.0
        (record,) = pub.dropped
        assert record.code == "QUEUE_FULL" and "GPU work still read a frame" in record.reason
        with pytest.raises(eglcuda.Dropped, match="GPU work") as caught:
            sub.receive(2)
        assert caught.value.code == Reason.QUEUE_FULL


def test_each_reader_gets_every_timeout_from_its_own_release(path, monkeypatch):
    """Two subscribers read the only pool frame. One releases it at once and its GPU reading ends
    at once; the other holds it 0.6 s, then releases it with GPU work that ends 0.1 s later
    (every_timeout 0.5 s). The publisher waits for that reading, counted from its own release,
    and drops nobody."""
    import topics_null

    released_at: dict[int, float] = {}
    lags = [0.0, 0.1]  # GPU reading after the release, per subscriber in the order they joined

    def released(link, slot, release):
        released_at[id(link)] = time.monotonic()
        return True

    def reading_done(link, slot):
        return time.monotonic() - released_at[id(link)] >= lags[link.transport.links.index(link)]

    _recording_subscribers(monkeypatch, reading_done)
    monkeypatch.setattr(topics_null.NullLink, "released", released, raising=False)
    with publisher(path, pool=1, max_pool=1, every_timeout=0.5) as pub:
        quick, holder = subscriber(path, qos="every"), subscriber(path, qos="latest")
        put(pub, b"0")
        with quick.receive(1) as message:
            assert message.frame.data == pattern(b"0")
        held = holder.receive(1)
        result: dict[str, int] = {}
        thread = threading.Thread(target=lambda: result.update(seq=put(pub, b"1")))
        thread.start()
        time.sleep(0.6)
        released = time.monotonic()
        held.release()
        thread.join(10)
        waited = time.monotonic() - released
        assert result == {"seq": 1} and not pub.dropped, pub.dropped
        assert 0.09 < waited < 1.0, waited
        with quick.receive(1) as message:
            assert message.frame.data == pattern(b"1")
        quick.close()
        holder.close()


def test_dropping_a_subscriber_that_held_frames_does_not_drop_their_finished_readers(path, monkeypatch):
    """An 'every' subscriber holds both pool frames past every_timeout; a 'latest' one released
    them at once (done events recorded, its reading long over). The publisher drops the first
    and writes the frames it held: the second is asked whether its reading ended (it has), not
    dropped for it."""
    _recording_subscribers(monkeypatch, lambda link, slot: True)
    with publisher(path, pool=2, max_pool=2, every_timeout=0.3) as pub:
        holder, quick = subscriber(path, qos="every"), subscriber(path, qos="latest")
        for key in (b"0", b"1"):
            put(pub, key)
            with quick.receive(1) as message:
                assert message.frame.data == pattern(key)
        put(pub, b"2")  # both frames held by `holder`: it is dropped after every_timeout
        (record,) = pub.dropped
        assert record.code == "QUEUE_FULL" and "held frames" in record.reason
        assert [s.qos for s in pub.subscribers] == ["latest"]
        with quick.receive(1) as message:
            assert message.frame.data == pattern(b"2")
        holder.close()
        quick.close()


def test_a_question_that_raises_loses_no_pool_frame(path, monkeypatch):
    asked = []

    def reading_done(link, slot):
        asked.append(slot.index)
        if len(asked) == 1:
            raise RuntimeError("the first question fails")
        return True

    _recording_subscribers(monkeypatch, reading_done)
    with publisher(path, pool=1, max_pool=1) as pub, subscriber(path, qos="every") as sub:
        put(pub, b"0")
        with sub.receive(1):
            pass
        with pytest.raises(RuntimeError, match="first question"):
            put(pub, b"1")
        put(pub, b"1", timeout=2)  # the frame is still the pool's
        with sub.receive(1) as message:
            assert message.frame.data == pattern(b"1")


def test_a_timeout_names_the_subscribers_still_reading_on_the_gpu(path, monkeypatch):
    _recording_subscribers(monkeypatch, lambda link, slot: False)
    with publisher(path, pool=1, max_pool=1, every_timeout=5) as pub, subscriber(path, qos="every") as sub:
        put(pub, b"0")
        with sub.receive(1):
            pass
        with pytest.raises(eglcuda.Timeout, match=rf"1 released but still read on the GPU by subscriber process\(es\) "
                                                  rf"{os.getpid()} \(every\)"):
            pub.next_frame(timeout=0.1)


def test_a_goodbye_read_with_a_release_is_a_leave_not_a_drop(path, monkeypatch):
    """A link whose frames come back later (an EGLStream's) fails to take them back while its
    subscriber's consumer disconnects; the goodbye that follows the release in the same read
    says that the subscriber left."""
    import topics_null
    from eglcuda.errors import EglCudaError

    def refuse(self):
        raise EglCudaError("the consumer is disconnecting")

    slow_close = topics_null.NullSubscriberTransport.close

    def close_slowly(self):
        time.sleep(0.3)  # an EGLStream consumer's disconnect may take that long
        slow_close(self)

    monkeypatch.setattr(topics_null.NullLink, "returns_later", True)
    monkeypatch.setattr(topics_null.NullLink, "released", lambda self, slot, release: False)
    monkeypatch.setattr(topics_null.NullLink, "reclaim", refuse, raising=False)
    monkeypatch.setattr(topics_null.NullSubscriberTransport, "close", close_slowly)
    with publisher(path) as pub:
        sub = subscriber(path)
        put(pub, b"a")
        sub.receive().release()
        leaving = threading.Thread(target=sub.close)
        leaving.start()
        time.sleep(0.05)  # the release and the goodbye are sent; the socket is still open
        pub.discard(pub.next_frame())
        leaving.join()
        assert pub.subscribers == [] and pub.dropped == []
