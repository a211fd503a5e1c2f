"""A topic's publisher and subscriber misused the way users do, on the fake driver: a foreign CUDA
array whose bytes within a row are not one after the other. Each case says what a user gets: a
clear exception, and no subscriber paying for the publisher's mistake."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import eglcuda
from eglcuda import UsageError

from .harness import fake_driver_test


class _Foreign:
    """A foreign CUDA array (as CuPy or PyTorch describe theirs) over eglcuda-allocated memory."""

    def __init__(self, pointer: int, shape: tuple, strides: tuple) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "|u1",
                                         "data": (pointer, False), "version": 3}


def _topic() -> tuple[eglcuda.Publisher, str]:
    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    return eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["cuda-vmm"]), path


@fake_driver_test
def test_publish_from_refuses_a_device_array_whose_rows_are_not_contiguous():
    """A column slice (every other byte of a wider row: strides (pitch, 2)) has the plane's shape,
    but copying its rows as consecutive bytes would publish other pixels: it is refused, the pool
    frame goes back, and a contiguous view of the same memory (any pitch) is published as is."""
    pub, path = _topic()
    sub = eglcuda.Subscriber("t", path=path, qos="every")
    memory = eglcuda.Frame.allocate(128, 72, "NV12")
    plane = memory.planes[0]
    rows = (np.arange(72 * 128) % 251).astype(np.uint8).reshape(72, 128)
    plane.copy_from(rows)
    pointer, pitch = plane.pointer, plane.pitch
    chroma = _Foreign(pointer, (24, 32, 2), (pitch, 2, 1))
    for shape, strides in (((48, 64), (pitch, 2)), ((48, 32, 2), (pitch, 4, 1)), ((48, 32, 2), (pitch, 1, 32))):
        with pytest.raises(UsageError, match="one after the other"):
            pub.publish_from([_Foreign(pointer, shape, strides), chroma])
    with pytest.raises(UsageError, match="shape"):
        pub.publish_from([_Foreign(pointer, (), ()), chroma])  # (a zero-dimensional array)
    with pytest.raises(UsageError, match="one after the other"):
        pub.publish_from(_Foreign(pointer, (72, 64), (pitch, 2)))  # (a stacked NV12 source)
    assert pub.published == 0 and pub.pool_size == 8  # (each refused frame went back)
    seq = pub.publish_from([_Foreign(pointer, (48, 64), (pitch, 1)), _Foreign(pointer, (24, 32, 2), (pitch, 2, 1))])
    with sub.receive(5) as message:
        assert message.seq == seq
        assert np.array_equal(message.frame.planes[0].to_numpy(), rows[:48, :64])
    sub.close()
    pub.close()
    memory.close()


@fake_driver_test(misuse_ok=True)  # (the fake counts the destroyed stream handed to it)
def test_a_publish_on_a_destroyed_stream_raises_and_drops_no_subscriber():
    """publish() with a CUDA stream the driver refuses (one destroyed since, or of another GPU)
    raises the driver's error to the publisher; its subscribers stay, and get the next frame
    published on a good stream. (Each was dropped, 'delivering frame 0 failed', and publish()
    returned as if the frame had gone out.)"""
    pub, path = _topic()
    every = eglcuda.Subscriber("t", path=path, qos="every")
    latest = eglcuda.Subscriber("t", path=path)
    other = eglcuda.Subscriber("t", path=path)
    destroyed = other.cuda_stream  # (the stream a subscriber made for itself goes with its close)
    other.close()
    frame = pub.next_frame(cuda_stream=destroyed)
    with pytest.raises(eglcuda.CUDAError):
        pub.publish(frame, cuda_stream=destroyed)
    assert pub.dropped == [] and len(pub.subscribers) == 2
    seq = pub.publish_from([np.full((48, 64), 7, np.uint8), np.full((24, 32, 2), 9, np.uint8)])
    for sub in (every, latest):
        with sub.receive(5) as message:
            assert message.seq == seq and int(message.frame.planes[0].to_numpy()[0, 0]) == 7
    assert pub.dropped == []
    every.close()
    latest.close()
    pub.close()


@fake_driver_test(misuse_ok=True)  # (the fake counts the destroyed stream handed to it)
def test_a_release_on_a_destroyed_stream_raises_and_keeps_the_message():
    """Message.release(cuda_stream=...) with a stream the driver refuses raises its error; the
    message stays held and readable, and a release that works gives the frame back. (The
    release was lost without a word: the publisher kept each such frame for good, and a
    'latest' subscriber received nothing more after four.)"""
    pub, path = _topic()
    sub = eglcuda.Subscriber("t", path=path)
    other = eglcuda.Subscriber("t", path=path)
    destroyed = other.cuda_stream
    other.close()
    for value in range(8):
        seq = pub.publish_from([np.full((48, 64), value, np.uint8), np.zeros((24, 32, 2), np.uint8)])
        message = sub.receive(5)
        assert message.seq == seq
        with pytest.raises(eglcuda.CUDAError):
            message.release(cuda_stream=destroyed)
        assert not message.released and sub.held == 1
        assert int(message.frame.planes[0].to_numpy()[0, 0]) == value
        message.release()
        assert message.released and sub.held == 0
    assert [s.outstanding for s in pub.subscribers] == [0] and pub.dropped == []
    sub.close()
    pub.close()


@fake_driver_test
def test_a_message_held_past_its_subscribers_drop_cannot_be_read():
    """An ``every`` subscriber holds its frame past the publisher's ``every_timeout`` while the
    publisher needs the slot: the publisher drops it and writes the slot again. Reading the held
    message then raises ClosedError (it used to show the next frame's bytes), and receive()
    raises Dropped with the reason. (cuda-vmm, which one process may be both ends of; a cuda-ipc
    view asks the same frame ring.)"""
    transport = "cuda-vmm"
    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    rng = np.random.default_rng(5)
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=[transport], pool=1, max_pool=1,
                            every_timeout=0.3)
    sub = eglcuda.Subscriber("t", path=path, qos="every", transport=transport)
    first = [rng.integers(0, 256, (48, 64), np.uint8), rng.integers(0, 256, (24, 32, 2), np.uint8)]
    pub.publish_from(first)
    message = sub.receive(5)
    assert np.array_equal(message.frame.planes[0].to_numpy(), first[0])
    plane = message.frame.planes[0]  # (a plane kept past its message: it stops too)
    second = [rng.integers(0, 256, (48, 64), np.uint8), rng.integers(0, 256, (24, 32, 2), np.uint8)]
    pub.publish_from(second)  # (waits every_timeout for the held slot, drops the subscriber, writes it)
    assert len(pub.dropped) == 1
    with pytest.raises(eglcuda.ClosedError, match="dropped"):
        message.frame.planes[0].to_numpy()
    with pytest.raises(eglcuda.ClosedError, match="dropped"):
        plane.to_numpy()
    with pytest.raises(eglcuda.ClosedError, match="dropped"):
        plane.__dlpack__()
    with pytest.raises(eglcuda.ClosedError, match="dropped"):
        plane.__cuda_array_interface__
    with pytest.raises(eglcuda.Dropped, match="every_timeout"):
        sub.receive(1)
    message.release()
    sub.close()
    pub.close()


@fake_driver_test
@pytest.mark.parametrize("source_layout", ["pitch", "array"])
def test_publish_from_a_frame_into_a_topic_of_cuda_arrays_copies_every_byte(source_layout):
    """A ``layout="array"`` topic's pool frames are CUDA arrays: ``publish_from(frame)`` copies a
    pitch-linear or CUDA-array frame into them (it used to refuse every frame source), and an
    EGLStream subscriber receives every byte."""
    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    rng = np.random.default_rng(11)
    pub = eglcuda.Publisher("t", 64, 48, "NV12", layout="array", path=path)
    sub = eglcuda.Subscriber("t", path=path, qos="every", transport="eglstream")
    source = eglcuda.Frame.allocate(64, 48, "NV12", layout=source_layout)
    for round in range(3):
        data = [rng.integers(0, 256, plane.shape, np.uint8) for plane in source.planes]
        for plane, values in zip(source.planes, data):
            plane.copy_from(values)
        seq = pub.publish_from(source)
        with sub.receive(5) as message:
            assert message.seq == seq
            for plane, values in zip(message.frame.planes, data):
                assert np.array_equal(plane.to_numpy(), values)
    sub.close()
    pub.close()
    source.close()


@fake_driver_test
def test_publish_from_gives_back_its_frame_when_publish_refuses_an_argument():
    """publish_from() took a pool frame, copied into it, and then publish() refused a payload or
    a timestamp: the frame stayed taken for good (nobody but publish_from ever had it), and a
    small pool ran dry after as many refusals. Sources that are no frame's planes, or a NumPy
    array of no rows, are refused with the reason (they were bare IndexError/TypeError)."""
    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, pool=1, max_pool=2)
    sub = eglcuda.Subscriber("t", path=path, qos="every")
    rng = np.random.default_rng()
    for bad in (dict(payload="text"), dict(payload=b"x" * 20000), dict(timestamp_ns=-1)) * 2:
        with pytest.raises(UsageError):
            pub.publish_from(np.zeros((72, 64), np.uint8), **bad)
    for source in (np.zeros(()), np.zeros((0,), np.uint8), np.zeros((0, 64), np.uint8),
                   type("NoPlanes", (), {"planes": None})(), type("Odd", (), {"planes": [object(), object()]})()):
        with pytest.raises(UsageError):
            pub.publish_from(source)
    assert pub.published == 0
    stacked = rng.integers(0, 256, (72, 64), dtype=np.uint8)
    seq = pub.publish_from(stacked, timeout=1.0, payload=b"ok")
    with sub.receive(5) as message:
        assert (message.seq, message.payload) == (seq, b"ok")
        assert np.array_equal(message.frame.planes[0].to_numpy(), stacked[:48])
        assert np.array_equal(message.frame.planes[1].to_numpy().reshape(24, 64), stacked[48:])
    sub.close()
    pub.close()


@fake_driver_test
def test_an_eglstream_subscriber_waits_forever_and_its_descriptor_stays_quiet_while_it_holds_all_it_may():
    """Through an EGLStream (one process: both ends on the fake's streams): ``receive(math.inf)``
    and a timeout beyond any float wait for the next frame as ``None`` would; an ``every``
    subscriber holding its one message is not readable while more frames are announced (nothing
    it could take), and readable again once it released it."""
    import math
    import select
    import threading

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["eglstream"])
    sub = eglcuda.Subscriber("t", path=path, qos="every", transport="eglstream", timeout=0.2)

    def publish_soon() -> None:
        pub.publish_from([np.zeros((48, 64), np.uint8), np.zeros((24, 32, 2), np.uint8)])

    for forever in (math.inf, 10**400):
        timer = threading.Timer(0.3, publish_soon)
        timer.start()
        with sub.receive(forever) as message:  # (longer than the subscriber's own timeout)
            assert message.frame is not None
        timer.join()
    fd = sub.fileno()
    publish_soon()
    held = sub.receive(2)
    publish_soon()  # (announced to a subscriber that can take nothing more)
    publish_soon()
    assert select.select([fd], [], [], 0.3)[0] == []
    held.release()
    assert select.select([fd], [], [], 2)[0] == [fd]
    with sub.receive(0) as message:
        assert message.seq == held.seq + 1
    sub.close()
    pub.close()


@fake_driver_test
def test_a_subscriber_whose_own_transport_fails_tells_its_publisher_why():
    """The subscriber's acquire fails in the driver (an EGLStream subscriber, one process): it raises
    StreamDisconnected naming the call, rejoins with wait_for_publisher(), and the publisher counts
    it as having left with that reason, not as a process that died; the others go on."""
    from .harness import fake

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["eglstream"])
    failing = eglcuda.Subscriber("t", path=path, qos="every", transport="eglstream", timeout=1)
    other = eglcuda.Subscriber("t", path=path, qos="every", transport="eglstream", timeout=1)
    planes = [np.zeros((48, 64), np.uint8), np.zeros((24, 32, 2), np.uint8)]
    pub.publish_from(planes)
    with other.receive(1):
        pass
    fake.fail("cuEGLStreamConsumerAcquireFrame", 999)
    with pytest.raises(eglcuda.StreamDisconnected, match="cuEGLStreamConsumerAcquireFrame"):
        failing.receive(1)
    failing.wait_for_publisher(2)
    pub.publish_from(planes)
    for sub in (failing, other):
        with sub.receive(1) as message:
            assert message.seq == 1
    assert pub.dropped == [], pub.dropped
    failing.close()
    other.close()
    pub.close()


@fake_driver_test
def test_subscribers_that_close_while_the_publisher_publishes_flat_out_have_left_not_dropped():
    """Four threads join an EGLStream topic, take a few frames each and close, again and again,
    while another publishes flat out. A subscriber closing releases its frames, says goodbye and
    disconnects its consumer; the publisher may read a release, fail to take the frame back from
    the disconnected consumer and find only the next release on the socket: every close must
    still count as having left (docs/topics.md, Failures), none as a transport failure."""
    import random
    import threading
    import time

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["eglstream"])
    planes = [np.zeros((48, 64), np.uint8), np.zeros((24, 32, 2), np.uint8)]
    stop = threading.Event()
    closes = [0]
    errors: list[BaseException] = []

    def publish() -> None:
        while not stop.is_set():
            pub.publish_from(planes)

    def churn(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                with eglcuda.Subscriber("t", path=path, qos=rnd.choice(["every", "latest"]), transport="eglstream",
                                        timeout=5) as sub:
                    for _ in range(rnd.randint(1, 20)):
                        try:
                            with sub.receive(2):
                                pass
                        except eglcuda.Timeout:
                            if not stop.is_set():
                                raise
                            break
                closes[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=publish)] + [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(5)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert closes[0] > 100
    assert [(drop.code, drop.reason) for drop in pub.dropped] == []
    pub.close()


@fake_driver_test
def test_a_subscriber_read_by_another_thread_of_the_publishers_process_gets_the_frames_announced_before_close():
    """An 'every' EGLStream subscriber in the publisher's own process, read by another thread that
    takes 50 ms a frame: the publisher announces four frames of random bytes and closes. The
    subscriber reads all four, byte for byte, in order, then its iteration ends (docs/topics.md,
    Failures: the frames announced before the goodbye come first)."""
    import threading
    import time

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["eglstream"])
    sub = eglcuda.Subscriber("t", path=path, qos="every", queue=4, transport="eglstream", timeout=2)
    rng = np.random.default_rng()
    sent = [[rng.integers(0, 256, (48, 64), np.uint8), rng.integers(0, 256, (24, 32, 2), np.uint8)] for _ in range(4)]
    got: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for message in sub:
                planes = message.frame.to_numpy()
                got.append((message.seq, all(np.array_equal(a, b) for a, b in zip(planes, sent[message.seq]))))
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for planes in sent:
        pub.publish_from(planes)
    pub.close()
    reader.join(10)
    assert not errors, errors
    assert got == [(0, True), (1, True), (2, True), (3, True)]
    sub.close()


@fake_driver_test
def test_a_batcher_closed_with_a_batch_out_lets_its_stream_go_with_that_batch():
    """Batcher.close() with a batch still out: the batcher's own CUDA stream stays for that batch,
    and goes once the batch is released and dropped, while the closed batcher object lives on."""
    import gc

    from .harness import fake

    folder = tempfile.mkdtemp(prefix="eglcuda-fake-topic-")
    path = os.path.join(folder, "t.topic")
    streams = fake.count("cuda_streams")
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["cuda-vmm"])
    sub = eglcuda.Subscriber("t", path=path, qos="every", transport="cuda-vmm", timeout=2)
    before = fake.count("cuda_streams")
    batcher = eglcuda.Batcher([sub], batch_size=1)
    assert fake.count("cuda_streams") == before + 1
    pub.publish_from([np.full((48, 64), 3, np.uint8), np.full((24, 32, 2), 5, np.uint8)])
    batch = batcher.next(timeout=2)
    batcher.close()
    assert fake.count("cuda_streams") == before + 1  # (the batch out still orders its reads on it)
    batch.release()
    del batch
    gc.collect()
    assert fake.count("cuda_streams") == before and batcher.cuda_stream is None
    sub.close()
    pub.close()
    assert fake.count("cuda_streams") == streams
