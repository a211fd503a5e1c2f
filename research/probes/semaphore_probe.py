# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind and eglcuda.syncs).
"""Probe: which step of a CUDA -> GL timeline-semaphore wait holds the GL thread, and when?

A 0.3 s kernel runs on stream W. Variants of who signals value N of the bridge's semaphore, then
GL waits for N, a fence is created and flushed; each step's wall time is printed, then whether GL
was held back (fence unsignaled 0.1 s later while the kernel runs).

    python research/probes/semaphore_probe.py
"""
from __future__ import annotations

import os
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
from eglcuda.syncs.timeline import bridge_for  # noqa: E402

SPIN = r"""extern "C" __global__ void spin(long long cycles) { long long s = clock64(); while (clock64() - s < cycles) { } }"""


def main() -> None:
    display = eglcuda.Display.for_cuda_device(0)
    context = display.create_context()
    context.make_current()
    device = display.cuda_device()
    bridge = bridge_for(device)
    name = bridge.gl_semaphore()
    spin = cp.RawModule(code=SPIN).get_function("spin")
    rate = cp.cuda.Device().attributes["ClockRate"] * 1000
    value = ffi.new("uint64_t *", 1000)

    def signal(stream: int, v: int) -> None:
        bridge._signal.params.fence.value = v
        check(lib.cuSignalExternalSemaphoresAsync(bridge._semaphores, bridge._signal, 1, ffi.cast("CUstream", stream)),
              "signal")

    # "signal after GL wait" last: if GL blocks until a signal is submitted, it hangs (run with a timeout).
    for variant in ("event-gated stream", "event-gated, GL fence", "work stream", "idle stream, kernel unrelated",
                    "event-gated, flush before fence", "signal after GL wait, GL fence", "signal after GL wait"):
        work = cp.cuda.Stream(non_blocking=True)
        other = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device().synchronize()
        GL.glFinish()
        with work:
            spin((1,), (1,), (np.int64(int(0.3 * rate)),))
        event = cp.cuda.Event(disable_timing=True)
        event.record(work)
        value[0] += 1
        steps = []
        t = time.perf_counter()
        start = t

        def mark(label: str) -> None:
            nonlocal t
            now = time.perf_counter()
            steps.append(f"{label} {1e3 * (now - t):.2f}")
            t = now

        if variant.startswith("event-gated"):
            check(lib.cuStreamWaitEvent(bridge._stream, ffi.cast("CUevent", event.ptr), 0), "wait event")
            signal(int(ffi.cast("uintptr_t", bridge._stream)), value[0])
        elif variant == "work stream":
            signal(work.ptr, value[0])
        elif variant == "idle stream, kernel unrelated":
            signal(other.ptr, value[0])
        mark("signal")
        lib.glSemaphoreParameterui64vEXT(name, lib.GL_TIMELINE_SEMAPHORE_VALUE_NV, value)
        mark("param")
        lib.glWaitSemaphoreEXT(name, 0, ffi.NULL, 0, ffi.NULL, ffi.NULL)
        mark("glWait")
        if variant == "signal after GL wait":
            signal(work.ptr, value[0])
            mark("late signal")
        if variant.endswith("flush before fence"):
            GL.glFlush()
            mark("flush")
        gl_fence = variant.endswith("GL fence")
        if gl_fence:  # GL's own fence (ARB_sync) instead of an EGL fence sync
            fence = GL.glFenceSync(GL.GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
            mark("glFenceSync")
        else:
            fence = eglcuda.Sync.fence(display)
            mark("eglCreateSync fence")
        GL.glFlush()
        mark("flush")
        time.sleep(0.1)
        if gl_fence:
            early = GL.glClientWaitSync(fence, 0, 0) in (GL.GL_ALREADY_SIGNALED, GL.GL_CONDITION_SATISFIED)
            GL.glClientWaitSync(fence, GL.GL_SYNC_FLUSH_COMMANDS_BIT, 10_000_000_000)
        else:
            early = fence.signaled
            fence.wait(10)
        done_at = time.perf_counter() - start
        print(f"{variant:34s} ms: {', '.join(steps)} | fence signaled at 0.1 s: {early}, at {done_at:.3f} s; "
              f"kernel done then: {event.done}", flush=True)
        cp.cuda.Device().synchronize()
        if gl_fence:
            GL.glDeleteSync(fence)
        else:
            fence.close()


if __name__ == "__main__":
    main()
