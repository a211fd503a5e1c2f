"""What samples/video_pipeline.py, bench/video.py and tests/gpu/test_video.py share.

- :func:`import_nvc` imports PyNvVideoCodec (NVDEC from Python, the ``video`` extra) quietly and
  says in one line why it cannot, :func:`open_video` reads a file's stream facts and
  :func:`nvdec_problem` asks NVDEC whether it decodes them.
- :class:`NvdecReader` decodes a file into NV12 device frames. PyNvVideoCodec hands out its own
  output buffers (one allocation each, Y then interleaved UV, pitch = width) and writes them again
  at its next ``Decode`` call, so a frame must be copied out (:func:`copy_into`, into a topic's
  pool frame) or locked (``locked=True``: ``GetLockedFrame`` / ``UnlockFrame``) before then.
- :data:`PAYLOAD`: what the decoder sends beside each frame (frame index, pts and, when checking,
  the SHA-256 of the decoded Y and UV planes).
- :class:`Inference`: NV12 -> RGB on the GPU, a resize and a small convolutional network in
  PyTorch (random weights), per frame a class and its probability, left on the GPU.
- :class:`GLPreview` draws a GL texture into an RGBA8 framebuffer and reads rows of it back;
  :class:`ContactSheet` and :func:`write_png` make the pictures a user opens.
- :func:`rgb_reference` / :func:`best_color_match`: the colours a GL consumer should show for an
  NV12 frame, under each usual YUV convention (GL samples YUV frames as RGB, so a GL subscriber
  cannot compare bytes with the decoder; it compares colours).

Nothing here imports NumPy, PyNvVideoCodec, PyTorch or PyOpenGL at import time: each is imported
where it is used, so ``--help`` and the one-line checks work without them.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

if TYPE_CHECKING:
    import numpy as np
else:
    class _Numpy:
        """NumPy, imported at first use: a script's require() names a missing one first. (Not
        through samples/_sample.py or bench/_script.py: this file serves the samples and the
        benchmarks both.)"""

        def __getattr__(self, name: str) -> Any:
            import numpy

            return getattr(numpy, name)

    np = _Numpy()

NVC_HINT = ("pip install -e '.[video]' (PyNvVideoCodec, which also needs the NVIDIA driver's libnvcuvid.so.1 "
            "and libnvidia-encode.so.1)")


def one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# ==== PyNvVideoCodec: import, stream facts, NVDEC capabilities ======================================

def import_nvc() -> tuple[Any, str | None]:
    """``(PyNvVideoCodec, None)``, or ``(None, why)`` in one line. Its import logs to the root
    logger's last-resort handler when it fails; that is silenced here so a script's failure
    stays one line."""
    logger = logging.getLogger("PyNvVideoCodec")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    try:
        import PyNvVideoCodec as nvc
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "PyNvVideoCodec":
            return None, f"needs PyNvVideoCodec to decode with NVDEC: {NVC_HINT}"
        return None, f"needs PyNvVideoCodec, which does not load here ({one_line(exc)}): {NVC_HINT}"
    except Exception as exc:  # noqa: BLE001 - it raises RuntimeError when the driver's libraries are missing
        text = str(exc)
        if "libnvidia-encode" in text or "cannot open shared object" in text:
            return None, ("needs the NVIDIA driver's video libraries (PyNvVideoCodec loads libnvidia-encode.so.1 at "
                          "import and NVDEC's libnvcuvid.so.1; in a container, NVIDIA_DRIVER_CAPABILITIES must "
                          f"include 'video'): {one_line(exc)}")
        return None, f"needs a working PyNvVideoCodec ({one_line(exc)}): {NVC_HINT}"
    return nvc, None


class VideoProblem(Exception):
    """Why a file cannot be decoded here (one line)."""


@dataclass(frozen=True)
class VideoInfo:
    path: str
    width: int
    height: int
    fps: float  # the stream's average frame rate (30 when the container does not say)
    codec: str  # "H.264" or "HEVC"
    codec_id: Any  # nvc.cudaVideoCodec


def _codec_name(nvc: Any, codec_id: Any) -> str | None:
    for attribute, name in (("H264", "H.264"), ("HEVC", "HEVC")):
        if codec_id == getattr(nvc.cudaVideoCodec, attribute, object()):
            return name
    return None


def open_video(nvc: Any, path: str) -> VideoInfo:
    """The stream facts of ``path`` from PyNvVideoCodec's demuxer; :class:`VideoProblem` when it is
    not an 8-bit 4:2:0 H.264 or HEVC video."""
    if not os.path.isfile(path):
        why = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise VideoProblem(f"needs a video file to decode: {path} {why}")
    try:
        demuxer = nvc.CreateDemuxer(filename=str(path))
        codec_id = demuxer.GetNvCodecId()
        width, height = int(demuxer.Width()), int(demuxer.Height())
    except Exception as exc:  # noqa: BLE001 - PyNvVCException and friends
        raise VideoProblem(f"needs a video file it can demux: {path}: {one_line(exc)}") from None
    name = _codec_name(nvc, codec_id)
    if name is None:
        raise VideoProblem(f"needs an H.264 or HEVC video: {path} is {codec_id}")
    try:
        depth = int(demuxer.BitDepth())
    except Exception:  # noqa: BLE001 - facts the demuxer may not know; NVDEC will say
        depth = 8
    try:
        chroma = str(demuxer.ChromaFormat())
    except Exception:  # noqa: BLE001
        chroma = "420"
    if depth > 8 or any(other in chroma for other in ("422", "444", "Monochrome")):
        raise VideoProblem(f"needs 8-bit 4:2:0 video (decoded to NV12): {path} is {depth}-bit {chroma}")
    try:
        fps = float(demuxer.FrameRate())
    except Exception:  # noqa: BLE001
        fps = 0.0
    if not math.isfinite(fps) or not 0 < fps < 1000:
        fps = 30.0
    return VideoInfo(str(path), width, height, fps, name, codec_id)


def nvdec_problem(nvc: Any, info: VideoInfo, gpu: int = 0) -> str | None:
    """Why NVDEC on GPU ``gpu`` cannot decode ``info`` (None: it can)."""
    try:
        caps = dict(nvc.GetDecoderCaps(gpuid=gpu, codec=info.codec_id))
    except Exception as exc:  # noqa: BLE001
        return f"needs NVDEC, which is not usable here ({one_line(exc)})"
    if not caps.get("supported"):
        return f"needs an NVDEC that decodes 8-bit 4:2:0 {info.codec}: this GPU's does not"
    width_max, height_max = int(caps.get("width_max", 1 << 30)), int(caps.get("height_max", 1 << 30))
    if info.width > width_max or info.height > height_max:
        return (f"needs an NVDEC that decodes {info.width}x{info.height} {info.codec}: this GPU's stops at "
                f"{width_max}x{height_max}")
    return None


# ==== decoding ==================================================================================

class Decoded(NamedTuple):
    """One decoded frame in the decoder's buffer: valid until the next ``Decode`` call (or, for
    a locked frame, until :meth:`NvdecReader.unlock`)."""

    index: int  # display order, counted from 0 over every pass of the file
    y: int  # device address of the Y plane (pitch = width)
    uv: int  # device address of the interleaved UV plane (pitch = width)
    pts: int  # -1 for locked frames (GetLockedFrame does not say)
    locked: bool


STALL_PACKETS = 64  # packets without a frame, once frames came, after which decoding has stalled


class NvdecReader:
    """Decodes ``info.path`` with NVDEC into NV12 device frames, in display order.

    - ``locked=False``: ``Decode`` returns the frames; their buffers are written again by the next
      ``Decode`` call.
    - ``locked=True``: ``GetNumDecodedFrame`` + ``GetLockedFrame``; each frame's buffer stays the
      caller's until :meth:`unlock` (the decoder allocates another meanwhile).

    ``latency``: ``"native"`` (the parser's display delay, any stream) or ``"low"`` (each
    packet's picture from the same call; streams without B-frames). Output is on the legacy
    default stream of the device's primary context (``cudastream=0``), complete when the call
    returns."""

    def __init__(self, nvc: Any, info: VideoInfo, gpu: int = 0, latency: str = "native", locked: bool = False) -> None:
        self.nvc = nvc
        self.info = info
        self.locked = locked
        self.low_latency = latency == "low"
        kind = nvc.DisplayDecodeLatencyType.LOW if self.low_latency else nvc.DisplayDecodeLatencyType.NATIVE
        self.decoder = nvc.CreateDecoder(gpuid=gpu, codec=info.codec_id, cudacontext=0, cudastream=0,
                                         usedevicememory=True, latency=kind)
        self.decoded = 0
        self.decode_s = 0.0  # time spent inside Decode / GetNumDecodedFrame calls

    def _packets(self, loops: int) -> Iterator[Any]:
        """Every packet of the file, ``loops`` times over (passes follow each other as one
        stream: each starts with a key frame), then the empty packet that flushes the decoder."""
        for _ in range(loops):
            for packet in self.nvc.CreateDemuxer(filename=self.info.path):
                if not packet.bsl:
                    continue  # an empty packet would end the stream (CUVID_PKT_ENDOFSTREAM) between passes
                if self.low_latency:
                    packet.decode_flag = self.nvc.VideoPacketFlag.ENDOFPICTURE
                yield packet
        yield self.nvc.PacketData()

    def frames(self, loops: int = 1) -> Iterator[Decoded]:
        import time

        width, height = self.info.width, self.info.height
        plane = width * height
        decoder = self.decoder
        idle = 0  # packets in a row that gave no frame
        for packet in self._packets(loops):
            idle = idle + 1 if self.decoded else 0
            if idle > STALL_PACKETS:
                raise VideoProblem(f"the decoder gave no frame for {STALL_PACKETS} packets in a row (after "
                                   f"{self.decoded} frames)")
            started = time.perf_counter()
            if self.locked:
                count = decoder.GetNumDecodedFrame(packet)
                pointers = [decoder.GetLockedFrame() for _ in range(count)]
                self.decode_s += time.perf_counter() - started
                for pointer in pointers:
                    idle = 0
                    self._check_size()
                    yield Decoded(self.decoded, int(pointer), int(pointer) + plane, -1, True)
                    self.decoded += 1
                continue
            frames = decoder.Decode(packet)
            self.decode_s += time.perf_counter() - started
            for frame in frames:
                idle = 0
                self._check_size()
                yield Decoded(self.decoded, int(frame.GetPtrToPlane(0)), int(frame.GetPtrToPlane(1)),
                              int(frame.getPTS()), False)
                self.decoded += 1

    def _check_size(self) -> None:
        # Every frame: a stream whose size changes midway has the decoder reconfigure, and its
        # frames are then copied as the wrong size (scrambled, or read past the decoder's buffer).
        got = (int(self.decoder.GetWidth()), int(self.decoder.GetHeight()))
        if got != (self.info.width, self.info.height):
            where = "" if self.decoded == 0 else f" from frame {self.decoded} on (the stream changes size)"
            raise VideoProblem(f"the decoder outputs {got[0]}x{got[1]} frames{where}, the demuxer said "
                               f"{self.info.width}x{self.info.height}")

    def unlock(self, frame: Decoded) -> None:
        if frame.locked:
            self.decoder.UnlockFrame(frame.y)


# ==== the decoder's side of the topic ============================================================

def copy_into(pool_frame: Any, frame: Decoded, width: int, cuda_stream: Any = None) -> None:
    """Queue the copy of a decoded frame into a topic's pool frame (two ``cuMemcpy2DAsync``, one
    per plane: the pool's pitch is 256-aligned, the decoder's is the width)."""
    y_plane, uv_plane = pool_frame.planes
    y_plane.copy_from_device(frame.y, width, cuda_stream)
    uv_plane.copy_from_device(frame.uv, width, cuda_stream)


_libcuda: Any = None


def cuda_sync(stream: int = 0) -> None:
    """``cuStreamSynchronize(stream)`` in the calling thread's current context (0: its legacy
    default stream)."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    status = _libcuda.cuStreamSynchronize(ctypes.c_void_p(stream or None))
    if status:
        raise RuntimeError(f"cuStreamSynchronize failed with CUDA error {status}")


