# Research record (see research/README.md): frozen record (uses the old layout: eglcuda._native, producer._connection, consumer._cu_stream, Frame._egl; ran at 0fd9a72 and fb5b502).
"""Probe: is the gap between C and Python in the calls, or in the process around them?

Runs, interleaved, at 1920x1080 ARGB pitch: the standalone C binary; the same C loop inside this
Python process on eglcuda's connections (plain, with a busy gap after each call, with memory
written after each call); the raw cffi loop; the public API loop."""
import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.frozen(__file__, "fb5b502")  # (the commit its first line names)

import ctypes, pathlib, statistics, subprocess, sys
import eglcuda
from eglcuda._native import ffi

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from stream_roundtrip import build_c, run_c, eglcuda_serial, eglcuda_serial_steps  # noqa: E402
from stream_profile import raw_loop, session  # noqa: E402

W, H, N = 1920, 1080, 3000
so = pathlib.Path("/tmp/inprocess_loop.so")
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(ROOT / "research/probes/inprocess_loop.c"), "-ldl"], check=True)
loop = ctypes.CDLL(str(so)).serial_loop
loop.restype = ctypes.c_double
loop.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_long, ctypes.c_long]
addr = lambda p: int(ffi.cast("uintptr_t", p))

def inproc(display, gap_ns=0, pollute_kb=0):
    stream, consumer, producer, frames = session(display)
    with stream:
        egl = ffi.new("CUeglFrame[2]", [frames[0]._egl[0], frames[1]._egl[0]])
        r = loop(addr(producer._connection), addr(consumer._connection), addr(egl), addr(consumer._cu_stream[0]), N, gap_ns, pollute_kb)
        producer._in_flight.clear()
    if r < 0:
        raise RuntimeError(f"loop failed {r}")
    return r

binary = build_c()
display = eglcuda.Display.for_cuda_device(0)
cases = {
    "C standalone": lambda: run_c(binary, W, H, N, "serial"),
    "C in process": lambda: inproc(display),
    "C in process, gap 200ns/call": lambda: inproc(display, 200),
    "C in process, gap 800ns/call": lambda: inproc(display, 800),
    "C in process, write 8KB/call": lambda: inproc(display, 0, 8),
    "C in process, write 64KB/call": lambda: inproc(display, 0, 64),
    "raw cffi": lambda: raw_loop(display, N, False),
    "api default": lambda: eglcuda_serial(display, W, H, N),
    "api steps": lambda: eglcuda_serial_steps(display, W, H, N),
    "api steps, frame_numbers off": lambda: eglcuda_serial_steps(display, W, H, N, frame_numbers=False),
}
res = {k: [] for k in cases}
for _ in range(5):
    for k, f in cases.items():
        res[k].append(f())
c = statistics.median(res["C standalone"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k:34s} {m:7.2f} us  x{m / c:.3f}  runs " + " ".join(f"{x:.2f}" for x in v))
