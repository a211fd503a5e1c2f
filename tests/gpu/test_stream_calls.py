"""The per-frame calls (Cython methods, eglcuda/streams/cuda.pyx): their arguments are taken like a Python
method's, bad ones raise before the driver, and acquired frames and endpoints are collected like any
Python object. (Concurrent use from several threads: tests/stream_scenarios.py, on both drivers.)"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import eglcuda

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected, fill_random


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


class MicroSeconds(int):
    """An int subclass: accepted as a timeout like an int."""


def test_keywords_positionals_and_int_subclasses(display):
    rng = np.random.default_rng()
    with connected(display, 34, 18) as (stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(2)]
        expected = fill_random(ring[0], rng)
        producer.present(frame=ring[0], cuda_stream=None)
        with consumer.acquire(timeout_us=MicroSeconds(1_000_000)) as acquired:
            assert_frame_equals(acquired, expected)
        expected = fill_random(ring[1], rng)
        producer.present(ring[1], 0)  # an int stream handle: the legacy default stream
        acquired = consumer.acquire_next(MicroSeconds(500_000))
        assert acquired.is_new
        assert_frame_equals(acquired, expected)
        assert producer.return_frame(timeout_us=MicroSeconds(1_000_000)) is ring[0]
        acquired.release()
        # ring[1] is released; presenting ring[0] makes it the stream's newest, so ring[1] comes back.
        back = producer.present_and_return(frame=ring[0], cuda_stream=None, timeout_us=1_000_000)
        assert back is ring[1]
        consumer.acquire(timeout_us=1_000_000).release()


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, True, "10", None, np.float64(5)],
                         ids=["negative", "too-big", "float", "bool", "str", "None", "numpy-float"])
def test_bad_timeouts_raise_usage_error_before_the_driver(display, bad):
    with connected(display, 16, 16) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        for call in (lambda: producer.return_frame(bad), lambda: producer.present_and_return(frame, None, bad),
                     lambda: consumer.acquire(bad), lambda: consumer.acquire_next(timeout_us=bad)):
            with pytest.raises(eglcuda.UsageError, match="microseconds"):
                call()
        assert producer.frames_presented == 0 and producer.in_flight == 0
        assert consumer.frames_acquired == 0 and consumer._held is None


def test_malformed_calls_raise_type_error(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        with pytest.raises(TypeError, match=r"present\(\) takes at least 1 positional argument \(0 given\)"):
            producer.present()
        with pytest.raises(TypeError, match="unexpected keyword argument 'stream'"):
            producer.present(frame, stream=None)
        with pytest.raises(TypeError, match="multiple values for (keyword )?argument 'frame'"):
            producer.present(frame, frame=frame)
        with pytest.raises(TypeError, match=r"acquire\(\) takes at most 1 positional argument \(2 given\)"):
            consumer.acquire(1, 2)
        with pytest.raises(eglcuda.UsageError, match="takes an eglcuda.Frame"):
            producer.present(np.zeros((16, 16, 4), np.uint8))
        assert producer.frames_presented == 0


def test_acquired_frames_and_endpoints_are_collected(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        acquired = consumer.acquire()
        probe = weakref.ref(acquired)
        planes = acquired.planes  # each plane refers to its frame, which caches them: a cycle
        acquired.release()
        del acquired, planes
        consumer.close()  # the consumer keeps its last frames for reuse until then
        gc.collect()
        assert probe() is None
    stream = display.create_stream()
    consumer = stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(16, 16)
    producer.present(producer.allocate_frame())
    held = consumer.acquire()  # the consumer and its held frame refer to each other
    probes = [weakref.ref(x) for x in (stream, consumer, producer, held)]
    del stream, consumer, producer, held
    gc.collect()
    assert [p() for p in probes] == [None] * 4


def test_more_frames_than_the_producer_remembers_come_back_as_themselves(display):
    """The producer remembers its 8 most recent frames to skip lookups (csrc/hotpath.c): with 13
    frames presented in a new random order each round, some on a named CUDA stream, every frame
    arrives with its own bytes and comes back as the very object presented, in order."""
    require_extension(display, "EGL_KHR_stream_fifo")
    rng = np.random.default_rng()
    with connected(display, 24, 10, fifo_length=16, reuse_last_frame=False) as (stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(13)]
        cuda_stream = consumer.cuda_stream  # a real stream of the same context, named by handle
        for round_ in range(4):
            order = [pool[i] for i in rng.permutation(len(pool))]
            expected = {}
            for index, frame in enumerate(order):
                expected[id(frame)] = fill_random(frame, rng)
                producer.present(frame, cuda_stream if index % 3 == 0 else None)
            for frame in order:
                with consumer.acquire(timeout_us=1_000_000) as acquired:
                    assert acquired.is_new
                    assert_frame_equals(acquired, expected[id(frame)])
            for frame in order:
                assert producer.return_frame(timeout_us=1_000_000) is frame, round_
            assert producer.in_flight == 0


def test_acquired_frame_objects_are_reused_only_when_nobody_can_tell(display):
    """An acquire reuses the object of a frame acquired before (no allocation per frame,
    csrc/hotpath.c) only when nothing else refers to it. A released frame still held, weakly
    referred to, or with its planes built stays what it was: released, its old number, raising on
    use; the new frame is another object with its own number and bytes."""
    rng = np.random.default_rng()
    with connected(display, 40, 22, fifo_length=4) as (stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        seen_ids, numbers = [], []

        def next_frame(index):
            expected = fill_random(ring[index % 3], rng)
            producer.present(ring[index % 3])
            acquired = consumer.acquire(timeout_us=1_000_000)
            assert acquired.is_new and not acquired.released
            assert_frame_equals(acquired, expected)
            numbers.append(acquired.number)
            if index >= 2:
                assert producer.return_frame(timeout_us=1_000_000) is ring[(index - 2) % 3]
            return acquired

        # Dropped after release: the object comes back for a later frame, with new contents.
        for index in range(6):
            acquired = next_frame(index)
            seen_ids.append(id(acquired))
            acquired.release()
            del acquired
        assert len(set(seen_ids)) < len(seen_ids), "no acquired frame object was reused"
        assert numbers == list(range(numbers[0], numbers[0] + 6))

        # Still held after release: never handed out again.
        kept = next_frame(6)
        kept_number = kept.number
        kept.release()
        later = []
        for index in range(7, 10):
            later.append(next_frame(index))
            later[-1].release()
        assert all(frame is not kept for frame in later)
        assert kept.released and kept.number == kept_number
        with pytest.raises(eglcuda.ClosedError):
            kept.planes
        with pytest.raises(eglcuda.ClosedError):
            kept.release()

        # Weakly referred to, or with its planes built: not reused either.
        watched = next_frame(10)
        probe = weakref.ref(watched)
        watched.release()
        del watched
        built = next_frame(11)
        built_planes = built.planes
        built.release()
        del built
        for index in range(12, 16):
            acquired = next_frame(index)
            assert acquired is not probe() and all(acquired is not plane._frame for plane in built_planes)
            acquired.release()
            del acquired
        # The watched frame is gone or still the released frame 10, never a later frame.
        watched = probe()
        assert watched is None or (watched.released and watched.number == numbers[10])
        del watched
        assert built_planes[0]._frame.released and built_planes[0]._frame.number == numbers[11]
        assert numbers == list(range(numbers[0], numbers[0] + 16))
        consumer.close()
        del built_planes
        gc.collect()
        assert probe() is None


def test_numpy_integer_timeouts_are_taken_as_microseconds(display):
    rng = np.random.default_rng()
    with connected(display, 16, 16) as (stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(2)]
        expected = fill_random(ring[0], rng)
        producer.present(ring[0])
        with consumer.acquire(np.int64(1_000_000)) as acquired:
            assert_frame_equals(acquired, expected)
        expected = fill_random(ring[1], rng)
        producer.present(ring[1])  # (the stream keeps its newest frame: ring[0] comes back once replaced)
        acquired = consumer.acquire_next(timeout_us=np.int32(500_000))
        assert_frame_equals(acquired, expected)
        assert producer.return_frame(np.uint32(1_000_000)) is ring[0]
        acquired.release()
