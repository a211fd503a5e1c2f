"""Color formats and frame geometry: the one place where a plane's size and pitch are derived.

The driver's ``CUeglFrame`` carries one width, height and pitch (those of plane 0); every other
plane follows from the color format. eglcuda uses this convention on both ends of a stream:

- plane i is ``ceil(width / x_div)`` by ``ceil(height / y_div)`` elements of ``channels`` bytes;
- plane i's pitch is plane 0's pitch divided by ``pitch_div`` (2 for the chroma planes of the
  4:2:0 planar format, 1 otherwise), so plane 0's pitch must be a multiple of that divisor and
  large enough for every plane's row.

Byte order in memory follows the CUDA driver's naming: ``ARGB`` frames hold B, G, R, A bytes;
``ABGR`` holds R, G, B, A; ``RGBA`` holds A, B, G, R; ``BGRA`` holds A, R, G, B.
"""
from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass

from .._integers import as_int
from ..errors import UsageError, shown
from .._bind import cuda_egl


class ColorFormat(enum.IntEnum):
    """The frame formats eglcuda allocates and checks (values of ``CUeglColorFormat``)."""

    ARGB = cuda_egl.COLOR_FORMAT_ARGB
    ABGR = cuda_egl.COLOR_FORMAT_ABGR
    RGBA = cuda_egl.COLOR_FORMAT_RGBA
    BGRA = cuda_egl.COLOR_FORMAT_BGRA
    # One 8-bit channel. (CU_EGL_COLOR_FORMAT_R and _L are not offered: on the H100 with driver 580
    # the stream refuses L at present and R at acquire, with CUDA_ERROR_UNKNOWN / _INVALID_VALUE.)
    Y = 0x52  # CU_EGL_COLOR_FORMAT_Y: a single luma plane
    A = cuda_egl.COLOR_FORMAT_A
    YUV420_PLANAR = cuda_egl.COLOR_FORMAT_YUV420_PLANAR  # I420: Y, U, V planes
    NV12 = cuda_egl.COLOR_FORMAT_YUV420_SEMIPLANAR  # Y plane + interleaved chroma plane
    YUV444_PLANAR = cuda_egl.COLOR_FORMAT_YUV444_PLANAR
    # How the driver labels an NV12 frame on the consumer side (measured, H100 driver 580): the
    # same geometry, named for its chroma byte order.
    YVU420_SEMIPLANAR = 0x15


class Layout(enum.Enum):
    """Where a frame's planes live: linear device memory with a pitch, or CUDA arrays."""

    PITCH = "pitch"
    ARRAY = "array"


@dataclass(frozen=True)
class PlaneSpec:
    x_div: int
    y_div: int
    channels: int
    pitch_div: int


_SPECS: dict[ColorFormat, tuple[PlaneSpec, ...]] = {
    ColorFormat.ARGB: (PlaneSpec(1, 1, 4, 1),),
    ColorFormat.ABGR: (PlaneSpec(1, 1, 4, 1),),
    ColorFormat.RGBA: (PlaneSpec(1, 1, 4, 1),),
    ColorFormat.BGRA: (PlaneSpec(1, 1, 4, 1),),
    ColorFormat.Y: (PlaneSpec(1, 1, 1, 1),),
    ColorFormat.A: (PlaneSpec(1, 1, 1, 1),),
    ColorFormat.YUV420_PLANAR: (PlaneSpec(1, 1, 1, 1), PlaneSpec(2, 2, 1, 2), PlaneSpec(2, 2, 1, 2)),
    ColorFormat.NV12: (PlaneSpec(1, 1, 1, 1), PlaneSpec(2, 2, 2, 1)),
    ColorFormat.YVU420_SEMIPLANAR: (PlaneSpec(1, 1, 1, 1), PlaneSpec(2, 2, 2, 1)),
    ColorFormat.YUV444_PLANAR: (PlaneSpec(1, 1, 1, 1), PlaneSpec(1, 1, 1, 1), PlaneSpec(1, 1, 1, 1)),
}

# Formats that describe the same bytes (what a producer presents, what the consumer is told).
SAME_GEOMETRY = {ColorFormat.YVU420_SEMIPLANAR: ColorFormat.NV12}

