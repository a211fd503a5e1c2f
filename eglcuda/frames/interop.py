"""Zero-copy views for other libraries: ``__cuda_array_interface__`` (v3) and DLPack, and the
conversions of foreign CUDA streams and arrays into raw handles. (DLPack capsules are made by
the compiled part of this layer, :mod:`eglcuda.frames._core`.)"""
from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from typing import Any, Sequence

from .._integers import as_int, is_bool
from ..errors import UsageError

# DLPack device type and the stream numbers the protocol reserves (CUDA).
DL_CUDA = 2
_LEGACY_DEFAULT_STREAM = 1
_PER_THREAD_DEFAULT_STREAM = 2
_NO_SYNCHRONIZATION = -1
CU_STREAM_PER_THREAD = 0x2


def stream_handle(stream: Any) -> int:
    """A raw ``CUstream`` (int) from None (the legacy default stream), an int, or a stream object
    of cuda.core (``__cuda_stream__``), CuPy (``.ptr``), PyTorch (``.cuda_stream``) or
    cuda-python (``CUstream``, ``int()``-able)."""
    if stream is None:
        return 0
    if type(stream) is int:
        value = stream
    elif isinstance(stream, (float, complex, str, bytes)) or is_bool(stream):
        raise _not_a_stream(stream)
    else:
        value = _handle_of(stream)
    if not 0 <= value < 2**64:
        raise UsageError(f"a CUDA stream handle is an address (an int in 0..2**64-1), got {value}")
    return value