def host_nv12(frame: Decoded, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of a decoded frame's Y (H, W) and UV (H/2, W) planes, read from the decoder's
    buffer (the copies wait for the legacy default stream)."""
    import eglcuda

    wrapped = eglcuda.Frame.from_pointer([frame.y, frame.uv], width, height, pitch=width, format="NV12")
    try:
        y = wrapped.planes[0].to_numpy()
        uv = wrapped.planes[1].to_numpy().reshape(-1, width)
    finally:
        wrapped.close()
    return y, uv


def received_nv12(message_frame: Any) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of a received NV12 frame's planes, shaped like :func:`host_nv12`'s."""
    y_plane, uv_plane = message_frame.planes
    y = y_plane.to_numpy()
    uv = uv_plane.to_numpy()
    return y, uv.reshape(uv.shape[0], -1)


def nv12_digests(y: np.ndarray, uv: np.ndarray) -> tuple[bytes, bytes]:
    """SHA-256 of the tightly packed Y and UV planes (tests/data/clips.json keeps their hex)."""
    return (hashlib.sha256(np.ascontiguousarray(y).tobytes()).digest(),
            hashlib.sha256(np.ascontiguousarray(uv).tobytes()).digest())


# index, flags, pts, SHA-256 of Y, SHA-256 of UV
PAYLOAD = struct.Struct("<IIq32s32s")
HAS_DIGESTS = 1
NO_DIGEST = bytes(32)


def pack_payload(index: int, pts: int, digests: tuple[bytes, bytes] | None = None) -> bytes:
    y, uv = digests if digests is not None else (NO_DIGEST, NO_DIGEST)
    return PAYLOAD.pack(index & 0xFFFFFFFF, HAS_DIGESTS if digests is not None else 0,
                        max(-(1 << 63), min(pts, (1 << 63) - 1)), y, uv)


def unpack_payload(data: bytes) -> dict[str, Any]:
    if len(data) != PAYLOAD.size:
        raise ValueError(f"a video frame payload is {PAYLOAD.size} bytes, got {len(data)}")
    index, flags, pts, y, uv = PAYLOAD.unpack(data)
    return {"index": index, "pts": pts, "digests": (y, uv) if flags & HAS_DIGESTS else None}


# ==== inference (PyTorch) ===========================================================================

# YUV -> RGB: (Kr, Kb) of each matrix; limited range scales Y by 255/219 and chroma by 255/224.
MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}


