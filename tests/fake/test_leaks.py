"""Leaks: the per-frame path allocates nothing and leaks no reference over thousands of calls;
create/close cycles leave the driver's objects, memory and descriptors where they were.

(sys.gettotalrefcount exists in debug builds only: references are counted per object with
sys.getrefcount, Python memory with tracemalloc, objects with the garbage collector, driver
objects with the fake's own counts.)"""
from __future__ import annotations

import gc
from collections import Counter
import os
import sys
import tracemalloc


import eglcuda
from eglcuda import ColorFormat, Layout

from .harness import fake, fake_driver_test
from .kit import connected, display, fill_random, rng, stream_of


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def object_types() -> Counter:
    return Counter(type(o).__name__ for o in gc.get_objects())


class Flat:
    """Python memory (tracemalloc), garbage-collected objects and the fake's driver objects, before
    and after: ``check`` fails if any grew by more than the slack."""

    def __init__(self) -> None:
        self._driver_state()  # first calls through ctypes make objects: not this test's growth
        gc.collect()
        self.types = object_types()
        tracemalloc.start()
        self.memory = tracemalloc.get_traced_memory()[0]
        self.objects = len(gc.get_objects())
        self.driver = self._driver_state()

    @staticmethod
    def _driver_state() -> tuple:
        return fake.objects(), fake.live_allocations(), open_fds()

    def check(self, memory_slack: int, object_slack: int) -> None:
        driver = self._driver_state()
        gc.collect()
        grown_memory = tracemalloc.get_traced_memory()[0] - self.memory
        grown_objects = len(gc.get_objects()) - self.objects
        top = tracemalloc.take_snapshot().statistics("lineno")[:3]
        tracemalloc.stop()
        assert driver == self.driver, f"driver objects, allocations or descriptors leaked: {self.driver} -> {driver}"
        grown_types = {k: v for k, v in (object_types() - self.types).items() if v > 2}
        assert grown_objects <= object_slack, f"{grown_objects} more objects ({grown_types}); most memory: {top}"
        assert grown_memory <= memory_slack, f"{grown_memory} more bytes; most memory: {top}"


@fake_driver_test(timeout_s=120)
def test_five_thousand_rounds_of_every_per_frame_call_leak_nothing():
    """5,000 rounds, each with every per-frame call (present, acquire, frame number and planes read,
    release, return, present_and_return, acquire_next): Python memory and objects flat, no
    reference to a frame or endpoint left behind, the driver's allocations and objects flat."""
    random = rng()
    with stream_of(32, 8, fifo_length=2) as (_, stream, producer, consumer):
        ring = [producer.allocate_frame() for _ in range(4)]
        for frame in ring:
            fill_random(frame, random)
        free = list(ring)

        def rounds(count: int) -> None:
            held = None
            for _ in range(count):
                if held is not None:
                    held.release()
                producer.present(free.pop(0))
                acquired = consumer.acquire(1_000_000)
                assert acquired.is_new and acquired.number > 0
                acquired.planes[0].pointer  # builds the plane objects
                acquired.release()
                back = producer.return_frame(1_000_000)
                if back is not None:
                    free.append(back)
                back = producer.present_and_return(free.pop(0), timeout_us=1_000_000)
                if back is not None:
                    free.append(back)
                held = consumer.acquire_next(1_000_000)
                assert held.is_new
                del acquired
            held.release()
            held = None
            while (back := producer.return_frame(0)) is not None:
                free.append(back)

        rounds(200)  # warm-up: caches, spares, first-call allocations
        references = [sys.getrefcount(x) for x in (*ring, producer, consumer, stream)]
        flat = Flat()
        rounds(5000)
        assert producer.frames_presented == 2 * 5200
        flat.check(memory_slack=16 << 10, object_slack=20)
        assert [sys.getrefcount(x) for x in (*ring, producer, consumer, stream)] == references, \
            "a reference to a frame or endpoint leaked"


