# Research record (see research/README.md): frozen record (uses the old layout: eglcuda._native, producer._connection, consumer._cu_stream, Frame._egl; ran at 0ec709e and 9e8cabf).
"""Probe: how close can any Python loop get to the C program on the serial round trip?

floor_ext.c is the thinnest binding possible: one C function per step, no checks, no
bookkeeping, on connections eglcuda made. Its loop has the shape of eglcuda's four-call loop
(present, acquire with map, release, return: four calls from Python per frame). Run pinned, e.g.
`taskset -c 2 python3 research/probes/floor_probe.py 1920 1080`; rounds interleave every column,
ratios are medians of per-round ratios against the standalone C program on the same CPU."""
import importlib.util, pathlib, statistics, subprocess, sys, sysconfig, time
import eglcuda
from eglcuda._native import ffi

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from stream_roundtrip import build_c, run_c, eglcuda_serial, eglcuda_serial_steps  # noqa: E402

W, H = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (1920, 1080)
N, ROUNDS = 10000, 7
so = pathlib.Path("/tmp") / ("floor_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"], "-o", str(so),
                str(ROOT / "research/probes/floor_ext.c"), "-ldl"], check=True)
spec = importlib.util.spec_from_file_location("floor_ext", so)
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
addr = lambda p: int(ffi.cast("uintptr_t", p))


def floor(display, keep_gil: bool, check_context: bool) -> float:
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(W, H)
        frames = [producer.allocate_frame(), producer.allocate_frame()]
        egl = ffi.new("CUeglFrame[2]", [frames[0]._egl[0], frames[1]._egl[0]])
        ext.setup(addr(producer._connection), addr(consumer._connection), addr(egl),
                  addr(consumer._cu_stream[0]), int(keep_gil), int(check_context))
        present, acquire, release, return_frame = ext.present, ext.acquire, ext.release, ext.return_frame
        warmup = N // 10 + 2
        start = 0.0
        for i in range(N + warmup):
            if i == warmup:
                start = time.perf_counter()
            present(i)
            acquire()
            release()
            if i:
                return_frame()
        elapsed = time.perf_counter() - start
    return 1e6 * elapsed / N


binary = build_c()
display = eglcuda.Display.for_cuda_device(0)
cases = {
    "C": lambda: run_c(binary, W, H, N, "serial"),
    "C, same calls": lambda: run_c(binary, W, H, N, "serial_same"),
    "floor, GIL kept": lambda: floor(display, True, False),
    "floor, GIL released": lambda: floor(display, False, False),
    "floor, GIL kept, context check": lambda: floor(display, True, True),
    "floor, GIL released, context check": lambda: floor(display, False, True),
    "eglcuda four calls": lambda: eglcuda_serial(display, W, H, N),
    "eglcuda steps": lambda: eglcuda_serial_steps(display, W, H, N),
}
res = {k: [] for k in cases}
for _ in range(ROUNDS):
    for k, f in cases.items():
        res[k].append(f())
print(f"{W}x{H}, {N} frames x {ROUNDS} interleaved rounds")
for k, v in res.items():
    ratio = statistics.median(x / c for x, c in zip(v, res["C"]))
    print(f"{k:36s} {statistics.median(v):7.2f} us  x{ratio:.3f} of C  runs " + " ".join(f"{x:.2f}" for x in v))