def _coefficients(matrix: str) -> tuple[float, float, float, float]:
    kr, kb = MATRICES[matrix]
    kg = 1.0 - kr - kb
    return 2 * (1 - kr), 2 * kb * (1 - kb) / kg, 2 * kr * (1 - kr) / kg, 2 * (1 - kb)  # R/V, G/U, G/V, B/U


def torch_view(torch: Any, plane: Any) -> Any:
    """A zero-copy CUDA tensor of an eglcuda plane: DLPack (ordered on the current stream), else
    ``__cuda_array_interface__`` for a PyTorch that refuses read-only DLPack tensors."""
    try:
        return torch.from_dlpack(plane)
    except (BufferError, RuntimeError, TypeError):
        return torch.as_tensor(plane, device="cuda")


def nv12_to_rgb(torch: Any, y: Any, uv: Any, matrix: str = "bt709") -> Any:
    """A (1, 3, H, W) float32 RGB tensor in [0, 1] from uint8 CUDA tensors Y (H, W) and UV
    (H/2, W/2, 2), limited range, chroma repeated 2x2. Queued on the current stream."""
    height, width = y.shape[0], y.shape[1]
    rv, gu, gv, bu = _coefficients(matrix)
    luma = (y.float() - 16.0) * (255.0 / 219.0)
    chroma = (uv.float() - 128.0) * (255.0 / 224.0)  # (H/2, W/2, 2)
    chroma = chroma.permute(2, 0, 1).repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)[:, :height, :width]
    u, v = chroma[0], chroma[1]
    rgb = torch.stack((luma + rv * v, luma - gu * u - gv * v, luma + bu * u))
    return (rgb.clamp_(0.0, 255.0) * (1.0 / 255.0)).unsqueeze(0)


