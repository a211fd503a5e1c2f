"""Frame numbers without the EGL query: with both ends of a stream in this process, the consumer
numbers frames from the producer's present counts where that is exact (csrc/hotpath.c,
derive_plan). Every number is checked against EGL's own counter, and every frame's bytes against
the present it must come from, in mailbox and FIFO mode, on random schedules and across threads."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected, fill_random


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


@pytest.mark.parametrize("fifo_length", [0, 4], ids=["mailbox", "fifo4"])
def test_numbers_match_egl_and_frames_match_their_present_on_a_random_schedule(display, fifo_length):
    rng = np.random.default_rng()
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
            burst = int(rng.choice(4, p=[0.45, 0.35, 0.1, 0.1]))  # under one a step: the queue drains too
            for _ in range(min(burst, len(free), room)):
                frame = free.pop(int(rng.integers(len(free))))
                presented.append(fill_random(frame, rng))
                if rng.random() < 0.5:
                    producer.present(frame)
                else:
                    back = producer.present_and_return(frame)
                    if back is not None:
                        free.append(back)
            if not presented:
                continue
            waiting = len(presented) > latched
            timeout_us = 500_000 if waiting else 2_000  # the old frame comes back after the timeout
            if rng.random() < 0.5:
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


@pytest.mark.parametrize("fifo_length", [0, 4], ids=["mailbox", "fifo4"])
def test_numbers_match_egl_with_the_producer_in_another_thread(display, fifo_length):
    rng = np.random.default_rng()
    total = 400
    with connected(display, 40, 12, fifo_length=fifo_length) as (stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(6)]
        expected = [fill_random(pool[0], rng)]
        producer.present(pool[0])
        with consumer.acquire() as first:
            base = first.number - 1  # the number of the n-th present is base + n
            assert_frame_equals(first, expected[0])
        errors: list[BaseException] = []

        def produce() -> None:
            local = np.random.default_rng(int(rng.integers(2**32)))
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
        numbers = []
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
                        numbers.append(acquired.number)
                    assert_frame_equals(acquired, expected[acquired.number - base - 1])
                    last = acquired.number
        finally:
            thread.join(timeout=30)
        assert not errors, errors
        assert last - base == total
        assert not consumer._derive_off
