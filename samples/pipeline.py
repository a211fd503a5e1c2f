"""CUDA -> CUDA -> GL: two EGLStreams chained (section 4.1.6 of NVIDIA's guide).

A CUDA producer fills each frame with content derived from its number and presents it on
stream 1; a CUDA stage acquires it, a kernel writes a transformed copy (every byte XOR a per-frame
key) into a frame it presents on stream 2, and releases; a GL consumer latches stream 2's frame
into an external texture, draws it into a framebuffer and reads it back, and every texel is
checked against the expected transform. Prints PASS/FAIL and frames/s.

    python samples/pipeline.py [--width 1280 --height 720 --frames 200]

One thread drives the three stages in turn (GL needs its context on one thread; the EGLStreams
order the GPU work between stages).

Needs an NVIDIA GPU with EGL streams to GL, PyOpenGL, and CuPy for the kernels:
``pip install -e '.[samples-cuda13]'`` (or ``samples-cuda12``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # before anything imports OpenGL

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, PYOPENGL, at_least, cupy_stream, lazy, mps_session, run  # noqa: E402

PROGRAM = "samples/pipeline.py"
cp = lazy("cupy")
np = lazy("numpy")
eglcuda = lazy("eglcuda")

KERNELS = r"""
__device__ unsigned char source_byte(unsigned int x, unsigned int y, unsigned int seed) {
    unsigned int h = x * 2654435761u ^ (y + 0x9E3779B9u) * 40503u ^ seed * 3266489917u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    return (unsigned char)h;
}
extern "C" __global__ void fill(unsigned char *data, unsigned long long pitch, unsigned int row_bytes,
                                unsigned int rows, unsigned int seed) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < rows) data[y * pitch + x] = source_byte(x, y, seed);
}
extern "C" __global__ void transform(const unsigned char *in, unsigned long long in_pitch, unsigned char *out,
                                     unsigned long long out_pitch, unsigned int row_bytes, unsigned int rows,
                                     unsigned int key) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < row_bytes && y < rows) out[y * out_pitch + x] = in[y * in_pitch + x] ^ (unsigned char)(key >> (8 * (x & 3)));
}
"""


def expected_frame(width: int, height: int, number: int) -> "np.ndarray":
    """What GL should read for frame ``number``: the source bytes XOR the key, as RGBA."""
    x = np.arange(width * 4, dtype=np.uint32)[None, :]
    y = np.arange(height, dtype=np.uint32)[:, None]
    seed = np.uint32((number * 0x9E3779B1) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        h = (x * np.uint32(2654435761)) ^ ((y + np.uint32(0x9E3779B9)) * np.uint32(40503)) ^ (seed * np.uint32(3266489917))
        h ^= h >> np.uint32(15)
        h *= np.uint32(2246822519)
        h ^= h >> np.uint32(13)
    source = (h & np.uint32(0xFF)).astype(np.uint8)
    key = key_of(number)
    key_bytes = np.array([(key >> (8 * i)) & 0xFF for i in range(4)], np.uint8)
    out = source.reshape(height, width, 4) ^ key_bytes
    return out[..., [2, 1, 0, 3]]  # ARGB frames hold B, G, R, A; GL reads R, G, B, A


def key_of(number: int) -> int:
    return (number * 2246822519 + 12345) & 0xFFFFFFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--mps", action="store_true",
                        help="run under CUDA MPS: a private daemon for this run (or the one already running)")
    args = parser.parse_args(argv)
    at_least(parser, args, {**FRAME, "--frames": 1, "--device": 0})
    with mps_session(PROGRAM, args.mps, "gl-stream", modules=[PYOPENGL, CUPY]):
        return sample(args)


def sample(args: argparse.Namespace) -> int:
    width, height = args.width, args.height
    module = cp.RawModule(code=KERNELS)
    fill, transform = module.get_function("fill"), module.get_function("transform")
    row_bytes = width * 4
    grid, block = ((row_bytes + 255) // 256, height), (256,)
    bad_frames, checked = 0, 0
    with eglcuda.Display.for_cuda_device(args.device) as display, display.create_context() as gl_context:
        first = display.create_stream(fifo_length=1)
        stage_in = first.connect_cuda_consumer()
        source = first.connect_cuda_producer(width, height, format=eglcuda.ColorFormat.ARGB)
        second = display.create_stream(fifo_length=1)
        sink = second.connect_gl_consumer(gl_context)
        stage_out = second.connect_cuda_producer(width, height, format=eglcuda.ColorFormat.ARGB)
        source_free = [source.allocate_frame() for _ in range(3)]
        stage_free = [stage_out.allocate_frame() for _ in range(3)]
        work = cp.cuda.Stream(non_blocking=True)
        stage_stream = cupy_stream(cp, stage_in.cuda_stream)
        started = time.perf_counter()
        for _ in range(args.frames):
            # 1. source: a new frame on stream 1
            frame = source_free.pop() if source_free else source.return_frame(timeout_us=2_000_000)
            number = source.frames_presented + 1
            with work:
                fill(grid, block, (cp.uint64(frame.planes[0].pointer), cp.uint64(frame.pitch), np.uint32(row_bytes),
                                   np.uint32(height), np.uint32((number * 0x9E3779B1) & 0xFFFFFFFF)))
            source.present(frame, cuda_stream=work)
            # 2. CUDA stage: stream 1 -> kernel -> stream 2
            out = stage_free.pop() if stage_free else stage_out.return_frame(timeout_us=2_000_000)
            with stage_in.acquire(timeout_us=2_000_000) as acquired:
                with stage_stream:
                    transform(grid, block, (cp.uint64(acquired.planes[0].pointer), cp.uint64(acquired.pitch),
                                            cp.uint64(out.planes[0].pointer), cp.uint64(out.pitch), np.uint32(row_bytes),
                                            np.uint32(height), np.uint32(key_of(acquired.number))))
                stage_out.present(out, cuda_stream=stage_in.cuda_stream)
                stage_number = acquired.number
            # 3. GL: latch stream 2's frame, read every texel back
            with sink.acquire(timeout_us=2_000_000) as latched:
                got = latched.read(width, height)
            checked += 1
            if not np.array_equal(got, expected_frame(width, height, stage_number)):
                bad_frames += 1
        elapsed = time.perf_counter() - started
        sink.close()
        second.close()
        first.close()
    ok = bad_frames == 0 and checked == args.frames
    print(f"{'PASS' if ok else 'FAIL'}  CUDA -> CUDA -> GL {width}x{height}: frames checked {checked}, "
          f"bad frames {bad_frames}, {checked / elapsed:.1f} frames/s (every texel read back through GL)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