@fake_driver_test(timeout_s=120)
def test_thousand_create_close_cycles_leave_everything_flat():
    """1,000 cycles of display, stream (some cross-process, with their descriptor), consumer,
    producer, frames (pitch and array), a round trip and close: driver allocations and objects,
    open descriptors, Python memory and objects where they were."""
    random = rng()

    def cycle(index: int) -> None:
        with display() as opened:
            layout = Layout.ARRAY if index % 3 == 0 else Layout.PITCH
            fmt = ColorFormat.NV12 if index % 2 else ColorFormat.ARGB
            with opened.create_stream(fifo_length=index % 3, cross_process=index % 4 == 0) as stream:
                consumer = stream.connect_cuda_consumer()
                producer = stream.connect_cuda_producer(32, 16, format=fmt, layout=layout)
                a, b = producer.allocate_frame(), producer.allocate_frame()
                fill_random(a, random)
                producer.present(a)
                consumer.acquire().release()
                producer.present(b)
                consumer.acquire().release()
                assert producer.return_frame(timeout_us=1_000_000) is a
            a.close()
            b.close()

    for index in range(20):
        cycle(index)
    flat = Flat()
    for index in range(1000):
        cycle(index)
    flat.check(memory_slack=32 << 10, object_slack=20)
    assert fake.count("stream_handles") == fake.count("streams") == fake.count("connections") == 0
    assert fake.count("terminated_handles") == 0, "a display was terminated with streams still open on it"


@fake_driver_test
def test_endpoints_and_frames_dropped_without_close_are_released_by_the_collector():
    with display() as opened:
        baseline = fake.objects()
        stream = opened.create_stream()
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(16, 8)
        producer.present(producer.allocate_frame())
        held = consumer.acquire()
        assert fake.count("connections") == 2 and fake.count("held") == 1
        del stream, consumer, producer, held
        gc.collect()
        assert fake.objects() == baseline


@fake_driver_test
def test_streams_made_and_closed_on_one_open_display_leave_nothing_behind():
    with display() as opened:
        def cycle() -> None:
            with connected(opened, 16, 8) as (stream, producer, consumer):
                producer.present(producer.allocate_frame())
                consumer.acquire().release()

        for _ in range(20):
            cycle()
        flat = Flat()
        for _ in range(1000):
            cycle()
        flat.check(memory_slack=32 << 10, object_slack=20)


@fake_driver_test
def test_a_frame_dropped_without_close_frees_its_memory_at_once():
    with display():
        gc.disable()
        before = fake.live_allocations()
        frame = eglcuda.Frame.allocate(64, 32)
        assert fake.live_allocations() == before + 1
        del frame
        assert fake.live_allocations() == before, "the memory waits for the garbage collector"


@fake_driver_test
def test_a_cuda_vmm_subscriber_closed_before_reading_its_slots_leaves_no_descriptor():
    """An 'every' subscriber reads its publisher's SLOT messages (one descriptor each) several
    at a time; closed after its first message, with the others read but not mapped yet, it
    closes their descriptors too (they stayed open, one per slot, for the process's life)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    before = None
    for _ in range(3):
        pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["cuda-vmm"])
        sub = eglcuda.Subscriber("t", path=path, qos="every")
        for _ in range(3):
            pub.publish(pub.next_frame(5))
        sub.receive(5).release()
        sub.close()
        pub.close()
        gc.collect()
        if before is None:
            before = open_fds()  # (after a first round: what the driver keeps open once used)
    assert open_fds() == before
    os.rmdir(folder)


@fake_driver_test
def test_a_cuda_vmm_subscriber_dropped_before_reading_its_slots_leaves_no_descriptor():
    """Dropped for not reading: its receive reads ahead to the drop, past SLOT messages that
    carry a descriptor each, and closes those too (one stayed open per drop)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["cuda-vmm"], every_timeout=0.1)
    before = None
    for _ in range(3):
        sub = eglcuda.Subscriber("t", path=path, qos="every", queue=2)
        while not pub.dropped or pub.subscribers:
            pub.publish(pub.next_frame(5))
        try:
            sub.receive(5)
        except eglcuda.Dropped as exc:
            assert "every_timeout" in str(exc)
        else:
            raise AssertionError("a dropped subscriber received a frame")
        sub.close()
        gc.collect()
        if before is None:
            before = open_fds()
    assert open_fds() == before
    pub.close()
    os.rmdir(folder)
