"""Threads against the fake driver (which, like eglcuda, releases nothing but its own lock while
it waits): many streams at once, and an endpoint used from a thread without a current context.
(Several threads on one producer, producer and consumer in different threads, and calls that wait
on each other without holding the GIL: tests/stream_scenarios.py, on both drivers.)"""
from __future__ import annotations

import threading

from .harness import fake_driver_test
from .kit import assert_frame_equals, check_tagged, display, fill_random, pattern, rng, stream_of


@fake_driver_test
def test_eight_streams_in_sixteen_threads():
    """Eight streams on one display, each with a producer thread and a consumer thread, FIFO 2,
    100 frames each: every stream delivers its own frames, in order, byte for byte."""
    count = 100
    with display() as opened:
        errors: list[BaseException] = []
        results: dict[int, list[int]] = {}
        streams = []
        for index in range(8):
            stream = opened.create_stream(fifo_length=2)
            consumer = stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(24, 8)
            streams.append((stream, producer, consumer))

        def produce(index: int, producer) -> None:
            try:
                free = [producer.allocate_frame() for _ in range(3)]
                for seq in range(1, count + 1):
                    while not free:
                        back = producer.return_frame(100_000)
                        if back is not None:
                            free.append(back)
                    frame = free.pop()
                    for plane, values in zip(frame.planes, pattern(frame, index * 1000 + seq)):
                        plane.copy_from(values)
                    producer.present(frame)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def consume(index: int, consumer) -> None:
            try:
                got = results.setdefault(index, [])
                while len(got) < count:
                    with consumer.acquire(timeout_us=2_000_000) as acquired:
                        if acquired.is_new:
                            tag = check_tagged(acquired)
                            assert tag // 1000 == index, f"stream {index} delivered stream {tag // 1000}'s frame"
                            got.append(tag % 1000)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(i, p)) for i, (_, p, _) in enumerate(streams)]
        threads += [threading.Thread(target=consume, args=(i, c)) for i, (_, _, c) in enumerate(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        for index in range(8):
            assert results[index] == list(range(1, count + 1)), f"stream {index}"
        for stream, _, _ in streams:
            stream.close()


@fake_driver_test
def test_calls_on_one_endpoint_from_a_thread_without_a_current_context():
    """A thread that never made a CUDA context current can present, acquire and copy: eglcuda
    makes the endpoint's context current itself (the fake refuses every call without one)."""
    random = rng()
    with stream_of(16, 8) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        results: list = []

        def work() -> None:
            try:
                expected = fill_random(frame, random)
                producer.present(frame)
                with consumer.acquire() as acquired:
                    assert_frame_equals(acquired, expected)
                results.append("ok")
            except BaseException as exc:  # pragma: no cover
                results.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(10)
        assert results == ["ok"], results


def _closed_while_waiting(stream, call) -> dict:
    """Run ``call`` (a long wait) in a thread, close ``stream`` 0.3 s later from this one: the
    close and the call both end within 2 s. What the call returned or raised, and its seconds."""
    import time

    out: dict = {}

    def run() -> None:
        started = time.monotonic()
        try:
            out["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out["result"] = exc
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 2.0
    thread.join(5)
    assert not thread.is_alive() and out["seconds"] < 2.0, out
    return out


@fake_driver_test
def test_closing_the_stream_ends_a_long_return_frame_of_another_thread_at_once():
    """A producer thread waits in return_frame (30 s) for frames a consumer holds on to; the main
    thread closes the stream. The wait ends within a fraction of a second (ClosedError, or
    StreamDisconnected for the consumer gone first) and every endpoint is closed: the close used
    to raise Timeout after 10 s, leaving the producer and the stream open, and the wait ran on."""
    import eglcuda

    with display() as opened:
        stream = opened.create_stream(fifo_length=4)
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(24, 8)
        frames = [producer.allocate_frame() for _ in range(3)]
        producer.present(frames[0])
        producer.present(frames[1])
        out = _closed_while_waiting(stream, lambda: producer.return_frame(timeout_us=30_000_000))
        assert isinstance(out["result"], (eglcuda.ClosedError, eglcuda.StreamDisconnected)), out
        assert stream.closed and producer.closed and consumer.closed


@fake_driver_test
def test_closing_a_consumer_ends_its_wait_for_a_producer_at_once():
    """A consumer thread's first acquire waits for a producer to connect (30 s); the main thread
    closes the stream: the acquire ends with ClosedError within a fraction of a second, and the
    stream and consumer are closed (the close used to raise Timeout after 10 s and leave both
    open while the wait ran its 30 s)."""
    import eglcuda

    with display() as opened:
        stream = opened.create_stream(fifo_length=4)
        consumer = stream.connect_cuda_consumer()
        out = _closed_while_waiting(stream, lambda: consumer.acquire(timeout_us=30_000_000))
        assert isinstance(out["result"], eglcuda.ClosedError), out
        assert stream.closed and consumer.closed


@fake_driver_test(env={"FAKE_H2D_DELAY_US": "300000"})
def test_a_frames_loop_ended_while_another_thread_releases_its_frame_ends_quietly():
    """A frames() loop ends (break, close) while another thread's acquire_next on the same
    consumer is inside the consumer, releasing the loop's frame. The loop's end found the frame
    still held, then waited for that call and released it again: ClosedError ("already released")
    came out of the loop's end ("Exception ignored" when the generator was collected). The frame
    is released either way: the loop ends quietly. (Made deterministic by a consumer on the legacy
    stream of a shared stream: its release first synchronizes that stream, here busy 300 ms with a
    queued host -> device copy.)"""
    import time

    import numpy as np

    import eglcuda
    from eglcuda._bind import cuda

    with display() as opened, opened.create_stream(fifo_length=4, cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer(cuda_stream=0)
        producer = stream.connect_cuda_producer(16, 8)
        for frame in [producer.allocate_frame() for _ in range(2)]:
            producer.present(frame)
        loop = consumer.frames(1_000_000)
        first = next(loop)
        scratch = eglcuda.Frame.allocate(16, 8)
        host = np.zeros((8, 64), np.uint8)
        cuda.copy_2d(0, ("host", host, 64), ("device", scratch.planes[0].pointer, scratch.pitch), 64, 8, False)
        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("frame", consumer.acquire_next(1_000_000)))
        thread.start()
        time.sleep(0.1)  # the thread is inside the consumer, waiting for the legacy stream before the release
        loop.close()
        thread.join(5)
        assert first.released and out["frame"].number == 2
        out["frame"].release()
        with consumer.acquire(1_000_000) as again:  # (no error of the loop's left behind)
            assert again.number == 2
        scratch.close()
