"""Per-call overhead of eglcuda's binding style against the alternatives.

Calls a cheap EGL entry point (``eglGetError``) and, where libcuda is present, a cheap CUDA one
(``cuCtxGetCurrent``) through:
  1. eglcuda: cffi out-of-line API mode, a compiled wrapper calling through the run-time table;
  2. cffi ABI mode (``ffi.dlopen``), how most cffi wrappers of these libraries would do it;
  3. ctypes, what PyOpenGL's EGL module and many scripts use.
All three run in one process, interleaved, and report ns/call and ratios to eglcuda.

    python bench/call_overhead.py [--quick]

Runs on any machine with EGL (Mesa is enough); the CUDA rows need the NVIDIA driver.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import require, run  # noqa: E402

PROGRAM = "bench/call_overhead.py"


def per_call_ns(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (the GPU check's setting)")
    args = parser.parse_args()
    require(PROGRAM, "egl")
    import cffi

    from eglcuda._bind import loader as _loader
    from eglcuda._bind._native import ffi, lib

    calls, repeats = (20_000, 5) if args.quick else (200_000, 9)

    cases = {}
    _loader.egl()
    abi = cffi.FFI()
    abi.cdef("int eglGetError(void); int cuCtxGetCurrent(void **pctx);")
    abi_egl = abi.dlopen(_loader.EGL_LIBRARY)
    ct_egl = ctypes.CDLL(_loader.EGL_LIBRARY)
    ct_egl.eglGetError.restype = ctypes.c_int
    cases["eglGetError"] = {
        "eglcuda (API mode)": lib.eglGetError,
        "cffi ABI mode": abi_egl.eglGetError,
        "ctypes": ct_egl.eglGetError,
    }
    ok, _ = _loader.cuda_available()
    if ok:
        lib.cuInit(0)
        out_api = ffi.new("CUcontext *")
        abi_cuda = abi.dlopen(_loader.CUDA_LIBRARY)
        out_abi = abi.new("void **")
        ct_cuda = ctypes.CDLL(_loader.CUDA_LIBRARY)
        out_ct = ctypes.c_void_p()
        ref_ct = ctypes.byref(out_ct)
        cases["cuCtxGetCurrent"] = {
            "eglcuda (API mode)": lambda: lib.cuCtxGetCurrent(out_api),
            "cffi ABI mode": lambda: abi_cuda.cuCtxGetCurrent(out_abi),
            "ctypes": lambda: ct_cuda.cuCtxGetCurrent(ref_ct),
        }

    print(f"{calls} calls x {repeats} repeats, median ns/call")
    summary = []
    for call, variants in cases.items():
        results = {name: per_call_ns(fn, calls, repeats) for name, fn in variants.items()}
        base = results["eglcuda (API mode)"]
        for name, ns in results.items():
            print(f"  {call:<16} {name:<20} {ns:8.1f} ns  x{ns / base:5.2f}")
        summary.append(f"{call}: ABI/API x{results['cffi ABI mode'] / base:.2f}, ctypes/API x{results['ctypes'] / base:.2f}")
    print("SUMMARY " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
