"""EGLStream CUDA -> CUDA in one process: every byte of every frame, misuse, threads, leaks."""
from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat, Layout
from eglcuda._bind._native import ffi, lib

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected, fill_random, produce_payloads

FORMATS = [ColorFormat.ARGB, ColorFormat.ABGR, ColorFormat.RGBA, ColorFormat.BGRA, ColorFormat.Y, ColorFormat.A,
           ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YUV444_PLANAR]
SIZES = [(2, 2), (7, 5), (33, 17), (34, 18), (640, 480)]


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


@pytest.mark.parametrize("layout", [Layout.PITCH, Layout.ARRAY])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_byte_arrives(display, fmt, layout, size):
    rng = np.random.default_rng()
    width, height = size
    if fmt in eglcuda.frames.formats.EVEN_SIZE_ONLY and (width % 2 or height % 2):
        # The driver refuses odd 4:2:0 frames; eglcuda says so before it is asked.
        with display.create_stream() as stream:
            stream.connect_cuda_consumer()
            with pytest.raises(eglcuda.UsageError, match="even width and height"):
                stream.connect_cuda_producer(width, height, format=fmt, layout=layout)
        with pytest.raises(eglcuda.UsageError, match="even width and height"):
            eglcuda.Frame.allocate(width, height, fmt, layout)
        return
    with connected(display, width, height, format=fmt, layout=layout) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(3)]
        for round_ in range(6):
            frame = frames[round_ % 3] if round_ < 3 else producer.return_frame(timeout_us=1_000_000)
            assert frame is not None, f"round {round_}: no frame came back"
            expected = fill_random(frame, rng)
            producer.present(frame)
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert acquired.is_new
                assert (acquired.width, acquired.height, acquired.layout) == (width, height, layout)
                assert len(acquired.planes) == len(expected)
                assert_frame_equals(acquired, expected)


