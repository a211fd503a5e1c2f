"""EGLStreams between two GPUs: producer on one, consumer on the other, in one process and in
two, in both directions, every format and layout, every byte of random frames checked; and what
eglcuda refuses before the driver. Skipped with the reason on a machine with fewer than two
GPUs (EGLCUDA_REQUIRE_TWO_GPUS=1 turns that skip into a failure, on a machine that has two)."""
from __future__ import annotations

import os
import tempfile
import threading

import numpy as np
import pytest

import eglcuda
import eglcuda.info
from eglcuda import ColorFormat, Layout

from ..conftest import require_extension
from .streamkit import assert_frame_equals, fill_random, produce_payloads
from .test_crossprocess import TOLD, Peer, check

FORMATS = [ColorFormat.ARGB, ColorFormat.ABGR, ColorFormat.RGBA, ColorFormat.BGRA, ColorFormat.Y, ColorFormat.A,
           ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YUV444_PLANAR]
DIRECTIONS = [(1, 0), (0, 1)]  # (producer GPU, consumer GPU)


@pytest.fixture(scope="module")
def two_gpus(cuda_ordinal):
    """Both CUDA devices 0 and 1, each with an NVIDIA EGL display that streams."""
    reason = None
    count = eglcuda._bind.cuda.device_count()
    if count < 2:
        reason = f"needs two GPUs: this machine has {count} CUDA device(s)"
    elif not {0, 1} <= {d.cuda_ordinal for d in eglcuda.devices()}:
        reason = "needs an EGL device for CUDA devices 0 and 1 (EGL_NV_device_cuda)"
    if reason:
        if os.environ.get("EGLCUDA_REQUIRE_TWO_GPUS") == "1":
            pytest.fail(f"{reason} (and EGLCUDA_REQUIRE_TWO_GPUS=1 says this tier must run)")
        pytest.skip(reason)
    displays = {ordinal: eglcuda.Display.for_cuda_device(ordinal) for ordinal in (0, 1)}
    for display in displays.values():
        require_extension(display, "EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
    yield displays
    for display in displays.values():
        display.close()


@pytest.mark.parametrize("layout", [Layout.PITCH, Layout.ARRAY], ids=lambda l: l.value)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: f"gpu{d[0]}-to-gpu{d[1]}")
def test_every_byte_crosses_gpus_in_one_process(two_gpus, direction, fmt, layout):
    producer_gpu, consumer_gpu = direction
    rng = np.random.default_rng()
    width, height = 96, 64
    with two_gpus[consumer_gpu].create_stream(fifo_length=2, cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(width, height, device=producer_gpu, format=fmt, layout=layout)
        assert producer.device.ordinal == producer_gpu and consumer.device.ordinal == consumer_gpu
        frames = [producer.allocate_frame() for _ in range(3)]
        assert all(frame.device.ordinal == producer_gpu for frame in frames)
        for round_ in range(6):
            frame = frames[round_] if round_ < 3 else producer.return_frame(timeout_us=2_000_000)
            assert frame is not None, f"round {round_}: no frame came back"
            expected = fill_random(frame, rng)
            producer.present(frame)
            with consumer.acquire(timeout_us=2_000_000) as acquired:
                assert acquired.is_new
                assert (acquired.width, acquired.height, acquired.layout) == (width, height, layout)
                assert acquired.format == TOLD.get(fmt, fmt)
                assert_frame_equals(acquired, expected)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: f"gpu{d[0]}-to-gpu{d[1]}")