class Inference:
    """NV12 -> RGB, resize to ``size``, a small CNN (random weights, fixed seed), softmax: per
    frame a (class, probability) float tensor on the GPU, queued on the current stream."""

    def __init__(self, torch: Any, size: tuple[int, int] = (224, 224), classes: int = 10, seed: int = 0) -> None:
        nn = torch.nn
        self.torch = torch
        self.size = size
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
        ).cuda().eval()
        torch.random.set_rng_state(generator_state)

    def __call__(self, y: Any, uv: Any) -> Any:
        torch = self.torch
        with torch.inference_mode():
            rgb = nv12_to_rgb(torch, y, uv)
            return self.classify(rgb)

    def classify(self, rgb: Any) -> Any:
        """From a (1, 3, H, W) RGB tensor in [0, 1]."""
        torch = self.torch
        with torch.inference_mode():
            x = torch.nn.functional.interpolate(rgb, size=self.size, mode="bilinear", align_corners=False)
            probabilities = torch.softmax(self.net((x - 0.5) * 4.0), dim=1)[0]
            best, cls = probabilities.max(dim=0)
            return torch.stack((cls.float(), best))

    def warm_up(self, height: int, width: int) -> None:
        """One frame's work on zeros (cuDNN picks its kernels, CUDA loads its modules)."""
        torch = self.torch
        y = torch.full((height, width), 16, dtype=torch.uint8, device="cuda")
        uv = torch.full(((height + 1) // 2, (width + 1) // 2, 2), 128, dtype=torch.uint8, device="cuda")
        self(y, uv).cpu()


# ==== colours a GL consumer shows ================================================================

def rgb_reference(y: np.ndarray, uv: np.ndarray, matrix: str = "bt709", full_range: bool = False,
                  swap: bool = False) -> np.ndarray:
    """The RGB (H, W, 3) float image of an NV12 frame (Y (H, W), UV (H/2, W) interleaved U, V)
    under one convention; ``swap`` reads the chroma bytes as V, U."""
    height, width = y.shape
    chroma = uv.reshape(uv.shape[0], -1, 2).astype(np.float32) - 128.0
    if swap:
        chroma = chroma[..., ::-1]
    chroma = chroma.repeat(2, axis=0).repeat(2, axis=1)[:height, :width]
    u, v = chroma[..., 0], chroma[..., 1]
    if full_range:
        luma = y.astype(np.float32)
    else:
        luma = (y.astype(np.float32) - 16.0) * (255.0 / 219.0)
        u, v = u * (255.0 / 224.0), v * (255.0 / 224.0)
    rv, gu, gv, bu = _coefficients(matrix)
    rgb = np.stack((luma + rv * v, luma - gu * u - gv * v, luma + bu * u), axis=-1)
    return np.clip(rgb, 0.0, 255.0)


# Mean absolute difference (8-bit levels) between what GL shows and the closest convention's colours
# above which the GL subscriber's check fails: GL may upsample chroma and round differently.
GL_COLOUR_TOLERANCE = 10.0

COLOR_CONVENTIONS = [(matrix, full, swap) for swap in (False, True) for matrix in ("bt601", "bt709")
                     for full in (False, True)]


def convention_name(matrix: str, full_range: bool, swap: bool) -> str:
    return f"{matrix} {'full' if full_range else 'limited'} range{', U/V swapped' if swap else ''}"


def best_color_match(rgba: np.ndarray, y: np.ndarray, uv: np.ndarray, step: int = 2) -> tuple[str, float, bool]:
    """Which YUV convention makes ``rgba`` (what GL showed, (H, W, 3 or 4) uint8) closest to the
    NV12 frame, on every ``step``-th pixel: (its name, the mean absolute error in 8-bit levels,
    whether it reads U and V swapped)."""
    shown = rgba[::step, ::step, :3].astype(np.float32)
    best: tuple[float, str, bool] | None = None
    for matrix, full, swap in COLOR_CONVENTIONS:
        want = rgb_reference(y, uv, matrix, full, swap)[::step, ::step]
        error = float(np.abs(shown - want).mean())
        if best is None or error < best[0]:
            best = (error, convention_name(matrix, full, swap), swap)
    assert best is not None
    return best[1], best[0], best[2]


# ==== GL: draw into a framebuffer, read rows back ======================================================

_VERTEX = ("#version 130\nin vec2 corner;\nout vec2 uv;\n"
           "void main() { uv = corner * 0.5 + 0.5; gl_Position = vec4(corner, 0.0, 1.0); }\n")
_FRAGMENT_EXTERNAL = ("#version 130\n#extension GL_OES_EGL_image_external : require\nuniform samplerExternalOES frame;\n"
                      "in vec2 uv;\nout vec4 color;\nvoid main() { color = texture2D(frame, uv); }\n")
_FRAGMENT_2D = ("#version 130\nuniform sampler2D frame;\n"
                "in vec2 uv;\nout vec4 color;\nvoid main() { color = texture2D(frame, uv); }\n")
GL_TEXTURE_EXTERNAL_OES = 0x8D65


class GLPreview:
    """Draws a texture (``external``: a ``GL_TEXTURE_EXTERNAL_OES`` one, as a GL topic subscriber
    receives; else ``GL_TEXTURE_2D``) into an RGBA8 framebuffer of ``width`` x ``height`` with
    nearest sampling, and reads regions of it back. Row 0 of what :meth:`read` returns is the
    texture's row 0 (t = 0). Needs a current desktop-GL context (GLSL 1.30)."""

    def __init__(self, width: int, height: int, external: bool = True) -> None:
        from OpenGL import GL

        self.GL = GL
        self.width, self.height = width, height
        self.target = GL_TEXTURE_EXTERNAL_OES if external else GL.GL_TEXTURE_2D
        self.program = GL.glCreateProgram()
        for kind, source in ((GL.GL_VERTEX_SHADER, _VERTEX),
                             (GL.GL_FRAGMENT_SHADER, _FRAGMENT_EXTERNAL if external else _FRAGMENT_2D)):
            shader = GL.glCreateShader(kind)
            GL.glShaderSource(shader, source)
            GL.glCompileShader(shader)
            if not GL.glGetShaderiv(shader, GL.GL_COMPILE_STATUS):
                raise RuntimeError(f"the preview shader does not compile: {GL.glGetShaderInfoLog(shader)!r}")
            GL.glAttachShader(self.program, shader)
            GL.glDeleteShader(shader)
        GL.glBindAttribLocation(self.program, 0, "corner")
        GL.glLinkProgram(self.program)
        if not GL.glGetProgramiv(self.program, GL.GL_LINK_STATUS):
            raise RuntimeError(f"the preview program does not link: {GL.glGetProgramInfoLog(self.program)!r}")
        self.sampler = GL.glGetUniformLocation(self.program, "frame")
        self.vertex_array = GL.glGenVertexArrays(1)
        GL.glBindVertexArray(self.vertex_array)
        self.buffer = GL.glGenBuffers(1)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, self.buffer)
        corners = np.array([-1, -1, 1, -1, -1, 1, 1, 1], np.float32)
        GL.glBufferData(GL.GL_ARRAY_BUFFER, corners.nbytes, corners, GL.GL_STATIC_DRAW)
        GL.glEnableVertexAttribArray(0)
        GL.glVertexAttribPointer(0, 2, GL.GL_FLOAT, GL.GL_FALSE, 0, None)
        self.color = GL.glGenTextures(1)
        GL.glBindTexture(GL.GL_TEXTURE_2D, self.color)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
        self.framebuffer = GL.glGenFramebuffers(1)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self.framebuffer)
        GL.glFramebufferTexture2D(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, self.color, 0)
        status = GL.glCheckFramebufferStatus(GL.GL_FRAMEBUFFER)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, 0)
        if status != GL.GL_FRAMEBUFFER_COMPLETE:
            raise RuntimeError(f"the preview framebuffer is incomplete (status {status:#x})")

    def draw(self, texture: int) -> None:
        """Draw ``texture`` over the whole framebuffer (queued: :meth:`read` waits for it)."""
        GL = self.GL
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self.framebuffer)
        GL.glViewport(0, 0, self.width, self.height)
        GL.glUseProgram(self.program)
        GL.glBindVertexArray(self.vertex_array)
        GL.glActiveTexture(GL.GL_TEXTURE0)
        GL.glBindTexture(self.target, texture)
        GL.glTexParameteri(self.target, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
        GL.glTexParameteri(self.target, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
        GL.glUniform1i(self.sampler, 0)
        GL.glDrawArrays(GL.GL_TRIANGLE_STRIP, 0, 4)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, 0)

    def read(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> np.ndarray:
        """Rows ``y`` .. ``y + height`` (texture rows, t = 0 first) of columns ``x`` .. ``x + width``
        of the last drawing, as (height, width, 4) uint8 RGBA."""
        GL = self.GL
        width = self.width - x if width is None else width
        height = self.height - y if height is None else height
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self.framebuffer)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        pixels = GL.glReadPixels(x, y, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, 0)
        data = pixels if isinstance(pixels, np.ndarray) else np.frombuffer(pixels, np.uint8)
        return data.reshape(height, width, 4).copy()

    def delete(self) -> None:
        GL = self.GL
        GL.glDeleteFramebuffers(1, [self.framebuffer])
        GL.glDeleteTextures([self.color])
        GL.glDeleteBuffers(1, [self.buffer])
        GL.glDeleteVertexArrays(1, [self.vertex_array])
        GL.glDeleteProgram(self.program)


# ==== pictures ==========================================================================================

def write_png(path: str, image: np.ndarray) -> None:
    """Write an (H, W, 3) RGB or (H, W, 4) RGBA uint8 image as a PNG (zlib only)."""
    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(f"write_png takes (H, W, 3 or 4) uint8, got {image.shape}")
    height, width, channels = image.shape
    rows = np.zeros((height, 1 + width * channels), np.uint8)  # filter byte 0 (none) per row
    rows[:, 1:] = image.reshape(height, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 6, 0, 0, 0)
    with open(path, "wb") as out:
        out.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
                  + chunk(b"IEND", b""))