@pytest.mark.parametrize("fmt", [ColorFormat.ARGB, ColorFormat.NV12], ids=lambda f: f.name)
def test_8k_frames(display, fmt):
    rng = np.random.default_rng()
    with connected(display, 7680, 4320, format=fmt) as (stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        for frame in (a, b):
            expected = fill_random(frame, rng)
            producer.present(frame)
            with consumer.acquire() as acquired:
                assert_frame_equals(acquired, expected)
        assert producer.return_frame(timeout_us=1_000_000) is a


# The CUDA driver reads a YUV420 planar chroma plane as (frame pitch x plane height) bytes, twice
# what the plane spans (eglcuda.frames.formats.driver_extents). A frame whose V plane ended closer than
# that to the end of mapped memory failed at acquire with CUDA_ERROR_INVALID_VALUE: the
# every-byte test failed whenever the allocator put its third frame at the end of a 2 MiB chunk.
YUV = dict(width=640, height=480, pitch=768, format=ColorFormat.YUV420_PLANAR)
YUV_PLANES = (768 * 480, 384 * 240, 384 * 240)
YUV_OVERREACH = (768 - 384) * 240  # what the driver reads past the V plane


def device_alloc(size: int) -> int:
    eglcuda.get_device(0).make_current()
    box = ffi.new("CUdeviceptr *")
    assert lib.cuMemAlloc(box, size) == 0
    return int(box[0])


def device_free(address: int) -> None:
    assert lib.cuMemFree(address) == 0


def round_trips(display, frames) -> None:
    """Present each frame once on a fresh stream; every byte must arrive."""
    rng = np.random.default_rng()
    first = frames[0]
    with connected(display, first.width, first.height, format=first.format) as (stream, producer, consumer):
        for frame in frames:
            expected = fill_random(frame, rng)
            producer.present(frame)
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert_frame_equals(acquired, expected)


def test_yuv420_allocation_covers_what_the_driver_reads(display):
    frame = eglcuda.Frame.allocate(640, 480, ColorFormat.YUV420_PLANAR)
    base, size = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
    for plane, extent in zip(frame.planes, eglcuda.frames.formats.driver_extents(frame.format, 640, 480, frame.pitch)):
        assert lib.cuMemGetAddressRange(base, size, plane.pointer) == 0
        assert int(base[0]) + int(size[0]) - plane.pointer >= extent
    frame.close()


def test_yuv420_frames_allocated_back_to_back(display):
    # The layout of the failing run: a 0x5A000-byte allocation, then three frames the allocator
    # packs after it into the same 2 MiB chunk; the third one used to end at the chunk's end.
    filler = device_alloc(0x5A000)
    try:
        frames = [eglcuda.Frame.allocate(640, 480, ColorFormat.YUV420_PLANAR) for _ in range(3)]
        round_trips(display, frames)
    finally:
        device_free(filler)


def test_wrapped_yuv420_frame_needs_room_for_what_the_driver_reads(display):
    region = device_alloc(2 << 20)
    end = region + (2 << 20)
    try:
        def frame_ending(slack: int) -> eglcuda.Frame:
            start = end - slack - sum(YUV_PLANES)
            return eglcuda.Frame.from_pointer(start, **YUV)

        with pytest.raises(eglcuda.UsageError, match=f"plane 2 .* {YUV_OVERREACH} more bytes"):
            frame_ending(0)
        with pytest.raises(eglcuda.UsageError, match="plane 2 .* 1 more bytes"):
            frame_ending(YUV_OVERREACH - 1)
        # Exactly the room the driver reads: accepted, and every byte arrives.
        round_trips(display, [frame_ending(YUV_OVERREACH)])
        # Other formats are read as they span: an NV12 frame may end at the end of its memory.
        nv12 = eglcuda.Frame.from_pointer(end - 768 * 480 * 3 // 2, 640, 480, 768, ColorFormat.NV12)
        round_trips(display, [nv12])
    finally:
        device_free(region)


def test_return_gives_back_the_same_object_and_reuse_keeps_the_last(display):
    with connected(display, 64, 48) as (stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        producer.present(a)
        consumer.acquire().release()
        # Reuse on: the stream keeps its newest frame; the answer is None at once, not an error.
        started = time.perf_counter()
        assert producer.return_frame(timeout_us=500_000) is None
        assert time.perf_counter() - started < 0.25
        assert producer.in_flight == 1
        producer.present(b)
        consumer.acquire().release()
        assert producer.return_frame(timeout_us=1_000_000) is a
        assert producer.in_flight == 1


def test_reuse_off_returns_the_last_frame(display):
    require_extension(display, "EGL_NV_stream_reset")
    with connected(display, 64, 48, reuse_last_frame=False) as (stream, producer, consumer):
        a = producer.allocate_frame()
        producer.present(a)
        consumer.acquire().release()
        assert producer.return_frame(timeout_us=1_000_000) is a
        assert producer.in_flight == 0


def test_reuse_off_an_acquire_with_nothing_new_is_a_timeout(display):
    """Without reuse the frame the consumer released is not handed out again: an acquire with
    nothing new raises Timeout (whatever state the stream reports after the wait), and the next
    frame still arrives with its bytes."""
    require_extension(display, "EGL_NV_stream_reset")
    rng = np.random.default_rng()
    with connected(display, 64, 48, reuse_last_frame=False) as (stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        producer.present(a)
        consumer.acquire(timeout_us=1_000_000).release()
        started = time.perf_counter()
        with pytest.raises(eglcuda.Timeout):
            consumer.acquire(timeout_us=20_000)
        assert time.perf_counter() - started < 5
        expected = fill_random(b, rng)
        producer.present(b)
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            assert acquired.is_new
            assert_frame_equals(acquired, expected)
        assert producer.return_frame(timeout_us=1_000_000) is a


def test_consumer_without_frame_numbers_still_delivers_every_byte(display):
    rng = np.random.default_rng()
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer(frame_numbers=False)
        producer = stream.connect_cuda_producer(48, 20)
        frames = [producer.allocate_frame(), producer.allocate_frame()]
        for i in range(6):
            expected = fill_random(frames[i & 1], rng)
            producer.present(frames[i & 1])
            with consumer.acquire() as acquired:
                assert acquired.number is None and acquired.is_new is None
                assert_frame_equals(acquired, expected)
                assert "unnumbered" in repr(acquired)
            if i:
                assert producer.return_frame(1_000_000) is frames[(i - 1) & 1]


def test_implicit_synchronization_with_a_slow_producer_kernel(display):
    cp = pytest.importorskip("cupy")
    kernel = cp.RawKernel(r"""
    extern "C" __global__ void slow_fill(unsigned char *out, size_t pitch, int width, int height,
                                         unsigned int seed, long long spin) {
        long long start = clock64();
        while (clock64() - start < spin) { }
        int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
        if (x < width * 4 && y < height)
            out[y * pitch + x] = (unsigned char)((x * 2654435761u + y * 40503u + seed) >> 13);
    }""", "slow_fill")
    width, height = 256, 64
    with connected(display, width, height) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        plane = frame.planes[0]
        seed = int(np.random.default_rng().integers(1, 2**31))
        cuda_stream = cp.cuda.Stream(non_blocking=True)
        with cuda_stream:
            started = time.perf_counter()
            kernel(((width * 4 + 255) // 256, height), (256,),
                   (cp.uint64(plane.pointer), cp.uint64(plane.pitch), np.int32(width), np.int32(height),
                    np.uint32(seed), np.int64(300_000_000)))  # ~150 ms of spinning on an H100
            in_flight = not cuda_stream.done
            before_present = time.perf_counter()
            producer.present(frame, cuda_stream=cuda_stream)
            present_seconds = time.perf_counter() - before_present
        assert in_flight, "the producer's kernel must still be running when the frame is presented"
        print(f"present returned after {1e3 * present_seconds:.2f} ms, kernel queued {1e3 * (before_present - started):.2f} ms before")
        with consumer.acquire() as acquired:
            got = acquired.planes[0].to_numpy()  # ordered on the consumer's stream only
        x = np.arange(width * 4, dtype=np.uint64)[None, :]
        y = np.arange(height, dtype=np.uint64)[:, None]
        expected = (((x * 2654435761 + y * 40503 + seed) & 0xFFFFFFFF) >> 13).astype(np.uint8)
        np.testing.assert_array_equal(got.reshape(height, width * 4), expected)


class Ticker:
    """Another Python thread that notes the time every millisecond: it runs only while the GIL is free."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.times.append(time.perf_counter())
            time.sleep(0.001)

    def between(self, start: float, end: float) -> int:
        return sum(start < t < end for t in self.times)

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


SPIN_KERNELS = r"""
extern "C" __global__ void spin_fill(unsigned char *out, size_t pitch, int row_bytes, int height,
                                     const unsigned char *src, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) { }
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < height)
        out[y * pitch + x] = src[y * row_bytes + x];
}
extern "C" __global__ void spin_read(unsigned char *out, const unsigned char *in, size_t pitch, int row_bytes,
                                     int height, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) { }
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < height)
        out[y * row_bytes + x] = in[y * pitch + x];
}"""
SPIN_CYCLES = 300_000_000  # 150-200 ms at an H100's or H200's clock


def test_present_and_release_wait_for_queued_work_with_the_gil_released(display):
    """Measured on driver 580: present returns only once the work queued on its stream is done, and
    release only once the work on the consumer's stream is; docs/streams.md says so. Both wait with
    the GIL released, and the bytes written before present and read before release are right."""
    cp = pytest.importorskip("cupy")
    module = cp.RawModule(code=SPIN_KERNELS)
    spin_fill, spin_read = module.get_function("spin_fill"), module.get_function("spin_read")
    width, height = 256, 64
    row_bytes = width * 4
    blocks = ((row_bytes + 255) // 256, height)
    payload = np.random.default_rng().integers(0, 256, (height, row_bytes), dtype=np.uint8)
    with connected(display, width, height) as (stream, producer, consumer), Ticker() as ticker:
        frame = producer.allocate_frame()
        plane = frame.planes[0]
        src = cp.asarray(payload)
        work = cp.cuda.Stream(non_blocking=True)
        work.synchronize()
        spin_fill(blocks, (256,), (cp.uint64(plane.pointer), cp.uint64(plane.pitch), np.int32(row_bytes),
                                   np.int32(height), src, np.int64(SPIN_CYCLES)), stream=work)
        assert not work.done
        start = time.perf_counter()
        producer.present(frame, cuda_stream=work)
        end = time.perf_counter()
        assert work.done, "present returned while the producer's kernel still ran"
        assert end - start > 0.05
        assert ticker.between(start, end) >= 10, "another thread did not run while present waited"

        acquired = consumer.acquire()
        consumer_stream = cp.cuda.ExternalStream(acquired.cuda_stream)
        seen = cp.zeros((height, row_bytes), dtype=cp.uint8)
        cp.cuda.Device().synchronize()
        view = acquired.planes[0]
        spin_read(blocks, (256,), (seen, cp.uint64(view.pointer), cp.uint64(view.pitch), np.int32(row_bytes),
                                   np.int32(height), np.int64(SPIN_CYCLES)), stream=consumer_stream)
        assert not consumer_stream.done
        start = time.perf_counter()
        acquired.release()
        end = time.perf_counter()
        assert consumer_stream.done, "release returned while the consumer's kernel still ran"
        assert end - start > 0.05
        assert ticker.between(start, end) >= 10, "another thread did not run while release waited"
        np.testing.assert_array_equal(cp.asnumpy(seen), payload)


def test_producer_and_consumer_threads_fifo(display):
    require_extension(display, "EGL_KHR_stream_fifo")
    rng = np.random.default_rng()
    count, width, height = 200, 48, 16
    payloads = [rng.integers(0, 256, (height, width, 4), dtype=np.uint8) for _ in range(count)]
    received, errors = [], []
    with connected(display, width, height, fifo_length=4) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(6)]

        def produce():
            produce_payloads(producer, frames, payloads, errors)

        def consume():
            try:
                while len(received) < count:
                    with consumer.acquire(timeout_us=2_000_000) as acquired:
                        if acquired.is_new:
                            received.append(acquired.planes[0].to_numpy())
            except Exception as exc:  # pragma: no cover
                errors.append(exc)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
    assert len(received) == count
    for index, (got, want) in enumerate(zip(received, payloads)):
        assert np.array_equal(got, want), f"frame {index} out of order or corrupted"


# ---- misuse -------------------------------------------------------------------------------------

def test_wrong_frame_size_format_and_layout(display):
    with connected(display, 64, 48, format=ColorFormat.ARGB, layout=Layout.PITCH) as (stream, producer, consumer):
        with eglcuda.Frame.allocate(64, 47) as short, eglcuda.Frame.allocate(64, 48, ColorFormat.NV12) as nv12, \
                eglcuda.Frame.allocate(64, 48, layout=Layout.ARRAY) as array:
            for bad, message in ((short, "64x47"), (nv12, "NV12"), (array, "layout")):
                with pytest.raises(eglcuda.UsageError, match=message):
                    producer.present(bad)
        assert producer.in_flight == 0
        with pytest.raises(eglcuda.UsageError):
            producer.present("not a frame")


def test_too_many_frames_in_flight(display):
    with connected(display, 8, 8) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(65)]
        for frame in frames[:64]:
            producer.present(frame)
        with pytest.raises(eglcuda.UsageError, match="64 frames"):
            producer.present(frames[64])
        with pytest.raises(eglcuda.UsageError, match="already in flight"):
            producer.present(frames[0])


def test_acquire_after_close_and_present_after_disconnect(display):
    stream = display.create_stream()
    consumer = stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(16, 16)
    frame = producer.allocate_frame()
    producer.present(frame)
    consumer.close()
    with pytest.raises(eglcuda.ClosedError):
        consumer.acquire()
    started = time.perf_counter()
    with pytest.raises((eglcuda.StreamDisconnected, eglcuda.CUDAError)):
        producer.present(producer.allocate_frame())
    assert time.perf_counter() - started < 5
    stream.close()
    with pytest.raises(eglcuda.ClosedError):
        producer.present(frame)
    frame.close()  # the producer is gone: the frame may be freed now


def test_acquire_after_the_producer_disconnects(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        producer.present(producer.allocate_frame())
        consumer.acquire().release()
        producer.close()
        started = time.perf_counter()
        with pytest.raises(eglcuda.StreamDisconnected):
            consumer.acquire(timeout_us=100_000)
        assert time.perf_counter() - started < 2


def test_acquire_on_an_empty_stream_times_out(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        started = time.perf_counter()
        with pytest.raises(eglcuda.Timeout):
            consumer.acquire(timeout_us=100_000)
        assert time.perf_counter() - started < 2


def test_presented_frame_cannot_be_closed_until_disconnect(display):
    with connected(display, 16, 16) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        with pytest.raises(eglcuda.UsageError, match="disconnect"):
            frame.close()
    frame.close()
    assert frame.closed


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, None])
def test_bad_timeouts(display, bad):
    with connected(display, 16, 16) as (stream, producer, consumer):
        with pytest.raises(eglcuda.UsageError):
            consumer.acquire(timeout_us=bad)
        with pytest.raises(eglcuda.UsageError):
            producer.return_frame(timeout_us=bad)


def test_bad_stream_options(display):
    for options in ({"fifo_length": -1}, {"latency_us": -5}, {"fifo_length": "4"}):
        with pytest.raises(eglcuda.UsageError):
            display.create_stream(**options)


# ---- leaks --------------------------------------------------------------------------------------

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_thousand_cycles_leave_gpu_memory_and_fds_flat(display, cuda_ordinal):
    device = eglcuda.get_device(cuda_ordinal)

    def cycle():
        with connected(display, 64, 32) as (stream, producer, consumer):
            a, b = producer.allocate_frame(), producer.allocate_frame()
            producer.present(a)
            consumer.acquire().release()
            producer.present(b)
            consumer.acquire().release()
            assert producer.return_frame(timeout_us=1_000_000) is a

    for _ in range(20):
        cycle()
    gc.collect()
    free_before, fds_before = device.memory_info()[0], open_fds()
    for _ in range(1000):
        cycle()
    gc.collect()
    free_after, fds_after = device.memory_info()[0], open_fds()
    # 1,000 leaked pairs of frames (plus driver objects) would be far above 16 MiB.
    assert free_before - free_after < 16 << 20, (free_before, free_after)
    assert fds_after - fds_before <= 2, (fds_before, fds_after)
