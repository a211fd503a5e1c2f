"""Stream scenarios written once and run on both drivers: the fake one on the CPU
(tests/fake/test_scenarios.py, each in a child interpreter) and NVIDIA's on the GPU
(tests/gpu/test_scenarios.py). A scenario takes an open display of a CUDA device and its
options; it checks only what holds on a real driver (frame numbers relative to the first one
seen, never EGL's starting value), so it means the same in both tiers.

:data:`CASES` lists every scenario with the options each runs with; both tiers run all of them.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat, Layout, StreamState

from .conftest import require_extension
from .gpu.streamkit import assert_frame_equals, check_tagged, connected, fill_random, pattern, rng


def _need_fifo(display: eglcuda.Display, fifo_length: int) -> None:
    if fifo_length:
        require_extension(display, "EGL_KHR_stream_fifo")


# ---- frame numbers ------------------------------------------------------------------------------

def numbers_on_a_random_schedule(display: eglcuda.Display, fifo_length: int) -> None:
    """Random bursts of presents (single and fused), acquires with and without a new frame: every
    number matches EGL's counter and the present it must come from, mailbox drops what it must,
    and the consumer derives numbers without EGL where it can (csrc/helpers.c, derive_plan)."""
    _need_fifo(display, fifo_length)
    random = rng()
    with connected(display, 24, 10, fifo_length=fifo_length) as (stream, producer, consumer):
        free = [producer.allocate_frame() for _ in range(8)]
        presented: list[list[np.ndarray]] = []  # expected bytes, in present order
        latched = 0  # the present (1-based) whose frame the consumer latched last
        last_number = None
        held = None
        new_acquires = old_acquires = 0
        for _ in range(300):
            while (back := producer.return_frame(0)) is not None:
                free.append(back)
            queued = len(presented) - latched
            room = fifo_length - queued if fifo_length else 3
            burst = int(random.choice(4, p=[0.45, 0.35, 0.1, 0.1]))  # under one a step: the queue drains too
            for _ in range(min(burst, len(free), room)):
                frame = free.pop(int(random.integers(len(free))))
                presented.append(fill_random(frame, random))
                if random.random() < 0.5:
                    producer.present(frame)
                else:
                    back = producer.present_and_return(frame)
                    if back is not None:
                        free.append(back)
            if not presented:
                continue
            waiting = len(presented) > latched
            timeout_us = 500_000 if waiting else 2_000  # the old frame comes back after the timeout
            if random.random() < 0.5:
                acquired = consumer.acquire_next(timeout_us)  # releases the held frame first
            else:
                if held is not None:
                    held.release()
                acquired = consumer.acquire(timeout_us)
            held = acquired
            assert acquired.number == stream.consumer_frame
            if waiting:
                index = latched + 1 if fifo_length else len(presented)
                assert acquired.is_new
                if last_number is not None:
                    assert acquired.number - last_number == index - latched
                latched = index
                new_acquires += 1
            else:
                assert acquired.is_new is False and acquired.number == last_number
                old_acquires += 1
            assert_frame_equals(acquired, presented[latched - 1])
            last_number = acquired.number
        if held is not None:
            held.release()
        assert new_acquires > 100 and old_acquires > 5
        # One thread: every new frame after the first is numbered without EGL (the first one
        # measures the mailbox base, or starts FIFO's count), and no check ever disagreed.
        assert consumer._numbers_derived == new_acquires - 1
        assert not consumer._derive_off


def numbers_with_the_producer_in_another_thread(display: eglcuda.Display, fifo_length: int) -> None:
    """A producer thread presents 400 frames while this thread acquires: every number is EGL's
    counter, FIFO numbers go up by one, mailbox numbers go up, every frame is the present its
    number says (bytes), and the consumer never turns frame-number derivation off."""
    _need_fifo(display, fifo_length)
    random = rng()
    total = 400
    with connected(display, 40, 12, fifo_length=fifo_length) as (stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        expected = [fill_random(pool[0], random)]
        producer.present(pool[0])
        with consumer.acquire() as first:
            base = first.number - 1  # the number of the n-th present is base + n
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
                    expected.append(fill_random(frame, local))  # before present: the consumer may look
                    producer.present(frame)
                    if local.random() < 0.3:
                        time.sleep(float(local.random()) * 0.0005)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
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
                            assert acquired.number == last + 1  # FIFO drops nothing
                        else:
                            assert acquired.number > last
                    assert_frame_equals(acquired, expected[acquired.number - base - 1])
                    last = acquired.number
        finally:
            thread.join(timeout=30)
        assert not errors, errors
        assert last - base == total
        assert not consumer._derive_off


# ---- waits -----------------------------------------------------------------------------------------

def acquire_without_a_new_frame_hands_back_the_old_one(display: eglcuda.Display) -> None:
    """An acquire with no new frame waits its whole timeout for one, then hands back the frame
    acquired before: not new, the same number, the same bytes."""
    random = rng()
    with connected(display, 32, 8) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, random)
        producer.present(frame)
        first = consumer.acquire()
        number = first.number
        first.release()
        assert stream.state is StreamState.OLD_FRAME
        started = time.perf_counter()
        again = consumer.acquire(timeout_us=50_000)
        waited = time.perf_counter() - started
        assert not again.is_new and again.number == number
        assert 0.04 < waited < 1.0, waited  # the driver waits the whole timeout for a new frame first
        assert_frame_equals(again, expected)
        again.release()


def present_into_a_full_fifo_waits_for_the_consumer(display: eglcuda.Display) -> None:
    """A FIFO stream of length 2 holding two unacquired frames: a third present waits (GIL
    released) until the consumer acquires one, and the three frames then arrive in order, with
    consecutive numbers, bytes intact."""
    _need_fifo(display, 2)
    random = rng()
    with connected(display, 32, 8, fifo_length=2) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(3)]
        payloads = [fill_random(frame, random) for frame in frames]
        producer.present(frames[0])
        producer.present(frames[1])
        presented: list[float] = []
        errors: list[BaseException] = []

        def present_third() -> None:
            try:
                producer.present(frames[2])
                presented.append(time.perf_counter())
            except BaseException as exc:  # pragma: no cover - the test reports it
                errors.append(exc)

        third = threading.Thread(target=present_third, daemon=True)
        third.start()
        third.join(0.2)
        assert third.is_alive() and not presented, "a present into a full FIFO did not wait"
        # Meanwhile a return_frame on another thread waits for that present no longer than its
        # own timeout, and gets nothing.
        returns: list[tuple[object, float]] = []

        def return_frames() -> None:
            for timeout_us in (0, 100_000):
                started = time.perf_counter()
                returns.append((producer.return_frame(timeout_us), time.perf_counter() - started))

        taker = threading.Thread(target=return_frames, daemon=True)
        taker.start()
        taker.join(2)
        assert not taker.is_alive(), "return_frame waited for the blocked present beyond its timeout"
        assert [back for back, _ in returns] == [None, None]
        assert returns[0][1] < 0.05 and 0.09 < returns[1][1] < 0.6, returns
        assert third.is_alive() and not presented
        acquired_at = time.perf_counter()
        numbers = []
        for index in range(3):
            with consumer.acquire(timeout_us=2_000_000) as acquired:
                assert acquired.is_new
                numbers.append(acquired.number)
                assert_frame_equals(acquired, payloads[index])
            if index == 0:
                third.join(2)
                assert not third.is_alive() and not errors, errors
                assert presented[0] > acquired_at
        assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2]


# ---- threads ---------------------------------------------------------------------------------------

def a_call_waits_for_another_threads_call_on_the_same_endpoint_without_the_gil(display: eglcuda.Display) -> None:
    """One thread's acquire waits in the driver (an empty stream, 300 ms timeout) while a second
    thread closes the consumer: the close waits until the acquire has come back, and while both
    wait, the main thread keeps running Python (neither wait holds the GIL)."""
    with connected(display, 16, 16) as (stream, producer, consumer):
        events: list[tuple[str, float]] = []
        errors: list[BaseException] = []

        def acquire() -> None:
            try:
                consumer.acquire(timeout_us=300_000)
            except eglcuda.Timeout:
                events.append(("acquire timed out", time.perf_counter()))
            except BaseException as exc:  # pragma: no cover - the test reports it
                errors.append(exc)

        def close() -> None:
            events.append(("close called", time.perf_counter()))
            consumer.close()
            events.append(("close returned", time.perf_counter()))

        waiting = threading.Thread(target=acquire)
        started = time.perf_counter()
        waiting.start()
        time.sleep(0.05)  # the acquire is inside the driver by now
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
        # The close came in while the acquire waited in the driver, and got through only after
        # the acquire's 300 ms were up.
        assert when["close called"] < 0.2
        assert when["close returned"] >= 0.25
        assert spins > 1000  # the main thread ran while the other two waited
        assert consumer.closed
        with pytest.raises(eglcuda.ClosedError):
            consumer.acquire(timeout_us=0)


def only_an_acquire_that_cannot_wait_keeps_the_gil(display: eglcuda.Display, fifo_length: int) -> None:
    """An acquire of a frame the producer in this process has certainly presented keeps the GIL
    (docs/streams.md, Synchronization) and still hands over the right frame and number; an acquire
    with no new frame waits out its timeout in the driver with the GIL released: the main thread
    keeps running Python meanwhile."""
    _need_fifo(display, fifo_length)
    random = rng()
    with connected(display, 16, 8, fifo_length=fifo_length) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(2)]
        written = [fill_random(frame, random) for frame in frames]
        producer.present(frames[0])
        with consumer.acquire() as acquired:
            first = acquired.number
            assert_frame_equals(acquired, written[0])
        derived = consumer._numbers_derived
        producer.present(frames[1])
        with consumer.acquire() as acquired:  # the GIL-keeping case: a newer frame is certainly there
            assert (acquired.number, acquired.is_new) == (first + 1, True)
            assert_frame_equals(acquired, written[1])
        assert consumer._numbers_derived == derived + 1

        seen: list[Any] = []
        errors: list[BaseException] = []

        def acquire() -> None:
            try:
                with consumer.acquire(timeout_us=300_000) as again:
                    seen.append((again.number, again.is_new, time.perf_counter()))
            except BaseException as exc:  # pragma: no cover - the test reports it
                errors.append(exc)

        waiting = threading.Thread(target=acquire)
        started = time.perf_counter()
        waiting.start()
        spins = 0
        while waiting.is_alive() and time.perf_counter() - started < 10:
            spins += 1
        waiting.join(10)
        assert not errors, errors
        [(number, is_new, returned)] = seen
        assert (number, is_new) == (first + 1, False)  # the last frame again, after the whole timeout
        assert returned - started >= 0.25
        assert spins > 1000  # the main thread ran while the acquire waited


def many_threads_on_one_producer_keep_its_books(display: eglcuda.Display, fifo_length: int) -> None:
    """Four threads present and take back frames of their own on one producer at once while the
    consumer drains: frames come back once each, every frame the consumer sees is byte for byte
    what its thread wrote, each thread's frames arrive in its own order (and in FIFO mode all of
    them arrive), and the counters add up."""
    _need_fifo(display, fifo_length)
    threads_count, per_thread = 4, 60
    with connected(display, 32, 16, fifo_length=fifo_length) as (stream, producer, consumer):
        rings = [[producer.allocate_frame() for _ in range(3)] for _ in range(threads_count)]
        errors: list[BaseException] = []
        foreign: list = []  # frames that came back to a thread that does not own them
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


# ---- misuse ----------------------------------------------------------------------------------------

def misuse_of_the_stream_and_of_acquired_frames(display: eglcuda.Display) -> None:
    """A producer before the consumer, an acquire while holding a frame, a second release, any use
    of a released frame or its planes, and a write into an acquired frame: each a clear error."""
    with display.create_stream() as stream:
        with pytest.raises(eglcuda.UsageError, match="consumer first"):
            stream.connect_cuda_producer(64, 48)
    with connected(display, 16, 16) as (stream, producer, consumer):
        producer.present(producer.allocate_frame())
        acquired = consumer.acquire()
        with pytest.raises(eglcuda.UsageError, match="release it"):
            consumer.acquire(timeout_us=1000)
        plane = acquired.planes[0]
        acquired.release()
        with pytest.raises(eglcuda.ClosedError):
            acquired.release()
        for use in (lambda: acquired.planes, lambda: plane.pointer, lambda: plane.__cuda_array_interface__,
                    lambda: plane.to_numpy(), lambda: plane.__dlpack__(), lambda: acquired.to_numpy()):
            with pytest.raises(eglcuda.ClosedError):
                use()
        with consumer.acquire(timeout_us=50_000) as again, pytest.raises(eglcuda.UsageError, match="read-only"):
            again.planes[0].copy_from(np.zeros((16, 16, 4), np.uint8))


# ---- the fused loop steps and the stream's books ---------------------------------------------------

def present_and_return_and_acquire_next_loop(display: eglcuda.Display, fifo_length: int, fmt: ColorFormat,
                                             layout: Layout) -> None:
    """The fused steps on a ring of three for 40 rounds: the same Frame objects come back, the
    frame a step released is unusable, every byte arrives."""
    _need_fifo(display, fifo_length)
    random = rng()
    rounds = 40
    with connected(display, 66, 34, format=fmt, layout=layout, fifo_length=fifo_length) as (stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        free = list(ring)
        returned = 0
        acquired = None
        for round_ in range(rounds):
            frame = free.pop(0)
            expected = fill_random(frame, random)
            back = producer.present_and_return(frame, timeout_us=0 if round_ < 2 else 1_000_000)
            if round_ == 0:
                assert back is None, "the only frame in flight came back before it was acquired"
            if back is not None:
                assert any(back is f for f in ring), "present_and_return gave back a frame not from the ring"
                free.append(back)
                returned += 1
            previous = acquired
            acquired = consumer.acquire_next(timeout_us=1_000_000)
            if previous is not None:
                assert previous.released
                with pytest.raises(eglcuda.ClosedError):
                    previous.to_numpy()
            assert acquired.is_new and acquired.number is not None
            assert_frame_equals(acquired, expected)
            assert producer.in_flight + len(free) == 3
        acquired.release()
        assert consumer.frames_acquired == rounds and producer.frames_presented == rounds
        # Every frame presented and released, bar the one the stream may keep, comes back.
        assert returned >= rounds - 3


def state_and_counters(display: eglcuda.Display) -> None:
    """The stream's state through its life, its latency attribute, and EGL's frame counters
    (relative to where they start); the driver's refusal of an attribute after the producer left
    comes back as an EGLError naming the code and the call."""
    stream = display.create_stream(latency_us=500)
    try:
        assert stream.latency_us == 500
        stream.latency_us = 1234
        assert stream.latency_us == 1234
        assert stream.state is StreamState.CREATED
        consumer = stream.connect_cuda_consumer()
        assert stream.state is StreamState.CONNECTING
        producer = stream.connect_cuda_producer(16, 16)
        assert stream.state is StreamState.EMPTY
        before = stream.producer_frame
        producer.present(producer.allocate_frame())
        assert stream.state is StreamState.NEW_FRAME
        assert stream.producer_frame == before + 1
        with consumer.acquire() as acquired:
            assert acquired.number == stream.consumer_frame == before + 1
        assert stream.state is StreamState.OLD_FRAME
        producer.close()
        assert stream.state is StreamState.DISCONNECTED
        with pytest.raises(eglcuda.EGLError) as info:  # the driver refuses, and says so by name
            stream.latency_us = 10
        assert info.value.name == "EGL_BAD_STATE_KHR" and info.value.call == "eglStreamAttribKHR"
    finally:
        stream.close()


def a_frame_closed_after_its_producer_left_lives_while_the_consumer_holds_it(display: eglcuda.Display,
                                                                            fifo_length: int) -> None:
    """The producer disconnects while the consumer (in the same process) holds a frame, and the
    program then closes every frame it presented: the held frame goes on reading the bytes
    presented, however much memory is allocated and written meanwhile; its memory goes once it
    is released."""
    _need_fifo(display, fifo_length)
    random = rng()
    with connected(display, 48, 20, fifo_length=fifo_length) as (stream, producer, consumer):
        frames = [eglcuda.Frame.allocate(48, 20) for _ in range(3)]
        data = [fill_random(frame, random) for frame in frames]
        for frame in frames[:3 if fifo_length else 1]:
            producer.present(frame)
        held = consumer.acquire(1_000_000)
        assert_frame_equals(held, data[0])
        producer.close()
        for frame in frames:
            frame.close()
            assert frame.closed
        others = [eglcuda.Frame.allocate(48, 20) for _ in range(6)]  # (where freed memory would go again)
        for other in others:
            fill_random(other, random)
        assert_frame_equals(held, data[0])
        try:
            held.release()
        except eglcuda.StreamDisconnected:
            pass  # (a driver may say the producer is gone; the frame is released all the same)
        assert held.released
        for other in others:
            other.close()


SCENARIOS: dict[str, Callable[..., None]] = {f.__name__: f for f in (
    numbers_on_a_random_schedule, numbers_with_the_producer_in_another_thread,
    acquire_without_a_new_frame_hands_back_the_old_one, present_into_a_full_fifo_waits_for_the_consumer,
    a_call_waits_for_another_threads_call_on_the_same_endpoint_without_the_gil,
    only_an_acquire_that_cannot_wait_keeps_the_gil,
    many_threads_on_one_producer_keep_its_books, misuse_of_the_stream_and_of_acquired_frames,
    present_and_return_and_acquire_next_loop, state_and_counters,
    a_frame_closed_after_its_producer_left_lives_while_the_consumer_holds_it)}


def _cases() -> list[Any]:
    """(scenario name, options) for every run, as pytest parameters named after both."""
    def case(name: str, tag: str = "", **options: Any) -> Any:
        return pytest.param(name, options, id=f"{name}-{tag}" if tag else name)

    cases = []
    for fifo_length, tag in ((0, "mailbox"), (4, "fifo4")):
        cases.append(case("numbers_on_a_random_schedule", tag, fifo_length=fifo_length))
        cases.append(case("numbers_with_the_producer_in_another_thread", tag, fifo_length=fifo_length))
    cases.append(case("acquire_without_a_new_frame_hands_back_the_old_one"))
    cases.append(case("present_into_a_full_fifo_waits_for_the_consumer"))
    cases.append(case("a_call_waits_for_another_threads_call_on_the_same_endpoint_without_the_gil"))
    for fifo_length, tag in ((0, "mailbox"), (4, "fifo4")):
        cases.append(case("only_an_acquire_that_cannot_wait_keeps_the_gil", tag, fifo_length=fifo_length))
    for fifo_length, tag in ((0, "mailbox"), (8, "fifo8")):
        cases.append(case("many_threads_on_one_producer_keep_its_books", tag, fifo_length=fifo_length))
    cases.append(case("misuse_of_the_stream_and_of_acquired_frames"))
    for fmt, layout in ((ColorFormat.ARGB, Layout.PITCH), (ColorFormat.NV12, Layout.PITCH),
                        (ColorFormat.ARGB, Layout.ARRAY), (ColorFormat.YUV420_PLANAR, Layout.ARRAY)):
        for fifo_length, tag in ((0, "mailbox"), (3, "fifo3")):
            cases.append(case("present_and_return_and_acquire_next_loop", f"{fmt.name}-{layout.value}-{tag}",
                              fifo_length=fifo_length, fmt=fmt, layout=layout))
    cases.append(case("state_and_counters"))
    for fifo_length, tag in ((0, "mailbox"), (3, "fifo3")):
        cases.append(case("a_frame_closed_after_its_producer_left_lives_while_the_consumer_holds_it", tag,
                          fifo_length=fifo_length))
    return cases


CASES = _cases()


def run(display: eglcuda.Display, name: str, options: dict[str, Any]) -> None:
    """Run the scenario ``name`` with ``options`` on ``display``."""
    SCENARIOS[name](display, **options)