def test_a_threaded_fifo_loop_keeps_order_and_bytes_across_gpus(two_gpus, direction):
    producer_gpu, consumer_gpu = direction
    rng = np.random.default_rng()
    count = 120
    payloads = [rng.integers(0, 256, (270, 480, 4), dtype=np.uint8) for _ in range(count)]
    with two_gpus[consumer_gpu].create_stream(fifo_length=4, cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(480, 270, device=producer_gpu)
        errors: list = []
        pool = [producer.allocate_frame() for _ in range(6)]
        worker = threading.Thread(target=produce_payloads, args=(producer, pool, payloads, errors))
        worker.start()
        numbers = []
        try:
            for index in range(count):
                with consumer.acquire(timeout_us=5_000_000) as acquired:
                    assert acquired.is_new, f"frame {index} repeated"
                    numbers.append(acquired.number)
                    got = acquired.planes[0].to_numpy()
                    assert np.array_equal(got, payloads[index]), f"frame {index} differs"
        finally:
            worker.join(30)
        assert not errors, errors
        assert numbers == list(range(numbers[0], numbers[0] + count)), "FIFO numbers are consecutive"


@pytest.mark.parametrize("layout", ["pitch", "array"])
@pytest.mark.parametrize("fmt", [ColorFormat.ARGB, ColorFormat.NV12], ids=lambda f: f.name)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: f"gpu{d[0]}-to-gpu{d[1]}")
def test_every_byte_crosses_gpus_between_processes(two_gpus, direction, fmt, layout):
    producer_gpu, consumer_gpu = direction
    seed = int(np.random.default_rng().integers(1, 2**31))
    frames = 30
    with tempfile.TemporaryDirectory(prefix="eglcuda-") as folder:
        path = os.path.join(folder, "s")
        stream = two_gpus[consumer_gpu].create_stream(fifo_length=4, cross_process=True)
        consumer = stream.connect_cuda_consumer()
        peer = Peer("producer", "--socket", path, "--width", "640", "--height", "360", "--format", fmt.name,
                    "--frames", str(frames), "--seed", str(seed), "--device", str(producer_gpu), "--layout", layout)
        try:
            assert eglcuda.serve_stream(stream, path, timeout=30) == peer.process.pid
            numbers = []
            while len(numbers) < frames:
                with consumer.acquire(timeout_us=5_000_000) as acquired:
                    assert acquired.is_new
                    assert acquired.layout is Layout(layout)
                    check(acquired, seed)
                    numbers.append(acquired.number)
            assert numbers == list(range(1, frames + 1))
            assert peer.finish() == 0, peer.stderr()
        finally:
            stream.close()
            if peer.process.poll() is None:
                peer.kill()


def test_a_consumer_on_another_gpu_than_the_stream_is_refused_before_the_driver(two_gpus):
    with two_gpus[0].create_stream(cross_process=True) as stream:
        with pytest.raises(eglcuda.UsageError, match="create the stream on the consumer's GPU"):
            stream.connect_cuda_consumer(device=1)
        assert stream.state is eglcuda.StreamState.CREATED  # nothing reached the driver
        stream.connect_cuda_consumer(device=0)


def test_a_producer_on_another_gpu_needs_an_exportable_stream(two_gpus):
    with two_gpus[0].create_stream() as stream:
        stream.connect_cuda_consumer()
        with pytest.raises(eglcuda.UsageError, match="cross_process=True"):
            stream.connect_cuda_producer(64, 32, device=1)
        assert stream.state is eglcuda.StreamState.CONNECTING


def test_a_frame_on_the_wrong_gpu_is_refused_at_present(two_gpus):
    with two_gpus[0].create_stream(cross_process=True) as stream:
        stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(64, 32, device=1)
        wrong = eglcuda.Frame.allocate(64, 32, device=0)
        with pytest.raises(eglcuda.UsageError, match="CUDA device 0, the producer on 1"):
            producer.present(wrong)
        assert producer.frames_presented == 0
        producer.close()
        wrong.close()


def test_closing_the_stream_closes_what_it_opened_on_the_other_gpu(two_gpus):
    stream = two_gpus[0].create_stream(cross_process=True)
    stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(64, 32, device=1)
    siblings = list(stream._siblings.values())
    assert len(siblings) == 1 and siblings[0].display.cuda_ordinal == 1
    stream.close()
    assert producer.closed and siblings[0].closed and siblings[0].display.closed
    assert not two_gpus[1].closed  # the user's own display of that GPU stays open


def test_info_shows_each_gpu_pair_and_whether_streams_cross_it(two_gpus):
    report = eglcuda.info.collect()
    pairs = {(p["producer"], p["consumer"]): p for p in report["gpu_pairs"]}
    assert {(0, 1), (1, 0)} <= set(pairs)
    for pair in ((0, 1), (1, 0)):
        entry = pairs[pair]
        assert entry["stream"] is True, entry
        assert isinstance(entry["peer_access"], bool)
    text = eglcuda.info.format_report(report)
    assert "GPU 0 -> GPU 1" in text and "EGLStream works" in text
