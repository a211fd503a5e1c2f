"""What the ordering contract costs per frame (docs/ordering.md): one process, a FIFO EGLStream
cycling a ring of frames (present, acquire, release, return), with each acquired frame

- ``no view``: handed to nobody (the release waits for the consumer's own stream only);
- ``dlpack, idle``: handed through DLPack to a side stream that has nothing queued (the release
  asks that stream once: one ``cuStreamQuery``);
- ``dlpack, busy``: handed to a side stream that then runs a short kernel (the release joins it:
  an event recorded there and waited on by the consumer's stream);
- ``named at release``: the same busy side stream, with the release done by a consumer whose
  own stream is that side stream (what a user who names the stream gets).

The cases are interleaved round by round; the table gives the median microseconds per frame and
the ratio to ``no view``.

    python bench/ordering.py [--frames N] [--rounds R] [--width W --height H]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import CUPY, at_least, lazy, require, run  # noqa: E402

PROGRAM = "bench/ordering.py"
cp = lazy("cupy")

_TOUCH = r'''
extern "C" __global__ void touch(const unsigned char *frame, unsigned int *sink) {
    if (frame[threadIdx.x] == 0xFFu && threadIdx.x == 1024) { sink[0] = 1; }
}'''


def cycle(display, width: int, height: int, frames: int, case: str, side, touch, sink) -> float:
    """Microseconds per frame of one case."""
    stream = display.create_stream(fifo_length=1)
    try:
        consumer_stream = side.ptr if case == "named at release" else None
        consumer = stream.connect_cuda_consumer(cuda_stream=consumer_stream)
        producer = stream.connect_cuda_producer(width, height)
        ring = [producer.allocate_frame() for _ in range(3)]
        started = time.perf_counter()
        for index in range(frames):
            frame = ring.pop() if ring else producer.return_frame(timeout_us=1_000_000)
            producer.present(frame)
            acquired = consumer.acquire()
            if case != "no view":
                plane = acquired.planes[0]
                if case != "named at release":
                    plane.__dlpack__(stream=side.ptr)  # what torch/CuPy do when they take the view
                if case != "dlpack, idle":
                    with side:
                        touch((1,), (32,), (cp.uint64(plane.pointer), sink))
            acquired.release()
        return (time.perf_counter() - started) / frames * 1e6
    finally:
        stream.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=at_least(1), default=3000)
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--width", type=at_least(2), default=1920)
    parser.add_argument("--height", type=at_least(2), default=1080)
    args = parser.parse_args()
    if args.frames < 10 or args.rounds < 1:
        parser.error("--frames is at least 10 and --rounds at least 1")
    require(PROGRAM, "cuda-stream", modules=[CUPY])
    import eglcuda

    cases = ["no view", "dlpack, idle", "dlpack, busy", "named at release"]
    with eglcuda.Display.for_cuda_device(0) as display:
        side = cp.cuda.Stream(non_blocking=True)
        touch = cp.RawKernel(_TOUCH, "touch")
        sink = cp.zeros(1, cp.uint32)
        for case in cases:  # warm-up: kernels compiled, streams made
            cycle(display, args.width, args.height, 20, case, side, touch, sink)
        times: dict[str, list[float]] = {case: [] for case in cases}
        for round_index in range(args.rounds):
            for case in cases[round_index % len(cases):] + cases[:round_index % len(cases)]:
                times[case].append(cycle(display, args.width, args.height, args.frames, case, side, touch, sink))
    base = statistics.median(times["no view"])
    print(f"{args.width}x{args.height} ARGB, FIFO 1, ring of 3, {args.frames} frames x {args.rounds} rounds "
          f"(median us/frame; ratio to 'no view')")
    print(f"{'case':<18} {'us/frame':>9} {'ratio':>6}")
    for case in cases:
        median = statistics.median(times[case])
        print(f"{case:<18} {median:9.2f} {median / base:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
