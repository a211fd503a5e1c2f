"""The fused loop steps: CudaProducer.present_and_return, CudaConsumer.acquire_next and
CudaConsumer.frames. Every byte checked on random frames, the same Frame objects come back, the
frame released by a step is unusable, and misuse is refused like the single calls refuse it."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import eglcuda

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected, fill_random, produce_payloads


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


def test_frames_iterator_threads_fifo_in_order(display):
    require_extension(display, "EGL_KHR_stream_fifo")
    rng = np.random.default_rng()
    count, width, height = 150, 40, 12
    payloads = [rng.integers(0, 256, (height, width, 4), dtype=np.uint8) for _ in range(count)]
    received, errors = [], []
    with connected(display, width, height, fifo_length=4) as (stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]

        def produce():
            produce_payloads(producer, pool, payloads, errors, fused=True)

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            for acquired in consumer.frames(timeout_us=2_000_000):
                if acquired.is_new:
                    received.append(acquired.planes[0].to_numpy())
                if len(received) == count:
                    break
        finally:
            thread.join(120)
        assert not errors, errors
        assert consumer._held is None, "leaving the loop releases the last frame"
        assert acquired.released
    assert len(received) == count
    for index, (got, want) in enumerate(zip(received, payloads)):
        assert np.array_equal(got, want), f"frame {index} out of order or corrupted"


def test_frames_iterator_ends_when_the_producer_disconnects(display):
    rng = np.random.default_rng()
    with connected(display, 16, 8) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, rng)
        producer.present(frame)
        seen = []
        started = time.perf_counter()
        for acquired in consumer.frames(timeout_us=100_000):
            if not seen:
                assert_frame_equals(acquired, expected)
                producer.close()
            seen.append(acquired.number)
        assert time.perf_counter() - started < 5
        assert len(seen) == 1, f"after the producer left, the loop went on with frames {seen[1:]}"
        assert consumer._held is None


def test_acquire_next_with_nothing_held_is_acquire(display):
    rng = np.random.default_rng()
    with connected(display, 10, 6) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, rng)
        producer.present(frame)
        with consumer.acquire_next() as acquired:
            assert_frame_equals(acquired, expected)
        # The user released it: the next step acquires again (the old frame, nothing new came).
        again = consumer.acquire_next(timeout_us=1000)
        assert again.is_new is False and again.number == acquired.number
        again.release()


def test_misuse_of_the_loop_steps(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        small = eglcuda.Frame.allocate(8, 8)
        with pytest.raises(eglcuda.UsageError, match="8x8"):
            producer.present_and_return(small)
        assert producer.in_flight == 0
        with pytest.raises(eglcuda.UsageError):
            producer.present_and_return(frame, timeout_us=-1)
        assert producer.present_and_return(frame) is None  # the stream keeps its only frame
        with pytest.raises(eglcuda.UsageError, match="already in flight"):
            producer.present_and_return(frame)
        first = consumer.acquire_next()
        second = consumer.acquire_next(timeout_us=1000)
        with pytest.raises(eglcuda.ClosedError):
            first.release()
        with pytest.raises(eglcuda.ClosedError):
            first.planes[0].pointer
        second.release()
        consumer.close()
        with pytest.raises(eglcuda.ClosedError):
            consumer.acquire_next()
        with pytest.raises(eglcuda.ClosedError):
            next(iter(consumer.frames()))
        producer.close()
        with pytest.raises(eglcuda.ClosedError):
            producer.present_and_return(frame)
        small.close()