MAX_DIMENSION = 32768
# Bytes between rows: the driver's CUeglFrame keeps a 32-bit pitch; no real frame comes near this.
MAX_PITCH = 1 << 24


@dataclass(frozen=True)
class PlaneGeometry:
    """Size of one plane: ``width`` x ``height`` elements of ``channels`` bytes, rows ``pitch``
    bytes apart (pitch is 0 for CUDA-array planes)."""

    width: int
    height: int
    channels: int
    pitch: int

    @property
    def row_bytes(self) -> int:
        return self.width * self.channels

    @property
    def nbytes(self) -> int:
        """Bytes the plane spans in linear memory (the last row counts its used bytes only)."""
        return self.pitch * (self.height - 1) + self.row_bytes if self.pitch else self.row_bytes * self.height


def color_format(value: "ColorFormat | str | int") -> ColorFormat:
    """A :class:`ColorFormat` from an enum member, its name or its driver value."""
    found = _BY_VALUE.get(value) if type(value) is int else None
    if found is not None:
        return found
    # An IntEnum takes True for 1 and 1.0 for 1: a bool or a float would name a format by accident.
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise UsageError(f"a color format is an eglcuda.ColorFormat, its name or its driver value, got {shown(value)}")
    try:
        if isinstance(value, str):
            return ColorFormat[value.upper()]
        return ColorFormat(value)
    except (KeyError, ValueError):
        names = ", ".join(f.name for f in ColorFormat if f not in SAME_GEOMETRY)
        raise UsageError(f"unsupported color format {value!r}; eglcuda handles {names}") from None


def producer_format(value: "ColorFormat | str | int") -> ColorFormat:
    """:func:`color_format` for what a producer presents: a consumer-side label of the same bytes
    (:data:`SAME_GEOMETRY`: the YVU420_SEMIPLANAR an NV12 frame arrives as) is taken as the format
    it labels, so that frames and producers made with either name match."""
    fmt = color_format(value)
    return SAME_GEOMETRY.get(fmt, fmt)


def layout_of(value: Layout | str) -> Layout:
    """A :class:`Layout` from an enum member or its name ("pitch", "array")."""
    if isinstance(value, Layout):
        return value
    try:
        return Layout(value.lower() if isinstance(value, str) else value)
    except ValueError:
        raise UsageError(f"layout is one of {[l.value for l in Layout]}, got {value!r}") from None


# Formats with chroma subsampled in both directions. eglcuda takes even sizes only: with odd sizes
# its frames failed on the H100 (driver 580) at present (array layout) and in plane copies (pitch
# layout), although a raw pitch frame of 7x5 went through; until the driver's plane geometry for
# odd sizes is pinned down, eglcuda refuses them rather than risk wrong bytes.
EVEN_SIZE_ONLY = frozenset({ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YVU420_SEMIPLANAR})

_BY_VALUE = {int(f): f for f in ColorFormat}


def check_size(width: int, height: int, fmt: ColorFormat | None = None) -> tuple[int, int]:
    """``(width, height)`` as plain ints (NumPy's integers taken), or :class:`UsageError` for a
    size no frame (of ``fmt``) can have."""
    sizes = []
    for name, value in (("width", width), ("height", height)):
        size = as_int(value)
        if size is None or not 1 <= size <= MAX_DIMENSION:
            raise UsageError(f"frame {name} must be an int in 1..{MAX_DIMENSION}, got {shown(value)}")
        sizes.append(size)
    width, height = sizes
    if fmt in EVEN_SIZE_ONLY and (width % 2 or height % 2):
        raise UsageError(f"{fmt.name} frames need an even width and height, got {width}x{height}")
    return width, height


