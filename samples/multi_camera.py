"""Eight cameras, one batching inference process (eglcuda.Batcher over eight topics).

- eight camera processes each publish NV12 frames at a camera's rate on a topic of their own;
  every byte of a frame is pseudo-random, from (camera, frame number), written on the GPU;
- this process subscribes to all eight (qos every: nothing may be lost), forms batches of up to
  eight frames with eglcuda.Batcher (one [B, H, W] buffer for Y, one [B, H/2, W/2, 2] for UV),
  runs a stand-in for a model on each batch through CuPy (DLPack, no copy), and checks every byte
  of every image of every batch against what its camera wrote, on the GPU.

Prints the batches, their sizes and the formation time, then PASS when every frame of every
camera arrived once, in order, with every byte right; FAIL (status 1) otherwise; status 2 and one
line where there is no discrete NVIDIA GPU (CUDA IPC) or no CuPy (``pip install -e
'.[samples-cuda13]'`` in the checkout, or ``samples-cuda12``).

    python samples/multi_camera.py [--cameras 8] [--fps 30] [--seconds 5] [--width 1280 --height 720]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, at_least, frame_size, lazy, require, run  # noqa: E402

PROGRAM = "samples/multi_camera.py"
cp = lazy("cupy")
eglcuda = lazy("eglcuda")

# One pseudo-random byte per element from a 64-bit seed and the element's index (splitmix64's
# finalizer): the cameras write it, the checker computes it again.
PATTERN = r"""
unsigned long long x = seeds[i / image_size] + (unsigned long long)(i % image_size) * 0x9E3779B97F4A7C15ull;
x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
out = (unsigned char)(x ^ (x >> 31));
"""
_kernel = None


def pattern(seeds, out) -> None:
    """Fill ``out`` (``len(seeds)`` images, each ``out.size // len(seeds)`` bytes) with the
    pattern of each image's seed."""
    global _kernel
    if _kernel is None:
        _kernel = cp.ElementwiseKernel("raw uint64 seeds, int64 image_size", "uint8 out", PATTERN, "camera_pattern")
    _kernel(seeds, out.size // len(seeds), out)


def seed_of(camera: int, seq: int, plane: int) -> int:
    return ((camera + 1) * 1_000_003 + seq) * 4 + plane


def camera(args) -> int:
    """A camera process: publish ``frames`` frames at ``fps`` once told to start."""
    frames = int(args.fps * args.seconds)
    with eglcuda.Publisher(f"camera{args.index}", args.width, args.height, "NV12", fps=args.fps, path=args.path,
                           every_timeout=10.0) as pub:
        print(json.dumps({"event": "ready"}), flush=True)
        sys.stdin.readline()  # "go": the batching process has subscribed
        started = time.monotonic()
        for seq in range(frames):
            frame = pub.next_frame(timeout=30)
            for index, plane in enumerate(frame.planes):
                # Written through __cuda_array_interface__ on CuPy's current stream, which the
                # publish waits for (docs/ordering.md).
                view = cp.asarray(plane)
                pattern(cp.asarray([seed_of(args.index, seq, index)], cp.uint64), view)
            pub.publish(frame, payload=b"%d" % seq)
            delay = started + (seq + 1) / args.fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        pub.close(timeout=10)
    print(json.dumps({"event": "done", "frames": frames}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=8)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--batch", type=int, default=0, help="batch size (0: one per camera)")
    parser.add_argument("--role", choices=["camera"], help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least(parser, args, {**FRAME, "--cameras": 1, "--batch": 0})
    frame_size(parser, args, ["NV12"])
    if not (0 < args.fps < math.inf and 0 < args.seconds < math.inf):
        parser.error("--fps and --seconds are finite numbers more than 0")
    require(PROGRAM, "cuda-ipc", modules=[CUPY])
    if args.role == "camera":
        return camera(args)
    return batch_and_check(args)


def batch_and_check(args) -> int:
    expected_frames = int(args.fps * args.seconds)
    with tempfile.TemporaryDirectory(prefix="eglcuda-cameras-") as folder:
        os.chmod(folder, 0o700)
        paths = [os.path.join(folder, f"camera{i}.topic") for i in range(args.cameras)]
        cameras = [subprocess.Popen([sys.executable, __file__, "--role", "camera", "--index", str(i), "--path", path,
                                     "--fps", str(args.fps), "--seconds", str(args.seconds),
                                     "--width", str(args.width), "--height", str(args.height)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for i, path in enumerate(paths)]
        subs = []
        try:
            for i, child in enumerate(cameras):
                if not child.stdout.readline():
                    print(f"multi_camera: camera {i} did not start")
                    return 1
            subs = [eglcuda.Subscriber(f"camera{i}", qos="every", queue=4, path=path, timeout=30)
                    for i, path in enumerate(paths)]
            for child in cameras:
                child.stdin.write("go\n")
                child.stdin.flush()
            result = consume(subs, args, expected_frames)
        finally:
            for sub in subs:
                sub.close()
            for child in cameras:
                if child.poll() is None:
                    try:
                        child.wait(30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait(10)
    return result


def consume(subs, args, expected_frames: int) -> int:
    """Batches until every camera closed its topic: the model's stand-in, then every byte."""
    batch_size = args.batch or len(subs)
    seqs: list[list[int]] = [[] for _ in subs]
    bad_images = batches = 0
    sizes, formation_ms = [], []
    stream = cp.cuda.Stream(non_blocking=True)
    started = time.monotonic()
    # Formation timeout: half a frame interval, so a late camera does not hold back the others.
    with eglcuda.Batcher(subs, batch_size, formation_timeout=0.5 / args.fps, timeout=30) as batcher:
        for batch in batcher:  # each step releases the previous batch
            formation_ms.append((time.monotonic_ns() - batch.frames[0].received_ns) / 1e6)
            with stream:
                y, uv = (cp.from_dlpack(plane) for plane in batch.planes)  # [B, H, W], [B, H/2, W/2, 2]
                brightness = y.astype(cp.float32).mean(axis=(1, 2))  # the "model": one number per image
                for plane, view in enumerate((y, uv)):
                    seeds = cp.asarray([seed_of(f.source, f.seq, plane) for f in batch.frames], cp.uint64)
                    want = cp.empty_like(view)
                    pattern(seeds, want)
                    wrong = (view != want).reshape(batch.size, -1).any(axis=1)
                    bad_images += int(wrong.sum())
                brightness.get()
            for f in batch.frames:
                seqs[f.source].append(f.seq)
                bad_images += f.payload != b"%d" % f.seq
            sizes.append(batch.size)
            batches += 1
    elapsed = time.monotonic() - started
    frames = sum(sizes)
    formation_ms.sort()
    print(f"{len(subs)} cameras x {expected_frames} frames of {args.width}x{args.height} NV12 at {args.fps:g} "
          f"frames/s: {batches} batches of {frames / max(batches, 1):.1f} frames on average "
          f"(up to {batch_size}), {frames / elapsed:.0f} frames/s, formation p50 "
          f"{formation_ms[len(formation_ms) // 2] if formation_ms else 0:.1f} ms")
    failed = bad_images > 0
    for camera_index, got in enumerate(seqs):
        if got != list(range(expected_frames)):
            failed = True
            print(f"  camera {camera_index}: FAIL: {len(got)} frames, not 0..{expected_frames - 1} in order")
    print(f"  {bad_images} images with a wrong byte or payload")
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
