# Research record (see research/README.md): frozen record (uses the old layout: bench/stream_profile.raw_loop reads endpoint internals, _connection, _cu_stream, Frame._egl; ran at fb5b502).
"""Probe: does a GL context made current by PyOpenGL (as the bench's stack does) slow eglcuda?

At 1920x1080 ARGB pitch, 3,000 iterations x 5 interleaved repeats: the standalone C binary; then
eglcuda's four calls, its loop steps and the raw cffi loop with the stack's GL context current
and not current; the stack's own loop (context current)."""
import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.frozen(__file__, "fb5b502")  # (the commit its first line names)

import pathlib, statistics, sys
import eglcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from stream_roundtrip import Stack, build_c, run_c, eglcuda_serial, eglcuda_serial_steps  # noqa: E402
from stream_profile import raw_loop  # noqa: E402

W, H, N = 1920, 1080, 3000
binary = build_c()
display = eglcuda.Display.for_cuda_device(0)
res = {}


def put(name, value):
    res.setdefault(name, []).append(value)


def eglcuda_cases(tag):
    put(f"api 4 calls [{tag}]", eglcuda_serial(display, W, H, N))
    put(f"api steps [{tag}]", eglcuda_serial_steps(display, W, H, N))
    put(f"raw cffi [{tag}]", raw_loop(display, N, False))


for rep in range(5):
    put("C standalone", run_c(binary, W, H, N, "serial"))
    eglcuda_cases("before stack" if rep == 0 else "no ctx")
    if rep == 0:
        stack = Stack()
        E = stack.EGL
    E.eglMakeCurrent(stack.dpy, E.EGL_NO_SURFACE, E.EGL_NO_SURFACE, stack.context)
    eglcuda_cases("GL ctx current")
    put("stack [GL ctx current]", stack.serial(W, H, N))
    E.eglMakeCurrent(stack.dpy, E.EGL_NO_SURFACE, E.EGL_NO_SURFACE, E.EGL_NO_CONTEXT)
c = statistics.median(res["C standalone"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k:34s} {m:7.2f} us  x{m / c:.3f}  runs " + " ".join(f"{x:.2f}" for x in v), flush=True)
