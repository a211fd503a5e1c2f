# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind).
"""Probe: can CUDA-GL interop map/unmap order GL work after a CUDA stream point, GPU-side?

cuGraphicsUnmapResources promises that CUDA work issued on the stream before the unmap completes
before graphics work issued after it. If the driver keeps that promise on the GPU (the issuing
thread does not wait), a map+unmap of a small registered GL buffer on a stream that waits for a
CUDA event is a server wait of GL on that event. Each variant: a 0.3 s kernel on stream S, an
event after it, the ordering step, a GL fence, and then: how long the ordering step blocked this
thread, whether the fence was signaled 0.1 s later (it must not be), and whether the kernel had
finished when the fence signaled.

    python research/probes/gl_order_probe.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import _needs  # noqa: E402  (research/probes/_needs.py: a missing need is one line and status 2)

_needs.answer_help(__doc__)
_needs.needs_cuda(__file__, "cuda", "cuda-egl", "gl")
_needs.needs_module(__file__, "cupy", _needs.CUPY_HOW)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from OpenGL import GL  # noqa: E402

import eglcuda  # noqa: E402
from eglcuda._bind.cuda import check  # noqa: E402
from eglcuda._bind._native import ffi, lib  # noqa: E402

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def gl_buffer(size: int = 256) -> int:
    buffer = int(GL.glGenBuffers(1))
    GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, buffer)
    GL.glBufferData(GL.GL_COPY_WRITE_BUFFER, size, None, GL.GL_DYNAMIC_COPY)
    GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, 0)
    return buffer


def register(buffer: int):
    resource = ffi.new("CUgraphicsResource *")
    check(lib.cuGraphicsGLRegisterBuffer(resource, buffer, 0), "cuGraphicsGLRegisterBuffer")
    return resource


def main() -> int:
    display = eglcuda.Display.for_cuda_device(0)
    device = display.cuda_device(None)
    context = display.create_context()
    other = display.create_context()
    context.make_current()
    device.make_current()
    spin = cp.RawModule(code=SPIN).get_function("spin")
    rate = cp.cuda.Device().attributes["ClockRate"] * 1000
    buffer = gl_buffer()
    resource = register(buffer)
    gate = cp.cuda.Stream(non_blocking=True)

    def order(stream: int) -> None:
        check(lib.cuGraphicsMapResources(1, resource, ffi.cast("CUstream", stream)), "map")
        check(lib.cuGraphicsUnmapResources(1, resource, ffi.cast("CUstream", stream)), "unmap")

    def touch() -> None:
        GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, buffer)
        GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, buffer)
        GL.glCopyBufferSubData(GL.GL_COPY_READ_BUFFER, GL.GL_COPY_WRITE_BUFFER, 0, 128, 4)
        GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, 0)
        GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, 0)

    def variant(name: str, seconds: float = 0.3) -> None:
        work = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device().synchronize()
        GL.glFinish()
        with work:
            spin((1,), (1,), (np.int64(int(seconds * rate)),))
        event = cp.cuda.Event(disable_timing=True)
        event.record(work)
        started = time.perf_counter()
        if name == "none":
            pass
        elif name == "unmap on work stream":
            order(work.ptr)
        elif name == "unmap on gate stream":
            gate.wait_event(event)
            order(gate.ptr)
        elif name == "unmap on gate + GL touch":
            gate.wait_event(event)
            order(gate.ptr)
            touch()
        elif name == "unmap with no GL context current":
            context.release()
            gate.wait_event(event)
            order(gate.ptr)
            context.make_current()
        elif name == "unmap, fence in another context":
            gate.wait_event(event)
            order(gate.ptr)
            other.make_current()
        issued = time.perf_counter() - started
        # GL's own fence: an EGL fence sync blocks its creator while the GL queue waits on CUDA
        # (research/probes/semaphore_probe.py), which would hide a GPU-side wait.
        t0 = time.perf_counter()
        fence = GL.glFenceSync(GL.GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
        t1 = time.perf_counter()
        GL.glFlush()
        t2 = time.perf_counter()
        print(f"    fence creation {1e3 * (t1 - t0):.2f} ms, glFlush {1e3 * (t2 - t1):.2f} ms", flush=True)
        time.sleep(0.1)
        query_started = time.perf_counter()
        early = GL.glClientWaitSync(fence, 0, 0) in (GL.GL_ALREADY_SIGNALED, GL.GL_CONDITION_SATISFIED)
        query_took = time.perf_counter() - query_started
        kernel_done_early = event.done
        GL.glClientWaitSync(fence, GL.GL_SYNC_FLUSH_COMMANDS_BIT, 10_000_000_000)
        signaled_at = time.perf_counter() - started
        kernel_done = event.done
        event.synchronize()
        kernel_end = time.perf_counter() - started
        GL.glDeleteSync(fence)
        context.make_current()
        held = (not early) and kernel_done
        print(f"{name:36s} issue {issued * 1e6:9.1f} us | fence at 0.1 s: {'signaled' if early else 'waiting '}"
              f" (kernel done: {kernel_done_early}) | fence signaled at {signaled_at:.3f} s, kernel done then: "
              f"{kernel_done} (kernel end seen at {kernel_end:.3f} s) | status query took {query_took * 1e3:.1f} ms"
              f" | GL held back: {held}", flush=True)

    for name in ("none", "unmap on work stream", "unmap on gate stream", "unmap on gate + GL touch",
                 "unmap with no GL context current", "unmap, fence in another context"):
        try:
            variant(name)
        except Exception as exc:  # noqa: BLE001 - a probe reports every outcome
            print(f"{name:36s} raised {type(exc).__name__}: {exc}", flush=True)
            context.make_current()

    # Cost of one ordering step with nothing pending.
    cp.cuda.Device().synchronize()
    for _ in range(100):
        order(gate.ptr)
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(2000):
            order(gate.ptr)
        samples.append((time.perf_counter() - started) / 2000 * 1e6)
    print(f"map+unmap with nothing pending: median {sorted(samples)[2]:.2f} us per pair (2000 x 5)")
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(200):
            f = eglcuda.Sync.fence(display)
            f.close()
        samples.append((time.perf_counter() - started) / 200 * 1e6)
    print(f"EGL fence create+destroy: median {sorted(samples)[2]:.2f} us")
    check(lib.cuGraphicsUnregisterResource(resource[0]), "unregister")

    # Does the register flag (read-only, write-discard) or pending GL work change the cost?
    for flags in (1, 2):
        flagged = ffi.new("CUgraphicsResource *")
        check(lib.cuGraphicsGLRegisterBuffer(flagged, buffer, flags), "cuGraphicsGLRegisterBuffer")
        samples = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(500):
                lib.cuGraphicsMapResources(1, flagged, ffi.cast("CUstream", gate.ptr))
                lib.cuGraphicsUnmapResources(1, flagged, ffi.cast("CUstream", gate.ptr))
            samples.append((time.perf_counter() - started) / 500 * 1e6)
        print(f"register flags {flags}: map+unmap median {sorted(samples)[2]:.2f} us per pair")
        check(lib.cuGraphicsUnregisterResource(flagged[0]), "unregister")
    resource = register(buffer)
    split_map, split_unmap = [], []
    for _ in range(500):
        t0 = time.perf_counter()
        lib.cuGraphicsMapResources(1, resource, ffi.cast("CUstream", gate.ptr))
        t1 = time.perf_counter()
        lib.cuGraphicsUnmapResources(1, resource, ffi.cast("CUstream", gate.ptr))
        t2 = time.perf_counter()
        split_map.append((t1 - t0) * 1e6)
        split_unmap.append((t2 - t1) * 1e6)
    print(f"map median {sorted(split_map)[250]:.2f} us, unmap median {sorted(split_unmap)[250]:.2f} us")
    check(lib.cuGraphicsUnregisterResource(resource[0]), "unregister")

    # Unregistering after the GL context is gone: crash, error or fine? (in a child process)
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    print(f"unregister after the context was destroyed: rc={child.returncode} {child.stdout.strip()} "
          f"{child.stderr.strip()[-300:]}")
    return 0


CHILD = r"""
import os
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
from OpenGL import GL
import eglcuda
from eglcuda._bind._native import ffi, lib
display = eglcuda.Display.for_cuda_device(0)
display.cuda_device(None).make_current()
context = display.create_context(); context.make_current()
buffer = int(GL.glGenBuffers(1)); GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, buffer)
GL.glBufferData(GL.GL_COPY_WRITE_BUFFER, 256, None, GL.GL_DYNAMIC_COPY)
resource = ffi.new("CUgraphicsResource *")
print("register", lib.cuGraphicsGLRegisterBuffer(resource, buffer, 0))
context.close()
print("map after close", lib.cuGraphicsMapResources(1, resource, ffi.NULL))
print("unregister", lib.cuGraphicsUnregisterResource(resource[0]))
"""

if __name__ == "__main__":
    sys.exit(main())