def read_png(path: str) -> np.ndarray:
    """Read back a PNG that :func:`write_png` wrote (8-bit RGB/RGBA, filter 0 rows): for tests."""
    with open(path, "rb") as source:
        data = source.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    at, idat, header = 8, b"", None
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        if zlib.crc32(kind + body) & 0xFFFFFFFF != struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0]:
            raise ValueError(f"{path}: bad CRC in {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    if header is None:
        raise ValueError(f"{path}: no IHDR")
    width, height, depth, color = header[:4]
    channels = {2: 3, 6: 4}[color]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    if depth != 8 or rows[:, 0].any():
        raise ValueError(f"{path}: only 8-bit rows without filters are read here")
    return rows[:, 1:].reshape(height, width, channels)


_DIGITS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
           "111100111001111", "111100111101111", "111001001001001", "111101111101111", "111101111001111"]


def draw_number(image: np.ndarray, number: int, x: int, y: int, scale: int = 3) -> None:
    """Write ``number`` in white 3x5-pixel digits on a black box at (x, y) of an RGB image."""
    text = str(number)
    box_w, box_h = (4 * len(text) + 1) * scale, 7 * scale
    image[y:y + box_h, x:x + box_w] = 0
    for position, digit in enumerate(text):
        bits = np.array([int(b) for b in _DIGITS[int(digit)]], bool).reshape(5, 3)
        glyph = bits.repeat(scale, axis=0).repeat(scale, axis=1)
        top, left = y + scale, x + (1 + 4 * position) * scale
        region = image[top:top + glyph.shape[0], left:left + glyph.shape[1]]
        region[glyph[:region.shape[0], :region.shape[1]]] = 255


