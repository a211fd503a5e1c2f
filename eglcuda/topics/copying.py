"""``Publisher.publish_from``'s copy of a source (a frame, one array per plane, or one stacked
array) into a pool frame, ordered after the stream the source's exporter names."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._bind import cuda
from .._integers import as_int
from ..errors import UsageError
from ..frames.frame import Plane, order_after
from ..frames.interop import cai_stream, foreign_device_pointer, row_pitch, stream_handle


def copy_into(frame: Any, source: Any, cuda_stream: Any) -> None:
    """publish_from's copy of ``source`` into pool frame ``frame``, queued on ``cuda_stream`` (None:
    the legacy default stream, the one the publish that follows is ordered on)."""
    planes = frame.planes
    stream = stream_handle(cuda_stream)  # (explicit: a source frame's copy would default to its own stream)
    if hasattr(source, "planes"):
        try:
            sources = list(source.planes)
        except TypeError:
            raise UsageError(f"the source's planes are no sequence (got {type(source.planes).__name__})") from None
        if len(sources) != len(planes):
            raise UsageError(f"the source has {len(sources)} planes, the topic's frames {len(planes)}")
        writers = getattr(source, "_handed_to", None)
        if writers:
            # Streams the source was handed to since it came to its holder (a DLPack consumer that
            # wrote it, a copy into it): the copies wait for them on the GPU (docs/ordering.md).
            source.device.make_current()
            cuda.join_streams(stream, writers, "ordering a copy after the streams that wrote it")
        for target, plane in zip(planes, sources):
            try:
                plane_size = (plane.width, plane.height, plane.channels)
            except AttributeError:
                raise UsageError(f"the source's planes are eglcuda planes (width, height, channels), "
                                 f"got {type(plane).__name__}") from None
            if plane_size != (target.width, target.height, target.channels):
                raise UsageError(f"source plane {plane.index} is {plane.shape}, the topic's {target.shape}")
            if isinstance(plane, Plane):  # (either may be a CUDA array: a layout="array" topic's pool)
                plane._copy_to_plane(target, stream)
            else:
                plane.copy_to_device(target.pointer, target.pitch, stream)
        return
    arrays = list(source) if isinstance(source, (list, tuple)) else [source]
    if len(arrays) == 1 and len(planes) > 1:
        arrays = _split_stacked(arrays[0], planes)
    if len(arrays) != len(planes):
        raise UsageError(f"publish_from takes one array per plane ({len(planes)}), got {len(arrays)}")
    for target, array in zip(planes, arrays):
        if isinstance(array, np.ndarray):
            target.copy_from(array)
            continue
        pointer, shape, strides, typestr, written_on, _ = foreign_device_pointer(array)
        pitch = row_pitch(shape, strides, typestr, target.height, target.geometry.row_bytes,
                           f"plane {target.index} takes uint8 data of shape {target.shape}")
        source_stream = cai_stream(written_on)
        if source_stream is not None:
            # The array's exporter named the stream its data is ordered on (CuPy's and PyTorch's
            # current stream): the copy waits for it on the GPU.
            order_after(frame.device, source_stream, stream)
        target.copy_from_device(pointer, pitch, stream)


class _Rows:
    """A window of rows of a foreign CUDA array (for a stacked multi-plane array)."""

    def __init__(self, pointer: int, rows: int, row_bytes: int, pitch: int, stream: Any = None) -> None:
        self.__cuda_array_interface__ = {"shape": (rows, row_bytes), "strides": (pitch, 1), "typestr": "|u1",
                                         "data": (pointer, True), "version": 3, "stream": stream}


def _split_stacked(array: Any, planes: Sequence[Any]) -> list[Any]:

    row_bytes = {p.geometry.row_bytes for p in planes}
    total = sum(p.height for p in planes)
    if len(row_bytes) != 1:
        raise UsageError("a single source array covers only formats whose planes have equal row sizes (NV12); "
                         "pass one array per plane")
    (width_bytes,) = row_bytes
    if isinstance(array, np.ndarray):
        if array.ndim < 2 or array.shape[0] != total or array.size != total * width_bytes:
            raise UsageError(f"a stacked source is ({total}, {width_bytes}) uint8, got {array.shape}")
        flat = array.reshape(total, width_bytes)
        out, at = [], 0
        for plane in planes:
            out.append(flat[at: at + plane.height].reshape(plane.shape))
            at += plane.height
        return out
    pointer, shape, strides, typestr, written_on, _ = foreign_device_pointer(array)
    pitch = row_pitch(shape, strides, typestr, total, width_bytes, f"a stacked source is ({total}, {width_bytes}) uint8")
    out, at = [], 0
    for plane in planes:
        out.append(_Rows(pointer + at * pitch, plane.height, width_bytes, pitch, written_on))
        at += plane.height
    return out
