"""A stand-in for PyNvVideoCodec on a machine without a GPU (tests only).

PyAV decodes on the CPU into host buffers whose addresses play the decoder's device pointers:
with tests/fakes/driver/fake_cuda.c as libcuda.so.1, "device memory" is host memory, and each
buffer is adopted as device memory the decoder owns (the fake's ``fake_cuda_adopt``), so eglcuda's
plane copies read them. It behaves like PyNvVideoCodec 2.2.4 where samples/_video.py relies on
it (see docs/pynvvideocodec.md): NV12 output as one (H*3/2, W) buffer per frame with pitch W,
the frames of one ``Decode`` call in buffers 0..n-1 that the next call writes again,
``GetNumDecodedFrame`` + ``GetLockedFrame`` / ``UnlockFrame``, an empty packet that flushes.
Only the calls samples/_video.py makes are here. Not a model of NVDEC's timing.
"""
from __future__ import annotations

import ctypes
import enum
import weakref

import numpy as np

import av

__version__ = "0.0-fake"


class cudaVideoCodec(enum.Enum):  # noqa: N801 - PyNvVideoCodec's names
    MPEG2 = 1
    H264 = 4
    HEVC = 8
    VP9 = 10
    AV1 = 11


class cudaVideoChromaFormat(enum.Enum):  # noqa: N801
    Monochrome = 0
    _420 = 1
    _422 = 2
    _444 = 3

    def __str__(self) -> str:
        return f"cudaVideoChromaFormat.{self.name.lstrip('_')}"


class DisplayDecodeLatencyType(enum.Enum):
    NATIVE = 0
    LOW = 1
    ZERO = 2


class VideoPacketFlag(enum.IntEnum):
    ENDOFSTREAM = 1
    ENDOFPICTURE = 2


def _fake_driver():
    try:
        library = ctypes.CDLL("libcuda.so.1")
        library.fake_cuda_adopt.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        library.fake_cuda_disown.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None  # not the fake: nothing to tell
    return library


_DRIVER = _fake_driver()


def _device_buffer(size: int) -> np.ndarray:
    """A host buffer the fake libcuda takes for device memory (NVDEC's output) while it lives."""
    buffer = np.empty(size, np.uint8)
    if _DRIVER is not None:
        _DRIVER.fake_cuda_adopt(buffer.ctypes.data, size)
        weakref.finalize(buffer, _DRIVER.fake_cuda_disown, buffer.ctypes.data)
    return buffer


_CODECS = {"h264": cudaVideoCodec.H264, "hevc": cudaVideoCodec.HEVC, "av1": cudaVideoCodec.AV1,
           "mpeg2video": cudaVideoCodec.MPEG2, "vp9": cudaVideoCodec.VP9}


class PacketData:
    def __init__(self) -> None:
        self.bsl = 0
        self.bsl_data = 0
        self.pts = 0
        self.decode_flag = 0
        self._packet = None
        self._stream = None


class _Demuxer:
    def __init__(self, filename: str) -> None:
        self._container = av.open(filename)
        self._stream = self._container.streams.video[0]

    def Width(self) -> int:  # noqa: N802
        return self._stream.codec_context.width

    def Height(self) -> int:  # noqa: N802
        return self._stream.codec_context.height

    def FrameRate(self) -> float:  # noqa: N802
        rate = self._stream.average_rate
        return float(rate) if rate else 0.0

    def GetNvCodecId(self) -> cudaVideoCodec:  # noqa: N802
        return _CODECS.get(self._stream.codec_context.name, cudaVideoCodec.MPEG2)

    def BitDepth(self) -> int:  # noqa: N802
        return 10 if "10" in (self._stream.codec_context.pix_fmt or "") else 8

    def ChromaFormat(self) -> cudaVideoChromaFormat:  # noqa: N802
        fmt = self._stream.codec_context.pix_fmt or ""
        return cudaVideoChromaFormat._444 if "444" in fmt else (
            cudaVideoChromaFormat._422 if "422" in fmt else cudaVideoChromaFormat._420)

    def __iter__(self):
        for packet in self._container.demux(self._stream):
            if packet.size == 0:
                continue
            data = PacketData()
            data.bsl = packet.size
            data.pts = packet.pts or 0
            data._packet = packet
            data._stream = self._stream
            yield data
        self._container.close()