def min_pitch(fmt: ColorFormat, width: int) -> int:
    """The smallest plane-0 pitch in bytes that fits every plane of ``fmt`` at ``width``."""
    pitch = 0
    for spec in _SPECS[fmt]:
        need = -(-width // spec.x_div) * spec.channels * spec.pitch_div
        pitch = max(pitch, need)
    return pitch


def default_pitch(fmt: ColorFormat, width: int, alignment: int = 256) -> int:
    """The pitch eglcuda allocates with: :func:`min_pitch` rounded up to ``alignment`` bytes."""
    return -(-min_pitch(fmt, width) // alignment) * alignment


def plane_geometry(fmt: ColorFormat | str, width: int, height: int, pitch: int) -> tuple[PlaneGeometry, ...]:
    """Every plane's geometry for a frame of ``fmt`` (a :class:`ColorFormat`, its name or value);
    ``pitch`` is plane 0's bytes between rows, 0 for CUDA-array planes. Raises
    :class:`UsageError` for sizes and pitches no frame can have."""
    fmt = color_format(fmt)
    width, height = check_size(width, height)
    checked = as_int(pitch)
    if checked is None or checked < 0:
        raise UsageError(f"pitch is an int >= 0 (0: CUDA-array planes), got {shown(pitch)}")
    pitch = checked
    if pitch:
        check_pitch(fmt, width, pitch)
    return _plane_geometry(fmt, width, height, pitch)


def _plane_geometry(fmt: ColorFormat, width: int, height: int, pitch: int) -> tuple[PlaneGeometry, ...]:
    """plane_geometry for arguments already checked (eglcuda's own callers)."""
    planes = []
    for spec in _SPECS[fmt]:
        plane_pitch = pitch // spec.pitch_div if pitch else 0
        planes.append(PlaneGeometry(-(-width // spec.x_div), -(-height // spec.y_div), spec.channels, plane_pitch))
    return tuple(planes)


def driver_extents(fmt: ColorFormat, width: int, height: int, pitch: int) -> tuple[int, ...]:
    """Bytes from each plane's start that the CUDA driver needs to be device memory.

    The driver takes every plane's rows to be the frame's ``pitch`` (plane 0's) apart, whatever
    the plane's own pitch: for the half-pitch chroma planes of ``YUV420_PLANAR`` it validates
    ``pitch x plane height`` bytes, twice what the plane spans. Measured on driver 580: a frame
    whose V plane ended less than that before the end of mapped memory failed at acquire with
    CUDA_ERROR_INVALID_VALUE, depending on where the allocator had put it
    (research/probes/plane_extent_probe.py). eglcuda allocates this much and checks wrapped
    memory for it."""
    return tuple(pitch * g.height for g in _plane_geometry(fmt, width, height, pitch))


PLANE_ALIGNMENT = 256  # bytes between planes of one allocation, and the default pitch alignment


def linear_layout(fmt: ColorFormat, width: int, height: int, pitch: int) -> tuple[tuple[int, ...], int]:
    """Where the planes of a pitch-linear frame sit in one allocation that eglcuda makes: each
    plane's offset in bytes from the start (every plane starts :data:`PLANE_ALIGNMENT` bytes
    aligned) and the allocation's size in bytes, which also holds what the driver reads past a
    half-pitch plane (:func:`driver_extents`). Arguments already checked."""
    offsets, total = [], 0
    for g in _plane_geometry(fmt, width, height, pitch):
        offsets.append(total)
        total += -(-g.pitch * g.height // PLANE_ALIGNMENT) * PLANE_ALIGNMENT
    total = max(total, *(o + e for o, e in zip(offsets, driver_extents(fmt, width, height, pitch))))
    return tuple(offsets), total


def check_pitch(fmt: ColorFormat, width: int, pitch: int) -> int:
    """``pitch`` as a plain int, or :class:`UsageError` unless it holds every plane's row under
    the convention."""
    need = min_pitch(fmt, width)
    divisor = max(spec.pitch_div for spec in _SPECS[fmt])
    checked = as_int(pitch)
    if checked is None or checked > MAX_PITCH:
        raise UsageError(f"pitch is an int of at most {MAX_PITCH} bytes, got {shown(pitch)}")
    pitch = checked
    if pitch < need or pitch % divisor:
        raise UsageError(
            f"pitch {pitch!r} does not fit a {width}-pixel-wide {fmt.name} frame: it must be at least {need} bytes"
            + (f" and a multiple of {divisor}" if divisor > 1 else "")
        )
    return pitch
