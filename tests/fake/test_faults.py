"""Fault injection: one driver call fails (fake_fail), and eglcuda raises the error it documents,
naming the call and the code, then goes on working or closes cleanly.

The fake makes the failing call do nothing else (see fake_egl.c): a failed acquire latches no
frame, a failed release leaves the frame acquired, a failed present inserts nothing."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import eglcuda
from eglcuda import StreamState

from .harness import (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_OUT_OF_MEMORY,
                      CUDA_ERROR_UNKNOWN, EGL_BAD_ALLOC, fake, fake_driver_test)
from .kit import assert_frame_equals, display, fill_random, pattern, rng, stream_of, tag_of

PRESENT = "cuEGLStreamProducerPresentFrame"
RETURN = "cuEGLStreamProducerReturnFrame"
ACQUIRE = "cuEGLStreamConsumerAcquireFrame"
MAP = "cuGraphicsResourceGetMappedEglFrame"
RELEASE = "cuEGLStreamConsumerReleaseFrame"
COUNTER = "eglQueryStreamu64KHR"


def warm_up(producer, consumer, ring, random, rounds=3):
    """A few clean rounds (numbers measured, derivation on); returns the last number."""
    number = None
    for index in range(rounds):
        frame = ring[index % len(ring)]
        if index >= len(ring):
            assert producer.return_frame(1_000_000) is frame
        fill_random(frame, random)
        producer.present(frame)
        with consumer.acquire() as acquired:
            number = acquired.number
    return number


def check_cuda_error(info, code, call):
    error = info.value
    assert isinstance(error, eglcuda.CUDAError), repr(error)
    assert (error.code, error.call) == (code, call), (error.code, error.call, str(error))
    assert error.name == {CUDA_ERROR_UNKNOWN: "CUDA_ERROR_UNKNOWN", CUDA_ERROR_OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
                          CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
                          CUDA_ERROR_LAUNCH_TIMEOUT: "CUDA_ERROR_LAUNCH_TIMEOUT"}[code]
    assert call in str(error) and error.name in str(error)


def round_trip_ok(producer, consumer, frame, random, number=None):
    """One more present/acquire/release: bytes right, the number the next one."""
    expected = fill_random(frame, random)
    producer.present(frame)
    with consumer.acquire(timeout_us=1_000_000) as acquired:
        assert acquired.is_new is not False
        assert_frame_equals(acquired, expected)
        if number is not None:
            assert acquired.number == number
        return acquired.number


# ---- per-frame calls --------------------------------------------------------------------------

@pytest.mark.parametrize("fused", [False, True], ids=["present", "present_and_return"])
@pytest.mark.parametrize("code", [CUDA_ERROR_UNKNOWN, CUDA_ERROR_OUT_OF_MEMORY], ids=["unknown", "oom"])
@fake_driver_test
def test_present_fails(code, fused):
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        last = warm_up(producer, consumer, ring, random, rounds=2)
        frame = ring[2]
        fake.fail(PRESENT, code)
        with pytest.raises(eglcuda.CUDAError) as info:
            producer.present_and_return(frame) if fused else producer.present(frame)
        check_cuda_error(info, code, PRESENT)
        assert producer.in_flight == 2 and producer.frames_presented == 2
        assert stream.state is StreamState.OLD_FRAME and stream.producer_frame == last
        # Nothing was inserted: the same frame goes through next, numbered after the last one.
        round_trip_ok(producer, consumer, frame, random, number=last + 1)
        assert producer.return_frame(1_000_000) is ring[0]


@pytest.mark.parametrize("fused", [False, True], ids=["return_frame", "present_and_return"])
@fake_driver_test
def test_return_fails(fused):
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        last = warm_up(producer, consumer, ring, random, rounds=2)  # ring[0] is returnable now
        fake.fail(RETURN, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError) as info:
            if fused:
                fill_random(ring[2], random)
                producer.present_and_return(ring[2], timeout_us=1_000_000)
            else:
                producer.return_frame(1_000_000)
        check_cuda_error(info, CUDA_ERROR_UNKNOWN, RETURN)
        # The frame is still the driver's to give back: the next return gets it.
        assert producer.in_flight == (3 if fused else 2)
        assert producer.return_frame(1_000_000) is ring[0]
        round_trip_ok(producer, consumer, ring[0], random, number=last + 1 + fused)


@pytest.mark.parametrize("fused", [False, True], ids=["acquire", "acquire_next"])
@fake_driver_test
def test_acquire_fails(fused):
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        last = warm_up(producer, consumer, ring, random, rounds=2)
        held = consumer.acquire(timeout_us=1000) if fused else None  # the old frame, held
        expected = fill_random(ring[2], random)
        producer.present(ring[2])
        fake.fail(ACQUIRE, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError) as info:
            consumer.acquire_next() if fused else consumer.acquire()
        check_cuda_error(info, CUDA_ERROR_UNKNOWN, ACQUIRE)
        if fused:
            assert held.released  # the release half went through
        assert consumer._held is None and fake.count("held") == 0
        assert stream.state is StreamState.NEW_FRAME  # the frame is still waiting
        with consumer.acquire() as acquired:
            assert acquired.is_new and acquired.number == last + 1
            assert_frame_equals(acquired, expected)
        round_trip_ok(producer, consumer, producer.return_frame(1_000_000), random, number=last + 2)


@fake_driver_test
def test_acquire_failing_on_an_empty_stream_reads_as_timeout():
    """Documented: a failed acquire on a stream in state EMPTY is reported as Timeout (the driver's
    own code is lost: eglcuda reads the state, not the code)."""
    with stream_of(32, 8) as (_, stream, producer, consumer):
        fake.fail(ACQUIRE, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.Timeout, match="EMPTY"):
            consumer.acquire(timeout_us=1000)


@fake_driver_test
def test_map_fails_consumer_goes_on():
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        last = warm_up(producer, consumer, ring, random, rounds=2)
        fill_random(ring[2], random)
        producer.present(ring[2])
        fake.fail(MAP, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError) as info:
            consumer.acquire()
        check_cuda_error(info, CUDA_ERROR_UNKNOWN, MAP)
        assert consumer._held is None and consumer._derive_off
        # New frames still come through, numbered by EGL.
        back = producer.return_frame(1_000_000)
        assert back is ring[0]
        round_trip_ok(producer, consumer, back, random, number=last + 2)


@fake_driver_test(misuse_ok=True)
def test_map_fails_the_acquired_frame_is_released():
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(2)]
        warm_up(producer, consumer, ring, random, rounds=1)
        expected = fill_random(ring[1], random)
        producer.present(ring[1])
        fake.fail(MAP, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError):
            consumer.acquire()
        assert fake.count("held") == 0, "the frame the failed acquire latched is still acquired in the driver"
        with consumer.acquire(timeout_us=20_000) as again:  # nothing new: the latched frame again
            assert_frame_equals(again, expected)


@fake_driver_test
def test_counter_query_fails_frames_still_arrive_without_numbers():
    """Documented (CudaConsumer._counter_failed): a failed frame-counter query does not fail the
    acquire; the frame arrives, and frame numbers are off from then on (number and is_new None)."""
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        expected = fill_random(ring[0], random)
        producer.present(ring[0])
        fake.fail(COUNTER, EGL_BAD_ALLOC)  # the first acquire asks EGL (nothing measured yet)
        with consumer.acquire() as acquired:
            assert_frame_equals(acquired, expected)
            assert acquired.number is None and acquired.is_new is None
        assert fake.calls(COUNTER) >= 1
        for frame in ring[1:]:
            expected = fill_random(frame, random)
            producer.present(frame)
            with consumer.acquire() as acquired:
                assert_frame_equals(acquired, expected)
                assert acquired.number is None
        assert stream.consumer_frame == 3  # EGL's counter itself is fine


@pytest.mark.parametrize("fused", [False, True], ids=["release", "acquire_next"])
@fake_driver_test(misuse_ok=True)
def test_release_fails_consumer_goes_on(fused):
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        last = warm_up(producer, consumer, ring, random, rounds=2)
        held = consumer.acquire(timeout_us=1000)
        fill_random(ring[2], random)
        producer.present(ring[2])
        fake.fail(RELEASE, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError) as info:
            consumer.acquire_next() if fused else held.release()
        check_cuda_error(info, CUDA_ERROR_UNKNOWN, RELEASE)
        # The driver did not take the frame back: it stays held and usable, and the call can be
        # made again.
        assert not held.released and consumer._held is held
        assert held.planes[0].to_numpy() is not None
        if fused:
            acquired = consumer.acquire_next()
        else:
            held.release()
            acquired = consumer.acquire()
        # The consumer takes the next frame.
        with acquired:
            assert held.released
            assert acquired.number == last + 1


@fake_driver_test(misuse_ok=True)
def test_release_fails_the_frame_can_be_released_again():
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(2)]
        warm_up(producer, consumer, ring, random, rounds=2)
        held = consumer.acquire(timeout_us=1000)
        fake.fail(RELEASE, CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError):
            held.release()
        try:
            held.release()  # a retry once the driver answers again
        except eglcuda.ClosedError:
            pass
        assert fake.count("held") == 0, "the frame whose release failed is still acquired in the driver"


@pytest.mark.parametrize("step", ["present", "return_frame", "release", "acquire", "present_and_return",
                                  "acquire_next"])
@fake_driver_test
def test_context_check_fails(step):
    """eglcuda makes the endpoint's context current first (cuCtxGetCurrent, then cuCtxSetCurrent
    when another is current): when that fails, the error names the context call, and nothing else
    happened."""
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        warm_up(producer, consumer, ring, random, rounds=2)
        held = consumer.acquire(timeout_us=1000) if step in ("release", "acquire_next") else None
        calls = {
            "present": lambda: producer.present(ring[2]),
            "present_and_return": lambda: producer.present_and_return(ring[2]),
            "return_frame": lambda: producer.return_frame(1_000_000),
            "release": lambda: held.release(),
            "acquire": lambda: consumer.acquire(),
            "acquire_next": lambda: consumer.acquire_next(),
        }
        if step in ("acquire", "acquire_next"):
            producer.present(ring[2])
        before = {name: fake.calls(name) for name in (PRESENT, RETURN, ACQUIRE, RELEASE)}
        fake.fail("cuCtxGetCurrent", CUDA_ERROR_UNKNOWN)
        with pytest.raises(eglcuda.CUDAError) as info:
            calls[step]()
        assert info.value.code == CUDA_ERROR_UNKNOWN
        assert {name: fake.calls(name) for name in before} == before, "the driver was called after all"
        assert info.value.call in ("cuCtxGetCurrent", "cuCtxSetCurrent"), \
            f"a failed context switch is reported as a failure of {info.value.call}"


# ---- a random schedule with random faults ---------------------------------------------------------

@pytest.mark.parametrize("fifo_length", [0, 3], ids=["mailbox", "fifo3"])
@fake_driver_test(env={"FAKE_FIFO_WAIT_MS": "3000"})
def test_random_faults_never_corrupt_what_arrives(fifo_length):
    """400 steps of presents, returns and acquires, a quarter of them with the call they make
    failing (present, return, acquire, the counter query): every failure is a CUDAError naming that
    call, every frame that arrives is byte for byte the present it says it is (its tag), new frames
    arrive in present order (FIFO) or newer (mailbox), no frame is lost or returned twice."""
    random = rng()
    with stream_of(20, 6, fifo_length=fifo_length) as (_, stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        free = list(pool)
        presented = 0  # tags given so far (a tag is a present attempt's index)
        inserted: list[int] = []  # tags the stream accepted, in order
        seen_tag = 0
        failures = {PRESENT: 0, RETURN: 0, ACQUIRE: 0, COUNTER: 0}
        for _ in range(400):
            latched = inserted.index(seen_tag) + 1 if seen_tag else 0
            pending = len(inserted) - latched
            action = random.random()
            if action < 0.45 and free and (not fifo_length or pending < fifo_length):
                action, targets = "present", [PRESENT]
            elif action < 0.7 or not inserted:
                action, targets = "return", [RETURN]
            else:
                action, targets = "acquire", [ACQUIRE, COUNTER]
            armed = targets[int(random.integers(len(targets)))] if random.random() < 0.25 else None
            if armed:
                counted = fake.calls(armed)
                fake.fail(armed, CUDA_ERROR_UNKNOWN if armed != COUNTER else EGL_BAD_ALLOC)
            try:
                if action == "present":
                    frame = free.pop()
                    presented += 1
                    for plane, values in zip(frame.planes, pattern(frame, presented)):
                        plane.copy_from(values)
                    try:
                        producer.present(frame)
                        inserted.append(presented)
                    except eglcuda.CUDAError as exc:
                        assert exc.call == PRESENT and armed == PRESENT, exc
                        failures[PRESENT] += 1
                        free.append(frame)
                elif action == "return":
                    try:
                        back = producer.return_frame(timeout_us=0)
                    except eglcuda.CUDAError as exc:
                        assert exc.call == RETURN and armed == RETURN, exc
                        failures[RETURN] += 1
                        back = None
                    if back is not None:
                        assert not any(back is f for f in free), "a frame came back twice"
                        free.append(back)
                else:
                    try:
                        with consumer.acquire(timeout_us=2_000) as acquired:
                            got = acquired.to_numpy()
                    except eglcuda.CUDAError as exc:
                        assert exc.call == ACQUIRE and armed == ACQUIRE, exc
                        failures[ACQUIRE] += 1
                        continue
                    tag = tag_of(got)
                    assert tag in inserted, f"a frame tagged {tag} arrived but was never inserted"
                    for g, e in zip(got, pattern([p.shape for p in got], tag)):
                        assert np.array_equal(g, e), f"frame {tag} arrived corrupted"
                    if fifo_length and tag != seen_tag:
                        assert inserted.index(tag) == latched, "FIFO skipped or reordered a frame"
                    if not fifo_length and pending:
                        assert tag == inserted[-1], "mailbox did not hand out the newest frame"
                    assert tag >= seen_tag, "an older frame arrived after a newer one"
                    seen_tag = tag
            finally:
                if armed:
                    if armed == COUNTER and fake.calls(armed) > counted:
                        failures[COUNTER] += 1
                    fake.disarm(armed)
            assert producer.in_flight + len(free) == len(pool)
        print(failures)
        assert failures[PRESENT] and failures[RETURN] and failures[ACQUIRE], failures


# ---- setup and teardown calls -----------------------------------------------------------------

@fake_driver_test
def test_egl_setup_failures_raise_egl_errors_and_leak_nothing():
    fake.fail("eglQueryDevicesEXT", EGL_BAD_ALLOC)
    with pytest.raises(eglcuda.EGLError) as info:
        eglcuda.devices()
    assert (info.value.call, info.value.name) == ("eglQueryDevicesEXT", "EGL_BAD_ALLOC")
    fake.fail("eglInitialize", EGL_BAD_ALLOC)
    with pytest.raises(eglcuda.EGLError, match="eglInitialize failed with EGL_BAD_ALLOC"):
        eglcuda.Display.for_cuda_device(0)
    with display() as opened:
        fake.fail("eglCreateStreamKHR", EGL_BAD_ALLOC)
        with pytest.raises(eglcuda.EGLError, match="eglCreateStreamKHR"):
            opened.create_stream()
        fds = len(os.listdir("/proc/self/fd"))
        fake.fail("eglGetStreamFileDescriptorKHR", EGL_BAD_ALLOC)
        with pytest.raises(eglcuda.EGLError, match="eglGetStreamFileDescriptorKHR"):
            opened.create_stream(cross_process=True)
        assert fake.count("streams") == 0, "the stream whose export failed was not destroyed"
        with opened.create_stream(cross_process=True) as stream:
            fake.fail("eglCreateStreamFromFileDescriptorKHR", EGL_BAD_ALLOC)
            with pytest.raises(eglcuda.EGLError, match="eglCreateStreamFromFileDescriptorKHR"):
                eglcuda.Stream.from_fd(opened, stream._export())
            with eglcuda.Stream.from_fd(opened, stream._export()) as opened_again:
                assert opened_again.state is StreamState.CREATED
        assert len(os.listdir("/proc/self/fd")) == fds, "a descriptor leaked"
        fake.fail("eglQueryStreamKHR", EGL_BAD_ALLOC)
        with opened.create_stream() as stream:
            with pytest.raises(eglcuda.EGLError, match="eglQueryStreamKHR"):
                stream.state
            assert stream.state is StreamState.CREATED
    assert fake.objects()["streams"] == fake.count("stream_handles") == 0


@fake_driver_test
def test_cuda_setup_failures_raise_cuda_errors_and_leak_nothing():
    fake.fail("cuInit", CUDA_ERROR_UNKNOWN)
    with pytest.raises(eglcuda.CUDAError, match="cuInit"):
        eglcuda.get_device(0)
    fake.fail("cuDevicePrimaryCtxRetain", CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(eglcuda.CUDAError, match="cuDevicePrimaryCtxRetain"):
        eglcuda.get_device(0)
    assert eglcuda.get_device(0).info.name.startswith("Fake CUDA device 0")
    baseline = fake.objects()
    with display() as opened:
        for name, options in (("cuMemAlloc", {}), ("cuArrayCreate", {"layout": "array", "format": "NV12"}),
                              ("cuMemHostAlloc", {"memory": "pinned"}),
                              ("cuMemHostGetDevicePointer", {"memory": "pinned"})):
            fake.fail(name, CUDA_ERROR_OUT_OF_MEMORY, nth=2 if name == "cuArrayCreate" else 1)
            with pytest.raises(eglcuda.CUDAError) as info:
                eglcuda.Frame.allocate(64, 32, **options)
            assert info.value.call == name and info.value.code == CUDA_ERROR_OUT_OF_MEMORY
            assert fake.objects() == baseline, f"a failed {name} left memory behind"
        frame = eglcuda.Frame.allocate(16, 8)
        for name in ("cuMemcpy2DAsync", "cuStreamSynchronize"):
            fake.fail(name, CUDA_ERROR_UNKNOWN)
            with pytest.raises(eglcuda.CUDAError, match=name):
                frame.planes[0].copy_from(np.zeros((8, 16, 4), np.uint8))
        frame.close()
        with opened.create_stream() as stream:
            fake.fail("cuStreamCreate", CUDA_ERROR_OUT_OF_MEMORY)
            with pytest.raises(eglcuda.CUDAError, match="cuStreamCreate"):
                stream.connect_cuda_consumer()
            fake.fail("cuEGLStreamConsumerConnect", CUDA_ERROR_UNKNOWN)
            with pytest.raises(eglcuda.CUDAError, match="cuEGLStreamConsumerConnect"):
                stream.connect_cuda_consumer()
            assert fake.count("cuda_streams") == baseline["cuda_streams"], "the consumer's CUDA stream leaked"
            assert stream.state is StreamState.CREATED and stream.consumer is None
            consumer = stream.connect_cuda_consumer()
            fake.fail("cuEGLStreamProducerConnect", CUDA_ERROR_UNKNOWN)
            with pytest.raises(eglcuda.CUDAError, match="cuEGLStreamProducerConnect"):
                stream.connect_cuda_producer(16, 8)
            assert stream.state is StreamState.CONNECTING and stream.producer is None
            producer = stream.connect_cuda_producer(16, 8)
            random = rng()
            round_trip_ok(producer, consumer, producer.allocate_frame(), random, number=1)
    gc.collect()
    assert fake.objects() == baseline, (fake.objects(), baseline)


@fake_driver_test(misuse_ok=True)
def test_disconnect_failures_are_not_raised_at_close():
    """Finalizers never raise: a refused disconnect is dropped at close (the driver keeps that
    connection), and everything else still closes."""
    with display() as opened:
        stream = opened.create_stream()
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(16, 8)
        producer.present(producer.allocate_frame())
        fake.fail("cuEGLStreamProducerDisconnect", CUDA_ERROR_UNKNOWN)
        fake.fail("cuEGLStreamConsumerDisconnect", CUDA_ERROR_UNKNOWN)
        stream.close()
        assert producer.closed and consumer.closed and stream.closed
        assert fake.calls("cuEGLStreamProducerDisconnect") == fake.calls("cuEGLStreamConsumerDisconnect") == 1
        assert fake.count("stream_handles") == 0
        assert fake.count("connections") == 2  # what the driver refused stays the driver's


@fake_driver_test
def test_state_query_fails_as_an_old_frame_is_acquired_again():
    """The question whether the producer is still there (asked when the acquire handed out the
    last frame again) fails: the error names the call, the frame goes back to the stream, and the
    next acquire hands it out."""
    random = rng()
    with stream_of(32, 8) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        sent = fill_random(frame, random)
        producer.present(frame)
        consumer.acquire(1_000_000).release()
        fake.fail("eglQueryStreamKHR", EGL_BAD_ALLOC)
        with pytest.raises(eglcuda.EGLError, match="eglQueryStreamKHR"):
            consumer.acquire(0)
        assert fake.count("held") == 0
        with consumer.acquire(0) as acquired:
            assert acquired.is_new is False
            assert_frame_equals(acquired, sent)


@fake_driver_test(misuse_ok=True)
def test_release_fails_as_a_frames_loop_ends():
    """A frames() loop left with break whose release of the last frame fails: the next acquire()
    says so (the frame is still held, and why), and acquire_next releases it and goes on."""
    random = rng()
    with stream_of(32, 8, fifo_length=2) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(2)]
        fill_random(ring[0], random)
        producer.present(ring[0])
        for _ in consumer.frames(1_000_000):
            fake.fail(RELEASE, CUDA_ERROR_UNKNOWN)
            break
        sent = fill_random(ring[1], random)
        producer.present(ring[1])
        with pytest.raises(eglcuda.UsageError, match="frames\\(\\) loop.*cuEGLStreamConsumerReleaseFrame") as info:
            consumer.acquire(1_000_000)
        assert isinstance(info.value.__cause__, eglcuda.CUDAError)
        with consumer.acquire_next(1_000_000) as acquired:
            assert_frame_equals(acquired, sent)
