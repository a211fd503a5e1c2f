"""Threads against the fake driver (which, like eglcuda, releases nothing but its own lock while
it waits): several threads on one producer, producer and consumer in different threads, many
streams at once, and calls that wait on each other without holding the GIL."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import eglcuda

from .harness import fake_driver_test
from .kit import assert_frame_equals, display, fill_random, pattern, rng, stream_of, tag_of


def check_tagged(acquired) -> int:
    """The tag a frame carries, after checking every byte against it."""
    got = acquired.to_numpy()
    tag = tag_of(got)
    for index, (g, e) in enumerate(zip(got, pattern([p.shape for p in got], tag))):
        assert np.array_equal(g, e), f"frame tagged {tag}: plane {index} corrupted"
    return tag


@pytest.mark.parametrize("fifo_length", [0, 8], ids=["mailbox", "fifo8"])
@fake_driver_test
def test_many_threads_on_one_producer_keep_its_books(fifo_length):
    """Four threads present and take back frames on one producer at once while the consumer drains:
    frames come back once each, every frame the consumer sees is byte for byte what its thread
    wrote, each thread's frames arrive in its own order (and in FIFO mode all of them arrive), and
    the counters add up."""
    threads_count, per_thread = 4, 60
    with stream_of(32, 16, fifo_length=fifo_length) as (_, stream, producer, consumer):
        rings = [[producer.allocate_frame() for _ in range(3)] for _ in range(threads_count)]
        errors: list[BaseException] = []
        foreign: list = []
        pool_lock = threading.Lock()
        seen: dict[int, list[int]] = {t: [] for t in range(threads_count)}

        def produce(thread: int, ring: list) -> None:
            try:
                free, presented = list(ring), 0
                while presented < per_thread:
                    if free:
                        frame = free.pop()
                        presented += 1
                        for plane, values in zip(frame.planes, pattern(frame, thread * 1000 + presented)):
                            plane.copy_from(values)
                        producer.present(frame)
                    back = producer.return_frame(timeout_us=20_000)
                    with pool_lock:
                        if back is not None:
                            foreign.append(back)
                        mine = [f for f in foreign if any(f is r for r in ring)]
                        foreign[:] = [f for f in foreign if not any(f is r for r in ring)]
                    assert not any(f is m for f in free for m in mine), "a frame came back twice"
                    free.extend(mine)
            except BaseException as exc:  # pragma: no cover - the test reports it
                errors.append(exc)

        workers = [threading.Thread(target=produce, args=(t, ring)) for t, ring in enumerate(rings)]
        for worker in workers:
            worker.start()

        def drain() -> None:
            try:
                for acquired in consumer.frames(timeout_us=200_000):
                    if acquired.is_new:
                        tag = check_tagged(acquired)
                        seen[tag // 1000].append(tag % 1000)
            except BaseException as exc:  # pragma: no cover - the test reports it
                errors.append(exc)

        drainer = threading.Thread(target=drain)
        drainer.start()
        for worker in workers:
            worker.join(60)
        deadline = time.monotonic() + 10
        while fifo_length and sum(map(len, seen.values())) < threads_count * per_thread and time.monotonic() < deadline:
            time.sleep(0.01)
        producer.close()  # ends the consumer's iteration
        drainer.join(30)
        assert not drainer.is_alive() and not any(w.is_alive() for w in workers)
        assert not errors, errors
        assert producer.frames_presented == threads_count * per_thread
        for thread, numbers in seen.items():
            assert numbers == sorted(numbers), f"thread {thread}'s frames arrived out of order"
            if fifo_length:
                assert numbers == list(range(1, per_thread + 1)), f"FIFO lost frames of thread {thread}"


@pytest.mark.parametrize("fifo_length", [0, 4], ids=["mailbox", "fifo4"])
@fake_driver_test
def test_numbers_match_egl_with_the_producer_in_another_thread(fifo_length):
    """A producer thread presents 400 frames while the main thread acquires: every number is EGL's
    counter, FIFO numbers go up by one, mailbox numbers go up, every frame is the present its number
    says (bytes), and the consumer never turns frame-number derivation off."""
    random = rng()
    total = 400
    with stream_of(40, 12, fifo_length=fifo_length) as (_, stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        expected = [fill_random(pool[0], random)]
        producer.present(pool[0])
        with consumer.acquire() as first:
            base = first.number - 1
            assert_frame_equals(first, expected[0])
        errors: list[BaseException] = []

        def produce() -> None:
            local = np.random.default_rng(int(random.integers(2**32)))
            free = pool[1:]
            try:
                for _ in range(total - 1):
                    while not free:
                        back = producer.return_frame(100_000)
                        if back is not None:
                            free.append(back)
                    frame = free.pop()
                    expected.append(fill_random(frame, local))
                    producer.present(frame)
                    if local.random() < 0.3:
                        time.sleep(float(local.random()) * 0.0005)
            except BaseException as exc:  # pragma: no cover - reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=produce)
        thread.start()
        last = first.number
        deadline = time.monotonic() + 60
        try:
            while last - base < total and not errors and time.monotonic() < deadline:
                with consumer.acquire(timeout_us=20_000) as acquired:
                    assert acquired.number == stream.consumer_frame
                    assert acquired.is_new == (acquired.number != last)
                    if acquired.is_new:
                        if fifo_length:
                            assert acquired.number == last + 1
                        else:
                            assert acquired.number > last
                    assert_frame_equals(acquired, expected[acquired.number - base - 1])
                    last = acquired.number
        finally:
            thread.join(timeout=30)
        assert not errors, errors
        assert last - base == total
        assert not consumer._derive_off


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
def test_a_call_waits_for_another_threads_call_on_the_same_endpoint_without_the_gil():
    """One thread's acquire waits in the driver (an empty stream, 300 ms) while a second thread
    closes the consumer: the close waits until the acquire has come back, and meanwhile the main
    thread keeps running Python."""
    with stream_of(16, 16) as (_, stream, producer, consumer):
        events: list[tuple[str, float]] = []
        errors: list[BaseException] = []

        def acquire() -> None:
            try:
                consumer.acquire(timeout_us=300_000)
            except eglcuda.Timeout:
                events.append(("acquire timed out", time.perf_counter()))
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def close() -> None:
            events.append(("close called", time.perf_counter()))
            consumer.close()
            events.append(("close returned", time.perf_counter()))

        waiting = threading.Thread(target=acquire)
        started = time.perf_counter()
        waiting.start()
        time.sleep(0.05)
        closing = threading.Thread(target=close)
        closing.start()
        spins = 0
        while closing.is_alive() and time.perf_counter() - started < 10:
            spins += 1
        waiting.join(10)
        closing.join(10)
        assert not errors, errors
        when = {name: seconds - started for name, seconds in events}
        assert set(when) == {"close called", "acquire timed out", "close returned"}
        assert when["close called"] < 0.2
        assert when["close returned"] >= 0.25
        assert spins > 1000
        assert consumer.closed
        with pytest.raises(eglcuda.ClosedError):
            consumer.acquire(timeout_us=0)


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