class ContactSheet:
    """Thumbnails of frames in a grid, each labelled with its frame index."""

    def __init__(self, thumb_width: int = 320, columns: int = 4) -> None:
        self.thumb_width = thumb_width
        self.columns = columns
        self.thumbs: list[tuple[int, np.ndarray]] = []

    def add(self, rgb: np.ndarray, label: int) -> None:
        height, width = rgb.shape[:2]
        thumb_width = min(self.thumb_width, width)
        thumb_height = max(1, round(height * thumb_width / width))
        rows = (np.arange(thumb_height) * height // thumb_height).astype(np.intp)
        cols = (np.arange(thumb_width) * width // thumb_width).astype(np.intp)
        thumb = np.ascontiguousarray(rgb[rows][:, cols, :3])
        draw_number(thumb, label, 2, max(0, thumb_height - 23))
        self.thumbs.append((label, thumb))

    def image(self, gap: int = 4) -> np.ndarray:
        if not self.thumbs:
            raise ValueError("no frames on the contact sheet")
        height = max(t.shape[0] for _, t in self.thumbs)
        width = max(t.shape[1] for _, t in self.thumbs)
        columns = min(self.columns, len(self.thumbs))
        rows = -(-len(self.thumbs) // columns)
        sheet = np.full((rows * (height + gap) + gap, columns * (width + gap) + gap, 3), 40, np.uint8)
        for number, (_, thumb) in enumerate(self.thumbs):
            top = gap + (number // columns) * (height + gap)
            left = gap + (number % columns) * (width + gap)
            sheet[top:top + thumb.shape[0], left:left + thumb.shape[1]] = thumb
        return sheet


# ==== latency statistics ==========================================================================

def percentile(values: list[float], q: float) -> float:
    """The value at quantile ``q`` (0..1) of ``values`` (nearest rank; NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_histogram(path: str, series: dict[str, list[float]], title: str) -> bool:
    """Histograms of latency series (microseconds) with their p50 and p99, as a PNG by matplotlib;
    False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), layout="constrained")
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    values = [v for vs in series.values() for v in vs if v > 0]
    if values:
        low, high = max(min(values), 1.0), max(values)
        bins = np.geomspace(low, max(high, low * 1.01), 60)
        for (name, data), colour in zip(series.items(), colours):
            if not data:
                continue
            p50, p99 = percentile(data, 0.5), percentile(data, 0.99)
            axes.hist(data, bins=bins, alpha=0.55, color=colour,
                      label=f"{name}: p50 {p50:.0f} us, p99 {p99:.0f} us ({len(data)} frames)")
            axes.axvline(p50, color=colour, linestyle="--", linewidth=1)
            axes.axvline(p99, color=colour, linestyle=":", linewidth=1)
        axes.set_xscale("log")
    axes.set_xlabel("latency (us, log scale)")
    axes.set_ylabel("frames")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
