"""Small deterministic test clips whose frames carry their own index.

Every frame gets a band of black/white blocks at its top-left that encodes the frame's
index; the rest of the frame is FFmpeg's ``testsrc2`` pattern. The band survives lossy
coding and is read back from the luma plane alone by :func:`frame_index_from_luma`, which
needs only numpy, so a GPU test can check that frame N it received is frame N of the clip
(nothing dropped, repeated or reordered); the manifest's digests check every byte.

Band layout (luma plane, rows 0..63, columns 0..319, so clips need 320x64 or more):

- 10 columns of 32x32 blocks. Column ``c`` < 9 holds data bit ``c`` (LSB first) of the
  index, column 9 an even-parity bit over the 9 data bits; indices go up to 511.
- Row A (y 0..31) shows the bit (white 235 = 1, black 16 = 0); row B (y 32..63) shows its
  complement. A bit is read as ``mean(A) > mean(B)`` over the block's inner 20x20 pixels and
  must differ by at least :data:`MIN_CONTRAST`, so no threshold depends on the encoder.
- Chroma under the band is neutral (128).

Blocks are 32-aligned, hence whole 16x16 macroblocks / coding units and whole 8x8 chroma
blocks: the coded band is flat and deblocking only touches block edges, not the sampled
interiors.

The manifest (``clips.json`` beside this file) records, for every committed clip, the
SHA-256 of each decoded frame's Y plane and of its interleaved NV12 UV plane, both tightly
packed (pitch = width), computed from the CPU decoder's output. H.264 and HEVC decoding is
bit-exact, so NVDEC output (PyNvVideoCodec gives tightly packed NV12) should hash the same.

Regenerate (needs an ffmpeg with libx264/libx265; ``pip install imageio-ffmpeg`` ships one):

    python tests/data/make_clips.py                 # committed clips + clips.json, verified
    python tests/data/make_clips.py --verify-only   # re-decode committed clips, check manifest
    python tests/data/make_clips.py --bench         # 1920x1080 60 fps 2 s and 3840x2160 60 fps 1 s
                                                    # H.264 benchmark clips in tests/data/generated/
                                                    # (git-ignored; bench/video.py decodes them)

The ffmpeg used is $FFMPEG, else imageio-ffmpeg's, else ``ffmpeg`` on PATH.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
MANIFEST = HERE / "clips.json"
GENERATED = HERE / "generated"

# --- the band: one definition shared by the writer and the reader -----------------------

BLOCK = 32  # block edge in luma pixels
DATA_BITS = 9
COLUMNS = DATA_BITS + 1  # + parity
BAND_WIDTH = COLUMNS * BLOCK  # 320
BAND_HEIGHT = 2 * BLOCK  # 64
MAX_INDEX = (1 << DATA_BITS) - 1  # 511
WHITE = 235  # limited-range luma
BLACK = 16
NEUTRAL_CHROMA = 128
MARGIN = 6  # pixels left out at each block edge when sampling
MIN_CONTRAST = 100  # |mean(A) - mean(B)| needed for a bit; nominal 219


def _bits_with_parity(index: int) -> list[int]:
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"frame index {index} outside 0..{MAX_INDEX}")
    bits = [(index >> c) & 1 for c in range(DATA_BITS)]
    bits.append(sum(bits) & 1)  # even parity over all 10 columns
    return bits


def stamp_index(y: np.ndarray, u: np.ndarray, v: np.ndarray, index: int) -> None:
    """Draw the band for ``index`` into planar 4:2:0 planes (in place)."""
    h, w = y.shape
    if w < BAND_WIDTH or h < BAND_HEIGHT:
        raise ValueError(f"frame {w}x{h} is smaller than the {BAND_WIDTH}x{BAND_HEIGHT} band")
    for c, bit in enumerate(_bits_with_parity(index)):
        x0 = c * BLOCK
        y[0:BLOCK, x0:x0 + BLOCK] = WHITE if bit else BLACK
        y[BLOCK:2 * BLOCK, x0:x0 + BLOCK] = BLACK if bit else WHITE
    u[0:BAND_HEIGHT // 2, 0:BAND_WIDTH // 2] = NEUTRAL_CHROMA
    v[0:BAND_HEIGHT // 2, 0:BAND_WIDTH // 2] = NEUTRAL_CHROMA


def frame_index_from_luma(y_plane: np.ndarray) -> int:
    """The frame index encoded in a frame's luma plane.

    ``y_plane``: the luma plane as a 2-D uint8 array (H, W), any strides (a pitched view
    is fine); an (H, W, 1) view is accepted too. A whole NV12 frame as one (H*3/2, W) array
    also works, since the band lies in its first rows. Only rows 0..63 and columns 0..319
    are read.

    Raises ValueError when the band is unreadable (a block pair without clear contrast, or
    a parity mismatch): that frame is not one of these clips' frames, or it is corrupt.
    """
    a = np.asarray(y_plane)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim != 2:
        raise ValueError(f"expected a 2-D luma plane, got shape {a.shape}")
    if a.shape[0] < BAND_HEIGHT or a.shape[1] < BAND_WIDTH:
        raise ValueError(f"plane {a.shape} is smaller than the {BAND_HEIGHT}x{BAND_WIDTH} band")
    band = a[:BAND_HEIGHT, :BAND_WIDTH].astype(np.int32)
    inner = slice(MARGIN, BLOCK - MARGIN)
    bits = []
    for c in range(COLUMNS):
        x0 = c * BLOCK
        top = band[0:BLOCK, x0:x0 + BLOCK][inner, inner].mean()
        bottom = band[BLOCK:2 * BLOCK, x0:x0 + BLOCK][inner, inner].mean()
        diff = top - bottom
        if abs(diff) < MIN_CONTRAST:
            raise ValueError(f"band column {c} unreadable: block means {top:.1f} / {bottom:.1f}")
        bits.append(1 if diff > 0 else 0)
    if sum(bits) & 1:
        raise ValueError(f"band parity mismatch: bits {bits}")
    return sum(bit << c for c, bit in enumerate(bits[:DATA_BITS]))


def nv12_digests(y: np.ndarray, uv: np.ndarray) -> tuple[str, str]:
    """SHA-256 of a tightly packed Y plane (H, W) and NV12 UV plane (H/2, W)."""
    return (hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest(),
            hashlib.sha256(np.ascontiguousarray(uv).tobytes()).hexdigest())


# --- clips ---------------------------------------------------------------------------------

CLIPS = {
    # name: settings. All 8-bit 4:2:0, no B-frames, short GOP, no scene-cut keyframes.
    "index_320x240_h264.mp4": dict(codec="h264", width=320, height=240, fps=30, frames=30, gop=10, crf=20),
    "index_320x240_hevc.mp4": dict(codec="hevc", width=320, height=240, fps=30, frames=30, gop=10, crf=22),
}
BENCH = {  # frames: fps * seconds (--bench-seconds overrides the seconds)
    "bench_1920x1080p60_h264.mp4": dict(codec="h264", width=1920, height=1080, fps=60, frames=120, gop=30, crf=20),
    # 1 s (about 6.5 MB): the GPU run carries these clips beside the wheels, within its 64 MiB.
    "bench_3840x2160p60_h264.mp4": dict(codec="h264", width=3840, height=2160, fps=60, frames=60, gop=30, crf=20),
}


def find_ffmpeg() -> str:
    exe = os.environ.get("FFMPEG")
    if exe:
        return exe
    try:
        import imageio_ffmpeg
        return imageio_ffmpeg.get_ffmpeg_exe()
    except ImportError:
        pass
    exe = shutil.which("ffmpeg")
    if not exe:
        sys.exit("no ffmpeg: set FFMPEG, or pip install imageio-ffmpeg (in a checkout: pip install -e '.[test-video]')")
    return exe


def has_encoder(ffmpeg: str, name: str) -> bool:
    out = subprocess.run([ffmpeg, "-hide_banner", "-encoders"], capture_output=True, text=True).stdout
    return any(line.split()[1:2] == [name] for line in out.splitlines() if line.strip())


def _encoder_args(s: dict) -> list[str]:
    g = str(s["gop"])
    if s["codec"] == "h264":
        return ["-c:v", "libx264", "-preset", "medium", "-profile:v", "high", "-crf", str(s["crf"]),
                "-g", g, "-keyint_min", g, "-bf", "0", "-x264-params", "scenecut=0:colorprim=bt709:transfer=bt709:colormatrix=bt709"]
    if s["codec"] == "hevc":
        return ["-c:v", "libx265", "-preset", "medium", "-profile:v", "main", "-crf", str(s["crf"]), "-tag:v", "hvc1",
                "-x265-params", f"keyint={g}:min-keyint={g}:bframes=0:scenecut=0:colorprim=bt709:transfer=bt709:colormatrix=bt709:log-level=error:pools=1:frame-threads=1"]
    raise ValueError(s["codec"])


def make_clip(ffmpeg: str, path: pathlib.Path, s: dict) -> None:
    w, h, fps, n = s["width"], s["height"], s["fps"], s["frames"]
    if w % 2 or h % 2:
        raise ValueError("4:2:0 needs even sizes")
    if n - 1 > MAX_INDEX:
        raise ValueError(f"{n} frames: indices above {MAX_INDEX} do not fit the band")
    size = f"{w}x{h}"
    src = subprocess.Popen(
        [ffmpeg, "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i", f"testsrc2=size={size}:rate={fps}",
         "-frames:v", str(n), "-pix_fmt", "yuv420p", "-f", "rawvideo", "-"],
        stdout=subprocess.PIPE)
    enc = subprocess.Popen(
        [ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", size,
         "-r", str(fps), "-i", "-", *_encoder_args(s), "-pix_fmt", "yuv420p",
         "-color_range", "tv", "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709",
         "-an", "-map_metadata", "-1", "-fflags", "+bitexact", "-flags:v", "+bitexact",
         "-movflags", "+faststart", str(path)],
        stdin=subprocess.PIPE)
    frame_bytes = w * h * 3 // 2
    try:
        for i in range(n):
            buf = src.stdout.read(frame_bytes)
            if len(buf) != frame_bytes:
                raise RuntimeError(f"testsrc2 gave {i} frames, wanted {n}")
            f = np.frombuffer(buf, np.uint8).copy()
            y = f[:w * h].reshape(h, w)
            u = f[w * h:w * h + w * h // 4].reshape(h // 2, w // 2)
            v = f[w * h + w * h // 4:].reshape(h // 2, w // 2)
            stamp_index(y, u, v, i)
            enc.stdin.write(f.tobytes())
    finally:
        enc.stdin.close()
        src.stdout.close()
        if src.wait() or enc.wait():
            raise RuntimeError(f"ffmpeg failed making {path.name} (source {src.returncode}, encoder {enc.returncode})")


def decode_nv12(ffmpeg: str, path: pathlib.Path, w: int, h: int):
    """Yield (Y, UV) of every frame of ``path``, decoded on the CPU by ffmpeg.

    ffmpeg gives planar yuv420p (the decoder's own output, no conversion); U and V are
    interleaved here, so UV is exactly NV12's chroma plane.
    """
    p = subprocess.Popen([ffmpeg, "-hide_banner", "-loglevel", "error", "-i", str(path), "-map", "0:v:0",
                          "-f", "rawvideo", "-pix_fmt", "yuv420p", "-"], stdout=subprocess.PIPE)
    frame_bytes = w * h * 3 // 2
    try:
        while True:
            buf = p.stdout.read(frame_bytes)
            if not buf:
                break
            if len(buf) != frame_bytes:
                raise RuntimeError(f"{path.name}: short frame ({len(buf)} bytes)")
            f = np.frombuffer(buf, np.uint8)
            y = f[:w * h].reshape(h, w)
            u = f[w * h:w * h + w * h // 4].reshape(h // 2, w // 2)
            v = f[w * h + w * h // 4:].reshape(h // 2, w // 2)
            uv = np.empty((h // 2, w), np.uint8)
            uv[:, 0::2] = u
            uv[:, 1::2] = v
            yield y, uv
    finally:
        p.stdout.close()
        if p.wait():
            raise RuntimeError(f"ffmpeg failed decoding {path.name}")


def verify(ffmpeg: str, path: pathlib.Path, s: dict) -> dict:
    """Decode every frame, check its index, return the manifest entry."""
    ys, uvs = [], []
    for i, (y, uv) in enumerate(decode_nv12(ffmpeg, path, s["width"], s["height"])):
        got = frame_index_from_luma(y)
        if got != i:
            raise RuntimeError(f"{path.name}: frame {i} reads as index {got}")
        dy, duv = nv12_digests(y, uv)
        ys.append(dy)
        uvs.append(duv)
    if len(ys) != s["frames"]:
        raise RuntimeError(f"{path.name}: decoded {len(ys)} frames, expected {s['frames']}")
    return dict(s, bytes=path.stat().st_size, y_sha256=ys, uv_sha256=uvs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verify-only", action="store_true", help="re-decode the committed clips and check clips.json")
    ap.add_argument("--bench", action="store_true", help="make the benchmark clip(s) in tests/data/generated/")
    ap.add_argument("--out", type=pathlib.Path, help="folder for --bench output (default tests/data/generated)")
    ap.add_argument("--bench-seconds", type=int, default=None,
                    help="length of the benchmark clips (default: 2 s at 1080p, 1 s at 4K)")
    args = ap.parse_args()
    ffmpeg = find_ffmpeg()

    if args.verify_only:
        manifest = json.loads(MANIFEST.read_text())
        for name, entry in manifest.items():
            fresh = verify(ffmpeg, HERE / name, entry)
            ok = fresh["y_sha256"] == entry["y_sha256"] and fresh["uv_sha256"] == entry["uv_sha256"]
            print(f"{name}: {entry['frames']} frames, indices ok, digests {'match' if ok else 'DIFFER'}")
            if not ok:
                return 1
        return 0

    if args.bench:
        out = args.out or GENERATED
        out.mkdir(parents=True, exist_ok=True)
        for name, s in BENCH.items():
            if args.bench_seconds is not None:
                s = dict(s, frames=s["fps"] * args.bench_seconds)
                name = name.replace(".mp4", f"_{args.bench_seconds}s.mp4")
            path = out / name
            make_clip(ffmpeg, path, s)
            entry = verify(ffmpeg, path, s)
            (out / (name + ".json")).write_text(json.dumps({name: entry}, indent=1) + "\n")
            print(f"{path}: {entry['bytes']} bytes, {s['frames']} frames, every index read back")
        return 0

    manifest = {}
    for name, s in CLIPS.items():
        encoder = {"h264": "libx264", "hevc": "libx265"}[s["codec"]]
        if not has_encoder(ffmpeg, encoder):
            print(f"{name}: skipped, this ffmpeg has no {encoder}")
            continue
        path = HERE / name
        make_clip(ffmpeg, path, s)
        manifest[name] = verify(ffmpeg, path, s)
        print(f"{name}: {manifest[name]['bytes']} bytes, {s['frames']} frames, every index read back")
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
