"""Frames in device, pinned (zero-copy) and managed memory: allocation, in-place host views,
attach hints, presenting each kind on a stream, and release."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat, MemoryKind

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected

def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


KINDS = [MemoryKind.DEVICE, MemoryKind.PINNED, MemoryKind.MANAGED]


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


def write(frame: eglcuda.Frame, rng) -> list[np.ndarray]:
    """Random planes, written through the CPU view where the kind has one (else uploaded)."""
    data = [rng.integers(0, 256, plane.shape, dtype=np.uint8) for plane in frame.planes]
    for index, (plane, values) in enumerate(zip(frame.planes, data)):
        if frame.memory is MemoryKind.DEVICE:
            plane.copy_from(values)
        else:
            frame.host_array(index)[...] = values
    return data


@pytest.mark.parametrize("fmt", [ColorFormat.ARGB, ColorFormat.NV12, ColorFormat.YUV420_PLANAR], ids=lambda f: f.name)
@pytest.mark.parametrize("kind", [MemoryKind.DEVICE, MemoryKind.PINNED], ids=lambda k: k.value)
def test_each_kind_streams_every_byte(display, kind, fmt):
    rng = np.random.default_rng()
    with connected(display, 640, 480, format=fmt) as (stream, producer, consumer):
        frames = [eglcuda.Frame.allocate(640, 480, fmt, memory=kind) for _ in range(2)]
        assert all(f.memory is kind for f in frames)
        for round_ in range(6):
            frame = frames[round_] if round_ < 2 else producer.return_frame(timeout_us=1_000_000)
            assert frame is not None
            expected = write(frame, rng)
            producer.present(frame)
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert acquired.is_new
                assert_frame_equals(acquired, expected)


def test_managed_frames_are_refused_before_the_driver(display):
    """The driver crashes presenting managed memory (measured): eglcuda refuses it, whether
    eglcuda allocated it or wraps it, and the stream carries on with a device frame."""
    import cupy as cp

    rng = np.random.default_rng()
    managed_pool = cp.cuda.MemoryPool(cp.cuda.malloc_managed)
    with connected(display, 640, 480) as (stream, producer, consumer):
        own = eglcuda.Frame.allocate(640, 480, memory="managed")
        with pytest.raises(eglcuda.Unsupported, match="managed"):
            producer.present(own)
        with cp.cuda.using_allocator(managed_pool.malloc):
            wrapped_source = cp.empty((480, 640, 4), cp.uint8)
        wrapped = eglcuda.Frame.from_arrays(wrapped_source)
        with pytest.raises(eglcuda.Unsupported, match="managed"):
            producer.present(wrapped)
        assert producer.in_flight == 0
        frame = producer.allocate_frame()
        expected = write(frame, rng)
        producer.present(frame)
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            assert_frame_equals(acquired, expected)
        own.close()


@pytest.mark.parametrize("kind", [MemoryKind.PINNED, MemoryKind.MANAGED], ids=lambda k: k.value)
def test_host_view_is_the_frame_itself(cuda_ordinal, kind):
    rng = np.random.default_rng()
    with eglcuda.Frame.allocate(334, 98, ColorFormat.NV12, memory=kind) as frame:
        for index, plane in enumerate(frame.planes):
            view = frame.host_array(index)
            assert view.shape == plane.shape and view.strides == plane.strides
            values = rng.integers(0, 256, plane.shape, dtype=np.uint8)
            view[...] = values  # the CPU writes in place ...
            assert np.array_equal(plane.to_numpy(), values)  # ... and the GPU copy engine reads it
            again = rng.integers(0, 256, plane.shape, dtype=np.uint8)
            plane.copy_from(again)  # the GPU side writes ...
            assert np.array_equal(view, again)  # ... and the same view sees it, no copy
        view = frame.host_array(0)
        kept = view.copy()
    # The with block closed the frame: it refuses use, but the view's memory stays valid.
    with pytest.raises(eglcuda.ClosedError):
        frame.host_array()
    assert frame.closed
    del frame
    gc.collect()
    assert np.array_equal(view, kept)
    view[...] = 0  # still writable, still the same memory


def test_attach_hints(cuda_ordinal):
    import cupy as cp

    rng = np.random.default_rng()
    stream = cp.cuda.Stream(non_blocking=True)
    with eglcuda.Frame.allocate(256, 64, memory="managed") as frame:
        values = rng.integers(0, 256, frame.planes[0].shape, dtype=np.uint8)
        frame.attach("host", stream)
        stream.synchronize()
        frame.host_array()[...] = values
        frame.attach("single", stream)
        with stream:
            doubled = cp.asarray(frame.planes[0]).astype(cp.uint16) * 2  # a kernel on that stream
        stream.synchronize()
        assert np.array_equal(doubled.get(), values.astype(np.uint16) * 2)
        frame.attach(eglcuda.Attach.GLOBAL)
        with pytest.raises(eglcuda.UsageError, match="needs the stream"):
            frame.attach("single")
        with pytest.raises(eglcuda.UsageError, match="attach to one of"):
            frame.attach("gpu")
    with eglcuda.Frame.allocate(16, 16) as device_frame:
        with pytest.raises(eglcuda.UsageError, match="only managed"):
            device_frame.attach("host")
        with pytest.raises(eglcuda.UsageError, match="no host view"):
            device_frame.host_array()
    with pytest.raises(eglcuda.ClosedError):
        frame.host_array()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_kinds_release_their_memory(cuda_ordinal, kind):
    device = eglcuda.get_device(cuda_ordinal)
    frame = eglcuda.Frame.allocate(1920, 1080, memory=kind)  # warm the allocator
    frame.close()
    free_before, resident_before = device.memory_info()[0], resident_bytes()
    for i in range(200):
        frame = eglcuda.Frame.allocate(1920, 1080, memory=kind)
        if i % 2:
            frame.close()
        else:
            del frame  # garbage collection frees it too
    gc.collect()
    assert abs(device.memory_info()[0] - free_before) < 32 << 20  # device and managed memory
    assert resident_bytes() - resident_before < 64 << 20  # pinned host memory (8 MB a frame)