def CreateDemuxer(filename: str) -> _Demuxer:  # noqa: N802
    return _Demuxer(filename)


def GetDecoderCaps(gpuid: int = 0, codec: cudaVideoCodec = cudaVideoCodec.H264, chromaformat=None,  # noqa: N802
                   bitdepth: int = 8) -> dict:
    supported = codec in (cudaVideoCodec.H264, cudaVideoCodec.HEVC)
    return {"codec_id": codec.value, "supported": int(supported), "num_decoder_engines": 1, "width_max": 4096,
            "height_max": 4096, "bitdepth": bitdepth}


class _DecodedFrame:
    def __init__(self, buffer: np.ndarray, width: int, height: int, pts: int) -> None:
        self._buffer = buffer
        self._width, self._height, self._pts = width, height, pts

    def GetPtrToPlane(self, index: int) -> int:  # noqa: N802
        return self._buffer.ctypes.data + (self._width * self._height if index else 0)

    def getPTS(self) -> int:  # noqa: N802
        return self._pts


class _Decoder:
    def __init__(self, codec: cudaVideoCodec) -> None:
        self.codec = codec
        self._context = None
        self._slots: list[np.ndarray] = []  # reused from 0 at every Decode call
        self._free: list[np.ndarray] = []  # for locked frames
        self._locked: dict[int, np.ndarray] = {}
        self._ready: list[np.ndarray] = []
        self.width = self.height = 0

    def _decode(self, packet: PacketData) -> list[tuple[np.ndarray, int]]:
        if self._context is None:
            if packet._stream is None:
                return []
            source = packet._stream.codec_context
            self._context = av.CodecContext.create(source.name, "r")
            self._context.extradata = source.extradata
        frames = self._context.decode(packet._packet if packet.bsl else None)
        out = []
        for frame in frames:
            nv12 = frame.to_ndarray(format="nv12")
            self.height, self.width = nv12.shape[0] * 2 // 3, nv12.shape[1]
            out.append((nv12, frame.pts or 0))
        return out

    def Decode(self, packet: PacketData) -> list[_DecodedFrame]:  # noqa: N802
        result = []
        for number, (nv12, pts) in enumerate(self._decode(packet)):
            if number == len(self._slots):
                self._slots.append(_device_buffer(nv12.size))
            elif self._slots[number].size != nv12.size:  # (a stream that changes size: NvDecoder reconfigures)
                self._slots[number] = _device_buffer(nv12.size)
            slot = self._slots[number]
            slot[:] = nv12.reshape(-1)
            result.append(_DecodedFrame(slot, self.width, self.height, pts))
        return result

    def GetNumDecodedFrame(self, packet: PacketData) -> int:  # noqa: N802
        decoded = self._decode(packet)
        for nv12, _ in decoded:
            buffer = self._free.pop() if self._free else _device_buffer(nv12.size)
            buffer[:] = nv12.reshape(-1)
            self._ready.append(buffer)
        return len(decoded)

    def GetLockedFrame(self) -> int:  # noqa: N802
        if not self._ready:
            return 0
        buffer = self._ready.pop(0)
        self._locked[buffer.ctypes.data] = buffer
        return buffer.ctypes.data

    def UnlockFrame(self, pointer: int) -> None:  # noqa: N802
        buffer = self._locked.pop(pointer, None)
        if buffer is not None:
            buffer[:] = 0xAB  # a reused buffer gets new content soon: make a late reader see it
            self._free.append(buffer)

    def GetWidth(self) -> int:  # noqa: N802
        return self.width

    def GetHeight(self) -> int:  # noqa: N802
        return self.height


def CreateDecoder(gpuid: int = 0, codec: cudaVideoCodec = cudaVideoCodec.H264, cudacontext: int = 0,  # noqa: N802
                  cudastream: int = 0, usedevicememory: bool = False, **options) -> _Decoder:
    if not usedevicememory:
        raise ValueError("the fake PyNvVideoCodec decodes to 'device' memory only")
    return _Decoder(codec)
