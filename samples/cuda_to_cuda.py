"""CUDA -> CUDA over an EGLStream: the flow of section 4.1 of NVIDIA's EGL interop guide.

A producer thread fills each frame with a kernel (content derived from the frame's number, so
every frame differs), presents it, and takes frames back to reuse them; a consumer thread acquires
each frame, a kernel checks every byte on the consumer's CUDA stream, and releases it. Runs for
pitch-linear and CUDA-array layouts and for ARGB and a YUV format. Prints PASS/FAIL, frames/s
and present-to-acquire latency.

    python samples/cuda_to_cuda.py [--width 1920 --height 1080 --frames 300 --fifo 4]

Needs an NVIDIA GPU with EGL streams, and CuPy: ``pip install -e '.[samples-cuda13]'`` (or
``samples-cuda12``, see samples/_sample.py). Kernels are CuPy RawKernels: CuPy compiles them with
NVRTC in three lines and takes our planes zero-copy through ``__cuda_array_interface__``, which
the sample thereby exercises. CuPy is needed by the samples only, not by eglcuda.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, at_least, cupy_stream, frame_size, lazy, mps_session, names, run  # noqa: E402

PROGRAM = "samples/cuda_to_cuda.py"
# Imported at first use, once require() has checked they are there (and so --help always works).
cp = lazy("cupy")
np = lazy("numpy")
eglcuda = lazy("eglcuda")

KERNELS = r"""
__device__ unsigned char expected_byte(unsigned int x, unsigned int y, unsigned int plane, unsigned int seed) {
    unsigned int h = x * 2654435761u ^ (y + 0x9E3779B9u) * 40503u ^ (plane + 1) * 2246822519u ^ seed * 3266489917u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    return (unsigned char)h;
}
extern "C" __global__ void fill(unsigned char *data, unsigned long long pitch, unsigned int row_bytes,
                                unsigned int rows, unsigned int plane, unsigned int seed) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < rows) data[y * pitch + x] = expected_byte(x, y, plane, seed);
}
extern "C" __global__ void check(const unsigned char *data, unsigned long long pitch, unsigned int row_bytes,
                                 unsigned int rows, unsigned int plane, unsigned int seed, unsigned long long *bad) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < rows && data[y * pitch + x] != expected_byte(x, y, plane, seed)) atomicAdd(bad, 1ull);
}
"""


def seed_of(number: int) -> int:
    return (number * 0x9E3779B1) & 0xFFFFFFFF


class Kernels:
    def __init__(self) -> None:
        module = cp.RawModule(code=KERNELS)
        self.fill = module.get_function("fill")
        self.check = module.get_function("check")

    @staticmethod
    def grid(row_bytes: int, rows: int) -> tuple[tuple[int, int], tuple[int]]:
        return ((row_bytes + 255) // 256, rows), (256,)


def run_config(display, width, height, fmt, layout, frames, fifo, verbose=True) -> dict:
    kernels = Kernels()
    stream = display.create_stream(fifo_length=fifo)
    consumer = stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(width, height, format=fmt, layout=layout)
    pool = [producer.allocate_frame() for _ in range(max(fifo, 1) + 2)]
    geometry = [plane.geometry for plane in pool[0].planes]
    # Array planes are not linear memory: kernels work on a pitch-linear scratch plane and a
    # stream-ordered copy moves it in (producer) or out (consumer).
    scratch_p = [cp.empty((g.height, g.row_bytes), cp.uint8) for g in geometry] if layout is eglcuda.Layout.ARRAY else None
    scratch_c = [cp.empty((g.height, g.row_bytes), cp.uint8) for g in geometry] if layout is eglcuda.Layout.ARRAY else None
    produce_stream = cp.cuda.Stream(non_blocking=True)
    present_times: dict[int, float] = {}
    latencies: list[float] = []
    errors: list[BaseException] = []
    checked = 0
    bad_total = 0
    done = threading.Event()

    def produce() -> None:
        try:
            free = list(pool)
            with produce_stream:
                for index in range(frames):
                    while not free:
                        back = producer.return_frame(timeout_us=200_000)
                        if back is not None:
                            free.append(back)
                        elif done.is_set():
                            return
                    frame = free.pop()
                    number = producer.frames_presented + 1  # the stream numbers frames from 1
                    seed = seed_of(number)
                    for i, plane in enumerate(frame.planes):
                        g = plane.geometry
                        grid, block = kernels.grid(g.row_bytes, g.height)
                        if scratch_p is None:
                            kernels.fill(grid, block, (cp.uint64(plane.pointer), cp.uint64(g.pitch), np.uint32(g.row_bytes),
                                                       np.uint32(g.height), np.uint32(i), np.uint32(seed)))
                        else:
                            target = scratch_p[i]
                            kernels.fill(grid, block, (target, cp.uint64(g.row_bytes), np.uint32(g.row_bytes),
                                                       np.uint32(g.height), np.uint32(i), np.uint32(seed)))
                            plane.copy_from_device(target.data.ptr, g.row_bytes, produce_stream)
                    present_times[number] = time.perf_counter()
                    producer.present(frame, cuda_stream=produce_stream)
                    if scratch_p is not None:
                        produce_stream.synchronize()  # the scratch planes are reused next frame
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def consume() -> None:
        nonlocal checked, bad_total
        bad = cp.zeros(1, cp.uint64)
        try:
            consumer_stream = cupy_stream(cp, consumer.cuda_stream)
            last = 0
            while last < frames and not errors:
                try:
                    acquired = consumer.acquire(timeout_us=2_000_000)
                except eglcuda.Timeout:
                    continue
                with acquired:
                    if not acquired.is_new:
                        continue
                    latencies.append(time.perf_counter() - present_times.get(acquired.number, float("nan")))
                    last = acquired.number
                    seed = seed_of(acquired.number)
                    with consumer_stream:
                        for i, plane in enumerate(acquired.planes):
                            g = plane.geometry
                            grid, block = kernels.grid(g.row_bytes, g.height)
                            if scratch_c is None:
                                data, pitch = cp.uint64(plane.pointer), cp.uint64(g.pitch)
                            else:
                                plane.copy_to_device(scratch_c[i].data.ptr, g.row_bytes)
                                data, pitch = scratch_c[i], cp.uint64(g.row_bytes)
                            kernels.check(grid, block, (data, pitch, np.uint32(g.row_bytes), np.uint32(g.height),
                                                        np.uint32(i), np.uint32(seed), bad))
                    checked += 1
            consumer_stream.synchronize()
            bad_total = int(bad.get()[0])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    started = time.perf_counter()
    threads = [threading.Thread(target=produce, name="producer"), threading.Thread(target=consume, name="consumer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    elapsed = time.perf_counter() - started
    stream.close()
    ok = not errors and bad_total == 0 and checked > 0 and (fifo == 0 or checked == frames)
    lat = sorted(l for l in latencies if l == l)
    result = {
        "config": f"{width}x{height} {fmt.name} {layout.value} {'FIFO ' + str(fifo) if fifo else 'mailbox'}",
        "ok": ok, "checked": checked, "bad_bytes": bad_total, "fps": frames / elapsed,
        "latency_ms_median": 1e3 * statistics.median(lat) if lat else float("nan"),
        "latency_ms_p99": 1e3 * lat[int(0.99 * (len(lat) - 1))] if lat else float("nan"),
        "errors": [repr(e) for e in errors],
    }
    if verbose:
        print(f"{'PASS' if ok else 'FAIL'}  {result['config']:<36} frames checked {checked:5d}  bad bytes {bad_total}  "
              f"{result['fps']:8.1f} frames/s  latency median {result['latency_ms_median']:.3f} ms "
              f"p99 {result['latency_ms_p99']:.3f} ms" + (f"  errors: {result['errors']}" if errors else ""))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--fifo", type=int, default=4, help="FIFO length; 0 = mailbox (frames may be skipped)")
    parser.add_argument("--formats", default="ARGB,NV12", help="comma-separated ColorFormat names")
    parser.add_argument("--layouts", default="pitch,array")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument("--mps", action="store_true",
                        help="run under CUDA MPS: a private daemon for this run (or the one already running)")
    args = parser.parse_args(argv)
    at_least(parser, args, {**FRAME, "--frames": 1, "--fifo": 0, "--device": 0})
    frame_size(parser, args, names(parser, "--formats", args.formats, "ColorFormat"))
    names(parser, "--layouts", args.layouts, "Layout")
    with mps_session(PROGRAM, args.mps, "cuda-stream", modules=[CUPY]):
        return sample(args)


def sample(args: argparse.Namespace) -> int:
    results = []
    with eglcuda.Display.for_cuda_device(args.device) as display:
        for fmt in args.formats.split(","):
            for layout in args.layouts.split(","):
                results.append(run_config(display, args.width, args.height,
                                          eglcuda.ColorFormat[fmt.strip().upper()],
                                          eglcuda.Layout(layout.strip()), args.frames, args.fifo))
    ok = all(r["ok"] for r in results)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
