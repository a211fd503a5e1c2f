"""Zero-copy views of planes in CuPy and PyTorch, and frames wrapping their memory."""
from __future__ import annotations

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat

from ..conftest import require_extension
from .streamkit import assert_frame_equals, connected, fill_random


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    return cuda_display


def test_cupy_views_are_zero_copy(display):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    with connected(display, 66, 34, format=ColorFormat.NV12) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, rng)
        luma = cp.asarray(frame.planes[0])
        assert luma.data.ptr == frame.planes[0].pointer and luma.shape == (34, 66)
        chroma = cp.asarray(frame.planes[1])
        assert chroma.shape == (17, 33, 2)
        np.testing.assert_array_equal(cp.asnumpy(chroma), expected[1])
        producer.present(frame)
        with consumer.acquire() as acquired:
            interface = acquired.planes[0].__cuda_array_interface__
            assert interface["version"] == 3 and interface["data"][1] is True  # read-only
            assert interface["stream"] == acquired.cuda_stream
            view = cp.asarray(acquired.planes[0])
            assert view.data.ptr == acquired.planes[0].pointer
            total = int(cp.asarray(acquired.planes[1]).astype(cp.int64).sum())
            assert total == int(expected[1].astype(np.int64).sum())
            np.testing.assert_array_equal(cp.asnumpy(view), expected[0])


def test_torch_from_dlpack_is_zero_copy(display):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    with connected(display, 40, 24) as (stream, producer, consumer):
        frame = producer.allocate_frame()
        expected = fill_random(frame, rng)
        tensor = torch.from_dlpack(frame.planes[0])
        assert tensor.data_ptr() == frame.planes[0].pointer
        assert tuple(tensor.shape) == (24, 40, 4) and tensor.dtype == torch.uint8
        np.testing.assert_array_equal(tensor.cpu().numpy(), expected[0])
        tensor[0, 0, 0] = (int(expected[0][0, 0, 0]) + 1) % 256  # producer views are writable
        expected[0][0, 0, 0] = (int(expected[0][0, 0, 0]) + 1) % 256
        torch.cuda.synchronize()
        producer.present(frame)
        with consumer.acquire() as acquired:
            seen = torch.from_dlpack(acquired.planes[0])
            assert seen.data_ptr() == acquired.planes[0].pointer
            np.testing.assert_array_equal(seen.cpu().numpy(), expected[0])
            del seen


def test_dlpack_keeps_the_frame_alive_until_the_consumer_is_done(display):
    torch = pytest.importorskip("torch")
    frame = eglcuda.Frame.allocate(16, 16)
    data = np.random.default_rng().integers(0, 256, (16, 16, 4), dtype=np.uint8)
    frame.planes[0].copy_from(data)
    tensor = torch.from_dlpack(frame.planes[0])
    import weakref
    ref = weakref.ref(frame)
    del frame
    import gc
    gc.collect()
    assert ref() is not None  # the tensor still uses its memory
    np.testing.assert_array_equal(tensor.cpu().numpy(), data)
    del tensor
    gc.collect()
    assert ref() is None


def test_frame_from_cupy_arrays_without_copy(display):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    width, height = 62, 30
    pitch = eglcuda.frames.formats.default_pitch(ColorFormat.YUV420_PLANAR, width)
    geometry = eglcuda.plane_geometry(ColorFormat.YUV420_PLANAR, width, height, pitch)
    # Each plane's storage holds what the driver reads of it (a half-pitch chroma plane: rows the
    # frame's pitch apart), or from_arrays refuses it, depending on where CuPy's pool put it.
    extents = eglcuda.frames.formats.driver_extents(ColorFormat.YUV420_PLANAR, width, height, pitch)
    storage = [cp.zeros((max(g.height, -(-e // g.pitch)), g.pitch), cp.uint8)[:g.height]
               for g, e in zip(geometry, extents)]
    planes = [s[:, :g.width] for s, g in zip(storage, geometry)]
    expected = [rng.integers(0, 256, (g.height, g.width), dtype=np.uint8) for g in geometry]
    for plane, values in zip(planes, expected):
        plane[...] = cp.asarray(values)
    frame = eglcuda.Frame.from_arrays(planes, format=ColorFormat.YUV420_PLANAR)
    assert frame.planes[0].pointer == planes[0].data.ptr and not frame.owned
    with connected(display, width, height) as (stream, producer, consumer):
        producer.present(frame)
        with consumer.acquire() as acquired:
            assert_frame_equals(acquired, expected)


def test_frame_from_a_raw_pointer(display):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    width, height, pitch = 50, 20, 256
    buffer = cp.zeros(pitch * height + pitch * ((height + 1) // 2), cp.uint8)  # NV12, planes back to back
    frame = eglcuda.Frame.from_pointer(buffer.data.ptr, width, height, pitch, ColorFormat.NV12, owner=buffer)
    expected = fill_random(frame, rng)
    assert frame.planes[1].pointer == buffer.data.ptr + pitch * height
    with connected(display, width, height) as (stream, producer, consumer):
        producer.present(frame)
        with consumer.acquire() as acquired:
            assert_frame_equals(acquired, expected)


def test_wrapping_rejects_bad_geometry(display):
    cp = pytest.importorskip("cupy")
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Frame.from_arrays(cp.zeros((16, 16, 4), cp.float32))
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Frame.from_arrays(cp.zeros((16, 16, 3), cp.uint8))
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Frame.from_pointer(0, 16, 16, 64)
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Frame.from_pointer(1 << 40, 16, 16, 60)  # pitch too small for 16 ARGB pixels
