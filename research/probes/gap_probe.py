# Research record (see research/README.md): frozen record (uses the old layout: eglcuda._native, producer._connection, consumer._cu_stream and _context, Frame._egl; numbers from before 419c99e's gate, file last changed c68e07a).
"""Probe: the serial round trip's gap to C, pinned, with the same driver calls on both sides.

Per CPU (argv[1], comma-separated) and size, 5 interleaved rounds of: the standalone C binary
(serial_same_counter), the same C loop inside this Python process on eglcuda's connections, eglcuda's
four calls, steps and bare steps. Then a GL context is made current on this thread (what the
benchmark's PyOpenGL stack does) and the in-process rows run again: does a current context
change the driver calls' cost?"""
import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.frozen(__file__, "c68e07a")  # (the commit its first line names)

import ctypes, os, pathlib, statistics, subprocess, sys
import eglcuda
from eglcuda._native import ffi

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from stream_roundtrip import build_c, run_c, eglcuda_serial, eglcuda_serial_steps, Stack  # noqa: E402

N = 10000
SIZES = [(640, 480), (3840, 2160)]
so = pathlib.Path("/tmp/inprocess_loop.so")
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(ROOT / "research/probes/inprocess_loop.c"), "-ldl"], check=True)
same = ctypes.CDLL(str(so)).serial_loop_same
same.restype = ctypes.c_double
same.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 3
addr = lambda p: int(ffi.cast("uintptr_t", p))


def inproc(display, w, h):
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(w, h)
        frames = [producer.allocate_frame(), producer.allocate_frame()]
        egl = ffi.new("CUeglFrame[2]", [frames[0]._egl[0], frames[1]._egl[0]])
        r = same(addr(producer._connection), addr(consumer._connection), addr(egl), addr(consumer._cu_stream[0]), N,
                 addr(consumer._context), addr(display.handle), addr(stream.handle))
        producer._in_flight.clear()
    if r < 0:
        raise RuntimeError(f"loop failed {r}")
    return r


binary = build_c()
display = eglcuda.Display.for_cuda_device(0)
cpus = [int(c) for c in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2]
all_cpus = os.sched_getaffinity(0)
results = []
for phase in ("no GL context", "GL context current"):
    if phase == "GL context current":
        stack = Stack()
    for cpu in cpus:
        os.sched_setaffinity(0, {cpu})
        for w, h in SIZES:
            cases = {
                "C standalone, same calls": lambda: run_c(binary, w, h, N, "serial_same_counter"),
                "C standalone": lambda: run_c(binary, w, h, N, "serial"),
                "C in process, same calls": lambda: inproc(display, w, h),
                "eglcuda four calls": lambda: eglcuda_serial(display, w, h, N),
                "eglcuda steps": lambda: eglcuda_serial_steps(display, w, h, N),
                "eglcuda steps, bare": lambda: eglcuda_serial_steps(display, w, h, N, frame_numbers=False),
            }
            res = {k: [] for k in cases}
            for _ in range(5):
                for k, f in cases.items():
                    res[k].append(f())
            base = statistics.median(res["C standalone, same calls"])
            print(f"== {phase}, CPU {cpu}, {w}x{h}, {N} frames x 5 rounds; x = / C standalone same calls", flush=True)
            for k, v in res.items():
                m = statistics.median(v)
                print(f"  {k:28s} {m:7.2f} us  x{m / base:.3f}  runs " + " ".join(f"{x:.2f}" for x in v), flush=True)
os.sched_setaffinity(0, all_cpus)
