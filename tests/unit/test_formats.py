"""Plane geometry, the one place frame sizes and pitches are derived."""
from __future__ import annotations

import pytest

import eglcuda
from eglcuda.frames.formats import (ColorFormat, check_pitch, color_format, default_pitch, driver_extents, min_pitch,
                              plane_geometry)


@pytest.mark.parametrize(
    "fmt, width, height, pitch, expected",
    [
        (ColorFormat.ARGB, 7, 5, 28, [(7, 5, 4, 28)]),
        (ColorFormat.Y, 33, 17, 64, [(33, 17, 1, 64)]),
        (ColorFormat.YUV420_PLANAR, 33, 17, 64, [(33, 17, 1, 64), (17, 9, 1, 32), (17, 9, 1, 32)]),
        (ColorFormat.NV12, 33, 17, 64, [(33, 17, 1, 64), (17, 9, 2, 64)]),
        (ColorFormat.YUV444_PLANAR, 4, 2, 256, [(4, 2, 1, 256)] * 3),
        (ColorFormat.NV12, 2, 2, 0, [(2, 2, 1, 0), (1, 1, 2, 0)]),
    ],
)
def test_plane_geometry(fmt, width, height, pitch, expected):
    planes = plane_geometry(fmt, width, height, pitch)
    assert [(p.width, p.height, p.channels, p.pitch) for p in planes] == expected
    for plane in planes:
        assert plane.pitch == 0 or plane.pitch >= plane.row_bytes


def test_min_and_default_pitch_fit_every_plane():
    for fmt in (ColorFormat.ARGB, ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YUV444_PLANAR, ColorFormat.Y):
        for width in (1, 2, 3, 33, 640, 7680):
            pitch = default_pitch(fmt, width)
            assert pitch % 256 == 0 and pitch >= min_pitch(fmt, width)
            check_pitch(fmt, width, pitch)
            for plane in plane_geometry(fmt, width, 3, pitch):
                assert plane.pitch >= plane.row_bytes
    assert min_pitch(ColorFormat.YUV420_PLANAR, 33) == 34  # chroma rows of 17 bytes at pitch/2
    assert min_pitch(ColorFormat.NV12, 33) == 34  # interleaved chroma: 17 pairs


@pytest.mark.parametrize("fmt, width, pitch", [(ColorFormat.ARGB, 8, 31), (ColorFormat.YUV420_PLANAR, 32, 33),
                                               (ColorFormat.NV12, 33, 33), (ColorFormat.Y, 4, "4")])
def test_bad_pitch_is_refused(fmt, width, pitch):
    with pytest.raises(eglcuda.UsageError):
        check_pitch(fmt, width, pitch)


def test_color_format_parsing():
    assert color_format("argb") is ColorFormat.ARGB
    assert color_format(0x01) is ColorFormat.NV12
    assert color_format(ColorFormat.Y) is ColorFormat.Y
    assert color_format("A") is ColorFormat.A
    with pytest.raises(eglcuda.UsageError):
        color_format("RGB565")
    with pytest.raises(eglcuda.UsageError):
        color_format(0x7777)


def test_odd_sizes_are_refused_for_420_formats():
    from eglcuda.frames.formats import check_size

    check_size(7, 5, ColorFormat.ARGB)
    check_size(8, 6, ColorFormat.NV12)
    for fmt in (ColorFormat.NV12, ColorFormat.YUV420_PLANAR):
        with pytest.raises(eglcuda.UsageError, match="even"):
            check_size(7, 6, fmt)
        with pytest.raises(eglcuda.UsageError, match="even"):
            check_size(8, 5, fmt)


@pytest.mark.parametrize("fmt", list(ColorFormat), ids=lambda f: f.name)
def test_driver_extents(fmt):
    # Every plane is read as rows of the frame's pitch: more than the plane spans only where the
    # plane's own pitch is smaller (the chroma planes of YUV420_PLANAR).
    width, height = 640, 480
    pitch = default_pitch(fmt, width) + 256  # a pitch with slack, so the rule shows
    extents = driver_extents(fmt, width, height, pitch)
    geometry = plane_geometry(fmt, width, height, pitch)
    assert extents == tuple(pitch * g.height for g in geometry)
    for extent, g in zip(extents, geometry):
        if g.pitch == pitch:
            assert g.pitch * g.height == extent
        else:
            assert (fmt, g.pitch, extent) == (ColorFormat.YUV420_PLANAR, pitch // 2, 2 * g.pitch * g.height)


@pytest.mark.parametrize("fmt", list(ColorFormat), ids=lambda f: f.name)
@pytest.mark.parametrize("width, height", [(640, 480), (34, 18), (2, 2)])
def test_linear_layout(fmt, width, height):
    # The layout every eglcuda allocation uses (Frame.allocate and the cuda-vmm pool): planes in
    # order, each starting PLANE_ALIGNMENT-aligned past the end of the one before, and room for what
    # the driver reads from each plane's start.
    from eglcuda.frames.formats import PLANE_ALIGNMENT, linear_layout

    pitch = default_pitch(fmt, width)
    offsets, size = linear_layout(fmt, width, height, pitch)
    geometry = plane_geometry(fmt, width, height, pitch)
    assert len(offsets) == len(geometry) and offsets[0] == 0
    for i, g in enumerate(geometry):
        assert offsets[i] % PLANE_ALIGNMENT == 0
        if i + 1 < len(geometry):
            assert offsets[i] + g.pitch * g.height <= offsets[i + 1] < offsets[i] + g.pitch * g.height + PLANE_ALIGNMENT
    for offset, extent in zip(offsets, driver_extents(fmt, width, height, pitch)):
        assert offset + extent <= size
