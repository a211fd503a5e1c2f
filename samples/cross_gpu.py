"""CUDA -> CUDA between two GPUs, in two processes: the consumer process creates the stream on its
GPU's EGL display and serves it; the producer process opens it on the other GPU's display. Every
byte of every frame is checked (the producer's kernel fills each frame from its number, the
consumer's kernel checks it), in both directions; frames/s and present-to-acquire latency are
printed for each. (In one process the same works: make the stream on the consumer's display with
``cross_process=True`` and connect the producer with ``device=`` its GPU.)

    python samples/cross_gpu.py [--width 1920 --height 1080 --frames 600 --format NV12]

Needs two NVIDIA GPUs with EGL streams, and CuPy for the kernels (``pip install -e '.[samples-cuda13]'`` or
``samples-cuda12``, see samples/_sample.py).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, at_least, frame_size, names, require, run  # noqa: E402

PROGRAM = "samples/cross_gpu.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--fifo", type=int, default=4)
    parser.add_argument("--format", default="NV12", help="a ColorFormat name")
    parser.add_argument("--mps", action="store_true", help="run the processes under CUDA MPS (see cross_process.py)")
    args = parser.parse_args()
    at_least(parser, args, {**FRAME, "--frames": 1, "--fifo": 0})
    frame_size(parser, args, names(parser, "--format", args.format, "ColorFormat"))
    require(PROGRAM, "two-gpus", "cross-process", modules=[CUPY])
    import cross_process

    failed = 0
    for producer, consumer in ((1, 0), (0, 1)):
        failed += cross_process.main(["--width", str(args.width), "--height", str(args.height), "--frames",
                                      str(args.frames), "--fifo", str(args.fifo), "--format", args.format,
                                      "--producer-device", str(producer), "--consumer-device", str(consumer),
                                      *(["--mps"] if args.mps else [])]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