def _handle_of(stream: Any) -> int:
    """The handle of a stream object, or of a number that is an integer (a NumPy one, say)."""
    try:
        protocol = getattr(stream, "__cuda_stream__", None)
        if protocol is not None:
            return int(protocol()[1])
        for attribute in ("ptr", "cuda_stream", "handle"):
            value = getattr(stream, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        if isinstance(stream, numbers.Number) and not isinstance(stream, numbers.Integral):
            raise _not_a_stream(stream)  # (a NumPy float would be cut to an int that names another stream)
        return int(stream)
    except (TypeError, ValueError, IndexError, OverflowError):
        raise UsageError(f"cannot take a CUDA stream from {type(stream).__name__}") from None


def _not_a_stream(value: Any) -> UsageError:
    return UsageError(f"a CUDA stream is None, an int handle or a stream object, got {value!r}")


def dlpack_stream(stream: Any) -> int | None:
    """The ``CUstream`` a DLPack consumer named in ``__dlpack__(stream=...)``: None (the
    protocol's default) is the legacy default stream; None is returned for -1, the protocol's
    "do not synchronize"."""
    if stream is None:
        return 0
    if isinstance(stream, (float, str, bytes)) or is_bool(stream):
        raise UsageError(f"a DLPack stream is None, -1, 1, 2 or a CUstream as an int, got {stream!r}")
    # (A NumPy integer is the number it holds: -1 and 0 keep the protocol's meaning.)
    number = as_int(stream)
    if number is None:
        return stream_handle(stream)  # a stream object, named directly
    if number == _NO_SYNCHRONIZATION:
        return None
    if not 0 <= number < 2**64:
        raise UsageError(f"a DLPack stream is None, -1, 1, 2 or a CUstream as an int, got {stream!r}")
    if number == _LEGACY_DEFAULT_STREAM:
        return 0
    if number == _PER_THREAD_DEFAULT_STREAM:
        return CU_STREAM_PER_THREAD
    if number == 0:
        raise UsageError("stream 0 is ambiguous for CUDA in DLPack; pass 1 (legacy default) or 2 (per-thread)")
    return number


def cai_stream(value: Any) -> int | None:
    """The ``CUstream`` of a ``__cuda_array_interface__`` v3 ``stream`` entry: None (nothing to
    wait for), 1 (the legacy default stream), 2 (the per-thread default stream) or a handle."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**64:
        raise UsageError(f"__cuda_array_interface__'s stream is None or a positive int, got {value!r}")
    if value == _LEGACY_DEFAULT_STREAM:
        return 0
    if value == _PER_THREAD_DEFAULT_STREAM:
        return CU_STREAM_PER_THREAD
    return value


def cai_reader_streams(ordinal: int = 0) -> tuple[int, ...]:
    """The streams a ``__cuda_array_interface__`` consumer most likely works on, since the
    protocol never tells the exporter: the legacy default stream (CuPy's, Numba's and PyTorch's
    default), and the current streams of CuPy and PyTorch on CUDA device ``ordinal`` where those
    libraries are already loaded (never imported here). Work on any other stream must be named
    at release (docs/ordering.md)."""
    streams = [0]
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            streams.append(stream_handle(cupy.cuda.get_current_stream(ordinal).ptr))
        except Exception:  # an old CuPy without the device argument, or no CUDA there: the default stays
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                streams.append(stream_handle(torch.cuda.current_stream(ordinal).cuda_stream))
        except Exception:  # a CPU-only build: nothing more to count
            pass
    return tuple(streams)


def foreign_device_pointer(obj: Any) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, str, Any, bool]:
    """(pointer, shape, strides in bytes or None, typestr, stream, read-only) of a foreign CUDA array, from
    ``__cuda_array_interface__``. DLPack-only objects are taken through ``torch``-free means:
    their capsule is not parsed here; pass ``__cuda_array_interface__`` objects or raw pointers."""
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        raise UsageError(f"{type(obj).__name__} has no __cuda_array_interface__")
    if not isinstance(interface, Mapping):
        raise UsageError(f"{type(obj).__name__}'s __cuda_array_interface__ is malformed (a dict with 'data': "
                         f"(pointer, read_only), 'shape' and 'typestr'), got a {type(interface).__name__}")
    if interface.get("mask") is not None:  # (the protocol: a consumer without masks refuses a masked array)
        raise UsageError(f"{type(obj).__name__} is a masked array (its __cuda_array_interface__ has a mask): "
                         "eglcuda reads every element; pass the array without its mask")
    try:
        pointer, read_only = interface["data"]
        # An int (a NumPy one too): int() would also turn a string, a float or True into an address.
        address = as_int(pointer)
        if address is None:
            raise TypeError(f"the data pointer is an int, got {pointer!r}")
        return address, tuple(interface["shape"]), \
            (tuple(interface["strides"]) if interface.get("strides") else None), \
            interface["typestr"], interface.get("stream"), bool(read_only)
    except (KeyError, TypeError, ValueError) as exc:  # (a malformed interface: the protocol's keys are required)
        raise UsageError(f"{type(obj).__name__}'s __cuda_array_interface__ is malformed "
                         f"(needs 'data': (pointer, read_only), 'shape' and 'typestr'): {exc!r}") from None


def row_pitch(shape: Sequence[Any], strides: Sequence[Any] | None, typestr: Any, rows: int, row_bytes: int,
               wanted: str) -> int:
    """The pitch of a foreign CUDA array of ``rows`` rows of ``row_bytes`` uint8 each, whose
    rows may be apart but whose bytes within a row follow one another (C order): a copy takes
    each row as ``row_bytes`` consecutive bytes. Anything else (a column slice, a transposed or
    channel-first view) raises :class:`UsageError` with ``wanted``, rather than copy other bytes."""
    dims = [d for d in (as_int(extent) for extent in shape) if d is not None]
    if (typestr not in ("|u1", "<u1") or not dims or len(dims) != len(shape) or dims[0] != rows
            or math.prod(dims[1:]) != row_bytes):
        raise UsageError(f"{wanted}, got {typestr} {tuple(shape)}")
    if not strides:
        return row_bytes  # (C-contiguous, as the interface says of an array without strides)
    steps = [s for s in (as_int(step) for step in strides) if s is not None]
    if len(steps) != len(dims) or len(strides) != len(dims):
        raise UsageError(f"{wanted}: its strides {tuple(strides)} do not fit its shape {tuple(shape)}")
    expected = 1
    for extent, step in zip(reversed(dims[1:]), reversed(steps[1:])):
        if extent != 1 and step != expected:
            raise UsageError(f"{wanted} with each row's bytes one after the other, got strides {tuple(strides)} for "
                             f"shape {tuple(shape)} (copy it to a contiguous array first)")
        expected *= extent
    return row_bytes if rows == 1 else steps[0]  # (a single row's stride says nothing)
