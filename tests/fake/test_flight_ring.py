"""The producer's frames in flight and the endpoints' timeouts, as a loop sees them: every frame
comes back as the object presented, in whatever order the stream gives them back, across many
more presents than the in-flight table has slots; a timeout read once per object still refuses
every bad one."""
from __future__ import annotations

import numpy as np
import pytest

import eglcuda
from eglcuda.streams.cuda import MAX_FRAMES_IN_FLIGHT

from .harness import fake, fake_driver_test
from .kit import assert_frame_equals, fill_random, rng, stream_of


@fake_driver_test
def test_frames_come_back_as_presented_past_the_table_size():
    random = rng()
    with stream_of(32, 16, fifo_length=2) as (_, _, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(3)]
        free = list(ring)
        in_order = []
        for step in range(3 * MAX_FRAMES_IN_FLIGHT + 5):  # the table wraps several times
            frame = free.pop(0)
            expected = fill_random(frame, random)
            producer.present(frame)
            in_order.append(frame)
            assert producer.in_flight == len(in_order)
            assert [id(f) for f in producer._in_flight.values()] == [id(f) for f in in_order]
            with consumer.acquire(1_000_000) as acquired:
                assert acquired.is_new and acquired.number is not None
                assert_frame_equals(acquired, expected)
            back = producer.return_frame(1_000_000 if step else 0)
            if back is not None:
                assert back is in_order.pop(0), f"step {step}: a frame came back out of present order"
                free.append(back)
        while in_order:
            back = producer.return_frame(1_000)
            if back is None:
                break
            assert back is in_order.pop(0)


@fake_driver_test
def test_a_frame_returned_out_of_present_order():
    # Mailbox: while the consumer holds A, B is replaced by C without being acquired, so B comes
    # back before A, the older frame.
    random = rng()
    with stream_of(32, 16, fifo_length=0) as (_, _, producer, consumer):
        a, b, c = (producer.allocate_frame() for _ in range(3))
        data = {}
        for frame in (a, b, c):
            data[id(frame)] = fill_random(frame, random)
        producer.present(a)
        held = consumer.acquire(1_000_000)
        assert_frame_equals(held, data[id(a)])
        producer.present(b)
        producer.present(c)
        assert producer.in_flight == 3
        assert producer.return_frame(100_000) is b  # taken from the middle of the table
        assert producer.in_flight == 2 and [id(f) for f in producer._in_flight.values()] == [id(a), id(c)]
        held.release()
        with consumer.acquire(1_000_000) as latest:
            assert latest.is_new
            assert_frame_equals(latest, data[id(c)])
        assert producer.return_frame(100_000) is a
        assert producer.in_flight == 1 and [id(f) for f in producer._in_flight.values()] == [id(c)]
        for _ in range(2):  # reuse: the newest frame stays with the stream
            assert producer.return_frame(0) is None
        data[id(b)] = fill_random(b, random)
        producer.present(b)
        with consumer.acquire(1_000_000) as again:
            assert_frame_equals(again, data[id(b)])
        assert producer.return_frame(100_000) is c


@fake_driver_test
def test_a_timeout_read_once_still_refuses_bad_ones():
    presents = "cuEGLStreamProducerPresentFrame"
    with stream_of(32, 16) as (_, _, producer, consumer):
        frame, other = producer.allocate_frame(), producer.allocate_frame()
        good = 1_000_000
        producer.present(frame)
        consumer.acquire(good).release()
        assert producer.return_frame(good) is None  # reuse: one frame in flight stays
        before = fake.calls(presents)
        for bad in (None, True, -1, 2**31, 1.5, "10", np.bool_(True), np.float64(5), np.int64(-1)):
            for call in (lambda: producer.return_frame(bad), lambda: producer.present_and_return(other, None, bad),
                         lambda: consumer.acquire(bad), lambda: consumer.acquire_next(bad)):
                with pytest.raises(eglcuda.UsageError, match="microseconds"):
                    call()
            # the good object still reads as itself after a bad one, and the other way round
            assert producer.return_frame(good) is None
        assert fake.calls(presents) == before
        producer.present(other)
        with consumer.acquire(np.int64(good)) as acquired:  # (a NumPy integer is the int it holds)
            assert acquired.is_new
        assert producer.return_frame(np.uint32(good)) is frame
