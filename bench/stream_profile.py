"""Where the per-frame time of an EGLStream CUDA -> CUDA round trip goes, layer by layer.

One process, one stream size (1920x1080 ARGB pitch, serial loop: present, acquire, map,
release, return), each layer measured in interleaved repeats so they share the machine's state:

- ``C``: bench/c/stream_roundtrip.c, per-call medians (its ``breakdown`` mode).
- ``raw cffi``: the driver calls straight through eglcuda's compiled bindings, no helpers, no
  checks: the floor for any Python binding.
- ``helpers``: eglcuda's fused C helpers (context check + call), with and without the consumer
  frame-counter query.
- ``api``: the public objects (``present``, ``acquire``, ``release``, ``return_frame``), with and
  without frame numbers.

    python bench/stream_profile.py [--iterations 3000] [--repeats 5]

Needs an NVIDIA GPU with EGL streams, and gcc for the C reference.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import at_least, lazy, require, run  # noqa: E402
from stream_roundtrip import build_c, eglcuda_serial  # noqa: E402

PROGRAM = "bench/stream_profile.py"
eglcuda = lazy("eglcuda")
ffi = lib = None  # eglcuda's compiled bindings, set by main() once require() has checked eglcuda is there

WIDTH, HEIGHT = 1920, 1080


def check(status: int, call: str) -> None:
    if status:
        raise RuntimeError(f"{call} -> {status}")


class RawSession:
    """A stream with its two CUDA endpoints connected straight through the bindings (no eglcuda
    endpoint objects), and two frames eglcuda allocated: what the raw and helper layers drive."""

    def __init__(self, display) -> None:
        self.stream = display.create_stream()
        device = display.cuda_device()
        device.make_current()
        self.context = device.context
        self.consumer = ffi.new("CUeglStreamConnection *")
        self.producer = ffi.new("CUeglStreamConnection *")
        egl_stream = ffi.cast("EGLStreamKHR", self.stream.handle)
        check(lib.cuEGLStreamConsumerConnect(self.consumer, egl_stream), "consumer connect")
        check(lib.cuEGLStreamProducerConnect(self.producer, egl_stream, WIDTH, HEIGHT), "producer connect")
        self.frames = [eglcuda.Frame.allocate(WIDTH, HEIGHT) for _ in range(2)]
        # Each frame's driver description lives in the frame object (frames/_core.pyx).
        self.egl = [ffi.cast("CUeglFrame *", frame._egl_address) for frame in self.frames]
        self.cstream = ffi.new("CUstream *")
        self.pstream = ffi.new("CUstream *")
        self.dpy = ffi.cast("EGLDisplay", display.handle if isinstance(display.handle, int)
                            else int(ffi.cast("uintptr_t", display.handle)))
        self.egl_stream = egl_stream

    def close(self) -> None:
        lib.cuEGLStreamProducerDisconnect(self.producer)
        lib.cuEGLStreamConsumerDisconnect(self.consumer)
        self.stream.close()
        for frame in self.frames:
            frame.close()


def raw_loop(display, iterations: int, with_counter: bool) -> float:
    """Driver calls through the bindings directly; optionally the counter query."""
    raw = RawSession(display)
    try:
        cons, prod = raw.consumer, raw.producer
        resource = ffi.new("CUgraphicsResource *")
        mapped = ffi.new("CUeglFrame *")
        back = ffi.new("CUeglFrame *")
        cstream, pstream = raw.cstream, raw.pstream
        counter = ffi.new("EGLuint64KHR *")
        dpy, egl_stream = raw.dpy, raw.egl_stream
        egl = [e[0] for e in raw.egl]
        present, acquire = lib.cuEGLStreamProducerPresentFrame, lib.cuEGLStreamConsumerAcquireFrame
        get_mapped, release = lib.cuGraphicsResourceGetMappedEglFrame, lib.cuEGLStreamConsumerReleaseFrame
        ret, query = lib.cuEGLStreamProducerReturnFrame, lib.eglQueryStreamu64KHR
        warmup = iterations // 10 + 2
        start = 0.0
        for i in range(iterations + warmup):
            if i == warmup:
                start = time.perf_counter()
            check(present(prod, egl[i & 1], pstream), "present")
            check(acquire(cons, resource, cstream, 1_000_000), "acquire")
            check(get_mapped(mapped, resource[0], 0, 0), "map")
            if with_counter:
                query(dpy, egl_stream, lib.EGL_CONSUMER_FRAME_KHR, counter)
            check(release(cons, resource[0], cstream), "release")
            if i:
                while (status := ret(prod, back, pstream)) == lib.CUDA_ERROR_LAUNCH_TIMEOUT:
                    pass
                check(status, "return")
        elapsed = time.perf_counter() - start
    finally:
        raw.close()
    return 1e6 * elapsed / iterations


def helper_loop(display, iterations: int, with_counter: bool) -> float:
    """eglcuda's fused helpers, called directly (no Python checks, no objects)."""
    raw = RawSession(display)
    try:
        ctx = raw.context
        cons, prod = raw.consumer, raw.producer
        resource = ffi.new("CUgraphicsResource *")
        mapped = ffi.new("CUeglFrame *")
        back = ffi.new("CUeglFrame *")
        cstream, pstream = raw.cstream, raw.pstream
        counter = ffi.new("EGLuint64KHR *")
        failed = ffi.new("int *")
        key = ffi.new("unsigned long long *")
        dpy = raw.dpy if with_counter else ffi.NULL
        egl_stream = raw.egl_stream
        egl = raw.egl
        warmup = iterations // 10 + 2
        start = 0.0
        for i in range(iterations + warmup):
            if i == warmup:
                start = time.perf_counter()
            check(lib.eglcuda_producer_present(ctx, prod, egl[i & 1], pstream, failed), "present")
            check(lib.eglcuda_consumer_acquire(ctx, cons, resource, cstream, 1_000_000, mapped, dpy, egl_stream,
                                               counter, failed), "acquire")
            check(lib.eglcuda_consumer_release(ctx, cons, resource[0], cstream, failed), "release")
            if i:
                check(lib.eglcuda_producer_return(ctx, prod, back, pstream, 1_000_000, key, failed), "return")
        elapsed = time.perf_counter() - start
    finally:
        raw.close()
    return 1e6 * elapsed / iterations


