"""CUDA producer -> CUDA consumer in one process against the fake driver: every byte of every
frame, order, frame numbers, return semantics, timeouts, disconnects, and errors raised before
the driver is asked."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat, Layout, StreamState

from .harness import fake, fake_driver_test
from .kit import assert_frame_equals, display, fill_random, rng, stream_of

FORMATS = [ColorFormat.ARGB, ColorFormat.NV12, ColorFormat.YUV420_PLANAR, ColorFormat.Y]


@pytest.mark.parametrize("fifo_length", [0, 3], ids=["mailbox", "fifo3"])
@pytest.mark.parametrize("layout", [Layout.PITCH, Layout.ARRAY], ids=lambda l: l.value)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@fake_driver_test
def test_every_byte_arrives_in_order(fmt, layout, fifo_length):
    """Six frames through a ring of three: every byte of every plane as presented, numbers one
    apart, the counters of EGL and eglcuda in step, the frames coming back in present order."""
    random = rng()
    width, height = 34, 18
    with stream_of(width, height, fifo_length=fifo_length, format=fmt, layout=layout) as (_, stream, producer, consumer):
        assert stream.state is StreamState.EMPTY
        ring = [producer.allocate_frame() for _ in range(3)]
        last = None
        for round_ in range(6):
            frame = ring[round_] if round_ < 3 else producer.return_frame(timeout_us=1_000_000)
            assert frame is not None, f"round {round_}: no frame came back"
            if round_ >= 3:
                assert frame is ring[round_ - 3], "frames came back out of present order"
            expected = fill_random(frame, random)
            producer.present(frame)
            assert stream.state is StreamState.NEW_FRAME
            assert stream.producer_frame == producer.frames_presented == round_ + 1
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert acquired.is_new
                if last is not None:
                    assert acquired.number == last + 1
                last = acquired.number
                assert acquired.number == stream.consumer_frame == stream.producer_frame
                assert (acquired.width, acquired.height, acquired.layout) == (width, height, layout)
                assert len(acquired.planes) == len(expected)
                assert_frame_equals(acquired, expected)
            assert stream.state is StreamState.OLD_FRAME
        assert producer.frames_presented == consumer.frames_acquired == 6


@pytest.mark.parametrize("fmt", [ColorFormat.ARGB, ColorFormat.NV12], ids=lambda f: f.name)
@fake_driver_test
def test_pitch_layout_of_a_wrapped_frame(fmt):
    """A frame wrapped from raw device memory with a pitch of its own (padding after every row):
    the consumer sees the same pitch and the rows, not the padding."""
    from eglcuda._bind import cuda as driver

    random = rng()
    width, height = 40, 12
    geometry = eglcuda.plane_geometry(fmt, width, height, 0)
    pitch = max(g.row_bytes for g in geometry) + 72  # not a multiple of anything in particular
    pitch += pitch % 2
    size = sum(pitch * g.height for g in geometry)
    with display() as opened:
        device = eglcuda.get_device(0)
        device.make_current()
        base = driver.mem_alloc(size, "a test buffer")
        try:
            frame = eglcuda.Frame.from_pointer(base, width, height, pitch, fmt)
            # Fill rows and padding with noise, then the rows with the data.
            noise = random.integers(0, 256, size, dtype=np.uint8)
            driver.copy_2d(0, ("host", noise, size), ("device", base, size), size, 1, True)
            expected = fill_random(frame, random)
            with opened.create_stream() as stream:
                consumer = stream.connect_cuda_consumer()
                producer = stream.connect_cuda_producer(width, height)
                producer.present(frame)
                with consumer.acquire() as acquired:
                    assert acquired.pitch == pitch
                    assert [p.pitch for p in acquired.planes] == [g.pitch for g in
                                                                    eglcuda.plane_geometry(fmt, width, height, pitch)]
                    assert_frame_equals(acquired, expected)
            frame.close()
        finally:
            driver.mem_free(base)


@fake_driver_test
def test_frames_iterator_with_a_producer_thread_fifo():
    """A producer thread presents 150 distinct payloads through FIFO 4; the consumer's frames()
    loop sees all of them, in order, byte for byte; leaving the loop releases the last frame, and
    once the producer disconnects the loop ends by itself."""
    from .kit import produce_payloads

    random = rng()
    count, width, height = 150, 40, 12
    payloads = [random.integers(0, 256, (height, width, 4), dtype=np.uint8) for _ in range(count)]
    received, errors = [], []
    with stream_of(width, height, fifo_length=4) as (_, stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        thread = threading.Thread(target=produce_payloads, args=(producer, pool, payloads, errors, True))
        thread.start()
        for acquired in consumer.frames(timeout_us=2_000_000):
            if acquired.is_new:
                received.append(acquired.planes[0].to_numpy())
            if len(received) == count:
                break
        thread.join(30)
        assert not errors, errors
        assert consumer._held is None and acquired.released
        producer.close()
        assert list(consumer.frames(timeout_us=2_000_000)) == []
    assert len(received) == count
    for index, (got, want) in enumerate(zip(received, payloads)):
        assert np.array_equal(got, want), f"frame {index} out of order or corrupted"


@fake_driver_test(env={"FAKE_EGL_FRAME_BASE": "1000000007"})
def test_frame_numbers_from_a_counter_that_does_not_start_at_zero():
    """EGL's frame counter need not start at 0: numbers are EGL's, derived ones included."""
    with stream_of(16, 8) as (_, stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        numbers = []
        for frame in (a, b, a, b, a):
            producer.present(frame)
            with consumer.acquire() as acquired:
                numbers.append(acquired.number)
                assert acquired.number == stream.consumer_frame
            producer.return_frame(1_000_000)
        assert numbers == [1_000_000_008 + i for i in range(5)]
        assert consumer._numbers_derived >= 3


@fake_driver_test
def test_return_frame_semantics_with_reuse():
    """Reuse on (the default): the stream keeps the newest frame. The first return after the
    first present answers None at once; a frame comes back once a newer one is presented; in
    mailbox mode a frame the consumer never saw comes back too."""
    with stream_of(64, 48) as (_, stream, producer, consumer):
        a, b, c = (producer.allocate_frame() for _ in range(3))
        producer.present(a)
        consumer.acquire().release()
        started = time.perf_counter()
        assert producer.return_frame(timeout_us=500_000) is None
        assert time.perf_counter() - started < 0.25, "with one frame in flight the answer must be immediate"
        assert producer.in_flight == 1
        producer.present(b)
        assert producer.return_frame(timeout_us=1_000_000) is a, "the released frame is no longer the newest"
        producer.present(c)  # b is dropped unseen (mailbox)
        assert producer.return_frame(timeout_us=1_000_000) is b
        with consumer.acquire() as acquired:
            assert acquired.number == 3
            assert producer.return_frame(timeout_us=50_000) is None  # c is held
        assert producer.return_frame(timeout_us=50_000) is None  # c is the newest
        assert producer.in_flight == 1


@fake_driver_test
def test_frames_come_back_out_of_present_order_as_themselves():
    """A frame presented later can come back first (mailbox: the consumer holds an older one while
    a newer one is dropped unseen). Each return gives back the very Frame the driver returned, and
    a frame still in flight cannot be presented again."""
    with stream_of(32, 16) as (_, stream, producer, consumer):
        a, b, c, d = (producer.allocate_frame() for _ in range(4))
        producer.present(a)
        held = consumer.acquire()
        producer.present(b)
        producer.present(c)  # b is dropped unseen while a is held: b comes back before a
        assert producer.in_flight == 3
        assert producer.return_frame(timeout_us=1_000_000) is b
        assert set(producer._in_flight.values()) == {a, c}
        with pytest.raises(eglcuda.UsageError, match="in flight"):
            producer.present(a)
        held.release()
        assert producer.return_frame(timeout_us=1_000_000) is a
        assert list(producer._in_flight.values()) == [c]
        producer.present(d)
        producer.present(b)  # c, then d, dropped unseen: both come back
        back = {producer.return_frame(timeout_us=1_000_000), producer.return_frame(timeout_us=1_000_000)}
        assert back == {c, d}
        assert list(producer._in_flight.values()) == [b] and producer.in_flight == 1
        assert repr(producer).endswith("1 in flight>")


@fake_driver_test
def test_return_frame_without_reuse():
    with stream_of(64, 48, reuse_last_frame=False) as (_, stream, producer, consumer):
        assert not stream.reuse_last_frame
        a = producer.allocate_frame()
        producer.present(a)
        consumer.acquire().release()
        assert producer.return_frame(timeout_us=1_000_000) is a
        assert producer.in_flight == 0
        with pytest.raises(eglcuda.Timeout):  # nothing left in the stream to hand out again
            consumer.acquire(timeout_us=20_000)


@fake_driver_test
def test_an_acquire_the_driver_timed_out_is_a_timeout_whatever_the_state_says_after():
    """The driver's timeout answer (CUDA_ERROR_LAUNCH_TIMEOUT) to an acquire is a Timeout even when
    the state read after it is not EMPTY: a producer thread may have presented a frame since
    (NEW_FRAME), or a stream without reuse holds the frame the consumer saw last (OLD_FRAME)."""
    with stream_of(64, 48, reuse_last_frame=False) as (_, stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        producer.present(a)
        consumer.acquire().release()
        producer.present(b)
        assert stream.state is StreamState.NEW_FRAME
        fake.fail("cuEGLStreamConsumerAcquireFrame", 702)  # as if b came just after the wait ended
        with pytest.raises(eglcuda.Timeout, match="no new frame arrived within 20000 us .stream NEW_FRAME"):
            consumer.acquire(timeout_us=20_000)
        fake.fail("cuEGLStreamConsumerAcquireFrame", 999)  # any other refusal stays the driver's error
        with pytest.raises(eglcuda.CUDAError):
            consumer.acquire(timeout_us=20_000)
        with consumer.acquire(timeout_us=1_000_000) as acquired:  # b is still there
            assert acquired.is_new
        assert producer.return_frame(timeout_us=1_000_000) is a


@fake_driver_test
def test_timeout_before_any_present():
    with stream_of(16, 16) as (_, stream, producer, consumer):
        started = time.perf_counter()
        # (the message names the timeout asked for: the first acquire said the time left after
        # it waited for the producer, 0 us)
        with pytest.raises(eglcuda.Timeout, match="within 100000 us .*EMPTY"):
            consumer.acquire(timeout_us=100_000)
        assert 0.09 < time.perf_counter() - started < 2
        # A timeout changes nothing: the next frame comes through.
        producer.present(producer.allocate_frame())
        consumer.acquire(timeout_us=100_000).release()


@fake_driver_test
def test_timeout_while_no_producer_connected():
    with display() as opened, opened.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        acquires = fake.calls("cuEGLStreamConsumerAcquireFrame")
        with pytest.raises(eglcuda.Timeout, match="CONNECTING"):
            consumer.acquire(timeout_us=30_000)
        # eglcuda must not reach the driver's acquire before a producer connects (docs/platforms.md).
        assert fake.calls("cuEGLStreamConsumerAcquireFrame") == acquires


@fake_driver_test
def test_stream_disconnected_after_the_producer_closes():
    random = rng()
    with stream_of(16, 8) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, random)
        producer.present(frame)
        seen = []
        for acquired in consumer.frames(timeout_us=100_000):
            assert_frame_equals(acquired, expected)
            seen.append(acquired.number)
            producer.close()
        assert seen == [1]
        assert stream.state is StreamState.DISCONNECTED
        started = time.perf_counter()
        with pytest.raises(eglcuda.StreamDisconnected):
            consumer.acquire(timeout_us=100_000)
        assert time.perf_counter() - started < 2
        assert fake.count("held") == 0, "the re-acquired last frame was not released"
        frame.close()  # the producer is gone: the frame may be freed


@fake_driver_test
def test_consumer_gone_present_and_return():
    """Once the consumer leaves, a present raises StreamDisconnected, and frames it held or had
    not seen never come back: return_frame says so instead of waiting in vain."""
    with stream_of(16, 8) as (_, stream, producer, consumer):
        a, b, c = (producer.allocate_frame() for _ in range(3))
        producer.present(a)
        consumer.acquire()  # held when the consumer goes
        producer.present(b)  # never seen
        consumer.close()
        assert stream.state is StreamState.DISCONNECTED
        with pytest.raises(eglcuda.ClosedError):
            consumer.acquire()
        started = time.perf_counter()
        with pytest.raises(eglcuda.StreamDisconnected):
            producer.present(c)
        assert time.perf_counter() - started < 1
        assert producer.return_frame(timeout_us=0) is None
        with pytest.raises(eglcuda.StreamDisconnected, match="will not come back"):
            producer.return_frame(timeout_us=20_000)
        assert producer.in_flight == 2


@fake_driver_test
def test_acquire_waits_for_a_frame_presented_meanwhile():
    random = rng()
    with stream_of(16, 8) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, random)
        timer = threading.Timer(0.05, producer.present, args=(frame,))
        started = time.perf_counter()
        timer.start()
        with consumer.acquire(timeout_us=2_000_000) as acquired:
            assert 0.04 < time.perf_counter() - started < 1.5
            assert acquired.is_new and acquired.number == 1
            assert_frame_equals(acquired, expected)
        timer.join()


@fake_driver_test(env={"FAKE_FIFO_WAIT_MS": "100"})
def test_present_into_a_fifo_nobody_drains_fails_after_the_fakes_bound():
    """The fake's documented bound on a full FIFO (the real driver would wait for ever)."""
    with stream_of(16, 8, fifo_length=1) as (_, stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        producer.present(a)
        with pytest.raises(eglcuda.CUDAError) as info:
            producer.present(b)
        assert info.value.code == 909 and info.value.name == "CUDA_ERROR_TIMEOUT"
        assert info.value.call == "cuEGLStreamProducerPresentFrame"
        assert producer.in_flight == 1
        with consumer.acquire() as acquired:  # the producer goes on once there is room
            assert acquired.number == 1
        producer.present(b)
        assert producer.in_flight == 2


# ---- bad input is refused before the driver ---------------------------------------------------

@fake_driver_test
def test_bad_input_never_reaches_the_driver():
    presents = "cuEGLStreamProducerPresentFrame"
    with stream_of(64, 48, format=ColorFormat.ARGB, layout=Layout.PITCH) as (opened, stream, producer, consumer):
        frame = producer.allocate_frame()
        before = fake.calls(presents)
        with eglcuda.Frame.allocate(64, 47) as short, eglcuda.Frame.allocate(64, 48, ColorFormat.NV12) as nv12, \
                eglcuda.Frame.allocate(64, 48, layout=Layout.ARRAY) as array:
            for bad, message in ((short, "64x47"), (nv12, "NV12"), (array, "layout")):
                with pytest.raises(eglcuda.UsageError, match=message):
                    producer.present(bad)
                with pytest.raises(eglcuda.UsageError, match=message):
                    producer.present_and_return(bad)
        for bad in ("not a frame", np.zeros((48, 64, 4), np.uint8), None):
            with pytest.raises(eglcuda.UsageError, match="takes an eglcuda.Frame"):
                producer.present(bad)
        for timeout in (-1, 2**31, 1.5, True, "10", None, np.float64(5), np.bool_(True)):
            for call in (lambda: producer.return_frame(timeout), lambda: producer.present_and_return(frame, None, timeout),
                         lambda: consumer.acquire(timeout), lambda: consumer.acquire_next(timeout_us=timeout)):
                with pytest.raises(eglcuda.UsageError, match="microseconds"):
                    call()
        managed = eglcuda.Frame.allocate(64, 48, memory="managed")
        wrapped = eglcuda.Frame.from_pointer(managed.planes[0].pointer, 64, 48, managed.pitch)  # the driver says managed
        for bad in (managed, wrapped):
            with pytest.raises(eglcuda.Unsupported, match="managed"):
                producer.present(bad)
        assert fake.calls(presents) == before, "bad input reached the driver"
        assert producer.frames_presented == 0 and producer.in_flight == 0 and consumer.frames_acquired == 0
        wrapped.close()
        managed.close()
        for options in ({"fifo_length": -1}, {"latency_us": -5}, {"fifo_length": "4"}, {"fifo_length": True},
                        {"latency_us": np.float64(5)}):
            with pytest.raises(eglcuda.UsageError):
                opened.create_stream(**options)
        with pytest.raises(eglcuda.UsageError, match="already has a consumer"):
            stream.connect_cuda_consumer()
        with pytest.raises(eglcuda.UsageError, match="cannot take a producer"):
            stream.connect_cuda_producer(64, 48)


@fake_driver_test
def test_in_flight_limits_are_checked_before_the_driver():
    with stream_of(8, 8) as (_, stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(65)]
        for frame in frames[:64]:
            producer.present(frame)
        presents = fake.calls("cuEGLStreamProducerPresentFrame")
        with pytest.raises(eglcuda.UsageError, match="64 frames"):
            producer.present(frames[64])
        with pytest.raises(eglcuda.UsageError, match="already in flight"):
            producer.present(frames[0])
        assert fake.calls("cuEGLStreamProducerPresentFrame") == presents
        with pytest.raises(eglcuda.UsageError, match="disconnect"):
            frames[0].close()


@fake_driver_test
def test_a_producer_before_the_consumer_never_reaches_the_driver():
    """(The refusal itself, and the misuse of acquired frames: tests/stream_scenarios.py.)"""
    with display() as opened, opened.create_stream() as stream:
        with pytest.raises(eglcuda.UsageError, match="consumer first"):
            stream.connect_cuda_producer(64, 48)
        assert fake.calls("cuEGLStreamProducerConnect") == 0


# ---- the legacy default stream on a stream shared with another process ----------------------------

SYNCHRONIZE = "cuStreamSynchronize"
RETURN = "cuEGLStreamProducerReturnFrame"


@pytest.mark.parametrize("shared", [False, True], ids=["this-process", "shared"])
@fake_driver_test
def test_calls_naming_the_legacy_stream_wait_for_it_on_a_shared_stream(shared):
    """Between processes the driver does not order a present or a release that names the legacy
    default stream after that stream's work (driver 580, docs/streams.md). On a stream shared with
    another process eglcuda synchronizes the legacy default stream on the host before such a
    present (``present(frame)``, ``cuda_stream=0`` or ``1``, ``present_and_return``) and before
    such a release (a consumer on ``cuda_stream=0``: ``release``, ``acquire_next``), once per call;
    never for another CUDA stream, nor on a stream of this process alone. Every frame's bytes
    arrive."""
    from eglcuda._bind import cuda as _cuda

    random = rng()
    each = 1 if shared else 0
    with display() as opened, opened.create_stream(fifo_length=4, cross_process=shared) as stream:
        consumer = stream.connect_cuda_consumer(cuda_stream=0)
        producer = stream.connect_cuda_producer(24, 10)
        created = _cuda.stream_create()
        ring = [producer.allocate_frame() for _ in range(4)]

        def syncs_of(call):
            before = fake.calls(SYNCHRONIZE)
            result = call()
            return fake.calls(SYNCHRONIZE) - before, result

        for index, (cuda_stream, expected) in enumerate([(None, each), (0, each), (1, each), (created, 0)]):
            frame = ring[index % 2]
            if index >= 2:
                assert producer.return_frame(1_000_000) is frame
            data = fill_random(frame, random)
            assert syncs_of(lambda: producer.present(frame, cuda_stream=cuda_stream))[0] == expected, cuda_stream
            acquired = consumer.acquire(timeout_us=1_000_000)
            assert_frame_equals(acquired, data)
            assert syncs_of(acquired.release)[0] == each  # the consumer's stream is the legacy one
        data = fill_random(ring[2], random)
        assert syncs_of(lambda: producer.present_and_return(ring[2], timeout_us=0))[0] == each
        held = consumer.acquire(timeout_us=1_000_000)
        assert_frame_equals(held, data)
        data = fill_random(ring[3], random)
        assert syncs_of(lambda: producer.present(ring[3], cuda_stream=created))[0] == 0
        count, acquired = syncs_of(lambda: consumer.acquire_next(timeout_us=1_000_000))
        assert count == each and held.released
        assert_frame_equals(acquired, data)
        acquired.release()
        _cuda.stream_destroy(created)


@fake_driver_test
def test_a_failed_legacy_synchronize_presents_and_releases_nothing():
    """The synchronize before a present or a release on a shared stream fails: a CUDAError naming
    cuStreamSynchronize; the frame is not in flight (presenting it again works), the acquired frame
    stays held (releasing it again works)."""
    random = rng()
    with display() as opened, opened.create_stream(fifo_length=4, cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer(cuda_stream=0)
        producer = stream.connect_cuda_producer(24, 10)
        frame = producer.allocate_frame()
        data = fill_random(frame, random)
        presents = fake.calls("cuEGLStreamProducerPresentFrame")
        fake.fail(SYNCHRONIZE, 1)  # CUDA_ERROR_INVALID_VALUE
        with pytest.raises(eglcuda.CUDAError) as info:
            producer.present(frame)
        assert (info.value.call, info.value.code) == (SYNCHRONIZE, 1), str(info.value)
        assert fake.calls("cuEGLStreamProducerPresentFrame") == presents and producer.in_flight == 0
        producer.present(frame)
        acquired = consumer.acquire(timeout_us=1_000_000)
        releases = fake.calls("cuEGLStreamConsumerReleaseFrame")
        fake.fail(SYNCHRONIZE, 1)
        with pytest.raises(eglcuda.CUDAError) as info:
            acquired.release()
        assert info.value.call == SYNCHRONIZE and fake.calls("cuEGLStreamConsumerReleaseFrame") == releases
        assert not acquired.released
        assert_frame_equals(acquired, data)
        acquired.release()
        assert acquired.released


@fake_driver_test
def test_a_failed_legacy_synchronize_in_the_fused_calls():
    """The same failure inside ``present_and_return`` (nothing presented, nothing taken back, the
    frame not in flight) and inside ``acquire_next`` (the held frame stays held and usable, the
    next frame stays in the stream; the next ``acquire_next`` releases the one and takes the
    other). On a stream that disconnects meanwhile the failure is still the synchronize's
    CUDAError, not StreamDisconnected."""
    random = rng()
    with display() as opened, opened.create_stream(fifo_length=4, cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer(cuda_stream=0)
        producer = stream.connect_cuda_producer(24, 10)
        ring = [producer.allocate_frame() for _ in range(3)]
        first = fill_random(ring[0], random)
        fake.fail(SYNCHRONIZE, 1)
        with pytest.raises(eglcuda.CUDAError) as info:
            producer.present_and_return(ring[0], timeout_us=0)
        assert info.value.call == SYNCHRONIZE and producer.in_flight == 0
        assert producer.present_and_return(ring[0], timeout_us=0) is None
        held = consumer.acquire(timeout_us=1_000_000)
        second = fill_random(ring[1], random)
        producer.present(ring[1])
        releases = fake.calls("cuEGLStreamConsumerReleaseFrame")
        acquires = fake.calls("cuEGLStreamConsumerAcquireFrame")
        fake.fail(SYNCHRONIZE, 1)
        with pytest.raises(eglcuda.CUDAError) as info:
            consumer.acquire_next(timeout_us=1_000_000)
        assert info.value.call == SYNCHRONIZE, str(info.value)
        assert fake.calls("cuEGLStreamConsumerReleaseFrame") == releases
        assert fake.calls("cuEGLStreamConsumerAcquireFrame") == acquires
        assert not held.released
        assert_frame_equals(held, first)
        acquired = consumer.acquire_next(timeout_us=1_000_000)
        assert held.released
        assert_frame_equals(acquired, second)
        acquired.release()
        # The consumer goes: a failed synchronize before the next present is still its own error.
        consumer.close()
        assert stream.state is eglcuda.StreamState.DISCONNECTED
        fake.fail(SYNCHRONIZE, 1)
        with pytest.raises(eglcuda.CUDAError) as info:
            producer.present(ring[2])
        assert info.value.call == SYNCHRONIZE and not isinstance(info.value, eglcuda.StreamDisconnected)


@pytest.mark.parametrize("fifo_length", [0, 2, 4], ids=["mailbox", "fifo2", "fifo4"])
@fake_driver_test
def test_present_and_return_asks_for_a_frame_only_when_one_is_due(fifo_length):
    """With no wait asked, ``present_and_return`` asks the driver for a frame back only once every
    frame this producer presented or allocated is in flight again, or more are in flight than the
    FIFO holds (always in mailbox mode); with a wait it always asks. A pool of 6 cycled by a
    consumer that keeps up: every byte arrives in order, and the producer never runs dry."""
    random = rng()
    with stream_of(16, 8, fifo_length=fifo_length) as (_, stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        free = list(pool)
        asked = []
        for step in range(40):
            assert free, f"step {step}: the pool ran dry"
            frame = free.pop(0)
            expected = fill_random(frame, random)
            in_flight_after = producer.in_flight + 1
            known_after = 6  # (the pool was made by allocate_frame: it counts from the start)
            before = fake.calls(RETURN)
            back = producer.present_and_return(frame, timeout_us=0)
            asks = fake.calls(RETURN) - before
            due = in_flight_after >= known_after or in_flight_after > fifo_length
            if step == 0:  # reuse on and nothing else in flight: nothing can come back
                due = False
            assert asks == (1 if due else 0), (step, in_flight_after, known_after)
            asked.append(asks)
            if back is not None:
                free.append(back)
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert_frame_equals(acquired, expected)
        assert 0 < sum(asked) < 40 if fifo_length else sum(asked) == 39
        # A wait asked for always asks, also with frames known to be free.
        frame = free.pop(0)
        before = fake.calls(RETURN)
        producer.present_and_return(frame, timeout_us=1_000)
        assert fake.calls(RETURN) - before >= 1
        consumer.acquire(timeout_us=1_000_000).release()


@fake_driver_test
def test_a_ring_taken_last_in_first_out_keeps_the_fifo_full():
    """A ring of 6 frames from ``allocate_frame`` on a FIFO of 4, the freshest returned frame
    presented next (``free.pop()``), against a consumer that takes and releases each frame at
    once: the producer keeps the FIFO's worth of frames in flight and cycles the whole ring,
    instead of asking for a frame at every present and cycling only two of them."""
    random = rng()
    with stream_of(16, 8, fifo_length=4) as (_, stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        free = list(pool)
        used: set[int] = set()
        most_in_flight = 0
        expected = []
        for step in range(30):
            if not free:
                back = producer.return_frame(1_000_000)
                assert back is not None
                free.append(back)
            frame = free.pop()
            used.add(id(frame))
            expected.append(fill_random(frame, random))
            back = producer.present_and_return(frame, timeout_us=0)
            most_in_flight = max(most_in_flight, producer.in_flight)
            if back is not None:
                free.append(back)
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert_frame_equals(acquired, expected.pop(0))
        assert most_in_flight >= 4, most_in_flight
        assert len(used) >= 5, f"only {len(used)} frames of the ring of 6 were presented"



@fake_driver_test
def test_every_plane_of_an_acquired_frame_exports_its_interfaces():
    """An acquired frame's planes (read-only) and a producer's (writable) both give
    ``__cuda_array_interface__`` (what CuPy and Numba probe with hasattr) and DLPack capsules,
    at the plane's address."""
    with stream_of(66, 34, format=eglcuda.ColorFormat.NV12) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        for plane in frame.planes:
            assert hasattr(plane, "__cuda_array_interface__")
            assert plane.__cuda_array_interface__["data"] == (plane.pointer, False)
        producer.present(frame)
        with consumer.acquire() as acquired:
            for plane in acquired.planes:
                assert hasattr(plane, "__cuda_array_interface__")
                interface = plane.__cuda_array_interface__
                assert interface["data"] == (plane.pointer, True) and interface["version"] == 3
                assert plane.__dlpack__(stream=2) is not None
