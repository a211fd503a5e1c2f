"""Which memory should frames live in? A convolution over frames of each memory kind, against a Jetson TX1.

A float32 2D convolution (one thread per output pixel, the K x K window read straight from the
input, clamped at the borders like SciPy's mode 'nearest') over a 640x480 image, for kernels
3x3 to 45x45, with input and output frames allocated by eglcuda in each memory kind:

- device:  Frame.allocate(..., memory="device")
- pinned:  memory="pinned" (mapped page-locked host memory, "zero-copy")
- managed: memory="managed" (unified memory), timed twice: steady (the GPU was the last to touch
  it) and right after the CPU rewrote the input through its host view (the "touched by the CPU"
  case, which makes the driver move or flush pages back).

Every output is checked against scipy.ndimage.convolve(mode="nearest"). Kernel time by CUDA
events, median of the repeats after one warm-up run; GFLOP/s counts 2 K^2 per pixel. Also the
CPU's time to read and to write the whole image for each kind (device memory: a copy each way,
the CPU's only path to it). Figures measured on a Jetson TX1 with NPP's nppiFilterBorder_32f_C1R
are printed next to this machine's.

    python bench/memory_kinds.py [--quick] [--markdown FILE] [--plot FILE.svg]

Needs an NVIDIA GPU and ``pip install -e '.[bench]'``: CuPy compiles the kernel and launches it,
SciPy checks the results, matplotlib draws the plot.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import CUPY, MATPLOTLIB, SCIPY, lazy, output_file, plot_bars, require, run  # noqa: E402

PROGRAM = "bench/memory_kinds.py"
# Imported at first use, once require() has checked they are there (and so --help always works).
cp = lazy("cupy")
np = lazy("numpy")
ndimage = lazy("scipy.ndimage")
eglcuda = lazy("eglcuda")

WIDTH, HEIGHT = 640, 480
SIZES = [3, 5, 9, 15, 25, 35, 45]
KINDS = ["device", "pinned", "managed"]
# A Jetson TX1 with NPP's nppiFilterBorder_32f_C1R: device memory per kernel size, ms.
TX1_DEVICE_MS = {3: 0.63, 5: 0.42, 9: 1.29, 15: 2.77, 25: 6.53, 35: 13.08, 45: 21.85}
TX1_ZERO_COPY_45_MS = 3968.8
TX1_MANAGED_45_MS = 22.2  # after the first call, GPU-only use
TX1_MANAGED_TOUCHED_45_MS = (93.9, 279.5)  # when the CPU touched the memory before each call

KERNEL = r"""
extern "C" __global__ void convolve(const float *in, float *out, const float *w, int width, int height,
                                    int in_pitch, int out_pitch, int k) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    int c = k / 2;
    float acc = 0.f;
    for (int i = 0; i < k; ++i) {
        int yy = min(max(y + c - i, 0), height - 1);  /* convolution flips the window, as SciPy does */
        const float *row = (const float *)((const char *)in + (size_t)yy * in_pitch);
        for (int j = 0; j < k; ++j) {
            int xx = min(max(x + c - j, 0), width - 1);
            acc += w[i * k + j] * row[xx];
        }
    }
    ((float *)((char *)out + (size_t)y * out_pitch))[x] = acc;
}
"""


def float_frame(kind: str) -> "eglcuda.Frame":
    """A 640x480 float32 image as a one-channel 8-bit frame 4 x 640 bytes wide."""
    return eglcuda.Frame.allocate(WIDTH * 4, HEIGHT, eglcuda.ColorFormat.Y, memory=kind)


def gpu_view(frame: eglcuda.Frame) -> cp.ndarray:
    return cp.asarray(frame.planes[0]).view(cp.float32)


def upload(frame: eglcuda.Frame, image: np.ndarray) -> None:
    if frame.memory is eglcuda.MemoryKind.DEVICE:
        frame.planes[0].copy_from(image.view(np.uint8))
    else:
        frame.host_array()[...] = image.view(np.uint8)


def download(frame: eglcuda.Frame) -> np.ndarray:
    return frame.planes[0].to_numpy().view(np.float32)


class Convolution:
    def __init__(self) -> None:
        self.function = cp.RawModule(code=KERNEL).get_function("convolve")
        self.start, self.stop = cp.cuda.Event(), cp.cuda.Event()

    def run(self, source: eglcuda.Frame, target: eglcuda.Frame, weights: cp.ndarray, k: int) -> float:
        """One launch; returns its GPU time in ms."""
        block = (32, 8)
        grid = ((WIDTH + block[0] - 1) // block[0], (HEIGHT + block[1] - 1) // block[1])
        args = (cp.uint64(source.planes[0].pointer), cp.uint64(target.planes[0].pointer), weights,
                np.int32(WIDTH), np.int32(HEIGHT), np.int32(source.pitch), np.int32(target.pitch), np.int32(k))
        self.start.record()
        self.function(grid, block, args)
        self.stop.record()
        self.stop.synchronize()
        return cp.cuda.get_elapsed_time(self.start, self.stop)


def cpu_access(kind: str, image: np.ndarray, repeats: int) -> tuple[float, float]:
    """Median ms for the CPU to read the whole image (a sum) and to write it."""
    frame = float_frame(kind)
    upload(frame, image)
    gpu_view(frame).sum()  # the GPU touched it last, as in a pipeline
    cp.cuda.Device().synchronize()
    reads, writes = [], []
    for _ in range(repeats):
        gpu_view(frame)[0, 0] = 0  # hand it back to the GPU before each round
        cp.cuda.Device().synchronize()
        started = time.perf_counter()
        if kind == "device":
            float(download(frame).sum(dtype=np.float64))
        else:
            float(frame.host_array().view(np.float32).sum(dtype=np.float64))
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        upload(frame, image)
        writes.append(time.perf_counter() - started)
    frame.close()
    return 1e3 * statistics.median(reads), 1e3 * statistics.median(writes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (the GPU check's setting)")
    parser.add_argument("--markdown", help="write the markdown tables to this file")
    parser.add_argument("--plot", "--svg", dest="plot", metavar="FILE",
                        help="write a bar chart of ms per kernel size and kind to this file (.svg, .png)")
    args = parser.parse_args()
    output_file(parser, "--markdown", args.markdown)
    output_file(parser, "--plot", args.plot)
    require(PROGRAM, "cuda", modules=[CUPY, SCIPY] + ([MATPLOTLIB] if args.plot else []))
    repeats = 3 if args.quick else 7
    rng = np.random.default_rng()
    image = rng.random((HEIGHT, WIDTH), dtype=np.float32)
    convolution = Convolution()
    frames = {kind: (float_frame(kind), float_frame(kind)) for kind in KINDS}
    for source, _ in frames.values():
        upload(source, image)
    results: dict[tuple[str, int], float] = {}
    bad = []
    for k in SIZES:
        weights_host = rng.random((k, k), dtype=np.float32)
        weights_host /= weights_host.sum()
        weights = cp.asarray(weights_host)
        expected = ndimage.convolve(image, weights_host, mode="nearest")
        for kind in KINDS:
            source, target = frames[kind]
            convolution.run(source, target, weights, k)  # warm-up (and, for managed, migration)
            times = [convolution.run(source, target, weights, k) for _ in range(repeats)]
            results[(kind, k)] = statistics.median(times)
            got = download(target)
            error = float(np.max(np.abs(got - expected)))
            if not error < 1e-4:
                bad.append(f"{kind} {k}x{k}: max error {error:.3g}")
            if kind == "managed":
                touched = []
                for _ in range(repeats):
                    upload(source, image)  # the CPU rewrites the input through its view
                    touched.append(convolution.run(source, target, weights, k))
                results[("managed after CPU write", k)] = statistics.median(touched)
                error = float(np.max(np.abs(download(target) - expected)))
                if not error < 1e-4:
                    bad.append(f"managed after CPU write {k}x{k}: max error {error:.3g}")
        print(f"{k:2d}x{k:<2d} " + "  ".join(f"{kind} {results[(kind, k)]:9.3f} ms" for kind in KINDS)
              + f"  managed after CPU write {results[('managed after CPU write', k)]:9.3f} ms", flush=True)
    access = {kind: cpu_access(kind, image, repeats) for kind in KINDS}
    for source, target in frames.values():
        source.close()
        target.close()

    device_name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    columns = KINDS + ["managed after CPU write"]
    lines = [f"Float32 convolution of a {WIDTH}x{HEIGHT} image on {device_name}, input and output frames in each "
             f"memory kind; median of {repeats} launches after a warm-up, CUDA events; every output checked "
             "against scipy.ndimage.convolve(mode='nearest'). Ratios are to device memory in the same run; "
             "TX1 is a Jetson TX1's device-memory figure (NPP).", "",
             "| kernel | " + " | ".join(f"{c} ms (GFLOP/s)" for c in columns) + " | "
             + " | ".join(f"{c} / device" for c in columns[1:]) + " | TX1 device ms |",
             "|---|" + "---:|" * (len(columns) * 2)]
    for k in SIZES:
        device_ms = results[("device", k)]
        flops = 2 * k * k * WIDTH * HEIGHT
        lines.append(f"| {k}x{k} | " + " | ".join(f"{results[(c, k)]:.3f} ({flops / (results[(c, k)] * 1e6):.0f})"
                                                  for c in columns) + " | "
                     + " | ".join(f"{results[(c, k)] / device_ms:.1f}x" for c in columns[1:]) + f" | {TX1_DEVICE_MS[k]} |")
    lines += ["", f"The Jetson TX1 at 45x45: device {TX1_DEVICE_MS[45]} ms, zero-copy {TX1_ZERO_COPY_45_MS} ms "
              f"({TX1_ZERO_COPY_45_MS / TX1_DEVICE_MS[45]:.0f}x), managed {TX1_MANAGED_45_MS} ms, managed touched by "
              f"the CPU {TX1_MANAGED_TOUCHED_45_MS[0]}-{TX1_MANAGED_TOUCHED_45_MS[1]} ms.", "",
              f"CPU access to the whole {WIDTH}x{HEIGHT} float32 image (1.2 MB), median of {repeats}, after the GPU "
              "touched it last (device memory: the copy is the CPU's only way in):", "",
              "| kind | CPU read ms | CPU write ms |", "|---|---:|---:|"]
    lines += [f"| {kind} | {access[kind][0]:.3f} | {access[kind][1]:.3f} |" for kind in KINDS]
    table = "\n".join(lines)
    print("\n" + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.plot:
        plot_bars(args.plot, f"Convolution of a {WIDTH}x{HEIGHT} float32 image by memory kind", "ms per launch (log)",
                  [f"{k}x{k}" for k in SIZES], {c: [results[(c, k)] for k in SIZES] for c in columns}, log=True)
    print("RESULT " + ("all outputs match SciPy" if not bad else "MISMATCH: " + "; ".join(bad)))
    print(f"SUMMARY 45x45 device {results[('device', 45)]:.2f} ms, pinned x{results[('pinned', 45)] / results[('device', 45)]:.1f}, "
          f"managed x{results[('managed', 45)] / results[('device', 45)]:.2f}, managed after CPU write "
          f"x{results[('managed after CPU write', 45)] / results[('device', 45)]:.1f}; "
          f"{'outputs match SciPy' if not bad else 'MISMATCH'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