def single_call_costs(display, count: int = 20000) -> dict[str, float]:
    """Median ns of calls the per-frame path may add: context check, counter query, a lock."""
    import threading

    raw = RawSession(display)
    out = {}
    try:
        ctx = raw.context
        counter = ffi.new("EGLuint64KHR *")
        dpy, egl_stream = raw.dpy, raw.egl_stream
        lock = threading.Lock()

        def with_lock() -> None:
            with lock:
                pass
        cases = {
            "eglcuda_ensure_current": lambda: lib.eglcuda_ensure_current(ctx),
            "eglQueryStreamu64KHR(CONSUMER_FRAME)": lambda: lib.eglQueryStreamu64KHR(
                dpy, egl_stream, lib.EGL_CONSUMER_FRAME_KHR, counter),
            "with threading.Lock()": with_lock,
            "empty lambda": lambda: None,
        }
        for name, fn in cases.items():
            samples = []
            for _ in range(5):
                t0 = time.perf_counter_ns()
                for _ in range(count):
                    fn()
                samples.append((time.perf_counter_ns() - t0) / count)
            out[name] = statistics.median(samples)
    finally:
        raw.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=at_least(1), default=3000)
    parser.add_argument("--repeats", type=at_least(1), default=5)
    args = parser.parse_args()
    require(PROGRAM, "cuda-stream", gcc=True)
    global ffi, lib
    from eglcuda._bind._native import ffi, lib

    binary = build_c()
    display = eglcuda.Display.for_cuda_device(0)
    layers = {
        "raw cffi": lambda: raw_loop(display, args.iterations, False),
        "raw cffi + counter query": lambda: raw_loop(display, args.iterations, True),
        "helpers": lambda: helper_loop(display, args.iterations, False),
        "helpers + counter query": lambda: helper_loop(display, args.iterations, True),
        "api (frame_numbers=False)": lambda: eglcuda_serial(display, WIDTH, HEIGHT, args.iterations, False),
        "api (default)": lambda: eglcuda_serial(display, WIDTH, HEIGHT, args.iterations),
    }
    results: dict[str, list[float]] = {"C": [], **{name: [] for name in layers}}
    c_calls: list[str] = []
    for _ in range(args.repeats):
        out = subprocess.run([str(binary), str(WIDTH), str(HEIGHT), str(args.iterations), "serial"],
                             check=True, capture_output=True, text=True).stdout
        results["C"].append(float(out.split("us_per_frame=")[1].split()[0]))
        for name, fn in layers.items():
            results[name].append(fn())
    out = subprocess.run([str(binary), str(WIDTH), str(HEIGHT), str(args.iterations), "breakdown"],
                         check=True, capture_output=True, text=True).stdout
    c_calls = [line for line in out.splitlines() if line.startswith("present=")]
    c = statistics.median(results["C"])
    print(f"serial round trip {WIDTH}x{HEIGHT}, {args.iterations} iterations x {args.repeats} interleaved repeats, median:")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"  {name:28s} {med:7.2f} us/frame  x{med / c:.3f} of C  (runs: "
              + ", ".join(f"{v:.2f}" for v in values) + ")")
    print("C per call (median us): " + (c_calls[0] if c_calls else "n/a"))
    for name, ns in single_call_costs(display).items():
        print(f"  single call {name:38s} {ns:8.1f} ns")
    display.close()
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
