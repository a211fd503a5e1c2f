"""CUDA event <-> EGLSync: the flow of section 4.3 of NVIDIA's guide, with no CPU-blocking call
between the two APIs.

GL uploads a texture of random texels and creates a fence; the fence becomes a wait on a CUDA
stream (cuda_wait_sync); a CUDA kernel on that stream reads the texels through the image's surface
and writes them back XORed with a random key; the stream's progress becomes an EGLSync
(sync_after_cuda) that GL waits on in the server (eglWaitSyncKHR); GL reads the texture back and
every texel is checked. Prints PASS/FAIL, the paths used, and how long the issuing thread was
blocked inside the calls that hand work between the APIs.

    python samples/cuda_event_eglsync.py [--width 1024 --height 768 --rounds 20]

The image is mapped through eglcuda's EGLImage path (CUDA-GL interop on discrete GPUs, whose
map/unmap also order work); the syncs' own ordering is checked without that help in
tests/gpu/test_sync.py.

Needs an NVIDIA GPU with EGLImage and EGLSync interop, PyOpenGL, and CuPy for the kernel:
``pip install -e '.[samples-cuda13]'`` (or ``samples-cuda12``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # before anything imports OpenGL

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, PYOPENGL, at_least, lazy, mps_session, run  # noqa: E402

PROGRAM = "samples/cuda_event_eglsync.py"
cp = lazy("cupy")
np = lazy("numpy")
GL = lazy("OpenGL.GL")
eglcuda = lazy("eglcuda")

KERNEL = r"""
extern "C" __global__ void xor_texels(unsigned long long surface, const uchar4 *key, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x >= width || y >= height) return;
    uchar4 t = surf2Dread<uchar4>(surface, x * 4, y);
    uchar4 k = key[y * width + x];
    surf2Dwrite(make_uchar4(t.x ^ k.x, t.y ^ k.y, t.z ^ k.z, t.w ^ k.w), surface, x * 4, y);
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mps", action="store_true",
                        help="run under CUDA MPS: a private daemon for this run (or the one already running)")
    args = parser.parse_args()
    at_least(parser, args, {**FRAME, "--rounds": 1})
    with mps_session(PROGRAM, args.mps, "eglimage-cuda", "cuda-sync", modules=[PYOPENGL, CUPY]):
        return sample(args)


def sample(args: argparse.Namespace) -> int:
    width, height = args.width, args.height
    rng = np.random.default_rng()
    kernel = cp.RawModule(code=KERNEL).get_function("xor_texels")
    failures, blocked = 0, 0.0
    used_paths: set[str] = set()
    with eglcuda.Display.for_cuda_device(0) as display, display.create_context() as context:
        paths = eglcuda.sync_paths(display)
        print(f"CUDA -> EGLSync: {paths.cuda_to_egl} ({paths.cuda_to_egl_reason})")
        print(f"EGLSync -> CUDA: {paths.egl_to_cuda} ({paths.egl_to_cuda_reason})")
        wait_path, wait_why = eglcuda.gl_server_wait_path(display)
        print(f"GL server wait on the CUDA sync: {wait_path} ({wait_why})")
        texture = int(GL.glGenTextures(1))
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
        stream = cp.cuda.Stream(non_blocking=True)
        with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
            print(f"EGLImage CUDA path: {registration.path}")
            for _ in range(args.rounds):
                texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
                key = cp.asarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8))
                GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
                GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
                GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
                started = time.perf_counter()
                fence = eglcuda.Sync.fence(display)
                GL.glFlush()
                wait = eglcuda.cuda_wait_sync(fence, cuda_stream=stream)  # GL -> CUDA, thread not blocked
                mapped = registration.map(cuda_stream=stream, finish_gl=False)
                with stream:
                    kernel(((width + 127) // 128, height), (128,),
                           (cp.uint64(mapped.surface), key, np.int32(width), np.int32(height)))
                mapped.unmap(finish_cuda=False)
                done = eglcuda.sync_after_cuda(display, cuda_stream=stream)  # CUDA -> GL
                if done.server_wait(timeout=10):  # GL's next commands wait on the GPU
                    print("note: the server wait blocked this thread (no GPU-side path here)")
                used_paths.add(done.server_wait_path)
                blocked += time.perf_counter() - started
                out = np.empty_like(texels)
                GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
                GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, out)
                wrong = int(np.count_nonzero(np.any(out != (texels ^ cp.asnumpy(key)), axis=2)))
                wait.join(5)
                fence.close()
                done.close()
                if wrong:
                    failures += 1
                    print(f"round failed: {wrong} texels wrong")
        GL.glDeleteTextures([texture])
    verdict = "PASS" if failures == 0 else "FAIL"
    print(f"GL server wait path used: {', '.join(sorted(used_paths))}")
    print(f"issuing thread blocked {1e3 * blocked / args.rounds:.2f} ms per round in the hand-over calls "
          f"(fence, stream wait, map, kernel launch, unmap, CUDA sync, server wait)")
    print(f"{verdict}: {args.rounds} rounds of {width}x{height} RGBA8, every texel checked, {failures} failed")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
