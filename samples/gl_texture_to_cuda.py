"""GL texture -> CUDA surface through an EGLImage: the flow of section 4.2.1 of NVIDIA's guide.

GL creates a texture of random texels; an EGLImage is made from it and registered with CUDA;
a CUDA kernel reads every texel through the surface object and writes it back XORed with a
random key; GL reads the texture back (glGetTexImage) and every texel is checked. Then the
reverse: GL uploads new random texels, a CUDA kernel reads them through the surface and counts
mismatches on the GPU. Repeated for --iterations rounds. Prints PASS/FAIL and the path eglcuda
took (native EGLImage registration, or GL-interop where the native path is not coherent).

    python samples/gl_texture_to_cuda.py [--width 1280 --height 720 --iterations 20]

Needs an NVIDIA GPU with EGLImage interop, PyOpenGL, and CuPy for the kernels (CuPy RawKernels as
in samples/cuda_to_cuda.py): ``pip install -e '.[samples-cuda13]'`` (or ``samples-cuda12``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # before anything imports OpenGL

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, PYOPENGL, at_least, lazy, mps_session, run  # noqa: E402

PROGRAM = "samples/gl_texture_to_cuda.py"
cp = lazy("cupy")
np = lazy("numpy")
GL = lazy("OpenGL.GL")
eglcuda = lazy("eglcuda")

KERNELS = r"""
extern "C" __global__ void xor_texels(unsigned long long surface, const uchar4 *key, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x >= width || y >= height) return;
    uchar4 t = surf2Dread<uchar4>(surface, x * (int)sizeof(uchar4), y);
    uchar4 k = key[y * width + x];
    surf2Dwrite(make_uchar4(t.x ^ k.x, t.y ^ k.y, t.z ^ k.z, t.w ^ k.w), surface, x * (int)sizeof(uchar4), y);
}
extern "C" __global__ void count_mismatches(unsigned long long surface, const uchar4 *expected, int width, int height,
                                            unsigned long long *bad) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x >= width || y >= height) return;
    uchar4 t = surf2Dread<uchar4>(surface, x * (int)sizeof(uchar4), y);
    uchar4 e = expected[y * width + x];
    if (t.x != e.x || t.y != e.y || t.z != e.z || t.w != e.w) atomicAdd(bad, 1ull);
}
"""


def upload(texture: int, texels: "np.ndarray", first: bool) -> None:
    height, width, _ = texels.shape
    GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
    GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
    if first:
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    else:
        GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)


def read_back(texture: int, width: int, height: int) -> "np.ndarray":
    out = np.empty((height, width, 4), np.uint8)
    GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
    GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
    GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--path", default="auto", choices=["auto", "native", "gl-interop"])
    parser.add_argument("--mps", action="store_true",
                        help="run under CUDA MPS: a private daemon for this run (or the one already running)")
    args = parser.parse_args()
    at_least(parser, args, {**FRAME, "--iterations": 1})
    with mps_session(PROGRAM, args.mps, "eglimage-cuda", modules=[PYOPENGL, CUPY]):
        return sample(args)


def sample(args: argparse.Namespace) -> int:
    width, height = args.width, args.height
    rng = np.random.default_rng()
    module = cp.RawModule(code=KERNELS)
    xor_texels, count_mismatches = module.get_function("xor_texels"), module.get_function("count_mismatches")
    grid, block = ((width + 127) // 128, height), (128,)
    failures = 0
    started = time.perf_counter()
    with eglcuda.Display.for_cuda_device(0) as display, display.create_context() as context:
        texture = int(GL.glGenTextures(1))
        texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        upload(texture, texels, first=True)
        with eglcuda.Image(context, texture) as image, image.register_cuda(path=args.path) as registration:
            print(f"EGLImage {image.width}x{image.height} {image.format.name}; CUDA path: {registration.path} "
                  f"({registration.path_reason})")
            stream = cp.cuda.Stream(non_blocking=True)
            bad = cp.zeros(1, cp.uint64)
            for _ in range(args.iterations):
                # CUDA rewrites GL's texels through the surface; GL checks every one.
                key = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
                with registration.map(cuda_stream=stream) as mapped:  # finishes GL's upload first
                    with stream:
                        xor_texels(grid, block, (cp.uint64(mapped.surface), cp.asarray(key), np.int32(width),
                                                 np.int32(height)))
                # unmapping ordered the kernel before GL's next command
                expected = texels ^ key
                wrong = int(np.count_nonzero(np.any(read_back(texture, width, height) != expected, axis=2)))
                # GL writes new texels; a CUDA kernel reads every one through the surface.
                texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
                upload(texture, texels, first=False)
                with registration.map(cuda_stream=stream) as mapped:
                    with stream:
                        bad.fill(0)
                        count_mismatches(grid, block, (cp.uint64(mapped.surface), cp.asarray(texels), np.int32(width),
                                                       np.int32(height), bad))
                        unseen = int(bad.get()[0])
                if wrong or unseen:
                    failures += 1
                    print(f"round failed: {wrong} texels wrong in GL after CUDA's write, {unseen} texels "
                          f"CUDA did not see after GL's write")
        GL.glDeleteTextures([texture])
    seconds = time.perf_counter() - started
    verdict = "PASS" if failures == 0 else "FAIL"
    print(f"{verdict}: {args.iterations} rounds of {width}x{height} RGBA8, both directions, every texel checked, "
          f"{failures} failed ({seconds:.2f} s)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
